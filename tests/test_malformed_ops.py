"""Malformed-input sweep of ``needle.ops`` (issue 11): every op function with wrong arity,
a TensorTuple where a Tensor belongs (and back), bad axes, shapes, scalars and sizes (NaN
included), and the op constructors with bad parameters.

Every case makes one malformed call beside a (3, 4) leaf that requires grad, expects the
documented exception, then runs a forward and backward pass on the leaf and checks that the
device's allocated bytes are unchanged.
"""

import numpy as np
import pytest

import needle as ndl
from needle import ops

from devices import DEVICES
from malformed import case, run_case

NAN = float("nan")
INF = float("inf")


def _t(x, shape, value=1.0):
    return ndl.Tensor(np.full(shape, value, np.float32), device=x.device)


def _img(x):
    return _t(x, (1, 5, 5, 2))


def _w(x, cin=2):
    return _t(x, (3, 3, cin, 4))


def _labels(x, values):
    return ndl.Tensor(np.array(values, np.float32), device=x.device)


ELEMENTWISE = [
    case("add-arity", lambda x: ops.add(x), TypeError),
    case("add-shape", lambda x: ops.add(x, _t(x, (5,))), ValueError),
    case("add-number", lambda x: ops.add(x, 3), TypeError),
    case("add-tuple", lambda x: ops.add(ops.make_tuple(x, x), x), TypeError),
    case("ewise-add-one-input", lambda x: ops.EWiseAdd()(x), TypeError),
    case("ewise-add-three-inputs", lambda x: ops.EWiseAdd()(x, x, x), TypeError),
    case("ewise-add-ndarray", lambda x: ops.EWiseAdd()(x, x.cached_data), TypeError),
    case("ewise-add-kwargs", lambda x: ops.EWiseAdd()(x, x, scale=2), TypeError),
    case("multiply-shape", lambda x: ops.multiply(x, _t(x, (4, 3))), ValueError),
    case("multiply-str", lambda x: ops.multiply(x, "x"), TypeError),
    case("divide-shape", lambda x: ops.divide(x, _t(x, (5,))), ValueError),
    case("power-int", lambda x: ops.power(x, 2), TypeError),
    case("power-shape", lambda x: ops.power(x, _t(x, (2,))), ValueError),
    case("add-scalar-str", lambda x: ops.add_scalar(x, "s"), TypeError),
    case("add-scalar-none", lambda x: ops.add_scalar(x, None), TypeError),
    case("add-scalar-tensor", lambda x: ops.add_scalar(x, x), TypeError),
    case("add-scalar-complex", lambda x: ops.add_scalar(x, 1j), TypeError),
    case("mul-scalar-list", lambda x: ops.mul_scalar(x, [1.0]), TypeError),
    case("power-scalar-str", lambda x: ops.power_scalar(x, "2"), TypeError),
    case("divide-scalar-str", lambda x: ops.divide_scalar(x, "2"), TypeError),
    case("divide-scalar-numpy-array", lambda x: ops.divide_scalar(x, np.ones(3)), TypeError),
    case("negate-arity", lambda x: ops.Negate()(x, x), TypeError),
    case("log-str", lambda x: ops.log("x"), TypeError),
    case("exp-none", lambda x: ops.exp(None), TypeError),
    case("relu-int", lambda x: ops.relu(3), TypeError),
    case("tanh-ndarray", lambda x: ops.tanh(x.cached_data), TypeError),
    case("sigmoid-list", lambda x: ops.sigmoid([1.0]), TypeError),
    case("sqrt-numpy", lambda x: ops.sqrt(np.ones(3, np.float32)), TypeError),
    case("exp-tuple", lambda x: ops.exp(ops.make_tuple(x)), TypeError),
    case(
        "add-other-device",
        lambda x: ops.add(x, ndl.Tensor(np.ones((3, 4), np.float32), device=ndl.cpu_numpy())),
        ndl.DeviceError,
    ),
]

SHAPES = [
    case("transpose-one-axis", lambda x: ops.transpose(x, (0,)), ValueError),
    case("transpose-range", lambda x: ops.transpose(x, (0, 2)), ValueError),
    case("transpose-three-axes", lambda x: ops.transpose(x, (0, 1, 2)), ValueError),
    case("transpose-str", lambda x: ops.transpose(x, "ab"), TypeError),
    case("transpose-nan", lambda x: ops.transpose(x, (NAN, 0)), TypeError),
    case("transpose-1d", lambda x: ops.transpose(_t(x, (3,))), ValueError),
    case("reshape-size", lambda x: ops.reshape(x, (5,)), ValueError),
    case("reshape-str", lambda x: ops.reshape(x, "x"), TypeError),
    case("reshape-nan", lambda x: ops.reshape(x, (NAN,)), TypeError),
    case("reshape-2**64", lambda x: ops.reshape(x, (2**64,)), ValueError),
    case("reshape-17-dims", lambda x: ops.reshape(x, (12,) + (1,) * 16), ValueError),
    case("reshape-two-minus-one", lambda x: ops.reshape(x, (-1, -1)), ValueError),
    case("broadcast-shape", lambda x: ops.broadcast_to(x, (5, 4)), ValueError),
    case("broadcast-fewer-dims", lambda x: ops.broadcast_to(x, (4,)), ValueError),
    case("broadcast-huge", lambda x: ops.broadcast_to(x, (2**62, 2**62, 3, 4)), ValueError),
    case("broadcast-none", lambda x: ops.broadcast_to(x, None), TypeError),
    case("broadcast-negative", lambda x: ops.broadcast_to(x, (-2, 3, 4)), ValueError),
    case("summation-range", lambda x: ops.summation(x, axes=2), ValueError),
    case("summation-repeated", lambda x: ops.summation(x, axes=(0, 0)), ValueError),
    case("summation-str", lambda x: ops.summation(x, axes="x"), TypeError),
    case("summation-float", lambda x: ops.summation(x, axes=1.5), TypeError),
    case("summation-nan", lambda x: ops.summation(x, axes=NAN), TypeError),
    case("summation-2**64", lambda x: ops.summation(x, axes=2**64), ValueError),
    case("max-range", lambda x: ops.max(x, axes=5), ValueError),
    case("max-str", lambda x: ops.max(x, axes="a"), TypeError),
    case("matmul-shape", lambda x: ops.matmul(x, x), ValueError),
    case("matmul-int", lambda x: ops.matmul(x, 3), TypeError),
    case("matmul-vector", lambda x: ops.matmul(x, _t(x, (5,))), ValueError),
    case("matmul-tuple", lambda x: ops.matmul(x, ops.make_tuple(x)), TypeError),
    case("matmul-bias-inner", lambda x: ops.matmul_bias(x, x, _t(x, (1, 4))), ValueError),
    case("matmul-bias-shape", lambda x: ops.matmul_bias(x, _t(x, (4, 2)), _t(x, (3,))), ValueError),
    case(
        "matmul-bias-grows",
        lambda x: ops.matmul_bias(x, _t(x, (4, 2)), _t(x, (5, 3, 2))),
        ValueError,
    ),
    case("matmul-bias-vector", lambda x: ops.matmul_bias(x, _t(x, (4,)), _t(x, (1,))), ValueError),
    case("matmul-bias-none", lambda x: ops.matmul_bias(x, _t(x, (4, 2)), None), TypeError),
    case("matmul-bias-number", lambda x: ops.matmul_bias(x, _t(x, (4, 2)), 1.0), TypeError),
    case("matmul-bias-arity", lambda x: ops.MatMulBias()(x, _t(x, (4, 2))), TypeError),
    case("stack-shapes", lambda x: ops.stack([x, _t(x, (4, 3))], 0), ValueError),
    case("stack-empty", lambda x: ops.stack([], 0), ValueError),
    case("stack-number", lambda x: ops.stack([x, 1], 0), TypeError),
    case("stack-axis-range", lambda x: ops.stack([x, x], 5), ValueError),
    case("stack-axis-str", lambda x: ops.stack([x, x], "a"), TypeError),
    case("stack-axis-nan", lambda x: ops.stack([x, x], NAN), TypeError),
    case("stack-of-tensor", lambda x: ops.Stack(0)(x), TypeError),
    case("split-axis-range", lambda x: ops.split(x, 2), ValueError),
    case("split-axis-negative", lambda x: ops.split(x, -3), ValueError),
    case("split-axis-str", lambda x: ops.split(x, "a"), TypeError),
    case("split-tuple", lambda x: ops.split(ops.make_tuple(x), 0), TypeError),
    case("flip-range", lambda x: ops.flip(x, (2,)), ValueError),
    case("flip-str", lambda x: ops.flip(x, "x"), TypeError),
    case("dilate-negative", lambda x: ops.dilate(x, (0,), -1), ValueError),
    case("dilate-axis-range", lambda x: ops.dilate(x, (5,), 1), ValueError),
    case("dilate-str", lambda x: ops.dilate(x, (0,), "x"), TypeError),
    case("dilate-nan", lambda x: ops.dilate(x, (0,), NAN), TypeError),
    case("dilate-huge", lambda x: ops.dilate(x, (0,), 2**40), ValueError),
    case("undilate-negative", lambda x: ops.undilate(x, (0,), -1), ValueError),
    case("undilate-axis-range", lambda x: ops.undilate(x, (7,), 1), ValueError),
    case(
        "undilate-step-past-axis",
        lambda x: ops.undilate(x, (0,), 5),
        ValueError,
        r"undilate: dilation 5 \(a step of 6\) is larger than axis 0",
    ),
    case("getitem-range", lambda x: ops.getitem(x, 5), IndexError),
    case("getitem-str", lambda x: ops.getitem(x, "a"), TypeError),
    case("getitem-float", lambda x: ops.getitem(x, 1.5), TypeError),
    case("getitem-object", lambda x: ops.GetItem(object())(x), TypeError),
    case("getitem-step-zero", lambda x: ops.getitem(x, slice(None, None, 0)), ValueError),
]

NN = [
    case("conv-2d-input", lambda x: ops.conv(x, x), ValueError),
    case("conv-channels", lambda x: ops.conv(_img(x), _w(x, cin=3)), ValueError),
    case("conv-stride-zero", lambda x: ops.conv(_img(x), _w(x), stride=0), ValueError),
    case("conv-stride-negative", lambda x: ops.conv(_img(x), _w(x), stride=-1), ValueError),
    case("conv-stride-str", lambda x: ops.conv(_img(x), _w(x), stride="x"), TypeError),
    case("conv-stride-float", lambda x: ops.conv(_img(x), _w(x), stride=1.5), TypeError),
    case("conv-padding-negative", lambda x: ops.conv(_img(x), _w(x), padding=-1), ValueError),
    case("conv-padding-nan", lambda x: ops.conv(_img(x), _w(x), padding=NAN), TypeError),
    case(
        "conv-kernel-too-big",
        lambda x: ops.conv(_img(x), _t(x, (9, 9, 2, 4)), padding=0),
        ValueError,
    ),
    case("conv-padding-huge", lambda x: ops.conv(_img(x), _w(x), padding=2**40), ValueError),
    case("gather-rows-range", lambda x: ops.gather_rows(x, _labels(x, [5.0])), IndexError),
    case("gather-rows-fraction", lambda x: ops.gather_rows(x, _labels(x, [0.5])), IndexError),
    case("gather-rows-nan", lambda x: ops.gather_rows(x, _labels(x, [NAN])), IndexError),
    case("gather-rows-inf", lambda x: ops.gather_rows(x, _labels(x, [INF])), IndexError),
    case("gather-rows-negative", lambda x: ops.gather_rows(x, _labels(x, [-1.0])), IndexError),
    case(
        "gather-rows-1d-table",
        lambda x: ops.gather_rows(_t(x, (3,)), _labels(x, [0.0])),
        ValueError,
    ),
    case(
        "scatter-rows-range",
        lambda x: ops.scatter_add_rows(x, _labels(x, [0.0, 1.0, 9.0]), 4),
        IndexError,
    ),
    case(
        "scatter-rows-negative-count",
        lambda x: ops.scatter_add_rows(x, _labels(x, [0.0, 1.0, 2.0]), -1),
        ValueError,
    ),
    case(
        "scatter-rows-str-count",
        lambda x: ops.scatter_add_rows(x, _labels(x, [0.0, 1.0, 2.0]), "x"),
        TypeError,
    ),
    case(
        "scatter-rows-nan-count",
        lambda x: ops.scatter_add_rows(x, _labels(x, [0.0, 1.0, 2.0]), NAN),
        TypeError,
    ),
    case(
        "scatter-rows-index-shape",
        lambda x: ops.scatter_add_rows(x, _labels(x, [0.0]), 4),
        ValueError,
    ),
    case("logsumexp-range", lambda x: ops.logsumexp(x, axes=2), ValueError),
    case("logsumexp-str", lambda x: ops.logsumexp(x, axes="a"), TypeError),
    case("logsumexp-repeated", lambda x: ops.logsumexp(x, axes=(0, 0)), ValueError),
    case("logsoftmax-3d", lambda x: ops.logsoftmax(_t(x, (2, 2, 2))), ValueError),
    case(
        "softmax-ce-label-shape",
        lambda x: ops.softmax_cross_entropy(x, _labels(x, [0.0, 1.0])),
        ValueError,
    ),
    case(
        "softmax-ce-label-range",
        lambda x: ops.softmax_cross_entropy(x, _labels(x, [5.0, 0.0, 0.0])),
        IndexError,
    ),
    case(
        "softmax-ce-label-nan",
        lambda x: ops.softmax_cross_entropy(x, _labels(x, [NAN, 0.0, 0.0])),
        IndexError,
    ),
    case(
        "softmax-ce-label-fraction",
        lambda x: ops.softmax_cross_entropy(x, _labels(x, [0.5, 0.0, 0.0])),
        IndexError,
    ),
    case(
        "softmax-ce-1d-logits",
        lambda x: ops.softmax_cross_entropy(_t(x, (4,)), _labels(x, [0.0])),
        ValueError,
    ),
    case("make-tuple-number", lambda x: ops.make_tuple(x, 1), TypeError),
    case("make-tuple-of-tuple", lambda x: ops.make_tuple(ops.make_tuple(x)), TypeError),
    case("tuple-get-item-range", lambda x: ops.tuple_get_item(ops.make_tuple(x), 3), IndexError),
    case("tuple-get-item-str", lambda x: ops.tuple_get_item(ops.make_tuple(x), "a"), TypeError),
    case("tuple-get-item-tensor", lambda x: ops.tuple_get_item(x, 0), TypeError),
    case("fused-add-scalars-str", lambda x: ops.fused_add_scalars(x, "a", 1), TypeError),
    case(
        "fused-add-scalars-tuple",
        lambda x: ops.fused_add_scalars(ops.make_tuple(x), 1, 2),
        TypeError,
    ),
]

CONSTRUCTORS = [
    case("ctor-summation-axes-str", lambda x: ops.Summation(axes="x"), TypeError),
    case("ctor-summation-axes-float", lambda x: ops.Summation(axes=1.5), TypeError),
    case("ctor-summation-axes-mixed", lambda x: ops.Summation(axes=(0, "a")), TypeError),
    case("ctor-summation-axes-nan", lambda x: ops.Summation(axes=(NAN,)), TypeError),
    case("ctor-summation-axes-17", lambda x: ops.Summation(axes=tuple(range(17))), ValueError),
    case("ctor-max-axes-object", lambda x: ops.Max(axes=object()), TypeError),
    case("ctor-transpose-axes-str", lambda x: ops.Transpose("ab"), TypeError),
    case("ctor-reshape-shape-str", lambda x: ops.Reshape("x"), TypeError),
    case("ctor-reshape-shape-none", lambda x: ops.Reshape(None), TypeError),
    case("ctor-broadcast-shape-float", lambda x: ops.BroadcastTo((2.5,)), TypeError),
    case("ctor-add-scalar-str", lambda x: ops.AddScalar("x"), TypeError),
    case("ctor-add-scalar-missing", lambda x: ops.AddScalar(), TypeError),
    case("ctor-mul-scalar-none", lambda x: ops.MulScalar(None), TypeError),
    case("ctor-power-scalar-str", lambda x: ops.PowerScalar("2"), TypeError),
    case("ctor-div-scalar-list", lambda x: ops.DivScalar([1]), TypeError),
    case("ctor-stack-axis-str", lambda x: ops.Stack("a"), TypeError),
    case("ctor-stack-axis-nan", lambda x: ops.Stack(NAN), TypeError),
    case("ctor-stack-axis-2**64", lambda x: ops.Stack(2**64), ValueError),
    case("ctor-split-axis-float", lambda x: ops.Split(1.5), TypeError),
    case("ctor-flip-axes-str", lambda x: ops.Flip("a"), TypeError),
    case("ctor-dilate-negative", lambda x: ops.Dilate((0,), -1), ValueError),
    case("ctor-dilate-str", lambda x: ops.Dilate((0,), "x"), TypeError),
    case("ctor-undilate-axes-str", lambda x: ops.UnDilate("a", 1), TypeError),
    case("ctor-conv-stride-zero", lambda x: ops.Conv(stride=0), ValueError),
    case("ctor-conv-stride-str", lambda x: ops.Conv(stride="a"), TypeError),
    case("ctor-conv-padding-negative", lambda x: ops.Conv(padding=-1), ValueError),
    case("ctor-conv-padding-inf", lambda x: ops.Conv(padding=INF), TypeError),
    case("ctor-logsumexp-axes-str", lambda x: ops.LogSumExp(axes="a"), TypeError),
    case("ctor-tuple-get-item-str", lambda x: ops.TupleGetItem("a"), TypeError),
    case("ctor-tuple-get-item-float", lambda x: ops.TupleGetItem(0.5), TypeError),
    case("ctor-scatter-rows-negative", lambda x: ops.ScatterAddRows(-1), ValueError),
    case("ctor-scatter-rows-nan", lambda x: ops.ScatterAddRows(NAN), TypeError),
    case("ctor-fused-add-scalars-str", lambda x: ops.FusedAddScalars("a", 1), TypeError),
    case("ctor-fused-add-scalars-missing", lambda x: ops.FusedAddScalars(1), TypeError),
    case("ctor-ewise-add-args", lambda x: ops.EWiseAdd(1), TypeError),
    case("ctor-exp-kwargs", lambda x: ops.Exp(axis=0), TypeError),
    case("ctor-op-compute-arity", lambda x: ops.EWiseAdd().compute(x.cached_data), TypeError),
    case("ctor-op-compute-tensor", lambda x: ops.Exp().compute(x), TypeError),
    case("ctor-op-gradient-arity", lambda x: ops.Exp().gradient(x), TypeError),
    case("ctor-op-gradient-node", lambda x: ops.Exp().gradient(x, "node"), TypeError),
]

EXPECTED = np.arange(12, dtype=np.float32).reshape(3, 4)


def _subject(device):
    return ndl.Tensor(EXPECTED, device=device, requires_grad=True)


def _normal(x):
    np.testing.assert_array_equal(x.numpy(), EXPECTED)
    ops.summation(ops.exp(x * 0.1), axes=(0, 1)).backward()
    np.testing.assert_allclose(x.grad.numpy(), 0.1 * np.exp(0.1 * EXPECTED), rtol=1e-5)
    x.grad = None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", ELEMENTWISE + SHAPES)
def test_ops_elementwise_and_shapes(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", NN + CONSTRUCTORS)
def test_ops_nn_and_constructors(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)
