"""Where needle's random numbers come from, and how to seed them.

``Device.rand``, ``randn`` and ``randb`` (and so ``init.rand``, ``init.randn``,
``init.randb``, ``nn.Dropout`` and every initializer) draw from one of two sources:

- NumPy's global RNG on the host, copied onto the device: the course's values, exactly
  (``rand``/``randn`` are ``np.random.rand/randn(*shape)``; ``randb`` is
  ``rand(*shape) <= p``).
- The device generator: Philox4x32-10 (the counter-based generator cuRAND and PyTorch
  use on GPUs) run on the array's device in one kernel. Its 64-bit key is one draw from
  NumPy's global RNG per call, so ``np.random.seed(s)`` (or :func:`manual_seed`) makes a
  run reproducible in this mode too, but the values are not NumPy's. Uniform values lie in
  [0, 1) on a grid of 2^-24; normals come from Box-Muller (|z| <= 5.77); ``randb`` is one
  bernoulli kernel equal to the same key's uniform values ``<= p``.

One switch chooses, per device kind: the environment variable ``NEEDLE_RNG`` (read at
import; any other value fails the import with a ValueError), or :func:`set_rng_mode` at
run time:

- ``"auto"`` (the default): the device generator on CUDA devices, NumPy on the CPU,
- ``"host"``: NumPy's draws on every device (the course's values on a GPU too),
- ``"device"``: the device generator on every device, the CPU included.
"""

import contextlib
import math
import operator
import threading

import numpy as np

import needle_c as _c

MODES = ("auto", "host", "device")


def manual_seed(seed):
    """Seeds every random draw needle makes: ``np.random.seed(seed)``, since NumPy's
    global RNG makes the host draws and keys the device generator. ``seed`` is an integer
    in [0, 2**32)."""
    try:
        value = operator.index(seed)
    except TypeError:
        kind = type(seed).__name__
        raise TypeError(f"manual_seed: seed must be an integer, got {kind}") from None
    if not 0 <= value < 2**32:
        raise ValueError(f"manual_seed: seed must be in [0, 2**32), got {value}")
    np.random.seed(value)


def set_rng_mode(mode):
    """Chooses where random draws come from: ``"auto"``, ``"host"`` or ``"device"``
    (see the module's documentation). ValueError for anything else."""
    _c._set_rng_mode(mode)


def get_rng_mode():
    """The current mode: ``"auto"``, ``"host"`` or ``"device"``."""
    return _c._get_rng_mode()


@contextlib.contextmanager
def rng_mode(mode):
    """Runs the block under ``mode`` and restores the previous mode after it."""
    previous = get_rng_mode()
    set_rng_mode(mode)
    try:
        yield
    finally:
        set_rng_mode(previous)


def uses_device_generator(device=None):
    """True when a draw on ``device`` (None: the CPU) comes from the device generator
    under the current mode, False when it is NumPy's."""
    return _c._rng_uses_device(device)


# Draws whose values nobody reads (Dropout with p 0 or 1 still makes the course's draw, so that
# NumPy's stream stays the course's). A checkpointed forward pass records the stream's state
# after each of them; its recomputation, which replays the stream from the forward's start,
# sets the state to the recorded one instead of drawing again (a full array of doubles each).
_journals = threading.local()


def _journal_stack():
    stack = getattr(_journals, "stack", None)
    if stack is None:
        stack = _journals.stack = []
    return stack


@contextlib.contextmanager
def recording_unread_draws():
    """Records, for the block, NumPy's state after each :func:`unread_draw`; yields the list
    that :func:`replaying_unread_draws` takes (gradient checkpointing's forward pass)."""
    states = []
    stack = _journal_stack()
    stack.append(("record", states, [0]))
    try:
        yield states
    finally:
        stack.pop()


@contextlib.contextmanager
def replaying_unread_draws(states):
    """Runs the block as a replay of a recorded one from the same starting state: its
    :func:`unread_draw` calls set NumPy's state to the recorded ones, in order, instead of
    drawing (gradient checkpointing's recomputation)."""
    stack = _journal_stack()
    stack.append(("replay", states, [0]))
    try:
        yield
    finally:
        stack.pop()


def unread_draw(shape):
    """Advances NumPy's global stream as ``np.random.rand(*shape)`` does, for a draw whose
    values are not read; inside a replay, by setting the state that draw left in the recorded
    block (no numbers are made). Not for the device generator, which needs no such draw."""
    stack = _journal_stack()
    if stack and stack[-1][0] == "replay":
        _, states, position = stack[-1]
        if position[0] < len(states):
            np.random.set_state(states[position[0]])
            position[0] += 1
            return
    np.random.random_sample(math.prod(shape))
    if stack and stack[-1][0] == "record":
        stack[-1][1].append(np.random.get_state())
