"""CUDA graphs with ``torch.cuda``'s API: ``ndl.cuda.CUDAGraph``, ``ndl.cuda.graph``,
``ndl.cuda.graph_pool_handle``.

A training step launches one kernel at a time, so a small step is bound by the host. A
CUDA graph records the step's kernels once (a capture) and replays them with one launch::

    g = ndl.cuda.CUDAGraph()
    static_x.copy_(first_batch)            # inputs live at fixed addresses
    with ndl.cuda.graph(g):                # capture: nothing runs on the GPU
        static_loss = step(static_x)
    for batch in batches:
        static_x.copy_(batch)              # new values, same memory
        g.replay()                         # the whole step, one launch

As in PyTorch, a replay runs exactly the captured work on exactly the captured memory:
tensors the step reads must keep their addresses (``copy_`` new values in), and what it
allocates comes from the graph's private pool, which outlives the capture so that replays
can write it; ``static_loss`` above is such a tensor, rewritten by each replay.

needle keeps the collector out of the capture, by design: while a capture runs nothing
collects or gives the cache back (the pressure hook, the out-of-memory ladder and aligned
collections run once it ends), a ``gc.collect()`` inside it frees no memory that the graph
might touch (those frees wait for the end), and a graph dropped during another capture is
destroyed after it. What cannot be captured fails loudly and abandons the capture with
the allocator consistent: a host synchronisation (``.numpy()``, ``.item()``, printing a GPU
tensor), a draw from NumPy's generator (``NEEDLE_RNG=host``), an Adam step without
``capturable=True`` (its bias corrections change every step).
"""

import needle_c as _c

from ._cuda_stream import Stream, _ordinal
from ._cuda_stream import stream as _stream_context

__all__ = ["CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing"]


class _PoolHandle:
    """A reference to a graph pool (``graph_pool_handle()``, ``CUDAGraph.pool()``): pass it
    as ``pool=`` to let graphs share memory, as in PyTorch. The pool lives while a handle or
    a graph captured into it does."""

    def __init__(self, ordinal, pool_id, retain):
        self._ordinal, self._id, self._held = ordinal, pool_id, False
        if retain:
            _c._cuda_graph_pool("retain", ordinal, pool_id)
        self._held = True

    def __repr__(self):
        return f"<needle.cuda graph pool {self._id} on cuda:{self._ordinal}>"

    def __del__(self):
        if getattr(self, "_held", False):
            self._held = False
            try:
                _c._cuda_graph_pool("release", self._ordinal, self._id)
            except Exception:  # a finalizer cannot raise
                pass


def graph_pool_handle(device=None):
    """A new graph pool (``torch.cuda.graph_pool_handle``) for captures to share."""
    ordinal = _ordinal(device)
    return _PoolHandle(ordinal, _c._cuda_graph_pool("create", ordinal), retain=False)


def is_current_stream_capturing(device=None):
    """True while a CUDA graph is being captured on the device."""
    return bool(_c._cuda_graph_capture("capturing", _ordinal(device)))


class CUDAGraph:
    """A captured CUDA graph (``torch.cuda.CUDAGraph``): ``capture_begin(pool=None)`` and
    ``capture_end()`` record the work queued on the calling thread's current stream of the
    current GPU between them (use :func:`graph`, which picks a side stream for it);
    ``replay()`` launches it again; ``reset()`` frees it (and its pool, unless shared);
    ``pool()`` names its pool for another capture to share."""

    def __init__(self, keep_graph=False):
        if keep_graph:
            raise NotImplementedError(
                "CUDAGraph(keep_graph=True): needle instantiates at capture_end and keeps no "
                "editable graph"
            )
        self._graph = None
        self._ordinal = None
        self._pool_id = None
        self._capturing = False

    def capture_begin(self, pool=None, capture_error_mode="global", device=None):
        """Starts capturing the current stream of ``device`` (None: ``cuda(0)``) into
        ``pool`` (a handle from :func:`graph_pool_handle` or another graph's :meth:`pool`;
        None: a pool of this graph's own). Only ``capture_error_mode="global"`` is
        supported: anything that cannot be captured, from any thread, fails the capture."""
        if capture_error_mode != "global":
            raise ValueError(
                f"capture_error_mode {capture_error_mode!r}: needle captures in 'global' mode only"
            )
        if self._capturing:
            raise RuntimeError("this CUDAGraph is already capturing")
        if self._graph is not None:
            raise RuntimeError("this CUDAGraph already holds a graph: reset() it first")
        if pool is not None and not isinstance(pool, _PoolHandle):
            raise TypeError(
                "pool must be a handle from needle.cuda.graph_pool_handle() or "
                f"CUDAGraph.pool(), got {type(pool).__name__}"
            )
        ordinal = _ordinal(device)
        if pool is not None and pool._ordinal != ordinal:
            raise ValueError(f"the pool is on cuda:{pool._ordinal}, the capture on cuda:{ordinal}")
        _c._cuda_graph_capture("begin", ordinal, 0 if pool is None else pool._id)
        self._ordinal, self._capturing = ordinal, True

    def capture_end(self):
        """Ends the capture and makes the graph. When an operation inside could not be
        captured it raises, and the capture is abandoned (the graph stays empty)."""
        if not self._capturing:
            raise RuntimeError("capture_end() without capture_begin()")
        self._capturing = False
        graph = _c._cuda_graph_capture("end", self._ordinal)
        self._graph = graph
        self._pool_id = _c._cuda_graph_info(graph)[0]

    def _abandon(self):
        if self._capturing:
            self._capturing = False
            _c._cuda_graph_capture("abandon", self._ordinal)

    def replay(self):
        """Launches the captured work again, on the current stream (one host launch)."""
        if self._graph is None:
            raise RuntimeError("replay() needs a captured graph: capture one first")
        _c._cuda_graph_replay(self._graph)

    def reset(self):
        """Frees the graph; its pool goes too unless another graph or a handle holds it."""
        self._abandon()
        self._graph = None
        self._pool_id = None

    def pool(self):
        """A handle to this graph's memory pool, for another capture to share."""
        if self._graph is None:
            raise RuntimeError("pool() needs a captured graph")
        return _PoolHandle(self._ordinal, self._pool_id, retain=True)

    @property
    def num_nodes(self):
        """How many kernels, copies and memsets one replay runs (0 before a capture)."""
        return 0 if self._graph is None else _c._cuda_graph_info(self._graph)[1]

    def __del__(self):
        try:
            self._abandon()
        except Exception:  # a finalizer cannot raise
            pass


# One side stream per GPU for captures that name none, as torch.cuda.graph keeps one.
_capture_streams = {}


class graph:
    """``with ndl.cuda.graph(g, pool=None, stream=None):`` captures the block into ``g``
    (``torch.cuda.graph``): waits for the GPU, then captures on ``stream`` (None: a side
    stream needle keeps per GPU), ordered after the work queued before it. An exception
    inside abandons the capture and propagates."""

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        if not isinstance(cuda_graph, CUDAGraph):
            raise TypeError(
                f"graph() expects a needle.cuda.CUDAGraph, got {type(cuda_graph).__name__}"
            )
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(
                f"stream must be a needle.cuda.Stream or None, got {type(stream).__name__}"
            )
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode
        self._stream = stream
        self._context = None

    def __enter__(self):
        from . import cuda as _cuda

        ordinal = self._stream._ordinal if self._stream is not None else _ordinal(None)
        stream = self._stream
        if stream is None:
            stream = _capture_streams.get(ordinal)
            if stream is None:
                stream = _capture_streams[ordinal] = Stream(ordinal)
        _cuda.synchronize(ordinal)
        self._context = _stream_context(stream)
        self._context.__enter__()
        try:
            self.cuda_graph.capture_begin(
                pool=self.pool, capture_error_mode=self.capture_error_mode, device=ordinal
            )
        except BaseException:
            self._context.__exit__(None, None, None)
            raise
        return self.cuda_graph

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None:
                self.cuda_graph._abandon()
            else:
                self.cuda_graph.capture_end()
        finally:
            self._context.__exit__(None, None, None)
        return False
