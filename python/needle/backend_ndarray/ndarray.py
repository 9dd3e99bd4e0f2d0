"""NDArray and devices: the course's ``backend_ndarray`` API on needle_c.

The array type and its kernels are C (needle_c.NDArray over the engine in
csrc/); this module adds the course's module-level functions and the dtype
checks. Arrays hold float32 (the default), float16, bfloat16 or float64, each stored as
itself; elementwise ops, reductions and products compute in float32 (float64 in float64) and
round once into the result's dtype.
"""

import needle_c as _c

NDArray = _c.NDArray
Device = _c.Device
BackendDevice = _c.Device

# The dtypes, by the names NumPy, PyTorch and the course's strings use: ndl.float16 is
# "float16", so code written with either spelling passes the same value.
float32 = "float32"
float16 = "float16"
bfloat16 = "bfloat16"
float64 = "float64"

__all__ = [
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "NDArray",
    "Device",
    "BackendDevice",
    "cpu",
    "cuda",
    "cpu_numpy",
    "default_device",
    "all_devices",
    "array",
    "empty",
    "full",
    "broadcast_to",
    "reshape",
    "maximum",
    "minimum",
    "log",
    "exp",
    "tanh",
    "sqrt",
    "sum",
    "max",
    "min",
    "flip",
    "stack",
    "matmul",
    "power",
]


def cpu():
    """The host device."""
    return _c.cpu()


def cuda(index=0):
    """The CUDA device; ``cuda().enabled()`` is False when needle has no CUDA backend or GPU."""
    return _c.cuda(index)


def cpu_numpy():
    """A second host device with its own memory accounting (the course's numpy device).

    Mixing it with ``cpu()`` in one operation raises ``needle.DeviceError``, as mixing
    devices does in the course framework.
    """
    return _c.cpu_numpy()


def default_device():
    """The device arrays land on when none is given: ``cpu()``."""
    return _c.cpu()


def all_devices():
    """``[cpu(), cuda(), cpu_numpy()]``, as in the course."""
    return [_c.cpu(), _c.cuda(), _c.cpu_numpy()]


def _device(device):
    return _c.cpu() if device is None else _c._device(device)


def array(a, dtype="float32", device=None):
    """A new NDArray of ``dtype`` from an NDArray, a NumPy array or anything ``np.array``
    accepts."""
    if isinstance(a, str) or isinstance(a, bytes):
        raise TypeError(f"cannot make an NDArray from {type(a).__name__}")
    return NDArray(a, device=device, dtype=dtype)


def empty(shape, dtype="float32", device=None):
    """An uninitialised array of ``shape`` and ``dtype``."""
    return _device(device).empty(shape, dtype=dtype)


def full(shape, fill_value, dtype="float32", device=None):
    """An array of ``shape`` and ``dtype`` filled with ``fill_value``."""
    return _device(device).full(shape, fill_value, dtype=dtype)


def _require(a, name):
    if not isinstance(a, NDArray):
        raise TypeError(f"{name}: expected an NDArray, got {type(a).__name__}")
    return a


def broadcast_to(a, shape):
    """A stride-0 view of ``a`` broadcast to ``shape`` (NumPy rules)."""
    return _require(a, "broadcast_to").broadcast_to(shape)


def reshape(a, shape):
    """``a`` with a new shape: a view when possible, else a copy."""
    return _require(a, "reshape").reshape(shape)


def maximum(a, b):
    """Elementwise maximum; ``b`` may be an NDArray or a number."""
    return _require(a, "maximum").maximum(b)


def minimum(a, b):
    """Elementwise minimum; ``b`` may be an NDArray or a number."""
    return _require(a, "minimum").minimum(b)


def power(a, b):
    """``a ** b`` elementwise; ``b`` may be an NDArray or a number."""
    return _require(a, "power") ** b


def log(a):
    return _require(a, "log").log()


def exp(a):
    return _require(a, "exp").exp()


def tanh(a):
    return _require(a, "tanh").tanh()


def sqrt(a):
    return _require(a, "sqrt").sqrt()


def sum(a, axis=None, keepdims=False):  # noqa: A001 - the course's name
    """Sum over ``axis``; ``axis=None`` without keepdims gives shape ``(1,)`` as in the course."""
    return _require(a, "sum").sum(axis=axis, keepdims=keepdims)


def max(a, axis=None, keepdims=False):  # noqa: A001 - the course's name
    """Maximum over ``axis``; same shape conventions as :func:`sum`."""
    return _require(a, "max").max(axis=axis, keepdims=keepdims)


def min(a, axis=None, keepdims=False):  # noqa: A001
    """Minimum over ``axis``; same shape conventions as :func:`sum`."""
    return _require(a, "min").min(axis=axis, keepdims=keepdims)


def flip(a, axes):
    """A view of ``a`` reversed along ``axes``."""
    return _require(a, "flip").flip(axes)


def matmul(a, b):
    """``a @ b`` with NumPy's matmul rules (batched, broadcast, 1-D promotion)."""
    return _require(a, "matmul") @ _require(b, "matmul")


def stack(arrays, axis=0):
    """Equally shaped arrays joined along a new axis."""
    return _c.stack(arrays, axis)
