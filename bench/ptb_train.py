"""PTB language-model training step: needle against the same model in PyTorch, same run.

Two configurations, both with vocabulary 10k, sequence length 20 and batch 256 (5,120 tokens a
step), Adam lr 3e-3:

- ``transformer``: the course's Transformer LM (embedding 20, hidden 32, 1 layer, 8 heads of
  32, causal, pre-norm, dropout 0, positional embedding of 2048);
- ``lstm``: Embedding(10k, 20) -> LSTM(20, 32, 1 layer) -> Linear(32, 10k).

A step is get_batch, detach of the carried state, forward, softmax cross-entropy, zero grads,
backward, Adam step and reading the loss (what ``epoch_general_ptb`` does, without the accuracy
count). Each (framework, configuration) pair runs in its own subprocess so that its memory is
measured alone. Reported: median step time over the timed steps after warm-up, tokens/s, and
peak memory: for needle ``ndl.memory.max_memory_allocated`` (exact bytes of live arrays) and,
for both, the growth of the process's peak resident set size over the steps (``VmHWM`` after the
steps minus ``VmRSS`` before the first one, with the peak reset through /proc/self/clear_refs;
it includes allocator caches, so it is coarse), minor page faults per timed step (first touches
of memory the process got from the OS), and user and system CPU time per step (all threads).
PyTorch has no CPU allocator statistics, so it gets the RSS figure only on the CPU; with
``--device cuda`` both run on the GPU and both report their allocator's peak allocated bytes
(``ndl.cuda.max_memory_allocated``, ``torch.cuda.max_memory_allocated``). The PyTorch model gets
needle's initial parameters (seed 0), so the first losses agree and the two runs train the same
weights. Data: needle's synthetic corpus by default, ``--data DIR`` for real PTB text
(ptb.valid.txt is the training text when there is no training split). Without PyTorch
(``pip install torch==2.13.0``) only needle's numbers are printed.

    python bench/ptb_train.py [--data DIR] [--steps 20] [--warmup 3] [--configs transformer,lstm]
                              [--device cpu|cuda] [--graphs]

``--graphs`` (with ``--device cuda``) adds each framework's step captured into a CUDA graph and
replayed (needle: ``NeedleGraphedStep``, capturable Adam; PyTorch: torch.cuda.graphs' recipe,
capturable Adam), rows ``needle+graphs`` and ``torch+graphs``.
"""

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from needle.apps.course_config import COURSE

# The course's configuration and its LSTM twin; both train with the course's seq_len, batch
# and learning rate.
# The runs a worker subprocess does: each framework eager, and captured in a CUDA graph.
WORKERS = ("needle", "torch", "needle+graphs", "torch+graphs")

CONFIGS = {
    "transformer": COURSE,
    "lstm": dataclasses.replace(COURSE, seq_model="lstm"),
}


# --------------------------------------------------------------------------
# memory helpers
# --------------------------------------------------------------------------


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def reset_peak_rss():
    """Resets VmHWM to the current RSS; returns the current RSS in bytes (None if unknown)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    rss = _status_kib("VmRSS")
    return None if rss is None else rss * 1024


def minor_faults():
    """Minor page faults of this process so far (first touches of fresh memory)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def cpu_seconds():
    """(user, system) CPU seconds of this process so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def peak_rss():
    hwm = _status_kib("VmHWM")
    return None if hwm is None else hwm * 1024


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------


def load_batches(data_dir, vocab):
    """(batches (nbatch, batch size) float32 NumPy, vocabulary size used, training file name)."""
    from needle.data import Corpus, batchify

    corpus = Corpus(data_dir)
    vocab = max(vocab, len(corpus.dictionary))
    batches = batchify(corpus.train, COURSE.batch_size, None, "float32")
    return batches, vocab, os.path.basename(corpus.train_path)


def batch_starts(nbatch, count):
    """``count`` start rows of full-length batches, cycling over the data when it is short."""
    starts = list(range(0, nbatch - COURSE.seq_len, COURSE.seq_len))
    if not starts:
        raise SystemExit(
            f"ptb_train: the data has only {nbatch} rows of {COURSE.batch_size}; need more text"
        )
    return [starts[i % len(starts)] for i in range(count)]


# --------------------------------------------------------------------------
# needle
# --------------------------------------------------------------------------


def needle_step(model, opt, loss_fn, batches, i, h, device):
    """One step of ``epoch_general_ptb`` from row ``i`` (the carried state ``h`` detached);
    returns (the loss as a float, which waits for a GPU, the new state)."""
    from needle.data import get_batch

    X, y = get_batch(batches, i, COURSE.seq_len, device=device)
    if isinstance(h, tuple):
        h = tuple(t.detach() for t in h)
    elif h is not None:
        h = h.detach()
    logits, h = model(X, h)
    loss = loss_fn(logits, y)
    opt.reset_grad()
    loss.backward()
    opt.step()
    return float(loss.numpy().reshape(-1)[0]), h


class NeedleGraphedStep:
    """``needle_step`` captured into a CUDA graph (``--graphs``): the batch is copied into
    static tensors (``copy_``), the carried state is copied inside the graph into the static
    state the next replay reads (as ``needle_step``'s detach carries it), and one replay is
    the whole forward, backward and Adam step. Adam keeps its step and learning rate on the
    GPU (``capturable=True``) so that replays equal eager steps. ``warmup`` runs eager steps
    on the static tensors (the optimizer state and the carried state come to exist), then
    ``capture`` records one step; ``step`` feeds a batch, replays and reads the loss."""

    def __init__(self, model, opt, loss_fn, device):
        import needle as ndl

        self.ndl, self.model, self.opt, self.loss_fn = ndl, model, opt, loss_fn
        self.graph = None
        self.device = device
        self.X = self.y = self.h = None

    def feed(self, batches, i):
        X = batches[i : i + COURSE.seq_len]
        y = batches[i + 1 : i + 1 + COURSE.seq_len].reshape(-1)
        if self.X is None:
            self.X = self.ndl.Tensor(X, device=self.device, requires_grad=False)
            self.y = self.ndl.Tensor(y, device=self.device, requires_grad=False)
        else:
            self.X.copy_(X)
            self.y.copy_(y)

    def _step(self):
        logits, h = self.model(self.X, self.h)
        loss = self.loss_fn(logits, self.y)
        self.opt.reset_grad()
        loss.backward()
        self.opt.step()
        with self.ndl.no_grad():  # the carried state, detached, at a fixed address
            if self.h is None:
                self.h = tuple(t.detach() for t in h) if isinstance(h, tuple) else h.detach()
            else:
                pairs = zip(self.h, h) if isinstance(h, tuple) else [(self.h, h)]
                for static, new in pairs:
                    static.copy_(new.detach())
        return loss

    def warmup(self, batches, i):
        self.feed(batches, i)
        return float(self._step().numpy().reshape(-1)[0])

    def capture(self, batches, i):
        self.feed(batches, i)
        self.graph = self.ndl.cuda.CUDAGraph()
        with self.ndl.cuda.graph(self.graph):
            self.loss = self._step()

    def step(self, batches, i):
        self.feed(batches, i)
        self.graph.replay()
        return float(self.loss.numpy().reshape(-1)[0])


def run_needle(cfg, batches, vocab, steps, warmup, device_name="cpu", graphs=False):
    import needle as ndl
    from needle import nn, optim

    device = ndl.cuda() if device_name == "cuda" else ndl.cpu()
    if not device.enabled():
        raise SystemExit(f"ptb_train: CUDA is unavailable: {ndl.cuda.unavailable_reason()}")
    np.random.seed(0)
    model = cfg.language_model(vocab, COURSE.seq_len, device)
    model.train()
    opt = optim.Adam(model.parameters(), lr=COURSE.lr, capturable=graphs)
    loss_fn = nn.SoftmaxLoss()
    graphed = NeedleGraphedStep(model, opt, loss_fn, device) if graphs else None
    h, times, losses, faults = None, [], [], 0
    rss0 = reset_peak_rss()
    ndl.memory.reset_peak_memory_stats(device)
    for n, i in enumerate(batch_starts(batches.shape[0], warmup + steps)):
        if n == warmup:
            if graphed is not None:
                graphed.capture(batches, i)
            faults, cpu0 = minor_faults(), cpu_seconds()
        start = time.perf_counter()
        if graphed is None:
            loss, h = needle_step(model, opt, loss_fn, batches, i, h, device)
        elif n < warmup:
            loss = graphed.warmup(batches, i)
        else:
            loss = graphed.step(batches, i)
        losses.append(loss)
        if n >= warmup:
            times.append(time.perf_counter() - start)
    return dict(
        times=times,
        losses=losses,
        faults=(minor_faults() - faults) / steps,
        cpu=[(b - a) / steps for a, b in zip(cpu0, cpu_seconds())],
        peak_allocated=ndl.memory.max_memory_allocated(device),
        rss_delta=None if rss0 is None else peak_rss() - rss0,
        params=sum(int(np.prod(p.shape)) for p in model.parameters()),
        version=ndl.__version__,
    )


# --------------------------------------------------------------------------
# PyTorch: the same models
# --------------------------------------------------------------------------


def torch_models():
    import torch
    from torch import nn

    class AttentionLayer(nn.Module):
        """needle's AttentionLayer: separate pre-norms for q, k, v; bias-free projections."""

        def __init__(self, d, num_head, dim_head):
            super().__init__()
            self.num_head, self.dim_head = num_head, dim_head
            self.prenorm_q, self.prenorm_k, self.prenorm_v = (nn.LayerNorm(d) for _ in range(3))
            self.q_projection = nn.Linear(d, num_head * dim_head, bias=False)
            self.k_projection = nn.Linear(d, num_head * dim_head, bias=False)
            self.v_projection = nn.Linear(d, num_head * dim_head, bias=False)
            self.out_projection = nn.Linear(num_head * dim_head, d, bias=False)

        def forward(self, x):
            b, seq, _ = x.shape

            def heads(t):
                return t.reshape(b, seq, self.num_head, self.dim_head).transpose(1, 2)

            q = heads(self.q_projection(self.prenorm_q(x)))
            k = heads(self.k_projection(self.prenorm_k(x)))
            v = heads(self.v_projection(self.prenorm_v(x)))
            scores = q @ k.transpose(2, 3) / self.dim_head**0.5
            big = -torch.finfo(torch.float32).max
            mask = torch.triu(torch.full((seq, seq), big, device=x.device), 1)
            probs = torch.softmax(scores + mask, dim=3)
            out = (probs @ v).transpose(1, 2).reshape(b, seq, self.num_head * self.dim_head)
            return self.out_projection(out)

    class TransformerLayer(nn.Module):
        def __init__(self, d, hidden):
            super().__init__()
            self.attn = AttentionLayer(d, COURSE.num_head, COURSE.dim_head)
            self.mlp = nn.Sequential(
                nn.LayerNorm(d), nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, d)
            )

        def forward(self, x):
            x = x + self.attn(x)
            return x + self.mlp(x)

    class Transformer(nn.Module):
        def __init__(self, d, hidden, layers, sequence_len=2048):
            super().__init__()
            self.positional_embedding = nn.Embedding(sequence_len, d)
            self.layers = nn.Sequential(*(TransformerLayer(d, hidden) for _ in range(layers)))

        def forward(self, x, h=None):
            x = x.transpose(0, 1)  # (L, B, D) -> (B, L, D)
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.layers(x + self.positional_embedding(pos)[None])
            x = x.transpose(0, 1)
            return x, None

    class LanguageModel(nn.Module):
        def __init__(self, embedding, vocab, hidden, layers, seq_model):
            super().__init__()
            self.embedding = nn.Embedding(vocab, embedding)
            if seq_model == "lstm":
                self.seq_model = nn.LSTM(embedding, hidden, layers)
                width = hidden
            else:
                self.seq_model = Transformer(embedding, hidden, layers)
                width = embedding
            self.linear = nn.Linear(width, vocab)

        def forward(self, x, h=None):
            seq, bs = x.shape
            out, h = self.seq_model(self.embedding(x), h)
            return self.linear(out.reshape(seq * bs, out.shape[-1])), h

    return LanguageModel


def copy_needle_parameters(model, cfg, vocab):
    """Gives the PyTorch ``model`` the parameters of needle's model built with
    ``np.random.seed(0)``, so both runs start from the same weights (and the same first loss).
    needle's Linear/LSTM weights are (in, out) and its Linear bias (1, out); PyTorch's are
    (out, in) and (out,). Both create their parameters in the same order."""
    import torch

    np.random.seed(0)
    ref = cfg.language_model(vocab, COURSE.seq_len)
    transposed = {
        f"{name}.weight" for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    }
    named = list(model.named_parameters())
    params = ref.parameters()
    if len(params) != len(named):
        raise SystemExit(
            f"ptb_train: needle has {len(params)} parameter tensors, the PyTorch model {len(named)}"
        )
    with torch.no_grad():
        for p, (name, t) in zip(params, named):
            a = p.numpy()
            if (
                name in transposed
                or ".weight_ih" in name
                or ".weight_hh" in name
                or name.startswith("seq_model.weight_")
            ):
                a = a.T
            if a.size != t.numel() or (a.ndim == t.ndim and a.shape != tuple(t.shape)):
                raise SystemExit(
                    f"ptb_train: parameter {name}: needle shape {p.shape}, PyTorch {tuple(t.shape)}"
                )
            t.copy_(torch.from_numpy(np.ascontiguousarray(a).reshape(t.shape)))


def run_torch(cfg, batches, vocab, steps, warmup, device_name="cpu", graphs=False):
    import torch

    if device_name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("ptb_train: this PyTorch has no CUDA")
    torch.manual_seed(0)
    model = torch_models()(
        cfg.embedding_size, vocab, cfg.hidden_size, cfg.num_layers, cfg.seq_model
    )
    copy_needle_parameters(model, cfg, vocab)
    model.to(device_name)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=COURSE.lr, capturable=graphs)
    data = torch.from_numpy(batches.astype(np.int64)).to(device_name)
    h, times, losses, faults = None, [], [], 0
    rss0 = reset_peak_rss()
    if device_name == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if graphs:
        return _run_torch_graphed(model, opt, data, batches, steps, warmup, rss0)
    for n, i in enumerate(batch_starts(batches.shape[0], warmup + steps)):
        if n == warmup:
            faults, cpu0 = minor_faults(), cpu_seconds()
        start = time.perf_counter()
        X, y = data[i : i + COURSE.seq_len], data[i + 1 : i + 1 + COURSE.seq_len].reshape(-1)
        if isinstance(h, tuple):
            h = tuple(t.detach() for t in h)
        logits, h = model(X, h)
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # waits for the GPU too
        if n >= warmup:
            times.append(time.perf_counter() - start)
    return _torch_result(model, times, losses, steps, faults, cpu0, rss0, device_name)


def _torch_result(model, times, losses, steps, faults, cpu0, rss0, device_name):
    """What a PyTorch run reports, from its timings and the counters taken before them."""
    import torch

    return dict(
        times=times,
        losses=losses,
        faults=(minor_faults() - faults) / steps,
        cpu=[(b - a) / steps for a, b in zip(cpu0, cpu_seconds())],
        peak_allocated=torch.cuda.max_memory_allocated() if device_name == "cuda" else None,
        rss_delta=None if rss0 is None else peak_rss() - rss0,
        params=sum(p.numel() for p in model.parameters()),
        version=torch.__version__,
        threads=torch.get_num_threads(),
    )


def _run_torch_graphed(model, opt, data, batches, steps, warmup, rss0):
    """PyTorch's step captured with torch.cuda.graphs, the documented recipe: warm-up on a
    side stream, static inputs and carried state, capturable Adam, one replay per step."""
    import torch

    seq = COURSE.seq_len
    static_X = data[0:seq].clone()
    static_y = data[1 : 1 + seq].reshape(-1).clone()
    state = {"h": None}

    def body():
        logits, h = model(static_X, state["h"])
        loss = torch.nn.functional.cross_entropy(logits, static_y)
        loss.backward()
        opt.step()
        with torch.no_grad():
            if state["h"] is None and isinstance(h, tuple):
                state["h"] = tuple(t.detach().clone() for t in h)
            elif isinstance(h, tuple):
                for static, new in zip(state["h"], h):
                    static.copy_(new)
        return loss

    def feed(i):
        static_X.copy_(data[i : i + seq])
        static_y.copy_(data[i + 1 : i + 1 + seq].reshape(-1))

    starts = batch_starts(batches.shape[0], warmup + steps + 1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    losses, times = [], []
    with torch.cuda.stream(side):
        for i in starts[:warmup]:
            feed(i)
            opt.zero_grad(set_to_none=True)
            losses.append(body().item())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    feed(starts[warmup])
    with torch.cuda.graph(graph):
        static_loss = body()
    faults, cpu0 = minor_faults(), cpu_seconds()
    for i in starts[warmup + 1 :]:
        start = time.perf_counter()
        feed(i)
        graph.replay()
        losses.append(static_loss.item())
        times.append(time.perf_counter() - start)
    return _torch_result(model, times, losses, steps, faults, cpu0, rss0, "cuda")


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------


def worker(args):
    batches, vocab, train_name = load_batches(args.data, args.vocab)
    cfg = CONFIGS[args.config]
    run = run_needle if args.worker.startswith("needle") else run_torch
    graphs = args.worker.endswith("+graphs")
    result = run(cfg, batches, vocab, args.steps, args.warmup, args.device, graphs)
    step = statistics.median(result["times"])
    row = {
        "config": args.config,
        "framework": args.worker,
        "device": args.device,
        "vocab": vocab,
        "seq_len": COURSE.seq_len,
        "batch": COURSE.batch_size,
        "params": result["params"],
        "steps": len(result["times"]),
        "step_ms": step * 1e3,
        "tokens_per_s": COURSE.tokens_per_step / step,
        "peak_allocated_bytes": result["peak_allocated"],
        "rss_delta_bytes": result["rss_delta"],
        "minor_faults_per_step": result["faults"],
        "user_ms_per_step": result["cpu"][0] * 1e3,
        "sys_ms_per_step": result["cpu"][1] * 1e3,
        "first_loss": result["losses"][0],
        "last_loss": result["losses"][-1],
        "train_text": train_name,
        "version": result["version"],
    }
    if "threads" in result:
        row["threads"] = result["threads"]
    if args.worker == "needle":
        from benchutil import cpu_kernels

        row["cpu_kernels"] = cpu_kernels()  # after the run: the split it measured
    print(json.dumps(row), flush=True)


def gpu_name():
    """The GPU's name from nvidia-smi, or None."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


def machine_info(device="cpu"):
    from benchutil import cpu_model

    cpu = cpu_model()
    info = {
        "machine": platform.machine(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "device": device,
    }
    if device == "cuda":
        info["gpu"] = gpu_name()
    try:
        import needle

        info["needle"] = needle.__version__
        from benchutil import cpu_kernels

        info["cpu_kernels"] = cpu_kernels()
    except ImportError:
        info["needle"] = None
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        info["torch"] = None
    return info


def mib(n):
    return "-" if n is None else f"{n / 2**20:.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        default=None,
        metavar="DIR",
        help="PTB-format corpus directory (default: needle's synthetic corpus)",
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument(
        "--vocab",
        type=int,
        default=COURSE.vocab_size,
        help="output size (at least the corpus's vocabulary)",
    )
    parser.add_argument("--configs", default="transformer,lstm")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where both frameworks train"
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="also run each framework's step captured in a CUDA graph (--device cuda)",
    )
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    parser.add_argument("--config", choices=tuple(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    info = machine_info(args.device)
    print(json.dumps({"machine": info}), flush=True)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            parser.error(f"unknown configuration {c!r} (choose from {', '.join(CONFIGS)})")
    if args.graphs and args.device != "cuda":
        parser.error("--graphs needs --device cuda (CUDA graphs are the GPU's)")
    frameworks = ["needle"] + (["torch"] if info["torch"] else [])
    if args.graphs:
        frameworks += [f"{fw}+graphs" for fw in frameworks]
    with tempfile.TemporaryDirectory(prefix="needle-ptb-bench-") as tmp:
        if args.data is None:
            from needle.data import write_synthetic_corpus

            words = int((args.warmup + args.steps + 2) * COURSE.tokens_per_step / 0.85 * 1.1)
            data_dir = write_synthetic_corpus(tmp, num_words=words, seed=0, vocab_size=args.vocab)
            print(
                f"# data: synthetic corpus, {words} words, vocabulary <= {args.vocab}", flush=True
            )
        else:
            data_dir = args.data
            if not os.path.isdir(data_dir):
                sys.exit(f"ptb_train: data directory {data_dir!r} does not exist")
            print(f"# data: {data_dir}", flush=True)
        rows = []
        for c in configs:
            for fw in frameworks:
                cmd = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--worker",
                    fw,
                    "--config",
                    c,
                    "--data",
                    data_dir,
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    str(args.warmup),
                    "--vocab",
                    str(args.vocab),
                    "--device",
                    args.device,
                ]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.stderr.write(proc.stderr)
                    sys.exit(f"ptb_train: the {fw} {c} run failed (status {proc.returncode})")
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(json.dumps(row), flush=True)
    if rows and rows[0]["train_text"] == "ptb.valid.txt":
        print(
            "# note: no PTB training split in the data directory; ptb.valid.txt is the "
            "training text"
        )
    print()
    print(
        (f"device: cuda, {info.get('gpu') or 'GPU unknown'}; " if args.device == "cuda" else "")
        + f"machine: {info['cpu']}, {info['cpus']} cpus, Python {info['python']}, "
        f"NumPy {info['numpy']}, needle {info['needle']}, "
        f"PyTorch {info['torch'] or 'absent'}"
        + (f" ({info['torch_threads']} threads)" if info["torch"] else "")
    )
    if info.get("cpu_kernels"):
        from benchutil import kernels_line

        for r in rows:
            if r.get("cpu_kernels"):
                print(f"{r['config']}: {kernels_line(r['cpu_kernels'])}")
    print(
        f"{'config':<13}{'framework':<14}{'params':>9}{'step ms':>10}{'tokens/s':>11}"
        f"{'user ms':>9}{'sys ms':>8}"
        f"{'peak alloc MiB':>16}{'peak RSS+ MiB':>15}{'faults/step':>13}"
        f"{'loss first->last':>19}{'vs torch':>10}{'vs torch+graphs':>17}"
    )
    by_key = {(r["config"], r["framework"]): r for r in rows}

    def versus(r, peer_name):
        peer = by_key.get((r["config"], peer_name))
        mine = r["framework"].startswith("needle")
        return f"{r['step_ms'] / peer['step_ms']:.2f}x" if peer and mine else "-"

    for r in rows:
        ratio = f"{versus(r, 'torch'):>10}{versus(r, 'torch+graphs'):>17}"
        losses = f"{r['first_loss']:.2f}->{r['last_loss']:.2f}"
        print(
            f"{r['config']:<13}{r['framework']:<14}{r['params']:>9}{r['step_ms']:>10.1f}"
            f"{r['tokens_per_s']:>11.0f}{r['user_ms_per_step']:>9.0f}{r['sys_ms_per_step']:>8.0f}"
            f"{mib(r['peak_allocated_bytes']):>16}"
            f"{mib(r['rss_delta_bytes']):>15}{r['minor_faults_per_step']:>13.0f}"
            f"{losses:>19}{ratio}"
        )


if __name__ == "__main__":
    main()
