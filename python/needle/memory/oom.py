"""needle.memory.oom: an out-of-memory error that explains itself, and the memory snapshot
written when one is raised.

needle_c builds each :class:`needle.OutOfMemoryError` with the allocator's figures
(``requested``, ``allocated``, ``reserved``, ``limit``, ``collected_bytes``,
``largest_free_block``, ``fragmentation_bytes``, ``inactive_split_bytes``) and, before raising
it, hands it to the explainer registered here (``needle_c._set_oom_explainer``: needle_c never
imports this package). The explainer:

- writes the device's memory snapshot (:func:`~needle.memory._snapshot`, PyTorch's format, with
  the allocation history when :func:`~needle.memory._record_memory_history` records it) to the
  path :func:`set_oom_snapshot` or ``NEEDLE_OOM_SNAPSHOT`` names, and sets ``snapshot_path``;
  a snapshot that cannot be written is a RuntimeWarning, never instead of the error;
- sets ``holders`` to the top rows of :func:`~needle.memory.holders` on the device;
- appends to the message a line of the figures, the top holders, a hint when the notebook's
  output cache or the last traceback holds memory, and where the snapshot went.

It runs after the failed allocation returned, allocates no device memory, and whatever it
raises, needle_c reports as unraisable and raises the error with its first message.
"""

import os
import pickle
import warnings

import needle_c as _c

from .. import _environ
from .holders import _holder_reaches, _releasable_bytes, _row
from .snapshot import _snapshot
from .stats import _format_bytes

_TOP = 5  # the holders an error names
_WIDEST = 48  # holder labels are padded to the longest, up to this
_NOTEBOOK_KINDS = {"output_cache": "the notebook's output cache", "traceback": "the last traceback"}

_path = None  # where the snapshot goes at an out-of-memory error (absolute), or None


def _checked_path(path):
    """``path`` as an absolute file path the snapshot can be written to; TypeError for what is
    not a path, ValueError (naming the path) for one that cannot be written."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(
            f"path must be a file path (str or os.PathLike) or None, got {type(path).__name__}"
        )
    text = os.fsdecode(os.fspath(path))
    if not text.strip():
        raise ValueError("path must name a file, got an empty path")
    full = os.path.abspath(os.path.expanduser(text))
    if os.path.isdir(full):
        raise ValueError(f"cannot write the out-of-memory snapshot to {text!r}: it is a directory")
    directory = os.path.dirname(full)
    if not os.path.isdir(directory):
        raise ValueError(
            f"cannot write the out-of-memory snapshot to {text!r}: "
            f"the directory {directory!r} does not exist"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(
            f"cannot write the out-of-memory snapshot to {text!r}: "
            f"the directory {directory!r} is not writable"
        )
    if os.path.exists(full) and not os.access(full, os.W_OK):
        raise ValueError(f"cannot write the out-of-memory snapshot to {text!r}: not writable")
    return full


def set_oom_snapshot(path):
    """At every out-of-memory error from now on, write the failing device's memory snapshot
    (what :func:`~needle.memory._dump_snapshot` writes: PyTorch's format, which
    pytorch.org/memory_viz and ``torch.cuda._memory_viz`` draw, with the allocation history when
    :func:`~needle.memory._record_memory_history` records it) to ``path`` before the error is
    raised, replacing the file an earlier error wrote; ``None`` stops it.

    ``path`` is checked now: a ValueError naming it when its directory does not exist or cannot
    be written, or when it is a directory; a TypeError when it is not a path. It is kept
    absolute, so a later ``os.chdir`` does not move it. ``NEEDLE_OOM_SNAPSHOT`` sets it at
    import."""
    global _path
    _path = None if path is None else _checked_path(path)


def get_oom_snapshot():
    """The absolute path :func:`set_oom_snapshot` (or ``NEEDLE_OOM_SNAPSHOT``) set, or None."""
    return _path


def _write_snapshot(path, device):
    """Pickles the device's snapshot into path through a temporary file beside it, so that a
    failed write leaves no half a pickle where an earlier one was."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as f:
            pickle.dump(_snapshot(device), f)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _label(row):
    """A holder as the message names it: a traceback row's holder says it is one already."""
    return row["holder"] if row["kind"] == "traceback" else f"{row['holder']} ({row['kind']})"


def _holder_line(row, width):
    label = _label(row)
    count = row["tensors"]
    tensors = f"{count} tensor" + ("" if count == 1 else "s")
    return f"  {label:<{width}}  {_format_bytes(row['bytes']):>10} in {tensors}"


def _explain(err):
    """The explainer needle_c calls with each new OutOfMemoryError (see the module's doc)."""
    device = err.device
    lines = [
        f"collections freed {_format_bytes(err.collected_bytes)} for this request; "
        f"largest free block {_format_bytes(err.largest_free_block)}; "
        f"{_format_bytes(err.fragmentation_bytes)} reserved but not allocated "
        f"({_format_bytes(err.inactive_split_bytes)} in inactive splits)"
    ]
    if _c._graph_capturing():
        lines.append(
            "during a CUDA graph capture, which neither collects nor releases the cache (they "
            "wait for its end): allocate before capturing, or free memory first"
        )
    path = _path
    if path is not None:
        try:
            _write_snapshot(path, device)
            err.snapshot_path = path
        except (OSError, pickle.PickleError, RuntimeError) as e:
            warnings.warn(
                f"needle could not write the out-of-memory snapshot to {path!r}: {e}",
                RuntimeWarning,
                stacklevel=2,
            )
    found = _holder_reaches(device)
    rows = [_row(holder, kind, reach) for holder, kind, reach in found]
    err.holders = rows[:_TOP]
    if rows:
        lines.append(f"top holders on {device}:")
        width = min(_WIDEST, max(len(_label(row)) for row in err.holders))
        lines.extend(_holder_line(row, width) for row in err.holders)
    else:
        lines.append(f"no name, output cache entry or traceback frame holds a tensor on {device}")
    kinds = [k for k in _NOTEBOOK_KINDS if any(r["kind"] == k for r in rows)]
    held = _releasable_bytes(found)
    if kinds and held:
        what = " and ".join(_NOTEBOOK_KINDS[k] for k in kinds)
        lines.append(
            f"hint: {what} hold{'s' if len(kinds) == 1 else ''} {_format_bytes(held)} that no "
            "name holds: ndl.memory.release_notebook_references() frees it"
        )
    if err.snapshot_path is not None:
        lines.append(
            f"memory snapshot written to {err.snapshot_path} (pytorch.org/memory_viz opens it)"
        )
    err.args = ("\n".join((err.args[0], *lines)),)


def _oom_snapshot_from_environment():
    """Applies NEEDLE_OOM_SNAPSHOT: a path checked as :func:`set_oom_snapshot` checks it."""
    text = _environ.read("NEEDLE_OOM_SNAPSHOT")
    if text is None:
        return
    try:
        set_oom_snapshot(text)
    except ValueError as err:
        raise _environ.invalid("NEEDLE_OOM_SNAPSHOT", text, str(err)) from None


def _install_explainer():
    _c._set_oom_explainer(_explain)
