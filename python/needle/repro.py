"""``python -m needle.repro``: reproduce the course framework's device-memory leak, and fix it.

Runs the course's PTB Transformer language-model training step
(``needle.apps.course_config.COURSE``: embedding 20, hidden 32, 1 layer, 8 heads x 32, seq_len 20,
batch 256, Adam lr 3e-3, 10k vocabulary) in five modes, each in a fresh process, on a device with
a memory limit:

- ``leak``: the course's semantics ("needle" graph mode: every backward pass leaves
  reference cycles) with needle's collection policy off: cyclic garbage piles up until
  Python's object-count collector gets to it. This is the bug.
- ``manual``: the same, plus the course's workaround: ``del ...; gc.collect()`` every batch
  (its "collections" and "gc s" columns count those hand-written collections).
- ``hook``: "needle" graph mode with needle's device-memory pressure hook, which runs the
  collector when allocations pass a paced watermark. No code change in the loop.
- ``cycle_free``: needle's default autograd, which builds no cycles at all.
- ``gc_blind``: "needle" mode with tensors invisible to the collector (what a C extension
  without tp_traverse gives): the cycles can never be freed.

Three more modes run only when asked for (``--modes hook_frozen,hook_full,floor``):
``hook_frozen`` is ``hook`` plus one call to ``needle.memory.freeze_heap()`` after setup, so each
collection scans only what training creates (a collection's cost is set by every object in the
process, not by needle's garbage); ``hook_full`` is ``hook`` with full collections only (no
scoped collection of needle's own objects first); ``floor`` is the course's graph with a
``gc.collect()`` right after each ``reset_grad()``, the first moment the previous step's graph
is garbage: its peak is the least any collector can give the "needle" graph mode (the graph's
own working set).

On the CPU the limit emulates a GPU's capacity; by default it is 1.3x the peak of a short
calibration run of ``manual`` (two steps; ``floor`` with ``--ranks``), so that ``leak`` runs out
within a few steps while the fixes do not. ``--limit none`` sets no limit: on a GPU the modes
meet its own memory (a real out-of-memory error, where one comes). ``--extra-objects N`` keeps N
more tracked Python objects alive in each mode's process (a Jupyter kernel's heap is about 150k
objects more than a script's), which every full collection has to scan; the table's "gc %" is
the share of the loop's time spent in the mode's collections.
Prints a table and each mode's memory over the steps, writes ``repro.json`` (each mode's
``REPORT_KEYS``, with a record per step: allocated and reserved bytes, and the driver's free bytes
on a GPU) and a PNG timeline of allocated bytes to ``--out``. While a mode trains, its progress
goes to stderr (a tqdm bar when tqdm is installed, otherwise a line every tenth of the steps);
``--no-progress`` turns it off. The table and the file's contents go to stdout.

``--ranks N`` runs each mode data-parallel on N ranks (``python -m needle.distributed.run``,
the MPI backend): each rank trains on its ``--batch-size / N`` columns of every batch with the
model in ``DistributedDataParallel`` (aligned collections on), the limit is each rank's, and the
figures are rank 0's. A rank that runs out of memory stops every rank at that step.
"""

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from needle.apps.course_config import COURSE

MODES = ("leak", "manual", "hook", "cycle_free", "gc_blind")
EXTRA_MODES = ("hook_frozen", "hook_full", "floor")
DEFAULT_STEPS = 15

# What repro.json holds for each mode, in this order.
REPORT_KEYS = (
    "mode",
    "device",
    "steps",
    "oom",
    "oom_step",
    "peak_allocated_bytes",
    "final_allocated_bytes",
    "pressure_collections",
    "scoped_collections",
    "full_collections",
    "gc_seconds",
    "seconds",
    "gc_share",
    "mean_step_seconds",
    "last_loss",
    "limit_bytes",
    "extra_objects",
    "tracked_objects",
    "ranks",
    "samples",
)
# One record of a mode's "samples": the device's memory after a step.
SAMPLE_KEYS = ("step", "allocated", "reserved", "free")
# A worker's line on stdout that reports a finished step (a JSON object after the tag), not its
# result: the driver turns these into progress while the mode runs.
_PROGRESS_TAG = "needle.repro progress "


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="needle.repro", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        help="directory with PTB text (ptb.*.txt or train.txt/test.txt); "
        "default: a synthetic corpus needle generates",
    )
    parser.add_argument(
        "--device",
        default="cuda" if _cuda_enabled() else "cpu",
        help="cpu or cuda (default: cuda when available)",
    )
    parser.add_argument(
        "--limit",
        help="device memory limit: a size ('2GiB'), a fraction of the device ('0.5'), or 'none' "
        "(the device's own memory); default: calibrated",
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps per mode")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated subset of " + ",".join(MODES + EXTRA_MODES),
    )
    parser.add_argument("--batch-size", type=int, default=COURSE.batch_size)
    parser.add_argument("--seq-len", type=int, default=COURSE.seq_len)
    parser.add_argument("--out", default="repro_out", help="directory for repro.json and the plot")
    parser.add_argument("--words", type=int, default=200_000, help="size of the synthetic corpus")
    parser.add_argument(
        "--extra-objects",
        type=int,
        default=0,
        help="extra tracked Python objects kept alive in each mode's process (a Jupyter "
        "kernel's heap: about 150000)",
    )
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bar or lines on stderr while a mode trains",
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="run each mode data-parallel on this many ranks (MPI; --batch-size is the global "
        "batch)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--corpus-dir", help=argparse.SUPPRESS)
    parser.add_argument("--limit-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES + EXTRA_MODES and m != "calibrate"]
    if unknown:
        parser.error(
            f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES + EXTRA_MODES)}"
        )
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.extra_objects < 0:
        parser.error("--extra-objects must be >= 0")
    if args.ranks < 1:
        parser.error("--ranks must be at least 1")
    if args.batch_size % args.ranks:
        parser.error(f"--batch-size {args.batch_size} is not a multiple of --ranks {args.ranks}")
    if args.limit is not None and args.limit.strip().lower() == "none":
        args.limit = "none"
        if args.device == "cpu" and "gc_blind" in modes:
            # Nothing ever frees gc_blind's graphs: without a limit they fill the host.
            parser.error("--limit none on the cpu cannot run gc_blind (it would fill the host)")
    args.modes = modes
    return args


def _cuda_enabled():
    import needle_c

    return needle_c.cuda().enabled()


# ----------------------------------------------------------------- the worker


def _configure(mode, device, limit):
    import needle as ndl
    import needle_c as _c
    from needle import memory

    graph = "cycle_free" if mode == "cycle_free" else "needle"
    ndl.autograd.set_graph_mode(graph)
    # leak/manual: the course has no device-memory collections at all; floor collects by hand.
    memory.set_gc_policy(enabled=mode not in ("leak", "manual", "floor"))
    memory.set_gc_visible(mode != "gc_blind")
    _c._set_scoped_enabled(mode != "hook_full")
    if limit is not None:
        memory.set_memory_limit(device, limit)


def course_setup(corpus_dir, batch_size, seq_len, device):
    """The course's PTB Transformer set up for training on ``device``: returns
    ``(corpus, batches, model, optimizer, loss_fn)`` (NumPy seeded with 0 before the model)."""
    import numpy as np

    import needle as ndl
    from needle import nn
    from needle.apps.models import LanguageModel
    from needle.data import Corpus, batchify

    corpus = Corpus(corpus_dir)
    train = batchify(corpus.train, batch_size, device=device, dtype="float32")
    np.random.seed(0)
    model = LanguageModel(
        COURSE.embedding_size,
        len(corpus.dictionary),
        hidden_size=COURSE.hidden_size,
        num_layers=COURSE.num_layers,
        seq_model=COURSE.seq_model,
        seq_len=seq_len,
        device=device,
    )
    opt = ndl.optim.Adam(model.parameters(), lr=COURSE.lr)
    model.train()
    return corpus, train, model, opt, nn.SoftmaxLoss()


def _run_worker(args):
    """Trains in one mode in this process; prints one JSON object."""
    import needle as ndl
    from needle import memory
    from needle.data import get_batch

    mode = args.worker
    group = _join_group(args.ranks)
    device = ndl.cpu() if args.device == "cpu" else ndl.cuda()
    if group is not None and args.device == "cuda":
        device = group.get_device()
    # corpus stays alive, as in the course notebook: its token lists are part of the heap.
    corpus, train, model, opt, loss_fn = course_setup(
        args.corpus_dir, args.batch_size, args.seq_len, device
    )
    if group is not None:
        train = group.ptb_rank_columns(train)
        model = group.DistributedDataParallel(model)
    # The heap a notebook adds: small tracked objects that every full collection scans.
    heap = [[i] for i in range(args.extra_objects)]
    _configure(mode, device, args.limit_bytes)
    if mode == "hook_frozen":
        memory.freeze_heap()  # after setup, before the first graph exists
    memory.reset_peak_memory_stats(device)
    start_allocated = memory.memory_allocated(device)
    start_stats = memory.memory_stats(device)
    tracked_objects = len(gc.get_objects())
    samples, step_times = [], []
    oom, oom_step, last_loss, steps = False, None, None, 0
    manual_gc_seconds = 0.0
    nbatch = train.shape[0]
    position = 0
    loop_start = time.perf_counter()
    for step in range(1, args.steps + 1):
        if position >= nbatch - 1 - args.seq_len:
            position = 0
        t0 = time.perf_counter()
        try:
            X, y = get_batch(train, position, args.seq_len, device=device, dtype="float32")
            logits, _ = model(X)
            loss = loss_fn(logits, y)
            opt.reset_grad()
            if mode == "floor":
                t_gc = time.perf_counter()
                gc.collect()
                manual_gc_seconds += time.perf_counter() - t_gc
            loss.backward()
            opt.step()
            last_loss = float(loss.numpy().reshape(-1)[0])
            if mode == "manual":
                del logits, loss, X, y
                t_gc = time.perf_counter()
                gc.collect()
                manual_gc_seconds += time.perf_counter() - t_gc
        except MemoryError as err:
            if not isinstance(err, ndl.OutOfMemoryError):
                raise
            oom, oom_step = True, step
            samples.append(_memory_sample(step, device))
            _ranks_stop(group, True)
            break
        except Exception as err:
            # Another rank stopped (out of memory) while this one was in a gradient all-reduce:
            # its stop call and this all-reduce disagree, and both ranks are told.
            if group is None or not isinstance(err, group.DistributedError):
                raise
            oom, oom_step = True, step
            break
        if _ranks_stop(group, False):
            oom, oom_step = True, step
            break
        step_times.append(time.perf_counter() - t0)
        position += args.seq_len
        steps = step
        samples.append(_memory_sample(step, device))
        progress = {"step": step, "loss": last_loss, "allocated": samples[-1]["allocated"]}
        print(_PROGRESS_TAG + json.dumps(progress), flush=True)
    seconds = time.perf_counter() - loop_start
    stats = memory.memory_stats(device)

    def grown(key):
        return stats[key] - start_stats[key]

    result = {
        "mode": mode,
        "device": str(device),
        "steps": steps,
        "oom": oom,
        "oom_step": oom_step,
        "peak_allocated_bytes": stats["allocated_bytes.all.peak"],
        "final_allocated_bytes": stats["allocated_bytes.all.current"],
        "pressure_collections": grown("num_pressure_collections") + grown("num_oom_collections"),
        "scoped_collections": grown("num_scoped_collections"),
        "full_collections": grown("num_full_collections"),
        "gc_seconds": grown("gc_seconds"),
        "seconds": seconds,
        "mean_step_seconds": sum(step_times) / len(step_times) if step_times else None,
        "last_loss": last_loss,
        "start_allocated_bytes": start_allocated,
        "limit_bytes": args.limit_bytes,
        "extra_objects": len(heap),
        "tracked_objects": tracked_objects,
        "ranks": args.ranks,
        "samples": samples,
    }
    if mode in ("manual", "floor"):
        # The hand-written collections: the cost to compare with the hook's.
        result["gc_seconds"] = manual_gc_seconds
        result["pressure_collections"] = steps
    result["gc_share"] = result["gc_seconds"] / seconds if seconds > 0 else None
    # What the device holds beyond live arrays once garbage and cache are gone: memory a
    # library took through needle's allocator (cuBLAS's workspace, 32 MiB on a Hopper GPU)
    # and the unused parts of segments live arrays keep. A limit counts reserved bytes, so
    # the calibration adds this to the allocated peak it measures.
    gc.collect()
    memory.empty_cache(device)
    result["held_beyond_arrays_bytes"] = memory.memory_reserved(device) - memory.memory_allocated(
        device
    )
    if group is None or group.get_rank() == 0:
        print(json.dumps(result))


def _join_group(ranks):
    """needle.distributed with its process group up for a worker of ``--ranks`` > 1 (the ranks
    past 0 print nothing); None for one rank."""
    if ranks == 1:
        return None
    from needle import distributed

    distributed.init_process_group()
    if distributed.get_world_size() != ranks:
        raise SystemExit(
            f"needle.repro: started on {distributed.get_world_size()} ranks, expected {ranks}"
        )
    if distributed.get_rank() != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
    return distributed


def _ranks_stop(group, stopping):
    """Whether any rank stops here (out of memory): every rank calls it at the end of each step,
    and a rank that ran out of memory calls it at once; True when one did. A rank still in a
    gradient all-reduce then gets a DistributedError instead (the calls disagree)."""
    if group is None:
        return stopping
    import numpy as np

    import needle as ndl

    flag = ndl.NDArray(np.array([1.0 if stopping else 0.0], dtype=np.float32))
    try:
        group.all_reduce(flag)
    except group.DistributedError:
        return True
    return bool(flag.numpy()[0] > 0)


def _memory_sample(step, device):
    """The device's memory after a step: allocated and reserved bytes (needle's allocator) and,
    on a GPU, the driver's free bytes (every process and the CUDA context; None on the CPU)."""
    import needle as ndl
    from needle import memory

    free = ndl.cuda.mem_get_info(device)[0] if device.name == "cuda" else None
    values = (step, memory.memory_allocated(device), memory.memory_reserved(device), free)
    return dict(zip(SAMPLE_KEYS, values))


# ------------------------------------------------------------------ the driver


def _spawn(mode, args, corpus_dir, limit_bytes, steps, label=None):
    """Runs ``mode`` in a worker process, showing its progress under ``label`` (default: the
    mode); returns the worker's result."""
    cmd = [sys.executable, "-m"]
    if args.ranks > 1:
        cmd += ["needle.distributed.run", "-n", str(args.ranks), "-m"]
    cmd += [
        "needle.repro",
        "--ranks",
        str(args.ranks),
        "--worker",
        mode,
        "--corpus-dir",
        corpus_dir,
        "--device",
        args.device,
        "--steps",
        str(steps),
        "--batch-size",
        str(args.batch_size),
        "--seq-len",
        str(args.seq_len),
        "--extra-objects",
        str(args.extra_objects),
    ]
    if limit_bytes is not None:
        cmd += ["--limit-bytes", str(limit_bytes)]
    env = dict(os.environ)
    env.pop("NEEDLE_MEMORY_LIMIT", None)
    report, close = _progress_reporter(args.progress, steps, label or mode)
    lines = []
    # stderr to a file, not a pipe: a worker that fills a pipe nobody reads would wait forever.
    with tempfile.TemporaryFile(mode="w+") as err:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env) as proc:
            try:
                for line in proc.stdout:
                    if not line.startswith(_PROGRESS_TAG):
                        lines.append(line)
                    elif report is not None:
                        done = json.loads(line[len(_PROGRESS_TAG) :])
                        report(done["step"], done["loss"], done["allocated"])
            finally:
                close()
        if proc.returncode != 0:
            err.seek(0)
            stderr = err.read()
            raise RuntimeError(f"mode {mode} failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    return json.loads("".join(lines).strip().splitlines()[-1])


def _progress_reporter(enabled, steps, label):
    """(report(step, loss, allocated_bytes) or None, close): the training loops' progress
    (needle.apps.simple_ml: a tqdm bar when tqdm is installed, else lines on stderr)."""
    from needle.apps.simple_ml import _make_progress

    return _make_progress(True if enabled else None, steps, label)


def _prepare_corpus(args, workdir):
    from needle.data import write_synthetic_corpus

    if args.data:
        if not os.path.isdir(args.data):
            raise SystemExit(f"needle.repro: --data {args.data!r} is not a directory")
        names = set(os.listdir(args.data))
        if "train.txt" not in names and "ptb.train.txt" not in names and "ptb.valid.txt" in names:
            print(
                f"data: {args.data} has no training split; ptb.valid.txt is used as training text"
            )
        return args.data, f"PTB text from {args.data}"
    path = write_synthetic_corpus(os.path.join(workdir, "corpus"), num_words=args.words, seed=0)
    return str(path), f"needle's synthetic corpus ({args.words} words, 10k vocabulary)"


def _mib(n):
    return "-" if n is None else f"{n / 2**20:,.1f}"


def _print_table(results, limit_bytes):
    print()
    print(f"limit: {'none' if limit_bytes is None else _mib(limit_bytes) + ' MiB'}")
    header = (
        f"{'mode':<11}{'steps':>6}{'OOM':>10}{'peak MiB':>11}{'final MiB':>11}"
        f"{'collections':>13}{'gc s':>8}{'gc %':>7}{'step s':>8}{'loss':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        oom = f"at {r['oom_step']}" if r["oom"] else "no"
        gc_s = "-" if r["gc_seconds"] is None else f"{r['gc_seconds']:.2f}"
        step_s = "-" if r["mean_step_seconds"] is None else f"{r['mean_step_seconds']:.3f}"
        loss = "-" if r["last_loss"] is None else f"{r['last_loss']:.3f}"
        share = "-" if r["gc_share"] is None else f"{100 * r['gc_share']:.1f}"
        print(
            f"{r['mode']:<11}{r['steps']:>6}{oom:>10}{_mib(r['peak_allocated_bytes']):>11}"
            f"{_mib(r['final_allocated_bytes']):>11}{r['pressure_collections']:>13}{gc_s:>8}"
            f"{share:>7}{step_s:>8}{loss:>8}"
        )
    print()
    print("memory after each step (MiB): allocated min-max, reserved max, driver's free min")
    for r in results:
        samples = r["samples"] or [{"allocated": 0, "reserved": 0, "free": None}]
        allocated = [s["allocated"] for s in samples]
        free = [s["free"] for s in samples if s["free"] is not None]
        print(
            f"{r['mode']:<11}{_mib(min(allocated)):>10} -{_mib(max(allocated)):>10}"
            f"{_mib(max(s['reserved'] for s in samples)):>11}"
            f"{_mib(min(free)) if free else '-':>11}"
        )


def _plot(results, limit_bytes, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        steps = [0] + [s["step"] for s in r["samples"]]
        allocated = [r["start_allocated_bytes"] / 2**20] + [
            s["allocated"] / 2**20 for s in r["samples"]
        ]
        # leak and gc_blind often trace the same line: dash one so both stay visible.
        style = {"gc_blind": "--", "manual": ":"}.get(r["mode"], "-")
        (line,) = ax.plot(steps, allocated, marker=".", linestyle=style, label=r["mode"])
        if r["oom"]:
            ax.plot(steps[-1], allocated[-1], "x", color=line.get_color(), markersize=10)
    if limit_bytes is not None:
        ax.axhline(limit_bytes / 2**20, color="black", linestyle="--", linewidth=1, label="limit")
    ax.set_xlabel("training step")
    ax.set_ylabel("allocated after the step (MiB)")
    ax.set_title("needle: the course's leak (leak, gc_blind) and its fixes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        _run_worker(args)
        return 0
    import needle as ndl
    from needle.memory import memory_stats, parse_size

    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="needle-repro-") as workdir:
        corpus_dir, corpus_note = _prepare_corpus(args, workdir)
        print(
            f"needle {ndl.__version__} on {args.device} ({platform.machine()}, "
            f"{os.cpu_count()} cpus); data: {corpus_note}"
        )
        if args.limit == "none":
            limit_bytes = None
            print("limit: none (the device's own memory)")
        elif args.limit:
            device = ndl.cpu() if args.device == "cpu" else ndl.cuda()
            capacity = memory_stats(device).get("device_capacity_bytes")
            try:
                limit_bytes = parse_size(args.limit, capacity)
            except (ValueError, TypeError) as err:
                raise SystemExit(f"needle.repro: --limit {args.limit!r}: {err}") from None
            print(f"limit: {args.limit} as given ({_mib(limit_bytes)} MiB)")
        else:
            # What the course's own workaround needs, measured: two steps of the `manual`
            # mode peak with the previous step's graph still alive through the parameters'
            # .grad (until reset_grad) beside the new forward pass. The emulated device gets
            # 1.3x that: room for the workaround and the hook, not for garbage that piles up.
            # A limit counts reserved bytes: the device also holds what is not an array
            # (cuBLAS's workspace on a GPU), which the calibration measures and adds.
            # DistributedDataParallel's averaged .grad holds no graph, so on several ranks
            # the workaround frees more than the course loop can; there the measure is `floor`
            # (the previous step's graph alive, through the loop's names, until reset_grad).
            base = "manual" if args.ranks == 1 else "floor"
            calibration = _spawn(base, args, corpus_dir, None, 2, label="calibration")
            held = calibration["held_beyond_arrays_bytes"]
            limit_bytes = int(calibration["peak_allocated_bytes"] * 1.3) + held
            what = "the course's workaround" if base == "manual" else "the floor"
            print(
                f"calibration: two steps of {what} peak at "
                f"{_mib(calibration['peak_allocated_bytes'])} MiB, and the device holds "
                f"{_mib(held)} MiB beyond arrays; "
                f"emulated device limit {_mib(limit_bytes)} MiB"
            )
        results = []
        for mode in args.modes:
            t0 = time.perf_counter()
            result = _spawn(mode, args, corpus_dir, limit_bytes, args.steps)
            results.append(result)
            status = (
                f"out of memory at step {result['oom_step']}"
                if result["oom"]
                else f"{result['steps']} steps"
            )
            print(
                f"  {mode:<11} {status}, peak {_mib(result['peak_allocated_bytes'])} MiB "
                f"({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
    _print_table(results, limit_bytes)
    report = [{k: r[k] for k in REPORT_KEYS} for r in results]
    json_path = os.path.join(args.out, "repro.json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
    png_path = os.path.join(args.out, "repro_timeline.png")
    try:
        _plot(results, limit_bytes, png_path)
        print(f"\nwrote {json_path} and {png_path}")
    except ImportError:
        print(f"\nwrote {json_path}; the timeline plot needs matplotlib (pip install matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
