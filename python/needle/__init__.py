"""needle: the CMU 10-714 Needle API on a C core.

Arrays, tensors and ops are C types whose device memory is accounted per
device, limited on request, and visible to Python's garbage collector. See
docs/index.md's Status for the state of each layer.
"""

import needle_c as _c
from needle_c import DeviceError, OutOfMemoryError

from . import _environ, autograd, backend_ndarray, data, init, memory, nn, ops, optim, random, utils
from . import backend_ndarray as array_api
from . import amp  # ndl.amp.GradScaler, ndl.amp.autocast
from ._autocast import autocast
from .autograd import Tensor, TensorTuple, no_grad
from .backend_ndarray import (
    BackendDevice,
    Device,
    NDArray,
    all_devices,
    bfloat16,
    cpu,
    cpu_numpy,
    default_device,
    float16,
    float32,
    float64,
)
from .init import ones, ones_like, zeros, zeros_like
from .random import manual_seed
from .ops import *  # noqa: F403

# needle_c has checked the variables it reads at its import and needle.memory its own; the
# CUDA backend's are read in C only at the first CUDA call, so they are checked here.
_environ.check_cuda_variables()

# ndl.cuda() is the course's device function and ndl.cuda.memory_allocated() etc. the
# torch.cuda-style API: needle.cuda is a callable module. It is bound by import_module,
# not `from . import cuda`: that statement returns whatever attribute `cuda` the package
# already has (a device function re-exported by a star import, say) without importing
# the submodule, and ndl.cuda.is_available() would then be an AttributeError.
import importlib as _importlib  # noqa: E402

cuda = _importlib.import_module(".cuda", __name__)

# DLPack import: the NDArray-level function lives on backend_ndarray, as the
# other array constructors do.
backend_ndarray.from_dlpack = _c.from_dlpack


def from_dlpack(obj, requires_grad=False):
    """A leaf Tensor sharing the memory of ``obj`` (anything with ``__dlpack__``:
    NumPy arrays, torch tensors, needle arrays) of any of needle's dtypes; no copy is made,
    so writes through either side are visible in the other."""
    return Tensor.make_const(_c.from_dlpack(obj), requires_grad=requires_grad)


BACKEND = _c.BACKEND

__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """``%load_ext needle``: after each cell a line of what the cell did to device memory, and
    the magics ``%needle_memory`` and ``%needle_holders`` (needle.notebook_extension, imported
    here so that ``import needle`` imports no IPython)."""
    from . import notebook_extension

    notebook_extension.load_ipython_extension(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext needle``: removes the line's callbacks and the magics."""
    from . import notebook_extension

    notebook_extension.unload_ipython_extension(ipython)
