/* cpu_iter.h: how the CPU kernels walk strided operands.
 *
 * A kernel sees an N-d iteration space and up to three operands with their
 * own strides (elements; 0 = broadcast). Size-1 dims are dropped, dims are
 * put in the order that makes the chosen operand's inner stride smallest, and
 * dims that are contiguous for every operand are merged, so most calls become
 * one long inner loop that the compiler vectorises.
 */
#ifndef NEEDLE_CPU_ITER_H
#define NEEDLE_CPU_ITER_H

#include "internal.h"

#define ND_ITER_MAX_OPS ND_COALESCE_MAX_OPS

typedef struct nd_iter {
    int ndim; /* >= 1 after preparation */
    int nops;
    int64_t shape[ND_MAX_DIMS];
    int64_t strides[ND_ITER_MAX_OPS][ND_MAX_DIMS];
} nd_iter;

/* layouts[i] == NULL marks a scalar operand (all strides 0). The dims are
 * ordered by decreasing |stride| of operand order_by. */
void nd_iter_prepare(nd_iter *it, const int64_t *shape, int ndim, int nops,
                     const nd_layout *const *layouts, int order_by);

/* The inner loop: n elements; p[i] points at operand i's first element and
 * s[i] is its inner stride. */
typedef void (*nd_inner_fn)(int64_t n, float **p, const int64_t *s, const void *ctx);

/* Runs fn over every inner row; base[i] is operand i's first element. */
void nd_iter_run(const nd_iter *it, float *const *base, nd_inner_fn fn, const void *ctx);

/* nd_iter_run for operands of any dtype: operand i's elements are
 * itemsize[i] bytes (the strides stay in elements), and fn gets pointers to
 * them typed float * (it casts them back to its storage type). float32 keeps
 * nd_iter_run. */
void nd_iter_run_sized(const nd_iter *it, void *const *base, const int64_t *itemsize,
                       nd_inner_fn fn, const void *ctx);


#endif /* NEEDLE_CPU_ITER_H */
