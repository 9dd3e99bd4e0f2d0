/* runtime.c: the one needle_runtime of the process (runtime.h says what it
 * holds and why), with its starting values: empty registry lists, the
 * collector able to see needle's objects, the scoped collection on. */
#include "runtime.h"

needle_runtime needle_rt = {
    .autograd =
        {
            .values = {&needle_rt.autograd.values, &needle_rt.autograd.values, 0, 0, 0, 0},
            .ops = {&needle_rt.autograd.ops, &needle_rt.autograd.ops, 0, 0, 0, 0},
            .gc_visible = 1,
        },
    .scoped = {.enabled = 1},
    .blas = {.description = "needle's built-in GEMM"},
};
