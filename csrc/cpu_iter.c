/* cpu_iter.c: preparation and traversal of strided iteration spaces for the
 * CPU kernels (see cpu_iter.h). */
#include "cpu_iter.h"

#include <string.h>

static int64_t abs64(int64_t v) { return v < 0 ? -v : v; }

void nd_iter_prepare(nd_iter *it, const int64_t *shape, int ndim, int nops,
                     const nd_layout *const *layouts, int order_by) {
    int64_t dims[ND_MAX_DIMS];
    int64_t strides[ND_ITER_MAX_OPS][ND_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        dims[n] = shape[d];
        for (int op = 0; op < nops; op++) strides[op][n] = layouts[op] ? layouts[op]->strides[d] : 0;
        n++;
    }
    /* Stable insertion sort: outermost first by the chosen operand's stride. */
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && abs64(strides[order_by][j - 1]) < abs64(strides[order_by][j]); j--) {
            int64_t t = dims[j];
            dims[j] = dims[j - 1];
            dims[j - 1] = t;
            for (int op = 0; op < nops; op++) {
                t = strides[op][j];
                strides[op][j] = strides[op][j - 1];
                strides[op][j - 1] = t;
            }
        }
    }
    memset(it, 0, sizeof *it);
    it->nops = nops;
    if (n == 0) {
        it->ndim = 1;
        it->shape[0] = 1;
        return;
    }
    /* Merge dim i into dim i+1 when every operand steps through both as one. */
    int out = 0;
    it->shape[0] = dims[0];
    for (int op = 0; op < nops; op++) it->strides[op][0] = strides[op][0];
    for (int d = 1; d < n; d++) {
        int mergeable = 1;
        for (int op = 0; op < nops; op++)
            if (it->strides[op][out] != strides[op][d] * dims[d]) mergeable = 0;
        if (mergeable) {
            it->shape[out] *= dims[d];
            for (int op = 0; op < nops; op++) it->strides[op][out] = strides[op][d];
        } else {
            out++;
            it->shape[out] = dims[d];
            for (int op = 0; op < nops; op++) it->strides[op][out] = strides[op][d];
        }
    }
    it->ndim = out + 1;
}

void nd_iter_run(const nd_iter *it, float *const *base, nd_inner_fn fn, const void *ctx) {
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
            p[op] = base[op] + off;
        }
        fn(it->shape[inner], p, s, ctx);
        for (int d = inner - 1; d >= 0; d--) {
            if (++index[d] < it->shape[d]) break;
            index[d] = 0;
        }
    }
}
