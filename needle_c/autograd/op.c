/* op.c: Op, TensorOp, TensorTupleOp and the built-in op classes (one heap
 * type per op, all sharing OpObject), the table of built-in ops, and their
 * constructor parameters. Ops run through dispatch.c.
 *
 * A built-in op computes and differentiates in C (op_impls); a Python
 * subclass of TensorOp supplies compute() and gradient() as in the course.
 */
#include "tensor.h"

#include "ops_util.h"

#include <limits.h>
#include <structmember.h>

const op_info op_table[OP_KIND_COUNT] = {
    [OP_PYTHON] = {"TensorOp", SIG_NONE, ARITY_ANY, IN_ARRAYS, 0},
#define X(kind, name, sig, arity, inputs, tuple) [kind] = {name, sig, arity, inputs, tuple},
    NEEDLE_OPS(X)
#undef X
};

static op_kind kind_of_type(autograd_state *ag, PyTypeObject *type) {
    for (int k = 1; k < OP_KIND_COUNT; k++)
        if (ag->op_types[k] != NULL && PyType_IsSubtype(type, ag->op_types[k])) return (op_kind)k;
    return OP_PYTHON;
}

/* A built-in op runs its C code directly only when its class is exactly the
 * built-in one; Python subclasses go through their (possibly overridden)
 * compute/gradient methods. */
int op_dispatches_in_c(needle_state *st, PyObject *op) {
    if (!PyObject_TypeCheck(op, st->autograd->op_type)) return 0;
    op_kind kind = Op_CAST(op)->kind;
    return kind != OP_PYTHON && Py_IS_TYPE(op, st->autograd->op_types[kind]);
}

/* ------------------------------------------------------- GC quartet */

static PyObject *op_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)args;
    (void)kwargs;
    needle_state *st = state_of_type(type);
    if (st == NULL) return NULL;
    OpObject *self = (OpObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->kind = kind_of_type(st->autograd, type);
    self->p.stride = 1;
    registry_link_op((PyObject *)self);
    return (PyObject *)self;
}

/* Visits the type, then the instance dict and the getitem key. */
int op_traverse(PyObject *op, visitproc visit, void *arg) {
    if (!autograd_gc_visible()) return 0; /* the gc_blind demonstration */
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(Op_CAST(op)->dict);
    Py_VISIT(Op_CAST(op)->p.key);
    return 0;
}

static int op_clear(PyObject *op) {
    Py_CLEAR(Op_CAST(op)->dict);
    Py_CLEAR(Op_CAST(op)->p.key);
    return 0;
}

/* Untracks, clears, frees, drops the type. */
static void op_dealloc(PyObject *op) {
    PyTypeObject *tp = Py_TYPE(op);
    registry_unlink_op(op); /* first: see value_dealloc */
    PyObject_GC_UnTrack(op);
    if (Op_CAST(op)->weakreflist != NULL) PyObject_ClearWeakRefs(op);
    op_clear(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* ------------------------------------------------------ parameters */

/* Integer parameters (dilation, stride, padding) stay below this: the
 * engine's shape arithmetic is int64, and no real image or kernel is near. */
#define OP_INT_PARAM_MAX 100000

int op_parse_axes(needle_state *st, PyObject *obj, op_params *p) {
    p->axes_given = 0;
    p->naxes = 0;
    if (obj == NULL || obj == Py_None) return 0;
    if (parse_axes(st, obj, &p->naxes, p->axes) < 0) return -1;
    p->axes_given = 1;
    return 0;
}

int axes_to_mask(needle_state *st, const op_params *p, int ndim, uint32_t *mask) {
    return axes_mask(st, p->naxes, p->axes_given ? p->axes : NULL, ndim, mask);
}

static int parse_required_axes(needle_state *st, PyObject *obj, op_params *p) {
    if (obj == Py_None) {
        PyErr_SetString(PyExc_TypeError, "axes must be given");
        return -1;
    }
    return op_parse_axes(st, obj, p);
}

static int parse_key(PyObject *obj, op_params *p) {
    PyObject *key = PyTuple_Check(obj) ? Py_NewRef(obj) : PyTuple_Pack(1, obj);
    if (key == NULL) return -1;
    Py_XSETREF(p->key, key);
    return 0;
}

/* Named arguments of a signature, in order. */
static const char *const *signature_names(op_signature sig, int *count) {
    static const char *const none[] = {NULL};
    static const char *const scalar[] = {"scalar"};
    static const char *const two[] = {"c0", "c1"};
    static const char *const axes[] = {"axes"};
    static const char *const shape[] = {"shape"};
    static const char *const axis[] = {"axis"};
    static const char *const dil[] = {"axes", "dilation"};
    static const char *const conv[] = {"stride", "padding"};
    static const char *const index[] = {"index"};
    static const char *const key[] = {"key"};
    static const char *const key_shape[] = {"key", "shape"};
    static const char *const rows[] = {"num_rows"};
    static const char *const dtype[] = {"dtype"};
    switch (sig) {
    case SIG_SCALAR: *count = 1; return scalar;
    case SIG_TWO_SCALARS: *count = 2; return two;
    case SIG_AXES_OPT:
    case SIG_AXES: *count = 1; return axes;
    case SIG_SHAPE: *count = 1; return shape;
    case SIG_AXIS: *count = 1; return axis;
    case SIG_AXES_DILATION: *count = 2; return dil;
    case SIG_CONV: *count = 2; return conv;
    case SIG_INDEX: *count = 1; return index;
    case SIG_KEY: *count = 1; return key;
    case SIG_KEY_SHAPE: *count = 2; return key_shape;
    case SIG_ROWS: *count = 1; return rows;
    case SIG_DTYPE: *count = 1; return dtype;
    default: *count = 0; return none;
    }
}

/* Reshape may infer one dim (-1); BroadcastTo and ScatterSlice name every dim. */
static int parse_shape_param(PyObject *obj, op_kind kind, op_params *p) {
    return parse_shape(obj, kind == OP_RESHAPE ? SHAPE_INFER : SHAPE_EXACT, &p->ndim, p->shape);
}

static int op_init(PyObject *op, PyObject *args, PyObject *kwargs) {
    OpObject *self = Op_CAST(op);
    if (self->kind == OP_PYTHON) return 0; /* a Python op's own __init__ sets its fields */
    op_signature sig = op_table[self->kind].sig;
    int count;
    const char *const *names = signature_names(sig, &count);
    PyObject *values[2] = {NULL, NULL};
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if (nargs > count) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)",
                     op_table[self->kind].name, count, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) values[i] = PyTuple_GET_ITEM(args, i);
    if (kwargs != NULL) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kwargs, &pos, &key, &value)) {
            int found = 0;
            for (int i = 0; i < count; i++)
                if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
                    if (values[i] != NULL) {
                        PyErr_Format(PyExc_TypeError, "%s() got multiple values for '%s'",
                                     op_table[self->kind].name, names[i]);
                        return -1;
                    }
                    values[i] = value;
                    found = 1;
                }
            if (!found) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R",
                             op_table[self->kind].name, key);
                return -1;
            }
        }
    }
    op_params *p = &self->p;
    needle_state *st = state_of_type(Py_TYPE(op));
    if (st == NULL) return -1;
    int required = sig == SIG_NONE || sig == SIG_AXES_OPT || sig == SIG_CONV ? 0 : count;
    for (int i = 0; i < required; i++)
        if (values[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'",
                         op_table[self->kind].name, names[i]);
            return -1;
        }
    switch (sig) {
    case SIG_NONE: return 0;
    case SIG_SCALAR: return parse_scalar_param(values[0], &p->scalar);
    case SIG_TWO_SCALARS:
        return parse_scalar_param(values[0], &p->scalar) < 0
                   ? -1
                   : parse_scalar_param(values[1], &p->scalar2);
    case SIG_AXES_OPT: return op_parse_axes(st, values[0], p);
    case SIG_AXES: return parse_required_axes(st, values[0], p);
    case SIG_SHAPE: return parse_shape_param(values[0], self->kind, p);
    case SIG_AXIS: return parse_axis(st, values[0], &p->axis);
    case SIG_AXES_DILATION:
        return parse_required_axes(st, values[0], p) < 0
                   ? -1
                   : parse_int_param(values[1], "dilation", 0, OP_INT_PARAM_MAX, &p->dilation);
    case SIG_CONV:
        if (values[0] && parse_int_param(values[0], "stride", 1, OP_INT_PARAM_MAX, &p->stride) < 0)
            return -1;
        if (values[1] &&
            parse_int_param(values[1], "padding", 0, OP_INT_PARAM_MAX, &p->padding) < 0)
            return -1;
        return 0;
    case SIG_INDEX: {
        int index;
        if (parse_int_param(values[0], "index", -INT_MAX, INT_MAX, &index) < 0) return -1;
        p->index = index;
        return 0;
    }
    case SIG_KEY: return parse_key(values[0], p);
    case SIG_KEY_SHAPE:
        return parse_key(values[0], p) < 0 ? -1 : parse_shape_param(values[1], self->kind, p);
    case SIG_ROWS: {
        int rows;
        if (parse_int_param(values[0], "num_rows", 0, INT_MAX, &rows) < 0) return -1;
        p->index = rows;
        return 0;
    }
    case SIG_DTYPE: return parse_dtype_param(values[0], &p->dtype);
    }
    return 0;
}

/* --------------------------------------------------------- getters */

static PyObject *get_scalar(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(Op_CAST(op)->p.scalar);
}
static PyObject *get_scalar2(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(Op_CAST(op)->p.scalar2);
}
static PyObject *get_axes(PyObject *op, void *c) {
    (void)c;
    op_params *p = &Op_CAST(op)->p;
    if (!p->axes_given) Py_RETURN_NONE;
    PyObject *t = PyTuple_New(p->naxes);
    for (int i = 0; t && i < p->naxes; i++) PyTuple_SET_ITEM(t, i, PyLong_FromLong(p->axes[i]));
    return t;
}
static PyObject *get_shape(PyObject *op, void *c) {
    (void)c;
    op_params *p = &Op_CAST(op)->p;
    PyObject *t = PyTuple_New(p->ndim);
    for (int i = 0; t && i < p->ndim; i++) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(p->shape[i]));
    return t;
}
static PyObject *get_int_field(PyObject *op, void *c) {
    op_params *p = &Op_CAST(op)->p;
    const char *name = c;
    if (strcmp(name, "axis") == 0) return PyLong_FromLong(p->axis);
    if (strcmp(name, "dilation") == 0) return PyLong_FromLong(p->dilation);
    if (strcmp(name, "stride") == 0) return PyLong_FromLong(p->stride);
    if (strcmp(name, "padding") == 0) return PyLong_FromLong(p->padding);
    return PyLong_FromSsize_t(p->index);
}
static PyObject *get_key(PyObject *op, void *c) {
    (void)c;
    return Py_NewRef(Op_CAST(op)->p.key ? Op_CAST(op)->p.key : Py_None);
}

/* Only a Cast has a dtype; the other ops compute in their inputs' dtypes. */
static PyObject *get_dtype_field(PyObject *op, void *c) {
    (void)c;
    if (Op_CAST(op)->kind != OP_CAST) Py_RETURN_NONE;
    return PyUnicode_FromString(nd_dtype_name(Op_CAST(op)->p.dtype));
}

static PyGetSetDef builtin_op_getset[] = {
    {"scalar", get_scalar, NULL, "The scalar of a scalar op.", NULL},
    {"c0", get_scalar, NULL, NULL, NULL},
    {"c1", get_scalar2, NULL, NULL, NULL},
    {"axes", get_axes, NULL, "The axes (None for all).", NULL},
    {"shape", get_shape, NULL, "The target shape.", NULL},
    {"axis", get_int_field, NULL, NULL, "axis"},
    {"dilation", get_int_field, NULL, NULL, "dilation"},
    {"stride", get_int_field, NULL, NULL, "stride"},
    {"padding", get_int_field, NULL, NULL, "padding"},
    {"index", get_int_field, NULL, NULL, "index"},
    {"num_rows", get_int_field, NULL, NULL, "index"},
    {"key", get_key, NULL, "The index of a getitem op.", NULL},
    {"dtype", get_dtype_field, NULL, "The target dtype of a Cast (None for other ops).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* ----------------------------------------------- compute / gradient */

static PyObject *op_compute(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    OpObject *self = Op_CAST(op);
    if (self->kind == OP_PYTHON) {
        PyErr_Format(PyExc_NotImplementedError, "%.100s does not implement compute()",
                     Py_TYPE(op)->tp_name);
        return NULL;
    }
    return compute_arrays(st, self->kind, &self->p, args, nargs);
}

static PyObject *op_gradient(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    OpObject *self = Op_CAST(op);
    if (self->kind == OP_PYTHON) {
        PyErr_Format(PyExc_NotImplementedError, "%.100s does not implement gradient()",
                     Py_TYPE(op)->tp_name);
        return NULL;
    }
    if (nargs != 2 || !is_value(st, args[0]) || !is_value(st, args[1])) {
        PyErr_SetString(PyExc_TypeError, "gradient(out_grad, node) takes two Tensors");
        return NULL;
    }
    return builtin_gradient(st, self, args[0], args[1]);
}

/* gradient() as a tuple; built-in ops skip the Python method lookup. */
static PyObject *op_gradient_as_tuple_method(PyObject *op, PyObject *const *args,
                                             Py_ssize_t nargs) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    if (nargs != 2 || !is_value(st, args[1])) {
        PyErr_SetString(PyExc_TypeError, "gradient_as_tuple(out_grad, node) takes two Tensors");
        return NULL;
    }
    return run_gradient(st, op, args[0], args[1]);
}

static PyObject *op_base_call(PyObject *op, PyObject *args, PyObject *kwargs) {
    (void)args;
    (void)kwargs;
    PyErr_Format(PyExc_NotImplementedError,
                 "%.100s cannot be called: subclass TensorOp or TensorTupleOp",
                 Py_TYPE(op)->tp_name);
    return NULL;
}

static PyObject *call_op(PyObject *op, PyObject *args, PyObject *kwargs, int tuple) {
    needle_state *st = state_of_value(op);
    if (st == NULL) return NULL;
    OpObject *self = Op_CAST(op);
    if (self->kind == OP_TUPLE_GET_ITEM) {
        /* The course's fold_const: indexing a make_tuple node gives its input. */
        int fold = 1;
        PyObject *f = kwargs ? PyDict_GetItemString(kwargs, "fold_const") : NULL;
        if (f != NULL && (fold = PyObject_IsTrue(f)) < 0) return NULL;
        if (fold && PyTuple_GET_SIZE(args) == 1) {
            PyObject *folded = fold_make_tuple_item(st, PyTuple_GET_ITEM(args, 0), self->p.index);
            if (folded != NULL || PyErr_Occurred()) return folded;
        }
    } else if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_Format(PyExc_TypeError, "%.100s() takes no keyword arguments", Py_TYPE(op)->tp_name);
        return NULL;
    }
    return make_from_op(st, op, args,
                        self->kind == OP_PYTHON ? tuple : op_table[self->kind].tuple_output);
}

static PyObject *tensor_op_call(PyObject *op, PyObject *args, PyObject *kwargs) {
    return call_op(op, args, kwargs, 0);
}

static PyObject *tensor_tuple_op_call(PyObject *op, PyObject *args, PyObject *kwargs) {
    return call_op(op, args, kwargs, 1);
}

static PyObject *op_repr(PyObject *op) {
    OpObject *self = Op_CAST(op);
    if (self->kind == OP_PYTHON) return PyUnicode_FromFormat("<%s op>", Py_TYPE(op)->tp_name);
    return PyUnicode_FromFormat("%s()", op_table[self->kind].name);
}

static PyGetSetDef op_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef op_methods[] = {
    {"compute", (PyCFunction)(void (*)(void))op_compute, METH_FASTCALL,
     "compute($self, /, *args)\n--\n\nThe forward computation on NDArrays."},
    {"gradient", (PyCFunction)(void (*)(void))op_gradient, METH_FASTCALL,
     "gradient($self, out_grad, node, /)\n--\n\nThe partial adjoints for node's inputs."},
    {"gradient_as_tuple", (PyCFunction)(void (*)(void))op_gradient_as_tuple_method, METH_FASTCALL,
     "gradient_as_tuple($self, out_grad, node, /)\n--\n\ngradient() as a tuple."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef op_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(OpObject, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(OpObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot op_slots[] = {
    {Py_tp_doc, "The base of all ops: compute() on NDArrays, gradient() on Tensors."},
    {Py_tp_new, op_new},
    {Py_tp_init, op_init},
    {Py_tp_dealloc, op_dealloc},
    {Py_tp_traverse, op_traverse},
    {Py_tp_clear, op_clear},
    {Py_tp_call, op_base_call},
    {Py_tp_methods, op_methods},
    {Py_tp_members, op_members},
    {Py_tp_getset, op_getset},
    {Py_tp_repr, op_repr},
    {0, NULL},
};

static PyType_Spec op_spec = {
    .name = "needle.autograd.Op",
    .basicsize = sizeof(OpObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = op_slots,
};

static PyType_Slot tensor_op_slots[] = {
    {Py_tp_traverse, op_traverse},
    {Py_tp_clear, op_clear},
    {Py_tp_doc, "An op with one Tensor output: op(*tensors) -> Tensor."},
    {Py_tp_call, tensor_op_call},
    {0, NULL},
};
static PyType_Spec tensor_op_spec = {
    .name = "needle.autograd.TensorOp",
    .basicsize = sizeof(OpObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = tensor_op_slots,
};

static PyType_Slot tensor_tuple_op_slots[] = {
    {Py_tp_traverse, op_traverse},
    {Py_tp_clear, op_clear},
    {Py_tp_doc, "An op with a TensorTuple output."},
    {Py_tp_call, tensor_tuple_op_call},
    {0, NULL},
};
static PyType_Spec tensor_tuple_op_spec = {
    .name = "needle.autograd.TensorTupleOp",
    .basicsize = sizeof(OpObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = tensor_tuple_op_slots,
};

static PyType_Slot builtin_op_slots[] = {
    {Py_tp_traverse, op_traverse},
    {Py_tp_clear, op_clear},
    {Py_tp_getset, builtin_op_getset},
    {0, NULL},
};

int op_types_init(PyObject *module, needle_state *st) {
    autograd_state *ag = st->autograd;
    ag->op_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &op_spec, NULL);
    if (ag->op_type == NULL) return -1;
    ag->tensor_op_type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &tensor_op_spec, (PyObject *)ag->op_type);
    if (ag->tensor_op_type == NULL) return -1;
    ag->tensor_tuple_op_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &tensor_tuple_op_spec, (PyObject *)ag->op_type);
    if (ag->tensor_tuple_op_type == NULL) return -1;
    if (PyModule_AddType(module, ag->op_type) < 0 ||
        PyModule_AddType(module, ag->tensor_op_type) < 0 ||
        PyModule_AddType(module, ag->tensor_tuple_op_type) < 0)
        return -1;
    for (int k = 1; k < OP_KIND_COUNT; k++) {
        /* Python 3.11+ copies a spec's name into the type: a local will do. */
        char name[64];
        snprintf(name, sizeof name, "needle.ops.%s", op_table[k].name);
        PyType_Spec spec = {
            .name = name,
            .basicsize = sizeof(OpObject),
            .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
            .slots = builtin_op_slots,
        };
        PyObject *base =
            (PyObject *)(op_table[k].tuple_output ? ag->tensor_tuple_op_type : ag->tensor_op_type);
        ag->op_types[k] = (PyTypeObject *)PyType_FromModuleAndSpec(module, &spec, base);
        if (ag->op_types[k] == NULL || PyModule_AddType(module, ag->op_types[k]) < 0) return -1;
    }
    return 0;
}

PyObject *op_new_builtin(needle_state *st, op_kind kind, const op_params *p) {
    PyTypeObject *type = st->autograd->op_types[kind];
    OpObject *op = (OpObject *)type->tp_alloc(type, 0);
    if (op == NULL) return NULL;
    op->kind = kind;
    op->p = *p;
    Py_XINCREF(op->p.key);
    registry_link_op((PyObject *)op);
    return (PyObject *)op;
}
