"""Elementwise, shape, reduction, matmul, indexing and convolution ops.

The op classes are implemented in C (compute and gradient); the lowercase
functions are the course's thin wrappers ``fn(...) = Op(...)(...)``. The
elementwise ones are made below from the engine's catalogue (csrc/ewise_ops.h):
a row of ``needle_c.UNARY_OPS`` (exp, log, tanh, sigmoid, relu, abs, erf,
gelu...) gives the class, the function, and the NDArray and Tensor methods; a
row of ``needle_c.BINARY_OPS`` the course's EWise and Scalar classes (EWiseAdd,
AddScalar, ...) with their functions (add, add_scalar, ...), and maximum and
minimum their classes, functions and methods.
"""

import numbers

import numpy

import needle_c as _c
from needle_c import (  # noqa: F401
    AttentionSoftmax,
    BroadcastTo,
    Cast,
    Clamp,
    ClampTensor,
    Conv,
    Dilate,
    Flip,
    GatherRows,
    GetItem,
    LayerNorm,
    MatMul,
    MatMulBias,
    Max,
    Reshape,
    ScatterAddRows,
    ScatterSlice,
    Split,
    Stack,
    Summation,
    Transpose,
    UnDilate,
    Where,
)

from .. import backend_ndarray as array_api  # noqa: F401
from ..autograd import Tensor, TensorOp, TensorTupleOp  # noqa: F401
from ..backend_ndarray import NDArray  # noqa: F401

BACKEND = "nd"


def transpose(a, axes=None):
    return Transpose(axes)(a)


def reshape(a, shape):
    return Reshape(shape)(a)


def broadcast_to(a, shape):
    return BroadcastTo(shape)(a)


def summation(a, axes=None):
    return Summation(axes)(a)


def max(a, axes=None):  # noqa: A001 - ndl.max, as torch.max
    """The maximum over axes (all when None, giving shape (1,)); the gradient is shared
    evenly among ties."""
    return Max(axes)(a)


def cast(a, dtype):
    """a in dtype (ndl.float16, "bfloat16"...): a itself when it has dtype, else a Cast node
    whose gradient is the output gradient cast back to a's dtype (Tensor.astype)."""
    return a.astype(dtype)


def matmul(a, b):
    return MatMul()(a, b)


def matmul_bias(x, weight, bias):
    """x @ weight + bias, bias broadcast to the product's shape (as nn.Linear's (1, out)),
    as one op with one output array: the graph keeps that array instead of both the
    product and the sum. Gradients are MatMul's and the bias' (g summed to its shape)."""
    return MatMulBias()(x, weight, bias)


def layer_norm(x, weight, bias, eps=1e-5):
    """The course's LayerNorm1d over the last axis of x (..., D) as one op: each row
    normalised by its mean and biased variance, weight * (x - mean) / sqrt(var + eps) +
    bias, with weight and bias holding D elements each. Returns x's shape. The gradient
    is the engine's fused backward, or (when recorded: "needle" mode, create_graph) the
    same values composed from differentiable ops."""
    return LayerNorm(eps)(x, weight, bias)


def attention_softmax(logits, divisor=1.0, causal=False):
    """softmax(logits / divisor + mask) over the last axis as one op, the attention
    probabilities of MultiHeadAttention: the mask, when causal, is the course's
    create_causal_mask over the last two axes (queries, keys), -finfo(float32).max added
    where key j > query i + keys - queries. Returns the logits' shape. AttentionSoftmax's
    scalars are (divisor, causal)."""
    return AttentionSoftmax(divisor, 1.0 if causal else 0.0)(logits)


def _unary_function(name, op_class, doc):
    def unary(a):
        return op_class()(a)

    unary.__name__ = unary.__qualname__ = name
    unary.__doc__ = f"{doc} Elementwise ({op_class.__name__}): a Tensor of a's shape and dtype."
    return unary


for _name, _class_name, _doc in _c.UNARY_OPS:
    globals()[_class_name] = getattr(_c, _class_name)
    globals()[_name] = _unary_function(_name, getattr(_c, _class_name), _doc)
del _name, _class_name, _doc

negate = neg  # noqa: F821 - the course's name for the catalogue's neg


def _is_number(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_tensor(name, x, what="input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: {what} must be a Tensor, got {type(x).__name__}")


def _ewise_function(name, op_class, doc):
    def ewise(a, b):
        return op_class()(a, b)

    ewise.__name__ = ewise.__qualname__ = name
    ewise.__doc__ = f"{doc} Elementwise ({op_class.__name__}), a and b broadcast."
    return ewise


def _scalar_function(name, op_class, doc):
    def scalar_op(a, scalar):
        return op_class(scalar)(a)

    scalar_op.__name__ = scalar_op.__qualname__ = name
    scalar_op.__doc__ = f"{doc} Elementwise ({op_class.__name__}) with y the number scalar."
    return scalar_op


def _method_function(name, ewise_class, scalar_class, doc):
    """ndl.ops.<method>(a, b), as Tensor.<method>: b a Tensor (ewise_class) or a number
    (scalar_class, the number at a's dtype)."""

    def method(a, b):
        _check_tensor(name, a)
        if isinstance(b, Tensor):
            return ewise_class()(a, b)
        if _is_number(b):
            return scalar_class(b)(a)
        raise TypeError(f"{name}: expected a Tensor or a number, got {type(b).__name__}")

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"{doc} b: a Tensor ({ewise_class.__name__}) or a number ({scalar_class.__name__})."
    )
    return method


# The binary rows (csrc/ewise_ops.h): each names, or leaves None, its op classes, the
# course's functions of them and a method.
for _name, _ewise, _ewise_fn, _scalar, _scalar_fn, _method, _doc in _c.BINARY_OPS:
    for _class_name in (_ewise, _scalar):
        if _class_name is not None:
            globals()[_class_name] = getattr(_c, _class_name)
    if _ewise_fn is not None:
        globals()[_ewise_fn] = _ewise_function(_ewise_fn, getattr(_c, _ewise), _doc)
    if _scalar_fn is not None:
        globals()[_scalar_fn] = _scalar_function(_scalar_fn, getattr(_c, _scalar), _doc)
    if _method is not None:
        globals()[_method] = _method_function(
            _method, getattr(_c, _ewise), getattr(_c, _scalar), _doc
        )
del _name, _ewise, _ewise_fn, _scalar, _scalar_fn, _method, _doc, _class_name
_GELU_FORMS = {"none": "gelu", "tanh": "gelu_tanh"}


def gelu(a, approximate="none"):
    """x * Phi(x), Phi the standard normal CDF (the exact erf form), or with
    ``approximate="tanh"`` PyTorch's tanh approximation. A Tensor of a's shape and dtype."""
    if not isinstance(approximate, str) or approximate not in _GELU_FORMS:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return (GELU if approximate == "none" else GELUTanh)()(a)  # noqa: F821


def clamp(a, min=None, max=None):  # noqa: A002 - torch.clamp's names
    """a limited to [min, max], as torch.clamp: numbers (or None, not both) or Tensors
    (broadcast). With min > max every element is max. The gradient passes where
    min <= a <= max (both inclusive) and is 0 elsewhere and at NaN."""
    _check_tensor("clamp", a)
    if min is None and max is None:
        raise ValueError("clamp: at least one of 'min' or 'max' must not be None")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        return _clamp_tensors(a, min, max)
    for what, bound in (("min", min), ("max", max)):
        if bound is not None and not _is_number(bound):
            raise TypeError(
                f"clamp: {what} must be a number, a Tensor or None, got {type(bound).__name__}"
            )
    return Clamp(-numpy.inf if min is None else min, numpy.inf if max is None else max)(a)


def _clamp_tensors(a, min, max):  # noqa: A002
    """clamp with Tensor bounds (a number or None for the other): ClampTensor, whose
    gradients are PyTorch's (a where min <= a <= max, min where a >= min fails, max where
    a <= max fails)."""
    bounds = []
    for what, bound, absent in (("min", min, -numpy.inf), ("max", max, numpy.inf)):
        if bound is None or _is_number(bound):
            bound = _full_like(a, absent if bound is None else bound)
        elif not isinstance(bound, Tensor):
            raise TypeError(
                f"clamp: {what} must be a number, a Tensor or None, got {type(bound).__name__}"
            )
        bounds.append(bound)
    return ClampTensor()(a, *bounds)


def _full_like(x, value):
    """A constant Tensor of x's shape, device and dtype filled with value (rounded once)."""
    return Tensor(
        numpy.full(x.shape, value, dtype=numpy.float64),
        device=x.device,
        dtype=x.dtype,
        requires_grad=False,
    )


def where(condition, x, y):
    """x where condition is non-zero, else y, elementwise with broadcasting, as
    torch.where (needle has no bool dtype: any non-zero condition, NaN included, is
    true). x or y may be a number (at the other's dtype). The gradients are
    where(condition, g, 0) to x and where(condition, 0, g) to y; the condition has none."""
    _check_tensor("where", condition, "condition")
    if not isinstance(x, Tensor) and not isinstance(y, Tensor):
        raise TypeError("where: x or y must be a Tensor")
    if not isinstance(x, Tensor):
        if not _is_number(x):
            raise TypeError(f"where: x must be a Tensor or a number, got {type(x).__name__}")
        x = _full_like(y, x)
    if not isinstance(y, Tensor):
        if not _is_number(y):
            raise TypeError(f"where: y must be a Tensor or a number, got {type(y).__name__}")
        y = _full_like(x, y)
    return Where()(condition, x, y)


def stack(args, axis):
    """Stacks a list of equally shaped tensors along a new axis."""
    from .ops_tuple import make_tuple

    return Stack(axis)(make_tuple(*args))


def split(a, axis):
    """Splits a along axis into a TensorTuple of tensors without that axis."""
    return Split(axis)(a)


def flip(a, axes):
    return Flip(axes)(a)


def dilate(a, axes, dilation):
    return Dilate(axes, dilation)(a)


def undilate(a, axes, dilation):
    return UnDilate(axes, dilation)(a)


def conv(a, b, stride=1, padding=1):
    """NHWC input (N, H, W, Cin) with weight (K, K, Cin, Cout)."""
    return Conv(stride, padding)(a, b)


def getitem(a, key):
    """a[key] with NumPy semantics (ints drop their dim), differentiable."""
    return GetItem(key)(a)


def gather_rows(table, indices):
    """Rows of table (V, D) at integer-valued indices: shape indices.shape + (D,).
    The gradient scatter-adds into the table (no one-hot matrix)."""
    return GatherRows()(table, indices)


def scatter_add_rows(src, indices, num_rows):
    """(num_rows, D) zeros with src's rows added at indices."""
    return ScatterAddRows(num_rows)(src, indices)
