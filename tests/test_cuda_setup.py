"""What a user sees of CUDA before any kernel runs: the ``needle.cuda`` namespace in a fresh
process (``import needle as ndl; ndl.cuda.is_available()``), why CUDA is unavailable
(``ndl.cuda.unavailable_reason()``), ``NEEDLE_REQUIRE_CUDA=1`` turning the CUDA tests' skips
into failures, where the cuBLAS loader looks (the ``nvidia-cublas`` wheel of
``pip install ".[cuda]"``), and which GPUs a build has code for (device discovery's check of
the architectures setup.py compiled for; on the simulator through the capability it reports).

Each runs everywhere; what it asserts depends on whether this machine has a usable GPU, and
both outcomes are specific.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

import needle as ndl
import needle_c

ROOT = pathlib.Path(__file__).resolve().parent.parent
HAS_CUDA = ndl.cuda().enabled()

# The needle.cuda functions docs/api.md names (the torch.cuda-style API).
README_NAMES = [
    "is_available",
    "unavailable_reason",
    "device_count",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "empty_cache",
    "mem_get_info",
    "memory_summary",
]

# Calls every function of needle.cuda in the process it runs in and prints what each gave.
_CALL_ALL = textwrap.dedent(
    """
    import inspect, json, sys, types
    import needle as ndl

    assert isinstance(ndl.cuda, types.ModuleType), type(ndl.cuda)
    assert ndl.cuda is sys.modules["needle.cuda"]
    assert ndl.cuda() == ndl.backend_ndarray.cuda() and ndl.cuda(1).index == 1
    out = {}
    for name in ndl.cuda.__all__:
        fn = getattr(ndl.cuda, name)
        required = [
            p for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        try:
            if name == "set_per_process_memory_fraction":
                value = fn(None)
            elif required:  # the stream and graph API takes what it works on
                value = "takes " + ", ".join(p.name for p in required)
            else:
                value = fn()
        except ndl.DeviceError:
            value = "DeviceError"
        out[name] = value if isinstance(value, (bool, int, str, type(None))) else repr(value)
    print(json.dumps(out))
    """
)

# Ways a program may first import needle; each must leave ndl.cuda the module.
FIRST_IMPORTS = {
    "plain": "",
    "submodule_first": "import needle.cuda\n",
    "from_import": "from needle import cuda as _c\nassert callable(_c) and _c.is_available\n",
    "memory_first": "import needle.memory\n",
    "star": "from needle import *\nassert cuda.is_available() in (True, False)\n",
    "backend_first": "from needle.backend_ndarray import cuda as dev\nassert dev().index == 0\n",
}


def _env(**extra):
    """This environment, with the needle and needle_c this process imported first on the path
    (so that a child sees the same build, the sanitizer's or a CPU-only one included)."""
    env = dict(os.environ)
    first = [os.path.dirname(needle_c.__file__), os.path.dirname(os.path.dirname(ndl.__file__))]
    env["PYTHONPATH"] = os.pathsep.join(
        first + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.update(extra)
    return env


def test_the_api_page_documents_these_needle_cuda_functions():
    readme = (ROOT / "docs" / "api.md").read_text()
    for name in README_NAMES:
        assert f"`{name}`" in readme or f"ndl.cuda.{name}(" in readme, name
        assert name in ndl.cuda.__all__, name


@pytest.mark.parametrize("first", list(FIRST_IMPORTS))
def test_needle_cuda_is_the_module_in_a_fresh_process(first):
    proc = subprocess.run(
        [sys.executable, "-c", FIRST_IMPORTS[first] + _CALL_ALL],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(got) == set(ndl.cuda.__all__)
    assert got["is_available"] is HAS_CUDA
    assert got["is_compiled"] is bool(needle_c._cuda_compiled())
    if HAS_CUDA:
        assert got["unavailable_reason"] is None
        assert got["device_count"] >= 1
        assert got["memory_stats"].startswith("{")
    else:
        assert isinstance(got["unavailable_reason"], str) and got["unavailable_reason"]
        assert got["device_count"] == 0
        for name in ("memory_allocated", "memory_reserved", "empty_cache"):
            assert got[name] == 0, name
        assert got["memory_stats"] == "{}" and got["mem_get_info"] == "(0, 0)"
        assert "not available" in got["memory_summary"]
        assert got["reset_peak_memory_stats"] is None
        assert got["set_per_process_memory_fraction"] == "DeviceError"
    if needle_c._cuda_compiled():
        assert got["gemm_backend"].startswith(("cublas (", "needle's tiled SGEMM kernel"))
    else:
        assert got["gemm_backend"] is None


def test_unavailable_reason_says_why():
    reason = ndl.cuda.unavailable_reason()
    if HAS_CUDA:
        assert reason is None and needle_c._cuda_init_error() is None
        return
    assert isinstance(reason, str) and len(reason) > 20
    assert needle_c._cuda_init_error() == reason
    if needle_c._cuda_compiled():
        # The CUDA error of discovery by name, and both sides of a driver mismatch.
        if reason.startswith("GPU "):  # a GPU this build has no code for
            assert "needle was built for sm_" in reason and "; this GPU is sm_" in reason
            return
        assert reason.startswith(("cudaGetDeviceCount failed: cuda", "cudaGetDeviceProperties"))
        major = needle_c._cuda_build_info()["runtime_version"] // 1000
        assert f"needle's runtime is CUDA {major}." in reason
        assert "the driver supports CUDA" in reason or "no CUDA driver was found" in reason
    else:
        assert reason.startswith("needle was built without CUDA")


def _run_one_cuda_case(**env):
    case = "tests/test_sum_accuracy.py::test_sum_keeps_nan_inf_and_empty[cuda]"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", case],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=_env(**env),
    )


def test_require_cuda_fails_cuda_tests_instead_of_skipping():
    required = _run_one_cuda_case(NEEDLE_REQUIRE_CUDA="1")
    if HAS_CUDA:
        assert required.returncode == 0, required.stdout
        assert "1 passed" in required.stdout
        return
    assert required.returncode == 1, required.stdout
    assert "NEEDLE_REQUIRE_CUDA=1 but CUDA is unavailable: " in required.stdout
    assert ndl.cuda.unavailable_reason() in required.stdout
    assert "1 error" in required.stdout and "skipped" not in required.stdout


def test_without_require_cuda_the_case_skips_with_the_reason():
    if HAS_CUDA:
        pytest.skip("the case runs here: there is a GPU")
    plain = _run_one_cuda_case(NEEDLE_REQUIRE_CUDA="0")
    assert plain.returncode == 0, plain.stdout
    assert "1 skipped" in plain.stdout
    assert f"CUDA unavailable: {ndl.cuda.unavailable_reason()}" in plain.stdout


# A stand-in for the nvidia-cublas wheel's library: the symbols needle's loader resolves,
# never called here (no cuBLAS call is made without a GPU).
_STUB_CUBLAS = """
int cublasCreate_v2(void **h) { (void)h; return 1; }
int cublasSetStream_v2(void *h, void *s) { (void)h; (void)s; return 0; }
int cublasSetWorkspace_v2(void *h, void *w, unsigned long n) { return h && w && n ? 0 : 7; }
int cublasSgemmStridedBatched(void) { return 13; }
int cublasSgemmBatched(void) { return 13; }
"""

_SHOW_LOADER = (
    "import needle as ndl, needle_c, json\n"
    "print(json.dumps([list(needle_c._cuda_cublas_dirs()), ndl.cuda.gemm_backend()]))\n"
)


def _fake_wheel(tmp_path, with_library):
    """site/nvidia/cu13/lib as pip lays out nvidia-cublas, optionally with a stub library."""
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    if with_library:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            pytest.skip("no C compiler to build the stub library")
        src = tmp_path / "stub.c"
        src.write_text(_STUB_CUBLAS)
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-o", str(lib / "libcublas.so.13"), str(src)],
            check=True,
        )
    return tmp_path / "site", lib


def _loader_view(site):
    env = _env()
    env.pop("NEEDLE_CUBLAS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    proc = subprocess.run(
        [sys.executable, "-c", _SHOW_LOADER], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not needle_c._cuda_compiled(), reason="needle was built without CUDA")
def test_cublas_loader_finds_the_nvidia_cublas_wheel(tmp_path):
    site, lib = _fake_wheel(tmp_path, with_library=True)
    dirs, gemm = _loader_view(site)
    assert str(lib) in dirs
    if gemm.startswith("cublas (") and str(lib) not in gemm:
        pytest.skip(f"the cuBLAS found at build time is loaded first here: {gemm}")
    assert gemm == f"cublas ({lib}/libcublas.so.13)"


@pytest.mark.skipif(not needle_c._cuda_compiled(), reason="needle was built without CUDA")
def test_cublas_loader_says_where_it_looked(tmp_path):
    site, lib = _fake_wheel(tmp_path, with_library=False)
    dirs, gemm = _loader_view(site)
    assert str(lib) in dirs
    if gemm.startswith("cublas ("):
        pytest.skip(f"a cuBLAS is installed here: {gemm}")
    assert gemm.startswith("needle's tiled SGEMM kernel (cuBLAS not found in")
    assert f" {lib}," in gemm and gemm.endswith("the loader's path)")


def test_cublas_dirs_rejects_bad_input():
    before = needle_c._cuda_cublas_dirs()
    with pytest.raises(TypeError):
        needle_c._cuda_cublas_dirs("/one/string")
    with pytest.raises(TypeError):
        needle_c._cuda_cublas_dirs([1])
    with pytest.raises(TypeError):
        needle_c._cuda_cublas_dirs(["/a"], ["/b"])
    with pytest.raises(ValueError):
        needle_c._cuda_cublas_dirs(["/d"] * 9)
    if needle_c._cuda_compiled():
        with pytest.raises(ValueError):
            needle_c._cuda_cublas_dirs(["/" + "x" * 2000])
    assert needle_c._cuda_cublas_dirs() == before


# ------------------------------------------- which GPUs a build has code for

DEFAULT_13 = "75 80 86 89 90"  # what setup.py builds with CUDA 13 (and the simulator stands for)
DEFAULT_12 = "70 75 80 86 89 90"


@pytest.mark.parametrize(
    "sass, ptx, toolkit, capability, reason",
    [
        (
            DEFAULT_13,
            "90",
            13,
            (7, 0),
            "needle was built for sm_75..sm_90; this GPU is sm_70: "
            "rebuild with CUDA 12 (CUDA 13 cannot compile for sm_70)",
        ),
        (DEFAULT_12, "90", 12, (7, 0), None),  # a V100 under a CUDA 12 build
        (DEFAULT_13, "90", 13, (7, 5), None),  # a T4
        (DEFAULT_13, "90", 13, (8, 7), None),  # sm_86's code runs on 8.7 (same major)
        (DEFAULT_13, "90", 13, (10, 0), None),  # newer than every SASS: the PTX, JIT-compiled
        (DEFAULT_13, "90", 13, (12, 1), None),
        (
            DEFAULT_13,
            "90",
            13,
            (6, 1),
            "needle was built for sm_75..sm_90; this GPU is sm_61: "
            "rebuild with CUDA 12 and NEEDLE_CUDA_ARCH naming it "
            "(CUDA 13 cannot compile for sm_61)",
        ),
        (
            DEFAULT_13,
            "90",
            13,
            (3, 5),
            "needle was built for sm_75..sm_90; this GPU is sm_35: "
            "no CUDA toolkit needle builds with compiles for it (CUDA 12 starts at sm_50)",
        ),
        (
            "80 90",
            "90",
            12,
            (7, 5),
            "needle was built for sm_80, sm_90; this GPU is sm_75: "
            "rebuild with sm_75 in NEEDLE_CUDA_ARCH",
        ),
        (
            "80 90",
            "",
            13,
            (10, 0),
            "needle was built for sm_80, sm_90; this GPU is sm_100: the "
            "build embeds no PTX the driver could compile for it: rebuild with sm_100 in "
            "NEEDLE_CUDA_ARCH",
        ),
        ("90a", "90a", 13, (9, 0), None),
        (
            "90a",
            "90a",
            13,
            (10, 0),
            "needle was built for sm_90a; this GPU is sm_100: rebuild "
            "with sm_100 in NEEDLE_CUDA_ARCH",
        ),
        ("100f", "100f", 13, (10, 3), None),
        (
            "100f",
            "100f",
            13,
            (12, 0),
            "needle was built for sm_100f; this GPU is sm_120: rebuild "
            "with sm_120 in NEEDLE_CUDA_ARCH",
        ),
        (
            "75 90",
            "90",
            13,
            (8, 0),
            "needle was built for sm_75, sm_90; this GPU is sm_80: "
            "rebuild with sm_80 in NEEDLE_CUDA_ARCH",
        ),
    ],
)
def test_arch_check_decides_as_cuda_does(sass, ptx, toolkit, capability, reason):
    assert needle_c._cuda_arch_check(sass, ptx, toolkit, *capability) == reason


@pytest.mark.parametrize(
    "args",
    [
        ("", "90", 13, 9, 0),
        ("sm_90", "90", 13, 9, 0),
        ("80 90", "80 90", 13, 9, 0),
        ("7", "", 13, 9, 0),
        ("80", "80", 13, 0, 0),
        ("80", "80", 13, 8, 10),
    ],
)
def test_arch_check_refuses_malformed_input(args):
    with pytest.raises(ValueError):
        needle_c._cuda_arch_check(*args)
    with pytest.raises(TypeError):
        needle_c._cuda_arch_check("80", "80", 13, 8)


def test_build_info_says_what_the_build_embeds():
    info = needle_c._cuda_build_info()
    if not needle_c._cuda_compiled():
        assert info is None
        return
    assert info["ptx"] in info["sass"] and info["runtime_version"] // 1000 in (12, 13)
    if needle_c._cuda_simulated():  # it stands for a default CUDA 13 build
        assert info == {"sass": DEFAULT_13.split(), "ptx": "90", "runtime_version": 13000}


_AVAILABILITY = (
    "import json, needle as ndl\n"
    "print(json.dumps([ndl.cuda.is_available(), ndl.cuda.unavailable_reason(),"
    " ndl.cuda.device_count(), ndl.cuda().enabled()]))\n"
)


def _availability(capability):
    proc = subprocess.run(
        [sys.executable, "-c", _AVAILABILITY],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(NEEDLE_SIM_COMPUTE_CAPABILITY=capability),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.cuda
@pytest.mark.skipif(not needle_c._cuda_simulated(), reason="needs the CUDA simulator")
def test_a_gpu_without_code_is_unavailable_with_the_reason():
    available, reason, count, enabled = _availability("7.0")
    assert (available, count, enabled) == (False, 0, False)
    assert reason == (
        "GPU 0 (needle CUDA simulator (CPU)): needle was built for sm_75..sm_90; this GPU is "
        "sm_70: rebuild with CUDA 12 (CUDA 13 cannot compile for sm_70)"
    )


@pytest.mark.cuda
@pytest.mark.skipif(not needle_c._cuda_simulated(), reason="needs the CUDA simulator")
@pytest.mark.parametrize("capability", ["7.5", "8.6", "9.0", "10.0"])
def test_a_gpu_with_code_or_ptx_is_available(capability):
    assert _availability(capability) == [True, None, 1, True]
