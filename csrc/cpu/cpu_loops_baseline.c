/* cpu_loops_baseline.c: the CPU backend's inner loops for the compiler's
 * default target (any x86-64, or any other CPU). See cpu_loops.inc. */
#define ND_LOOPS_TABLE nd_cpu_loops_baseline
#include "cpu_loops.inc"
