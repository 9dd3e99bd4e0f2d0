"""The op catalogue (csrc/ewise_ops.h's unary rows) and the ops added with it: gelu (exact
and tanh), silu, abs, erf, maximum, minimum, clamp and where, with nn.GELU and nn.SiLU.

Forward and gradient against PyTorch on every device and dtype, NaN, infinities and signed
zeros included; the catalogue's expansion (one row gives the NDArray and Tensor methods, the
op class and the ops function); bad inputs raise clearly.
"""

import ast
import inspect
import math
import pathlib
import re

import numpy as np
import pytest

import needle as ndl
import needle_c

from devices import DEVICES

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = ["float32", "float16", "bfloat16", "float64"]
TORCH = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
# Forward: the engine and PyTorch compute narrow types in float32 and round once, so they
# differ by at most an ulp of the dtype (or a few float32 ulps); near gelu's zero the
# absolute error of 1 + erf(x) (PyTorch's float32 erf is off by ~1e-6 there) dominates.
FWD = {"float32": 4e-6, "float64": 1e-13, "float16": 2**-10, "bfloat16": 2**-7}
FWD_ATOL = {"float32": 2e-6, "float64": 1e-14, "float16": 1e-4, "bfloat16": 8e-4}
# Gradients are composed graphs of ops, each rounding to the dtype (PyTorch's kernels
# round once): a few ulps of the dtype.
GRAD = {"float32": 2e-5, "float64": 1e-12, "float16": 8e-3, "bfloat16": 6e-2}
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30]


def both(values, dtype, device, requires_grad=True):
    """(needle Tensor, torch tensor) holding values rounded to dtype, the same numbers."""
    t = torch.tensor(np.asarray(values, np.float64)).to(TORCH[dtype])
    exact = t.double().numpy()
    x = ndl.Tensor(exact, device=device, dtype=dtype, requires_grad=requires_grad)
    return x, t.clone().requires_grad_(requires_grad)


def as64(t):
    return np.asarray(t.numpy(), np.float64)


def assert_same(got, want, rtol, atol=0.0, msg="", signs=True):
    """Equal within rtol/atol, NaN where want is NaN, infinities exact, and the signs of
    zeros (unless signs is False: a gradient composed of several ops)."""
    got, want = as64(got), want.detach().double().numpy()
    assert got.shape == want.shape, msg
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=msg)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    zero = (want == 0) & signs
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]), err_msg=msg)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol, err_msg=msg)


def assert_exact(got, want, msg=""):
    assert_same(got, want, 0.0, 0.0, msg)


def sample(dtype, n=64, scale=3.0, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * scale


# --------------------------------------------------------------- unary ops

UNARY = {
    # name: (needle function, torch function, input sampler)
    "gelu": (lambda x: ndl.ops.gelu(x), F.gelu, lambda: sample(0)),
    "gelu_tanh": (
        lambda x: ndl.ops.gelu(x, approximate="tanh"),
        lambda t: F.gelu(t, approximate="tanh"),
        lambda: sample(0),
    ),
    "silu": (lambda x: ndl.ops.silu(x), F.silu, lambda: sample(0, scale=4.0)),
    "abs": (lambda x: ndl.ops.abs(x), torch.abs, lambda: sample(0)),
    "erf": (lambda x: ndl.ops.erf(x), torch.erf, lambda: sample(0, scale=1.5)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_forward_and_gradient(op, dtype, device):
    f_nd, f_t, values = UNARY[op]
    x, t = both(values(), dtype, device)
    y, r = f_nd(x), f_t(t)
    assert y.dtype == dtype and y.shape == x.shape
    assert_same(y, r, FWD[dtype], FWD_ATOL[dtype], f"{op} {dtype}")
    g_values = np.random.default_rng(1).standard_normal(x.shape)
    g, tg = both(g_values, dtype, device, requires_grad=False)
    y.backward(g)
    r.backward(tg)
    assert x.grad.dtype == dtype
    assert_same(x.grad, t.grad, GRAD[dtype], GRAD[dtype] * 0.05, f"{op}' {dtype}", signs=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_special_values(op, dtype, device):
    f_nd, f_t, _ = UNARY[op]
    x, t = both(SPECIAL, dtype, device)
    y, r = f_nd(x), f_t(t)
    if op == "erf":
        # PyTorch's vectorized bfloat16 erf flushes erf(1e-30) to 0; the reference is
        # the exact erf rounded to the dtype.
        r = torch.erf(t.double()).to(TORCH[dtype])
    if op == "gelu":
        # PyTorch's vectorized float32/bfloat16 CPU gelu gives NaN at +inf, its scalar
        # and float64 paths inf (x * Phi(x) -> inf); needle gives inf everywhere.
        r = r.detach().clone()
        r[1] = math.inf
    assert_same(y, r, FWD[dtype], 0.0, f"{op} {dtype} special")
    y.backward(ndl.ones_like(y))
    (f_t(t) if op == "gelu" else r).sum().backward()
    assert_same(x.grad, t.grad, GRAD[dtype], 0.0, f"{op}' {dtype} special", signs=False)


@pytest.mark.parametrize("device", DEVICES)
def test_abs_gradient_is_zero_at_zero(device):
    x = ndl.Tensor([0.0, -0.0, 2.0, -3.0], device=device)
    ndl.ops.abs(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 1.0, -1.0])


@pytest.mark.parametrize("device", DEVICES)
def test_erf_float32_is_within_two_ulps(device):
    """The CPU's erf (cpu_math.h, a rational in double) and CUDA's erff, against libm's
    double erf, over [-5, 5] and tiny arguments."""
    x = np.concatenate(
        [np.linspace(-5, 5, 200001), np.logspace(-38, 0.6, 2000), -np.logspace(-38, 0.6, 2000)]
    ).astype(np.float32)
    got = as64(ndl.ops.erf(ndl.Tensor(x, device=device, requires_grad=False)))
    exact = np.array([math.erf(float(v)) for v in x])
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / ulp) <= 2.0


@pytest.mark.parametrize("device", DEVICES)
def test_erf_float64_is_libm(device):
    x = np.linspace(-6, 6, 1001)
    got = as64(ndl.ops.erf(ndl.Tensor(x, device=device, dtype="float64")))
    np.testing.assert_allclose(got, [math.erf(v) for v in x], rtol=1e-15, atol=1e-300)


@pytest.mark.parametrize("device", DEVICES)
def test_second_derivative_in_needle_mode(device):
    """The gradients are graphs of ops: gelu'' against PyTorch's."""
    values = [-1.5, -0.2, 0.3, 2.0]
    x = ndl.Tensor(values, device=device, dtype="float64")
    with ndl.autograd.graph_mode("needle"):
        y = ndl.ops.gelu(x).sum()
        y.backward()
        first = x.grad
        x.grad = None
        first.sum().backward()
    t = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    (d1,) = torch.autograd.grad(F.gelu(t).sum(), t, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), t)
    np.testing.assert_allclose(as64(first), d1.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(as64(x.grad), d2.numpy(), rtol=1e-10)


# ----------------------------------------------------------- the catalogue


@pytest.mark.parametrize("device", DEVICES)
def test_catalogue_rows_give_methods_classes_and_functions(device):
    rows = needle_c.UNARY_OPS
    names = [r[0] for r in rows]
    for required in ("neg", "exp", "log", "tanh", "sqrt", "sigmoid", "relu", "abs", "erf"):
        assert required in names
    a = ndl.NDArray([0.5, -1.0], device=device)
    x = ndl.Tensor([0.5, -1.0], device=device)
    for name, class_name, doc in rows:
        op_class = getattr(ndl.ops, class_name)
        assert op_class is getattr(needle_c, class_name)
        fn = getattr(ndl.ops, name)
        # The four ways to one kernel give the same values (ops.gelu, which takes
        # approximate=, is written by hand over GELU and GELUTanh).
        want = as64(op_class()(x))
        np.testing.assert_array_equal(as64(fn(x)), want)
        if name != "gelu":
            assert fn.__name__ == name and doc in fn.__doc__
        np.testing.assert_array_equal(as64(getattr(x, name)()), want)
        np.testing.assert_array_equal(np.asarray(getattr(a, name)().numpy(), np.float64), want)
        assert doc in getattr(ndl.Tensor, name).__doc__
        assert doc in getattr(ndl.NDArray, name).__doc__
    assert ndl.ops.negate is ndl.ops.neg


# ------------------------------------------------------ the binary catalogue

EWISE_OPS_H = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "ewise_ops.h"


def binary_rows_in_header():
    """ND_EWISE_BINARY_OPS's rows as the header writes them: (name, Ewise, ewise_fn,
    Scalar, scalar_fn, method, doc), None for the marker _."""
    text = EWISE_OPS_H.read_text()
    body = re.search(r"#define ND_EWISE_BINARY_OPS\(X, A\)(.*?)\n\n", text, re.S).group(1)
    body = body.replace("\\\n", " ")
    string = r'"(?:[^"\\]|\\.)*"'
    rows = re.findall(
        rf"X\(A, \w+, (\w+), (\w+), (\w+), (\w+), (\w+), (\w+),\s*((?:{string}\s*)+),", body
    )
    return [
        tuple(None if f == "_" else f for f in fields) + (ast.literal_eval(doc.strip()),)
        for *fields, doc in rows
    ]


def test_binary_ops_export_is_the_rows_of_the_header():
    rows = binary_rows_in_header()
    assert [r[0] for r in rows] == [
        "add", "sub", "mul", "div", "pow", "maximum", "minimum",
        "eq", "ne", "ge", "gt", "le", "lt", "pick",
    ]  # fmt: skip
    assert needle_c.BINARY_OPS == tuple(rows)


# The course's binary op classes: class -> (function, its parameters, NumPy's operation);
# a Scalar class takes the scalar and keeps it as .scalar.
COURSE_BINARY = {
    "EWiseAdd": ("add", ["a", "b"], np.add),
    "AddScalar": ("add_scalar", ["a", "scalar"], np.add),
    "EWiseMul": ("multiply", ["a", "b"], np.multiply),
    "MulScalar": ("mul_scalar", ["a", "scalar"], np.multiply),
    "EWiseDiv": ("divide", ["a", "b"], np.divide),
    "DivScalar": ("divide_scalar", ["a", "scalar"], np.divide),
    "EWisePow": ("power", ["a", "b"], np.power),
    "PowerScalar": ("power_scalar", ["a", "scalar"], np.power),
    "Maximum": ("maximum", ["a", "b"], np.maximum),
    "MaximumScalar": ("maximum", ["a", "b"], np.maximum),
    "Minimum": ("minimum", ["a", "b"], np.minimum),
    "MinimumScalar": ("minimum", ["a", "b"], np.minimum),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("class_name", sorted(COURSE_BINARY))
def test_course_binary_classes_and_functions(class_name, dtype, device):
    fn_name, params, numpy_op = COURSE_BINARY[class_name]
    op_class, fn = getattr(ndl.ops, class_name), getattr(ndl.ops, fn_name)
    assert op_class is getattr(needle_c, class_name) and op_class.__name__ == class_name
    assert list(inspect.signature(fn).parameters) == params
    av, bv = np.array([0.5, 1.5, 2.0, 3.0]), np.array([2.0, 0.5, 2.0, 1.0])
    a = ndl.Tensor(av, device=device, dtype=dtype)
    b = ndl.Tensor(bv, device=device, dtype=dtype)
    if class_name.endswith("Scalar"):
        op = op_class(1.5)
        assert op.scalar == 1.5
        with pytest.raises(TypeError):
            op_class()
        y, want = fn(a, 1.5), numpy_op(av, 1.5)
    else:
        with pytest.raises(TypeError):
            op_class(1.5)
        y, want = fn(a, b), numpy_op(av, bv)
    assert type(y.op) is op_class
    assert y.dtype == dtype
    np.testing.assert_allclose(as64(y), want, rtol=1e-6)
    direct = op(a) if class_name.endswith("Scalar") else op_class()(a, b)
    np.testing.assert_array_equal(as64(direct), as64(y))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_rows_methods(dtype, device):
    """A row's method: NDArray.<m>, Tensor.<m> and ndl.ops.<m> agree, take an array or a
    number, document themselves with the row's doc and refuse anything else."""
    methods = [(r[0], r[5], r[6]) for r in needle_c.BINARY_OPS if r[5] is not None]
    assert [m for _, m, _ in methods] == ["maximum", "minimum"]
    av, bv = [0.5, -1.0, math.nan, 2.0], [1.0, -2.0, 0.0, math.nan]
    for name, method, doc in methods:
        x, t = both(av, dtype, device, requires_grad=False)
        y, u = both(bv, dtype, device, requires_grad=False)
        want = getattr(torch, name)(t, u)
        assert_exact(getattr(x, method)(y), want)
        assert_exact(getattr(ndl.ops, method)(x, y), want)
        assert_exact(getattr(x.cached_data, method)(y.cached_data), want)
        want = getattr(torch, name)(t, torch.tensor(0.75, dtype=TORCH[dtype]))
        assert_exact(getattr(x, method)(0.75), want)
        assert_exact(getattr(ndl.ops, method)(x, 0.75), want)
        assert_exact(getattr(x.cached_data, method)(0.75), want)
        for owner in (ndl.Tensor, ndl.NDArray, ndl.ops):
            assert doc in getattr(owner, method).__doc__
        for call in (
            lambda: getattr(x, method)("1"),
            lambda: getattr(ndl.ops, method)(x, "1"),
            lambda: getattr(ndl.ops, method)(1.0, x),
            lambda: getattr(x.cached_data, method)([1.0]),
        ):
            with pytest.raises(TypeError, match=method):
                call()


# --------------------------------------------------------- maximum/minimum


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_tensors(op, dtype, device):
    # Ties, NaN on either side, infinities; b broadcast along the rows. (A tie of zeros of
    # opposite signs is left out: PyTorch's vectorized and scalar loops differ there;
    # needle returns the first operand, test_signed_zero_ties.)
    av = [
        [1.0, 2.0, 3.0, math.nan, 1.0, -0.0, 0.0, math.inf],
        [0.5, -2.0, 7.0, 1.0, 4.0, 1.0, 2.0, -math.inf],
    ]
    bv = [1.0, 1.0, 4.0, 1.0, math.nan, -0.0, 0.0, 5.0]
    a, ta = both(av, dtype, device)
    b, tb = both(bv, dtype, device)
    y, r = getattr(ndl.ops, op)(a, b), getattr(torch, op)(ta, tb)
    assert_exact(y, r, f"{op} {dtype}")
    g_values = np.arange(16.0).reshape(2, 8) / 8
    g, tg = both(g_values, dtype, device, requires_grad=False)
    y.backward(g)
    r.backward(tg)
    assert_exact(a.grad, ta.grad, f"{op}' a")
    assert b.grad.shape == (8,)
    assert_same(b.grad, tb.grad, 2**-8 if dtype == "bfloat16" else 1e-6, 0.0, f"{op}' b")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_scalar(op, dtype, device):
    xv = [-1.0, 0.0, 0.5, 1.0, 2.0, math.nan, -0.0, math.inf]
    x, t = both(xv, dtype, device)
    y = getattr(ndl.ops, op)(x, 0.5)
    assert getattr(x, op)(0.5).shape == x.shape
    r = getattr(torch, op)(t, torch.tensor(0.5, dtype=TORCH[dtype]))
    assert_exact(y, r, f"{op} scalar {dtype}")
    y.backward(ndl.ones_like(y))
    r.sum().backward()
    assert_exact(x.grad, t.grad, f"{op}' scalar {dtype}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_signed_zero_ties(dtype, device):
    """At a tie the first operand comes back, as NumPy's maximum/minimum and PyTorch's scalar
    loop do: maximum(-0, 0) is -0 and maximum(0, -0) is 0."""
    a = ndl.Tensor([-0.0, 0.0], device=device, dtype=dtype)
    b = ndl.Tensor([0.0, -0.0], device=device, dtype=dtype)
    for op in (ndl.ops.maximum, ndl.ops.minimum):
        np.testing.assert_array_equal(np.signbit(as64(op(a, b))), [True, False])
        np.testing.assert_array_equal(np.signbit(as64(op(b, a))), [False, True])
    np.testing.assert_array_equal(np.signbit(as64(ndl.ops.maximum(a, 0.0))), [True, False])


@pytest.mark.parametrize("device", DEVICES)
def test_maximum_ties_split_as_pytorch(device):
    a, b = ndl.Tensor([1.0, 2.0], device=device), ndl.Tensor([1.0, 2.0], device=device)
    ndl.ops.maximum(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.5, 0.5])
    np.testing.assert_array_equal(b.grad.numpy(), [0.5, 0.5])


# ------------------------------------------------------------------ clamp

CLAMPS = [(0.0, 1.0), (None, 0.5), (-0.5, None), (1.0, 0.0), (0.0, -0.0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bounds", CLAMPS, ids=str)
def test_clamp_scalars(bounds, dtype, device):
    lo, hi = bounds
    xv = [-1.0, 0.0, -0.0, 0.5, 1.0, 2.0, math.nan, math.inf, -math.inf, -0.5]
    x, t = both(xv, dtype, device)
    y, r = ndl.ops.clamp(x, min=lo, max=hi), torch.clamp(t, min=lo, max=hi)
    assert_exact(y, r, f"clamp{bounds} {dtype}")
    assert_exact(x.clamp(min=lo, max=hi), r)
    y.backward(ndl.ones_like(y))
    r.sum().backward()
    assert_exact(x.grad, t.grad, f"clamp'{bounds} {dtype}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_clamp_tensor_bounds(dtype, device):
    xv = [[-1.0, 0.0, 0.5, 1.0, 2.0, math.nan], [3.0, -3.0, 0.25, 0.75, 1.0, 0.0]]
    x, t = both(xv, dtype, device)
    lo, tlo = both([0.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype, device)
    hi, thi = both([1.0], dtype, device)
    y, r = ndl.ops.clamp(x, min=lo, max=hi), torch.clamp(t, min=tlo, max=thi)
    assert_exact(y, r, f"clamp tensors {dtype}")
    g, tg = both(np.arange(12.0).reshape(2, 6), dtype, device, requires_grad=False)
    y.backward(g)
    r.backward(tg)
    assert_exact(x.grad, t.grad)
    assert_exact(lo.grad, tlo.grad)
    assert_exact(hi.grad, thi.grad)
    # A number and a Tensor together.
    x2, t2 = both(xv, dtype, device)
    want = torch.clamp(t2, min=tlo, max=torch.tensor(0.5, dtype=TORCH[dtype]))
    assert_exact(ndl.ops.clamp(x2, min=lo, max=0.5), want)


# ------------------------------------------------------------------ where


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_where(dtype, device):
    cv = [[1.0, 0.0, 2.0, -0.0, math.nan, 0.0]]
    xv = [[math.nan, 1.0, -0.0, 5.0, math.inf, 2.0], [0.0, -math.inf, 3.0, 4.0, -0.0, 6.0]]
    yv = [-0.0, math.nan, 7.0, -math.inf, 8.0, -0.0]
    c, _ = both(cv, "float32", device, requires_grad=False)
    tc = torch.tensor(np.asarray(cv)) != 0  # needle: any non-zero (NaN too) is true
    x, tx = both(xv, dtype, device)
    y, ty = both(yv, dtype, device)
    out, r = ndl.ops.where(c, x, y), torch.where(tc, tx, ty)
    assert out.dtype == dtype
    assert_exact(out, r, f"where {dtype}")
    g, tg = both(np.arange(12.0).reshape(2, 6) - 5, dtype, device, requires_grad=False)
    out.backward(g)
    r.backward(tg)
    assert_exact(x.grad, tx.grad)
    assert y.grad.shape == (6,)
    assert_exact(y.grad, ty.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_where_scalars_and_promotion(device):
    c = ndl.Tensor([1.0, 0.0], device=device)
    x16 = ndl.Tensor([1.5, 2.5], device=device, dtype="float16")
    np.testing.assert_array_equal(as64(ndl.ops.where(c, x16, 0.1)), [1.5, np.float16(0.1)])
    assert ndl.ops.where(c, x16, 0.1).dtype == "float16"
    np.testing.assert_array_equal(as64(ndl.ops.where(c, -1.0, x16)), [-1.0, 2.5])
    x64 = ndl.Tensor([0.1, 0.2], device=device, dtype="float64")
    mixed = ndl.ops.where(c, x16, x64)
    assert mixed.dtype == "float64"
    np.testing.assert_array_equal(as64(mixed), [1.5, 0.2])


# -------------------------------------------------------------- autocast


def test_autocast_policy_names_the_new_ops():
    from needle import _autocast

    for name in ("GELU", "GELUTanh", "SiLU", "Abs", "Erf", "Maximum", "Clamp", "Where"):
        assert name in _autocast.INPUT_DTYPE_OPS
        assert name not in _autocast.NARROW_OPS + _autocast.FLOAT32_OPS
        assert hasattr(needle_c, name)


@pytest.mark.parametrize("op", ["gelu", "silu", "abs", "erf"])
def test_autocast_keeps_the_input_dtype(op):
    """As PyTorch's autocast, which lists none of them: they run in their input's dtype."""
    for dtype in ("float32", "bfloat16"):
        x = ndl.Tensor([0.5, -1.0], dtype=dtype)
        with ndl.autocast("cpu", dtype="bfloat16"):
            assert getattr(ndl.ops, op)(x).dtype == dtype
            assert ndl.ops.maximum(x, x).dtype == dtype


# ------------------------------------------------------------------- nn


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_nn_gelu(approximate, device):
    x, t = both(sample(0), "float32", device)
    assert_same(ndl.nn.GELU(approximate)(x), F.gelu(t, approximate=approximate), 4e-6, 2e-6)
    assert ndl.nn.GELU().approximate == "none"


@pytest.mark.parametrize("device", DEVICES)
def test_nn_silu(device):
    x, t = both(sample(0), "float32", device)
    assert_same(ndl.nn.SiLU()(x), F.silu(t), 4e-6, 1e-9)


# ------------------------------------------------------------- bad input


def test_bad_inputs_raise():
    x = ndl.Tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="approximate"):
        ndl.ops.gelu(x, approximate="foo")
    with pytest.raises(ValueError, match="approximate"):
        ndl.ops.gelu(x, approximate=None)
    with pytest.raises(ValueError, match="approximate"):
        ndl.nn.GELU("exact")
    with pytest.raises(TypeError, match="maximum"):
        ndl.ops.maximum(x, "1")
    with pytest.raises(TypeError, match="maximum"):
        x.maximum([1.0, 2.0])
    with pytest.raises(TypeError, match="minimum"):
        ndl.ops.minimum([1.0], x)
    with pytest.raises(ValueError, match="shape|broadcast"):
        ndl.ops.maximum(x, ndl.Tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="at least one"):
        ndl.ops.clamp(x)
    with pytest.raises(ValueError, match="at least one"):
        x.clamp()
    with pytest.raises(TypeError, match="min"):
        ndl.ops.clamp(x, min="0")
    with pytest.raises(TypeError, match="max"):
        x.clamp(max=[1.0])
    with pytest.raises(TypeError, match="condition"):
        ndl.ops.where([1.0, 0.0], x, x)
    with pytest.raises(TypeError, match="x or y"):
        ndl.ops.where(x, 1.0, 2.0)
    with pytest.raises(TypeError, match="y"):
        ndl.ops.where(x, x, "a")
    with pytest.raises(ValueError, match="shape|broadcast"):
        ndl.ops.where(ndl.Tensor([1.0, 0.0, 1.0]), x, x)
    with pytest.raises(TypeError):
        ndl.ops.abs(x, x)
    with pytest.raises(TypeError):
        x.gelu(1)
    # The process still works.
    np.testing.assert_array_equal(ndl.ops.abs(ndl.Tensor([-2.0])).numpy(), [2.0])


# ------------------------------------------------------- no leaks on error


def _exercise(device):
    x = ndl.Tensor([-1.0, 0.0, 2.0, math.nan], device=device)
    y = ndl.Tensor([0.5, 0.0, 3.0, 1.0], device=device)
    c = ndl.Tensor([1.0, 0.0, 1.0, 0.0], device=device)
    outs = [
        ndl.ops.gelu(x),
        ndl.ops.gelu(x, approximate="tanh"),
        ndl.ops.silu(x),
        ndl.ops.abs(x),
        ndl.ops.erf(x),
        ndl.ops.maximum(x, y),
        ndl.ops.minimum(x, 0.5),
        ndl.ops.clamp(x, min=0.0, max=1.0),
        ndl.ops.clamp(x, min=y),
        ndl.ops.where(c, x, y),
    ]
    total = outs[0].sum()
    for out in outs[1:]:
        total = total + out.sum()
    total.backward()
    for bad in (
        lambda: ndl.ops.where(ndl.Tensor([1.0, 0.0, 1.0], device=device), x, y),
        lambda: ndl.ops.maximum(x, ndl.Tensor([1.0, 2.0], device=device)),
        lambda: x.clamp(min="a"),
        lambda: ndl.ops.gelu(x, approximate="foo"),
    ):
        with pytest.raises((ValueError, TypeError)):
            bad()


@pytest.mark.parametrize("device", DEVICES)
def test_no_leaks_over_repeated_calls(device):
    """Forward, backward and failing calls leave no device bytes and no Python objects behind."""
    import gc

    _exercise(device)
    gc.collect()
    before_bytes = ndl.memory.memory_allocated(device)
    before_objects = len(gc.get_objects())
    for _ in range(50):
        _exercise(device)
    gc.collect()
    assert ndl.memory.memory_allocated(device) == before_bytes
    assert len(gc.get_objects()) <= before_objects + 20
