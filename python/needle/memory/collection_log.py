"""needle.memory.collection_log: :func:`collection_history`, the record of every collection.

The records are kept by needle_c (needle_c/memory/collection_log.c) where the collections run:
the collection runner (pressure, safe points, the out-of-memory ladder, aligned collections),
``needle.memory.collect()`` and the gc.callbacks observer that sees the user's ``gc.collect()``.
This module turns them into dicts; the snapshot's trace (:mod:`.snapshot`), MemoryMonitor's
plot (:mod:`.monitor`) and memory_summary's pause histogram (:mod:`.summary`) read them here.
"""

import needle_c as _c

from .stats import _flag, _resolve

#: How many records the ring keeps (the latest; ``index`` keeps counting past it).
CAPACITY = _c._collection_log_capacity()

_KEYS = (
    "index",
    "device",
    "trigger",
    "scope",
    "generation",
    "start",
    "seconds",
    "bytes_freed",
    "objects_freed",
)


def _device_of(engine_id):
    """The Device with needle_c's id ``engine_id``; None for -1 (the whole process)."""
    if engine_id < 0:
        return None
    for dev in (_c.cpu(), _c.cpu_numpy()):
        if dev._id == engine_id:
            return dev
    for index in range(_c._engine_device_count()):
        dev = _c.cuda(index)
        if dev._id == engine_id:
            return dev
    return None


def _rows(engine_id=-1, clear=False):
    """needle_c's records as dicts, oldest first, each with ``wall_us`` (the wall clock's
    microseconds at its start, the memory history's clock) besides the public keys."""
    records = []
    for row in _c._collection_history(engine_id, clear):
        record = dict(zip(_KEYS, row[:9]))
        record["device"] = _device_of(row[1])
        record["wall_us"] = row[9]
        records.append(record)
    return records


def collection_history(device=None, clear=False):
    """The collections needle recorded, oldest first, as a list of dicts:

    - ``index``: a running number (it keeps counting when records drop out of the ring or are
      cleared);
    - ``device``: the device whose allocation, out-of-memory error or agreed collection
      started it, or None for a collection of the whole process (the user's, an aligned one
      that ran only a Python generation);
    - ``trigger``: ``"pressure"`` (an allocation passed the device's trigger),
      ``"safe_point"`` (``reset_grad()``/``backward()`` with allocations past it), ``"oom"``
      (the out-of-memory ladder), ``"aligned"`` (agreed across ranks,
      :mod:`needle.memory.alignment`) or ``"user"`` (``gc.collect()``,
      :func:`needle.memory.collect`);
    - ``scope``: ``"scoped"`` (needle's scoped collection alone) or ``"full"`` (the ladder
      reached a full collection, or Python's ``gc.collect``), and ``generation``: the Python
      generation the full collection collected (None for scoped ones);
    - ``start``: when it started, in seconds on ``time.monotonic()``'s clock; ``seconds``: how
      long it took;
    - ``bytes_freed``: allocated bytes that dropped while it ran, on ``device`` (for a
      process-wide one, summed over the devices); ``objects_freed``: the objects it freed
      (what the scoped collection cleared plus what ``gc.collect`` reports collected).

    ``device=None`` gives every record; a device gives that device's and the process-wide ones
    (they paused it too); a device this process cannot use gives ``[]``. ``clear=True``
    forgets the records returned. The ring keeps the latest :data:`CAPACITY` (1024) records.

    One record per outermost collection: a collection that starts while one is being recorded
    (the ``gc.collect()`` of needle's own ladder, one run from a finalizer) is part of it.
    Python's collections are seen through ``gc.callbacks``, which cannot tell a
    ``gc.collect()`` from Python's automatic collections: those of the oldest generation (what
    ``gc.collect()`` collects) are recorded as the user's, younger ones (Python's frequent
    automatic collections, and ``gc.collect(0)``/``gc.collect(1)``) are not.
    """
    _flag("clear", clear)
    if device is None:
        engine_id = -1
    else:
        dev = _resolve(device)
        if not dev.enabled():
            return []
        engine_id = dev._id
    return [{key: record[key] for key in _KEYS} for record in _rows(engine_id, clear)]
