"""Tests for the fused optimizer updates (needle_c.adam_update / sgd_update, used by
needle.optim.Adam and SGD): against the course's unfused formulas in NumPy float64 over
many steps, against the unfused code run with needle's own float32 ops (the code optim.py
ran before), against PyTorch where the semantics agree; the parameter gets a new array
while the state is updated in place; strided operands; bad input; NaN and infinities;
float64 parameters updated in float64 (to 1e-12 of NumPy float64, not float32-rounded),
float16 and bfloat16 computing in float32 and rounding once, mixed dtypes in one optimizer;
and on CUDA the census: one kernel launch per parameter, no host sync, no device malloc.

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


def _tensor(a, device, requires_grad=False, dtype="float32"):
    return ndl.Tensor(
        np.asarray(a, dtype=dtype), device=device, dtype=dtype, requires_grad=requires_grad
    )


def _setup(device, seed, shapes=SHAPES, scale=1.0, dtype="float32"):
    rng = np.random.default_rng(seed)
    params = [_tensor(rng.standard_normal(s) * scale, device, True, dtype) for s in shapes]
    return rng, params


def _grads(rng, shapes=SHAPES, dtype="float32"):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _set_grads(params, grads, device):
    for p, g in zip(params, grads):
        p.grad = _tensor(g, device, dtype=str(g.dtype))


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


# ----------------------------------------------------------------- float64 and narrow dtypes

F64_TOL = 1e-12  # relative: float64 arithmetic in another order than NumPy's, over a few steps


def _tensor64(a, device, requires_grad=False):
    return _tensor(a, device, requires_grad, "float64")


def _setup64(device, seed):
    """float64 parameters whose values float32 cannot hold (most elements)."""
    return _setup(device, seed, dtype="float64")


def _more_than_float32(a):
    """How many elements of the float64 array a float32 would round."""
    return int(np.sum(a != a.astype(np.float32).astype(np.float64)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_float64_step_with_zero_gradient_keeps_the_parameter(device, opt_cls):
    """The symptom of computing in float32: a zero gradient rounded 1/3 to float32."""
    x = np.array([1 / 3, -2 / 3, 0.1, 1e-300, 1 + 2**-40])
    p = _tensor64(x, device, True)
    opt = opt_cls([p], lr=0.1, momentum=0.9) if opt_cls is ndl.optim.SGD else opt_cls([p], lr=0.1)
    for _ in range(2):
        p.grad = _tensor64(np.zeros(5), device)
        opt.step()
        assert p.dtype == "float64"
        np.testing.assert_array_equal(p.numpy(), x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_sgd_float64_matches_float64_numpy(device, momentum, wd):
    lr, steps = 0.1, 8
    rng, params = _setup64(device, 30)
    opt = ndl.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd)
    x = [p.numpy().copy() for p in params]
    u = [np.zeros_like(a) for a in x]
    for _ in range(steps):
        grads = [rng.standard_normal(s) for s in SHAPES]
        for p, g in zip(params, grads):
            p.grad = _tensor64(g, device)
        opt.step()
        for k, g in enumerate(grads):
            x[k], u[k] = _sgd64(x[k], u[k], g, lr, momentum, wd)
    for k, p in enumerate(params):
        assert p.dtype == "float64" and opt.u[p].dtype == "float64"
        np.testing.assert_allclose(p.numpy(), x[k], rtol=F64_TOL, atol=1e-300)
        np.testing.assert_allclose(opt.u[p].numpy(), u[k], rtol=F64_TOL, atol=1e-300)
        # Not what a float32 update gives: the values carry float64's precision.
        assert _more_than_float32(p.numpy()) > p.numpy().size // 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wd", [0.0, 0.01])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.5, 0.9)])
def test_adam_float64_matches_float64_numpy(device, wd, betas):
    """Several steps, so that the bias corrections 1 - beta**t change (and are not rounded
    to float32 either)."""
    lr, eps, steps = 0.01, 1e-8, 12
    rng, params = _setup64(device, 31)
    opt = ndl.optim.Adam(params, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=wd)
    x = [p.numpy().copy() for p in params]
    m = [np.zeros_like(a) for a in x]
    v = [np.zeros_like(a) for a in x]
    for t in range(1, steps + 1):
        grads = [rng.standard_normal(s) for s in SHAPES]
        for p, g in zip(params, grads):
            p.grad = _tensor64(g, device)
        opt.step()
        for k, g in enumerate(grads):
            x[k], m[k], v[k] = _adam64(x[k], m[k], v[k], g, t, lr, *betas, eps, wd)
    for k, p in enumerate(params):
        assert p.dtype == "float64"
        assert opt.m[p].dtype == "float64" and opt.v[p].dtype == "float64"
        np.testing.assert_allclose(p.numpy(), x[k], rtol=F64_TOL, atol=1e-300)
        np.testing.assert_allclose(opt.m[p].numpy(), m[k], rtol=F64_TOL, atol=1e-300)
        np.testing.assert_allclose(opt.v[p].numpy(), v[k], rtol=F64_TOL, atol=1e-300)
        assert _more_than_float32(p.numpy()) > p.numpy().size // 2
        assert _more_than_float32(opt.m[p].numpy()) > p.numpy().size // 2


def _as_float32(t, device):
    return ndl.Tensor(np.asarray(t.numpy(), np.float32), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_narrow_dtypes_compute_in_float32_and_round_once(device, dtype, opt_cls):
    """A float16 or bfloat16 step is the float32 step of the widened values, its results
    (the parameter and the state, kept in the parameter's dtype) rounded once."""
    rng = np.random.default_rng(32)
    shape = (3, 5)
    p = ndl.Tensor(rng.standard_normal(shape), device=device, dtype=dtype, requires_grad=True)
    kw = dict(lr=0.1, weight_decay=0.01)
    if opt_cls is ndl.optim.SGD:
        kw["momentum"] = 0.9
    opt = opt_cls([p], **kw)
    names = ("u",) if opt_cls is ndl.optim.SGD else ("m", "v")
    for t in range(1, 4):
        p.grad = ndl.Tensor(rng.standard_normal(shape), device=device, dtype=dtype)
        wide = [_as_float32(p, device), _as_float32(p.grad, device)]
        wide += [
            _as_float32(getattr(opt, n)[p], device) if t > 1 else _tensor(np.zeros(shape), device)
            for n in names
        ]
        if opt_cls is ndl.optim.SGD:
            want = needle_c.sgd_update(*wide, 0.1, 0.9, 0.01)
        else:
            want = needle_c.adam_update(*wide, 0.1, 0.9, 0.999, 1e-8, 0.01, t)
        opt.step()
        assert p.dtype == dtype
        np.testing.assert_array_equal(
            np.asarray(p.numpy(), np.float64), np.asarray(want.astype(dtype).numpy(), np.float64)
        )
        for n, w in zip(names, wide[2:]):
            state = getattr(opt, n)[p]
            assert state.dtype == dtype
            np.testing.assert_array_equal(
                np.asarray(state.numpy(), np.float64),
                np.asarray(w.data.astype(dtype).numpy(), np.float64),
            )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_mixed_dtypes_in_one_optimizer(device, opt_cls):
    """Each parameter is updated in its own dtype, with its state in that dtype: the
    float32 and float16 ones exactly as an optimizer of their own would, the float64 one
    in float64."""
    rng = np.random.default_rng(33)
    values = [rng.standard_normal(s) for s in SHAPES[:3]]
    dtypes = ["float32", "float64", "float16"]

    def make():
        return [
            ndl.Tensor(a, device=device, dtype=d, requires_grad=True)
            for a, d in zip(values, dtypes)
        ]

    kw = dict(lr=0.05, weight_decay=0.01)
    if opt_cls is ndl.optim.SGD:
        kw["momentum"] = 0.9
    mixed = make()
    alone = make()
    opt = opt_cls(mixed, **kw)
    singles = [opt_cls([p], **kw) for p in alone]
    for _ in range(4):
        grads = [rng.standard_normal(a.shape) for a in values]
        for p, q, g, d in zip(mixed, alone, grads, dtypes):
            p.grad = ndl.Tensor(g, device=device, dtype=d)
            q.grad = ndl.Tensor(g, device=device, dtype=d)
        opt.step()
        for single in singles:
            single.step()
    for p, q, d in zip(mixed, alone, dtypes):
        assert p.dtype == d
        np.testing.assert_array_equal(np.asarray(p.numpy()), np.asarray(q.numpy()))
    states = opt.u if opt_cls is ndl.optim.SGD else opt.m
    assert [states[p].dtype for p in mixed] == dtypes
    assert _more_than_float32(mixed[1].numpy()) > mixed[1].numpy().size // 2


@pytest.mark.parametrize("device", DEVICES)
def test_float64_parameter_with_a_float32_gradient_computes_in_float64(device):
    """The update computes in the operands' promotion: float64 here, the gradient widened."""
    rng = np.random.default_rng(34)
    x = rng.standard_normal((4, 3))
    g = rng.standard_normal((4, 3)).astype(np.float32)
    p = _tensor64(x, device, True)
    opt = ndl.optim.SGD([p], lr=0.1, momentum=0.5, weight_decay=0.01)
    p.grad = _tensor(g, device)
    opt.step()
    want, want_u = _sgd64(x, np.zeros_like(x), g.astype(np.float64), 0.1, 0.5, 0.01)
    assert p.dtype == "float64" and opt.u[p].dtype == "float64"
    np.testing.assert_allclose(p.numpy(), want, rtol=F64_TOL)
    np.testing.assert_allclose(opt.u[p].numpy(), want_u, rtol=F64_TOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_engine_call_rejects_bad_input_of_other_dtypes_and_writes_nothing(device, dtype):
    """The checks run on the caller's arrays, before any conversion: a state that is the
    parameter is refused even where the update converts its operands."""
    ones = np.ones((2, 3))

    def arr(shape=(2, 3)):
        return ndl.Tensor(np.ones(shape), device=device, dtype=dtype)

    p, g, m, v = arr(), arr(), arr(), arr()
    g32 = _tensor(ones, device)
    cases = [
        ((p, arr((3, 2)), m, v, *HYPER), ValueError, r"the gradient has shape \(3, 2\)"),
        ((p, g, m, m, *HYPER), ValueError, "shares memory"),
        ((p, g, p, v, *HYPER), ValueError, "shares memory"),
        ((p, g32, p, v, *HYPER), ValueError, "shares memory"),
        ((p, g, m, v, 0.1, 0.9, 0.999, 1e-8, 0.0, 0), ValueError, "step must be"),
    ]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            needle_c.adam_update(*args)
        for t in (p, g, m, v):
            np.testing.assert_array_equal(np.asarray(t.numpy(), np.float64), ones)
    with pytest.raises(ValueError, match="momentum u shares memory"):
        needle_c.sgd_update(p, g32, p, 0.1, 0.9, 0.0)
    np.testing.assert_array_equal(np.asarray(p.numpy(), np.float64), ones)


# ------------------------------------------------------------------------------ CUDA


def cuda_test(fn):
    """Marks a test as needing the CUDA backend (skipped without; the simulator runs it)."""
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
@pytest.mark.parametrize("wd", [0.0, 0.01])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@cuda_test
def test_cuda_matches_cpu_bit_for_bit(opt_cls, wd, dtype):
    """Both backends run the same operations in the same order in the same dtype, each
    rounded (no FMA contraction on the GPU): the same bits."""
    runs = []
    for device in (ndl.cpu(), ndl.cuda()):
        rng, params = _setup(device, 18, dtype=dtype)
        kw = dict(lr=0.05, weight_decay=wd)
        if opt_cls is ndl.optim.SGD:
            kw["momentum"] = 0.9
        opt = opt_cls(params, **kw)
        for _ in range(5):
            _set_grads(params, _grads(rng, dtype=dtype), device)
            opt.step()
        runs.append([p.numpy() for p in params])
        states = opt.u if opt_cls is ndl.optim.SGD else opt.v
        runs[-1] += [states[p].numpy() for p in params]
    for a, b in zip(*runs):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, b)


def _census_step(opt_cls, with_grad, strided_grad=False, dtype="float32"):
    device = ndl.cuda()
    rng, params = _setup(device, 19, dtype=dtype)
    extra = _tensor(np.ones(7), device, True, dtype)  # never gets a gradient
    kw = dict(lr=0.01, weight_decay=0.01)
    if opt_cls is ndl.optim.SGD:
        kw["momentum"] = 0.9
    opt = opt_cls(params + [extra], **kw)

    def set_grads():
        _set_grads(params[:with_grad], _grads(rng, dtype=dtype)[:with_grad], device)
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
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@cuda_test
def test_cuda_census_one_launch_per_parameter(opt_cls, with_grad, dtype):
    """float64 operands run their own kernel, as fused as the float32 one."""
    work, sites = _census_step(opt_cls, with_grad, dtype=dtype)
    kernel = "adam_update" if opt_cls is ndl.optim.Adam else "sgd_update"
    kernel += "_f64_kernel" if dtype == "float64" else "_kernel"
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
