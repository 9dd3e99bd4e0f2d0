"""Views whose element count, extent or offset would overflow int64 are
refused with ValueError (csrc/layout.c checks every view where it is made),
never turned into a small or empty view that reads outside its storage."""

import gc

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES

HUGE = [
    ("as_strided count", lambda a: a.as_strided((2**32, 2**32), (0, 0))),
    ("as_strided extent", lambda a: a.as_strided((2**62, 2), (2**62, 1))),
    ("as_strided min stride", lambda a: a.as_strided((3,), (-(2**63),))),
    ("as_strided reach", lambda a: a.as_strided((2, 2), (2**60, 1))),
    ("reshape", lambda a: a.reshape((2**40, 2**40, 0))),
    ("reshape unknown", lambda a: a.reshape((-1, 2**62))),
    ("broadcast_to", lambda a: a[0:1].broadcast_to((2**32, 2**32))),
    ("empty", lambda a: nd.empty((2**40, 2**40), device=a.device)),
]


@pytest.mark.parametrize("make", [m for _, m in HUGE], ids=[n for n, _ in HUGE])
@pytest.mark.parametrize("device", DEVICES)
def test_overflowing_views_are_value_errors(device, make):
    a = nd.array(np.arange(4, dtype=np.float32), device=device)
    gc.collect()  # earlier tests' garbage must not be freed by a collection in between
    before = ndl.memory.memory_allocated(device)
    with pytest.raises(ValueError):
        make(a)
    assert ndl.memory.memory_allocated(device) == before
    np.testing.assert_array_equal(a.as_strided((2, 2), (1, 1)).numpy(), [[0, 1], [1, 2]])


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_broadcast_to_a_huge_shape_is_a_value_error(device):
    t = ndl.Tensor(np.ones((1, 1), dtype=np.float32), device=device)
    with pytest.raises(ValueError):
        ndl.broadcast_to(t, (2**33, 2**33))
    assert ndl.broadcast_to(t, (2, 3)).shape == (2, 3)
