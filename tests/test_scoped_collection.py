"""The scoped collection (needle_c/memory/scoped.c): Python's cycle algorithm over needle's own
objects. For random graphs it frees exactly the needle objects ``gc.collect()`` would when every
cycle is made of needle objects, a subset when the graph also hangs from lists, dicts,
closures, frames, ``__dict__`` attributes and bound methods, and never anything reachable;
finalizers, weakref callbacks and gc callbacks that allocate, a 10^6-node chain, a collection
requested during a collection, and the course loop under the pressure ladder.
"""

import gc
import random
import subprocess
import sys
import time
import weakref

import numpy as np
import pytest
from garbage import needle_cycle

import needle as ndl
import needle_c as _c
from needle import memory

MiB = 2**20
pytestmark = pytest.mark.skipif(
    not _c._scoped_info()["supported"], reason="scoped collection unsupported (free-threaded)"
)
NEEDLE_TYPES = (ndl.autograd.Value, ndl.autograd.Op)


@pytest.fixture(autouse=True)
def collector_off():
    """Every test starts from a collected heap, with the collector disabled and the CPU's
    cache empty (so a limit set above memory_allocated() is above what is reserved, whatever
    earlier tests left cached); restores the collector."""
    thresholds = gc.get_threshold()
    gc.collect()
    memory.empty_cache("cpu")
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.set_threshold(*thresholds)
        gc.collect()


class Double(ndl.autograd.TensorOp):
    """A Python op: 2a."""

    def compute(self, a):
        return a * 2.0

    def gradient(self, out_grad, node):
        return out_grad * 2.0


class Attr(ndl.Tensor):
    """A Tensor subclass (instances have a __dict__ of their own attributes)."""


def _leaf(rng, shape=(3, 3)):
    data = rng.standard_normal(shape).astype(np.float32)
    kind = rng.integers(3)
    if kind == 0:
        return ndl.nn.Parameter(ndl.Tensor(data))
    return ndl.Tensor(data, requires_grad=bool(kind == 1))


def _random_graph(seed, mode):
    """A random graph in graph mode `mode`: built-in and Python ops, TensorTuples, Parameters,
    retained grads, a backward pass, and a few needle-only cycles made by hand (grad set to a
    descendant). Returns every node made."""
    rng = np.random.default_rng(seed)
    nodes = [_leaf(rng) for _ in range(3)]
    with ndl.autograd.graph_mode(mode):
        for _ in range(int(rng.integers(5, 25))):
            tensors = [n for n in nodes if isinstance(n, ndl.Tensor)]
            a = tensors[int(rng.integers(len(tensors)))]
            b = tensors[int(rng.integers(len(tensors)))]
            choice = int(rng.integers(7))
            if choice == 0:
                y = a + b
            elif choice == 1:
                y = a * b
            elif choice == 2:
                y = Double()(a)
            elif choice == 3:
                y = (a @ b).relu()
            elif choice == 4:
                t = ndl.ops.make_tuple(a, b)
                nodes.append(t)
                y = ndl.ops.tuple_get_item(t, int(rng.integers(2)))
            elif choice == 5:
                y = ndl.ops.split(ndl.ops.stack([a, b], 0), 0)[0]
            else:
                y = a.exp() - b
            if rng.integers(4) == 0:
                y.retain_grad()
            nodes.append(y)
        out = nodes[-1].sum()
        nodes.append(out)
        if out.requires_grad:  # backward() on a graph-less output is an error
            out.backward()
    tensors = [n for n in nodes if isinstance(n, ndl.Tensor)]
    for _ in range(int(rng.integers(3))):  # needle-only cycles: a node's grad is a descendant
        i, j = sorted(int(k) for k in rng.integers(len(tensors), size=2))
        tensors[i].grad = tensors[j]
    return nodes


def _needle_objects(nodes):
    """Every needle object reachable from nodes through any object (BFS over referents)."""
    seen, todo, found = set(), list(nodes), []
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, type):
            continue
        seen.add(id(o))
        if isinstance(o, NEEDLE_TYPES):
            found.append(o)
        todo.extend(gc.get_referents(o))
    return found


def _snapshot(objs):
    """What must not change in a reachable object: its op, inputs and data."""
    out = []
    for o in objs:
        if isinstance(o, ndl.autograd.Value):
            data = o.cached_data
            arrays = data if isinstance(data, tuple) else () if data is None else (data,)
            out.append((o.op, tuple(o.inputs), [a.numpy().copy() for a in arrays]))
        else:
            out.append(None)
    return out


def _check_intact(objs, before):
    for o, snap in zip(objs, before):
        if snap is None:
            continue
        op, inputs, data = snap
        assert o.op is op
        assert tuple(o.inputs) == inputs
        now = o.cached_data
        now = now if isinstance(now, tuple) else () if now is None else (now,)
        assert len(now) == len(data)
        for a, b in zip(now, data):
            np.testing.assert_array_equal(a.numpy(), b)


def _dead(refs):
    return sum(r() is None for r in refs)


@pytest.mark.parametrize("mode", ndl.autograd.GRAPH_MODES)
@pytest.mark.parametrize("seed", range(12))
def test_frees_exactly_what_gc_frees_when_cycles_are_needle_only(seed, mode):
    nodes = _random_graph(seed, mode)
    refs = [weakref.ref(o) for o in _needle_objects(nodes)]
    keep = random.Random(seed).sample(nodes, k=2)  # roots held by the test
    kept = _needle_objects(keep)
    snap = _snapshot(kept)
    del nodes
    garbage_now = _dead(refs)  # freed by reference counting alone
    r = memory.collect("needle")
    assert r["ran"]
    freed_scoped = _dead(refs) - garbage_now
    assert r["objects"] >= freed_scoped
    _check_intact(kept, snap)
    gc.collect()
    assert _dead(refs) - garbage_now == freed_scoped  # gc.collect finds no needle garbage left
    _check_intact(kept, snap)


def _hang(rng, nodes, owners):
    """Hangs random nodes from non-needle objects: some of them garbage cycles only
    gc.collect() frees (a self-referencing list or dict, a closure cell, a generator frame, a
    bound method in a cycle), some __dict__ attributes between nodes."""
    for _ in range(6):
        t = nodes[int(rng.integers(len(nodes)))]
        kind = int(rng.integers(6))
        if kind == 0:
            cycle = [t]
            cycle.append(cycle)
        elif kind == 1:
            cycle = {"t": t}
            cycle["self"] = cycle
        elif kind == 2:

            def closure(t=t):
                return t, closure

            cycle = closure
        elif kind == 3:

            def frame(t):
                me = yield
                yield t, me

            cycle = frame(t)
            next(cycle)
            cycle.send(cycle)
        elif kind == 4:
            holder = Attr(np.ones((2,), dtype=np.float32))
            holder.target = t
            holder.bound = holder.numpy  # a bound method: a cycle through the holder
            cycle = holder
        else:
            other = nodes[int(rng.integers(len(nodes)))]
            if isinstance(other, ndl.autograd.Value) and not isinstance(
                other, ndl.autograd.TensorTuple
            ):
                other.hang = t  # an attribute in the instance __dict__
            continue
        owners.append(cycle)


@pytest.mark.parametrize("mode", ndl.autograd.GRAPH_MODES)
@pytest.mark.parametrize("seed", range(12))
def test_frees_a_subset_when_the_graph_hangs_from_other_objects(seed, mode):
    rng = np.random.default_rng(1000 + seed)
    nodes = _random_graph(seed, mode)
    owners = []
    _hang(rng, nodes, owners)
    refs = [weakref.ref(o) for o in _needle_objects(nodes)]
    keep = [nodes[0], owners[0] if owners else nodes[1]]
    kept = _needle_objects(keep)
    snap = _snapshot(kept)
    del nodes, owners
    dead0 = _dead(refs)
    memory.collect("needle")
    freed_scoped = _dead(refs) - dead0
    _check_intact(kept, snap)
    gc.collect()
    freed_all = _dead(refs) - dead0
    assert freed_scoped <= freed_all
    _check_intact(kept, snap)


@pytest.mark.parametrize("seed", range(6))
def test_nothing_reachable_is_freed_under_frequent_collections(seed):
    """With Python's collector running every allocation (threshold 1) beside the scoped one,
    every node reachable from what the test holds keeps its identity, fields and values."""
    gc.enable()
    gc.set_threshold(1)
    rng = np.random.default_rng(seed)
    nodes = _random_graph(seed, "needle")
    holders = {"list": [nodes[-1]], "dict": {"t": nodes[len(nodes) // 2]}}
    kept = _needle_objects(list(holders.values()))
    refs = [weakref.ref(o) for o in kept]
    snap = _snapshot(kept)
    del nodes
    for _ in range(3):
        memory.collect("needle")
        _ = _random_graph(int(rng.integers(100)), "needle")
        del _
    assert _dead(refs) == 0
    _check_intact(kept, snap)


class Finalized(ndl.Tensor):
    """A Tensor subclass whose __del__ allocates and frees tensors."""

    made = []

    def __del__(self):
        x = ndl.Tensor(np.ones((64, 64), dtype=np.float32))
        Finalized.made.append((x * 2.0).numpy().sum())
        del x


def test_finalizers_are_left_to_the_full_collection():
    Finalized.made.clear()
    with ndl.autograd.graph_mode("needle"):
        f = Finalized(np.ones((4, 4), dtype=np.float32))
        y = (f * 3.0).sum()
        y.backward()
        f.grad = y  # a cycle through a finalized object
        plain = ndl.Tensor(np.ones((2, 2), dtype=np.float32))
        plain.grad = (plain * 2.0).sum()
        plain.grad.grad = plain  # a needle-only cycle beside it
    ref_f, ref_y, ref_plain = weakref.ref(f), weakref.ref(y), weakref.ref(plain)
    del f, y, plain
    r = memory.collect("needle")
    assert r["ran"] and r["objects"] > 0
    assert ref_plain() is None
    assert ref_f() is not None and ref_y() is not None  # reached from a finalizer: a root
    assert Finalized.made == []
    gc.collect()
    assert ref_f() is None and ref_y() is None
    assert Finalized.made == [64 * 64 * 2.0]


def test_weakref_callbacks_run_when_freed_and_may_allocate():
    seen = []

    def callback(ref):
        x = ndl.Tensor(np.ones((8,), dtype=np.float32))
        seen.append(float((x + 1.0).numpy().sum()))
        seen.append(memory.collect("needle")["ran"])  # a collection during a collection

    with ndl.autograd.graph_mode("needle"):
        a = ndl.Tensor(np.ones((4,), dtype=np.float32))
        b = (a * a).sum()
        b.backward()
        a.grad.grad = a
    ref = weakref.ref(a, callback)
    others = [weakref.ref(o) for o in _needle_objects([a, b])]
    del a, b
    assert ref() is not None
    r = memory.collect("needle")
    assert r["ran"] and ref() is None
    assert seen == [16.0, False]
    assert _dead(others) == len(others)


def test_allocation_and_collection_inside_gc_callbacks():
    results = []

    def observer(phase, info):
        if info.get("scope") == "needle":
            return
        x = ndl.Tensor(np.ones((16,), dtype=np.float32))
        results.append((phase, float((x * 2.0).numpy().sum()), memory.collect("needle")["ran"]))

    gc.callbacks.append(observer)
    try:
        with ndl.autograd.graph_mode("needle"):
            a = ndl.Tensor(np.ones((4,), dtype=np.float32))
            (a * a).sum().backward()
        del a
        gc.collect()
    finally:
        gc.callbacks.remove(observer)
    # Inside Python's collection ("start": after needle's observer marked it running) the
    # scoped collection refuses; after it ("stop"), it runs.
    assert results == [("start", 32.0, False), ("stop", 32.0, True)]


def test_million_node_chain_without_recursion():
    n = 10**6
    base = _c._scoped_info()["registered"]
    nodes = [ndl.Tensor.__new__(ndl.Tensor) for _ in range(n)]
    for i in range(1, n):
        nodes[i].inputs = (nodes[i - 1],)
    nodes[0].inputs = (nodes[-1],)  # one cycle of 10^6 nodes
    head = weakref.ref(nodes[0])
    keep = nodes[n // 2]
    del nodes
    r = memory.collect("needle")  # reachable from keep: the whole ring survives
    assert r["ran"] and r["objects"] == 0 and head() is not None
    assert len(keep.inputs) == 1
    del keep
    r = memory.collect("needle")
    assert r["objects"] == n and head() is None
    assert _c._scoped_info()["registered"] == base


def test_scoped_collection_is_refused_during_python_collection_and_nested():
    assert memory.collect("needle")["ran"]
    assert memory.collect("all")["ran"]
    with pytest.raises(ValueError):
        memory.collect("process")


def _course_loop(mode, steps=8):
    """The course loop (reset_grad after the forward pass, as in the course's train_epoch)."""
    np.random.seed(0)
    model = ndl.nn.Sequential(ndl.nn.Linear(256, 512), ndl.nn.ReLU(), ndl.nn.Linear(512, 8))
    opt = ndl.optim.SGD(model.parameters(), lr=1e-2)
    loss_fn = ndl.nn.SoftmaxLoss()
    X = ndl.Tensor(np.random.randn(512, 256).astype("float32"), requires_grad=False)
    y = ndl.Tensor(np.random.randint(0, 8, 512).astype("float32"), requires_grad=False)
    losses, allocated = [], []
    with ndl.autograd.graph_mode(mode):
        for _ in range(steps):
            out = model(X)
            loss = loss_fn(out * out, y)  # out's gradient refers to out: a cycle in needle mode
            opt.reset_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.numpy().reshape(-1)[0]))
            allocated.append(memory.memory_allocated())
            time.sleep(0.005)  # lets the pacer (at 0.5) allow a collection a step
    return losses, allocated


def test_course_loop_in_needle_mode_with_the_hook_matches_cycle_free():
    gc.enable()  # the soft path honours gc.disable()
    gc.set_threshold(10**9)  # only the pressure policy collects
    _c._reset_pressure_stats(memory._engine_id("cpu"))
    base = memory.memory_allocated()
    policy = memory.get_gc_policy()
    memory.set_memory_limit("cpu", base + 64 * MiB)
    memory.set_gc_policy(growth=0.0, min_growth="2MiB", max_gc_fraction=0.5)
    try:
        reference, _ = _course_loop("cycle_free")
        start = memory.memory_stats()
        losses, allocated = _course_loop("needle", steps=16)
        stats = memory.memory_stats()
    finally:
        memory.set_memory_limit("cpu", None)
        memory.set_gc_policy(**policy)
    np.testing.assert_allclose(losses[:8], reference, rtol=1e-5)
    # Flat: the last steps hold no more than the early ones (the hook frees each old graph).
    assert max(allocated[8:]) <= max(allocated[2:8]) * 1.05
    scoped = stats["num_scoped_collections"] - start["num_scoped_collections"]
    collections = stats["num_pressure_collections"] - start["num_pressure_collections"]
    assert scoped >= 1 and scoped == collections  # every ladder starts with a scoped one
    assert stats["scoped_objects_examined"] > start["scoped_objects_examined"]
    assert stats["scoped_freed_bytes"] > start["scoped_freed_bytes"]
    fallbacks = stats["num_full_fallbacks"] - start["num_full_fallbacks"]
    full = stats["num_full_collections"] - start["num_full_collections"]
    assert fallbacks <= full and fallbacks < scoped  # the graph's garbage is needle-only
    # Below high_water * budget the trigger and the safe points run the scoped step alone: a
    # forward pass climbing past the trigger, or a new model's larger live set at the first
    # safe point, is no reason for a full collection.
    assert fallbacks == 0 and full == 0
    assert stats["num_ooms"] == start["num_ooms"]
    assert "ladder: scoped" in memory.memory_summary("cpu")


def test_ladder_falls_back_to_a_full_collection_when_scoped_frees_too_little():
    """Garbage held by a list cycle: the scoped collection frees none of it, the ladder's full
    collection does."""
    _c._reset_pressure_stats(memory._engine_id("cpu"))
    gc.enable()
    gc.set_threshold(10**9)
    base = memory.memory_allocated()
    policy = memory.get_gc_policy()
    memory.set_memory_limit("cpu", base + 64 * MiB)
    try:
        memory.set_gc_policy(watermark=base + 8 * MiB, max_gc_fraction=0.5)
        start = memory.memory_stats()
        for _ in range(24):
            cycle = [ndl.Tensor(np.ones((MiB // 4,), dtype=np.float32))]
            cycle.append(cycle)
            del cycle
            time.sleep(0.002)  # lets the pacer allow the next collection
        stats = memory.memory_stats()
    finally:
        memory.set_memory_limit("cpu", None)
        memory.set_gc_policy(**policy)
    assert stats["num_full_fallbacks"] >= 1
    assert stats["scoped_freed_bytes"] == start["scoped_freed_bytes"]
    assert stats["gc_freed_bytes"] > start["gc_freed_bytes"]
    # every fallback freed the list cycles: none is backed off
    assert stats["num_fallbacks_skipped"] == start["num_fallbacks_skipped"]


def _drive_ladders(count):
    """Makes 1 MiB of needle garbage at a time until `count` more ladders ran, waiting after each
    collection twice as long as it took: the pacer's rule at max_gc_fraction 0.5 asks for as
    long, and the margin keeps a loaded machine's timing from skipping ladders (garbage would
    then pile up to the limit and end in an out-of-memory collection, seen once in CI)."""
    first = memory.memory_stats()["num_scoped_collections"]
    for _ in range(50 * count):
        before = memory.memory_stats()
        needle_cycle(MiB)
        after = memory.memory_stats()
        if after["num_scoped_collections"] - first >= count:
            return
        time.sleep(0.005 + 2 * (after["gc_seconds"] - before["gc_seconds"]))
    raise AssertionError(f"fewer than {count} ladders ran")


def test_fallbacks_that_free_nothing_back_off_and_useful_ones_end_it():
    """Each collection's scoped step frees the needle garbage, less than the pressure asks
    for; its full fallback then frees nothing. The fallbacks back off (1, 2, 4, ... soft
    ladders without one), and a fallback that frees a list cycle ends the back-off."""
    _c._reset_pressure_stats(memory._engine_id("cpu"))
    gc.enable()
    gc.set_threshold(10**9)
    base = memory.memory_allocated()
    policy = memory.get_gc_policy()
    memory.set_memory_limit("cpu", base + 256 * MiB)
    ballast = ndl.Tensor(np.ones((2 * MiB,), dtype=np.float32))  # 8 MiB alive
    try:
        memory.set_gc_policy(watermark=base + 8 * MiB + MiB // 2, max_gc_fraction=0.5)
        start = memory.memory_stats()
        _drive_ladders(20)
        mid = memory.memory_stats()
        cycle = [ndl.Tensor(np.ones((MiB // 4,), dtype=np.float32)) for _ in range(12)]
        cycle.append(cycle)
        del cycle  # 3 MiB that only a full collection frees
        _drive_ladders(64)
        end = memory.memory_stats()
    finally:
        memory.set_memory_limit("cpu", None)
        memory.set_gc_policy(**policy)
        del ballast
    ladders = mid["num_scoped_collections"] - start["num_scoped_collections"]
    fallbacks = mid["num_full_fallbacks"] - start["num_full_fallbacks"]
    skipped = mid["num_fallbacks_skipped"] - start["num_fallbacks_skipped"]
    assert ladders == 20 and end["num_oom_collections"] == 0
    assert fallbacks + skipped == ladders  # each scoped step freed less than asked
    assert fallbacks == 5  # at ladders 1, 3, 6, 11 and 20
    assert mid["scoped_freed_bytes"] - start["scoped_freed_bytes"] >= (ladders - 1) * MiB
    # the back-off (16 skips) lets ladder 37 fall back: it frees the list cycle, which ends
    # the back-off: fallbacks again at 38, 40, 43, 48, 57 and 74 (without the reset: 37, 70)
    assert end["num_full_fallbacks"] - mid["num_full_fallbacks"] == 7
    assert memory.memory_allocated() < base + 12 * MiB
    assert "skipped by the back-off" in memory.memory_summary("cpu")


def test_importing_needle_leaves_gc_freeze_as_it_is():
    """needle patches nothing of Python's: after `import needle`, gc.freeze and gc.unfreeze are
    the very functions the gc module had before (checked in a fresh interpreter), here too."""
    code = (
        "import gc\n"
        "freeze, unfreeze = gc.freeze, gc.unfreeze\n"
        "import needle\n"
        "assert gc.freeze is freeze and gc.unfreeze is unfreeze, (gc.freeze, gc.unfreeze)\n"
        "print('same')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr
    for fn in (gc.freeze, gc.unfreeze):
        assert fn.__module__ == "gc" and fn.__self__ is gc
        assert "needle" not in fn.__doc__


def test_frozen_garbage_is_left_alone_as_gc_collect_leaves_it():
    """gc.freeze()'s objects are never examined by the collector; the scoped collection keeps
    them too (they are roots), frees garbage made after the freeze, and frees the frozen
    garbage once gc.unfreeze() ran."""
    frozen = needle_cycle(4096)
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        assert memory.collect("needle")["ran"]
        assert frozen() is not None
        gc.collect()
        assert frozen() is not None  # what gc.collect() does with it
        later = needle_cycle(4096)
        assert memory.collect("needle")["objects"] > 0
        assert later() is None and frozen() is not None
    finally:
        gc.unfreeze()
    assert memory.collect("needle")["objects"] > 0
    assert frozen() is None


def test_garbage_made_after_a_freeze_waits_for_the_full_collection():
    """The scoped collection learns of a freeze as it begins (gc.get_freeze_count() grew), so
    it treats every needle object alive then as frozen, also a cycle made after the freeze:
    that cycle is left to gc.collect(), which frees it (it is not frozen in truth)."""
    gc.freeze()
    try:
        after = needle_cycle(4096)
        assert memory.collect("needle")["ran"]
        assert after() is not None
        gc.collect()
        assert after() is None
    finally:
        gc.unfreeze()


def test_an_unfreeze_and_a_smaller_freeze_keep_what_the_second_froze():
    """Between two scoped collections, gc.unfreeze() then gc.freeze() of fewer objects leave the
    count lower than before, as frozen objects dying do; the scoped collection takes either as
    a freeze: the cycle the second freeze froze is kept, and freed after gc.unfreeze()."""
    junk = [[] for _ in range(2000)]
    gc.freeze()
    try:
        assert memory.collect("needle")["ran"]
        refrozen = needle_cycle(4096)
        before = gc.get_freeze_count()
        del junk
        gc.unfreeze()
        gc.freeze()
        assert 0 < gc.get_freeze_count() < before
        assert memory.collect("needle")["ran"]
        assert refrozen() is not None
        gc.collect()
        assert refrozen() is not None  # frozen: what gc.collect() does with it too
    finally:
        gc.unfreeze()
    memory.collect("needle")
    assert refrozen() is None


def test_an_unfreeze_clears_the_marks():
    """A freeze count that drops to 0 clears every mark: garbage made while frozen, still
    alive at the unfreeze, is then the scoped collection's to free."""
    gc.freeze()
    made_while_frozen = needle_cycle(4096)
    memory.collect("needle")
    assert made_while_frozen() is not None
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    result = memory.collect("needle")
    assert result["ran"] and result["objects"] > 0
    assert made_while_frozen() is None


def test_a_collection_alone_is_not_a_freeze():
    """gc.collect() freezes nothing, so a cycle alive across one is the scoped collection's to
    free once it is garbage; on 3.12 the collector parks immortal containers in the permanent
    generation (gc.get_freeze_count() grows across it), which must not read as a freeze."""
    gc.unfreeze()
    memory.collect("needle")  # sees the count at 0: no marks
    keep = [ndl.Tensor(np.ones((1024,), dtype=np.float32), requires_grad=True)]
    keep[0].grad = keep[0] * 1.0
    alive = weakref.ref(keep[0])
    gc.collect()
    if sys.version_info[:2] != (3, 12):
        assert gc.get_freeze_count() == 0
    del keep
    result = memory.collect("needle")
    assert result["ran"] and result["objects"] > 0
    assert alive() is None


def test_a_replaced_get_freeze_count_changes_nothing(monkeypatch):
    """needle took gc.get_freeze_count from the gc module at import: a replacement set later
    (here one that raises) is never called, and frozen objects are still told apart."""

    def broken():
        raise RuntimeError("not the gc module's")

    monkeypatch.setattr(gc, "get_freeze_count", broken)
    frozen = needle_cycle(4096)
    gc.freeze()
    try:
        result = memory.collect("needle")
        assert result["ran"] and frozen() is not None
    finally:
        gc.unfreeze()
    assert memory.collect("needle")["objects"] > 0
    assert frozen() is None


def test_oom_path_uses_the_ladder():
    _c._reset_pressure_stats(memory._engine_id("cpu"))
    base = memory.memory_allocated()
    start = memory.memory_stats()
    memory.set_memory_limit("cpu", base + 8 * MiB)
    try:
        with ndl.autograd.graph_mode("needle"):
            for _ in range(6):  # each graph is needle-only cyclic garbage of ~2 MiB
                a = ndl.Tensor(np.ones((MiB // 4,), dtype=np.float32))
                (a * a).sum().backward()
                del a
        stats = memory.memory_stats()
    finally:
        memory.set_memory_limit("cpu", None)
    assert stats["num_ooms"] == start["num_ooms"]  # the allocator's counter is cumulative
    assert stats["num_scoped_collections"] >= 1
    assert stats["num_oom_collections"] + stats["num_pressure_collections"] >= 1
