/* ops_nn.c: compute (NDArrays) and gradient (Tensors) of the neural-network
 * ops: flip, dilate/undilate, convolution, logsumexp and log-softmax, row
 * gathering and scattering (embeddings) and softmax cross-entropy.
 *
 * Gradients follow the course's formulas and are built from ops through
 * apply (so "needle" mode records the course's graphs). Where a formula is
 * only right for the course's easy shapes (a stride that divides the padded
 * size, square images), the extra crop or pad is itself an op.
 */
#include "grad_scope.h"
#include "ops_util.h"

#include <float.h>

#define UNUSED(x) (void)(x)

static const op_params no_params;

/* ----------------------------------------------- Tensor building blocks */

static PyObject *g_conv(grad_scope *s, PyObject *x, PyObject *w, int stride, int padding) {
    op_params p = no_params;
    p.stride = stride;
    p.padding = padding;
    return g_apply2(s, OP_CONV, &p, x, w);
}

/* A getitem key of slices start[i]:stop[i]. */
static PyObject *slice_key(int ndim, const int64_t *start, const int64_t *stop) {
    PyObject *key = PyTuple_New(ndim);
    for (int i = 0; key != NULL && i < ndim; i++) {
        PyObject *a = PyLong_FromLongLong(start[i]), *b = PyLong_FromLongLong(stop[i]);
        PyObject *slice = a && b ? PySlice_New(a, b, NULL) : NULL;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (slice == NULL) Py_CLEAR(key);
        else PyTuple_SET_ITEM(key, i, slice);
    }
    return key;
}

/* x[start:stop] along every dim (a GetItem op). */
static PyObject *g_slice(grad_scope *s, PyObject *x, int ndim, const int64_t *start,
                         const int64_t *stop) {
    if (s->failed || x == NULL) return NULL;
    op_params p = no_params;
    p.key = scope_keep(s, slice_key(ndim, start, stop));
    return g_apply1(s, OP_GET_ITEM, &p, x);
}

/* x (shape `from`) with zeros appended up to shape `to` (a ScatterSlice op). */
static PyObject *g_pad_end(grad_scope *s, PyObject *x, int ndim, const int64_t *from,
                           const int64_t *to) {
    if (s->failed || x == NULL) return NULL;
    int64_t zero[ND_MAX_DIMS] = {0};
    op_params p = no_params;
    p.key = scope_keep(s, slice_key(ndim, zero, from));
    p.ndim = ndim;
    memcpy(p.shape, to, sizeof(int64_t) * (size_t)ndim);
    return g_apply1(s, OP_SET_ITEM_GRAD, &p, x);
}

/* ------------------------------------------------------------- flip */

static PyObject *flip_compute(needle_state *st, const op_params *p, PyObject *const *a,
                              Py_ssize_t n) {
    UNUSED(n);
    int axes[ND_MAX_DIMS];
    if (normalize_axes(st, p->naxes, p->axes, array_layout(a[0])->ndim, axes) < 0) return NULL;
    nd_layout out;
    nd_status status = nd_layout_flip(array_layout(a[0]), p->naxes, axes, &out);
    if (status != ND_OK) return raise_status(st, status);
    return array_view(st, a[0], &out);
}

static PyObject *flip_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return grads1(s, g_apply1(s, OP_FLIP, p, g)); /* flip(g, axes) */
}

/* -------------------------------------------------- dilate/undilate */

static PyObject *dilate_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                Py_ssize_t n) {
    UNUSED(n);
    const nd_layout *l = array_layout(a[0]);
    uint32_t mask;
    if (axes_to_mask(st, p, l->ndim, &mask) < 0) return NULL;
    int64_t step = (int64_t)p->dilation + 1, shape[ND_MAX_DIMS];
    for (int i = 0; i < l->ndim; i++)
        shape[i] = (mask >> i) & 1u ? l->shape[i] * step : l->shape[i];
    PyObject *out = array_full_like(st, a[0], l->ndim, shape, 0.0f);
    if (out == NULL) return NULL;
    /* The input goes to every step-th element of the zeros. */
    nd_array slots = NDArray_CAST(out)->array;
    for (int i = 0; i < l->ndim; i++)
        if ((mask >> i) & 1u) nd_layout_slice(&slots.layout, i, 0, step, l->shape[i]);
    return array_assign_into(st, out, &slots, &NDArray_CAST(a[0])->array);
}

static PyObject *dilate_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return grads1(s, g_apply1(s, OP_UNDILATE, p, g)); /* undilate(g, axes, dilation) */
}

static PyObject *undilate_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                  Py_ssize_t n) {
    UNUSED(n);
    nd_layout view = *array_layout(a[0]);
    uint32_t mask;
    if (axes_to_mask(st, p, view.ndim, &mask) < 0) return NULL;
    int64_t step = (int64_t)p->dilation + 1;
    /* A step past a (non-empty) axis keeps only its first element: that is
     * no dilate's inverse (dilate makes each axis n * step long), a mistake. */
    for (int i = 0; i < view.ndim; i++)
        if ((mask >> i) & 1u && view.shape[i] > 0 && step > view.shape[i]) {
            PyErr_Format(PyExc_ValueError,
                         "undilate: dilation %d (a step of %lld) is larger than axis %d of "
                         "size %lld",
                         p->dilation, (long long)step, i, (long long)view.shape[i]);
            return NULL;
        }
    for (int i = 0; i < view.ndim; i++)
        if ((mask >> i) & 1u) nd_layout_slice(&view, i, 0, step, (view.shape[i] + step - 1) / step);
    return array_view(st, a[0], &view);
}

static PyObject *undilate_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    /* dilate(g, axes, dilation); dilate() pads every axis to a multiple of
     * the step, so an input whose length was not one gets the extra
     * (all-zero) tail cropped */
    int ndim, dnd;
    int64_t shape[ND_MAX_DIMS], dshape[ND_MAX_DIMS], zero[ND_MAX_DIMS] = {0};
    PyObject *d = g_apply1(s, OP_DILATE, p, g);
    if (g_shape(s, g_input(s, 0), &ndim, shape) < 0 || g_shape(s, d, &dnd, dshape) < 0) return NULL;
    if (dnd == ndim && memcmp(dshape, shape, sizeof(int64_t) * (size_t)ndim) != 0)
        d = g_slice(s, d, ndim, zero, shape);
    return grads1(s, d);
}

/* ------------------------------------------------------------- conv */

static int conv_shapes(const nd_layout *x, const nd_layout *w, const op_params *p, int64_t *oh,
                       int64_t *ow) {
    if (x->ndim != 4 || w->ndim != 4) {
        PyErr_Format(PyExc_ValueError,
                     "conv needs a 4-D input (N, H, W, C_in) and a 4-D weight (K, K, C_in, C_out), "
                     "got %d-D and %d-D",
                     x->ndim, w->ndim);
        return -1;
    }
    int64_t k = w->shape[0], hp = x->shape[1] + 2 * (int64_t)p->padding,
            wp = x->shape[2] + 2 * (int64_t)p->padding;
    if (w->shape[1] != k || k < 1) {
        PyErr_Format(PyExc_ValueError, "conv needs a square kernel of size >= 1, got %lld x %lld",
                     (long long)w->shape[0], (long long)w->shape[1]);
        return -1;
    }
    if (w->shape[2] != x->shape[3]) {
        PyErr_Format(PyExc_ValueError,
                     "conv: the input has %lld channels but the weight expects %lld",
                     (long long)x->shape[3], (long long)w->shape[2]);
        return -1;
    }
    if (k > hp || k > wp) {
        PyErr_Format(PyExc_ValueError,
                     "conv: kernel size %lld exceeds the padded input (%lld x %lld)", (long long)k,
                     (long long)hp, (long long)wp);
        return -1;
    }
    *oh = (hp - k) / p->stride + 1;
    *ow = (wp - k) / p->stride + 1;
    return 0;
}

/* x zero-padded by `pad` along H and W, as a compact array. */
static PyObject *pad_hw(needle_state *st, PyObject *x, int64_t pad) {
    const nd_layout *l = array_layout(x);
    if (pad == 0) return array_compact(st, x);
    int64_t shape[4] = {l->shape[0], l->shape[1] + 2 * pad, l->shape[2] + 2 * pad, l->shape[3]};
    PyObject *out = array_full_like(st, x, 4, shape, 0.0f);
    if (out == NULL) return NULL;
    nd_array inner = NDArray_CAST(out)->array;
    nd_layout_slice(&inner.layout, 1, pad, 1, l->shape[1]);
    nd_layout_slice(&inner.layout, 2, pad, 1, l->shape[2]);
    return array_assign_into(st, out, &inner, &NDArray_CAST(x)->array);
}

static PyObject *conv_compute(needle_state *st, const op_params *p, PyObject *const *a,
                              Py_ssize_t n) {
    UNUSED(n);
    const nd_layout *xl = array_layout(a[0]), *wl = array_layout(a[1]);
    int64_t oh, ow;
    if (conv_shapes(xl, wl, p, &oh, &ow) < 0) return NULL;
    int64_t batch = xl->shape[0], cin = xl->shape[3], k = wl->shape[0], cout = wl->shape[3];
    int64_t s = p->stride;
    PyObject *padded = pad_hw(st, a[0], p->padding);
    if (padded == NULL) return NULL;
    /* im2col as a strided view: (n, i, j) picks the window at (i*s, j*s),
     * (a, b, c) walks inside it; compacting it is the only copy. */
    const nd_layout *pl = array_layout(padded);
    nd_layout col = {.ndim = 6, .offset = pl->offset};
    const int64_t shape[6] = {batch, oh, ow, k, k, cin};
    const int64_t strides[6] = {pl->strides[0], pl->strides[1] * s, pl->strides[2] * s,
                                pl->strides[1], pl->strides[2],     pl->strides[3]};
    memcpy(col.shape, shape, sizeof shape);
    memcpy(col.strides, strides, sizeof strides);
    PyObject *window = array_view(st, padded, &col);
    Py_DECREF(padded);
    if (window == NULL) return NULL;
    PyObject *cols = array_reshape(st, window, 2, (int64_t[]){batch * oh * ow, k * k * cin});
    Py_DECREF(window);
    PyObject *wm = cols ? array_reshape(st, a[1], 2, (int64_t[]){k * k * cin, cout}) : NULL;
    PyObject *out = NULL;
    if (wm != NULL) {
        nd_array prod;
        nd_status status =
            nd_array_matmul(&NDArray_CAST(cols)->array, &NDArray_CAST(wm)->array, &prod);
        PyObject *flat = array_result(st, status, &prod);
        if (flat != NULL) out = array_reshape(st, flat, 4, (int64_t[]){batch, oh, ow, cout});
        Py_XDECREF(flat);
    }
    Py_XDECREF(cols);
    Py_XDECREF(wm);
    return out;
}

/* The shapes conv's gradient works with. */
typedef struct conv_dims {
    const int64_t *x_shape;  /* (N, H, W, C_in)                          */
    const int64_t *gd_shape; /* the gradient dilated by the stride       */
    int64_t k, pad;          /* kernel size, padding                     */
} conv_dims;

/* The dilated gradient gd cut to [lo, hi) along H and W (lo_h, hi_h, lo_w, hi_w). */
static PyObject *cut_hw(grad_scope *s, PyObject *gd, const int64_t *gd_shape,
                        const int64_t *bounds) {
    if (bounds[0] == 0 && bounds[1] == gd_shape[1] && bounds[2] == 0 && bounds[3] == gd_shape[2])
        return gd;
    int64_t start[4] = {0, bounds[0], bounds[2], 0};
    int64_t stop[4] = {gd_shape[0], bounds[1], bounds[3], gd_shape[3]};
    return g_slice(s, gd, 4, start, stop);
}

/* dX = conv(dilate(g), flip(transpose(W, (2, 3)), (0, 1)), 1, K-1-p). The
 * dilated gradient is cut to the rows the input reached: the tail a stride
 * that does not divide H+2p-K leaves, and, when p > K-1, the head that only
 * padding saw (a negative padding, which conv has not). */
static PyObject *conv_grad_input(grad_scope *s, PyObject *gd, PyObject *w, const conv_dims *d) {
    int64_t q = d->k - 1 - d->pad, bounds[4];
    for (int i = 0; i < 2; i++) {
        int64_t len = d->x_shape[1 + i];
        bounds[2 * i] = q >= 0 ? 0 : -q;
        bounds[2 * i + 1] = q >= 0 ? len + 2 * d->pad - d->k + 1 : len + d->pad;
    }
    PyObject *wf = g_axes_op(s, OP_FLIP, g_transpose(s, w, 2, 3), 2, (int[]){0, 1}, 0);
    return g_conv(s, cut_hw(s, gd, d->gd_shape, bounds), wf, 1, (int)(q >= 0 ? q : 0));
}

/* dW = conv(transpose(X, (0, 3)), transpose(transpose(g, (0, 1)), (1, 2)), 1, p),
 * transposed back to (K, K, C_in, C_out). The gradient, as a kernel, must be
 * square: for H != W the shorter side of it and of X get zeros appended,
 * which add nothing to the sums. */
static PyObject *conv_grad_weight(grad_scope *s, PyObject *gd, PyObject *x, const conv_dims *d) {
    const int64_t *xs = d->x_shape, *gs = d->gd_shape;
    int64_t lh = xs[1] + 2 * d->pad - d->k + 1, lw = xs[2] + 2 * d->pad - d->k + 1;
    PyObject *gk = cut_hw(s, gd, gs, (int64_t[]){0, lh, 0, lw});
    PyObject *xt = g_transpose(s, x, 0, 3);
    PyObject *gt = g_transpose(s, g_transpose(s, gk, 0, 1), 1, 2);
    if (lh != lw) {
        int64_t l = lh > lw ? lh : lw;
        int64_t gt_from[4] = {lh, lw, xs[0], gs[3]}, gt_to[4] = {l, l, xs[0], gs[3]};
        int64_t xt_from[4] = {xs[3], xs[1], xs[2], xs[0]};
        int64_t xt_to[4] = {xs[3], xs[1] + l - lh, xs[2] + l - lw, xs[0]};
        gt = g_pad_end(s, gt, 4, gt_from, gt_to);
        xt = g_pad_end(s, xt, 4, xt_from, xt_to);
    }
    return g_transpose(s, g_transpose(s, g_conv(s, xt, gt, 1, (int)d->pad), 0, 1), 1, 2);
}

static PyObject *conv_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    PyObject *x = g_input(s, 0), *w = g_input(s, 1);
    int xnd, wnd, gnd;
    int64_t x_shape[ND_MAX_DIMS], w_shape[ND_MAX_DIMS], gd_shape[ND_MAX_DIMS];
    if (g_shape(s, x, &xnd, x_shape) < 0 || g_shape(s, w, &wnd, w_shape) < 0) return NULL;
    /* dilate(g, (1, 2), stride - 1); stride 1 skips the copy */
    PyObject *gd = p->stride > 1 ? g_axes_op(s, OP_DILATE, g, 2, (int[]){1, 2}, p->stride - 1) : g;
    if (g_shape(s, gd, &gnd, gd_shape) < 0) return NULL;
    conv_dims d = {x_shape, gd_shape, w_shape[0], p->padding};
    return grads2(s, conv_grad_input(s, gd, w, &d), conv_grad_weight(s, gd, x, &d));
}

/* -------------------------------------------------------- logsumexp */

/* log(sum(exp(a - m))) + m over the axes in mask, keeping them as size-1
 * dims; m is the max, clamped to finite values so that an all -inf (or a
 * +inf) slice gives -inf (inf) rather than nan. */
static PyObject *lse_keepdims(needle_state *st, PyObject *a, uint32_t mask) {
    PyObject *m = array_reduce(st, ND_REDUCE_MAX, a, mask, 1);
    PyObject *lo = m ? array_binary_scalar(st, ND_MAXIMUM, m, -FLT_MAX, 0) : NULL;
    PyObject *shift = lo ? array_binary_scalar(st, ND_MINIMUM, lo, FLT_MAX, 0) : NULL;
    Py_XDECREF(m);
    Py_XDECREF(lo);
    PyObject *centred = shift ? array_binary(st, ND_SUB, a, shift) : NULL;
    PyObject *e = centred ? array_unary(st, ND_EXP, centred) : NULL;
    Py_XDECREF(centred);
    PyObject *sum = e ? array_reduce(st, ND_REDUCE_SUM, e, mask, 1) : NULL;
    Py_XDECREF(e);
    PyObject *log = sum ? array_unary(st, ND_LOG, sum) : NULL;
    Py_XDECREF(sum);
    PyObject *r = log ? array_binary(st, ND_ADD, log, shift) : NULL;
    Py_XDECREF(log);
    Py_XDECREF(shift);
    return r;
}

/* Whether the axes in mask are the last axis alone, and it is not empty:
 * then the engine's row kernels (csrc/softmax.c) do in one read of the input
 * what lse_keepdims does in six passes. */
static int last_axis_only(int ndim, const int64_t *shape, uint32_t mask) {
    return ndim >= 1 && mask == 1u << (ndim - 1) && shape[ndim - 1] > 0;
}

static PyObject *logsumexp_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                   Py_ssize_t n) {
    UNUSED(n);
    const nd_layout *l = array_layout(a[0]);
    uint32_t mask;
    if (axes_to_mask(st, p, l->ndim, &mask) < 0) return NULL;
    int64_t shape[ND_MAX_DIMS];
    int ndim = 0;
    for (int i = 0; i < l->ndim; i++)
        if (!((mask >> i) & 1u)) shape[ndim++] = l->shape[i];
    /* Like Summation: reducing everything (axes=None) gives shape (1,). */
    if (!p->axes_given) {
        ndim = 1;
        shape[0] = 1;
    }
    nd_array rows;
    PyObject *kept =
        last_axis_only(l->ndim, l->shape, mask)
            ? array_result(st, nd_array_logsumexp_last(&NDArray_CAST(a[0])->array, 1, &rows), &rows)
            : lse_keepdims(st, a[0], mask);
    if (kept == NULL) return NULL;
    PyObject *r = array_reshape(st, kept, ndim, shape);
    Py_DECREF(kept);
    return r;
}

/* max(z) over the axes in mask (kept as size-1 dims, clamped to finite
 * values) from z's data, as a constant broadcast to z's shape: the course's
 * logsumexp takes its max from raw data too, so it is no part of the graph. */
static PyObject *g_max_shift(grad_scope *s, PyObject *z, int ndim, const int64_t *shape,
                             uint32_t mask) {
    PyObject *data = g_data(s, z);
    if (data == NULL) return NULL;
    if (!ndarray_check(s->st, data)) {
        PyErr_SetString(PyExc_TypeError, "a softmax gradient needs a Tensor holding an NDArray");
        return scope_fail(s);
    }
    PyObject *m = array_reduce(s->st, ND_REDUCE_MAX, data, mask, 1);
    PyObject *lo = m ? array_binary_scalar(s->st, ND_MAXIMUM, m, -FLT_MAX, 0) : NULL;
    PyObject *shift = lo ? array_binary_scalar(s->st, ND_MINIMUM, lo, FLT_MAX, 0) : NULL;
    Py_XDECREF(m);
    Py_XDECREF(lo);
    return g_broadcast(s, g_const(s, scope_keep(s, shift)), ndim, shape);
}

/* softmax(z) over the axes in mask as ops (a recorded graph in "needle"
 * mode): exp(z - m) / sum(exp(z - m)) with m the max. It sums to one at any
 * magnitude of z; exp(z - logsumexp(z)) does not, since a float32 logsumexp is
 * rounded by up to half an ulp of its value (32 at 1e9). */
static PyObject *g_softmax(grad_scope *s, PyObject *z, int ndim, const int64_t *shape,
                           uint32_t mask) {
    /* Not recorded (a cycle_free backward): over the last axis, the engine's
     * softmax rows, a constant, normalised the same way. */
    if (!is_recording() && last_axis_only(ndim, shape, mask)) {
        PyObject *data = g_data(s, z);
        if (data == NULL) return NULL;
        if (ndarray_check(s->st, data)) {
            nd_array out;
            nd_status status = nd_array_softmax_last(&NDArray_CAST(data)->array, 0, &out);
            return g_const(s, scope_keep(s, array_result(s->st, status, &out)));
        }
    }
    PyObject *e = g_unary(s, OP_EXP, g_sub(s, z, g_max_shift(s, z, ndim, shape, mask)));
    return g_div(s, e, g_expand(s, g_sum_mask(s, e, ndim, mask), ndim, shape, mask));
}

static PyObject *logsumexp_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                    PyObject *node) {
    UNUSED(node);
    /* softmax(z) * broadcast(g), g reshaped to keep the reduced axes as
     * size-1 dims */
    PyObject *z = g_input(s, 0);
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    uint32_t mask;
    if (g_shape(s, z, &ndim, shape) < 0 || axes_to_mask(s->st, p, ndim, &mask) < 0) return NULL;
    return grads1(s,
                  g_mul(s, g_softmax(s, z, ndim, shape, mask), g_expand(s, g, ndim, shape, mask)));
}

static PyObject *logsoftmax_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                    Py_ssize_t n) {
    UNUSED(p);
    UNUSED(n);
    if (array_layout(a[0])->ndim != 2) {
        PyErr_Format(PyExc_ValueError, "LogSoftmax needs a 2-D input, got %d-D",
                     array_layout(a[0])->ndim);
        return NULL;
    }
    if (last_axis_only(2, array_layout(a[0])->shape, 1u << 1)) {
        nd_array out;
        return array_result(st, nd_array_softmax_last(&NDArray_CAST(a[0])->array, 1, &out), &out);
    }
    PyObject *lse = lse_keepdims(st, a[0], 1u << 1);
    PyObject *r = lse ? array_binary(st, ND_SUB, a[0], lse) : NULL;
    Py_XDECREF(lse);
    return r;
}

static PyObject *logsoftmax_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                     PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    /* g - softmax(z) * broadcast(sum(g, axis 1)), softmax from the input
     * (max-shifted), not exp(node): see g_softmax */
    PyObject *z = g_input(s, 0);
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (g_shape(s, z, &ndim, shape) < 0) return NULL;
    PyObject *row_sums = g_expand(s, g_sum_mask(s, g, 2, 1u << 1), 2, shape, 1u << 1);
    return grads1(s, g_sub(s, g, g_mul(s, g_softmax(s, z, 2, shape, 1u << 1), row_sums)));
}

/* ------------------------------------------------ gather / scatter rows */

static PyObject *gather_rows_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                     Py_ssize_t n) {
    UNUSED(p);
    UNUSED(n);
    nd_array out;
    nd_status status =
        nd_array_gather_rows(&NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array, &out);
    return array_result(st, status, &out);
}

static PyObject *gather_rows_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                      PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    /* (scatter_add_rows(g, indices, rows), zeros: indices are not differentiable) */
    PyObject *indices = g_input(s, 1);
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (g_shape(s, g_input(s, 0), &ndim, shape) < 0) return NULL;
    op_params q = no_params;
    q.index = (Py_ssize_t)shape[0];
    PyObject *dt = g_wanted(s, 0) ? g_apply2(s, OP_SCATTER_ADD_ROWS, &q, g, indices) : g_unwanted();
    return grads2(s, dt, g_input_zeros(s, 1));
}

static PyObject *scatter_add_rows_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                          Py_ssize_t n) {
    UNUSED(n);
    nd_array out;
    nd_status status = nd_array_scatter_add_rows(
        &NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array, (int64_t)p->index, &out);
    return array_result(st, status, &out);
}

static PyObject *scatter_add_rows_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                           PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    /* (gather_rows(g, indices), zeros) */
    PyObject *indices = g_input(s, 1);
    PyObject *ds =
        g_wanted(s, 0) ? g_apply2(s, OP_GATHER_ROWS, &no_params, g, indices) : g_unwanted();
    return grads2(s, ds, g_input_zeros(s, 1));
}

/* ---------------------------------------------- softmax cross-entropy */

/* The engine's fused kernels (csrc/softmax.c): the forward reads the logits
 * once and returns the loss with each row's softmax statistics in its
 * storage; the gradient reads them back (checked to belong to these logits)
 * and reads the logits once more, writing the gradient once. Shapes, devices
 * and labels are checked there (ValueError, DeviceError, IndexError). */
static PyObject *xent_compute(needle_state *st, const op_params *p, PyObject *const *a,
                              Py_ssize_t n) {
    UNUSED(p);
    UNUSED(n);
    nd_array loss;
    nd_status status =
        nd_array_softmax_xent(&NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array, &loss);
    return array_result(st, status, &loss);
}

/* out_grad * (softmax(z) - one_hot(y)) / N as one constant, from the fused
 * kernel: loss is the node's data (its statistics are used when they are
 * this node's), g the out_grad's. */
static PyObject *xent_grad_fused(grad_scope *s, PyObject *z, PyObject *y, PyObject *loss,
                                 PyObject *g) {
    if (s->failed || loss == NULL || g == NULL) return NULL;
    if (!ndarray_check(s->st, g)) {
        PyErr_Format(PyExc_TypeError, "SoftmaxCrossEntropy needs an out_grad holding an NDArray");
        return scope_fail(s);
    }
    nd_array out;
    nd_status status =
        nd_array_softmax_xent_grad(&NDArray_CAST(z)->array, &NDArray_CAST(y)->array,
                                   ndarray_check(s->st, loss) ? &NDArray_CAST(loss)->array : NULL,
                                   &NDArray_CAST(g)->array, &out);
    return g_const(s, scope_keep(s, array_result(s->st, status, &out)));
}

static PyObject *xent_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    /* (out_grad * (softmax(z) - one_hot(y)) / N, zeros for the labels), one
     * (N, C) array from the fused kernel. Not recorded (a cycle_free
     * backward): a constant. Recorded ("needle" mode, create_graph): the op
     * SoftmaxCrossEntropyGrad(z, y, out_grad), which can be differentiated
     * again; the course's graph held two (N, C) arrays here (and a one-hot). */
    PyObject *logits = g_input(s, 0), *labels = g_input(s, 1);
    PyObject *z = g_data(s, logits), *y = g_data(s, labels);
    if (z == NULL || y == NULL) return NULL;
    if (!ndarray_check(s->st, z) || !ndarray_check(s->st, y)) {
        PyErr_SetString(PyExc_TypeError, "SoftmaxCrossEntropy needs Tensors holding NDArrays");
        return scope_fail(s);
    }
    PyObject *gz = is_recording() ? g_apply3(s, OP_SOFTMAX_XENT_GRAD, &no_params, logits, labels, g)
                                  : xent_grad_fused(s, z, y, g_data(s, node), g_data(s, g));
    return grads2(s, gz, g_input_zeros(s, 1));
}

/* SoftmaxCrossEntropyGrad(z, y, g) = g * (softmax(z) - one_hot(y)) / N, g
 * the loss's out_grad (one element): the cross-entropy's gradient as an op
 * of its own (the fused kernel, its statistics recomputed), so that a
 * recorded gradient stays differentiable. */
static PyObject *xent_grad_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                   Py_ssize_t n) {
    UNUSED(p);
    UNUSED(n);
    nd_array out;
    nd_status status =
        nd_array_softmax_xent_grad(&NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array, NULL,
                                   &NDArray_CAST(a[2])->array, &out);
    return array_result(st, status, &out);
}

static PyObject *xent_grad_gradient(grad_scope *s, const op_params *p, PyObject *adj,
                                    PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    /* With P = softmax(z) and G = adj * g: d/dz of sum(adj * out) is
     * P * (G - broadcast(sum(G * P, axis 1))) / N; d/dg is
     * sum(adj * (P - one_hot(y))) / N, the op itself at g = 1; the labels get
     * zeros. */
    PyObject *z = g_input(s, 0), *labels = g_input(s, 1), *scale = g_input(s, 2);
    int ndim, scale_ndim;
    int64_t shape[ND_MAX_DIMS], scale_shape[ND_MAX_DIMS];
    if (g_shape(s, z, &ndim, shape) < 0 || g_shape(s, scale, &scale_ndim, scale_shape) < 0)
        return NULL;
    if (ndim != 2) {
        PyErr_SetString(PyExc_ValueError, "SoftmaxCrossEntropyGrad needs logits (N, C)");
        return scope_fail(s);
    }
    int64_t one[2] = {1, 1};
    PyObject *g = g_mul(s, adj, g_broadcast(s, g_reshape(s, scale, 2, one), 2, shape));
    PyObject *prob = g_softmax(s, z, 2, shape, 1u << 1);
    PyObject *row_sums =
        g_expand(s, g_sum_mask(s, g_mul(s, g, prob), 2, 1u << 1), 2, shape, 1u << 1);
    PyObject *dz =
        g_scalar(s, OP_DIV_SCALAR, g_mul(s, prob, g_sub(s, g, row_sums)), (double)shape[0]);
    PyObject *unit = g_scalar(s, OP_ADD_SCALAR, g_zeros_like(s, scale), 1.0);
    PyObject *per_unit = g_apply3(s, OP_SOFTMAX_XENT_GRAD, &no_params, z, labels, unit);
    PyObject *dscale =
        g_reshape(s, g_sum_mask(s, g_mul(s, adj, per_unit), 2, 3u), scale_ndim, scale_shape);
    PyObject *items[3] = {dz, g_zeros_like(s, labels), dscale};
    return grads_n(s, items, 3);
}

void ops_nn_register(op_impl *t) {
    t[OP_FLIP] = (op_impl){flip_compute, flip_gradient};
    t[OP_DILATE] = (op_impl){dilate_compute, dilate_gradient};
    t[OP_UNDILATE] = (op_impl){undilate_compute, undilate_gradient};
    t[OP_CONV] = (op_impl){conv_compute, conv_gradient};
    t[OP_LOG_SOFTMAX] = (op_impl){logsoftmax_compute, logsoftmax_gradient};
    t[OP_LOG_SUM_EXP] = (op_impl){logsumexp_compute, logsumexp_gradient};
    t[OP_GATHER_ROWS] = (op_impl){gather_rows_compute, gather_rows_gradient};
    t[OP_SCATTER_ADD_ROWS] = (op_impl){scatter_add_rows_compute, scatter_add_rows_gradient};
    t[OP_SOFTMAX_XENT] = (op_impl){xent_compute, xent_gradient};
    t[OP_SOFTMAX_XENT_GRAD] = (op_impl){xent_grad_compute, xent_grad_gradient};
    ops_lstm_register(t);
}
