"""The caching allocators' settings (NEEDLE_ALLOC_CONF, needle.memory.set_allocator_settings):
parsing and checks, what each setting changes on every device, and the fragmentation
statistics (segment, active, inactive_split, oversize) that make it visible."""

import os
import re
import subprocess
import sys

import pytest

import needle as ndl
import needle_c
from needle.memory import alloc_conf

from devices import DEVICES

MiB = 2**20
STAT_PREFIXES = (
    "segment.all",
    "active.all",
    "active_bytes.all",
    "inactive_split.all",
    "inactive_split_bytes.all",
    "oversize_allocations",
    "oversize_segments",
)
DEFAULTS = "max_split_size_mb:None,garbage_collection_threshold:None"


@pytest.fixture(autouse=True)
def default_settings():
    """Every test starts and ends with the default settings and an empty cache."""
    ndl.memory.set_allocator_settings(DEFAULTS)
    yield
    ndl.memory.set_allocator_settings(DEFAULTS)
    for device in (ndl.cpu(), ndl.cuda()):
        ndl.memory.empty_cache(device)


def block(device, nbytes):
    """An array of nbytes (a multiple of 4) on device: one allocation, nothing else."""
    return device.empty((nbytes // 4,))


def stat(device, key):
    return ndl.memory.memory_stats(device)[key]


# ---------------------------------------------------------------- parsing


def test_each_option_parsed_with_its_prefix():
    parsed = alloc_conf.parse_allocator_settings(
        "max_split_size_mb:128, cuda:garbage_collection_threshold:0.8,expandable_segments:False"
    )
    assert parsed == [
        (("cpu", "cuda"), "max_split_size_mb", 128 * MiB),
        (("cuda",), "garbage_collection_threshold", 0.8),
        (("cuda",), "expandable_segments", False),
    ]
    assert alloc_conf.parse_allocator_settings("cpu:max_split_size_mb:None") == [
        (("cpu",), "max_split_size_mb", 0)
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("max_split_size_mb:20", "above 20"),
        ("max_split_size_mb:64.5", "whole number"),
        ("max_split_size_mb:-64", "whole number"),
        ("garbage_collection_threshold:1.0", "in (0, 1)"),
        ("garbage_collection_threshold:0", "in (0, 1)"),
        ("garbage_collection_threshold:lots", "in (0, 1)"),
        ("expandable_segments:yes", "True or False"),
        ("cpu:expandable_segments:True", "cuda setting"),
        ("roundup_power2_divisions:4", "not supported by needle"),
        ("max_split:64", "unknown allocator option"),
        ("tpu:max_split_size_mb:64", "is not [cpu:|cuda:]option:value"),
        ("max_split_size_mb", "is not [cpu:|cuda:]option:value"),
        ("max_split_size_mb:64,", "is not [cpu:|cuda:]option:value"),
        ("", "is not [cpu:|cuda:]option:value"),
    ],
)
def test_bad_settings_raise_and_change_nothing(text, message):
    before = ndl.memory.get_allocator_settings("cpu")
    with pytest.raises(ValueError, match=re.escape(message)):
        ndl.memory.set_allocator_settings("max_split_size_mb:64," + text if text else text)
    assert ndl.memory.get_allocator_settings("cpu") == before


def test_settings_must_be_a_string():
    with pytest.raises(TypeError, match="must be a string, got dict"):
        ndl.memory.set_allocator_settings({"max_split_size_mb": 64})


def test_engine_refuses_what_python_would():
    """The engine checks again: its entry point is reachable without the parser."""
    engine_id = ndl.cpu()._id
    with pytest.raises(ValueError, match="max_split_size must be more than"):
        needle_c._set_allocator_settings(engine_id, 1 * MiB, 0.0, False)
    with pytest.raises(ValueError, match="garbage_collection_threshold must be in"):
        needle_c._set_allocator_settings(engine_id, 0, 1.5, False)
    with pytest.raises(ValueError, match="expandable_segments is not supported"):
        needle_c._set_allocator_settings(engine_id, 0, 0.0, True)
    assert needle_c._get_allocator_settings(engine_id) == (0, 0.0, False)


def test_get_allocator_settings_of_an_unavailable_device():
    missing = needle_c.cuda(needle_c.MAX_CUDA_DEVICES - 1)
    if missing.enabled():
        pytest.skip("every CUDA ordinal is a usable device here")
    with pytest.raises(ndl.DeviceError, match="not available"):
        ndl.memory.get_allocator_settings(missing)


def run_python(code, conf):
    env = dict(os.environ, NEEDLE_ALLOC_CONF=conf)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_environment_variable_applied_at_import():
    done = run_python(
        "import needle as ndl; print(ndl.memory.get_allocator_settings('cpu'))",
        "cpu:max_split_size_mb:256,garbage_collection_threshold:0.75",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "{'max_split_size_mb': 256, 'garbage_collection_threshold': 0.75, "
        "'expandable_segments': False}"
    )


def test_bad_environment_variable_raises_at_import_with_its_name():
    done = run_python("import needle", "garbage_collection_threshold:2")
    assert done.returncode != 0
    assert "ValueError: NEEDLE_ALLOC_CONF='garbage_collection_threshold:2'" in done.stderr
    assert "must be a number in (0, 1)" in done.stderr


# ---------------------------------------------------------- what they change


def check_stats_consistent(device):
    stats = ndl.memory.memory_stats(device)
    for prefix in STAT_PREFIXES:
        current, peak = stats[f"{prefix}.current"], stats[f"{prefix}.peak"]
        assert current == stats[f"{prefix}.allocated"] - stats[f"{prefix}.freed"], prefix
        assert 0 <= current <= peak, prefix
    assert stats["active_bytes.all.current"] >= stats["allocated_bytes.all.current"]
    assert stats["segment.all.current"] <= stats["reserved_bytes.all.current"]
    assert (
        stats["active_bytes.all.current"] + stats["inactive_split_bytes.all.current"]
        <= stats["reserved_bytes.all.current"]
    )


@pytest.mark.parametrize("device", DEVICES)
def test_fragmentation_stats_follow_a_varying_workload(device):
    ndl.memory.empty_cache(device)
    before = ndl.memory.memory_stats(device)
    kept = []
    for i, size in enumerate((8, 3, 12, 5, 8, 20, 3)):
        x = block(device, size * MiB)
        if i % 2 == 0:
            kept.append(x)
        check_stats_consistent(device)
    after = ndl.memory.memory_stats(device)
    assert after["active.all.current"] - before["active.all.current"] == len(kept)
    assert after["active.all.allocated"] - before["active.all.allocated"] == 7
    assert after["segment.all.allocated"] > before["segment.all.allocated"]
    del x, kept
    ndl.memory.empty_cache(device)
    check_stats_consistent(device)
    final = ndl.memory.memory_stats(device)
    assert final["active.all.current"] == before["active.all.current"]
    assert final["segment.all.current"] <= before["segment.all.current"]


@pytest.mark.parametrize("device", DEVICES)
def test_max_split_size_counts_and_keeps_large_blocks_whole(device):
    ndl.memory.empty_cache(device)
    ndl.memory.set_allocator_settings("max_split_size_mb:32")
    assert ndl.memory.get_allocator_settings(device)["max_split_size_mb"] == 32
    oversize = stat(device, "oversize_allocations.current")
    large = block(device, 64 * MiB)
    assert stat(device, "oversize_allocations.current") == oversize + 1
    assert stat(device, "oversize_segments.current") >= 1
    del large
    reserved = ndl.memory.memory_reserved(device)
    splits = stat(device, "inactive_split.all.current")
    small = block(device, 8 * MiB)  # the cached 64 MiB block must not serve it
    assert ndl.memory.memory_reserved(device) == reserved + 8 * MiB
    assert stat(device, "inactive_split.all.current") == splits
    near = block(device, 60 * MiB)
    if device.name == "cuda":
        # Within 20 MiB of the cached block: served by it whole, its 4 MiB left unsplit.
        assert ndl.memory.memory_reserved(device) == reserved + 8 * MiB
        waste = stat(device, "active_bytes.all.current") - ndl.memory.memory_allocated(device)
        assert waste >= 4 * MiB
    else:
        # The CPU cache serves only the exact rounded size: a segment of its own.
        assert ndl.memory.memory_reserved(device) == reserved + 68 * MiB
    assert stat(device, "inactive_split.all.current") == splits
    check_stats_consistent(device)
    del small, near


@pytest.mark.parametrize("device", [param for param in DEVICES if param.id == "cuda"])
def test_without_max_split_size_a_large_cached_block_is_split_on_the_gpu(device):
    """The fragmentation max_split_size_mb prevents: the 8 MiB request takes the cached
    64 MiB segment, and the 56 MiB left is an inactive split (a CUDA-only behaviour: the CPU
    cache never splits)."""
    ndl.memory.empty_cache(device)
    del_me = block(device, 64 * MiB)
    del del_me
    reserved = ndl.memory.memory_reserved(device)
    split_bytes = stat(device, "inactive_split_bytes.all.current")
    small = block(device, 8 * MiB)
    assert ndl.memory.memory_reserved(device) == reserved
    assert stat(device, "inactive_split_bytes.all.current") == split_bytes + 56 * MiB
    assert "inact splits" in ndl.memory.memory_summary(device, abbreviated=True)
    check_stats_consistent(device)
    del small
    assert stat(device, "inactive_split_bytes.all.current") == split_bytes


def peak_reserved_of_distinct_sizes(device):
    """Allocates and drops blocks of 4, 8, ..., 36 MiB (180 MiB in all, none reusable for the
    next, larger one) and returns the peak of reserved memory while doing so."""
    ndl.memory.empty_cache(device)
    ndl.memory.reset_peak_memory_stats(device)
    for size in range(4, 37, 4):
        x = block(device, size * MiB)
        del x
    return ndl.memory.max_memory_reserved(device)


@pytest.mark.parametrize("device", DEVICES)
def test_garbage_collection_threshold_keeps_reserved_under_its_share(device):
    limit_before = ndl.memory.get_memory_limit(device)
    ndl.memory.empty_cache(device)
    base = ndl.memory.memory_reserved(device)
    limit = base + 256 * MiB
    ndl.memory.set_memory_limit(device, limit)
    try:
        without = peak_reserved_of_distinct_sizes(device)
        assert without >= base + 180 * MiB
        releases = stat(device, "num_gc_releases")
        ndl.memory.set_allocator_settings("garbage_collection_threshold:0.5")
        with_threshold = peak_reserved_of_distinct_sizes(device)
        assert with_threshold <= 0.5 * limit
        assert stat(device, "num_gc_releases") > releases
        assert "garbage_collection_threshold 0.5" in ndl.memory.memory_summary(
            device, abbreviated=True
        )
        check_stats_consistent(device)
    finally:
        ndl.memory.set_memory_limit(device, limit_before)


@pytest.mark.parametrize("device", DEVICES)
def test_summary_shows_segments_and_inactive_splits(device):
    x = block(device, 4 * MiB)
    text = ndl.memory.memory_summary(device, abbreviated=True)
    stats = ndl.memory.memory_stats(device)
    rows = {line[:12].strip(): line[12:].split() for line in text.splitlines()}
    assert int(rows["segments"][0]) == stats["segment.all.current"]
    assert int(rows["active blks"][0]) == stats["active.all.current"]
    assert int(rows["inact splits"][0]) == stats["inactive_split.all.current"]
    assert "allocator: max_split_size none" in text
    del x
