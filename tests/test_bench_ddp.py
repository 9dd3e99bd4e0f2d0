"""bench/ddp_scaling.py and bench/ddp_straggler.py at tiny sizes (a handful of steps, a batch
of 8): the output's structure and sanity, not speed (never asserted by timing). Skipped without
mpi4py or mpiexec; the PyTorch half of the scaling benchmark only runs when torch is installed.
"""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
TIMEOUT_S = 600


def _mpi_missing():
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed"
    if shutil.which("mpiexec") is None:
        return "mpiexec is not on PATH"
    return None


pytestmark = pytest.mark.skipif(_mpi_missing() is not None, reason=str(_mpi_missing()))


def _run(script, *args):
    """Runs ``bench/script --json args...``; returns its JSON lines after the machine line."""
    env = dict(os.environ)
    python_dir = str(ROOT / "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), python_dir) if p)
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert "machine" in lines[0] and lines[0]["machine"]["cpus"] >= 1
    return lines[1:]


def _positive(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_scaling_rows_and_efficiency():
    frameworks = ["needle"]
    if importlib.util.find_spec("torch") is not None:
        frameworks.append("torch")
    rows = _run(
        "ddp_scaling.py",
        *("--steps", "2", "--warmup", "1", "--batch", "8", "--configs", "lstm"),
        *("--frameworks", ",".join(frameworks)),
    )
    assert [(r["framework"], r["ranks"]) for r in rows] == [
        (fw, n) for fw in frameworks for n in (1, 2)
    ]
    by = {(r["framework"], r["ranks"]): r for r in rows}
    for r in rows:
        assert r["config"] == "lstm" and r["steps"] == 2 and r["rounds"] == 1
        assert r["batch_per_rank"] == 8 // r["ranks"]
        assert _positive(r["step_ms"]) and _positive(r["tokens_per_s"])
        assert r["tokens_per_s"] == pytest.approx(8 * 20 / (r["step_ms"] / 1e3))
        if r["ranks"] == 2:
            assert 0 < r["efficiency"] < 2
            # two ranks at batch 4 see the same first batch as one process at 8: the mean of
            # their losses is the one-process loss
            assert r["first_loss"] == pytest.approx(by[(r["framework"], 1)]["first_loss"], rel=1e-4)
        else:
            assert r["efficiency"] == pytest.approx(1.0)
    two = by[("needle", 2)]
    assert two["wait_ms"] >= 0 and _positive(two["allreduce_ms"])
    assert 0.0 <= two["hidden"] <= 1.0
    assert two["exposed_ms"] >= 0
    assert two["hidden"] == pytest.approx(max(0.0, 1.0 - two["exposed_ms"] / two["allreduce_ms"]))
    assert by[("needle", 1)]["wait_ms"] is None and by[("needle", 1)]["hidden"] is None


def test_scaling_refuses_an_odd_batch():
    proc = subprocess.run(
        [sys.executable, str(BENCH / "ddp_scaling.py"), "--batch", "7"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 2 and "--batch must be a multiple of 2" in proc.stderr


def test_straggler_runs_and_collections():
    lines = _run(
        "ddp_straggler.py",
        *("--steps", "6", "--warmup", "2", "--batch", "8", "--extra-objects", "3000"),
        *("--gc-every", "2", "--rounds", "2"),
    )
    rows, ratio = lines[:-1], lines[-1]
    assert [r["run"] for r in rows] == ["baseline", "independent", "aligned", "manual_gc"]
    for r in rows:
        # two rounds of 6 timed steps, pooled
        assert r["steps"] == 12 and r["rounds"] == 2 and r["batch_per_rank"] == 4
        for key in ("p50_ms", "p99_ms", "max_ms", "rank1_p50_ms", "rank1_p99_ms"):
            assert _positive(r[key]), key
        assert r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["extra_objects_rank1"] == (0 if r["run"] == "baseline" else 3000)
        assert isinstance(r["limit_bytes_rank1"], int) and r["limit_bytes_rank1"] > 0
        for counters in r["counters"]:
            for key, value in counters.items():
                assert value >= 0, key
        assert r["ladder"] == "full"
        assert all(ms >= 0 for ms in r["sync_ms_per_step"])
        assert all(ms >= 0 for ms in r["flags_ms_per_step"])
        on = [a["enabled"] for a in r["alignment"]]
        assert on == [r["run"] == "aligned"] * 2
    aligned = rows[2]
    # every flag round is one all-reduce: one per timed step, on both ranks, and both ranks
    # agreed on the same collections
    assert [a["rounds"] for a in aligned["alignment"]] == [12, 12]
    counts = [a["collections_agreed"] for a in aligned["alignment"]]
    assert counts[0] == counts[1]
    manual = rows[3]
    assert manual["gc_every"] == 2
    # gc.collect() at steps 0, 2, 4 of each round's timed six on each rank (gen 2: full ones)
    assert all(py[2] >= 6 for py in manual["python_collections"])
    assert _positive(ratio["aligned_p99_over_baseline_p99"])


def test_straggler_refuses_bad_arguments():
    proc = subprocess.run(
        [sys.executable, str(BENCH / "ddp_straggler.py"), "--runs", "nope"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 2 and "unknown run 'nope'" in proc.stderr
