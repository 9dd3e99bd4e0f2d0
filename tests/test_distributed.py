"""needle.distributed: collectives on two ranks against NumPy, the errors, the faults, the
launcher, and the NCCL backend's refusals.

The two-rank cases run the scripts in tests/distributed/ under mpiexec (through
``python -m needle.distributed.run``, which tests the launcher too), each with a timeout;
every script checks many cases in one job because each start costs about a second. Skipped
without mpi4py or mpiexec (``pip install ".[distributed]"``).
"""

import os
import sys

import numpy as np
import pytest

import needle as ndl
import needle.distributed as dist
from needle.distributed import _nccl, run

from devices import DEVICES
from mpi_run import launch, needs_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "distributed")


@needs_mpi
@pytest.mark.parametrize("device", DEVICES)
def test_collectives_two_ranks(device):
    name = "cuda" if device.name == "cuda" else "cpu"
    done, _ = launch(os.path.join(SCRIPTS, "collectives.py"), name)
    assert done.returncode == 0, done.stdout
    for check in (f"{name} shapes", f"{name} views", f"{name} tensors", f"{name} async"):
        assert f"ok {check}" in done.stdout, done.stdout
    assert "ok errors" in done.stdout and "ok destroy" in done.stdout
    assert done.stdout.rstrip().endswith("done"), done.stdout


@needs_mpi
@pytest.mark.parametrize("device", DEVICES)
def test_collectives_one_rank_in_process(device):
    """A group of one in this process (MPI's singleton start): the staging path on every
    device, without mpiexec."""
    dist.init_process_group(timeout=30)
    try:
        assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (0, 1, 0)
        values = np.arange(12, dtype=np.float32).reshape(3, 4)
        a = ndl.NDArray(values, device=device)
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        np.testing.assert_array_equal(a.numpy(), values)
        view = ndl.NDArray(values, device=device).permute((1, 0))
        dist.broadcast(view, src=0)
        np.testing.assert_array_equal(view.numpy(), values.T)
        out = [ndl.Tensor(np.zeros((4, 3), np.float32), device=device)]
        dist.all_gather(out, view)
        np.testing.assert_array_equal(out[0].numpy(), values.T)
        dist.barrier()
        with pytest.raises(ValueError, match="src must be a rank in 0..0"):
            dist.broadcast(a, src=1)
        with pytest.raises(ValueError, match="op must be"):
            dist.all_reduce(a, op="max")
        with pytest.raises(ValueError, match="world size = 1"):
            dist.all_gather([a, a], a)
        with pytest.raises(dist.DistributedError, match="already initialized"):
            dist.init_process_group()
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


def test_errors_without_a_group():
    assert not dist.is_initialized()
    a = ndl.NDArray(np.ones(2, np.float32))
    for call in (
        lambda: dist.all_reduce(a),
        lambda: dist.broadcast(a),
        lambda: dist.all_gather([a], a),
        dist.barrier,
        dist.get_rank,
        dist.destroy_process_group,
    ):
        with pytest.raises(dist.DistributedError, match=r"init_process_group\(\) first"):
            call()
    with pytest.raises(ValueError, match="backend must be 'mpi' or 'nccl'"):
        dist.init_process_group(backend="gloo")
    with pytest.raises(ValueError, match="timeout must be"):
        dist.init_process_group(timeout=0)
    with pytest.raises(TypeError, match="timeout must be"):
        dist.init_process_group(timeout="soon")
    assert not dist.is_initialized()


def test_timeout_from_the_environment(monkeypatch):
    monkeypatch.setenv("NEEDLE_DIST_TIMEOUT", "12.5")
    assert dist.timeout_seconds(None) == 12.5
    monkeypatch.setenv("NEEDLE_DIST_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="NEEDLE_DIST_TIMEOUT='soon'"):
        dist.timeout_seconds(None)
    monkeypatch.delenv("NEEDLE_DIST_TIMEOUT")
    assert dist.timeout_seconds(None) == 300.0


@needs_mpi
@pytest.mark.parametrize("device", DEVICES)
def test_nccl_refused_where_it_cannot_run(device):
    """backend='nccl' without a GPU (the CPU, the simulator) is a DistributedError with the
    reason, and leaves no group behind."""
    if device.name == "cuda" and not ndl.cuda.is_available():
        pytest.skip("no CUDA device")
    reason = _nccl.unavailable_reason(device)
    if reason is None:
        pytest.skip("NCCL can run here: the GPU validation runs it")
    with pytest.raises(dist.DistributedError, match="rank 0: init_process_group") as info:
        dist.init_process_group(backend="nccl")
    assert reason[:60] in str(info.value)
    assert not dist.is_initialized()
    expected = "needs a CUDA device" if device.name == "cpu" else "needs a GPU|NCCL not found"
    assert any(word in reason for word in expected.split("|")), reason


def test_nccl_library_not_found(monkeypatch, tmp_path):
    missing = str(tmp_path / "libnccl.so.2")
    monkeypatch.setenv("NEEDLE_NCCL", missing)
    with pytest.raises(dist.DistributedError, match="NCCL not found") as info:
        _nccl.library()
    assert missing in str(info.value)


@needs_mpi
@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_a_failing_rank_ends_the_job(mode):
    """Rank 1 raises, or SIGKILLs itself with an all_reduce in flight, while rank 0 waits in
    an all_reduce: the job ends (long before the 300 s timeout) and the output names rank 1."""
    done, _ = launch(os.path.join(SCRIPTS, "faults.py"), mode)
    assert done.returncode != 0, done.stdout
    assert "step 2 done" not in done.stdout
    if mode == "raise":
        assert "needle.distributed: rank 1 raised RuntimeError: rank 1 fails mid-step" in (
            done.stdout
        )
        assert "MPI_ABORT was invoked on rank 1" in done.stdout, done.stdout
    else:
        assert "process rank 1" in done.stdout and "signal 9" in done.stdout, done.stdout


@needs_mpi
def test_a_rank_failing_inside_a_ddp_backward_ends_the_job():
    """A gradient hook raises on rank 1 in the middle of a DistributedDataParallel backward
    (some buckets' all-reduces started, the rest never will) while rank 0's backward waits for
    them: the job ends, naming rank 1, and no rank finishes its backward."""
    done, _ = launch(os.path.join(SCRIPTS, "faults.py"), "ddp")
    assert done.returncode != 0, done.stdout
    assert "backward done" not in done.stdout
    assert "needle.distributed: rank 1 raised RuntimeError: rank 1 fails mid-backward" in (
        done.stdout
    )
    assert "MPI_ABORT was invoked on rank 1" in done.stdout, done.stdout


@needs_mpi
def test_a_rank_that_leaves_times_out_the_others():
    """Rank 1 exits without an exception; rank 0's all_reduce times out (2 s) naming it."""
    done, _ = launch(os.path.join(SCRIPTS, "faults.py"), "exit", "2")
    assert done.returncode != 0, done.stdout
    assert "rank 0: all_reduce(sum) timed out after 2 s waiting for rank 1 of 2" in done.stdout
    assert "step 2 done" not in done.stdout


def test_launcher_command_and_errors(monkeypatch, capsys):
    cmd = run.command(4, ["train.py", "--epochs", "1"], "/opt/mpi/bin/mpiexec", cpus=2)
    assert cmd == [
        "/opt/mpi/bin/mpiexec",
        "-n",
        "4",
        "--oversubscribe",
        sys.executable,
        "train.py",
        "--epochs",
        "1",
    ]
    assert "--oversubscribe" not in run.command(2, ["-m", "m"], "mpiexec", cpus=2)
    # The script's own options reach it, -m takes the rest.
    assert run.split(["-n", "2", "s.py", "-n", "5", "--help"]) == (
        ["-n", "2"],
        ["s.py", "-n", "5", "--help"],
    )
    assert run.split(["-n3", "-m", "pkg.mod", "-h"]) == (["-n3"], ["-m", "pkg.mod", "-h"])
    monkeypatch.setattr(run, "find_mpiexec", lambda: None)
    assert run.main(["-n", "2", "script.py"]) == 127
    assert "mpiexec not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.main(["-n", "0", "script.py"])
    with pytest.raises(SystemExit):
        run.main(["-n", "2"])
