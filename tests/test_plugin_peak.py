"""The pytest plugin's ``limit_device_memory`` failure says where the peak was: the test's
line running at the allocation that reached it (and the helper's, in another file), and the
allocations the test had made that were live then, by line. Also that the memory history the
plugin records for this is given back its former settings however the test ends.

Run through ``pytester`` in-process, as tests/test_plugin.py is (see its docstring for
``PLUGIN``); the small helpers are its own.
"""

import os
import re

import pytest
from pytester_check import failure_section, source_line

from needle import memory

from devices import DEVICES

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "needle") if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") else ()


# The peak comes once in the test's own line and once inside a helper of another file; each
# line that allocates carries a tag, so that the expected sites are computed, not written.
PEAK_TESTS = """
import pytest
import needle.backend_ndarray as nd
from helpers_peak import make_scratch

DEV = nd.{device}()

@pytest.mark.limit_device_memory(1024, device="{device}")
def test_peak_in_the_test():
    a = nd.empty((1024,), device=DEV)  # SITE-A
    b = nd.empty((1024,), device=DEV)  # SITE-B
    del b
    big = nd.empty((8192,), device=DEV)  # SITE-PEAK
    del big
    after = nd.empty((16,), device=DEV)  # SITE-AFTER

@pytest.mark.limit_device_memory(1024, device="{device}")
def test_peak_in_a_helper():
    kept = [nd.empty((256,), device=DEV) for _ in range(3)]  # SITE-KEPT
    result = make_scratch(DEV)  # SITE-CALL
"""

HELPERS = """
import needle.backend_ndarray as nd

def make_scratch(device):
    first = nd.empty((2048,), device=device)  # HELPER-FIRST
    second = nd.empty((4096,), device=device)  # HELPER-PEAK
    return first.shape[0] + second.shape[0]
"""


def _bytes(n):
    """What the report prints for ``n`` bytes."""
    return memory._format_bytes(n, exact=True)


def _start(section):
    return int(re.search(r"start allocated:\s+(\d+) bytes", section).group(1))


@pytest.mark.parametrize("device", DEVICES)
def test_peak_failure_names_the_tests_line_and_what_was_live(pytester, device):
    source = PEAK_TESTS.format(device=device.name)
    module = pytester.makepyfile(test_peak_sites=source).name
    helpers = pytester.makepyfile(helpers_peak=HELPERS).name
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()

    def site(tag, text=source, name=module):
        return f"{name}:{source_line(text, tag)}"

    def code(tag, text=source):
        return text.strip().splitlines()[source_line(text, tag) - 1].strip()

    # a and big were live at the peak; b was freed before it, `after` came after it.
    section = failure_section(out, "test_peak_in_the_test")
    start = _start(section)
    assert f"  peak:            {_bytes(start + 36864)}, {_bytes(36864)} above the start\n" in (
        section
    )
    assert (
        f"  peak at:         {site('SITE-PEAK')} in test_peak_in_the_test  ({code('SITE-PEAK')})\n"
        f"  live at the peak: 2 allocations that the test made, {_bytes(36864)}, "
        f"and {_bytes(start)} allocated before it, by line:\n"
        f"    {site('SITE-PEAK')}  1 allocation, {_bytes(32768)}\n"
        f"    {site('SITE-A'):<{len(site('SITE-PEAK'))}}  1 allocation, {_bytes(4096)}\n"
        "kept: no tensor that the test created is still alive"
    ) in section
    assert "via" not in section

    # The peak is the helper's second allocation: the test's line is the call, the helper's
    # line comes after "via"; the helper's first array and the test's three were live too.
    section = failure_section(out, "test_peak_in_a_helper")
    start = _start(section)
    first, peak = site("HELPER-FIRST", HELPERS, helpers), site("HELPER-PEAK", HELPERS, helpers)
    width = max(len(first), len(peak), len(site("SITE-KEPT")))
    assert (
        f"  peak at:         {site('SITE-CALL')} in test_peak_in_a_helper  ({code('SITE-CALL')})\n"
        f"    via {peak} in make_scratch  ({code('HELPER-PEAK', HELPERS)})\n"
        f"  live at the peak: 5 allocations that the test made, {_bytes(27648)}, "
        f"and {_bytes(start)} allocated before it, by line:\n"
        f"    {peak:<{width}}  1 allocation, {_bytes(16384)}\n"
        f"    {first:<{width}}  1 allocation, {_bytes(8192)}\n"
        f"    {site('SITE-KEPT'):<{width}}  3 allocations, {_bytes(3072)}\n"
    ) in section


def test_peak_lists_the_largest_lines_and_sums_the_rest(pytester):
    source = """
import pytest
import needle.backend_ndarray as nd

@pytest.mark.limit_device_memory(1024)
def test_many_lines():
    a1 = nd.empty((600,))
    a2 = nd.empty((500,))
    a3 = nd.empty((400,))
    a4 = nd.empty((300,))
    a5 = nd.empty((200,))
    a6 = nd.empty((100,))
    a7 = nd.empty((50,))
"""
    module = pytester.makepyfile(source).name
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    section = failure_section(result.stdout.str(), "test_many_lines")
    first = source_line(source, "a1 =")
    width = len(f"{module}:{first + 4}")  # the sites are padded to the longest listed
    rows = [
        f"    {f'{module}:{first + i}':<{width}}  1 allocation, {_bytes(n * 4)}"
        for i, n in enumerate((600, 500, 400, 300, 200))
    ]
    assert "\n".join(rows) + f"\n    ... 2 more lines, {_bytes(600)}\n" in section
    assert f"  peak at:         {module}:{first + 6} in test_many_lines  (a7 = " in section


def test_no_history_says_the_peak_was_not_recorded(pytester):
    pytester.makepyfile(
        """
import pytest
import needle.backend_ndarray as nd

@pytest.mark.limit_device_memory(1024)
def test_big():
    a = nd.empty((4096,))
"""
    )
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", "--needle-no-history")
    result.assert_outcomes(failed=1)
    section = failure_section(result.stdout.str(), "test_big")
    assert "  peak at:         (not recorded: --needle-no-history was given)\n" in section
    assert "live at the peak" not in section


def test_history_turned_off_by_the_test_is_said(pytester):
    pytester.makepyfile(
        """
import pytest
import needle.backend_ndarray as nd
from needle import memory

@pytest.mark.limit_device_memory(1024)
def test_turns_history_off():
    a = nd.empty((4096,))
    memory._record_memory_history(None)
"""
    )
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    section = failure_section(result.stdout.str(), "test_turns_history_off")
    assert (
        "  peak at:         (not recorded: the device's memory history was turned off during "
        "the test)\n"
    ) in section


# Each marked test ends differently; the unmarked test after each checks that the CPU's
# history settings are what they were before it (off, or the user's own recording).
RESTORE_TESTS = """
import pytest
import needle.backend_ndarray as nd
import needle_c
from needle import memory

def settings():
    return needle_c._memory_history_settings(nd.cpu()._id)

BEFORE = settings()

@pytest.fixture
def broken():
    raise RuntimeError("a broken fixture")

@pytest.mark.limit_device_memory("1 MiB")
def test_passes():
    assert min(settings()[:2]) >= 1  # frames of live blocks recorded
    a = nd.empty((256,))

def test_after_passes():
    assert settings() == BEFORE

@pytest.mark.limit_device_memory(1024)
def test_over_the_limit():
    a = nd.empty((4096,))

def test_after_over_the_limit():
    assert settings() == BEFORE

@pytest.mark.limit_device_memory("1 MiB")
def test_fails_by_itself():
    a = nd.empty((256,))
    assert False, "its own failure"

def test_after_fails_by_itself():
    assert settings() == BEFORE

@pytest.mark.limit_device_memory("1 MiB")
def test_raises():
    raise KeyError("an error of the test")

def test_after_raises():
    assert settings() == BEFORE

@pytest.mark.limit_device_memory("1 MiB")
def test_skips():
    pytest.skip("skipped in its body")

def test_after_skips():
    assert settings() == BEFORE

@pytest.mark.limit_device_memory("1 MiB")
def test_setup_errors(broken):
    pass

def test_after_setup_errors():
    assert settings() == BEFORE
"""


def test_history_is_given_back_however_the_test_ends(pytester):
    pytester.makepyfile(RESTORE_TESTS)
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=7, failed=3, skipped=1, errors=1)
    result.stdout.fnmatch_lines(["*test_after_setup_errors PASSED*"])
    assert "BEFORE" not in result.stdout.str()  # no test_after_* failed


def test_a_users_recording_keeps_its_settings_and_its_trace(pytester):
    pytester.makepyfile(
        """
import pytest
import needle.backend_ndarray as nd
import needle_c
from needle import memory

# The user records everything without frames: the plugin needs frames, so it raises the
# context for the marked test and then gives the user's settings back, trace kept.
memory._record_memory_history("all", context=None, max_entries=10000, clear_history=True)
SETTINGS = needle_c._memory_history_settings(nd.cpu()._id)

@pytest.mark.limit_device_memory(1024)
def test_over_the_limit():
    a = nd.empty((4096,))

def test_users_recording_kept():
    assert SETTINGS == (2, 0, False, 10000, 0)
    assert needle_c._memory_history_settings(nd.cpu()._id) == SETTINGS
    sizes = [e["size"] for e in memory._snapshot()["device_traces"][0] if e["action"] == "alloc"]
    assert 16384 in sizes
    memory._record_memory_history(None)
"""
    )
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=1, failed=1)
    section = failure_section(result.stdout.str(), "test_over_the_limit")
    assert "in test_over_the_limit  (a = nd.empty((4096,)))\n" in section
