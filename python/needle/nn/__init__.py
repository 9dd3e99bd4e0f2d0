"""Modules (``ndl.nn``): the course's layers on needle's C autograd."""

from .nn_basic import *  # noqa: F401,F403
from .nn_basic import Module, Parameter  # noqa: F401
from .nn_conv import *  # noqa: F401,F403
from .nn_sequence import *  # noqa: F401,F403
from .nn_transformer import *  # noqa: F401,F403
