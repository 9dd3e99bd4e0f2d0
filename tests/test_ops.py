"""Forward values and gradients of needle's Tensor ops.

Every op is checked on every device in ``DEVICES`` and under both graph modes
("cycle_free" and "needle") by ``gradcheck.check_op``: the forward value
against a NumPy reference, the gradient against float64 central differences of
that reference, and the gradients of the two modes against each other.
"""
import math

import numpy as np
import pytest

import needle as ndl

from devices import DEVICES
from gradcheck import MODES, check_op

dev = pytest.mark.parametrize("device", DEVICES)


# --------------------------------------------------------------------------
# data and references
# --------------------------------------------------------------------------


def rnd(seed, shape, kind="any"):
    rng = np.random.default_rng(seed)
    if kind == "any":
        x = rng.uniform(-2.0, 2.0, size=shape)
    elif kind == "pos":
        x = rng.uniform(0.5, 2.0, size=shape)
    elif kind == "nonzero":  # well away from 0 (kinks of relu, poles of 1/x)
        x = rng.uniform(0.2, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    elif kind == "distinct":  # distinct values at least 0.1 apart (for max)
        n = int(np.prod(shape))
        x = (rng.permutation(n) * 0.1 - 0.05 * n).reshape(shape)
    else:  # pragma: no cover - test bug
        raise AssertionError(kind)
    return np.asarray(x, dtype=np.float32)


def red_ref(fn, axes):
    """A NumPy reduction with the course's shape convention: axes=None -> (1,)."""
    def ref(x):
        if axes is None:
            return np.asarray(fn(x)).reshape(1)
        return fn(x, axis=axes)
    return ref


def lse_ref(x, axes=None):
    m = np.max(x, axis=axes, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    if axes is None:
        return out.reshape(())
    return np.squeeze(out, axis=axes)


def sigmoid_ref(x):
    return 1.0 / (1.0 + np.exp(-x))


def conv_ref(x, w, stride=1, padding=0):
    n, h, wd, cin = x.shape
    k, _, _, cout = w.shape
    p, s = padding, stride
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    ho = (h + 2 * p - k) // s + 1
    wo = (wd + 2 * p - k) // s + 1
    out = np.zeros((n, ho, wo, cout), dtype=np.result_type(x, w))
    for di in range(k):
        for dj in range(k):
            patch = xp[:, di:di + s * (ho - 1) + 1:s, dj:dj + s * (wo - 1) + 1:s, :]
            out = out + patch @ w[di, dj]
    return out


def dilate_ref(x, axes, d):
    shape = list(x.shape)
    sl = [slice(None)] * x.ndim
    for ax in axes:
        shape[ax] *= d + 1
        sl[ax] = slice(None, None, d + 1)
    out = np.zeros(shape, dtype=x.dtype)
    out[tuple(sl)] = x
    return out


def undilate_ref(x, axes, d):
    sl = [slice(None)] * x.ndim
    for ax in axes:
        sl[ax] = slice(None, None, d + 1)
    return x[tuple(sl)]


def sce_ref(logits, labels):
    lse = lse_ref(logits, axes=1)
    picked = logits[np.arange(logits.shape[0]), labels.astype(int)]
    return np.mean(lse - picked).reshape(1)


# --------------------------------------------------------------------------
# names
# --------------------------------------------------------------------------

OP_CLASSES = [
    "EWiseAdd", "AddScalar", "EWiseMul", "MulScalar", "EWisePow", "PowerScalar", "EWiseDiv",
    "DivScalar", "Transpose", "Reshape", "BroadcastTo", "Summation", "MatMul", "Negate", "Log",
    "Exp", "ReLU", "Tanh", "Sigmoid", "Sqrt", "Max", "Stack", "Split", "Flip", "Dilate",
    "UnDilate", "Conv", "LogSoftmax", "LogSumExp", "MakeTensorTuple", "TupleGetItem",
    "FusedAddScalars", "GetItem", "GatherRows", "SoftmaxCrossEntropy",
]
OP_FUNCTIONS = [
    "add", "add_scalar", "multiply", "mul_scalar", "power", "power_scalar", "divide",
    "divide_scalar", "transpose", "reshape", "broadcast_to", "summation", "matmul", "negate",
    "log", "exp", "relu", "tanh", "sigmoid", "sqrt", "max", "stack", "split", "flip", "dilate",
    "undilate", "conv", "logsoftmax", "logsumexp", "make_tuple", "tuple_get_item",
    "fused_add_scalars", "gather_rows", "softmax_cross_entropy",
]


@pytest.mark.parametrize("name", OP_CLASSES)
def test_op_class_exported(name):
    cls = getattr(ndl.ops, name)
    assert isinstance(cls, type)
    assert getattr(ndl, name) is cls
    assert issubclass(cls, ndl.autograd.Op)
    tuple_ops = {"MakeTensorTuple", "Split", "FusedAddScalars"}
    base = ndl.autograd.TensorTupleOp if name in tuple_ops else ndl.autograd.TensorOp
    assert issubclass(cls, base), f"{name} should subclass {base.__name__}"


@pytest.mark.parametrize("name", OP_FUNCTIONS)
def test_op_function_exported(name):
    fn = getattr(ndl.ops, name)
    assert callable(fn)
    assert getattr(ndl, name) is fn


@dev
def test_functions_record_their_op_class(device):
    a = ndl.Tensor(rnd(0, (2, 3), "pos"), device=device)
    b = ndl.Tensor(rnd(1, (2, 3), "pos"), device=device)
    m = ndl.Tensor(rnd(2, (3, 4)), device=device)
    cases = [
        (ndl.add(a, b), ndl.ops.EWiseAdd), (a + b, ndl.ops.EWiseAdd),
        (ndl.add_scalar(a, 1.0), ndl.ops.AddScalar), (a + 1, ndl.ops.AddScalar),
        (ndl.multiply(a, b), ndl.ops.EWiseMul), (a * b, ndl.ops.EWiseMul),
        (ndl.mul_scalar(a, 2.0), ndl.ops.MulScalar), (a * 2, ndl.ops.MulScalar),
        (ndl.power(a, b), ndl.ops.EWisePow), (a ** b, ndl.ops.EWisePow),
        (ndl.power_scalar(a, 2), ndl.ops.PowerScalar), (a ** 2, ndl.ops.PowerScalar),
        (ndl.divide(a, b), ndl.ops.EWiseDiv), (a / b, ndl.ops.EWiseDiv),
        (ndl.divide_scalar(a, 2.0), ndl.ops.DivScalar), (a / 2, ndl.ops.DivScalar),
        (ndl.negate(a), ndl.ops.Negate), (-a, ndl.ops.Negate),
        (ndl.matmul(a, m), ndl.ops.MatMul), (a @ m, ndl.ops.MatMul),
        (ndl.transpose(a), ndl.ops.Transpose), (ndl.reshape(a, (3, 2)), ndl.ops.Reshape),
        (ndl.broadcast_to(a, (4, 2, 3)), ndl.ops.BroadcastTo),
        (ndl.summation(a), ndl.ops.Summation), (a.sum(), ndl.ops.Summation),
        (ndl.log(a), ndl.ops.Log), (ndl.exp(a), ndl.ops.Exp), (ndl.relu(a), ndl.ops.ReLU),
        (ndl.tanh(a), ndl.ops.Tanh), (ndl.sigmoid(a), ndl.ops.Sigmoid),
        (ndl.sqrt(a), ndl.ops.Sqrt), (ndl.max(a, axes=1), ndl.ops.Max),
        (ndl.stack([a, b], 0), ndl.ops.Stack), (ndl.split(a, 0), ndl.ops.Split),
        (ndl.flip(a, (0,)), ndl.ops.Flip), (ndl.dilate(a, (0,), 1), ndl.ops.Dilate),
        (ndl.logsoftmax(a), ndl.ops.LogSoftmax), (ndl.logsumexp(a, axes=(1,)), ndl.ops.LogSumExp),
        (ndl.make_tuple(a, b), ndl.ops.MakeTensorTuple),
        (ndl.fused_add_scalars(a, 1.0, 2.0), ndl.ops.FusedAddScalars),
        (a[0], ndl.ops.GetItem),
    ]
    for i, (value, cls) in enumerate(cases):
        assert type(value.op) is cls, f"case {i}: op {type(value.op).__name__}, expected {cls.__name__}"
        assert all(isinstance(x, ndl.autograd.Value) for x in value.inputs)


# --------------------------------------------------------------------------
# elementwise
# --------------------------------------------------------------------------

SHAPE = (3, 4)


@dev
def test_add(device):
    check_op(ndl.add, rnd(0, SHAPE), rnd(1, SHAPE), device=device, reference=lambda a, b: a + b)
    check_op(lambda a, b: a + b, rnd(2, SHAPE), rnd(3, SHAPE), device=device,
             reference=lambda a, b: a + b)
    check_op(lambda a, b: ndl.ops.EWiseAdd()(a, b), rnd(4, SHAPE), rnd(5, SHAPE), device=device,
             reference=lambda a, b: a + b)


@dev
def test_add_same_input_twice(device):
    check_op(lambda a: a + a, rnd(0, SHAPE), device=device, reference=lambda a: a + a)


@dev
def test_add_scalar(device):
    check_op(lambda a: ndl.add_scalar(a, 1.5), rnd(0, SHAPE), device=device,
             reference=lambda a: a + 1.5)
    check_op(lambda a: ndl.ops.AddScalar(-2.0)(a), rnd(1, SHAPE), device=device,
             reference=lambda a: a - 2.0)
    check_op(lambda a: a + 1, rnd(2, SHAPE), device=device, reference=lambda a: a + 1)
    check_op(lambda a: 1 + a, rnd(3, SHAPE), device=device, reference=lambda a: 1 + a)


@dev
def test_subtract(device):
    check_op(lambda a, b: a - b, rnd(0, SHAPE), rnd(1, SHAPE), device=device,
             reference=lambda a, b: a - b)
    check_op(lambda a: a - 2.5, rnd(2, SHAPE), device=device, reference=lambda a: a - 2.5)
    check_op(lambda a: 1 - a, rnd(3, SHAPE), device=device, reference=lambda a: 1 - a)


@dev
def test_multiply(device):
    check_op(ndl.multiply, rnd(0, SHAPE), rnd(1, SHAPE), device=device,
             reference=lambda a, b: a * b)
    check_op(lambda a, b: a * b, rnd(2, SHAPE), rnd(3, SHAPE), device=device,
             reference=lambda a, b: a * b)
    check_op(lambda a: a * a * a, rnd(4, SHAPE), device=device, reference=lambda a: a * a * a)


@dev
def test_mul_scalar(device):
    check_op(lambda a: ndl.mul_scalar(a, -1.5), rnd(0, SHAPE), device=device,
             reference=lambda a: a * -1.5)
    check_op(lambda a: ndl.ops.MulScalar(0.25)(a), rnd(1, SHAPE), device=device,
             reference=lambda a: a * 0.25)
    check_op(lambda a: 3 * a, rnd(2, SHAPE), device=device, reference=lambda a: 3 * a)
    check_op(lambda a: a * 3, rnd(3, SHAPE), device=device, reference=lambda a: a * 3)


@dev
def test_power(device):
    check_op(ndl.power, rnd(0, SHAPE, "pos"), rnd(1, SHAPE), device=device,
             reference=lambda a, b: a ** b)
    check_op(lambda a, b: a ** b, rnd(2, SHAPE, "pos"), rnd(3, SHAPE), device=device,
             reference=lambda a, b: a ** b)


@pytest.mark.parametrize("scalar", [2, 3, 0.5, -1, 1.5])
@dev
def test_power_scalar(device, scalar):
    kind = "pos" if scalar != int(scalar) or scalar < 0 else "any"
    check_op(lambda a: ndl.power_scalar(a, scalar), rnd(0, SHAPE, kind), device=device,
             reference=lambda a: a ** scalar)
    check_op(lambda a: a ** scalar, rnd(1, SHAPE, kind), device=device,
             reference=lambda a: a ** scalar)
    check_op(lambda a: ndl.ops.PowerScalar(scalar)(a), rnd(2, SHAPE, kind), device=device,
             reference=lambda a: a ** scalar)


@dev
def test_reflected_power(device):
    check_op(lambda a: 2 ** a, rnd(0, SHAPE), device=device, reference=lambda a: 2.0 ** a)


@dev
def test_divide(device):
    check_op(ndl.divide, rnd(0, SHAPE), rnd(1, SHAPE, "nonzero"), device=device,
             reference=lambda a, b: a / b)
    check_op(lambda a, b: a / b, rnd(2, SHAPE), rnd(3, SHAPE, "nonzero"), device=device,
             reference=lambda a, b: a / b)


@dev
def test_divide_scalar(device):
    check_op(lambda a: ndl.divide_scalar(a, 4.0), rnd(0, SHAPE), device=device,
             reference=lambda a: a / 4.0)
    check_op(lambda a: ndl.ops.DivScalar(-0.5)(a), rnd(1, SHAPE), device=device,
             reference=lambda a: a / -0.5)
    check_op(lambda a: a / 3, rnd(2, SHAPE), device=device, reference=lambda a: a / 3)
    check_op(lambda a: 2 / a, rnd(3, SHAPE, "nonzero"), device=device, reference=lambda a: 2 / a)


@dev
def test_negate(device):
    check_op(ndl.negate, rnd(0, SHAPE), device=device, reference=lambda a: -a)
    check_op(lambda a: -a, rnd(1, SHAPE), device=device, reference=lambda a: -a)
    check_op(lambda a: ndl.ops.Negate()(a), rnd(2, SHAPE), device=device, reference=lambda a: -a)


@dev
def test_log(device):
    check_op(ndl.log, rnd(0, SHAPE, "pos"), device=device, reference=np.log)
    check_op(lambda a: ndl.ops.Log()(a), rnd(1, SHAPE, "pos"), device=device, reference=np.log)


@dev
def test_exp(device):
    check_op(ndl.exp, rnd(0, SHAPE), device=device, reference=np.exp)
    check_op(lambda a: ndl.ops.Exp()(a), rnd(1, SHAPE), device=device, reference=np.exp)


@dev
def test_relu(device):
    ref = lambda a: np.maximum(a, 0)  # noqa: E731
    check_op(ndl.relu, rnd(0, SHAPE, "nonzero"), device=device, reference=ref)
    check_op(lambda a: ndl.ops.ReLU()(a), rnd(1, SHAPE, "nonzero"), device=device, reference=ref)


@dev
def test_relu_gradient_is_step(device):
    x = np.array([[-2.0, -0.5, 0.5, 3.0]], dtype=np.float32)
    for mode in MODES:
        with ndl.autograd.graph_mode(mode):
            t = ndl.Tensor(x, device=device)
            ndl.relu(t).sum().backward()
            np.testing.assert_array_equal(t.grad.numpy(), [[0.0, 0.0, 1.0, 1.0]])


@dev
def test_tanh(device):
    check_op(ndl.tanh, rnd(0, SHAPE), device=device, reference=np.tanh)


@dev
def test_sigmoid(device):
    check_op(ndl.sigmoid, rnd(0, SHAPE), device=device, reference=sigmoid_ref)
    check_op(lambda a: ndl.ops.Sigmoid()(a), rnd(1, SHAPE), device=device, reference=sigmoid_ref)


@dev
def test_sqrt(device):
    check_op(ndl.sqrt, rnd(0, SHAPE, "pos"), device=device, reference=np.sqrt)


@dev
def test_composite_expression(device):
    check_op(lambda a, b: ndl.tanh(a * b + ndl.exp(-a)) / (b * b + 1.0) - ndl.sigmoid(b) ** 2,
             rnd(0, SHAPE), rnd(1, SHAPE), device=device,
             reference=lambda a, b: np.tanh(a * b + np.exp(-a)) / (b * b + 1.0)
             - sigmoid_ref(b) ** 2)


# --------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------


@pytest.mark.parametrize("shape,axes", [
    ((3, 4), None), ((2, 3, 4), None), ((2, 3, 4), (0, 2)), ((2, 3, 4), (0, 1)),
    ((2, 3, 4), (2, 1)),
])
@dev
def test_transpose(device, shape, axes):
    ax = (-2, -1) if axes is None else axes
    ref = lambda a: np.swapaxes(a, *ax)  # noqa: E731
    check_op(lambda a: ndl.transpose(a, axes), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.Transpose(axes)(a), rnd(1, shape), device=device, reference=ref)
    check_op(lambda a: a.transpose(axes), rnd(2, shape), device=device, reference=ref)


@dev
def test_transpose_method_default(device):
    check_op(lambda a: a.transpose(), rnd(0, (2, 3, 4)), device=device,
             reference=lambda a: np.swapaxes(a, 1, 2))


@pytest.mark.parametrize("shape,new", [
    ((3, 4), (12,)), ((3, 4), (2, 6)), ((2, 3, 4), (4, 6)), ((2, 3, 4), (4, 3, 2)),
    ((6,), (1, 6, 1)),
])
@dev
def test_reshape(device, shape, new):
    ref = lambda a: a.reshape(new)  # noqa: E731
    check_op(lambda a: ndl.reshape(a, new), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.Reshape(new)(a), rnd(1, shape), device=device, reference=ref)
    check_op(lambda a: a.reshape(new), rnd(2, shape), device=device, reference=ref)


@dev
def test_reshape_of_transposed(device):
    check_op(lambda a: ndl.reshape(ndl.transpose(a), (12,)), rnd(0, (3, 4)), device=device,
             reference=lambda a: a.T.reshape(12))


@pytest.mark.parametrize("shape,new", [
    ((3, 1), (3, 4)), ((1, 4), (3, 4)), ((4,), (2, 3, 4)), ((1,), (5,)), ((2, 1, 3), (2, 4, 3)),
    ((1, 1), (2, 3)), ((3,), (3,)),
])
@dev
def test_broadcast_to(device, shape, new):
    ref = lambda a: np.broadcast_to(a, new)  # noqa: E731
    check_op(lambda a: ndl.broadcast_to(a, new), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.BroadcastTo(new)(a), rnd(1, shape), device=device, reference=ref)
    check_op(lambda a: a.broadcast_to(new), rnd(2, shape), device=device, reference=ref)


@pytest.mark.parametrize("shape,axes", [
    ((3, 4), None), ((5,), None), ((2, 3, 4), None), ((3, 4), 0), ((3, 4), 1), ((2, 3, 4), 1),
    ((2, 3, 4), (0, 2)), ((2, 3, 4), (1,)), ((2, 3, 4), (2, 0)),
])
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


@pytest.mark.parametrize("shape,axes", [
    ((3, 4), None), ((2, 3, 4), None), ((3, 4), 0), ((3, 4), 1), ((2, 3, 4), (0, 2)),
    ((2, 3, 4), (1,)),
])
@dev
def test_max(device, shape, axes):
    ref = red_ref(np.max, axes)
    check_op(lambda a: ndl.max(a, axes), rnd(0, shape, "distinct"), device=device, reference=ref)
    check_op(lambda a: ndl.ops.Max(axes)(a), rnd(1, shape, "distinct"), device=device,
             reference=ref)


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
                t.grad.numpy(),
                [[0.0, 0.5, 0.5], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
            t2 = ndl.Tensor(np.array([[1.0, 4.0], [4.0, 2.0]], dtype=np.float32), device=device)
            m2 = ndl.max(t2)
            assert m2.shape == (1,)
            np.testing.assert_array_equal(m2.numpy(), [4.0])
            m2.backward()
            np.testing.assert_allclose(t2.grad.numpy(), [[0.0, 0.5], [0.5, 0.0]], rtol=1e-6)


# --------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------


@pytest.mark.parametrize("sa,sb", [
    ((3, 4), (4, 5)), ((1, 4), (4, 1)), ((2, 3, 4), (2, 4, 5)), ((3, 4), (2, 4, 5)),
    ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((1, 3, 4), (2, 4, 2)),
])
@dev
def test_matmul(device, sa, sb):
    ref = lambda a, b: a @ b  # noqa: E731
    check_op(ndl.matmul, rnd(0, sa), rnd(1, sb), device=device, reference=ref)
    check_op(lambda a, b: a @ b, rnd(2, sa), rnd(3, sb), device=device, reference=ref)
    check_op(lambda a, b: a.matmul(b), rnd(4, sa), rnd(5, sb), device=device, reference=ref)
    check_op(lambda a, b: ndl.ops.MatMul()(a, b), rnd(6, sa), rnd(7, sb), device=device,
             reference=ref)


@dev
def test_matmul_same_operand(device):
    check_op(lambda a: a @ a, rnd(0, (4, 4)), device=device, reference=lambda a: a @ a)


# --------------------------------------------------------------------------
# stack, split, flip, dilate
# --------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2])
@dev
def test_stack(device, axis):
    shape = (3, 4)
    ref = lambda *xs: np.stack(xs, axis=axis)  # noqa: E731
    check_op(lambda *ts: ndl.stack(list(ts), axis), rnd(0, shape), rnd(1, shape), rnd(2, shape),
             device=device, reference=ref)
    check_op(lambda *ts: ndl.ops.Stack(axis)(ndl.make_tuple(*ts)), rnd(3, shape), rnd(4, shape),
             device=device, reference=ref)


@dev
def test_stack_single(device):
    check_op(lambda a: ndl.stack([a], 1), rnd(0, (2, 3)), device=device,
             reference=lambda a: a[:, None, :])


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
    check_op(lambda a: ndl.stack(list(ndl.split(a, 1).tuple()), 0), rnd(0, (3, 4)), device=device,
             reference=lambda a: a.T)


@dev
def test_split_partial_use(device):
    # only some outputs reach the loss: the others get no (or zero) gradient
    check_op(lambda a: ndl.split(a, 0)[1] * 2.0, rnd(0, (3, 4)), device=device,
             reference=lambda a: a[1] * 2.0)


@pytest.mark.parametrize("shape,axes", [
    ((5,), (0,)), ((3, 4), (0,)), ((3, 4), (1,)), ((3, 4), (0, 1)), ((2, 3, 4), (0, 2)),
    ((2, 3, 4), (1,)),
])
@dev
def test_flip(device, shape, axes):
    ref = lambda a: np.flip(a, axes)  # noqa: E731
    check_op(lambda a: ndl.flip(a, axes), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.Flip(axes)(a), rnd(1, shape), device=device, reference=ref)


@pytest.mark.parametrize("shape,axes,d", [
    ((4,), (0,), 1), ((3, 4), (0,), 1), ((3, 4), (1,), 2), ((3, 4), (0, 1), 1),
    ((2, 3, 2), (0, 2), 2), ((3, 4), (0,), 0),
])
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
    np.testing.assert_array_equal(
        ndl.dilate(t, (0,), 1).numpy(), [[1, 2], [0, 0], [3, 4], [0, 0]])
    np.testing.assert_array_equal(
        ndl.dilate(t, (1,), 2).numpy(), [[1, 0, 0, 2, 0, 0], [3, 0, 0, 4, 0, 0]])


@pytest.mark.parametrize("shape,axes,d", [
    ((8,), (0,), 1), ((6, 4), (0,), 1), ((3, 6), (1,), 2), ((6, 4), (0, 1), 1),
    ((4, 3, 6), (0, 2), 1),
])
@dev
def test_undilate(device, shape, axes, d):
    ref = lambda a: undilate_ref(a, axes, d)  # noqa: E731
    check_op(lambda a: ndl.undilate(a, axes, d), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.UnDilate(axes, d)(a), rnd(1, shape), device=device, reference=ref)


@dev
def test_undilate_inverts_dilate(device):
    check_op(lambda a: ndl.undilate(ndl.dilate(a, (0, 1), 2), (0, 1), 2), rnd(0, (3, 4)),
             device=device, reference=lambda a: a)


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n,h,w,cin,cout,k,stride,padding", [
    (2, 5, 5, 3, 4, 3, 1, 0),
    (2, 5, 5, 3, 4, 3, 1, 1),
    (1, 6, 6, 2, 3, 3, 2, 1),
    (2, 7, 5, 2, 2, 3, 2, 0),
    (1, 4, 4, 3, 2, 1, 1, 0),
    (1, 5, 5, 2, 3, 5, 1, 2),
    (2, 6, 6, 2, 2, 2, 2, 0),
    (1, 5, 4, 2, 3, 3, 3, 2),
])
@dev
def test_conv(device, n, h, w, cin, cout, k, stride, padding):
    ref = lambda x, W: conv_ref(x, W, stride, padding)  # noqa: E731
    xs = rnd(0, (n, h, w, cin))
    ws = rnd(1, (k, k, cin, cout))
    res = check_op(lambda x, W: ndl.conv(x, W, stride=stride, padding=padding), xs, ws,
                   device=device, reference=ref)
    ho = (h + 2 * padding - k) // stride + 1
    wo = (w + 2 * padding - k) // stride + 1
    assert res["cycle_free"][0][0].shape == (n, ho, wo, cout)
    check_op(lambda x, W: ndl.ops.Conv(stride, padding)(x, W), rnd(2, (n, h, w, cin)),
             rnd(3, (k, k, cin, cout)), device=device, reference=ref)


@dev
def test_conv_defaults(device):
    xs = rnd(0, (1, 5, 5, 2))
    ws = rnd(1, (3, 3, 2, 3))
    # the function's default padding is 1, the class's is 0 (the course's signatures)
    check_op(lambda x, W: ndl.conv(x, W), xs, ws, device=device,
             reference=lambda x, W: conv_ref(x, W, 1, 1))
    check_op(lambda x, W: ndl.ops.Conv()(x, W), xs, ws, device=device,
             reference=lambda x, W: conv_ref(x, W, 1, 0))


# --------------------------------------------------------------------------
# log-softmax and log-sum-exp
# --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 5), (1, 4), (4, 1)])
@dev
def test_logsoftmax(device, shape):
    ref = lambda a: a - lse_ref(a, axes=1)[:, None]  # noqa: E731
    check_op(ndl.logsoftmax, rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.LogSoftmax()(a), rnd(1, shape), device=device, reference=ref)


@dev
def test_logsoftmax_stable(device):
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]], dtype=np.float32)
    check_op(ndl.logsoftmax, x, device=device, reference=lambda a: a - lse_ref(a, axes=1)[:, None],
             eps=1e-2)


@pytest.mark.parametrize("shape,axes", [
    ((3, 5), (1,)), ((3, 5), (0,)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (1,)), ((3, 5), 1),
    ((2, 3, 4), (2,)),
])
@dev
def test_logsumexp(device, shape, axes):
    ax = axes if isinstance(axes, int) else tuple(axes)
    ref = lambda a: lse_ref(a, axes=ax)  # noqa: E731
    check_op(lambda a: ndl.logsumexp(a, axes), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.LogSumExp(axes)(a), rnd(1, shape), device=device, reference=ref)
    check_op(lambda a: ndl.logsumexp(a, axes=axes), rnd(2, shape), device=device, reference=ref)


@dev
def test_logsumexp_all_axes(device):
    # the shape of a full reduction is not pinned down here (the course gives a
    # single element); its value and gradient are
    check_op(lambda a: ndl.logsumexp(a), rnd(0, (3, 4)), device=device,
             reference=lambda a: lse_ref(a), check_shape=False)


@dev
def test_logsumexp_stable(device):
    x = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -1002.0]], dtype=np.float32)
    res = check_op(lambda a: ndl.logsumexp(a, (1,)), x, device=device,
                   reference=lambda a: lse_ref(a, axes=1), eps=1e-2)
    for mode in MODES:
        v = res[mode][0][0]
        assert np.all(np.isfinite(v))
        np.testing.assert_allclose(v, [1000 + math.log(2 + math.exp(-1)),
                                       -1000 + math.log(1 + math.exp(-1) + math.exp(-2))],
                                   rtol=1e-6)
        assert np.all(np.isfinite(res[mode][1][0]))


# --------------------------------------------------------------------------
# tuples
# --------------------------------------------------------------------------


@dev
def test_make_tuple(device):
    res = check_op(lambda a, b: ndl.make_tuple(a, b), rnd(0, SHAPE), rnd(1, (2,)), device=device,
                   reference=lambda a, b: (a, b))
    assert len(res["needle"][0]) == 2
    check_op(lambda a, b: ndl.ops.MakeTensorTuple()(a, b), rnd(2, SHAPE), rnd(3, SHAPE),
             device=device, reference=lambda a, b: (a, b))


@dev
def test_tuple_get_item(device):
    check_op(lambda a, b: ndl.tuple_get_item(ndl.make_tuple(a, b), 1) * 2.0 + a,
             rnd(0, SHAPE), rnd(1, SHAPE), device=device, reference=lambda a, b: b * 2.0 + a)
    check_op(lambda a, b: ndl.ops.TupleGetItem(0)(ndl.make_tuple(a, b)) * b,
             rnd(2, SHAPE), rnd(3, SHAPE), device=device, reference=lambda a, b: a * b)
    check_op(lambda a, b: ndl.make_tuple(a, b)[0] - ndl.make_tuple(a, b)[1],
             rnd(4, SHAPE), rnd(5, SHAPE), device=device, reference=lambda a, b: a - b)


@dev
def test_fused_add_scalars(device):
    res = check_op(lambda a: ndl.fused_add_scalars(a, 1.0, -2.0), rnd(0, SHAPE), device=device,
                   reference=lambda a: (a + 1.0, a - 2.0))
    assert len(res["cycle_free"][0]) == 2
    check_op(lambda a: ndl.ops.FusedAddScalars(0.5, 3.0)(a), rnd(1, SHAPE), device=device,
             reference=lambda a: (a + 0.5, a + 3.0))
    check_op(lambda a: ndl.fused_add_scalars(a, 1.0, 2.0)[0] * ndl.fused_add_scalars(a, 1.0, 2.0)[1],
             rnd(2, SHAPE), device=device, reference=lambda a: (a + 1.0) * (a + 2.0))


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
    check_op(lambda a: a[1:, ::-1][0, 1:] * a[0, 1:], rnd(0, (3, 4)), device=device,
             reference=lambda a: a[1:, ::-1][0, 1:] * a[0, 1:])


# --------------------------------------------------------------------------
# gather_rows and softmax_cross_entropy
# --------------------------------------------------------------------------


@pytest.mark.parametrize("idx", [
    [0, 4, 2], [1, 1, 3, 1], [[0, 2, 2], [4, 4, 4]], [3],
], ids=["distinct", "repeated", "2d", "single"])
@dev
def test_gather_rows(device, idx):
    table = rnd(0, (5, 3))
    idx = np.array(idx, dtype=np.float32)
    ref = lambda tb, ix: tb[ix.astype(int)]  # noqa: E731
    res = check_op(ndl.gather_rows, table, idx, device=device, reference=ref, wrt=(0,))
    assert res["cycle_free"][0][0].shape == idx.shape + (3,)
    check_op(lambda tb, ix: ndl.ops.GatherRows()(tb, ix), table, idx, device=device,
             reference=ref, wrt=(0,))


@dev
def test_gather_rows_gradient_scatter_adds(device):
    table = rnd(0, (4, 2))
    idx = np.array([1, 3, 1, 1], dtype=np.float32)
    for mode in MODES:
        with ndl.autograd.graph_mode(mode):
            tb = ndl.Tensor(table, device=device)
            ix = ndl.Tensor(idx, device=device, requires_grad=False)
            out = ndl.gather_rows(tb, ix)
            np.testing.assert_array_equal(out.numpy(), table[[1, 3, 1, 1]])
            out.sum().backward()
            np.testing.assert_array_equal(tb.grad.numpy(), [[0, 0], [3, 3], [0, 0], [1, 1]])


@pytest.mark.parametrize("bad", [5, 7, -100])
@dev
def test_gather_rows_out_of_range(device, bad):
    table = ndl.Tensor(rnd(0, (5, 3)), device=device)
    idx = ndl.Tensor(np.array([0, bad], dtype=np.float32), device=device, requires_grad=False)
    with pytest.raises((IndexError, ValueError)):
        ndl.gather_rows(table, idx)
    # a valid call afterwards works
    ok = ndl.gather_rows(table, ndl.Tensor(np.array([4.0, 0.0], dtype=np.float32),
                                           device=device, requires_grad=False))
    np.testing.assert_array_equal(ok.numpy(), table.numpy()[[4, 0]])


@pytest.mark.parametrize("n,c", [(4, 5), (1, 3), (6, 2)])
@dev
def test_softmax_cross_entropy(device, n, c):
    logits = rnd(0, (n, c))
    labels = np.random.default_rng(1).integers(0, c, size=n).astype(np.float32)
    res = check_op(ndl.softmax_cross_entropy, logits, labels, device=device, reference=sce_ref,
                   wrt=(0,))
    assert res["cycle_free"][0][0].shape == (1,)
    check_op(lambda z, y: ndl.ops.SoftmaxCrossEntropy()(z, y), logits, labels, device=device,
             reference=sce_ref, wrt=(0,))


@dev
def test_softmax_cross_entropy_gradient_formula(device):
    logits = rnd(3, (5, 4))
    labels = np.array([0, 3, 3, 1, 2], dtype=np.float32)
    e = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    soft = e / e.sum(axis=1, keepdims=True)
    expected = (soft - np.eye(4)[labels.astype(int)]) / 5
    grads = {}
    for mode in MODES:
        with ndl.autograd.graph_mode(mode):
            z = ndl.Tensor(logits, device=device)
            y = ndl.Tensor(labels, device=device, requires_grad=False)
            loss = ndl.softmax_cross_entropy(z, y)
            assert loss.shape == (1,)
            np.testing.assert_allclose(loss.numpy(), sce_ref(logits.astype(np.float64), labels),
                                       rtol=1e-5)
            loss.backward()
            np.testing.assert_allclose(z.grad.numpy(), expected, rtol=1e-5, atol=1e-6)
            grads[mode] = z.grad.numpy()
    np.testing.assert_allclose(grads["cycle_free"], grads["needle"], rtol=1e-6, atol=1e-7)


@dev
def test_softmax_cross_entropy_stable(device):
    logits = np.array([[1000.0, 0.0, -1000.0], [5.0, 1005.0, 0.0]], dtype=np.float32)
    labels = np.array([0, 0], dtype=np.float32)
    z = ndl.Tensor(logits, device=device)
    loss = ndl.softmax_cross_entropy(z, ndl.Tensor(labels, device=device, requires_grad=False))
    np.testing.assert_allclose(loss.numpy(), [(0.0 + 1000.0) / 2], rtol=1e-5)
    loss.backward()
    np.testing.assert_allclose(z.grad.numpy(), [[0, 0, 0], [-0.5, 0.5, 0]], atol=1e-4)


# --------------------------------------------------------------------------
# a small network end to end
# --------------------------------------------------------------------------


@dev
def test_mlp_gradients(device):
    def fn(x, w1, w2):
        return ndl.logsoftmax(ndl.relu(x @ w1) @ w2)

    def ref(x, w1, w2):
        h = np.maximum(x @ w1, 0) @ w2
        return h - lse_ref(h, axes=1)[:, None]

    x = rnd(0, (4, 3))
    w1 = rnd(1, (3, 5))
    w2 = rnd(2, (5, 2))
    # keep the relu inputs away from its kink
    pre = x.astype(np.float64) @ w1
    assert np.min(np.abs(pre)) > 1e-2
    check_op(fn, x, w1, w2, device=device, reference=ref)
