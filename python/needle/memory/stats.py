"""needle.memory.stats: per-device statistics, size parsing and limits.

The views of the allocator's counters that ``torch.cuda`` users know (``memory_stats`` is
the source of truth; the other getters read it), ``parse_size``, the device limits (and
``NEEDLE_MEMORY_LIMIT``, applied when :mod:`needle.memory` is imported) and the one byte
formatter of the package, ``_format_bytes``. Device arguments are resolved by needle_c's
own parser (``needle_c._device``), the one every array function uses.
"""

import numbers
import os
import re
import warnings

import needle_c as _c

from .. import _environ

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def _flag(name, value):
    """``value`` when it is a bool; otherwise a TypeError naming the argument ``name``. A
    flag takes True or False only: ``bool("no")`` is True, so a string must not be read as
    one."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def _resolve(device):
    """The Device object for ``device`` (None, a Device, or a name such as ``"cuda:1"``);
    for a CUDA device this process cannot use, one whose ``enabled()`` is False."""
    return _c._device(device)


def _engine_id(device):
    """The engine's id for ``device``, or -1 when this process cannot use it."""
    dev = _resolve(device)
    return dev._id if dev.enabled() else -1


def memory_stats(device=None):
    """A flat dict of the device's allocator statistics (bytes and counts).

    Keys follow ``torch.cuda.memory_stats``: ``allocated_bytes.all.current``,
    ``.peak``, ``.allocated`` (cumulative), ``.freed`` (cumulative); the same for
    ``reserved_bytes``; ``allocation.all.*`` counts live and cumulative blocks;
    ``num_alloc_retries``, ``num_ooms``; ``memory_limit_bytes`` (-1: none),
    ``gc_trigger_bytes`` (-1: none), ``device_capacity_bytes``.

    The collector's figures all come from one set of counters, kept by the collection pacer
    (csrc/gc_pacer.c) for every collection needle runs on this device, one key each:
    ``num_pressure_collections`` (soft ones, of which ``num_safe_point_collections`` at
    safe points), ``num_oom_collections`` (on the out-of-memory path),
    ``num_collect_calls`` (every collection run: the two together), ``num_pressure_skips``
    (paced out), ``num_pressure_deferrals`` (left to the next safe point), ``gc_seconds``
    (time spent), ``gc_freed_bytes`` (allocated bytes that dropped during them) and
    ``gc_survivor_bytes``; each collection's steps: ``num_scoped_collections``,
    ``scoped_gc_seconds``, ``scoped_objects_examined``, ``scoped_freed_bytes``,
    ``num_full_collections``, ``num_full_fallbacks``, ``num_fallbacks_skipped``. Under aligned
    collections (``needle.memory.alignment``, data-parallel training): ``num_aligned_wants``
    (soft collections turned into wants), ``aligned_rounds_waited`` (the all-reduces they
    waited for) and ``num_aligned_collections`` (agreed ladders run with this device's). An
    unavailable device gives ``{}``.
    """
    engine_id = _engine_id(device)
    return _c._memory_stats(engine_id) if engine_id >= 0 else {}


def memory_allocated(device=None):
    """Bytes held by live arrays' storages on the device."""
    engine_id = _engine_id(device)
    return _c._memory_allocated(engine_id) if engine_id >= 0 else 0


def max_memory_allocated(device=None):
    """Peak of :func:`memory_allocated` since start or the last :func:`reset_peak_memory_stats`."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    """Bytes obtained from the device, cache included (on the CPU: blocks of 2 MiB and more are
    rounded to 2 MiB and cached for reuse, so reserved can exceed allocated until
    :func:`empty_cache`)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    """Peak of :func:`memory_reserved`."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    """Sets every peak statistic of the device to its current value."""
    engine_id = _engine_id(device)
    if engine_id >= 0:
        _c._reset_peak_memory_stats(engine_id)


def empty_cache(device=None):
    """Returns cached, unused device memory to the system; returns the bytes released."""
    engine_id = _engine_id(device)
    return _c._empty_cache(engine_id) if engine_id >= 0 else 0


_SIZE_HELP = (
    "a size is whole bytes ('4096'), a number with a unit ('2GiB', '512 MiB', '1.5GB') or a "
    "fraction of the device's capacity ('0.5', '50%')"
)


def _size_fraction(value):
    """The fraction of a capacity that a size stands for, or None when it is not a fraction.

    Fractions are floats, strings ending in ``%`` and unit-less strings with a decimal point
    (``"0.5"``, read as the float ``0.5`` is); all must be in (0, 1]. A unit-less decimal
    outside it (``"1.5"``) is an error: it is not whole bytes either."""
    if isinstance(value, float):
        fraction = value
    elif isinstance(value, str) and value.strip().endswith("%"):
        try:
            fraction = float(value.strip()[:-1]) / 100.0
        except ValueError:
            raise ValueError(f"cannot parse memory size {value!r}: {_SIZE_HELP}") from None
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None or match.group(2) or "." not in match.group(1):
            return None
        fraction = float(match.group(1))
        if not (0.0 < fraction <= 1.0):
            raise ValueError(
                f"memory size {value!r} has no unit and is not whole bytes, nor a fraction in "
                f"(0, 1]: {_SIZE_HELP}"
            )
    else:
        return None
    if not (0.0 < fraction <= 1.0):
        raise ValueError(f"a fractional memory size must be in (0, 1], got {fraction}")
    return fraction


def parse_size(value, capacity=None):
    """Bytes for a size: an int, a fraction of ``capacity`` (a float in (0, 1], or a string
    such as ``"0.5"`` or ``"50%"``), or a string with a unit such as ``"2GiB"``, ``"512 MiB"``
    or ``"1.5GB"``. A string without a unit is whole bytes (``"4096"``) or, with a decimal
    point, a fraction; ``"1.5"`` is neither and is refused, as are fractional bytes
    (``"1.5B"``)."""
    if isinstance(value, bool):
        raise TypeError("a memory size cannot be a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a memory size must be >= 0, got {value}")
        return value
    fraction = _size_fraction(value)
    if fraction is not None:
        if not capacity:
            raise ValueError("a fractional size needs the device's capacity, which is unknown")
        return int(fraction * capacity)
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"cannot parse memory size {value!r}: {_SIZE_HELP}")
        if _UNITS[unit] == 1 and "." in match.group(1):
            raise ValueError(f"memory size {value!r} is not whole bytes: {_SIZE_HELP}")
        number = match.group(1)
        if "." not in number:  # whole: exact, however long (a float of it could be inf)
            return int(number) * _UNITS[unit]
        amount = float(number) * _UNITS[unit]
        if amount == float("inf"):
            raise ValueError(f"memory size {value!r} is out of range")
        return int(amount)
    raise TypeError(
        f"a memory size must be an int, a float fraction or a string, got {type(value).__name__}"
    )


def set_memory_limit(device, limit):
    """Limits the bytes the device may reserve; ``None`` removes the limit.

    ``limit`` is bytes (int), a fraction of the device's capacity (float in (0, 1]) or a
    string with units (``"2GiB"``). An allocation that would pass it raises
    ``needle.OutOfMemoryError`` after the allocator has released its cache and run the
    garbage collector.
    """
    dev = _resolve(device)
    if not dev.enabled():
        raise _c.DeviceError(f"cannot set a memory limit on {dev!r}: it is not available")
    if limit is None:
        _c._set_memory_limit(dev._id, -1)
        return
    capacity = _c._memory_stats(dev._id)["device_capacity_bytes"]
    _c._set_memory_limit(dev._id, parse_size(limit, capacity))


def set_per_process_memory_fraction(fraction, device=None):
    """Limits what needle may reserve on ``device`` (None: the default device) to
    ``fraction`` of its capacity (a GPU's memory; the CPU's physical memory), as
    ``torch.cuda.set_per_process_memory_fraction`` does; ``None`` removes the limit.

    ``fraction`` is a number in (0, 1] (TypeError for another type, ValueError outside
    it); an unavailable device raises ``needle.DeviceError``. Beyond the limit allocations
    raise ``needle.OutOfMemoryError`` (see :func:`set_memory_limit`, which also takes
    sizes)."""
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
            raise TypeError(
                f"fraction must be a number in (0, 1] or None, got {type(fraction).__name__}"
            )
        if not 0.0 < float(fraction) <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        fraction = float(fraction)
    set_memory_limit(device, fraction)


def _host_available_bytes():
    """The host memory the kernel could still give a process: MemAvailable of /proc/meminfo
    (page cache that can be dropped included), or free pages where there is no such file."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 0


def mem_get_info(device=None):
    """``(free, total)`` bytes of ``device`` (None: the default device), as
    ``torch.cuda.mem_get_info`` returns them, for every device.

    With a memory limit (:func:`set_memory_limit`, :func:`set_per_process_memory_fraction`,
    ``NEEDLE_MEMORY_LIMIT``), ``total`` is the limit and ``free`` what needle may still
    reserve under it (the limit less :func:`memory_reserved`, and no more than the device
    has free): the budget a limited device emulates. Without one, the hardware's figures,
    which count every process: a GPU's are the driver's (``cudaMemGetInfo``), the CPU's
    are physical memory and the memory the kernel reports available. ``(0, 0)`` for a
    device this process cannot use.

    Unlike ``torch.cuda.mem_get_info``, which ignores the per-process fraction, a limit
    set here is what ``total`` reports."""
    dev = _resolve(device)
    if not dev.enabled():
        return (0, 0)
    if dev.name == "cuda":
        info = _c._cuda_mem_get_info(dev.index)
        if info is None:
            return (0, 0)
        free, total = info
    else:
        total = _c._memory_stats(dev._id)["device_capacity_bytes"]
        free = min(_host_available_bytes(), total)
    limit = get_memory_limit(dev)
    if limit is None:
        return (int(free), int(total))
    return (max(0, min(int(free), limit - memory_reserved(dev))), limit)


def get_memory_limit(device=None):
    """The device's limit in bytes, or None."""
    limit = memory_stats(device).get("memory_limit_bytes", -1)
    return None if limit < 0 else limit


def _format_bytes(n, exact=False):
    """``n`` bytes as a readable size: ``"12.34 MiB"`` (``"512 B"`` under 1 KiB), or with
    ``exact=True`` the exact count first: ``"8388608 bytes (8.00 MiB)"`` (``"512 bytes"``)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            short = f"{n / size:.2f} {unit}"
            return f"{n} bytes ({short})" if exact else short
    return f"{n} bytes" if exact else f"{n} B"


def _unusable_reason(dev):
    """Why this process cannot use ``dev``, a CUDA device."""
    if not _c._cuda_compiled():
        return "this needle was built without CUDA"
    if not _c.cuda(0).enabled():
        return f"no GPU can be used ({_c._cuda_init_error() or 'none was found'})"
    return f"{dev!r} is not one of this process's GPUs"


def _limits_from_environment():
    """Applies NEEDLE_MEMORY_LIMIT: one size for every device this process can use, or
    ``name=size`` pairs, each device named once. A pair for a device this process cannot use
    (a GPU on a build without CUDA or where none is found) has its size checked and applies to
    nothing, which a RuntimeWarning naming the variable says."""
    text = _environ.read("NEEDLE_MEMORY_LIMIT")
    if text is None:
        return
    try:
        if "=" in text:
            pairs, seen = [], {}
            for part in text.split(","):
                name, _, size = part.partition("=")
                dev = _resolve(name.strip())
                key = (dev.name, dev.index)
                if key in seen:
                    raise ValueError(f"{seen[key]!r} and {part.strip()!r} both limit {dev!r}")
                seen[key] = part.strip()
                pairs.append((dev, size.strip()))
            for dev, size in pairs:
                if dev.enabled():
                    set_memory_limit(dev, size)
                    continue
                parse_size(size, capacity=1)  # its form, though no capacity resolves it
                warnings.warn(
                    f"NEEDLE_MEMORY_LIMIT={text!r}: the limit on {dev!r} applies to nothing: "
                    f"{_unusable_reason(dev)}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        else:
            for dev in (_c.cpu(), _c.cpu_numpy(), _c.cuda()):
                if dev.enabled():
                    set_memory_limit(dev, text)
    except (ValueError, TypeError, OverflowError, _c.DeviceError) as err:
        raise _environ.invalid("NEEDLE_MEMORY_LIMIT", text, str(err)) from None
