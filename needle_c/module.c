/* module.c: the needle_c extension module: multi-phase init, the module
 * state (its traverse, clear and free) and the exception types.
 *
 * Everything else lives with its idea: the Device type in device.c, status
 * to exception mapping in errors.c, the engine's collection callback in
 * memory/pressure.c, arrays in array/, autograd in autograd/.
 */
#include "needle_c.h"
#include "autograd/tensor.h"
#include "runtime.h"

#include <structmember.h>

/* ------------------------------------------------------------- module */

extern PyMethodDef cuda_info_module_functions[];    /* cuda_info.c */
extern PyMethodDef cuda_streams_module_functions[]; /* cuda_streams.c */
extern PyMethodDef cuda_graphs_module_functions[];  /* cuda_graphs.c */
extern PyMethodDef cpu_info_module_functions[];     /* cpu_info.c */
extern PyMethodDef config_module_functions[];       /* config_table.c */

static int add_function_table(PyObject *module, PyMethodDef *table) {
    return PyModule_AddFunctions(module, table);
}

static int needle_c_exec(PyObject *module) {
    needle_state *st = state_of_module(module);
    if (ndarray_module_init() < 0) return -1;
    st->ndarray_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &ndarray_type_spec, NULL);
    if (st->ndarray_type == NULL || PyModule_AddType(module, st->ndarray_type) < 0) return -1;
    /* NumPy then hands mixed operations (np.float32(2) + a) back to NDArray's
     * reflected operators instead of converting the NDArray itself. */
    if (PyDict_SetItemString(st->ndarray_type->tp_dict, "__array_ufunc__", Py_None) < 0) return -1;
    PyType_Modified(st->ndarray_type);

    st->device_error = PyErr_NewExceptionWithDoc(
        "needle.DeviceError",
        "Raised when arrays on different devices meet, or a device fails or is unavailable.",
        PyExc_RuntimeError, NULL);
    if (st->device_error == NULL ||
        PyModule_AddObjectRef(module, "DeviceError", st->device_error) < 0)
        return -1;
    st->out_of_memory = PyErr_NewExceptionWithDoc(
        "needle.OutOfMemoryError",
        "A device allocation failed after the cache was released and garbage collected.\n\n"
        "Attributes: device, requested, allocated, reserved (bytes), limit (bytes or None);\n"
        "collected_bytes (what the collections run for the request freed), largest_free_block,\n"
        "fragmentation_bytes (reserved - allocated), inactive_split_bytes; holders (the top\n"
        "rows of needle.memory.holders(device)) and snapshot_path (the memory snapshot written,\n"
        "see needle.memory.set_oom_snapshot), None when there are none.",
        PyExc_MemoryError, NULL);
    if (st->out_of_memory == NULL ||
        PyModule_AddObjectRef(module, "OutOfMemoryError", st->out_of_memory) < 0)
        return -1;

    /* NumPy's AxisError (a ValueError and an IndexError), so that a bad axis
     * is caught by the same except clause in needle as in NumPy. */
    PyObject *exceptions = PyImport_ImportModule("numpy.exceptions");
    if (exceptions == NULL) return -1;
    st->axis_error = PyObject_GetAttrString(exceptions, "AxisError");
    Py_DECREF(exceptions);
    if (st->axis_error == NULL) return -1;

    if (device_module_init(module, st) < 0) return -1;
    if (random_module_init(module, st) < 0) return -1;
    if (device_add_methods(st, ndarray_device_factories) < 0 ||
        device_add_methods(st, random_device_methods) < 0)
        return -1;
    if (course_handle_module_init(module, st) < 0) return -1;

    if (add_function_table(module, blas_module_functions) < 0 ||
        add_function_table(module, cpu_threads_module_functions) < 0 ||
        add_function_table(module, ndarray_module_functions) < 0 ||
        add_function_table(module, memory_module_functions) < 0 ||
        add_function_table(module, pressure_module_functions) < 0 ||
        add_function_table(module, alignment_module_functions) < 0 ||
        add_function_table(module, collection_log_module_functions) < 0 ||
        add_function_table(module, scoped_module_functions) < 0 ||
        add_function_table(module, cuda_info_module_functions) < 0 ||
        add_function_table(module, cuda_streams_module_functions) < 0 ||
        add_function_table(module, cuda_graphs_module_functions) < 0 ||
        add_function_table(module, cpu_info_module_functions) < 0 ||
        add_function_table(module, config_module_functions) < 0 ||
        add_function_table(module, interop_module_functions) < 0 ||
        add_function_table(module, optim_module_functions) < 0 ||
        add_function_table(module, errors_module_functions) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "MAX_DIMS", ND_MAX_DIMS) < 0) return -1;
    if (autograd_module_init(module, st) < 0) return -1;
    if (install_blas() < 0 || cpu_settings_install() < 0 || cpu_threads_check_environment() < 0)
        return -1;
    if (scoped_install(module, st) < 0) return -1;
    /* The engine's callbacks, tp_dealloc and tp_traverse reach this module
     * through the runtime (runtime.h); backward reaches the collection
     * policy's safe point through it, so autograd/ does not call memory/. */
    needle_rt.state = st;
    needle_rt.autograd.safe_point = pressure_safe_point;
    pressure_install();
    return 0;
}

static int needle_c_traverse(PyObject *module, visitproc visit, void *arg) {
    needle_state *st = state_of_module(module);
    Py_VISIT(st->device_type);
    Py_VISIT(st->ndarray_type);
    Py_VISIT(st->array_handle_type);
    Py_VISIT(st->device_error);
    Py_VISIT(st->out_of_memory);
    Py_VISIT(st->oom_explainer);
    Py_VISIT(st->axis_error);
    for (size_t i = 0; i < sizeof st->devices / sizeof st->devices[0]; i++)
        Py_VISIT(st->devices[i]);
    Py_VISIT(st->cuda_placeholder);
    Py_VISIT(st->numpy_random);
    int rc = scoped_traverse(st, visit, arg);
    return rc != 0 ? rc : autograd_traverse(st, visit, arg);
}

static int needle_c_clear(PyObject *module) {
    needle_state *st = state_of_module(module);
    Py_CLEAR(st->device_type);
    Py_CLEAR(st->ndarray_type);
    Py_CLEAR(st->array_handle_type);
    Py_CLEAR(st->device_error);
    Py_CLEAR(st->out_of_memory);
    Py_CLEAR(st->oom_explainer);
    Py_CLEAR(st->axis_error);
    for (size_t i = 0; i < sizeof st->devices / sizeof st->devices[0]; i++)
        Py_CLEAR(st->devices[i]);
    Py_CLEAR(st->cuda_placeholder);
    Py_CLEAR(st->numpy_random);
    if (needle_rt.state == st) needle_rt.state = NULL;
    scoped_forget(st);
    autograd_clear(st);
    return 0;
}

static void needle_c_free(void *module) {
    needle_c_clear((PyObject *)module);
    needle_state *st = state_of_module((PyObject *)module);
    PyMem_Free(st->autograd);
    st->autograd = NULL;
}

static PyModuleDef_Slot needle_c_slots[] = {
    {Py_mod_exec, needle_c_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* needle keeps process-wide state (the engine's devices and caches, the
     * scoped collector's registry, the collection policy), so one process
     * holds one needle: a subinterpreter's import fails with ImportError, as
     * CPython's own single-phase modules do. Python 3.11 has no such slot;
     * there needle's multi-phase init does not refuse a subinterpreter. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#ifdef Py_mod_gil
    /* From 3.13. needle relies on the GIL: its runtime state (the registry's
     * lists, the collection policy, the engine's caches) is unlocked. On a
     * free-threaded build the import then turns the GIL back on (with a
     * RuntimeWarning), and the scoped collection refuses (memory/scoped.c). */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

PyModuleDef needle_c_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "needle_c",
    .m_doc = "needle's C core: devices, arrays and device-memory accounting.",
    .m_size = sizeof(needle_state),
    .m_slots = needle_c_slots,
    .m_traverse = needle_c_traverse,
    .m_clear = needle_c_clear,
    .m_free = needle_c_free,
};

PyMODINIT_FUNC PyInit_needle_c(void) { return PyModuleDef_Init(&needle_c_module); }
