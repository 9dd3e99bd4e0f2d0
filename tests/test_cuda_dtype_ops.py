"""The CUDA backend computes in every dtype (issue 22): elementwise ops, reductions and matmul
in float16, bfloat16 and float64, against NumPy references computed from the stored inputs.

Tolerances, per dtype (the accuracy contract of issue 22):
- float16 / bfloat16 elementwise ops compute in float32 and round once to the dtype. Ops
  that are exact in float32 before that rounding (+ - * /, comparisons, maximum/minimum,
  neg/abs/relu, the exact scalar powers) are checked bit for bit against that emulation
  (float32 from the stored inputs, rounded as tests/test_dtypes.py's reference does). The
  transcendental ones (the device library's float functions, a few float32 ulp) must be
  within one ulp of the dtype of the float64 result: relative 2**-10 (float16), 2**-7
  (bfloat16), plus the dtype's smallest normal as an absolute floor.
- float64 computes in double: exact ops bit for bit with NumPy, transcendental ones within
  1e-14 relative (the device library's double functions are within 2 ulp).
- Reductions accumulate in float32 (float64 for float64): max/min are exact; a sum is within
  one ulp of the dtype of |sum| plus float32 rounding over the reduced length (relative to
  the sum of magnitudes); float64 within 1e-13 of that sum of magnitudes.
- matmul accumulates in float32 for the narrow types (cuBLAS GemmEx with
  CUBLAS_COMPUTE_32F, needle's kernel alike) and rounds once: within the dtype's ulp of
  (|A| @ |B|) elementwise; float64 within 1e-13 of it.
Both GEMM paths run: cuBLAS (the simulator's stand-in on the simulator) in this process,
needle's own kernel in a subprocess with NEEDLE_CUBLAS=0.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_dtypes import narrow_reference

import needle as ndl
import needle_c
from needle import backend_ndarray as nd

from devices import needs_cuda

pytestmark = needs_cuda

DTYPES = ["float16", "bfloat16", "float64"]
NARROW = ["float16", "bfloat16"]
# One ulp of the dtype, relative (its machine epsilon), and its smallest normal.
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52}
TINY = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float64": 2.0**-1022}
# Relative tolerance of the transcendental functions (see the module's docstring).
TRANSCENDENTAL_RTOL = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 1e-14}


def _gpu():
    return ndl.cuda()


def stored(a):
    """The values an NDArray holds, as float64."""
    return a.numpy().astype(np.float64)


def rounded(values, dtype):
    """float64 values stored as dtype (through float32 for the narrow ones, as the GPU does:
    the compute type is float32 and the store rounds that)."""
    if dtype == "float64":
        return np.asarray(values, np.float64)
    return narrow_reference(np.asarray(values, np.float32), dtype)


def emulate(fn, dtype, *inputs):
    """fn over the stored inputs in the dtype's compute type, then the store's rounding."""
    if dtype == "float64":
        return np.asarray(fn(*[np.asarray(x, np.float64) for x in inputs]), np.float64)
    with np.errstate(all="ignore"):
        out = np.asarray(fn(*[np.asarray(x, np.float32) for x in inputs]), np.float32)
    return rounded(out, dtype)


def assert_same_bits(got, want, what):
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same.ravel())
    assert bad.size == 0, (what, [(got.ravel()[i], want.ravel()[i]) for i in bad[:5]])


def array(x, dtype):
    return nd.array(np.asarray(x, np.float32), device=_gpu(), dtype=dtype)


def _inputs(dtype, shape=(5, 7), seed=0, positive=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 3
    if positive:
        x = np.abs(x) + 0.25
    return array(x, dtype) if dtype != "float64" else nd.array(x, device=_gpu(), dtype=dtype)


# ------------------------------------------------------------------- elementwise

# name, needle op, NumPy op (both over (x, y)); all exact before the final rounding.
BINARY = [
    ("add", lambda x, y: x + y, np.add),
    ("sub", lambda x, y: x - y, np.subtract),
    ("mul", lambda x, y: x * y, np.multiply),
    ("div", lambda x, y: x / y, np.divide),
    ("maximum", lambda x, y: x.maximum(y), np.maximum),
    ("minimum", lambda x, y: x.minimum(y), np.minimum),
    ("eq", lambda x, y: x == y, lambda x, y: (x == y).astype(x.dtype)),
    ("ne", lambda x, y: x != y, lambda x, y: (x != y).astype(x.dtype)),
    ("ge", lambda x, y: x >= y, lambda x, y: (x >= y).astype(x.dtype)),
    ("gt", lambda x, y: x > y, lambda x, y: (x > y).astype(x.dtype)),
    ("le", lambda x, y: x <= y, lambda x, y: (x <= y).astype(x.dtype)),
    ("lt", lambda x, y: x < y, lambda x, y: (x < y).astype(x.dtype)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,op,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_ops_arrays_broadcast_and_scalars(dtype, name, op, ref):
    a = _inputs(dtype, (4, 6), seed=1)
    b = _inputs(dtype, (1, 6), seed=2)  # broadcast along the rows
    a_t = _inputs(dtype, (6, 4), seed=3).permute((1, 0))  # a strided operand
    # Equal values somewhere, so that the comparisons see both outcomes.
    b_full = b.broadcast_to((4, 6)).compact()
    cases = [
        (op(a, b), ref, (stored(a), stored(b))),
        (op(a_t, b_full), ref, (stored(a_t), stored(b_full))),
        (op(b_full, b), ref, (stored(b_full), stored(b))),
    ]
    for got, fn, inputs in cases:
        assert got.dtype == dtype and got.shape == (4, 6)
        assert_same_bits(stored(got), emulate(fn, dtype, *inputs), name)
    if name not in ("eq", "ne", "ge", "gt", "le", "lt", "maximum", "minimum"):
        scalar = 1.375
        got = op(a, scalar)
        assert got.dtype == dtype
        assert_same_bits(
            stored(got),
            emulate(lambda x: fn(x, x.dtype.type(scalar)), dtype, stored(a)),
            f"{name} scalar",
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_powers_exact_forms_and_general(dtype):
    x = _inputs(dtype, (3, 8), seed=4, positive=True)
    xs = stored(x)
    for exponent in (2.0, 3.0, -1.0):
        form = {2.0: lambda v: v * v, 3.0: lambda v: v * v * v, -1.0: lambda v: 1 / v}[exponent]
        assert_same_bits(stored(x**exponent), emulate(form, dtype, xs), f"x**{exponent}")
    got = stored(x**0.5)
    np.testing.assert_allclose(got, xs**0.5, rtol=TRANSCENDENTAL_RTOL[dtype], atol=TINY[dtype])
    # An array exponent: the general pow (exponents in [-2, 2]: no overflow in float16).
    y = array(np.random.default_rng(5).uniform(-2, 2, (3, 8)), dtype)
    got = stored(x**y)
    np.testing.assert_allclose(
        got, xs ** stored(y), rtol=2 * TRANSCENDENTAL_RTOL[dtype], atol=TINY[dtype]
    )


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# name, needle op, float64 reference, inputs positive, exact before rounding.
UNARY = [
    ("neg", lambda x: -x, np.negative, False, True),
    ("abs", lambda x: x.abs(), np.abs, False, True),
    ("relu", lambda x: x.relu(), lambda x: np.maximum(x, 0), False, True),
    ("log", lambda x: x.log(), np.log, True, False),
    ("exp", lambda x: x.exp(), np.exp, False, False),
    ("tanh", lambda x: x.tanh(), np.tanh, False, False),
    ("sqrt", lambda x: x.sqrt(), np.sqrt, True, False),
    ("sigmoid", lambda x: x.sigmoid(), _sigmoid, False, False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,op,ref,positive,exact", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ops(dtype, name, op, ref, positive, exact):
    x = _inputs(dtype, (6, 5), seed=6, positive=positive)
    for operand in (x, x.permute((1, 0))):
        got = op(operand)
        assert got.dtype == dtype and got.shape == operand.shape
        xs = stored(operand)
        if exact:
            assert_same_bits(stored(got), emulate(ref, dtype, xs), name)
        else:
            want = rounded(ref(xs), dtype)
            np.testing.assert_allclose(
                stored(got), want, rtol=TRANSCENDENTAL_RTOL[dtype], atol=TINY[dtype], err_msg=name
            )


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_narrow_arithmetic_matches_the_cpu_bit_for_bit(dtype, name):
    """Both backends compute in float32 and round once: the same bits. Values at the
    dtype's rounding and range edges (float16 overflow, subnormals) included."""
    op, ref = {b[0]: b[1:] for b in BINARY}[name]
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(200) * 100, [65504, 60000, 1e-5, 6e-8, -3e4, 0]])
    y = np.concatenate([rng.standard_normal(200), [2.0, 3.0, 0.5, 0.75, 4.0, -0.0]])
    a, b = array(x, dtype), array(y, dtype)
    got = stored(op(a, b))
    assert_same_bits(got, emulate(ref, dtype, stored(a), stored(b)), name)
    cpu_a, cpu_b = a.to(ndl.cpu()), b.to(ndl.cpu())
    try:
        cpu = stored(op(cpu_a, cpu_b))
    except TypeError as e:  # the CPU backend's kernels for the dtype may not be merged yet
        assert f"not implemented for {dtype}" in str(e)
        return
    assert_same_bits(got, cpu, f"{name} against the cpu")


def test_float16_overflow_and_nan_propagation():
    a = array([60000.0, 1.0, np.nan, 2.0], "float16")
    b = array([60000.0, np.nan, 1.0, 3.0], "float16")
    np.testing.assert_array_equal(stored(a + b)[0], np.inf)  # past 65504: infinity
    assert np.isnan(stored(a.maximum(b))[1:3]).all()  # NaN from either side
    assert np.isnan(stored(a.relu())[2])
    np.testing.assert_array_equal(stored(a.max(axis=0)), [np.nan])


def test_mixed_dtypes_promote_and_compute():
    h, bf = array([1.5, 2.0], "float16"), array([0.5, 4.0], "bfloat16")
    d = nd.array(np.array([0.1, 0.2]), device=_gpu(), dtype="float64")
    s = h + bf
    assert s.dtype == "float32"
    np.testing.assert_array_equal(s.numpy(), [2.0, 6.0])
    s = h * d
    assert s.dtype == "float64"
    np.testing.assert_array_equal(s.numpy(), np.array([1.5, 2.0]) * np.array([0.1, 0.2]))


# -------------------------------------------------------------------- reductions


def _sum_tolerance(xs, axis, dtype, n):
    magnitude = np.abs(xs).sum(axis=axis)
    if dtype == "float64":
        return 1e-13 * magnitude + TINY[dtype]
    # float32 accumulation over n elements, then one rounding to the dtype.
    return EPS[dtype] * np.abs(xs.sum(axis=axis)) + n * 2.0**-24 * magnitude + TINY[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape,axis",
    [
        ((6, 9), 0),
        ((6, 9), 1),
        ((6, 9), None),
        ((3, 4, 5), 1),
        ((3, 4, 5), (0, 2)),
        ((4, 3000), 1),  # few long rows: a whole block per output
        ((3000, 4), 0),  # long columns: a thread per output
        ((200, 64), 1),  # many short rows: a warp per output
    ],
)
def test_reductions(dtype, shape, axis):
    x = _inputs(dtype, shape, seed=8)
    xs = stored(x)
    n = xs.size if axis is None else int(np.prod([shape[i] for i in np.atleast_1d(axis)]))
    ax = tuple(np.atleast_1d(axis)) if axis is not None else None
    for name, ref in (("max", np.max), ("min", np.min)):
        got = getattr(x, name)(axis=axis, keepdims=True)
        assert got.dtype == dtype
        np.testing.assert_array_equal(stored(got), ref(xs, axis=ax, keepdims=True), err_msg=name)
    got = x.sum(axis=axis, keepdims=True)
    assert got.dtype == dtype
    want = xs.sum(axis=ax, keepdims=True)
    err = np.abs(stored(got) - want)
    tol = _sum_tolerance(xs, ax, dtype, n).reshape(want.shape)
    assert (err <= tol).all(), (err.max(), tol.min())


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_of_strided_and_reversed_views(dtype):
    x = _inputs(dtype, (7, 10), seed=9)
    v = x.permute((1, 0)).flip((0,))
    vs = stored(v)
    np.testing.assert_array_equal(stored(v.max(axis=1)), vs.max(axis=1))
    np.testing.assert_array_equal(stored(v.min(axis=0)), vs.min(axis=0))
    err = np.abs(stored(v.sum(axis=0)) - vs.sum(axis=0))
    assert (err <= _sum_tolerance(vs, 0, dtype, 10)).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_of_nothing_is_zero(dtype):
    x = nd.array(np.zeros((0, 3)), device=_gpu(), dtype=dtype)
    got = x.sum(axis=0)
    assert got.dtype == dtype
    np.testing.assert_array_equal(stored(got), np.zeros(3))


def test_narrow_sums_accumulate_in_float32():
    """1 + 4096 small terms: a float16 accumulator would stall at 2048 (its ulp there is 2);
    float32 accumulation reaches the exact 4097, which float16 rounds to 4096."""
    x = array(np.ones(4097), "float16")
    np.testing.assert_array_equal(stored(x.sum()), [4096.0])
    y = array(np.full(3000, 1.0 / 1024), "bfloat16")  # bfloat16 alone would stall at 0.5
    got = stored(y.sum())[0]
    assert abs(got - 3000 / 1024) <= EPS["bfloat16"] * 3000 / 1024


# ------------------------------------------------------------------------ matmul


def _matmul_cases(dtype):
    """(name, a, b) pairs of device arrays: 2-D, batched (strided and broadcast), transposed
    operands, a batch whose strides do not collapse (the pointer-array path), k = 0."""
    g = _gpu()

    def mk(shape, seed):
        rng = np.random.default_rng(seed)
        return nd.array(rng.standard_normal(shape), device=g, dtype=dtype)

    return [
        ("2d", mk((17, 33), 10), mk((33, 9), 11)),
        ("batched", mk((3, 8, 12), 12), mk((3, 12, 5), 13)),
        ("broadcast", mk((4, 6, 7), 14), mk((7, 3), 15)),
        ("a transposed", mk((20, 11), 16).permute((1, 0)), mk((20, 6), 17)),
        ("b transposed", mk((5, 20), 18), mk((9, 20), 19).permute((1, 0))),
        # (batch, seq, heads, dim) viewed as (batch, heads, seq, dim): strides do not merge.
        (
            "pointer array",
            mk((2, 5, 3, 4), 20).permute((0, 2, 1, 3)),
            mk((2, 5, 3, 4), 21).permute((0, 2, 3, 1)),
        ),
        ("k=0", mk((4, 0), 22), mk((0, 3), 23)),
    ]


def _linear_once_cases(dtype):
    """(name, values) of x @ w + a bias row on the GPU, x @ w = 1 + 0.75 ulp of dtype (exact in
    float32) and the bias 0.5 ulp: every value is 1 + 1 ulp where the bias joins the float32
    sums before their one rounding (1 + 2 ulp where the product is rounded first), and 0.5 ulp
    where the product is empty. 2-D, strided batched, pointer-array batched, k = 0."""
    ulp = EPS[dtype]
    g = _gpu()

    def arr(x):
        return ndl.Tensor(nd.array(np.asarray(x, np.float64), device=g, dtype=dtype), device=g)

    w, row = arr([[1.0], [ulp]]), arr([ulp / 2])
    pair = [1.0, 0.75]
    # (2, 3, 2, 2) viewed as (2, 2, 3, 2): batch strides that do not merge (pointer arrays).
    pointer = ndl.Tensor(
        nd.array(np.tile(pair, (2, 3, 2, 1)), device=g, dtype=dtype).permute((0, 2, 1, 3)),
        device=g,
    )
    cases = [
        ("2d", arr([pair] * 3), w),
        ("batched", arr(np.tile(pair, (2, 3, 1))), w),
        ("pointer array", pointer, w),
        ("k=0", arr(np.zeros((3, 0))), arr(np.zeros((0, 1)))),
    ]
    return [
        (name, stored(ndl.ops.matmul_bias(x, m, row).realize_cached_data())) for name, x, m in cases
    ]


def check_linear_once(name, values, dtype):
    want = EPS[dtype] / 2 if name == "k=0" else 1.0 + EPS[dtype]
    assert values.size > 0 and (values == want).all(), (dtype, name, values.ravel().tolist())


def check_matmul(name, got, a, b, dtype):
    want = np.matmul(a, b)
    bound = np.matmul(np.abs(a), np.abs(b))
    if dtype == "float64":
        tol = 1e-13 * bound
    else:
        tol = EPS[dtype] * np.abs(want) + a.shape[-1] * 2.0**-23 * bound
    err = np.abs(got - want)
    assert got.shape == want.shape, name
    assert (err <= tol + TINY[dtype]).all(), (name, float(err.max()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_with_cublas(dtype):
    for name, a, b in _matmul_cases(dtype):
        c = a @ b
        assert c.dtype == dtype, name
        check_matmul(name, stored(c), stored(a), stored(b), dtype)
    if dtype != "float64":
        for name, values in _linear_once_cases(dtype):
            check_linear_once(name, values, dtype)


_KERNEL_RUN = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import needle as ndl
    sys.path.insert(0, {tests!r})
    import test_cuda_dtype_ops as t
    out = {{"gemm": ndl.cuda.gemm_backend()}}
    for dtype in t.DTYPES:
        for name, a, b in t._matmul_cases(dtype):
            c = a @ b
            assert c.dtype == dtype
            path = {tmp!r} + "/" + dtype + "_" + name.replace(" ", "_")
            np.save(path + "_c.npy", t.stored(c))
            np.save(path + "_a.npy", t.stored(a))
            np.save(path + "_b.npy", t.stored(b))
        if dtype != "float64":
            for name, values in t._linear_once_cases(dtype):
                name = name.replace(" ", "_")
                np.save({tmp!r} + "/linear_" + dtype + "_" + name + ".npy", values)
    print(json.dumps(out))
    """
)


def test_matmul_with_needles_kernel(tmp_path):
    env = dict(os.environ, NEEDLE_CUBLAS="0")
    first = [os.path.dirname(needle_c.__file__), os.path.dirname(os.path.dirname(ndl.__file__))]
    env["PYTHONPATH"] = os.pathsep.join(first + [env.get("PYTHONPATH", "")])
    tests = os.path.dirname(os.path.abspath(__file__))
    code = _KERNEL_RUN.format(tests=tests, tmp=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "NEEDLE_CUBLAS=0" in got["gemm"] and not got["gemm"].startswith("cublas")
    for dtype in DTYPES:
        for name, _, _ in _matmul_cases(dtype):
            path = tmp_path / f"{dtype}_{name.replace(' ', '_')}"
            c, a, b = (np.load(f"{path}_{s}.npy") for s in "cab")
            check_matmul(f"{dtype} {name}", c, a, b, dtype)
        if dtype != "float64":
            for name in ("2d", "batched", "pointer array", "k=0"):
                values = np.load(tmp_path / f"linear_{dtype}_{name.replace(' ', '_')}.npy")
                check_linear_once(name, values, dtype)


# ------------------------------------------------------------------------- census


def _launches(fn):
    ndl.cuda.reset_work_counters()
    fn()
    counts = ndl.cuda.work_counters(reset=True)
    return {k: v for k, v in counts.items() if v}


def test_one_launch_per_elementwise_op_in_every_dtype():
    for dtype in ["float32", *DTYPES]:
        a = _inputs(dtype, (16, 16), seed=24)
        b = _inputs(dtype, (16, 16), seed=25).permute((1, 0))
        for what, fn in [
            ("add", lambda a=a: a + a),
            ("strided mul", lambda a=a, b=b: a * b),
            ("scalar", lambda a=a: a * 2.0),
            ("exp", lambda a=a: a.exp()),
            ("row sum", lambda a=a: a.sum(axis=1)),
        ]:
            assert _launches(fn) == {"kernel_launches": 1}, (dtype, what)


def test_matmul_is_one_cublas_call_in_every_dtype():
    if not ndl.cuda.gemm_backend().startswith("cublas ("):
        pytest.skip(f"cuBLAS not in use: {ndl.cuda.gemm_backend()}")
    for dtype in ["float32", *DTYPES]:
        a = _inputs(dtype, (2, 8, 8), seed=26)
        assert _launches(lambda a=a: a @ a) == {"blas_calls": 1}, dtype
        # The pointer-array path: the pointers' kernel and one call.
        p = _inputs(dtype, (2, 4, 3, 4), seed=27).permute((0, 2, 1, 3))
        counts = _launches(lambda p=p: p @ p.permute((0, 1, 3, 2)))
        assert counts.get("blas_calls") == 1 and counts.get("kernel_launches") == 1, dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_bad_shapes_raise_and_the_device_goes_on(dtype):
    a = _inputs(dtype, (3, 4), seed=28)
    with pytest.raises(ValueError):
        a @ a  # (3, 4) @ (3, 4): inner dims differ
    with pytest.raises(ValueError):
        a + _inputs(dtype, (5, 4), seed=29)  # shapes do not broadcast
    with pytest.raises(ValueError):
        a.sum(axis=2)
    np.testing.assert_array_equal(stored(a - a), np.zeros((3, 4)))
