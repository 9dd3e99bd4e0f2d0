"""Malformed-input sweep of the NDArray layer (issue 11): construction, views, indexing,
assignment, elementwise ops, reductions, matmul, stack and devices.

Every case makes one malformed call on a (3, 4) array, expects the documented exception
(ValueError for shapes, axes and values, TypeError for argument types, IndexError for indices,
needle.DeviceError for mixed devices, needle.OutOfMemoryError for sizes no device holds), then
checks that the array still works and that the device's allocated bytes are unchanged.
"""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES
from malformed import case, run_case

NAN = float("nan")
INF = float("inf")
BIG = 2**62  # elements: the byte count overflows 64 bits
HUGE = 2**40  # elements: 4 TiB, more than any device holds


def _other(a):
    """An array on a device that is not ``a``'s."""
    return nd.array([1.0, 2.0, 3.0, 4.0], device=nd.cpu_numpy())


def _set(a, idx, value):
    a[idx] = value


CONSTRUCTION = [
    case("array-str", lambda a: nd.array("abc", device=a.device), TypeError),
    case("array-bytes", lambda a: nd.array(b"abc", device=a.device), TypeError),
    case("array-object", lambda a: nd.array(object(), device=a.device), TypeError),
    case("array-list-of-str", lambda a: nd.array(["x", "y"], device=a.device), TypeError),
    case("array-ragged", lambda a: nd.array([[1.0, 2.0], [3.0]], device=a.device), ValueError),
    case("array-dtype-int32", lambda a: nd.array([1.0], dtype="int32"), TypeError),
    case("array-dtype-int32", lambda a: nd.array([1.0], dtype="int32"), TypeError),
    case("array-dtype-number", lambda a: nd.array([1.0], dtype=3), TypeError),
    case("array-dtype-np-int16", lambda a: nd.array([1.0], dtype=np.int16), TypeError),
    case("array-device-name", lambda a: nd.array([1.0], device="gpu9"), ValueError),
    case("array-device-int", lambda a: nd.array([1.0], device=3), TypeError),
    case("array-device-list", lambda a: nd.array([1.0], device=["cpu"]), TypeError),
    case("array-17-dims", lambda a: nd.array(np.zeros((1,) * 17, np.float32)), ValueError),
    case("ndarray-complex", lambda a: nd.NDArray(np.ones(2, np.complex64)), TypeError),
    case("empty-negative", lambda a: nd.empty((-1,), device=a.device), ValueError),
    case("empty-negative-inner", lambda a: nd.empty((2, -3), device=a.device), ValueError),
    case("empty-overflow", lambda a: nd.empty((BIG,), device=a.device), ValueError),
    case(
        "empty-overflow-product", lambda a: nd.empty((2**31, 2**31, 4), device=a.device), ValueError
    ),
    case("empty-huge", lambda a: nd.empty((HUGE,), device=a.device), ndl.OutOfMemoryError),
    case("empty-17-dims", lambda a: nd.empty((1,) * 17, device=a.device), ValueError),
    case("empty-dim-str", lambda a: nd.empty(("a",), device=a.device), TypeError),
    case("empty-dim-float", lambda a: nd.empty((2.5,), device=a.device), TypeError),
    case("empty-dim-nan", lambda a: nd.empty((NAN,), device=a.device), TypeError),
    case("empty-dim-inf", lambda a: nd.empty((INF, 2), device=a.device), TypeError),
    case("empty-shape-str", lambda a: nd.empty("abc", device=a.device), TypeError),
    case("empty-shape-object", lambda a: nd.empty(object(), device=a.device), TypeError),
    case("empty-dim-2**64", lambda a: nd.empty((2**64,), device=a.device), ValueError),
    case("empty-dtype", lambda a: nd.empty((2,), dtype="int8", device=a.device), TypeError),
    case("full-fill-str", lambda a: nd.full((2,), "x", device=a.device), TypeError),
    case("full-fill-none", lambda a: nd.full((2,), None, device=a.device), TypeError),
    case("full-fill-list", lambda a: nd.full((2,), [1.0], device=a.device), TypeError),
    case("full-negative", lambda a: nd.full((-2,), 1.0, device=a.device), ValueError),
    case("full-huge", lambda a: nd.full((HUGE,), 1.0, device=a.device), ndl.OutOfMemoryError),
    case("full-dtype", lambda a: nd.full((2,), 1.0, dtype="int8", device=a.device), TypeError),
    # A finite fill that the dtype cannot hold was stored as inf (issue 35).
    case(
        "full-fill-2**1000",
        lambda a: nd.full((2,), 2**1000, device=a.device),
        ValueError,
        "fill_value .* out of range for float32",
    ),
    case("full-fill-1e300", lambda a: nd.full((2,), 1e300, device=a.device), ValueError),
    # An int past float64's range was NumPy's OverflowError from the conversion (issue 35).
    case(
        "full-fill-2**2000",
        lambda a: nd.full((2,), 2**2000, dtype="float64", device=a.device),
        ValueError,
        "integer beyond float64's range",
    ),
    case(
        "fill-minus-2**2000",
        lambda a: a.fill(-(2**2000)),
        ValueError,
        "integer beyond float64's range",
    ),
    case(
        "full-fill-float16",
        lambda a: nd.full((2,), 1e5, dtype="float16", device=a.device),
        ValueError,
        "out of range for float16",
    ),
    case(
        "full-fill-bfloat16",
        lambda a: nd.full((2,), 3.4e38, dtype="bfloat16", device=a.device),
        ValueError,
        "out of range for bfloat16",
    ),
]

VIEWS = [
    case("reshape-size", lambda a: a.reshape((5,)), ValueError),
    case("reshape-two-minus-one", lambda a: a.reshape((-1, -1)), ValueError),
    case("reshape-minus-two", lambda a: a.reshape((-2, -6)), ValueError),
    case("reshape-zero-with-minus-one", lambda a: a.reshape((0, -1)), ValueError),
    case("reshape-17-dims", lambda a: a.reshape((12,) + (1,) * 16), ValueError),
    case("reshape-str", lambda a: a.reshape("ab"), TypeError),
    case("reshape-float-dim", lambda a: a.reshape((2.0, 6)), TypeError),
    case("reshape-nan-dim", lambda a: a.reshape((NAN, 6)), TypeError),
    case("reshape-none", lambda a: a.reshape(None), TypeError),
    case("reshape-overflow", lambda a: a.reshape((2**62, 2**62, 0)), ValueError),
    case("reshape-2**64", lambda a: a.reshape((2**64,)), ValueError),
    case("permute-too-few", lambda a: a.permute((0,)), ValueError),
    case("permute-repeated", lambda a: a.permute((0, 0)), ValueError),
    case("permute-out-of-range", lambda a: a.permute((0, 2)), ValueError),
    case("permute-too-many", lambda a: a.permute((0, 1, 2)), ValueError),
    case("permute-str-axis", lambda a: a.permute(("a", 1)), TypeError),
    case("permute-float-axis", lambda a: a.permute((0.0, 1)), TypeError),
    case("permute-nan-axis", lambda a: a.permute((NAN, 1)), TypeError),
    case("permute-int", lambda a: a.permute(3), ValueError),
    case("broadcast-incompatible", lambda a: a.broadcast_to((5, 4)), ValueError),
    case("broadcast-fewer-dims", lambda a: a.broadcast_to((4,)), ValueError),
    case("broadcast-negative", lambda a: a.broadcast_to((-1, 3, 4)), ValueError),
    case("broadcast-17-dims", lambda a: a.broadcast_to((1,) * 15 + (3, 4)), ValueError),
    case("broadcast-str", lambda a: a.broadcast_to("x"), TypeError),
    case("broadcast-huge", lambda a: a.broadcast_to((2**62, 2**62, 3, 4)), ValueError),
    case("module-broadcast-list", lambda a: nd.broadcast_to([1.0], (2,)), TypeError),
    case("module-reshape-none", lambda a: nd.reshape(None, (2,)), TypeError),
    case("as-strided-length", lambda a: a.as_strided((3, 4), (4,)), ValueError),
    case("as-strided-out-of-bounds", lambda a: a.as_strided((13,), (1,)), ValueError),
    case("as-strided-huge-stride", lambda a: a.as_strided((3, 4), (2**62, 1)), ValueError),
    case("as-strided-negative-shape", lambda a: a.as_strided((-3, 4), (4, 1)), ValueError),
    case("as-strided-str-stride", lambda a: a.as_strided((3, 4), ("a", 1)), TypeError),
    case("as-strided-float-stride", lambda a: a.as_strided((3, 4), (4.0, 1)), TypeError),
    case("as-strided-17-dims", lambda a: a.as_strided((1,) * 17, (0,) * 17), ValueError),
    case("as-strided-none", lambda a: a.as_strided(None, None), TypeError),
    case("flip-axis-range", lambda a: a.flip((2,)), ValueError),
    case("flip-negative-range", lambda a: a.flip((-3,)), ValueError),
    case("flip-str", lambda a: a.flip("x"), TypeError),
    case("flip-float", lambda a: a.flip((1.0,)), TypeError),
    case("pad-too-few", lambda a: a.pad(((0, 0),)), ValueError),
    case("pad-too-many", lambda a: a.pad(((0, 0), (0, 0), (0, 0))), ValueError),
    case("pad-negative", lambda a: a.pad(((-1, 0), (0, 0))), ValueError),
    case("pad-single", lambda a: a.pad(((1,), (0, 0))), ValueError),
    case("pad-str", lambda a: a.pad("x"), ValueError),
    case("pad-str-pairs", lambda a: a.pad(("ab", "cd")), TypeError),
    case("pad-none", lambda a: a.pad(None), TypeError),
    case("pad-float", lambda a: a.pad(((0.5, 0), (0, 0))), TypeError),
    case("pad-overflow", lambda a: a.pad(((BIG, 0), (0, 0))), ValueError),
    case("pad-huge", lambda a: a.pad(((HUGE, 0), (0, 0))), ndl.OutOfMemoryError),
    case("compact-then-reshape-bad", lambda a: a.permute((1, 0)).reshape((7,)), ValueError),
]

INDEXING = [
    case("get-row-range", lambda a: a[3], IndexError),
    case("get-negative-range", lambda a: a[-4], IndexError),
    case("get-col-range", lambda a: a[0, 4], IndexError),
    case("get-too-many", lambda a: a[0, 0, 0], IndexError),
    case("get-two-ellipses", lambda a: a[..., ..., 0], IndexError),
    case("get-2**70", lambda a: a[2**70], IndexError),
    case("get-float", lambda a: a[1.0], TypeError),
    case("get-nan", lambda a: a[NAN], TypeError),
    case("get-str", lambda a: a["x"], TypeError),
    case("get-object", lambda a: a[object()], TypeError),
    case("get-float-slice", lambda a: a[0:1.5], TypeError),
    case("get-str-slice", lambda a: a[:"x"], TypeError),
    case("get-step-zero", lambda a: a[::0], ValueError),
    case("get-tuple-float", lambda a: a[0, 1.0], TypeError),
    case("set-row-range", lambda a: _set(a, 5, 1.0), IndexError),
    case("set-str-value", lambda a: _set(a, 0, "x"), TypeError),
    case("set-none-value", lambda a: _set(a, 0, None), TypeError),
    case("set-object-value", lambda a: _set(a, 0, object()), TypeError),
    case("set-shape", lambda a: _set(a, 0, nd.array([1.0] * 5, device=a.device)), ValueError),
    case("set-numpy-shape", lambda a: _set(a, 0, np.ones(5, np.float32)), ValueError),
    case("set-str-index", lambda a: _set(a, "x", 1.0), TypeError),
    case("set-float-index", lambda a: _set(a, 1.5, 1.0), TypeError),
    case("set-step-zero", lambda a: _set(a, slice(None, None, 0), 1.0), ValueError),
    case("set-other-device", lambda a: _set(a, (0, slice(None)), _other(a)), ndl.DeviceError),
    case("fill-str", lambda a: a.fill("x"), TypeError),
    case("fill-none", lambda a: a.fill(None), TypeError),
]

OPS = [
    case("add-shape", lambda a: a + nd.empty((5,), device=a.device), ValueError),
    case("mul-shape", lambda a: a * nd.empty((2, 4), device=a.device), ValueError),
    case("add-str", lambda a: a + "x", TypeError),
    case("add-none", lambda a: a + None, TypeError),
    case("add-object", lambda a: a + object(), TypeError),
    case("sub-list", lambda a: a - [1.0, 2.0], TypeError),
    case("div-str", lambda a: a / "x", TypeError),
    case("pow-str", lambda a: a ** "x", TypeError),
    case("pow-shape", lambda a: a ** nd.empty((5,), device=a.device), ValueError),
    case("maximum-str", lambda a: a.maximum("x"), TypeError),
    case("minimum-shape", lambda a: a.minimum(nd.empty((7,), device=a.device)), ValueError),
    case("module-power-str", lambda a: nd.power("x", 2), TypeError),
    case("module-exp-list", lambda a: nd.exp([1.0]), TypeError),
    case("module-maximum-none", lambda a: nd.maximum(None, a), TypeError),
    case("eq-shape", lambda a: a == nd.empty((5,), device=a.device), ValueError),
    case("add-other-device", lambda a: a + _other(a), ndl.DeviceError),
    case("sum-axis-range", lambda a: a.sum(axis=2), ValueError),
    case("sum-axis-negative", lambda a: a.sum(axis=-3), ValueError),
    case("sum-axis-repeated", lambda a: a.sum(axis=(0, 0)), ValueError),
    case("sum-axis-repeated-negative", lambda a: a.sum(axis=(1, -1)), ValueError),
    case("sum-axis-str", lambda a: a.sum(axis="x"), TypeError),
    case("sum-axis-float", lambda a: a.sum(axis=1.0), TypeError),
    case("sum-axis-nan", lambda a: a.sum(axis=NAN), TypeError),
    case("sum-axis-tuple-range", lambda a: a.sum(axis=(0, 5)), ValueError),
    case("sum-axis-list-str", lambda a: a.sum(axis=[0, "a"]), TypeError),
    case("sum-axis-2**64", lambda a: a.sum(axis=2**64), ValueError),
    case("max-axis-range", lambda a: a.max(axis=2), ValueError),
    case("max-axis-repeated", lambda a: a.max(axis=(1, 1)), ValueError),
    case("min-axis-negative", lambda a: a.min(axis=-3), ValueError),
    case("max-empty-extent", lambda a: nd.empty((0, 3), device=a.device).max(axis=0), ValueError),
    case("module-sum-axis", lambda a: nd.sum(a, axis=(3,)), ValueError),
    case("matmul-shapes", lambda a: a @ a, ValueError),
    case("matmul-vector", lambda a: a @ nd.empty((5,), device=a.device), ValueError),
    case(
        "matmul-batch",
        lambda a: nd.empty((2, 3, 4), device=a.device) @ nd.empty((3, 4, 2), device=a.device),
        ValueError,
    ),
    case("matmul-int", lambda a: a @ 3, TypeError),
    case("matmul-str", lambda a: a @ "x", TypeError),
    case("matmul-none", lambda a: a.matmul(None), TypeError),
    case("matmul-0d", lambda a: a @ nd.array(np.float32(1.0), device=a.device), ValueError),
    case("matmul-other-device", lambda a: a.reshape((3, 4)) @ _other(a), ndl.DeviceError),
    case("module-matmul-list", lambda a: nd.matmul(a, [[1.0]]), TypeError),
    case("stack-shapes", lambda a: nd.stack([a, a.reshape((4, 3))]), ValueError),
    case("stack-empty", lambda a: nd.stack([]), ValueError),
    case("stack-number", lambda a: nd.stack([a, 1]), TypeError),
    case("stack-axis-range", lambda a: nd.stack([a, a], axis=5), ValueError),
    case("stack-axis-float", lambda a: nd.stack([a, a], axis=1.5), TypeError),
    case("stack-not-sequence", lambda a: nd.stack(5), TypeError),
    case("stack-17-dims", lambda a: nd.stack([a.reshape((12,) + (1,) * 15)] * 2), ValueError),
    case(
        "stack-other-device", lambda a: nd.stack([a.reshape((12,))[:4], _other(a)]), ndl.DeviceError
    ),
    case("to-name", lambda a: a.to("gpu9"), ValueError),
    case("to-int", lambda a: a.to(5), TypeError),
    case("to-none-str", lambda a: a.to("cuda:x"), ValueError),
]

EXPECTED = np.arange(12, dtype=np.float32).reshape(3, 4)


def _subject(device):
    return nd.array(EXPECTED, device=device)


def _normal(a):
    np.testing.assert_array_equal(a.numpy(), EXPECTED)
    r = (a @ a.permute((1, 0))).sum(axis=1)
    np.testing.assert_array_equal(r.numpy(), (EXPECTED @ EXPECTED.T).sum(axis=1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", CONSTRUCTION + VIEWS)
def test_ndarray_construction_and_views(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", INDEXING + OPS)
def test_ndarray_indexing_and_ops(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)


@pytest.mark.skipif(ndl.cuda().enabled(), reason="checks the error without a GPU")
@pytest.mark.parametrize(
    "bad",
    [
        lambda: nd.array([1.0], device=nd.cuda()),
        lambda: nd.empty((2,), device=nd.cuda()),
        lambda: nd.array([1.0]).to(nd.cuda()),
        lambda: nd.array([1.0], device="cuda:1"),
    ],
    ids=["array", "empty", "to", "array-cuda-1"],
)
def test_ndarray_on_an_absent_gpu(bad):
    device = nd.cpu()
    run_case(lambda _: bad(), ndl.DeviceError, None, _subject(device), _normal, device)
