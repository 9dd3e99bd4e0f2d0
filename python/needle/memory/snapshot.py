"""Memory snapshots in PyTorch's format, for ``torch.cuda._memory_viz`` and pytorch.org/memory_viz.

:func:`_record_memory_history` starts recording, :func:`_snapshot` returns the snapshot dict
and :func:`_dump_snapshot` pickles it, with ``torch.cuda.memory``'s names and arguments, for
every needle device (``needle.cuda.memory`` has the same functions for CUDA devices).

How needle's allocator maps onto PyTorch's segments and blocks: a segment is what the device's
allocator took from the system in one piece. On a GPU that is a ``cudaMalloc`` of the caching
allocator, split into blocks (``active_allocated`` or cached, ``inactive``), as in PyTorch. On
the CPU every buffer is a segment of its own (blocks of 2 MiB and more are rounded to 2 MiB and,
once freed, stay cached: ``inactive``). The ``requested_size`` of the allocated blocks adds up
to :func:`~needle.memory.memory_allocated` and the segments' ``total_size`` to
:func:`~needle.memory.memory_reserved`. A block the engine holds for itself (cuBLAS's workspace
on a GPU), reserved but not allocated, is ``active_allocated`` with ``requested_size`` 0 and a
frame ``<needle engine>``, so that these sums stay true.

Collections are in the trace too (:func:`~needle.memory.collection_history`): each one's start
is a ``"snapshot"`` entry, PyTorch's zero-size mark, which its viewer lists in the allocator's
state history and passes over in its timelines; the frees the collection caused follow it. The
entry's one frame says what the collection was (``<needle collection>``, the record's index as
the line, trigger, scope, time and what it freed as the name), and its ``collection`` key holds
the record as plain values (``device`` as a name such as ``"cuda:0"``, None for a process-wide
one), or None once the record has left collection_history's ring.
"""

import numbers
import os
import pickle
import sys

import needle_c as _c

from .collection_log import _rows as _collection_rows
from .stats import _format_bytes, _resolve

# The trace's actions (bit i of the skip mask is action i), PyTorch's names: the engine's
# events and "snapshot", the mark where a collection started.
_ACTIONS = _c._memory_history_actions()
_ENABLED = {None: 0, "state": 1, "all": 2}
_CONTEXT = {None: 0, "state": 1, "alloc": 2, "all": 3}
_STACKS = ("python", "all")
_ENGINE_FRAME = {"filename": "<needle engine>", "line": 0, "name": "engine workspace"}
_MAX_ENTRIES = 2**63 - 1

# Frames from needle's own files are left out of stacks="python" at the innermost end, so
# that a block's first frame is the line that asked for it.
_c._memory_history_prefix(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def _device(device):
    """The Device for ``device``; DeviceError when this process cannot use it."""
    dev = _resolve(device)
    if not dev.enabled():
        raise _c.DeviceError(f"device {dev!r} is not available: no memory history to record")
    return dev


def _choice(name, value, choices):
    if isinstance(value, bool) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def _record_memory_history(
    enabled="all",
    context="all",
    stacks="python",
    max_entries=sys.maxsize,
    device=None,
    clear_history=False,
    skip_actions=None,
):
    """Starts (or changes, or with ``enabled=None`` stops) recording the device's memory
    history, for :func:`_snapshot`.

    - ``enabled``: ``"all"`` keeps the frames of each live block and a trace of the
      allocator's events (``alloc``, ``free_requested``, ``free_completed``,
      ``segment_alloc``, ``segment_free``, ``oom``, and ``snapshot`` where a collection
      started); ``"state"`` only the frames; ``None``
      stops and drops what was recorded. ``True``/``False`` (PyTorch's older form) mean
      ``"all"``/``None``.
    - ``context``: which records get frames: ``None`` none, ``"state"`` live blocks,
      ``"alloc"`` also the trace's ``alloc`` and ``oom`` events; ``"all"`` is ``"alloc"``
      (a free may come while the garbage collector runs, where needle does not walk Python's
      frames, so frees never carry frames).
    - ``stacks``: ``"python"`` starts each stack at the innermost frame outside needle's
      package; ``"all"`` keeps needle's own frames too. At most 64 frames, innermost first.
    - ``max_entries``: the trace keeps the last ``max_entries`` events (a positive int).
    - ``device``: a needle device or name (None: ``cpu()``); each device records on its own.
    - ``clear_history``: drop the trace recorded so far.
    - ``skip_actions``: trace actions to leave out (PyTorch's names).

    Blocks allocated before recording started are in snapshots, without frames.
    """
    if isinstance(enabled, bool):
        enabled = "all" if enabled else None
    _choice("enabled", enabled, tuple(_ENABLED))
    _choice("context", context, tuple(_CONTEXT))
    _choice("stacks", stacks, _STACKS)
    if not isinstance(max_entries, numbers.Integral) or isinstance(max_entries, bool):
        raise TypeError(f"max_entries must be an int, got {type(max_entries).__name__}")
    if max_entries < 1:
        raise ValueError(f"max_entries must be at least 1, got {max_entries}")
    if not isinstance(clear_history, bool):
        raise TypeError(f"clear_history must be True or False, got {clear_history!r}")
    if skip_actions is None:
        skip_actions = ()
    if isinstance(skip_actions, str) or not hasattr(skip_actions, "__iter__"):
        raise TypeError(f"skip_actions must be a list of action names, got {skip_actions!r}")
    mask = 0
    for action in skip_actions:
        _choice("each of skip_actions", action, _ACTIONS)
        mask |= 1 << _ACTIONS.index(action)
    dev = _device(device)
    _c._memory_record_history(
        dev._id,
        _ENABLED[enabled],
        _CONTEXT[context],
        stacks == "all",
        min(int(max_entries), _MAX_ENTRIES),
        mask,
        clear_history,
    )


def _frames(raw, cache):
    """The frame dicts of a (filename, line, name) tuple; one list per stack, shared."""
    frames = cache.get(id(raw))
    if frames is None:
        frames = [{"filename": f, "line": line, "name": n} for f, line, n in raw]
        cache[id(raw)] = frames
    return frames


def _device_name(device):
    """A device as plain text for the pickle (``"cpu"``, ``"cuda:0"``), None for None."""
    if device is None:
        return None
    return f"{device.name}:{device.index}" if device.name == "cuda" else device.name


def _collection_entry(index, time_us, records):
    """The trace entry that marks the start of collection ``index`` (see the module's doc)."""
    record = records.get(index)
    if record is None:
        name = f"collection {index} (no longer in collection_history)"
        plain = None
    else:
        generation = "" if record["generation"] is None else f" (generation {record['generation']})"
        name = (
            f"collection {index}: {record['trigger']}, {record['scope']}{generation}, "
            f"{record['seconds'] * 1e3:.3f} ms, freed {_format_bytes(record['bytes_freed'])} "
            f"and {record['objects_freed']} objects"
        )
        plain = {key: value for key, value in record.items() if key != "wall_us"}
        plain["device"] = _device_name(record["device"])
    return {
        "action": "snapshot",
        "addr": 0,
        "size": 0,
        "stream": 0,
        "time_us": time_us,
        "frames": [{"filename": "<needle collection>", "line": index, "name": name}],
        "collection": plain,
    }


def _snapshot(device=None):
    """The device's memory in PyTorch's snapshot format (see ``torch.cuda.memory._snapshot``):

    ``{"segments": [segment], "device_traces": [[entry]]}``, where a segment is a dict with
    ``device``, ``address``, ``total_size``, ``allocated_size``, ``active_size``,
    ``requested_size``, ``stream`` (0), ``segment_type`` (``"small"`` or ``"large"``),
    ``segment_pool_id`` (``(0, 0)``: the cache; ``(id, 0)``: CUDA graph pool ``id``),
    ``is_expandable`` and ``blocks``, each block a dict with
    ``address``, ``size``, ``requested_size``, ``state`` (``"active_allocated"`` or
    ``"inactive"``) and ``frames`` (``[{"filename", "line", "name"}]``, innermost first;
    empty when the block was allocated while nothing was recorded). ``device_traces[i]`` is
    the trace of the device with index ``i`` (``cpu`` is 0, ``cuda:i`` is ``i``), oldest
    first, each entry a dict with ``action``, ``addr``, ``size``, ``stream``, ``time_us``
    and ``frames`` (and ``device_free`` for ``oom``; ``collection`` for ``snapshot``, the
    mark of a collection's start: see the module's doc). Segments are in address order.
    """
    dev = _device(device)
    blocks, trace = _c._memory_snapshot(dev._id)
    index = dev.index if dev.name == "cuda" else 0
    cache = {}
    segments = []
    by_address = {}
    for (
        seg_addr,
        seg_size,
        small,
        expandable,
        pool,
        addr,
        size,
        requested,
        state,
        engine,
        frames,
    ) in blocks:
        segment = by_address.get(seg_addr)
        if segment is None:
            segment = {
                "device": index,
                "address": seg_addr,
                "total_size": seg_size,
                "allocated_size": 0,
                "active_size": 0,
                "requested_size": 0,
                "stream": 0,
                "segment_type": "small" if small else "large",
                # PyTorch's MempoolId: (0, 0) the cache, (id, 0) a CUDA graph's pool.
                "segment_pool_id": (pool, 0),
                "is_expandable": expandable,
                "frames": [],
                "blocks": [],
            }
            by_address[seg_addr] = segment
            segments.append(segment)
        if engine:
            requested, block_frames = 0, [_ENGINE_FRAME]
        else:
            block_frames = _frames(frames, cache)
        if state == "active_allocated":
            segment["allocated_size"] += size
            segment["active_size"] += size
            segment["requested_size"] += requested
        segment["blocks"].append(
            {
                "address": addr,
                "size": size,
                "requested_size": requested,
                "state": state,
                "frames": block_frames,
            }
        )
    entries = []
    records = None
    for action, addr, size, time_us, device_free, frames in trace:
        if action == "snapshot":
            if records is None:
                records = {r["index"]: r for r in _collection_rows()}
            entries.append(_collection_entry(addr, time_us, records))
            continue
        entry = {
            "action": action,
            "addr": addr,
            "size": size,
            "stream": 0,
            "time_us": time_us,
            "frames": _frames(frames, cache),
        }
        if action == "oom":
            entry["device_free"] = device_free
        entries.append(entry)
    device_traces = [[] for _ in range(index + 1)]
    device_traces[index] = entries
    return {"segments": segments, "device_traces": device_traces}


def _record_peak(device=None):
    """Starts recording where ``device``'s allocated bytes peak from now on, for
    :func:`_peak`, and returns the history settings to give :func:`_restore_history` after.

    The peak record needs the frames of live blocks, so a history that is off (or records no
    frames) is raised to ``enabled="state"``, ``context="state"`` until restored; a history the
    caller records already keeps its settings and its trace. Costs one frame walk per
    allocation while on, as any recorded history does.
    """
    dev = _device(device)
    previous = _c._memory_history_settings(dev._id)
    enabled, context, all_frames, max_entries, skip = previous
    if enabled == _ENABLED[None] or context == _CONTEXT[None]:
        _c._memory_record_history(
            dev._id,
            max(enabled, _ENABLED["state"]),
            max(context, _CONTEXT["state"]),
            all_frames,
            max_entries,
            skip,
            False,
        )
    _c._memory_history_reset_peak(dev._id)
    return previous


def _restore_history(device, settings):
    """Gives ``device``'s history back the ``settings`` that :func:`_record_peak` returned: off
    again (its records dropped) when it was off."""
    dev = _device(device)
    if _c._memory_history_settings(dev._id) != settings:
        _c._memory_record_history(dev._id, *settings, False)


def _peak(device=None):
    """Where ``device``'s allocated bytes peaked since :func:`_record_peak`, or None when no
    allocation went past the bytes allocated then (or the history was turned off since).

    Returns ``{"bytes": allocated bytes at the peak, "frames": the frames of the allocation
    that reached it, "blocks": [{"bytes", "frames"}]}``: the blocks allocated since
    :func:`_record_peak` and live at the peak, in allocation order. Frames are
    ``{"filename", "line", "name"}`` dicts, innermost first, from the innermost one outside
    needle's package (empty when none were recorded).
    """
    dev = _device(device)
    if _c._memory_history_settings(dev._id)[0] == _ENABLED[None]:
        return None
    record = _c._memory_history_peak(dev._id)
    if record is None:
        return None
    nbytes, frames, blocks = record
    cache = {}
    return {
        "bytes": nbytes,
        "frames": _frames(frames, cache),
        "blocks": [
            {"bytes": size, "frames": _frames(block_frames, cache)}
            for _, size, block_frames in sorted(blocks, key=lambda block: block[0])
        ],
    }


def _dump_snapshot(filename="dump_snapshot.pickle", device=None):
    """Pickles :func:`_snapshot` of the device into ``filename``, the file PyTorch's
    ``_dump_snapshot`` writes and pytorch.org/memory_viz opens."""
    if not isinstance(filename, (str, bytes, os.PathLike)):
        raise TypeError(f"filename must be a path, got {type(filename).__name__}")
    snapshot = _snapshot(device)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)
