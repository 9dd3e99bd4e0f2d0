/* gather.c: the device-independent front end of row indexing (embedding
 * lookups and their gradient): checks shapes and devices, turns any-shaped
 * index and source arrays into the 1-D and 2-D views the kernels take,
 * allocates results, and dispatches to the device's backend.
 */
#include "internal.h"

#include <string.h>

nd_status nd_index_error(const char *what, float v, int64_t count, const char *unit) {
    if (v != v) return nd_fail(ND_ERR_INDEX, "%s nan is not an integer", what);
    if (!((double)v >= 0.0 && (double)v < (double)count))
        return nd_fail(ND_ERR_INDEX, "%s %g is out of range for %lld %s", what, (double)v,
                       (long long)count, unit);
    return nd_fail(ND_ERR_INDEX, "%s %g is not an integer", what, (double)v);
}

/* a seen with shape (ndim, shape): a view when the layout allows one, else
 * a compact copy held in *tmp (which the caller releases). force_copy: a
 * copy even when a view would do, for a source that aliases the output. */
static nd_status reshaped(const nd_array *a, int ndim, const int64_t *shape, int force_copy,
                          nd_array *view, nd_array *tmp) {
    memset(tmp, 0, sizeof *tmp);
    view->storage = a->storage;
    nd_status status = force_copy ? ND_ERR_NOT_VIEWABLE
                                  : nd_layout_reshape(&a->layout, ndim, shape, &view->layout);
    if (status != ND_ERR_NOT_VIEWABLE) return status;
    if ((status = nd_array_compact_copy(a, NULL, tmp)) != ND_OK) return status;
    view->storage = tmp->storage;
    status = nd_layout_reshape(&tmp->layout, ndim, shape, &view->layout);
    if (status != ND_OK) nd_array_release(tmp);
    return status;
}

static nd_status index_ndim_ok(const nd_array *indices) {
    if (indices->layout.ndim + 1 > ND_MAX_DIMS)
        return nd_fail(ND_ERR_SHAPE, "indices have at most %d dimensions, got %d", ND_MAX_DIMS - 1,
                       indices->layout.ndim);
    return ND_OK;
}

nd_status nd_array_gather_rows(const nd_array *table, const nd_array *indices, nd_array *out) {
    memset(out, 0, sizeof *out);
    const nd_array *in[2] = {table, indices};
    if (nd_island_needed(2, in)) { /* dtype_island.c: rows in the table's dtype */
        nd_island is = {0};
        nd_status status = nd_island_enter(&is, 2, in);
        if (status == ND_OK) status = nd_array_gather_rows(in[0], in[1], out);
        nd_island_release(&is);
        return status == ND_OK ? nd_island_leave(out, table->storage->dtype) : status;
    }
    nd_status status = nd_same_device(table, indices);
    if (status != ND_OK) return status;
    if (table->layout.ndim != 2)
        return nd_fail(ND_ERR_SHAPE, "gather_rows: the table must be 2-D (rows, dim), got %d-D",
                       table->layout.ndim);
    if ((status = index_ndim_ok(indices)) != ND_OK) return status;
    const nd_backend *backend = table->storage->device->backend;
    if (backend->gather_rows == NULL)
        return nd_fail(ND_ERR_DEVICE, "gather_rows is not supported on %s()",
                       table->storage->device->name);
    int nd = indices->layout.ndim;
    int64_t n = nd_layout_numel(&indices->layout), d = table->layout.shape[1];
    int64_t out_shape[ND_MAX_DIMS];
    memcpy(out_shape, indices->layout.shape, sizeof(int64_t) * (size_t)nd);
    out_shape[nd] = d;
    nd_array idx, idx_tmp;
    if ((status = reshaped(indices, 1, &n, 0, &idx, &idx_tmp)) != ND_OK) return status;
    status = nd_array_empty(table->storage->device, nd + 1, out_shape, out);
    if (status == ND_OK) {
        nd_layout rows;
        nd_layout_contiguous(2, (int64_t[]){n, d}, &rows);
        status = backend->gather_rows(&rows, nd_storage_f32(out->storage), &table->layout,
                                      nd_storage_f32(table->storage), &idx.layout,
                                      nd_storage_f32(idx.storage));
        if (status != ND_OK) nd_array_release(out);
    }
    if (idx_tmp.storage != NULL) nd_array_release(&idx_tmp);
    return status;
}

static nd_status scatter_shapes(const nd_array *src, const nd_array *indices, int64_t d) {
    nd_status status = index_ndim_ok(indices);
    if (status != ND_OK) return status;
    int nd = indices->layout.ndim;
    if (src->layout.ndim != nd + 1 ||
        memcmp(src->layout.shape, indices->layout.shape, sizeof(int64_t) * (size_t)nd) != 0 ||
        src->layout.shape[nd] != d)
        return nd_fail(ND_ERR_SHAPE,
                       "scatter_add_rows: the source must have the indices' shape plus (%lld,)",
                       (long long)d);
    return ND_OK;
}

nd_status nd_array_scatter_add_rows_into(const nd_array *dst, const nd_array *src,
                                         const nd_array *indices) {
    const nd_array *in[3] = {dst, src, indices};
    if (nd_island_needed(3, in)) { /* dtype_island.c: added in float32, written back */
        nd_island is = {0};
        nd_status status = nd_island_enter(&is, 3, in);
        if (status == ND_OK) status = nd_array_scatter_add_rows_into(in[0], in[1], in[2]);
        if (status == ND_OK) status = nd_island_write_back(dst, in[0]);
        nd_island_release(&is);
        return status;
    }
    nd_status status = nd_same_device(dst, src);
    if (status == ND_OK) status = nd_same_device(dst, indices);
    if (status != ND_OK) return status;
    if (dst->layout.ndim != 2)
        return nd_fail(ND_ERR_SHAPE, "scatter_add_rows: the destination must be 2-D, got %d-D",
                       dst->layout.ndim);
    int64_t d = dst->layout.shape[1];
    if ((status = scatter_shapes(src, indices, d)) != ND_OK) return status;
    const nd_backend *backend = dst->storage->device->backend;
    if (backend->scatter_add_rows == NULL)
        return nd_fail(ND_ERR_DEVICE, "scatter_add_rows is not supported on %s()",
                       dst->storage->device->name);
    int64_t n = nd_layout_numel(&indices->layout);
    nd_array rows, rows_tmp, idx, idx_tmp;
    /* Sources that share dst's storage are copied first: the adds would
     * otherwise change rows and indices still to be read. */
    if ((status = reshaped(src, 2, (int64_t[]){n, d}, src->storage == dst->storage, &rows,
                           &rows_tmp)) != ND_OK)
        return status;
    status = reshaped(indices, 1, &n, indices->storage == dst->storage, &idx, &idx_tmp);
    if (status == ND_OK) {
        status = backend->scatter_add_rows(&dst->layout, nd_storage_f32(dst->storage), &rows.layout,
                                           nd_storage_f32(rows.storage), &idx.layout,
                                           nd_storage_f32(idx.storage));
        if (idx_tmp.storage != NULL) nd_array_release(&idx_tmp);
    }
    if (rows_tmp.storage != NULL) nd_array_release(&rows_tmp);
    return status;
}

nd_status nd_array_scatter_add_rows(const nd_array *src, const nd_array *indices, int64_t num_rows,
                                    nd_array *out) {
    memset(out, 0, sizeof *out);
    if (num_rows < 0) return nd_fail(ND_ERR_VALUE, "scatter_add_rows: num_rows must be >= 0");
    const nd_array *in[2] = {src, indices};
    if (nd_island_needed(2, in)) { /* dtype_island.c: rows in the source's dtype */
        nd_island is = {0};
        nd_status status = nd_island_enter(&is, 2, in);
        if (status == ND_OK) status = nd_array_scatter_add_rows(in[0], in[1], num_rows, out);
        nd_island_release(&is);
        return status == ND_OK ? nd_island_leave(out, src->storage->dtype) : status;
    }
    nd_status status = nd_same_device(src, indices);
    if (status != ND_OK) return status;
    if (src->layout.ndim < 1)
        return nd_fail(ND_ERR_SHAPE, "scatter_add_rows: the source needs at least one dimension");
    int64_t shape[2] = {num_rows, src->layout.shape[src->layout.ndim - 1]};
    /* Checked before the allocation, which may be large. */
    if ((status = scatter_shapes(src, indices, shape[1])) != ND_OK) return status;
    if ((status = nd_array_empty(src->storage->device, 2, shape, out)) != ND_OK) return status;
    status = nd_array_fill(out, 0.0f);
    if (status == ND_OK) status = nd_array_scatter_add_rows_into(out, src, indices);
    if (status != ND_OK) nd_array_release(out);
    return status;
}
