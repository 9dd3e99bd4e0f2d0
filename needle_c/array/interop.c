/* interop.c: zero-copy exchange of arrays with other libraries.
 *
 * Export: NDArray.__dlpack__/__dlpack_device__ (DLPack capsules, consumed by
 * np.from_dlpack, torch.from_dlpack, ...), NDArray.__array_interface__ (CPU)
 * and __cuda_array_interface__ (CUDA), and Tensor.__dlpack__ through its data.
 * Import: needle_c.from_dlpack wraps another library's buffer in an engine
 * storage (nd_storage_wrap) that gives it back through the producer's
 * deleter when the last needle view goes.
 *
 * Streams: needle's CUDA work runs on its current stream (its own
 * non-blocking one unless ndl.cuda.stream chose another; both protocols name
 * the legacy default stream 1). __dlpack__(stream=s) makes the consumer's
 * stream s wait for needle's work on the data (an event,
 * csrc/cuda/cuda_interop.cu), and when the consumer releases the capsule's
 * tensor needle's later work waits for what s had queued, so the block is
 * not reused under the consumer. __cuda_array_interface__ reports needle's
 * current stream for its consumers to order on, and an import asks the
 * producer to order its work before that stream.
 *
 * The DLPack structs are declared here from the ABI (v0.8 for the unversioned
 * capsule, v1.0 for the versioned one) rather than vendoring dlpack.h: the
 * layout is a stable ABI and we need a handful of fields.
 */
#include "ndarray_internal.h"

#include <stdlib.h>
#include <string.h>

#ifdef NEEDLE_WITH_CUDA
#include "cuda/cuda_api.h"
#endif

/* ------------------------------------------------------------ DLPack ABI */

enum { kDLCPU = 1, kDLCUDA = 2 };
enum { kDLFloat = 2, kDLBfloat = 4 };

typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* elements; NULL means row-major contiguous */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* DLPack 1.0: the versioned capsule ("dltensor_versioned"). */
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

static const char CAPSULE_NAME[] = "dltensor";
static const char VERSIONED_CAPSULE_NAME[] = "dltensor_versioned";
static const char USED_CAPSULE_NAME[] = "used_dltensor";
static const char USED_VERSIONED_CAPSULE_NAME[] = "used_dltensor_versioned";

/* ---------------------------------------------------------------- export */

/* One allocation per export: the managed tensor (either flavour) and the
 * shape/strides it points at, plus the storage reference that keeps the
 * memory alive until the consumer calls the deleter, and the consumer's CUDA
 * stream (a protocol value; -1: nothing to order on release). */
typedef struct {
    DLManagedTensor managed;
    DLManagedTensorVersioned versioned;
    nd_storage *storage;
    int64_t shape[ND_MAX_DIMS];
    int64_t strides[ND_MAX_DIMS];
    intptr_t stream;
} export_ctx;

/* The protocols' value for the legacy default stream, what None means. */
#define LEGACY_STREAM ((intptr_t)1)

static void export_ctx_free(export_ctx *ctx) {
    /* Consumers may run deleters on threads that do not hold the GIL (torch
     * frees storages from its own threads), and the engine is serialised by
     * the GIL. After finalisation the engine is gone with the interpreter's
     * state, so a late deleter leaks rather than touch it. */
    if (!Py_IsInitialized()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
#ifdef NEEDLE_WITH_CUDA
    /* Before the block can go back to the cache: needle's later kernels wait
     * for what the consumer queued on its stream (a deleter cannot raise;
     * the engine falls back to waiting for the whole GPU). */
    nd_device *dev = nd_storage_device(ctx->storage);
    if (nd_device_get_kind(dev) == ND_DEVICE_CUDA)
        (void)nd_cuda_release_from_stream(nd_device_ordinal(dev), ctx->stream);
#endif
    nd_storage_release(ctx->storage);
    free(ctx);
    PyGILState_Release(gil);
}

static void export_deleter(DLManagedTensor *self) { export_ctx_free(self->manager_ctx); }
static void export_deleter_versioned(DLManagedTensorVersioned *self) {
    export_ctx_free(self->manager_ctx);
}

/* A capsule nobody consumed still owns its tensor; a consumed one was renamed
 * and its consumer calls the deleter. */
static void capsule_destructor(PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, CAPSULE_NAME)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, CAPSULE_NAME);
        if (m->deleter != NULL) m->deleter(m);
    }
}

static void capsule_destructor_versioned(PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, VERSIONED_CAPSULE_NAME)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, VERSIONED_CAPSULE_NAME);
        if (m->deleter != NULL) m->deleter(m);
    }
}

static DLDevice dl_device_of(const nd_device *dev) {
    DLDevice d;
    if (nd_device_get_kind(dev) == ND_DEVICE_CUDA) {
        d.device_type = kDLCUDA;
        d.device_id = nd_device_ordinal(dev);
    } else {
        d.device_type = kDLCPU;
        d.device_id = 0;
    }
    return d;
}

/* Whether the caller's max_version asks for DLPack >= 1.0. */
static int wants_versioned(PyObject *max_version) {
    if (max_version == Py_None || !PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1)
        return 0;
    long major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
    if (major == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return major >= 1;
}

/* A DLPack (device_type, device_id) pair; TypeError for anything else. */
static int parse_device_pair(PyObject *obj, const char *what, int *type, int *id) {
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 2) {
        PyErr_Format(PyExc_TypeError, "%s must be a (device_type, device_id) tuple, got %.100s",
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyArg_ParseTuple(obj, "ii", type, id)) return 0;
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s holds a device type or id out of range", what);
    }
    return -1;
}

/* The consumer's stream argument of __dlpack__, as the DLPack protocol
 * defines it: None or an int; for CUDA 1 (legacy default stream, also what
 * None means), 2 (per-thread default stream), a cudaStream_t handle (> 2), or
 * -1 (no synchronisation); 0 is ambiguous and forbidden. Devices without
 * streams (the CPU) accept only None. TypeError for a non-int, ValueError for
 * an int no device accepts, BufferError for a stream on the CPU. */
static int parse_stream(PyObject *stream, const nd_device *dev, intptr_t *out) {
    *out = LEGACY_STREAM;
    if (stream == Py_None) return 0;
    if (!PyLong_Check(stream) || PyBool_Check(stream)) {
        PyErr_Format(PyExc_TypeError, "__dlpack__'s stream must be None or an int, got %.100s",
                     Py_TYPE(stream)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(stream, &overflow);
    if (value == -1 && PyErr_Occurred()) return -1;
    if (overflow != 0 || value == 0 || value < -1 ||
        (value > 0 && (unsigned long long)value > (unsigned long long)INTPTR_MAX)) {
        PyErr_Format(PyExc_ValueError,
                     "__dlpack__'s stream must be -1 (no synchronisation), 1 (legacy default "
                     "stream), 2 (per-thread default stream) or a CUDA stream handle, got %R",
                     stream);
        return -1;
    }
    if (nd_device_get_kind(dev) != ND_DEVICE_CUDA) {
        PyErr_Format(PyExc_BufferError,
                     "__dlpack__: arrays on %s have no stream; stream must be None, got %R",
                     nd_device_name(dev), stream);
        return -1;
    }
    *out = (intptr_t)value;
    return 0;
}

PyObject *interop_ndarray_dlpack(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &stream,
                                     &max_version, &dl_device, &copy))
        return NULL;
    intptr_t consumer_stream;
    if (parse_stream(stream, nd_storage_device(NDArray_CAST(op)->array.storage), &consumer_stream) <
        0)
        return NULL;
    if (max_version != Py_None && !PyTuple_Check(max_version)) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__'s max_version must be a (major, minor) tuple, got %.100s",
                     Py_TYPE(max_version)->tp_name);
        return NULL;
    }
    NDArrayObject *self = NDArray_CAST(op);
    needle_state *st = ndarray_state(op);
    DLDevice device = dl_device_of(nd_storage_device(self->array.storage));
    if (dl_device != Py_None) {
        int type, id;
        if (parse_device_pair(dl_device, "__dlpack__'s dl_device", &type, &id) < 0) return NULL;
        if (type != device.device_type || id != device.device_id) {
            PyErr_Format(PyExc_BufferError,
                         "__dlpack__: cannot export to device (%d, %d) from (%d, %d)", type, id,
                         device.device_type, device.device_id);
            return NULL;
        }
    }
    int do_copy = copy == Py_None ? 0 : PyObject_IsTrue(copy);
    if (do_copy < 0) return NULL;

    /* copy=True exports a fresh compact copy; otherwise the view itself. */
    nd_array source;
    if (do_copy) {
        nd_status status = nd_array_compact_copy(&self->array, NULL, &source);
        if (status != ND_OK) return raise_status(st, status);
    } else {
        source = self->array;
        nd_storage_retain(source.storage);
    }
    export_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        nd_array_release(&source);
        return PyErr_NoMemory();
    }
    ctx->storage = source.storage; /* takes over source's reference */
    ctx->stream = consumer_stream;
#ifdef NEEDLE_WITH_CUDA
    /* The consumer's stream waits for needle's work on the data (and the copy). */
    nd_device *source_dev = nd_storage_device(source.storage);
    if (nd_device_get_kind(source_dev) == ND_DEVICE_CUDA) {
        nd_status status = nd_cuda_export_to_stream(nd_device_ordinal(source_dev), consumer_stream);
        if (status != ND_OK) {
            nd_storage_release(ctx->storage);
            free(ctx);
            return raise_status(st, status);
        }
    }
#endif
    const nd_layout *l = &source.layout;
    nd_dtype dtype = nd_array_dtype(&source);
    int64_t itemsize = nd_dtype_size(dtype);
    memcpy(ctx->shape, l->shape, sizeof(int64_t) * (size_t)l->ndim);
    memcpy(ctx->strides, l->strides, sizeof(int64_t) * (size_t)l->ndim);
    /* data points at the first element, byte_offset 0: consumers then never
     * need a negative byte_offset for views with negative strides, and some
     * ignore byte_offset altogether. */
    DLTensor t = {
        .data = (char *)nd_storage_buffer(source.storage).data + l->offset * itemsize,
        .device = device,
        .ndim = l->ndim,
        .dtype = {dtype == ND_BFLOAT16 ? kDLBfloat : kDLFloat, (uint8_t)(itemsize * 8), 1},
        .shape = ctx->shape,
        .strides = ctx->strides,
        .byte_offset = 0,
    };
    PyObject *capsule;
    if (wants_versioned(max_version)) {
        ctx->versioned.version = (DLPackVersion){1, 0};
        ctx->versioned.manager_ctx = ctx;
        ctx->versioned.deleter = export_deleter_versioned;
        ctx->versioned.flags = 0;
        ctx->versioned.dl_tensor = t;
        capsule =
            PyCapsule_New(&ctx->versioned, VERSIONED_CAPSULE_NAME, capsule_destructor_versioned);
    } else {
        ctx->managed.dl_tensor = t;
        ctx->managed.manager_ctx = ctx;
        ctx->managed.deleter = export_deleter;
        capsule = PyCapsule_New(&ctx->managed, CAPSULE_NAME, capsule_destructor);
    }
    if (capsule == NULL) {
        nd_storage_release(ctx->storage);
        free(ctx);
    }
    return capsule;
}

PyObject *interop_ndarray_dlpack_device(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    DLDevice d = dl_device_of(nd_storage_device(NDArray_CAST(op)->array.storage));
    return Py_BuildValue("(ii)", d.device_type, d.device_id);
}

/* The dict of the (CUDA) array interface v3. NumPy and CuPy keep a reference
 * to the object that provided it, which keeps the storage alive. */
static PyObject *array_interface(NDArrayObject *self, int cuda) {
    const nd_layout *l = &self->array.layout;
    nd_dtype dtype = nd_array_dtype(&self->array);
    int64_t itemsize = nd_dtype_size(dtype);
    /* The interfaces' type strings are NumPy's, which has no bfloat16. */
    static const char *const typestr[ND_DTYPE_COUNT] = {
        [ND_FLOAT32] = "<f4", [ND_FLOAT16] = "<f2", [ND_FLOAT64] = "<f8"};
    if (typestr[dtype] == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "the array interfaces have no type for %s (NumPy has none): use DLPack",
                     nd_dtype_name(dtype));
        return NULL;
    }
    PyObject *shape = PyTuple_New(l->ndim);
    if (shape == NULL) return NULL;
    for (int i = 0; i < l->ndim; i++) PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(l->shape[i]));
    PyObject *strides;
    if (nd_layout_is_contiguous(l)) {
        strides = Py_NewRef(Py_None);
    } else {
        strides = PyTuple_New(l->ndim);
        if (strides == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        for (int i = 0; i < l->ndim; i++)
            PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(l->strides[i] * itemsize));
    }
    /* PyTuple_SET_ITEM above may have stored NULL on a failed allocation. */
    if (PyErr_Occurred()) {
        Py_DECREF(shape);
        Py_DECREF(strides);
        return NULL;
    }
    PyObject *ptr = PyLong_FromVoidPtr((char *)nd_storage_buffer(self->array.storage).data +
                                       l->offset * itemsize);
    if (ptr == NULL) {
        Py_DECREF(shape);
        Py_DECREF(strides);
        return NULL;
    }
    PyObject *dict =
        Py_BuildValue("{s:N,s:s,s:(NO),s:N,s:i}", "shape", shape, "typestr", typestr[dtype], "data",
                      ptr, Py_False, "strides", strides, "version", 3);
    /* CUDA Array Interface v3: the stream the consumer must order its work
     * after: needle's current stream on the array's GPU (a cudaStream_t). */
#ifdef NEEDLE_WITH_CUDA
    if (dict != NULL && cuda) {
        nd_device *dev = nd_storage_device(self->array.storage);
        intptr_t handle = 0;
        nd_status status = nd_cuda_stream_current(nd_device_ordinal(dev), &handle);
        if (status != ND_OK) {
            Py_DECREF(dict);
            return raise_status(ndarray_state((PyObject *)self), status);
        }
        PyObject *stream = PyLong_FromVoidPtr((void *)handle);
        if (stream == NULL || PyDict_SetItemString(dict, "stream", stream) < 0) Py_CLEAR(dict);
        Py_XDECREF(stream);
    }
#else
    (void)cuda; /* no CUDA arrays without the backend */
#endif
    return dict;
}

PyObject *interop_ndarray_array_interface(PyObject *op, void *Py_UNUSED(closure)) {
    NDArrayObject *self = NDArray_CAST(op);
    /* AttributeError, not another error, so NumPy falls back to __array__
     * (a copy through the host) for device arrays. */
    if (nd_device_get_kind(nd_storage_device(self->array.storage)) != ND_DEVICE_CPU) {
        PyErr_SetString(PyExc_AttributeError,
                        "__array_interface__ is only defined for arrays on the CPU");
        return NULL;
    }
    return array_interface(self, 0);
}

PyObject *interop_ndarray_cuda_array_interface(PyObject *op, void *Py_UNUSED(closure)) {
    NDArrayObject *self = NDArray_CAST(op);
    if (nd_device_get_kind(nd_storage_device(self->array.storage)) != ND_DEVICE_CUDA) {
        PyErr_SetString(PyExc_AttributeError,
                        "__cuda_array_interface__ is only defined for CUDA arrays");
        return NULL;
    }
    return array_interface(self, 1);
}

/* Tensor: the protocol applies to its (realized) data. */
PyObject *interop_tensor_dlpack(PyObject *op, PyObject *args, PyObject *kwargs) {
    PyObject *data = PyObject_CallMethod(op, "realize_cached_data", NULL);
    if (data == NULL) return NULL;
    PyObject *method = PyObject_GetAttrString(data, "__dlpack__");
    Py_DECREF(data);
    if (method == NULL) return NULL;
    PyObject *result = PyObject_Call(method, args, kwargs);
    Py_DECREF(method);
    return result;
}

PyObject *interop_tensor_dlpack_device(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    PyObject *data = PyObject_CallMethod(op, "realize_cached_data", NULL);
    if (data == NULL) return NULL;
    PyObject *result = PyObject_CallMethod(data, "__dlpack_device__", NULL);
    Py_DECREF(data);
    return result;
}

/* ---------------------------------------------------------------- import */

/* What a wrapped storage gives back when its last view goes: the producer's
 * managed tensor, through its deleter. The engine releases storages under
 * the GIL, which producers' deleters (NumPy's Py_DECREF) need. */
typedef struct {
    void *managed;
    int versioned;
} import_ctx;

static void import_release(void *p) {
    import_ctx *ctx = p;
    if (ctx->versioned) {
        DLManagedTensorVersioned *m = ctx->managed;
        if (m->deleter != NULL) m->deleter(m);
    } else {
        DLManagedTensor *m = ctx->managed;
        if (m->deleter != NULL) m->deleter(m);
    }
    free(ctx);
}

static const char *dl_type_name(uint8_t code) {
    switch (code) {
    case 0: return "int";
    case 1: return "uint";
    case 2: return "float";
    case 3: return "opaque";
    case 4: return "bfloat";
    case 5: return "complex";
    case 6: return "bool";
    default: return "code";
    }
}

static nd_device *device_for(needle_state *st, DLDevice d) {
    if (d.device_type == kDLCPU) return nd_device_at(0);
    if (d.device_type == kDLCUDA) {
        for (int id = 0; id < nd_device_count(); id++) {
            nd_device *dev = nd_device_at(id);
            if (nd_device_get_kind(dev) == ND_DEVICE_CUDA &&
                nd_device_ordinal(dev) == d.device_id && nd_device_available(dev))
                return dev;
        }
        PyErr_Format(st->device_error,
                     "from_dlpack: the data is on cuda:%d, which needle cannot use here",
                     (int)d.device_id);
        return NULL;
    }
    PyErr_Format(st->device_error,
                 "from_dlpack: DLPack device type %d is not supported (only CPU and CUDA)",
                 (int)d.device_type);
    return NULL;
}

/* Checks the tensor and computes the layout of a view over it; *base and
 * *numel describe the memory the view spans (what the storage wraps). */
/* The dtype of a DLPack type: 0, or -1 with TypeError for one needle lacks. */
static int import_dtype(DLDataType type, nd_dtype *out) {
    int ok = type.lanes == 1;
    if (ok && type.code == kDLFloat && type.bits == 32) *out = ND_FLOAT32;
    else if (ok && type.code == kDLFloat && type.bits == 16) *out = ND_FLOAT16;
    else if (ok && type.code == kDLFloat && type.bits == 64) *out = ND_FLOAT64;
    else if (ok && type.code == kDLBfloat && type.bits == 16) *out = ND_BFLOAT16;
    else ok = 0;
    if (ok) return 0;
    if (type.lanes != 1)
        PyErr_Format(PyExc_TypeError,
                     "from_dlpack: needle arrays hold float32, float16, bfloat16 or float64, got "
                     "%s%d x%d",
                     dl_type_name(type.code), (int)type.bits, (int)type.lanes);
    else
        PyErr_Format(PyExc_TypeError,
                     "from_dlpack: needle arrays hold float32, float16, bfloat16 or float64, got "
                     "%s%d",
                     dl_type_name(type.code), (int)type.bits);
    return -1;
}

static int import_layout(needle_state *st, const DLTensor *t, nd_layout *layout, void **base,
                         int64_t *numel, nd_dtype *dtype) {
    if (import_dtype(t->dtype, dtype) < 0) return -1;
    int64_t itemsize = nd_dtype_size(*dtype);
    if (t->ndim < 0 || t->ndim > ND_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "from_dlpack: arrays have at most %d dimensions, got %d",
                     ND_MAX_DIMS, (int)t->ndim);
        return -1;
    }
    if (t->byte_offset % (uint64_t)itemsize != 0) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: byte_offset is not a multiple of the element size %d",
                     (int)itemsize);
        return -1;
    }
    memset(layout, 0, sizeof *layout);
    layout->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0) {
            PyErr_SetString(PyExc_BufferError, "from_dlpack: negative dimension");
            return -1;
        }
        layout->shape[i] = t->shape[i];
    }
    if (t->strides == NULL || t->ndim == 0) {
        nd_layout contiguous;
        nd_status status = nd_layout_contiguous(t->ndim, layout->shape, &contiguous);
        if (status != ND_OK) {
            raise_status(st, status);
            return -1;
        }
        *layout = contiguous;
    } else {
        for (int i = 0; i < t->ndim; i++) layout->strides[i] = t->strides[i];
    }
    /* The view's lowest element may lie before the first one (negative
     * strides): the storage starts there and the offset points back. */
    int64_t lo, hi;
    layout->offset = 0;
    nd_layout_extent(layout, &lo, &hi);
    char *first = (char *)t->data + t->byte_offset;
    *base = first + lo * itemsize;
    *numel = hi - lo;
    layout->offset = -lo;
    if (hi == lo) { /* empty: nothing to address */
        *base = first;
        *numel = 0;
        layout->offset = 0;
    }
    return 0;
}

/* Takes over a consumed capsule's managed tensor (managed, versioned) and
 * wraps it; the tensor's deleter runs exactly once, here on failure or when
 * the last view of the new storage goes. */
static PyObject *wrap_managed(needle_state *st, void *managed, int versioned, nd_device *target) {
    const DLTensor *t = versioned ? &((DLManagedTensorVersioned *)managed)->dl_tensor
                                  : &((DLManagedTensor *)managed)->dl_tensor;
    import_ctx *ctx = malloc(sizeof *ctx);
    if (ctx == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    ctx->managed = managed;
    ctx->versioned = versioned;
    if (versioned) {
        DLManagedTensorVersioned *v = managed;
        if (v->version.major != 1) {
            PyErr_Format(PyExc_BufferError, "from_dlpack: unsupported DLPack version %u.%u",
                         (unsigned)v->version.major, (unsigned)v->version.minor);
            goto fail;
        }
        /* Needle arrays are always writable; sharing read-only memory would
         * let needle write into it. */
        if (v->flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
            PyErr_SetString(
                PyExc_BufferError,
                "from_dlpack: the data is read-only and needle arrays are writable; copy it first");
            goto fail;
        }
    }
    nd_device *dev = device_for(st, t->device);
    if (dev == NULL) goto fail;
    nd_layout layout;
    void *base;
    int64_t numel;
    nd_dtype dtype;
    if (import_layout(st, t, &layout, &base, &numel, &dtype) < 0) goto fail;
    nd_storage *storage;
    nd_status status = nd_storage_wrap(dev, base, numel, dtype, import_release, ctx, &storage);
    if (status != ND_OK) {
        raise_status(st, status);
        goto fail;
    }
    /* From here the storage owns ctx (and so the managed tensor). */
    nd_array arr = {storage, layout};
    if (target != NULL && target != dev) {
        nd_array moved;
        status = nd_array_compact_copy(&arr, target, &moved);
        nd_array_release(&arr);
        if (status != ND_OK) return raise_status(st, status);
        return ndarray_wrap(st, &moved);
    }
    return ndarray_wrap(st, &arr);

fail:
    free(ctx);
    if (versioned) {
        DLManagedTensorVersioned *m = managed;
        if (m->deleter != NULL) m->deleter(m);
    } else {
        DLManagedTensor *m = managed;
        if (m->deleter != NULL) m->deleter(m);
    }
    return NULL;
}

/* Consumes a capsule: renames it so its destructor leaves the tensor alone. */
static PyObject *from_capsule(needle_state *st, PyObject *capsule, nd_device *target) {
    int versioned;
    if (PyCapsule_IsValid(capsule, CAPSULE_NAME)) {
        versioned = 0;
    } else if (PyCapsule_IsValid(capsule, VERSIONED_CAPSULE_NAME)) {
        versioned = 1;
    } else {
        const char *name = PyCapsule_GetName(capsule);
        PyErr_Clear();
        PyErr_Format(
            PyExc_ValueError,
            "from_dlpack: expected a 'dltensor' capsule, got one named '%s' (already consumed?)",
            name ? name : "(null)");
        return NULL;
    }
    const char *name = versioned ? VERSIONED_CAPSULE_NAME : CAPSULE_NAME;
    void *managed = PyCapsule_GetPointer(capsule, name);
    if (managed == NULL) return NULL;
    if (PyCapsule_SetName(capsule, versioned ? USED_VERSIONED_CAPSULE_NAME : USED_CAPSULE_NAME) < 0)
        return NULL;
    return wrap_managed(st, managed, versioned, target);
}

/* Asks a producer for a capsule: DLPack 1.0 keywords first, then the bare
 * call that producers older than the 2023 array API accept. */
static PyObject *request_capsule(needle_state *st, PyObject *obj) {
    PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (dev == NULL) return NULL;
    int type = 0, id = 0;
    int rc = parse_device_pair(dev, "__dlpack_device__()", &type, &id);
    Py_DECREF(dev);
    if (rc < 0) return NULL;
    /* A device needle cannot use is refused before the producer is asked for a capsule
     * (with a CUDA stream it may not understand). */
    if (device_for(st, (DLDevice){.device_type = type, .device_id = id}) == NULL) return NULL;
    PyObject *method = PyObject_GetAttrString(obj, "__dlpack__");
    if (method == NULL) return NULL;
    /* On CUDA, the producer orders its pending work before needle's current
     * stream on that GPU, where the engine's kernels will read the data. */
    PyObject *stream = Py_NewRef(Py_None);
#ifdef NEEDLE_WITH_CUDA
    if (type == kDLCUDA) {
        intptr_t handle = 0;
        nd_status status = nd_cuda_stream_current(id, &handle);
        Py_DECREF(stream);
        if (status != ND_OK) {
            Py_DECREF(method);
            return raise_status(st, status);
        }
        stream = PyLong_FromVoidPtr((void *)handle);
        if (stream == NULL) {
            Py_DECREF(method);
            return NULL;
        }
    }
#endif
    PyObject *kwargs = Py_BuildValue("{s:(ii)}", "max_version", 1, 0);
    PyObject *capsule = NULL;
    if (kwargs != NULL) {
        if (PyDict_SetItemString(kwargs, "stream", stream) == 0) {
            PyObject *empty = PyTuple_New(0);
            if (empty != NULL) {
                capsule = PyObject_Call(method, empty, kwargs);
                if (capsule == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    PyDict_DelItemString(kwargs, "max_version");
                    capsule = PyObject_Call(method, empty, kwargs);
                }
                Py_DECREF(empty);
            }
        }
        Py_DECREF(kwargs);
    }
    Py_DECREF(stream);
    Py_DECREF(method);
    return capsule;
}

static PyObject *module_from_dlpack(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"obj", "device", NULL};
    PyObject *obj, *device = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:from_dlpack", kwlist, &obj, &device))
        return NULL;
    needle_state *st = state_of_module(module);
    nd_device *target = NULL;
    if (device != Py_None && (target = device_from_object(st, device)) == NULL) return NULL;
    if (PyCapsule_CheckExact(obj)) return from_capsule(st, obj, target);
    if (!PyObject_HasAttrString(obj, "__dlpack__")) {
        PyErr_Format(PyExc_TypeError, "from_dlpack: %.100s does not support DLPack (no __dlpack__)",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyObject *capsule = request_capsule(st, obj);
    if (capsule == NULL) return NULL;
    PyObject *result = from_capsule(st, capsule, target);
    Py_DECREF(capsule);
    return result;
}

PyMethodDef interop_module_functions[] = {
    {"from_dlpack", (PyCFunction)(void (*)(void))module_from_dlpack, METH_VARARGS | METH_KEYWORDS,
     "from_dlpack(obj, device=None)\n--\n\nAn NDArray sharing the memory of obj (anything with "
     "__dlpack__, e.g. NumPy arrays and torch tensors, or a 'dltensor' capsule) of float32, "
     "float16, bfloat16 or float64. "
     "With a device other than obj's, a copy there."},
    {NULL, NULL, 0, NULL},
};
