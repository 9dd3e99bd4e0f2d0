"""The collectives' dtype table: for each needle dtype, how it travels and how it is reduced
over MPI and NCCL. The one place that knows; _staging, collectives and _nccl read it.

- float32 and float64 travel and reduce as themselves (MPI.FLOAT, MPI.DOUBLE).
- float16 and bfloat16 travel as their raw 16 bits (MPI.UINT16_T: MPI up to 4.1 has no
  half-precision type, and Open MPI 5's ``MPI_BFLOAT16_T`` is null) and reduce in float32:
  the ranks' values are widened (exactly), MPI sums them in float32 and the sum is rounded
  once to the narrow dtype on write-back. That is the narrow dtypes' rule everywhere in
  needle (compute in float32, round once on store); a custom MPI op on the 16-bit values
  would round after every pairwise step (and run in Python), a sum of raw bits is garbage.
- NCCL has all four natively (``ncclDataType_t`` in nccl.h: ncclFloat16 6, ncclFloat32 7,
  ncclFloat64 8, ncclBfloat16 9) and is given the element count, never bytes.

bfloat16 has no NumPy dtype: on the host it is float32 (``NDArray.numpy()`` widens exactly),
and its bits are the top half of that float32's (:func:`bfloat16_bits`).
"""

from typing import NamedTuple

import numpy as np

from ._group import DistributedError


class CollectiveDtype(NamedTuple):
    """One row: ``name`` (needle's dtype), ``wire`` (the NumPy dtype of its values on the
    wire) and ``mpi`` (mpi4py's datatype name for it), ``reduce`` (the NumPy dtype MPI sums
    in) and ``reduce_mpi``, ``nccl`` (its ``ncclDataType_t``)."""

    name: str
    wire: np.dtype
    mpi: str
    reduce: np.dtype
    reduce_mpi: str
    nccl: int


_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BITS = np.dtype(np.uint16)

TABLE = {
    "float32": CollectiveDtype("float32", _F32, "FLOAT", _F32, "FLOAT", 7),
    "float16": CollectiveDtype("float16", _F16, "UINT16_T", _F32, "FLOAT", 6),
    "bfloat16": CollectiveDtype("bfloat16", _BITS, "UINT16_T", _F32, "FLOAT", 9),
    "float64": CollectiveDtype("float64", _F64, "DOUBLE", _F64, "DOUBLE", 8),
}


def of(arr, what):
    """The row of ``arr``'s dtype; DistributedError for a dtype the collectives do not know
    (needle has no other today: this guards the table against a new dtype)."""
    row = TABLE.get(arr.dtype)
    if row is None:
        raise DistributedError(
            f"{what}: no collective for dtype {arr.dtype!r} (known: {', '.join(TABLE)})"
        )
    return row


def bfloat16_bits(wide):
    """The bfloat16 bits (uint16) of ``wide``, a float32 array of bfloat16 values (exact:
    widening a bfloat16 appends 16 zero bits)."""
    return (np.ascontiguousarray(wide, _F32).view(np.uint32) >> 16).astype(np.uint16)


def bfloat16_values(bits):
    """The float32 array (exact) of the bfloat16 values whose bits are ``bits``."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_wire(row, values):
    """``values`` (the host array of an array of ``row``'s dtype, as NDArray.numpy() gives it)
    in ``row.wire``, C-contiguous; no copy when it already is."""
    if row.name == "bfloat16":
        return bfloat16_bits(values)
    return np.ascontiguousarray(values, row.wire)


def from_wire(row, buf):
    """A host array that needle writes into an array of ``row``'s dtype with the same
    values: ``buf`` itself, or for bfloat16 the float32 values of its bits (exact, so the
    write rounds nothing)."""
    return bfloat16_values(buf) if row.name == "bfloat16" else buf
