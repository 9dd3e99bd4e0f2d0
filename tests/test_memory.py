"""Tests for needle.memory: exact byte accounting, peaks, stats, limits and
out-of-memory errors, and the NEEDLE_MEMORY_LIMIT environment variable."""

import gc
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import needle as ndl
import needle.memory as mem
from needle import backend_ndarray as nd

from devices import DEVICES

HOST = [pytest.param(nd.cpu(), id="cpu"), pytest.param(nd.cpu_numpy(), id="cpu_numpy")]
ALL_DEVICES = DEVICES + [pytest.param(nd.cpu_numpy(), id="cpu_numpy")]

STAT_KEYS = [
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "allocation.all.current",
    "allocation.all.peak",
    "allocation.all.allocated",
    "allocation.all.freed",
    "num_alloc_retries",
    "num_ooms",
    "memory_limit_bytes",
]


def _all_devices_present():
    devs = [nd.cpu(), nd.cpu_numpy()]
    if nd.cuda().enabled():
        devs.append(nd.cuda())
    return devs


@pytest.fixture(autouse=True)
def clean_memory_state():
    """Collect garbage before each test and keep the cyclic GC from freeing
    unrelated storages mid-test; always remove limits afterwards."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        for d in _all_devices_present():
            mem.set_memory_limit(d, None)
        if was_enabled:
            gc.enable()
        gc.collect()


def check_alive(device=None):
    device = device or nd.cpu()
    a = nd.array([1.0, 2.0, 3.0], device=device)
    r = (a * 2 + 1).sum()
    np.testing.assert_array_equal(r.numpy(), np.array([15.0], np.float32))


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


# --------------------------------------------------------------------------
# limits
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", HOST)
def test_set_and_get_limit_values(device):
    assert mem.get_memory_limit(device) is None
    cases = [
        (4096, 4096),
        (0, 0),
        (10**12, 10**12),
        ("2GiB", 2 * 2**30),
        ("512 MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("100kB", 100_000),
        ("4096", 4096),
        ("4096B", 4096),
        ("3KiB", 3 * 1024),
        ("1TiB", 2**40),
        ("2TB", 2 * 10**12),
        ("7MB", 7_000_000),
        ("1MiB", 2**20),
    ]
    for value, expected in cases:
        mem.set_memory_limit(device, value)
        got = mem.get_memory_limit(device)
        assert got == expected, f"{value!r}: {got} != {expected}"
        assert isinstance(got, int), value
        assert mem.memory_stats(device)["memory_limit_bytes"] == expected
    mem.set_memory_limit(device, None)
    assert mem.get_memory_limit(device) is None
    assert mem.memory_stats(device)["memory_limit_bytes"] == -1


@pytest.mark.parametrize("device", HOST)
def test_limit_as_fraction(device):
    mem.set_memory_limit(device, 1.0)
    full = mem.get_memory_limit(device)
    assert isinstance(full, int) and full > 0
    mem.set_memory_limit(device, 0.5)
    half = mem.get_memory_limit(device)
    assert abs(half - full / 2) <= 1
    mem.set_memory_limit(device, 0.25)
    quarter = mem.get_memory_limit(device)
    assert abs(quarter - full / 4) <= 1
    # a fraction of the machine is plenty for a small array
    a = nd.empty((1000,), device=device)
    assert a.shape == (1000,)
    del a


BAD_LIMITS = [
    -1,
    -4096,
    -0.5,
    0.0,
    1.5,
    2.0,
    float("nan"),
    "abc",
    "",
    "12XB",
    "-1MiB",
    "MiB",
    "1.2.3GB",
    True,
    False,
    object(),
    [1024],
]


def _limit_id(bad):
    # An object's repr holds its address: ids must be the same in every process (pytest-xdist).
    return "object()" if type(bad) is object else repr(bad)


@pytest.mark.parametrize("device", HOST)
@pytest.mark.parametrize("bad", BAD_LIMITS, ids=_limit_id)
def test_bad_limit_values(bad, device):
    mem.set_memory_limit(device, 123456)
    with pytest.raises((ValueError, TypeError)):
        mem.set_memory_limit(device, bad)
    assert mem.get_memory_limit(device) == 123456
    mem.set_memory_limit(device, None)
    with pytest.raises((ValueError, TypeError)):
        mem.set_memory_limit(device, bad)
    assert mem.get_memory_limit(device) is None
    check_alive(device)


@pytest.mark.parametrize("device", HOST)
def test_out_of_memory_error(device):
    base = mem.memory_reserved(device)
    assert base == mem.memory_allocated(device)
    limit = base + 4000
    mem.set_memory_limit(device, limit)
    a = nd.empty((1000,), device=device)  # exactly reaches the limit
    assert mem.memory_allocated(device) == limit
    ooms0 = mem.memory_stats(device)["num_ooms"]
    with pytest.raises(ndl.OutOfMemoryError) as info:
        nd.empty((1,), device=device)
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.requested == 4
    assert err.allocated == limit
    assert err.reserved == limit
    assert err.limit == limit
    assert err.device == device
    msg = str(err)
    for v in (err.requested, err.allocated, err.reserved, err.limit):
        assert str(v) in msg, f"{v} not in {msg!r}"
    assert device.name in msg, msg
    st = mem.memory_stats(device)
    assert st["num_ooms"] == ooms0 + 1
    assert mem.memory_allocated(device) == limit
    # bigger requests fail the same way
    with pytest.raises(ndl.OutOfMemoryError) as info:
        nd.full((10, 10), 1.0, device=device)
    assert info.value.requested == 400
    assert mem.memory_stats(device)["num_ooms"] == ooms0 + 2
    with pytest.raises(ndl.OutOfMemoryError):
        nd.array(np.ones(3), device=device)
    with pytest.raises(ndl.OutOfMemoryError):
        device.empty((2, 2))
    assert mem.memory_allocated(device) == limit
    # after freeing, the next allowed allocation succeeds
    del a
    b = nd.empty((1,), device=device)
    assert b.shape == (1,)
    c = nd.empty((999,), device=device)
    assert mem.memory_allocated(device) == limit
    del b, c
    mem.set_memory_limit(device, None)
    check_alive(device)


@pytest.mark.parametrize("device", HOST)
def test_op_output_out_of_memory(device):
    a = nd.array(np.ones(100, np.float32), device=device)
    b = nd.array(np.full(100, 2.0, np.float32), device=device)
    base = mem.memory_reserved(device)
    mem.set_memory_limit(device, base + 399)
    for op in [
        lambda: a + b,
        lambda: a * 2,
        lambda: a.exp(),
        lambda: a.maximum(b),
        lambda: a < b,
        lambda: a.reshape((10, 10)) @ b.reshape((10, 10)),
        lambda: a.reshape((10, 10)).permute((1, 0)).compact(),
    ]:
        ooms0 = mem.memory_stats(device)["num_ooms"]
        with pytest.raises(ndl.OutOfMemoryError) as info:
            op()
        assert info.value.requested == 400
        assert info.value.limit == base + 399
        assert info.value.device == device
        assert mem.memory_stats(device)["num_ooms"] == ooms0 + 1
        assert mem.memory_allocated(device) == base
    # small outputs still fit
    s = a.sum()
    np.testing.assert_array_equal(s.numpy(), np.array([100.0], np.float32))
    del s
    mem.set_memory_limit(device, base + 400)
    c = a + b
    np.testing.assert_array_equal(c.numpy(), np.full(100, 3.0, np.float32))
    del c
    mem.set_memory_limit(device, None)
    check_alive(device)


@pytest.mark.parametrize("device", HOST)
def test_limit_at_current_usage(device):
    keep = nd.empty((10,), device=device)
    base = mem.memory_reserved(device)
    mem.set_memory_limit(device, base)
    z = nd.empty((0,), device=device)  # zero bytes never pass the limit
    assert z.shape == (0,)
    with pytest.raises(ndl.OutOfMemoryError) as info:
        nd.empty((1,), device=device)
    assert info.value.requested == 4
    assert info.value.limit == base
    mem.set_memory_limit(device, None)
    d = nd.empty((1,), device=device)
    assert mem.memory_allocated(device) == base + 4
    del keep, z, d


def test_limits_are_per_device():
    cpu, cnp = nd.cpu(), nd.cpu_numpy()
    mem.set_memory_limit(cpu, mem.memory_reserved(cpu) + 100)
    a = nd.empty((1000,), device=cnp)
    assert a.device == cnp
    with pytest.raises(ndl.OutOfMemoryError) as info:
        nd.empty((1000,), device=cpu)
    assert info.value.device == cpu
    assert mem.get_memory_limit(cnp) is None
    with pytest.raises(ndl.OutOfMemoryError):
        a.to(cpu)
    mem.set_memory_limit(cpu, None)
    b = a.to(cpu)
    assert b.device == cpu
    del a, b


# --------------------------------------------------------------------------
# NEEDLE_MEMORY_LIMIT
# --------------------------------------------------------------------------


_ENV_SCRIPT = textwrap.dedent(
    """
    import json
    import needle as ndl
    import needle.memory as mem
    from needle import backend_ndarray as nd
    out = {
        "cpu": mem.get_memory_limit(nd.cpu()),
        "cpu_numpy": mem.get_memory_limit(nd.cpu_numpy()),
        "default": mem.get_memory_limit(),
        "stat": mem.memory_stats("cpu")["memory_limit_bytes"],
    }
    if nd.cuda().enabled():
        out["cuda"] = mem.get_memory_limit(nd.cuda())
    try:
        big = nd.empty((300000,))  # 1.2 MB
        out["big"] = "ok"
    except ndl.OutOfMemoryError as e:
        out["big"] = "oom"
        out["requested"] = e.requested
    small = nd.empty((1000,))
    out["small"] = list(small.shape)
    print("RESULT" + json.dumps(out))
    """
)


def _run_env(value):
    env = dict(os.environ)
    env.pop("NEEDLE_MEMORY_LIMIT", None)
    if value is not None:
        env["NEEDLE_MEMORY_LIMIT"] = value
    proc = subprocess.run(
        [sys.executable, "-c", _ENV_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT") :])


def test_env_limit_unset():
    out = _run_env(None)
    assert out["cpu"] is None and out["cpu_numpy"] is None and out["default"] is None
    assert out["stat"] == -1
    assert out["big"] == "ok"
    assert out["small"] == [1000]


def test_env_limit_all_devices():
    out = _run_env("1MiB")
    assert out["cpu"] == 2**20
    assert out["cpu_numpy"] == 2**20
    assert out["default"] == 2**20
    assert out["stat"] == 2**20
    if "cuda" in out:
        assert out["cuda"] == 2**20
    assert out["big"] == "oom"
    assert out["requested"] == 1_200_000
    assert out["small"] == [1000]


def test_env_limit_per_device():
    out = _run_env("cpu=1MiB,cuda=2GiB")
    assert out["cpu"] == 2**20
    assert out["cpu_numpy"] is None
    if "cuda" in out:
        assert out["cuda"] == 2 * 2**30
    assert out["big"] == "oom"
    assert out["small"] == [1000]


# --------------------------------------------------------------------------
# mem_get_info and set_per_process_memory_fraction, for every device
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_mem_get_info_without_a_limit_is_the_hardware(device):
    free, total = mem.mem_get_info(device)
    assert isinstance(free, int) and isinstance(total, int)
    capacity = mem.memory_stats(device)["device_capacity_bytes"]
    if device.name == "cuda":
        assert total == ndl.cuda.mem_get_info(device)[1]  # the driver's
        assert abs(total - capacity) <= 64 * 2**20
    else:
        assert total == capacity  # physical memory
    assert 0 < free <= total


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_mem_get_info_under_a_limit_is_the_budget(device):
    keep = nd.empty((1024,), device=device)
    reserved = mem.memory_reserved(device)
    limit = reserved + 8 * 2**20
    mem.set_memory_limit(device, limit)
    assert mem.mem_get_info(device) == (8 * 2**20, limit)
    more = nd.empty((2**20 // 4,), device=device)  # 1 MiB
    free, total = mem.mem_get_info(device)
    # (a caching allocator may fit the 1 MiB into a segment it already reserved)
    assert total == limit and free == limit - mem.memory_reserved(device)
    assert mem.memory_reserved(device) >= mem.memory_allocated(device) >= 2**20
    if device.name == "cuda":
        assert ndl.cuda.mem_get_info(device) == (free, total)
    # a limit below what is reserved leaves nothing free
    mem.set_memory_limit(device, 0)
    assert mem.mem_get_info(device) == (0, 0)
    mem.set_memory_limit(device, None)
    assert mem.mem_get_info(device)[1] >= mem.memory_stats(device)["device_capacity_bytes"] // 2
    del keep, more


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_set_per_process_memory_fraction(device):
    capacity = mem.memory_stats(device)["device_capacity_bytes"]
    mem.set_per_process_memory_fraction(0.5, device)
    assert mem.get_memory_limit(device) == int(0.5 * capacity)
    assert mem.mem_get_info(device)[1] == int(0.5 * capacity)
    mem.set_per_process_memory_fraction(1, device)
    assert mem.get_memory_limit(device) == capacity
    mem.set_per_process_memory_fraction(np.float32(0.25), device)
    assert mem.get_memory_limit(device) == int(float(np.float32(0.25)) * capacity)
    if device.name == "cuda":
        ndl.cuda.set_per_process_memory_fraction(0.5, device)
        assert mem.get_memory_limit(device) == int(0.5 * capacity)
    mem.set_per_process_memory_fraction(None, device)
    assert mem.get_memory_limit(device) is None


def test_set_per_process_memory_fraction_default_device_is_the_cpu():
    mem.set_per_process_memory_fraction(0.5)
    assert mem.get_memory_limit(nd.cpu()) == mem.memory_stats("cpu")["device_capacity_bytes"] // 2
    assert mem.get_memory_limit(nd.cpu_numpy()) is None


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_set_per_process_memory_fraction_rejects_bad_input(device):
    limit = mem.memory_reserved(device) + 2**20
    mem.set_memory_limit(device, limit)
    for bad in (0, 0.0, -0.5, 1.5, 2, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
            mem.set_per_process_memory_fraction(bad, device)
    for bad in ("0.5", True, [0.5], object()):
        with pytest.raises(TypeError, match=r"fraction must be a number in \(0, 1\] or None"):
            mem.set_per_process_memory_fraction(bad, device)
    assert mem.get_memory_limit(device) == limit
    check_alive(device)


def test_memory_api_rejects_bad_devices():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        mem.set_per_process_memory_fraction(0.5, "tpu")
    with pytest.raises(TypeError, match="expected a needle device"):
        mem.set_per_process_memory_fraction(0.5, 3.5)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        mem.mem_get_info("tpu")
    with pytest.raises(TypeError, match="expected a needle device"):
        mem.mem_get_info(True)
    # needle.cuda's versions take CUDA devices only
    with pytest.raises(ValueError, match="expected a CUDA device"):
        ndl.cuda.mem_get_info("cpu")
    with pytest.raises(ValueError, match="expected a CUDA device"):
        ndl.cuda.set_per_process_memory_fraction(0.5, "cpu")


def test_memory_api_on_an_unavailable_device():
    missing = nd.cuda(7)
    if missing.enabled():
        pytest.skip("this machine has 8 GPUs")
    assert mem.mem_get_info(missing) == (0, 0)
    assert mem.mem_get_info("cuda:7") == (0, 0)
    with pytest.raises(ndl.DeviceError, match="not available"):
        mem.set_per_process_memory_fraction(0.5, missing)
    with pytest.raises(ndl.DeviceError, match="not available"):
        ndl.cuda.set_per_process_memory_fraction(0.5, 7)


# --------------------------------------------------------------------------
# set_gc_policy's argument types
# --------------------------------------------------------------------------


@pytest.fixture
def saved_policy():
    policy = mem.get_gc_policy()
    try:
        yield policy
    finally:
        mem.set_gc_policy(**policy)


@pytest.mark.parametrize("bad", ["no", "False", "", 0, 1, 1.0, [False]], ids=repr)
def test_set_gc_policy_enabled_takes_only_a_bool(saved_policy, bad):
    with pytest.raises(TypeError, match=r"^enabled must be True or False, got "):
        mem.set_gc_policy(enabled=bad)
    assert mem.get_gc_policy() == saved_policy


def test_set_gc_policy_enabled_switches(saved_policy):
    mem.set_gc_policy(enabled=False)
    assert mem.get_gc_policy()["enabled"] is False
    mem.set_gc_policy(enabled=True)
    assert mem.get_gc_policy()["enabled"] is True


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"growth": "1.0"}, TypeError, "growth must be a number, got str '1.0'"),
        ({"growth": True}, TypeError, "growth must be a number, got bool True"),
        ({"high_water": "0.9"}, TypeError, "high_water must be a number"),
        ({"max_gc_fraction": [0.1]}, TypeError, "max_gc_fraction must be a number"),
        ({"min_growth": True}, TypeError, "a memory size cannot be a bool"),
        ({"min_growth": "lots"}, ValueError, "cannot parse memory size 'lots'"),
        ({"watermark": False}, TypeError, "a memory size cannot be a bool"),
        ({"watermark": 1.5}, ValueError, "fractional memory size must be in"),
        ({"growth": -1.0}, ValueError, "gc policy: need growth >= 0"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_set_gc_policy_rejects_bad_arguments(saved_policy, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        mem.set_gc_policy(**kwargs)
    assert mem.get_gc_policy() == saved_policy


def test_set_gc_policy_takes_numpy_numbers(saved_policy):
    mem.set_gc_policy(growth=np.float32(0.5), high_water=np.float64(0.75))
    policy = mem.get_gc_policy()
    assert policy["growth"] == 0.5 and policy["high_water"] == 0.75


def test_engine_ids_out_of_range_are_refused_not_truncated():
    """The binding's one engine-id parser (memory/stats.c) refuses what names no device,
    2**32 included (an int cast would have made it device 0)."""
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
