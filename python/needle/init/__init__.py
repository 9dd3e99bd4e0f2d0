"""Initializers (``ndl.init``) with the course's NumPy-RNG semantics."""

from .init_basic import *  # noqa: F401,F403
from .init_initializers import *  # noqa: F401,F403
