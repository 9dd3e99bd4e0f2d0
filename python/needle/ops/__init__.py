"""All ops: classes and lowercase functions (``ndl.ops.exp``, ``ndl.ops.EWiseAdd``...)."""

from .ops_logarithmic import *  # noqa: F401,F403
from .ops_mathematic import *  # noqa: F401,F403
from .ops_sequence import *  # noqa: F401,F403
from .ops_tuple import *  # noqa: F401,F403
