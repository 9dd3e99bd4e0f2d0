/* cpu_loops_avx2.c: the CPU backend's inner loops compiled for x86-64-v3
 * (AVX2 + FMA); run only where cpu_isa.c found that level. See cpu_loops.inc. */
#include "cpu_loops.h"

#ifdef ND_CPU_LOOPS_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("arch=x86-64-v3"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#endif
/* x86-64-v3 and up have F16C (cpu_loops.inc converts float16 with it); the
 * vector width sizes the float64 GEMM tile. */
#define ND_LOOPS_F16C 1
#define ND_LOOPS_VECTOR_BYTES 32
#define ND_LOOPS_TABLE nd_cpu_loops_avx2
#include "cpu_loops.inc"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
/* ISO C forbids an empty translation unit. */
typedef int nd_cpu_loops_avx2_unused;
#endif
