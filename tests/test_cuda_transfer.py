"""Moving data on and off the GPU and within it: arrays of every shape (0-d, empty, 5-d) to the
GPU and back, compacting permuted and flipped views; setitem of scalars, host arrays and
NDArrays (broadcast, non-compact, overlapping) and fill, against the CPU; host copies of strided
views through both transfer paths, device-to-device moves, and the DeviceError of mixing
devices. Marked ``cuda``: they need a GPU or the simulator (tests/cuda_sim.sh).
"""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from cuda_check import (  # noqa: F401  (no_limits_left: an autouse fixture)
    CUDA,
    cuda_test,
    no_limits_left,
    random_f32,
)


@cuda_test
@pytest.mark.parametrize(
    "shape", [(), (0,), (1,), (7,), (3, 0, 2), (2, 3, 4), (2, 1, 3, 5), (2, 3, 1, 2, 3)]
)
def test_shapes_round_trip_and_compact(shape):
    x = random_f32(shape, 5)
    g = nd.array(x, device=CUDA)
    assert g.device == CUDA and g.shape == shape
    np.testing.assert_array_equal(g.numpy(), x)
    if len(shape) >= 2:
        axes = tuple(reversed(range(len(shape))))
        np.testing.assert_array_equal(g.permute(axes).compact().numpy(), x.transpose(axes))
        np.testing.assert_array_equal(g.permute(axes).numpy(), x.transpose(axes))
        np.testing.assert_array_equal(g.flip((0,)).numpy(), np.flip(x, 0))


@cuda_test
def test_copies_fill_and_setitem_match_cpu():
    base = random_f32((8, 12), 6)
    c, g = nd.array(base, device=ndl.cpu()), nd.array(base, device=CUDA)
    for key, value in [
        ((slice(1, 3), slice(None, None, 2)), 5.0),
        ((0,), -0.0),
        ((slice(None, None, -1), 1), 7.5),
        ((slice(2, 6), slice(3, 5)), np.arange(8, dtype=np.float32).reshape(4, 2)),
        ((Ellipsis,), 0.0),
    ]:
        c[key] = value
        g[key] = value
        np.testing.assert_array_equal(g.numpy(), c.numpy(), err_msg=str(key))
    # NDArray values: broadcast, non-compact sources and targets, overlapping self-assignment
    c[...] = nd.array(base, device=ndl.cpu())
    g[...] = nd.array(base, device=CUDA)
    c[1:4, 2:4] = nd.array([[1.0], [2.0], [3.0]], device=ndl.cpu())
    g[1:4, 2:4] = nd.array([[1.0], [2.0], [3.0]], device=CUDA)
    c[::-2, 1:12:2] = c[:4, :6].permute((1, 0))[:, :4].permute((1, 0))
    g[::-2, 1:12:2] = g[:4, :6].permute((1, 0))[:, :4].permute((1, 0))
    c[1:, :] = c[:-1, :]
    g[1:, :] = g[:-1, :]
    np.testing.assert_array_equal(g.numpy(), c.numpy())
    t = g.permute((1, 0))[::2]
    t[...] = nd.array(np.ones((6, 8), np.float32), device=CUDA)[:, ::-1]
    tc = c.permute((1, 0))[::2]
    tc[...] = nd.array(np.ones((6, 8), np.float32), device=ndl.cpu())[:, ::-1]
    np.testing.assert_array_equal(g.numpy(), c.numpy())
    # fills
    for value in (0.0, -0.0, 3.25, float("inf")):
        g2, c2 = CUDA.full((5, 7), value), ndl.cpu().full((5, 7), value)
        np.testing.assert_array_equal(g2.numpy(), c2.numpy())
        assert np.signbit(g2.numpy()).all() == np.signbit(c2.numpy()).all()
        g2[1:4:2, ::3].fill(value + 1)
        c2[1:4:2, ::3].fill(value + 1)
        np.testing.assert_array_equal(g2.numpy(), c2.numpy())


@cuda_test
def test_to_and_from_numpy_and_devices():
    x = random_f32((64, 48), 7)
    g = nd.array(x, device=CUDA)
    # strided views to host, through both transfer paths (a small and a sparse view)
    np.testing.assert_array_equal(g[::3, 5:40:7].numpy(), x[::3, 5:40:7])
    big = random_f32((1024, 512), 8)
    gb = nd.array(big, device=CUDA)
    np.testing.assert_array_equal(gb[::64, ::128].numpy(), big[::64, ::128])
    np.testing.assert_array_equal(gb.permute((1, 0)).numpy(), big.T)
    # device to device moves
    c = g.to(ndl.cpu())
    assert c.device == ndl.cpu()
    np.testing.assert_array_equal(c.numpy(), x)
    back = c[::2].to(CUDA)
    assert back.device == CUDA
    np.testing.assert_array_equal(back.numpy(), x[::2])
    np.testing.assert_array_equal(nd.array(g.permute((1, 0)), device=ndl.cpu_numpy()).numpy(), x.T)
    # writing host values into strided GPU views
    g[::2, ::-3] = x[::2, ::-3] * 2
    expect = x.copy()
    expect[::2, ::-3] = x[::2, ::-3] * 2
    np.testing.assert_array_equal(g.numpy(), expect)
    assert np.asarray(g).shape == (64, 48)


@cuda_test
def test_mixing_devices_raises():
    g = nd.array(np.ones(3, np.float32), device=CUDA)
    c = nd.array(np.ones(3, np.float32), device=ndl.cpu())
    with pytest.raises(ndl.DeviceError):
        g + c
    with pytest.raises(ndl.DeviceError):
        g.reshape((3, 1)) @ c.reshape((1, 3))
    np.testing.assert_array_equal((g + 1).numpy(), [2, 2, 2])
