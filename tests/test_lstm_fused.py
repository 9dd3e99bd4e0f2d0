"""Tests for the fused LSTM ops, ``ops.lstm_cell`` (FusedLSTMCell, one step) and ``ops.lstm``
(FusedLSTM, one layer over a sequence), which nn.LSTMCell and nn.LSTM run on.

Forward values against NumPy; gradients against float64 finite differences
(tests/gradcheck.py) in both graph modes, whose values must agree (the fused backward
kernel in "cycle_free", the gradient composed from primitive ops when the backward records);
the same values as the course's unfused composition of primitive ops, first and second
derivatives; nn.LSTM against torch.nn.LSTM; bad inputs; a node whose saved values were
replaced; and, on CUDA, the exact GPU work of a layer's forward and backward (launches,
BLAS calls, no host synchronisation).
"""

import numpy as np
import pytest

import needle as ndl
from needle import nn, ops
from needle.autograd import graph_mode

from devices import DEVICES
from gradcheck import MODES, check_op, numerical_gradients, run_needle

# --------------------------------------------------------------------------- references


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _cell_ref(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    z = x @ w_ih + h @ w_hh
    if b_ih is not None:
        z = z + b_ih + b_hh
    i, f, g, o = np.split(z, 4, axis=1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c), c


def _layer_ref(x, h, c, *params):
    ys = []
    for x_t in x:
        h, c = _cell_ref(x_t, h, c, *params)
        ys.append(h)
    return np.stack(ys), h, c


def _unfused_cell(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    """The course's LSTM cell from primitive ops (what nn.LSTMCell computed before)."""
    bs, hidden = h.shape
    shape = (bs, 4 * hidden)
    gates = x @ w_ih + h @ w_hh
    if b_ih is not None:
        gates = gates + b_ih.reshape((1, 4 * hidden)).broadcast_to(shape)
        gates = gates + b_hh.reshape((1, 4 * hidden)).broadcast_to(shape)
    parts = ops.split(gates.reshape((bs, 4, hidden)), 1)
    i, f, g, o = (parts[k] for k in range(4))
    i, f, g, o = ops.sigmoid(i), ops.sigmoid(f), ops.tanh(g), ops.sigmoid(o)
    c_out = f * c + i * g
    return o * ops.tanh(c_out), c_out


def _unfused_layer(x, h, c, *params):
    parts = ops.split(x, 0)
    ys = []
    for t in range(x.shape[0]):
        h, c = _unfused_cell(parts[t], h, c, *params)
        ys.append(h)
    return ops.stack(ys, 0), h, c


def _fused_cell(*tensors):
    return ops.lstm_cell(*tensors)


def _fused_layer(*tensors):
    return ops.lstm(*tensors)


def _as_tuple(fn):
    """fn's tuple of Tensors as a TensorTuple (what gradcheck.run_needle takes)."""
    return lambda *tensors: ops.make_tuple(*fn(*tensors))


def _arrays(seed, T, bs, n_in, hidden, bias, scale=1.0):
    """x (T, bs, n_in) (or (bs, n_in) for T None), h, c, W_ih, W_hh[, b_ih, b_hh]."""
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(hidden)
    x_shape = (bs, n_in) if T is None else (T, bs, n_in)
    out = [
        rng.normal(size=x_shape) * scale,
        rng.normal(size=(bs, hidden)) * 0.5,
        rng.normal(size=(bs, hidden)),
        rng.uniform(-bound, bound, size=(n_in, 4 * hidden)) * scale,
        rng.uniform(-bound, bound, size=(hidden, 4 * hidden)) * scale,
    ]
    if bias:
        out += [rng.uniform(-bound, bound, size=(4 * hidden,)) for _ in range(2)]
    return [a.astype(np.float32) for a in out]


# --------------------------------------------------------------- the cell: finite differences


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("bs, hidden", [(1, 1), (3, 5), (2, 33)])
def test_cell_against_finite_differences(device, bias, bs, hidden):
    # check_op: forward against NumPy, gradients of every input against float64 finite
    # differences under both graph modes, and the two modes' gradients equal
    arrays = _arrays(1, None, bs, 3, hidden, bias)
    results = check_op(_fused_cell, *arrays, device=device, reference=_cell_ref)
    assert set(results) == set(MODES)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bias, hidden", [(True, 7), (False, 7), (True, 70)])
def test_cell_matches_the_unfused_ops(device, mode, bias, hidden):
    # The same numbers as the course's composition of primitive ops, forward and backward
    # (hidden 70: the CPU kernel's rows run in chunks of 64 columns).
    arrays = _arrays(2, None, 4, 6, hidden, bias)
    rng = np.random.default_rng(3)
    weights = [rng.uniform(0.5, 1.5, size=(4, hidden)) for _ in range(2)]
    wrt = tuple(range(len(arrays)))
    fused = run_needle(_fused_cell, arrays, device, weights, wrt, mode)
    unfused = run_needle(_as_tuple(_unfused_cell), arrays, device, weights, wrt, mode)
    for a, b in zip(fused[0] + fused[1], unfused[0] + unfused[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# -------------------------------------------------------------- the layer: finite differences


def _check_layer(device, arrays, weights_seed=4, cross_mode_rtol=1e-5):
    """The layer op under both modes against NumPy and finite differences; returns the
    gradients per mode."""
    wrt = tuple(range(len(arrays)))
    refs = _layer_ref(*[a.astype(np.float64) for a in arrays])
    rng = np.random.default_rng(weights_seed)
    weights = [rng.uniform(0.5, 1.5, size=r.shape).astype(np.float32) for r in refs]
    num = numerical_gradients(_layer_ref, arrays, weights, wrt, 1e-3)
    grads = {}
    for mode in MODES:
        values, grads[mode] = run_needle(
            _fused_layer, arrays, device, weights, wrt, mode, ref_shapes=[r.shape for r in refs]
        )
        for v, r in zip(values, refs):
            np.testing.assert_allclose(v, r, rtol=1e-5, atol=1e-5)
        for i, (g, n) in enumerate(zip(grads[mode], num)):
            np.testing.assert_allclose(g, n, rtol=1e-3, atol=1e-3, err_msg=f"input {i}, {mode}")
    for a, b in zip(grads[MODES[0]], grads[MODES[1]]):
        np.testing.assert_allclose(a, b, rtol=cross_mode_rtol, atol=1e-6)
    return grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("T, bs, hidden", [(1, 2, 3), (4, 1, 5), (3, 3, 2)])
def test_layer_against_finite_differences(device, bias, T, bs, hidden):
    _check_layer(device, _arrays(5, T, bs, 4, hidden, bias))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_layer_matches_the_unfused_cells(device, mode):
    # One fused op over the sequence against a loop of the course's unfused cells.
    arrays = _arrays(6, 5, 3, 4, 9, True)
    rng = np.random.default_rng(7)
    weights = [rng.uniform(0.5, 1.5, size=s) for s in [(5, 3, 9), (3, 9), (3, 9)]]
    wrt = tuple(range(len(arrays)))
    fused = run_needle(_fused_layer, arrays, device, weights, wrt, mode)
    unfused = run_needle(_as_tuple(_unfused_layer), arrays, device, weights, wrt, mode)
    for a, b in zip(fused[0] + fused[1], unfused[0] + unfused[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_gradient_with_unused_outputs(device):
    # Only Y reaches the loss (as in the PTB model): h_n's and c_n's gradients are zeros;
    # only h_n: Y's are.
    arrays = _arrays(8, 3, 2, 4, 3, True)
    rng = np.random.default_rng(9)
    w = rng.uniform(0.5, 1.5, size=(3, 2, 3)).astype(np.float32)
    for mode in MODES:
        with graph_mode(mode):
            ts = [ndl.Tensor(a, device=device) for a in arrays]
            (ops.lstm(*ts)[0] * ndl.Tensor(w, device=device)).sum().backward()
            got = [t.grad.numpy() for t in ts]
            ts = [ndl.Tensor(a, device=device) for a in arrays]
            ops.lstm(*ts)[1].sum().backward()
            got_h = [t.grad.numpy() for t in ts]
        zeros = np.zeros((2, 3), np.float32)
        num = numerical_gradients(_layer_ref, arrays, [w, zeros, zeros], range(7), 1e-3)
        num_h = numerical_gradients(
            _layer_ref, arrays, [np.zeros_like(w), zeros + 1, zeros], range(7), 1e-3
        )
        for g, n in zip(got + got_h, num + num_h):
            np.testing.assert_allclose(g, n, rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------- second derivatives


def _second_order(fn, arrays, device, mode):
    """Gradients of sum(x.grad * v) where x.grad is recorded (create_graph in cycle_free)."""
    rng = np.random.default_rng(10)
    with graph_mode(mode):
        ts = [ndl.Tensor(a, device=device) for a in arrays]
        outs = fn(*ts)
        loss = None
        for o in [outs[k] for k in range(len(outs))]:
            w = ndl.Tensor(rng.uniform(0.5, 1.5, size=o.shape), device=device)
            term = (o * w).sum()
            loss = term if loss is None else loss + term
        if mode == "cycle_free":
            loss.backward(create_graph=True)
        else:
            loss.backward()
        first = [t.grad for t in ts]
        assert all(g.op is not None for g in first[:1]), "the gradient must be recorded"
        v = ndl.Tensor(rng.uniform(-1, 1, size=arrays[0].shape), device=device)
        (first[0] * v).sum().backward()
        return [g.numpy() for g in first], [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layer", [False, True])
def test_second_derivatives_match_the_unfused_ops(device, mode, layer):
    arrays = _arrays(11, 3 if layer else None, 2, 3, 4, True)
    fused, unfused = (_fused_layer, _unfused_layer) if layer else (_fused_cell, _unfused_cell)
    a_first, a_second = _second_order(fused, arrays, device, mode)
    b_first, b_second = _second_order(_as_tuple(unfused), arrays, device, mode)
    for a, b in zip(a_first + a_second, b_first + b_second):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------- the modules


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_lstm_module_against_torch(device, mode):
    # Hidden size 33 (not a multiple of 4 or 32), batch 1, two layers, given state; the
    # gradients of the input, the state and every parameter.
    torch = pytest.importorskip("torch")
    np.random.seed(12)
    T, bs, n_in, hidden, layers = 6, 1, 5, 33, 2
    lstm = nn.LSTM(n_in, hidden, layers, device=device)
    ref = torch.nn.LSTM(n_in, hidden, layers)
    with torch.no_grad():
        for k, cell in enumerate(lstm.lstm_cells):
            getattr(ref, f"weight_ih_l{k}").copy_(torch.tensor(cell.W_ih.numpy().T))
            getattr(ref, f"weight_hh_l{k}").copy_(torch.tensor(cell.W_hh.numpy().T))
            getattr(ref, f"bias_ih_l{k}").copy_(torch.tensor(cell.bias_ih.numpy()))
            getattr(ref, f"bias_hh_l{k}").copy_(torch.tensor(cell.bias_hh.numpy()))
    rng = np.random.default_rng(13)
    arrays = [
        rng.normal(size=(T, bs, n_in)).astype(np.float32),
        rng.normal(size=(layers, bs, hidden)).astype(np.float32),
        rng.normal(size=(layers, bs, hidden)).astype(np.float32),
    ]
    with graph_mode(mode):
        nd_in = [ndl.Tensor(a, device=device) for a in arrays]
        out, (h_n, c_n) = lstm(nd_in[0], (nd_in[1], nd_in[2]))
        th_in = [torch.tensor(a, requires_grad=True) for a in arrays]
        th_out, (th_h, th_c) = ref(th_in[0], (th_in[1], th_in[2]))
        nd_loss, th_loss = None, 0
        for o, r in zip((out, h_n, c_n), (th_out, th_h, th_c)):
            assert tuple(o.shape) == tuple(r.shape)
            np.testing.assert_allclose(o.numpy(), r.detach().numpy(), rtol=1e-5, atol=1e-5)
            w = rng.uniform(0.5, 1.5, size=tuple(r.shape)).astype(np.float32)
            term = (o * ndl.Tensor(w, device=device)).sum()
            nd_loss = term if nd_loss is None else nd_loss + term
            th_loss = th_loss + (r * torch.tensor(w)).sum()
        nd_loss.backward()
        th_loss.backward()
    for a, b in zip(nd_in, th_in):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5)
    for k, cell in enumerate(lstm.lstm_cells):
        for mine, theirs, transpose in [
            (cell.W_ih, f"weight_ih_l{k}", True),
            (cell.W_hh, f"weight_hh_l{k}", True),
            (cell.bias_ih, f"bias_ih_l{k}", False),
            (cell.bias_hh, f"bias_hh_l{k}", False),
        ]:
            g = getattr(ref, theirs).grad.numpy()
            np.testing.assert_allclose(
                mine.grad.numpy(), g.T if transpose else g, rtol=1e-4, atol=1e-5
            )


@pytest.mark.parametrize("device", DEVICES)
def test_modules_run_one_fused_op(device):
    # nn.LSTMCell is one FusedLSTMCell node per step, nn.LSTM one FusedLSTM node per layer
    # (the outputs are its items); parameters keep the course's layout.
    cell = nn.LSTMCell(3, 5, device=device)
    h, c = cell(ndl.Tensor(np.ones((2, 3)), device=device))
    assert type(h.op).__name__ == type(c.op).__name__ == "TupleGetItem"
    assert type(h.inputs[0].op).__name__ == "FusedLSTMCell"
    assert h.inputs[0] is c.inputs[0]
    lstm = nn.LSTM(3, 5, num_layers=2, device=device)
    out, (h_n, c_n) = lstm(ndl.Tensor(np.ones((4, 2, 3)), device=device))
    assert out.shape == (4, 2, 5) and h_n.shape == c_n.shape == (2, 2, 5)
    assert type(out.inputs[0].op).__name__ == "FusedLSTM"
    assert type(out.inputs[0].inputs[0].inputs[0].op).__name__ == "FusedLSTM"
    assert [p.shape for p in lstm.lstm_cells[1].parameters()] == [(5, 20), (5, 20), (20,), (20,)]


# -------------------------------------------------------- saved values and bad inputs


@pytest.mark.parametrize("device", DEVICES)
def test_backward_recomputes_when_the_saved_values_are_gone(device):
    # The fused backward reads what the forward left in Y's storage; a node whose data
    # was replaced (same values, fresh arrays) is recomputed, with the same gradients.
    arrays = _arrays(14, 3, 2, 4, 3, True)
    grads = []
    for replace in (False, True):
        ts = [ndl.Tensor(a, device=device) for a in arrays]
        node = ops.lstm(*ts)
        if replace:
            node.cached_data = tuple(
                ndl.NDArray(a.numpy(), device=device) for a in node.cached_data
            )
        (node[0].sum() + node[2].sum()).backward()
        grads.append([t.grad.numpy() for t in ts])
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)


def _bad_cell_calls(device):
    def t(*shape):
        return ndl.Tensor(np.zeros(shape, np.float32), device=device)

    x, h, c, w_ih, w_hh, b = t(2, 3), t(2, 4), t(2, 4), t(3, 16), t(4, 16), t(16)
    return [
        (ValueError, "3-D|2-D", lambda: ops.lstm_cell(t(1, 2, 3), h, c, w_ih, w_hh)),
        (ValueError, "w_ih", lambda: ops.lstm_cell(x, h, c, t(3, 15), w_hh)),
        (ValueError, "w_ih", lambda: ops.lstm_cell(x, h, c, t(5, 16), w_hh)),
        (ValueError, "w_hh", lambda: ops.lstm_cell(x, h, c, w_ih, t(4, 12))),
        (ValueError, "h0", lambda: ops.lstm_cell(x, t(3, 4), c, w_ih, w_hh)),
        (ValueError, "c0", lambda: ops.lstm_cell(x, h, t(2, 5), w_ih, w_hh)),
        (ValueError, "b_hh", lambda: ops.lstm_cell(x, h, c, w_ih, w_hh, b, t(15))),
        (ValueError, "both", lambda: ops.lstm_cell(x, h, c, w_ih, w_hh, b, None)),
        (TypeError, "5 inputs", lambda: ops.FusedLSTMCell()(x, h, c, w_ih)),
        (TypeError, "5 inputs", lambda: ops.FusedLSTMCell()(x, h, c, w_ih, w_hh, b)),
        (ValueError, "3-D", lambda: ops.lstm(x, h, c, w_ih, w_hh)),
        (ValueError, "at least 1", lambda: ops.lstm(t(0, 2, 3), h, c, w_ih, w_hh)),
        (TypeError, "Tensor", lambda: ops.lstm(np.zeros((1, 2, 3)), h, c, w_ih, w_hh)),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise_and_leave_the_process_working(device):
    for exc, match, call in _bad_cell_calls(device):
        with pytest.raises(exc, match=match):
            call()
    arrays = _arrays(15, None, 2, 3, 4, True)
    h, c = _fused_cell(*[ndl.Tensor(a, device=device) for a in arrays])
    np.testing.assert_allclose(h.numpy(), _cell_ref(*arrays)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_devices_raise(device):
    other = ndl.cpu_numpy() if device == ndl.cpu() else ndl.cpu()
    arrays = _arrays(16, 2, 2, 3, 4, True)
    for k in range(len(arrays)):
        ts = [ndl.Tensor(a, device=other if i == k else device) for i, a in enumerate(arrays)]
        with pytest.raises(ndl.DeviceError, match="device"):
            ops.lstm(*ts)
    ts = [ndl.Tensor(a, device=device) for a in arrays]
    np.testing.assert_allclose(
        ops.lstm(*ts)[0].numpy(), _layer_ref(*arrays)[0], rtol=1e-5, atol=1e-6
    )


# ----------------------------------------------------------------- the GPU work, counted


def _counted(device, fn):
    ndl.cuda.reset_work_counters(device)
    fn()
    work = ndl.cuda.work_counters(device)
    return {k: work[k] for k in ("kernel_launches", "memsets", "d2d_copies", "blas_calls")}, {
        k: work[k] for k in ("host_syncs", "device_mallocs", "d2h_copies")
    }


CUDA_ONLY = [p for p in DEVICES if p.id == "cuda"]


@pytest.mark.parametrize("device", CUDA_ONLY)
@pytest.mark.parametrize("T", [1, 7])
def test_layer_gpu_work_is_one_kernel_and_one_gemm_per_step(device, T):
    # One layer, the state given (as the PTB model carries it), bias: the forward is one
    # GEMM for the input projection, one copy of h0 (so that h_0..h_{T-1} are one matrix
    # for W_hh's gradient; none for T = 1), and per step one GEMM (h @ W_hh) and one fused
    # kernel. The backward, given Y's gradient: per step one fused kernel and one GEMM
    # (h_{t-1}'s gradient), then one GEMM each for X's, W_ih's and W_hh's gradients, and
    # one column sum for both biases (its output zeroed first: one memset; then copied
    # into the second bias's row: one device copy); the unused h_n and c_n get zero
    # gradients from TupleGetItem (one memset each). No host syncs.
    arrays = _arrays(17, T, 4, 3, 5, True)
    ts = [ndl.Tensor(a, device=device, requires_grad=i not in (1, 2)) for i, a in enumerate(arrays)]
    dy = ndl.Tensor(np.ones((T, 4, 5), np.float32), device=device)
    ops.lstm(*ts)[0].backward(dy)  # warm-up: the caching allocator's first mallocs
    for t in ts:  # the counted backward writes .grad afresh instead of adding to it
        t.grad = None
    box = {}

    def forward():
        box["y"] = ops.lstm(*ts)[0]

    work, other = _counted(device, forward)
    assert work == dict(kernel_launches=T, memsets=0, d2d_copies=int(T > 1), blas_calls=1 + T)
    assert other == dict(host_syncs=0, device_mallocs=0, d2h_copies=0)
    work, other = _counted(device, lambda: box["y"].backward(dy))
    assert work == dict(kernel_launches=T + 1, memsets=3, d2d_copies=1, blas_calls=T + 3)
    assert other == dict(host_syncs=0, device_mallocs=0, d2h_copies=0)
    fused = {k: v for k, v in ndl.cuda.launches_by_kernel(device).items() if "lstm" in k}
    assert list(fused.values()) == [T] and next(iter(fused)).startswith("lstm_step_grad_kernel")


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_cell_gpu_work(device):
    # nn.LSTMCell with a given state: two GEMMs and one fused kernel forward.
    cell = nn.LSTMCell(3, 6, device=device)
    x, h, c = (ndl.Tensor(np.ones(s, np.float32), device=device) for s in [(2, 3), (2, 6), (2, 6)])
    cell(x, (h, c))
    work, other = _counted(device, lambda: cell(x, (h, c)))
    assert work == dict(kernel_launches=1, memsets=0, d2d_copies=0, blas_calls=2)
    assert other == dict(host_syncs=0, device_mallocs=0, d2h_copies=0)
