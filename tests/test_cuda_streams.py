"""needle's CUDA streams (csrc/cuda/cuda_stream.cu, ``ndl.cuda.Stream`` and friends): every
launch, copy and cuBLAS call goes to the calling thread's current stream, needle's own
non-blocking one by default, so that a step can be captured into a CUDA graph; switching
streams orders them; bad input raises."""

import os
import re
import threading

import numpy as np
import pytest

import needle as ndl

from devices import CUDA_UNAVAILABLE, needs_cuda

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_DIR = os.path.join(ROOT, "csrc", "cuda")


def _call_arguments(source, start):
    """The arguments of the call whose "(" ends at ``start``, split at top-level commas."""
    i, depth, args, cur = start, 1, [], ""
    while depth:
        c = source[i]
        i += 1
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if depth == 1 and c == ",":
            args.append(cur.strip())
            cur = ""
        elif depth:
            cur += c
    args.append(cur.strip())
    return args


def _stream_taking_functions(source):
    """Names of the functions defined in source whose last parameter is a cudaStream_t."""
    return set(re.findall(r"(\w+)\s*\([^;{}()]*cudaStream_t\s+\w+\)\s*\{", source))


def _launch_stream_arguments(source):
    """The stream argument (the fifth) of every ND_LAUNCH in source, with its line."""
    found = []
    for m in re.finditer(r"\bND_LAUNCH\(", source):
        found.append((source.count("\n", 0, m.start()) + 1, _call_arguments(source, m.end())[4]))
    return found


def test_every_launch_goes_to_the_current_stream():
    """No kernel, copy or memset names the legacy stream: it cannot be captured, and it does
    not wait for needle's non-blocking stream."""
    offenders = []
    for name in sorted(os.listdir(CUDA_DIR)):
        if not name.endswith(".cu"):
            continue
        with open(os.path.join(CUDA_DIR, name)) as f:
            source = f.read()
        for line, stream in _launch_stream_arguments(source):
            if stream not in ("stream", "s", "nd_cuda_stream()"):
                offenders.append(f"{name}:{line}: ND_LAUNCH on stream {stream!r}")
        # A helper that takes the stream last, called with the legacy stream.
        for fn in _stream_taking_functions(source):
            for m in re.finditer(rf"\b{fn}\s*(<[^;()]*>)?\s*\(", source):
                args = _call_arguments(source, m.end())
                if args[-1] in ("0", "NULL", "nullptr", "cudaStreamLegacy"):
                    line = source.count("\n", 0, m.start()) + 1
                    offenders.append(f"{name}:{line}: {fn}(..., {args[-1]})")
        for number, text in enumerate(source.splitlines(), 1):
            code = text.split("//")[0]
            if re.search(r"cudaStream_t\s+\w+\s*=\s*0\s*;", code):
                offenders.append(f"{name}:{number}: {text.strip()}")
            legacy_allowed = ("cuda_stream.cu", "cuda_census.cu")  # the fallback, the count
            if "cudaStreamLegacy" in code and name not in legacy_allowed and "*" not in code[:3]:
                offenders.append(f"{name}:{number}: {text.strip()}")
    assert not offenders, "work on the legacy stream:\n" + "\n".join(offenders)


def test_stream_helper_calls_are_found():
    src = (
        "static nd_status fill(float *d, int n, cudaStream_t stream) {\n}\n"
        "x = fill(d, 3, 0);\ny = fill(d, f(1, 2), stream);\n"
    )
    assert _stream_taking_functions(src) == {"fill"}
    calls = [_call_arguments(src, m.end())[-1] for m in re.finditer(r"\bfill\s*\(", src)]
    assert calls == ["cudaStream_t stream", "0", "stream"]  # the definition, then the calls


def test_launch_stream_parser_reads_the_fifth_argument():
    src = (
        "ND_LAUNCH((k<a, b>), grid, f(1, 2), 0, nd_cuda_stream(), x, y);\nND_LAUNCH(k, g, b, 0, 0);"
    )
    assert _launch_stream_arguments(src) == [(1, "nd_cuda_stream()"), (2, "0")]


@pytest.mark.skipif(CUDA_UNAVAILABLE is None, reason="CUDA is available here")
def test_without_cuda_streams_raise_device_error():
    with pytest.raises(ndl.DeviceError, match="not available"):
        ndl.cuda.Stream()
    with pytest.raises(ndl.DeviceError, match="not available"):
        ndl.cuda.current_stream()
    with pytest.raises(ndl.DeviceError, match="not available"):
        ndl.cuda.default_stream()
    with ndl.cuda.stream(None):  # PyTorch's no-op context works anywhere
        pass
    ndl.cuda.set_stream(None)


def _cuda(fn):
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


@_cuda
def test_default_stream_is_needles_own_and_current():
    s = ndl.cuda.current_stream()
    assert s == ndl.cuda.default_stream() == ndl.cuda.current_stream(0)
    assert s.cuda_stream not in (0, 1, 2)  # not the legacy or per-thread default stream
    assert s.device == ndl.cuda() and hash(s) == hash(ndl.cuda.default_stream())
    assert "cuda:0" in repr(s) and s.query() is True


@_cuda
def test_stream_context_switches_orders_and_restores():
    default = ndl.cuda.current_stream()
    side = ndl.cuda.Stream()
    assert side != default and side.cuda_stream != default.cuda_stream
    x = ndl.Tensor(np.arange(6, dtype=np.float32), device=ndl.cuda())
    with ndl.cuda.stream(side) as entered:
        assert entered is side and ndl.cuda.current_stream() == side
        y = (x * 2.0 + 1.0).sum()
        inner = ndl.cuda.Stream()
        with ndl.cuda.stream(inner):
            assert ndl.cuda.current_stream() == inner
        assert ndl.cuda.current_stream() == side
    assert ndl.cuda.current_stream() == default
    np.testing.assert_allclose(y.numpy(), 36.0)
    side.synchronize()
    assert side.query() is True


@_cuda
def test_stream_context_restores_after_an_exception():
    default = ndl.cuda.current_stream()
    side = ndl.cuda.Stream()
    with pytest.raises(ZeroDivisionError):
        with ndl.cuda.stream(side):
            1 / 0
    assert ndl.cuda.current_stream() == default


@_cuda
def test_set_stream_and_back():
    default = ndl.cuda.current_stream()
    side = ndl.cuda.Stream()
    ndl.cuda.set_stream(side)
    try:
        assert ndl.cuda.current_stream() == side
        z = ndl.Tensor([1.0, 2.0], device=ndl.cuda()) * 3.0
    finally:
        ndl.cuda.set_stream(default)
    assert ndl.cuda.current_stream() == default
    np.testing.assert_array_equal(z.numpy(), [3.0, 6.0])
    ndl.cuda.set_stream(None)  # PyTorch: does nothing
    assert ndl.cuda.current_stream() == default


@_cuda
def test_a_destroyed_current_stream_falls_back_to_needles():
    default = ndl.cuda.current_stream()
    side = ndl.cuda.Stream()
    ndl.cuda.set_stream(side)
    ndl.cuda.set_stream(default)
    del side  # destroyed: no thread has it current any more
    assert ndl.cuda.current_stream() == default


@_cuda
def test_the_current_stream_is_per_thread():
    side = ndl.cuda.Stream()
    seen = []
    with ndl.cuda.stream(side):
        t = threading.Thread(target=lambda: seen.append(ndl.cuda.current_stream()))
        t.start()
        t.join()
        assert ndl.cuda.current_stream() == side
    assert seen == [ndl.cuda.default_stream()]


@_cuda
def test_work_on_a_side_stream_matches_the_default_stream():
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((8, 16)).astype(np.float32)
    b_np = rng.standard_normal((16, 4)).astype(np.float32)
    a = ndl.Tensor(a_np, device=ndl.cuda(), requires_grad=True)
    b = ndl.Tensor(b_np, device=ndl.cuda(), requires_grad=True)
    eager = ndl.ops.relu(a @ b).sum()
    eager.backward()
    grads = (a.grad.numpy(), b.grad.numpy())
    a.grad = b.grad = None
    side = ndl.cuda.Stream()
    with ndl.cuda.stream(side):
        out = ndl.ops.relu(a @ b).sum()
        out.backward()
    np.testing.assert_array_equal(out.numpy(), eager.numpy())
    np.testing.assert_array_equal(a.grad.numpy(), grads[0])
    np.testing.assert_array_equal(b.grad.numpy(), grads[1])


@_cuda
def test_wait_stream_and_bad_input():
    side, other = ndl.cuda.Stream(), ndl.cuda.Stream()
    side.wait_stream(other)
    side.wait_stream(side)  # waiting for itself orders nothing
    with pytest.raises(TypeError, match="wait_stream expects a needle.cuda.Stream"):
        side.wait_stream(object())
    with pytest.raises(TypeError, match="stream\\(\\) expects"):
        ndl.cuda.stream(3)
    with pytest.raises(TypeError, match="set_stream expects"):
        ndl.cuda.set_stream("s")
    with pytest.raises(TypeError, match="priority must be an int"):
        ndl.cuda.Stream(priority=1.0)
    with pytest.raises(ValueError, match="default priority only"):
        ndl.cuda.Stream(priority=-1)
    with pytest.raises(ValueError, match="expected a CUDA device"):
        ndl.cuda.Stream(device=ndl.cpu())
    with pytest.raises(ndl.DeviceError):
        ndl.cuda.Stream(device=ndl.cuda.device_count())  # one past the last GPU
