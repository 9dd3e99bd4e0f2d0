"""NDArray indexing checked against NumPy: __getitem__ with the course semantics (ints
keep their dimension) on arrays and on views, views that write through, as_strided,
and __setitem__ with scalars, arrays and non-compact values and targets."""

import numpy as np
import pytest

from needle import backend_ndarray as nd

from devices import DEVICES
from ndarray_check import check_strides_meaningful, course_index_to_numpy, make_views, rand_data

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
        (
            "as_strided",
            lambda a: a.as_strided((3, 4), (6, 1)),
            lambda n: np.lib.stride_tricks.as_strided(n, (3, 4), (24, 4)),
        ),
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


# Steps that Python clamps to +-(2**63 - 1), and ones a step's product with a stride
# overflows int64 at: each leaves one element (the first or the last), as in NumPy.
HUGE_STEPS = [2**62, 2**63 - 1, 2**63, 2**64, -(2**62), -(2**63 - 1), -(2**63), -(2**64)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("step", HUGE_STEPS)
def test_huge_slice_steps_match_numpy(device, step):
    rng = np.random.default_rng(16)
    for shape in [(5,), (3, 5), (4, 5, 6), (1, 3), (0, 4)]:
        x = rand_data(rng, shape)
        a = nd.array(x, device=device)
        for dim in range(len(shape)):
            idx = (slice(None),) * dim + (slice(None, None, step),)
            res, np_idx = _check_getitem(x, a, idx, device, f"{shape} index {idx!r}")
            exp = x[np_idx]
            # the one-element view works in every later use: again sliced, computed, written
            again = res[idx]
            np.testing.assert_array_equal(again.numpy(), exp[np_idx])
            np.testing.assert_array_equal((res + 1.0).numpy(), exp + 1.0)
            np.testing.assert_array_equal(res.compact().numpy(), exp)
            if exp.size:
                np.testing.assert_allclose(res.sum(axis=dim).numpy(), exp.sum(axis=dim), rtol=1e-6)
            b = nd.array(x, device=device)
            b[idx] = -7.0
            want = x.copy()
            want[np_idx] = -7.0
            np.testing.assert_array_equal(b.numpy(), want)
    # on views, whose strides are not the contiguous ones
    for kind, npv, ndv in make_views(rand_data(rng, (3, 5)), device):
        for idx in [(slice(None, None, step),), (slice(None), slice(None, None, step))]:
            _check_getitem(npv, ndv, idx, device, f"{kind} index {idx!r}")
