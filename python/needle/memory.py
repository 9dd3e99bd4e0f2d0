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

Diagnostics: :func:`live_tensors` and :func:`live_tensors_summary` list the tensors that
hold device memory, :func:`find_cycles` the reference cycles that hold it,
:func:`warn_on_cycles` warns when a collection frees such memory, :func:`record_history`
records where tensors are created, and :class:`MemoryMonitor` records a timeline. For
:func:`live_tensors`, :func:`live_tensors_summary` and :func:`find_cycles`, ``device=None``
means every device, not the default one.
"""
import collections
import gc
import os
import re
import warnings

import needle_c as _c

__all__ = [
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_stats", "reset_peak_memory_stats", "empty_cache", "set_memory_limit",
    "get_memory_limit", "memory_summary", "parse_size", "set_gc_policy", "get_gc_policy",
    "set_gc_visible", "gc_visible", "freeze_heap", "live_tensors", "live_tensors_summary", "find_cycles",
    "warn_on_cycles", "CycleWarning", "record_history", "MemoryMonitor",
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
    """A readable report of the device's memory, as one string: the statistics table, the
    largest groups of live tensors by op, the gc pressure policy and the collection
    statistics (num_pressure_collections, num_oom_collections, gc_seconds, gc_freed_bytes)."""
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
    lines.extend(_summary_diagnostics(dev, stats))
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


def freeze_heap():
    """Collects, then hides every object alive now from later collections (``gc.freeze()``);
    returns how many objects are frozen.

    A full collection's cost grows with every tracked object in the process: modules, NumPy,
    the model, a corpus' token lists. Called once after setup (model, optimizer and data
    built, before the first step), it leaves pressure collections only the objects training
    creates to scan: in ``bench/gc_cost.py`` a collection after a PTB step drops from ~9 ms to
    ~0.6 ms. The price: an object frozen now that later becomes part of cyclic garbage is not
    collected until ``gc.unfreeze()`` (objects without cycles are still freed by reference
    counting). Do not call it while a graph you will drop is alive (between a forward pass
    and the next step). needle's out-of-memory path unfreezes everything before it collects,
    so frozen cycles never cause an :class:`needle.OutOfMemoryError`; call this again after
    one to freeze anew.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _policy_from_environment():
    env = os.environ
    kwargs, sources = {}, {}
    if "NEEDLE_GC" in env:
        kwargs["enabled"] = env["NEEDLE_GC"].strip().lower() not in ("0", "false", "off", "no")
    for key, name in (("NEEDLE_GC_GROWTH", "growth"), ("NEEDLE_GC_HIGH_WATER", "high_water"),
                      ("NEEDLE_GC_MAX_FRACTION", "max_gc_fraction")):
        if key in env:
            try:
                kwargs[name] = float(env[key])
            except ValueError:
                raise ValueError(f"{key}={env[key]!r} is not a number") from None
            sources[name] = key
    if "NEEDLE_GC_MIN_GROWTH" in env:
        kwargs["min_growth"] = env["NEEDLE_GC_MIN_GROWTH"]
        sources["min_growth"] = "NEEDLE_GC_MIN_GROWTH"
    if env.get("NEEDLE_GC_WATERMARK", "").strip():
        kwargs["watermark"] = env["NEEDLE_GC_WATERMARK"].strip()
        sources["watermark"] = "NEEDLE_GC_WATERMARK"
    if kwargs:
        try:
            set_gc_policy(**kwargs)
        except (ValueError, TypeError) as err:
            names = ", ".join(f"{v}={env[v]!r}" for v in sources.values()) or "NEEDLE_GC"
            raise ValueError(f"needle gc policy from the environment ({names}): {err}") from None


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


# ---------------------------------------------------------------------------------------------
# Diagnostics: which tensors hold device memory, which cycles hold it, and when the collector
# frees it. Everything below reads state only; nothing here allocates device memory.
# ---------------------------------------------------------------------------------------------
# Frames inside the needle package are skipped when naming an allocation site, so that a site
# points at the user's line (``y = ndl.exp(x)``), not at ``ops_mathematic.py``.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_GROUP_KEYS = ("op", "shape", "site")
_LEAF = "(leaf)"
_NO_SITE = "(not recorded)"


def _user_site(obj):
    """``"file:line"`` of the innermost recorded frame outside the needle package, or None."""
    frames = getattr(obj, "_alloc_site", None)
    if not frames:
        return None
    for filename, lineno, _funcname in frames:
        if not os.path.abspath(filename).startswith(_PACKAGE_DIR):
            return f"{filename}:{lineno}"
    return None


def _arrays_of(value):
    """The NDArrays a Tensor (one) or TensorTuple (one per element) holds; [] when unrealized
    or cleared."""
    data = value.cached_data
    if data is None:
        return []
    if isinstance(data, (tuple, list)):
        return [a for a in data if isinstance(a, _c.NDArray)]
    return [data] if isinstance(data, _c.NDArray) else []


def _op_name(value):
    op = value.op
    return None if op is None else type(op).__name__


def _itemsize(array):
    # float32 is the only dtype; derive it anyway so a second dtype would not miscount.
    return array.nbytes // array.size if array.size else 4


def _describe(value, arrays):
    """A short description that never prints array data (a repr could be megabytes)."""
    kind = type(value).__name__
    op = _op_name(value) or _LEAF
    if isinstance(value, _c.TensorTuple):
        shape = tuple(a.shape for a in arrays)
    else:
        shape = arrays[0].shape if arrays else None
    device = repr(arrays[0].device) if arrays else "?"
    nbytes = sum(a.nbytes for a in arrays)
    return f"{kind}(op={op}, shape={shape}, device={device}, nbytes={nbytes})"


def _engine_filter(device):
    """None (every device), or the engine id to keep; -1 (nothing) for an unavailable one."""
    return None if device is None else _engine_id(device)


def _group_key(record, group_by):
    if group_by == "op":
        return record["op"] or _LEAF
    if group_by == "shape":
        return record["shape"]
    return record["site"] or _NO_SITE


def live_tensors(device=None, group_by="op"):
    """The live needle Tensors and TensorTuples (found through ``gc.get_objects()``; they are
    always tracked) whose data is on ``device`` (None: every device).

    Returns a list of dicts, largest first, one per object:

    - ``bytes``: the bytes of the object's view(s) (``nbytes``; for a TensorTuple the sum of
      its elements on the device);
    - ``storage_bytes``: the bytes of the whole storage(s) the view(s) keep alive
      (itemsize * ``_storage_size``). Views share storage and a storage's identity is not
      exposed, so shared storage is counted in every view that holds it: summing
      ``storage_bytes`` over views overstates, summing ``bytes`` understates a view of a
      larger buffer; ``memory_allocated`` is the exact total;
    - ``shape`` (a tuple of shapes for a TensorTuple), ``op`` (the creating op's type name,
      None for a leaf), ``requires_grad``, ``type`` ("Tensor"/"TensorTuple"), ``device``
      (its repr), ``id`` (``id()`` of the object, to find it in ``gc.get_objects()``);
    - ``site``: ``"file:line"`` of the innermost frame outside the needle package that
      created the object when history was recorded (:func:`record_history`), else None;
    - ``key``: the object's group under ``group_by`` ("op", "shape", "site"; None: no key),
      as used by :func:`live_tensors_summary`.

    Objects in unreachable cycles that the collector has not freed yet are live here too:
    they hold device memory until it runs.
    """
    if group_by is not None and group_by not in _GROUP_KEYS:
        raise ValueError(f"group_by must be one of {_GROUP_KEYS} or None, got {group_by!r}")
    engine_id = _engine_filter(device)
    records = []
    for obj in gc.get_objects():
        if not isinstance(obj, (_c.Tensor, _c.TensorTuple)):
            continue
        arrays = [a for a in _arrays_of(obj) if engine_id is None or a.device._id == engine_id]
        if not arrays:
            continue
        if isinstance(obj, _c.TensorTuple):
            shape = tuple(a.shape for a in arrays)
        else:
            shape = arrays[0].shape
        record = {
            "bytes": sum(a.nbytes for a in arrays),
            "storage_bytes": sum(_itemsize(a) * a._storage_size for a in arrays),
            "shape": shape,
            "op": _op_name(obj),
            "requires_grad": bool(obj.requires_grad),
            "site": _user_site(obj),
            "type": type(obj).__name__,
            "device": repr(arrays[0].device),
            "id": id(obj),
        }
        if group_by is not None:
            record["key"] = _group_key(record, group_by)
        records.append(record)
    records.sort(key=lambda r: r["bytes"], reverse=True)
    return records


def live_tensors_summary(device=None, group_by="op"):
    """The live tensors of :func:`live_tensors` grouped by ``"op"`` (leaves under
    ``"(leaf)"``), ``"shape"`` (a tuple) or ``"site"`` (``"file:line"``, or
    ``"(not recorded)"``).

    Returns a list of dicts ``{"key", "count", "bytes", "storage_bytes"}``, sorted by bytes,
    largest first; ``bytes`` sums the views' ``nbytes`` and ``storage_bytes`` the storages
    they keep alive (shared storage counted once per view, see :func:`live_tensors`).
    """
    if group_by not in _GROUP_KEYS:
        raise ValueError(f"group_by must be one of {_GROUP_KEYS}, got {group_by!r}")
    groups = {}
    for record in live_tensors(device, group_by):
        row = groups.setdefault(record["key"],
                                {"key": record["key"], "count": 0, "bytes": 0, "storage_bytes": 0})
        row["count"] += 1
        row["bytes"] += record["bytes"]
        row["storage_bytes"] += record["storage_bytes"]
    return sorted(groups.values(), key=lambda r: (-r["bytes"], -r["count"], str(r["key"])))


def _summary_diagnostics(dev, stats, top=10):
    """The lines memory_summary appends: live-tensor groups, gc policy, collection stats."""
    lines = []
    rows = live_tensors_summary(dev, "op")
    lines.append(f"live tensors by op (top {min(top, len(rows))} of {len(rows)} groups):")
    if rows:
        lines.append(f"  {'op':<24}{'count':>8}{'bytes':>14}{'storage':>14}")
        for row in rows[:top]:
            lines.append(f"  {str(row['key']):<24}{row['count']:>8}"
                         f"{_format_bytes(row['bytes']):>14}"
                         f"{_format_bytes(row['storage_bytes']):>14}")
    else:
        lines.append("  (none)")
    policy = get_gc_policy()
    watermark = policy["watermark"]
    lines.append(
        f"gc policy: {'enabled' if policy['enabled'] else 'disabled'}; "
        f"growth {policy['growth']:g}; min_growth {_format_bytes(policy['min_growth'])}; "
        f"high_water {policy['high_water']:g}; max_gc_fraction {policy['max_gc_fraction']:g}; "
        f"watermark {'computed' if watermark is None else _format_bytes(watermark)}; "
        f"gc visible: {gc_visible()}")
    lines.append(
        f"collections: pressure {stats.get('num_pressure_collections', 0)} "
        f"({stats.get('num_safe_point_collections', 0)} at safe points); "
        f"out-of-memory {stats.get('num_oom_collections', 0)}; "
        f"skipped {stats.get('num_pressure_skips', 0)}; "
        f"deferred {stats.get('num_pressure_deferrals', 0)}; "
        f"gc time {stats.get('gc_seconds', 0.0):.3f} s; "
        f"freed {_format_bytes(stats.get('gc_freed_bytes', 0))}")
    return lines


def _union_find_components(objects):
    """Connected components of ``objects`` under the reference edges among them
    (``gc.get_referents``, taken as undirected). Returns a list of lists of indices."""
    index = {id(obj): i for i, obj in enumerate(objects)}
    parent = list(range(len(objects)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, obj in enumerate(objects):
        for referent in gc.get_referents(obj):
            j = index.get(id(referent))
            if j is not None:
                a, b = find(i), find(j)
                if a != b:
                    parent[a] = b
    components = {}
    for i in range(len(objects)):
        components.setdefault(find(i), []).append(i)
    return list(components.values())


def _analyse_garbage(objects, engine_id):
    """Reports on the components of ``objects`` that hold needle tensors (on ``engine_id``,
    or any device when None), and the indices of the objects in those components."""
    reports, kept = [], []
    for component in _union_find_components(objects):
        values = [objects[i] for i in component
                  if isinstance(objects[i], (_c.Tensor, _c.TensorTuple))]
        if not values:
            continue
        seen_arrays = {}
        ops = collections.Counter()
        sites = collections.Counter()
        devices = set()
        # The example is the largest tensor, an op's output before a leaf of the same size:
        # the op names the step that made the cycle.
        largest, largest_rank = None, None
        for value in values:
            arrays = [a for a in _arrays_of(value)
                      if engine_id is None or a.device._id == engine_id]
            # A TensorTuple's arrays are its elements' arrays: count each array object once.
            for array in arrays:
                seen_arrays[id(array)] = array
                devices.add(repr(array.device))
            name = _op_name(value)
            rank = (sum(a.nbytes for a in arrays), name is not None)
            if largest_rank is None or rank > largest_rank:
                largest, largest_rank = value, rank
            if name is not None:
                ops[name] += 1
            site = _user_site(value)
            if site is not None:
                sites[site] += 1
        if engine_id is not None and not seen_arrays:
            continue
        kept.extend(component)
        reports.append({
            "tensors": len(values),
            "bytes": sum(a.nbytes for a in seen_arrays.values()),
            "storage_bytes": sum(_itemsize(a) * a._storage_size for a in seen_arrays.values()),
            "objects": len(component),
            "ops": ops,
            "sites": [site for site, _ in sites.most_common()],
            "devices": sorted(devices),
            "example": _describe(largest, _arrays_of(largest)),
        })
    reports.sort(key=lambda r: (r["bytes"], r["tensors"]), reverse=True)
    return reports, kept


# >0 while find_cycles frees what it found, so that warn_on_cycles does not report memory the
# user just asked to free.
_cycle_warning_suppressed = 0


def find_cycles(device=None, free=True):
    """Finds the cyclic garbage that holds needle tensors: runs a full collection with
    ``gc.DEBUG_SAVEALL`` (the previous debug flags are always restored), groups the objects it
    found into connected components by their references, and reports the components that
    contain tensors with data on ``device`` (None: every device).

    Returns a list of dicts, most bytes first: ``tensors`` (Tensor/TensorTuple objects),
    ``objects`` (all objects in the component), ``bytes`` (the tensors' data bytes,
    ``nbytes`` of each array object once; a broadcast view counts its full shape, so this can
    exceed what the storages hold), ``storage_bytes`` (the bytes of the storages behind those
    arrays, a storage shared by two views counted twice, see :func:`live_tensors`), ``ops``
    (a ``Counter`` of op type names), ``sites`` (allocation sites ``"file:line"``, most
    frequent first; empty unless :func:`record_history` was on when they were created),
    ``devices`` and ``example`` (a short description of the largest tensor).

    With ``free=True`` the garbage is then freed (one more collection, without
    ``DEBUG_SAVEALL``). With ``free=False`` the components that were reported are appended to
    ``gc.garbage`` for inspection (the caller removes them to free them) and the other garbage
    is freed. Entries already in ``gc.garbage`` are left alone either way.
    """
    global _cycle_warning_suppressed
    engine_id = _engine_filter(device)
    old_flags = gc.get_debug()
    start = len(gc.garbage)
    try:
        gc.set_debug(old_flags | gc.DEBUG_SAVEALL)
        gc.collect()
    finally:
        gc.set_debug(old_flags)
    saved = gc.garbage[start:]
    del gc.garbage[start:]
    reports = []
    try:
        reports, kept = _analyse_garbage(saved, engine_id)
        if not free:
            gc.garbage.extend(saved[i] for i in kept)
        del kept
    finally:
        # Drop the last references, then collect without DEBUG_SAVEALL (even if the caller
        # had it set) so the cycles are really freed.
        del saved
        _cycle_warning_suppressed += 1
        try:
            gc.set_debug(old_flags & ~gc.DEBUG_SAVEALL)
            gc.collect()
        finally:
            gc.set_debug(old_flags)
            _cycle_warning_suppressed -= 1
    return reports


class CycleWarning(ResourceWarning):
    """A garbage collection freed device memory that reference cycles held (see
    :func:`warn_on_cycles`). ``freed`` maps each device (its repr) to the bytes freed."""

    def __init__(self, message, freed=None):
        super().__init__(message)
        self.freed = dict(freed or {})


def _show_cycle_warnings():
    """Python ignores ResourceWarning by default, which would hide every CycleWarning from a
    user who just asked for them: unless a filter already decides what happens to
    CycleWarning (``-W error::ResourceWarning``, pytest's capture), show them."""
    for action, message, category, module, lineno in warnings.filters:
        if message is None and module is None and lineno == 0 and issubclass(CycleWarning,
                                                                              category):
            if action == "ignore":
                warnings.filterwarnings("default", category=CycleWarning)
            return


def _available_engine_ids():
    return [(dev._id, repr(dev)) for dev in (_c.cpu(), _c.cpu_numpy(), _c.cuda())
            if dev.enabled()]


_cycle_watch = {"devices": [], "before": None}


def _cycle_callback(phase, info):
    """The gc.callbacks observer of warn_on_cycles. It runs inside collections, including the
    ones the allocator starts under memory pressure, so it only reads counters and never
    raises."""
    try:
        if phase == "start":
            _cycle_watch["before"] = [(engine_id, name, _c._memory_allocated(engine_id))
                                      for engine_id, name in _cycle_watch["devices"]]
            return
        before, _cycle_watch["before"] = _cycle_watch["before"], None
        if before is None or _cycle_warning_suppressed:
            return
        freed = {}
        for engine_id, name, allocated in before:
            delta = allocated - _c._memory_allocated(engine_id)
            if delta > 0:
                freed[name] = delta
        if freed:
            amounts = ", ".join(f"{_format_bytes(n)} ({n} bytes) on {name}"
                                for name, n in freed.items())
            warnings.warn(CycleWarning(
                f"a garbage collection (generation {info.get('generation')}) freed "
                f"{amounts} of device memory that reference cycles held: tensors in cycles "
                "keep their memory until the collector runs. Use graph mode 'cycle_free' "
                "(needle.autograd.set_graph_mode('cycle_free'), the default) or break the "
                "cycles; needle.memory.find_cycles() shows where they are.", freed),
                stacklevel=2)
    except Exception:  # noqa: BLE001  (an error here would surface inside an unrelated op)
        pass


def warn_on_cycles(enabled=True):
    """Installs (``enabled=True``) or removes a ``gc.callbacks`` observer that emits a
    :class:`CycleWarning` whenever a collection frees device memory on any available device,
    that is, whenever reference cycles were holding it. Enabling also makes CycleWarning
    visible when only Python's default ``ignore::ResourceWarning`` filter would apply. The
    observer runs inside the collector and cannot raise there: a filter that turns the
    warning into an error drops it. Returns whether it was installed before."""
    was_installed = _cycle_callback in gc.callbacks
    if enabled:
        _show_cycle_warnings()
        _cycle_watch["devices"] = _available_engine_ids()
        if not was_installed:
            gc.callbacks.append(_cycle_callback)
    else:
        while _cycle_callback in gc.callbacks:
            gc.callbacks.remove(_cycle_callback)
        _cycle_watch["before"] = None
    return was_installed


class _HistoryRecording:
    """The switch returned by :func:`record_history`; a context manager that restores the
    previous setting on exit."""

    def __init__(self, enabled):
        self.enabled = bool(enabled)
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


# At the end: memory_monitor imports from this module, which is complete by now.
from .memory_monitor import MemoryMonitor  # noqa: E402
