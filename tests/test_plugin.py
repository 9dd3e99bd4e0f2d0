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
from pytester_check import failure_section, source_line

import needle as ndl
from needle import testing as needle_testing

from devices import DEVICES

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


def test_malformed_marker_is_a_setup_error_naming_the_argument(pytester):
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

@pytest.mark.limit_device_memory(-5)
def test_negative():
    RAN.append(1)

@pytest.mark.limit_device_memory([1024])
def test_wrong_type():
    RAN.append(1)

@pytest.mark.limit_device_memory(True)
def test_bool():
    RAN.append(1)

@pytest.mark.limit_device_memory("1 MiB", device="tpu")
def test_unknown_device():
    RAN.append(1)

@pytest.mark.limit_device_memory("1 MiB", device=3.5)
def test_device_of_the_wrong_type():
    RAN.append(1)

@pytest.mark.limit_device_memory("1 MiB", "cpu", "extra")
def test_too_many_arguments():
    RAN.append(1)

def test_nothing_ran():
    assert RAN == []
""",
    )
    result.assert_outcomes(passed=1, errors=8)
    out = result.stdout.str()
    for expected in (
        "limit_device_memory needs a limit, e.g. @pytest.mark.limit_device_memory('256 MiB')",
        "limit_device_memory: bad limit='lots' (str): cannot parse memory size 'lots'",
        "limit_device_memory: bad limit=-5 (int): a memory size must be >= 0, got -5",
        "limit_device_memory: bad limit=[1024] (list): a memory size must be an int",
        "limit_device_memory: bad limit=True (bool): a memory size cannot be a bool",
        "limit_device_memory: bad device='tpu': unknown device 'tpu'",
        "limit_device_memory: bad device=3.5: expected a needle device or a device name",
        "limit_device_memory takes (limit, device=None), got args=('1 MiB', 'cpu', 'extra')",
    ):
        assert expected in out, expected
    # A usage error, not a traceback from inside needle: no source lines, no chained errors.
    assert "Traceback" not in out and "another exception occurred" not in out
    assert "needle/memory" not in out and "testing.py" not in out


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
def test_limit_on_an_unavailable_device_skips_with_the_reason(pytester):
    result = run(
        pytester,
        """
import pytest

RAN = []

@pytest.mark.limit_device_memory("1 MiB", device="cuda")
def test_on_cuda():
    RAN.append(1)

@pytest.mark.limit_device_memory("1 MiB", device="cpu")
@pytest.mark.limit_device_memory("1 MiB", device="cuda:1")
def test_on_cpu_and_cuda():
    RAN.append(1)

def test_nothing_ran():
    assert RAN == []
""",
        "-rs",
    )
    result.assert_outcomes(passed=1, skipped=2)
    reason = ndl.cuda.unavailable_reason()
    assert reason
    skips = [line for line in result.stdout.lines if line.startswith("SKIPPED")]
    # Reported at the test (as a skipif marker is), not inside the plugin.
    assert re.match(r"SKIPPED \[1\] test_\w+\.py:\d+: ", skips[0]), skips
    assert skips[0].endswith(f": limit_device_memory: cuda() is not available: {reason}")
    assert skips[1].endswith(f": limit_device_memory: cuda(1) is not available: {reason}")


@pytest.mark.skipif(ndl.cuda().enabled(), reason="needs a device that is unavailable")
def test_check_no_growth_on_an_unavailable_device_skips_with_the_reason(pytester):
    result = run(
        pytester,
        """
def test_growth_on_cuda(device_memory):
    device_memory.check_no_growth(lambda: None, device="cuda")
    raise AssertionError("not reached: the check skips")
""",
        "-rs",
    )
    result.assert_outcomes(skipped=1)
    (skip,) = [line for line in result.stdout.lines if line.startswith("SKIPPED")]
    assert re.match(r"SKIPPED \[1\] test_\w+\.py:\d+: ", skip), skip
    assert skip.endswith(
        f"check_no_growth: cuda() is not available: {ndl.cuda.unavailable_reason()}"
    )


# One test leaks without any check, a marked test and a step check leak tensors of their own
# shapes, and clean tests run after all of them: each failure must list its own tensors only.
CULPRIT_TESTS = """
import numpy as np
import pytest
import needle as ndl

DEV = ndl.{device}()
KEEP = []

def test_an_earlier_leak():
    KEEP.extend(ndl.Tensor(np.ones((300, 7), np.float32), device=DEV) for _ in range(3))

@pytest.mark.limit_device_memory("16 KiB", device="{device}")
def test_marked_leak():
    KEEP.append(ndl.Tensor(np.ones((32, 64), np.float32), device=DEV))  # SITE-LEAF
    KEEP.append(ndl.exp(ndl.Tensor(np.ones((32, 64), np.float32), device=DEV)))  # SITE-OP
    scratch = ndl.Tensor(np.ones((64, 64), np.float32), device=DEV)  # freed at the return

@pytest.mark.limit_device_memory("1 MiB", device="{device}")
def test_marked_clean():
    total = ndl.exp(ndl.Tensor(np.ones((32, 64), np.float32), device=DEV)).sum()

def test_step_leak(device_memory):
    def step():
        KEEP.append(ndl.Tensor(np.ones((16, 64), np.float32), device=DEV))  # SITE-STEP
    device_memory.check_no_growth(step, steps=5, warmup=2, device="{device}")

def test_step_clean(device_memory):
    def step():
        return ndl.exp(ndl.Tensor(np.ones((16, 64), np.float32), device=DEV)).sum()
    device_memory.check_no_growth(step, steps=5, warmup=2, device="{device}")
"""


@pytest.mark.parametrize("device", DEVICES)
def test_failures_list_the_tests_own_tensors_by_site(pytester, device):
    source = CULPRIT_TESTS.format(device=device.name)
    module = pytester.makepyfile(source).name
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", "-v")
    result.stdout.fnmatch_lines(
        [
            "*test_an_earlier_leak PASSED*",
            "*test_marked_leak FAILED*",
            "*test_marked_clean PASSED*",
            "*test_step_leak FAILED*",
            "*test_step_clean PASSED*",
        ]
    )
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    dev = repr(device)

    marked = failure_section(out, "test_marked_leak")
    assert f"limit_device_memory: peak device memory on {dev} exceeded the limit" in marked
    assert (
        f"kept: 3 tensors that the test created are still alive on {dev}, "
        "24576 bytes (24.00 KiB), by allocation site:"
    ) in marked
    leaf_site = f"{module}:{source_line(source, 'SITE-LEAF')}"
    op_site = f"{module}:{source_line(source, 'SITE-OP')}"
    # exp's result keeps its input alive (the graph): the op's line keeps two tensors, first.
    assert (
        f"  {op_site}: 2 tensors, 16384 bytes (16.00 KiB)\n"
        "    1 x Tensor(shape=(32, 64), dtype=float32, bytes=8192, op=Exp)\n"
        "    1 x Tensor(shape=(32, 64), dtype=float32, bytes=8192, op=(leaf))\n"
        f"  {leaf_site}: 1 tensor, 8192 bytes (8.00 KiB)\n"
        "    1 x Tensor(shape=(32, 64), dtype=float32, bytes=8192, op=(leaf))\n"
    ) in marked
    # Neither the earlier test's leak nor the freed scratch tensor is the culprit (the scratch
    # tensor's line is the peak's, named above the kept report).
    kept = marked[marked.index("kept:") :]
    assert "(300, 7)" not in kept and "(64, 64)" not in kept
    assert f"  peak at:         {module}:{source_line(source, 'freed at the return')} " in marked

    step = failure_section(out, "test_step_leak")
    assert "grew by 20480 bytes (20.00 KiB) over 5 steps" in step
    step_site = f"{module}:{source_line(source, 'SITE-STEP')}"
    # Five measured steps: the two warmup steps' tensors and the other tests' are not listed.
    assert (
        f"kept: 5 tensors that the measured steps created are still alive on {dev}, "
        "20480 bytes (20.00 KiB), by allocation site:\n"
        f"  {step_site}: 5 tensors, 20480 bytes (20.00 KiB)\n"
        "    5 x Tensor(shape=(16, 64), dtype=float32, bytes=4096, op=(leaf))\n"
    ) in step
    assert "(300, 7)" not in step and "(32, 64)" not in step


def test_failures_without_history_group_under_one_unrecorded_site(pytester):
    source = CULPRIT_TESTS.format(device="cpu")
    pytester.makepyfile(source)
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", "--needle-no-history")
    result.assert_outcomes(passed=3, failed=2)
    step = failure_section(result.stdout.str(), "test_step_leak")
    assert (
        "  (sites not recorded: history off): 5 tensors, 20480 bytes (20.00 KiB)\n"
        "    5 x Tensor(shape=(16, 64), dtype=float32, bytes=4096, op=(leaf))\n"
        "  (allocation sites are recorded unless --needle-no-history is given)"
    ) in step
    assert "SITE" not in step


def test_history_is_on_for_the_test_only(pytester):
    result = run(
        pytester,
        """
import numpy as np
import pytest
import needle as ndl
import needle_c

def recording():
    previous = needle_c._record_history(False)
    needle_c._record_history(previous)
    return previous

def test_unmarked_records_nothing():
    assert recording() is False

@pytest.mark.limit_device_memory("1 MiB")
def test_marked_records():
    assert recording() is True
    t = ndl.Tensor(np.ones(3, np.float32))
    assert t._alloc_site

def test_fixture_records(device_memory):
    assert recording() is True

def test_after_them_records_nothing():
    assert recording() is False
""",
    )
    result.assert_outcomes(passed=4)


def test_kept_report_without_tensors_or_with_arrays_outside_them():
    snapshot = ndl.memory.tensor_snapshot()
    report = needle_testing._kept_report(ndl.cpu(), snapshot, growth=0)
    assert report == "kept: no tensor that the test created is still alive on cpu()\n"
    kept = ndl.backend_ndarray.empty((256,), device=ndl.cpu())  # an NDArray, not a Tensor
    report = needle_testing._kept_report(ndl.cpu(), snapshot, growth=kept.nbytes)
    assert report.splitlines()[1] == (
        "  allocated bytes grew by 1024 bytes (1.00 KiB): the rest is held by arrays "
        "outside Tensors (not listed) or by storage that older tensors share"
    )


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
