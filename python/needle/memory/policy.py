"""needle.memory.policy: when device-memory pressure runs Python's collector.

The policy itself (the trigger, pacing, safe points: docs/design.md, "The collection policy")
is C: the pacer in csrc/gc_pacer.c decides, and owns the defaults
(``needle_c._gc_policy_defaults()``); needle_c/memory/pressure.c runs the collections. This
module is its Python
face: ``set_gc_policy``/``get_gc_policy``, the ``NEEDLE_GC*`` environment variables (parsed
here, beside the functions they feed, because their sizes use :func:`parse_size`), the
collector's visibility switch, ``freeze_heap`` and the safe point a training loop reaches.
"""

import gc
import numbers
import time

import needle_c as _c

from .. import _environ
from .stats import _flag, _size_fraction, parse_size

_DEFAULTS = _c._gc_policy_defaults()


def set_gc_policy(
    enabled=None, growth=None, min_growth=None, high_water=None, max_gc_fraction=None, watermark=...
):
    """Configures when device-memory pressure runs Python's collector; omitted values keep
    their current setting.

    - ``enabled``: False switches pressure and out-of-memory collections off (the course's
      behaviour, which leaks cyclic garbage until Python's own collector gets to it).
    - ``growth`` ({growth:g}) and ``min_growth`` ({min_growth_mib:g} MiB, a size): collect
      before allocations pass
      ``max(survivors * (1 + growth), survivors + min_growth)``, where survivors is what was
      allocated after the last pressure collection...
    - ``high_water`` ({high_water:g}): ...capped at ``high_water * budget`` (the device limit,
      or a GPU's capacity; a CPU without a limit has no budget and no pressure collections).
    - ``max_gc_fraction`` ({max_gc_fraction:g}): the collector's share of wall time (0.5 near
      the budget).
    - ``watermark``: a size (``"1.5GiB"`` or bytes) or a fraction of the budget (a float in
      (0, 1] or ``"50%"``, resolved on each device against its own budget; a device without
      one then has no trigger) that replaces the computed trigger: collect when allocations
      pass it. ``None`` restores the computed trigger.

    The defaults above are needle_c's (``needle_c._gc_policy_defaults()``); the environment
    variables ``NEEDLE_GC`` (0/false/off/no: disabled), ``NEEDLE_GC_GROWTH``,
    ``NEEDLE_GC_MIN_GROWTH``, ``NEEDLE_GC_HIGH_WATER``, ``NEEDLE_GC_MAX_FRACTION`` and
    ``NEEDLE_GC_WATERMARK`` override them when :mod:`needle.memory` is imported.
    """
    kwargs = {}
    if enabled is not None:
        kwargs["enabled"] = _flag("enabled", enabled)
    for name, value in (
        ("growth", growth),
        ("high_water", high_water),
        ("max_gc_fraction", max_gc_fraction),
    ):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
            try:
                kwargs[name] = float(value)
            except OverflowError:  # an int past a float's range; needle_c checks the rest
                raise ValueError(f"{name} must be a finite number, got {value}") from None
    if min_growth is not None:
        kwargs["min_growth"] = _bytes_argument("min_growth", parse_size(min_growth))
    if watermark is not ...:
        kwargs["watermark"] = _watermark_argument(watermark)
    _c._set_gc_policy(**kwargs)


# needle_c keeps the policy's sizes in int64_t.
_MAX_BYTES = 2**63 - 1


def _bytes_argument(name, value):
    """``value`` (bytes) when needle_c can hold it; ValueError naming ``name`` otherwise."""
    if value > _MAX_BYTES:
        raise ValueError(f"{name} must be at most {_MAX_BYTES} bytes, got {value}")
    return value


set_gc_policy.__doc__ = set_gc_policy.__doc__.format(
    min_growth_mib=_DEFAULTS["min_growth"] / 2**20, **_DEFAULTS
)


def _watermark_argument(watermark):
    """What needle_c takes as the watermark: None, bytes (int) or a fraction (float in (0, 1])
    that the pacer resolves against each device's own budget."""
    if watermark is None:
        return None
    fraction = _size_fraction(watermark)
    if fraction is not None:
        return fraction
    return _bytes_argument("watermark", parse_size(watermark))


def get_gc_policy():
    """The pressure policy: enabled, growth, min_growth, high_water, max_gc_fraction,
    watermark (None when computed)."""
    return _c._get_gc_policy()


def set_gc_visible(visible):
    """``False`` makes Tensor and Op traversal report nothing to the collector, emulating a C
    extension whose types the garbage collector cannot see: reference cycles through them
    then leak for good. For demonstrating that failure only. Returns the previous value."""
    return _c._set_gc_visible(_flag("visible", visible))


def gc_visible():
    """Whether the collector can traverse Tensors and Ops (see :func:`set_gc_visible`)."""
    previous = _c._set_gc_visible(True)
    _c._set_gc_visible(previous)
    return previous


def freeze_heap():
    """Collects, then hides every object alive now from later collections (``gc.freeze()``);
    returns how many objects are frozen.

    A full collection's cost grows with every tracked object in the process: modules, NumPy,
    the model, a corpus' token lists. Called once after setup (model, optimizer and data
    built, before the first step), it leaves pressure collections only the objects training
    creates to scan: in ``bench/gc_cost.py`` a collection after a PTB step drops from ~9 ms to
    ~0.6 ms. The price: an object frozen now that later becomes part of cyclic garbage is not
    collected until ``gc.unfreeze()`` (objects without cycles are still freed by reference
    counting). Do not call it while a graph you will drop is alive (between a forward pass
    and the next step). needle's out-of-memory path unfreezes everything before it collects,
    so frozen cycles never cause an :class:`needle.OutOfMemoryError`; call this again after
    one to freeze anew.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def safe_point():
    """Tells the pressure policy that a training step's old graph has probably just become
    garbage (``Optimizer.reset_grad()`` calls it; ``Tensor.backward()`` does the same from C).
    Collects when allocated bytes are past the trigger computed from the live set seen at
    safe points, within the policy's pacing; does nothing when the policy is disabled, a
    fixed watermark is set, or no device has a budget. Returns None."""
    _c._gc_safe_point()


def _allocated_everywhere():
    """Allocated bytes summed over the engine's devices (needle_c's device ids)."""
    devices = (_c.cpu(), _c.cpu_numpy(), _c.cuda())
    return sum(_c._memory_allocated(dev._id) for dev in devices if dev.enabled())


def collect(scope="needle"):
    """Runs a collection now and returns what it freed, as a dict: ``scope``, ``objects``
    (objects freed), ``bytes`` (allocated device bytes, all devices, that dropped), ``seconds``
    and ``ran`` (False when the scoped collection could not run: see below).

    - ``scope="needle"``: the scoped collection (needle_c/memory/scoped.c): Python's cycle
      algorithm over needle's own objects (Tensors, TensorTuples, Ops, their subclasses, the
      inputs tuples and ``__dict__`` they alone hold). It frees the cycles made only of those
      objects that nothing else references, a subset of what ``gc.collect()`` frees, at a cost
      proportional to needle's live objects rather than the whole heap. It does not run inside
      Python's own collection or another scoped one (``ran`` is False), nor on free-threaded
      builds, where it falls back to a full collection.
    - ``scope="all"``: ``gc.collect()`` (``objects`` is what it returns: unreachable objects
      found).

    Both run even under ``gc.disable()``, as ``gc.collect()`` does."""
    if scope not in ("needle", "all"):
        raise ValueError(f"scope must be 'needle' or 'all', got {scope!r}")
    before = _allocated_everywhere()
    if scope == "needle" and _c._scoped_info()["supported"]:
        r = _c._collect_needle()
        objects, seconds, ran = r["collected"], r["seconds"], r["ran"]
    else:
        start = time.perf_counter()
        objects = gc.collect()
        seconds, ran = time.perf_counter() - start, True
    freed = max(0, before - _allocated_everywhere())
    return {"scope": scope, "objects": objects, "bytes": freed, "seconds": seconds, "ran": ran}


# The policy's variables, each with the set_gc_policy argument it sets (what each accepts is
# the table's: csrc/config.h).
_NUMBER_VARIABLES = (
    ("NEEDLE_GC_GROWTH", "growth"),
    ("NEEDLE_GC_HIGH_WATER", "high_water"),
    ("NEEDLE_GC_MAX_FRACTION", "max_gc_fraction"),
)
_SIZE_VARIABLES = (("NEEDLE_GC_MIN_GROWTH", "min_growth"), ("NEEDLE_GC_WATERMARK", "watermark"))


def _policy_from_environment():
    """Applies NEEDLE_GC and NEEDLE_GC_*; each variable is applied on its own, so that the
    error for a bad one names it, its value and what it accepts. Empty means unset."""
    enabled = _environ.switch("NEEDLE_GC", None)
    if enabled is not None:
        set_gc_policy(enabled=enabled)
    for variable, name in _NUMBER_VARIABLES + _SIZE_VARIABLES:
        text = _environ.read(variable)
        if text is None:
            continue
        try:
            value = float(text) if (variable, name) in _NUMBER_VARIABLES else text
            if name == "watermark" and _watermark_argument(text) == 0:
                # A watermark of 0 bytes collects before every allocation; "0" is more likely
                # meant as "off", which is the variable unset.
                raise ValueError("a watermark of 0 bytes would collect before every allocation")
            set_gc_policy(**{name: value})
        except (ValueError, TypeError) as err:
            raise _environ.invalid(variable, text, str(err)) from None
