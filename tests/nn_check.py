"""Helpers shared by the nn module tests (test_nn_*.py): tensors from NumPy, a module checker
over both graph modes (gradients against ``gradcheck.numerical_gradient``, float64 finite
differences on a NumPy reference), the course's uniform draw, parameter and RNG-state checks,
and the NumPy references used by more than one file."""

import numpy as np

import needle as ndl
from needle import nn

from gradcheck import MODES, numerical_gradient

# --------------------------------------------------------------------------- helpers


def _t(a, device, requires_grad=True):
    return ndl.Tensor(np.asarray(a, dtype=np.float32), device=device, requires_grad=requires_grad)


def _flatten(out):
    if isinstance(out, (tuple, list)):
        return [y for o in out for y in _flatten(o)]
    return [out]


def check_module(
    module,
    inputs,
    reference,
    device,
    forward=None,
    grads=True,
    atol=1e-5,
    grad_rtol=2e-3,
    grad_atol=2e-4,
):
    """Runs ``module`` on ``inputs`` (NumPy arrays, fed as Tensors) under both graph modes.

    ``reference(*inputs, *params)`` (float64 NumPy, params in ``parameters()`` order)
    must give the same output(s); with ``grads`` the gradients of a weighted sum of the
    outputs w.r.t. every input and parameter are compared with finite differences.
    ``forward(module, *tensors)`` defaults to ``module(*tensors)``.
    """
    forward = forward or (lambda m, *ts: m(*ts))
    params = module.parameters()
    p_arrays = [p.numpy().astype(np.float64) for p in params]
    arrays = [np.asarray(a, dtype=np.float32).astype(np.float64) for a in inputs]
    refs = [np.asarray(r) for r in _flatten(reference(*arrays, *p_arrays))]
    rng = np.random.default_rng(0)
    weights = [rng.uniform(0.5, 1.5, size=r.shape) for r in refs]
    results = []
    for mode in MODES:
        for p in params:
            p.grad = None
        with ndl.autograd.graph_mode(mode):
            tensors = [_t(a, device) for a in arrays]
            outs = _flatten(forward(module, *tensors))
            assert len(outs) == len(refs)
            for o, r in zip(outs, refs):
                assert tuple(o.shape) == r.shape
                assert o.device == device
                np.testing.assert_allclose(o.numpy(), r, rtol=1e-5, atol=atol)
            if not grads:
                return
            loss = None
            for o, w in zip(outs, weights):
                term = (o * _t(w, device, requires_grad=False)).sum()
                loss = term if loss is None else loss + term
            loss.backward()
            results.append([t.grad.numpy() for t in tensors] + [p.grad.numpy() for p in params])

    def f(*a):
        return sum(float(np.sum(r * w)) for r, w in zip(_flatten(reference(*a)), weights))

    all_arrays = arrays + p_arrays
    for i in range(len(all_arrays)):
        num = numerical_gradient(f, all_arrays, i, eps=1e-6)
        for res in results:
            np.testing.assert_allclose(
                res[i], num, rtol=grad_rtol, atol=grad_atol, err_msg=f"gradient of array {i}"
            )


def _uniform_draw(shape, low, high):
    """What init.rand draws: one np.random.rand, then float32 arithmetic."""
    u = np.random.rand(*shape).astype(np.float32)
    return u * np.float32(high - low) + np.float32(low)


def _assert_params(params, expected):
    assert len(params) == len(expected)
    for k, (p, e) in enumerate(zip(params, expected)):
        assert isinstance(p, nn.Parameter)
        assert tuple(p.shape) == e.shape, f"parameter {k}"
        np.testing.assert_allclose(p.numpy(), e, rtol=1e-6, atol=1e-7, err_msg=f"parameter {k}")


def _assert_next_draw(seed_state_after):
    """The global RNG is exactly where the reproduced draws left it."""
    assert np.random.rand() == seed_state_after


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _ln_ref(x, w, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b
