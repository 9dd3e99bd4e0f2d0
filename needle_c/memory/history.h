/* history.h: the memory history's module functions (history.c), listed in
 * stats.c's table with the other memory functions, and the values of their
 * enabled/context arguments, which needle/memory/snapshot.py passes. */
#ifndef NEEDLE_C_MEMORY_HISTORY_H
#define NEEDLE_C_MEMORY_HISTORY_H

#include "needle_c.h"

/* enabled: nothing; frames of live blocks; those and the trace of events. */
enum { HISTORY_OFF = 0, HISTORY_STATE = 1, HISTORY_ALL = 2 };
/* context: no frames; frames of live blocks; also of allocations (and
 * out-of-memory events) in the trace; "all" (frees get no frames: a free may
 * come while the collector runs, where walking Python's frames is unsafe). */
enum { CONTEXT_NONE = 0, CONTEXT_STATE = 1, CONTEXT_ALLOC = 2, CONTEXT_ALL = 3 };

/* Marks in the trace of dev (NULL: of every device recording one) that the
 * collection `index` (collection_log.c) starts now (time_us: the wall
 * clock's microseconds). Runs no Python code. */
void history_note_collection(const nd_device *dev, int64_t index, int64_t time_us);

PyObject *history_py_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *history_py_snapshot(PyObject *module, PyObject *arg);
PyObject *history_py_settings(PyObject *module, PyObject *arg);
PyObject *history_py_reset_peak(PyObject *module, PyObject *arg);
PyObject *history_py_peak(PyObject *module, PyObject *arg);
PyObject *history_py_set_prefix(PyObject *module, PyObject *arg);
PyObject *history_py_actions(PyObject *module, PyObject *ignored);

#endif /* NEEDLE_C_MEMORY_HISTORY_H */
