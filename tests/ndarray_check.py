"""Helpers shared by the NDArray tests (test_ndarray_*.py): the shapes every op runs on,
random data, the many kinds of views of one array built identically in NumPy and in needle,
result and stride checks against NumPy, and the translation of course-semantics indices.
"""

import numpy as np

from needle import backend_ndarray as nd

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
    views.append(("inner_int", base[..., 1], nd.array(base, device=device)[..., 1].reshape(shape)))

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


def row_major_strides(shape):
    """The canonical strides (in elements) of a compact array of shape: the course's
    compact_strides, with a 0-extent dim counting as 1."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


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
        idx = idx[:k] + (slice(None),) * fill + idx[k + 1 :]
    out = []
    for i, n in zip(idx, shape):
        if isinstance(i, int):
            j = i + n if i < 0 else i
            out.append(slice(j, j + 1))
        else:
            out.append(i)
    return tuple(out)


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
