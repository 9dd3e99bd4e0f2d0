"""The fused LSTM ops: one step (``lstm_cell``) and one layer over a sequence (``lstm``).

Gate order i, f, g, o (PyTorch's) and the course's weight layout: ``W_ih`` (input_size,
4 * hidden_size), ``W_hh`` (hidden_size, 4 * hidden_size), biases (4 * hidden_size,). Each
step is two GEMMs and one fused kernel forward, one kernel and the GEMMs backward; the
gradient is the fused kernel's in the default ``cycle_free`` mode and composed from the
primitive ops (so it is itself differentiable) when the backward records ("needle" mode,
``create_graph``).
"""

from needle_c import FusedLSTM, FusedLSTMCell  # noqa: F401


def _inputs(name, args, bias_ih, bias_hh):
    if (bias_ih is None) != (bias_hh is None):
        raise ValueError(f"{name}: give both bias_ih and bias_hh, or neither")
    return args if bias_ih is None else args + (bias_ih, bias_hh)


def lstm_cell(x, h, c, W_ih, W_hh, bias_ih=None, bias_hh=None):
    """One LSTM step: x (bs, input_size), h and c (bs, hidden_size).

    Returns a TensorTuple (h', c'), each (bs, hidden_size):
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g), h' = sigmoid(o) * tanh(c'), where
    (i, f, g, o) = x @ W_ih + h @ W_hh (+ bias_ih + bias_hh) split in four."""
    return FusedLSTMCell()(*_inputs("lstm_cell", (x, h, c, W_ih, W_hh), bias_ih, bias_hh))


def lstm(X, h0, c0, W_ih, W_hh, bias_ih=None, bias_hh=None):
    """One LSTM layer over a sequence: X (seq_len, bs, input_size), h0 and c0
    (bs, hidden_size), the state before the first step.

    Returns a TensorTuple (Y, h_n, c_n): Y (seq_len, bs, hidden_size) the hidden state
    after every step, h_n and c_n (bs, hidden_size) the last step's states."""
    return FusedLSTM()(*_inputs("lstm", (X, h0, c0, W_ih, W_hh), bias_ih, bias_hh))
