"""A linear layer's gradients (MatMulBias: x @ w + bias) in every dtype on every device.

Where the CPU widens a narrow product (float16; bfloat16 without AMX: needle_c._cpu_kernels()
lists them as 'linear_grads_one_pass'), gx = g @ w^T, gw = x^T @ g and gb = g's column sums
come from one pass over g (csrc/cpu/cpu_linear_grads.c) when the layer's input is narrow enough;
elsewhere, and whenever the gradients are recorded (create_graph=True), they are composed from
two matmuls and a sum. Either way each is a float32 sum rounded once to the dtype.
"""

import numpy as np
import pytest

import needle as ndl
import needle_c

from devices import dev

DTYPES = ["float32", "float16", "bfloat16", "float64"]
# Half an ulp of each dtype, relative: one rounding.
RTOL = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "float64": 2.0**-53}
# The error of a float32 (float64) sum, per term and unit magnitude.
ACC_EPS = {"float32": 2.0**-23, "float16": 2.0**-23, "bfloat16": 2.0**-23, "float64": 2.0**-52}

# (m, k, n): one pass on the CPU's widened narrow products (several chunks of columns, the
# last one short; two blocks of rows, the last short; panels cut at the edge) ...
ONE_PASS = (300, 8, 1100)
SHAPES = [
    ONE_PASS,
    (600, 16, 2048),  # ... whole chunks and blocks
    (7, 3, 5),  # composed: too small for the pass's scratch
    (64, 40, 96),  # composed: the input too wide
]


def layer(shape, dtype, device, bias_shape, seed=0):
    """x, w, bias tensors of dtype (values as the dtype holds them) and the out_grad g."""
    m, k, n = shape
    rng = np.random.default_rng(seed)

    def tensor(*dims, grad=True):
        return ndl.Tensor(rng.standard_normal(dims), dtype=dtype, device=device, requires_grad=grad)

    b = tensor(*bias_shape(n))
    return tensor(m, k), tensor(k, n), b, tensor(m, n, grad=False)


def grads(x, w, b, g, create_graph=False):
    for t in (x, w, b):
        t.grad = None
    ndl.ops.matmul_bias(x, w, b).backward(g, create_graph=create_graph)
    return [t.grad.numpy().astype(np.float64) for t in (x, w, b)]


def references(shape, x, w, b, g):
    """(name, exact value, error bound of a float32 sum: scale * terms, per unit eps) of gx, gw
    and gb from the stored values."""
    X, W, G = (t.numpy().astype(np.float64) for t in (x, w, g))
    m, k, n = shape
    flat = b.shape
    return (
        ("gx", G @ W.T, (np.abs(G) @ np.abs(W.T)) * n),
        ("gw", X.T @ G, (np.abs(X.T) @ np.abs(G)) * m),
        ("gb", G.sum(axis=0).reshape(flat), np.abs(G).sum(axis=0).reshape(flat) * m),
    )


def check_against_the_reference(shape, dtype, x, w, b, g, got):
    for (name, ref, bound), value, like in zip(references(shape, x, w, b, g), got, (x, w, b)):
        assert like.grad.dtype == dtype and like.grad.shape == like.shape, name
        np.testing.assert_array_less(
            np.abs(value - ref),
            np.abs(ref) * RTOL[dtype] + bound * ACC_EPS[dtype] + 1e-300,
            err_msg=name,
        )


@dev
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_shape", [lambda n: (1, n), lambda n: (n,)], ids=["row", "flat"])
def test_gradients_against_the_reference(device, dtype, shape, bias_shape):
    x, w, b, g = layer(shape, dtype, device, bias_shape)
    check_against_the_reference(shape, dtype, x, w, b, g, grads(x, w, b, g))


SUPPORTED = needle_c._cpu_kernels()["supported"]


@pytest.fixture(params=["baseline", "avx2", "avx512"])
def isa(request):
    """Each ISA this CPU runs, in force for the test (the one before put back)."""
    if request.param not in SUPPORTED:
        pytest.skip(f"this CPU lacks {request.param}")
    before = needle_c._cpu_kernels()["isa"]
    needle_c._set_cpu_isa(request.param)
    yield request.param
    needle_c._set_cpu_isa(before)


def one_pass(dtype, isa):
    """Skips unless dtype's linear gradients take one pass under isa."""
    if dtype not in needle_c._cpu_kernels()["linear_grads_one_pass"]:
        pytest.skip(f"{dtype}'s linear gradients are composed under {isa} here (AMX)")


@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_one_pass_per_isa(isa, dtype, shape):
    # Without AMX both narrow dtypes take the one pass; the recorded gradients are always
    # composed. The two differ only in the order of their float32 sums, each rounded once.
    one_pass(dtype, isa)
    x, w, b, g = layer(shape, dtype, ndl.cpu(), lambda n: (1, n), seed=1)
    fused = grads(x, w, b, g)
    check_against_the_reference(shape, dtype, x, w, b, g, fused)
    composed = grads(x, w, b, g, create_graph=True)
    for (name, _, bound), a, c in zip(references(shape, x, w, b, g), fused, composed):
        np.testing.assert_array_less(
            np.abs(a - c),
            (np.abs(a) + np.abs(c)) * RTOL[dtype] + 2 * bound * ACC_EPS[dtype],
            err_msg=name,
        )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_one_pass_gives_the_same_bits_on_any_number_of_threads(isa, dtype):
    one_pass(dtype, isa)
    x, w, b, g = layer(ONE_PASS, dtype, ndl.cpu(), lambda n: (1, n), seed=2)
    try:
        results = []
        for threads in (1, 2, 3):
            needle_c._set_num_threads(threads)
            results.append(grads(x, w, b, g))
    finally:
        needle_c._set_num_threads(0)
    for other in results[1:]:
        for a, c in zip(results[0], other):
            np.testing.assert_array_equal(a, c)


def test_the_report_names_the_one_pass_dtypes(isa):
    # float16 is always widened; bfloat16 where its matmul runs the float32 kernel (no AMX
    # kernel, or an ISA below AVX-512 in force).
    report = needle_c._cpu_kernels()
    listed = report["linear_grads_one_pass"]
    assert "float16" in listed
    assert ("bfloat16" in listed) == (report["gemm_bfloat16"] == report["gemm"])
