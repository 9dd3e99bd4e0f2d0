"""Device parametrisation shared by the array-layer tests.

Every op test is parametrised over ``DEVICES``; the CUDA entry is skipped, with the reason
``needle.cuda.unavailable_reason()`` gives, when the CUDA backend is not built or no GPU is
usable. ``needs_cuda`` holds the same marks for tests that only make sense on a GPU. With
``NEEDLE_REQUIRE_CUDA=1`` (the GPU machine's validation run) conftest.py turns those skips
into failures, so a GPU that needle cannot see fails the run instead of passing it quietly.
"""

import pytest

import needle as ndl

_CUDA = ndl.cuda()
CUDA_UNAVAILABLE = ndl.cuda.unavailable_reason()  # None when a GPU is usable

# The marks of a CUDA-only test: `cuda` (conftest.py keys NEEDLE_REQUIRE_CUDA on it) and
# the skip without a GPU.
needs_cuda = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        CUDA_UNAVAILABLE is not None, reason=f"CUDA unavailable: {CUDA_UNAVAILABLE}"
    ),
]

DEVICES = [
    pytest.param(ndl.cpu(), id="cpu"),
    pytest.param(_CUDA, marks=needs_cuda, id="cuda"),
]

# The decorator that runs a test once per device in DEVICES.
dev = pytest.mark.parametrize("device", DEVICES)
