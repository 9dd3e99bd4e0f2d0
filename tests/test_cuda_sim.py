"""The CUDA simulator (csrc/cuda/sim, ``NEEDLE_CUDA=sim``) tested on its own: builds
tests/c/cuda_sim_selftest.cc with the C++ compiler against the simulator's runtime and
runs it under each combination of its switches.

The self-test's kernels check built-in ids, barriers, every warp operation, atomics and
dynamic shared memory; that broken kernels fail their launch instead of hanging; memory,
copies, errors, streams and events; stream capture and graphs (tests/c/cuda_sim_capture.cc:
replays equal to eager runs, and what CUDA refuses during a capture refused and
invalidating it); and that the switches have teeth: a kernel missing a
``__syncthreads`` gives wrong results under ``NEEDLE_SIM_PERTURB=1`` (and right ones in the
plain order), ``NEEDLE_SIM_MAX_BLOCKS`` caps ``gridDim`` and ``NEEDLE_SIM_MEMORY`` sets the
capacity, while a malformed switch leaves no device and names the variable. It is built twice:
with the x86-64 context switch and with the ucontext one other machines use. No GPU and no CUDA
toolkit needed, so this runs in the normal suite; the backend's own kernels run on the simulator
in tests/cuda_sim.sh.
"""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIM = ROOT / "csrc" / "cuda" / "sim"
CXX = shutil.which(os.environ.get("CXX") or "g++")

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++) on this machine")


@pytest.fixture(scope="module", params=["native", "ucontext"])
def selftest(request, tmp_path_factory):
    binary = tmp_path_factory.mktemp("sim") / "cuda_sim_selftest"
    switch = ["-DND_SIM_UCONTEXT"] if request.param == "ucontext" else []
    build = subprocess.run(
        [
            CXX,
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-unknown-pragmas",
            "-DNEEDLE_CUDA_SIM",
            *switch,
            f"-I{SIM}",
            f"-I{ROOT / 'csrc'}",
            "-pthread",  # the capture tests start a thread (older glibc needs the flag)
            str(ROOT / "tests" / "c" / "cuda_sim_selftest.cc"),
            str(ROOT / "tests" / "c" / "cuda_sim_capture.cc"),
            *map(str, sorted(SIM.glob("*.cc"))),
            "-o",
            str(binary),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, f"building the simulator's self-test failed:\n{build.stderr}"
    return binary


def _run(binary, **switches):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEEDLE_SIM_")}
    env.update(switches)
    proc = subprocess.run([str(binary)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"self-test failed under {switches}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def _wrong(output, what):
    """How many values the kernel missing a barrier got wrong (it prints the count)."""
    return int(re.search(rf"missing {what}: (\d+) of", output).group(1))


@pytest.mark.parametrize(
    "switches",
    [
        {},
        {"NEEDLE_SIM_MAX_BLOCKS": "1"},
        {"NEEDLE_SIM_MAX_BLOCKS": "5"},
        {"NEEDLE_SIM_MAX_BLOCKS": "0", "NEEDLE_SIM_PERTURB": "0"},
        {"NEEDLE_SIM_MEMORY": "256MiB"},
    ],
    ids=["plain", "one-block", "five-blocks", "explicit-off", "256MiB"],
)
def test_selftest_plain(selftest, switches):
    out = _run(selftest, **switches)
    assert "0 failure(s)" in out
    if switches.get("NEEDLE_SIM_MAX_BLOCKS", "0") == "0":
        # every block launched, in thread order: the races stay hidden
        assert _wrong(out, "barrier") == 0 and _wrong(out, "second barrier") == 0


@pytest.mark.parametrize("blocks", ["0", "2"])
def test_perturbation_exposes_a_missing_barrier(selftest, blocks):
    out = _run(selftest, NEEDLE_SIM_PERTURB="1", NEEDLE_SIM_MAX_BLOCKS=blocks)
    assert "0 failure(s)" in out
    assert _wrong(out, "barrier") > 0
    assert _wrong(out, "second barrier") > 0


def test_small_memory_is_the_capacity(selftest):
    out = _run(selftest, NEEDLE_SIM_MEMORY="1MiB")
    assert "switches: memory 1048576," in out and "0 failure(s)" in out


@pytest.mark.parametrize(
    "name, value",
    [
        ("NEEDLE_SIM_MEMORY", "lots"),
        ("NEEDLE_SIM_MEMORY", "-5"),
        ("NEEDLE_SIM_MEMORY", "12TB!"),
        ("NEEDLE_SIM_MAX_BLOCKS", "many"),
        ("NEEDLE_SIM_MAX_BLOCKS", "-1"),
        ("NEEDLE_SIM_PERTURB", "yes"),
    ],
)
def test_malformed_switch_leaves_no_device(selftest, name, value):
    out = _run(selftest, **{name: value})
    assert f"{name}={value}" in out and "invalid argument" in out
    assert "0 failure(s)" in out
