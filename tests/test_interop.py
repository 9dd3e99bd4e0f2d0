"""Zero-copy interop (needle_c/array/interop.c): DLPack export and import, the NumPy
array interface, and that shared memory is really shared (writes visible on
both sides) and released (no leaked storages, producers' arrays freed).
"""

import gc
import weakref

import numpy as np
import pytest

import needle as ndl
import needle.backend_ndarray as nd
from needle import memory

from devices import needs_cuda

_CUDA = ndl.cuda()


def _array(shape=(3, 4), device=None):
    size = int(np.prod(shape))
    return nd.array(np.arange(size, dtype=np.float32).reshape(shape), device=device)


# Views whose exports must keep their layout: name -> view of a (3, 4) array.
VIEWS = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.permute((1, 0)),
    "sliced": lambda a: a[1:, 1:3],
    "negative_step": lambda a: a[:, ::-2],
    "flipped": lambda a: a.flip((0, 1)),
    "broadcast": lambda a: a[0:1, :].broadcast_to((5, 4)),
}


# ------------------------------------------------------------ export


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_numpy_from_dlpack_shares_memory(name):
    base = _array()
    view = VIEWS[name](base)
    exported = np.from_dlpack(view)
    np.testing.assert_array_equal(exported, view.numpy())
    # A write through needle shows in NumPy's array.
    base[...] = -1.0
    assert (exported == -1.0).all()
    if name != "broadcast":
        exported[0, 0] = 42.0
        assert view.numpy()[0, 0] == 42.0


@pytest.mark.parametrize("name", ["contiguous", "transposed", "sliced", "negative_step"])
def test_setitem_on_view_visible_in_numpy(name):
    base = _array()
    view = VIEWS[name](base)
    exported = np.from_dlpack(view)
    view[0, 0] = 7.0
    assert exported[0, 0] == 7.0
    np.testing.assert_array_equal(exported, view.numpy())


def test_dlpack_keeps_storage_alive():
    a = _array()
    refs = a._storage_refcount
    exported = np.from_dlpack(a[1:, :])
    assert a._storage_refcount == refs + 1  # the export (the slice itself is gone)
    del a
    gc.collect()
    np.testing.assert_array_equal(exported, np.arange(4, 12, dtype=np.float32).reshape(2, 4))


def test_unconsumed_capsule_releases_storage():
    a = _array()
    refs = a._storage_refcount
    capsule = a.__dlpack__()
    assert a._storage_refcount == refs + 1
    del capsule
    assert a._storage_refcount == refs


def test_dlpack_copy_true_does_not_share():
    a = _array()
    copied = nd.from_dlpack(a.__dlpack__(copy=True))
    a[0, 0] = 99.0
    assert copied.numpy()[0, 0] == 0.0


def test_dlpack_device():
    assert _array().__dlpack_device__() == (1, 0)
    assert _array(device=nd.cpu_numpy()).__dlpack_device__() == (1, 0)
    t = ndl.Tensor(np.ones((2, 2), np.float32))
    assert t.__dlpack_device__() == (1, 0)


def test_dlpack_device_mismatch_is_buffer_error():
    with pytest.raises(BufferError):
        _array().__dlpack__(dl_device=(2, 0))


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_array_interface(name):
    base = _array()
    view = VIEWS[name](base)
    arr = np.asarray(view)
    np.testing.assert_array_equal(arr, view.numpy())
    assert arr.dtype == np.float32
    base[...] = 5.0
    assert (arr == 5.0).all()
    iface = view.__array_interface__
    assert iface["typestr"] == "<f4" and iface["version"] == 3
    assert iface["shape"] == view.shape
    if view.is_compact():
        assert iface["strides"] is None
    else:
        assert iface["strides"] == tuple(4 * s for s in view.strides)


def test_array_interface_keeps_array_alive():
    a = _array()
    arr = np.asarray(a)
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is not None  # NumPy holds the NDArray that provided the interface
    np.testing.assert_array_equal(arr.ravel(), np.arange(12, dtype=np.float32))
    del arr
    gc.collect()
    assert ref() is None


def test_cuda_array_interface_absent_on_cpu():
    with pytest.raises(AttributeError):
        _array().__cuda_array_interface__
    assert not hasattr(_array(), "__cuda_array_interface__")


def test_tensor_dlpack():
    t = ndl.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=False)
    exported = np.from_dlpack(t)
    np.testing.assert_array_equal(exported, t.numpy())
    t.cached_data[0, 0] = 11.0
    assert exported[0, 0] == 11.0


# ------------------------------------------------------------ import


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x,
        lambda x: x.T,
        lambda x: x[1:, 1:3],
        lambda x: x[::-1, ::-2],
    ],
    ids=["contiguous", "transposed", "sliced", "negative_step"],
)
def test_from_dlpack_numpy_shares_memory(make):
    src = make(np.arange(12, dtype=np.float32).reshape(3, 4))
    a = nd.from_dlpack(src)
    assert isinstance(a, nd.NDArray)
    assert a.shape == src.shape
    np.testing.assert_array_equal(a.numpy(), src)
    src[0, 0] = 123.0
    assert a.numpy()[0, 0] == 123.0
    a[1, 1] = -5.0
    assert src[1, 1] == -5.0


def test_from_dlpack_keeps_numpy_alive_and_releases_it():
    src = np.arange(6, dtype=np.float32)
    base_ref = weakref.ref(src)
    a = nd.from_dlpack(src)
    del src
    gc.collect()
    assert base_ref() is not None
    a[2] = 99.0
    np.testing.assert_array_equal(a.numpy(), [0, 1, 99, 3, 4, 5])
    view = a[1:4]
    del a
    gc.collect()
    assert base_ref() is not None  # a view still uses the memory
    np.testing.assert_array_equal(view.numpy(), [1, 99, 3])
    del view
    gc.collect()
    assert base_ref() is None


def test_from_dlpack_capsule_and_consumption():
    src = np.ones(4, dtype=np.float32)
    capsule = src.__dlpack__()
    a = nd.from_dlpack(capsule)
    np.testing.assert_array_equal(a.numpy(), src)
    with pytest.raises(ValueError):
        nd.from_dlpack(capsule)  # renamed "used_dltensor"


def test_from_dlpack_round_trip_needle():
    a = _array()
    b = nd.from_dlpack(a.permute((1, 0)))
    a[0, 1] = 50.0
    assert b.numpy()[1, 0] == 50.0


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_])
def test_from_dlpack_rejects_other_dtypes(dtype):
    with pytest.raises(TypeError, match="float32, float16, bfloat16 or float64"):
        nd.from_dlpack(np.zeros(3, dtype=dtype))


def test_from_dlpack_rejects_non_dlpack():
    with pytest.raises(TypeError):
        nd.from_dlpack([1.0, 2.0])


def test_from_dlpack_zero_dim_and_empty():
    a = nd.from_dlpack(np.array(3.5, dtype=np.float32))
    assert a.shape == () and float(a.numpy()) == 3.5
    e = nd.from_dlpack(np.zeros((0, 4), dtype=np.float32))
    assert e.shape == (0, 4)


def test_from_dlpack_ops_on_imported_array():
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = nd.from_dlpack(src)
    np.testing.assert_allclose((a * 2 + 1).numpy(), src * 2 + 1)
    np.testing.assert_allclose((a @ a.permute((1, 0))).numpy(), src @ src.T)


def test_needle_from_dlpack_tensor():
    src = np.arange(4, dtype=np.float32)
    t = ndl.from_dlpack(src, requires_grad=True)
    assert isinstance(t, ndl.Tensor) and t.requires_grad
    src[0] = 10.0
    assert t.numpy()[0] == 10.0
    (t * t).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), 2 * src)


def test_from_dlpack_to_other_device_copies():
    src = np.ones(3, dtype=np.float32)
    a = nd.from_dlpack(src, device=nd.cpu_numpy())
    assert a.device == nd.cpu_numpy()
    src[0] = 2.0
    assert a.numpy()[0] == 1.0


# ------------------------------------------------------------ leaks


def test_no_leaks():
    gc.collect()
    baseline = memory.memory_allocated(nd.cpu())
    for _ in range(20):
        a = _array((64, 64))
        exported = np.from_dlpack(a.permute((1, 0)))
        arr = np.asarray(a)
        capsule = a.__dlpack__()
        del a, exported, arr, capsule
    gc.collect()
    assert memory.memory_allocated(nd.cpu()) == baseline

    # Imported memory is not the allocator's, and is given back to NumPy.
    src = np.zeros((256, 256), dtype=np.float32)
    ref = weakref.ref(src)
    a = nd.from_dlpack(src)
    del src
    assert memory.memory_allocated(nd.cpu()) == baseline
    b = np.from_dlpack(a)  # re-export: a chain back to NumPy's memory
    del a
    gc.collect()
    assert ref() is not None
    del b
    gc.collect()
    assert ref() is None
    assert memory.memory_allocated(nd.cpu()) == baseline


# ------------------------------------------------------------ PyTorch


def test_torch_round_trip():
    torch = pytest.importorskip("torch")
    a = _array()
    t = torch.from_dlpack(a)
    assert t.dtype == torch.float32 and tuple(t.shape) == a.shape
    t[0, 0] = 77.0
    assert a.numpy()[0, 0] == 77.0
    a[1, 1] = -3.0
    assert t[1, 1].item() == -3.0
    tt = torch.from_dlpack(a.permute((1, 0)))
    assert tt.stride() == (1, 4)
    np.testing.assert_array_equal(tt.numpy(), a.numpy().T)

    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    n = ndl.from_dlpack(src)
    assert isinstance(n, ndl.Tensor)
    src[2, 3] = 100.0
    assert n.numpy()[2, 3] == 100.0
    n.cached_data[0, 0] = -1.0
    assert src[0, 0].item() == -1.0
    view = nd.from_dlpack(src.t()[1:])
    np.testing.assert_array_equal(view.numpy(), src.t()[1:].numpy())
    tn = torch.from_dlpack(n)  # Tensor.__dlpack__
    assert tn.data_ptr() == src.data_ptr()


def test_torch_rejects_other_dtypes():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="got int64"):
        nd.from_dlpack(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(TypeError, match="got complex64"):
        nd.from_dlpack(torch.zeros(2, dtype=torch.complex64))


def test_torch_memory_released():
    torch = pytest.importorskip("torch")
    gc.collect()
    baseline = memory.memory_allocated(nd.cpu())
    a = _array((32, 32))
    refs = a._storage_refcount
    t = torch.from_dlpack(a)
    assert a._storage_refcount == refs + 1
    del t
    gc.collect()
    assert a._storage_refcount == refs
    del a
    assert memory.memory_allocated(nd.cpu()) == baseline


# ------------------------------------------------------------ CUDA


# ---------------------------------------------------------- DLPack streams

# (stream, exception) that no device accepts: the protocol's types and values.
BAD_STREAMS = [
    ("1", TypeError),
    (1.0, TypeError),
    (True, TypeError),
    (0, ValueError),  # ambiguous between None, 1 and 2: forbidden
    (-2, ValueError),
    (2**80, ValueError),
]


@pytest.mark.parametrize("stream, error", BAD_STREAMS, ids=[repr(s) for s, _ in BAD_STREAMS])
@pytest.mark.parametrize(
    "device",
    [pytest.param(ndl.cpu(), id="cpu")] + [pytest.param(_CUDA, marks=needs_cuda, id="cuda")],
)
def test_dlpack_rejects_bad_streams(device, stream, error):
    a = _array(device=device)
    with pytest.raises(error, match="stream"):
        a.__dlpack__(stream=stream)
    t = ndl.Tensor(a, device=device)
    with pytest.raises(error, match="stream"):
        t.__dlpack__(stream=stream)
    # the array is untouched and exports normally afterwards
    np.testing.assert_array_equal(np.asarray(nd.from_dlpack(a.__dlpack__()).numpy()), a.numpy())


@pytest.mark.parametrize("stream", [1, 2, -1, 12345])
def test_cpu_dlpack_accepts_only_stream_none(stream):
    a = _array()
    with pytest.raises(BufferError, match="stream must be None"):
        a.__dlpack__(stream=stream)
    np.testing.assert_array_equal(np.from_dlpack(a), a.numpy())


def _cuda_test(fn):
    """Marks a test cuda and skips it, with the reason, without a usable GPU."""
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


@_cuda_test
def test_cuda_dlpack_device_and_interfaces():
    a = _array(device=_CUDA)
    assert a.__dlpack_device__() == (2, _CUDA.index)
    iface = a.__cuda_array_interface__
    # v3: the stream consumers order their work after: needle's current one (not the legacy
    # default stream, 1: needle's own stream is non-blocking).
    assert iface["version"] == 3 and iface["typestr"] == "<f4"
    assert iface["stream"] == ndl.cuda.current_stream().cuda_stream not in (0, 1, 2)
    side = ndl.cuda.Stream()
    with ndl.cuda.stream(side):
        assert a.__cuda_array_interface__["stream"] == side.cuda_stream
    assert iface["shape"] == (3, 4) and iface["strides"] is None
    with pytest.raises(AttributeError):
        a.__array_interface__
    # NumPy falls back to __array__ (a copy through the host).
    np.testing.assert_array_equal(np.asarray(a), np.arange(12, dtype=np.float32).reshape(3, 4))


@_cuda_test
def test_cuda_from_dlpack_round_trip():
    a = _array(device=_CUDA)
    b = nd.from_dlpack(a.permute((1, 0)))
    assert b.device == a.device
    a[0, 1] = 9.0
    assert b.numpy()[1, 0] == 9.0


@_cuda_test
def test_cuda_torch_round_trip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    a = _array(device=_CUDA)
    t = torch.from_dlpack(a)
    assert t.is_cuda
    t[0, 0] = 5.0
    torch.cuda.synchronize()
    assert a.numpy()[0, 0] == 5.0
    src = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    n = nd.from_dlpack(src)
    assert n.device == _CUDA
    n[1, 2] = -1.0
    assert src[1, 2].item() == -1.0


@_cuda_test
@pytest.mark.parametrize("stream", [None, 1, 2, -1])
def test_cuda_dlpack_special_streams(stream):
    a = _array(device=_CUDA) * 2.0
    b = nd.from_dlpack(a.__dlpack__(stream=stream))
    np.testing.assert_array_equal(b.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4) * 2)


@_cuda_test
def test_cuda_dlpack_orders_torch_side_streams():
    """torch on a non-blocking stream reads what needle wrote (export: the stream waits for
    needle's kernels), and a block released by torch is reused by needle only after
    torch's queued work on it (release: needle's stream waits for torch's)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    side = torch.cuda.Stream()  # non-blocking: no implicit order with needle's stream
    n = 1 << 24
    for _ in range(3):
        x = nd.array(np.ones(n, dtype=np.float32), device=_CUDA)
        x = (x * 3.0).exp().log()  # kernels queued on needle's stream
        with torch.cuda.stream(side):
            t = torch.from_dlpack(x)  # passes side's handle as stream=
            total = (t * 2.0).sum()
            slow = t.view(-1, 1024) @ t.view(1024, -1)[:, :256]  # keep side busy
        del t, x
        y = nd.array(np.full(n, -5.0, dtype=np.float32), device=_CUDA)  # may reuse the block
        side.synchronize()
        assert abs(total.item() - 6.0 * n) <= 1e-3 * 6.0 * n
        assert slow.shape == (n // 1024, 256)
        assert float(y.numpy()[0]) == -5.0
