/* cpu_optim.c: the CPU backend's fused optimizer updates (optim_update.h):
 * the current ISA's loops (cpu_optim.inc) split over threads. Elements are
 * independent, so the split never changes a result. A capturable Adam
 * step's counter increment and its state-read coefficients are here too.
 */
#include "cpu_loops.h"
#include "optim_update.h"

/* Fewer elements than this per thread are not worth a thread: an element
 * is about a nanosecond of memory traffic, starting and joining a thread
 * tens of microseconds (on a loaded 2-core machine one thread ran the
 * course's parameters, 65k-320k elements each, as fast as two). */
#define GRAIN_ELEMENTS ((int64_t)1 << 18)

/* A capturable step's state ([t, lr], host memory here) is read when the
 * update runs, as the GPU kernel reads it: the same bias corrections, from
 * the same inline function, so both give the same bits. */
nd_status nd_cpu_adam_update(const nd_adam_desc *d) {
    if (d->count) {
        d->state[0] += 1.0;
        return ND_OK;
    }
    nd_adam_desc local = *d;
    if (d->state != NULL) {
        local.hyper.lr = d->state[1];
        local.hyper.bias_correction1 = nd_adam_bias_correction_inline(d->hyper.beta1, d->state[0]);
        local.hyper.bias_correction2 = nd_adam_bias_correction_inline(d->hyper.beta2, d->state[0]);
    }
    nd_cpu_parallel_for(local.n, GRAIN_ELEMENTS, nd_cpu_loops_current()->adam_update, &local);
    return ND_OK;
}

nd_status nd_cpu_sgd_update(const nd_sgd_desc *d) {
    nd_cpu_parallel_for(d->n, GRAIN_ELEMENTS, nd_cpu_loops_current()->sgd_update, (void *)d);
    return ND_OK;
}
