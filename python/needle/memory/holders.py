"""needle.memory.holders: who holds device memory in an interactive session, and letting go of
what a notebook keeps without being asked.

In Jupyter, device memory is held by things no framework reports: IPython's output cache
(``Out[n]``, ``_``, ``__``, ``___`` and the ``_n`` names keep a cell's result and, through it,
its graph), the last exception's traceback frames (``sys.last_traceback``, ``sys.last_value``
and, from 3.12, ``sys.last_exc``) and names left from earlier cells. :func:`holders` names each
of them with the bytes and tensors it reaches; :func:`release_notebook_references` drops the
output cache's entries and the traceback that hold tensors.

A holder's bytes are the distinct storages it reaches, through Tensors (their data, their
``.grad`` and the graph of inputs behind them), containers, and objects' attributes
(``nn.Module``'s parameters); two holders that reach one storage both count it. Nothing here
allocates device memory.
"""

import gc
import os
import sys
import types

import needle_c as _c

from .policy import _allocated_everywhere
from .stats import _engine_id

# The IPython names that are the shell's own, not the user's: never reported as names.
_SHELL_NAMES = {
    "In",
    "Out",
    "_ih",
    "_oh",
    "_dh",
    "_i",
    "_ii",
    "_iii",
    "exit",
    "quit",
    "get_ipython",
}
_CACHE_ALIASES = ("_", "__", "___")
# The packages whose frames in a traceback are the shell's, not the user's.
_SHELL_PACKAGES = ("IPython", "ipykernel", "traitlets", "tornado", "asyncio")
# Objects whose attributes are never walked: code and the interpreter's machinery, which
# reach everything and hold no tensors of their own.
_OPAQUE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
    types.TracebackType,
    types.GeneratorType,
)
_TENSOR_TYPES = (_c.Tensor, _c.TensorTuple)
# Referents never worth entering, told by exact type (the common case, cheaply); subclasses of
# the _OPAQUE types are caught when they are popped.
_LEAF_TYPES = frozenset({int, float, str, bytes, bool, complex, type(None), type} | set(_OPAQUE))
# A walk stops after this many objects: a holder that reaches more (a list of a million
# floats) is reported with what was found so far, so that holders() stays fast.
_MAX_OBJECTS = 200_000


class _Reach:
    """What one holder reaches: distinct storages (by device and address) and Tensors."""

    def __init__(self, engine_id):
        self.engine_id = engine_id
        self.storages = {}
        self.tensors = 0
        self.graph_tensors = 0

    def add_array(self, array):
        """Counts array's storage when it is on the device asked about; True when it is."""
        device_id = array.device._id
        if self.engine_id is not None and device_id != self.engine_id:
            return False
        key = (device_id, array._handle.ptr())
        self.storages[key] = array._storage_size * array.itemsize
        return True

    @property
    def bytes(self):
        return sum(self.storages.values())


def _reach(root, engine_id, stop=()):
    """Walks from ``root``: containers and objects' attributes breadth first through
    ``gc.get_referents`` (the interpreter's own traversal, in C), then the Tensors found, each
    with its data, ``.grad`` and the graph of inputs behind it; returns a :class:`_Reach`.
    Objects in ``stop`` (the shell, its namespace) are not entered: they reach every name."""
    found = _Reach(engine_id)
    seen = {id(obj) for obj in stop}
    tensors = []
    frontier = [root]
    while frontier and len(seen) < _MAX_OBJECTS:
        generic, extra = [], []
        for obj in frontier:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, _TENSOR_TYPES):
                tensors.append(obj)
            elif isinstance(obj, _c.NDArray):
                found.add_array(obj)
            elif isinstance(obj, BaseException):
                # An exception keeps its traceback's frames (their locals, not their
                # globals) and the exceptions it chains.
                extra.extend(obj.args)
                extra.extend((obj.__cause__, obj.__context__, getattr(obj, "__dict__", None)))
                extra.extend(f for _, _, f in _traceback_roots(obj.__traceback__))
            elif not isinstance(obj, _OPAQUE):
                generic.append(obj)
        frontier = [x for x in gc.get_referents(*generic) if type(x) not in _LEAF_TYPES]
        frontier.extend(x for x in extra if x is not None)
    _walk_tensors(tensors, found, seen)
    return found


def _walk_tensors(tensors, found, seen):
    """Counts the Tensors found and what they reach: data, ``.grad`` and (as graph tensors)
    the inputs behind them."""
    stack = [(t, False) for t in tensors]
    for t in tensors:
        seen.discard(id(t))
    while stack:
        obj, through_graph = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        data = obj.cached_data
        arrays = data if isinstance(data, (tuple, list)) else (data,)
        counted = [found.add_array(a) for a in arrays if isinstance(a, _c.NDArray)]
        if any(counted):  # a Tensor on another device is walked, not counted
            found.tensors += 1
            found.graph_tensors += through_graph
        grad = getattr(obj, "grad", None) if isinstance(obj, _c.Tensor) else None
        if grad is not None:
            stack.append((grad, through_graph))
        stack.extend((t, True) for t in obj.inputs)


def _row(holder, kind, reach):
    return {
        "holder": holder,
        "kind": kind,
        "bytes": reach.bytes,
        "tensors": reach.tensors,
        "graph_tensors": reach.graph_tensors,
    }


def _shell():
    """The running IPython shell, or None (outside IPython, or IPython not installed)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython else None
    return get() if get else None


def _namespace_roots(shell):
    """``[(holder, kind, object)]`` of the user's names and the output cache."""
    roots = []
    if shell is not None:
        ns = shell.user_ns
        hidden = getattr(shell, "user_ns_hidden", {})
        output = ns.get("Out", {})
        for name, value in list(ns.items()):
            if name in _SHELL_NAMES or name in _CACHE_ALIASES:
                continue
            if name.startswith("_") and name[1:].isdigit():
                continue  # _3 is Out[3]: reported as Out[3]
            if name in hidden and hidden[name] is value:
                continue
            if name.startswith("__") and name.endswith("__"):
                continue
            roots.append((name, "name", value))
        for n, value in list(output.items()):
            roots.append((f"Out[{n}]", "output_cache", value))
        for name in _CACHE_ALIASES:
            value = ns.get(name)
            if value is not None and not any(value is v for v in output.values()):
                roots.append((name, "output_cache", value))
    else:
        main = sys.modules.get("__main__")
        for name, value in list(vars(main).items()) if main else ():
            if name.startswith("__") and name.endswith("__"):
                continue
            roots.append((name, "global", value))
    return roots


def _last_exception(shell):
    """The exception and traceback kept for post-mortem debugging: the interpreter's
    (``sys.last_*``), else the one IPython keeps with the last cell's result."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tb = getattr(sys, "last_traceback", None)
    if exc is None and tb is None and shell is not None:
        exc = getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None)
    if tb is None and exc is not None:
        tb = exc.__traceback__
    if tb is None and shell is not None:
        tb = getattr(getattr(shell, "InteractiveTB", None), "tb", None)
    return exc, tb


def _drop_traceback(shell, tb):
    """Lets go of a traceback's frames: the interpreter's and IPython's references to it, and
    each function frame's locals (a module frame's are its names: never touched)."""
    for name in ("last_traceback", "last_value", "last_type", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    formatter = getattr(shell, "InteractiveTB", None) if shell is not None else None
    if formatter is not None and getattr(formatter, "tb", None) is not None:
        formatter.tb = None  # ultratb keeps the last traceback it formatted
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_locals is not frame.f_globals:
            try:
                frame.clear()
            except RuntimeError:
                pass  # a frame still running (a caller of this one) keeps its locals
            if isinstance(frame.f_locals, dict):
                frame.f_locals.clear()  # 3.11/3.12 keep a copy of the locals on the frame
        tb = tb.tb_next


def _stops(shell):
    return () if shell is None else (shell, shell.user_ns)


def _is_shell_code(filename):
    """A frame of IPython's or the kernel's own code, not the user's."""
    return any(f"{os.sep}{pkg}{os.sep}" in filename for pkg in _SHELL_PACKAGES)


def _traceback_roots(tb):
    """``[(holder, kind, locals)]``: one per function frame of tb, named by function, file and
    line. A module's frame (a script's, a notebook cell's) is left out: its locals are the
    module's names, reported as names."""
    roots = []
    while tb is not None:
        frame = tb.tb_frame
        code = frame.f_code
        if frame.f_locals is frame.f_globals or _is_shell_code(code.co_filename):
            tb = tb.tb_next
            continue
        holder = f"traceback: {code.co_name} ({code.co_filename}:{tb.tb_lineno})"
        roots.append((holder, "traceback", dict(frame.f_locals)))
        tb = tb.tb_next
    return roots


def holders(device=None):
    """Who holds device memory: a list of dicts, the largest first, each with ``holder`` (a
    name such as ``"x"``, ``"Out[3]"``, ``"_"``, or ``"traceback: f (file.py:12)"``),
    ``kind`` (``"name"`` and ``"output_cache"`` in IPython, ``"global"`` for ``__main__``'s
    names outside it, ``"traceback"`` for a frame of the last exception), ``bytes`` (the
    distinct storages on ``device``, every device when None, that it reaches), ``tensors``
    (the Tensors it reaches) and ``graph_tensors`` (those reached through a graph's inputs).

    Rows that reach no tensor are left out. Works outside IPython: the last exception's
    frames (``sys.last_traceback``/``sys.last_exc``) and ``__main__``'s globals."""
    return [_row(holder, kind, reach) for holder, kind, reach in _holder_reaches(device)]


def _holder_reaches(device=None):
    """``[(holder, kind, _Reach)]`` for the holders that reach a tensor, in :func:`holders`'
    order: the walk behind it, with each holder's storages, so that a caller (the notebook
    extension) can tell which bytes only the output cache and the traceback hold."""
    engine_id = None if device is None else _engine_id(device)
    shell = _shell()
    roots = _namespace_roots(shell)
    exc, tb = _last_exception(shell)
    roots.extend(_traceback_roots(tb))
    stop = _stops(shell)
    found = []
    for holder, kind, value in roots:
        reach = _reach(value, engine_id, stop)
        if reach.tensors:
            found.append((holder, kind, reach))
    found.sort(key=lambda f: (-f[2].bytes, -f[2].tensors, f[0]))
    return found


def _releasable_bytes(found):
    """What :func:`release_notebook_references` would free, from :func:`_holder_reaches`'
    result: the distinct storages that the output cache and the last exception's frames reach
    and no name does."""
    released, kept = {}, set()
    for _, kind, reach in found:
        if kind in ("output_cache", "traceback"):
            released.update(reach.storages)
        else:
            kept.update(reach.storages)
    return sum(size for key, size in released.items() if key not in kept)


def _holds_tensors(value, stop=()):
    return _reach(value, None, stop).tensors > 0


def release_notebook_references():
    """Drops what a notebook keeps without being asked, where it holds tensors: the output
    cache's entries (``Out[n]`` and its ``_n`` name, ``_``, ``__``, ``___``) and the last
    exception (``sys.last_traceback``, ``sys.last_value``, ``sys.last_type``,
    ``sys.last_exc``), then collects. Returns the device bytes this freed, summed over devices.

    Afterwards ``Out[n]`` lacks those entries and ``%debug`` has no traceback to inspect;
    names the user assigned are never touched. Outside IPython only the last exception is
    dropped."""
    before = _allocated_everywhere()
    shell = _shell()
    stop = _stops(shell)
    exc, tb = _last_exception(shell)
    if shell is not None:
        ns = shell.user_ns
        output = ns.get("Out", {})
        last = getattr(shell, "last_execution_result", None)
        if last is not None and _holds_tensors((last.result, last.error_in_exec), stop):
            shell.last_execution_result = None  # as IPython's own del_var does for its result
        for n in [n for n, v in list(output.items()) if _holds_tensors(v, stop)]:
            del output[n]
        # The cache's names: _n (Out[n]) and _, __, ___; IPython puts them in the namespace
        # and, pushed as non-interactive, in user_ns_hidden too.
        hook = getattr(shell, "displayhook", None)
        for names in (ns, getattr(shell, "user_ns_hidden", {})):
            for name in [k for k in names if k.startswith("_") and k[1:].isdigit()]:
                if _holds_tensors(names[name], stop):
                    del names[name]
            for name in _CACHE_ALIASES:
                if _holds_tensors(names.get(name), stop):
                    names[name] = ""
        for name in _CACHE_ALIASES:
            if hook is not None and _holds_tensors(getattr(hook, name, None), stop):
                setattr(hook, name, "")
    if _holds_tensors((exc, [frame for _, _, frame in _traceback_roots(tb)]), stop):
        _drop_traceback(shell, tb)
    del exc, tb
    gc.collect()
    return max(0, before - _allocated_everywhere())
