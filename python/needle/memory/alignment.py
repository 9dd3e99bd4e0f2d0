"""needle.memory.alignment: collections at the same step on every rank of a process group.

In data-parallel training every step ends in a gradient all-reduce that waits for the slowest
rank: a collection on one rank stalls all of them, and independent collectors add their stalls
up. With alignment on (``DistributedDataParallel(..., aligned=True)`` turns it on), needle's
pressure policy records that a rank *wants* a collection instead of running it
(docs/design.md, "The collection policy"; needle_c/memory/alignment.c), Python's automatic
collector is switched off and its generations are asked for the same way, and the wants travel
beside the gradients in the all-reduce (:func:`local_wants` before it, :func:`agreed` after it:
no extra round trip). When any rank wanted one, every rank collects right after that
all-reduce, inside :func:`agreed`: the same point of the same step on every rank, before the
next forward pass. A want of Python's generations alone collects that generation only; needle's
want runs the pressure ladder. The out-of-memory path stays local.

The flags (float32, summed by the all-reduce): ``[needle, gen0, gen1, gen2, seconds per rank]``;
a flag > 0 after the sum means some rank wanted it; each rank writes the seconds its last aligned
collections took into its own slot, so that every rank learns all of them and can count the wait
alignment saved: independent collections make the others wait for each one in turn (the sum),
aligned ones for the slowest (the max).
"""

import gc
import sys
import threading

import numpy as np

import needle_c as _c

# The flags before the per-rank seconds: needle's pressure want, then Python's generations.
_NEEDLE, _GENERATIONS = 0, (1, 2, 3)
NUM_FLAGS = 4

_lock = threading.Lock()
_state = {
    "enabled": False,
    "took_over_gc": False,  # we disabled Python's automatic collector (and restore it)
    "long_lived": 0,  # objects in the oldest generation after its last collection
    "recount_long_lived": False,
    "count2_checked": -1,  # the oldest generation's count at the last long-lived check
    "rounds": 0,
    "agreed": 0,
    "generation_collections": [0, 0, 0],
    "wait_saved_seconds": 0.0,
    "collection_seconds": 0.0,
}


def _collector_unsupported(version=None, threshold=None):
    """Why this interpreter's collector is not the one :func:`_python_generation_due` copies
    (three generations, each past its threshold, the oldest also by a quarter of its
    long-lived objects: CPython 3.11-3.13 and 3.14.5 on), or None when it is. 3.14.0-3.14.4
    collect the old objects incrementally in two generations, where ``gc.collect(1)`` is one
    increment: aligned collections of Python's generations would mean something else there."""
    version = sys.version_info[:3] if version is None else tuple(version)
    threshold = gc.get_threshold() if threshold is None else tuple(threshold)
    if (3, 14, 0) <= version < (3, 14, 5):
        where = ".".join(map(str, version))
        return f"Python {where}'s incremental collector (3.14.0-3.14.4) has two generations"
    if len(threshold) != 3:
        return f"this collector has {len(threshold)} generation thresholds, not 3"
    return None


def enable(on=True):
    """Turns aligned collections on or off for this process; returns the previous setting.

    On: soft collections become wants, and Python's automatic collector is disabled (when it
    was enabled: it is enabled again when alignment is turned off) so that its generations run
    only where every rank agreed. A process that had called ``gc.disable()`` keeps Python's
    generations off; needle's own wants are still aligned. Raises RuntimeError when turned on
    under a collector whose generations differ from CPython 3.11-3.13's."""
    if not isinstance(on, bool):
        raise TypeError(f"on must be True or False, got {type(on).__name__} {on!r}")
    why = _collector_unsupported() if on else None
    if why is not None:
        raise RuntimeError(f"aligned collections are not supported: {why}")
    with _lock:
        previous = _state["enabled"]
        if on == previous:
            return previous
        _c._set_collection_alignment(on)
        _state["enabled"] = on
        if on:
            _state["took_over_gc"] = gc.isenabled()
            if _state["took_over_gc"]:
                gc.disable()
                _state["long_lived"] = len(gc.get_objects(generation=2))
        elif _state["took_over_gc"]:
            _state["took_over_gc"] = False
            gc.enable()
        return previous


def enabled():
    """Whether aligned collections are on."""
    return _state["enabled"]


def num_wants(world_size):
    """The length of the flag vector for ``world_size`` ranks."""
    _check_group(0, world_size)
    return NUM_FLAGS + world_size


def _check_group(rank, world_size):
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")


def _python_generation_due():
    """The oldest generation Python's own rules would collect now (-1: none), as CPython's
    automatic collector decides it: a generation's count past its threshold, and for the oldest
    one also more than a quarter of its long-lived objects new since its last collection."""
    if _state["recount_long_lived"]:
        _state["long_lived"] = len(gc.get_objects(generation=2))
        _state["recount_long_lived"] = False
    counts, thresholds = gc.get_count(), gc.get_threshold()
    due = -1
    for generation in range(3):
        if thresholds[generation] <= 0 or counts[generation] <= thresholds[generation]:
            break
        if generation == 2:
            # Counting the oldest generation is linear in it: once per change of its count.
            if counts[2] == _state["count2_checked"]:
                break
            _state["count2_checked"] = counts[2]
            pending = len(gc.get_objects(generation=2)) - _state["long_lived"]
            if pending * 4 <= _state["long_lived"]:
                break
        due = generation
    return due


def local_wants(rank=0, world_size=1):
    """This rank's flags for the all-reduce (float32, length ``num_wants(world_size)``): all
    zero when alignment is off. Call once per all-reduce round."""
    _check_group(rank, world_size)
    flags = np.zeros(NUM_FLAGS + world_size, dtype=np.float32)
    if not _state["enabled"]:
        return flags
    wanted, seconds = _c._collection_wants()
    flags[_NEEDLE] = 1.0 if wanted else 0.0
    if _state["took_over_gc"]:
        due = _python_generation_due()
        for generation in range(due + 1):
            flags[_GENERATIONS[generation]] = 1.0
    flags[NUM_FLAGS + rank] = seconds
    _state["collection_seconds"] += seconds
    return flags


def agreed(summed):
    """After the all-reduce (a sum over ranks) of :func:`local_wants`: runs the aligned
    collection now when any rank wanted one (needle's ladder when a rank's pressure asked for
    it, then the oldest Python generation any rank had due). Every rank must call it, at the
    same point, with the same flags. Returns whether a collection ran."""
    summed = np.asarray(summed, dtype=np.float64).reshape(-1)
    if summed.size <= NUM_FLAGS:
        raise ValueError(
            f"expected at least {NUM_FLAGS + 1} flags (local_wants()'s length), got {summed.size}"
        )
    if not np.all(np.isfinite(summed)) or np.any(summed < 0):
        raise ValueError("the flags must be finite and non-negative (a sum of local_wants())")
    _state["rounds"] += 1
    seconds = summed[NUM_FLAGS:]
    if seconds.size > 1:
        _state["wait_saved_seconds"] += float(seconds.sum() - seconds.max())
    if not _state["enabled"]:
        return False
    generation = -1
    for g, index in enumerate(_GENERATIONS):
        if summed[index] > 0:
            generation = g
    if summed[_NEEDLE] <= 0 and generation < 0:
        return False
    _state["agreed"] += 1
    _c._run_aligned_collection(bool(summed[_NEEDLE] > 0), generation)
    if generation >= 0:
        _state["generation_collections"][generation] += 1
        _state["recount_long_lived"] = generation == 2
    return True


def stats():
    """This process's alignment figures: ``enabled``, ``rounds`` (all-reduce rounds that
    carried flags), ``collections_agreed`` (aligned collections run), ``generation_collections``
    (of which with Python generation 0, 1, 2), ``collection_seconds`` (this rank's time in
    them) and ``wait_saved_seconds`` (the sum minus the max of every rank's time in them:
    what independent collections would have added to the all-reduce waits). Per-device
    figures (wants, rounds waited, collections) are in ``memory_stats()``."""
    return {
        "enabled": _state["enabled"],
        "rounds": _state["rounds"],
        "collections_agreed": _state["agreed"],
        "generation_collections": tuple(_state["generation_collections"]),
        "collection_seconds": _state["collection_seconds"],
        "wait_saved_seconds": _state["wait_saved_seconds"],
    }


def reset_stats():
    """Zeroes :func:`stats`' counters."""
    _state.update(
        rounds=0,
        agreed=0,
        generation_collections=[0, 0, 0],
        wait_saved_seconds=0.0,
        collection_seconds=0.0,
    )
