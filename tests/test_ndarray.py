"""Correctness tests for needle's NDArray (the array layer), checked against NumPy.

Every op is exercised on contiguous operands and on many kinds of views
(offset, stepped, negative-step, flipped, transposed/permuted, broadcast,
combined), on many shapes including 0-size and 0-d ones.
"""
import itertools

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES

RTOL, ATOL = 1e-5, 1e-6

SHAPES = [
    (),
    (1,),
    (0,),
    (7,),
    (3, 4),
    (1, 5),
    (4, 1),
    (3, 0, 2),
    (2, 3, 4),
    (2, 1, 3, 5),
    (2, 3, 1, 2, 3),
]


def shape_id(shape):
    return "s" + ("x".join(str(s) for s in shape) if shape else "0d")


SHAPE_IDS = [shape_id(s) for s in SHAPES]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def rand_data(rng, shape, kind="any"):
    """float32 data of the given kind: any, pos, nonzero, int (small ints)."""
    if kind == "any":
        x = rng.uniform(-2.0, 2.0, size=shape)
    elif kind == "pos":
        x = rng.uniform(0.1, 3.0, size=shape)
    elif kind == "nonzero":
        x = rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    elif kind == "int":
        x = rng.integers(-2, 3, size=shape).astype(np.float64)
    else:  # pragma: no cover - test bug
        raise AssertionError(kind)
    return np.asarray(x, dtype=np.float32)


def _c(a):
    """A C-contiguous copy that keeps 0-d arrays 0-d (unlike ascontiguousarray)."""
    return np.array(a, dtype=np.float32, order="C", copy=True)


def _junk(rng, shape):
    # Values that cannot be confused with the data, should a view read them.
    return rng.uniform(500.0, 900.0, size=shape).astype(np.float32)


def make_views(x, device, seed=0):
    """Return a list of (kind, np_view, nd_view), every view of shape x.shape.

    Each view is built the same way on both sides: a base array is made in
    NumPy, converted with nd.array(base, device=device), and the same
    slicing / permute / flip / broadcast is applied to both. All views except
    the broadcast ones hold exactly the values of x.
    """
    x = np.asarray(x, dtype=np.float32)
    rng = np.random.default_rng(seed + 977)
    shape = x.shape
    ndim = x.ndim
    views = [("contiguous", x.copy(), nd.array(x, device=device))]

    if ndim == 0:
        base = _junk(rng, (3,))
        base[1] = x
        views.append(
            ("offset", base[1:2].reshape(()), nd.array(base, device=device)[1:2].reshape(()))
        )
        return views

    # offset view: a slice that does not start at 0 in any dimension
    base = _junk(rng, tuple(s + 2 for s in shape))
    sl = tuple(slice(1, 1 + s) for s in shape)
    base[sl] = x
    views.append(("offset", base[sl], nd.array(base, device=device)[sl]))

    # stepped slices (step 2, starting at 1) in every dimension
    base = _junk(rng, tuple(2 * s + 1 for s in shape))
    sl = tuple(slice(1, None, 2) for _ in shape)
    base[sl] = x
    views.append(("stepped", base[sl], nd.array(base, device=device)[sl]))

    # negative-step slices in every dimension
    base = _junk(rng, tuple(2 * s + 1 for s in shape))
    sl = tuple(slice(-2, None, -2) for _ in shape)
    base[sl] = x
    views.append(("negstep", base[sl], nd.array(base, device=device)[sl]))

    # flipped along every axis (tuple of axes)
    axes = tuple(range(ndim))
    base = _c(np.flip(x, axes))
    views.append(("flip_all", np.flip(base, axes), nd.array(base, device=device).flip(axes)))

    # flipped along the last axis only (int axis)
    base = _c(np.flip(x, ndim - 1))
    views.append(
        ("flip_last", np.flip(base, ndim - 1), nd.array(base, device=device).flip(ndim - 1))
    )

    if ndim >= 2:
        perm = tuple(reversed(range(ndim)))
        inv = tuple(int(i) for i in np.argsort(perm))
        base = _c(np.transpose(x, inv))
        views.append(
            ("transposed", np.transpose(base, perm), nd.array(base, device=device).permute(perm))
        )
    if ndim >= 3:
        perm = tuple(range(1, ndim)) + (0,)
        inv = tuple(int(i) for i in np.argsort(perm))
        base = _c(np.transpose(x, inv))
        views.append(
            ("permuted", np.transpose(base, perm), nd.array(base, device=device).permute(perm))
        )

    # broadcast along axis 0 (stride 0 on an existing size-1 dimension)
    src = _c(x[:1])
    views.append(
        (
            "broadcast_axis0",
            np.broadcast_to(src, shape),
            nd.array(src, device=device).broadcast_to(shape),
        )
    )
    # broadcast by adding a leading dimension
    src = _c(x[0]) if shape[0] > 0 else _junk(rng, shape[1:])
    views.append(
        (
            "broadcast_lead",
            np.broadcast_to(src, shape),
            nd.array(src, device=device).broadcast_to(shape),
        )
    )
    if ndim >= 2:
        src = _c(x[..., :1])
        views.append(
            (
                "broadcast_last",
                np.broadcast_to(src, shape),
                nd.array(src, device=device).broadcast_to(shape),
            )
        )

    # every other element of an inner axis, via a course-style int index
    # (keeps the dim as size 1) followed by a reshape of the strided view
    base = _junk(rng, shape + (2,))
    base[..., 1] = x
    views.append(
        ("inner_int", base[..., 1], nd.array(base, device=device)[..., 1].reshape(shape))
    )

    # combined: offset + stepped slices, then a reversing permute
    perm = tuple(reversed(range(ndim)))
    inv = tuple(int(i) for i in np.argsort(perm))
    xt = np.transpose(x, inv)
    base = _junk(rng, tuple(2 * s + 3 for s in xt.shape))
    sl = tuple(slice(2, 2 + 2 * s, 2) for s in xt.shape)
    base[sl] = xt
    views.append(
        (
            "combined",
            np.transpose(base[sl], perm),
            nd.array(base, device=device)[sl].permute(perm),
        )
    )
    return views


def view_pairs(va, vb):
    """Pairs of views to combine in binary ops: same kind on both sides, and
    each kind against a contiguous operand on the other side."""
    for i, a in enumerate(va):
        for j, b in enumerate(vb):
            if i == j or i == 0 or j == 0:
                yield a, b


def check_result(res, expected, device, msg="", rtol=RTOL, atol=ATOL, exact=False):
    assert isinstance(res, nd.NDArray), msg
    expected = np.asarray(expected)
    assert res.shape == expected.shape, f"{msg}: shape {res.shape} != {expected.shape}"
    assert res.device == device, msg
    got = res.numpy()
    assert got.dtype == np.float32, msg
    if exact:
        np.testing.assert_array_equal(got, expected.astype(np.float32), err_msg=msg)
    else:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=msg)


def np_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def check_strides_meaningful(ndv, npv, msg=""):
    """Strides must equal NumPy's (in elements) on every dim of extent > 1."""
    if npv.size == 0:
        return
    exp = np_strides(npv)
    got = tuple(ndv.strides)
    assert len(got) == len(exp), msg
    for d, n in enumerate(npv.shape):
        if n > 1:
            assert got[d] == exp[d], f"{msg}: strides {got} vs numpy {exp} (dim {d})"


def course_index_to_numpy(idx, shape):
    """Translate a course-semantics index (ints keep their dim) to NumPy."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if any(i is Ellipsis for i in idx):
        k = idx.index(Ellipsis)
        fill = len(shape) - (len(idx) - 1)
        idx = idx[:k] + (slice(None),) * fill + idx[k + 1:]
    out = []
    for i, n in zip(idx, shape):
        if isinstance(i, int):
            j = i + n if i < 0 else i
            out.append(slice(j, j + 1))
        else:
            out.append(i)
    return tuple(out)


# --------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------


def test_device_identity_and_names():
    assert str(nd.cpu()) == "cpu()" and repr(nd.cpu()) == "cpu()"
    assert str(nd.cuda()) == "cuda()" and repr(nd.cuda()) == "cuda()"
    assert str(nd.cpu_numpy()) == "cpu_numpy()" and repr(nd.cpu_numpy()) == "cpu_numpy()"
    assert nd.cpu().name == "cpu"
    assert nd.cuda().name == "cuda"
    assert nd.cpu_numpy().name == "cpu_numpy"
    assert nd.cpu() == nd.cpu()
    assert hash(nd.cpu()) == hash(nd.cpu())
    assert nd.cpu_numpy() == nd.cpu_numpy()
    assert hash(nd.cpu_numpy()) == hash(nd.cpu_numpy())
    assert nd.cpu() != nd.cpu_numpy()
    assert nd.cpu() != nd.cuda()
    assert nd.cuda() != nd.cpu_numpy()
    assert ndl.cpu() == nd.cpu()
    assert ndl.cuda() == nd.cuda()
    assert ndl.cpu_numpy() == nd.cpu_numpy()
    assert nd.default_device() == nd.cpu()
    assert nd.all_devices() == [nd.cpu(), nd.cuda(), nd.cpu_numpy()]
    assert len({nd.cpu(), nd.cpu(), nd.cpu_numpy(), nd.cuda()}) == 3


def test_device_enabled():
    assert nd.cpu().enabled() is True
    assert nd.cpu_numpy().enabled() is True
    assert isinstance(nd.cuda().enabled(), bool)


@pytest.mark.parametrize("device", DEVICES)
def test_device_empty_full(device):
    a = device.empty((2, 3))
    assert isinstance(a, nd.NDArray)
    assert a.shape == (2, 3) and a.device == device and a.dtype == "float32"
    a = device.empty((2, 3), dtype="float32")
    assert a.shape == (2, 3)
    f = device.full((3, 0, 2), 1.5)
    assert f.shape == (3, 0, 2) and f.device == device
    f = device.full((4, 2), -2.25, dtype="float32")
    np.testing.assert_array_equal(f.numpy(), np.full((4, 2), -2.25, np.float32))
    f = device.full((), 3.0)
    assert f.shape == ()
    np.testing.assert_array_equal(f.numpy(), np.float32(3.0))


@pytest.mark.parametrize("device", DEVICES)
def test_device_rand_randn(device):
    np.random.seed(0)
    exp = np.random.rand(3, 4).astype(np.float32)
    np.random.seed(0)
    got = device.rand(3, 4)
    assert got.shape == (3, 4) and got.device == device
    np.testing.assert_array_equal(got.numpy(), exp)

    np.random.seed(7)
    exp = np.random.randn(2, 3, 5).astype(np.float32)
    np.random.seed(7)
    got = device.randn(2, 3, 5, dtype="float32")
    assert got.shape == (2, 3, 5)
    np.testing.assert_array_equal(got.numpy(), exp)

    np.random.seed(1)
    exp = np.random.rand(6).astype(np.float32)
    np.random.seed(1)
    got = device.rand(6, dtype="float32")
    np.testing.assert_array_equal(got.numpy(), exp)


@pytest.mark.parametrize("device", DEVICES)
def test_device_one_hot(device):
    got = device.one_hot(5, 2)
    assert got.device == device
    check_result(got, np.eye(5)[2], device, exact=True)
    got = device.one_hot(4, [1, 3, 0, 1])
    check_result(got, np.eye(4)[[1, 3, 0, 1]], device, exact=True)
    idx = np.array([[0, 2], [1, 1]])
    got = device.one_hot(3, idx, dtype="float32")
    check_result(got, np.eye(3)[idx], device, exact=True)


def test_cpu_numpy_device_ops():
    dev = nd.cpu_numpy()
    rng = np.random.default_rng(3)
    x = rand_data(rng, (3, 4))
    y = rand_data(rng, (4, 5))
    a = nd.array(x, device=dev)
    b = nd.array(y, device=dev)
    assert a.device == dev
    check_result(a + a, x + x, dev)
    check_result(a @ b, x.astype(np.float64) @ y, dev, rtol=1e-4, atol=1e-4)
    check_result(a.sum(axis=1), x.sum(axis=1), dev, rtol=1e-4, atol=1e-5)
    check_result(a.permute((1, 0)).exp(), np.exp(x.T), dev)


# --------------------------------------------------------------------------
# construction, properties, conversion
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_construction_from_numpy_and_lists(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = nd.array(x, device=device)
    assert a.shape == (3, 4) and a.size == 12 and a.ndim == 2
    assert a.dtype == "float32" and a.device == device
    assert a.strides == (4, 1)
    assert isinstance(a.shape, tuple) and isinstance(a.strides, tuple)
    np.testing.assert_array_equal(a.numpy(), x)
    # nd.array copies: later changes to the source are not seen
    x[0, 0] = 100.0
    assert a.numpy()[0, 0] == 0.0

    b = nd.NDArray(np.arange(6, dtype=np.int64).reshape(2, 3), device=device)
    np.testing.assert_array_equal(b.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert b.numpy().dtype == np.float32

    for src, exp in [
        (np.array([True, False, True]), np.array([1, 0, 1], np.float32)),
        (np.array([1, 2, 3], dtype=np.uint8), np.array([1, 2, 3], np.float32)),
        (np.array([1.5, -2.5], dtype=np.float64), np.array([1.5, -2.5], np.float32)),
        (np.array([0.5, 2.0], dtype=np.float16), np.array([0.5, 2.0], np.float32)),
        ([1, 2, 3], np.array([1, 2, 3], np.float32)),
        ([[1.0, 2.0], [3.0, 4.0]], np.array([[1, 2], [3, 4]], np.float32)),
        (2.5, np.array(2.5, np.float32)),
        (7, np.array(7, np.float32)),
        ([], np.zeros((0,), np.float32)),
    ]:
        got = nd.array(src, device=device)
        check_result(got, exp, device, msg=repr(src), exact=True)
        got = nd.NDArray(src, device=device)
        check_result(got, exp, device, msg=repr(src), exact=True)


def test_construction_default_device_and_dtype_arg():
    a = nd.array([1.0, 2.0])
    assert a.device == nd.cpu()
    a = nd.array([1.0, 2.0], dtype="float32")
    assert a.dtype == "float32"
    e = nd.empty((2, 3))
    assert e.shape == (2, 3) and e.device == nd.cpu() and e.dtype == "float32"
    f = nd.full((2, 2), 4.0)
    assert f.device == nd.cpu()
    np.testing.assert_array_equal(f.numpy(), np.full((2, 2), 4.0, np.float32))
    assert isinstance(ndl.NDArray(np.ones(3)), nd.NDArray)
    assert ndl.NDArray is nd.NDArray


@pytest.mark.parametrize("device", DEVICES)
def test_construction_from_ndarray_copies(device):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = nd.array(x, device=device)
    b = nd.NDArray(a)
    assert b is not a
    assert b.device == device
    np.testing.assert_array_equal(b.numpy(), x)
    a[0, 0] = 42.0
    assert b.numpy()[0, 0] == 0.0
    # a copy of a non-compact view holds the view's values
    v = a.permute((1, 0))[::-1]
    c = nd.array(v)
    exp = a.numpy().T[::-1]
    np.testing.assert_array_equal(c.numpy(), exp)
    # copy to the other host device
    d = nd.NDArray(a, device=nd.cpu_numpy())
    assert d.device == nd.cpu_numpy()
    np.testing.assert_array_equal(d.numpy(), a.numpy())
    e = nd.array(v, device=nd.cpu_numpy())
    np.testing.assert_array_equal(e.numpy(), exp)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_full_module_functions(device):
    e = nd.empty((4, 0, 3), device=device)
    assert e.shape == (4, 0, 3) and e.size == 0
    e = nd.empty((), dtype="float32", device=device)
    assert e.shape == () and e.size == 1 and e.ndim == 0
    f = nd.full((2, 5), 0.25, device=device)
    check_result(f, np.full((2, 5), 0.25), device, exact=True)
    f = nd.full((3,), 7, dtype="float32", device=device)
    check_result(f, np.full((3,), 7.0), device, exact=True)
    e = nd.empty((1,) * 16, device=device)
    assert e.ndim == 16


@pytest.mark.parametrize("device", DEVICES)
def test_numpy_conversion_is_a_copy(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = nd.array(x, device=device)
    out = a.numpy()
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    out[0, 0] = -1.0
    assert a.numpy()[0, 0] == 0.0
    v = a[:, ::-2]
    out = v.numpy()
    np.testing.assert_array_equal(out, x[:, ::-2])
    out[...] = 0
    np.testing.assert_array_equal(a.numpy(), x)
    arr = np.asarray(a)
    np.testing.assert_array_equal(arr, x)
    np.testing.assert_array_equal(np.asarray(a.permute((1, 0))), x.T)
    s = nd.array(3.0, device=device)
    assert s.numpy().shape == ()
    assert float(s.numpy()) == 3.0


def test_repr():
    a = nd.array([[1.0, 2.0], [3.0, 4.0]])
    r = repr(a)
    assert r.startswith("NDArray(")
    assert "device=cpu()" in r
    r = repr(nd.array([1.0], device=nd.cpu_numpy()))
    assert r.startswith("NDArray(") and "device=cpu_numpy()" in r


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
        assert ndv.is_compact() == npv.flags.c_contiguous, (
            f"{msg}: is_compact {ndv.is_compact()} vs numpy c_contiguous "
            f"{npv.flags.c_contiguous} (strides {ndv.strides})"
        )


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


# --------------------------------------------------------------------------
# view ops: reshape, permute, broadcast_to, flip, getitem, as_strided, flat
# --------------------------------------------------------------------------


def _base_and_view(device, kind):
    """Return (np_base, nd_base, np_view, nd_view) with shape (3, 4) views."""
    rng = np.random.default_rng(5)
    if kind == "contiguous":
        npb = rand_data(rng, (3, 4))
        ndb = nd.array(npb, device=device)
        return npb, ndb, npb, ndb
    if kind == "transposed":
        npb = rand_data(rng, (4, 3))
        ndb = nd.array(npb, device=device)
        return npb, ndb, npb.T, ndb.permute((1, 0))
    if kind == "stepped":
        npb = rand_data(rng, (6, 8))
        ndb = nd.array(npb, device=device)
        return npb, ndb, npb[::2, ::2], ndb[::2, ::2]
    if kind == "offset_rows":
        npb = rand_data(rng, (5, 4))
        ndb = nd.array(npb, device=device)
        return npb, ndb, npb[2:5], ndb[2:5]
    if kind == "offset_cols":
        npb = rand_data(rng, (3, 6))
        ndb = nd.array(npb, device=device)
        return npb, ndb, npb[:, 1:5], ndb[:, 1:5]
    if kind == "flipped":
        npb = rand_data(rng, (3, 4))
        ndb = nd.array(npb, device=device)
        return npb, ndb, npb[::-1], ndb.flip(0)
    if kind == "broadcast":
        npb = rand_data(rng, (1, 4))
        ndb = nd.array(npb, device=device)
        return npb, ndb, np.broadcast_to(npb, (3, 4)), ndb.broadcast_to((3, 4))
    raise AssertionError(kind)


RESHAPE_KINDS = [
    "contiguous", "transposed", "stepped", "offset_rows", "offset_cols", "flipped", "broadcast"
]
RESHAPE_TARGETS = [
    (12,), (4, 3), (2, 6), (2, 2, 3), (3, 2, 2), (3, 1, 4), (1, 3, 4), (3, 4, 1),
    (12, 1), (-1,), (3, -1), (-1, 2, 2), (3, 4),
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
    check_result(a.reshape((1,) * 15 + (24,))[..., 3:5], x.reshape((1,) * 15 + (24,))[..., 3:5],
                 device, exact=True)
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


@pytest.mark.parametrize("src,target", BROADCAST_CASES, ids=[f"{s}->{t}" for s, t in BROADCAST_CASES])
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
    axes_options = [tuple(c) for r in range(0, ndim + 1) for c in itertools.combinations(range(ndim), r)]
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


GETITEM_CASES_2D = [
    1,
    -1,
    (1,),
    (1, 2),
    (-3, -5),
    (1, slice(2, 4)),
    (slice(1, 3),),
    slice(1, 3),
    (slice(None), 3),
    (slice(None, None, -1),),
    (slice(None, None, 2), slice(None, None, -2)),
    (slice(-2, None), slice(None, -2)),
    (slice(2, 0, -1), slice(4, None, -3)),
    (slice(2, 1),),
    (slice(10, 20),),
    (slice(-100, 100), slice(1, 1)),
    (Ellipsis,),
    (Ellipsis, 2),
    (1, Ellipsis),
    (Ellipsis, slice(None, None, -1)),
    (slice(None), Ellipsis, slice(1, None, 2)),
    (slice(None, None, 5), slice(None, None, 7)),
    (slice(0, 3, 1), slice(0, 5, 1)),
]

GETITEM_CASES_3D = [
    (1,),
    (-1, slice(1, 4), 2),
    (slice(None, None, -2), -2, Ellipsis),
    (0, Ellipsis, slice(None, None, 3)),
    (Ellipsis, slice(1, 5, 2)),
    (slice(1, 3), slice(None, None, -1), slice(-1, 0, -2)),
    (3, 4, 5),
    (slice(None), slice(0, 0)),
]


def _check_getitem(npb, ndb, idx, device, msg):
    np_idx = course_index_to_numpy(idx, npb.shape)
    exp = npb[np_idx]
    res = ndb[idx]
    assert isinstance(res, nd.NDArray), msg
    assert res.shape == exp.shape, f"{msg}: {res.shape} vs {exp.shape}"
    assert res.device == device
    np.testing.assert_array_equal(res.numpy(), exp, err_msg=msg)
    check_strides_meaningful(res, exp, msg)
    return res, np_idx


@pytest.mark.parametrize("device", DEVICES)
def test_getitem_course_semantics(device):
    rng = np.random.default_rng(14)
    x = rand_data(rng, (3, 5))
    a = nd.array(x, device=device)
    # the documented example
    r = a[1, 2:4]
    assert r.shape == (1, 2)
    np.testing.assert_array_equal(r.numpy(), x[1:2, 2:4])
    for idx in GETITEM_CASES_2D:
        _check_getitem(x, a, idx, device, f"2-D index {idx!r}")
    y = rand_data(rng, (4, 5, 6))
    b = nd.array(y, device=device)
    for idx in GETITEM_CASES_3D:
        _check_getitem(y, b, idx, device, f"3-D index {idx!r}")


@pytest.mark.parametrize("device", DEVICES)
def test_getitem_on_views(device):
    rng = np.random.default_rng(15)
    x = rand_data(rng, (3, 5))
    for kind, npv, ndv in make_views(x, device):
        for idx in GETITEM_CASES_2D:
            _check_getitem(npv, ndv, idx, device, f"{kind} index {idx!r}")
        # getitem of a getitem
        r = ndv[1:, ::-1][::2, 1]
        exp = npv[1:, ::-1][::2, 1:2]
        np.testing.assert_array_equal(r.numpy(), exp, err_msg=kind)


@pytest.mark.parametrize("device", DEVICES)
def test_getitem_returns_views(device):
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    a = nd.array(x, device=device)
    v = a[1:3, ::-2]
    w = a[2]
    a[...] = x * 10
    np.testing.assert_array_equal(v.numpy(), (x * 10)[1:3, ::-2])
    np.testing.assert_array_equal(w.numpy(), (x * 10)[2:3])
    # writes through the view land in the base
    v[...] = -1.0
    exp = x * 10
    exp[1:3, ::-2] = -1.0
    np.testing.assert_array_equal(a.numpy(), exp)


@pytest.mark.parametrize("device", DEVICES)
def test_views_write_through(device):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)

    def fresh():
        return x.copy(), nd.array(x, device=device)

    cases = [
        ("reshape", lambda a: a.reshape((6, 4)), lambda n: n.reshape(6, 4)),
        ("permute", lambda a: a.permute((1, 0)), lambda n: n.T),
        ("getitem", lambda a: a[1:4, ::2], lambda n: n[1:4, ::2]),
        ("flip", lambda a: a.flip((0, 1)), lambda n: n[::-1, ::-1]),
        ("flat", lambda a: a.flat, lambda n: n.reshape(-1)),
        ("as_strided", lambda a: a.as_strided((3, 4), (6, 1)),
         lambda n: np.lib.stride_tricks.as_strided(n, (3, 4), (24, 4))),
        ("getitem_neg", lambda a: a[::-1, 4:0:-2], lambda n: n[::-1, 4:0:-2]),
    ]
    for name, ndf, npf in cases:
        npb, ndb = fresh()
        v = ndf(ndb)
        npv = npf(npb)
        vals = np.arange(npv.size, dtype=np.float32).reshape(npv.shape) * -1 - 1
        v[...] = vals
        npv[...] = vals
        np.testing.assert_array_equal(ndb.numpy(), npb, err_msg=name)
        np.testing.assert_array_equal(v.numpy(), npv, err_msg=name)
        # and writes to the base are visible through the view
        ndb[...] = x + 0.5
        npb[...] = x + 0.5
        np.testing.assert_array_equal(v.numpy(), npv, err_msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_as_strided(device):
    x = np.arange(12, dtype=np.float32)
    a = nd.array(x, device=device)
    st = np.lib.stride_tricks.as_strided
    for shape, strides in [
        ((10, 3), (1, 1)),
        ((3, 4), (4, 1)),
        ((4, 3), (1, 4)),
        ((2, 2, 3), (6, 3, 1)),
        ((5,), (0,)),
        ((12,), (1,)),
        ((0, 3), (1, 1)),
        ((), ()),
        ((4,), (3,)),
    ]:
        res = a.as_strided(shape, strides)
        exp = st(x, shape, tuple(4 * s for s in strides))
        assert res.shape == shape
        assert tuple(res.strides) == tuple(strides)
        np.testing.assert_array_equal(res.numpy(), exp, err_msg=f"{shape} {strides}")
    # as_strided on an offset view starts at the view's first element
    b = a[2:]
    res = b.as_strided((10,), (1,))
    np.testing.assert_array_equal(res.numpy(), x[2:12])
    res = b.as_strided((3, 2), (3, 1))
    np.testing.assert_array_equal(res.numpy(), st(x[2:], (3, 2), (12, 4)))
    # negative strides staying inside the storage are fine
    res = b.as_strided((3,), (-1,))
    np.testing.assert_array_equal(res.numpy(), np.array([2.0, 1.0, 0.0], np.float32))


# --------------------------------------------------------------------------
# __setitem__
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_scalars_and_arrays(device):
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    a = nd.array(x, device=device)
    e = x.copy()

    def check(msg):
        np.testing.assert_array_equal(a.numpy(), e, err_msg=msg)

    a[1:3, ::2] = 5.0
    e[1:3, ::2] = 5.0
    check("float scalar")
    a[0] = 7
    e[0:1] = 7
    check("int scalar, int index")
    a[-1, -1] = np.float32(-3.5)
    e[3, 4] = -3.5
    check("numpy float32 scalar")
    a[2, 1] = np.float64(1.25)
    e[2, 1] = 1.25
    check("numpy float64 scalar")
    a[::-1, 1] = np.int64(9)
    e[::-1, 1] = 9
    check("numpy int scalar")
    v = np.array([[10, 11, 12]], dtype=np.float32)
    a[3, 1:4] = v
    e[3:4, 1:4] = v
    check("numpy array")
    a[1:3, 3:5] = [[1.0, 2.0], [3.0, 4.0]]
    e[1:3, 3:5] = [[1.0, 2.0], [3.0, 4.0]]
    check("nested list")
    a[:, 0:1] = np.array([[1], [2], [3], [4]], dtype=np.int32)
    e[:, 0:1] = [[1], [2], [3], [4]]
    check("int numpy array")
    # NDArray values, broadcast to the view's shape
    a[0] = nd.array(np.arange(5, dtype=np.float32) * 2, device=device)
    e[0, :] = np.arange(5) * 2
    check("NDArray broadcast (5,) -> (1, 5)")
    a[1:4, 2:4] = nd.array([[100.0], [200.0], [300.0]], device=device)
    e[1:4, 2:4] = [[100.0], [200.0], [300.0]]
    check("NDArray broadcast (3, 1) -> (3, 2)")
    a[2:4, :] = nd.array(-8.0, device=device)
    e[2:4, :] = -8.0
    check("0-d NDArray")
    a[...] = nd.array(x, device=device)
    e[...] = x
    check("full overwrite")
    # 0-size targets are no-ops
    a[2:2] = 99.0
    a[:, 5:] = nd.array(np.zeros((4, 0), np.float32), device=device)
    check("empty targets")


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_with_noncompact_values_and_targets(device):
    rng = np.random.default_rng(21)
    for kind, npv, ndv in make_views(rand_data(rng, (3, 4)), device):
        if kind.startswith("broadcast"):
            continue
        x = rand_data(rng, (6, 8))
        a = nd.array(x, device=device)
        e = x.copy()
        a[::-2, 1:8:2] = ndv
        e[::-2, 1:8:2] = npv
        np.testing.assert_array_equal(a.numpy(), e, err_msg=f"value {kind}")
        # non-compact target view, written through __setitem__ on the view
        t = a.permute((1, 0))[::2]
        et = e.T[::2]
        val = nd.array(rand_data(rng, (4, 6)), device=device)[:, ::-1]
        t[...] = val
        et[...] = val.numpy()
        np.testing.assert_array_equal(a.numpy(), e, err_msg=f"target {kind}")


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_3d_and_0d(device):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    a = nd.array(x, device=device)
    e = x.copy()
    a[1, ..., ::2] = 0.5
    e[1:2, :, ::2] = 0.5
    np.testing.assert_array_equal(a.numpy(), e)
    a[..., -1] = nd.array(np.ones((3, 4, 1), np.float32) * 3, device=device)
    e[..., 4] = 3
    np.testing.assert_array_equal(a.numpy(), e)
    s = nd.array(1.0, device=device)
    s[...] = 4.0
    assert float(s.numpy()) == 4.0


# --------------------------------------------------------------------------
# elementwise ops
# --------------------------------------------------------------------------


def _sigmoid(x):
    x = x.astype(np.float64)
    return 1.0 / (1.0 + np.exp(-x))


UNARY_OPS = {
    "neg": (lambda a: -a, lambda x: -x, "any"),
    "log": (lambda a: a.log(), np.log, "pos"),
    "exp": (lambda a: a.exp(), np.exp, "any"),
    "tanh": (lambda a: a.tanh(), np.tanh, "any"),
    "sqrt": (lambda a: a.sqrt(), np.sqrt, "pos"),
    "sigmoid": (lambda a: a.sigmoid(), _sigmoid, "any"),
    "abs": (lambda a: a.abs(), np.abs, "any"),
    "relu": (lambda a: a.relu(), lambda x: np.maximum(x, 0), "any"),
    "nd.log": (lambda a: nd.log(a), np.log, "pos"),
    "nd.exp": (lambda a: nd.exp(a), np.exp, "any"),
    "nd.tanh": (lambda a: nd.tanh(a), np.tanh, "any"),
    "nd.sqrt": (lambda a: nd.sqrt(a), np.sqrt, "pos"),
}


@pytest.mark.parametrize("op", list(UNARY_OPS))
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_unary(op, shape, device):
    f_nd, f_np, kind = UNARY_OPS[op]
    rng = np.random.default_rng(31)
    x = rand_data(rng, shape, kind)
    for vkind, npv, ndv in make_views(x, device):
        before = ndv.numpy()
        res = f_nd(ndv)
        msg = f"{op} on {vkind} {shape}"
        assert res is not ndv, msg
        assert res.is_compact(), msg
        check_result(res, f_np(npv), device, msg)
        # the input is unchanged
        np.testing.assert_array_equal(ndv.numpy(), before, err_msg=msg)


def test_unary_special_values():
    a = nd.array([0.0, -0.0, 1e-30, 80.0, -80.0, 1e30])
    np.testing.assert_array_equal(a.relu().numpy(), np.array([0, 0, 1e-30, 80, 0, 1e30], np.float32))
    np.testing.assert_allclose(a.sigmoid().numpy(), _sigmoid(a.numpy()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.tanh().numpy(), np.tanh(a.numpy()), rtol=1e-5, atol=1e-6)
    assert np.isinf(nd.array([0.0]).log().numpy()[0])
    assert np.isnan(nd.array([-1.0]).sqrt().numpy()[0])


def _np_pow(x, y):
    # NaN where the base is negative and the exponent not an integer, like powf
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.power(x.astype(np.float64), y)


BINARY_OPS = {
    "add": (lambda a, b: a + b, lambda x, y: x + y, "any", "any"),
    "sub": (lambda a, b: a - b, lambda x, y: x - y, "any", "any"),
    "mul": (lambda a, b: a * b, lambda x, y: x * y, "any", "any"),
    "div": (lambda a, b: a / b, lambda x, y: x / y, "any", "nonzero"),
    "pow": (lambda a, b: a ** b, lambda x, y: _np_pow(x, y), "pos", "any"),
    "maximum": (lambda a, b: a.maximum(b), np.maximum, "any", "any"),
    "nd.maximum": (lambda a, b: nd.maximum(a, b), np.maximum, "any", "any"),
    "eq": (lambda a, b: a == b, lambda x, y: (x == y), "int", "int"),
    "ne": (lambda a, b: a != b, lambda x, y: (x != y), "int", "int"),
    "ge": (lambda a, b: a >= b, lambda x, y: (x >= y), "int", "int"),
    "gt": (lambda a, b: a > b, lambda x, y: (x > y), "int", "int"),
    "le": (lambda a, b: a <= b, lambda x, y: (x <= y), "int", "int"),
    "lt": (lambda a, b: a < b, lambda x, y: (x < y), "int", "int"),
}
EXACT_OPS = {"maximum", "nd.maximum", "eq", "ne", "ge", "gt", "le", "lt"}


@pytest.mark.parametrize("op", list(BINARY_OPS))
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_binary_same_shape(op, shape, device):
    f_nd, f_np, ka, kb = BINARY_OPS[op]
    rng = np.random.default_rng(41)
    x = rand_data(rng, shape, ka)
    y = rand_data(rng, shape, kb)
    va = make_views(x, device, seed=1)
    vb = make_views(y, device, seed=2)
    for (kx, npa, nda), (ky, npb, ndb) in view_pairs(va, vb):
        msg = f"{op}: {kx} {ky} {shape}"
        res = f_nd(nda, ndb)
        assert res is not nda and res is not ndb, msg
        assert res.is_compact(), msg
        check_result(res, f_np(npa, npb), device, msg, exact=op in EXACT_OPS)


BROADCAST_PAIRS = [
    ((3, 1, 4), (5, 1)),
    ((4,), (2, 3, 4)),
    ((), (3,)),
    ((2, 3), ()),
    ((0, 3), (1, 3)),
    ((2, 1), (2, 0)),
    ((1,), (0,)),
    ((5, 1, 1, 2), (1, 3, 4, 1)),
    ((6,), (1, 6)),
    ((1, 1), (3, 1)),
    ((2, 1, 3, 1, 2), (4, 1, 5, 1)),
]


@pytest.mark.parametrize("op", list(BINARY_OPS))
@pytest.mark.parametrize(
    "sa,sb", BROADCAST_PAIRS, ids=[f"{shape_id(a)}-{shape_id(b)}" for a, b in BROADCAST_PAIRS]
)
@pytest.mark.parametrize("device", DEVICES)
def test_binary_broadcasting(op, sa, sb, device):
    f_nd, f_np, ka, kb = BINARY_OPS[op]
    rng = np.random.default_rng(43)
    x = rand_data(rng, sa, ka)
    y = rand_data(rng, sb, kb)
    va = make_views(x, device, seed=3)
    vb = make_views(y, device, seed=4)
    exp_shape = np.broadcast_shapes(sa, sb)
    pairs = [(a, vb[0]) for a in va] + [(va[0], b) for b in vb[1:]]
    for (kx, npa, nda), (ky, npb, ndb) in pairs:
        msg = f"{op}: {kx}{sa} {ky}{sb}"
        res = f_nd(nda, ndb)
        assert res.shape == exp_shape, msg
        assert res.is_compact(), msg
        check_result(res, f_np(npa, npb), device, msg, exact=op in EXACT_OPS)
        # and with the operands swapped
        res = f_nd(ndb, nda)
        assert res.shape == exp_shape, msg + " swapped"
        check_result(res, f_np(npb, npa), device, msg + " swapped", exact=op in EXACT_OPS)


SCALARS = [2, -3, 1.5, 0.0, np.float32(2.5), np.float64(-0.75), np.int64(3), np.int32(-2)]


def _scalar_id(s):
    return f"{type(s).__name__}({s})"


@pytest.mark.parametrize("s", SCALARS, ids=[_scalar_id(s) for s in SCALARS])
@pytest.mark.parametrize("device", DEVICES)
def test_scalar_ops_array_on_left(s, device):
    rng = np.random.default_rng(51)
    sf = float(s)
    for shape in [(), (0,), (7,), (3, 4), (2, 3, 4)]:
        x = rand_data(rng, shape, "any")
        xi = rand_data(rng, shape, "int")
        xp = rand_data(rng, shape, "pos")
        for (k, npv, ndv), (_, npi, ndi), (_, npp, ndp) in zip(
            make_views(x, device), make_views(xi, device), make_views(xp, device)
        ):
            msg = f"{k} {shape} scalar {s!r}"
            check_result(ndv + s, npv.astype(np.float64) + sf, device, msg + " +")
            check_result(ndv - s, npv.astype(np.float64) - sf, device, msg + " -")
            check_result(ndv * s, npv.astype(np.float64) * sf, device, msg + " *")
            if sf != 0.0:
                check_result(ndv / s, npv.astype(np.float64) / sf, device, msg + " /")
            check_result(ndp ** s, np.power(npp.astype(np.float64), sf), device, msg + " **")
            check_result(ndv.maximum(s), np.maximum(npv, np.float32(sf)), device, msg + " max",
                         exact=True)
            check_result(nd.maximum(ndv, s), np.maximum(npv, np.float32(sf)), device, msg,
                         exact=True)
            for name, f_nd, f_np in [
                ("==", lambda a: a == s, lambda x: x == sf),
                ("!=", lambda a: a != s, lambda x: x != sf),
                (">=", lambda a: a >= s, lambda x: x >= sf),
                (">", lambda a: a > s, lambda x: x > sf),
                ("<=", lambda a: a <= s, lambda x: x <= sf),
                ("<", lambda a: a < s, lambda x: x < sf),
            ]:
                check_result(f_nd(ndi), f_np(npi), device, msg + " " + name, exact=True)


@pytest.mark.parametrize("s", [2, -3, 1.5, 0.5], ids=[_scalar_id(s) for s in [2, -3, 1.5, 0.5]])
@pytest.mark.parametrize("device", DEVICES)
def test_scalar_ops_python_scalar_on_right(s, device):
    # reflected forms with Python scalars: s + a, s - a, s * a, s / a, s ** a
    rng = np.random.default_rng(52)
    sf = float(s)
    for shape in [(), (0,), (7,), (3, 4), (2, 3, 4)]:
        x = rand_data(rng, shape, "nonzero")
        for k, npv, ndv in make_views(x, device):
            msg = f"{k} {shape} scalar {s!r}"
            x64 = npv.astype(np.float64)
            check_result(s + ndv, sf + x64, device, msg + " radd")
            check_result(s - ndv, sf - x64, device, msg + " rsub")
            check_result(s * ndv, sf * x64, device, msg + " rmul")
            check_result(s / ndv, sf / x64, device, msg + " rtruediv")
            if sf > 0:
                check_result(s ** ndv, np.power(sf, x64), device, msg + " rpow")
            check_result(-ndv, -npv, device, msg + " neg")


@pytest.mark.parametrize(
    "s", [np.float32(2.5), np.float64(-0.75), np.int64(3)],
    ids=["float32", "float64", "int64"],
)
@pytest.mark.parametrize("device", DEVICES)
def test_scalar_ops_numpy_scalar_on_left_side(s, device):
    # numpy scalar on the left: the result must still be a needle NDArray
    x = np.array([[0.5, -1.5, 2.0], [1.0, 3.0, -0.25]], dtype=np.float32)
    a = nd.array(x, device=device)
    sf = float(s)
    for name, res, exp in [
        ("radd", s + a, sf + x.astype(np.float64)),
        ("rsub", s - a, sf - x.astype(np.float64)),
        ("rmul", s * a, sf * x.astype(np.float64)),
        ("rtruediv", s / a, sf / x.astype(np.float64)),
    ]:
        assert isinstance(res, nd.NDArray), f"{name}: got {type(res)}"
        check_result(res, exp, device, name)


@pytest.mark.parametrize("device", DEVICES)
def test_comparison_results_are_float32_zero_one(device):
    a = nd.array([1.0, 2.0, 3.0], device=device)
    b = nd.array([3.0, 2.0, 1.0], device=device)
    for res, exp in [
        (a == b, [0, 1, 0]),
        (a != b, [1, 0, 1]),
        (a >= b, [0, 1, 1]),
        (a > b, [0, 0, 1]),
        (a <= b, [1, 1, 0]),
        (a < b, [1, 0, 0]),
    ]:
        assert isinstance(res, nd.NDArray)
        assert res.dtype == "float32"
        check_result(res, np.array(exp, np.float32), device, exact=True)


@pytest.mark.parametrize("device", DEVICES)
def test_chained_ops(device):
    rng = np.random.default_rng(53)
    x = rand_data(rng, (4, 5))
    y = rand_data(rng, (5,))
    a = nd.array(x, device=device)
    b = nd.array(y, device=device)
    res = ((a * 2 - b) / 3 + 1).exp().log() ** 2
    exp = np.log(np.exp((x.astype(np.float64) * 2 - y) / 3 + 1)) ** 2
    check_result(res, exp, device, rtol=1e-4, atol=1e-5)
    res = (a.permute((1, 0)) + b.reshape((5, 1))).relu().sum(axis=0)
    exp = np.maximum(x.T + y.reshape(5, 1), 0).sum(axis=0)
    check_result(res, exp, device, rtol=1e-4, atol=1e-5)


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


# --------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------


def _check_matmul(nda, ndb, npa, npb, device, msg):
    exp = np.matmul(npa.astype(np.float64), npb.astype(np.float64))
    k = npa.shape[-1]
    for name, res in [
        ("@", nda @ ndb),
        ("matmul", nda.matmul(ndb)),
        ("nd.matmul", nd.matmul(nda, ndb)),
    ]:
        assert res.shape == exp.shape, f"{msg} {name}: {res.shape} vs {exp.shape}"
        assert res.is_compact()
        check_result(res, exp, device, f"{msg} {name}", rtol=1e-4, atol=1e-5 * max(1, k))


MATMUL_2D = [
    (1, 1, 1), (1, 5, 1), (2, 3, 4), (3, 1, 2), (7, 9, 5), (8, 8, 8), (9, 7, 13),
    (15, 17, 16), (16, 16, 16), (31, 33, 29), (32, 1, 40), (64, 64, 64), (65, 127, 130),
    (130, 3, 7), (1, 130, 1), (257, 129, 65), (0, 3, 4), (3, 0, 4), (3, 4, 0),
]


@pytest.mark.parametrize("m,k,n", MATMUL_2D, ids=[f"{m}x{k}x{n}" for m, k, n in MATMUL_2D])
@pytest.mark.parametrize("device", DEVICES)
def test_matmul_2d(m, k, n, device):
    rng = np.random.default_rng(71 + m + k + n)
    x = rand_data(rng, (m, k), "any") / 2
    y = rand_data(rng, (k, n), "any") / 2
    a = nd.array(x, device=device)
    b = nd.array(y, device=device)
    _check_matmul(a, b, x, y, device, f"{m}x{k}x{n}")
    # transposed operands (views)
    at = nd.array(_c(x.T), device=device).permute((1, 0))
    bt = nd.array(_c(y.T), device=device).permute((1, 0))
    _check_matmul(at, b, x, y, device, "A transposed")
    _check_matmul(a, bt, x, y, device, "B transposed")
    _check_matmul(at, bt, x, y, device, "both transposed")


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_view_operands(device):
    rng = np.random.default_rng(72)
    x = rand_data(rng, (6, 5))
    y = rand_data(rng, (5, 4))
    va = make_views(x, device, seed=5)
    vb = make_views(y, device, seed=6)
    for (ka, npa, nda) in va:
        _check_matmul(nda, vb[0][2], npa, vb[0][1], device, f"A {ka}")
    for (kb, npb, ndb) in vb[1:]:
        _check_matmul(va[0][2], ndb, va[0][1], npb, device, f"B {kb}")
    for (ka, npa, nda), (kb, npb, ndb) in zip(va, vb):
        _check_matmul(nda, ndb, npa, npb, device, f"A {ka} B {kb}")


MATMUL_ND = [
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((1,), (1,)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((3, 4, 5), (5, 2)),
    ((4, 5), (3, 5, 2)),
    ((5,), (3, 5, 2)),
    ((3, 4, 5), (5,)),
    ((1, 3, 4), (7, 4, 2)),
    ((2, 1, 1, 3, 4), (1, 3, 1, 4, 2)),
    ((0, 3, 4), (4, 2)),
    ((2, 3, 0), (2, 0, 5)),
    ((4, 17, 33), (4, 33, 9)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_ND, ids=[f"{shape_id(a)}@{shape_id(b)}" for a, b in MATMUL_ND])
@pytest.mark.parametrize("device", DEVICES)
def test_matmul_nd(sa, sb, device):
    rng = np.random.default_rng(73)
    x = rand_data(rng, sa)
    y = rand_data(rng, sb)
    va = make_views(x, device, seed=7)
    vb = make_views(y, device, seed=8)
    for (ka, npa, nda) in va:
        _check_matmul(nda, vb[0][2], npa, vb[0][1], device, f"{sa}@{sb} A {ka}")
    for (kb, npb, ndb) in vb[1:]:
        _check_matmul(va[0][2], ndb, va[0][1], npb, device, f"{sa}@{sb} B {kb}")


def test_matmul_documented_batch_shape():
    a = nd.array(np.ones((2, 1, 3, 4), np.float32))
    b = nd.array(np.ones((5, 4, 6), np.float32))
    r = a @ b
    assert r.shape == (2, 5, 3, 6)
    np.testing.assert_array_equal(r.numpy(), np.full((2, 5, 3, 6), 4.0, np.float32))


# --------------------------------------------------------------------------
# pad, fill, to, stack
# --------------------------------------------------------------------------


PAD_CASES = [
    ((3,), ((1, 2),)),
    ((3, 4), ((1, 2), (0, 3))),
    ((3, 4), ((0, 0), (0, 0))),
    ((2, 3, 4), ((0, 1), (2, 0), (1, 1))),
    ((2, 0, 3), ((1, 0), (1, 1), (0, 2))),
    ((0,), ((2, 3),)),
    ((), ()),
]


@pytest.mark.parametrize("shape,axes", PAD_CASES, ids=[f"{shape_id(s)}-{p}" for s, p in PAD_CASES])
@pytest.mark.parametrize("device", DEVICES)
def test_pad(shape, axes, device):
    rng = np.random.default_rng(81)
    x = rand_data(rng, shape)
    for kind, npv, ndv in make_views(x, device):
        res = ndv.pad(axes)
        exp = np.pad(npv, axes) if axes else npv.copy()
        msg = f"{kind} pad {axes}"
        assert res is not ndv, msg
        assert res.is_compact(), msg
        check_result(res, exp, device, msg, exact=True)


@pytest.mark.parametrize("device", DEVICES)
def test_fill(device):
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    a = nd.array(x, device=device)
    ret = a.fill(2.5)
    assert ret is None or ret is a
    np.testing.assert_array_equal(a.numpy(), np.full((4, 5), 2.5, np.float32))
    a.fill(0)
    np.testing.assert_array_equal(a.numpy(), np.zeros((4, 5), np.float32))
    # fill on a view only touches the view's elements
    a = nd.array(x, device=device)
    e = x.copy()
    v = a[1:4:2, ::-2]
    v.fill(-1.0)
    e[1:4:2, ::-2] = -1.0
    np.testing.assert_array_equal(a.numpy(), e)
    t = a.permute((1, 0))[1:3]
    t.fill(7.0)
    e.T[1:3] = 7.0
    np.testing.assert_array_equal(a.numpy(), e)
    z = nd.empty((0, 3), device=device)
    z.fill(1.0)
    assert z.shape == (0, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_to_device(device):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = nd.array(x, device=device)
    assert a.to(device) is a
    other = nd.cpu_numpy() if device != nd.cpu_numpy() else nd.cpu()
    b = a.to(other)
    assert b is not a
    assert b.device == other
    np.testing.assert_array_equal(b.numpy(), x)
    a[0, 0] = 50.0
    assert b.numpy()[0, 0] == 0.0
    c = a.permute((1, 0))[::-1].to(other)
    np.testing.assert_array_equal(c.numpy(), a.numpy().T[::-1])
    d = b.to(device)
    assert d.device == device
    np.testing.assert_array_equal(d.numpy(), x)


STACK_CASES = [((3,), 3), ((2, 3), 2), ((2, 3, 4), 4), ((), 3), ((0, 2), 2), ((4,), 1)]


@pytest.mark.parametrize("shape,count", STACK_CASES, ids=[f"{shape_id(s)}x{c}" for s, c in STACK_CASES])
@pytest.mark.parametrize("device", DEVICES)
def test_stack(shape, count, device):
    rng = np.random.default_rng(91)
    xs = [rand_data(rng, shape) for _ in range(count)]
    # mix contiguous operands and views
    pieces = []
    for i, x in enumerate(xs):
        views = make_views(x, device, seed=i)
        pieces.append(views[i % len(views)])
    nps = [p[1] for p in pieces]
    nds = [p[2] for p in pieces]
    for axis in list(range(len(shape) + 1)) + [-1]:
        res = nd.stack(nds, axis=axis)
        exp = np.stack(nps, axis=axis)
        assert res.is_compact()
        check_result(res, exp, device, f"axis={axis}", exact=True)
    res = nd.stack(nds)
    check_result(res, np.stack(nps), device, "default axis", exact=True)
    res = nd.stack(tuple(nds), axis=0)
    check_result(res, np.stack(nps), device, "tuple input", exact=True)
