"""The basic modules: Module, Parameter and the course's layers, with the course's
parameter creation order (so a seeded NumPy RNG gives the course's parameters), and the
Module's names for its state (named_parameters, state_dict, load_state_dict) in PyTorch's
key layout, so that checkpoints and DistributedDataParallel's "module." keys read as
PyTorch's do."""

import math
from collections import OrderedDict as _OrderedDict
from collections import namedtuple as _namedtuple
from collections.abc import Mapping as _Mapping

import numpy as _np

import needle_c as _c
from needle import init, ops
from needle import random as _random
from needle._checks import check_count, check_real
from needle.autograd import Tensor
from needle.backend_ndarray import NDArray as _NDArray


class Parameter(Tensor):
    """A tensor that a Module reports from parameters(); shares the data of the tensor it
    wraps and requires grad."""


# Every walk over a module's attributes keeps the modules and containers on its current path
# (``path``: their ids): one met again below itself (``m.me = m``, a list holding itself) is
# skipped, where following it would recurse for ever. A module reached twice on different
# paths (a shared layer) is still walked each time, as the course's parameters() does.


def _unpack_params(value, path):
    if isinstance(value, Parameter):
        return [value]
    if not isinstance(value, (Module, dict, list, tuple)) or id(value) in path:
        return []
    if isinstance(value, Module):
        if type(value).parameters is not Module.parameters:
            return value.parameters()  # a subclass's own (a wrapper's) answer
        items = value.__dict__.values()
    else:
        items = value.values() if isinstance(value, dict) else value
    path.add(id(value))
    try:
        params = []
        for v in items:
            params += _unpack_params(v, path)
        return params
    finally:
        path.discard(id(value))


def _child_modules(value, path):
    if not isinstance(value, (Module, dict, list, tuple)) or id(value) in path:
        return []
    path.add(id(value))
    try:
        if isinstance(value, Module):
            return [value] + _child_modules(value.__dict__, path)
        modules = []
        for v in value.values() if isinstance(value, dict) else value:
            modules += _child_modules(v, path)
        return modules
    finally:
        path.discard(id(value))


class Module:
    """Base class: parameters() walks __dict__ in insertion order; train()/eval() set
    ``training`` recursively; calling a module calls forward().

    Names (PyTorch's layout): an attribute contributes its name, an item of a list, tuple
    or dict attribute its index or key, joined by "." ("layers.0.weight"); the attributes a
    class lists in ``_inline_attributes`` contribute only their items' indices, as
    Sequential's ``modules`` gives "0.weight" like torch.nn.Sequential. Buffers are the
    non-Parameter Tensor attributes named ``running_*`` (BatchNorm's statistics)."""

    # Container attributes whose items are named without the attribute's name.
    _inline_attributes = ()

    def __init__(self):
        self.training = True

    def parameters(self):
        return _unpack_params(self.__dict__, {id(self)})

    def _children(self):
        return _child_modules(self.__dict__, {id(self)})

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

    # -- names and state (PyTorch's layout) -------------------------------------------------

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(name, Parameter) pairs in ``parameters()`` order; a parameter reached twice is
        reported once, under its first name, unless ``remove_duplicate`` is False. With
        ``recurse=False`` only the parameters held by this module itself."""
        _check_str("named_parameters: prefix", prefix)
        _check_bool("named_parameters: recurse", recurse)
        _check_bool("named_parameters: remove_duplicate", remove_duplicate)
        if recurse:
            pairs = _walk_parameters(self, _dotted(prefix), set())
        else:
            pairs = ((_dotted(prefix) + k, p) for k, p in _split_entries(self)[0])
        return _unique(pairs, remove_duplicate)

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        """(name, Tensor) pairs of the buffers (``running_*`` Tensor attributes), module by
        module in ``named_modules()`` order, as PyTorch's named_buffers."""
        _check_str("named_buffers: prefix", prefix)
        _check_bool("named_buffers: recurse", recurse)
        _check_bool("named_buffers: remove_duplicate", remove_duplicate)
        modules = (
            self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
            if recurse
            else [(prefix, self)]
        )
        pairs = ((_dotted(name) + k, b) for name, m in modules for k, b in _split_entries(m)[1])
        return _unique(pairs, remove_duplicate)

    def named_children(self):
        """(name, Module) pairs of the modules directly below this one (through list, tuple
        and dict attributes: "layers.0"), each once."""
        return _unique(_walk_children(self, "", set()), True)

    def named_modules(self, prefix="", remove_duplicate=True):
        """(name, Module) pairs of this module ("" or ``prefix``) and every module below it,
        parents before their children, each once unless ``remove_duplicate`` is False."""
        _check_str("named_modules: prefix", prefix)
        _check_bool("named_modules: remove_duplicate", remove_duplicate)
        return _unique(_walk_modules(self, prefix, set()), remove_duplicate)

    def state_dict(self, *, prefix="", keep_vars=False):
        """An OrderedDict name -> Tensor of the parameters and buffers in PyTorch's order
        (per module: its parameters, its buffers, then its children in attribute order).
        The tensors are detached and share the data (the Parameters themselves with
        ``keep_vars=True``); an optimizer step gives a parameter a new array, so a state
        dict taken before it keeps the values it had. Shared parameters appear under every
        name, as in PyTorch."""
        _check_str("state_dict: prefix", prefix)
        _check_bool("state_dict: keep_vars", keep_vars)
        return _OrderedDict(
            (k, v if keep_vars else v.detach()) for k, v in _walk_state(self, prefix, set())
        )

    def load_state_dict(self, state_dict, strict=True):
        """Copies ``state_dict``'s values (Tensors, NDArrays or NumPy arrays, converted to
        each target's dtype and device) into this module's parameters and buffers, which
        keep their identity (an optimizer made before still updates them) and get new
        arrays of their own (the source is not aliased). Returns ``(missing_keys,
        unexpected_keys)``. RuntimeError, loading nothing, for a shape that differs (naming
        the key and both shapes) and, with ``strict``, for missing or unexpected keys;
        TypeError for a ``state_dict`` that is not a mapping, a value that is not an array,
        or a ``strict`` that is not a bool."""
        if not isinstance(state_dict, _Mapping):
            raise TypeError(
                f"load_state_dict: state_dict must be a mapping, got {type(state_dict).__name__}"
            )
        _check_bool("load_state_dict: strict", strict)
        targets = list(_walk_state(self, "", set()))
        expected = {k for k, _ in targets}
        missing = [k for k, _ in targets if k not in state_dict]
        unexpected = [k for k in state_dict if k not in expected]
        errors = []
        if strict and missing:
            errors.append("Missing key(s) in state_dict: " + _quoted(missing) + ".")
        if strict and unexpected:
            errors.append("Unexpected key(s) in state_dict: " + _quoted(unexpected) + ".")
        loads = [(k, t, _source_array(k, state_dict[k])) for k, t in targets if k in state_dict]
        for key, target, source in loads:
            if tuple(source.shape) != tuple(target.shape):
                errors.append(
                    f"size mismatch for {key}: copying a param with shape "
                    f"{tuple(source.shape)} from checkpoint, the shape in current model is "
                    f"{tuple(target.shape)}."
                )
        if errors:
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                + "\n\t".join(errors)
            )
        # Every conversion before any assignment: a failing one leaves the module as it was.
        arrays = [(target, _converted(key, source, target)) for key, target, source in loads]
        for target, array in arrays:
            target.cached_data = array
        return _IncompatibleKeys(missing, unexpected)


# BatchNorm's running statistics are the only module state that is not a Parameter; other
# Tensor attributes (attention's saved probabilities) are per-batch scratch, not model state.
_BUFFER_PREFIX = "running_"


def _is_buffer(name, value):
    """Whether the attribute ``name`` of a Module holding ``value`` is a buffer."""
    return (
        isinstance(name, str)
        and name.startswith(_BUFFER_PREFIX)
        and isinstance(value, Tensor)
        and not isinstance(value, Parameter)
    )


class _IncompatibleKeys(_namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """load_state_dict's result, as PyTorch's: the keys the module has and the state dict
    lacked, and the state dict's keys the module has not."""

    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")


def _check_str(name, value):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")


def _dotted(prefix):
    return prefix + "." if prefix else ""


def _quoted(keys):
    return ", ".join(f'"{k}"' for k in keys)


def _is_container(value):
    return isinstance(value, (list, tuple, dict))


def _entries(node):
    """(key, value, is_attribute) for what ``node`` (a Module, or a list, tuple or dict met
    in one) holds, in the order parameters() walks it; the one place keys are made."""
    if isinstance(node, Module):
        inline = type(node)._inline_attributes
        for name, value in node.__dict__.items():
            if name in inline and _is_container(value):
                for key, item, _ in _entries(value):
                    yield key, item, False
            else:
                yield name, value, True
    elif isinstance(node, dict):
        for key, value in node.items():
            yield str(key), value, False
    else:
        for index, value in enumerate(node):
            yield str(index), value, False


def _split_entries(node):
    """``node``'s own parameters, its buffers (a Module's attributes only) and the modules
    and containers below it (PyTorch's children: a list of modules is its ModuleList), each
    a list of (key, value)."""
    params, buffers, below = [], [], []
    for key, value, is_attribute in _entries(node):
        if isinstance(value, Parameter):
            params.append((key, value))
        elif is_attribute and _is_buffer(key, value):
            buffers.append((key, value))
        elif isinstance(value, Module) or _is_container(value):
            below.append((key, value))
    return params, buffers, below


def _below(value, path):
    """Whether a walk goes into ``value``: a Module or container not on its path."""
    return (isinstance(value, Module) or _is_container(value)) and id(value) not in path


def _walk_parameters(node, prefix, path):
    # Depth first in entry order: exactly parameters()'s order.
    path.add(id(node))
    try:
        for key, value, _ in _entries(node):
            if isinstance(value, Parameter):
                yield prefix + key, value
            elif _below(value, path):
                yield from _walk_parameters(value, prefix + key + ".", path)
    finally:
        path.discard(id(node))


def _walk_children(node, prefix, path):
    path.add(id(node))
    try:
        for key, value, _ in _entries(node):
            if not _below(value, path):
                continue
            if isinstance(value, Module):
                yield prefix + key, value
            else:
                yield from _walk_children(value, prefix + key + ".", path)
    finally:
        path.discard(id(node))


def _walk_modules(module, prefix, path):
    yield prefix, module
    path.add(id(module))
    try:
        for key, child in _walk_children(module, "", path):
            yield from _walk_modules(child, _dotted(prefix) + key, path)
    finally:
        path.discard(id(module))


def _walk_state(node, prefix, path):
    # PyTorch's _save_to_state_dict order: own parameters, own buffers, then the children.
    params, buffers, below = _split_entries(node)
    for key, value in params + buffers:
        yield prefix + key, value
    path.add(id(node))
    try:
        for key, value in below:
            if id(value) not in path:
                yield from _walk_state(value, prefix + key + ".", path)
    finally:
        path.discard(id(node))


def _unique(pairs, remove_duplicate):
    """The (name, object) pairs as a generator, dropping objects already seen."""
    if not remove_duplicate:
        yield from pairs
        return
    seen = set()
    for name, obj in pairs:
        if id(obj) not in seen:
            seen.add(id(obj))
            yield name, obj


def _source_array(key, value):
    """The array behind one state_dict value (not yet converted); TypeError naming the key
    for anything but a Tensor, an NDArray or a NumPy array."""
    if isinstance(value, Tensor):
        return value.realize_cached_data()
    if isinstance(value, (_NDArray, _np.ndarray)):
        return value
    raise TypeError(
        f"load_state_dict: state_dict[{key!r}] must be a Tensor, an NDArray or a NumPy array, "
        f"got {type(value).__name__}"
    )


def _converted(key, source, target):
    """A new array holding ``source`` in ``target``'s dtype, on its device."""
    try:
        return _NDArray(source, device=target.device, dtype=target.dtype)
    except (TypeError, ValueError) as e:
        raise type(e)(f"load_state_dict: state_dict[{key!r}]: {e}") from e


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
        check_count("Linear in_features", in_features)
        check_count("Linear out_features", out_features)
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
    """Calls its modules in turn; they are named "0", "1", ... as torch.nn.Sequential's."""

    _inline_attributes = ("modules",)

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

    def _check_not_empty(self, n, shape):
        # No value, no statistics: the batch mean would be NaN and the running statistics
        # NaN for good. Raised before they move; PyTorch refuses an empty batch too.
        if self.training and n == 0:
            raise ValueError(
                f"{type(self).__name__}: an empty batch (input shape {tuple(shape)}) has no "
                "batch statistics in training mode"
            )

    def forward(self, x):
        if len(x.shape) != 2 or x.shape[1] != self.dim:
            raise ValueError(f"BatchNorm1d: expected input (N, {self.dim}), got {x.shape}")
        n = x.shape[0]
        if self.training:
            self._check_not_empty(n, x.shape)
            mean = x.sum((0,)) / n
            centered = x - mean.reshape((1, self.dim)).broadcast_to(x.shape)
            var = (centered**2).sum((0,)) / n
            m = self.momentum
            running_mean = (self.running_mean * (1 - m) + mean.data * m).data
            running_var = (self.running_var * (1 - m) + var.data * m).data
            if _c._graph_capturing():
                # A CUDA graph's replays must read what the previous replay wrote.
                self.running_mean.copy_(running_mean)
                self.running_var.copy_(running_var)
            else:
                self.running_mean, self.running_var = running_mean, running_var
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
        self._check_not_empty(s[0] * s[2] * s[3], s)
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
