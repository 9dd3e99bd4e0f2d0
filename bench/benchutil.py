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


def print_machine(**extra):
    """Prints the JSON line that opens every benchmark's output: machine, CPUs, versions."""
    import needle

    info = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "needle": needle.__version__,
        **extra,
    }
    print(json.dumps({"machine": info}), flush=True)
    return info
