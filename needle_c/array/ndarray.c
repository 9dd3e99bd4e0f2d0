/* ndarray.c: the NDArray type: construction and conversion to and from
 * NumPy, properties, indexing, and views (reshape, permute, broadcast_to,
 * flip, as_strided). Arithmetic lives in ndarray_ops.c.
 *
 * An NDArray holds no Python references (only an engine storage reference),
 * so it is not a GC container.
 */
#include "ndarray_internal.h"

#define PY_ARRAY_UNIQUE_SYMBOL needle_c_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

int ndarray_module_init(void) {
    import_array1(-1);
    return 0;
}

void ndarray_dealloc(PyObject *op) {
    NDArrayObject *self = NDArray_CAST(op);
    PyTypeObject *tp = Py_TYPE(op);
    if (self->weakreflist != NULL) PyObject_ClearWeakRefs(op);
    nd_array_release(&self->array);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* The exact type first (PyObject_TypeCheck's own fast path), then subclasses. */
int ndarray_check(needle_state *st, PyObject *obj) {
    return PyObject_TypeCheck(obj, st->ndarray_type);
}

PyObject *ndarray_wrap(needle_state *st, nd_array *arr) {
    PyObject *obj = st->ndarray_type->tp_alloc(st->ndarray_type, 0);
    if (obj == NULL) {
        nd_array_release(arr);
        return NULL;
    }
    NDArray_CAST(obj)->array = *arr;
    arr->storage = NULL;
    return obj;
}

PyObject *sequence_tuple(PyObject *obj, const char *message) {
    PyObject *seq = PySequence_Fast(obj, message);
    if (seq != NULL && !PyTuple_CheckExact(seq)) Py_SETREF(seq, PySequence_Tuple(seq));
    return seq;
}

/* ------------------------------------------------------ construction */

PyObject *ndarray_steal_as(needle_state *st, PyObject *array, nd_dtype dtype) {
    const nd_array *a = &NDArray_CAST(array)->array;
    if (nd_array_dtype(a) == dtype) return array;
    nd_array converted;
    nd_status status = nd_array_astype(a, dtype, &converted);
    Py_DECREF(array);
    return array_result(st, status, &converted);
}

nd_dtype tensor_default_dtype(const needle_state *st, PyObject *obj) {
    const nd_dtype other = st->numpy_dtypes ? ND_FLOAT64 : ND_FLOAT32;
    int type;
    if (PyArray_Check(obj)) {
        type = PyArray_DESCR((PyArrayObject *)obj)->type_num;
    } else if (PyArray_IsScalar(obj, Generic)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(obj);
        if (descr == NULL) {
            PyErr_Clear();
            return other;
        }
        type = descr->type_num;
        Py_DECREF(descr);
    } else {
        return other;
    }
    return type == NPY_FLOAT16   ? ND_FLOAT16
           : type == NPY_FLOAT64 ? ND_FLOAT64
           : type == NPY_FLOAT32 ? ND_FLOAT32
                                 : other;
}

/* NumPy data goes to the device in the NumPy type that holds the dtype
 * (dtype_npy_type); bfloat16, which NumPy lacks, goes as float32 and is
 * converted there. */
PyObject *ndarray_from_object(needle_state *st, PyObject *obj, nd_device *dev,
                              const nd_dtype *dtype) {
    nd_status status;
    nd_array arr;
    if (ndarray_check(st, obj)) {
        status = nd_array_compact_copy(&NDArray_CAST(obj)->array, dev, &arr);
        PyObject *copy = array_result(st, status, &arr);
        return copy != NULL && dtype != NULL ? ndarray_steal_as(st, copy, *dtype) : copy;
    }
    nd_dtype target = dtype != NULL ? *dtype : ND_FLOAT32;
    PyArrayObject *natural = (PyArrayObject *)PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
    if (natural == NULL) return NULL;
    int type = PyArray_TYPE(natural);
    if (!(PyTypeNum_ISBOOL(type) || PyTypeNum_ISINTEGER(type) || PyTypeNum_ISFLOAT(type))) {
        PyErr_Format(PyExc_TypeError,
                     "needle arrays hold floats; cannot convert data of dtype %R (from %.100s)",
                     (PyObject *)PyArray_DESCR(natural), Py_TYPE(obj)->tp_name);
        Py_DECREF(natural);
        return NULL;
    }
    if (PyArray_NDIM(natural) > ND_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "arrays have at most %d dimensions, got %d", ND_MAX_DIMS,
                     PyArray_NDIM(natural));
        Py_DECREF(natural);
        return NULL;
    }
    int host_type = dtype_npy_type(target);
    PyArrayObject *host = (PyArrayObject *)PyArray_FromArray(
        natural, PyArray_DescrFromType(host_type),
        NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST);
    Py_DECREF(natural);
    if (host == NULL) return NULL;
    int ndim = PyArray_NDIM(host);
    int64_t shape[ND_MAX_DIMS];
    for (int i = 0; i < ndim; i++) shape[i] = PyArray_DIM(host, i);
    nd_dtype host_dtype = target == ND_BFLOAT16 ? ND_FLOAT32 : target;
    status = nd_array_empty_typed(dev, ndim, shape, host_dtype, &arr);
    if (status == ND_OK && (status = nd_array_from_host(&arr, PyArray_DATA(host))) != ND_OK)
        nd_array_release(&arr);
    Py_DECREF(host);
    PyObject *result = array_result(st, status, &arr);
    return result != NULL ? ndarray_steal_as(st, result, target) : NULL;
}

int ndarray_write_object(needle_state *st, PyObject *out, PyObject *obj) {
    const nd_array *arr = &NDArray_CAST(out)->array;
    const nd_layout *layout = &arr->layout;
    PyArrayObject *host = (PyArrayObject *)PyArray_FromAny(
        obj, PyArray_DescrFromType(dtype_npy_type(nd_array_dtype(arr))), 0, 0,
        NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST, NULL);
    if (host == NULL) return -1;
    int same = PyArray_NDIM(host) == layout->ndim;
    for (int i = 0; same && i < layout->ndim; i++) same = PyArray_DIM(host, i) == layout->shape[i];
    if (!same) {
        PyErr_SetString(PyExc_ValueError,
                        "cannot write values into an array of another shape than theirs");
        Py_DECREF(host);
        return -1;
    }
    nd_status status = nd_array_from_host(arr, PyArray_DATA(host));
    Py_DECREF(host);
    if (status != ND_OK) {
        raise_status(st, status);
        return -1;
    }
    return 0;
}

static PyObject *ndarray_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"other", "device", "dtype", NULL};
    PyObject *other, *device = Py_None, *dtype_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO:NDArray", kwlist, &other, &device,
                                     &dtype_obj))
        return NULL;
    needle_state *st = state_of_type(type);
    if (st == NULL) return NULL;
    nd_dtype dtype;
    if (dtype_obj != Py_None && parse_dtype_param(dtype_obj, &dtype) < 0) return NULL;
    nd_device *dev;
    if (device == Py_None && ndarray_check(st, other))
        dev = nd_storage_device(NDArray_CAST(other)->array.storage);
    else if ((dev = device_from_object(st, device)) == NULL) return NULL;
    PyObject *made = ndarray_from_object(st, other, dev, dtype_obj != Py_None ? &dtype : NULL);
    if (made == NULL || type == st->ndarray_type) return made;
    /* A Python subclass: move the new array into an instance of it. */
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj != NULL) {
        NDArray_CAST(obj)->array = NDArray_CAST(made)->array;
        NDArray_CAST(made)->array.storage = NULL;
    }
    Py_DECREF(made);
    return obj;
}

/* ------------------------------------------------------- conversion */

/* float32, float16 and float64 arrays give NumPy arrays of their dtype;
 * bfloat16 ones (NumPy has no such type) give float32, which holds them
 * exactly. */
PyObject *ndarray_numpy(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    NDArrayObject *self = NDArray_CAST(op);
    const nd_layout *l = &self->array.layout;
    nd_dtype dtype = nd_array_dtype(&self->array);
    npy_intp dims[ND_MAX_DIMS];
    for (int i = 0; i < l->ndim; i++) dims[i] = (npy_intp)l->shape[i];
    PyObject *result = PyArray_SimpleNew(l->ndim, dims, dtype_npy_type(dtype));
    if (result == NULL) return NULL;
    nd_status status;
    if (dtype == ND_BFLOAT16) {
        nd_array wide;
        if ((status = nd_array_astype(&self->array, ND_FLOAT32, &wide)) == ND_OK) {
            status = nd_array_to_host(&wide, PyArray_DATA((PyArrayObject *)result));
            nd_array_release(&wide);
        }
    } else {
        status = nd_array_to_host(&self->array, PyArray_DATA((PyArrayObject *)result));
    }
    if (status != ND_OK) {
        Py_DECREF(result);
        return raise_status(ndarray_state(op), status);
    }
    return result;
}

static PyObject *ndarray_array(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"dtype", "copy", NULL};
    PyObject *dtype = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", kwlist, &dtype, &copy))
        return NULL;
    if (copy == Py_False) {
        PyErr_SetString(
            PyExc_ValueError,
            "needle arrays are converted to NumPy by copying; copy=False is impossible");
        return NULL;
    }
    PyObject *result = ndarray_numpy(op, NULL);
    if (result == NULL || dtype == Py_None) return result;
    PyObject *cast = PyObject_CallMethod(result, "astype", "O", dtype);
    Py_DECREF(result);
    return cast;
}

static PyObject *ndarray_repr(PyObject *op) {
    needle_state *st = ndarray_state(op);
    PyObject *values = ndarray_numpy(op, NULL);
    if (values == NULL) return NULL;
    PyObject *text = PyObject_Str(values);
    Py_DECREF(values);
    if (text == NULL) return NULL;
    PyObject *result =
        PyUnicode_FromFormat("NDArray(%U, device=%R)", text,
                             device_object(st, nd_storage_device(NDArray_CAST(op)->array.storage)));
    Py_DECREF(text);
    return result;
}

/* ------------------------------------------------------- properties */

static PyObject *int_tuple(const int64_t *values, int n) {
    PyObject *t = PyTuple_New(n);
    if (t == NULL) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *get_shape(PyObject *op, void *c) {
    (void)c;
    return int_tuple(NDArray_CAST(op)->array.layout.shape, NDArray_CAST(op)->array.layout.ndim);
}
static PyObject *get_strides(PyObject *op, void *c) {
    (void)c;
    return int_tuple(NDArray_CAST(op)->array.layout.strides, NDArray_CAST(op)->array.layout.ndim);
}
static PyObject *get_offset(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLongLong(NDArray_CAST(op)->array.layout.offset);
}
static PyObject *get_size(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLongLong(nd_layout_numel(&NDArray_CAST(op)->array.layout));
}
static PyObject *get_nbytes(PyObject *op, void *c) {
    (void)c;
    const nd_array *a = &NDArray_CAST(op)->array;
    return PyLong_FromLongLong(nd_layout_numel(&a->layout) * nd_dtype_size(nd_array_dtype(a)));
}
static PyObject *get_itemsize(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLongLong(nd_dtype_size(nd_array_dtype(&NDArray_CAST(op)->array)));
}
static PyObject *get_ndim(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLong(NDArray_CAST(op)->array.layout.ndim);
}
static PyObject *get_dtype(PyObject *op, void *c) {
    (void)c;
    return PyUnicode_FromString(nd_dtype_name(nd_array_dtype(&NDArray_CAST(op)->array)));
}
static PyObject *get_device(PyObject *op, void *c) {
    (void)c;
    needle_state *st = ndarray_state(op);
    return Py_NewRef(device_object(st, nd_storage_device(NDArray_CAST(op)->array.storage)));
}
static PyObject *get_storage_refcount(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLongLong(nd_storage_refcount(NDArray_CAST(op)->array.storage));
}
static PyObject *get_storage_numel(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLongLong(nd_storage_numel(NDArray_CAST(op)->array.storage));
}

static Py_ssize_t ndarray_length(PyObject *op) {
    const nd_layout *l = &NDArray_CAST(op)->array.layout;
    if (l->ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d array");
        return -1;
    }
    return (Py_ssize_t)l->shape[0];
}

/* ------------------------------------------------------------ views */

/* A method's varargs spec: f(x) gives x, f(2, 3) the tuple (2, 3) (a new reference). */
static PyObject *varargs_spec(PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 1) return Py_NewRef(args[0]);
    PyObject *t = PyTuple_New(nargs);
    for (Py_ssize_t i = 0; t != NULL && i < nargs; i++) PyTuple_SET_ITEM(t, i, Py_NewRef(args[i]));
    return t;
}

/* reshape(2, 3) or reshape((2, 3)). */
static PyObject *ndarray_reshape(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    PyObject *spec = varargs_spec(args, nargs);
    if (spec == NULL) return NULL;
    int rc = parse_shape(spec, SHAPE_INFER, &ndim, shape);
    Py_DECREF(spec);
    if (rc < 0) return NULL;
    return array_reshape(ndarray_state(op), op, ndim, shape);
}

static PyObject *ndarray_permute(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    NDArrayObject *self = NDArray_CAST(op);
    needle_state *st = ndarray_state(op);
    int naxes, axes[ND_MAX_DIMS];
    PyObject *spec = varargs_spec(args, nargs);
    if (spec == NULL) return NULL;
    int rc = parse_axes(st, spec, &naxes, axes);
    Py_DECREF(spec);
    if (rc < 0) return NULL;
    if (naxes != self->array.layout.ndim) {
        PyErr_Format(PyExc_ValueError, "permute: expected %d axes, got %d", self->array.layout.ndim,
                     naxes);
        return NULL;
    }
    if (normalize_axes(st, naxes, axes, naxes, axes) < 0) return NULL;
    nd_layout layout;
    nd_status status = nd_layout_permute(&self->array.layout, axes, &layout);
    if (status != ND_OK) return raise_status(st, status);
    return array_view(st, op, &layout);
}

PyObject *ndarray_broadcast_to(PyObject *op, PyObject *shape_obj) {
    NDArrayObject *self = NDArray_CAST(op);
    needle_state *st = ndarray_state(op);
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (parse_shape(shape_obj, SHAPE_EXACT, &ndim, shape) < 0) return NULL;
    nd_layout layout;
    nd_status status = nd_layout_broadcast_to(&self->array.layout, ndim, shape, &layout);
    if (status != ND_OK) return raise_status(st, status);
    return array_view(st, op, &layout);
}

PyObject *ndarray_flip(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    NDArrayObject *self = NDArray_CAST(op);
    needle_state *st = ndarray_state(op);
    int naxes, axes[ND_MAX_DIMS];
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "flip() takes one argument (axes)");
        return NULL;
    }
    if (nargs == 0 || args[0] == Py_None) {
        naxes = self->array.layout.ndim;
        for (int i = 0; i < naxes; i++) axes[i] = i;
    } else if (parse_axes(st, args[0], &naxes, axes) < 0 ||
               normalize_axes(st, naxes, axes, self->array.layout.ndim, axes) < 0) {
        return NULL;
    }
    nd_layout layout;
    nd_status status = nd_layout_flip(&self->array.layout, naxes, axes, &layout);
    if (status != ND_OK) return raise_status(st, status);
    return array_view(st, op, &layout);
}

static PyObject *ndarray_as_strided(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    NDArrayObject *self = NDArray_CAST(op);
    needle_state *st = ndarray_state(op);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "as_strided() takes two arguments (shape, strides)");
        return NULL;
    }
    nd_layout layout;
    int nstrides;
    int64_t strides[ND_MAX_DIMS];
    memset(&layout, 0, sizeof layout);
    if (parse_shape(args[0], SHAPE_EXACT, &layout.ndim, layout.shape) < 0) return NULL;
    if (parse_int_tuple(args[1], "strides", &nstrides, strides) < 0) return NULL;
    if (nstrides != layout.ndim) {
        PyErr_Format(PyExc_ValueError, "as_strided: %d dims but %d strides", layout.ndim, nstrides);
        return NULL;
    }
    memcpy(layout.strides, strides, sizeof strides);
    layout.offset = self->array.layout.offset;
    nd_status status = nd_layout_check_bounds(&layout, nd_storage_numel(self->array.storage));
    if (status != ND_OK) return raise_status(st, status);
    return array_view(st, op, &layout);
}

/* The course's is_compact: the strides are exactly the row-major ones of the
 * shape, size-1 dims included (nd_layout_is_contiguous, which the engine's
 * views use, ignores those). An offset view with such strides (a[1:2]) is
 * compact, as in NumPy. */
static int is_compact_strict(const nd_array *a) {
    const nd_layout *l = &a->layout;
    nd_layout canonical;
    if (nd_layout_contiguous(l->ndim, l->shape, &canonical) != ND_OK) return 0;
    for (int i = 0; i < l->ndim; i++)
        if (l->strides[i] != canonical.strides[i]) return 0;
    return 1;
}

static PyObject *ndarray_compact(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    NDArrayObject *self = NDArray_CAST(op);
    if (is_compact_strict(&self->array)) return Py_NewRef(op);
    nd_array copy;
    return array_result(ndarray_state(op), nd_array_compact_copy(&self->array, NULL, &copy), &copy);
}

static PyObject *ndarray_is_compact(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(is_compact_strict(&NDArray_CAST(op)->array));
}

/* astype(dtype): one of needle's dtypes gives an NDArray copy converted on
 * its device; any other NumPy dtype gives a NumPy array of that dtype, as
 * the course's code expects of `cached_data.astype(np.uint8)`. */
static PyObject *ndarray_astype(PyObject *op, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    static const char *const names[] = {"dtype", NULL};
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        if (nargs != 0 || PyTuple_GET_SIZE(kwnames) != 1 ||
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), names[0]) != 0) {
            PyErr_SetString(PyExc_TypeError, "astype() takes one argument (dtype)");
            return NULL;
        }
    } else if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "astype() takes one argument (dtype)");
        return NULL;
    }
    nd_dtype dtype;
    int rc = parse_dtype(args[0], &dtype, NULL);
    if (rc < 0) return NULL;
    if (rc == 1) {
        nd_array out;
        return array_result(ndarray_state(op),
                            nd_array_astype(&NDArray_CAST(op)->array, dtype, &out), &out);
    }
    PyObject *values = ndarray_numpy(op, NULL);
    if (values == NULL) return NULL;
    PyObject *cast = PyObject_CallMethod(values, "astype", "O", args[0]);
    Py_DECREF(values);
    return cast;
}

/* The course's process_slice(sl, dim): start None -> 0, stop None ->
 * shape[dim], step None -> 1, a negative start or stop counted from the end
 * (the course set a negative start to shape[dim]; counting from the end is
 * what its own __getitem__ meant). Like the course it requires step > 0 and
 * stop > start (ValueError here). */
static PyObject *ndarray_process_slice(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PySlice_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "process_slice() takes (slice, dim)");
        return NULL;
    }
    const nd_layout *l = &NDArray_CAST(op)->array.layout;
    Py_ssize_t dim = PyNumber_AsSsize_t(args[1], PyExc_IndexError);
    if (dim == -1 && PyErr_Occurred()) return NULL;
    if (dim < 0 || dim >= l->ndim) {
        PyErr_Format(PyExc_IndexError, "process_slice: dim %zd out of range for %d dims", dim,
                     l->ndim);
        return NULL;
    }
    Py_ssize_t n = (Py_ssize_t)l->shape[dim];
    Py_ssize_t v[3] = {0, n, 1};
    static const char *const fields[] = {"start", "stop", "step"};
    for (int i = 0; i < 3; i++) {
        PyObject *f = PyObject_GetAttrString(args[0], fields[i]);
        if (f == NULL) return NULL;
        if (f != Py_None) {
            v[i] = PyNumber_AsSsize_t(f, PyExc_OverflowError);
            if (v[i] == -1 && PyErr_Occurred()) {
                Py_DECREF(f);
                return NULL;
            }
            if (i < 2 && v[i] < 0) v[i] += n;
        }
        Py_DECREF(f);
    }
    if (v[2] <= 0) {
        PyErr_SetString(PyExc_ValueError, "process_slice: the step must be positive");
        return NULL;
    }
    if (v[1] <= v[0]) {
        PyErr_Format(PyExc_ValueError, "process_slice: start %zd must be less than stop %zd", v[0],
                     v[1]);
        return NULL;
    }
    PyObject *a = PyLong_FromSsize_t(v[0]), *b = PyLong_FromSsize_t(v[1]);
    PyObject *c = PyLong_FromSsize_t(v[2]);
    PyObject *result = a != NULL && b != NULL && c != NULL ? PySlice_New(a, b, c) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(c);
    return result;
}

static PyObject *get_flat(PyObject *op, void *c) {
    (void)c;
    PyObject *size = PyLong_FromLongLong(nd_layout_numel(&NDArray_CAST(op)->array.layout));
    if (size == NULL) return NULL;
    PyObject *result = ndarray_reshape(op, &size, 1);
    Py_DECREF(size);
    return result;
}

static PyObject *ndarray_to(PyObject *op, PyObject *device) {
    NDArrayObject *self = NDArray_CAST(op);
    needle_state *st = ndarray_state(op);
    nd_device *dev = device_from_object(st, device);
    if (dev == NULL) return NULL;
    if (dev == nd_storage_device(self->array.storage)) return Py_NewRef(op);
    return ndarray_from_object(st, op, dev, NULL);
}

static PyObject *ndarray_fill(PyObject *op, PyObject *value) {
    double v;
    if (parse_scalar_param(value, &v) < 0) return NULL;
    nd_status status = nd_array_fill(&NDArray_CAST(op)->array, v); /* the dtype rounds it */
    if (status != ND_OK) return raise_status(ndarray_state(op), status);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------- indexing */

/* The course's indexing: an integer keeps its dim as size 1. */
static int index_layout(NDArrayObject *self, PyObject *key, nd_layout *out) {
    nd_layout l = self->array.layout;
    PyObject *items = PyTuple_Check(key) ? Py_NewRef(key) : PyTuple_Pack(1, key);
    if (items == NULL) return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(items), explicit_count = 0, ellipses = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyTuple_GET_ITEM(items, i) == Py_Ellipsis) ellipses++;
        else explicit_count++;
    }
    int rc = -1;
    if (ellipses > 1) {
        PyErr_SetString(PyExc_IndexError, "an index can only have a single ellipsis ('...')");
        goto done;
    }
    if (explicit_count > l.ndim) {
        PyErr_Format(PyExc_IndexError,
                     "too many indices for array: array is %d-dimensional, but %zd were indexed",
                     l.ndim, explicit_count);
        goto done;
    }
    int dim = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (item == Py_Ellipsis) {
            dim += (int)(l.ndim - explicit_count);
            continue;
        }
        nd_status status;
        if (PySlice_Check(item)) {
            Py_ssize_t start, stop, step;
            if (PySlice_Unpack(item, &start, &stop, &step) < 0) goto done;
            Py_ssize_t length =
                PySlice_AdjustIndices((Py_ssize_t)l.shape[dim], &start, &stop, step);
            status = nd_layout_slice(&l, dim, start, step, length);
        } else if (PyIndex_Check(item) && !PyFloat_Check(item)) {
            Py_ssize_t index = PyNumber_AsSsize_t(item, PyExc_IndexError);
            if (index == -1 && PyErr_Occurred()) goto done;
            if (index < 0) index += (Py_ssize_t)l.shape[dim];
            if (index < 0 || index >= l.shape[dim]) {
                PyErr_Format(PyExc_IndexError,
                             "index %zd is out of bounds for axis %d with size %lld",
                             PyNumber_AsSsize_t(item, NULL), dim, (long long)l.shape[dim]);
                goto done;
            }
            status = nd_layout_slice(&l, dim, index, 1, 1);
        } else {
            PyErr_Format(PyExc_TypeError,
                         "only integers, slices and Ellipsis are valid indices, got %.100s",
                         Py_TYPE(item)->tp_name);
            goto done;
        }
        if (status != ND_OK) {
            raise_status(ndarray_state((PyObject *)self), status);
            goto done;
        }
        dim++;
    }
    *out = l;
    rc = 0;
done:
    Py_DECREF(items);
    return rc;
}

static PyObject *ndarray_getitem(PyObject *op, PyObject *key) {
    NDArrayObject *self = NDArray_CAST(op);
    nd_layout layout;
    if (index_layout(self, key, &layout) < 0) return NULL;
    return array_view(ndarray_state(op), op, &layout);
}

static int ndarray_setitem(PyObject *op, PyObject *key, PyObject *value) {
    NDArrayObject *self = NDArray_CAST(op);
    needle_state *st = ndarray_state(op);
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "cannot delete array elements");
        return -1;
    }
    nd_layout layout;
    if (index_layout(self, key, &layout) < 0) return -1;
    nd_array view = {self->array.storage, layout};
    nd_status status;
    nd_operand scalar;
    if (ndarray_check(st, value)) {
        status = nd_array_assign(&view, &NDArray_CAST(value)->array);
    } else if (as_operand(value, &scalar) == 1) {
        status = nd_array_fill(&view, scalar.scalar);
    } else {
        if (PyErr_Occurred()) return -1;
        if (value == Py_None || PyUnicode_Check(value) || PyBytes_Check(value)) {
            PyErr_Format(PyExc_TypeError, "cannot assign %.100s to an NDArray",
                         Py_TYPE(value)->tp_name);
            return -1;
        }
        nd_dtype dtype = nd_array_dtype(&self->array);
        /* A NumPy array of the view's shape goes straight into it: one copy
         * from the host (Tensor.copy_ feeding a CUDA graph's static inputs),
         * not a new device array and a device copy. */
        if (PyArray_Check(value) && dtype != ND_BFLOAT16) {
            int same = PyArray_NDIM((PyArrayObject *)value) == layout.ndim;
            for (int i = 0; same && i < layout.ndim; i++)
                same = PyArray_DIM((PyArrayObject *)value, i) == layout.shape[i];
            if (same) {
                PyArrayObject *host = (PyArrayObject *)PyArray_FromAny(
                    value, PyArray_DescrFromType(dtype_npy_type(dtype)), 0, 0,
                    NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST, NULL);
                if (host == NULL) return -1;
                status = nd_array_from_host(&view, PyArray_DATA(host));
                Py_DECREF(host);
                if (status != ND_OK) {
                    raise_status(st, status);
                    return -1;
                }
                return 0;
            }
        }
        PyObject *converted =
            ndarray_from_object(st, value, nd_storage_device(self->array.storage), &dtype);
        if (converted == NULL) return -1;
        status = nd_array_assign(&view, &NDArray_CAST(converted)->array);
        Py_DECREF(converted);
    }
    if (status != ND_OK) {
        raise_status(st, status);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- type */

/* The views and conversions of this file, then the arithmetic of ndarray_ops.c. */
static PyMethodDef ndarray_methods[] = {
    {"numpy", ndarray_numpy, METH_NOARGS, "numpy($self, /)\n--\n\nA float32 NumPy copy."},
    {"__array__", (PyCFunction)(void (*)(void))ndarray_array, METH_VARARGS | METH_KEYWORDS,
     "__array__($self, /, dtype=None, copy=None)\n--\n\nNumPy conversion (always a copy)."},
    {"compact", ndarray_compact, METH_NOARGS,
     "compact($self, /)\n--\n\nself when is_compact(), else a copy with row-major strides."},
    {"is_compact", ndarray_is_compact, METH_NOARGS,
     "is_compact($self, /)\n--\n\nTrue when the strides are the row-major ones of the shape "
     "(size-1 dims included), as in the course."},
    {"astype", (PyCFunction)(void (*)(void))ndarray_astype, METH_FASTCALL | METH_KEYWORDS,
     "astype($self, /, dtype)\n--\n\nA copy of this array converted to dtype (float32, float16, "
     "bfloat16 or float64), on the same device."},
    {"process_slice", (PyCFunction)(void (*)(void))ndarray_process_slice, METH_FASTCALL,
     "process_slice($self, sl, dim, /)\n--\n\nThe course's helper: sl with explicit start, stop "
     "and step for dimension dim."},
    {"reshape", (PyCFunction)(void (*)(void))ndarray_reshape, METH_FASTCALL,
     "reshape($self, /, *shape)\n--\n\nA view with a new shape (one -1 allowed); a copy when no "
     "view is possible."},
    {"permute", (PyCFunction)(void (*)(void))ndarray_permute, METH_FASTCALL,
     "permute($self, /, *axes)\n--\n\nA view with the axes reordered."},
    {"broadcast_to", ndarray_broadcast_to, METH_O,
     "broadcast_to($self, shape, /)\n--\n\nA stride-0 view broadcast to shape (NumPy rules)."},
    {"flip", (PyCFunction)(void (*)(void))ndarray_flip, METH_FASTCALL,
     "flip($self, axes=None, /)\n--\n\nA view reversed along axes (all when None)."},
    {"as_strided", (PyCFunction)(void (*)(void))ndarray_as_strided, METH_FASTCALL,
     "as_strided($self, shape, strides, /)\n--\n\nA view with explicit strides (elements), "
     "bounds-checked against the storage."},
    {"to", ndarray_to, METH_O,
     "to($self, device, /)\n--\n\nself on device (a copy when it moves)."},
    {"fill", ndarray_fill, METH_O, "fill($self, value, /)\n--\n\nSets every element, in place."},
    {"__dlpack__", (PyCFunction)(void (*)(void))interop_ndarray_dlpack,
     METH_VARARGS | METH_KEYWORDS,
     "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\nA "
     "DLPack capsule sharing this view's memory (interop.c)."},
    {"__dlpack_device__", interop_ndarray_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self, /)\n--\n\n(device_type, device_id) as DLPack numbers them."},
/* One method per row of the catalogue (csrc/ewise_ops.h). */
/* clang-format off */
#define NDARRAY_UNARY_METHOD(A, id, name, Class, doc, formula) \
    {#name, ndarray_unary_##name, METH_NOARGS, #name "($self, /)\n--\n\n" doc " Elementwise."},
    ND_EWISE_UNARY_OPS(NDARRAY_UNARY_METHOD, )
#undef NDARRAY_UNARY_METHOD
/* One method per binary row that names one (maximum, minimum). */
#define NDARRAY_BINARY_METHOD(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    ND_EW_IF(method, {#method, ndarray_binary_##name, METH_O,                                      \
                      #method "($self, other, /)\n--\n\n" doc " other: an NDArray or a number."},)
    ND_EWISE_BINARY_OPS(NDARRAY_BINARY_METHOD, )
#undef NDARRAY_BINARY_METHOD
    /* clang-format on */
    {"matmul", ndarray_matmul, METH_O,
     "matmul($self, other, /)\n--\n\nself @ other (NumPy rules)."},
    {"sum", (PyCFunction)(void (*)(void))ndarray_sum, METH_FASTCALL | METH_KEYWORDS,
     "sum($self, /, axis=None, keepdims=False)\n--\n\nSum over axis (None, an int or a tuple). "
     "axis=None without keepdims gives shape (1,), as in the course."},
    {"max", (PyCFunction)(void (*)(void))ndarray_max, METH_FASTCALL | METH_KEYWORDS,
     "max($self, /, axis=None, keepdims=False)\n--\n\nMaximum over axis; see sum."},
    {"min", (PyCFunction)(void (*)(void))ndarray_min, METH_FASTCALL | METH_KEYWORDS,
     "min($self, /, axis=None, keepdims=False)\n--\n\nMinimum over axis; see sum."},
    {"pad", ndarray_pad, METH_O,
     "pad($self, axes, /)\n--\n\nA zero-padded copy; axes holds a (before, after) pair per dim."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ndarray_getset[] = {
    {"shape", get_shape, NULL, "The shape, a tuple of ints.", NULL},
    {"strides", get_strides, NULL, "Strides in elements (not bytes).", NULL},
    {"_offset", get_offset, NULL, "Offset of the first element in the storage, in elements.", NULL},
    {"size", get_size, NULL, "Number of elements.", NULL},
    {"nbytes", get_nbytes, NULL, "Bytes of data the view covers.", NULL},
    {"ndim", get_ndim, NULL, "Number of dimensions.", NULL},
    {"dtype", get_dtype, NULL, "The element type: 'float32', 'float16', 'bfloat16' or 'float64'.",
     NULL},
    {"itemsize", get_itemsize, NULL, "Bytes per element.", NULL},
    {"device", get_device, NULL, "The device holding the data.", NULL},
    {"flat", get_flat, NULL, "The array reshaped to (size,).", NULL},
    {"_storage_refcount", get_storage_refcount, NULL, "Views sharing the storage.", NULL},
    {"_storage_size", get_storage_numel, NULL, "Elements in the underlying storage.", NULL},
    {"__array_interface__", interop_ndarray_array_interface, NULL,
     "NumPy's array interface v3 (CPU only; shares memory).", NULL},
    {"__cuda_array_interface__", interop_ndarray_cuda_array_interface, NULL,
     "The CUDA array interface v3 (CUDA only).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef ndarray_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(NDArrayObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot ndarray_type_slots[] = {
    {Py_tp_doc, "NDArray(other, device=None)\n--\n\nA strided float32 array on a device. other is "
                "an NDArray (copied), a NumPy array or anything np.array accepts."},
    {Py_tp_new, ndarray_new},
    {Py_tp_dealloc, ndarray_dealloc},
    {Py_tp_repr, ndarray_repr},
    {Py_tp_methods, ndarray_methods},
    {Py_tp_getset, ndarray_getset},
    {Py_tp_members, ndarray_members},
    {Py_tp_richcompare, ndarray_richcompare},
    {Py_mp_subscript, ndarray_getitem},
    {Py_mp_ass_subscript, ndarray_setitem},
    {Py_mp_length, ndarray_length},
    {Py_nb_add, ndarray_add},
    {Py_nb_subtract, ndarray_subtract},
    {Py_nb_multiply, ndarray_multiply},
    {Py_nb_true_divide, ndarray_true_divide},
    {Py_nb_power, ndarray_power},
    {Py_nb_negative, ndarray_negative},
    {Py_nb_absolute, ndarray_absolute},
    {Py_nb_matrix_multiply, ndarray_matmul_slot},
    {0, NULL},
};

PyType_Spec ndarray_type_spec = {
    .name = "needle_c.NDArray",
    .basicsize = sizeof(NDArrayObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = ndarray_type_slots,
};
