"""The fused operations in every dtype: softmax rows, the softmax cross-entropy, layer norm,
the attention softmax, row gathers and their scatter-add, the LSTM, the optimizer updates and
random fills.

Their kernels are float32's; for other dtypes the engine converts the operands to float32,
runs the float32 kernel and converts each result to the dtype it is due in (csrc/
dtype_island.c). So every result here must equal, bit for bit, the float32 operation on the
stored values (the inputs as their dtype holds them) rounded once to the result's dtype: the
result of an input's own dtype (softmax, attention, gathers), of the inputs' promotion (layer
norm, the LSTM's outputs), and each gradient in its input's dtype.
"""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd
from needle import nn

from devices import dev

NARROW = ["float16", "bfloat16", "float64"]


def stored(x, dtype, device):
    """A tensor of dtype holding x (rounded to dtype), and the float32 tensor of the same
    values (what the island computes on)."""
    a = nd.array(x, device=device).astype(dtype) if dtype != "float64" else None
    if a is None:
        a = nd.array(x, dtype="float64", device=device)
    return ndl.Tensor(a, device=device), ndl.Tensor(a.astype("float32"), device=device)


def as_dtype(t, dtype):
    """t's values (float32) rounded to dtype, as float64 NumPy values."""
    return t.cached_data.astype(dtype).numpy().astype(np.float64)


def same(t, want_dtype, reference):
    assert t.dtype == want_dtype
    np.testing.assert_array_equal(t.numpy().astype(np.float64), as_dtype(reference, want_dtype))


@dev
@pytest.mark.parametrize("dtype", NARROW)
def test_softmax_rows(device, dtype):
    x = np.random.default_rng(0).standard_normal((6, 7)) * 3
    t, wide = stored(x, dtype, device)
    same(ndl.ops.logsoftmax(t), dtype, ndl.ops.logsoftmax(wide))
    same(ndl.ops.logsumexp(t, axes=(1,)), dtype, ndl.ops.logsumexp(wide, axes=(1,)))
    got = nd.NDArray(t.cached_data).softmax() if hasattr(nd.NDArray, "softmax") else None
    if got is not None:
        assert got.dtype == dtype


@dev
@pytest.mark.parametrize("dtype", NARROW)
def test_softmax_cross_entropy_and_its_gradient(device, dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 5))
    labels = ndl.Tensor(rng.integers(0, 5, 8).astype(np.float32), device=device)
    t, wide = stored(x, dtype, device)
    loss, wide_loss = nn.SoftmaxLoss()(t, labels), nn.SoftmaxLoss()(wide, labels)
    # The loss, a mean, comes out float32 at least (float64 for float64 logits).
    same(loss, "float64" if dtype == "float64" else "float32", wide_loss)
    loss.backward()
    wide_loss.backward()
    # The gradient comes back in the logits' dtype: the float32 gradient of the float32
    # loss's out_grad, rounded once (the out_grad 1 is exact in every dtype).
    same(t.grad, dtype, wide.grad)


@dev
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_cross_entropy_reads_its_rows_as_they_are(device, dtype):
    # Every backend reads and writes narrow logits' rows itself: the loss and its gradient
    # allocate the statistics and the gradient (n x c, narrow), never a float32 copy of the
    # logits or of the gradient (n * c * 4 bytes each). Rows longer than a GPU warp's share
    # (1024) take the kernels' block-per-row path; the results are still the float32 ones.
    n, c = 64, 1500
    rng = np.random.default_rng(3)
    labels = ndl.Tensor(rng.integers(0, c, n).astype(np.float32), device=device)
    t, wide = stored(rng.standard_normal((n, c)) * 4, dtype, device)
    ndl.memory.reset_peak_memory_stats(device)
    before = ndl.memory.memory_allocated(device)
    loss = nn.SoftmaxLoss()(t, labels)
    loss.backward()
    grown = ndl.memory.max_memory_allocated(device) - before
    assert n * c * 2 <= grown < n * c * 4
    wide_loss = nn.SoftmaxLoss()(wide, labels)
    wide_loss.backward()
    same(loss, "float32", wide_loss)
    same(t.grad, dtype, wide.grad)


@dev
@pytest.mark.parametrize("dtype", NARROW)
def test_layer_norm_forward_and_backward(device, dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 8))
    t, wide = stored(x, dtype, device)
    w = ndl.Tensor(rng.standard_normal(8).astype(np.float32), device=device)
    b = ndl.Tensor(rng.standard_normal(8).astype(np.float32), device=device)
    out, wide_out = ndl.ops.layer_norm(t, w, b), ndl.ops.layer_norm(wide, w, b)
    promoted = "float64" if dtype == "float64" else "float32"
    same(out, promoted, wide_out)
    g = rng.standard_normal(out.shape).astype(np.float32)
    (out * ndl.Tensor(g, device=device)).sum().backward()
    w_grad = w.grad.numpy()
    w.grad = b.grad = None
    (wide_out * ndl.Tensor(g, device=device)).sum().backward()
    same(t.grad, dtype, wide.grad)
    assert w.grad.dtype == "float32"
    if dtype != "float64":  # x's float64 gradient path sums in float64 before the island
        np.testing.assert_array_equal(w_grad, w.grad.numpy())


@dev
@pytest.mark.parametrize("dtype", NARROW)
def test_attention_softmax(device, dtype):
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 5)) * 2
    t, wide = stored(x, dtype, device)
    out = ndl.ops.attention_softmax(t, divisor=2.0, causal=True)
    wide_out = ndl.ops.attention_softmax(wide, divisor=2.0, causal=True)
    same(out, dtype, wide_out)
    weights = np.random.default_rng(13).standard_normal(out.shape).astype(np.float32)
    (out * ndl.Tensor(weights, device=device)).sum().backward()
    (wide_out * ndl.Tensor(weights, device=device)).sum().backward()
    # The backward reads the forward's output, which the narrow dtypes hold rounded: the
    # gradient agrees with float32's to the dtype's precision, not bit for bit.
    assert t.grad.dtype == dtype
    rtol = {"float16": 4e-3, "bfloat16": 3e-2, "float64": 1e-6}[dtype]
    np.testing.assert_allclose(
        t.grad.numpy().astype(np.float64), wide.grad.numpy(), rtol=rtol, atol=rtol * 0.1
    )


@dev
@pytest.mark.parametrize("dtype", NARROW)
def test_embedding_gather_and_scatter(device, dtype):
    rng = np.random.default_rng(4)
    table, wide = stored(rng.standard_normal((10, 4)), dtype, device)
    idx = ndl.Tensor(np.array([[1, 3, 3], [0, 9, 1]], np.float32), device=device)
    rows, wide_rows = ndl.ops.gather_rows(table, idx), ndl.ops.gather_rows(wide, idx)
    same(rows, dtype, wide_rows)
    rows.sum().backward()
    wide_rows.sum().backward()
    same(table.grad, dtype, wide.grad)  # repeated rows accumulate: 2 for row 1, 2 for row 3


@dev
@pytest.mark.parametrize("dtype", NARROW)
def test_lstm_outputs_and_gradients(device, dtype):
    np.random.seed(5)
    layer = nn.LSTM(3, 4, num_layers=1, device=device)
    x = np.random.default_rng(5).standard_normal((5, 2, 3))
    t, wide = stored(x, dtype, device)
    y, (h, c) = layer(t)
    wide_y, (wide_h, wide_c) = layer(wide)
    promoted = "float64" if dtype == "float64" else "float32"
    for got, ref in ((y, wide_y), (h, wide_h), (c, wide_c)):
        same(got, promoted, ref)
    y.sum().backward()
    x_grad = t.grad
    wide_y.sum().backward()
    same(x_grad, dtype, wide.grad)


@dev
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_optimizer_updates_keep_the_parameters_dtype(device, dtype, optimizer):
    rng = np.random.default_rng(6)
    values = rng.standard_normal((3, 4))
    p, ref = stored(values, dtype, device)
    p.grad = ndl.Tensor(rng.standard_normal((3, 4)), device=device, dtype=dtype)
    ref.grad = ndl.Tensor(p.grad.cached_data.astype("float32"), device=device)
    make = {
        "sgd": lambda ps: ndl.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        "adam": lambda ps: ndl.optim.Adam(ps, lr=0.1, weight_decay=0.01),
    }[optimizer]
    opt, ref_opt = make([p]), make([ref])
    opt.step()
    ref_opt.step()
    same(p, dtype, ref)
    state = opt.u[p] if optimizer == "sgd" else opt.m[p]
    ref_state = ref_opt.u[ref] if optimizer == "sgd" else ref_opt.m[ref]
    assert state.dtype == dtype  # the state lives in the parameter's dtype, updated in place
    np.testing.assert_array_equal(state.numpy().astype(np.float64), as_dtype(ref_state, dtype))


@dev
@pytest.mark.parametrize("dtype", NARROW)
def test_random_fills_draw_in_float32(device, dtype):
    mode = "device"
    with ndl.random.rng_mode(mode):
        ndl.random.manual_seed(7)
        wide = device.rand(3, 5)
        ndl.random.manual_seed(7)
        narrow = device.rand(3, 5, dtype=dtype)
    assert narrow.dtype == dtype
    np.testing.assert_array_equal(
        narrow.numpy().astype(np.float64), wide.astype(dtype).numpy().astype(np.float64)
    )


def test_grad_scaler_refuses_narrow_gradients():
    p = ndl.Tensor(np.ones(3), dtype="float16")
    p.grad = ndl.Tensor(np.ones(3), dtype="float16")
    scaler = ndl.amp.GradScaler()
    opt = ndl.optim.SGD([p], lr=0.1)
    with pytest.raises(TypeError, match="amp_unscale is not implemented for float16"):
        scaler.unscale_(opt)
