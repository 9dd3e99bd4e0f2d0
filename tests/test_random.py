"""Random numbers: the engine's Philox4x32-10 generator (csrc/philox.h) on every device,
checked against a reference written here from the paper and against the published
known answers; its distributions; seeding through NumPy's global RNG and
ndl.manual_seed; the switch between it and NumPy's draws (needle.random, NEEDLE_RNG);
bad input; and Dropout's shortcuts on the device generator.

Statistical checks use 2**20 values and bounds of 6 standard errors around the exact
moments: a correct generator fails one with odds below 1e-8, while an off-by-one in the
conversions (a different range, a lost bit, a wrong pairing) moves a statistic by far more.
"""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import needle as ndl
import needle_c as _c
from needle import init, nn

from devices import DEVICES, needs_cuda

N = 1 << 20
CUDA = ndl.cuda()
KINDS = ("uniform", "normal", "bernoulli")

# ----------------------------------------------------------- a reference Philox

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85
LOW32 = np.uint64(0xFFFFFFFF)
UNIT = np.float32(2.0**-24)


def philox_reference(ctr, key):
    """Philox4x32-10 of counters ctr (four arrays of 32-bit words) under key (k0, k1):
    four arrays of output words (uint64 holding 32 bits)."""
    c = [np.asarray(w, dtype=np.uint64) for w in ctr]
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
        p0, p1 = M0 * c[0], M1 * c[2]  # 32 x 32 bits: exact in uint64
        c = [
            (p1 >> 32) ^ c[1] ^ np.uint64(k0),
            p1 & LOW32,
            (p0 >> 32) ^ c[3] ^ np.uint64(k1),
            p0 & LOW32,
        ]
    return c


def reference_words(n, key, stream):
    """The 32-bit words behind elements 0..n-1 of a draw: (ceil(n/4)*4,) uint64."""
    blocks = np.arange((n + 3) // 4, dtype=np.uint64)
    ctr = (blocks & LOW32, blocks >> np.uint64(32), [stream & 0xFFFFFFFF], [stream >> 32])
    words = philox_reference(ctr, (key & 0xFFFFFFFF, key >> 32))
    return np.stack(words, axis=1).reshape(-1)


def reference_uniform(n, key, stream=0):
    return ((reference_words(n, key, stream) >> np.uint64(8)).astype(np.float32) * UNIT)[:n]


def reference_normal(n, key, stream=0):
    """Box-Muller in float64 from the generator's float32 uniforms: the kernel's values to
    a few float32 ulp (its logf/sinf/cosf are the platform's)."""
    words = reference_words(n, key, stream)
    radius_u = ((words[0::2] >> np.uint64(8)) + np.uint64(1)).astype(np.float32) * UNIT
    angle = np.float32(2 * math.pi) * ((words[1::2] >> np.uint64(8)).astype(np.float32) * UNIT)
    r = np.sqrt(-2.0 * np.log(radius_u.astype(np.float64)))
    z = np.stack([r * np.cos(angle.astype(np.float64)), r * np.sin(angle.astype(np.float64))], 1)
    return z.reshape(-1)[:n]


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def philox(device, kind, shape, key, stream=0, p=0.5):
    return _c._philox(device, kind, shape, key, stream, p).numpy()


def key_after_seed(seed):
    """The key a device draw takes right after np.random.seed(seed)."""
    np.random.seed(seed)
    return int(np.random.randint(0, 2**64, dtype=np.uint64))


@pytest.fixture
def device_rng():
    """The device generator on every device (the CPU included) for the test."""
    with ndl.random.rng_mode("device"):
        yield


def test_reference_known_answers():
    # Random123's kat_vectors, philox4x32 10: counter, key -> output.
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for ctr, key, expected in cases:
        got = philox_reference([[w] for w in ctr], key)
        assert [int(w[0]) for w in got] == list(expected)


# -------------------------------------------------------- the engine's generator


@pytest.mark.parametrize("device", DEVICES)
def test_known_answer_through_the_engine(device):
    # Key 0, stream 0: elements 0..3 are the first known answer's words, top 24 bits.
    words = np.array([0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8], dtype=np.uint64)
    expected = (words >> np.uint64(8)).astype(np.float32) * UNIT
    np.testing.assert_array_equal(bits(philox(device, "uniform", (4,), 0)), bits(expected))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "key,stream", [(0, 0), (0x243F6A88A4093822, 0), (2**64 - 1, 2**64 - 1), (12345, 0xABCDEF0123)]
)
def test_generator_matches_the_reference(device, key, stream):
    n = 4099  # not a multiple of 4: the last block is cut short
    uniform = philox(device, "uniform", (n,), key, stream)
    np.testing.assert_array_equal(bits(uniform), bits(reference_uniform(n, key, stream)))
    bernoulli = philox(device, "bernoulli", (n,), key, stream, p=0.3)
    expected = (reference_uniform(n, key, stream) <= np.float32(0.3)).astype(np.float32)
    np.testing.assert_array_equal(bernoulli, expected)
    normal = philox(device, "normal", (n,), key, stream)
    np.testing.assert_allclose(normal, reference_normal(n, key, stream), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_keys_and_streams_give_different_draws(device):
    a = philox(device, "uniform", (1000,), 7)
    assert not np.array_equal(a, philox(device, "uniform", (1000,), 8))
    assert not np.array_equal(a, philox(device, "uniform", (1000,), 7, stream=1))
    # A shorter draw is the longer one's start: values depend on the index, not the size.
    np.testing.assert_array_equal(philox(device, "uniform", (3, 7), 7).reshape(-1), a[:21])


@pytest.mark.parametrize("device", DEVICES)
def test_shapes(device):
    assert philox(device, "normal", (2, 0, 3), 1).shape == (2, 0, 3)
    zero_d = _c._philox(device, "uniform", (), 1)
    assert zero_d.shape == () and zero_d.device == device
    np.testing.assert_array_equal(bits(zero_d.numpy().reshape(1)), bits(reference_uniform(1, 1)))


def test_cpu_split_over_threads_gives_the_same_values():
    threads = _c._num_threads()
    try:
        _c._set_num_threads(1)
        one = philox(ndl.cpu(), "normal", (N + 3,), 99)
        _c._set_num_threads(4)
        four = philox(ndl.cpu(), "normal", (N + 3,), 99)
    finally:
        _c._set_num_threads(threads)
    np.testing.assert_array_equal(bits(one), bits(four))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [0, 2**40 + 3])
@pytest.mark.parametrize("key", [0x0123456789ABCDEF, 2**63 + 5])
def test_cuda_kernel_equals_cpu(kind, key, stream):
    """The kernel against the CPU's plain C, over enough blocks that a grid capped at a
    few blocks (the simulator's NEEDLE_SIM_MAX_BLOCKS=3 run) loops many times: equal
    values whatever the grid. Uniform and bernoulli are integer work and a float32
    product, equal everywhere; normals go through logf/sinf/cosf, the host's on the
    simulator (bit for bit) and the GPU's on a GPU (a few ulp)."""
    n = 3 * 256 * 4 * 7 + 3
    gpu = philox(CUDA, kind, (n,), key, stream, p=0.7)
    cpu = philox(ndl.cpu(), kind, (n,), key, stream, p=0.7)
    if kind != "normal" or _c._cuda_simulated():
        np.testing.assert_array_equal(bits(gpu), bits(cpu))
    else:
        np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=2e-6)


for _mark in needs_cuda:
    test_cuda_kernel_equals_cpu = _mark(test_cuda_kernel_equals_cpu)


# ---------------------------------------------------------------- distributions


def _within(value, expected, standard_error, what):
    assert abs(value - expected) <= 6 * standard_error, (
        f"{what}: {value} is {abs(value - expected) / standard_error:.1f} standard errors "
        f"from {expected}"
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("device_rng")
def test_uniform_distribution(device):
    np.random.seed(1)
    u = device.rand(N).numpy().astype(np.float64)
    assert np.isfinite(u).all() and u.min() >= 0.0 and u.max() < 1.0
    assert u.min() < 1e-4 and u.max() > 1 - 1e-4
    np.testing.assert_array_equal(u * 2**24, np.floor(u * 2**24))  # the 2^-24 grid
    _within(u.mean(), 0.5, math.sqrt(1 / 12 / N), "mean")
    _within(u.var(), 1 / 12, math.sqrt((1 / 80 - 1 / 144) / N), "variance")
    counts = np.histogram(u, bins=10, range=(0.0, 1.0))[0] / N
    for decile, share in enumerate(counts):
        _within(share, 0.1, math.sqrt(0.09 / N), f"decile {decile}")
    # Neighbours (same Philox block and across blocks) are uncorrelated.
    _within(np.corrcoef(u[:-1], u[1:])[0, 1], 0.0, 1 / math.sqrt(N), "lag-1 correlation")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("device_rng")
def test_normal_distribution(device):
    np.random.seed(2)
    z = device.randn(N).numpy().astype(np.float64)
    assert np.isfinite(z).all() and np.abs(z).max() <= math.sqrt(-2 * math.log(2.0**-24)) + 1e-5
    _within(z.mean(), 0.0, math.sqrt(1 / N), "mean")
    _within(z.var(), 1.0, math.sqrt(2 / N), "variance")
    _within((z**4).mean(), 3.0, math.sqrt(96 / N), "fourth moment")
    inside = 0.6826894921370859  # P(|z| < 1)
    _within((np.abs(z) < 1).mean(), inside, math.sqrt(inside * (1 - inside) / N), "P(|z| < 1)")
    _within(np.corrcoef(z[0::2], z[1::2])[0, 1], 0.0, 1 / math.sqrt(N / 2), "pair correlation")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("device_rng")
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_bernoulli_distribution(device, p):
    np.random.seed(3)
    b = device.randb(N, p=p).numpy()
    assert set(np.unique(b)) <= {0.0, 1.0}
    _within(b.mean(), p, math.sqrt(p * (1 - p) / N), "rate")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("device_rng")
def test_bernoulli_edges_and_uniform_agreement(device):
    assert philox(device, "bernoulli", (N,), 5, p=1.0).min() == 1.0
    # rand <= 0 holds only for a uniform of exactly 0, one value in 2^24.
    assert philox(device, "bernoulli", (N,), 5, p=0.0).sum() <= 3
    np.random.seed(4)
    b = device.randb(5000, p=0.25).numpy()
    np.random.seed(4)
    u = device.rand(5000).numpy()
    np.testing.assert_array_equal(b, (u <= np.float32(0.25)).astype(np.float32))


# ------------------------------------------------------------------ seeding


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("device_rng")
@pytest.mark.parametrize("draw", ["rand", "randn", "randb"])
def test_seeded_draws_are_reproducible(device, draw):
    kind = {"rand": "uniform", "randn": "normal", "randb": "bernoulli"}[draw]
    make = getattr(device, draw)
    np.random.seed(10)
    first = make(64, 33).numpy()
    second = make(64, 33).numpy()
    np.random.seed(10)
    again = make(64, 33).numpy()
    np.random.seed(11)
    other = make(64, 33).numpy()
    np.testing.assert_array_equal(bits(first), bits(again))
    assert not np.array_equal(first, second)  # each call takes a new key
    assert not np.array_equal(first, other)
    # The key is one draw from NumPy's global RNG, and the values are the generator's.
    key = key_after_seed(10)
    after = np.random.rand()
    np.random.seed(10)
    make(64, 33)
    assert np.random.rand() == after
    np.testing.assert_array_equal(bits(first), bits(philox(device, kind, (64, 33), key)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["auto", "host", "device"])
def test_manual_seed(device, mode):
    with ndl.random.rng_mode(mode):
        ndl.manual_seed(123)
        a = init.randn(50, device=device).numpy()
        np.random.seed(123)
        b = init.randn(50, device=device).numpy()
        ndl.manual_seed(124)
        c = init.randn(50, device=device).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_manual_seed_bad_input():
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        ndl.manual_seed(-1)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        ndl.manual_seed(2**32)
    with pytest.raises(TypeError, match="integer"):
        ndl.manual_seed(1.5)
    with pytest.raises(TypeError, match="integer"):
        ndl.manual_seed("1")
    ndl.manual_seed(2**32 - 1)


# ------------------------------------------------------------------- the switch


def test_switch_per_device_kind():
    assert ndl.random.get_rng_mode() in ndl.random.MODES
    with ndl.random.rng_mode("auto"):
        assert not ndl.random.uses_device_generator(ndl.cpu())
        assert not ndl.random.uses_device_generator(None)
        assert not ndl.random.uses_device_generator(ndl.cpu_numpy())
        if CUDA.enabled():
            assert ndl.random.uses_device_generator("cuda")
            assert ndl.random.uses_device_generator(CUDA)
    with ndl.random.rng_mode("host"):
        assert not ndl.random.uses_device_generator(ndl.cpu())
        if CUDA.enabled():
            assert not ndl.random.uses_device_generator(CUDA)
    with ndl.random.rng_mode("device"):
        assert ndl.random.uses_device_generator(ndl.cpu())
        assert ndl.random.get_rng_mode() == "device"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("host_rng")
def test_host_mode_gives_numpy_values(device):
    np.random.seed(20)
    expected = [
        np.random.rand(5, 6).astype(np.float32),
        np.random.randn(7).astype(np.float32),
        (np.random.rand(4, 9).astype(np.float32) <= np.float32(0.35)).astype(np.float32),
    ]
    after = np.random.rand()
    np.random.seed(20)
    got = [device.rand(5, 6), device.randn(7), device.randb(4, 9, p=0.35)]
    assert np.random.rand() == after
    for g, e in zip(got, expected, strict=True):
        assert g.device == device
        np.testing.assert_array_equal(bits(g.numpy()), bits(e))
    np.random.seed(21)
    mask = init.randb(30, p=0.6, device=device).numpy()
    np.random.seed(21)
    np.testing.assert_array_equal(mask, np.random.rand(30).astype(np.float32) <= np.float32(0.6))


@pytest.mark.parametrize("device", DEVICES)
def test_auto_mode_uses_numpy_on_the_cpu_only(device):
    with ndl.random.rng_mode("auto"):
        np.random.seed(22)
        got = device.rand(100).numpy()
    np.random.seed(22)
    numpy_values = np.random.rand(100).astype(np.float32)
    key = key_after_seed(22)
    if device.name == "cuda":
        np.testing.assert_array_equal(bits(got), bits(philox(device, "uniform", (100,), key)))
    else:
        np.testing.assert_array_equal(bits(got), bits(numpy_values))


def test_bad_mode():
    before = ndl.random.get_rng_mode()
    with pytest.raises(ValueError, match="expected 'auto'.*'host'.*'device'"):
        ndl.random.set_rng_mode("gpu")
    with pytest.raises(TypeError, match="str"):
        ndl.random.set_rng_mode(1)
    assert ndl.random.get_rng_mode() == before
    with pytest.raises(RuntimeError, match="inside"):
        with ndl.random.rng_mode("device"):
            raise RuntimeError("inside")
    assert ndl.random.get_rng_mode() == before


def _run_with_env(value, code):
    """Runs code in a fresh interpreter with NEEDLE_RNG=value and this test's modules."""
    env = dict(os.environ, NEEDLE_RNG=value)
    paths = [os.path.dirname(_c.__file__), os.path.dirname(os.path.dirname(ndl.__file__))]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_environment_variable():
    code = (
        "import needle as ndl\n"
        "print(ndl.random.get_rng_mode(), ndl.random.uses_device_generator(ndl.cpu()))"
    )
    for value, expected in [("device", "device True"), ("host", "host False"), ("", "auto False")]:
        run = _run_with_env(value, code)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == expected.split()
    bad = _run_with_env("gpu", code)
    assert bad.returncode != 0
    assert "ValueError: NEEDLE_RNG='gpu': expected auto (the device generator" in bad.stderr


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["host", "device"])
def test_bad_input(device, mode):
    with ndl.random.rng_mode(mode):
        np.random.seed(30)
        state = np.random.get_state()[1].copy()
        with pytest.raises(ValueError, match="negative"):
            device.rand(3, -1)
        with pytest.raises(ValueError, match="negative"):
            device.randb(-2, p=0.5)
        if mode == "device":  # nothing was drawn for a draw that failed
            np.testing.assert_array_equal(np.random.get_state()[1], state)
        for p in (-0.1, 1.5, float("nan")):
            with pytest.raises(ValueError, match=r"p must be a probability in \[0, 1\]"):
                device.randb(3, p=p)
            with pytest.raises(ValueError, match=r"randb probability p: .* \[0\.0, 1\.0\]"):
                init.randb(3, p=p, device=device)
        with pytest.raises(TypeError):
            device.randb(3, p="half")
        with pytest.raises(TypeError, match="p must be a number, not bool"):
            device.randb(3, p=True)
        with pytest.raises(TypeError, match="float32, float16, bfloat16 or float64"):
            device.rand(3, dtype="int64")
        with pytest.raises(TypeError, match="float32, float16, bfloat16 or float64"):
            device.randb(3, dtype="int32")
        with pytest.raises(TypeError, match="keyword arguments p and dtype"):
            device.randb(3, q=0.5)
        with pytest.raises(TypeError, match="keyword argument"):
            device.randn(3, p=0.5)
        with pytest.raises(TypeError):
            device.rand(2.5)
        assert device.randb(2, 3, p=0.5).shape == (2, 3)  # the next call works


@pytest.mark.parametrize("device", DEVICES)
def test_explicit_key_bad_input(device):
    with pytest.raises(ValueError, match="unknown distribution"):
        _c._philox(device, "gamma", (3,), 1)
    with pytest.raises(OverflowError, match=r"key must be in \[0, 2\*\*64\)"):
        _c._philox(device, "uniform", (3,), -1)
    with pytest.raises(OverflowError, match=r"stream must be in \[0, 2\*\*64\)"):
        _c._philox(device, "uniform", (3,), 1, 2**64)
    with pytest.raises(TypeError):
        _c._philox(device, "uniform", (3,), 1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        _c._philox(device, "bernoulli", (3,), 1, 0, 1.01)
    with pytest.raises(ValueError, match="negative"):
        _c._philox(device, "uniform", (-3,), 1)
    assert _c._philox(device, "uniform", (3,), 1).shape == (3,)


# ---------------------------------------------------------------------- Dropout


def _tensor(shape, device):
    return ndl.Tensor(np.random.randn(*shape).astype(np.float32), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("device_rng")
def test_dropout_on_the_device_generator(device):
    x = _tensor((8, 9), device)
    x_grad = ndl.Tensor(x.numpy(), device=device, requires_grad=True)
    state = np.random.get_state()[1].copy()
    assert nn.Dropout(0.0)(x) is x  # no draw, no kernel
    zeros = nn.Dropout(1.0)(x)
    np.testing.assert_array_equal(zeros.numpy(), np.zeros((8, 9), np.float32))
    np.testing.assert_array_equal(np.random.get_state()[1], state)

    key = key_after_seed(40)
    np.random.seed(40)
    y = nn.Dropout(0.3)(x_grad)
    mask = philox(ndl.cpu(), "bernoulli", (8, 9), key, p=np.float32(0.7))
    np.testing.assert_allclose(y.numpy(), x.numpy() * mask / np.float32(0.7), rtol=1e-6)
    y.sum().backward()
    np.testing.assert_allclose(x_grad.grad.numpy(), mask / np.float32(0.7), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("host_rng")
def test_dropout_p0_draws_with_numpy(device):
    x = _tensor((4, 5), device)
    np.random.seed(41)
    y = nn.Dropout(0.0)(x)
    after = np.random.rand()
    np.random.seed(41)
    np.random.rand(4, 5)
    assert np.random.rand() == after  # the course's draw, also when p == 0
    np.testing.assert_array_equal(y.numpy(), x.numpy())
