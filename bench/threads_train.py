"""Two threads training at once for a while: no crash, no spurious out-of-memory
error, and every step's loss and gradients equal to those of the same training
run alone (issue 11's thread target). Not a speed benchmark: it prints the steps
each thread ran, the collections needle ran, and the largest deviation from the
single-thread reference.

    python bench/threads_train.py [--seconds 60] [--mode needle|cycle_free] [--limit-mib 64]

Each thread trains its own tanh MLP (seeded) in the given graph mode under one
CPU memory limit, with Python's own automatic collections off, so that in
"needle" mode the step's cyclic garbage is freed by needle's collector (pressure
and out-of-memory collections), which runs in one thread while the other
allocates. The reference is the same seed trained alone for the same number of
steps, afterwards.
"""

import argparse
import gc
import json
import threading
import time

import numpy as np

import needle as ndl
from needle import memory

from benchutil import print_machine

MiB = 2**20


def train(seed, mode, should_stop, record):
    """Trains until should_stop(steps); appends (loss, |grad w1|, |grad w2|) per step."""
    rng = np.random.default_rng(seed)
    x = ndl.Tensor(rng.standard_normal((256, 128)).astype(np.float32), requires_grad=False)
    y = ndl.Tensor(rng.integers(0, 10, 256).astype(np.float32), requires_grad=False)
    w1 = ndl.Tensor(rng.standard_normal((128, 256)).astype(np.float32) * 0.05)
    w2 = ndl.Tensor(rng.standard_normal((256, 10)).astype(np.float32) * 0.05)
    steps = 0
    with ndl.autograd.graph_mode(mode):
        while not should_stop(steps):
            loss = ndl.softmax_cross_entropy(ndl.tanh(x @ w1) @ w2, y)
            w1.grad = w2.grad = None
            loss.backward()
            g1, g2 = w1.grad.numpy(), w2.grad.numpy()
            record.append((float(loss.numpy()[0]), g1, g2))
            w1.data = w1.data - w1.grad.detach() * 0.05
            w2.data = w2.data - w2.grad.detach() * 0.05
            steps += 1
    return steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--mode", choices=ndl.autograd.GRAPH_MODES, default="needle")
    parser.add_argument("--limit-mib", type=int, default=64)
    args = parser.parse_args()
    print_machine(mode=args.mode, seconds=args.seconds, limit_mib=args.limit_mib)

    gc.collect()
    gc.set_threshold(10**9)
    memory.set_memory_limit("cpu", memory.memory_allocated("cpu") + args.limit_mib * MiB)
    start_stats = memory.memory_stats("cpu")
    deadline = time.perf_counter() + args.seconds
    records = {1: [], 2: []}
    errors = []

    def run(seed):
        try:
            train(seed, args.mode, lambda _: time.perf_counter() > deadline, records[seed])
        except Exception as err:  # reported in the summary
            errors.append(f"thread {seed}: {err!r}")

    threads = [threading.Thread(target=run, args=(seed,)) for seed in records]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = memory.memory_stats("cpu")

    worst = 0.0
    for seed, record in records.items():
        alone = []
        train(seed, args.mode, lambda steps, n=len(record): steps >= n, alone)
        for (loss, g1, g2), (loss0, r1, r2) in zip(record, alone):
            for got, want in ((np.float32(loss), np.float32(loss0)), (g1, r1), (g2, r2)):
                scale = max(float(np.max(np.abs(want))), 1e-30)
                worst = max(worst, float(np.max(np.abs(got - want))) / scale)
    memory.set_memory_limit("cpu", None)

    result = {
        "mode": args.mode,
        "seconds": args.seconds,
        "steps": {str(s): len(r) for s, r in records.items()},
        "errors": errors,
        "ooms": stats["num_ooms"] - start_stats["num_ooms"],
        "collections": stats["num_collect_calls"] - start_stats["num_collect_calls"],
        "max_relative_deviation": worst,
    }
    print(json.dumps(result), flush=True)
    print(f"\n{'thread':>8}{'steps':>8}")
    for seed, record in records.items():
        print(f"{seed:>8}{len(record):>8}")
    print(
        f"errors: {len(errors)}  out-of-memory errors: {result['ooms']}  "
        f"collections: {result['collections']}  "
        f"largest deviation from training alone: {worst:.2e}"
    )
    for line in errors:
        print(" ", line)


if __name__ == "__main__":
    main()
