"""CUDA reductions: needle against PyTorch on the same GPU, same run.

Sums and maxima over the outer axis (a column reduction of a row-major matrix: needle's
columns kernel), the inner axis (rows: the rows kernel) and all axes of float32 matrices,
among them the shapes of the PTB transformer's training step (batch 256 x seq 20 = 5120 rows:
layer norm over 20 features, the bias gradients of a 20-wide layer and of the 10k-word
output layer), plus the largest relative error of needle's sum against a float64 sum. Each
case queues `repeat` reductions (more for small arrays, so that the final wait does not
dominate) and waits for the last (needle waits by copying the small result to the host;
PyTorch by synchronising), and reports the median over a few rounds as time per reduction
and effective bandwidth (bytes read / time). Prints one JSON line per case, then a table.

    python bench/cuda_reduce_bench.py [--quick]
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

import needle as ndl
from needle import backend_ndarray as nd

CASES = [
    # (rows, cols, axis); axis None: every element to one value
    (8192, 8192, 0),
    (8192, 8192, 1),
    (8192, 8192, None),
    (100_000, 2048, 0),
    (1_000_000, 64, 0),
    (64, 1_000_000, 1),
    (2048, 2048, 0),
    (5120, 20, 1),  # the transformer's layer norm: rows of 20 features
    (5120, 20, 0),  # the bias gradient of a 20-wide layer
    (5120, 10000, 0),  # the bias gradient of the 10k-word output layer
]


def _time(run, wait, repeat, rounds):
    run()
    wait()  # warm-up (allocations, first launches)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            out = run()
        wait(out)
        times.append((time.perf_counter() - start) / repeat)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two cases, fewer rounds")
    args = parser.parse_args()
    if not ndl.cuda.is_available():
        sys.exit(f"cuda_reduce_bench: CUDA is unavailable: {ndl.cuda.unavailable_reason()}")
    try:
        import torch

        has_torch = torch.cuda.is_available()
    except ImportError:
        torch, has_torch = None, False
    cases = CASES[:2] if args.quick else CASES
    rounds = 3 if args.quick else 5
    rng = np.random.default_rng(0)
    rows_out = []
    for rows, cols, axis in cases:
        x = (100.0 + rng.random((rows, cols))).astype(np.float32)
        a = nd.array(x, device=ndl.cuda())
        nbytes = x.nbytes
        repeat = 5 if args.quick else int(min(500, max(20, 4e8 // nbytes)))
        row = {"shape": [rows, cols], "axis": axis, "repeat": repeat}
        for op in ("sum", "max"):

            def run_needle(op=op, a=a):
                return getattr(a, op)(axis=axis)

            def wait_needle(out=None):
                if out is not None:
                    out.numpy()

            t = _time(run_needle, wait_needle, repeat, rounds)
            row[f"needle_{op}_ms"] = t * 1e3
            row[f"needle_{op}_gbps"] = nbytes / t / 1e9
            if has_torch:
                tx = torch.from_numpy(x).cuda()

                def run_torch(op=op, tx=tx):
                    if axis is None:
                        return tx.sum() if op == "sum" else tx.amax()
                    return tx.sum(dim=axis) if op == "sum" else tx.amax(dim=axis)

                def wait_torch(out=None):
                    torch.cuda.synchronize()

                t = _time(run_torch, wait_torch, repeat, rounds)
                row[f"torch_{op}_ms"] = t * 1e3
                row[f"torch_{op}_gbps"] = nbytes / t / 1e9
        got = a.sum(axis=axis).numpy()
        want = x.astype(np.float64).sum(axis=axis)
        row["sum_max_rel_error"] = float(np.max(np.abs(got - want) / np.abs(want)))
        rows_out.append(row)
        print(json.dumps(row), flush=True)
        del a
    print()
    print(
        f"GPU reductions, needle {ndl.__version__}"
        + (f", PyTorch {torch.__version__}" if has_torch else ", PyTorch absent")
    )
    header = f"{'shape':>16}{'axis':>5}{'op':>5}{'needle ms':>11}{'GB/s':>8}{'torch ms':>10}"
    header += f"{'GB/s':>8}{'ratio':>7}{'sum rel err':>13}"
    print(header)
    for r in rows_out:
        for op in ("sum", "max"):
            t_ms = r.get(f"torch_{op}_ms")
            ratio = f"{r[f'needle_{op}_ms'] / t_ms:.2f}" if t_ms else "-"
            print(
                f"{'x'.join(map(str, r['shape'])):>16}{str(r['axis']):>5}{op:>5}"
                f"{r[f'needle_{op}_ms']:>11.3f}{r[f'needle_{op}_gbps']:>8.0f}"
                + (f"{t_ms:>10.3f}{r[f'torch_{op}_gbps']:>8.0f}" if t_ms else f"{'-':>10}{'-':>8}")
                + f"{ratio:>7}{r['sum_max_rel_error'] if op == 'sum' else 0:>13.1e}"
            )


if __name__ == "__main__":
    main()
