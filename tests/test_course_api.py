"""Course code that must run unchanged: NDArray subclassed from Python with the course's
``process_slice``, ``NDArray.astype``, the course's ``is_compact``/``compact`` strides, scalar
ops given NumPy scalars and one-element arrays, and Tensor operators next to NumPy arrays
(NumPy defers to Tensor; a Tensor, or a clear TypeError, never an object array)."""

import gc
import weakref

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES

# --------------------------------------------------------------------------
# NDArray subclasses and process_slice
# --------------------------------------------------------------------------


class _ShapeAndSlices(nd.NDArray):
    """The course's test helper: indexing returns the shape and the processed slices."""

    def __getitem__(self, idxs):
        idxs = tuple(
            self.process_slice(s, i) if isinstance(s, slice) else slice(s, s + 1, 1)
            for i, s in enumerate(idxs)
        )
        return self.shape, idxs


def ShapeAndSlices(*shape):
    return _ShapeAndSlices(np.ones(shape))


def _course_slice(sl, n):
    """The course's process_slice for the slices it accepts (no negative start)."""
    start = 0 if sl.start is None else sl.start
    stop = n if sl.stop is None else sl.stop
    if stop < 0:
        stop = n + stop
    return slice(start, stop, 1 if sl.step is None else sl.step)


def test_subclass_process_slice_matches_course():
    x = ShapeAndSlices(4, 5, 6)
    assert type(x) is _ShapeAndSlices and isinstance(x, nd.NDArray)
    cases = [
        (1, 2, 3),
        (slice(1, 2), slice(None), slice(3, None)),
        (slice(None, None, 2), slice(1, -1), slice(0, 6, 3)),
        (slice(None, -2), 0, slice(2, 5, 2)),
    ]
    for idx in cases:
        shape, slices = x[idx]
        assert shape == (4, 5, 6)
        expected = tuple(
            _course_slice(s, n) if isinstance(s, slice) else slice(s, s + 1, 1)
            for s, n in zip(idx, (4, 5, 6))
        )
        assert slices == expected


def test_process_slice_negative_start_counts_from_the_end():
    x = nd.array(np.zeros((4, 5)))
    assert x.process_slice(slice(-3, None), 1) == slice(2, 5, 1)
    assert x.process_slice(slice(None), 0) == slice(0, 4, 1)
    for bad in (slice(3, 1), slice(0, 4, -1)):
        with pytest.raises(ValueError):
            x.process_slice(bad, 0)
    with pytest.raises(IndexError):
        x.process_slice(slice(None), 2)
    with pytest.raises(TypeError):
        x.process_slice(3, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_subclass_instances_work_as_ndarrays(device):
    class Tagged(nd.NDArray):
        pass

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tagged(x, device=device)
    assert type(t) is Tagged and t.device == device
    t.note = "a Python attribute"
    np.testing.assert_array_equal(t.numpy(), x)
    np.testing.assert_array_equal((t + 1).numpy(), x + 1)
    np.testing.assert_array_equal((2 * t - t).numpy(), x)
    np.testing.assert_array_equal((t @ t.permute((1, 0))).numpy(), x @ x.T)
    np.testing.assert_allclose(t.sum(axis=1).numpy(), x.sum(axis=1))
    np.testing.assert_array_equal(t[1, 1:].numpy(), x[1:2, 1:])
    np.testing.assert_array_equal(np.asarray(t.to(ndl.cpu())), x)
    u = nd.array(np.zeros((2, 3)), device=device)
    u[:, :] = t
    np.testing.assert_array_equal(u.numpy(), x)
    tensor = ndl.Tensor(t, device=device)
    np.testing.assert_array_equal(tensor.numpy(), x)
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is None


# --------------------------------------------------------------------------
# astype
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_astype(device):
    x = (np.arange(12, dtype=np.float32) * 7.5).reshape(3, 4)
    a = nd.array(x, device=device)
    same = a.astype(np.float32)
    assert isinstance(same, nd.NDArray) and same is not a and same.device == device
    np.testing.assert_array_equal(same.numpy(), x)
    same[0, 0] = -1.0
    assert a.numpy()[0, 0] == x[0, 0]  # a copy
    assert isinstance(a.astype("float32"), nd.NDArray)
    for dtype in (np.uint8, np.int32, "int64", bool):
        got = a.astype(dtype)
        assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, x.astype(dtype))
    # What the course's tests do with it.
    t = ndl.Tensor(a, device=device)
    parts = np.array_split(t.cached_data.astype(np.uint8), 3)
    assert [p.shape for p in parts] == [(1, 4)] * 3
    np.testing.assert_array_equal(ndl.Tensor(parts[1]).numpy(), x[1:2].astype(np.uint8))
    with pytest.raises(TypeError):
        a.astype("not a dtype")


# --------------------------------------------------------------------------
# is_compact and compact: the course's rule
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_compact_strides_course_example(device):
    x = np.arange(12.0).reshape(1, 3, 2, 1, 2)
    a = nd.array(x, device=device).permute((1, 3, 2, 0, 4))
    assert not a.is_compact()
    c = a.compact()
    assert c.is_compact() and c.strides == (4, 4, 2, 2, 1)
    np.testing.assert_array_equal(c.numpy(), x.transpose(1, 3, 2, 0, 4))


# --------------------------------------------------------------------------
# scalars from NumPy
# --------------------------------------------------------------------------

SCALARS = [
    pytest.param(2.5, id="float"),
    pytest.param(3, id="int"),
    pytest.param(np.float32(1.5), id="np.float32"),
    pytest.param(np.float64(-0.75), id="np.float64"),
    pytest.param(np.int64(2), id="np.int64"),
    pytest.param(np.array(1.25), id="0-d"),
    pytest.param(np.array([0.5]), id="size-1"),
    pytest.param(np.full((1, 1), 2.0), id="size-1 2-D"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s", SCALARS)
def test_scalar_ops_take_numpy_scalars(device, s):
    rng = np.random.default_rng(3)
    x = rng.random((2, 3)) + 0.5
    t = ndl.Tensor(x, device=device)
    v = float(np.asarray(s).reshape(-1)[0])
    cases = [
        (ndl.add_scalar(t, s), x + v),
        (ndl.mul_scalar(t, s), x * v),
        (ndl.divide_scalar(t, s), x / v),
        (ndl.power_scalar(t, s), x**v),
        (t + s, x + v),
        (s + t, v + x),
        (t - s, x - v),
        (s - t, v - x),
        (t * s, x * v),
        (s * t, v * x),
        (t / s, x / v),
        (s / t, v / x),
        (t**s, x**v),
    ]
    for got, want in cases:
        assert isinstance(got, ndl.Tensor), type(got)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
    assert ndl.DivScalar(s).scalar == pytest.approx(v)


def test_scalar_ops_course_call():
    np.random.seed(0)
    x = ndl.Tensor(np.random.randn(5, 4))
    s = np.random.randn(1)
    np.testing.assert_allclose(
        ndl.divide_scalar(x, s).numpy(), x.numpy() / s[0].astype(np.float32), rtol=1e-5
    )


@pytest.mark.parametrize("bad", [np.ones(3), np.ones((2, 2)), "2", None, 1j, np.array([1j])])
def test_scalar_ops_refuse_non_scalars(bad):
    t = ndl.Tensor(np.ones(3))
    with pytest.raises(TypeError):
        ndl.mul_scalar(t, bad)


# --------------------------------------------------------------------------
# Tensor with NumPy arrays in operators
# --------------------------------------------------------------------------

OPERATORS = [
    pytest.param(lambda a, b: a + b, id="add"),
    pytest.param(lambda a, b: a - b, id="sub"),
    pytest.param(lambda a, b: a * b, id="mul"),
    pytest.param(lambda a, b: a / b, id="div"),
    pytest.param(lambda a, b: a**b, id="pow"),
]


@pytest.mark.parametrize("op", OPERATORS)
def test_tensor_and_numpy_array_never_make_object_arrays(op):
    t = ndl.Tensor([1.0, 2.0, 3.0])
    arr = np.array([2.0, 3.0, 4.0])
    for a, b in ((t, arr), (arr, t)):
        with pytest.raises(TypeError, match="ndl.Tensor"):
            op(a, b)
    # One-element arrays are scalars, in both orders, and give Tensors.
    one = np.array([2.0])
    for a, b, want in ((t, one, op(t.numpy(), 2.0)), (one, t, op(2.0, t.numpy()))):
        got = op(a, b)
        assert isinstance(got, ndl.Tensor)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)


def test_numpy_defers_to_tensor():
    assert ndl.Tensor.__array_ufunc__ is None
    t = ndl.Tensor([1.0, 2.0])
    got = np.float64(3.0) * t
    assert isinstance(got, ndl.Tensor)
    np.testing.assert_allclose(got.numpy(), [3.0, 6.0])
    with pytest.raises(TypeError):
        np.multiply(np.ones(2), t)
