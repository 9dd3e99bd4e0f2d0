/* ndarray_ops.c: NDArray arithmetic: elementwise operators with NumPy
 * broadcasting, unary functions, reductions, matmul, pad, and the module
 * functions empty/full/stack.
 *
 * Every function validates its Python arguments here and leaves shapes,
 * devices and memory to the engine.
 */
#include "ndarray_internal.h"

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL needle_c_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

int as_operand(PyObject *obj, nd_operand *out) {
    out->array = NULL;
    out->scalar = 0.0f;
    if (IS_NDARRAY(obj)) {
        out->array = &NDArray_CAST(obj)->array;
        return 1;
    }
    double v;
    int rc = parse_scalar(obj, &v);
    if (rc == 1) out->scalar = v;
    return rc;
}

static needle_state *state_of_operands(PyObject *a, PyObject *b) {
    return ndarray_state(IS_NDARRAY(a) ? a : b);
}

static PyObject *binary(PyObject *a, PyObject *b, nd_binary_op op) {
    nd_operand x, y;
    int ra = as_operand(a, &x), rb = ra == 1 ? as_operand(b, &y) : 0;
    if (ra < 0 || rb < 0) return NULL;
    if (ra == 0 || rb == 0 || (x.array == NULL && y.array == NULL)) Py_RETURN_NOTIMPLEMENTED;
    if (x.array == NULL) x = array_scalar_operand(op, y.array, x.scalar);
    if (y.array == NULL) y = array_scalar_operand(op, x.array, y.scalar);
    needle_state *st = state_of_operands(a, b);
    nd_array out;
    return array_result(st, nd_array_binary(op, x, y, &out), &out);
}

PyObject *ndarray_add(PyObject *a, PyObject *b) { return binary(a, b, ND_ADD); }
PyObject *ndarray_subtract(PyObject *a, PyObject *b) { return binary(a, b, ND_SUB); }
PyObject *ndarray_multiply(PyObject *a, PyObject *b) { return binary(a, b, ND_MUL); }
PyObject *ndarray_true_divide(PyObject *a, PyObject *b) { return binary(a, b, ND_DIV); }

PyObject *ndarray_power(PyObject *a, PyObject *b, PyObject *mod) {
    if (mod != Py_None) {
        PyErr_SetString(PyExc_TypeError, "pow() with a modulus is not supported by NDArray");
        return NULL;
    }
    return binary(a, b, ND_POW);
}

PyObject *ndarray_richcompare(PyObject *a, PyObject *b, int op) {
    static const nd_binary_op ops[] = {[Py_LT] = ND_LT, [Py_LE] = ND_LE, [Py_EQ] = ND_EQ,
                                       [Py_NE] = ND_NE, [Py_GT] = ND_GT, [Py_GE] = ND_GE};
    return binary(a, b, ops[op]);
}

static PyObject *unary(PyObject *a, nd_unary_op op) { return array_unary(ndarray_state(a), op, a); }

PyObject *ndarray_negative(PyObject *a) { return unary(a, ND_NEG); }
PyObject *ndarray_absolute(PyObject *a) { return unary(a, ND_ABS); }

#define UNARY_METHOD(A, id, name, Class, doc, formula)                          \
    PyObject *ndarray_unary_##name(PyObject *a, PyObject *Py_UNUSED(ignored)) { \
        return unary(a, ND_##id);                                               \
    }
ND_EWISE_UNARY_OPS(UNARY_METHOD, )
#undef UNARY_METHOD

/* A binary row's method: op with an NDArray or a number, a TypeError otherwise. */
static PyObject *binary_method(PyObject *a, PyObject *b, nd_binary_op op, const char *name) {
    PyObject *r = binary(a, b, op);
    if (r == Py_NotImplemented) {
        Py_DECREF(r);
        PyErr_Format(PyExc_TypeError, "%s: expected an NDArray or a number, got %.100s", name,
                     Py_TYPE(b)->tp_name);
        return NULL;
    }
    return r;
}

#define BINARY_METHOD(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    ND_EW_IF(                                                                                \
        method, PyObject *ndarray_binary_##name(PyObject *a, PyObject *b) {                  \
            return binary_method(a, b, ND_##id, #method);                                    \
        })
ND_EWISE_BINARY_OPS(BINARY_METHOD, )
#undef BINARY_METHOD

PyObject *ndarray_matmul_slot(PyObject *a, PyObject *b) {
    if (!IS_NDARRAY(a) || !IS_NDARRAY(b)) Py_RETURN_NOTIMPLEMENTED;
    nd_array out;
    return array_result(ndarray_state(a),
                        nd_array_matmul(&NDArray_CAST(a)->array, &NDArray_CAST(b)->array, &out),
                        &out);
}

PyObject *ndarray_matmul(PyObject *a, PyObject *b) {
    if (!IS_NDARRAY(b)) {
        PyErr_Format(PyExc_TypeError, "matmul: expected an NDArray, got %.100s",
                     Py_TYPE(b)->tp_name);
        return NULL;
    }
    return ndarray_matmul_slot(a, b);
}

/* -------------------------------------------------------- reductions */

/* Positional and keyword arguments of a FASTCALL method, by name. */
static int parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      const char *const *names, int count, PyObject **values, const char *fname) {
    if (nargs > count) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, count,
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) values[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int found = 0;
        for (int i = 0; i < count; i++) {
            if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
                if (values[i] != NULL) {
                    PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'",
                                 fname, names[i]);
                    return -1;
                }
                values[i] = args[nargs + k];
                found = 1;
            }
        }
        if (!found) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname,
                         key);
            return -1;
        }
    }
    return 0;
}

/* A reduction's axis argument as a mask (all dims for None). */
static int axis_argument_mask(needle_state *st, PyObject *axis, int ndim, uint32_t *mask) {
    if (axis == NULL || axis == Py_None) return axes_mask(st, 0, NULL, ndim, mask);
    int naxes, axes[ND_MAX_DIMS];
    if (parse_axes(st, axis, &naxes, axes) < 0) return -1;
    return axes_mask(st, naxes, axes, ndim, mask);
}

static PyObject *reduce(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                        nd_reduce_op rop, const char *fname) {
    static const char *const names[] = {"axis", "keepdims"};
    PyObject *values[2] = {NULL, NULL};
    if (parse_args(args, nargs, kwnames, names, 2, values, fname) < 0) return NULL;
    NDArrayObject *self = NDArray_CAST(op);
    needle_state *st = ndarray_state(op);
    int keepdims = values[1] ? PyObject_IsTrue(values[1]) : 0;
    if (keepdims < 0) return NULL;
    uint32_t mask;
    if (axis_argument_mask(st, values[0], self->array.layout.ndim, &mask) < 0) return NULL;
    nd_array out;
    nd_status status = nd_array_reduce(rop, &self->array, mask, keepdims, &out);
    if (status != ND_OK) return raise_status(st, status);
    if ((values[0] == NULL || values[0] == Py_None) && !keepdims) {
        /* The course's convention: a full reduction has shape (1,). */
        int64_t one = 1;
        nd_layout_contiguous(1, &one, &out.layout);
    }
    return ndarray_wrap(st, &out);
}

PyObject *ndarray_sum(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
    return reduce(op, args, nargs, kw, ND_REDUCE_SUM, "sum");
}
PyObject *ndarray_max(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
    return reduce(op, args, nargs, kw, ND_REDUCE_MAX, "max");
}
PyObject *ndarray_min(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
    return reduce(op, args, nargs, kw, ND_REDUCE_MIN, "min");
}

/* --------------------------------------------------------------- pad */

PyObject *ndarray_pad(PyObject *op, PyObject *axes) {
    NDArrayObject *self = NDArray_CAST(op);
    needle_state *st = ndarray_state(op);
    const nd_layout *in = &self->array.layout;
    PyObject *seq = sequence_tuple(axes, "pad: axes must be a sequence of (before, after) pairs");
    if (seq == NULL) return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != in->ndim) {
        PyErr_Format(PyExc_ValueError, "pad: expected %d (before, after) pairs, got %zd", in->ndim,
                     PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return NULL;
    }
    int64_t before[ND_MAX_DIMS], shape[ND_MAX_DIMS];
    for (int i = 0; i < in->ndim; i++) {
        int n;
        int64_t pair[ND_MAX_DIMS];
        if (parse_int_tuple(PySequence_Fast_GET_ITEM(seq, i), "pad widths", &n, pair) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (n != 2 || pair[0] < 0 || pair[1] < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "pad: each axis needs a (before, after) pair of non-negative ints");
            Py_DECREF(seq);
            return NULL;
        }
        before[i] = pair[0];
        shape[i] = in->shape[i] + pair[0] + pair[1];
    }
    Py_DECREF(seq);
    nd_array out;
    nd_status status = nd_array_empty_typed(nd_storage_device(self->array.storage), in->ndim, shape,
                                            nd_array_dtype(&self->array), &out);
    if (status != ND_OK) return raise_status(st, status);
    nd_array interior = out;
    for (int i = 0; i < in->ndim; i++)
        nd_layout_slice(&interior.layout, i, before[i], 1, in->shape[i]);
    if ((status = nd_array_fill(&out, 0.0f)) != ND_OK ||
        (status = nd_array_assign(&interior, &self->array)) != ND_OK) {
        nd_array_release(&out);
        return raise_status(st, status);
    }
    return ndarray_wrap(st, &out);
}


/* --------------------------------------------------- module functions */

static PyObject *module_stack(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"arrays", "axis", NULL};
    PyObject *arrays, *axis_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:stack", kwlist, &arrays, &axis_obj))
        return NULL;
    needle_state *st = state_of_module(module);
    int axis = 0;
    if (axis_obj != NULL && parse_axis(st, axis_obj, &axis) < 0) return NULL;
    PyObject *seq = sequence_tuple(arrays, "stack: expected a sequence of NDArrays");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "stack: need at least one array");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!ndarray_check(st, PySequence_Fast_GET_ITEM(seq, i))) {
            PyErr_Format(PyExc_TypeError, "stack: item %zd is a %.100s, not an NDArray", i,
                         Py_TYPE(PySequence_Fast_GET_ITEM(seq, i))->tp_name);
            goto done;
        }
    }
    const nd_array *first = &NDArray_CAST(PySequence_Fast_GET_ITEM(seq, 0))->array;
    int ndim = first->layout.ndim;
    for (Py_ssize_t i = 1; i < n; i++) {
        const nd_layout *l = &NDArray_CAST(PySequence_Fast_GET_ITEM(seq, i))->array.layout;
        if (l->ndim != ndim ||
            memcmp(l->shape, first->layout.shape, sizeof(int64_t) * (size_t)ndim) != 0) {
            PyErr_SetString(PyExc_ValueError, "stack: all input arrays must have the same shape");
            goto done;
        }
    }
    int ax;
    if (ndim + 1 > ND_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "stack: the result would have more than %d dimensions",
                     ND_MAX_DIMS);
        goto done;
    }
    if (normalize_axis(st, axis, ndim + 1, &ax) < 0) goto done;
    int64_t shape[ND_MAX_DIMS];
    for (int i = 0, j = 0; i < ndim + 1; i++) shape[i] = i == ax ? n : first->layout.shape[j++];
    nd_array out;
    nd_status status = nd_array_empty_typed(nd_storage_device(first->storage), ndim + 1, shape,
                                            nd_array_dtype(first), &out);
    if (status != ND_OK) {
        raise_status(st, status);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n && status == ND_OK; i++) {
        nd_array slot = out;
        nd_layout_slice(&slot.layout, ax, i, 1, 1);
        nd_layout_drop_dim(&slot.layout, ax);
        status = nd_array_assign(&slot, &NDArray_CAST(PySequence_Fast_GET_ITEM(seq, i))->array);
    }
    if (status != ND_OK) {
        nd_array_release(&out);
        raise_status(st, status);
        goto done;
    }
    result = ndarray_wrap(st, &out);
done:
    Py_DECREF(seq);
    return result;
}

PyObject *ndarray_new_on(needle_state *st, nd_device *dev, PyObject *shape_obj, const double *fill,
                         nd_dtype dtype) {
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (parse_shape(shape_obj, SHAPE_EXACT, &ndim, shape) < 0) return NULL;
    nd_array arr;
    nd_status status = nd_array_empty_typed(dev, ndim, shape, dtype, &arr);
    if (status == ND_OK && fill != NULL && (status = nd_array_fill(&arr, *fill)) != ND_OK)
        nd_array_release(&arr);
    return array_result(st, status, &arr);
}

static PyObject *module_empty(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"shape", "device", NULL};
    PyObject *shape_obj, *device = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:empty", kwlist, &shape_obj, &device))
        return NULL;
    needle_state *st = state_of_module(module);
    nd_device *dev = device_from_object(st, device);
    return dev ? ndarray_new_on(st, dev, shape_obj, NULL, ND_FLOAT32) : NULL;
}

static PyObject *module_full(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"shape", "fill_value", "device", NULL};
    PyObject *shape_obj, *value_obj, *device = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:full", kwlist, &shape_obj, &value_obj,
                                     &device))
        return NULL;
    double value;
    if (parse_scalar_param(value_obj, &value) < 0 || check_fill_value(value, ND_FLOAT32) < 0)
        return NULL;
    needle_state *st = state_of_module(module);
    nd_device *dev = device_from_object(st, device);
    return dev ? ndarray_new_on(st, dev, shape_obj, &value, ND_FLOAT32) : NULL;
}

PyMethodDef ndarray_module_functions[] = {
    {"stack", (PyCFunction)(void (*)(void))module_stack, METH_VARARGS | METH_KEYWORDS,
     "stack(arrays, axis=0)\n--\n\nJoins equally shaped arrays along a new axis."},
    {"empty", (PyCFunction)(void (*)(void))module_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, device=None)\n--\n\nAn uninitialised float32 array."},
    {"full", (PyCFunction)(void (*)(void))module_full, METH_VARARGS | METH_KEYWORDS,
     "full(shape, fill_value, device=None)\n--\n\nA float32 array filled with fill_value."},
    {NULL, NULL, 0, NULL},
};
