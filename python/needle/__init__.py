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
# ndl.cuda() is the course's device function and ndl.cuda.memory_allocated() etc. the
# torch.cuda-style API: needle.cuda is a callable module.
from . import cuda  # noqa: F401,E402

# DLPack import: the NDArray-level function lives on backend_ndarray, as the
# other array constructors do.
backend_ndarray.from_dlpack = _c.from_dlpack


def from_dlpack(obj, requires_grad=False):
    """A leaf Tensor sharing the memory of ``obj`` (anything with ``__dlpack__``:
    NumPy arrays, torch tensors, needle arrays). float32 only; no copy is made,
    so writes through either side are visible in the other."""
    return Tensor.make_const(_c.from_dlpack(obj), requires_grad=requires_grad)

BACKEND = "nd"

__version__ = "0.1.0"
