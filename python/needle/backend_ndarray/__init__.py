"""The array backend, importable as ``from needle import backend_ndarray as nd``."""

from .ndarray import *  # noqa: F401,F403
from .ndarray import __all__  # noqa: F401
