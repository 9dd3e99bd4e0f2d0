#!/usr/bin/env bash
# Runs the real CUDA backend (csrc/cuda/*.cu: kernels, caching allocator) on
# the CPU: builds needle_c with NEEDLE_CUDA=sim (the .cu files compiled by g++
# against needle's CUDA simulator, csrc/cuda/sim) into build/sim, beside, not
# over, the normal install, and runs every cuda-marked test on it twice, with
# this checkout's python/ on the path: plainly, then with every grid capped at
# a few blocks and one warp per block held back (NEEDLE_SIM_MAX_BLOCKS,
# NEEDLE_SIM_PERTURB), which turns a missing barrier or a kernel that is not
# grid-stride into wrong results. Prints how long each step took.
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
unset NEEDLE_SIM_MEMORY NEEDLE_SIM_MAX_BLOCKS NEEDLE_SIM_PERTURB
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
run() {
    local name=$1
    shift
    local t0=$SECONDS
    env "$@" python -m pytest -q -p no:cacheprovider -m cuda "${args[@]}"
    echo "cuda_sim: $name run took $((SECONDS - t0)) s"
}
args=("$@")
run plain NEEDLE_SIM_PERTURB=0
run "capped and perturbed" NEEDLE_SIM_MAX_BLOCKS=3 NEEDLE_SIM_PERTURB=1
echo "cuda_sim: $((SECONDS - start)) s in all"
