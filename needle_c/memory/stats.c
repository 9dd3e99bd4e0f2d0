/* stats.c: the engine's per-device memory accounting, exposed to
 * needle.memory: statistics, peaks, limits and the cache.
 *
 * Devices are named by engine id here; needle.memory resolves user-facing
 * device arguments (through needle_c._device) and units. The collection
 * policy and its counters live in pressure.c, which adds its figures to
 * memory_stats (pressure_add_stats).
 */
#include "history.h"

static nd_device *device_arg(PyObject *arg) {
    int id = PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    nd_device *dev = nd_device_at(id);
    if (dev == NULL) PyErr_Format(PyExc_ValueError, "no device with engine id %d", id);
    return dev;
}

static int set_item(PyObject *dict, const char *key, int64_t value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int rc = PyDict_SetItemString(dict, key, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *memory_stats(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_arg(arg);
    if (dev == NULL) return NULL;
    nd_memory_stats s;
    nd_memory_get_stats(dev, &s);
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    if (set_item(d, "allocated_bytes.all.current", s.allocated_current) < 0 ||
        set_item(d, "allocated_bytes.all.peak", s.allocated_peak) < 0 ||
        set_item(d, "allocated_bytes.all.allocated", s.allocated_total) < 0 ||
        set_item(d, "allocated_bytes.all.freed", s.allocated_freed) < 0 ||
        set_item(d, "reserved_bytes.all.current", s.reserved_current) < 0 ||
        set_item(d, "reserved_bytes.all.peak", s.reserved_peak) < 0 ||
        set_item(d, "reserved_bytes.all.allocated", s.reserved_total) < 0 ||
        set_item(d, "reserved_bytes.all.freed", s.reserved_freed) < 0 ||
        set_item(d, "allocation.all.current", s.blocks_current) < 0 ||
        set_item(d, "allocation.all.peak", s.blocks_peak) < 0 ||
        set_item(d, "allocation.all.allocated", s.blocks_total) < 0 ||
        set_item(d, "allocation.all.freed", s.blocks_freed) < 0 ||
        set_item(d, "num_alloc_retries", s.num_alloc_retries) < 0 ||
        set_item(d, "num_ooms", s.num_ooms) < 0 || set_item(d, "memory_limit_bytes", s.limit) < 0 ||
        set_item(d, "gc_trigger_bytes", s.trigger) < 0 ||
        set_item(d, "device_capacity_bytes", nd_device_capacity(dev)) < 0 ||
        pressure_add_stats(dev, d) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* The hot getters skip building the dict. */
static PyObject *memory_allocated(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_arg(arg);
    if (dev == NULL) return NULL;
    nd_memory_stats s;
    nd_memory_get_stats(dev, &s);
    return PyLong_FromLongLong(s.allocated_current);
}

static PyObject *memory_reset_peaks(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_arg(arg);
    if (dev == NULL) return NULL;
    nd_memory_reset_peaks(dev);
    Py_RETURN_NONE;
}

static PyObject *memory_empty_cache(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_arg(arg);
    if (dev == NULL) return NULL;
    return PyLong_FromLongLong(nd_memory_empty_cache(dev));
}

static PyObject *memory_set_limit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_set_memory_limit(device_id, bytes or -1)");
        return NULL;
    }
    nd_device *dev = device_arg(args[0]);
    if (dev == NULL) return NULL;
    long long limit = PyLong_AsLongLong(args[1]);
    if (limit == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "a memory limit must be below 2**63 bytes");
        }
        return NULL;
    }
    nd_memory_set_limit(dev, limit);
    pressure_refresh(dev);
    Py_RETURN_NONE;
}

PyMethodDef memory_module_functions[] = {
    {"_memory_stats", memory_stats, METH_O,
     "_memory_stats(device_id, /)\n--\n\nThe device's allocator statistics as a flat dict."},
    {"_memory_allocated", memory_allocated, METH_O,
     "_memory_allocated(device_id, /)\n--\n\nBytes held by live storages on the device."},
    {"_reset_peak_memory_stats", memory_reset_peaks, METH_O,
     "_reset_peak_memory_stats(device_id, /)\n--\n\nSets every peak to its current value."},
    {"_empty_cache", memory_empty_cache, METH_O,
     "_empty_cache(device_id, /)\n--\n\nReleases cached blocks; returns the bytes released."},
    {"_set_memory_limit", (PyCFunction)(void (*)(void))memory_set_limit, METH_FASTCALL,
     "_set_memory_limit(device_id, limit, /)\n--\n\nLimit in bytes on reserved memory; -1 removes "
     "it."},
    {"_memory_record_history", (PyCFunction)(void (*)(void))history_py_record, METH_FASTCALL,
     "_memory_record_history(device_id, enabled, context, all_frames, max_entries, skip_mask, "
     "clear, /)\n--\n\nStarts, changes or stops the device's memory history (history.c)."},
    {"_memory_snapshot", history_py_snapshot, METH_O,
     "_memory_snapshot(device_id, /)\n--\n\n(blocks, trace): the device's segments' blocks and "
     "the recorded events, as tuples (history.c)."},
    {"_memory_history_prefix", history_py_set_prefix, METH_O,
     "_memory_history_prefix(path, /)\n--\n\nFrames from files under path are needle's own."},
    {"_memory_history_actions", history_py_actions, METH_NOARGS,
     "_memory_history_actions()\n--\n\nThe trace's action names, bit i of skip_mask for "
     "action i."},
    {NULL, NULL, 0, NULL},
};
