"""Tests for needle.amp.GradScaler and its engine op needle_c.amp_unscale_ (the in-place
unscale and inf/NaN check, float32 and float64 gradients), on every device in DEVICES;
PyTorch's GradScaler is the oracle for the scale's trajectory."""

import numpy as np
import pytest

import needle as ndl
import needle_c

from devices import DEVICES, needs_cuda

dev = pytest.mark.parametrize("device", DEVICES)

SHAPES = [(4, 3), (3,), (2, 5), (7,)]


def _over(array):
    """A Tensor whose data is `array` itself (Tensor(array) would make a compact copy)."""
    t = ndl.Tensor(np.zeros(array.shape, np.float32), device=array.device)
    t.cached_data = array
    return t


def _params(device, rng, shapes=SHAPES):
    return [
        ndl.Tensor(rng.standard_normal(s).astype(np.float32), device=device, requires_grad=True)
        for s in shapes
    ]


def _set_grads(params, grads, device):
    for p, g in zip(params, grads):
        p.grad = ndl.Tensor(g, device=device)


def _grads(rng, shapes=SHAPES):
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


# --------------------------------------------------------------------------- engine op


@dev
def test_unscale_op_exact_and_flag(device):
    rng = np.random.default_rng(0)
    gs = _grads(rng)
    ts = [ndl.Tensor(g * 1024.0, device=device) for g in gs]
    flag = ndl.init.zeros(1, device=device)
    assert needle_c.amp_unscale_(ts, flag, 1.0 / 1024.0) is None
    for t, g in zip(ts, gs):
        np.testing.assert_array_equal(t.numpy(), g)
    assert flag.numpy()[0] == 0.0


@dev
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_unscale_op_sets_flag_and_ors(device, bad):
    flag = ndl.init.zeros(1, device=device)
    ok = ndl.Tensor(np.full(300, 2.0, np.float32), device=device)
    g = np.full(1000, 4.0, np.float32)
    g[777] = bad
    t = ndl.Tensor(g, device=device)
    needle_c.amp_unscale_([ok, t], flag, 0.5)
    assert flag.numpy()[0] == 1.0
    out = t.numpy()
    np.testing.assert_array_equal(np.delete(out, 777), 2.0)
    np.testing.assert_array_equal(out[777], np.float32(bad) * np.float32(0.5))
    np.testing.assert_array_equal(ok.numpy(), 1.0)
    # A later clean call leaves the flag set (it ORs), a fresh flag stays 0.
    needle_c.amp_unscale_([ok], flag, 1.0)
    assert flag.numpy()[0] == 1.0
    fresh = ndl.init.zeros(1, device=device)
    needle_c.amp_unscale_([ok], fresh, 1.0)
    assert fresh.numpy()[0] == 0.0


@dev
def test_unscale_op_writes_through_strided_views(device):
    """Gradients that are views of one bucket (as data parallelism makes them): a
    transposed slice and a strided slice are unscaled in place; the rest is untouched."""
    base = np.arange(48, dtype=np.float32).reshape(6, 8) * 4.0
    bucket = ndl.NDArray(base, device=device)
    a = bucket[0:3, :].permute((1, 0))  # (8, 3), not contiguous
    b = bucket[4:6, ::2]  # (2, 4), strided
    assert not a.is_compact() and not b.is_compact()
    flag = ndl.init.zeros(1, device=device)
    needle_c.amp_unscale_([_over(a), _over(b)], flag, 0.25)
    want = base.copy()
    want[0:3, :] *= 0.25
    want[4:6, ::2] *= 0.25
    np.testing.assert_array_equal(bucket.numpy(), want)
    assert flag.numpy()[0] == 0.0
    # A non-finite element seen through a view sets the flag.
    bucket2 = ndl.NDArray(np.ones((4, 4), np.float32), device=device)
    inf_at = np.ones((4, 4), np.float32)
    inf_at[3, 1] = np.inf
    bucket2 = ndl.NDArray(inf_at, device=device)
    needle_c.amp_unscale_([bucket2.permute((1, 0))[1:2, :]], flag, 1.0)
    assert flag.numpy()[0] == 1.0


@dev
def test_unscale_op_float64_in_float64(device):
    """A float64 gradient is multiplied in float64 by the float32 inv_scale widened (as
    PyTorch does): its values keep float64's precision, and 1e300, beyond float32's range
    but finite, does not set the flag; float32 gradients beside it are unaffected."""
    rng = np.random.default_rng(20)
    g = rng.standard_normal(50)
    g[7] = 1e300
    t = ndl.Tensor(g, device=device, dtype="float64")
    bucket = ndl.NDArray(rng.standard_normal((4, 6)), device=device, dtype="float64")
    before = bucket.numpy().copy()
    view = bucket[0:3, ::2].permute((1, 0))  # a strided view writes through
    f32 = ndl.Tensor(np.full(5, 4.0, np.float32), device=device)
    flag = ndl.init.zeros(1, device=device)
    inv_scale = 1.0 / 3.0  # not a float32: the engine takes its float32 rounding
    needle_c.amp_unscale_([t, _over(view), f32], flag, inv_scale)
    widened = float(np.float32(inv_scale))
    assert t.dtype == "float64"
    np.testing.assert_array_equal(t.numpy(), g * widened)
    with np.errstate(over="ignore"):  # 1e300 becomes inf in float32
        assert np.sum(t.numpy() != t.numpy().astype(np.float32)) > g.size // 2
    want = before.copy()
    want[0:3, ::2] *= widened
    np.testing.assert_array_equal(bucket.numpy(), want)
    np.testing.assert_array_equal(f32.numpy(), np.float32(4.0) * np.float32(inv_scale))
    assert flag.numpy()[0] == 0.0
    g[3] = np.inf
    needle_c.amp_unscale_([ndl.Tensor(g, device=device, dtype="float64")], flag, 0.5)
    assert flag.numpy()[0] == 1.0


@dev
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_unscale_op_refuses_narrow_gradients_and_writes_nothing(device, dtype):
    ok = ndl.Tensor(np.full(3, 2.0), device=device, dtype="float64")
    narrow = ndl.Tensor(np.full(3, 2.0), device=device, dtype=dtype)
    flag = ndl.init.zeros(1, device=device)
    with pytest.raises(TypeError, match=f"not implemented for {dtype} arrays \\(gradient 1\\)"):
        needle_c.amp_unscale_([ok, narrow], flag, 0.5)
    np.testing.assert_array_equal(ok.numpy(), 2.0)
    np.testing.assert_array_equal(np.asarray(narrow.numpy(), np.float64), 2.0)


@dev
def test_unscale_op_shared_gradient_unscaled_once(device):
    """One array given twice, or as itself and its transpose or reshape, is unscaled once."""
    arr = ndl.NDArray(np.full((3, 4), 8.0, np.float32), device=device)
    flag = ndl.init.zeros(1, device=device)
    t = _over(arr)
    needle_c.amp_unscale_([t, t, _over(arr.permute((1, 0))), _over(arr.reshape((12,)))], flag, 0.5)
    np.testing.assert_array_equal(arr.numpy(), 4.0)


@dev
def test_unscale_op_broadcast_view_multiplied_once(device):
    """x.sum().backward() makes x.grad a broadcast view of one element: each element of
    memory is multiplied once, so every element of the view reads unscaled."""
    one = ndl.NDArray(np.array([[8.0, 16.0, 32.0]], np.float32), device=device)
    flag = ndl.init.zeros(1, device=device)
    view = one.broadcast_to((4, 3))
    needle_c.amp_unscale_([_over(view), _over(one)], flag, 0.5)
    np.testing.assert_array_equal(view.numpy(), np.tile([4.0, 8.0, 16.0], (4, 1)))
    assert flag.numpy()[0] == 0.0


@dev
def test_unscale_op_refuses_bad_input_and_writes_nothing(device):
    arr = ndl.NDArray(np.full((4, 4), 2.0, np.float32), device=device)
    ok = ndl.Tensor(np.full(3, 2.0, np.float32), device=device)
    flag = ndl.init.zeros(1, device=device)
    with pytest.raises(ValueError, match="overlap in memory in part"):
        needle_c.amp_unscale_([ok, _over(arr), _over(arr[0:2, :])], flag, 0.5)
    with pytest.raises(ValueError, match="exactly one element"):
        needle_c.amp_unscale_([ok], ndl.init.zeros(2, device=device), 0.5)
    with pytest.raises(ValueError, match="shares memory with found_inf"):
        needle_c.amp_unscale_([ok, _over(arr)], _over(arr[1:2, 2]), 0.5)
    with pytest.raises(TypeError, match="gradient 1 must be an NDArray or a Tensor"):
        needle_c.amp_unscale_([ok, 3.0], flag, 0.5)
    with pytest.raises(TypeError, match="grads must be a list or tuple"):
        needle_c.amp_unscale_(ok, flag, 0.5)
    with pytest.raises(TypeError, match="inv_scale must be a real number"):
        needle_c.amp_unscale_([ok], flag, True)
    with pytest.raises(TypeError, match="takes 3 positional arguments"):
        needle_c.amp_unscale_([ok], flag)
    np.testing.assert_array_equal(arr.numpy(), 2.0)
    np.testing.assert_array_equal(ok.numpy(), 2.0)
    assert flag.numpy()[0] == 0.0
    # The process still works, and an empty list is a no-op.
    needle_c.amp_unscale_([], flag, 0.5)
    needle_c.amp_unscale_([ok], flag, 0.5)
    np.testing.assert_array_equal(ok.numpy(), 1.0)


def test_unscale_op_refuses_mixed_host_devices():
    flag = ndl.init.zeros(1, device=ndl.cpu())
    ok = ndl.Tensor(np.full(3, 2.0, np.float32), device=ndl.cpu())
    g = ndl.Tensor(np.full(3, 2.0, np.float32), device=ndl.cpu_numpy())
    with pytest.raises(
        ndl.DeviceError, match="gradient 1 is on cpu_numpy\\(\\) but found_inf is on cpu"
    ):
        needle_c.amp_unscale_([ok, g], flag, 0.5)
    np.testing.assert_array_equal(ok.numpy(), 2.0)
    np.testing.assert_array_equal(g.numpy(), 2.0)


def test_scaler_params_on_two_devices_one_flag_each():
    """An inf on either device skips the step for all."""
    rng = np.random.default_rng(14)
    a = _params(ndl.cpu(), rng, [(3,)])[0]
    b = _params(ndl.cpu_numpy(), rng, [(2,)])[0]
    opt = ndl.optim.SGD([a, b], lr=1.0)
    scaler = ndl.amp.GradScaler(init_scale=4.0)
    before = (a.numpy().copy(), b.numpy().copy())
    a.grad = ndl.Tensor(np.full(3, 4.0, np.float32), device=ndl.cpu())
    b.grad = ndl.Tensor(np.array([4.0, np.inf], np.float32), device=ndl.cpu_numpy())
    assert scaler.step(opt) is None
    np.testing.assert_array_equal(a.numpy(), before[0])
    np.testing.assert_array_equal(b.numpy(), before[1])
    np.testing.assert_array_equal(a.grad.numpy(), 1.0)  # unscaled on its own device
    scaler.update()
    assert scaler.get_scale() == 2.0
    a.grad = ndl.Tensor(np.full(3, 2.0, np.float32), device=ndl.cpu())
    b.grad = ndl.Tensor(np.full(2, 2.0, np.float32), device=ndl.cpu_numpy())
    scaler.step(opt)
    np.testing.assert_array_equal(a.numpy(), before[0] - 1.0)
    np.testing.assert_array_equal(b.numpy(), before[1] - 1.0)


@pytest.mark.cuda
@pytest.mark.skipif(ndl.cuda.unavailable_reason() is not None, reason="CUDA unavailable")
def test_unscale_op_refuses_mixed_devices():
    flag = ndl.init.zeros(1, device=ndl.cpu())
    g = ndl.Tensor(np.ones(3, np.float32), device=ndl.cuda())
    with pytest.raises(ndl.DeviceError, match="gradient 0 is on cuda"):
        needle_c.amp_unscale_([g], flag, 0.5)
    np.testing.assert_array_equal(g.numpy(), 1.0)


def _cuda_test(fn):
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@_cuda_test
def test_cuda_unscale_one_launch_per_gradient_no_sync(dtype):
    device = ndl.cuda()
    rng = np.random.default_rng(1)
    ts = [ndl.Tensor(g, device=device, dtype=dtype) for g in _grads(rng)]
    bucket = ndl.NDArray(rng.standard_normal((5, 6)), device=device, dtype=dtype)
    ts.append(_over(bucket.permute((1, 0))))
    flag = ndl.init.zeros(1, device=device)
    ndl.cuda.reset_work_counters()
    needle_c.amp_unscale_(ts, flag, 0.5)
    work, sites = ndl.cuda.work_counters(), ndl.cuda.launches_by_kernel()
    assert work["kernel_launches"] == len(ts), sites
    kernel = "amp_unscale_f64_kernel" if dtype == "float64" else "amp_unscale_kernel"
    assert [name.split()[0] for name in sites] == [kernel]
    for key in ("host_syncs", "device_mallocs", "memsets", "d2d_copies"):
        assert work[key] == 0, (key, work)
    assert work["h2d_bytes"] == 0 and work["d2h_bytes"] == 0


@_cuda_test
def test_cuda_scaler_step_reads_the_flag_once():
    """unscale_ launches one kernel per gradient and never waits; step() reads the
    flag once (one host sync) before the optimizer's launches."""
    device = ndl.cuda()
    rng = np.random.default_rng(13)
    params = _params(device, rng)
    _set_grads(params, _grads(rng), device)
    opt = ndl.optim.SGD(params, lr=0.1)
    scaler = ndl.amp.GradScaler()
    ndl.cuda.reset_work_counters()
    scaler.unscale_(opt)
    work, sites = ndl.cuda.work_counters(), ndl.cuda.launches_by_kernel()
    unscale_launches = sum(n for k, n in sites.items() if k.startswith("amp_unscale_kernel"))
    assert unscale_launches == len(params), sites
    assert work["host_syncs"] == 0 and work["d2h_bytes"] == 0, work
    ndl.cuda.reset_work_counters()
    scaler.step(opt)
    work, sites = ndl.cuda.work_counters(), ndl.cuda.launches_by_kernel()
    assert work["host_syncs"] == 1 and work["d2h_bytes"] == 4, work
    assert sum(n for k, n in sites.items() if k.startswith("sgd_update_kernel")) == len(params)


# --------------------------------------------------------------------------- GradScaler


@dev
def test_unscale_exact_and_step(device):
    rng = np.random.default_rng(2)
    params = _params(device, rng)
    before = [p.numpy().copy() for p in params]
    grads = _grads(rng)
    scaler = ndl.amp.GradScaler(init_scale=2.0**10)
    _set_grads(params, [g * scaler.get_scale() for g in grads], device)
    opt = ndl.optim.SGD(params, lr=0.5)
    scaler.unscale_(opt)
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad.numpy(), g)
    assert scaler.step(opt) is None  # SGD.step returns None; the step ran:
    for p, b, g in zip(params, before, grads):
        np.testing.assert_allclose(p.numpy(), b - 0.5 * g, rtol=1e-6, atol=1e-7)
    scaler.update()
    assert scaler.get_scale() == 2.0**10 and scaler._get_growth_tracker() == 1


@dev
def test_float64_parameters_unscaled_and_stepped_in_float64(device):
    """A scaler over float64 parameters: the unscale and the step both run in float64, so
    the result is the float64 step of the unscaled gradients (to float64's rounding)."""
    rng = np.random.default_rng(21)
    x = [rng.standard_normal(s) for s in SHAPES]
    grads = [rng.standard_normal(s) for s in SHAPES]
    params = [ndl.Tensor(a, device=device, dtype="float64", requires_grad=True) for a in x]
    scaler = ndl.amp.GradScaler(init_scale=2.0**10)
    for p, g in zip(params, grads):
        p.grad = ndl.Tensor(g * 2.0**10, device=device, dtype="float64")
    opt = ndl.optim.SGD(params, lr=0.1, momentum=0.5)
    scaler.step(opt)
    for p, a, g in zip(params, x, grads):
        assert p.dtype == "float64" and p.grad.dtype == "float64"
        np.testing.assert_array_equal(p.grad.numpy(), g)  # a power of two: exact
        np.testing.assert_allclose(p.numpy(), a - 0.1 * (0.5 * g), rtol=1e-14)
        assert np.sum(p.numpy() != p.numpy().astype(np.float32)) > a.size // 2


@dev
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_inf_or_nan_skips_step_and_backs_off(device, bad):
    rng = np.random.default_rng(3)
    params = _params(device, rng)
    before = [p.numpy().copy() for p in params]
    opt = ndl.optim.Adam(params, lr=0.1)
    scaler = ndl.amp.GradScaler(init_scale=256.0, growth_interval=2)
    grads = [g * 256.0 for g in _grads(rng)]
    grads[2][1, 3] = bad
    _set_grads(params, grads, device)
    calls = []
    real_step = opt.step
    opt.step = lambda: calls.append(1) or real_step()
    assert scaler.step(opt) is None
    assert calls == []
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.numpy(), b)
    assert opt.t == 0
    scaler.update()
    assert scaler.get_scale() == 128.0 and scaler._get_growth_tracker() == 0


@dev
def test_step_returns_optimizer_result_and_skips_none_grads(device):
    rng = np.random.default_rng(4)
    params = _params(device, rng)
    params[1].grad = None
    grads = _grads(rng)
    _set_grads([params[0], params[2], params[3]], [grads[0], grads[2], grads[3]], device)

    class Counting(ndl.optim.SGD):
        def step(self, *args, **kwargs):
            super().step()
            return ("ran", args, kwargs)

    opt = Counting(params, lr=0.1)
    scaler = ndl.amp.GradScaler()
    assert scaler.step(opt, 1, k=2) == ("ran", (1,), {"k": 2})
    assert params[1].grad is None


@dev
def test_growth_after_interval(device):
    rng = np.random.default_rng(5)
    params = _params(device, rng)
    opt = ndl.optim.SGD(params, lr=0.0)
    scaler = ndl.amp.GradScaler(init_scale=4.0, growth_factor=3.0, growth_interval=3)
    seen = []
    for _ in range(7):
        _set_grads(params, _grads(rng), device)
        scaler.step(opt)
        scaler.update()
        seen.append(scaler.get_scale())
    assert seen == [4.0, 4.0, 12.0, 12.0, 12.0, 36.0, 36.0]


@dev
def test_clip_grad_norm_after_unscale_sees_true_grads(device):
    rng = np.random.default_rng(6)
    params = _params(device, rng)
    grads = _grads(rng)
    scaler = ndl.amp.GradScaler(init_scale=2.0**12)
    _set_grads(params, [g * 2.0**12 for g in grads], device)
    opt = ndl.optim.SGD(params, lr=0.1)
    scaler.unscale_(opt)
    norm = opt.clip_grad_norm(max_norm=1e9)
    want = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    assert norm == pytest.approx(want, rel=1e-6)
    scaler.step(opt)  # does not unscale again
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad.numpy(), g)


@dev
def test_shared_gradient_from_backward_unscaled_once(device):
    """(x + y).backward() gives x and y one gradient array (x.grad is y.grad)."""
    x = ndl.Tensor(np.ones((2, 3), np.float32), device=device, requires_grad=True)
    y = ndl.Tensor(np.ones((2, 3), np.float32), device=device, requires_grad=True)
    scaler = ndl.amp.GradScaler(init_scale=64.0)
    z = ndl.Tensor(np.ones((3, 2), np.float32), device=device, requires_grad=True)
    scaler.scale((x + y + ndl.transpose(z) * 3.0).sum()).backward()
    opt = ndl.optim.SGD([x, y, z], lr=1.0)
    scaler.unscale_(opt)
    np.testing.assert_array_equal(x.grad.numpy(), 1.0)
    np.testing.assert_array_equal(y.grad.numpy(), 1.0)
    np.testing.assert_array_equal(z.grad.numpy(), 3.0)


@dev
def test_partially_overlapping_grads_get_copies(device):
    arr = ndl.NDArray(np.full((4, 2), 8.0, np.float32), device=device)
    a = ndl.Tensor(np.zeros((4, 2), np.float32), device=device, requires_grad=True)
    b = ndl.Tensor(np.zeros((2, 2), np.float32), device=device, requires_grad=True)
    a.grad, b.grad = _over(arr), _over(arr[0:2, :])
    scaler = ndl.amp.GradScaler(init_scale=2.0)
    scaler.unscale_(ndl.optim.SGD([a, b], lr=1.0))
    np.testing.assert_array_equal(a.grad.numpy(), 4.0)
    np.testing.assert_array_equal(b.grad.numpy(), 4.0)


@dev
def test_scale_structures(device):
    scaler = ndl.amp.GradScaler(init_scale=8.0)
    t = ndl.Tensor(np.array([1.0, -2.0], np.float32), device=device)
    np.testing.assert_array_equal(scaler.scale(t).numpy(), [8.0, -16.0])
    out = scaler.scale([t, (t, [t])])
    assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][1], list)
    np.testing.assert_array_equal(out[1][1][0].numpy(), [8.0, -16.0])
    with pytest.raises(TypeError, match="must be a Tensor or a list/tuple"):
        scaler.scale(3.0)
    with pytest.raises(TypeError, match="got ndarray"):
        scaler.scale([t, np.ones(2)])


@dev
def test_state_dict_round_trip(device):
    rng = np.random.default_rng(7)
    params = _params(device, rng)
    opt = ndl.optim.SGD(params, lr=0.0)
    a = ndl.amp.GradScaler(init_scale=32.0, growth_factor=4.0, backoff_factor=0.25,
                           growth_interval=3)  # fmt: skip
    for bad in (False, False, True, False):
        grads = _grads(rng)
        if bad:
            grads[0][0, 0] = np.inf
        _set_grads(params, grads, device)
        a.step(opt)
        a.update()
    sd = a.state_dict()
    assert sd == {
        "scale": 8.0,
        "growth_factor": 4.0,
        "backoff_factor": 0.25,
        "growth_interval": 3,
        "_growth_tracker": 1,
    }
    b = ndl.amp.GradScaler()
    b.load_state_dict(sd)
    assert b.state_dict() == sd
    for s in (a, b):
        for _ in range(2):
            _set_grads(params, _grads(rng), device)
            s.step(opt)
            s.update()
    assert a.get_scale() == b.get_scale() == 32.0
    with pytest.raises(RuntimeError, match="state dict is empty"):
        b.load_state_dict({})
    with pytest.raises(KeyError):
        b.load_state_dict({"scale": 2.0})
    with pytest.raises(ValueError, match="Invalid growth_factor"):
        b.load_state_dict(dict(sd, growth_factor=0.5))
    assert b.state_dict()["growth_factor"] == 4.0  # unchanged by the refused loads


def test_misuse_raises():
    rng = np.random.default_rng(8)
    params = _params(ndl.cpu(), rng)
    opt = ndl.optim.SGD(params, lr=0.1)
    scaler = ndl.amp.GradScaler()
    with pytest.raises(RuntimeError, match="No inf checks were recorded prior to update"):
        scaler.update()
    with pytest.raises(RuntimeError, match="No inf checks were recorded for this optimizer"):
        scaler.step(opt)  # no gradients at all
    scaler.update(new_scale=1024.0)  # resets the per-optimizer state
    assert scaler.get_scale() == 1024.0
    _set_grads(params, _grads(rng), ndl.cpu())
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
        scaler.step(opt, closure=lambda: 0.0)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) is being called after step"):
        scaler.unscale_(opt)
    with pytest.raises(TypeError, match="expected a needle optimizer"):
        ndl.amp.GradScaler().unscale_(object())
    with pytest.raises(ValueError, match="Invalid new_scale"):
        scaler.update(new_scale=-1.0)
    with pytest.raises(TypeError, match="new_scale must be a real number"):
        scaler.update(new_scale="2")
    scaler.update(new_scale=ndl.Tensor(np.array([512.0], np.float32)))
    assert scaler.get_scale() == 512.0
    # After update() the cycle starts again.
    _set_grads(params, _grads(rng), ndl.cpu())
    scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"init_scale": 0.0}, ValueError, "Invalid init_scale"),
        ({"init_scale": float("inf")}, ValueError, "Invalid init_scale"),
        ({"init_scale": 1e39}, ValueError, "overflows float32"),
        ({"init_scale": "1"}, TypeError, "init_scale must be a real number"),
        ({"growth_factor": 1.0}, ValueError, "Invalid growth_factor"),
        ({"backoff_factor": 1.0}, ValueError, "Invalid backoff_factor"),
        ({"backoff_factor": 0.0}, ValueError, "Invalid backoff_factor"),
        ({"growth_interval": 0}, ValueError, "Invalid growth_interval"),
        ({"growth_interval": 2.5}, TypeError, "growth_interval must be an int"),
        ({"enabled": 1}, TypeError, "enabled must be a bool"),
    ],
)
def test_constructor_checks(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ndl.amp.GradScaler(**kwargs)


def test_setters_and_getters():
    s = ndl.amp.GradScaler(growth_factor=3.0, backoff_factor=0.25, growth_interval=7)
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (
        3.0,
        0.25,
        7,
    )
    s.set_growth_factor(5.0)
    s.set_backoff_factor(0.125)
    s.set_growth_interval(2)
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (
        5.0,
        0.125,
        2,
    )
    with pytest.raises(ValueError):
        s.set_growth_factor(0.9)
    assert s.is_enabled() and s.get_scale() == 65536.0


def test_disabled_is_a_pass_through():
    rng = np.random.default_rng(9)
    params = _params(ndl.cpu(), rng)
    grads = _grads(rng)
    grads[0][0, 0] = np.inf
    _set_grads(params, grads, ndl.cpu())
    opt = ndl.optim.SGD(params, lr=0.1)
    s = ndl.amp.GradScaler(enabled=False)
    t = ndl.Tensor(np.ones(2, np.float32))
    assert s.scale(t) is t
    s.unscale_(opt)
    np.testing.assert_array_equal(params[1].grad.numpy(), grads[1])
    s.step(opt)  # not skipped: a disabled scaler checks nothing
    assert np.isnan(params[0].numpy()[0, 0]) or np.isinf(params[0].numpy()[0, 0])
    s.update()
    assert s.get_scale() == 1.0 and not s.is_enabled() and s.state_dict() == {}
    s.load_state_dict({})  # a no-op


# --------------------------------------------------------------------------- oracles


@dev
def test_scale_trajectory_matches_pytorch(device):
    torch = pytest.importorskip("torch")
    tscaler = torch.amp.GradScaler(
        "cpu", init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=3
    )
    if not tscaler.is_enabled():
        pytest.skip("torch.amp.GradScaler('cpu') is disabled in this PyTorch build")
    tparam = torch.nn.Parameter(torch.zeros(3))
    topt = torch.optim.SGD([tparam], lr=0.0)
    tscaler.scale(torch.ones(()))  # PyTorch creates its scale lazily here
    rng = np.random.default_rng(10)
    params = _params(device, rng, [(3,)])
    opt = ndl.optim.SGD(params, lr=0.0)
    scaler = ndl.amp.GradScaler(init_scale=2.0**16, growth_interval=3)
    # Bad steps (True) in runs that reach and miss the growth interval, NaN and inf.
    pattern = [False] * 4 + [True] + [False] * 2 + [True, True] + [False] * 7 + [True] * 3
    pattern += [False] * 10 + [True] + [False] * 3
    ours, theirs = [], []
    for i, bad in enumerate(pattern):
        g = np.ones(3, np.float32)
        if bad:
            g[i % 3] = np.nan if i % 2 else np.inf
        tparam.grad = torch.tensor(g)
        tscaler.step(topt)
        tscaler.update()
        theirs.append(tscaler.get_scale())
        _set_grads(params, [g], device)
        scaler.step(opt)
        scaler.update()
        ours.append(scaler.get_scale())
    assert ours == theirs
    assert scaler.state_dict() == tscaler.state_dict()


@dev
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_training_with_scaler_matches_plain_float32(device, opt_cls):
    """A Linear stack trained 20 steps with GradScaler(init_scale=1024) reaches the
    parameters of the same training without it: a power-of-two scale is exact."""

    def train(use_scaler):
        np.random.seed(11)
        model = ndl.nn.Sequential(
            ndl.nn.Linear(6, 16, device=device),
            ndl.nn.ReLU(),
            ndl.nn.Linear(16, 3, device=device),
        )
        opt = opt_cls(model.parameters(), lr=0.05)
        scaler = ndl.amp.GradScaler(init_scale=1024.0, growth_interval=5) if use_scaler else None
        rng = np.random.default_rng(12)
        loss_fn = ndl.nn.SoftmaxLoss()
        for _ in range(20):
            x = ndl.Tensor(rng.standard_normal((8, 6)).astype(np.float32), device=device)
            y = ndl.Tensor(rng.integers(0, 3, 8).astype(np.float32), device=device)
            opt.reset_grad()
            loss = loss_fn(model(x), y)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        return [p.numpy() for p in model.parameters()], scaler

    plain, _ = train(False)
    scaled, scaler = train(True)
    assert scaler.get_scale() == 1024.0 * 2**4  # 20 good steps, growth every 5
    for a, b in zip(plain, scaled):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
