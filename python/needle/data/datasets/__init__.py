"""The datasets of ``needle.data``: MNIST, CIFAR-10, in-memory arrays, Penn Treebank
and the synthetic PTB-format corpus generator."""

from .cifar10_dataset import *  # noqa: F401,F403
from .mnist_dataset import *  # noqa: F401,F403
from .ndarray_dataset import *  # noqa: F401,F403
from .ptb_dataset import *  # noqa: F401,F403
from .synthetic import *  # noqa: F401,F403
