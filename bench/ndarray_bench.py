"""NDArray against NumPy, same machine, same run.

Prints one JSON line per case, then a table. Each case times the needle op
and the matching NumPy op on the same data (float32) and reports the median
of several repeats of a timed loop.

    python bench/ndarray_bench.py [--quick]
"""

import argparse
import json

import numpy as np

import needle as ndl
from needle import backend_ndarray as nd

from benchutil import kernels_line, print_machine, timeit


def cases(quick):
    rng = np.random.default_rng(0)
    n = 1 << 20
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    xa, ya = nd.array(x), nd.array(y)
    yield "add 1M", lambda: xa + ya, lambda: x + y
    yield "mul 1M", lambda: xa * ya, lambda: x * y
    yield "add scalar 1M", lambda: xa + 1.5, lambda: x + np.float32(1.5)
    yield "exp 1M", lambda: xa.exp(), lambda: np.exp(x)
    yield "tanh 1M", lambda: xa.tanh(), lambda: np.tanh(x)
    yield "log 1M", lambda: xa.abs().log(), lambda: np.log(np.abs(x))
    m = x.reshape(1024, 1024)
    ma = nd.array(m)
    yield "sum axis=0 1024x1024", lambda: ma.sum(axis=0), lambda: m.sum(axis=0)
    yield "sum axis=1 1024x1024", lambda: ma.sum(axis=1), lambda: m.sum(axis=1)
    yield "sum all 1M", lambda: ma.sum(), lambda: m.sum()
    yield "max axis=1 1024x1024", lambda: ma.max(axis=1), lambda: m.max(axis=1)
    yield (
        "compact transpose 1024x1024",
        lambda: ma.permute((1, 0)).compact(),
        lambda: np.ascontiguousarray(m.T),
    )
    b = rng.standard_normal((1024, 1)).astype(np.float32)
    ba = nd.array(b)
    yield "broadcast add 1024x1024 + 1024x1", lambda: ma + ba, lambda: m + b
    one_a, one_b = nd.array([1.0]), nd.array([2.0])
    one_x, one_y = np.array([1.0], np.float32), np.array([2.0], np.float32)
    yield "add 1 element", lambda: one_a + one_b, lambda: one_x + one_y
    sizes = (64, 128, 256, 512) if quick else (64, 128, 256, 512, 1024)
    for s in sizes:
        p = rng.standard_normal((s, s)).astype(np.float32)
        q = rng.standard_normal((s, s)).astype(np.float32)
        pa, qa = nd.array(p), nd.array(q)
        yield f"matmul {s}^3", lambda pa=pa, qa=qa: pa @ qa, lambda p=p, q=q: p @ q
    p = rng.standard_normal((64, 128, 64)).astype(np.float32)
    q = rng.standard_normal((64, 64, 128)).astype(np.float32)
    pa, qa = nd.array(p), nd.array(q)
    yield "batched matmul 64x(128,64)@(64,128)", lambda: pa @ qa, lambda: p @ q
    pt = nd.array(p).permute((0, 2, 1))
    yield (
        "batched matmul, transposed lhs view",
        lambda: pt @ pt.permute((0, 2, 1)).compact(),
        lambda: np.matmul(p.transpose(0, 2, 1), np.ascontiguousarray(p)),
    )
    # attention heads of the course Transformer: (B*H, T, d) = (256*8, 20, 32)
    q = rng.standard_normal((2048, 20, 32)).astype(np.float32)
    k = rng.standard_normal((2048, 20, 32)).astype(np.float32)
    qa, ka = nd.array(q), nd.array(k)
    yield (
        "attention q @ k^T 2048x(20,32)@(32,20)",
        lambda: qa @ ka.permute((0, 2, 1)),
        lambda: q @ k.transpose(0, 2, 1),
    )
    probs = rng.standard_normal((2048, 20, 20)).astype(np.float32)
    pr = nd.array(probs)
    yield "attention p @ v 2048x(20,20)@(20,32)", lambda: pr @ ka, lambda: probs @ k


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer and smaller cases")
    args = parser.parse_args()
    machine = print_machine(numpy=np.__version__, blas=ndl._c._blas())
    rows = []
    for name, needle_fn, numpy_fn in cases(args.quick):
        t_needle = timeit(needle_fn, min_time=0.1 if args.quick else 0.3)
        t_numpy = timeit(numpy_fn, min_time=0.1 if args.quick else 0.3)
        row = {"case": name, "needle_s": t_needle, "numpy_s": t_numpy, "ratio": t_needle / t_numpy}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print(f"machine: {machine['cpu']}, {machine['cpus']} cpus; {kernels_line()}")
    print(f"{'case':<40}{'needle':>12}{'numpy':>12}{'needle/numpy':>14}")
    for row in rows:
        print(
            f"{row['case']:<40}{row['needle_s'] * 1e6:>10.1f}us{row['numpy_s'] * 1e6:>10.1f}us"
            f"{row['ratio']:>14.2f}"
        )


if __name__ == "__main__":
    main()
