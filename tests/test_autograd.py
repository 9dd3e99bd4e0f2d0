"""The Tensor type, the autograd engine, graph modes, no_grad, and bad input."""

import subprocess
import sys
import weakref

import numpy as np
import pytest

import needle as ndl
from needle import backend_ndarray as nd

from devices import DEVICES
from gradcheck import MODES

dev = pytest.mark.parametrize("device", DEVICES)
mode_param = pytest.mark.parametrize("mode", MODES)


def arr(seed, shape):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape).astype(np.float32)


# --------------------------------------------------------------------------
# the Tensor type
# --------------------------------------------------------------------------


def test_class_hierarchy():
    assert issubclass(ndl.Tensor, ndl.autograd.Value)
    assert issubclass(ndl.TensorTuple, ndl.autograd.Value)
    assert ndl.autograd.Tensor is ndl.Tensor
    assert ndl.autograd.TensorTuple is ndl.TensorTuple
    assert issubclass(ndl.autograd.TensorOp, ndl.autograd.Op)
    assert issubclass(ndl.autograd.TensorTupleOp, ndl.autograd.Op)


def test_tensor_from_numpy_defaults():
    x = arr(0, (2, 3))
    t = ndl.Tensor(x)
    assert t.device == ndl.cpu()
    assert t.dtype == "float32"
    assert t.shape == (2, 3)
    assert isinstance(t.shape, tuple)
    assert t.requires_grad is True
    assert t.op is None
    assert t.inputs == [] and isinstance(t.inputs, list)
    assert t.grad is None
    assert t.num_outputs == 1
    assert t.is_leaf()
    v = t.numpy()
    assert isinstance(v, np.ndarray) and v.dtype == np.float32
    np.testing.assert_array_equal(v, x)
    assert isinstance(t.cached_data, nd.NDArray)
    assert t.realize_cached_data() is t.cached_data


@dev
def test_tensor_from_list_ndarray_tensor(device):
    t = ndl.Tensor([[1, 2], [3, 4]], device=device)
    np.testing.assert_array_equal(t.numpy(), [[1, 2], [3, 4]])
    assert t.dtype == "float32" and t.device == device
    a = nd.array(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    t2 = ndl.Tensor(a, device=device)
    np.testing.assert_array_equal(t2.numpy(), np.arange(6).reshape(2, 3))
    t3 = ndl.Tensor(t2, device=device)
    assert t3.cached_data is t2.cached_data
    t4 = ndl.Tensor(t2)
    assert t4.cached_data is t2.cached_data
    t5 = ndl.Tensor(np.ones(3), device=device, dtype="float32", requires_grad=False)
    assert t5.requires_grad is False


def test_tensor_dtypes_needle_lacks_rejected():
    with pytest.raises(TypeError, match="float32, float16, bfloat16 or float64"):
        ndl.Tensor(np.ones(3), dtype="int32")
    with pytest.raises(TypeError, match="is not a dtype"):
        ndl.Tensor([1.0, 2.0], dtype="float8")
    t = ndl.Tensor([1.0, 1.0, 1.0])  # Python numbers without a dtype: float32
    assert t.dtype == "float32"
    assert ndl.Tensor(np.ones(3)).dtype == "float64"  # NumPy float64 data keeps its dtype
    assert ndl.Tensor(np.ones(3), dtype="float32").dtype == "float32"
    np.testing.assert_array_equal((t + 1).numpy(), [2, 2, 2])


def test_tensor_to_other_device():
    t = ndl.Tensor(arr(0, (3,)), device=ndl.cpu())
    u = ndl.Tensor(t, device=ndl.cpu_numpy())
    assert u.device == ndl.cpu_numpy()
    np.testing.assert_array_equal(u.numpy(), t.numpy())


def test_tensor_data_getter_and_setter():
    t = ndl.Tensor(arr(0, (2, 2)))
    d1, d2 = t.data, t.data
    assert d1 is not d2
    assert d1 is not t
    assert d1.op is None and d1.requires_grad is False
    np.testing.assert_array_equal(d1.numpy(), t.numpy())
    y = t * 2.0
    before = id(t)
    t.data = ndl.Tensor(np.full((2, 2), 7.0, dtype=np.float32))
    assert id(t) == before
    np.testing.assert_array_equal(t.numpy(), np.full((2, 2), 7.0))
    assert t.requires_grad is True and t.op is None
    # the node keeps its identity: graphs built later see the new value
    z = (t * 3.0).sum()
    np.testing.assert_allclose(z.numpy(), [84.0])
    z.backward()
    np.testing.assert_array_equal(t.grad.numpy(), np.full((2, 2), 3.0))
    # a result computed earlier is not changed
    np.testing.assert_allclose(y.numpy(), arr(0, (2, 2)) * 2.0)


def test_tensor_detach():
    t = ndl.Tensor(arr(0, (3,)))
    y = ndl.exp(t)
    d = y.detach()
    assert d.op is None and d.requires_grad is False and d.inputs == []
    np.testing.assert_array_equal(d.numpy(), y.numpy())
    assert (d * t).requires_grad is True


def test_tensor_make_from_op_and_make_const():
    a = ndl.Tensor(arr(0, (2, 3)))
    b = ndl.Tensor(arr(1, (2, 3)))
    c = ndl.Tensor.make_from_op(ndl.ops.EWiseAdd(), [a, b])
    assert isinstance(c, ndl.Tensor)
    assert type(c.op) is ndl.ops.EWiseAdd
    assert c.inputs[0] is a and c.inputs[1] is b
    np.testing.assert_allclose(c.numpy(), arr(0, (2, 3)) + arr(1, (2, 3)), rtol=1e-6)
    k = ndl.Tensor.make_const(nd.array(arr(2, (2,))))
    assert k.op is None and k.requires_grad is False and k.is_leaf()
    np.testing.assert_array_equal(k.numpy(), arr(2, (2,)))
    k2 = ndl.Tensor.make_const(nd.array(arr(2, (2,))), requires_grad=True)
    assert k2.requires_grad is True


def test_tensor_requires_grad_propagation():
    a = ndl.Tensor(arr(0, (3,)), requires_grad=False)
    b = ndl.Tensor(arr(1, (3,)), requires_grad=False)
    c = ndl.Tensor(arr(2, (3,)), requires_grad=True)
    assert (a + b).requires_grad is False
    assert (a + c).requires_grad is True
    assert ndl.exp(a).requires_grad is False
    assert not (a + c).is_leaf()


def test_tensor_subclass_dict_weakref_hash():
    class P(ndl.Tensor):
        pass

    p = P(np.ones(3, dtype=np.float32))
    assert isinstance(p, ndl.Tensor)
    p.tag = "param"
    assert p.tag == "param"
    r = weakref.ref(p)
    assert r() is p
    q = ndl.Tensor(np.ones(3, dtype=np.float32))
    q.extra = 5
    assert weakref.ref(q)() is q
    y = p * 2.0
    assert isinstance(y, ndl.Tensor)
    np.testing.assert_array_equal(y.numpy(), [2, 2, 2])
    # hash by identity, no __eq__ override
    q2 = ndl.Tensor(np.ones(3, dtype=np.float32))
    d = {q: 1, q2: 2}
    assert d[q] == 1 and d[q2] == 2
    assert (q == q2) is False
    assert (q == q) is True
    assert len({q, q2, q}) == 2


def test_tensor_instance_dict():
    class P(ndl.Tensor):
        pass

    p = P(np.ones(3, dtype=np.float32))
    p.tag = "param"
    assert p.__dict__ == {"tag": "param"}
    q = ndl.Tensor(np.ones(3, dtype=np.float32))
    q.extra = 5
    assert q.extra == 5
    del q.extra
    assert not hasattr(q, "extra")


def test_tensor_repr_and_str_do_not_fail():
    t = ndl.Tensor([1.0, 2.0])
    assert isinstance(repr(t), str) and isinstance(str(t), str)


def test_tensor_methods():
    x = arr(0, (2, 3, 4))
    t = ndl.Tensor(x)
    np.testing.assert_allclose(t.sum().numpy(), [x.sum()], rtol=1e-5)
    np.testing.assert_allclose(t.sum((0, 2)).numpy(), x.sum(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(t.sum(1).numpy(), x.sum(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(t.reshape((6, 4)).numpy(), x.reshape(6, 4))
    np.testing.assert_array_equal(t.transpose().numpy(), np.swapaxes(x, 1, 2))
    np.testing.assert_array_equal(t.transpose((0, 1)).numpy(), np.swapaxes(x, 0, 1))
    np.testing.assert_array_equal(
        ndl.Tensor(x[:, :1]).broadcast_to((2, 5, 4)).numpy(), np.broadcast_to(x[:, :1], (2, 5, 4))
    )
    m = ndl.Tensor(arr(1, (4, 2)))
    np.testing.assert_allclose(t.matmul(m).numpy(), x @ arr(1, (4, 2)), rtol=1e-5, atol=1e-6)


def test_tensor_operators_values():
    x = np.array([0.5, 1.0, 2.0], dtype=np.float32)
    y = np.array([2.0, -1.0, 0.5], dtype=np.float32)
    a, b = ndl.Tensor(x), ndl.Tensor(y)
    cases = [
        (a + b, x + y),
        (a - b, x - y),
        (a * b, x * y),
        (a / b, x / y),
        (a**b, x**y),
        (-a, -x),
        (a + 1, x + 1),
        (1 + a, 1 + x),
        (a - 1, x - 1),
        (1 - a, 1 - x),
        (3 * a, 3 * x),
        (a * 3, 3 * x),
        (a / 2, x / 2),
        (2 / a, 2 / x),
        (a**2, x**2),
        (2**a, 2**x),
    ]
    for i, (t, expected) in enumerate(cases):
        assert isinstance(t, ndl.Tensor), i
        np.testing.assert_allclose(t.numpy(), expected, rtol=1e-6, err_msg=f"case {i}")
    m1 = ndl.Tensor(arr(0, (2, 3)))
    m2 = ndl.Tensor(arr(1, (3, 2)))
    np.testing.assert_allclose((m1 @ m2).numpy(), arr(0, (2, 3)) @ arr(1, (3, 2)), rtol=1e-5)


# --------------------------------------------------------------------------
# TensorTuple
# --------------------------------------------------------------------------


def test_tensortuple():
    a = ndl.Tensor(arr(0, (2,)))
    b = ndl.Tensor(arr(1, (3,)))
    tt = ndl.make_tuple(a, b)
    assert isinstance(tt, ndl.TensorTuple)
    assert len(tt) == 2
    np.testing.assert_array_equal(tt[0].numpy(), a.numpy())
    np.testing.assert_array_equal(tt[1].numpy(), b.numpy())
    tup = tt.tuple()
    assert isinstance(tup, tuple) and len(tup) == 2
    assert all(isinstance(x, ndl.Tensor) for x in tup)
    np.testing.assert_array_equal(tup[1].numpy(), b.numpy())
    s = tt + ndl.make_tuple(a, b)
    assert isinstance(s, ndl.TensorTuple) and len(s) == 2
    np.testing.assert_allclose(s[0].numpy(), 2 * a.numpy())
    np.testing.assert_allclose(s[1].numpy(), 2 * b.numpy())
    d = tt.detach()
    assert isinstance(d, ndl.TensorTuple)
    assert d.op is None and d.requires_grad is False
    assert len(d) == 2
    np.testing.assert_array_equal(d[1].numpy(), b.numpy())
    assert tt.requires_grad is True


@mode_param
def test_tensortuple_compute_gradient_of_variables(mode):
    with ndl.autograd.graph_mode(mode):
        a = ndl.Tensor(arr(0, (2,)))
        b = ndl.Tensor(arr(1, (3,)))
        tt = ndl.make_tuple(a * 2.0, b * 3.0)
        og = ndl.make_tuple(
            ndl.Tensor(np.ones(2, dtype=np.float32), requires_grad=False),
            ndl.Tensor(np.full(3, 2.0, dtype=np.float32), requires_grad=False),
        )
        ndl.autograd.compute_gradient_of_variables(tt, og)
        np.testing.assert_allclose(a.grad.numpy(), [2, 2])
        np.testing.assert_allclose(b.grad.numpy(), [6, 6, 6])


@mode_param
def test_tensortuple_backward_with_out_grad(mode):
    with ndl.autograd.graph_mode(mode):
        a = ndl.Tensor(arr(0, (2,)))
        b = ndl.Tensor(arr(1, (3,)))
        tt = ndl.make_tuple(a * 2.0, b * 3.0)
        og = ndl.make_tuple(
            ndl.Tensor(np.ones(2, dtype=np.float32), requires_grad=False),
            ndl.Tensor(np.full(3, 2.0, dtype=np.float32), requires_grad=False),
        )
        tt.backward(og)
        np.testing.assert_allclose(a.grad.numpy(), [2, 2])
        np.testing.assert_allclose(b.grad.numpy(), [6, 6, 6])


# --------------------------------------------------------------------------
# topological sort and gradient computation
# --------------------------------------------------------------------------


def _same_nodes(got, expected):
    assert len(got) == len(expected), (len(got), len(expected))
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g is e, f"position {i} differs"


def test_find_topo_sort_small():
    a = ndl.Tensor(arr(0, (3,)))
    b = ndl.Tensor(arr(1, (3,)))
    c = a + b
    d = c * a
    order = ndl.autograd.find_topo_sort([d])
    assert isinstance(order, list)
    _same_nodes(order, [a, b, c, d])


def test_find_topo_sort_larger():
    a = ndl.Tensor(arr(0, (2, 2)))
    b = ndl.Tensor(arr(1, (2, 2)))
    c = ndl.Tensor(arr(2, (2, 2)))
    d = a * b
    e = d + c
    f = ndl.exp(e)
    g = f * d
    h = g / a
    k = c * b
    _same_nodes(ndl.autograd.find_topo_sort([h]), [a, b, d, c, e, f, g, h])
    _same_nodes(ndl.autograd.find_topo_sort([h, k]), [a, b, d, c, e, f, g, h, k])
    _same_nodes(ndl.autograd.find_topo_sort([k, h]), [c, b, k, a, d, e, f, g, h])
    _same_nodes(ndl.autograd.find_topo_sort([e]), [a, b, d, c, e])
    _same_nodes(ndl.autograd.find_topo_sort([a]), [a])


def test_find_topo_sort_scalar_and_matmul_graph():
    # the course's hw1 example shape: scalar ops take one input
    x1 = ndl.Tensor(arr(0, (2, 3)))
    x2 = ndl.Tensor(arr(1, (3, 2)))
    p = x1 @ x2  # inputs [x1, x2]
    q = p + 1.0  # inputs [p]
    r = ndl.transpose(x2)  # inputs [x2]
    s = q @ r  # (2,3): inputs [q, r]
    s2 = s * 2.0
    t = ndl.summation(s2)
    _same_nodes(ndl.autograd.find_topo_sort([t]), [x1, x2, p, q, r, s, s2, t])


@mode_param
def test_compute_gradient_of_variables(mode):
    with ndl.autograd.graph_mode(mode):
        x = ndl.Tensor(arr(0, (3,)))
        y = x * x
        ndl.autograd.compute_gradient_of_variables(
            y, ndl.Tensor(np.array([1.0, 2.0, 3.0], dtype=np.float32), requires_grad=False)
        )
        np.testing.assert_allclose(x.grad.numpy(), 2 * arr(0, (3,)) * [1, 2, 3], rtol=1e-6)


@mode_param
def test_backward_with_out_grad(mode):
    with ndl.autograd.graph_mode(mode):
        x = ndl.Tensor(arr(0, (2, 3)))
        y = ndl.exp(x)
        og = np.arange(6, dtype=np.float32).reshape(2, 3)
        y.backward(ndl.Tensor(og, requires_grad=False))
        np.testing.assert_allclose(x.grad.numpy(), og * np.exp(arr(0, (2, 3))), rtol=1e-6)


@mode_param
def test_gradient_accumulates_over_uses(mode):
    with ndl.autograd.graph_mode(mode):
        x = ndl.Tensor(np.array([1.0, -2.0, 3.0], dtype=np.float32))
        y = (x * x + x * 3.0 + x).sum()
        y.backward()
        np.testing.assert_allclose(x.grad.numpy(), 2 * np.array([1, -2, 3]) + 4, rtol=1e-6)


def test_backward_twice_accumulates_in_cycle_free():
    """PyTorch's AccumulateGrad: a second backward adds into the leaf's .grad (also when
    another tensor holds the first .grad, which then keeps its value)."""
    with ndl.autograd.graph_mode("cycle_free"):
        x = ndl.Tensor(np.array([1.0, 2.0], dtype=np.float32))
        y = (x * x).sum()
        y.backward()
        np.testing.assert_allclose(x.grad.numpy(), [2, 4])
        first = x.grad
        y.backward()
        np.testing.assert_allclose(x.grad.numpy(), [4, 8])
        np.testing.assert_allclose(first.numpy(), [2, 4])
        (x * 5.0).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), [9, 13])
        x.grad = None
        (x * 5.0).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), [5, 5])
        x.grad = ndl.Tensor(np.zeros(3, np.float32), requires_grad=False)
        with pytest.raises(ValueError, match="another shape"):
            (x * 5.0).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), np.zeros(3))


def test_backward_twice_replaces_in_needle_mode():
    """The course's compute_gradient_of_variables sets node.grad = adjoint."""
    with ndl.autograd.graph_mode("needle"):
        x = ndl.Tensor(np.array([1.0, 2.0], dtype=np.float32))
        y = (x * x).sum()
        y.backward()
        np.testing.assert_allclose(x.grad.numpy(), [2, 4])
        y.backward()
        np.testing.assert_allclose(x.grad.numpy(), [2, 4])
        z = (x * 5.0).sum()
        z.backward()
        np.testing.assert_allclose(x.grad.numpy(), [5, 5])


@mode_param
def test_gradient_of_deep_diamond(mode):
    with ndl.autograd.graph_mode(mode):
        x = ndl.Tensor(np.array([0.3], dtype=np.float32))
        y = x
        for _ in range(10):
            y = y * 0.5 + y * 0.5  # value and derivative unchanged, 2**10 paths
        y.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), [1.0], rtol=1e-6)


# --------------------------------------------------------------------------
# graph modes
# --------------------------------------------------------------------------


def test_default_graph_mode_in_fresh_process():
    out = subprocess.run(
        [sys.executable, "-c", "import needle as ndl; print(ndl.autograd.get_graph_mode())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cycle_free"


def test_graph_mode_set_get_and_context():
    start = ndl.autograd.get_graph_mode()
    assert start == "cycle_free"
    try:
        ndl.autograd.set_graph_mode("needle")
        assert ndl.autograd.get_graph_mode() == "needle"
        with ndl.autograd.graph_mode("cycle_free"):
            assert ndl.autograd.get_graph_mode() == "cycle_free"
            with ndl.autograd.graph_mode("needle"):
                assert ndl.autograd.get_graph_mode() == "needle"
            assert ndl.autograd.get_graph_mode() == "cycle_free"
        assert ndl.autograd.get_graph_mode() == "needle"
        ndl.autograd.set_graph_mode("cycle_free")
        assert ndl.autograd.get_graph_mode() == "cycle_free"
    finally:
        ndl.autograd.set_graph_mode(start)


def test_graph_mode_restored_after_exception():
    assert ndl.autograd.get_graph_mode() == "cycle_free"
    with pytest.raises(RuntimeError):
        with ndl.autograd.graph_mode("needle"):
            raise RuntimeError("boom")
    assert ndl.autograd.get_graph_mode() == "cycle_free"


def test_graph_mode_unknown_name():
    with pytest.raises(ValueError, match=r"unknown graph mode 'bogus' \(expected one of"):
        ndl.autograd.set_graph_mode("bogus")
    assert ndl.autograd.get_graph_mode() == "cycle_free"
    with pytest.raises(ValueError):
        with ndl.autograd.graph_mode("cyclefree"):
            pass
    assert ndl.autograd.get_graph_mode() == "cycle_free"


@pytest.mark.parametrize("bad", [None, 1, True, b"needle", ["needle"]])
def test_graph_mode_not_a_str(bad):
    with pytest.raises(TypeError, match="graph mode must be a str"):
        ndl.autograd.set_graph_mode(bad)
    with pytest.raises(TypeError, match="graph mode must be a str"):
        with ndl.autograd.graph_mode(bad):
            pass
    assert ndl.autograd.get_graph_mode() == "cycle_free"


def test_graph_modes_come_from_the_extension():
    import needle_c

    assert ndl.autograd.GRAPH_MODES is needle_c.GRAPH_MODES
    assert ndl.autograd.GRAPH_MODES == ("cycle_free", "needle")
    for name in ndl.autograd.GRAPH_MODES:
        with ndl.autograd.graph_mode(name):
            assert ndl.autograd.get_graph_mode() == name


@dev
def test_needle_mode_sets_grad_on_every_node(device):
    with ndl.autograd.graph_mode("needle"):
        x = ndl.Tensor(arr(0, (2, 3)), device=device)
        w = ndl.Tensor(arr(1, (3, 2)), device=device)
        h = x @ w
        r = ndl.relu(h)
        e = ndl.exp(r)
        loss = e.sum()
        loss.backward()
        for name, node in [("x", x), ("w", w), ("h", h), ("r", r), ("e", e), ("loss", loss)]:
            assert node.grad is not None, name
            assert node.grad.shape == node.shape, name
        np.testing.assert_allclose(e.grad.numpy(), np.ones((2, 2)))
        np.testing.assert_allclose(loss.grad.numpy(), [1.0])
        np.testing.assert_allclose(r.grad.numpy(), e.numpy(), rtol=1e-6)


@dev
def test_needle_mode_grad_is_a_recorded_graph(device):
    with ndl.autograd.graph_mode("needle"):
        x = ndl.Tensor(arr(0, (4,)), device=device)
        ndl.exp(x).sum().backward()
        assert x.grad.op is not None
        np.testing.assert_allclose(x.grad.numpy(), np.exp(arr(0, (4,))), rtol=1e-6)


@dev
def test_cycle_free_mode_grads_on_leaves_only(device):
    with ndl.autograd.graph_mode("cycle_free"):
        x = ndl.Tensor(arr(0, (2, 3)), device=device)
        w = ndl.Tensor(arr(1, (3, 2)), device=device)
        c = ndl.Tensor(arr(2, (2, 2)), device=device, requires_grad=False)
        h = x @ w
        r = ndl.relu(h) + c
        e = ndl.exp(r)
        e.retain_grad()
        loss = e.sum()
        loss.backward()
        assert x.grad is not None and w.grad is not None
        assert c.grad is None
        assert h.grad is None and r.grad is None and loss.grad is None
        assert e.grad is not None
        np.testing.assert_allclose(e.grad.numpy(), np.ones((2, 2)))
        for g in (x.grad, w.grad, e.grad):
            assert g.op is None
        # values agree with needle mode
        with ndl.autograd.graph_mode("needle"):
            x2 = ndl.Tensor(arr(0, (2, 3)), device=device)
            w2 = ndl.Tensor(arr(1, (3, 2)), device=device)
            c2 = ndl.Tensor(arr(2, (2, 2)), device=device, requires_grad=False)
            ndl.exp(ndl.relu(x2 @ w2) + c2).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), x2.grad.numpy())
        np.testing.assert_array_equal(w.grad.numpy(), w2.grad.numpy())


@dev
def test_cycle_free_grad_of_exp(device):
    with ndl.autograd.graph_mode("cycle_free"):
        x = ndl.Tensor(arr(0, (4,)), device=device)
        ndl.exp(x).sum().backward()
        assert x.grad.op is None
        assert x.grad.requires_grad is False
        np.testing.assert_allclose(x.grad.numpy(), np.exp(arr(0, (4,))), rtol=1e-6)


# --------------------------------------------------------------------------
# no_grad
# --------------------------------------------------------------------------


def test_no_grad():
    assert ndl.no_grad is ndl.autograd.no_grad
    x = ndl.Tensor(arr(0, (3,)))
    with ndl.no_grad():
        y = ndl.exp(x) * 2.0 + x
        assert y.op is None
        assert y.requires_grad is False
        assert y.inputs == []
        np.testing.assert_allclose(y.numpy(), np.exp(arr(0, (3,))) * 2 + arr(0, (3,)), rtol=1e-6)
        with ndl.autograd.no_grad():
            z = x * x
        assert z.op is None
        w = x + 1.0
        assert w.op is None
    v = x * 3.0
    assert v.op is not None and v.requires_grad is True
    v.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3, 3, 3])


def test_no_grad_restored_after_exception():
    x = ndl.Tensor(arr(0, (3,)))
    with pytest.raises(KeyError):
        with ndl.no_grad():
            raise KeyError("x")
    assert (x * 2.0).op is not None


# --------------------------------------------------------------------------
# custom ops written in Python
# --------------------------------------------------------------------------


class Triple(ndl.autograd.TensorOp):
    def compute(self, a):
        assert isinstance(a, nd.NDArray)
        return a * 3.0

    def gradient(self, out_grad, node):
        assert isinstance(out_grad, ndl.Tensor)
        assert isinstance(node, ndl.Tensor)
        return out_grad * 3.0


class MulAdd(ndl.autograd.TensorOp):
    """a * b + a"""

    def compute(self, a, b):
        return a * b + a

    def gradient(self, out_grad, node):
        a, b = node.inputs
        return out_grad * (b + 1.0), out_grad * a


@mode_param
def test_python_tensor_op(mode):
    with ndl.autograd.graph_mode(mode):
        op = Triple()
        x = ndl.Tensor(np.array([1.0, 2.0], dtype=np.float32))
        y = op(x)
        assert isinstance(y, ndl.Tensor)
        assert y.op is op
        assert y.inputs[0] is x
        np.testing.assert_allclose(y.numpy(), [3, 6])
        (y * y).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), [18, 36])
        g = op.gradient_as_tuple(ndl.Tensor([1.0, 1.0], requires_grad=False), y)
        assert isinstance(g, tuple) and len(g) == 1
        np.testing.assert_allclose(g[0].numpy(), [3, 3])


@mode_param
def test_python_tensor_op_two_inputs(mode):
    with ndl.autograd.graph_mode(mode):
        a = ndl.Tensor(np.array([1.0, 2.0], dtype=np.float32))
        b = ndl.Tensor(np.array([3.0, -1.0], dtype=np.float32))
        y = MulAdd()(a, b)
        np.testing.assert_allclose(y.numpy(), [4, 0])
        ndl.exp(y * 0.1).sum().backward()
        s = np.exp(np.array([0.4, 0.0])) * 0.1
        np.testing.assert_allclose(a.grad.numpy(), s * [4, 0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(b.grad.numpy(), s * [1, 2], rtol=1e-5)
        g = y.op.gradient_as_tuple(ndl.Tensor([1.0, 1.0], requires_grad=False), y)
        assert isinstance(g, tuple) and len(g) == 2


def test_builtin_gradient_as_tuple():
    x = ndl.Tensor(np.array([1.0, 2.0], dtype=np.float32))
    y = ndl.exp(x)
    g = y.op.gradient_as_tuple(ndl.Tensor([1.0, 1.0], requires_grad=False), y)
    assert isinstance(g, tuple) and len(g) == 1
    np.testing.assert_allclose(g[0].numpy(), np.exp([1.0, 2.0]), rtol=1e-6)
    z = x * y
    g2 = z.op.gradient_as_tuple(ndl.Tensor([1.0, 1.0], requires_grad=False), z)
    assert isinstance(g2, tuple) and len(g2) == 2


# --------------------------------------------------------------------------
# tensor counter
# --------------------------------------------------------------------------


def test_tensor_counter_counts_live_tensors():
    assert isinstance(ndl.autograd.TENSOR_COUNTER, int)
    base = ndl.autograd.TENSOR_COUNTER
    a = ndl.Tensor(np.ones(3, dtype=np.float32))
    assert ndl.autograd.TENSOR_COUNTER == base + 1
    b = ndl.Tensor(np.ones(3, dtype=np.float32))
    assert ndl.autograd.TENSOR_COUNTER == base + 2
    del a
    assert ndl.autograd.TENSOR_COUNTER == base + 1
    del b
    assert ndl.autograd.TENSOR_COUNTER == base


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------


def _valid_op_still_works():
    t = ndl.Tensor(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    y = (t * 2.0 + 1.0).sum()
    np.testing.assert_allclose(y.numpy(), [15.0])
    y.backward()
    np.testing.assert_allclose(t.grad.numpy(), [2, 2, 2])


def test_mixing_devices_raises_device_error():
    x = arr(0, (2, 3))
    a = ndl.Tensor(x, device=ndl.cpu())
    b = ndl.Tensor(x, device=ndl.cpu_numpy())
    with pytest.raises(ndl.DeviceError):
        a + b
    with pytest.raises(ndl.DeviceError):
        ndl.multiply(b, a)
    with pytest.raises(ndl.DeviceError):
        ndl.matmul(a, ndl.Tensor(arr(1, (3, 2)), device=ndl.cpu_numpy()))
    _valid_op_still_works()
    np.testing.assert_allclose((b + b).numpy(), 2 * x)
    assert (b + b).device == ndl.cpu_numpy()


def test_matmul_shape_mismatch():
    a = ndl.Tensor(arr(0, (2, 3)))
    b = ndl.Tensor(arr(1, (4, 5)))
    with pytest.raises(ValueError):
        ndl.matmul(a, b)
    with pytest.raises(ValueError):
        a @ b
    _valid_op_still_works()


def test_reshape_size_mismatch():
    t = ndl.Tensor(arr(0, (2, 3)))
    with pytest.raises(ValueError):
        ndl.reshape(t, (7,))
    with pytest.raises(ValueError):
        t.reshape((4, 2))
    _valid_op_still_works()
    np.testing.assert_array_equal(ndl.reshape(t, (6,)).numpy(), arr(0, (2, 3)).reshape(6))


def test_non_tensor_operands():
    t = ndl.Tensor(arr(0, (3,)))
    with pytest.raises(TypeError):
        ndl.add(t, "x")
    with pytest.raises(TypeError):
        t + "x"
    with pytest.raises(TypeError):
        t * "x"
    _valid_op_still_works()


def test_tensor_from_string():
    with pytest.raises(TypeError):
        ndl.Tensor("abc")
    _valid_op_still_works()


def test_tensortuple_backward_needs_out_grad():
    a = ndl.Tensor(arr(0, (2,)))
    tt = ndl.make_tuple(a, a * 2.0)
    with pytest.raises(TypeError):
        tt.backward()
    _valid_op_still_works()
