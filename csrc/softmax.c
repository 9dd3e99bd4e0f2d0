/* softmax.c: the device-independent front end of the softmax row kernels:
 * log-sum-exp, softmax and log-softmax over the last axis, the fused softmax
 * cross-entropy (loss and gradient).
 *
 * Checks shapes, devices and labels, sees the input as rows (compacting it
 * when its rows are not contiguous), allocates the results (the one place
 * these operations can trigger a collection) and hands an nd_rows_desc to
 * the device's backend (internal.h). Labels are checked before any kernel
 * runs, so a bad one leaves nothing half computed.
 */
#include "internal.h"

#include <string.h>

/* An array seen as rows of its last axis: row r is cols contiguous floats at
 * x + r*ld; tmp holds the compact copy made when the layout allows no such
 * view (released by rows_release). */
typedef struct rows_view {
    const void *x; /* points at elements of dtype */
    int64_t rows, cols, ld;
    nd_dtype dtype;
    nd_array tmp;
} rows_view;

/* Element `offset` of a's storage, whichever its dtype. */
static const void *first_element(const nd_array *a, int64_t offset) {
    return nd_storage_at(a->storage, offset);
}

static nd_status as_rows(const nd_array *a, rows_view *v) {
    memset(v, 0, sizeof *v);
    nd_status status;
    const nd_layout *l = &a->layout;
    if (l->ndim < 1)
        return nd_fail(ND_ERR_SHAPE, "softmax rows need an array of at least one dimension");
    v->cols = l->shape[l->ndim - 1];
    v->rows = 1;
    for (int i = 0; i < l->ndim - 1; i++) v->rows *= l->shape[i];
    v->ld = v->cols;
    v->dtype = nd_storage_dtype(a->storage);
    if (v->rows == 0 || v->cols == 0) return ND_OK; /* nothing to read */
    nd_layout view;
    status = nd_layout_reshape(l, 2, (int64_t[]){v->rows, v->cols}, &view);
    if (status == ND_OK && (v->cols == 1 || view.strides[1] == 1)) {
        v->x = first_element(a, view.offset);
        v->ld = view.strides[0];
        return ND_OK;
    }
    if (status != ND_OK && status != ND_ERR_NOT_VIEWABLE) return status;
    if ((status = nd_array_compact_copy(a, NULL, &v->tmp)) != ND_OK) return status;
    v->x = first_element(&v->tmp, v->tmp.layout.offset);
    return ND_OK;
}

static void rows_release(rows_view *v) {
    if (v->tmp.storage != NULL) nd_array_release(&v->tmp);
}

static const nd_backend *backend_of(const nd_array *a) { return a->storage->device->backend; }

static nd_rows_desc rows_desc(const rows_view *v) {
    nd_rows_desc d;
    memset(&d, 0, sizeof d);
    d.rows = v->rows;
    d.cols = v->cols;
    d.x = v->x;
    d.ldx = v->ld;
    d.dtype = v->dtype;
    return d;
}

/* ------------------------------------------------------------- last axis */

nd_status nd_array_logsumexp_last(const nd_array *a, int keepdims, nd_array *out) {
    memset(out, 0, sizeof *out);
    if (nd_island_needed(1, &a)) { /* dtype_island.c */
        nd_island is = {0};
        const nd_array *wide = a;
        nd_status status = nd_island_enter(&is, 1, &wide);
        if (status == ND_OK) status = nd_array_logsumexp_last(wide, keepdims, out);
        nd_island_release(&is);
        return status == ND_OK ? nd_island_leave(out, a->storage->dtype) : status;
    }
    rows_view v;
    nd_status status = as_rows(a, &v);
    if (status != ND_OK) return status;
    int ndim = a->layout.ndim;
    int64_t shape[ND_MAX_DIMS];
    memcpy(shape, a->layout.shape, sizeof(int64_t) * (size_t)ndim);
    if (keepdims) shape[ndim - 1] = 1;
    else ndim--;
    status = nd_array_empty(a->storage->device, ndim, shape, out);
    if (status == ND_OK && v.rows > 0) {
        if (v.cols == 0) {
            status = nd_array_fill(out, -__builtin_inff()); /* log(0) */
        } else {
            nd_rows_desc d = rows_desc(&v);
            d.out = nd_storage_at(out->storage, out->layout.offset);
            d.ldo = 1;
            status = backend_of(a)->row_stats(&d);
        }
        if (status != ND_OK) nd_array_release(out);
    }
    rows_release(&v);
    return status;
}

nd_status nd_array_softmax_last(const nd_array *a, int log, nd_array *out) {
    memset(out, 0, sizeof *out);
    if (nd_island_needed(1, &a)) { /* dtype_island.c */
        nd_island is = {0};
        const nd_array *wide = a;
        nd_status status = nd_island_enter(&is, 1, &wide);
        if (status == ND_OK) status = nd_array_softmax_last(wide, log, out);
        nd_island_release(&is);
        return status == ND_OK ? nd_island_leave(out, a->storage->dtype) : status;
    }
    rows_view v;
    nd_status status = as_rows(a, &v);
    if (status != ND_OK) return status;
    nd_device *dev = a->storage->device;
    status = nd_array_empty(dev, a->layout.ndim, a->layout.shape, out);
    if (status == ND_OK && v.rows > 0 && v.cols > 0) {
        nd_array stats;
        status = nd_array_empty(dev, 2, (int64_t[]){v.rows, 2}, &stats);
        if (status == ND_OK) {
            nd_rows_desc d = rows_desc(&v);
            d.stats = nd_storage_f32(stats.storage);
            status = backend_of(a)->row_stats(&d);
            d.mode = log ? ND_ROW_LOG_SOFTMAX : ND_ROW_SOFTMAX;
            d.out = out->storage->data;
            d.ldo = v.cols;
            if (status == ND_OK) status = backend_of(a)->row_apply(&d);
            nd_array_release(&stats);
        }
        if (status != ND_OK) nd_array_release(out);
    }
    rows_release(&v);
    return status;
}

/* ------------------------------------------------ softmax cross-entropy */

/* ND_ERR_INDEX (nd_index_error) unless every label is an integer in
 * [0, classes). */
static nd_status check_labels(const nd_array *labels, int64_t classes) {
    return backend_of(labels)->check_indices(&labels->layout, nd_storage_f32(labels->storage),
                                             classes, "label", "classes");
}

/* Devices and shapes, then the labels. */
static nd_status xent_check(const nd_array *logits, const nd_array *labels) {
    nd_status status = nd_same_device(logits, labels);
    if (status != ND_OK) return status;
    const nd_layout *z = &logits->layout, *y = &labels->layout;
    if (z->ndim != 2 || y->ndim != 1 || y->shape[0] != z->shape[0])
        return nd_fail(ND_ERR_SHAPE,
                       "softmax cross-entropy needs logits (N, C) and labels (N,), got %d-D "
                       "logits and %d-D labels with %lld rows against %lld",
                       z->ndim, y->ndim, y->ndim >= 1 ? (long long)y->shape[0] : 0LL,
                       z->ndim >= 1 ? (long long)z->shape[0] : 0LL);
    return check_labels(labels, z->shape[1]);
}

static void set_labels(nd_rows_desc *d, const nd_array *labels) {
    d->labels = nd_storage_f32(labels->storage) + labels->layout.offset;
    d->label_stride = labels->layout.strides[0];
}

/* 1 when the cross-entropy may hand these logits to the backend as they are:
 * float32, or float16/bfloat16 (which a backend may read: the CPU and CUDA
 * ones do) with every other operand float32. */
static int xent_direct(const nd_array *logits, const nd_array *const *others, int n) {
    nd_dtype dtype = nd_storage_dtype(logits->storage);
    if (dtype != ND_FLOAT32 && dtype != ND_FLOAT16 && dtype != ND_BFLOAT16) return 0;
    for (int i = 0; i < n; i++)
        if (others[i] != NULL && nd_storage_dtype(others[i]->storage) != ND_FLOAT32) return 0;
    return 1;
}

/* The cross-entropy of other dtypes through float32 copies (dtype_island.c):
 * the loss, a mean, in float32 at least (float64 for float64 logits). */
static nd_status xent_island(const nd_array *logits, const nd_array *labels, nd_array *loss) {
    const nd_array *in[2] = {logits, labels};
    nd_island is = {0};
    nd_status status = nd_island_enter(&is, 2, in);
    if (status == ND_OK) status = nd_array_softmax_xent(in[0], in[1], loss);
    nd_island_release(&is);
    nd_dtype dtype = nd_promote_dtypes(logits->storage->dtype, ND_FLOAT32);
    return status == ND_OK ? nd_island_leave(loss, dtype) : status;
}

/* The loss sits after the statistics in one storage: (N, 2) stats, then the
 * loss element, so the stats start aligned and the loss keeps them alive. */
nd_status nd_array_softmax_xent(const nd_array *logits, const nd_array *labels, nd_array *loss) {
    memset(loss, 0, sizeof *loss);
    if (!xent_direct(logits, &labels, 1)) return xent_island(logits, labels, loss);
    nd_status status = xent_check(logits, labels);
    rows_view v;
    if (status != ND_OK || (status = as_rows(logits, &v)) != ND_OK) return status;
    int64_t n = v.rows;
    nd_array buf;
    status = nd_array_empty(logits->storage->device, 1, (int64_t[]){2 * n + 1}, &buf);
    if (status == ND_OK) {
        nd_rows_desc d = rows_desc(&v);
        set_labels(&d, labels);
        d.stats = nd_storage_f32(buf.storage);
        if (n > 0) status = backend_of(logits)->row_stats(&d); /* no log-sum-exp rows */
        d.out = d.stats + 2 * n;
        if (status == ND_OK) status = backend_of(logits)->xent_loss(&d);
        if (status != ND_OK) {
            nd_array_release(&buf);
            if (status == ND_ERR_DTYPE) { /* narrow logits this backend does not read */
                rows_release(&v);
                return xent_island(logits, labels, loss);
            }
        } else {
            *loss = buf;
            nd_layout_contiguous(1, (int64_t[]){1}, &loss->layout);
            loss->layout.offset = 2 * n;
        }
    }
    rows_release(&v);
    return status;
}

/* 1 when loss is laid out as nd_array_softmax_xent makes it for these rows:
 * then its statistics may be these logits'. */
static int stats_fit(const nd_array *loss, const rows_view *v, const nd_array *labels) {
    int64_t n = v->rows;
    return loss->storage->device == labels->storage->device &&
           nd_storage_numel(loss->storage) == 2 * n + 1 && loss->layout.offset == 2 * n &&
           nd_layout_numel(&loss->layout) == 1;
}

/* The loss recomputed from loss's kept statistics into *again, for row_apply
 * to compare with loss's value bit for bit (a loss of other logits, or one
 * written over, gives other bits, and row_apply then uses the rows' own
 * statistics). Compared where the data is, so a GPU never waits here. */
/* The cross-entropy's gradient of other dtypes through float32 copies
 * (dtype_island.c), in the logits' dtype; a converted loss has no statistics. */
static nd_status xent_grad_island(const nd_array *logits, const nd_array *labels,
                                  const nd_array *loss, const nd_array *out_grad, nd_array *grad) {
    const nd_array *in[4] = {logits, labels, loss, out_grad};
    nd_island is = {0};
    if (loss != NULL && loss->storage->dtype != ND_FLOAT32) in[2] = NULL;
    nd_status status = nd_island_enter(&is, 4, in);
    if (status == ND_OK) status = nd_array_softmax_xent_grad(in[0], in[1], in[2], in[3], grad);
    nd_island_release(&is);
    return status == ND_OK ? nd_island_leave(grad, logits->storage->dtype) : status;
}

static nd_status recompute_kept_loss(const nd_array *loss, const rows_view *v,
                                     const nd_array *labels, nd_array *again) {
    nd_status status = nd_array_empty(loss->storage->device, 1, (int64_t[]){1}, again);
    if (status != ND_OK) return status;
    nd_rows_desc d = rows_desc(v);
    set_labels(&d, labels);
    d.stats = nd_storage_f32(loss->storage);
    d.out = again->storage->data;
    status = backend_of(labels)->xent_loss(&d);
    if (status != ND_OK) nd_array_release(again);
    return status;
}

nd_status nd_array_softmax_xent_grad(const nd_array *logits, const nd_array *labels,
                                     const nd_array *loss, const nd_array *out_grad,
                                     nd_array *grad) {
    memset(grad, 0, sizeof *grad);
    const nd_array *others[3] = {labels, loss, out_grad};
    if (!xent_direct(logits, others, 3))
        return xent_grad_island(logits, labels, loss, out_grad, grad);
    nd_status status = xent_check(logits, labels);
    if (status == ND_OK && out_grad != NULL) {
        if ((status = nd_same_device(logits, out_grad)) != ND_OK) return status;
        if (nd_layout_numel(&out_grad->layout) != 1)
            return nd_fail(ND_ERR_SHAPE,
                           "softmax cross-entropy's out_grad must have one element, got %lld",
                           (long long)nd_layout_numel(&out_grad->layout));
    }
    rows_view v;
    if (status != ND_OK || (status = as_rows(logits, &v)) != ND_OK) return status;
    nd_device *dev = logits->storage->device;
    status = nd_array_empty_typed(dev, 2, (int64_t[]){v.rows, v.cols}, v.dtype, grad);
    const int kept =
        status == ND_OK && v.rows > 0 && v.cols > 0 && loss != NULL && stats_fit(loss, &v, labels);
    nd_array again = {0};
    if (kept) status = recompute_kept_loss(loss, &v, labels, &again);
    nd_array fresh = {0};
    if (status == ND_OK && v.rows > 0 && v.cols > 0) {
        nd_rows_desc d = rows_desc(&v);
        set_labels(&d, labels);
        if (kept) {
            d.stats = nd_storage_f32(loss->storage);
            d.kept_loss = nd_storage_f32(loss->storage) + loss->layout.offset;
            d.again_loss = nd_storage_f32(again.storage);
        } else if ((status = nd_array_empty(dev, 2, (int64_t[]){v.rows, 2}, &fresh)) == ND_OK) {
            d.stats = nd_storage_f32(fresh.storage);
            status = backend_of(logits)->row_stats(&d);
        }
        d.mode = ND_ROW_XENT_GRAD;
        d.scale =
            out_grad != NULL ? nd_storage_f32(out_grad->storage) + out_grad->layout.offset : NULL;
        d.out = grad->storage->data;
        d.ldo = v.cols;
        if (status == ND_OK) status = backend_of(logits)->row_apply(&d);
    }
    if (fresh.storage != NULL) nd_array_release(&fresh);
    if (again.storage != NULL) nd_array_release(&again);
    if (status != ND_OK && grad->storage != NULL) nd_array_release(grad);
    rows_release(&v);
    if (status == ND_ERR_DTYPE) /* narrow logits this backend does not read */
        return xent_grad_island(logits, labels, loss, out_grad, grad);
    return status;
}
