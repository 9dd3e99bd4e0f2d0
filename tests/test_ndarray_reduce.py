"""NDArray reductions (sum, max, min, ...) checked against NumPy: every axis option with
and without keepdims on every shape and view, the conventions for empty axes and empty
arrays, and the accuracy of large sums."""

import itertools

import numpy as np
import pytest

from needle import backend_ndarray as nd

from devices import DEVICES
from ndarray_check import SHAPE_IDS, SHAPES, check_result, make_views, rand_data

# --------------------------------------------------------------------------
# reductions
# --------------------------------------------------------------------------


def _axis_options(ndim):
    opts = [None]
    for i in range(ndim):
        opts.append(i)
    if ndim:
        opts.append(-1)
        opts.append(-ndim)
    for r in range(2, ndim + 1):
        for c in itertools.combinations(range(ndim), r):
            opts.append(c)
    if ndim >= 2:
        opts.append([ndim - 1, 0])  # a list, unordered
        opts.append((-1, 0))
    return opts


def _expected_reduction(npfn, x, axis, keepdims):
    """Reference with the course convention for axis=None.

    Returns (ok, value): ok False means NumPy refuses (empty extent)."""
    x64 = x.astype(np.float64)
    ax = tuple(axis) if isinstance(axis, list) else axis
    try:
        if ax is None:
            r = npfn(x64, axis=None, keepdims=keepdims)
            r = np.asarray(r)
            if not keepdims:
                r = r.reshape((1,))
            else:
                r = r.reshape((1,) * x.ndim)
        else:
            r = np.asarray(npfn(x64, axis=ax, keepdims=keepdims))
    except ValueError:
        return False, None
    return True, r


REDUCTIONS = {
    "sum": (lambda a, **kw: a.sum(**kw), np.sum),
    "max": (lambda a, **kw: a.max(**kw), np.max),
    "min": (lambda a, **kw: a.min(**kw), np.min),
    "nd.sum": (lambda a, **kw: nd.sum(a, **kw), np.sum),
    "nd.max": (lambda a, **kw: nd.max(a, **kw), np.max),
}


@pytest.mark.parametrize("op", list(REDUCTIONS))
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_reductions(op, shape, device):
    f_nd, f_np = REDUCTIONS[op]
    rng = np.random.default_rng(61)
    x = rand_data(rng, shape, "any")
    views = make_views(x, device)
    if op.startswith("nd."):
        views = views[:3]
    for kind, npv, ndv in views:
        for axis in _axis_options(len(shape)):
            for keepdims in (False, True):
                msg = f"{op} {kind} {shape} axis={axis} keepdims={keepdims}"
                ok, exp = _expected_reduction(f_np, npv, axis, keepdims)
                if not ok:
                    with pytest.raises(ValueError):
                        f_nd(ndv, axis=axis, keepdims=keepdims)
                    continue
                res = f_nd(ndv, axis=axis, keepdims=keepdims)
                assert res.shape == exp.shape, f"{msg}: {res.shape} vs {exp.shape}"
                assert res.is_compact(), msg
                if op.endswith("sum"):
                    n = max(1, npv.size // max(1, exp.size))
                    check_result(res, exp, device, msg, rtol=1e-4, atol=1e-5 * n)
                else:
                    check_result(res, exp, device, msg, exact=True)


@pytest.mark.parametrize("device", DEVICES)
def test_reduction_defaults_and_conventions(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7
    a = nd.array(x, device=device)
    r = a.sum()
    assert r.shape == (1,)
    np.testing.assert_allclose(r.numpy(), [x.sum()], rtol=1e-6)
    r = a.sum(keepdims=True)
    assert r.shape == (1, 1, 1)
    r = a.max()
    assert r.shape == (1,) and r.numpy()[0] == x.max()
    r = a.min(axis=None, keepdims=True)
    assert r.shape == (1, 1, 1) and r.numpy().ravel()[0] == x.min()
    assert a.sum(axis=1).shape == (2, 4)
    assert a.sum(axis=(0, 1, 2)).shape == ()
    assert a.max(axis=(0, 2), keepdims=True).shape == (1, 3, 1)
    assert nd.sum(a).shape == (1,)
    assert nd.max(a, axis=-1).shape == (2, 3)
    np.testing.assert_array_equal(nd.max(a, axis=-1).numpy(), x.max(axis=-1))
    s = nd.array(4.0, device=device)
    assert s.sum().shape == (1,)
    assert s.sum(keepdims=True).shape == ()
    assert float(s.max().numpy()[0]) == 4.0


@pytest.mark.parametrize("device", DEVICES)
def test_reduction_empty_axis_tuple(device):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = nd.array(x, device=device)
    r = a.sum(axis=())
    assert r.shape == (2, 3)
    np.testing.assert_array_equal(r.numpy(), x)
    r = a.max(axis=(), keepdims=True)
    assert r.shape == (2, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_sum_of_empty_is_zero(device):
    z = nd.array(np.zeros((3, 0, 2), np.float32), device=device)
    r = z.sum(axis=1)
    check_result(r, np.zeros((3, 2)), device, exact=True)
    r = z.sum()
    check_result(r, np.zeros((1,)), device, exact=True)
    r = nd.array(np.zeros((0,), np.float32), device=device).sum(axis=0)
    check_result(r, np.zeros(()), device, exact=True)


@pytest.mark.parametrize("device", DEVICES)
def test_sum_large_and_accuracy(device):
    rng = np.random.default_rng(62)
    x = rand_data(rng, (300, 257))
    a = nd.array(x, device=device)
    x64 = x.astype(np.float64)
    check_result(a.sum(), [x64.sum()], device, rtol=1e-4, atol=1e-5 * x.size)
    check_result(a.sum(axis=0), x64.sum(axis=0), device, rtol=1e-4, atol=1e-5 * 300)
    check_result(a.permute((1, 0)).sum(axis=1), x64.sum(axis=0), device, rtol=1e-4, atol=3e-3)
    check_result(a.max(axis=1), x.max(axis=1), device, exact=True)
    check_result(a[::-3, 5:].min(axis=0), x[::-3, 5:].min(axis=0), device, exact=True)
