/* factories.c: the array factories a Device carries (device.empty, full,
 * one_hot; rand, randn and randb are random.c's), and the parsing of a
 * factory's dtype and shape arguments that random.c shares.
 *
 * They are arrays' business, not devices': module.c adds them to the Device
 * type (device_add_methods), so device.c never calls the array layer.
 */
#include "needle_c.h"

#include "parse.h"

#include <math.h>

#include "dtype_convert.h"

int factory_dtype(PyObject *dtype, nd_dtype *out) {
    *out = ND_FLOAT32;
    if (dtype == NULL || dtype == Py_None) return 0;
    return parse_dtype_param(dtype, out);
}

int check_fill_value(double value, nd_dtype dtype) {
    if (!isfinite(value) || dtype == ND_FLOAT64) return 0; /* inf and NaN are asked for */
    /* FLT_MAX plus half an ulp: from there a double rounds to float32's infinity
     * (compared in double: an out-of-range conversion is undefined in C). */
    int inf = fabs(value) >= 0x1.ffffffp127;
    if (!inf && dtype == ND_FLOAT16) inf = isinf(nd_half_to_float(nd_float_to_half((float)value)));
    if (!inf && dtype == ND_BFLOAT16) inf = isinf(nd_bf16_to_float(nd_float_to_bf16((float)value)));
    if (!inf) return 0;
    char text[64];
    snprintf(text, sizeof text, "%g", value);
    PyErr_Format(PyExc_ValueError, "fill_value %s is out of range for %s (it would be inf)", text,
                 nd_dtype_name(dtype));
    return -1;
}

/* Shapes from varargs: rand(2, 3) or rand((2, 3)). */
PyObject *shape_from_args(PyObject *args) {
    if (PyTuple_GET_SIZE(args) == 1 &&
        (PyTuple_Check(PyTuple_GET_ITEM(args, 0)) || PyList_Check(PyTuple_GET_ITEM(args, 0))))
        return PySequence_Tuple(PyTuple_GET_ITEM(args, 0));
    return Py_NewRef(args);
}

static PyObject *device_one_hot(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"n", "i", "dtype", NULL};
    Py_ssize_t n;
    PyObject *index, *dtype = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nO|O:one_hot", kwlist, &n, &index, &dtype))
        return NULL;
    nd_dtype dt;
    if (factory_dtype(dtype, &dt) < 0) return NULL;
    needle_state *st = state_of_type(Py_TYPE(op));
    if (st == NULL) return NULL;
    nd_device *dev = device_from_object(st, op);
    if (dev == NULL) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "one_hot: n must be non-negative");
        return NULL;
    }
    PyObject *numpy = PyImport_ImportModule("numpy");
    if (numpy == NULL) return NULL;
    PyObject *eye = PyObject_CallMethod(numpy, "eye", "nnns", n, n, (Py_ssize_t)0, "float32");
    Py_DECREF(numpy);
    if (eye == NULL) return NULL;
    PyObject *rows = PyObject_GetItem(eye, index);
    Py_DECREF(eye);
    if (rows == NULL) return NULL;
    PyObject *result = ndarray_from_object(st, rows, dev, &dt);
    Py_DECREF(rows);
    return result;
}

/* empty and full: an array of shape_obj on op's device, filled when fill. */
static PyObject *device_new_array(PyObject *op, PyObject *shape_obj, PyObject *dtype, int fill,
                                  double value) {
    nd_dtype dt;
    if (factory_dtype(dtype, &dt) < 0) return NULL;
    needle_state *st = state_of_type(Py_TYPE(op));
    if (st == NULL) return NULL;
    if (fill && check_fill_value(value, dt) < 0) return NULL;
    nd_device *dev = device_from_object(st, op);
    return dev ? ndarray_new_on(st, dev, shape_obj, fill ? &value : NULL, dt) : NULL;
}

static PyObject *device_empty(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"shape", "dtype", NULL};
    PyObject *shape_obj, *dtype = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:empty", kwlist, &shape_obj, &dtype))
        return NULL;
    return device_new_array(op, shape_obj, dtype, 0, 0.0);
}

static PyObject *device_full(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"shape", "fill_value", "dtype", NULL};
    PyObject *shape_obj, *value_obj, *dtype = NULL;
    double value;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:full", kwlist, &shape_obj, &value_obj,
                                     &dtype) ||
        parse_scalar_param(value_obj, &value) < 0)
        return NULL;
    return device_new_array(op, shape_obj, dtype, 1, value);
}

PyMethodDef ndarray_device_factories[] = {
    {"empty", (PyCFunction)(void (*)(void))device_empty, METH_VARARGS | METH_KEYWORDS,
     "empty($self, /, shape, dtype='float32')\n--\n\nAn uninitialised array of the given shape."},
    {"full", (PyCFunction)(void (*)(void))device_full, METH_VARARGS | METH_KEYWORDS,
     "full($self, /, shape, fill_value, dtype='float32')\n--\n\nAn array filled with fill_value."},
    {"one_hot", (PyCFunction)(void (*)(void))device_one_hot, METH_VARARGS | METH_KEYWORDS,
     "one_hot($self, /, n, i, dtype='float32')\n--\n\nRows i of the n x n identity matrix."},
    {NULL, NULL, 0, NULL},
};
