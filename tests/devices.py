"""Device parametrisation shared by the array-layer tests.

Every op test is parametrised over ``DEVICES``; the CUDA entry is skipped
when the CUDA backend is not built or no GPU is present.
"""

import pytest

import needle as ndl

_CUDA = ndl.cuda()

DEVICES = [
    pytest.param(ndl.cpu(), id="cpu"),
    pytest.param(
        _CUDA,
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not _CUDA.enabled(), reason="CUDA backend not built or no GPU"),
        ],
        id="cuda",
    ),
]

# The decorator that runs a test once per device in DEVICES.
dev = pytest.mark.parametrize("device", DEVICES)
