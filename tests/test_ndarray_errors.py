"""Bad-input tests for needle's NDArray: each error has the documented type,
and the process keeps working afterwards (one more valid op is checked after
every expected exception)."""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES


def check_alive(device=None):
    """A valid op after an error: must still work and give the right result."""
    device = device or nd.cpu()
    a = nd.array([1.0, 2.0, 3.0], device=device)
    b = nd.array([[10.0], [20.0]], device=device)
    r = (a + b).sum(axis=1)
    np.testing.assert_array_equal(r.numpy(), np.array([36.0, 66.0], np.float32))
    m = nd.array(np.eye(2, dtype=np.float32), device=device) @ nd.array(
        [[1.0, 2.0], [3.0, 4.0]], device=device
    )
    np.testing.assert_array_equal(m.numpy(), np.array([[1, 2], [3, 4]], np.float32))


def _arr(shape, device):
    n = int(np.prod(shape)) if shape else 1
    return nd.array(np.arange(n, dtype=np.float32).reshape(shape), device=device)


# --------------------------------------------------------------------------
# exception classes
# --------------------------------------------------------------------------


def test_exception_classes():
    assert issubclass(ndl.DeviceError, RuntimeError)
    assert issubclass(ndl.OutOfMemoryError, MemoryError)
    assert not issubclass(ndl.DeviceError, MemoryError)


# --------------------------------------------------------------------------
# indexing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "idx",
    [
        3,
        -4,
        (0, 5),
        (0, -6),
        (3, slice(None)),
        (Ellipsis, 5),
        (slice(None), 0, 0),
        (0, 0, 0),
        (0, Ellipsis, 0, 0),
    ],
    ids=repr,
)
def test_getitem_index_error(idx, device):
    a = _arr((3, 5), device)
    with pytest.raises(IndexError):
        a[idx]
    check_alive(device)
    np.testing.assert_array_equal(a[2, -1].numpy(), np.array([[14.0]], np.float32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("idx", [slice(None, None, 0), (slice(None), slice(1, 3, 0))], ids=repr)
def test_getitem_step_zero(idx, device):
    a = _arr((3, 5), device)
    with pytest.raises(ValueError):
        a[idx]
    check_alive(device)
    np.testing.assert_array_equal(a[::2, 1].numpy(), np.array([[1.0], [11.0]], np.float32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "idx", [1.0, (0, 1.5), None, (None, 0), [0, 1], (slice(None), [1, 2]), "a"], ids=repr
)
def test_getitem_bad_index_type(idx, device):
    a = _arr((3, 5), device)
    with pytest.raises(TypeError):
        a[idx]
    check_alive(device)
    np.testing.assert_array_equal(a[1].numpy(), np.arange(5, 10, dtype=np.float32)[None])


@pytest.mark.parametrize("device", DEVICES)
def test_getitem_0d(device):
    s = nd.array(2.0, device=device)
    with pytest.raises(IndexError):
        s[0]
    check_alive(device)
    assert float(s[...].numpy()) == 2.0


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_errors(device):
    a = _arr((4, 5), device)
    orig = a.numpy()
    with pytest.raises(ValueError):
        a[0:2] = nd.array(np.ones((3, 5), np.float32), device=device)
    with pytest.raises(ValueError):
        a[1, :] = np.ones((2, 5), np.float32)
    with pytest.raises(ValueError):
        a[:, 1:3] = [1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        a[...] = nd.array(np.ones((4, 5, 2), np.float32), device=device)
    with pytest.raises(IndexError):
        a[4] = 1.0
    with pytest.raises(ValueError):
        a[::0] = 1.0
    with pytest.raises(TypeError):
        a[0.5] = 1.0
    # the failed assignments left the data untouched
    np.testing.assert_array_equal(a.numpy(), orig)
    check_alive(device)
    a[1:3, 0] = 9.0
    orig[1:3, 0] = 9.0
    np.testing.assert_array_equal(a.numpy(), orig)


# --------------------------------------------------------------------------
# elementwise / broadcasting
# --------------------------------------------------------------------------


BAD_SHAPE_PAIRS = [
    ((3,), (4,)),
    ((2, 3), (3, 2)),
    ((2, 3, 4), (3, 2)),
    ((0,), (2,)),
    ((5, 2), (5,)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sa,sb", BAD_SHAPE_PAIRS, ids=str)
def test_binary_incompatible_shapes(sa, sb, device):
    a = _arr(sa, device)
    b = _arr(sb, device)
    ops = [
        lambda: a + b,
        lambda: a - b,
        lambda: a * b,
        lambda: a / b,
        lambda: a**b,
        lambda: a.maximum(b),
        lambda: nd.maximum(a, b),
        lambda: a == b,
        lambda: a != b,
        lambda: a >= b,
        lambda: a > b,
        lambda: a <= b,
        lambda: a < b,
        lambda: b + a,
    ]
    for i, op in enumerate(ops):
        with pytest.raises(ValueError):
            op()
        check_alive(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", ["x", None, {}, object()], ids=lambda v: type(v).__name__)
def test_binary_bad_operand_type(bad, device):
    a = _arr((2, 3), device)
    ops = [
        lambda: a + bad,
        lambda: a - bad,
        lambda: a * bad,
        lambda: a / bad,
        lambda: a**bad,
        lambda: bad - a,
        lambda: bad * a,
        lambda: bad / a,
        lambda: a < bad,
        lambda: a <= bad,
        lambda: a > bad,
        lambda: a >= bad,
        lambda: a.maximum(bad),
        lambda: nd.maximum(a, bad),
        lambda: bad + a,
    ]
    for op in ops:
        with pytest.raises(TypeError):
            op()
        check_alive(device)
    np.testing.assert_array_equal((a + 1).numpy(), np.arange(1, 7, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_to_errors(device):
    a = _arr((3, 1), device)
    for shape in [(4, 2), (3,), (2, 4, 2), (0,)]:
        with pytest.raises(ValueError):
            a.broadcast_to(shape)
        check_alive(device)
    with pytest.raises(ValueError):
        nd.broadcast_to(_arr((2,), device), (3,))
    check_alive(device)
    np.testing.assert_array_equal(
        a.broadcast_to((3, 2)).numpy(), np.array([[0, 0], [1, 1], [2, 2]], np.float32)
    )


# --------------------------------------------------------------------------
# reshape / permute / flip / as_strided / pad / stack
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_errors(device):
    a = _arr((3, 4), device)
    for shape in [(5,), (13,), (2, 5), (0,), (-1, 5), (-1, -1), (3, 4, 2)]:
        with pytest.raises(ValueError):
            a.reshape(shape)
        check_alive(device)
    with pytest.raises(ValueError):
        a.permute((1, 0)).reshape((5, 2))
    with pytest.raises(ValueError):
        nd.reshape(a, (7,))
    check_alive(device)
    assert a.reshape((2, 6)).shape == (2, 6)


@pytest.mark.parametrize("device", DEVICES)
def test_permute_errors(device):
    a = _arr((2, 3, 4), device)
    for axes in [(0, 0, 1), (0, 1), (0, 1, 2, 3), (0, 1, 3)]:
        with pytest.raises(ValueError):
            a.permute(axes)
        check_alive(device)
    assert a.permute((2, 1, 0)).shape == (4, 3, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_flip_errors(device):
    a = _arr((2, 3), device)
    for axes in [2, (0, 2), (0, 0)]:
        with pytest.raises(ValueError):
            a.flip(axes)
        check_alive(device)
    np.testing.assert_array_equal(
        a.flip(1).numpy(), np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::-1]
    )


@pytest.mark.parametrize("device", DEVICES)
def test_as_strided_out_of_bounds(device):
    a = _arr((12,), device)
    cases = [((13,), (1,)), ((4, 4), (4, 1)), ((2,), (12,)), ((2,), (-1,)), ((3, 5), (1, 3))]
    for shape, strides in cases:
        with pytest.raises(ValueError):
            a.as_strided(shape, strides)
        check_alive(device)
    b = a[2:]
    for shape, strides in [((11,), (1,)), ((4,), (-1,)), ((2, 2), (10, 1))]:
        with pytest.raises(ValueError):
            b.as_strided(shape, strides)
        check_alive(device)
    np.testing.assert_array_equal(
        b.as_strided((10,), (1,)).numpy(), np.arange(2, 12, dtype=np.float32)
    )


@pytest.mark.parametrize("device", DEVICES)
def test_pad_errors(device):
    a = _arr((2, 3), device)
    for axes in [((1, 1),), ((1, 1), (1, 1), (1, 1)), ((-1, 0), (0, 0)), ((0, 0), (0, -2))]:
        with pytest.raises(ValueError):
            a.pad(axes)
        check_alive(device)
    np.testing.assert_array_equal(
        a.pad(((1, 0), (0, 1))).numpy(),
        np.pad(np.arange(6, dtype=np.float32).reshape(2, 3), ((1, 0), (0, 1))),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_stack_errors(device):
    with pytest.raises(ValueError):
        nd.stack([_arr((2, 3), device), _arr((3, 2), device)])
    check_alive(device)
    with pytest.raises(ValueError):
        nd.stack([_arr((2,), device), _arr((2, 1), device)], axis=0)
    check_alive(device)
    with pytest.raises(ValueError):
        nd.stack([])
    check_alive(device)
    r = nd.stack([_arr((2,), device), _arr((2,), device)], axis=1)
    np.testing.assert_array_equal(r.numpy(), np.array([[0, 0], [1, 1]], np.float32))


# --------------------------------------------------------------------------
# reductions
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reduction_bad_axis(op, device):
    a = _arr((2, 3, 4), device)
    f = getattr(a, op)
    for axis in [3, -4, (0, 0), (1, -2), (0, 3), [2, 2], 10]:
        with pytest.raises(ValueError):
            f(axis=axis)
        check_alive(device)
        with pytest.raises(ValueError):
            f(axis=axis, keepdims=True)
        check_alive(device)
    s = nd.array(1.0, device=device)
    with pytest.raises(ValueError):
        getattr(s, op)(axis=0)
    check_alive(device)
    assert f(axis=1).shape == (2, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_module_reduction_bad_axis(device):
    a = _arr((2, 3), device)
    with pytest.raises(ValueError):
        nd.sum(a, axis=2)
    with pytest.raises(ValueError):
        nd.max(a, axis=(1, 1))
    check_alive(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_of_empty_extent(op, device):
    z = nd.array(np.zeros((3, 0, 2), np.float32), device=device)
    e = nd.array(np.zeros((0,), np.float32), device=device)
    cases = [
        (z, dict()),
        (z, dict(axis=1)),
        (z, dict(axis=(1, 2))),
        (z, dict(axis=None, keepdims=True)),
        (e, dict()),
        (e, dict(axis=0)),
        (e, dict(axis=0, keepdims=True)),
    ]
    for arr, kw in cases:
        with pytest.raises(ValueError):
            getattr(arr, op)(**kw)
        check_alive(device)
    with pytest.raises(ValueError):
        nd.max(e)
    check_alive(device)
    # a reduction over a non-empty extent with an empty output is fine
    assert getattr(z, op)(axis=0).shape == (0, 2)


# --------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_errors(device):
    a = _arr((3, 4), device)
    for b in [
        _arr((3, 4), device),
        _arr((5,), device),
        _arr((2, 5, 3), device),
        _arr((2, 4, 3), device).permute((0, 2, 1)),
    ]:
        with pytest.raises(ValueError):
            a @ b
        check_alive(device)
        with pytest.raises(ValueError):
            nd.matmul(a, b)
        check_alive(device)
    # incompatible batch dims
    with pytest.raises(ValueError):
        _arr((2, 3, 4), device) @ _arr((3, 4, 5), device)
    check_alive(device)
    # 0-d operands
    s = nd.array(2.0, device=device)
    for x, y in [(s, a), (a, s), (s, s)]:
        with pytest.raises(ValueError):
            x @ y
        check_alive(device)
        with pytest.raises(ValueError):
            x.matmul(y)
        check_alive(device)
    # non-NDArray operands
    for bad in [3, 2.5, "x", None, [[1.0], [2.0], [3.0], [4.0]], np.ones((4, 2), np.float32)]:
        with pytest.raises(TypeError):
            nd.matmul(a, bad)
        check_alive(device)
        with pytest.raises(TypeError):
            a.matmul(bad)
        check_alive(device)
    for bad in [3, 2.5, "x", None]:
        with pytest.raises(TypeError):
            a @ bad
        check_alive(device)
    r = a @ _arr((4, 2), device)
    np.testing.assert_array_equal(
        r.numpy(),
        np.arange(12, dtype=np.float32).reshape(3, 4)
        @ np.arange(8, dtype=np.float32).reshape(4, 2),
    )


# --------------------------------------------------------------------------
# dtypes and dims
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,kw",
    [
        (np.ones(3), dict(dtype="int64")),
        ([1.0, 2.0], dict(dtype="complex64")),
        ([1.0, 2.0], dict(dtype="int32")),
        (np.ones(3, dtype=np.complex64), {}),
        (np.ones(3, dtype=np.complex128), {}),
        (np.array([1, "a"], dtype=object), {}),
        (np.array([1.0, 2.0], dtype=object), {}),
        (np.array(["a", "b"]), {}),
        (np.array([b"a"]), {}),
        ("abc", {}),
        ([1.0, "x"], {}),
        (1 + 2j, {}),
        ([1j, 2.0], {}),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, dict) else str(v),
)
def test_unsupported_dtypes(src, kw):
    with pytest.raises(TypeError):
        nd.array(src, **kw)
    check_alive()
    with pytest.raises(TypeError):
        nd.NDArray(src, device=nd.cpu()) if not kw else nd.array(src, device=nd.cpu(), **kw)
    check_alive()


def test_unsupported_dtype_in_factories():
    with pytest.raises(TypeError):
        nd.empty((2,), dtype="int64")
    check_alive()
    with pytest.raises(TypeError):
        nd.full((2,), 1.0, dtype="int8")
    check_alive()
    with pytest.raises(TypeError):
        nd.cpu().empty((2,), dtype="uint8")
    check_alive()
    with pytest.raises(TypeError):
        nd.cpu().rand(2, dtype="int64")
    check_alive()


def test_too_many_dims():
    with pytest.raises(ValueError):
        nd.empty((1,) * 17)
    check_alive()
    with pytest.raises(ValueError):
        nd.full((1,) * 17, 1.0)
    check_alive()
    with pytest.raises(ValueError):
        nd.array(np.zeros((1,) * 17, np.float32))
    check_alive()
    a = nd.array(np.zeros((2,), np.float32))
    with pytest.raises(ValueError):
        a.reshape((1,) * 16 + (2,))
    check_alive()
    with pytest.raises(ValueError):
        a.broadcast_to((1,) * 16 + (2,))
    check_alive()
    with pytest.raises(ValueError):
        nd.stack([nd.empty((1,) * 16)] * 2)
    check_alive()
    b = nd.array(np.ones((1,) * 16, np.float32))
    assert b.ndim == 16
    np.testing.assert_array_equal((b + b).numpy(), np.full((1,) * 16, 2.0, np.float32))


# --------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------


def test_mixing_cpu_and_cpu_numpy_raises_device_error():
    a = nd.array(np.ones((2, 2), np.float32), device=nd.cpu())
    b = nd.array(np.ones((2, 2), np.float32), device=nd.cpu_numpy())
    ops = [
        lambda: a + b,
        lambda: b + a,
        lambda: a - b,
        lambda: a * b,
        lambda: a / b,
        lambda: a**b,
        lambda: a.maximum(b),
        lambda: nd.maximum(a, b),
        lambda: a == b,
        lambda: a < b,
        lambda: a @ b,
        lambda: nd.matmul(b, a),
        lambda: nd.stack([a, b]),
    ]
    for op in ops:
        with pytest.raises(ndl.DeviceError):
            op()
        check_alive()
        check_alive(nd.cpu_numpy())
    with pytest.raises(ndl.DeviceError):
        a[0] = b[1]
    check_alive()
    np.testing.assert_array_equal(a.numpy(), np.ones((2, 2), np.float32))
    # after moving, the op works
    np.testing.assert_array_equal((a + b.to(nd.cpu())).numpy(), np.full((2, 2), 2.0, np.float32))


@pytest.mark.skipif(nd.cuda().enabled(), reason="CUDA is enabled on this machine")
def test_cuda_disabled_raises_device_error():
    assert nd.cuda().enabled() is False
    with pytest.raises(ndl.DeviceError):
        nd.array([1.0, 2.0], device=nd.cuda())
    check_alive()
    with pytest.raises(ndl.DeviceError):
        nd.empty((2, 3), device=nd.cuda())
    check_alive()
    with pytest.raises(ndl.DeviceError):
        nd.full((2,), 1.0, device=nd.cuda())
    check_alive()
    with pytest.raises(ndl.DeviceError):
        nd.cuda().empty((2,))
    check_alive()
    with pytest.raises(ndl.DeviceError):
        nd.cuda().full((2,), 3.0)
    check_alive()
    with pytest.raises(ndl.DeviceError):
        nd.NDArray(np.ones(3), device=nd.cuda())
    check_alive()
    a = nd.array([1.0, 2.0])
    with pytest.raises(ndl.DeviceError):
        a.to(nd.cuda())
    check_alive()
    np.testing.assert_array_equal(a.numpy(), np.array([1.0, 2.0], np.float32))
