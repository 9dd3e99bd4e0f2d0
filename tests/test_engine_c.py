"""Builds and runs the engine's C unit tests (tests/c/test_*.c) against csrc/.

The engine has no Python in it, so its own tests are plain C programs; this
file compiles each with the project's warning flags and checks it passes. The
engine's sources are compiled once for all the programs (in parallel, one job a
core) and each program links against those objects.
Under tests/sanitize.sh (NEEDLE_SANITIZE=1) they are built with AddressSanitizer
and UBSan too, and a sanitizer report fails them.
"""

import concurrent.futures
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
C_TESTS = sorted((ROOT / "tests" / "c").glob("test_*.c"))
ENGINE_SOURCES = sorted((ROOT / "csrc").glob("*.c")) + sorted((ROOT / "csrc" / "cpu").glob("*.c"))
COMPILER = shutil.which("cc") or shutil.which("gcc")
SANITIZE = (
    ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g"]
    if os.environ.get("NEEDLE_SANITIZE") == "1"
    else []
)


FLAGS = [
    "-std=c11",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Wpointer-arith",
    "-Werror",
    "-fno-math-errno",
    *SANITIZE,
    f"-I{ROOT / 'csrc'}",
]


def _compile(source, obj):
    return subprocess.run(
        [COMPILER, *FLAGS, "-c", str(source), "-o", str(obj)], capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def engine_objects(tmp_path_factory):
    """The engine's sources compiled once, with the programs' flags: their object files."""
    out = tmp_path_factory.mktemp("engine")
    objects = [out / f"{src.stem}.o" for src in ENGINE_SOURCES]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        builds = list(pool.map(_compile, ENGINE_SOURCES, objects))
    for src, build in zip(ENGINE_SOURCES, builds):
        assert build.returncode == 0, f"compiling {src.name} failed:\n{build.stderr}"
    return objects


@pytest.mark.skipif(COMPILER is None, reason="no C compiler on this machine")
@pytest.mark.parametrize("source", C_TESTS, ids=[p.stem for p in C_TESTS])
def test_c_program(source, tmp_path, engine_objects):
    binary = tmp_path / source.stem
    build = subprocess.run(
        [
            COMPILER,
            *FLAGS,
            str(source),
            *map(str, engine_objects),
            "-lm",
            "-pthread",
            "-o",
            str(binary),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, f"compiling {source.name} failed:\n{build.stderr}"
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{source.name} failed:\n{run.stdout}\n{run.stderr}"


def test_c_tests_exist():
    names = {p.name for p in C_TESTS}
    assert "test_engine.c" in names
