"""The GPU work of one training step of the course's PTB models, counted by needle's census.

Runs steady-state steps of the course's configurations (the ``transformer`` and ``lstm`` of
``bench/ptb_train.py``: vocabulary 10k, sequence length 20, batch 256, Adam) on
``ndl.cuda()`` and prints one JSON line per configuration with what one step asked of the
GPU, averaged over the counted steps (``ndl.cuda.work_counters``): kernel launches, memsets,
device-to-device copies, cuBLAS calls, host synchronisations, device mallocs and frees, and
bytes each way. ``launches_per_step`` is everything that queues work on the GPU (kernels,
memsets, copies on the device, BLAS calls). The counts are the same on a GPU and on needle's
CUDA simulator (``NEEDLE_CUDA=sim``), where CI runs this script with ``--small`` (vocabulary
1000, batch 16: the same ops and launches, fewer bytes, a step the simulator runs in seconds).

A step is what ``bench/ptb_train.py`` times: get_batch, detach of the carried state, forward,
softmax cross-entropy, zero grads, backward, Adam step, and reading the loss (the one sync a
step needs). ``--torch`` (on a GPU, with PyTorch installed) also counts the same step of the
same model in PyTorch with its profiler: CUDA kernels, memsets and copies, and
synchronisations, so that the two stand side by side.

    python bench/gpu_census.py [--configs transformer,lstm] [--steps 3] [--warmup 2] [--small]
                               [--torch] [--check] [--device cuda] [--graphs]

``--graphs`` counts a replay of the step captured into a CUDA graph instead (the batch copied
into static tensors, forward, backward and a capturable Adam step in one graph): what the host
queues per replayed step (``host_launches_per_step``: the graph launch plus any kernel, copy
or BLAS call outside it) and the graph's nodes; ``--check`` then holds it to at most 3.

``--check`` exits 1 when a configuration misses issue 20's targets (launches + BLAS calls per
step: transformer <= 250, lstm <= 200; host syncs <= 1; device mallocs 0; host-to-device bytes
<= 64 KiB), after printing every line.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptb_train  # noqa: E402  (the configurations and the PyTorch model)

TARGETS = {
    "transformer": dict(launches=250),
    "lstm": dict(launches=200),
    "all": dict(host_syncs=1, device_mallocs=0, h2d_bytes=64 * 1024),
}
# --graphs: what the host queues per replayed step (issue 37).
GRAPH_HOST_LAUNCHES = 3


def needle_census(name, cfg, vocab, batch, steps, warmup):
    import needle as ndl
    from needle import nn, optim

    device = ndl.cuda()
    if not device.enabled():
        raise SystemExit(f"gpu_census: CUDA is unavailable: {ndl.cuda.unavailable_reason()}")
    np.random.seed(0)
    rows = (warmup + steps + 1) * ptb_train.COURSE.seq_len + 1
    batches = np.random.randint(0, vocab, size=(rows, batch)).astype(np.float32)
    model = cfg.language_model(vocab, ptb_train.COURSE.seq_len, device)
    model.train()
    opt = optim.Adam(model.parameters(), lr=ptb_train.COURSE.lr)
    loss_fn = nn.SoftmaxLoss()
    h, losses = None, []
    for n in range(warmup + steps):
        if n == warmup:
            ndl.cuda.reset_work_counters(device)
        loss, h = ptb_train.needle_step(
            model, opt, loss_fn, batches, n * ptb_train.COURSE.seq_len, h, device
        )
        losses.append(loss)
    work = ndl.cuda.work_counters(device)
    per_step = {k: v / steps for k, v in work.items()}
    by_kernel = {k: v / steps for k, v in ndl.cuda.launches_by_kernel(device).items()}
    launches = sum(per_step[k] for k in ("kernel_launches", "memsets", "d2d_copies"))
    return dict(
        config=name,
        framework="needle",
        device=ndl.cuda.get_device_name(device),
        simulated=bool(__import__("needle_c")._cuda_simulated()),
        vocab=vocab,
        batch=batch,
        seq_len=ptb_train.COURSE.seq_len,
        steps=steps,
        gemm=ndl.cuda.gemm_backend(),
        launches_per_step=launches + per_step["blas_calls"],
        **{f"{k}_per_step": v for k, v in per_step.items()},
        last_loss=losses[-1],
        kernels_per_step=by_kernel,
    )


def needle_graph_census(name, cfg, vocab, batch, steps, warmup):
    """``--graphs``: the same step captured into a CUDA graph and replayed
    (``ptb_train.NeedleGraphedStep``); per replayed step, ``host_launches_per_step`` counts
    what the host queued: the graph launch, kernels, memsets, device copies, BLAS calls and
    copies from the host (the batch)."""
    import needle as ndl
    from needle import nn, optim

    device = ndl.cuda()
    if not device.enabled():
        raise SystemExit(f"gpu_census: CUDA is unavailable: {ndl.cuda.unavailable_reason()}")
    np.random.seed(0)
    seq_len = ptb_train.COURSE.seq_len
    rows = (warmup + steps + 2) * seq_len + 1
    batches = np.random.randint(0, vocab, size=(rows, batch)).astype(np.float32)
    model = cfg.language_model(vocab, seq_len, device)
    model.train()
    opt = optim.Adam(model.parameters(), lr=ptb_train.COURSE.lr, capturable=True)
    graphed = ptb_train.NeedleGraphedStep(model, opt, nn.SoftmaxLoss(), device)
    for n in range(warmup):
        graphed.warmup(batches, n * seq_len)
    graphed.capture(batches, warmup * seq_len)
    ndl.cuda.synchronize(device)
    ndl.cuda.reset_work_counters(device)
    losses = [graphed.step(batches, (warmup + 1 + n) * seq_len) for n in range(steps)]
    work = ndl.cuda.work_counters(device)
    per_step = {k: v / steps for k, v in work.items()}
    queued = ("graph_launches", "kernel_launches", "memsets", "d2d_copies", "blas_calls")
    return dict(
        config=name,
        framework="needle",
        graphs=True,
        device=ndl.cuda.get_device_name(device),
        simulated=bool(__import__("needle_c")._cuda_simulated()),
        vocab=vocab,
        batch=batch,
        seq_len=seq_len,
        steps=steps,
        graph_nodes=graphed.graph.num_nodes,
        host_launches_per_step=sum(per_step[k] for k in queued) + per_step["h2d_copies"],
        **{f"{k}_per_step": v for k, v in per_step.items()},
        last_loss=losses[-1],
    )


def torch_census(name, cfg, vocab, batch, steps, warmup):
    """The same step in PyTorch on the GPU, counted from its profiler's events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda")
    model = ptb_train.torch_models()(
        cfg.embedding_size, vocab, cfg.hidden_size, cfg.num_layers, cfg.seq_model
    )
    model = model.to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=ptb_train.COURSE.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    rows = (warmup + steps + 1) * ptb_train.COURSE.seq_len + 1
    batches = rng.integers(0, vocab, size=(rows, batch))
    h = None

    def step(n):
        nonlocal h
        i = n * ptb_train.COURSE.seq_len
        X = torch.tensor(batches[i : i + ptb_train.COURSE.seq_len], device=dev)
        y = torch.tensor(batches[i + 1 : i + 1 + ptb_train.COURSE.seq_len].reshape(-1), device=dev)
        if isinstance(h, tuple):
            h = tuple(t.detach() for t in h)
        logits, h = model(X, h)
        loss = loss_fn(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for n in range(warmup):
        step(n)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for n in range(warmup, warmup + steps):
            step(n)
        torch.cuda.synchronize()
    kernels = memsets = copies = syncs = 0
    for e in prof.events():
        kind = str(getattr(e, "device_type", ""))
        if kind.endswith("CUDA"):
            lname = e.name.lower()
            if "memset" in lname:
                memsets += 1
            elif "memcpy" in lname:
                copies += 1
            else:
                kernels += 1
        elif "synchronize" in e.name.lower() or e.name in ("cudaMemcpy", "cudaStreamSynchronize"):
            syncs += 1
    return dict(
        config=name,
        framework="torch",
        torch=torch.__version__,
        vocab=vocab,
        batch=batch,
        steps=steps,
        launches_per_step=(kernels + memsets + copies) / steps,
        kernel_launches_per_step=kernels / steps,
        memsets_per_step=memsets / steps,
        copies_per_step=copies / steps,
        host_syncs_per_step=syncs / steps,
    )


def misses(row):
    """The census targets this row misses, in words: issue 20's for eager steps, issue 37's
    (at most GRAPH_HOST_LAUNCHES host launches per replayed step) with ``--graphs``."""
    out = []
    if row.get("graphs"):
        if row["host_launches_per_step"] > GRAPH_HOST_LAUNCHES:
            out.append(
                f"host launches per replay {row['host_launches_per_step']:.1f} > "
                f"{GRAPH_HOST_LAUNCHES}"
            )
        if row["device_mallocs_per_step"] > 0:
            out.append(f"device mallocs {row['device_mallocs_per_step']:.2f} > 0")
        return out
    limit = TARGETS.get(row["config"], {}).get("launches")
    if limit is not None and row["launches_per_step"] > limit:
        out.append(f"launches + BLAS {row['launches_per_step']:.0f} > {limit}")
    common = TARGETS["all"]
    if row["host_syncs_per_step"] > common["host_syncs"]:
        out.append(f"host syncs {row['host_syncs_per_step']:.2f} > {common['host_syncs']}")
    if row["device_mallocs_per_step"] > common["device_mallocs"]:
        out.append(f"device mallocs {row['device_mallocs_per_step']:.2f} > 0")
    if row["h2d_bytes_per_step"] > common["h2d_bytes"]:
        out.append(f"h2d bytes {row['h2d_bytes_per_step']:.0f} > {common['h2d_bytes']}")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="transformer,lstm")
    parser.add_argument(
        "--device", default="cuda", choices=["cuda"], help="the census is the GPU's (default)"
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="vocabulary 1000, batch 16")
    parser.add_argument("--torch", action="store_true", help="also count PyTorch's step")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--graphs", action="store_true", help="count a replay of the step captured in a CUDA graph"
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1 (the first step allocates)")
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in ptb_train.CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {sorted(ptb_train.CONFIGS)}")
    vocab, batch = (
        (1000, 16) if args.small else (ptb_train.COURSE.vocab_size, ptb_train.COURSE.batch_size)
    )
    failed = []
    rows = []
    census = needle_graph_census if args.graphs else needle_census
    for name in names:
        cfg = ptb_train.CONFIGS[name]
        row = census(name, cfg, vocab, batch, args.steps, args.warmup)
        row["misses"] = misses(row)
        failed += [f"{name}: {m}" for m in row["misses"]]
        print(json.dumps(row), flush=True)
        rows.append(row)
        if args.torch:
            print(json.dumps(torch_census(name, cfg, vocab, batch, args.steps, args.warmup)))
    if args.graphs:
        print(
            f"\n{'config':<12} {'host launches':>13} {'graph nodes':>11} {'syncs':>6} "
            f"{'mallocs':>8}"
        )
        for r in rows:
            print(
                f"{r['config']:<12} {r['host_launches_per_step']:>13.1f} {r['graph_nodes']:>11} "
                f"{r['host_syncs_per_step']:>6.2f} {r['device_mallocs_per_step']:>8.2f}"
            )
        if args.check and failed:
            print("gpu_census: targets missed: " + "; ".join(failed), file=sys.stderr)
            return 1
        return 0
    print(
        f"\n{'config':<12} {'launch+BLAS':>11} {'kernels':>8} {'BLAS':>5} {'syncs':>6} "
        f"{'mallocs':>8} {'h2d B':>8} {'d2h B':>7}"
    )
    for r in rows:
        print(
            f"{r['config']:<12} {r['launches_per_step']:>11.1f} "
            f"{r['kernel_launches_per_step']:>8.1f} {r['blas_calls_per_step']:>5.1f} "
            f"{r['host_syncs_per_step']:>6.2f} {r['device_mallocs_per_step']:>8.2f} "
            f"{r['h2d_bytes_per_step']:>8.0f} {r['d2h_bytes_per_step']:>7.0f}"
        )
    for r in rows:
        top = list(r["kernels_per_step"].items())[:12]
        print(f"\n{r['config']}: launches per step by kernel (call site)")
        for site, count in top:
            print(f"  {count:>7.1f}  {site}")
    if args.check and failed:
        print("gpu_census: targets missed: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
