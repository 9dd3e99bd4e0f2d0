"""The NCCL backend: NCCL's collectives on CUDA arrays, loaded at run time with ctypes.

The library comes from ``NEEDLE_NCCL`` (a path or soname), the ``nvidia-nccl-cu13`` wheel
(``nvidia/nccl/lib`` or ``nvidia/cu13/lib``, found the way needle.cuda finds cuBLAS's wheel),
then the loader's path. Rank 0 makes the unique id and broadcasts it over MPI; each rank
joins with ``ncclCommInitRank`` on its local rank's GPU.

Streams: needle runs its CUDA work on its current stream of the GPU (its own non-blocking
stream unless ``ndl.cuda.stream`` chose another; docs/cuda.md), so the collectives' calls are
queued on that stream: they start after needle's kernels that produced the data and needle's
later kernels wait for them, with no synchronisation (the legacy default stream, stream 0,
would order nothing against a non-blocking stream). :meth:`Communicator` works' waits poll
that stream (``cuStreamQuery``) and NCCL's asynchronous error under the group's timeout; on a
timeout the communicator is aborted (``ncclCommAbort``) so that no kernel stays waiting for a
dead peer.

DistributedDataParallel's bucket all-reduces (``side_stream=True``) run on the communicator's
own non-blocking stream instead, so that they overlap the rest of the backward on the GPU: an
event recorded on needle's stream once the bucket is packed makes the side stream wait for
it, the all-reduce follows there, and its work's ``wait()`` makes needle's stream wait for an
event recorded after it (``cuStreamWaitEvent``): ordered on the device, without blocking the
host.

Buffers NCCL needs beyond the arrays (all_gather's gathered block, a compact copy of a view)
come from needle's allocator, so they are counted and go through its out-of-memory ladder.

Dtypes: every call passes the array's ``ncclDataType_t`` (_dtypes' table: float16, float32,
float64 and bfloat16, which NCCL reduces natively) and its element count. The device
pointers come from DLPack (``__dlpack__``), which carries all four dtypes (the CUDA array
interface has no bfloat16). tests/test_collectives_dtypes.py checks the calls' arguments
against a stub libnccl (tests/distributed/nccl_stub.c) on host arrays, with no GPU.
"""

import ctypes
import os

import needle_c as _c

from .. import _environ
from . import _dtypes
from ._group import DistributedError, ReduceOp

_NCCL_SUCCESS = 0
_NCCL_IN_PROGRESS = 7
_NCCL_OPS = {ReduceOp.SUM: 0, ReduceOp.AVG: 4}  # ncclSum, ncclAvg (NCCL >= 2.10)
_CUDA_SUCCESS = 0
_CUDA_ERROR_NOT_READY = 600
_CU_STREAM_NON_BLOCKING = 1
_CU_EVENT_DISABLE_TIMING = 2
_UNIQUE_ID_BYTES = 128
_DLPACK_CAPSULE = b"dltensor"


def _capsule_pointer():
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get


_CAPSULE_POINTER = _capsule_pointer()


def data_pointer(arr):
    """The address of ``arr``'s first element (any dtype, any device), read from its DLPack
    export: a DLManagedTensor begins with its DLTensor, which begins with ``void *data``
    (needle exports byte_offset 0). The capsule is dropped unconsumed, which releases only
    its own reference: ``arr`` keeps the memory alive."""
    capsule = arr.__dlpack__()
    managed = _CAPSULE_POINTER(capsule, _DLPACK_CAPSULE)
    return ctypes.c_void_p(ctypes.c_void_p.from_address(managed).value)


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * _UNIQUE_ID_BYTES)]


def _candidates():
    """Where libnccl.so.2 is looked for, in order."""
    explicit = _environ.read("NEEDLE_NCCL")
    if explicit is not None:
        return [explicit]
    from .. import cuda

    found = [os.path.join(d, "libnccl.so.2") for d in cuda.nvidia_wheel_lib_dirs(("nccl", "cu13"))]
    return [p for p in found if os.path.isfile(p)] + ["libnccl.so.2"]


_LIBRARIES = {}


def _load(name):
    """The CDLL of ``name`` (cached), or the OSError of loading it."""
    if name not in _LIBRARIES:
        try:
            _LIBRARIES[name] = ctypes.CDLL(name)
        except OSError as e:
            _LIBRARIES[name] = e
    return _LIBRARIES[name]


def library():
    """(the NCCL CDLL, its path); DistributedError listing what was tried."""
    tried = []
    for path in _candidates():
        lib = _load(path)
        if not isinstance(lib, OSError):
            return lib, path
        tried.append(f"{path}: {lib}")
    raise DistributedError(
        "NCCL not found (pip install nvidia-nccl-cu13, or NEEDLE_NCCL=/path/libnccl.so.2); "
        "tried " + "; ".join(tried)
    )


def unavailable_reason(device):
    """Why this rank cannot use NCCL on ``device`` (its local rank's device), or None."""
    if device.name != "cuda":
        from .. import cuda

        return f"backend='nccl' needs a CUDA device: {cuda.unavailable_reason()}"
    if _c._cuda_simulated():
        return (
            "backend='nccl' needs a GPU: this needle runs CUDA on its simulator "
            "(NEEDLE_CUDA=sim), whose device memory NCCL cannot reach; use backend='mpi'"
        )
    try:
        library()
    except DistributedError as e:
        return str(e)
    driver = _load("libcuda.so.1")
    if isinstance(driver, OSError):
        return f"backend='nccl': the CUDA driver library libcuda.so.1 did not load: {driver}"
    return None


class _StreamRequest:
    """An NCCL call in flight, as an MPI-request-like object for ProcessGroup.wait: done when
    the stream it was queued on (needle's) is idle; raises NCCL's asynchronous error."""

    def __init__(self, comm, stream):
        self._comm, self._stream = comm, stream

    def Test(self):  # noqa: N802 - the name ProcessGroup.wait calls, as on an MPI request
        self._comm.check_async()
        status = self._comm.driver.cuStreamQuery(self._stream)
        if status == _CUDA_ERROR_NOT_READY:
            return False
        if status != _CUDA_SUCCESS:
            raise DistributedError(
                f"rank {self._comm.pg.rank}: the CUDA stream of an NCCL collective failed "
                f"(CUresult {status})"
            )
        return True


class Communicator:
    """This rank's NCCL communicator on its local rank's GPU (``pg.device``): :meth:`join`
    makes one; the constructor only holds the group, the library, the driver and the
    ``ncclComm_t`` (the tests give it a stub library and host arrays)."""

    def __init__(self, pg, lib, driver, comm):
        self.pg, self.lib, self.driver, self.comm = pg, lib, driver, comm
        self.lib.ncclGetErrorString.restype = ctypes.c_char_p
        self._side = None  # the side stream (side_stream=True), made on first use

    @classmethod
    def join(cls, pg):
        """Rank 0 makes the unique id, every rank joins with ncclCommInitRank."""
        lib, _ = library()
        self = cls(pg, lib, _load("libcuda.so.1"), ctypes.c_void_p())
        self._make_current()
        uid = _UniqueId()
        status = ctypes.c_int(0)
        if pg.rank == 0:
            status.value = self.lib.ncclGetUniqueId(ctypes.byref(uid))
        packet = bytearray(bytes(uid) + bytes([1 if status.value else 0]))
        pg.wait(pg.comm.Ibcast(packet, root=0), "init_process_group(backend='nccl')", packet)
        if packet[-1]:
            raise DistributedError(
                f"rank {pg.rank}: init_process_group(backend='nccl'): rank 0's "
                "ncclGetUniqueId failed"
            )
        ctypes.memmove(ctypes.byref(uid), bytes(packet[:_UNIQUE_ID_BYTES]), _UNIQUE_ID_BYTES)
        self._check(
            self.lib.ncclCommInitRank(ctypes.byref(self.comm), pg.size, uid, pg.rank),
            "ncclCommInitRank",
        )
        return self

    def _make_current(self):
        """Makes the rank's GPU current on this thread (its primary context, the one needle's
        runtime uses): NCCL binds a communicator to the current device."""
        d = self.driver
        device, context = ctypes.c_int(), ctypes.c_void_p()
        for name, result in (
            ("cuInit", d.cuInit(0)),
            ("cuDeviceGet", d.cuDeviceGet(ctypes.byref(device), self.pg.device.index)),
            ("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)),
            ("cuCtxSetCurrent", d.cuCtxSetCurrent(context)),
        ):
            if result != _CUDA_SUCCESS:
                raise DistributedError(f"rank {self.pg.rank}: {name} failed (CUresult {result})")

    def _check(self, status, call):
        if status not in (_NCCL_SUCCESS, _NCCL_IN_PROGRESS):
            text = self.lib.ncclGetErrorString(status).decode(errors="replace")
            raise DistributedError(f"rank {self.pg.rank}: {call} failed: {text} ({status})")

    def check_async(self):
        """Raises NCCL's asynchronous error (a peer lost, a network failure), if any."""
        error = ctypes.c_int(0)
        self._check(
            self.lib.ncclCommGetAsyncError(self.comm, ctypes.byref(error)), "ncclCommGetAsyncError"
        )
        if error.value not in (_NCCL_SUCCESS, _NCCL_IN_PROGRESS):
            self._check(error.value, "an NCCL collective")

    def _compact(self, arr, what):
        """``arr`` itself when compact on the group's GPU, else a compact copy (written back
        by the work's finish)."""
        if arr.device != self.pg.device:
            raise DistributedError(
                f"rank {self.pg.rank}: {what}: the NCCL group of this rank is on "
                f"{self.pg.device!r}; the array is on {arr.device!r}"
            )
        return arr if arr.is_compact() else arr.compact()

    def _arguments(self, buf, what):
        """(data pointer, element count, ncclDataType_t) of the compact ``buf``: the count is
        of ``buf``'s elements in its own dtype, never bytes counted as float32."""
        row = _dtypes.of(buf, f"rank {self.pg.rank}: {what}")
        return data_pointer(buf), ctypes.c_size_t(buf.size), ctypes.c_int(row.nccl)

    def _work(self, what, finish, keep):
        from .collectives import Work

        return Work(self.pg, what, _StreamRequest(self, self._needle_stream()), finish, keep)

    def _needle_stream(self):
        """needle's current stream on this rank's GPU (a CUstream), where its kernels run and
        the collectives queue; None (the legacy stream) off a usable GPU, where the tests' stub
        library takes host arrays."""
        device = self.pg.device
        if getattr(device, "name", None) != "cuda" or not device.enabled():
            return None
        return ctypes.c_void_p(_c._cuda_stream("current", device.index))

    def _write_back(self, arr, buf):
        return (lambda: arr.__setitem__(Ellipsis, buf)) if buf is not arr else (lambda: None)

    def _driver(self, name, *args):
        status = getattr(self.driver, name)(*args)
        if status != _CUDA_SUCCESS:
            raise DistributedError(f"rank {self.pg.rank}: {name} failed (CUresult {status})")

    def _side_stream(self):
        if self._side is None:
            stream = ctypes.c_void_p()
            self._driver("cuStreamCreate", ctypes.byref(stream), _CU_STREAM_NON_BLOCKING)
            self._side = stream
        return self._side

    def _recorded_event(self, stream):
        event = ctypes.c_void_p()
        self._driver("cuEventCreate", ctypes.byref(event), _CU_EVENT_DISABLE_TIMING)
        self._driver("cuEventRecord", event, stream)
        return event

    def all_reduce(self, arr, op, what, side_stream=False):
        buf = self._compact(arr, what)
        mine = self._needle_stream()
        stream = self._side_stream() if side_stream and buf.size else mine
        if stream is not mine:
            ready = self._recorded_event(mine)
            self._driver("cuStreamWaitEvent", stream, ready, 0)
            self._driver("cuEventDestroy", ready)  # released once the device is past it
        if buf.size:
            ptr, count, dtype = self._arguments(buf, what)
            self._check(
                self.lib.ncclAllReduce(
                    ptr, ptr, count, dtype, ctypes.c_int(_NCCL_OPS[op]), self.comm, stream
                ),
                "ncclAllReduce",
            )
        if stream is mine:
            return self._work(what, self._write_back(arr, buf), (arr, buf))
        done = self._recorded_event(stream)
        write_back = self._write_back(arr, buf)

        def finish():
            # needle's stream waits on the device; NCCL's asynchronous error is checked on
            # the host
            self._driver("cuStreamWaitEvent", mine, done, 0)
            self._driver("cuEventDestroy", done)
            self.check_async()
            write_back()

        from .collectives import Work

        return Work(self.pg, what, None, finish, (arr, buf))

    def broadcast(self, arr, src, what):
        buf = self._compact(arr, what)
        if buf.size:
            ptr, count, dtype = self._arguments(buf, what)
            self._check(
                self.lib.ncclBroadcast(
                    ptr, ptr, count, dtype, ctypes.c_int(src), self.comm, self._needle_stream()
                ),
                "ncclBroadcast",
            )
        return self._work(what, self._write_back(arr, buf), (arr, buf))

    def all_gather(self, outs, arr, what):
        buf = self._compact(arr, what)
        every = arr.device.empty((self.pg.size,) + tuple(arr.shape), dtype=arr.dtype)
        if buf.size:
            ptr, count, dtype = self._arguments(buf, what)
            self._check(
                self.lib.ncclAllGather(
                    ptr, data_pointer(every), count, dtype, self.comm, self._needle_stream()
                ),
                "ncclAllGather",
            )

        def finish():
            # NDArray's integer index keeps the axis (the course's semantics): drop it.
            for r, out in enumerate(outs):
                out[...] = every[r].reshape(tuple(arr.shape))

        return self._work(what, finish, (buf, every, outs))

    def abort(self):
        """Aborts the communicator (after a timeout), so that no kernel keeps waiting for a
        lost peer; idempotent."""
        if self.comm:
            comm, self.comm = self.comm, ctypes.c_void_p()
            self._check(self.lib.ncclCommAbort(comm), "ncclCommAbort")

    def destroy(self):
        """Destroys the communicator (aborts it when the group is broken) and the side
        stream."""
        if self._side is not None:
            stream, self._side = self._side, None
            self._driver("cuStreamDestroy", stream)
        if self.pg.broken is not None:
            self.abort()
        elif self.comm:
            comm, self.comm = self.comm, ctypes.c_void_p()
            self._check(self.lib.ncclCommDestroy(comm), "ncclCommDestroy")
