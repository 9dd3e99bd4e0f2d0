"""The pytest plugin ``needle.testing``: the ``limit_device_memory`` marker and the
``device_memory`` fixture, exercised on generated test files through ``pytester``.

The inner runs are in-process (fast; needle_c is simply shared with this process). They
rely on the ``pytest11`` entry point, as a user's suite would, and pass ``-p needle`` (the
entry point's name) only where ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` is set: otherwise ``-p``
would also mark the already imported needle package for assertion rewriting, which warns.
"""

import os
import re

import pytest

import needle as ndl
from needle import testing as needle_testing

pytest_plugins = ["pytester"]

MiB = 2**20
PLUGIN = ("-p", "needle") if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") else ()


def run(pytester, source, *args):
    """Writes ``source`` as a test module, runs it in-process; returns the result."""
    pytester.makepyfile(source)
    return pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", *args)


def test_marker_is_listed(pytester):
    result = pytester.runpytest(*PLUGIN, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.limit_device_memory(limit, device=None):*"])
    assert result.ret == 0


LIMIT_TESTS = """
import pytest
import needle.backend_ndarray as nd

def allocate_8mib():
    a = nd.empty((2 * 1024 * 1024,))   # 8 MiB of float32, freed on return
    assert a.shape == (2 * 1024 * 1024,)

@pytest.mark.limit_device_memory("1 MiB")
def test_over_the_limit():
    allocate_8mib()

@pytest.mark.limit_device_memory("64 MiB")
def test_under_the_limit():
    allocate_8mib()

@pytest.mark.limit_device_memory(64 * 1024 * 1024, device="cpu")
def test_under_an_int_limit_on_a_named_device():
    allocate_8mib()
"""


def test_limit_device_memory_fails_over_the_limit_and_passes_under_it(pytester):
    result = run(pytester, LIMIT_TESTS, "-v")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_over_the_limit FAILED*",
            "*test_under_the_limit PASSED*",
            "*test_under_an_int_limit_on_a_named_device PASSED*",
        ]
    )
    out = result.stdout.str()
    assert "limit_device_memory: peak device memory on cpu" in out
    assert "limit:           1048576 bytes (1.00 MiB)" in out
    # The array is freed before the test ends: only the peak shows it.
    peak, used = map(
        int,
        re.search(
            r"peak:\s+(\d+) bytes \(.*?\), (\d+) bytes \(.*?\) above the start", out
        ).groups(),
    )
    start = int(re.search(r"start allocated:\s+(\d+) bytes", out).group(1))
    end = int(re.search(r"end allocated:\s+(\d+) bytes", out).group(1))
    assert used >= 8 * MiB
    assert peak == start + used
    assert end == start


def test_limit_device_memory_keeps_the_tests_own_failure(pytester):
    result = run(
        pytester,
        """
import pytest
import needle.backend_ndarray as nd

@pytest.mark.limit_device_memory(1024)
def test_fails_by_itself():
    a = nd.empty((1024 * 1024,))
    assert False, "the test's own failure"
""",
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "the test's own failure" in out
    assert "exceeded the limit" not in out


def test_malformed_marker_fails_the_test_before_it_runs(pytester):
    result = run(
        pytester,
        """
import pytest

RAN = []

@pytest.mark.limit_device_memory()
def test_no_limit():
    RAN.append(1)

@pytest.mark.limit_device_memory("lots")
def test_bad_size():
    RAN.append(1)

def test_nothing_ran():
    assert RAN == []
""",
    )
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*TypeError: limit_device_memory needs a limit*",
            "*ValueError: cannot parse memory size 'lots'*",
        ]
    )


def test_unmarked_tests_are_left_alone(pytester):
    # An unmarked test must not reset the peak statistics: the second test sees the
    # first one's 8 MiB peak.
    result = run(
        pytester,
        """
import needle.backend_ndarray as nd
import needle.memory as mem

def test_a_peak():
    mem.reset_peak_memory_stats()
    a = nd.empty((2 * 1024 * 1024,))

def test_the_peak_survives():
    assert mem.max_memory_allocated() - mem.memory_allocated() >= 8 * 1024 * 1024
""",
    )
    result.assert_outcomes(passed=2)


@pytest.mark.skipif(ndl.cuda().enabled(), reason="needs a device that is unavailable")
def test_limit_on_an_unavailable_device_warns(pytester):
    result = run(
        pytester,
        """
import pytest

@pytest.mark.limit_device_memory("1 MiB", device="cuda")
def test_on_cuda():
    pass
""",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*limit_device_memory: cuda is not available*"])


GROWTH_TESTS = """
import gc
import numpy as np
import needle
import needle.backend_ndarray as nd

KEEP = []

def test_leak(device_memory):
    def step():
        KEEP.append(nd.empty((1024,)))   # 4096 bytes kept per step
    device_memory.check_no_growth(step, steps=20, warmup=3)

def test_leak_within_tolerance(device_memory):
    def step():
        KEEP.append(nd.empty((1024,)))
    device_memory.check_no_growth(step, steps=20, tolerance="80 KiB")

def test_no_leak(device_memory):
    def step():
        a = nd.empty((1024,))
        return (a + 1.0).sum()
    readings = device_memory.check_no_growth(step, steps=10, warmup=2)
    assert len(readings) == 11
    assert readings == [readings[0]] * 11
    assert device_memory.allocated() == readings[-1]
    assert device_memory.peak() >= readings[0] + 4096

def cyclic_step():
    # needle mode: the leaf's grad is a graph that refers back to the leaf, a cycle
    # that only the collector frees; keep the collector off so that it cannot run.
    gc.disable()
    x = needle.Tensor(np.ones((64, 64), dtype=np.float32))
    y = needle.exp(x)
    y.sum().backward()

def test_cycles_without_collect(device_memory):
    try:
        with needle.autograd.graph_mode("needle"):
            device_memory.check_no_growth(cyclic_step, steps=10)
    finally:
        gc.enable()

def test_cycles_with_collect(device_memory):
    try:
        with needle.autograd.graph_mode("needle"):
            device_memory.check_no_growth(cyclic_step, steps=10, collect=True)
    finally:
        gc.enable()
"""


def test_check_no_growth(pytester):
    result = run(pytester, GROWTH_TESTS, "-v")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_leak FAILED*",
            "*test_leak_within_tolerance PASSED*",
            "*test_no_leak PASSED*",
            "*test_cycles_without_collect FAILED*",
            "*test_cycles_with_collect PASSED*",
        ]
    )
    out = result.stdout.str()
    assert (
        "device memory on cpu (the default device) grew by 81920 bytes (80.00 KiB) "
        "over 20 steps (tolerance 0 bytes; 4096 bytes per step on average)"
    ) in out
    assert "after 3 warmup steps:" in out
    assert re.search(r"step    1: \d+ bytes \(\+4096\)", out)
    assert re.search(r"step   20: \d+ bytes \(\+81920\)", out)
    # The cyclic garbage grows too, and the message suggests collect=True.
    assert re.search(r"grew by \d+ bytes .* over 10 steps", out)
    assert "if collect=True passes" in out


def test_check_no_growth_rejects_bad_arguments():
    dm = needle_testing.DeviceMemory()
    with pytest.raises(TypeError):
        dm.check_no_growth(None)
    with pytest.raises(ValueError):
        dm.check_no_growth(lambda: None, steps=0)
    with pytest.raises(ValueError):
        dm.check_no_growth(lambda: None, warmup=-1)
    with pytest.raises(ValueError):
        dm.check_no_growth(lambda: None, tolerance=1.5)
    with pytest.raises(ValueError):
        dm.check_no_growth(lambda: None, tolerance="a lot")


@pytest.mark.parametrize(
    "tolerance, baseline, expected",
    [
        (0, 1000, 0),
        (4096, 1000, 4096),
        ("64 KiB", 1000, 65536),
        (0.25, 1000, 250),
        ("10%", 1000, 100),
        (0.5, 0, 0),
    ],
)
def test_tolerance_bytes(tolerance, baseline, expected):
    assert needle_testing._tolerance_bytes(tolerance, baseline) == expected


def test_live_tensor_report_is_optional(monkeypatch):
    monkeypatch.delattr(ndl.memory, "live_tensors_summary", raising=False)
    assert needle_testing._live_tensor_report(None) == ""

    def summary(device=None, group_by="op"):
        return [
            {"key": "EWiseAdd", "count": 2, "bytes": 64},
            {"key": "Exp", "count": 1, "bytes": 4096},
        ]

    monkeypatch.setattr(ndl.memory, "live_tensors_summary", summary, raising=False)
    report = needle_testing._live_tensor_report(None)
    lines = report.splitlines()
    assert lines[0].startswith("live tensors on every device by op")
    assert lines[2].split() == ["Exp", "1", "4096"]  # largest first
    assert lines[3].split() == ["EWiseAdd", "2", "64"]

    def broken(device=None, group_by="op"):
        raise RuntimeError("boom")

    monkeypatch.setattr(ndl.memory, "live_tensors_summary", broken, raising=False)
    assert "report unavailable (RuntimeError: boom)" in needle_testing._live_tensor_report(None)
