"""The basic modules: Module, Parameter and the course's layers, with the course's
parameter creation order (so a seeded NumPy RNG gives the course's parameters)."""

import math

from needle import init, ops
from needle import random as _random
from needle._checks import check_count, check_real
from needle.autograd import Tensor


class Parameter(Tensor):
    """A tensor that a Module reports from parameters(); shares the data of the tensor it
    wraps and requires grad."""


def _unpack_params(value):
    if isinstance(value, Parameter):
        return [value]
    if isinstance(value, Module):
        return value.parameters()
    if isinstance(value, dict):
        params = []
        for v in value.values():
            params += _unpack_params(v)
        return params
    if isinstance(value, (list, tuple)):
        params = []
        for v in value:
            params += _unpack_params(v)
        return params
    return []


def _child_modules(value):
    if isinstance(value, Module):
        return [value] + _child_modules(value.__dict__)
    if isinstance(value, dict):
        modules = []
        for v in value.values():
            modules += _child_modules(v)
        return modules
    if isinstance(value, (list, tuple)):
        modules = []
        for v in value:
            modules += _child_modules(v)
        return modules
    return []


class Module:
    """Base class: parameters() walks __dict__ in insertion order; train()/eval() set
    ``training`` recursively; calling a module calls forward()."""

    def __init__(self):
        self.training = True

    def parameters(self):
        return _unpack_params(self.__dict__)

    def _children(self):
        return _child_modules(self.__dict__)

    def eval(self):
        self.training = False
        for m in self._children():
            m.training = False

    def train(self):
        self.training = True
        for m in self._children():
            m.training = True

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def _check_last_dim(x, expected, module):
    if not isinstance(x, Tensor):
        raise TypeError(f"{module}: expected a Tensor, got {type(x).__name__}")
    if len(x.shape) == 0 or x.shape[-1] != expected:
        raise ValueError(
            f"{module}: expected input with last dimension {expected}, got shape {x.shape}"
        )


class Identity(Module):
    def forward(self, x):
        return x


class Linear(Module):
    """y = x @ weight + bias, weight (in, out), bias (1, out); leading dims of x are kept."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype="float32"):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(
            init.kaiming_uniform(in_features, out_features, device=device, dtype=dtype)
        )
        if bias:
            self.bias = Parameter(
                init.kaiming_uniform(out_features, 1, device=device, dtype=dtype).transpose()
            )
        else:
            self.bias = None

    def forward(self, X):
        _check_last_dim(X, self.in_features, "Linear")
        shape = X.shape
        flat = X if len(shape) == 2 else X.reshape((math.prod(shape[:-1]), shape[-1]))
        if self.bias is not None:
            # one op, one (N, out) array: X @ W + b as a composite keeps two alive in the graph
            out = ops.matmul_bias(flat, self.weight, self.bias)
        else:
            out = flat @ self.weight
        if len(shape) != 2:
            out = out.reshape((*shape[:-1], self.out_features))
        return out


class Flatten(Module):
    def forward(self, X):
        if not isinstance(X, Tensor):
            raise TypeError(f"Flatten: expected a Tensor, got {type(X).__name__}")
        return X.reshape((X.shape[0], math.prod(X.shape[1:])))


class ReLU(Module):
    def forward(self, x):
        return ops.relu(x)


class Tanh(Module):
    def forward(self, x):
        return ops.tanh(x)


class Sigmoid(Module):
    def forward(self, x):
        return ops.sigmoid(x)


class GELU(Module):
    """ops.gelu as a module, as torch.nn.GELU: approximate is "none" (the exact erf form)
    or "tanh"."""

    def __init__(self, approximate="none"):
        super().__init__()
        if not isinstance(approximate, str) or approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return ops.gelu(x, approximate=self.approximate)


class SiLU(Module):
    """ops.silu as a module, as torch.nn.SiLU: x * sigmoid(x)."""

    def forward(self, x):
        return ops.silu(x)


class Sequential(Module):
    def __init__(self, *modules):
        super().__init__()
        self.modules = modules

    def forward(self, x):
        for module in self.modules:
            x = module(x)
        return x


class SoftmaxLoss(Module):
    """Mean cross-entropy of logits (N, C) against integer labels y (N,); shape (1,).

    Same numbers as the course's logsumexp - one_hot formula, computed by the fused op
    without a (N x C) one-hot matrix."""

    def forward(self, logits, y):
        if len(logits.shape) != 2:
            raise ValueError(f"SoftmaxLoss: logits must be (N, C), got shape {logits.shape}")
        if y.shape != (logits.shape[0],):
            raise ValueError(
                f"SoftmaxLoss: labels must have shape ({logits.shape[0]},), got {y.shape}"
            )
        return ops.softmax_cross_entropy(logits, y)


def _check_norm_args(module, dim, eps):
    """A norm layer's feature count (an int >= 1) and eps (a finite real >= 0); see
    needle._checks for the exceptions."""
    check_count(f"{module} dim", dim)
    check_real(f"{module} eps", eps, low=0.0)


class BatchNorm1d(Module):
    """Normalises each of ``dim`` features over the batch; running statistics move by
    ``momentum`` (in [0, 1]) per training step. ``dim`` must be an int >= 1 (TypeError,
    ValueError), ``eps`` a finite real >= 0 (TypeError, ValueError)."""

    def __init__(self, dim, eps=1e-5, momentum=0.1, device=None, dtype="float32"):
        super().__init__()
        _check_norm_args(type(self).__name__, dim, eps)
        check_real(f"{type(self).__name__} momentum", momentum, low=0.0, high=1.0)
        self.dim = dim
        self.eps = eps
        self.momentum = momentum
        self.weight = Parameter(init.ones(dim, device=device, dtype=dtype))
        self.bias = Parameter(init.zeros(dim, device=device, dtype=dtype))
        self.running_mean = init.zeros(dim, device=device, dtype=dtype)
        self.running_var = init.ones(dim, device=device, dtype=dtype)

    def forward(self, x):
        if len(x.shape) != 2 or x.shape[1] != self.dim:
            raise ValueError(f"BatchNorm1d: expected input (N, {self.dim}), got {x.shape}")
        n = x.shape[0]
        if self.training:
            mean = x.sum((0,)) / n
            centered = x - mean.reshape((1, self.dim)).broadcast_to(x.shape)
            var = (centered**2).sum((0,)) / n
            m = self.momentum
            self.running_mean = (self.running_mean * (1 - m) + mean.data * m).data
            self.running_var = (self.running_var * (1 - m) + var.data * m).data
        else:
            mean, var = self.running_mean, self.running_var
            centered = x - mean.reshape((1, self.dim)).broadcast_to(x.shape)
        std = ((var + self.eps) ** 0.5).reshape((1, self.dim)).broadcast_to(x.shape)
        w = self.weight.reshape((1, self.dim)).broadcast_to(x.shape)
        b = self.bias.reshape((1, self.dim)).broadcast_to(x.shape)
        return w * (centered / std) + b


class BatchNorm2d(BatchNorm1d):
    """BatchNorm over the channels of NCHW input."""

    def forward(self, x):
        if len(x.shape) != 4:
            raise ValueError(f"BatchNorm2d: expected NCHW input, got shape {x.shape}")
        s = x.shape
        _x = x.transpose((1, 2)).transpose((2, 3)).reshape((s[0] * s[2] * s[3], s[1]))
        y = super().forward(_x).reshape((s[0], s[2], s[3], s[1]))
        return y.transpose((2, 3)).transpose((1, 2))


class LayerNorm1d(Module):
    """Normalises the last dimension (biased variance, eps inside the square root);
    leading dims are kept. One fused op (``ops.layer_norm``) where the course composes
    sums, broadcasts and elementwise ops; the same values to rounding. ``dim`` must be an
    int >= 1, ``eps`` a finite real >= 0."""

    def __init__(self, dim, eps=1e-5, device=None, dtype="float32"):
        super().__init__()
        _check_norm_args("LayerNorm1d", dim, eps)
        self.dim = dim
        self.eps = eps
        self.w = Parameter(init.ones(dim, device=device, dtype=dtype))
        self.b = Parameter(init.zeros(dim, device=device, dtype=dtype))

    def forward(self, x):
        _check_last_dim(x, self.dim, "LayerNorm1d")
        return ops.layer_norm(x, self.w, self.b, self.eps)


class Dropout(Module):
    """Training: zero each element with probability p and scale by 1/(1-p). Evaluation:
    identity. Where draws are NumPy's (the CPU by default; see needle.random) each call
    draws one np.random.rand(*x.shape), also when p == 0, as in the course. Where they
    come from the device generator (CUDA by default) the mask is one bernoulli kernel, and
    p == 0 returns x (no draw, no kernel) and p == 1 returns x * 0 (no draw). With NumPy's
    draws p == 0 and p == 1 advance NumPy's stream as the course's draw does, without making a
    mask (``needle.random.unread_draw``), and return x and x * 0."""

    def __init__(self, p=0.5):
        super().__init__()
        self.p = check_real("Dropout probability", p, low=0.0, high=1.0)

    def forward(self, x):
        if not self.training:
            return x
        if self.p in (0.0, 1.0):
            # No mask to apply: x * ones / 1 is x and x * zeros is x * 0 exactly. With NumPy's
            # draws the course's draw is still made (the stream stays the course's), unread.
            if not _random.uses_device_generator(x.device):
                _random.unread_draw(x.shape)
            return x if self.p == 0.0 else x * 0.0
        mask = init.randb(*x.shape, p=1 - self.p, device=x.device, dtype=x.dtype)
        return x * mask / (1 - self.p)


class Residual(Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return x + self.fn(x)
