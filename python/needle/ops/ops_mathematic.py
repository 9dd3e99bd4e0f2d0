"""Elementwise, shape, reduction, matmul, indexing and convolution ops.

The op classes are implemented in C (compute and gradient); the lowercase
functions are the course's thin wrappers ``fn(...) = Op(...)(...)``.
"""

import numpy  # noqa: F401  (the course's modules leak these names)

from needle_c import (  # noqa: F401
    AddScalar,
    AttentionSoftmax,
    BroadcastTo,
    Cast,
    Conv,
    Dilate,
    DivScalar,
    EWiseAdd,
    EWiseDiv,
    EWiseMul,
    EWisePow,
    Exp,
    Flip,
    GatherRows,
    GetItem,
    LayerNorm,
    Log,
    MatMul,
    MatMulBias,
    Max,
    MulScalar,
    Negate,
    PowerScalar,
    ReLU,
    Reshape,
    ScatterAddRows,
    ScatterSlice,
    Sigmoid,
    Split,
    Sqrt,
    Stack,
    Summation,
    Tanh,
    Transpose,
    UnDilate,
)

from .. import backend_ndarray as array_api  # noqa: F401
from ..autograd import Tensor, TensorOp, TensorTupleOp  # noqa: F401
from ..backend_ndarray import NDArray  # noqa: F401

BACKEND = "nd"


def add(a, b):
    return EWiseAdd()(a, b)


def add_scalar(a, scalar):
    return AddScalar(scalar)(a)


def multiply(a, b):
    return EWiseMul()(a, b)


def mul_scalar(a, scalar):
    return MulScalar(scalar)(a)


def power(a, b):
    return EWisePow()(a, b)


def power_scalar(a, scalar):
    return PowerScalar(scalar)(a)


def divide(a, b):
    return EWiseDiv()(a, b)


def divide_scalar(a, scalar):
    return DivScalar(scalar)(a)


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


def negate(a):
    return Negate()(a)


def log(a):
    return Log()(a)


def exp(a):
    return Exp()(a)


def relu(a):
    return ReLU()(a)


def tanh(a):
    return Tanh()(a)


def sigmoid(a):
    return Sigmoid()(a)


def sqrt(a):
    return Sqrt()(a)


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
