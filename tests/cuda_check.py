"""What the CUDA tests (test_cuda_*.py) share: the GPU device, the marks of a test that needs it
or the simulator, the fixture that leaves no memory limit behind, the same values on the CPU and
the GPU as views of every kind, a comparison of the two, and a fresh interpreter with the
simulator's switches set.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import needle as ndl
import needle.memory as mem
import needle_c
from needle import backend_ndarray as nd

from devices import needs_cuda

CUDA = ndl.cuda()
HAS_CUDA = CUDA.enabled()
SIMULATED = needle_c._cuda_simulated()
MiB = 2**20
RTOL, ATOL = 2e-5, 1e-6


def cuda_test(fn):
    """Marks a test as needing the CUDA backend and a GPU (skipped with the reason without)."""
    for mark in needs_cuda:
        fn = mark(fn)
    return fn


def sim_test(fn):
    """Marks a test of the CUDA simulator (a NEEDLE_CUDA=sim build, tests/cuda_sim.sh)."""
    fn = pytest.mark.skipif(not SIMULATED, reason="needs the CUDA simulator (NEEDLE_CUDA=sim)")(fn)
    return pytest.mark.cuda(fn)


@pytest.fixture(autouse=True)
def no_limits_left():
    """Every test starts and ends without a limit on the GPU (autouse where a test file imports
    it)."""
    yield
    if HAS_CUDA:
        mem.set_memory_limit(CUDA, None)


def random_f32(shape, seed=0, kind="any"):
    """float32 values in [-2, 2) (``kind="pos"``: in [0.1, 3)), the same for the same seed."""
    rng = np.random.default_rng(seed)
    if kind == "pos":
        return rng.uniform(0.1, 3.0, size=shape).astype(np.float32)
    return rng.uniform(-2.0, 2.0, size=shape).astype(np.float32)


def views_on(base_np, device):
    """(name, view) pairs of the same (4, 6) values built from a larger base on device:
    contiguous, offset, stepped, negative-step, transposed, flipped, broadcast, as_strided."""
    a = nd.array(base_np, device=device)  # base (8, 12)
    return [
        ("contiguous", nd.array(base_np[:4, :6].copy(), device=device)),
        ("offset", a[2:6, 3:9]),
        ("stepped", a[::2, ::2]),
        ("negative", a[7:3:-1, 11:5:-1]),
        ("transposed", a[:6, :4].permute((1, 0))),
        ("flipped", a[:4, :6].flip((0, 1))),
        ("broadcast", a[0:1, :6].broadcast_to((4, 6))),
        ("as_strided", a.compact().as_strided((4, 6), (3, 1))),
    ]


def view_pairs(base_np):
    """The views on the CPU and on the GPU, paired by name."""
    return zip(views_on(base_np, ndl.cpu()), views_on(base_np, CUDA))


def assert_close(cpu_value, cuda_value, rtol=RTOL, atol=ATOL, msg=""):
    got = cuda_value.numpy() if hasattr(cuda_value, "numpy") else cuda_value
    want = cpu_value.numpy() if hasattr(cpu_value, "numpy") else cpu_value
    assert got.shape == want.shape, msg
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=msg)


def simulator_env(**switches):
    """This process's environment with the simulator's switches (NEEDLE_SIM_*) as given, and
    none of the ones set here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEEDLE_SIM_")}
    env.update(switches)
    return env


def run_on_simulator(code, **switches):
    """Runs code in a fresh interpreter with the simulator's switches set; returns its last
    line of output as JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=simulator_env(**switches),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
