/* dispatch.c: the one op-execution path. Every op application, from an
 * operator (a + b), an op object called from Python (ops.EWiseAdd()(a, b)),
 * a gradient formula, or a lazily built node being realised, goes through
 * run_compute (realise, validate once, hold, compute) and, when it records,
 * record_node. Gradients go through run_gradient.
 */
#include "grad_scope.h"

op_impl op_impls[OP_KIND_COUNT];

int inputs_require_grad(PyObject *inputs) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(inputs); i++)
        if (Tensor_CAST(PyTuple_GET_ITEM(inputs, i))->requires_grad) return 1;
    return 0;
}

/* Inputs are Values (checked by run_compute, which runs first). */
static int should_record(needle_state *st, PyObject *inputs) {
    (void)st;
    return is_recording() && inputs_require_grad(inputs);
}

/* ------------------------------------------------------------ compute */

/* Built-in computes trust their inputs' count and kinds: this is the one
 * place they are checked. */
static int check_arrays(needle_state *st, op_kind kind, PyObject *const *arrays, Py_ssize_t n) {
    const op_info *info = &op_table[kind];
    if (info->arity != ARITY_ANY && n != info->arity) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd input%s, got %zd", info->name, info->arity,
                     info->arity == 1 ? "" : "s", n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = info->inputs == IN_TUPLE ? PyTuple_Check(arrays[i]) : ndarray_check(st, arrays[i]);
        for (Py_ssize_t k = 0; ok && info->inputs == IN_TUPLE && k < PyTuple_GET_SIZE(arrays[i]);
             k++)
            ok = ndarray_check(st, PyTuple_GET_ITEM(arrays[i], k));
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s expects %s, got %.100s at position %zd", info->name,
                         info->inputs == IN_TUPLE ? "a TensorTuple of NDArrays"
                                                  : "Tensors (not TensorTuples)",
                         Py_TYPE(arrays[i])->tp_name, i);
            return -1;
        }
    }
    return 0;
}

PyObject *compute_arrays(needle_state *st, op_kind kind, const op_params *p,
                         PyObject *const *arrays, Py_ssize_t n) {
    if (check_arrays(st, kind, arrays, n) < 0) return NULL;
    return op_impls[kind].compute(st, p, arrays, n);
}

/* A Python op's compute(*arrays). */
static PyObject *python_compute(PyObject *op, PyObject *const *arrays, Py_ssize_t n) {
    PyObject *compute = PyObject_GetAttrString(op, "compute");
    if (compute == NULL) return NULL;
    PyObject *result = PyObject_Vectorcall(compute, arrays, (size_t)n, NULL);
    Py_DECREF(compute);
    return result;
}

#define INLINE_INPUTS 8

PyObject *run_compute(needle_state *st, PyObject *op, op_kind kind, const op_params *p,
                      PyObject *inputs) {
    Py_ssize_t n = PyTuple_GET_SIZE(inputs);
    PyObject *inline_arrays[INLINE_INPUTS];
    PyObject **arrays =
        n <= INLINE_INPUTS ? inline_arrays : PyMem_Malloc(sizeof(PyObject *) * (size_t)n);
    if (arrays == NULL) return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t held = 0;
    for (; held < n; held++) {
        PyObject *x = PyTuple_GET_ITEM(inputs, held);
        if (!is_value(st, x)) {
            PyErr_Format(PyExc_TypeError, "op inputs must be Tensors, got %.100s at position %zd",
                         Py_TYPE(x)->tp_name, held);
            goto done;
        }
        /* realize gives a new reference: held across the compute, which
         * allocates and so may run the collector. */
        if ((arrays[held] = realize(st, x)) == NULL) goto done;
    }
    if (op == NULL) {
        result = compute_arrays(st, kind, p, arrays, n);
    } else if (op_dispatches_in_c(st, op)) {
        result = compute_arrays(st, Op_CAST(op)->kind, &Op_CAST(op)->p, arrays, n);
    } else {
        result = python_compute(op, arrays, n);
    }
done:
    for (Py_ssize_t i = 0; i < held; i++) Py_DECREF(arrays[i]);
    if (arrays != inline_arrays) PyMem_Free(arrays);
    return result;
}

/* ------------------------------------------------------------ record */

/* The result of op(inputs) with its data: a graph node when `record`, else a
 * detached constant. Steals data. */
static PyObject *record_node(needle_state *st, PyObject *op, PyObject *inputs, PyObject *data,
                             int record, int tuple_output) {
    if (data == NULL) return NULL;
    if (!record) {
        PyObject *node = make_const(st, data, 0);
        Py_DECREF(data);
        return node;
    }
    PyTypeObject *type = tuple_output ? st->autograd->tensor_tuple_type : st->autograd->tensor_type;
    PyObject *node = value_alloc(type);
    if (node == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    TensorObject *t = Tensor_CAST(node);
    t->op = Py_NewRef(op);
    Py_SETREF(t->inputs, Py_NewRef(inputs));
    t->cached_data = data;
    t->requires_grad = 1;
    return node;
}

static PyObject *make_from_op_on(needle_state *st, PyObject *op, PyObject *inputs,
                                 int tuple_output);

/* Autocast rewrites a built-in op's inputs (Cast nodes) before it runs; a
 * Python op, or a subclass of a built-in, runs on its inputs as given. */
PyObject *make_from_op(needle_state *st, PyObject *op, PyObject *inputs, int tuple_output) {
    if (!PyObject_TypeCheck(op, st->autograd->op_type)) {
        PyErr_Format(PyExc_TypeError, "make_from_op needs an Op, got %.100s", Py_TYPE(op)->tp_name);
        return NULL;
    }
    if (!autocast_active || !PyTuple_Check(inputs) || !op_dispatches_in_c(st, op))
        return make_from_op_on(st, op, inputs, tuple_output);
    PyObject *cast = autocast_inputs(st, Op_CAST(op)->kind, inputs);
    if (cast == NULL) return NULL;
    PyObject *node = make_from_op_on(st, op, cast, tuple_output);
    Py_DECREF(cast);
    return node;
}

static PyObject *make_from_op_on(needle_state *st, PyObject *op, PyObject *inputs,
                                 int tuple_output) {
    /* Compute first: a failing op leaves no half-built node behind. The
     * caller holds inputs and op across this. */
    PyObject *data = run_compute(st, op, Op_CAST(op)->kind, &Op_CAST(op)->p, inputs);
    /* A Python compute may return anything, and Tensor.make_from_op may be handed a tuple
     * op: the node's data must be what its type reads (an NDArray, or a tuple of them). */
    if (data != NULL && !node_data_ok(st, data, tuple_output)) {
        PyErr_Format(PyExc_TypeError, "%R: compute returned %.100s, but a %s needs %s", op,
                     Py_TYPE(data)->tp_name, tuple_output ? "TensorTuple" : "Tensor",
                     tuple_output ? "a tuple of NDArrays" : "an NDArray");
        Py_CLEAR(data);
    }
    return record_node(st, op, inputs, data, data != NULL && should_record(st, inputs),
                       tuple_output);
}

static PyObject *apply_op_on(needle_state *st, op_kind kind, const op_params *p, PyObject *inputs);

PyObject *apply_op(needle_state *st, op_kind kind, const op_params *p, PyObject *inputs) {
    if (!autocast_active) return apply_op_on(st, kind, p, inputs);
    PyObject *cast = autocast_inputs(st, kind, inputs);
    if (cast == NULL) return NULL;
    PyObject *node = apply_op_on(st, kind, p, cast);
    Py_DECREF(cast);
    return node;
}

static PyObject *apply_op_on(needle_state *st, op_kind kind, const op_params *p, PyObject *inputs) {
    PyObject *data = run_compute(st, NULL, kind, p, inputs);
    if (data == NULL || !should_record(st, inputs))
        return record_node(st, NULL, inputs, data, 0, op_table[kind].tuple_output);
    /* Only a recorded node needs an Op object. */
    PyObject *op = op_new_builtin(st, kind, p);
    if (op == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    PyObject *node = record_node(st, op, inputs, data, 1, op_table[kind].tuple_output);
    Py_DECREF(op);
    return node;
}

PyObject *apply1(needle_state *st, op_kind kind, const op_params *p, PyObject *a) {
    PyObject *inputs = PyTuple_Pack(1, a);
    if (inputs == NULL) return NULL;
    PyObject *r = apply_op(st, kind, p, inputs);
    Py_DECREF(inputs);
    return r;
}

PyObject *apply2(needle_state *st, op_kind kind, const op_params *p, PyObject *a, PyObject *b) {
    PyObject *inputs = PyTuple_Pack(2, a, b);
    if (inputs == NULL) return NULL;
    PyObject *r = apply_op(st, kind, p, inputs);
    Py_DECREF(inputs);
    return r;
}

/* ----------------------------------------------------------- gradient */

PyObject *builtin_gradient(needle_state *st, OpObject *op, PyObject *out_grad, PyObject *node) {
    return builtin_gradient_for(st, op, out_grad, node, 0);
}

PyObject *builtin_gradient_for(needle_state *st, OpObject *op, PyObject *out_grad, PyObject *node,
                               int prune) {
    Py_ssize_t arity = op_table[op->kind].arity, n = PyTuple_GET_SIZE(Tensor_CAST(node)->inputs);
    if (arity != ARITY_ANY && n != arity) {
        PyErr_Format(PyExc_ValueError, "%s takes %zd input%s, but the node has %zd",
                     op_table[op->kind].name, arity, arity == 1 ? "" : "s", n);
        return NULL;
    }
    grad_scope s;
    scope_open(&s, st, node);
    s.prune = prune;
    PyObject *g = scope_keep(&s, Py_NewRef(out_grad));
    PyObject *op_ref = scope_keep(&s, Py_NewRef((PyObject *)op)); /* owns op->p */
    PyObject *result = op_impls[Op_CAST(op_ref)->kind].gradient(&s, &Op_CAST(op_ref)->p, g, s.node);
    Py_XINCREF(result);
    scope_close(&s);
    return result;
}

static PyObject *python_gradient(PyObject *op, PyObject *out_grad, PyObject *node) {
    PyObject *args[3] = {op, out_grad, node};
    PyObject *name = PyUnicode_FromString("gradient");
    if (name == NULL) return NULL;
    PyObject *result =
        PyObject_VectorcallMethod(name, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(name);
    return result;
}

PyObject *run_gradient(needle_state *st, PyObject *op, PyObject *out_grad, PyObject *node) {
    return run_gradient_for(st, op, out_grad, node, 0);
}

PyObject *run_gradient_for(needle_state *st, PyObject *op, PyObject *out_grad, PyObject *node,
                           int prune) {
    PyObject *result = op_dispatches_in_c(st, op)
                           ? builtin_gradient_for(st, Op_CAST(op), out_grad, node, prune)
                           : python_gradient(op, out_grad, node);
    if (result == NULL || PyTuple_CheckExact(result)) return result;
    if (PyList_Check(result) || PyTuple_Check(result)) {
        Py_SETREF(result, PySequence_Tuple(result));
        return result;
    }
    Py_SETREF(result, PyTuple_Pack(1, result));
    return result;
}
