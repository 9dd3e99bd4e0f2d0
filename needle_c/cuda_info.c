/* cuda_info.c: what needle.cuda asks of the CUDA backend beyond the
 * engine's memory accounting: whether CUDA was compiled in, why it is
 * unavailable, the driver's free/total bytes of a GPU, its name, which GEMM
 * the backend runs, whether the backend is the CPU simulator
 * (NEEDLE_CUDA=sim), the census of the work it asked of each GPU, and which
 * GPU architectures the build has code for (with the decision, cuda_arch.h,
 * exposed for tests: it is plain C, in every build).
 *
 * Built with and without NEEDLE_WITH_CUDA; without it every function answers
 * "unavailable" (False, None, the reason) instead of failing, so callers need
 * no checks.
 */
#include "needle_c.h"

#include "cuda_arch.h"

#ifdef NEEDLE_WITH_CUDA
#include "cuda/cuda_api.h"
#endif

static PyObject *cuda_compiled(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
#ifdef NEEDLE_WITH_CUDA
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

const char *cuda_unavailable_reason(void) {
#ifdef NEEDLE_WITH_CUDA
    (void)nd_device_count(); /* discovery runs with the device table's first use */
    return nd_cuda_init_error();
#else
    return "needle was built without CUDA (NEEDLE_CUDA=0, NEEDLE_SANITIZE=1, or no CUDA toolkit "
           "with nvcc at build time)";
#endif
}

/* Why CUDA is unavailable: None when a GPU is registered. */
static PyObject *cuda_init_error(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    const char *reason = cuda_unavailable_reason();
    if (reason[0] == '\0') Py_RETURN_NONE;
    return PyUnicode_FromString(reason);
}

static PyObject *cuda_simulated(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
#ifdef NEEDLE_WITH_CUDA
    return PyBool_FromLong(nd_cuda_simulated());
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *cuda_device_name(PyObject *module, PyObject *arg) {
    long ordinal = PyLong_AsLong(arg);
    if (ordinal == -1 && PyErr_Occurred()) return NULL;
#ifdef NEEDLE_WITH_CUDA
    if (ordinal < 0 || ordinal > INT_MAX) Py_RETURN_NONE;
    char name[256];
    nd_status status = nd_cuda_device_name((int)ordinal, name, sizeof name);
    if (status == ND_ERR_DEVICE) Py_RETURN_NONE; /* no such GPU */
    if (status != ND_OK) return raise_status(state_of_module(module), status);
    return PyUnicode_DecodeUTF8(name, (Py_ssize_t)strlen(name), "replace");
#else
    (void)module;
    Py_RETURN_NONE;
#endif
}

static PyObject *cuda_mem_get_info(PyObject *module, PyObject *arg) {
    long ordinal = PyLong_AsLong(arg);
    if (ordinal == -1 && PyErr_Occurred()) return NULL;
#ifdef NEEDLE_WITH_CUDA
    int64_t free_bytes = 0, total_bytes = 0;
    nd_status status = nd_cuda_mem_get_info((int)ordinal, &free_bytes, &total_bytes);
    if (status == ND_ERR_DEVICE) Py_RETURN_NONE; /* no such GPU */
    if (status != ND_OK) return raise_status(state_of_module(module), status);
    return Py_BuildValue("(LL)", (long long)free_bytes, (long long)total_bytes);
#else
    (void)module;
    Py_RETURN_NONE;
#endif
}

/* GPU `ordinal`'s census as a dict of counts (bytes for *_bytes), or None
 * when there is no such GPU; with reset true, zeroes it after reading. */
static PyObject *cuda_work(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_cuda_work() takes exactly two arguments");
        return NULL;
    }
    long ordinal = PyLong_AsLong(args[0]);
    if (ordinal == -1 && PyErr_Occurred()) return NULL;
    int reset = PyObject_IsTrue(args[1]);
    if (reset < 0) return NULL;
#ifdef NEEDLE_WITH_CUDA
    if (ordinal < 0 || ordinal > INT_MAX) Py_RETURN_NONE;
    nd_cuda_work w;
    nd_status status = nd_cuda_work_get((int)ordinal, &w);
    if (status == ND_ERR_DEVICE) Py_RETURN_NONE; /* no such GPU */
    if (status != ND_OK) return raise_status(state_of_module(module), status);
    if (reset && (status = nd_cuda_work_reset((int)ordinal)) != ND_OK)
        return raise_status(state_of_module(module), status);
    return Py_BuildValue(
        "{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L}", "kernel_launches",
        (long long)w.kernel_launches, "memsets", (long long)w.memsets, "d2d_copies",
        (long long)w.d2d_copies, "blas_calls", (long long)w.blas_calls, "host_syncs",
        (long long)w.host_syncs, "device_mallocs", (long long)w.device_mallocs, "device_frees",
        (long long)w.device_frees, "h2d_copies", (long long)w.h2d_copies, "h2d_bytes",
        (long long)w.h2d_bytes, "d2h_copies", (long long)w.d2h_copies, "d2h_bytes",
        (long long)w.d2h_bytes, "graph_launches", (long long)w.graph_launches, "graph_nodes",
        (long long)w.graph_nodes, "legacy_stream_work", (long long)w.legacy_stream_work);
#else
    (void)module;
    Py_RETURN_NONE;
#endif
}

/* Waits for GPU `ordinal` and raises what its kernels found (a bad index). */
static PyObject *cuda_synchronize(PyObject *module, PyObject *arg) {
    long ordinal = PyLong_AsLong(arg);
    if (ordinal == -1 && PyErr_Occurred()) return NULL;
#ifdef NEEDLE_WITH_CUDA
    nd_status status =
        nd_cuda_synchronize_device(ordinal < 0 || ordinal > INT_MAX ? -1 : (int)ordinal);
    if (status != ND_OK) return raise_status(state_of_module(module), status);
    Py_RETURN_NONE;
#else
    (void)module;
    Py_RETURN_NONE;
#endif
}

/* GPU `ordinal`'s launches by call site: {"kernel file:line": count}. */
static PyObject *cuda_work_sites(PyObject *module, PyObject *arg) {
    long ordinal = PyLong_AsLong(arg);
    if (ordinal == -1 && PyErr_Occurred()) return NULL;
    (void)module;
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
#ifdef NEEDLE_WITH_CUDA
    if (ordinal < 0 || ordinal > INT_MAX) return out;
    const char *names[256];
    int64_t counts[256];
    int n = nd_cuda_work_sites((int)ordinal, names, counts, 256);
    for (int i = 0; i < n; i++) {
        PyObject *count = PyLong_FromLongLong((long long)counts[i]);
        if (count == NULL || PyDict_SetItemString(out, names[i], count) < 0) {
            Py_XDECREF(count);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(count);
    }
#endif
    return out;
}

static PyObject *cuda_gemm(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
#ifdef NEEDLE_WITH_CUDA
    return PyUnicode_FromString(nd_cuda_gemm_description());
#else
    Py_RETURN_NONE;
#endif
}

/* Sets (with a sequence of str) and returns the directories the cuBLAS loader
 * looks in; always () without a CUDA backend. */
static PyObject *cuda_cublas_dirs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    needle_state *st = state_of_module(module);
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "_cuda_cublas_dirs() takes at most one argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        if (PyUnicode_Check(args[0]) || !PySequence_Check(args[0])) {
            PyErr_Format(PyExc_TypeError,
                         "_cuda_cublas_dirs() expects a sequence of directory names, got %.100s",
                         Py_TYPE(args[0])->tp_name);
            return NULL;
        }
        PyObject *seq = PySequence_Fast(args[0], "expected a sequence");
        if (seq == NULL) return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        const char *dirs[8];
        if (n > 8) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "at most 8 cuBLAS directories, got %zd", n);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
            if (!PyUnicode_Check(item)) {
                Py_DECREF(seq);
                PyErr_Format(PyExc_TypeError, "a cuBLAS directory must be a str, got %.100s",
                             Py_TYPE(item)->tp_name);
                return NULL;
            }
            /* Borrowed UTF-8 of items seq holds: valid until seq is released. */
            dirs[i] = PyUnicode_AsUTF8(item);
            if (dirs[i] == NULL) {
                Py_DECREF(seq);
                return NULL;
            }
        }
#ifdef NEEDLE_WITH_CUDA
        nd_status status = nd_cuda_set_cublas_dirs((int)n, dirs);
        Py_DECREF(seq);
        if (status != ND_OK) return raise_status(st, status);
#else
        (void)dirs;
        Py_DECREF(seq);
#endif
    }
    (void)st;
#ifdef NEEDLE_WITH_CUDA
    const char *dirs_now[8];
    int count = nd_cuda_cublas_dirs(dirs_now, 8);
    PyObject *out = PyTuple_New(count);
    if (out == NULL) return NULL;
    for (int i = 0; i < count; i++) {
        PyObject *s = PyUnicode_FromString(dirs_now[i]);
        if (s == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, s);
    }
    return out;
#else
    return PyTuple_New(0);
#endif
}

/* {"sass": [...], "ptx": str or None, "runtime_version": int}: what this
 * build embeds; None without a CUDA backend. */
static PyObject *cuda_build_info(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
#ifdef NEEDLE_WITH_CUDA
    const char *sass = "", *ptx = "";
    int runtime = 0;
    nd_cuda_build_archs(&sass, &ptx, &runtime);
    PyObject *text = PyUnicode_FromString(sass);
    if (text == NULL) return NULL;
    PyObject *archs = PyObject_CallMethod(text, "split", NULL);
    Py_DECREF(text);
    if (archs == NULL) return NULL;
    return Py_BuildValue("{s:N,s:z,s:i}", "sass", archs, "ptx", ptx[0] ? ptx : NULL,
                         "runtime_version", runtime);
#else
    Py_RETURN_NONE;
#endif
}

/* The availability decision of device discovery for given build lists and
 * GPU capability: None (usable) or the reason; ValueError for a malformed
 * list. A test hook: it needs no GPU and no CUDA backend. */
static PyObject *cuda_arch_check(PyObject *module, PyObject *args) {
    (void)module;
    const char *sass, *ptx;
    int toolkit_major, major, minor;
    if (!PyArg_ParseTuple(args, "ssiii:_cuda_arch_check", &sass, &ptx, &toolkit_major, &major,
                          &minor))
        return NULL;
    char why[400];
    int ok = nd_cuda_arch_check(sass, ptx, toolkit_major, major, minor, why, sizeof why);
    if (ok == 1) Py_RETURN_NONE;
    if (ok < 0) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    return PyUnicode_FromString(why);
}

PyMethodDef cuda_info_module_functions[] = {
    {"_cuda_build_info", cuda_build_info, METH_NOARGS,
     "_cuda_build_info()\n--\n\nWhat this build's CUDA backend embeds: {'sass': the architectures "
     "compiled to machine code, e.g. ['75', '80', '86', '89', '90'], 'ptx': the one embedded as "
     "PTX (or None), 'runtime_version': the CUDA runtime linked, e.g. 13000}; None without a "
     "CUDA backend."},
    {"_cuda_arch_check", cuda_arch_check, METH_VARARGS,
     "_cuda_arch_check(sass, ptx, toolkit_major, major, minor, /)\n--\n\nWhether a GPU of "
     "compute capability major.minor can run a build with SASS for `sass` ('75 80 90') and PTX "
     "for `ptx` ('90' or ''): None when it can, else the reason ndl.cuda.unavailable_reason() "
     "gives. ValueError for a malformed list."},
    {"_cuda_compiled", cuda_compiled, METH_NOARGS,
     "_cuda_compiled()\n--\n\nTrue when this build of needle_c contains the CUDA backend."},
    {"_cuda_init_error", cuda_init_error, METH_NOARGS,
     "_cuda_init_error()\n--\n\nWhy needle cannot use CUDA (the CUDA error of device discovery "
     "with the driver's and runtime's CUDA versions, or that CUDA was not built), or None when a "
     "GPU is usable."},
    {"_cuda_simulated", cuda_simulated, METH_NOARGS,
     "_cuda_simulated()\n--\n\nTrue when the CUDA backend of this build runs on needle's CPU "
     "simulator (NEEDLE_CUDA=sim), False for a real CUDA runtime or no CUDA backend."},
    {"_cuda_device_name", cuda_device_name, METH_O,
     "_cuda_device_name(ordinal, /)\n--\n\nThe name of GPU `ordinal` (cudaDeviceProp.name), or "
     "None when there is no such GPU or no CUDA backend."},
    {"_cuda_mem_get_info", cuda_mem_get_info, METH_O,
     "_cuda_mem_get_info(ordinal, /)\n--\n\n(free, total) bytes of GPU `ordinal` as the driver "
     "reports them (cudaMemGetInfo), or None when there is no such GPU or no CUDA backend."},
    {"_cuda_work", (PyCFunction)(void (*)(void))cuda_work, METH_FASTCALL,
     "_cuda_work(ordinal, reset, /)\n--\n\nThe census of the work the CUDA backend asked of GPU "
     "`ordinal` (kernel launches, memsets, device-to-device copies, cuBLAS calls, host syncs, "
     "device mallocs and frees, copies and bytes each way) as a dict, zeroed after reading when "
     "`reset` is true; None when there is no such GPU or no CUDA backend."},
    {"_cuda_synchronize", cuda_synchronize, METH_O,
     "_cuda_synchronize(ordinal, /)\n--\n\nWaits for all work on GPU `ordinal`, then raises the "
     "IndexError of the first bad index or label its kernels met since the last synchronisation "
     "(they report asynchronously)."},
    {"_cuda_work_sites", cuda_work_sites, METH_O,
     "_cuda_work_sites(ordinal, /)\n--\n\nGPU `ordinal`'s kernel launches since the census's "
     "reset by call site, {'kernel file:line': count}; {} without such a GPU."},
    {"_cuda_gemm", cuda_gemm, METH_NOARGS,
     "_cuda_gemm()\n--\n\nWhich GEMM the CUDA backend runs (cuBLAS or needle's kernel); None "
     "without a CUDA backend."},
    {"_cuda_cublas_dirs", (PyCFunction)(void (*)(void))cuda_cublas_dirs, METH_FASTCALL,
     "_cuda_cublas_dirs(dirs=None, /)\n--\n\nThe directories the cuBLAS loader looks in for "
     "libcublas.so.<the runtime's major> after NEEDLE_CUBLAS and the build's hint; with a "
     "sequence of "
     "str (at most 8), sets them first (needle.cuda passes a pip-installed nvidia-cublas "
     "wheel's). () without a CUDA backend."},
    {NULL, NULL, 0, NULL},
};
