"""What one full collection costs in the leak benchmark's process, against one training step.

    python bench/gc_cost.py [--steps 15] [--words 200000]

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

It prints JSON lines and a table: median milliseconds and the share of a median step.
"""

import argparse
import gc
import json
import os
import statistics
import tempfile
import time

import needle as ndl
from needle import memory
from needle.data import get_batch, write_synthetic_corpus
from needle.repro import course_setup

from benchutil import print_machine


def measure(mode, keep_corpus, steps, corpus_dir, freeze=False):
    corpus, train, model, opt, loss_fn = course_setup(corpus_dir, 256, 20, ndl.cpu())
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
            X, y = get_batch(train, position, 20)
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
            position = (position + 20) % (train.shape[0] - 21)
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--words", type=int, default=200_000)
    args = parser.parse_args()
    print_machine()
    with tempfile.TemporaryDirectory() as tmp:
        corpus_dir = str(
            write_synthetic_corpus(os.path.join(tmp, "corpus"), num_words=args.words, seed=0)
        )
        rows = [
            measure(mode, keep, args.steps, corpus_dir)
            for keep in (True, False)
            for mode in ("needle", "cycle_free")
        ]
        rows.append(measure("needle", True, args.steps, corpus_dir, freeze=True))
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


if __name__ == "__main__":
    main()
