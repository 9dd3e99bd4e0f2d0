"""Device memory limits: set_memory_limit's values and fractions, OutOfMemoryError and its
figures, limits per device, the NEEDLE_MEMORY_LIMIT variable, and mem_get_info /
set_per_process_memory_fraction on every device."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import needle as ndl
import needle.memory as mem
from needle import backend_ndarray as nd

from devices import DEVICES
from memory_check import (  # noqa: F401  (clean_memory_state: an autouse fixture)
    ALL_DEVICES,
    HOST,
    check_alive,
    clean_memory_state,
)

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


def _numpy_stream():
    _, keys, position, has_gauss, gauss = np.random.get_state()
    return keys.copy(), position, has_gauss, gauss


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rng_mode", ndl.random.MODES)
def test_a_random_draw_past_the_limit_is_needles_out_of_memory_error(device, rng_mode):
    # nn.Linear's weight is a random draw; from NumPy's RNG (the host modes) NumPy would
    # allocate its float64 values (8 TiB here) outside needle's accounting, before needle's.
    np.random.seed(0)
    base = mem.memory_reserved(device)
    allocated = mem.memory_allocated(device)  # a caching allocator reserves more than it hands out
    limit = base + 2**20
    mem.set_memory_limit(device, limit)
    stream = _numpy_stream()
    with ndl.random.rng_mode(rng_mode):
        for make in (
            lambda: ndl.nn.Linear(2**40, 1, device=device),
            lambda: ndl.init.randn(2**38, 4, device=device),
            lambda: ndl.init.randb(2**20, 2**20, p=0.5, device=device),
        ):
            with pytest.raises(ndl.OutOfMemoryError) as info:
                make()
            assert info.value.requested == 4 * 2**40
            assert info.value.limit == limit and info.value.device == device
            # no draw was made: NumPy's stream is where it was
            for now, before in zip(_numpy_stream(), stream):
                np.testing.assert_array_equal(now, before)
            assert mem.memory_allocated(device) == allocated
        # the process is fine after: a layer under the limit is made and runs
        layer = ndl.nn.Linear(64, 32, device=device)
        out = layer(ndl.Tensor(np.ones((2, 64), np.float32), device=device))
        assert out.shape == (2, 32) and np.isfinite(out.numpy()).all()
    del layer, out
    mem.set_memory_limit(device, None)
    check_alive(device)


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
