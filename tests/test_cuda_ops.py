"""The CUDA backend's operations against the CPU backend: the same NumPy data through both, over
contiguous, offset, stepped, negative-step, transposed, flipped, broadcast and as_strided views.
Elementwise binary, scalar and unary ops and their special values (inf, nan, -0.0); reductions
(sum, max, min) over every path the kernels take (warp per row, block per output, long columns)
with NaN and empty axes; 2-D, batched and broadcast matmul, transposed operands read in place,
and needle's own SGEMM kernel against cuBLAS (NEEDLE_CUBLAS=0); gather/scatter of rows and the
softmax cross-entropy, with bad indices and labels reported at the next synchronisation. All are
marked ``cuda``: they need a GPU or the simulator (tests/cuda_sim.sh).
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from cuda_check import (  # noqa: F401  (no_limits_left: an autouse fixture)
    CUDA,
    assert_close,
    cuda_test,
    no_limits_left,
    random_f32,
    view_pairs,
)

# ---------------------------------------------------------------- elementwise


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
    # pick(x, c) is half of where (the other half adds -0, which changes nothing).
    "pick": lambda x, y: ndl.ops.where(
        ndl.Tensor(y, device=y.device), ndl.Tensor(x, device=x.device), -0.0
    ).numpy(),
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
    "erf": lambda x: x.erf(),
    "gelu": lambda x: x.gelu(),
    "silu": lambda x: x.silu(),
    "gelu_tanh": lambda x: x.gelu_tanh(),
}

EWISE_OPS_H = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "ewise_ops.h"


def listed_ops(macro):
    """The entries of one X-macro list in csrc/ewise_ops.h, the op list both backends expand:
    [(name, rest of the entry)] in list order, e.g. ("square", "2.0f, x * x")."""
    text = EWISE_OPS_H.read_text()
    body = re.search(rf"#define {macro}\(X, A\)(.*?)\n\n", text, re.S).group(1)
    # The pow rows name the enum ND_<id>; the catalogue's rows (unary, binary) name <id>.
    return re.findall(r"X\(A, (?:ND_)?\w+, (\w+), (.*?)\)?\s*\\?$", body, re.M)


# The exponents that run an exact form of pow instead of powf, and three that do not.
POW_FORM_EXPONENTS = [
    float(rest.split(",")[0].rstrip("f")) for _, rest in listed_ops("ND_EWISE_POW_FORMS")
]
SCALARS = POW_FORM_EXPONENTS + [0.5, -2.5, 0.0]


def test_the_checks_here_cover_every_op_in_the_list():
    """A new op in csrc/ewise_ops.h must get its CPU-against-CUDA check below."""
    assert [name for name, _ in listed_ops("ND_EWISE_BINARY_OPS")] == list(BINARY)
    assert [name for name, _ in listed_ops("ND_EWISE_UNARY_OPS")] == list(UNARY)
    assert POW_FORM_EXPONENTS == [2.0, 3.0, -1.0]


@cuda_test
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_on_views_matches_cpu(name):
    fn = BINARY[name]
    base_a, base_b = random_f32((8, 12), 1), random_f32((8, 12), 2)
    base_b[1, :] = base_a[1, :]  # some equal elements for the comparisons
    for (kind_a, ca), (_, ga) in view_pairs(base_a):
        for (kind_b, cb), (_, gb) in view_pairs(base_b):
            assert_close(fn(ca, cb), fn(ga, gb), rtol=1e-5, msg=f"{name} {kind_a} {kind_b}")
    # broadcasting between shapes
    ca, ga = nd.array(base_a[:4, :1], device=ndl.cpu()), nd.array(base_a[:4, :1], device=CUDA)
    cb, gb = nd.array(base_b[:1, :6], device=ndl.cpu()), nd.array(base_b[:1, :6], device=CUDA)
    assert_close(fn(ca, cb), fn(ga, gb), msg=f"{name} broadcast (4,1) (1,6)")


@cuda_test
@pytest.mark.parametrize("scalar", SCALARS)
def test_scalar_ops_match_cpu(scalar):
    base = random_f32((8, 12), 3)
    for (kind, c), (_, g) in view_pairs(base):
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
            assert_close(fn(c), fn(g), rtol=1e-5, msg=f"{kind} scalar {scalar}")


@cuda_test
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_on_views_matches_cpu(name):
    fn = UNARY[name]
    base = random_f32((8, 12), 4) * 4
    for (kind, c), (_, g) in view_pairs(base):
        assert_close(fn(c), fn(g), rtol=1e-5, atol=1e-6, msg=f"{name} {kind}")


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
        # The exact forms: equal on both and to NumPy's (up to the sign of a zero).
        for e in POW_FORM_EXPONENTS:
            want = (x.astype(np.float64) ** e).astype(np.float32)
            np.testing.assert_array_equal((g**e).numpy(), (c**e).numpy(), err_msg=f"**{e}")
            np.testing.assert_array_equal((c**e).numpy(), want, err_msg=f"**{e}")


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
    x = random_f32(shape, 9)
    c, g = nd.array(x, device=ndl.cpu()), nd.array(x, device=CUDA)
    for keepdims in (False, True):
        want = getattr(c, op)(axis=axis, keepdims=keepdims)
        got = getattr(g, op)(axis=axis, keepdims=keepdims)
        rtol = 1e-4 if op == "sum" else 0
        atol = 1e-3 if op == "sum" else 0
        assert_close(want, got, rtol=rtol, atol=atol, msg=f"{op} {shape} {axis} {keepdims}")
    # the same on a non-contiguous view
    if len(shape) >= 2:
        axes = tuple(reversed(range(len(shape))))
        cv, gv = c.permute(axes), g.permute(axes)
        ax = None if axis is None else tuple(len(shape) - 1 - int(a) for a in np.atleast_1d(axis))
        assert_close(getattr(cv, op)(axis=ax), getattr(gv, op)(axis=ax), rtol=1e-4, atol=1e-3)


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
    a, b = random_f32((m, k), 10), random_f32((k, n), 11)
    ca, cb = nd.array(a, device=ndl.cpu()), nd.array(b, device=ndl.cpu())
    ga, gb = nd.array(a, device=CUDA), nd.array(b, device=CUDA)
    assert_close(ca @ cb, ga @ gb, rtol=1e-4, atol=1e-4)
    # transposed operands (read in place as CUBLAS_OP_T), and sliced ones
    at, bt = nd.array(a.T.copy(), device=CUDA), nd.array(b.T.copy(), device=CUDA)
    assert_close(ca @ cb, at.permute((1, 0)) @ bt.permute((1, 0)), rtol=1e-4, atol=1e-4)
    assert_close(ca @ cb, ga @ bt.permute((1, 0)), rtol=1e-4, atol=1e-4)


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
    a, b = random_f32(sa, 12), random_f32(sb, 13)
    want = nd.array(a, device=ndl.cpu()) @ nd.array(b, device=ndl.cpu())
    got = nd.array(a, device=CUDA) @ nd.array(b, device=CUDA)
    assert_close(want, got, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got.numpy(), np.matmul(a, b), rtol=1e-4, atol=1e-4)


@cuda_test
def test_matmul_non_uniform_batch_strides():
    """Batch dims that cannot merge into one stride: a loop of strided-batched GEMMs."""
    base = random_f32((4, 6, 8, 8), 14)
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
    table = random_f32((10, 5), 15)
    idx = np.array([[3, 0, 9], [3, 3, 1]], dtype=np.float32)
    src = random_f32((2, 3, 5), 16)
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
    table = ndl.Tensor(random_f32((10, 4), 17), device=CUDA)
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
    target = ndl.Tensor(random_f32((4, 4), 18), device=CUDA)
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
    table = ndl.Tensor(random_f32((10, 4), 19), device=CUDA)

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
    logits = ndl.Tensor(random_f32((3, 5), 20), device=CUDA)
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
