"""Tests for the fused optimizer updates (needle_c.adam_update / sgd_update, used by
needle.optim.Adam and SGD): against the course's unfused formulas in NumPy float64 over
many steps, against the unfused code run with needle's own float32 ops (the code optim.py
ran before), against PyTorch where the semantics agree; the parameter gets a new array
while the state is updated in place; strided operands; bad input; NaN and infinities; and
on CUDA the census: one kernel launch per parameter, no host sync, no device malloc.

Tolerances. Against float64, the float32 code rounds the parameter once per step (at most
half a unit in the last place of the largest |p|) and computes the update with a relative
error of a few 1e-7, so after n steps each element is within n * (spacing(max|p|) +
1e-6 * lr) of the float64 value: that bound is what the tests allow. Against the unfused
float32 code the only difference is sqrt (correctly rounded) for its v**0.5 (a pow within
an ulp): SGD must agree bit for bit, Adam within a few ulps of the parameter per step.
"""

import numpy as np
import pytest

import needle as ndl
import needle_c

from devices import DEVICES, needs_cuda

SHAPES = [(4, 3), (1, 3), (5,), (2, 3, 4)]


def _tensor(a, device, requires_grad=False):
    return ndl.Tensor(np.asarray(a, dtype=np.float32), device=device, requires_grad=requires_grad)


def _setup(device, seed, shapes=SHAPES, scale=1.0):
    rng = np.random.default_rng(seed)
    params = [_tensor(rng.standard_normal(s) * scale, device, True) for s in shapes]
    return rng, params


def _grads(rng, shapes=SHAPES):
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _set_grads(params, grads, device):
    for p, g in zip(params, grads):
        p.grad = _tensor(g, device)


def _over(array):
    """A Tensor whose data is `array` itself (Tensor(array) would make a compact copy)."""
    t = ndl.Tensor(np.zeros(array.shape, np.float32), device=array.device)
    t.cached_data = array
    return t


def _step_bound(steps, x, lr):
    """Per-element tolerance after `steps` float32 steps (see the module docstring)."""
    return steps * (np.spacing(np.float32(np.max(np.abs(x)) + 1.0)) + 1e-6 * lr)


# ----------------------------------------------------------------- float64 references


def _adam64(x, m, v, g, t, lr, b1, b2, eps, wd):
    g = g + wd * x
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    return x - (m_hat * lr) / (np.sqrt(v_hat) + eps), m, v


def _sgd64(x, u, g, lr, momentum, wd):
    g = g + wd * x
    u = momentum * u + (1 - momentum) * g
    return x - lr * u, u


# -------------------------------------- the unfused code optim.py ran, in needle's ops


def _adam_unfused(p, grad, m, v, t, lr, b1, b2, eps, wd):
    with ndl.no_grad():
        if wd != 0:
            grad = grad + p * wd
        m = m * b1 + grad * (1 - b1)
        v = v * b2 + (grad * grad) * (1 - b2)
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        return p - (m_hat * lr) / (v_hat**0.5 + eps), m, v


def _sgd_unfused(p, grad, u, lr, momentum, wd):
    with ndl.no_grad():
        if wd != 0:
            grad = grad + p * wd
        u = u * momentum + grad * (1 - momentum)
        return p - u * lr, u


# ------------------------------------------------------------------ against float64


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wd", [0.0, 0.01])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.5, 0.9)])
def test_adam_matches_float64_over_many_steps(device, wd, betas):
    """200 steps: the bias corrections 1 - beta**t run from their first values to near 1."""
    lr, eps, steps = 0.01, 1e-8, 200
    rng, params = _setup(device, 10)
    opt = ndl.optim.Adam(params, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=wd)
    x = [p.numpy().astype(np.float64) for p in params]
    m = [np.zeros_like(a) for a in x]
    v = [np.zeros_like(a) for a in x]
    for t in range(1, steps + 1):
        grads = _grads(rng)
        _set_grads(params, grads, device)
        opt.step()
        for k, g in enumerate(grads):
            x[k], m[k], v[k] = _adam64(x[k], m[k], v[k], g, t, lr, *betas, eps, wd)
    assert opt.t == steps
    for k, p in enumerate(params):
        np.testing.assert_allclose(p.numpy(), x[k], rtol=0, atol=_step_bound(steps, x[k], lr))
        # The moments are sums of float32-rounded terms: relative error of a few 1e-6.
        np.testing.assert_allclose(opt.m[p].numpy(), m[k], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(opt.v[p].numpy(), v[k], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_sgd_matches_float64(device, momentum, wd):
    lr, steps = 0.1, 30
    rng, params = _setup(device, 11)
    opt = ndl.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd)
    x = [p.numpy().astype(np.float64) for p in params]
    u = [np.zeros_like(a) for a in x]
    for _ in range(steps):
        grads = _grads(rng)
        _set_grads(params, grads, device)
        opt.step()
        for k, g in enumerate(grads):
            x[k], u[k] = _sgd64(x[k], u[k], g, lr, momentum, wd)
    for k, p in enumerate(params):
        np.testing.assert_allclose(p.numpy(), x[k], rtol=0, atol=_step_bound(steps, x[k], lr))
        np.testing.assert_allclose(opt.u[p].numpy(), u[k], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------- against the unfused float32 code


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adam_matches_the_unfused_code_step_by_step(device, wd):
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8
    rng, params = _setup(device, 12)
    ref = [(p.detach(), ndl.init.zeros(*p.shape, device=device)) for p in params]
    ref = [(p, z, ndl.init.zeros(*p.shape, device=device)) for p, z in ref]
    opt = ndl.optim.Adam(params, lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
    for t in range(1, 21):
        grads = _grads(rng)
        _set_grads(params, grads, device)
        opt.step()
        for k, (p, g) in enumerate(zip(params, grads)):
            rp, rm, rv = ref[k]
            old = rp.numpy()
            new, rm, rv = _adam_unfused(rp, _tensor(g, device), rm, rv, t, lr, b1, b2, eps, wd)
            # sqrt against pow(., 0.5): a few ulps of the parameter; m and v: the same ops.
            tol = 4 * np.spacing(np.maximum(np.abs(old), np.abs(new.numpy())))
            assert np.all(np.abs(p.numpy() - new.numpy()) <= tol)
            np.testing.assert_array_equal(opt.m[params[k]].numpy(), rm.numpy())
            np.testing.assert_array_equal(opt.v[params[k]].numpy(), rv.numpy())
            ref[k] = (p.detach(), rm, rv)  # continue both from the fused parameter


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_sgd_matches_the_unfused_code_bit_for_bit(device, momentum, wd):
    lr = 0.1
    rng, params = _setup(device, 13)
    ref = [(p.detach(), ndl.init.zeros(*p.shape, device=device)) for p in params]
    opt = ndl.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd)
    for _ in range(10):
        grads = _grads(rng)
        _set_grads(params, grads, device)
        opt.step()
        for k, g in enumerate(grads):
            rp, ru = ref[k]
            ref[k] = _sgd_unfused(rp, _tensor(g, device), ru, lr, momentum, wd)
            np.testing.assert_array_equal(params[k].numpy(), ref[k][0].numpy())
            np.testing.assert_array_equal(opt.u[params[k]].numpy(), ref[k][1].numpy())


# ---------------------------------------------------------------------- PyTorch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adam_matches_torch(device, wd):
    """torch.optim.Adam adds weight_decay * p to the gradient and bias-corrects as the
    course does (it divides sqrt(v) by sqrt(1 - beta2**t): the same value)."""
    torch = pytest.importorskip("torch")
    lr, b1, b2, eps, steps = 0.01, 0.9, 0.999, 1e-8, 30
    rng, params = _setup(device, 14)
    tparams = [torch.tensor(p.numpy(), requires_grad=True) for p in params]
    opt = ndl.optim.Adam(params, lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
    topt = torch.optim.Adam(tparams, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for _ in range(steps):
        grads = _grads(rng)
        _set_grads(params, grads, device)
        for tp, g in zip(tparams, grads):
            tp.grad = torch.tensor(g)
        opt.step()
        topt.step()
    for p, tp in zip(params, tparams):
        want = tp.detach().numpy()
        np.testing.assert_allclose(p.numpy(), want, rtol=0, atol=2 * _step_bound(steps, want, lr))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_sgd_without_momentum_matches_torch(device, wd):
    """With momentum 0 the course's SGD is PyTorch's (p -= lr * (g + wd * p)); with momentum
    PyTorch's buffer starts at g where the course's starts at (1 - momentum) * g, so only
    the course formula (above) is the reference there."""
    torch = pytest.importorskip("torch")
    lr, steps = 0.1, 20
    rng, params = _setup(device, 15)
    tparams = [torch.tensor(p.numpy(), requires_grad=True) for p in params]
    opt = ndl.optim.SGD(params, lr=lr, weight_decay=wd)
    topt = torch.optim.SGD(tparams, lr=lr, weight_decay=wd)
    for _ in range(steps):
        grads = _grads(rng)
        _set_grads(params, grads, device)
        for tp, g in zip(tparams, grads):
            tp.grad = torch.tensor(g)
        opt.step()
        topt.step()
    for p, tp in zip(params, tparams):
        want = tp.detach().numpy()
        np.testing.assert_allclose(p.numpy(), want, rtol=0, atol=2 * _step_bound(steps, want, lr))


# --------------------------------------------------------- new parameter, state in place


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_old_data_keeps_its_values_and_state_is_updated_in_place(device, opt_cls):
    rng, params = _setup(device, 16)
    opt = opt_cls(params, lr=0.1, momentum=0.9) if opt_cls is ndl.optim.SGD else opt_cls(params)
    names = ("u",) if opt_cls is ndl.optim.SGD else ("m", "v")
    _set_grads(params, _grads(rng), device)
    opt.step()
    states = {n: {p: getattr(opt, n)[p] for p in params} for n in names}
    before_state = {n: {p: s.numpy().copy() for p, s in d.items()} for n, d in states.items()}
    old = [p.data for p in params]
    old_values = [o.numpy().copy() for o in old]
    grads = [p.grad for p in params]
    _set_grads(params, _grads(rng), device)
    grads = [p.grad for p in params]
    grad_values = [g.numpy().copy() for g in grads]
    opt.step()
    for p, o, ov, g, gv in zip(params, old, old_values, grads, grad_values):
        np.testing.assert_array_equal(o.numpy(), ov)  # the old data was not written
        np.testing.assert_array_equal(g.numpy(), gv)  # nor the gradient
        assert not np.array_equal(p.numpy(), ov)
        assert p.op is None and p.requires_grad
        for n in names:
            s = getattr(opt, n)[p]
            assert s is states[n][p]  # the same tensor, updated in place
            assert not np.array_equal(s.numpy(), before_state[n][p])
            assert s.op is None and not s.requires_grad
    assert all(set(getattr(opt, n)) == set(params) for n in names)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_parameter(device):
    p = _tensor(np.zeros((0, 3)), device, True)
    q = _tensor(np.ones(2), device, True)
    opt = ndl.optim.Adam([p, q], lr=0.1)
    p.grad = _tensor(np.zeros((0, 3)), device)
    q.grad = _tensor(np.ones(2), device)
    opt.step()
    assert p.shape == (0, 3) and opt.m[p].shape == (0, 3)
    np.testing.assert_allclose(q.numpy(), [0.9, 0.9], rtol=1e-6)


# ------------------------------------------------------------------ strided operands


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_strided_parameter_and_gradient(device, opt_cls):
    """A transposed parameter and a broadcast gradient (stride 0, as the gradient of a sum
    is) give what their contiguous copies give; the new parameter is contiguous."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    g = rng.standard_normal((1, 4)).astype(np.float32)
    kw = dict(lr=0.1, weight_decay=0.01)
    if opt_cls is ndl.optim.SGD:
        kw["momentum"] = 0.5
    strided = _over(ndl.NDArray(x, device=device).permute((1, 0)))
    strided.requires_grad = True
    assert not strided.cached_data.is_compact()
    plain = _tensor(x.T, device, True)
    opt_s, opt_p = opt_cls([strided], **kw), opt_cls([plain], **kw)
    for _ in range(3):
        strided.grad = _over(ndl.NDArray(g.T, device=device).broadcast_to((4, 3)))
        assert strided.grad.cached_data.strides[1] == 0
        plain.grad = _tensor(np.broadcast_to(g.T, (4, 3)), device)
        opt_s.step()
        opt_p.step()
        np.testing.assert_array_equal(strided.numpy(), plain.numpy())
        assert strided.cached_data.is_compact()


# ------------------------------------------------------------------------ bad input


def _adam_args(device, shape=(2, 3)):
    return [_tensor(np.ones(shape), device) for _ in range(4)]


HYPER = (0.1, 0.9, 0.999, 1e-8, 0.0, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_engine_call_rejects_bad_input_and_writes_nothing(device):
    p, g, m, v = _adam_args(device)
    u = _tensor(np.full((2, 3), 5.0), device)
    bad_shape = _tensor(np.ones((3, 2)), device)
    cases = [
        ((p, bad_shape, m, v, *HYPER), ValueError, r"the gradient has shape \(3, 2\)"),
        ((p, g, bad_shape, v, *HYPER), ValueError, "first moment m has shape"),
        ((p, g, m, m, *HYPER), ValueError, "shares memory"),
        ((p, g, p, v, *HYPER), ValueError, "shares memory"),
        ((p, g, m, v, 0.1, 0.9, 0.999, 1e-8, 0.0, 0), ValueError, "step must be"),
        ((p, g, m, v, "0.1", 0.9, 0.999, 1e-8, 0.0, 1), TypeError, "lr must be a real"),
        ((p, g, m, v, 0.1, True, 0.999, 1e-8, 0.0, 1), TypeError, "beta1 must be a real"),
        ((p, np.ones((2, 3)), m, v, *HYPER), TypeError, "grad must be an NDArray or a Tensor"),
        ((p, g, m, v), TypeError, "takes 10 positional arguments"),
    ]
    mt = _over(ndl.NDArray(np.ones((3, 2), np.float32), device=device).permute((1, 0)))
    cases.append(((p, g, mt, v, *HYPER), ValueError, "must be a contiguous array"))
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            needle_c.adam_update(*args)
        for t in (p, g, m, v):
            np.testing.assert_array_equal(t.numpy(), np.ones((2, 3)))
    with pytest.raises(ValueError, match="momentum u shares memory"):
        needle_c.sgd_update(p, g, g, 0.1, 0.9, 0.0)
    with pytest.raises(ValueError, match=r"the gradient has shape \(5,\)"):
        needle_c.sgd_update(p, _tensor(np.ones(5), device), u, 0.1, 0.9, 0.0)
    np.testing.assert_array_equal(u.numpy(), np.full((2, 3), 5.0))
    # After all of that, the next call works.
    out = needle_c.adam_update(p, g, m, v, *HYPER)
    assert isinstance(out, ndl.NDArray) and out.shape == (2, 3)
    np.testing.assert_allclose(m.numpy(), np.full((2, 3), 1.0), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_engine_call_rejects_mixed_devices(device):
    other = ndl.cpu_numpy() if device == ndl.cpu() else ndl.cpu()
    p, g, m, v = _adam_args(device)
    elsewhere = _tensor(np.ones((2, 3)), other)
    for args in [(p, elsewhere, m, v), (p, g, elsewhere, v), (p, g, m, elsewhere)]:
        with pytest.raises(ndl.DeviceError, match="adam_update: .* is on"):
            needle_c.adam_update(*args, *HYPER)
    with pytest.raises(ndl.DeviceError, match="sgd_update: the momentum u is on"):
        needle_c.sgd_update(p, g, elsewhere, 0.1, 0.9, 0.0)
    np.testing.assert_array_equal(m.numpy(), np.ones((2, 3)))


@pytest.mark.parametrize("device", DEVICES)
def test_optimizer_step_with_a_gradient_of_the_wrong_shape_raises(device):
    p = _tensor(np.ones((2, 3)), device, True)
    p.grad = _tensor(np.ones((3, 2)), device)
    for opt in (ndl.optim.Adam([p]), ndl.optim.SGD([p], momentum=0.9)):
        with pytest.raises(ValueError, match=r"shape \(3, 2\) but the parameter has shape"):
            opt.step()
        np.testing.assert_array_equal(p.numpy(), np.ones((2, 3)))


# ------------------------------------------------------------------- NaN and infinities


SPECIAL = np.array([0.0, -0.0, 1.0, np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-40, -2.5])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wd", [0.0, 0.5])
def test_nan_and_inf_propagate_like_the_unfused_code(device, wd):
    """Every pair of special values as (parameter, gradient), two steps."""
    x = np.repeat(SPECIAL, SPECIAL.size).astype(np.float32)
    g = np.tile(SPECIAL, SPECIAL.size).astype(np.float32)
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
    with np.errstate(all="ignore"):
        p = _tensor(x, device, True)
        adam = ndl.optim.Adam([p], lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
        zeros = np.zeros_like(x)
        rp, rm, rv = _tensor(x, device), _tensor(zeros, device), _tensor(zeros, device)
        q = _tensor(x, device, True)
        sgd = ndl.optim.SGD([q], lr=lr, momentum=0.5, weight_decay=wd)
        rq, ru = _tensor(x, device), _tensor(zeros, device)
        for t in (1, 2):
            p.grad = q.grad = _tensor(g, device)
            adam.step()
            sgd.step()
            rp, rm, rv = _adam_unfused(rp, _tensor(g, device), rm, rv, t, lr, b1, b2, eps, wd)
            rq, ru = _sgd_unfused(rq, _tensor(g, device), ru, lr, 0.5, wd)
            got, want = p.numpy(), rp.numpy()
            # NaN where the unfused code gives NaN, infinities with their signs, finite
            # values within the few ulps that sqrt and pow(., 0.5) may differ by.
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            finite = np.isfinite(want)
            np.testing.assert_array_equal(got[~finite], want[~finite])
            tol = 4 * np.spacing(np.maximum(np.abs(x[finite]), np.abs(want[finite])))
            assert np.all(np.abs(got[finite] - want[finite]) <= tol)
            np.testing.assert_array_equal(adam.m[p].numpy(), rm.numpy())
            np.testing.assert_array_equal(adam.v[p].numpy(), rv.numpy())
            np.testing.assert_array_equal(q.numpy(), rq.numpy())
            np.testing.assert_array_equal(sgd.u[q].numpy(), ru.numpy())
            x = got


# ------------------------------------------------------------------------------ CUDA


def cuda_test(fn):
    """Marks a test as needing the CUDA backend (skipped without; the simulator runs it)."""
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
@pytest.mark.parametrize("wd", [0.0, 0.01])
@cuda_test
def test_cuda_matches_cpu_bit_for_bit(opt_cls, wd):
    """Both backends run the same float32 operations in the same order, each rounded
    (no FMA contraction on the GPU): the same bits."""
    runs = []
    for device in (ndl.cpu(), ndl.cuda()):
        rng, params = _setup(device, 18)
        kw = dict(lr=0.05, weight_decay=wd)
        if opt_cls is ndl.optim.SGD:
            kw["momentum"] = 0.9
        opt = opt_cls(params, **kw)
        for _ in range(5):
            _set_grads(params, _grads(rng), device)
            opt.step()
        runs.append([p.numpy() for p in params])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def _census_step(opt_cls, with_grad, strided_grad=False):
    device = ndl.cuda()
    rng, params = _setup(device, 19)
    extra = _tensor(np.ones(7), device, True)  # never gets a gradient
    kw = dict(lr=0.01, weight_decay=0.01)
    if opt_cls is ndl.optim.SGD:
        kw["momentum"] = 0.9
    opt = opt_cls(params + [extra], **kw)

    def set_grads():
        _set_grads(params[:with_grad], _grads(rng)[:with_grad], device)
        if strided_grad:
            t = ndl.NDArray(rng.standard_normal(SHAPES[0][::-1]).astype(np.float32), device=device)
            params[0].grad = _over(t.permute((1, 0)))

    set_grads()
    opt.step()  # the first step makes the state
    set_grads()
    ndl.cuda.reset_work_counters()
    opt.step()
    return ndl.cuda.work_counters(), ndl.cuda.launches_by_kernel()


@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
@pytest.mark.parametrize("with_grad", [len(SHAPES), 2])
@cuda_test
def test_cuda_census_one_launch_per_parameter(opt_cls, with_grad):
    work, sites = _census_step(opt_cls, with_grad)
    kernel = "adam_update_kernel" if opt_cls is ndl.optim.Adam else "sgd_update_kernel"
    assert work["kernel_launches"] == with_grad, sites
    assert [name.split()[0] for name in sites] == [kernel]
    for key in ("host_syncs", "device_mallocs", "device_frees", "memsets", "d2d_copies"):
        assert work[key] == 0, (key, work)
    assert work["h2d_bytes"] == 0 and work["d2h_bytes"] == 0 and work["blas_calls"] == 0


@cuda_test
def test_cuda_census_strided_gradient_costs_one_copy():
    """A non-contiguous gradient is compacted first: one copy kernel more, still no sync
    and no malloc."""
    work, sites = _census_step(ndl.optim.Adam, len(SHAPES), strided_grad=True)
    assert work["kernel_launches"] == len(SHAPES) + 1, sites
    assert sum(n for name, n in sites.items() if name.startswith("adam_update_kernel")) == 4
    assert work["host_syncs"] == 0 and work["device_mallocs"] == 0
