"""needle: the CMU 10-714 Needle API on a C core.

Arrays (and, in later layers, tensors and ops) are C types whose device
memory is accounted per device, limited on request, and visible to Python's
garbage collector. See README.md for the state of each layer.
"""
import needle_c as _c
from needle_c import DeviceError, OutOfMemoryError

from . import backend_ndarray, memory
from .backend_ndarray import (
    BackendDevice,
    Device,
    NDArray,
    all_devices,
    cpu,
    cpu_numpy,
    cuda,
    default_device,
)

array_api = backend_ndarray
BACKEND = "nd"

__version__ = "0.1.0"
