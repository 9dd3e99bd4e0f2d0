/* cuda_info.c: what needle.cuda asks of the CUDA backend beyond the
 * engine's memory accounting: whether CUDA was compiled in, why it is
 * unavailable, the driver's free/total bytes of a GPU, and which GEMM the
 * backend runs.
 *
 * Built with and without NEEDLE_WITH_CUDA; without it every function answers
 * "unavailable" (False, None, the reason) instead of failing, so callers need
 * no checks.
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

/* Why CUDA is unavailable: None when a GPU is registered. */
static PyObject *cuda_init_error(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
#ifdef NEEDLE_WITH_CUDA
    (void)nd_device_count(); /* discovery runs with the device table's first use */
    const char *reason = nd_cuda_init_error();
    if (reason[0] == '\0') Py_RETURN_NONE;
    return PyUnicode_FromString(reason);
#else
    return PyUnicode_FromString(
        "needle was built without CUDA (NEEDLE_CUDA=0, NEEDLE_SANITIZE=1, or no CUDA toolkit "
        "with nvcc at build time)");
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
    {"_cuda_init_error", cuda_init_error, METH_NOARGS,
     "_cuda_init_error()\n--\n\nWhy needle cannot use CUDA (the CUDA error of device discovery "
     "with the driver's and runtime's CUDA versions, or that CUDA was not built), or None when a "
     "GPU is usable."},
    {"_cuda_mem_get_info", cuda_mem_get_info, METH_O,
     "_cuda_mem_get_info(ordinal, /)\n--\n\n(free, total) bytes of GPU `ordinal` as the driver "
     "reports them (cudaMemGetInfo), or None when there is no such GPU or no CUDA backend."},
    {"_cuda_gemm", cuda_gemm, METH_NOARGS,
     "_cuda_gemm()\n--\n\nWhich GEMM the CUDA backend runs (cuBLAS or needle's kernel); None "
     "without a CUDA backend."},
    {NULL, NULL, 0, NULL},
};
