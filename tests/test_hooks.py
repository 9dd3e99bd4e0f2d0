"""Gradient hooks (register_hook, register_post_accumulate_grad_hook, RemovableHandle), .grad
accumulation and end-of-backward callbacks (_queue_callback), checked against PyTorch where
PyTorch defines the behaviour and against the documented engine semantics elsewhere."""

import gc
import sys
import threading
import weakref

import numpy as np
import pytest

import needle as ndl
from needle.utils import checkpoint

from devices import DEVICES

MODES = ndl.autograd.GRAPH_MODES
PARAMS = ("W1", "b1", "W2", "b2")
dev = pytest.mark.parametrize("device", DEVICES)
mode_param = pytest.mark.parametrize("mode", MODES)
dtype_param = pytest.mark.parametrize("dtype", ["float32", "float64"])


class HookError(Exception):
    """What the raising hooks below raise: no other code can raise it by accident."""


def _arrays(dtype="float32"):
    rng = np.random.default_rng(7)
    shapes = dict(x=(4, 3), W1=(3, 5), b1=(1, 5), W2=(5, 2), b2=(1, 2))
    out = {n: rng.uniform(-1.0, 1.0, size=s).astype(dtype) for n, s in shapes.items()}
    out["w"] = rng.uniform(0.5, 1.5, size=(4, 2)).astype(dtype)  # a seed that is not all ones
    return out


def _forward(p, x, w, relu):
    """A 2-layer MLP with nn.Linear's layout (x @ W + b broadcast), written once for both
    libraries: returns the non-leaf nodes by name (h with retain_grad) and the scalar loss."""
    z = x @ p["W1"] + p["b1"].broadcast_to((4, 5))
    h = relu(z)
    h.retain_grad()
    out = h @ p["W2"] + p["b2"].broadcast_to((4, 2))
    loss = (out * w).sum()
    return dict(loss=loss, z=z, h=h, out=out), loss


def _needle_mlp(device, dtype="float32"):
    a = _arrays(dtype)
    p = {n: ndl.Tensor(a[n], device=device, dtype=dtype) for n in PARAMS}
    x = ndl.Tensor(a["x"], device=device, dtype=dtype, requires_grad=False)
    w = ndl.Tensor(a["w"], device=device, dtype=dtype, requires_grad=False)
    nodes, loss = _forward(p, x, w, ndl.ops.relu)
    return p, nodes, loss


def _torch_mlp(torch, dtype="float32"):
    a = _arrays(dtype)
    p = {n: torch.tensor(a[n], requires_grad=True) for n in PARAMS}
    nodes, loss = _forward(p, torch.tensor(a["x"]), torch.tensor(a["w"]), torch.relu)
    return p, nodes, loss


def _np(t):
    return t.numpy().copy() if isinstance(t, ndl.Tensor) else t.detach().numpy().copy()


def _record(p, nodes, events, scale=None):
    """Hooks on every parameter (both kinds) and every intermediate node that append
    (kind, name, gradient received) to events; with scale, the hook of that name returns
    its gradient times 2."""
    for name, t in list(p.items()) + list(nodes.items()):

        def pre(g, name=name):
            events.append(("pre", name, _np(g)))
            return g * 2.0 if name == scale else None

        t.register_hook(pre)
    for name, t in p.items():
        t.register_post_accumulate_grad_hook(
            lambda t, name=name: events.append(("post", name, _np(t.grad)))
        )


def _assert_events_equal(ours, theirs):
    assert [e[:2] for e in ours] == [e[:2] for e in theirs]
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a[2], b[2], rtol=1e-5, atol=1e-6, err_msg=str(a[:2]))


# ---- against PyTorch -------------------------------------------------------------------------


@dev
@mode_param
@dtype_param
@pytest.mark.parametrize("scale", [None, "loss", "h", "W2"])
def test_hook_sequence_and_gradients_match_torch(device, mode, dtype, scale):
    """The exact sequence of hook calls and the gradient each receives are PyTorch's; with a
    hook that doubles a gradient, what it changes (.grad, everything upstream) is too.

    The order is compared exactly because it was found to agree: PyTorch runs a leaf's
    AccumulateGrad (its hooks) as soon as it is ready (those nodes have the highest
    priority) and the other nodes latest-created first, which for this model is the order
    of needle's reverse topological walk. Nothing here depends on an arbitrary tie."""
    torch = pytest.importorskip("torch")
    ours, theirs = [], []
    with ndl.autograd.graph_mode(mode):
        p, nodes, loss = _needle_mlp(device, dtype)
        _record(p, nodes, ours, scale)
        loss.backward()
    tp, tnodes, tloss = _torch_mlp(torch, dtype)
    _record(tp, tnodes, theirs, scale)
    tloss.backward()
    assert [" ".join(e[:2]) for e in ours] == (
        "pre loss,pre out,pre b2,post b2,pre W2,post W2,pre h,pre z,pre b1,post b1,pre W1,post W1"
    ).split(",")
    _assert_events_equal(ours, theirs)
    for n in PARAMS:
        assert p[n].grad.dtype == dtype
        np.testing.assert_allclose(p[n].grad.numpy(), _np(tp[n].grad), rtol=1e-5, atol=1e-6)
    # retain_grad's .grad is the gradient after the hooks, as in PyTorch
    np.testing.assert_allclose(nodes["h"].grad.numpy(), _np(tnodes["h"].grad), rtol=1e-5)


@dev
@mode_param
def test_reused_tensor_and_hook_chain_match_torch(device, mode):
    """x is used three times: its hooks run once, on the summed gradient. Its three grad
    hooks run in registration order, each on what the one before returned."""
    torch = pytest.importorskip("torch")
    a = _arrays()["x"]
    ours, theirs = [], []
    for lib, ev in (("ndl", ours), ("torch", theirs)):
        x = ndl.Tensor(a, device=device) if lib == "ndl" else torch.tensor(a, requires_grad=True)
        x.register_hook(lambda g, ev=ev: ev.append(("first", "x", _np(g))) or g * 2.0)
        x.register_hook(lambda g, ev=ev: ev.append(("second", "x", _np(g))))
        x.register_hook(lambda g, ev=ev: ev.append(("third", "x", _np(g))) or g + 1.0)
        x.register_post_accumulate_grad_hook(lambda t, ev=ev: ev.append(("post", "x", _np(t.grad))))
        with ndl.autograd.graph_mode(mode):
            (x * x * 3.0 + x).sum().backward()
    _assert_events_equal(ours, theirs)
    assert [e[0] for e in ours] == ["first", "second", "third", "post"]
    np.testing.assert_allclose(ours[-1][2], (6 * a + 1) * 2 + 1, rtol=1e-6)


@dev
@mode_param
def test_optimizer_step_in_post_accumulate_hook_matches_torch(device, mode):
    """PyTorch's "optimizer in backward" pattern: each parameter takes its SGD step and
    drops its .grad in its post hook, once its gradient is complete."""
    torch = pytest.importorskip("torch")

    def step(t):
        t.data = t.data - 0.1 * t.grad.detach()
        t.grad = None

    def torch_step(t):
        with torch.no_grad():
            t -= 0.1 * t.grad
        t.grad = None

    with ndl.autograd.graph_mode(mode):
        p, _, loss = _needle_mlp(device)
        for t in p.values():
            t.register_post_accumulate_grad_hook(step)
        loss.backward()
    tp, _, tloss = _torch_mlp(torch)
    for t in tp.values():
        t.register_post_accumulate_grad_hook(torch_step)
    tloss.backward()
    for n in PARAMS:
        assert p[n].grad is None and tp[n].grad is None
        np.testing.assert_allclose(p[n].numpy(), _np(tp[n]), rtol=1e-5, atol=1e-6)


@dev
def test_gradients_held_by_hooks_keep_their_values(device):
    """cycle_free adds into .grad in place only when nothing else holds it, so what a hook
    kept from the first backward is unchanged by the second. (PyTorch adds in place even
    then; needle documents the difference.)"""
    kept = []
    p, _, loss = _needle_mlp(device)
    p["W1"].register_hook(lambda g: kept.append((g, _np(g))))
    p["W1"].register_post_accumulate_grad_hook(lambda t: kept.append((t.grad, _np(t.grad))))
    loss.backward()
    loss.backward()
    assert len(kept) == 4
    for tensor, value in kept:
        np.testing.assert_array_equal(tensor.numpy(), value)
    np.testing.assert_allclose(p["W1"].grad.numpy(), 2 * kept[0][1], rtol=1e-6)


# ---- removal ---------------------------------------------------------------------------------


@dev
@mode_param
def test_remove_stops_calls_and_is_idempotent(device, mode):
    calls = []
    with ndl.autograd.graph_mode(mode):
        p, nodes, loss = _needle_mlp(device)
        pre = p["W1"].register_hook(lambda g: calls.append("pre"))
        post = p["W1"].register_post_accumulate_grad_hook(lambda t: calls.append("post"))
        on_h = nodes["h"].register_hook(lambda g: calls.append("h"))
        assert isinstance(pre, ndl.autograd.RemovableHandle) and isinstance(pre.id, int)
        assert len({pre.id, post.id, on_h.id}) == 3
        loss.backward()
        assert calls == ["h", "pre", "post"]
        for handle in (pre, post, on_h):
            handle.remove()
            handle.remove()  # a second remove does nothing, as in PyTorch
        loss.backward()
        assert calls == ["h", "pre", "post"]
        with p["b1"].register_hook(lambda g: calls.append("in with")):
            loss.backward()
        loss.backward()
    assert calls == ["h", "pre", "post", "in with"]


@dev
@mode_param
def test_hooks_change_during_backward(device, mode):
    """A hook on W2 (reached before h and W1) removes h's hook: not called. On b1, hook A
    removes B (registered after it) and adds C: the per-node snapshot runs B, not C, in
    this backward; the next runs A and C. A hook added on W1 from W2's hook runs at once."""
    calls = []
    with ndl.autograd.graph_mode(mode):
        p, nodes, loss = _needle_mlp(device)
        on_h = nodes["h"].register_hook(lambda g: calls.append("h"))
        handles = {}

        def on_w2(g):
            calls.append("W2")
            on_h.remove()
            if "W1" not in handles:
                handles["W1"] = p["W1"].register_hook(lambda g: calls.append("W1"))

        def a(g):
            calls.append("A")
            handles["B"].remove()
            if "C" not in handles:
                handles["C"] = p["b1"].register_hook(lambda g: calls.append("C"))

        p["W2"].register_hook(on_w2)
        p["b1"].register_hook(a)
        handles["B"] = p["b1"].register_hook(lambda g: calls.append("B"))
        loss.backward()
        assert calls == ["W2", "A", "B", "W1"]
        calls.clear()
        loss.backward()
        assert calls == ["W2", "A", "C", "W1"]


# ---- accumulation into .grad -----------------------------------------------------------------


@dev
@mode_param
def test_two_backwards_accumulate_or_replace_like_torch(device, mode):
    """cycle_free: a second backward adds into leaves and retain_grad nodes (PyTorch with
    retain_graph=True, as needle graphs are always retained); needle mode replaces."""
    torch = pytest.importorskip("torch")
    with ndl.autograd.graph_mode(mode):
        p, nodes, loss = _needle_mlp(device)
        loss.backward()
        loss.backward()
    tp, tnodes, tloss = _torch_mlp(torch)
    tloss.backward(retain_graph=True)
    if mode == "cycle_free":
        tloss.backward()
    for n in PARAMS:
        np.testing.assert_allclose(p[n].grad.numpy(), _np(tp[n].grad), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nodes["h"].grad.numpy(), _np(tnodes["h"].grad), rtol=1e-5)


@dev
@mode_param
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_create_graph_accumulates_recorded_gradients_like_torch(device, mode):
    """Hooks receive recorded gradients; two backwards add (cycle_free) or replace (needle)
    them into a .grad that can be differentiated again, as PyTorch's."""
    torch = pytest.importorskip("torch")
    a = _arrays()["x"]
    received = []
    with ndl.autograd.graph_mode(mode):
        x = ndl.Tensor(a, device=device)
        x.register_hook(lambda g: received.append(g.op is not None and g.requires_grad))
        y = (x * x * x).sum()
        y.backward(create_graph=True)
        y.backward(create_graph=True)
        assert received == [True, True]
        g = x.grad
        assert g.op is not None
        x.grad = None
        g.sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    ty = (tx * tx * tx).sum()
    for _ in range(2 if mode == "cycle_free" else 1):
        ty.backward(create_graph=True)
    np.testing.assert_allclose(g.numpy(), _np(tx.grad), rtol=1e-5)
    (second,) = torch.autograd.grad(tx.grad.sum(), tx)
    np.testing.assert_allclose(x.grad.numpy(), _np(second), rtol=1e-5)


# ---- checkpointed segments -------------------------------------------------------------------


@dev
@mode_param
def test_checkpoint_runs_hooks_once_with_the_total_gradient(device, mode):
    """W is used inside a checkpointed segment and after it: its hooks run once per
    backward (not in the recomputation's inner backward) with the summed gradient, and it
    and x get what they get without checkpointing."""
    rng = np.random.default_rng(3)
    xa, wa = rng.uniform(-1, 1, (4, 4)), rng.uniform(-1, 1, (4, 4))
    results = []
    for use_checkpoint in (False, True):
        events = []
        with ndl.autograd.graph_mode(mode):
            x = ndl.Tensor(xa, device=device, dtype="float32")
            W = ndl.Tensor(wa, device=device, dtype="float32")

            def segment(x):
                return ndl.ops.relu(x @ W)

            y = checkpoint(segment, x) if use_checkpoint else segment(x)
            loss = (y @ W).sum()
            for name, t in (("x", x), ("W", W)):
                t.register_hook(lambda g, name=name: events.append(("pre", name, _np(g))))
                t.register_post_accumulate_grad_hook(
                    lambda t, name=name: events.append(("post", name, _np(t.grad)))
                )
            loss.backward()
            results.append((events, _np(x.grad), _np(W.grad)))
    (plain, px, pw), (ckpt, cx, cw) = results
    names = [e[:2] for e in ckpt]
    assert sorted(names) == sorted([("pre", "x"), ("post", "x"), ("pre", "W"), ("post", "W")])
    assert names.index(("pre", "W")) < names.index(("post", "W"))
    assert names.index(("pre", "x")) < names.index(("post", "x"))
    by_name = {e[:2]: e[2] for e in plain}
    for kind, name, g in ckpt:
        np.testing.assert_allclose(g, by_name[kind, name], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cx, px, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cw, pw, rtol=1e-5, atol=1e-6)


# ---- a hook that raises ----------------------------------------------------------------------


@dev
@mode_param
def test_raising_hook_leaves_the_documented_state(device, mode):
    """h's hook raises after b2 and W2 are reached: they keep this backward's gradient
    (added to their .grad in cycle_free, replacing it in needle mode), W1 and b1 keep their
    old .grad, a callback queued before is dropped, and the graph still works."""
    ran = []
    with ndl.autograd.graph_mode(mode):
        p, nodes, loss = _needle_mlp(device)
        loss.backward()
        g = {n: p[n].grad.numpy().copy() for n in PARAMS}
        old = {}
        for n in PARAMS:
            old[n] = ndl.Tensor(
                np.full(p[n].shape, 0.5, np.float32), device=device, requires_grad=False
            )
            p[n].grad = old[n]
        queue = p["b2"].register_post_accumulate_grad_hook(
            lambda t: ndl.autograd._queue_callback(lambda: ran.append("queued"))
        )

        def boom(grad):
            raise HookError("from h")

        failing = nodes["h"].register_hook(boom)
        with pytest.raises(HookError, match="from h"):
            loss.backward()
        reached = 0.5 + g["b2"] if mode == "cycle_free" else g["b2"]
        np.testing.assert_allclose(p["b2"].grad.numpy(), reached, rtol=1e-6)
        reached = 0.5 + g["W2"] if mode == "cycle_free" else g["W2"]
        np.testing.assert_allclose(p["W2"].grad.numpy(), reached, rtol=1e-6)
        assert p["W1"].grad is old["W1"] and p["b1"].grad is old["b1"]
        np.testing.assert_array_equal(old["W1"].numpy(), np.full((3, 5), 0.5, np.float32))
        assert ran == []
        with pytest.raises(RuntimeError, match="no backward"):
            ndl.autograd._queue_callback(lambda: None)  # the backward's depth was restored
        failing.remove()
        queue.remove()
        for n in PARAMS:
            p[n].grad = None
        loss.backward()
        assert ran == []  # dropped, not carried to the next backward
        for n in PARAMS:
            np.testing.assert_allclose(p[n].grad.numpy(), g[n], rtol=1e-6)


# ---- _queue_callback -------------------------------------------------------------------------


@dev
@mode_param
def test_callbacks_run_once_in_order_after_every_grad_is_written(device, mode):
    seen = []
    with ndl.autograd.graph_mode(mode):
        p, nodes, loss = _needle_mlp(device)

        def callback(name):
            # every .grad is written by now, W1's (the last leaf reached) included
            seen.append((name, all(p[n].grad is not None for n in PARAMS)))
            if name == "first":
                ndl.autograd._queue_callback(lambda: seen.append(("queued by a callback", True)))

        p["b2"].register_hook(lambda g: ndl.autograd._queue_callback(lambda: callback("first")))
        nodes["h"].register_hook(lambda g: ndl.autograd._queue_callback(lambda: callback("second")))
        loss.backward()
        assert seen == [("first", True), ("second", True), ("queued by a callback", True)]
        seen.clear()
        loss.backward()  # queued once per backward: the list was emptied
        assert [s[0] for s in seen] == ["first", "second", "queued by a callback"]


@dev
@mode_param
def test_nested_backward_callbacks_run_at_the_outermost_end(device, mode):
    """A backward run from inside a hook (a nested one) does not run the callbacks: they
    all wait for the outer backward's end."""
    order = []
    with ndl.autograd.graph_mode(mode):
        p, nodes, loss = _needle_mlp(device)
        q, _, inner_loss = _needle_mlp(device)
        q["W1"].register_hook(
            lambda g: ndl.autograd._queue_callback(lambda: order.append("inner cb"))
        )

        def run_inner(g):
            ndl.autograd._queue_callback(lambda: order.append("outer cb"))
            inner_loss.backward()
            order.append("inner backward returned")

        p["W2"].register_hook(run_inner)
        p["W1"].register_post_accumulate_grad_hook(lambda t: order.append("outer W1 done"))
        loss.backward()
    assert order == ["inner backward returned", "outer W1 done", "outer cb", "inner cb"]


def test_callback_errors():
    """Outside a backward: RuntimeError; a non-callable: TypeError; a callback that raises
    makes backward raise, and the ones after it do not run."""
    with pytest.raises(RuntimeError, match="no backward is running"):
        ndl.autograd._queue_callback(lambda: None)
    ran, p, _, loss = [], *_needle_mlp(ndl.cpu())

    def boom():
        raise HookError("from a callback")

    def queue(g):
        with pytest.raises(TypeError, match="callback must be callable, got int"):
            ndl.autograd._queue_callback(42)
        ndl.autograd._queue_callback(boom)
        ndl.autograd._queue_callback(lambda: ran.append("after"))

    p["W1"].register_hook(queue)
    with pytest.raises(HookError, match="from a callback"):
        loss.backward()
    assert ran == [] and p["W1"].grad is not None  # the walk itself had finished
    with pytest.raises(RuntimeError, match="no backward"):
        ndl.autograd._queue_callback(lambda: None)


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [None, 3, "hook"])
def test_non_callable_hooks_raise_type_error(fn):
    t = ndl.Tensor(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="register_hook: the hook must be callable"):
        t.register_hook(fn)
    with pytest.raises(TypeError, match="register_post_accumulate_grad_hook: .*callable"):
        t.register_post_accumulate_grad_hook(fn)


def test_hooks_on_tensors_that_do_not_qualify():
    const = ndl.Tensor(np.ones(3, np.float32), requires_grad=False)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        const.register_hook(lambda g: None)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        const.register_post_accumulate_grad_hook(lambda t: None)
    _, nodes, _ = _needle_mlp(ndl.cpu())
    with pytest.raises(RuntimeError, match="non-leaf"):
        nodes["h"].register_post_accumulate_grad_hook(lambda t: None)


@dev
@mode_param
@pytest.mark.parametrize(
    "bad, error, match",
    [
        ("shape", RuntimeError, "changed the size"),
        ("dtype", RuntimeError, "changed the dtype"),
        ("ndarray", TypeError, "returned a numpy.ndarray, not a Tensor or None"),
        ("float", TypeError, "returned a float, not a Tensor or None"),
    ],
)
def test_grad_hook_bad_return_values(device, mode, bad, error, match):
    """A replacement of another shape or dtype, or a non-Tensor, ends the backward; W1's
    .grad (the hook is on it) is left as it was."""

    def hook(g):
        if bad == "shape":
            return ndl.Tensor(np.zeros((5, 3), np.float32), device=device)
        if bad == "dtype":
            return ndl.Tensor(np.zeros((3, 5)), device=device, dtype="float64")
        return g.numpy() if bad == "ndarray" else 0.0

    with ndl.autograd.graph_mode(mode):
        p, _, loss = _needle_mlp(device)
        p["W1"].register_hook(hook)
        with pytest.raises(error, match=match):
            loss.backward()
        assert p["W1"].grad is None


@dev
@mode_param
@pytest.mark.parametrize("bad, error", [("tensor", TypeError), ("shapes", RuntimeError)])
def test_tensor_tuple_hook_bad_replacement_is_refused(device, mode, bad, error):
    """The replacement check holds for a TensorTuple node too: a hook that returns a Tensor
    for its gradient, or a TensorTuple of other shapes, is refused by name, as a hook on a
    Tensor is (not by an op's gradient further on)."""
    with ndl.autograd.graph_mode(mode):
        x = ndl.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
        parts = ndl.ops.split(x, axis=0)
        wrong = ndl.Tensor(np.ones(3 if bad == "tensor" else 2, np.float32), device=device)
        wrong = wrong if bad == "tensor" else ndl.ops.make_tuple(wrong, wrong)
        parts.register_hook(lambda g: wrong.detach() if bad == "tensor" else wrong)
        with pytest.raises(error, match="hook"):
            (parts[0] * parts[1]).sum().backward()
        assert x.grad is None


@dev
@mode_param
def test_post_hook_returning_a_value_raises(device, mode):
    with ndl.autograd.graph_mode(mode):
        p, _, loss = _needle_mlp(device)
        p["b2"].register_post_accumulate_grad_hook(lambda t: t.grad)
        with pytest.raises(RuntimeError, match="must return None"):
            loss.backward()
        assert p["b2"].grad is not None  # written before the hook ran
        assert p["W1"].grad is None  # not reached


# ---- garbage collection ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["grad", "post"])
def test_hook_closure_cycle_is_collected(kind):
    """A hook that refers to its own tensor is a cycle through the tensor's hook dict,
    which the collector traverses and frees (the handle is dropped too)."""

    def make():
        t = ndl.Tensor(np.ones(3, np.float32))
        if kind == "grad":
            t.register_hook(lambda g: t.grad and None)
        else:
            t.register_post_accumulate_grad_hook(lambda arg: t.grad and None)
        return weakref.ref(t)

    gc.disable()  # no automatic collection between the two checks
    try:
        ref = make()
        assert ref() is not None  # a cycle: reference counting alone does not free it
    finally:
        gc.enable()
    gc.collect()
    assert ref() is None


class _Hook:
    """A weakly referenceable hook that returns None (and may keep its handle)."""

    def __call__(self, arg):
        return None


def test_handle_keeps_neither_tensor_nor_itself_alive():
    """A handle outlives its tensor (remove() then does nothing); a hook that refers to its
    own handle is a cycle the collector frees; a self-removing hook runs once."""
    t = ndl.Tensor(np.ones(3, np.float32))
    handle = t.register_hook(lambda g: None)
    ref = weakref.ref(t)
    del t
    assert ref() is None
    handle.remove()
    hook = _Hook()
    hook.handle = ndl.Tensor(np.ones(3, np.float32)).register_hook(hook)
    ref = weakref.ref(hook)
    del hook
    gc.collect()
    assert ref() is None
    t, calls = ndl.Tensor(np.ones(3, np.float32)), []
    once = t.register_post_accumulate_grad_hook(lambda t: calls.append(1) or once.remove())
    for _ in range(2):
        (t * 2.0).sum().backward()
    assert calls == [1]


def test_register_remove_loop_keeps_no_references():
    t = ndl.Tensor(np.ones(3, np.float32))
    before = sys.getrefcount(t)
    refs = []
    for k in range(1000):
        fn = _Hook()
        refs.append(weakref.ref(fn))
        register = t.register_hook if k % 2 else t.register_post_accumulate_grad_hook
        with register(fn):
            pass
        del fn, register  # a bound method holds the tensor
    # removal drops the hook at once (no collection needed) and the tensor gains nothing
    assert all(r() is None for r in refs)
    assert sys.getrefcount(t) == before
    calls = []
    t.register_hook(lambda g: calls.append(1))
    (t * 2.0).sum().backward()
    assert calls == [1]  # only the one live hook ran


# ---- threads ---------------------------------------------------------------------------------


def _in_thread(target, meanwhile=lambda: None):
    """Runs target in a new thread and meanwhile() in this one; returns what target
    returned, re-raising what it raised."""
    box = {}

    def run():
        try:
            box["value"] = target()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    try:
        meanwhile()
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_callbacks_and_backward_state_are_per_thread():
    """A hook in another thread's backward queues a callback that runs in that thread when
    it ends; while that backward is running, this thread is in none."""
    entered, release = threading.Event(), threading.Event()
    log = []

    def work():
        p, _, loss = _needle_mlp(ndl.cpu())

        def hook(g):
            try:
                ndl.autograd._queue_callback(lambda: log.append(("cb", threading.get_ident())))
            finally:
                entered.set()
                release.wait(60)  # a guard against a hang, not a timing assertion

        p["W1"].register_hook(hook)
        loss.backward()
        log.append(("returned", threading.get_ident()))
        return threading.get_ident()

    def meanwhile():
        try:
            assert entered.wait(60)
            with pytest.raises(RuntimeError, match="no backward is running"):
                ndl.autograd._queue_callback(lambda: None)
        finally:
            release.set()

    ident = _in_thread(work, meanwhile)
    assert ident != threading.get_ident()
    assert log == [("cb", ident), ("returned", ident)]


def test_paused_hooks_are_per_thread():
    def backward_with_hook():
        calls = []
        p, _, loss = _needle_mlp(ndl.cpu())
        p["W1"].register_hook(lambda g: calls.append("pre"))
        p["W1"].register_post_accumulate_grad_hook(lambda t: calls.append("post"))
        loss.backward()
        return calls

    with ndl.autograd._hooks_paused():
        assert backward_with_hook() == []
        assert _in_thread(backward_with_hook) == ["pre", "post"]
    assert backward_with_hook() == ["pre", "post"]

    def paused_in_thread():
        with ndl.autograd._hooks_paused():
            return backward_with_hook()

    assert _in_thread(paused_in_thread) == []
    assert backward_with_hook() == ["pre", "post"]
