"""NDArray views checked against NumPy: shapes, strides and compactness of every kind
of view (offset, stepped, negative-step, flipped, permuted, broadcast), and the view
ops reshape, permute, broadcast_to and flip."""

import itertools

import numpy as np
import pytest

from needle import backend_ndarray as nd

from devices import DEVICES
from ndarray_check import (
    SHAPE_IDS,
    SHAPES,
    _base_and_view,
    check_result,
    check_strides_meaningful,
    make_views,
    np_strides,
    rand_data,
    row_major_strides,
    shape_id,
)

# --------------------------------------------------------------------------
# views: shapes, strides, compactness
# --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_views_match_numpy(shape, device):
    rng = np.random.default_rng(1)
    x = rand_data(rng, shape)
    for kind, npv, ndv in make_views(x, device):
        msg = f"view {kind} of shape {shape}"
        assert isinstance(ndv, nd.NDArray), msg
        assert ndv.shape == npv.shape, msg
        assert ndv.size == npv.size, msg
        assert ndv.ndim == npv.ndim, msg
        assert ndv.dtype == "float32", msg
        assert ndv.device == device, msg
        np.testing.assert_array_equal(ndv.numpy(), npv, err_msg=msg)
        check_strides_meaningful(ndv, npv, msg)
        # The course's rule: exactly the row-major strides, size-1 dims included (NumPy's
        # c_contiguous ignores those); such a view is C-contiguous in NumPy too.
        expected = tuple(ndv.strides) == row_major_strides(ndv.shape)
        assert ndv.is_compact() == expected, (
            f"{msg}: is_compact {ndv.is_compact()} (strides {ndv.strides})"
        )
        assert not expected or npv.flags.c_contiguous, msg


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_compact(shape, device):
    rng = np.random.default_rng(2)
    x = rand_data(rng, shape)
    for kind, npv, ndv in make_views(x, device):
        msg = f"view {kind} of shape {shape}"
        c = ndv.compact()
        if ndv.is_compact():
            assert c is ndv, msg
        else:
            assert c is not ndv, msg
            assert c.is_compact(), msg
        assert c.shape == npv.shape, msg
        assert c.device == device, msg
        np.testing.assert_array_equal(c.numpy(), npv, err_msg=msg)
        check_strides_meaningful(c, np.array(npv, order="C", copy=True), msg + " compact strides")
        assert tuple(c.strides) == row_major_strides(c.shape), msg


@pytest.mark.parametrize("device", DEVICES)
def test_strides_exact(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = nd.array(x, device=device)
    assert a.strides == (12, 4, 1)
    assert a.permute((2, 0, 1)).strides == (1, 12, 4)
    assert a.permute((2, 0, 1)).shape == (4, 2, 3)
    assert a[:, ::2, 1:].strides == (12, 8, 1)
    assert a[:, ::-1, :].strides == (12, -4, 1)
    assert a[::-1, :, ::-3].strides == (-12, 4, -3)
    assert a.flip(0).strides == (-12, 4, 1)
    assert a.flip((0, 2)).strides == (-12, 4, -1)
    b = nd.array(np.arange(4, dtype=np.float32), device=device)
    assert b.broadcast_to((3, 4)).strides == (0, 1)
    assert b.broadcast_to((2, 3, 4)).strides == (0, 0, 1)
    c = nd.array(np.arange(3, dtype=np.float32).reshape(3, 1), device=device)
    assert c.broadcast_to((3, 5)).strides == (1, 0)
    assert a.reshape((6, 4)).strides == (4, 1)
    for v, npv in [
        (a.permute((2, 0, 1)), x.transpose(2, 0, 1)),
        (a[:, ::2, 1:], x[:, ::2, 1:]),
        (a[::-1, :, ::-3], x[::-1, :, ::-3]),
        (b.broadcast_to((3, 4)), np.broadcast_to(x.ravel()[:4], (3, 4))),
        (a.reshape((6, 4)), x.reshape(6, 4)),
    ]:
        assert tuple(v.strides) == np_strides(npv)


@pytest.mark.parametrize("device", DEVICES)
def test_is_compact_cases(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = nd.array(x, device=device)
    assert a.is_compact()
    assert not a.permute((1, 0, 2)).is_compact()
    assert a[1:2].is_compact()  # offset view, contiguous
    assert not a[:, 1:].is_compact()
    assert not a.flip(2).is_compact()
    assert not nd.array(np.ones(4), device=device).broadcast_to((3, 4)).is_compact()
    assert a.reshape((24,)).is_compact()


@pytest.mark.parametrize("device", DEVICES)
def test_is_compact_counts_size_one_dims(device):
    # The course's example: a permutation that moves only size-1 dims' strides.
    x = np.arange(12.0).reshape(1, 3, 2, 1, 2)
    a = nd.array(x, device=device).permute((1, 3, 2, 0, 4))
    assert not a.is_compact()
    c = a.compact()
    assert c is not a and c.is_compact()
    assert c.strides == row_major_strides(c.shape) == (4, 4, 2, 2, 1)
    np.testing.assert_array_equal(c.numpy(), x.transpose(1, 3, 2, 0, 4))
    assert c.compact() is c


# --------------------------------------------------------------------------
# view ops: reshape, permute, broadcast_to, flip, getitem, as_strided, flat
# --------------------------------------------------------------------------


RESHAPE_KINDS = [
    "contiguous",
    "transposed",
    "stepped",
    "offset_rows",
    "offset_cols",
    "flipped",
    "broadcast",
]
RESHAPE_TARGETS = [
    (12,),
    (4, 3),
    (2, 6),
    (2, 2, 3),
    (3, 2, 2),
    (3, 1, 4),
    (1, 3, 4),
    (3, 4, 1),
    (12, 1),
    (-1,),
    (3, -1),
    (-1, 2, 2),
    (3, 4),
]


@pytest.mark.parametrize("kind", RESHAPE_KINDS)
@pytest.mark.parametrize("device", DEVICES)
def test_reshape_view_or_copy(kind, device):
    for target in RESHAPE_TARGETS:
        npb, ndb, npv, ndv = _base_and_view(device, kind)
        msg = f"{kind} (3, 4) -> {target}"
        res = ndv.reshape(target)
        np_res = npv.reshape(target)
        assert res.shape == np_res.shape, msg
        np.testing.assert_array_equal(res.numpy(), np_res, err_msg=msg)
        is_view = np.shares_memory(np_res, npb)
        # write new values into the base storage; a view must see them
        new = np.arange(npb.size, dtype=np.float32).reshape(npb.shape) + 1000
        ndb[...] = new
        if is_view:
            npb[...] = new
            check_strides_meaningful(res, np_res, msg)
        np.testing.assert_array_equal(
            res.numpy(), np_res, err_msg=msg + (" (should be a view)" if is_view else " (copy)")
        )


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_forms(device):
    x = np.arange(24, dtype=np.float32)
    a = nd.array(x, device=device)
    check_result(a.reshape(2, 3, 4), x.reshape(2, 3, 4), device, exact=True)
    check_result(a.reshape((4, -1)), x.reshape(4, -1), device, exact=True)
    check_result(a.reshape(-1, 4), x.reshape(-1, 4), device, exact=True)
    check_result(nd.reshape(a, (6, 4)), x.reshape(6, 4), device, exact=True)
    check_result(
        a.reshape((1,) * 15 + (24,))[..., 3:5],
        x.reshape((1,) * 15 + (24,))[..., 3:5],
        device,
        exact=True,
    )
    z = nd.array(np.zeros((3, 0, 2), np.float32), device=device)
    assert z.reshape((0, 6)).shape == (0, 6)
    assert z.reshape((2, 0)).shape == (2, 0)
    s = nd.array(5.0, device=device)
    assert s.reshape((1, 1)).shape == (1, 1)
    assert s.reshape(()).shape == ()
    assert nd.array([5.0], device=device).reshape(()).shape == ()
    check_result(s.reshape((1,)), np.array([5.0]), device, exact=True)
    # flat
    v = a.reshape((4, 6)).permute((1, 0))
    f = v.flat
    check_result(f, x.reshape(4, 6).T.reshape(-1), device, exact=True)
    f2 = a.reshape((4, 6)).flat
    assert f2.shape == (24,)


@pytest.mark.parametrize("device", DEVICES)
def test_permute(device):
    rng = np.random.default_rng(11)
    x = rand_data(rng, (2, 3, 4, 5))
    for perm in itertools.permutations(range(4)):
        for kind, npv, ndv in make_views(x, device)[:4]:
            res = ndv.permute(perm)
            exp = np.transpose(npv, perm)
            msg = f"{kind} permute {perm}"
            assert res.shape == exp.shape, msg
            np.testing.assert_array_equal(res.numpy(), exp, err_msg=msg)
            check_strides_meaningful(res, exp, msg)
    a = nd.array(x, device=device)
    check_result(a.permute([3, 1, 0, 2]), np.transpose(x, (3, 1, 0, 2)), device, exact=True)
    s = nd.array(2.0, device=device)
    assert s.permute(()).shape == ()


BROADCAST_CASES = [
    ((4,), (3, 4)),
    ((1,), (5,)),
    ((3, 1), (3, 5)),
    ((1, 4), (2, 3, 4)),
    ((2, 1, 3), (2, 4, 3)),
    ((), (2, 3)),
    ((1,), (0,)),
    ((3, 1), (2, 3, 0)),
    ((2, 3), (2, 3)),
    ((1, 1), (1, 1)),
    ((0,), (4, 0)),
    ((1, 2, 1, 3, 1), (2, 2, 3, 3, 2)),
]


@pytest.mark.parametrize(
    "src,target", BROADCAST_CASES, ids=[f"{s}->{t}" for s, t in BROADCAST_CASES]
)
@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_to(src, target, device):
    rng = np.random.default_rng(12)
    x = rand_data(rng, src)
    for kind, npv, ndv in make_views(x, device):
        msg = f"{kind} {src}->{target}"
        exp = np.broadcast_to(npv, target)
        res = ndv.broadcast_to(target)
        assert res.shape == tuple(target), msg
        np.testing.assert_array_equal(res.numpy(), exp, err_msg=msg)
        check_strides_meaningful(res, exp, msg)
        res2 = nd.broadcast_to(ndv, target)
        np.testing.assert_array_equal(res2.numpy(), exp, err_msg=msg)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (3, 0, 2)], ids=shape_id)
@pytest.mark.parametrize("device", DEVICES)
def test_flip(shape, device):
    rng = np.random.default_rng(13)
    x = rand_data(rng, shape)
    ndim = len(shape)
    axes_options = [
        tuple(c) for r in range(0, ndim + 1) for c in itertools.combinations(range(ndim), r)
    ]
    for kind, npv, ndv in make_views(x, device):
        for axes in axes_options:
            msg = f"{kind} flip {axes}"
            res = ndv.flip(axes)
            exp = np.flip(npv, axes)
            assert res.shape == exp.shape, msg
            np.testing.assert_array_equal(res.numpy(), exp, err_msg=msg)
            check_strides_meaningful(res, exp, msg)
            res2 = nd.flip(ndv, axes)
            np.testing.assert_array_equal(res2.numpy(), exp, err_msg=msg)
        for ax in range(ndim):
            np.testing.assert_array_equal(ndv.flip(ax).numpy(), np.flip(npv, ax))
        # flipping twice restores the original
        np.testing.assert_array_equal(
            ndv.flip(tuple(range(ndim))).flip(tuple(range(ndim))).numpy(), npv
        )


@pytest.mark.parametrize("device", DEVICES)
def test_flip_negative_axis(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = nd.array(x, device=device)
    check_result(a.flip(-1), np.flip(x, -1), device, exact=True)
    check_result(a.flip((-2, -1)), np.flip(x, (0, 1)), device, exact=True)
