"""needle.cuda's memory functions and the caching allocator behind them. Without a GPU every
function answers 0 / {} / False / (0, 0) and other devices are refused (these run everywhere);
with one, the statistics are exact bytes, cached segments stay reserved until empty_cache, a
limit raises OutOfMemoryError (a MemoryError) after the allocator gives its cache back and
retries, the driver's free bytes move with what needle reserves, garbage collection frees
device memory, the simulator's NEEDLE_SIM_MEMORY is a capacity cudaMalloc itself enforces, and
``python -m needle.repro`` runs its modes on the GPU.
"""

import gc

import numpy as np
import pytest

import needle as ndl
import needle.cuda as cm
import needle.memory as mem
import needle_c
from needle import backend_ndarray as nd

from cuda_check import (  # noqa: F401  (no_limits_left: an autouse fixture)
    CUDA,
    HAS_CUDA,
    MiB,
    cuda_test,
    no_limits_left,
    random_f32,
    run_on_simulator,
    sim_test,
)
from repro_run import repro_report


@pytest.mark.skipif(HAS_CUDA, reason="checks the behaviour without a GPU")
def test_cuda_mem_without_gpu():
    assert cm.is_available() is False
    assert cm.device_count() == 0
    for device in (None, 0, "cuda", "cuda:1", ndl.cuda(), ndl.cuda(3)):
        assert cm.memory_allocated(device) == 0
        assert cm.max_memory_allocated(device) == 0
        assert cm.memory_reserved(device) == 0
        assert cm.max_memory_reserved(device) == 0
        assert cm.memory_stats(device) == {}
        assert cm.reset_peak_memory_stats(device) is None
        assert cm.empty_cache(device) == 0
        assert cm.mem_get_info(device) == (0, 0)
        assert "not available" in cm.memory_summary(device)
    assert needle_c._cuda_mem_get_info(0) is None
    with pytest.raises(ndl.DeviceError):
        cm.set_per_process_memory_fraction(0.5)
    with pytest.raises(ndl.DeviceError):
        nd.empty((3,), device=ndl.cuda())


def test_cuda_mem_rejects_other_devices():
    with pytest.raises(ValueError):
        cm.memory_allocated("cpu")
    with pytest.raises(ValueError):
        cm.memory_stats(ndl.cpu_numpy())
    with pytest.raises(TypeError):
        cm.memory_allocated(True)
    with pytest.raises(ValueError):
        cm.memory_allocated(99)


def test_cuda_mem_matches_needle_memory():
    assert cm.memory_stats() == mem.memory_stats(CUDA)
    assert cm.memory_allocated() == mem.memory_allocated(CUDA)
    assert cm.is_available() == HAS_CUDA
    assert cm.device_count() == sum(ndl.cuda(i).enabled() for i in range(16))


# ------------------------------------------------------------ memory: stats


@cuda_test
def test_cuda_memory_statistics():
    cm.empty_cache()
    base_alloc, base_res = cm.memory_allocated(), cm.memory_reserved()
    assert cm.is_available() and cm.device_count() >= 1
    a = nd.empty((1000,), device=CUDA)
    assert cm.memory_allocated() == base_alloc + 4000  # exact, not rounded
    assert cm.memory_reserved() >= cm.memory_allocated()
    b = nd.empty((3, 1000, 1000), device=CUDA)  # 12 MB: a large segment
    assert cm.memory_allocated() == base_alloc + 4000 + 12_000_000
    assert cm.memory_reserved() >= base_res + 12_000_000
    assert cm.max_memory_allocated() >= cm.memory_allocated()
    reserved_with_b = cm.memory_reserved()
    del b
    assert cm.memory_allocated() == base_alloc + 4000
    assert cm.memory_reserved() == reserved_with_b  # cached, still reserved
    c = nd.empty((2, 1000, 1000), device=CUDA)  # served from the cache (a split)
    assert cm.memory_reserved() == reserved_with_b
    del c
    released = cm.empty_cache()
    assert released >= 12_000_000
    assert cm.memory_reserved() == reserved_with_b - released
    assert cm.memory_reserved() >= cm.memory_allocated()
    stats = cm.memory_stats()
    assert stats["allocated_bytes.all.current"] == cm.memory_allocated()
    assert stats["reserved_bytes.all.current"] == cm.memory_reserved()
    # the capacity registered at import (cudaDeviceProp) is the driver's total
    assert abs(stats["device_capacity_bytes"] - cm.mem_get_info()[1]) <= 64 * MiB
    cm.reset_peak_memory_stats()
    assert cm.max_memory_allocated() == cm.memory_allocated()
    assert cm.max_memory_reserved() == cm.memory_reserved()
    assert "allocated" in cm.memory_summary() and "reserved" in cm.memory_summary()
    del a


@cuda_test
def test_cuda_limits_raise_out_of_memory():
    cm.empty_cache()
    keep = nd.empty((10,), device=CUDA)
    reserved = cm.memory_reserved()
    limit = reserved + 8 * MiB
    mem.set_memory_limit(CUDA, limit)
    a = nd.empty((6 * MiB // 4,), device=CUDA)  # 6 MiB fits
    ooms = cm.memory_stats()["num_ooms"]
    with pytest.raises(ndl.OutOfMemoryError) as info:
        nd.empty((8 * MiB // 4,), device=CUDA)  # 8 MiB more does not
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.requested == 8 * MiB and err.limit == limit and err.device == CUDA
    assert err.reserved <= limit and cm.memory_reserved() <= limit
    # ops whose results would pass it fail the same way
    # (the closures read a before the del a below; ruff cannot see that order)
    for op in (
        lambda: a * 2,  # noqa: F821
        lambda: a.exp(),  # noqa: F821
        lambda: a.reshape((768, 2048)).permute((1, 0)).compact(),  # noqa: F821
    ):
        with pytest.raises(ndl.OutOfMemoryError):
            op()
    assert cm.memory_stats()["num_ooms"] == ooms + 4
    assert cm.memory_reserved() <= limit
    # 7 MiB after a is gone: the allocator gives a's cached segment back and retries
    del a
    retries = cm.memory_stats()["num_alloc_retries"]
    b = nd.empty((7 * MiB // 4,), device=CUDA)
    assert b.shape == (7 * MiB // 4,)
    assert cm.memory_stats()["num_alloc_retries"] > retries
    assert cm.memory_reserved() <= limit
    mem.set_memory_limit(CUDA, None)
    cm.set_per_process_memory_fraction(0.5)
    capacity = cm.memory_stats()["device_capacity_bytes"]
    assert mem.get_memory_limit(CUDA) == int(0.5 * capacity)
    cm.set_per_process_memory_fraction(None)
    assert mem.get_memory_limit(CUDA) is None
    del b, keep


@cuda_test
def test_driver_sees_what_needle_reserves():
    """cudaMemGetInfo's free bytes drop by (about) what needle's reserved bytes grow."""
    warm = nd.array(np.ones((4, 4), np.float32), device=CUDA)
    (warm @ warm).numpy()  # creates the context and the cuBLAS handle first
    cm.empty_cache()
    free0, total = cm.mem_get_info()
    reserved0 = cm.memory_reserved()
    assert 0 < free0 <= total
    big = nd.empty((256 * MiB // 4,), device=CUDA)  # 256 MiB
    free1, _ = cm.mem_get_info()
    grown = cm.memory_reserved() - reserved0
    assert grown >= 256 * MiB
    # the driver allocates in 2 MiB pages; allow for other processes' small changes
    assert abs((free0 - free1) - grown) <= 8 * MiB, (free0 - free1, grown)
    del big
    cm.empty_cache()
    free2, _ = cm.mem_get_info()
    assert abs(free2 - free0) <= 8 * MiB
    del warm


@cuda_test
def test_garbage_collection_frees_gpu_memory():
    base = cm.memory_allocated()
    with ndl.autograd.graph_mode("needle"):
        x = ndl.Tensor(random_f32((256, 256), 20), device=CUDA)
        for _ in range(3):
            y = (x @ x).sum()
            y.backward()
    del x, y
    gc.collect()
    assert cm.memory_allocated() == base


@sim_test
def test_simulated_gpu_memory_runs_out_for_real():
    """NEEDLE_SIM_MEMORY is the GPU's capacity: cudaMalloc itself fails past it (no needle
    limit set), and the out-of-memory ladder (release the cache, collect, retry) runs."""
    out = run_on_simulator(
        """
        import json
        import needle as ndl, needle.cuda as cm
        from needle import backend_ndarray as nd
        MiB = 2**20
        gpu = ndl.cuda()
        out = {"info": list(cm.mem_get_info()),
               "capacity": cm.memory_stats()["device_capacity_bytes"]}
        a = nd.empty((40 * MiB // 4,), device=gpu)
        try:
            nd.empty((40 * MiB // 4,), device=gpu)
            out["second"] = "allocated"
        except ndl.OutOfMemoryError as err:
            out["second"] = [err.requested, err.limit]
        out["ooms"] = cm.memory_stats()["num_ooms"]
        del a
        # garbage that only a collection can free: a cycle holding 40 MiB (gc off: the
        # out-of-memory path collects anyway)
        import gc
        gc.disable()
        class Holder:
            pass
        h = Holder()
        h.me, h.array = h, nd.empty((40 * MiB // 4,), device=gpu)
        del h
        b = nd.empty((40 * MiB // 4,), device=gpu)
        out["after"] = [b.shape[0] * 4, cm.memory_stats()["num_oom_collections"]]
        print(json.dumps(out))
        """,
        NEEDLE_SIM_MEMORY="64MiB",
    )
    assert out["info"][1] == 64 * MiB and out["capacity"] == 64 * MiB
    assert 0 < out["info"][0] <= 64 * MiB
    assert out["second"][0] == 40 * MiB and out["second"][1] is None  # the driver's refusal
    assert out["ooms"] >= 1
    assert out["after"][0] == 40 * MiB and out["after"][1] >= 1


# -------------------------------------------------------------- repro on GPU


@cuda_test
def test_repro_modes_on_the_gpu(tmp_path):
    pytest.importorskip("matplotlib")
    _, report = repro_report(
        tmp_path, "--device", "cuda", "--steps", "8", "--modes", "leak,hook,cycle_free", timeout=900
    )
    assert all(r["device"] == "cuda()" for r in report.values()), report
    assert report["leak"]["oom"] and report["leak"]["oom_step"] <= 8
    for mode in ("hook", "cycle_free"):
        assert not report[mode]["oom"] and report[mode]["steps"] == 8, report[mode]
    assert report["hook"]["pressure_collections"] > 0
