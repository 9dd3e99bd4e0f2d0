"""The gradients of shape ops are views of their out_grad where a view can hold them
(needle_c/autograd/ops_basic.c, ops_nn.c, grad_scope.c), so the graph the course's "needle"
mode keeps until ``reset_grad()`` holds no copy of them; and a backward pass that adds
gradients in place never writes into a buffer such a view shares.

Storage sharing is read from the arrays' data pointers (``__array_interface__`` on the CPU,
``__cuda_array_interface__`` on CUDA) less their offsets, and from needle's allocated bytes,
which a view leaves unchanged. Every test runs on every device in ``DEVICES`` under both
graph modes.
"""

import numpy as np
import pytest

import needle as ndl

from devices import DEVICES
from gradcheck import check_op
from op_refs import rnd

MODES = ndl.autograd.GRAPH_MODES
FLOAT_BYTES = 4


def _storage_start(array):
    """The address of the first element of the storage that ``array`` views."""
    if array.device.name == "cuda":
        pointer = array.__cuda_array_interface__["data"][0]
    else:
        pointer = array.__array_interface__["data"][0]
    return pointer - array._offset * FLOAT_BYTES


def _shares_storage(a, b):
    return _storage_start(a) == _storage_start(b) and a._storage_size == b._storage_size


def _tensor(seed, shape, device, requires_grad=True):
    data = np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape).astype(np.float32)
    return ndl.Tensor(data, device=device, requires_grad=requires_grad)


def _gradient(fn, in_shape, device, mode):
    """(out_grad, its gradients w.r.t. fn's input, the bytes the gradient allocated)."""
    with ndl.autograd.graph_mode(mode):
        x = _tensor(0, in_shape, device)
        node = fn(x)
        out_grad = _tensor(1, node.shape, device, requires_grad=False)
        before = ndl.memory.memory_allocated(device)
        grads = node.op.gradient_as_tuple(out_grad, node)
        allocated = ndl.memory.memory_allocated(device) - before
        return out_grad, grads, allocated


# fn, the input's shape, and the view of out_grad's values (NumPy) its gradient must be.
VIEW_GRADIENTS = {
    "transpose_last": (lambda x: ndl.transpose(x), (2, 3, 4), lambda g: np.swapaxes(g, 1, 2)),
    "transpose_axes": (lambda x: ndl.transpose(x, (0, 2)), (2, 3, 4), lambda g: g.swapaxes(0, 2)),
    "reshape": (lambda x: ndl.reshape(x, (4, 6)), (2, 3, 4), lambda g: g.reshape(2, 3, 4)),
    "reshape_add_dims": (lambda x: ndl.reshape(x, (1, 6, 1)), (6,), lambda g: g.reshape(6)),
    "broadcast_new_leading_ones": (
        lambda x: ndl.broadcast_to(x, (1, 1, 3)),
        (3,),
        lambda g: g.reshape(3),
    ),
    "broadcast_same_shape": (lambda x: ndl.broadcast_to(x, (2, 3)), (2, 3), lambda g: g),
    "summation_expands": (
        lambda x: ndl.summation(x, axes=(1,)),
        (2, 3, 4),
        lambda g: np.broadcast_to(g.reshape(2, 1, 4), (2, 3, 4)),
    ),
    "flip": (lambda x: ndl.flip(x, (0, 1)), (3, 4), lambda g: g[::-1, ::-1]),
    "undilate_of_dilate": (
        lambda x: ndl.dilate(x, (0,), 1),
        (3, 2),
        lambda g: g[::2],
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(VIEW_GRADIENTS))
@pytest.mark.parametrize("device", DEVICES)
def test_shape_gradient_is_a_view_of_out_grad(device, case, mode):
    fn, in_shape, expected = VIEW_GRADIENTS[case]
    out_grad, grads, allocated = _gradient(fn, in_shape, device, mode)
    (grad,) = grads
    assert tuple(grad.shape) == in_shape
    np.testing.assert_array_equal(grad.numpy(), expected(out_grad.numpy()))
    assert _shares_storage(grad.cached_data, out_grad.cached_data), case
    assert allocated == 0, f"{case}: the gradient allocated {allocated} bytes"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_scatter_slice_gradient_is_a_view(device, mode):
    # GetItem's gradient scatters (a new array); ScatterSlice's gradient is out_grad[key].
    with ndl.autograd.graph_mode(mode):
        x = _tensor(0, (3, 4), device)
        scattered = x[1:3, 0:2].op.gradient_as_tuple(_tensor(1, (2, 2), device), x[1:3, 0:2])[0]
        out_grad = _tensor(2, (3, 4), device, requires_grad=False)
        (grad,) = scattered.op.gradient_as_tuple(out_grad, scattered)
    np.testing.assert_array_equal(grad.numpy(), out_grad.numpy()[1:3, 0:2])
    assert _shares_storage(grad.cached_data, out_grad.cached_data)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_stack_gradient_splits_into_views(device, mode):
    with ndl.autograd.graph_mode(mode):
        parts = [_tensor(i, (2, 3), device) for i in range(3)]
        node = ndl.stack(parts, axis=1)
        out_grad = _tensor(5, (2, 3, 3), device, requires_grad=False)
        (grads,) = node.op.gradient_as_tuple(out_grad, node)
        pieces = [grads[i] for i in range(3)]
    for i, piece in enumerate(pieces):
        np.testing.assert_array_equal(piece.numpy(), out_grad.numpy()[:, i, :])
        assert _shares_storage(piece.cached_data, out_grad.cached_data)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_add_gradient_of_a_leading_one_operand_is_a_view(device, mode):
    # a (1, 3) + b (3,): b's gradient drops the length-1 axis, a reshape of out_grad.
    with ndl.autograd.graph_mode(mode):
        a, b = _tensor(0, (1, 3), device), _tensor(1, (3,), device)
        node = a + b
        out_grad = _tensor(2, (1, 3), device, requires_grad=False)
        ga, gb = node.op.gradient_as_tuple(out_grad, node)
    np.testing.assert_array_equal(gb.numpy(), out_grad.numpy().reshape(3))
    assert ga is out_grad or _shares_storage(ga.cached_data, out_grad.cached_data)
    assert _shares_storage(gb.cached_data, out_grad.cached_data)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_gradient_still_sums_longer_axes(device, mode):
    # (2, 1) -> (4, 2, 3): the axes of length 4 and 3 are summed, a new array.
    out_grad, (grad,), _ = _gradient(lambda x: ndl.broadcast_to(x, (4, 2, 3)), (2, 1), device, mode)
    np.testing.assert_allclose(
        grad.numpy(), out_grad.numpy().sum(axis=(0, 2)).reshape(2, 1), rtol=1e-6
    )
    assert not _shares_storage(grad.cached_data, out_grad.cached_data)


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((1, 3), (3,)), ((1, 1, 3), (2, 1, 3)), ((2, 3), (1, 1, 3)), ((1, 2, 1), (2, 4))],
)
@pytest.mark.parametrize(
    "fn,reference",
    [
        (lambda a, b: a + b, np.add),
        (lambda a, b: a * b, np.multiply),
        (lambda a, b: a / (b * b + 1.0), lambda a, b: a / (b * b + 1.0)),
    ],
    ids=["add", "mul", "div"],
)
@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_gradients_with_length_one_axes(device, fn, reference, a_shape, b_shape):
    # Gradients summed back over broadcast axes, where some axes of length 1 are only
    # reshaped away: finite differences in both graph modes.
    check_op(fn, rnd(0, a_shape), rnd(1, b_shape), device=device, reference=reference)


# ---------------------------------------------------------- in-place accumulation


# Two ways into x's gradient through a retained intermediate y: (y, y -> x's shape).
SHARING_PATHS = {
    "reshape": (
        lambda x: ndl.reshape(x, (6,)),
        lambda y: ndl.reshape(y, (2, 3)),
        lambda g: g.reshape(6),
    ),
    "transpose": (lambda x: ndl.transpose(x), lambda y: ndl.transpose(y), lambda g: g.T),
}


@pytest.mark.parametrize("view_first", [True, False])
@pytest.mark.parametrize("path", sorted(SHARING_PATHS))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_accumulation_never_writes_into_a_shared_view(device, mode, path, view_first):
    """x's gradient is the sum of a view of y.grad (y = a shape op of x, retained) and
    c * d; a backward that adds in place must not add the other term into the view's
    buffer, which y.grad shares. Both orders of the two terms, so that either is the
    running sum."""
    to_y, back, y_grad_of = SHARING_PATHS[path]
    c = np.random.default_rng(3).uniform(0.5, 1.5, size=(2, 3)).astype(np.float32)
    d = np.random.default_rng(4).uniform(0.5, 1.5, size=(2, 3)).astype(np.float32)
    with ndl.autograd.graph_mode(mode):
        x = _tensor(0, (2, 3), device)
        y = to_y(x)
        y.retain_grad()
        through_view = back(y) * ndl.Tensor(c, device=device)
        direct = x * ndl.Tensor(d, device=device)
        terms = (through_view, direct) if view_first else (direct, through_view)
        loss = ndl.summation(terms[0] + terms[1])
        loss.backward()
    np.testing.assert_allclose(y.grad.numpy(), y_grad_of(c), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), c + d, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_retained_gradient_and_its_view_stay_right(device, mode):
    """y = x^T used three times: y's gradient is a running sum of three terms and x's a
    transposed view of it, so x.grad shares y.grad's storage; a later backward that
    replaces (needle mode) or adds to (cycle_free) x.grad leaves the old gradients as they
    were."""
    w = [
        np.random.default_rng(10 + i).uniform(0.5, 1.5, size=(3, 2)).astype(np.float32)
        for i in range(3)
    ]
    with ndl.autograd.graph_mode(mode):
        x = _tensor(0, (2, 3), device)
        y = ndl.transpose(x)
        y.retain_grad()
        terms = [y * ndl.Tensor(wi, device=device) for wi in w]
        ndl.summation(terms[0] + terms[1] + terms[2]).backward()
        old_x_grad, old_y_grad = x.grad, y.grad
        assert _shares_storage(old_x_grad.cached_data, old_y_grad.cached_data)
        y2 = ndl.transpose(x)
        y2.retain_grad()
        ndl.summation(
            y2 * ndl.Tensor(w[0], device=device) + x.transpose() * ndl.Tensor(w[1], device=device)
        ).backward()
    total = w[0] + w[1] + w[2]
    np.testing.assert_allclose(old_y_grad.numpy(), total, rtol=1e-6)
    np.testing.assert_allclose(old_x_grad.numpy(), total.T, rtol=1e-6)
    later = (w[0] + w[1]).T if mode == "needle" else (total + w[0] + w[1]).T
    np.testing.assert_allclose(x.grad.numpy(), later, rtol=1e-6)
