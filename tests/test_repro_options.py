"""``python -m needle.repro``'s options for a run on a GPU's own memory and in a notebook-sized
heap: ``--limit none`` (no emulated limit) and fractions of the device (``--limit 0.5``), the
per-step memory record (allocated, reserved, the driver's free bytes on a GPU) in repro.json,
``--extra-objects`` (tracked objects every full collection scans) and the ``hook_full`` mode
(the hook with full collections only), with each mode's collector share. Small sizes: seconds
per run. The modes themselves are tested in test_pressure.py (and on the GPU in test_cuda.py).
"""

import json
import subprocess
import sys

import pytest

from needle import memory

from devices import DEVICES

SMALL = ["--batch-size", "32", "--seq-len", "10", "--words", "20000"]


def repro(tmp_path, device, *args):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "needle.repro", "--device", device.name, *SMALL, *args]
    proc = subprocess.run(cmd + ["--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = {r["mode"]: r for r in json.loads((out / "repro.json").read_text())}
    return proc.stdout, report


@pytest.mark.parametrize("device", DEVICES)
def test_no_limit_and_the_memory_of_each_step(tmp_path, device):
    stdout, report = repro(
        tmp_path, device, "--limit", "none", "--modes", "hook,cycle_free", "--steps", "4"
    )
    assert "limit: none (the device's own memory)" in stdout
    assert set(report) == {"hook", "cycle_free"}
    for r in report.values():
        assert r["limit_bytes"] is None and not r["oom"] and r["steps"] == 4
        assert [s["step"] for s in r["samples"]] == [1, 2, 3, 4]
        for s in r["samples"]:
            assert set(s) == {"step", "allocated", "reserved", "free"}
            assert 0 < s["allocated"] <= s["reserved"]
            if device.name == "cuda":  # the driver's view: what is left beside needle's
                assert (
                    0 < s["free"]
                    and s["free"] + s["reserved"]
                    <= memory.memory_stats(device)["device_capacity_bytes"]
                )
            else:
                assert s["free"] is None
        assert max(s["allocated"] for s in r["samples"]) <= r["peak_allocated_bytes"]
    assert "memory after each step (MiB)" in stdout
    # the same numbers in both graph modes: the record is of the same training
    assert report["hook"]["last_loss"] == pytest.approx(report["cycle_free"]["last_loss"])


@pytest.mark.parametrize("device", DEVICES)
def test_limit_as_a_fraction_of_the_device(tmp_path, device):
    capacity = memory.memory_stats(device)["device_capacity_bytes"]
    stdout, report = repro(
        tmp_path, device, "--limit", "0.5", "--modes", "cycle_free", "--steps", "1"
    )
    assert report["cycle_free"]["limit_bytes"] == int(0.5 * capacity)
    assert "limit: 0.5 as given" in stdout


@pytest.mark.parametrize("limit", ["1.5", "lots", "-1GiB"])
def test_bad_limit_is_refused(tmp_path, limit):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "needle.repro",
            "--device",
            "cpu",
            *SMALL,
            f"--limit={limit}",
            "--modes",
            "cycle_free",
            "--steps",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert f"needle.repro: --limit {limit!r}: " in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--limit", "none", "--modes", "gc_blind"], "cannot run gc_blind"),
        (["--extra-objects", "-1"], "--extra-objects must be >= 0"),
        (["--modes", "hook_ful"], "unknown mode"),
    ],
)
def test_bad_options_are_refused(args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "needle.repro", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_notebook_heap_and_the_full_collection_hook(tmp_path):
    """With 20k extra tracked objects under the calibrated limit: every mode trains the same
    numbers; hook_full's collections are all full ones, hook's start scoped; the collector's
    share of the loop is reported for each mode."""
    extra = 20_000
    _, report = repro(
        tmp_path,
        DEVICES[0].values[0],
        "--modes",
        "hook,manual,hook_full",
        "--steps",
        "6",
        "--extra-objects",
        str(extra),
    )
    hook, manual, full = report["hook"], report["manual"], report["hook_full"]
    for r in (hook, manual, full):
        assert r["extra_objects"] == extra and r["tracked_objects"] > extra
        assert not r["oom"] and r["steps"] == 6
        assert 0 < r["gc_share"] < 1 and r["gc_share"] == pytest.approx(
            r["gc_seconds"] / r["seconds"]
        )
        assert r["last_loss"] == hook["last_loss"]
    assert full["pressure_collections"] > 0 and full["scoped_collections"] == 0
    assert full["full_collections"] == full["pressure_collections"]
    assert hook["scoped_collections"] > 0
    assert manual["pressure_collections"] == 6  # the course's gc.collect(), one a batch
    assert manual["scoped_collections"] == 0 and manual["full_collections"] == 0
