"""A pytest plugin for testing device memory: peak limits and growth checks.

Installed with needle and loaded automatically through the ``pytest11`` entry point,
so any project's test suite that installs needle can use:

- the marker ``@pytest.mark.limit_device_memory(limit, device=None)``: the test fails
  when the device's peak allocated bytes during the test exceed ``limit`` above what
  was allocated when the test started. ``limit`` is bytes or a size string such as
  ``"256 MiB"`` (see :func:`needle.memory.parse_size`).
- the fixture ``device_memory``: a :class:`DeviceMemory` with ``allocated()``,
  ``peak()`` and ``check_no_growth(step_fn, ...)``, which fails the test when repeating
  a step keeps more and more device memory allocated.

Tests that use neither pay nothing: the hooks return at once when no marker is set.
"""

import gc
import warnings

import pytest

# needle.memory is the only part of needle the plugin needs; the package itself is
# imported anyway because this module lives inside it.
from . import memory as _memory

__all__ = ["DeviceMemory", "MARKER"]

MARKER = "limit_device_memory"

# Rows of the live-tensor report shown in failure messages; more is noise.
_REPORT_ROWS = 10
# check_no_growth lists every step up to this many, then the first and last few.
_MAX_LISTED_STEPS = 30


def pytest_configure(config):
    """Registers the ``limit_device_memory`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(limit, device=None): fail the test when the device's peak allocated "
        "bytes during the test exceed limit (bytes or a size such as '256 MiB') above "
        "the bytes allocated at its start; device is a needle device or a name "
        "('cpu', 'cuda:0'), the default device when omitted.",
    )


def _format_bytes(n):
    """``n`` as exact bytes followed by a readable size, e.g. ``"8388608 bytes (8.00 MiB)"``."""
    return _memory._format_bytes(n, exact=True)


def _device_label(device):
    """A readable name for ``device`` (None, a name, or a needle device)."""
    if device is None:
        return "cpu (the default device)"
    return device if isinstance(device, str) else repr(device)


def _live_tensor_report(device):
    """The largest live-tensor groups on ``device`` as text lines, or ``""``.

    Returns ``""`` when this needle has no ``memory.live_tensors_summary``; the report
    is a diagnostic, so a failure inside it is described rather than raised.
    """
    summary = getattr(_memory, "live_tensors_summary", None)
    if summary is None:
        return ""
    try:
        rows = list(summary(device=device, group_by="op"))
    except Exception as err:  # noqa: BLE001 - a broken report must not hide the real failure
        return f"live tensors: report unavailable ({type(err).__name__}: {err})\n"
    where = "every device" if device is None else _device_label(device)
    if not rows:
        # The report sees Tensors only: arrays held outside a Tensor do not show up in it.
        return f"live tensors on {where}: none (NDArrays outside Tensors are not listed)\n"
    rows.sort(key=lambda row: row.get("bytes", 0), reverse=True)
    lines = [
        f"live tensors on {where} by op "
        f"(largest {min(len(rows), _REPORT_ROWS)} of {len(rows)} groups):",
        f"  {'op':<32}{'count':>8}{'bytes':>14}",
    ]
    for row in rows[:_REPORT_ROWS]:
        lines.append(
            f"  {str(row.get('key')):<32}{row.get('count', 0):>8}{row.get('bytes', 0):>14}"
        )
    if len(rows) > _REPORT_ROWS:
        rest = rows[_REPORT_ROWS:]
        lines.append(
            f"  ... {len(rest)} more groups, {sum(row.get('bytes', 0) for row in rest)} bytes"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# the limit_device_memory marker
# --------------------------------------------------------------------------


def _marker_limits(item):
    """``[(device, limit_bytes)]`` from the item's ``limit_device_memory`` markers.

    The closest marker wins for each device, so a function's marker overrides its
    class's or module's for the same device while markers for other devices still apply.
    Raises TypeError or ValueError for a malformed marker.
    """
    limits = {}
    for marker in item.iter_markers(name=MARKER):
        args, kwargs = list(marker.args), dict(marker.kwargs)
        if len(args) > 2 or set(kwargs) - {"limit", "device"}:
            raise TypeError(
                f"{MARKER} takes (limit, device=None), got args={marker.args!r} "
                f"kwargs={marker.kwargs!r}"
            )
        if "limit" in kwargs and args:
            raise TypeError(f"{MARKER}: limit given twice")
        limit = kwargs.pop("limit") if "limit" in kwargs else (args.pop(0) if args else None)
        if limit is None:
            raise TypeError(f"{MARKER} needs a limit, e.g. @pytest.mark.{MARKER}('256 MiB')")
        device = kwargs.get("device", args[0] if args else None)
        # None and "cpu" both mean the CPU engine; key them alike so that the closest wins.
        key = "cpu" if device is None else (device if isinstance(device, str) else repr(device))
        if key not in limits:
            limits[key] = (device, _memory.parse_size(limit))
    return list(limits.values())


def _limit_failure(device, limit, start, peak, end):
    """The failure message for a test whose peak passed its ``limit_device_memory``."""
    return (
        f"{MARKER}: peak device memory on {_device_label(device)} exceeded the limit\n"
        f"  limit:           {_format_bytes(limit)} above the start\n"
        f"  peak:            {_format_bytes(peak)}, {_format_bytes(peak - start)} above the start\n"
        f"  start allocated: {_format_bytes(start)}\n"
        f"  end allocated:   {_format_bytes(end)}\n" + _live_tensor_report(device)
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Measures the peak of a test marked ``limit_device_memory`` and fails it when the
    peak above the start passes the limit; unmarked tests run untouched."""
    if item.get_closest_marker(MARKER) is None:
        yield
        return
    # A malformed marker raises here, before the test body: the test fails with the error.
    checks = []
    for device, limit in _marker_limits(item):
        if not _memory.memory_stats(device):
            warnings.warn(
                f"{MARKER}: {_device_label(device)} is not available; its limit is not checked",
                pytest.PytestWarning,
                stacklevel=1,
            )
            continue
        # The peak is reset so that it covers this test only; start is the baseline.
        _memory.reset_peak_memory_stats(device)
        checks.append((device, limit, _memory.memory_allocated(device)))
    outcome = yield
    if outcome.excinfo is not None:
        return  # the test failed on its own; that failure is the one to report
    for device, limit, start in checks:
        peak = _memory.max_memory_allocated(device)
        if peak - start > limit:
            failure = pytest.fail.Exception(
                _limit_failure(device, limit, start, peak, _memory.memory_allocated(device)),
                pytrace=False,
            )
            force = getattr(outcome, "force_exception", None)  # pluggy >= 1.1
            if force is None:
                raise failure
            force(failure)
            return


# --------------------------------------------------------------------------
# the device_memory fixture
# --------------------------------------------------------------------------


def _tolerance_bytes(tolerance, baseline):
    """The tolerance in bytes: an int, a size string (``"64 KiB"``), or a float in
    [0, 1) or a percentage string (``"5%"``), both relative to ``baseline``."""
    if isinstance(tolerance, str) and tolerance.strip().endswith("%"):
        try:
            tolerance = float(tolerance.strip()[:-1]) / 100.0
        except ValueError:
            raise ValueError(f"cannot parse tolerance {tolerance!r}") from None
    if isinstance(tolerance, float):
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(
                "a float tolerance is a fraction of the post-warmup allocation "
                f"and must be in [0, 1), got {tolerance}; give bytes as an int"
            )
        return int(tolerance * baseline)
    return _memory.parse_size(tolerance)


class DeviceMemory:
    """What the ``device_memory`` fixture returns: device-memory readings and checks.

    ``device`` arguments are a needle device, a name (``"cpu"``, ``"cuda:0"``) or None
    for the default device.
    """

    def allocated(self, device=None):
        """Returns the bytes that live arrays hold on ``device`` now."""
        return _memory.memory_allocated(device)

    def peak(self, device=None):
        """Returns the peak allocated bytes on ``device`` since the fixture was set up
        (or since the last :meth:`reset_peak`)."""
        return _memory.max_memory_allocated(device)

    def reset_peak(self, device=None):
        """Sets ``device``'s peak to its current allocation; returns None."""
        _memory.reset_peak_memory_stats(device)

    def live_tensors(self, device=None):
        """Returns the live-tensor report for ``device`` as text (``""`` when this needle
        cannot produce one)."""
        return _live_tensor_report(device)

    def check_no_growth(self, step_fn, steps=20, warmup=3, tolerance=0, device=None, collect=False):
        """Fails the test when repeating ``step_fn`` keeps growing device memory.

        Calls ``step_fn()`` ``warmup`` times (to let one-time allocations such as caches
        and optimizer state settle), records the allocated bytes, then calls it ``steps``
        more times and records the bytes after each call. The test fails
        (``pytest.fail``) when the last reading is more than ``tolerance`` above the
        post-warmup one. ``tolerance`` is bytes, a size string (``"64 KiB"``), or a
        float fraction below 1 (or ``"5%"``) of the post-warmup reading. With
        ``collect=True`` every reading follows ``gc.collect()``, so that cyclic garbage
        (which the collector would free) is told apart from memory that stays reachable.

        Returns the readings: the post-warmup baseline followed by one per step.
        """
        if not callable(step_fn):
            raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
        _tolerance_bytes(tolerance, 0)  # reject a malformed tolerance before running anything

        def measure():
            if collect:
                gc.collect()
            return _memory.memory_allocated(device)

        for _ in range(warmup):
            step_fn()
        readings = [measure()]
        for _ in range(steps):
            step_fn()
            readings.append(measure())
        baseline = readings[0]
        allowed = _tolerance_bytes(tolerance, baseline)
        growth = readings[-1] - baseline
        if growth > allowed:
            pytest.fail(
                self._growth_failure(readings, warmup, allowed, device, collect), pytrace=False
            )
        return readings

    @staticmethod
    def _growth_failure(readings, warmup, allowed, device, collect):
        """The failure message of :meth:`check_no_growth`."""
        baseline, steps = readings[0], len(readings) - 1
        growth = readings[-1] - baseline
        lines = [
            f"device memory on {_device_label(device)} grew by {_format_bytes(growth)} over "
            f"{steps} steps (tolerance {_format_bytes(allowed)}; "
            f"{growth / steps:.0f} bytes per step on average)",
            f"  after {warmup} warmup steps: {baseline} bytes allocated"
            + (" (gc.collect() before each reading)" if collect else ""),
        ]
        listed = range(1, steps + 1)
        if steps > _MAX_LISTED_STEPS:
            half = _MAX_LISTED_STEPS // 2
            listed = list(range(1, half + 1)) + [None] + list(range(steps - half + 1, steps + 1))
        for step in listed:
            if step is None:
                lines.append("  ...")
                continue
            value = readings[step]
            lines.append(f"  step {step:>4}: {value} bytes ({value - baseline:+d})")
        if not collect:
            lines.append(
                "  (collect=False: if collect=True passes, the growth is cyclic "
                "garbage that gc.collect() frees, not a leak)"
            )
        return "\n".join(lines) + "\n" + _live_tensor_report(device)


@pytest.fixture
def device_memory():
    """Returns a :class:`DeviceMemory`; the peaks of the available devices are reset
    first, so that ``peak()`` covers this test."""
    for name in ("cpu", "cpu_numpy", "cuda"):
        _memory.reset_peak_memory_stats(name)  # does nothing for an unavailable device
    return DeviceMemory()
