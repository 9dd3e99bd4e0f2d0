"""The course's switches read at import: ``NEEDLE_BACKEND`` (``np``: a Tensor made from data
without a dtype keeps NumPy's, as the course's NumPy-backed hw1 and hw2 Tensors do) and
``NEEDLE_GRAPH_MODE`` (``needle``: the course's graphs from the start, so hw1's gradient of a
gradient and hw2's live-tensor count behave as in the course). Each case runs in a fresh
interpreter, since both are read once, when needle_c is imported."""

import os
import subprocess
import sys
import textwrap

import pytest


def run(code, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_BACKEND", "NEEDLE_GRAPH_MODE")}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True
    )


def values(code, **env):
    out = run(code, **env)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


DTYPES = """
    import numpy as np, needle as ndl
    print(ndl.BACKEND, ndl.Tensor([1.5]).dtype, ndl.Tensor(2.0).dtype, ndl.Tensor([[1, 2]]).dtype,
          ndl.Tensor(np.arange(3)).dtype, ndl.Tensor(np.float32(1)).dtype,
          ndl.Tensor(np.ones(2, np.float32)).dtype, ndl.Tensor(np.ones(2)).dtype,
          ndl.Tensor([1.5], dtype="float32").dtype, ndl.init.ones(2).dtype,
          ndl.Tensor(ndl.Tensor([1.0], dtype="float32")).dtype)
"""


def test_the_default_backend_makes_float32():
    assert values(DTYPES) == ["nd"] + ["float32"] * 6 + ["float64"] + ["float32"] * 3
    assert (
        values(DTYPES, NEEDLE_BACKEND="nd") == values(DTYPES) == values(DTYPES, NEEDLE_BACKEND=" ")
    )


def test_the_numpy_backend_keeps_numpys_dtypes():
    # Python numbers, lists and integer data get NumPy's float64; float32 data, an explicit
    # dtype, the initializers (float32 by default in the course too) and Tensors keep theirs.
    assert values(DTYPES, NEEDLE_BACKEND="np") == (
        ["np"] + ["float64"] * 4 + ["float32"] * 2 + ["float64"] + ["float32"] * 3
    )


def test_hw1_forward_values_under_the_numpy_backend():
    # hw1 compares with float64 results at rtol 1e-7: float32 cannot meet that (NumPy's own
    # float32 matmul gives 19.420002 for 19.42); the course's NumPy backend computes in float64.
    code = """
        import numpy as np, needle as ndl
        a = [[2.55, 4.35], [4.25, 0.2], [3.95, 3.4]]
        b = [[2.55, 4.4, 2.05], [2.4, 0.6, 4.65]]
        got = ndl.matmul(ndl.Tensor(a), ndl.Tensor(b))
        np.testing.assert_allclose(got.numpy(), np.array(a) @ np.array(b), rtol=1e-15)
        e = ndl.exp(ndl.Tensor([[4.0], [4.55]]))
        np.testing.assert_allclose(e.numpy(), np.exp([[4.0], [4.55]]), rtol=1e-15)
        # A float64 Tensor meeting a float32 parameter computes in float64 (NumPy's promotion).
        w = ndl.init.ones(2, 1, requires_grad=True)
        y = ndl.Tensor([[1.0, 2.0]]) @ w
        y.sum().backward()
        print(got.dtype, e.dtype, y.dtype, w.grad.dtype, w.grad.numpy().ravel().tolist())
    """
    assert values(code, NEEDLE_BACKEND="np") == [
        "float64",
        "float64",
        "float64",
        "float32",
        "[1.0,",
        "2.0]",
    ]


GRAD_OF_GRAD = """
    import needle as ndl
    x2, x3 = ndl.Tensor([6]), ndl.Tensor([0])
    y = x2 * x2 + x2 * x3
    y.backward()
    grad_x2, grad_x3 = x2.grad, x3.grad
    grad_x2.backward()
    print(ndl.autograd.get_graph_mode(), grad_x2.numpy()[0], x2.grad.numpy()[0], x3.grad.numpy()[0])
"""


def test_the_course_graph_mode_from_the_environment():
    # hw1's test_compute_gradient: the gradient of a gradient needs the course's graphs.
    assert values(GRAD_OF_GRAD, NEEDLE_GRAPH_MODE="needle") == ["needle", "12.0", "2.0", "1.0"]
    out = run(GRAD_OF_GRAD)
    assert out.returncode != 0 and "does not require grad" in out.stderr
    code = "import needle as ndl; print(ndl.autograd.get_graph_mode()); "
    code += "print(ndl.autograd.set_graph_mode('cycle_free'), ndl.autograd.get_graph_mode())"
    assert values(code, NEEDLE_GRAPH_MODE="needle") == ["needle", "needle", "cycle_free"]
    assert values(code, NEEDLE_GRAPH_MODE="cycle_free")[0] == "cycle_free"


def test_the_live_tensor_count_in_the_course_graph_mode():
    # hw2's Adam memory check counts live Tensors after training: the course's graphs leave
    # their cycles to the collector; needle's default frees each step's graph at once.
    code = """
        import gc, needle as ndl, numpy as np
        gc.disable()
        np.random.seed(0)
        model = ndl.nn.Sequential(ndl.nn.Linear(8, 8), ndl.nn.ReLU(), ndl.nn.Linear(8, 2))
        opt = ndl.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(5):
            opt.reset_grad()
            logits = model(ndl.Tensor(np.random.randn(4, 8)))
            loss = ndl.nn.SoftmaxLoss()(logits, ndl.Tensor([0, 1, 0, 1]))
            loss.backward()
            opt.step()
        del loss, logits
        before = ndl.autograd.TENSOR_COUNTER
        gc.collect()
        print(before - ndl.autograd.TENSOR_COUNTER)
    """
    leaked_course = int(values(code, NEEDLE_GRAPH_MODE="needle")[0])
    leaked_default = int(values(code)[0])
    assert leaked_course > 50 and leaked_default == 0


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("NEEDLE_BACKEND", "numpy", "expected nd or np"),
        ("NEEDLE_BACKEND", "ND", "expected nd or np"),
        ("NEEDLE_GRAPH_MODE", "course", "expected cycle_free or needle"),
    ],
)
def test_a_bad_value_fails_the_import(name, value, expected):
    out = run("import needle", **{name: value})
    assert out.returncode != 0
    assert f"ValueError: {name}={value!r}: {expected}" in out.stderr
