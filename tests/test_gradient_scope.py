"""Gradients and computes hold what they read (needle_c/autograd/grad_scope.c,
dispatch.c).

A gradient allocates, so a collection can run in the middle of it, and with
it any gc callback or finalizer. Such code may replace a graph node's
``cached_data`` or ``inputs`` while a gradient is reading them; the gradient
must keep working on the objects it started with (it holds them), and give
the same values as an undisturbed backward pass. The collector runs at nearly
every allocation here (``gc.set_threshold(1)``) and a gc callback swaps every
node's data for an equal copy and every node's inputs tuple for a new one
(the old tuple is freed; the same tensors stay reachable, so the gradients
must come out unchanged). Run under the sanitizer build, a borrowed reference
here is a heap-use-after-free report.
"""

import gc

import numpy as np
import pytest

import needle as ndl

from devices import DEVICES


def _arr(seed, shape):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape).astype(np.float32)


def _copy(array):
    return ndl.NDArray(array.numpy(), device=array.device)


def _graph(device):
    """A loss over every op whose gradient reads a node's data or inputs."""
    x = ndl.Tensor(_arr(0, (4, 5)), device=device)
    w = ndl.Tensor(_arr(1, (5, 6)), device=device)
    labels = ndl.Tensor(
        np.array([0, 5, 2, 3], dtype=np.float32), device=device, requires_grad=False
    )
    h = ndl.relu(x @ w)  # relu reads its output's data
    m = ndl.max(h / (h + 2.0), axes=(1,))  # max reads input and output data; div reads inputs
    parts = ndl.split(ndl.tanh(h), axis=1)  # tuple ops read the tuple's data
    stacked = ndl.stack([parts[i] * parts[5 - i] for i in range(6)], axis=1)
    loss = ndl.softmax_cross_entropy(stacked.exp() + x.sum(axes=(1,)).reshape((4, 1)), labels)
    return (x, w), loss + m.sum() + ndl.logsumexp(h, axes=(1,)).sum()


def _grads(device, mode):
    with ndl.autograd.graph_mode(mode):
        leaves, loss = _graph(device)
        loss.backward()
        return [leaf.grad.numpy() for leaf in leaves]


@pytest.mark.parametrize("mode", ndl.autograd.GRAPH_MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_gradients_hold_what_a_collection_replaces(device, mode):
    expected = _grads(device, mode)
    nodes = []

    def meddle(phase, info):
        if phase != "start":
            return
        for node in list(nodes):
            data = node.cached_data
            if isinstance(data, ndl.NDArray):
                node.cached_data = _copy(data)
            elif isinstance(data, tuple):
                node.cached_data = tuple(_copy(item) for item in data)
            if node.inputs:
                node.inputs = list(node.inputs)  # a new tuple: the old one is freed

    threshold = gc.get_threshold()
    gc.callbacks.append(meddle)
    gc.set_threshold(1, 1, 1)
    try:
        with ndl.autograd.graph_mode(mode):
            leaves, loss = _graph(device)
            nodes.extend(ndl.autograd.find_topo_sort([loss]))
            loss.backward()
            got = [leaf.grad.numpy() for leaf in leaves]
    finally:
        gc.callbacks.remove(meddle)
        gc.set_threshold(*threshold)
        nodes.clear()
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_node_fields_reject_what_c_code_cannot_read(device):
    t = ndl.Tensor(_arr(2, (2, 3)), device=device)
    y = t * 2.0
    with pytest.raises(TypeError, match="op must be an Op"):
        y.op = object()
    with pytest.raises(TypeError, match="cached_data must be"):
        y.cached_data = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(TypeError, match="cached_data must be"):
        y.cached_data = (ndl.NDArray(np.zeros(2), device=device), 3)
    with pytest.raises(TypeError, match="op inputs must be Tensors"):
        y.inputs = [t, 1.0]
    # the node is unchanged and still differentiates
    assert isinstance(y.op, ndl.ops.MulScalar)
    y.sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), np.full((2, 3), 2.0, dtype=np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_of_a_node_with_too_few_inputs_is_an_error(device):
    a = ndl.Tensor(_arr(3, (2, 2)), device=device)
    b = ndl.Tensor(_arr(4, (2, 2)), device=device)
    with ndl.autograd.graph_mode("needle"):
        c = a + b
        c.inputs = [a]  # EWiseAdd takes two
        with pytest.raises(ValueError, match="EWiseAdd takes 2 inputs"):
            c.backward()
    # the process goes on working
    (a * b).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), b.numpy())
