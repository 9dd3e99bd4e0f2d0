"""The launcher's host placement options (``--hostfile``/``--machinefile``, ``--host``,
``-N``/``--npernode``, ``--oversubscribe``): how split() tells them from the script's own
options, the mpiexec line command() builds from them, the parser's refusals, and real
two-rank jobs placed with ``--host`` and ``--hostfile`` on this machine (skipped without
mpi4py or mpiexec). A job over two real machines is not run here (docs/distributed.md).
"""

import os
import re
import socket
import sys

import pytest

import needle_c as _c
from needle.distributed import run

from mpi_run import launch, needs_mpi

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed", "hosts.py")
LINE = re.compile(
    r"^rank (\d+) size (\d+) local (\d+) host (\S+) device (\S+) sum (\S+) argv (.*)$", re.M
)


def this_host():
    """This machine's name as Open MPI is given it: its hostname when that resolves (Open
    MPI then knows the host is this one and starts no ssh), else localhost."""
    name = socket.gethostname()
    try:
        socket.gethostbyname(name)
    except OSError:
        return "localhost"
    return name


def test_split_finds_the_script_after_the_host_options():
    argv = ["--hostfile", "hf", "-N", "2", "--host", "a:2", "--oversubscribe", "s.py", "x"]
    assert run.split(argv) == (argv[:7], ["s.py", "x"])
    # The aliases, the --opt=value and attached forms.
    argv = ["--machinefile", "hf", "--npernode", "1", "--host=a:1,b:1", "-N2", "-n4", "t.py"]
    assert run.split(argv) == (argv[:-1], ["t.py"])
    assert run.split(["--hostfile=hf", "-m", "pkg.mod", "--host", "z"]) == (
        ["--hostfile=hf"],
        ["-m", "pkg.mod", "--host", "z"],
    )


def test_split_leaves_the_scripts_own_host_options_to_it():
    own, target = run.split(["-n", "2", "--host", "a:2", "s.py", "--host", "b", "-N", "3"])
    assert own == ["-n", "2", "--host", "a:2"]
    assert target == ["s.py", "--host", "b", "-N", "3"]


def test_command_passes_each_host_option():
    py = sys.executable
    # A host list or hostfile decides the slots: no --oversubscribe for 4 ranks on 2 CPUs.
    assert run.command(4, ["t.py"], "mpiexec", cpus=2, hostfile="/etc/hf") == [
        "mpiexec", "-n", "4", "--hostfile", "/etc/hf", py, "t.py"
    ]  # fmt: skip
    assert run.command(4, ["t.py", "-v"], "mpiexec", cpus=2, host="a:2,b:2") == [
        "mpiexec", "-n", "4", "--host", "a:2,b:2", py, "t.py", "-v"
    ]  # fmt: skip
    # -N alone places the ranks on this machine (or a resource manager's allocation):
    # the CPU rule stays.
    assert run.command(4, ["t.py"], "mpiexec", cpus=2, per_node=2) == [
        "mpiexec", "-n", "4", "-N", "2", "--oversubscribe", py, "t.py"
    ]  # fmt: skip
    assert run.command(2, ["-m", "m"], "mpiexec", cpus=8, per_node=1) == [
        "mpiexec", "-n", "2", "-N", "1", py, "-m", "m"
    ]  # fmt: skip
    # --oversubscribe given is passed, with or without hosts.
    full = run.command(
        4, ["t.py"], "mpiexec", cpus=64, hostfile="hf", host="a:1", per_node=2, oversubscribe=True
    )
    assert full == [
        "mpiexec", "-n", "4", "--hostfile", "hf", "--host", "a:1", "-N", "2",
        "--oversubscribe", py, "t.py",
    ]  # fmt: skip
    assert "--oversubscribe" in run.command(1, ["t.py"], "mpiexec", cpus=8, oversubscribe=True)


def test_main_hands_the_options_to_mpiexec(monkeypatch, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("nodeA slots=2\nnodeB slots=2\n")
    calls = []
    monkeypatch.setattr(run, "find_mpiexec", lambda: "/opt/mpi/bin/mpiexec")
    monkeypatch.setattr(run.subprocess, "call", lambda cmd, env: calls.append(cmd) or 7)
    argv = ["-n", "4", "--machinefile", str(hostfile), "-N", "2", "train.py", "--host", "q"]
    assert run.main(argv) == 7
    assert calls[-1] == [
        "/opt/mpi/bin/mpiexec", "-n", "4", "--hostfile", str(hostfile), "-N", "2",
        sys.executable, "train.py", "--host", "q",
    ]  # fmt: skip
    assert run.main(["-n", "3", "--host=nodeA:2,nodeB:1", "--oversubscribe", "t.py"]) == 7
    assert calls[-1][1:7] == [
        "-n",
        "3",
        "--host",
        "nodeA:2,nodeB:1",
        "--oversubscribe",
        sys.executable,
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-N", "0", "s.py"], "-N must be at least 1, got 0"),
        (["-N", "two", "s.py"], "argument -N/--npernode: invalid int value: 'two'"),
        (["--hostfile", "/no/such/hostfile", "s.py"], "--hostfile '/no/such/hostfile' is not"),
        (["--host", "", "s.py"], "--host must name at least one host"),
        (["--host", "  ", "s.py"], "--host must name at least one host"),
        (["--host"], "argument --host: expected one argument"),
        (["--hostfile", "hf"], "name a script"),
    ],
)
def test_bad_host_options_are_refused(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").write_text("localhost slots=2\n")
    with pytest.raises(SystemExit) as e:
        run.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_directory_is_no_hostfile(capsys, tmp_path):
    with pytest.raises(SystemExit):
        run.main(["--hostfile", str(tmp_path), "s.py"])
    assert f"--hostfile {str(tmp_path)!r} is not a readable file" in capsys.readouterr().err


def rank_lines(stdout, size):
    """Each rank's printed line as a dict, in rank order; fails unless all ``size`` printed."""
    found = {}
    for m in LINE.finditer(stdout):
        rank, world, local, host, device, total, argv = m.groups()
        found[int(rank)] = dict(
            size=int(world), local=int(local), host=host, device=device, sum=float(total),
            argv=argv,
        )  # fmt: skip
    assert sorted(found) == list(range(size)), stdout
    return [found[r] for r in range(size)]


def expected_device(local_rank):
    """The device a rank with this local rank computes on: its GPU on this machine
    (local rank mod GPUs) when CUDA is usable, else the CPU."""
    count = sum(1 for i in range(_c.MAX_CUDA_DEVICES) if _c.cuda(i).enabled())
    return repr(_c.cuda(local_rank % count) if count else _c.cpu())


def check_job(done, argv):
    assert done.returncode == 0, done.stdout
    lines = rank_lines(done.stdout, 2)
    for rank, line in enumerate(lines):
        assert line["size"] == 2, done.stdout
        # Both ranks share this machine, so their local ranks are 0 and 1.
        assert line["local"] == rank, done.stdout
        assert line["host"] == socket.gethostname(), done.stdout
        assert line["device"] == expected_device(rank), done.stdout
        assert line["sum"] == 3.0, done.stdout  # ranks add 1 + 2
        assert line["argv"] == argv, done.stdout


@needs_mpi
def test_a_job_placed_with_host():
    host = this_host()
    done, _ = launch(SCRIPT, "--host", "x:9", "-n", "5", options=("--host", f"{host}:2"))
    check_job(done, "--host x:9 -n 5")


@needs_mpi
def test_a_job_placed_with_a_hostfile_and_ranks_per_node(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{this_host()} slots=2\n")
    done, _ = launch(SCRIPT, options=("--hostfile", str(hostfile), "-N", "2"))
    check_job(done, "")
