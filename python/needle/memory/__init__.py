"""Device-memory statistics and limits, named after ``torch.cuda``'s.

Every function takes ``device=None`` (the default device, ``cpu()``), a
needle device, or a name such as ``"cpu"``, ``"cpu_numpy"``, ``"cuda"`` or
``"cuda:1"``, and counts bytes. ``memory_stats()`` is the source of truth;
the other getters are views of it.

On the CPU a limit emulates a GPU's capacity, so that running out of memory
(and not running out) can be tested on a machine without a GPU. The
environment variable ``NEEDLE_MEMORY_LIMIT`` sets limits at import: either
one size for every device (``"2GiB"``) or per device
(``"cpu=1GiB,cuda=8GiB"``, each device named once; a limit on a GPU this process cannot use
applies to nothing, which a RuntimeWarning says). The caching allocators' settings (PyTorch's
``PYTORCH_ALLOC_CONF`` options) are :func:`set_allocator_settings` and
``NEEDLE_ALLOC_CONF`` (:mod:`.alloc_conf`). An out-of-memory error explains itself (the
collections' yield, the fragmentation, who holds the memory); :func:`set_oom_snapshot` and
``NEEDLE_OOM_SNAPSHOT`` also write a memory snapshot when one is raised (:mod:`.oom`).

Diagnostics: :func:`live_tensors` and :func:`live_tensors_summary` list the tensors that
hold device memory (with ``since=``, those created after a :func:`tensor_snapshot`),
:func:`find_cycles` the reference cycles that hold it,
:func:`warn_on_cycles` warns when a collection frees such memory, :func:`record_history`
records where tensors are created, :class:`MemoryMonitor` records a timeline and
:func:`collection_history` lists every collection (its trigger, scope, time and what it freed).
:func:`_record_memory_history`, :func:`_snapshot` and :func:`_dump_snapshot` (PyTorch's
names, private there too) record and save snapshots that PyTorch's memory viewer draws. For
:func:`live_tensors`, :func:`live_tensors_summary` and :func:`find_cycles`, ``device=None``
means every device, not the default one.

The package's modules: :mod:`.stats` (statistics, sizes, limits), :mod:`.alloc_conf`
(allocator settings), :mod:`.policy` (the
collection policy, ``freeze_heap``, :func:`safe_point`), :mod:`.collection_log` (the record of
every collection), :mod:`.diagnostics` (live tensors,
cycles, warnings), :mod:`.summary` (``memory_summary``), :mod:`.monitor` (timelines and
allocation history), :mod:`.snapshot` (PyTorch's memory snapshots), :mod:`.holders` (who
holds device memory in a notebook, and releasing what the notebook keeps) and :mod:`.oom` (the
explainer of out-of-memory errors and the snapshot written at one). Each imports only the ones
listed before it.
"""

# Private names that other modules (testing, apps) and the tests reach here:
# _format_bytes (the package's one byte formatter), _engine_id, _resolve (the device parser),
# _flag (the check of a True/False argument), _cycle_callback.
from .alloc_conf import _settings_from_environment, get_allocator_settings, set_allocator_settings
from .collection_log import collection_history
from .diagnostics import (
    CycleWarning,
    TensorSnapshot,
    find_cycles,
    live_tensors,
    live_tensors_summary,
    tensor_snapshot,
    warn_on_cycles,
)
from .diagnostics import _cycle_callback as _cycle_callback
from .holders import holders, release_notebook_references
from .monitor import MemoryMonitor, record_history
from .oom import (
    _install_explainer,
    _oom_snapshot_from_environment,
    get_oom_snapshot,
    set_oom_snapshot,
)
from .policy import (
    _policy_from_environment,
    collect,
    freeze_heap,
    gc_visible,
    get_gc_policy,
    safe_point,
    set_gc_policy,
    set_gc_visible,
)
from .snapshot import _dump_snapshot as _dump_snapshot
from .snapshot import _peak as _peak
from .snapshot import _record_memory_history as _record_memory_history
from .snapshot import _record_peak as _record_peak
from .snapshot import _restore_history as _restore_history
from .snapshot import _snapshot as _snapshot
from .stats import _engine_id as _engine_id
from .stats import _flag as _flag
from .stats import _format_bytes as _format_bytes
from .stats import (
    _limits_from_environment,
    empty_cache,
    get_memory_limit,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    parse_size,
    reset_peak_memory_stats,
    set_memory_limit,
    set_per_process_memory_fraction,
)
from .stats import _resolve as _resolve
from .summary import memory_summary

__all__ = [
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
    "empty_cache",
    "set_memory_limit",
    "get_memory_limit",
    "set_per_process_memory_fraction",
    "mem_get_info",
    "memory_summary",
    "parse_size",
    "set_allocator_settings",
    "get_allocator_settings",
    "set_gc_policy",
    "get_gc_policy",
    "set_gc_visible",
    "gc_visible",
    "freeze_heap",
    "live_tensors",
    "live_tensors_summary",
    "tensor_snapshot",
    "TensorSnapshot",
    "find_cycles",
    "warn_on_cycles",
    "CycleWarning",
    "record_history",
    "MemoryMonitor",
    "safe_point",
    "collect",
    "holders",
    "release_notebook_references",
    "collection_history",
    "set_oom_snapshot",
    "get_oom_snapshot",
]

# The public names are needle.memory's, wherever in the package they are defined.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name

_limits_from_environment()
_settings_from_environment()
_policy_from_environment()
_oom_snapshot_from_environment()
_install_explainer()
