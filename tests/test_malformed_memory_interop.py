"""Malformed-input sweep of ``needle.memory``, ``needle.cuda`` and DLPack interop (issue 11):
limits, sizes and policy values (NaN and infinities included), device names, and producers
and consumers that break the DLPack protocol or hold other dtypes than float32.

Every case makes one malformed call beside a (3, 4) array, expects the documented exception
(ValueError, TypeError, needle.DeviceError, needle.OutOfMemoryError for a limit exceeded,
BufferError for an export to another device), then checks that the array still works, that the
device's allocated bytes are unchanged and that no limit or policy value was left changed.
"""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd
from needle import memory

from devices import DEVICES
from malformed import case, run_case

NAN = float("nan")
INF = float("inf")
NO_GPU = pytest.mark.skipif(ndl.cuda().enabled(), reason="checks the error without a GPU")


def _limit(a, limit):
    memory.set_memory_limit(a.device, limit)


def _over_limit(a):
    """An allocation past a 1 KiB limit on cpu_numpy (whose accounting no other test reads)."""
    dev = nd.cpu_numpy()
    previous = memory.get_memory_limit(dev)
    memory.set_memory_limit(dev, "1KiB")
    try:
        nd.empty((1024,), device=dev)
    finally:
        memory.set_memory_limit(dev, previous)


LIMITS = [
    case("limit-nan", lambda a: _limit(a, NAN), ValueError),
    case("limit-inf", lambda a: _limit(a, INF), ValueError),
    case("limit-negative-inf", lambda a: _limit(a, -INF), ValueError),
    case("limit-negative", lambda a: _limit(a, -1), ValueError),
    case("limit-zero-fraction", lambda a: _limit(a, 0.0), ValueError),
    case("limit-fraction-above-one", lambda a: _limit(a, 1.5), ValueError),
    case("limit-parsecs", lambda a: _limit(a, "12 parsecs"), ValueError),
    case("limit-empty-string", lambda a: _limit(a, ""), ValueError),
    case("limit-nan-string", lambda a: _limit(a, "nan GiB"), ValueError),
    case("limit-exponent-string", lambda a: _limit(a, "1e400"), ValueError),
    case("limit-negative-string", lambda a: _limit(a, "-5MiB"), ValueError),
    case("limit-percent-above", lambda a: _limit(a, "150%"), ValueError),
    case("limit-percent-negative", lambda a: _limit(a, "-5%"), ValueError),
    case("limit-percent-nan", lambda a: _limit(a, "nan%"), ValueError),
    case("limit-percent-inf", lambda a: _limit(a, "inf%"), ValueError),
    case("limit-percent-word", lambda a: _limit(a, "half%"), ValueError),
    case("limit-2**70", lambda a: _limit(a, 2**70), ValueError),
    case("limit-huge-string", lambda a: _limit(a, "99999999999999999999 TiB"), ValueError),
    case("limit-bool", lambda a: _limit(a, True), TypeError),
    case("limit-list", lambda a: _limit(a, [1]), TypeError),
    case("limit-bytes", lambda a: _limit(a, b"1GiB"), TypeError),
    case("limit-device-name", lambda a: memory.set_memory_limit("gpu9", "1GiB"), ValueError),
    case("limit-device-int", lambda a: memory.set_memory_limit(5, "1GiB"), TypeError),
    case("limit-device-index", lambda a: memory.set_memory_limit("cuda:x", "1GiB"), ValueError),
    case("limit-exceeded", _over_limit, ndl.OutOfMemoryError),
    case("parse-size-parsecs", lambda a: memory.parse_size("12 parsecs"), ValueError),
    case("parse-size-nan", lambda a: memory.parse_size(NAN), ValueError),
    case("parse-size-fraction-no-capacity", lambda a: memory.parse_size(0.5), ValueError),
    case("parse-size-none", lambda a: memory.parse_size(None), TypeError),
    case("parse-size-negative", lambda a: memory.parse_size(-3), ValueError),
    case(
        "parse-size-huge-decimal",
        lambda a: memory.parse_size("9" * 400 + ".5 GiB"),
        ValueError,
        "out of range",
    ),
    case(
        "monitor-interval-huge",
        lambda a: memory.MemoryMonitor(interval=2**2000),
        ValueError,
        "MemoryMonitor interval",
    ),
    case(
        "monitor-stop-before-start",
        lambda a: memory.MemoryMonitor().stop(),
        RuntimeError,
        "not running: stop\\(\\) needs a start\\(\\)",
    ),
    case("parse-size-unit-only", lambda a: memory.parse_size("GiB"), ValueError),
    case("stats-gpu9", lambda a: memory.memory_stats(device="gpu9"), ValueError),
    case("stats-float", lambda a: memory.memory_stats(3.5), TypeError),
    case("allocated-bad-index", lambda a: memory.memory_allocated("cuda:x"), ValueError),
    case("reserved-negative-index", lambda a: memory.memory_reserved("cuda:-1"), ValueError),
    case("reset-peak-name", lambda a: memory.reset_peak_memory_stats("gpu"), ValueError),
    case("empty-cache-object", lambda a: memory.empty_cache(object()), TypeError),
    case("get-limit-list", lambda a: memory.get_memory_limit(["cpu"]), TypeError),
    case("summary-name", lambda a: memory.memory_summary("tpu"), ValueError),
    case("live-tensors-name", lambda a: memory.live_tensors(device="gpu9"), ValueError),
    case("find-cycles-int", lambda a: memory.find_cycles(device=5), TypeError),
]
POLICY = [
    case("policy-growth-nan", lambda a: memory.set_gc_policy(growth=NAN), ValueError),
    case("policy-growth-inf", lambda a: memory.set_gc_policy(growth=INF), ValueError),
    case("policy-growth-negative", lambda a: memory.set_gc_policy(growth=-1.0), ValueError),
    case("policy-growth-str", lambda a: memory.set_gc_policy(growth="x"), TypeError),
    case("policy-growth-bool", lambda a: memory.set_gc_policy(growth=True), TypeError),
    case(
        "policy-high-water-nan",
        lambda a: memory.set_gc_policy(high_water=NAN),
        ValueError,
    ),
    case("policy-high-water-above", lambda a: memory.set_gc_policy(high_water=1.5), ValueError),
    case("policy-high-water-zero", lambda a: memory.set_gc_policy(high_water=0.0), ValueError),
    case("policy-fraction-inf", lambda a: memory.set_gc_policy(max_gc_fraction=INF), ValueError),
    case(
        "policy-fraction-nan",
        lambda a: memory.set_gc_policy(max_gc_fraction=NAN),
        ValueError,
    ),
    case("policy-fraction-str", lambda a: memory.set_gc_policy(max_gc_fraction="half"), TypeError),
    case(
        "policy-min-growth-parsecs",
        lambda a: memory.set_gc_policy(min_growth="12 parsecs"),
        ValueError,
    ),
    case("policy-min-growth-nan", lambda a: memory.set_gc_policy(min_growth=NAN), ValueError),
    case("policy-min-growth-negative", lambda a: memory.set_gc_policy(min_growth=-1), ValueError),
    case("policy-min-growth-list", lambda a: memory.set_gc_policy(min_growth=[1]), TypeError),
    case("policy-watermark-str", lambda a: memory.set_gc_policy(watermark="x"), ValueError),
    # Ints past a float's range were an OverflowError from float() (issue 35).
    case(
        "policy-growth-2**2000",
        lambda a: memory.set_gc_policy(growth=2**2000),
        ValueError,
        "growth",
    ),
    case(
        "policy-high-water-2**2000",
        lambda a: memory.set_gc_policy(high_water=2**2000),
        ValueError,
        "high_water",
    ),
    case(
        "policy-max-fraction-2**2000",
        lambda a: memory.set_gc_policy(max_gc_fraction=2**2000),
        ValueError,
        "max_gc_fraction",
    ),
    case(
        "policy-min-growth-2**70",
        lambda a: memory.set_gc_policy(min_growth=2**70),
        ValueError,
        "min_growth",
    ),
    case("policy-watermark-nan", lambda a: memory.set_gc_policy(watermark=NAN), ValueError),
    case("policy-watermark-inf", lambda a: memory.set_gc_policy(watermark=INF), ValueError),
    case("policy-watermark-negative", lambda a: memory.set_gc_policy(watermark=-1), ValueError),
    case(
        "policy-watermark-2**70",
        lambda a: memory.set_gc_policy(watermark=2**70),
        ValueError,
    ),
    case("policy-watermark-object", lambda a: memory.set_gc_policy(watermark=object()), TypeError),
    case("policy-unknown-keyword", lambda a: memory.set_gc_policy(speed=2), TypeError),
]

CUDA = [
    case("cuda-index-str", lambda a: ndl.cuda("x"), TypeError),
    case("cuda-index-float", lambda a: ndl.cuda(0.5), TypeError),
    case("cuda-index-2**64", lambda a: ndl.cuda(2**64), ValueError),
    case("cuda-two-args", lambda a: ndl.cuda(0, 1), TypeError),
    case("cuda-allocated-cpu", lambda a: ndl.cuda.memory_allocated("cpu"), ValueError),
    case("cuda-stats-bool", lambda a: ndl.cuda.memory_stats(True), TypeError),
    case("cuda-reserved-name", lambda a: ndl.cuda.memory_reserved("gpu9"), ValueError),
    case("cuda-mem-info-cpu", lambda a: ndl.cuda.mem_get_info("cpu"), ValueError),
    case("cuda-empty-cache-float", lambda a: ndl.cuda.empty_cache(1.5), TypeError),
    case("cuda-fraction-str", lambda a: ndl.cuda.set_per_process_memory_fraction("x"), TypeError),
    case(
        "cuda-fraction-no-gpu",
        lambda a: ndl.cuda.set_per_process_memory_fraction(0.5),
        ndl.DeviceError,
        marks=NO_GPU,
    ),
    case(
        "cuda-limit-no-gpu",
        lambda a: memory.set_memory_limit("cuda", "1GiB"),
        ndl.DeviceError,
        marks=NO_GPU,
    ),
    case(
        "cuda-limit-second-gpu",
        lambda a: memory.set_memory_limit("cuda:7", "1GiB"),
        ndl.DeviceError,
    ),
    case(
        "cuda-array-no-gpu",
        lambda a: nd.array([1.0], device=ndl.cuda()),
        ndl.DeviceError,
        marks=NO_GPU,
    ),
]


class _Producer:
    """A DLPack producer that reports ``device`` and hands out ``array``'s capsule (or
    ``capsule`` when given)."""

    def __init__(self, device, array=None, capsule="not a capsule"):
        self.device, self.array, self.capsule = device, array, capsule

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        if self.array is not None:
            return self.array.__dlpack__()
        return self.capsule


F32 = np.zeros(3, np.float32)

INTEROP = [
    case("from-int64", lambda a: ndl.from_dlpack(np.arange(3)), TypeError, "float32"),
    case(
        "from-int32", lambda a: nd.from_dlpack(np.arange(3, dtype=np.int32)), TypeError, "float32"
    ),
    case("from-int32", lambda a: ndl.from_dlpack(np.zeros(3, np.int32)), TypeError, "float32"),
    case("from-int16", lambda a: nd.from_dlpack(np.zeros(3, np.int16)), TypeError, "float32"),
    case("from-bool", lambda a: ndl.from_dlpack(np.zeros(3, bool)), TypeError, "float32"),
    case("from-uint8", lambda a: nd.from_dlpack(np.zeros(3, np.uint8)), TypeError, "float32"),
    case("from-complex64", lambda a: nd.from_dlpack(np.zeros(3, np.complex64)), TypeError),
    case("from-int64-capsule", lambda a: nd.from_dlpack(np.arange(3).__dlpack__()), TypeError),
    case("from-big-endian", lambda a: nd.from_dlpack(np.zeros(3, np.dtype(">f4"))), BufferError),
    case("from-17-dims", lambda a: nd.from_dlpack(np.zeros((1,) * 17, np.float32)), ValueError),
    case("from-int", lambda a: nd.from_dlpack(5), TypeError),
    case("from-str", lambda a: ndl.from_dlpack("x"), TypeError),
    case("from-list", lambda a: nd.from_dlpack([1.0, 2.0]), TypeError),
    case("from-device-name", lambda a: nd.from_dlpack(F32, device="gpu9"), ValueError),
    case("from-device-int", lambda a: nd.from_dlpack(F32, device=5), TypeError),
    case(
        "from-requires-grad-array",
        lambda a: ndl.from_dlpack(F32, requires_grad=np.ones(2)),
        ValueError,
    ),
    case("producer-device-list", lambda a: nd.from_dlpack(_Producer([1, 0], F32)), TypeError),
    case("producer-device-none", lambda a: nd.from_dlpack(_Producer(None, F32)), TypeError),
    case("producer-device-triple", lambda a: nd.from_dlpack(_Producer((1, 0, 3), F32)), TypeError),
    case("producer-device-str-type", lambda a: nd.from_dlpack(_Producer(("x", 0), F32)), TypeError),
    case(
        "producer-device-huge-id", lambda a: nd.from_dlpack(_Producer((1, 2**70), F32)), ValueError
    ),
    case(
        "producer-device-unknown-type",
        lambda a: nd.from_dlpack(_Producer((99, 0), F32)),
        ndl.DeviceError,
    ),
    case(
        "producer-cuda-no-gpu",
        lambda a: nd.from_dlpack(_Producer((2, 0), F32)),
        ndl.DeviceError,
        marks=NO_GPU,
    ),
    case(
        "producer-cuda-absent-gpu",
        lambda a: nd.from_dlpack(_Producer((2, 97), F32)),
        ndl.DeviceError,
    ),
    case(
        "producer-not-a-capsule",
        lambda a: nd.from_dlpack(_Producer((1, 0))),
        (TypeError, ValueError),
    ),
    case(
        "producer-used-capsule",
        lambda a: (lambda c: (nd.from_dlpack(c), nd.from_dlpack(c)))(F32.__dlpack__()),
        ValueError,
    ),
    case(
        "producer-raises",
        lambda a: nd.from_dlpack(_Producer((1, 0), capsule=None)),
        (TypeError, ValueError),
    ),
    case("export-dl-device-str", lambda a: a.__dlpack__(dl_device="x"), TypeError),
    case("export-dl-device-list", lambda a: a.__dlpack__(dl_device=[1, 0]), TypeError),
    case(
        "export-dl-device-cuda", lambda a: nd.array([1.0]).__dlpack__(dl_device=(2, 0)), BufferError
    ),
    case(
        "export-dl-device-other-id",
        lambda a: nd.array([1.0]).__dlpack__(dl_device=(1, 3)),
        BufferError,
    ),
    case("export-dl-device-huge", lambda a: a.__dlpack__(dl_device=(1, 2**70)), ValueError),
    case("export-max-version-str", lambda a: a.__dlpack__(max_version="x"), TypeError),
    case("export-max-version-list", lambda a: a.__dlpack__(max_version=[1, 0]), TypeError),
    case("export-bogus-keyword", lambda a: a.__dlpack__(bogus=1), TypeError),
    case("export-positional", lambda a: a.__dlpack__(None), TypeError),
    case("export-device-args", lambda a: a.__dlpack_device__(1), TypeError),
    case(
        "numpy-from-needle-float64",
        # NumPy imports host memory only: a GPU array goes through the CPU first.
        lambda a: np.from_dlpack(a.to(nd.cpu())).astype(np.float64).__dlpack__(dl_device="x"),
        TypeError,
    ),
]


@pytest.fixture(autouse=True)
def _policy_and_limits_unchanged(request):
    """A malformed call must leave the policy and every limit as they were (restored here
    either way, so that one failing case cannot poison the next)."""
    policy = memory.get_gc_policy()
    limits = {name: memory.get_memory_limit(name) for name in ("cpu", "cpu_numpy")}
    yield
    now_policy = memory.get_gc_policy()
    now_limits = {name: memory.get_memory_limit(name) for name in limits}
    memory.set_gc_policy(**policy)
    for name, limit in limits.items():
        memory.set_memory_limit(name, limit)
    assert now_limits == limits
    if request.node.get_closest_marker("xfail") is None:
        assert now_policy == policy


EXPECTED = np.arange(12, dtype=np.float32).reshape(3, 4)


def _subject(device):
    return nd.array(EXPECTED, device=device)


def _normal(a):
    np.testing.assert_array_equal(a.numpy(), EXPECTED)
    np.testing.assert_array_equal((a + 1).sum(axis=0).numpy(), (EXPECTED + 1).sum(axis=0))
    b = nd.from_dlpack(a)
    assert b.shape == (3, 4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", LIMITS + POLICY + CUDA)
def test_memory_and_cuda(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", INTEROP)
def test_interop(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)


def test_torch_producers_of_other_dtypes():
    torch = pytest.importorskip("torch")
    device = nd.cpu()
    for dtype in (torch.int64, torch.int8, torch.bool, torch.complex64):
        producer = torch.zeros(3, dtype=dtype)
        run_case(
            lambda _: ndl.from_dlpack(producer),
            TypeError,
            "float32",
            _subject(device),
            _normal,
            device,
        )
    strided = torch.zeros(4, 4)[:, ::2]  # float32, strided: shared, not an error
    assert nd.from_dlpack(strided).shape == (4, 2)
