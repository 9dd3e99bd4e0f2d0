"""needle: the CMU 10-714 Needle API on a C core.

Arrays, tensors and ops are C types whose device memory is accounted per
device, limited on request, and visible to Python's garbage collector. See
README.md for the state of each layer.
"""
import needle_c as _c
from needle_c import DeviceError, OutOfMemoryError

from . import backend_ndarray, memory
from .ops import *  # noqa: F401,F403
from .autograd import Tensor, TensorTuple, cpu, all_devices, no_grad  # noqa: F401
from . import autograd, ops, init  # noqa: F401
from . import nn  # noqa: F401
from . import data, optim  # noqa: F401
from .init import ones, zeros, zeros_like, ones_like  # noqa: F401
from .backend_ndarray import (  # noqa: F401
    BackendDevice,
    Device,
    NDArray,
    all_devices,
    cpu,
    cpu_numpy,
    cuda,
    default_device,
)
from . import backend_ndarray as array_api  # noqa: F401

BACKEND = "nd"

__version__ = "0.1.0"
