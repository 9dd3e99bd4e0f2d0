"""The course's ``needle.autograd``: Value, Tensor, TensorTuple, Op and the backward machinery.

The classes are C types (needle_c) that take part in Python's cyclic garbage
collector. Two graph modes give the same gradient values:

- ``"cycle_free"`` (default): backward runs with recording off; ``.grad`` is written on
  leaves that require grad (and nodes that called ``retain_grad()``) as plain tensors,
  so a training step's graph is freed by reference counting alone.
- ``"needle"``: the course's semantics: gradients are recorded graphs, ``.grad`` is set
  on every node, and the graphs point back into the forward graph (reference cycles
  that only the garbage collector frees). Use it to reproduce the course's leak.
"""

import contextlib

import needle_c as _c
from needle_c import (  # noqa: F401
    Op,
    Tensor,
    TensorOp,
    TensorTuple,
    TensorTupleOp,
    Value,
    compute_gradient_of_variables,
    find_topo_sort,
)

from .backend_ndarray import all_devices, cpu  # noqa: F401  (the course exports these here)

LAZY_MODE = False
GRAPH_MODES = ("cycle_free", "needle")


def __getattr__(name):
    # TENSOR_COUNTER is live (the course's counter, kept by the C types).
    if name == "TENSOR_COUNTER":
        return _c._tensor_count()
    raise AttributeError(f"module 'needle.autograd' has no attribute {name!r}")


def set_graph_mode(name):
    """Selects ``"cycle_free"`` or ``"needle"`` for later backward passes; returns the
    previous mode."""
    return _c._set_graph_mode(name)


def get_graph_mode():
    """The current graph mode: ``"cycle_free"`` or ``"needle"``."""
    return _c._get_graph_mode()


@contextlib.contextmanager
def graph_mode(name):
    """Context manager: backward passes inside use graph mode ``name``."""
    previous = _c._set_graph_mode(name)
    try:
        yield
    finally:
        _c._set_graph_mode(previous)


@contextlib.contextmanager
def no_grad():
    """Context manager (and decorator): ops inside record no graph; results are leaves
    with ``requires_grad=False``."""
    previous = _c._set_grad_enabled(False)
    try:
        yield
    finally:
        _c._set_grad_enabled(previous)


@contextlib.contextmanager
def enable_grad():
    """Context manager: recording on (undoes an enclosing ``no_grad``)."""
    previous = _c._set_grad_enabled(True)
    try:
        yield
    finally:
        _c._set_grad_enabled(previous)


def is_grad_enabled():
    """Whether ops currently record graph nodes."""
    return _c._is_grad_enabled()


def sum_node_list(node_list):
    """Sums a list of tensors with EWiseAdd (the course's helper)."""
    from functools import reduce
    from operator import add

    return reduce(add, node_list)
