"""``needle.cuda``: the course's device function and the ``torch.cuda``-style API in one name.

``ndl.cuda()`` (and ``ndl.cuda(1)``) returns the CUDA device, as in the course, while the
functions below work like ``torch.cuda``'s; the module is made callable so that both uses
share the one name::

    import needle as ndl
    ndl.cuda.is_available(), ndl.cuda.unavailable_reason(), ndl.cuda.device_count(),
    ndl.cuda.get_device_name()
    ndl.cuda.memory_allocated(), ndl.cuda.max_memory_allocated(), ndl.cuda.memory_reserved()
    ndl.cuda.max_memory_reserved(), ndl.cuda.memory_stats(), ndl.cuda.reset_peak_memory_stats()
    ndl.cuda.empty_cache(), ndl.cuda.mem_get_info(), ndl.cuda.memory_summary()
    ndl.cuda.synchronize(), ndl.cuda.work_counters(), ndl.cuda.reset_work_counters(),
    ndl.cuda.launches_by_kernel()
    ndl.cuda.memory._record_memory_history(), ndl.cuda.memory._snapshot(),
    ndl.cuda.memory._dump_snapshot("snapshot.pickle")     # PyTorch's memory_viz format
    ndl.cuda.Stream(), ndl.cuda.current_stream(), ndl.cuda.default_stream(),
    ndl.cuda.set_stream(s), with ndl.cuda.stream(s): ...   # needle/_cuda_stream.py
    ndl.cuda.CUDAGraph(), with ndl.cuda.graph(g): ..., g.replay(),
    ndl.cuda.graph_pool_handle()                           # needle/_cuda_graphs.py
    ndl.cuda.make_graphed_callables(model, (x,))           # needle/_graphed_callables.py

Every function takes ``device=None`` (meaning ``cuda(0)``), a device index, a CUDA
device object or a name such as ``"cuda"`` / ``"cuda:1"``, and counts bytes. They are
views of :mod:`needle.memory` restricted to CUDA devices, and all of them are safe
without CUDA (a build without the backend, or no GPU): counters are 0, ``memory_stats``
is ``{}``, ``is_available`` is False, ``unavailable_reason`` says why and ``mem_get_info``
is ``(0, 0)``.

``allocated`` counts the bytes of live arrays exactly; ``reserved`` counts what the
caching allocator holds from the driver (cached blocks included), which is what a
memory limit (:func:`set_per_process_memory_fraction`, ``needle.memory.set_memory_limit``)
applies to. ``empty_cache`` gives the cached blocks back to the driver.
"""

import importlib.util
import os
import sys
import types

import needle_c as _c

from . import memory as _memory
from ._cuda_graphs import CUDAGraph, graph, graph_pool_handle, is_current_stream_capturing
from ._cuda_stream import (
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)
from ._graphed_callables import make_graphed_callables

__all__ = [
    "is_available",
    "is_compiled",
    "unavailable_reason",
    "device_count",
    "get_device_name",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
    "empty_cache",
    "mem_get_info",
    "memory_summary",
    "set_per_process_memory_fraction",
    "gemm_backend",
    "synchronize",
    "work_counters",
    "reset_work_counters",
    "launches_by_kernel",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
    "CUDAGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
]

# The census keys of work_counters(), in the engine's order (csrc/cuda/cuda_api.h).
WORK_COUNTERS = (
    "kernel_launches",
    "memsets",
    "d2d_copies",
    "blas_calls",
    "host_syncs",
    "device_mallocs",
    "device_frees",
    "h2d_copies",
    "h2d_bytes",
    "d2h_copies",
    "d2h_bytes",
    "graph_launches",
    "graph_nodes",
    "legacy_stream_work",
)


def _device(device=None):
    """The CUDA Device object for ``device`` (None: ``cuda(0)``; an int: ``cuda(i)``)."""
    if device is None:
        return _c.cuda(0)
    if isinstance(device, bool):
        raise TypeError("a CUDA device cannot be a bool")
    if isinstance(device, int):
        return _c.cuda(device)
    dev = _c._device(device)
    if dev.name != "cuda":
        raise ValueError(f"expected a CUDA device, got {dev!r}")
    return dev


def is_compiled():
    """True when this build of needle contains the CUDA backend (with or without a GPU)."""
    return bool(_c._cuda_compiled())


def is_available():
    """True when at least one CUDA device can be used."""
    return _c.cuda(0).enabled()


def unavailable_reason():
    """Why CUDA cannot be used, as a string, or None when :func:`is_available` is True.

    The reason names the CUDA error that device discovery met, with the CUDA version the
    driver supports and the one needle's runtime needs (``cudaErrorInsufficientDriver``:
    the driver is too old for needle's CUDA runtime), that the GPU is one the build has no
    code for (``"GPU 0 (...): needle was built for sm_75..sm_90; this GPU is sm_70: rebuild
    with CUDA 12 ..."``), or that needle was built without CUDA."""
    if is_available():
        return None
    reason = _c._cuda_init_error()
    return reason if reason else "no usable CUDA device was registered"


def device_count():
    """The number of usable CUDA devices (0 without CUDA)."""
    return sum(1 for i in range(_c.MAX_CUDA_DEVICES) if _c.cuda(i).enabled())


def get_device_name(device=None):
    """The GPU's name as the CUDA runtime reports it (``cudaDeviceProp.name``); a build
    with ``NEEDLE_CUDA=sim`` answers ``"needle CUDA simulator (CPU)"``. Raises
    ``needle.DeviceError`` when the device is not available."""
    dev = _device(device)
    name = _c._cuda_device_name(dev.index) if dev.enabled() else None
    if name is None:
        raise _c.DeviceError(f"{dev!r} is not available, so it has no name")
    return name


def memory_allocated(device=None):
    """Bytes held by live arrays on the CUDA device (exact; 0 without CUDA)."""
    return _memory.memory_allocated(_device(device))


def max_memory_allocated(device=None):
    """Peak of :func:`memory_allocated` since start or :func:`reset_peak_memory_stats`."""
    return _memory.max_memory_allocated(_device(device))


def memory_reserved(device=None):
    """Bytes the caching allocator holds from the driver, cache included (>= allocated)."""
    return _memory.memory_reserved(_device(device))


def max_memory_reserved(device=None):
    """Peak of :func:`memory_reserved`."""
    return _memory.max_memory_reserved(_device(device))


def memory_stats(device=None):
    """The allocator's statistics as a flat dict (keys as in ``torch.cuda.memory_stats``;
    see :func:`needle.memory.memory_stats`); ``{}`` without CUDA."""
    return _memory.memory_stats(_device(device))


def reset_peak_memory_stats(device=None):
    """Sets every peak statistic of the device to its current value."""
    _memory.reset_peak_memory_stats(_device(device))


def empty_cache(device=None):
    """Returns the cached, unused blocks of the device to the driver; returns the bytes
    released (0 without CUDA)."""
    return _memory.empty_cache(_device(device))


def mem_get_info(device=None):
    """``(free, total)`` bytes of the GPU: the driver's figures (``cudaMemGetInfo``, which
    count every process and the CUDA context), or the limit and what needle may still
    reserve under it when one is set (see :func:`needle.memory.mem_get_info`). ``(0, 0)``
    without CUDA."""
    return _memory.mem_get_info(_device(device))


def memory_summary(device=None, abbreviated=False):
    """A readable report of the device's memory (see :func:`needle.memory.memory_summary`)."""
    return _memory.memory_summary(_device(device), abbreviated=abbreviated)


def set_per_process_memory_fraction(fraction, device=None):
    """Limits what needle may reserve on the device to ``fraction`` (in (0, 1]) of its
    capacity; beyond it allocations raise ``needle.OutOfMemoryError``. ``None`` removes
    the limit. Raises ``needle.DeviceError`` without CUDA (see
    :func:`needle.memory.set_per_process_memory_fraction`)."""
    _memory.set_per_process_memory_fraction(fraction, _device(device))


def gemm_backend():
    """Which GEMM the CUDA backend runs: ``"cublas (<library>)"`` or needle's own kernel
    (with the reason, and where cuBLAS was looked for); None without the CUDA backend.

    cuBLAS is looked for in ``NEEDLE_CUBLAS``, the library found at build time, the
    ``nvidia-cublas`` wheel (``pip install ".[cuda]"``), then the loader's path. Its
    workspace comes from needle's caching allocator (counted in :func:`memory_reserved`);
    a cuBLAS call short of memory goes through the out-of-memory ladder and, if memory
    stays short, that one product runs on needle's kernel."""
    return _c._cuda_gemm()


def synchronize(device=None):
    """Waits for all of needle's work on the GPU (``torch.cuda.synchronize``), then raises
    what its kernels found since the last synchronisation: a GPU does not stop the host to
    report a bad index (an embedding lookup, a cross-entropy label), so the ``IndexError``
    the CPU raises at the call comes at the next synchronisation instead, which this is,
    as is any copy to the host (``.numpy()``, reading a loss). Does nothing without CUDA."""
    dev = _device(device)
    if dev.enabled():
        _c._cuda_synchronize(dev.index)


def work_counters(device=None, reset=False):
    """The census of the work needle asked of the GPU since the last reset: a dict with
    the keys of :data:`WORK_COUNTERS`: ``kernel_launches`` (needle's kernels), ``memsets``,
    ``d2d_copies``, ``blas_calls`` (cuBLAS GEMMs), ``host_syncs`` (each time the host
    waited for the GPU: a device-to-host copy, a synchronous host-to-device copy, a
    synchronize, ``cudaFree``), ``device_mallocs`` and ``device_frees`` (``cudaMalloc`` /
    ``cudaFree``: the caching allocator's segments), ``h2d_copies``/``h2d_bytes`` and
    ``d2h_copies``/``d2h_bytes``, ``graph_launches`` (CUDA graph replays, one host launch
    each) and ``graph_nodes`` (the kernels, copies and memsets those replays ran, which
    the other counts leave out), and ``legacy_stream_work`` (needle's launches, copies
    and memsets queued on the legacy default stream: always 0, since a CUDA graph capture
    of needle's stream would miss them). They count the same calls on a GPU and on the CUDA
    simulator (``NEEDLE_CUDA=sim``). ``reset=True`` zeroes them after reading. Every
    count is 0 without CUDA."""
    dev = _device(device)
    counts = _c._cuda_work(dev.index, bool(reset)) if dev.enabled() else None
    return dict(counts) if counts is not None else dict.fromkeys(WORK_COUNTERS, 0)


def launches_by_kernel(device=None):
    """The kernel launches counted by :func:`work_counters`, by call site:
    ``{"kernel_name file:line": count}`` (a template kernel shows its parameter names),
    largest first; ``{}`` without CUDA."""
    dev = _device(device)
    sites = _c._cuda_work_sites(dev.index) if dev.enabled() else {}
    return dict(sorted(sites.items(), key=lambda kv: -kv[1]))


def reset_work_counters(device=None):
    """Zeroes the GPU's :func:`work_counters`."""
    work_counters(device, reset=True)


def nvidia_wheel_lib_dirs(subdirs):
    """The lib directories ``nvidia/<sub>/lib`` of pip-installed NVIDIA wheels, for each name
    in ``subdirs``, found without importing them (their ``nvidia`` namespace package); also
    how needle.distributed finds NCCL's wheel."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    dirs = []
    for root in roots:
        for sub in subdirs:
            lib = os.path.join(root, sub, "lib")
            if os.path.isdir(lib) and lib not in dirs:
                dirs.append(lib)
    return dirs[:8]


def _cublas_wheel_dirs():
    """The lib directories of pip-installed cuBLAS wheels: ``nvidia-cublas`` (CUDA 13, what
    ``pip install ".[cuda]"`` brings) installs ``nvidia/cu13/lib/libcublas.so.13``,
    ``nvidia-cublas-cu12`` ``nvidia/cublas/lib``."""
    return nvidia_wheel_lib_dirs(("cu13", "cublas"))


# The engine never calls Python, so the wheel's directory is handed to its cuBLAS loader
# here, before the first matmul loads the library (NEEDLE_CUBLAS still comes first).
if _c._cuda_compiled():
    _c._cuda_cublas_dirs(_cublas_wheel_dirs())


def _record_memory_history(
    enabled="all",
    context="all",
    stacks="python",
    max_entries=sys.maxsize,
    device=None,
    clear_history=False,
    skip_actions=None,
):
    """Records the GPU's memory history (see :func:`needle.memory._record_memory_history`)."""
    _memory._record_memory_history(
        enabled, context, stacks, max_entries, _device(device), clear_history, skip_actions
    )


def _snapshot(device=None):
    """The GPU's memory in PyTorch's snapshot format (see :func:`needle.memory._snapshot`)."""
    return _memory._snapshot(_device(device))


def _dump_snapshot(filename="dump_snapshot.pickle", device=None):
    """Pickles :func:`_snapshot` into ``filename`` (see :func:`needle.memory._dump_snapshot`)."""
    _memory._dump_snapshot(filename, _device(device))


# ``ndl.cuda.memory``, torch.cuda.memory's spelling: the snapshot functions and the getters.
memory = types.ModuleType(
    __name__ + ".memory", "needle.cuda's memory functions under torch.cuda.memory's name."
)
for _name in ("_record_memory_history", "_snapshot", "_dump_snapshot") + tuple(
    n for n in __all__ if "memory" in n or n in ("empty_cache", "mem_get_info")
):
    setattr(memory, _name, globals()[_name])
del _name
sys.modules[memory.__name__] = memory


class _CallableModule(types.ModuleType):
    def __call__(self, index=0):
        """The CUDA device ``index``; ``enabled()`` is False without CUDA or a GPU."""
        return _c.cuda(index)


sys.modules[__name__].__class__ = _CallableModule
