"""Builds the needle_c extension: the engine (csrc/) and its CPython binding
(needle_c/) as one module, with the CUDA backend (csrc/cuda/) when it can.

Environment:
  NEEDLE_STRICT=1   compile our sources with -Werror (CI sets it); nvcc gets
                    -Werror all-warnings and -Werror for its host compiler
  NEEDLE_DEBUG=1    -O0 -g, for debugging the C code (nvcc: -g -lineinfo)
  NEEDLE_CUDA=auto  build the CUDA backend when nvcc is found (the default);
                    1: it must be built (the build fails loudly if it cannot);
                    0: never;
                    sim: build it for needle's CUDA simulator instead of a GPU:
                    csrc/cuda/*.cu compiled by the C++ compiler ($CXX, else
                    g++; -x c++ -std=c++17 -DNEEDLE_CUDA_SIM) against the
                    stand-in runtime in csrc/cuda/sim, which runs every kernel
                    on the CPU (each CUDA thread a fiber, so barriers and warp
                    shuffles are real) with simulated device memory. No
                    toolkit, cudart or cuBLAS (the SGEMM kernel always runs);
                    needle_c._cuda_simulated() is True and
                    ndl.cuda.get_device_name() says "needle CUDA simulator
                    (CPU)". For testing the CUDA code in CI (tests/cuda_sim.sh),
                    not for speed: it sees no streams, asynchrony, timing,
                    cuBLAS or GPU arithmetic. Run-time switches:
                    NEEDLE_SIM_MEMORY, NEEDLE_SIM_MAX_BLOCKS, NEEDLE_SIM_PERTURB
                    (csrc/cuda/sim/sim_internal.h, README.md)
  NEEDLE_SANITIZE=1 build needle_c with AddressSanitizer and UBSan
                    (-fsanitize=address,undefined, no recovery, -O1 -g) and
                    without CUDA; run Python with the sanitizer runtime
                    preloaded: see tests/sanitize.sh
  NEEDLE_CUDA_ARCH  the GPU architectures to compile for, e.g. "80;90"
                    (default: 75;80;86;89;90, plus compute_90 PTX; the PTX of
                    the highest one listed is always embedded)

The CUDA toolkit is looked for in $CUDA_HOME, $CUDA_PATH, the directory of
the nvcc on PATH, then /usr/local/cuda. Each csrc/cuda/*.cu is compiled by
nvcc into an object file that is linked into needle_c together with the
static CUDA runtime (so the module imports on machines without a CUDA
runtime, driver or GPU; running needs a driver of the R580 branch or newer,
which CUDA 13 requires). cuBLAS is not linked: the backend loads it at run
time (NEEDLE_CUBLAS=<path> names it) and falls back to its own SGEMM kernel
where it is missing; the libcublas found here at build time, if any, is
remembered as the first place to look, then the nvidia-cublas wheel that the
`cuda` extra installs (pip install ".[cuda]"), whose directory needle.cuda
hands the loader at import.

Run-time variables are listed in README.md (NEEDLE_CUBLAS, NEEDLE_MEMORY_LIMIT,
NEEDLE_GC*, and NEEDLE_REQUIRE_CUDA=1 for the tests: CUDA tests fail instead
of skipping when CUDA is unavailable).
"""

import glob
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def build_switch(name):
    """A build switch: 1 (on), 0 or unset/empty (off); the build stops for anything else,
    so that NEEDLE_STRICT=yes does not build quietly without -Werror."""
    text = os.environ.get(name, "").strip()
    if text not in ("", "0", "1"):
        raise SystemExit(f"needle: {name}={text!r}: expected 1 (on) or 0 (off, the default)")
    return text == "1"


strict = build_switch("NEEDLE_STRICT")
debug = build_switch("NEEDLE_DEBUG")
sanitize = build_switch("NEEDLE_SANITIZE")
SANITIZE_FLAGS = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
]

compile_args = [
    "-std=c11",
    "-O0" if debug else "-O1" if sanitize else "-O3",
    "-g" if debug or sanitize else "-g0",
    "-Wall",
    "-Wextra",
    # Lets sqrtf and friends vectorise; needle never reads errno.
    "-fno-math-errno",
    "-fvisibility=hidden",
]
if strict:
    compile_args.append("-Werror")
link_args = []
if sanitize:
    compile_args += SANITIZE_FLAGS
    link_args += SANITIZE_FLAGS

# needle_c/ is grouped by idea: array/ (the NDArray binding), autograd/ (Tensor, Op,
# backward, the ops), memory/ (statistics, the collection policy); headers are
# included relative to needle_c/ and csrc/.
sources = sorted(glob.glob("needle_c/**/*.c", recursive=True)) + sorted(glob.glob("csrc/*.c"))

# ------------------------------------------------------------------------- CUDA

CUDA_SOURCES = sorted(glob.glob("csrc/cuda/*.cu"))
CUDA_HEADERS = sorted(glob.glob("csrc/cuda/*.cuh") + glob.glob("csrc/cuda/*.h"))
SIM_SOURCES = sorted(glob.glob("csrc/cuda/sim/*.cc"))
SIM_HEADERS = sorted(glob.glob("csrc/cuda/sim/*.h"))
DEFAULT_ARCHS = ["75", "80", "86", "89", "90"]


def _cuda_lib_dir(home):
    """The directory that holds libcudart_static.a under a toolkit, or None."""
    for sub in (
        "lib64",
        "lib",
        os.path.join("targets", "x86_64-linux", "lib"),
        os.path.join("targets", "sbsa-linux", "lib"),
    ):
        path = os.path.join(home, sub)
        if os.path.isfile(os.path.join(path, "libcudart_static.a")):
            return path
    return None


def _toolkit_at(home):
    """(home, nvcc, lib_dir) when home is a usable CUDA toolkit, else None."""
    if not home:
        return None
    nvcc = os.path.join(home, "bin", "nvcc")
    include = os.path.join(home, "include", "cuda_runtime.h")
    lib_dir = _cuda_lib_dir(home)
    if os.path.isfile(nvcc) and os.path.isfile(include) and lib_dir:
        return home, nvcc, lib_dir
    return None


def find_cuda():
    """The first usable toolkit, and the places looked at (for messages)."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates.append("/usr/local/cuda")
    looked = [c for c in candidates if c]
    for home in looked:
        found = _toolkit_at(home)
        if found:
            return found, looked
    return None, looked


def find_cublas(cuda_home, lib_dir):
    """A libcublas.so.* to try first at run time: the toolkit's, else a pip-installed
    nvidia-cublas (nvidia/cu13/lib, nvidia/cublas/lib). None when there is none."""
    dirs = [lib_dir, os.path.join(cuda_home, "lib64")]
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia")
        for root in (spec.submodule_search_locations or []) if spec else []:
            dirs += [os.path.join(root, "cu13", "lib"), os.path.join(root, "cublas", "lib")]
    except (ImportError, ValueError):
        pass
    for d in dirs:
        # The shortest name is the soname (libcublas.so.13), not a full version.
        libs = sorted(glob.glob(os.path.join(d, "libcublas.so.*[0-9]")), key=len)
        if libs:
            return os.path.abspath(libs[0])
    return None


def cuda_archs():
    """The architectures NEEDLE_CUDA_ARCH names (the defaults when unset); the build stops
    for a malformed value, whether or not CUDA is built this time."""
    text = os.environ.get("NEEDLE_CUDA_ARCH", "").strip()
    if not text:
        return DEFAULT_ARCHS
    archs = [a.strip().replace(".", "") for a in re.split(r"[;, ]+", text) if a.strip()]
    bad = [a for a in archs if not re.fullmatch(r"\d{2,3}[af]?", a)]
    if bad or not archs:
        raise SystemExit(
            f"needle: NEEDLE_CUDA_ARCH={text!r}: expected compute capabilities such as '80;90' "
            "or '9.0' (sm_XX numbers, optionally with an a or f suffix)"
        )
    return archs


def nvcc_flags(archs, cublas):
    flags = [
        "-O0" if debug else "-O3",
        "-Xcompiler",
        "-fPIC",
        "-std=c++17",
        "--expt-relaxed-constexpr",
        "-Xcompiler",
        "-fvisibility=hidden",
        "-Xcompiler",
        "-Wall,-Wextra",
        "-Icsrc",
        "-DNEEDLE_WITH_CUDA",
    ]
    if debug:
        flags += ["-g", "-lineinfo"]
    for arch in archs:
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    ptx = max(archs, key=lambda a: int(re.match(r"\d+", a).group()))
    flags += ["-gencode", f"arch=compute_{ptx},code=compute_{ptx}"]
    if strict:
        flags += ["-Werror", "all-warnings", "-Xcompiler", "-Werror"]
    if cublas:
        flags.append(f'-DNEEDLE_CUBLAS_HINT="{cublas}"')
    return flags


def sim_flags():
    """C++ compiler flags for the simulated build (the .cu files and csrc/cuda/sim)."""
    flags = [
        "-std=c++17",
        "-O0" if debug else "-O2",
        "-g" if debug else "-g0",
        "-fPIC",
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
        # The kernels' `#pragma unroll` is for nvcc; g++ does not know it.
        "-Wno-unknown-pragmas",
        "-Icsrc/cuda/sim",  # its cuda_runtime.h stands in for the toolkit's
        "-Icsrc",
        "-DNEEDLE_WITH_CUDA",
        "-DNEEDLE_CUDA_SIM",
    ]
    if strict:
        flags.append("-Werror")
    return flags


def cuda_plan():
    """What to do about CUDA: None (skip, with one printed line) or a dict."""
    mode = os.environ.get("NEEDLE_CUDA", "auto").strip().lower() or "auto"
    if mode not in ("auto", "0", "1", "sim"):
        raise SystemExit(f"needle: NEEDLE_CUDA={mode!r}: expected auto, 0, 1 or sim")
    archs = cuda_archs()
    if sanitize:
        if mode in ("1", "sim"):
            raise SystemExit(
                f"needle: NEEDLE_SANITIZE=1 builds without CUDA; unset NEEDLE_CUDA={mode}"
            )
        print("needle: building without CUDA (NEEDLE_SANITIZE=1)")
        return None
    if mode == "0":
        print("needle: building without CUDA (NEEDLE_CUDA=0)")
        return None
    if mode == "sim":
        cxx = os.environ.get("CXX") or "g++"
        if shutil.which(cxx) is None:
            raise SystemExit(f"needle: NEEDLE_CUDA=sim needs a C++17 compiler; {cxx!r} not found")
        if not CUDA_SOURCES or not SIM_SOURCES:
            raise SystemExit("needle: csrc/cuda not found; run setup.py from the repository root")
        return {"sim": True, "cxx": cxx}
    found, looked = find_cuda()
    if found is None:
        where = ", ".join(looked)
        if mode == "1":
            raise SystemExit(
                "needle: NEEDLE_CUDA=1 but no usable CUDA toolkit was found (need "
                f"bin/nvcc, include/cuda_runtime.h and libcudart_static.a; looked in: "
                f"{where}); set CUDA_HOME"
            )
        print(f"needle: building without CUDA (no CUDA toolkit with nvcc found in: {where})")
        return None
    home, nvcc, lib_dir = found
    if not CUDA_SOURCES:
        raise SystemExit("needle: csrc/cuda/*.cu not found; run setup.py from the repository root")
    cublas = find_cublas(home, lib_dir)
    return {"home": home, "nvcc": nvcc, "lib_dir": lib_dir, "archs": archs, "cublas": cublas}


class BuildExt(build_ext):
    """build_ext that first compiles csrc/cuda/*.cu with nvcc (in parallel) and links
    the objects into needle_c."""

    cuda = None  # set below from cuda_plan()

    def build_extension(self, ext):
        if self.cuda is not None and ext.name == "needle_c":
            ext.extra_objects = list(ext.extra_objects or []) + self._compile_cuda()
        super().build_extension(ext)

    def _compile_cuda(self):
        plan = self.cuda
        sim = plan.get("sim", False)
        out_dir = os.path.join(self.build_temp, "cuda-sim" if sim else "cuda")
        os.makedirs(out_dir, exist_ok=True)
        flags = sim_flags() if sim else nvcc_flags(plan["archs"], plan["cublas"])
        deps = CUDA_HEADERS + sorted(glob.glob("csrc/*.h")) + (SIM_HEADERS if sim else [])
        newest_dep = max((os.path.getmtime(p) for p in deps), default=0.0)
        stamp = os.path.join(out_dir, "flags.txt")
        old_flags = open(stamp).read() if os.path.exists(stamp) else None
        jobs = []
        for src in CUDA_SOURCES + (SIM_SOURCES if sim else []):
            obj = os.path.join(out_dir, os.path.splitext(os.path.basename(src))[0] + ".o")
            fresh = (
                os.path.exists(obj)
                and old_flags == " ".join(flags)
                and not self.force
                and os.path.getmtime(obj) >= max(os.path.getmtime(src), newest_dep)
            )
            jobs.append((src, obj, fresh))
        todo = [(src, obj) for src, obj, fresh in jobs if not fresh]
        if todo:
            compiler = plan["cxx"] if sim else plan["nvcc"]
            target = "the CUDA simulator" if sim else "sm_" + ", sm_".join(plan["archs"])
            print(
                f"needle: compiling {len(todo)} CUDA file(s) with {compiler} for {target}",
                flush=True,
            )
            start = time.perf_counter()
            workers = max(1, min(len(todo), os.cpu_count() or 1))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(lambda job: self._compile_one(compiler, flags, *job), todo))
            with open(stamp, "w") as f:
                f.write(" ".join(flags))
            print(
                f"needle: CUDA compile took {time.perf_counter() - start:.1f} s "
                f"({workers} parallel {os.path.basename(compiler)})",
                flush=True,
            )
        return [obj for _, obj, _ in jobs]

    def _compile_one(self, compiler, flags, src, obj):
        """nvcc, or for the simulator the C++ compiler (a .cu is read as C++)."""
        import subprocess

        lang = ["-x", "c++"] if src.endswith(".cu") and self.cuda.get("sim") else []
        cmd = [compiler, *flags, *lang, "-c", src, "-o", obj]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        output = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            name = os.path.basename(compiler)
            raise SystemExit(f"needle: {name} failed on {src}:\n{' '.join(cmd)}\n{output}")
        if output:
            print(output, file=sys.stderr)


cuda = cuda_plan()
BuildExt.cuda = cuda

define_macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
libraries = ["m", "dl"]
library_dirs = []
depends = sorted(glob.glob("csrc/*.h") + glob.glob("needle_c/**/*.h", recursive=True))
if cuda is not None and cuda.get("sim"):
    define_macros.append(("NEEDLE_WITH_CUDA", "1"))
    # No CUDA runtime: the simulator is C++ (its runtime needs libstdc++ and threads).
    libraries = ["m", "pthread", "dl", "stdc++"]
    depends += CUDA_SOURCES + CUDA_HEADERS + SIM_SOURCES + SIM_HEADERS
    print(
        f"needle: building the CUDA backend for needle's CUDA simulator with {cuda['cxx']} "
        "(NEEDLE_CUDA=sim: kernels run on the CPU; no cudart, no cuBLAS)"
    )
elif cuda is not None:
    define_macros.append(("NEEDLE_WITH_CUDA", "1"))
    # The static runtime needs librt, libpthread and libdl, and nvcc's host code the
    # C++ runtime (exception personality, static-init guards); cuBLAS is dlopen'ed.
    libraries = ["m", "cudart_static", "rt", "pthread", "dl", "stdc++"]
    library_dirs = [cuda["lib_dir"]]
    # A changed .cu must relink the module, not only recompile its object.
    depends += CUDA_SOURCES + CUDA_HEADERS
    cublas_note = (
        f"cuBLAS at run time from {cuda['cublas']} or the loader's path"
        if cuda["cublas"]
        else "cuBLAS not found here: loaded at run time if present, else needle's SGEMM kernel"
    )
    archs = ", sm_".join(cuda["archs"])
    print(f"needle: building the CUDA backend with {cuda['home']} (sm_{archs}); {cublas_note}")

needle_c = Extension(
    "needle_c",
    sources=sources,
    include_dirs=[numpy.get_include(), "needle_c", "csrc"],
    define_macros=define_macros,
    extra_compile_args=compile_args,
    extra_link_args=link_args,
    libraries=libraries,
    library_dirs=library_dirs,
    depends=depends,
)

setup(ext_modules=[needle_c], cmdclass={"build_ext": BuildExt})
