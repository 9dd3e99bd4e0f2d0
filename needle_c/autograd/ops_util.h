/* ops_util.h: NDArray helpers for the op implementations (ops_basic.c,
 * ops_nn.c): engine calls whose results are new NDArrays. All return new
 * references, or NULL with an exception set; arguments are NDArrays the
 * caller holds. */
#ifndef NEEDLE_OPS_UTIL_H
#define NEEDLE_OPS_UTIL_H

#include "tensor.h"

#include <math.h>
#include <string.h>

PyObject *nd_binary_arrays(needle_state *st, nd_binary_op op, PyObject *a, PyObject *b);
PyObject *nd_binary_scalar(needle_state *st, nd_binary_op op, PyObject *a, double s, int reflected);
PyObject *nd_unary_array(needle_state *st, nd_unary_op op, PyObject *a);
PyObject *nd_reduce_array(needle_state *st, nd_reduce_op op, PyObject *a, uint32_t mask,
                          int keepdims);
PyObject *nd_layout_view(needle_state *st, PyObject *a, const nd_layout *layout);
PyObject *nd_compact_array(needle_state *st, PyObject *a);
PyObject *nd_reshape_array(needle_state *st, PyObject *a, int ndim, const int64_t *shape);
PyObject *nd_empty_like_shape(needle_state *st, PyObject *like, int ndim, const int64_t *shape);
const nd_layout *array_layout(PyObject *a);
PyObject *nd_full_like_shape(needle_state *st, PyObject *like, int ndim, const int64_t *shape,
                             float value);
/* Copies src into dst, a view into out's storage. Returns out (the caller's
 * new reference), or releases it and returns NULL with the exception set. */
PyObject *nd_assign_into(needle_state *st, PyObject *out, nd_array *dst, const nd_array *src);
/* p's axes as a bit mask over ndim dims (all of them when axes is None). */
int axes_to_mask(const op_params *p, int ndim, uint32_t *mask);

#endif /* NEEDLE_OPS_UTIL_H */
