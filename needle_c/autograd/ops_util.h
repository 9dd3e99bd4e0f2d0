/* ops_util.h: helpers for the op implementations (ops_basic.c, ops_nn.c).
 * All return new references, or NULL with an exception set. */
#ifndef NEEDLE_OPS_UTIL_H
#define NEEDLE_OPS_UTIL_H

#include "tensor.h"

#include <math.h>
#include <string.h>

PyObject *nd_full_like_shape(needle_state *st, PyObject *like, int ndim, const int64_t *shape, float value);
/* p's axes as a bit mask over ndim dims (all of them when axes is None). */
int axes_to_mask(const op_params *p, int ndim, uint32_t *mask);

PyObject *t_add(needle_state *st, PyObject *a, PyObject *b);
PyObject *t_mul(needle_state *st, PyObject *a, PyObject *b);
PyObject *t_div(needle_state *st, PyObject *a, PyObject *b);
PyObject *t_matmul(needle_state *st, PyObject *a, PyObject *b);
PyObject *t_unary(needle_state *st, op_kind kind, PyObject *a);
PyObject *t_scalar(needle_state *st, op_kind kind, PyObject *a, double s);
PyObject *t_reshape(needle_state *st, PyObject *a, int ndim, const int64_t *shape);
PyObject *t_broadcast(needle_state *st, PyObject *a, int ndim, const int64_t *shape);
PyObject *t_sum_mask(needle_state *st, PyObject *a, int ndim, uint32_t mask);
PyObject *t_transpose_last(needle_state *st, PyObject *a);
PyObject *t_const(needle_state *st, PyObject *array);
PyObject *unbroadcast(needle_state *st, PyObject *g, PyObject *like);
/* Tuples from new references (which they steal); NULL if any is NULL. */
PyObject *pack1(PyObject *a);
PyObject *pack2(PyObject *a, PyObject *b);
/* Borrowed input i of a graph node. */
PyObject *node_input(PyObject *node, Py_ssize_t i);

#endif /* NEEDLE_OPS_UTIL_H */
