"""needle.memory's byte accounting: exact allocation counts per device, views that allocate
nothing, failed ops that leak nothing, peaks, reserved bytes, the statistics' keys and counters,
and the engine-id parser behind them."""

import gc

import numpy as np
import pytest

import needle as ndl
import needle.memory as mem
from needle import backend_ndarray as nd

from memory_check import (  # noqa: F401  (clean_memory_state: an autouse fixture)
    ALL_DEVICES,
    HOST,
    STAT_KEYS,
    check_alive,
    clean_memory_state,
)


def test_module_access():
    assert ndl.memory is mem
    for name in [
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
        "reset_peak_memory_stats",
        "empty_cache",
        "memory_stats",
        "set_memory_limit",
        "get_memory_limit",
    ]:
        assert callable(getattr(mem, name)), name


# --------------------------------------------------------------------------
# exact accounting
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_allocation_is_exact(device):
    base = mem.memory_allocated(device)
    assert isinstance(base, int)
    a = nd.empty((1000,), device=device)
    assert mem.memory_allocated(device) == base + 4000
    b = nd.full((3, 0, 2), 1.0, device=device)
    assert mem.memory_allocated(device) == base + 4000
    c = nd.array(np.ones((7, 3)), device=device)
    assert mem.memory_allocated(device) == base + 4000 + 84
    s = nd.array(1.0, device=device)
    assert mem.memory_allocated(device) == base + 4000 + 84 + 4
    del a
    assert mem.memory_allocated(device) == base + 88
    del c, s
    assert mem.memory_allocated(device) == base
    del b
    assert mem.memory_allocated(device) == base
    assert mem.memory_allocated(device) == mem.memory_stats(device)["allocated_bytes.all.current"]


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_device_factories_are_exact(device):
    base = mem.memory_allocated(device)
    arrs = [
        device.empty((10, 10)),
        device.full((5,), 2.0),
        device.rand(3, 4),
        device.randn(2, 2),
        device.one_hot(6, 2),
        nd.empty((8,), device=device),
    ]
    assert mem.memory_allocated(device) == base + 4 * (100 + 5 + 12 + 4 + 6 + 8)
    del arrs
    assert mem.memory_allocated(device) == base


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_views_allocate_nothing(device):
    a = nd.empty((4, 6), device=device)
    r = nd.empty((1, 6), device=device)
    stats0 = mem.memory_stats(device)
    base = mem.memory_allocated(device)
    views = [
        a.reshape((6, 4)),
        a.reshape(24),
        a.reshape((2, -1, 3)),
        a.permute((1, 0)),
        a[1:3, ::2],
        a[1],
        a[::-1, 4:0:-2],
        a[..., 2],
        r.broadcast_to((5, 4, 6)),
        nd.broadcast_to(r, (3, 6)),
        a.flip(0),
        a.flip((0, 1)),
        nd.flip(a, 1),
        a.as_strided((3, 3), (1, 1)),
        a.flat,
        nd.reshape(a, (3, 8)),
        a.permute((1, 0))[::2].reshape((3, 1, 4)),
    ]
    assert mem.memory_allocated(device) == base
    stats1 = mem.memory_stats(device)
    assert stats1["allocation.all.allocated"] == stats0["allocation.all.allocated"]
    assert stats1["allocation.all.current"] == stats0["allocation.all.current"]
    # views keep the storage alive; dropping the base does not free it
    del a
    assert mem.memory_allocated(device) == base
    del views
    assert mem.memory_allocated(device) == base - 96
    del r
    assert mem.memory_allocated(device) == base - 96 - 24


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_view_keeps_storage_alive(device):
    base = mem.memory_allocated(device)
    a = nd.array(np.arange(1000, dtype=np.float32), device=device)
    v = a[10:20]
    del a
    assert mem.memory_allocated(device) == base + 4000
    np.testing.assert_array_equal(v.numpy(), np.arange(10, 20, dtype=np.float32))
    del v
    assert mem.memory_allocated(device) == base


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_copies_allocate_exactly_their_size(device):
    a = nd.empty((4, 6), device=device)
    base = mem.memory_allocated(device)
    c = a.permute((1, 0)).compact()
    assert mem.memory_allocated(device) == base + 96
    r = a.permute((1, 0)).reshape((24,))  # NumPy could not view this: a copy
    assert mem.memory_allocated(device) == base + 192
    same = a.compact()
    assert same is a
    assert a.to(device) is a
    assert mem.memory_allocated(device) == base + 192
    arr = a.numpy()
    assert mem.memory_allocated(device) == base + 192
    p = a.pad(((1, 1), (0, 2)))
    assert mem.memory_allocated(device) == base + 192 + 4 * 6 * 8
    del c, r, p, arr
    assert mem.memory_allocated(device) == base


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_op_allocates_exactly_its_result(device):
    a = nd.array(np.ones(100, np.float32), device=device)
    b = nd.array(np.full(100, 2.0, np.float32), device=device)
    base = mem.memory_allocated(device)
    st0 = mem.memory_stats(device)
    c = a + b
    st1 = mem.memory_stats(device)
    assert mem.memory_allocated(device) == base + 400
    assert st1["allocation.all.allocated"] - st0["allocation.all.allocated"] == 1
    assert st1["allocated_bytes.all.allocated"] - st0["allocated_bytes.all.allocated"] == 400
    np.testing.assert_array_equal(c.numpy(), np.full(100, 3.0, np.float32))
    del c
    assert mem.memory_allocated(device) == base
    # temporaries of an expression are freed; only the final result remains
    d = ((a + b) * a - 1).exp()
    assert mem.memory_allocated(device) == base + 400
    del d
    s = a.sum()
    assert mem.memory_allocated(device) == base + 4
    del s
    m = a.reshape((10, 10)) @ b.reshape((10, 10))
    assert mem.memory_allocated(device) == base + 400
    del m
    assert mem.memory_allocated(device) == base


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_failed_ops_do_not_leak(device):
    a = nd.empty((3, 4), device=device)
    b = nd.empty((4, 3), device=device)
    base = mem.memory_allocated(device)
    for op in [
        lambda: a + b,
        lambda: a @ a,
        lambda: a.sum(axis=5),
        lambda: a.reshape((5,)),
        lambda: nd.stack([a, b]),
        lambda: a.pad(((1, 1),)),
    ]:
        with pytest.raises(ValueError):
            op()
    with pytest.raises(TypeError):
        a + "x"
    with pytest.raises(IndexError):
        a[7]
    assert mem.memory_allocated(device) == base
    check_alive(device)


def test_devices_counted_separately():
    cpu, cnp = nd.cpu(), nd.cpu_numpy()
    base_cpu = mem.memory_allocated(cpu)
    base_np = mem.memory_allocated(cnp)
    a = nd.empty((1000,), device=cnp)
    assert mem.memory_allocated(cnp) == base_np + 4000
    assert mem.memory_allocated(cpu) == base_cpu
    b = nd.empty((250,), device=cpu)
    assert mem.memory_allocated(cpu) == base_cpu + 1000
    assert mem.memory_allocated(cnp) == base_np + 4000
    c = a.to(cpu)
    assert mem.memory_allocated(cpu) == base_cpu + 5000
    assert mem.memory_allocated(cnp) == base_np + 4000
    del a, b, c
    assert mem.memory_allocated(cpu) == base_cpu
    assert mem.memory_allocated(cnp) == base_np


def test_device_argument_forms():
    a = nd.empty((123,), device=nd.cpu())
    b = nd.empty((45,), device=nd.cpu_numpy())
    cpu_bytes = mem.memory_allocated(nd.cpu())
    np_bytes = mem.memory_allocated(nd.cpu_numpy())
    assert mem.memory_allocated() == cpu_bytes
    assert mem.memory_allocated(None) == cpu_bytes
    assert mem.memory_allocated("cpu") == cpu_bytes
    assert mem.memory_allocated("cpu_numpy") == np_bytes
    assert mem.memory_stats("cpu")["allocated_bytes.all.current"] == cpu_bytes
    assert mem.memory_stats("cpu_numpy")["allocated_bytes.all.current"] == np_bytes
    assert mem.memory_reserved("cpu") == mem.memory_reserved(nd.cpu())
    assert mem.max_memory_allocated("cpu_numpy") == mem.max_memory_allocated(nd.cpu_numpy())
    mem.set_memory_limit("cpu", 10**9)
    assert mem.get_memory_limit(nd.cpu()) == 10**9
    assert mem.get_memory_limit() == 10**9
    assert mem.get_memory_limit("cpu_numpy") is None
    mem.set_memory_limit("cpu_numpy", 12345678)
    assert mem.get_memory_limit(nd.cpu_numpy()) == 12345678
    mem.set_memory_limit("cpu", None)
    assert mem.get_memory_limit("cpu") is None
    del a, b


@pytest.mark.skipif(not nd.cuda().enabled(), reason="CUDA backend not built or no GPU")
@pytest.mark.cuda
def test_cuda_device_strings():
    a = nd.empty((100,), device=nd.cuda())
    n = mem.memory_allocated(nd.cuda())
    assert mem.memory_allocated("cuda") == n
    assert mem.memory_allocated("cuda:0") == n
    mem.set_memory_limit("cuda:0", "1GiB")
    assert mem.get_memory_limit(nd.cuda()) == 2**30
    del a


# --------------------------------------------------------------------------
# peaks, reserved, stats
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", HOST)
def test_peak_and_reset(device):
    mem.reset_peak_memory_stats(device)
    base = mem.memory_allocated(device)
    # Earlier tests may leave large blocks in the cache: reserved has its own base.
    reserved_base = mem.memory_reserved(device)
    assert mem.max_memory_allocated(device) == base
    assert mem.max_memory_reserved(device) == reserved_base
    a = nd.empty((1000,), device=device)
    del a
    b = nd.empty((100,), device=device)
    assert mem.memory_allocated(device) == base + 400
    assert mem.max_memory_allocated(device) == base + 4000
    assert mem.max_memory_reserved(device) == reserved_base + 4000
    st = mem.memory_stats(device)
    assert st["allocated_bytes.all.peak"] == base + 4000
    assert st["reserved_bytes.all.peak"] == reserved_base + 4000
    mem.reset_peak_memory_stats(device)
    assert mem.max_memory_allocated(device) == base + 400
    assert mem.max_memory_reserved(device) == reserved_base + 400
    st = mem.memory_stats(device)
    assert st["allocated_bytes.all.peak"] == base + 400
    assert st["allocation.all.peak"] == st["allocation.all.current"]
    del b


@pytest.mark.parametrize("device", HOST)
def test_reserved_equals_allocated_on_host(device):
    # Blocks under 2 MiB are never cached; empty the cache of earlier tests' large ones.
    mem.empty_cache(device)
    mem.reset_peak_memory_stats(device)
    assert mem.memory_reserved(device) == mem.memory_allocated(device)
    a = nd.empty((300,), device=device)
    assert mem.memory_reserved(device) == mem.memory_allocated(device)
    b = a + a
    del a
    assert mem.memory_reserved(device) == mem.memory_allocated(device)
    st = mem.memory_stats(device)
    assert st["reserved_bytes.all.current"] == st["allocated_bytes.all.current"]
    assert mem.max_memory_reserved(device) == mem.max_memory_allocated(device)
    del b
    assert mem.memory_reserved(device) == mem.memory_allocated(device)


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_empty_cache(device):
    a = nd.array(np.arange(10, dtype=np.float32), device=device)
    gc.collect()  # earlier tests' garbage must not be freed in between
    before = mem.memory_allocated(device)
    del_me = nd.empty((1000,), device=device)
    del del_me
    mem.empty_cache(device)
    assert mem.memory_allocated(device) == before
    np.testing.assert_array_equal(a.numpy(), np.arange(10, dtype=np.float32))
    if device in (nd.cpu(), nd.cpu_numpy()):
        assert mem.memory_reserved(device) == mem.memory_allocated(device)
    mem.empty_cache()
    check_alive(device)


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_memory_stats_keys_and_counters(device):
    st0 = mem.memory_stats(device)
    assert isinstance(st0, dict)
    for k in STAT_KEYS:
        assert k in st0, k
        assert isinstance(st0[k], int) and not isinstance(st0[k], bool), k
    for k, v in st0.items():
        assert isinstance(k, str)
        # Counts and bytes are ints; durations (the collector's "gc_seconds") are floats.
        if k.endswith("_seconds"):
            assert isinstance(v, float) and v >= 0.0, k
        else:
            assert isinstance(v, int), k
    assert st0["memory_limit_bytes"] == -1
    assert st0["allocated_bytes.all.peak"] >= st0["allocated_bytes.all.current"]
    assert st0["allocation.all.peak"] >= st0["allocation.all.current"]
    assert (
        st0["allocated_bytes.all.allocated"] - st0["allocated_bytes.all.freed"]
        == st0["allocated_bytes.all.current"]
    )
    assert (
        st0["allocation.all.allocated"] - st0["allocation.all.freed"]
        == st0["allocation.all.current"]
    )

    a = nd.empty((1000,), device=device)
    st1 = mem.memory_stats(device)
    assert st1["allocated_bytes.all.current"] == st0["allocated_bytes.all.current"] + 4000
    assert st1["allocated_bytes.all.allocated"] == st0["allocated_bytes.all.allocated"] + 4000
    assert st1["allocated_bytes.all.freed"] == st0["allocated_bytes.all.freed"]
    assert st1["allocation.all.current"] == st0["allocation.all.current"] + 1
    assert st1["allocation.all.allocated"] == st0["allocation.all.allocated"] + 1
    assert st1["allocation.all.freed"] == st0["allocation.all.freed"]
    del a
    st2 = mem.memory_stats(device)
    assert st2["allocated_bytes.all.current"] == st0["allocated_bytes.all.current"]
    assert st2["allocated_bytes.all.allocated"] == st0["allocated_bytes.all.allocated"] + 4000
    assert st2["allocated_bytes.all.freed"] == st0["allocated_bytes.all.freed"] + 4000
    assert st2["allocation.all.current"] == st0["allocation.all.current"]
    assert st2["allocation.all.freed"] == st0["allocation.all.freed"] + 1
    assert st2["allocation.all.allocated"] == st0["allocation.all.allocated"] + 1
    assert st2["num_ooms"] == st0["num_ooms"]
    assert mem.memory_allocated(device) == st2["allocated_bytes.all.current"]


def test_engine_ids_out_of_range_are_refused_not_truncated():
    """The binding's one engine-id parser (device.c: device_of_engine_id) refuses what names
    no device, 2**32 included (an int cast would have made it device 0)."""
    import needle_c

    for fn in (
        needle_c._memory_stats,
        needle_c._memory_allocated,
        needle_c._empty_cache,
        needle_c._memory_snapshot,
        needle_c._reset_pressure_stats,
    ):
        for bad in (2**32, 2**31, -1, 99):
            with pytest.raises(ValueError, match=f"no device with engine id {bad}$"):
                fn(bad)
        with pytest.raises(TypeError):
            fn("0")
    assert needle_c._memory_allocated(ndl.memory._engine_id("cpu")) >= 0
