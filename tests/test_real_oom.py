"""bench/real_oom.py at small sizes: the course's leak with Python's collector disabled runs a
device out of memory for real (the CPU under a limit; on needle's CUDA simulator its own
memory, NEEDLE_SIM_MEMORY, with no limit; on a GPU an emulated limit, since filling 80 GB with
small steps would take minutes), the OutOfMemoryError carries the device's figures, the same
process trains again after cleanup, and with the hook on the same loop never runs out."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import needle_c

from devices import DEVICES

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "real_oom.py"
SMALL = ["--batch-size", "32", "--seq-len", "10", "--words", "20000", "--recover-steps", "2"]
MiB = 2**20


def run_script(*args, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEEDLE_SIM_")}
    env.pop("NEEDLE_MEMORY_LIMIT", None)
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_real_out_of_memory_recovery_and_the_hook(device):
    simulated = device.name == "cuda" and needle_c._cuda_simulated()
    if simulated:  # the simulated GPU's own memory, no limit: cudaMalloc itself fails
        # 128 MiB: cuBLAS's workspace (32 MiB, the stand-in's on a simulated H100) stays put
        limit, proc = None, run_script("--device", "cuda", *SMALL, NEEDLE_SIM_MEMORY="128MiB")
    else:
        limit = 128 * MiB
        proc = run_script("--device", device.name, "--limit", "128MiB", *SMALL)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    leak, recover, hook, summary = rows
    assert [r["phase"] for r in rows] == ["leak", "recover", "hook", "summary"]
    assert summary == {"phase": "summary", "ok": True, "failures": []}

    assert leak["oom"] and leak["oom_step"] >= 2 and leak["device"] == str(device)
    e = leak["error"]
    assert e["limit"] == limit and e["requested"] > 0 and e["allocated"] <= e["reserved"]
    if simulated:
        assert leak["at_oom"]["total"] == 128 * MiB
        assert e["reserved"] + e["requested"] > 0.9 * 128 * MiB
        assert "limit none" in leak["message"]
    else:
        assert e["reserved"] + e["requested"] > limit
    assert f"out of memory on {device}" in leak["message"]

    assert recover["after_cleanup"]["allocated"] < leak["allocated_after_first_step"]
    assert len(recover["losses"]) == 2

    assert hook["steps"] == hook["steps_asked"] >= leak["oom_step"] + 3
    assert hook["pressure_collections"] + hook["oom_collections"] > 0
    assert "real_oom: PASS" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "cpu"], "--device cpu needs --limit"),
        (["--device", "cpu", "--limit", "1GiB", "--max-steps", "0"], "--max-steps must be"),
        (["--device", "tpu"], "invalid choice"),
    ],
)
def test_bad_arguments(args, message):
    proc = run_script(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_a_leak_that_never_runs_out_fails_the_run():
    """A limit the leak cannot reach in the steps allowed: the script says so and exits 1."""
    proc = run_script("--device", "cpu", "--limit", "0.9", "--max-steps", "2", *SMALL)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "real_oom: FAIL: the leak did not run out of memory in 2 steps" in proc.stdout
