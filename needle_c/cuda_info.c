/* cuda_info.c: what needle.cuda asks of the CUDA backend beyond the
 * engine's memory accounting: whether CUDA was compiled in, the driver's
 * free/total bytes of a GPU, its name, which GEMM the backend runs, and
 * whether the backend is the CPU simulator (NEEDLE_CUDA=sim).
 *
 * Built with and without NEEDLE_WITH_CUDA; without it every function answers
 * "unavailable" (False, None) instead of failing, so callers need no checks.
 */
#include "needle_c.h"

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

static PyObject *cuda_gemm(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
#ifdef NEEDLE_WITH_CUDA
    return PyUnicode_FromString(nd_cuda_gemm_description());
#else
    Py_RETURN_NONE;
#endif
}

PyMethodDef cuda_info_module_functions[] = {
    {"_cuda_compiled", cuda_compiled, METH_NOARGS,
     "_cuda_compiled()\n--\n\nTrue when this build of needle_c contains the CUDA backend."},
    {"_cuda_simulated", cuda_simulated, METH_NOARGS,
     "_cuda_simulated()\n--\n\nTrue when the CUDA backend of this build runs on needle's CPU "
     "simulator (NEEDLE_CUDA=sim), False for a real CUDA runtime or no CUDA backend."},
    {"_cuda_device_name", cuda_device_name, METH_O,
     "_cuda_device_name(ordinal, /)\n--\n\nThe name of GPU `ordinal` (cudaDeviceProp.name), or "
     "None when there is no such GPU or no CUDA backend."},
    {"_cuda_mem_get_info", cuda_mem_get_info, METH_O,
     "_cuda_mem_get_info(ordinal, /)\n--\n\n(free, total) bytes of GPU `ordinal` as the driver "
     "reports them (cudaMemGetInfo), or None when there is no such GPU or no CUDA backend."},
    {"_cuda_gemm", cuda_gemm, METH_NOARGS,
     "_cuda_gemm()\n--\n\nWhich GEMM the CUDA backend runs (cuBLAS or needle's kernel); None "
     "without a CUDA backend."},
    {NULL, NULL, 0, NULL},
};
