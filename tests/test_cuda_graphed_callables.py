"""``ndl.cuda.make_graphed_callables`` (python/needle/_graphed_callables.py): a graphed module or
function gives, call after call, the outputs and gradients of its eager twin bit for bit
(the simulator and a GPU run the same kernels), through optimizer steps that give the
parameters new arrays; several callables share a pool; eval mode runs the eager forward;
bad input raises."""

import numpy as np
import pytest

import needle as ndl

from devices import needs_cuda

make = ndl.cuda.make_graphed_callables


def _cuda(fn):
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


def _mlp(seed, n_in=4, hidden=8, n_out=3):
    np.random.seed(seed)
    dev = ndl.cuda()
    return ndl.nn.Sequential(
        ndl.nn.Linear(n_in, hidden, device=dev),
        ndl.nn.ReLU(),
        ndl.nn.Linear(hidden, n_out, device=dev),
    )


def _tensor(values, requires_grad=False):
    return ndl.Tensor(
        np.asarray(values, dtype=np.float32), device=ndl.cuda(), requires_grad=requires_grad
    )


def _batches(count, shape, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]


def _same(a, b):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def _graph_launches():
    return ndl.cuda.work_counters()["graph_launches"]


@_cuda
def test_graphed_mlp_equals_eager_through_sgd_steps():
    eager, model = _mlp(0), _mlp(0)
    graphed = make(model, (_tensor(np.zeros((5, 4))),))
    assert graphed is model
    assert all(p.grad is None for p in model.parameters())
    opt_e = ndl.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_g = ndl.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x in _batches(4, (5, 4)):
        ye, yg = eager(_tensor(x)), graphed(_tensor(x))
        _same(ye, yg)
        assert yg.shape == (5, 3) and yg.requires_grad
        before = _graph_launches()
        (yg * yg).sum().backward()
        assert _graph_launches() == before + 1  # the backward is one replay
        (ye * ye).sum().backward()
        for pe, pg in zip(eager.parameters(), model.parameters()):
            _same(pe.grad, pg.grad)
        # SGD gives each parameter a new array; the next call must read the new values
        opt_e.step()
        opt_g.step()
        opt_e.reset_grad()
        opt_g.reset_grad()
    for pe, pg in zip(eager.parameters(), model.parameters()):
        _same(pe, pg)


@_cuda
def test_gradients_accumulate_over_micro_batches_as_eager():
    eager, model = _mlp(0), _mlp(0)
    graphed = make(model, (_tensor(np.zeros((5, 4))),))
    for x in _batches(3, (5, 4), seed=2):  # no reset: .grad sums the three backwards
        ndl.ops.summation(eager(_tensor(x)) ** 2).backward()
        ndl.ops.summation(graphed(_tensor(x)) ** 2).backward()
    for pe, pg in zip(eager.parameters(), model.parameters()):
        _same(pe.grad, pg.grad)


@_cuda
def test_one_call_is_one_forward_replay_and_outputs_are_not_overwritten():
    model = make(_mlp(0), (_tensor(np.zeros((2, 4))),))
    x1, x2 = _batches(2, (2, 4), seed=3)
    before = _graph_launches()
    y1 = model(_tensor(x1))
    assert _graph_launches() == before + 1
    first = y1.numpy().copy()
    y2 = model(_tensor(x2))
    np.testing.assert_array_equal(y1.numpy(), first)  # a copy, not the static output
    assert not np.array_equal(y2.numpy(), first)


@_cuda
def test_gradients_flow_to_inputs_and_past_them():
    eager_head, head = _mlp(0, n_in=6, n_out=4), _mlp(0, n_in=6, n_out=4)
    eager, model = _mlp(1), _mlp(1)
    graphed = make(model, (_tensor(np.zeros((3, 4)), requires_grad=True),))
    for x in _batches(3, (3, 6), seed=5):
        xe, xg = _tensor(x, requires_grad=True), _tensor(x, requires_grad=True)
        he, hg = eager_head(xe), head(xg)  # computed inputs: the gradient goes on past them
        le = ndl.ops.summation(eager(he) * 2.0)
        lg = ndl.ops.summation(graphed(hg) * 2.0)
        _same(le, lg)
        le.backward()
        lg.backward()
        _same(xe.grad, xg.grad)
        for pe, pg in zip(
            [*eager.parameters(), *eager_head.parameters()],
            [*model.parameters(), *head.parameters()],
        ):
            _same(pe.grad, pg.grad)
            pe.grad = pg.grad = None


@_cuda
def test_graphed_function_with_two_outputs_and_a_closed_over_weight():
    np.random.seed(7)
    w_values = np.random.standard_normal((4, 4)).astype(np.float32)
    w_e, w_g = _tensor(w_values, requires_grad=True), _tensor(w_values, requires_grad=True)

    def step(w):
        def f(x, y):
            h = ndl.ops.tanh(x @ w)
            return h * y, ndl.ops.summation(h, axes=(1,))

        return f

    f_e = step(w_e)
    f_g = make(step(w_g), (_tensor(np.zeros((2, 4)), True), _tensor(np.zeros((2, 4)), True)))
    assert callable(f_g) and not isinstance(f_g, ndl.nn.Module)
    for x, y in zip(_batches(3, (2, 4), seed=8), _batches(3, (2, 4), seed=9)):
        args_e = (_tensor(x, True), _tensor(y, True))
        args_g = (_tensor(x, True), _tensor(y, True))
        (ae, be), (ag, bg) = f_e(*args_e), f_g(*args_g)
        _same(ae, ag)
        _same(be, bg)
        (ndl.ops.summation(ae * ae) + ndl.ops.summation(be)).backward()
        (ndl.ops.summation(ag * ag) + ndl.ops.summation(bg)).backward()
        for te, tg in zip((*args_e, w_e), (*args_g, w_g)):
            _same(te.grad, tg.grad)
        w_e.grad = w_g.grad = None


@_cuda
def test_two_callables_share_a_pool_and_chain():
    eager = (_mlp(0, n_out=6), _mlp(1, n_in=6, n_out=2))
    models = (_mlp(0, n_out=6), _mlp(1, n_in=6, n_out=2))
    pool = ndl.cuda.graph_pool_handle()
    samples = ((_tensor(np.zeros((4, 4))),), (_tensor(np.zeros((4, 6)), True),))
    first, second = make(models, samples, pool=pool)
    assert (first, second) == models
    for x in _batches(3, (4, 4), seed=11):
        ye = eager[1](eager[0](_tensor(x)))
        yg = second(first(_tensor(x)))
        _same(ye, yg)
        ndl.ops.summation(ye * ye).backward()
        ndl.ops.summation(yg * yg).backward()
        for me, mg in zip(eager, models):
            for pe, pg in zip(me.parameters(), mg.parameters()):
                _same(pe.grad, pg.grad)
                pe.grad = pg.grad = None


@_cuda
def test_eval_mode_runs_the_eager_forward():
    eager, model = _mlp(0), _mlp(0)
    model = make(model, (_tensor(np.zeros((2, 4))),))
    model.eval()
    eager.eval()
    x = _batches(1, (2, 4))[0]
    before = _graph_launches()
    y = model(_tensor(x))
    assert _graph_launches() == before  # not replayed
    assert y.op is not None and type(y.op).__name__ != "_GraphedOp"
    _same(y, eager(_tensor(x)))
    model.train()
    y = model(_tensor(x))
    assert _graph_launches() == before + 1
    assert type(y.op).__name__ == "_GraphedOp"


@_cuda
def test_no_grad_call_replays_the_forward_only():
    eager, model = _mlp(0), _mlp(0)
    model = make(model, (_tensor(np.zeros((2, 4))),))
    x = _batches(1, (2, 4))[0]
    with ndl.no_grad():
        y = model(_tensor(x))
    assert y.op is None and not y.requires_grad
    _same(y, eager(_tensor(x)))


@_cuda
def test_unused_parameter_raises_unless_allowed():
    class Partial(ndl.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = ndl.nn.Linear(4, 2, device=ndl.cuda())
            self.unused = ndl.nn.Linear(4, 2, device=ndl.cuda())

        def forward(self, x):
            return self.used(x)

    sample = (_tensor(np.zeros((2, 4))),)
    module = Partial()
    with pytest.raises(RuntimeError, match="allow_unused_input=True"):
        make(module, sample)
    assert all(p.grad is None for p in module.parameters())
    module = make(Partial(), sample, allow_unused_input=True)
    ndl.ops.summation(module(_tensor(np.ones((2, 4))))).backward()
    assert module.used.weight.grad is not None and module.unused.weight.grad is None


@_cuda
def test_parameter_with_a_grad_is_refused():
    model = _mlp(0)
    model.modules[0].weight.grad = ndl.init.zeros(4, 8, device=ndl.cuda())
    with pytest.raises(RuntimeError, match=r"\.grad"):
        make(model, (_tensor(np.zeros((2, 4))),))
    assert model.forward.__func__ is ndl.nn.Sequential.forward  # left as it was


def _bn_net():
    np.random.seed(0)
    dev = ndl.cuda()
    return ndl.nn.Sequential(ndl.nn.Linear(4, 4, device=dev), ndl.nn.BatchNorm1d(4, device=dev))


@_cuda
def test_batch_norm_in_training_mode_updates_its_statistics_each_replay():
    """While capturing, BatchNorm writes its running statistics in place (it rebinds them
    eagerly), so each call's replay moves them as an eager forward does."""
    eager, model = _bn_net(), _bn_net()
    bn = model.modules[1]
    model = make(model, (_tensor(np.zeros((3, 4))),), num_warmup_iters=0)
    for batch in _batches(3, (3, 4), seed=8):
        _same(eager(_tensor(batch)), model(_tensor(batch)))
    _same(eager.modules[1].running_mean, bn.running_mean)
    _same(eager.modules[1].running_var, bn.running_var)


@_cuda
def test_a_module_graphed_in_eval_mode_reads_its_current_buffers():
    eager, model = _bn_net(), _bn_net()
    eager.eval()
    model.eval()
    model = make(model, (_tensor(np.zeros((3, 4))),))
    x = _batches(1, (3, 4), seed=4)[0]
    _same(eager(_tensor(x)), model(_tensor(x)))
    eager.train()
    model.train()  # the eager forward: BatchNorm gives its statistics new arrays
    for batch in _batches(2, (3, 4), seed=6):
        _same(eager(_tensor(batch)), model(_tensor(batch)))
    eager.eval()
    model.eval()
    _same(eager(_tensor(x)), model(_tensor(x)))


@_cuda
def test_bad_calls_of_a_graphed_callable():
    model = make(_mlp(0), (_tensor(np.zeros((2, 4))),))
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        model(_tensor(np.zeros((3, 4))))
    with pytest.raises(TypeError, match="expected 1 argument"):
        model(_tensor(np.zeros((2, 4))), _tensor(np.zeros((2, 4))))
    with pytest.raises(TypeError, match="must be a Tensor"):
        model(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="requires_grad=True"):
        model(_tensor(np.zeros((2, 4)), True) * 2.0)  # its gradient would be lost
    _same(model(_tensor(np.zeros((2, 4)))), _mlp(0)(_tensor(np.zeros((2, 4)))))


@_cuda
def test_bad_arguments_of_make_graphed_callables():
    x = _tensor(np.zeros((2, 4)))
    model = _mlp(0)
    with pytest.raises(TypeError, match="tuple of Tensors"):
        make(model, x)
    with pytest.raises(TypeError, match=r"sample_args\[1\] must be a Tensor"):
        make(model, (x, 3.0))
    with pytest.raises(TypeError, match="tuple of tuples"):
        make((model,), [(x,)])
    with pytest.raises(ValueError, match="2 callables but 1"):
        make((model, _mlp(1)), ((x,),))
    with pytest.raises(TypeError, match="num_warmup_iters"):
        make(model, (x,), num_warmup_iters=1.5)
    with pytest.raises(ValueError, match="num_warmup_iters"):
        make(model, (x,), num_warmup_iters=-1)
    with pytest.raises(TypeError, match="allow_unused_input"):
        make(model, (x,), allow_unused_input=1)
    with pytest.raises(TypeError, match="pool"):
        make(model, (x,), pool=0)
    with pytest.raises(TypeError, match="not callable"):
        make(3, (x,))
    with pytest.raises(TypeError, match="must return a Tensor"):
        make(lambda t: t.numpy(), (x,))
    np.random.seed(0)
    cpu_model = ndl.nn.Linear(4, 3, device=ndl.cpu())
    with pytest.raises(ValueError, match="parameter .* is on cpu"):
        make(cpu_model, (x,))
    assert ndl.cuda.is_current_stream_capturing() is False
    assert all(p.grad is None for p in model.parameters())


@_cuda
def test_dropout_draws_anew_on_each_call():
    """A random draw captured in the forward graph reads the graph's replay counter: each
    call keeps a different half, and the gradient follows that call's mask."""
    np.random.seed(0)
    model = ndl.nn.Sequential(ndl.nn.Linear(4, 64, device=ndl.cuda()), ndl.nn.Dropout(0.5))
    weight = model.modules[0].weight
    plain = model.modules[0]
    graphed = make(model, (_tensor(np.ones((2, 4))),), num_warmup_iters=1)
    x = _tensor(np.ones((2, 4)))
    masks = []
    for _ in range(2):
        out = graphed(x)
        kept = out.numpy() != 0
        masks.append(kept)
        np.testing.assert_allclose(out.numpy()[kept], 2.0 * plain(x).numpy()[kept], rtol=1e-6)
        out.sum().backward()
        expected = np.ones((2, 4), np.float32).T @ (2.0 * kept.astype(np.float32))
        np.testing.assert_allclose(weight.grad.numpy(), expected, rtol=1e-6)
        weight.grad = None
        model.modules[0].bias.grad = None
    assert not np.array_equal(masks[0], masks[1])
    assert 32 < masks[0].sum() < 96


def test_cpu_sample_args_are_a_value_error():
    x = ndl.Tensor(np.zeros((2, 4), np.float32), device=ndl.cpu())
    with pytest.raises(ValueError, match=r"sample_args\[0\] is on cpu\(\).*CUDA"):
        make(lambda t: t * 2.0, (x,))
    with pytest.raises(TypeError, match="tuple of Tensors"):
        make(lambda t: t * 2.0, [x])


@_cuda
def test_needle_graph_mode_and_hooks_see_the_eager_gradients():
    eager, model = _mlp(0), _mlp(0)
    seen = []
    model.modules[0].weight.register_post_accumulate_grad_hook(
        lambda p: seen.append(p.grad.numpy())
    )
    graphed = make(model, (_tensor(np.zeros((2, 4))),))
    x = _batches(1, (2, 4))[0]
    with ndl.autograd.graph_mode("needle"):
        ndl.ops.summation(eager(_tensor(x)) ** 2).backward()
        ndl.ops.summation(graphed(_tensor(x)) ** 2).backward()
    for pe, pg in zip(eager.parameters(), model.parameters()):
        _same(pe.grad, pg.grad)
    assert len(seen) == 1  # once, in the live backward, not in the warm-up or the capture
    np.testing.assert_array_equal(seen[0], eager.modules[0].weight.grad.numpy())


@_cuda
def test_a_closed_over_tensor_with_a_grad_is_refused():
    w = _tensor(np.ones((4, 4)), requires_grad=True)
    w.grad = ndl.init.zeros(4, 4, device=ndl.cuda())
    with pytest.raises(RuntimeError, match=r"reads \(shape \(4, 4\)\) has a \.grad"):
        make(lambda x: x @ w, (_tensor(np.ones((2, 4))),))
