"""Tests for the attention modules of ``needle.nn`` (nn_transformer.py):
MultiHeadAttention, AttentionLayer, TransformerLayer and Transformer. Forward values
against NumPy references, gradients by central finite differences, the dropout draws,
parameter creation order, train()/eval() reaching every layer, and the errors raised on
bad input shapes."""

import math

import numpy as np
import pytest

import needle as ndl
from needle import nn

from devices import DEVICES
from nn_check import _assert_next_draw, _assert_params, _ln_ref, _t, _uniform_draw, check_module

# --------------------------------------------------------------------------- attention refs


def _drop_ref(x, p, training):
    """Dropout with the module's draw: one np.random.rand(*x.shape), keep where <= 1-p."""
    if not training:
        return x
    mask = np.random.rand(*x.shape).astype(np.float32) <= np.float32(1 - p)
    return x * mask / (1 - p)


def _mha_ref(q, k, v, causal, p=0.0, training=False):
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        i, j = logits.shape[-2:]
        logits = np.where(np.triu(np.ones((i, j), dtype=bool), j - i + 1), -np.inf, logits)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = _drop_ref(e / e.sum(axis=-1, keepdims=True), p, training)
    return probs @ v, probs


def _attention_layer_ref(q, k, v, params, heads, dim, causal, p=0.0, training=False):
    lnq_w, lnq_b, lnk_w, lnk_b, lnv_w, lnv_b, wq, wk, wv, wo = params
    b, lq = q.shape[:2]
    lk = k.shape[1]

    def split_heads(x, length):
        return x.reshape(b, length, heads, dim).transpose(0, 2, 1, 3)

    qh = split_heads(_ln_ref(q, lnq_w, lnq_b) @ wq, lq)
    kh = split_heads(_ln_ref(k, lnk_w, lnk_b) @ wk, lk)
    vh = split_heads(_ln_ref(v, lnv_w, lnv_b) @ wv, lk)
    res, probs = _mha_ref(qh, kh, vh, causal, p, training)
    return res.transpose(0, 2, 1, 3).reshape(b, lq, heads * dim) @ wo, probs


def _transformer_layer_ref(x, params, heads, dim, causal, p=0.0, training=False):
    ln_w, ln_b, w1, b1, w2, b2 = params[10:]
    a, _ = _attention_layer_ref(x, x, x, params[:10], heads, dim, causal, p, training)
    x = x + _drop_ref(a, p, training)
    y = _drop_ref(np.maximum(_ln_ref(x, ln_w, ln_b) @ w1 + b1, 0), p, training)
    return x + _drop_ref(y @ w2 + b2, p, training)


def _transformer_ref(x, params, heads, dim, causal, p, training, batch_first):
    if not batch_first:
        x = x.transpose(1, 0, 2)
    x = x + params[0][np.arange(x.shape[1])][None]
    for k in range((len(params) - 1) // 16):
        x = _transformer_layer_ref(
            x, params[1 + 16 * k : 17 + 16 * k], heads, dim, causal, p, training
        )
    return x if batch_first else x.transpose(1, 0, 2)


def _np_params(module):
    return [p.numpy().astype(np.float64) for p in module.parameters()]


# --------------------------------------------------------------------------- MultiHeadAttention


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "causal, lq, lk", [(False, 4, 4), (True, 4, 4), (True, 3, 5), (False, 2, 6)]
)
def test_mha_forward(device, causal, lq, lk):
    np.random.seed(71)
    mha = nn.MultiHeadAttention(causal=causal, device=device)
    mha.eval()
    assert mha.parameters() == []
    q = np.random.randn(2, 3, lq, 4) * 2
    k = np.random.randn(2, 3, lk, 4) * 2
    v = np.random.randn(2, 3, lk, 5)
    res, probs = mha(_t(q, device), _t(k, device), _t(v, device))
    ref_res, ref_probs = _mha_ref(q, k, v, causal)
    assert res.shape == (2, 3, lq, 5) and probs.shape == (2, 3, lq, lk)
    np.testing.assert_allclose(res.numpy(), ref_res, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(probs.numpy(), ref_probs, rtol=1e-5, atol=1e-6)
    if causal:
        masked = np.broadcast_to(np.triu(np.ones((lq, lk), dtype=bool), lk - lq + 1), probs.shape)
        assert np.all(probs.numpy()[masked] == 0.0)  # exactly zero


@pytest.mark.parametrize("device", DEVICES)
def test_mha_causal_mask(device):
    mask = nn.MultiHeadAttention(causal=True, device=device).create_causal_mask(2, 3, device)
    assert isinstance(mask, ndl.NDArray) and mask.shape == (1, 1, 2, 3)
    big = -np.finfo(np.float32).max
    np.testing.assert_array_equal(mask.numpy()[0, 0], [[0, 0, big], [0, 0, 0]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.0, 0.4])
@pytest.mark.usefixtures("host_rng")
def test_mha_dropout_draws(device, p):
    np.random.seed(72)
    q, k, v = (np.random.randn(2, 2, 3, 4) for _ in range(3))
    mha = nn.MultiHeadAttention(dropout=p, causal=True, device=device)
    np.random.seed(73)
    res, probs = mha(_t(q, device), _t(k, device), _t(v, device))
    after = np.random.rand()
    np.random.seed(73)
    ref_res, ref_probs = _mha_ref(q, k, v, True, p, training=True)
    _assert_next_draw(after)  # one np.random.rand(B, H, Lq, Lk) per call
    np.testing.assert_allclose(probs.numpy(), ref_probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.numpy(), ref_res, rtol=1e-5, atol=1e-5)
    mha.eval()
    state = np.random.get_state()[1].copy()
    mha(_t(q, device), _t(k, device), _t(v, device))
    np.testing.assert_array_equal(np.random.get_state()[1], state)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_mha_gradient(device, causal):
    np.random.seed(74)
    mha = nn.MultiHeadAttention(causal=causal, device=device)
    mha.eval()
    q, k, v = np.random.randn(1, 2, 3, 2), np.random.randn(1, 2, 4, 2), np.random.randn(1, 2, 4, 3)
    check_module(mha, [q, k, v], lambda q, k, v: _mha_ref(q, k, v, causal), device)


@pytest.mark.parametrize("device", DEVICES)
def test_mha_bad_shapes(device):
    mha = nn.MultiHeadAttention(device=device)
    x = _t(np.zeros((1, 2, 3, 4)), device)
    with pytest.raises(ValueError, match="4-D"):
        mha(_t(np.zeros((2, 3, 4)), device), x, x)
    with pytest.raises(ValueError):
        mha(x, _t(np.zeros((1, 2, 3, 5)), device), x)
    with pytest.raises(ValueError):
        mha(x, x, _t(np.zeros((1, 2, 4, 4)), device))
    with pytest.raises(TypeError):
        mha(np.zeros((1, 2, 3, 4)), x, x)


# --------------------------------------------------------------------------- AttentionLayer


def _attention_draws(q_f, k_f, v_f, out_f, inner):
    out = []
    for f in (q_f, k_f, v_f):
        out += [np.ones(f, dtype=np.float32), np.zeros(f, dtype=np.float32)]
    for f in (q_f, k_f, v_f):
        bound = math.sqrt(6 / f)
        out.append(_uniform_draw((f, inner), -bound, bound))
    bound = math.sqrt(6 / inner)
    out.append(_uniform_draw((inner, out_f), -bound, bound))
    return out


def test_attention_layer_init_draws():
    np.random.seed(81)
    layer = nn.AttentionLayer(6, 2, 3, k_features=5, v_features=4, out_features=7)
    after = np.random.rand()
    np.random.seed(81)
    _assert_params(layer.parameters(), _attention_draws(6, 5, 4, 7, 6))
    _assert_next_draw(after)
    assert layer.q_projection.bias is None and layer.attn.causal


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_layer_forward(device, causal):
    np.random.seed(82)
    layer = nn.AttentionLayer(
        6, 2, 3, k_features=5, v_features=4, out_features=7, causal=causal, device=device
    )
    for ln in (layer.prenorm_q, layer.prenorm_k, layer.prenorm_v):
        ln.w.data = _t(np.random.randn(ln.dim), device)
        ln.b.data = _t(np.random.randn(ln.dim), device)
    q, k, v = np.random.randn(2, 3, 6), np.random.randn(2, 4, 5), np.random.randn(2, 4, 4)
    out = layer(_t(q, device), _t(k, device), _t(v, device))
    ref, ref_probs = _attention_layer_ref(q, k, v, _np_params(layer), 2, 3, causal, training=True)
    assert out.shape == (2, 3, 7)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.probs.numpy(), ref_probs, rtol=1e-4, atol=1e-6)
    # self-attention: k and v default to q
    layer = nn.AttentionLayer(6, 2, 3, causal=causal, device=device)
    out = layer(_t(q, device))
    ref, _ = _attention_layer_ref(q, q, q, _np_params(layer), 2, 3, causal)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_layer_gradient(device):
    np.random.seed(83)
    layer = nn.AttentionLayer(4, 2, 2, device=device)
    layer.eval()
    x = np.random.randn(1, 3, 4)
    check_module(layer, [x], lambda x, *p: _attention_layer_ref(x, x, x, p, 2, 2, True)[0], device)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_layer_bad_shapes(device):
    layer = nn.AttentionLayer(6, 2, 3, k_features=5, device=device)
    q = _t(np.zeros((2, 3, 6)), device)
    with pytest.raises(ValueError, match="k must have shape"):
        layer(q, _t(np.zeros((2, 4, 6)), device), _t(np.zeros((2, 4, 6)), device))
    with pytest.raises(ValueError):
        layer(_t(np.zeros((3, 6)), device))
    with pytest.raises(ValueError):
        layer(q, _t(np.zeros((2, 4, 5)), device), _t(np.zeros((2, 3, 6)), device))


# --------------------------------------------------------------------------- Transformer


def _transformer_layer_draws(d, hidden, inner):
    out = _attention_draws(d, d, d, d, inner)
    out += [np.ones(d, dtype=np.float32), np.zeros(d, dtype=np.float32)]
    for fan_in, fan_out in ((d, hidden), (hidden, d)):
        bw, bb = math.sqrt(6 / fan_in), math.sqrt(6 / fan_out)
        out.append(_uniform_draw((fan_in, fan_out), -bw, bw))
        out.append(_uniform_draw((fan_out, 1), -bb, bb).T)
    return out


def test_transformer_layer_structure():
    layer = nn.TransformerLayer(8, 2, 3, 12, dropout=0.1)
    attn, drop = layer.residual1.fn.modules
    assert isinstance(attn, nn.AttentionLayer) and isinstance(drop, nn.Dropout)
    kinds = [type(m) for m in layer.residual2.fn.modules]
    assert kinds == [nn.LayerNorm1d, nn.Linear, nn.ReLU, nn.Dropout, nn.Linear, nn.Dropout]
    assert attn.attn.dropout.p == 0.1 and attn.attn.causal


def test_transformer_init_draws():
    np.random.seed(91)
    model = nn.Transformer(8, 12, 2, num_head=2, dim_head=3, sequence_len=20)
    after = np.random.rand()
    np.random.seed(91)
    expected = [np.random.randn(20, 8).astype(np.float32)]
    for _ in range(2):
        expected += _transformer_layer_draws(8, 12, 6)
    _assert_params(model.parameters(), expected)
    _assert_next_draw(after)
    assert model.parameters()[0] is model.positional_embedding.weight
    assert len(model.transformer_layers) == 2
    default = nn.Transformer(4, 8, 1)
    assert default.positional_embedding.weight.shape == (2048, 4)
    assert default.transformer_layers[0].residual1.fn.modules[0].q_projection.weight.shape == (
        4,
        256,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.usefixtures("host_rng")
def test_transformer_layer_forward(device, training):
    np.random.seed(92)
    layer = nn.TransformerLayer(6, 2, 3, 10, dropout=0.3, device=device)
    if not training:
        layer.eval()
    x = np.random.randn(2, 4, 6)
    np.random.seed(93)
    out = layer(_t(x, device))
    after = np.random.rand()
    np.random.seed(93)
    ref = _transformer_layer_ref(x, _np_params(layer), 2, 3, True, 0.3, training)
    _assert_next_draw(after)
    assert out.shape == (2, 4, 6)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_transformer_layer_gradient(device):
    np.random.seed(94)
    layer = nn.TransformerLayer(4, 2, 2, 5, device=device)
    layer.eval()
    x = np.random.randn(1, 3, 4)
    check_module(
        layer, [x], lambda x, *p: _transformer_layer_ref(x, p, 2, 2, True), device, atol=1e-4
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "batch_first, training, causal",
    [
        (False, False, True),
        (True, False, False),
        (False, True, True),
        (True, True, True),
    ],
)
@pytest.mark.usefixtures("host_rng")
def test_transformer_forward(device, batch_first, training, causal):
    np.random.seed(95)
    model = nn.Transformer(
        8,
        10,
        2,
        num_head=2,
        dim_head=4,
        dropout=0.2,
        causal=causal,
        device=device,
        batch_first=batch_first,
        sequence_len=16,
    )
    if not training:
        model.eval()
    x = np.random.randn(5, 3, 8)  # (L, B, D), or (B, L, D) when batch_first
    np.random.seed(96)
    out, h = model(_t(x, device))
    after = np.random.rand()
    np.random.seed(96)
    ref = _transformer_ref(x, _np_params(model), 2, 4, causal, 0.2, training, batch_first)
    _assert_next_draw(after)  # same dropout draws, in the same order
    assert out.shape == x.shape and h.shape == x.shape
    np.testing.assert_array_equal(h.numpy(), np.zeros(x.shape))
    assert not h.requires_grad
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_transformer_backward_reaches_all_parameters(device):
    np.random.seed(97)
    model = nn.Transformer(
        8, 10, 2, num_head=2, dim_head=4, dropout=0.1, device=device, sequence_len=8
    )
    x = _t(np.random.randn(4, 2, 8), device)
    out, _ = model(x)
    (out * out).sum().backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.shape == p.shape
    # positions >= L are never used: their embedding rows get zero gradient
    np.testing.assert_array_equal(model.positional_embedding.weight.grad.numpy()[4:], 0)
    assert np.any(model.positional_embedding.weight.grad.numpy()[:4] != 0)


def test_transformer_train_eval_reaches_layers():
    model = nn.Transformer(4, 6, 2, num_head=1, dim_head=2, sequence_len=8)
    drops = [
        m
        for layer in model.transformer_layers
        for m in layer._children()
        if isinstance(m, nn.Dropout)
    ]
    assert len(drops) == 2 * 4
    model.eval()
    assert not any(d.training for d in drops)
    model.train()
    assert all(d.training for d in drops)


@pytest.mark.parametrize("device", DEVICES)
def test_transformer_bad_shapes(device):
    model = nn.Transformer(4, 6, 1, num_head=1, dim_head=2, sequence_len=8, device=device)
    with pytest.raises(ValueError, match="D = 4"):
        model(_t(np.zeros((3, 2, 5)), device))
    with pytest.raises(ValueError):
        model(_t(np.zeros((3, 4)), device))
    with pytest.raises(ValueError, match="sequence_len"):
        model(_t(np.zeros((9, 2, 4)), device))
    with pytest.raises(TypeError):
        model(np.zeros((3, 2, 4)))
    with pytest.raises(ValueError):
        nn.TransformerLayer(4, 1, 2, 6, device=device)(_t(np.zeros((2, 3, 5)), device))
