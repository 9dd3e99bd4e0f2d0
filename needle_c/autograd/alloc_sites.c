/* alloc_sites.c: the live count of Values (the course's TENSOR_COUNTER) and,
 * when needle.memory.record_history(True) is on, where each Value was made
 * (the Python frames, innermost first), for leak reports.
 */
#include "tensor.h"

/* The count and the switch are the runtime's (needle_rt.autograd
 * .live_values, .record_sites): a Value's dealloc has no module to reach. */
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
    needle_rt.autograd.live_values++;
    if (needle_rt.autograd.record_sites) remember_site(value);
}

void alloc_site_forget(PyObject *value) {
    (void)value;
    needle_rt.autograd.live_values--;
}

static PyObject *mod_tensor_count(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyLong_FromSsize_t(needle_rt.autograd.live_values);
}

static PyObject *mod_record_history(PyObject *module, PyObject *arg) {
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    PyObject *previous = PyBool_FromLong(needle_rt.autograd.record_sites);
    needle_rt.autograd.record_sites = on;
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
