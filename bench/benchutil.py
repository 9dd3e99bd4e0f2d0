"""Helpers the benchmark scripts share: a loop timer and the machine line they print first.

The scripts run as ``python bench/NAME.py``, which puts this folder on ``sys.path``.
"""

import json
import os
import platform
import statistics
import sys
import time


def timeit(fn, min_time=0.2, repeats=5):
    """Median seconds per call over `repeats` loops that each last about min_time/repeats."""
    fn()
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - start >= min_time / repeats or number >= 1 << 20:
            break
        number *= 2
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def cpu_model():
    """The CPU's model name (from /proc/cpuinfo on Linux), else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_kernels():
    """What needle's CPU kernels run (needle_c._cpu_kernels(), without the calibration
    table): the ISA, the GEMM micro-kernels (float32's, and the narrow types' where the build
    reports them), the BLAS and the measured split."""
    import needle_c

    if not hasattr(needle_c, "_cpu_kernels"):  # a build from before the choice was reported
        return {"isa": "?", "best": "?", "gemm": "?", "blas": needle_c._blas(), "gemm_split": None}
    info = needle_c._cpu_kernels()
    keys = ("isa", "best", "gemm", "gemm_bfloat16", "gemm_float16", "blas", "gemm_split")
    return {k: info[k] for k in keys if k in info}


def kernels_line(kernels=None):
    """One line for a table's header: the CPU kernels' ISA, GEMM kernel and BLAS split."""
    k = kernels or cpu_kernels()
    split = k["gemm_split"]
    if split is None:
        split_text = "not measured yet"
    elif split >= 2**62:
        split_text = "never (the BLAS lost or was too slow when measured)"
    else:
        split_text = f"from {split:,} multiply-adds (~{round(split ** (1 / 3))}^3)"
    return (
        f"needle CPU kernels: {k['isa']} (best here: {k['best']}; GEMM {k['gemm']}); "
        f"BLAS split: {split_text}"
    )


def print_machine(**extra):
    """Prints the JSON line that opens every benchmark's output: machine, CPU model,
    CPUs, versions and the CPU kernels needle runs."""
    import needle

    info = {
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "needle": needle.__version__,
        "cpu_kernels": cpu_kernels(),
        **extra,
    }
    print(json.dumps({"machine": info}), flush=True)
    return info


def step_peak_bytes(make_run, device):
    """``max_memory_allocated`` over one step of ``make_run()`` (an object with ``step()``)
    after a warm-up step (an optimizer's state made), with that run alone in the process: it is
    dropped before returning."""
    import needle as ndl

    run = make_run()
    run.step()
    ndl.memory.reset_peak_memory_stats(device)
    run.step()
    peak = ndl.memory.max_memory_allocated(device)
    del run
    return peak


def paired_time_ratio(times, base_times):
    """The median of ``times[i] / base_times[i]`` over steps taken in turns (the ratio pair by
    pair, as farm-bench takes it): a drift of the machine's speed over a run moves it less than
    it moves a ratio of the two medians."""
    return statistics.median(t / b for t, b in zip(times, base_times, strict=True))
