"""needle.memory.alloc_conf: the caching allocators' settings, PyTorch's
``PYTORCH_ALLOC_CONF`` options under needle's names: ``set_allocator_settings``,
``get_allocator_settings`` and ``NEEDLE_ALLOC_CONF`` (applied when :mod:`needle.memory` is
imported).

A settings string is comma-separated ``option:value`` items, each optionally prefixed by the
kind of device it is for: ``max_split_size_mb:128,cuda:garbage_collection_threshold:0.8``.
An item without a prefix applies to every device kind the option means something on; one
with ``cpu:`` to the host devices, one with ``cuda:`` to every GPU. An option may be set once
per device kind: ``max_split_size_mb:128,cuda:max_split_size_mb:256`` is refused (a ValueError),
not read last-wins as PyTorch does. Options named are changed, the others kept (as
``torch.cuda.memory._set_allocator_settings`` does). The engine applies them (csrc/allocator.c,
csrc/cpu/cpu_memory.c, csrc/cuda/cuda_allocator.cu).
"""

import needle_c as _c

from .. import _environ

_MiB = 2**20
# PyTorch refuses max_split_size_mb at or under its kLargeBuffer (20 MiB): an oversize block
# may serve a request up to that much smaller than itself (the engine's ND_OVERSIZE_SLACK).
_MIN_SPLIT_MB = 20
_KINDS = ("cpu", "cuda")
_OPTIONS = ("max_split_size_mb", "garbage_collection_threshold", "expandable_segments")
# PyTorch's options that needle's allocators have nothing for.
_UNSUPPORTED = (
    "roundup_power2_divisions",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "backend",
)
# The engine keeps a block size in an int64_t: max_split_size_mb's bytes must fit in one.
_MAX_SPLIT_MB = (2**63 - 1) // _MiB


def _parse_value(option, text):
    """The engine's value of one option: bytes for max_split_size_mb (0: none), a share for
    garbage_collection_threshold (0.0: off), a bool for expandable_segments."""
    if option == "expandable_segments":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"expandable_segments must be True or False, got {text!r}")
        return text.lower() == "true"
    if text.lower() == "none":
        return 0 if option == "max_split_size_mb" else 0.0
    if option == "max_split_size_mb":
        if not text.isdigit() or not _MIN_SPLIT_MB < int(text) <= _MAX_SPLIT_MB:
            raise ValueError(
                f"max_split_size_mb must be a whole number of MiB above {_MIN_SPLIT_MB} "
                f"(PyTorch's bound) and at most {_MAX_SPLIT_MB}, or None, got {text!r}"
            )
        return int(text) * _MiB
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0.0 < share < 1.0:
        raise ValueError(
            f"garbage_collection_threshold must be a number in (0, 1) or None, got {text!r}"
        )
    return share


def parse_allocator_settings(settings):
    """``[(kinds, option, value), ...]`` for a settings string (the grammar of the module's
    docstring), every item checked; TypeError for a non-string, ValueError naming the item
    for a bad one."""
    if not isinstance(settings, str):
        raise TypeError(f"allocator settings must be a string, got {type(settings).__name__}")
    parsed, seen = [], {}
    for item in settings.split(","):
        parts = [part.strip() for part in item.split(":")]
        kinds = None
        if len(parts) == 3 and parts[0] in _KINDS:
            kinds = (parts[0],)
            parts = parts[1:]
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"allocator setting {item.strip()!r} is not [cpu:|cuda:]option:value")
        option, text = parts
        if option in _UNSUPPORTED:
            raise ValueError(f"PyTorch's allocator option {option!r} is not supported by needle")
        if option not in _OPTIONS:
            raise ValueError(f"unknown allocator option {option!r}: expected one of {_OPTIONS}")
        value = _parse_value(option, text)
        if option == "expandable_segments":
            if kinds == ("cpu",) and value:
                raise ValueError(
                    "cpu:expandable_segments:True: host blocks are never split, so a segment "
                    "has nothing to grow for; expandable_segments is a cuda setting"
                )
            if value and not _c._cuda_compiled():
                # Also without a GPU at hand: a setting this build cannot honour is an error
                # where it is written, not when a GPU appears.
                raise ValueError(
                    "expandable_segments:True needs needle's CUDA backend, which this build "
                    "does not have (a CPU-only build: host blocks are never split, so there "
                    "is no segment to grow in place)"
                )
            kinds = kinds or ("cuda",)  # PyTorch's CUDA option; the CPU has no such segments
        parsed.append((kinds or _KINDS, option, value, item.strip()))
    # Each option once per device kind (a second one would silently win), checked once every
    # item is known good, so that a malformed item is reported as such.
    for kinds, option, _, item in parsed:
        for kind in kinds:
            if (kind, option) in seen:
                raise ValueError(
                    f"allocator settings {seen[kind, option]!r} and {item!r} both set {option} "
                    f"for {kind} devices"
                )
            seen[kind, option] = item
    return [entry[:3] for entry in parsed]


def _devices(kind):
    """The devices of a kind this process can use."""
    if kind == "cpu":
        candidates = [_c.cpu(), _c.cpu_numpy()]
    else:
        candidates = [_c.cuda(i) for i in range(_c.MAX_CUDA_DEVICES)]
    return [dev for dev in candidates if dev.enabled()]


def set_allocator_settings(settings):
    """Changes the caching allocators' settings, as ``torch.cuda.memory._set_allocator_settings``
    does (``settings`` in ``NEEDLE_ALLOC_CONF``'s grammar, e.g.
    ``"max_split_size_mb:128,garbage_collection_threshold:0.8"``):

    - ``max_split_size_mb``: cached blocks of this size or more are never split, serve no
      smaller request, and serve a larger one only when they exceed it by less than 20 MiB
      (PyTorch's rule), so large blocks do not fragment; ``None`` (the default) lifts it. The
      CPU's cache never splits blocks and reuses one only for its exact rounded size, so there
      the setting changes only which allocations and segments the statistics count as
      ``oversize_*``.
    - ``garbage_collection_threshold``: before reserved memory would pass this share of the
      budget (the device's memory limit, else its capacity), the cached free blocks are given
      back (all of them, where PyTorch frees the oldest first); ``None`` (the default) is off.
    - ``expandable_segments``: a cuda setting. True: large blocks come from one address range
      per GPU that is given memory page by page (the driver's virtual memory calls) as it is
      needed and gives back the whole pages of free blocks when the cache is released, so a
      changing batch shape grows a free block in place instead of making a new segment.
      Refused (ValueError, with the reason) for ``cpu:``, by a build without the CUDA
      backend, and for a GPU whose driver lacks the calls. It may change while memory is
      held: turned off, the blocks already carved from the range stay in use and the range is
      given back once a release leaves nothing mapped in it.

    Every item is checked before any device changes; a refused value changes nothing."""
    parsed = parse_allocator_settings(settings)
    wanted = {}
    for kinds, option, value in parsed:
        for kind in kinds:
            for dev in _devices(kind):
                if dev._id not in wanted:
                    wanted[dev._id] = list(_c._get_allocator_settings(dev._id))
                wanted[dev._id][_OPTIONS.index(option)] = value
    applied = []
    try:
        for engine_id, values in wanted.items():
            previous = _c._get_allocator_settings(engine_id)
            _c._set_allocator_settings(engine_id, *values)
            applied.append((engine_id, previous))
    except ValueError:
        for engine_id, previous in applied:
            _c._set_allocator_settings(engine_id, *previous)
        raise


def get_allocator_settings(device=None):
    """The settings of ``device``'s allocator (None: the default device) as a dict:
    ``max_split_size_mb`` (an int, or None), ``garbage_collection_threshold`` (a float, or
    None) and ``expandable_segments`` (a bool). ``needle.DeviceError`` for a device this
    process cannot use."""
    dev = _c._device(device)
    if not dev.enabled():
        raise _c.DeviceError(f"{dev!r} is not available: it has no allocator settings")
    max_split, threshold, expandable = _c._get_allocator_settings(dev._id)
    return {
        "max_split_size_mb": max_split // _MiB if max_split > 0 else None,
        "garbage_collection_threshold": threshold if threshold > 0.0 else None,
        "expandable_segments": expandable,
    }


def _settings_from_environment():
    """Applies NEEDLE_ALLOC_CONF; a value needle cannot use is a ValueError naming it."""
    text = _environ.read("NEEDLE_ALLOC_CONF")
    if text is None:
        return
    try:
        set_allocator_settings(text)
    except ValueError as err:
        raise _environ.invalid("NEEDLE_ALLOC_CONF", text, str(err)) from None
