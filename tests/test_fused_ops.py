"""The transformer's fused ops (csrc/fused_rows.c and its kernels, needle_c/autograd/ops_fused.c)
and the cycle-free backward's gradient accumulation.

- LayerNorm(eps)(x, w, b), what LayerNorm1d runs: forward and gradients against float64 NumPy
  and finite differences on every device in both graph modes (one row, one feature, rows
  longer than a warp, dims that are not multiples of 4 or 32, 3-D input, many backward
  chunks, no rows, strided input, eps), against the course's composition of ops, second
  derivatives of its recorded gradient, bad inputs.
- AttentionSoftmax(divisor, causal)(logits), what MultiHeadAttention runs: the same checks,
  causal masks with more keys than queries and more queries than keys (rows that see no key
  stay uniform, as the course's mask makes them), and MultiHeadAttention against its unfused
  ops (a subclass with its own mask or softmax gets the unfused path).
- Gradient accumulation: the same gradients as before in both modes for nodes and leaves
  used many times and with retain_grad; N contributions make no new array beyond the first
  sum; an array also held elsewhere (a .grad, a user's tensor, a view, NumPy memory through
  DLPack) is never written into.
- On a GPU (the simulator in CI), the exact launch counts of each.
"""

import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.autograd import graph_mode

from devices import dev, needs_cuda
from gradcheck import check_op, numerical_gradient

MODES = ndl.autograd.GRAPH_MODES
FLT_MAX = float(np.finfo(np.float32).max)


def cuda(test):
    """Marks a test as CUDA-only (skipped without a GPU, run on the simulator in CI)."""
    for mark in needs_cuda:
        test = mark(test)
    return test


def tensor(a, device, requires_grad=True):
    return ndl.Tensor(np.asarray(a, dtype=np.float32), device=device, requires_grad=requires_grad)


# --------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------


def ln_ref(x, w, b, eps=1e-5):
    """The course's LayerNorm1d over the last axis, in float64."""
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return w.reshape(-1) * (x - m) / np.sqrt(v + eps) + b.reshape(-1)


def ln_grad_x_ref(x, w, g, eps=1e-5):
    """d/dx of sum(g * ln_ref(x, w, b)), in float64."""
    m = x.mean(axis=-1, keepdims=True)
    std = np.sqrt(((x - m) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - m) / std
    gw = g * w.reshape(-1)
    mean = lambda a: a.mean(axis=-1, keepdims=True)  # noqa: E731
    return (gw - mean(gw) - xhat * mean(gw * xhat)) / std


def course_layer_norm(x, w, b, eps=1e-5):
    """LayerNorm1d's forward as the course composes it (and needle did before the fused op)."""
    shape = x.shape
    d = shape[-1]
    flat = x.reshape((int(np.prod(shape[:-1])), d))
    n = flat.shape[0]
    mean = (flat.sum((1,)) / d).reshape((n, 1)).broadcast_to(flat.shape)
    centered = flat - mean
    var = ((centered**2).sum((1,)) / d).reshape((n, 1)).broadcast_to(flat.shape)
    ww = w.reshape((1, d)).broadcast_to(flat.shape)
    bb = b.reshape((1, d)).broadcast_to(flat.shape)
    return (ww * centered / ((var + eps) ** 0.5) + bb).reshape(shape)


def causal_mask(lq, lk):
    return -FLT_MAX * np.triu(np.ones((lq, lk)), lk - lq + 1)


def attn_ref(x, divisor, causal):
    """softmax(x / divisor + the course's causal mask) over the last axis, in float64."""
    v = x / divisor
    if causal:
        v = v + causal_mask(*x.shape[-2:])
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attn_grad_ref(y, g, divisor):
    """d/dx of sum(g * attention softmax) from its output y: the mask is a constant."""
    return y * (g - (g * y).sum(axis=-1, keepdims=True)) / divisor


# --------------------------------------------------------------------------
# layer norm
# --------------------------------------------------------------------------

LN_SHAPES = {
    "one-row": (1, 5),
    "one-feature": (4, 1),
    "course": (6, 20),
    "odd-dims": (33, 37),
    "3-d": (2, 3, 20),
    "long-rows": (3, 70),
    "many-chunks": (300, 7),
}


@dev
@pytest.mark.parametrize("shape", LN_SHAPES.values(), ids=list(LN_SHAPES))
def test_layer_norm_against_numpy_and_finite_differences(device, shape):
    rng = np.random.default_rng(1)
    x = rng.normal(size=shape) * 2 + 0.5
    w = rng.normal(size=shape[-1:])
    b = rng.normal(size=shape[-1:])
    check_op(
        lambda x, w, b: ndl.ops.layer_norm(x, w, b),
        x,
        w,
        b,
        device=device,
        reference=ln_ref,
        rtol=1e-4,
        atol=1e-5,
        modes_atol=1e-6,  # the fused backward against the recorded composition
    )


@dev
@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.5, 10.0])
def test_layer_norm_eps(device, eps):
    rng = np.random.default_rng(2)
    x, w, b = rng.normal(size=(5, 9)), rng.normal(size=9), rng.normal(size=9)
    check_op(
        lambda x, w, b: ndl.ops.layer_norm(x, w, b, eps=eps),
        x,
        w,
        b,
        device=device,
        reference=lambda x, w, b: ln_ref(x, w, b, eps),
        rtol=1e-4,
        atol=1e-5,
        modes_atol=1e-6,
    )


@dev
def test_layer_norm_of_constant_rows_is_the_bias(device):
    b0 = np.arange(6, dtype=np.float32)
    x, w, b = tensor(np.full((3, 6), 7.5), device), tensor(np.ones(6), device), tensor(b0, device)
    y = ndl.ops.layer_norm(x, w, b, eps=0.25)
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to(b0, (3, 6)))
    (y * tensor(np.ones((3, 6)), device, False)).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros(6))
    np.testing.assert_array_equal(b.grad.numpy(), np.full(6, 3.0))


@dev
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(7, 20), (2, 5, 20), (40, 33)])
def test_layer_norm1d_matches_the_course_composition(device, mode, shape):
    rng = np.random.default_rng(3)
    x0, g0 = rng.normal(size=shape) * 3 + 1, rng.normal(size=shape)
    w0, b0 = rng.normal(size=shape[-1]), rng.normal(size=shape[-1])
    results = []
    for forward in (lambda x, w, b: nn.LayerNorm1d.forward(module, x), course_layer_norm):
        with graph_mode(mode):
            module = nn.LayerNorm1d(shape[-1], device=device)
            module.w, module.b = nn.Parameter(tensor(w0, device)), nn.Parameter(tensor(b0, device))
            x = tensor(x0, device)
            y = forward(x, module.w, module.b)
            (y * tensor(g0, device, False)).sum().backward()
            results.append([y.numpy(), x.grad.numpy(), module.w.grad.numpy(), module.b.grad])
            if mode == "needle" and len(results) == 1:
                assert type(y.op).__name__ == "LayerNorm"
                assert y.inputs[0] is x and y.inputs[1] is module.w and y.inputs[2] is module.b
    (fused, *fused_grads), (course, *course_grads) = results
    np.testing.assert_allclose(fused, course, rtol=1e-5, atol=1e-5)
    for a, b in zip(fused_grads[:2], course_grads[:2]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused_grads[2].numpy(), course_grads[2].numpy(), rtol=1e-5)


def exact_layer_norm_quartic(x, eps=1e-5):
    """LayerNorm's y and the gradient of sum(y**4) with respect to x, in float64."""
    m = x.mean(-1, keepdims=True)
    s = np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps)
    y = (x - m) / s
    g = 4 * y**3
    return y, (g - g.mean(-1, keepdims=True) - y * (g * y).mean(-1, keepdims=True)) / s


@dev
@pytest.mark.parametrize("mode", MODES)
def test_layer_norm_gradient_where_its_terms_cancel(device, mode):
    # hw2's test_nn_layernorm_backward_1: for rows of three, sum(y**4) is constant but for
    # eps, so the gradient is a difference of terms about 1e4 times its size. Computed in
    # float32 it was 2% off for one element (7e-6 against the course's atol of 1e-5); in
    # double from the float32 inputs it is within 2e-7 of the exact value.
    np.random.seed(18)
    x0 = (np.random.randint(0, 100, size=(3, 3)) / 20).astype(np.float32)
    rows = np.random.default_rng(1).standard_normal((50, 37)).astype(np.float32) * 3 + 1
    for data, atol in ((x0, 5e-7), (rows, 5e-6)):
        y_exact, dx_exact = exact_layer_norm_quartic(data.astype(np.float64))
        with graph_mode(mode):
            x = ndl.Tensor(data, device=device)
            y = nn.LayerNorm1d(data.shape[-1], device=device)(x)
            (y**4).sum().backward()
        np.testing.assert_allclose(y.numpy(), y_exact, rtol=0, atol=3e-7)
        np.testing.assert_allclose(x.grad.numpy(), dx_exact, rtol=1e-6, atol=atol)


@dev
def test_layer_norm_of_strided_input_and_shaped_parameters(device):
    rng = np.random.default_rng(4)
    x0, w0, b0 = rng.normal(size=(9, 4)), rng.normal(size=(1, 9)), rng.normal(size=(9, 1))
    x = tensor(x0, device)
    w, b = tensor(w0, device), tensor(b0, device)
    y = ndl.ops.layer_norm(x.transpose(), w, b)  # (4, 9), rows strided
    np.testing.assert_allclose(y.numpy(), ln_ref(x0.T, w0, b0), rtol=1e-5, atol=1e-5)
    g0 = rng.normal(size=(4, 9))
    (y * tensor(g0, device, False)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), ln_grad_x_ref(x0.T, w0, g0).T, rtol=1e-4, atol=1e-5)
    assert w.grad.shape == (1, 9) and b.grad.shape == (9, 1)
    np.testing.assert_allclose(b.grad.numpy().reshape(-1), g0.sum(axis=0), rtol=1e-5, atol=1e-5)


@dev
@pytest.mark.parametrize("mode", MODES)
def test_layer_norm_of_no_rows(device, mode):
    with graph_mode(mode):
        x, w, b = (
            tensor(np.zeros((0, 5)), device),
            tensor(np.ones(5), device),
            tensor(np.ones(5), device),
        )
        y = ndl.ops.layer_norm(x, w, b)
        assert y.shape == (0, 5)
        y.sum().backward()
        np.testing.assert_array_equal(w.grad.numpy(), np.zeros(5))
        np.testing.assert_array_equal(b.grad.numpy(), np.zeros(5))
        assert x.grad.shape == (0, 5)


@dev
def test_layer_norm_bad_inputs_raise_and_leave_it_working(device):
    x, w, b = (
        tensor(np.ones((3, 5)), device),
        tensor(np.ones(5), device),
        tensor(np.zeros(5), device),
    )
    bad = [
        (lambda: ndl.ops.layer_norm(x, tensor(np.ones(4), device), b), ValueError, "weight"),
        (lambda: ndl.ops.layer_norm(x, w, tensor(np.ones(6), device)), ValueError, "bias"),
        (lambda: ndl.ops.layer_norm(tensor(np.ones((3, 0)), device), w, b), ValueError, "empty"),
        (lambda: ndl.ops.layer_norm(x, w, b, eps=-1.0), ValueError, "eps"),
        (lambda: ndl.ops.layer_norm(x, w, b, eps=float("nan")), ValueError, "eps"),
        (lambda: ndl.ops.layer_norm(x, w, b, eps=float("inf")), ValueError, "eps"),
        (lambda: ndl.ops.LayerNorm(1e-5)(x, w), TypeError, "3 inputs"),
        (lambda: ndl.ops.LayerNorm()(x, w, b), TypeError, None),
        (lambda: ndl.ops.LayerNorm(1e-5)(x, w, np.zeros(5)), TypeError, None),
        (lambda: nn.LayerNorm1d(4, device=device)(x), ValueError, "last dimension 4"),
    ]
    for call, error, words in bad:
        with pytest.raises(error, match=words):
            call()
    y = ndl.ops.layer_norm(x, w, b)  # still works
    np.testing.assert_array_equal(y.numpy(), np.zeros((3, 5)))


@dev
def test_fused_ops_across_devices_are_a_device_error(device):
    other = ndl.cpu_numpy() if device == ndl.cpu() else ndl.cpu()  # another host device
    x, w, b = tensor(np.ones((2, 3)), device), tensor(np.ones(3), other), tensor(np.ones(3), device)
    with pytest.raises(ndl.DeviceError):
        ndl.ops.layer_norm(x, w, b)
    with pytest.raises(ndl.DeviceError):
        ndl.ops.layer_norm(x, b, tensor(np.ones(3), other))
    y = ndl.ops.attention_softmax(x)
    with pytest.raises(ndl.DeviceError):
        y.backward(tensor(np.ones((2, 3)), other, False))
    np.testing.assert_allclose(ndl.ops.layer_norm(x, b, b).numpy(), np.ones((2, 3)))


@dev
@pytest.mark.parametrize("mode", MODES)
def test_layer_norm_second_derivatives(device, mode):
    rng = np.random.default_rng(5)
    x0, w0, b0 = rng.normal(size=(4, 6)), rng.normal(size=6), rng.normal(size=6)
    g0, v0 = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    with graph_mode(mode):
        x, w, b = tensor(x0, device), tensor(w0, device), tensor(b0, device)
        y = (ndl.ops.layer_norm(x, w, b) * tensor(g0, device, False)).sum()
        y.backward(create_graph=True) if mode == "cycle_free" else y.backward()
        np.testing.assert_allclose(x.grad.numpy(), ln_grad_x_ref(x0, w0, g0), rtol=1e-4, atol=1e-5)
        g, x.grad, w.grad, b.grad = x.grad, None, None, None  # cycle_free would add to them
        (g * tensor(v0, device, False)).sum().backward()

    def first(x, w):
        return float(np.sum(v0 * ln_grad_x_ref(x, w, g0)))

    for i, t in ((0, x), (1, w)):
        fd = numerical_gradient(first, [x0, w0], i, 1e-6)
        np.testing.assert_allclose(t.grad.numpy(), fd, rtol=1e-3, atol=1e-4)


# --------------------------------------------------------------------------
# attention softmax
# --------------------------------------------------------------------------

ATTN_CASES = {
    "rows": ((4, 6), 1.0, False),
    "one-key": ((3, 1), 1.0, False),
    "1-d": ((9,), 2.0, False),
    "scaled": ((2, 3, 5, 5), float(np.sqrt(32)), False),
    "causal": ((2, 3, 5, 5), 2.0, True),
    "more-keys": ((1, 2, 3, 7), 1.5, True),
    "long-rows": ((2, 3, 70), 3.0, True),
    "one-query": ((2, 1, 9), 1.0, True),
}


@dev
@pytest.mark.parametrize("case", ATTN_CASES.values(), ids=list(ATTN_CASES))
def test_attention_softmax_against_numpy_and_finite_differences(device, case):
    shape, divisor, causal = case
    x = np.random.default_rng(6).normal(size=shape) * 3
    check_op(
        lambda x: ndl.ops.attention_softmax(x, divisor, causal=causal),
        x,
        device=device,
        reference=lambda x: attn_ref(x, divisor, causal),
        rtol=1e-5,
        atol=1e-6,
        modes_atol=1e-6,
    )


@dev
@pytest.mark.parametrize("mode", MODES)
def test_attention_softmax_rows_that_see_no_key_are_uniform(device, mode):
    # 7 queries, 3 keys: queries 0..3 see none, and the course's -finfo.max added to every
    # logit of such a row leaves them equal; the mask is a constant of the gradient.
    rng = np.random.default_rng(7)
    x0, g0 = rng.normal(size=(2, 1, 7, 3)), rng.normal(size=(2, 1, 7, 3))
    with graph_mode(mode):
        x = tensor(x0, device)
        y = ndl.ops.attention_softmax(x, 2.0, causal=True)
        want = attn_ref(x0, 2.0, True)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(y.numpy()[:, :, :4], np.full((2, 1, 4, 3), 1 / 3), rtol=1e-6)
        (y * tensor(g0, device, False)).sum().backward()
        np.testing.assert_allclose(
            x.grad.numpy(), attn_grad_ref(want, g0, 2.0), rtol=1e-4, atol=1e-6
        )


class UnfusedAttention(nn.MultiHeadAttention):
    """MultiHeadAttention with a softmax of its own: the course's unfused ops."""

    def softmax(self, logit):
        return super().softmax(logit)


@dev
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dims", [(2, 3, 5, 5, 4), (1, 2, 3, 7, 8), (2, 1, 7, 3, 4)])
def test_multi_head_attention_matches_its_unfused_ops(device, mode, causal, dims):
    b, h, lq, lk, d = dims
    rng = np.random.default_rng(8)
    arrays = [rng.normal(size=(b, h, n, d)) for n in (lq, lk, lk)]
    g0 = rng.normal(size=(b, h, lq, d))
    results = []
    for cls in (nn.MultiHeadAttention, UnfusedAttention):
        with graph_mode(mode):
            attention = cls(causal=causal, device=device)
            attention.eval()
            q, k, v = (tensor(a, device) for a in arrays)
            out, probs = attention(q, k, v)
            assert (type(probs.op).__name__ == "AttentionSoftmax") == (cls is nn.MultiHeadAttention)
            (out * tensor(g0, device, False)).sum().backward()
            results.append([out.numpy(), probs.numpy(), q.grad.numpy(), k.grad.numpy()])
            results[-1].append(v.grad.numpy())
    for fused, unfused in zip(*results):
        np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-6)


@dev
def test_a_subclass_mask_is_used(device):
    class NoMask(nn.MultiHeadAttention):
        def create_causal_mask(self, i, j, device):
            return ndl.backend_ndarray.array(np.zeros((1, 1, i, j), np.float32), device=device)

    rng = np.random.default_rng(9)
    q, k, v = (tensor(rng.normal(size=(1, 2, 4, 3)), device) for _ in range(3))
    plain = nn.MultiHeadAttention(causal=False, device=device)
    masked = nn.MultiHeadAttention(causal=True, device=device)
    for m in (plain, masked):
        m.eval()
    got = NoMask(causal=True, device=device)(q, k, v)[1].numpy()
    np.testing.assert_allclose(got, plain(q, k, v)[1].numpy(), rtol=1e-6)
    assert not np.allclose(got, masked(q, k, v)[1].numpy())


@dev
def test_attention_softmax_bad_inputs_raise_and_leave_it_working(device):
    x = tensor(np.zeros((2, 3)), device)
    bad = [
        (lambda: ndl.ops.attention_softmax(x, 0.0), ValueError, "divisor"),
        (lambda: ndl.ops.attention_softmax(x, float("nan")), ValueError, "divisor"),
        (lambda: ndl.ops.attention_softmax(x, float("inf")), ValueError, "divisor"),
        (
            lambda: ndl.ops.attention_softmax(tensor(np.zeros(3), device), causal=True),
            ValueError,
            "2 dimensions",
        ),
        (lambda: ndl.ops.AttentionSoftmax(1.0)(x), TypeError, None),
        (lambda: ndl.ops.AttentionSoftmax(1.0, 0.0)(x, x), TypeError, "1 input"),
    ]
    for call, error, words in bad:
        with pytest.raises(error, match=words):
            call()
    np.testing.assert_allclose(ndl.ops.attention_softmax(x).numpy(), np.full((2, 3), 1 / 3))


@dev
@pytest.mark.parametrize("mode", MODES)
def test_attention_softmax_second_derivatives(device, mode):
    rng = np.random.default_rng(10)
    x0, g0, v0 = (rng.normal(size=(2, 4, 4)) for _ in range(3))
    with graph_mode(mode):
        x = tensor(x0, device)
        y = (ndl.ops.attention_softmax(x, 1.5, causal=True) * tensor(g0, device, False)).sum()
        y.backward(create_graph=True) if mode == "cycle_free" else y.backward()
        want = attn_grad_ref(attn_ref(x0, 1.5, True), g0, 1.5)
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-4, atol=1e-6)
        g, x.grad = x.grad, None  # cycle_free would add to it
        (g * tensor(v0, device, False)).sum().backward()

    def first(x):
        return float(np.sum(v0 * attn_grad_ref(attn_ref(x, 1.5, True), g0, 1.5)))

    fd = numerical_gradient(first, [x0], 0, 1e-6)
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=1e-3, atol=1e-5)


# --------------------------------------------------------------------------
# gradient accumulation
# --------------------------------------------------------------------------


@dev
@pytest.mark.parametrize("mode", MODES)
def test_a_node_used_many_times(device, mode):
    rng = np.random.default_rng(11)
    x0, w0 = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    with graph_mode(mode):
        x = tensor(x0, device)
        y = x * 2.0
        y.retain_grad()
        z = y * 3.0 + y * 4.0 + y + y * y + y
        (z * tensor(w0, device, False)).sum().backward()
    dy = w0 * (9.0 + 2 * (2 * x0))
    np.testing.assert_allclose(y.grad.numpy(), dy, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), 2 * dy, rtol=1e-5, atol=1e-5)


@dev
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [2, 3, 7])
def test_a_leaf_used_many_times_and_what_it_allocates(device, mode, n):
    # x feeds n MulScalars; each gives x a new contribution of its own. In cycle_free mode
    # they are summed in the first one's buffer: the backward allocates the n products
    # and nothing else; the course's mode records n - 1 sums as well.
    x0 = np.random.default_rng(12).normal(size=(4, 5))
    with graph_mode(mode):
        x = tensor(x0, device)
        total = None
        for k in range(n):
            term = x * float(k + 1)
            total = term if total is None else total + term
        seed = tensor(np.ones((4, 5)), device, False)
        before = ndl.memory.memory_stats(device)["allocation.all.allocated"]
        total.backward(seed)
        made = ndl.memory.memory_stats(device)["allocation.all.allocated"] - before
    assert made == (n if mode == "cycle_free" else 2 * n - 1)
    np.testing.assert_allclose(x.grad.numpy(), np.full((4, 5), n * (n + 1) / 2), rtol=1e-6)


class Held(ndl.autograd.TensorOp):
    """y = x; the gradient is `share(out_grad)`: a tensor whose data something else holds."""

    def __init__(self, share):
        self.share = share

    def compute(self, a):
        return a + 0.0

    def gradient(self, out_grad, node):
        return self.share(out_grad)


@dev
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("share", ["tensor", "detached", "view", "dlpack"])
def test_accumulation_never_writes_into_an_array_held_elsewhere(device, mode, share):
    held = tensor(np.arange(6.0).reshape(2, 3), device, False)
    if share == "dlpack":
        if device != ndl.cpu():
            pytest.skip("NumPy memory is host memory")
        memory = np.arange(6, dtype=np.float32).reshape(2, 3)
        held = ndl.from_dlpack(memory)
    ways = {
        "tensor": lambda g: held,
        "detached": lambda g: held.detach(),
        "view": lambda g: held.reshape((3, 2)).reshape((2, 3)),
        "dlpack": lambda g: held,
    }
    with graph_mode(mode):
        x = tensor(np.zeros((2, 3)), device)
        # the held contribution comes first (the last use is differentiated first), then
        # two contributions of x's own
        total = (x * 2.0) + (x * 3.0) + Held(ways[share])(x)
        total.backward(tensor(np.ones((2, 3)), device, False))
    want = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(held.numpy(), want)
    np.testing.assert_array_equal(x.grad.numpy(), want + 5.0)
    if share == "dlpack":
        np.testing.assert_array_equal(memory, want)


@dev
@pytest.mark.parametrize("mode", MODES)
def test_a_retained_grad_passed_on_is_not_written_into(device, mode):
    # b = a + 0 passes b's adjoint, also b.grad, on to a unchanged; a's other contribution
    # is added to it without writing into b.grad.
    rng = np.random.default_rng(13)
    x0, w1, w2 = (rng.normal(size=(3, 3)) for _ in range(3))
    with graph_mode(mode):
        x = tensor(x0, device)
        a = x * 1.5
        b = a + 0.0
        b.retain_grad()
        ((b * tensor(w1, device, False)).sum() + (a * tensor(w2, device, False)).sum()).backward()
    np.testing.assert_allclose(b.grad.numpy(), w1, rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), 1.5 * (w1 + w2), rtol=1e-6)


# --------------------------------------------------------------------------
# partials nothing differentiates
# --------------------------------------------------------------------------


@dev
@pytest.mark.parametrize("mode", MODES)
def test_a_constant_operand_gets_no_gradient_computed_in_cycle_free_mode(device, mode):
    # x @ w with x constant: the cycle_free walk computes w's gradient alone (one product);
    # the course's mode computes both and sets x.grad too.
    rng = np.random.default_rng(16)
    x0, w0, g0 = rng.normal(size=(6, 4)), rng.normal(size=(4, 3)), rng.normal(size=(6, 3))
    with graph_mode(mode):
        x, w = tensor(x0, device, requires_grad=False), tensor(w0, device)
        y = x @ w
        seed = tensor(g0, device, False)
        before = ndl.memory.memory_stats(device)["allocation.all.allocated"]
        y.backward(seed)
        made = ndl.memory.memory_stats(device)["allocation.all.allocated"] - before
    np.testing.assert_allclose(w.grad.numpy(), x0.T @ g0, rtol=1e-5, atol=1e-6)
    if mode == "cycle_free":
        assert x.grad is None and made == 1
    else:
        np.testing.assert_allclose(x.grad.numpy(), g0 @ w0.T, rtol=1e-5, atol=1e-6)
        assert made >= 2


@dev
def test_a_gradient_called_directly_computes_every_partial(device):
    # op.gradient(out_grad, node) from Python (as the course's tests call it) returns a Tensor
    # for every input, whether or not it requires grad.
    a = tensor(np.full((2, 2), 3.0), device, requires_grad=False)
    b = tensor(np.full((2, 2), 5.0), device)
    node = a * b
    g = tensor(np.ones((2, 2)), device, False)
    ga, gb = node.op.gradient(g, node)
    np.testing.assert_array_equal(ga.numpy(), np.full((2, 2), 5.0))
    np.testing.assert_array_equal(gb.numpy(), np.full((2, 2), 3.0))
    labels = tensor(np.zeros(2), device, requires_grad=False)
    loss = ndl.softmax_cross_entropy(tensor(np.zeros((2, 3)), device), labels)
    dz, dy = loss.op.gradient(tensor(np.ones(1), device, False), loss)
    np.testing.assert_array_equal(dy.numpy(), np.zeros(2))


# --------------------------------------------------------------------------
# launch counts (the census; the simulator in CI)
# --------------------------------------------------------------------------


def _census(fn):
    """What fn asked of the GPU: the nonzero counters, and the kernels by name."""
    ndl.cuda.reset_work_counters()
    fn()
    kernels = {site.split()[0]: n for site, n in ndl.cuda.launches_by_kernel().items()}
    return {k: v for k, v in ndl.cuda.work_counters(reset=True).items() if v}, kernels


@cuda
def test_layer_norm_is_one_launch_forward_and_two_backward():
    gpu = ndl.cuda()
    rng = np.random.default_rng(14)
    x, w, b = (tensor(rng.normal(size=s), gpu) for s in ((512, 20), (20,), (20,)))
    g = tensor(rng.normal(size=(512, 20)), gpu, False)
    for _ in range(2):  # the second pass finds every block in the allocator's cache
        x.grad = w.grad = b.grad = None  # a backward adds into a .grad that is there
        y = [None]
        forward = _census(lambda: y.__setitem__(0, ndl.ops.layer_norm(x, w, b)))
        backward = _census(lambda: y[0].backward(g))
    assert forward == ({"kernel_launches": 1}, {"layer_norm_kernel": 1})
    assert backward == (
        {"kernel_launches": 2},
        {"layer_norm_grad_kernel": 1, "layer_norm_grad_sum_kernel": 1},
    )


@cuda
def test_attention_softmax_is_one_launch_each_way():
    gpu = ndl.cuda()
    rng = np.random.default_rng(15)
    x = tensor(rng.normal(size=(4, 8, 20, 20)), gpu)
    g = tensor(rng.normal(size=(4, 8, 20, 20)), gpu, False)
    for _ in range(2):
        x.grad = None  # a backward adds into a .grad that is there
        y = [None]
        forward = _census(lambda: y.__setitem__(0, ndl.ops.attention_softmax(x, 5.0, True)))
        backward = _census(lambda: y[0].backward(g))
    assert forward == ({"kernel_launches": 1}, {"attention_softmax_kernel": 1})
    assert backward == ({"kernel_launches": 1}, {"attention_softmax_grad_kernel": 1})


@cuda
@pytest.mark.parametrize("n", [2, 4, 8])
def test_n_way_accumulation_is_n_minus_one_adds(n):
    # n products, each a launch of the backward's multiply, then n - 1 adds into one buffer
    gpu = ndl.cuda()
    x = tensor(np.ones((64, 64)), gpu)
    seed = tensor(np.ones((64, 64)), gpu, False)
    for _ in range(2):
        x.grad = None  # a backward adds into a .grad that is there
        total = None
        for k in range(n):
            term = x * float(k + 1)
            total = term if total is None else total + term
        counts, kernels = _census(lambda: total.backward(seed))
    assert counts == {"kernel_launches": n + (n - 1)}
    assert kernels == {"binary_flat_kernel<Op>": n + (n - 1)}
    np.testing.assert_allclose(x.grad.numpy(), np.full((64, 64), n * (n + 1) / 2))


@cuda
def test_a_constant_operand_costs_no_product():
    gpu = ndl.cuda()
    rng = np.random.default_rng(17)
    x = tensor(rng.normal(size=(64, 32)), gpu, requires_grad=False)
    w = tensor(rng.normal(size=(32, 16)), gpu)
    seed = tensor(rng.normal(size=(64, 16)), gpu, False)
    for _ in range(2):
        w.grad = None  # a backward adds into a .grad that is there
        y = x @ w
        counts, _ = _census(lambda: y.backward(seed))
    assert counts == {"blas_calls": 1}
