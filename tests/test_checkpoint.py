"""Gradient checkpointing (needle.utils): gradients equal to the plain model's in both graph
modes with dropout on, nesting, tuple outputs, second derivatives, checkpoint_sequential and
checkpoint_wrapper, peak memory of the course transformer, and misuse errors."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.apps.course_config import COURSE
from needle.apps.models import LanguageModel
from needle.utils import checkpoint, checkpoint_sequential, checkpoint_wrapper, checkpointing

from devices import DEVICES

BENCH = Path(__file__).resolve().parent.parent / "bench"
MODES = ndl.autograd.GRAPH_MODES
dev = pytest.mark.parametrize("device", DEVICES)
mode_param = pytest.mark.parametrize("mode", MODES)


def _tensor(shape, device, requires_grad=True):
    return ndl.Tensor(
        np.random.randn(*shape).astype(np.float32), device=device, requires_grad=requires_grad
    )


def _assert_same(plain, checkpointed):
    assert len(plain) == len(checkpointed)
    for a, b in zip(plain, checkpointed):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def _block_model(device):
    """Linear -> ReLU -> Dropout(0.3) -> Linear, and a scale used inside and outside it."""
    lin1, lin2 = nn.Linear(6, 8, device=device), nn.Linear(8, 6, device=device)
    drop = nn.Dropout(0.3)
    scale = nn.Parameter(ndl.Tensor(np.full((1, 6), 1.5, np.float32), device=device))

    def block(x):
        return lin2(drop(ndl.relu(lin1(x)))) * scale.broadcast_to(x.shape)

    params = [lin1.weight, lin1.bias, lin2.weight, lin2.bias, scale]
    return block, scale, params


def _block_run(device, mode, use_checkpoint):
    np.random.seed(0)
    block, scale, params = _block_model(device)
    x = _tensor((4, 6), device)
    run = (lambda f, *a: checkpoint(f, *a)) if use_checkpoint else (lambda f, *a: f(*a))
    with ndl.autograd.graph_mode(mode):
        h = run(block, x)
        h = run(block, h)  # the same parameters in two checkpointed calls
        loss = (h * h * scale.broadcast_to(h.shape)).sum()  # and outside them
        loss.backward()
    state = np.random.get_state()[1].copy()
    return [x.grad.numpy()] + [p.grad.numpy() for p in params], x.grad, state


@dev
@mode_param
def test_gradients_equal_the_plain_models_with_dropout(device, mode):
    plain, plain_grad, plain_rng = _block_run(device, mode, False)
    ckpt, ckpt_grad, ckpt_rng = _block_run(device, mode, True)
    _assert_same(plain, ckpt)
    # the recomputation replays the forward's draws and puts the outer RNG state back
    np.testing.assert_array_equal(ckpt_rng, plain_rng)
    # "needle" mode's gradients are graphs, cycle_free's plain tensors, with or without
    assert (ckpt_grad.op is None) == (plain_grad.op is None) == (mode == "cycle_free")


def _unread_draws_run(device, mode, use_checkpoint, rng_mode):
    """Dropout(0) (an unread draw), then Dropout(0.5) (a read one), inside a block; returns the
    gradients, the RNG state after the step and how many unread draws the backward made."""
    np.random.seed(3)
    lin = nn.Linear(6, 6, device=device)
    zero, half = nn.Dropout(0.0), nn.Dropout(0.5)

    def block(x):
        return half(zero(lin(x))) * 2.0

    x = _tensor((5, 6), device)
    run = checkpoint if use_checkpoint else (lambda f, *a: f(*a))
    calls = []
    real = {name: getattr(np.random, name) for name in ("rand", "random_sample")}

    def spy(name):
        return lambda *a: calls.append(name) or real[name](*a)

    with ndl.random.rng_mode(rng_mode), ndl.autograd.graph_mode(mode):
        loss = (run(block, x) ** 2).sum()
        try:  # the arrays of doubles NumPy makes in the backward (needle's host draws)
            for name in real:
                setattr(np.random, name, spy(name))
            loss.backward()
        finally:
            for name, function in real.items():
                setattr(np.random, name, function)
    grads = [x.grad.numpy(), lin.weight.grad.numpy(), lin.bias.grad.numpy()]
    return grads, np.random.get_state()[1].copy(), calls


@dev
@mode_param
@pytest.mark.parametrize("rng_mode", ["host", "device"])
def test_the_recomputation_does_not_redraw_unread_draws(device, mode, rng_mode):
    """Dropout(0)'s draw (the course's, with NumPy's draws) is not made again in the
    recomputation: the state it left is set instead, so the read draw after it (Dropout(0.5))
    gets the forward's mask and the gradients and the stream after the step are the plain
    model's."""
    plain, plain_rng, _ = _unread_draws_run(device, mode, False, rng_mode)
    ckpt, ckpt_rng, redrawn = _unread_draws_run(device, mode, True, rng_mode)
    _assert_same(plain, ckpt)
    np.testing.assert_array_equal(ckpt_rng, plain_rng)
    # NumPy's draws: the recomputation draws Dropout(0.5)'s mask again, not Dropout(0)'s; the
    # device generator draws no array of doubles on the host
    assert redrawn == (["rand"] if rng_mode == "host" else [])


def test_unread_draws_advance_the_stream_as_the_course_draw_does():
    np.random.seed(7)
    ndl.random.unread_draw((3, 4))
    after_unread = np.random.rand()
    np.random.seed(7)
    np.random.rand(3, 4)
    assert after_unread == np.random.rand()


def _nested_run(device, mode, use_checkpoint):
    np.random.seed(1)
    W = nn.Parameter(_tensor((5, 5), device))
    drop = nn.Dropout(0.5)
    run = checkpoint if use_checkpoint else (lambda f, *a: f(*a))

    def inner(x):
        return drop(ndl.tanh(x @ W))

    def pair(x, factor):  # two outputs and a non-tensor argument
        a = run(inner, x)
        return a * factor, ndl.exp(a * 0.1)

    def outer(x):
        y, z = run(pair, x, 2.0)
        return run(inner, y + z)

    x = _tensor((3, 5), device)
    with ndl.autograd.graph_mode(mode):
        out = run(outer, x)
        (out * out).sum().backward()
    return [out.numpy(), x.grad.numpy(), W.grad.numpy()]


@dev
@mode_param
def test_checkpoints_nest_and_return_tuples(device, mode):
    _assert_same(_nested_run(device, mode, False), _nested_run(device, mode, True))


def _second_derivative(device, mode, use_checkpoint):
    np.random.seed(2)
    W = _tensor((4, 4), device)
    x = _tensor((2, 4), device)

    def f(x):
        return ndl.tanh(x @ W) ** 2

    with ndl.autograd.graph_mode(mode):
        y = (checkpoint(f, x) if use_checkpoint else f(x)).sum()
        y.backward(create_graph=True)
        x.grad.sum().backward()
    return [x.grad.numpy(), W.grad.numpy()]


@dev
@mode_param
def test_a_recorded_gradient_stays_differentiable(device, mode):
    plain = _second_derivative(device, mode, False)
    _assert_same(plain, _second_derivative(device, mode, True))


def _transformer(device, batch, use_checkpoint, vocab=None):
    """The course transformer with 4 layers and dropout 0.1 (COURSE's sizes, ``batch``
    sequences); with ``vocab``, the whole LanguageModel and its loss, else nn.Transformer with
    the sum of squares of its output. Returns (peak bytes of one step, gradients)."""
    np.random.seed(3)
    if vocab is None:
        model = nn.Transformer(
            COURSE.embedding_size,
            COURSE.hidden_size,
            4,
            num_head=COURSE.num_head,
            dim_head=COURSE.dim_head,
            dropout=0.1,
            device=device,
        )
        stack = model
        x = _tensor((COURSE.seq_len, batch, COURSE.embedding_size), device)
    else:
        model = LanguageModel(
            COURSE.embedding_size,
            vocab,
            COURSE.hidden_size,
            num_layers=4,
            seq_model="transformer",
            device=device,
        )
        stack = model.seq_model
        for module in model._children():
            if isinstance(module, nn.Dropout):
                module.p = 0.1
        tokens = np.random.randint(0, vocab, (COURSE.seq_len, batch)).astype(np.float32)
        x = ndl.Tensor(tokens, device=device, requires_grad=False)
        labels = np.random.randint(0, vocab, (COURSE.seq_len * batch,)).astype(np.float32)
        y = ndl.Tensor(labels, device=device, requires_grad=False)
    if use_checkpoint:
        stack.transformer_layers = [checkpoint_wrapper(m) for m in stack.transformer_layers]
    base = ndl.memory.memory_allocated(device)
    ndl.memory.reset_peak_memory_stats(device)
    if vocab is None:
        out, _ = model(x)
        loss = (out * out).sum()
    else:
        logits, _ = model(x)
        loss = nn.SoftmaxLoss()(logits, y)
    loss.backward()
    peak = ndl.memory.max_memory_allocated(device) - base
    return peak, [p.grad.numpy() for p in model.parameters()]


@dev
@pytest.mark.parametrize("vocab", [None, 1000], ids=["transformer", "language_model"])
def test_checkpointing_each_layer_lowers_the_course_transformers_peak(device, vocab):
    # 32 sequences keep the test short; the benchmark (bench/checkpoint_bench.py) measures the
    # course's 256 and its vocabulary of 10000, whose logits no layer checkpoint reaches.
    plain_peak, plain = _transformer(device, 32, False, vocab)
    ckpt_peak, ckpt = _transformer(device, 32, True, vocab)
    _assert_same(plain, ckpt)
    assert ckpt_peak <= 0.6 * plain_peak, (ckpt_peak, plain_peak)


@dev
@mode_param
def test_transformer_layer_gradients_in_both_modes(device, mode):
    def run(use_checkpoint):
        np.random.seed(4)
        layer = nn.TransformerLayer(8, 2, 4, 16, dropout=0.2, device=device)
        wrapped = checkpoint_wrapper(layer) if use_checkpoint else layer
        x = _tensor((2, 5, 8), device)
        with ndl.autograd.graph_mode(mode):
            wrapped(wrapped(x)).sum().backward()
        return [x.grad.numpy()] + [p.grad.numpy() for p in layer.parameters()]

    _assert_same(run(False), run(True))


@pytest.fixture
def checkpoint_bench(monkeypatch):
    """bench/checkpoint_bench.py as a module (its folder on sys.path for benchutil)."""
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("checkpoint_bench", BENCH / "checkpoint_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dev
@mode_param
@pytest.mark.parametrize("scheme", ["wrapper", "sequential"])
def test_the_benchmarks_schemes_give_the_plain_stacks_gradients(
    checkpoint_bench, device, mode, scheme
):
    """The benchmark's construction (checkpoint_layers on an nn.Transformer of 4 layers with
    dropout): the output and every gradient are the plain stack's, in both graph modes."""

    def run(scheme):
        np.random.seed(7)
        stack = nn.Transformer(8, 16, 4, num_head=2, dim_head=4, dropout=0.2, device=device)
        checkpoint_bench.checkpoint_layers(stack, scheme)
        x = _tensor((5, 3, 8), device)
        with ndl.autograd.graph_mode(mode):
            out, _ = stack(x)
            (out * out).sum().backward()
        checkpoints = sum(
            isinstance(node.op, checkpointing._Checkpoint)
            for node in ndl.autograd.find_topo_sort([out])
        )
        grads = [out.numpy(), x.grad.numpy()] + [p.grad.numpy() for p in stack.parameters()]
        return checkpoints, grads

    plain_checkpoints, plain = run(checkpoint_bench.PLAIN)
    checkpoints, checkpointed = run(scheme)
    _assert_same(plain, checkpointed)
    # wrapper: every layer a checkpointed node; sequential: all but the last
    assert (plain_checkpoints, checkpoints) == (0, 4 if scheme == "wrapper" else 3)


def test_the_benchmarks_scheme_names_are_checked(checkpoint_bench):
    stack = nn.Transformer(8, 16, 2, num_head=2, dim_head=4)
    with pytest.raises(ValueError, match="checkpoint scheme must be one of"):
        checkpoint_bench.checkpoint_layers(stack, "every_other")


@dev
@pytest.mark.parametrize("segments", [1, 2, 3, 5])
def test_checkpoint_sequential_matches_the_sequential(device, segments):
    def run(use_checkpoint):
        np.random.seed(5)
        model = nn.Sequential(
            nn.Linear(4, 6, device=device),
            nn.ReLU(),
            nn.Dropout(0.25),
            nn.Linear(6, 6, device=device),
            nn.Tanh(),
        )
        x = _tensor((3, 4), device)
        out = checkpoint_sequential(model, segments, x) if use_checkpoint else model(x)
        (out * out).sum().backward()
        return [out.numpy(), x.grad.numpy()] + [p.grad.numpy() for p in model.parameters()]

    _assert_same(run(False), run(True))


def test_checkpoint_sequential_takes_a_list_and_checks_segments():
    np.random.seed(6)
    layers = [nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3)]
    x = _tensor((2, 3), ndl.cpu())
    out = checkpoint_sequential(layers, 2, x)
    assert out.shape == (2, 3) and out.op is not None
    for bad in (0, 4, -1):
        with pytest.raises(ValueError, match="segments must be in"):
            checkpoint_sequential(layers, bad, x)
    for bad in (1.5, True, "2"):
        with pytest.raises(TypeError, match="segments must be an int"):
            checkpoint_sequential(layers, bad, x)


def test_checkpoint_wrapper_exposes_the_modules_parameters_and_mode():
    layer = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    wrapped = checkpoint_wrapper(layer)
    assert [id(p) for p in wrapped.parameters()] == [id(p) for p in layer.parameters()]
    wrapped.eval()
    assert not layer.modules[1].training
    wrapped.train()
    assert layer.modules[1].training
    with pytest.raises(TypeError, match="must be callable"):
        checkpoint_wrapper(3)


def test_under_no_grad_it_is_a_plain_call():
    x = _tensor((2, 2), ndl.cpu())
    with ndl.no_grad():
        y = checkpoint(lambda t: t * 2.0, x)
    assert y.op is None and not y.requires_grad
    np.testing.assert_allclose(y.numpy(), x.numpy() * 2)


def test_the_forward_keeps_only_inputs_and_outputs():
    W = nn.Parameter(_tensor((3, 3), ndl.cpu()))
    x = _tensor((2, 3), ndl.cpu())
    y = checkpoint(lambda t: ndl.exp(t @ W) + 1.0, x)
    # one node whose inputs are the argument and the parameter read from outside
    assert len(y.inputs) == 2 and y.inputs[0] is x and y.inputs[1] is W
    stale = ndl.Tensor(np.ones((3, 3), np.float32), requires_grad=False)
    W.grad = stale
    y.sum().backward()
    # the outer backward adds the segment's gradient to W's .grad once (PyTorch's
    # accumulation); the inner backward's partial .grad on W is not left behind
    np.testing.assert_allclose(
        W.grad.numpy(), 1.0 + x.numpy().T @ np.exp(x.numpy() @ W.numpy()), rtol=1e-5
    )


def _still_works():
    x = _tensor((2, 2), ndl.cpu())
    checkpoint(lambda t: t * 3.0, x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full((2, 2), 3.0))


def test_no_input_requiring_grad_is_an_error():
    x = _tensor((2, 2), ndl.cpu(), requires_grad=False)
    with pytest.raises(ValueError, match="checkpoint: no tensor argument"):
        checkpoint(lambda t: t * 2.0, x)
    with pytest.raises(ValueError, match="checkpoint: no tensor argument"):
        checkpoint(lambda: ndl.Tensor([1.0], requires_grad=False))
    _still_works()


@pytest.mark.parametrize(
    "result", [None, 3, np.ones(2), (), [1.0], "x"], ids=lambda r: type(r).__name__
)
def test_fn_returning_non_tensors_is_an_error(result):
    x = _tensor((2, 2), ndl.cpu())
    with pytest.raises(TypeError, match="checkpoint: fn must return a Tensor"):
        checkpoint(lambda t: result, x)
    with pytest.raises(TypeError, match="checkpoint: fn must return a Tensor"):
        checkpoint(lambda t: (t * 2.0, result), x)
    _still_works()


def test_bad_arguments_are_errors():
    x = _tensor((2, 2), ndl.cpu())
    with pytest.raises(TypeError, match="fn must be callable"):
        checkpoint(x, x)
    with pytest.raises(ValueError, match="determinism_check must be one of"):
        checkpoint(lambda t: t, x, determinism_check="strict")
    pair = ndl.ops.make_tuple(x, x)
    with pytest.raises(TypeError, match="argument 0 is a TensorTuple"):
        checkpoint(lambda t: t, pair)
    _still_works()


def test_a_recomputation_of_another_shape_is_flagged():
    calls = []

    def grows(t):  # another shape on every call
        calls.append(1)
        return ndl.ops.stack([t] * len(calls), 0)

    x = _tensor((2, 2), ndl.cpu())
    y = checkpoint(grows, x)
    with pytest.raises(RuntimeError, match="checkpoint: recomputing fn in the backward gave"):
        y.sum().backward()
    _still_works()


def test_a_recomputation_with_other_values_is_flagged_on_request():
    state = {"offset": 0.0}

    def drifts(t):  # reads state that changes between the forward and the backward
        state["offset"] += 1.0
        return t + state["offset"]

    x = _tensor((2, 2), ndl.cpu())
    checkpoint(drifts, x).sum().backward()  # the default check compares shapes only
    with pytest.raises(RuntimeError, match="other values for output 0"):
        checkpoint(drifts, x, determinism_check="values").sum().backward()
    # the values check passes a deterministic fn, dropout included
    drop = nn.Dropout(0.5)
    checkpoint(lambda t: drop(t) * 2.0, x, determinism_check="values").sum().backward()
    # without the RNG replay, dropout draws other masks: the values check sees it
    with pytest.raises(RuntimeError, match="other values"):
        checkpoint(
            lambda t: drop(t) * 2.0, x, preserve_rng_state=False, determinism_check="values"
        ).sum().backward()
    _still_works()


@dev
@pytest.mark.parametrize("use_reentrant", [None, True, False])
def test_use_reentrant_is_accepted_and_gives_the_same_gradients(device, use_reentrant):
    # PyTorch code passes use_reentrant routinely; needle's one implementation runs for each
    def run(**kwargs):
        np.random.seed(7)
        model = nn.Sequential(nn.Linear(4, 4, device=device), nn.Dropout(0.3), nn.Tanh())
        x = _tensor((3, 4), device)
        out = checkpoint(model, x, **kwargs)
        out = checkpoint_sequential([nn.ReLU(), model], 2, out, **kwargs)
        out = checkpoint_wrapper(model, **kwargs)(out)
        (out * out).sum().backward()
        return [out.numpy(), x.grad.numpy()] + [p.grad.numpy() for p in model.parameters()]

    _assert_same(run(), run(use_reentrant=use_reentrant))


def test_option_values_are_checked():
    x = _tensor((2, 2), ndl.cpu())
    layers = [nn.ReLU(), nn.Tanh()]
    for bad in ("maybe", 1, None):
        with pytest.raises(TypeError, match="checkpoint: preserve_rng_state must be a bool"):
            checkpoint(lambda t: t * 2.0, x, preserve_rng_state=bad)
        with pytest.raises(TypeError, match="checkpoint_wrapper: preserve_rng_state must be"):
            checkpoint_wrapper(nn.ReLU(), preserve_rng_state=bad)
    for bad in ("yes", 0, 1.0):
        with pytest.raises(TypeError, match="checkpoint: use_reentrant must be a bool or None"):
            checkpoint(lambda t: t * 2.0, x, use_reentrant=bad)
        with pytest.raises(TypeError, match="checkpoint_sequential: use_reentrant must be"):
            checkpoint_sequential(layers, 1, x, use_reentrant=bad)
    with pytest.raises(ValueError, match="checkpoint_wrapper: determinism_check must be one"):
        checkpoint_wrapper(nn.ReLU(), determinism_check="strict")
    _still_works()


def test_unknown_keyword_arguments_are_refused_when_given():
    x = _tensor((2, 2), ndl.cpu())
    # at construction, not at the first forward (PyTorch's wrapper refuses them too)
    with pytest.raises(TypeError, match=r"checkpoint_wrapper: unexpected keyword .*'bogus'"):
        checkpoint_wrapper(nn.ReLU(), bogus=1)
    with pytest.raises(TypeError, match=r"'a', 'b'; checkpoint takes preserve_rng_state"):
        checkpoint_wrapper(nn.ReLU(), b=1, a=2, use_reentrant=False)
    # one segment calls no checkpoint, and still refuses them
    with pytest.raises(TypeError, match=r"checkpoint_sequential: unexpected .*'bogus'"):
        checkpoint_sequential([nn.ReLU()], 1, x, bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        checkpoint(lambda t: t * 2.0, x, bogus=1)
    _still_works()
