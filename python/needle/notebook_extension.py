"""needle.notebook_extension: ``%load_ext needle``, a line after each IPython cell that moved
device memory, and the magics ``%needle_memory`` and ``%needle_holders``.

After each cell (IPython's ``post_run_cell`` event) one line says, for each device whose memory
moved during the cell (allocated changed, the cell peaked above where it started, or needle ran
collections): allocated bytes and their change, the cell's peak, reserved bytes, and the
collections needle ran during the cell with their time and what they freed. The line reads the
allocator's counters only (``memory_stats``), never the heap: its cost does not grow with the
objects a kernel holds (bench/notebook_line_cost.py).

The cell's peak is the engine's window peak (``needle_c._memory_window_peak``), which the
extension restarts when a cell starts (``pre_run_cell``); the peak that
``max_memory_allocated()`` reports, and ``reset_peak_memory_stats()`` resets, is left alone.

The line and the holders table are shown as a ``text/plain`` + ``text/html`` bundle: Jupyter
shows the HTML, a terminal IPython the text. IPython is imported inside the functions only, and
this module only when the extension is loaded, so ``import needle`` does not import IPython.
"""

import html

import needle_c as _c

from .memory.holders import _holder_reaches, _releasable_bytes
from .memory.stats import _format_bytes
from .memory.summary import memory_summary

MEMORY_USAGE = (
    "usage: %needle_memory [on|off|DEVICE]\n"
    "  %needle_memory          memory_summary() of the default device (cpu)\n"
    "  %needle_memory DEVICE   memory_summary(DEVICE): cpu, cpu_numpy, cuda or cuda:N\n"
    "  %needle_memory off      no memory line after each cell\n"
    "  %needle_memory on       the memory line again"
)
HOLDERS_USAGE = "usage: %needle_holders [DEVICE]   (DEVICE: cpu, cpu_numpy, cuda or cuda:N)"
# The line's counters, read at a cell's start and end: their differences are the cell's.
_ALLOCATED = "allocated_bytes.all.current"
_COUNTERS = (_ALLOCATED, "num_collect_calls", "gc_seconds", "gc_freed_bytes")
_LINE_STYLE = (
    "font-family: monospace; font-size: 85%; color: #555; "
    "border-left: 3px solid #7a9; padding-left: 6px; margin: 2px 0"
)
# The holders the hint names one by one before "and N more".
_HINT_NAMES = 3


def _devices():
    """``[(name, engine id)]`` of the devices this process can use: cpu, cpu_numpy and each
    usable GPU (``cuda:N``). GPUs do not come and go while a process runs."""
    devices = [("cpu", _c.cpu()._id), ("cpu_numpy", _c.cpu_numpy()._id)]
    for index in range(_c.MAX_CUDA_DEVICES):
        dev = _c.cuda(index)
        if dev.enabled():
            devices.append((f"cuda:{index}", dev._id))
    return devices


def _change(n):
    if n == 0:
        return "unchanged"
    return ("+" if n > 0 else "-") + _format_bytes(abs(n))


def _show(text, markup):
    """Displays ``text`` (terminal) and ``markup`` (Jupyter) as one output."""
    from IPython.display import display

    display({"text/plain": text, "text/html": markup}, raw=True)


def _parse_device(argument, usage):
    """The device a magic's argument names, or a UsageError with the magic's usage."""
    from IPython.core.error import UsageError

    try:
        return _c._device(argument)
    except (ValueError, TypeError) as err:
        raise UsageError(f"{err}\n{usage}") from None


class CellMemoryLine:
    """The callbacks for IPython's ``pre_run_cell`` and ``post_run_cell`` events: each
    device's counters at the cell's start, and at its end the line for the devices whose
    memory moved. ``enabled`` False (``%needle_memory off``) makes both do nothing."""

    def __init__(self, devices=None):
        self.devices = _devices() if devices is None else devices
        self.enabled = True
        self.start = {}
        self.pre_run_cell()  # the cell that loads the extension starts now

    def pre_run_cell(self, info=None):
        """Reads each device's counters and restarts its window peak."""
        if not self.enabled:
            return
        start = {}
        for _, engine_id in self.devices:
            stats = _c._memory_stats(engine_id)
            _c._memory_window_peak(engine_id)
            start[engine_id] = tuple(stats[key] for key in _COUNTERS)
        self.start = start

    def moves(self):
        """``[(device name, dict)]`` for the devices whose memory moved since the cell
        started: ``allocated``, ``change``, ``peak`` (the most allocated during the cell),
        ``reserved``, ``collections``, ``gc_seconds`` and ``gc_freed_bytes`` (the cell's).
        Restarts each device's window peak."""
        moved = []
        for name, engine_id in self.devices:
            stats = _c._memory_stats(engine_id)
            peak = _c._memory_window_peak(engine_id)
            before = self.start.get(engine_id)
            if before is None:
                continue
            allocated, collections, seconds, freed = (stats[key] for key in _COUNTERS)
            change = allocated - before[0]
            collections -= before[1]
            if change == 0 and peak <= before[0] and collections == 0:
                continue
            moved.append(
                (
                    name,
                    {
                        "allocated": allocated,
                        "change": change,
                        "peak": max(peak, allocated),
                        "reserved": stats["reserved_bytes.all.current"],
                        "collections": collections,
                        "gc_seconds": seconds - before[2],
                        "gc_freed_bytes": freed - before[3],
                    },
                )
            )
        return moved

    def post_run_cell(self, result=None):
        """Shows the cell's line when some device's memory moved."""
        if not self.enabled:
            return
        moved = self.moves()
        if moved:
            _show(*format_line(moved))


def _device_text(name, m):
    text = (
        f"{name} allocated {_format_bytes(m['allocated'])} ({_change(m['change'])}), "
        f"cell peak {_format_bytes(m['peak'])}, reserved {_format_bytes(m['reserved'])}"
    )
    if m["collections"]:
        plural = "s" if m["collections"] != 1 else ""
        text += (
            f"; {m['collections']} collection{plural} "
            f"{1e3 * m['gc_seconds']:.1f} ms, freed {_format_bytes(m['gc_freed_bytes'])}"
        )
    return text


def format_line(moved):
    """``(text, html)`` of the line for :meth:`CellMemoryLine.moves`' devices."""
    parts = [_device_text(name, m) for name, m in moved]
    text = "needle: " + " | ".join(parts)
    markup = " | ".join(
        f"<b>{html.escape(name)}</b>{html.escape(part[len(name) :])}"
        for (name, _), part in zip(moved, parts)
    )
    return text, f'<div style="{_LINE_STYLE}">needle: {markup}</div>'


def _release_hint(found):
    """The line naming what release_notebook_references() would free: the bytes that the
    output cache and the traceback reach and no name does; None when that is nothing."""
    names = []
    for holder, kind, _ in found:
        if kind in ("output_cache", "traceback"):
            label = "the last traceback" if kind == "traceback" else holder
            if label not in names:
                names.append(label)
    freed = _releasable_bytes(found)
    if not freed:
        return None
    shown = names[:_HINT_NAMES]
    if len(names) > _HINT_NAMES:
        shown.append(f"{len(names) - _HINT_NAMES} more")
    listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
    return f"ndl.memory.release_notebook_references() frees {_format_bytes(freed)} held by {listed}"


_COLUMNS = ("holder", "kind", "bytes", "tensors", "graph tensors")


def format_holders(found, device=None):
    """``(text, html)``: the table of :func:`needle.memory.holders`' rows (holder, kind,
    bytes, tensors, graph tensors) from ``_holder_reaches``, then the release hint."""
    where = "" if device is None else f" on {device!r}"
    if not found:
        text = f"no name, Out[] entry or traceback frame holds a needle tensor{where}"
        return text, f"<p>{html.escape(text)}</p>"
    rows = [
        (holder, kind, _format_bytes(r.bytes), str(r.tensors), str(r.graph_tensors))
        for holder, kind, r in found
    ]
    widths = [max(len(row[i]) for row in rows + [_COLUMNS]) for i in range(len(_COLUMNS))]
    right = (False, False, True, True, True)

    def text_row(cells):
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)
        ).rstrip()

    lines = [text_row(_COLUMNS)] + [text_row(row) for row in rows]
    align = ["left" if not r else "right" for r in right]
    head = "".join(f'<th style="text-align: {a}">{c}</th>' for c, a in zip(_COLUMNS, align))
    body = "".join(
        "<tr>"
        + "".join(f'<td style="text-align: {a}">{html.escape(c)}</td>' for c, a in zip(row, align))
        + "</tr>"
        for row in rows
    )
    markup = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    hint = _release_hint(found)
    if hint is not None:
        lines.append(hint)
        markup += f"<p><code>{html.escape(hint)}</code></p>"
    return "\n".join(lines), markup


class _Extension:
    """What one shell registered: the line's callbacks and the two magics."""

    def __init__(self, shell):
        self.shell = shell
        self.line = CellMemoryLine()

    def needle_memory(self, argument):
        """%needle_memory [on|off|DEVICE]: memory_summary() of DEVICE (the default device
        when none), or the memory line after each cell switched off or on."""
        from IPython.core.error import UsageError

        words = argument.split()
        if len(words) > 1:
            raise UsageError(f"%needle_memory takes at most one argument\n{MEMORY_USAGE}")
        word = words[0] if words else None
        if word == "off":
            self.line.enabled = False
            print("needle: the memory line after each cell is off (%needle_memory on: back on)")
        elif word == "on":
            self.line.enabled = True
            self.line.pre_run_cell()  # this cell's line counts from now
            print("needle: the memory line after each cell is on")
        else:
            print(memory_summary(_parse_device(word, MEMORY_USAGE)), end="")

    def needle_holders(self, argument):
        """%needle_holders [DEVICE]: who holds device memory (needle.memory.holders())."""
        from IPython.core.error import UsageError

        words = argument.split()
        if len(words) > 1:
            raise UsageError(f"%needle_holders takes at most one argument\n{HOLDERS_USAGE}")
        device = _parse_device(words[0], HOLDERS_USAGE) if words else None
        _show(*format_holders(_holder_reaches(device), device))

    def register(self):
        events = self.shell.events
        events.register("pre_run_cell", self.line.pre_run_cell)
        events.register("post_run_cell", self.line.post_run_cell)
        self.shell.register_magic_function(self.needle_memory, "line", "needle_memory")
        self.shell.register_magic_function(self.needle_holders, "line", "needle_holders")

    def unregister(self):
        events = self.shell.events
        events.unregister("pre_run_cell", self.line.pre_run_cell)
        events.unregister("post_run_cell", self.line.post_run_cell)
        line_magics = self.shell.magics_manager.magics["line"]
        for name in ("needle_memory", "needle_holders"):
            line_magics.pop(name, None)


# The extension of each shell it is loaded in (by id: a shell is not hashable by value).
_LOADED = {}


def load_ipython_extension(ipython):
    """Registers the memory line's callbacks and the magics in ``ipython``; loading it
    again in the same shell changes nothing."""
    if id(ipython) in _LOADED:
        return
    extension = _Extension(ipython)
    extension.register()
    _LOADED[id(ipython)] = extension


def unload_ipython_extension(ipython):
    """Removes what :func:`load_ipython_extension` registered in ``ipython``."""
    extension = _LOADED.pop(id(ipython), None)
    if extension is not None:
        extension.unregister()
