"""The course's ``apps`` package: models (``LanguageModel``, ``ResNet9``), the training
loops of ``simple_ml`` (hw1's MNIST functions, PTB language modelling, CIFAR-10), hw2's MLP
ResNet (``mlp_resnet``), plus the ``train_ptb`` script (``python -m needle.apps.train_ptb``).

Course code that does ``from apps.models import *`` / ``from apps.simple_ml import *`` can use
``from needle.apps.models import *`` / ``from needle.apps.simple_ml import *``. Course tests that
put ``./apps`` on ``sys.path`` (``from mlp_resnet import *``) find the shims in the repository's
``apps/`` folder.
"""

from .models import ConvBN, LanguageModel, ResNet9  # noqa: F401
