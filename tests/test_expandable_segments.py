"""expandable_segments (NEEDLE_ALLOC_CONF, needle.memory.set_allocator_settings) on the CUDA
allocator: large blocks carved from one address range per GPU that the driver's virtual
memory calls give memory page by page (csrc/cuda/cuda_allocator.cu, the calls in
cuda_census.cu; the simulator's own in csrc/cuda/sim/sim_vm.cc). A free block at the edge of
the mapped memory grows in place, release gives back the whole pages of free blocks wherever
they lie, snapshots show each mapped run as an expandable segment; the CPU refuses the
setting. The CUDA cases run on the simulated build in CI."""

import os
import subprocess
import sys

import numpy as np
import pytest

import needle as ndl
import needle_c
from needle import backend_ndarray as nd

from devices import needs_cuda

MiB = 2**20
CUDA = ndl.cuda()
DEFAULTS = "max_split_size_mb:None,garbage_collection_threshold:None"


def cuda(test):
    for mark in needs_cuda:
        test = mark(test)
    return test


@pytest.fixture(autouse=True)
def default_settings():
    """Each test starts and ends with the default settings and no cache."""
    off = DEFAULTS + (",expandable_segments:False" if needle_c._cuda_compiled() else "")
    ndl.memory.set_allocator_settings(off)
    limit = ndl.memory.get_memory_limit(CUDA) if CUDA.enabled() else None
    yield
    if CUDA.enabled():
        ndl.memory.set_memory_limit(CUDA, limit)
    ndl.memory.set_allocator_settings(off)
    for device in (ndl.cpu(), CUDA):
        ndl.memory.empty_cache(device)


def expandable_on():
    ndl.memory.set_allocator_settings("expandable_segments:True")
    assert ndl.memory.get_allocator_settings(CUDA)["expandable_segments"] is True


def block(nbytes):
    """One allocation of nbytes (a multiple of 4) on the GPU, nothing else."""
    return CUDA.empty((nbytes // 4,))


def stats():
    return ndl.memory.memory_stats(CUDA)


def expandable_segments():
    return [s for s in ndl.memory._snapshot(CUDA)["segments"] if s["is_expandable"]]


def check_consistent():
    """The fragmentation statistics agree with each other and with the snapshot."""
    s = stats()
    for key in ("segment.all", "active.all", "inactive_split.all", "inactive_split_bytes.all"):
        assert s[f"{key}.current"] == s[f"{key}.allocated"] - s[f"{key}.freed"], key
        assert 0 <= s[f"{key}.current"] <= s[f"{key}.peak"], key
    segments = ndl.memory._snapshot(CUDA)["segments"]
    assert len(segments) == s["segment.all.current"]
    assert sum(seg["total_size"] for seg in segments) == s["reserved_bytes.all.current"]
    # A free block is an inactive split when its segment (its mapped run) holds others.
    splits = [
        b
        for seg in segments
        if len(seg["blocks"]) > 1
        for b in seg["blocks"]
        if b["state"] == "inactive"
    ]
    assert len(splits) == s["inactive_split.all.current"]
    assert sum(b["size"] for b in splits) == s["inactive_split_bytes.all.current"]
    for seg in segments:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        addresses = [b["address"] for b in seg["blocks"]]
        assert addresses[0] == seg["address"] and addresses == sorted(addresses)


# ------------------------------------------------------------- where it is refused


def test_cpu_refuses_with_the_reason():
    with pytest.raises(ValueError, match="host blocks are never split"):
        ndl.memory.set_allocator_settings("cpu:expandable_segments:True")
    with pytest.raises(ValueError, match="never splits a host block"):
        needle_c._set_allocator_settings(ndl.cpu()._id, 0, 0.0, True)
    assert ndl.memory.get_allocator_settings("cpu")["expandable_segments"] is False


def test_cpu_only_build_refuses_with_the_reason():
    if needle_c._cuda_compiled():
        pytest.skip("this build has the CUDA backend")
    with pytest.raises(ValueError, match="CPU-only build"):
        ndl.memory.set_allocator_settings("expandable_segments:True")
    done = subprocess.run(
        [sys.executable, "-c", "import needle"],
        env=dict(os.environ, NEEDLE_ALLOC_CONF="expandable_segments:True"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "NEEDLE_ALLOC_CONF='expandable_segments:True'" in done.stderr
    assert "CPU-only build" in done.stderr


# ------------------------------------------------------------------ on the GPU


@cuda
def test_a_free_block_grows_in_place():
    expandable_on()
    ndl.memory.empty_cache(CUDA)
    base = ndl.memory.memory_reserved(CUDA)
    ndl.cuda.reset_work_counters()
    first = block(10 * MiB)
    (first_segment,) = expandable_segments()
    assert ndl.memory.memory_reserved(CUDA) == base + 10 * MiB
    assert ndl.cuda.work_counters()["device_mallocs"] == 5  # a 2 MiB chunk mapped per page
    del first
    grown = block(14 * MiB)  # the cached 10 MiB and 4 MiB more, mapped after them
    assert ndl.memory.memory_reserved(CUDA) == base + 14 * MiB
    assert ndl.cuda.work_counters()["device_mallocs"] == 7
    (segment,) = expandable_segments()
    assert segment["address"] == first_segment["address"]
    assert segment["total_size"] == 14 * MiB
    assert [b["state"] for b in segment["blocks"]] == ["active_allocated"]
    assert segment["blocks"][0]["requested_size"] == 14 * MiB
    check_consistent()
    del grown
    ndl.memory.empty_cache(CUDA)
    assert ndl.memory.memory_reserved(CUDA) == base
    assert expandable_segments() == []
    counts = ndl.cuda.work_counters()
    assert counts["device_frees"] == 7 and counts["host_syncs"] >= 1  # waited, then unmapped
    check_consistent()


@cuda
def test_data_spanning_pages_reads_back_and_computes():
    expandable_on()
    values = np.arange(3 * MiB // 4 * 3, dtype=np.float32)  # 9 MiB: five 2 MiB pages
    x = nd.array(values, device=CUDA)
    assert any(s["is_expandable"] for s in ndl.memory._snapshot(CUDA)["segments"])
    np.testing.assert_array_equal((x + 1).numpy(), values + 1)
    np.testing.assert_array_equal(x.numpy(), values)


@cuda
def test_release_unmaps_free_pages_in_the_middle():
    expandable_on()
    ndl.memory.empty_cache(CUDA)
    base = ndl.memory.memory_reserved(CUDA)
    segments = stats()["segment.all.current"]
    a, b, c = block(10 * MiB), block(10 * MiB), block(10 * MiB)
    assert stats()["segment.all.current"] == segments + 1  # one mapped run
    del b
    assert stats()["inactive_split_bytes.all.current"] >= 10 * MiB
    ndl.memory.empty_cache(CUDA)
    # The hole's whole pages went back: two runs now, and 10 MiB less reserved.
    assert ndl.memory.memory_reserved(CUDA) == base + 20 * MiB
    assert stats()["segment.all.current"] == segments + 2
    assert [s["total_size"] for s in expandable_segments()] == [10 * MiB, 10 * MiB]
    summary = ndl.memory.memory_summary(CUDA, abbreviated=True)
    assert "expandable_segments on" in summary
    rows = {line[:12].strip(): line[12:].split() for line in summary.splitlines()}
    assert int(rows["segments"][0]) == segments + 2
    check_consistent()
    refill = block(10 * MiB)  # mapped into the hole: one run again
    assert stats()["segment.all.current"] == segments + 1
    assert ndl.memory.memory_reserved(CUDA) == base + 30 * MiB
    check_consistent()
    del a, c, refill


def varying_shapes_run():
    """A training-like pattern whose shapes change every step: each of 3 layers keeps 4
    activations sized by (batch, seq), frees them in reverse with transient gradients
    beside them. Returns (peak allocated, peak reserved) above the start."""
    ndl.memory.empty_cache(CUDA)
    allocated0 = ndl.memory.memory_allocated(CUDA)
    reserved0 = ndl.memory.memory_reserved(CUDA)
    ndl.memory.reset_peak_memory_stats(CUDA)
    plan = [(8, 40), (32, 120), (16, 72), (24, 192), (8, 16), (32, 88), (16, 160), (24, 56)]
    for batch, seq in plan:
        tokens = batch * seq
        sizes = [tokens * 128, 3 * tokens * 128, batch * 4 * seq * seq, 4 * tokens * 128]
        saved = [[CUDA.empty((n,)) for n in sizes] for _ in range(3)]
        while saved:
            acts = saved.pop()
            transient = [CUDA.empty((n,)) for n in sizes[1:3]]
            del transient, acts
    peak_allocated = ndl.memory.max_memory_allocated(CUDA) - allocated0
    peak_reserved = ndl.memory.max_memory_reserved(CUDA) - reserved0
    ndl.memory.empty_cache(CUDA)
    return peak_allocated, peak_reserved


@cuda
def test_varying_shapes_keep_reserved_near_the_peak():
    default_allocated, default_reserved = varying_shapes_run()
    expandable_on()
    allocated, reserved = varying_shapes_run()
    assert allocated == default_allocated  # the same requests
    assert reserved <= 1.1 * allocated
    assert default_reserved > 1.1 * default_allocated  # what the setting fixes
    check_consistent()


@cuda
def test_empty_cache_returns_everything():
    expandable_on()
    ndl.memory.empty_cache(CUDA)
    base = ndl.memory.memory_reserved(CUDA)
    free0, _ = ndl.cuda.mem_get_info()
    kept = [block(n * MiB) for n in (6, 13, 3, 22)]
    assert ndl.memory.memory_reserved(CUDA) >= base + 44 * MiB
    del kept
    ndl.memory.empty_cache(CUDA)
    assert ndl.memory.memory_reserved(CUDA) == base
    free1, _ = ndl.cuda.mem_get_info()
    if needle_c._cuda_simulated():  # nothing else uses the simulated GPU's memory
        assert free1 == free0
    assert expandable_segments() == []


@cuda
def test_out_of_memory_under_a_limit_leaves_the_allocator_usable():
    expandable_on()
    ndl.memory.empty_cache(CUDA)
    base = ndl.memory.memory_reserved(CUDA)
    ndl.memory.set_memory_limit(CUDA, base + 64 * MiB)
    first = block(40 * MiB)
    ooms = stats()["num_ooms"]
    with pytest.raises(ndl.OutOfMemoryError, match="out of memory"):
        block(40 * MiB)
    assert stats()["num_ooms"] == ooms + 1
    assert ndl.memory.memory_reserved(CUDA) <= base + 64 * MiB
    check_consistent()
    del first
    again = block(60 * MiB)  # the freed pages serve it, grown in place
    assert ndl.memory.memory_reserved(CUDA) <= base + 64 * MiB
    check_consistent()
    del again


@cuda
def test_switching_at_run_time_with_memory_held():
    values = np.full(4 * MiB // 4, 3.0, np.float32)
    before = len(ndl.memory._snapshot(CUDA)["segments"])
    plain = nd.array(values, device=CUDA)  # a cudaMalloc segment, held across the switch
    expandable_on()
    grown = nd.array(values * 2, device=CUDA)
    assert len(expandable_segments()) == 1
    ndl.memory.set_allocator_settings("expandable_segments:False")
    later = block(6 * MiB)  # a new cudaMalloc segment: the range no longer grows
    assert len(expandable_segments()) == 1
    assert len(ndl.memory._snapshot(CUDA)["segments"]) >= before + 3
    np.testing.assert_array_equal(plain.numpy(), values)
    np.testing.assert_array_equal(grown.numpy(), values * 2)
    del grown
    ndl.memory.empty_cache(CUDA)  # nothing mapped and the setting off: the range goes
    assert expandable_segments() == []
    np.testing.assert_array_equal(plain.numpy(), values)
    check_consistent()
    del plain, later


@cuda
def test_driver_out_of_memory_is_an_out_of_memory_error():
    """The simulated GPU's own capacity (cuMemCreate refusing), not a needle limit."""
    if not needle_c._cuda_simulated():
        pytest.skip("sets the simulated GPU's memory size")
    code = (
        "import needle as ndl\n"
        "d = ndl.cuda()\n"
        "keep = d.empty((200 * 2**18,))\n"  # 200 MiB of 256
        "try:\n"
        "    d.empty((100 * 2**18,))\n"
        "except ndl.OutOfMemoryError as e:\n"
        "    print('oom', ndl.memory.memory_reserved(d) <= 256 * 2**20)\n"
        "del keep\n"
        "x = d.empty((150 * 2**18,))\n"
        "print('usable', ndl.memory.memory_reserved(d) <= 256 * 2**20)\n"
    )
    env = dict(os.environ, NEEDLE_SIM_MEMORY="256MiB", NEEDLE_ALLOC_CONF="expandable_segments:True")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["oom", "True", "usable", "True"]


@cuda
def test_snapshot_renders_in_pytorchs_viewer():
    _memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    expandable_on()
    ndl.memory.empty_cache(CUDA)
    ndl.memory._record_memory_history(device=CUDA, clear_history=True)
    try:
        kept = [block(n * MiB) for n in (5, 9, 4, 12)]
        del kept[1]  # a free block between two in use: an inactive split
        snapshot = ndl.memory._snapshot(CUDA)
    finally:
        ndl.memory._record_memory_history(enabled=None, device=CUDA)
    expandable = [s for s in snapshot["segments"] if s["is_expandable"]]
    assert len(expandable) == 1
    states = [b["state"] for b in expandable[0]["blocks"]]
    assert states == ["active_allocated", "inactive", "active_allocated", "active_allocated"]
    assert expandable[0]["requested_size"] == 21 * MiB
    check_consistent()
    trace = snapshot["device_traces"][CUDA.index]
    mapped = sum(e["size"] for e in trace if e["action"] == "segment_alloc")
    assert mapped == expandable[0]["total_size"]  # the pages mapped, as segment_alloc events
    summary = _memory_viz.segsum(snapshot)
    assert f"segments: {len(snapshot['segments'])}" in summary
    lines = _memory_viz.memory(snapshot, format_flamegraph=lambda s: s)
    allocated_in_lines = sum(
        int(line.rsplit(" ", 1)[1])
        for line in lines.splitlines()
        if ";active_allocated;" in line and "<gaps>" not in line
    )
    assert allocated_in_lines == ndl.memory.memory_allocated(CUDA)
    assert "test_expandable_segments.py" in _memory_viz.segments(snapshot, format_flamegraph=str)
    assert f"{len(trace)} entries" in _memory_viz.trace(snapshot)
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        assert '"base64": "' in html
    del kept


@cuda
def test_a_gpu_without_virtual_memory_management_refuses_with_the_reason():
    if not needle_c._cuda_simulated():
        pytest.skip("switches the simulated driver's virtual memory calls off")
    env = dict(os.environ, NEEDLE_SIM_VMM="0", NEEDLE_ALLOC_CONF="expandable_segments:True")
    done = subprocess.run(
        [sys.executable, "-c", "import needle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "NEEDLE_ALLOC_CONF='expandable_segments:True'" in done.stderr
    assert "does not support the driver's virtual memory calls" in done.stderr
    code = (
        "import needle as ndl\n"
        "try:\n"
        "    ndl.memory.set_allocator_settings('expandable_segments:True')\n"
        "except ValueError as e:\n"
        "    print('refused')\n"
        "print(ndl.memory.get_allocator_settings('cuda')['expandable_segments'])\n"
        "print((ndl.cuda().empty((2**22,)).shape))\n"
    )
    env.pop("NEEDLE_ALLOC_CONF")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["refused", "False", "(4194304,)"]


@cuda
def test_random_allocations_keep_the_books_and_the_data():
    """Allocations of random large sizes, frees in random order and releases between them: the
    statistics agree with the snapshot after each step, and every live array keeps its
    values (no two blocks share memory, no page a block uses is unmapped)."""
    expandable_on()
    ndl.memory.empty_cache(CUDA)
    base = ndl.memory.memory_reserved(CUDA)
    rng = np.random.default_rng(0)
    live = {}
    for step in range(60):
        action = rng.random()
        if action < 0.55 or not live:
            n = int(rng.integers(2**18, 6 * 2**20))  # 1 MiB to 24 MiB of float32
            live[step] = (nd.array(np.full(n, float(step), np.float32), device=CUDA), n)
        elif action < 0.9:
            del live[list(live)[int(rng.integers(len(live)))]]
        else:
            ndl.memory.empty_cache(CUDA)
        check_consistent()
    for value, (array, n) in live.items():
        got = array.numpy()
        assert got.shape == (n,) and np.all(got == value), value
    del array, got
    live.clear()
    ndl.memory.empty_cache(CUDA)
    assert ndl.memory.memory_reserved(CUDA) == base


@cuda
def test_garbage_collection_threshold_releases_free_pages_before_mapping_more():
    """Mapping 14 MiB more would pass half the budget: the threshold's release unmaps the
    free 10 MiB first, and the request is planned again against what is left."""
    expandable_on()
    ndl.memory.empty_cache(CUDA)
    base = ndl.memory.memory_reserved(CUDA)
    ndl.memory.set_memory_limit(CUDA, base + 64 * MiB)
    ndl.memory.set_allocator_settings("garbage_collection_threshold:0.5")
    x, y = block(10 * MiB), block(10 * MiB)
    del x
    releases = stats()["num_gc_releases"]
    z = block(14 * MiB)
    assert stats()["num_gc_releases"] == releases + 1
    assert ndl.memory.memory_reserved(CUDA) == base + 24 * MiB
    assert [s["total_size"] for s in expandable_segments()] == [24 * MiB]
    check_consistent()
    del y, z
