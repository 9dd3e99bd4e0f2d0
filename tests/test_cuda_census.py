"""The census of GPU work (csrc/cuda/cuda_census.cu, ``ndl.cuda.work_counters``): each kind of
call counted where the backend makes it, the same on a GPU and on the simulator; the
backend's sources call the CUDA runtime for memory, copies and waits only through the
counted wrappers; batched matmuls whose batch strides do not collapse are one cuBLAS call."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import needs_cuda

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_DIR = os.path.join(ROOT, "csrc", "cuda")

# Runtime calls, and the driver's virtual memory calls, that must go through cuda_census.cu's
# counted wrappers.
UNCOUNTED = re.compile(
    r"\bcuda(Malloc|Free|Memcpy|MemcpyAsync|MemsetAsync|Memset|DeviceSynchronize|"
    r"StreamSynchronize|EventSynchronize)\s*\(|<<<|"
    r"\bcuMem(AddressReserve|AddressFree|Create|Release|Map|Unmap|SetAccess|"
    r"GetAllocationGranularity)\s*\("
)


def test_backend_calls_the_runtime_only_through_the_census():
    allowed = {"cuda_census.cu", "cuda_launch.cuh"}
    offenders = []
    for name in sorted(os.listdir(CUDA_DIR)):
        if not name.endswith((".cu", ".cuh")) or name in allowed:
            continue
        with open(os.path.join(CUDA_DIR, name)) as f:
            for number, line in enumerate(f, 1):
                code = line.split("//")[0]
                if code.lstrip().startswith(("*", "/*")):
                    continue  # comments name the calls they replace
                if UNCOUNTED.search(code):
                    offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "uncounted CUDA runtime calls:\n" + "\n".join(offenders)


def test_without_cuda_every_count_is_zero():
    if ndl.cuda.is_available():
        pytest.skip("a CUDA device is available")
    counts = ndl.cuda.work_counters()
    assert set(counts) == set(ndl.cuda.WORK_COUNTERS)
    assert all(v == 0 for v in counts.values())
    ndl.cuda.reset_work_counters()  # harmless


def test_work_counters_rejects_a_non_cuda_device():
    with pytest.raises(ValueError):
        ndl.cuda.work_counters("cpu")
    with pytest.raises(TypeError):
        ndl.cuda.work_counters(True)


def _delta(fn):
    """Runs fn and returns (its result, the census of what it asked of the GPU)."""
    ndl.cuda.reset_work_counters()
    result = fn()
    return result, ndl.cuda.work_counters(reset=True)


def _nonzero(counts):
    return {k: v for k, v in counts.items() if v}


def cuda(test):
    """Marks a test as CUDA-only (skipped without a GPU, run on the simulator in CI)."""
    for mark in needs_cuda:
        test = mark(test)
    return test


@pytest.fixture
def gpu():
    return ndl.cuda()


@cuda
def test_counts_of_single_operations(gpu):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    nd.array(x, device=gpu)  # the first may take a segment from the driver
    a, counts = _delta(lambda: nd.array(x, device=gpu))  # a small upload: staged, no wait
    assert _nonzero(counts) == {"h2d_copies": 1, "h2d_bytes": 48}
    _, counts = _delta(lambda: a + a)
    assert _nonzero(counts) == {"kernel_launches": 1}
    ndl.cuda.reset_work_counters()
    a * a, a * a, a.exp()  # noqa: B018
    sites = ndl.cuda.launches_by_kernel()
    assert sorted(sites.values()) == [1, 2], sites  # the binary kernel's site, the unary's
    assert all("cuda_ewise.cu:" in site for site in sites), sites
    _, counts = _delta(lambda: a.numpy())
    assert _nonzero(counts) == {"d2h_copies": 1, "d2h_bytes": 48, "host_syncs": 1}
    _, counts = _delta(lambda: a.sum(axis=1))
    assert counts["kernel_launches"] >= 1 and counts["host_syncs"] == 0


@cuda
def test_a_large_upload_is_one_synchronous_copy(gpu):
    x = np.ones((1 << 19) + 1, dtype=np.float32)  # just over the 1 MiB staging slot
    _, counts = _delta(lambda: nd.array(x, device=gpu))
    assert counts["h2d_copies"] == 1 and counts["h2d_bytes"] == x.nbytes
    assert counts["host_syncs"] == 1


@cuda
def test_staged_uploads_reuse_their_slots_without_waiting(gpu):
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    ndl.cuda.reset_work_counters()
    arrays = [nd.array(x + i, device=gpu) for i in range(10)]  # more uploads than slots
    counts = ndl.cuda.work_counters(reset=True)
    assert counts["h2d_copies"] == 10 and counts["host_syncs"] == 0
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(a.numpy(), x + i)


@cuda
def test_mallocs_are_counted_and_cached_blocks_are_not(gpu):
    ndl.cuda.empty_cache()
    _, counts = _delta(lambda: nd.empty((1 << 20,), device=gpu).shape)  # a new segment
    assert counts["device_mallocs"] == 1
    _, counts = _delta(lambda: nd.empty((1 << 20,), device=gpu).shape)  # from the cache
    assert counts["device_mallocs"] == 0
    released, counts = _delta(ndl.cuda.empty_cache)
    assert released > 0 and counts["device_frees"] >= 1
    assert counts["host_syncs"] == counts["device_frees"]  # cudaFree waits for the GPU


@cuda
def test_batched_matmul_over_heads_is_one_blas_call(gpu):
    """(batch, seq, heads, dim) permuted to (batch, heads, seq, dim): batch strides that do
    not collapse to one dim, as in the course's attention; one pointer-array GEMM."""
    if not ndl.cuda.gemm_backend().startswith("cublas ("):
        pytest.skip(f"no cuBLAS: {ndl.cuda.gemm_backend()}")
    rng = np.random.default_rng(0)
    b, s, h, d = 6, 5, 3, 4
    x = rng.standard_normal((b, s, h, d)).astype(np.float32)
    y = rng.standard_normal((b, s, h, d)).astype(np.float32)
    q = nd.array(x, device=gpu).permute((0, 2, 1, 3))
    k = nd.array(y, device=gpu).permute((0, 2, 3, 1))  # a transposed operand, read in place
    out, counts = _delta(lambda: q @ k)
    assert counts["blas_calls"] == 1 and counts["kernel_launches"] == 1
    assert counts["host_syncs"] == 0 and counts["d2d_copies"] == 0
    qx, ky = np.transpose(x, (0, 2, 1, 3)), np.transpose(y, (0, 2, 3, 1))
    np.testing.assert_allclose(out.numpy(), qx @ ky, rtol=1e-4, atol=1e-4)
    # A batch that collapses (contiguous) is one strided call and no pointer kernel.
    qc = nd.array(np.ascontiguousarray(qx), device=gpu)
    _, counts = _delta(lambda: qc @ qc.permute((0, 1, 3, 2)))
    assert counts["blas_calls"] == 1 and counts["kernel_launches"] == 0


@cuda
def test_batched_matmul_with_a_broadcast_batch_dim(gpu):
    """Batch strides (20, 0) and (0, 7): a broadcast dim beside a strided one."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 1, 4, 5)).astype(np.float32)
    b = rng.standard_normal((5, 3, 7)).astype(np.float32)
    gb = nd.array(b, device=gpu).permute((1, 0, 2))  # (3, 5, 7)
    got, counts = _delta(lambda: (nd.array(a, device=gpu) @ gb).numpy())
    want = a @ np.transpose(b, (1, 0, 2))
    assert got.shape == (2, 3, 4, 7)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if ndl.cuda.gemm_backend().startswith("cublas ("):
        assert counts["blas_calls"] == 1


@cuda
def test_census_script_runs_and_reports_every_key(gpu):
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "gpu_census.py"),
            "--small",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--configs",
            "transformer",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(proc.stdout.strip().splitlines()[0])
    for key in (
        "config",
        "kernel_launches_per_step",
        "blas_calls_per_step",
        "host_syncs_per_step",
        "device_mallocs_per_step",
        "h2d_bytes_per_step",
        "d2h_bytes_per_step",
    ):
        assert key in row, key
    assert row["config"] == "transformer"
    assert row["host_syncs_per_step"] >= 1  # reading the loss waits for the GPU
    assert row["d2h_bytes_per_step"] >= 4


@cuda
def test_batched_matmul_bench_runs_every_way(gpu):
    """bench/cuda_batched_matmul.py (gpu_validate.sh's bmm step) at tiny sizes: every way
    gives the product, and the default is the pointer-array kernel plus one BLAS call."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "cuda_batched_matmul.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert {r["way"] for r in rows} >= {"pointers", "compact", "kernel"}
    assert all(r["max_error"] < 1e-4 for r in rows if "max_error" in r)
    if ndl.cuda.gemm_backend().startswith("cublas ("):
        assert all(r["launches"] == 2 for r in rows if r["way"] == "pointers")
