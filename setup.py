"""Builds the needle_c extension: the engine (csrc/) and its CPython binding
(needle_c/) as one module.

Environment:
  NEEDLE_STRICT=1   compile our sources with -Werror (CI sets it)
  NEEDLE_DEBUG=1    -O0 -g, for debugging the C code
"""
import glob
import os

import numpy
from setuptools import Extension, setup

strict = os.environ.get("NEEDLE_STRICT", "0") == "1"
debug = os.environ.get("NEEDLE_DEBUG", "0") == "1"

compile_args = [
    "-std=c11",
    "-O0" if debug else "-O3",
    "-g" if debug else "-g0",
    "-Wall",
    "-Wextra",
    # Lets sqrtf and friends vectorise; needle never reads errno.
    "-fno-math-errno",
    "-fvisibility=hidden",
]
if strict:
    compile_args.append("-Werror")

sources = sorted(glob.glob("needle_c/*.c")) + sorted(glob.glob("csrc/*.c"))

needle_c = Extension(
    "needle_c",
    sources=sources,
    include_dirs=[numpy.get_include(), "csrc"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=compile_args,
    libraries=["m", "dl"],
    depends=sorted(glob.glob("csrc/*.h") + glob.glob("needle_c/*.h")),
)

print("needle: building the CPU backend; the CUDA backend (csrc/cuda) is not part of this build yet")

setup(ext_modules=[needle_c])
