/* array_ops.c: the device-independent front end of every array operation.
 *
 * Validates shapes and devices, works out broadcast layouts, allocates the
 * result (the one place an operation can trigger a collection), then hands
 * plain layouts and pointers to the device's backend.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

void nd_array_release(nd_array *a) {
    if (a->storage != NULL) nd_storage_release(a->storage);
    memset(a, 0, sizeof *a);
}

nd_status nd_array_empty_typed(nd_device *dev, int ndim, const int64_t *shape, nd_dtype dtype,
                               nd_array *out) {
    memset(out, 0, sizeof *out);
    if (dev == NULL) return nd_fail(ND_ERR_DEVICE, "no device");
    nd_layout layout;
    nd_status status = nd_layout_contiguous(ndim, shape, &layout);
    if (status != ND_OK) return status;
    nd_storage *storage;
    status = nd_storage_new_typed(dev, nd_layout_numel(&layout), dtype, &storage);
    if (status != ND_OK) return status;
    out->storage = storage;
    out->layout = layout;
    return ND_OK;
}

nd_status nd_array_empty(nd_device *dev, int ndim, const int64_t *shape, nd_array *out) {
    return nd_array_empty_typed(dev, ndim, shape, ND_FLOAT32, out);
}

nd_dtype nd_array_dtype(const nd_array *a) { return a->storage->dtype; }

nd_status nd_backend_lacks_dtype(const char *backend, const char *what, nd_dtype dtype) {
    return nd_fail(ND_ERR_DTYPE, "%s is not implemented for %s arrays on the %s backend", what,
                   nd_dtype_name(dtype), backend);
}

nd_status nd_array_require_float32(const nd_array *a, const char *what) {
    if (a->storage->dtype == ND_FLOAT32) return ND_OK;
    return nd_fail(ND_ERR_DTYPE,
                   "%s is not implemented for %s arrays: convert with astype('float32')", what,
                   nd_dtype_name(a->storage->dtype));
}

static const nd_backend *backend_of(const nd_array *a) { return a->storage->device->backend; }

nd_status nd_same_device(const nd_array *a, const nd_array *b) {
    nd_device *da = a->storage->device, *db = b->storage->device;
    if (da != db)
        return nd_fail(ND_ERR_DEVICE, "expected all arrays on one device, got %s() and %s()",
                       da->name, db->name);
    return ND_OK;
}

static nd_kernel_operand array_operand(const nd_array *a, const nd_layout *layout) {
    nd_kernel_operand op = {a->storage->data, layout, 0.0};
    return op;
}

/* dst's view = src (src_layout: src broadcast to dst's shape), on one device,
 * any dtypes: the float32 copy kernels when both are float32. */
static nd_status copy_view(const nd_array *dst, const nd_array *src, const nd_layout *src_layout) {
    if (dst->storage->dtype == ND_FLOAT32 && src->storage->dtype == ND_FLOAT32)
        return backend_of(dst)->copy(&dst->layout, dst->storage->data,
                                     array_operand(src, src_layout));
    return backend_of(dst)->convert(&dst->layout, dst->storage->data, dst->storage->dtype,
                                    src_layout, src->storage->data, src->storage->dtype, 0.0);
}

/* Moves src (any dtype, compact or not) into dst (compact, src's dtype and
 * shape) on another device, through host memory. */
static nd_status copy_between_devices(const nd_array *src, const nd_array *dst) {
    nd_device *from = src->storage->device, *to = dst->storage->device;
    if (from->kind == ND_DEVICE_CPU && to->kind == ND_DEVICE_CPU)
        return copy_view(dst, src, &src->layout);
    if (to->kind == ND_DEVICE_CPU) return nd_array_to_host(src, dst->storage->data);
    int64_t nbytes = nd_layout_numel(&src->layout) * nd_dtype_size(src->storage->dtype);
    void *host = malloc((size_t)(nbytes > 0 ? nbytes : 1));
    if (host == NULL) return nd_fail(ND_ERR_OOM, "out of host memory for a device transfer");
    nd_status status = nd_array_to_host(src, host);
    if (status == ND_OK) status = nd_array_from_host(dst, host);
    free(host);
    return status;
}

nd_status nd_array_compact_copy(const nd_array *src, nd_device *dev, nd_array *out) {
    if (dev == NULL) dev = src->storage->device;
    nd_status status =
        nd_array_empty_typed(dev, src->layout.ndim, src->layout.shape, src->storage->dtype, out);
    if (status != ND_OK) return status;
    if (dev == src->storage->device) status = copy_view(out, src, &src->layout);
    else status = copy_between_devices(src, out);
    if (status != ND_OK) nd_array_release(out);
    return status;
}

nd_status nd_array_astype(const nd_array *src, nd_dtype dtype, nd_array *out) {
    memset(out, 0, sizeof *out);
    if (nd_dtype_size(dtype) == 0) return nd_fail(ND_ERR_VALUE, "unknown dtype %d", (int)dtype);
    nd_status status =
        nd_array_empty_typed(src->storage->device, src->layout.ndim, src->layout.shape, dtype, out);
    if (status != ND_OK) return status;
    if ((status = copy_view(out, src, &src->layout)) != ND_OK) nd_array_release(out);
    return status;
}

nd_status nd_array_assign(const nd_array *dst, const nd_array *src) {
    nd_status status = nd_same_device(dst, src);
    if (status != ND_OK) return status;
    nd_layout src_layout;
    status = nd_layout_broadcast_to(&src->layout, dst->layout.ndim, dst->layout.shape, &src_layout);
    if (status != ND_OK) return status;
    if (src->storage != dst->storage) return copy_view(dst, src, &src_layout);
    /* Source and destination may overlap: copy the source out first. */
    nd_array tmp;
    status = nd_array_compact_copy(src, NULL, &tmp);
    if (status != ND_OK) return status;
    status = nd_layout_broadcast_to(&tmp.layout, dst->layout.ndim, dst->layout.shape, &src_layout);
    if (status == ND_OK) status = copy_view(dst, &tmp, &src_layout);
    nd_array_release(&tmp);
    return status;
}

nd_status nd_array_fill(const nd_array *dst, double value) {
    if (dst->storage->dtype != ND_FLOAT32)
        return backend_of(dst)->convert(&dst->layout, dst->storage->data, dst->storage->dtype, NULL,
                                        NULL, ND_FLOAT32, value);
    nd_kernel_operand scalar = {NULL, NULL, (float)value};
    return backend_of(dst)->copy(&dst->layout, dst->storage->data, scalar);
}

/* The backend gathers or scatters a strided view itself, any dtype. */
nd_status nd_array_to_host(const nd_array *src, void *host) {
    return backend_of(src)->to_host(&src->layout, src->storage->data, src->storage->dtype, host);
}

nd_status nd_array_from_host(const nd_array *dst, const void *host) {
    return backend_of(dst)->from_host(&dst->layout, dst->storage->data, dst->storage->dtype, host);
}

nd_dtype nd_promote_dtypes(nd_dtype a, nd_dtype b) {
    if (a == b) return a;
    if (a == ND_FLOAT64 || b == ND_FLOAT64) return ND_FLOAT64;
    return ND_FLOAT32; /* float32 with a narrow type, or float16 with bfloat16 */
}

/* The operands of one operation in its dtype: *view is a itself, or (when a
 * has another dtype) a converted copy in *tmp, which the caller releases.
 * The copy is the conversion PyTorch's type promotion makes too. */
static nd_status in_dtype(const nd_array *a, nd_dtype dtype, nd_array *tmp, const nd_array **view) {
    memset(tmp, 0, sizeof *tmp);
    *view = a;
    if (a->storage->dtype == dtype) return ND_OK;
    nd_status status = nd_array_astype(a, dtype, tmp);
    if (status == ND_OK) *view = tmp;
    return status;
}

static void release_tmp(nd_array *tmp) {
    if (tmp->storage != NULL) nd_array_release(tmp);
}

nd_status nd_array_binary(nd_binary_op op, nd_operand a, nd_operand b, nd_array *out) {
    memset(out, 0, sizeof *out);
    if ((unsigned)op >= ND_BINARY_OP_COUNT)
        return nd_fail(ND_ERR_VALUE, "unknown binary op %d", op);
    if (a.array == NULL && b.array == NULL)
        return nd_fail(ND_ERR_VALUE, "a binary op needs at least one array operand");
    nd_status status;
    if (a.array != NULL && b.array != NULL && (status = nd_same_device(a.array, b.array)) != ND_OK)
        return status;
    /* Arrays promote each other; a scalar takes the array's dtype (PyTorch's
     * rule: x16 * 2.0 stays float16). */
    nd_dtype dtype = a.array == NULL ? b.array->storage->dtype
                     : b.array == NULL
                         ? a.array->storage->dtype
                         : nd_promote_dtypes(a.array->storage->dtype, b.array->storage->dtype);
    nd_array a_tmp = {0}, b_tmp = {0};
    if ((a.array != NULL && (status = in_dtype(a.array, dtype, &a_tmp, &a.array)) != ND_OK) ||
        (b.array != NULL && (status = in_dtype(b.array, dtype, &b_tmp, &b.array)) != ND_OK))
        goto done;
    const nd_array *any = a.array != NULL ? a.array : b.array;
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (a.array != NULL && b.array != NULL) {
        status = nd_broadcast_shapes(a.array->layout.ndim, a.array->layout.shape,
                                     b.array->layout.ndim, b.array->layout.shape, &ndim, shape);
        if (status != ND_OK) goto done;
    } else {
        ndim = any->layout.ndim;
        memcpy(shape, any->layout.shape, sizeof(int64_t) * (size_t)ndim);
    }
    nd_layout a_layout, b_layout;
    nd_kernel_operand ka = {NULL, NULL, a.scalar}, kb = {NULL, NULL, b.scalar};
    if (a.array != NULL) {
        if ((status = nd_layout_broadcast_to(&a.array->layout, ndim, shape, &a_layout)) != ND_OK)
            goto done;
        ka = array_operand(a.array, &a_layout);
    }
    if (b.array != NULL) {
        if ((status = nd_layout_broadcast_to(&b.array->layout, ndim, shape, &b_layout)) != ND_OK)
            goto done;
        kb = array_operand(b.array, &b_layout);
    }
    /* The operands' storages stay referenced by the caller while this
     * allocation runs, even if it starts a collection. */
    status = nd_array_empty_typed(any->storage->device, ndim, shape, dtype, out);
    if (status != ND_OK) goto done;
    status = backend_of(any)->binary(op, dtype, &out->layout, out->storage->data, ka, kb);
    if (status != ND_OK) nd_array_release(out);
done:
    release_tmp(&a_tmp);
    release_tmp(&b_tmp);
    return status;
}

nd_status nd_array_unary(nd_unary_op op, const nd_array *a, nd_array *out) {
    memset(out, 0, sizeof *out);
    if ((unsigned)op >= ND_UNARY_OP_COUNT) return nd_fail(ND_ERR_VALUE, "unknown unary op %d", op);
    nd_dtype dtype = a->storage->dtype;
    nd_status status =
        nd_array_empty_typed(a->storage->device, a->layout.ndim, a->layout.shape, dtype, out);
    if (status != ND_OK) return status;
    status = backend_of(a)->unary(op, dtype, &out->layout, out->storage->data, &a->layout,
                                  a->storage->data);
    if (status != ND_OK) nd_array_release(out);
    return status;
}

nd_status nd_array_reduce(nd_reduce_op op, const nd_array *a, uint32_t axes_mask, int keepdims,
                          nd_array *out) {
    memset(out, 0, sizeof *out);
    if ((unsigned)op >= ND_REDUCE_OP_COUNT)
        return nd_fail(ND_ERR_VALUE, "unknown reduction %d", op);
    nd_status status;
    const nd_layout *in = &a->layout;
    if (in->ndim < 32 && (axes_mask >> in->ndim) != 0)
        return nd_fail(ND_ERR_AXIS, "reduction axis out of bounds for an array of dimension %d",
                       in->ndim);
    int64_t kept_shape[ND_MAX_DIMS], reduced_extent = 1;
    for (int i = 0; i < in->ndim; i++) {
        int reduced = (axes_mask >> i) & 1u;
        kept_shape[i] = reduced ? 1 : in->shape[i];
        if (reduced) reduced_extent *= in->shape[i];
    }
    if (reduced_extent == 0 && op != ND_REDUCE_SUM)
        return nd_fail(ND_ERR_VALUE,
                       "zero-size array to reduction operation %s which has no identity",
                       op == ND_REDUCE_MAX ? "maximum" : "minimum");
    nd_dtype dtype = a->storage->dtype;
    status = nd_array_empty_typed(a->storage->device, in->ndim, kept_shape, dtype, out);
    if (status != ND_OK) return status;
    nd_layout kernel_out = out->layout;
    for (int i = 0; i < in->ndim; i++) {
        kernel_out.shape[i] = in->shape[i];
        if ((axes_mask >> i) & 1u) kernel_out.strides[i] = 0;
    }
    /* The backend writes every output (one GPU launch, no fill before it);
     * with nothing to reduce each output is the identity. */
    if (nd_layout_numel(in) > 0) {
        status =
            backend_of(a)->reduce(op, dtype, &kernel_out, out->storage->data, in, a->storage->data);
    } else {
        status = nd_array_fill(out, nd_reduce_identity(op));
    }
    if (status != ND_OK) {
        nd_array_release(out);
        return status;
    }
    if (!keepdims) {
        for (int i = in->ndim - 1; i >= 0; i--)
            if ((axes_mask >> i) & 1u) nd_layout_drop_dim(&out->layout, i);
    }
    return ND_OK;
}

/* Describes one matmul operand's last two dims for BLAS: one inner stride
 * must be 1 and the other a valid leading dimension; returns 0 otherwise. */
static int blas_strides(const nd_layout *l, int64_t rows, int64_t cols, int64_t *row_stride,
                        int64_t *col_stride) {
    int64_t rs = l->strides[l->ndim - 2], cs = l->strides[l->ndim - 1];
    int64_t min_rows = rows > 1 ? rows : 1, min_cols = cols > 1 ? cols : 1;
    if ((cols == 1 || cs == 1) && (rows == 1 || rs >= min_cols)) {
        *col_stride = 1;
        *row_stride = rows == 1 ? min_cols : rs;
        return 1;
    }
    if ((rows == 1 || rs == 1) && (cols == 1 || cs >= min_rows)) {
        *row_stride = 1;
        *col_stride = cols == 1 ? min_rows : cs;
        return 1;
    }
    return 0;
}

/* The product of a and b, both of one dtype (nd_array_matmul's body), with
 * bias (NULL: none, else of the product's dtype) added by the backend where
 * it can (*bias_added = 1), else left to the caller. */
static nd_status matmul_same_dtype(const nd_array *a, const nd_array *b, const nd_array *bias,
                                   int *bias_added, nd_array *out);

/* a and b promoted to one dtype, then matmul_same_dtype. */
static nd_status matmul_promoted(const nd_array *a, const nd_array *b, const nd_array *bias,
                                 int *bias_added, nd_array *out) {
    memset(out, 0, sizeof *out);
    *bias_added = 0;
    nd_status status = nd_same_device(a, b);
    if (status != ND_OK) return status;
    nd_dtype dtype = nd_promote_dtypes(a->storage->dtype, b->storage->dtype);
    nd_array a_tmp, b_tmp;
    if ((status = in_dtype(a, dtype, &a_tmp, &a)) == ND_OK &&
        (status = in_dtype(b, dtype, &b_tmp, &b)) == ND_OK)
        status = matmul_same_dtype(a, b, bias, bias_added, out);
    release_tmp(&a_tmp);
    release_tmp(&b_tmp);
    return status;
}

nd_status nd_array_matmul(const nd_array *a, const nd_array *b, nd_array *out) {
    int bias_added;
    return matmul_promoted(a, b, NULL, &bias_added, out);
}

/* Hands the backend bias as desc's row where it adds one for the product's
 * dtype and bias repeats one row over the product's other dims; returns
 * whether it did. */
static int fuse_bias_row(const nd_array *bias, const nd_layout *out_layout, nd_matmul_desc *desc) {
    const nd_backend *be = backend_of(bias);
    if (be->matmul_adds_bias == NULL || !be->matmul_adds_bias(desc->dtype) ||
        bias->storage->dtype != desc->dtype)
        return 0;
    nd_layout row;
    if (nd_layout_broadcast_to(&bias->layout, out_layout->ndim, out_layout->shape, &row) != ND_OK)
        return 0;
    for (int i = 0; i < row.ndim - 1; i++)
        if (row.strides[i] != 0 && row.shape[i] > 1) return 0;
    desc->bias = nd_storage_at(bias->storage, row.offset);
    desc->bias_stride = row.strides[row.ndim - 1];
    return 1;
}

static nd_status matmul_same_dtype(const nd_array *a, const nd_array *b, const nd_array *bias,
                                   int *bias_added, nd_array *out) {
    nd_status status;
    if (a->layout.ndim == 0 || b->layout.ndim == 0)
        return nd_fail(ND_ERR_SHAPE, "matmul: operands must have at least one dimension");
    nd_array a_view = *a, b_view = *b;
    int drop_m = 0, drop_n = 0;
    if (a_view.layout.ndim == 1) {
        nd_layout_reshape(&a->layout, 2, (int64_t[]){1, a->layout.shape[0]}, &a_view.layout);
        drop_m = 1;
    }
    if (b_view.layout.ndim == 1) {
        nd_layout_reshape(&b->layout, 2, (int64_t[]){b->layout.shape[0], 1}, &b_view.layout);
        drop_n = 1;
    }
    const nd_layout *la = &a_view.layout, *lb = &b_view.layout;
    int64_t m = la->shape[la->ndim - 2], k = la->shape[la->ndim - 1];
    int64_t k2 = lb->shape[lb->ndim - 2], n = lb->shape[lb->ndim - 1];
    if (k != k2)
        return nd_fail(ND_ERR_SHAPE, "matmul: inner dimensions differ (%lld and %lld)",
                       (long long)k, (long long)k2);
    int batch_ndim;
    int64_t out_shape[ND_MAX_DIMS + 2];
    status = nd_broadcast_shapes(la->ndim - 2, la->shape, lb->ndim - 2, lb->shape, &batch_ndim,
                                 out_shape);
    if (status != ND_OK) return status;
    if (batch_ndim + 2 > ND_MAX_DIMS)
        return nd_fail(ND_ERR_SHAPE, "arrays have at most %d dimensions", ND_MAX_DIMS);

    /* Operands BLAS cannot read in place are compacted first. */
    nd_array tmp_a = {0}, tmp_b = {0};
    nd_matmul_desc desc;
    memset(&desc, 0, sizeof desc);
    if (!blas_strides(la, m, k, &desc.a_row_stride, &desc.a_col_stride)) {
        if ((status = nd_array_compact_copy(&a_view, NULL, &tmp_a)) != ND_OK) return status;
        a_view = tmp_a;
        la = &a_view.layout;
        blas_strides(la, m, k, &desc.a_row_stride, &desc.a_col_stride);
    }
    if (!blas_strides(lb, k, n, &desc.b_row_stride, &desc.b_col_stride)) {
        if ((status = nd_array_compact_copy(&b_view, NULL, &tmp_b)) != ND_OK) goto done;
        b_view = tmp_b;
        lb = &b_view.layout;
        blas_strides(lb, k, n, &desc.b_row_stride, &desc.b_col_stride);
    }
    out_shape[batch_ndim] = m;
    out_shape[batch_ndim + 1] = n;
    if ((status = nd_array_empty_typed(a->storage->device, batch_ndim + 2, out_shape,
                                       a->storage->dtype, out)) != ND_OK)
        goto done;
    desc.m = m;
    desc.n = n;
    desc.k = k;
    desc.batch_ndim = batch_ndim;
    for (int i = 0; i < batch_ndim; i++) {
        desc.batch_shape[i] = out_shape[i];
        int ai = i - (batch_ndim - (la->ndim - 2)), bi = i - (batch_ndim - (lb->ndim - 2));
        desc.a_batch_strides[i] = (ai >= 0 && la->shape[ai] != 1) ? la->strides[ai] : 0;
        desc.b_batch_strides[i] = (bi >= 0 && lb->shape[bi] != 1) ? lb->strides[bi] : 0;
    }
    desc.a = nd_storage_at(a_view.storage, la->offset);
    desc.b = nd_storage_at(b_view.storage, lb->offset);
    desc.out = out->storage->data;
    desc.dtype = a->storage->dtype;
    if (bias != NULL && !drop_m && !drop_n) *bias_added = fuse_bias_row(bias, &out->layout, &desc);
    if (nd_layout_numel(&out->layout) > 0 && (status = backend_of(a)->matmul(&desc)) != ND_OK) {
        *bias_added = 0;
        nd_array_release(out);
        goto done;
    }
    if (drop_n) nd_layout_drop_dim(&out->layout, out->layout.ndim - 1);
    if (drop_m) nd_layout_drop_dim(&out->layout, out->layout.ndim - (drop_n ? 1 : 2));
done:
    if (tmp_a.storage) nd_array_release(&tmp_a);
    if (tmp_b.storage) nd_array_release(&tmp_b);
    return status;
}

nd_status nd_array_linear(const nd_array *x, const nd_array *w, const nd_array *bias,
                          nd_array *out) {
    memset(out, 0, sizeof *out);
    nd_status status;
    if (bias != NULL && (status = nd_same_device(x, bias)) != ND_OK) return status;
    if (bias != NULL &&
        bias->storage->dtype != nd_promote_dtypes(x->storage->dtype, w->storage->dtype)) {
        /* The bias promotes the product too: the unfused x @ w + bias. */
        nd_array product;
        if ((status = nd_array_matmul(x, w, &product)) != ND_OK) return status;
        status = nd_array_binary(ND_ADD, (nd_operand){&product, 0.0}, (nd_operand){bias, 0.0}, out);
        nd_array_release(&product);
        return status;
    }
    int bias_added;
    if ((status = matmul_promoted(x, w, bias, &bias_added, out)) != ND_OK || bias == NULL ||
        bias_added)
        return status;
    /* The bias is added in place: the product is the only (m, n) array. */
    nd_layout bias_layout;
    status =
        nd_layout_broadcast_to(&bias->layout, out->layout.ndim, out->layout.shape, &bias_layout);
    if (status == ND_OK) {
        void *data = out->storage->data;
        nd_kernel_operand product = {data, &out->layout, 0.0};
        status = backend_of(out)->binary(ND_ADD, out->storage->dtype, &out->layout, data, product,
                                         array_operand(bias, &bias_layout));
    }
    if (status != ND_OK) nd_array_release(out);
    return status;
}

/* A 2-D, compact, row-major array of rows x cols. */
static int is_matrix(const nd_array *a, int64_t rows, int64_t cols) {
    const nd_layout *l = &a->layout;
    return l->ndim == 2 && l->shape[0] == rows && l->shape[1] == cols && nd_layout_is_contiguous(l);
}

nd_status nd_array_linear_grads(const nd_array *g, const nd_array *x, const nd_array *w,
                                nd_array *gx, nd_array *gw, nd_array *gb, int *fused) {
    memset(gx, 0, sizeof *gx);
    memset(gw, 0, sizeof *gw);
    memset(gb, 0, sizeof *gb);
    *fused = 0;
    if (g->layout.ndim != 2 || x->layout.ndim != 2) return ND_OK;
    const int64_t m = g->layout.shape[0], n = g->layout.shape[1], k = x->layout.shape[1];
    const nd_dtype dtype = g->storage->dtype;
    nd_device *dev = g->storage->device;
    const nd_backend *be = backend_of(g);
    if (x->storage->device != dev || w->storage->device != dev || x->storage->dtype != dtype ||
        w->storage->dtype != dtype || !is_matrix(g, m, n) || !is_matrix(x, m, k) ||
        !is_matrix(w, k, n) || be->fuses_linear_grads == NULL ||
        !be->fuses_linear_grads(dtype, m, k, n))
        return ND_OK;
    nd_status status = nd_array_empty_typed(dev, 2, (int64_t[]){m, k}, dtype, gx);
    if (status == ND_OK) status = nd_array_empty_typed(dev, 2, (int64_t[]){k, n}, dtype, gw);
    if (status == ND_OK) status = nd_array_empty_typed(dev, 1, (int64_t[]){n}, dtype, gb);
    if (status == ND_OK) {
        const nd_linear_grads_desc d = {
            m,
            k,
            n,
            dtype,
            nd_storage_at(g->storage, g->layout.offset),
            nd_storage_at(x->storage, x->layout.offset),
            nd_storage_at(w->storage, w->layout.offset),
            gx->storage->data,
            gw->storage->data,
            gb->storage->data,
        };
        status = be->linear_grads(&d);
    }
    if (status != ND_OK) {
        nd_array_release(gx);
        nd_array_release(gw);
        nd_array_release(gb);
        return status;
    }
    *fused = 1;
    return ND_OK;
}

nd_status nd_array_add_into(const nd_array *dst, const nd_array *src) {
    nd_status status = nd_same_device(dst, src);
    if (status != ND_OK) return status;
    if (src->storage->dtype != dst->storage->dtype) { /* added in dst's dtype */
        nd_array converted;
        if ((status = nd_array_astype(src, dst->storage->dtype, &converted)) != ND_OK)
            return status;
        status = nd_array_add_into(dst, &converted);
        nd_array_release(&converted);
        return status;
    }
    const nd_layout *l = &dst->layout;
    for (int i = 0; i < l->ndim; i++)
        if (l->strides[i] == 0 && l->shape[i] > 1)
            return nd_fail(ND_ERR_VALUE, "an in-place add needs a destination without repeats");
    nd_layout src_layout;
    status = nd_layout_broadcast_to(&src->layout, l->ndim, l->shape, &src_layout);
    if (status != ND_OK) return status;
    if (src->storage == dst->storage) { /* may overlap: add a copy of the source */
        nd_array tmp;
        if ((status = nd_array_compact_copy(src, NULL, &tmp)) != ND_OK) return status;
        status = nd_array_add_into(dst, &tmp);
        nd_array_release(&tmp);
        return status;
    }
    void *data = dst->storage->data;
    nd_kernel_operand self = {data, l, 0.0};
    return backend_of(dst)->binary(ND_ADD, dst->storage->dtype, l, data, self,
                                   array_operand(src, &src_layout));
}
