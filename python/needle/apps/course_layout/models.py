"""Course-layout shim: hw4's tests do ``from apps.models import ResNet9`` (and
``LanguageModel``) with the course folder as the working directory; this re-exports
:mod:`needle.apps.models` so they run unchanged with this folder
(needle.apps.COURSE_LAYOUT_DIR) as their apps/. New code imports ``needle.apps.models``."""

from needle.apps.models import *  # noqa: F401,F403
from needle.apps.models import __all__  # noqa: F401
