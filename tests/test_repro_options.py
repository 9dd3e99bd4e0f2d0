"""``python -m needle.repro``'s options for a run on a GPU's own memory and in a notebook-sized
heap: ``--limit none`` (no emulated limit) and fractions of the device (``--limit 0.5``), the
per-step memory record (allocated, reserved, the driver's free bytes on a GPU) in repro.json,
``--extra-objects`` (tracked objects every full collection scans) and the ``hook_full`` mode
(the hook with full collections only), with each mode's collector share, and the progress shown
while a mode trains (tqdm's bar when it is installed, lines on stderr when not, nothing with
``--no-progress``). Small sizes: seconds per run. The modes themselves are tested in
test_pressure.py (and on the GPU in test_cuda_memory.py).
"""

import re

import pytest

from needle import memory
from needle.repro import SAMPLE_KEYS

from devices import DEVICES
from repro_run import env_with_tqdm, repro_report, run_repro


def repro(tmp_path, device, *args):
    """Runs the repro on ``device``; returns (its stdout, {mode: record})."""
    proc, report = repro_report(tmp_path, "--device", device.name, *args)
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
            assert tuple(s) == SAMPLE_KEYS
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
    proc = run_repro(
        "--device",
        "cpu",
        f"--limit={limit}",
        "--modes",
        "cycle_free",
        "--steps",
        "1",
        out=tmp_path,
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
    proc = run_repro("--device", "cpu", *args, small=False, timeout=120)
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


# "<mode> step <i>/<n>  loss <x>  allocated <size>": the training loops' progress line.
PROGRESS_LINE = re.compile(r"^(\w+) step (\d+)/(\d+)  loss (\S+)  allocated \S+ \S+$")


def test_progress_lines_without_tqdm_and_none_with_no_progress(tmp_path):
    """Without tqdm each mode's steps show as lines on stderr (the calibration's two steps too),
    their losses those the report records; stdout holds the table only. ``--no-progress``
    shows none and trains the same numbers."""
    args = ("--device", "cpu", "--modes", "cycle_free", "--steps", "3")
    env = env_with_tqdm(tmp_path, installed=False)
    shown, report = repro_report(tmp_path / "shown", *args, env=env)
    lines = [PROGRESS_LINE.match(line) for line in shown.stderr.splitlines()]
    assert all(lines), shown.stderr
    steps = [(m[1], int(m[2]), int(m[3])) for m in lines]
    assert steps == [("calibration", 1, 2), ("calibration", 2, 2)] + [
        ("cycle_free", i, 3) for i in (1, 2, 3)
    ]
    assert float(lines[-1][4]) == pytest.approx(report["cycle_free"]["last_loss"], abs=1e-4)
    assert "calibration step" not in shown.stdout and "cycle_free step" not in shown.stdout
    quiet, quiet_report = repro_report(tmp_path / "quiet", *args, "--no-progress", env=env)
    assert quiet.stderr == ""
    assert quiet_report["cycle_free"]["last_loss"] == report["cycle_free"]["last_loss"]


def test_progress_is_a_tqdm_bar_when_tqdm_is_installed(tmp_path):
    env = env_with_tqdm(tmp_path, installed=True)
    proc, _ = repro_report(
        tmp_path, "--device", "cpu", "--modes", "cycle_free", "--steps", "2", env=env
    )
    assert proc.stderr.splitlines() == [
        "fake tqdm calibration 1/2",
        "fake tqdm calibration 2/2",
        "fake tqdm cycle_free 1/2",
        "fake tqdm cycle_free 2/2",
    ]
