"""The ops that the fused ops' recorded gradients are ("needle" mode, create_graph):
LayerNormGrad(eps, part)(x, w, g) and AttentionSoftmaxGrad(divisor)(y, g)
(needle_c/autograd/ops_fused.c).

- Values against float64 NumPy, their own gradients (the fused ops' second derivatives)
  against finite differences, in both graph modes, on every device.
- What a recorded backward keeps: one array of the input's shape per LayerNorm and per
  attention softmax (the composition of primitive ops it replaced kept 13 and 5), the
  nodes' ops and inputs, and the same values as the cycle-free backward.
- Third derivatives stay available (the ops' gradients are composed of differentiable ops).
- Bad inputs raise and leave the ops working.
"""

import numpy as np
import pytest
from test_fused_ops import attn_grad_ref, attn_ref, ln_grad_x_ref, tensor

import needle as ndl
import needle_c
from needle.autograd import graph_mode

from devices import dev
from gradcheck import check_op, numerical_gradient

MODES = ndl.autograd.GRAPH_MODES


def ln_grad_w_ref(x, g, eps=1e-5):
    """The column sums of g * xhat: d/dw of sum(g * layer_norm(x, w, b)), in float64."""
    m = x.mean(axis=-1, keepdims=True)
    xhat = (x - m) / np.sqrt(((x - m) ** 2).mean(axis=-1, keepdims=True) + eps)
    return (g * xhat).reshape(-1, x.shape[-1]).sum(axis=0)


LN_GRAD_SHAPES = {"rows": (5, 6), "1-d": (7,), "3-d": (2, 3, 4), "one-feature": (3, 1)}


@dev
@pytest.mark.parametrize("shape", LN_GRAD_SHAPES.values(), ids=list(LN_GRAD_SHAPES))
def test_layer_norm_grad_dx_and_its_gradient(device, shape):
    rng = np.random.default_rng(21)
    x, g = rng.normal(size=shape) * 1.5 + 0.3, rng.normal(size=shape)
    w = rng.normal(size=shape[-1:])
    check_op(
        lambda x, w, g: needle_c.LayerNormGrad(1e-5, 0.0)(x, w, g),
        x,
        w,
        g,
        device=device,
        reference=ln_grad_x_ref,
        rtol=1e-4,
        atol=1e-5,
        eps=1e-3,
        grad_rtol=2e-3,
        grad_atol=2e-3,
    )


@dev
@pytest.mark.parametrize("shape", LN_GRAD_SHAPES.values(), ids=list(LN_GRAD_SHAPES))
def test_layer_norm_grad_dw_and_its_gradient(device, shape):
    rng = np.random.default_rng(22)
    x, g = rng.normal(size=shape) * 1.5 + 0.3, rng.normal(size=shape)
    w = rng.normal(size=shape[-1:])
    results = check_op(
        lambda x, w, g: needle_c.LayerNormGrad(1e-5, 1.0)(x, w, g),
        x,
        w,
        g,
        device=device,
        reference=lambda x, w, g: ln_grad_w_ref(x, g),
        rtol=1e-4,
        atol=1e-5,
        grad_rtol=2e-3,
        grad_atol=2e-3,
    )
    for _, grads in results.values():  # dw does not depend on w
        np.testing.assert_array_equal(grads[1], np.zeros(shape[-1:]))


@dev
@pytest.mark.parametrize("shape,divisor", [((4, 6), 1.0), ((2, 3, 5), 2.5), ((9,), 0.5)])
def test_attention_softmax_grad_and_its_gradient(device, shape, divisor):
    rng = np.random.default_rng(23)
    # y is any array: the op is y * (g - sum(g * y)) / divisor, a softmax's output or not
    y, g = rng.uniform(0.05, 1.0, size=shape), rng.normal(size=shape)
    check_op(
        lambda y, g: needle_c.AttentionSoftmaxGrad(divisor)(y, g),
        y,
        g,
        device=device,
        reference=lambda y, g: attn_grad_ref(y, g, divisor),
        rtol=1e-5,
        atol=1e-6,
    )


def _held_by_backward(out, out_grad, device):
    before = ndl.memory.memory_allocated(device)
    out.backward(out_grad)
    return ndl.memory.memory_allocated(device) - before


@dev
@pytest.mark.parametrize("mode", MODES)
def test_a_recorded_layer_norm_backward_keeps_one_array_of_x(device, mode):
    rows, cols = 256, 128  # 128 KiB an array of x's shape
    rng = np.random.default_rng(24)
    x0, g0 = rng.normal(size=(rows, cols)), rng.normal(size=(rows, cols))
    w0, b0 = rng.normal(size=(1, cols)), rng.normal(size=(cols,))
    with graph_mode(mode):
        x, w, b = tensor(x0, device), tensor(w0, device), tensor(b0, device)
        out, g = ndl.ops.layer_norm(x, w, b), tensor(g0, device, False)
        held = _held_by_backward(out, g, device)
        # dx, and dw and db (cols each) in both modes; the composition of primitive ops
        # that the recorded backward was before kept 13 arrays of x's shape
        array = rows * cols * 4
        assert array + 2 * cols * 4 <= held < array + 16 * 1024
        np.testing.assert_allclose(x.grad.numpy(), ln_grad_x_ref(x0, w0, g0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(
            w.grad.numpy(), ln_grad_w_ref(x0, g0).reshape(1, cols), rtol=1e-4, atol=1e-4
        )
        np.testing.assert_allclose(b.grad.numpy(), g0.sum(axis=0), rtol=1e-4, atol=1e-4)
        if mode == "needle":
            assert type(x.grad.op).__name__ == "LayerNormGrad"
            assert x.grad.inputs[0] is x and x.grad.inputs[1] is w and x.grad.inputs[2] is g
            assert type(w.grad.op).__name__ == "Reshape"
            assert type(w.grad.inputs[0].op).__name__ == "LayerNormGrad"
            assert b.grad.op is None  # the column sums of a constant out_grad: no node
        else:
            assert x.grad.op is None and w.grad.op is None


@dev
@pytest.mark.parametrize("mode", MODES)
def test_a_recorded_attention_softmax_backward_keeps_one_array(device, mode):
    shape = (4, 8, 20, 20)  # 50 KiB an array
    rng = np.random.default_rng(25)
    x0, g0 = rng.normal(size=shape), rng.normal(size=shape)
    with graph_mode(mode):
        x, g = tensor(x0, device), tensor(g0, device, False)
        y = ndl.ops.attention_softmax(x, 4.0, causal=True)
        held = _held_by_backward(y, g, device)
        array = int(np.prod(shape)) * 4
        assert array <= held < array + 4 * 1024  # the composition kept 5 arrays
        want = attn_grad_ref(attn_ref(x0, 4.0, True), g0, 4.0)
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-4, atol=1e-6)
        if mode == "needle":
            assert type(x.grad.op).__name__ == "AttentionSoftmaxGrad"
            assert x.grad.inputs[0] is y and x.grad.inputs[1] is g


@dev
def test_layer_norm_third_derivative(device):
    # the gradient of LayerNormGrad's gradient: d/dx of sum(u * d/dx sum(v * dx)), recorded
    rng = np.random.default_rng(26)
    x0, w0, g0 = rng.normal(size=(3, 5)), rng.normal(size=5), rng.normal(size=(3, 5))
    v0, u0 = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    with graph_mode("needle"):
        x, w = tensor(x0, device), tensor(w0, device)
        dx = needle_c.LayerNormGrad(1e-5, 0.0)(x, w, tensor(g0, device, False))
        (dx * tensor(v0, device, False)).sum().backward()
        second = x.grad
        x.grad = None
        (second * tensor(u0, device, False)).sum().backward()

    def second_ref(x):
        return numerical_gradient(
            lambda x: float(np.sum(v0 * ln_grad_x_ref(x, w0, g0))), [x], 0, 1e-5
        )

    fd = numerical_gradient(lambda x: float(np.sum(u0 * second_ref(x))), [x0], 0, 1e-4)
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=2e-2, atol=2e-2)


@dev
def test_bad_inputs_raise_and_leave_them_working(device):
    x = tensor(np.ones((2, 3)), device)
    w = tensor(np.ones(3), device)
    # the whole message, value included: PyErr_Format has no %g (3.11 printed "%g" itself,
    # 3.12 on raise SystemError instead of this ValueError)
    with pytest.raises(
        ValueError, match=r"^LayerNormGrad's part is 0 \(dx\) or 1 \(dw\), got 2\.5$"
    ):
        needle_c.LayerNormGrad(1e-5, 2.5)(x, w, x).numpy()
    with pytest.raises(ValueError, match="out_grad"):
        needle_c.LayerNormGrad(1e-5, 0.0)(x, w, tensor(np.ones((3, 2)), device)).numpy()
    with pytest.raises(ValueError, match="weight"):
        needle_c.LayerNormGrad(1e-5, 1.0)(x, tensor(np.ones(2), device), x).numpy()
    with pytest.raises(ValueError, match="eps"):
        needle_c.LayerNormGrad(-1.0, 0.0)(x, w, x).numpy()
    with pytest.raises(TypeError):
        needle_c.LayerNormGrad(1e-5, 0.0)(x, w)
    with pytest.raises(ValueError, match="divisor"):
        needle_c.AttentionSoftmaxGrad(0.0)(x, x).numpy()
    with pytest.raises(ValueError, match="out_grad"):
        needle_c.AttentionSoftmaxGrad(1.0)(x, tensor(np.ones((3, 2)), device)).numpy()
    with pytest.raises(TypeError):
        needle_c.AttentionSoftmaxGrad(1.0)(x)
    # a constant row normalises to zeros, so its dx is zero; dw is the column sums of g * 0
    np.testing.assert_allclose(needle_c.LayerNormGrad(1e-5, 0.0)(x, w, x).numpy(), np.zeros((2, 3)))
    np.testing.assert_allclose(needle_c.LayerNormGrad(1e-5, 1.0)(x, w, x).numpy(), np.zeros(3))
