"""Tests for needle.optim: SGD (momentum, weight decay) and Adam against NumPy
re-implementations, clip_grad_norm on every optimizer, reset_grad and zero_grad, and that
updates record no graph and do not grow the number of live tensors."""

import gc

import numpy as np
import pytest

import needle as ndl

from devices import DEVICES

SHAPES = [(4, 3), (1, 3), (5,)]


def _params(device, rng):
    return [
        ndl.Tensor(rng.standard_normal(s).astype(np.float32), device=device, requires_grad=True)
        for s in SHAPES
    ]


def _grads(rng):
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _set_grads(params, grads, device):
    for p, g in zip(params, grads):
        p.grad = ndl.Tensor(g, device=device, requires_grad=False)


def _sgd_reference(x0, grad_seq, lr, momentum, wd):
    x = [a.astype(np.float64) for a in x0]
    u = [np.zeros_like(a) for a in x]
    for grads in grad_seq:
        for k, g in enumerate(grads):
            g = g + wd * x[k]
            u[k] = momentum * u[k] + (1 - momentum) * g
            x[k] = x[k] - lr * u[k]
    return x


def _adam_reference(x0, grad_seq, lr, b1, b2, eps, wd):
    x = [a.astype(np.float64) for a in x0]
    m = [np.zeros_like(a) for a in x]
    v = [np.zeros_like(a) for a in x]
    for t, grads in enumerate(grad_seq, start=1):
        for k, g in enumerate(grads):
            g = g + wd * x[k]
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat = m[k] / (1 - b1**t)
            v_hat = v[k] / (1 - b2**t)
            x[k] = x[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return x


def _run(opt_cls, kwargs, device, steps=5, seed=0):
    rng = np.random.default_rng(seed)
    params = _params(device, rng)
    x0 = [p.numpy().copy() for p in params]
    grad_seq = [_grads(rng) for _ in range(steps)]
    opt = opt_cls(params, **kwargs)
    for grads in grad_seq:
        _set_grads(params, grads, device)
        opt.step()
    return params, x0, grad_seq, opt


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_sgd_matches_numpy(device, momentum, wd):
    lr = 0.1
    params, x0, grad_seq, _ = _run(
        ndl.optim.SGD, dict(lr=lr, momentum=momentum, weight_decay=wd), device
    )
    expected = _sgd_reference(x0, grad_seq, lr, momentum, wd)
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.numpy(), e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wd", [0.0, 0.01])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.5, 0.9)])
def test_adam_matches_numpy(device, wd, betas):
    lr, eps = 0.01, 1e-8
    params, x0, grad_seq, opt = _run(
        ndl.optim.Adam,
        dict(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=wd),
        device,
    )
    expected = _adam_reference(x0, grad_seq, lr, betas[0], betas[1], eps, wd)
    assert opt.t == len(grad_seq)
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.numpy(), e, rtol=1e-5, atol=1e-5)


def test_defaults():
    sgd = ndl.optim.SGD([])
    assert (sgd.lr, sgd.momentum, sgd.weight_decay) == (0.01, 0.0, 0.0)
    adam = ndl.optim.Adam([])
    assert (adam.lr, adam.beta1, adam.beta2, adam.eps, adam.weight_decay, adam.t) == (
        0.01,
        0.9,
        0.999,
        1e-8,
        0.0,
        0,
    )
    assert isinstance(sgd, ndl.optim.Optimizer) and isinstance(adam, ndl.optim.Optimizer)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_params_without_grad_are_skipped(device, opt_cls):
    rng = np.random.default_rng(1)
    params = _params(device, rng)
    before = [p.numpy().copy() for p in params]
    params[1].grad = ndl.Tensor(_grads(rng)[1], device=device, requires_grad=False)
    opt = opt_cls(params, lr=0.1)
    opt.step()
    np.testing.assert_array_equal(params[0].numpy(), before[0])
    np.testing.assert_array_equal(params[2].numpy(), before[2])
    assert not np.array_equal(params[1].numpy(), before[1])


def _clip_reference(grads, max_norm):
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
    coef = max_norm / (norm + 1e-6)
    return norm, [g * min(coef, 1.0) for g in grads]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_clip_grad_norm_scales(device, opt_cls):
    rng = np.random.default_rng(2)
    params = _params(device, rng)
    grads = _grads(rng)
    _set_grads(params, grads, device)
    old = [p.grad for p in params]
    opt = opt_cls(params)
    norm = opt.clip_grad_norm(max_norm=0.25)
    ref_norm, expected = _clip_reference(grads, 0.25)
    assert norm == pytest.approx(ref_norm, rel=1e-6)
    for p, e, o, g in zip(params, expected, old, grads):
        assert p.grad is not o  # replaced, not modified in place
        np.testing.assert_array_equal(o.numpy(), g)
        np.testing.assert_allclose(p.grad.numpy(), e, rtol=1e-6, atol=1e-7)
    clipped = np.sqrt(sum(np.sum(p.grad.numpy().astype(np.float64) ** 2) for p in params))
    assert clipped == pytest.approx(0.25, rel=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_clip_grad_norm_and_step_in_float64(device):
    """float64 gradients are scaled in float64 (their values keep float64's precision), and
    the step after the clip computes in float64 too."""
    rng = np.random.default_rng(9)
    x0 = [rng.standard_normal(s) for s in SHAPES]
    grads = [rng.standard_normal(s) * 3 for s in SHAPES]
    params = [ndl.Tensor(x, device=device, dtype="float64", requires_grad=True) for x in x0]
    for p, g in zip(params, grads):
        p.grad = ndl.Tensor(g, device=device, dtype="float64")
    opt = ndl.optim.SGD(params, lr=0.1, momentum=0.5, weight_decay=0.01)
    norm = opt.clip_grad_norm(max_norm=0.25)
    ref_norm, expected = _clip_reference(grads, 0.25)
    assert norm == pytest.approx(ref_norm, rel=1e-13)
    for p, e in zip(params, expected):
        got = p.grad.numpy()
        assert p.grad.dtype == "float64"
        np.testing.assert_allclose(got, e, rtol=1e-15)
        assert np.sum(got != got.astype(np.float32)) > got.size // 2
    opt.step()
    want = _sgd_reference(x0, [expected], 0.1, 0.5, 0.01)
    for p, w in zip(params, want):
        assert p.dtype == "float64"
        np.testing.assert_allclose(p.numpy(), w, rtol=1e-13)
        assert np.sum(p.numpy() != p.numpy().astype(np.float32)) > w.size // 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_clip_grad_norm_skips_under_norm(device, opt_cls):
    rng = np.random.default_rng(3)
    params = _params(device, rng)
    grads = [g * 1e-3 for g in _grads(rng)]
    _set_grads(params, grads, device)
    old = [p.grad for p in params]
    params.append(ndl.Tensor(np.ones(2, dtype=np.float32), device=device))  # grad None
    opt = opt_cls(params)
    opt.clip_grad_norm(max_norm=10.0)
    for p, o, g in zip(params, old, grads):
        assert p.grad is o
        np.testing.assert_array_equal(p.grad.numpy(), g)
    assert params[-1].grad is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
def test_reset_grad(device, opt_cls):
    rng = np.random.default_rng(4)
    params = _params(device, rng)
    _set_grads(params, _grads(rng), device)
    opt = opt_cls(params)
    opt.reset_grad()
    assert all(p.grad is None for p in params)


def _typed_params_with_grads(device, dtype, rng):
    """The SHAPES' parameters in ``dtype`` with gradients, except the second (grad None).
    The float64 values are not float32's: a float64 step computes in float64, so a zero
    gradient leaves them exactly as they were."""
    params = [
        ndl.Tensor(
            rng.standard_normal(s),
            device=device,
            dtype=dtype,
            requires_grad=True,
        )
        for s in SHAPES
    ]
    for i, p in enumerate(params):
        if i != 1:
            p.grad = ndl.Tensor(rng.standard_normal(p.shape), device=device, dtype=dtype)
    return params


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kwargs", [{}, {"set_to_none": True}])
def test_zero_grad_sets_to_none(device, opt_cls, dtype, kwargs):
    params = _typed_params_with_grads(device, dtype, np.random.default_rng(6))
    assert params[0].grad is not None
    opt_cls(params).zero_grad(**kwargs)
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_zero_grad_to_zeros(device, opt_cls, dtype):
    params = _typed_params_with_grads(device, dtype, np.random.default_rng(7))
    old = params[0].grad
    old_values = old.numpy().copy()
    opt_cls(params).zero_grad(set_to_none=False)
    assert params[1].grad is None  # None stays None, as in PyTorch
    for p in (params[0], params[2]):
        g = p.grad
        assert tuple(g.shape) == tuple(p.shape)
        assert g.dtype == dtype and g.device == device
        assert not g.requires_grad and g.op is None
        np.testing.assert_array_equal(g.numpy(), np.zeros(p.shape))
    # A new tensor: the old gradient keeps its values (not PyTorch's in-place zero_()).
    assert params[0].grad is not old
    np.testing.assert_array_equal(old.numpy(), old_values)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_step_after_zero_grad_to_zeros_keeps_params(device, opt_cls, dtype):
    params = _typed_params_with_grads(device, dtype, np.random.default_rng(8))
    before = [p.numpy().copy() for p in params]
    kwargs = dict(lr=0.1, momentum=0.9) if opt_cls is ndl.optim.SGD else dict(lr=0.1)
    opt = opt_cls(params, weight_decay=0.0, **kwargs)
    opt.zero_grad(set_to_none=False)
    opt.step()
    for p, b in zip(params, before):
        assert p.dtype == dtype
        np.testing.assert_array_equal(p.numpy(), b)


@pytest.mark.parametrize("bad", [None, 0, 1, "False", np.bool_(True)])
def test_zero_grad_bad_set_to_none(bad):
    opt = ndl.optim.SGD([ndl.Tensor(np.ones(2, np.float32), requires_grad=True)])
    with pytest.raises(TypeError, match="zero_grad: set_to_none must be a bool, got"):
        opt.zero_grad(set_to_none=bad)


def test_zero_grad_goes_through_an_overridden_reset_grad():
    calls = []

    class Counting(ndl.optim.SGD):
        def reset_grad(self):
            calls.append("reset")
            super().reset_grad()

    p = ndl.Tensor(np.ones(2, np.float32), requires_grad=True)
    p.grad = ndl.Tensor(np.ones(2, np.float32))
    Counting([p]).zero_grad()
    assert calls == ["reset"] and p.grad is None


def _train_steps(opt_cls, device, steps, counts, clip):
    rng = np.random.default_rng(5)
    W = ndl.nn.Parameter(ndl.Tensor(rng.standard_normal((6, 4)).astype(np.float32), device=device))
    b = ndl.nn.Parameter(ndl.Tensor(rng.standard_normal((1, 4)).astype(np.float32), device=device))
    X = ndl.Tensor(
        rng.standard_normal((8, 6)).astype(np.float32), device=device, requires_grad=False
    )
    opt = opt_cls([W, b], lr=0.01, weight_decay=0.01)
    for _ in range(steps):
        out = ndl.exp(X @ W + b.broadcast_to((8, 4)))
        loss = (out * out).sum()
        opt.reset_grad()
        loss.backward()
        if clip is not None:
            opt.clip_grad_norm(clip)
        opt.step()
        del out, loss
        gc.collect()
        counts.append(ndl.autograd.TENSOR_COUNTER)
    return W, b, opt


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [ndl.optim.SGD, ndl.optim.Adam])
@pytest.mark.parametrize("mode", ndl.autograd.GRAPH_MODES)
@pytest.mark.parametrize("clip", [None, 1.0])
def test_updates_record_no_graph_and_do_not_leak(device, opt_cls, mode, clip):
    """In "needle" mode p.grad is itself a recorded graph; the update must not extend it."""
    counts = []
    with ndl.autograd.graph_mode(mode):
        W, b, opt = _train_steps(opt_cls, device, 6, counts, clip)
    for p in (W, b):
        assert p.op is None
        assert p.requires_grad
    states = [v for name in ("u", "m", "v") for v in getattr(opt, name, {}).values()]
    assert states
    for s in states:
        assert s.op is None and not s.requires_grad
    # After the first steps (which create the optimizer state) the count is flat.
    assert counts[2:] == [counts[2]] * len(counts[2:]), counts
