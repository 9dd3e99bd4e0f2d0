"""set_gc_policy's argument types and values: what it accepts, what it refuses, and that a
refused call leaves the policy as it was."""

import re

import numpy as np
import pytest

import needle.memory as mem

from memory_check import (  # noqa: F401  (clean_memory_state: an autouse fixture)
    clean_memory_state,
)

# --------------------------------------------------------------------------
# set_gc_policy's argument types
# --------------------------------------------------------------------------


@pytest.fixture
def saved_policy():
    policy = mem.get_gc_policy()
    try:
        yield policy
    finally:
        mem.set_gc_policy(**policy)


@pytest.mark.parametrize("bad", ["no", "False", "", 0, 1, 1.0, [False]], ids=repr)
def test_set_gc_policy_enabled_takes_only_a_bool(saved_policy, bad):
    with pytest.raises(TypeError, match=r"^enabled must be True or False, got "):
        mem.set_gc_policy(enabled=bad)
    assert mem.get_gc_policy() == saved_policy


def test_set_gc_policy_enabled_switches(saved_policy):
    mem.set_gc_policy(enabled=False)
    assert mem.get_gc_policy()["enabled"] is False
    mem.set_gc_policy(enabled=True)
    assert mem.get_gc_policy()["enabled"] is True


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"growth": "1.0"}, TypeError, "growth must be a number, got str '1.0'"),
        ({"growth": True}, TypeError, "growth must be a number, got bool True"),
        ({"high_water": "0.9"}, TypeError, "high_water must be a number"),
        ({"max_gc_fraction": [0.1]}, TypeError, "max_gc_fraction must be a number"),
        ({"min_growth": True}, TypeError, "a memory size cannot be a bool"),
        ({"min_growth": "lots"}, ValueError, "cannot parse memory size 'lots'"),
        ({"watermark": False}, TypeError, "a memory size cannot be a bool"),
        ({"watermark": 1.5}, ValueError, "fractional memory size must be in"),
        ({"growth": -1.0}, ValueError, "gc policy: need growth >= 0"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_set_gc_policy_rejects_bad_arguments(saved_policy, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        mem.set_gc_policy(**kwargs)
    assert mem.get_gc_policy() == saved_policy


def test_set_gc_policy_takes_numpy_numbers(saved_policy):
    mem.set_gc_policy(growth=np.float32(0.5), high_water=np.float64(0.75))
    policy = mem.get_gc_policy()
    assert policy["growth"] == 0.5 and policy["high_water"] == 0.75
