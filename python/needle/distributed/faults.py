"""What a rank's failure does to the job: an uncaught exception on one rank aborts all of them.

Without this, a rank that raises exits (or waits in MPI_Finalize) while the others wait in
their next collective until the timeout; Open MPI tears the job down only when a process dies
(a signal, ``os._exit``), within a second, naming it ("prterun noticed that process rank 1
... exited on signal 9"). :func:`install` (called by init_process_group) wraps
``sys.excepthook``: the traceback is printed as usual, then
``needle.distributed: rank R raised ExcType: message; aborting the job`` and ``MPI_Abort``,
which makes the launcher end every rank and name the rank that called it.

A rank that stops calling collectives without an exception (``sys.exit`` mid-step, a hang) is
caught by the collectives' timeout instead.
"""

import sys

_previous_hook = None
_group = None


def _abort_on_exception(etype, value, tb):
    (_previous_hook or sys.__excepthook__)(etype, value, tb)
    pg = _group
    if pg is None or pg.size == 1:
        return
    sys.stderr.write(
        f"needle.distributed: rank {pg.rank} raised {etype.__name__}: {value}; aborting the "
        f"job (MPI_Abort) so that the other {pg.size - 1} rank(s) do not wait for it\n"
    )
    sys.stderr.flush()
    pg.MPI.COMM_WORLD.Abort(1)


def install(pg):
    """Aborts the job on an uncaught exception on this rank while ``pg`` is up."""
    global _previous_hook, _group
    _group = pg
    if sys.excepthook is not _abort_on_exception:
        _previous_hook = sys.excepthook
        sys.excepthook = _abort_on_exception


def uninstall():
    """Restores the exception hook init_process_group found."""
    global _previous_hook, _group
    _group = None
    if sys.excepthook is _abort_on_exception:
        sys.excepthook = _previous_hook or sys.__excepthook__
    _previous_hook = None
