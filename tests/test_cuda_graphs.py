"""CUDA graphs (csrc/cuda/cuda_graph.cu, ``ndl.cuda.CUDAGraph``/``graph``/
``graph_pool_handle``): captured training steps replayed equal eager steps bit for bit (on
the simulator, which runs the same kernels), random draws differ between replays, the
collector and the cache stay out of a capture, a failed capture leaves the allocator and the
statistics consistent, bad input raises, and a replay is one host launch in the census."""

import gc
import os

import numpy as np
import pytest

import needle as ndl
from needle import nn

from devices import CUDA_UNAVAILABLE, needs_cuda


def _cuda(fn):
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


@pytest.mark.skipif(CUDA_UNAVAILABLE is None, reason="CUDA is available here")
def test_without_cuda_graphs_raise_device_error():
    g = ndl.cuda.CUDAGraph()
    with pytest.raises(ndl.DeviceError):
        g.capture_begin()
    with pytest.raises(ndl.DeviceError):
        ndl.cuda.graph_pool_handle()
    with pytest.raises(RuntimeError, match="needs a captured graph"):
        g.replay()
    assert ndl.cuda.CUDAGraph().num_nodes == 0


# ------------------------------------------------------------------ helpers


def _mlp(seed, device):
    np.random.seed(seed)
    return nn.Sequential(
        nn.Linear(16, 32, device=device), nn.ReLU(), nn.Linear(32, 4, device=device)
    )


def _data(n, seed=1):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((8, 16)).astype(np.float32) for _ in range(n)]
    ys = [rng.integers(0, 4, 8).astype(np.float32) for _ in range(n)]
    return xs, ys


def _params(model):
    return [p.numpy().copy() for p in model.parameters()]


def _assert_same_run(replayed, eager):
    """Bit for bit: a replay runs the eager step's kernels on the same values. Except under
    NEEDLE_SIM_PERTURB=1, where the simulator orders each launch's threads by its launch
    count, which differs between a replay and an eager step, so a kernel that adds floats
    atomically (the embeddings' gradient) may round differently in the last bits, as it may
    between two runs on a GPU."""
    if os.environ.get("NEEDLE_SIM_PERTURB") == "1":
        np.testing.assert_allclose(replayed, eager, rtol=1e-4, atol=1e-6)
    else:
        np.testing.assert_array_equal(replayed, eager)


class _Step:
    """One SGD training step of ``model`` on static inputs, eager or captured."""

    def __init__(self, model, device, x, y, **sgd):
        self.model, self.device = model, device
        self.opt = ndl.optim.SGD(model.parameters(), **sgd)
        self.loss_fn = nn.SoftmaxLoss()
        self.x = ndl.Tensor(x, device=device, requires_grad=False)
        self.y = ndl.Tensor(y, device=device, requires_grad=False)

    def __call__(self):
        self.opt.reset_grad()
        loss = self.loss_fn(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        return loss


# ------------------------------------------------------------- replays


@_cuda
def test_replayed_sgd_steps_equal_eager_steps_bit_for_bit():
    dev = ndl.cuda()
    xs, ys = _data(5)
    eager = _Step(_mlp(0, dev), dev, xs[0], ys[0], lr=0.1, momentum=0.9, weight_decay=1e-3)
    graphed = _Step(_mlp(0, dev), dev, xs[0], ys[0], lr=0.1, momentum=0.9, weight_decay=1e-3)
    eager()
    graphed()  # warm up before capturing, as PyTorch requires (the momentum exists)
    g = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g):
        static_loss = graphed()
    assert g.num_nodes > 0
    for x, y in zip(xs[1:], ys[1:]):
        eager.x.copy_(x)
        eager.y.copy_(y)
        loss = eager()
        graphed.x.copy_(x)
        graphed.y.copy_(y)
        g.replay()
        np.testing.assert_array_equal(static_loss.numpy(), loss.numpy())
        for a, b in zip(_params(graphed.model), _params(eager.model)):
            np.testing.assert_array_equal(a, b)
    # The parameters moved: each replay stepped from the previous replay's values.
    assert not np.array_equal(_params(eager.model)[0], _params(_mlp(0, dev))[0])


def _course_model(seq_model, device, vocab=50):
    from needle.apps.course_config import COURSE

    np.random.seed(0)
    cfg = (
        COURSE
        if seq_model == "transformer"
        else __import__("dataclasses").replace(COURSE, seq_model=seq_model)
    )
    model = cfg.language_model(vocab, 6, device)
    model.train()
    return model


@_cuda
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("seq_model", ["transformer", "lstm"])
def test_course_models_replayed_steps_equal_eager_steps(seq_model, optimizer):
    dev = ndl.cuda()
    vocab, seq_len, batch = 50, 6, 4
    rng = np.random.default_rng(2)
    xs = [rng.integers(0, vocab, (seq_len, batch)).astype(np.float32) for _ in range(4)]
    ys = [rng.integers(0, vocab, seq_len * batch).astype(np.float32) for _ in range(4)]

    def make():
        model = _course_model(seq_model, dev, vocab)
        if optimizer == "sgd":
            opt = ndl.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
        else:  # the course's optimizer, its step and learning rate on the GPU
            opt = ndl.optim.Adam(model.parameters(), lr=3e-3, capturable=True)
        x = ndl.Tensor(xs[0], device=dev, requires_grad=False)
        y = ndl.Tensor(ys[0], device=dev, requires_grad=False)
        loss_fn = nn.SoftmaxLoss()

        def step():
            opt.reset_grad()
            logits, _ = model(x, None)
            loss = loss_fn(logits, y)
            loss.backward()
            opt.step()
            return loss

        return model, x, y, step

    m_eager, x_e, y_e, step_e = make()
    m_graph, x_g, y_g, step_g = make()
    step_e()
    step_g()
    ndl.cuda.reset_work_counters()
    g = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g):
        static_loss = step_g()
    # Nothing of the step went to the legacy stream, which the capture would have missed.
    assert ndl.cuda.work_counters()["legacy_stream_work"] == 0
    for x, y in zip(xs[1:], ys[1:]):
        x_e.copy_(x)
        y_e.copy_(y)
        loss = step_e()
        x_g.copy_(x)
        y_g.copy_(y)
        g.replay()
        _assert_same_run(static_loss.numpy(), loss.numpy())
    for a, b in zip(_params(m_graph), _params(m_eager)):
        _assert_same_run(a, b)


@_cuda
def test_a_replay_is_one_host_launch():
    dev = ndl.cuda()
    xs, ys = _data(2)
    step = _Step(_mlp(0, dev), dev, xs[0], ys[0], lr=0.1)
    step()
    g = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g):
        step()
    ndl.cuda.synchronize()
    ndl.cuda.reset_work_counters()
    g.replay()
    work = ndl.cuda.work_counters()
    assert work["graph_launches"] == 1 and work["graph_nodes"] == g.num_nodes
    assert work["kernel_launches"] == work["blas_calls"] == work["memsets"] == 0
    assert work["d2d_copies"] == work["host_syncs"] == work["legacy_stream_work"] == 0


@_cuda
def test_dropout_differs_between_replays():
    dev = ndl.cuda()
    x = ndl.Tensor(np.ones((16, 16), dtype=np.float32), device=dev, requires_grad=False)
    drop = nn.Dropout(0.5)
    g = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g):
        y = drop(x)
    masks = []
    for _ in range(3):
        g.replay()
        masks.append(y.numpy() != 0)
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
    for m in masks:  # each a fair draw: about half kept, the kept scaled by 1 / (1 - p)
        assert 64 < m.sum() < 192
    np.testing.assert_array_equal(np.unique(y.numpy()), [0.0, 2.0])


@_cuda
def test_outputs_outlive_their_pool_and_eager_memory_is_not_reused():
    dev = ndl.cuda()
    x = ndl.Tensor(np.arange(64, dtype=np.float32), device=dev, requires_grad=False)
    g = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g):
        out = (x * 2.0 + 1.0).exp().log()
    del out  # the graph's pool keeps the block: replays still write it
    gc.collect()
    eager = [ndl.Tensor(np.full(64, i, np.float32), device=dev) for i in range(8)]
    for _ in range(3):
        g.replay()
    for i, t in enumerate(eager):  # no eager tensor got the pool's memory
        np.testing.assert_array_equal(t.numpy(), np.full(64, i, np.float32))


@_cuda
def test_graphs_share_a_pool():
    dev = ndl.cuda()
    x = ndl.Tensor(np.arange(8, dtype=np.float32), device=dev, requires_grad=False)
    g1, g2 = ndl.cuda.CUDAGraph(), ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g1):
        a = x * 3.0
    with ndl.cuda.graph(g2, pool=g1.pool()):
        b = a + 1.0
    handle = ndl.cuda.graph_pool_handle()
    g3 = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g3, pool=handle):
        c = x - 1.0
    x.copy_(np.ones(8, np.float32))
    g1.replay()
    g2.replay()
    g3.replay()
    np.testing.assert_array_equal(a.numpy(), np.full(8, 3.0))
    np.testing.assert_array_equal(b.numpy(), np.full(8, 4.0))
    np.testing.assert_array_equal(c.numpy(), np.zeros(8))


@_cuda
def test_reset_gives_the_pool_back():
    dev = ndl.cuda()
    x = ndl.Tensor(np.ones(4096, dtype=np.float32), device=dev, requires_grad=False)
    ndl.cuda.synchronize()
    before = ndl.cuda.memory_allocated()
    g = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g):
        y = x * 2.0
    g.replay()
    np.testing.assert_array_equal(y.numpy(), np.full(4096, 2.0))
    g.reset()
    del y
    gc.collect()
    assert ndl.cuda.memory_allocated() == before
    with pytest.raises(RuntimeError, match="needs a captured graph"):
        g.replay()
    with ndl.cuda.graph(g):  # a reset graph captures again
        z = x + 1.0
    g.replay()
    np.testing.assert_array_equal(z.numpy(), np.full(4096, 2.0))


# --------------------------------------------- the collector and the cache


@_cuda
def test_a_collection_inside_a_capture_frees_nothing_the_graph_may_touch():
    dev = ndl.cuda()

    class Cycle:
        pass

    garbage = Cycle()
    garbage.me = garbage
    garbage.t = ndl.Tensor(np.full(1024, 7.0, np.float32), device=dev, requires_grad=False)
    address = garbage.t.realize_cached_data()._handle.ptr()
    del garbage
    x = ndl.Tensor(np.ones(1024, dtype=np.float32), device=dev, requires_grad=False)
    g = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g):
        assert gc.collect() > 0  # the cycle goes, but its block is held until the end
        fresh = x * 5.0
        assert fresh.realize_cached_data()._handle.ptr() != address
    assert not ndl.cuda.is_current_stream_capturing()
    g.replay()
    np.testing.assert_array_equal(fresh.numpy(), np.full(1024, 5.0))
    later = ndl.Tensor(np.zeros(1024, np.float32), device=dev)  # the cache has it back now
    assert later.numpy().sum() == 0


def _pressure_requests(dev):
    """The pressure collections the engine asked the collector for: run, skipped by the
    pacer, or deferred to a safe point."""
    stats = ndl.memory.memory_stats(dev)
    keys = ("num_pressure_collections", "num_pressure_skips", "num_pressure_deferrals")
    return sum(stats[k] for k in keys)


@_cuda
def test_pressure_collections_wait_for_the_capture_to_end():
    dev = ndl.cuda()
    x = ndl.Tensor(np.ones(256, dtype=np.float32), device=dev, requires_grad=False)
    ndl.memory.set_gc_policy(watermark=1)  # every allocation asks for a collection
    try:
        g = ndl.cuda.CUDAGraph()
        g.capture_begin()
        try:
            stats0 = _pressure_requests(dev)
            for _ in range(4):
                x = x + 1.0
            during = _pressure_requests(dev)
        finally:
            g.capture_end()
        after = _pressure_requests(dev)
    finally:
        ndl.memory.set_gc_policy(watermark=None)
    assert during == stats0  # none ran inside the capture
    assert after == stats0 + 1  # the one asked for was asked once it ended


@_cuda
def test_a_graph_dropped_during_another_capture_is_destroyed_after_it():
    dev = ndl.cuda()
    x = ndl.Tensor(np.ones(32, dtype=np.float32), device=dev, requires_grad=False)
    g1 = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g1):
        x * 2.0
    g2 = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g2):
        del g1  # its destruction (a wait and cudaGraphDestroy) would fail the capture
        gc.collect()
        y = x + 1.0
    g2.replay()
    np.testing.assert_array_equal(y.numpy(), np.full(32, 2.0))


# ------------------------------------------------- what cannot be captured


def _check_consistent(dev, allocated_before):
    assert not ndl.cuda.is_current_stream_capturing()
    ndl.cuda.synchronize()
    gc.collect()
    assert ndl.cuda.memory_allocated() == allocated_before
    t = ndl.Tensor(np.arange(4, dtype=np.float32), device=dev)
    np.testing.assert_array_equal((t * 2.0).numpy(), [0.0, 2.0, 4.0, 6.0])
    g = ndl.cuda.CUDAGraph()  # and the next capture works
    with ndl.cuda.graph(g):
        u = t + 1.0
    g.replay()
    np.testing.assert_array_equal(u.numpy(), [1.0, 2.0, 3.0, 4.0])


@_cuda
def test_a_host_synchronisation_fails_the_capture_cleanly():
    dev = ndl.cuda()
    x = ndl.Tensor(np.ones(16, dtype=np.float32), device=dev, requires_grad=False)
    ndl.cuda.synchronize()
    before = ndl.cuda.memory_allocated()
    g = ndl.cuda.CUDAGraph()
    with pytest.raises(ndl.DeviceError, match="a copy to the host .* cannot be captured"):
        with ndl.cuda.graph(g):
            y = x * 2.0
            y.numpy()  # a copy to the host waits for the GPU
    del y
    with pytest.raises(RuntimeError, match="needs a captured graph"):
        g.replay()
    _check_consistent(dev, before)


@_cuda
def test_a_failure_found_at_capture_end_abandons_it():
    dev = ndl.cuda()
    x = ndl.Tensor(np.ones(16, dtype=np.float32), device=dev, requires_grad=False)
    ndl.cuda.synchronize()
    before = ndl.cuda.memory_allocated()
    g = ndl.cuda.CUDAGraph()
    g.capture_begin()
    y = x * 2.0
    with pytest.raises(ndl.DeviceError):
        ndl.cuda.synchronize()  # CUDA refuses it and invalidates the capture
    with pytest.raises(ndl.DeviceError, match="could not be captured"):
        g.capture_end()
    del y
    _check_consistent(dev, before)


@_cuda
def test_the_pool_is_reserved_memory_and_the_limit_holds_in_a_capture():
    dev = ndl.cuda()
    x = ndl.Tensor(np.ones(1024, dtype=np.float32), device=dev, requires_grad=False)
    ndl.cuda.synchronize()
    before = ndl.cuda.memory_allocated()
    reserved = ndl.cuda.memory_reserved()
    g = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g):
        y = x * 2.0
    # The pool's first segment is reserved like any other (the statistics and limits see it),
    # and a snapshot shows it as a graph pool's (PyTorch's segment_pool_id).
    assert ndl.cuda.memory_reserved() > reserved
    pools = {seg["segment_pool_id"] for seg in ndl.cuda.memory._snapshot()["segments"]}
    assert (0, 0) in pools and any(p != (0, 0) for p in pools)
    ndl.memory.set_memory_limit(dev, ndl.cuda.memory_reserved() + 1)
    try:
        big = ndl.cuda.CUDAGraph()
        with pytest.raises(ndl.OutOfMemoryError, match="during a CUDA graph capture"):
            with ndl.cuda.graph(big):
                x.broadcast_to((4096, 1024)) * 3.0  # 16 MiB: past the limit, no cache release
    finally:
        ndl.memory.set_memory_limit(dev, None)
    assert not ndl.cuda.is_current_stream_capturing()
    g.replay()
    np.testing.assert_array_equal(y.numpy(), np.full(1024, 2.0))
    del y
    g.reset()
    gc.collect()
    assert ndl.cuda.memory_allocated() == before


@_cuda
def test_host_rng_draws_and_adam_are_refused():
    dev = ndl.cuda()
    model = _mlp(0, dev)
    opt = ndl.optim.Adam(model.parameters(), lr=0.01)
    x = ndl.Tensor(np.ones((8, 16), dtype=np.float32), device=dev, requires_grad=False)
    model(x).sum().backward()
    opt.step()  # warm
    ndl.cuda.synchronize()
    g = ndl.cuda.CUDAGraph()
    with pytest.raises(ndl.DeviceError, match="Adam"):
        with ndl.cuda.graph(g):
            opt.reset_grad()
            model(x).sum().backward()
            opt.step()
    previous = ndl.random.get_rng_mode()
    ndl.random.set_rng_mode("host")
    try:
        with pytest.raises(ndl.DeviceError, match="a copy from the host .* cannot be captured"):
            with ndl.cuda.graph(g):
                ndl.init.rand(4, device=dev)
    finally:
        ndl.random.set_rng_mode(previous)
    assert not ndl.cuda.is_current_stream_capturing()


@_cuda
def test_bad_input():
    dev = ndl.cuda()
    x = ndl.Tensor(np.ones(4, dtype=np.float32), device=dev, requires_grad=False)
    g = ndl.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="needs a captured graph"):
        g.replay()
    with pytest.raises(RuntimeError, match="capture_end\\(\\) without capture_begin"):
        g.capture_end()
    with pytest.raises(RuntimeError, match="needs a captured graph"):
        g.pool()
    with pytest.raises(TypeError, match="pool must be a handle"):
        g.capture_begin(pool=3)
    with pytest.raises(ValueError, match="'global' mode only"):
        g.capture_begin(capture_error_mode="relaxed")
    with pytest.raises(NotImplementedError, match="keep_graph"):
        ndl.cuda.CUDAGraph(keep_graph=True)
    with pytest.raises(TypeError, match="expects a needle.cuda.CUDAGraph"):
        ndl.cuda.graph(object())
    with pytest.raises(TypeError, match="stream must be"):
        ndl.cuda.graph(g, stream=1)
    done = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(done):
        x * 3.0
    with ndl.cuda.graph(g):
        with pytest.raises(RuntimeError, match="already capturing"):
            g.capture_begin()
        other = ndl.cuda.CUDAGraph()
        with pytest.raises(ValueError, match="do not nest"):
            other.capture_begin()
        with pytest.raises(ValueError, match="while another is being captured"):
            done.replay()
        y = x + 1.0
    with pytest.raises(RuntimeError, match="already holds a graph"):
        g.capture_begin()
    g.replay()
    np.testing.assert_array_equal(y.numpy(), np.full(4, 2.0))


# ------------------------------------------------------------------- copy_


@pytest.mark.parametrize(
    "device",
    [pytest.param(ndl.cpu(), id="cpu"), pytest.param(ndl.cuda(), marks=needs_cuda, id="cuda")],
)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_copy_writes_in_place(device, dtype):
    t = ndl.Tensor(np.zeros((2, 3), np.float32), device=device, dtype=dtype, requires_grad=False)
    address = t.realize_cached_data()._handle.ptr()
    assert t.copy_(np.arange(6, dtype=np.float64).reshape(2, 3)) is t
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
    t.copy_(ndl.Tensor([1.0, 2.0, 3.0], device=ndl.cpu()))  # broadcast, across devices
    np.testing.assert_array_equal(t.numpy(), [[1, 2, 3], [1, 2, 3]])
    t.copy_(4.0)
    np.testing.assert_array_equal(t.numpy(), np.full((2, 3), 4.0))
    assert t.realize_cached_data()._handle.ptr() == address and t.dtype == dtype
    w = ndl.Tensor(np.ones(3, np.float32), device=device)  # requires grad (the course default)
    with pytest.raises(RuntimeError, match="records no gradient"):
        t.copy_(w * 2.0)
    with ndl.no_grad():
        t.copy_(w * 2.0)
    np.testing.assert_array_equal(t.numpy(), np.full((2, 3), 2.0))
    with pytest.raises(ValueError, match="broadcast"):
        t.copy_(np.ones((4, 3)))
    with pytest.raises(TypeError):
        t.copy_("text")
