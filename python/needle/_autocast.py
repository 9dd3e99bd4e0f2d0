"""Automatic mixed precision: ``ndl.autocast`` (also ``ndl.amp.autocast``), with the semantics
of ``torch.autocast``.

Inside ``with ndl.autocast(device, dtype=ndl.bfloat16):`` the built-in ops run on ``device``'s
type (``"cpu"`` or ``"cuda"``) choose their compute dtype by op, as PyTorch's autocast lists do:

- **autocast dtype** (float16 or bfloat16): ``MatMul`` (``@``, batched matmul), ``MatMulBias``
  (``nn.Linear``), ``Conv`` (``nn.Conv``). Their float32 inputs are cast to the narrow type.
- **float32**: ``LogSoftmax``, ``LogSumExp``, ``Summation`` (so ``mean`` and the losses and
  norms that are built from sums too), ``Exp``, ``Log``, ``PowerScalar``, ``EWisePow``,
  ``FusedLSTMCell`` and ``FusedLSTM``. Their float16/bfloat16 inputs are cast to float32.
- **float32 inside the engine**: ``SoftmaxCrossEntropy`` (``nn.SoftmaxLoss``), ``LayerNorm``
  and ``AttentionSoftmax`` take narrow inputs as they are and compute in float32 (the engine's
  float32 island), with no cast node, so the graph keeps no float32 copy of the logits or the
  activations: the loss comes out float32 (a mean), layer norm's output float32 (its float32
  weights promote), the attention probabilities in the scores' dtype, for the matmul that
  reads them.
- **everything else** runs in the widest dtype of its inputs (the engine's promotion: float32 +
  bfloat16 computes in float32), so an elementwise op on a matmul's output stays narrow. The
  activations and selections ``GELU``, ``GELUTanh``, ``SiLU``, ``Abs``, ``Erf``, ``Maximum``,
  ``Minimum``, ``MaximumScalar``, ``MinimumScalar``, ``Clamp``, ``ClampTensor`` and ``Where``
  are named here on purpose (``INPUT_DTYPE_OPS``): PyTorch's autocast lists none of them (a
  bfloat16 gelu stays bfloat16, a float32 one float32), and neither does needle's.

float64 inputs are never cast. Each cast is a recorded ``Cast`` node, so a float32 parameter
that a matmul reads in bfloat16 stays float32 (the master weight) and gets a float32 gradient:
a Cast's gradient is its output gradient cast back to its input's dtype. Ops written in Python
(``TensorOp`` subclasses) run on their inputs as given.

The lists are ``NARROW_OPS`` and ``FLOAT32_OPS`` below, handed to the C layer at import as
the table every op call reads. The state is per thread and per device type, kept in the C layer
where every op call reads one flag. ``autocast(..., enabled=False)`` nested inside turns it
off; on exit (an exception included) the state before entry comes back. ``backward()`` runs
with autocast suspended: the gradient ops use the dtypes the forward chose, as in PyTorch. It
is also a decorator::

    @ndl.autocast("cpu")
    def forward(model, x):
        return model(x)

Where this differs from PyTorch: the dtype defaults to bfloat16 on both device types (PyTorch
defaults to float16 on CUDA), there is no cast cache (a parameter read twice is cast twice),
and the lists name needle's ops.
"""

import functools

import needle_c as _c

_DEVICE_TYPES = ("cpu", "cuda")
_NARROW = ("float16", "bfloat16")

# The policy, by needle's op class names (PyTorch's lists: the products gain from the narrow
# type; the ops that need range or accumulate run in float32). SoftmaxCrossEntropy, LayerNorm
# and AttentionSoftmax are in neither: they take narrow inputs as they are (see above).
NARROW_OPS = ("MatMul", "MatMulBias", "Conv")
FLOAT32_OPS = (
    "LogSoftmax",
    "LogSumExp",
    "Summation",
    "Exp",
    "Log",
    "PowerScalar",
    "EWisePow",
    "FusedLSTMCell",
    "FusedLSTM",
)
# Decided, not forgotten: these run in their inputs' dtype, as under PyTorch's autocast.
INPUT_DTYPE_OPS = (
    "GELU",
    "GELUTanh",
    "SiLU",
    "Abs",
    "Erf",
    "Maximum",
    "Minimum",
    "MaximumScalar",
    "MinimumScalar",
    "Clamp",
    "ClampTensor",
    "Where",
)
_c._autocast_set_policy(
    {**dict.fromkeys(NARROW_OPS, "narrow"), **dict.fromkeys(FLOAT32_OPS, "float32")}
)


def _device_type(device):
    """'cpu' or 'cuda' from a device type name or a needle Device."""
    if isinstance(device, str):
        if device in _DEVICE_TYPES:
            return device
        raise ValueError(
            f"autocast device must be 'cpu', 'cuda' or a needle Device, got {device!r}"
        )
    name = getattr(device, "name", None)
    if isinstance(name, str) and hasattr(device, "enabled"):
        return "cuda" if name == "cuda" else "cpu"
    raise TypeError(
        f"autocast device must be 'cpu', 'cuda' or a needle Device, got {type(device).__name__}"
    )


def _narrow_dtype(dtype):
    """The name of the narrow dtype that ``dtype`` spells, in any spelling the Tensor
    constructor takes (the C layer's one dtype parser reads it): checked when the autocast
    is made, so a bad one is refused before any state changes."""
    return _c._autocast_dtype(dtype)


class autocast:  # noqa: N801 - torch.autocast's name
    """``autocast(device, dtype=ndl.bfloat16, enabled=True)``: a context manager and decorator
    that runs the ops listed in the module docstring in ``dtype`` (float16 or bfloat16, in any
    spelling the Tensor constructor takes: ``"half"``, ``numpy.float16``...) on ``device``'s
    type (``"cpu"``, ``"cuda"`` or a needle Device)."""

    def __init__(self, device, dtype="bfloat16", enabled=True):
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast enabled must be a bool, got {type(enabled).__name__}")
        self.device_type = _device_type(device)
        self.fast_dtype = _narrow_dtype(dtype)
        self._enabled = enabled
        self._previous = []  # one entry per active `with` of this object (it may nest)

    def __enter__(self):
        self._previous.append(_c._autocast_set(self.device_type, self._enabled, self.fast_dtype))
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self._previous:
            raise RuntimeError(
                f"{self!r}: autocast.__exit__ without a matching __enter__ (each exit must "
                "close an enter of the same object; use it in a `with` statement)"
            )
        enabled, dtype = self._previous.pop()
        _c._autocast_set(self.device_type, enabled, dtype)
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def run_autocast(*args, **kwargs):
            with autocast(self.device_type, self.fast_dtype, self._enabled):
                return func(*args, **kwargs)

        return run_autocast

    def __repr__(self):
        return f"autocast({self.device_type!r}, dtype={self.fast_dtype!r}, enabled={self._enabled})"


def is_autocast_enabled(device_type="cpu"):
    """Whether autocast is on for device_type ('cpu' or 'cuda') in this thread."""
    return _c._autocast_get(_device_type(device_type))[0]


def get_autocast_dtype(device_type="cpu"):
    """The dtype autocast uses on device_type in this thread (a dtype name)."""
    return _c._autocast_get(_device_type(device_type))[1]
