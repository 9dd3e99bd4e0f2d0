"""Garbage for the collection tests: reference cycles that hold device memory, one made of
needle's own objects (which the scoped collection frees) and one through a dict (which only a
full collection frees)."""

import weakref

import numpy as np

import needle as ndl
from needle import backend_ndarray as nd


def dict_cycle(nbytes):
    """A dict that refers to itself and holds an array of nbytes; returns nothing (it is
    garbage)."""
    holder = {"array": nd.empty((nbytes // 4,))}
    holder["self"] = holder


def needle_cycle(nbytes):
    """A needle-only cycle holding at least nbytes, made without a backward pass (which would
    be a safe point of the pressure policy): a.grad is a tensor computed from a. Returns a weak
    reference to a."""
    a = ndl.Tensor(np.ones((nbytes // 4,), dtype=np.float32), requires_grad=True)
    a.grad = a * 1.0
    return weakref.ref(a)
