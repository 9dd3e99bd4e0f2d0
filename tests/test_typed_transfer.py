"""The one transfer pair of the backends (to_host / from_host of a strided view of any dtype):
host copies of permuted, flipped, sliced and broadcast views, and setitem of host arrays
into strided views, for every dtype on every device, bit for bit against NumPy (bfloat16
through its bits, NumPy having no such type). Large strided views take the device-side
compaction; small ones go through the touched range on the host: both paths are covered.
"""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES

DTYPES = ["float32", "float16", "bfloat16", "float64"]


def _values(shape, dtype, seed):
    """Values exactly representable in dtype (so conversions are exact), as float64."""
    rng = np.random.default_rng(seed)
    bound = 128 if dtype == "bfloat16" else 512  # within the significand: 8 or 11 bits
    x = rng.integers(-bound, bound, size=shape).astype(np.float64) / 8.0
    if dtype == "float64":
        x += 1e-9 * rng.integers(1, 1000, size=shape)  # bits float32 would drop
    return x


def _host(a):
    """a's values as float64 NumPy (bfloat16 widened by needle's own conversion)."""
    return a.astype("float64").numpy() if a.dtype == "bfloat16" else a.numpy().astype(np.float64)


def _np_dtype(dtype):
    return np.float64 if dtype == "bfloat16" else np.dtype(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 7), (512, 520)])  # CUDA: the touched range; both
def test_strided_views_to_host(device, dtype, shape):
    x = _values(shape, dtype, 1)
    a = nd.array(x, device=device, dtype=dtype)
    assert a.dtype == dtype
    for view, expected in [
        (a.permute((1, 0)), x.T),
        (a.flip((0,)), x[::-1]),
        (a[1:, ::2], x[1:, ::2]),
        (a[::-1, 1::3], x[::-1, 1::3]),
        (a[:1, :].broadcast_to((3, shape[1])), np.broadcast_to(x[:1, :], (3, shape[1]))),
    ]:
        got = _host(view)
        np.testing.assert_array_equal(got, expected)
    if dtype != "bfloat16":
        raw = a.permute((1, 0)).numpy()
        assert raw.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(raw, x.T.astype(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 8), (96, 320)])
def test_host_arrays_into_strided_views(device, dtype, shape):
    x = _values(shape, dtype, 2)
    a = nd.array(x, device=device, dtype=dtype)
    expected = x.copy()
    rows, cols = shape
    patch = _values((rows // 2, cols // 2), dtype, 3)
    a[::2, 1::2] = patch.astype(_np_dtype(dtype))
    expected[::2, 1::2] = patch
    column = _values((rows,), dtype, 4)
    a[::-1, 0] = column.astype(_np_dtype(dtype)).reshape(rows, 1)  # the course keeps the dim
    expected[::-1, 0] = column
    np.testing.assert_array_equal(_host(a), expected)
    # The elements between the view's are left as they were (the touched-range path writes
    # them back).
    np.testing.assert_array_equal(_host(a[1::2, ::2]), expected[1::2, ::2])


@pytest.mark.parametrize("device", DEVICES)
def test_float64_keeps_its_bits_through_a_strided_transfer(device):
    x = np.array([[1.0 + 2.0**-40, 0.1], [1e300, -0.0]], dtype=np.float64)
    a = nd.array(x, device=device, dtype="float64")
    got = a.permute((1, 0)).numpy()
    assert got.dtype == np.float64
    assert got.tobytes() == np.ascontiguousarray(x.T).tobytes()


def test_tensor_numpy_of_narrow_strided_views():
    x = _values((4, 6), "float16", 5)
    t = ndl.Tensor(x.astype(np.float16), dtype="float16")
    got = t.transpose().numpy()
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, x.T.astype(np.float16))
