/* cpu_loops_avx512.c: the CPU backend's inner loops compiled for x86-64-v4
 * (AVX-512); run only where cpu_isa.c found that level. See cpu_loops.inc. */
#include "cpu_loops.h"

#ifdef ND_CPU_LOOPS_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("arch=x86-64-v4"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#endif
/* x86-64-v3 and up have F16C (cpu_loops.inc converts float16 with it); the
 * vector width sizes the float64 GEMM tile. */
#define ND_LOOPS_F16C 1
#define ND_LOOPS_VECTOR_BYTES 64
#define ND_LOOPS_TABLE nd_cpu_loops_avx512
#include "cpu_loops.inc"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
/* ISO C forbids an empty translation unit. */
typedef int nd_cpu_loops_avx512_unused;
#endif
