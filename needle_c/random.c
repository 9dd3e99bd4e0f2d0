/* random.c: where Device.rand, randn and randb take their values from, and
 * the one switch that decides it.
 *
 * Two sources. NumPy's global RNG on the host, copied onto the device: the
 * course's values, exactly (rand and randn are numpy.random.rand/randn of the
 * shape; randb is rand(*shape) <= p computed on the device). Or the engine's
 * Philox generator (csrc/philox.h) run on the array's device in one kernel,
 * keyed by one 64-bit draw from NumPy's global RNG per call, so that
 * numpy.random.seed still makes a run reproducible and no values cross from
 * the host. The switch (module state rng_mode; NEEDLE_RNG at import,
 * _set_rng_mode at run time): "auto" (the default) uses the device generator
 * on CUDA devices and NumPy on host devices, "host" NumPy everywhere,
 * "device" the device generator everywhere.
 */
#include "needle_c.h"

#include <stdlib.h>
#include <string.h>

#include "config.h"

enum { RNG_AUTO = 0, RNG_HOST = 1, RNG_DEVICE = 2, RNG_MODE_COUNT };
static const char *const rng_mode_names[RNG_MODE_COUNT] = {"auto", "host", "device"};

#define RNG_MODES_EXPECTED                                                                 \
    "expected 'auto' (the device generator on CUDA devices, NumPy's draws on the CPU), "   \
    "'host' (NumPy's draws copied to every device: the course's values) or 'device' (the " \
    "device generator on every device)"

/* The mode called text, or -1 with ValueError naming `where`. */
static int rng_mode_from_text(const char *where, const char *text) {
    for (int mode = 0; mode < RNG_MODE_COUNT; mode++)
        if (strcmp(text, rng_mode_names[mode]) == 0) return mode;
    PyErr_Format(PyExc_ValueError, "%s=%.40s: " RNG_MODES_EXPECTED, where, text);
    return -1;
}

static int uses_device_generator(const needle_state *st, const nd_device *dev) {
    return st->rng_mode == RNG_DEVICE ||
           (st->rng_mode == RNG_AUTO && nd_device_get_kind(dev) == ND_DEVICE_CUDA);
}

/* One draw from NumPy's global RNG: numpy.random.randint(0, 2**64, dtype="uint64").
 * 0, or -1 with an exception. */
static int draw_key(needle_state *st, uint64_t *key) {
    PyObject *high = PyLong_FromString("18446744073709551616", NULL, 10); /* 2**64 */
    PyObject *args = high ? Py_BuildValue("(iO)", 0, high) : NULL;
    PyObject *kwargs = args ? Py_BuildValue("{s:s}", "dtype", "uint64") : NULL;
    PyObject *randint = kwargs ? PyObject_GetAttrString(st->numpy_random, "randint") : NULL;
    PyObject *value = randint ? PyObject_Call(randint, args, kwargs) : NULL;
    PyObject *index = value ? PyNumber_Index(value) : NULL;
    Py_XDECREF(high);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_XDECREF(randint);
    Py_XDECREF(value);
    if (index == NULL) return -1;
    *key = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    return *key == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* A new array of shape on dev filled by the engine's generator; the key is
 * drawn from NumPy (when draw) after the array exists, so that a bad shape
 * or a failed allocation leaves NumPy's stream where it was. */
static PyObject *generated_array(needle_state *st, nd_device *dev, PyObject *shape,
                                 nd_random_params *params, int draw) {
    PyObject *array = ndarray_new_on(st, dev, shape, NULL, ND_FLOAT32);
    if (array == NULL) return NULL;
    if (draw && draw_key(st, &params->key) < 0) {
        Py_DECREF(array);
        return NULL;
    }
    nd_status status = nd_array_fill_random(&NDArray_CAST(array)->array, params);
    if (status != ND_OK) {
        Py_DECREF(array);
        return raise_status(st, status);
    }
    return array;
}

/* numpy.random.<draw>(*shape) (one draw of prod(shape) values from NumPy's
 * global RNG, as in the course), copied onto dev. The float32 array they go
 * to is allocated first, through needle's allocator: a shape past the
 * device's limit or memory is needle's OutOfMemoryError with its size,
 * raised before NumPy allocates the draw's float64 values on the host (twice
 * the bytes, which needle does not count) and before NumPy's stream moves. */
static PyObject *host_array(needle_state *st, nd_device *dev, PyObject *shape, const char *draw) {
    PyObject *result = ndarray_new_on(st, dev, shape, NULL, ND_FLOAT32);
    if (result == NULL) return NULL;
    PyObject *callable = PyObject_GetAttrString(st->numpy_random, draw);
    PyObject *values = callable ? PyObject_Call(callable, shape, NULL) : NULL;
    Py_XDECREF(callable);
    int rc = values != NULL ? ndarray_write_object(st, result, values) : -1;
    Py_XDECREF(values);
    if (rc < 0) Py_CLEAR(result);
    return result;
}

/* The keywords of rand/randn (dtype) and randb (p, dtype). 0, or -1 with
 * TypeError or ValueError. */
static int parse_random_kwargs(PyObject *kwargs, const char *name, int takes_p, double *p,
                               nd_dtype *dtype_out) {
    PyObject *dtype = kwargs ? PyDict_GetItemString(kwargs, "dtype") : NULL;
    PyObject *p_obj = kwargs && takes_p ? PyDict_GetItemString(kwargs, "p") : NULL;
    if (kwargs && PyDict_GET_SIZE(kwargs) > (dtype ? 1 : 0) + (p_obj ? 1 : 0)) {
        PyErr_Format(PyExc_TypeError, "%s() takes only the keyword arguments %s", name,
                     takes_p ? "p and dtype" : "dtype");
        return -1;
    }
    if (factory_dtype(dtype, dtype_out) < 0) return -1;
    if (p_obj == NULL) return 0;
    if (PyBool_Check(p_obj)) { /* init.randb refuses a bool as p too */
        PyErr_Format(PyExc_TypeError, "%s(): p must be a number, not bool", name);
        return -1;
    }
    *p = PyFloat_AsDouble(p_obj);
    if (*p == -1.0 && PyErr_Occurred()) return -1;
    if (!(*p >= 0.0 && *p <= 1.0)) { /* NaN fails too */
        PyErr_Format(PyExc_ValueError, "%s(): p must be a probability in [0, 1], got %R", name,
                     p_obj);
        return -1;
    }
    return 0;
}

/* Device.rand/randn/randb(*shape, [p,] dtype=None) from whichever source
 * the switch names for the device. */
static PyObject *device_random(PyObject *op, PyObject *args, PyObject *kwargs,
                               nd_random_kind kind) {
    static const char *const names[ND_RANDOM_KIND_COUNT] = {"rand", "randn", "randb"};
    const char *name = names[kind];
    needle_state *st = state_of_type(Py_TYPE(op));
    if (st == NULL) return NULL;
    double p = 0.5;
    nd_dtype dtype;
    if (parse_random_kwargs(kwargs, name, kind == ND_RANDOM_BERNOULLI, &p, &dtype) < 0) return NULL;
    nd_device *dev = device_from_object(st, op);
    if (dev == NULL) return NULL;
    PyObject *shape = shape_from_args(args);
    if (shape == NULL) return NULL;
    PyObject *result;
    if (uses_device_generator(st, dev)) {
        nd_random_params params = {kind, 0, 0, (float)p, NULL};
        result = generated_array(st, dev, shape, &params, 1);
    } else if (kind != ND_RANDOM_BERNOULLI) {
        result = host_array(st, dev, shape, name);
    } else {
        /* The course's randb, operation for operation: rand, then <= p on the device. */
        PyObject *uniform = host_array(st, dev, shape, "rand");
        PyObject *threshold = uniform ? PyFloat_FromDouble(p) : NULL;
        result = threshold ? PyObject_RichCompare(uniform, threshold, Py_LE) : NULL;
        Py_XDECREF(uniform);
        Py_XDECREF(threshold);
    }
    Py_DECREF(shape);
    /* Drawn in float32, the course's stream, then stored in the dtype. */
    return result != NULL ? ndarray_steal_as(st, result, dtype) : NULL;
}

PyObject *device_rand(PyObject *op, PyObject *args, PyObject *kwargs) {
    return device_random(op, args, kwargs, ND_RANDOM_UNIFORM);
}

PyObject *device_randn(PyObject *op, PyObject *args, PyObject *kwargs) {
    return device_random(op, args, kwargs, ND_RANDOM_NORMAL);
}

PyObject *device_randb(PyObject *op, PyObject *args, PyObject *kwargs) {
    return device_random(op, args, kwargs, ND_RANDOM_BERNOULLI);
}

/* ------------------------------------------------------ module functions */

static PyObject *module_set_rng_mode(PyObject *module, PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "the RNG mode must be a str, got %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const char *text = PyUnicode_AsUTF8(arg);
    int mode = text ? rng_mode_from_text("rng mode", text) : -1;
    if (mode < 0) return NULL;
    state_of_module(module)->rng_mode = mode;
    Py_RETURN_NONE;
}

static PyObject *module_get_rng_mode(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    return PyUnicode_FromString(rng_mode_names[state_of_module(module)->rng_mode]);
}

static PyObject *module_rng_uses_device(PyObject *module, PyObject *arg) {
    needle_state *st = state_of_module(module);
    nd_device *dev = device_from_object(st, arg);
    return dev ? PyBool_FromLong(uses_device_generator(st, dev)) : NULL;
}

/* The uint64 value of obj: 0, or -1 with TypeError / OverflowError. */
static int parse_u64(PyObject *obj, const char *what, uint64_t *out) {
    PyObject *index = PyNumber_Index(obj);
    if (index == NULL) return -1;
    *out = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if (*out == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_OverflowError, "_philox: %s must be in [0, 2**64), got %R", what, obj);
        return -1;
    }
    return 0;
}

static PyObject *module_philox(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"device", "distribution", "shape", "key", "stream", "p", NULL};
    static const char *const kinds[ND_RANDOM_KIND_COUNT] = {"uniform", "normal", "bernoulli"};
    PyObject *device, *shape, *key_obj, *stream_obj = NULL;
    const char *distribution;
    double p = 0.5;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OsOO|Od:_philox", kwlist, &device,
                                     &distribution, &shape, &key_obj, &stream_obj, &p))
        return NULL;
    needle_state *st = state_of_module(module);
    int kind = 0;
    while (kind < ND_RANDOM_KIND_COUNT && strcmp(distribution, kinds[kind]) != 0) kind++;
    if (kind == ND_RANDOM_KIND_COUNT) {
        PyErr_Format(PyExc_ValueError,
                     "_philox: unknown distribution %.40s (expected uniform, normal or bernoulli)",
                     distribution);
        return NULL;
    }
    nd_random_params params = {(nd_random_kind)kind, 0, 0, (float)p, NULL};
    if (parse_u64(key_obj, "key", &params.key) < 0) return NULL;
    if (stream_obj != NULL && parse_u64(stream_obj, "stream", &params.stream) < 0) return NULL;
    if (!(p >= 0.0 && p <= 1.0)) { /* in double: (float)p could round into range */
        char text[64];
        snprintf(text, sizeof text, "%g", p);
        PyErr_Format(PyExc_ValueError, "_philox: p must be a probability in [0, 1], got %s", text);
        return NULL;
    }
    nd_device *dev = device_from_object(st, device);
    return dev ? generated_array(st, dev, shape, &params, 0) : NULL;
}

PyMethodDef random_device_methods[] = {
    {"rand", (PyCFunction)(void (*)(void))device_rand, METH_VARARGS | METH_KEYWORDS,
     "rand($self, /, *shape, dtype='float32')\n--\n\nUniform [0, 1) values: "
     "numpy.random.rand(*shape) copied here, or the device generator (one kernel keyed by one "
     "draw from NumPy's global RNG) where needle.random's mode says so (CUDA by default)."},
    {"randn", (PyCFunction)(void (*)(void))device_randn, METH_VARARGS | METH_KEYWORDS,
     "randn($self, /, *shape, dtype='float32')\n--\n\nStandard normal values: "
     "numpy.random.randn(*shape) copied here, or the device generator (see rand)."},
    {"randb", (PyCFunction)(void (*)(void))device_randb, METH_VARARGS | METH_KEYWORDS,
     "randb($self, /, *shape, p=0.5, dtype='float32')\n--\n\n1.0 where a uniform value is "
     "<= p, else 0.0: rand(*shape) <= p from NumPy's draws, or one bernoulli kernel of the "
     "device generator (see rand). p must be in [0, 1]."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef random_module_functions[] = {
    {"_set_rng_mode", module_set_rng_mode, METH_O,
     "_set_rng_mode(mode, /)\n--\n\nWhere Device.rand/randn/randb draw: 'auto', 'host' or "
     "'device' (needle.random.set_rng_mode)."},
    {"_get_rng_mode", module_get_rng_mode, METH_NOARGS,
     "_get_rng_mode()\n--\n\nThe RNG mode: 'auto', 'host' or 'device'."},
    {"_rng_uses_device", module_rng_uses_device, METH_O,
     "_rng_uses_device(device, /)\n--\n\nTrue when draws on device come from the device "
     "generator under the current mode, False when they are NumPy's."},
    {"_philox", (PyCFunction)(void (*)(void))module_philox, METH_VARARGS | METH_KEYWORDS,
     "_philox(device, distribution, shape, key, stream=0, p=0.5)\n--\n\nA new array of shape "
     "on device filled by the engine's Philox4x32-10 generator under an explicit 64-bit key and "
     "stream: 'uniform' [0, 1), 'normal' or 'bernoulli' (1.0 where the uniform is <= p). Draws "
     "nothing from NumPy."},
    {NULL, NULL, 0, NULL},
};

int random_module_init(PyObject *module, needle_state *st) {
    st->rng_mode = RNG_AUTO;
    /* The table's choices are "auto|host|device", the order of rng_mode_names (each mode is
     * checked through NEEDLE_RNG by tests/test_random.py). */
    int mode = RNG_AUTO;
    if (nd_config_choice(ND_CFG_RNG, &mode) < 0) {
        PyErr_SetString(PyExc_ValueError, nd_last_error());
        return -1;
    }
    st->rng_mode = mode;
    return PyModule_AddFunctions(module, random_module_functions);
}
