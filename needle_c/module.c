/* module.c: the needle_c extension module: its state, the Device type, the
 * exception types, the mapping from engine statuses to exceptions, and the
 * collection callback the engine calls when memory is short.
 */
#include "needle_c.h"
#include "autograd/tensor.h"

#include <structmember.h>

needle_state *state_of_module(PyObject *module) { return (needle_state *)PyModule_GetState(module); }

needle_state *state_of_type(PyTypeObject *type) {
    PyObject *module = PyType_GetModuleByDef(type, &needle_c_module);
    return module ? state_of_module(module) : NULL;
}

/* ------------------------------------------------------------ errors */

static void format_bytes(char *buf, size_t size, int64_t n) {
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (n < 1024) {
        snprintf(buf, size, "%lld bytes", (long long)n);
        return;
    }
    double v = (double)n;
    int u = -1;
    while (v >= 1024.0 && u < 3) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, size, "%lld bytes (%.2f %s)", (long long)n, v, units[u]);
}

static PyObject *raise_out_of_memory(needle_state *st) {
    nd_oom_info info;
    nd_last_oom(&info);
    nd_device *dev = nd_device_at(info.device_id);
    if (dev == NULL) {
        PyErr_SetString(st->out_of_memory, nd_last_error());
        return NULL;
    }
    char req[64], alloc[64], res[64], lim[64];
    format_bytes(req, sizeof req, info.requested);
    format_bytes(alloc, sizeof alloc, info.allocated);
    format_bytes(res, sizeof res, info.reserved);
    if (info.limit >= 0) format_bytes(lim, sizeof lim, info.limit);
    else snprintf(lim, sizeof lim, "none");
    PyObject *device = device_object(st, dev);
    PyObject *message = PyUnicode_FromFormat(
        "out of memory on %S: tried to allocate %s; %s allocated, %s reserved, limit %s", device,
        req, alloc, res, lim);
    if (message == NULL) return NULL;
    PyObject *err = PyObject_CallOneArg(st->out_of_memory, message);
    Py_DECREF(message);
    if (err == NULL) return NULL;
    PyObject *limit = info.limit >= 0 ? PyLong_FromLongLong(info.limit) : Py_NewRef(Py_None);
    PyObject *requested = PyLong_FromLongLong(info.requested);
    PyObject *allocated = PyLong_FromLongLong(info.allocated);
    PyObject *reserved = PyLong_FromLongLong(info.reserved);
    if (limit && requested && allocated && reserved &&
        PyObject_SetAttrString(err, "device", device) == 0 &&
        PyObject_SetAttrString(err, "requested", requested) == 0 &&
        PyObject_SetAttrString(err, "allocated", allocated) == 0 &&
        PyObject_SetAttrString(err, "reserved", reserved) == 0 &&
        PyObject_SetAttrString(err, "limit", limit) == 0)
        PyErr_SetObject(st->out_of_memory, err);
    Py_XDECREF(limit);
    Py_XDECREF(requested);
    Py_XDECREF(allocated);
    Py_XDECREF(reserved);
    Py_DECREF(err);
    return NULL;
}

PyObject *raise_status(needle_state *st, nd_status status) {
    switch (status) {
    case ND_OK:
        PyErr_SetString(PyExc_SystemError, "raise_status called without an error");
        break;
    case ND_ERR_INDEX:
        PyErr_SetString(PyExc_IndexError, nd_last_error());
        break;
    case ND_ERR_DEVICE:
    case ND_ERR_BACKEND:
        PyErr_SetString(st->device_error, nd_last_error());
        break;
    case ND_ERR_OOM:
        return raise_out_of_memory(st);
    case ND_ERR_INTERNAL:
        PyErr_SetString(PyExc_RuntimeError, nd_last_error());
        break;
    default:
        PyErr_SetString(PyExc_ValueError, nd_last_error());
        break;
    }
    return NULL;
}

/* ----------------------------------------------------------- devices */

PyObject *device_object(needle_state *st, const nd_device *dev) {
    return st->devices[nd_device_id(dev)];
}

static PyObject *make_device(needle_state *st, int engine_id, const char *name, int ordinal) {
    DeviceObject *d = PyObject_New(DeviceObject, st->device_type);
    if (d == NULL) return NULL;
    d->engine_id = engine_id;
    d->ordinal = ordinal;
    snprintf(d->name, sizeof d->name, "%s", name);
    return (PyObject *)d;
}

static nd_device *device_by_name(needle_state *st, const char *name, int ordinal) {
    for (int id = 0; id < nd_device_count(); id++) {
        nd_device *dev = nd_device_at(id);
        if (strcmp(nd_device_name(dev), name) == 0 && nd_device_ordinal(dev) == ordinal) return dev;
        if (strcmp(name, "cuda") == 0 && nd_device_get_kind(dev) == ND_DEVICE_CUDA &&
            nd_device_ordinal(dev) == ordinal)
            return dev;
    }
    (void)st;
    return NULL;
}

nd_device *device_from_object(needle_state *st, PyObject *obj) {
    if (obj == NULL || obj == Py_None) return nd_device_at(0);
    if (PyObject_TypeCheck(obj, st->device_type)) {
        DeviceObject *d = Device_CAST(obj);
        nd_device *dev = d->engine_id >= 0 ? nd_device_at(d->engine_id) : NULL;
        if (dev == NULL || !nd_device_available(dev)) {
            PyErr_Format(st->device_error, "device %R is not available (%s)", obj,
                         strcmp(d->name, "cuda") == 0
                             ? "needle was built without CUDA or no GPU is present"
                             : "not enabled");
            return NULL;
        }
        return dev;
    }
    if (PyUnicode_Check(obj)) {
        const char *text = PyUnicode_AsUTF8(obj);
        if (text == NULL) return NULL;
        char name[32];
        int ordinal = 0;
        const char *colon = strchr(text, ':');
        size_t len = colon ? (size_t)(colon - text) : strlen(text);
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, text, len);
        name[len] = '\0';
        if (colon != NULL) {
            char *end;
            long v = strtol(colon + 1, &end, 10);
            if (*end != '\0' || end == colon + 1 || v < 0 || v > 1000) {
                PyErr_Format(PyExc_ValueError, "invalid device string %R", obj);
                return NULL;
            }
            ordinal = (int)v;
        }
        if (strcmp(name, "cpu") != 0 && strcmp(name, "cpu_numpy") != 0 && strcmp(name, "cuda") != 0) {
            PyErr_Format(PyExc_ValueError, "unknown device %R (expected cpu, cpu_numpy or cuda[:N])",
                         obj);
            return NULL;
        }
        nd_device *dev = device_by_name(st, name, ordinal);
        if (dev == NULL || !nd_device_available(dev)) {
            PyErr_Format(st->device_error, "device %R is not available", obj);
            return NULL;
        }
        return dev;
    }
    PyErr_Format(PyExc_TypeError, "expected a needle device or a device name, got %.100s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
}

/* Device: equal by name and ordinal; unavailable ones still compare and print. */
static PyObject *device_repr(PyObject *op) {
    DeviceObject *d = Device_CAST(op);
    if (d->ordinal == 0) return PyUnicode_FromFormat("%s()", d->name);
    return PyUnicode_FromFormat("%s(%d)", d->name, d->ordinal);
}

static Py_hash_t device_hash(PyObject *op) {
    DeviceObject *d = Device_CAST(op);
    Py_hash_t h = 5381;
    for (const char *c = d->name; *c; c++) h = h * 33 + (unsigned char)*c;
    h = h * 31 + d->ordinal;
    return h == -1 ? -2 : h;
}

static PyObject *device_richcompare(PyObject *a, PyObject *b, int op) {
    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, Py_TYPE(a))) Py_RETURN_NOTIMPLEMENTED;
    DeviceObject *x = Device_CAST(a), *y = Device_CAST(b);
    int equal = strcmp(x->name, y->name) == 0 && x->ordinal == y->ordinal;
    return PyBool_FromLong(op == Py_EQ ? equal : !equal);
}

static void device_dealloc(PyObject *op) {
    PyTypeObject *tp = Py_TYPE(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static PyObject *device_enabled(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    DeviceObject *d = Device_CAST(op);
    nd_device *dev = d->engine_id >= 0 ? nd_device_at(d->engine_id) : NULL;
    return PyBool_FromLong(dev != NULL && nd_device_available(dev));
}

static PyObject *device_get_name(PyObject *op, void *Py_UNUSED(closure)) {
    return PyUnicode_FromString(Device_CAST(op)->name);
}

static PyObject *device_get_index(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromLong(Device_CAST(op)->ordinal);
}

static PyObject *device_get_id(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromLong(Device_CAST(op)->engine_id);
}

static int check_dtype(PyObject *dtype) {
    if (dtype == NULL || dtype == Py_None) return 0;
    PyObject *text = PyObject_Str(dtype);
    if (text == NULL) return -1;
    int ok = PyUnicode_CompareWithASCIIString(text, "float32") == 0 ||
             PyUnicode_CompareWithASCIIString(text, "<class 'numpy.float32'>") == 0;
    Py_DECREF(text);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "needle arrays hold float32 only, got dtype %R", dtype);
        return -1;
    }
    return 0;
}

/* Shapes from varargs: rand(2, 3) or rand((2, 3)). */
static PyObject *shape_from_args(PyObject *args) {
    if (PyTuple_GET_SIZE(args) == 1 && (PyTuple_Check(PyTuple_GET_ITEM(args, 0)) ||
                                        PyList_Check(PyTuple_GET_ITEM(args, 0))))
        return PySequence_Tuple(PyTuple_GET_ITEM(args, 0));
    return Py_NewRef(args);
}

static PyObject *device_rand(PyObject *op, PyObject *args, PyObject *kwargs) {
    /* np.random.rand(*shape): one draw of prod(shape) uniforms, as in the course. */
    needle_state *st = state_of_type(Py_TYPE(op));
    if (st == NULL) return NULL;
    PyObject *dtype = kwargs ? PyDict_GetItemString(kwargs, "dtype") : NULL;
    if (kwargs && PyDict_GET_SIZE(kwargs) > (dtype ? 1 : 0)) {
        PyErr_SetString(PyExc_TypeError, "rand() takes only the keyword argument dtype");
        return NULL;
    }
    if (check_dtype(dtype) < 0) return NULL;
    nd_device *dev = device_from_object(st, op);
    if (dev == NULL) return NULL;
    PyObject *shape = shape_from_args(args);
    if (shape == NULL) return NULL;
    PyObject *callable = PyObject_GetAttrString(st->numpy_random, "rand");
    PyObject *values = callable ? PyObject_Call(callable, shape, NULL) : NULL;
    Py_XDECREF(callable);
    Py_DECREF(shape);
    if (values == NULL) return NULL;
    PyObject *result = ndarray_from_object(st, values, dev);
    Py_DECREF(values);
    return result;
}

static PyObject *device_randn(PyObject *op, PyObject *args, PyObject *kwargs) {
    needle_state *st = state_of_type(Py_TYPE(op));
    if (st == NULL) return NULL;
    PyObject *dtype = kwargs ? PyDict_GetItemString(kwargs, "dtype") : NULL;
    if (kwargs && PyDict_GET_SIZE(kwargs) > (dtype ? 1 : 0)) {
        PyErr_SetString(PyExc_TypeError, "randn() takes only the keyword argument dtype");
        return NULL;
    }
    if (check_dtype(dtype) < 0) return NULL;
    nd_device *dev = device_from_object(st, op);
    if (dev == NULL) return NULL;
    PyObject *shape = shape_from_args(args);
    if (shape == NULL) return NULL;
    PyObject *callable = PyObject_GetAttrString(st->numpy_random, "randn");
    PyObject *values = callable ? PyObject_Call(callable, shape, NULL) : NULL;
    Py_XDECREF(callable);
    Py_DECREF(shape);
    if (values == NULL) return NULL;
    PyObject *result = ndarray_from_object(st, values, dev);
    Py_DECREF(values);
    return result;
}

static PyObject *device_one_hot(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"n", "i", "dtype", NULL};
    Py_ssize_t n;
    PyObject *index, *dtype = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nO|O:one_hot", kwlist, &n, &index, &dtype))
        return NULL;
    if (check_dtype(dtype) < 0) return NULL;
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
    PyObject *result = ndarray_from_object(st, rows, dev);
    Py_DECREF(rows);
    return result;
}

static PyObject *device_empty(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"shape", "dtype", NULL};
    PyObject *shape_obj, *dtype = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:empty", kwlist, &shape_obj, &dtype)) return NULL;
    if (check_dtype(dtype) < 0) return NULL;
    needle_state *st = state_of_type(Py_TYPE(op));
    if (st == NULL) return NULL;
    nd_device *dev = device_from_object(st, op);
    if (dev == NULL) return NULL;
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (parse_shape(shape_obj, &ndim, shape) < 0) return NULL;
    nd_array arr;
    nd_status status = nd_array_empty(dev, ndim, shape, &arr);
    if (status != ND_OK) return raise_status(st, status);
    return ndarray_wrap(st, &arr);
}

static PyObject *device_full(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"shape", "fill_value", "dtype", NULL};
    PyObject *shape_obj, *dtype = NULL;
    double value;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Od|O:full", kwlist, &shape_obj, &value, &dtype))
        return NULL;
    if (check_dtype(dtype) < 0) return NULL;
    needle_state *st = state_of_type(Py_TYPE(op));
    if (st == NULL) return NULL;
    nd_device *dev = device_from_object(st, op);
    if (dev == NULL) return NULL;
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (parse_shape(shape_obj, &ndim, shape) < 0) return NULL;
    nd_array arr;
    nd_status status = nd_array_empty(dev, ndim, shape, &arr);
    if (status == ND_OK && (status = nd_array_fill(&arr, (float)value)) != ND_OK) nd_array_release(&arr);
    if (status != ND_OK) return raise_status(st, status);
    return ndarray_wrap(st, &arr);
}

static PyMethodDef device_methods[] = {
    {"enabled", device_enabled, METH_NOARGS,
     "enabled($self, /)\n--\n\nTrue when arrays can be created on this device."},
    {"empty", (PyCFunction)(void (*)(void))device_empty, METH_VARARGS | METH_KEYWORDS,
     "empty($self, /, shape, dtype='float32')\n--\n\nAn uninitialised array of the given shape."},
    {"full", (PyCFunction)(void (*)(void))device_full, METH_VARARGS | METH_KEYWORDS,
     "full($self, /, shape, fill_value, dtype='float32')\n--\n\nAn array filled with fill_value."},
    {"rand", (PyCFunction)(void (*)(void))device_rand, METH_VARARGS | METH_KEYWORDS,
     "rand($self, /, *shape, dtype='float32')\n--\n\nUniform [0, 1) values drawn with "
     "numpy.random.rand(*shape) (NumPy's global RNG), then copied here."},
    {"randn", (PyCFunction)(void (*)(void))device_randn, METH_VARARGS | METH_KEYWORDS,
     "randn($self, /, *shape, dtype='float32')\n--\n\nStandard normal values drawn with "
     "numpy.random.randn(*shape), then copied here."},
    {"one_hot", (PyCFunction)(void (*)(void))device_one_hot, METH_VARARGS | METH_KEYWORDS,
     "one_hot($self, /, n, i, dtype='float32')\n--\n\nRows i of the n x n identity matrix."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef device_getset[] = {
    {"name", device_get_name, NULL, "The device kind: 'cpu', 'cpu_numpy' or 'cuda'.", NULL},
    {"index", device_get_index, NULL, "The device's ordinal among devices of its kind.", NULL},
    {"_id", device_get_id, NULL, "The engine's device id (-1 when unavailable).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot device_type_slots[] = {
    {Py_tp_doc, "A device arrays live on. Compare with ==; print as 'cpu()' or 'cuda()'."},
    {Py_tp_repr, device_repr},
    {Py_tp_hash, device_hash},
    {Py_tp_richcompare, device_richcompare},
    {Py_tp_dealloc, device_dealloc},
    {Py_tp_methods, device_methods},
    {Py_tp_getset, device_getset},
    {0, NULL},
};

static PyType_Spec device_type_spec = {
    .name = "needle_c.Device",
    .basicsize = sizeof(DeviceObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = device_type_slots,
};

/* Module functions returning devices. */
static PyObject *module_cpu(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    return Py_NewRef(state_of_module(module)->devices[0]);
}

static PyObject *module_cpu_numpy(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    return Py_NewRef(state_of_module(module)->devices[1]);
}

static PyObject *module_cuda(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    needle_state *st = state_of_module(module);
    Py_ssize_t index = 0;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "cuda() takes at most one argument (the device index)");
        return NULL;
    }
    if (nargs == 1 && (index = PyNumber_AsSsize_t(args[0], PyExc_OverflowError)) == -1 &&
        PyErr_Occurred())
        return NULL;
    if (index < 0 || index >= NEEDLE_MAX_CUDA_DEVICES) {
        PyErr_Format(PyExc_ValueError, "invalid CUDA device index %zd", index);
        return NULL;
    }
    nd_device *dev = device_by_name(st, "cuda", (int)index);
    if (dev != NULL) return Py_NewRef(device_object(st, dev));
    if (index == 0) return Py_NewRef(st->cuda_placeholder);
    return make_device(st, -1, "cuda", (int)index);
}

static PyObject *module_device_count(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyLong_FromLong(nd_device_count());
}

static PyObject *module_blas(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyUnicode_FromString(blas_description());
}

static PyMethodDef module_functions[] = {
    {"cpu", module_cpu, METH_NOARGS, "cpu()\n--\n\nThe host device."},
    {"cpu_numpy", module_cpu_numpy, METH_NOARGS,
     "cpu_numpy()\n--\n\nA second host device with its own accounting (the course's numpy device)."},
    {"cuda", (PyCFunction)(void (*)(void))module_cuda, METH_FASTCALL,
     "cuda(index=0, /)\n--\n\nThe CUDA device; enabled() is False without CUDA."},
    {"_engine_device_count", module_device_count, METH_NOARGS, NULL},
    {"_blas", module_blas, METH_NOARGS,
     "_blas()\n--\n\nWhich GEMM the CPU backend uses."},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------- module */

extern PyMethodDef cuda_info_module_functions[]; /* cuda_info.c */

static int add_function_table(PyObject *module, PyMethodDef *table) {
    return PyModule_AddFunctions(module, table);
}

static int needle_c_exec(PyObject *module) {
    needle_state *st = state_of_module(module);
    if (ndarray_module_init() < 0) return -1;
    st->device_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &device_type_spec, NULL);
    if (st->device_type == NULL || PyModule_AddType(module, st->device_type) < 0) return -1;
    st->ndarray_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &ndarray_type_spec, NULL);
    if (st->ndarray_type == NULL || PyModule_AddType(module, st->ndarray_type) < 0) return -1;
    /* NumPy then hands mixed operations (np.float32(2) + a) back to NDArray's
     * reflected operators instead of converting the NDArray itself. */
    if (PyDict_SetItemString(st->ndarray_type->tp_dict, "__array_ufunc__", Py_None) < 0) return -1;
    PyType_Modified(st->ndarray_type);

    st->device_error = PyErr_NewExceptionWithDoc(
        "needle.DeviceError",
        "Raised when arrays on different devices meet, or a device fails or is unavailable.",
        PyExc_RuntimeError, NULL);
    if (st->device_error == NULL || PyModule_AddObjectRef(module, "DeviceError", st->device_error) < 0)
        return -1;
    st->out_of_memory = PyErr_NewExceptionWithDoc(
        "needle.OutOfMemoryError",
        "A device allocation failed after the cache was released and garbage collected.\n\n"
        "Attributes: device, requested, allocated, reserved (bytes), limit (bytes or None).",
        PyExc_MemoryError, NULL);
    if (st->out_of_memory == NULL ||
        PyModule_AddObjectRef(module, "OutOfMemoryError", st->out_of_memory) < 0)
        return -1;

    int count = nd_device_count();
    if (count > (int)(sizeof st->devices / sizeof st->devices[0])) count = 64;
    for (int id = 0; id < count; id++) {
        nd_device *dev = nd_device_at(id);
        st->devices[id] = make_device(st, id, nd_device_get_kind(dev) == ND_DEVICE_CUDA ? "cuda"
                                                                              : nd_device_name(dev),
                                      nd_device_ordinal(dev) * (nd_device_get_kind(dev) == ND_DEVICE_CUDA));
        if (st->devices[id] == NULL) return -1;
    }
    nd_device *cuda0 = device_by_name(st, "cuda", 0);
    st->cuda_placeholder = cuda0 ? Py_NewRef(device_object(st, cuda0)) : make_device(st, -1, "cuda", 0);
    if (st->cuda_placeholder == NULL) return -1;
    st->numpy_random = PyImport_ImportModule("numpy.random");
    if (st->numpy_random == NULL) return -1;

    if (add_function_table(module, module_functions) < 0 ||
        add_function_table(module, ndarray_module_functions) < 0 ||
        add_function_table(module, memory_module_functions) < 0 ||
        add_function_table(module, pressure_module_functions) < 0 ||
        add_function_table(module, cuda_info_module_functions) < 0 ||
        add_function_table(module, interop_module_functions) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "MAX_DIMS", ND_MAX_DIMS) < 0) return -1;
    if (autograd_module_init(module, st) < 0) return -1;
    install_blas();
    pressure_install();
    return 0;
}

static int needle_c_traverse(PyObject *module, visitproc visit, void *arg) {
    needle_state *st = state_of_module(module);
    Py_VISIT(st->device_type);
    Py_VISIT(st->ndarray_type);
    Py_VISIT(st->device_error);
    Py_VISIT(st->out_of_memory);
    for (size_t i = 0; i < sizeof st->devices / sizeof st->devices[0]; i++) Py_VISIT(st->devices[i]);
    Py_VISIT(st->cuda_placeholder);
    Py_VISIT(st->numpy_random);
    return autograd_traverse(st, visit, arg);
}

static int needle_c_clear(PyObject *module) {
    needle_state *st = state_of_module(module);
    Py_CLEAR(st->device_type);
    Py_CLEAR(st->ndarray_type);
    Py_CLEAR(st->device_error);
    Py_CLEAR(st->out_of_memory);
    for (size_t i = 0; i < sizeof st->devices / sizeof st->devices[0]; i++) Py_CLEAR(st->devices[i]);
    Py_CLEAR(st->cuda_placeholder);
    Py_CLEAR(st->numpy_random);
    autograd_clear(st);
    return 0;
}

static void needle_c_free(void *module) {
    needle_c_clear((PyObject *)module);
    needle_state *st = state_of_module((PyObject *)module);
    PyMem_Free(st->autograd);
    st->autograd = NULL;
}

static PyModuleDef_Slot needle_c_slots[] = {
    {Py_mod_exec, needle_c_exec},
    {0, NULL},
};

PyModuleDef needle_c_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "needle_c",
    .m_doc = "needle's C core: devices, arrays and device-memory accounting.",
    .m_size = sizeof(needle_state),
    .m_slots = needle_c_slots,
    .m_traverse = needle_c_traverse,
    .m_clear = needle_c_clear,
    .m_free = needle_c_free,
};

PyMODINIT_FUNC PyInit_needle_c(void) { return PyModuleDef_Init(&needle_c_module); }
