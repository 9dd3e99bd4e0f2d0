"""The scoped and the full collection inside a Jupyter kernel, where the heap is ~4x a script's.

    python bench/notebook_gc.py [--steps 6] [--words 200000]

Runs, through nbclient in a fresh python3 kernel (IPython's own objects tracked beside needle's),
the course's PTB Transformer loop in needle graph mode (batch 256, seq_len 20, synthetic corpus)
and times, right after each step, either `needle.memory.collect("needle")` or `gc.collect()`
(alternating; each finds the previous step's graph as garbage), as bench/gc_cost.py does in a
script. Then trains the same number of steps in each of four modes, one after another in the
same kernel, each from the same state (the previous mode's graph dropped), under an emulated
limit of 2.5x a step's peak: ``cycle_free`` (the default graph,
the hook on: the peak to compare with), ``hook`` (needle graph mode, the hook's ladder:
scoped, then full when needed), ``hook_full`` (the hook with full collections only) and
``manual`` (the hook off, the course's ``gc.collect()`` after every batch) and ``floor`` (a
``gc.collect()`` right after each ``reset_grad()``: the least peak any collector can give the
course's graph mode). Reports each mode's
ladder counters, collector share and peak. Prints JSON lines and a table.
"""

import argparse
import json
import os
import sys
import tempfile

import nbclient
import nbformat

from benchutil import print_machine

SETUP = """
import gc, json, statistics, time
import needle as ndl
import needle_c as _c
from needle import memory
from needle.data import get_batch, write_synthetic_corpus
from needle.apps.course_config import COURSE
from needle.repro import course_setup
corpus_dir = str(write_synthetic_corpus({tmp!r}, num_words={words}, seed=0))
corpus, train, model, opt, loss_fn = course_setup(
    corpus_dir, COURSE.batch_size, COURSE.seq_len, ndl.cpu()
)
ndl.autograd.set_graph_mode("needle")
position = 0

def step(collect_at_reset=False):
    global position
    X, y = get_batch(train, position, COURSE.seq_len)
    logits, _ = model(X)
    loss = loss_fn(logits, y)
    opt.reset_grad()
    collect_seconds = 0.0
    if collect_at_reset:  # the "floor" mode: the previous graph is garbage from here on
        t0 = time.perf_counter()
        gc.collect()
        collect_seconds = time.perf_counter() - t0
    loss.backward()
    opt.step()
    position = (position + COURSE.seq_len) % (train.shape[0] - COURSE.seq_len - 1)
    return collect_seconds
"""

MEASURE = """
gc.collect()
gc.disable()
scoped_ms, full_ms, left = [], [], []
for i in range(2 * {steps} + 2):
    step()
    if i < 2:
        gc.collect()
        continue
    t0 = time.perf_counter()
    if i % 2 == 0:
        memory.collect("needle")
        scoped_ms.append(1e3 * (time.perf_counter() - t0))
        left.append(gc.collect())
    else:
        gc.collect()
        full_ms.append(1e3 * (time.perf_counter() - t0))
tracked = len(gc.get_objects())
gc.enable()
print(json.dumps({{"part": "collections", "tracked_objects": tracked,
    "needle_objects": _c._scoped_info()["registered"],
    "scoped_ms": statistics.median(scoped_ms), "scoped_max_ms": max(scoped_ms),
    "full_ms": statistics.median(full_ms), "left_to_full": max(left)}}))
"""

HOOK = """
def run_mode(mode, steps, limit):
    # The last mode's graph stays reachable from the gradients and from each attention
    # layer's last attention map (the course keeps it in `probs`): drop both, so that no
    # mode's peak includes it.
    opt.reset_grad()
    for m in model._children():
        if hasattr(m, "probs"):
            m.probs = None
    gc.collect()
    ndl.autograd.set_graph_mode("cycle_free" if mode == "cycle_free" else "needle")
    memory.set_gc_policy(enabled=mode not in ("manual", "floor"))
    _c._set_scoped_enabled(mode != "hook_full")
    memory.set_memory_limit("cpu", limit)
    _c._reset_pressure_stats(memory._engine_id("cpu"))  # each mode starts as a fresh process
    memory.reset_peak_memory_stats("cpu")
    start = memory.memory_stats("cpu")
    manual_seconds = 0.0
    t0 = time.perf_counter()
    try:
        for i in range(steps):
            manual_seconds += step(collect_at_reset=mode == "floor")
            if mode == "manual":  # the course's workaround, after every batch
                t_gc = time.perf_counter()
                gc.collect()
                manual_seconds += time.perf_counter() - t_gc
    finally:
        elapsed = time.perf_counter() - t0
        memory.set_gc_policy(enabled=True)
        _c._set_scoped_enabled(True)
        memory.set_memory_limit("cpu", None)
    s = memory.memory_stats("cpu")
    d = {{k: s[k] - start[k] for k in ("num_collect_calls", "num_scoped_collections",
        "num_full_collections", "num_full_fallbacks", "num_fallbacks_skipped", "gc_seconds",
        "scoped_gc_seconds")}}
    if mode in ("manual", "floor"):
        d["gc_seconds"] = manual_seconds
    d.update(part="mode", mode=mode, steps=steps, seconds=elapsed,
        gc_share=d["gc_seconds"] / elapsed, peak_mib=s["allocated_bytes.all.peak"] / 2**20)
    return d

gc.collect()
memory.reset_peak_memory_stats("cpu")
step()
limit = int(2.5 * memory.max_memory_allocated("cpu"))
for mode in ("cycle_free", "hook", "hook_full", "manual", "floor"):
    print(json.dumps(run_mode(mode, {steps}, limit)))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--words", type=int, default=200_000)
    args = parser.parse_args()
    print_machine()
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, "..", "python"), here, os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    with tempfile.TemporaryDirectory() as tmp:
        nb = nbformat.v4.new_notebook()
        nb.cells = [
            nbformat.v4.new_code_cell(
                SETUP.format(tmp=os.path.join(tmp, "corpus"), words=args.words)
            ),
            nbformat.v4.new_code_cell(MEASURE.format(steps=args.steps)),
            nbformat.v4.new_code_cell(HOOK.format(steps=args.steps)),
        ]
        client = nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3")
        client.execute()
    rows = []
    for cell in nb.cells:
        for out in cell.outputs:
            if out.get("output_type") == "stream":
                for line in out["text"].splitlines():
                    if line.startswith("{"):
                        rows.append(json.loads(line))
            elif out.get("output_type") == "error":
                print("\n".join(out["traceback"]), file=sys.stderr)
                sys.exit(1)
    for row in rows:
        print(json.dumps(row))
    c = next(r for r in rows if r["part"] == "collections")
    modes = {r["mode"]: r for r in rows if r["part"] == "mode"}
    print()
    print(f"tracked objects in the kernel: {c['tracked_objects']}; needle: {c['needle_objects']}")
    print(
        f"after a step: scoped {c['scoped_ms']:.3f} ms (max {c['scoped_max_ms']:.3f}), "
        f"full {c['full_ms']:.2f} ms; left to the full one: {c['left_to_full']}"
    )
    cf_peak, floor_peak = modes["cycle_free"]["peak_mib"], modes["floor"]["peak_mib"]
    print(
        f"{'mode':<11}{'steps':>6}{'s/step':>8}{'collections':>13}{'scoped':>8}{'full':>6}"
        f"{'fallbacks':>11}{'backed off':>12}{'gc s':>8}{'gc share':>10}{'peak MiB':>10}"
        f"{'peak/cf':>9}{'peak/floor':>12}"
    )
    for name, m in modes.items():
        print(
            f"{name:<11}{m['steps']:>6}{m['seconds'] / m['steps']:>8.3f}"
            f"{m['num_collect_calls']:>13}{m['num_scoped_collections']:>8}"
            f"{m['num_full_collections']:>6}{m['num_full_fallbacks']:>11}"
            f"{m['num_fallbacks_skipped']:>12}{m['gc_seconds']:>8.3f}"
            f"{100 * m['gc_share']:>9.2f}%{m['peak_mib']:>10.1f}{m['peak_mib'] / cf_peak:>9.2f}"
            f"{m['peak_mib'] / floor_peak:>12.2f}"
        )


if __name__ == "__main__":
    main()
