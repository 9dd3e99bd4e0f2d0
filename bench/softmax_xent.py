"""Softmax cross-entropy, forward and forward+backward, needle against PyTorch (CPU), same run.

The loss of the PTB language model: logits (rows, classes) = (5120, 10000) by default, labels
(rows,). needle runs ``ndl.softmax_cross_entropy`` (and ``.backward()``), PyTorch
``torch.nn.functional.cross_entropy`` with as many threads as needle's CPU kernels use
(``torch.set_num_threads``). Times are medians of --repeats calls after a warm-up.

Memory traffic is compared with the two-pass lower bound of the fused loss: the forward reads
the logits once, the backward reads them once more and writes the gradient once, so
3 * rows * classes * 4 bytes for forward+backward. "GB/s" is that bound over the measured time
(the same byte count for both frameworks, so it compares them as bandwidth); "cpu ms" is the
process's CPU time per forward+backward (all threads), steadier on a shared machine. needle's own
figures: "alloc MiB" is what its allocator handed out during one forward+backward (every
temporary written, the gradient included), "peak MiB" the growth of its peak allocated bytes
over the bytes live before the loss.

    python bench/softmax_xent.py [--rows 5120] [--classes 10000] [--repeats 7] [--sweep]
"""

import argparse
import json
import statistics
import time

import numpy as np

import needle as ndl
import needle_c

from benchutil import print_machine

try:
    import torch
except ImportError:  # the peer is optional
    torch = None


def needle_threads():
    """Threads needle's CPU row kernels use (1 in builds that have no threaded kernels)."""
    getter = getattr(needle_c, "_num_threads", None)
    return getter() if getter is not None else 1


def median_seconds(fn, repeats):
    """(wall, cpu): medians over `repeats` calls after one warm-up; cpu is the process's CPU
    time (all its threads), steadier than wall time on a shared machine."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def run_needle(z0, y0, repeats):
    z = ndl.Tensor(z0, requires_grad=True)
    y = ndl.Tensor(y0, requires_grad=False)

    def forward():
        ndl.softmax_cross_entropy(z, y).numpy()

    def step():
        z.grad = None
        loss = ndl.softmax_cross_entropy(z, y)
        loss.backward()
        z.grad.numpy()

    fwd, _ = median_seconds(forward, repeats)
    both, both_cpu = median_seconds(step, repeats)
    z.grad = None
    stats = ndl.memory.memory_stats()
    before_alloc = stats["allocated_bytes.all.allocated"]
    live = ndl.memory.memory_allocated()
    ndl.memory.reset_peak_memory_stats()
    step()
    stats = ndl.memory.memory_stats()
    alloc = stats["allocated_bytes.all.allocated"] - before_alloc
    peak = ndl.memory.max_memory_allocated() - live
    loss = float(ndl.softmax_cross_entropy(z, y).numpy()[0])
    return fwd, both, both_cpu, alloc, peak, loss, z.grad.numpy()


def run_torch(z0, y0, repeats):
    z = torch.from_numpy(z0).requires_grad_(True)
    y = torch.from_numpy(y0.astype(np.int64))
    f = torch.nn.functional.cross_entropy

    def forward():
        with torch.no_grad():
            f(z, y).item()

    def step():
        z.grad = None
        f(z, y).backward()

    fwd, _ = median_seconds(forward, repeats)
    both, both_cpu = median_seconds(step, repeats)
    step()
    return fwd, both, both_cpu, float(f(z, y).item()), z.grad.numpy()


# --sweep: narrow rows go through the row kernels' across-rows path (MNIST logits have 10
# classes, attention rows 20), wider ones along the row.
SWEEP = [(100000, 10), (163840, 20), (20000, 100), (2000, 1000), (5120, 10000)]


def sweep(repeats):
    """One line per shape: forward+backward CPU ms of needle and PyTorch, and the ratio."""
    rng = np.random.default_rng(0)
    print(f"\n{'shape':>14} {'needle cpu ms':>14} {'torch cpu ms':>13} {'ratio':>7}")
    for n, c in SWEEP:
        z0 = rng.standard_normal((n, c)).astype(np.float32) * 3
        y0 = rng.integers(0, c, size=n).astype(np.float32)
        both_cpu = run_needle(z0, y0, repeats)[2]
        t_cpu = run_torch(z0, y0, repeats)[2] if torch is not None else None
        row = {"sweep": [n, c], "needle_cpu_ms": both_cpu * 1e3}
        if t_cpu is not None:
            row.update(torch_cpu_ms=t_cpu * 1e3, ratio=both_cpu / t_cpu)
        print(json.dumps(row), flush=True)
        ratio = f"{row['ratio']:.2f}x" if t_cpu is not None else "-"
        torch_ms = f"{t_cpu * 1e3:.2f}" if t_cpu is not None else "-"
        print(f"{f'({n}, {c})':>14} {both_cpu * 1e3:>14.2f} {torch_ms:>13} {ratio:>7}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5120)
    parser.add_argument("--classes", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sweep", action="store_true", help="also time the shapes in SWEEP")
    args = parser.parse_args()
    threads = needle_threads()
    if torch is not None:
        torch.set_num_threads(threads)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print_machine(
        needle_threads=threads,
        torch=torch.__version__ if torch is not None else None,
        torch_threads=torch.get_num_threads() if torch is not None else None,
        loadavg=" ".join(load),
    )
    rng = np.random.default_rng(0)
    n, c = args.rows, args.classes
    z0 = rng.standard_normal((n, c)).astype(np.float32) * 3
    y0 = rng.integers(0, c, size=n).astype(np.float32)
    bound = 3 * n * c * 4

    rows = []
    fwd, both, both_cpu, alloc, peak, loss, grad = run_needle(z0, y0, args.repeats)
    rows.append(
        dict(
            framework="needle",
            threads=threads,
            forward_ms=fwd * 1e3,
            fwd_bwd_ms=both * 1e3,
            fwd_bwd_cpu_ms=both_cpu * 1e3,
            bound_gb_s=bound / both / 1e9,
            alloc_mib=alloc / 2**20,
            peak_mib=peak / 2**20,
            loss=loss,
        )
    )
    if torch is not None:
        t_fwd, t_both, t_both_cpu, t_loss, t_grad = run_torch(z0, y0, args.repeats)
        rows.append(
            dict(
                framework="torch",
                threads=torch.get_num_threads(),
                forward_ms=t_fwd * 1e3,
                fwd_bwd_ms=t_both * 1e3,
                fwd_bwd_cpu_ms=t_both_cpu * 1e3,
                bound_gb_s=bound / t_both / 1e9,
                loss=t_loss,
            )
        )
        rows[0]["vs_torch_fwd"] = fwd / t_fwd
        rows[0]["vs_torch_fwd_bwd"] = both / t_both
        rows[0]["vs_torch_fwd_bwd_cpu"] = both_cpu / t_both_cpu
        rows[0]["max_grad_diff"] = float(np.max(np.abs(grad - t_grad)))
    for r in rows:
        print(json.dumps({"rows": n, "classes": c, "bound_bytes": bound, **r}), flush=True)

    print(f"\nsoftmax cross-entropy ({n}, {c}); two-pass bound {bound / 1e6:.0f} MB")
    print(
        f"{'framework':10} {'threads':>7} {'fwd ms':>8} {'fwd+bwd ms':>11} {'cpu ms':>8} "
        f"{'GB/s (bound)':>13} {'alloc MiB':>10} {'peak MiB':>9} {'vs torch':>9} {'cpu vs':>7}"
    )
    for r in rows:
        alloc = f"{r['alloc_mib']:.1f}" if "alloc_mib" in r else "-"
        peak = f"{r['peak_mib']:.1f}" if "peak_mib" in r else "-"
        ratio = f"{r['vs_torch_fwd_bwd']:.2f}x" if "vs_torch_fwd_bwd" in r else "-"
        cpu_ratio = f"{r['vs_torch_fwd_bwd_cpu']:.2f}x" if "vs_torch_fwd_bwd_cpu" in r else "-"
        print(
            f"{r['framework']:10} {r['threads']:>7} {r['forward_ms']:>8.1f} "
            f"{r['fwd_bwd_ms']:>11.1f} {r['fwd_bwd_cpu_ms']:>8.1f} {r['bound_gb_s']:>13.2f} "
            f"{alloc:>10} {peak:>9} {ratio:>9} {cpu_ratio:>7}"
        )
    if len(rows) > 1:
        print(
            f"forward {rows[0]['vs_torch_fwd']:.2f}x torch; loss {rows[0]['loss']:.6f} vs "
            f"{rows[1]['loss']:.6f}; max |grad diff| {rows[0]['max_grad_diff']:.2e}"
        )
    if args.sweep:
        sweep(args.repeats)


if __name__ == "__main__":
    main()
