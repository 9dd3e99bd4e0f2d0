/* optim_update.h: what the fused optimizer updates hand a backend (the
 * nd_backend slots adam_update and sgd_update), and the CPU's entries.
 *
 * optim_update.c checks shapes, devices, contiguity and aliasing, compacts
 * strided inputs, converts operands to the dtype computed in and allocates
 * param_out, so a backend sees n contiguous elements of one dtype per operand
 * and never fails on valid input. Engine-private, like
 * internal.h: no Python.h.
 */
#ifndef NEEDLE_OPTIM_UPDATE_H
#define NEEDLE_OPTIM_UPDATE_H

#include "internal.h"

#include <math.h>

/* engine.h's Adam step over n elements of dtype (ND_FLOAT32 or ND_FLOAT64,
 * the dtype the arithmetic runs in; every buffer holds it): param_out (n),
 * new; param, grad (n), read only; m, v (n), updated in place. No two of them
 * overlap, except that param and grad may (both are only read), and that
 * param_out IS param (the same pointer) when `state` is set: a capturable
 * step updates the parameter in place, and then grad overlaps nothing.
 *
 * state: NULL (hyper's lr and bias corrections), or the capturable
 * optimizer's [t, lr] (2,) float64 on the device, which the backend reads
 * when the update runs (hyper.state is not used by a backend). count: when
 * nonzero the backend only adds 1 to state[0] (nd_array_adam_count_step): n
 * is 0 and no other field is used. */
typedef struct nd_adam_desc {
    int64_t n;
    nd_dtype dtype;
    void *param_out;
    const void *param, *grad;
    void *m, *v;
    nd_adam_hyper hyper;
    double *state;
    int count;
} nd_adam_desc;

/* engine.h's SGD step over n elements of dtype; u (n) updated in place. */
typedef struct nd_sgd_desc {
    int64_t n;
    nd_dtype dtype;
    void *param_out;
    const void *param, *grad;
    void *u;
    nd_sgd_hyper hyper;
} nd_sgd_desc;

/* Double arithmetic that is the same on the host and in a CUDA kernel:
 * each operation rounded on its own (nvcc would contract a * b + c into an
 * FMA; ISO C mode contracts nothing), fma the IEEE fused one on both. */
#if defined(__CUDACC__)
#define ND_OPTIM_HD __host__ __device__
#else
#define ND_OPTIM_HD
#endif
#if defined(__CUDA_ARCH__)
#define ND_DMUL(a, b) __dmul_rn((a), (b))
#define ND_DADD(a, b) __dadd_rn((a), (b))
#define ND_DSUB(a, b) __dsub_rn((a), (b))
#define ND_DFMA(a, b, c) __fma_rn((a), (b), (c))
#else
#define ND_DMUL(a, b) ((a) * (b))
#define ND_DADD(a, b) ((a) + (b))
#define ND_DSUB(a, b) ((a) - (b))
#define ND_DFMA(a, b, c) fma((a), (b), (c))
#endif

/* (hi, lo) *= (bh, bl) in double-double: the exact product of the high parts
 * (fma gives its rounding error), the cross terms, then renormalised. */
static inline ND_OPTIM_HD void nd_dd_mul(double *hi, double *lo, double bh, double bl) {
    const double p = ND_DMUL(*hi, bh);
    double e = ND_DFMA(*hi, bh, -p);
    e = ND_DADD(e, ND_DADD(ND_DMUL(*hi, bl), ND_DMUL(*lo, bh)));
    const double s = ND_DADD(p, e);
    *lo = ND_DSUB(e, ND_DSUB(s, p));
    *hi = s;
}

/* engine.h's nd_adam_bias_correction, inline for the CUDA kernels: beta**t
 * by binary powering in double-double (relative error about log2(t) * 2^-104
 * before the final rounding, so the double is the correctly rounded power
 * but in near-ties), then 1 - it. t is a whole number >= 0 below 2^53. */
static inline ND_OPTIM_HD double nd_adam_bias_correction_inline(double beta, double t) {
    double rh = 1.0, rl = 0.0, bh = beta, bl = 0.0;
    for (int64_t k = (int64_t)t; k > 0; k >>= 1) {
        if (k & 1) nd_dd_mul(&rh, &rl, bh, bl);
        if (k > 1) nd_dd_mul(&bh, &bl, bh, bl);
    }
    return ND_DSUB(1.0, ND_DADD(rh, rl));
}

/* The CPU backend's entries (cpu_optim.c). */
nd_status nd_cpu_adam_update(const nd_adam_desc *d);
nd_status nd_cpu_sgd_update(const nd_sgd_desc *d);

#endif /* NEEDLE_OPTIM_UPDATE_H */
