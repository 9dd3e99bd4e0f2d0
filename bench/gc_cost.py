"""What one full collection costs in the leak benchmark's process, against one training step.

    python bench/gc_cost.py [--steps 15] [--words 200000] [--extra-objects 0,100000,1000000]

The pressure policy can place collections (bench/leak_fix.py), but each one is a full
collection whose cost the process's heap sets, not needle. This script builds the state of a
`needle.repro` worker (course PTB Transformer, batch 256, seq_len 20, synthetic corpus), trains
with the collector off, and times `gc.collect()`:

- right after a step (caches cold, the previous step's graph as garbage in needle mode; none in
  cycle_free mode) and again at once (caches warm, nothing to free);
- with the corpus' token lists alive (as the course notebook keeps them) and after dropping them;
- with the startup heap (modules, model, data) moved out of the collector's sight by
  `gc.freeze()` after setup, a CPython technique for long-lived heaps that needle itself cannot
  apply (anything frozen is never collected, the next step's graph included).

Then the scoped collection (needle.memory.collect("needle")) against the full one, right after
a needle-mode step, with 0, 100k and 1M extra tracked Python objects alive (lists): steps
alternate between the two, each finding the previous step's graph as garbage; the full one after
a scoped one checks that nothing needle-only was left.

It prints JSON lines and tables: median milliseconds and the share of a median step.
"""

import argparse
import gc
import json
import os
import statistics
import tempfile
import time

import needle as ndl
import needle_c as _c
from needle import memory
from needle.apps.course_config import COURSE
from needle.data import get_batch, write_synthetic_corpus
from needle.repro import course_setup

from benchutil import print_machine


def measure(mode, keep_corpus, steps, corpus_dir, freeze=False):
    corpus, train, model, opt, loss_fn = course_setup(
        corpus_dir, COURSE.batch_size, COURSE.seq_len, ndl.cpu()
    )
    if not keep_corpus:
        del corpus
    previous_mode = ndl.autograd.set_graph_mode(mode)
    gc.disable()
    if freeze:
        gc.collect()
        gc.freeze()
    step_s, after_step_ms, warm_ms = [], [], []
    position = 0
    try:
        for step in range(steps + 2):
            t0 = time.perf_counter()
            X, y = get_batch(train, position, COURSE.seq_len)
            logits, _ = model(X)
            loss = loss_fn(logits, y)
            opt.reset_grad()
            loss.backward()
            opt.step()
            t1 = time.perf_counter()
            gc.collect()
            t2 = time.perf_counter()
            gc.collect()
            t3 = time.perf_counter()
            position = (position + COURSE.seq_len) % (train.shape[0] - COURSE.seq_len - 1)
            if step >= 2:  # warm-up steps fill the block cache
                step_s.append(t1 - t0)
                after_step_ms.append(1e3 * (t2 - t1))
                warm_ms.append(1e3 * (t3 - t2))
        tracked = len(gc.get_objects())
    finally:
        gc.unfreeze()
        gc.enable()
        ndl.autograd.set_graph_mode(previous_mode)
        del model, opt, loss, logits, X, y
        gc.collect()
        memory.empty_cache()
    step_ms = 1e3 * statistics.median(step_s)
    return {
        "graph_mode": mode,
        "heap": "frozen" if freeze else "kept" if keep_corpus else "dropped",
        "tracked_objects": tracked,
        "step_ms": step_ms,
        "gc_after_step_ms": statistics.median(after_step_ms),
        "gc_warm_ms": statistics.median(warm_ms),
        "after_step_share": statistics.median(after_step_ms) / step_ms,
    }


def measure_scoped(extra, steps, corpus_dir):
    """Scoped vs full collection right after a needle-mode step, `extra` more tracked objects."""
    corpus, train, model, opt, loss_fn = course_setup(
        corpus_dir, COURSE.batch_size, COURSE.seq_len, ndl.cpu()
    )
    junk = [[i] for i in range(extra)]
    previous_mode = ndl.autograd.set_graph_mode("needle")
    gc.collect()
    gc.disable()
    scoped_ms, full_ms, examined, freed, left = [], [], [], [], []
    position = 0
    try:
        for step in range(2 * steps + 2):
            X, y = get_batch(train, position, COURSE.seq_len)
            logits, _ = model(X)
            loss = loss_fn(logits, y)
            opt.reset_grad()
            loss.backward()
            opt.step()
            del logits, loss, X, y
            position = (position + COURSE.seq_len) % (train.shape[0] - COURSE.seq_len - 1)
            if step < 2:
                gc.collect()
                continue
            if step % 2 == 0:
                t0 = time.perf_counter()
                r = memory.collect("needle")
                scoped_ms.append(1e3 * (time.perf_counter() - t0))
                examined.append(r["objects"])
                freed.append(r["bytes"])
                left.append(gc.collect())  # what the scoped one left to the full one
            else:
                t0 = time.perf_counter()
                gc.collect()
                full_ms.append(1e3 * (time.perf_counter() - t0))
        tracked = len(gc.get_objects())
        info = _c._scoped_info()
    finally:
        gc.enable()
        ndl.autograd.set_graph_mode(previous_mode)
        del model, opt, junk, corpus, train
        gc.collect()
        memory.empty_cache()
    return {
        "extra_objects": extra,
        "tracked_objects": tracked,
        "needle_objects": info["registered"],
        "scoped_ms": statistics.median(scoped_ms),
        "scoped_max_ms": max(scoped_ms),
        "full_ms": statistics.median(full_ms),
        "scoped_freed_objects": statistics.median(examined),
        "scoped_freed_mib": statistics.median(freed) / 2**20,
        "left_to_full": max(left),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--words", type=int, default=200_000)
    parser.add_argument("--extra-objects", default="0,100000,1000000")
    parser.add_argument("--scoped-only", action="store_true", help="only the scoped table")
    args = parser.parse_args()
    print_machine()
    with tempfile.TemporaryDirectory() as tmp:
        corpus_dir = str(
            write_synthetic_corpus(os.path.join(tmp, "corpus"), num_words=args.words, seed=0)
        )
        rows = []
        if not args.scoped_only:
            rows = [
                measure(mode, keep, args.steps, corpus_dir)
                for keep in (True, False)
                for mode in ("needle", "cycle_free")
            ]
            rows.append(measure("needle", True, args.steps, corpus_dir, freeze=True))
        extras = [int(n) for n in args.extra_objects.split(",") if n]
        scoped_rows = [measure_scoped(n, args.steps, corpus_dir) for n in extras]
    for row in scoped_rows:
        print(json.dumps(row))
    for row in rows:
        print(json.dumps(row))
    print()
    print(
        f"{'graph mode':<12}{'heap':>12}{'objects':>9}{'step ms':>9}"
        f"{'gc after step ms':>18}{'gc warm ms':>12}{'share of a step':>17}"
    )
    for r in rows:
        print(
            f"{r['graph_mode']:<12}{r['heap']:>12}{r['tracked_objects']:>9}"
            f"{r['step_ms']:>9.1f}{r['gc_after_step_ms']:>18.2f}{r['gc_warm_ms']:>12.2f}"
            f"{100 * r['after_step_share']:>16.2f}%"
        )

    print()
    print(
        f"{'extra objects':>14}{'tracked':>10}{'needle objs':>12}{'scoped ms':>11}"
        f"{'(max)':>8}{'full ms':>9}{'freed objs':>11}{'freed MiB':>10}{'left to full':>13}"
    )
    for r in scoped_rows:
        print(
            f"{r['extra_objects']:>14}{r['tracked_objects']:>10}{r['needle_objects']:>12}"
            f"{r['scoped_ms']:>11.3f}{r['scoped_max_ms']:>8.3f}{r['full_ms']:>9.2f}"
            f"{r['scoped_freed_objects']:>11.0f}{r['scoped_freed_mib']:>10.1f}"
            f"{r['left_to_full']:>13}"
        )


if __name__ == "__main__":
    main()
