"""The straggler cost of garbage collection in data-parallel training: step time on one rank
while the other rank's collector runs, with independent, aligned and Megatron-style collections.

Two ranks (``mpiexec -n 2``, one thread each) train the course's PTB Transformer LM under
needle's DistributedDataParallel, in the course's graph mode (``"needle"``: every backward
leaves reference cycles, so each step leaves garbage that only a collection frees; the repro's
``hook`` mode). Rank 1 is the straggler: it gets a memory limit (``ndl.memory.set_memory_limit``
on the CPU, ``--limit-factor`` x the peak reserved bytes of a warm-up step, so that pressure
collections run there) and, except in the baseline, ``--extra-objects`` more long-lived,
GC-tracked Python objects (small lists and dicts: about what a Jupyter kernel adds to a
script's heap) that every full collection scans. Step time is measured on rank 0, the rank that
waits for rank 1 in each gradient all-reduce. Four runs, each in its own ``mpiexec``:

- ``baseline``: no extra heap; collections as usual (``aligned=False``);
- ``independent``: the extra heap; ``DistributedDataParallel(..., aligned=False)``: needle's
  pressure hook and Python's automatic collector run on each rank on their own;
- ``aligned``: the extra heap; ``aligned=True``: a rank's collection becomes a want carried
  in the gradient all-reduce, and every rank collects at the same step
  (``needle.memory.alignment``);
- ``manual_gc``: the extra heap; Megatron-LM's ``--manual-gc``: ``gc.disable()`` on every rank
  and ``gc.collect()`` on every rank every ``--gc-every`` steps (default 10), ``aligned=False``
  (needle's pressure hook stays on).

``--ladder``: ``scoped`` (needle's default: a pressure collection first collects needle's own
objects only, which does not scan the extra heap, and falls back to a full collection when that
frees too little) or ``full`` (full collections only, the repro's ``hook_full``: every pressure
collection scans the whole heap, the cost a straggler has when its garbage is not only
needle's; the default here, since it is the case alignment is for).

``--rounds R`` runs the four R times, interleaved, and pools each run's steps (on a shared box
the other load then falls on every run alike). Reported per run: rank 0's step-time p50 and p99
(and rank 1's), the collections each rank ran in the timed steps (``memory_stats()`` of the host
devices cpu and cpu_numpy: num_pressure_collections, num_oom_collections, num_full_collections,
num_aligned_collections, gc_seconds; Python's own collections per generation from
``gc.get_stats()``; ``needle.memory.alignment.stats()``), each rank's time per step in
the end of the backward waiting for the gradient all-reduces (``ddp.reduction_stats``'
``exposed_wait_s``: its waits for the other rank included) and rank 1's in the alignment
flags, and the ratio aligned p99 / baseline p99 (the issue's target: within 5%). Defaults are
smaller than the course's batch (global ``--batch 64``, 32 per rank) so that 4 x 220 steps run
in a few minutes on a 2-core box; ``--batch 256`` is the course's.

    python bench/ddp_straggler.py [--steps 200] [--warmup 20] [--batch 64]
                                  [--extra-objects 150000] [--limit-factor 3] [--gc-every 10]
                                  [--runs baseline,independent,aligned,manual_gc]
                                  [--ladder full|scoped] [--rounds 1]
"""

import argparse
import gc
import itertools
import json
import os
import sys
import tempfile
import time

import ddputil

from needle.apps.course_config import COURSE

RUNS = ("baseline", "independent", "aligned", "manual_gc")
STRAGGLER = 1  # the rank with the extra heap and the limit
# The counters of memory_stats() the report shows (their growth over the timed steps).
COUNTERS = (
    "num_pressure_collections",
    "num_oom_collections",
    "num_scoped_collections",
    "num_full_collections",
    "num_aligned_wants",
    "num_aligned_collections",
    "gc_seconds",
)


# --------------------------------------------------------------------------
# the ranks
# --------------------------------------------------------------------------


def host_stats():
    """``memory_stats()`` of needle's host devices (``cpu`` and ``cpu_numpy``), summed over
    COUNTERS: an aligned ladder is charged to the device that wanted it, else to the first
    device (needle_c/memory/pressure.c, run_aligned_collection), so the sum holds them all."""
    from needle import memory

    every = [memory.memory_stats(d) for d in ("cpu", "cpu_numpy")]
    return {k: sum(s.get(k, 0) for s in every) for k in COUNTERS}


def python_collections():
    """Python's collections so far, per generation (automatic ones and gc.collect() calls)."""
    return [s["collections"] for s in gc.get_stats()]


def _timed(fn, spent, key):
    """``fn`` adding its seconds to ``spent[key]``."""

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - start

    return timed


def calibrate_limit(step, device, factor):
    """Runs one step with the garbage collected before and after it; returns ``factor`` x the
    peak bytes reserved during it (what a limit counts)."""
    from needle import memory

    gc.collect()
    memory.reset_peak_memory_stats(device)
    step()
    peak = memory.max_memory_reserved(device)
    gc.collect()
    return int(factor * peak)


def worker(args):
    import needle as ndl
    import needle.distributed as dist
    import needle_c as _c
    from needle import memory, nn, optim
    from needle.memory import alignment

    rank, world = ddputil.rank_and_world()
    device = ndl.cpu()
    heap = []
    if rank == STRAGGLER and args.run != "baseline":
        # Long-lived before training starts, as in a notebook: collected once into the oldest
        # generation, where Python's own rules seldom look again but every full collection does.
        heap = [[i] if i % 2 else {"i": i} for i in range(args.extra_objects)]
        gc.collect()
    ndl.autograd.set_graph_mode("needle")
    memory.set_gc_policy(enabled=True)
    _c._set_scoped_enabled(args.ladder == "scoped")
    dist.init_process_group(backend="mpi")
    batches, vocab = ddputil.rank_batches(args.data, args.batch, rank, world, args.vocab)
    model = ddputil.needle_model(COURSE, vocab, args.seq_len)
    ddp = dist.DistributedDataParallel(model, aligned=args.run == "aligned")
    # where rank 1's time goes: the wait for the all-reduces at the end of each backward (the
    # other rank's lateness included) and the alignment flags' bookkeeping (local_wants, agreed)
    spent = {"sync": 0.0, "flags": 0.0}
    alignment.local_wants = _timed(alignment.local_wants, spent, "flags")
    alignment.agreed = _timed(alignment.agreed, spent, "flags")
    opt = optim.Adam(model.parameters(), lr=COURSE.lr)
    loss_fn = nn.SoftmaxLoss()
    rows = ddputil.batch_rows(batches.shape[0], args.seq_len, args.warmup + args.steps + 1)
    state = {"h": None, "n": 0}

    def step():
        row = rows[state["n"]]
        state["n"] += 1
        _, state["h"] = ddputil.needle_step(
            model, ddp, opt, loss_fn, batches, row, state["h"], args.seq_len
        )

    # every rank runs the calibration step (it is a collective step); rank 1 keeps the limit
    limit = calibrate_limit(step, device, args.limit_factor)
    if rank == STRAGGLER:
        memory.set_memory_limit(device, limit)
    manual = args.run == "manual_gc"
    if manual:
        gc.disable()
    times = []
    for n in range(args.warmup + args.steps):
        if n == args.warmup:
            stats0, python0 = host_stats(), python_collections()
            alignment.reset_stats()
            spent.update(sync=0.0, flags=0.0)
            waited0 = ddp.reduction_stats["exposed_wait_s"]
            memory.reset_peak_memory_stats(device)
        start = time.perf_counter()
        if manual and n % args.gc_every == 0:
            gc.collect()  # Megatron collects at the start of the step
        step()
        if n >= args.warmup:
            times.append(time.perf_counter() - start)
    stats, python1 = host_stats(), python_collections()
    result = {
        "rank": rank,
        "run": args.run,
        "times": times,
        "extra_objects": len(heap),
        "limit_bytes": limit if rank == STRAGGLER else None,
        "counters": {k: stats[k] - stats0[k] for k in COUNTERS},
        "python_collections": [b - a for a, b in zip(python0, python1)],
        "alignment": alignment.stats(),
        "allocated_bytes_end": memory.memory_allocated(device),
        "peak_allocated_bytes": memory.max_memory_allocated(device),
        "sync_seconds": ddp.reduction_stats["exposed_wait_s"] - waited0,
        "flags_seconds": spent["flags"],
    }
    dist.destroy_process_group()
    ddputil.write_result(args.out, rank, result)


# --------------------------------------------------------------------------
# the driver
# --------------------------------------------------------------------------


def merge_rounds(rounds):
    """One run's results over its rounds (each a list of the ranks' results): per rank, the
    step times one after the other and every count and time summed."""
    merged = []
    for per_rank in zip(*rounds):
        first = per_rank[0]
        alignment = dict(first["alignment"])
        for key in ("rounds", "collections_agreed", "collection_seconds", "wait_saved_seconds"):
            alignment[key] = sum(r["alignment"][key] for r in per_rank)
        alignment["generation_collections"] = [
            sum(gens) for gens in zip(*(r["alignment"]["generation_collections"] for r in per_rank))
        ]
        merged.append(
            dict(
                first,
                times=[t for r in per_rank for t in r["times"]],
                counters={k: sum(r["counters"][k] for r in per_rank) for k in COUNTERS},
                python_collections=[
                    sum(gens) for gens in zip(*(r["python_collections"] for r in per_rank))
                ],
                alignment=alignment,
                sync_seconds=sum(r["sync_seconds"] for r in per_rank),
                flags_seconds=sum(r["flags_seconds"] for r in per_rank),
            )
        )
    return merged


def summarize(results, args):
    r0, r1 = results[0], results[STRAGGLER]
    t0 = [t * 1e3 for t in r0["times"]]
    t1 = [t * 1e3 for t in r1["times"]]
    return {
        "run": r0["run"],
        "ladder": args.ladder,
        "steps": len(t0),
        "rounds": args.rounds,
        "batch_per_rank": args.batch // 2,
        "extra_objects_rank1": r1["extra_objects"],
        "limit_bytes_rank1": r1["limit_bytes"],
        "gc_every": args.gc_every if r0["run"] == "manual_gc" else None,
        "p50_ms": ddputil.percentile(t0, 50),
        "p99_ms": ddputil.percentile(t0, 99),
        "max_ms": max(t0),
        "rank1_p50_ms": ddputil.percentile(t1, 50),
        "rank1_p99_ms": ddputil.percentile(t1, 99),
        "counters": [r["counters"] for r in results],
        "python_collections": [r["python_collections"] for r in results],
        "alignment": [r["alignment"] for r in results],
        # the last round's: garbage that no collection freed shows here
        "allocated_mib_end": [r["allocated_bytes_end"] / 2**20 for r in results],
        "peak_allocated_mib": [r["peak_allocated_bytes"] / 2**20 for r in results],
        "sync_ms_per_step": [r["sync_seconds"] * 1e3 / len(r["times"]) for r in results],
        "flags_ms_per_step": [r["flags_seconds"] * 1e3 / len(r["times"]) for r in results],
    }


def print_table(rows):
    print(
        f"{'run':<13}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'r1 p50':>8}{'r1 p99':>8}"
        f"{'pressure r0/r1':>16}{'oom r0/r1':>11}{'full r0/r1':>12}{'aligned r0/r1':>15}"
        f"{'gc s r0/r1':>13}{'py gen2 r0/r1':>15}{'sync ms r0/r1':>15}{'flags ms r1':>13}"
        f"{'peak MiB r0/r1':>16}"
    )
    for r in rows:
        c0, c1 = r["counters"]
        py0, py1 = r["python_collections"]

        def pair(key, c0=c0, c1=c1):
            return f"{c0[key]}/{c1[key]}"

        print(
            f"{r['run']:<13}{r['p50_ms']:>8.1f}{r['p99_ms']:>8.1f}{r['max_ms']:>8.1f}"
            f"{r['rank1_p50_ms']:>8.1f}{r['rank1_p99_ms']:>8.1f}"
            f"{pair('num_pressure_collections'):>16}{pair('num_oom_collections'):>11}"
            f"{pair('num_full_collections'):>12}"
            f"{pair('num_aligned_collections'):>15}"
            f"{c0['gc_seconds']:>6.2f}/{c1['gc_seconds']:<6.2f}{f'{py0[2]}/{py1[2]}':>15}"
            f"{'{:.1f}/{:.1f}'.format(*r['sync_ms_per_step']):>15}"
            f"{r['flags_ms_per_step'][1]:>13.2f}"
            f"{'{:.0f}/{:.0f}'.format(*r['peak_allocated_mib']):>16}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=64, help="global batch (half per rank)")
    parser.add_argument("--seq-len", type=int, default=COURSE.seq_len)
    parser.add_argument("--vocab", type=int, default=COURSE.vocab_size)
    parser.add_argument("--extra-objects", type=int, default=150_000)
    parser.add_argument(
        "--limit-factor",
        type=float,
        default=3.0,
        help="rank 1's limit: this x the peak reserved bytes of a step (at 1.5 an aligned "
        "collection, deferred to the next step's safe point, comes after the next forward has "
        "already hit the limit)",
    )
    parser.add_argument("--gc-every", type=int, default=10, help="manual_gc's interval (steps)")
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the runs this many times, interleaved (a shared box's load then falls on all "
        "of them alike); each run's steps are pooled over its rounds",
    )
    parser.add_argument(
        "--ladder",
        choices=("full", "scoped"),
        default="full",
        help="pressure collections: full ones only, or needle's scoped-first ladder",
    )
    parser.add_argument("--json", action="store_true", help="only the JSON lines, no table")
    parser.add_argument("--run", choices=RUNS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        worker(args)
        return
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    for r in runs:
        if r not in RUNS:
            parser.error(f"unknown run {r!r} (choose from {', '.join(RUNS)})")
    if min(args.steps, args.gc_every, args.rounds) < 1 or min(args.warmup, args.extra_objects) < 0:
        parser.error("need --steps, --gc-every, --rounds >= 1 and --warmup, --extra-objects >= 0")
    if args.batch % 2 or args.limit_factor <= 1:
        parser.error("need an even --batch and --limit-factor > 1")
    ddputil.mpiexec_path()
    ddputil.require_mpi4py("ddp_straggler")

    from benchutil import print_machine

    info = print_machine(threads_per_rank=1, ranks=2)
    rows = []
    with tempfile.TemporaryDirectory(prefix="needle-ddp-straggler-") as tmp:
        total = args.warmup + args.steps + 1
        data_dir = str(
            ddputil.write_corpus(
                os.path.join(tmp, "corpus"), total, args.batch, args.seq_len, args.vocab
            )
        )
        launches = {run: [] for run in runs}
        for _, run in itertools.product(range(args.rounds), runs):
            argv = [
                os.path.abspath(__file__),
                "--run",
                run,
                "--data",
                data_dir,
                *("--steps", str(args.steps), "--warmup", str(args.warmup)),
                *("--batch", str(args.batch), "--seq-len", str(args.seq_len)),
                *("--vocab", str(args.vocab), "--extra-objects", str(args.extra_objects)),
                *("--limit-factor", str(args.limit_factor), "--gc-every", str(args.gc_every)),
                *("--ladder", args.ladder),
            ]
            launches[run].append(ddputil.launch(2, argv, tmp))
        for run in runs:
            row = summarize(merge_rounds(launches[run]), args)
            rows.append(row)
            print(json.dumps(row), flush=True)
    by_run = {r["run"]: r for r in rows}
    ratio = None
    if "aligned" in by_run and "baseline" in by_run:
        ratio = by_run["aligned"]["p99_ms"] / by_run["baseline"]["p99_ms"]
        print(json.dumps({"aligned_p99_over_baseline_p99": ratio}), flush=True)
    if args.json:
        return
    print()
    print(
        f"machine: {info['cpu']}, {info['cpus']} cpus, Python {info['python']}, "
        f"needle {info['needle']}; 2 ranks, one thread each; course Transformer, global batch "
        f"{args.batch} ({args.batch // 2} per rank) x seq_len {args.seq_len}; rank 1: "
        f"{args.extra_objects} extra objects (not in baseline), limit {args.limit_factor} x a "
        f"step's peak; {args.ladder} ladder; {args.steps} timed steps x {args.rounds} "
        f"round(s), interleaved; manual_gc every "
        f"{args.gc_every} steps"
    )
    print("step times on rank 0 (r1: rank 1's); collections in the timed steps, rank 0/rank 1")
    print_table(rows)
    if ratio is not None:
        print(f"aligned p99 / baseline p99: {ratio:.3f}")


if __name__ == "__main__":
    sys.exit(main())
