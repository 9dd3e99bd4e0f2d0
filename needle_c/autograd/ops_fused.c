/* ops_fused.c: compute (NDArrays) and gradient (Tensors) of the fused ops of
 * the course's transformer, each one engine call (csrc/fused_rows.c) where
 * the course composes many ops:
 * - LayerNorm(eps)(x, w, b): LayerNorm1d over the last axis;
 * - AttentionSoftmax(divisor, causal)(logits): softmax(logits / divisor +
 *   the causal mask when causal is nonzero) over the last axis, what
 *   MultiHeadAttention computes from q @ k^T.
 *
 * A gradient not recorded (a cycle_free backward) is the engine's fused
 * backward, as constants. Recorded ("needle" mode, create_graph), it is the
 * backward as ops of their own, LayerNormGrad(eps, part)(x, w, g) and
 * AttentionSoftmaxGrad(divisor)(y, g), each one engine call and one array
 * in the graph, whose gradients are composed from differentiable ops, so
 * that the gradient can be differentiated again. (Composed from primitive
 * ops, the recorded backward held 13 arrays of x's shape per LayerNorm and
 * 5 of the logits' shape per softmax, which the course's graph mode keeps
 * until reset_grad().) Both modes give the same values to rounding
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

/* LayerNormGrad's parts: its output is dx (x's shape) or dw ((cols,)). */
enum { LN_PART_X = 0, LN_PART_W = 1 };

static const op_params no_params;

/* LayerNormGrad(eps, part)(x, w, g), the op the recorded gradient uses. */
static PyObject *g_layer_norm_grad(grad_scope *s, double eps, int part, PyObject *x, PyObject *w,
                                   PyObject *g) {
    op_params p = no_params;
    p.scalar = eps;
    p.scalar2 = part;
    return g_apply3(s, OP_LAYER_NORM_GRAD, &p, x, w, g);
}

static PyObject *layer_norm_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                     PyObject *node) {
    UNUSED(node);
    if (!is_recording()) return fused_gradient(s, p, g);
    /* dx and dw as LayerNormGrad nodes, db = the column sums of g: one
     * array of x's shape in the graph */
    PyObject *x = g_input(s, 0), *w = g_input(s, 1), *b = g_input(s, 2);
    int ndim, wnd, bnd;
    int64_t shape[ND_MAX_DIMS], wshape[ND_MAX_DIMS], bshape[ND_MAX_DIMS];
    if (g_shape(s, x, &ndim, shape) < 0 || g_shape(s, w, &wnd, wshape) < 0 ||
        g_shape(s, b, &bnd, bshape) < 0)
        return NULL;
    uint32_t leading = (1u << (ndim - 1)) - 1u;
    PyObject *dx = g_layer_norm_grad(s, p->scalar, LN_PART_X, x, w, g);
    PyObject *dw = g_reshape(s, g_layer_norm_grad(s, p->scalar, LN_PART_W, x, w, g), wnd, wshape);
    PyObject *db = g_reshape(s, leading ? g_sum_mask(s, g, ndim, leading) : g, bnd, bshape);
    return grads_n(s, (PyObject *[]){dx, dw, db}, 3);
}

/* ------------------------------------------------------- layer norm grad */

static PyObject *layer_norm_grad_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                         Py_ssize_t n) {
    UNUSED(n);
    if (p->scalar2 != LN_PART_X && p->scalar2 != LN_PART_W) {
        /* PyErr_Format has no %g (from 3.12 it raises SystemError): format the double here */
        char text[64];
        snprintf(text, sizeof text, "%g", p->scalar2);
        PyErr_Format(PyExc_ValueError, "LayerNormGrad's part is %d (dx) or %d (dw), got %s",
                     LN_PART_X, LN_PART_W, text);
        return NULL;
    }
    nd_array dx, dw, db;
    nd_status status =
        nd_array_layer_norm_grad(&NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array,
                                 &NDArray_CAST(a[2])->array, (float)p->scalar, &dx, &dw, &db);
    if (status == ND_OK) {
        nd_array_release(&db);
        nd_array_release(p->scalar2 == LN_PART_X ? &dw : &dx);
    }
    return array_result(st, status, p->scalar2 == LN_PART_X ? &dx : &dw);
}

/* The mean over the last axis, broadcast back to shape. */
static PyObject *row_mean(grad_scope *s, PyObject *a, int ndim, const int64_t *shape) {
    uint32_t last = 1u << (ndim - 1);
    PyObject *sum = g_sum_mask(s, a, ndim, last);
    return g_expand(s, g_scalar(s, OP_DIV_SCALAR, sum, (double)shape[ndim - 1]), ndim, shape, last);
}

/* A parameter of cols elements as a row broadcast to shape. */
static PyObject *row_broadcast(grad_scope *s, PyObject *v, int ndim, const int64_t *shape) {
    int64_t row[ND_MAX_DIMS];
    for (int i = 0; i < ndim; i++) row[i] = i == ndim - 1 ? shape[i] : 1;
    return g_broadcast(s, g_reshape(s, v, ndim, row), ndim, shape);
}

/* Second derivatives, per row of n columns, with xhat = (x - mean) / std,
 * P(v) = v - mean(v) - xhat * mean(xhat * v) (symmetric) and adjoint a.
 * Part dx = P(g * w) / std: with q = P(a) / std (the op itself at w = 1,
 * g = a) and k = mean(g * w * xhat), d/dg = w * q, d/dw = the column sums
 * of g * q, d/dx = -(xhat * mean(a * dx) + dx * mean(a * xhat) + k * q) /
 * std. Part dw = the column sums of g * xhat: d/dg = a * xhat, d/dx = the
 * op's dx at w = a (P(g * a) / std), d/dw = 0. */
static PyObject *layer_norm_grad_gradient(grad_scope *s, const op_params *p, PyObject *adj,
                                          PyObject *node) {
    PyObject *x = g_input(s, 0), *w = g_input(s, 1), *g = g_input(s, 2);
    int ndim, wnd;
    int64_t shape[ND_MAX_DIMS], wshape[ND_MAX_DIMS];
    if (g_shape(s, x, &ndim, shape) < 0 || g_shape(s, w, &wnd, wshape) < 0) return NULL;
    uint32_t last = 1u << (ndim - 1), leading = last - 1u;
    PyObject *centred = g_sub(s, x, row_mean(s, x, ndim, shape));
    PyObject *var = row_mean(s, g_scalar(s, OP_POW_SCALAR, centred, 2.0), ndim, shape);
    PyObject *std = g_scalar(s, OP_POW_SCALAR, g_scalar(s, OP_ADD_SCALAR, var, p->scalar), 0.5);
    PyObject *xhat = g_div(s, centred, std);
    if (p->scalar2 == LN_PART_W) {
        PyObject *dx =
            g_wanted(s, 0) ? g_layer_norm_grad(s, p->scalar, LN_PART_X, x, adj, g) : g_unwanted();
        PyObject *dg =
            g_wanted(s, 2) ? g_mul(s, row_broadcast(s, adj, ndim, shape), xhat) : g_unwanted();
        return grads_n(s, (PyObject *[]){dx, g_input_zeros(s, 1), dg}, 3);
    }
    PyObject *ones = g_scalar(s, OP_ADD_SCALAR, g_zeros_like(s, w), 1.0);
    PyObject *q = g_layer_norm_grad(s, p->scalar, LN_PART_X, x, ones, adj);
    PyObject *wrow = row_broadcast(s, w, ndim, shape);
    PyObject *k = row_mean(s, g_mul(s, g_mul(s, g, wrow), xhat), ndim, shape);
    PyObject *terms = g_add(s,
                            g_add(s, g_mul(s, xhat, row_mean(s, g_mul(s, adj, node), ndim, shape)),
                                  g_mul(s, node, row_mean(s, g_mul(s, adj, xhat), ndim, shape))),
                            g_mul(s, k, q));
    PyObject *dx = g_neg(s, g_div(s, terms, std));
    PyObject *dw = g_reshape(
        s, leading ? g_sum_mask(s, g_mul(s, g, q), ndim, leading) : g_mul(s, g, q), wnd, wshape);
    return grads_n(s, (PyObject *[]){dx, dw, g_mul(s, wrow, q)}, 3);
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
    /* one array in the graph: AttentionSoftmaxGrad(divisor)(y, g), y the node itself */
    op_params q = no_params;
    q.scalar = p->scalar;
    return grads1(s, g_apply2(s, OP_ATTN_SOFTMAX_GRAD, &q, node, g));
}

/* --------------------------------------------------- attention softmax grad */

/* AttentionSoftmaxGrad(divisor)(y, g) = y * (g - sum(g * y)) / divisor, the
 * sum over the last axis: the engine's backward kernel as an op. */
static PyObject *attention_softmax_grad_compute(needle_state *st, const op_params *p,
                                                PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    nd_array dx;
    nd_status status = nd_array_attention_softmax_grad(
        &NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array, (float)p->scalar, &dx);
    return array_result(st, status, &dx);
}

/* With adjoint a: d/dg = y * (a - sum(a * y)) / divisor, the op itself at
 * g = a; d/dy = (a * (g - sum(g * y)) - g * sum(a * y)) / divisor. */
static PyObject *attention_softmax_grad_gradient(grad_scope *s, const op_params *p, PyObject *adj,
                                                 PyObject *node) {
    UNUSED(node);
    PyObject *y = g_input(s, 0), *g = g_input(s, 1);
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (g_shape(s, y, &ndim, shape) < 0) return NULL;
    uint32_t last = 1u << (ndim - 1);
    PyObject *dy = g_unwanted(), *dg = g_unwanted();
    if (g_wanted(s, 0)) {
        PyObject *gy = g_expand(s, g_sum_mask(s, g_mul(s, g, y), ndim, last), ndim, shape, last);
        PyObject *ay = g_expand(s, g_sum_mask(s, g_mul(s, adj, y), ndim, last), ndim, shape, last);
        dy = g_scalar(s, OP_DIV_SCALAR, g_sub(s, g_mul(s, adj, g_sub(s, g, gy)), g_mul(s, g, ay)),
                      p->scalar);
    }
    if (g_wanted(s, 1)) dg = g_apply2(s, OP_ATTN_SOFTMAX_GRAD, p, y, adj);
    return grads2(s, dy, dg);
}

void ops_fused_register(op_impl *t) {
    t[OP_LAYER_NORM] = (op_impl){layer_norm_compute, layer_norm_gradient};
    t[OP_ATTN_SOFTMAX] = (op_impl){attention_softmax_compute, attention_softmax_gradient};
    t[OP_LAYER_NORM_GRAD] = (op_impl){layer_norm_grad_compute, layer_norm_grad_gradient};
    t[OP_ATTN_SOFTMAX_GRAD] =
        (op_impl){attention_softmax_grad_compute, attention_softmax_grad_gradient};
}
