/* array_helpers.h: the NDArray helpers every binding file shares (the
 * NDArray type's methods, the op implementations): an engine call's result
 * as a new NDArray or its status raised, views, reshape (a copy when no view
 * exists), and engine calls whose results are new NDArrays.
 *
 * Array arguments are NDArrays the caller holds; every function returns a
 * new reference, or NULL with an exception set. Names start with array_ (the
 * binding's), not nd_ (the engine's).
 */
#ifndef NEEDLE_ARRAY_HELPERS_H
#define NEEDLE_ARRAY_HELPERS_H

#include "needle_c.h"

const nd_layout *array_layout(PyObject *a);
/* *out wrapped in a new NDArray when status is ND_OK (which takes over its
 * storage reference), else status raised. */
PyObject *array_result(needle_state *st, nd_status status, nd_array *out);
/* A new NDArray viewing a's storage with another layout. */
PyObject *array_view(needle_state *st, PyObject *a, const nd_layout *layout);
/* a itself when its layout is contiguous, else a contiguous copy. */
PyObject *array_compact(needle_state *st, PyObject *a);
/* a with a new shape (one -1 allowed): a view when the strides allow one,
 * else a reshaped contiguous copy. */
PyObject *array_reshape(needle_state *st, PyObject *a, int ndim, const int64_t *shape);

PyObject *array_binary(needle_state *st, nd_binary_op op, PyObject *a, PyObject *b);
/* The one way a Python scalar s meets an array a in op (NDArray's and
 * Tensor's operators, the scalar ops): s at a's dtype, at full precision
 * (array_helpers.c says how each dtype keeps it). */
nd_operand array_scalar_operand(nd_binary_op op, const nd_array *a, double s);
/* a op s, or s op a when reflected. */
PyObject *array_binary_scalar(needle_state *st, nd_binary_op op, PyObject *a, double s,
                              int reflected);
PyObject *array_unary(needle_state *st, nd_unary_op op, PyObject *a);
PyObject *array_reduce(needle_state *st, nd_reduce_op op, PyObject *a, uint32_t mask, int keepdims);
/* New uninitialised (empty) or filled (full) arrays of a shape, on like's device. */
PyObject *array_empty_like(needle_state *st, PyObject *like, int ndim, const int64_t *shape);
PyObject *array_full_like(needle_state *st, PyObject *like, int ndim, const int64_t *shape,
                          float value);
/* Copies src into dst, a view into out's storage. Returns out (the caller's
 * new reference), or releases it and returns NULL with the exception set. */
PyObject *array_assign_into(needle_state *st, PyObject *out, nd_array *dst, const nd_array *src);

#endif /* NEEDLE_ARRAY_HELPERS_H */
