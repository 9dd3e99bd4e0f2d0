"""The convolution module (the course's hw4 ``nn.Conv``): NCHW in and out, with the
course's parameter shapes, initializers and NumPy-RNG draw order (weight, then bias)."""

from needle import init, ops
from needle._checks import check_count
from needle.autograd import Tensor

from .nn_basic import Module, Parameter


class Conv(Module):
    """2-D convolution with square kernels and "same" padding ``(k - 1) // 2``.

    Parameters, in creation (RNG) order:
    - ``weight`` (k, k, in_channels, out_channels): kaiming_uniform with
      fan_in = in_channels * k * k, fan_out = out_channels * k * k;
    - ``bias`` (out_channels,): uniform in +-1/sqrt(in_channels * k * k), or None.

    Input (N, in_channels, H, W); output (N, out_channels, H', W') with
    H' = (H + 2 * padding - k) // stride + 1 (same for W').
    """

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        bias=True,
        device=None,
        dtype="float32",
    ):
        super().__init__()
        if isinstance(kernel_size, tuple):
            kernel_size = kernel_size[0]
        if isinstance(stride, tuple):
            stride = stride[0]
        for name, value in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("kernel_size", kernel_size),
            ("stride", stride),
        ):
            check_count(f"Conv {name}", value)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = (kernel_size - 1) // 2
        k = kernel_size
        self.weight = Parameter(
            init.kaiming_uniform(
                in_channels * k * k,
                out_channels * k * k,
                shape=(k, k, in_channels, out_channels),
                device=device,
                dtype=dtype,
            )
        )
        if bias:
            bound = 1.0 / (in_channels * k * k) ** 0.5
            self.bias = Parameter(
                init.rand(out_channels, low=-bound, high=bound, device=device, dtype=dtype)
            )
        else:
            self.bias = None

    def forward(self, x):
        """x (N, C_in, H, W) -> (N, C_out, H', W')."""
        if not isinstance(x, Tensor):
            raise TypeError(f"Conv: expected a Tensor, got {type(x).__name__}")
        if len(x.shape) != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"Conv: expected NCHW input with {self.in_channels} channels, got shape {x.shape}"
            )
        # NCHW -> NHWC
        x = x.transpose((1, 2)).transpose((2, 3))
        out = ops.conv(x, self.weight, stride=self.stride, padding=self.padding)
        if self.bias is not None:
            out = out + self.bias.reshape((1, 1, 1, self.out_channels)).broadcast_to(out.shape)
        # NHWC -> NCHW
        return out.transpose((2, 3)).transpose((1, 2))
