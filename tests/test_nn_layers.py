"""Tests for the convolution, sequence and attention modules of ``needle.nn``
(nn_conv.py, nn_sequence.py, nn_transformer.py).

Checked here: forward values against NumPy references written in this file,
gradients by central finite differences (float64, on the references) for the small
modules, RNN/RNNCell/LSTM/LSTMCell against PyTorch with copied weights (needle keeps
W_ih as (in, hidden), the transpose of torch's weight_ih), parameter creation order
(the course's NumPy RNG draws, reproduced after the same seed), the dropout draws of
MultiHeadAttention and Transformer, and the errors raised on bad input shapes.
"""
import math

import numpy as np
import pytest

import needle as ndl
from needle import nn
from devices import DEVICES

from nn_check import MODES, _flatten, _numeric_grad, _t, _uniform_draw, check_module  # noqa: F401


def _assert_params(params, expected):
    assert len(params) == len(expected)
    for k, (p, e) in enumerate(zip(params, expected)):
        assert isinstance(p, nn.Parameter)
        assert tuple(p.shape) == e.shape, f"parameter {k}"
        np.testing.assert_allclose(p.numpy(), e, rtol=1e-6, atol=1e-7, err_msg=f"parameter {k}")


def _assert_next_draw(seed_state_after):
    """The global RNG is exactly where the reproduced draws left it."""
    assert np.random.rand() == seed_state_after


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# --------------------------------------------------------------------------- Conv

def _conv_ref(x, w, b, stride, padding):
    """x (N, C, H, W), w (k, k, C, O), b (O,) or None -> (N, O, H', W')."""
    k = w.shape[0]
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, _, h, wd = x.shape
    oh, ow = (h - k) // stride + 1, (wd - k) // stride + 1
    out = np.zeros((n, w.shape[3], oh, ow))
    for i in range(k):
        for j in range(k):
            patch = x[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,co->nohw", patch, w[i, j])
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


def test_conv_init_draws():
    np.random.seed(21)
    conv = nn.Conv(3, 4, 3, stride=2)
    after = np.random.rand()
    np.random.seed(21)
    bw = math.sqrt(2) * math.sqrt(3 / (3 * 9))
    bb = 1 / math.sqrt(3 * 9)
    _assert_params(conv.parameters(), [_uniform_draw((3, 3, 3, 4), -bw, bw),
                                       _uniform_draw((4,), -bb, bb)])
    _assert_next_draw(after)
    assert conv.padding == 1 and conv.stride == 2
    nobias = nn.Conv(3, 4, 5, bias=False)
    assert nobias.bias is None and len(nobias.parameters()) == 1 and nobias.padding == 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k, stride, bias, hw", [
    (3, 1, True, (5, 6)), (3, 2, True, (7, 7)), (1, 1, False, (4, 4)),
    (5, 2, True, (8, 9)), (4, 1, True, (6, 6)),
])
def test_conv_forward(device, k, stride, bias, hw):
    np.random.seed(22)
    conv = nn.Conv(3, 4, k, stride=stride, bias=bias, device=device)
    x = np.random.randn(2, 3, *hw)
    pad = (k - 1) // 2

    def ref(x, w, b=None):
        return _conv_ref(x, w, b, stride, pad)

    check_module(conv, [x], ref, device, grads=False, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_gradient(device, stride):
    np.random.seed(23)
    conv = nn.Conv(2, 3, 3, stride=stride, device=device)
    x = np.random.randn(2, 2, 5, 5)

    def ref(x, w, b):
        return _conv_ref(x, w, b, stride, 1)

    check_module(conv, [x], ref, device, atol=1e-4)


def test_conv_matches_torch():
    torch = pytest.importorskip("torch")
    np.random.seed(24)
    conv = nn.Conv(3, 5, 3, stride=2)
    x = np.random.randn(2, 3, 9, 8).astype(np.float32)
    out = conv(_t(x, ndl.cpu())).numpy()
    w = torch.tensor(conv.weight.numpy()).permute(3, 2, 0, 1)
    expected = torch.nn.functional.conv2d(torch.tensor(x), w, torch.tensor(conv.bias.numpy()),
                                          stride=2, padding=1).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_conv_bad_input():
    conv = nn.Conv(3, 4, 3)
    with pytest.raises(ValueError, match="3 channels"):
        conv(_t(np.zeros((2, 4, 5, 5)), ndl.cpu()))
    with pytest.raises(ValueError):
        conv(_t(np.zeros((3, 5, 5)), ndl.cpu()))
    with pytest.raises(TypeError):
        conv(np.zeros((2, 3, 5, 5), dtype=np.float32))


# --------------------------------------------------------------------------- RNNCell / RNN

def _rnn_cell_ref(nonlinearity):
    act = np.tanh if nonlinearity == "tanh" else (lambda z: np.maximum(z, 0))

    def ref(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
        z = x @ w_ih + h @ w_hh
        if b_ih is not None:
            z = z + b_ih + b_hh
        return act(z)
    return ref


def _rnn_ref(x, h0, cells_params, nonlinearity):
    """Multi-layer RNN; cells_params is a list of per-layer (w_ih, w_hh[, b_ih, b_hh])."""
    cell = _rnn_cell_ref(nonlinearity)
    inputs = list(x)
    h_n = []
    for layer, params in enumerate(cells_params):
        h = h0[layer]
        for t in range(len(inputs)):
            h = cell(inputs[t], h, *params)
            inputs[t] = h
        h_n.append(h)
    return np.stack(inputs), np.stack(h_n)


def _rnn_draws(layer_sizes, hidden, gates, bias):
    bound = 1 / math.sqrt(hidden)
    out = []
    for n_in in layer_sizes:
        out.append(_uniform_draw((n_in, gates * hidden), -bound, bound))
        out.append(_uniform_draw((hidden, gates * hidden), -bound, bound))
        if bias:
            out.append(_uniform_draw((gates * hidden,), -bound, bound))
            out.append(_uniform_draw((gates * hidden,), -bound, bound))
    return out


@pytest.mark.parametrize("bias", [True, False])
def test_rnn_cell_init_draws(bias):
    np.random.seed(31)
    cell = nn.RNNCell(5, 4, bias=bias)
    after = np.random.rand()
    np.random.seed(31)
    _assert_params(cell.parameters(), _rnn_draws([5], 4, 1, bias))
    _assert_next_draw(after)
    if bias:
        expected = [cell.W_ih, cell.W_hh, cell.bias_ih, cell.bias_hh]
        assert all(p is q for p, q in zip(cell.parameters(), expected))
    else:
        assert cell.bias_ih is None and cell.bias_hh is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_rnn_cell_gradient(device, nonlinearity, bias):
    np.random.seed(32)
    cell = nn.RNNCell(3, 4, bias=bias, nonlinearity=nonlinearity, device=device)
    x, h = np.random.randn(2, 3), np.random.randn(2, 4)
    check_module(cell, [x, h], _rnn_cell_ref(nonlinearity), device)


@pytest.mark.parametrize("device", DEVICES)
def test_rnn_cell_no_hidden(device):
    np.random.seed(33)
    cell = nn.RNNCell(3, 4, device=device)
    x = np.random.randn(2, 3)
    ref = _rnn_cell_ref("tanh")
    check_module(cell, [x], lambda x, *p: ref(x, np.zeros((2, 4)), *p), device,
                 grads=False)
    out = cell(_t(x, device))
    out.sum().backward()
    assert all(p.grad is not None for p in cell.parameters())


def test_rnn_cell_errors():
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNNCell(3, 4, nonlinearity="sigmoid")
    cell = nn.RNNCell(3, 4)
    with pytest.raises(ValueError, match=r"\(batch, 3\)"):
        cell(_t(np.zeros((2, 5)), ndl.cpu()))
    with pytest.raises(ValueError):
        cell(_t(np.zeros((1, 2, 3)), ndl.cpu()))
    with pytest.raises(ValueError, match="hidden state"):
        cell(_t(np.zeros((2, 3)), ndl.cpu()), _t(np.zeros((3, 4)), ndl.cpu()))
    with pytest.raises(TypeError):
        cell(np.zeros((2, 3), dtype=np.float32))


def test_rnn_init_draws():
    np.random.seed(34)
    rnn = nn.RNN(5, 4, num_layers=3)
    after = np.random.rand()
    assert len(rnn.rnn_cells) == 3 and isinstance(rnn.rnn_cells, list)
    np.random.seed(34)
    _assert_params(rnn.parameters(), _rnn_draws([5, 4, 4], 4, 1, True))
    _assert_next_draw(after)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers, with_h0", [(1, False), (2, True), (3, False)])
def test_rnn_forward_numpy(device, num_layers, with_h0):
    np.random.seed(35)
    L, bs, n_in, hid = 4, 2, 3, 5
    rnn = nn.RNN(n_in, hid, num_layers, device=device)
    x = np.random.randn(L, bs, n_in)
    h0 = np.random.randn(num_layers, bs, hid)
    params = [p.numpy().astype(np.float64) for p in rnn.parameters()]
    cells = [params[4 * i:4 * i + 4] for i in range(num_layers)]
    if with_h0:
        out, h_n = rnn(_t(x, device), _t(h0, device))
    else:
        out, h_n = rnn(_t(x, device))
        h0 = np.zeros_like(h0)
    ref_out, ref_h = _rnn_ref(x, h0, cells, "tanh")
    assert out.shape == (L, bs, hid) and h_n.shape == (num_layers, bs, hid)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h_n.numpy(), ref_h, rtol=1e-5, atol=1e-5)


def test_rnn_errors():
    rnn = nn.RNN(3, 4, num_layers=2)
    with pytest.raises(ValueError, match="seq_len, batch, 3"):
        rnn(_t(np.zeros((5, 2, 4)), ndl.cpu()))
    with pytest.raises(ValueError):
        rnn(_t(np.zeros((5, 3)), ndl.cpu()))
    with pytest.raises(ValueError, match="h0"):
        rnn(_t(np.zeros((5, 2, 3)), ndl.cpu()), _t(np.zeros((1, 2, 4)), ndl.cpu()))


# --------------------------------------------------------------------------- LSTMCell / LSTM

def _lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    z = x @ w_ih + h @ w_hh
    if b_ih is not None:
        z = z + b_ih + b_hh
    i, f, g, o = np.split(z, 4, axis=1)
    i, f, g, o = _sigmoid(i), _sigmoid(f), np.tanh(g), _sigmoid(o)
    c = f * c + i * g
    return o * np.tanh(c), c


def _lstm_ref(x, h0, c0, cells_params):
    inputs = list(x)
    h_n, c_n = [], []
    for layer, params in enumerate(cells_params):
        h, c = h0[layer], c0[layer]
        for t in range(len(inputs)):
            h, c = _lstm_cell_ref(inputs[t], h, c, *params)
            inputs[t] = h
        h_n.append(h)
        c_n.append(c)
    return np.stack(inputs), np.stack(h_n), np.stack(c_n)


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell_init_draws(bias):
    np.random.seed(41)
    cell = nn.LSTMCell(5, 3, bias=bias)
    after = np.random.rand()
    np.random.seed(41)
    _assert_params(cell.parameters(), _rnn_draws([5], 3, 4, bias))
    _assert_next_draw(after)
    assert cell.W_ih.shape == (5, 12) and cell.W_hh.shape == (3, 12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell_gradient(device, bias):
    np.random.seed(42)
    cell = nn.LSTMCell(3, 2, bias=bias, device=device)
    x, h, c = np.random.randn(2, 3), np.random.randn(2, 2), np.random.randn(2, 2)
    check_module(cell, [x, h, c], _lstm_cell_ref, device,
                 forward=lambda m, x, h, c: m(x, (h, c)))


@pytest.mark.parametrize("device", DEVICES)
def test_lstm_cell_no_hidden(device):
    np.random.seed(43)
    cell = nn.LSTMCell(3, 4, device=device)
    x = np.random.randn(2, 3)
    z = np.zeros((2, 4))
    check_module(cell, [x], lambda x, *p: _lstm_cell_ref(x, z, z, *p), device, grads=False)


def test_lstm_cell_errors():
    cell = nn.LSTMCell(3, 4)
    x = _t(np.zeros((2, 3)), ndl.cpu())
    with pytest.raises(ValueError):
        cell(_t(np.zeros((2, 4)), ndl.cpu()))
    with pytest.raises(TypeError):
        cell(x, _t(np.zeros((2, 4)), ndl.cpu()))
    with pytest.raises(ValueError, match="c0"):
        cell(x, (_t(np.zeros((2, 4)), ndl.cpu()), _t(np.zeros((2, 5)), ndl.cpu())))


def test_lstm_init_draws():
    np.random.seed(44)
    lstm = nn.LSTM(5, 3, num_layers=2, bias=False)
    after = np.random.rand()
    assert len(lstm.lstm_cells) == 2 and isinstance(lstm.lstm_cells, list)
    np.random.seed(44)
    _assert_params(lstm.parameters(), _rnn_draws([5, 3], 3, 4, False))
    _assert_next_draw(after)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers, with_h", [(1, True), (2, False)])
def test_lstm_forward_numpy(device, num_layers, with_h):
    np.random.seed(45)
    L, bs, n_in, hid = 3, 2, 4, 3
    lstm = nn.LSTM(n_in, hid, num_layers, device=device)
    x = np.random.randn(L, bs, n_in)
    h0 = np.random.randn(num_layers, bs, hid)
    c0 = np.random.randn(num_layers, bs, hid)
    params = [p.numpy().astype(np.float64) for p in lstm.parameters()]
    cells = [params[4 * i:4 * i + 4] for i in range(num_layers)]
    if with_h:
        out, (h_n, c_n) = lstm(_t(x, device), (_t(h0, device), _t(c0, device)))
    else:
        out, (h_n, c_n) = lstm(_t(x, device))
        h0, c0 = np.zeros_like(h0), np.zeros_like(c0)
    ref = _lstm_ref(x, h0, c0, cells)
    for got, exp in zip((out, h_n, c_n), ref):
        assert got.shape == exp.shape
        np.testing.assert_allclose(got.numpy(), exp, rtol=1e-5, atol=1e-5)


def test_lstm_errors():
    lstm = nn.LSTM(3, 4, num_layers=2)
    x = _t(np.zeros((5, 2, 3)), ndl.cpu())
    with pytest.raises(ValueError):
        lstm(_t(np.zeros((5, 2, 2)), ndl.cpu()))
    with pytest.raises(TypeError):
        lstm(x, _t(np.zeros((2, 2, 4)), ndl.cpu()))
    with pytest.raises(ValueError, match="h0"):
        lstm(x, (_t(np.zeros((1, 2, 4)), ndl.cpu()), _t(np.zeros((2, 2, 4)), ndl.cpu())))


# --------------------------------------------------------------------------- PyTorch

def _copy_to_torch(torch, torch_mod, cells, bias, suffix):
    with torch.no_grad():
        for k, cell in enumerate(cells):
            s = suffix(k)
            getattr(torch_mod, "weight_ih" + s).copy_(torch.tensor(cell.W_ih.numpy().T))
            getattr(torch_mod, "weight_hh" + s).copy_(torch.tensor(cell.W_hh.numpy().T))
            if bias:
                getattr(torch_mod, "bias_ih" + s).copy_(torch.tensor(cell.bias_ih.numpy()))
                getattr(torch_mod, "bias_hh" + s).copy_(torch.tensor(cell.bias_hh.numpy()))


def _compare_param_grads(torch_mod, cells, bias, suffix):
    for k, cell in enumerate(cells):
        s = suffix(k)
        pairs = [(cell.W_ih, getattr(torch_mod, "weight_ih" + s).grad.numpy().T),
                 (cell.W_hh, getattr(torch_mod, "weight_hh" + s).grad.numpy().T)]
        if bias:
            pairs += [(cell.bias_ih, getattr(torch_mod, "bias_ih" + s).grad.numpy()),
                      (cell.bias_hh, getattr(torch_mod, "bias_hh" + s).grad.numpy())]
        for p, g in pairs:
            np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-4, atol=1e-5)


def _run_both(torch, device, needle_fn, torch_fn, arrays, seed=0):
    """Runs needle_fn(*Tensors) and torch_fn(*torch tensors) (each returning a list of
    outputs), compares the outputs, backprops a random weighted sum through both and
    returns the gradients of the inputs (needle, torch)."""
    nd_in = [_t(a, device) for a in arrays]
    th_in = [torch.tensor(np.asarray(a, dtype=np.float32), requires_grad=True) for a in arrays]
    nd_out = needle_fn(*nd_in)
    th_out = torch_fn(*th_in)
    rng = np.random.default_rng(seed)
    nd_loss, th_loss = None, 0
    for o, r in zip(nd_out, th_out):
        assert tuple(o.shape) == tuple(r.shape)
        np.testing.assert_allclose(o.numpy(), r.detach().numpy(), rtol=1e-5, atol=1e-5)
        w = rng.uniform(0.5, 1.5, size=tuple(r.shape)).astype(np.float32)
        term = (o * _t(w, device, requires_grad=False)).sum()
        nd_loss = term if nd_loss is None else nd_loss + term
        th_loss = th_loss + (r * torch.tensor(w)).sum()
    nd_loss.backward()
    th_loss.backward()
    for a, b in zip(nd_in, th_in):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_rnn_cell_vs_torch(device, nonlinearity, bias):
    torch = pytest.importorskip("torch")
    np.random.seed(51)
    cell = nn.RNNCell(4, 5, bias=bias, nonlinearity=nonlinearity, device=device)
    ref = torch.nn.RNNCell(4, 5, bias=bias, nonlinearity=nonlinearity)
    _copy_to_torch(torch, ref, [cell], bias, lambda k: "")
    x, h = np.random.randn(3, 4), np.random.randn(3, 5)
    _run_both(torch, device, lambda x, h: [cell(x, h)], lambda x, h: [ref(x, h)], [x, h])
    _compare_param_grads(ref, [cell], bias, lambda k: "")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell_vs_torch(device, bias):
    torch = pytest.importorskip("torch")
    np.random.seed(52)
    cell = nn.LSTMCell(4, 3, bias=bias, device=device)
    ref = torch.nn.LSTMCell(4, 3, bias=bias)
    _copy_to_torch(torch, ref, [cell], bias, lambda k: "")
    x, h, c = np.random.randn(2, 4), np.random.randn(2, 3), np.random.randn(2, 3)
    _run_both(torch, device, lambda x, h, c: list(cell(x, (h, c))),
              lambda x, h, c: list(ref(x, (h, c))), [x, h, c])
    _compare_param_grads(ref, [cell], bias, lambda k: "")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers, bias, nonlinearity, with_h0", [
    (1, True, "tanh", True), (2, True, "relu", True), (2, False, "tanh", False),
    (3, True, "tanh", False),
])
def test_rnn_vs_torch(device, num_layers, bias, nonlinearity, with_h0):
    torch = pytest.importorskip("torch")
    np.random.seed(53)
    L, bs, n_in, hid = 5, 3, 4, 6
    rnn = nn.RNN(n_in, hid, num_layers, bias=bias, nonlinearity=nonlinearity, device=device)
    ref = torch.nn.RNN(n_in, hid, num_layers, bias=bias, nonlinearity=nonlinearity)
    suffix = "_l{}".format
    _copy_to_torch(torch, ref, rnn.rnn_cells, bias, suffix)
    x = np.random.randn(L, bs, n_in)
    if with_h0:
        h0 = np.random.randn(num_layers, bs, hid)
        _run_both(torch, device, lambda x, h: list(rnn(x, h)), lambda x, h: list(ref(x, h)),
                  [x, h0])
    else:
        _run_both(torch, device, lambda x: list(rnn(x)), lambda x: list(ref(x)), [x])
    _compare_param_grads(ref, rnn.rnn_cells, bias, suffix)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers, bias, with_h", [
    (1, True, True), (2, True, False), (2, False, True),
])
def test_lstm_vs_torch(device, num_layers, bias, with_h):
    torch = pytest.importorskip("torch")
    np.random.seed(54)
    L, bs, n_in, hid = 4, 3, 5, 4
    lstm = nn.LSTM(n_in, hid, num_layers, bias=bias, device=device)
    ref = torch.nn.LSTM(n_in, hid, num_layers, bias=bias)
    suffix = "_l{}".format
    _copy_to_torch(torch, ref, lstm.lstm_cells, bias, suffix)
    x = np.random.randn(L, bs, n_in)

    def run_nd(x, h=None, c=None):
        out, (h_n, c_n) = lstm(x, None if h is None else (h, c))
        return [out, h_n, c_n]

    def run_th(x, h=None, c=None):
        out, (h_n, c_n) = ref(x, None if h is None else (h, c))
        return [out, h_n, c_n]

    arrays = [x]
    if with_h:
        arrays += [np.random.randn(num_layers, bs, hid), np.random.randn(num_layers, bs, hid)]
    _run_both(torch, device, run_nd, run_th, arrays)
    _compare_param_grads(ref, lstm.lstm_cells, bias, suffix)


# --------------------------------------------------------------------------- Embedding

def test_embedding_init_draw():
    np.random.seed(61)
    emb = nn.Embedding(10, 4)
    after = np.random.rand()
    np.random.seed(61)
    _assert_params(emb.parameters(), [np.random.randn(10, 4).astype(np.float32)])
    _assert_next_draw(after)
    assert emb.parameters()[0] is emb.weight


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_forward_backward(device):
    np.random.seed(62)
    emb = nn.Embedding(7, 3, device=device)
    idx = np.array([[0, 3, 3], [6, 1, 0]], dtype=np.float32)  # (L, bs)
    x = _t(idx, device, requires_grad=False)
    out = emb(x)
    assert out.shape == (2, 3, 3)
    w = emb.weight.numpy()
    np.testing.assert_array_equal(out.numpy(), w[idx.astype(int)])
    # the course's formula: one_hot(x) @ W
    one_hot = ndl.init.one_hot(7, x, device=device)
    course = (one_hot.reshape((6, 7)) @ emb.weight).reshape((2, 3, 3))
    np.testing.assert_allclose(out.numpy(), course.numpy(), rtol=1e-6, atol=1e-7)
    g = np.random.randn(2, 3, 3).astype(np.float32)
    (out * _t(g, device, requires_grad=False)).sum().backward()
    expected = np.zeros((7, 3), dtype=np.float32)
    np.add.at(expected, idx.astype(int).reshape(-1), g.reshape(-1, 3))
    np.testing.assert_allclose(emb.weight.grad.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_embedding_out_of_range():
    emb = nn.Embedding(5, 2)
    with pytest.raises((IndexError, ValueError)):
        emb(_t(np.array([[1, 5]]), ndl.cpu(), requires_grad=False))
    with pytest.raises(TypeError):
        emb(np.array([[1, 2]], dtype=np.float32))


# --------------------------------------------------------------------------- attention refs

def _ln_ref(x, w, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


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
        x = _transformer_layer_ref(x, params[1 + 16 * k:17 + 16 * k], heads, dim, causal, p,
                                   training)
    return x if batch_first else x.transpose(1, 0, 2)


def _np_params(module):
    return [p.numpy().astype(np.float64) for p in module.parameters()]


# --------------------------------------------------------------------------- MultiHeadAttention

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal, lq, lk", [(False, 4, 4), (True, 4, 4), (True, 3, 5),
                                            (False, 2, 6)])
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
        masked = np.broadcast_to(np.triu(np.ones((lq, lk), dtype=bool), lk - lq + 1),
                                 probs.shape)
        assert np.all(probs.numpy()[masked] == 0.0)  # exactly zero


def test_mha_causal_mask():
    mask = nn.MultiHeadAttention(causal=True).create_causal_mask(2, 3, ndl.cpu())
    assert isinstance(mask, ndl.NDArray) and mask.shape == (1, 1, 2, 3)
    big = -np.finfo(np.float32).max
    np.testing.assert_array_equal(mask.numpy()[0, 0], [[0, 0, big], [0, 0, 0]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.0, 0.4])
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


def test_mha_bad_shapes():
    mha = nn.MultiHeadAttention()
    x = _t(np.zeros((1, 2, 3, 4)), ndl.cpu())
    with pytest.raises(ValueError, match="4-D"):
        mha(_t(np.zeros((2, 3, 4)), ndl.cpu()), x, x)
    with pytest.raises(ValueError):
        mha(x, _t(np.zeros((1, 2, 3, 5)), ndl.cpu()), x)
    with pytest.raises(ValueError):
        mha(x, x, _t(np.zeros((1, 2, 4, 4)), ndl.cpu()))
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
    layer = nn.AttentionLayer(6, 2, 3, k_features=5, v_features=4, out_features=7,
                              causal=causal, device=device)
    for ln in (layer.prenorm_q, layer.prenorm_k, layer.prenorm_v):
        ln.w.data = _t(np.random.randn(ln.dim), device)
        ln.b.data = _t(np.random.randn(ln.dim), device)
    q, k, v = np.random.randn(2, 3, 6), np.random.randn(2, 4, 5), np.random.randn(2, 4, 4)
    out = layer(_t(q, device), _t(k, device), _t(v, device))
    ref, ref_probs = _attention_layer_ref(q, k, v, _np_params(layer), 2, 3, causal,
                                          training=True)
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
    check_module(layer, [x],
                 lambda x, *p: _attention_layer_ref(x, x, x, p, 2, 2, True)[0], device)


def test_attention_layer_bad_shapes():
    layer = nn.AttentionLayer(6, 2, 3, k_features=5)
    q = _t(np.zeros((2, 3, 6)), ndl.cpu())
    with pytest.raises(ValueError, match="k must have shape"):
        layer(q, _t(np.zeros((2, 4, 6)), ndl.cpu()), _t(np.zeros((2, 4, 6)), ndl.cpu()))
    with pytest.raises(ValueError):
        layer(_t(np.zeros((3, 6)), ndl.cpu()))
    with pytest.raises(ValueError):
        layer(q, _t(np.zeros((2, 4, 5)), ndl.cpu()), _t(np.zeros((2, 3, 6)), ndl.cpu()))


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
        4, 256)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("training", [False, True])
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
    check_module(layer, [x], lambda x, *p: _transformer_layer_ref(x, p, 2, 2, True), device,
                 atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_first, training, causal", [
    (False, False, True), (True, False, False), (False, True, True), (True, True, True),
])
def test_transformer_forward(device, batch_first, training, causal):
    np.random.seed(95)
    model = nn.Transformer(8, 10, 2, num_head=2, dim_head=4, dropout=0.2, causal=causal,
                           device=device, batch_first=batch_first, sequence_len=16)
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
    model = nn.Transformer(8, 10, 2, num_head=2, dim_head=4, dropout=0.1, device=device,
                           sequence_len=8)
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
    drops = [m for layer in model.transformer_layers for m in layer._children()
             if isinstance(m, nn.Dropout)]
    assert len(drops) == 2 * 4
    model.eval()
    assert not any(d.training for d in drops)
    model.train()
    assert all(d.training for d in drops)


def test_transformer_bad_shapes():
    model = nn.Transformer(4, 6, 1, num_head=1, dim_head=2, sequence_len=8)
    with pytest.raises(ValueError, match="D = 4"):
        model(_t(np.zeros((3, 2, 5)), ndl.cpu()))
    with pytest.raises(ValueError):
        model(_t(np.zeros((3, 4)), ndl.cpu()))
    with pytest.raises(ValueError, match="sequence_len"):
        model(_t(np.zeros((9, 2, 4)), ndl.cpu()))
    with pytest.raises(TypeError):
        model(np.zeros((3, 2, 4)))
    with pytest.raises(ValueError):
        nn.TransformerLayer(4, 1, 2, 6)(_t(np.zeros((2, 3, 5)), ndl.cpu()))
