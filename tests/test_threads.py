"""Threads: a collection running in one thread (its finalizers release the GIL)
must not make another thread's allocation fail for nothing, and two threads
training at once get the gradients each would get alone.

bench/threads_train.py is the long version (two threads for a minute)."""

import gc
import threading
import time

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd
from needle import memory

MiB = 2**20


@pytest.fixture
def limited_cpu():
    gc.collect()
    policy = memory.get_gc_policy()
    thresholds = gc.get_threshold()
    gc.set_threshold(10**9)  # only needle's out-of-memory path collects
    try:
        yield memory.memory_allocated("cpu")
    finally:
        gc.set_threshold(*thresholds)
        memory.set_memory_limit("cpu", None)
        memory.set_gc_policy(
            **{k: v for k, v in policy.items() if k != "watermark"}, watermark=policy["watermark"]
        )
        gc.collect()


class _SlowFinalizer:
    """Cyclic garbage whose finalizer, run by the collector, signals and then
    sleeps (releasing the GIL) while the collection is still under way."""

    def __init__(self, started, nbytes):
        self.started = started
        self.array = nd.empty((nbytes // 4,))
        self.self = self

    def __del__(self):
        self.started.set()
        time.sleep(0.3)


def test_oom_during_another_threads_collection_waits_for_it(limited_cpu):
    base = limited_cpu
    memory.set_memory_limit("cpu", base + 64 * MiB)
    started = threading.Event()
    _SlowFinalizer(started, 48 * MiB)  # garbage only a collection frees
    results = {}

    def first():
        # Needs the 48 MiB back: the out-of-memory path collects, and the
        # finalizer holds the collection open for 0.3 s.
        results["first"] = nd.empty((24 * MiB // 4,))

    def second():
        assert started.wait(10)
        # Runs while the first thread's collection is in its finalizer: it must
        # wait for that collection, not fail at once.
        results["second"] = nd.empty((24 * MiB // 4,))

    errors = []

    def run(fn):
        try:
            fn()
        except Exception as err:  # reported below, with the thread's name
            errors.append((fn.__name__, repr(err)))

    threads = [threading.Thread(target=run, args=(fn,)) for fn in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert results["first"].shape == results["second"].shape == (24 * MiB // 4,)
    results.clear()
    assert memory.memory_allocated("cpu") == base


def _train(seed, steps, mode, losses, grads):
    """A small tanh MLP trained in graph mode `mode`; records losses and the last gradients."""
    rng = np.random.default_rng(seed)
    x = ndl.Tensor(rng.standard_normal((64, 32)).astype(np.float32), requires_grad=False)
    y = ndl.Tensor(rng.integers(0, 10, 64).astype(np.float32), requires_grad=False)
    w1 = ndl.Tensor(rng.standard_normal((32, 64)).astype(np.float32) * 0.1)
    w2 = ndl.Tensor(rng.standard_normal((64, 10)).astype(np.float32) * 0.1)
    with ndl.autograd.graph_mode(mode):
        for _ in range(steps):
            loss = ndl.softmax_cross_entropy(ndl.tanh(x @ w1) @ w2, y)
            w1.grad = w2.grad = None
            loss.backward()
            losses.append(float(loss.numpy()[0]))
            w1.data = w1.data - w1.grad.detach() * 0.1
            w2.data = w2.data - w2.grad.detach() * 0.1
    grads.extend([w1.grad.numpy(), w2.grad.numpy()])


@pytest.mark.parametrize("mode", ndl.autograd.GRAPH_MODES)
def test_two_threads_train_as_each_would_alone(limited_cpu, mode):
    # A limit tight enough that, in "needle" mode (tanh's gradient makes the course's
    # cycles), needle's collector runs in one thread while the other allocates.
    memory.set_memory_limit("cpu", limited_cpu + 4 * MiB)
    alone = {}
    for seed in (1, 2):
        alone[seed] = ([], [])
        _train(seed, 100, mode, *alone[seed])
    start = memory.memory_stats("cpu")
    together = {seed: ([], []) for seed in (1, 2)}
    errors = []

    def run(seed):
        try:
            _train(seed, 100, mode, *together[seed])
        except Exception as err:
            errors.append(repr(err))

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    stats = memory.memory_stats("cpu")
    assert stats["num_ooms"] == start["num_ooms"]
    if mode == "needle":
        assert stats["num_collect_calls"] > start["num_collect_calls"]
    for seed in (1, 2):
        np.testing.assert_allclose(together[seed][0], alone[seed][0], rtol=1e-5)
        for got, want in zip(together[seed][1], alone[seed][1]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------
# graph mode per thread
# --------------------------------------------------------------------------


def _step_records_a_graph(rng):
    """One small training step; whether its backward recorded the gradient graph
    (a recorded .grad has an op, a cycle_free one is a detached constant)."""
    x = ndl.Tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=False)
    w = ndl.Tensor(rng.standard_normal((3, 2)).astype(np.float32))
    ndl.tanh(x @ w).sum().backward()
    return w.grad.op is not None


def test_graph_mode_context_stays_in_its_thread():
    stop = threading.Event()
    inside = threading.Event()
    toggler_saw = []  # (mode inside the context, whether its step recorded a graph)
    errors = []

    def toggle():
        rng = np.random.default_rng(1)
        try:
            while not stop.is_set():
                with ndl.autograd.graph_mode("needle"):
                    inside.set()
                    toggler_saw.append((ndl.autograd.get_graph_mode(), _step_records_a_graph(rng)))
                    time.sleep(0)  # let the other thread run while the context is active
        except Exception as err:
            errors.append(repr(err))

    toggler = threading.Thread(target=toggle)
    toggler.start()
    try:
        assert inside.wait(10)
        rng = np.random.default_rng(2)
        recorded = []
        for step in range(200):
            mode = ndl.autograd.get_graph_mode()
            recorded.append((step, mode, _step_records_a_graph(rng)))
            if step % 2:
                with ndl.autograd.graph_mode("cycle_free"):
                    recorded.append((step, "ctx", _step_records_a_graph(rng)))
            time.sleep(0)
    finally:
        stop.set()
        toggler.join(30)
    assert errors == []
    assert [r for r in recorded if r[1] not in ("cycle_free", "ctx") or r[2]] == []
    assert toggler_saw and all(seen == ("needle", True) for seen in toggler_saw)
    assert ndl.autograd.get_graph_mode() == "cycle_free"


def _mode_in_new_thread():
    seen = []
    t = threading.Thread(target=lambda: seen.append(ndl.autograd.get_graph_mode()))
    t.start()
    t.join(10)
    return seen[0]


def test_new_threads_start_from_the_process_default():
    assert ndl.autograd.get_graph_mode() == "cycle_free"
    with ndl.autograd.graph_mode("needle"):
        # a context is this thread's alone
        assert _mode_in_new_thread() == "cycle_free"
    previous = ndl.autograd.set_graph_mode("needle")
    try:
        assert previous == "cycle_free"
        assert ndl.autograd.get_graph_mode() == "needle"
        assert _mode_in_new_thread() == "needle"
    finally:
        ndl.autograd.set_graph_mode(previous)
    assert _mode_in_new_thread() == "cycle_free"


def test_set_graph_mode_inside_a_context_changes_the_default_only():
    with ndl.autograd.graph_mode("needle"):
        try:
            assert ndl.autograd.set_graph_mode("needle") == "cycle_free"
            assert ndl.autograd.set_graph_mode("cycle_free") == "needle"
            # the context still decides for this thread until it exits
            assert ndl.autograd.get_graph_mode() == "needle"
            ndl.autograd.set_graph_mode("needle")
            assert _mode_in_new_thread() == "needle"
        finally:
            ndl.autograd.set_graph_mode("cycle_free")
        assert ndl.autograd.get_graph_mode() == "needle"
    assert ndl.autograd.get_graph_mode() == "cycle_free"


def test_concurrent_toggling_and_setting_never_crashes():
    errors = []
    barrier = threading.Barrier(4)

    def churn(k):
        rng = np.random.default_rng(k)
        try:
            barrier.wait(10)
            for i in range(100):
                name = ndl.autograd.GRAPH_MODES[(i + k) % 2]
                if k == 3:
                    ndl.autograd.set_graph_mode(name)
                    continue
                with ndl.autograd.graph_mode(name):
                    assert ndl.autograd.get_graph_mode() == name
                    assert _step_records_a_graph(rng) == (name == "needle")
        except Exception as err:
            errors.append(repr(err))

    threads = [threading.Thread(target=churn, args=(k,)) for k in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        ndl.autograd.set_graph_mode("cycle_free")
    assert errors == []
