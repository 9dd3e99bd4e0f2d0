"""A pytest plugin for testing device memory: peak limits and growth checks that name what
the test kept.

Installed with needle and loaded automatically through the ``pytest11`` entry point,
so any project's test suite that installs needle can use:

- the marker ``@pytest.mark.limit_device_memory(limit, device=None)``: the test fails
  when the device's peak allocated bytes during the test exceed ``limit`` above what
  was allocated when the test started. ``limit`` is bytes, a size string such as
  ``"256 MiB"`` or a fraction of the device's capacity (see
  :func:`needle.memory.parse_size`). A device this machine does not have (``"cuda"``
  without a GPU) skips the test with the reason; a malformed argument is an error of the
  test's setup that names it, before the test runs.
- the fixture ``device_memory``: a :class:`DeviceMemory` with ``allocated()``,
  ``peak()`` and ``check_no_growth(step_fn, ...)``, which fails the test when repeating
  a step keeps more and more device memory allocated.

A failure lists what the test (for ``check_no_growth``: its measured steps) created and
still keeps alive, not every tensor of the process: each tensor with its shape, dtype and
bytes, grouped by the line that created it. To name that line the plugin records
allocation sites (:func:`needle.memory.record_history`) while a marked test or one using
the fixture runs; ``--needle-no-history`` turns that off (it costs time on every tensor).
A ``limit_device_memory`` failure also says where the peak was: the test's line running
at the allocation that reached it (and the helper's line, when that allocation came from
another file), and the allocations the test had made that were live then, by line. The
device's memory history records that (:func:`needle.memory._record_memory_history`'s
frames of live blocks, with its peak record) while the test runs, and is given back its
former settings afterwards.

Tests that use neither pay nothing: the hooks return at once when no marker is set.
"""

import contextlib
import gc
import linecache
import os

import pytest

# needle.memory is the part of needle the plugin measures with; needle.cuda says why a GPU
# is missing. The package itself is imported anyway because this module lives inside it.
from . import cuda as _cuda
from . import memory as _memory

__all__ = ["DeviceMemory", "MARKER"]

MARKER = "limit_device_memory"
HISTORY_OPTION = "--needle-no-history"

# Allocation sites listed in a failure message, and tensor kinds under each; more is noise.
_REPORT_ROWS = 10
_ROWS_PER_SITE = 5
# check_no_growth lists every step up to this many, then the first and last few.
_MAX_LISTED_STEPS = 30
# Lines listed under "live at the peak".
_PEAK_ROWS = 5


def pytest_addoption(parser):
    """Adds ``--needle-no-history``."""
    parser.getgroup("needle").addoption(
        HISTORY_OPTION,
        action="store_true",
        default=False,
        help="do not record where tensors are created while limit_device_memory tests and "
        "device_memory tests run (faster; failure reports then cannot name the lines)",
    )


def pytest_configure(config):
    """Registers the ``limit_device_memory`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(limit, device=None): fail the test when the device's peak allocated "
        "bytes during the test exceed limit (bytes or a size such as '256 MiB') above "
        "the bytes allocated at its start; device is a needle device or a name "
        "('cpu', 'cuda:0'), the default device when omitted; skipped when the device is "
        "not available.",
    )


def _format_bytes(n):
    """``n`` as exact bytes followed by a readable size, e.g. ``"8388608 bytes (8.00 MiB)"``."""
    return _memory._format_bytes(n, exact=True)


def _device_label(device):
    """A readable name for ``device`` (None, a name, or a needle device)."""
    if device is None:
        return "cpu (the default device)"
    return device if isinstance(device, str) else repr(device)


def _unavailable_reason(dev):
    """Why the Device ``dev`` cannot be used here, for a skip message."""
    if dev.name != "cuda":
        return f"{dev!r} is not available"
    reason = _cuda.unavailable_reason()
    if reason is None:  # CUDA works, but this index is past the machine's GPUs
        reason = f"this machine has {_cuda.device_count()} CUDA device(s)"
    return f"{dev!r} is not available: {reason}"


def _skip_at_the_test(reason):
    """Skips the running test with ``reason``, reported at the test's line (as a ``skipif``
    marker is) rather than at this plugin's."""
    try:
        exc = pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # a pytest without the keyword (before 7.0)
        exc = pytest.skip.Exception(reason)
    raise exc


def _history(config):
    """A context that records allocation sites, unless ``--needle-no-history`` was given."""
    if config is not None and config.getoption(HISTORY_OPTION, default=False):
        return contextlib.nullcontext()
    return _memory.record_history(True)


def _live_tensor_report(device):
    """The largest live-tensor groups on ``device`` as text lines, or ``""``.

    Every live tensor of the process, whichever test made it: what ``DeviceMemory.live_tensors``
    shows. Failure messages use :func:`_kept_report`, which lists only the test's own.
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


def _short_site(site, rootdir):
    """``"file:line"`` with the file relative to ``rootdir`` when it lies under it."""
    filename, _, line = site.rpartition(":")
    if rootdir is not None:
        relative = os.path.relpath(filename, rootdir)
        if not relative.startswith(os.pardir):
            filename = relative
    return f"{filename}:{line}"


def _count(n, noun):
    """``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _kept_report(dev, snapshot, growth, rootdir=None, history=True, what="the test"):
    """What ``what`` created after ``snapshot`` and still keeps on the Device ``dev``, as text
    lines: one group per allocation site (largest first), each tensor kind in it with its
    count, shape, dtype and bytes. ``growth`` is how much the allocated bytes grew meanwhile,
    to say when the tensors listed do not account for it. A failure inside the report is
    described rather than raised, so that it cannot hide the failure it explains."""
    try:
        records = _memory.live_tensors(dev, group_by=None, since=snapshot)
    except Exception as err:  # noqa: BLE001 - a broken report must not hide the real failure
        return f"kept tensors: report unavailable ({type(err).__name__}: {err})\n"
    total = sum(record["bytes"] for record in records)
    if not records:
        lines = [f"kept: no tensor that {what} created is still alive on {dev!r}"]
    else:
        lines = [
            f"kept: {_count(len(records), 'tensor')} that {what} created "
            f"{'is' if len(records) == 1 else 'are'} still alive on {dev!r}, "
            f"{_format_bytes(total)}, by allocation site:"
        ]
    sites = {}
    for record in records:
        site = record["site"]
        if site is None:
            site = "(site not recorded)" if history else "(sites not recorded: history off)"
        else:
            site = _short_site(site, rootdir)
        kinds = sites.setdefault(site, {})
        kind = (record["type"], record["shape"], record["dtype"], record["bytes"], record["op"])
        kinds[kind] = kinds.get(kind, 0) + 1
    ordered = sorted(
        sites.items(), key=lambda item: (-sum(k[3] * n for k, n in item[1].items()), item[0])
    )
    for site, kinds in ordered[:_REPORT_ROWS]:
        site_bytes = sum(kind[3] * n for kind, n in kinds.items())
        lines.append(
            f"  {site}: {_count(sum(kinds.values()), 'tensor')}, {_format_bytes(site_bytes)}"
        )
        # Most bytes first; an op's output before the leaves it keeps alive.
        rows = sorted(
            kinds.items(),
            key=lambda item: (-item[0][3] * item[1], item[0][4] is None, str(item[0])),
        )
        for (kind, shape, dtype, nbytes, op), count in rows[:_ROWS_PER_SITE]:
            lines.append(
                f"    {count} x {kind}(shape={shape}, dtype={dtype}, bytes={nbytes}, "
                f"op={op or '(leaf)'})"
            )
        if len(rows) > _ROWS_PER_SITE:
            lines.append(f"    ... {len(rows) - _ROWS_PER_SITE} more kinds")
    if len(ordered) > _REPORT_ROWS:
        lines.append(f"  ... {len(ordered) - _REPORT_ROWS} more sites")
    if growth > total:
        lines.append(
            f"  allocated bytes grew by {_format_bytes(growth)}: the rest is held by arrays "
            "outside Tensors (not listed) or by storage that older tensors share"
        )
    if records and not history:
        lines.append(f"  (allocation sites are recorded unless {HISTORY_OPTION} is given)")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# the limit_device_memory marker
# --------------------------------------------------------------------------


class _MarkerUsageError(Exception):
    """A malformed ``limit_device_memory`` marker; its message names the argument."""


def _marker_limits(item):
    """``[(device, limit)]`` from the item's ``limit_device_memory`` markers: the Device
    object and the limit as written (checked, not yet converted to bytes, since a fraction
    needs the device's capacity).

    The closest marker wins for each device, so a function's marker overrides its
    class's or module's for the same device while markers for other devices still apply.
    Raises _MarkerUsageError, naming the argument, for a malformed marker.
    """
    limits = {}
    for marker in item.iter_markers(name=MARKER):
        args, kwargs = list(marker.args), dict(marker.kwargs)
        if len(args) > 2 or set(kwargs) - {"limit", "device"}:
            raise _MarkerUsageError(
                f"{MARKER} takes (limit, device=None), got args={marker.args!r} "
                f"kwargs={marker.kwargs!r}"
            )
        if "limit" in kwargs and args:
            raise _MarkerUsageError(f"{MARKER}: limit given twice")
        if "device" in kwargs and len(args) > 1:
            raise _MarkerUsageError(f"{MARKER}: device given twice")
        limit = kwargs.pop("limit") if "limit" in kwargs else (args.pop(0) if args else None)
        if limit is None:
            raise _MarkerUsageError(
                f"{MARKER} needs a limit, e.g. @pytest.mark.{MARKER}('256 MiB')"
            )
        try:
            _memory.parse_size(limit, capacity=1)  # the form only: capacity comes later
        except (TypeError, ValueError) as err:
            raise _MarkerUsageError(
                f"{MARKER}: bad limit={limit!r} ({type(limit).__name__}): {err}"
            ) from None
        device = kwargs.get("device", args[0] if args else None)
        try:
            dev = _memory._resolve(device)
        except (TypeError, ValueError) as err:
            raise _MarkerUsageError(f"{MARKER}: bad device={device!r}: {err}") from None
        limits.setdefault(repr(dev), (dev, limit))
    return list(limits.values())


def _limit_failure(dev, limit, start, peak, end, where, kept):
    """The failure message for a test whose peak passed its ``limit_device_memory``;
    ``where`` is :func:`_peak_report`'s text."""
    return (
        f"{MARKER}: peak device memory on {dev!r} exceeded the limit\n"
        f"  limit:           {_format_bytes(limit)} above the start\n"
        f"  peak:            {_format_bytes(peak)}, {_format_bytes(peak - start)} above the start\n"
        f"  start allocated: {_format_bytes(start)}\n"
        f"  end allocated:   {_format_bytes(end)}\n" + where + kept
    )


def _same_file(a, b):
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _frame_text(frame, rootdir):
    """``"file:line in name  (source)"`` for a frame dict of :func:`needle.memory._peak`."""
    site = _short_site(f"{frame['filename']}:{frame['line']}", rootdir)
    source = linecache.getline(frame["filename"], frame["line"]).strip()
    return f"{site} in {frame['name']}" + (f"  ({source})" if source else "")


def _peak_report(dev, test_file, rootdir=None, history=True):
    """Where the peak on the Device ``dev`` was since :func:`needle.memory._record_peak`, as
    text lines: the line of ``test_file`` running at the allocation that reached it (and that
    allocation's own line when it lies elsewhere, in a helper), then the allocations the test
    had made that were live at the peak, grouped by the line that made them, most bytes
    first. A failure inside the report is described rather than raised."""
    if not history:
        return f"  peak at:         (not recorded: {HISTORY_OPTION} was given)\n"
    try:
        record = _memory._peak(dev)
        if record is None:
            return (
                "  peak at:         (not recorded: the device's memory history was turned "
                "off during the test)\n"
            )
        frames = record["frames"]
        in_test = next((f for f in frames if _same_file(f["filename"], test_file)), None)
        if not frames:
            lines = ["  peak at:         (no Python frames recorded)"]
        elif in_test is None:
            lines = [
                f"  peak at:         {_frame_text(frames[0], rootdir)} (outside the test's file)"
            ]
        else:
            lines = [f"  peak at:         {_frame_text(in_test, rootdir)}"]
            if in_test is not frames[0]:
                lines.append(f"    via {_frame_text(frames[0], rootdir)}")
        sites = {}
        for block in record["blocks"]:
            top = block["frames"][0] if block["frames"] else None
            site = (
                _short_site(f"{top['filename']}:{top['line']}", rootdir)
                if top is not None
                else "(no frames recorded)"
            )
            count, nbytes = sites.get(site, (0, 0))
            sites[site] = (count + 1, nbytes + block["bytes"])
        total = sum(nbytes for _, nbytes in sites.values())
        count = sum(n for n, _ in sites.values())
        before = record["bytes"] - total
        lines.append(
            f"  live at the peak: {_count(count, 'allocation')} that the test made, "
            f"{_format_bytes(total)}, and {_format_bytes(before)} allocated before it"
            + (", by line:" if sites else "")
        )
        ordered = sorted(sites.items(), key=lambda item: (-item[1][1], item[0]))
        width = max((len(site) for site, _ in ordered[:_PEAK_ROWS]), default=0)
        for site, (n, nbytes) in ordered[:_PEAK_ROWS]:
            lines.append(f"    {site:<{width}}  {_count(n, 'allocation')}, {_format_bytes(nbytes)}")
        if len(ordered) > _PEAK_ROWS:
            rest = ordered[_PEAK_ROWS:]
            lines.append(
                f"    ... {len(rest)} more lines, "
                f"{_format_bytes(sum(nbytes for _, (_, nbytes) in rest))}"
            )
    except Exception as err:  # noqa: BLE001 - a broken report must not hide the real failure
        return f"  peak at:         report unavailable ({type(err).__name__}: {err})\n"
    return "\n".join(lines) + "\n"


# Where pytest_runtest_setup leaves the checked limits for pytest_runtest_call.
_LIMITS = pytest.StashKey()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Reads a marked test's limits before its fixtures run: a malformed marker is an error
    of the test's setup that names the argument (as pytest reports a bad ``skipif``), and a
    device this machine lacks skips the test with the reason."""
    if item.get_closest_marker(MARKER) is None:
        return
    try:
        limits, usage_error = _marker_limits(item), None
    except _MarkerUsageError as err:
        limits, usage_error = [], str(err)
    if usage_error is not None:  # failed outside the except, so no chained exception shows
        pytest.fail(usage_error, pytrace=False)
    for dev, _ in limits:
        if not dev.enabled():
            _skip_at_the_test(f"{MARKER}: {_unavailable_reason(dev)}")
    item.stash[_LIMITS] = [
        (dev, _memory.parse_size(limit, _memory.memory_stats(dev)["device_capacity_bytes"]))
        for dev, limit in limits
    ]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Measures the peak of a test marked ``limit_device_memory`` and fails it when the
    peak above the start passes the limit, listing what the test kept; unmarked tests run
    untouched."""
    limits = item.stash.get(_LIMITS, None)
    if not limits:
        yield
        return
    history = not item.config.getoption(HISTORY_OPTION, default=False)
    checks, recorded = [], []
    try:
        for dev, limit in limits:
            # The peak is reset so that it covers this test only; start is the baseline.
            _memory.reset_peak_memory_stats(dev)
            if history:  # given back its settings in the finally, whatever the test did
                recorded.append((dev, _memory._record_peak(dev)))
            checks.append((dev, limit, _memory.memory_allocated(dev)))
        snapshot = _memory.tensor_snapshot()
        with _history(item.config):
            outcome = yield
        if outcome.excinfo is not None:
            return  # the test failed on its own; that failure is the one to report
        for dev, limit, start in checks:
            peak = _memory.max_memory_allocated(dev)
            if peak - start > limit:
                end = _memory.memory_allocated(dev)
                rootdir = item.config.rootpath
                where = _peak_report(dev, str(item.path), rootdir, history)
                kept = _kept_report(dev, snapshot, end - start, rootdir, history)
                failure = pytest.fail.Exception(
                    _limit_failure(dev, limit, start, peak, end, where, kept), pytrace=False
                )
                force = getattr(outcome, "force_exception", None)  # pluggy >= 1.1
                if force is None:
                    raise failure
                force(failure)
                return
    finally:
        for dev, settings in reversed(recorded):
            _memory._restore_history(dev, settings)


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
    for the default device. ``rootdir`` (the fixture passes pytest's) shortens the files of
    allocation sites in failure messages; ``history`` says whether sites are being recorded
    (the fixture records them unless ``--needle-no-history`` is given).
    """

    def __init__(self, rootdir=None, history=False):
        self.rootdir = rootdir
        self.history = history

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
        """Returns the report of every live tensor on ``device`` (None: every device), whichever
        test made it, as text (``""`` when this needle cannot produce one)."""
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

        The failure message lists the tensors that the measured steps created and still
        keep alive on the device, grouped by the line that created them (see the module's
        docstring). A device this machine lacks (``"cuda"`` without a GPU) skips the test
        with the reason instead of measuring nothing.

        Returns the readings: the post-warmup baseline followed by one per step.
        """
        if not callable(step_fn):
            raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
        _tolerance_bytes(tolerance, 0)  # reject a malformed tolerance before running anything
        _memory._flag("collect", collect)
        dev = _memory._resolve(device)
        if not dev.enabled():
            _skip_at_the_test(f"check_no_growth: {_unavailable_reason(dev)}")

        def measure():
            if collect:
                gc.collect()
            return _memory.memory_allocated(dev)

        for _ in range(warmup):
            step_fn()
        readings = [measure()]
        # Taken after the warmup, so that the report lists what the measured steps kept.
        snapshot = _memory.tensor_snapshot()
        for _ in range(steps):
            step_fn()
            readings.append(measure())
        baseline = readings[0]
        allowed = _tolerance_bytes(tolerance, baseline)
        growth = readings[-1] - baseline
        if growth > allowed:
            kept = _kept_report(
                dev, snapshot, growth, self.rootdir, self.history, what="the measured steps"
            )
            pytest.fail(
                self._growth_failure(readings, warmup, allowed, device, collect) + kept,
                pytrace=False,
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
        return "\n".join(lines) + "\n"


@pytest.fixture
def device_memory(request):
    """Yields a :class:`DeviceMemory`; the peaks of the available devices are reset
    first, so that ``peak()`` covers this test, and allocation sites are recorded until the
    test ends (unless ``--needle-no-history`` is given)."""
    for name in ("cpu", "cpu_numpy", "cuda"):
        _memory.reset_peak_memory_stats(name)  # does nothing for an unavailable device
    config = request.config
    with _history(config):
        yield DeviceMemory(
            rootdir=config.rootpath, history=not config.getoption(HISTORY_OPTION, default=False)
        )
