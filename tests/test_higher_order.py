"""Gradients of gradients, backward on tensors without a graph, and the softmax-family
gradients (LogSumExp, LogSoftmax, SoftmaxLoss) staying normalised at large magnitudes.

- ``backward(create_graph=True)`` records the gradient graph in the default ``cycle_free``
  mode, as ``needle`` mode always does, so ``x.grad.backward()`` gives second derivatives
  (checked against the analytic ones and against finite differences of the first).
- ``backward()`` on a tensor with no graph (a constant, or a cycle_free ``.grad``) raises
  RuntimeError instead of silently doing nothing.
"""

import numpy as np
import pytest

import needle as ndl
from needle.autograd import graph_mode

from devices import DEVICES
from gradcheck import numerical_gradient

MODES = ndl.autograd.GRAPH_MODES


def _backward_recording(y, mode):
    """backward that records the gradient graph in either mode."""
    if mode == "cycle_free":
        y.backward(create_graph=True)
    else:
        y.backward()


# --------------------------------------------------------------------------
# gradients of gradients
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_course_second_derivative_example(mode):
    with graph_mode(mode):
        x2 = ndl.Tensor([6.0])
        x3 = ndl.Tensor([0.0])
        y = x2 * x2 + x2 * x3
        _backward_recording(y, mode)
        g = x2.grad
        np.testing.assert_allclose(g.numpy(), [12.0])
        assert g.requires_grad and g.op is not None
        g.backward()
        if mode == "needle":  # the course's backward replaces .grad
            np.testing.assert_allclose(x2.grad.numpy(), [2.0])
            np.testing.assert_allclose(x3.grad.numpy(), [1.0])
        else:  # PyTorch's adds to it: 12 + 2 and 6 + 1
            np.testing.assert_allclose(x2.grad.numpy(), [14.0])
            np.testing.assert_allclose(x3.grad.numpy(), [7.0])
            np.testing.assert_allclose(g.numpy(), [12.0])  # a new tensor: g is still held


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_second_derivatives_match_analytic_and_finite_differences(device, mode):
    rng = np.random.default_rng(5)
    x0 = rng.uniform(0.5, 1.5, size=(3, 4))
    w0 = rng.uniform(-1.0, 1.0, size=(3, 4))

    def first(x, w):  # d/dx of sum(w * x**3 + exp(x) * w) = 3 w x^2 + w exp(x)
        return 3 * w * x**2 + w * np.exp(x)

    with graph_mode(mode):
        x = ndl.Tensor(x0, device=device)
        w = ndl.Tensor(w0, device=device)
        y = (w * x**3 + ndl.exp(x) * w).sum()
        _backward_recording(y, mode)
        g = x.grad
        np.testing.assert_allclose(g.numpy(), first(x0, w0), rtol=1e-4)
        # d/dx sum(g) = 6 w x + w exp(x); d/dw sum(g) = 3 x^2 + exp(x); the first
        # gradients are dropped first, as PyTorch code does (cycle_free adds to .grad)
        x.grad = w.grad = None
        g.sum().backward()
        want_x = 6 * w0 * x0 + w0 * np.exp(x0)
        np.testing.assert_allclose(x.grad.numpy(), want_x, rtol=1e-4)
        np.testing.assert_allclose(w.grad.numpy(), 3 * x0**2 + np.exp(x0), rtol=1e-4)
    fd = numerical_gradient(lambda x, w: float(np.sum(first(x, w))), [x0, w0], 0, 1e-6)
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_create_graph_gradient_of_logsumexp(device):
    # Second derivative through the max-shifted softmax gradient, against finite differences
    # of the analytic first derivative (softmax).
    rng = np.random.default_rng(6)
    z0 = rng.normal(size=(2, 5))
    w0 = rng.normal(size=(2, 5))

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    z = ndl.Tensor(z0, device=device)
    ndl.logsumexp(z, axes=(1,)).sum().backward(create_graph=True)
    g, z.grad = z.grad, None
    (g * ndl.Tensor(w0, device=device)).sum().backward()
    fd = numerical_gradient(lambda z: float(np.sum(softmax(z) * w0)), [z0], 0, 1e-6)
    np.testing.assert_allclose(z.grad.numpy(), fd, rtol=1e-3, atol=1e-5)


def test_cycle_free_without_create_graph_stays_detached():
    x = ndl.Tensor([3.0])
    (x * x).backward()
    assert x.grad.op is None and not x.grad.requires_grad
    np.testing.assert_allclose(x.grad.numpy(), [6.0])


# --------------------------------------------------------------------------
# backward without a graph is an error
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_backward_on_a_tensor_without_a_graph_raises(mode):
    with graph_mode(mode):
        for t in (
            ndl.Tensor([1.0, 2.0], requires_grad=False),
            ndl.Tensor([1.0]).detach(),
            ndl.init.ones(3),
        ):
            with pytest.raises(RuntimeError, match="does not require grad"):
                t.backward()


def test_backward_on_a_cycle_free_grad_says_how_to_fix_it():
    x = ndl.Tensor([6.0])
    (x * x).backward()
    with pytest.raises(RuntimeError, match="create_graph=True"):
        x.grad.backward()
    np.testing.assert_allclose(x.grad.numpy(), [12.0])  # untouched


@pytest.mark.parametrize("mode", MODES)
def test_backward_on_a_leaf_that_requires_grad_is_fine(mode):
    with graph_mode(mode):
        x = ndl.Tensor([1.0, 2.0])
        x.backward()
        np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0])


# --------------------------------------------------------------------------
# softmax-family gradients at large magnitudes
# --------------------------------------------------------------------------


def _softmax64(z, axis):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("v", [1e5, 1e7, 1e9, -1e9])
def test_logsumexp_gradient_normalised_at_large_values(device, mode, v):
    with graph_mode(mode):
        x = ndl.Tensor(np.full((2, 1), v), device=device)
        ndl.logsumexp(x, axes=(0,)).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), np.full((2, 1), 0.5), rtol=1e-6)
        if mode == "needle":
            assert x.grad.op is not None  # a recorded graph of ops, as in the course


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", [100.0, 1e6])
def test_logsoftmax_gradient_matches_float64(device, mode, scale):
    rng = np.random.default_rng(7)
    z0 = (scale + rng.integers(-4, 5, size=(3, 6)) * (scale / 64)).astype(np.float32)
    g0 = rng.normal(size=(3, 6)).astype(np.float32)
    with graph_mode(mode):
        z = ndl.Tensor(z0, device=device)
        (ndl.logsoftmax(z) * ndl.Tensor(g0, device=device)).sum().backward()
        got = z.grad.numpy()
    z64, g64 = z0.astype(np.float64), g0.astype(np.float64)
    want = g64 - _softmax64(z64, 1) * g64.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", [100.0, 1e6, 1e9])
def test_softmax_loss_gradient_matches_float64(device, mode, scale):
    rng = np.random.default_rng(8)
    z0 = (scale + rng.integers(-4, 5, size=(4, 5)) * (scale / 64)).astype(np.float32)
    y0 = rng.integers(0, 5, size=4)
    with graph_mode(mode):
        z = ndl.Tensor(z0, device=device)
        ndl.nn.SoftmaxLoss()(z, ndl.Tensor(y0.astype(np.float32), device=device)).backward()
        got = z.grad.numpy()
    want = _softmax64(z0, 1)
    want[np.arange(4), y0] -= 1.0
    want /= 4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 0.0, atol=1e-6)
