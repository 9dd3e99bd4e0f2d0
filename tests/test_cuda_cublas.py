"""cuBLAS inside needle's memory accounting (csrc/cuda/cuda_cublas.cu): its workspace comes
from the caching allocator (reserved, never allocated), and a GPU too short of memory for
cuBLAS's handle or workspace still multiplies correctly (the out-of-memory ladder, then
needle's kernel for that call) without raising and without giving cuBLAS up for good.
GPU only; the loader's search path is tested without a GPU in test_cuda_setup.py."""

import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import needle as ndl
import needle_c
from needle import backend_ndarray as nd

from devices import needs_cuda

MiB = 2**20
pytestmark = needs_cuda


def _uses_cublas():
    return ndl.cuda.gemm_backend().startswith("cublas (")


def test_workspace_is_reserved_not_allocated():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 128)).astype(np.float32)
    a = nd.array(x, device=ndl.cuda())
    gc.collect()  # earlier tests' garbage must not be freed in between
    before = ndl.cuda.memory_allocated()
    c = a @ a.permute((1, 0))
    np.testing.assert_allclose(c.numpy(), x @ x.T, rtol=1e-4, atol=1e-3)
    del c
    assert ndl.cuda.memory_allocated() == before
    if _uses_cublas():
        assert ndl.cuda.memory_reserved() >= before + MiB  # the workspace, at least 1 MiB


_TIGHT = textwrap.dedent(
    """
    import json, numpy as np
    import needle as ndl
    from needle import backend_ndarray as nd
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    a = nd.array(x, device=ndl.cuda())
    worst = 0.0
    for _ in range(5):
        worst = max(worst, float(np.abs((a @ a).numpy() - x @ x).max()))
    stats = ndl.cuda.memory_stats()
    print(json.dumps({"worst": worst, "ooms": stats["num_ooms"],
                      "reserved_peak": ndl.cuda.max_memory_reserved(),
                      "gemm": ndl.cuda.gemm_backend()}))
    """
)


@pytest.mark.parametrize("limit", ["2MiB", "8MiB"])
def test_matmul_under_a_limit_smaller_than_the_workspace(limit):
    env = dict(os.environ, NEEDLE_MEMORY_LIMIT=f"cuda={limit}")
    first = [os.path.dirname(needle_c.__file__), os.path.dirname(os.path.dirname(ndl.__file__))]
    env["PYTHONPATH"] = os.pathsep.join(first + [env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _TIGHT], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["worst"] < 1e-3
    assert got["ooms"] == 0
    assert got["reserved_peak"] <= int(limit[:-3]) * MiB
    # A lack of memory never turns cuBLAS off for good.
    assert "failed" not in got["gemm"]
