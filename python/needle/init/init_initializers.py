"""Xavier and Kaiming initializers (the course's formulas and draw order)."""

import math

from .init_basic import rand, randn


def _calculate_fans(shape):
    """fan_in and fan_out of a (..., in, out) weight, counting the receptive field."""
    receptive = math.prod(shape[:-2]) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


def xavier_uniform(fan_in, fan_out, gain=1.0, **kwargs):
    a = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return rand(fan_in, fan_out, low=-a, high=a, **kwargs)


def xavier_normal(fan_in, fan_out, gain=1.0, **kwargs):
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    return randn(fan_in, fan_out, mean=0.0, std=std, **kwargs)


def _check_nonlinearity(nonlinearity):
    if nonlinearity != "relu":
        raise ValueError(f"only nonlinearity='relu' is supported, got {nonlinearity!r}")


def kaiming_uniform(fan_in, fan_out, shape=None, nonlinearity="relu", **kwargs):
    _check_nonlinearity(nonlinearity)
    if shape is not None:
        fan_in, fan_out = _calculate_fans(shape)
    bound = math.sqrt(2.0) * math.sqrt(3.0 / fan_in)
    if shape is not None:
        return rand(*shape, low=-bound, high=bound, **kwargs)
    return rand(fan_in, fan_out, low=-bound, high=bound, **kwargs)


def kaiming_normal(fan_in, fan_out, shape=None, nonlinearity="relu", **kwargs):
    _check_nonlinearity(nonlinearity)
    if shape is not None:
        fan_in, fan_out = _calculate_fans(shape)
    std = math.sqrt(2.0) / math.sqrt(fan_in)
    if shape is not None:
        return randn(*shape, mean=0.0, std=std, **kwargs)
    return randn(fan_in, fan_out, mean=0.0, std=std, **kwargs)
