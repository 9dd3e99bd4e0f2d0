"""needle.distributed's process group: its state, its errors, and the timed wait every
collective goes through.

One group per process (PyTorch's default group). Collectives are non-blocking MPI requests
polled with :meth:`ProcessGroup.wait` until they finish or the group's timeout passes, so a
peer that stopped calling collectives (hung, exited, or died where the launcher did not tear
the job down) is a :class:`DistributedError` naming the ranks waited for, never a hang.
DistributedDataParallel's bucket all-reduces run on the group's communication thread
(:class:`CommThread`), and are waited for the same way.
"""

import enum
import queue
import threading
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
        self._comm_thread = None  # CommThread, started by the first start_all_reduce

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

    def _time_out(self, request, what, keep):
        """Breaks the group (the request stays pending: its buffers are kept for ever) and
        raises DistributedError naming the ranks waited for."""
        self._abandoned.append((request, keep))
        self.broken = f"{what} timed out after {self.timeout:g} s"
        raise DistributedError(
            f"rank {self.rank}: {what} timed out after {self.timeout:g} s waiting for "
            f"{self.others()} of {self.size} (a rank that died, hangs, or called a "
            "different collective)"
        )

    def wait(self, request, what, keep=()):
        """Polls ``request`` until it completes; DistributedError after the group's timeout,
        naming the ranks waited for. ``keep``: the buffers the request writes (held for ever
        when it times out)."""
        if request.Test():
            return
        block = getattr(request, "block", None)
        if block is not None:  # a communication-thread job wakes its waiter itself
            if block(self.timeout):
                request.Test()
                return
            self._time_out(request, what, keep)
        start = time.monotonic()
        deadline = start + self.timeout
        sleep = FIRST_SLEEP_S
        while not request.Test():
            now = time.monotonic()
            if now - start < SPIN_S:
                continue
            if now > deadline:
                self._time_out(request, what, keep)
            time.sleep(sleep)
            sleep = min(2 * sleep, MAX_SLEEP_S)


class _Done:
    """A communication-thread job as an MPI-request-like object for ``ProcessGroup.wait``:
    ``Test()`` is whether it finished, and raises the error it met."""

    def __init__(self):
        self.event = threading.Event()
        self.error = None

    def Test(self):  # noqa: N802 - the name ProcessGroup.wait calls, as on an MPI request
        if not self.event.is_set():
            return False
        if self.error is not None:
            raise DistributedError(f"the communication thread's all-reduce failed: {self.error}")
        return True

    def block(self, seconds):
        """Waits up to ``seconds`` without polling (the thread wakes the waiter); whether it
        finished."""
        return self.event.wait(seconds)


class CommThread:
    """The group's communication thread: blocking SUM all-reduces, in the order they were
    queued, on a duplicate of the group's communicator (so they never match the calling
    thread's collectives). mpi4py releases the GIL inside the MPI call, so the all-reduce runs
    while the caller computes. Needs MPI_THREAD_MULTIPLE (mpi4py's default)."""

    def __init__(self, pg):
        self.pg = pg
        self.comm = pg.comm.Dup()
        self.jobs = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=self._run, name=f"needle.distributed rank {pg.rank}", daemon=True
        )
        self.thread.start()

    def all_reduce(self, buffer):
        done = _Done()
        self.jobs.put((buffer, done))
        # Hands the GIL over now: the caller is usually inside a backward pass, in C code that
        # would keep it for the interpreter's switch interval (5 ms) before the thread could
        # start the all-reduce (which then runs without the GIL).
        time.sleep(0)
        return done

    def _run(self):
        mpi = self.pg.MPI
        while True:
            job = self.jobs.get()
            if job is None:
                return
            buffer, done = job
            try:
                self.comm.Allreduce(mpi.IN_PLACE, buffer, op=mpi.SUM)
            except Exception as e:  # handed to the waiting thread, which raises it
                done.error = e
            done.event.set()

    def stop(self):
        """Ends the thread once the all-reduces queued before are done; one that waits for
        a rank that never joins it is left (a daemon) after the group's timeout."""
        self.jobs.put(None)
        self.thread.join(self.pg.timeout)
        if not self.thread.is_alive():
            self.comm.Free()


def comm_thread(pg):
    """The group's communication thread, started on first use (MPI_THREAD_MULTIPLE is
    checked then: with a lower level the all-reduces would race the caller's MPI calls)."""
    if pg._comm_thread is None:
        provided = pg.MPI.Query_thread()
        if provided != pg.MPI.THREAD_MULTIPLE:
            raise DistributedError(
                f"rank {pg.rank}: the gradient all-reduces run on a communication thread, "
                f"which needs MPI_THREAD_MULTIPLE; MPI provides level {provided} (set "
                'mpi4py.rc.thread_level = "multiple" before importing mpi4py.MPI)'
            )
        pg._comm_thread = CommThread(pg)
    return pg._comm_thread


def stop_comm_thread(pg):
    """Ends the group's communication thread, if any, once its queued all-reduces are done
    (a broken group's thread may be stuck in MPI: it is left, a daemon, to the process's
    end)."""
    worker, pg._comm_thread = pg._comm_thread, None
    if worker is not None and pg.broken is None:
        worker.stop()
