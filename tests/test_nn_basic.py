"""Tests for the basic modules of ``needle.nn`` (nn_basic.py).

Each module is checked against a NumPy reference written here: forward values,
gradients by central finite differences (float64, on the NumPy reference) for the
small layers, the course's parameter initialisation (NumPy RNG draw order), the
Dropout masks, Module.parameters() order and train()/eval() recursion, and the
errors raised on bad input shapes.
"""

import numpy as np
import pytest

import needle as ndl
from needle import nn

from devices import DEVICES
from nn_check import _ln_ref, _t, _uniform_draw, check_module

# --------------------------------------------------------------------------- Linear


def test_linear_course_values():
    np.random.seed(1337)
    layer = nn.Linear(7, 4)
    assert layer.weight.shape == (7, 4)
    assert layer.bias.shape == (1, 4)
    np.testing.assert_allclose(
        layer.weight.numpy()[0], [-0.4406, -0.6320, -0.4108, -0.0753], atol=1e-4
    )
    np.testing.assert_allclose(layer.bias.numpy()[0], [0.0776, 0.8141, -0.7710, 1.1203], atol=1e-4)


def test_linear_draw_order():
    np.random.seed(3)
    layer = nn.Linear(5, 3)
    np.random.seed(3)
    bw = np.sqrt(6 / 5)
    w = _uniform_draw((5, 3), -bw, bw)
    bb = np.sqrt(6 / 3)
    b = _uniform_draw((3, 1), -bb, bb).T
    np.testing.assert_allclose(layer.weight.numpy(), w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(layer.bias.numpy(), b, rtol=1e-6, atol=1e-7)
    assert isinstance(layer.weight, nn.Parameter) and layer.weight.requires_grad
    assert layer.parameters()[0] is layer.weight and layer.parameters()[1] is layer.bias


@pytest.mark.parametrize("device", DEVICES)
def test_linear_forward_backward(device):
    np.random.seed(0)
    layer = nn.Linear(4, 3, device=device)
    x = np.random.randn(5, 4)
    check_module(layer, [x], lambda x, w, b: x @ w + b, device)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_nd_input_and_no_bias(device):
    np.random.seed(0)
    layer = nn.Linear(4, 3, bias=False, device=device)
    assert layer.bias is None and len(layer.parameters()) == 1
    x = np.random.randn(2, 3, 4)
    check_module(layer, [x], lambda x, w: x @ w, device)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_bad_input(device):
    layer = nn.Linear(4, 3, device=device)
    with pytest.raises(ValueError, match="last dimension 4"):
        layer(_t(np.ones((2, 5)), device))
    with pytest.raises(TypeError):
        layer(np.ones((2, 4), dtype=np.float32))


# --------------------------------------------------------------------------- simple modules


@pytest.mark.parametrize("device", DEVICES)
def test_flatten(device):
    x = np.random.randn(2, 3, 4, 5)
    check_module(nn.Flatten(), [x], lambda x: x.reshape(2, 60), device, grads=False)
    y = nn.Flatten()(_t(np.ones((3, 2)), device))
    assert y.shape == (3, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "name, ref",
    [
        ("ReLU", lambda x: np.maximum(x, 0)),
        ("Tanh", np.tanh),
        ("Sigmoid", lambda x: 1 / (1 + np.exp(-x))),
    ],
)
def test_activations(device, name, ref):
    np.random.seed(1)
    x = np.random.randn(3, 4)
    x[np.abs(x) < 1e-2] = 0.5  # keep ReLU away from its kink for finite differences
    check_module(getattr(nn, name)(), [x], ref, device)


@pytest.mark.parametrize("device", DEVICES)
def test_identity_and_residual(device):
    np.random.seed(2)
    x = np.random.randn(3, 4)
    check_module(nn.Identity(), [x], lambda x: x, device, grads=False)
    lin = nn.Linear(4, 4, device=device)
    check_module(nn.Residual(lin), [x], lambda x, w, b: x + x @ w + b, device)


@pytest.mark.parametrize("device", DEVICES)
def test_sequential(device):
    np.random.seed(3)
    model = nn.Sequential(nn.Linear(4, 5, device=device), nn.ReLU(), nn.Linear(5, 2, device=device))
    assert isinstance(model.modules, tuple) and len(model.modules) == 3
    x = np.random.randn(6, 4)

    def ref(x, w1, b1, w2, b2):
        return np.maximum(x @ w1 + b1, 0) @ w2 + b2

    check_module(model, [x], ref, device, grads=False)
    check_module(nn.Sequential(), [x], lambda x: x, device, grads=False)


# --------------------------------------------------------------------------- SoftmaxLoss


def _logsumexp(z):
    m = z.max(axis=1, keepdims=True)
    return (np.log(np.exp(z - m).sum(axis=1, keepdims=True)) + m)[:, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_loss(device):
    np.random.seed(4)
    logits = np.random.randn(6, 5) * 3
    y = np.array([0, 4, 2, 2, 1, 3])
    expected = np.mean(_logsumexp(logits) - logits[np.arange(6), y])
    z = _t(logits, device)
    loss = nn.SoftmaxLoss()(z, _t(y, device, requires_grad=False))
    assert loss.numpy().size == 1
    np.testing.assert_allclose(float(loss.numpy().reshape(-1)[0]), expected, rtol=1e-5)
    loss.backward()
    soft = np.exp(logits - _logsumexp(logits)[:, None])
    onehot = np.eye(5)[y]
    np.testing.assert_allclose(z.grad.numpy(), (soft - onehot) / 6, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_loss_bad_shapes(device):
    z = _t(np.zeros((4, 3)), device)
    with pytest.raises(ValueError):
        nn.SoftmaxLoss()(z, _t(np.zeros(3), device))
    with pytest.raises(ValueError):
        nn.SoftmaxLoss()(_t(np.zeros((4, 3, 2)), device), _t(np.zeros(4), device))


# --------------------------------------------------------------------------- BatchNorm


def _bn_ref(x, w, b, eps=1e-5):
    mean = x.mean(axis=0)
    var = x.var(axis=0)
    return (x - mean) / np.sqrt(var + eps) * w + b


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm1d_train_forward_backward(device):
    np.random.seed(5)
    bn = nn.BatchNorm1d(3, device=device)
    bn.weight.data = _t(np.random.randn(3), device)
    bn.bias.data = _t(np.random.randn(3), device)
    x = np.random.randn(5, 3) * 2 + 1
    check_module(bn, [x], _bn_ref, device)


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm1d_running_stats_and_eval(device):
    np.random.seed(6)
    bn = nn.BatchNorm1d(4, momentum=0.2, device=device)
    assert len(bn.parameters()) == 2  # the running stats are not parameters
    rm, rv = np.zeros(4), np.ones(4)
    for _ in range(3):
        x = np.random.randn(8, 4) * 3 + 2
        bn(_t(x, device))
        rm = 0.8 * rm + 0.2 * x.mean(axis=0)
        rv = 0.8 * rv + 0.2 * x.var(axis=0)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-5, atol=1e-5)
    assert not bn.running_mean.requires_grad
    bn.eval()
    x = np.random.randn(3, 4)
    y = bn(_t(x, device)).numpy()
    np.testing.assert_allclose(y, (x - rm) / np.sqrt(rv + 1e-5), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm2d(device):
    np.random.seed(7)
    bn = nn.BatchNorm2d(3, device=device)
    bn.weight.data = _t(np.random.randn(3), device)
    bn.bias.data = _t(np.random.randn(3), device)
    x = np.random.randn(2, 3, 2, 3)

    def ref(x, w, b):
        mean = x.mean(axis=(0, 2, 3), keepdims=True)
        var = x.var(axis=(0, 2, 3), keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)

    check_module(bn, [x], ref, device, grads=False)
    np.testing.assert_allclose(
        bn.running_mean.numpy(), 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        bn.running_var.numpy(), 0.9 + 0.1 * x.var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6
    )
    bn.eval()
    rm = bn.running_mean.numpy().reshape(1, 3, 1, 1)
    rv = bn.running_var.numpy().reshape(1, 3, 1, 1)
    w = bn.weight.numpy().reshape(1, 3, 1, 1)
    b = bn.bias.numpy().reshape(1, 3, 1, 1)
    np.testing.assert_allclose(
        bn(_t(x, device)).numpy(), (x - rm) / np.sqrt(rv + 1e-5) * w + b, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm_bad_shapes(device):
    with pytest.raises(ValueError):
        nn.BatchNorm1d(3, device=device)(_t(np.zeros((4, 2)), device))
    with pytest.raises(ValueError):
        nn.BatchNorm2d(3, device=device)(_t(np.zeros((4, 3)), device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "make, shape",
    [
        (nn.BatchNorm1d, (0, 3)),
        (nn.BatchNorm2d, (0, 3, 2, 2)),
        (nn.BatchNorm2d, (2, 3, 0, 2)),
        (nn.BatchNorm2d, (2, 3, 2, 0)),
    ],
)
def test_batchnorm_empty_batch_in_training(device, make, shape):
    # An empty batch has no mean: it must not turn the running statistics into NaN.
    np.random.seed(8)
    bn = make(3, device=device)
    bn(_t(np.random.randn(4, 3, 2, 2) if make is nn.BatchNorm2d else np.random.randn(4, 3), device))
    mean, var = bn.running_mean.numpy().copy(), bn.running_var.numpy().copy()
    with pytest.raises(ValueError, match=rf"{make.__name__}: an empty batch .*{shape[0]}, 3"):
        bn(_t(np.zeros(shape), device))
    np.testing.assert_array_equal(bn.running_mean.numpy(), mean)
    np.testing.assert_array_equal(bn.running_var.numpy(), var)
    bn.eval()  # no statistics are computed: an empty output, as PyTorch gives
    assert bn(_t(np.zeros(shape), device)).shape == shape
    np.testing.assert_array_equal(bn.running_mean.numpy(), mean)


# --------------------------------------------------------------------------- LayerNorm1d


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5)])
def test_layernorm1d(device, shape):
    np.random.seed(8)
    ln = nn.LayerNorm1d(5, device=device)
    assert [p is q for p, q in zip(ln.parameters(), (ln.w, ln.b))] == [True, True]
    np.testing.assert_array_equal(ln.w.numpy(), np.ones(5))
    np.testing.assert_array_equal(ln.b.numpy(), np.zeros(5))
    ln.w.data = _t(np.random.randn(5), device)
    ln.b.data = _t(np.random.randn(5), device)
    x = np.random.randn(*shape) * 2 + 1
    check_module(ln, [x], _ln_ref, device, grads=(len(shape) == 2))
    if len(shape) == 3:
        check_module(ln, [x], _ln_ref, device, grads=False)


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm1d_bad_shape(device):
    with pytest.raises(ValueError):
        nn.LayerNorm1d(5, device=device)(_t(np.zeros((3, 4)), device))


# --------------------------------------------------------------------------- Dropout


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 0.9])
@pytest.mark.usefixtures("host_rng")
def test_dropout_mask_matches_numpy(device, p):
    x = np.random.randn(6, 7).astype(np.float32)
    np.random.seed(11)
    y = nn.Dropout(p)(_t(x, device)).numpy()
    after = np.random.rand()
    np.random.seed(11)
    mask = np.random.rand(6, 7).astype(np.float32) <= np.float32(1 - p)
    assert np.random.rand() == after  # exactly one draw of x's size, also when p == 0
    np.testing.assert_allclose(y, x * mask / np.float32(1 - p), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("host_rng")
def test_dropout_of_zero_is_its_input(device):
    # no mask, product or quotient in the graph (the course's graph mode would keep them
    # until reset_grad()); with NumPy's draws the course's one draw is still made
    x = _t(np.random.randn(6, 7), device)
    np.random.seed(13)
    assert nn.Dropout(0.0)(x) is x
    after = np.random.rand()
    np.random.seed(13)
    draws = 0 if ndl.random.uses_device_generator(x.device) else 1
    for _ in range(draws):
        np.random.rand(6, 7)
    assert np.random.rand() == after


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_gradient_and_eval(device):
    np.random.seed(12)
    x = _t(np.random.randn(4, 5), device)
    d = nn.Dropout(0.4)
    y = d(x)
    y.sum().backward()
    mask = y.numpy() != 0
    np.testing.assert_allclose(x.grad.numpy(), mask / 0.6, rtol=1e-6)
    d.eval()
    state = np.random.get_state()[1].copy()
    np.testing.assert_array_equal(d(x).numpy(), x.numpy())
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # no draw in eval


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_edge_cases(device):
    x = _t(np.ones((3, 3)), device)
    np.testing.assert_array_equal(nn.Dropout(1.0)(x).numpy(), np.zeros((3, 3)))
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


# --------------------------------------------------------------------------- Module


class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(ndl.Tensor(np.ones(2, dtype=np.float32)))
        self.buffer = ndl.Tensor(np.zeros(2, dtype=np.float32))  # not a parameter
        self.drop = nn.Dropout(0.1)


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.p0 = nn.Parameter(ndl.Tensor(np.zeros(1, dtype=np.float32)))
        self.blocks = [
            _Inner(),
            {"x": nn.Parameter(ndl.Tensor(np.ones(3, dtype=np.float32))), "inner": _Inner()},
        ]
        self.pair = (nn.Parameter(ndl.Tensor(np.ones(4, dtype=np.float32))), nn.ReLU())
        self.bn = nn.BatchNorm1d(3)
        self.seq = nn.Sequential(nn.Linear(2, 2), nn.Dropout())


def test_module_parameters_order():
    m = _Outer()
    expected = [
        m.p0,
        m.blocks[0].a,
        m.blocks[1]["x"],
        m.blocks[1]["inner"].a,
        m.pair[0],
        m.bn.weight,
        m.bn.bias,
        m.seq.modules[0].weight,
        m.seq.modules[0].bias,
    ]
    params = m.parameters()
    assert len(params) == len(expected)
    assert all(p is q for p, q in zip(params, expected))
    assert all(isinstance(p, nn.Parameter) for p in params)


def test_module_train_eval_recursion():
    m = _Outer()
    modules = [
        m,
        m.blocks[0],
        m.blocks[0].drop,
        m.blocks[1]["inner"],
        m.blocks[1]["inner"].drop,
        m.pair[1],
        m.bn,
        m.seq,
        m.seq.modules[0],
        m.seq.modules[1],
    ]
    assert all(x.training for x in modules)
    m.eval()
    assert not any(x.training for x in modules)
    m.train()
    assert all(x.training for x in modules)


def test_parameter_shares_data():
    t = ndl.Tensor(np.arange(3, dtype=np.float32), requires_grad=False)
    p = nn.Parameter(t)
    assert p.requires_grad
    np.testing.assert_array_equal(p.numpy(), [0, 1, 2])


def test_module_holding_itself_is_walked_once():
    # m.me = m (and a list holding itself) made every walk recurse for ever; each is now
    # skipped where the walk meets it below itself, as PyTorch's memo of modules does.
    m = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    plain = {
        "params": m.parameters(),
        "named": [k for k, _ in m.named_parameters()],
        "modules": [k for k, _ in m.named_modules()],
        "state": list(m.state_dict()),
    }
    m.me = m
    m.modules[0].parent = m
    loop = [m]
    loop.append(loop)
    m.loop = loop
    params = m.parameters()
    assert len(params) == len(plain["params"]) == 4
    assert all(p is q for p, q in zip(params, plain["params"]))
    assert [k for k, _ in m.named_parameters()] == plain["named"]
    assert [k for k, _ in m.named_parameters(remove_duplicate=False)] == plain["named"]
    assert [k for k, _ in m.named_modules()] == plain["modules"] == ["", "0", "1"]
    assert [k for k, _ in m.named_modules(remove_duplicate=False)] == ["", "0", "1"]
    assert [k for k, _ in m.named_children()] == ["0", "1"]
    assert [k for k, _ in m.named_buffers()] == ["1.running_mean", "1.running_var"]
    assert list(m.state_dict()) == plain["state"]
    assert m.load_state_dict(m.state_dict()) == ([], [])
    m.eval()
    assert not m.training and not m.modules[0].training and not m.modules[1].training
    m.train()
    assert m.training and m.modules[0].training and m.modules[1].training


def test_shared_module_still_walked_on_each_path():
    # Only a module met below itself is skipped: a layer shared by two attributes keeps the
    # course's parameters() (its parameters twice) and PyTorch's named_* (once).
    shared = nn.Linear(2, 2)
    m = nn.Sequential(shared, shared)
    assert len(m.parameters()) == 4
    assert [k for k, _ in m.named_parameters()] == ["0.weight", "0.bias"]
    assert list(m.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]
