"""Sequence modules (the course's hw4 ``nn_sequence``): RNNCell, RNN, LSTMCell, LSTM and
Embedding, with the course's attribute names, parameter shapes and NumPy-RNG draw order.

Recurrent weights are stored as (in, hidden) / (hidden, hidden) matrices, i.e. the
transposes of PyTorch's ``weight_ih`` / ``weight_hh``; sequences are sequence-first
(L, batch, features).
"""

from needle import init, ops
from needle._checks import check_count
from needle.autograd import Tensor

from .nn_basic import Module, Parameter


def _check_tensor(x, module, name="input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"{module}: {name} must be a Tensor, got {type(x).__name__}")


def _check_shape(x, expected, module, name):
    """ValueError unless x.shape == expected."""
    _check_tensor(x, module, name)
    if tuple(x.shape) != tuple(expected):
        raise ValueError(
            f"{module}: {name} must have shape {tuple(expected)}, got {tuple(x.shape)}"
        )


def _check_sizes(module, input_size, hidden_size):
    """A recurrent layer's sizes: ints >= 1 (a hidden size of 0 divides by zero in the
    initial bound, an input size of 0 makes a layer that reads nothing)."""
    check_count(f"{module} input_size", input_size)
    check_count(f"{module} hidden_size", hidden_size)


def _uniform(bound, *shape, device, dtype):
    return Parameter(init.rand(*shape, low=-bound, high=bound, device=device, dtype=dtype))


def _check_input_2d(X, input_size, module):
    _check_tensor(X, module)
    if len(X.shape) != 2 or X.shape[1] != input_size:
        raise ValueError(
            f"{module}: input must have shape (batch, {input_size}), got {tuple(X.shape)}"
        )


def _check_input_3d(X, input_size, module):
    _check_tensor(X, module)
    if len(X.shape) != 3 or X.shape[2] != input_size:
        raise ValueError(
            f"{module}: input must have shape (seq_len, batch, {input_size}), got {tuple(X.shape)}"
        )


def _split(x, axis):
    """ops.split as a Python list of tensors."""
    parts = ops.split(x, axis)
    return [parts[i] for i in range(len(parts))]


def _layers(state):
    """A (num_layers, bs, hidden) state as a list of (bs, hidden) tensors: one layer's
    is a reshape (a view), several are split."""
    if state.shape[0] == 1:
        return [state.reshape(tuple(state.shape[1:]))]
    return _split(state, 0)


def _stack_layers(states):
    """The inverse of _layers: (bs, hidden) tensors stacked to (num_layers, bs, hidden)."""
    if len(states) == 1:
        return states[0].reshape((1,) + tuple(states[0].shape))
    return ops.stack(states, 0)


class RNNCell(Module):
    """One Elman RNN step: h' = act(X @ W_ih + bias_ih + h @ W_hh + bias_hh).

    Parameters, in creation (RNG) order, all uniform in +-1/sqrt(hidden_size):
    ``W_ih`` (input_size, hidden_size), ``W_hh`` (hidden_size, hidden_size), and when
    ``bias`` is true ``bias_ih`` (hidden_size,), ``bias_hh`` (hidden_size,) (else None).
    ``nonlinearity`` is 'tanh' or 'relu'.
    """

    def __init__(
        self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype="float32"
    ):
        super().__init__()
        _check_sizes("RNNCell", input_size, hidden_size)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(
                f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}"
            )
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.nonlinearity = nonlinearity
        self.device = device
        self.dtype = dtype
        bound = 1.0 / hidden_size**0.5
        self.W_ih = _uniform(bound, input_size, hidden_size, device=device, dtype=dtype)
        self.W_hh = _uniform(bound, hidden_size, hidden_size, device=device, dtype=dtype)
        if bias:
            self.bias_ih = _uniform(bound, hidden_size, device=device, dtype=dtype)
            self.bias_hh = _uniform(bound, hidden_size, device=device, dtype=dtype)
        else:
            self.bias_ih = None
            self.bias_hh = None

    def forward(self, X, h=None):
        """X (bs, input_size), h (bs, hidden_size) or None (zeros).

        Returns the next hidden state, shape (bs, hidden_size)."""
        _check_input_2d(X, self.input_size, "RNNCell")
        bs = X.shape[0]
        shape = (bs, self.hidden_size)
        if h is None:
            # zeros (as the course does) so that W_hh always gets a gradient
            h = init.zeros(*shape, device=X.device, dtype=X.dtype)
        else:
            _check_shape(h, shape, "RNNCell", "hidden state h")
        out = X @ self.W_ih + h @ self.W_hh
        if self.bias_ih is not None:
            out = out + self.bias_ih.reshape((1, self.hidden_size)).broadcast_to(shape)
            out = out + self.bias_hh.reshape((1, self.hidden_size)).broadcast_to(shape)
        if self.nonlinearity == "tanh":
            return ops.tanh(out)
        return ops.relu(out)


class RNN(Module):
    """A multi-layer Elman RNN, sequence-first.

    ``rnn_cells`` is the list of RNNCell (layer 0: input_size -> hidden_size, then
    hidden_size -> hidden_size), created (and drawn) in layer order.
    """

    def __init__(
        self,
        input_size,
        hidden_size,
        num_layers=1,
        bias=True,
        nonlinearity="tanh",
        device=None,
        dtype="float32",
    ):
        super().__init__()
        _check_sizes("RNN", input_size, hidden_size)
        check_count("RNN num_layers", num_layers)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.device = device
        self.dtype = dtype
        self.rnn_cells = [
            RNNCell(
                input_size if k == 0 else hidden_size,
                hidden_size,
                bias=bias,
                nonlinearity=nonlinearity,
                device=device,
                dtype=dtype,
            )
            for k in range(num_layers)
        ]

    def forward(self, X, h0=None):
        """X (seq_len, bs, input_size); h0 (num_layers, bs, hidden_size) or None (zeros).

        Returns (output, h_n): output (seq_len, bs, hidden_size) holds the last layer's
        hidden state at every step; h_n (num_layers, bs, hidden_size) each layer's last
        hidden state."""
        _check_input_3d(X, self.input_size, "RNN")
        bs = X.shape[1]
        if h0 is None:
            h0 = [None] * self.num_layers
        else:
            _check_shape(h0, (self.num_layers, bs, self.hidden_size), "RNN", "h0")
            h0 = _split(h0, 0)
        inputs = _split(X, 0)
        h_n = []
        for layer, cell in enumerate(self.rnn_cells):
            h = h0[layer]
            for t, x_t in enumerate(inputs):
                h = cell(x_t, h)
                inputs[t] = h
            h_n.append(h)
        return ops.stack(inputs, 0), ops.stack(h_n, 0)


class LSTMCell(Module):
    """One LSTM step with the PyTorch gate layout i, f, g, o, as one fused op
    (``ops.lstm_cell``: the two GEMMs, then the gates in one kernel each way).

    Parameters, in creation (RNG) order, all uniform in +-1/sqrt(hidden_size):
    ``W_ih`` (input_size, 4*hidden_size), ``W_hh`` (hidden_size, 4*hidden_size), and when
    ``bias`` is true ``bias_ih`` (4*hidden_size,), ``bias_hh`` (4*hidden_size,) (else None).
    """

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype="float32"):
        super().__init__()
        _check_sizes("LSTMCell", input_size, hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.device = device
        self.dtype = dtype
        bound = 1.0 / hidden_size**0.5
        h4 = 4 * hidden_size
        self.W_ih = _uniform(bound, input_size, h4, device=device, dtype=dtype)
        self.W_hh = _uniform(bound, hidden_size, h4, device=device, dtype=dtype)
        if bias:
            self.bias_ih = _uniform(bound, h4, device=device, dtype=dtype)
            self.bias_hh = _uniform(bound, h4, device=device, dtype=dtype)
        else:
            self.bias_ih = None
            self.bias_hh = None

    def forward(self, X, h=None):
        """X (bs, input_size); h a tuple (h0, c0) of (bs, hidden_size) tensors, or None
        (zeros).

        Returns (h', c'), each of shape (bs, hidden_size):
        c' = f * c0 + i * g, h' = o * tanh(c')."""
        _check_input_2d(X, self.input_size, "LSTMCell")
        bs = X.shape[0]
        hidden = self.hidden_size
        if h is None:
            # zeros (as the course does) so that W_hh always gets a gradient
            h0 = init.zeros(bs, hidden, device=X.device, dtype=X.dtype)
            c0 = init.zeros(bs, hidden, device=X.device, dtype=X.dtype)
        else:
            if not isinstance(h, (tuple, list)) or len(h) != 2:
                raise TypeError("LSTMCell: h must be a tuple (h0, c0) or None")
            h0, c0 = h
            _check_shape(h0, (bs, hidden), "LSTMCell", "h0")
            _check_shape(c0, (bs, hidden), "LSTMCell", "c0")
        # One fused op: the two GEMMs, then the gates in one kernel (and in one kernel
        # backward); the values are the course's unfused formulas'.
        out = ops.lstm_cell(X, h0, c0, self.W_ih, self.W_hh, self.bias_ih, self.bias_hh)
        return out[0], out[1]


class LSTM(Module):
    """A multi-layer LSTM, sequence-first.

    ``lstm_cells`` is the list of LSTMCell (layer 0: input_size -> hidden_size, then
    hidden_size -> hidden_size), created (and drawn) in layer order. Each layer runs as
    one fused op over the sequence (``ops.lstm``) on its cell's parameters, with the
    cell's formulas: it does not call the cells' ``forward`` step by step.
    """

    def __init__(
        self, input_size, hidden_size, num_layers=1, bias=True, device=None, dtype="float32"
    ):
        super().__init__()
        _check_sizes("LSTM", input_size, hidden_size)
        check_count("LSTM num_layers", num_layers)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.device = device
        self.dtype = dtype
        self.lstm_cells = [
            LSTMCell(
                input_size if k == 0 else hidden_size,
                hidden_size,
                bias=bias,
                device=device,
                dtype=dtype,
            )
            for k in range(num_layers)
        ]

    def forward(self, X, h=None):
        """X (seq_len, bs, input_size); h a tuple (h0, c0) of
        (num_layers, bs, hidden_size) tensors, or None (zeros).

        Returns (output, (h_n, c_n)): output (seq_len, bs, hidden_size) is the last
        layer's hidden state at every step; h_n and c_n (num_layers, bs, hidden_size)
        each layer's last hidden and cell state."""
        _check_input_3d(X, self.input_size, "LSTM")
        bs = X.shape[1]
        hidden = self.hidden_size
        if h is None:
            # zeros (as the course does) so that W_hh always gets a gradient
            h0 = [init.zeros(bs, hidden, device=X.device, dtype=X.dtype)]
            c0 = [init.zeros(bs, hidden, device=X.device, dtype=X.dtype)]
            h0, c0 = h0 * self.num_layers, c0 * self.num_layers
        else:
            if not isinstance(h, (tuple, list)) or len(h) != 2:
                raise TypeError("LSTM: h must be a tuple (h0, c0) or None")
            shape = (self.num_layers, bs, hidden)
            _check_shape(h[0], shape, "LSTM", "h0")
            _check_shape(h[1], shape, "LSTM", "c0")
            h0, c0 = _layers(h[0]), _layers(h[1])
        # Each layer is one fused op over the whole sequence (the cells' parameters, the
        # cells' formulas): one GEMM for every step's input projection, then per step
        # one GEMM and one fused kernel, each way.
        output = X
        h_n, c_n = [], []
        for layer, cell in enumerate(self.lstm_cells):
            out = ops.lstm(
                output, h0[layer], c0[layer], cell.W_ih, cell.W_hh, cell.bias_ih, cell.bias_hh
            )
            output = out[0]
            h_n.append(out[1])
            c_n.append(out[2])
        return output, (_stack_layers(h_n), _stack_layers(c_n))


class Embedding(Module):
    """A lookup table: ``weight`` (num_embeddings, embedding_dim) drawn N(0, 1) by randn."""

    def __init__(self, num_embeddings, embedding_dim, device=None, dtype="float32"):
        super().__init__()
        check_count("Embedding num_embeddings", num_embeddings)
        check_count("Embedding embedding_dim", embedding_dim)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.device = device
        self.dtype = dtype
        self.weight = Parameter(
            init.randn(num_embeddings, embedding_dim, device=device, dtype=dtype)
        )

    def forward(self, x):
        """x (seq_len, bs) of integer-valued indices (any shape works).

        Returns x.shape + (embedding_dim,), i.e. (seq_len, bs, embedding_dim): the rows
        of ``weight`` (the same numbers as the course's one_hot(x) @ weight, without the
        one-hot matrix). An index outside [0, num_embeddings) raises from the gather op."""
        _check_tensor(x, "Embedding")
        return ops.gather_rows(self.weight, x)
