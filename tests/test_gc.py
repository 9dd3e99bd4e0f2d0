"""Garbage-collector semantics of Tensors, TensorTuples and ops.

In "needle" mode backward builds the course's reference cycles (a leaf's grad
is a graph that refers back to the leaf); they must be collectable by the
cyclic collector (complete tp_traverse). In "cycle_free" mode the same graphs
must die by reference counting alone. Every test runs with the collector
disabled (re-enabled in a ``finally``) and collects before taking baselines.
"""

import collections
import gc
import weakref

import numpy as np
import pytest

import needle as ndl

from devices import DEVICES

dev = pytest.mark.parametrize("device", DEVICES)


def arr(seed, shape):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape).astype(np.float32)


def counter():
    return ndl.autograd.TENSOR_COUNTER


def mem(device):
    return ndl.memory.memory_allocated(device)


def live_counts():
    """Live (gc-tracked) needle objects per type."""
    kinds = (ndl.Tensor, ndl.TensorTuple, ndl.autograd.Op)
    return collections.Counter(type(o) for o in gc.get_objects() if isinstance(o, kinds))


def contains(seq, obj):
    return any(x is obj for x in seq)


def reaches(referents, obj):
    """``obj`` is a referent, or an element of a tuple/list referent (inputs may
    be held in a tuple that the node traverses)."""
    return contains(referents, obj) or any(
        isinstance(r, (tuple, list)) and contains(r, obj) for r in referents
    )


# --------------------------------------------------------------------------
# tracking and traversal
# --------------------------------------------------------------------------


@dev
def test_objects_are_gc_tracked(device):
    x = ndl.Tensor(arr(0, (2, 3)), device=device)
    y = ndl.exp(x)
    tt = ndl.make_tuple(x, y)
    assert gc.is_tracked(x)
    assert gc.is_tracked(y)
    assert gc.is_tracked(tt)
    assert gc.is_tracked(y.op)
    assert gc.is_tracked(tt.op)
    assert gc.is_tracked(ndl.ops.EWiseAdd())
    assert gc.is_tracked(ndl.ops.Summation((0,)))


@dev
def test_referents_of_a_node(device):
    with ndl.autograd.graph_mode("needle"):
        a = ndl.Tensor(arr(0, (2, 3)), device=device)
        b = ndl.Tensor(arr(1, (2, 3)), device=device)
        y = a * b
        y.sum().backward()
        assert y.grad is not None
        refs = gc.get_referents(y)
        assert contains(refs, y.op), "op"
        assert reaches(refs, a), "input 0"
        assert reaches(refs, b), "input 1"
        assert contains(refs, y.grad), "grad"
        assert contains(refs, y.cached_data), "cached_data"
        ra = gc.get_referents(a)
        assert contains(ra, a.grad)
        assert contains(ra, a.cached_data)
        tt = ndl.make_tuple(a, y)
        rt = gc.get_referents(tt)
        assert contains(rt, tt.op) and reaches(rt, a) and reaches(rt, y)


def test_referents_include_instance_dict():
    class P(ndl.Tensor):
        pass

    p = P(np.ones(2, dtype=np.float32))
    marker = object()
    p.marker = marker
    refs = gc.get_referents(p)
    assert any((r is marker) or (isinstance(r, dict) and r.get("marker") is marker) for r in refs)


@pytest.mark.parametrize("cls", ["Tensor", "subclass"])
def test_self_cycle_through_dict_is_collected(cls):
    class P(ndl.Tensor):
        pass

    make = ndl.Tensor if cls == "Tensor" else P
    gc.collect()
    base = counter()
    gc.disable()
    try:
        t = make(np.ones(4, dtype=np.float32))
        t.me = t
        r = weakref.ref(t)
        del t
        assert r() is not None
        gc.collect()
        assert r() is None
        assert counter() == base
    finally:
        gc.enable()


# --------------------------------------------------------------------------
# the course's graphs, in both modes
# --------------------------------------------------------------------------


def build_exp(device):
    x = ndl.Tensor(arr(0, (16, 16)), device=device)
    y = ndl.exp(x)
    y.sum().backward()
    del y
    return [x]


def build_mul(device):
    a = ndl.Tensor(arr(0, (16, 16)), device=device)
    b = ndl.Tensor(arr(1, (16, 16)), device=device)
    (a * b).sum().backward()
    return [a, b]


def build_matmul(device):
    a = ndl.Tensor(arr(0, (16, 8)), device=device)
    b = ndl.Tensor(arr(1, (8, 12)), device=device)
    (a @ b).sum().backward()
    return [a, b]


def build_layernorm(device):
    n, d = 6, 8
    x = ndl.Tensor(arr(0, (n, d)), device=device)
    w = ndl.Tensor(arr(1, (n, d)), device=device, requires_grad=False)
    mean = (x.sum((1,)) / d).reshape((n, 1)).broadcast_to((n, d))
    center = x - mean
    var = ((center**2).sum((1,)) / d).reshape((n, 1)).broadcast_to((n, d))
    y = center / ((var + 1e-5) ** 0.5)
    (y * w).sum().backward()
    assert x.grad is not None
    del mean, center, var, y, w
    return [x]


BUILDERS = {
    "exp": build_exp,
    "mul": build_mul,
    "matmul": build_matmul,
    "layernorm": build_layernorm,
}


@pytest.mark.parametrize("graph", list(BUILDERS))
@dev
def test_needle_mode_cycles_need_the_collector(device, graph):
    build = BUILDERS[graph]
    with ndl.autograd.graph_mode("needle"):
        build(device)  # warm-up: anything created once for good exists now
        gc.collect()
        base_mem, base_count = mem(device), counter()
        gc.disable()
        try:
            leaves = build(device)
            for t in leaves:
                assert t.grad is not None
                assert t.grad.op is not None
            refs = [weakref.ref(t) for t in leaves]
            del leaves, t
            for i, r in enumerate(refs):
                assert r() is not None, f"leaf {i} died without the collector: no cycle?"
            assert mem(device) > base_mem
            assert counter() > base_count
            gc.collect()
            for i, r in enumerate(refs):
                assert r() is None, f"leaf {i} survived gc.collect()"
            assert mem(device) == base_mem
            assert counter() == base_count
        finally:
            gc.enable()


@pytest.mark.parametrize("graph", list(BUILDERS))
@dev
def test_cycle_free_mode_graphs_die_by_refcount(device, graph):
    build = BUILDERS[graph]
    with ndl.autograd.graph_mode("cycle_free"):
        build(device)
        gc.collect()
        base_mem, base_count = mem(device), counter()
        gc.disable()
        try:
            leaves = build(device)
            for t in leaves:
                assert t.grad is not None and t.grad.op is None
            refs = [weakref.ref(t) for t in leaves]
            grad_refs = [weakref.ref(t.grad) for t in leaves]
            del leaves, t
            for i, r in enumerate(refs + grad_refs):
                assert r() is None, f"object {i} survived its last reference"
            assert mem(device) == base_mem
            assert counter() == base_count
        finally:
            gc.enable()


@dev
def test_cycle_free_step_by_step_deletion(device):
    with ndl.autograd.graph_mode("cycle_free"):
        gc.collect()
        base_mem = mem(device)
        gc.disable()
        try:
            x = ndl.Tensor(arr(0, (32, 32)), device=device)
            y = ndl.exp(x)
            loss = y.sum()
            loss.backward()
            rx, ry, rl = weakref.ref(x), weakref.ref(y), weakref.ref(loss)
            del x
            assert rx() is not None  # still an input of y
            del y
            assert ry() is not None  # still an input of loss
            del loss
            assert rl() is None and ry() is None and rx() is None
            assert mem(device) == base_mem
        finally:
            gc.enable()


# --------------------------------------------------------------------------
# deep graphs
# --------------------------------------------------------------------------


def test_million_node_chain_deallocates_without_recursion():
    with ndl.autograd.graph_mode("cycle_free"):
        gc.collect()
        base_count, base_mem = counter(), mem(None)
        gc.disable()
        try:
            x = ndl.Tensor(np.array([1.0], dtype=np.float32))
            y = x
            for _ in range(10**6):
                y = y + 1.0
            assert y.op is not None and y.requires_grad
            np.testing.assert_array_equal(y.numpy(), [1000001.0])
            assert counter() == base_count + 10**6 + 1
            del y
            assert counter() == base_count + 1
            del x
            assert counter() == base_count
            assert mem(None) == base_mem
        finally:
            gc.enable()


@pytest.mark.parametrize("mode", ndl.autograd.GRAPH_MODES)
def test_deep_chain_topo_sort_and_backward(mode):
    n = 100_000
    with ndl.autograd.graph_mode(mode):
        gc.collect()
        base_count, base_mem = counter(), mem(None)
        gc.disable()
        try:
            x = ndl.Tensor(np.array([2.0], dtype=np.float32))
            y = x
            for _ in range(n):
                y = y + 1.0
            order = ndl.autograd.find_topo_sort([y])
            assert len(order) == n + 1
            assert order[0] is x
            assert order[-1] is y
            assert order[1].inputs[0] is x
            del order
            y.backward()
            np.testing.assert_array_equal(x.grad.numpy(), [1.0])
            if mode == "cycle_free":
                assert x.grad.op is None
            del x, y
            gc.collect()
            assert counter() == base_count
            assert mem(None) == base_mem
        finally:
            gc.enable()


# --------------------------------------------------------------------------
# training-loop steady state
# --------------------------------------------------------------------------


def _mlp_params(device):
    rng = np.random.default_rng(0)
    x = ndl.Tensor(
        rng.standard_normal((8, 16)).astype(np.float32), device=device, requires_grad=False
    )
    w1 = ndl.Tensor((rng.standard_normal((16, 32)) * 0.25).astype(np.float32), device=device)
    w2 = ndl.Tensor((rng.standard_normal((32, 4)) * 0.25).astype(np.float32), device=device)
    return x, w1, w2


def _mlp_step(x, w1, w2):
    loss = ndl.summation(ndl.relu(x @ w1) @ w2)
    loss.backward()
    return float(loss.numpy()[0])


@dev
def test_cycle_free_training_loop_has_no_growth(device):
    with ndl.autograd.graph_mode("cycle_free"):
        gc.collect()
        gc.disable()
        try:
            x, w1, w2 = _mlp_params(device)
            first = None
            for _ in range(10):
                first = _mlp_step(x, w1, w2)
            counts0 = live_counts()
            mem0, count0 = mem(device), counter()
            for _ in range(1000):
                last = _mlp_step(x, w1, w2)
            assert last == pytest.approx(first, rel=1e-5)  # no update: same loss
            assert live_counts() == counts0
            assert mem(device) == mem0
            assert counter() == count0
            assert w1.grad is not None and w1.grad.op is None
        finally:
            gc.enable()


@dev
def test_needle_mode_training_loop_returns_to_baseline_after_collect(device):
    with ndl.autograd.graph_mode("needle"):
        x, w1, w2 = _mlp_params(device)
        _mlp_step(x, w1, w2)
        del x, w1, w2
        gc.collect()
        counts0 = live_counts()
        mem0, count0 = mem(device), counter()
        gc.disable()
        try:
            x, w1, w2 = _mlp_params(device)
            for _ in range(50):
                _mlp_step(x, w1, w2)
            assert w1.grad.op is not None
            del x, w1, w2
            assert mem(device) > mem0  # the cycles hold memory until collected
            gc.collect()
            assert live_counts() == counts0
            assert mem(device) == mem0
            assert counter() == count0
        finally:
            gc.enable()
