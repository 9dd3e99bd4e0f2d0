/* tensor_type.c: the Python surface of Value, Tensor and TensorTuple:
 * construction (Tensor(...), make_const, make_from_op), the properties
 * (op, inputs, cached_data, grad, shape, ...), the methods, and the type
 * tables that also list tensor_ops.c's operators. The node itself (its GC
 * slots, realising its data) is tensor.c's.
 */
#include "tensor.h"

#include "array/parse.h"

#include <limits.h>
#include <structmember.h>

static PyObject *value_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)args;
    (void)kwargs;
    return value_alloc(type);
}

/* ----------------------------------------------------- construction */

static PyObject *device_of_data(needle_state *st, PyObject *data) {
    if (ndarray_check(st, data))
        return device_object(st, nd_storage_device(NDArray_CAST(data)->array.storage));
    return NULL;
}

/* Tensor(array, *, device=None, dtype=None, requires_grad=True, **kwargs) */
static int tensor_init(PyObject *op, PyObject *args, PyObject *kwargs) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return -1;
    PyObject *array = NULL, *device = Py_None, *dtype = Py_None,
             *
        requires
    = Py_True;
    if (PyTuple_GET_SIZE(args) != 1) {
        PyErr_Format(PyExc_TypeError, "Tensor() takes one positional argument (array), got %zd",
                     PyTuple_GET_SIZE(args));
        return -1;
    }
    array = PyTuple_GET_ITEM(args, 0);
    if (kwargs != NULL) {
        PyObject *v;
        if ((v = PyDict_GetItemString(kwargs, "device")) != NULL) device = v;
        if ((v = PyDict_GetItemString(kwargs, "dtype")) != NULL) dtype = v;
        if ((v = PyDict_GetItemString(kwargs, "requires_grad")) != NULL) requires = v;
    }
    /* dtype None: a tensor's or NDArray's own dtype, float32 for other data. */
    nd_dtype dtype_value;
    const nd_dtype *wanted = NULL;
    if (dtype != Py_None) {
        if (parse_dtype_param(dtype, &dtype_value) < 0) return -1;
        wanted = &dtype_value;
    }
    int requires_grad = PyObject_IsTrue(requires);
    if (requires_grad < 0) return -1;
    PyObject *data;
    if (is_tensor(st, array)) {
        PyObject *source = realize(st, array); /* held across the copy, which allocates */
        if (source == NULL) return -1;
        PyObject *source_device = device_of_data(st, source);
        int same = device == Py_None;
        if (!same && source_device != NULL)
            same = PyObject_RichCompareBool(device, source_device, Py_EQ);
        if (same > 0 &&
            (wanted == NULL || *wanted == nd_array_dtype(&NDArray_CAST(source)->array))) {
            data = Py_NewRef(source); /* shares the data, as in the course */
        } else if (same >= 0) {
            nd_device *dev = device == Py_None
                                 ? nd_storage_device(NDArray_CAST(source)->array.storage)
                                 : device_from_object(st, device);
            data = dev ? ndarray_from_object(st, source, dev, wanted) : NULL;
        } else {
            data = NULL;
        }
        Py_DECREF(source);
    } else {
        if (is_tensor_tuple(st, array)) {
            PyErr_SetString(PyExc_TypeError, "cannot make a Tensor from a TensorTuple");
            return -1;
        }
        nd_device *dev = device_from_object(st, device);
        if (dev == NULL) return -1;
        if (PyUnicode_Check(array) || PyBytes_Check(array) || array == Py_None) {
            PyErr_Format(PyExc_TypeError, "cannot make a Tensor from %.100s",
                         Py_TYPE(array)->tp_name);
            return -1;
        }
        /* An NDArray keeps its dtype; other data gets tensor_default_dtype's. */
        nd_dtype natural = tensor_default_dtype(st, array);
        if (wanted == NULL && !ndarray_check(st, array)) wanted = &natural;
        data = ndarray_from_object(st, array, dev, wanted);
    }
    if (data == NULL) return -1;
    TensorObject *self = Tensor_CAST(op);
    Py_CLEAR(self->op);
    Py_SETREF(self->inputs, PyTuple_New(0));
    Py_XSETREF(self->cached_data, data);
    self->requires_grad = requires_grad;
    self->num_outputs = 1;
    return self->inputs == NULL ? -1 : 0;
}

/* ------------------------------------------------------- properties */

static PyObject *get_op(PyObject *op, void *c) {
    (void)c;
    return Py_NewRef(Tensor_CAST(op)->op ? Tensor_CAST(op)->op : Py_None);
}
static int set_op(PyObject *op, PyObject *value, void *c) {
    (void)c;
    if (value != NULL && value != Py_None) {
        needle_state *st = state_of_value(op);
        if (st == NULL) return -1;
        if (!PyObject_TypeCheck(value, st->autograd->op_type)) {
            PyErr_Format(PyExc_TypeError, "op must be an Op or None, got %.100s",
                         Py_TYPE(value)->tp_name);
            return -1;
        }
    }
    Py_XSETREF(Tensor_CAST(op)->op, (value == NULL || value == Py_None) ? NULL : Py_NewRef(value));
    return 0;
}
static PyObject *get_inputs(PyObject *op, void *c) {
    (void)c;
    return PySequence_List(Tensor_CAST(op)->inputs);
}
static int set_inputs(PyObject *op, PyObject *value, void *c) {
    (void)c;
    PyObject *t = value == NULL || value == Py_None ? PyTuple_New(0) : PySequence_Tuple(value);
    if (t == NULL) return -1;
    needle_state *st = state_of_value(op);
    for (Py_ssize_t i = 0; st != NULL && i < PyTuple_GET_SIZE(t); i++)
        if (!is_value(st, PyTuple_GET_ITEM(t, i))) {
            PyErr_Format(PyExc_TypeError, "op inputs must be Tensors, got %.100s at position %zd",
                         Py_TYPE(PyTuple_GET_ITEM(t, i))->tp_name, i);
            st = NULL;
        }
    if (st == NULL) {
        Py_DECREF(t);
        return -1;
    }
    Py_XSETREF(Tensor_CAST(op)->inputs, t);
    return 0;
}
static PyObject *get_cached_data(PyObject *op, void *c) {
    (void)c;
    return Py_NewRef(Tensor_CAST(op)->cached_data ? Tensor_CAST(op)->cached_data : Py_None);
}
static int set_cached_data(PyObject *op, PyObject *value, void *c) {
    (void)c;
    if (value != NULL && value != Py_None) {
        needle_state *st = state_of_value(op);
        if (st == NULL) return -1;
        int tuple = is_tensor_tuple(st, op) ? 1 : is_tensor(st, op) ? 0 : -1;
        if (!node_data_ok(st, value, tuple)) {
            PyErr_Format(PyExc_TypeError, "cached_data must be %s or None on a %s, got %.100s",
                         tuple == 0   ? "an NDArray"
                         : tuple == 1 ? "a tuple of NDArrays"
                                      : "an NDArray or a tuple of NDArrays",
                         Py_TYPE(op)->tp_name, Py_TYPE(value)->tp_name);
            return -1;
        }
    }
    Py_XSETREF(Tensor_CAST(op)->cached_data,
               (value == NULL || value == Py_None) ? NULL : Py_NewRef(value));
    return 0;
}
static PyObject *get_requires_grad(PyObject *op, void *c) {
    (void)c;
    return PyBool_FromLong(Tensor_CAST(op)->requires_grad);
}
static int set_requires_grad(PyObject *op, PyObject *value, void *c) {
    (void)c;
    int v = value ? PyObject_IsTrue(value) : 0;
    if (v < 0) return -1;
    Tensor_CAST(op)->requires_grad = v;
    return 0;
}
static PyObject *get_grad(PyObject *op, void *c) {
    (void)c;
    return Py_NewRef(Tensor_CAST(op)->grad ? Tensor_CAST(op)->grad : Py_None);
}
static int set_grad(PyObject *op, PyObject *value, void *c) {
    (void)c;
    if (value != NULL && value != Py_None) {
        needle_state *st = state_of_value(op);
        if (st == NULL) return -1;
        if (!is_value(st, value)) {
            PyErr_Format(PyExc_TypeError, "grad must be a Tensor or None, got %.100s",
                         Py_TYPE(value)->tp_name);
            return -1;
        }
    }
    Py_XSETREF(Tensor_CAST(op)->grad,
               (value == NULL || value == Py_None) ? NULL : Py_NewRef(value));
    return 0;
}
static PyObject *get_num_outputs(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromSsize_t(Tensor_CAST(op)->num_outputs);
}
static int set_num_outputs(PyObject *op, PyObject *value, void *c) {
    (void)c;
    int n = 1;
    if (value != NULL && parse_int_param(value, "num_outputs", 1, INT_MAX, &n) < 0) return -1;
    Tensor_CAST(op)->num_outputs = n;
    return 0;
}

static PyObject *value_detach(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    PyObject *data = realize(st, op); /* held across make_const, which allocates */
    if (data == NULL) return NULL;
    PyObject *r = make_const(st, data, 0);
    Py_DECREF(data);
    return r;
}

static PyObject *get_data(PyObject *op, void *c) {
    (void)c;
    return value_detach(op, NULL);
}
static int set_data(PyObject *op, PyObject *value, void *c) {
    (void)c;
    needle_state *st = state_of_value(op);
    if (st == NULL) return -1;
    if (value == NULL || !is_tensor(st, value)) {
        PyErr_SetString(PyExc_TypeError, "data must be set to a Tensor");
        return -1;
    }
    PyObject *data = realize(st, value);
    if (data == NULL) return -1;
    Py_XSETREF(Tensor_CAST(op)->cached_data, data);
    return 0;
}

static PyObject *data_attr(PyObject *op, const char *name) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    PyObject *data = realize(st, op);
    if (data == NULL) return NULL;
    PyObject *r = PyObject_GetAttrString(data, name);
    Py_DECREF(data);
    return r;
}
static PyObject *get_shape(PyObject *op, void *c) {
    (void)c;
    return data_attr(op, "shape");
}
static PyObject *get_device(PyObject *op, void *c) {
    (void)c;
    return data_attr(op, "device");
}
static PyObject *get_ndim(PyObject *op, void *c) {
    (void)c;
    return data_attr(op, "ndim");
}
static PyObject *get_size(PyObject *op, void *c) {
    (void)c;
    return data_attr(op, "size");
}
static PyObject *get_dtype(PyObject *op, void *c) {
    (void)c;
    return data_attr(op, "dtype");
}

/* -------------------------------------------------------- methods */

/* copy_(src), torch.Tensor.copy_: src's values (a Tensor, an NDArray, a NumPy
 * array, a list or a number; broadcast to self's shape, converted to its
 * dtype, moved to its device) written into self's memory in place, so that a
 * CUDA graph's static inputs take a new batch without a new address. Returns
 * self. The course's tensors require grad by default and its optimizers
 * write leaves' data, so unlike PyTorch a leaf that requires grad may be
 * written (as `.data = ...` may). No gradient is recorded to src: a src that
 * is an op's output in a recorded graph (grad enabled) is refused, where
 * PyTorch would pass the gradient on, rather than cut off silently. */
static PyObject *value_copy_(PyObject *op, PyObject *src) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    PyObject *values;
    if (is_tensor(st, src)) {
        if (is_recording() && Tensor_CAST(src)->requires_grad && Tensor_CAST(src)->op != NULL) {
            PyErr_SetString(PyExc_RuntimeError,
                            "copy_: src is an op's output that requires grad, and needle's copy_ "
                            "records no gradient to it; copy src.detach(), or copy under "
                            "needle.no_grad()");
            return NULL;
        }
        values = realize(st, src);
    } else {
        values = Py_NewRef(src);
    }
    if (values == NULL) return NULL;
    PyObject *dst = realize(st, op); /* held: the conversions below allocate */
    if (dst == NULL) {
        Py_DECREF(values);
        return NULL;
    }
    int rc = -1;
    if (PyTuple_Check(dst) || PyTuple_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "copy_: a TensorTuple has no single value to copy");
    } else {
        PyObject *moved = values;
        Py_INCREF(moved);
        /* Another device's array comes over first (the setitem below keeps
         * to one device). */
        if (ndarray_check(st, values)) {
            PyObject *dst_device = PyObject_GetAttrString(dst, "device");
            PyObject *src_device = dst_device ? PyObject_GetAttrString(values, "device") : NULL;
            int same = src_device ? PyObject_RichCompareBool(dst_device, src_device, Py_EQ) : -1;
            Py_XDECREF(src_device);
            if (same == 0) Py_SETREF(moved, PyObject_CallMethod(values, "to", "O", dst_device));
            else if (same < 0) Py_CLEAR(moved);
            Py_XDECREF(dst_device);
        }
        if (moved != NULL) rc = PyObject_SetItem(dst, Py_Ellipsis, moved);
        Py_XDECREF(moved);
    }
    Py_DECREF(dst);
    Py_DECREF(values);
    return rc < 0 ? NULL : Py_NewRef(op);
}

static PyObject *value_realize_cached_data(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    return realize(st, op);
}

static PyObject *value_is_leaf(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(Tensor_CAST(op)->op == NULL);
}

static PyObject *value_numpy(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    PyObject *data = realize(st, op);
    if (data == NULL) return NULL;
    PyObject *r = NULL;
    if (PyTuple_Check(data))
        PyErr_SetString(PyExc_TypeError, "a TensorTuple has no single NumPy value; index it first");
    else r = PyObject_CallMethod(data, "numpy", NULL);
    Py_DECREF(data);
    return r;
}

/* _init(op, inputs, *, num_outputs=1, cached_data=None, requires_grad=None) */
static PyObject *value_init_fields(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"op", "inputs", "num_outputs", "cached_data", "requires_grad", NULL};
    PyObject *node_op, *inputs, *cached = Py_None,
                                *
        requires
    = Py_None;
    Py_ssize_t num_outputs = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$nOO:_init", kwlist, &node_op, &inputs,
                                     &num_outputs, &cached, &requires))
        return NULL;
    if (num_outputs < 1) {
        PyErr_Format(PyExc_ValueError, "num_outputs must be at least 1, got %zd", num_outputs);
        return NULL;
    }
    if (set_inputs(op, inputs, NULL) < 0 || set_op(op, node_op, NULL) < 0 ||
        set_cached_data(op, cached, NULL) < 0)
        return NULL;
    TensorObject *self = Tensor_CAST(op);
    self->num_outputs = num_outputs;
    if (requires == Py_None) {
        self->requires_grad = inputs_require_grad(self->inputs);
    } else {
        int v = PyObject_IsTrue(requires);
        if (v < 0) return NULL;
        self->requires_grad = v;
    }
    Py_RETURN_NONE;
}

static PyObject *value_retain_grad(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    Tensor_CAST(op)->retains_grad = 1;
    Py_RETURN_NONE;
}

static PyObject *get_retains_grad(PyObject *op, void *c) {
    (void)c;
    return PyBool_FromLong(Tensor_CAST(op)->retains_grad);
}

/* Tensor.make_from_op(op, inputs) / TensorTuple.make_from_op(op, inputs) */
static PyObject *make_from_op_method(PyObject *cls, PyObject *const *args, Py_ssize_t nargs,
                                     int tuple) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "make_from_op(op, inputs) takes two arguments");
        return NULL;
    }
    needle_state *st = state_of_type((PyTypeObject *)cls);
    if (st == NULL) return NULL;
    PyObject *inputs = PySequence_Tuple(args[1]);
    if (inputs == NULL) return NULL;
    PyObject *result = make_from_op(st, args[0], inputs, tuple);
    Py_DECREF(inputs);
    return result;
}
static PyObject *tensor_make_from_op(PyObject *cls, PyObject *const *args, Py_ssize_t nargs) {
    (void)cls;
    return make_from_op_method(cls, args, nargs, 0);
}
static PyObject *tuple_make_from_op(PyObject *cls, PyObject *const *args, Py_ssize_t nargs) {
    return make_from_op_method(cls, args, nargs, 1);
}

/* make_const(data, requires_grad=False): data is an NDArray or a Tensor. */
static PyObject *value_make_const(PyObject *cls, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "requires_grad", NULL};
    PyObject *data;
    int requires_grad = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p:make_const", kwlist, &data, &requires_grad))
        return NULL;
    needle_state *st = state_of_type((PyTypeObject *)cls);
    if (st == NULL) return NULL;
    if (!is_value(st, data)) {
        if (!node_data_ok(st, data, -1)) {
            PyErr_Format(PyExc_TypeError,
                         "make_const needs a Tensor, an NDArray or a tuple of NDArrays, got %.100s",
                         Py_TYPE(data)->tp_name);
            return NULL;
        }
        return make_const(st, data, requires_grad);
    }
    PyObject *array = realize(st, data);
    if (array == NULL) return NULL;
    PyObject *r = make_const(st, array, requires_grad);
    Py_DECREF(array);
    return r;
}

/* The node's data as text (through NumPy), wrapped in fmt ("%S"). */
static PyObject *data_text(PyObject *op, const char *fmt) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    PyObject *data = realize(st, op);
    if (data == NULL) return NULL;
    PyObject *values =
        ndarray_check(st, data) ? PyObject_CallMethod(data, "numpy", NULL) : Py_NewRef(data);
    Py_DECREF(data);
    if (values == NULL) return NULL;
    PyObject *r = PyUnicode_FromFormat(fmt, values);
    Py_DECREF(values);
    return r;
}

static PyObject *tensor_repr(PyObject *op) { return data_text(op, "needle.Tensor(%S)"); }
static PyObject *tensor_str(PyObject *op) { return data_text(op, "%S"); }

static PyGetSetDef value_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"op", get_op, set_op, "The Op that made this node (None for a leaf).", NULL},
    {"inputs", get_inputs, set_inputs, "The input nodes (a list).", NULL},
    {"cached_data", get_cached_data, set_cached_data, "The computed NDArray (or tuple of them).",
     NULL},
    {"requires_grad", get_requires_grad, set_requires_grad, "Whether gradients flow to this node.",
     NULL},
    {"grad", get_grad, set_grad, "The gradient written by backward (None until then).", NULL},
    {"num_outputs", get_num_outputs, set_num_outputs, NULL, NULL},
    {"retains_grad", get_retains_grad, NULL, "Whether backward writes .grad on this non-leaf.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyGetSetDef tensor_getset[] = {
    {"data", get_data, set_data,
     "A detached Tensor sharing this node's data; setting it replaces "
     "the data in place (the node keeps its identity).",
     NULL},
    {"shape", get_shape, NULL, "The shape, a tuple of ints.", NULL},
    {"dtype", get_dtype, NULL, "Its data's element type ('float32' unless made otherwise).", NULL},
    {"device", get_device, NULL, "The device holding the data.", NULL},
    {"ndim", get_ndim, NULL, "Number of dimensions.", NULL},
    {"size", get_size, NULL, "Number of elements.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef value_methods[] = {
    {"copy_", value_copy_, METH_O,
     "copy_($self, src, /)\n--\n\nWrites src (a Tensor, NDArray, NumPy array, list or number; "
     "broadcast to self's shape, converted to its dtype and device) into self's memory in place "
     "and returns self, as torch.Tensor.copy_ (no gradient is recorded to src)."},
    {"realize_cached_data", value_realize_cached_data, METH_NOARGS,
     "realize_cached_data($self, /)\n--\n\nThe node's data, computed if needed."},
    {"is_leaf", value_is_leaf, METH_NOARGS, "is_leaf($self, /)\n--\n\nTrue when op is None."},
    {"detach", value_detach, METH_NOARGS,
     "detach($self, /)\n--\n\nA new leaf sharing this node's data, with requires_grad=False."},
    {"numpy", value_numpy, METH_NOARGS,
     "numpy($self, /)\n--\n\nThe data as a NumPy array (a copy)."},
    {"_init", (PyCFunction)(void (*)(void))value_init_fields, METH_VARARGS | METH_KEYWORDS,
     "_init($self, op, inputs, /, *, num_outputs=1, cached_data=None, requires_grad=None)\n--\n\n"
     "Sets the node's fields, as the course's Value._init."},
    {"retain_grad", value_retain_grad, METH_NOARGS,
     "retain_grad($self, /)\n--\n\nAsks backward to write .grad on this non-leaf node too."},
    {"register_hook", value_register_hook, METH_O,
     "register_hook($self, hook, /)\n--\n\nhook(grad) runs when the gradient with respect to "
     "this tensor is computed, before it is written to .grad or passed on; a Tensor it returns "
     "(same shape and dtype) replaces the gradient. Returns a handle whose remove() takes it "
     "off. RuntimeError on a tensor that does not require grad."},
    {"register_post_accumulate_grad_hook", value_register_post_accumulate_grad_hook, METH_O,
     "register_post_accumulate_grad_hook($self, hook, /)\n--\n\nOn a leaf: hook(tensor) runs "
     "once backward has written this tensor's .grad (it must return None). Returns a handle "
     "whose remove() takes it off. RuntimeError on a non-leaf or a tensor that does not "
     "require grad."},
    {"make_const", (PyCFunction)(void (*)(void))value_make_const,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "make_const(data, requires_grad=False)\n--\n\nA new leaf holding data (an NDArray or a "
     "Tensor's)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef value_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(TensorObject, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(TensorObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot value_slots[] = {
    {Py_tp_doc, "A node of the computation graph: op, inputs, cached_data, requires_grad."},
    {Py_tp_new, value_new},
    {Py_tp_dealloc, value_dealloc},
    {Py_tp_traverse, value_traverse},
    {Py_tp_clear, value_clear},
    {Py_tp_methods, value_methods},
    {Py_tp_getset, value_getset},
    {Py_tp_members, value_members},
    {0, NULL},
};

static PyType_Spec value_spec = {
    .name = "needle.autograd.Value",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = value_slots,
};

#define BACKWARD_METHOD                                                                         \
    {"backward", (PyCFunction)(void (*)(void))tensor_backward, METH_VARARGS | METH_KEYWORDS,    \
     "backward($self, /, out_grad=None, create_graph=False)\n--\n\nComputes gradients of this " \
     "tensor with respect to the graph's leaves (ones as the seed by default). create_graph "   \
     "records the gradients as a graph in cycle_free mode too, so a .grad can be "              \
     "differentiated again. Raises RuntimeError on a tensor with no graph."}

/* Tensor: the Value methods (inherited) plus its operators (tensor_ops.c),
 * backward (autograd.c) and DLPack export (array/interop.c). */
static PyMethodDef tensor_methods[] = {
    {"make_from_op", (PyCFunction)(void (*)(void))tensor_make_from_op, METH_FASTCALL | METH_CLASS,
     "make_from_op(op, inputs)\n--\n\nApplies op to inputs, recording a node when gradients are "
     "needed."},
    {"sum", (PyCFunction)(void (*)(void))tensor_sum, METH_VARARGS | METH_KEYWORDS,
     "sum($self, /, axes=None)\n--\n\nSummation over axes (all when None)."},
    {"reshape", tensor_reshape, METH_VARARGS, "reshape($self, /, *shape)\n--\n\nReshape."},
    {"broadcast_to", tensor_broadcast_to, METH_VARARGS,
     "broadcast_to($self, /, *shape)\n--\n\nBroadcastTo (NumPy rules)."},
    {"transpose", (PyCFunction)(void (*)(void))tensor_transpose, METH_VARARGS | METH_KEYWORDS,
     "transpose($self, /, axes=None)\n--\n\nSwaps two axes (the last two when None)."},
    {"matmul", tensor_matmul_method, METH_O, "matmul($self, other, /)\n--\n\nself @ other."},
/* One method per row of the catalogue (csrc/ewise_ops.h). */
/* clang-format off */
#define TENSOR_UNARY_METHOD(A, id, name, Class, doc, formula) \
    {#name, tensor_unary_##name, METH_NOARGS, #name "($self, /)\n--\n\n" doc " (" #Class ")"},
    ND_EWISE_UNARY_OPS(TENSOR_UNARY_METHOD, )
#undef TENSOR_UNARY_METHOD
/* One method per binary row that names one (maximum, minimum). */
#define TENSOR_BINARY_METHOD(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    ND_EW_IF(method, {#method, tensor_binary_##name, METH_O,                                      \
                      #method "($self, other, /)\n--\n\n" doc " other: a Tensor (" #Ewise        \
                      ") or a number (" #Scalar ")."},)
    ND_EWISE_BINARY_OPS(TENSOR_BINARY_METHOD, )
#undef TENSOR_BINARY_METHOD
    /* clang-format on */
    {"clamp", (PyCFunction)(void (*)(void))tensor_clamp, METH_VARARGS | METH_KEYWORDS,
     "clamp($self, /, min=None, max=None)\n--\n\nx limited to [min, max] (numbers; either may "
     "be None); the gradient passes where min <= x <= max."},
    {"astype", tensor_astype, METH_O,
     "astype($self, dtype, /)\n--\n\nThis tensor in dtype: itself when it has it, else a Cast "
     "node whose gradient is cast back."},
    BACKWARD_METHOD,
    {"__dlpack__", (PyCFunction)(void (*)(void))interop_tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "The data's DLPack capsule (shares memory)."},
    {"__dlpack_device__", interop_tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self, /)\n--\n\nThe data's DLPack device."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot tensor_slots[] = {
    {Py_tp_doc, "Tensor(array, *, device=None, dtype=None, requires_grad=True, **kwargs)\n--\n\n"
                "A float32 array in the computation graph."},
    {Py_tp_init, tensor_init},
    {Py_tp_traverse, value_traverse},
    {Py_tp_clear, value_clear},
    {Py_tp_repr, tensor_repr},
    {Py_tp_str, tensor_str},
    {Py_tp_methods, tensor_methods},
    {Py_tp_getset, tensor_getset},
    {Py_nb_add, tensor_add},
    {Py_nb_subtract, tensor_sub},
    {Py_nb_multiply, tensor_mul},
    {Py_nb_true_divide, tensor_div},
    {Py_nb_power, tensor_pow},
    {Py_nb_negative, tensor_neg},
    {Py_nb_absolute, tensor_abs_slot},
    {Py_nb_matrix_multiply, tensor_matmul},
    {Py_mp_subscript, tensor_getitem},
    {0, NULL},
};

static PyType_Spec tensor_spec = {
    .name = "needle.autograd.Tensor",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = tensor_slots,
};

/* TensorTuple: the Value methods plus its sequence protocol (tensor_ops.c). */
static PyMethodDef tensor_tuple_methods[] = {
    {"make_from_op", (PyCFunction)(void (*)(void))tuple_make_from_op, METH_FASTCALL | METH_CLASS,
     "make_from_op(op, inputs)\n--\n\nApplies a tuple op to inputs."},
    {"tuple", tuple_as_tuple, METH_NOARGS,
     "tuple($self, /)\n--\n\nThe items as a tuple of Tensors."},
    BACKWARD_METHOD,
    {NULL, NULL, 0, NULL},
};

static PyType_Slot tensor_tuple_slots[] = {
    {Py_tp_doc, "A tuple of tensors that is one graph node."},
    {Py_tp_methods, tensor_tuple_methods},
    {Py_tp_traverse, value_traverse},
    {Py_tp_clear, value_clear},
    {Py_mp_length, tuple_length},
    {Py_sq_length, tuple_length},
    {Py_mp_subscript, tuple_item},
    {Py_sq_item, tuple_sq_item},
    {Py_nb_add, tuple_add},
    {Py_tp_repr, tuple_repr},
    {Py_tp_str, tuple_repr},
    {0, NULL},
};

static PyType_Spec tensor_tuple_spec = {
    .name = "needle.autograd.TensorTuple",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = tensor_tuple_slots,
};

int tensor_types_init(PyObject *module, needle_state *st) {
    autograd_state *ag = st->autograd;
    ag->value_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &value_spec, NULL);
    if (ag->value_type == NULL) return -1;
    ag->tensor_type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &tensor_spec, (PyObject *)ag->value_type);
    if (ag->tensor_type == NULL) return -1;
    /* NumPy defers to Tensor's operators (np_array * t calls t.__rmul__)
     * instead of making an object array of Tensors, one per element. */
    if (PyDict_SetItemString(ag->tensor_type->tp_dict, "__array_ufunc__", Py_None) < 0) return -1;
    PyType_Modified(ag->tensor_type);
    ag->tensor_tuple_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &tensor_tuple_spec,
                                                                     (PyObject *)ag->value_type);
    if (ag->tensor_tuple_type == NULL) return -1;
    if (PyModule_AddType(module, ag->value_type) < 0 ||
        PyModule_AddType(module, ag->tensor_type) < 0 ||
        PyModule_AddType(module, ag->tensor_tuple_type) < 0)
        return -1;
    return 0;
}
