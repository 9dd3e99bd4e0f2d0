/* grad_scope.h: the scope in which a built-in op's gradient runs, and the
 * Tensor-level building blocks gradients are written with.
 *
 * A gradient allocates, so the collector (and any finalizer or gc callback)
 * may run in the middle of it and replace a node's inputs or cached_data.
 * The scope owns a strong reference to everything the gradient reads (the
 * out_grad, the node, the node's inputs tuple, every realised array) and to
 * every temporary it makes, and releases them once, at the end, on success
 * and on error. Every building block takes borrowed arguments that the scope
 * owns, returns a borrowed result that the scope owns, and passes a NULL
 * argument (an earlier failure, exception set) straight through, so a
 * gradient reads like the course's formula with no NULL checks:
 *
 *     // (g / b, -g * a / b**2)
 *     PyObject *b2 = g_scalar(s, OP_POW_SCALAR, b, 2.0);
 *     return grads2(s, unbroadcast(s, g_div(s, g, b), a),
 *                   unbroadcast(s, g_neg(s, g_div(s, g_mul(s, g, a), b2)), b));
 *
 * (div_gradient in ops_basic.c is this formula, with g_wanted added.)
 *
 * Each block goes through apply_op, so "needle" mode records it.
 */
#ifndef NEEDLE_GRAD_SCOPE_H
#define NEEDLE_GRAD_SCOPE_H

#include "tensor.h"

#define GRAD_SCOPE_INLINE 32

struct grad_scope {
    needle_state *st;
    PyObject *node, *inputs; /* held for the whole gradient */
    int failed;              /* a block failed: every later block returns NULL at once */
    int prune;               /* the walk drops unwanted inputs' gradients (g_wanted) */
    PyObject **held;
    Py_ssize_t count, capacity;
    PyObject *inline_held[GRAD_SCOPE_INLINE];
};

/* Holds node and its inputs tuple; the caller has checked node is a Value. */
void scope_open(grad_scope *s, needle_state *st, PyObject *node);
/* Releases everything the scope holds. */
void scope_close(grad_scope *s);
/* Takes over a new reference (NULL passes through); returns it borrowed. */
PyObject *scope_keep(grad_scope *s, PyObject *new_ref);

/* Marks the scope failed (an exception is set) and returns NULL. */
PyObject *scope_fail(grad_scope *s);

/* Input i of the node (checked against the op's arity before the gradient). */
PyObject *g_input(grad_scope *s, Py_ssize_t i);
/* A Value's realised data, held by the scope. */
PyObject *g_data(grad_scope *s, PyObject *value);
/* A Value's shape (copied); -1 on error or when value is NULL. */
int g_shape(grad_scope *s, PyObject *value, int *ndim, int64_t *shape);

/* Built-in ops on Tensors. */
PyObject *g_apply1(grad_scope *s, op_kind kind, const op_params *p, PyObject *a);
PyObject *g_apply2(grad_scope *s, op_kind kind, const op_params *p, PyObject *a, PyObject *b);
PyObject *g_apply3(grad_scope *s, op_kind kind, const op_params *p, PyObject *a, PyObject *b,
                   PyObject *c);
PyObject *g_add(grad_scope *s, PyObject *a, PyObject *b);
PyObject *g_sub(grad_scope *s, PyObject *a, PyObject *b); /* a + (-b), as the course */
PyObject *g_mul(grad_scope *s, PyObject *a, PyObject *b);
PyObject *g_div(grad_scope *s, PyObject *a, PyObject *b);
PyObject *g_matmul(grad_scope *s, PyObject *a, PyObject *b);
PyObject *g_neg(grad_scope *s, PyObject *a);
PyObject *g_unary(grad_scope *s, op_kind kind, PyObject *a);
PyObject *g_scalar(grad_scope *s, op_kind kind, PyObject *a, double scalar);
PyObject *g_reshape(grad_scope *s, PyObject *a, int ndim, const int64_t *shape);
PyObject *g_broadcast(grad_scope *s, PyObject *a, int ndim, const int64_t *shape);
PyObject *g_sum_mask(grad_scope *s, PyObject *a, int ndim, uint32_t mask);
PyObject *g_transpose(grad_scope *s, PyObject *a, int x, int y);
PyObject *g_transpose_last(grad_scope *s, PyObject *a);
PyObject *g_axes_op(grad_scope *s, op_kind kind, PyObject *a, int naxes, const int *axes,
                    int dilation);
/* g reshaped to keep the reduced axes (mask) as size-1 dims, then broadcast
 * back to the full shape: the adjoint of a reduction. */
PyObject *g_expand(grad_scope *s, PyObject *g, int ndim, const int64_t *shape, uint32_t mask);
/* a cast to dtype (a itself when it has it) / to the dtype of `like`. */
PyObject *g_cast(grad_scope *s, PyObject *a, nd_dtype dtype);
PyObject *g_as_dtype_of(grad_scope *s, PyObject *a, PyObject *like);
/* g summed down to the shape of `like` (the inverse of broadcasting), in
 * like's dtype: the gradient of an input the forward promoted comes back
 * in the input's own dtype. */
PyObject *unbroadcast(grad_scope *s, PyObject *g, PyObject *like);
/* A constant (no graph) Tensor holding array, an NDArray. */
PyObject *g_const(grad_scope *s, PyObject *array);
/* g * w summed back to like's shape: w a new NDArray reference (or NULL after
 * a failed array op) that the scope takes over; the gradients that mask or
 * weight g (maximum/minimum ties, clamp's bounds). */
PyObject *g_weighted(grad_scope *s, PyObject *g, PyObject *w, PyObject *like);
/* The zero gradient of an input that is not differentiable (indices). */
PyObject *g_zeros_like(grad_scope *s, PyObject *value);

/* Whether the walk uses input i's gradient: always, unless it prunes (a
 * cycle_free backward) and the input neither requires nor retains grad. A
 * gradient may put g_unwanted() in an unwanted input's place. */
int g_wanted(grad_scope *s, Py_ssize_t i);
PyObject *g_unwanted(void);
/* Input i's zero gradient (an input that is not differentiable, such as
 * indices), or g_unwanted() when the walk drops it. */
PyObject *g_input_zeros(grad_scope *s, Py_ssize_t i);

/* The gradient's result: a tuple of the given Tensors (NULL if any is NULL). */
PyObject *grads1(grad_scope *s, PyObject *a);
PyObject *grads2(grad_scope *s, PyObject *a, PyObject *b);
/* A tuple of n Tensors taken from items (a C array, borrowed from the scope). */
PyObject *grads_n(grad_scope *s, PyObject *const *items, Py_ssize_t n);

#endif /* NEEDLE_GRAD_SCOPE_H */
