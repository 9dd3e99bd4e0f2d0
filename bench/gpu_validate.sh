#!/usr/bin/env bash
# gpu_validate.sh: everything needle can check on a GPU machine, in one command of under nine
# minutes (build included), written up as one markdown report ready to paste into
# docs/benchmarks.md.
#
#   bash bench/gpu_validate.sh [--out REPORT.md] [--budget SECONDS] [--only STEP,...] [--dry-run]
#
# Steps, in this order (the most wanted first: when the budget runs short the last ones go
# short or are skipped), each under its own timeout (a hang costs that step, not the run), each
# recorded as passed / failed / timed out / skipped with its time and key figures; a failing
# step does not stop the next ones:
#   build       needle in place for this GPU (NEEDLE_CUDA=1, NEEDLE_CUDA_ARCH from nvidia-smi's
#               compute capability, NEEDLE_STRICT=1, given to setup.py alone); the compilers
#               (CC, CXX, CFLAGS) are the environment's, untouched; no pip, no network
#   cuda        ndl.cuda.is_available(), the GEMM backend, or why CUDA is unavailable
#   nccl        needle.distributed on the GPU, one rank: the collectives through the MPI backend
#               (staged through host memory), then through NCCL (the nvidia-nccl-cu13 wheel's
#               library, or NEEDLE_NCCL): tests/distributed/collectives.py; needs mpi4py
#   suite       the CUDA tests (-m cuda) with NEEDLE_REQUIRE_CUDA=1 (they fail, not skip, when
#               the GPU cannot be used), junit XML kept; NEEDLE_VALIDATE_SUITE=all runs the whole
#               suite instead (the CPU tests in parallel pytest processes over disjoint files,
#               then the CUDA and paced ones: several minutes), any other value is a list of
#               pytest arguments for one plain run
#   census      bench/gpu_census.py --device cuda --torch: the step's kernel launches, BLAS
#               calls, host syncs, device mallocs and copies, beside PyTorch's profiler's
#   ptb         bench/ptb_train.py --device cuda --graphs: needle against PyTorch on the GPU,
#               eager and each captured in a CUDA graph; then bench/gpu_census.py --graphs
#               --check: the host launches of a replayed step (issue 37: at most 3)
#   dtypes      bench/gemm_dtype_bench.py --n 4096: float32/bfloat16/float16 products against
#               PyTorch's (issue 22: bfloat16 >= 0.8 of PyTorch's throughput), then
#               bench/amp_bench.py --device cuda: the course transformer's step under autocast
#   real_oom    bench/real_oom.py --device cuda: the leak with gc.disable() and no limit fills
#               the GPU (OutOfMemoryError with the device's figures), the process trains again
#               after cleanup, and with the hook the same loop never runs out
#   repro_real  needle.repro with no emulated limit (--limit none), every mode, 200 steps,
#               allocated / reserved / the driver's free memory per step (repro.json kept)
#   repro_heap  needle.repro with a notebook-sized heap (--extra-objects 150000): hook,
#               manual and hook_full, the collector's share of the time
#   ncu         Nsight Compute's per-kernel times of two training steps (bench/ncu_steps.py
#               marks them with NVTX) when ncu is installed
#   reduce      bench/cuda_reduce_bench.py: reductions against PyTorch
#   bmm         bench/cuda_batched_matmul.py: the attention's strided batched matmuls, each way
#               needle has (pointer arrays, compaction, its own kernel) against PyTorch
#   repro       python -m needle.repro --device cuda (its calibrated memory limit)
#   memcheck    compute-sanitizer --tool memcheck over the CUDA tests of test_cuda_ops.py,
#               test_cuda_transfer.py, test_cuda_memory.py, test_cuda_device.py,
#               test_cuda_cublas.py, test_cuda_streams.py and test_cuda_graphs.py
#   racecheck   compute-sanitizer --tool racecheck over the reduction tests
# Within the default budget the sanitizers, last, may be cut short or skipped ("skipped: out of
# time"); `--only memcheck,racecheck` runs them in a call of their own.
# --only runs the steps named (build them first unless needle is already built in place).
# The report goes to --out, else $OUT/gpu_validate.md when $OUT is set, else
# ./gpu_validate.md; each step's full log (and repro's JSON) goes beside it (gpu_validate_logs/).
#
# Without a GPU (or with --dry-run) nothing is built or run: each step checks that its tools,
# files and options exist (the build: that setup.py accepts the exact build environment) and is
# reported "skipped: no GPU", so a typo shows before the first real run.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2

ALL_STEPS=(build cuda nccl suite census ptb dtypes real_oom repro_real repro_heap ncu reduce bmm
    repro memcheck racecheck)
REPORT=""
BUDGET=520
DRY_RUN=0
ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
    --out)
        REPORT="${2:?--out needs a path}"
        shift 2
        ;;
    --budget)
        BUDGET="${2:?--budget needs seconds}"
        shift 2
        ;;
    --only)
        ONLY="${2:?--only needs step names}"
        shift 2
        ;;
    --dry-run)
        DRY_RUN=1
        shift
        ;;
    -h | --help)
        sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d'
        exit 0
        ;;
    *)
        echo "gpu_validate: unknown argument $1 (see --help)" >&2
        exit 2
        ;;
    esac
done
case "$BUDGET" in
'' | *[!0-9]*)
    echo "gpu_validate: --budget $BUDGET: expected whole seconds" >&2
    exit 2
    ;;
esac
if [ -n "$ONLY" ]; then
    for name in ${ONLY//,/ }; do
        if [[ " ${ALL_STEPS[*]} " != *" $name "* ]]; then
            echo "gpu_validate: --only: unknown step $name (steps: ${ALL_STEPS[*]})" >&2
            exit 2
        fi
    done
fi
# wanted STEP: whether this run does STEP (all of them unless --only names some).
wanted() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }

if [ -z "$REPORT" ]; then
    if [ -n "${OUT:-}" ]; then REPORT="$OUT/gpu_validate.md"; else REPORT="$ROOT/gpu_validate.md"; fi
fi
mkdir -p "$(dirname "$REPORT")"
LOGS="$(cd "$(dirname "$REPORT")" && pwd)/gpu_validate_logs"
mkdir -p "$LOGS"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/needle-gpu-validate.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

PY="${PYTHON:-python3}"
START=$(date +%s)
DEADLINE=$((START + BUDGET))
# The root holds needle_c built in place; python/ holds needle.
export PYTHONPATH="$ROOT:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

# ------------------------------------------------------------------- the machine

have() { command -v "$1" >/dev/null 2>&1; }

# The compute capability is COMPUTE_CAP, never CC: CC is the C compiler setuptools runs, and
# an exported CC (CC=/opt/gcc/bin/gcc) must reach the build as it is.
GPU_NAME="none"
DRIVER="none"
COMPUTE_CAP=""
if have nvidia-smi; then
    q="$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null |
        head -n 1)"
    if [ -n "$q" ]; then
        GPU_NAME="$(echo "$q" | cut -d, -f1 | sed 's/^ *//;s/ *$//')"
        DRIVER="$(echo "$q" | cut -d, -f2 | sed 's/^ *//;s/ *$//')"
        COMPUTE_CAP="$(echo "$q" | cut -d, -f3 | tr -d ' .')"
    fi
fi
HAS_GPU=0
if [ -n "$COMPUTE_CAP" ] && [ "$DRY_RUN" = 0 ]; then HAS_GPU=1; fi

# The build's own variables, given to setup.py alone (the steps after it do not see them).
BUILD_ENV=(NEEDLE_CUDA=1 "NEEDLE_CUDA_ARCH=${COMPUTE_CAP:-90}" NEEDLE_STRICT=1)
BUILD_CMD=("$PY" setup.py build_ext --inplace -q)
COMPILERS="CC=${CC-(unset)}, CXX=${CXX-(unset)}, CFLAGS=${CFLAGS-(unset)}"

NVCC="nvcc"
if ! have nvcc && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
SANITIZER="compute-sanitizer"
if ! have compute-sanitizer && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    SANITIZER=/usr/local/cuda/bin/compute-sanitizer
fi
NCU=""
if have ncu; then
    NCU=ncu
else
    for candidate in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
        if [ -x "$candidate" ]; then NCU="$candidate"; fi
    done
fi
version_of() { # a command's first line that names a version, or "absent"
    if have "$1" || [ -x "$1" ]; then
        "$@" 2>&1 | grep -m 1 -iE 'release|version' | sed 's/^ *//' || echo "unknown"
    else
        echo "absent"
    fi
}
NVCC_VERSION="$(version_of "$NVCC" --version)"
SANITIZER_VERSION="$(version_of "$SANITIZER" --version)"
NCU_VERSION="absent"
if [ -n "$NCU" ]; then NCU_VERSION="$(version_of "$NCU" --version)"; fi
PY_VERSIONS="$("$PY" - <<'EOF' 2>/dev/null
import platform
parts = [f"Python {platform.python_version()}"]
for name in ("numpy", "torch", "pytest"):
    try:
        module = __import__(name)
        version = module.__version__
        if name == "torch":
            version += f" (CUDA {module.version.cuda})" if module.version.cuda else " (CPU only)"
        parts.append(f"{name} {version}")
    except ImportError:
        parts.append(f"{name} absent")
print(", ".join(parts))
EOF
)"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
CPUS="$(nproc 2>/dev/null || echo '?')"

# ------------------------------------------------------------------- steps

ROWS=()    # "| step | status | seconds | figures |" lines
DETAILS=() # markdown sections, one per step that has something to show
STEPS_LEFT=0
for name in "${ALL_STEPS[@]}"; do if wanted "$name"; then STEPS_LEFT=$((STEPS_LEFT + 1)); fi; done

# record NAME STATUS SECONDS FIGURES [DETAIL]
record() {
    ROWS+=("| $1 | $2 | $3 | $4 |")
    if [ -n "${5:-}" ]; then DETAILS+=("### $1"$'\n\n'"$5"); fi
    STEPS_LEFT=$((STEPS_LEFT - 1))
}

# The seconds a step may take: its own cap, or what is left of the budget less 10 s for each
# step after it (steps run in order of importance; the last ones go short first).
allowance() {
    local cap=$1 now left
    now=$(date +%s)
    left=$((DEADLINE - now - 10 * (STEPS_LEFT - 1)))
    if [ "$left" -lt "$cap" ]; then echo "$left"; else echo "$cap"; fi
}

# run NAME CAP CMD...: runs CMD under a timeout into $LOGS/NAME.log; sets STATUS and SECS.
run() {
    local name=$1 cap=$2 limit t0 rc
    shift 2
    limit=$(allowance "$cap")
    LOG="$LOGS/$name.log"
    if [ "$limit" -lt 10 ]; then
        STATUS="skipped: out of time"
        SECS=0
        echo "skipped: the run's budget was spent" >"$LOG"
        return 1
    fi
    t0=$(date +%s)
    {
        echo "\$ $*"
        echo "(timeout ${limit} s)"
    } >"$LOG"
    timeout --kill-after=15 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    SECS=$(($(date +%s) - t0))
    if [ "$rc" = 0 ]; then
        STATUS="passed"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        STATUS="timed out (${limit} s)"
    else
        STATUS="failed (exit $rc)"
    fi
    return "$rc"
}

# Dry run of a step: checks each "what:thing" (cmd:, file:, module:, option:TOOL:OPTION,
# help:SCRIPT:OPTION, collect:PYTEST-ARGS, build: setup.py accepts BUILD_ENV) and notes each
# note:TEXT in the report.
check() {
    local name=$1 problems=() notes=() item kind what
    shift
    for item in "$@"; do
        kind=${item%%:*}
        what=${item#*:}
        case "$kind" in
        cmd) have "$what" || [ -x "$what" ] || problems+=("command $what not found") ;;
        file) [ -e "$ROOT/$what" ] || problems+=("file $what missing") ;;
        note) notes+=("$what") ;;
        build)
            env "${BUILD_ENV[@]}" "$PY" setup.py --name >"$WORK/build.log" 2>&1 ||
                problems+=("setup.py refuses the build environment: $(tail -n 1 "$WORK/build.log")")
            ;;
        module) "$PY" -c "import $what" >/dev/null 2>&1 || problems+=("Python module $what missing") ;;
        option)
            # a tool's option ("option:TOOL:--flag"); a missing tool is reported by its cmd:
            # check
            local tool=${what%%:*} flag=${what#*:}
            if have "$tool" || [ -x "$tool" ]; then
                "$tool" --help 2>/dev/null | grep -q -- "$flag" ||
                    problems+=("$tool has no $flag option")
            fi
            ;;
        help)
            local target=${what%:*} option=${what##*:}
            # shellcheck disable=SC2086  # target is "-m module" or a script path
            "$PY" $target --help 2>/dev/null | grep -q -- "$option" ||
                problems+=("$target has no $option option")
            ;;
        collect)
            # shellcheck disable=SC2086  # what is a list of pytest arguments
            "$PY" -m pytest --collect-only -q -p no:cacheprovider $what >"$WORK/collect.log" 2>&1 ||
                problems+=("pytest cannot collect: $what")
            ;;
        esac
    done
    if [ ${#problems[@]} -eq 0 ]; then
        local remark=""
        if [ ${#notes[@]} -gt 0 ]; then remark=" ($(printf '%s; ' "${notes[@]}" | sed 's/; $//'))"; fi
        record "$name" "skipped: no GPU" 0 "checked: ready to run$remark" "${CHECK_DETAIL:-}"
    else
        local joined
        joined=$(printf '%s; ' "${problems[@]}")
        record "$name" "skipped: no GPU" 0 "problems: ${joined%; }" "${CHECK_DETAIL:-}"
    fi
    CHECK_DETAIL=""
}
CHECK_DETAIL="" # a check's markdown detail for the report, set just before it

# piece KIND FILE [ARGS]: bench/gpu_report.py's summary of a step's output, into PIECE (one
# line) and PIECE_DETAIL (markdown); both empty when it found nothing.
piece() {
    local out
    if out="$("$PY" "$ROOT/bench/gpu_report.py" "$@" 2>>"$LOG")"; then
        PIECE="$(echo "$out" | head -n 1)"
        PIECE_DETAIL="$(echo "$out" | tail -n +2)"
    else
        PIECE=""
        PIECE_DETAIL=""
    fi
}

tail_of() { tail -n "${2:-15}" "$1" | sed 's/^/    /'; }

# pytest's closing line ("3 passed, 1 skipped in 2.0s"), without its "=" padding.
pytest_summary() {
    grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected).* in [0-9.]+s' "$1" | tail -n 1 |
        tr -d '=' | sed 's/^ *//;s/ *$//'
}

# The suite in parallel without xdist: pytest processes over disjoint test files (largest
# first, each to the least loaded), "not cuda and not paced"; then the CUDA and paced tests in
# one process (one GPU, and a quiet machine for the timing-sensitive ones). Prints pytest-style
# FAILED/ERROR lines and a closing "N passed, ... in Ts" line; exit 1 when anything failed.
write_suite_runner() {
    cat >"$1" <<'PYEOF'
import glob, os, subprocess, sys, time
import xml.etree.ElementTree as ET

logs, jobs = sys.argv[1], int(sys.argv[2])
start = time.time()
files = sorted(glob.glob("tests/test_*.py")) + ["tests/fuzz"]


def size(path):
    paths = glob.glob(os.path.join(path, "*.py")) if os.path.isdir(path) else [path]
    return sum(os.path.getsize(p) for p in paths)


shards, loads = [[] for _ in range(jobs)], [0] * jobs
for f in sorted(files, key=size, reverse=True):
    i = loads.index(min(loads))
    shards[i].append(f)
    loads[i] += size(f)
base = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"]
runs = []
for i, shard in enumerate(s for s in shards if s):
    xml, log = f"{logs}/suite_{i}.xml", open(f"{logs}/suite_{i}.log", "w")
    cmd = base + ["-m", "not cuda and not paced", f"--junitxml={xml}"] + shard
    runs.append((xml, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
codes = [p.wait() for _, p in runs]
xml = f"{logs}/suite_cuda.xml"
with open(f"{logs}/suite_cuda.log", "w") as log:
    codes.append(
        subprocess.call(base + ["-m", "cuda or paced", f"--junitxml={xml}", "tests"],
                        stdout=log, stderr=subprocess.STDOUT)
    )
runs.append((xml, None))
totals = dict(tests=0, failures=0, errors=0, skipped=0)
for path, _ in runs:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        print(f"ERROR {path}: no junit report (the pytest process died)")
        totals["errors"] += 1
        continue
    for suite in root.iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
    for case in root.iter("testcase"):
        for kind, word in (("failure", "FAILED"), ("error", "ERROR")):
            node = case.find(kind)
            if node is not None:
                name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                message = " ".join((node.get("message") or "").split())[:150]
                print(f"{word} {name} - {message}")
passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
print(
    f"{passed} passed, {totals['failures']} failed, {totals['errors']} errors, "
    f"{totals['skipped']} skipped in {time.time() - start:.1f}s "
    f"({len(runs) - 1} parallel processes, then the cuda and paced tests)"
)
bad = totals["failures"] + totals["errors"] > 0 or any(c not in (0, 5) for c in codes)
sys.exit(1 if bad else 0)
PYEOF
}

MEMCHECK_TESTS=(tests/test_cuda_ops.py tests/test_cuda_transfer.py tests/test_cuda_memory.py
    tests/test_cuda_device.py tests/test_cuda_cublas.py tests/test_cuda_streams.py
    tests/test_cuda_graphs.py)
RACE_TESTS=(tests/test_reduce_outer.py tests/test_sum_accuracy.py)
CENSUS_SCRIPT=bench/gpu_census.py
NCCL_SCRIPT=tests/distributed/collectives.py
NCU_STEPS=(bench/ncu_steps.py --warmup 3 --steps 2)
NCU_ARGS=(--nvtx --nvtx-include "needle_steps/" --metrics gpu__time_duration.sum
    --clock-control none --csv)
REPRO_REAL=(-m needle.repro --device cuda --limit none --steps 200)
REPRO_HEAP=(-m needle.repro --device cuda --limit none --extra-objects 150000
    --modes "hook,manual,hook_full" --steps 100)
# The command line a step runs, for the dry run's report.
quoted() { printf '%q ' "$@" | sed 's/ $//'; }

if [ "$HAS_GPU" = 0 ]; then
    if wanted build; then
        CHECK_DETAIL="Would run: \`env $(quoted "${BUILD_ENV[@]}" "${BUILD_CMD[@]}")\`; compilers from
the environment: ${COMPILERS}$(if [ -z "$COMPUTE_CAP" ]; then
            echo " (NEEDLE_CUDA_ARCH from nvidia-smi on the GPU machine; 90 checked here)"
        fi)."
        check build "cmd:$NVCC" "file:setup.py" "module:setuptools" "module:numpy" "build:"
    fi
    if wanted cuda; then check cuda "module:needle"; fi
    if wanted nccl; then
        check nccl "module:mpi4py" "file:$NCCL_SCRIPT" \
            "note:libnccl.so.2 from the nvidia-nccl-cu13 wheel or NEEDLE_NCCL, on the GPU machine"
    fi
    if wanted suite; then check suite "module:pytest" "collect:-m cuda tests"; fi
    if wanted census; then
        if [ -e "$ROOT/$CENSUS_SCRIPT" ]; then
            check census "help:$CENSUS_SCRIPT:--torch" "help:$CENSUS_SCRIPT:--device" \
                "module:torch"
        else
            check census "note:$CENSUS_SCRIPT not there yet: the step will say so and be skipped"
        fi
    fi
    if wanted ptb; then
        check ptb "file:bench/ptb_train.py" "help:bench/ptb_train.py:--device" \
            "help:bench/ptb_train.py:--graphs" "help:$CENSUS_SCRIPT:--graphs" "module:torch"
    fi
    if wanted dtypes; then
        check dtypes "help:bench/gemm_dtype_bench.py:--n" "help:bench/amp_bench.py:--modes"
    fi
    if wanted real_oom; then
        check real_oom "help:bench/real_oom.py:--max-steps" "help:bench/real_oom.py:--device"
    fi
    if wanted repro_real; then
        check repro_real "help:-m needle.repro:--limit" "help:-m needle.repro:--out"
    fi
    if wanted repro_heap; then
        check repro_heap "help:-m needle.repro:--extra-objects" "help:-m needle.repro:hook_full"
    fi
    if wanted ncu; then
        if [ -n "$NCU" ]; then
            check ncu "cmd:$NCU" "option:$NCU:--nvtx-include" "option:$NCU:--clock-control" \
                "help:${NCU_STEPS[0]}:--warmup" "file:bench/gpu_report.py" "module:torch"
        else
            check ncu "help:${NCU_STEPS[0]}:--warmup" "file:bench/gpu_report.py" \
                "note:ncu not found here: the step is skipped where it is missing"
        fi
    fi
    if wanted reduce; then
        check reduce "file:bench/cuda_reduce_bench.py" "help:bench/cuda_reduce_bench.py:--quick"
    fi
    if wanted bmm; then
        check bmm "help:bench/cuda_batched_matmul.py:--ways"
    fi
    if wanted repro; then
        check repro "help:-m needle.repro:--device" "help:-m needle.repro:--out"
    fi
    if wanted memcheck; then
        check memcheck "cmd:$SANITIZER" "option:$SANITIZER:--target-processes" \
            "collect:-m cuda ${MEMCHECK_TESTS[*]}"
    fi
    if wanted racecheck; then
        check racecheck "cmd:$SANITIZER" "option:$SANITIZER:--print-limit" \
            "collect:-m cuda ${RACE_TESTS[*]}"
    fi
else
    if wanted build; then
        # For this GPU only (one architecture: fast), strict, in place; the build variables go
        # to setup.py alone and the compilers are the environment's.
        run build 240 env "${BUILD_ENV[@]}" "${BUILD_CMD[@]}"
        record build "$STATUS" "$SECS" "sm_$COMPUTE_CAP, $(grep -m 1 -o 'CUDA compile took [0-9.]* s' "$LOG" ||
            echo 'no CUDA compile line')" "Compilers: ${COMPILERS}.$(if [ "$STATUS" != passed ]; then
            echo
            tail_of "$LOG" 30
        fi)"
    fi

    if wanted cuda; then
        # cuda: is the GPU usable, and which GEMM runs.
        run cuda 30 "$PY" -c '
import needle as ndl
print("available:", ndl.cuda.is_available())
print("reason:", ndl.cuda.unavailable_reason())
print("devices:", ndl.cuda.device_count())
print("gemm:", ndl.cuda.gemm_backend())
print("mem_get_info:", ndl.cuda.mem_get_info())
assert ndl.cuda.is_available(), ndl.cuda.unavailable_reason()
'
        record cuda "$STATUS" "$SECS" "$(grep -m 1 '^gemm:' "$LOG" | cut -c7- || echo '-')" \
            "$(tail_of "$LOG" 8)"
    fi

    if wanted nccl; then
        # nccl: a one-rank group on the GPU (MPI's singleton start), the MPI backend's staging
        # first, then NCCL's calls on needle's stream; each run prints "done" when all passed.
        run nccl 60 bash -c "$(quoted "$PY" "$NCCL_SCRIPT" cuda) &&
            $(quoted "$PY" "$NCCL_SCRIPT" --nccl cuda)"
        record nccl "$STATUS" "$SECS" "$(grep -c '^done' "$LOG") of 2 runs done" \
            "$(tail_of "$LOG" 12)"
    fi

    export NEEDLE_REQUIRE_CUDA=1

    if wanted suite; then
        # suite: the CUDA tests, failing (not skipping) without a usable GPU; the slowest listed.
        if [ "${NEEDLE_VALIDATE_SUITE:-}" = all ]; then
            write_suite_runner "$WORK/suite.py"
            JOBS=$((CPUS / 2))
            if [ "$JOBS" -gt 8 ]; then JOBS=8; fi
            if [ "$JOBS" -lt 1 ]; then JOBS=1; fi
            run suite 400 "$PY" "$WORK/suite.py" "$LOGS" "$JOBS"
        elif [ -n "${NEEDLE_VALIDATE_SUITE:-}" ]; then
            # shellcheck disable=SC2086  # NEEDLE_VALIDATE_SUITE is a list of pytest arguments
            run suite 300 "$PY" -m pytest -q -rfE -p no:cacheprovider \
                --junitxml="$LOGS/suite.xml" $NEEDLE_VALIDATE_SUITE
        else
            run suite 180 "$PY" -m pytest -q -rfE -p no:cacheprovider --durations=10 \
                --junitxml="$LOGS/suite.xml" -m cuda tests
        fi
        SUMMARY="$(pytest_summary "$LOG")"
        record suite "$STATUS" "$SECS" "${SUMMARY:-no summary line}" \
            "$(grep -E '^(FAILED|ERROR) ' "$LOG" | head -n 40 | sed 's/^/    /')"
    fi

    if wanted census; then
        # census: the step's GPU work, needle's counters beside PyTorch's profiler.
        if [ -e "$ROOT/$CENSUS_SCRIPT" ]; then
            run census 60 "$PY" "$CENSUS_SCRIPT" --device cuda --torch
            piece census "$LOG"
            record census "$STATUS" "$SECS" "${PIECE:-no JSON lines}" \
                "${PIECE_DETAIL:-$(tail_of "$LOG" 20)}"
        else
            echo "$CENSUS_SCRIPT missing" >"$LOGS/census.log"
            record census "skipped: $CENSUS_SCRIPT missing" 0 "-"
        fi
    fi

    if wanted ptb; then
        # ptb: a training step, needle against PyTorch, both on the GPU, eager and in CUDA
        # graphs; then the host launches of a replayed step.
        run ptb 180 bash -c "$(quoted "$PY" bench/ptb_train.py --device cuda --steps 20 \
            --warmup 3 --graphs) && $(quoted "$PY" "$CENSUS_SCRIPT" --graphs --check)"
        TABLE="$(sed -n '/^device: cuda/,$p' "$LOG" | sed 's/^/    /')"
        RATIO="$(awk '$2 ~ /^needle/ { print $1 " " $2 " " $(NF-1) " " $NF }' "$LOG" |
            tr '\n' ' ')"
        record ptb "$STATUS" "$SECS" "needle/torch step time: ${RATIO:--}" \
            "${TABLE:-$(tail_of "$LOG" 20)}"
    fi

    if wanted dtypes; then
        # dtypes: products in each dtype against PyTorch's, then the step under autocast.
        run dtypes 90 bash -c "$(quoted "$PY" bench/gemm_dtype_bench.py --device cuda --n 4096 \
            --dtypes float32,bfloat16,float16) && $(quoted "$PY" bench/amp_bench.py --device cuda \
            --steps 5)"
        RATIO="$(grep -o '"dtype": "bfloat16"[^}]*"needle_over_torch_throughput": [0-9.]*' "$LOG" |
            grep -o '[0-9.]*$' || true)"
        record dtypes "$STATUS" "$SECS" "bfloat16 GEMM needle/torch: ${RATIO:--}" \
            "$(tail_of "$LOG" 12)"
    fi

    if wanted real_oom; then
        # real_oom: the GPU's own memory runs out; recovery; the hook.
        run real_oom 90 "$PY" bench/real_oom.py --device cuda
        VERDICT="$(grep -m 1 '^real_oom: ' "$LOG" | cut -c11- || true)"
        record real_oom "$STATUS" "$SECS" "${VERDICT:-no verdict}" \
            "$(grep -E '^(leak|recover|hook): ' "$LOG" | sed 's/^/    /' || tail_of "$LOG" 20)"
    fi

    if wanted repro_real; then
        # repro_real: every mode on the GPU's own memory, its state after every step.
        run repro_real 120 "$PY" "${REPRO_REAL[@]}" --out "$LOGS/repro_real"
        piece repro "$LOGS/repro_real/repro.json"
        record repro_real "$STATUS" "$SECS" "${PIECE:-no repro.json}" \
            "${PIECE_DETAIL:-$(tail_of "$LOG" 20)}"
    fi

    if wanted repro_heap; then
        # repro_heap: a notebook's heap; what each collector costs.
        run repro_heap 90 "$PY" "${REPRO_HEAP[@]}" --out "$LOGS/repro_heap"
        piece repro "$LOGS/repro_heap/repro.json"
        record repro_heap "$STATUS" "$SECS" "${PIECE:-no repro.json}" \
            "${PIECE_DETAIL:-$(tail_of "$LOG" 20)}"
    fi

    if wanted ncu; then
        # ncu: the kernels of two steps, by time.
        if [ -n "$NCU" ]; then
            run ncu 120 "$NCU" "${NCU_ARGS[@]}" "$PY" "${NCU_STEPS[@]}"
            piece ncu "$LOG" --steps 2
            record ncu "$STATUS" "$SECS" "${PIECE:-no kernel rows}" \
                "${PIECE_DETAIL:-$(tail_of "$LOG" 20)}"
        else
            echo "ncu not found (PATH, /usr/local/cuda/bin, /opt/nvidia)" >"$LOGS/ncu.log"
            record ncu "skipped: ncu not found" 0 "-"
        fi
    fi

    if wanted reduce; then
        # reduce: the outer-axis kernel against PyTorch.
        run reduce 45 "$PY" bench/cuda_reduce_bench.py
        TABLE="$(sed -n '/^GPU reductions/,$p' "$LOG" | sed 's/^/    /')"
        record reduce "$STATUS" "$SECS" "see table" "${TABLE:-$(tail_of "$LOG" 20)}"
    fi

    if wanted bmm; then
        # bmm: how needle's batched matmuls over non-collapsing strides should run (issue 20).
        run bmm 40 "$PY" bench/cuda_batched_matmul.py
        TABLE="$(sed -n '/^batched matmuls/,$p' "$LOG" | sed 's/^/    /')"
        record bmm "$STATUS" "$SECS" "see table" "${TABLE:-$(tail_of "$LOG" 20)}"
    fi

    if wanted repro; then
        # repro: the leak and its fixes on the GPU, under the calibrated memory limit.
        run repro 60 "$PY" -m needle.repro --device cuda --steps 15 --out "$LOGS/repro"
        LIMIT_LINE="$(grep -m 1 -E '^(calibration|limit):' "$LOG" || echo 'limit: ?')"
        TABLE="$(sed -n '/^limit: /,/^$/p' "$LOG" | sed 's/^/    /')"
        record repro "$STATUS" "$SECS" "$LIMIT_LINE" "${TABLE:-$(tail_of "$LOG" 20)}"
    fi

    if wanted memcheck; then
        # memcheck: out-of-bounds and misaligned accesses, leaks off (Python owns the heap).
        # Only the pytest process is instrumented: tests that start their own Python (the
        # repro, NEEDLE_CUBLAS on and off) run at full speed.
        run memcheck 120 "$SANITIZER" --tool memcheck --target-processes application-only \
            --error-exitcode 99 --print-limit 20 \
            "$PY" -m pytest -q -x -p no:cacheprovider -m cuda "${MEMCHECK_TESTS[@]}"
        ERRORS="$(grep -m 1 -o 'ERROR SUMMARY: [0-9]* errors\?' "$LOG" || echo 'no summary')"
        record memcheck "$STATUS" "$SECS" "$ERRORS; $(pytest_summary "$LOG")" \
            "$(if [ "$STATUS" != passed ]; then tail_of "$LOG" 30; fi)"
    fi

    if wanted racecheck; then
        # racecheck: shared-memory hazards of the reduction kernels.
        run racecheck 60 "$SANITIZER" --tool racecheck --target-processes application-only \
            --error-exitcode 99 --print-limit 20 \
            "$PY" -m pytest -q -x -p no:cacheprovider -m cuda -k "not long" "${RACE_TESTS[@]}"
        ERRORS="$(grep -m 1 -o 'RACECHECK SUMMARY: [0-9]* hazards\? displayed.*' "$LOG" ||
            grep -m 1 -o 'ERROR SUMMARY: [0-9]* errors\?' "$LOG" || echo 'no summary')"
        record racecheck "$STATUS" "$SECS" "$ERRORS; $(pytest_summary "$LOG")" \
            "$(if [ "$STATUS" != passed ]; then tail_of "$LOG" 30; fi)"
    fi
fi

# ------------------------------------------------------------------- the report

TOTAL=$(($(date +%s) - START))
{
    echo "## GPU validation: $(date -u +%Y-%m-%d) on ${GPU_NAME}"
    echo
    echo "Command: \`bash bench/gpu_validate.sh${ONLY:+ --only $ONLY}\` (needle ${COMMIT}, $TOTAL s in all$(
        if [ "$HAS_GPU" = 0 ]; then echo ', dry run: no GPU'; fi
    ))."
    echo
    echo "- GPU: ${GPU_NAME}, compute capability ${COMPUTE_CAP:-?}, driver ${DRIVER}; ${CPUS} CPUs"
    echo "- CUDA: nvcc ${NVCC_VERSION}; compute-sanitizer ${SANITIZER_VERSION}; ncu ${NCU_VERSION}"
    echo "- Build: compilers from the environment: ${COMPILERS}"
    echo "- ${PY_VERSIONS:-Python unknown}"
    echo
    echo "| step | result | seconds | key figures |"
    echo "|---|---|---|---|"
    for row in "${ROWS[@]}"; do echo "$row"; done
    for detail in "${DETAILS[@]+"${DETAILS[@]}"}"; do
        echo
        echo "$detail"
    done
    echo
    echo "Full logs: \`$(basename "$LOGS")/\` beside this report."
} >"$REPORT"

echo "gpu_validate: wrote $REPORT ($TOTAL s)"
cat "$REPORT"
# Exit status: 0 when every step that ran passed (a dry run passes when its checks found
# nothing wrong), 1 otherwise.
if printf '%s\n' "${ROWS[@]}" | grep -qE '\| (failed|timed out)|problems:'; then exit 1; fi
exit 0
