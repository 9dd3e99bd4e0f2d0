"""The fused softmax cross-entropy (csrc/softmax.c and its row kernels) and the row kernels
LogSumExp, LogSoftmax and the softmax gradients share.

- Loss and gradient against a float64 NumPy reference on random, huge (1e30, 1e38), tiny and
  infinite logits, rows long enough to cross the kernel's blocks with a growing max, one
  class, one row, no rows, labels at both ends; both graph modes; finite differences.
- Bad labels (out of range, negative, fractional, nan, wrong shape or length) raise
  IndexError / ValueError and leave the next call working.
- The gradient reads the row statistics the forward left in the loss's storage only when
  they are that loss's: a loss swapped or written over still gives the right gradient.
- Recorded gradients (needle mode, create_graph) are differentiable again.
- No (N, C) temporary but the gradient; the same bits on 1 and 2 threads.
"""

import gc

import numpy as np
import pytest

import needle as ndl
import needle_c
from needle.autograd import graph_mode

from devices import DEVICES, dev
from gradcheck import check_op, numerical_gradient

MODES = ndl.autograd.GRAPH_MODES


def xent_ref(z, y):
    """(loss (1,), gradient (N, C)) of the mean softmax cross-entropy, in float64."""
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y).astype(int)
    n = z.shape[0]
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(z, axis=1, keepdims=True)
        m = np.clip(m, -np.finfo(np.float32).max, np.finfo(np.float32).max)
        e = np.exp(z - m)
        s = e.sum(axis=1, keepdims=True)
        lse = (m + np.log(s))[:, 0]
        loss = np.mean(lse - z[np.arange(n), y]) if n else np.nan
        grad = e / s
    grad[np.arange(n), y] -= 1.0
    return np.array([loss]), grad / max(n, 1)


def run(z0, y0, device, mode, out_grad=None):
    """needle's (loss, gradient) for logits z0 and labels y0 under `mode`."""
    with graph_mode(mode):
        z = ndl.Tensor(z0.astype(np.float32), device=device)
        y = ndl.Tensor(y0.astype(np.float32), device=device, requires_grad=False)
        loss = ndl.softmax_cross_entropy(z, y)
        assert loss.shape == (1,)
        (loss if out_grad is None else loss * out_grad).backward()
        return loss.numpy(), z.grad.numpy()


def rows_with_growing_max(n, c, rng):
    """Rows whose max grows block after block (the kernel rescales its running sum)."""
    return np.linspace(-30, 30, c)[None, :] + rng.normal(size=(n, c))


CASES = {
    "random": lambda rng: (rng.normal(size=(7, 11)) * 3, None),
    "one-class": lambda rng: (rng.normal(size=(4, 1)), np.zeros(4)),
    "one-row": lambda rng: (rng.normal(size=(1, 9)), np.array([8])),
    "labels-at-ends": lambda rng: (rng.normal(size=(4, 6)), np.array([0, 5, 0, 5])),
    "long-rows": lambda rng: (rows_with_growing_max(3, 5000, rng), np.array([0, 4999, 2500])),
    "huge": lambda rng: (rng.normal(size=(3, 5)) * 1e30, None),
    "near-float-max": lambda rng: (
        np.array([[3e38, 3e38, -3e38], [-3e38, 1e38, 0.0], [3.4e38, -3.4e38, 1.0]]),
        np.array([0, 1, 2]),
    ),
    "tiny": lambda rng: (rng.normal(size=(5, 4)) * 1e-30, None),
    "constant-rows": lambda rng: (np.full((3, 7), 1e6), np.array([0, 3, 6])),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("mode", MODES)
@dev
def test_loss_and_gradient_match_float64(device, mode, case):
    rng = np.random.default_rng(hash(case) % 1000)
    z0, y0 = CASES[case](rng)
    z0 = z0.astype(np.float32)
    if y0 is None:
        y0 = rng.integers(0, z0.shape[1], size=z0.shape[0])
    loss, grad = run(z0, y0, device, mode)
    want_loss, want_grad = xent_ref(z0, y0)
    np.testing.assert_allclose(loss, want_loss, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=2e-5, atol=1e-7)
    # each row of (softmax - one_hot) sums to 0
    np.testing.assert_allclose(grad.sum(axis=1), 0.0, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@dev
def test_infinite_logits(device, mode):
    z0 = np.array(
        [
            [-np.inf, 0.0, 1.0],  # a -inf class: probability 0, the loss finite
            [np.inf, 0.0, 1.0],  # +inf elsewhere than the label: an infinite loss
        ],
        dtype=np.float32,
    )
    loss, grad = run(z0[:1], np.array([1]), device, mode)
    want_loss, want_grad = xent_ref(z0[:1], np.array([1]))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7)
    assert grad[0, 0] == 0.0
    with graph_mode(mode):
        z = ndl.Tensor(z0[1:], device=device)
        loss = ndl.softmax_cross_entropy(z, ndl.Tensor([2.0], device=device, requires_grad=False))
        assert loss.numpy()[0] == np.inf
    # a row of -inf has no softmax: nan, as the composite formula gives
    with graph_mode(mode):
        z = ndl.Tensor(np.full((1, 3), -np.inf, dtype=np.float32), device=device)
        loss = ndl.softmax_cross_entropy(z, ndl.Tensor([0.0], device=device, requires_grad=False))
        assert np.isnan(loss.numpy()[0])


@dev
def test_no_rows(device):
    z = ndl.Tensor(np.zeros((0, 4), dtype=np.float32), device=device)
    y = ndl.Tensor(np.zeros(0, dtype=np.float32), device=device, requires_grad=False)
    loss = ndl.softmax_cross_entropy(z, y)
    assert loss.shape == (1,) and np.isnan(loss.numpy()[0])
    loss.backward()
    assert z.grad.shape == (0, 4)


@pytest.mark.parametrize("n,c", [(4, 5), (1, 3), (6, 1), (3, 2100)])
@dev
def test_gradient_matches_finite_differences(device, n, c):
    rng = np.random.default_rng(n * 1000 + c)
    logits = rng.normal(size=(n, c)).astype(np.float32)
    labels = rng.integers(0, c, size=n).astype(np.float32)
    ref = lambda z, y: xent_ref(z, y)[0]  # noqa: E731
    check_op(ndl.softmax_cross_entropy, logits, labels, device=device, reference=ref, wrt=(0,))


@dev
def test_out_grad_scales_the_gradient(device):
    rng = np.random.default_rng(3)
    z0 = rng.normal(size=(5, 8)).astype(np.float32)
    y0 = rng.integers(0, 8, size=5)
    for mode in MODES:
        _, grad = run(z0, y0, device, mode, out_grad=-2.5)
        np.testing.assert_allclose(grad, -2.5 * xent_ref(z0, y0)[1], rtol=2e-5, atol=1e-7)


BAD_LABELS = {
    "out-of-range": ([0, 5, 1], IndexError, "label 5 is out of range for 5 classes"),
    "far-out": ([0, 1e9, 1], IndexError, "out of range"),
    "negative": ([0, -1, 1], IndexError, "label -1 is out of range"),
    "fractional": ([0, 2.5, 1], IndexError, "label 2.5 is not an integer"),
    "nan": ([0, np.nan, 1], IndexError, "label nan is not an integer"),
    "inf": ([np.inf, 0, 1], IndexError, "out of range"),
    "too-few": ([0, 1], ValueError, "labels"),
    "too-many": ([0, 1, 2, 3], ValueError, "labels"),
    "2-d": ([[0, 1, 2]], ValueError, "labels"),
}


@pytest.mark.parametrize("case", BAD_LABELS, ids=list(BAD_LABELS))
@dev
def test_bad_labels_raise(device, case):
    labels, error, match = BAD_LABELS[case]
    z = ndl.Tensor(np.zeros((3, 5), dtype=np.float32), device=device)
    y = ndl.Tensor(np.array(labels, dtype=np.float32), device=device, requires_grad=False)
    gc.collect()  # earlier tests' garbage must not be freed in between
    before = ndl.memory.memory_allocated(device)
    with pytest.raises(error, match=match):
        # a GPU reports a bad label at the next synchronisation: reading the loss
        ndl.softmax_cross_entropy(z, y).numpy()
    assert ndl.memory.memory_allocated(device) == before
    ok = ndl.softmax_cross_entropy(
        z, ndl.Tensor([0.0, 4.0, 2.0], device=device, requires_grad=False)
    )
    np.testing.assert_allclose(ok.numpy(), [np.log(5.0)], rtol=1e-6)


@pytest.mark.parametrize("shape", [(4,), (2, 2, 1), ()])
@dev
def test_bad_logits_raise(device, shape):
    z = ndl.Tensor(np.zeros(shape, dtype=np.float32), device=device)
    y = ndl.Tensor(np.zeros(2, dtype=np.float32), device=device, requires_grad=False)
    with pytest.raises(ValueError, match="logits"):
        ndl.softmax_cross_entropy(z, y)


@dev
def test_labels_changed_before_backward_are_checked(device):
    # The gradient reads labels again: a node whose labels were replaced by bad ones raises
    # instead of writing outside the gradient (on a GPU at the next synchronisation, here
    # the read of the gradient).
    z = ndl.Tensor(np.zeros((2, 3), dtype=np.float32), device=device)
    y = ndl.Tensor(np.array([0, 1], dtype=np.float32), device=device, requires_grad=False)
    loss = ndl.softmax_cross_entropy(z, y)
    y.cached_data = ndl.Tensor(np.array([0, 7], dtype=np.float32), device=device).cached_data
    with pytest.raises(IndexError, match="label 7"):
        loss.backward()
        z.grad.numpy()


# --------------------------------------------------------------------------
# the statistics kept in the loss
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@dev
def test_gradient_is_right_when_the_loss_is_not_the_nodes(device, mode):
    rng = np.random.default_rng(11)
    z0, z1 = rng.normal(size=(2, 6, 9)).astype(np.float32) * 4
    y0 = rng.integers(0, 9, size=6)
    want = xent_ref(z0, y0)[1]
    with graph_mode(mode):
        y = ndl.Tensor(y0.astype(np.float32), device=device, requires_grad=False)
        # the node's data swapped for another loss of the same shape (other logits)
        z = ndl.Tensor(z0, device=device)
        loss = ndl.softmax_cross_entropy(z, y)
        other = ndl.softmax_cross_entropy(ndl.Tensor(z1, device=device), y)
        loss.cached_data = other.cached_data
        loss.backward()
        np.testing.assert_allclose(z.grad.numpy(), want, rtol=2e-5, atol=1e-7)
        # the loss written over in place
        z = ndl.Tensor(z0, device=device)
        loss = ndl.softmax_cross_entropy(z, y)
        loss.cached_data[0:1] = 123.0
        loss.backward()
        np.testing.assert_allclose(z.grad.numpy(), want, rtol=2e-5, atol=1e-7)
        # a plain array of the same shape
        z = ndl.Tensor(z0, device=device)
        loss = ndl.softmax_cross_entropy(z, y)
        loss.cached_data = ndl.Tensor([1.0], device=device).cached_data
        loss.backward()
        np.testing.assert_allclose(z.grad.numpy(), want, rtol=2e-5, atol=1e-7)


@dev
def test_strided_logits(device):
    rng = np.random.default_rng(4)
    base = rng.normal(size=(9, 5)).astype(np.float32)
    y0 = rng.integers(0, 9, size=5)
    for mode in MODES:
        with graph_mode(mode):
            b = ndl.Tensor(base, device=device)
            y = ndl.Tensor(y0.astype(np.float32), device=device, requires_grad=False)
            loss = ndl.softmax_cross_entropy(b.transpose(), y)  # rows not contiguous
            loss.backward()
            want_loss, want_grad = xent_ref(base.T, y0)
            np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-6)
            np.testing.assert_allclose(b.grad.numpy(), want_grad.T, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("c", [3, 20, 64, 65, 100, 2050])
@pytest.mark.parametrize("sliced", [False, True], ids=["compact", "column-slice"])
@dev
def test_short_and_medium_rows(device, c, sliced):
    # rows up to 64 go through the kernels' across-rows path (compact rows only), longer
    # ones along the row with a padded tail; a column slice keeps rows apart (ld > C)
    rng = np.random.default_rng(c)
    n = 300
    full = (rng.normal(size=(n, c + 7 if sliced else c)) * 4).astype(np.float32)
    z0 = full[:, :c]
    y0 = rng.integers(0, c, size=n)
    for mode in MODES:
        with graph_mode(mode):
            base = ndl.Tensor(full, device=device)
            z = base[:, :c] if sliced else base
            y = ndl.Tensor(y0.astype(np.float32), device=device, requires_grad=False)
            loss = ndl.softmax_cross_entropy(z, y)
            loss.backward()
            want_loss, want_grad = xent_ref(z0, y0)
            np.testing.assert_allclose(loss.numpy(), want_loss, rtol=2e-6)
            np.testing.assert_allclose(base.grad.numpy()[:, :c], want_grad, rtol=2e-5, atol=1e-8)
            lse = ndl.logsumexp(z, axes=(1,)).numpy()
            np.testing.assert_allclose(lse, lse64(z0, 1), rtol=1e-6, atol=1e-6)
            ls = ndl.logsoftmax(z).numpy()
            np.testing.assert_allclose(ls, z0 - lse64(z0, 1)[:, None], rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("c", [100, 2050])
@dev
def test_special_values_where_the_last_step_overlaps(device, c):
    # a row's last vector step re-reads elements the steps before it counted (the kernel
    # selects them out): an inf or a nan there is still counted exactly once
    x0 = np.random.default_rng(c).normal(size=(4, c)).astype(np.float32)
    x0[1, c - 30] = np.inf
    x0[2, c - 30] = np.nan
    x0[3, c - 30] = -np.inf
    got = ndl.logsumexp(ndl.Tensor(x0, device=device), axes=(1,)).numpy()
    want = lse64(x0, 1)
    assert got[1] == np.inf and np.isnan(got[2])
    np.testing.assert_allclose(got[[0, 3]], want[[0, 3]], rtol=1e-6)


# --------------------------------------------------------------------------
# recorded gradients
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@dev
def test_second_derivative(device, mode):
    rng = np.random.default_rng(9)
    z0 = rng.normal(size=(3, 4))
    y0 = np.array([1, 0, 3])
    w0 = rng.uniform(0.5, 1.5, size=(3, 4))
    with graph_mode(mode):
        z = ndl.Tensor(z0.astype(np.float32), device=device)
        y = ndl.Tensor(y0.astype(np.float32), device=device, requires_grad=False)
        loss = ndl.softmax_cross_entropy(z, y)
        if mode == "cycle_free":
            loss.backward(create_graph=True)
        else:
            loss.backward()
        first = z.grad
        assert first.op is not None
        np.testing.assert_allclose(first.numpy(), xent_ref(z0, y0)[1], rtol=2e-5, atol=1e-7)
        z.grad = None
        (first * ndl.Tensor(w0.astype(np.float32), device=device)).sum().backward()
        got = z.grad.numpy()

    def h(z64):  # sum(w * dL/dz)
        return float(np.sum(xent_ref(z64, y0)[1] * w0))

    p = np.exp(z0 - z0.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    analytic = p * (w0 - np.sum(p * w0, axis=1, keepdims=True)) / 3
    np.testing.assert_allclose(got, analytic, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got, numerical_gradient(h, [z0], 0, 1e-4), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("n,c", [(3, 4), (2, 70)])
@dev
def test_gradient_op_matches_finite_differences(device, n, c):
    # the recorded gradient's own op: its value is g * (softmax - one_hot) / N, and its
    # gradient (the loss's second derivative, and the derivative in g) matches finite
    # differences of that value
    rng = np.random.default_rng(c)
    logits = rng.normal(size=(n, c)).astype(np.float32)
    labels = rng.integers(0, c, size=n).astype(np.float32)
    scale = np.array([0.75], dtype=np.float32)
    check_op(
        lambda z, y, g: needle_c.SoftmaxCrossEntropyGrad()(z, y, g),
        logits,
        labels,
        scale,
        device=device,
        reference=lambda z, y, g: g[0] * xent_ref(z, y)[1],
        wrt=(0, 2),
        rtol=1e-5,
        atol=1e-6,
    )


@dev
def test_gradient_op_refuses_bad_inputs(device):
    z = ndl.Tensor(np.zeros((3, 4), dtype=np.float32), device=device)
    y = ndl.Tensor(np.zeros((3,), dtype=np.float32), device=device, requires_grad=False)
    g2 = ndl.Tensor(np.ones((2,), dtype=np.float32), device=device)
    op = needle_c.SoftmaxCrossEntropyGrad()
    with pytest.raises(ValueError, match="one element"):
        op(z, y, g2)
    with pytest.raises(TypeError):
        op(z, y)
    bad_label = ndl.Tensor(np.array([0, 1, 4], dtype=np.float32), device=device)
    with pytest.raises(IndexError):
        op(z, bad_label, ndl.Tensor(np.ones((1,), dtype=np.float32), device=device)).numpy()
    g = ndl.Tensor(np.ones((1,), dtype=np.float32), device=device)
    np.testing.assert_allclose(op(z, y, g).numpy(), xent_ref(z.numpy(), y.numpy())[1], rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@dev
def test_recorded_gradient_keeps_one_array(device, mode):
    # both modes hold one (N, C) array for the logits' gradient: cycle_free a constant,
    # needle the node SoftmaxCrossEntropyGrad(z, y, out_grad) (the course's graph held two
    # and a one-hot matrix)
    n, c = 128, 1000
    rng = np.random.default_rng(1)
    with graph_mode(mode):
        z = ndl.Tensor(rng.normal(size=(n, c)).astype(np.float32), device=device)
        y = ndl.Tensor(
            rng.integers(0, c, size=n).astype(np.float32), device=device, requires_grad=False
        )
        loss = ndl.softmax_cross_entropy(z, y)
        before = ndl.memory.memory_allocated(device)
        loss.backward()
        held = ndl.memory.memory_allocated(device) - before
        assert n * c * 4 <= held < n * c * 4 + 64 * 1024
        np.testing.assert_allclose(
            z.grad.numpy(), xent_ref(z.numpy(), y.numpy())[1], rtol=1e-5, atol=1e-7
        )
        if mode == "needle":
            assert type(z.grad.op).__name__ == "SoftmaxCrossEntropyGrad"
            assert z.grad.inputs[0] is z and z.grad.inputs[1] is y


# --------------------------------------------------------------------------
# memory and threads
# --------------------------------------------------------------------------


@dev
def test_no_temporary_but_the_gradient(device):
    n, c = 256, 1000
    rng = np.random.default_rng(2)
    z = ndl.Tensor(rng.normal(size=(n, c)).astype(np.float32), device=device)
    y = ndl.Tensor(
        rng.integers(0, c, size=n).astype(np.float32), device=device, requires_grad=False
    )
    before = ndl.memory.memory_allocated(device)
    ndl.memory.reset_peak_memory_stats(device)
    loss = ndl.softmax_cross_entropy(z, y)
    assert ndl.memory.max_memory_allocated(device) - before < 4 * (2 * n + 64)  # stats, loss
    loss.backward()
    peak = ndl.memory.max_memory_allocated(device) - before
    grad_bytes = n * c * 4
    assert grad_bytes <= peak < grad_bytes + 64 * 1024


@pytest.fixture
def restore_threads():
    yield
    needle_c._set_num_threads(0)


def test_threads_give_the_same_bits(restore_threads):
    rng = np.random.default_rng(6)
    z0 = rng.normal(size=(300, 2000)).astype(np.float32) * 5
    y0 = rng.integers(0, 2000, size=300)
    results = []
    for threads in (1, 2, 3):
        needle_c._set_num_threads(threads)
        assert needle_c._num_threads() == threads
        loss, grad = run(z0, y0, ndl.cpu(), "cycle_free")
        lse = ndl.logsumexp(ndl.Tensor(z0), axes=(1,)).numpy()
        results.append((loss, grad, lse))
    for loss, grad, lse in results[1:]:
        np.testing.assert_array_equal(loss, results[0][0])
        np.testing.assert_array_equal(grad, results[0][1])
        np.testing.assert_array_equal(lse, results[0][2])
    needle_c._set_num_threads(0)
    assert needle_c._num_threads() >= 1


@pytest.mark.parametrize("bad,error", [(-1, ValueError), (257, ValueError), ("2", TypeError)])
def test_set_num_threads_rejects_bad_values(bad, error, restore_threads):
    before = needle_c._num_threads()
    with pytest.raises(error):
        needle_c._set_num_threads(bad)
    assert needle_c._num_threads() == before


# --------------------------------------------------------------------------
# the row kernels in LogSumExp, LogSoftmax and the softmax gradients
# --------------------------------------------------------------------------


def lse64(x, axis):
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.clip(np.max(x, axis=axis, keepdims=True), -3.4028234663852886e38, 3.4e38)
        return np.squeeze(np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m, axis)


@pytest.mark.parametrize("mode", MODES)
@dev
def test_logsumexp_last_axis(device, mode):
    rng = np.random.default_rng(5)
    x0 = (rng.normal(size=(2, 3, 2500)) * 20).astype(np.float32)
    x0[0, 0, :] = -np.inf  # -inf
    x0[0, 1, 7] = np.inf  # +inf
    x0[1, 2, :] = 1e38
    with graph_mode(mode):
        x = ndl.Tensor(x0, device=device)
        for axes in [(2,), (-1,)]:
            got = ndl.logsumexp(x, axes=axes).numpy()
            assert got.shape == (2, 3)
            np.testing.assert_allclose(got, lse64(x0, 2), rtol=1e-6)
        # a strided view: the last axis of a transpose
        xt = ndl.Tensor(x0[1], device=device).transpose()
        np.testing.assert_allclose(
            ndl.logsumexp(xt, axes=(1,)).numpy(), lse64(x0[1].T, 1), rtol=1e-6
        )
    # an empty last axis keeps the old answer: no identity for the max
    with pytest.raises(ValueError):
        ndl.logsumexp(ndl.Tensor(np.zeros((2, 0), dtype=np.float32), device=device), axes=(1,))


@pytest.mark.parametrize("mode", MODES)
@dev
def test_logsoftmax_and_its_gradient_at_large_magnitudes(device, mode):
    rng = np.random.default_rng(8)
    x0 = (1e6 + rng.normal(size=(4, 3000)) * 100).astype(np.float32)
    g0 = rng.normal(size=(4, 3000)).astype(np.float32)
    with graph_mode(mode):
        x = ndl.Tensor(x0, device=device)
        out = ndl.logsoftmax(x)
        np.testing.assert_allclose(
            out.numpy(), x0.astype(np.float64) - lse64(x0, 1)[:, None], rtol=1e-5, atol=2e-2
        )
        (out * ndl.Tensor(g0, device=device)).sum().backward()
        e = np.exp(x0.astype(np.float64) - x0.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        want = g0 - p * g0.astype(np.float64).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(3, 5), (2, 4, 7), (6,)])
@dev
def test_logsumexp_gradient_last_axis_finite_differences(device, shape):
    rng = np.random.default_rng(len(shape))
    check_op(
        lambda a: ndl.logsumexp(a, axes=(len(shape) - 1,)),
        rng.normal(size=shape).astype(np.float32),
        device=device,
        reference=lambda a: lse64(a, len(shape) - 1),
    )


@pytest.mark.cuda
@pytest.mark.skipif(not ndl.cuda().enabled(), reason="CUDA backend not built or no GPU")
@pytest.mark.parametrize("n,c", [(300, 20), (50, 2050), (7, 1)])
def test_cuda_matches_cpu(n, c):
    # the CUDA kernels (a warp or a block per row) against the CPU's on the same data
    rng = np.random.default_rng(n + c)
    z0 = (rng.normal(size=(n, c)) * 5).astype(np.float32)
    y0 = rng.integers(0, c, size=n)
    results = {}
    for device in (ndl.cpu(), ndl.cuda()):
        loss, grad = run(z0, y0, device, "cycle_free")
        x = ndl.Tensor(z0, device=device)
        results[device.name] = (
            loss,
            grad,
            ndl.logsumexp(x, axes=(1,)).numpy(),
            ndl.logsoftmax(x).numpy(),
        )
    for got, want in zip(results["cuda"], results["cpu"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_devices_listed():
    # the device parametrisation covers the CPU here; CUDA entries skip without a GPU
    assert any(p.id == "cpu" for p in DEVICES)
