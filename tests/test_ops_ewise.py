"""Tensor ops: the exported op classes and functions, and the elementwise ops (with
scalars, powers, activations), checked by ``gradcheck.check_op`` on every device in
``DEVICES`` under both graph modes: forward against NumPy, gradient against float64
central differences, and the two modes against each other."""

import numpy as np
import pytest

import needle as ndl

from devices import dev
from gradcheck import MODES, check_op
from op_refs import SHAPE, rnd, sigmoid_ref

# --------------------------------------------------------------------------
# names
# --------------------------------------------------------------------------

OP_CLASSES = [
    "EWiseAdd",
    "AddScalar",
    "EWiseMul",
    "MulScalar",
    "EWisePow",
    "PowerScalar",
    "EWiseDiv",
    "DivScalar",
    "Transpose",
    "Reshape",
    "BroadcastTo",
    "Summation",
    "MatMul",
    "MatMulBias",
    "Negate",
    "Log",
    "Exp",
    "ReLU",
    "Tanh",
    "Sigmoid",
    "Sqrt",
    "Max",
    "Stack",
    "Split",
    "Flip",
    "Dilate",
    "UnDilate",
    "Conv",
    "LogSoftmax",
    "LogSumExp",
    "MakeTensorTuple",
    "TupleGetItem",
    "FusedAddScalars",
    "GetItem",
    "GatherRows",
    "SoftmaxCrossEntropy",
]
OP_FUNCTIONS = [
    "add",
    "add_scalar",
    "multiply",
    "mul_scalar",
    "power",
    "power_scalar",
    "divide",
    "divide_scalar",
    "transpose",
    "reshape",
    "broadcast_to",
    "summation",
    "matmul",
    "matmul_bias",
    "negate",
    "log",
    "exp",
    "relu",
    "tanh",
    "sigmoid",
    "sqrt",
    "max",
    "stack",
    "split",
    "flip",
    "dilate",
    "undilate",
    "conv",
    "logsoftmax",
    "logsumexp",
    "make_tuple",
    "tuple_get_item",
    "fused_add_scalars",
    "gather_rows",
    "softmax_cross_entropy",
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
        (ndl.add(a, b), ndl.ops.EWiseAdd),
        (a + b, ndl.ops.EWiseAdd),
        (ndl.add_scalar(a, 1.0), ndl.ops.AddScalar),
        (a + 1, ndl.ops.AddScalar),
        (ndl.multiply(a, b), ndl.ops.EWiseMul),
        (a * b, ndl.ops.EWiseMul),
        (ndl.mul_scalar(a, 2.0), ndl.ops.MulScalar),
        (a * 2, ndl.ops.MulScalar),
        (ndl.power(a, b), ndl.ops.EWisePow),
        (a**b, ndl.ops.EWisePow),
        (ndl.power_scalar(a, 2), ndl.ops.PowerScalar),
        (a**2, ndl.ops.PowerScalar),
        (ndl.divide(a, b), ndl.ops.EWiseDiv),
        (a / b, ndl.ops.EWiseDiv),
        (ndl.divide_scalar(a, 2.0), ndl.ops.DivScalar),
        (a / 2, ndl.ops.DivScalar),
        (ndl.negate(a), ndl.ops.Negate),
        (-a, ndl.ops.Negate),
        (ndl.matmul(a, m), ndl.ops.MatMul),
        (a @ m, ndl.ops.MatMul),
        (ndl.matmul_bias(a, m, ndl.Tensor(rnd(3, (1, 4)), device=device)), ndl.ops.MatMulBias),
        (ndl.transpose(a), ndl.ops.Transpose),
        (ndl.reshape(a, (3, 2)), ndl.ops.Reshape),
        (ndl.broadcast_to(a, (4, 2, 3)), ndl.ops.BroadcastTo),
        (ndl.summation(a), ndl.ops.Summation),
        (a.sum(), ndl.ops.Summation),
        (ndl.log(a), ndl.ops.Log),
        (ndl.exp(a), ndl.ops.Exp),
        (ndl.relu(a), ndl.ops.ReLU),
        (ndl.tanh(a), ndl.ops.Tanh),
        (ndl.sigmoid(a), ndl.ops.Sigmoid),
        (ndl.sqrt(a), ndl.ops.Sqrt),
        (ndl.max(a, axes=1), ndl.ops.Max),
        (ndl.stack([a, b], 0), ndl.ops.Stack),
        (ndl.split(a, 0), ndl.ops.Split),
        (ndl.flip(a, (0,)), ndl.ops.Flip),
        (ndl.dilate(a, (0,), 1), ndl.ops.Dilate),
        (ndl.logsoftmax(a), ndl.ops.LogSoftmax),
        (ndl.logsumexp(a, axes=(1,)), ndl.ops.LogSumExp),
        (ndl.make_tuple(a, b), ndl.ops.MakeTensorTuple),
        (ndl.fused_add_scalars(a, 1.0, 2.0), ndl.ops.FusedAddScalars),
        (a[0], ndl.ops.GetItem),
    ]
    for i, (value, cls) in enumerate(cases):
        assert type(value.op) is cls, (
            f"case {i}: op {type(value.op).__name__}, expected {cls.__name__}"
        )
        assert all(isinstance(x, ndl.autograd.Value) for x in value.inputs)


# --------------------------------------------------------------------------
# elementwise
# --------------------------------------------------------------------------


@dev
def test_add(device):
    check_op(ndl.add, rnd(0, SHAPE), rnd(1, SHAPE), device=device, reference=lambda a, b: a + b)
    check_op(
        lambda a, b: a + b,
        rnd(2, SHAPE),
        rnd(3, SHAPE),
        device=device,
        reference=lambda a, b: a + b,
    )
    check_op(
        lambda a, b: ndl.ops.EWiseAdd()(a, b),
        rnd(4, SHAPE),
        rnd(5, SHAPE),
        device=device,
        reference=lambda a, b: a + b,
    )


@dev
def test_add_same_input_twice(device):
    check_op(lambda a: a + a, rnd(0, SHAPE), device=device, reference=lambda a: a + a)


@dev
def test_add_scalar(device):
    check_op(
        lambda a: ndl.add_scalar(a, 1.5), rnd(0, SHAPE), device=device, reference=lambda a: a + 1.5
    )
    check_op(
        lambda a: ndl.ops.AddScalar(-2.0)(a),
        rnd(1, SHAPE),
        device=device,
        reference=lambda a: a - 2.0,
    )
    check_op(lambda a: a + 1, rnd(2, SHAPE), device=device, reference=lambda a: a + 1)
    check_op(lambda a: 1 + a, rnd(3, SHAPE), device=device, reference=lambda a: 1 + a)


@dev
def test_subtract(device):
    check_op(
        lambda a, b: a - b,
        rnd(0, SHAPE),
        rnd(1, SHAPE),
        device=device,
        reference=lambda a, b: a - b,
    )
    check_op(lambda a: a - 2.5, rnd(2, SHAPE), device=device, reference=lambda a: a - 2.5)
    check_op(lambda a: 1 - a, rnd(3, SHAPE), device=device, reference=lambda a: 1 - a)


@dev
def test_multiply(device):
    check_op(
        ndl.multiply, rnd(0, SHAPE), rnd(1, SHAPE), device=device, reference=lambda a, b: a * b
    )
    check_op(
        lambda a, b: a * b,
        rnd(2, SHAPE),
        rnd(3, SHAPE),
        device=device,
        reference=lambda a, b: a * b,
    )
    check_op(lambda a: a * a * a, rnd(4, SHAPE), device=device, reference=lambda a: a * a * a)


@dev
def test_mul_scalar(device):
    check_op(
        lambda a: ndl.mul_scalar(a, -1.5),
        rnd(0, SHAPE),
        device=device,
        reference=lambda a: a * -1.5,
    )
    check_op(
        lambda a: ndl.ops.MulScalar(0.25)(a),
        rnd(1, SHAPE),
        device=device,
        reference=lambda a: a * 0.25,
    )
    check_op(lambda a: 3 * a, rnd(2, SHAPE), device=device, reference=lambda a: 3 * a)
    check_op(lambda a: a * 3, rnd(3, SHAPE), device=device, reference=lambda a: a * 3)


@dev
def test_power(device):
    check_op(
        ndl.power, rnd(0, SHAPE, "pos"), rnd(1, SHAPE), device=device, reference=lambda a, b: a**b
    )
    check_op(
        lambda a, b: a**b,
        rnd(2, SHAPE, "pos"),
        rnd(3, SHAPE),
        device=device,
        reference=lambda a, b: a**b,
    )


@pytest.mark.parametrize("scalar", [2, 3, 0.5, -1, 1.5])
@dev
def test_power_scalar(device, scalar):
    kind = "pos" if scalar != int(scalar) or scalar < 0 else "any"
    check_op(
        lambda a: ndl.power_scalar(a, scalar),
        rnd(0, SHAPE, kind),
        device=device,
        reference=lambda a: a**scalar,
    )
    check_op(lambda a: a**scalar, rnd(1, SHAPE, kind), device=device, reference=lambda a: a**scalar)
    check_op(
        lambda a: ndl.ops.PowerScalar(scalar)(a),
        rnd(2, SHAPE, kind),
        device=device,
        reference=lambda a: a**scalar,
    )


@dev
def test_reflected_power(device):
    check_op(lambda a: 2**a, rnd(0, SHAPE), device=device, reference=lambda a: 2.0**a)


@dev
def test_divide(device):
    check_op(
        ndl.divide,
        rnd(0, SHAPE),
        rnd(1, SHAPE, "nonzero"),
        device=device,
        reference=lambda a, b: a / b,
    )
    check_op(
        lambda a, b: a / b,
        rnd(2, SHAPE),
        rnd(3, SHAPE, "nonzero"),
        device=device,
        reference=lambda a, b: a / b,
    )


@dev
def test_divide_scalar(device):
    check_op(
        lambda a: ndl.divide_scalar(a, 4.0),
        rnd(0, SHAPE),
        device=device,
        reference=lambda a: a / 4.0,
    )
    check_op(
        lambda a: ndl.ops.DivScalar(-0.5)(a),
        rnd(1, SHAPE),
        device=device,
        reference=lambda a: a / -0.5,
    )
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
    check_op(
        lambda a, b: ndl.tanh(a * b + ndl.exp(-a)) / (b * b + 1.0) - ndl.sigmoid(b) ** 2,
        rnd(0, SHAPE),
        rnd(1, SHAPE),
        device=device,
        reference=lambda a, b: np.tanh(a * b + np.exp(-a)) / (b * b + 1.0) - sigmoid_ref(b) ** 2,
    )
