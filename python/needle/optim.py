"""The course's optimizers (``needle.optim``): Optimizer, SGD and Adam.

A step updates each parameter with one fused engine call (``needle_c.adam_update`` /
``needle_c.sgd_update``: one pass over the data, one kernel launch on a GPU, no host
synchronisation) that computes the course's formulas in the order of its unfused code, in
float64 for a float64 parameter (as PyTorch does) and in float32 otherwise: a float16 or
bfloat16 parameter is widened and its results rounded once, as PyTorch's opmath does. The
state is kept in the parameter's dtype. The parameter gets a NEW array (``p.data = new``
in the course), so a tensor holding the old ``p.data`` keeps the old values; the
optimizer's state (``m``, ``v``, ``u``) is private and is updated IN PLACE: a tensor taken
from ``opt.m[p]`` follows the updates. ``Adam(..., capturable=True)`` (for CUDA graphs, see
:class:`Adam`) keeps its step counter and learning rate in device memory and updates each
parameter in place.

Hyper-parameters are checked at construction, as ``torch.optim`` does, and NaN and
infinities are refused as well: ValueError ("Invalid ...") for ``lr < 0``, ``momentum``
outside [0, 1) (the course's dampened momentum never moves at 1 and diverges above),
``eps <= 0``, ``beta1``/``beta2`` outside [0, 1) and ``weight_decay < 0``; TypeError for a
value that is not a real number (a bool, a str, None).

A step records no graph, leaves each parameter a leaf (``op is None``) and keeps no
reference to the graph that produced the gradients: the state dicts hold plain detached
tensors. Parameters whose ``grad`` is None are skipped. ``clip_grad_norm`` exists on every
optimizer (the course has it on SGD only), and so does PyTorch's ``zero_grad(set_to_none=True)``
beside the course's ``reset_grad()``.

Before ``step()`` (every subclass's, a user's too) and ``clip_grad_norm()`` read the
gradients, the gradient checks run: DistributedDataParallel registers one that refuses
gradients it has not averaged over the ranks (RuntimeError). With none registered the cost is
one test of an empty set.
"""

import functools
import weakref

import numpy as np

import needle_c as _c
from needle_c import adam_count_step as _adam_count_step
from needle_c import adam_update as _adam_update
from needle_c import sgd_update as _sgd_update

from . import init, memory
from ._checks import check_count, check_real
from .autograd import Tensor, no_grad
from .backend_ndarray import NDArray

# Objects with a check_grads(params) method that raises when the gradients of params must not
# be read yet (DistributedDataParallel's reducers); weak, so a dropped wrapper stops checking.
_GRAD_CHECKS = weakref.WeakSet()


def _register_grad_check(checker):
    """Makes every optimizer call ``checker.check_grads(params)`` before it reads gradients."""
    _GRAD_CHECKS.add(checker)


def _check_grads(params):
    for checker in list(_GRAD_CHECKS):
        checker.check_grads(params)


def _set_param_data(p, new, capturing):
    """``p``'s data becomes ``new``: a new array as the course's optimizers do, or, while a
    CUDA graph is being captured, ``new``'s values written into ``p``'s own memory, since
    each replay must read the parameters the previous replay wrote (a new array would leave
    every replay stepping from the captured values)."""
    if capturing:
        p.cached_data[...] = new
    else:
        p.cached_data = new


class Optimizer:
    """Base class holding the list of parameters to update."""

    def __init_subclass__(cls, **kwargs):
        # A subclass's own step() (the course's way to write an optimizer) runs the gradient
        # checks first, as the built-in ones do.
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is None or getattr(step, "_runs_grad_checks", False):
            return

        @functools.wraps(step)
        def checked_step(self, *args, **kwargs):
            if _GRAD_CHECKS:
                _check_grads(self.params)
            return step(self, *args, **kwargs)

        checked_step._runs_grad_checks = True
        cls.step = checked_step

    def __init__(self, params):
        self.params = list(params)
        for i, p in enumerate(self.params):
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer parameter {i} is a {type(p).__name__}, not a Tensor")

    def step(self):
        """Applies one update to every parameter that has a gradient; returns None."""
        raise NotImplementedError()

    def reset_grad(self):
        """Sets ``p.grad = None`` on every parameter; returns None."""
        for p in self.params:
            p.grad = None
        # The gradients pinned the previous step's graph: a good moment for the pressure policy.
        memory.safe_point()

    def zero_grad(self, set_to_none=True):
        """PyTorch's name for clearing the gradients; returns None.

        ``set_to_none=True`` (the default, as in PyTorch) is :meth:`reset_grad`: every
        ``p.grad`` becomes None. ``set_to_none=False``: every ``p.grad`` that is not None is
        replaced by a NEW detached tensor of zeros of that gradient's shape, dtype and device
        (``requires_grad=False``); a ``p.grad`` that is None stays None. Unlike PyTorch's
        in-place ``zero_()``, a reference to the old ``.grad`` keeps its values: a needle
        gradient may share its data with other tensors (DistributedDataParallel's bucket
        views, one array given to several parameters), which zeroing in place would change.
        TypeError when ``set_to_none`` is not a bool."""
        if not isinstance(set_to_none, bool):
            raise TypeError(
                f"zero_grad: set_to_none must be a bool, got {type(set_to_none).__name__}"
            )
        if set_to_none:
            self.reset_grad()  # a subclass's reset_grad is honoured too
            return
        for p in self.params:
            if p.grad is not None:
                p.grad = init.zeros_like(p.grad, requires_grad=False)
        # The replaced gradients pinned the previous step's graph, as in reset_grad.
        memory.safe_point()

    def clip_grad_norm(self, max_norm=0.25):
        """Scales all gradients so that their global L2 norm is at most ``max_norm``.

        The norm is computed in NumPy over every ``p.grad`` that is not None;
        ``coef = max_norm / (norm + 1e-6)``. When ``coef < 1`` each ``p.grad`` is
        replaced by a new detached tensor ``p.grad * coef`` (the old gradient tensor is
        not modified). Returns the total norm before clipping, as a Python float.
        """
        check_real("max_norm", max_norm, low=0.0, finite=False)
        if _GRAD_CHECKS:
            _check_grads(self.params)
        grads = [p for p in self.params if getattr(p, "grad", None) is not None]
        total = 0.0
        for p in grads:
            g = p.grad.numpy().astype(np.float64)
            total += float(np.sum(g * g))
        norm = float(np.sqrt(total))
        coef = max_norm / (norm + 1e-6)
        if coef < 1:
            with no_grad():
                for p in grads:
                    p.grad = p.grad.data * coef
        return norm

    @staticmethod
    def _zeros_like(p):
        return init.zeros(*p.shape, device=p.device, dtype=p.dtype)


class SGD(Optimizer):
    """SGD with the course's dampened momentum.

    ``u = momentum * u + (1 - momentum) * (grad + weight_decay * p)``, then
    ``p = p - lr * u``; ``u`` starts at zeros and is kept in ``self.u`` keyed by the
    parameter object (updated in place each step).
    """

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0):
        super().__init__(params)
        check_real("lr", lr, low=0.0)
        check_real("momentum", momentum, low=0.0, high=1.0, high_open=True)
        check_real("weight_decay", weight_decay, low=0.0)
        self.lr = lr
        self.momentum = momentum
        self.u = {}
        self.weight_decay = weight_decay

    def step(self):
        """Updates every parameter with a gradient: ``p.data`` becomes a new array (the old
        one is not modified), ``self.u[p]`` is updated in place; returns None."""
        lr, momentum, wd = self.lr, self.momentum, self.weight_decay
        states = self.u
        capturing = _c._graph_capturing()
        for p in self.params:
            grad = getattr(p, "grad", None)
            if grad is None:
                continue
            u = states.get(p)
            if u is None:
                u = states[p] = self._zeros_like(p)
            _set_param_data(p, _sgd_update(p, grad, u, lr, momentum, wd), capturing)


class Adam(Optimizer):
    """Adam with L2 weight decay added to the gradient and bias-corrected moments.

    ``m = beta1 * m + (1 - beta1) * g`` and ``v = beta2 * v + (1 - beta2) * g * g`` with
    ``g = grad + weight_decay * p``, then ``p = p - lr * m_hat / (sqrt(v_hat) + eps)`` with
    ``m_hat = m / (1 - beta1**t)`` and ``v_hat = v / (1 - beta2**t)``. State: step counter
    ``self.t`` (incremented once per ``step()``) and the moment estimates ``self.m`` /
    ``self.v`` keyed by the parameter object (updated in place each step). ``beta**t`` is
    computed by squaring in double-double arithmetic (the correctly rounded power but in
    rare near-ties), the same bits on the host and in a GPU kernel.

    ``capturable=True`` (PyTorch's flag, for CUDA graphs; a bool, TypeError otherwise):
    the step counter and the learning rate live in device memory, one float64 array
    ``[t, lr]`` per device the parameters are on, and ``step()`` queues only device work
    that reads them when it runs: a one-thread kernel per device that adds 1 to ``t``, then
    the fused update of each parameter, which computes the bias corrections from ``t`` on
    the device. Nothing on the host changes from step to step, so a step can be captured
    into a CUDA graph (``with ndl.cuda.graph(g): opt.step()``, after one eager step as
    PyTorch asks) and each ``g.replay()`` is one more step; without the flag a step inside
    a capture raises ``needle.DeviceError`` (its lr and bias corrections would be frozen).
    Capturable and non-capturable steps compute the same formula in the same order and
    give the same bits. Differences with the flag: each parameter is updated IN PLACE, as
    PyTorch does (a replay reads and writes the captured memory), so a tensor holding the
    old ``p.data`` sees the new values; reading ``opt.t`` copies ``t`` back from the
    device (a host synchronisation, and outside a capture); setting ``opt.lr`` or
    ``opt.t`` writes the device copies (host-to-device copies, outside a capture: a
    captured graph reads the new lr at its next replay). ``capturable`` cannot be changed
    after construction.
    """

    def __init__(
        self,
        params,
        lr=0.01,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        weight_decay=0.0,
        capturable=False,
    ):
        super().__init__(params)
        check_real("lr", lr, low=0.0)
        check_real("beta1", beta1, low=0.0, high=1.0, high_open=True)
        check_real("beta2", beta2, low=0.0, high=1.0, high_open=True)
        check_real("eps", eps, low=0.0, low_open=True)
        check_real("weight_decay", weight_decay, low=0.0)
        if not isinstance(capturable, bool):
            raise TypeError(f"capturable must be a bool, got {type(capturable).__name__}")
        self._capturable = capturable
        self._device_states = {}  # capturable: device -> float64 NDArray [t, lr]
        self._lr = lr
        self._t = 0
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.weight_decay = weight_decay
        if capturable:
            for p in self.params:
                self._device_state(p.device)

        self.m = {}
        self.v = {}

    @property
    def capturable(self):
        """Whether ``t`` and ``lr`` live in device memory (fixed at construction)."""
        return self._capturable

    @property
    def lr(self):
        """The learning rate (a float); setting it checks it as the constructor does and,
        when capturable, writes every device copy."""
        return self._lr

    @lr.setter
    def lr(self, value):
        check_real("lr", value, low=0.0)
        if self._capturable:
            for state in self._device_states.values():
                state[1:2] = np.array([float(value)])
        self._lr = value

    @property
    def t(self):
        """Steps taken (an int). When capturable it is read from the device, a host
        synchronisation (it counts the replays of a captured step too)."""
        if self._capturable and self._device_states:
            state = next(iter(self._device_states.values()))
            return int(state.numpy()[0])
        return self._t

    @t.setter
    def t(self, value):
        value = check_count("t", value, low=0)
        if self._capturable:
            for state in self._device_states.values():
                state[0:1] = np.array([float(value)])
        self._t = value

    def _device_state(self, device):
        """The ``[t, lr]`` float64 array on ``device``, made (host-to-device) when new."""
        state = self._device_states.get(device)
        if state is None:
            t = self.t  # another device's count, when there is one
            state = NDArray(np.array([t, self._lr], np.float64), device=device, dtype="float64")
            self._device_states[device] = state
        return state

    def step(self):
        """Updates every parameter with a gradient: ``p.data`` becomes a new array (the old
        one is not modified; with ``capturable=True`` it is updated in place instead),
        ``self.m[p]`` and ``self.v[p]`` are updated in place; returns None."""
        if self._capturable:
            self._capturable_step()
            return
        lr, beta1, beta2, eps, wd, t = (
            self._lr,
            self.beta1,
            self.beta2,
            self.eps,
            self.weight_decay,
            self._t + 1,
        )
        for p in self.params:
            grad = getattr(p, "grad", None)
            if grad is None:
                continue
            m, v = self._moments(p)
            p.cached_data = _adam_update(p, grad, m, v, lr, beta1, beta2, eps, wd, t)
        # Counted once the updates ran: a step refused at its first parameter (one inside a
        # CUDA graph capture) leaves t as it was.
        self._t = t

    def _moments(self, p):
        """``p``'s moment estimates (m, v), zeros the first time."""
        m = self.m.get(p)
        if m is None:
            m = self.m[p] = self._zeros_like(p)
        v = self.v.get(p)
        if v is None:
            v = self.v[p] = self._zeros_like(p)
        return m, v

    def _capturable_step(self):
        # Device work only, in stream order: each device's t += 1, then the updates, which
        # read t and lr when they run.
        with_grad = [p for p in self.params if getattr(p, "grad", None) is not None]
        for p in with_grad:  # a parameter moved to a new device since construction
            if p.device not in self._device_states:
                self._device_state(p.device)
        for state in self._device_states.values():
            _adam_count_step(state)
        beta1, beta2, eps, wd = self.beta1, self.beta2, self.eps, self.weight_decay
        states = self._device_states
        for p in with_grad:
            m, v = self._moments(p)
            _adam_update(p, p.grad, m, v, None, beta1, beta2, eps, wd, None, states[p.device])
