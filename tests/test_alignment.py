"""Aligned collections in one process (needle.memory.alignment; the two-rank behaviour is in
tests/test_aligned_ranks.py): a soft collection becomes a want, the want goes out in the flags,
and the collection runs only when the ranks agreed, right after the all-reduce that carried the
wants; the out-of-memory path stays local; Python's automatic collector is taken over and given
back."""

import gc

import numpy as np
import pytest
from garbage import dict_cycle, needle_cycle

import needle_c as _c
from needle import backend_ndarray as nd
from needle import memory
from needle.memory import alignment

MiB = 2**20


@pytest.fixture
def aligned_cpu():
    """A CPU limit that makes pressure collections due, alignment on; restores everything."""
    gc.collect()
    cpu = memory._engine_id("cpu")
    _c._reset_pressure_stats(cpu)
    _c._collection_wants()  # drops aligned seconds an earlier test's collections left pending
    policy = memory.get_gc_policy()
    was_enabled = gc.isenabled()
    memory.set_memory_limit("cpu", 64 * MiB)
    memory.set_gc_policy(watermark="16MiB")
    alignment.reset_stats()
    alignment.enable(True)
    try:
        yield
    finally:
        alignment.enable(False)
        assert gc.isenabled() == was_enabled
        memory.set_memory_limit("cpu", None)
        memory.set_gc_policy(
            **{k: v for k, v in policy.items() if k != "watermark"}, watermark=policy["watermark"]
        )
        gc.collect()


def test_a_soft_collection_waits_for_agreement(aligned_cpu):
    before = memory.memory_stats()
    refs = [needle_cycle(MiB) for _ in range(24)]  # past the 16 MiB watermark
    assert all(r() is not None for r in refs)  # nothing collected locally
    stats = memory.memory_stats()
    assert stats["num_aligned_wants"] == before["num_aligned_wants"] + 1
    assert stats["num_pressure_collections"] == before["num_pressure_collections"]

    flags = alignment.local_wants(rank=1, world_size=2)
    assert flags.shape == (alignment.num_wants(2),) == (6,)
    assert flags.dtype == np.float32
    assert flags[0] == 1.0
    memory.safe_point()  # not agreed: a safe point does not collect either
    assert all(r() is not None for r in refs)

    other_rank = np.zeros_like(flags)
    other_rank[4] = 0.25  # rank 0's last aligned collection took 0.25 s
    assert alignment.agreed(flags + other_rank) is True
    assert all(r() is None for r in refs)
    stats = memory.memory_stats()
    assert stats["num_aligned_collections"] == before["num_aligned_collections"] + 1
    assert stats["aligned_rounds_waited"] == before["aligned_rounds_waited"] + 1
    assert stats["num_pressure_collections"] == before["num_pressure_collections"] + 1
    figures = alignment.stats()
    assert figures["rounds"] == 1 and figures["collections_agreed"] == 1
    assert figures["wait_saved_seconds"] == pytest.approx(0.0)  # only one rank collected

    # The next round reports this rank's collection time in its own slot; the wait saved is the
    # sum minus the max of both ranks' times.
    flags = alignment.local_wants(rank=1, world_size=2)
    assert flags[0] == 0.0 and flags[5] > 0.0
    other_rank[4] = 2 * flags[5]
    assert alignment.agreed(flags + other_rank) is False  # nobody wants a collection
    assert alignment.stats()["wait_saved_seconds"] == pytest.approx(float(flags[5]), rel=1e-5)


def test_every_rank_collects_when_one_wanted(aligned_cpu):
    """A rank with no want of its own runs the agreed collection too (that is the alignment)."""
    ref = needle_cycle(MiB)  # below the watermark: no want here
    flags = alignment.local_wants(rank=0, world_size=2)
    assert flags[0] == 0.0
    wanting_rank = np.zeros_like(flags)
    wanting_rank[0] = 1.0
    assert alignment.agreed(flags + wanting_rank)
    assert ref() is None


def test_python_generations_are_taken_over_and_aligned(aligned_cpu):
    assert not gc.isenabled()  # alignment.enable(True) switched the automatic collector off
    threshold0 = gc.get_threshold()[0]
    junk = [[] for _ in range(threshold0 + 10)]  # gen0's count past its threshold
    flags = alignment.local_wants()
    assert flags[1] == 1.0
    count0 = gc.get_count()[0]
    assert count0 > threshold0
    scoped = memory.memory_stats()["num_scoped_collections"]
    assert alignment.agreed(flags)
    assert alignment.stats()["generation_collections"][0] == 1
    assert gc.get_count()[0] < count0  # generation 0 was collected
    assert memory.memory_stats()["num_scoped_collections"] == scoped  # and nothing else
    del junk


def test_full_collections_run_with_the_automatic_collector_off(aligned_cpu):
    """Alignment switched Python's automatic collector off: the ladder's full collection must
    still collect (gc.collect(), not PyGC_Collect(), which does nothing then)."""
    assert not gc.isenabled()
    _c._set_scoped_enabled(False)  # the ladder is a full collection alone
    try:
        memory.set_gc_policy(watermark="4MiB")
        for _ in range(8):
            dict_cycle(MiB)  # garbage only a full collection frees
        flags = alignment.local_wants()
        assert flags[0] == 1.0
        before = memory.memory_stats()
        assert alignment.agreed(flags)
        after = memory.memory_stats()
        assert after["num_full_collections"] == before["num_full_collections"] + 1
        assert (
            after["allocated_bytes.all.current"] <= before["allocated_bytes.all.current"] - 8 * MiB
        )
    finally:
        _c._set_scoped_enabled(True)


def test_the_out_of_memory_path_stays_local(aligned_cpu):
    """A rank that cannot allocate collects at once, aligned or not."""
    memory.set_gc_policy(watermark=None)
    for _ in range(100):
        dict_cycle(MiB)  # garbage only a full collection frees, past the 64 MiB limit
    stats = memory.memory_stats()
    assert stats["num_oom_collections"] >= 1
    assert stats["num_aligned_collections"] == 0
    assert stats["allocated_bytes.all.current"] <= 64 * MiB


def test_turning_alignment_off_drops_pending_wants_and_gives_gc_back(aligned_cpu):
    [needle_cycle(MiB) for _ in range(24)]
    assert alignment.local_wants()[0] == 1.0
    assert alignment.enable(False) is True
    assert gc.isenabled()
    assert alignment.local_wants()[0] == 0.0  # off: no flags
    with pytest.raises(RuntimeError, match="alignment on"):
        _c._run_aligned_collection(True, -1)
    assert alignment.agreed(np.ones(5, dtype=np.float32)) is False  # off: nothing scheduled


def test_a_process_that_disabled_gc_keeps_it_disabled():
    gc.disable()
    try:
        alignment.enable(True)
        flags = alignment.local_wants()
        assert flags[1:4].tolist() == [0.0, 0.0, 0.0]  # Python's generations stay the user's
        alignment.enable(False)
        assert not gc.isenabled()
    finally:
        alignment.enable(False)
        gc.enable()


def test_bad_arguments():
    with pytest.raises(TypeError):
        alignment.enable(1)
    with pytest.raises(ValueError):
        alignment.local_wants(rank=2, world_size=2)
    with pytest.raises(TypeError):
        alignment.local_wants(rank=0.5, world_size=2)
    with pytest.raises(ValueError):
        alignment.num_wants(0)
    with pytest.raises(ValueError, match="at least 5"):
        alignment.agreed(np.zeros(4))
    with pytest.raises(ValueError, match="non-negative"):
        alignment.agreed(np.array([np.nan, 0, 0, 0, 0]))
    with pytest.raises(ValueError):
        _c._run_aligned_collection(True, 3)
    with pytest.raises(TypeError):
        _c._run_aligned_collection(True, "0")
    assert nd.empty((4,)).shape == (4,)  # the process works after every refusal


@pytest.mark.parametrize(
    "version, threshold, reason",
    [
        ((3, 11, 7), (700, 10, 10), None),
        ((3, 13, 0), (2000, 10, 10), None),
        ((3, 14, 5), (2000, 10, 10), None),
        ((3, 14, 0), (2000, 10, 0), "Python 3.14.0's incremental collector"),
        ((3, 14, 4), (2000, 10, 0), "Python 3.14.4's incremental collector"),
        ((3, 15, 0), (2000, 10), "this collector has 2 generation thresholds, not 3"),
    ],
)
def test_collector_generations_are_checked_per_version(version, threshold, reason):
    why = alignment._collector_unsupported(version, threshold)
    if reason is None:
        assert why is None
    else:
        assert why.startswith(reason), why


def test_enable_refuses_a_collector_with_other_generations(monkeypatch):
    monkeypatch.setattr(gc, "get_threshold", lambda: (2000, 10))
    with pytest.raises(RuntimeError, match="not supported: this collector has 2 generation"):
        alignment.enable(True)
    assert not alignment.enabled()
    monkeypatch.undo()
    assert alignment._collector_unsupported() is None  # the suite runs on supported versions
