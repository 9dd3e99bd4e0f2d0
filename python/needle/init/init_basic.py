"""Basic initializers with the course's RNG semantics: each call makes exactly one
NumPy global-RNG draw (np.random.rand / randn) of prod(shape) values, then does its
arithmetic on the device in float32, so seeding NumPy reproduces the course's values.
On CUDA devices (by default; see needle.random) the values come from the device
generator instead, keyed by one NumPy draw per call: seeding NumPy still reproduces them."""

import math  # noqa: F401

import needle as ndl
import needle_c as _c
from needle._checks import check_real


def _device(device):
    # A name ("cpu", "cuda:1") is resolved, and anything else that is not a device is a
    # TypeError or ValueError, by needle_c's one device parser.
    return ndl.cpu() if device is None else _c._device(device)


def rand(*shape, low=0.0, high=1.0, device=None, dtype="float32", requires_grad=False):
    """Uniform in [low, high)."""
    device = _device(device)
    array = device.rand(*shape) * (high - low) + low
    return ndl.Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)


def randn(*shape, mean=0.0, std=1.0, device=None, dtype="float32", requires_grad=False):
    """Normal with the given mean and standard deviation."""
    device = _device(device)
    array = device.randn(*shape) * std + mean
    return ndl.Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)


def constant(*shape, c=1.0, device=None, dtype="float32", requires_grad=False):
    """Every element c (no random draw)."""
    device = _device(device)
    array = device.full(shape, c, dtype=dtype)
    return ndl.Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)


def ones(*shape, device=None, dtype="float32", requires_grad=False):
    return constant(*shape, c=1.0, device=device, dtype=dtype, requires_grad=requires_grad)


def zeros(*shape, device=None, dtype="float32", requires_grad=False):
    return constant(*shape, c=0.0, device=device, dtype=dtype, requires_grad=requires_grad)


def randb(*shape, p=0.5, device=None, dtype="float32", requires_grad=False):
    """1.0 where a uniform draw is <= p, else 0.0 (p in [0, 1]): with NumPy's draws
    ``rand(*shape) <= p`` as in the course, with the device generator one kernel.
    Raises ValueError for p outside [0, 1] or NaN and TypeError for a p that is not a
    real number (a bool included)."""
    p = check_real("randb probability p", p, low=0.0, high=1.0)
    device = _device(device)
    array = device.randb(*shape, p=p)
    return ndl.Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)


def one_hot(n, i, device=None, dtype="float32", requires_grad=False):
    """Rows i of the n x n identity; i is a Tensor of integer values; shape i.shape + (n,)."""
    device = _device(device)
    indices = i.numpy().astype("int32") if isinstance(i, ndl.Tensor) else i
    return ndl.Tensor(
        device.one_hot(n, indices, dtype=dtype), device=device, requires_grad=requires_grad
    )


def zeros_like(array, *, device=None, requires_grad=False):
    if not hasattr(array, "shape") or not hasattr(array, "device"):
        raise TypeError(f"zeros_like needs a Tensor, got {type(array).__name__}")
    device = device if device else array.device
    return zeros(*array.shape, dtype=array.dtype, device=device, requires_grad=requires_grad)


def ones_like(array, *, device=None, requires_grad=False):
    if not hasattr(array, "shape") or not hasattr(array, "device"):
        raise TypeError(f"ones_like needs a Tensor, got {type(array).__name__}")
    device = device if device else array.device
    return ones(*array.shape, dtype=array.dtype, device=device, requires_grad=requires_grad)
