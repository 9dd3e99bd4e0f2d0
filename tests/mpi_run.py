"""Starting a job of several ranks from a test: ``launch`` runs a script (or ``-m module``)
under ``python -m needle.distributed.run`` (mpiexec, with Open MPI's consent to run as root
where needed) with this process's import path, and ``needs_mpi`` skips a test without mpi4py
or mpiexec (``pip install ".[distributed]"``). Each start costs about a second: a test script
checks many cases in one job."""

import os
import subprocess
import sys
import time

import pytest

import needle.distributed as dist
from needle.distributed import run

MPIEXEC = run.find_mpiexec()

_MISSING = "needs mpi4py and mpiexec (pip install '.[distributed]')"
needs_mpi = pytest.mark.skipif(not dist.is_available() or MPIEXEC is None, reason=_MISSING)


def require_mpi():
    """Skips the calling test (or fixture) without mpi4py or mpiexec."""
    if not dist.is_available() or MPIEXEC is None:
        pytest.skip(_MISSING)


# Seconds a whole job may take before the test calls it a hang: far above a healthy run
# (a few seconds here), far below the collectives' own default timeout (300 s).
JOB_TIMEOUT_S = 120


def launch(*target, n=2, env=None, timeout=JOB_TIMEOUT_S, options=()):
    """Runs ``target`` (a script's path and its arguments, or ``"-m", module, ...``) on n
    ranks, with the launcher's further ``options`` (``("--host", "nodeA:2")``); returns the
    CompletedProcess (stdout and stderr merged) and the wall time. One thread per rank: the
    ranks share this machine's cores."""
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    environ.setdefault("NEEDLE_NUM_THREADS", "1")
    environ.update(env or {})
    cmd = [sys.executable, "-m", "needle.distributed.run", "-n", str(n), *options, *target]
    start = time.monotonic()
    done = subprocess.run(
        cmd,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - start
