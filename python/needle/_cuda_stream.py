"""CUDA streams with ``torch.cuda``'s spelling: ``ndl.cuda.Stream``, ``current_stream()``,
``default_stream()``, ``set_stream(s)`` and ``with ndl.cuda.stream(s):``.

needle queues its GPU work on its own non-blocking stream per GPU (the legacy default
stream cannot be captured into a CUDA graph), or on the stream a thread made current here.
The current stream is per thread and per GPU, as in PyTorch.

One difference, made for safety: needle's caching allocator reuses a freed block at once,
which is safe only while the next user's work queues behind the last user's. So
``stream(s)`` and ``set_stream(s)`` order the two streams where they switch: the new stream
waits for the work queued so far on the old one, and on leaving the context the old one
waits for the new one's. PyTorch leaves that to the caller (``wait_stream``, and
``record_stream`` for its allocator); code written for PyTorch runs the same here, only
with those waits already in place.
"""

import threading

import needle_c as _c

__all__ = ["Stream", "current_stream", "default_stream", "set_stream", "stream", "StreamContext"]

# The Stream objects made current by set_stream, per thread: they must outlive their use.
_held = threading.local()


def _ordinal(device):
    from . import cuda as _cuda  # needle.cuda imports this module

    dev = _cuda._device(device)
    if not dev.enabled():
        raise _c.DeviceError(f"{dev!r} is not available, so it has no streams")
    return dev.index


class Stream:
    """A CUDA stream of one GPU (``torch.cuda.Stream``): ``Stream()`` makes a new
    non-blocking stream on ``device`` (None: ``cuda(0)``). ``cuda_stream`` is its
    ``cudaStream_t`` as an int. ``priority`` is accepted for PyTorch's signature; only 0
    (the default priority) is supported."""

    def __init__(self, device=None, priority=0):
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        if priority != 0:
            raise ValueError(f"needle's streams have the default priority only (0), got {priority}")
        self._ordinal = _ordinal(device)
        self._owned = False
        self.cuda_stream = _c._cuda_stream("create", self._ordinal)
        self._owned = True

    @classmethod
    def _wrap(cls, ordinal, handle):
        s = cls.__new__(cls)
        s._ordinal, s._owned, s.cuda_stream = ordinal, False, handle
        return s

    @property
    def device(self):
        return _c.cuda(self._ordinal)

    def synchronize(self):
        """Waits for all the work queued on this stream (a host wait)."""
        _c._cuda_stream("synchronize", self._ordinal, self.cuda_stream)

    def query(self):
        """True when all the work queued on this stream has finished."""
        return _c._cuda_stream("query", self._ordinal, self.cuda_stream)

    def wait_stream(self, other):
        """This stream's later work waits for the work queued on ``other`` so far (no host
        wait)."""
        if not isinstance(other, Stream):
            raise TypeError(f"wait_stream expects a needle.cuda.Stream, got {type(other).__name__}")
        if other._ordinal != self._ordinal:
            raise ValueError(
                f"wait_stream: the streams are on different GPUs ({other._ordinal} and "
                f"{self._ordinal})"
            )
        _c._cuda_stream("wait", self._ordinal, self.cuda_stream, other.cuda_stream)

    def __eq__(self, other):
        return (
            isinstance(other, Stream)
            and other._ordinal == self._ordinal
            and other.cuda_stream == self.cuda_stream
        )

    def __hash__(self):
        return hash((self._ordinal, self.cuda_stream))

    def __repr__(self):
        return f"<needle.cuda.Stream device=cuda:{self._ordinal} cuda_stream={self.cuda_stream:#x}>"

    def __del__(self):
        if getattr(self, "_owned", False):
            self._owned = False
            try:
                _c._cuda_stream("destroy", self._ordinal, self.cuda_stream)
            except Exception:  # a finalizer cannot raise; the process keeps going
                pass


def current_stream(device=None):
    """The calling thread's current stream on ``device`` (needle's own unless
    :func:`stream` or :func:`set_stream` chose another)."""
    ordinal = _ordinal(device)
    return Stream._wrap(ordinal, _c._cuda_stream("current", ordinal))


def default_stream(device=None):
    """needle's own stream of ``device``, where its work goes by default."""
    ordinal = _ordinal(device)
    return Stream._wrap(ordinal, _c._cuda_stream("default", ordinal))


def _switch(new):
    """Makes ``new`` current on its GPU after it waits for the old current stream."""
    old = current_stream(new._ordinal)
    new.wait_stream(old)
    _c._cuda_stream("set", new._ordinal, new.cuda_stream)
    return old


def set_stream(s):
    """Makes ``s`` the calling thread's current stream on its GPU (``torch.cuda.set_stream``),
    ordered after the stream it replaces. None does nothing, as in PyTorch."""
    if s is None:
        return
    if not isinstance(s, Stream):
        raise TypeError(f"set_stream expects a needle.cuda.Stream or None, got {type(s).__name__}")
    old = _switch(s)
    held = getattr(_held, "streams", None)
    if held is None:
        held = _held.streams = {}
    held[s._ordinal] = s
    # Work queued before on the old stream must finish before the allocator reuses its blocks
    # for the new stream's work: the wait above orders that one way; the other way, the old
    # stream is no longer used by this thread.
    del old


class StreamContext:
    """``with ndl.cuda.stream(s):``: ``s`` is the calling thread's current stream on its GPU
    inside the block (ordered after the previous one on entry; the previous one waits for it
    on exit). ``stream(None)`` is a context that does nothing, as in PyTorch."""

    def __init__(self, s):
        if s is not None and not isinstance(s, Stream):
            raise TypeError(
                f"stream() expects a needle.cuda.Stream or None, got {type(s).__name__}"
            )
        self.stream = s
        self._previous = []

    def __enter__(self):
        if self.stream is not None:
            self._previous.append(_switch(self.stream))
        return self.stream

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        previous = self._previous.pop()
        previous.wait_stream(self.stream)
        _c._cuda_stream("set", previous._ordinal, previous.cuda_stream)
        return False


def stream(s):
    """The context that makes ``s`` current (``torch.cuda.stream``); see
    :class:`StreamContext`."""
    return StreamContext(s)
