"""Tests of the CUDA backend (csrc/cuda) and of needle.cuda (its memory functions).

Tests marked ``cuda`` need the backend built and a GPU; they check every engine
operation against the CPU backend (the same NumPy data through both, over strided,
transposed, flipped, broadcast and offset views), the caching allocator's statistics
and limits, the driver's view of memory, and the repro modes on the GPU. The tests
without the mark run everywhere: they check what a build reports and that
``needle.cuda`` answers 0 / {} / False / (0, 0) when there is no GPU.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import needle as ndl
import needle.cuda as cm
import needle.memory as mem
import needle_c
from needle import backend_ndarray as nd

from devices import needs_cuda

CUDA = ndl.cuda()
HAS_CUDA = CUDA.enabled()
MiB = 2**20


def cuda_test(fn):
    """Marks a test as needing the CUDA backend and a GPU (skipped with the reason without)."""
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


@pytest.fixture(autouse=True)
def no_limits_left():
    """Every test starts and ends without a limit on the GPU."""
    yield
    if HAS_CUDA:
        mem.set_memory_limit(CUDA, None)


# ------------------------------------------------------------ without a GPU


def test_build_reports_whether_cuda_was_compiled():
    compiled = needle_c._cuda_compiled()
    assert isinstance(compiled, bool)
    assert cm.is_compiled() is compiled
    if HAS_CUDA:
        assert compiled, "a CUDA device exists, so the backend must be compiled in"
    gemm = cm.gemm_backend()
    if compiled:
        assert isinstance(gemm, str) and ("cublas" in gemm or "kernel" in gemm), gemm
    else:
        assert gemm is None


def test_cuda_is_still_the_course_device_function():
    assert callable(ndl.cuda)
    assert isinstance(ndl.cuda(), ndl.Device)
    assert ndl.cuda().name == "cuda"
    from needle import cuda as cuda_mem  # noqa: F401  (importing it shadows nothing)

    assert callable(ndl.cuda) and ndl.cuda() == CUDA


@pytest.mark.skipif(HAS_CUDA, reason="checks the behaviour without a GPU")
def test_cuda_mem_without_gpu():
    assert cm.is_available() is False
    assert cm.device_count() == 0
    for device in (None, 0, "cuda", "cuda:1", ndl.cuda(), ndl.cuda(3)):
        assert cm.memory_allocated(device) == 0
        assert cm.max_memory_allocated(device) == 0
        assert cm.memory_reserved(device) == 0
        assert cm.max_memory_reserved(device) == 0
        assert cm.memory_stats(device) == {}
        assert cm.reset_peak_memory_stats(device) is None
        assert cm.empty_cache(device) == 0
        assert cm.mem_get_info(device) == (0, 0)
        assert "not available" in cm.memory_summary(device)
    assert needle_c._cuda_mem_get_info(0) is None
    with pytest.raises(ndl.DeviceError):
        cm.set_per_process_memory_fraction(0.5)
    with pytest.raises(ndl.DeviceError):
        nd.empty((3,), device=ndl.cuda())


def test_cuda_mem_rejects_other_devices():
    with pytest.raises(ValueError):
        cm.memory_allocated("cpu")
    with pytest.raises(ValueError):
        cm.memory_stats(ndl.cpu_numpy())
    with pytest.raises(TypeError):
        cm.memory_allocated(True)
    with pytest.raises(ValueError):
        cm.memory_allocated(99)


def test_cuda_mem_matches_needle_memory():
    assert cm.memory_stats() == mem.memory_stats(CUDA)
    assert cm.memory_allocated() == mem.memory_allocated(CUDA)
    assert cm.is_available() == HAS_CUDA
    assert cm.device_count() == sum(ndl.cuda(i).enabled() for i in range(16))


# -------------------------------------------------------- CPU vs CUDA helpers


RTOL, ATOL = 2e-5, 1e-6


def _rand(shape, seed=0, kind="any"):
    rng = np.random.default_rng(seed)
    if kind == "pos":
        return rng.uniform(0.1, 3.0, size=shape).astype(np.float32)
    return rng.uniform(-2.0, 2.0, size=shape).astype(np.float32)


def _views(base_np, device):
    """(name, view) pairs of the same (4, 6) values built from a larger base on device:
    contiguous, offset, stepped, negative-step, transposed, flipped, broadcast."""
    a = nd.array(base_np, device=device)  # base (8, 12)
    return [
        ("contiguous", nd.array(base_np[:4, :6].copy(), device=device)),
        ("offset", a[2:6, 3:9]),
        ("stepped", a[::2, ::2]),
        ("negative", a[7:3:-1, 11:5:-1]),
        ("transposed", a[:6, :4].permute((1, 0))),
        ("flipped", a[:4, :6].flip((0, 1))),
        ("broadcast", a[0:1, :6].broadcast_to((4, 6))),
        ("as_strided", a.compact().as_strided((4, 6), (3, 1))),
    ]


def _pairs(base_np):
    """The views on the CPU and on the GPU, paired by name."""
    return zip(_views(base_np, ndl.cpu()), _views(base_np, CUDA))


def _close(cpu_value, cuda_value, rtol=RTOL, atol=ATOL, msg=""):
    got = cuda_value.numpy() if hasattr(cuda_value, "numpy") else cuda_value
    want = cpu_value.numpy() if hasattr(cpu_value, "numpy") else cpu_value
    assert got.shape == want.shape, msg
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=msg)


# ------------------------------------------------------- elementwise, copies


BINARY = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "pow": lambda x, y: x.abs() ** y,
    "maximum": lambda x, y: x.maximum(y),
    "minimum": lambda x, y: x.minimum(y),
    "eq": lambda x, y: x == y,
    "ne": lambda x, y: x != y,
    "ge": lambda x, y: x >= y,
    "gt": lambda x, y: x > y,
    "le": lambda x, y: x <= y,
    "lt": lambda x, y: x < y,
}

UNARY = {
    "neg": lambda x: -x,
    "log": lambda x: x.abs().log(),
    "exp": lambda x: x.exp(),
    "tanh": lambda x: x.tanh(),
    "sqrt": lambda x: x.abs().sqrt(),
    "sigmoid": lambda x: x.sigmoid(),
    "abs": lambda x: x.abs(),
    "relu": lambda x: x.relu(),
}


@cuda_test
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_on_views_matches_cpu(name):
    fn = BINARY[name]
    base_a, base_b = _rand((8, 12), 1), _rand((8, 12), 2)
    base_b[1, :] = base_a[1, :]  # some equal elements for the comparisons
    for (kind_a, ca), (_, ga) in _pairs(base_a):
        for (kind_b, cb), (_, gb) in _pairs(base_b):
            _close(fn(ca, cb), fn(ga, gb), rtol=1e-5, msg=f"{name} {kind_a} {kind_b}")
    # broadcasting between shapes
    ca, ga = nd.array(base_a[:4, :1], device=ndl.cpu()), nd.array(base_a[:4, :1], device=CUDA)
    cb, gb = nd.array(base_b[:1, :6], device=ndl.cpu()), nd.array(base_b[:1, :6], device=CUDA)
    _close(fn(ca, cb), fn(ga, gb), msg=f"{name} broadcast (4,1) (1,6)")


@cuda_test
@pytest.mark.parametrize("scalar", [2.0, 3.0, -1.0, 0.5, -2.5, 0.0])
def test_scalar_ops_match_cpu(scalar):
    base = _rand((8, 12), 3)
    for (kind, c), (_, g) in _pairs(base):
        for fn in (
            lambda x: x + scalar,
            lambda x: scalar - x,
            lambda x: x * scalar,
            lambda x: x / (scalar or 1.0),
            lambda x: (scalar or 1.0) / x,
            lambda x: x.abs() ** scalar,
            lambda x: x.maximum(scalar),
            lambda x: x.minimum(scalar),
            lambda x: x == scalar,
            lambda x: x < scalar,
            lambda x: x >= scalar,
        ):
            _close(fn(c), fn(g), rtol=1e-5, msg=f"{kind} scalar {scalar}")


@cuda_test
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_on_views_matches_cpu(name):
    fn = UNARY[name]
    base = _rand((8, 12), 4) * 4
    for (kind, c), (_, g) in _pairs(base):
        _close(fn(c), fn(g), rtol=1e-5, atol=1e-6, msg=f"{name} {kind}")


@cuda_test
def test_special_values_match_cpu():
    x = np.array(
        [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 88.0, -88.0, 100.0, -100.0],
        dtype=np.float32,
    )
    c, g = nd.array(x, device=ndl.cpu()), nd.array(x, device=CUDA)
    with np.errstate(all="ignore"):
        for name, fn in UNARY.items():
            np.testing.assert_allclose(
                fn(g).numpy(), fn(c).numpy(), rtol=1e-5, atol=1e-37, err_msg=name
            )
        for name in ("maximum", "minimum", "eq", "ne", "lt", "ge"):
            np.testing.assert_array_equal(
                BINARY[name](g, g[::-1]).numpy(), BINARY[name](c, c[::-1]).numpy(), err_msg=name
            )
        np.testing.assert_array_equal((g**2.0).numpy(), (c**2.0).numpy())
        np.testing.assert_array_equal((g**-1.0).numpy(), (c**-1.0).numpy())


@cuda_test
@pytest.mark.parametrize(
    "shape", [(), (0,), (1,), (7,), (3, 0, 2), (2, 3, 4), (2, 1, 3, 5), (2, 3, 1, 2, 3)]
)
def test_shapes_round_trip_and_compact(shape):
    x = _rand(shape, 5)
    g = nd.array(x, device=CUDA)
    assert g.device == CUDA and g.shape == shape
    np.testing.assert_array_equal(g.numpy(), x)
    if len(shape) >= 2:
        axes = tuple(reversed(range(len(shape))))
        np.testing.assert_array_equal(g.permute(axes).compact().numpy(), x.transpose(axes))
        np.testing.assert_array_equal(g.permute(axes).numpy(), x.transpose(axes))
        np.testing.assert_array_equal(g.flip((0,)).numpy(), np.flip(x, 0))


@cuda_test
def test_copies_fill_and_setitem_match_cpu():
    base = _rand((8, 12), 6)
    c, g = nd.array(base, device=ndl.cpu()), nd.array(base, device=CUDA)
    for key, value in [
        ((slice(1, 3), slice(None, None, 2)), 5.0),
        ((0,), -0.0),
        ((slice(None, None, -1), 1), 7.5),
        ((slice(2, 6), slice(3, 5)), np.arange(8, dtype=np.float32).reshape(4, 2)),
        ((Ellipsis,), 0.0),
    ]:
        c[key] = value
        g[key] = value
        np.testing.assert_array_equal(g.numpy(), c.numpy(), err_msg=str(key))
    # NDArray values: broadcast, non-compact sources and targets, overlapping self-assignment
    c[...] = nd.array(base, device=ndl.cpu())
    g[...] = nd.array(base, device=CUDA)
    c[1:4, 2:4] = nd.array([[1.0], [2.0], [3.0]], device=ndl.cpu())
    g[1:4, 2:4] = nd.array([[1.0], [2.0], [3.0]], device=CUDA)
    c[::-2, 1:12:2] = c[:4, :6].permute((1, 0))[:, :4].permute((1, 0))
    g[::-2, 1:12:2] = g[:4, :6].permute((1, 0))[:, :4].permute((1, 0))
    c[1:, :] = c[:-1, :]
    g[1:, :] = g[:-1, :]
    np.testing.assert_array_equal(g.numpy(), c.numpy())
    t = g.permute((1, 0))[::2]
    t[...] = nd.array(np.ones((6, 8), np.float32), device=CUDA)[:, ::-1]
    tc = c.permute((1, 0))[::2]
    tc[...] = nd.array(np.ones((6, 8), np.float32), device=ndl.cpu())[:, ::-1]
    np.testing.assert_array_equal(g.numpy(), c.numpy())
    # fills
    for value in (0.0, -0.0, 3.25, float("inf")):
        g2, c2 = CUDA.full((5, 7), value), ndl.cpu().full((5, 7), value)
        np.testing.assert_array_equal(g2.numpy(), c2.numpy())
        assert np.signbit(g2.numpy()).all() == np.signbit(c2.numpy()).all()
        g2[1:4:2, ::3].fill(value + 1)
        c2[1:4:2, ::3].fill(value + 1)
        np.testing.assert_array_equal(g2.numpy(), c2.numpy())


@cuda_test
def test_to_and_from_numpy_and_devices():
    x = _rand((64, 48), 7)
    g = nd.array(x, device=CUDA)
    # strided views to host, through both transfer paths (a small and a sparse view)
    np.testing.assert_array_equal(g[::3, 5:40:7].numpy(), x[::3, 5:40:7])
    big = _rand((1024, 512), 8)
    gb = nd.array(big, device=CUDA)
    np.testing.assert_array_equal(gb[::64, ::128].numpy(), big[::64, ::128])
    np.testing.assert_array_equal(gb.permute((1, 0)).numpy(), big.T)
    # device to device moves
    c = g.to(ndl.cpu())
    assert c.device == ndl.cpu()
    np.testing.assert_array_equal(c.numpy(), x)
    back = c[::2].to(CUDA)
    assert back.device == CUDA
    np.testing.assert_array_equal(back.numpy(), x[::2])
    np.testing.assert_array_equal(nd.array(g.permute((1, 0)), device=ndl.cpu_numpy()).numpy(), x.T)
    # writing host values into strided GPU views
    g[::2, ::-3] = x[::2, ::-3] * 2
    expect = x.copy()
    expect[::2, ::-3] = x[::2, ::-3] * 2
    np.testing.assert_array_equal(g.numpy(), expect)
    assert np.asarray(g).shape == (64, 48)


@cuda_test
def test_mixing_devices_raises():
    g = nd.array(np.ones(3, np.float32), device=CUDA)
    c = nd.array(np.ones(3, np.float32), device=ndl.cpu())
    with pytest.raises(ndl.DeviceError):
        g + c
    with pytest.raises(ndl.DeviceError):
        g.reshape((3, 1)) @ c.reshape((1, 3))
    np.testing.assert_array_equal((g + 1).numpy(), [2, 2, 2])


# ---------------------------------------------------------------- reductions


@cuda_test
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize(
    "shape,axis",
    [
        ((7,), None),
        ((7,), 0),
        ((3, 4), 0),
        ((3, 4), 1),
        ((3, 4), None),
        ((2, 3, 4), (0, 2)),
        ((2, 3, 4), 1),
        ((2, 1, 3, 5), (1, 3)),
        ((5, 0, 2), 2),
        ((1, 1), None),
        # long rows and columns: the warp- and block-per-output paths
        ((4, 100_000), 1),
        ((100_000, 4), 0),
        ((3, 70_000), None),
        ((3000, 40), 1),
        ((40, 3000), 0),
        ((64, 64, 64), (0, 2)),
    ],
)
def test_reductions_match_cpu(op, shape, axis):
    x = _rand(shape, 9)
    c, g = nd.array(x, device=ndl.cpu()), nd.array(x, device=CUDA)
    for keepdims in (False, True):
        want = getattr(c, op)(axis=axis, keepdims=keepdims)
        got = getattr(g, op)(axis=axis, keepdims=keepdims)
        rtol = 1e-4 if op == "sum" else 0
        atol = 1e-3 if op == "sum" else 0
        _close(want, got, rtol=rtol, atol=atol, msg=f"{op} {shape} {axis} {keepdims}")
    # the same on a non-contiguous view
    if len(shape) >= 2:
        axes = tuple(reversed(range(len(shape))))
        cv, gv = c.permute(axes), g.permute(axes)
        ax = None if axis is None else tuple(len(shape) - 1 - int(a) for a in np.atleast_1d(axis))
        _close(getattr(cv, op)(axis=ax), getattr(gv, op)(axis=ax), rtol=1e-4, atol=1e-3)


@cuda_test
def test_reductions_propagate_nan_and_handle_empty():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    x[1, 2] = np.nan
    g = nd.array(x, device=CUDA)
    np.testing.assert_array_equal(g.max(axis=1).numpy(), np.max(x, axis=1))
    np.testing.assert_array_equal(g.min(axis=0).numpy(), np.min(x, axis=0))
    empty = nd.array(np.zeros((3, 0), np.float32), device=CUDA)
    np.testing.assert_array_equal(empty.sum(axis=1).numpy(), np.zeros(3, np.float32))
    with pytest.raises(ValueError):
        empty.max(axis=1)


# -------------------------------------------------------------------- matmul


@cuda_test
@pytest.mark.parametrize(
    "m,k,n",
    [
        (1, 1, 1),
        (3, 5, 2),
        (64, 64, 64),
        (65, 33, 130),
        (1, 300, 1),
        (257, 1, 3),
        (128, 0, 4),
        (0, 4, 3),
    ],
)
def test_matmul_2d_matches_cpu(m, k, n):
    a, b = _rand((m, k), 10), _rand((k, n), 11)
    ca, cb = nd.array(a, device=ndl.cpu()), nd.array(b, device=ndl.cpu())
    ga, gb = nd.array(a, device=CUDA), nd.array(b, device=CUDA)
    _close(ca @ cb, ga @ gb, rtol=1e-4, atol=1e-4)
    # transposed operands (read in place as CUBLAS_OP_T), and sliced ones
    at, bt = nd.array(a.T.copy(), device=CUDA), nd.array(b.T.copy(), device=CUDA)
    _close(ca @ cb, at.permute((1, 0)) @ bt.permute((1, 0)), rtol=1e-4, atol=1e-4)
    _close(ca @ cb, ga @ bt.permute((1, 0)), rtol=1e-4, atol=1e-4)


@cuda_test
@pytest.mark.parametrize(
    "sa,sb",
    [
        ((2, 3, 4), (2, 4, 5)),
        ((3, 4), (2, 4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (1, 5, 4, 2)),
        ((4,), (2, 4, 3)),
        ((2, 3, 4), (4,)),
        ((5,), (5,)),
        ((7, 1, 16, 8), (7, 3, 8, 16)),
    ],
)
def test_matmul_batched_matches_cpu(sa, sb):
    a, b = _rand(sa, 12), _rand(sb, 13)
    want = nd.array(a, device=ndl.cpu()) @ nd.array(b, device=ndl.cpu())
    got = nd.array(a, device=CUDA) @ nd.array(b, device=CUDA)
    _close(want, got, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got.numpy(), np.matmul(a, b), rtol=1e-4, atol=1e-4)


@cuda_test
def test_matmul_non_uniform_batch_strides():
    """Batch dims that cannot merge into one stride: a loop of strided-batched GEMMs."""
    base = _rand((4, 6, 8, 8), 14)
    a = nd.array(base, device=CUDA)[:, ::2]  # (4, 3, 8, 8), batch strides (384, 128)
    b = nd.array(base, device=CUDA).permute((1, 0, 3, 2))[:3]  # (3, 4, 8, 8), transposed
    want = np.matmul(base[:, ::2], base.transpose(1, 0, 3, 2)[:3].transpose(1, 0, 2, 3))
    got = a @ b.permute((1, 0, 2, 3))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


@cuda_test
def test_matmul_kernel_fallback_matches_cublas(tmp_path):
    """NEEDLE_CUBLAS=0 forces needle's own SGEMM kernel; it must agree with the default."""
    code = textwrap.dedent("""
        import json
        import numpy as np, needle as ndl, needle.cuda as cm
        from needle import backend_ndarray as nd
        rng = np.random.default_rng(0)
        gpu = ndl.cuda()
        out = {"gemm": cm.gemm_backend()}
        for sa, sb in [((70, 33), (33, 90)), ((3, 17, 65), (3, 65, 9)), ((2, 40, 8), (8, 40))]:
            a = rng.standard_normal(sa).astype("float32")
            b = rng.standard_normal(sb).astype("float32")
            g = nd.array(a, device=gpu) @ nd.array(b, device=gpu)
            # b read transposed in place (a permuted view of its transpose)
            axes = tuple(range(len(sb) - 2)) + (len(sb) - 1, len(sb) - 2)
            bt = nd.array(np.ascontiguousarray(np.swapaxes(b, -1, -2)), device=gpu).permute(axes)
            gt = nd.array(a, device=gpu) @ bt
            ref = np.matmul(a.astype("float64"), b.astype("float64"))
            out[str(sa)] = [float(np.abs(g.numpy() - ref).max()),
                            float(np.abs(gt.numpy() - ref).max())]
        print(json.dumps(out))
        """)
    results = {}
    for flag in ("0", "1"):
        env = dict(os.environ, NEEDLE_CUBLAS=flag)
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[flag] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "kernel" in results["0"]["gemm"]
    for r in results.values():
        for key, errors in r.items():
            if key != "gemm":
                assert max(errors) < 1e-3, (r["gemm"], key, errors)


# --------------------------------------------------------- gather / scatter


@cuda_test
def test_gather_and_scatter_rows_match_cpu():
    table = _rand((10, 5), 15)
    idx = np.array([[3, 0, 9], [3, 3, 1]], dtype=np.float32)
    src = _rand((2, 3, 5), 16)
    outs = {}
    for name, dev in (("cpu", ndl.cpu()), ("cuda", CUDA)):
        tb = ndl.Tensor(table, device=dev)
        ix = ndl.Tensor(idx, device=dev, requires_grad=False)
        out = ndl.gather_rows(tb, ix)
        out.sum().backward()
        sc = ndl.ops.scatter_add_rows(ndl.Tensor(src, device=dev), ix, 10)
        # a strided table (every other column, rows reversed)
        strided = ndl.Tensor(nd.array(table, device=dev)[::-1, ::2], device=dev)
        outs[name] = (
            out.numpy(),
            tb.grad.numpy(),
            sc.numpy(),
            ndl.gather_rows(strided, ix).numpy(),
        )
    for want, got in zip(outs["cpu"], outs["cuda"]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(outs["cuda"][0], table[idx.astype(int)])


@cuda_test
@pytest.mark.parametrize("bad", [10.0, 17.0, -1.0, 2.5, float("nan"), float("inf")])
def test_bad_indices_raise_index_error_at_the_next_sync_and_leave_state_intact(bad):
    """The GPU checks indices as it reads them and reports the first bad one at the next
    synchronisation (here the copy to the host), with the CPU's message; the bad row
    reads as zeros, a bad scatter adds nothing, and once reported the error is gone."""
    table = ndl.Tensor(_rand((10, 4), 17), device=CUDA)
    idx = ndl.Tensor(np.array([0, 3, bad, 1], np.float32), device=CUDA, requires_grad=False)
    ndl.cuda.reset_work_counters()
    out = ndl.gather_rows(table, idx)
    counts = ndl.cuda.work_counters(reset=True)
    assert counts["host_syncs"] == 0 and counts["kernel_launches"] == 1
    with pytest.raises(IndexError) as info:
        out.numpy()
    cpu_idx = ndl.Tensor(
        np.array([0, 3, bad, 1], np.float32), device=ndl.cpu(), requires_grad=False
    )
    with pytest.raises(IndexError) as cpu_info:
        ndl.gather_rows(ndl.Tensor(table.numpy(), device=ndl.cpu()), cpu_idx)
    assert str(info.value) == str(cpu_info.value)
    want = table.numpy()[[0, 3, 0, 1]]
    want[2] = 0.0
    np.testing.assert_array_equal(out.numpy(), want)  # reported once: this copy is clean
    target = ndl.Tensor(_rand((4, 4), 18), device=CUDA)
    summed = ndl.ops.scatter_add_rows(target, idx, 10)
    with pytest.raises(IndexError):
        ndl.cuda.synchronize()
    ndl.cuda.synchronize()
    ok_rows = summed.numpy()
    np.testing.assert_array_equal(ok_rows[[0, 3, 1]], target.numpy()[[0, 1, 3]])
    ok = ndl.gather_rows(
        table, ndl.Tensor(np.array([9.0, 0.0], np.float32), device=CUDA, requires_grad=False)
    )
    np.testing.assert_array_equal(ok.numpy(), table.numpy()[[9, 0]])


@cuda_test
def test_the_earliest_bad_index_is_the_one_reported():
    table = ndl.Tensor(_rand((10, 4), 19), device=CUDA)

    def idx(values):
        return ndl.Tensor(np.array(values, np.float32), device=CUDA, requires_grad=False)

    ndl.gather_rows(table, idx([0.0, 11.0, 12.0]))  # position 1 is the first bad one
    ndl.gather_rows(table, idx([-3.0]))
    with pytest.raises(IndexError, match="index 11 is out of range for 10 rows"):
        ndl.cuda.synchronize()
    # More checked launches than the ring holds between two synchronisations: drained.
    for _ in range(70):
        ndl.gather_rows(table, idx([1.0, 2.0]))
    ndl.gather_rows(table, idx([2.5]))
    with pytest.raises(IndexError, match="index 2.5 is not an integer"):
        ndl.cuda.synchronize()


@cuda_test
def test_a_bad_label_is_reported_at_the_loss_read():
    logits = ndl.Tensor(_rand((3, 5), 20), device=CUDA)
    labels = ndl.Tensor(np.array([0.0, 7.0, 1.0], np.float32), device=CUDA, requires_grad=False)
    ndl.cuda.reset_work_counters()
    loss = ndl.ops.softmax_cross_entropy(logits, labels)
    assert ndl.cuda.work_counters(reset=True)["host_syncs"] == 0
    with pytest.raises(IndexError, match="label 7 is out of range for 5 classes"):
        loss.numpy()
    assert np.isnan(loss.numpy()).all()  # the row with the bad label made no finite loss


@cuda_test
def test_softmax_cross_entropy_and_training_step_match_cpu():
    rng = np.random.default_rng(19)
    logits = rng.standard_normal((6, 5)).astype(np.float32)
    labels = rng.integers(0, 5, size=6).astype(np.float32)
    w = rng.standard_normal((5, 5)).astype(np.float32)
    results = {}
    for name, dev in (("cpu", ndl.cpu()), ("cuda", CUDA)):
        x = ndl.Tensor(logits, device=dev)
        wt = ndl.Tensor(w, device=dev)
        y = ndl.Tensor(labels, device=dev, requires_grad=False)
        loss = ndl.ops.softmax_cross_entropy(ndl.relu(x @ wt), y)
        loss.backward()
        results[name] = (loss.numpy(), wt.grad.numpy())
    for want, got in zip(results["cpu"], results["cuda"]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------ memory: stats


@cuda_test
def test_cuda_memory_statistics():
    cm.empty_cache()
    base_alloc, base_res = cm.memory_allocated(), cm.memory_reserved()
    assert cm.is_available() and cm.device_count() >= 1
    a = nd.empty((1000,), device=CUDA)
    assert cm.memory_allocated() == base_alloc + 4000  # exact, not rounded
    assert cm.memory_reserved() >= cm.memory_allocated()
    b = nd.empty((3, 1000, 1000), device=CUDA)  # 12 MB: a large segment
    assert cm.memory_allocated() == base_alloc + 4000 + 12_000_000
    assert cm.memory_reserved() >= base_res + 12_000_000
    assert cm.max_memory_allocated() >= cm.memory_allocated()
    reserved_with_b = cm.memory_reserved()
    del b
    assert cm.memory_allocated() == base_alloc + 4000
    assert cm.memory_reserved() == reserved_with_b  # cached, still reserved
    c = nd.empty((2, 1000, 1000), device=CUDA)  # served from the cache (a split)
    assert cm.memory_reserved() == reserved_with_b
    del c
    released = cm.empty_cache()
    assert released >= 12_000_000
    assert cm.memory_reserved() == reserved_with_b - released
    assert cm.memory_reserved() >= cm.memory_allocated()
    stats = cm.memory_stats()
    assert stats["allocated_bytes.all.current"] == cm.memory_allocated()
    assert stats["reserved_bytes.all.current"] == cm.memory_reserved()
    # the capacity registered at import (cudaDeviceProp) is the driver's total
    assert abs(stats["device_capacity_bytes"] - cm.mem_get_info()[1]) <= 64 * MiB
    cm.reset_peak_memory_stats()
    assert cm.max_memory_allocated() == cm.memory_allocated()
    assert cm.max_memory_reserved() == cm.memory_reserved()
    assert "allocated" in cm.memory_summary() and "reserved" in cm.memory_summary()
    del a


@cuda_test
def test_cuda_limits_raise_out_of_memory():
    cm.empty_cache()
    keep = nd.empty((10,), device=CUDA)
    reserved = cm.memory_reserved()
    limit = reserved + 8 * MiB
    mem.set_memory_limit(CUDA, limit)
    a = nd.empty((6 * MiB // 4,), device=CUDA)  # 6 MiB fits
    ooms = cm.memory_stats()["num_ooms"]
    with pytest.raises(ndl.OutOfMemoryError) as info:
        nd.empty((8 * MiB // 4,), device=CUDA)  # 8 MiB more does not
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.requested == 8 * MiB and err.limit == limit and err.device == CUDA
    assert err.reserved <= limit and cm.memory_reserved() <= limit
    # ops whose results would pass it fail the same way
    # (the closures read a before the del a below; ruff cannot see that order)
    for op in (
        lambda: a * 2,  # noqa: F821
        lambda: a.exp(),  # noqa: F821
        lambda: a.reshape((768, 2048)).permute((1, 0)).compact(),  # noqa: F821
    ):
        with pytest.raises(ndl.OutOfMemoryError):
            op()
    assert cm.memory_stats()["num_ooms"] == ooms + 4
    assert cm.memory_reserved() <= limit
    # 7 MiB after a is gone: the allocator gives a's cached segment back and retries
    del a
    retries = cm.memory_stats()["num_alloc_retries"]
    b = nd.empty((7 * MiB // 4,), device=CUDA)
    assert b.shape == (7 * MiB // 4,)
    assert cm.memory_stats()["num_alloc_retries"] > retries
    assert cm.memory_reserved() <= limit
    mem.set_memory_limit(CUDA, None)
    cm.set_per_process_memory_fraction(0.5)
    capacity = cm.memory_stats()["device_capacity_bytes"]
    assert mem.get_memory_limit(CUDA) == int(0.5 * capacity)
    cm.set_per_process_memory_fraction(None)
    assert mem.get_memory_limit(CUDA) is None
    del b, keep


@cuda_test
def test_driver_sees_what_needle_reserves():
    """cudaMemGetInfo's free bytes drop by (about) what needle's reserved bytes grow."""
    warm = nd.array(np.ones((4, 4), np.float32), device=CUDA)
    (warm @ warm).numpy()  # creates the context and the cuBLAS handle first
    cm.empty_cache()
    free0, total = cm.mem_get_info()
    reserved0 = cm.memory_reserved()
    assert 0 < free0 <= total
    big = nd.empty((256 * MiB // 4,), device=CUDA)  # 256 MiB
    free1, _ = cm.mem_get_info()
    grown = cm.memory_reserved() - reserved0
    assert grown >= 256 * MiB
    # the driver allocates in 2 MiB pages; allow for other processes' small changes
    assert abs((free0 - free1) - grown) <= 8 * MiB, (free0 - free1, grown)
    del big
    cm.empty_cache()
    free2, _ = cm.mem_get_info()
    assert abs(free2 - free0) <= 8 * MiB
    del warm


@cuda_test
def test_garbage_collection_frees_gpu_memory():
    import gc

    base = cm.memory_allocated()
    with ndl.autograd.graph_mode("needle"):
        x = ndl.Tensor(_rand((256, 256), 20), device=CUDA)
        for _ in range(3):
            y = (x @ x).sum()
            y.backward()
    del x, y
    gc.collect()
    assert cm.memory_allocated() == base


# -------------------------------------------------------------- repro on GPU


@cuda_test
def test_repro_modes_on_the_gpu(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "needle.repro",
        "--device",
        "cuda",
        "--steps",
        "8",
        "--batch-size",
        "32",
        "--seq-len",
        "10",
        "--words",
        "20000",
        "--modes",
        "leak,hook,cycle_free",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = {r["mode"]: r for r in json.loads((out / "repro.json").read_text())}
    assert all(r["device"] == "cuda()" for r in report.values()), report
    assert report["leak"]["oom"] and report["leak"]["oom_step"] <= 8
    for mode in ("hook", "cycle_free"):
        assert not report[mode]["oom"] and report[mode]["steps"] == 8, report[mode]
    assert report["hook"]["pressure_collections"] > 0


def test_needle_cuda_is_the_device_function_and_the_memory_api():
    """ndl.cuda() stays the course's device function; ndl.cuda.* is the torch.cuda-style API."""
    import needle.cuda as nc

    assert nc is ndl.cuda
    assert str(ndl.cuda()) == "cuda()" and ndl.cuda() == ndl.backend_ndarray.cuda()
    assert ndl.cuda.is_available() == ndl.cuda().enabled()
    if not ndl.cuda().enabled():
        assert ndl.cuda.memory_allocated() == 0 and ndl.cuda.memory_stats() == {}
        assert ndl.cuda.mem_get_info() == (0, 0) and ndl.cuda.device_count() == 0


# ------------------------------------------------- names, and the simulator


SIMULATED = needle_c._cuda_simulated()


def sim_test(fn):
    """Marks a test of the CUDA simulator (a NEEDLE_CUDA=sim build, tests/cuda_sim.sh)."""
    fn = pytest.mark.skipif(not SIMULATED, reason="needs the CUDA simulator (NEEDLE_CUDA=sim)")(fn)
    return pytest.mark.cuda(fn)


def test_device_name_and_whether_simulated():
    assert isinstance(SIMULATED, bool)
    if not needle_c._cuda_compiled():
        assert SIMULATED is False
    if HAS_CUDA:
        name = cm.get_device_name()
        assert isinstance(name, str) and name
        assert cm.get_device_name(0) == cm.get_device_name("cuda") == name
        assert ("simulator" in name) == SIMULATED
        if SIMULATED:
            assert name == "needle CUDA simulator (CPU)"
            assert (
                cm.gemm_backend() == "cublas (the CUDA simulator's stand-in, computed on the CPU)"
            )
    else:
        with pytest.raises(ndl.DeviceError, match="not available"):
            cm.get_device_name()
    assert needle_c._cuda_device_name(7) is None  # no such GPU, never an error
    with pytest.raises(ndl.DeviceError):
        cm.get_device_name(3)
    with pytest.raises(ValueError):
        cm.get_device_name("cpu")
    with pytest.raises(TypeError):
        cm.get_device_name(True)
    with pytest.raises(TypeError):
        needle_c._cuda_device_name("0")


def _sim_subprocess(code, **switches):
    """Runs code in a fresh interpreter with the simulator's switches set; returns its last
    line of output as JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEEDLE_SIM_")}
    env.update(switches)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@sim_test
def test_simulated_gpu_memory_runs_out_for_real():
    """NEEDLE_SIM_MEMORY is the GPU's capacity: cudaMalloc itself fails past it (no needle
    limit set), and the out-of-memory ladder (release the cache, collect, retry) runs."""
    out = _sim_subprocess(
        """
        import json
        import needle as ndl, needle.cuda as cm
        from needle import backend_ndarray as nd
        MiB = 2**20
        gpu = ndl.cuda()
        out = {"info": list(cm.mem_get_info()),
               "capacity": cm.memory_stats()["device_capacity_bytes"]}
        a = nd.empty((40 * MiB // 4,), device=gpu)
        try:
            nd.empty((40 * MiB // 4,), device=gpu)
            out["second"] = "allocated"
        except ndl.OutOfMemoryError as err:
            out["second"] = [err.requested, err.limit]
        out["ooms"] = cm.memory_stats()["num_ooms"]
        del a
        # garbage that only a collection can free: a cycle holding 40 MiB (gc off: the
        # out-of-memory path collects anyway)
        import gc
        gc.disable()
        class Holder:
            pass
        h = Holder()
        h.me, h.array = h, nd.empty((40 * MiB // 4,), device=gpu)
        del h
        b = nd.empty((40 * MiB // 4,), device=gpu)
        out["after"] = [b.shape[0] * 4, cm.memory_stats()["num_oom_collections"]]
        print(json.dumps(out))
        """,
        NEEDLE_SIM_MEMORY="64MiB",
    )
    assert out["info"][1] == 64 * MiB and out["capacity"] == 64 * MiB
    assert 0 < out["info"][0] <= 64 * MiB
    assert out["second"][0] == 40 * MiB and out["second"][1] is None  # the driver's refusal
    assert out["ooms"] >= 1
    assert out["after"][0] == 40 * MiB and out["after"][1] >= 1


@sim_test
def test_malformed_simulator_switch_stops_the_import():
    """The simulator reads its switches at its first call; needle makes that call at import
    when one is set, so a malformed one is an import error, not a GPU that quietly is not
    there (every variable's bad values: tests/test_environment.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEEDLE_SIM_")}
    env["NEEDLE_SIM_MEMORY"] = "lots"
    proc = subprocess.run(
        [sys.executable, "-c", "import needle"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "ValueError: NEEDLE_SIM_MEMORY='lots': " in proc.stderr, proc.stderr[-2000:]
