/* cuda_streams.c: the binding of the engine's CUDA streams
 * (csrc/cuda/cuda_stream.cu) for python/needle/_cuda_stream.py, which builds
 * ndl.cuda.Stream, current_stream() and the stream(s) context on it.
 *
 * One entry point, _cuda_stream(op, ordinal, handle=0, other=0), because each
 * operation is one engine call with the same arguments; handles are ints
 * (cudaStream_t values; 0 names needle's own stream of the GPU). Without the
 * CUDA backend every operation raises needle.DeviceError: there is no stream
 * to name, and a silent answer would pretend there were.
 */
#include "needle_c.h"

#ifdef NEEDLE_WITH_CUDA
#include "cuda/cuda_api.h"
#endif

static PyObject *cuda_stream(PyObject *module, PyObject *args) {
    const char *op = NULL;
    int ordinal = 0;
    unsigned long long handle = 0, other = 0;
    if (!PyArg_ParseTuple(args, "si|KK:_cuda_stream", &op, &ordinal, &handle, &other)) return NULL;
    needle_state *st = state_of_module(module);
#ifdef NEEDLE_WITH_CUDA
    intptr_t out = 0;
    int done = 0;
    nd_status status;
    if (strcmp(op, "default") == 0) status = nd_cuda_stream_default(ordinal, &out);
    else if (strcmp(op, "current") == 0) status = nd_cuda_stream_current(ordinal, &out);
    else if (strcmp(op, "set") == 0) status = nd_cuda_stream_set(ordinal, (intptr_t)handle);
    else if (strcmp(op, "create") == 0) status = nd_cuda_stream_create(ordinal, &out);
    else if (strcmp(op, "destroy") == 0) status = nd_cuda_stream_destroy(ordinal, (intptr_t)handle);
    else if (strcmp(op, "synchronize") == 0)
        status = nd_cuda_stream_synchronize(ordinal, (intptr_t)handle);
    else if (strcmp(op, "query") == 0)
        status = nd_cuda_stream_query(ordinal, (intptr_t)handle, &done);
    else if (strcmp(op, "wait") == 0)
        status = nd_cuda_stream_wait(ordinal, (intptr_t)handle, (intptr_t)other);
    else {
        PyErr_Format(PyExc_ValueError, "_cuda_stream: unknown operation %.40s", op);
        return NULL;
    }
    if (status != ND_OK) return raise_status(st, status);
    if (strcmp(op, "query") == 0) return PyBool_FromLong(done);
    if (out != 0) return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)out);
    Py_RETURN_NONE;
#else
    (void)handle;
    (void)other;
    PyErr_Format(st->device_error, "CUDA stream %.40s on GPU %d: needle was built without CUDA", op,
                 ordinal);
    return NULL;
#endif
}

PyMethodDef cuda_streams_module_functions[] = {
    {"_cuda_stream", cuda_stream, METH_VARARGS,
     "_cuda_stream(op, ordinal, handle=0, other=0): the engine's CUDA stream operations "
     "(default, current, set, create, destroy, synchronize, query, wait)."},
    {NULL, NULL, 0, NULL},
};
