"""An out-of-memory error that explains itself (needle_c/errors.c, needle/memory/oom.py): its
figures (collected_bytes, largest_free_block, fragmentation_bytes, inactive_split_bytes), the
holders it names and the hint in its message, the snapshot written at the error
(set_oom_snapshot, NEEDLE_OOM_SNAPSHOT) and read by PyTorch's viewer, the bad paths refused
when set, and the error kept whole whatever the explainer or the snapshot does. On every
device: the CPU under a limit, CUDA (the simulator) under one."""

import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import needle as ndl
import needle.memory as mem
import needle_c
from needle import backend_ndarray as nd

from devices import DEVICES
from memory_check import check_alive, clean_memory_state  # noqa: F401  (an autouse fixture)

MiB = 2**20
FIRST_LINE = "out of memory on {device}: tried to allocate"


@pytest.fixture(autouse=True)
def no_oom_snapshot():
    """Every test starts without a snapshot path and leaves none behind."""
    mem.set_oom_snapshot(None)
    yield
    mem.set_oom_snapshot(None)


def block(nbytes, device):
    """A storage of exactly nbytes (float32) on device."""
    return nd.empty((nbytes // 4,), device=device)


def provoke(device, nbytes):
    """The OutOfMemoryError of allocating nbytes on device (under the limit the test set)."""
    with pytest.raises(ndl.OutOfMemoryError) as info:
        block(nbytes, device)
    return info.value


def largest_inactive(device):
    """The largest free block of the device's snapshot: what the allocator could split."""
    sizes = [
        b["size"]
        for s in mem._snapshot(device)["segments"]
        for b in s["blocks"]
        if b["state"] == "inactive"
    ]
    return max(sizes, default=0)


# ------------------------------------------------------------------ the figures


@pytest.mark.parametrize("device", DEVICES)
def test_fields_and_message_when_nothing_can_be_freed(device):
    keep = block(4 * MiB, device)
    limit = mem.memory_reserved(device) + 2 * MiB
    mem.set_memory_limit(device, limit)
    err = provoke(device, 8 * MiB)
    assert isinstance(err, MemoryError) and err.device == device
    assert err.requested == 8 * MiB and err.limit == limit
    assert err.collected_bytes == 0  # nothing was garbage
    assert err.fragmentation_bytes == err.reserved - err.allocated
    stats = mem.memory_stats(device)
    assert err.inactive_split_bytes == stats["inactive_split_bytes.all.current"]
    assert err.largest_free_block == largest_inactive(device)

    lines = str(err).splitlines()
    assert lines[0].startswith(FIRST_LINE.format(device=device))
    assert lines[0].endswith(f"limit {limit} bytes ({limit / MiB:.2f} MiB)")
    assert lines[1] == (
        f"collections freed 0 B for this request; largest free block "
        f"{mem._format_bytes(err.largest_free_block)}; "
        f"{mem._format_bytes(err.fragmentation_bytes)} reserved but not allocated "
        f"({mem._format_bytes(err.inactive_split_bytes)} in inactive splits)"
    )
    assert err.args == (str(err),)
    assert err.holders == mem.holders(device)[:5]
    assert err.snapshot_path is None

    # the process keeps working: with the 4 MiB freed, 6 MiB fit under the limit
    del keep
    again = block(6 * MiB, device)
    assert mem.memory_allocated(device) >= 6 * MiB
    del again
    mem.set_memory_limit(device, None)
    check_alive(device)


@pytest.mark.parametrize("device", DEVICES)
def test_collected_bytes_are_what_the_ladder_freed(device):
    keep = block(4 * MiB, device)
    cycle = [ndl.Tensor(block(3 * MiB, device), device=device)]
    cycle.append(cycle)  # garbage only a full collection frees (a list in the cycle)
    del cycle
    mem.set_memory_limit(device, mem.memory_reserved(device) + 2 * MiB)
    allocated = mem.memory_allocated(device)
    err = provoke(device, 16 * MiB)  # more than the cycle gives back
    assert err.collected_bytes == 3 * MiB
    assert mem.memory_allocated(device) == allocated - 3 * MiB
    assert str(err).splitlines()[1].startswith("collections freed 3.00 MiB for this request;")
    del keep
    mem.set_memory_limit(device, None)
    check_alive(device)


@pytest.mark.parametrize("device", DEVICES)
def test_collected_bytes_of_the_course_graph_cycles(device):
    """graph_mode("needle"): the course's graphs, cycles through every .grad, freed by the
    ladder's scoped collection."""
    x = ndl.Tensor(np.ones((256, 1024), np.float32), device=device, requires_grad=True)
    with ndl.autograd.graph_mode("needle"):
        (ndl.exp(x) * 2).sum().backward()
    del x  # x.grad's graph reaches x: x and the graph are cyclic garbage
    keep = block(4 * MiB, device)
    mem.set_memory_limit(device, mem.memory_reserved(device) + MiB)
    allocated = mem.memory_allocated(device)
    err = provoke(device, 64 * MiB)
    assert err.collected_bytes > 0
    assert err.collected_bytes == allocated - mem.memory_allocated(device)
    del keep
    mem.set_memory_limit(device, None)
    check_alive(device)


@pytest.mark.parametrize("device", DEVICES)
def test_largest_free_block_is_the_allocators(device):
    big = block(8 * MiB, device)
    del big  # cached: on a GPU the next block is split from it
    small = block(3 * MiB, device)
    mem.set_memory_limit(device, mem.memory_reserved(device))
    err = provoke(device, 9 * MiB)  # more than the 8 MiB segment (the CPU's cached block)
    assert err.largest_free_block == largest_inactive(device)
    if device.name == "cuda":
        # the 8 MiB segment holds the 3 MiB block and a free 5 MiB rest that 9 MiB cannot use
        assert err.largest_free_block >= 5 * MiB
        assert err.inactive_split_bytes >= 5 * MiB
        assert f"largest free block {err.largest_free_block / MiB:.2f} MiB" in str(err)
    else:
        # the CPU's blocks are never split, and the ladder gave its cache back
        assert err.largest_free_block == 0 and err.inactive_split_bytes == 0
    del small
    mem.set_memory_limit(device, None)
    check_alive(device)


# ------------------------------------------------------------------ the holders

_HOLDERS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import needle as ndl
    import needle.memory as mem
    from needle import backend_ndarray as nd

    device = ndl.cpu() if sys.argv[1] == "cpu" else ndl.cuda()
    weights = ndl.Tensor(np.ones((1024, 1024), np.float32), device=device)  # 4 MiB, a global

    def step():
        activations = ndl.Tensor(np.ones((512, 1024), np.float32), device=device)  # 2 MiB
        raise ValueError("a failed cell")

    try:
        step()
    except ValueError as e:  # what the interpreter keeps after an uncaught error
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, e.__traceback__
        sys.last_exc = e
    mem.set_memory_limit(device, mem.memory_reserved(device) + 2**20)
    try:
        nd.empty((2**22,), device=device)  # 16 MiB
    except ndl.OutOfMemoryError as err:
        print(json.dumps({"message": str(err), "holders": err.holders}))
    """
)


@pytest.mark.parametrize("device", DEVICES)
def test_holders_and_the_hint_name_the_global_and_the_traceback(device):
    """A clean __main__ and sys.last_* in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_MEMORY_LIMIT",)}
    proc = subprocess.run(
        [sys.executable, "-c", _HOLDERS_SCRIPT, device.name],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    holders = [(r["holder"], r["kind"], r["bytes"], r["tensors"]) for r in out["holders"]]
    assert holders == [
        ("weights", "global", 4 * MiB, 1),
        ("traceback: step (<string>:13)", "traceback", 2 * MiB, 1),
    ]
    lines = out["message"].splitlines()
    assert lines[0].startswith(FIRST_LINE.format(device=device))
    assert lines[2:] == [
        f"top holders on {device}:",
        "  weights (global)                 4.00 MiB in 1 tensor",
        "  traceback: step (<string>:13)    2.00 MiB in 1 tensor",
        "hint: the last traceback holds 2.00 MiB that no name holds: "
        "ndl.memory.release_notebook_references() frees it",
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_no_holder_is_said_so(device):
    def inner():
        local = block(4 * MiB, device)  # a running frame's local: no holder reaches it
        mem.set_memory_limit(device, mem.memory_reserved(device) + MiB)
        try:
            return provoke(device, 8 * MiB)
        finally:
            del local

    err = inner()
    mine = [r for r in err.holders if r["bytes"] >= 4 * MiB]
    assert mine == []
    if not err.holders:
        assert str(err).splitlines()[-1] == (
            f"no name, output cache entry or traceback frame holds a tensor on {device}"
        )
    assert "hint:" not in str(err)
    mem.set_memory_limit(device, None)


# ------------------------------------------------------------------ the snapshot


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("history", [False, True], ids=["state", "history"])
def test_snapshot_written_at_the_error_and_read_by_pytorch(device, history, tmp_path):
    _memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    path = tmp_path / "oom.pickle"
    mem.set_oom_snapshot(path)
    assert mem.get_oom_snapshot() == str(path)
    if history:
        mem._record_memory_history(device=device, clear_history=True)
    try:
        keep = block(4 * MiB, device)
        mem.set_memory_limit(device, mem.memory_reserved(device) + MiB)
        err = provoke(device, 8 * MiB)
    finally:
        if history:
            mem._record_memory_history(None, device=device)
    assert err.snapshot_path == str(path)
    assert str(err).splitlines()[-1] == (
        f"memory snapshot written to {path} (pytorch.org/memory_viz opens it)"
    )
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert not [p for p in tmp_path.iterdir() if p.name != "oom.pickle"]  # no temporary left
    segments = snapshot["segments"]
    assert sum(s["total_size"] for s in segments) == err.reserved
    allocated = [b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sum(b["requested_size"] for b in allocated) == err.allocated
    assert 4 * MiB in [b["requested_size"] for b in allocated]
    index = device.index if device.name == "cuda" else 0
    trace = snapshot["device_traces"][index]
    if history:
        ooms = [e for e in trace if e["action"] == "oom"]
        assert [e["size"] for e in ooms] == [8 * MiB]
        assert any(e["action"] == "alloc" and e["size"] == 4 * MiB for e in trace)
        assert f"{len(trace)} entries" in _memory_viz.trace(snapshot)
    else:
        assert trace == []
    assert f"segments: {len(segments)}" in _memory_viz.segsum(snapshot)
    for html in (_memory_viz.segment_plot(snapshot), _memory_viz.trace_plot(snapshot)):
        assert '"base64": "' in html
    # a second error writes over the first
    os.remove(path)
    err = provoke(device, 8 * MiB)
    assert err.snapshot_path == str(path) and path.exists()
    del keep
    mem.set_memory_limit(device, None)
    check_alive(device)


_ENV_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import needle as ndl
    import needle.memory as mem
    from needle import backend_ndarray as nd

    mem.set_memory_limit("cpu", mem.memory_reserved("cpu") + 2**20)
    try:
        nd.empty((2**20,))  # 4 MiB
    except ndl.OutOfMemoryError as err:
        print(json.dumps({"get": mem.get_oom_snapshot(), "written": err.snapshot_path,
                          "exists": os.path.exists(sys.argv[1])}))
    """
)


def run_with(value, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_MEMORY_LIMIT",)}
    env["NEEDLE_OOM_SNAPSHOT"] = value
    return subprocess.run(
        [sys.executable, "-c", _ENV_SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_snapshot_path_from_the_environment(tmp_path):
    path = str(tmp_path / "env.pickle")
    proc = run_with(f"  {path} ", path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "get": path,
        "written": path,
        "exists": True,
    }
    with open(path, "rb") as f:
        assert "segments" in pickle.load(f)


@pytest.mark.parametrize("case", ["missing directory", "a directory"])
def test_a_bad_environment_path_is_refused_at_import(case, tmp_path):
    value = str(tmp_path / "nowhere" / "x.pickle") if case == "missing directory" else str(tmp_path)
    proc = run_with(value, value)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ValueError: NEEDLE_OOM_SNAPSHOT={value!r}: "), last
    assert last.endswith("expected a file path whose directory exists and is writable"), last
    assert ("does not exist" if case == "missing directory" else "it is a directory") in last


# ------------------------------------------------------------------ bad input


def test_unwritable_paths_are_refused_when_set(tmp_path):
    good = tmp_path / "ok.pickle"
    mem.set_oom_snapshot(str(good))
    missing = tmp_path / "nowhere" / "x.pickle"
    with pytest.raises(ValueError, match=f"{missing}.*does not exist"):
        mem.set_oom_snapshot(missing)
    with pytest.raises(ValueError, match=f"{tmp_path}.*it is a directory"):
        mem.set_oom_snapshot(tmp_path)
    a_file = tmp_path / "file.txt"
    a_file.write_text("not a directory")
    with pytest.raises(ValueError, match="file.txt/x.pickle.*does not exist"):
        mem.set_oom_snapshot(a_file / "x.pickle")
    with pytest.raises(ValueError, match="empty path"):
        mem.set_oom_snapshot("  ")
    for bad in (42, 1.5, ["a.pickle"], True):
        with pytest.raises(TypeError, match="path must be a file path"):
            mem.set_oom_snapshot(bad)
    assert mem.get_oom_snapshot() == str(good)  # a refusal changes nothing
    mem.set_oom_snapshot(os.fsencode(str(good)))  # bytes are a path too
    assert mem.get_oom_snapshot() == str(good)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any permission")
def test_a_read_only_directory_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ValueError, match=f"{locked}.*is not writable"):
            mem.set_oom_snapshot(locked / "x.pickle")
    finally:
        locked.chmod(0o700)


def test_the_explainer_must_be_callable():
    with pytest.raises(TypeError, match="callable or None, got int"):
        needle_c._set_oom_explainer(42)


# ------------------------------------------------------------------ never lose the error


@pytest.fixture
def explainer():
    """Swaps in a test's explainer; puts needle.memory's back."""
    previous = needle_c._set_oom_explainer(None)
    yield needle_c._set_oom_explainer
    needle_c._set_oom_explainer(previous)


@pytest.mark.parametrize("device", DEVICES)
def test_an_explainer_that_raises_never_loses_the_error(device, explainer, monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def broken(err):
        err.args = ("half an explanation",)
        err.holders = ["half"]
        raise RuntimeError("the explainer broke")

    explainer(broken)
    keep = block(4 * MiB, device)
    mem.set_memory_limit(device, mem.memory_reserved(device) + MiB)
    err = provoke(device, 8 * MiB)
    assert str(err).startswith(FIRST_LINE.format(device=device))
    assert "\n" not in str(err)  # the message as it was before the explainer ran
    assert err.requested == 8 * MiB and err.collected_bytes == 0
    assert [str(r.exc_value) for r in reported] == ["the explainer broke"]
    assert reported[0].object is broken
    del keep
    mem.set_memory_limit(device, None)
    check_alive(device)


@pytest.mark.parametrize("device", DEVICES)
def test_an_error_inside_the_explainer_is_raised_plain(device, explainer):
    inner = []

    def allocating(err):  # an explainer must not allocate device memory; this one does
        try:
            block(32 * MiB, device)
        except ndl.OutOfMemoryError as e:
            inner.append(e)
        err.args = (err.args[0] + "\nexplained",)

    explainer(allocating)
    keep = block(4 * MiB, device)
    mem.set_memory_limit(device, mem.memory_reserved(device) + MiB)
    err = provoke(device, 8 * MiB)
    assert str(err).endswith("\nexplained")
    assert len(inner) == 1 and inner[0].requested == 32 * MiB
    assert "\n" not in str(inner[0]) and inner[0].holders is None
    # the guard is released: the next error is explained again
    err = provoke(device, 8 * MiB)
    assert str(err).endswith("\nexplained") and len(inner) == 2
    del keep
    mem.set_memory_limit(device, None)
    check_alive(device)


@pytest.mark.parametrize("device", DEVICES)
def test_a_snapshot_that_cannot_be_written_warns_and_keeps_the_error(device, tmp_path, monkeypatch):
    path = tmp_path / "gone" / "oom.pickle"
    path.parent.mkdir()
    mem.set_oom_snapshot(path)
    path.parent.rmdir()  # the directory went away after the path was set
    keep = block(4 * MiB, device)
    mem.set_memory_limit(device, mem.memory_reserved(device) + MiB)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err = provoke(device, 8 * MiB)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and f"snapshot to {str(path)!r}" in messages[0]
    assert err.snapshot_path is None and err.requested == 8 * MiB
    assert "collections freed" in str(err) and "memory snapshot written" not in str(err)
    # with warnings made errors the snapshot's failure still never replaces the error: the
    # warning, raised in the explainer, is reported as unraisable
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        err = provoke(device, 8 * MiB)
    assert err.requested == 8 * MiB and "\n" not in str(err)
    assert [type(r.exc_value) for r in reported] == [RuntimeWarning]
    del keep
    mem.set_memory_limit(device, None)
    check_alive(device)
