/* parse.h: the one parser for each kind of parameter the binding takes from
 * Python: axes, shapes, scalars and integer parameters. NDArray methods,
 * Tensor methods and the Op constructors all call these, so a bad value
 * raises the same exception with the same message whichever way it came in.
 *
 * The rules (NumPy's where NumPy has one):
 *  - bool is a number, not an integer: refused as an axis, a shape entry or
 *    an integer parameter (TypeError: True is not the axis 1), accepted as a
 *    scalar operand (t + True is t + 1, as in NumPy and PyTorch).
 *  - axes: an int or a tuple/list of ints (None, "all axes", is the caller's
 *    to handle). Read in two steps, because an Op is made before it sees an
 *    array: parse_axes checks the types, normalize_axes checks the values
 *    against the array: out of range raises numpy's AxisError (a ValueError
 *    and an IndexError), a repeated axis ValueError.
 *  - shapes: an int or a tuple/list of non-negative ints whose product fits
 *    in an int64 (ValueError otherwise); reshape's shapes may hold one -1.
 */
#ifndef NEEDLE_PARSE_H
#define NEEDLE_PARSE_H

#include "needle_c.h"

/* ------------------------------------------------------------- integers */

/* An int in [min, max]: TypeError for a bool or a non-integer, ValueError
 * outside the range. what names the parameter in messages. */
int parse_int_param(PyObject *obj, const char *what, int min, int max, int *out);

/* An int or a tuple/list of at most ND_MAX_DIMS ints (strides, pad pairs):
 * TypeError for a bool or a non-integer, ValueError past int64. */
int parse_int_tuple(PyObject *obj, const char *what, int *n, int64_t *values);

/* ----------------------------------------------------------------- axes */

/* An axis as given, not yet checked against an array. An int beyond the C
 * int range raises AxisError here: no array has such an axis. */
int parse_axis(needle_state *st, PyObject *obj, int *axis);
/* An int or a tuple/list of at most ND_MAX_DIMS ints, each as parse_axis. */
int parse_axes(needle_state *st, PyObject *obj, int *naxes, int *axes);
/* axis checked against an array of ndim dims: its non-negative form in
 * *out, or AxisError ("axis 5 is out of bounds for array of dimension 2"). */
int normalize_axis(needle_state *st, int axis, int ndim, int *out);
/* Each axis as normalize_axis (out may be axes), ValueError when one
 * repeats ("duplicate value in 'axis'"). */
int normalize_axes(needle_state *st, int naxes, const int *axes, int ndim, int *out);
/* normalize_axes as a bit mask; axes == NULL means all ndim dims. */
int axes_mask(needle_state *st, int naxes, const int *axes, int ndim, uint32_t *mask);

/* --------------------------------------------------------------- shapes */

typedef enum shape_rule {
    SHAPE_EXACT, /* every entry >= 0 */
    SHAPE_INFER  /* one entry may be -1, inferred from the size (reshape) */
} shape_rule;

/* A shape: parse_int_tuple's rules, entries >= 0 (or one -1 under
 * SHAPE_INFER) and a product that fits in an int64; ValueError otherwise. */
int parse_shape(PyObject *obj, shape_rule rule, int *ndim, int64_t *shape);

/* -------------------------------------------------------------- scalars */

/* 1: obj is a real number, its value in *out: a Python or NumPy bool, int
 * or float, another number with __float__ (Fraction, Decimal), or a NumPy
 * array of one element; 0: not one (no exception set; complex numbers,
 * strings and None are not); -1: an exception while reading it. */
int parse_scalar(PyObject *obj, double *out);
/* parse_scalar for a parameter that must be a scalar: TypeError when not,
 * ValueError for an int beyond float64's range (parse_scalar's OverflowError,
 * NumPy's for an operand). */
int parse_scalar_param(PyObject *obj, double *out);

/* --------------------------------------------------------------- dtypes */

/* A dtype: one of the engine's names ("float32", "float16", "bfloat16",
 * "float64", or PyTorch's "float", "half", "double") or anything NumPy reads
 * as a dtype (numpy.float16, numpy.dtype("float64"), "uint8"). 1: one of
 * needle's, in *out; 0: a NumPy dtype needle does not hold (no exception;
 * its type number in *npy_type when that is not NULL); -1: not a dtype
 * (TypeError). None is not read here: its meaning is the caller's. */
int parse_dtype(PyObject *obj, nd_dtype *out, int *npy_type);
/* parse_dtype where only needle's dtypes will do: 0, or -1 with a
 * TypeError naming them. */
int parse_dtype_param(PyObject *obj, nd_dtype *out);
/* The NumPy type that holds dtype's values: itself, or float32 for
 * bfloat16 (NumPy has none). */
int dtype_npy_type(nd_dtype dtype);

#endif /* NEEDLE_PARSE_H */
