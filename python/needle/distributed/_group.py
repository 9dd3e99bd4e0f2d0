"""needle.distributed's process group: its state, its errors, and the timed wait every
collective goes through.

One group per process (PyTorch's default group). Collectives are non-blocking MPI requests
polled with :meth:`ProcessGroup.wait` until they finish or the group's timeout passes, so a
peer that stopped calling collectives (hung, exited, or died where the launcher did not tear
the job down) is a :class:`DistributedError` naming the ranks waited for, never a hang.
"""

import enum
import time

from .. import _environ

# Seconds a collective may wait for the other ranks when neither init_process_group(timeout=)
# nor NEEDLE_DIST_TIMEOUT says: long enough for a slow first step (compilation, a collection),
# short enough that a lost rank does not hold a job for hours.
DEFAULT_TIMEOUT_S = 300.0

# The wait's polling: Test in a tight loop for the first SPIN_S seconds (a collective between
# ranks that are in step finishes in microseconds), then sleep between tests, doubling from
# FIRST_SLEEP_S up to MAX_SLEEP_S, so a rank that waits long for a straggler leaves the CPU to
# it (two ranks share two cores in CI) at a cost of at most MAX_SLEEP_S of extra latency.
SPIN_S = 200e-6
FIRST_SLEEP_S = 20e-6
MAX_SLEEP_S = 1e-3


class DistributedError(RuntimeError):
    """Every failure of needle.distributed: a collective before init_process_group, ranks that
    disagree on a collective's shape, dtype or arguments, a timeout, a backend that cannot
    serve the device. The message names the rank(s)."""

    __module__ = "needle.distributed"


class ReduceOp(str, enum.Enum):
    """The reductions of :func:`all_reduce`: ``SUM``, and ``AVG`` (the sum divided by the
    world size). The strings ``"sum"`` and ``"avg"`` are accepted too."""

    SUM = "sum"
    AVG = "avg"

    @classmethod
    def of(cls, op):
        """``op`` as a ReduceOp; ValueError naming the accepted ones otherwise."""
        if isinstance(op, cls):
            return op
        if isinstance(op, str):
            try:
                return cls(op.lower())
            except ValueError:
                pass
        raise ValueError(
            f"all_reduce: op must be ReduceOp.SUM, ReduceOp.AVG, 'sum' or 'avg', got {op!r}"
        )


def timeout_seconds(timeout):
    """The collectives' timeout in seconds: ``timeout`` (seconds, or a datetime.timedelta as
    PyTorch passes), else NEEDLE_DIST_TIMEOUT, else DEFAULT_TIMEOUT_S. ValueError for a
    value that is not a positive number."""
    if timeout is None:
        text = _environ.read("NEEDLE_DIST_TIMEOUT")
        if text is None:
            return DEFAULT_TIMEOUT_S
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value > 0 or value == float("inf"):
            raise _environ.invalid("NEEDLE_DIST_TIMEOUT", text)
        return value
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be seconds or a timedelta, got {type(timeout).__name__}")
    if not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


class ProcessGroup:
    """The process's group: the MPI communicator (a duplicate of COMM_WORLD, so that needle's
    traffic never matches the user's own MPI calls), rank, size, local rank, the device this
    rank computes on, the backend, and the timeout."""

    def __init__(self, mpi, comm, backend, timeout, local_rank, device, check):
        self.MPI = mpi
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.backend = backend
        self.timeout = timeout
        self.local_rank = local_rank
        self.device = device
        self.check = check
        self.cuda_aware = False  # whether MPI may be given device pointers (_staging)
        self.nccl = None  # the NCCL communicator (_nccl.Communicator) when backend == "nccl"
        # Why the group can no longer be used (a timed-out collective leaves MPI requests
        # pending that no later collective could match), or None.
        self.broken = None
        # The requests and buffers of timed-out collectives: MPI may still write into the
        # buffers, so they are kept alive for the life of the process.
        self._abandoned = []

    def others(self):
        """The ranks this one waits for in a collective, for messages."""
        peers = [r for r in range(self.size) if r != self.rank]
        if len(peers) <= 8:
            return (
                "rank " + ", ".join(map(str, peers))
                if len(peers) == 1
                else ("ranks " + ", ".join(map(str, peers)))
            )
        return f"ranks 0..{self.size - 1} other than {self.rank}"

    def usable(self, what):
        """Raises DistributedError when a former timeout has broken the group."""
        if self.broken is not None:
            raise DistributedError(
                f"rank {self.rank}: {what}: the process group is broken: {self.broken}"
            )

    def wait(self, request, what, keep=()):
        """Polls ``request`` until it completes; DistributedError after the group's timeout,
        naming the ranks waited for. ``keep``: the buffers the request writes (held for ever
        when it times out)."""
        if request.Test():
            return
        start = time.monotonic()
        deadline = start + self.timeout
        sleep = FIRST_SLEEP_S
        while not request.Test():
            now = time.monotonic()
            if now - start < SPIN_S:
                continue
            if now > deadline:
                self._abandoned.append((request, keep))
                self.broken = f"{what} timed out after {self.timeout:g} s"
                raise DistributedError(
                    f"rank {self.rank}: {what} timed out after {self.timeout:g} s waiting for "
                    f"{self.others()} of {self.size} (a rank that died, hangs, or called a "
                    "different collective)"
                )
            time.sleep(sleep)
            sleep = min(2 * sleep, MAX_SLEEP_S)
