/* array_helpers.c: the shared NDArray helpers of array_helpers.h. */
#include "array_helpers.h"

#include "dtype_convert.h"

const nd_layout *array_layout(PyObject *a) { return &NDArray_CAST(a)->array.layout; }

PyObject *array_result(needle_state *st, nd_status status, nd_array *out) {
    return status == ND_OK ? ndarray_wrap(st, out) : raise_status(st, status);
}

PyObject *array_view(needle_state *st, PyObject *a, const nd_layout *layout) {
    nd_array view = {NDArray_CAST(a)->array.storage, *layout};
    nd_storage_retain(view.storage);
    return ndarray_wrap(st, &view);
}

PyObject *array_compact(needle_state *st, PyObject *a) {
    if (nd_layout_is_contiguous(array_layout(a))) return Py_NewRef(a);
    nd_array out;
    return array_result(st, nd_array_compact_copy(&NDArray_CAST(a)->array, NULL, &out), &out);
}

PyObject *array_reshape(needle_state *st, PyObject *a, int ndim, const int64_t *shape) {
    nd_layout layout;
    nd_status status = nd_layout_reshape(array_layout(a), ndim, shape, &layout);
    if (status == ND_OK) return array_view(st, a, &layout);
    if (status != ND_ERR_NOT_VIEWABLE) return raise_status(st, status);
    /* A fresh row-major copy, which every shape of its size can view. */
    nd_array copy;
    if ((status = nd_array_compact_copy(&NDArray_CAST(a)->array, NULL, &copy)) != ND_OK)
        return raise_status(st, status);
    if ((status = nd_layout_reshape(&copy.layout, ndim, shape, &layout)) != ND_OK) {
        nd_array_release(&copy);
        return raise_status(st, status);
    }
    copy.layout = layout;
    return ndarray_wrap(st, &copy);
}

PyObject *array_binary(needle_state *st, nd_binary_op op, PyObject *a, PyObject *b) {
    nd_operand x = {&NDArray_CAST(a)->array, 0}, y = {&NDArray_CAST(b)->array, 0};
    nd_array out;
    return array_result(st, nd_array_binary(op, x, y, &out), &out);
}

nd_operand array_scalar_operand(nd_binary_op op, const nd_array *a, double s) {
    /* The engine computes a scalar in the array's compute type: float64 as
     * the double it is, float32 rounded once to float. float16 and bfloat16
     * compute in float32, and the scalar is what PyTorch 2.13 makes of it
     * (checked bit for bit, tests/test_scalar_operands.py): a factor or a
     * divisor stays float32 (its products and quotients use the float32
     * scalar), anything else is rounded to the narrow type first (sums,
     * differences, comparisons, powers, maximum/minimum, clamp bounds). The
     * result is rounded once, to the array's dtype. */
    nd_dtype dtype = nd_array_dtype(a);
    if (op != ND_MUL && op != ND_DIV) {
        if (dtype == ND_FLOAT16) s = nd_half_to_float(nd_float_to_half((float)s));
        if (dtype == ND_BFLOAT16) s = nd_bf16_to_float(nd_float_to_bf16((float)s));
    }
    return (nd_operand){NULL, s};
}

PyObject *array_binary_scalar(needle_state *st, nd_binary_op op, PyObject *a, double s,
                              int reflected) {
    nd_operand x = {&NDArray_CAST(a)->array, 0},
               y = array_scalar_operand(op, &NDArray_CAST(a)->array, s);
    nd_array out;
    return array_result(
        st, reflected ? nd_array_binary(op, y, x, &out) : nd_array_binary(op, x, y, &out), &out);
}

PyObject *array_unary(needle_state *st, nd_unary_op op, PyObject *a) {
    nd_array out;
    return array_result(st, nd_array_unary(op, &NDArray_CAST(a)->array, &out), &out);
}

PyObject *array_reduce(needle_state *st, nd_reduce_op op, PyObject *a, uint32_t mask,
                       int keepdims) {
    nd_array out;
    return array_result(st, nd_array_reduce(op, &NDArray_CAST(a)->array, mask, keepdims, &out),
                        &out);
}

PyObject *array_empty_like(needle_state *st, PyObject *like, int ndim, const int64_t *shape) {
    nd_array out;
    const nd_array *a = &NDArray_CAST(like)->array;
    return array_result(
        st,
        nd_array_empty_typed(nd_storage_device(a->storage), ndim, shape, nd_array_dtype(a), &out),
        &out);
}

PyObject *array_full_like(needle_state *st, PyObject *like, int ndim, const int64_t *shape,
                          float value) {
    PyObject *out = array_empty_like(st, like, ndim, shape);
    if (out == NULL) return NULL;
    nd_status status = nd_array_fill(&NDArray_CAST(out)->array, value);
    if (status != ND_OK) {
        Py_DECREF(out);
        return raise_status(st, status);
    }
    return out;
}

PyObject *array_assign_into(needle_state *st, PyObject *out, nd_array *dst, const nd_array *src) {
    nd_status status = nd_array_assign(dst, src);
    if (status == ND_OK) return out;
    Py_DECREF(out);
    return raise_status(st, status);
}
