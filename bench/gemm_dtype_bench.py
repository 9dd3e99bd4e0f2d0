"""Matrix products in every dtype: needle against PyTorch on the same device, in one run.

For each dtype, an n x n x n product (float32, float16, bfloat16, float64): needle's median
time and GFLOP/s, PyTorch's, and needle's throughput as a fraction of PyTorch's (issue 22's
GPU target: bfloat16 at 4096 >= 0.8). Each call ends with the result on the device finished
(needle: the product's first element read; PyTorch: torch.cuda.synchronize()).

    python bench/gemm_dtype_bench.py [--n 1024] [--device cpu|cuda] [--dtypes float32,bfloat16]
"""

import argparse
import json

import numpy as np

import needle as ndl
from needle import backend_ndarray as nd

from benchutil import print_machine, timeit


def needle_seconds(n, dtype, device):
    rng = np.random.default_rng(0)
    a = nd.array(rng.standard_normal((n, n)), dtype=dtype, device=device)
    b = nd.array(rng.standard_normal((n, n)), dtype=dtype, device=device)

    def run():
        (a @ b)[0, 0].numpy()  # waits for the product

    return timeit(run, min_time=1.0)


def torch_seconds(n, dtype, device):
    try:
        import torch
    except ImportError:
        return None
    if device == "cuda" and not torch.cuda.is_available():
        return None
    tdtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=tdtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=tdtype)

    def run():
        (a @ b)[0, 0].item()

    try:
        return timeit(run, min_time=1.0)
    except RuntimeError as error:  # a dtype PyTorch's CPU build lacks
        print(json.dumps({"torch_error": str(error)[:200], "dtype": dtype}))
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16,float64")
    args = parser.parse_args()
    device = ndl.cpu() if args.device == "cpu" else ndl.cuda()
    print_machine(device=args.device)
    flops = 2.0 * args.n**3
    for dtype in args.dtypes.split(","):
        mine = needle_seconds(args.n, dtype, device)
        theirs = torch_seconds(args.n, dtype, args.device)
        row = {
            "n": args.n,
            "dtype": dtype,
            "needle_s": mine,
            "needle_gflops": round(flops / mine / 1e9, 1),
            "torch_s": theirs,
            "torch_gflops": round(flops / theirs / 1e9, 1) if theirs else None,
            "needle_over_torch_throughput": round(theirs / mine, 3) if theirs else None,
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
