/* errors.c: engine status codes turned into Python exceptions (docs/design.md,
 * "Rules for C code that holds Python objects", rule 8), and the one formatter of
 * needle.OutOfMemoryError, whose message and attributes name the device and
 * every byte figure the allocator saw.
 *
 * Reads the engine's last error and last OOM; never calls the engine's
 * allocator, so raising never starts a collection.
 */
#include "needle_c.h"

/* "N bytes" below 1 KiB, else "N bytes (x.xx KiB|MiB|GiB|TiB)". */
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
    PyObject *device = dev ? device_object(st, dev) : NULL;
    if (device == NULL) {
        PyErr_SetString(st->out_of_memory, nd_last_error());
        return NULL;
    }
    Py_INCREF(device); /* held across the calls below, which may allocate */
    char req[64], alloc[64], res[64], lim[64];
    format_bytes(req, sizeof req, info.requested);
    format_bytes(alloc, sizeof alloc, info.allocated);
    format_bytes(res, sizeof res, info.reserved);
    if (info.limit >= 0) format_bytes(lim, sizeof lim, info.limit);
    else snprintf(lim, sizeof lim, "none");
    PyObject *message = PyUnicode_FromFormat(
        "out of memory on %S: tried to allocate %s; %s allocated, %s reserved, limit %s", device,
        req, alloc, res, lim);
    PyObject *err = message ? PyObject_CallOneArg(st->out_of_memory, message) : NULL;
    Py_XDECREF(message);
    if (err == NULL) {
        Py_DECREF(device);
        return NULL;
    }
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
    Py_DECREF(device);
    return NULL;
}

PyObject *raise_status(needle_state *st, nd_status status) {
    switch (status) {
    case ND_OK: PyErr_SetString(PyExc_SystemError, "raise_status called without an error"); break;
    case ND_ERR_INDEX: PyErr_SetString(PyExc_IndexError, nd_last_error()); break;
    case ND_ERR_DEVICE:
    case ND_ERR_BACKEND: PyErr_SetString(st->device_error, nd_last_error()); break;
    case ND_ERR_OOM: return raise_out_of_memory(st);
    case ND_ERR_INTERNAL: PyErr_SetString(PyExc_RuntimeError, nd_last_error()); break;
    case ND_ERR_DTYPE: PyErr_SetString(PyExc_TypeError, nd_last_error()); break;
    default: PyErr_SetString(PyExc_ValueError, nd_last_error()); break;
    }
    return NULL;
}
