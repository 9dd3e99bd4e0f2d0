"""Course-layout shim: the course's tests do ``sys.path.append("./apps")`` and then
``from simple_ml import *`` (hw1/hw2), or ``from apps.simple_ml import *`` (hw4); this
re-exports :mod:`needle.apps.simple_ml` so they run from this repository's root unchanged."""

from needle.apps.simple_ml import *  # noqa: F401,F403
