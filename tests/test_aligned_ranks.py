"""Aligned collections on two ranks (tests/distributed/aligned.py under mpiexec): rank 1 holds a
large Python heap and a tighter limit; with alignment every collection, Python's and needle's,
happens at the same step on both ranks, and without it (``aligned=False``) they do not. Also
``python -m needle.apps.train_ptb --distributed mpi`` on two ranks against one process, and the
repro's modes on two ranks (``--ranks 2``)."""

import json
import os
import re
import subprocess
import sys

import pytest

from mpi_run import launch, require_mpi
from repro_run import repro_report, run_repro

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distributed", "aligned.py")


def _ranks(mode, outdir):
    require_mpi()
    done, _ = launch(WORKER, mode, str(outdir))
    assert done.returncode == 0, done.stdout
    ranks = []
    for rank in (0, 1):
        with open(os.path.join(outdir, f"rank{rank}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def _steps(rank):
    return sorted({step for step, _ in rank["collections"]})


def test_collections_happen_at_the_same_steps_on_every_rank(tmp_path):
    r0, r1 = _ranks("aligned", tmp_path)
    assert len(_steps(r1)) >= 5
    assert r0["collections"] == r1["collections"]  # same steps, same kinds, same order
    # only rank 1 wanted collections; rank 0 ran every one of them too
    assert r1["figures"]["num_aligned_wants"] >= 5
    assert r0["figures"]["num_aligned_wants"] == 0
    assert r0["figures"]["num_aligned_collections"] == r1["figures"]["num_aligned_collections"]
    assert r1["figures"]["num_aligned_collections"] >= 5
    # each want waited for the one all-reduce that carried it
    waited = r1["figures"]["aligned_rounds_waited"]
    assert r1["figures"]["num_aligned_wants"] <= waited <= r1["figures"]["num_aligned_wants"] + 1
    for r in (r0, r1):
        assert r["figures"]["num_oom_collections"] == 0
        # agreed: the ladders that ran, and the Python generations that ran alone
        assert r["alignment"]["collections_agreed"] >= r1["figures"]["num_aligned_collections"]
        assert r["alignment"]["collections_agreed"] == r0["alignment"]["collections_agreed"]
        assert r["alignment"]["rounds"] >= 30  # one round per training step
        assert r["gc_enabled_during"] is False  # Python's automatic collector was taken over
        assert r["gc_enabled_after"] is True  # and given back by destroy_process_group()
    # both ranks learn both ranks' collection times: the same wait saved
    assert r0["alignment"]["wait_saved_seconds"] == pytest.approx(
        r1["alignment"]["wait_saved_seconds"]
    )
    assert r0["alignment"]["wait_saved_seconds"] > 0


def test_without_alignment_each_rank_collects_on_its_own(tmp_path):
    r0, r1 = _ranks("independent", tmp_path)
    scoped1 = {step for step, kind in r1["collections"] if kind == "scoped"}
    scoped0 = {step for step, kind in r0["collections"] if kind == "scoped"}
    assert len(scoped1) >= 5 and not scoped0  # rank 1's pressure collections are its own
    assert _steps(r0) != _steps(r1)
    for r in (r0, r1):
        assert r["figures"]["num_aligned_wants"] == 0
        assert r["alignment"]["rounds"] == 0
        assert r["gc_enabled_during"] is True


def _epoch_lines(output):
    return re.findall(r"train loss (\S+) .*? test loss (\S+)", output)


def test_train_ptb_on_two_ranks_matches_one_process():
    require_mpi()
    args = [
        "-m",
        "needle.apps.train_ptb",
        "--epochs",
        "1",
        "--synthetic-words",
        "6000",
        "--batch-size",
        "16",
        "--model",
        "lstm",
    ]
    done, _ = launch(*args, "--distributed", "mpi")
    assert done.returncode == 0, done.stdout
    assert "data-parallel: 2 ranks (mpi), 8 columns each" in done.stdout
    assert done.stdout.count("epoch 1/1") == 1  # rank 0 alone prints
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    single = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert single.returncode == 0, single.stderr
    (two,) = _epoch_lines(done.stdout)
    (one,) = _epoch_lines(single.stdout)
    assert [float(x) for x in two] == pytest.approx([float(x) for x in one], rel=1e-4)


def test_train_ptb_refuses_a_batch_the_ranks_cannot_split():
    require_mpi()
    done, _ = launch(
        "-m", "needle.apps.train_ptb", "--distributed", "mpi", "--batch-size", "7", "--epochs", "1"
    )
    assert done.returncode != 0
    assert "--batch-size 7 is not a multiple of the 2 ranks" in done.stdout


def test_the_repro_on_two_ranks(tmp_path):
    """The leak still runs out and the hook still holds on two ranks, whose collections are
    aligned: the figures are rank 0's."""
    require_mpi()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), NEEDLE_NUM_THREADS="1")
    proc, report = repro_report(
        tmp_path, "--ranks", "2", "--modes", "leak,hook", "--steps", "12", "--no-progress", env=env
    )
    assert "calibration: two steps of the floor" in proc.stdout
    assert report["leak"]["oom"] is True and report["leak"]["ranks"] == 2
    assert report["hook"]["oom"] is False and report["hook"]["steps"] == 12
    assert report["hook"]["pressure_collections"] >= 1


def test_the_repro_refuses_a_batch_the_ranks_cannot_split(tmp_path):
    proc = run_repro("--ranks", "3", "--batch-size", "32", small=False, out=tmp_path)
    assert proc.returncode == 2
    assert "--batch-size 32 is not a multiple of --ranks 3" in proc.stderr
