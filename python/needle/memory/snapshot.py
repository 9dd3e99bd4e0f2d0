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
"""

import numbers
import os
import pickle
import sys

import needle_c as _c

from .stats import _resolve

# The engine's trace actions (bit i of the skip mask is action i), and PyTorch's one more:
# needle records no "snapshot" events, so skipping them changes nothing.
_ACTIONS = _c._memory_history_actions()
_SKIPPABLE = _ACTIONS + ("snapshot",)
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
      ``segment_alloc``, ``segment_free``, ``oom``); ``"state"`` only the frames; ``None``
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
        _choice("each of skip_actions", action, _SKIPPABLE)
        if action in _ACTIONS:
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


def _snapshot(device=None):
    """The device's memory in PyTorch's snapshot format (see ``torch.cuda.memory._snapshot``):

    ``{"segments": [segment], "device_traces": [[entry]]}``, where a segment is a dict with
    ``device``, ``address``, ``total_size``, ``allocated_size``, ``active_size``,
    ``requested_size``, ``stream`` (0), ``segment_type`` (``"small"`` or ``"large"``),
    ``segment_pool_id``, ``is_expandable`` and ``blocks``, each block a dict with
    ``address``, ``size``, ``requested_size``, ``state`` (``"active_allocated"`` or
    ``"inactive"``) and ``frames`` (``[{"filename", "line", "name"}]``, innermost first;
    empty when the block was allocated while nothing was recorded). ``device_traces[i]`` is
    the trace of the device with index ``i`` (``cpu`` is 0, ``cuda:i`` is ``i``), oldest
    first, each entry a dict with ``action``, ``addr``, ``size``, ``stream``, ``time_us``
    and ``frames`` (and ``device_free`` for ``oom``). Segments are in address order.
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
                "segment_pool_id": (0, 0),
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
    for action, addr, size, time_us, device_free, frames in trace:
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
