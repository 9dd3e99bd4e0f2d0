/* alloc_sites.c: the live count of Values (the course's TENSOR_COUNTER) and,
 * when needle.memory.record_history(True) is on, where each Value was made
 * (the Python frames, innermost first), for leak reports.
 */
#include "tensor.h"

/* Live Values, for the course's autograd.TENSOR_COUNTER. */
static Py_ssize_t live_values = 0;

/* When on, each new Value remembers the frames that created it. */
static int record_history = 0;
#define HISTORY_DEPTH 12

static void remember_site(PyObject *value) {
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    PyObject *frames = PyList_New(0);
    if (frames == NULL) goto fail;
    Py_XINCREF(frame);
    for (int depth = 0; frame != NULL && depth < HISTORY_DEPTH; depth++) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        PyObject *entry =
            Py_BuildValue("(OiO)", code->co_filename, PyFrame_GetLineNumber(frame), code->co_name);
        Py_DECREF(code);
        if (entry == NULL || PyList_Append(frames, entry) < 0) {
            Py_XDECREF(entry);
            Py_DECREF(frame);
            goto fail;
        }
        Py_DECREF(entry);
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    PyObject *site = PyList_AsTuple(frames);
    if (site == NULL || PyObject_SetAttrString(value, "_alloc_site", site) < 0) {
        Py_XDECREF(site);
        goto fail;
    }
    Py_DECREF(site);
    Py_DECREF(frames);
    return;
fail:
    Py_XDECREF(frames);
    /* Diagnostics must never break the op that is being recorded. */
    PyErr_Clear();
}

void alloc_site_record(PyObject *value) {
    live_values++;
    if (record_history) remember_site(value);
}

void alloc_site_forget(PyObject *value) {
    (void)value;
    live_values--;
}

static PyObject *mod_tensor_count(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyLong_FromSsize_t(live_values);
}

static PyObject *mod_record_history(PyObject *module, PyObject *arg) {
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    PyObject *previous = PyBool_FromLong(record_history);
    record_history = on;
    return previous;
}

PyMethodDef alloc_site_functions[] = {
    {"_record_history", mod_record_history, METH_O,
     "_record_history(on, /)\n--\n\nWhen on, new tensors keep the frames that created them in "
     "_alloc_site. Returns the previous setting."},
    {"_tensor_count", mod_tensor_count, METH_NOARGS,
     "_tensor_count()\n--\n\nLive Tensor/TensorTuple objects."},
    {NULL, NULL, 0, NULL},
};
