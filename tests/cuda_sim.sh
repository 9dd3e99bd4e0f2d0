#!/usr/bin/env bash
# Runs the real CUDA backend (csrc/cuda/*.cu: kernels, caching allocator) on
# the CPU: builds needle_c with NEEDLE_CUDA=sim (the .cu files compiled by g++
# against needle's CUDA simulator, csrc/cuda/sim) into build/sim, beside, not
# over, the normal install, and runs every cuda-marked test on it twice, with
# this checkout's python/ on the path: plainly, then with every grid capped at
# a few blocks and one warp per block held back (NEEDLE_SIM_MAX_BLOCKS,
# NEEDLE_SIM_PERTURB), which turns a missing barrier or a kernel that is not
# grid-stride into wrong results. The two runs go side by side (one core each;
# no cuda-marked test is timing-sensitive) and their logs are printed after;
# either failing fails the script. Then prints the census of the course's PTB training steps
# on the simulated GPU (bench/gpu_census.py), eager and replayed from a CUDA graph (--graphs
# --check fails the script past 3 host launches per replay). Prints how long each step took.
#   bash tests/cuda_sim.sh [pytest args...]     (default: every cuda-marked test in tests/)
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/sim
start=$SECONDS
NEEDLE_CUDA=sim NEEDLE_STRICT=1 python setup.py -q build_ext --build-temp "$out/temp" \
    --build-lib "$out/lib" >/dev/null
echo "cuda_sim: build took $((SECONDS - start)) s"
export PYTHONPATH="$out/lib:$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
# The device must be there (checked below); where the suite reads NEEDLE_REQUIRE_CUDA, a CUDA
# test case also fails rather than skips without it.
export NEEDLE_REQUIRE_CUDA=1
unset NEEDLE_SIM_MEMORY NEEDLE_SIM_MAX_BLOCKS NEEDLE_SIM_PERTURB NEEDLE_SIM_VMM
python - <<'PY'
import needle as ndl
import needle_c

assert needle_c._cuda_simulated(), f"{needle_c.__file__} is not the simulated build"
assert ndl.cuda().enabled(), "the simulated CUDA device is not available"
print(f"cuda_sim: {needle_c.__file__}: {ndl.cuda.get_device_name()}")
PY
if [ "$#" -eq 0 ]; then
    set -- tests
fi
args=("$@")
# run NAME LOG VAR=VALUE...: one pytest run of the cuda-marked tests with the switches given.
run() {
    local name=$1 log=$2 t0=$SECONDS
    shift 2
    local status=0
    env "$@" python -m pytest -q -p no:cacheprovider -m cuda "${args[@]}" >"$log" 2>&1 || status=$?
    echo "cuda_sim: $name run took $((SECONDS - t0)) s (exit $status)" >>"$log"
    return "$status"
}
t0=$SECONDS
run plain "$out/plain.log" NEEDLE_SIM_PERTURB=0 &
plain=$!
run "capped and perturbed" "$out/perturbed.log" NEEDLE_SIM_MAX_BLOCKS=3 NEEDLE_SIM_PERTURB=1 &
perturbed=$!
status=0
wait "$plain" || status=1
wait "$perturbed" || status=1
cat "$out/plain.log" "$out/perturbed.log"
echo "cuda_sim: both runs took $((SECONDS - t0)) s"
# The census of the course's training steps on the simulated GPU: what every change does to
# the step's launches, syncs, mallocs and bytes shows in CI's log.
t0=$SECONDS
python bench/gpu_census.py --small --steps 2 --warmup 2 || status=1
# ...and of the same steps captured in CUDA graphs and replayed (issue 37: at most 3 host
# launches per replayed step).
python bench/gpu_census.py --small --steps 2 --warmup 2 --graphs --check || status=1
echo "cuda_sim: the census took $((SECONDS - t0)) s; $((SECONDS - start)) s in all"
exit "$status"
