"""needle.init: the course's initializers with its exact RNG semantics.

Each random initializer makes exactly one draw from NumPy's global RNG
(``np.random.rand`` or ``np.random.randn`` of the requested shape) and
transforms it in float32; the constant ones draw nothing.
"""

import math

import numpy as np
import pytest

import needle as ndl
import needle.init as init

from devices import DEVICES

dev = pytest.mark.parametrize("device", DEVICES)

F = np.float32


def exp_rand(shape, low=0.0, high=1.0):
    return np.random.rand(*shape).astype(F) * F(high - low) + F(low)


def exp_randn(shape, mean=0.0, std=1.0):
    return np.random.randn(*shape).astype(F) * F(std) + F(mean)


def assert_close32(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)


def check_tensor(t, shape, device=None, requires_grad=False):
    assert isinstance(t, ndl.Tensor)
    assert t.shape == tuple(shape)
    assert t.dtype == "float32"
    assert t.device == (ndl.cpu() if device is None else device)
    assert t.requires_grad is requires_grad
    assert t.op is None


def rng_state_equal(s1, s2):
    return s1[0] == s2[0] and np.array_equal(s1[1], s2[1]) and s1[2:] == s2[2:]


def one_draw(make, draw):
    """``make()`` leaves the RNG exactly where one ``draw()`` does."""
    np.random.seed(11)
    make()
    after = np.random.rand(5)
    np.random.seed(11)
    draw()
    expected = np.random.rand(5)
    np.testing.assert_array_equal(after, expected)


def test_init_is_exported():
    assert ndl.init is init
    for name in [
        "rand",
        "randn",
        "constant",
        "ones",
        "zeros",
        "randb",
        "one_hot",
        "zeros_like",
        "ones_like",
        "xavier_uniform",
        "xavier_normal",
        "kaiming_uniform",
        "kaiming_normal",
    ]:
        assert callable(getattr(init, name)), name


# --------------------------------------------------------------------------
# basic initializers
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,low,high", [((3, 4), 0.0, 1.0), ((5,), -2.0, 3.0), ((2, 3, 2), 0.5, 0.75)]
)
def test_rand(shape, low, high):
    np.random.seed(0)
    t = init.rand(*shape, low=low, high=high)
    check_tensor(t, shape)
    np.random.seed(0)
    assert_close32(t.numpy(), exp_rand(shape, low, high))
    assert t.numpy().min() >= low and t.numpy().max() <= high


def test_rand_defaults_and_single_draw():
    np.random.seed(3)
    t = init.rand(2, 3)
    np.random.seed(3)
    assert_close32(t.numpy(), exp_rand((2, 3)))
    one_draw(lambda: init.rand(4, 2, low=-1.0, high=1.0), lambda: np.random.rand(4, 2))


@dev
@pytest.mark.usefixtures("host_rng")
def test_rand_device_and_requires_grad(device):
    np.random.seed(1)
    t = init.rand(3, device=device, requires_grad=True)
    check_tensor(t, (3,), device=device, requires_grad=True)
    np.random.seed(1)
    assert_close32(t.numpy(), exp_rand((3,)))
    t2 = init.rand(2, 2, device=device, dtype="float32")
    check_tensor(t2, (2, 2), device=device)


@pytest.mark.parametrize(
    "shape,mean,std", [((3, 4), 0.0, 1.0), ((6,), 1.5, 0.1), ((2, 2, 2), -3.0, 2.0)]
)
def test_randn(shape, mean, std):
    np.random.seed(0)
    t = init.randn(*shape, mean=mean, std=std)
    check_tensor(t, shape)
    np.random.seed(0)
    assert_close32(t.numpy(), exp_randn(shape, mean, std))


def test_randn_single_draw():
    one_draw(lambda: init.randn(3, 5, mean=1.0, std=2.0), lambda: np.random.randn(3, 5))


@dev
@pytest.mark.usefixtures("host_rng")
def test_randn_device(device):
    np.random.seed(2)
    t = init.randn(4, device=device)
    check_tensor(t, (4,), device=device)
    np.random.seed(2)
    assert_close32(t.numpy(), exp_randn((4,)))


@dev
def test_constant_ones_zeros(device):
    np.random.seed(9)
    state = np.random.get_state()
    c = init.constant(2, 3, c=2.5, device=device)
    check_tensor(c, (2, 3), device=device)
    np.testing.assert_array_equal(c.numpy(), np.full((2, 3), 2.5, dtype=F))
    c1 = init.constant(4)
    check_tensor(c1, (4,))
    np.testing.assert_array_equal(c1.numpy(), np.ones(4, dtype=F))
    o = init.ones(3, 2, device=device)
    check_tensor(o, (3, 2), device=device)
    np.testing.assert_array_equal(o.numpy(), np.ones((3, 2), dtype=F))
    z = init.zeros(5, device=device, requires_grad=True)
    check_tensor(z, (5,), device=device, requires_grad=True)
    np.testing.assert_array_equal(z.numpy(), np.zeros(5, dtype=F))
    assert rng_state_equal(np.random.get_state(), state), "constant/ones/zeros drew from the RNG"


@pytest.mark.parametrize("p", [0.5, 0.3, 0.0, 1.0])
def test_randb(p):
    np.random.seed(4)
    t = init.randb(6, 7, p=p)
    check_tensor(t, (6, 7))
    np.random.seed(4)
    expected = (np.random.rand(6, 7).astype(F) <= F(p)).astype(F)
    np.testing.assert_array_equal(t.numpy(), expected)
    assert set(np.unique(t.numpy())) <= {0.0, 1.0}


def test_randb_default_and_single_draw():
    np.random.seed(5)
    t = init.randb(10)
    np.random.seed(5)
    np.testing.assert_array_equal(t.numpy(), (np.random.rand(10).astype(F) <= F(0.5)).astype(F))
    one_draw(lambda: init.randb(3, 3, p=0.2), lambda: np.random.rand(3, 3))


@dev
def test_randb_device(device):
    t = init.randb(4, p=1.0, device=device)
    check_tensor(t, (4,), device=device)
    np.testing.assert_array_equal(t.numpy(), np.ones(4))


@dev
def test_one_hot(device):
    i = ndl.Tensor(np.array([0, 2, 1, 2, 4], dtype=np.float32), device=device, requires_grad=False)
    state = np.random.get_state()
    t = init.one_hot(5, i, device=device)
    check_tensor(t, (5, 5), device=device)
    np.testing.assert_array_equal(t.numpy(), np.eye(5)[[0, 2, 1, 2, 4]])
    t2 = init.one_hot(3, ndl.Tensor([2.0, 0.0], requires_grad=False))
    check_tensor(t2, (2, 3))
    np.testing.assert_array_equal(t2.numpy(), [[0, 0, 1], [1, 0, 0]])
    assert rng_state_equal(np.random.get_state(), state)


@dev
def test_zeros_like_ones_like(device):
    src = ndl.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    z = init.zeros_like(src)
    check_tensor(z, (2, 3), device=device)
    np.testing.assert_array_equal(z.numpy(), np.zeros((2, 3)))
    o = init.ones_like(src)
    check_tensor(o, (2, 3), device=device)
    np.testing.assert_array_equal(o.numpy(), np.ones((2, 3)))
    o2 = init.ones_like(src, requires_grad=True)
    assert o2.requires_grad is True
    np.testing.assert_array_equal(src.numpy(), np.arange(6).reshape(2, 3))  # untouched


# --------------------------------------------------------------------------
# xavier and kaiming
# --------------------------------------------------------------------------


@pytest.mark.parametrize("fi,fo,gain", [(5, 8, 1.0), (16, 4, 2.0), (3, 3, 0.5)])
def test_xavier_uniform(fi, fo, gain):
    np.random.seed(0)
    t = init.xavier_uniform(fi, fo, gain=gain)
    check_tensor(t, (fi, fo))
    a = gain * math.sqrt(6.0 / (fi + fo))
    np.random.seed(0)
    assert_close32(t.numpy(), exp_rand((fi, fo), -a, a))
    assert np.abs(t.numpy()).max() <= a * (1 + 1e-6)


def test_xavier_uniform_default_gain_and_draw():
    np.random.seed(7)
    t = init.xavier_uniform(4, 6)
    a = math.sqrt(6.0 / 10)
    np.random.seed(7)
    assert_close32(t.numpy(), exp_rand((4, 6), -a, a))
    one_draw(lambda: init.xavier_uniform(4, 6), lambda: np.random.rand(4, 6))


@pytest.mark.parametrize("fi,fo,gain", [(5, 8, 1.0), (16, 4, 2.0)])
def test_xavier_normal(fi, fo, gain):
    np.random.seed(0)
    t = init.xavier_normal(fi, fo, gain=gain)
    check_tensor(t, (fi, fo))
    std = gain * math.sqrt(2.0 / (fi + fo))
    np.random.seed(0)
    assert_close32(t.numpy(), exp_randn((fi, fo), 0.0, std))
    one_draw(lambda: init.xavier_normal(fi, fo), lambda: np.random.randn(fi, fo))


@pytest.mark.parametrize("fi,fo", [(5, 8), (64, 10)])
def test_kaiming_uniform(fi, fo):
    np.random.seed(0)
    t = init.kaiming_uniform(fi, fo)
    check_tensor(t, (fi, fo))
    b = math.sqrt(2.0) * math.sqrt(3.0 / fi)
    np.random.seed(0)
    assert_close32(t.numpy(), exp_rand((fi, fo), -b, b))
    np.random.seed(0)
    t2 = init.kaiming_uniform(fi, fo, nonlinearity="relu")
    np.testing.assert_array_equal(t2.numpy(), t.numpy())
    one_draw(lambda: init.kaiming_uniform(fi, fo), lambda: np.random.rand(fi, fo))


def test_kaiming_uniform_with_shape_exact_value():
    np.random.seed(0)
    t = init.kaiming_uniform(3 * 3 * 16, 8, shape=(3, 3, 16, 8))
    check_tensor(t, (3, 3, 16, 8))
    np.testing.assert_allclose(t.numpy().sum(), -2.5719218, atol=1e-4)
    b = math.sqrt(2.0) * math.sqrt(3.0 / 144)
    np.random.seed(0)
    assert_close32(t.numpy(), exp_rand((3, 3, 16, 8), -b, b))


@dev
@pytest.mark.usefixtures("host_rng")
def test_kaiming_uniform_with_shape_device(device):
    np.random.seed(1)
    t = init.kaiming_uniform(2 * 2 * 3, 5, shape=(2, 2, 3, 5), device=device, requires_grad=True)
    check_tensor(t, (2, 2, 3, 5), device=device, requires_grad=True)
    b = math.sqrt(2.0) * math.sqrt(3.0 / 12)
    np.random.seed(1)
    assert_close32(t.numpy(), exp_rand((2, 2, 3, 5), -b, b))


@pytest.mark.parametrize("fi,fo", [(5, 8), (64, 10)])
def test_kaiming_normal(fi, fo):
    np.random.seed(0)
    t = init.kaiming_normal(fi, fo)
    check_tensor(t, (fi, fo))
    std = math.sqrt(2.0) / math.sqrt(fi)
    np.random.seed(0)
    assert_close32(t.numpy(), exp_randn((fi, fo), 0.0, std))
    one_draw(lambda: init.kaiming_normal(fi, fo), lambda: np.random.randn(fi, fo))


def test_kaiming_normal_with_shape():
    np.random.seed(0)
    t = init.kaiming_normal(3 * 3 * 4, 2, shape=(3, 3, 4, 2))
    check_tensor(t, (3, 3, 4, 2))
    std = math.sqrt(2.0) / math.sqrt(36)
    np.random.seed(0)
    assert_close32(t.numpy(), exp_randn((3, 3, 4, 2), 0.0, std))
