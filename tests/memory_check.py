"""Shared by the needle.memory tests (test_memory_*.py): the devices they run on, the
statistics keys every device reports, the autouse fixture that keeps the cyclic collector out
of exact byte counts and removes limits afterwards, and a check that a device still works."""

import gc

import numpy as np
import pytest

import needle.memory as mem
from needle import backend_ndarray as nd

from devices import DEVICES

HOST = [pytest.param(nd.cpu(), id="cpu"), pytest.param(nd.cpu_numpy(), id="cpu_numpy")]
ALL_DEVICES = DEVICES + [pytest.param(nd.cpu_numpy(), id="cpu_numpy")]

STAT_KEYS = [
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "allocation.all.current",
    "allocation.all.peak",
    "allocation.all.allocated",
    "allocation.all.freed",
    "num_alloc_retries",
    "num_ooms",
    "memory_limit_bytes",
]


def _all_devices_present():
    devs = [nd.cpu(), nd.cpu_numpy()]
    if nd.cuda().enabled():
        devs.append(nd.cuda())
    return devs


@pytest.fixture(autouse=True)
def clean_memory_state():
    """Collect garbage and release every device's cached blocks before each test (a test
    file run earlier in the same process may leave the CPU's block cache full, and these
    tests count reserved bytes exactly), keep the cyclic GC from freeing unrelated storages
    mid-test; always remove limits afterwards."""
    gc.collect()
    for d in _all_devices_present():
        mem.empty_cache(d)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        for d in _all_devices_present():
            mem.set_memory_limit(d, None)
        if was_enabled:
            gc.enable()
        gc.collect()


def check_alive(device=None):
    device = device or nd.cpu()
    a = nd.array([1.0, 2.0, 3.0], device=device)
    r = (a * 2 + 1).sum()
    np.testing.assert_array_equal(r.numpy(), np.array([15.0], np.float32))
