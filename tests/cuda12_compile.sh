#!/usr/bin/env bash
# Compile-only check of the CUDA backend with CUDA 12 for the V100 (sm_70), so that a construct
# only CUDA 13 accepts cannot slip into csrc/cuda: `python setup.py cuda_compile` (setup.py's
# own toolkit checks, architecture validation and nvcc flags, -Werror included) with
# NEEDLE_CUDA_ARCH=70 and a CUDA 12 toolkit: $CUDA12_HOME, else the newest /usr/local/cuda-12*,
# else the nvidia-cuda-nvcc-cu12 and nvidia-cuda-runtime-cu12 wheels installed into
# build/cuda12/wheels (not into the environment). Those wheels (12.1 to 12.9) ship ptxas,
# libnvvm and headers but no nvcc driver, cudafe++ or cicc, so with them alone there is nothing
# to compile with: the script then says SKIPPED and why, and exits 0 (CI has no other CUDA 12).
# Prints how long it took.
#   bash tests/cuda12_compile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
out=build/cuda12
home=${CUDA12_HOME:-}
if [ -z "$home" ]; then
    for dir in /usr/local/cuda-12*; do
        [ -x "$dir/bin/nvcc" ] && home=$dir
    done
fi
if [ -z "$home" ]; then
    wheels=$out/wheels
    if [ ! -d "$wheels/nvidia" ]; then
        python -m pip install -q --no-deps --target "$wheels" \
            "nvidia-cuda-nvcc-cu12>=12,<13" "nvidia-cuda-runtime-cu12>=12,<13"
    fi
    if [ ! -x "$wheels/nvidia/cuda_nvcc/bin/nvcc" ]; then
        echo "cuda12_compile: SKIPPED: no CUDA 12 nvcc: \$CUDA12_HOME is unset, there is no" \
            "/usr/local/cuda-12*, and the nvidia-cuda-nvcc-cu12 wheel has no bin/nvcc" \
            "(it has: $(cd "$wheels/nvidia/cuda_nvcc" && echo bin/*)) ($((SECONDS - start)) s)"
        exit 0
    fi
    home=$wheels/nvidia/cuda_nvcc
fi
echo "cuda12_compile: $("$home/bin/nvcc" --version | grep release)"
CUDA_HOME=$home NEEDLE_CUDA=1 NEEDLE_STRICT=1 NEEDLE_CUDA_ARCH=70 \
    python setup.py -q cuda_compile --build-temp "$out"
echo "cuda12_compile: csrc/cuda/*.cu compile for sm_70 with CUDA 12 ($((SECONDS - start)) s)"
