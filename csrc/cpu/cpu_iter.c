/* cpu_iter.c: preparation and traversal of strided iteration spaces for the
 * CPU kernels (see cpu_iter.h). */
#include "cpu_iter.h"

#include <string.h>

void nd_iter_prepare(nd_iter *it, const int64_t *shape, int ndim, int nops,
                     const nd_layout *const *layouts, int order_by) {
    memset(it, 0, sizeof *it);
    it->nops = nops;
    it->ndim = nd_coalesce(ndim, shape, nops, layouts, order_by, it->shape, it->strides);
}

void nd_iter_run_sized(const nd_iter *it, void *const *base, const int64_t *itemsize,
                       nd_inner_fn fn, const void *ctx) {
    int nops = it->nops, inner = it->ndim - 1;
    float *p[ND_ITER_MAX_OPS];
    int64_t s[ND_ITER_MAX_OPS];
    int64_t index[ND_MAX_DIMS] = {0};
    for (int op = 0; op < nops; op++) s[op] = it->strides[op][inner];
    int64_t rows = 1;
    for (int d = 0; d < inner; d++) rows *= it->shape[d];
    if (it->shape[inner] == 0 || rows == 0) return;
    for (int64_t row = 0; row < rows; row++) {
        for (int op = 0; op < nops; op++) {
            int64_t off = 0;
            for (int d = 0; d < inner; d++) off += index[d] * it->strides[op][d];
            p[op] = (float *)(void *)((char *)base[op] + off * itemsize[op]);
        }
        fn(it->shape[inner], p, s, ctx);
        for (int d = inner - 1; d >= 0; d--) {
            if (++index[d] < it->shape[d]) break;
            index[d] = 0;
        }
    }
}

void nd_iter_run(const nd_iter *it, float *const *base, nd_inner_fn fn, const void *ctx) {
    static const int64_t float32_sizes[ND_ITER_MAX_OPS] = {4, 4, 4};
    nd_iter_run_sized(it, (void *const *)base, float32_sizes, fn, ctx);
}
