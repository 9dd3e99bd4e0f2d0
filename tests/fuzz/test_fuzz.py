"""The fuzzer's CI slice: a few hundred programs with fixed seeds (well under a minute).

``NEEDLE_FUZZ_PROGRAMS`` and ``NEEDLE_FUZZ_SEED`` widen or move the slice, e.g. under the
sanitizer build: ``NEEDLE_FUZZ_PROGRAMS=10000 bash tests/sanitize.sh tests/fuzz``.
"""

import contextlib
import gc
import os

import pytest

from .driver import run_seed
from .hostile import run_hostile


def _count(name, default):
    """A whole-number variable of the fuzzer; a malformed one stops the collection by name."""
    text = os.environ.get(name, "").strip() or default
    if not text.isdigit():
        raise pytest.UsageError(f"{name}={text!r}: expected a whole number >= 0")
    return int(text)


PROGRAMS = _count("NEEDLE_FUZZ_PROGRAMS", "300")
FIRST = _count("NEEDLE_FUZZ_SEED", "0")
CHUNK = 25
CHUNKS = list(range(FIRST, FIRST + PROGRAMS, CHUNK))


def freeze_live_heap():
    """Collects, then freezes: only live objects are frozen. Frozen garbage would be
    freed later by needle's scoped collection (it does not see gc.freeze), in the middle of
    a program whose leak check counted it as allocated."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def _young_heap():
    """pytest's own objects out of the programs' many full collections (frozen before
    each program: an out-of-memory path of needle unfreezes), unfrozen after."""
    try:
        yield freeze_live_heap
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("start", CHUNKS)
def test_programs(start):
    """Each program: NumPy mirror, finite differences, an undisturbed rerun in the other
    graph mode, no leaked bytes, settings restored (see driver.run_seed)."""
    failures = []
    with _young_heap() as freeze:
        for seed in range(start, min(start + CHUNK, FIRST + PROGRAMS)):
            freeze()
            try:
                run_seed(seed)
            except AssertionError as err:
                failures.append(str(err))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("start", CHUNKS)
def test_hostile_programs(start):
    """Inconsistent graph attributes set on purpose: clear exceptions, no crash, no leak."""
    failures = []
    with _young_heap() as freeze:
        for seed in range(start, min(start + CHUNK, FIRST + PROGRAMS)):
            freeze()
            failures.extend(run_hostile(seed))
    assert not failures, "\n".join(failures)
