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

/* engine.h's Adam step over n elements of dtype (ND_FLOAT32 or ND_FLOAT64,
 * the dtype the arithmetic runs in; every buffer holds it): param_out (n),
 * new; param, grad (n), read only; m, v (n), updated in place. No two of them
 * overlap, except that param and grad may (both are only read). */
typedef struct nd_adam_desc {
    int64_t n;
    nd_dtype dtype;
    void *param_out;
    const void *param, *grad;
    void *m, *v;
    nd_adam_hyper hyper;
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

/* The CPU backend's entries (cpu_optim.c). */
nd_status nd_cpu_adam_update(const nd_adam_desc *d);
nd_status nd_cpu_sgd_update(const nd_sgd_desc *d);

#endif /* NEEDLE_OPTIM_UPDATE_H */
