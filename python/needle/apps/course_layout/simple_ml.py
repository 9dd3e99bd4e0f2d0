"""Course-layout shim: the course's tests do ``sys.path.append("./apps")`` and then
``from simple_ml import *`` (hw1/hw2), or ``from apps.simple_ml import *`` (hw4); this
re-exports :mod:`needle.apps.simple_ml` so they run unchanged with this folder
(needle.apps.COURSE_LAYOUT_DIR) as their apps/."""

from needle.apps.simple_ml import *  # noqa: F401,F403
