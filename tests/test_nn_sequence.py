"""Tests for the sequence modules of ``needle.nn`` (nn_sequence.py): RNNCell, RNN,
LSTMCell, LSTM and Embedding. Forward values against NumPy references, gradients by
central finite differences for the cells, RNN/RNNCell/LSTM/LSTMCell against PyTorch with
copied weights (needle keeps W_ih as (in, hidden), the transpose of torch's weight_ih),
parameter creation order (the course's NumPy RNG draws), and the errors raised on bad
input shapes."""

import math

import numpy as np
import pytest

import needle as ndl
from needle import nn

from devices import DEVICES
from nn_check import _assert_next_draw, _assert_params, _sigmoid, _t, _uniform_draw, check_module

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
    check_module(cell, [x], lambda x, *p: ref(x, np.zeros((2, 4)), *p), device, grads=False)
    out = cell(_t(x, device))
    out.sum().backward()
    assert all(p.grad is not None for p in cell.parameters())


@pytest.mark.parametrize("device", DEVICES)
def test_rnn_cell_errors(device):
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNNCell(3, 4, nonlinearity="sigmoid")
    cell = nn.RNNCell(3, 4, device=device)
    with pytest.raises(ValueError, match=r"\(batch, 3\)"):
        cell(_t(np.zeros((2, 5)), device))
    with pytest.raises(ValueError):
        cell(_t(np.zeros((1, 2, 3)), device))
    with pytest.raises(ValueError, match="hidden state"):
        cell(_t(np.zeros((2, 3)), device), _t(np.zeros((3, 4)), device))
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
    cells = [params[4 * i : 4 * i + 4] for i in range(num_layers)]
    if with_h0:
        out, h_n = rnn(_t(x, device), _t(h0, device))
    else:
        out, h_n = rnn(_t(x, device))
        h0 = np.zeros_like(h0)
    ref_out, ref_h = _rnn_ref(x, h0, cells, "tanh")
    assert out.shape == (L, bs, hid) and h_n.shape == (num_layers, bs, hid)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h_n.numpy(), ref_h, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_rnn_errors(device):
    rnn = nn.RNN(3, 4, num_layers=2, device=device)
    with pytest.raises(ValueError, match="seq_len, batch, 3"):
        rnn(_t(np.zeros((5, 2, 4)), device))
    with pytest.raises(ValueError):
        rnn(_t(np.zeros((5, 3)), device))
    with pytest.raises(ValueError, match="h0"):
        rnn(_t(np.zeros((5, 2, 3)), device), _t(np.zeros((1, 2, 4)), device))


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
    check_module(cell, [x, h, c], _lstm_cell_ref, device, forward=lambda m, x, h, c: m(x, (h, c)))


@pytest.mark.parametrize("device", DEVICES)
def test_lstm_cell_no_hidden(device):
    np.random.seed(43)
    cell = nn.LSTMCell(3, 4, device=device)
    x = np.random.randn(2, 3)
    z = np.zeros((2, 4))
    check_module(cell, [x], lambda x, *p: _lstm_cell_ref(x, z, z, *p), device, grads=False)


@pytest.mark.parametrize("device", DEVICES)
def test_lstm_cell_errors(device):
    cell = nn.LSTMCell(3, 4, device=device)
    x = _t(np.zeros((2, 3)), device)
    with pytest.raises(ValueError):
        cell(_t(np.zeros((2, 4)), device))
    with pytest.raises(TypeError):
        cell(x, _t(np.zeros((2, 4)), device))
    with pytest.raises(ValueError, match="c0"):
        cell(x, (_t(np.zeros((2, 4)), device), _t(np.zeros((2, 5)), device)))


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
    cells = [params[4 * i : 4 * i + 4] for i in range(num_layers)]
    if with_h:
        out, (h_n, c_n) = lstm(_t(x, device), (_t(h0, device), _t(c0, device)))
    else:
        out, (h_n, c_n) = lstm(_t(x, device))
        h0, c0 = np.zeros_like(h0), np.zeros_like(c0)
    ref = _lstm_ref(x, h0, c0, cells)
    for got, exp in zip((out, h_n, c_n), ref):
        assert got.shape == exp.shape
        np.testing.assert_allclose(got.numpy(), exp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_lstm_errors(device):
    lstm = nn.LSTM(3, 4, num_layers=2, device=device)
    x = _t(np.zeros((5, 2, 3)), device)
    with pytest.raises(ValueError):
        lstm(_t(np.zeros((5, 2, 2)), device))
    with pytest.raises(TypeError):
        lstm(x, _t(np.zeros((2, 2, 4)), device))
    with pytest.raises(ValueError, match="h0"):
        lstm(x, (_t(np.zeros((1, 2, 4)), device), _t(np.zeros((2, 2, 4)), device)))


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
        pairs = [
            (cell.W_ih, getattr(torch_mod, "weight_ih" + s).grad.numpy().T),
            (cell.W_hh, getattr(torch_mod, "weight_hh" + s).grad.numpy().T),
        ]
        if bias:
            pairs += [
                (cell.bias_ih, getattr(torch_mod, "bias_ih" + s).grad.numpy()),
                (cell.bias_hh, getattr(torch_mod, "bias_hh" + s).grad.numpy()),
            ]
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
    _run_both(
        torch,
        device,
        lambda x, h, c: list(cell(x, (h, c))),
        lambda x, h, c: list(ref(x, (h, c))),
        [x, h, c],
    )
    _compare_param_grads(ref, [cell], bias, lambda k: "")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "num_layers, bias, nonlinearity, with_h0",
    [
        (1, True, "tanh", True),
        (2, True, "relu", True),
        (2, False, "tanh", False),
        (3, True, "tanh", False),
    ],
)
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
        _run_both(
            torch, device, lambda x, h: list(rnn(x, h)), lambda x, h: list(ref(x, h)), [x, h0]
        )
    else:
        _run_both(torch, device, lambda x: list(rnn(x)), lambda x: list(ref(x)), [x])
    _compare_param_grads(ref, rnn.rnn_cells, bias, suffix)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "num_layers, bias, with_h",
    [
        (1, True, True),
        (2, True, False),
        (2, False, True),
    ],
)
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


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_out_of_range(device):
    emb = nn.Embedding(5, 2, device=device)
    with pytest.raises((IndexError, ValueError)):
        emb(_t(np.array([[1, 5]]), device, requires_grad=False)).numpy()  # a GPU: at the sync
    with pytest.raises(TypeError):
        emb(np.array([[1, 2]], dtype=np.float32))
