"""The course's raw handles (hw3 code below NDArray): ``a._handle`` with ``ptr()`` and
``size``, ``NDArray.make``, ``Device.__tile_size__`` and ``Device.matmul_tiled``; checked
against NumPy, on every device, with bad input."""

import gc

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import dev


def tiles(matrix, t):
    """A (rows, cols) matrix in the course's (rows/t, cols/t, t, t) tiling."""
    rows, cols = matrix.shape
    return matrix.reshape(rows // t, t, cols // t, t).transpose(0, 2, 1, 3).copy()


def untile(tiled):
    a, b, t, _ = tiled.shape
    return tiled.transpose(0, 2, 1, 3).reshape(a * t, b * t)


@dev
def test_views_share_the_handle_and_copies_do_not(device):
    a = nd.array(np.arange(24, dtype=np.float32).reshape(4, 6), device=device)
    h = a._handle
    assert h.size == 24
    assert isinstance(h.ptr(), int) and h.ptr() != 0
    for view in (a[1:3, ::2], a.permute((1, 0)), a.reshape((6, 4)), a.broadcast_to((2, 4, 6))):
        assert view._handle.ptr() == h.ptr()
        assert view._handle.size == 24
    assert (a + 1)._handle.ptr() != h.ptr()
    assert a[1:3, ::2].compact()._handle.size == 6


@dev
def test_setitem_keeps_the_handle(device):
    a = nd.array(np.zeros((4, 5), dtype=np.float32), device=device)
    before = a._handle.ptr()
    a[1:3, 2] = 7.0
    a[0, :] = nd.array(np.ones((1, 5), dtype=np.float32), device=device)
    assert a._handle.ptr() == before
    expected = np.zeros((4, 5), dtype=np.float32)
    expected[1:3, 2] = 7.0
    expected[0, :] = 1.0
    np.testing.assert_array_equal(a.numpy(), expected)


@dev
def test_a_handle_keeps_its_storage(device):
    a = nd.array(np.arange(6, dtype=np.float32), device=device)
    h = a._handle
    ptr = h.ptr()
    del a
    gc.collect()
    view = nd.NDArray.make((2, 3), device=device, handle=h)
    assert view._handle.ptr() == ptr
    np.testing.assert_array_equal(view.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))


@dev
def test_make(device):
    fresh = nd.NDArray.make((2, 3, 4), device=device)
    assert fresh.shape == (2, 3, 4) and fresh.strides == (12, 4, 1) and fresh._offset == 0
    assert fresh._handle.size == 24 and fresh.device == device
    base = nd.array(np.arange(12, dtype=np.float32), device=device)
    view = nd.NDArray.make((3, 2), strides=(1, 3), device=device, handle=base._handle, offset=2)
    np.testing.assert_array_equal(view.numpy(), np.array([[2, 5], [3, 6], [4, 7]], np.float32))
    view[0, 0] = -1.0  # a view: the base sees it
    assert base.numpy()[2] == -1.0
    empty = nd.NDArray.make((0, 5), device=device)
    assert empty.shape == (0, 5) and empty._handle.size == 0


@dev
@pytest.mark.parametrize("m,n,p", [(1, 1, 1), (2, 2, 3), (1, 2, 1), (3, 3, 3), (2, 1, 4)])
def test_matmul_tiled_matches_numpy(device, m, n, p):
    t = device.__tile_size__
    assert t == nd.cpu().__tile_size__ == 8
    rng = np.random.default_rng(m * 100 + n * 10 + p)
    a = rng.standard_normal((m * t, n * t)).astype(np.float32)
    b = rng.standard_normal((n * t, p * t)).astype(np.float32)
    A = nd.array(tiles(a, t), device=device)
    B = nd.array(tiles(b, t), device=device)
    C = nd.NDArray.make((m, p, t, t), device=device)
    before = C._handle.ptr()
    device.matmul_tiled(A._handle, B._handle, C._handle, m * t, n * t, p * t)
    assert C._handle.ptr() == before
    np.testing.assert_allclose(untile(C.numpy()), a @ b, rtol=1e-5, atol=1e-5)


@dev
def test_matmul_tiled_bad_input_raises_and_leaves_out_unchanged(device):
    t = device.__tile_size__
    A = nd.array(np.ones((1, 1, t, t), dtype=np.float32), device=device)
    C = nd.array(np.full((1, 1, t, t), 3.0, dtype=np.float32), device=device)
    h = A._handle
    with pytest.raises(TypeError, match="6 arguments"):
        device.matmul_tiled(h, h, C._handle, t, t)
    with pytest.raises(TypeError, match="b must be an array handle"):
        device.matmul_tiled(h, A, C._handle, t, t, t)
    with pytest.raises(TypeError, match="n must be an int"):
        device.matmul_tiled(h, h, C._handle, t, 8.0, t)
    for bad in (t + 1, -t, 2**70):
        with pytest.raises(ValueError, match="multiple of the tile size"):
            device.matmul_tiled(h, h, C._handle, bad, t, t)
    with pytest.raises(ValueError, match="smaller than"):
        device.matmul_tiled(h, h, C._handle, 2 * t, t, t)
    other = ndl.cpu_numpy() if device == ndl.cpu() else ndl.cpu()
    with pytest.raises(ndl.DeviceError, match="not on this device"):
        other.matmul_tiled(h, h, C._handle, t, t, t)
    np.testing.assert_array_equal(C.numpy(), np.full((1, 1, t, t), 3.0, dtype=np.float32))
    device.matmul_tiled(h, h, C._handle, t, t, t)
    np.testing.assert_array_equal(C.numpy(), np.full((1, 1, t, t), t, dtype=np.float32))


@dev
def test_make_bad_input(device):
    base = nd.array(np.arange(6, dtype=np.float32), device=device)
    with pytest.raises(ValueError, match="outside the storage"):
        nd.NDArray.make((7,), device=device, handle=base._handle)
    with pytest.raises(ValueError, match="outside the storage"):
        nd.NDArray.make((2,), device=device, handle=base._handle, offset=5)
    with pytest.raises(ValueError, match="outside the storage"):
        nd.NDArray.make((2, 3), strides=(2**62, 1), device=device, handle=base._handle)
    with pytest.raises(ValueError, match="2 strides for a shape of 1"):
        nd.NDArray.make((3,), strides=(1, 1), device=device, handle=base._handle)
    with pytest.raises(ValueError, match="offset must be >= 0"):
        nd.NDArray.make((3,), device=device, handle=base._handle, offset=-1)
    with pytest.raises(TypeError, match="handle must be an array handle"):
        nd.NDArray.make((3,), device=device, handle=base)
    with pytest.raises(ValueError):
        nd.NDArray.make((-1, 2), device=device)
    other = ndl.cpu_numpy() if device == ndl.cpu() else ndl.cpu()
    with pytest.raises(ndl.DeviceError, match="the handle's storage is on"):
        nd.NDArray.make((3,), device=other, handle=base._handle)
    with pytest.raises(TypeError):
        type(base._handle)()
    np.testing.assert_array_equal(base.numpy(), np.arange(6, dtype=np.float32))
