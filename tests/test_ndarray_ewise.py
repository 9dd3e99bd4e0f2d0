"""NDArray elementwise ops checked against NumPy: unary and binary ops on contiguous
operands and on every kind of view, broadcasting, scalars on either side, comparisons
as float32 0/1, and chained expressions."""

import numpy as np
import pytest

from needle import backend_ndarray as nd

from devices import DEVICES
from ndarray_check import (
    SHAPE_IDS,
    SHAPES,
    check_result,
    make_views,
    rand_data,
    shape_id,
    view_pairs,
)

# --------------------------------------------------------------------------
# elementwise ops
# --------------------------------------------------------------------------


def _sigmoid(x):
    x = x.astype(np.float64)
    return 1.0 / (1.0 + np.exp(-x))


UNARY_OPS = {
    "neg": (lambda a: -a, lambda x: -x, "any"),
    "log": (lambda a: a.log(), np.log, "pos"),
    "exp": (lambda a: a.exp(), np.exp, "any"),
    "tanh": (lambda a: a.tanh(), np.tanh, "any"),
    "sqrt": (lambda a: a.sqrt(), np.sqrt, "pos"),
    "sigmoid": (lambda a: a.sigmoid(), _sigmoid, "any"),
    "abs": (lambda a: a.abs(), np.abs, "any"),
    "relu": (lambda a: a.relu(), lambda x: np.maximum(x, 0), "any"),
    "nd.log": (lambda a: nd.log(a), np.log, "pos"),
    "nd.exp": (lambda a: nd.exp(a), np.exp, "any"),
    "nd.tanh": (lambda a: nd.tanh(a), np.tanh, "any"),
    "nd.sqrt": (lambda a: nd.sqrt(a), np.sqrt, "pos"),
}


@pytest.mark.parametrize("op", list(UNARY_OPS))
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_unary(op, shape, device):
    f_nd, f_np, kind = UNARY_OPS[op]
    rng = np.random.default_rng(31)
    x = rand_data(rng, shape, kind)
    for vkind, npv, ndv in make_views(x, device):
        before = ndv.numpy()
        res = f_nd(ndv)
        msg = f"{op} on {vkind} {shape}"
        assert res is not ndv, msg
        assert res.is_compact(), msg
        check_result(res, f_np(npv), device, msg)
        # the input is unchanged
        np.testing.assert_array_equal(ndv.numpy(), before, err_msg=msg)


def test_unary_special_values():
    a = nd.array([0.0, -0.0, 1e-30, 80.0, -80.0, 1e30])
    np.testing.assert_array_equal(
        a.relu().numpy(), np.array([0, 0, 1e-30, 80, 0, 1e30], np.float32)
    )
    np.testing.assert_allclose(a.sigmoid().numpy(), _sigmoid(a.numpy()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.tanh().numpy(), np.tanh(a.numpy()), rtol=1e-5, atol=1e-6)
    assert np.isinf(nd.array([0.0]).log().numpy()[0])
    assert np.isnan(nd.array([-1.0]).sqrt().numpy()[0])


def _np_pow(x, y):
    # NaN where the base is negative and the exponent not an integer, like powf
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.power(x.astype(np.float64), y)


BINARY_OPS = {
    "add": (lambda a, b: a + b, lambda x, y: x + y, "any", "any"),
    "sub": (lambda a, b: a - b, lambda x, y: x - y, "any", "any"),
    "mul": (lambda a, b: a * b, lambda x, y: x * y, "any", "any"),
    "div": (lambda a, b: a / b, lambda x, y: x / y, "any", "nonzero"),
    "pow": (lambda a, b: a**b, lambda x, y: _np_pow(x, y), "pos", "any"),
    "maximum": (lambda a, b: a.maximum(b), np.maximum, "any", "any"),
    "nd.maximum": (lambda a, b: nd.maximum(a, b), np.maximum, "any", "any"),
    "eq": (lambda a, b: a == b, lambda x, y: x == y, "int", "int"),
    "ne": (lambda a, b: a != b, lambda x, y: x != y, "int", "int"),
    "ge": (lambda a, b: a >= b, lambda x, y: x >= y, "int", "int"),
    "gt": (lambda a, b: a > b, lambda x, y: x > y, "int", "int"),
    "le": (lambda a, b: a <= b, lambda x, y: x <= y, "int", "int"),
    "lt": (lambda a, b: a < b, lambda x, y: x < y, "int", "int"),
}
EXACT_OPS = {"maximum", "nd.maximum", "eq", "ne", "ge", "gt", "le", "lt"}


@pytest.mark.parametrize("exponent", [2.0, 3.0, -1.0])
@pytest.mark.parametrize("device", DEVICES)
def test_exact_powers_keep_numpy_signed_zeros_and_infinities(exponent, device):
    """The exact forms of x**2, x**3 and x**-1 give NumPy's values bit for bit, signs of zeros
    and infinities included: (-0)**3 and (-inf)**-1 are -0."""
    x = np.array([-0.0, 0.0, -np.inf, np.inf, 2.0, -3.0, 0.5], dtype=np.float32)
    got = (nd.array(x, device=device) ** exponent).numpy()
    with np.errstate(divide="ignore"):
        expected = x ** np.float32(exponent)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))


@pytest.mark.parametrize("op", list(BINARY_OPS))
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_binary_same_shape(op, shape, device):
    f_nd, f_np, ka, kb = BINARY_OPS[op]
    rng = np.random.default_rng(41)
    x = rand_data(rng, shape, ka)
    y = rand_data(rng, shape, kb)
    va = make_views(x, device, seed=1)
    vb = make_views(y, device, seed=2)
    for (kx, npa, nda), (ky, npb, ndb) in view_pairs(va, vb):
        msg = f"{op}: {kx} {ky} {shape}"
        res = f_nd(nda, ndb)
        assert res is not nda and res is not ndb, msg
        assert res.is_compact(), msg
        check_result(res, f_np(npa, npb), device, msg, exact=op in EXACT_OPS)


BROADCAST_PAIRS = [
    ((3, 1, 4), (5, 1)),
    ((4,), (2, 3, 4)),
    ((), (3,)),
    ((2, 3), ()),
    ((0, 3), (1, 3)),
    ((2, 1), (2, 0)),
    ((1,), (0,)),
    ((5, 1, 1, 2), (1, 3, 4, 1)),
    ((6,), (1, 6)),
    ((1, 1), (3, 1)),
    ((2, 1, 3, 1, 2), (4, 1, 5, 1)),
]


@pytest.mark.parametrize("op", list(BINARY_OPS))
@pytest.mark.parametrize(
    "sa,sb", BROADCAST_PAIRS, ids=[f"{shape_id(a)}-{shape_id(b)}" for a, b in BROADCAST_PAIRS]
)
@pytest.mark.parametrize("device", DEVICES)
def test_binary_broadcasting(op, sa, sb, device):
    f_nd, f_np, ka, kb = BINARY_OPS[op]
    rng = np.random.default_rng(43)
    x = rand_data(rng, sa, ka)
    y = rand_data(rng, sb, kb)
    va = make_views(x, device, seed=3)
    vb = make_views(y, device, seed=4)
    exp_shape = np.broadcast_shapes(sa, sb)
    pairs = [(a, vb[0]) for a in va] + [(va[0], b) for b in vb[1:]]
    for (kx, npa, nda), (ky, npb, ndb) in pairs:
        msg = f"{op}: {kx}{sa} {ky}{sb}"
        res = f_nd(nda, ndb)
        assert res.shape == exp_shape, msg
        assert res.is_compact(), msg
        check_result(res, f_np(npa, npb), device, msg, exact=op in EXACT_OPS)
        # and with the operands swapped
        res = f_nd(ndb, nda)
        assert res.shape == exp_shape, msg + " swapped"
        check_result(res, f_np(npb, npa), device, msg + " swapped", exact=op in EXACT_OPS)


SCALARS = [2, -3, 1.5, 0.0, np.float32(2.5), np.float64(-0.75), np.int64(3), np.int32(-2)]


def _scalar_id(s):
    return f"{type(s).__name__}({s})"


@pytest.mark.parametrize("s", SCALARS, ids=[_scalar_id(s) for s in SCALARS])
@pytest.mark.parametrize("device", DEVICES)
def test_scalar_ops_array_on_left(s, device):
    rng = np.random.default_rng(51)
    sf = float(s)
    for shape in [(), (0,), (7,), (3, 4), (2, 3, 4)]:
        x = rand_data(rng, shape, "any")
        xi = rand_data(rng, shape, "int")
        xp = rand_data(rng, shape, "pos")
        for (k, npv, ndv), (_, npi, ndi), (_, npp, ndp) in zip(
            make_views(x, device), make_views(xi, device), make_views(xp, device)
        ):
            msg = f"{k} {shape} scalar {s!r}"
            check_result(ndv + s, npv.astype(np.float64) + sf, device, msg + " +")
            check_result(ndv - s, npv.astype(np.float64) - sf, device, msg + " -")
            check_result(ndv * s, npv.astype(np.float64) * sf, device, msg + " *")
            if sf != 0.0:
                check_result(ndv / s, npv.astype(np.float64) / sf, device, msg + " /")
            check_result(ndp**s, np.power(npp.astype(np.float64), sf), device, msg + " **")
            check_result(
                ndv.maximum(s), np.maximum(npv, np.float32(sf)), device, msg + " max", exact=True
            )
            check_result(
                nd.maximum(ndv, s), np.maximum(npv, np.float32(sf)), device, msg, exact=True
            )
            for name, f_nd, f_np in [
                ("==", lambda a: a == s, lambda x: x == sf),
                ("!=", lambda a: a != s, lambda x: x != sf),
                (">=", lambda a: a >= s, lambda x: x >= sf),
                (">", lambda a: a > s, lambda x: x > sf),
                ("<=", lambda a: a <= s, lambda x: x <= sf),
                ("<", lambda a: a < s, lambda x: x < sf),
            ]:
                check_result(f_nd(ndi), f_np(npi), device, msg + " " + name, exact=True)


@pytest.mark.parametrize("s", [2, -3, 1.5, 0.5], ids=[_scalar_id(s) for s in [2, -3, 1.5, 0.5]])
@pytest.mark.parametrize("device", DEVICES)
def test_scalar_ops_python_scalar_on_right(s, device):
    # reflected forms with Python scalars: s + a, s - a, s * a, s / a, s ** a
    rng = np.random.default_rng(52)
    sf = float(s)
    for shape in [(), (0,), (7,), (3, 4), (2, 3, 4)]:
        x = rand_data(rng, shape, "nonzero")
        for k, npv, ndv in make_views(x, device):
            msg = f"{k} {shape} scalar {s!r}"
            x64 = npv.astype(np.float64)
            check_result(s + ndv, sf + x64, device, msg + " radd")
            check_result(s - ndv, sf - x64, device, msg + " rsub")
            check_result(s * ndv, sf * x64, device, msg + " rmul")
            check_result(s / ndv, sf / x64, device, msg + " rtruediv")
            if sf > 0:
                check_result(s**ndv, np.power(sf, x64), device, msg + " rpow")
            check_result(-ndv, -npv, device, msg + " neg")


@pytest.mark.parametrize(
    "s",
    [np.float32(2.5), np.float64(-0.75), np.int64(3)],
    ids=["float32", "float64", "int64"],
)
@pytest.mark.parametrize("device", DEVICES)
def test_scalar_ops_numpy_scalar_on_left_side(s, device):
    # numpy scalar on the left: the result must still be a needle NDArray
    x = np.array([[0.5, -1.5, 2.0], [1.0, 3.0, -0.25]], dtype=np.float32)
    a = nd.array(x, device=device)
    sf = float(s)
    for name, res, exp in [
        ("radd", s + a, sf + x.astype(np.float64)),
        ("rsub", s - a, sf - x.astype(np.float64)),
        ("rmul", s * a, sf * x.astype(np.float64)),
        ("rtruediv", s / a, sf / x.astype(np.float64)),
    ]:
        assert isinstance(res, nd.NDArray), f"{name}: got {type(res)}"
        check_result(res, exp, device, name)


@pytest.mark.parametrize("device", DEVICES)
def test_comparison_results_are_float32_zero_one(device):
    a = nd.array([1.0, 2.0, 3.0], device=device)
    b = nd.array([3.0, 2.0, 1.0], device=device)
    for res, exp in [
        (a == b, [0, 1, 0]),
        (a != b, [1, 0, 1]),
        (a >= b, [0, 1, 1]),
        (a > b, [0, 0, 1]),
        (a <= b, [1, 1, 0]),
        (a < b, [1, 0, 0]),
    ]:
        assert isinstance(res, nd.NDArray)
        assert res.dtype == "float32"
        check_result(res, np.array(exp, np.float32), device, exact=True)


@pytest.mark.parametrize("device", DEVICES)
def test_chained_ops(device):
    rng = np.random.default_rng(53)
    x = rand_data(rng, (4, 5))
    y = rand_data(rng, (5,))
    a = nd.array(x, device=device)
    b = nd.array(y, device=device)
    res = ((a * 2 - b) / 3 + 1).exp().log() ** 2
    exp = np.log(np.exp((x.astype(np.float64) * 2 - y) / 3 + 1)) ** 2
    check_result(res, exp, device, rtol=1e-4, atol=1e-5)
    res = (a.permute((1, 0)) + b.reshape((5, 1))).relu().sum(axis=0)
    exp = np.maximum(x.T + y.reshape(5, 1), 0).sum(axis=0)
    check_result(res, exp, device, rtol=1e-4, atol=1e-5)
