"""Every collection recorded (needle.memory.collection_history, needle_c/memory/collection_log.c):
one record per collection under each trigger (pressure, safe point, the out-of-memory ladder,
aligned, the user's gc.collect() and needle.memory.collect()), never two for one collection,
the ring's bound, clear=, bad input; and the records where they are shown: the snapshot's trace
(rendered by PyTorch's _memory_viz where torch is installed), MemoryMonitor's plot and
memory_summary's pause histogram."""

import base64
import gc
import pickle
import re
import time
import weakref

import numpy as np
import pytest

import needle as ndl
import needle_c as _c
from needle import backend_ndarray as nd
from needle import memory
from needle.memory import alignment
from needle.memory.summary import _pause_histogram

from devices import DEVICES

dev = pytest.mark.parametrize("device", DEVICES)
MiB = 2**20
KEYS = {
    "index",
    "device",
    "trigger",
    "scope",
    "generation",
    "start",
    "seconds",
    "bytes_freed",
    "objects_freed",
}


@pytest.fixture(autouse=True)
def quiet_collector():
    """Python's automatic collector held back (its full collections would be recorded as the
    user's), the policy, limits, clock and recording restored, the record emptied."""
    gc.collect()
    policy = memory.get_gc_policy()
    thresholds = gc.get_threshold()
    was_enabled = gc.isenabled()
    gc.set_threshold(10**9)
    memory.collection_history(clear=True)
    try:
        yield
    finally:
        _c._set_pressure_clock(None)
        gc.set_threshold(*thresholds)
        if was_enabled:
            gc.enable()
        for param in DEVICES:
            device = param.values[0]
            if device.enabled():
                memory.set_memory_limit(device, None)
                memory._record_memory_history(None, device=device)
        memory.set_memory_limit("cpu_numpy", None)
        memory.set_gc_policy(
            **{k: v for k, v in policy.items() if k != "watermark"}, watermark=policy["watermark"]
        )
        gc.collect()


def needle_cycle(device, nbytes):
    """A cycle of needle's objects holding nbytes on device (no backward: no safe point);
    returns a weak reference to it."""
    a = ndl.init.zeros(nbytes // 4, device=device, requires_grad=True)
    a.grad = a * 1.0
    return weakref.ref(a)


def dict_cycle(device, nbytes):
    """A cycle through a dict, holding nbytes on device: only a full collection frees it."""
    holder = {"array": nd.empty((nbytes // 4,), device=device)}
    holder["self"] = holder


def check_record(record, device, trigger, scope, generation, started_after):
    assert set(record) == KEYS
    assert record["device"] == device
    assert record["trigger"] == trigger
    assert record["scope"] == scope
    assert record["generation"] == generation
    assert started_after <= record["start"] <= time.monotonic()
    assert record["seconds"] >= 0.0
    assert record["bytes_freed"] >= 0 and record["objects_freed"] >= 0


def fresh_pressure_state(device):
    _c._reset_pressure_stats(memory._engine_id(device))


@dev
def test_a_pressure_collection_is_recorded(device):
    fresh_pressure_state(device)
    base = memory.memory_allocated(device)
    memory.set_memory_limit(device, memory.memory_reserved(device) + 64 * MiB)
    memory.set_gc_policy(watermark=base + 8 * MiB, max_gc_fraction=0.5)
    now = 1.0
    _c._set_pressure_clock(now)
    before = memory.memory_stats(device)["num_pressure_collections"]
    start = time.monotonic()
    refs = []
    for _ in range(16):
        refs.append(needle_cycle(device, MiB))
        now += 1.0  # a step apart: pacing always has room
        _c._set_pressure_clock(now)
    records = memory.collection_history(device)
    assert records, "no pressure collection ran"
    stats = memory.memory_stats(device)
    assert len(records) == stats["num_pressure_collections"] - before
    first = records[0]
    check_record(first, device, "pressure", "scoped", None, start)
    assert first["bytes_freed"] >= 8 * MiB  # the cycles made before the watermark
    # Each cycle: a tensor and its grad, 1 MiB each (and the grad's op).
    assert first["objects_freed"] >= first["bytes_freed"] // MiB
    assert [r["index"] for r in records] == list(
        range(first["index"], first["index"] + len(records))
    )
    assert refs[0]() is None


def test_a_safe_point_collection_is_recorded():
    device = ndl.cpu()
    fresh_pressure_state(device)
    base = memory.memory_allocated(device)
    memory.set_memory_limit(device, base + 256 * MiB)
    memory.set_gc_policy(growth=0.0, min_growth="4MiB", max_gc_fraction=0.5)
    now = 1.0
    _c._set_pressure_clock(now)
    memory.safe_point()  # the live set seen at safe points starts here
    start = time.monotonic()
    # 6 MiB past the 4 MiB trigger; the allocation path leaves them to the next safe point.
    refs = [needle_cycle(device, MiB) for _ in range(3)]
    now += 1.0
    _c._set_pressure_clock(now)
    memory.safe_point()
    (record,) = memory.collection_history(device)
    check_record(record, device, "safe_point", "scoped", None, start)
    assert record["bytes_freed"] >= 6 * MiB
    assert all(r() is None for r in refs)


@dev
def test_the_out_of_memory_ladder_is_recorded_once(device):
    """The ladder's full collection is gc.collect(), which the gc.callbacks observer sees: it
    is part of the ladder's record, not a second (user) one."""
    gc.disable()  # the soft path honours it: only the out-of-memory path collects
    fresh_pressure_state(device)
    gc.collect()
    memory.empty_cache(device)
    memory.set_memory_limit(device, memory.memory_reserved(device) + 8 * MiB)
    dict_cycle(device, 6 * MiB)
    memory.collection_history(clear=True)
    ooms = memory.memory_stats(device)["num_oom_collections"]
    start = time.monotonic()
    keep = nd.empty((MiB,), device=device)  # 4 MiB: fits only once the cycle is gone
    assert memory.memory_stats(device)["num_oom_collections"] == ooms + 1
    (record,) = memory.collection_history()
    check_record(record, device, "oom", "full", 2, start)
    assert record["bytes_freed"] >= 6 * MiB
    assert record["objects_freed"] >= 1  # the dict (its array goes with it, by refcount)
    del keep


def test_aligned_collections_are_recorded():
    """One process stands for the ranks (tests/test_alignment.py): the agreed ladder is recorded
    on the device it ran on, an agreed Python generation alone as the process's."""
    device = ndl.cpu()
    fresh_pressure_state(device)
    memory.set_memory_limit(device, memory.memory_reserved(device) + 64 * MiB)
    gc.set_threshold(700)  # generation 0 due after a few hundred objects, not the fixture's 10**9
    alignment.reset_stats()
    alignment.enable(True)
    try:
        ref = needle_cycle(device, MiB)
        flags = alignment.local_wants(rank=0, world_size=2)
        wanting_rank = np.zeros_like(flags)
        wanting_rank[0] = 1.0  # the other rank wants a collection
        start = time.monotonic()
        assert alignment.agreed(flags + wanting_rank)
        assert ref() is None
        (ladder,) = memory.collection_history()
        check_record(ladder, device, "aligned", "scoped", None, start)
        assert ladder["bytes_freed"] >= MiB

        memory.collection_history(clear=True)
        threshold0 = gc.get_threshold()[0]
        assert threshold0 < 10**6
        junk = [[] for _ in range(threshold0 + 10)]  # generation 0 due
        flags = alignment.local_wants()
        assert flags[1] == 1.0 and flags[0] == 0.0
        start = time.monotonic()
        assert alignment.agreed(flags)
        (generation,) = memory.collection_history()
        check_record(generation, None, "aligned", "full", 0, start)
        del junk
    finally:
        alignment.enable(False)
        _c._collection_wants()  # the next round's report of these collections' seconds
        alignment.reset_stats()


@dev
def test_the_users_collections_are_recorded(device):
    start = time.monotonic()
    ref = needle_cycle(device, MiB)
    gc.collect()
    assert ref() is None
    ref = needle_cycle(device, MiB)
    result = memory.collect()
    assert result["ran"] and ref() is None
    memory.collect(scope="all")
    gc.collect(0)  # a young generation: Python's automatic collections look the same
    gc.collect(1)
    records = memory.collection_history(device)
    assert [(r["trigger"], r["scope"], r["generation"]) for r in records] == [
        ("user", "full", 2),
        ("user", "scoped", None),
        ("user", "full", 2),
    ]
    for record in records:
        check_record(record, None, record["trigger"], record["scope"], record["generation"], start)
    assert records[0]["bytes_freed"] >= MiB and records[0]["objects_freed"] >= 2
    assert records[1]["bytes_freed"] == result["bytes"] >= MiB
    assert records[1]["objects_freed"] == result["objects"] >= 2
    assert records[0]["start"] <= records[1]["start"] <= records[2]["start"]
    # The process-wide records are every device's: the same for any device and for all.
    assert memory.collection_history() == records


def test_the_ring_keeps_the_latest_records_and_the_index_counts_on():
    capacity = memory.collection_log.CAPACITY
    assert capacity == 1024
    memory.collect()
    (first,) = memory.collection_history(clear=True)
    for _ in range(capacity + 5):
        memory.collect()
    records = memory.collection_history()
    assert len(records) == capacity
    indices = [r["index"] for r in records]
    assert indices == list(range(first["index"] + 6, first["index"] + 6 + capacity))
    assert memory.collection_history(clear=True) == records
    assert memory.collection_history() == []
    memory.collect()
    (after,) = memory.collection_history()
    assert after["index"] == indices[-1] + 1  # a clear does not restart the count


def test_clear_forgets_only_the_records_returned():
    """A device's records and the process-wide ones go; another device's stay."""
    other = ndl.cpu_numpy()
    gc.disable()
    memory.set_memory_limit(other, memory.memory_reserved(other) + 4 * MiB)
    dict_cycle(other, 3 * MiB)
    keep = nd.empty((MiB // 2,), device=other)  # its out-of-memory ladder frees the cycle
    memory.collect()  # a process-wide record
    by_device = {r["device"] for r in memory.collection_history()}
    assert by_device == {other, None}
    cleared = memory.collection_history("cpu", clear=True)
    assert [(r["device"], r["trigger"]) for r in cleared] == [(None, "user")]
    (left,) = memory.collection_history()
    assert (left["device"], left["trigger"]) == (other, "oom")
    assert memory.collection_history("cpu") == []
    del keep


def test_bad_arguments_get_memory_stats_errors():
    for bad in (3, 1.5, "tpu", "cuda:x", [None]):
        with pytest.raises((TypeError, ValueError)) as expected:
            memory.memory_stats(bad)
        with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
            memory.collection_history(bad)
    assert memory.memory_stats("cuda:7") == {}
    assert memory.collection_history("cuda:7") == []  # a GPU this process lacks: nothing
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match="^clear must be True or False"):
            memory.collection_history(clear=bad)
    with pytest.raises(ValueError):
        _c._collection_history(-2, False)
    assert "collection_history" in memory.__all__


# -- where the records are shown ----------------------------------------------------------------


def _trace(snapshot, device):
    return snapshot["device_traces"][device.index if device.name == "cuda" else 0]


@dev
def test_the_snapshot_marks_each_collection_and_pytorch_renders_it(device):
    memory._record_memory_history(device=device)
    ref = needle_cycle(device, MiB)
    memory.collect()
    assert ref() is None
    (record,) = memory.collection_history(device)
    snapshot = memory._snapshot(device)
    trace = _trace(snapshot, device)
    (i,) = [i for i, e in enumerate(trace) if e["action"] == "snapshot"]
    mark = trace[i]
    assert mark["size"] == 0 and mark["addr"] == 0
    assert mark["collection"] == dict(record, device=None)
    (frame,) = mark["frames"]
    assert frame["filename"] == "<needle collection>" and frame["line"] == record["index"]
    assert frame["name"].startswith(f"collection {record['index']}: user, scoped,")
    # The frees it caused follow it.
    freed = sum(e["size"] for e in trace[i + 1 :] if e["action"] == "free_completed")
    assert freed >= MiB
    memory.collection_history(clear=True)
    gone = memory._snapshot(device)
    assert _trace(gone, device)[i]["collection"] is None
    assert "no longer in collection_history" in _trace(gone, device)[i]["frames"][0]["name"]

    _memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    text = _memory_viz.trace(snapshot)
    assert f"{len(trace)} entries" in text
    assert "<needle collection>" in text
    assert "segments:" in _memory_viz.segsum(snapshot)
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        encoded = re.search(r'"base64": "([^"]+)"', html).group(1)
        assert pickle.loads(base64.b64decode(encoded).rstrip(b"\x00")) == snapshot
    freed_pairs = _memory_viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(snapshot)))
    assert any(e["action"] == "snapshot" for e in _trace(freed_pairs, device))


@dev
def test_skipping_snapshot_actions_leaves_the_marks_out(device):
    memory._record_memory_history(skip_actions=["snapshot"], device=device)
    ref = needle_cycle(device, MiB)
    memory.collect()
    assert ref() is None
    actions = {e["action"] for e in _trace(memory._snapshot(device), device)}
    assert "free_completed" in actions and "snapshot" not in actions
    assert len(memory.collection_history(device)) == 1


@dev
def test_the_monitor_shows_the_collections_of_its_window(device, tmp_path):
    gc.collect()  # before the window: not the monitor's
    monitor = memory.MemoryMonitor(device)
    monitor.sample(step=0)
    gc.collect()
    monitor.sample(step=1)
    memory.collect()
    monitor.sample(step=2)
    records = monitor.collection_history()
    assert [(r["scope"], r["trigger"]) for r in records] == [("full", "user"), ("scoped", "user")]
    samples = monitor.samples
    assert samples[0]["time"] <= records[0]["time"] <= samples[1]["time"]
    assert samples[1]["time"] <= records[1]["time"] <= samples[2]["time"]
    assert [r["index"] for r in records] == [
        r["index"] for r in memory.collection_history(device)[-2:]
    ]

    pytest.importorskip("matplotlib")
    ax = monitor.plot(tmp_path / "memory.png")
    marks = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert [line.get_xdata()[0] for line in marks] == [1, 2]  # the steps sampled after each
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert f"{device!r} collections" in labels
    monitor.clear()
    assert monitor.collection_history() == []


def test_the_pause_histogram_buckets():
    seconds = [0.0, 0.0009, 0.001, 0.0099, 0.05, 0.1, 0.99, 1.0, 30.0]
    assert _pause_histogram([{"seconds": s} for s in seconds]) == [
        ("<1 ms", 2),
        ("1-10 ms", 2),
        ("10-100 ms", 1),
        ("0.1-1 s", 2),
        (">=1 s", 2),
    ]


@dev
def test_memory_summary_has_the_pause_histogram(device):
    for _ in range(3):
        memory.collect()
    gc.collect()
    records = memory.collection_history(device)
    assert len(records) == 4
    for abbreviated in (False, True):
        text = memory.memory_summary(device, abbreviated=abbreviated)
        (line,) = [line for line in text.splitlines() if line.startswith("pauses")]
        head, buckets = line.split(": ", 1)
        assert head == "pauses (4 collections recorded)"
        counts = dict(part.rsplit(" ", 1) for part in buckets.split("; "))
        assert list(counts) == ["<1 ms", "1-10 ms", "10-100 ms", "0.1-1 s", ">=1 s"]
        assert dict(_pause_histogram(records)) == {k: int(v) for k, v in counts.items()}
