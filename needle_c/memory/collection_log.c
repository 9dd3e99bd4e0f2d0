/* collection_log.c: every collection recorded (collection_log.h): its
 * trigger, its scope (scoped, or full and the generation), when it started,
 * its seconds and what it freed, in a ring of the latest
 * COLLECTION_LOG_CAPACITY records, for needle.memory.collection_history(),
 * the snapshot's trace, MemoryMonitor's plot and memory_summary's pause
 * histogram. It records; it decides nothing and runs no collection.
 *
 * Clocks: `start` is CLOCK_MONOTONIC (time.monotonic()'s clock, so records
 * line up with MemoryMonitor's samples) and `seconds` the real time taken,
 * whatever clock a test gave the pacer; the trace's mark carries the wall
 * clock in microseconds, as the history's other entries do (history.c).
 *
 * Runs with the GIL held; begin, note and end run no Python code, so the
 * runner may call them anywhere in a collection.
 */
#include "collection_log.h"

#include "history.h"

#include <string.h>
#include <time.h>

static const char *const COLLECTION_TRIGGER_NAMES[] = {"pressure", "safe_point", "oom", "aligned",
                                                       "user"};

typedef struct collection_record {
    int64_t index;
    int device; /* engine id; -1: the whole process */
    collection_trigger trigger;
    int ran;        /* a step ran (collection_log_note) */
    int generation; /* the oldest full collection's; -1: scoped only */
    double start, seconds;
    int64_t wall_us;
    int64_t bytes_freed, objects_freed;
} collection_record;

static struct {
    collection_record ring[COLLECTION_LOG_CAPACITY];
    int64_t count, next; /* records kept; where the next one goes */
    int64_t next_index;  /* the index the next record gets */
    /* The open record and the allocated bytes it started from (per device
     * for a process-wide one). */
    int open;
    collection_record current;
    int64_t before[ND_MAX_DEVICES];
    int python_owned; /* the observer opened it (a user's gc.collect()) */
} log_state;

static double monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t wall_us(void) {
    struct timespec ts;
    if (timespec_get(&ts, TIME_UTC) != TIME_UTC) return 0;
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t allocated_on(int id) {
    nd_device *dev = nd_device_at(id);
    if (dev == NULL) return 0;
    nd_memory_stats s;
    nd_memory_get_stats(dev, &s);
    return s.allocated_current;
}

static int device_count(void) {
    int n = nd_device_count();
    return n < ND_MAX_DEVICES ? n : ND_MAX_DEVICES;
}

int collection_log_begin(nd_device *dev, collection_trigger trigger) {
    if (log_state.open) return 0;
    collection_record *r = &log_state.current;
    *r = (collection_record){
        .index = log_state.next_index,
        .device = dev != NULL ? nd_device_id(dev) : -1,
        .trigger = trigger,
        .generation = -1,
        .start = monotonic_seconds(),
        .wall_us = wall_us(),
    };
    for (int id = 0; id < device_count(); id++)
        log_state.before[id] = r->device < 0 || r->device == id ? allocated_on(id) : 0;
    log_state.open = 1;
    log_state.python_owned = 0;
    history_note_collection(dev, r->index, r->wall_us);
    return 1;
}

void collection_log_note(int generation, int64_t objects) {
    if (!log_state.open) return;
    collection_record *r = &log_state.current;
    r->ran = 1;
    if (generation > r->generation) r->generation = generation;
    if (objects > 0) r->objects_freed += objects;
}

void collection_log_end(int owned) {
    if (!owned || !log_state.open) return;
    collection_record *r = &log_state.current;
    log_state.open = 0;
    /* Its index stays taken: the trace's mark already names it. */
    log_state.next_index++;
    if (!r->ran) return;
    r->seconds = monotonic_seconds() - r->start;
    for (int id = 0; id < device_count(); id++) {
        if (r->device >= 0 && r->device != id) continue;
        int64_t freed = log_state.before[id] - allocated_on(id);
        if (freed > 0) r->bytes_freed += freed;
    }
    log_state.ring[log_state.next] = *r;
    log_state.next = (log_state.next + 1) % COLLECTION_LOG_CAPACITY;
    if (log_state.count < COLLECTION_LOG_CAPACITY) log_state.count++;
}

void collection_log_python_phase(int start, int generation, int64_t collected) {
    if (start) {
        /* 2: the oldest generation, what gc.collect() collects by default. */
        if (generation == 2 && collection_log_begin(NULL, COLLECTION_USER))
            log_state.python_owned = 1;
        return;
    }
    if (!log_state.open || !log_state.python_owned) return;
    collection_log_note(generation, collected);
    collection_log_end(1);
}

/* ------------------------------------------------- module functions */

/* The record as (index, device_id or -1, trigger, scope, generation or None,
 * start, seconds, bytes_freed, objects_freed, wall_us). */
static PyObject *record_tuple(const collection_record *r) {
    PyObject *generation = r->generation >= 0 ? PyLong_FromLong(r->generation) : Py_NewRef(Py_None);
    if (generation == NULL) return NULL;
    return Py_BuildValue(
        "(LissNddLLL)", (long long)r->index, r->device, COLLECTION_TRIGGER_NAMES[r->trigger],
        r->generation >= 0 ? "full" : "scoped", generation, r->start, r->seconds,
        (long long)r->bytes_freed, (long long)r->objects_freed, (long long)r->wall_us);
}

static PyObject *collection_history(PyObject *module, PyObject *args) {
    (void)module;
    int device, clear;
    if (!PyArg_ParseTuple(args, "ip:_collection_history", &device, &clear)) return NULL;
    if (device < -1 || device >= ND_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "_collection_history: no engine device %d", device);
        return NULL;
    }
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    /* Oldest first; with clear, the records returned go and the others stay. */
    collection_record *kept = clear ? PyMem_Malloc(sizeof *kept * COLLECTION_LOG_CAPACITY) : NULL;
    if (clear && kept == NULL) {
        Py_DECREF(list);
        return PyErr_NoMemory();
    }
    int64_t nkept = 0;
    int64_t first = log_state.count < COLLECTION_LOG_CAPACITY ? 0 : log_state.next;
    for (int64_t i = 0; i < log_state.count; i++) {
        const collection_record *r = &log_state.ring[(first + i) % COLLECTION_LOG_CAPACITY];
        if (device >= 0 && r->device >= 0 && r->device != device) {
            if (kept != NULL) kept[nkept++] = *r;
            continue;
        }
        PyObject *row = record_tuple(r);
        if (row == NULL || PyList_Append(list, row) < 0) {
            Py_XDECREF(row);
            Py_DECREF(list);
            PyMem_Free(kept);
            return NULL;
        }
        Py_DECREF(row);
    }
    if (kept != NULL) {
        memcpy(log_state.ring, kept, sizeof kept[0] * (size_t)nkept);
        log_state.count = nkept;
        log_state.next = nkept % COLLECTION_LOG_CAPACITY;
        PyMem_Free(kept);
    }
    return list;
}

static PyObject *collection_log_capacity(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyLong_FromLong(COLLECTION_LOG_CAPACITY);
}

PyMethodDef collection_log_module_functions[] = {
    {"_collection_history", collection_history, METH_VARARGS,
     "_collection_history(device_id, clear, /)\n--\n\nThe recorded collections, oldest first, "
     "as (index, device_id, trigger, scope, generation, start, seconds, bytes_freed, "
     "objects_freed, wall_us) tuples: those of device_id and the process-wide ones (device_id "
     "-1), or all with device_id -1; clear: forget the ones returned."},
    {"_collection_log_capacity", collection_log_capacity, METH_NOARGS,
     "_collection_log_capacity()\n--\n\nHow many records the ring keeps."},
    {NULL, NULL, 0, NULL},
};
