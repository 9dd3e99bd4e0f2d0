"""Course-layout shim: the course's tests do ``sys.path.append("./apps")`` and then
``from mlp_resnet import *``; this re-exports :mod:`needle.apps.mlp_resnet` so they
run unchanged with this folder (needle.apps.COURSE_LAYOUT_DIR) as their apps/. New code
imports ``needle.apps.mlp_resnet``."""

from needle.apps.mlp_resnet import *  # noqa: F401,F403
from needle.apps.mlp_resnet import __all__  # noqa: F401
