"""The CPU kernels per instruction set: every ISA this CPU runs gives the same matmul,
elementwise and reduction results (NumPy float64 as the oracle), forced in process
(needle_c._set_cpu_isa) and through NEEDLE_CPU_ISA in a subprocess; an ISA the CPU lacks
is refused with a warning, never run; the GEMM/BLAS split (measured or NEEDLE_GEMM_SPLIT)
sends products to either side with the same results; needle_c._cpu_kernels() says what runs.

The ISA is a property of the CPU backend, so these tests run on the CPU device only; the
matmul, ewise and reduction tests of tests/test_ndarray_*.py run every device with the
default (best) ISA.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import needle as ndl
import needle_c
from needle import backend_ndarray as nd

ISAS = ["baseline", "avx2", "avx512"]
SUPPORTED = needle_c._cpu_kernels()["supported"]


@pytest.fixture
def restore_cpu_settings():
    """Puts the ISA and the GEMM split back as they were."""
    before = needle_c._cpu_kernels()
    yield
    needle_c._set_cpu_isa(before["isa"])
    needle_c._set_gemm_split(before["gemm_split"])


def isa_params():
    return [
        pytest.param(
            isa, marks=pytest.mark.skipif(isa not in SUPPORTED, reason=f"this CPU lacks {isa}")
        )
        for isa in ISAS
    ]


# Shapes around every kernel's tile (4x8, 6x16, 8x32), B's packing threshold (m > 128), past
# a KC block (k > 256), the 2-D sizes of small models, and empty dims.
MATMUL_SHAPES = [
    (1, 1, 1),
    (3, 5, 7),
    (4, 9, 8),
    (6, 16, 16),
    (7, 3, 17),
    (8, 32, 32),
    (9, 33, 33),
    (13, 20, 48),
    (64, 64, 64),
    (64, 256, 10),
    (130, 40, 20),
    (20, 300, 260),
    (0, 4, 3),
    (3, 0, 4),
    (3, 4, 0),
]


def _operand(x, layout):
    """x as an NDArray laid out as asked: contiguous, a transposed view, or a strided slice."""
    if layout == "contiguous":
        return nd.array(x)
    if layout == "transposed":
        return nd.array(np.ascontiguousarray(np.swapaxes(x, -1, -2))).permute(
            tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
        )
    # every other column of a wider array: row stride 2*cols, column stride 2
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), np.float32)
    wide[..., ::2] = x
    key = (slice(None),) * (x.ndim - 1) + (slice(0, 2 * x.shape[-1], 2),)
    return nd.array(wide)[key]


def _check_matmul(x, y, la="contiguous", lb="contiguous", msg=""):
    expected = np.matmul(x.astype(np.float64), y.astype(np.float64))
    got = (_operand(x, la) @ _operand(y, lb)).numpy()
    assert got.shape == expected.shape, msg
    k = x.shape[-1]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * max(1, k), err_msg=msg)


@pytest.mark.parametrize("isa", isa_params())
def test_matmul_per_isa(isa, restore_cpu_settings):
    needle_c._set_cpu_isa(isa)
    needle_c._set_gemm_split(1 << 62)  # needle's GEMM for every product
    assert needle_c._cpu_kernels()["isa"] == isa
    assert needle_c._cpu_kernels()["gemm"].startswith({"baseline": "plain"}.get(isa, isa))
    rng = np.random.default_rng(5)
    for m, k, n in MATMUL_SHAPES:
        x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        y = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        for la in ("contiguous", "transposed", "strided"):
            for lb in ("contiguous", "transposed", "strided"):
                _check_matmul(x, y, la, lb, f"{isa} {m}x{k}x{n} A {la} B {lb}")


BATCHED = [
    ((6, 20, 32), (6, 32, 20)),  # attention scores: (B*H, T, d) @ (B*H, d, T)
    ((6, 20, 20), (6, 20, 32)),  # probs @ values
    ((2, 3, 20, 32), (1, 3, 32, 20)),  # broadcast batch dims
    ((5, 7, 9), (9, 4)),  # a shared right operand
    ((9, 4), (5, 4, 3)),  # a shared left operand
    ((0, 4, 5), (5, 2)),
    ((3, 4, 0), (3, 0, 2)),
]


@pytest.mark.parametrize("isa", isa_params())
def test_batched_matmul_per_isa(isa, restore_cpu_settings):
    needle_c._set_cpu_isa(isa)
    rng = np.random.default_rng(6)
    for sa, sb in BATCHED:
        x = rng.uniform(-1, 1, sa).astype(np.float32)
        y = rng.uniform(-1, 1, sb).astype(np.float32)
        for la in ("contiguous", "transposed", "strided"):
            for lb in ("contiguous", "transposed", "strided"):
                _check_matmul(x, y, la, lb, f"{isa} {sa}@{sb} A {la} B {lb}")


@pytest.mark.parametrize("isa", isa_params())
def test_elementwise_and_reductions_per_isa(isa, restore_cpu_settings):
    needle_c._set_cpu_isa(isa)
    rng = np.random.default_rng(7)
    # 1000 elements: vector bodies and scalar tails; a transposed view for strided loops
    x = rng.uniform(0.1, 3.0, (40, 25)).astype(np.float32)
    y = rng.uniform(-2.0, 2.0, (40, 25)).astype(np.float32)
    a, b = nd.array(x), nd.array(y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    cases = {
        "add": (a + b, x64 + y64),
        "mul": (a * b, x64 * y64),
        "div": (a / b, x64 / y64),
        "pow": (a**b, x64**y64),
        "square": (a**2, x64**2),
        "maximum": (a.maximum(b), np.maximum(x64, y64)),
        "exp": (b.exp(), np.exp(y64)),
        "log": (a.log(), np.log(x64)),
        "tanh": (b.tanh(), np.tanh(y64)),
        "sum rows": (b.sum(axis=1), y64.sum(axis=1)),
        "sum cols": (b.sum(axis=0), y64.sum(axis=0)),
        "max rows": (b.max(axis=1), y64.max(axis=1)),
        "add transposed": (a.permute((1, 0)) + b.permute((1, 0)), (x64 + y64).T),
        "copy transposed": (b.permute((1, 0)).compact(), y64.T),
    }
    for name, (got, expected) in cases.items():
        np.testing.assert_allclose(
            got.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=f"{isa} {name}"
        )


@pytest.mark.parametrize("isa", isa_params())
def test_softmax_rows_per_isa(isa, restore_cpu_settings):
    """The softmax row kernels (cpu_softmax_rows.inc) of each ISA: short rows (across-rows
    path), long rows (more than one L1 block), a growing max; cross-entropy loss and gradient,
    log-softmax and log-sum-exp against float64."""
    needle_c._set_cpu_isa(isa)
    rng = np.random.default_rng(9)
    for rows, cols in ((37, 20), (5, 3000), (3, 100)):
        z0 = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
        z0[:, -1] += np.arange(rows, dtype=np.float32)  # a max that grows in the last block
        y0 = rng.integers(0, cols, rows)
        z64 = z0.astype(np.float64)
        m = z64.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(z64 - m).sum(axis=1))
        grad = np.exp(z64 - lse[:, None])
        grad[np.arange(rows), y0] -= 1.0
        z = ndl.Tensor(z0)
        loss = ndl.softmax_cross_entropy(z, ndl.Tensor(y0.astype(np.float32), requires_grad=False))
        loss.backward()
        msg = f"{isa} ({rows}, {cols})"
        np.testing.assert_allclose(
            loss.numpy()[0], np.mean(lse - z64[np.arange(rows), y0]), rtol=1e-5, err_msg=msg
        )
        np.testing.assert_allclose(z.grad.numpy(), grad / rows, rtol=1e-4, atol=1e-7, err_msg=msg)
        np.testing.assert_allclose(
            ndl.ops.logsumexp(ndl.Tensor(z0), axes=(1,)).numpy(), lse, rtol=1e-5, err_msg=msg
        )
        np.testing.assert_allclose(
            ndl.ops.logsoftmax(ndl.Tensor(z0)).numpy(),
            z64 - lse[:, None],
            rtol=1e-5,
            atol=1e-5,
            err_msg=msg,
        )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("isa", isa_params())
def test_narrow_softmax_rows_per_isa(isa, dtype, restore_cpu_settings):
    """float16/bfloat16 logits through the row kernels of each ISA (read a block at a time,
    the gradient rounded once as it is stored): the loss is float32's loss of the same values
    bit for bit, and the gradient float32's gradient rounded to the dtype. Short rows, one
    block, several blocks, a last block shorter than the kernels' lanes (2048 + 7)."""
    needle_c._set_cpu_isa(isa)
    rng = np.random.default_rng(10)
    for rows, cols in ((37, 20), (4, 100), (5, 2055), (3, 5000)):
        z0 = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
        z0[:, -1] += np.arange(rows, dtype=np.float32)  # a max that grows in the last block
        labels = ndl.Tensor(rng.integers(0, cols, rows).astype(np.float32), requires_grad=False)
        z = ndl.Tensor(z0, dtype=dtype)
        wide = ndl.Tensor(z.numpy().astype(np.float32))
        loss, wide_loss = (ndl.softmax_cross_entropy(t, labels) for t in (z, wide))
        loss.backward()
        wide_loss.backward()
        msg = f"{isa} {dtype} ({rows}, {cols})"
        assert z.grad.dtype == dtype, msg
        np.testing.assert_array_equal(loss.numpy(), wide_loss.numpy(), err_msg=msg)
        rounded = ndl.Tensor(wide.grad.numpy(), dtype=dtype).numpy()
        np.testing.assert_array_equal(z.grad.numpy(), rounded, err_msg=msg)


def test_isas_agree_with_each_other(restore_cpu_settings):
    rng = np.random.default_rng(8)
    x = nd.array(rng.uniform(-1, 1, (70, 90)).astype(np.float32))
    y = nd.array(rng.uniform(-1, 1, (90, 50)).astype(np.float32))
    results = {}
    for isa in SUPPORTED:
        needle_c._set_cpu_isa(isa)
        results[isa] = ((x @ y).exp().sum(axis=1)).numpy()
    for isa, r in results.items():
        np.testing.assert_allclose(r, results[SUPPORTED[0]], rtol=1e-5, err_msg=isa)


def test_both_sides_of_the_gemm_split_agree(restore_cpu_settings):
    if needle_c._blas().startswith("needle"):
        pytest.skip("no BLAS installed: needle's GEMM runs every product")
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, (3, 70, 90)).astype(np.float32)
    y = rng.uniform(-1, 1, (90, 80)).astype(np.float32)
    needle_c._set_gemm_split(0)  # every product from 64^3 up: the BLAS
    blas = (nd.array(x) @ nd.array(y)).numpy()
    needle_c._set_gemm_split(1 << 62)  # none
    ours = (nd.array(x) @ nd.array(y)).numpy()
    np.testing.assert_allclose(blas, ours, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, np.matmul(x.astype(np.float64), y), rtol=1e-4, atol=1e-4)


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.parametrize("isa", isa_params())
def test_narrow_matmul_kernels_per_isa(isa, restore_cpu_settings):
    # bfloat16 runs AMX's tiles only under AVX-512 on a CPU with AMX-BF16 (and Linux's leave);
    # everywhere else both narrow types widen their blocks into the ISA's float32 kernel.
    needle_c._set_cpu_isa(isa)
    info = needle_c._cpu_kernels()
    assert info["gemm_float16"] == info["gemm"]
    flags = _cpu_flags()
    if isa != "avx512" or not {"amx_bf16", "amx_tile"} <= flags:
        assert info["gemm_bfloat16"] == info["gemm"]
    elif sys.platform == "linux":
        assert info["gemm_bfloat16"] == "amx-bf16 32x32"
    rng = np.random.default_rng(5)
    # Edges of the 32 x 32 AMX tile and of its 32-value inner steps, odd inner sizes, both
    # operands transposed, and a batch.
    for dtype in ("bfloat16", "float16"):
        for m, k, n in [(1, 1, 1), (33, 31, 17), (70, 65, 300), (96, 513, 40)]:
            for ta in (False, True):
                for tb in (False, True):
                    x = rng.standard_normal((k, m) if ta else (m, k))
                    y = rng.standard_normal((n, k) if tb else (k, n))
                    a = nd.array(x, dtype=dtype)
                    b = nd.array(y, dtype=dtype)
                    a = a.permute((1, 0)) if ta else a
                    b = b.permute((1, 0)) if tb else b
                    va = a.astype("float64").numpy()
                    vb = b.astype("float64").numpy()
                    got = (a @ b).astype("float64").numpy()
                    bound = np.abs(va) @ np.abs(vb)
                    np.testing.assert_array_less(
                        np.abs(got - va @ vb),
                        bound * (2.0**-7 if dtype == "bfloat16" else 2.0**-10) + 1e-6,
                        err_msg=f"{isa} {dtype} {m}x{k}x{n} ta={ta} tb={tb}",
                    )
        x = rng.standard_normal((3, 40, 50))
        y = rng.standard_normal((50, 33))
        a, b = nd.array(x, dtype=dtype), nd.array(y, dtype=dtype)
        va, vb = a.astype("float64").numpy(), b.astype("float64").numpy()
        got = (a @ b).astype("float64").numpy()
        bound = np.abs(va) @ np.abs(vb)
        assert np.all(np.abs(got - va @ vb) <= bound * 2.0**-7 + 1e-6), f"{isa} {dtype} batch"
        # A linear layer's bias goes into the stores: small integers whose sums and the bias'
        # quarter steps are exact in float32, so the result is one rounding of the exact value,
        # bit for bit, over row widths that take each width of the ISA's stores and a tail.
        for m, k, n in [(7, 5, 300), (3, 4, 37)]:
            x = rng.integers(-4, 5, (m, k)).astype(np.float64)
            w = rng.integers(-4, 5, (k, n)).astype(np.float64)
            bias = rng.integers(-400, 400, n) / 64.0
            t = [ndl.Tensor(nd.array(v, dtype=dtype), dtype=dtype) for v in (x, w, bias)]
            got = ndl.ops.matmul_bias(*t).numpy().astype(np.float64)
            exact = nd.array(x @ w + t[2].numpy().astype(np.float64), dtype=dtype)
            np.testing.assert_array_equal(
                got, exact.astype("float64").numpy(), err_msg=f"{isa} {dtype} linear {m}x{k}x{n}"
            )


def test_cpu_kernels_report():
    info = needle_c._cpu_kernels()
    assert set(info) >= {
        "isa",
        "best",
        "supported",
        "env",
        "gemm",
        "gemm_bfloat16",
        "gemm_float16",
        "elementwise",
        "blas",
    }
    assert info["supported"][0] == "baseline"
    assert info["best"] == info["supported"][-1]
    assert info["isa"] in info["supported"]
    assert info["elementwise"] == info["isa"]
    assert info["supported"] == [i for i in ISAS if i in info["supported"]]


def test_calibration_report(restore_cpu_settings):
    if needle_c._blas().startswith("needle"):
        with pytest.raises(ValueError, match="no BLAS"):
            needle_c._calibrate_gemm()
        return
    report = needle_c._calibrate_gemm()
    assert report["sizes"][0]["size"] == 64
    for row in report["sizes"]:
        assert row["needle_s"] > 0 and row["blas_s"] > 0
    assert needle_c._cpu_kernels()["gemm_split"] == report["split"]
    assert needle_c._cpu_kernels()["calibration"] == report
    wins = [r["size"] ** 3 for r in report["sizes"] if r["blas_s"] < r["needle_s"]]
    if report["split"] < 2**62:
        assert report["split"] in wins or report["split"] == 8 * 512**3


def test_bad_arguments_raise(restore_cpu_settings):
    with pytest.raises(ValueError, match="unknown CPU instruction set 'avx9'"):
        needle_c._set_cpu_isa("avx9")
    with pytest.raises(TypeError, match="expected a str"):
        needle_c._set_cpu_isa(2)
    with pytest.raises(TypeError, match="expected a str"):
        needle_c._limit_cpu_isa(None)
    with pytest.raises(ValueError, match="expected a count >= 0"):
        needle_c._set_gemm_split(-5)
    with pytest.raises(TypeError, match="int or None"):
        needle_c._set_gemm_split(1.5)
    # nothing changed, and the next call works
    assert needle_c._cpu_kernels()["isa"] in SUPPORTED
    a = nd.array(np.eye(3, dtype=np.float32))
    np.testing.assert_array_equal((a @ a).numpy(), np.eye(3))


# --------------------------------------------------------------------------
# a fresh process: the environment at import, and a CPU emulated as lesser
# --------------------------------------------------------------------------

PROBE = """
import json, warnings, numpy as np
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import needle as ndl
import needle_c
from needle import backend_ndarray as nd
rng = np.random.default_rng(1)
x = rng.uniform(-1, 1, (4, 37, 45)).astype(np.float32)
y = rng.uniform(-1, 1, (45, 70)).astype(np.float32)
got = (nd.array(x) @ nd.array(y)).numpy()
err = float(np.abs(got - np.matmul(x.astype(np.float64), y)).max())
e = nd.array(x).exp().sum(axis=2).numpy()
err_ewise = float(np.abs(e - np.exp(x.astype(np.float64)).sum(axis=2)).max() / 45)
info = needle_c._cpu_kernels()
print(json.dumps({"info": {k: info[k] for k in ("isa", "best", "env", "gemm_split")},
                  "warnings": [str(w.message) for w in caught], "err": err,
                  "err_ewise": err_ewise}))
"""


def _probe(env_extra, code=PROBE):
    env = dict(os.environ)
    env.pop("NEEDLE_CPU_ISA", None)
    env.pop("NEEDLE_GEMM_SPLIT", None)
    env.update(env_extra)
    # the same needle_c and needle as this process, whichever build that is
    paths = [os.path.dirname(needle_c.__file__), os.path.dirname(os.path.dirname(ndl.__file__))]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("isa", isa_params())
def test_env_forces_isa_in_a_fresh_process(isa):
    out = _probe({"NEEDLE_CPU_ISA": isa})
    assert out["info"]["isa"] == isa
    assert out["info"]["env"] == isa
    assert out["warnings"] == []
    assert out["err"] < 1e-4
    assert out["err_ewise"] < 1e-5


# An unknown NEEDLE_CPU_ISA or a malformed NEEDLE_GEMM_SPLIT stops the import with a
# ValueError: tests/test_environment.py, with every other variable's bad values.


def test_env_gemm_split():
    out = _probe({"NEEDLE_GEMM_SPLIT": "123456789"})
    assert out["info"]["gemm_split"] == 123456789
    assert out["warnings"] == []


LESSER = """
import json, needle_c
needle_c._limit_cpu_isa("baseline")
out = {"after_limit": needle_c._cpu_kernels()["isa"]}
try:
    needle_c._set_cpu_isa("avx2")
    out["refused"] = None
except ValueError as e:
    out["refused"] = str(e)
out["isa"] = needle_c._cpu_kernels()["isa"]
out["supported"] = needle_c._cpu_kernels()["supported"]
print(json.dumps(out))
"""


def test_an_isa_the_cpu_lacks_is_refused():
    """On a CPU emulated as baseline-only, asking for AVX2 raises and nothing changes."""
    out = _probe({}, LESSER)
    assert out["after_limit"] == "baseline"
    assert out["refused"] is not None and "this CPU cannot run avx2 kernels" in out["refused"]
    assert out["isa"] == "baseline"
    assert out["supported"] == ["baseline"]


def test_env_isa_the_cpu_lacks_warns():
    """The same refusal at import: a warning that names what runs instead, never SIGILL."""
    lacking = [isa for isa in ISAS if isa not in SUPPORTED]
    if not lacking:
        pytest.skip("this CPU runs every ISA (the refusal is tested on an emulated CPU above)")
    out = _probe({"NEEDLE_CPU_ISA": lacking[0]})
    assert any("cannot run" in w for w in out["warnings"]), out["warnings"]
    assert out["info"]["isa"] == out["info"]["best"]
