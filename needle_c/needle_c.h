/* needle_c.h: what the files of the needle_c extension share: the module
 * state, the object layouts, and the helpers that turn engine statuses into
 * Python exceptions.
 *
 * needle_c is the only layer that talks to both Python and the engine.
 */
#ifndef NEEDLE_C_H
#define NEEDLE_C_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "engine.h"

#if PY_VERSION_HEX < 0x030B0000
#error "needle_c needs Python 3.11 or newer (PyType_GetModuleByDef)"
#endif

typedef struct {
    PyTypeObject *device_type;
    PyTypeObject *ndarray_type;
    PyTypeObject *array_handle_type; /* array/course_handle.c: NDArray._handle */
    PyObject *device_error;          /* needle.DeviceError (RuntimeError) */
    PyObject *out_of_memory;         /* needle.OutOfMemoryError (MemoryError) */
    PyObject *oom_explainer;         /* errors.c: fn(err) before an OOM is raised, or NULL */
    PyObject *axis_error;            /* numpy.exceptions.AxisError, for bad axes (array/parse.c) */
    /* Device objects by engine id, and placeholders for CUDA devices the
     * engine does not have (enabled() is False). */
    PyObject *devices[ND_MAX_DEVICES];
    PyObject *cuda_placeholder;
    int cpu_numpy_id;                /* the engine id of the binding's cpu_numpy device */
    PyObject *numpy_random;          /* numpy.random, for Device.rand/randn/randb */
    int rng_mode;                    /* random.c: where Device.rand/randn/randb draw */
    int numpy_dtypes;                /* NEEDLE_BACKEND=np: tensor_default_dtype keeps NumPy's */
    struct autograd_state *autograd; /* tensor.h: Tensor/Op types, graph mode */
    /* memory/scoped.c: the (phase, info) observers called around each scoped
     * collection (a list), and gc.get_freeze_count, read as each one begins. */
    PyObject *scoped_observers;
    PyObject *gc_get_freeze_count;
} needle_state;

typedef struct {
    PyObject_HEAD int engine_id; /* -1: a device this process cannot use */
    int ordinal;
    char name[32];
} DeviceObject;

typedef struct {
    PyObject_HEAD nd_array array; /* owns one reference on its storage */
    PyObject *weakreflist;
} NDArrayObject;

#define Device_CAST(op) ((DeviceObject *)(op))
#define NDArray_CAST(op) ((NDArrayObject *)(op))

extern PyModuleDef needle_c_module; /* module.c */

/* The state of a needle_c module; inline here (not in module.c, which
 * initialises every part) so that the parts depend on this header alone. */
static inline needle_state *state_of_module(PyObject *module) {
    return (needle_state *)PyModule_GetState(module);
}
/* The state reached from any of our objects' types (NULL + exception if
 * the type is not ours). */
static inline needle_state *state_of_type(PyTypeObject *type) {
    PyObject *module = PyType_GetModuleByDef(type, &needle_c_module);
    return module ? state_of_module(module) : NULL;
}

/* Raises the exception that matches status, with the engine's message
 * (errors.c; ND_ERR_OOM raises needle.OutOfMemoryError with its figures,
 * first handed to the explainer needle.memory registers). */
PyObject *raise_status(needle_state *st, nd_status status);
extern PyMethodDef errors_module_functions[]; /* _set_oom_explainer */

/* Devices (device.c). */
/* The Device object of an engine device (borrowed; NULL for none): inline,
 * a lookup in the module state, so that errors.c need not call device.c. */
static inline PyObject *device_object(needle_state *st, const nd_device *dev) {
    int id = nd_device_id(dev);
    return id >= 0 && id < ND_MAX_DEVICES ? st->devices[id] : NULL;
}
/* Resolves None (cpu), a Device, or a name like "cpu", "cuda:0". */
nd_device *device_from_object(needle_state *st, PyObject *obj);
/* The device an engine id (a Python int) names, or NULL with ValueError set
 * (device.c; the memory, history and pressure functions take ids). */
nd_device *device_of_engine_id(PyObject *arg);
/* Module init: the Device type, one Device per engine device, the device
 * functions (cpu, cpu_numpy, cuda, _device) and MAX_DEVICES. */
int device_module_init(PyObject *module, needle_state *st);
/* Adds methods to the Device type (device.c): the layers above devices give
 * it their array factories (module.c), so devices depend on no array code.
 * methods must outlive the type. 0, or -1. */
int device_add_methods(needle_state *st, PyMethodDef *methods);
/* The factories Device carries: empty, full, one_hot (array/factories.c);
 * rand, randn, randb (random.c). */
extern PyMethodDef ndarray_device_factories[];
extern PyMethodDef random_device_methods[];
/* A factory's dtype argument (parse.h's parse_dtype_param; NULL or None:
 * float32): 0, or -1 with TypeError (array/factories.c). */
int factory_dtype(PyObject *dtype, nd_dtype *out);
/* 0 when a full() of value stores value in dtype; -1 with ValueError (naming
 * fill_value) when a finite value would become an infinity there. */
int check_fill_value(double value, nd_dtype dtype);
/* A factory's shape from its varargs: f(2, 3) or f((2, 3)); a new tuple. */
PyObject *shape_from_args(PyObject *args);

/* Random arrays (random.c): Device.rand/randn/randb from NumPy's global RNG
 * or the engine's generator, as the RNG mode says; module init reads
 * NEEDLE_RNG (a bad value fails the import) and adds the mode functions. */
PyObject *device_rand(PyObject *op, PyObject *args, PyObject *kwargs);
PyObject *device_randn(PyObject *op, PyObject *args, PyObject *kwargs);
PyObject *device_randb(PyObject *op, PyObject *args, PyObject *kwargs);
int random_module_init(PyObject *module, needle_state *st);

/* Why needle cannot use CUDA ("" when a GPU was registered): device
 * discovery's CUDA error with the driver's and runtime's versions, or that
 * CUDA was not built (cuda_info.c). */
const char *cuda_unavailable_reason(void);

/* NDArray helpers (ndarray.c). */
int ndarray_check(needle_state *st, PyObject *obj);
/* Wraps arr in a new NDArray, taking over its storage reference. */
PyObject *ndarray_wrap(needle_state *st, nd_array *arr);
/* A new NDArray on dev from any array-like (NumPy array, list, scalar) of
 * *dtype; dtype NULL: an NDArray's own dtype, float32 for anything else. */
PyObject *ndarray_from_object(needle_state *st, PyObject *obj, nd_device *dev,
                              const nd_dtype *dtype);
/* Writes obj's values (any array-like of out's shape) into out, a new
 * contiguous NDArray of a dtype NumPy holds (not bfloat16), converting them
 * as NumPy casts. 0, or -1 with an exception (ValueError: another shape). */
int ndarray_write_object(needle_state *st, PyObject *out, PyObject *obj);
/* The dtype a Tensor made from obj without a dtype gets: a NumPy array's or
 * NumPy scalar's own when it is float16, float32 or float64 (as PyTorch's
 * torch.tensor and the course's NumPy-backed hw1 Tensor keep it); float32
 * for anything else (Python numbers and lists, integer data), or, under
 * NEEDLE_BACKEND=np (st->numpy_dtypes), float64 for them, the dtype the
 * course's NumPy backend gives them (integers included: needle has no
 * integer dtype). */
nd_dtype tensor_default_dtype(const needle_state *st, PyObject *obj);
/* array (an NDArray, reference stolen) converted to dtype on its device:
 * array itself when it has that dtype already. NULL on failure. */
PyObject *ndarray_steal_as(needle_state *st, PyObject *array, nd_dtype dtype);
/* obj's items as a new tuple (TypeError with message when obj is no
 * sequence). A tuple, not PySequence_Fast's list: an item's __index__ or a
 * collection's callback could change a list while its items are read. */
PyObject *sequence_tuple(PyObject *obj, const char *message);
/* A new array of dtype and shape shape_obj on dev (ndarray_ops.c):
 * uninitialised when fill is NULL, else filled with *fill. */
PyObject *ndarray_new_on(needle_state *st, nd_device *dev, PyObject *shape_obj, const double *fill,
                         nd_dtype dtype);
extern PyType_Spec ndarray_type_spec;
/* The course's raw handles (array/course_handle.c): the ArrayHandle type,
 * NDArray._handle, Device.__tile_size__ and Device.matmul_tiled. */
int course_handle_module_init(PyObject *module, needle_state *st);
int ndarray_module_init(void); /* NumPy C API import */

/* Module-level functions defined in other files. */
extern PyMethodDef ndarray_module_functions[];
extern PyMethodDef memory_module_functions[];

/* Zero-copy interop (interop.c): DLPack and the array interfaces, entries
 * of NDArray's and Tensor's tables and of the module (from_dlpack). */
PyObject *interop_ndarray_dlpack(PyObject *op, PyObject *args, PyObject *kwargs);
PyObject *interop_ndarray_dlpack_device(PyObject *op, PyObject *ignored);
PyObject *interop_ndarray_array_interface(PyObject *op, void *closure);
PyObject *interop_ndarray_cuda_array_interface(PyObject *op, void *closure);
PyObject *interop_tensor_dlpack(PyObject *op, PyObject *args, PyObject *kwargs);
PyObject *interop_tensor_dlpack_device(PyObject *op, PyObject *ignored);
extern PyMethodDef interop_module_functions[];

/* The collection runner (memory/pressure.c; the policy is csrc/gc_pacer.h),
 * the aligned collections (memory/alignment.c) and the record of every
 * collection (memory/collection_log.c). */
extern PyMethodDef pressure_module_functions[];
extern PyMethodDef alignment_module_functions[];
extern PyMethodDef collection_log_module_functions[];
void pressure_install(void);
void pressure_refresh(nd_device *dev);
/* A point where a training step's old graph has just become garbage
 * (reset_grad, backward): collects if allocations are past the trigger. */
void pressure_safe_point(void);

/* The scoped collection (memory/scoped.c): Python's cycle algorithm over
 * needle's registered objects only. scoped_collect returns how many objects
 * it freed, or -1 when it did not run (refused says why). */
typedef enum scoped_refusal {
    SCOPED_RAN = 0,
    SCOPED_UNSUPPORTED = 1, /* free-threaded build, or the module is gone */
    SCOPED_BUSY = 2,        /* inside Python's collection or another scoped one */
    SCOPED_NO_MEMORY = 3    /* the mark stack could not grow, or the freeze count could not be
                               read: nothing freed */
} scoped_refusal;
typedef struct scoped_result {
    Py_ssize_t collected, examined;
    double seconds;
    scoped_refusal refused;
} scoped_result;
typedef struct scoped_totals {
    int64_t collections, examined, collected;
    double seconds;
} scoped_totals;
Py_ssize_t scoped_collect(scoped_result *r);
int scoped_supported(void);
int scoped_busy(void);
const scoped_totals *scoped_get_totals(void);
/* The module's part: the gc.callbacks observer, the module state's observers
 * list and gc.get_freeze_count (traversed and cleared by the module). */
int scoped_install(PyObject *module, needle_state *st);
int scoped_traverse(needle_state *st, visitproc visit, void *arg);
void scoped_forget(needle_state *st);
extern PyMethodDef scoped_module_functions[];

/* BLAS discovery (blas.c): installs NumPy's OpenBLAS sgemm in the engine (what was found:
 * runtime.h's needle_rt.blas); -1 with a ValueError set when NEEDLE_BLAS is malformed. */
int install_blas(void);
extern PyMethodDef blas_module_functions[]; /* _blas() */
/* _num_threads(), _set_num_threads(n) (cpu_threads.c); cpu_threads_check_environment()
 * refuses a malformed NEEDLE_NUM_THREADS at import (-1, ValueError set). */
extern PyMethodDef cpu_threads_module_functions[];
int cpu_threads_check_environment(void);

/* The CPU kernels' settings (cpu_info.c): NEEDLE_CPU_ISA, NEEDLE_GEMM_SPLIT. */
int cpu_settings_install(void);

/* adam_update(), sgd_update(): the fused optimizer updates, and amp_unscale_(),
 * GradScaler's unscale (optim.c). */
extern PyMethodDef optim_module_functions[];

#endif /* NEEDLE_C_H */
