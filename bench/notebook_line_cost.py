"""What ``%load_ext needle`` costs a cell, and what ``ndl.memory.holders()`` costs, on a
kernel-sized heap.

    python bench/notebook_line_cost.py [--objects 150000] [--cells 2000] [--holders-runs 20]

Builds a heap of ``--objects`` live, collector-tracked Python objects (dicts, lists and class
instances, as a kernel's history, modules and data give one) and an IPython shell (in-process,
the terminal's display path) whose namespace has a few hundred names: numbers, strings, NumPy
arrays, 20 tensors, a model and its optimizer after one step, a displayed tensor in ``Out[n]``
and the last traceback with a tensor in a frame. Then times:

- the memory line: the two callbacks the extension registers (``pre_run_cell`` and
  ``post_run_cell``, called directly, their output sent to the shell's display publisher, which
  writes it to a buffer here), over ``--cells`` cells: cells that allocate (the line is shown)
  and cells that move nothing (no line). Target: at most 1 ms a cell.
- ``ndl.memory.holders()`` over ``--holders-runs`` runs: with the heap held outside the
  namespace (by the kernel's own machinery), and with the heap held by one of the names (the
  walk then visits it, up to its 200000-object cap). Target: at most 50 ms.

Prints the machine line, then one JSON line per figure (median, p99 and max in ms) and a table.
"""

import argparse
import gc
import io
import json
import statistics
import sys
import time
from contextlib import redirect_stdout

import numpy as np

import needle as ndl

from benchutil import cpu_model, print_machine


class Record:
    """A plain object with a __dict__, as the user's and the libraries' objects are."""

    def __init__(self, i):
        self.i = i


def build_heap(n):
    """A list of about ``n`` collector-tracked objects: half lists, half instances (a dict
    of ints alone is not tracked, so there are none)."""
    half = max(0, n // 2)
    return [[i] for i in range(half)] + [Record(i) for i in range(max(0, n - half))]


def make_shell():
    """An in-process IPython shell with the extension loaded, a displayed tensor in its output
    cache and a failed cell's traceback holding a tensor."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    with redirect_stdout(io.StringIO()):
        for cell in (
            "%load_ext needle",
            "import numpy as np, needle as ndl",
            "w = ndl.Tensor(np.ones((256, 256), np.float32), requires_grad=True)",
            "(w * 2).sum()",
            "def f(a):\n    big = a * 3\n    raise RuntimeError('kept by the traceback')",
            "f(w)",
        ):
            shell.run_cell(cell, store_history=True)
    return shell


def fill_namespace(ns, names):
    """A few hundred names, as a working notebook has."""
    rng = np.random.default_rng(0)
    for i in range(names):
        kind = i % 4
        if kind == 0:
            ns[f"n{i}"] = i
        elif kind == 1:
            ns[f"s{i}"] = f"value {i}"
        elif kind == 2:
            ns[f"a{i}"] = rng.standard_normal(64)
        else:
            ns[f"cfg{i}"] = {"lr": 0.1 * i, "layers": [i, i + 1]}
    for i in range(20):
        ns[f"t{i}"] = ndl.Tensor(rng.standard_normal((128, 128)).astype("float32"))
    model = ndl.nn.Sequential(
        ndl.nn.Linear(256, 512), ndl.nn.ReLU(), ndl.nn.Linear(512, 256), ndl.nn.ReLU()
    )
    opt = ndl.optim.Adam(model.parameters(), lr=1e-3)
    x = ndl.Tensor(rng.standard_normal((64, 256)).astype("float32"))
    loss = model(x).sum()
    loss.backward()
    opt.step()
    ns.update(model=model, opt=opt, x=x, loss=loss)


def summary(seconds):
    ms = sorted(1e3 * s for s in seconds)
    return {
        "over_1ms": sum(m > 1.0 for m in ms),
        "median_ms": round(statistics.median(ms), 4),
        "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 4),
        "max_ms": round(ms[-1], 4),
        "runs": len(ms),
    }


def time_line(line, cells, allocate):
    """Seconds of pre_run_cell + post_run_cell per cell; with ``allocate``, each cell makes a
    (256, 256) tensor it keeps until the next cell, so each shows its line."""
    times, kept = [], None
    sink = io.StringIO()
    with redirect_stdout(sink):
        for _ in range(cells):
            t0 = time.perf_counter()
            line.pre_run_cell(None)
            t1 = time.perf_counter()
            if allocate:  # the cell's own work, not timed
                kept = ndl.Tensor(np.ones((256, 256), np.float32))
            t2 = time.perf_counter()
            line.post_run_cell(None)
            t3 = time.perf_counter()
            times.append((t1 - t0) + (t3 - t2))
    del kept
    shown = sink.getvalue().count("needle: ")
    return times, shown


def time_holders(runs):
    times, rows = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        rows = ndl.memory.holders()
        times.append(time.perf_counter() - t0)
    return times, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=150_000)
    parser.add_argument("--names", type=int, default=300)
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--holders-runs", type=int, default=20)
    args = parser.parse_args()
    for name in ("objects", "names", "cells", "holders_runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    print_machine()
    from needle.notebook_extension import _LOADED

    shell = make_shell()
    fill_namespace(shell.user_ns, args.names)
    gc.collect()
    # The heap brings the process's tracked objects (IPython's and needle's included) to
    # about --objects; it is held here, outside the namespace.
    heap = build_heap(args.objects - len(gc.get_objects()))
    gc.collect()
    tracked = len(gc.get_objects())
    [extension] = _LOADED.values()
    line = extension.line

    figures = {}
    times, shown = time_line(line, args.cells, allocate=True)
    assert shown == args.cells, f"{shown} lines for {args.cells} cells that allocated"
    figures["line, cell that allocates"] = summary(times)
    times, shown = time_line(line, args.cells, allocate=False)
    assert shown == 0, f"{shown} lines for cells that moved nothing"
    figures["line, cell that moves nothing"] = summary(times)

    times, rows = time_holders(args.holders_runs)
    figures["holders(), heap outside the names"] = summary(times)
    kinds = sorted({r["kind"] for r in rows})
    assert kinds == ["name", "output_cache", "traceback"], kinds
    shell.user_ns["records"] = heap  # a name now reaches every object of the heap
    times, _ = time_holders(args.holders_runs)
    figures["holders(), heap held by a name"] = summary(times)

    context = {
        "tracked_objects": tracked,
        "names": len(shell.user_ns),
        "holder_rows": len(rows),
        "allocated_bytes": ndl.memory.memory_allocated(),
        "cpu": cpu_model(),
        "needle": ndl.__version__,
    }
    print(json.dumps({"context": context}), flush=True)
    for name, figure in figures.items():
        print(json.dumps({"figure": name, **figure}), flush=True)
    print(f"\n{tracked:,} tracked objects, {len(shell.user_ns)} names, {len(rows)} holders")
    print(f"{'':<36}{'median ms':>10}{'p99 ms':>10}{'max ms':>10}{'runs':>7}{'> 1 ms':>8}")
    for name, f in figures.items():
        print(
            f"{name:<36}{f['median_ms']:>10.3f}{f['p99_ms']:>10.3f}{f['max_ms']:>10.3f}"
            f"{f['runs']:>7}{f['over_1ms']:>8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
