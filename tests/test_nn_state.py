"""Tests for Module's names and state (nn_basic.py): named_parameters, named_buffers,
named_children, named_modules, state_dict and load_state_dict.

The key layout is compared with PyTorch's on models whose layouts are meant to be the same
(Linear, Sequential, BatchNorm1d, list and dict attributes as ModuleList / ModuleDict, a
wrapper's "module." prefix, the LSTM language model after renaming the LSTM's cells); values
travel between the two where they can (needle's Linear weight is (in, out), PyTorch's
(out, in)). Loading is checked for identity (an optimizer made before still updates the
loaded parameters), dtype and device conversion, no aliasing of the source, buffers, the
round trip through NumPy, and for loading nothing when it raises.
"""

import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.apps.models import LanguageModel, ResNet9

from cuda_check import cuda_test
from devices import DEVICES

DTYPES = ["float32", "float64"]
dev_dtype = pytest.mark.parametrize("dtype", DTYPES)
dev = pytest.mark.parametrize("device", DEVICES)


class Wrapper(nn.Module):
    """DistributedDataParallel's layout: the wrapped model under ``module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module


class Containers(nn.Module):
    """A list and a dict of modules, a list of parameters and a Sequential attribute, for
    the keys PyTorch gives ModuleList, ModuleDict, ParameterList and Sequential; ``gain``,
    a parameter made after the children, is first in PyTorch's state_dict order (own
    parameters first) and last in parameters() order."""

    def __init__(self, device=None, dtype="float32"):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.scale = nn.Parameter(ndl.init.ones(3, **kw))
        self.layers = [nn.Linear(3, 4, **kw), nn.Linear(4, 3, **kw)]
        self.heads = {"a": nn.Linear(3, 2, **kw), "b": nn.BatchNorm1d(3, **kw)}
        self.extra = [nn.Parameter(ndl.init.zeros(2, **kw)), nn.Parameter(ndl.init.ones(5, **kw))]
        self.mlp = nn.Sequential(nn.Linear(3, 3, **kw), nn.ReLU(), nn.Linear(3, 1, **kw))
        self.gain = nn.Parameter(ndl.init.ones(1, **kw))


def torch_containers(torch):
    tnn = torch.nn

    class Twin(tnn.Module):
        def __init__(self):
            super().__init__()
            self.scale = tnn.Parameter(torch.ones(3))
            self.layers = tnn.ModuleList([tnn.Linear(3, 4), tnn.Linear(4, 3)])
            self.heads = tnn.ModuleDict({"a": tnn.Linear(3, 2), "b": tnn.BatchNorm1d(3)})
            self.extra = tnn.ParameterList([torch.zeros(2), torch.ones(5)])
            self.mlp = tnn.Sequential(tnn.Linear(3, 3), tnn.ReLU(), tnn.Linear(3, 1))
            self.gain = tnn.Parameter(torch.ones(1))

    return Twin()


def torch_wrapper(torch, module):
    class TorchWrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = module

    return TorchWrapper()


def torch_keys(module):
    # needle's BatchNorm counts no batches: PyTorch's num_batches_tracked has no twin.
    return [k for k in module.state_dict() if not k.endswith("num_batches_tracked")]


def shapes_match(needle_shape, torch_shape):
    """Equal, or equal once a needle Linear's (in, out) / (1, out) is taken as PyTorch's
    (out, in) / (out,)."""
    if tuple(needle_shape) == tuple(torch_shape):
        return True
    if len(needle_shape) == 2 and tuple(needle_shape[::-1]) == tuple(torch_shape):
        return True
    return len(needle_shape) == 2 and needle_shape[0] == 1 and (needle_shape[1],) == torch_shape


def outputs(model, x):
    model.eval()
    return model(x).numpy()


# ------------------------------------------------------------------- keys against PyTorch


@pytest.mark.parametrize(
    "make, make_torch",
    [
        (lambda: nn.Linear(3, 4), lambda t: t.nn.Linear(3, 4)),
        (lambda: nn.Linear(3, 4, bias=False), lambda t: t.nn.Linear(3, 4, bias=False)),
        (
            lambda: nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)),
            lambda t: t.nn.Sequential(t.nn.Linear(3, 4), t.nn.ReLU(), t.nn.Linear(4, 2)),
        ),
        (lambda: nn.BatchNorm1d(5), lambda t: t.nn.BatchNorm1d(5)),
        (lambda: nn.Embedding(7, 3), lambda t: t.nn.Embedding(7, 3)),
        (
            lambda: Wrapper(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))),
            lambda t: torch_wrapper(t, t.nn.Sequential(t.nn.Linear(2, 2), t.nn.BatchNorm1d(2))),
        ),
        (Containers, torch_containers),
    ],
    ids=["linear", "linear_nobias", "sequential", "batchnorm", "embedding", "wrapper", "lists"],
)
def test_state_dict_keys_match_torch(make, make_torch):
    torch = pytest.importorskip("torch")
    model, twin = make(), make_torch(torch)
    sd = model.state_dict()
    assert list(sd) == torch_keys(twin)
    t_sd = twin.state_dict()
    for key, value in sd.items():
        assert shapes_match(value.shape, tuple(t_sd[key].shape)), key
    # The same names; their order is parameters()'s (see test_named_parameters_order).
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in twin.named_parameters())
    assert [n for n, _ in model.named_buffers()] == torch_keys_buffers(twin)


def torch_keys_buffers(module):
    return [n for n, _ in module.named_buffers() if not n.endswith("num_batches_tracked")]


def test_named_modules_and_children_match_torch():
    torch = pytest.importorskip("torch")
    model, twin = Containers(), torch_containers(torch)
    # PyTorch's ModuleList / ModuleDict are modules of their own; needle's lists are not.
    containers = {"layers", "heads", "extra"}
    t_modules = [n for n, _ in twin.named_modules() if n not in containers]
    assert [n for n, _ in model.named_modules()] == t_modules
    assert [n for n, _ in model.named_children()] == [
        "layers.0",
        "layers.1",
        "heads.a",
        "heads.b",
        "mlp",
    ]
    assert [n for n, _ in model.mlp.named_children()] == ["0", "1", "2"]
    assert [n for n, _ in model.named_modules(prefix="m")][:3] == ["m", "m.layers.0", "m.layers.1"]
    assert all(m is model.mlp.modules[int(n)] for n, m in model.mlp.named_children())


@dev_dtype
def test_linear_state_loads_into_torch(dtype):
    """needle's Linear state, transposed, is PyTorch's Linear state: same outputs."""
    torch = pytest.importorskip("torch")
    np.random.seed(0)
    layer = nn.Linear(5, 3, dtype=dtype)
    twin = torch.nn.Linear(5, 3, dtype=getattr(torch, dtype))
    sd = {k: v.numpy() for k, v in layer.state_dict().items()}
    twin.load_state_dict(
        {"weight": torch.from_numpy(sd["weight"].T), "bias": torch.from_numpy(sd["bias"][0])}
    )
    x = np.random.randn(4, 5).astype(dtype)
    expected = twin(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(layer(ndl.Tensor(x, dtype=dtype)).numpy(), expected, rtol=1e-5)


def test_lstm_language_model_keys_and_values_match_torch():
    """The LSTM language model is PyTorch's after renaming the cells
    (seq_model.lstm_cells.i.W_ih -> seq_model.weight_ih_li ...) and transposing the
    weights: the logits agree."""
    torch = pytest.importorskip("torch")
    vocab, emb, hidden, layers, seq_len, bs = 11, 6, 5, 2, 4, 3
    np.random.seed(0)
    model = LanguageModel(emb, vocab, hidden, num_layers=layers, seq_model="lstm")
    renames = {"W_ih": "weight_ih", "W_hh": "weight_hh", "bias_ih": "bias_ih", "bias_hh": "bias_hh"}

    def torch_name(key):
        parts = key.split(".")
        if parts[:2] == ["seq_model", "lstm_cells"]:
            return f"seq_model.{renames[parts[3]]}_l{parts[2]}"
        return key

    class TorchLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(vocab, emb)
            self.seq_model = torch.nn.LSTM(emb, hidden, layers)
            self.linear = torch.nn.Linear(hidden, vocab)

    twin = TorchLM()
    sd = model.state_dict()
    assert [torch_name(k) for k in sd] == list(twin.state_dict())
    t_sd = {}
    for key, value in sd.items():
        a = value.numpy()
        if key == "linear.weight" or ".W_" in key:
            a = a.T  # (in, out) -> (out, in)
        if key == "linear.bias":
            a = a.reshape(-1)  # (1, out) -> (out,)
        t_sd[torch_name(key)] = torch.from_numpy(np.ascontiguousarray(a))
    twin.load_state_dict(t_sd)
    tokens = np.random.default_rng(1).integers(0, vocab, size=(seq_len, bs))
    logits, _ = model(ndl.Tensor(tokens.astype(np.float32), requires_grad=False))
    with torch.no_grad():
        out, _ = twin.seq_model(twin.embedding(torch.from_numpy(tokens)))
        expected = twin.linear(out.reshape(seq_len * bs, hidden)).numpy()
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------- names and values


def test_named_parameters_order():
    """parameters() order (attribute order, depth first), so names zip with an optimizer's
    parameters; state_dict has PyTorch's order (each module's own parameters first)."""
    model = Containers()
    named = list(model.named_parameters())
    assert all(p is q for (_, p), q in zip(named, model.parameters(), strict=True))
    assert [n for n, _ in named][0] == "scale" and named[-1][0] == "gain"
    assert list(model.state_dict())[:2] == ["scale", "gain"]


def test_language_model_names_follow_parameters_order():
    np.random.seed(0)
    model = LanguageModel(4, 9, 6, num_layers=2, seq_model="transformer")
    named = list(model.named_parameters())
    assert len(named) == len(model.parameters())
    assert all(p is q for (_, p), q in zip(named, model.parameters()))
    assert named[0][0] == "embedding.weight"
    assert named[1][0] == "seq_model.positional_embedding.weight"
    assert named[2][0] == "seq_model.transformer_layers.0.residual1.fn.0.prenorm_q.w"
    assert named[-1][0] == "linear.bias"
    assert [n for n, _ in model.linear.named_parameters(prefix="head")] == [
        "head.weight",
        "head.bias",
    ]


def test_own_parameters_and_buffers_without_recursion():
    model = Containers()
    assert [n for n, _ in model.named_parameters(recurse=False)] == ["scale", "gain"]
    assert list(model.named_buffers(recurse=False)) == []
    assert [n for n, _ in model.heads["b"].named_buffers(recurse=False)] == [
        "running_mean",
        "running_var",
    ]


def test_shared_parameter_named_once_saved_twice():
    """As PyTorch: named_parameters reports a tied weight once (its first name), state_dict
    under every name, and loading either key reaches the one parameter."""
    torch = pytest.importorskip("torch")
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model.modules[1].weight = model.modules[0].weight
    twin = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    twin[1].weight = twin[0].weight
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in twin.named_parameters()]
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "1.bias"]
    assert len(list(model.named_parameters(remove_duplicate=False))) == 4
    assert list(model.state_dict()) == list(twin.state_dict())
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    sd["0.weight"] = np.full((3, 3), 2.0, np.float32)
    sd["1.weight"] = np.full((3, 3), 2.0, np.float32)
    model.load_state_dict(sd)
    np.testing.assert_array_equal(model.modules[1].weight.numpy(), np.full((3, 3), 2.0))


@dev
@dev_dtype
def test_state_dict_values_detached_and_shared(device, dtype):
    layer = nn.BatchNorm1d(4, device=device, dtype=dtype)
    sd = layer.state_dict()
    assert list(sd) == ["weight", "bias", "running_mean", "running_var"]
    for value in sd.values():
        assert type(value) is ndl.Tensor
        assert value.requires_grad is False and value.op is None
        assert value.dtype == dtype and value.device == device
    # Sharing the data: writing the state dict's array writes the parameter.
    sd["weight"].realize_cached_data()[1] = 7.0
    assert layer.weight.numpy()[1] == 7.0
    kept = layer.state_dict(keep_vars=True)
    assert kept["weight"] is layer.weight and kept["running_mean"] is layer.running_mean
    assert list(layer.state_dict(prefix="bn.")) == [f"bn.{k}" for k in sd]


def test_attention_scratch_is_not_state():
    """Attention's saved probabilities are a Tensor attribute but not a buffer."""
    layer = nn.AttentionLayer(4, 2, 3, causal=True)
    layer(ndl.Tensor(np.random.randn(2, 3, 4).astype(np.float32)))
    assert isinstance(layer.probs, ndl.Tensor)
    assert not any("probs" in k for k in layer.state_dict())
    assert list(layer.named_buffers()) == []


# ------------------------------------------------------------------- loading


@dev
@dev_dtype
def test_round_trip_through_numpy(device, dtype):
    """state_dict -> NumPy -> a fresh model of the same config: the same outputs."""
    kw = dict(device=device, dtype=dtype)
    np.random.seed(0)
    model = nn.Sequential(
        nn.Linear(4, 6, **kw), nn.BatchNorm1d(6, **kw), nn.ReLU(), nn.Linear(6, 2, **kw)
    )
    x = ndl.Tensor(np.random.randn(8, 4), **kw)
    model.train()
    model(x)  # moves the running statistics off their initial values
    saved = {k: v.numpy() for k, v in model.state_dict().items()}
    np.random.seed(1)
    fresh = nn.Sequential(
        nn.Linear(4, 6, **kw), nn.BatchNorm1d(6, **kw), nn.ReLU(), nn.Linear(6, 2, **kw)
    )
    assert not np.allclose(outputs(fresh, x), outputs(model, x))
    result = fresh.load_state_dict(saved)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert repr(result) == "<All keys matched successfully>"
    np.testing.assert_array_equal(outputs(fresh, x), outputs(model, x))
    for key, value in fresh.state_dict().items():
        assert value.dtype == dtype and value.device == device
        np.testing.assert_array_equal(value.numpy(), saved[key])


@pytest.mark.parametrize("seq_model", ["lstm", "transformer"])
def test_language_model_round_trip(seq_model):
    np.random.seed(0)
    model = LanguageModel(4, 9, 6, num_layers=2, seq_model=seq_model)
    tokens = ndl.Tensor(np.random.randint(0, 9, size=(5, 2)).astype(np.float32))
    saved = {k: v.numpy() for k, v in model.state_dict().items()}
    np.random.seed(1)
    fresh = LanguageModel(4, 9, 6, num_layers=2, seq_model=seq_model)
    fresh.load_state_dict(saved)
    model.eval()
    fresh.eval()
    np.testing.assert_array_equal(fresh(tokens)[0].numpy(), model(tokens)[0].numpy())


def test_resnet_buffers_round_trip():
    np.random.seed(0)
    model = ResNet9()
    keys = list(model.state_dict())
    assert keys[:6] == [
        "model.0.conv.weight",
        "model.0.conv.bias",
        "model.0.bn.weight",
        "model.0.bn.bias",
        "model.0.bn.running_mean",
        "model.0.bn.running_var",
    ]
    assert "model.2.fn.1.bn.running_var" in keys
    assert len(list(model.named_buffers())) == 16  # 8 BatchNorms
    saved = {k: v.numpy() + 0.5 for k, v in model.state_dict().items()}
    model.load_state_dict(saved)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), saved[key])


@dev
@dev_dtype
def test_load_keeps_identity_and_optimizer(device, dtype):
    """The Parameters and buffers keep their identity; an optimizer made before the load
    updates the loaded values; the source is copied, not aliased."""
    kw = dict(device=device, dtype=dtype)
    model = nn.Sequential(nn.Linear(3, 2, **kw), nn.BatchNorm1d(2, **kw))
    params = model.parameters()
    buffer = model.modules[1].running_mean
    opt = ndl.optim.SGD(params, lr=0.5)
    source = nn.Sequential(nn.Linear(3, 2, **kw), nn.BatchNorm1d(2, **kw))
    source.modules[1].running_mean = ndl.Tensor(np.array([3.0, 4.0]), **kw)
    model.load_state_dict(source.state_dict())
    assert all(p is q for p, q in zip(model.parameters(), params))
    assert model.modules[1].running_mean is buffer
    np.testing.assert_array_equal(buffer.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(params[0].numpy(), source.modules[0].weight.numpy())
    # Not aliased: writing the source's array leaves the loaded weight alone.
    before = params[0].numpy()
    source.modules[0].weight.realize_cached_data()[0, 0] = 100.0
    np.testing.assert_array_equal(params[0].numpy(), before)
    model.train()
    loss = model(ndl.Tensor(np.ones((4, 3)), **kw)).sum()
    loss.backward()
    grad = params[0].grad.numpy()
    opt.step()
    np.testing.assert_allclose(params[0].numpy(), before - 0.5 * grad, rtol=1e-5, atol=1e-6)


@dev
@pytest.mark.parametrize(
    "source_dtype, target_dtype", [("float64", "float32"), ("float32", "float64")]
)
def test_load_converts_dtype(device, source_dtype, target_dtype):
    layer = nn.Linear(2, 3, device=device, dtype=target_dtype)
    w = np.arange(6, dtype=source_dtype).reshape(2, 3) / 7
    b = ndl.Tensor(np.ones((1, 3)), dtype=source_dtype)  # a Tensor on the CPU
    layer.load_state_dict({"weight": w, "bias": b})
    assert layer.weight.dtype == target_dtype and layer.bias.dtype == target_dtype
    assert layer.weight.device == device and layer.bias.device == device
    np.testing.assert_allclose(layer.weight.numpy(), w, rtol=1e-6)
    np.testing.assert_array_equal(layer.bias.numpy(), np.ones((1, 3)))
    # An NDArray and an integer NumPy array are accepted too.
    layer.load_state_dict({"weight": ndl.NDArray(w), "bias": np.array([[1, 2, 3]])})
    np.testing.assert_array_equal(layer.bias.numpy(), [[1, 2, 3]])


@cuda_test
@pytest.mark.parametrize("dtype", DTYPES)
def test_load_from_another_device(dtype):
    cpu_model = nn.Linear(3, 2, dtype=dtype)
    gpu_model = nn.Linear(3, 2, device=ndl.cuda(), dtype=dtype)
    gpu_model.load_state_dict(cpu_model.state_dict())
    assert gpu_model.weight.device == ndl.cuda()
    np.testing.assert_array_equal(gpu_model.weight.numpy(), cpu_model.weight.numpy())
    cpu_model.load_state_dict(nn.Linear(3, 2, device=ndl.cuda(), dtype=dtype).state_dict())
    assert cpu_model.weight.device == ndl.cpu()


def test_non_strict_loads_what_matches():
    layer = nn.Linear(2, 3)
    result = layer.load_state_dict({"weight": np.ones((2, 3)), "extra": 1}, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["extra"]
    missing, unexpected = result
    assert (missing, unexpected) == (["bias"], ["extra"])
    np.testing.assert_array_equal(layer.weight.numpy(), np.ones((2, 3)))


# ------------------------------------------------------------------- bad input


def unchanged(layer, before):
    return all(np.array_equal(v.numpy(), before[k]) for k, v in layer.state_dict().items())


def test_strict_missing_and_unexpected_load_nothing():
    layer = nn.Linear(2, 3)
    before = {k: v.numpy() for k, v in layer.state_dict().items()}
    with pytest.raises(RuntimeError) as info:
        layer.load_state_dict({"weight": np.zeros((2, 3)), "foo": np.zeros(1), "bar": 0})
    message = str(info.value)
    assert 'Missing key(s) in state_dict: "bias".' in message
    assert 'Unexpected key(s) in state_dict: "foo", "bar".' in message
    assert "Linear" in message
    assert unchanged(layer, before)


def test_shape_mismatch_names_key_and_shapes_and_loads_nothing():
    layer = nn.Linear(2, 3)
    before = {k: v.numpy() for k, v in layer.state_dict().items()}
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=r"size mismatch for weight: .*\(3, 2\).*\(2, 3\)"):
            layer.load_state_dict({"weight": np.zeros((3, 2)), "bias": np.zeros((1, 3))}, strict)
        assert unchanged(layer, before)


@pytest.mark.parametrize("state", [None, [("weight", np.zeros((2, 3)))], "weight", 3])
def test_state_dict_must_be_a_mapping(state):
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        nn.Linear(2, 3).load_state_dict(state)


@pytest.mark.parametrize("strict", [1, 0, None, "yes"])
def test_strict_must_be_bool(strict):
    with pytest.raises(TypeError, match="strict must be True or False"):
        nn.Linear(2, 3).load_state_dict({}, strict=strict)


@pytest.mark.parametrize(
    "value, error",
    [
        ([[0.0] * 3] * 2, "must be a Tensor, an NDArray or a NumPy array, got list"),
        (None, "got NoneType"),
        (np.zeros((2, 3), dtype=np.complex64), "state_dict\\['weight'\\]"),
        (np.array([["a"] * 3] * 2), "state_dict\\['weight'\\]"),
    ],
    ids=["list", "none", "complex", "strings"],
)
def test_bad_values_name_the_key_and_load_nothing(value, error):
    layer = nn.Linear(2, 3)
    before = {k: v.numpy() for k, v in layer.state_dict().items()}
    with pytest.raises(TypeError, match=error):
        layer.load_state_dict({"bias": np.ones((1, 3)), "weight": value})
    assert unchanged(layer, before)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: m.state_dict(prefix=1), "state_dict: prefix must be a str"),
        (lambda m: m.state_dict(keep_vars=1), "state_dict: keep_vars must be True or False"),
        (lambda m: m.state_dict("x"), "positional"),
        (lambda m: list(m.named_parameters(prefix=None)), "named_parameters: prefix"),
        (lambda m: list(m.named_parameters(recurse="no")), "named_parameters: recurse"),
        (
            lambda m: list(m.named_parameters(remove_duplicate=0)),
            "named_parameters: remove_duplicate",
        ),
        (lambda m: list(m.named_buffers(prefix=b"x")), "named_buffers: prefix"),
        (lambda m: list(m.named_buffers(recurse=None)), "named_buffers: recurse"),
        (lambda m: list(m.named_modules(prefix=0)), "named_modules: prefix"),
        (lambda m: list(m.named_modules(remove_duplicate=None)), "named_modules: remove_dup"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(TypeError, match=message):
        call(nn.BatchNorm1d(2))
