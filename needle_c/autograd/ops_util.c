/* ops_util.c: small helpers the op implementations share: NDArray results
 * from engine calls, and Tensor-level building blocks for gradients (each
 * goes through apply_op, so it is recorded in "needle" mode). */
#include "ops_util.h"

const nd_layout *array_layout(PyObject *a) { return &NDArray_CAST(a)->array.layout; }

static PyObject *result(needle_state *st, nd_status status, nd_array *out) {
    if (status != ND_OK) return raise_status(st, status);
    return ndarray_wrap(st, out);
}

PyObject *nd_binary_arrays(needle_state *st, nd_binary_op op, PyObject *a, PyObject *b) {
    nd_operand x = {&NDArray_CAST(a)->array, 0}, y = {&NDArray_CAST(b)->array, 0};
    nd_array out;
    return result(st, nd_array_binary(op, x, y, &out), &out);
}

PyObject *nd_binary_scalar(needle_state *st, nd_binary_op op, PyObject *a, double s, int reflected) {
    nd_operand x = {&NDArray_CAST(a)->array, 0}, y = {NULL, (float)s};
    nd_array out;
    return result(st, reflected ? nd_array_binary(op, y, x, &out) : nd_array_binary(op, x, y, &out), &out);
}

PyObject *nd_unary_array(needle_state *st, nd_unary_op op, PyObject *a) {
    nd_array out;
    return result(st, nd_array_unary(op, &NDArray_CAST(a)->array, &out), &out);
}

PyObject *nd_reduce_array(needle_state *st, nd_reduce_op op, PyObject *a, uint32_t mask, int keepdims) {
    nd_array out;
    return result(st, nd_array_reduce(op, &NDArray_CAST(a)->array, mask, keepdims, &out), &out);
}

PyObject *nd_layout_view(needle_state *st, PyObject *a, const nd_layout *layout) {
    nd_array view = {NDArray_CAST(a)->array.storage, *layout};
    nd_storage_retain(view.storage);
    return ndarray_wrap(st, &view);
}

PyObject *nd_compact_array(needle_state *st, PyObject *a) {
    if (nd_layout_is_contiguous(array_layout(a))) return Py_NewRef(a);
    nd_array out;
    return result(st, nd_array_compact_copy(&NDArray_CAST(a)->array, NULL, &out), &out);
}

PyObject *nd_reshape_array(needle_state *st, PyObject *a, int ndim, const int64_t *shape) {
    nd_layout layout;
    nd_status status = nd_layout_reshape(array_layout(a), ndim, shape, &layout);
    if (status == ND_OK) return nd_layout_view(st, a, &layout);
    if (status != ND_ERR_NOT_VIEWABLE) return raise_status(st, status);
    PyObject *compact = nd_compact_array(st, a);
    if (compact == NULL) return NULL;
    PyObject *r = nd_reshape_array(st, compact, ndim, shape);
    Py_DECREF(compact);
    return r;
}

PyObject *nd_empty_like_shape(needle_state *st, PyObject *like, int ndim, const int64_t *shape) {
    nd_array out;
    return result(st, nd_array_empty(nd_storage_device(NDArray_CAST(like)->array.storage), ndim, shape, &out),
                  &out);
}

PyObject *nd_full_like_shape(needle_state *st, PyObject *like, int ndim, const int64_t *shape, float value) {
    PyObject *out = nd_empty_like_shape(st, like, ndim, shape);
    if (out == NULL) return NULL;
    nd_status status = nd_array_fill(&NDArray_CAST(out)->array, value);
    if (status != ND_OK) {
        Py_DECREF(out);
        return raise_status(st, status);
    }
    return out;
}

int axes_to_mask(const op_params *p, int ndim, uint32_t *mask) {
    *mask = 0;
    if (!p->axes_given) {
        *mask = ndim >= 32 ? 0xFFFFFFFFu : (1u << ndim) - 1u;
        return 0;
    }
    for (int i = 0; i < p->naxes; i++) {
        int axis;
        if (nd_normalize_axis(p->axes[i], ndim, &axis) != ND_OK) {
            PyErr_SetString(PyExc_ValueError, nd_last_error());
            return -1;
        }
        if (*mask & (1u << axis)) {
            PyErr_Format(PyExc_ValueError, "repeated axis %d", axis);
            return -1;
        }
        *mask |= 1u << axis;
    }
    return 0;
}

/* ------------------------------------------------ Tensor building blocks */

static const op_params no_params;

PyObject *t_add(needle_state *st, PyObject *a, PyObject *b) { return apply2(st, OP_EWISE_ADD, &no_params, a, b); }
PyObject *t_mul(needle_state *st, PyObject *a, PyObject *b) { return apply2(st, OP_EWISE_MUL, &no_params, a, b); }
PyObject *t_div(needle_state *st, PyObject *a, PyObject *b) { return apply2(st, OP_EWISE_DIV, &no_params, a, b); }
PyObject *t_matmul(needle_state *st, PyObject *a, PyObject *b) { return apply2(st, OP_MATMUL, &no_params, a, b); }
PyObject *t_unary(needle_state *st, op_kind kind, PyObject *a) { return apply1(st, kind, &no_params, a); }

PyObject *t_scalar(needle_state *st, op_kind kind, PyObject *a, double s) {
    op_params p = no_params;
    p.scalar = s;
    return apply1(st, kind, &p, a);
}

PyObject *t_reshape(needle_state *st, PyObject *a, int ndim, const int64_t *shape) {
    op_params p = no_params;
    p.ndim = ndim;
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)ndim);
    return apply1(st, OP_RESHAPE, &p, a);
}

PyObject *t_broadcast(needle_state *st, PyObject *a, int ndim, const int64_t *shape) {
    op_params p = no_params;
    p.ndim = ndim;
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)ndim);
    return apply1(st, OP_BROADCAST_TO, &p, a);
}

PyObject *t_sum_mask(needle_state *st, PyObject *a, int ndim, uint32_t mask) {
    op_params p = no_params;
    p.axes_given = 1;
    for (int i = 0; i < ndim; i++)
        if (mask & (1u << i)) p.axes[p.naxes++] = i;
    return apply1(st, OP_SUMMATION, &p, a);
}

PyObject *t_transpose_last(needle_state *st, PyObject *a) {
    return apply1(st, OP_TRANSPOSE, &no_params, a);
}

PyObject *t_const(needle_state *st, PyObject *array) { return make_const(st, array, 0); }

/* g summed down to the shape of `like` (the inverse of broadcasting). */
PyObject *unbroadcast(needle_state *st, PyObject *g, PyObject *like) {
    int gnd, lnd;
    const int64_t *gs = value_shape(st, g, &gnd), *ls = value_shape(st, like, &lnd);
    if (gs == NULL || ls == NULL) return NULL;
    if (gnd == lnd && memcmp(gs, ls, sizeof(int64_t) * (size_t)gnd) == 0) return Py_NewRef(g);
    int64_t target[ND_MAX_DIMS];
    memcpy(target, ls, sizeof(int64_t) * (size_t)lnd);
    uint32_t mask = 0;
    for (int i = 0; i < gnd; i++) {
        int li = i - (gnd - lnd);
        if (li < 0 || (ls[li] == 1 && gs[i] != 1)) mask |= 1u << i;
    }
    PyObject *summed = mask ? t_sum_mask(st, g, gnd, mask) : Py_NewRef(g);
    if (summed == NULL) return NULL;
    PyObject *r = t_reshape(st, summed, lnd, target);
    Py_DECREF(summed);
    return r;
}

PyObject *pack2(PyObject *a, PyObject *b) {
    if (a == NULL || b == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    PyObject *t = PyTuple_Pack(2, a, b);
    Py_DECREF(a);
    Py_DECREF(b);
    return t;
}

PyObject *pack1(PyObject *a) {
    if (a == NULL) return NULL;
    PyObject *t = PyTuple_Pack(1, a);
    Py_DECREF(a);
    return t;
}

PyObject *node_input(PyObject *node, Py_ssize_t i) { return PyTuple_GET_ITEM(Tensor_CAST(node)->inputs, i); }
