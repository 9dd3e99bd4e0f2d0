"""``needle.data``: datasets, the DataLoader, image transforms and the PTB helpers."""

from .data_basic import *  # noqa: F401,F403
from .data_transforms import *  # noqa: F401,F403
from .datasets import *  # noqa: F401,F403
