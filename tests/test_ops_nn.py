"""Tensor ops of neural networks: conv, logsoftmax, logsumexp, gather_rows and
softmax_cross_entropy (including numerical stability), and a small MLP end to end,
checked by ``gradcheck.check_op`` on every device in ``DEVICES`` under both graph modes."""

import math

import numpy as np
import pytest

import needle as ndl

from devices import dev
from gradcheck import MODES, check_op
from op_refs import conv_ref, lse_ref, rnd, sce_ref

# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,h,w,cin,cout,k,stride,padding",
    [
        (2, 5, 5, 3, 4, 3, 1, 0),
        (2, 5, 5, 3, 4, 3, 1, 1),
        (1, 6, 6, 2, 3, 3, 2, 1),
        (2, 7, 5, 2, 2, 3, 2, 0),
        (1, 4, 4, 3, 2, 1, 1, 0),
        (1, 5, 5, 2, 3, 5, 1, 2),
        (2, 6, 6, 2, 2, 2, 2, 0),
        (1, 5, 4, 2, 3, 3, 3, 2),
    ],
)
@dev
def test_conv(device, n, h, w, cin, cout, k, stride, padding):
    ref = lambda x, W: conv_ref(x, W, stride, padding)  # noqa: E731
    xs = rnd(0, (n, h, w, cin))
    ws = rnd(1, (k, k, cin, cout))
    res = check_op(
        lambda x, W: ndl.conv(x, W, stride=stride, padding=padding),
        xs,
        ws,
        device=device,
        reference=ref,
    )
    ho = (h + 2 * padding - k) // stride + 1
    wo = (w + 2 * padding - k) // stride + 1
    assert res["cycle_free"][0][0].shape == (n, ho, wo, cout)
    check_op(
        lambda x, W: ndl.ops.Conv(stride, padding)(x, W),
        rnd(2, (n, h, w, cin)),
        rnd(3, (k, k, cin, cout)),
        device=device,
        reference=ref,
    )


@dev
def test_conv_defaults(device):
    xs = rnd(0, (1, 5, 5, 2))
    ws = rnd(1, (3, 3, 2, 3))
    # the function's default padding is 1, the class's is 0 (the course's signatures)
    check_op(
        lambda x, W: ndl.conv(x, W),
        xs,
        ws,
        device=device,
        reference=lambda x, W: conv_ref(x, W, 1, 1),
    )
    check_op(
        lambda x, W: ndl.ops.Conv()(x, W),
        xs,
        ws,
        device=device,
        reference=lambda x, W: conv_ref(x, W, 1, 0),
    )


# --------------------------------------------------------------------------
# log-softmax and log-sum-exp
# --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 5), (1, 4), (4, 1)])
@dev
def test_logsoftmax(device, shape):
    ref = lambda a: a - lse_ref(a, axes=1)[:, None]  # noqa: E731
    check_op(ndl.logsoftmax, rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.LogSoftmax()(a), rnd(1, shape), device=device, reference=ref)


@dev
def test_logsoftmax_stable(device):
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]], dtype=np.float32)
    check_op(
        ndl.logsoftmax,
        x,
        device=device,
        reference=lambda a: a - lse_ref(a, axes=1)[:, None],
        eps=1e-2,
    )


@pytest.mark.parametrize(
    "shape,axes",
    [
        ((3, 5), (1,)),
        ((3, 5), (0,)),
        ((2, 3, 4), (0, 2)),
        ((2, 3, 4), (1,)),
        ((3, 5), 1),
        ((2, 3, 4), (2,)),
    ],
)
@dev
def test_logsumexp(device, shape, axes):
    ax = axes if isinstance(axes, int) else tuple(axes)
    ref = lambda a: lse_ref(a, axes=ax)  # noqa: E731
    check_op(lambda a: ndl.logsumexp(a, axes), rnd(0, shape), device=device, reference=ref)
    check_op(lambda a: ndl.ops.LogSumExp(axes)(a), rnd(1, shape), device=device, reference=ref)
    check_op(lambda a: ndl.logsumexp(a, axes=axes), rnd(2, shape), device=device, reference=ref)


@dev
def test_logsumexp_all_axes(device):
    # the shape of a full reduction is not pinned down here (the course gives a
    # single element); its value and gradient are
    check_op(
        lambda a: ndl.logsumexp(a),
        rnd(0, (3, 4)),
        device=device,
        reference=lambda a: lse_ref(a),
        check_shape=False,
    )


@dev
def test_logsumexp_stable(device):
    x = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -1002.0]], dtype=np.float32)
    res = check_op(
        lambda a: ndl.logsumexp(a, (1,)),
        x,
        device=device,
        reference=lambda a: lse_ref(a, axes=1),
        eps=1e-2,
    )
    for mode in MODES:
        v = res[mode][0][0]
        assert np.all(np.isfinite(v))
        np.testing.assert_allclose(
            v,
            [1000 + math.log(2 + math.exp(-1)), -1000 + math.log(1 + math.exp(-1) + math.exp(-2))],
            rtol=1e-6,
        )
        assert np.all(np.isfinite(res[mode][1][0]))


# --------------------------------------------------------------------------
# gather_rows and softmax_cross_entropy
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "idx",
    [
        [0, 4, 2],
        [1, 1, 3, 1],
        [[0, 2, 2], [4, 4, 4]],
        [3],
    ],
    ids=["distinct", "repeated", "2d", "single"],
)
@dev
def test_gather_rows(device, idx):
    table = rnd(0, (5, 3))
    idx = np.array(idx, dtype=np.float32)
    ref = lambda tb, ix: tb[ix.astype(int)]  # noqa: E731
    res = check_op(ndl.gather_rows, table, idx, device=device, reference=ref, wrt=(0,))
    assert res["cycle_free"][0][0].shape == idx.shape + (3,)
    check_op(
        lambda tb, ix: ndl.ops.GatherRows()(tb, ix),
        table,
        idx,
        device=device,
        reference=ref,
        wrt=(0,),
    )


@dev
def test_gather_rows_gradient_scatter_adds(device):
    table = rnd(0, (4, 2))
    idx = np.array([1, 3, 1, 1], dtype=np.float32)
    for mode in MODES:
        with ndl.autograd.graph_mode(mode):
            tb = ndl.Tensor(table, device=device)
            ix = ndl.Tensor(idx, device=device, requires_grad=False)
            out = ndl.gather_rows(tb, ix)
            np.testing.assert_array_equal(out.numpy(), table[[1, 3, 1, 1]])
            out.sum().backward()
            np.testing.assert_array_equal(tb.grad.numpy(), [[0, 0], [3, 3], [0, 0], [1, 1]])


@pytest.mark.parametrize("bad", [5, 7, -100])
@dev
def test_gather_rows_out_of_range(device, bad):
    table = ndl.Tensor(rnd(0, (5, 3)), device=device)
    idx = ndl.Tensor(np.array([0, bad], dtype=np.float32), device=device, requires_grad=False)
    with pytest.raises((IndexError, ValueError)):
        ndl.gather_rows(table, idx).numpy()  # a GPU reports at the next synchronisation
    # a valid call afterwards works
    ok = ndl.gather_rows(
        table,
        ndl.Tensor(np.array([4.0, 0.0], dtype=np.float32), device=device, requires_grad=False),
    )
    np.testing.assert_array_equal(ok.numpy(), table.numpy()[[4, 0]])


@pytest.mark.parametrize("n,c", [(4, 5), (1, 3), (6, 2)])
@dev
def test_softmax_cross_entropy(device, n, c):
    logits = rnd(0, (n, c))
    labels = np.random.default_rng(1).integers(0, c, size=n).astype(np.float32)
    res = check_op(
        ndl.softmax_cross_entropy, logits, labels, device=device, reference=sce_ref, wrt=(0,)
    )
    assert res["cycle_free"][0][0].shape == (1,)
    check_op(
        lambda z, y: ndl.ops.SoftmaxCrossEntropy()(z, y),
        logits,
        labels,
        device=device,
        reference=sce_ref,
        wrt=(0,),
    )


@dev
def test_softmax_cross_entropy_gradient_formula(device):
    logits = rnd(3, (5, 4))
    labels = np.array([0, 3, 3, 1, 2], dtype=np.float32)
    e = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    soft = e / e.sum(axis=1, keepdims=True)
    expected = (soft - np.eye(4)[labels.astype(int)]) / 5
    grads = {}
    for mode in MODES:
        with ndl.autograd.graph_mode(mode):
            z = ndl.Tensor(logits, device=device)
            y = ndl.Tensor(labels, device=device, requires_grad=False)
            loss = ndl.softmax_cross_entropy(z, y)
            assert loss.shape == (1,)
            np.testing.assert_allclose(
                loss.numpy(), sce_ref(logits.astype(np.float64), labels), rtol=1e-5
            )
            loss.backward()
            np.testing.assert_allclose(z.grad.numpy(), expected, rtol=1e-5, atol=1e-6)
            grads[mode] = z.grad.numpy()
    np.testing.assert_allclose(grads["cycle_free"], grads["needle"], rtol=1e-6, atol=1e-7)


@dev
def test_softmax_cross_entropy_stable(device):
    logits = np.array([[1000.0, 0.0, -1000.0], [5.0, 1005.0, 0.0]], dtype=np.float32)
    labels = np.array([0, 0], dtype=np.float32)
    z = ndl.Tensor(logits, device=device)
    loss = ndl.softmax_cross_entropy(z, ndl.Tensor(labels, device=device, requires_grad=False))
    np.testing.assert_allclose(loss.numpy(), [(0.0 + 1000.0) / 2], rtol=1e-5)
    loss.backward()
    np.testing.assert_allclose(z.grad.numpy(), [[0, 0, 0], [-0.5, 0.5, 0]], atol=1e-4)


# --------------------------------------------------------------------------
# a small network end to end
# --------------------------------------------------------------------------


@dev
def test_mlp_gradients(device):
    def fn(x, w1, w2):
        return ndl.logsoftmax(ndl.relu(x @ w1) @ w2)

    def ref(x, w1, w2):
        h = np.maximum(x @ w1, 0) @ w2
        return h - lse_ref(h, axes=1)[:, None]

    x = rnd(0, (4, 3))
    w1 = rnd(1, (3, 5))
    w2 = rnd(2, (5, 2))
    # keep the relu inputs away from its kink
    pre = x.astype(np.float64) @ w1
    assert np.min(np.abs(pre)) > 1e-2
    check_op(fn, x, w1, w2, device=device, reference=ref)
