"""Malformed-input sweep of the autograd layer (issue 11): Tensor construction, Tensor
attributes (op, inputs, cached_data, grad, data, num_outputs), operators and methods,
backward with a bad out_grad, and the graph functions.

Every case makes one malformed call on a (3, 4) leaf that requires grad, expects the documented
exception, then runs a forward and backward pass on the same leaf and checks that the device's
allocated bytes are unchanged. ``requires_grad`` follows Python truthiness, as in the course
(``if requires_grad``), so only values whose truth cannot be taken are malformed.
"""

import numpy as np
import pytest

import needle as ndl

from devices import DEVICES
from malformed import case, run_case

NAN = float("nan")


class _NoBool:
    def __bool__(self):
        raise TypeError("no truth value")


def _set(obj, name, value):
    setattr(obj, name, value)


def _fresh(x, **kw):
    """A new leaf like x (so attribute cases do not damage the subject)."""
    return ndl.Tensor(np.ones((3, 4), np.float32), device=x.device, **kw)


def _other(x):
    return ndl.Tensor(np.ones((3, 4), np.float32), device=ndl.cpu_numpy())


def _loss(x):
    return (x * 2).sum()


CONSTRUCTION = [
    case("tensor-str", lambda x: ndl.Tensor("abc", device=x.device), TypeError),
    case("tensor-bytes", lambda x: ndl.Tensor(b"abc", device=x.device), TypeError),
    case("tensor-object", lambda x: ndl.Tensor(object(), device=x.device), TypeError),
    case("tensor-ragged", lambda x: ndl.Tensor([[1.0], [2.0, 3.0]], device=x.device), ValueError),
    case("tensor-17-dims", lambda x: ndl.Tensor(np.zeros((1,) * 17, np.float32)), ValueError),
    case("tensor-dtype-int64", lambda x: ndl.Tensor([1.0], dtype="int64"), TypeError),
    case("tensor-dtype-int32", lambda x: ndl.Tensor([1.0], dtype="int32"), TypeError),
    case("tensor-dtype-object", lambda x: ndl.Tensor([1.0], dtype=object()), TypeError),
    case("tensor-of-tensor-dtype", lambda x: ndl.Tensor(x, dtype="uint8"), TypeError),
    case("tensor-device-name", lambda x: ndl.Tensor([1.0], device="gpu9"), ValueError),
    case("tensor-device-index", lambda x: ndl.Tensor([1.0], device="cuda:x"), ValueError),
    case("tensor-device-int", lambda x: ndl.Tensor([1.0], device=5), TypeError),
    case("tensor-device-float", lambda x: ndl.Tensor([1.0], device=NAN), TypeError),
    case(
        "tensor-requires-grad-array",
        lambda x: ndl.Tensor([1.0], requires_grad=np.ones(2)),
        ValueError,
    ),
    case(
        "tensor-requires-grad-nobool",
        lambda x: ndl.Tensor([1.0], requires_grad=_NoBool()),
        TypeError,
    ),
    case("make-const-str", lambda x: ndl.Tensor.make_const("x"), TypeError),
    case("make-const-list", lambda x: ndl.Tensor.make_const([1.0]), TypeError),
    case(
        "make-const-nobool",
        lambda x: ndl.Tensor.make_const(x.cached_data, requires_grad=_NoBool()),
        TypeError,
    ),
    case("make-from-op-none", lambda x: ndl.Tensor.make_from_op(None, [x]), TypeError),
    case(
        "make-from-op-arity", lambda x: ndl.Tensor.make_from_op(ndl.ops.EWiseAdd(), [x]), TypeError
    ),
    case(
        "make-from-op-number",
        lambda x: ndl.Tensor.make_from_op(ndl.ops.EWiseAdd(), [x, 1]),
        TypeError,
    ),
    case("make-from-op-str", lambda x: ndl.Tensor.make_from_op(ndl.ops.Exp(), "ab"), TypeError),
    case(
        "make-from-op-tuple-op", lambda x: ndl.Tensor.make_from_op(ndl.ops.Split(0), [x]), TypeError
    ),
    case("from-dlpack-tensor-dtype", lambda x: ndl.Tensor(np.arange(3), dtype="int64"), TypeError),
]

ATTRIBUTES = [
    case("op-object", lambda x: _set(_fresh(x), "op", object()), TypeError),
    case("op-str", lambda x: _set(_fresh(x), "op", "exp"), TypeError),
    case("op-class", lambda x: _set(_fresh(x), "op", ndl.ops.Exp), TypeError),
    case("inputs-number", lambda x: _set(_fresh(x), "inputs", [1]), TypeError),
    case("inputs-int", lambda x: _set(_fresh(x), "inputs", 5), TypeError),
    case("inputs-str", lambda x: _set(_fresh(x), "inputs", "ab"), TypeError),
    case("inputs-ndarray", lambda x: _set(_fresh(x), "inputs", [x.cached_data]), TypeError),
    case("cached-data-str", lambda x: _set(_fresh(x), "cached_data", "x"), TypeError),
    case("cached-data-numpy", lambda x: _set(_fresh(x), "cached_data", np.zeros(3)), TypeError),
    case("cached-data-tensor", lambda x: _set(_fresh(x), "cached_data", x), TypeError),
    case(
        "cached-data-mixed-tuple",
        lambda x: _set(_fresh(x), "cached_data", (x.cached_data, 1)),
        TypeError,
    ),
    case("grad-int", lambda x: _set(_fresh(x), "grad", 3), TypeError),
    case("grad-str", lambda x: _set(_fresh(x), "grad", "x"), TypeError),
    case("grad-ndarray", lambda x: _set(_fresh(x), "grad", x.cached_data), TypeError),
    case("grad-numpy", lambda x: _set(_fresh(x), "grad", np.ones((3, 4))), TypeError),
    case("requires-grad-array", lambda x: _set(_fresh(x), "requires_grad", np.ones(2)), ValueError),
    case("requires-grad-nobool", lambda x: _set(_fresh(x), "requires_grad", _NoBool()), TypeError),
    case("num-outputs-str", lambda x: _set(_fresh(x), "num_outputs", "x"), TypeError),
    case("num-outputs-negative", lambda x: _set(_fresh(x), "num_outputs", -5), ValueError),
    case("num-outputs-zero", lambda x: _set(_fresh(x), "num_outputs", 0), ValueError),
    case("num-outputs-float", lambda x: _set(_fresh(x), "num_outputs", 1.5), TypeError),
    case("data-int", lambda x: _set(_fresh(x), "data", 3), TypeError),
    case("data-ndarray", lambda x: _set(_fresh(x), "data", x.cached_data), TypeError),
    case("data-none", lambda x: _set(_fresh(x), "data", None), TypeError),
    case("init-num-outputs", lambda x: _fresh(x)._init(None, [], num_outputs=-1), ValueError),
    case("init-inputs", lambda x: _fresh(x)._init(None, [3]), TypeError),
    case("init-op", lambda x: _fresh(x)._init(3, []), TypeError),
    # A leaf whose data was cleared raises ValueError on use (not a crash).
    case(
        "no-data-leaf-use",
        lambda x: (lambda t: (_set(t, "cached_data", None), t + 1))(_fresh(x)),
        ValueError,
    ),
]


def _python_op(result, base=ndl.autograd.TensorOp):
    """A Python op whose compute returns ``result(a)`` (something that is not its kind of data)."""

    class BadCompute(base):
        def compute(self, a):
            return result(a)

    return BadCompute()


GRAPH = [
    case("py-op-returns-numpy", lambda x: _python_op(lambda a: a.numpy())(x), TypeError),
    case("py-op-returns-none", lambda x: _python_op(lambda a: None)(x), TypeError),
    case("py-op-returns-int", lambda x: _python_op(lambda a: 5)(x), TypeError),
    case("py-op-returns-tuple", lambda x: _python_op(lambda a: (a, a))(x), TypeError),
    case(
        "py-tuple-op-returns-array",
        lambda x: _python_op(lambda a: a, ndl.autograd.TensorTupleOp)(x),
        TypeError,
    ),
    case("py-op-raises", lambda x: _python_op(lambda a: a[5])(x), IndexError),
    case(
        "tuple-data-on-tensor",
        lambda x: (lambda t: (_set(t, "cached_data", (x.cached_data,)), t + 1))(_fresh(x)),
        TypeError,
    ),
    case(
        "array-data-on-tuple",
        lambda x: (lambda t: (_set(t, "cached_data", x.cached_data), t[0]))(ndl.make_tuple(x, x)),
        TypeError,
    ),
    case(
        "empty-tuple-index",
        lambda x: (lambda t: (_set(t, "cached_data", ()), t[0]))(ndl.make_tuple(x)),
        IndexError,
    ),
    case(
        "inputs-cleared",
        lambda x: (lambda y: (_set(y, "inputs", []), y.sum().backward()))(ndl.exp(x)),
        ValueError,
    ),
    case(
        "inputs-extra",
        lambda x: (lambda y: (_set(y, "inputs", [x, x, x]), y.sum().backward()))(ndl.exp(x)),
        ValueError,
    ),
    case(
        "op-swapped",
        lambda x: (lambda y: (_set(y, "op", ndl.ops.Summation((0,))), y.sum().backward()))(
            ndl.exp(x)
        ),
        ValueError,
    ),
    case(
        "op-no-gradient",
        lambda x: (lambda y: (_set(y, "op", ndl.ops.TensorOp()), y.sum().backward()))(ndl.exp(x)),
        NotImplementedError,
    ),
    case(
        "realize-arity",
        lambda x: (
            lambda t: (
                _set(t, "op", ndl.ops.EWiseAdd()),
                _set(t, "cached_data", None),
                t.realize_cached_data(),
            )
        )(_fresh(x)),
        TypeError,
    ),
    case(
        "backward-shape",
        lambda x: _loss(x).backward(ndl.Tensor([1.0, 2.0], device=x.device)),
        ValueError,
    ),
    case(
        "backward-shape-2d",
        lambda x: (x * 2).backward(ndl.Tensor(np.ones((4, 3), np.float32), device=x.device)),
        ValueError,
    ),
    case("backward-str", lambda x: _loss(x).backward("x"), TypeError),
    case("backward-int", lambda x: _loss(x).backward(3), TypeError),
    case("backward-ndarray", lambda x: _loss(x).backward(x.cached_data), TypeError),
    case("backward-numpy", lambda x: _loss(x).backward(np.ones(1, np.float32)), TypeError),
    case("backward-other-device", lambda x: (x * 2).backward(_other(x)), ndl.DeviceError),
    case("backward-tuple", lambda x: _loss(x).backward(ndl.make_tuple(x)), TypeError),
    case(
        "compute-gradient-str",
        lambda x: ndl.autograd.compute_gradient_of_variables(_loss(x), "x"),
        TypeError,
    ),
    case(
        "compute-gradient-output",
        lambda x: ndl.autograd.compute_gradient_of_variables("y", None),
        TypeError,
    ),
    case("topo-sort-int", lambda x: ndl.autograd.find_topo_sort(5), TypeError),
    case("topo-sort-list-int", lambda x: ndl.autograd.find_topo_sort([5]), TypeError),
    case("graph-mode-name", lambda x: ndl.autograd.set_graph_mode("fast"), ValueError),
    case("graph-mode-int", lambda x: ndl.autograd.set_graph_mode(1), TypeError),
]

METHODS = [
    case("add-shape", lambda x: x + ndl.Tensor([1.0] * 5, device=x.device), ValueError),
    case("add-str", lambda x: x + "x", TypeError),
    case("radd-str", lambda x: "x" + x, TypeError),
    case("sub-none", lambda x: x - None, TypeError),
    case("rsub-str", lambda x: "x" - x, TypeError),
    case("mul-list", lambda x: x * [1.0], TypeError),
    case("div-object", lambda x: x / object(), TypeError),
    case("rdiv-str", lambda x: "x" / x, TypeError),
    case("pow-str", lambda x: x ** "x", TypeError),
    case("matmul-int", lambda x: x @ 3, TypeError),
    case("matmul-shape", lambda x: x @ x, ValueError),
    case("add-ndarray", lambda x: x + x.cached_data, TypeError),
    case("add-other-device", lambda x: x + _other(x), ndl.DeviceError),
    case("mul-other-device", lambda x: x * _other(x), ndl.DeviceError),
    case("sum-axes-range", lambda x: x.sum(axes=5), ValueError),
    case("sum-axes-str", lambda x: x.sum(axes="x"), TypeError),
    case("sum-axes-repeated", lambda x: x.sum(axes=(0, 0)), ValueError),
    case("reshape-str", lambda x: x.reshape("x"), TypeError),
    case("reshape-size", lambda x: x.reshape((5,)), ValueError),
    case("reshape-nan", lambda x: x.reshape((NAN,)), TypeError),
    case("transpose-range", lambda x: x.transpose((5, 0)), ValueError),
    case("transpose-str", lambda x: x.transpose("ab"), TypeError),
    case("broadcast-shape", lambda x: x.broadcast_to((7,)), ValueError),
    case("broadcast-huge", lambda x: x.broadcast_to((2**62, 2**62, 3, 4)), ValueError),
    case("getitem-range", lambda x: x[3], IndexError),
    case("getitem-float", lambda x: x[1.5], TypeError),
    case("getitem-str", lambda x: x["a"], TypeError),
    case("getitem-step-zero", lambda x: x[::0], ValueError),
    case("getitem-too-many", lambda x: x[0, 0, 0], IndexError),
    case("tuple-index-range", lambda x: ndl.make_tuple(x)[3], IndexError),
    case("tuple-index-str", lambda x: ndl.make_tuple(x)["a"], TypeError),
    case("tuple-add-tensor", lambda x: ndl.make_tuple(x) + x, TypeError),
    case("tuple-add-length", lambda x: ndl.make_tuple(x) + ndl.make_tuple(x, x), ValueError),
    case("tuple-numpy", lambda x: ndl.make_tuple(x).numpy(), TypeError),
]

EXPECTED = np.arange(12, dtype=np.float32).reshape(3, 4)


def _subject(device):
    return ndl.Tensor(EXPECTED, device=device, requires_grad=True)


def _normal(x):
    np.testing.assert_array_equal(x.numpy(), EXPECTED)
    ndl.exp(x * 0.1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 0.1 * np.exp(0.1 * EXPECTED), rtol=1e-5)
    x.grad = None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", CONSTRUCTION + ATTRIBUTES)
def test_tensor_construction_and_attributes(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", GRAPH + METHODS)
def test_tensor_graph_and_methods(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)
