/* device.c: the Device type (needle_c.Device) and the way other layers add
 * methods to it (the array factories: empty, full, one_hot in
 * array/factories.c; rand, randn, randb in random.c, so that devices know
 * nothing of arrays), the module functions that return devices (cpu, cpu_numpy, cuda) or count
 * them, and the one parser that turns a user's device argument (None, a
 * Device, "cpu", "cuda:1") into an engine device (Python reaches it through
 * _device).
 *
 * Device objects are made once at module init, one per engine device, and
 * kept in the module state; a CUDA device the engine lacks gets a
 * placeholder whose enabled() is False.
 */
#include "needle_c.h"

#include <limits.h>

static PyObject *make_device(needle_state *st, int engine_id, const char *name, int ordinal) {
    DeviceObject *d = PyObject_New(DeviceObject, st->device_type);
    if (d == NULL) return NULL;
    d->engine_id = engine_id;
    d->ordinal = ordinal;
    snprintf(d->name, sizeof d->name, "%s", name);
    return (PyObject *)d;
}

/* The engine device whose Device object is name(ordinal), or NULL: "cuda"
 * with the GPU's ordinal, a host device with 0 (cpu_numpy is the engine's
 * host ordinal 1, but the Device cpu_numpy()). */
static nd_device *device_by_name(needle_state *st, const char *name, int ordinal) {
    for (int id = 0; id < nd_device_count() && id < ND_MAX_DEVICES; id++) {
        DeviceObject *d = st->devices[id] ? Device_CAST(st->devices[id]) : NULL;
        if (d != NULL && strcmp(d->name, name) == 0 && d->ordinal == ordinal)
            return nd_device_at(id);
    }
    return NULL;
}

/* Splits a device string "name" or "name:N" (0 <= N <= 1000) and checks the
 * name; 0, or -1 with ValueError. */
static int parse_device_name(PyObject *obj, char *name, size_t size, int *ordinal) {
    const char *text = PyUnicode_AsUTF8(obj);
    if (text == NULL) return -1;
    *ordinal = 0;
    const char *colon = strchr(text, ':');
    size_t len = colon ? (size_t)(colon - text) : strlen(text);
    if (len >= size) len = size - 1;
    memcpy(name, text, len);
    name[len] = '\0';
    if (colon != NULL) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (*end != '\0' || end == colon + 1 || v < 0 || v > 1000) {
            PyErr_Format(PyExc_ValueError, "invalid device string %R", obj);
            return -1;
        }
        *ordinal = (int)v;
    }
    if (strcmp(name, "cpu") != 0 && strcmp(name, "cpu_numpy") != 0 && strcmp(name, "cuda") != 0) {
        PyErr_Format(PyExc_ValueError, "unknown device %R (expected cpu, cpu_numpy or cuda[:N])",
                     obj);
        return -1;
    }
    return 0;
}

static PyObject *not_a_device(PyObject *obj) {
    PyErr_Format(PyExc_TypeError, "expected a needle device or a device name, got %.100s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
}

nd_device *device_from_object(needle_state *st, PyObject *obj) {
    if (obj == NULL || obj == Py_None) return nd_device_at(0);
    if (PyObject_TypeCheck(obj, st->device_type)) {
        DeviceObject *d = Device_CAST(obj);
        nd_device *dev = d->engine_id >= 0 ? nd_device_at(d->engine_id) : NULL;
        if (dev == NULL || !nd_device_available(dev)) {
            const char *reason = strcmp(d->name, "cuda") != 0 ? "not enabled"
                                 : cuda_unavailable_reason()[0] != '\0'
                                     ? cuda_unavailable_reason()
                                     : "there is no CUDA device with this index";
            PyErr_Format(st->device_error, "device %R is not available (%s)", obj, reason);
            return NULL;
        }
        return dev;
    }
    if (PyUnicode_Check(obj)) {
        char name[32];
        int ordinal;
        if (parse_device_name(obj, name, sizeof name, &ordinal) < 0) return NULL;
        nd_device *dev = device_by_name(st, name, ordinal);
        if (dev == NULL || !nd_device_available(dev)) {
            PyErr_Format(st->device_error, "device %R is not available", obj);
            return NULL;
        }
        return dev;
    }
    not_a_device(obj);
    return NULL;
}

nd_device *device_of_engine_id(PyObject *arg) {
    long id = PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    nd_device *dev = id < 0 || id > INT_MAX ? NULL : nd_device_at((int)id);
    if (dev == NULL) PyErr_Format(PyExc_ValueError, "no device with engine id %ld", id);
    return dev;
}

/* ------------------------------------------------------- Device type */

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
    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, Py_TYPE(a)))
        Py_RETURN_NOTIMPLEMENTED;
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

static PyMethodDef device_methods[] = {
    {"enabled", device_enabled, METH_NOARGS,
     "enabled($self, /)\n--\n\nTrue when arrays can be created on this device."},
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

/* Adds methods (a table that outlives the type) to the Device type: the
 * layers above devices give it their factories this way. 0, or -1. */
int device_add_methods(needle_state *st, PyMethodDef *methods) {
    PyTypeObject *type = st->device_type;
    for (PyMethodDef *m = methods; m->ml_name != NULL; m++) {
        PyObject *descr = PyDescr_NewMethod(type, m);
        int rc = descr != NULL ? PyDict_SetItemString(type->tp_dict, m->ml_name, descr) : -1;
        Py_XDECREF(descr);
        if (rc < 0) return -1;
    }
    PyType_Modified(type);
    return 0;
}

/* --------------------------------------------------- module functions */

static PyObject *module_cpu(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    return Py_NewRef(state_of_module(module)->devices[0]);
}

static PyObject *module_cpu_numpy(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    needle_state *st = state_of_module(module);
    return Py_NewRef(st->devices[st->cpu_numpy_id]);
}

/* The Device for CUDA ordinal `index`: the engine's, or a placeholder
 * (enabled() False) when this process has no such GPU. */
static PyObject *cuda_device(needle_state *st, Py_ssize_t index) {
    if (index < 0 || index >= ND_MAX_CUDA_DEVICES) {
        PyErr_Format(PyExc_ValueError, "invalid CUDA device index %zd", index);
        return NULL;
    }
    nd_device *dev = device_by_name(st, "cuda", (int)index);
    if (dev != NULL) return Py_NewRef(device_object(st, dev));
    if (index == 0) return Py_NewRef(st->cuda_placeholder);
    return make_device(st, -1, "cuda", (int)index);
}

static PyObject *module_cuda(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t index = 0;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "cuda() takes at most one argument (the device index)");
        return NULL;
    }
    if (nargs == 1 && (index = PyNumber_AsSsize_t(args[0], PyExc_ValueError)) == -1 &&
        PyErr_Occurred())
        return NULL;
    return cuda_device(state_of_module(module), index);
}

static PyObject *module_device_count(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyLong_FromLong(nd_device_count());
}

/* needle.memory's device argument: the Device object that None, a Device or
 * a name stands for, usable or not (a name of a GPU this process lacks gives
 * a placeholder whose enabled() is False and whose _id is -1). */
static PyObject *module_device(PyObject *module, PyObject *arg) {
    needle_state *st = state_of_module(module);
    if (arg == Py_None) return Py_NewRef(st->devices[0]);
    if (PyObject_TypeCheck(arg, st->device_type)) return Py_NewRef(arg);
    if (!PyUnicode_Check(arg)) return not_a_device(arg);
    char name[32];
    int ordinal;
    if (parse_device_name(arg, name, sizeof name, &ordinal) < 0) return NULL;
    if (strcmp(name, "cuda") == 0) return cuda_device(st, ordinal);
    nd_device *dev = device_by_name(st, name, ordinal);
    PyObject *device = dev ? device_object(st, dev) : NULL;
    if (device == NULL) {
        PyErr_Format(PyExc_ValueError, "unknown device %R (expected cpu, cpu_numpy or cuda[:N])",
                     arg);
        return NULL;
    }
    return Py_NewRef(device);
}

static PyMethodDef device_module_functions[] = {
    {"cpu", module_cpu, METH_NOARGS, "cpu()\n--\n\nThe host device."},
    {"cpu_numpy", module_cpu_numpy, METH_NOARGS,
     "cpu_numpy()\n--\n\nA second host device with its own accounting (the course's numpy "
     "device)."},
    {"cuda", (PyCFunction)(void (*)(void))module_cuda, METH_FASTCALL,
     "cuda(index=0, /)\n--\n\nThe CUDA device; enabled() is False without CUDA."},
    {"_engine_device_count", module_device_count, METH_NOARGS, NULL},
    {"_device", module_device, METH_O,
     "_device(device, /)\n--\n\nThe Device that a device argument names (None: cpu(); a Device; or "
     "'cpu', 'cpu_numpy', 'cuda', 'cuda:N'), parsed as every needle_c function parses it. A CUDA "
     "device "
     "this process cannot use comes back with enabled() False and _id -1. Raises ValueError or "
     "TypeError "
     "for what is not a device."},
    {NULL, NULL, 0, NULL},
};

int device_module_init(PyObject *module, needle_state *st) {
    st->device_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &device_type_spec, NULL);
    if (st->device_type == NULL || PyModule_AddType(module, st->device_type) < 0) return -1;
    /* The course's numpy-kernel device is the binding's, not the engine's. */
    nd_device *cpu_numpy = nd_host_device_register("cpu_numpy");
    if (cpu_numpy == NULL) {
        PyErr_SetString(PyExc_SystemError, "no room to register the cpu_numpy device");
        return -1;
    }
    st->cpu_numpy_id = nd_device_id(cpu_numpy);
    int count = nd_device_count();
    if (count > ND_MAX_DEVICES) count = ND_MAX_DEVICES;
    for (int id = 0; id < count; id++) {
        nd_device *dev = nd_device_at(id);
        int is_cuda = nd_device_get_kind(dev) == ND_DEVICE_CUDA;
        st->devices[id] = make_device(st, id, is_cuda ? "cuda" : nd_device_name(dev),
                                      is_cuda ? nd_device_ordinal(dev) : 0);
        if (st->devices[id] == NULL) return -1;
    }
    nd_device *cuda0 = device_by_name(st, "cuda", 0);
    st->cuda_placeholder =
        cuda0 ? Py_NewRef(device_object(st, cuda0)) : make_device(st, -1, "cuda", 0);
    if (st->cuda_placeholder == NULL) return -1;
    st->numpy_random = PyImport_ImportModule("numpy.random");
    if (st->numpy_random == NULL) return -1;
    if (PyModule_AddIntConstant(module, "MAX_DEVICES", ND_MAX_DEVICES) < 0 ||
        PyModule_AddIntConstant(module, "MAX_CUDA_DEVICES", ND_MAX_CUDA_DEVICES) < 0)
        return -1;
    return PyModule_AddFunctions(module, device_module_functions);
}
