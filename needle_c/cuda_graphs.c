/* cuda_graphs.c: the binding of the engine's CUDA graphs
 * (csrc/cuda/cuda_graph.cu) for python/needle/_cuda_graphs.py, which builds
 * ndl.cuda.CUDAGraph, graph(), graph_pool_handle() and
 * make_graphed_callables on it.
 *
 * A captured graph is a capsule that owns the engine's graph: dropping the
 * last reference destroys it (during another capture the engine waits for
 * that capture's end). Without the CUDA backend every call raises
 * needle.DeviceError.
 */
#include "needle_c.h"

#ifdef NEEDLE_WITH_CUDA
#include "cuda/cuda_api.h"

static const char GRAPH_CAPSULE[] = "needle.cuda_graph";

static void graph_capsule_destructor(PyObject *capsule) {
    nd_cuda_graph *g = PyCapsule_GetPointer(capsule, GRAPH_CAPSULE);
    if (g != NULL) nd_cuda_graph_destroy(g);
    else PyErr_Clear();
}

static nd_cuda_graph *graph_of(PyObject *capsule) {
    return PyCapsule_GetPointer(capsule, GRAPH_CAPSULE); /* sets ValueError/TypeError */
}
#endif

#ifndef NEEDLE_WITH_CUDA
static PyObject *no_cuda(needle_state *st) {
    PyErr_SetString(st->device_error, "CUDA graphs: needle was built without CUDA");
    return NULL;
}
#endif

/* _cuda_graph_pool(op, ordinal, pool=0): "create" -> a new pool's id (one
 * reference), "retain" / "release" -> None. */
static PyObject *cuda_graph_pool(PyObject *module, PyObject *args) {
    const char *op = NULL;
    int ordinal = 0, pool = 0;
    if (!PyArg_ParseTuple(args, "si|i:_cuda_graph_pool", &op, &ordinal, &pool)) return NULL;
    needle_state *st = state_of_module(module);
#ifdef NEEDLE_WITH_CUDA
    nd_status status = ND_OK;
    if (strcmp(op, "create") == 0) {
        status = nd_cuda_graph_pool_create(ordinal, &pool);
        if (status == ND_OK) return PyLong_FromLong(pool);
    } else if (strcmp(op, "retain") == 0) {
        status = nd_cuda_graph_pool_retain(ordinal, pool);
    } else if (strcmp(op, "release") == 0) {
        nd_cuda_graph_pool_release(ordinal, pool);
    } else {
        PyErr_Format(PyExc_ValueError, "_cuda_graph_pool: unknown operation %.40s", op);
        return NULL;
    }
    if (status != ND_OK) return raise_status(st, status);
    Py_RETURN_NONE;
#else
    return no_cuda(st);
#endif
}

/* _cuda_graph_capture(op, ordinal, pool=0): "begin" (into pool; 0: a new
 * one), "end" -> the graph's capsule, "abandon", "capturing" -> bool. */
static PyObject *cuda_graph_capture(PyObject *module, PyObject *args) {
    const char *op = NULL;
    int ordinal = 0, pool = 0;
    if (!PyArg_ParseTuple(args, "si|i:_cuda_graph_capture", &op, &ordinal, &pool)) return NULL;
    needle_state *st = state_of_module(module);
#ifdef NEEDLE_WITH_CUDA
    nd_status status;
    if (strcmp(op, "begin") == 0) {
        status = nd_cuda_graph_capture_begin(ordinal, pool);
    } else if (strcmp(op, "end") == 0) {
        nd_cuda_graph *g = NULL;
        status = nd_cuda_graph_capture_end(ordinal, &g);
        if (status == ND_OK) {
            PyObject *capsule = PyCapsule_New(g, GRAPH_CAPSULE, graph_capsule_destructor);
            if (capsule == NULL) nd_cuda_graph_destroy(g);
            return capsule;
        }
    } else if (strcmp(op, "abandon") == 0) {
        nd_cuda_graph_capture_abandon(ordinal);
        Py_RETURN_NONE;
    } else if (strcmp(op, "capturing") == 0) {
        return PyBool_FromLong(nd_cuda_graph_capturing(ordinal));
    } else {
        PyErr_Format(PyExc_ValueError, "_cuda_graph_capture: unknown operation %.40s", op);
        return NULL;
    }
    if (status != ND_OK) return raise_status(st, status);
    Py_RETURN_NONE;
#else
    return no_cuda(st);
#endif
}

/* _cuda_graph_replay(graph): one launch of the graph on the current stream. */
static PyObject *cuda_graph_replay(PyObject *module, PyObject *capsule) {
    needle_state *st = state_of_module(module);
#ifdef NEEDLE_WITH_CUDA
    nd_cuda_graph *g = graph_of(capsule);
    if (g == NULL) return NULL;
    nd_status status = nd_cuda_graph_replay(g);
    if (status != ND_OK) return raise_status(st, status);
    Py_RETURN_NONE;
#else
    (void)capsule;
    return no_cuda(st);
#endif
}

/* _cuda_graph_info(graph) -> (pool, nodes). */
static PyObject *cuda_graph_info(PyObject *module, PyObject *capsule) {
#ifdef NEEDLE_WITH_CUDA
    (void)module;
    nd_cuda_graph *g = graph_of(capsule);
    if (g == NULL) return NULL;
    return Py_BuildValue("(iL)", nd_cuda_graph_pool(g), (long long)nd_cuda_graph_nodes(g));
#else
    (void)capsule;
    return no_cuda(state_of_module(module));
#endif
}

/* _graph_capturing() -> bool: whether any device is capturing a CUDA graph
 * (for Python code that must then update state in place; every build). */
static PyObject *graph_capturing(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyBool_FromLong(nd_memory_capturing());
}

PyMethodDef cuda_graphs_module_functions[] = {
    {"_graph_capturing", graph_capturing, METH_NOARGS,
     "_graph_capturing(): whether a CUDA graph is being captured on any device."},
    {"_cuda_graph_pool", cuda_graph_pool, METH_VARARGS,
     "_cuda_graph_pool(op, ordinal, pool=0): create / retain / release a CUDA graph pool."},
    {"_cuda_graph_capture", cuda_graph_capture, METH_VARARGS,
     "_cuda_graph_capture(op, ordinal, pool=0): begin / end / abandon a capture, or whether "
     "one is under way (capturing)."},
    {"_cuda_graph_replay", cuda_graph_replay, METH_O,
     "_cuda_graph_replay(graph): launches a captured graph on the current stream."},
    {"_cuda_graph_info", cuda_graph_info, METH_O,
     "_cuda_graph_info(graph): (pool, nodes) of a captured graph."},
    {NULL, NULL, 0, NULL},
};
