"""Gradient checkpointing (PyTorch's ``torch.utils.checkpoint``): ``checkpoint``,
``checkpoint_sequential`` and the module wrapper ``checkpoint_wrapper``.

A checkpointed call ``checkpoint(fn, *args)`` is one node of the graph (a Python op) whose
inputs are the tensor arguments and the tensors requiring grad that ``fn`` reads from
elsewhere (a module's parameters), and whose data is ``fn``'s result: ``fn``'s intermediate
tensors are freed as soon as the forward has run. Its gradient runs ``fn`` again, with
NumPy's RNG state (and needle's RNG mode) as they were before the forward, so dropout draws
the same masks (a draw whose values are not read, ``Dropout(0)``'s, is not made again: the
recomputation sets the state the forward's left), and backpropagates through that
recomputation:

- when the backward records nothing (``"cycle_free"`` mode, the default), the recomputation
  runs on fresh leaves holding the inputs' data and a cycle_free backward of its own;
- when it records (``"needle"`` mode, ``create_graph=True``), the recomputation runs on the
  real inputs and its gradient is recorded, so the gradient is a graph back to them and can
  be differentiated again.

The parameters ``fn`` reads are inputs of the node, not something the inner backward writes
``.grad`` on, so a parameter used by several checkpointed calls (or also outside them) gets
the sum of every use, as without checkpointing; the inner backward leaves their ``.grad`` as
it found it.

PyTorch has two implementations (``use_reentrant=True`` and ``False``); needle has this one,
which both values (and None) run, so they give the same result: the keyword is accepted so
that PyTorch code runs unchanged.
"""

import contextlib

import numpy as np

from .. import autograd, init
from .. import random as _random
from ..autograd import Tensor, TensorOp, TensorTuple, TensorTupleOp
from ..nn.nn_basic import Module, Sequential

# "default": the recomputation's outputs must have the forward's count, shapes and devices;
# "values": also its values (within VALUES_RTOL / VALUES_ATOL); "none": no check.
DETERMINISM_CHECKS = ("default", "values", "none")
VALUES_RTOL = 1e-5
VALUES_ATOL = 1e-6
# The keyword arguments checkpoint() takes besides fn and its arguments; checkpoint_sequential
# and checkpoint_wrapper pass them on, and check them when called rather than at the forward.
CHECKPOINT_OPTIONS = ("preserve_rng_state", "determinism_check", "use_reentrant")


def _check_options(caller, preserve_rng_state, determinism_check, use_reentrant):
    """TypeError / ValueError, naming ``caller``, for a bad value of checkpoint's options."""
    if not isinstance(preserve_rng_state, bool):
        raise TypeError(f"{caller}: preserve_rng_state must be a bool, got {preserve_rng_state!r}")
    if use_reentrant is not None and not isinstance(use_reentrant, bool):
        raise TypeError(f"{caller}: use_reentrant must be a bool or None, got {use_reentrant!r}")
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(
            f"{caller}: determinism_check must be one of {DETERMINISM_CHECKS}, "
            f"got {determinism_check!r}"
        )


def _check_option_kwargs(caller, kwargs):
    """Checks keyword arguments meant for checkpoint(): unknown names are a TypeError naming
    them (as Python's own call would be), known ones are checked as checkpoint checks them."""
    unknown = sorted(name for name in kwargs if name not in CHECKPOINT_OPTIONS)
    if unknown:
        raise TypeError(
            f"{caller}: unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"checkpoint takes {', '.join(CHECKPOINT_OPTIONS)}"
        )
    options = {"preserve_rng_state": True, "determinism_check": "default", "use_reentrant": None}
    options.update(kwargs)
    _check_options(caller, **options)


class _RngState:
    """What random draws depend on (NumPy's global RNG, which also keys the device generator,
    and needle's RNG mode), taken before the forward and put back for the recomputation."""

    def __init__(self):
        self.numpy = np.random.get_state()
        self.mode = _random.get_rng_mode()
        # NumPy's state after each unread draw of the forward (Dropout(0)'s), which the
        # recomputation sets instead of drawing again.
        self.unread = []

    @contextlib.contextmanager
    def recorded(self):
        with _random.recording_unread_draws() as states:
            yield
        self.unread = states

    @contextlib.contextmanager
    def replayed(self):
        outer_numpy, outer_mode = np.random.get_state(), _random.get_rng_mode()
        np.random.set_state(self.numpy)
        _random.set_rng_mode(self.mode)
        try:
            with _random.replaying_unread_draws(self.unread):
                yield
        finally:
            np.random.set_state(outer_numpy)
            _random.set_rng_mode(outer_mode)


def _output_tensors(result):
    """fn's result as (a tuple of Tensors, whether it was one Tensor); TypeError otherwise."""
    if isinstance(result, Tensor):
        return (result,), True
    if isinstance(result, (tuple, list, TensorTuple)) and len(result) > 0:
        items = tuple(result)
        if all(isinstance(item, Tensor) for item in items):
            return items, False
    kind = type(result).__name__
    raise TypeError(
        f"checkpoint: fn must return a Tensor or a non-empty tuple or list of Tensors, got {kind}"
    )


def _walk_to(roots, stop):
    """The nodes the graph of ``roots`` reaches, in topological order (inputs first), not
    going past a node whose id is in ``stop`` or a leaf."""
    order, visited = [], set()
    stack = [(root, False) for root in reversed(roots)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        if id(node) not in stop and node.op is not None:
            stack.extend((x, False) for x in reversed(node.inputs) if id(x) not in visited)
    return order


def _captured_tensors(outputs, tensor_args):
    """The leaves requiring grad that fn's recorded graph reaches other than through its
    arguments: the parameters (and any other tensor) it closes over."""
    stop = {id(x) for x in tensor_args}
    return [
        node
        for node in _walk_to(outputs, stop)
        if id(node) not in stop and node.op is None and node.requires_grad
    ]


def _recorded_gradients(outputs, out_grads, inputs):
    """The gradients of ``outputs`` (seeded with ``out_grads``) with respect to each of
    ``inputs``, recorded: reverse mode over the graph between them, run with the ops' own
    gradients. A tensor that appears in ``inputs`` more than once gets its gradient at its
    first position and zeros at the others; one the outputs do not reach gets zeros."""
    first = {}
    for k, x in enumerate(inputs):
        first.setdefault(id(x), k)
    order = _walk_to(outputs, first)
    contributions = {}
    for out, grad in zip(outputs, out_grads):
        contributions.setdefault(id(out), []).append(grad)
    grads = [None] * len(inputs)
    for node in reversed(order):
        parts = contributions.pop(id(node), None)
        if parts is None:
            continue
        adjoint = autograd.sum_node_list(parts)
        if id(node) in first:
            grads[first[id(node)]] = adjoint
            continue
        if node.op is None:
            continue
        for x, partial in zip(node.inputs, node.op.gradient_as_tuple(adjoint, node)):
            contributions.setdefault(id(x), []).append(partial)
    return [g if g is not None else init.zeros_like(x) for g, x in zip(grads, inputs)]


class _CheckpointMixin:
    """The op of one checkpointed call. Its inputs are the tensor arguments then the captured
    tensors; ``template`` is the argument list with None where a tensor argument goes."""

    def __init__(self, function, template, positions, rng, forward_arrays, determinism_check):
        self.function = function
        self.template = template
        self.positions = positions
        self.rng = rng
        self.shapes = tuple(tuple(a.shape) for a in forward_arrays)
        self.devices = tuple(a.device for a in forward_arrays)
        self.determinism_check = determinism_check
        # Handed to compute once, when checkpoint() makes the node.
        self.pending = forward_arrays

    def _result(self):
        raise NotImplementedError

    def compute(self, *arrays):
        if self.pending is None:
            raise RuntimeError("checkpoint: this op's data comes from checkpoint(), only once")
        arrays, self.pending = self.pending, None
        return self._result(arrays)

    def _recompute(self, tensor_inputs):
        args = list(self.template)
        for position, x in zip(self.positions, tensor_inputs):
            args[position] = x
        rng = self.rng.replayed() if self.rng is not None else contextlib.nullcontext()
        with autograd.enable_grad(), rng:
            result = self.function(*args)
        outputs, _ = _output_tensors(result)
        self._check(outputs)
        return outputs

    def _check(self, outputs):
        if self.determinism_check == "none":
            return
        shapes = tuple(tuple(o.shape) for o in outputs)
        devices = tuple(o.device for o in outputs)
        if shapes != self.shapes or devices != self.devices:
            raise RuntimeError(
                f"checkpoint: recomputing fn in the backward gave outputs of shapes {shapes} on "
                f"{devices}, but the forward gave {self.shapes} on {self.devices}: fn must "
                "compute the same thing from the same inputs and random state (pass "
                "determinism_check='none' to skip this check)"
            )
        if self.determinism_check == "values":
            for k, (out, forward) in enumerate(zip(outputs, self._forward_outputs)):
                if not np.allclose(out.numpy(), forward.numpy(), VALUES_RTOL, VALUES_ATOL):
                    raise RuntimeError(
                        f"checkpoint: recomputing fn in the backward gave other values for "
                        f"output {k} than the forward: fn is not deterministic (a random draw "
                        "needle does not replay, or state that changed between the forward "
                        "and the backward)"
                    )

    def gradient(self, out_grad, node):
        inputs = tuple(node.inputs)
        count = len(self.positions)
        self._forward_outputs = self._node_outputs(node)
        try:
            if autograd.is_grad_enabled():
                outputs = self._recompute(inputs[:count])
                grads = _recorded_gradients(outputs, self._split(out_grad), inputs)
            else:
                grads = self._plain_gradients(out_grad, inputs, count)
        finally:
            self._forward_outputs = None
        return tuple(grads)

    def _plain_gradients(self, out_grad, inputs, count):
        leaves = [
            Tensor.make_const(x.realize_cached_data(), requires_grad=x.requires_grad)
            for x in inputs[:count]
        ]
        captured = inputs[count:]
        outputs = self._recompute(leaves)
        if not any(o.requires_grad for o in outputs):
            return [init.zeros_like(x) for x in inputs]
        if len(outputs) == 1:
            root = outputs[0]
        else:
            with autograd.enable_grad():
                root = TensorTuple.make_from_op(_make_tuple(), outputs)
        saved = [x.grad for x in captured]
        try:
            for x in captured:
                x.grad = None
            # the parameters' hooks fire once, in the outer backward, on the summed gradient
            with autograd.graph_mode("cycle_free"), autograd._hooks_paused():
                root.backward(out_grad)
            found = [leaf.grad if x.requires_grad else None for leaf, x in zip(leaves, inputs)]
            found += [x.grad for x in captured]
        finally:
            for x, grad in zip(captured, saved):
                x.grad = grad
        return [
            g if g is not None or not x.requires_grad else init.zeros_like(x)
            for g, x in zip(found, inputs)
        ]


def _make_tuple():
    from ..ops import MakeTensorTuple

    return MakeTensorTuple()


class _Checkpoint(_CheckpointMixin, TensorOp):
    def _result(self, arrays):
        return arrays[0]

    @staticmethod
    def _node_outputs(node):
        return (node,)

    @staticmethod
    def _split(out_grad):
        return (out_grad,)


class _CheckpointTuple(_CheckpointMixin, TensorTupleOp):
    def _result(self, arrays):
        return tuple(arrays)

    @staticmethod
    def _node_outputs(node):
        return tuple(node.tuple())

    @staticmethod
    def _split(out_grad):
        return tuple(out_grad.tuple())


def checkpoint(
    function, *args, use_reentrant=None, preserve_rng_state=True, determinism_check="default"
):
    """``function(*args)``, keeping only its inputs and outputs for the backward, which runs
    ``function`` again (PyTorch's ``torch.utils.checkpoint.checkpoint``).

    ``function`` returns a Tensor or a tuple/list of Tensors (a tuple comes back as a tuple);
    anything else is a TypeError. Tensor arguments are inputs of the checkpointed node;
    other arguments are passed to both runs as they are; a TensorTuple argument is a
    TypeError (pass its items). Tensors that ``function`` reads from elsewhere and that
    require grad (a module's parameters) are found in the forward's graph and get their
    gradients too. ``preserve_rng_state`` replays NumPy's RNG state (and needle's RNG mode)
    in the recomputation, so dropout draws the same masks. ``determinism_check``:
    ``"default"`` checks that the recomputation's outputs have the forward's number, shapes
    and devices, ``"values"`` also compares their values (within rtol 1e-5, atol 1e-6: it
    copies them to the host, a cost), ``"none"`` checks nothing; a difference raises
    RuntimeError in the backward. ``use_reentrant`` (True, False or None) is PyTorch's choice
    between its two implementations; needle has one, which every value runs, so the result
    is the same whichever is passed. ``preserve_rng_state`` must be a bool and
    ``use_reentrant`` a bool or None (TypeError otherwise).

    With recording off (``no_grad``) it is ``function(*args)``. ValueError when no tensor
    ``function`` depends on requires grad (there would be nothing to recompute for).
    """
    if not callable(function):
        raise TypeError(f"checkpoint: fn must be callable, got {type(function).__name__}")
    _check_options("checkpoint", preserve_rng_state, determinism_check, use_reentrant)
    for position, arg in enumerate(args):
        if isinstance(arg, TensorTuple):
            raise TypeError(
                f"checkpoint: argument {position} is a TensorTuple; pass its Tensors instead"
            )
    if not autograd.is_grad_enabled():
        return function(*args)
    rng = _RngState() if preserve_rng_state else None
    with rng.recorded() if rng is not None else contextlib.nullcontext():
        result = function(*args)
    outputs, single = _output_tensors(result)
    positions = [k for k, arg in enumerate(args) if isinstance(arg, Tensor)]
    tensor_args = [args[k] for k in positions]
    captured = _captured_tensors(outputs, tensor_args)
    if not captured and not any(x.requires_grad for x in tensor_args):
        raise ValueError(
            "checkpoint: no tensor argument of fn, and no tensor fn reads, requires a gradient, "
            "so there is nothing to recompute for; call fn directly (or under ndl.no_grad())"
        )
    template = [None if isinstance(arg, Tensor) else arg for arg in args]
    arrays = [o.realize_cached_data() for o in outputs]
    op_type = _Checkpoint if single else _CheckpointTuple
    op = op_type(function, template, positions, rng, arrays, determinism_check)
    # fn's own graph goes here: the node keeps the arrays, not the tensors that made them.
    del outputs
    node = op(*tensor_args, *captured)
    return node if single else tuple(node.tuple())


def checkpoint_sequential(functions, segments, input, **kwargs):
    """Runs ``functions`` (an ``nn.Sequential`` or a list of modules or callables) on
    ``input`` in ``segments`` consecutive segments, checkpointing each but the last, which
    runs as usual (PyTorch's ``torch.utils.checkpoint.checkpoint_sequential``). ``kwargs``
    go to :func:`checkpoint` (``use_reentrant``, ``preserve_rng_state``,
    ``determinism_check``; another name is a TypeError, even with one segment, where
    checkpoint is not called). ``segments`` is an integer from 1 to the number of functions.
    """
    _check_option_kwargs("checkpoint_sequential", kwargs)
    if isinstance(functions, Sequential):
        functions = functions.modules
    functions = list(functions)
    if isinstance(segments, bool) or not isinstance(segments, int):
        raise TypeError(f"checkpoint_sequential: segments must be an int, got {segments!r}")
    if not 1 <= segments <= max(len(functions), 1):
        raise ValueError(
            f"checkpoint_sequential: segments must be in [1, {len(functions)}] for "
            f"{len(functions)} functions, got {segments}"
        )
    size = len(functions) // segments
    bounds = [(k * size, (k + 1) * size) for k in range(segments - 1)]
    for start, end in bounds:
        input = checkpoint(_run_segment(functions[start:end]), input, **kwargs)
    start = bounds[-1][1] if bounds else 0
    return _run_segment(functions[start:])(input)


def _run_segment(functions):
    def run(x):
        for function in functions:
            x = function(x)
        return x

    return run


class CheckpointWrapper(Module):
    """A module whose forward is ``checkpoint(module, *args, **checkpoint_kwargs)``: its
    parameters are the wrapped module's, and ``train()`` / ``eval()`` reach it.
    ``checkpoint_kwargs`` are checked here, not at the first forward: a name checkpoint does
    not take is a TypeError naming it."""

    def __init__(self, module, **checkpoint_kwargs):
        super().__init__()
        if not callable(module):
            raise TypeError(
                f"checkpoint_wrapper: module must be callable, got {type(module).__name__}"
            )
        _check_option_kwargs("checkpoint_wrapper", checkpoint_kwargs)
        self.module = module
        self.checkpoint_kwargs = checkpoint_kwargs

    def forward(self, *args):
        return checkpoint(self.module, *args, **self.checkpoint_kwargs)


def checkpoint_wrapper(module, **checkpoint_kwargs):
    """``module`` wrapped so that each call is checkpointed (the name of PyTorch's
    ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``). To checkpoint every
    layer of a model, replace each layer by its wrapper."""
    return CheckpointWrapper(module, **checkpoint_kwargs)
