/* cpu_optim.c: the CPU backend's fused optimizer updates (optim_update.h):
 * the current ISA's loops (cpu_optim.inc) split over threads. Elements are
 * independent, so the split never changes a result.
 */
#include "cpu_loops.h"
#include "optim_update.h"

/* Fewer elements than this per thread are not worth a thread: an element
 * is about a nanosecond of memory traffic, starting and joining a thread
 * tens of microseconds (on a loaded 2-core machine one thread ran the
 * course's parameters, 65k-320k elements each, as fast as two). */
#define GRAIN_ELEMENTS ((int64_t)1 << 18)

nd_status nd_cpu_adam_update(const nd_adam_desc *d) {
    nd_cpu_parallel_for(d->n, GRAIN_ELEMENTS, nd_cpu_loops_current()->adam_update, (void *)d);
    return ND_OK;
}

nd_status nd_cpu_sgd_update(const nd_sgd_desc *d) {
    nd_cpu_parallel_for(d->n, GRAIN_ELEMENTS, nd_cpu_loops_current()->sgd_update, (void *)d);
    return ND_OK;
}
