"""Data-parallel scaling on the CPU: the PTB course step at 1 and 2 ranks, needle's
DistributedDataParallel (MPI) against PyTorch's DDP (gloo), same run, same split.

Configurations as in bench/ptb_train.py: the course's Transformer LM and its LSTM twin
(``needle.apps.course_config.COURSE``: vocabulary 10k, sequence length 20, Adam lr 3e-3), at the
global batch B (default the course's 256): one process trains on all B columns, two ranks on
B/2 columns each (``needle.distributed.ptb_rank_columns``; PyTorch gets the same columns), so
both runs process B x 20 tokens a step. Every rank has one compute thread (NEEDLE_NUM_THREADS,
OMP_NUM_THREADS = 1, ``torch.set_num_threads(1)``) and ranks start under ``mpiexec`` (PyTorch's
too: it reads its rank from OMPI_COMM_WORLD_RANK/SIZE and meets at MASTER_ADDR 127.0.0.1 on a
free MASTER_PORT). The 1-rank runs are plain training (no process group, no DDP wrapper).

A step is the course loop's: get_batch, detach of the carried state, forward, softmax
cross-entropy, zero grads, backward (in both frameworks DDP's hooks start each bucket's
all-reduce during the backward, which returns with the averaged gradients), Adam step, reading
the loss. Reported: median step time (for each step the slowest rank's), tokens/s = B x 20 /
step time, and the 2-rank efficiency = tokens/s(2 ranks) / (2 x tokens/s(1 rank)); for needle
also the all-reduce's share hidden under the backward. ``wait ms``: the median time the end of a
backward waited (``ddp.reduction_stats``: the slower rank's wait, the other rank's lateness
included); ``exposed ms``: the median time from the moment the later rank had computed its last
gradient (the last bucket's launch) to the moment the all-reduces were done on both (the part
of the all-reduce no backward hid: ``time.perf_counter`` is one clock for the processes of a
machine);
``allreduce ms``: the median time the same buckets' all-reduces take one after another with
nothing to overlap (measured after the timed steps, on both ranks at once);
``hidden = 1 - exposed / allreduce``. Without PyTorch only needle's numbers are printed. The
machine's other load counts: on a shared box, ``--rounds R`` launches every run R times,
interleaved, and takes the median over all their steps.

    python bench/ddp_scaling.py [--steps 10] [--warmup 2] [--batch 256]
                                [--configs transformer,lstm] [--frameworks needle,torch]
                                [--rounds 1]
"""

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import ddputil
import numpy as np

from needle.apps.course_config import COURSE

CONFIGS = {
    "transformer": COURSE,
    "lstm": dataclasses.replace(COURSE, seq_model="lstm"),
}
RANKS = (1, 2)


# --------------------------------------------------------------------------
# the ranks
# --------------------------------------------------------------------------


def run_needle(args, rank, world):
    import needle.distributed as dist
    from needle import nn, optim

    batches, vocab = ddputil.rank_batches(args.data, args.batch, rank, world, args.vocab)
    model = ddputil.needle_model(CONFIGS[args.config], vocab, args.seq_len)
    ddp, waits, blocking = None, [], []
    if world > 1:
        dist.init_process_group(backend="mpi")
        ddp = dist.DistributedDataParallel(model)
    opt = optim.Adam(model.parameters(), lr=COURSE.lr)
    loss_fn = nn.SoftmaxLoss()
    h, times, losses = None, [], []
    rows = ddputil.batch_rows(batches.shape[0], args.seq_len, args.warmup + args.steps)
    ends = []
    for n, row in enumerate(rows):
        waited = ddp.reduction_stats["exposed_wait_s"] if ddp else 0.0
        start = time.perf_counter()
        loss, h = ddputil.needle_step(model, ddp, opt, loss_fn, batches, row, h, args.seq_len)
        if n >= args.warmup:
            times.append(time.perf_counter() - start)
            if ddp:
                stats = ddp.reduction_stats
                waits.append(stats["exposed_wait_s"] - waited)
                ends.append((stats["last_arrival"], stats["last_done"]))
        losses.append(loss)
    if world > 1:
        blocking = ddputil.blocking_allreduce_seconds(ddp, max(args.steps, 5))
    result = {
        "times": times,
        "losses": losses,
        "wait": waits,
        "ends": ends,
        "allreduce": blocking,
    }
    if world > 1:
        dist.destroy_process_group()
    return result


def run_torch(args, rank, world):
    import torch
    from ptb_train import copy_needle_parameters, torch_models

    torch.set_num_threads(1)
    cfg = CONFIGS[args.config]
    batches, vocab = ddputil.rank_batches(args.data, args.batch, rank, world, args.vocab)
    torch.manual_seed(0)
    model = torch_models()(
        cfg.embedding_size, vocab, cfg.hidden_size, cfg.num_layers, cfg.seq_model
    )
    copy_needle_parameters(model, cfg, vocab)
    model.train()
    net = model
    if world > 1:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=COURSE.lr)
    data = torch.from_numpy(batches.astype(np.int64))
    seq = args.seq_len
    h, times, losses = None, [], []
    rows = ddputil.batch_rows(batches.shape[0], seq, args.warmup + args.steps)
    for n, i in enumerate(rows):
        start = time.perf_counter()
        X, y = data[i : i + seq], data[i + 1 : i + 1 + seq].reshape(-1)
        if isinstance(h, tuple):
            h = tuple(t.detach() for t in h)
        logits, h = net(X, h)
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if n >= args.warmup:
            times.append(time.perf_counter() - start)
    if world > 1:
        torch.distributed.destroy_process_group()
    return {
        "times": times,
        "losses": losses,
        "wait": [],
        "ends": [],
        "allreduce": [],
        "version": torch.__version__,
    }


def worker(args):
    rank, world = ddputil.rank_and_world()
    run = run_needle if args.worker == "needle" else run_torch
    result = run(args, rank, world)
    result.update(rank=rank, world=world)
    ddputil.write_result(args.out, rank, result)


# --------------------------------------------------------------------------
# the driver
# --------------------------------------------------------------------------


def torch_version():
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def launch_run(args, config, framework, ranks, data_dir, out_dir):
    """One (configuration, framework, ranks) launch; returns the ranks' results."""
    argv = [
        os.path.abspath(__file__),
        "--worker",
        framework,
        "--config",
        config,
        "--data",
        data_dir,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--batch",
        str(args.batch),
        "--vocab",
        str(args.vocab),
        "--seq-len",
        str(args.seq_len),
    ]
    env = {}
    if framework == "torch":
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ddputil.free_port())}
    return ddputil.launch(ranks, argv, out_dir, env)


def summarize(args, config, framework, ranks, launches):
    """The row of one (configuration, framework, ranks) over its launches (rounds): the
    median over all their steps."""
    steps = [t for results in launches for t in ddputil.step_times(results)]
    step = statistics.median(steps)
    # each rank's own figures: the slower rank's wait is the exposed part (rank 0's and rank
    # 1's differ by the lateness of the other)
    wait = [max(ts) for results in launches for ts in zip(*(r["wait"] for r in results))]
    blocking = [max(ts) for results in launches for ts in zip(*(r["allreduce"] for r in results))]
    # per step: from the later rank's arrival at the end of its backward to the last rank's
    # all-reduces done
    exposed = [
        max(done for _, done in step) - max(arrival for arrival, _ in step)
        for results in launches
        for step in zip(*(r["ends"] for r in results))
    ]
    results = launches[0]
    wait_ms = statistics.median(wait) * 1e3 if wait else None
    exposed_ms = statistics.median(exposed) * 1e3 if exposed else None
    allreduce_ms = statistics.median(blocking) * 1e3 if blocking else None
    return {
        "config": config,
        "framework": framework,
        "ranks": ranks,
        "batch_per_rank": args.batch // ranks,
        "steps": len(steps),
        "rounds": len(launches),
        "step_ms": step * 1e3,
        "tokens_per_s": args.batch * args.seq_len / step,
        "wait_ms": wait_ms,
        "exposed_ms": exposed_ms,
        "allreduce_ms": allreduce_ms,
        "hidden": max(0.0, 1.0 - exposed_ms / allreduce_ms) if exposed_ms is not None else None,
        # the mean of the ranks' losses: the one-process loss of the same global batch
        "first_loss": statistics.mean(r["losses"][0] for r in results),
        "last_loss": statistics.mean(r["losses"][-1] for r in results),
    }


def add_efficiency(rows):
    """Sets each multi-rank row's ``efficiency``: tokens/s(n) / (n x tokens/s(1))."""
    one = {(r["config"], r["framework"]): r for r in rows if r["ranks"] == 1}
    for r in rows:
        base = one.get((r["config"], r["framework"]))
        r["efficiency"] = r["tokens_per_s"] / (r["ranks"] * base["tokens_per_s"]) if base else None


def print_table(rows):
    print(
        f"{'config':<13}{'framework':<10}{'ranks':>6}{'batch/rank':>11}{'step ms':>10}"
        f"{'tokens/s':>10}{'efficiency':>12}{'wait ms':>9}{'exposed ms':>12}{'allreduce ms':>14}"
        f"{'hidden':>8}{'loss first->last':>19}"
    )
    for r in rows:
        wait = "-" if r["wait_ms"] is None else f"{r['wait_ms']:.2f}"
        exposed = "-" if r["exposed_ms"] is None else f"{r['exposed_ms']:.2f}"
        total = "-" if r["allreduce_ms"] is None else f"{r['allreduce_ms']:.2f}"
        hidden = "-" if r["hidden"] is None else f"{r['hidden']:.0%}"
        eff = "-" if r["ranks"] == 1 or r["efficiency"] is None else f"{r['efficiency']:.2f}"
        losses = f"{r['first_loss']:.2f}->{r['last_loss']:.2f}"
        print(
            f"{r['config']:<13}{r['framework']:<10}{r['ranks']:>6}{r['batch_per_rank']:>11}"
            f"{r['step_ms']:>10.1f}{r['tokens_per_s']:>10.0f}{eff:>12}{wait:>9}{exposed:>12}"
            f"{total:>14}"
            f"{hidden:>8}{losses:>19}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=COURSE.batch_size, help="global batch")
    parser.add_argument("--seq-len", type=int, default=COURSE.seq_len)
    parser.add_argument("--vocab", type=int, default=COURSE.vocab_size)
    parser.add_argument("--configs", default="transformer,lstm")
    parser.add_argument("--frameworks", default="needle,torch")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="launch every run this many times, interleaved (a shared box's load then falls on "
        "all of them alike); the median is over all their steps",
    )
    parser.add_argument("--json", action="store_true", help="only the JSON lines, no table")
    parser.add_argument("--worker", choices=("needle", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--config", choices=tuple(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--steps and --rounds must be >= 1 and --warmup >= 0")
    if args.batch % max(RANKS) != 0:
        parser.error(f"--batch must be a multiple of {max(RANKS)} (each rank gets an equal share)")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for c in configs:
        if c not in CONFIGS:
            parser.error(f"unknown configuration {c!r} (choose from {', '.join(CONFIGS)})")
    for f in frameworks:
        if f not in ("needle", "torch"):
            parser.error(f"unknown framework {f!r} (choose from needle, torch)")
    ddputil.mpiexec_path()
    ddputil.require_mpi4py("ddp_scaling")
    torch = torch_version()
    if "torch" in frameworks and torch is None:
        print("# PyTorch is not installed (pip install torch==2.13.0): needle only", flush=True)
        frameworks.remove("torch")

    from benchutil import print_machine

    info = print_machine(torch=torch, threads_per_rank=1)
    with tempfile.TemporaryDirectory(prefix="needle-ddp-scaling-") as tmp:
        data_dir = str(
            ddputil.write_corpus(
                os.path.join(tmp, "corpus"),
                args.warmup + args.steps,
                args.batch,
                args.seq_len,
                args.vocab,
            )
        )
        keys = [(c, fw, n) for c in configs for fw in frameworks for n in RANKS]
        launches = {key: [] for key in keys}
        for _ in range(args.rounds):
            for key in keys:
                launches[key].append(launch_run(args, *key, data_dir, tmp))
        rows = [summarize(args, *key, launches[key]) for key in keys]
    add_efficiency(rows)
    for r in rows:
        print(json.dumps(r), flush=True)
    if args.json:
        return
    print()
    print(
        f"machine: {info['cpu']}, {info['cpus']} cpus, Python {info['python']}, "
        f"needle {info['needle']}, PyTorch {torch or 'absent'}; one thread per rank, "
        f"global batch {args.batch} x seq_len {args.seq_len}, {args.steps} timed steps x "
        f"{args.rounds} round(s), interleaved"
    )
    print_table(rows)


if __name__ == "__main__":
    sys.exit(main())
