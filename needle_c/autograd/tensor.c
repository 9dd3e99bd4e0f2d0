/* tensor.c: the graph node at the core of Value, Tensor and TensorTuple:
 * its allocation and GC slots (a node owns its op, its inputs and its data;
 * edges run from outputs to inputs only), realising a lazy node's data, and
 * the node helpers C code shares (make_const, value_shape, shapes_differ).
 *
 * What Python sees of a node (construction, properties, methods, the type
 * tables) is in tensor_type.c; nodes are computed and recorded by
 * dispatch.c; operators are in tensor_ops.c, backward in autograd.c, leak
 * diagnostics in alloc_sites.c.
 */
#include "tensor.h"

/* The runtime's module (runtime.h) answers when the object's type is exactly
 * its Tensor or TensorTuple type (an operator call needs the state every
 * time); any other type (a subclass, a Value) is looked up. */
needle_state *state_of_value(PyObject *value) {
    PyTypeObject *type = Py_TYPE(value);
    needle_state *st = needle_rt.state;
    if (st != NULL && st->autograd != NULL &&
        (type == st->autograd->tensor_type || type == st->autograd->tensor_tuple_type))
        return st;
    return state_of_type(type);
}

int is_tensor(needle_state *st, PyObject *obj) {
    return PyObject_TypeCheck(obj, st->autograd->tensor_type);
}

int is_tensor_tuple(needle_state *st, PyObject *obj) {
    return PyObject_TypeCheck(obj, st->autograd->tensor_tuple_type);
}

int is_value(needle_state *st, PyObject *obj) {
    return PyObject_TypeCheck(obj, st->autograd->value_type);
}

/* ------------------------------------------------------ GC quartet */

PyObject *value_alloc(PyTypeObject *type) {
    /* tp_alloc zeroes the object, so every traversed field is valid (NULL)
     * when it is tracked. */
    TensorObject *self = (TensorObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->inputs = PyTuple_New(0);
    if (self->inputs == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->num_outputs = 1;
    registry_link_value((PyObject *)self);
    alloc_site_record((PyObject *)self);
    return (PyObject *)self;
}

/* The gc_blind demonstration: while off (needle_rt.autograd.gc_visible 0),
 * every autograd tp_traverse (Values here, Ops in op.c) reports no
 * references, so the collector can neither see nor free graph cycles (an
 * extension invisible to the collector). */
int autograd_gc_visible(void) { return needle_rt.autograd.gc_visible; }

static PyObject *set_gc_visible(PyObject *module, PyObject *arg) {
    (void)module;
    int visible = PyObject_IsTrue(arg);
    if (visible < 0) return NULL;
    PyObject *previous = PyBool_FromLong(needle_rt.autograd.gc_visible);
    needle_rt.autograd.gc_visible = visible;
    return previous;
}

PyMethodDef gc_visibility_functions[] = {
    {"_set_gc_visible", set_gc_visible, METH_O,
     "_set_gc_visible(visible, /)\n--\n\nFalse makes Tensor/Op traversal report nothing (a "
     "demonstration of "
     "an extension invisible to the collector: cycles leak for good). Returns the previous value."},
    {NULL, NULL, 0, NULL},
};

/* Visits the type, then every owned reference. */
int value_traverse(PyObject *op, visitproc visit, void *arg) {
    TensorObject *self = Tensor_CAST(op);
    if (!needle_rt.autograd.gc_visible) return 0; /* the gc_blind demonstration */
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->op);
    Py_VISIT(self->inputs);
    Py_VISIT(self->cached_data);
    Py_VISIT(self->grad);
    Py_VISIT(self->grad_hooks);
    Py_VISIT(self->post_accumulate_hooks);
    Py_VISIT(self->dict);
    return 0;
}

/* Drops every owned reference (breaks cycles). inputs becomes the empty
 * tuple, not NULL: a cleared node can still be seen (a weakref callback run
 * while a scoped collection frees its garbage), and every reader assumes a
 * tuple. PyTuple_New(0) returns the shared singleton: it never allocates. */
int value_clear(PyObject *op) {
    TensorObject *self = Tensor_CAST(op);
    Py_CLEAR(self->op);
    Py_XSETREF(self->inputs, PyTuple_New(0));
    Py_CLEAR(self->cached_data);
    Py_CLEAR(self->grad);
    Py_CLEAR(self->grad_hooks);
    Py_CLEAR(self->post_accumulate_hooks);
    Py_CLEAR(self->dict);
    return 0;
}

/* Untracks, clears (freeing the data), frees, and drops the type; the
 * trashcan turns a long chain of inputs into a loop instead of recursion. */
void value_dealloc(PyObject *op) {
    PyTypeObject *tp = Py_TYPE(op);
    /* Off the registry before anything can run (weakref callbacks, the
     * trashcan's deferral): a scoped collection never sees a dying node. */
    registry_unlink_value(op);
    PyObject_GC_UnTrack(op);
    Py_TRASHCAN_BEGIN(op, value_dealloc) if (Tensor_CAST(op)->weakreflist != NULL)
        PyObject_ClearWeakRefs(op);
    value_clear(op);
    Py_CLEAR(Tensor_CAST(op)->inputs);
    alloc_site_forget(op);
    tp->tp_free(op);
    Py_DECREF(tp);
    Py_TRASHCAN_END
}

/* ----------------------------------------------------- core helpers */

PyObject *realize(needle_state *st, PyObject *value) {
    TensorObject *self = Tensor_CAST(value);
    if (self->cached_data != NULL) return Py_NewRef(self->cached_data);
    if (self->op == NULL) {
        PyErr_SetString(PyExc_ValueError, "a leaf tensor has no data");
        return NULL;
    }
    /* A lazily built node (e.g. through _init): compute now, holding what
     * the compute reads (a collection may replace the node's fields). Inputs
     * are realized recursively: a node met again is a cycle (inputs set by
     * hand), and a deep lazy chain is bounded by the recursion limit. */
    if (self->realizing) {
        PyErr_SetString(PyExc_ValueError,
                        "graph has a cycle: a lazy node's data depends on itself");
        return NULL;
    }
    if (Py_EnterRecursiveCall(" while realizing lazy tensors")) return NULL;
    PyObject *op = Py_NewRef(self->op), *inputs = Py_NewRef(self->inputs);
    self->realizing = 1;
    PyObject *data = run_compute(st, op, OP_PYTHON, NULL, inputs);
    self->realizing = 0;
    Py_LeaveRecursiveCall();
    Py_DECREF(op);
    Py_DECREF(inputs);
    /* An op set by hand may compute the other kind (a tuple for a Tensor). */
    if (data != NULL &&
        (is_tensor(st, value) ? !ndarray_check(st, data)
                              : is_tensor_tuple(st, value) && !PyTuple_Check(data))) {
        PyErr_Format(PyExc_TypeError, "the op of a %s computed a %.100s", Py_TYPE(value)->tp_name,
                     Py_TYPE(data)->tp_name);
        Py_CLEAR(data);
    }
    if (data != NULL) Py_XSETREF(self->cached_data, Py_NewRef(data));
    return data;
}

PyObject *make_const(needle_state *st, PyObject *data, int requires_grad) {
    PyTypeObject *type =
        PyTuple_Check(data) ? st->autograd->tensor_tuple_type : st->autograd->tensor_type;
    PyObject *node = value_alloc(type);
    if (node == NULL) return NULL;
    Tensor_CAST(node)->cached_data = Py_NewRef(data);
    Tensor_CAST(node)->requires_grad = requires_grad;
    return node;
}

int value_shape(needle_state *st, PyObject *value, int *ndim, int64_t *shape) {
    PyObject *data = realize(st, value);
    if (data == NULL) return -1;
    int rc = -1;
    if (!ndarray_check(st, data)) {
        PyErr_SetString(PyExc_TypeError, "expected a Tensor holding an NDArray");
    } else {
        const nd_layout *l = &NDArray_CAST(data)->array.layout;
        *ndim = l->ndim;
        memcpy(shape, l->shape, sizeof(int64_t) * (size_t)l->ndim);
        rc = 0;
    }
    Py_DECREF(data);
    return rc;
}

/* cached_data is read by C code as an NDArray (a Tensor) or a tuple of
 * NDArrays (a TensorTuple): nothing else is accepted, and a Tensor never gets
 * a tuple nor a TensorTuple an NDArray (either would make it lie about its kind).
 * tuple: 0 an NDArray only, 1 a tuple of NDArrays only, -1 either. */
int node_data_ok(needle_state *st, PyObject *data, int tuple) {
    if (tuple == 0) return ndarray_check(st, data);
    int ok = tuple > 0 ? 0 : ndarray_check(st, data);
    if (!ok && PyTuple_Check(data)) {
        ok = 1;
        for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(data); i++)
            ok = ndarray_check(st, PyTuple_GET_ITEM(data, i));
    }
    return ok;
}

int shapes_differ(needle_state *st, PyObject *a, PyObject *b) {
    if (!is_tensor(st, a) || !is_tensor(st, b)) return 0;
    PyObject *da = Tensor_CAST(a)->cached_data, *db = Tensor_CAST(b)->cached_data;
    if (da != NULL && db != NULL && ndarray_check(st, da) && ndarray_check(st, db)) {
        /* Both computed (the usual case): compare without realising. */
        const nd_layout *la = &NDArray_CAST(da)->array.layout,
                        *lb = &NDArray_CAST(db)->array.layout;
        return la->ndim != lb->ndim ||
               memcmp(la->shape, lb->shape, sizeof(int64_t) * (size_t)la->ndim) != 0;
    }
    int na, nb;
    int64_t sa[ND_MAX_DIMS], sb[ND_MAX_DIMS];
    if (value_shape(st, a, &na, sa) < 0 || value_shape(st, b, &nb, sb) < 0) return -1;
    return na != nb || memcmp(sa, sb, sizeof(int64_t) * (size_t)na) != 0;
}
