/* cpu_gather.c: the host kernels of row indexing (embedding lookups and
 * their gradient): gather rows of a table by index, and add rows into a table
 * by index.
 *
 * Indices arrive as float32 (every array is float32), so each one is checked
 * to be an integer in range before the first write: a bad index leaves the
 * output untouched, which the in-place scatter relies on.
 */
#include "internal.h"

#include <string.h>

nd_status nd_cpu_check_indices(const nd_layout *idx_layout, const float *idx, int64_t count,
                               const char *what, const char *unit) {
    const float *p = idx + idx_layout->offset;
    int64_t n = idx_layout->shape[0], stride = idx_layout->strides[0];
    for (int64_t r = 0; r < n; r++)
        if (!nd_index_ok(p[r * stride], count))
            return nd_index_error(what, p[r * stride], count, unit);
    return ND_OK;
}

nd_status nd_cpu_gather_rows(const nd_layout *out_layout, float *out, const nd_layout *table_layout,
                             const float *table, const nd_layout *idx_layout, const float *idx) {
    nd_status status =
        nd_cpu_check_indices(idx_layout, idx, table_layout->shape[0], "index", "rows");
    /* Zero-width rows: the buffers may be NULL, and there is nothing to copy. */
    if (status != ND_OK || table_layout->shape[1] == 0) return status;
    const float *ip = idx + idx_layout->offset, *t = table + table_layout->offset;
    float *o = out + out_layout->offset;
    int64_t n = idx_layout->shape[0], d = table_layout->shape[1], is = idx_layout->strides[0];
    int64_t ts0 = table_layout->strides[0], ts1 = table_layout->strides[1];
    int64_t os0 = out_layout->strides[0], os1 = out_layout->strides[1];
    for (int64_t r = 0; r < n; r++) {
        const float *src = t + (int64_t)ip[r * is] * ts0;
        float *dst = o + r * os0;
        if (ts1 == 1 && os1 == 1) {
            memcpy(dst, src, (size_t)d * sizeof(float));
        } else {
            for (int64_t j = 0; j < d; j++) dst[j * os1] = src[j * ts1];
        }
    }
    return ND_OK;
}

nd_status nd_cpu_scatter_add_rows(const nd_layout *out_layout, float *out,
                                  const nd_layout *src_layout, const float *src,
                                  const nd_layout *idx_layout, const float *idx) {
    nd_status status = nd_cpu_check_indices(idx_layout, idx, out_layout->shape[0], "index", "rows");
    if (status != ND_OK || out_layout->shape[1] == 0) return status;
    const float *ip = idx + idx_layout->offset, *s = src + src_layout->offset;
    float *o = out + out_layout->offset;
    int64_t n = idx_layout->shape[0], d = out_layout->shape[1], is = idx_layout->strides[0];
    int64_t ss0 = src_layout->strides[0], ss1 = src_layout->strides[1];
    int64_t os0 = out_layout->strides[0], os1 = out_layout->strides[1];
    /* Rows in index order, one after another: repeated indices accumulate in
     * a fixed order, so results are reproducible. */
    for (int64_t r = 0; r < n; r++) {
        float *dst = o + (int64_t)ip[r * is] * os0;
        const float *row = s + r * ss0;
        if (os1 == 1 && ss1 == 1) {
            for (int64_t j = 0; j < d; j++) dst[j] += row[j];
        } else {
            for (int64_t j = 0; j < d; j++) dst[j * os1] += row[j * ss1];
        }
    }
    return ND_OK;
}
