/* lstm.c: the device-independent front end of the LSTM layer (engine.h's
 * nd_array_lstm and nd_array_lstm_backward): checks shapes and devices,
 * allocates, and drives the backend per time step: the GEMMs through the
 * backend's matmul, the gates through its fused step kernels
 * (nd_lstm_step_desc, nd_lstm_step_grad_desc in internal.h).
 *
 * The forward leaves in y's storage what the backward reads, so a training
 * step keeps one buffer per layer and launches per time step one GEMM and
 * one kernel each way. The layout of that storage, in elements (B*H = one
 * state, written `bh`):
 *   [ h_0 (bh; only when T > 1) | y = h_1..h_T (T*bh) | c_1..c_{T-1} ((T-1)*bh)
 *     | saved (T*5*bh: each step's i, f, g, o and tanh(c_t), (B, 5H)) ]
 * With h_0 in front, h_0..h_{T-1} are one contiguous (T*B, H) matrix, so
 * w_hh's gradient is one GEMM.
 */
#include "internal.h"

#include <string.h>

static const nd_backend *backend_of(const nd_array *a) { return a->storage->device->backend; }

static const float *data_of(const nd_array *a) {
    return nd_storage_f32(a->storage) + a->layout.offset;
}

/* ------------------------------------------------------------ shapes */

typedef struct lstm_dims {
    int64_t T, B, in, H;
    int64_t y_off, cs_off, saved_off, total; /* the storage layout above */
} lstm_dims;

static nd_status check_2d(const nd_array *a, int64_t rows, int64_t cols, const char *name) {
    const nd_layout *l = &a->layout;
    if (l->ndim != 2 || l->shape[0] != rows || l->shape[1] != cols)
        return nd_fail(ND_ERR_SHAPE, "lstm: %s must have shape (%lld, %lld), got a %d-D array%s",
                       name, (long long)rows, (long long)cols, l->ndim,
                       l->ndim == 2 ? " of another shape" : "");
    return ND_OK;
}

/* ND_ERR_DEVICE unless a (when given) is on x's device. */
static nd_status on_device(const nd_array *x, const nd_array *a) {
    return a == NULL ? ND_OK : nd_same_device(x, a);
}

/* Shapes and devices of the layer's inputs, and the sizes they give. */
static nd_status check_inputs(const nd_array *x, const nd_array *h0, const nd_array *c0,
                              const nd_array *w_ih, const nd_array *w_hh, const nd_array *b_ih,
                              const nd_array *b_hh, lstm_dims *d) {
    memset(d, 0, sizeof *d);
    const nd_array *all[6] = {h0, c0, w_ih, w_hh, b_ih, b_hh};
    for (int i = 0; i < 6; i++) {
        nd_status status = on_device(x, all[i]);
        if (status != ND_OK) return status;
    }
    const nd_layout *xl = &x->layout, *wl = &w_ih->layout;
    if (xl->ndim != 3)
        return nd_fail(ND_ERR_SHAPE, "lstm: x must be 3-D (T, B, input_size), got %d-D", xl->ndim);
    if (wl->ndim != 2 || wl->shape[1] % 4 != 0)
        return nd_fail(ND_ERR_SHAPE,
                       "lstm: w_ih must be 2-D (input_size, 4 * hidden_size), got %d-D%s", wl->ndim,
                       wl->ndim == 2 ? " with a column count not divisible by 4" : "");
    d->T = xl->shape[0];
    d->B = xl->shape[1];
    d->in = xl->shape[2];
    d->H = wl->shape[1] / 4;
    if (d->T < 1 || d->B < 1 || d->in < 1 || d->H < 1)
        return nd_fail(ND_ERR_SHAPE,
                       "lstm: sequence length, batch, input and hidden size must be at least 1, "
                       "got %lld, %lld, %lld and %lld",
                       (long long)d->T, (long long)d->B, (long long)d->in, (long long)d->H);
    nd_status status = check_2d(w_ih, d->in, 4 * d->H, "w_ih");
    if (status == ND_OK) status = check_2d(w_hh, d->H, 4 * d->H, "w_hh");
    if (status == ND_OK && h0 != NULL) status = check_2d(h0, d->B, d->H, "h0");
    if (status == ND_OK && c0 != NULL) status = check_2d(c0, d->B, d->H, "c0");
    if (status != ND_OK) return status;
    if ((b_ih == NULL) != (b_hh == NULL))
        return nd_fail(ND_ERR_VALUE, "lstm: give both biases or neither");
    for (int i = 0; i < 2 && b_ih != NULL; i++) {
        const nd_layout *bl = i == 0 ? &b_ih->layout : &b_hh->layout;
        if (bl->ndim != 1 || bl->shape[0] != 4 * d->H)
            return nd_fail(ND_ERR_SHAPE, "lstm: %s must have shape (%lld,)", i ? "b_hh" : "b_ih",
                           (long long)(4 * d->H));
    }
    int64_t bh = d->B * d->H;
    d->y_off = d->T > 1 ? bh : 0;
    d->cs_off = d->y_off + d->T * bh;
    d->saved_off = d->cs_off + (d->T - 1) * bh;
    d->total = d->saved_off + d->T * 5 * bh;
    return ND_OK;
}

/* ------------------------------------------------------------ helpers */

/* a's data as a contiguous row-major buffer: a's own when it is one, else a
 * compact copy held in *tmp (released by the caller). a may be NULL. */
static nd_status contiguous(const nd_array *a, nd_array *tmp, const float **out) {
    memset(tmp, 0, sizeof *tmp);
    *out = NULL;
    if (a == NULL) return ND_OK;
    if (nd_layout_is_contiguous(&a->layout)) {
        *out = data_of(a);
        return ND_OK;
    }
    nd_status status = nd_array_compact_copy(a, NULL, tmp);
    if (status == ND_OK) *out = data_of(tmp);
    return status;
}

/* A matrix operand of gemm: element (i, p) at data + i*rs + p*cs. */
typedef struct mat {
    const float *data;
    int64_t rows, cols, rs, cs;
} mat;

/* A contiguous (rows, cols) matrix, and its transpose read in place. */
static mat plain(const float *data, int64_t rows, int64_t cols) {
    return (mat){data, rows, cols, cols, 1};
}
static mat transposed(const float *data, int64_t rows, int64_t cols) {
    return (mat){data, cols, rows, 1, cols};
}

/* out (a.rows, b.cols), contiguous = a @ b. */
static nd_status gemm(const nd_backend *be, mat a, mat b, float *out) {
    nd_matmul_desc d;
    memset(&d, 0, sizeof d);
    d.m = a.rows;
    d.k = a.cols;
    d.n = b.cols;
    d.a = a.data;
    d.a_row_stride = a.rs;
    d.a_col_stride = a.cs;
    d.b = b.data;
    d.b_row_stride = b.rs;
    d.b_col_stride = b.cs;
    d.out = out;
    return be->matmul(&d);
}

static float *mutable_data(const nd_array *a) { return nd_storage_f32(a->storage); }

/* Releases the arrays of outs that hold a storage (NULL entries skipped). */
static void release_all_present(nd_array *const *outs, int n) {
    for (int i = 0; i < n; i++)
        if (outs[i] != NULL && outs[i]->storage != NULL) nd_array_release(outs[i]);
}

static void release_all(nd_array *arrays, int n) {
    for (int i = 0; i < n; i++)
        if (arrays[i].storage != NULL) nd_array_release(&arrays[i]);
}

/* ------------------------------------------------------------ forward */

nd_status nd_array_lstm(const nd_array *x, const nd_array *h0, const nd_array *c0,
                        const nd_array *w_ih, const nd_array *w_hh, const nd_array *b_ih,
                        const nd_array *b_hh, nd_array *y, nd_array *h_n, nd_array *c_n) {
    memset(y, 0, sizeof *y);
    memset(c_n, 0, sizeof *c_n);
    if (h_n != NULL) memset(h_n, 0, sizeof *h_n);
    const nd_array *in[7] = {x, h0, c0, w_ih, w_hh, b_ih, b_hh};
    if (nd_island_needed(7, in)) { /* dtype_island.c: outputs in the inputs' promotion */
        nd_island is = {0};
        nd_dtype dtype = nd_island_promoted(7, in);
        nd_status status = nd_island_enter(&is, 7, in);
        if (status == ND_OK)
            status = nd_array_lstm(in[0], in[1], in[2], in[3], in[4], in[5], in[6], y, h_n, c_n);
        nd_island_release(&is);
        if (status == ND_OK && (status = nd_island_leave(y, dtype)) == ND_OK &&
            (h_n == NULL || (status = nd_island_leave(h_n, dtype)) == ND_OK))
            status = nd_island_leave(c_n, dtype);
        if (status != ND_OK) {
            nd_array *outs[3] = {y, h_n, c_n};
            release_all_present(outs, 3);
        }
        return status;
    }
    lstm_dims d;
    nd_status status = check_inputs(x, h0, c0, w_ih, w_hh, b_ih, b_hh, &d);
    if (status != ND_OK) return status;
    const nd_backend *be = backend_of(x);
    if (be->lstm_step == NULL)
        return nd_fail(ND_ERR_DEVICE, "lstm is not supported on %s()", x->storage->device->name);
    nd_device *dev = x->storage->device;
    const int64_t T = d.T, B = d.B, H = d.H, bh = B * H, G = 4 * H;
    enum { X, H0, C0, W_IH, W_HH, B_IH, B_HH, XW, HW, NTMP };
    nd_array tmp[NTMP];
    const float *src[7];
    const nd_array *given[7] = {x, h0, c0, w_ih, w_hh, b_ih, b_hh};
    memset(tmp, 0, sizeof tmp);
    for (int i = 0; i < 7 && status == ND_OK; i++) status = contiguous(given[i], &tmp[i], &src[i]);
    nd_array buf = {0};
    if (status == ND_OK) status = nd_array_empty(dev, 1, &d.total, &buf);
    if (status == ND_OK) status = nd_array_empty(dev, 2, (int64_t[]){T * B, G}, &tmp[XW]);
    if (status == ND_OK && (h0 != NULL || T > 1))
        status = nd_array_empty(dev, 2, (int64_t[]){B, G}, &tmp[HW]);
    if (status == ND_OK) status = nd_array_empty(dev, 2, (int64_t[]){B, H}, c_n);
    if (status == ND_OK && h_n != NULL) status = nd_array_empty(dev, 2, (int64_t[]){B, H}, h_n);
    float *base = buf.storage ? mutable_data(&buf) : NULL;
    float *xw = tmp[XW].storage ? mutable_data(&tmp[XW]) : NULL;
    float *hw = tmp[HW].storage ? mutable_data(&tmp[HW]) : NULL;
    /* Every step's input projection at once: (T*B, in) @ (in, 4H). */
    if (status == ND_OK)
        status = gemm(be, plain(src[X], T * B, d.in), plain(src[W_IH], d.in, G), xw);
    const float *h_first = src[H0];
    if (status == ND_OK && h0 != NULL && T > 1) {
        nd_layout state;
        nd_layout_contiguous(2, (int64_t[]){B, H}, &state);
        nd_kernel_operand from = {src[H0], &state, 0.0f};
        status = be->copy(&state, base, from);
        h_first = base;
    }
    float *ys = base + d.y_off, *cs = base + d.cs_off, *saved = base + d.saved_off;
    for (int64_t t = 0; t < T && status == ND_OK; t++) {
        const float *h_prev = t == 0 ? h_first : ys + (t - 1) * bh;
        if (h_prev != NULL) status = gemm(be, plain(h_prev, B, H), plain(src[W_HH], H, G), hw);
        if (status != ND_OK) break;
        nd_lstm_step_desc s = {
            .batch = B,
            .hidden = H,
            .xw = xw + t * B * G,
            .hw = h_prev != NULL ? hw : NULL,
            .b_ih = src[B_IH],
            .b_hh = src[B_HH],
            .c = t == 0 ? src[C0] : cs + (t - 1) * bh,
            .h_out = ys + t * bh,
            .c_out = t < T - 1 ? cs + t * bh : mutable_data(c_n),
            .h_copy = t == T - 1 && h_n != NULL ? mutable_data(h_n) : NULL,
            .saved = saved + t * 5 * bh,
        };
        status = be->lstm_step(&s);
    }
    release_all(tmp, NTMP);
    if (status != ND_OK) {
        if (buf.storage != NULL) nd_array_release(&buf);
        if (c_n->storage != NULL) nd_array_release(c_n);
        if (h_n != NULL && h_n->storage != NULL) nd_array_release(h_n);
        return status;
    }
    *y = buf;
    nd_layout_contiguous(3, (int64_t[]){T, B, H}, &y->layout);
    y->layout.offset = d.y_off;
    return ND_OK;
}

/* ----------------------------------------------------------- backward */

void nd_lstm_grads_release(nd_lstm_grads *g) {
    nd_array *all[6] = {&g->x, &g->h0, &g->c0, &g->w_ih, &g->w_hh, &g->bias};
    for (int i = 0; i < 6; i++)
        if (all[i]->storage != NULL) nd_array_release(all[i]);
}

/* Whether y is laid out as nd_array_lstm returns it for these sizes (on
 * x's device), so that its storage holds the saved values. */
static int holds_saved(const nd_array *x, const nd_array *y, const lstm_dims *d) {
    const nd_layout *l = &y->layout;
    return y->storage->device == x->storage->device && l->ndim == 3 && l->shape[0] == d->T &&
           l->shape[1] == d->B && l->shape[2] == d->H && nd_layout_is_contiguous(l) &&
           l->offset == d->y_off && nd_storage_numel(y->storage) == d->total;
}

/* Both biases' gradient, (2, 4H): the column sums of dgates (rows, G)
 * into row 0, then row 0 copied into row 1 (the two are equal, but each
 * bias gets memory of its own). */
static nd_status bias_grads(const nd_array *dgates, int64_t rows, int64_t G, nd_array *out) {
    const nd_backend *be = backend_of(dgates);
    nd_status status = nd_array_empty(dgates->storage->device, 2, (int64_t[]){2, G}, out);
    if (status == ND_OK) status = nd_array_fill(out, 0.0f);
    float *sums = mutable_data(out);
    nd_layout row, columns;
    nd_layout_contiguous(1, &G, &row);
    nd_layout_contiguous(2, (int64_t[]){rows, G}, &columns);
    columns.strides[0] = 0; /* every row of dgates adds into the one output row */
    if (status == ND_OK)
        status =
            be->reduce(ND_REDUCE_SUM, ND_FLOAT32, &columns, sums, &dgates->layout, data_of(dgates));
    nd_kernel_operand first = {sums, &row, 0.0f};
    if (status == ND_OK) status = be->copy(&row, sums + G, first);
    if (status != ND_OK && out->storage != NULL) nd_array_release(out);
    return status;
}

nd_status nd_array_lstm_backward(const nd_array *x, const nd_array *h0, const nd_array *c0,
                                 const nd_array *w_ih, const nd_array *w_hh, const nd_array *b_ih,
                                 const nd_array *b_hh, const nd_array *y, const nd_array *dy,
                                 const nd_array *dh_n, const nd_array *dc_n, int want,
                                 nd_lstm_grads *out) {
    memset(out, 0, sizeof *out);
    const nd_array *in[11] = {x, h0, c0, w_ih, w_hh, b_ih, b_hh, y, dy, dh_n, dc_n};
    if (nd_island_needed(11, in)) { /* dtype_island.c: each gradient in its input's dtype */
        nd_island is = {0};
        if (y != NULL && y->storage->dtype != ND_FLOAT32) in[7] = NULL; /* no saved values */
        nd_status status = nd_island_enter(&is, 11, in);
        if (status == ND_OK)
            status = nd_array_lstm_backward(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7],
                                            in[8], in[9], in[10], want, out);
        nd_island_release(&is);
        const nd_array *bias = b_ih != NULL ? b_ih : b_hh;
        if (status == ND_OK && (status = nd_island_leave(&out->x, x->storage->dtype)) == ND_OK &&
            (h0 == NULL || (status = nd_island_leave(&out->h0, h0->storage->dtype)) == ND_OK) &&
            (c0 == NULL || (status = nd_island_leave(&out->c0, c0->storage->dtype)) == ND_OK) &&
            (status = nd_island_leave(&out->w_ih, w_ih->storage->dtype)) == ND_OK &&
            (status = nd_island_leave(&out->w_hh, w_hh->storage->dtype)) == ND_OK && bias != NULL)
            status = nd_island_leave(&out->bias, bias->storage->dtype);
        if (status != ND_OK) nd_lstm_grads_release(out);
        return status;
    }
    lstm_dims d;
    nd_status status = check_inputs(x, h0, c0, w_ih, w_hh, b_ih, b_hh, &d);
    const nd_array *grads_in[3] = {dy, dh_n, dc_n};
    for (int i = 0; i < 3 && status == ND_OK; i++) status = on_device(x, grads_in[i]);
    if (status != ND_OK) return status;
    const int64_t T = d.T, B = d.B, H = d.H, bh = B * H, G = 4 * H;
    if (dy != NULL) {
        const nd_layout *l = &dy->layout;
        if (l->ndim != 3 || l->shape[0] != T || l->shape[1] != B || l->shape[2] != H)
            return nd_fail(ND_ERR_SHAPE, "lstm backward: dy must have shape (%lld, %lld, %lld)",
                           (long long)T, (long long)B, (long long)H);
    }
    if (dh_n != NULL && (status = check_2d(dh_n, B, H, "dh_n")) != ND_OK) return status;
    if (dc_n != NULL && (status = check_2d(dc_n, B, H, "dc_n")) != ND_OK) return status;
    const nd_backend *be = backend_of(x);
    if (be->lstm_step_grad == NULL)
        return nd_fail(ND_ERR_DEVICE, "lstm is not supported on %s()", x->storage->device->name);
    nd_array again = {0}, again_c = {0};
    if (y == NULL || !holds_saved(x, y, &d)) {
        status = nd_array_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh, &again, NULL, &again_c);
        if (status != ND_OK) return status;
        nd_array_release(&again_c);
        y = &again;
    }
    nd_device *dev = x->storage->device;
    enum { X, H0, C0, W_IH, W_HH, DY, DH_N, DC_N, DG, DH, DC, NTMP };
    nd_array tmp[NTMP];
    const float *src[8];
    const nd_array *given[8] = {x, h0, c0, w_ih, w_hh, dy, dh_n, dc_n};
    memset(tmp, 0, sizeof tmp);
    for (int i = 0; i < 8 && status == ND_OK; i++) status = contiguous(given[i], &tmp[i], &src[i]);
    const int state = (want & ND_LSTM_GRAD_STATE) != 0;
    /* h_{t-1}'s gradient (a GEMM's output) and c's (the kernel's, in
     * place) carried from step to step; when the state's gradient is
     * wanted, the carriers are its arrays, so step 0 leaves it there. */
    nd_array *dh_buf = state ? &out->h0 : &tmp[DH], *dc_buf = state ? &out->c0 : &tmp[DC];
    if (status == ND_OK) status = nd_array_empty(dev, 2, (int64_t[]){T * B, G}, &tmp[DG]);
    if (status == ND_OK && (state || T > 1))
        status = nd_array_empty(dev, 2, (int64_t[]){B, H}, dh_buf);
    if (status == ND_OK && (state || T > 1))
        status = nd_array_empty(dev, 2, (int64_t[]){B, H}, dc_buf);
    const float *base = nd_storage_f32(y->storage);
    const float *ys = base + d.y_off, *cs = base + d.cs_off, *saved = base + d.saved_off;
    float *dg = tmp[DG].storage ? mutable_data(&tmp[DG]) : NULL;
    float *dh = dh_buf->storage ? mutable_data(dh_buf) : NULL;
    float *dc = dc_buf->storage ? mutable_data(dc_buf) : NULL;
    for (int64_t t = T - 1; t >= 0 && status == ND_OK; t--) {
        nd_lstm_step_grad_desc s = {
            .batch = B,
            .hidden = H,
            .saved = saved + t * 5 * bh,
            .c = t == 0 ? src[C0] : cs + (t - 1) * bh,
            .dh = src[DY] != NULL ? src[DY] + t * bh : NULL,
            .dh2 = t == T - 1 ? src[DH_N] : dh,
            .dc = t == T - 1 ? src[DC_N] : dc,
            .dgates = dg + t * B * G,
            .dc_prev = t > 0 || state ? dc : NULL,
        };
        status = be->lstm_step_grad(&s);
        if (status == ND_OK && (t > 0 || state))
            status = gemm(be, plain(dg + t * B * G, B, G), transposed(src[W_HH], H, G), dh);
    }
    if (status == ND_OK && (want & ND_LSTM_GRAD_X)) {
        status = nd_array_empty(dev, 3, (int64_t[]){T, B, d.in}, &out->x);
        if (status == ND_OK)
            status = gemm(be, plain(dg, T * B, G), transposed(src[W_IH], d.in, G),
                          mutable_data(&out->x));
    }
    if (status == ND_OK) status = nd_array_empty(dev, 2, (int64_t[]){d.in, G}, &out->w_ih);
    if (status == ND_OK)
        status = gemm(be, transposed(src[X], T * B, d.in), plain(dg, T * B, G),
                      mutable_data(&out->w_ih));
    if (status == ND_OK) status = nd_array_empty(dev, 2, (int64_t[]){H, G}, &out->w_hh);
    if (status == ND_OK) {
        /* sum over t of h_{t-1}^T @ dgates_t: h_0..h_{T-1} are one matrix
         * (see the layout); without h0 the first term is zero. */
        float *dw = mutable_data(&out->w_hh);
        if (h0 != NULL)
            status =
                gemm(be, transposed(T > 1 ? base : src[H0], T * B, H), plain(dg, T * B, G), dw);
        else if (T > 1)
            status =
                gemm(be, transposed(ys, (T - 1) * B, H), plain(dg + B * G, (T - 1) * B, G), dw);
        else status = nd_array_fill(&out->w_hh, 0.0f);
    }
    if (status == ND_OK && (want & ND_LSTM_GRAD_BIAS))
        status = bias_grads(&tmp[DG], T * B, G, &out->bias);
    release_all(tmp, NTMP);
    if (again.storage != NULL) nd_array_release(&again);
    if (status != ND_OK) nd_lstm_grads_release(out);
    return status;
}
