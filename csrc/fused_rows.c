/* fused_rows.c: the device-independent front end of the transformer's fused
 * row operations: the layer norm (the course's LayerNorm1d over the last
 * axis in one pass forward and one backward, plus the column sums of the
 * weight and bias gradients) and the attention softmax (scale, causal mask
 * and softmax in one pass forward, one backward).
 *
 * Checks shapes, devices and scalars, sees the inputs as compact rows
 * (compacting a strided input first), allocates the results and the layer
 * norm backward's per-chunk partial sums (the one place these operations
 * can trigger a collection), and hands a descriptor (internal.h) to the
 * device's backend. The layer norm backward recomputes each row's
 * statistics from x, so the forward keeps nothing beside its output.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

/* The backward's rows go in chunks of at least CHUNK_ROWS rows, and at most
 * MAX_CHUNKS chunks: enough chunks to spread over a GPU's blocks or the
 * host's threads, few enough that the partial sums stay small and the final
 * sum over chunks stays short. */
#define CHUNK_ROWS 32
#define MAX_CHUNKS 1024

static const nd_backend *backend_of(const nd_array *a) { return a->storage->device->backend; }

/* a's data as compact floats: a's own when it is contiguous, else a compact
 * copy made in *tmp (released by the caller when its storage is set). */
static nd_status compact_data(const nd_array *a, nd_array *tmp, const float **data) {
    memset(tmp, 0, sizeof *tmp);
    if (nd_layout_is_contiguous(&a->layout)) {
        *data = nd_storage_f32(a->storage) + a->layout.offset;
        return ND_OK;
    }
    nd_status status = nd_array_compact_copy(a, NULL, tmp);
    if (status == ND_OK) *data = nd_storage_f32(tmp->storage) + tmp->layout.offset;
    return status;
}

/* The rows and columns of x, checked against a parameter of cols elements
 * called what ("weight", "bias"). */
static nd_status check_param(const nd_array *x, const nd_array *p, const char *what) {
    nd_status status = nd_same_device(x, p);
    if (status != ND_OK) return status;
    int64_t cols = x->layout.shape[x->layout.ndim - 1], numel = nd_layout_numel(&p->layout);
    if (numel != cols)
        return nd_fail(ND_ERR_SHAPE,
                       "layer norm: the %s has %lld elements, expected %lld (the input's last "
                       "dimension)",
                       what, (long long)numel, (long long)cols);
    return ND_OK;
}

/* Checks x, w, eps and the other parameter (the bias, or the out_grad when
 * grad), and gives x's rows and columns. */
static nd_status check_inputs(const nd_array *x, const nd_array *w, const nd_array *other, int grad,
                              float eps, int64_t *rows, int64_t *cols) {
    const nd_layout *l = &x->layout;
    if (l->ndim < 1 || l->shape[l->ndim - 1] == 0)
        return nd_fail(ND_ERR_SHAPE,
                       "layer norm needs an input whose last dimension is not empty, got %d-D%s",
                       l->ndim, l->ndim >= 1 ? " with an empty last dimension" : "");
    if (!isfinite(eps) || eps < 0.0f)
        return nd_fail(ND_ERR_VALUE, "layer norm: eps must be a finite number >= 0, got %g",
                       (double)eps);
    nd_status status = check_param(x, w, "weight");
    if (status != ND_OK) return status;
    if (grad) {
        if ((status = nd_same_device(x, other)) != ND_OK) return status;
        const nd_layout *g = &other->layout;
        if (g->ndim != l->ndim || memcmp(g->shape, l->shape, sizeof(int64_t) * (size_t)l->ndim))
            return nd_fail(ND_ERR_SHAPE, "layer norm: the out_grad must have the input's shape");
    } else if ((status = check_param(x, other, "bias")) != ND_OK) {
        return status;
    }
    *cols = l->shape[l->ndim - 1];
    *rows = nd_layout_numel(l) / *cols;
    return ND_OK;
}

nd_status nd_array_layer_norm(const nd_array *x, const nd_array *w, const nd_array *b, float eps,
                              nd_array *out) {
    const nd_array *in[3] = {x, w, b};
    if (nd_island_needed(3, in)) { /* dtype_island.c */
        memset(out, 0, sizeof *out);
        nd_island is = {0};
        nd_dtype dtype = nd_island_promoted(3, in);
        nd_status status = nd_island_enter(&is, 3, in);
        if (status == ND_OK) status = nd_array_layer_norm(in[0], in[1], in[2], eps, out);
        nd_island_release(&is);
        return status == ND_OK ? nd_island_leave(out, dtype) : status;
    }
    memset(out, 0, sizeof *out);
    int64_t rows = 0, cols = 0;
    nd_status status = check_inputs(x, w, b, 0, eps, &rows, &cols);
    if (status != ND_OK) return status;
    nd_norm_desc d;
    memset(&d, 0, sizeof d);
    d.rows = rows;
    d.cols = cols;
    d.eps = eps;
    nd_array tx, tw, tb;
    memset(&tw, 0, sizeof tw);
    memset(&tb, 0, sizeof tb);
    if ((status = compact_data(x, &tx, &d.x)) == ND_OK &&
        (status = compact_data(w, &tw, &d.w)) == ND_OK &&
        (status = compact_data(b, &tb, &d.b)) == ND_OK)
        status = nd_array_empty(x->storage->device, x->layout.ndim, x->layout.shape, out);
    if (status == ND_OK && rows > 0) {
        d.out = nd_storage_f32(out->storage);
        if ((status = backend_of(x)->layer_norm(&d)) != ND_OK) nd_array_release(out);
    }
    nd_array_release(&tx);
    nd_array_release(&tw);
    nd_array_release(&tb);
    return status;
}

nd_status nd_array_layer_norm_grad(const nd_array *x, const nd_array *w, const nd_array *g,
                                   float eps, nd_array *dx, nd_array *dw, nd_array *db) {
    memset(dx, 0, sizeof *dx);
    memset(dw, 0, sizeof *dw);
    memset(db, 0, sizeof *db);
    const nd_array *in[3] = {x, w, g};
    if (nd_island_needed(3, in)) { /* dtype_island.c: dx in x's dtype, dw and db in w's */
        nd_island is = {0};
        nd_status status = nd_island_enter(&is, 3, in);
        if (status == ND_OK)
            status = nd_array_layer_norm_grad(in[0], in[1], in[2], eps, dx, dw, db);
        nd_island_release(&is);
        if (status == ND_OK && (status = nd_island_leave(dx, x->storage->dtype)) == ND_OK &&
            (status = nd_island_leave(dw, w->storage->dtype)) == ND_OK)
            status = nd_island_leave(db, w->storage->dtype);
        if (status != ND_OK) {
            nd_array *outs[3] = {dx, dw, db};
            for (int i = 0; i < 3; i++)
                if (outs[i]->storage != NULL) nd_array_release(outs[i]);
        }
        return status;
    }
    int64_t rows = 0, cols = 0;
    nd_status status = check_inputs(x, w, g, 1, eps, &rows, &cols);
    if (status != ND_OK) return status;
    nd_norm_desc d;
    memset(&d, 0, sizeof d);
    d.rows = rows;
    d.cols = cols;
    d.eps = eps;
    d.chunk_rows = (rows + MAX_CHUNKS - 1) / MAX_CHUNKS;
    if (d.chunk_rows < CHUNK_ROWS) d.chunk_rows = CHUNK_ROWS;
    d.chunks = (rows + d.chunk_rows - 1) / d.chunk_rows;
    nd_device *dev = x->storage->device;
    nd_array tx, tw, tg, partials;
    memset(&tw, 0, sizeof tw);
    memset(&tg, 0, sizeof tg);
    memset(&partials, 0, sizeof partials);
    if ((status = compact_data(x, &tx, &d.x)) == ND_OK &&
        (status = compact_data(w, &tw, &d.w)) == ND_OK &&
        (status = compact_data(g, &tg, &d.g)) == ND_OK &&
        (status = nd_array_empty(dev, x->layout.ndim, x->layout.shape, dx)) == ND_OK &&
        (status = nd_array_empty(dev, 1, &cols, dw)) == ND_OK &&
        (status = nd_array_empty(dev, 1, &cols, db)) == ND_OK) {
        d.out = nd_storage_f32(dx->storage);
        d.dw = nd_storage_f32(dw->storage);
        d.db = nd_storage_f32(db->storage);
        if (rows == 0) { /* nothing summed: zero gradients for the parameters */
            if ((status = nd_array_fill(dw, 0.0f)) == ND_OK) status = nd_array_fill(db, 0.0f);
        } else if ((status = nd_array_empty(dev, 3, (int64_t[]){d.chunks, 2, cols}, &partials)) ==
                   ND_OK) {
            d.partials = nd_storage_f32(partials.storage);
            status = backend_of(x)->layer_norm_grad(&d);
        }
    }
    nd_array_release(&partials);
    nd_array_release(&tx);
    nd_array_release(&tw);
    nd_array_release(&tg);
    if (status != ND_OK) {
        nd_array_release(dx);
        nd_array_release(dw);
        nd_array_release(db);
    }
    return status;
}

/* ------------------------------------------------------ attention softmax */

static nd_status check_divisor(float divisor) {
    if (!isfinite(divisor) || divisor == 0.0f)
        return nd_fail(ND_ERR_VALUE,
                       "attention softmax: the divisor must be finite and nonzero, got %g",
                       (double)divisor);
    return ND_OK;
}

/* The rows and columns of a's last axis (a has at least one dimension). */
static void rows_of(const nd_array *a, int64_t *rows, int64_t *cols) {
    const nd_layout *l = &a->layout;
    *cols = l->shape[l->ndim - 1];
    *rows = 1;
    for (int i = 0; i < l->ndim - 1; i++) *rows *= l->shape[i];
}

nd_status nd_array_attention_softmax(const nd_array *x, float divisor, int causal, nd_array *out) {
    memset(out, 0, sizeof *out);
    if (nd_island_needed(1, &x)) { /* dtype_island.c */
        nd_island is = {0};
        const nd_array *wide = x;
        nd_status status = nd_island_enter(&is, 1, &wide);
        if (status == ND_OK) status = nd_array_attention_softmax(wide, divisor, causal, out);
        nd_island_release(&is);
        return status == ND_OK ? nd_island_leave(out, x->storage->dtype) : status;
    }
    const nd_layout *l = &x->layout;
    if (l->ndim < (causal ? 2 : 1))
        return nd_fail(
            ND_ERR_SHAPE, "attention softmax needs an input of at least %d dimension%s%s",
            causal ? 2 : 1, causal ? "s" : "", causal ? " (queries, keys) when causal" : "");
    nd_status status = check_divisor(divisor);
    if (status != ND_OK) return status;
    nd_attn_desc d;
    memset(&d, 0, sizeof d);
    rows_of(x, &d.rows, &d.cols);
    d.queries = causal ? l->shape[l->ndim - 2] : 0;
    d.divisor = divisor;
    nd_array tx;
    if ((status = compact_data(x, &tx, &d.x)) == ND_OK &&
        (status = nd_array_empty(x->storage->device, l->ndim, l->shape, out)) == ND_OK &&
        d.rows > 0 && d.cols > 0) {
        d.out = nd_storage_f32(out->storage);
        if ((status = backend_of(x)->attention_softmax(&d)) != ND_OK) nd_array_release(out);
    }
    nd_array_release(&tx);
    return status;
}

nd_status nd_array_attention_softmax_grad(const nd_array *y, const nd_array *g, float divisor,
                                          nd_array *dx) {
    memset(dx, 0, sizeof *dx);
    const nd_array *in[2] = {y, g};
    if (nd_island_needed(2, in)) { /* dtype_island.c */
        nd_island is = {0};
        nd_dtype dtype = nd_island_promoted(2, in);
        nd_status status = nd_island_enter(&is, 2, in);
        if (status == ND_OK) status = nd_array_attention_softmax_grad(in[0], in[1], divisor, dx);
        nd_island_release(&is);
        return status == ND_OK ? nd_island_leave(dx, dtype) : status;
    }
    const nd_layout *l = &y->layout;
    nd_status status = nd_same_device(y, g);
    if (status != ND_OK || (status = check_divisor(divisor)) != ND_OK) return status;
    if (l->ndim < 1 || g->layout.ndim != l->ndim ||
        memcmp(g->layout.shape, l->shape, sizeof(int64_t) * (size_t)l->ndim))
        return nd_fail(ND_ERR_SHAPE,
                       "attention softmax gradient: the out_grad must have the output's shape, "
                       "of at least one dimension");
    nd_attn_desc d;
    memset(&d, 0, sizeof d);
    rows_of(y, &d.rows, &d.cols);
    d.divisor = divisor;
    nd_array ty, tg;
    memset(&tg, 0, sizeof tg);
    if ((status = compact_data(y, &ty, &d.x)) == ND_OK &&
        (status = compact_data(g, &tg, &d.g)) == ND_OK &&
        (status = nd_array_empty(y->storage->device, l->ndim, l->shape, dx)) == ND_OK &&
        d.rows > 0 && d.cols > 0) {
        d.out = nd_storage_f32(dx->storage);
        if ((status = backend_of(y)->attention_softmax_grad(&d)) != ND_OK) nd_array_release(dx);
    }
    nd_array_release(&ty);
    nd_array_release(&tg);
    return status;
}
