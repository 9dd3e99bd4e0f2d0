"""One scalar-operand path (array_scalar_operand, needle_c/array/array_helpers.c): a Python
scalar meets an NDArray or a Tensor at the operand's dtype and full precision.

float64 keeps the double exactly, for every operator and reflected operator; float32 rounds
it once to float32; float16 and bfloat16 compute in float32 and round the result once, with
the scalar as PyTorch 2.13 has it: float32 for * and / (its opmath path), rounded to the
narrow dtype for +, -, comparisons, ** and the bounds of maximum/minimum/clamp. Each is
checked bit for bit against PyTorch (and NumPy where NumPy computes the same thing), on
every device.
"""

import math

import numpy as np
import pytest

import needle as ndl

from devices import DEVICES

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float16", "bfloat16", "float64"]
TORCH = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
SCALARS = [0.1, 1 / 3, -0.7, 1e-3, 2.5e-8, 1e10]

# The operators with a scalar on either side: (name, function of (tensor, scalar)).
OPERATORS = [
    ("add", lambda t, s: t + s),
    ("radd", lambda t, s: s + t),
    ("sub", lambda t, s: t - s),
    ("rsub", lambda t, s: s - t),
    ("mul", lambda t, s: t * s),
    ("rmul", lambda t, s: s * t),
    ("div", lambda t, s: t / s),
    ("rdiv", lambda t, s: s / t),
]


def values():
    """Positive and negative magnitudes around 1, where a scalar's rounding shows."""
    rng = np.random.default_rng(5)
    x = rng.uniform(0.25, 4.0, 64) * rng.choice([-1.0, 1.0], 64)
    return np.concatenate([x, [1.0, -1.0, 0.5, 3.0]])


def pair(dtype, device, x=None):
    """(needle Tensor, torch tensor) holding the same numbers of dtype."""
    t = torch.tensor(values() if x is None else np.asarray(x, np.float64)).to(TORCH[dtype])
    return ndl.Tensor(t.double().numpy(), device=device, dtype=dtype), t


def bits_equal(got, want, msg):
    got = np.asarray(got.numpy(), np.float64)
    want = want.double().numpy()
    np.testing.assert_array_equal(got, want, err_msg=msg)  # NaN == NaN here
    number = ~np.isnan(want)  # a NaN's sign is no result
    np.testing.assert_array_equal(np.signbit(got[number]), np.signbit(want[number]), err_msg=msg)


def pw(a, b):
    """libm's pow (math.pow), NaN where it has no real result."""
    try:
        return math.pow(a, b)
    except ValueError:
        return math.nan


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [n for n, _ in OPERATORS])
def test_operators_keep_the_scalar_at_the_dtype(name, dtype, device):
    f = dict(OPERATORS)[name]
    x, t = pair(dtype, device)
    for s in SCALARS:
        got = f(x, s)
        assert got.dtype == dtype
        bits_equal(got, f(t, s), f"Tensor {name} {dtype} {s}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_powers_keep_the_scalar_at_the_dtype(dtype, device):
    x, t = pair(dtype, device, np.abs(values()))
    v = x.numpy().astype(np.float64)
    for s in (0.1, 1 / 3, 2.5, -0.7):
        # float64: libm's pow of the exact double; float32: the scalar rounded to float32
        # (pow's last ulp is nd_powf's, within one of PyTorch's); narrow: the scalar at
        # the narrow dtype, bit for bit as PyTorch.
        got, rgot = np.asarray((x**s).numpy(), np.float64), np.asarray((s**x).numpy(), np.float64)
        if dtype == "float64":
            np.testing.assert_array_equal(got, [pw(e, s) for e in v])
            np.testing.assert_array_equal(rgot, [pw(s, e) for e in v])
        elif dtype == "float32":
            s32 = float(np.float32(s))
            want = np.array([pw(e, s32) for e in v]).astype(np.float32)
            np.testing.assert_allclose(got, want, rtol=2.5e-7)
            want = np.array([pw(s32, e) for e in v]).astype(np.float32)
            np.testing.assert_allclose(rgot, want, rtol=2.5e-7)
        else:
            bits_equal(x**s, t**s, f"x ** {s} {dtype}")
            bits_equal(s**x, s**t, f"{s} ** x {dtype}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_minmax_and_clamp_scalars(dtype, device):
    x, t = pair(dtype, device)
    for s in (0.1, -1 / 3):
        ts = torch.tensor(s, dtype=torch.float64)
        bits_equal(ndl.ops.maximum(x, s), torch.maximum(t, ts.to(TORCH[dtype])), "maximum")
        bits_equal(ndl.ops.minimum(x, s), torch.minimum(t, ts.to(TORCH[dtype])), "minimum")
        bits_equal(ndl.ops.clamp(x, min=s), torch.clamp(t, min=s), f"clamp min {s}")
        bits_equal(ndl.ops.clamp(x, max=s), torch.clamp(t, max=s), f"clamp max {s}")


@pytest.mark.parametrize("device", DEVICES)
def test_float64_is_exact_for_every_operator(device):
    """The issue's example and its kin: the double, not its float32 rounding."""
    one = ndl.Tensor([1.0], device=device, dtype="float64")
    assert (one + 0.1).numpy()[0] == 1.1
    assert (0.1 + one).numpy()[0] == 1.1
    assert (one - 0.1).numpy()[0] == 1.0 - 0.1
    assert (0.1 - one).numpy()[0] == 0.1 - 1.0
    assert (one * 0.1).numpy()[0] == 0.1
    assert (one / 0.1).numpy()[0] == 1.0 / 0.1
    assert (0.1 / one).numpy()[0] == 0.1
    assert (one * 3.0 / 0.1).numpy()[0] == 3.0 / 0.1
    assert (ndl.Tensor([2.0], dtype="float64", device=device) ** 0.1).numpy()[0] == 2.0**0.1
    assert (0.1 ** ndl.Tensor([2.0], dtype="float64", device=device)).numpy()[0] == 0.1**2.0
    third = ndl.Tensor([0.3], device=device, dtype="float64")
    assert ndl.ops.maximum(third, 0.1 + 0.2).numpy()[0] == 0.1 + 0.2
    assert third.clamp(min=0.1 + 0.2).numpy()[0] == 0.1 + 0.2
    assert third.clamp(max=0.1).numpy()[0] == 0.1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fill_full_and_setitem_keep_the_scalar_at_the_dtype(dtype, device):
    """A scalar written into an array (fill, full, setitem) is rounded once, to the array's
    dtype: a float64 array holds the double itself."""
    from needle import backend_ndarray as nd

    expected = torch.tensor([0.1], dtype=TORCH[dtype]).to(torch.float64).item()
    a = nd.array(np.zeros(3), device=device, dtype=dtype)
    a.fill(0.1)
    b = nd.full((3,), 0.1, device=device, dtype=dtype)
    c = nd.array(np.zeros(3), device=device, dtype=dtype)
    c[1:] = 0.1
    for arr, count in ((a, 3), (b, 3), (c[1:], 2)):
        assert arr.dtype == dtype
        got = arr.astype("float64").numpy()
        np.testing.assert_array_equal(got, np.full(count, expected))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ndarray_operators_share_the_path(dtype, device):
    """NDArray's operators, reflected ones and comparisons take the scalar the same way; its
    s / a is one division (NumPy's), where Tensor's is PyTorch's reciprocal * s."""
    x, t = pair(dtype, device)
    a = x.realize_cached_data()
    for name, f in OPERATORS:
        if name == "rdiv":
            continue
        for s in SCALARS:
            bits_equal(f(a, s), f(t, s), f"NDArray {name} {dtype} {s}")
    if dtype == "float64":
        v = values()
        for s in SCALARS:
            np.testing.assert_array_equal((s / a).numpy(), s / v)
    # Comparisons: 0.1 + 1e-12 lies between float64's 0.1 and float32's.
    b = ndl.NDArray(np.array([0.1, 0.1 + 1e-12, 0.2]), device=device, dtype="float64")
    np.testing.assert_array_equal((b > 0.1).numpy(), [0.0, 1.0, 1.0])
    np.testing.assert_array_equal((b == 0.1).numpy(), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal((b <= 0.1).numpy(), [1.0, 0.0, 0.0])
    for s in (0.1, -1 / 3):
        for op in ("__gt__", "__lt__", "__ge__", "__le__", "__eq__", "__ne__"):
            got = np.asarray(getattr(a, op)(s).numpy(), np.float64)
            want = getattr(t, op)(s).double().numpy()
            np.testing.assert_array_equal(got, want, err_msg=f"{op} {dtype} {s}")
        ts = torch.tensor(s, dtype=torch.float64).to(TORCH[dtype])
        bits_equal(a.maximum(s), torch.maximum(t, ts), "max")


@pytest.mark.parametrize("device", DEVICES)
def test_narrow_scalar_roundings(device):
    """x16 * 0.1 uses float32's 0.1; x16 + 1/3 uses float16's 1/3; both round once."""
    f32, f16 = np.float32, np.float16
    got = (ndl.Tensor([3.0], device=device, dtype="float16") * 0.1).numpy()[0]
    assert got == f16(f32(3.0) * f32(0.1)) == f16(0.3)
    assert got != f16(f32(3.0) * f32(f16(0.1)))
    got = (ndl.Tensor([-1.0], device=device, dtype="float16") + 1 / 3).numpy()[0]
    assert got == f16(f32(-1.0) + f32(f16(1 / 3)))
    assert got != f16(f32(-1.0) + f32(1 / 3))
    eq = ndl.Tensor([0.1], device=device, dtype="float16").realize_cached_data() == 0.1
    assert eq.numpy()[0] == 1.0  # float16(0.1) == 0.1 at float16, as PyTorch says


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_of_scalar_ops_keep_the_scalar(device):
    x = ndl.Tensor([2.0], device=device, dtype="float64")
    (x * 0.1).backward()
    assert x.grad.numpy()[0] == 0.1
    y = ndl.Tensor([2.0], device=device, dtype="float64")
    (y / 0.1).backward()
    assert y.grad.numpy()[0] == 1.0 / 0.1


def test_bad_scalars_raise():
    x = ndl.Tensor([1.0], dtype="float64")
    with pytest.raises(TypeError):
        x + "0.1"
    with pytest.raises(TypeError):
        "0.1" - x
    with pytest.raises(TypeError):
        x * None
    with pytest.raises(TypeError):
        x ** [1.0]
    with pytest.raises(TypeError):
        ndl.NDArray([1.0]) / "2"
    assert math.isnan((x * math.nan).numpy()[0])
    assert (x * math.inf).numpy()[0] == math.inf
    assert (x + 1).numpy()[0] == 2.0
