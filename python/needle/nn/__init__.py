"""Modules (``ndl.nn``): the course's layers on needle's C autograd."""

from .nn_basic import *  # noqa: F401,F403
from .nn_basic import Module, Parameter  # noqa: F401
from .nn_conv import *  # noqa: F401,F403
from .nn_sequence import *  # noqa: F401,F403
from .nn_transformer import *  # noqa: F401,F403


def __getattr__(name):
    # needle.distributed's DDP is a Module, so it imports this package: export it lazily.
    if name == "DistributedDataParallel":
        from needle.distributed.ddp import DistributedDataParallel

        return DistributedDataParallel
    raise AttributeError(f"module 'needle.nn' has no attribute {name!r}")
