/* cpu_isa.c: which instruction set the CPU kernels run: detected once, the
 * best the CPU supports by default, and the one switch that forces a lower
 * one (needle_c sets it from NEEDLE_CPU_ISA).
 *
 * The GEMM micro-kernels and the elementwise and reduction loops each exist
 * once per ISA; they look up the current ISA here on every call, so changing
 * it takes effect at the next operation. An ISA the CPU lacks is refused here,
 * which is what keeps a forced choice from ending in SIGILL.
 */
#include "internal.h"

#include <string.h>

static const char *const isa_names[ND_CPU_ISA_COUNT] = {
    [ND_CPU_ISA_BASELINE] = "baseline",
    [ND_CPU_ISA_AVX2] = "avx2",
    [ND_CPU_ISA_AVX512] = "avx512",
};

/* -1 until first asked. The caller serialises engine calls (engine.h), and a
 * repeated detection gives the same answer, so no lock is needed. */
static int best_isa = -1;
static int current_isa = -1;

#if defined(__x86_64__) && defined(__GNUC__)
/* libgcc's (and compiler-rt's) detection also checks that the OS saves the
 * vector registers (XCR0), so a CPU with AVX-512 under an OS that does not
 * enable it reports no AVX-512. The level names (GCC 12+) test exactly what
 * "arch=x86-64-v3/v4" code may use; older compilers test the features. */
static int detect_best(void) {
    __builtin_cpu_init();
#if !defined(__clang__) && __GNUC__ >= 12
    if (__builtin_cpu_supports("x86-64-v4")) return ND_CPU_ISA_AVX512;
    if (__builtin_cpu_supports("x86-64-v3")) return ND_CPU_ISA_AVX2;
#else
    int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    if (v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return ND_CPU_ISA_AVX512;
    if (v3) return ND_CPU_ISA_AVX2;
#endif
    return ND_CPU_ISA_BASELINE;
}
#else
static int detect_best(void) { return ND_CPU_ISA_BASELINE; }
#endif

const char *nd_cpu_isa_name(nd_cpu_isa isa) {
    return (int)isa >= 0 && isa < ND_CPU_ISA_COUNT ? isa_names[isa] : NULL;
}

nd_status nd_cpu_isa_from_name(const char *name, nd_cpu_isa *out) {
    for (int i = 0; i < ND_CPU_ISA_COUNT; i++) {
        if (name != NULL && strcmp(name, isa_names[i]) == 0) {
            *out = (nd_cpu_isa)i;
            return ND_OK;
        }
    }
    return nd_fail(ND_ERR_VALUE, "unknown CPU instruction set '%.40s' (expected %s, %s or %s)",
                   name ? name : "(null)", isa_names[ND_CPU_ISA_AVX512], isa_names[ND_CPU_ISA_AVX2],
                   isa_names[ND_CPU_ISA_BASELINE]);
}

nd_cpu_isa nd_cpu_isa_best(void) {
    if (best_isa < 0) best_isa = detect_best();
    return (nd_cpu_isa)best_isa;
}

int nd_cpu_isa_supported(nd_cpu_isa isa) {
    return (int)isa >= 0 && isa < ND_CPU_ISA_COUNT && (int)isa <= (int)nd_cpu_isa_best();
}

nd_cpu_isa nd_cpu_isa_current(void) {
    if (current_isa < 0) current_isa = (int)nd_cpu_isa_best();
    return (nd_cpu_isa)current_isa;
}

nd_status nd_cpu_isa_limit(nd_cpu_isa ceiling) {
    if ((int)ceiling < 0 || ceiling >= ND_CPU_ISA_COUNT)
        return nd_fail(ND_ERR_VALUE, "unknown CPU instruction set %d", (int)ceiling);
    if ((int)ceiling < (int)nd_cpu_isa_best()) best_isa = (int)ceiling;
    if ((int)nd_cpu_isa_current() > best_isa) current_isa = best_isa;
    return ND_OK;
}

nd_status nd_cpu_set_isa(nd_cpu_isa isa) {
    if ((int)isa < 0 || isa >= ND_CPU_ISA_COUNT)
        return nd_fail(ND_ERR_VALUE, "unknown CPU instruction set %d", (int)isa);
    if (!nd_cpu_isa_supported(isa))
        return nd_fail(ND_ERR_VALUE, "this CPU cannot run %s kernels (the best it runs: %s)",
                       isa_names[isa], isa_names[nd_cpu_isa_best()]);
    current_isa = (int)isa;
    return ND_OK;
}
