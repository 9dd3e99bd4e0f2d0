/* ndarray_internal.h: what ndarray.c (the type, views, indexing) and
 * ndarray_ops.c (arithmetic, reductions, matmul) share. */
#ifndef NEEDLE_NDARRAY_INTERNAL_H
#define NEEDLE_NDARRAY_INTERNAL_H

#include "needle_c.h"

#include "array_helpers.h"
#include "parse.h"

#include <structmember.h>

void ndarray_dealloc(PyObject *op);
/* Our NDArray type or a Python subclass of it, recognised without a module
 * lookup: the exact type by its dealloc (the fast path of every operator), a
 * subclass by a base whose dealloc it is (Python subclasses get
 * subtype_dealloc, and their tp_base chain leads to NDArray). */
static inline int is_ndarray_object(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    if (t->tp_dealloc == ndarray_dealloc) return 1;
    for (t = t->tp_base; t != NULL; t = t->tp_base)
        if (t->tp_dealloc == ndarray_dealloc) return 1;
    return 0;
}
#define IS_NDARRAY(o) is_ndarray_object(o)

/* The module state of an NDArray (of a subclass too, whose type has no
 * module): the state of the NDArray type it derives from. */
static inline needle_state *ndarray_state(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    while (t->tp_dealloc != ndarray_dealloc && t->tp_base != NULL) t = t->tp_base;
    return (needle_state *)PyType_GetModuleState(t);
}

PyObject *ndarray_numpy(PyObject *op, PyObject *ignored);
PyObject *ndarray_broadcast_to(PyObject *op, PyObject *shape_obj);
PyObject *ndarray_flip(PyObject *op, PyObject *const *args, Py_ssize_t nargs);

/* 1: obj is an NDArray or a real number (filled in); 0: neither (no error
 * set); -1: error. */
int as_operand(PyObject *obj, nd_operand *out);

/* Slots and methods defined in ndarray_ops.c. */
PyObject *ndarray_richcompare(PyObject *a, PyObject *b, int op);
PyObject *ndarray_add(PyObject *a, PyObject *b);
PyObject *ndarray_subtract(PyObject *a, PyObject *b);
PyObject *ndarray_multiply(PyObject *a, PyObject *b);
PyObject *ndarray_true_divide(PyObject *a, PyObject *b);
PyObject *ndarray_power(PyObject *a, PyObject *b, PyObject *mod);
PyObject *ndarray_negative(PyObject *a);
PyObject *ndarray_absolute(PyObject *a);
PyObject *ndarray_matmul_slot(PyObject *a, PyObject *b);
/* Methods defined in ndarray_ops.c (listed in ndarray.c's method table). */
/* One method per unary op of the catalogue (ewise_ops.h): a.<name>(). */
#define NDARRAY_UNARY_DECL(A, id, name, Class, doc, formula) \
    PyObject *ndarray_unary_##name(PyObject *op, PyObject *ignored);
ND_EWISE_UNARY_OPS(NDARRAY_UNARY_DECL, )
#undef NDARRAY_UNARY_DECL
/* One method per binary row of the catalogue that names one: a.<method>(other). */
#define NDARRAY_BINARY_DECL(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    ND_EW_IF(method, PyObject *ndarray_binary_##name(PyObject *a, PyObject *b);)
ND_EWISE_BINARY_OPS(NDARRAY_BINARY_DECL, )
#undef NDARRAY_BINARY_DECL
PyObject *ndarray_matmul(PyObject *a, PyObject *b);
PyObject *ndarray_sum(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kw);
PyObject *ndarray_max(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kw);
PyObject *ndarray_min(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kw);
PyObject *ndarray_pad(PyObject *op, PyObject *axes);

#endif /* NEEDLE_NDARRAY_INTERNAL_H */
