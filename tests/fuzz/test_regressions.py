"""Minimal reproducers of what the fuzzer found, each fixed in the C or Python code."""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd


def _ones(*shape):
    return np.ones(shape, np.float32)


def test_a_tensor_refuses_a_tuple_as_cached_data():
    # hostile seed 51: a Tensor given a tuple of NDArrays then reported
    # "AttributeError: 'tuple' object has no attribute 'shape'", `.data` was a TensorTuple
    # and tuple_get_item accepted it (needle_c/autograd/tensor.c, set_cached_data).
    a = ndl.Tensor(_ones(2, 2))
    with pytest.raises(TypeError, match="cached_data must be an NDArray or None on a .*Tensor"):
        a.cached_data = (nd.array(_ones(2)), nd.array(_ones(3)))
    assert a.shape == (2, 2)
    assert isinstance(a.data, ndl.Tensor)


def test_a_tensor_tuple_refuses_an_ndarray_as_cached_data():
    t = ndl.make_tuple(ndl.Tensor(_ones(2, 2)))
    with pytest.raises(TypeError, match="must be a tuple of NDArrays"):
        t.cached_data = nd.array(_ones(2))
    assert len(t) == 1 and t[0].shape == (2, 2)
    t.cached_data = (nd.array(_ones(3)),)  # a tuple of NDArrays is still accepted
    assert t.cached_data[0].shape == (3,)


def test_a_lazy_node_among_its_own_inputs_is_an_error_not_a_stack_overflow():
    # hostile seed 20185: inputs = [node] with cached_data None made realize() recurse
    # until the C stack overflowed (needle_c/autograd/tensor.c, realize).
    x = ndl.Tensor(_ones(2, 2))
    y = ndl.exp(x)
    y.inputs = [y]
    y.cached_data = None
    for use in (y.realize_cached_data, lambda: ndl.make_tuple(y), lambda: y + 1.0):
        with pytest.raises(ValueError, match="cycle"):
            use()
    y.inputs = [x]  # the node is usable again once its inputs are consistent
    np.testing.assert_allclose(y.numpy(), np.exp(_ones(2, 2)), rtol=1e-6)


def test_a_tensor_whose_op_computes_a_tuple_refuses_the_tuple():
    # hostile seed 108414: a Tensor given MakeTensorTuple as its op (and no data) stored
    # the computed tuple as its cached_data, then "'tuple' object has no attribute
    # 'shape'" (needle_c/autograd/tensor.c, realize).
    a = ndl.Tensor(_ones(2, 2))
    y = ndl.exp(a)
    y.op = ndl.make_tuple(a, a).op
    y.inputs = [a, a]
    y.cached_data = None
    with pytest.raises(TypeError, match="computed a tuple"):
        y.realize_cached_data()
    assert y.cached_data is None
    y.op, y.inputs = ndl.exp(a).op, [a]
    np.testing.assert_allclose(y.numpy(), np.exp(_ones(2, 2)), rtol=1e-6)
