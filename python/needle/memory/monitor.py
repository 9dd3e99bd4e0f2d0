"""needle.memory.monitor: memory over time: a timeline of one device's memory
(:class:`MemoryMonitor`: allocated and reserved bytes and the collector's counters, sampled by
hand with ``monitor.sample(step)`` or by a background thread, the collections recorded
meanwhile (:mod:`.collection_log`), written to CSV or plotted as a PNG) and the allocation sites
of tensors (:func:`record_history`).

Sampling only reads the allocator's counters, so it is cheap and safe from another thread
(the GIL serialises it with the ops that change them).
"""

import csv
import threading
import time

import needle_c as _c

from .._checks import check_real
from .collection_log import collection_history
from .stats import _flag, _resolve, memory_stats

_DEFAULT_INTERVAL = 0.1
_MIB = float(2**20)


class MemoryMonitor:
    """Records samples of ``device``'s memory (None: the default device, ``cpu()``).

    A sample is a dict: ``time`` (seconds since the monitor was created), ``step`` (given to
    :meth:`sample`, None for the thread's samples), ``allocated`` and ``reserved`` (bytes),
    ``num_pressure_collections``, ``num_oom_collections`` (collections the allocator ran so
    far) and ``gc_seconds`` (the time they took). ``interval`` is the background thread's
    period in seconds (None: 0.1 s when :meth:`start` is called).

    Use ``with MemoryMonitor(interval=0.01) as monitor: ...`` to sample in the background
    while the block runs, or call :meth:`sample` once per training step.
    :meth:`collection_history` gives the collections recorded since the monitor was created
    (or cleared), on the samples' time axis; :meth:`plot` marks them.
    """

    FIELDS = (
        "time",
        "step",
        "allocated",
        "reserved",
        "num_pressure_collections",
        "num_oom_collections",
        "gc_seconds",
    )

    def __init__(self, device=None, interval=None):
        if interval is not None:
            # threading's waits take at most TIMEOUT_MAX seconds (a longer one was an
            # OverflowError in the sampling thread).
            interval = check_real(
                "MemoryMonitor interval",
                interval,
                low=0.0,
                high=threading.TIMEOUT_MAX,
                low_open=True,
            )
        self.device = _resolve(device)
        self.interval = interval
        self._samples = []
        self._t0 = time.perf_counter()
        # The collection records' clock (time.monotonic's) at the samples' zero, and where the
        # window of collection_history() opens.
        self._t0_monotonic = time.monotonic()
        self._window_start = self._t0_monotonic
        self._baseline = self._read()
        self._thread = None
        self._stop = threading.Event()

    def _read(self):
        stats = memory_stats(self.device)
        return {
            "time": time.perf_counter() - self._t0,
            "step": None,
            "allocated": stats.get("allocated_bytes.all.current", 0),
            "reserved": stats.get("reserved_bytes.all.current", 0),
            "num_pressure_collections": stats.get("num_pressure_collections", 0),
            "num_oom_collections": stats.get("num_oom_collections", 0),
            "gc_seconds": stats.get("gc_seconds", 0.0),
        }

    def sample(self, step=None):
        """Records the device's current figures, tagged with ``step``; returns the sample."""
        record = self._read()
        record["step"] = step
        # list.append is atomic under the GIL, so the thread and the caller may both sample.
        self._samples.append(record)
        return record

    @property
    def samples(self):
        """A copy of the samples recorded so far (a list of dicts, oldest first)."""
        return list(self._samples)

    def clear(self):
        """Forgets the samples; later collections are counted from now."""
        self._samples = []
        self._window_start = time.monotonic()
        self._baseline = self._read()

    def collection_history(self):
        """The collections recorded for the device (:func:`needle.memory.collection_history`:
        its own and the process-wide ones) since the monitor was created or last cleared,
        oldest first: their dicts with ``time`` added, the start in the samples' seconds since
        the monitor was created. Records that dropped out of the ring (1024 are kept) are not
        there."""
        return [
            dict(record, time=record["start"] - self._t0_monotonic)
            for record in collection_history(self.device)
            if record["start"] >= self._window_start
        ]

    def collections(self):
        """The samples at which the collection counters had increased since the previous
        sample (the first one compares with the counters when the monitor was created).
        Returns copies of those samples with ``new_collections`` (how many) added."""
        result = []
        previous = self._baseline
        for record in self.samples:
            new = sum(
                record[key] - previous[key]
                for key in ("num_pressure_collections", "num_oom_collections")
            )
            if new > 0:
                result.append(dict(record, new_collections=new))
            previous = record
        return result

    def _run(self, interval):
        self.sample()
        while not self._stop.wait(interval):
            self.sample()

    @property
    def running(self):
        """Whether the background thread is sampling."""
        return self._thread is not None and self._thread.is_alive()

    def start(self):
        """Starts sampling every ``interval`` seconds in a daemon thread; returns self."""
        if self.running:
            raise RuntimeError("this MemoryMonitor is already running")
        interval = self.interval if self.interval is not None else _DEFAULT_INTERVAL
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(interval,), name="needle-memory-monitor", daemon=True
        )
        self._thread.start()
        return self

    def stop(self):
        """Stops the thread and records a final sample; returns self. RuntimeError when
        :meth:`start` was not called since the last stop (nothing to stop)."""
        if self._thread is None:
            raise RuntimeError("this MemoryMonitor is not running: stop() needs a start() first")
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()
        return False

    def to_csv(self, path):
        """Writes the samples to ``path`` as CSV with a header row (:attr:`FIELDS`; an empty
        step for the thread's samples); returns ``path``."""
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.FIELDS, extrasaction="ignore")
            writer.writeheader()
            for record in self.samples:
                writer.writerow(
                    {key: ("" if record[key] is None else record[key]) for key in self.FIELDS}
                )
        return path

    def plot(self, path=None, title=None, ax=None, label=None):
        """Plots allocated (solid) and reserved (dashed) MiB against the step (when every
        sample has one) or the time, with a dotted vertical line (legend: "collections") at
        each collection of :meth:`collection_history` that started before the last sample:
        at its time, or against steps at the step of the first sample taken after it.

        Without ``ax`` a new figure is drawn with matplotlib's Agg renderer (pyplot and its
        global backend are not touched) and saved as a PNG at ``path``, which is then
        required. With ``ax`` the lines go into that axes, so that several monitors can
        share one figure; its figure is saved at ``path`` when one is given. ``label``
        prefixes the legend entries (default: the device). Returns the axes.
        """
        samples = self.samples
        if not samples:
            raise ValueError("no samples to plot: call sample() or start() first")
        if ax is None:
            if path is None:
                raise ValueError("plot() needs a path, an ax, or both")
            # Imported here: matplotlib is optional and slow to import.
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure

            figure = Figure(figsize=(8, 4.5))
            FigureCanvasAgg(figure)
            ax = figure.add_subplot()
        by_step = all(record["step"] is not None for record in samples)
        xs = [record["step"] if by_step else record["time"] for record in samples]
        prefix = label if label is not None else repr(self.device)
        (line,) = ax.plot(xs, [r["allocated"] / _MIB for r in samples], label=f"{prefix} allocated")
        ax.plot(
            xs,
            [r["reserved"] / _MIB for r in samples],
            linestyle="--",
            color=line.get_color(),
            label=f"{prefix} reserved",
        )
        for i, x in enumerate(self._collection_marks(samples, by_step)):
            ax.axvline(
                x,
                color=line.get_color(),
                linestyle=":",
                alpha=0.6,
                label=f"{prefix} collections" if i == 0 else None,
            )
        ax.set_xlabel("step" if by_step else "time (s)")
        ax.set_ylabel("MiB")
        if title is not None:
            ax.set_title(title)
        ax.legend(loc="best", fontsize="small")
        if path is not None:
            ax.figure.savefig(path, format="png")
        return ax

    def _collection_marks(self, samples, by_step):
        """The x of each recorded collection within the samples' span (see :meth:`plot`)."""
        marks = []
        for record in self.collection_history():
            after = next((r for r in samples if r["time"] >= record["time"]), None)
            if after is not None:
                marks.append(after["step"] if by_step else record["time"])
        return marks


class _HistoryRecording:
    """The switch returned by :func:`record_history`; a context manager that restores the
    previous setting on exit."""

    def __init__(self, enabled):
        self.enabled = _flag("enabled", enabled)
        self.previous = _c._record_history(self.enabled)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        _c._record_history(self.previous)
        return False

    def __repr__(self):
        return f"record_history(enabled={self.enabled}, previous={self.previous})"


def record_history(enabled=True):
    """Turns recording of allocation sites on (or off): tensors created afterwards keep the
    Python stack that created them (``t._alloc_site``), which :func:`live_tensors` and
    :func:`find_cycles` report as ``"file:line"``. Recording costs time on every tensor.

    Takes effect at once and returns a switch whose ``previous`` attribute is the former
    setting; used as ``with record_history(): ...`` it restores that setting on exit.
    """
    return _HistoryRecording(enabled)
