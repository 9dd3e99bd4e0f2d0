"""bench/amp_bench.py and bench/gemm_dtype_bench.py at tiny sizes: the rows each prints, that
the ratios are those of its rows, and the machine header naming the narrow GEMM kernels; not
speed (never asserted by timing)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devices import DEVICES

ROOT = Path(__file__).resolve().parent.parent


def _run(script, *args):
    env = dict(os.environ)
    python_dir = str(ROOT / "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), python_dir) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("device", DEVICES)
def test_amp_bench_rows_and_ratios(device):
    machine, config, *rows = _run(
        "amp_bench.py", "--steps", "2", "--batch", "4", "--vocab", "50", "--device", device.name
    )
    assert machine["machine"]["device"] == device.name
    if device.name == "cpu":
        assert {"gemm_bfloat16", "gemm_float16"} <= set(machine["machine"]["cpu_kernels"])
    assert config["config"]["modes"] == "float32,bfloat16,float16"
    assert [r["mode"] for r in rows] == ["float32", "bfloat16", "float16"]
    base = rows[0]
    assert base["peak_ratio"] == 1.0 and base["time_ratio"] == 1.0
    for row in rows:
        assert row["peak_bytes"] > 0 and row["step_s"] > 0 and len(row["steps_s"]) == 2
        assert row["peak_ratio"] == round(row["peak_bytes"] / base["peak_bytes"], 3)
        # Pair by pair: the median (here the mean) of the two steps' ratios to float32's.
        pairs = [t / b for t, b in zip(row["steps_s"], base["steps_s"])]
        assert row["time_ratio"] == round(sum(pairs) / 2, 3)
        assert row["targets"] == {"peak_ratio": 0.6, "time_ratio": 1.0}
    # Narrow activations: the narrow modes peak below float32 even at this size.
    assert rows[1]["peak_bytes"] < base["peak_bytes"] and rows[2]["peak_bytes"] < base["peak_bytes"]


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_dtype_bench_rows(device):
    torch = pytest.importorskip("torch")
    machine, *rows = _run("gemm_dtype_bench.py", "--n", "64", "--device", device.name)
    assert machine["machine"]["device"] == device.name
    assert [r["dtype"] for r in rows] == ["float32", "float16", "bfloat16", "float64"]
    # PyTorch is the peer where it can run on the device (a CPU build has no CUDA: the
    # simulated GPU's rows have no PyTorch side).
    torch_runs = device.name == "cpu" or torch.cuda.is_available()
    for row in rows:
        assert row["n"] == 64 and row["needle_s"] > 0
        if not torch_runs:
            assert row["torch_s"] is None and row["needle_over_torch_throughput"] is None
            continue
        assert row["torch_s"] > 0
        assert row["needle_over_torch_throughput"] == pytest.approx(
            row["torch_s"] / row["needle_s"], rel=1e-2, abs=1e-3
        )
