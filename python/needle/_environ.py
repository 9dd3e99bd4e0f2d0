"""needle._environ: reading NEEDLE_* run-time variables, and the checks of the CUDA backend's.

Every run-time variable is checked when needle is imported, and a value needle cannot use is
a ValueError that names the variable, the value and what is accepted, never a default taken
in silence (README.md's environment table lists them). Each variable is checked where it is
read: ``NEEDLE_BLAS``, ``NEEDLE_CPU_ISA``, ``NEEDLE_GEMM_SPLIT`` and ``NEEDLE_NUM_THREADS`` by
needle_c at its import; ``NEEDLE_MEMORY_LIMIT``, ``NEEDLE_ALLOC_CONF`` and ``NEEDLE_GC*`` by
:mod:`needle.memory` with the helpers below; the CUDA backend's (``NEEDLE_CUBLAS``, the simulator's
``NEEDLE_SIM_*``), which C reads only at the first CUDA call, here by
:func:`check_cuda_variables` when :mod:`needle.cuda` is imported.
"""

import os
import re

import needle_c as _c

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def read(name):
    """The variable's value with surrounding blanks removed, or None when it is unset or empty
    (``NAME= python ...`` means the default, as an unset variable does)."""
    text = os.environ.get(name, "").strip()
    return text or None


def invalid(name, text, accepted, detail=None):
    """The ValueError for a value of ``name`` that cannot be used:
    ``NAME='text': [detail; ]expected accepted``."""
    reason = f"{detail}; " if detail else ""
    return ValueError(f"{name}={text!r}: {reason}expected {accepted}")


def switch(name, default):
    """A yes/no variable: ``1/true/on/yes`` or ``0/false/off/no`` (any case); ``default``
    when unset or empty; ValueError for anything else."""
    text = read(name)
    if text is None:
        return default
    if text.lower() in _ON:
        return True
    if text.lower() in _OFF:
        return False
    raise invalid(name, text, f"one of {'/'.join(_ON)} or {'/'.join(_OFF)}")


# The simulator's own message for a malformed switch, inside CUDA's unavailable reason, e.g.
# "... [needle CUDA simulator: cudaGetDeviceCount: NEEDLE_SIM_MEMORY=lots: expected ...]".
_SIM_SWITCH_ERROR = re.compile(r"(NEEDLE_SIM_\w+)=(.*?): expected ([^\]]*)")


def check_cuda_variables():
    """Checks ``NEEDLE_CUBLAS`` and, on a simulated build, ``NEEDLE_SIM_*``; raises ValueError
    for a value the CUDA backend would otherwise meet only at its first use."""
    cublas = read("NEEDLE_CUBLAS")
    if cublas is not None and cublas not in ("0", "1") and "/" in cublas:
        # A bare soname is the loader's to find; a path must name a file.
        if not os.path.isfile(cublas):
            raise invalid(
                "NEEDLE_CUBLAS",
                cublas,
                "0 (needle's own SGEMM kernel), 1 (find cuBLAS, the default), or the path or "
                "soname of a libcublas",
                "no such file",
            )
    sim_switches = (
        "NEEDLE_SIM_MEMORY",
        "NEEDLE_SIM_MAX_BLOCKS",
        "NEEDLE_SIM_PERTURB",
        "NEEDLE_SIM_COMPUTE_CAPABILITY",
        "NEEDLE_SIM_VMM",
    )
    if any(read(n) is not None for n in sim_switches) and _c._cuda_simulated():
        # The simulator parses its switches at its first call; make that call now, so that
        # a malformed one is this import's error rather than a missing GPU later. Its own
        # message says what it expects (one parser, in csrc/cuda/sim).
        if not _c.cuda(0).enabled():
            match = _SIM_SWITCH_ERROR.search(_c._cuda_init_error() or "")
            if match:
                name, text, accepted = match.groups()
                raise invalid(name, text, accepted, "a switch of needle's CUDA simulator")
