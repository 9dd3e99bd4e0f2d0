"""Device-memory statistics and limits, named after ``torch.cuda``'s.

Every function takes ``device=None`` (the default device, ``cpu()``), a
needle device, or a name such as ``"cpu"``, ``"cpu_numpy"``, ``"cuda"`` or
``"cuda:1"``, and counts bytes. ``memory_stats()`` is the source of truth;
the other getters are views of it.

On the CPU a limit emulates a GPU's capacity, so that running out of memory
(and not running out) can be tested on a machine without a GPU. The
environment variable ``NEEDLE_MEMORY_LIMIT`` sets limits at import: either
one size for every device (``"2GiB"``) or per device
(``"cpu=1GiB,cuda=8GiB"``).
"""
import os
import re

import needle_c as _c

__all__ = [
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_stats", "reset_peak_memory_stats", "empty_cache", "set_memory_limit",
    "get_memory_limit", "memory_summary", "parse_size", "set_gc_policy", "get_gc_policy",
    "set_gc_visible", "gc_visible",
]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def _resolve(device):
    """The Device object for ``device`` (None, a Device, or a name)."""
    if device is None:
        return _c.cpu()
    if isinstance(device, _c.Device):
        return device
    if isinstance(device, str):
        name, _, index = device.partition(":")
        if name == "cpu" and not index:
            return _c.cpu()
        if name == "cpu_numpy" and not index:
            return _c.cpu_numpy()
        if name == "cuda":
            if index and not index.isdigit():
                raise ValueError(f"invalid device string {device!r}")
            return _c.cuda(int(index) if index else 0)
        raise ValueError(f"unknown device {device!r} (expected cpu, cpu_numpy or cuda[:N])")
    raise TypeError(f"expected a needle device or a device name, got {type(device).__name__}")


def _engine_id(device):
    """The engine's id for ``device``, or -1 when this process cannot use it."""
    dev = _resolve(device)
    return dev._id if dev.enabled() else -1


def memory_stats(device=None):
    """A flat dict of the device's allocator statistics (bytes and counts).

    Keys follow ``torch.cuda.memory_stats``: ``allocated_bytes.all.current``,
    ``.peak``, ``.allocated`` (cumulative), ``.freed`` (cumulative); the same for
    ``reserved_bytes``; ``allocation.all.*`` counts live and cumulative blocks;
    ``num_alloc_retries``, ``num_ooms``; ``memory_limit_bytes`` (-1: none);
    ``num_collect_calls`` and ``collect_freed_bytes`` (collections the allocator
    asked for). An unavailable device gives ``{}``.
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
    """Bytes obtained from the device, cache included (equal to allocated on the CPU)."""
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


def parse_size(value, capacity=None):
    """Bytes for a size: an int, a fraction of ``capacity`` (a float in (0, 1]), or a
    string such as ``"2GiB"``, ``"512 MiB"``, ``"1.5GB"``, ``"4096"`` or ``"50%"``."""
    if isinstance(value, bool):
        raise TypeError("a memory size cannot be a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a memory size must be >= 0, got {value}")
        return value
    if isinstance(value, float):
        if not (0.0 < value <= 1.0):
            raise ValueError(f"a fractional memory size must be in (0, 1], got {value}")
        if not capacity:
            raise ValueError("a fractional size needs the device's capacity, which is unknown")
        return int(value * capacity)
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("%"):
            try:
                percent = float(text[:-1])
            except ValueError:
                raise ValueError(f"cannot parse memory size {value!r}") from None
            return parse_size(percent / 100.0, capacity)
        match = _SIZE_RE.match(text)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"cannot parse memory size {value!r} (use e.g. '2GiB', '512MiB', '1.5GB', '4096')")
        return int(float(match.group(1)) * _UNITS[unit])
    raise TypeError(f"a memory size must be an int, a float fraction or a string, "
                    f"got {type(value).__name__}")


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


def get_memory_limit(device=None):
    """The device's limit in bytes, or None."""
    limit = memory_stats(device).get("memory_limit_bytes", -1)
    return None if limit < 0 else limit


def _format_bytes(n):
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def memory_summary(device=None):
    """A readable table of the device's memory statistics."""
    dev = _resolve(device)
    stats = memory_stats(dev)
    if not stats:
        return f"{dev!r}: not available\n"
    rows = [
        ("allocated", "allocated_bytes.all"),
        ("reserved", "reserved_bytes.all"),
    ]
    lines = [f"needle memory summary for {dev!r}",
             f"{'':<12}{'current':>14}{'peak':>14}{'total alloc':>14}{'total freed':>14}"]
    for label, key in rows:
        lines.append(f"{label:<12}" + "".join(
            f"{_format_bytes(stats[f'{key}.{field}']):>14}"
            for field in ("current", "peak", "allocated", "freed")))
    lines.append(f"{'blocks':<12}" + "".join(
        f"{stats[f'allocation.all.{field}']:>14}" for field in ("current", "peak", "allocated", "freed")))
    limit = stats["memory_limit_bytes"]
    lines.append(f"limit: {'none' if limit < 0 else _format_bytes(limit)}; "
                 f"OOMs: {stats['num_ooms']}; retries: {stats['num_alloc_retries']}; "
                 f"collections asked for: {stats['num_collect_calls']} "
                 f"(freed {_format_bytes(stats['collect_freed_bytes'])})")
    return "\n".join(lines) + "\n"


def set_gc_policy(enabled=None, growth=None, min_growth=None, high_water=None,
                  max_gc_fraction=None, watermark=...):
    """Configures when device-memory pressure runs Python's collector; omitted values keep
    their current setting.

    - ``enabled``: False switches pressure and out-of-memory collections off (the course's
      behaviour, which leaks cyclic garbage until Python's own collector gets to it).
    - ``growth`` (0.25) and ``min_growth`` (64 MiB, a size): collect before allocations pass
      ``max(survivors * (1 + growth), survivors + min_growth)``, where survivors is what was
      allocated after the last pressure collection...
    - ``high_water`` (0.8): ...capped at ``high_water * budget`` (the device limit, or a GPU's
      capacity; a CPU without a limit has no budget and no pressure collections).
    - ``max_gc_fraction`` (0.05): the collector's share of wall time (0.5 near the budget).
    - ``watermark``: a size (``"1.5GiB"``, bytes, or a fraction of the device limit) that
      replaces the computed trigger: collect when allocations pass it. ``None`` restores the
      computed trigger.
    """
    kwargs = {}
    if enabled is not None:
        kwargs["enabled"] = bool(enabled)
    for name, value in (("growth", growth), ("high_water", high_water),
                        ("max_gc_fraction", max_gc_fraction)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            kwargs[name] = float(value)
    if min_growth is not None:
        kwargs["min_growth"] = parse_size(min_growth)
    if watermark is not ...:
        if watermark is None:
            kwargs["watermark"] = -1
        else:
            limit = get_memory_limit()
            kwargs["watermark"] = parse_size(watermark, limit)
    _c._set_gc_policy(**kwargs)


def get_gc_policy():
    """The pressure policy: enabled, growth, min_growth, high_water, max_gc_fraction,
    watermark (None when computed)."""
    return _c._get_gc_policy()


def set_gc_visible(visible):
    """``False`` makes Tensor and Op traversal report nothing to the collector, emulating a C
    extension whose types the garbage collector cannot see: reference cycles through them
    then leak for good. For demonstrating that failure only. Returns the previous value."""
    return _c._set_gc_visible(bool(visible))


def gc_visible():
    """Whether the collector can traverse Tensors and Ops (see :func:`set_gc_visible`)."""
    previous = _c._set_gc_visible(True)
    _c._set_gc_visible(previous)
    return previous


def _policy_from_environment():
    env = os.environ
    kwargs = {}
    try:
        if "NEEDLE_GC" in env:
            kwargs["enabled"] = env["NEEDLE_GC"].strip().lower() not in ("0", "false", "off", "no")
        for key, name in (("NEEDLE_GC_GROWTH", "growth"), ("NEEDLE_GC_HIGH_WATER", "high_water"),
                          ("NEEDLE_GC_MAX_FRACTION", "max_gc_fraction")):
            if key in env:
                kwargs[name] = float(env[key])
        if "NEEDLE_GC_MIN_GROWTH" in env:
            kwargs["min_growth"] = env["NEEDLE_GC_MIN_GROWTH"]
        if env.get("NEEDLE_GC_WATERMARK", "").strip():
            kwargs["watermark"] = env["NEEDLE_GC_WATERMARK"].strip()
        if kwargs:
            set_gc_policy(**kwargs)
    except (ValueError, TypeError) as err:
        raise ValueError(f"needle gc policy from the environment: {err}") from None


def _limits_from_environment():
    text = os.environ.get("NEEDLE_MEMORY_LIMIT", "").strip()
    if not text:
        return
    try:
        if "=" in text:
            for part in text.split(","):
                name, _, size = part.partition("=")
                dev = _resolve(name.strip())
                if dev.enabled():
                    set_memory_limit(dev, size.strip())
        else:
            for dev in (_c.cpu(), _c.cpu_numpy(), _c.cuda()):
                if dev.enabled():
                    set_memory_limit(dev, text)
    except (ValueError, TypeError) as err:
        raise ValueError(f"NEEDLE_MEMORY_LIMIT={text!r}: {err}") from None


_limits_from_environment()
_policy_from_environment()
