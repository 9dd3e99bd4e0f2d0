"""Xavier and Kaiming initializers (the course's formulas and draw order)."""

import math

from needle._checks import check_count

from .init_basic import rand, randn


def _check_fans(function, fan_in, fan_out):
    """Both fans as ints >= 1: the bounds divide by them (a fan of 0 was a
    ZeroDivisionError) and they are the weight's shape."""
    return check_count(f"{function} fan_in", fan_in), check_count(f"{function} fan_out", fan_out)


def _calculate_fans(function, shape):
    """fan_in and fan_out of a (..., in, out) weight, counting the receptive field; every
    dimension of ``shape`` must be an int >= 1."""
    if not isinstance(shape, tuple) or len(shape) < 2:
        raise ValueError(f"{function}: shape must be a tuple of at least 2 sizes, got {shape!r}")
    for i, size in enumerate(shape):
        check_count(f"{function} shape[{i}]", size)
    receptive = math.prod(shape[:-2]) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


def xavier_uniform(fan_in, fan_out, gain=1.0, **kwargs):
    _check_fans("xavier_uniform", fan_in, fan_out)
    a = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return rand(fan_in, fan_out, low=-a, high=a, **kwargs)


def xavier_normal(fan_in, fan_out, gain=1.0, **kwargs):
    _check_fans("xavier_normal", fan_in, fan_out)
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    return randn(fan_in, fan_out, mean=0.0, std=std, **kwargs)


def _check_nonlinearity(nonlinearity):
    if nonlinearity != "relu":
        raise ValueError(f"only nonlinearity='relu' is supported, got {nonlinearity!r}")


def kaiming_uniform(fan_in, fan_out, shape=None, nonlinearity="relu", **kwargs):
    _check_nonlinearity(nonlinearity)
    if shape is not None:
        fan_in, fan_out = _calculate_fans("kaiming_uniform", shape)
    else:
        _check_fans("kaiming_uniform", fan_in, fan_out)
    bound = math.sqrt(2.0) * math.sqrt(3.0 / fan_in)
    if shape is not None:
        return rand(*shape, low=-bound, high=bound, **kwargs)
    return rand(fan_in, fan_out, low=-bound, high=bound, **kwargs)


def kaiming_normal(fan_in, fan_out, shape=None, nonlinearity="relu", **kwargs):
    _check_nonlinearity(nonlinearity)
    if shape is not None:
        fan_in, fan_out = _calculate_fans("kaiming_normal", shape)
    else:
        _check_fans("kaiming_normal", fan_in, fan_out)
    std = math.sqrt(2.0) / math.sqrt(fan_in)
    if shape is not None:
        return randn(*shape, mean=0.0, std=std, **kwargs)
    return randn(fan_in, fan_out, mean=0.0, std=std, **kwargs)
