"""Shared by the memory-history tests (test_memory_snapshot.py, test_memory_peak_record.py):
the autouse fixture that stops every device's recording after a test, and the caller's line
number, which the recorded frames are checked against."""

import inspect

import pytest

from needle import memory

from devices import DEVICES


@pytest.fixture(autouse=True)
def stop_recording():
    yield
    for param in DEVICES:
        device = param.values[0]
        if device.enabled():
            memory._record_memory_history(None, device=device)


def caller_line():
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno
