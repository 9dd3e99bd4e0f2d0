"""The NEEDLE_* run-time variables: each good value takes effect and each bad one is an error at
import (a ValueError naming the variable and the value), in a fresh interpreter per case; and
the sizes those variables and needle.memory take (``parse_size``): a unit-less decimal in
(0, 1] is a fraction of the device's capacity, ``"1.5"`` is refused, ``"4096"`` is bytes."""

import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

import needle as ndl
import needle_c
from needle import memory

MiB = 2**20

# What a fresh interpreter reports once needle is imported: the settings each variable sets.
PROBE = """
import json, needle_c
import needle as ndl, needle.memory as m
cap = m.memory_stats("cpu")["device_capacity_bytes"]
out = {
    "capacity": cap,
    "cpu": m.get_memory_limit("cpu"),
    "cpu_numpy": m.get_memory_limit("cpu_numpy"),
    "policy": m.get_gc_policy(),
    "blas": needle_c._blas(),
    "isa": needle_c._cpu_kernels()["isa"],
    "gemm_split": needle_c._cpu_kernels()["gemm_split"],
    "threads": needle_c._num_threads(),
    "cuda": ndl.cuda.is_available(),
}
if ndl.cuda.is_available():
    out["cuda_capacity"] = m.memory_stats("cuda")["device_capacity_bytes"]
    out["cuda_limit"] = m.get_memory_limit("cuda")
print(json.dumps(out))
"""


def run_probe(**variables):
    """Imports needle in a fresh interpreter with only these NEEDLE_* run-time variables set
    (every other one removed); returns the CompletedProcess."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NEEDLE_") or k in ("NEEDLE_REQUIRE_CUDA",)
    }
    env.update(variables)
    # the same needle_c and needle as this process, whichever build that is
    paths = [os.path.dirname(needle_c.__file__), os.path.dirname(os.path.dirname(ndl.__file__))]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )


def probe(**variables):
    proc = run_probe(**variables)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def refused(name, value, *fragments):
    """Asserts that importing needle with name=value fails with a ValueError that names the
    variable and the value (and each fragment of what it accepts)."""
    proc = run_probe(**{name: value})
    assert proc.returncode != 0, f"{name}={value!r} was accepted:\n{proc.stdout}"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: "), proc.stderr[-3000:]
    assert f"{name}={value!r}" in last, last
    for fragment in fragments:
        assert fragment in last, (fragment, last)
    return last


@pytest.fixture(scope="module")
def default():
    return probe()


# ------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0.5", 500),
        (".25", 250),
        ("1.0", 1000),
        ("0.001", 1),
        ("50%", 500),
        ("4096", 4096),
        ("1", 1),
        ("0", 0),
        ("2KiB", 2048),
        ("1.5GB", 1_500_000_000),
        (" 0.5 ", 500),
    ],
)
def test_parse_size_strings(text, expected):
    assert memory.parse_size(text, capacity=1000) == expected


@pytest.mark.parametrize("text", ["1.5", "2.0", "0.0", "1.5B", "1.5b", "-0.5", "0.5.1", "1e9"])
def test_parse_size_refuses_what_is_neither_bytes_nor_a_fraction(text):
    with pytest.raises(ValueError, match="memory size"):
        memory.parse_size(text, capacity=1000)


def test_a_fraction_needs_a_capacity():
    with pytest.raises(ValueError, match="capacity"):
        memory.parse_size("0.5")
    with pytest.raises(ValueError, match="capacity"):
        memory.parse_size(0.5)


def test_fraction_string_limit_matches_the_float_one():
    capacity = memory.memory_stats("cpu")["device_capacity_bytes"]
    try:
        memory.set_memory_limit("cpu", "0.5")
        assert memory.get_memory_limit("cpu") == int(0.5 * capacity)
        memory.set_memory_limit("cpu", 0.5)
        assert memory.get_memory_limit("cpu") == int(0.5 * capacity)
        with pytest.raises(ValueError, match="'1.5'"):
            memory.set_memory_limit("cpu", "1.5")
        assert memory.get_memory_limit("cpu") == int(0.5 * capacity)  # unchanged by the refusal
    finally:
        memory.set_memory_limit("cpu", None)


# ------------------------------------------------------------ NEEDLE_MEMORY_LIMIT


def test_no_variables(default):
    assert default["cpu"] is None and default["cpu_numpy"] is None
    assert default["policy"]["enabled"] is True
    assert default["threads"] >= 1


@pytest.mark.parametrize("value", ["0.5", " 0.5", "50%", ".5"])
def test_memory_limit_fraction_for_every_device(value):
    out = probe(NEEDLE_MEMORY_LIMIT=value)
    assert out["cpu"] == int(0.5 * out["capacity"]) and out["cpu"] > 0
    assert out["cpu_numpy"] == out["cpu"]
    if out["cuda"]:
        assert out["cuda_limit"] == int(0.5 * out["cuda_capacity"])


def test_memory_limit_fraction_per_device():
    out = probe(NEEDLE_MEMORY_LIMIT="cpu=0.25")
    assert out["cpu"] == int(0.25 * out["capacity"]) and out["cpu"] > 0
    assert out["cpu_numpy"] is None


def test_memory_limit_bytes_and_units():
    assert probe(NEEDLE_MEMORY_LIMIT="4096")["cpu"] == 4096
    out = probe(NEEDLE_MEMORY_LIMIT="cpu=1GiB,cpu_numpy=64MiB")
    assert out["cpu"] == 2**30 and out["cpu_numpy"] == 64 * MiB


def test_empty_memory_limit_is_unset():
    assert probe(NEEDLE_MEMORY_LIMIT="")["cpu"] is None


@pytest.mark.parametrize(
    "value", ["1.5", "cpu=1.5", "lots", "0.0", "gpu=1GiB", "cpu=", "cpu=1GiB,,", "-1MiB"]
)
def test_memory_limit_bad_values(value):
    refused("NEEDLE_MEMORY_LIMIT", value, "cpu=1GiB")


# --------------------------------------------------------------- NEEDLE_GC*


@pytest.mark.parametrize(
    "value, enabled",
    [("0", False), ("off", False), ("No", False), ("1", True), ("TRUE", True), ("", True)],
)
def test_gc_switch(value, enabled):
    assert probe(NEEDLE_GC=value)["policy"]["enabled"] is enabled


@pytest.mark.parametrize("value", ["maybe", "2", "disabled"])
def test_gc_switch_bad_values(value):
    refused("NEEDLE_GC", value, "0/false/off/no")


@pytest.mark.parametrize(
    "name, value, key, expected",
    [
        ("NEEDLE_GC_GROWTH", "1.5", "growth", 1.5),
        ("NEEDLE_GC_HIGH_WATER", "0.9", "high_water", 0.9),
        ("NEEDLE_GC_MAX_FRACTION", "0.1", "max_gc_fraction", 0.1),
        ("NEEDLE_GC_MIN_GROWTH", "32MiB", "min_growth", 32 * MiB),
        ("NEEDLE_GC_WATERMARK", "50%", "watermark", 0.5),
        ("NEEDLE_GC_WATERMARK", "0.25", "watermark", 0.25),
        ("NEEDLE_GC_WATERMARK", "1GiB", "watermark", 2**30),
    ],
)
def test_gc_parameters(name, value, key, expected):
    assert probe(**{name: value})["policy"][key] == expected


@pytest.mark.parametrize(
    "name, value",
    [
        ("NEEDLE_GC_GROWTH", "fast"),
        ("NEEDLE_GC_GROWTH", "-1"),
        ("NEEDLE_GC_GROWTH", "nan"),
        ("NEEDLE_GC_HIGH_WATER", "1.5"),
        ("NEEDLE_GC_MAX_FRACTION", "0.9"),
        ("NEEDLE_GC_MIN_GROWTH", "lots"),
        ("NEEDLE_GC_MIN_GROWTH", "0.5"),  # a fraction of no capacity
        ("NEEDLE_GC_WATERMARK", "1.5"),
        ("NEEDLE_GC_WATERMARK", "high"),
    ],
)
def test_gc_parameters_bad_values(name, value):
    refused(name, value, "expected ")


# ------------------------------------------------- read by needle_c at import


def test_blas_switch(default):
    assert probe(NEEDLE_BLAS="0")["blas"] == "needle's built-in GEMM (NEEDLE_BLAS=0)"
    assert probe(NEEDLE_BLAS="1")["blas"] == default["blas"]


@pytest.mark.parametrize("value", ["2", "yes", "off"])
def test_blas_bad_values(value):
    refused("NEEDLE_BLAS", value, "expected 0")


def test_cpu_isa(default):
    assert probe(NEEDLE_CPU_ISA="baseline")["isa"] == "baseline"
    assert probe(NEEDLE_CPU_ISA="")["isa"] == default["isa"]


@pytest.mark.parametrize("value", ["sse9", "AVX2", "avx"])
def test_cpu_isa_unknown_names(value):
    refused("NEEDLE_CPU_ISA", value, "avx512, avx2 or baseline")


def test_gemm_split():
    assert probe(NEEDLE_GEMM_SPLIT="123456")["gemm_split"] == 123456


@pytest.mark.parametrize("value", ["lots", "-1", "1.5", "99999999999999999999999"])
def test_gemm_split_bad_values(value):
    refused("NEEDLE_GEMM_SPLIT", value, "integer >= 0")


def test_num_threads():
    assert probe(NEEDLE_NUM_THREADS="3")["threads"] == 3


@pytest.mark.parametrize("value", ["0", "many", "-2", "257", "2.5"])
def test_num_threads_bad_values(value):
    refused("NEEDLE_NUM_THREADS", value, "1 to 256")


# --------------------------------------------------------- the CUDA backend's


@pytest.mark.parametrize("value", ["0", "1", "libcublas.so.13", sys.executable])
def test_cublas_values_accepted(value):
    probe(NEEDLE_CUBLAS=value)


def test_cublas_missing_path(tmp_path):
    refused("NEEDLE_CUBLAS", str(tmp_path / "libcublas.so.13"), "no such file")


def sim_only(fn):
    """A test of the simulator's switches: a NEEDLE_CUDA=sim build (tests/cuda_sim.sh)."""
    fn = pytest.mark.skipif(
        not needle_c._cuda_simulated(), reason="needs the CUDA simulator (NEEDLE_CUDA=sim)"
    )(fn)
    return pytest.mark.cuda(fn)


@sim_only
@pytest.mark.parametrize(
    "name, value",
    [
        ("NEEDLE_SIM_MEMORY", "lots"),
        ("NEEDLE_SIM_MEMORY", "-5"),
        ("NEEDLE_SIM_MAX_BLOCKS", "many"),
        ("NEEDLE_SIM_PERTURB", "yes"),
        ("NEEDLE_SIM_VMM", "no"),
        ("NEEDLE_SIM_COMPUTE_CAPABILITY", "seven"),
        ("NEEDLE_SIM_COMPUTE_CAPABILITY", "7"),
        ("NEEDLE_SIM_COMPUTE_CAPABILITY", "7.55"),
    ],
)
def test_simulator_switch_bad_values(name, value):
    refused(name, value, "expected ", "needle's CUDA simulator")


@sim_only
def test_simulator_switches_good_values():
    out = probe(NEEDLE_SIM_MEMORY="256MiB", NEEDLE_SIM_MAX_BLOCKS="3", NEEDLE_SIM_PERTURB="0")
    assert out["cuda"] is True and out["cuda_capacity"] == 256 * MiB
    out = probe(NEEDLE_SIM_MEMORY="256MiB", NEEDLE_MEMORY_LIMIT="cuda=0.5")
    assert out["cuda_limit"] == 128 * MiB and out["cpu"] is None


# -------------------------------------------------------- the tests' own switch


def test_require_cuda_bad_value_stops_pytest(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    conftest = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    (tmp_path / "conftest.py").write_text(open(conftest).read())
    env = dict(os.environ, NEEDLE_REQUIRE_CUDA="yes please")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "NEEDLE_REQUIRE_CUDA='yes please'" in proc.stdout + proc.stderr


# ------------------------------------------------------------------ the build's

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# setup.py imports setuptools, which a venv of Python 3.12 or later does not have until it is
# installed there (the test extra has it; CI's 3.12 and 3.13 venvs install it).
needs_setuptools = pytest.mark.skipif(
    importlib.util.find_spec("setuptools") is None,
    reason="setup.py needs setuptools, which this interpreter lacks (Python 3.12+ venvs come "
    "without it: pip install setuptools)",
)


def run_setup(**variables):
    """``setup.py --name`` (reads every build variable, builds nothing) with these set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEEDLE_")}
    env.update(variables)
    return subprocess.run(
        [sys.executable, "setup.py", "--name"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@needs_setuptools
@pytest.mark.parametrize(
    "variables",
    [
        {"NEEDLE_CUDA": "0", "NEEDLE_STRICT": "1", "NEEDLE_DEBUG": "0", "NEEDLE_SANITIZE": ""},
        {"NEEDLE_CUDA": "0", "NEEDLE_CUDA_ARCH": "9.0"},
        {"NEEDLE_CUDA": "sim", "NEEDLE_CUDA_ARCH": "80;90a"},
    ],
)
def test_build_variables_accepted(variables):
    proc = run_setup(**variables)
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.strip().splitlines()[-1] == "needle-gc"
    )  # the distribution (the import name is needle)


@needs_setuptools
@pytest.mark.parametrize(
    "name, value, accepted",
    [
        ("NEEDLE_STRICT", "yes", "expected 1 (on) or 0"),
        ("NEEDLE_DEBUG", "2", "expected 1 (on) or 0"),
        ("NEEDLE_SANITIZE", "true", "expected 1 (on) or 0"),
        ("NEEDLE_CUDA", "maybe", "expected auto, 0, 1 or sim"),
        ("NEEDLE_CUDA_ARCH", "sm90", "expected compute capabilities"),
        ("NEEDLE_CUDA_ARCH", ";", "expected compute capabilities"),
    ],
)
def test_build_variables_refused(name, value, accepted):
    variables = {"NEEDLE_CUDA": "0", name: value}
    proc = run_setup(**variables)
    assert proc.returncode != 0
    assert f"needle: {name}={value!r}: {accepted}" in proc.stderr, proc.stderr[-2000:]


# ------------------------------------------- the toolkit setup.py finds (a fake one)

CUDA12_ARCHS = "50 52 53 60 61 62 70 72 75 80 86 87 89 90"
CUDA13_ARCHS = "75 80 86 87 88 89 90 100 103 110 120 121"
FAKE_NVCC = """#!/bin/sh
# a stand-in nvcc: the release and architectures a real one reports; compiles by $COMPILE
case "$1" in
--version) echo "Cuda compilation tools, release {release}, V{release}.1" ;;
--list-gpu-code) for a in {archs}; do echo "sm_$a"; done ;;
*) if [ "{compile}" = ok ]; then
       while [ "$#" -gt 1 ]; do [ "$1" = -o ] && : > "$2"; shift; done
   else echo "fake nvcc: cannot compile" >&2; exit 1; fi ;;
esac
"""


def fake_toolkit(tmp_path, release="13.0", archs=CUDA13_ARCHS, compile="ok", broken=False):
    """A directory shaped like a CUDA toolkit (bin/nvcc, include/cuda_runtime.h,
    lib64/libcudart_static.a) whose nvcc is a script: `broken` exits 1 for everything."""
    home = tmp_path / "cuda"
    for sub in ("bin", "include", "lib64"):
        (home / sub).mkdir(parents=True)
    (home / "include" / "cuda_runtime.h").write_text("")
    (home / "lib64" / "libcudart_static.a").write_text("")
    nvcc = home / "bin" / "nvcc"
    script = FAKE_NVCC.format(release=release, archs=archs, compile=compile)
    nvcc.write_text("#!/bin/sh\necho 'nvcc: broken' >&2\nexit 1\n" if broken else script)
    nvcc.chmod(0o755)
    return str(home)


@needs_setuptools
@pytest.mark.parametrize("mode", ["auto", "1"])
def test_a_failing_nvcc(tmp_path, mode):
    home = fake_toolkit(tmp_path, broken=True)
    proc = run_setup(NEEDLE_CUDA=mode, CUDA_HOME=home)
    said = f"{home}/bin/nvcc --version failed (exit 1): nvcc: broken"
    if mode == "auto":  # a CPU-only build, with a warning that says why
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == "needle-gc"
        assert f"needle: WARNING: building without CUDA: {said}" in proc.stderr
        assert "NEEDLE_CUDA=1 makes this an error" in proc.stderr
    else:
        assert proc.returncode != 0
        assert f"needle: NEEDLE_CUDA=1 but the CUDA toolkit failed: {said}" in proc.stderr


@needs_setuptools
@pytest.mark.parametrize(
    "release, archs, requested, built",
    [
        ("12.4", CUDA12_ARCHS, "", "sm_70, sm_75, sm_80, sm_86, sm_89, sm_90"),
        ("13.0", CUDA13_ARCHS, "", "sm_75, sm_80, sm_86, sm_89, sm_90"),
        ("12.4", CUDA12_ARCHS, "7.0", "sm_70"),
        ("13.0", CUDA13_ARCHS, "100;120", "sm_100, sm_120"),
    ],
)
def test_architectures_follow_the_toolkit(tmp_path, release, archs, requested, built):
    home = fake_toolkit(tmp_path, release=release, archs=archs)
    proc = run_setup(NEEDLE_CUDA="1", CUDA_HOME=home, NEEDLE_CUDA_ARCH=requested)
    assert proc.returncode == 0, proc.stderr
    assert f"with CUDA {release} at {home} ({built});" in proc.stdout


@needs_setuptools
@pytest.mark.parametrize("mode", ["auto", "1"])
def test_an_architecture_the_toolkit_cannot_build_stops_the_build(tmp_path, mode):
    home = fake_toolkit(tmp_path)
    proc = run_setup(NEEDLE_CUDA=mode, CUDA_HOME=home, NEEDLE_CUDA_ARCH="70;90")
    assert proc.returncode != 0
    assert "needle: NEEDLE_CUDA_ARCH='70;90': CUDA 13.0 cannot compile for sm_70 (" in proc.stderr


@needs_setuptools
def test_an_unsupported_toolkit_falls_back_under_auto(tmp_path):
    home = fake_toolkit(tmp_path, release="11.8", archs="35 50 70 80 90")
    proc = run_setup(NEEDLE_CUDA="auto", CUDA_HOME=home)
    assert proc.returncode == 0, proc.stderr
    assert "is CUDA 11.8; needle builds with CUDA 12 or 13" in proc.stderr


@needs_setuptools
@pytest.mark.parametrize("mode, compile", [("auto", "fails"), ("1", "fails"), ("auto", "ok")])
def test_nvcc_failing_on_the_sources(tmp_path, mode, compile):
    """build_ext with a fake nvcc and a fake C compiler that records its arguments and stops
    the build: under auto a failing nvcc leaves a needle_c compiled without CUDA."""
    home = fake_toolkit(tmp_path, compile=compile)
    record = tmp_path / "cc_args"
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\necho "$@" >> {record}\nexit 1\n')
    cc.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEEDLE_")}
    env.update(NEEDLE_CUDA=mode, CUDA_HOME=home, CC=str(cc))
    out = tmp_path / "build"
    proc = subprocess.run(
        [
            sys.executable,
            "setup.py",
            "build_ext",
            "--build-temp",
            str(out),
            "--build-lib",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode != 0  # the fake C compiler stops it
    # One line on stderr when the CUDA build starts, saying how long it takes and how to skip
    # it (pip shows a build's streams with -v only, and both alike).
    count = len(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
    start = f"needle: compiling {count} CUDA file(s) with {home}/bin/nvcc for sm_"
    assert start in proc.stderr and start not in proc.stdout, proc.stderr[-2000:]
    assert f"(2-4 minutes for all {count}; NEEDLE_CUDA=0 skips CUDA)\n" in proc.stderr
    if mode == "1":
        assert "needle: nvcc failed on csrc/cuda/" in proc.stderr
        assert "fake nvcc: cannot compile" in proc.stderr and not record.exists()
        return
    args = record.read_text()
    assert "-DNPY_NO_DEPRECATED_API" in args  # needle_c's own sources reached the compiler
    if compile == "fails":
        assert "needle: WARNING: building without CUDA: nvcc failed on csrc/cuda/" in proc.stderr
        assert "NEEDLE_WITH_CUDA" not in args
    else:
        assert "WARNING" not in proc.stderr and "-DNEEDLE_WITH_CUDA=1" in args
