"""Data and NumPy references shared by the Tensor op tests (test_ops_*.py): ``rnd`` draws
float32 inputs of a given kind (any, pos, nonzero, distinct), the ``*_ref`` functions are
the float64 NumPy references that ``gradcheck.check_op`` compares against."""

import numpy as np

# The default input shape of the elementwise and tuple op tests.
SHAPE = (3, 4)


def rnd(seed, shape, kind="any"):
    rng = np.random.default_rng(seed)
    if kind == "any":
        x = rng.uniform(-2.0, 2.0, size=shape)
    elif kind == "pos":
        x = rng.uniform(0.5, 2.0, size=shape)
    elif kind == "nonzero":  # well away from 0 (kinks of relu, poles of 1/x)
        x = rng.uniform(0.2, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    elif kind == "distinct":  # distinct values at least 0.1 apart (for max)
        n = int(np.prod(shape))
        x = (rng.permutation(n) * 0.1 - 0.05 * n).reshape(shape)
    else:  # pragma: no cover - test bug
        raise AssertionError(kind)
    return np.asarray(x, dtype=np.float32)


def red_ref(fn, axes):
    """A NumPy reduction with the course's shape convention: axes=None -> (1,)."""

    def ref(x):
        if axes is None:
            return np.asarray(fn(x)).reshape(1)
        return fn(x, axis=axes)

    return ref


def lse_ref(x, axes=None):
    m = np.max(x, axis=axes, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    if axes is None:
        return out.reshape(())
    return np.squeeze(out, axis=axes)


def sigmoid_ref(x):
    return 1.0 / (1.0 + np.exp(-x))


def conv_ref(x, w, stride=1, padding=0):
    n, h, wd, cin = x.shape
    k, _, _, cout = w.shape
    p, s = padding, stride
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    ho = (h + 2 * p - k) // s + 1
    wo = (wd + 2 * p - k) // s + 1
    out = np.zeros((n, ho, wo, cout), dtype=np.result_type(x, w))
    for di in range(k):
        for dj in range(k):
            patch = xp[:, di : di + s * (ho - 1) + 1 : s, dj : dj + s * (wo - 1) + 1 : s, :]
            out = out + patch @ w[di, dj]
    return out


def dilate_ref(x, axes, d):
    shape = list(x.shape)
    sl = [slice(None)] * x.ndim
    for ax in axes:
        shape[ax] *= d + 1
        sl[ax] = slice(None, None, d + 1)
    out = np.zeros(shape, dtype=x.dtype)
    out[tuple(sl)] = x
    return out


def undilate_ref(x, axes, d):
    sl = [slice(None)] * x.ndim
    for ax in axes:
        sl[ax] = slice(None, None, d + 1)
    return x[tuple(sl)]


def sce_ref(logits, labels):
    lse = lse_ref(logits, axes=1)
    picked = logits[np.arange(logits.shape[0]), labels.astype(int)]
    return np.mean(lse - picked).reshape(1)
