"""What a build and its GPU report: whether CUDA was compiled in and which GEMM it uses, that
``ndl.cuda()`` is still the course's device function while ``ndl.cuda.*`` is the torch.cuda-style
module, the device's name and whether it is needle's simulator, and that a malformed simulator
switch stops the import. These run everywhere (the simulator's only under NEEDLE_CUDA=sim).
"""

import subprocess
import sys

import pytest

import needle as ndl
import needle.cuda as cm
import needle_c

from cuda_check import (  # noqa: F401  (no_limits_left: an autouse fixture)
    CUDA,
    HAS_CUDA,
    SIMULATED,
    no_limits_left,
    sim_test,
    simulator_env,
)


def test_build_reports_whether_cuda_was_compiled():
    compiled = needle_c._cuda_compiled()
    assert isinstance(compiled, bool)
    assert cm.is_compiled() is compiled
    if HAS_CUDA:
        assert compiled, "a CUDA device exists, so the backend must be compiled in"
    gemm = cm.gemm_backend()
    if compiled:
        assert isinstance(gemm, str) and ("cublas" in gemm or "kernel" in gemm), gemm
    else:
        assert gemm is None


def test_cuda_is_still_the_course_device_function():
    assert callable(ndl.cuda)
    assert isinstance(ndl.cuda(), ndl.Device)
    assert ndl.cuda().name == "cuda"
    from needle import cuda as cuda_mem  # noqa: F401  (importing it shadows nothing)

    assert callable(ndl.cuda) and ndl.cuda() == CUDA


def test_needle_cuda_is_the_device_function_and_the_memory_api():
    """ndl.cuda() stays the course's device function; ndl.cuda.* is the torch.cuda-style API."""
    import needle.cuda as nc

    assert nc is ndl.cuda
    assert str(ndl.cuda()) == "cuda()" and ndl.cuda() == ndl.backend_ndarray.cuda()
    assert ndl.cuda.is_available() == ndl.cuda().enabled()
    if not ndl.cuda().enabled():
        assert ndl.cuda.memory_allocated() == 0 and ndl.cuda.memory_stats() == {}
        assert ndl.cuda.mem_get_info() == (0, 0) and ndl.cuda.device_count() == 0


def test_device_name_and_whether_simulated():
    assert isinstance(SIMULATED, bool)
    if not needle_c._cuda_compiled():
        assert SIMULATED is False
    if HAS_CUDA:
        name = cm.get_device_name()
        assert isinstance(name, str) and name
        assert cm.get_device_name(0) == cm.get_device_name("cuda") == name
        assert ("simulator" in name) == SIMULATED
        if SIMULATED:
            assert name == "needle CUDA simulator (CPU)"
            assert (
                cm.gemm_backend() == "cublas (the CUDA simulator's stand-in, computed on the CPU)"
            )
    else:
        with pytest.raises(ndl.DeviceError, match="not available"):
            cm.get_device_name()
    assert needle_c._cuda_device_name(7) is None  # no such GPU, never an error
    with pytest.raises(ndl.DeviceError):
        cm.get_device_name(3)
    with pytest.raises(ValueError):
        cm.get_device_name("cpu")
    with pytest.raises(TypeError):
        cm.get_device_name(True)
    with pytest.raises(TypeError):
        needle_c._cuda_device_name("0")


@sim_test
def test_malformed_simulator_switch_stops_the_import():
    """The simulator reads its switches at its first call; needle makes that call at import
    when one is set, so a malformed one is an import error, not a GPU that quietly is not
    there (every variable's bad values: tests/test_environment.py)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import needle"],
        env=simulator_env(NEEDLE_SIM_MEMORY="lots"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "ValueError: NEEDLE_SIM_MEMORY='lots': " in proc.stderr, proc.stderr[-2000:]
