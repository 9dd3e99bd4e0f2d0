/* ops_util.c: NDArray helpers the op implementations share: engine calls
 * whose results are new NDArrays, and axes as bit masks. */
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

PyObject *nd_binary_scalar(needle_state *st, nd_binary_op op, PyObject *a, double s,
                           int reflected) {
    nd_operand x = {&NDArray_CAST(a)->array, 0}, y = {NULL, (float)s};
    nd_array out;
    return result(st, reflected ? nd_array_binary(op, y, x, &out) : nd_array_binary(op, x, y, &out),
                  &out);
}

PyObject *nd_unary_array(needle_state *st, nd_unary_op op, PyObject *a) {
    nd_array out;
    return result(st, nd_array_unary(op, &NDArray_CAST(a)->array, &out), &out);
}

PyObject *nd_reduce_array(needle_state *st, nd_reduce_op op, PyObject *a, uint32_t mask,
                          int keepdims) {
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
    return result(
        st, nd_array_empty(nd_storage_device(NDArray_CAST(like)->array.storage), ndim, shape, &out),
        &out);
}

PyObject *nd_full_like_shape(needle_state *st, PyObject *like, int ndim, const int64_t *shape,
                             float value) {
    PyObject *out = nd_empty_like_shape(st, like, ndim, shape);
    if (out == NULL) return NULL;
    nd_status status = nd_array_fill(&NDArray_CAST(out)->array, value);
    if (status != ND_OK) {
        Py_DECREF(out);
        return raise_status(st, status);
    }
    return out;
}

PyObject *nd_assign_into(needle_state *st, PyObject *out, nd_array *dst, const nd_array *src) {
    nd_status status = nd_array_assign(dst, src);
    if (status == ND_OK) return out;
    Py_DECREF(out);
    return raise_status(st, status);
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
