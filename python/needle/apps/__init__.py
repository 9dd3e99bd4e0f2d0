"""The course's ``apps`` package: models (``LanguageModel``, ``ResNet9``), the training
loops of ``simple_ml`` (hw1's MNIST functions, PTB language modelling, CIFAR-10), hw2's MLP
ResNet (``mlp_resnet``), plus the ``train_ptb`` script (``python -m needle.apps.train_ptb``).

Course code that does ``from apps.models import *`` / ``from apps.simple_ml import *`` can use
``from needle.apps.models import *`` / ``from needle.apps.simple_ml import *``. Course tests that
put ``./apps`` on ``sys.path`` (``from mlp_resnet import *``) find needle's implementations
through the shims in ``COURSE_LAYOUT_DIR`` (installed with the package, never on ``sys.path`` by
default, so they cannot shadow a student's own modules): use that folder as the course's
``apps/`` (copy or link it), or append it to ``sys.path``.
"""

import os

from .models import ConvBN, LanguageModel, ResNet9  # noqa: F401

# The course-layout shims' folder (see above): plain modules, not part of the package.
COURSE_LAYOUT_DIR = os.path.join(os.path.dirname(__file__), "course_layout")
