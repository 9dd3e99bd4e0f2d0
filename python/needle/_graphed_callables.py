"""``ndl.cuda.make_graphed_callables`` (PyTorch's ``torch.cuda.make_graphed_callables``):
part of a network, forward and backward, replayed as two CUDA graphs inside an eager
training loop.

For each callable (a function or an ``nn.Module``) it warms up (eager forward and
backward on a side stream), captures the forward into one graph and the backward into
another, both in one memory pool, and returns a callable that replays them: called, it
copies its arguments into the static inputs, replays the forward graph and returns the
outputs as one autograd node, whose gradient copies the incoming gradients into the static
grad-outputs, replays the backward graph and hands the static gradients on, so they
accumulate into the parameters' ``.grad`` (and flow to the arguments) as an eager backward's
would. A module comes back with its ``forward`` replaced; it replays only while its
``training`` flag is what it was at capture and runs its own forward otherwise.

Where needle differs from PyTorch, it is to keep eager semantics without PyTorch's
machinery (version counters, AccumulateGrad's buffer stealing):
- Outputs and gradients are copies of the static tensors, not aliases: a result stays
  valid after the next call, and a ``.grad`` never shares memory that a replay rewrites.
- needle's optimizers give a parameter a new array each step instead of writing the old
  one; a call copies such a parameter's values into the array the graphs read.
- The static inputs are needle's own copies of ``sample_args`` (later calls leave the
  sample tensors alone), and tensors requiring grad that the callable reads from elsewhere
  (closed over, not module parameters) get their gradients too.
- The captured backward writes ``.grad`` on the parameters, so their ``.grad`` must be None
  when the callables are made (RuntimeError otherwise); the result leaves them None.
- A module whose forward rebinds a buffer while capturing cannot be replayed (a replay would
  not move it): RuntimeError. (BatchNorm writes its running statistics in place while a
  capture runs, so it replays in training mode.)
As in PyTorch, a graphed call's backward is valid for its last call only (the static
tensors hold one call's activations), callables that share a pool must run in the order
they were given, and the gradient cannot be differentiated again.
"""

import weakref

from . import autograd
from ._cuda_graphs import CUDAGraph, _PoolHandle, graph, graph_pool_handle
from ._cuda_stream import Stream, _ordinal
from ._cuda_stream import stream as _stream_context
from .autograd import Tensor, TensorOp, TensorTuple, TensorTupleOp
from .backend_ndarray import ndarray as _nd
from .nn.nn_basic import Module

__all__ = ["make_graphed_callables"]

_NAME = "make_graphed_callables"


def _empty_like(t):
    """A new constant tensor of ``t``'s shape, dtype and device, not initialised."""
    return Tensor.make_const(_nd.empty(t.shape, dtype=t.dtype, device=t.device))


def _copy(t):
    """A new constant tensor holding a copy of ``t``'s values (one device copy)."""
    out = _empty_like(t)
    out.copy_(t.detach() if t.requires_grad else t)
    return out


def _walk_leaves(outputs, stop):
    """The leaves requiring grad that the graph of ``outputs`` reaches, in the order first
    met, without going past a tensor whose id is in ``stop``."""
    found, seen = [], set(stop)
    stack = list(reversed(outputs))
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op is None:
            if node.requires_grad:
                found.append(node)
            continue
        stack.extend(reversed(node.inputs))
    return found


def _check_args(where, args, device):
    """The tensors of one sample-args tuple; TypeError / ValueError naming the bad one."""
    if not isinstance(args, tuple):
        raise TypeError(f"{_NAME}: {where} must be a tuple of Tensors, got {type(args).__name__}")
    for k, a in enumerate(args):
        if not isinstance(a, Tensor):
            raise TypeError(
                f"{_NAME}: {where}[{k}] must be a Tensor (sample args hold Tensors only), got "
                f"{type(a).__name__}"
            )
        if a.device.name != "cuda":
            raise ValueError(
                f"{_NAME}: {where}[{k}] is on {a.device!r}: CUDA graphs capture CUDA work only"
            )
        if device is not None and a.device != device:
            raise ValueError(f"{_NAME}: {where}[{k}] is on {a.device!r}, the others on {device!r}")
        device = a.device
    return device


def _outputs_of(where, result):
    """A callable's result as (a tuple of Tensors, whether it was one Tensor)."""
    if isinstance(result, Tensor):
        return (result,), True
    if isinstance(result, (tuple, list, TensorTuple)) and len(result) > 0:
        items = tuple(result)
        if all(isinstance(t, Tensor) for t in items):
            return items, False
    raise TypeError(
        f"{_NAME}: {where} must return a Tensor or a non-empty tuple or list of Tensors, got "
        f"{type(result).__name__}"
    )


def _backward(outputs, grads):
    """Backward from the ``outputs`` that have a graph, seeded with ``grads``."""
    if len(outputs) == 1:
        outputs[0].backward(grads[0])
        return
    from .ops import make_tuple
    from .ops.ops_tuple import MakeTensorTuple

    with autograd.enable_grad():
        root = TensorTuple.make_from_op(MakeTensorTuple(), list(outputs))
    with autograd.no_grad():
        seed = make_tuple(*grads)
    root.backward(seed)


class _Graphed:
    """One callable's captured state: static inputs, graphs, static outputs and grads."""

    def __init__(self, index, function, args, params):
        self.where = f"callables[{index}]" if index is not None else "callable"
        self.function = function
        self.params = params  # a module's parameters, in parameters() order
        # needle's own static inputs: fresh leaves that the captures read and write .grad on
        self.inputs = tuple(
            Tensor.make_const(_copy(a).realize_cached_data(), requires_grad=a.requires_grad)
            for a in args
        )
        self.fwd_graph = CUDAGraph()
        self.bwd_graph = CUDAGraph()
        self.outputs = ()
        self.single = True
        self.leaves = []  # parameters and other tensors requiring grad that the outputs reach
        self.grad_outputs = ()  # static seeds of the backward, one per output with a graph
        self.input_grads = ()  # static gradients of the inputs requiring grad
        self.leaf_grads = ()
        # (the tensor, or the (module, attribute) holding it, the array the graphs read, a
        # tensor holding that array), for each tensor the graphs read that is not an input
        self.arrays = []
        self.training = None

    def _run(self):
        with autograd.enable_grad():
            result = self.function(*self.inputs)
        return _outputs_of(self.where, result)

    def _graph_outputs(self, outputs):
        for k, o in enumerate(outputs):
            if o.op is None and o.requires_grad:
                raise ValueError(
                    f"{_NAME}: output {k} of {self.where} is a leaf requiring grad (the callable "
                    "returned an input or a parameter as it is); a graphed callable's outputs "
                    "must be computed by ops"
                )
        return [o for o in outputs if o.op is not None]

    def _find_leaves(self, outputs):
        stop = {id(x) for x in self.inputs}
        reached = _walk_leaves(outputs, stop)
        ids = {id(p) for p in self.params}
        leaves = [p for p in self.params if p.requires_grad]
        leaves += [x for x in reached if id(x) not in ids]
        for x in leaves:
            if x.grad is not None:
                raise RuntimeError(
                    f"{_NAME}: a tensor requiring grad that {self.where} reads (shape "
                    f"{tuple(x.shape)}) has a .grad; the captured backward writes .grad, so it "
                    "must be None when the callables are graphed (x.grad = None first)"
                )
        return leaves

    def _check_used(self, allow_unused_input):
        if allow_unused_input:
            return
        for k, x in enumerate(self.inputs):
            if x.requires_grad and x.grad is None:
                raise RuntimeError(
                    f"{_NAME}: sample arg {k} of {self.where} requires grad but the outputs do "
                    "not depend on it; pass allow_unused_input=True to allow it"
                )
        for x in self.leaves:
            if x.grad is None:
                raise RuntimeError(
                    f"{_NAME}: a parameter of {self.where} (shape {tuple(x.shape)}) requires grad "
                    "but the outputs do not depend on it; pass allow_unused_input=True to allow it"
                )

    def _clear_grads(self):
        for x in (*self.inputs, *self.leaves):
            x.grad = None

    def warm_up(self, iters, allow_unused_input):
        for step in range(iters):
            outputs, _ = self._run()
            if step == 0:
                self.leaves = self._find_leaves(outputs)
            with_graph = self._graph_outputs(outputs)
            if with_graph:
                from .init import ones_like

                seeds = [ones_like(o) for o in with_graph]
                _backward(with_graph, seeds)
                self._check_used(allow_unused_input)
            self._clear_grads()

    def capture_forward(self, pool, module):
        buffers = _buffers(module) if module is not None else []
        with graph(self.fwd_graph, pool=pool):
            outputs, self.single = self._run()
        rebound = [key for m, key, b in buffers if getattr(m, key) is not b]
        if rebound:
            for m, key, b in buffers:
                setattr(m, key, b)
            raise RuntimeError(
                f"{_NAME}: the forward of {self.where} rebinds the buffer(s) "
                f"{', '.join(rebound)} on every call (BatchNorm's running statistics in "
                "training mode), which a replay cannot do; graph it in eval mode, or graph "
                "the layers around it"
            )
        self.outputs = tuple(outputs)
        if not self.leaves:
            self.leaves = self._find_leaves(self.outputs)
        if module is not None:
            self.training = module.training

    def capture_backward(self, pool, allow_unused_input):
        with_graph = self._graph_outputs(self.outputs)
        self.with_graph = [k for k, o in enumerate(self.outputs) if o.op is not None]
        if not with_graph:
            self.bwd_graph = None
            return
        # Allocated outside the capture: the gradients a call receives are copied in here.
        self.grad_outputs = tuple(_empty_like(o) for o in with_graph)
        with graph(self.bwd_graph, pool=pool):
            _backward(with_graph, self.grad_outputs)
        self._check_used(allow_unused_input)
        self.input_grads = tuple(x.grad for x in self.inputs)
        self.leaf_grads = tuple(x.grad for x in self.leaves)
        self._clear_grads()

    def freeze(self, module):
        """Notes what a call needs: which inputs get gradients, and the arrays the graphs
        read for every parameter, buffer and closed-over leaf (to refresh when rebound)."""
        self.arg_slots = [
            k
            for k, g in enumerate(self.input_grads)
            if g is not None and self.inputs[k].requires_grad
        ]
        self.leaf_slots = [j for j, g in enumerate(self.leaf_grads) if g is not None]
        self.used = self.bwd_graph is not None and bool(self.arg_slots or self.leaf_slots)
        seen, self.arrays = set(), []
        # BatchNorm gives a buffer a new tensor (an attribute rebound), an optimizer gives a
        # parameter a new array (the same tensor): either is looked up again at each call
        for m, key, b in _buffers(module) if module is not None else []:
            seen.add(id(b))
            self.arrays.append(((m, key), b.realize_cached_data(), b.detach()))
        for x in (*self.params, *self.leaves):
            if id(x) not in seen:
                seen.add(id(x))
                self.arrays.append((x, x.realize_cached_data(), x.detach()))

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError(
                f"graphed {self.where}: keyword arguments are not supported (got "
                f"{', '.join(sorted(kwargs))}); pass the sample args' tensors positionally"
            )
        if len(args) != len(self.inputs):
            raise TypeError(
                f"graphed {self.where}: expected {len(self.inputs)} argument(s) as in "
                f"sample_args, got {len(args)}"
            )
        for k, (a, s) in enumerate(zip(args, self.inputs)):
            if not isinstance(a, Tensor):
                raise TypeError(
                    f"graphed {self.where}: argument {k} must be a Tensor, got {type(a).__name__}"
                )
            if a.shape != s.shape or a.dtype != s.dtype or a.device != s.device:
                raise ValueError(
                    f"graphed {self.where}: argument {k} is {a.dtype} {tuple(a.shape)} on "
                    f"{a.device!r}; the graph was captured for {s.dtype} {tuple(s.shape)} on "
                    f"{s.device!r}"
                )
            if a.op is not None and a.requires_grad and not s.requires_grad:
                # a leaf argument gets a gradient only if its sample arg required one, as in
                # PyTorch; a computed one would silently cut the backward off from its graph
                if autograd.is_grad_enabled():
                    raise ValueError(
                        f"graphed {self.where}: argument {k} is computed from tensors requiring "
                        f"grad but sample arg {k} did not require grad, so the captured backward "
                        "has no gradient for it; give the sample arg requires_grad=True"
                    )
        # The optimizers give a parameter a new array each step; the graphs read the old one.
        with autograd.no_grad():  # values only: the graphed node records the edges
            for x, array, holder in self.arrays:
                if isinstance(x, tuple):
                    x = getattr(*x)
                if x.realize_cached_data() is not array:
                    holder.copy_(x)
            for a, s in zip(args, self.inputs):
                if a.realize_cached_data() is not s.realize_cached_data():
                    s.copy_(a)
        self.fwd_graph.replay()
        copies = [_copy(o) for o in self.outputs]
        if not self.used or not autograd.is_grad_enabled():
            return copies[0] if self.single else tuple(copies)
        inputs = [args[k] for k in self.arg_slots] + [self.leaves[j] for j in self.leaf_slots]
        arrays = [c.realize_cached_data() for c in copies]
        op_type = _GraphedOp if self.single else _GraphedTupleOp
        node = op_type(self, arrays)(*inputs)
        return node if self.single else tuple(node.tuple())

    def gradient(self, out_grads):
        """Copies of the static gradients of the op's inputs (the args, then the leaves, that
        the outputs reach), after copying ``out_grads`` in and replaying the backward."""
        with autograd.no_grad():  # in "needle" mode the incoming gradients are recorded
            for static, k in zip(self.grad_outputs, self.with_graph):
                static.copy_(out_grads[k])
        self.bwd_graph.replay()
        grads = [self.input_grads[k] for k in self.arg_slots]
        grads += [self.leaf_grads[j] for j in self.leaf_slots]
        return tuple(_copy(g) for g in grads)


def _buffers(module):
    """(owner module, attribute, tensor) of every buffer of ``module`` and its children."""
    return [
        (m, key, b) for _, m in module.named_modules() for key, b in m.named_buffers(recurse=False)
    ]


class _GraphedMixin:
    """The autograd node of one graphed call: its data are copies of the static outputs;
    its gradient replays the backward graph."""

    def __init__(self, state, arrays):
        self.state = state
        self.pending = arrays

    def compute(self, *arrays):
        if self.pending is None:
            raise RuntimeError(f"{_NAME}: a graphed op's data comes from its call, only once")
        result, self.pending = self.pending, None
        return self._result(result)

    def gradient(self, out_grad, node):
        return self.state.gradient(self._split(out_grad))


class _GraphedOp(_GraphedMixin, TensorOp):
    @staticmethod
    def _result(arrays):
        return arrays[0]

    @staticmethod
    def _split(out_grad):
        return (out_grad,)


class _GraphedTupleOp(_GraphedMixin, TensorTupleOp):
    @staticmethod
    def _result(arrays):
        return tuple(arrays)

    @staticmethod
    def _split(out_grad):
        return tuple(out_grad.tuple())


def _graphed_forward(module, state):
    """The forward put on a graphed module: replays while ``training`` is as captured."""
    ref = weakref.ref(module)  # the module holds this function: no cycle back to it
    original = type(module).forward

    def forward(*args, **kwargs):
        m = ref()
        if m is not None and m.training == state.training:
            return state(*args, **kwargs)
        return original(m, *args, **kwargs)

    return forward


def make_graphed_callables(
    callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None
):
    """Graphed versions of ``callables`` (PyTorch's ``torch.cuda.make_graphed_callables``).

    ``callables`` is a function or an ``nn.Module``, with ``sample_args`` a tuple of CUDA
    Tensors (the arguments it will be called with: their shapes, dtypes and requires_grad),
    or a tuple of callables with a tuple of such tuples; several callables share one memory
    pool and must run in the order given. Each is warmed up ``num_warmup_iters`` times
    (eager forward and backward on a side stream), then its forward and its backward are
    captured into two CUDA graphs in ``pool`` (a :func:`graph_pool_handle`; None: a new one).
    Returns the graphed function, or the module with its forward replaced (replayed while
    ``module.training`` is as at capture, the original forward otherwise), or a tuple of
    them. ``allow_unused_input=False`` makes an input or parameter that requires grad but
    does not reach the outputs a RuntimeError.

    Raises TypeError for sample args that are not tuples of Tensors, a callable that is not
    callable or a result that is not a Tensor or a tuple of them; ValueError for tensors
    not on one CUDA device; RuntimeError for a parameter whose ``.grad`` is not None or a
    module that rebinds a buffer; ``needle.DeviceError`` without CUDA.
    """
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    elif not isinstance(sample_args, tuple):
        raise TypeError(
            f"{_NAME}: with a tuple of callables, sample_args must be a tuple of tuples of "
            f"Tensors, got {type(sample_args).__name__}"
        )
    if len(callables) == 0:
        raise ValueError(f"{_NAME}: callables is an empty tuple")
    if len(sample_args) != len(callables):
        raise ValueError(
            f"{_NAME}: {len(callables)} callables but {len(sample_args)} sample-args tuples"
        )
    if isinstance(num_warmup_iters, bool) or not isinstance(num_warmup_iters, int):
        raise TypeError(f"{_NAME}: num_warmup_iters must be an int, got {num_warmup_iters!r}")
    if num_warmup_iters < 0:
        raise ValueError(f"{_NAME}: num_warmup_iters must be >= 0, got {num_warmup_iters}")
    if not isinstance(allow_unused_input, bool):
        raise TypeError(f"{_NAME}: allow_unused_input must be a bool, got {allow_unused_input!r}")
    if pool is not None and not isinstance(pool, _PoolHandle):
        raise TypeError(
            f"{_NAME}: pool must be a handle from needle.cuda.graph_pool_handle() or "
            f"CUDAGraph.pool(), got {type(pool).__name__}"
        )
    device = None
    states = []
    for i, (c, args) in enumerate(zip(callables, sample_args)):
        index = None if single else i
        where = "sample_args" if single else f"sample_args[{i}]"
        if not callable(c):
            raise TypeError(f"{_NAME}: callables[{i}] is not callable: {type(c).__name__}")
        device = _check_args(where, args, device)
        params = list(c.parameters()) if isinstance(c, Module) else []
        for p in params:
            if p.device != device and device is not None:
                raise ValueError(
                    f"{_NAME}: a parameter of callables[{i}] is on {p.device!r}, the sample "
                    f"args on {device!r}: move the module first"
                )
            if p.requires_grad and p.grad is not None:
                raise RuntimeError(
                    f"{_NAME}: a parameter of callables[{i}] (shape {tuple(p.shape)}) has a "
                    ".grad; the captured backward writes .grad, so it must be None when the "
                    "callables are graphed (opt.reset_grad() or p.grad = None first)"
                )
        states.append((c, args, params, index))
    if device is None:
        raise ValueError(f"{_NAME}: the sample args hold no Tensor, so no CUDA device to graph on")
    ordinal = _ordinal(device)  # DeviceError without CUDA
    if pool is None:
        pool = graph_pool_handle(ordinal)
    graphed = [_Graphed(index, c, args, params) for c, args, params, index in states]

    from . import cuda as _cuda

    # Lazy set-up work (cuBLAS handles, workspaces) happens in the warm-up, outside the
    # captures; hooks fire in the live backward, on the gradients the graphed node hands on.
    with autograd.graph_mode("cycle_free"), autograd._hooks_paused():
        try:
            _cuda.synchronize(ordinal)
            with _stream_context(Stream(ordinal)):
                for g in graphed:
                    g.warm_up(num_warmup_iters, allow_unused_input)
            _cuda.synchronize(ordinal)
            for g, (c, *_rest) in zip(graphed, states):
                g.capture_forward(pool, c if isinstance(c, Module) else None)
            # the backward graphs in reverse order, as the live backward runs them
            for g in reversed(graphed):
                g.capture_backward(pool, allow_unused_input)
        except BaseException:
            # leave no .grad from the warm-up or a capture (they were None on entry)
            for g in graphed:
                g._clear_grads()
            raise
    results = []
    for g, (c, *_rest) in zip(graphed, states):
        g.freeze(c if isinstance(c, Module) else None)
        if isinstance(c, Module):
            c.forward = _graphed_forward(c, g)
            results.append(c)
        else:
            results.append(g)
    return results[0] if single else tuple(results)
