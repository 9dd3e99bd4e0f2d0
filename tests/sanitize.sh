#!/usr/bin/env bash
# Builds needle_c with AddressSanitizer + UBSan into build/sanitize (beside,
# not over, the normal install) and runs pytest on it with the sanitizer
# runtime preloaded, with this checkout's python/ (not an installed needle) on the path.
# Any sanitizer report aborts the process, so pytest fails. The files run in one worker per
# core (pytest-xdist, a test extra), each file whole in one worker.
#   bash tests/sanitize.sh [pytest args...]     (default: the GC, memory, autograd and fuzz tests)
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/sanitize
NEEDLE_SANITIZE=1 NEEDLE_STRICT=1 python setup.py -q build_ext --build-temp "$out/temp" \
    --build-lib "$out/lib" >/dev/null
# libstdc++ too: C++ extensions (matplotlib) throw, and ASan must find __cxa_throw.
runtime="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
# Python's own allocations are not leaks of ours (detect_leaks=0); every
# other report is fatal (halt_on_error; UBSan is built without recovery).
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export NEEDLE_SANITIZE=1
if [ "$#" -eq 0 ]; then
    set -- tests/test_gc.py tests/test_memory_accounting.py tests/test_memory_limits.py \
        tests/test_gc_policy_args.py tests/test_pressure.py tests/test_gradient_scope.py \
        tests/test_autograd_errors.py tests/test_view_limits.py tests/test_autograd.py tests/test_engine_c.py \
        tests/test_threads.py tests/test_oom_recovery.py tests/fuzz
fi
LD_PRELOAD="$runtime" PYTHONPATH="$out/lib:$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
    python -m pytest -q -p no:cacheprovider -n auto --dist loadfile -m "not paced" "$@"
