"""One parser per op parameter (issue 24): a bad axis, shape or scalar raises the same
exception type with the same message whichever way it reaches needle_c: an NDArray
method, an ``ndl.ops`` function, an Op class (``ops.Summation(axes=...)``) or a Tensor
method, on every device.

The rules (needle_c/array/parse.h): an axis out of range is NumPy's ``AxisError`` (a
ValueError and an IndexError) with NumPy's message, a repeated axis a ValueError, a bool
axis or shape entry a TypeError; shapes are non-negative (one -1 for reshape) with a
product that fits in an int64; a bool scalar is the number 0 or 1 everywhere, as in NumPy
and PyTorch.
"""

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd
from needle import ops

from devices import DEVICES

AxisError = np.exceptions.AxisError
SHAPE = (2, 3)
VALUES = np.arange(6, dtype=np.float32).reshape(SHAPE)


def _tensor(device):
    return ndl.Tensor(VALUES, device=device)


def _raised(fn):
    """(exception type, message) of fn(), failing the test when it does not raise."""
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value)


def _assert_same_error(surfaces, kind, message):
    """Every way in (name -> call) raises ``kind`` with ``message``, and the same text."""
    seen = {name: _raised(fn) for name, fn in surfaces.items()}
    for name, (raised, text) in seen.items():
        assert raised is kind, (name, raised, text)
        assert message in text, (name, text)
    assert len({text for _, text in seen.values()}) == 1, seen


def _sum_surfaces(device, axes):
    """One reduction over axes through each of the four surfaces."""
    x = _tensor(device)
    a = x.cached_data
    return {
        "NDArray.sum": lambda: a.sum(axis=axes),
        "ops.summation": lambda: ops.summation(x, axes=axes),
        "ops.Summation": lambda: ops.Summation(axes=axes)(x),
        "Tensor.sum": lambda: x.sum(axes=axes),
    }


BAD_AXES = [
    pytest.param(2, AxisError, "axis 2 is out of bounds for array of dimension 2", id="past-end"),
    pytest.param(-3, AxisError, "axis -3 is out of bounds for array of dimension 2", id="negative"),
    pytest.param((0, 5), AxisError, "axis 5 is out of bounds for array of dimension 2", id="tuple"),
    pytest.param(np.int64(7), AxisError, "axis 7 is out of bounds", id="numpy-int"),
    pytest.param(2**40, AxisError, "axis 1099511627776 is out of bounds for any array", id="2**40"),
    pytest.param(2**70, AxisError, "is out of bounds for any array", id="2**70"),
    pytest.param((0, 0), ValueError, "duplicate value in 'axis'", id="repeated"),
    pytest.param((1, -1), ValueError, "duplicate value in 'axis'", id="repeated-negative"),
    pytest.param(True, TypeError, "not bool", id="bool"),
    pytest.param((0, False), TypeError, "not bool", id="bool-in-tuple"),
    pytest.param(np.bool_(True), TypeError, "not bool", id="numpy-bool"),
    pytest.param(1.0, TypeError, "got float", id="float"),
    pytest.param("0", TypeError, "got str", id="str"),
    pytest.param(tuple(range(17)), ValueError, "at most 16 dimensions", id="17-axes"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axes, kind, message", BAD_AXES)
def test_a_bad_axis_raises_the_same_everywhere(device, axes, kind, message):
    _assert_same_error(_sum_surfaces(device, axes), kind, message)


@pytest.mark.parametrize("device", DEVICES)
def test_axis_error_is_numpys_and_both_a_value_and_an_index_error(device):
    x = _tensor(device)
    for fn in (lambda: x.cached_data.sum(axis=3), lambda: x.sum(axes=3)):
        with pytest.raises(AxisError) as info:
            fn()
        assert isinstance(info.value, ValueError) and isinstance(info.value, IndexError)
    # The same bad axis in NumPy: the same type, the same words.
    with pytest.raises(AxisError) as numpy_info:
        VALUES.sum(axis=3)
    assert str(numpy_info.value) == str(info.value)
    np.testing.assert_array_equal(x.sum(axes=(-1,)).numpy(), VALUES.sum(axis=-1))


@pytest.mark.parametrize("device", DEVICES)
def test_every_axis_parameter_uses_the_same_rules(device):
    """flip, permute/transpose, stack and split: the same errors as the reductions."""
    x = _tensor(device)
    a = x.cached_data
    out_of_range = [
        lambda: a.flip((2,)),
        lambda: ops.flip(x, (2,)),
        lambda: ops.Flip((2,))(x),
        lambda: a.permute((0, 2)),
        lambda: ops.transpose(x, (0, 2)),
        lambda: x.transpose((0, 2)),
        lambda: ops.logsumexp(x, axes=2),
        lambda: ops.max(x, axes=2),
        lambda: ops.split(x, 2),
    ]
    for fn in out_of_range:
        raised, text = _raised(fn)
        assert raised is AxisError and text == "axis 2 is out of bounds for array of dimension 2"
    # stack's new axis may be ndim (the end), not past it.
    for fn in (lambda: nd.stack([a, a], 4), lambda: ops.stack([x, x], 4)):
        raised, text = _raised(fn)
        assert raised is AxisError and text == "axis 4 is out of bounds for array of dimension 3"
    assert nd.stack([a, a], 2).shape == ops.stack([x, x], 2).shape == (2, 3, 2)
    for fn in (
        lambda: a.flip((0, 0)),
        lambda: ops.flip(x, (0, -2)),
        lambda: a.permute((1, 1)),
        lambda: ops.transpose(x, (1, -1)),
        lambda: ops.dilate(x, (0, 0), 1),
    ):
        assert _raised(fn) == (ValueError, "duplicate value in 'axis'")
    for fn in (
        lambda: a.flip(True),
        lambda: ops.Flip((True,)),
        lambda: ops.Transpose((0, True)),
        lambda: ops.Stack(True),
        lambda: nd.stack([a, a], True),
        lambda: ops.Split(np.bool_(False)),
        lambda: ops.Dilate((0,), True),
    ):
        raised, text = _raised(fn)
        assert raised is TypeError and "not bool" in text, text


def _reshape_surfaces(device, shape):
    x = _tensor(device)
    a = x.cached_data
    return {
        "NDArray.reshape": lambda: a.reshape(shape),
        "ops.reshape": lambda: ops.reshape(x, shape),
        "ops.Reshape": lambda: ops.Reshape(shape)(x),
        "Tensor.reshape": lambda: x.reshape(shape),
    }


def _broadcast_surfaces(device, shape):
    x = _tensor(device)
    a = x.cached_data
    return {
        "NDArray.broadcast_to": lambda: a.broadcast_to(shape),
        "ops.broadcast_to": lambda: ops.broadcast_to(x, shape),
        "ops.BroadcastTo": lambda: ops.BroadcastTo(shape)(x),
        "Tensor.broadcast_to": lambda: x.broadcast_to(shape),
    }


BAD_SHAPES = [
    pytest.param((True, 6), TypeError, "not bool", id="bool"),
    pytest.param((np.bool_(True), 6), TypeError, "not bool", id="numpy-bool"),
    pytest.param((2.0, 3), TypeError, "got float", id="float"),
    pytest.param("23", TypeError, "got str", id="str"),
    pytest.param((-2, 3), ValueError, "non-negative", id="negative"),
    pytest.param((2**40, 2**40, 2**40), ValueError, "more elements than fit", id="overflow"),
    pytest.param((2**64,), ValueError, "does not fit in 64 bits", id="2**64"),
    pytest.param((1,) * 17, ValueError, "at most 16 dimensions", id="17-dims"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, kind, message", BAD_SHAPES)
@pytest.mark.parametrize("surfaces", [_reshape_surfaces, _broadcast_surfaces])
def test_a_bad_shape_raises_the_same_everywhere(device, surfaces, shape, kind, message):
    _assert_same_error(surfaces(device, shape), kind, message)


@pytest.mark.parametrize("device", DEVICES)
def test_only_reshape_infers_a_minus_one(device):
    for fn in _reshape_surfaces(device, (-1, 2)).values():
        assert fn().shape == (3, 2)
    for fn in _reshape_surfaces(device, (-1, -1)).values():
        assert _raised(fn)[0] is ValueError
    for fn in _broadcast_surfaces(device, (-1, 3)).values():
        assert _raised(fn) == (ValueError, "shape entries must be non-negative, got -1")
    with pytest.raises(ValueError, match="non-negative"):
        nd.empty((2, -1), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flag", [True, np.bool_(True)], ids=["bool", "numpy-bool"])
def test_a_bool_scalar_is_a_number_everywhere(device, flag):
    x = _tensor(device)
    expected = VALUES + 1
    results = {
        "NDArray +": x.cached_data + flag,
        "Tensor +": x + flag,
        "Tensor + (reflected)": flag + x,
        "ops.add_scalar": ops.add_scalar(x, flag),
        "ops.AddScalar": ops.AddScalar(flag)(x),
        "ops.MulScalar": ops.MulScalar(flag)(x) + 1,
        "ops.fused_add_scalars": ops.fused_add_scalars(x, flag, 0)[0],
    }
    for name, value in results.items():
        np.testing.assert_array_equal(value.numpy(), expected, err_msg=name)
    assert ops.AddScalar(flag).scalar == 1.0
    filled = nd.full(SHAPE, flag, device=device)
    np.testing.assert_array_equal(filled.numpy(), np.ones(SHAPE, np.float32))
    filled.fill(False)
    np.testing.assert_array_equal(filled.numpy(), np.zeros(SHAPE, np.float32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [1j, np.complex64(1j), "1", None, [1.0]], ids=repr)
def test_a_non_scalar_is_refused_everywhere(device, bad):
    x = _tensor(device)
    a = x.cached_data
    for fn in (
        lambda: a + bad,
        lambda: x + bad,
        lambda: ops.add_scalar(x, bad),
        lambda: ops.AddScalar(bad),
        lambda: a.fill(bad),
        lambda: nd.full(SHAPE, bad, device=device),
    ):
        raised, text = _raised(fn)
        assert raised is TypeError, (raised, text)
    np.testing.assert_array_equal((x + np.float32(2)).numpy(), VALUES + 2)


@pytest.mark.parametrize("device", DEVICES)
def test_integer_parameters_refuse_bools_and_out_of_range(device):
    for fn in (
        lambda: ops.Conv(stride=True),
        lambda: ops.Conv(padding=False),
        lambda: ops.Dilate((0,), True),
        lambda: ops.TupleGetItem(True),
        lambda: ops.ScatterAddRows(True),
    ):
        raised, text = _raised(fn)
        assert raised is TypeError and "not bool" in text, text
    assert _raised(lambda: ops.Conv(stride=0)) == (
        ValueError,
        "stride 0 is out of range [1, 100000]",
    )
    assert _raised(lambda: ops.Dilate((0,), 2**64))[0] is ValueError
    x = _tensor(device)
    np.testing.assert_array_equal(ops.dilate(x, (0,), 1).numpy()[::2], VALUES)
