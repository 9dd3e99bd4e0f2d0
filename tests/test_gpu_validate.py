"""bench/gpu_validate.sh, the one command for a GPU machine, kept runnable where there is no GPU:
its dry run checks every tool, file, option and test selection it would use and still writes
the report, so a broken step shows here before a GPU run is spent on it."""

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_validate.sh"
STEPS = ["build", "cuda", "suite", "memcheck", "racecheck", "repro", "ptb", "reduce"]


def test_dry_run_checks_every_step_and_writes_the_report(tmp_path):
    report = tmp_path / "out" / "gpu.md"
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--out", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    text = report.read_text()
    assert text.startswith("## GPU validation: ")
    assert "dry run: no GPU" in text
    rows = dict(re.findall(r"^\| (\w+) \| skipped: no GPU \| 0 \| (.*) \|$", text, re.M))
    assert list(rows) == STEPS
    for step, figures in rows.items():
        if figures == "checked: ready to run":
            continue
        # What a machine without the GPU tools may lack; anything else is a broken step.
        problems = figures.removeprefix("problems: ").split("; ")
        allowed = ("command compute-sanitizer not found", "Python module torch missing")
        assert all(p in allowed for p in problems), (step, figures)
    assert proc.returncode == (0 if all(f.startswith("checked") for f in rows.values()) else 1)
    assert (report.parent / "gpu_validate_logs").is_dir()


def test_bad_argument_is_refused():
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--no-such-option"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "unknown argument --no-such-option" in proc.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_is_clean():
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
