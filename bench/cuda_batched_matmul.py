"""Batched matmuls whose batch strides do not collapse: needle's ways against PyTorch, same GPU.

The course's attention multiplies (batch, heads) views of a (batch, seq, heads, dim) array:
batch strides that no single cuBLAS stride can describe. needle runs them as one
``cublasSgemmBatched`` whose pointer arrays a kernel writes (``pointers``, the default); the
other ways are a compaction of both operands and then one strided call (``compact``: what
PyTorch's matmul does with such views), or needle's own SGEMM kernel (``kernel``, the
``NEEDLE_CUBLAS=0`` build path, timed in a child process). Issue 20 asks that the choice be
measured; this prints the time per product of each, with PyTorch's ``torch.matmul`` on the same
views when PyTorch has CUDA. Shapes: the transformer's scores ``q @ k^T`` and ``probs @ v``
(batch 256, 8 heads, seq 20, head dim 32) and a larger attention (batch 64, 16 heads, seq 128,
dim 64). Each case queues ``repeat`` products and waits once (``ndl.cuda.synchronize``); the
median of a few rounds is reported. One JSON line per case and way, then a table.

    python bench/cuda_batched_matmul.py [--quick] [--ways pointers,compact,kernel]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import needle as ndl
from needle import backend_ndarray as nd

# (name, batch, heads, seq, dim, which product)
CASES = [
    ("scores 256x8x20x32", 256, 8, 20, 32, "scores"),
    ("probs@v 256x8x20x32", 256, 8, 20, 32, "values"),
    ("scores 64x16x128x64", 64, 16, 128, 64, "scores"),
    ("probs@v 64x16x128x64", 64, 16, 128, 64, "values"),
]
QUICK = [("scores 4x2x5x8", 4, 2, 5, 8, "scores"), ("probs@v 4x2x5x8", 4, 2, 5, 8, "values")]


def operands(which, batch, heads, seq, dim):
    """The two arrays the attention multiplies, as stored, and the axes that make the
    (batch, heads, ., .) views of them: q (B,H,L,D) @ k^T (B,H,D,L) from (B,L,H,D) arrays, or
    probs (B,H,L,L) @ v (B,H,L,D) with v from a (B,L,H,D) array."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, seq, heads, dim)).astype(np.float32)
    if which == "scores":
        y = rng.standard_normal((batch, seq, heads, dim)).astype(np.float32)
        return (x, (0, 2, 1, 3)), (y, (0, 2, 3, 1))
    p = rng.standard_normal((batch, heads, seq, seq)).astype(np.float32)
    return (p, (0, 1, 2, 3)), (x, (0, 2, 1, 3))


def timed(fn, repeat, rounds):
    fn()
    ndl.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        ndl.cuda.synchronize()
        times.append((time.perf_counter() - start) / repeat)
    return statistics.median(times)


def torch_time(stored, repeat, rounds):
    """torch.matmul on views with the same strides as needle's; None without CUDA PyTorch."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    (xa, pa), (xb, pb) = stored
    a = torch.from_numpy(xa).cuda().permute(pa)
    b = torch.from_numpy(xb).cuda().permute(pb)
    fn = lambda: torch.matmul(a, b)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / repeat)
    return statistics.median(times)


def measure(ways, cases, repeat, rounds):
    device = ndl.cuda()
    rows = []
    for name, batch, heads, seq, dim, which in cases:
        stored = operands(which, batch, heads, seq, dim)
        (xa, pa), (xb, pb) = stored
        a = nd.array(xa, device=device).permute(pa)
        b = nd.array(xb, device=device).permute(pb)
        want = np.transpose(xa, pa).astype(np.float64) @ np.transpose(xb, pb).astype(np.float64)
        for way in ways:
            fn = (lambda: a @ b) if way != "compact" else (lambda: a.compact() @ b.compact())
            ndl.cuda.reset_work_counters()
            got = fn().numpy()
            work = ndl.cuda.work_counters(reset=True)
            seconds = timed(fn, repeat, rounds)
            rows.append(
                dict(
                    case=name,
                    way=way,
                    gemm=ndl.cuda.gemm_backend(),
                    us=seconds * 1e6,
                    launches=work["kernel_launches"] + work["d2d_copies"] + work["blas_calls"],
                    max_error=float(np.abs(got - want).max()),
                )
            )
        if "pointers" in ways:
            t = torch_time(stored, repeat, rounds)
            if t is not None:
                rows.append(dict(case=name, way="torch", us=t * 1e6))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (the simulator)")
    parser.add_argument("--ways", default="pointers,compact,kernel")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ways = [w for w in args.ways.split(",") if w]
    bad = [w for w in ways if w not in ("pointers", "compact", "kernel")]
    if bad:
        parser.error(f"unknown ways {bad}; choose from pointers, compact, kernel")
    if not ndl.cuda.is_available():
        raise SystemExit(f"cuda_batched_matmul: CUDA unavailable: {ndl.cuda.unavailable_reason()}")
    cases, repeat, rounds = (QUICK, 2, 2) if args.quick else (CASES, 50, 5)
    rows = measure([w for w in ways if w != "kernel"] or ["pointers"], cases, repeat, rounds)
    if args.child:  # NEEDLE_CUBLAS=0: needle's own kernel for the same products
        rows = [dict(r, way="kernel") for r in rows if r["way"] == "pointers"]
    elif "kernel" in ways:
        env = dict(os.environ, NEEDLE_CUBLAS="0")
        child = [sys.executable, os.path.abspath(__file__), "--child", "--ways", "pointers"]
        proc = subprocess.run(
            child + (["--quick"] if args.quick else []), env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SystemExit(f"cuda_batched_matmul: the kernel run failed:\n{proc.stderr[-2000:]}")
        rows += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        print(json.dumps(r), flush=True)
    if args.child:
        return 0
    print(f"\nbatched matmuls ({ndl.cuda.get_device_name()}): us per product")
    print(f"{'case':<24} " + " ".join(f"{w:>9}" for w in ways + ["torch"]))
    for name, *_ in cases:
        by_way = {r["way"]: r["us"] for r in rows if r["case"] == name}
        cells = [f"{by_way[w]:>9.1f}" if w in by_way else f"{'-':>9}" for w in ways + ["torch"]]
        print(f"{name:<24} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
