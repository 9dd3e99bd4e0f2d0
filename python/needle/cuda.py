"""``needle.cuda``: the course's device function and the ``torch.cuda``-style API in one name.

``ndl.cuda()`` (and ``ndl.cuda(1)``) returns the CUDA device, as in the course, while
``ndl.cuda.memory_allocated()``, ``ndl.cuda.is_available()`` ... work like ``torch.cuda``'s.
The functions live in :mod:`needle.cuda_mem`; this module is made callable so that both uses
share the one name. Everything is safe without a GPU (0, ``{}``, False).
"""
import sys
import types

import needle_c as _c

from .cuda_mem import *  # noqa: F401,F403
from .cuda_mem import __all__  # noqa: F401


class _CallableModule(types.ModuleType):
    def __call__(self, index=0):
        """The CUDA device ``index``; ``enabled()`` is False without CUDA or a GPU."""
        return _c.cuda(index)


sys.modules[__name__].__class__ = _CallableModule
