"""Reductions over outer axes (a column sum of a row-major matrix, a middle axis of a 3-D
array): on CUDA these take the columns kernel (csrc/cuda/cuda_reduce.cu: lanes on
neighbouring outputs, 4 a lane with 16-byte loads where a's layout allows, rows of threads
along the reduced axis, the reduced extent split over blocks and reduced again when there are
few output tiles). Checked against NumPy on every device, at sizes where the plan changes
(under 32 outputs, one tile and a bit, few tiles with a split, many tiles in one pass), on
strided and negative-stride views, for sum, max and min, with NaN and infinities, and for the
accuracy of long sums. tests/test_reduce_paths.py covers each plan of both kernels.
"""

import numpy as np
import pytest

from needle import backend_ndarray as nd

from devices import DEVICES

# (shape, axis): the reduced axis outer in memory.
SHAPES = [
    pytest.param((17, 31), 0, id="31-outputs"),  # under one tile: the other kernels
    pytest.param((16, 33), 0, id="33-outputs-16-rows"),
    pytest.param((1000, 33), 0, id="33-outputs-split"),
    pytest.param((3000, 2048), 0, id="2048-outputs"),
    pytest.param((513, 5000), 0, id="5000-outputs"),
    pytest.param((40, 40000), 0, id="40000-outputs-one-pass"),
    pytest.param((6, 700, 50), 1, id="middle-axis"),
    pytest.param((300, 3, 70), (0, 1), id="two-outer-axes"),
    pytest.param((20, 30, 40), (0, 2), id="outer-and-inner"),
]


def _data(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.uniform(-2.0, 2.0, size=shape).astype(np.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("shape, axis", SHAPES)
def test_outer_reductions_match_numpy(device, op, shape, axis):
    x = _data(shape, 3)
    a = nd.array(x, device=device)
    for keepdims in (False, True):
        got = getattr(a, op)(axis=axis, keepdims=keepdims).numpy()
        want = getattr(x.astype(np.float64), op)(axis=axis, keepdims=keepdims)
        assert got.shape == want.shape
        if op == "sum":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-4)
        else:
            np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_outer_reductions_of_strided_views(device, op):
    x = _data((2000, 300), 5)
    a = nd.array(x, device=device)
    views = [
        (a[::2, ::3], x[::2, ::3]),
        (a[::-1, ::-1], x[::-1, ::-1]),
        (a[100:1900, 7:290], x[100:1900, 7:290]),
    ]
    for view, ref in views:
        got = getattr(view, op)(axis=0).numpy()
        want = getattr(ref.astype(np.float64), op)(axis=0)
        if op == "sum":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-4)
        else:
            np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_outer_max_min_propagate_nan_and_infinities(device):
    x = _data((3000, 64), 7)
    x[0, 1] = np.nan  # first slice
    x[2999, 2] = np.nan  # last row, last slice
    x[1500, 3] = np.inf
    x[10, 4] = -np.inf
    x[:, 5] = np.nan  # a whole column
    a = nd.array(x, device=device)
    np.testing.assert_array_equal(a.max(axis=0).numpy(), x.max(axis=0))
    np.testing.assert_array_equal(a.min(axis=0).numpy(), x.min(axis=0))
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float64).sum(axis=0)
    got = a.sum(axis=0).numpy()
    special = ~np.isfinite(want)  # the NaN and infinite columns come out exactly so
    assert special.sum() == 5
    np.testing.assert_array_equal(got[special], want[special].astype(np.float32))
    np.testing.assert_allclose(got[~special], want[~special], rtol=1e-5, atol=2e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(200_000, 64), (20_000, 4096)], ids=["long", "wide"])
def test_long_outer_sums_stay_near_float64(device, shape):
    """A float running sum down 200,000 rows of 100 + noise would be off by ~1e-4 relative;
    runs of 64 per thread, then pairwise, keep it near the float64 result."""
    rng = np.random.default_rng(13)
    x = (100.0 + rng.random(shape)).astype(np.float32)
    got = nd.array(x, device=device).sum(axis=0).numpy()
    want = x.astype(np.float64).sum(axis=0)
    rel = np.max(np.abs(got - want) / np.abs(want))
    assert rel < (3e-7 if device.name == "cpu" else 2e-6), rel
