"""Float32 sums stay near the float64 result whatever the layout: rows, columns (the reduced
axis outside the inner loop), middle axes, permuted and stepped views, several axes. Data sit
on an offset (100 + noise) so that rounding a running float sum once per row would show.

The tight bound is the CPU backend's (double accumulation); the CUDA reduction (float partials
per thread, then pairwise) is held to a looser one."""

import numpy as np
import pytest

from needle import backend_ndarray as nd

from devices import DEVICES

# (shape, axis, view) with view applied to both the NumPy and the needle array.
CASES = [
    pytest.param((6000, 33), 0, None, id="columns"),
    pytest.param((33, 6000), 1, None, id="rows"),
    pytest.param((7, 3000, 5), 1, None, id="middle"),
    pytest.param((3000, 4, 6), (0, 2), None, id="outer+inner"),
    pytest.param((40, 3000), None, None, id="all"),
    pytest.param((3000, 40), 1, "T", id="transposed-rows"),
    pytest.param((40, 3000), None, "T", id="transposed-all"),
    pytest.param((6000, 40), 0, "step", id="stepped-columns"),
    pytest.param((6000, 40), 0, "flip", id="flipped-columns"),
]


def _view(a, view):
    if view == "T":
        return a.permute((1, 0)) if isinstance(a, nd.NDArray) else a.T
    if view == "step":
        return a[::2, 1::3]
    if view == "flip":
        return a[::-1, ::-1]
    return a


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, axis, view", CASES)
def test_sum_error_near_float64(device, shape, axis, view):
    rng = np.random.default_rng(11)
    x = (100.0 + rng.random(shape)).astype(np.float32)
    xv = _view(x, view)
    got = _view(nd.array(x, device=device), view).sum(axis=axis).numpy()
    want = xv.astype(np.float64).sum(axis=axis)
    got = got.reshape(np.shape(want))
    rel = np.max(np.abs(got - want) / np.abs(want))
    # float32 rounding of the result alone is 6e-8; a float running sum over thousands of rows
    # is tens of times that.
    assert rel < (3e-7 if device.name == "cpu" else 1e-5), rel


@pytest.mark.parametrize("device", DEVICES)
def test_sum_keeps_nan_inf_and_empty(device):
    x = np.ones((300, 5), dtype=np.float32)
    x[7, 1], x[9, 2], x[10, 3], x[11, 3] = np.nan, np.inf, np.inf, -np.inf
    got = nd.array(x, device=device).sum(axis=0).numpy()
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, x.sum(axis=0))
    empty = nd.array(np.zeros((0, 4), dtype=np.float32), device=device)
    np.testing.assert_array_equal(empty.sum(axis=0).numpy(), np.zeros(4))
