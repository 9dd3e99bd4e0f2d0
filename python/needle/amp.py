"""Loss scaling for mixed precision (``needle.amp``): ``GradScaler``, with the semantics of
``torch.amp.GradScaler``; ``autocast`` (needle/_autocast.py, whose docstring lists which ops
run in which dtype) is here too, as ``torch.amp.autocast``.

A scaler multiplies the loss by ``scale`` before ``backward()`` so that small gradients of a
narrow dtype do not flush to zero, then divides the gradients by it again before the optimizer
uses them. A step whose gradients hold an inf or a NaN (the scale was too large) is skipped and
the scale backed off; after ``growth_interval`` good steps in a row the scale grows::

    scaler = ndl.amp.GradScaler()
    for x, y in loader:
        opt.reset_grad()
        loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)          # optional: only to see the true gradients,
        opt.clip_grad_norm(1.0)       # e.g. to clip them
        scaler.step(opt)              # unscales if needed; skipped on inf/NaN
        scaler.update()

The unscale is one engine call per device (``needle_c.amp_unscale_``): each gradient is
multiplied IN PLACE by ``1 / scale`` (a gradient that is a view, of a data-parallel bucket say,
writes through it) and tested for inf/NaN in the same pass, into one flag array on the device.
On a GPU that is one kernel launch per gradient and the host reads the flag once per step, in
``step()``. A gradient array that several parameters share (``x.grad is y.grad`` after
``(x + y).backward()``) is unscaled once. Parameters whose ``grad`` is None are skipped.
float32 and float64 gradients are unscaled in their own dtype (a float64 one by the float32
``1 / scale`` widened, as PyTorch does); float16 and bfloat16 gradients are refused
(TypeError), as PyTorch refuses float16 ones: keep float32 master parameters under autocast.

The scale is kept in float32, as PyTorch keeps it, and changes as PyTorch's
``_amp_update_scale_`` changes it (the product computed in double, then rounded to float32;
a growth that would overflow float32 is not applied), so a scaler here and one in PyTorch given
the same sequence of good and bad steps report the same ``get_scale()``.

Where this differs from PyTorch: misuse raises RuntimeError where PyTorch has ``assert``
(``update()`` with no unscale recorded since the last update, ``step()`` on an optimizer
with no gradients), the constructor's arguments are checked (ValueError or TypeError, where
PyTorch asserts only ``growth_factor > 1`` and ``backoff_factor < 1``), and ``step()`` may run
before any ``scale()`` (the scale exists from the start).
"""

import enum
import math
import numbers

import numpy as np

from needle_c import amp_unscale_ as _amp_unscale

from . import init
from ._autocast import autocast, get_autocast_dtype, is_autocast_enabled
from ._checks import check_count, check_real
from .autograd import Tensor, no_grad

__all__ = ["GradScaler", "autocast", "get_autocast_dtype", "is_autocast_enabled"]

# The engine's message for two gradients that share memory only in part (amp_unscale.c).
_PARTIAL_OVERLAP = "overlap in memory in part"


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _float32(x):
    """x rounded to float32, as a Python float (PyTorch keeps the scale in a float32 tensor)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _check_growth_factor(value):
    return check_real("growth_factor", value, low=1.0, low_open=True)


def _check_backoff_factor(value):
    return check_real("backoff_factor", value, low=0.0, high=1.0, low_open=True, high_open=True)


def _check_growth_interval(value):
    return check_count("growth_interval", value, low=1)


def _check_scale(name, value):
    value = check_real(name, value, low=0.0, low_open=True)
    if math.isinf(_float32(value)):
        raise ValueError(f"Invalid {name}: {value} (overflows float32)")
    return value


class GradScaler:
    """Dynamic loss scaling (``torch.amp.GradScaler``'s API and semantics).

    ``init_scale`` (> 0, finite in float32) is the first scale; on a step with an inf/NaN
    gradient the scale is multiplied by ``backoff_factor`` (in (0, 1)); after
    ``growth_interval`` (int >= 1) steps in a row without one it is multiplied by
    ``growth_factor`` (> 1). ``enabled=False`` makes every method a pass-through
    (``scale`` returns its input, ``step`` calls ``optimizer.step()``, ``get_scale`` is 1.0).
    """

    def __init__(
        self,
        init_scale=2.0**16,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=2000,
        enabled=True,
    ):
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
        self._enabled = enabled
        self._init_scale = _check_scale("init_scale", init_scale)
        self._growth_factor = _check_growth_factor(growth_factor)
        self._backoff_factor = _check_backoff_factor(backoff_factor)
        self._growth_interval = _check_growth_interval(growth_interval)
        self._scale = _float32(self._init_scale)
        self._growth_tracker = 0
        # id(optimizer) -> {"stage": _Stage, "found_inf": [flag Tensor per device]}
        self._per_optimizer_states = {}

    # ------------------------------------------------------------------ scaling

    def scale(self, outputs):
        """``outputs * scale``: a Tensor, or a list/tuple (nested) of Tensors, returned in the
        same structure (a new list or tuple). Returns ``outputs`` unchanged when disabled.
        TypeError for anything else."""
        if not self._enabled:
            return outputs
        return self._scale_structure(outputs)

    def _scale_structure(self, value):
        if isinstance(value, Tensor):
            return value * self._scale
        if isinstance(value, (list, tuple)):
            return type(value)(self._scale_structure(v) for v in value)
        raise TypeError(
            f"GradScaler.scale: outputs must be a Tensor or a list/tuple of Tensors, "
            f"got {type(value).__name__}"
        )

    def _state(self, optimizer):
        return self._per_optimizer_states.setdefault(
            id(optimizer), {"stage": _Stage.READY, "found_inf": []}
        )

    def unscale_(self, optimizer):
        """Divides every gradient of ``optimizer.params`` by the scale, in place, and records
        whether any holds an inf or NaN. Optional: ``step()`` unscales when this was not
        called. Returns None. RuntimeError when called twice for one optimizer before
        ``update()``, or after ``step()``."""
        if not self._enabled:
            return
        params = getattr(optimizer, "params", None)
        if params is None:
            raise TypeError(
                f"GradScaler.unscale_: expected a needle optimizer (with .params), "
                f"got {type(optimizer).__name__}"
            )
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = _float32(1.0 / self._scale)
        state["found_inf"] = self._unscale_grads(params, inv_scale)
        state["stage"] = _Stage.UNSCALED

    def _unscale_grads(self, params, inv_scale):
        """One engine call per device; returns each device's found-inf flag (a (1,) Tensor)."""
        groups = []  # [device, [params]], in order of first appearance
        for p in params:
            grad = getattr(p, "grad", None)
            if grad is None:
                continue
            for device, members in groups:
                if device == grad.device:
                    members.append(p)
                    break
            else:
                groups.append([grad.device, [p]])
        flags = []
        for device, members in groups:
            found_inf = init.zeros(1, device=device)
            try:
                _amp_unscale([p.grad for p in members], found_inf, inv_scale)
            except ValueError as err:
                if _PARTIAL_OVERLAP not in str(err):
                    raise
                # Rare: gradients that share memory in part (not one array, nor a reshape
                # of it). Give each its own copy; nothing was written by the refused call.
                with no_grad():
                    for p in members:
                        p.grad = p.grad.data * 1.0
                _amp_unscale([p.grad for p in members], found_inf, inv_scale)
            flags.append(found_inf)
        return flags

    # ------------------------------------------------------------------ stepping

    def step(self, optimizer, *args, **kwargs):
        """Unscales (unless ``unscale_`` ran) and calls ``optimizer.step(*args, **kwargs)``
        when no gradient holds an inf or NaN; returns what it returned, or None when the
        step was skipped. RuntimeError for a second ``step()`` before ``update()``, for a
        ``closure`` keyword, and for an optimizer without any gradient."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        state = self._state(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        if not state["found_inf"]:
            raise RuntimeError("No inf checks were recorded for this optimizer.")
        result = None
        if not self._found_inf(state):
            result = optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return result

    @staticmethod
    def _found_inf(state):
        # The one host read of the step: each device's flag.
        return any(float(flag.numpy()[0]) != 0.0 for flag in state["found_inf"])

    def update(self, new_scale=None):
        """Sets the scale for the next iteration: ``new_scale`` when given (a positive real
        number, or a one-element Tensor), else backed off when any optimizer saw an inf/NaN
        since the last update, grown after ``growth_interval`` good updates in a row.
        Returns None. RuntimeError when no unscale was recorded since the last update."""
        if not self._enabled:
            return
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if int(np.prod(new_scale.shape)) != 1:
                    raise ValueError(
                        f"GradScaler.update: new_scale must hold one element, "
                        f"has shape {tuple(new_scale.shape)}"
                    )
                new_scale = float(new_scale.numpy().reshape(-1)[0])
            self._scale = _float32(_check_scale("new_scale", new_scale))
        else:
            states = [s for s in self._per_optimizer_states.values() if s["found_inf"]]
            if not states:
                raise RuntimeError("No inf checks were recorded prior to update().")
            if any(self._found_inf(s) for s in states):
                self._scale = _float32(self._scale * self._backoff_factor)
                self._growth_tracker = 0
            else:
                successful = self._growth_tracker + 1
                if successful == self._growth_interval:
                    grown = _float32(self._scale * self._growth_factor)
                    if math.isfinite(grown):
                        self._scale = grown
                    self._growth_tracker = 0
                else:
                    self._growth_tracker = successful
        self._per_optimizer_states = {}

    # ------------------------------------------------------------------ getters

    def get_scale(self):
        """The current scale as a Python float (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def is_enabled(self):
        return self._enabled

    def get_growth_factor(self):
        return self._growth_factor

    def set_growth_factor(self, new_factor):
        self._growth_factor = _check_growth_factor(new_factor)

    def get_backoff_factor(self):
        return self._backoff_factor

    def set_backoff_factor(self, new_factor):
        self._backoff_factor = _check_backoff_factor(new_factor)

    def get_growth_interval(self):
        return self._growth_interval

    def set_growth_interval(self, new_interval):
        self._growth_interval = _check_growth_interval(new_interval)

    def _get_growth_tracker(self):
        return self._growth_tracker if self._enabled else 0

    # ------------------------------------------------------------------ state

    def state_dict(self):
        """PyTorch's keys: ``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker`` (an empty dict when disabled)."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict):
        """Restores what ``state_dict()`` returned (a no-op when disabled). RuntimeError for
        an empty dict (saved from a disabled scaler), KeyError for a missing key, and the
        constructor's errors for a bad value; nothing changes on error."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        scale = _check_scale("scale", state_dict["scale"])
        growth_factor = _check_growth_factor(state_dict["growth_factor"])
        backoff_factor = _check_backoff_factor(state_dict["backoff_factor"])
        growth_interval = _check_growth_interval(state_dict["growth_interval"])
        tracker = state_dict["_growth_tracker"]
        if isinstance(tracker, bool) or not isinstance(tracker, numbers.Integral):
            raise TypeError(f"_growth_tracker must be an int, got {type(tracker).__name__}")
        if tracker < 0:
            raise ValueError(f"Invalid _growth_tracker: {tracker} (must be >= 0)")
        self._init_scale = scale
        self._scale = _float32(scale)
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._growth_tracker = int(tracker)
