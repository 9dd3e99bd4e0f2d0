"""Every plan of the GPU reduction (csrc/cuda/cuda_reduce.cu) against NumPy, on every device.

The rows kernel (the reduced dims are the faster ones) with each number of threads per row: 1,
2, 4, 8, 16 or 32 lanes of a warp, or a whole block; 16-byte loads between a scalar head and
tail on rows that start anywhere; strided rows and reduced dims that do not merge; long rows
and full sums split over blocks and reduced again. The columns kernel (the kept dims are
faster) with 4 outputs a lane (16-byte loads) or 1 when a's start or steps are not 16-byte
aligned, lane counts that are not powers of two, short columns, middle axes, reduced dims that
do not merge, long columns split over blocks. NaN and infinities in heads, bodies, tails and
slices; empty extents; many axes; keepdims; a split that gets no scratch under a tight memory
limit. The shape comments name the plan the CUDA host code picks for it.

Sums are held to a bound relative to the sum of magnitudes (the float64 sum's condition): the
CPU accumulates in double; the GPU folds short float runs, then pairwise, which stays within
a few float32 roundings of it where a plain float running sum over a long axis would not.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from needle import backend_ndarray as nd

from devices import DEVICES, needs_cuda

SUM_BOUND = {"cpu": 3e-7, "cuda": 4e-6}


def _data(shape, seed):
    return np.random.default_rng(seed).uniform(-2.0, 2.0, size=shape).astype(np.float32)


def _expected(op, x, axis, keepdims):
    """float64 reference with needle's convention for axis=None: shape (1,) unless keepdims."""
    with np.errstate(invalid="ignore", over="ignore"):
        want = getattr(np, op)(x.astype(np.float64), axis=axis, keepdims=keepdims)
        scale = np.sum(np.abs(x.astype(np.float64)), axis=axis, keepdims=keepdims)
    if axis is None and not keepdims:
        want, scale = np.reshape(want, (1,)), np.reshape(scale, (1,))
    return np.asarray(want), np.asarray(scale)


def _check(got_nd, x, op, axis, device, keepdims=False, msg=""):
    want, scale = _expected(op, x, axis, keepdims)
    got = got_nd.numpy()
    assert got.shape == want.shape, f"{msg}: {got.shape} vs {want.shape}"
    if op != "sum":
        np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=msg)
        return
    special = ~np.isfinite(want)  # NaN and infinities come out exactly so
    np.testing.assert_array_equal(got[special], want[special].astype(np.float32), err_msg=msg)
    err = np.abs(got[~special] - want[~special])
    bound = SUM_BOUND[device.name] * scale[~special] + 1e-30
    assert np.all(err <= bound), f"{msg}: worst error {np.max(err / bound):.2f} x the bound"


def _view(x, kind, device):
    """(NumPy view, needle view) of x's values, laid out as `kind` says."""
    if kind == "plain":
        return x, nd.array(x, device=device)
    if kind == "shifted":  # every row starts 1 element past a 16-byte boundary, and more
        n = x.shape[-1]
        base = np.zeros(x.shape[:-1] + (n + 3,), np.float32)
        base[..., 1 : n + 1] = x
        sl = (Ellipsis, slice(1, n + 1))
        return base[sl], nd.array(base, device=device)[sl]
    if kind == "shifted4":  # starts 4 elements in: still 16-byte aligned when n % 4 == 0
        n = x.shape[-1]
        base = np.zeros(x.shape[:-1] + (n + 8,), np.float32)
        base[..., 4 : n + 4] = x
        sl = (Ellipsis, slice(4, n + 4))
        return base[sl], nd.array(base, device=device)[sl]
    if kind == "stepped":  # every other element of the last axis
        base = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), np.float32)
        base[..., ::2] = x
        sl = (Ellipsis, slice(None, None, 2))
        return base[sl], nd.array(base, device=device)[sl]
    if kind == "flipped":
        axes = tuple(range(x.ndim))
        base = np.ascontiguousarray(np.flip(x, axes))
        return np.flip(base, axes), nd.array(base, device=device).flip(axes)
    raise ValueError(kind)


# (shape, axis, views): rows kernel cases (the reduced axis is the faster one).
ROWS = [
    pytest.param((1000, 3), 1, ("plain", "shifted", "stepped"), id="1-lane-rows"),
    pytest.param((70000, 3), 1, ("plain",), id="1-lane-rows-many-blocks"),
    pytest.param((1000, 7), 1, ("plain", "shifted", "flipped"), id="2-lanes"),
    pytest.param((1000, 13), 1, ("plain", "shifted", "stepped"), id="4-lanes"),
    pytest.param((5120, 20), 1, ("plain", "shifted", "shifted4"), id="8-lanes-layer-norm"),
    pytest.param((1000, 29), 1, ("plain", "stepped"), id="8-lanes-odd"),
    pytest.param((1000, 61), 1, ("plain", "shifted", "stepped"), id="16-lanes"),
    pytest.param((1000, 300), 1, ("plain", "shifted", "flipped", "stepped"), id="warp-per-row"),
    pytest.param((50, 3001), 1, ("plain", "shifted", "stepped"), id="block-per-row"),
    pytest.param((3, 70001), 1, ("plain", "shifted", "flipped"), id="split-rows"),
    pytest.param((37,), None, ("plain", "shifted"), id="full-short"),
    pytest.param((100003,), None, ("plain", "shifted", "flipped"), id="full-split"),
    pytest.param((317, 411), None, ("plain", "shifted", "stepped"), id="full-2d-split"),
    pytest.param((20, 30, 40), (0, 2), ("plain", "shifted"), id="unmerged-reduced-dims"),
    pytest.param((4, 3, 9000), (0, 2), ("plain",), id="unmerged-reduced-dims-long"),
]

# (shape, axis, views): columns kernel cases (a kept axis is the faster one).
COLUMNS = [
    pytest.param((24, 8192), 0, ("plain",), id="4-outputs-a-lane-one-pass"),
    pytest.param((3000, 2048), 0, ("plain", "shifted4"), id="4-outputs-a-lane-split"),
    pytest.param((2000, 20), 0, ("shifted", "shifted4"), id="misaligned-start-1-output-a-lane"),
    pytest.param((5120, 20), 0, ("plain", "flipped"), id="5-lanes-split-bias-grad"),
    pytest.param((3000, 7), 0, ("plain", "shifted"), id="7-lanes-1-output-a-lane-split"),
    pytest.param((1000, 33), 0, ("plain", "stepped"), id="33-outputs-split"),
    pytest.param((3, 5000), 0, ("plain", "shifted"), id="short-columns-wide-lanes"),
    pytest.param((2, 300), 0, ("plain",), id="two-rows"),
    pytest.param((6, 700, 52), 1, ("plain", "shifted4"), id="middle-axis-4-a-lane"),
    pytest.param((6, 700, 50), 1, ("plain", "flipped"), id="middle-axis-1-a-lane"),
    pytest.param((300, 3, 72), (0, 1), ("plain",), id="two-outer-axes-merged"),
]


def _run_cases(device, shape, axis, views, seed):
    x = _data(shape, seed)
    for kind in views:
        xv, av = _view(x, kind, device)
        for op in ("sum", "max", "min"):
            for keepdims in (False, True):
                got = getattr(av, op)(axis=axis, keepdims=keepdims)
                _check(got, xv, op, axis, device, keepdims, f"{op} {kind} {shape} axis={axis}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, axis, views", ROWS)
def test_rows_plans_match_numpy(device, shape, axis, views):
    _run_cases(device, shape, axis, views, 21)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, axis, views", COLUMNS)
def test_columns_plans_match_numpy(device, shape, axis, views):
    _run_cases(device, shape, axis, views, 22)


@pytest.mark.parametrize("device", DEVICES)
def test_columns_fall_back_when_one_alignment_condition_fails(device):
    """4 outputs a lane need a 16-byte aligned start, reduced steps and kept outer steps that
    are multiples of 4 elements: views where exactly one of them fails (the simulator reads
    NaN from a misaligned 16-byte load, so a wrong choice shows)."""
    x1, x2, x3 = _data((400, 24), 31), _data((400, 4, 5), 32), _data((400, 18), 33)
    views = {
        # start 1 element in; rows 24 apart; 16 contiguous outputs
        "start": (x1[:, 1:17], nd.array(x1, device=device)[:, 1:17]),
        # start aligned, rows 20 apart, but the kept dims (4 x 4) step 5 and 1
        "kept step": (x2[:, :, :4], nd.array(x2, device=device)[:, :, :4]),
        # start aligned, 16 contiguous outputs, but rows 18 apart
        "reduced step": (x3[:, :16], nd.array(x3, device=device)[:, :16]),
    }
    for name, (xv, av) in views.items():
        for op in ("sum", "max", "min"):
            _check(getattr(av, op)(axis=0), xv, op, 0, device, msg=f"{op} {name}")


@pytest.mark.parametrize("device", DEVICES)
def test_reduced_dims_that_do_not_merge(device):
    """Strided views whose reduced dims stay apart: the general index walk, in both kernels
    and in a split."""
    x = _data((600, 900), 23)
    a = nd.array(x, device=device)
    for op in ("sum", "max", "min"):
        # full sum of a 2-D stepped view: one output, 90,000 elements, split
        _check(getattr(a[::2, ::3], op)(), x[::2, ::3], op, None, device, msg=f"{op} stepped")
    y = _data((30, 40, 8), 24)
    b = nd.array(y, device=device)[:, :20, :]  # axes 0 and 1 cannot merge: the columns walk
    for op in ("sum", "max", "min"):
        _check(getattr(b, op)(axis=(0, 1)), y[:, :20, :], op, (0, 1), device, msg=op)


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_inputs(device):
    """Stride-0 dims (a broadcast view) on the reduced and on the kept side."""
    src = _data((1, 64), 25)
    x = np.broadcast_to(src, (3000, 64))
    a = nd.array(src, device=device).broadcast_to((3000, 64))
    for op in ("sum", "max", "min"):
        for axis in (0, 1, None):
            _check(getattr(a, op)(axis=axis), x, op, axis, device, msg=f"{op} axis={axis}")


# (shape, axis, positions of NaN, +inf, -inf): each lands in a head, a 16-byte body, a tail or
# the last slice of a split, for the plans above.
SPECIALS = [
    pytest.param((1000, 61), 1, [(3, 0), (4, 30), (5, 60)], id="16-lanes"),
    pytest.param((3, 70001), 1, [(0, 1), (1, 35000), (2, 70000)], id="split-rows"),
    pytest.param((100003,), None, [(0,), (50001,), (100002,)], id="full-split"),
    pytest.param((5120, 20), 0, [(0, 1), (2560, 6), (5119, 19)], id="split-columns"),
    pytest.param((3000, 7), 0, [(0, 0), (1500, 3), (2999, 6)], id="columns-1-a-lane"),
    pytest.param((6, 700, 52), 1, [(0, 0, 0), (3, 350, 25), (5, 699, 51)], id="middle-axis"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, axis, where", SPECIALS)
def test_nan_and_infinities(device, shape, axis, where):
    for kind in ("plain", "shifted"):
        for values in ((np.nan, np.inf, -np.inf), (np.inf, np.inf, 1.0), (-np.inf, 5.0, np.nan)):
            x = _data(shape, 26)
            for pos, v in zip(where, values, strict=True):
                x[pos] = v
            xv, av = _view(x, kind, device)
            for op in ("sum", "max", "min"):
                _check(getattr(av, op)(axis=axis), xv, op, axis, device, msg=f"{op} {values}")


@pytest.mark.parametrize("device", DEVICES)
def test_empty_extents(device):
    cases = [((0, 5), 0), ((5, 0), 1), ((0, 5), 1), ((0, 5), None), ((4, 0, 3), (0, 1))]
    for shape, axis in cases:
        x = np.zeros(shape, np.float32)
        a = nd.array(x, device=device)
        for keepdims in (False, True):
            got = a.sum(axis=axis, keepdims=keepdims)
            want, _ = _expected("sum", x, axis, keepdims)
            assert got.shape == want.shape
            np.testing.assert_array_equal(got.numpy(), want)
    a = nd.array(np.zeros((5, 0), np.float32), device=device)
    for op in ("max", "min"):
        with pytest.raises(ValueError, match="zero-size"):
            getattr(a, op)(axis=1)
        assert getattr(a, op)(axis=0).shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_many_axes_and_permutations(device):
    x = _data((2, 3, 4, 5, 6, 7), 27)
    a = nd.array(x, device=device)
    perm = (5, 3, 1, 0, 2, 4)
    p, xp = a.permute(perm), np.transpose(x, perm)
    for axis in [(0, 2, 4), (1, 3, 5), (0, 1, 2, 3, 4, 5), (5,), (0,), (1, 2, 3, 4)]:
        for op in ("sum", "max", "min"):
            for keepdims in (False, True):
                msg = f"{op} axis={axis} keepdims={keepdims}"
                _check(
                    getattr(a, op)(axis=axis, keepdims=keepdims), x, op, axis, device, keepdims, msg
                )
                _check(
                    getattr(p, op)(axis=axis, keepdims=keepdims),
                    xp,
                    op,
                    axis,
                    device,
                    keepdims,
                    "permuted " + msg,
                )


@pytest.mark.parametrize("device", DEVICES)
def test_split_reductions_are_deterministic(device):
    """The same split reduction twice gives the same bits (no float atomics anywhere)."""
    x = (100.0 + np.random.default_rng(28).random((200_000,))).astype(np.float32)
    a = nd.array(x, device=device)
    first = a.sum().numpy()
    for _ in range(3):
        np.testing.assert_array_equal(a.sum().numpy(), first)
    y = nd.array(_data((20_000, 64), 29), device=device)
    cols = y.sum(axis=0).numpy()
    np.testing.assert_array_equal(y.sum(axis=0).numpy(), cols)


_NO_SCRATCH = textwrap.dedent(
    """
    import sys
    import numpy as np
    import needle as ndl
    from needle import backend_ndarray as nd
    from needle import memory as mem

    dev = ndl.cuda()
    shape, axis = eval(sys.argv[1]), eval(sys.argv[2])
    x = np.random.default_rng(30).uniform(-2, 2, size=shape).astype(np.float32)
    a = nd.array(x, device=dev)  # over 1 MiB: its own segment; nothing small is cached
    limit = ndl.cuda.memory_reserved() + 512  # room for a segment of the result's size alone
    mem.set_memory_limit(dev, limit)
    for op in ("sum", "max", "min"):
        got = getattr(a, op)(axis=axis).numpy()
        want = getattr(np, op)(x.astype(np.float64), axis=axis)
        if op == "sum":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * x.shape[axis])
        else:
            np.testing.assert_array_equal(got, want.astype(np.float32))
        assert ndl.cuda.memory_reserved() <= limit
    print("ok")
    """
)


def _cuda_only(fn):
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


@_cuda_only
@pytest.mark.parametrize(
    "shape, axis", [((3, 300_001), 1), ((20_000, 64), 0)], ids=["split-rows", "split-columns"]
)
def test_split_without_scratch_runs_in_one_pass(shape, axis):
    """Under a limit that leaves room for the result only, a reduction that splits when it
    can (both shapes do: 36 slices of each row; 156 slices of the columns) still gives the
    right answer, in one pass without scratch, instead of failing. A fresh process, so that
    no cached block can hold the scratch."""
    env = dict(os.environ)
    env.pop("NEEDLE_MEMORY_LIMIT", None)
    out = subprocess.run(
        [sys.executable, "-c", _NO_SCRATCH, repr(shape), repr(axis)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("device", DEVICES)
def test_bad_reduction_input_is_a_clear_error(device):
    a = nd.array(np.ones((2, 3), np.float32), device=device)
    for bad in (2, (0, 5), -3):
        with pytest.raises((ValueError, IndexError), match="axis"):
            a.sum(axis=bad)
    np.testing.assert_array_equal(a.sum(axis=1).numpy(), [3.0, 3.0])  # still works after
