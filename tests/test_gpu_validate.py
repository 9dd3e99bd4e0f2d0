"""bench/gpu_validate.sh, the one command for a GPU machine, kept runnable where there is no GPU:
its dry run checks every tool, file, option and test selection it would use (and that setup.py
accepts the exact build environment) and still writes the report, so a broken step shows here
before a GPU run is spent on it. The build step runs for real against a stand-in nvidia-smi and
a Python that records what setup.py would have been given: an exported CC (the GPU machine has
CC=/opt/gcc/bin/gcc) reaches the build untouched. bench/gpu_report.py, which turns the steps'
JSON and CSV into the report's tables, is tested on made-up outputs of each kind."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_validate.sh"
REPORT_TOOL = ROOT / "bench" / "gpu_report.py"
STEPS = [
    "build",
    "cuda",
    "nccl",
    "suite",
    "census",
    "ptb",
    "dtypes",
    "real_oom",
    "repro_real",
    "repro_heap",
    "ncu",
    "reduce",
    "bmm",
    "repro",
    "memcheck",
    "racecheck",
]
READY = "checked: ready to run"
# A machine with an H100: what `nvidia-smi --query-gpu=name,driver_version,compute_cap` says.
FAKE_SMI = "#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 580.65.06, 9.0'\n"
# A Python that records the environment and arguments setup.py and `python -c` would get, and
# is the real interpreter for everything else (the script's version probe, its checks).
FAKE_PYTHON = """#!/bin/sh
case "$1" in
setup.py) env > "$RECORD/setup.env"; printf '%s\\n' "$@" > "$RECORD/setup.argv"
          echo "needle: CUDA compile took 1.0 s (16 parallel nvcc)"; exit 0 ;;
-c) env > "$RECORD/c.env"; echo "gemm: recorded"; exit 0 ;;
esac
exec {python} "$@"
"""


def run_script(*args, env=None, cwd=None, timeout=300):
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def rows_of(text):
    """{step: (result, key figures)} from the report's table of steps (the first table; the
    steps' own tables follow it)."""
    table = text.split("| step | result | seconds | key figures |", 1)[-1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (\w+) \| ([^|]+) \| \d+ \| (.*) \|$", table, re.M)
    return {step: (result, figures) for step, result, figures in rows}


def real_compiler():
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler on PATH")
    return cc


def machine(tmp_path, with_recorder=False):
    """An environment whose PATH has the stand-in nvidia-smi (and PYTHON the recorder), with a
    real compiler exported as CC and made-up CXX and CFLAGS that must reach setup.py as they
    are."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env.update(CC=real_compiler(), CXX="g++ -DNEEDLE_RECORDED", CFLAGS="-DNEEDLE_FROM_CFLAGS")
    env.pop("OUT", None)
    if with_recorder:
        record = tmp_path / "record"
        record.mkdir()
        python = bin_dir / "python-recorder"
        python.write_text(FAKE_PYTHON.format(python=sys.executable))
        python.chmod(0o755)
        env.update(PYTHON=str(python), RECORD=str(record))
    return env


def test_dry_run_checks_every_step_and_writes_the_report(tmp_path):
    report = tmp_path / "out" / "gpu.md"
    proc = run_script("--dry-run", "--out", str(report), cwd=tmp_path)
    text = report.read_text()
    assert text.startswith("## GPU validation: ")
    assert "dry run: no GPU" in text
    rows = rows_of(text)
    assert list(rows) == STEPS
    assert set(r[0] for r in rows.values()) == {"skipped: no GPU"}
    figures = {step: r[1] for step, r in rows.items()}
    for step, figure in figures.items():
        if figure.startswith(READY):
            continue
        # What a machine without the GPU tools may lack; anything else is a broken step.
        problems = figure.removeprefix("problems: ").split("; ")
        allowed = ("command compute-sanitizer not found", "Python module torch missing")
        assert all(p in allowed for p in problems), (step, figure)
    if not (ROOT / "bench" / "gpu_census.py").exists():
        assert "gpu_census.py not there yet" in figures["census"]
    if shutil.which("ncu") is None and not pathlib.Path("/usr/local/cuda/bin/ncu").exists():
        assert "ncu not found here" in figures["ncu"]
    ok = all(f.startswith(READY) for f in figures.values())
    assert proc.returncode == (0 if ok else 1), proc.stderr
    assert (report.parent / "gpu_validate_logs").is_dir()


def test_dry_run_shows_the_build_environment(tmp_path):
    """What the build would run, with the compute capability nvidia-smi gave and the
    environment's compilers: the exported CC, never the capability."""
    env = machine(tmp_path)
    report = tmp_path / "gpu.md"
    proc = run_script("--dry-run", "--only", "build", "--out", str(report), env=env, cwd=tmp_path)
    text = report.read_text()
    assert proc.returncode == 0, text + proc.stderr
    assert list(rows_of(text)) == ["build"]
    assert rows_of(text)["build"][1] == READY
    assert "on NVIDIA H100 80GB HBM3" in text and "compute capability 90," in text
    assert "NEEDLE_CUDA=1 NEEDLE_CUDA_ARCH=90 NEEDLE_STRICT=1" in text
    assert f"CC={env['CC']}," in text
    assert "CXX=g++ -DNEEDLE_RECORDED, CFLAGS=-DNEEDLE_FROM_CFLAGS" in text


def test_build_step_gets_the_exported_compiler(tmp_path):
    """The build step itself, on a machine that exports CC: setup.py gets that CC (and CXX and
    CFLAGS) unchanged, the capability only as NEEDLE_CUDA_ARCH, and the build variables stay
    with the build (the next step does not see them)."""
    env = machine(tmp_path, with_recorder=True)
    report = tmp_path / "gpu.md"
    proc = run_script("--only", "build,cuda", "--out", str(report), env=env, cwd=tmp_path)
    text = report.read_text()
    record = tmp_path / "record"
    setup_env = dict(
        line.split("=", 1)
        for line in (record / "setup.env").read_text().splitlines()
        if "=" in line
    )
    assert setup_env["CC"] == env["CC"]  # not "90"
    assert setup_env["CXX"] == env["CXX"] and setup_env["CFLAGS"] == env["CFLAGS"]
    assert setup_env["NEEDLE_CUDA_ARCH"] == "90"
    assert setup_env["NEEDLE_CUDA"] == "1" and setup_env["NEEDLE_STRICT"] == "1"
    assert (record / "setup.argv").read_text().split() == [
        "setup.py",
        "build_ext",
        "--inplace",
        "-q",
    ]
    next_env = (record / "c.env").read_text()
    assert f"CC={env['CC']}\n" in next_env and "NEEDLE_CUDA_ARCH=" not in next_env
    rows = rows_of(text)
    assert list(rows) == ["build", "cuda"]
    assert rows["build"] == ("passed", "sm_90, CUDA compile took 1.0 s")
    assert "dry run" not in text
    assert proc.returncode == 0, text + proc.stderr


# A Python that answers for the GPU steps' programs with made-up outputs of their real kinds
# (JSON lines, repro.json, summary lines), and is the real interpreter for everything else
# (bench/gpu_report.py included): the GPU path's plumbing, run without a GPU.
CANNED_PYTHON = """#!/bin/sh
case "$1" in
bench/real_oom.py) cat "$CANNED/real_oom.log"; exit 0 ;;
bench/gpu_census.py) cat "$CANNED/census.log"; exit 0 ;;
bench/ncu_steps.py) echo '{{"steps": 2}}'; exit 0 ;;
-m)
    out=""; prev=""
    for a in "$@"; do if [ "$prev" = --out ]; then out="$a"; fi; prev="$a"; done
    mkdir -p "$out" && cp "$CANNED/repro.json" "$out/repro.json"
    echo "$@" >> "$CANNED/repro.argv"; exit 0 ;;
esac
exec {python} "$@"
"""
# ncu: prints the made-up CSV after what it was asked to run, as the real one does.
CANNED_NCU = """#!/bin/sh
echo "$@" > "$CANNED/ncu.argv"
cat "$CANNED/ncu.csv"
"""


def test_gpu_steps_report_what_their_programs_printed(tmp_path):
    env = machine(tmp_path)
    canned = tmp_path / "canned"
    canned.mkdir()
    MiB = 2**20
    sample = {"step": 1, "allocated": 510 * MiB, "reserved": 600 * MiB, "free": 70000 * MiB}
    repro_rows = [
        {"mode": m, "steps": 200, "oom": False, "oom_step": None, "gc_share": share,
         "tracked_objects": 170000, "samples": [sample]}
        for m, share in (("hook", 0.009), ("manual", 0.33))
    ]  # fmt: skip
    (canned / "repro.json").write_text(json.dumps(repro_rows))
    (canned / "real_oom.log").write_text(
        '{"phase": "summary", "ok": true, "failures": []}\n'
        "leak: out of memory at step 150 on cuda(): requested 195.3 MiB\n"
        "recover: 512.0 MiB allocated after cleanup; losses 9.1, 9.0, 8.9\n"
        "hook: 225 of 225 steps, 0 pressure and 12 out-of-memory collections\n"
        "real_oom: PASS\n"
    )
    census = {"config": "transformer", "kernel_launches_per_step": 210, "blas_calls_per_step": 30,
              "host_syncs_per_step": 1, "device_mallocs_per_step": 0}  # fmt: skip
    (canned / "census.log").write_text(json.dumps(census) + "\n")
    (canned / "ncu.csv").write_text(ncu_output())
    bin_dir = tmp_path / "bin"
    for name, text in (("python-canned", CANNED_PYTHON.format(python=sys.executable)),
                       ("ncu", CANNED_NCU)):  # fmt: skip
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env.update(PYTHON=str(bin_dir / "python-canned"), CANNED=str(canned))
    steps = "census,real_oom,repro_real,repro_heap,ncu"
    report = tmp_path / "gpu.md"
    proc = run_script("--only", steps, "--out", str(report), env=env, cwd=tmp_path)
    text = report.read_text()
    rows = rows_of(text)
    assert list(rows) == steps.split(","), text
    if (ROOT / "bench" / "gpu_census.py").exists():
        assert rows["census"][0] == "passed"
        assert (
            rows["census"][1] == "transformer: 210 launches + 30 BLAS, 1 syncs, 0 mallocs per step"
        )
    else:
        assert rows["census"] == ("skipped: bench/gpu_census.py missing", "-")
    assert rows["real_oom"] == ("passed", "PASS")
    assert "    leak: out of memory at step 150 on cuda()" in text
    assert "    hook: 225 of 225 steps" in text
    repro_figures = "hook ok, gc 0.9%, max 510 MiB; manual ok, gc 33.0%, max 510 MiB"
    assert rows["repro_real"] == ("passed", repro_figures)
    assert rows["repro_heap"] == ("passed", repro_figures)
    assert "| manual | 200 | no | 33.0% | 510-510 | 600 | 70,000 | 170000 |" in text
    logs = report.parent / "gpu_validate_logs"
    assert (logs / "repro_real" / "repro.json").exists()  # the per-step record comes back
    repro_argv = (canned / "repro.argv").read_text().splitlines()
    assert "--limit none --steps 200" in repro_argv[0]
    assert "--extra-objects 150000 --modes hook,manual,hook_full" in repro_argv[1]
    assert rows["ncu"][0] == "passed"
    assert rows["ncu"][1].startswith("2 launches, 0.56 ms kernel time per step; top: reduce_kernel")
    assert "| `gemm_kernel` | 1.0 | 6.0 |" in text
    ncu_argv = (canned / "ncu.argv").read_text()
    assert "--nvtx --nvtx-include needle_steps/ --metrics gpu__time_duration.sum" in ncu_argv
    assert "bench/ncu_steps.py --warmup 3 --steps 2" in ncu_argv
    assert proc.returncode == 0, text + proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--no-such-option"], "unknown argument --no-such-option"),
        (["--only", "build,nope"], "--only: unknown step nope"),
        (["--budget", "9min"], "--budget 9min: expected whole seconds"),
    ],
)
def test_bad_argument_is_refused(args, message):
    proc = run_script(*args, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_help_lists_every_step():
    proc = run_script("--help", timeout=60)
    assert proc.returncode == 0
    for step in STEPS:
        assert re.search(rf"^#   {step} ", proc.stdout, re.M), step


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_is_clean():
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


# ------------------------------------------------------------ bench/gpu_report.py


def report_piece(tmp_path, kind, content, *args):
    path = tmp_path / f"{kind}.txt"
    path.write_text(content)
    return subprocess.run(
        [sys.executable, str(REPORT_TOOL), kind, str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_census_table(tmp_path):
    lines = [
        "needle 0.1.0 on cuda()",
        json.dumps(
            {
                "config": "transformer",
                "kernel_launches_per_step": 210,
                "blas_calls_per_step": 30,
                "host_syncs_per_step": 1,
                "device_mallocs_per_step": 0,
                "h2d_bytes_per_step": 40960,
                "d2h_bytes_per_step": 4,
                "torch_kernel_launches_per_step": 144,
            }
        ),
        json.dumps({"config": "lstm", "kernel_launches_per_step": 180, "blas_calls_per_step": 12}),
    ]
    proc = report_piece(tmp_path, "census", "\n".join(lines))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith("transformer: 210 launches + 30 BLAS, 1 syncs, 0 mallocs per step; ")
    assert out[0].endswith("lstm: 180 launches + 12 BLAS, ? syncs, ? mallocs per step")
    assert out[1].startswith("| config | kernel_launches_per_step | blas_calls_per_step |")
    assert "torch_kernel_launches_per_step |" in out[1]
    assert out[3] == "| transformer | 210 | 30 | 1 | 0 | 40,960 | 4 | 144 |"
    assert out[4] == "| lstm | 180 | 12 |  |  |  |  |  |"


def test_repro_table(tmp_path):
    MiB = 2**20
    report = [
        {
            "mode": "hook",
            "steps": 2,
            "oom": False,
            "oom_step": None,
            "gc_share": 0.009,
            "tracked_objects": 173000,
            "samples": [
                {"step": 1, "allocated": 500 * MiB, "reserved": 600 * MiB, "free": 70000 * MiB},
                {"step": 2, "allocated": 510 * MiB, "reserved": 620 * MiB, "free": 69000 * MiB},
            ],
        },
        {
            "mode": "gc_blind",
            "steps": 1,
            "oom": True,
            "oom_step": 2,
            "gc_share": 0.0,
            "samples": [
                {"step": 1, "allocated": 80 * MiB, "reserved": 90 * MiB, "free": None},
                {"step": 2, "allocated": 90 * MiB, "reserved": 96 * MiB, "free": None},
            ],
        },
    ]
    proc = report_piece(tmp_path, "repro", json.dumps(report))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "hook ok, gc 0.9%, max 510 MiB; gc_blind OOM at 2, gc 0.0%, max 90 MiB"
    assert out[3] == "| hook | 2 | no | 0.9% | 500-510 | 620 | 69,000 | 173000 |"
    assert out[4] == "| gc_blind | 1 | at 2 | 0.0% | 80-90 | 96 | - | - |"


def ncu_output():
    """What ncu --csv prints around the program's own output: a header, then one row per
    launch and metric (times in whatever unit suits each)."""
    header = [
        "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
        "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name",
        "Metric Unit", "Metric Value",
    ]  # fmt: skip
    launches = [
        ("gemm_kernel", "gpu__time_duration.sum", "usecond", "5.70"),
        ("binary_flat_kernel<op_add>", "gpu__time_duration.sum", "nsecond", "3,200"),
        ("gemm_kernel", "gpu__time_duration.sum", "usecond", "6.30"),
        ("reduce_kernel<reduce_sum, 32>", "gpu__time_duration.sum", "msecond", "1.1"),
        ("gemm_kernel", "sm__cycles_elapsed.avg", "cycle", "99"),  # not a time: ignored
    ]
    rows = [header] + [
        [str(i), "123", "python3.11", "127.0.0.1", name, "1", "7", "(256, 1, 1)", "(8, 1, 1)",
         "0", "9.0", "Command line profiler metrics", metric, unit, value]
        for i, (name, metric, unit, value) in enumerate(launches)
    ]  # fmt: skip
    lines = ["==PROF== Connected to process 123 (/usr/bin/python3.11)"]
    lines.append('{"device": "cuda()", "warmup": 3, "steps": 2, "losses": [9.2, 9.1]}')
    lines += [",".join(f'"{cell}"' for cell in row) for row in rows]
    lines.append("==PROF== Disconnected from process 123")
    return "\n".join(lines) + "\n"


def test_ncu_per_kernel_totals(tmp_path):
    proc = report_piece(tmp_path, "ncu", ncu_output(), "--steps", "2", "--top", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    total_us = 5.7 + 3.2 + 6.3 + 1100.0
    assert out[0].startswith("2 launches, 0.56 ms kernel time per step; top: reduce_kernel")
    assert out[1] == (
        f"2 kernel launches and {total_us / 2 / 1e3:.2f} ms of kernel time per step "
        "(3 kernels, 2 steps profiled)"
    )
    table = [line for line in out if line.startswith("| `")]
    assert table == [
        f"| `reduce_kernel<reduce_sum, 32>` | 0.5 | 550.0 | {100 * 1100 / total_us:.1f}% "
        "| 1,100.00 |",
        f"| `gemm_kernel` | 1.0 | 6.0 | {100 * 12 / total_us:.1f}% | 6.00 |",
    ]


@pytest.mark.parametrize(
    "kind, content",
    [("ncu", "==PROF== no kernels were profiled\n"), ("census", "no lines\n"), ("repro", "[]")],
)
def test_nothing_to_report(tmp_path, kind, content):
    proc = report_piece(tmp_path, kind, content)
    assert proc.returncode == 1 and "nothing to report" in proc.stderr


def test_unreadable_inputs(tmp_path):
    proc = report_piece(tmp_path, "repro", "{not json")
    assert proc.returncode == 1 and "is not a repro.json" in proc.stderr
    proc = subprocess.run(
        [sys.executable, str(REPORT_TOOL), "ncu", str(tmp_path / "missing.log")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "cannot read" in proc.stderr
