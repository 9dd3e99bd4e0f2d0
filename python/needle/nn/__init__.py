"""Modules (``ndl.nn``): the course's layers on needle's C autograd."""
from .nn_basic import *  # noqa: F401,F403
from .nn_basic import Parameter, Module  # noqa: F401
