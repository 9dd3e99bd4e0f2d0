"""The course's ``apps`` package: models (``LanguageModel``, ``ResNet9``) and the training
loops of ``simple_ml`` (PTB language modelling, CIFAR-10), plus the ``train_ptb`` script
(``python -m needle.apps.train_ptb``).

Course code that does ``from apps.models import *`` / ``from apps.simple_ml import *`` can use
``from needle.apps.models import *`` / ``from needle.apps.simple_ml import *``.
"""

from .models import ConvBN, LanguageModel, ResNet9  # noqa: F401
