"""The memory history's peak record (needle_c/memory/history.c; needle.memory._record_peak,
_peak and _restore_history), which the pytest plugin's limit_device_memory failure reads:
the frames of the allocation that reached the peak and the blocks live at it, against a
model of the allocations kept in Python."""

import random

import pytest
from history_check import caller_line
from history_check import stop_recording as _stop_recording  # noqa: F401 (autouse)

import needle as ndl
import needle.backend_ndarray as nd
import needle_c
from needle import memory

from devices import DEVICES

dev = pytest.mark.parametrize("device", DEVICES)


def _sizes(record):
    return [block["bytes"] for block in record["blocks"]]


@dev
def test_the_record_lists_the_blocks_live_at_the_peak(device):
    before = nd.empty((64,), device=device)  # allocated before the record: not listed
    settings = memory._record_peak(device)
    start = memory.memory_allocated(device)
    memory.reset_peak_memory_stats(device)
    kept = nd.empty((100,), device=device)
    kept_line = caller_line() - 1
    gone_before = nd.empty((200,), device=device)  # freed before the peak: not live at it
    del gone_before
    peak = nd.empty((1000,), device=device)
    peak_line = caller_line() - 1
    del peak  # freed after the peak: live at it all the same
    after = nd.empty((300,), device=device)  # after the peak, which it does not pass
    record = memory._peak(device)
    assert record["bytes"] == start + 4400 == memory.max_memory_allocated(device)
    assert (record["frames"][0]["filename"], record["frames"][0]["line"]) == (__file__, peak_line)
    assert record["frames"][0]["name"] == "test_the_record_lists_the_blocks_live_at_the_peak"
    assert _sizes(record) == [400, 4000]
    assert [block["frames"][0]["line"] for block in record["blocks"]] == [kept_line, peak_line]
    memory._restore_history(device, settings)
    assert needle_c._memory_history_settings(device._id)[0] == 0  # off again, as before
    assert memory._peak(device) is None
    assert before.shape == (64,) and kept.shape == (100,) and after.shape == (300,)


@dev
def test_a_higher_peak_replaces_the_record_and_a_lower_one_does_not(device):
    settings = memory._record_peak(device)
    first = nd.empty((1000,), device=device)
    del first
    second = nd.empty((500,), device=device)
    record = memory._peak(device)
    assert _sizes(record) == [4000]  # the first block's peak; the second stayed under it
    third = nd.empty((600,), device=device)  # 500 + 600 floats pass it: a new peak
    third_line = caller_line() - 1
    record = memory._peak(device)
    assert _sizes(record) == [2000, 2400]
    assert record["frames"][0]["line"] == third_line
    memory._restore_history(device, settings)
    assert second.shape == (500,) and third.shape == (600,)


@dev
def test_no_allocation_past_the_start_records_no_peak(device):
    held = nd.empty((1000,), device=device)
    settings = memory._record_peak(device)
    del held
    again = nd.empty((1000,), device=device)  # back to the start, not past it
    assert memory._peak(device) is None
    memory._restore_history(device, settings)
    assert again.shape == (1000,)


def test_the_record_follows_a_model_of_many_allocations_and_frees():
    # Enough blocks to grow and rehash the live map several times, freed in random order so
    # that its deletions shift entries, then all freed after the peak (the record keeps them):
    # the record must still match the model exactly.
    rng = random.Random(36)
    device = ndl.cpu()
    settings = memory._record_peak(device)
    live, order, current = {}, 0, 0
    best, best_live = 0, []
    for _ in range(5000):
        if live and rng.random() < 0.35:
            key = rng.choice(list(live))
            current -= live.pop(key).nbytes
            continue
        array = nd.empty((rng.randint(1, 64),), device=device)
        order += 1
        live[order] = array
        current += array.nbytes
        if current > best:
            best, best_live = current, [live[k].nbytes for k in sorted(live)]
    assert len(best_live) > 1000
    while live:
        del live[rng.choice(list(live))]
    record = memory._peak(device)
    assert sum(_sizes(record)) == best
    assert _sizes(record) == best_live
    memory._restore_history(device, settings)


@dev
def test_a_recording_history_keeps_its_settings_and_trace(device):
    memory._record_memory_history("all", context=None, max_entries=500, device=device)
    earlier = nd.empty((123,), device=device)
    recorded = needle_c._memory_history_settings(device._id)
    assert recorded == (2, 0, False, 500, 0)
    settings = memory._record_peak(device)
    assert settings == recorded
    assert needle_c._memory_history_settings(device._id)[:2] == (2, 1)  # frames for the record
    big = nd.empty((1000,), device=device)
    assert _sizes(memory._peak(device)) == [4000]
    memory._restore_history(device, settings)
    assert needle_c._memory_history_settings(device._id) == recorded
    sizes = [
        e["size"] for e in memory._snapshot(device)["device_traces"][-1] if e["action"] == "alloc"
    ]
    assert 492 in sizes and 4000 in sizes  # the trace from before and during the record
    assert earlier.shape == (123,) and big.shape == (1000,)


@dev
def test_turning_the_history_off_drops_the_record(device):
    memory._record_peak(device)
    big = nd.empty((1000,), device=device)
    memory._record_memory_history(None, device=device)
    assert memory._peak(device) is None
    with pytest.raises(ValueError, match="not being recorded"):
        needle_c._memory_history_peak(device._id)
    with pytest.raises(ValueError, match="not being recorded"):
        needle_c._memory_history_reset_peak(device._id)
    assert big.shape == (1000,)


def test_bad_devices_raise_clearly():
    with pytest.raises(ValueError):
        memory._record_peak("no such device")
    with pytest.raises(TypeError):
        memory._peak(3.5)
    if ndl.cuda().enabled():
        return
    with pytest.raises(needle_c.DeviceError, match="not available"):
        memory._record_peak("cuda")
    with pytest.raises(needle_c.DeviceError, match="not available"):
        memory._peak("cuda")
