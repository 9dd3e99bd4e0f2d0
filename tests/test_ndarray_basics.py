"""NDArray devices (identity, factories, one_hot), construction, properties and
conversion to NumPy, and the whole-array copies pad, fill, to(device) and stack,
checked against NumPy on every device."""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES
from ndarray_check import check_result, make_views, rand_data, shape_id

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
@pytest.mark.usefixtures("host_rng")
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


@pytest.mark.parametrize(
    "shape,count", STACK_CASES, ids=[f"{shape_id(s)}x{c}" for s, c in STACK_CASES]
)
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
