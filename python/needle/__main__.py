"""``python -m needle``: a short demonstration of what works today.

Runs real work on the CPU device and prints what it sees: arrays checked
against NumPy, exact memory accounting, an emulated device limit that raises
``OutOfMemoryError`` and leaves the process usable, and the allocator's
out-of-memory path collecting a reference cycle that holds device memory.
"""

import gc
import time

import numpy as np

import needle as ndl
from needle import backend_ndarray as nd
from needle import memory


def _mib(n):
    return f"{n / 2**20:.2f} MiB"


def main():
    print(
        f"needle {ndl.__version__}: devices {ndl.all_devices()}, "
        f"cuda enabled: {ndl.cuda().enabled()}"
    )
    print(f"CPU matmul uses: {ndl._c._blas()}")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 256)).astype(np.float32)
    w = rng.standard_normal((256, 128)).astype(np.float32)
    a, b = nd.array(x), nd.array(w)
    start = time.perf_counter()
    out = (a @ b).maximum(0.0).sum(axis=1)
    elapsed = time.perf_counter() - start
    expected = np.maximum(x @ w, 0).sum(axis=1)
    err = np.max(np.abs(out.numpy() - expected) / (np.abs(expected) + 1))
    print(
        f"relu(x @ w).sum(axis=1) on (512,256)@(256,128): {elapsed * 1e3:.2f} ms, "
        f"max relative error vs NumPy {err:.1e}"
    )

    base = memory.memory_allocated()
    big = nd.empty((1024, 1024))
    views = [big.permute((1, 0)), big[::2, 10:20], big.reshape((-1,)), big.flip(0)]
    print(
        f"a (1024, 1024) array: {memory.memory_allocated() - base} bytes allocated "
        f"(4 views of it add nothing: {len(views)} views)"
    )
    del big, views
    print(f"after del: {memory.memory_allocated() - base} bytes above the baseline")

    memory.set_memory_limit("cpu", base + 8 * 2**20)
    try:
        keep = nd.empty((1024, 1024))  # 4 MiB, fits under the 8 MiB emulated device
        try:
            nd.empty((2048, 1024))  # 8 MiB more: does not
        except ndl.OutOfMemoryError as err:
            print(f"OutOfMemoryError as expected: {err}")
        del keep

        # A reference cycle holding 6 MiB, with the collector switched off: only a
        # collection can free it. The allocator's out-of-memory path runs one.
        gc.disable()
        cycle = {"array": nd.empty((1536, 1024))}
        cycle["self"] = cycle
        del cycle
        print(
            f"cyclic garbage holds {_mib(memory.memory_allocated() - base)}; "
            f"allocating 4 MiB under the 8 MiB limit..."
        )
        collections = memory.memory_stats()["num_collect_calls"]
        fresh = nd.full((1024, 1024), 1.0)
        stats = memory.memory_stats()
        print(
            f"  succeeded after {stats['num_collect_calls'] - collections} collection(s); "
            f"now {_mib(memory.memory_allocated() - base)} allocated, "
            f"sum = {float(fresh.sum().numpy()[0]):.0f}"
        )
        del fresh
    finally:
        gc.enable()
        memory.set_memory_limit("cpu", None)
    print(memory.memory_summary())


if __name__ == "__main__":
    main()
