"""bench/checkpoint_bench.py at tiny sizes (4 sequences, a vocabulary of 50, one timed step):
the lines each --scheme prints and that its ratios are those of its rows, not speed (never
asserted by timing). The gradients of the bench's construction are tested in
test_checkpoint.py."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devices import DEVICES

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "checkpoint_bench.py"
TINY = ["--steps", "1", "--batch", "4", "--vocab", "50", "--dropout", "0.1"]
MODELS = ["language_model", "transformer"]


def _run(*args):
    env = dict(os.environ)
    python_dir = str(ROOT / "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), python_dir) if p)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "option, schemes",
    [
        ([], ["wrapper", "sequential"]),
        (["--scheme", "both"], ["wrapper", "sequential"]),
        (["--scheme", "wrapper"], ["wrapper"]),
        (["--scheme", "sequential"], ["sequential"]),
    ],
    ids=["default", "both", "wrapper", "sequential"],
)
def test_each_scheme_prints_its_rows_and_ratios(device, option, schemes):
    proc = _run(*TINY, "--device", device.name, "--models", ",".join(MODELS), *option)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    machine, config, *rows = lines
    assert machine["machine"]["device"] == device.name
    assert config["config"]["scheme"] == (option[1] if option else "both")
    per_model = 1 + 2 * len(schemes)  # plain, each scheme's row, each scheme's ratios
    assert len(rows) == per_model * len(MODELS)
    for m, model in enumerate(MODELS):
        block = rows[m * per_model : (m + 1) * per_model]
        measured, ratios = block[: 1 + len(schemes)], block[1 + len(schemes) :]
        assert [r["model"] for r in block] == [model] * per_model
        assert [r["scheme"] for r in measured] == ["none", *schemes]
        assert [r["scheme"] for r in ratios] == schemes
        for r in measured:
            assert isinstance(r["peak_bytes"], int) and r["peak_bytes"] > 0
            assert math.isfinite(r["step_s"]) and r["step_s"] > 0
        plain = measured[0]
        for row, ratio in zip(measured[1:], ratios):
            assert ratio["peak_ratio"] == round(row["peak_bytes"] / plain["peak_bytes"], 3)
            pairs = sorted(t / b for t, b in zip(row["steps_s"], plain["steps_s"]))
            assert len(pairs) == 1  # --steps 1
            assert ratio["time_ratio"] == round(pairs[0], 3)
            assert ratio["targets"] == {"peak_ratio": 0.6, "time_ratio": 1.4}


def test_an_unknown_scheme_is_refused():
    proc = _run(*TINY, "--models", "transformer", "--scheme", "every_other")
    assert proc.returncode == 2
    assert "--scheme" in proc.stderr and "invalid choice" in proc.stderr
    assert not proc.stdout.strip()
