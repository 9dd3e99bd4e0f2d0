"""Autograd inputs that used to hang, lie or leak state across threads: a
cycle in ``.inputs``, an ``out_grad`` or a Python gradient of the wrong
shape, ``scalar ** tensor`` at bases <= 0, and ``no_grad()`` in one thread
turning recording off in another."""

import threading

import numpy as np
import pytest

import needle as ndl

from devices import DEVICES


def _t(values, device, requires_grad=True):
    return ndl.Tensor(
        np.asarray(values, dtype=np.float32), device=device, requires_grad=requires_grad
    )


@pytest.mark.parametrize("mode", ndl.autograd.GRAPH_MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_a_cycle_in_inputs_is_an_error_not_a_hang(device, mode):
    a = _t([1.0, 2.0], device)
    with ndl.autograd.graph_mode(mode):
        b = a * 2.0
        c = b + a
        b.inputs = [c]  # c -> b -> c
        with pytest.raises(ValueError, match="graph has a cycle"):
            c.backward()
        with pytest.raises(ValueError, match="graph has a cycle"):
            ndl.autograd.find_topo_sort([c])
        # a node among its own inputs
        d = a + a
        d.inputs = [d, a]
        with pytest.raises(ValueError, match="graph has a cycle"):
            d.backward()
    e = (a * 3.0).sum()
    e.backward()
    np.testing.assert_allclose(a.grad.numpy(), [3.0, 3.0])


@pytest.mark.parametrize("device", DEVICES)
def test_a_shared_input_is_not_a_cycle(device):
    a = _t([1.0, 2.0], device)
    b = a * a
    c = (b + b) * a
    order = ndl.autograd.find_topo_sort([c])
    assert order.index(a) < order.index(b) < order.index(c)
    c.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), 6.0 * a.numpy() ** 2, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_out_grad_of_the_wrong_shape_is_an_error(device):
    a = _t([[1.0, 2.0], [3.0, 4.0]], device)
    y = a * 2.0
    with pytest.raises(ValueError, match="output's shape"):
        y.backward(_t([1.0, 1.0], device))
    with pytest.raises(TypeError, match="out_grad must be a Tensor"):
        y.backward(np.ones((2, 2)))
    assert a.grad is None
    y.backward(_t([[1.0, 0.0], [0.0, 1.0]], device))
    np.testing.assert_allclose(a.grad.numpy(), [[2.0, 0.0], [0.0, 2.0]])


class _WrongShapeGradient(ndl.autograd.TensorOp):
    def compute(self, a):
        return a * 2.0

    def gradient(self, out_grad, node):
        return ndl.summation(out_grad, axes=(0,))  # drops a dimension


class _NotATensorGradient(ndl.autograd.TensorOp):
    def compute(self, a):
        return a * 2.0

    def gradient(self, out_grad, node):
        return out_grad.numpy()


@pytest.mark.parametrize("mode", ndl.autograd.GRAPH_MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_a_python_gradient_of_the_wrong_shape_or_type_is_an_error(device, mode):
    a = _t([[1.0, 2.0], [3.0, 4.0]], device)
    with ndl.autograd.graph_mode(mode):
        with pytest.raises(ValueError, match="wrong shape for input 0"):
            _WrongShapeGradient()(a).sum().backward()
        with pytest.raises(TypeError, match="not a Tensor"):
            _NotATensorGradient()(a).sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_power_of_a_tensor_matches_numpy_at_every_base(device):
    x = _t([0.0, 1.0, 2.0, 3.0], device)
    for base in (0.0, 2.0, -2.0, 0.5):
        got = (base**x).numpy()
        np.testing.assert_allclose(got, np.power(np.float32(base), x.numpy()), rtol=1e-6)
    y = (3.0**x).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.log(3.0) * 3.0 ** x.numpy(), rtol=1e-5)


def test_no_grad_in_one_thread_leaves_recording_on_in_another():
    a = _t([1.0, 2.0], ndl.cpu())
    inside = threading.Event()
    release = threading.Event()
    seen = {}

    def quiet():
        with ndl.no_grad():
            inside.set()
            release.wait(10)
            seen["quiet"] = (a * 2.0).op

    thread = threading.Thread(target=quiet)
    thread.start()
    assert inside.wait(10)
    try:
        recorded = a * 2.0
        seen["main"] = recorded.op
        (recorded.sum()).backward()
    finally:
        release.set()
        thread.join(10)
    assert seen["quiet"] is None
    assert isinstance(seen["main"], ndl.ops.MulScalar)
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 2.0])
    assert ndl.autograd.is_grad_enabled()
