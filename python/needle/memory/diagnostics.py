"""needle.memory.diagnostics: which tensors hold device memory, which reference cycles hold
it, and a warning when the collector frees such memory.

Everything here reads state only; nothing here allocates device memory. For
:func:`live_tensors`, :func:`live_tensors_summary` and :func:`find_cycles`, ``device=None``
means every device, not the default one.
"""

import collections
import gc
import os
import warnings
import weakref

import needle_c as _c

from .stats import _engine_id, _flag, _format_bytes

# Frames inside the needle package are skipped when naming an allocation site, so that a site
# points at the user's line (``y = ndl.exp(x)``), not at ``ops_mathematic.py``.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
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
    # The array's own element size: float16/bfloat16 are 2 bytes, float64 8.
    return array.itemsize


def _describe(value, arrays):
    """A short description that never prints array data (a repr could be megabytes)."""
    kind = type(value).__name__
    op = _op_name(value) or _LEAF
    if isinstance(value, _c.TensorTuple):
        shape = tuple(a.shape for a in arrays)
    else:
        shape = arrays[0].shape if arrays else None
    device = repr(arrays[0].device) if arrays else "?"
    dtype = arrays[0].dtype if len(arrays) == 1 else tuple(a.dtype for a in arrays)
    nbytes = sum(a.nbytes for a in arrays)
    return f"{kind}(op={op}, shape={shape}, dtype={dtype}, device={device}, nbytes={nbytes})"


def _engine_filter(device):
    """None (every device), or the engine id to keep; -1 (nothing) for an unavailable one."""
    return None if device is None else _engine_id(device)


_TENSOR_TYPES = (_c.Tensor, _c.TensorTuple)


class TensorSnapshot:
    """The needle Tensors and TensorTuples alive when it was taken, held by weak references
    so that it keeps none of them alive. Give it to :func:`live_tensors` (``since=``) to see
    only what was created after it and is still alive: what a test, a cell or a training
    step kept. An object is in the snapshot only while it is the very object seen then, so an
    address reused by a newer tensor does not hide it. Taking one walks
    ``gc.get_objects()``, as :func:`live_tensors` does."""

    def __init__(self):
        self._refs = {
            id(obj): weakref.ref(obj) for obj in gc.get_objects() if isinstance(obj, _TENSOR_TYPES)
        }

    def __contains__(self, obj):
        ref = self._refs.get(id(obj))
        return ref is not None and ref() is obj

    def __len__(self):
        """The objects of the snapshot that are still alive."""
        return sum(1 for ref in self._refs.values() if ref() is not None)

    def __repr__(self):
        return f"<TensorSnapshot of {len(self._refs)} tensors, {len(self)} still alive>"


def tensor_snapshot():
    """A :class:`TensorSnapshot` of the tensors alive now."""
    return TensorSnapshot()


def _group_key(record, group_by):
    if group_by == "op":
        return record["op"] or _LEAF
    if group_by == "shape":
        return record["shape"]
    return record["site"] or _NO_SITE


def live_tensors(device=None, group_by="op", since=None):
    """The live needle Tensors and TensorTuples (found through ``gc.get_objects()``; they are
    always tracked) whose data is on ``device`` (None: every device); with ``since`` (a
    :class:`TensorSnapshot`), only those that were not alive when it was taken.

    Returns a list of dicts, largest first, one per object:

    - ``bytes``: the bytes of the object's view(s) (``nbytes``; for a TensorTuple the sum of
      its elements on the device);
    - ``storage_bytes``: the bytes of the whole storage(s) the view(s) keep alive
      (itemsize * ``_storage_size``). Views share storage and a storage's identity is not
      exposed, so shared storage is counted in every view that holds it: summing
      ``storage_bytes`` over views overstates, summing ``bytes`` understates a view of a
      larger buffer; ``memory_allocated`` is the exact total;
    - ``shape`` (a tuple of shapes for a TensorTuple), ``dtype`` (a tuple for a TensorTuple),
      ``op`` (the creating op's type name,
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
    if since is not None and not isinstance(since, TensorSnapshot):
        raise TypeError(
            f"since must be a TensorSnapshot (needle.memory.tensor_snapshot()), "
            f"got {type(since).__name__}"
        )
    engine_id = _engine_filter(device)
    records = []
    for obj in gc.get_objects():
        if not isinstance(obj, _TENSOR_TYPES) or (since is not None and obj in since):
            continue
        arrays = [a for a in _arrays_of(obj) if engine_id is None or a.device._id == engine_id]
        if not arrays:
            continue
        if isinstance(obj, _c.TensorTuple):
            shape = tuple(a.shape for a in arrays)
            dtype = tuple(a.dtype for a in arrays)
        else:
            shape, dtype = arrays[0].shape, arrays[0].dtype
        record = {
            "bytes": sum(a.nbytes for a in arrays),
            "storage_bytes": sum(_itemsize(a) * a._storage_size for a in arrays),
            "shape": shape,
            "dtype": dtype,
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


def live_tensors_summary(device=None, group_by="op", since=None):
    """The live tensors of :func:`live_tensors` (created after the snapshot ``since`` when
    one is given) grouped by ``"op"`` (leaves under
    ``"(leaf)"``), ``"shape"`` (a tuple) or ``"site"`` (``"file:line"``, or
    ``"(not recorded)"``).

    Returns a list of dicts ``{"key", "count", "bytes", "storage_bytes"}``, sorted by bytes,
    largest first; ``bytes`` sums the views' ``nbytes`` and ``storage_bytes`` the storages
    they keep alive (shared storage counted once per view, see :func:`live_tensors`).
    """
    if group_by not in _GROUP_KEYS:
        raise ValueError(f"group_by must be one of {_GROUP_KEYS}, got {group_by!r}")
    groups = {}
    for record in live_tensors(device, group_by, since):
        row = groups.setdefault(
            record["key"], {"key": record["key"], "count": 0, "bytes": 0, "storage_bytes": 0}
        )
        row["count"] += 1
        row["bytes"] += record["bytes"]
        row["storage_bytes"] += record["storage_bytes"]
    return sorted(groups.values(), key=lambda r: (-r["bytes"], -r["count"], str(r["key"])))


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
        values = [
            objects[i] for i in component if isinstance(objects[i], (_c.Tensor, _c.TensorTuple))
        ]
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
            arrays = [
                a for a in _arrays_of(value) if engine_id is None or a.device._id == engine_id
            ]
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
        reports.append(
            {
                "tensors": len(values),
                "bytes": sum(a.nbytes for a in seen_arrays.values()),
                "storage_bytes": sum(_itemsize(a) * a._storage_size for a in seen_arrays.values()),
                "objects": len(component),
                "ops": ops,
                "sites": [site for site, _ in sites.most_common()],
                "devices": sorted(devices),
                "example": _describe(largest, _arrays_of(largest)),
            }
        )
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
    _flag("free", free)
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
        if (
            message is None
            and module is None
            and lineno == 0
            and issubclass(CycleWarning, category)
        ):
            if action == "ignore":
                warnings.filterwarnings("default", category=CycleWarning)
            return


def _available_engine_ids():
    return [(dev._id, repr(dev)) for dev in (_c.cpu(), _c.cpu_numpy(), _c.cuda()) if dev.enabled()]


_cycle_watch = {"devices": [], "before": None}
# The (phase, info) observers needle_c calls around each scoped collection, as gc.callbacks
# around Python's: warn_on_cycles watches both.
_scoped_observers = _c._scoped_info()["observers"]


def _cycle_callback(phase, info):
    """The gc.callbacks observer of warn_on_cycles. It runs inside collections, including the
    ones the allocator starts under memory pressure, so it only reads counters and never
    raises."""
    try:
        if phase == "start":
            _cycle_watch["before"] = [
                (engine_id, name, _c._memory_allocated(engine_id))
                for engine_id, name in _cycle_watch["devices"]
            ]
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
            amounts = ", ".join(
                f"{_format_bytes(n)} ({n} bytes) on {name}" for name, n in freed.items()
            )
            warnings.warn(
                CycleWarning(
                    f"a garbage collection (generation {info.get('generation')}) freed "
                    f"{amounts} of device memory that reference cycles held: tensors in cycles "
                    "keep their memory until the collector runs. Use graph mode 'cycle_free' "
                    "(needle.autograd.set_graph_mode('cycle_free'), the default) or break the "
                    "cycles; needle.memory.find_cycles() shows where they are.",
                    freed,
                ),
                stacklevel=2,
            )
    except Exception:
        pass


def warn_on_cycles(enabled=True):
    """Installs (``enabled=True``) or removes a ``gc.callbacks`` observer, also called around
    needle's scoped collections, that emits a :class:`CycleWarning` whenever a collection frees
    device memory on any available device, that is, whenever reference cycles were holding
    it. Enabling also makes CycleWarning
    visible when only Python's default ``ignore::ResourceWarning`` filter would apply. The
    observer runs inside the collector and cannot raise there: a filter that turns the
    warning into an error drops it. Returns whether it was installed before."""
    was_installed = _cycle_callback in gc.callbacks
    if _flag("enabled", enabled):
        _show_cycle_warnings()
        _cycle_watch["devices"] = _available_engine_ids()
        if not was_installed:
            gc.callbacks.append(_cycle_callback)
        if _cycle_callback not in _scoped_observers:
            _scoped_observers.append(_cycle_callback)
    else:
        while _cycle_callback in gc.callbacks:
            gc.callbacks.remove(_cycle_callback)
        while _cycle_callback in _scoped_observers:
            _scoped_observers.remove(_cycle_callback)
        _cycle_watch["before"] = None
    return was_installed
