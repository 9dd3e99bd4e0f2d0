"""Per-op latency of needle against PyTorch (CPU), same run.

Forward time and forward+backward time per op on tiny (1 and 64 elements)
and small (64x64) tensors, plus one training step of a 2-layer MLP. Prints
JSON lines, then a table. PyTorch is optional (pip install torch==2.13.0);
without it only needle's numbers are printed.

    python bench/op_overhead.py [--quick]
"""

import argparse
import json

import numpy as np

import needle as ndl

from benchutil import kernels_line, print_machine, timeit

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # the peer is optional
    torch = None


OPS = {
    "add": (2, lambda a, b: a + b),
    "mul": (2, lambda a, b: a * b),
    "matmul": (2, lambda a, b: a @ b),
    "exp": (
        1,
        lambda a: a.exp() if torch is not None and isinstance(a, torch.Tensor) else ndl.exp(a),
    ),
    "sum": (1, lambda a: a.sum()),
    "reshape": (
        1,
        lambda a: a.reshape((a.shape[0] * a.shape[1],)) if len(a.shape) == 2 else a.reshape((-1,)),
    ),
    "getitem": (1, lambda a: a[0]),
}

SHAPES = {"1 element": (1, 1), "64 elements": (8, 8), "64x64": (64, 64)}


def run_case(make, op_name, shape, backward):
    arity, fn = OPS[op_name]
    rng = np.random.default_rng(0)
    inputs = [make(rng.standard_normal(shape).astype(np.float32)) for _ in range(arity)]
    if backward:

        def step():
            out = fn(*inputs)
            out.sum().backward()
    else:

        def step():
            fn(*inputs)

    return timeit(step)


def mlp_step(lib):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    w1 = rng.standard_normal((128, 256)).astype(np.float32) * 0.05
    w2 = rng.standard_normal((256, 10)).astype(np.float32) * 0.05
    if lib == "needle":
        X = ndl.Tensor(x, requires_grad=False)
        W1, W2 = ndl.Tensor(w1), ndl.Tensor(w2)

        def step():
            loss = (ndl.relu(X @ W1) @ W2).sum()
            loss.backward()
            W1.data = W1.data - W1.grad.data * 0.01
            W2.data = W2.data - W2.grad.data * 0.01
    else:
        X = torch.tensor(x)
        W1 = torch.tensor(w1, requires_grad=True)
        W2 = torch.tensor(w2, requires_grad=True)

        def step():
            loss = (torch.relu(X @ W1) @ W2).sum()
            loss.backward()
            with torch.no_grad():
                W1.sub_(W1.grad * 0.01)
                W2.sub_(W2.grad * 0.01)
            W1.grad = None
            W2.grad = None

    return timeit(step)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.parse_args()
    machine = print_machine(
        numpy=np.__version__,
        torch=torch.__version__ if torch else None,
        torch_threads=torch.get_num_threads() if torch else None,
    )
    rows = []
    make_needle = lambda x: ndl.Tensor(x)  # noqa: E731
    make_torch = (lambda x: torch.tensor(x, requires_grad=True)) if torch else None
    for op_name in OPS:
        for shape_name, shape in SHAPES.items():
            for backward in (False, True):
                row = {
                    "op": op_name,
                    "size": shape_name,
                    "pass": "fwd+bwd" if backward else "fwd",
                    "needle_us": run_case(make_needle, op_name, shape, backward) * 1e6,
                }
                if torch:
                    row["torch_us"] = run_case(make_torch, op_name, shape, backward) * 1e6
                    row["ratio"] = row["needle_us"] / row["torch_us"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    row = {
        "op": "2-layer MLP step",
        "size": "64x128x256x10",
        "pass": "fwd+bwd+update",
        "needle_us": mlp_step("needle") * 1e6,
    }
    if torch:
        row["torch_us"] = mlp_step("torch") * 1e6
        row["ratio"] = row["needle_us"] / row["torch_us"]
    rows.append(row)
    print(json.dumps(row))
    print()
    print(f"machine: {machine['cpu']}, {machine['cpus']} cpus; {kernels_line()}")
    print(f"{'op':<18}{'size':<16}{'pass':<16}{'needle':>10}{'torch':>10}{'ratio':>8}")
    for r in rows:
        torch_us = f"{r['torch_us']:.1f}" if "torch_us" in r else "-"
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
        print(
            f"{r['op']:<18}{r['size']:<16}{r['pass']:<16}{r['needle_us']:>10.1f}{torch_us:>10}{ratio:>8}"
        )


if __name__ == "__main__":
    main()
