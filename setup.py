"""Builds the needle_c extension: the engine (csrc/) and its CPython binding
(needle_c/) as one module, with the CUDA backend (csrc/cuda/) when it can.

Environment:
  NEEDLE_STRICT=1   compile our sources with -Werror (CI sets it); nvcc gets
                    -Werror all-warnings and -Werror for its host compiler
  NEEDLE_DEBUG=1    -O0 -g, for debugging the C code (nvcc: -g -lineinfo)
  NEEDLE_CUDA=auto  build the CUDA backend when nvcc is found (the default);
                    an nvcc that fails (its --version, or compiling
                    csrc/cuda) gives a CPU-only build with a warning;
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
                    (csrc/cuda/sim/sim_internal.h, docs/cuda.md)
  NEEDLE_SANITIZE=1 build needle_c with AddressSanitizer and UBSan
                    (-fsanitize=address,undefined, no recovery, -O1 -g) and
                    without CUDA; run Python with the sanitizer runtime
                    preloaded: see tests/sanitize.sh
  NEEDLE_CUDA_ARCH  the GPU architectures to compile for, e.g. "80;90"; each
                    must be one the toolkit lists (nvcc --list-gpu-code), else
                    the build stops (default: those of 70;75;80;86;89;90 the
                    toolkit compiles for: sm_70..sm_90 with CUDA 12, sm_75..sm_90
                    with CUDA 13, which has no Volta; the PTX of the highest one
                    is always embedded, so newer GPUs run it through the
                    driver's JIT). The list is compiled into the backend, and
                    device discovery leaves out a GPU it has no code for
                    (csrc/cuda_arch.c: ndl.cuda.unavailable_reason() says so)

The CUDA toolkit is looked for in $CUDA_HOME, $CUDA_PATH, the directory of
the nvcc on PATH, then /usr/local/cuda. Each csrc/cuda/*.cu is compiled by
nvcc into an object file that is linked into needle_c together with the
static CUDA runtime (so the module imports on machines without a CUDA
runtime, driver or GPU; running needs a driver the toolkit's major version
supports: R525+ for CUDA 12, R580+ for CUDA 13). cuBLAS is not linked: the
backend loads the libcublas.so.<major> of the runtime's major version at run
time (NEEDLE_CUBLAS=<path> names it) and falls back to its own SGEMM kernel
where it is missing; the libcublas found here at build time, if any, is
remembered as the first place to look, then the wheel that the `cuda` extra
(nvidia-cublas, CUDA 13) or the `cuda12` extra (nvidia-cublas-cu12) installs,
whose directory needle.cuda hands the loader at import.

`python setup.py cuda_compile --build-temp DIR` compiles csrc/cuda/*.cu with
the same toolkit, architectures and flags as build_ext and stops there (no
link): tests/cuda12_compile.sh runs it with CUDA 12 for sm_70.

Run-time variables are listed in docs/environment.md (NEEDLE_CUBLAS, NEEDLE_MEMORY_LIMIT,
NEEDLE_GC*, and NEEDLE_REQUIRE_CUDA=1 for the tests: CUDA tests fail instead
of skipping when CUDA is unavailable).
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy
from setuptools import Command, Extension, setup
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
    # Arithmetic on a void * (an untyped buffer of some dtype) moves by bytes, not elements.
    "-Wpointer-arith",
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
sources = (
    sorted(glob.glob("needle_c/**/*.c", recursive=True))
    + sorted(glob.glob("csrc/*.c"))
    + sorted(glob.glob("csrc/cpu/*.c"))
)

# ------------------------------------------------------------------------- CUDA

CUDA_SOURCES = sorted(glob.glob("csrc/cuda/*.cu"))
CUDA_HEADERS = sorted(glob.glob("csrc/cuda/*.cuh") + glob.glob("csrc/cuda/*.h"))
SIM_SOURCES = sorted(glob.glob("csrc/cuda/sim/*.cc"))
SIM_HEADERS = sorted(glob.glob("csrc/cuda/sim/*.h"))
# What a default build compiles for, of what the toolkit can: V100, T4, A100, A10/RTX 30,
# L4/RTX 40, H100 (newer GPUs run the embedded compute_90 PTX).
CANDIDATE_ARCHS = ["70", "75", "80", "86", "89", "90"]
# The toolkit majors needle builds with; the simulator stands for CUDA 13 (its
# CUDART_VERSION), which compiles from sm_75 on.
SUPPORTED_CUDA_MAJORS = (12, 13)
SIM_OLDEST_ARCH = 75


class ToolkitError(Exception):
    """The toolkit cannot build the CUDA backend: NEEDLE_CUDA=1 stops, auto builds for the CPU."""


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


def find_cublas(cuda_home, lib_dir, major):
    """The libcublas.so.<major> (the toolkit's major: the runtime needle links) to try first at
    run time: the toolkit's, else a pip-installed nvidia-cublas (nvidia/cu13/lib) or
    nvidia-cublas-cu12 (nvidia/cublas/lib). None when there is none."""
    dirs = [lib_dir, os.path.join(cuda_home, "lib64")]
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia")
        for root in (spec.submodule_search_locations or []) if spec else []:
            dirs += [os.path.join(root, "cu13", "lib"), os.path.join(root, "cublas", "lib")]
    except (ImportError, ValueError):
        pass
    for d in dirs:
        lib = os.path.join(d, f"libcublas.so.{major}")
        if os.path.isfile(lib):
            return os.path.abspath(lib)
    return None


def _run_nvcc(nvcc, option):
    """The output of `nvcc option`; ToolkitError when it cannot be run or fails."""
    try:
        proc = subprocess.run([nvcc, option], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        raise ToolkitError(f"{nvcc} {option} could not run: {err}") from None
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise ToolkitError(
            f"{nvcc} {option} failed (exit {proc.returncode})" + (f": {said[-1]}" if said else "")
        )
    return proc.stdout


def toolkit_version(nvcc):
    """(major, minor) of the toolkit, from `nvcc --version` ("release 12.4, V12.4.131")."""
    out = _run_nvcc(nvcc, "--version")
    match = re.search(r"release (\d+)\.(\d+)", out)
    if match is None:
        raise ToolkitError(f"{nvcc} --version does not say its release: {out.strip()[-200:]!r}")
    version = (int(match.group(1)), int(match.group(2)))
    if version[0] not in SUPPORTED_CUDA_MAJORS:
        raise ToolkitError(
            f"{nvcc} is CUDA {version[0]}.{version[1]}; needle builds with CUDA 12 or 13"
        )
    return version


def toolkit_archs(nvcc):
    """The real architectures the toolkit compiles for (`nvcc --list-gpu-code`): ["75", ...]."""
    archs = re.findall(r"\bsm_(\d+)\b", _run_nvcc(nvcc, "--list-gpu-code"))
    if not archs:
        raise ToolkitError(f"{nvcc} --list-gpu-code lists no sm_XX architecture")
    return archs


def _arch_number(arch):
    return int(re.match(r"\d+", arch).group())


def choose_archs(requested, supported, toolkit):
    """What to compile for: NEEDLE_CUDA_ARCH (each checked against what the toolkit lists; one
    it cannot compile for stops the build, whatever NEEDLE_CUDA says) or the candidates it
    can. `supported` None (the simulator): anything well formed."""
    if requested:
        if supported is not None:
            bad = [a for a in requested if str(_arch_number(a)) not in supported]
            if bad:
                raise SystemExit(
                    f"needle: NEEDLE_CUDA_ARCH={os.environ['NEEDLE_CUDA_ARCH']!r}: {toolkit} "
                    f"cannot compile for sm_{', sm_'.join(bad)} (it compiles for sm_"
                    f"{', sm_'.join(supported)})"
                    + ("; sm_70 (V100) needs CUDA 12" if "70" in bad else "")
                )
        return requested
    if supported is None:
        return [a for a in CANDIDATE_ARCHS if int(a) >= SIM_OLDEST_ARCH]
    archs = [a for a in CANDIDATE_ARCHS if a in supported]
    if not archs:
        raise ToolkitError(f"{toolkit} compiles for none of sm_{', sm_'.join(CANDIDATE_ARCHS)}")
    return archs


def cuda_archs():
    """The architectures NEEDLE_CUDA_ARCH names (None when unset: the toolkit decides); the
    build stops for a malformed value, whether or not CUDA is built this time."""
    text = os.environ.get("NEEDLE_CUDA_ARCH", "").strip()
    if not text:
        return None
    archs = [a.strip().replace(".", "") for a in re.split(r"[;, ]+", text) if a.strip()]
    bad = [a for a in archs if not re.fullmatch(r"\d{2,3}[af]?", a)]
    if bad or not archs:
        raise SystemExit(
            f"needle: NEEDLE_CUDA_ARCH={text!r}: expected compute capabilities such as '80;90' "
            "or '9.0' (sm_XX numbers, optionally with an a or f suffix)"
        )
    return archs


def arch_defines(archs):
    """The build's architecture lists for device discovery's check (csrc/cuda_arch.h): SASS
    for each of `archs`, PTX for the highest (what nvcc_flags embeds)."""
    ptx = max(archs, key=_arch_number)
    return [f'-DNEEDLE_CUDA_SASS="{" ".join(archs)}"', f'-DNEEDLE_CUDA_PTX="{ptx}"']


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
    ptx = max(archs, key=_arch_number)
    flags += ["-gencode", f"arch=compute_{ptx},code=compute_{ptx}"]
    flags += arch_defines(archs)
    if strict:
        flags += ["-Werror", "all-warnings", "-Xcompiler", "-Werror"]
    if cublas:
        flags.append(f'-DNEEDLE_CUBLAS_HINT="{cublas}"')
    return flags


def sim_flags(archs):
    """C++ compiler flags for the simulated build (the .cu files and csrc/cuda/sim); `archs`
    are those a CUDA 13 build would embed, for device discovery's check."""
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
        *arch_defines(archs),
    ]
    if strict:
        flags.append("-Werror")
    return flags


def warn_cpu_only(why):
    """NEEDLE_CUDA=auto and the toolkit failed: say so loudly, and build for the CPU."""
    print(
        f"needle: WARNING: building without CUDA: {why}\n"
        "needle: WARNING: the install goes on CPU-only; NEEDLE_CUDA=1 makes this an error, "
        "NEEDLE_CUDA=0 skips CUDA without this warning",
        file=sys.stderr,
        flush=True,
    )


def cuda_plan():
    """What to do about CUDA: None (skip, with one printed line) or a dict."""
    mode = os.environ.get("NEEDLE_CUDA", "auto").strip().lower() or "auto"
    if mode not in ("auto", "0", "1", "sim"):
        raise SystemExit(f"needle: NEEDLE_CUDA={mode!r}: expected auto, 0, 1 or sim")
    requested = cuda_archs()
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
        archs = choose_archs(requested, None, "the simulator")
        print(
            f"needle: building the CUDA backend for needle's CUDA simulator with {cxx} "
            "(NEEDLE_CUDA=sim: kernels run on the CPU; no cudart, no cuBLAS; it stands for a "
            f"CUDA 13 build for sm_{', sm_'.join(archs)})"
        )
        return {"mode": mode, "sim": True, "cxx": cxx, "archs": archs}
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
    try:
        version = toolkit_version(nvcc)
        toolkit = f"CUDA {version[0]}.{version[1]}"
        archs = choose_archs(requested, toolkit_archs(nvcc), toolkit)
    except ToolkitError as err:
        if mode == "1":
            raise SystemExit(f"needle: NEEDLE_CUDA=1 but the CUDA toolkit failed: {err}") from None
        warn_cpu_only(str(err))
        return None
    cublas = find_cublas(home, lib_dir, version[0])
    cublas_note = (
        f"cuBLAS at run time from {cublas} or the loader's path"
        if cublas
        else f"no libcublas.so.{version[0]} here: loaded at run time if present, else "
        "needle's SGEMM kernel"
    )
    print(
        f"needle: building the CUDA backend with {toolkit} at {home} "
        f"(sm_{', sm_'.join(archs)}); {cublas_note}"
    )
    return {
        "mode": mode,
        "home": home,
        "nvcc": nvcc,
        "lib_dir": lib_dir,
        "archs": archs,
        "cublas": cublas,
        "version": version,
    }


class CudaCompileError(Exception):
    """nvcc (or, for the simulator, the C++ compiler) failed on a csrc/cuda source."""


def compile_cuda(plan, build_temp, force):
    """Compiles csrc/cuda/*.cu (and the simulator's sources) in parallel into build_temp;
    returns the object files. Objects newer than their sources and headers, compiled with the
    same flags, are kept."""
    sim = plan.get("sim", False)
    out_dir = os.path.join(build_temp, "cuda-sim" if sim else "cuda")
    os.makedirs(out_dir, exist_ok=True)
    flags = sim_flags(plan["archs"]) if sim else nvcc_flags(plan["archs"], plan["cublas"])
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
            and not force
            and os.path.getmtime(obj) >= max(os.path.getmtime(src), newest_dep)
        )
        jobs.append((src, obj, fresh))
    todo = [(src, obj) for src, obj, fresh in jobs if not fresh]
    if todo:
        compiler = plan["cxx"] if sim else plan["nvcc"]
        target = "the CUDA simulator" if sim else "sm_" + ", sm_".join(plan["archs"])
        # On stderr: pip hides both streams of a build unless -v, but a plain `setup.py` run,
        # `pip -v` and a failed build show it, and the wait is long enough to be named.
        wait = (
            "" if sim else f" (2-4 minutes for all {len(CUDA_SOURCES)}; NEEDLE_CUDA=0 skips CUDA)"
        )
        print(
            f"needle: compiling {len(todo)} CUDA file(s) with {compiler} for {target}{wait}",
            file=sys.stderr,
            flush=True,
        )
        start = time.perf_counter()
        workers = max(1, min(len(todo), os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda job: _compile_one(compiler, flags, sim, *job), todo))
        with open(stamp, "w") as f:
            f.write(" ".join(flags))
        print(
            f"needle: CUDA compile took {time.perf_counter() - start:.1f} s "
            f"({workers} parallel {os.path.basename(compiler)})",
            flush=True,
        )
    return [obj for _, obj, _ in jobs]


def _compile_one(compiler, flags, sim, src, obj):
    """nvcc, or for the simulator the C++ compiler (a .cu is read as C++)."""
    lang = ["-x", "c++"] if src.endswith(".cu") and sim else []
    cmd = [compiler, *flags, *lang, "-c", src, "-o", obj]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as err:
        raise CudaCompileError(f"{compiler} could not run on {src}: {err}") from None
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        name = os.path.basename(compiler)
        raise CudaCompileError(f"{name} failed on {src}:\n{' '.join(cmd)}\n{output}")
    if output:
        print(output, file=sys.stderr)


def add_cuda(ext, plan, objects):
    """Links the compiled CUDA backend into ext: its objects, NEEDLE_WITH_CUDA, and the
    runtime (the static CUDA runtime, or the simulator's C++ runtime)."""
    ext.extra_objects = list(ext.extra_objects or []) + objects
    ext.define_macros = list(ext.define_macros) + [("NEEDLE_WITH_CUDA", "1")]
    # A changed .cu must relink the module, not only recompile its object.
    ext.depends = list(ext.depends) + CUDA_SOURCES + CUDA_HEADERS
    if plan.get("sim"):
        # No CUDA runtime: the simulator is C++ (its runtime needs libstdc++ and threads).
        ext.libraries = ["m", "pthread", "dl", "stdc++"]
        ext.depends += SIM_SOURCES + SIM_HEADERS
    else:
        # The static runtime needs librt, libpthread and libdl, and nvcc's host code the
        # C++ runtime (exception personality, static-init guards); cuBLAS is dlopen'ed.
        ext.libraries = ["m", "cudart_static", "rt", "pthread", "dl", "stdc++"]
        ext.library_dirs = list(ext.library_dirs) + [plan["lib_dir"]]


class BuildExt(build_ext):
    """build_ext that first compiles csrc/cuda/*.cu with nvcc (in parallel) and links
    the objects into needle_c; with NEEDLE_CUDA=auto, a failing nvcc gives a CPU-only
    needle_c and a warning instead of a failed install."""

    cuda = None  # set below from cuda_plan()

    def build_extension(self, ext):
        plan = self.cuda
        if plan is not None and ext.name == "needle_c":
            try:
                objects = compile_cuda(plan, self.build_temp, self.force)
            except CudaCompileError as err:
                if plan["mode"] != "auto":
                    raise SystemExit(f"needle: {err}") from None
                warn_cpu_only(str(err))
                self.force = True  # relink whatever a CUDA build left there
            else:
                add_cuda(ext, plan, objects)
        super().build_extension(ext)


class CudaCompile(Command):
    """Compiles csrc/cuda/*.cu exactly as build_ext would (toolkit, architectures, flags) and
    stops there: the compile-only check of another toolkit (tests/cuda12_compile.sh)."""

    description = "compile csrc/cuda/*.cu with the toolkit's nvcc, without linking"
    user_options = [("build-temp=", None, "directory for the object files")]

    def initialize_options(self):
        self.build_temp = None

    def finalize_options(self):
        if not self.build_temp:
            raise SystemExit("needle: cuda_compile needs --build-temp DIR")

    def run(self):
        plan = BuildExt.cuda
        if plan is None or plan.get("sim"):
            raise SystemExit("needle: cuda_compile needs a CUDA toolkit (NEEDLE_CUDA=1)")
        try:
            objects = compile_cuda(plan, self.build_temp, force=True)
        except CudaCompileError as err:
            raise SystemExit(f"needle: {err}") from None
        print(f"needle: cuda_compile: {len(objects)} object(s) in {self.build_temp}")


BuildExt.cuda = cuda_plan()

define_macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
libraries = ["m", "dl"]
depends = sorted(
    glob.glob("csrc/*.h")
    + glob.glob("csrc/*.inc")
    + glob.glob("csrc/cpu/*.h")
    + glob.glob("csrc/cpu/*.inc")
    + glob.glob("needle_c/**/*.h", recursive=True)
)

needle_c = Extension(
    "needle_c",
    sources=sources,
    include_dirs=[numpy.get_include(), "needle_c", "csrc"],
    define_macros=define_macros,
    extra_compile_args=compile_args,
    extra_link_args=link_args,
    libraries=libraries,
    depends=depends,
)

setup(ext_modules=[needle_c], cmdclass={"build_ext": BuildExt, "cuda_compile": CudaCompile})
