/* ops_util.h: what the op files (op.c, tensor_ops.c, ops_basic.c, ops_nn.c,
 * ops_fused.c, ops_lstm.c, grad_scope.c) include: the shared NDArray helpers
 * and parameter parsers of array/, and an op's axes as a bit mask. */
#ifndef NEEDLE_OPS_UTIL_H
#define NEEDLE_OPS_UTIL_H

#include "tensor.h"

#include "array/array_helpers.h"
#include "array/parse.h"

#include <math.h>
#include <string.h>

/* p's axes checked against ndim and turned into a bit mask (all dims when
 * axes is None): AxisError or ValueError as parse.h says (op.c). */
int axes_to_mask(needle_state *st, const op_params *p, int ndim, uint32_t *mask);

#endif /* NEEDLE_OPS_UTIL_H */
