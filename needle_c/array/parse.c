/* parse.c: the parsers of parse.h, one per kind of parameter (axes,
 * shapes, scalars, integer parameters), with their rules and messages in one
 * place for every surface (NDArray, Tensor, the Op classes). */
#include "parse.h"

#include <limits.h>

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL needle_c_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

/* ------------------------------------------------------------- integers */

/* Python's and NumPy's bool, which are numbers but never axes or sizes. */
static int is_bool(PyObject *obj) { return PyBool_Check(obj) || PyArray_IsScalar(obj, Bool); }

/* obj as a Python int (a new reference): TypeError for a bool or anything
 * without __index__. `what` names the value ("axis", "shape entries"). */
static PyObject *integer(PyObject *obj, const char *what) {
    if (is_bool(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be integers, not bool", what);
        return NULL;
    }
    if (!PyIndex_Check(obj) || PyFloat_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be integers, got %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return PyNumber_Index(obj);
}

/* obj's value when it is an int within int64; *overflow set (and the int
 * in *as_long, a new reference) when it is an int beyond. */
static int integer_value(PyObject *obj, const char *what, long long *out, int *overflow,
                         PyObject **as_long) {
    PyObject *value = integer(obj, what);
    if (value == NULL) return -1;
    *out = PyLong_AsLongLongAndOverflow(value, overflow);
    if (*out == -1 && PyErr_Occurred()) {
        Py_DECREF(value);
        return -1;
    }
    *as_long = value;
    return 0;
}

int parse_int_param(PyObject *obj, const char *what, int min, int max, int *out) {
    long long v;
    int overflow;
    PyObject *value;
    if (integer_value(obj, what, &v, &overflow, &value) < 0) return -1;
    if (overflow || v < min || v > max) {
        PyErr_Format(PyExc_ValueError, "%s %R is out of range [%d, %d]", what, value, min, max);
        Py_DECREF(value);
        return -1;
    }
    Py_DECREF(value);
    *out = (int)v;
    return 0;
}

/* obj's items as a tuple: an int is a 1-tuple, a tuple or list its items;
 * TypeError for anything else. */
static PyObject *int_items(PyObject *obj, const char *what) {
    if (PyTuple_Check(obj) || PyList_Check(obj)) return sequence_tuple(obj, what);
    if (PyIndex_Check(obj) || is_bool(obj)) return PyTuple_Pack(1, obj);
    PyErr_Format(PyExc_TypeError, "%s must be an int or a tuple of ints, got %.100s", what,
                 Py_TYPE(obj)->tp_name);
    return NULL;
}

int parse_int_tuple(PyObject *obj, const char *what, int *n, int64_t *values) {
    PyObject *items = int_items(obj, what);
    if (items == NULL) return -1;
    Py_ssize_t count = PyTuple_GET_SIZE(items);
    int rc = -1;
    if (count > ND_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: arrays have at most %d dimensions, got %zd", what,
                     ND_MAX_DIMS, count);
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        long long v;
        int overflow;
        PyObject *value;
        if (integer_value(PyTuple_GET_ITEM(items, i), what, &v, &overflow, &value) < 0) goto done;
        if (overflow) {
            PyErr_Format(PyExc_ValueError, "%s: %R does not fit in 64 bits", what, value);
            Py_DECREF(value);
            goto done;
        }
        Py_DECREF(value);
        values[i] = v;
    }
    *n = (int)count;
    rc = 0;
done:
    Py_DECREF(items);
    return rc;
}

/* ----------------------------------------------------------------- axes */

/* numpy.exceptions.AxisError(message) or AxisError(axis, ndim). */
static void raise_axis_error(needle_state *st, PyObject *args) {
    if (args == NULL) return;
    PyObject *exc = PyObject_CallObject(st->axis_error, args);
    Py_DECREF(args);
    if (exc == NULL) return;
    PyErr_SetObject(st->axis_error, exc);
    Py_DECREF(exc);
}

int parse_axis(needle_state *st, PyObject *obj, int *axis) {
    long long v;
    int overflow;
    PyObject *value;
    if (integer_value(obj, "axes", &v, &overflow, &value) < 0) return -1;
    if (overflow || v < INT_MIN || v > INT_MAX) {
        PyObject *message = PyUnicode_FromFormat(
            "axis %R is out of bounds for any array (at most %d dimensions)", value, ND_MAX_DIMS);
        Py_DECREF(value);
        raise_axis_error(st, message ? PyTuple_Pack(1, message) : NULL);
        Py_XDECREF(message);
        return -1;
    }
    Py_DECREF(value);
    *axis = (int)v;
    return 0;
}

int parse_axes(needle_state *st, PyObject *obj, int *naxes, int *axes) {
    if (!PyTuple_Check(obj) && !PyList_Check(obj) && !PyIndex_Check(obj) && !is_bool(obj)) {
        PyErr_Format(PyExc_TypeError, "axes must be None, an int or a tuple of ints, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *items = int_items(obj, "axes");
    if (items == NULL) return -1;
    Py_ssize_t count = PyTuple_GET_SIZE(items);
    int rc = -1;
    if (count > ND_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "axes: arrays have at most %d dimensions, got %zd axes",
                     ND_MAX_DIMS, count);
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (parse_axis(st, PyTuple_GET_ITEM(items, i), &axes[i]) < 0) goto done;
    *naxes = (int)count;
    rc = 0;
done:
    Py_DECREF(items);
    return rc;
}

int normalize_axis(needle_state *st, int axis, int ndim, int *out) {
    if (axis < -ndim || axis >= ndim) {
        raise_axis_error(st, Py_BuildValue("(ii)", axis, ndim));
        return -1;
    }
    *out = axis < 0 ? axis + ndim : axis;
    return 0;
}

int normalize_axes(needle_state *st, int naxes, const int *axes, int ndim, int *out) {
    uint32_t seen = 0;
    for (int i = 0; i < naxes; i++) {
        int a;
        if (normalize_axis(st, axes[i], ndim, &a) < 0) return -1;
        if (seen & (1u << a)) {
            PyErr_SetString(PyExc_ValueError, "duplicate value in 'axis'");
            return -1;
        }
        seen |= 1u << a;
        out[i] = a;
    }
    return 0;
}

int axes_mask(needle_state *st, int naxes, const int *axes, int ndim, uint32_t *mask) {
    *mask = 0;
    if (axes == NULL) {
        *mask = ndim >= 32 ? 0xFFFFFFFFu : (1u << ndim) - 1u;
        return 0;
    }
    int normalized[ND_MAX_DIMS];
    if (normalize_axes(st, naxes, axes, ndim, normalized) < 0) return -1;
    for (int i = 0; i < naxes; i++) *mask |= 1u << normalized[i];
    return 0;
}

/* --------------------------------------------------------------- shapes */

int parse_shape(PyObject *obj, shape_rule rule, int *ndim, int64_t *shape) {
    int n;
    if (parse_int_tuple(obj, "shape entries", &n, shape) < 0) return -1;
    int inferred = 0;
    int64_t size = 1;
    for (int i = 0; i < n; i++) {
        if (shape[i] == -1 && rule == SHAPE_INFER && !inferred) {
            inferred = 1;
            continue;
        }
        if (shape[i] < 0) {
            PyErr_Format(PyExc_ValueError,
                         rule == SHAPE_INFER
                             ? "shape entries must be non-negative (one may be -1), got %lld"
                             : "shape entries must be non-negative, got %lld",
                         (long long)shape[i]);
            return -1;
        }
        if (shape[i] != 0 && size > INT64_MAX / shape[i]) {
            PyErr_SetString(PyExc_ValueError, "the shape has more elements than fit in an int64");
            return -1;
        }
        size *= shape[i];
    }
    *ndim = n;
    return 0;
}

/* -------------------------------------------------------------- scalars */

int parse_scalar(PyObject *obj, double *out) {
    if (PyFloat_Check(obj) || PyLong_Check(obj)) { /* bool included: an int subclass */
        *out = PyFloat_AsDouble(obj);
        return (*out == -1.0 && PyErr_Occurred()) ? -1 : 1;
    }
    if (PyComplex_Check(obj) || PyUnicode_Check(obj) || PyBytes_Check(obj) || obj == Py_None)
        return 0;
    PyObject *value = NULL;
    if (!PySequence_Check(obj) && PyNumber_Check(obj)) {
        value = Py_NewRef(obj); /* a NumPy scalar, a 0-d array, a Fraction */
    } else if (PyObject_HasAttrString(obj, "__array_interface__") &&
               PyObject_HasAttrString(obj, "item")) {
        /* A NumPy array: a scalar when it holds exactly one element. */
        PyObject *size = PyObject_GetAttrString(obj, "size");
        if (size == NULL) {
            PyErr_Clear();
            return 0;
        }
        long n = PyLong_Check(size) ? PyLong_AsLong(size) : -1;
        Py_DECREF(size);
        if (n != 1) {
            PyErr_Clear();
            return 0;
        }
        value = PyObject_CallMethod(obj, "item", NULL);
        if (value == NULL) return -1;
    } else {
        return 0;
    }
    int rc = 0;
    /* NumPy's complex64 is no Python complex, and float() of it would drop
     * the imaginary part with only a warning. */
    if (!PyComplex_Check(value) && !PyArray_IsScalar(value, ComplexFloating)) {
        PyObject *f = PyNumber_Float(value);
        if (f == NULL) {
            PyErr_Clear();
        } else {
            *out = PyFloat_AS_DOUBLE(f);
            Py_DECREF(f);
            rc = 1;
        }
    }
    Py_DECREF(value);
    return rc;
}

int parse_scalar_param(PyObject *obj, double *out) {
    int rc = parse_scalar(obj, out);
    if (rc < 0 && PyLong_Check(obj) && PyErr_ExceptionMatches(PyExc_OverflowError)) {
        /* A parameter's value out of range is a bad value (ValueError), as the values
         * that fit a double but not the dtype are (check_fill_value). */
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError,
                        "an integer beyond float64's range is out of range for every dtype "
                        "(it would be inf)");
        return -1;
    }
    if (rc == 0)
        PyErr_Format(PyExc_TypeError,
                     "expected a real number (a Python or NumPy scalar, or a NumPy array of one "
                     "element), got %.100s",
                     Py_TYPE(obj)->tp_name);
    return rc == 1 ? 0 : -1;
}

/* --------------------------------------------------------------- dtypes */

int parse_dtype(PyObject *obj, nd_dtype *out, int *npy_type) {
    if (PyUnicode_Check(obj)) {
        const char *name = PyUnicode_AsUTF8(obj);
        if (name == NULL) return -1;
        if (nd_dtype_from_name(name, out) == ND_OK) return 1;
    }
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter2(obj, &descr) || descr == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "%R is not a dtype: expected 'float32', 'float16', 'bfloat16', 'float64' "
                     "or a NumPy dtype",
                     obj);
        return -1;
    }
    int type = descr->type_num;
    Py_DECREF(descr);
    if (npy_type != NULL) *npy_type = type;
    switch (type) {
    case NPY_FLOAT32: *out = ND_FLOAT32; return 1;
    case NPY_FLOAT16: *out = ND_FLOAT16; return 1;
    case NPY_FLOAT64: *out = ND_FLOAT64; return 1;
    default: return 0;
    }
}

int parse_dtype_param(PyObject *obj, nd_dtype *out) {
    int rc = parse_dtype(obj, out, NULL);
    if (rc == 0)
        PyErr_Format(PyExc_TypeError,
                     "needle arrays hold float32, float16, bfloat16 or float64, not %R", obj);
    return rc == 1 ? 0 : -1;
}

int dtype_npy_type(nd_dtype dtype) {
    switch (dtype) {
    case ND_FLOAT16: return NPY_FLOAT16;
    case ND_FLOAT64: return NPY_FLOAT64;
    default: return NPY_FLOAT32;
    }
}
