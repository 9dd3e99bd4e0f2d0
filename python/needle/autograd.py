"""The course's ``needle.autograd``: Value, Tensor, TensorTuple, Op and the backward machinery.

The classes are C types (needle_c) that take part in Python's cyclic garbage
collector. Two graph modes give the same gradient values:

- ``"cycle_free"`` (default): backward runs with recording off; ``.grad`` is written on
  leaves that require grad (and nodes that called ``retain_grad()``) as plain tensors,
  so a training step's graph is freed by reference counting alone. As in PyTorch, a
  backward adds into a ``.grad`` that is already there (``opt.reset_grad()`` or
  ``opt.zero_grad()`` before each step, as the course's loops do, starts from None).
- ``"needle"``: the course's semantics: gradients are recorded graphs, ``.grad`` is set
  (replaced, not added to) on every node, and the graphs point back into the forward graph
  (reference cycles that only the garbage collector frees). Use it to reproduce the
  course's leak.

Gradient hooks work as PyTorch's, in both modes: ``t.register_hook(fn)`` calls ``fn(grad)``
once the gradient with respect to ``t`` is summed, before it is written to ``.grad`` or
passed on (a Tensor it returns, of the same shape and dtype, replaces it), and
``leaf.register_post_accumulate_grad_hook(fn)`` calls ``fn(leaf)`` once the leaf's ``.grad``
holds this backward's gradient. Both return a :class:`RemovableHandle`. Hooks run in
registration order, in the order the backward reaches their tensors. A hook that raises
ends the backward with its exception: the leaves reached before it keep the ``.grad``
written to them, the others keep theirs, the graph is unchanged (another backward may run
on it), and callbacks queued for the backward's end are dropped.

The mode is per thread, like ``no_grad``: ``with graph_mode(name):`` sets the mode of the
thread that enters it, and no other. ``set_graph_mode(name)`` sets the process default,
which every thread without an active ``graph_mode`` context follows (the calling thread
included, and every thread started later); inside a context the context's mode stays in
force for that thread until the context exits.
"""

import contextlib

import needle_c as _c
from needle_c import (  # noqa: F401
    GRAPH_MODES,
    Op,
    RemovableHandle,
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


def __getattr__(name):
    # TENSOR_COUNTER is live (the course's counter, kept by the C types).
    if name == "TENSOR_COUNTER":
        return _c._tensor_count()
    raise AttributeError(f"module 'needle.autograd' has no attribute {name!r}")


def set_graph_mode(name):
    """Sets the process default graph mode, one of ``GRAPH_MODES``; returns the previous
    default.

    Every thread without an active ``graph_mode`` context follows the default (the
    calling thread, other running threads, threads started later); a thread inside a
    ``graph_mode`` context keeps the context's mode until it exits. Raises ``TypeError``
    for a non-str and ``ValueError`` for an unknown name."""
    return _c._set_graph_mode(name)


def get_graph_mode():
    """The graph mode this thread's backward passes use: its innermost ``graph_mode``
    context's, else the process default."""
    return _c._get_graph_mode()


@contextlib.contextmanager
def graph_mode(name):
    """Context manager: backward passes in this thread (and no other) use graph mode
    ``name`` inside; the thread's previous mode is restored on exit."""
    previous = _c._enter_graph_mode(name)
    try:
        yield
    finally:
        _c._exit_graph_mode(previous)


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


def _queue_callback(fn):
    """Runs ``fn()`` when the outermost backward running in this thread returns (PyTorch's
    ``Variable._execution_engine.queue_callback``): a hook that starts work (an all-reduce)
    queues what finishes it. Not run when the backward raises. RuntimeError outside a
    backward."""
    return _c._queue_backward_callback(fn)


def _backward_id():
    """The number of the outermost backward running in this thread (0 when none): a hook
    tells a new backward from the one it last ran in."""
    return _c._backward_id()


@contextlib.contextmanager
def _hooks_paused():
    """Context manager: no gradient hook runs in this thread inside (checkpoint's inner
    backward, whose gradients are partial sums the outer backward adds up first)."""
    previous = _c._set_hooks_paused(True)
    try:
        yield
    finally:
        _c._set_hooks_paused(previous)
