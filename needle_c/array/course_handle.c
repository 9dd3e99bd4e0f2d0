/* course_handle.c: the course's raw storage handles, for hw3 code that pokes
 * below NDArray: `a._handle` (the storage an array views, with `.ptr()` and
 * `.size`), `NDArray.make(shape, strides, device, handle, offset)` (a new
 * array, or a view of a handle's storage), the devices' `__tile_size__`, and
 * `device.matmul_tiled(a, b, out, m, n, p)` over handles holding tiled
 * matrices.
 *
 * The course's backend module is a set of kernels over flat buffers; needle's
 * engine works on views, so `matmul_tiled` reads its operands through tiled
 * views of the storages (a (m/T, n/T, T, T) tiling is the (m/T, T, n/T, T)
 * strided view of the (m, n) matrix) and runs the one matmul path every
 * product takes. A handle holds its storage (one engine reference), not the
 * NDArray, so it is no container and cannot be part of a cycle.
 */
#include "ndarray_internal.h"

/* The tile of the course's CPU backend (ndarray_backend_cpu.cc's TILE). */
#define COURSE_TILE 8
/* Larger sizes than any storage holds, refused before the views' strides
 * (size * COURSE_TILE) could overflow. */
#define MAX_TILED_DIM ((long long)1 << 40)

typedef struct {
    PyObject_HEAD nd_storage *storage; /* one reference */
} ArrayHandleObject;

static void handle_dealloc(PyObject *op) {
    PyTypeObject *type = Py_TYPE(op);
    ArrayHandleObject *self = (ArrayHandleObject *)op;
    if (self->storage != NULL) nd_storage_release(self->storage);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyObject *handle_ptr(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromVoidPtr(nd_storage_buffer(((ArrayHandleObject *)op)->storage).data);
}

static PyObject *handle_get_size(PyObject *op, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(nd_storage_numel(((ArrayHandleObject *)op)->storage));
}

static PyObject *handle_repr(PyObject *op) {
    nd_storage *s = ((ArrayHandleObject *)op)->storage;
    return PyUnicode_FromFormat("<needle_c.ArrayHandle of %lld %s on %s>",
                                (long long)nd_storage_numel(s), nd_dtype_name(nd_storage_dtype(s)),
                                nd_device_name(nd_storage_device(s)));
}

static PyMethodDef handle_methods[] = {
    {"ptr", handle_ptr, METH_NOARGS,
     "ptr($self, /)\n--\n\nThe address of the storage's first element (a device address on a "
     "GPU); equal for every view of one storage."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef handle_getset[] = {
    {"size", handle_get_size, NULL, "Elements in the storage.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot handle_type_slots[] = {
    {Py_tp_doc, "The storage an NDArray views (the course's `_handle`): ptr() and size."},
    {Py_tp_dealloc, handle_dealloc},
    {Py_tp_repr, handle_repr},
    {Py_tp_methods, handle_methods},
    {Py_tp_getset, handle_getset},
    {0, NULL},
};

static PyType_Spec handle_type_spec = {
    .name = "needle_c.ArrayHandle",
    .basicsize = sizeof(ArrayHandleObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = handle_type_slots,
};

static PyObject *ndarray_get_handle(PyObject *op, void *Py_UNUSED(closure)) {
    needle_state *st = ndarray_state(op);
    ArrayHandleObject *h = PyObject_New(ArrayHandleObject, st->array_handle_type);
    if (h == NULL) return NULL;
    h->storage = ((NDArrayObject *)op)->array.storage;
    nd_storage_retain(h->storage);
    return (PyObject *)h;
}

static PyGetSetDef ndarray_handle_getset = {
    "_handle", ndarray_get_handle, NULL,
    "The storage this array views (the course's raw handle): `ptr()` and `size`.", NULL};

/* NDArray.make: a view of handle's storage (a new storage of prod(shape)
 * elements when handle is None) with shape, strides (row-major when None)
 * and offset, as the course's NDArray.make. self is the module. */
static PyObject *ndarray_make(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"shape", "strides", "device", "handle", "offset", NULL};
    PyObject *shape_obj, *strides_obj = Py_None, *device_obj = Py_None, *handle_obj = Py_None;
    long long offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OOOL:make", kwlist, &shape_obj, &strides_obj,
                                     &device_obj, &handle_obj, &offset))
        return NULL;
    needle_state *st = state_of_module(module);
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (parse_shape(shape_obj, SHAPE_EXACT, &ndim, shape) < 0) return NULL;
    nd_layout layout;
    nd_status status = nd_layout_contiguous(ndim, shape, &layout);
    if (status != ND_OK) return raise_status(st, status);
    if (strides_obj != Py_None) {
        int n;
        if (parse_int_tuple(strides_obj, "strides", &n, layout.strides) < 0) return NULL;
        if (n != layout.ndim) {
            PyErr_Format(PyExc_ValueError, "make: %d strides for a shape of %d dimensions", n,
                         layout.ndim);
            return NULL;
        }
    }
    if (offset < 0) {
        PyErr_SetString(PyExc_ValueError, "make: offset must be >= 0");
        return NULL;
    }
    layout.offset = (int64_t)offset;
    nd_storage *storage;
    if (handle_obj == Py_None) {
        nd_device *dev = device_from_object(st, device_obj);
        if (dev == NULL) return NULL;
        status = nd_storage_new(dev, nd_layout_numel(&layout), &storage);
        if (status != ND_OK) return raise_status(st, status);
    } else {
        if (!PyObject_TypeCheck(handle_obj, st->array_handle_type)) {
            PyErr_Format(PyExc_TypeError,
                         "make: handle must be an array handle (an NDArray's "
                         "_handle) or None, not %.100s",
                         Py_TYPE(handle_obj)->tp_name);
            return NULL;
        }
        storage = ((ArrayHandleObject *)handle_obj)->storage;
        if (device_obj != Py_None) {
            nd_device *dev = device_from_object(st, device_obj);
            if (dev == NULL) return NULL;
            if (dev != nd_storage_device(storage)) {
                PyErr_Format(st->device_error, "make: the handle's storage is on %s, not on %s",
                             nd_device_name(nd_storage_device(storage)), nd_device_name(dev));
                return NULL;
            }
        }
        nd_storage_retain(storage);
    }
    if (nd_layout_check_bounds(&layout, nd_storage_numel(storage)) != ND_OK) {
        nd_storage_release(storage);
        PyErr_Format(PyExc_ValueError,
                     "make: the view (shape, strides, offset) reaches outside the storage's %lld "
                     "elements",
                     (long long)nd_storage_numel(storage));
        return NULL;
    }
    nd_array arr = {.storage = storage, .layout = layout};
    return ndarray_wrap(st, &arr);
}

static PyMethodDef ndarray_make_def = {
    "make", (PyCFunction)(void (*)(void))ndarray_make, METH_VARARGS | METH_KEYWORDS,
    "make(shape, strides=None, device=None, handle=None, offset=0)\n--\n\n"
    "The course's NDArray.make: a view of handle's storage (a new uninitialised storage of "
    "prod(shape) elements when handle is None) with shape, strides (row-major when None) "
    "and offset, all in elements."};

/* The storage of handle argument `index` of matmul_tiled (borrowed from the
 * caller's argument), or NULL with TypeError. */
static nd_storage *handle_arg(needle_state *st, PyObject *obj, const char *name) {
    if (!PyObject_TypeCheck(obj, st->array_handle_type)) {
        PyErr_Format(PyExc_TypeError,
                     "matmul_tiled: %s must be an array handle (an NDArray's "
                     "_handle), not %.100s",
                     name, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((ArrayHandleObject *)obj)->storage;
}

/* The (rows, cols) matrix that storage s holds in (rows/T, cols/T, T, T)
 * tiles, as a (rows/T, T, cols/T, T) view (a new storage reference in
 * *out); ND_ERR_VALUE when s is too small for it. */
static nd_status tiled_view(nd_storage *s, int64_t rows, int64_t cols, nd_array *out) {
    const int64_t t = COURSE_TILE;
    nd_layout l = {.ndim = 4,
                   .offset = 0,
                   .shape = {rows / t, t, cols / t, t},
                   .strides = {(cols / t) * t * t, t, t * t, 1}};
    if (rows > 0 && cols > nd_storage_numel(s) / rows) return ND_ERR_VALUE;
    nd_status status = nd_layout_check_bounds(&l, nd_storage_numel(s));
    if (status != ND_OK) return ND_ERR_VALUE;
    nd_storage_retain(s);
    out->storage = s;
    out->layout = l;
    return ND_OK;
}

/* src (contiguous) with the 2-D or 4-D shape given, as a view sharing its
 * storage reference (the layout only changes). */
static nd_status relayout(nd_array *a, int ndim, const int64_t *shape) {
    nd_layout l;
    nd_status status = nd_layout_reshape(&a->layout, ndim, shape, &l);
    if (status == ND_OK) a->layout = l;
    return status;
}

/* out = a @ b over tiled storages: the views, a compact copy of each operand
 * as a matrix, the product, and the product written into out's tiles. */
static nd_status run_matmul_tiled(nd_storage *a, nd_storage *b, nd_storage *out, int64_t m,
                                  int64_t n, int64_t p) {
    const int64_t t = COURSE_TILE;
    nd_array av = {0}, bv = {0}, ov = {0}, ac = {0}, bc = {0}, prod = {0};
    nd_status status = tiled_view(a, m, n, &av);
    if (status == ND_OK) status = tiled_view(b, n, p, &bv);
    if (status == ND_OK) status = tiled_view(out, m, p, &ov);
    if (status == ND_OK) status = nd_array_compact_copy(&av, NULL, &ac);
    if (status == ND_OK) status = nd_array_compact_copy(&bv, NULL, &bc);
    if (status == ND_OK) status = relayout(&ac, 2, (const int64_t[]){m, n});
    if (status == ND_OK) status = relayout(&bc, 2, (const int64_t[]){n, p});
    if (status == ND_OK) status = nd_array_matmul(&ac, &bc, &prod);
    if (status == ND_OK) status = relayout(&prod, 4, (const int64_t[]){m / t, t, p / t, t});
    if (status == ND_OK) status = nd_array_assign(&ov, &prod);
    nd_array_release(&av);
    nd_array_release(&bv);
    nd_array_release(&ov);
    nd_array_release(&ac);
    nd_array_release(&bc);
    nd_array_release(&prod);
    return status;
}

static PyObject *device_matmul_tiled(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError,
                     "matmul_tiled(a, b, out, m, n, p) takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    needle_state *st = state_of_type(Py_TYPE(self));
    if (st == NULL) return NULL;
    nd_device *dev = device_from_object(st, self);
    if (dev == NULL) return NULL;
    static const char *const handle_names[] = {"a", "b", "out"};
    nd_storage *storages[3];
    for (int i = 0; i < 3; i++)
        if ((storages[i] = handle_arg(st, args[i], handle_names[i])) == NULL) return NULL;
    static const char *const dim_names[] = {"m", "n", "p"};
    int64_t dims[3];
    for (int i = 0; i < 3; i++) {
        if (!PyLong_Check(args[3 + i])) {
            PyErr_Format(PyExc_TypeError, "matmul_tiled: %s must be an int, not %.100s",
                         dim_names[i], Py_TYPE(args[3 + i])->tp_name);
            return NULL;
        }
        long long v = PyLong_AsLongLong(args[3 + i]);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            v = -1; /* out of range: reported below as any other bad size */
        }
        if (v < 0 || v > MAX_TILED_DIM || v % COURSE_TILE != 0) {
            PyErr_Format(PyExc_ValueError,
                         "matmul_tiled: %s must be a multiple of the tile size %d in [0, 2**40]",
                         dim_names[i], COURSE_TILE);
            return NULL;
        }
        dims[i] = (int64_t)v;
    }
    for (int i = 0; i < 3; i++)
        if (nd_storage_device(storages[i]) != dev) {
            PyErr_Format(st->device_error, "matmul_tiled: %s is on %s, not on this device (%s)",
                         handle_names[i], nd_device_name(nd_storage_device(storages[i])),
                         nd_device_name(dev));
            return NULL;
        }
    nd_status status =
        run_matmul_tiled(storages[0], storages[1], storages[2], dims[0], dims[1], dims[2]);
    if (status == ND_ERR_VALUE) {
        PyErr_SetString(PyExc_ValueError,
                        "matmul_tiled: a handle's storage is smaller than its (m, n), (n, p) or "
                        "(m, p) tiles");
        return NULL;
    }
    if (status != ND_OK) return raise_status(st, status);
    Py_RETURN_NONE;
}

static PyMethodDef course_device_methods[] = {
    {"matmul_tiled", (PyCFunction)(void (*)(void))device_matmul_tiled, METH_FASTCALL,
     "matmul_tiled($self, a, b, out, m, n, p, /)\n--\n\nThe course's tiled product over raw "
     "handles: a holds an (m, n) matrix in (m/T, n/T, T, T) tiles, b an (n, p) one, and out "
     "receives a @ b in (m/T, p/T, T, T) tiles (T is __tile_size__)."},
    {NULL, NULL, 0, NULL},
};

int course_handle_module_init(PyObject *module, needle_state *st) {
    st->array_handle_type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &handle_type_spec, NULL);
    if (st->array_handle_type == NULL) return -1;
    PyObject *descr = PyDescr_NewGetSet(st->ndarray_type, &ndarray_handle_getset);
    int rc = descr != NULL ? PyDict_SetItemString(st->ndarray_type->tp_dict, "_handle", descr) : -1;
    Py_XDECREF(descr);
    if (rc < 0) return -1;
    PyObject *make = PyCFunction_NewEx(&ndarray_make_def, module, NULL);
    PyObject *make_static = make != NULL ? PyStaticMethod_New(make) : NULL;
    Py_XDECREF(make);
    rc = make_static != NULL ? PyDict_SetItemString(st->ndarray_type->tp_dict, "make", make_static)
                             : -1;
    Py_XDECREF(make_static);
    if (rc < 0) return -1;
    PyType_Modified(st->ndarray_type);
    PyObject *tile = PyLong_FromLong(COURSE_TILE);
    rc = tile != NULL ? PyDict_SetItemString(st->device_type->tp_dict, "__tile_size__", tile) : -1;
    Py_XDECREF(tile);
    if (rc < 0) return -1;
    return device_add_methods(st, course_device_methods);
}
