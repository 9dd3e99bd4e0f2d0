"""The runner of the malformed-input sweep (tests/test_malformed_*.py).

A case is ``case(id, bad, exc, match=None)``: ``bad(subject)`` makes one malformed call on an
area's subject (an object built on the device under test), ``exc`` is the documented exception
it must raise (design.md "errors": ValueError, TypeError, IndexError, needle.DeviceError,
needle.OutOfMemoryError, BufferError) and ``match`` an optional regex its message must match.

``run_case`` checks that the call raises ``exc`` (never SystemError, never nothing; on a GPU an
error its kernels find, a bad index, is raised at the next synchronisation, so the call is
followed by one there), then makes
one normal call on the same subject and checks that the device's allocated bytes are what they
were before the malformed call: bad input raises and leaves state intact.
"""

import gc
import re

import pytest

import needle as ndl


def case(id, bad, exc, match=None, marks=()):
    """One malformed call, as a pytest parameter named ``id``."""
    return pytest.param(bad, exc, match, id=id, marks=marks)


def _allocated(device):
    gc.collect()
    return ndl.memory.memory_allocated(device)


def expect_raises(bad, subject, exc, match, device=None):
    """Runs ``bad(subject)`` (then, on a CUDA ``device``, ``ndl.cuda.synchronize()``, where
    the GPU reports what its kernels found); fails unless it raises ``exc`` (with ``match``
    in its message)."""
    try:
        bad(subject)
        if device is not None and device.name == "cuda":
            ndl.cuda.synchronize(device)
    except SystemError as err:  # a C function returned NULL without an exception, or vice versa
        pytest.fail(f"SystemError instead of {exc.__name__}: {err!r}")
    except exc as err:
        if match is not None:
            assert re.search(match, str(err)), f"message {str(err)!r} does not match {match!r}"
    except BaseException as err:  # noqa: BLE001 - any other type is the failure under test
        pytest.fail(f"{type(err).__name__} instead of {exc.__name__}: {err!r}")
    else:
        pytest.fail(f"no exception; expected {exc.__name__}")


def run_case(bad, exc, match, subject, normal, device):
    """The check every area's test makes: ``bad(subject)`` raises the documented ``exc``, then
    ``normal(subject)`` works and the device's allocated bytes are unchanged."""
    normal(subject)  # first use (lazy state, caches) before the baseline
    before = _allocated(device)
    expect_raises(bad, subject, exc, match, device)
    normal(subject)
    assert _allocated(device) == before, "the malformed call changed the allocated bytes"
