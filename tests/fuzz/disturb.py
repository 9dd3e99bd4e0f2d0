"""Interference while a fuzz program runs: collections, finalizers, gc callbacks, weakref
callbacks and memory limits.

A ``Disturber`` (seeded separately from the program, so the program is the same with and
without it) is called before every instruction. Everything it runs from a finalizer or a
callback allocates and frees tensors and replaces attributes of live graph nodes with equal
values (``node.cached_data = <an equal copy>``, ``node.inputs = list(node.inputs)``), so
results must not change. ``ndl.OutOfMemoryError`` is expected in those callbacks while a
limit is set; any other exception there is recorded in ``errors`` (a finding).
"""

import gc
import random
import weakref

import numpy as np

import needle as ndl

# What the disturbances did (the long run prints it): acts, mutations, OOMs.
STATS = {"acts": 0, "mutations": 0, "ooms": 0, "collections": 0, "limits": 0}

# Python TensorOps (course style) consult this: a compute that collects runs finalizers in
# the middle of dispatch.
COLLECT_IN_COMPUTE = [False]


class Scale(ndl.autograd.TensorOp):
    """3a + 1, computed on NDArrays, gradient on Tensors."""

    def compute(self, a):
        if COLLECT_IN_COMPUTE[0]:
            gc.collect()
        return a * 3.0 + 1.0

    def gradient(self, out_grad, node):
        return out_grad * 3.0


class MulAdd(ndl.autograd.TensorOp):
    """a * b + a (broadcasting), the gradient reduced to each input's shape."""

    def compute(self, a, b):
        if COLLECT_IN_COMPUTE[0]:
            gc.collect()
        return a * b + a

    def gradient(self, out_grad, node):
        a, b = node.inputs
        return _unbroadcast(out_grad * (b + 1.0), a.shape), _unbroadcast(out_grad * a, b.shape)


def _unbroadcast(g, shape):
    extra = len(g.shape) - len(shape)
    axes = tuple(range(extra)) + tuple(
        i + extra for i, d in enumerate(shape) if d == 1 and g.shape[i + extra] != 1
    )
    if axes:
        g = ndl.summation(g, axes)
    return ndl.reshape(g, shape)


class Disturber:
    def __init__(self, seed):
        self.r = random.Random(seed * 7919 + 17)
        self.nodes = []  # weakrefs to the program's live tensors
        self.errors = []
        self.limited = False
        self.threshold = self.r.random() < 0.3
        self.use_callback = self.r.random() < 0.3
        self.collect_in_compute = self.r.random() < 0.2
        self.limit_phase = None
        if self.r.random() < 0.35:
            a = self.r.randint(0, 15)
            self.limit_phase = (a, a + self.r.randint(1, 12), self.r.choice((0, 256, 2048, 16384)))
        self._saved = None

    # -- program start / end ---------------------------------------------------------
    def start(self):
        self._saved = gc.get_threshold()
        if self.threshold:
            gc.set_threshold(1)
        if self.use_callback:
            gc.callbacks.append(self._gc_callback)
        COLLECT_IN_COMPUTE[0] = self.collect_in_compute

    def stop(self):
        COLLECT_IN_COMPUTE[0] = False
        if self._gc_callback in gc.callbacks:
            gc.callbacks.remove(self._gc_callback)
        self.unlimit()
        gc.set_threshold(*self._saved)
        self.nodes.clear()

    def unlimit(self):
        if self.limited:
            ndl.memory.set_memory_limit("cpu", None)
            self.limited = False

    # -- per instruction -------------------------------------------------------------
    def register(self, value):
        if isinstance(value, (ndl.Tensor, ndl.autograd.TensorTuple)):
            self.nodes.append(weakref.ref(value))

    def step(self, i):
        r = self.r
        if self.limit_phase is not None:
            a, b, slack = self.limit_phase
            if i == a:
                reserved = ndl.memory.memory_reserved("cpu")
                ndl.memory.set_memory_limit("cpu", reserved + slack)
                self.limited = True
                STATS["limits"] += 1
            elif i == b:
                self.unlimit()
        if r.random() < 0.12:
            STATS["collections"] += 1
            gc.collect()
        if r.random() < 0.12:
            _Finalizer(self, cyclic=True)
        if r.random() < 0.06:
            _Finalizer(self, cyclic=False)
        if r.random() < 0.08:
            t = self.scratch()
            if t is not None:
                weakref.ref(t, self._weak_callback)
                if r.random() < 0.5:
                    t.cycle = t  # dies in the next collection instead
                del t
        if r.random() < 0.05:
            self.mutate()

    def leaf_class(self):
        return FinalizingTensor if self.r.random() < 0.3 else ndl.Tensor

    # -- what finalizers and callbacks do --------------------------------------------
    def scratch(self):
        """A small tensor with a tiny graph; None when the limit refuses it."""
        try:
            x = ndl.Tensor(np.ones((2, 3), np.float32), requires_grad=self.r.random() < 0.5)
            return ndl.exp(x).sum(axes=(1,)) + 1.0
        except ndl.OutOfMemoryError:
            if not self.limited:
                raise
            STATS["ooms"] += 1
            return None

    def mutate(self):
        """Replaces attributes of a live node with equal values."""
        live = [n for n in (w() for w in self.nodes) if n is not None]
        if not live:
            return
        node = self.r.choice(live)
        STATS["mutations"] += 1
        if self.r.random() < 0.5 and isinstance(node, ndl.Tensor):
            data = node.cached_data
            if data is not None:
                try:
                    copy = tuple(a + 0.0 for a in data) if isinstance(data, tuple) else data + 0.0
                    node.cached_data = copy
                except ndl.OutOfMemoryError:
                    if not self.limited:
                        raise
        else:
            inputs = node.inputs
            if inputs is not None:
                node.inputs = list(inputs)

    def act(self):
        """Allocate, compute, free and mutate; record anything but an expected OOM."""
        STATS["acts"] += 1
        try:
            t = self.scratch()
            if t is not None:
                t.numpy()
            self.mutate()
            del t
        except Exception as err:  # noqa: BLE001 - every exception here is a finding
            self.errors.append(f"{type(err).__name__} in a finalizer/callback: {err}")

    def _gc_callback(self, phase, info):
        self.act()

    def _weak_callback(self, ref):
        self.act()


class _Finalizer:
    """A plain object whose __del__ runs ``Disturber.act`` (now, or in a collection when
    it is made part of a reference cycle)."""

    def __init__(self, disturber, cyclic):
        self.d = disturber
        if cyclic:
            self.me = self

    def __del__(self):
        self.d.act()


class FinalizingTensor(ndl.Tensor):
    """A Tensor subclass with a finalizer; the runner makes leaves of it."""

    def __del__(self):
        d = DISTURBER[0]
        if d is not None:
            d.act()


DISTURBER = [None]
