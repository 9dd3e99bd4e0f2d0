"""Argument checks shared by needle's Python layers (optim, nn, init, data): one place that
decides what a count, a real-valued hyper-parameter or an input file must be, and which
exception says it is not.

Conventions (PyTorch's where it has one): a value of the wrong type (a bool where a number
is meant, a str, None) raises TypeError; a number out of range, NaN or an infinity raises
ValueError whose message starts with "Invalid"; a missing file raises FileNotFoundError with
the path in its message and in ``.filename``.
"""

import errno
import math
import numbers
import os


def check_count(name, value, low=1):
    """``value`` as an int >= ``low``: TypeError for a non-integer (bool included),
    ValueError below ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value < low:
        raise ValueError(f"Invalid {name}: {value} (must be >= {low})")
    return value


def check_real(name, value, low=None, high=None, low_open=False, high_open=False, finite=True):
    """``value`` as a float in [low, high] (an open end where ``low_open`` / ``high_open``;
    either bound may be None): TypeError for a non-real (bool included), ValueError for NaN,
    for an infinity unless ``finite=False``, and outside the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an int past float's range (2**1024 and up)
        raise ValueError(f"Invalid {name}: {value} (out of a float's range)") from None
    above = high is not None and (value > high or (high_open and value == high))
    below = low is not None and (value < low or (low_open and value == low))
    if math.isnan(value) or (finite and math.isinf(value)) or below or above:
        if low is not None and high is not None:
            wanted = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        elif low is not None:
            wanted = f"{'>' if low_open else '>='} {low}"
        elif high is not None:
            wanted = f"{'<' if high_open else '<='} {high}"
        else:
            wanted = "finite"
        raise ValueError(f"Invalid {name}: {value} (must be {wanted})")
    return value


def require_file(path, what):
    """``path`` (str or os.PathLike) as a str, if it names an existing file; else
    FileNotFoundError naming ``what`` and the path."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        reason = "is a directory, not a file" if os.path.isdir(path) else "not found"
        raise FileNotFoundError(errno.ENOENT, f"{what} {reason}", path)
    return path


def require_dir(path, what):
    """``path`` (str or os.PathLike) as a str, if it names an existing directory; else
    FileNotFoundError naming ``what`` and the path."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        reason = "is a file, not a directory" if os.path.exists(path) else "not found"
        raise FileNotFoundError(errno.ENOENT, f"{what} {reason}", path)
    return path
