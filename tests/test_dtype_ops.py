"""Elementwise ops, reductions and matmul computed in float16, bfloat16 and float64.

Every result is checked against a NumPy float64 reference computed from the inputs as
stored (the test data is rounded to the dtype before it is handed to needle, so what the
array holds is exactly what the reference sees), then rounded to the dtype. The accuracy
contract (issue 22): float16/bfloat16 compute in float32 registers and round once per op;
reductions and matmul accumulate in float32 (float64 for float64); float64 is double
precision throughout. Tolerances, per dtype:

- elementwise: rtol is one unit in the last place of the dtype (float16 2**-10 ~ 1e-3,
  bfloat16 2**-7 ~ 8e-3; the float32 result and the exact one may round to neighbouring
  values), float64 1e-12 (libm against NumPy's libm, a few ulps);
- reductions and matmul: the same rtol plus an absolute term growing with the number of
  terms k (float32 accumulation: k * 2**-24 * the sum of the magnitudes; float64: 1e-15).
"""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES

DTYPES = ["float16", "bfloat16", "float64"]
RTOL = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 1e-12}
# The absolute error of one float32 (or float64) accumulation step, per unit magnitude.
ACC_EPS = {"float16": 2.0**-23, "bfloat16": 2.0**-23, "float64": 1e-15}


def bf16_round(x):
    """float64 -> bfloat16 values (through float32, as needle converts), as float64."""
    f = np.asarray(x, np.float64).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)
    out = rounded.view(np.float32).astype(np.float64)
    return np.where(np.isnan(f), np.nan, out)


def to_dtype(x, dtype):
    """The float64 values x rounded to dtype (what an array of dtype holds)."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        if dtype == "float16":
            return x.astype(np.float32).astype(np.float16).astype(np.float64)
        if dtype == "bfloat16":
            return bf16_round(x)
    return x


def scalar_in(s, dtype, op=None):
    """A Python scalar as the op computes with it, as PyTorch's: float32 for the narrow
    dtypes' products and quotients, rounded to the narrow dtype for the other ops (sums,
    differences, comparisons, powers, maximum/minimum)."""
    if op not in ("mul", "div") and dtype in ("float16", "bfloat16"):
        return float(to_dtype(np.float64(s), dtype))
    return float(np.float32(s)) if dtype != "float64" else float(s)


def make(x, dtype, device):
    """An array of dtype holding x rounded to dtype, and those values (float64)."""
    stored = to_dtype(x, dtype)
    a = nd.array(stored, dtype=dtype, device=device)
    assert a.dtype == dtype
    return a, stored


def values(a):
    return a.numpy().astype(np.float64)


def check(got, expected, dtype, msg="", atol=0.0):
    assert got.dtype == dtype, msg
    np.testing.assert_allclose(
        values(got), to_dtype(expected, dtype), rtol=RTOL[dtype], atol=atol, err_msg=msg
    )


def data(rng, shape, kind):
    if kind == "pos":
        return rng.uniform(0.1, 4.0, shape)
    if kind == "nonzero":
        return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    return rng.uniform(-3.0, 3.0, shape)


def views(rng, dtype, device, kind, shape=(6, 8)):
    """(name, float64 values as stored, needle view of that shape) for each kind of view."""
    m, n = shape
    out = []
    a, v = make(data(rng, shape, kind), dtype, device)
    out.append(("contiguous", v, a))
    a, v = make(data(rng, (n, m), kind), dtype, device)
    out.append(("permuted", v.T, a.permute((1, 0))))
    a, v = make(data(rng, (2 * m, 3 * n), kind), dtype, device)
    out.append(("sliced", v[::2, 1::3], a[::2, 1::3]))
    a, v = make(data(rng, (1, n), kind), dtype, device)
    out.append(("broadcast row", np.broadcast_to(v, shape), a.broadcast_to(shape)))
    a, v = make(data(rng, (m, 1), kind), dtype, device)
    out.append(("broadcast column", np.broadcast_to(v, shape), a.broadcast_to(shape)))
    return out


# --------------------------------------------------------------------- elementwise

BINARY = {
    "add": (lambda a, b: a + b, np.add, "any"),
    "sub": (lambda a, b: a - b, np.subtract, "any"),
    "mul": (lambda a, b: a * b, np.multiply, "any"),
    "div": (lambda a, b: a / b, np.divide, "nonzero"),
    "pow": (lambda a, b: a**b, np.power, "pos"),
    "maximum": (lambda a, b: a.maximum(b), np.maximum, "any"),
    "minimum": (lambda a, b: a.minimum(b), np.minimum, "any"),
    "eq": (lambda a, b: a == b, np.equal, "any"),
    "ne": (lambda a, b: a != b, np.not_equal, "any"),
    "ge": (lambda a, b: a >= b, np.greater_equal, "any"),
    "gt": (lambda a, b: a > b, np.greater, "any"),
    "le": (lambda a, b: a <= b, np.less_equal, "any"),
    "lt": (lambda a, b: a < b, np.less, "any"),
}
# Exponents in pow's reach: the base is positive, the exponent small.
SCALARS = {"pos": 1.3, "nonzero": -0.7, "any": 0.1}


def reference(f_np, x, y):
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return f_np(x, y).astype(np.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_arrays_and_views(op, dtype, device):
    f_nd, f_np, kind = BINARY[op]
    rng = np.random.default_rng(len(op))
    left = views(rng, dtype, device, kind)
    right = views(rng, dtype, device, kind)
    for (ka, va, a), (kb, vb, b) in zip(left, right[1:] + right[:1]):
        check(f_nd(a, b), reference(f_np, va, vb), dtype, f"{op} {dtype} {ka} {kb}")
    # Equal operands where a comparison must say so.
    _, v, a = left[0]
    check(f_nd(a, a), reference(f_np, v, v), dtype, f"{op} {dtype} self")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_with_scalars(op, dtype, device):
    f_nd, f_np, kind = BINARY[op]
    rng = np.random.default_rng(7)
    s = SCALARS[kind]
    for name, v, a in views(rng, dtype, device, kind):
        check(f_nd(a, s), reference(f_np, v, scalar_in(s, dtype, op)), dtype, f"{op} {name} s")
        if op in ("add", "sub", "mul", "div", "pow"):  # the reflected operators
            check(f_nd(s, a), reference(f_np, scalar_in(s, dtype, op), v), dtype, f"s {op} {name}")


UNARY = {
    "neg": (lambda a: -a, np.negative, "any"),
    "log": (lambda a: a.log(), np.log, "pos"),
    "exp": (lambda a: a.exp(), np.exp, "any"),
    "tanh": (lambda a: a.tanh(), np.tanh, "any"),
    "sqrt": (lambda a: a.sqrt(), np.sqrt, "pos"),
    "sigmoid": (lambda a: a.sigmoid(), lambda x: 1.0 / (1.0 + np.exp(-x)), "any"),
    "abs": (lambda a: a.abs(), np.abs, "any"),
    "relu": (lambda a: a.relu(), lambda x: np.maximum(x, 0.0), "any"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op, dtype, device):
    f_nd, f_np, kind = UNARY[op]
    rng = np.random.default_rng(11)
    for name, v, a in views(rng, dtype, device, kind):
        check(f_nd(a), f_np(v), dtype, f"{op} {dtype} {name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_powers(dtype, device):
    rng = np.random.default_rng(5)
    a, v = make(data(rng, (5, 7), "nonzero"), dtype, device)
    # x**2 is one exact float32 (or float64) product, rounded once: bit for bit.
    np.testing.assert_array_equal(values(a**2), to_dtype(v * v, dtype))
    check(a**3, v * v * v, dtype, "cube")
    check(a**-1, 1.0 / v, dtype, "reciprocal")
    check(a[:, ::2] ** 2, v[:, ::2] ** 2, dtype, "square of a view")
    if dtype == "float64":
        np.testing.assert_array_equal(values(a**3), v * v * v)
        np.testing.assert_array_equal(values(a**-1), 1.0 / v)
        # An exponent that only rounds to 2 in float32 is a general power in float64.
        e = 2.0 + 1e-9
        np.testing.assert_allclose(values(a.abs() ** e), np.abs(v) ** e, rtol=1e-13)
        assert not np.array_equal(values(a.abs() ** e), v * v)


# ---------------------------------------------------------------------- reductions


def reduction_cases(rng, dtype, device):
    a, v = make(data(rng, (5, 7, 9), "any"), dtype, device)
    yield "contiguous", v, a
    yield "permuted", v.transpose(2, 0, 1), a.permute((2, 0, 1))
    b, w = make(data(rng, (10, 7, 18), "any"), dtype, device)
    yield "sliced", w[::2, :, 1::2], b[::2, :, 1::2]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reductions(op, dtype, device):
    f_np = {"sum": np.sum, "max": np.max, "min": np.min}[op]
    rng = np.random.default_rng(3)
    for name, v, a in reduction_cases(rng, dtype, device):
        for axis in [None, 0, 1, 2, (0, 2)]:
            for keepdims in (False, True):
                got = getattr(a, op)(axis=axis, keepdims=keepdims)
                expected = f_np(v, axis=axis, keepdims=keepdims)
                if axis is None and not keepdims:
                    expected = np.reshape(expected, got.shape)
                k = v.size // max(1, np.size(expected))
                atol = k * ACC_EPS[dtype] * 3.0 if op == "sum" else 0.0
                msg = f"{op} {dtype} {name} axis={axis} keepdims={keepdims}"
                assert got.shape == np.shape(expected), msg
                check(got, expected, dtype, msg, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
def test_narrow_sums_accumulate_in_float32(device):
    # 10000 ones: a float16 accumulator would stop at 2048, a bfloat16 one at 256.
    for dtype, n in (("float16", 10000), ("bfloat16", 1000)):
        ones = nd.array(np.ones(n), dtype=dtype, device=device)
        assert values(ones.sum()).tolist() == [float(n)], dtype
        column = nd.array(np.ones((n, 3)), dtype=dtype, device=device)
        assert values(column.sum(axis=0)).tolist() == [float(n)] * 3, dtype
    # float64 keeps what float32 would lose: 1 + 1e-10 summed 1000 times.
    x = nd.array(np.full(1000, 1.0 + 1e-10), dtype="float64", device=device)
    assert abs(values(x.sum())[0] - 1000 * (1.0 + 1e-10)) < 1e-9


# -------------------------------------------------------------------------- matmul


def check_matmul(a, b, va, vb, dtype, msg):
    got = a @ b
    expected = np.matmul(va, vb)
    k = va.shape[-1]
    # float32 accumulation of k products, then one rounding to the dtype.
    scale = np.matmul(np.abs(va), np.abs(vb))
    assert got.dtype == dtype and got.shape == expected.shape, msg
    np.testing.assert_allclose(
        values(got),
        to_dtype(expected, dtype),
        rtol=RTOL[dtype],
        atol=float(np.max(scale)) * k * ACC_EPS[dtype],
        err_msg=msg,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k,n",
    # The last two cross the CPU's narrow tiles (96 x 256, inner dimension 256 at a time) in
    # every dimension, with ragged edges.
    [(1, 1, 1), (5, 7, 3), (33, 65, 17), (64, 300, 130), (7, 260, 300), (200, 530, 520)],
)
def test_matmul_2d(m, k, n, dtype, device):
    rng = np.random.default_rng(m + k + n)
    a, va = make(data(rng, (m, k), "any"), dtype, device)
    b, vb = make(data(rng, (k, n), "any"), dtype, device)
    check_matmul(a, b, va, vb, dtype, "plain")
    at, vat = make(data(rng, (k, m), "any"), dtype, device)
    bt, vbt = make(data(rng, (n, k), "any"), dtype, device)
    check_matmul(at.permute((1, 0)), b, vat.T, vb, dtype, "A transposed")
    check_matmul(a, bt.permute((1, 0)), va, vbt.T, dtype, "B transposed")
    check_matmul(at.permute((1, 0)), bt.permute((1, 0)), vat.T, vbt.T, dtype, "both")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_batched(dtype, device):
    rng = np.random.default_rng(9)
    a, va = make(data(rng, (3, 6, 10), "any"), dtype, device)
    b, vb = make(data(rng, (3, 10, 4), "any"), dtype, device)
    check_matmul(a, b, va, vb, dtype, "batched")
    # Broadcast batch dims: (2, 1, m, k) @ (3, k, n) and a shared 2-D right operand.
    c, vc = make(data(rng, (2, 1, 6, 10), "any"), dtype, device)
    check_matmul(c, b, vc, vb, dtype, "broadcast batch")
    w, vw = make(data(rng, (10, 5), "any"), dtype, device)
    check_matmul(a, w, va, vw, dtype, "shared right operand")
    # A permuted batch: (k, batch, m) viewed as (batch, m, k).
    p, vp = make(data(rng, (10, 3, 6), "any"), dtype, device)
    check_matmul(p.permute((1, 2, 0)), b, vp.transpose(1, 2, 0), vb, dtype, "permuted batch")


@pytest.mark.parametrize("device", DEVICES)
def test_narrow_matmul_accumulates_in_float32(device):
    # 4096 products of 1: a float16 accumulator would stop at 2048.
    for dtype in ("float16", "bfloat16"):
        a = nd.array(np.ones((2, 4096)), dtype=dtype, device=device)
        b = nd.array(np.ones((4096, 3)), dtype=dtype, device=device)
        assert values(a @ b).tolist() == [[4096.0] * 3] * 2, dtype
    # float64: products that float32 would round.
    x = np.array([[1.0 + 2.0**-40, 1.0]])
    y = np.array([[1.0 - 2.0**-40], [2.0**-30]])
    got = nd.array(x, dtype="float64", device=device) @ nd.array(y, dtype="float64", device=device)
    assert values(got)[0, 0] == (x @ y)[0, 0] != 1.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_empty_inner_dimension_gives_zeros(dtype, device):
    a = nd.array(np.ones((3, 0)), dtype=dtype, device=device)
    b = nd.array(np.ones((0, 300)), dtype=dtype, device=device)
    got = a @ b
    assert got.dtype == dtype and got.shape == (3, 300)
    assert not values(got).any()


def linear(x, w, b, bias_step=1):
    """needle's fused x @ w + b (MatMulBias, what nn.Linear runs) on arrays; bias_step: the
    bias is every bias_step-th element of b (a strided view: a Tensor made of an array view
    holds a compact copy, a Tensor's slice a view)."""
    tx, tw, tb = (ndl.Tensor(v, device=v.device, dtype=v.dtype) for v in (x, w, b))
    if bias_step != 1:
        tb = tb[::bias_step]
        assert tb.realize_cached_data().strides == (bias_step,)
    return ndl.ops.matmul_bias(tx, tw, tb).realize_cached_data()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "sx,sw,sb,bias_view",
    [
        # Batched rows and ragged tiles; the bias a row, a (1, n) row, a strided row.
        ((2, 100, 70), (70, 300), (300,), "plain"),
        ((200, 530), (530, 520), (1, 520), "plain"),
        ((33, 65), (65, 17), (33,), "every other"),
        # An empty inner dimension: the bias alone.
        ((4, 0), (0, 300), (300,), "plain"),
        # Biases that are not one row: a column, a whole matrix.
        ((6, 10), (10, 40), (6, 1), "plain"),
        ((6, 10), (10, 40), (6, 40), "plain"),
    ],
)
def test_linear_against_the_reference(sx, sw, sb, bias_view, dtype, device):
    rng = np.random.default_rng(sum(sx) + sum(sw))
    x, vx = make(data(rng, sx, "any"), dtype, device)
    w, vw = make(data(rng, sw, "any"), dtype, device)
    b, vb = make(data(rng, sb, "any"), dtype, device)
    step = 2 if bias_view == "every other" else 1
    got = linear(x, w, b, bias_step=step)
    vb = vb[::step]
    expected = np.matmul(vx, vw) + vb
    scale = np.matmul(np.abs(vx), np.abs(vw)) + np.abs(vb)
    # float32 sums rounded once; a bias that is not one row is added to the product rounded
    # to the dtype first (a second rounding, up to half an ulp of the product), as is any
    # bias on a device whose matmul takes none.
    atol = float(np.max(scale)) * (sx[-1] + 1) * ACC_EPS[dtype]
    if dtype != "float64":
        atol += float(np.max(np.abs(np.matmul(vx, vw)), initial=0.0)) * RTOL[dtype] / 2
    assert got.dtype == dtype and got.shape == expected.shape
    np.testing.assert_allclose(values(got), to_dtype(expected, dtype), rtol=RTOL[dtype], atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,ulp", [("float16", 2.0**-10), ("bfloat16", 2.0**-7)])
def test_narrow_linear_rounds_once(dtype, ulp, device):
    # x @ w = 1 + 0.75 ulp (exact in float32) and the bias 0.5 ulp. Rounded once, the sum
    # (1 + 1.25 ulp) gives 1 + 1 ulp; with the product rounded first (1 + 1 ulp), adding the
    # bias makes 1 + 1.5 ulp, a tie that rounds to even: 1 + 2 ulp.
    x = nd.array(np.array([[1.0, 0.75]] * 3), dtype=dtype, device=device)
    w = nd.array(np.array([[1.0], [ulp]]), dtype=dtype, device=device)
    once, twice = 1.0 + ulp, 1.0 + 2.0 * ulp
    # Every backend adds a bias row to the float32 sums before it rounds them (the CPU as it
    # stores a row, CUDA through cuBLAS's beta or in its own kernel's last step), the empty
    # product included.
    row = nd.array(np.array([ulp / 2]), dtype=dtype, device=device)
    assert values(linear(x, w, row)).ravel().tolist() == [once] * 3
    empty = nd.array(np.zeros((3, 0)), dtype=dtype, device=device)
    no_rows = nd.array(np.zeros((0, 1)), dtype=dtype, device=device)
    assert values(linear(empty, no_rows, row)).ravel().tolist() == [ulp / 2] * 3
    # A bias that is not one row (one per row here) is added to the rounded product anywhere.
    column = nd.array(np.full((3, 1), ulp / 2), dtype=dtype, device=device)
    assert values(linear(x, w, column)).ravel().tolist() == [twice] * 3


# ---------------------------------------------------------------- specific cases


@pytest.mark.parametrize("device", DEVICES)
def test_float16_overflow(device):
    x = nd.array(np.array([300.0, -300.0, 12.0, 11.0]), dtype="float16", device=device)
    with np.errstate(over="ignore"):
        assert values(x * x)[:2].tolist() == [np.inf, np.inf]
        assert values(x * 300.0)[:2].tolist() == [np.inf, -np.inf]
        e = values(x.exp())
    assert e[0] == np.inf and e[1] == 0.0 and e[2] == np.inf  # e**12 = 162755 > 65504
    assert e[3] == float(np.float16(np.exp(11.0)))  # e**11 = 59874 still fits
    assert values((x * x).sum()).tolist() == [np.inf]
    # bfloat16 has float32's range: no overflow there.
    y = nd.array(np.array([300.0]), dtype="bfloat16", device=device)
    assert values(y * y).tolist() == [90112.0]  # 90000 rounded to 8 bits


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_rounding(device):
    # 1 + 2**-8 is halfway between 1 and the next bfloat16 (1 + 2**-7): ties go to even.
    one = nd.array(np.ones(3), dtype="bfloat16", device=device)
    assert values(one + 2.0**-8).tolist() == [1.0] * 3
    assert values(one + 3 * 2.0**-8).tolist() == [1.015625] * 3  # up, to the even one
    # A summand is rounded to bfloat16 first, as PyTorch's: 2**-8 + 2**-20 becomes 2**-8,
    # and 1 + 2**-8 is the tie again.
    assert values(one + (2.0**-8 + 2.0**-20)).tolist() == [1.0] * 3
    stored = nd.array(np.full(2, 1.0 + 2.0**-8), dtype="bfloat16", device=device)
    assert values(stored).tolist() == [1.0, 1.0]
    # A factor enters in float32, not rounded to bfloat16 first (which would make it
    # 1 + 2**-7 and the product the tie 3 + 1.5 ulps, rounded up to 3.03125), as PyTorch's.
    three = nd.array(np.full(2, 3.0), dtype="bfloat16", device=device)
    s = 1.0 + 2.0**-8 + 2.0**-9
    assert values(three * s).tolist() == [3.015625] * 2  # 3.017578125 rounded once
    assert values(s * three).tolist() == [3.015625] * 2
    half = nd.array(np.ones(2), dtype="float16", device=device)
    assert values(half + 2.0**-11).tolist() == [1.0, 1.0]  # float16: the same tie
    assert values(half + 2.0**-10).tolist() == [1.0 + 2.0**-10] * 2


@pytest.mark.parametrize("device", DEVICES)
def test_promotion(device):
    x = np.array([1.5, -2.25, 3.0])

    def arr(dtype):
        return nd.array(x, dtype=dtype, device=device)

    cases = [
        ("float16", "float32", "float32"),
        ("float16", "bfloat16", "float32"),
        ("bfloat16", "float32", "float32"),
        ("float64", "float16", "float64"),
        ("float64", "bfloat16", "float64"),
        ("float64", "float32", "float64"),
        ("float16", "float16", "float16"),
    ]
    for left, right, result in cases:
        for got in (arr(left) + arr(right), arr(right) * arr(left), arr(left) @ arr(right)):
            assert got.dtype == result, (left, right)
        np.testing.assert_array_equal(values(arr(left) + arr(right)), 2 * x)
    for dtype in DTYPES:  # a Python scalar takes the array's dtype
        assert (arr(dtype) * 2.0).dtype == dtype
        assert (2.0 - arr(dtype)).dtype == dtype
        np.testing.assert_array_equal(values(arr(dtype) * 2.0), 2 * x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_comparisons_give_the_dtype(dtype, device):
    a = nd.array(np.array([1.0, 2.0, 3.0]), dtype=dtype, device=device)
    b = nd.array(np.array([3.0, 2.0, 1.0]), dtype=dtype, device=device)
    for got, want in [
        (a == b, [0, 1, 0]),
        (a != b, [1, 0, 1]),
        (a >= b, [0, 1, 1]),
        (a > b, [0, 0, 1]),
        (a <= b, [1, 1, 0]),
        (a < b, [1, 0, 0]),
        (a == 2.0, [0, 1, 0]),
    ]:
        assert got.dtype == dtype
        assert values(got).tolist() == want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_propagates(dtype, device):
    x = np.array([[1.0, np.nan, -2.0], [np.nan, 0.5, 4.0]])
    a = nd.array(x, dtype=dtype, device=device)
    b = nd.array(np.zeros((2, 3)), dtype=dtype, device=device)
    nan = np.isnan
    for got in (a.maximum(b), b.maximum(a), a.minimum(b), b.minimum(a), a.relu()):
        assert got.dtype == dtype
        np.testing.assert_array_equal(nan(values(got)), nan(x))
    assert nan(values(a.max())).all() and nan(values(a.min())).all()
    np.testing.assert_array_equal(nan(values(a.max(axis=0))), [True, True, False])
    np.testing.assert_array_equal(nan(values(a.min(axis=1))), [True, True])
    np.testing.assert_array_equal(nan(values(a.sum(axis=0))), [True, True, False])
    assert values(a.max(axis=0))[2] == 4.0 and values(a.min(axis=0))[2] == -2.0
    # A long row (the lane loops) with one NaN at the end.
    long = np.arange(1000, dtype=np.float64) / 100
    long[-1] = np.nan
    big = nd.array(long, dtype=dtype, device=device)
    assert nan(values(big.max())).all() and nan(values(big.min())).all()
