"""Storage dtypes: float32 (the default), float16, bfloat16 and float64 arrays on every device.

What holds today: arrays of every dtype are made, filled, copied, converted (``astype``),
viewed, indexed, moved between devices and exchanged with NumPy and DLPack consumers; their
bytes are counted by itemsize. float16 and bfloat16 round to nearest even, as NumPy's and
PyTorch's casts do (checked value by value against them), on the CPU and the GPU alike.
Elementwise ops, reductions and matmul compute in every dtype (tests/test_dtype_ops.py,
tests/test_cuda_dtype_ops.py), the fused operations through float32 (tests/test_dtype_fused.py).
"""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES, dev

DTYPES = ["float32", "float16", "bfloat16", "float64"]
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def bf16_reference(x):
    """float32 -> bfloat16 -> float32 with round-to-nearest-even, NaN kept (the bits)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out)


def narrow_reference(x, dtype):
    """What a float32 array x holds after conversion to dtype, as float64 values."""
    x = np.asarray(x, np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        return bf16_reference(x).astype(np.float64)
    return x.astype(np.float64)


def edge_values():
    """float32 values at float16's and bfloat16's rounding and range edges."""
    tiny = 2.0**-24  # float16's smallest subnormal
    values = [
        0.0, -0.0, 1.0, -1.0, 1.0 / 3.0, 65504.0, 65519.0, 65520.0, -65520.0, 1e5, 3.0e38,
        np.inf, -np.inf, tiny, tiny / 2, tiny * 0.75, tiny * 1.5, tiny * 2.5, 2.0**-14,
        2.0**-14 * (1 - 2.0**-11), 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8,
        1.0 + 3 * 2.0**-8, 1.0 + 2.0**-8 + 2.0**-20, 1e-40, -1e-45, 3.4028235e38,
    ]  # fmt: skip
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(4000) * np.exp(rng.uniform(-20, 20, 4000))
    bits = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([np.array(values, np.float32), spread.astype(np.float32), bits])


@dev
@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_round_trip_and_properties(device, dtype):
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 8 - 1
    a = nd.array(x, dtype=dtype, device=device)
    assert a.dtype == dtype and a.device == device and a.shape == (2, 3, 4)
    assert a.itemsize == ITEMSIZE[dtype] and a.nbytes == 24 * ITEMSIZE[dtype]
    got = a.numpy()
    # NumPy has no bfloat16: those arrays come back as float32, which holds them exactly.
    assert got.dtype == (np.float32 if dtype == "bfloat16" else np.dtype(dtype))
    np.testing.assert_array_equal(got, x)  # eighths are exact in every dtype
    assert getattr(ndl, dtype) == dtype


@dev
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrowing_rounds_to_nearest_even(device, dtype):
    x = edge_values()
    a = nd.array(x, device=device).astype(dtype)
    got = a.numpy().astype(np.float64)
    want = narrow_reference(x, dtype)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, [(x[i], got[i], want[i]) for i in bad[:5]]
    # Signs of zeros survive.
    assert np.array_equal(np.signbit(got[got == 0]), np.signbit(want[want == 0]))


@dev
def test_float16_overflow_and_subnormals(device):
    x = np.array([65504, 65519, 65520, 70000, -1e9, 2.0**-24, 2.0**-25, 3 * 2.0**-26], np.float32)
    got = nd.array(x, device=device).astype("float16").numpy()
    want = [65504, 65504, np.inf, np.inf, -np.inf, 2.0**-24, 0.0, 2.0**-24]
    np.testing.assert_array_equal(got.astype(np.float64), want)


@dev
def test_bfloat16_against_torch(device):
    torch = pytest.importorskip("torch")
    x = edge_values()
    got = nd.array(x, device=device).astype("bfloat16").numpy()
    want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(got, want)


@dev
@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_astype_every_pair_on_strided_views(device, src, dst):
    x = np.linspace(-3, 3, 60).reshape(3, 4, 5)
    a = nd.array(x, dtype=src, device=device)
    held = narrow_reference(a.numpy(), src) if src != "float64" else x
    views = {
        "permuted": (a.permute((2, 0, 1)), held.transpose(2, 0, 1)),
        "stepped": (a[0:3:2, 1:4, 0:5:2], held[0:3:2, 1:4, 0:5:2]),
        "broadcast": (a[0:1].broadcast_to((2, 4, 4, 5)), np.broadcast_to(held[0:1], (2, 4, 4, 5))),
    }
    for name, (view, values) in views.items():
        out = view.astype(dst)
        assert out.dtype == dst and out.shape == values.shape and out.is_compact(), name
        want = narrow_reference(values, dst) if dst != "float64" else values
        np.testing.assert_array_equal(out.numpy().astype(np.float64), want, err_msg=name)


@dev
@pytest.mark.parametrize("dtype", DTYPES)
def test_fill_assign_and_compact(device, dtype):
    a = nd.full((3, 4), 1.0 / 3.0, dtype=dtype, device=device)
    third = narrow_reference(np.float32(1 / 3), dtype) if dtype != "float64" else 1 / 3
    np.testing.assert_array_equal(a.numpy().astype(np.float64), np.full((3, 4), third))
    a[1, :] = 2.5  # a scalar
    a[:, 0] = np.array([[7.0], [8.0], [9.0]])  # NumPy data converted to the array's dtype
    a[2, 1:3] = nd.array([[-1.0, -2.0]], dtype="float32", device=device)  # another dtype
    want = np.full((3, 4), third)
    want[1, :] = 2.5
    want[:, 0] = [7, 8, 9]
    want[2, 1:3] = [-1, -2]
    np.testing.assert_array_equal(a.numpy().astype(np.float64), want)
    t = a.permute((1, 0)).compact()
    assert t.dtype == dtype and t.is_compact()
    np.testing.assert_array_equal(t.numpy().astype(np.float64), want.T)
    e = nd.empty((2, 2), dtype=dtype, device=device)
    assert e.dtype == dtype and e.nbytes == 4 * ITEMSIZE[dtype]


def test_float64_keeps_full_precision():
    x = np.array([1 / 3, np.pi, 1 + 2.0**-40, 1e-300, 1e300])
    a = nd.array(x, dtype="float64")
    np.testing.assert_array_equal(a.numpy(), x)
    np.testing.assert_array_equal(a.astype("float64").numpy(), x)
    np.testing.assert_array_equal(nd.full((2,), np.pi, dtype="float64").numpy(), [np.pi] * 2)


@dev
@pytest.mark.parametrize("dtype", DTYPES)
def test_bytes_are_counted_by_itemsize(device, dtype):
    before = ndl.memory.memory_allocated(device)
    a = nd.empty((1000, 64), dtype=dtype, device=device)
    grown = ndl.memory.memory_allocated(device) - before
    assert grown >= 64000 * ITEMSIZE[dtype] and grown < 64000 * ITEMSIZE[dtype] + 4096
    del a
    assert ndl.memory.memory_allocated(device) == before


@dev
@pytest.mark.parametrize("dtype", DTYPES)
def test_tensors_keep_their_dtype(device, dtype):
    t = ndl.Tensor(np.ones((2, 2)), device=device, dtype=dtype)
    assert t.dtype == dtype and t.cached_data.dtype == dtype
    assert ndl.Tensor(t).dtype == dtype  # a tensor's dtype is kept
    assert ndl.Tensor(t, dtype="float32").dtype == "float32"
    assert ndl.Tensor([1.0, 2.0]).dtype == "float32"  # Python numbers: float32 by default
    assert ndl.Tensor(np.ones(3, np.float16)).dtype == "float16"  # NumPy data keeps its dtype
    for make in (ndl.init.zeros, ndl.init.ones, ndl.init.rand, ndl.init.randn):
        made = make(2, 3, device=device, dtype=dtype)
        assert made.dtype == dtype and made.shape == (2, 3)
    assert ndl.init.ones(2, device=device, dtype=dtype).numpy().tolist() == [1.0, 1.0]


@dev
def test_random_draws_are_the_float32_stream_rounded(device):
    ndl.random.manual_seed(3)
    wide = device.randn(50)
    ndl.random.manual_seed(3)
    narrow = device.randn(50, dtype="bfloat16")
    assert narrow.dtype == "bfloat16"
    np.testing.assert_array_equal(narrow.numpy(), bf16_reference(wide.numpy()))


@dev
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_array_interfaces(device, dtype):
    a = nd.array(np.arange(6.0).reshape(2, 3), dtype=dtype, device=device)
    name = "__cuda_array_interface__" if device.name == "cuda" else "__array_interface__"
    info = getattr(a.permute((1, 0)), name)
    assert info["typestr"] == {"float16": "<f2", "float64": "<f8"}[dtype]
    assert info["strides"] == (ITEMSIZE[dtype], 3 * ITEMSIZE[dtype])
    if device.name == "cpu":
        np.testing.assert_array_equal(np.asarray(a), np.arange(6.0).reshape(2, 3))
    with pytest.raises(TypeError, match="no type for bfloat16"):
        getattr(a.astype("bfloat16"), name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dlpack_with_torch(dtype):
    torch = pytest.importorskip("torch")
    a = nd.array(np.arange(12.0).reshape(3, 4), dtype=dtype)
    t = torch.from_dlpack(a.permute((1, 0)))
    assert str(t.dtype) == f"torch.{dtype}"
    np.testing.assert_array_equal(t.float().numpy(), np.arange(12.0).reshape(3, 4).T)
    back = nd.from_dlpack(t)  # shared, not copied
    assert back.dtype == dtype
    t[0, 0] = 100.0
    assert a.numpy()[0, 0] == 100.0 and back.numpy()[0, 0] == 100.0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_moves_between_devices_keep_the_dtype(dtype):
    x = np.arange(10.0).reshape(2, 5) / 4
    a = nd.array(x, dtype=dtype, device=nd.cpu())
    other = nd.cpu_numpy()
    moved = a.to(other)
    assert moved.dtype == dtype and moved.device == other
    np.testing.assert_array_equal(moved.numpy().astype(np.float64), x)
    if ndl.cuda().enabled():
        gpu = a.permute((1, 0)).to(ndl.cuda())
        assert gpu.dtype == dtype
        np.testing.assert_array_equal(gpu.numpy().astype(np.float64), x.T)
        np.testing.assert_array_equal(gpu.to(nd.cpu()).numpy().astype(np.float64), x.T)


@pytest.mark.parametrize(
    "bad,error,message",
    [
        ("float8", TypeError, "is not a dtype"),
        ("int32", TypeError, "needle arrays hold float32, float16, bfloat16 or float64"),
        (np.int64, TypeError, "needle arrays hold"),
        (3, TypeError, "is not a dtype"),
        (object(), TypeError, "is not a dtype"),
    ],
)
def test_bad_dtypes(bad, error, message):
    with pytest.raises(error, match=message):
        nd.array([1.0], dtype=bad)
    with pytest.raises(error, match=message):
        nd.cpu().full((2,), 1.0, dtype=bad)
    with pytest.raises(error, match=message):
        ndl.Tensor([1.0], dtype=bad)
    np.testing.assert_array_equal((nd.array([1.0]) + 1).numpy(), [2.0])


def test_astype_to_numpy_types_needle_lacks_gives_numpy():
    a = nd.array([[1.5, 2.5]], dtype="float16")
    got = a.astype(np.int32)
    assert isinstance(got, np.ndarray) and got.dtype == np.int32
    np.testing.assert_array_equal(got, [[1, 2]])
    with pytest.raises(TypeError):
        a.astype("not a dtype")


@pytest.mark.parametrize("device", DEVICES)
def test_pytorch_names(device):
    a = nd.array([1.0], device=device)
    assert a.astype("half").dtype == "float16"
    assert a.astype("double").dtype == "float64"
    assert a.astype("float").dtype == "float32"


def _hw1_gradient_check(f, *args, tol=1e-6, **kwargs):
    """The course's hw1 gradient_check, as its tests run it: central differences with eps
    1e-4 written into the inputs' data in place (``realize_cached_data().flat[j] += eps``),
    against the backward's gradients, to a total error of 1e-6."""
    eps = 1e-4
    numerical = [np.zeros(a.shape) for a in args]
    for i in range(len(args)):
        for j in range(args[i].realize_cached_data().size):
            args[i].realize_cached_data().flat[j] += eps
            f1 = float(f(*args, **kwargs).numpy().sum())
            args[i].realize_cached_data().flat[j] -= 2 * eps
            f2 = float(f(*args, **kwargs).numpy().sum())
            args[i].realize_cached_data().flat[j] += eps
            numerical[i].flat[j] = (f1 - f2) / (2 * eps)
    out = f(*args, **kwargs)
    grads = out.op.gradient_as_tuple(ndl.Tensor(np.ones(out.shape)), out)
    error = sum(np.linalg.norm(grads[i].numpy() - numerical[i]) for i in range(len(args)))
    assert error < tol, error
    return error


@pytest.mark.parametrize(
    "name,f,shapes",
    [
        ("divide", ndl.divide, [(5, 4), (5, 4)]),
        ("matmul", ndl.matmul, [(5, 4), (4, 3)]),
        ("summation", lambda a: ndl.summation(a, axes=(1,)), [(5, 4)]),
        ("broadcast_to", lambda a: ndl.broadcast_to(a, (3, 5, 4)), [(5, 1)]),
        ("transpose", lambda a: ndl.transpose(a, axes=(0, 1)), [(3, 5, 4)]),
        ("log", ndl.log, [(5, 4)]),
        ("exp", ndl.exp, [(5, 4)]),
        ("power_scalar", lambda a: ndl.power_scalar(a, 3), [(5, 4)]),
    ],
)
def test_course_hw1_float64_gradient_checks_pass(name, f, shapes):
    """hw1's tests hand float64 NumPy arrays to Tensor and check gradients to 1e-6, which
    float32 data cannot meet (its central differences are off by ~1e-3): NumPy float64 data
    keeps float64, and these ops compute in it."""
    rng = np.random.default_rng(8)
    args = [ndl.Tensor(rng.random(shape) + 1.0) for shape in shapes]
    assert all(a.dtype == "float64" for a in args)
    _hw1_gradient_check(f, *args)
    # The same check on float32 data fails: the reason the dtype is kept.
    narrow = [ndl.Tensor(a.numpy(), dtype="float32") for a in args]
    with pytest.raises(AssertionError):
        _hw1_gradient_check(f, *narrow)
