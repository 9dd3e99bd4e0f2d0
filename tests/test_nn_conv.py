"""Tests for ``needle.nn.Conv`` (nn_conv.py): the course's parameter draws, forward values
against a NumPy reference, gradients by central finite differences, agreement with
PyTorch, and the errors raised on bad input shapes."""

import math

import numpy as np
import pytest

from needle import nn

from devices import DEVICES
from nn_check import _assert_next_draw, _assert_params, _t, _uniform_draw, check_module

# --------------------------------------------------------------------------- Conv


def _conv_ref(x, w, b, stride, padding):
    """x (N, C, H, W), w (k, k, C, O), b (O,) or None -> (N, O, H', W')."""
    k = w.shape[0]
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, _, h, wd = x.shape
    oh, ow = (h - k) // stride + 1, (wd - k) // stride + 1
    out = np.zeros((n, w.shape[3], oh, ow))
    for i in range(k):
        for j in range(k):
            patch = x[
                :, :, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride
            ]
            out += np.einsum("nchw,co->nohw", patch, w[i, j])
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


def test_conv_init_draws():
    np.random.seed(21)
    conv = nn.Conv(3, 4, 3, stride=2)
    after = np.random.rand()
    np.random.seed(21)
    bw = math.sqrt(2) * math.sqrt(3 / (3 * 9))
    bb = 1 / math.sqrt(3 * 9)
    _assert_params(
        conv.parameters(), [_uniform_draw((3, 3, 3, 4), -bw, bw), _uniform_draw((4,), -bb, bb)]
    )
    _assert_next_draw(after)
    assert conv.padding == 1 and conv.stride == 2
    nobias = nn.Conv(3, 4, 5, bias=False)
    assert nobias.bias is None and len(nobias.parameters()) == 1 and nobias.padding == 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "k, stride, bias, hw",
    [
        (3, 1, True, (5, 6)),
        (3, 2, True, (7, 7)),
        (1, 1, False, (4, 4)),
        (5, 2, True, (8, 9)),
        (4, 1, True, (6, 6)),
    ],
)
def test_conv_forward(device, k, stride, bias, hw):
    np.random.seed(22)
    conv = nn.Conv(3, 4, k, stride=stride, bias=bias, device=device)
    x = np.random.randn(2, 3, *hw)
    pad = (k - 1) // 2

    def ref(x, w, b=None):
        return _conv_ref(x, w, b, stride, pad)

    check_module(conv, [x], ref, device, grads=False, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_gradient(device, stride):
    np.random.seed(23)
    conv = nn.Conv(2, 3, 3, stride=stride, device=device)
    x = np.random.randn(2, 2, 5, 5)

    def ref(x, w, b):
        return _conv_ref(x, w, b, stride, 1)

    check_module(conv, [x], ref, device, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_matches_torch(device):
    torch = pytest.importorskip("torch")
    np.random.seed(24)
    conv = nn.Conv(3, 5, 3, stride=2, device=device)
    x = np.random.randn(2, 3, 9, 8).astype(np.float32)
    out = conv(_t(x, device)).numpy()
    w = torch.tensor(conv.weight.numpy()).permute(3, 2, 0, 1)
    expected = torch.nn.functional.conv2d(
        torch.tensor(x), w, torch.tensor(conv.bias.numpy()), stride=2, padding=1
    ).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_bad_input(device):
    conv = nn.Conv(3, 4, 3, device=device)
    with pytest.raises(ValueError, match="3 channels"):
        conv(_t(np.zeros((2, 4, 5, 5)), device))
    with pytest.raises(ValueError):
        conv(_t(np.zeros((3, 5, 5)), device))
    with pytest.raises(TypeError):
        conv(np.zeros((2, 3, 5, 5), dtype=np.float32))
