"""Tests for needle.memory's diagnostics: live_tensors and its summary, record_history,
find_cycles, warn_on_cycles, memory_summary's new sections, and MemoryMonitor."""

import csv
import gc
import inspect
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings
import weakref

import numpy as np
import pytest

import needle as ndl
import needle.memory as mem
from needle.memory import CycleWarning, MemoryMonitor

from devices import DEVICES

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def quiet_collector():
    """Start from no garbage and keep the collector from running mid-test (a test that needs
    it enables it); restore every global setting the tests touch."""
    gc.collect()
    was_enabled = gc.isenabled()
    flags = gc.get_debug()
    policy = mem.get_gc_policy()
    gc.disable()
    try:
        yield
    finally:
        mem.warn_on_cycles(False)
        mem.record_history(False)
        mem.set_gc_policy(**policy)
        gc.set_debug(flags)
        if was_enabled:
            gc.enable()
        gc.collect()


def _tensor(shape, requires_grad=False):
    return ndl.Tensor(np.random.rand(*shape).astype(np.float32), requires_grad=requires_grad)


def _make_cycles(shape):
    """Builds exp(x).sum().backward() and drops every name: in "needle" mode the graph then
    survives only as reference cycles. Returns the bytes of one (shape) tensor."""
    x = _tensor(shape, requires_grad=True)
    ndl.exp(x).sum().backward()
    return x.cached_data.nbytes


def _records_with_shape(shape, **kwargs):
    return [r for r in mem.live_tensors(**kwargs) if r["shape"] == shape]


# -- live_tensors ------------------------------------------------------------------------------


def test_live_tensors_reports_bytes_op_shape_and_requires_grad():
    x = _tensor((37, 13), requires_grad=True)
    y = ndl.exp(x)
    records = {r["id"]: r for r in mem.live_tensors()}
    assert records[id(x)]["bytes"] == 37 * 13 * 4
    assert records[id(x)]["storage_bytes"] == 37 * 13 * 4
    assert records[id(x)]["op"] is None
    assert records[id(x)]["requires_grad"] is True
    assert records[id(x)]["shape"] == (37, 13)
    assert records[id(x)]["type"] == "Tensor"
    assert records[id(y)]["op"] == "Exp"
    assert records[id(y)]["bytes"] == 37 * 13 * 4
    assert records[id(y)]["site"] is None  # history was not recorded
    sizes = [r["bytes"] for r in mem.live_tensors()]
    assert sizes == sorted(sizes, reverse=True)


def test_live_tensors_forgets_deleted_tensors():
    x = _tensor((41, 3))
    y = x + 1.0
    assert len(_records_with_shape((41, 3))) == 2
    del y
    assert len(_records_with_shape((41, 3))) == 1
    del x
    assert _records_with_shape((41, 3)) == []


def test_live_tensors_filters_by_device():
    x = _tensor((29, 5))  # noqa: F841  (kept alive for the listing)
    assert len(_records_with_shape((29, 5), device="cpu")) == 1
    assert len(_records_with_shape((29, 5), device=ndl.cpu())) == 1
    assert _records_with_shape((29, 5), device="cpu_numpy") == []
    if not ndl.cuda().enabled():
        assert mem.live_tensors(device="cuda") == []


def test_live_tensors_reports_storage_of_views():
    x = _tensor((1, 16), requires_grad=True)
    y = ndl.broadcast_to(x, (64, 16))
    (record,) = _records_with_shape((64, 16))
    assert record["bytes"] == y.cached_data.nbytes == 64 * 16 * 4
    assert record["storage_bytes"] == 4 * y.cached_data._storage_size
    assert record["op"] == "BroadcastTo"


def test_live_tensors_include_tensor_tuples():
    a, b = _tensor((23, 2)), _tensor((23, 3))
    t = ndl.make_tuple(a, b)
    (record,) = [r for r in mem.live_tensors() if r["id"] == id(t)]
    assert record["type"] == "TensorTuple"
    assert record["shape"] == ((23, 2), (23, 3))
    assert record["bytes"] == 23 * 5 * 4


def test_live_tensors_summary_groups_and_sorts():
    keep = [_tensor((53, 7), requires_grad=True) for _ in range(3)]
    keep += [ndl.exp(keep[0]), ndl.exp(keep[1])]
    by_shape = {row["key"]: row for row in mem.live_tensors_summary(group_by="shape")}
    assert by_shape[(53, 7)]["count"] == 5
    assert by_shape[(53, 7)]["bytes"] == 5 * 53 * 7 * 4
    by_op = mem.live_tensors_summary(group_by="op")
    assert [row["bytes"] for row in by_op] == sorted((row["bytes"] for row in by_op), reverse=True)
    rows = {row["key"]: row for row in by_op}
    assert rows["Exp"]["count"] >= 2 and rows["Exp"]["bytes"] >= 2 * 53 * 7 * 4
    assert rows["(leaf)"]["count"] >= 3
    assert set(rows["Exp"]) == {"key", "count", "bytes", "storage_bytes"}
    sites = mem.live_tensors_summary(group_by="site")
    assert "(not recorded)" in {row["key"] for row in sites}
    with pytest.raises(ValueError):
        mem.live_tensors_summary(group_by="colour")
    with pytest.raises(ValueError):
        mem.live_tensors(group_by="colour")


# -- record_history ----------------------------------------------------------------------------


def test_record_history_site_points_at_the_creating_line():
    with mem.record_history() as switch:
        x = _tensor((31, 3), requires_grad=True)
        line = inspect.currentframe().f_lineno + 1
        y = ndl.exp(x)
    assert switch.previous is False
    assert isinstance(y._alloc_site, tuple)
    records = {r["id"]: r for r in mem.live_tensors(group_by="site")}
    assert records[id(y)]["site"] == f"{__file__}:{line}"
    assert records[id(y)]["key"] == f"{__file__}:{line}"
    # _tensor's line is in this file too: the innermost frame outside needle is taken.
    assert records[id(x)]["site"].startswith(f"{__file__}:")
    z = ndl.exp(x)  # created after the block: not recorded
    assert not getattr(z, "_alloc_site", None)
    assert {r["id"]: r for r in mem.live_tensors()}[id(z)]["site"] is None


def test_record_history_as_a_call():
    switch = mem.record_history()
    try:
        x = _tensor((2, 2))
        assert x._alloc_site[0][0] == __file__
    finally:
        assert mem.record_history(False).previous is True
    assert switch.previous is False


# -- find_cycles -------------------------------------------------------------------------------


def test_find_cycles_finds_and_frees_needle_mode_cycles():
    gc.collect()
    baseline = mem.memory_allocated()
    flags = gc.get_debug()
    sentinel = object()
    gc.garbage.append(sentinel)
    try:
        with mem.record_history(), ndl.autograd.graph_mode("needle"):
            nbytes = _make_cycles((64, 48))
        assert mem.memory_allocated() > baseline  # only the collector can free them now
        cycles = mem.find_cycles()
    finally:
        gc.garbage.remove(sentinel)
        gc.enable()
    assert gc.get_debug() == flags
    assert mem.memory_allocated() == baseline
    assert len(cycles) == 1
    (cycle,) = cycles
    assert cycle["tensors"] >= 3
    assert cycle["bytes"] >= 3 * nbytes  # x, exp(x) and x.grad at least
    assert {"Exp", "EWiseMul"} <= set(cycle["ops"])
    assert any(site.startswith(f"{__file__}:") for site in cycle["sites"])
    assert cycle["devices"] == ["cpu()"]
    assert "shape=(64, 48)" in cycle["example"]
    assert mem.find_cycles() == []


def test_find_cycles_sorts_components_by_bytes():
    try:
        with ndl.autograd.graph_mode("needle"):
            small = _make_cycles((8, 8))
            large = _make_cycles((128, 64))
        cycles = mem.find_cycles()
    finally:
        gc.enable()
    assert len(cycles) == 2
    assert cycles[0]["bytes"] >= 3 * large > cycles[1]["bytes"] >= 3 * small
    assert mem.find_cycles(device="cpu_numpy") == []


def test_find_cycles_without_free_keeps_the_cycles_in_gc_garbage():
    gc.collect()
    baseline = mem.memory_allocated()
    start = len(gc.garbage)
    try:
        with ndl.autograd.graph_mode("needle"):
            _make_cycles((32, 32))
        held = mem.memory_allocated()
        (cycle,) = mem.find_cycles(free=False)
        kept = gc.garbage[start:]
        assert len(kept) == cycle["objects"]
        assert any(isinstance(obj, ndl.Tensor) for obj in kept)
        assert mem.memory_allocated() == held
        del kept
    finally:
        del gc.garbage[start:]
        gc.enable()
    gc.collect()
    assert mem.memory_allocated() == baseline


def test_find_cycles_finds_nothing_in_cycle_free_mode():
    gc.collect()
    baseline = mem.memory_allocated()
    try:
        with ndl.autograd.graph_mode("cycle_free"):
            _make_cycles((64, 48))
        # Reference counting alone freed the graph.
        assert mem.memory_allocated() == baseline
        assert mem.find_cycles() == []
    finally:
        gc.enable()


def test_find_cycles_restores_debug_flags():
    gc.set_debug(0)
    mem.find_cycles()
    assert gc.get_debug() == 0
    gc.set_debug(gc.DEBUG_SAVEALL)
    start = len(gc.garbage)
    try:
        with ndl.autograd.graph_mode("needle"):
            _make_cycles((16, 16))
        # Even under the caller's DEBUG_SAVEALL, free=True frees the cycles.
        assert len(mem.find_cycles()) == 1
        assert gc.get_debug() == gc.DEBUG_SAVEALL
        assert len(gc.garbage) == start
    finally:
        gc.set_debug(0)
        del gc.garbage[start:]


# -- warn_on_cycles ----------------------------------------------------------------------------


def test_warn_on_cycles_warns_when_a_collection_frees_device_memory():
    assert mem.warn_on_cycles(True) is False
    assert mem.warn_on_cycles(True) is True  # installed once only
    try:
        with ndl.autograd.graph_mode("needle"):
            nbytes = _make_cycles((64, 32))
        with pytest.warns(CycleWarning, match="cycle_free") as record:
            gc.collect()
        warning = record[0].message
        assert re.search(r"\(\d+ bytes\) on cpu\(\)", str(warning))
        assert warning.freed["cpu()"] >= 3 * nbytes
        assert issubclass(CycleWarning, ResourceWarning)
        # A collection that frees no device memory says nothing.
        with warnings.catch_warnings():
            warnings.simplefilter("error", CycleWarning)
            gc.collect()
    finally:
        assert mem.warn_on_cycles(False) is True
    assert mem.warn_on_cycles.__module__ == "needle.memory"
    with ndl.autograd.graph_mode("needle"):
        _make_cycles((64, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CycleWarning)
        gc.collect()  # removed: no warning


def test_warn_on_cycles_is_silent_for_find_cycles():
    mem.warn_on_cycles(True)
    with ndl.autograd.graph_mode("needle"):
        _make_cycles((32, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CycleWarning)
        assert len(mem.find_cycles()) == 1


def test_warn_on_cycles_inside_a_pressure_collection():
    """The allocator runs the collector (and so the callback) in the middle of an allocation;
    the callback must work there and the allocation must go on."""
    with ndl.autograd.graph_mode("needle"):
        for _ in range(4):
            _make_cycles((256, 256))
    held = mem.memory_allocated()
    before = mem.memory_stats()["num_pressure_collections"]
    mem.warn_on_cycles(True)
    gc.enable()  # pressure collections honour gc.disable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mem.set_gc_policy(watermark=held // 2, max_gc_fraction=0.5)
        keep = []
        # A few tries: the pacer may skip a collection right after another one.
        for _ in range(200):
            keep.append(_tensor((64, 64)))
            if mem.memory_stats()["num_pressure_collections"] > before:
                break
    assert mem.memory_stats()["num_pressure_collections"] > before
    assert len(keep[-1].numpy()) == 64
    assert any(issubclass(w.category, CycleWarning) for w in caught)


def test_warn_on_cycles_callback_never_raises():
    mem.warn_on_cycles(True)
    with ndl.autograd.graph_mode("needle"):
        _make_cycles((16, 16))
    with warnings.catch_warnings():
        # A filter that turns the warning into an error must not make gc raise.
        warnings.simplefilter("error", CycleWarning)
        gc.collect()
    mem._cycle_callback("stop", {})  # a "stop" without a "start" is ignored
    mem._cycle_callback("bogus", None)


def test_cycle_warnings_are_shown_outside_pytest():
    """Python ignores ResourceWarnings by default; warn_on_cycles must not be silent."""
    script = textwrap.dedent("""
        import gc
        import numpy as np
        import needle as ndl
        import needle.memory as mem
        gc.disable()
        mem.warn_on_cycles()
        with ndl.autograd.graph_mode("needle"):
            x = ndl.Tensor(np.ones((8, 8), dtype=np.float32), requires_grad=True)
            ndl.exp(x).sum().backward()
            del x
        gc.collect()
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "CycleWarning" in result.stderr and "cycle_free" in result.stderr


# -- memory_summary ----------------------------------------------------------------------------


def test_memory_summary_has_the_diagnostics_sections():
    keep = ndl.exp(_tensor((19, 17), requires_grad=True))  # noqa: F841
    text = mem.memory_summary()
    assert text.startswith("needle memory summary for cpu()")
    assert "live tensors by op" in text
    assert "Exp" in text
    assert "gc policy: enabled" in text
    for word in ("pressure", "at safe points", "out-of-memory", "deferred", "gc time", "freed"):
        assert word in text
    assert mem.memory_summary("cuda" if not ndl.cuda().enabled() else "cpu_numpy")


# -- MemoryMonitor -----------------------------------------------------------------------------


def test_monitor_sample_records_allocations():
    monitor = MemoryMonitor()
    first = monitor.sample(step=0)
    x = _tensor((256, 256))
    second = monitor.sample(step=1)
    assert second["allocated"] - first["allocated"] == x.cached_data.nbytes
    assert second["reserved"] >= second["allocated"]
    assert [s["step"] for s in monitor.samples] == [0, 1]
    assert set(first) == set(MemoryMonitor.FIELDS)
    assert second["time"] >= first["time"] >= 0.0
    assert monitor.collections() == []
    assert mem.MemoryMonitor is MemoryMonitor


def test_monitor_thread_samples_in_the_background():
    with MemoryMonitor(interval=0.005) as monitor:
        assert monitor.running
        deadline = time.monotonic() + 5.0
        while len(monitor.samples) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not monitor.running
    samples = monitor.samples
    assert len(samples) >= 5  # four or more, plus the one stop() takes
    assert all(s["step"] is None for s in samples)
    assert [s["time"] for s in samples] == sorted(s["time"] for s in samples)
    with pytest.raises(ValueError):
        MemoryMonitor(interval=0)


def test_monitor_collections_marks_pressure_collections():
    with ndl.autograd.graph_mode("needle"):
        for _ in range(4):
            _make_cycles((256, 256))
    monitor = MemoryMonitor()
    monitor.sample(step=0)
    gc.enable()
    mem.set_gc_policy(watermark=mem.memory_allocated() // 2, max_gc_fraction=0.5)
    keep = []
    for step in range(1, 200):
        keep.append(_tensor((64, 64)))
        monitor.sample(step=step)
        if monitor.collections():
            break
    (point,) = monitor.collections()
    assert point["new_collections"] >= 1
    assert point["allocated"] < monitor.samples[0]["allocated"]


def test_monitor_to_csv(tmp_path):
    monitor = MemoryMonitor()
    for step in range(3):
        monitor.sample(step=step)
    monitor.sample()
    path = monitor.to_csv(tmp_path / "memory.csv")
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == list(MemoryMonitor.FIELDS)
    assert len(rows) == 5
    assert [row[1] for row in rows[1:]] == ["0", "1", "2", ""]
    assert int(rows[1][2]) == monitor.samples[0]["allocated"]


def test_monitor_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    monitor = MemoryMonitor()
    keep = []
    for step in range(5):
        keep.append(_tensor((64, 64)))
        monitor.sample(step=step)
    path = tmp_path / "memory.png"
    ax = monitor.plot(path, title="five steps")
    assert ax.get_title() == "five steps"
    assert ax.get_xlabel() == "step"
    with open(path, "rb") as handle:
        assert handle.read(8) == PNG_SIGNATURE
    with pytest.raises(ValueError):
        MemoryMonitor().plot(tmp_path / "empty.png")


def test_monitors_share_one_axes(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    first, second = MemoryMonitor(), MemoryMonitor()
    for t in range(3):
        first.sample()
        second.sample()
        time.sleep(0.001)
    figure = Figure()
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    assert first.plot(ax=ax, label="first") is ax
    path = tmp_path / "both.png"
    assert second.plot(path, ax=ax, label="second") is ax
    labels = [line.get_label() for line in ax.get_lines()]
    assert {"first allocated", "first reserved", "second allocated", "second reserved"} <= set(
        labels
    )
    assert ax.get_xlabel() == "time (s)"
    assert os.path.getsize(path) > 0
    with open(path, "rb") as handle:
        assert handle.read(8) == PNG_SIGNATURE


# -- tensor_snapshot and live_tensors(since=) --------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_live_tensors_since_a_snapshot_lists_only_newer_tensors(device):
    older = ndl.Tensor(np.ones((5, 7), np.float32), device=device)
    snapshot = mem.tensor_snapshot()
    assert older in snapshot and len(snapshot) >= 1
    newer = ndl.exp(ndl.Tensor(np.ones((6, 7), np.float32), device=device))
    records = mem.live_tensors(device, since=snapshot)
    # exp's result and the leaf its graph keeps: nothing older.
    assert sorted((r["shape"], str(r["op"]), r["dtype"], r["bytes"]) for r in records) == [
        ((6, 7), "Exp", "float32", 168),
        ((6, 7), "None", "float32", 168),
    ]
    assert {r["shape"] for r in mem.live_tensors(device)} >= {(5, 7), (6, 7)}
    (row,) = mem.live_tensors_summary(device, group_by="shape", since=snapshot)
    assert (row["key"], row["count"], row["bytes"]) == ((6, 7), 2, 336)
    del newer
    assert mem.live_tensors(device, since=snapshot) == []
    assert older in snapshot


def test_a_snapshot_does_not_hide_a_newer_tensor_at_an_older_ones_address():
    older = _tensor((5, 7))
    snapshot = mem.tensor_snapshot()
    alive = len(snapshot)
    del older
    assert len(snapshot) == alive - 1  # it holds no tensor alive
    newer = _tensor((6, 7))
    other = _tensor((1,))
    # Whether CPython hands the freed address to the next tensor depends on its allocator's
    # state; make the snapshot hold an entry at newer's address for a different object.
    snapshot._refs[id(newer)] = weakref.ref(other)
    assert newer not in snapshot and other not in snapshot
    assert [r["shape"] for r in mem.live_tensors(since=snapshot)] == [(6, 7), (1,)]


def test_live_tensors_since_rejects_what_is_not_a_snapshot():
    for bad in ({1, 2}, "snapshot", 3):
        with pytest.raises(TypeError, match="since must be a TensorSnapshot"):
            mem.live_tensors(since=bad)
        with pytest.raises(TypeError, match="since must be a TensorSnapshot"):
            mem.live_tensors_summary(since=bad)


def test_live_tensors_reports_dtype():
    snapshot = mem.tensor_snapshot()
    a, b = _tensor((2, 3)), _tensor((4,))
    pair = ndl.make_tuple(a, b)
    records = {r["type"]: r for r in mem.live_tensors(since=snapshot) if r["shape"] == (2, 3)}
    assert records["Tensor"]["dtype"] == "float32"
    (tup,) = [r for r in mem.live_tensors(since=snapshot) if r["type"] == "TensorTuple"]
    assert tup["dtype"] == ("float32", "float32") and tup["shape"] == ((2, 3), (4,))
    del pair, a, b


# -- memory_summary(abbreviated=) and the flags ------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_memory_summary_abbreviated_leaves_out_the_breakdowns(device):
    keep = ndl.exp(ndl.Tensor(np.ones((19, 17), np.float32), device=device))  # noqa: F841
    full = mem.memory_summary(device)
    short = mem.memory_summary(device, abbreviated=True)
    if device.name == "cuda":
        assert ndl.cuda.memory_summary(device, abbreviated=True) == short
    # The same table, allocator and limit lines, then the collection totals and the pause
    # histogram, and nothing else.
    lines = short.splitlines()
    limit = next(i for i, line in enumerate(lines) if line.startswith("limit: "))
    assert lines[: limit + 1] == full.splitlines()[: limit + 1]
    assert lines[1].split() == ["current", "peak", "total", "alloc", "total", "freed"]
    assert lines[limit + 1].startswith("collections: pressure")
    assert lines[limit + 2].startswith("pauses (")
    assert lines[limit + 2] in full.splitlines()
    assert len(lines) == limit + 3
    for section in ("live tensors by op", "Exp", "gc policy:", "ladder:"):
        assert section in full and section not in short
    assert mem.memory_summary(device, False) == full


def test_flags_take_only_true_or_false():
    for bad in ("no", "False", 0, 1, 1.0, None, [True]):
        for call, name in (
            (lambda v: mem.memory_summary(abbreviated=v), "abbreviated"),
            (lambda v: mem.record_history(v), "enabled"),
            (lambda v: mem.set_gc_visible(v), "visible"),
            (lambda v: mem.warn_on_cycles(v), "enabled"),
            (lambda v: mem.find_cycles(free=v), "free"),
        ):
            with pytest.raises(TypeError, match=f"^{name} must be True or False, got "):
                call(bad)
    assert mem.gc_visible() is True
    assert mem.warn_on_cycles(False) is False
