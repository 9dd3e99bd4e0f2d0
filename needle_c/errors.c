/* errors.c: engine status codes turned into Python exceptions (docs/design.md,
 * "Rules for C code that holds Python objects", rule 8), and the one formatter of
 * needle.OutOfMemoryError, whose message and attributes name the device and
 * every byte figure the allocator saw.
 *
 * Reads the engine's last error and last OOM; never calls the engine's
 * allocator, so raising never starts a collection.
 *
 * The explainer: needle.memory registers a function (_set_oom_explainer) that
 * is handed each new OutOfMemoryError before it is raised, to name who holds
 * the memory and write a snapshot; needle_c never imports needle.memory
 * (python/needle -> needle_c -> csrc). The failed allocation has returned by
 * then, so the explainer may allocate Python objects, but must not allocate
 * device memory. Whatever it does, the OutOfMemoryError is raised: an
 * exception of its own goes to sys.unraisablehook and the message it may have
 * changed is put back; an out-of-memory error raised while it runs (in the
 * same thread) is raised plain, unexplained.
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

/* Explaining an error runs Python code, which may fail an allocation of its
 * own: that one is raised unexplained. Per thread, as the allocator's
 * collecting flag is. */
static _Thread_local int explaining = 0;

/* Hands err to the registered explainer, if any and not already explaining.
 * Never fails: the explainer's exception is reported as unraisable and err's
 * args (its message) are restored as they were. */
static void explain(needle_state *st, PyObject *err) {
    if (st->oom_explainer == NULL || explaining) return;
    PyObject *fn = Py_NewRef(st->oom_explainer); /* the call may replace it */
    PyObject *args = PyObject_GetAttrString(err, "args");
    if (args == NULL) {
        Py_DECREF(fn);
        PyErr_WriteUnraisable(err);
        return;
    }
    explaining = 1;
    PyObject *result = PyObject_CallOneArg(fn, err);
    explaining = 0;
    if (result == NULL) {
        PyErr_WriteUnraisable(fn);
        if (PyObject_SetAttrString(err, "args", args) < 0) PyErr_WriteUnraisable(err);
    }
    Py_XDECREF(result);
    Py_DECREF(args);
    Py_DECREF(fn);
}

/* Sets name = value on err and releases value (a new reference, or NULL
 * with an exception set); -1 on failure. */
static int set_owned(PyObject *err, const char *name, PyObject *value) {
    if (value == NULL) return -1;
    int rc = PyObject_SetAttrString(err, name, value);
    Py_DECREF(value);
    return rc;
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
    nd_memory_stats stats;
    nd_memory_get_stats(dev, &stats); /* now, before Python code can free anything */
    Py_INCREF(device);                /* held across the calls below, which may allocate */
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
    int64_t fragmentation = info.reserved - info.allocated;
    int ok =
        PyObject_SetAttrString(err, "device", device) == 0 &&
        set_owned(err, "requested", PyLong_FromLongLong(info.requested)) == 0 &&
        set_owned(err, "allocated", PyLong_FromLongLong(info.allocated)) == 0 &&
        set_owned(err, "reserved", PyLong_FromLongLong(info.reserved)) == 0 &&
        set_owned(err, "limit",
                  info.limit >= 0 ? PyLong_FromLongLong(info.limit) : Py_NewRef(Py_None)) == 0 &&
        set_owned(err, "collected_bytes", PyLong_FromLongLong(info.collected)) == 0 &&
        set_owned(err, "largest_free_block", PyLong_FromLongLong(info.largest_free_block)) == 0 &&
        set_owned(err, "fragmentation_bytes",
                  PyLong_FromLongLong(fragmentation > 0 ? fragmentation : 0)) == 0 &&
        set_owned(err, "inactive_split_bytes",
                  PyLong_FromLongLong(stats.inactive_split_bytes.current)) == 0 &&
        PyObject_SetAttrString(err, "holders", Py_None) == 0 &&
        PyObject_SetAttrString(err, "snapshot_path", Py_None) == 0;
    if (ok) {
        explain(st, err);
        /* The type from err itself: the module state's field may have been
         * cleared while Python code ran. */
        PyErr_SetObject((PyObject *)Py_TYPE(err), err);
    }
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

/* _set_oom_explainer(fn): fn(err) is called with each new OutOfMemoryError
 * before it is raised (None: no explainer); returns the previous one. */
static PyObject *set_oom_explainer(PyObject *module, PyObject *fn) {
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError,
                     "the out-of-memory explainer must be callable or None, got %s",
                     Py_TYPE(fn)->tp_name);
        return NULL;
    }
    needle_state *st = state_of_module(module);
    PyObject *previous = st->oom_explainer ? st->oom_explainer : Py_NewRef(Py_None);
    st->oom_explainer = fn == Py_None ? NULL : Py_NewRef(fn);
    return previous; /* the state's reference, handed to the caller */
}

PyMethodDef errors_module_functions[] = {
    {"_set_oom_explainer", set_oom_explainer, METH_O,
     "_set_oom_explainer(fn, /)\n--\n\nfn(err) is called with each new needle.OutOfMemoryError "
     "before it is raised, to add to its message and attributes (None: none); its exceptions "
     "are reported as unraisable, never raised. Returns the previous explainer (or None)."},
    {NULL, NULL, 0, NULL},
};
