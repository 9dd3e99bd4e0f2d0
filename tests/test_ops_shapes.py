"""Tensor ops that move data: transpose, reshape, broadcast_to, summation, max, matmul,
stack, split, flip, dilate/undilate, tuples and getitem, checked by
``gradcheck.check_op`` on every device in ``DEVICES`` under both graph modes."""

import numpy as np
import pytest

import needle as ndl

from devices import dev
from gradcheck import MODES, check_op
from op_refs import SHAPE, dilate_ref, red_ref, rnd, undilate_ref

# --------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,axes",
    [
        ((3, 4), None),
        ((2, 3, 4), None),
        ((2, 3, 4), (0, 2)),
        ((2, 3, 4), (0, 1)),
        ((2, 3, 4), (2, 1)),
    ],
)
@dev
def test_transpose(device, shape, axes):
    ax = (-2, -1) if axes is None else axes
    ref = lambda a: np.swapaxes(a, *ax)  # noqa: E731
    check_op(lambda a: ndl.transpose(a, axes), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.Transpose(axes)(a), rnd(1, shape), device=device, reference=ref)
    check_op(lambda a: a.transpose(axes), rnd(2, shape), device=device, reference=ref)


@dev
def test_transpose_method_default(device):
    check_op(
        lambda a: a.transpose(),
        rnd(0, (2, 3, 4)),
        device=device,
        reference=lambda a: np.swapaxes(a, 1, 2),
    )


@pytest.mark.parametrize(
    "shape,new",
    [
        ((3, 4), (12,)),
        ((3, 4), (2, 6)),
        ((2, 3, 4), (4, 6)),
        ((2, 3, 4), (4, 3, 2)),
        ((6,), (1, 6, 1)),
    ],
)
@dev
def test_reshape(device, shape, new):
    ref = lambda a: a.reshape(new)  # noqa: E731
    check_op(lambda a: ndl.reshape(a, new), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.Reshape(new)(a), rnd(1, shape), device=device, reference=ref)
    check_op(lambda a: a.reshape(new), rnd(2, shape), device=device, reference=ref)


@dev
def test_reshape_of_transposed(device):
    check_op(
        lambda a: ndl.reshape(ndl.transpose(a), (12,)),
        rnd(0, (3, 4)),
        device=device,
        reference=lambda a: a.T.reshape(12),
    )


@pytest.mark.parametrize(
    "shape,new",
    [
        ((3, 1), (3, 4)),
        ((1, 4), (3, 4)),
        ((4,), (2, 3, 4)),
        ((1,), (5,)),
        ((2, 1, 3), (2, 4, 3)),
        ((1, 1), (2, 3)),
        ((3,), (3,)),
        ((3,), (1, 1, 3)),
        ((1, 3), (1, 2, 3)),
    ],
)
@dev
def test_broadcast_to(device, shape, new):
    ref = lambda a: np.broadcast_to(a, new)  # noqa: E731
    check_op(lambda a: ndl.broadcast_to(a, new), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.BroadcastTo(new)(a), rnd(1, shape), device=device, reference=ref)
    check_op(lambda a: a.broadcast_to(new), rnd(2, shape), device=device, reference=ref)


@pytest.mark.parametrize(
    "shape,axes",
    [
        ((3, 4), None),
        ((5,), None),
        ((2, 3, 4), None),
        ((3, 4), 0),
        ((3, 4), 1),
        ((2, 3, 4), 1),
        ((2, 3, 4), (0, 2)),
        ((2, 3, 4), (1,)),
        ((2, 3, 4), (2, 0)),
    ],
)
@dev
def test_summation(device, shape, axes):
    ref = red_ref(np.sum, axes)
    check_op(lambda a: ndl.summation(a, axes), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.Summation(axes)(a), rnd(1, shape), device=device, reference=ref)
    check_op(lambda a: a.sum(axes), rnd(2, shape), device=device, reference=ref)
    check_op(lambda a: ndl.summation(a, axes=axes), rnd(3, shape), device=device, reference=ref)


@dev
def test_summation_none_has_shape_1(device):
    t = ndl.Tensor(rnd(0, (2, 3, 4)), device=device)
    assert ndl.summation(t).shape == (1,)
    assert t.sum().shape == (1,)
    assert ndl.summation(t, axes=(1,)).shape == (2, 4)
    assert ndl.summation(t, axes=1).shape == (2, 4)


@pytest.mark.parametrize(
    "shape,axes",
    [
        ((3, 4), None),
        ((2, 3, 4), None),
        ((3, 4), 0),
        ((3, 4), 1),
        ((2, 3, 4), (0, 2)),
        ((2, 3, 4), (1,)),
    ],
)
@dev
def test_max(device, shape, axes):
    ref = red_ref(np.max, axes)
    check_op(lambda a: ndl.max(a, axes), rnd(0, shape, "distinct"), device=device, reference=ref)
    check_op(
        lambda a: ndl.ops.Max(axes)(a), rnd(1, shape, "distinct"), device=device, reference=ref
    )


@dev
def test_max_ties_split_gradient_evenly(device):
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0], [5.0, 5.0, 5.0]], dtype=np.float32)
    for mode in MODES:
        with ndl.autograd.graph_mode(mode):
            t = ndl.Tensor(x, device=device)
            m = ndl.max(t, axes=(1,))
            np.testing.assert_array_equal(m.numpy(), [3.0, 2.0, 5.0])
            m.sum().backward()
            np.testing.assert_allclose(
                t.grad.numpy(), [[0.0, 0.5, 0.5], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6
            )
            t2 = ndl.Tensor(np.array([[1.0, 4.0], [4.0, 2.0]], dtype=np.float32), device=device)
            m2 = ndl.max(t2)
            assert m2.shape == (1,)
            np.testing.assert_array_equal(m2.numpy(), [4.0])
            m2.backward()
            np.testing.assert_allclose(t2.grad.numpy(), [[0.0, 0.5], [0.5, 0.0]], rtol=1e-6)


# --------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((1, 4), (4, 1)),
        ((2, 3, 4), (2, 4, 5)),
        ((3, 4), (2, 4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((1, 3, 4), (2, 4, 2)),
    ],
)
@dev
def test_matmul(device, sa, sb):
    ref = lambda a, b: a @ b  # noqa: E731
    check_op(ndl.matmul, rnd(0, sa), rnd(1, sb), device=device, reference=ref)
    check_op(lambda a, b: a @ b, rnd(2, sa), rnd(3, sb), device=device, reference=ref)
    check_op(lambda a, b: a.matmul(b), rnd(4, sa), rnd(5, sb), device=device, reference=ref)
    check_op(
        lambda a, b: ndl.ops.MatMul()(a, b), rnd(6, sa), rnd(7, sb), device=device, reference=ref
    )


@dev
def test_matmul_same_operand(device):
    check_op(lambda a: a @ a, rnd(0, (4, 4)), device=device, reference=lambda a: a @ a)


@pytest.mark.parametrize(
    "sx,sw,sb",
    [
        ((3, 4), (4, 5), (1, 5)),  # nn.Linear's bias
        ((3, 4), (4, 5), (5,)),
        ((3, 4), (4, 5), (3, 5)),  # no broadcast
        ((1, 7), (7, 1), (1, 1)),
        ((2, 3, 4), (4, 5), (1, 5)),  # batch dims on x
        ((2, 3, 4), (2, 4, 5), (2, 1, 5)),
        ((9, 33), (33, 17), (17,)),  # past every micro-kernel's tile
    ],
)
@dev
def test_matmul_bias_against_the_composite(device, sx, sw, sb):
    """Values and gradients (finite differences, both graph modes) as x @ w + bias."""
    ref = lambda x, w, b: x @ w + b  # noqa: E731
    check_op(ndl.matmul_bias, rnd(0, sx), rnd(1, sw), rnd(2, sb), device=device, reference=ref)
    check_op(
        lambda x, w, b: ndl.ops.MatMulBias()(x, w, b),
        rnd(3, sx),
        rnd(4, sw),
        rnd(5, sb),
        device=device,
        reference=ref,
    )
    # the same gradients as the composite the fused op replaces, in both graph modes
    fused = check_op(
        ndl.matmul_bias, rnd(6, sx), rnd(7, sw), rnd(8, sb), device=device, reference=ref
    )
    composite = check_op(
        lambda x, w, b: x @ w + ndl.broadcast_to(b, ref(rnd(6, sx), rnd(7, sw), rnd(8, sb)).shape),
        rnd(6, sx),
        rnd(7, sw),
        rnd(8, sb),
        device=device,
        reference=ref,
    )
    for mode in fused:
        for got, expected in zip(fused[mode][1], composite[mode][1]):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@dev
def test_matmul_bias_records_one_node_and_one_array(device):
    """One op node (inputs x, w, bias) and one (N, out) array, where the composite made
    three nodes (MatMul, BroadcastTo, EWiseAdd) and kept two (N, out) arrays."""
    x = ndl.Tensor(rnd(0, (64, 8)), device=device)
    w = ndl.Tensor(rnd(1, (8, 256)), device=device)
    b = ndl.Tensor(rnd(2, (1, 256)), device=device)
    before = ndl.memory.memory_allocated(device)
    y = ndl.matmul_bias(x, w, b)
    assert isinstance(y.op, ndl.ops.MatMulBias)
    assert y.inputs[0] is x and y.inputs[1] is w and y.inputs[2] is b
    assert ndl.memory.memory_allocated(device) - before == 64 * 256 * 4
    del y
    z = x @ w + b.broadcast_to((64, 256))
    assert ndl.memory.memory_allocated(device) - before == 2 * 64 * 256 * 4
    del z


# --------------------------------------------------------------------------
# stack, split, flip, dilate
# --------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2])
@dev
def test_stack(device, axis):
    shape = (3, 4)
    ref = lambda *xs: np.stack(xs, axis=axis)  # noqa: E731
    check_op(
        lambda *ts: ndl.stack(list(ts), axis),
        rnd(0, shape),
        rnd(1, shape),
        rnd(2, shape),
        device=device,
        reference=ref,
    )
    check_op(
        lambda *ts: ndl.ops.Stack(axis)(ndl.make_tuple(*ts)),
        rnd(3, shape),
        rnd(4, shape),
        device=device,
        reference=ref,
    )


@dev
def test_stack_single(device):
    check_op(
        lambda a: ndl.stack([a], 1),
        rnd(0, (2, 3)),
        device=device,
        reference=lambda a: a[:, None, :],
    )


@pytest.mark.parametrize("shape,axis", [((3, 4), 0), ((3, 4), 1), ((2, 3, 4), 2), ((2, 3, 4), 1)])
@dev
def test_split(device, shape, axis):
    def ref(a):
        return tuple(np.take(a, i, axis=axis) for i in range(a.shape[axis]))

    res = check_op(lambda a: ndl.split(a, axis), rnd(0, shape), device=device, reference=ref)
    for mode in MODES:
        assert len(res[mode][0]) == shape[axis]
    check_op(lambda a: ndl.ops.Split(axis)(a), rnd(1, shape), device=device, reference=ref)


@dev
def test_split_returns_tensortuple(device):
    t = ndl.Tensor(rnd(0, (3, 2)), device=device)
    parts = ndl.split(t, 0)
    assert isinstance(parts, ndl.TensorTuple)
    assert len(parts) == 3
    for i in range(3):
        assert isinstance(parts[i], ndl.Tensor)
        assert parts[i].shape == (2,)
        np.testing.assert_array_equal(parts[i].numpy(), t.numpy()[i])


@dev
def test_split_then_stack_roundtrip(device):
    check_op(
        lambda a: ndl.stack(list(ndl.split(a, 1).tuple()), 0),
        rnd(0, (3, 4)),
        device=device,
        reference=lambda a: a.T,
    )


@dev
def test_split_partial_use(device):
    # only some outputs reach the loss: the others get no (or zero) gradient
    check_op(
        lambda a: ndl.split(a, 0)[1] * 2.0,
        rnd(0, (3, 4)),
        device=device,
        reference=lambda a: a[1] * 2.0,
    )


@pytest.mark.parametrize(
    "shape,axes",
    [
        ((5,), (0,)),
        ((3, 4), (0,)),
        ((3, 4), (1,)),
        ((3, 4), (0, 1)),
        ((2, 3, 4), (0, 2)),
        ((2, 3, 4), (1,)),
    ],
)
@dev
def test_flip(device, shape, axes):
    ref = lambda a: np.flip(a, axes)  # noqa: E731
    check_op(lambda a: ndl.flip(a, axes), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.Flip(axes)(a), rnd(1, shape), device=device, reference=ref)


@pytest.mark.parametrize(
    "shape,axes,d",
    [
        ((4,), (0,), 1),
        ((3, 4), (0,), 1),
        ((3, 4), (1,), 2),
        ((3, 4), (0, 1), 1),
        ((2, 3, 2), (0, 2), 2),
        ((3, 4), (0,), 0),
    ],
)
@dev
def test_dilate(device, shape, axes, d):
    ref = lambda a: dilate_ref(a, axes, d)  # noqa: E731
    res = check_op(lambda a: ndl.dilate(a, axes, d), rnd(0, shape), device=device, reference=ref)
    expected_shape = list(shape)
    for ax in axes:
        expected_shape[ax] *= d + 1
    assert res["cycle_free"][0][0].shape == tuple(expected_shape)
    check_op(lambda a: ndl.ops.Dilate(axes, d)(a), rnd(1, shape), device=device, reference=ref)


@dev
def test_dilate_exact_values(device):
    t = ndl.Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32), device=device)
    np.testing.assert_array_equal(ndl.dilate(t, (0,), 1).numpy(), [[1, 2], [0, 0], [3, 4], [0, 0]])
    np.testing.assert_array_equal(
        ndl.dilate(t, (1,), 2).numpy(), [[1, 0, 0, 2, 0, 0], [3, 0, 0, 4, 0, 0]]
    )


@pytest.mark.parametrize(
    "shape,axes,d",
    [
        ((8,), (0,), 1),
        ((6, 4), (0,), 1),
        ((3, 6), (1,), 2),
        ((6, 4), (0, 1), 1),
        ((4, 3, 6), (0, 2), 1),
    ],
)
@dev
def test_undilate(device, shape, axes, d):
    ref = lambda a: undilate_ref(a, axes, d)  # noqa: E731
    check_op(lambda a: ndl.undilate(a, axes, d), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.UnDilate(axes, d)(a), rnd(1, shape), device=device, reference=ref)


@dev
def test_undilate_inverts_dilate(device):
    check_op(
        lambda a: ndl.undilate(ndl.dilate(a, (0, 1), 2), (0, 1), 2),
        rnd(0, (3, 4)),
        device=device,
        reference=lambda a: a,
    )


# --------------------------------------------------------------------------
# tuples
# --------------------------------------------------------------------------


@dev
def test_make_tuple(device):
    res = check_op(
        lambda a, b: ndl.make_tuple(a, b),
        rnd(0, SHAPE),
        rnd(1, (2,)),
        device=device,
        reference=lambda a, b: (a, b),
    )
    assert len(res["needle"][0]) == 2
    check_op(
        lambda a, b: ndl.ops.MakeTensorTuple()(a, b),
        rnd(2, SHAPE),
        rnd(3, SHAPE),
        device=device,
        reference=lambda a, b: (a, b),
    )


@dev
def test_tuple_get_item(device):
    check_op(
        lambda a, b: ndl.tuple_get_item(ndl.make_tuple(a, b), 1) * 2.0 + a,
        rnd(0, SHAPE),
        rnd(1, SHAPE),
        device=device,
        reference=lambda a, b: b * 2.0 + a,
    )
    check_op(
        lambda a, b: ndl.ops.TupleGetItem(0)(ndl.make_tuple(a, b)) * b,
        rnd(2, SHAPE),
        rnd(3, SHAPE),
        device=device,
        reference=lambda a, b: a * b,
    )
    check_op(
        lambda a, b: ndl.make_tuple(a, b)[0] - ndl.make_tuple(a, b)[1],
        rnd(4, SHAPE),
        rnd(5, SHAPE),
        device=device,
        reference=lambda a, b: a - b,
    )


@dev
def test_fused_add_scalars(device):
    res = check_op(
        lambda a: ndl.fused_add_scalars(a, 1.0, -2.0),
        rnd(0, SHAPE),
        device=device,
        reference=lambda a: (a + 1.0, a - 2.0),
    )
    assert len(res["cycle_free"][0]) == 2
    check_op(
        lambda a: ndl.ops.FusedAddScalars(0.5, 3.0)(a),
        rnd(1, SHAPE),
        device=device,
        reference=lambda a: (a + 0.5, a + 3.0),
    )
    check_op(
        lambda a: ndl.fused_add_scalars(a, 1.0, 2.0)[0] * ndl.fused_add_scalars(a, 1.0, 2.0)[1],
        rnd(2, SHAPE),
        device=device,
        reference=lambda a: (a + 1.0) * (a + 2.0),
    )


# --------------------------------------------------------------------------
# indexing
# --------------------------------------------------------------------------

KEYS = [
    (1, "int"),
    (-1, "neg_int"),
    (slice(1, 3), "slice"),
    (slice(None, None, -1), "reverse"),
    (slice(-3, None), "neg_start"),
    ((slice(None), 0), "all_int"),
    ((1, slice(None, None, -2)), "int_negstep"),
    ((slice(3, 0, -1), slice(1, 4), 2), "negstep_slice_int"),
    ((slice(None, None, 2), slice(None), slice(None, None, -1)), "steps"),
    ((2, 3), "two_ints"),
    ((0, 1, 2), "all_ints"),
]


@pytest.mark.parametrize("key", [k for k, _ in KEYS], ids=[i for _, i in KEYS])
@dev
def test_getitem(device, key):
    res = check_op(lambda a: a[key], rnd(0, (4, 5, 3)), device=device, reference=lambda a: a[key])
    assert res["cycle_free"][0][0].shape == rnd(0, (4, 5, 3))[key].shape


@dev
def test_getitem_int_drops_dim(device):
    t = ndl.Tensor(rnd(0, (4, 5, 3)), device=device)
    assert t[1].shape == (5, 3)
    assert t[:, 2].shape == (4, 3)
    assert t[1:2].shape == (1, 5, 3)
    assert t[1, 2].shape == (3,)
    assert type(t[0].op) is ndl.ops.GetItem


@dev
def test_getitem_composes(device):
    check_op(
        lambda a: a[1:, ::-1][0, 1:] * a[0, 1:],
        rnd(0, (3, 4)),
        device=device,
        reference=lambda a: a[1:, ::-1][0, 1:] * a[0, 1:],
    )
