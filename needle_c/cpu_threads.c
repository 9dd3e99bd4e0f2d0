/* cpu_threads.c: how many threads the CPU backend's row kernels (softmax,
 * cross-entropy) use, read and set from Python: needle_c._num_threads() and
 * needle_c._set_num_threads(n). The engine owns the number (csrc/cpu/cpu_parallel.c:
 * NEEDLE_NUM_THREADS, else the online processors); benchmarks read it to give
 * PyTorch as many.
 */
#include "needle_c.h"

#include "config.h"

/* The most threads a caller may ask for: NEEDLE_NUM_THREADS's bound (config.h). */
#define THREADS_ACCEPTED_MAX 256

static PyObject *num_threads(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyLong_FromLong(nd_cpu_get_threads());
}

static PyObject *set_num_threads(PyObject *module, PyObject *arg) {
    (void)module;
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "_set_num_threads needs an int, got %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > THREADS_ACCEPTED_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "_set_num_threads: n must be 1 to %d (0: the default), got %ld",
                     THREADS_ACCEPTED_MAX, n);
        return NULL;
    }
    nd_cpu_set_threads((int)n);
    Py_RETURN_NONE;
}

/* The engine reads NEEDLE_NUM_THREADS itself, when a kernel first splits rows, and would
 * use the online processors for a value it cannot use: the same parser (config.h) runs here
 * at import, where the mistake can still be reported. */
int cpu_threads_check_environment(void) {
    int64_t n = 0;
    if (nd_config_count(ND_CFG_NUM_THREADS, &n) < 0) {
        PyErr_SetString(PyExc_ValueError, nd_last_error());
        return -1;
    }
    return 0;
}

PyMethodDef cpu_threads_module_functions[] = {
    {"_num_threads", num_threads, METH_NOARGS,
     "_num_threads()\n--\n\nThreads the CPU's row kernels (softmax, cross-entropy) split large "
     "arrays over."},
    {"_set_num_threads", set_num_threads, METH_O,
     "_set_num_threads(n, /)\n--\n\nSets that number (1 to 256); 0 restores the default "
     "(NEEDLE_NUM_THREADS, else the online processors)."},
    {NULL, NULL, 0, NULL},
};
