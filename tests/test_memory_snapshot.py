"""Memory snapshots in PyTorch's format (needle.memory._record_memory_history, _snapshot,
_dump_snapshot; ndl.cuda.memory's spelling), with PyTorch's own ``torch.cuda._memory_viz``
as the oracle where torch is installed: what it renders from a needle snapshot, and the
totals it computes, must be needle's."""

import base64
import gc
import inspect
import os
import pickle
import re

import numpy as np
import pytest
from history_check import caller_line
from history_check import stop_recording as _stop_recording  # noqa: F401 (autouse)

import needle as ndl
from needle import memory

from devices import DEVICES, needs_cuda

dev = pytest.mark.parametrize("device", DEVICES)
HERE = os.path.abspath(__file__)


def _blocks(snapshot, state=None):
    return [
        b
        for seg in snapshot["segments"]
        for b in seg["blocks"]
        if state is None or b["state"] == state
    ]


def _trace(snapshot, device):
    index = device.index if device.name == "cuda" else 0
    return snapshot["device_traces"][index]


def _allocated(snapshot):
    return sum(b["requested_size"] for b in _blocks(snapshot, "active_allocated"))


def _train_step(device):
    """One SGD step of a small MLP; returns what it keeps alive."""
    model = ndl.nn.Sequential(
        ndl.nn.Linear(64, 128, device=device), ndl.nn.ReLU(), ndl.nn.Linear(128, 10, device=device)
    )
    opt = ndl.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = ndl.Tensor(np.random.randn(32, 64).astype("float32"), device=device)
    y = ndl.Tensor(np.random.randint(0, 10, 32).astype("float32"), device=device)
    loss = ndl.nn.SoftmaxLoss()(model(x), y)
    opt.reset_grad()
    loss.backward()
    opt.step()
    return model, opt, loss


@dev
def test_training_step_renders_in_pytorchs_viewer_with_needles_totals(device):
    _memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    # With earlier tests' cached blocks released, the step takes new segments for compare().
    gc.collect()
    memory.empty_cache(device)
    before = memory._snapshot(device)
    memory._record_memory_history(device=device)
    kept = _train_step(device)
    snapshot = memory._snapshot(device)

    assert _allocated(snapshot) == memory.memory_allocated(device)
    assert sum(s["total_size"] for s in snapshot["segments"]) == memory.memory_reserved(device)
    for seg in snapshot["segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["blocks"][0]["address"] == seg["address"]

    # PyTorch's text views: segsum checks that the blocks fill their segments exactly.
    summary = _memory_viz.segsum(snapshot)
    assert f"segments: {len(snapshot['segments'])}" in summary
    assert "total_allocated" in summary
    text = _memory_viz.trace(snapshot)
    trace = _trace(snapshot, device)
    assert f"{len(trace)} entries" in text
    assert sum(e["action"] == "alloc" for e in trace) == text.count(" = ") - sum(
        e["action"] == "segment_alloc" for e in trace
    )

    # The flame graphs, their lines taken before flamegraph.pl would draw them.
    lines = _memory_viz.memory(snapshot, format_flamegraph=lambda s: s)
    allocated_in_lines = sum(
        int(line.rsplit(" ", 1)[1])
        for line in lines.splitlines()
        if ";active_allocated;" in line and "<gaps>" not in line
    )
    assert allocated_in_lines == memory.memory_allocated(device)
    assert "test_memory_snapshot.py" in _memory_viz.segments(snapshot, format_flamegraph=str)
    diff = _memory_viz.compare(before["segments"], snapshot["segments"], format_flamegraph=str)
    assert "only_after" in diff

    # The HTML pages embed the snapshot as a pickle that loads back to it.
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        encoded = re.search(r'"base64": "([^"]+)"', html).group(1)
        assert pickle.loads(base64.b64decode(encoded).rstrip(b"\x00")) == snapshot
    del kept


@dev
def test_frames_point_at_the_lines_that_allocated(device):
    memory._record_memory_history(device=device)
    x = ndl.init.rand(300, 7, device=device)
    x_line = caller_line() - 1
    model = ndl.nn.Linear(21, 37, device=device)
    model_line = caller_line() - 1
    snapshot = memory._snapshot(device)

    def requested_at(line):
        return [
            b["requested_size"]
            for b in _blocks(snapshot, "active_allocated")
            if b["frames"] and (b["frames"][0]["filename"], b["frames"][0]["line"]) == (HERE, line)
        ]

    assert requested_at(x_line) == [300 * 7 * 4]
    assert sorted(requested_at(model_line)) == [37 * 4, 21 * 37 * 4]
    x_frames = next(
        b["frames"] for b in _blocks(snapshot) if b["frames"] and b["frames"][0]["line"] == x_line
    )
    assert x_frames[0]["name"] == "test_frames_point_at_the_lines_that_allocated"
    allocs = [e for e in _trace(snapshot, device) if e["action"] == "alloc"]
    assert any(
        e["frames"][0]["line"] == x_line and e["size"] == 300 * 7 * 4 for e in allocs if e["frames"]
    )

    # stacks="all" keeps needle's own frames: init.rand's comes first.
    memory._record_memory_history(stacks="all", device=device)
    y = ndl.init.rand(5, device=device)
    snapshot = memory._snapshot(device)
    package = os.path.dirname(os.path.abspath(ndl.__file__))
    stack = [e for e in _trace(snapshot, device) if e["action"] == "alloc"][-1]["frames"]
    assert stack[0]["filename"].startswith(package)
    assert any(f["filename"] == HERE for f in stack)
    del x, model, y


@dev
def test_dump_round_trips_through_pickle(device, tmp_path):
    memory._record_memory_history(device=device)
    x = ndl.init.randn(64, 64, device=device)
    path = tmp_path / "snapshot.pickle"
    memory._dump_snapshot(str(path), device=device)
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert loaded == memory._snapshot(device)
    assert set(loaded) == {"segments", "device_traces"}
    memory._dump_snapshot(path, device=device)  # a PathLike works too
    del x


@dev
def test_recording_off_records_nothing(device):
    memory._record_memory_history(device=device)
    memory._record_memory_history(None, device=device)
    x = ndl.init.rand(1000, device=device)
    snapshot = memory._snapshot(device)
    assert all(trace == [] for trace in snapshot["device_traces"])
    assert all(
        b["frames"] == [] or b["frames"][0]["filename"] == "<needle engine>"
        for b in _blocks(snapshot)
    )
    # The map of memory is there all the same.
    assert _allocated(snapshot) == memory.memory_allocated(device)
    del x


@dev
def test_state_records_frames_but_no_trace(device):
    memory._record_memory_history("state", device=device)
    x = ndl.init.rand(123, device=device)
    line = caller_line() - 1
    snapshot = memory._snapshot(device)
    assert _trace(snapshot, device) == []
    assert any(b["frames"] and b["frames"][0]["line"] == line for b in _blocks(snapshot))
    del x


@dev
def test_max_entries_keeps_the_latest_events(device):
    def run(max_entries):
        memory._record_memory_history(max_entries=max_entries, clear_history=True, device=device)
        kept = [ndl.init.rand(100 + i, device=device) for i in range(20)]
        trace = _trace(memory._snapshot(device), device)
        del kept
        return trace

    full = run(10_000)
    assert len(full) > 40
    bounded = run(5)
    assert len(bounded) == 5

    # Only the frames inside run() are compared: its callers' lines differ. Which frames those
    # are depends on the version (from 3.12 a comprehension has no frame of its own, PEP 709),
    # so they are picked by run()'s own lines, read from this file's source.
    source, first = inspect.getsourcelines(run)
    inside = range(first, first + len(source))
    rand_line = first + next(i for i, text in enumerate(source) if "init.rand(" in text)

    def shape(trace):
        return [
            (
                e["action"],
                e["size"],
                [f["line"] for f in e["frames"] if f["filename"] == HERE and f["line"] in inside],
            )
            for e in trace
        ]

    assert shape(bounded) == shape(full[-5:])
    assert any(
        e["action"] == "alloc" and rand_line in lines
        for e, (_, _, lines) in zip(bounded, shape(bounded))
    )
    assert [e["time_us"] for e in bounded] == sorted(e["time_us"] for e in bounded)
    assert any(e["size"] == 119 * 4 for e in bounded)


@dev
def test_skip_actions_and_clear_history(device):
    memory._record_memory_history(skip_actions=["free_requested", "snapshot"], device=device)
    x = ndl.init.rand(50, device=device)
    del x
    actions = {e["action"] for e in _trace(memory._snapshot(device), device)}
    assert "alloc" in actions and "free_completed" in actions
    assert "free_requested" not in actions
    memory._record_memory_history(clear_history=True, device=device)
    assert _trace(memory._snapshot(device), device) == []


def test_out_of_memory_is_in_the_trace():
    device = ndl.cpu()
    # Earlier tests' garbage and cached blocks would be freed by the out-of-memory ladder
    # before it gives up, leaving more than the 1 MiB headroom free at the error.
    gc.collect()
    memory.empty_cache(device)
    memory._record_memory_history(device=device)
    memory.set_memory_limit(device, memory.memory_reserved(device) + (1 << 20))
    try:
        with pytest.raises(ndl.OutOfMemoryError):
            ndl.init.rand(1 << 22, device=device)
        line = caller_line() - 1
    finally:
        memory.set_memory_limit(device, None)
    oom = [e for e in _trace(memory._snapshot(device), device) if e["action"] == "oom"]
    assert oom[-1]["size"] == 4 << 22
    assert 0 <= oom[-1]["device_free"] <= 1 << 20
    assert oom[-1]["frames"][0]["line"] == line


@dev
def test_bad_arguments_raise_clearly(device):
    record = memory._record_memory_history
    with pytest.raises(ValueError, match="enabled must be one of"):
        record("yes", device=device)
    with pytest.raises(ValueError, match="context must be one of"):
        record(context="frames", device=device)
    with pytest.raises(ValueError, match="stacks must be one of"):
        record(stacks="cpp", device=device)
    with pytest.raises(ValueError, match="max_entries must be at least 1"):
        record(max_entries=0, device=device)
    for bad in (1.5, True, "10"):
        with pytest.raises(TypeError, match="max_entries must be an int"):
            record(max_entries=bad, device=device)
    with pytest.raises(ValueError, match="skip_actions must be one of"):
        record(skip_actions=["allocs"], device=device)
    with pytest.raises(TypeError, match="skip_actions must be a list"):
        record(skip_actions="alloc", device=device)
    with pytest.raises(TypeError, match="clear_history must be True or False"):
        record(clear_history="no", device=device)
    with pytest.raises(TypeError, match="filename must be a path"):
        memory._dump_snapshot(3, device=device)
    with pytest.raises(ValueError):
        memory._snapshot("tpu")
    with pytest.raises(ndl.DeviceError, match="not available"):
        memory._snapshot("cuda:15")
    # Nothing was switched on by the failed calls, and the next call works.
    x = ndl.init.rand(10, device=device)
    assert _trace(memory._snapshot(device), device) == []
    del x


def test_cuda_memory_spelling_without_a_gpu_raises_clearly():
    if ndl.cuda.is_available():
        pytest.skip("a GPU is usable: test_cuda_memory_spelling runs instead")
    with pytest.raises(ndl.DeviceError, match="not available"):
        ndl.cuda.memory._record_memory_history()
    import needle.cuda.memory as cuda_memory

    assert cuda_memory is ndl.cuda.memory


@pytest.mark.parametrize("unused", [pytest.param(0, marks=needs_cuda, id="cuda")])
def test_cuda_memory_spelling(unused, tmp_path):
    cuda = ndl.cuda()
    ndl.cuda.memory._record_memory_history(max_entries=1000)
    kept = _train_step(cuda)
    snapshot = ndl.cuda.memory._snapshot()
    assert snapshot == memory._snapshot(cuda)
    assert _allocated(snapshot) == ndl.cuda.memory.memory_allocated()
    small = [s for s in snapshot["segments"] if s["segment_type"] == "small"]
    assert all(s["total_size"] == 2 << 20 for s in small if len(s["blocks"]) > 1)
    ndl.cuda.memory._dump_snapshot(str(tmp_path / "cuda.pickle"))
    with open(tmp_path / "cuda.pickle", "rb") as f:
        assert pickle.load(f)["segments"] == snapshot["segments"]
    ndl.cuda.memory._record_memory_history(None)
    del kept
