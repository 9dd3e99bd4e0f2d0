"""needle._environ: reading NEEDLE_* run-time variables through the one table of them, and the
checks of the CUDA backend's.

The table is csrc/config.h's (``needle_c._config_table()``, here :data:`VARIABLES`): each
variable's name, who reads it, its kind, default, what it accepts and what it does.
docs/environment.md's table is written from it (:func:`readme_table`; tests/test_config_table.py
keeps them equal), and :func:`read` refuses a name the table lacks, so a new variable cannot be
read before it is listed.

Every run-time variable is checked when needle is imported, and a value needle cannot use is a
ValueError ``NAME='text': [detail; ]expected <the table's accepts>``, never a default taken in
silence. Each variable is checked where it is read: ``NEEDLE_BLAS``, ``NEEDLE_CPU_ISA``,
``NEEDLE_GEMM_SPLIT``, ``NEEDLE_NUM_THREADS`` and ``NEEDLE_RNG`` by needle_c at its import (with
config.h's parsers); ``NEEDLE_MEMORY_LIMIT``, ``NEEDLE_ALLOC_CONF`` and ``NEEDLE_GC*`` by
:mod:`needle.memory` and ``NEEDLE_DIST_*`` by :mod:`needle.distributed`, with the helpers below;
the CUDA backend's (``NEEDLE_CUBLAS``, the simulator's ``NEEDLE_SIM_*``), which C reads only at
the first CUDA call, here by :func:`check_cuda_variables` when :mod:`needle.cuda` is imported.
"""

import collections
import os
import re

import needle_c as _c

Variable = collections.namedtuple("Variable", "name section kind lo hi choices default accepts doc")
"""One row of the table: ``section`` is ``"run"`` (read by needle), ``"build"`` (setup.py) or
``"test"`` (the tests and bench scripts); ``kind`` names the parser; ``lo``/``hi`` bound a
count; ``choices`` are a choice's words separated by ``|``."""

VARIABLES = {row[0]: Variable(*row) for row in _c._config_table()}

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def variable(name):
    """The table's row for ``name``; LookupError for a name it lacks (a reader's bug: list the
    variable in csrc/config.h and docs/environment.md first)."""
    try:
        return VARIABLES[name]
    except KeyError:
        raise LookupError(f"{name} is not in needle's table of variables (csrc/config.h)") from None


def read(name):
    """The run-time variable's value with surrounding blanks removed, or None when it is unset or
    empty (``NAME= python ...`` means the default, as an unset variable does)."""
    row = variable(name)
    if row.section != "run":
        raise LookupError(f"{name} is read by {row.section}, not by needle")
    text = os.environ.get(name, "").strip()
    return text or None


def invalid(name, text, detail=None):
    """The ValueError for a value of ``name`` that cannot be used:
    ``NAME='text': [detail; ]expected <what the table says it accepts>``."""
    reason = f"{detail}; " if detail else ""
    return ValueError(f"{name}={text!r}: {reason}expected {variable(name).accepts}")


def switch(name, default):
    """A yes/no variable: ``1/true/on/yes`` or ``0/false/off/no`` (any case); ``default``
    when unset or empty; ValueError for anything else."""
    if variable(name).kind != "switch":
        raise LookupError(f"{name} is a {variable(name).kind} in the table, not a switch")
    text = read(name)
    if text is None:
        return default
    if text.lower() in _ON:
        return True
    if text.lower() in _OFF:
        return False
    raise invalid(name, text)


def _cell(text):
    """Text as a Markdown table cell: a ``|`` escaped."""
    return text.replace("|", "\\|")


def readme_row(row):
    """docs/environment.md's table's line for one row of the table."""
    cells = (f"`{row.name}`", row.section, row.default, row.accepts, row.doc)
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


README_HEADER = (
    "| Variable | Read by | Default | Accepts | What it does |",
    "|---|---|---|---|---|",
)


def readme_table():
    """docs/environment.md's table, written from the table: its header and one line per
    variable, in the table's order."""
    return "\n".join(README_HEADER + tuple(readme_row(r) for r in VARIABLES.values()))


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
            raise invalid("NEEDLE_CUBLAS", cublas, "no such file")
    sim_switches = [name for name in VARIABLES if name.startswith("NEEDLE_SIM_")]
    if any(read(n) is not None for n in sim_switches) and _c._cuda_simulated():
        # The simulator parses its switches at its first call; make that call now, so that
        # a malformed one is this import's error rather than a missing GPU later. Its own
        # message says what it expects (its parser, in csrc/cuda/sim).
        if not _c.cuda(0).enabled():
            match = _SIM_SWITCH_ERROR.search(_c._cuda_init_error() or "")
            if match:
                name, text, _ = match.groups()
                raise invalid(name, text, "a switch of needle's CUDA simulator")
