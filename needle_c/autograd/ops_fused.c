/* ops_fused.c: compute (NDArrays) and gradient (Tensors) of the fused ops of
 * the course's transformer, each one engine call (csrc/fused_rows.c) where
 * the course composes many ops:
 * - LayerNorm(eps)(x, w, b): LayerNorm1d over the last axis;
 * - AttentionSoftmax(divisor, causal)(logits): softmax(logits / divisor +
 *   the causal mask when causal is nonzero) over the last axis, what
 *   MultiHeadAttention computes from q @ k^T.
 *
 * A gradient not recorded (a cycle_free backward) is the engine's fused
 * backward, as constants. Recorded ("needle" mode, create_graph), it is
 * composed from differentiable ops, so that the gradient can itself be
 * differentiated; both give the same values to rounding
 * (tests/test_fused_ops.py).
 */
#include "grad_scope.h"
#include "ops_util.h"

#define UNUSED(x) (void)(x)

/* ------------------------------------------------------------- layer norm */

static PyObject *layer_norm_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                    Py_ssize_t n) {
    UNUSED(n);
    nd_array out;
    nd_status status = nd_array_layer_norm(&NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array,
                                           &NDArray_CAST(a[2])->array, (float)p->scalar, &out);
    return array_result(st, status, &out);
}

/* An engine result array as a constant of the scope, reshaped to `like`'s
 * shape (the weight and bias may be any shape of cols elements). */
static PyObject *const_shaped_like(grad_scope *s, nd_array *arr, PyObject *like) {
    PyObject *array = scope_keep(s, ndarray_wrap(s->st, arr));
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (array == NULL || g_shape(s, like, &ndim, shape) < 0) return NULL;
    return g_const(s, scope_keep(s, array_reshape(s->st, array, ndim, shape)));
}

/* (dx, dw, db) from the engine's fused backward, as constants. */
static PyObject *fused_gradient(grad_scope *s, const op_params *p, PyObject *g) {
    PyObject *w = g_input(s, 1);
    PyObject *xd = g_data(s, g_input(s, 0)), *wd = g_data(s, w), *gd = g_data(s, g);
    if (xd == NULL || wd == NULL || gd == NULL) return NULL;
    if (!ndarray_check(s->st, xd) || !ndarray_check(s->st, wd) || !ndarray_check(s->st, gd)) {
        PyErr_SetString(PyExc_TypeError, "LayerNorm's gradient needs Tensors holding NDArrays");
        return scope_fail(s);
    }
    nd_array dx, dw, db;
    nd_status status =
        nd_array_layer_norm_grad(&NDArray_CAST(xd)->array, &NDArray_CAST(wd)->array,
                                 &NDArray_CAST(gd)->array, (float)p->scalar, &dx, &dw, &db);
    if (status != ND_OK) {
        raise_status(s->st, status);
        return scope_fail(s);
    }
    PyObject *gx = g_const(s, scope_keep(s, ndarray_wrap(s->st, &dx)));
    /* wrapped even after a failure above, so that neither result leaks */
    PyObject *gw = const_shaped_like(s, &dw, w);
    PyObject *gb = const_shaped_like(s, &db, g_input(s, 2));
    return grads_n(s, (PyObject *[]){gx, gw, gb}, 3);
}

/* The mean over the rows' last axis (rows, cols) -> (rows,), broadcast back. */
static PyObject *row_mean(grad_scope *s, PyObject *a, const int64_t *flat) {
    PyObject *sum = g_sum_mask(s, a, 2, 1u << 1);
    return g_expand(s, g_scalar(s, OP_DIV_SCALAR, sum, (double)flat[1]), 2, flat, 1u << 1);
}

/* (dx, dw, db) as ops on the rows (rows, cols), with xhat = (x - mean) / std
 * and gw = g * w: dx = (gw - mean(gw) - xhat * mean(gw * xhat)) / std, dw =
 * the column sums of g * xhat, db = those of g. */
static PyObject *composed_gradient(grad_scope *s, const op_params *p, PyObject *g) {
    PyObject *x = g_input(s, 0), *w = g_input(s, 1), *b = g_input(s, 2);
    int ndim, wnd, bnd;
    int64_t shape[ND_MAX_DIMS], wshape[ND_MAX_DIMS], bshape[ND_MAX_DIMS];
    if (g_shape(s, x, &ndim, shape) < 0 || g_shape(s, w, &wnd, wshape) < 0 ||
        g_shape(s, b, &bnd, bshape) < 0)
        return NULL;
    int64_t cols = shape[ndim - 1], rows = 1;
    for (int i = 0; i < ndim - 1; i++) rows *= shape[i];
    const int64_t flat[2] = {rows, cols}, one_row[2] = {1, cols};
    PyObject *x2 = g_reshape(s, x, 2, flat), *g2 = g_reshape(s, g, 2, flat);
    PyObject *centred = g_sub(s, x2, row_mean(s, x2, flat));
    PyObject *var = g_scalar(s, OP_DIV_SCALAR,
                             g_sum_mask(s, g_scalar(s, OP_POWER_SCALAR, centred, 2.0), 2, 1u << 1),
                             (double)cols);
    PyObject *std = g_expand(
        s, g_scalar(s, OP_POWER_SCALAR, g_scalar(s, OP_ADD_SCALAR, var, (float)p->scalar), 0.5), 2,
        flat, 1u << 1);
    PyObject *xhat = g_div(s, centred, std);
    PyObject *gw = g_mul(s, g2, g_broadcast(s, g_reshape(s, w, 2, one_row), 2, flat));
    PyObject *dx = g_div(s,
                         g_sub(s, g_sub(s, gw, row_mean(s, gw, flat)),
                               g_mul(s, xhat, row_mean(s, g_mul(s, gw, xhat), flat))),
                         std);
    PyObject *dw = g_reshape(s, g_sum_mask(s, g_mul(s, g2, xhat), 2, 1u), wnd, wshape);
    PyObject *db = g_reshape(s, g_sum_mask(s, g2, 2, 1u), bnd, bshape);
    return grads_n(s, (PyObject *[]){g_reshape(s, dx, ndim, shape), dw, db}, 3);
}

static PyObject *layer_norm_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                     PyObject *node) {
    UNUSED(node);
    return is_recording() ? composed_gradient(s, p, g) : fused_gradient(s, p, g);
}

/* ------------------------------------------------------ attention softmax */

static PyObject *attention_softmax_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                           Py_ssize_t n) {
    UNUSED(n);
    nd_array out;
    nd_status status = nd_array_attention_softmax(&NDArray_CAST(a[0])->array, (float)p->scalar,
                                                  p->scalar2 != 0.0, &out);
    return array_result(st, status, &out);
}

static PyObject *attention_softmax_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                            PyObject *node) {
    if (!is_recording()) {
        /* the engine's kernel on the output's and the out_grad's data */
        PyObject *y = g_data(s, node), *gd = g_data(s, g);
        if (y == NULL || gd == NULL) return NULL;
        if (!ndarray_check(s->st, y) || !ndarray_check(s->st, gd)) {
            PyErr_SetString(PyExc_TypeError,
                            "AttentionSoftmax's gradient needs Tensors holding NDArrays");
            return scope_fail(s);
        }
        nd_array dx;
        nd_status status = nd_array_attention_softmax_grad(
            &NDArray_CAST(y)->array, &NDArray_CAST(gd)->array, (float)p->scalar, &dx);
        if (status != ND_OK) {
            raise_status(s->st, status);
            return scope_fail(s);
        }
        return grads1(s, g_const(s, scope_keep(s, ndarray_wrap(s->st, &dx))));
    }
    /* (y * (g - broadcast(sum(g * y, last axis)))) / divisor, y the node itself */
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (g_shape(s, node, &ndim, shape) < 0) return NULL;
    uint32_t last = 1u << (ndim - 1);
    PyObject *dot = g_expand(s, g_sum_mask(s, g_mul(s, g, node), ndim, last), ndim, shape, last);
    return grads1(s, g_scalar(s, OP_DIV_SCALAR, g_mul(s, node, g_sub(s, g, dot)), p->scalar));
}

void ops_fused_register(op_impl *t) {
    t[OP_LAYER_NORM] = (op_impl){layer_norm_compute, layer_norm_gradient};
    t[OP_ATTN_SOFTMAX] = (op_impl){attention_softmax_compute, attention_softmax_gradient};
}
