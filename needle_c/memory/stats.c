/* stats.c: the engine's per-device memory accounting, exposed to
 * needle.memory: statistics, peaks, limits and the cache, and beside them the
 * collector's figures, which the pacer counts (csrc/gc_pacer.h) for every
 * collection the runner (pressure.c) runs.
 *
 * Devices are named by engine id here; needle.memory resolves user-facing
 * device arguments (through needle_c._device) and units.
 */
#include "history.h"
#include "pressure.h"

static int set_item(PyObject *dict, const char *key, int64_t value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int rc = PyDict_SetItemString(dict, key, v);
    Py_DECREF(v);
    return rc;
}

/* The four keys of one of PyTorch's statistics: prefix.current, .peak, .allocated, .freed. */
static int set_stat(PyObject *dict, const char *prefix, const nd_memory_stat *stat) {
    const char *fields[] = {"current", "peak", "allocated", "freed"};
    const int64_t values[] = {stat->current, stat->peak, stat->allocated, stat->freed};
    for (int i = 0; i < 4; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s.%s", prefix, fields[i]);
        if (set_item(dict, key, values[i]) < 0) return -1;
    }
    return 0;
}

/* The fragmentation keys of torch.cuda.memory_stats (one pool: "all"). */
static int set_fragmentation(PyObject *dict, const nd_memory_stats *s) {
    return set_stat(dict, "segment.all", &s->segment) < 0 ||
                   set_stat(dict, "active.all", &s->active) < 0 ||
                   set_stat(dict, "active_bytes.all", &s->active_bytes) < 0 ||
                   set_stat(dict, "inactive_split.all", &s->inactive_split) < 0 ||
                   set_stat(dict, "inactive_split_bytes.all", &s->inactive_split_bytes) < 0 ||
                   set_stat(dict, "oversize_allocations", &s->oversize_allocations) < 0 ||
                   set_stat(dict, "oversize_segments", &s->oversize_segments) < 0 ||
                   set_item(dict, "num_gc_releases", s->num_gc_releases) < 0
               ? -1
               : 0;
}

/* The collector's figures of memory_stats(), one key per counter of the
 * device's pacer state (csrc/gc_pacer.h), each with one meaning:
 *   num_pressure_collections  soft collections run: allocation path, safe points and aligned
 *   num_safe_point_collections  of which at safe points
 *   num_oom_collections       collections on the out-of-memory path
 *   num_collect_calls         every collection run for this device: the two above together
 *   num_pressure_skips        soft collections that pacing, the cooldown or gc.disable() held back
 *   num_pressure_deferrals    soft collections left to the next safe point
 *   gc_seconds                time spent in the collections run
 *   gc_freed_bytes            allocated bytes on this device that dropped during them
 *   gc_survivor_bytes         allocated bytes after the last one (the trigger's base)
 * Each collection runs the ladder; its steps:
 *   num_scoped_collections    scoped collections run (scoped.c)
 *   scoped_gc_seconds         their time (part of gc_seconds)
 *   scoped_objects_examined   needle objects they examined
 *   scoped_freed_bytes        allocated bytes that dropped during them
 *   num_full_collections      full collections run (gc.collect)
 *   num_full_fallbacks        of which after a scoped one that freed too little
 *   num_fallbacks_skipped     fallbacks the back-off skipped
 * Alignment (alignment.c):
 *   num_aligned_wants         soft collections turned into wants
 *   aligned_rounds_waited     all-reduce rounds those wants waited for (one each when every
 *                             step carries them)
 *   num_aligned_collections   aligned collections run with this device's ladder
 * (The allocator's own num_collect_callbacks, the calls it made to the runner, declined
 * ones included, are the engine tests' figure and not reported here.) */
static int set_collector_stats(const nd_device *dev, PyObject *dict) {
    nd_pacer_state empty;
    nd_pacer_init(&empty);
    const nd_pacer_state *state = pressure_device_state(dev);
    const nd_pacer_counts *c = state != NULL ? &state->counts : &empty.counts;
    int64_t survivors = state != NULL ? state->survivors : 0;
    struct {
        const char *key;
        int64_t value;
    } counts[] = {
        {"num_pressure_collections", c->pressure_collections},
        {"num_oom_collections", c->oom_collections},
        {"num_collect_calls", c->pressure_collections + c->oom_collections},
        {"num_pressure_skips", c->skipped},
        {"num_safe_point_collections", c->safe_point_collections},
        {"num_pressure_deferrals", c->deferred},
        {"gc_freed_bytes", c->freed_bytes},
        {"gc_survivor_bytes", survivors},
        {"num_scoped_collections", c->scoped_collections},
        {"scoped_objects_examined", c->scoped_examined},
        {"scoped_freed_bytes", c->scoped_freed_bytes},
        {"num_full_collections", c->full_collections},
        {"num_full_fallbacks", c->full_fallbacks},
        {"num_fallbacks_skipped", c->fallbacks_skipped},
        {"num_aligned_wants", c->aligned_wants},
        {"aligned_rounds_waited", c->aligned_rounds_waited},
        {"num_aligned_collections", c->aligned_collections},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (set_item(dict, counts[i].key, counts[i].value) < 0) return -1;
    struct {
        const char *key;
        double value;
    } times[] = {{"gc_seconds", c->seconds}, {"scoped_gc_seconds", c->scoped_seconds}};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
        PyObject *v = PyFloat_FromDouble(times[i].value);
        if (v == NULL) return -1;
        int rc = PyDict_SetItemString(dict, times[i].key, v);
        Py_DECREF(v);
        if (rc < 0) return -1;
    }
    return 0;
}

static PyObject *memory_stats(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_of_engine_id(arg);
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
        set_fragmentation(d, &s) < 0 || set_collector_stats(dev, d) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* The hot getters skip building the dict. */
static PyObject *memory_allocated(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_of_engine_id(arg);
    if (dev == NULL) return NULL;
    nd_memory_stats s;
    nd_memory_get_stats(dev, &s);
    return PyLong_FromLongLong(s.allocated_current);
}

static PyObject *memory_reset_peaks(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_of_engine_id(arg);
    if (dev == NULL) return NULL;
    nd_memory_reset_peaks(dev);
    Py_RETURN_NONE;
}

static PyObject *memory_window_peak(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_of_engine_id(arg);
    if (dev == NULL) return NULL;
    return PyLong_FromLongLong(nd_memory_window_peak(dev));
}

static PyObject *memory_empty_cache(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_of_engine_id(arg);
    if (dev == NULL) return NULL;
    return PyLong_FromLongLong(nd_memory_empty_cache(dev));
}

static PyObject *memory_set_limit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_set_memory_limit(device_id, bytes or -1)");
        return NULL;
    }
    nd_device *dev = device_of_engine_id(args[0]);
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

/* needle.memory's alloc_conf parses and checks the options; the engine checks again. */
static PyObject *memory_set_settings(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "_set_allocator_settings(device_id, max_split_bytes, "
                                         "gc_threshold, expandable_segments)");
        return NULL;
    }
    nd_device *dev = device_of_engine_id(args[0]);
    if (dev == NULL) return NULL;
    nd_alloc_settings settings;
    settings.max_split_size = PyLong_AsLongLong(args[1]);
    if (settings.max_split_size == -1 && PyErr_Occurred()) return NULL;
    settings.gc_threshold = PyFloat_AsDouble(args[2]);
    if (settings.gc_threshold == -1.0 && PyErr_Occurred()) return NULL;
    settings.expandable_segments = PyObject_IsTrue(args[3]);
    if (settings.expandable_segments < 0) return NULL;
    nd_status status = nd_memory_set_settings(dev, &settings);
    if (status != ND_OK) return raise_status(state_of_module(module), status);
    Py_RETURN_NONE;
}

static PyObject *memory_get_settings(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_of_engine_id(arg);
    if (dev == NULL) return NULL;
    nd_alloc_settings s;
    nd_memory_get_settings(dev, &s);
    return Py_BuildValue("(LdO)", (long long)s.max_split_size, s.gc_threshold,
                         s.expandable_segments ? Py_True : Py_False);
}

PyMethodDef memory_module_functions[] = {
    {"_memory_stats", memory_stats, METH_O,
     "_memory_stats(device_id, /)\n--\n\nThe device's allocator statistics as a flat dict."},
    {"_memory_allocated", memory_allocated, METH_O,
     "_memory_allocated(device_id, /)\n--\n\nBytes held by live storages on the device."},
    {"_reset_peak_memory_stats", memory_reset_peaks, METH_O,
     "_reset_peak_memory_stats(device_id, /)\n--\n\nSets every peak to its current value."},
    {"_memory_window_peak", memory_window_peak, METH_O,
     "_memory_window_peak(device_id, /)\n--\n\nThe allocated peak since the last call (since "
     "start on the first), restarting the window at the current allocated bytes; "
     "reset_peak_memory_stats leaves it. The notebook extension's per-cell peak."},
    {"_empty_cache", memory_empty_cache, METH_O,
     "_empty_cache(device_id, /)\n--\n\nReleases cached blocks; returns the bytes released."},
    {"_set_memory_limit", (PyCFunction)(void (*)(void))memory_set_limit, METH_FASTCALL,
     "_set_memory_limit(device_id, limit, /)\n--\n\nLimit in bytes on reserved memory; -1 removes "
     "it."},
    {"_set_allocator_settings", (PyCFunction)(void (*)(void))memory_set_settings, METH_FASTCALL,
     "_set_allocator_settings(device_id, max_split_bytes, gc_threshold, expandable_segments, "
     "/)\n--\n\nThe caching allocator's settings (<= 0 bytes, 0.0: off)."},
    {"_get_allocator_settings", memory_get_settings, METH_O,
     "_get_allocator_settings(device_id, /)\n--\n\n(max_split_bytes, gc_threshold, "
     "expandable_segments) of the device."},
    {"_memory_record_history", (PyCFunction)(void (*)(void))history_py_record, METH_FASTCALL,
     "_memory_record_history(device_id, enabled, context, all_frames, max_entries, skip_mask, "
     "clear, /)\n--\n\nStarts, changes or stops the device's memory history (history.c)."},
    {"_memory_snapshot", history_py_snapshot, METH_O,
     "_memory_snapshot(device_id, /)\n--\n\n(blocks, trace): the device's segments' blocks and "
     "the recorded events, as tuples (history.c)."},
    {"_memory_history_settings", history_py_settings, METH_O,
     "_memory_history_settings(device_id, /)\n--\n\n(enabled, context, all_frames, "
     "max_entries, skip_mask): the device's history settings, as _memory_record_history "
     "takes them (history.c)."},
    {"_memory_history_reset_peak", history_py_reset_peak, METH_O,
     "_memory_history_reset_peak(device_id, /)\n--\n\nStarts the device's peak record afresh "
     "from the bytes allocated now (history.c); ValueError when no history is recorded."},
    {"_memory_history_peak", history_py_peak, METH_O,
     "_memory_history_peak(device_id, /)\n--\n\nNone when no allocation passed the bytes "
     "allocated at the reset, else (peak_bytes, frames, blocks): the frames of the allocation "
     "at the peak and (seq, bytes, frames) of each block allocated since the reset and live "
     "at the peak (history.c)."},
    {"_memory_history_prefix", history_py_set_prefix, METH_O,
     "_memory_history_prefix(path, /)\n--\n\nFrames from files under path are needle's own."},
    {"_memory_history_actions", history_py_actions, METH_NOARGS,
     "_memory_history_actions()\n--\n\nThe trace's action names, bit i of skip_mask for "
     "action i."},
    {NULL, NULL, 0, NULL},
};
