/* tensor_ops.c: Tensor's operators and shape methods, and TensorTuple's
 * sequence methods. Each builds its node through apply_op with the op the
 * course uses, so graphs (and their cycles in "needle" mode) match it.
 */
#include "tensor.h"

#include "ops_util.h"

#include <math.h>

static const op_params no_params;

static op_params scalar_params(double s) {
    op_params p = no_params;
    p.scalar = s;
    return p;
}

/* The state of whichever operand is ours (a reflected operator may have a
 * plain number on the left); NULL with no exception set when neither is. */
static needle_state *state_of_pair(PyObject *a, PyObject *b) {
    needle_state *st = state_of_value(a);
    if (st != NULL) return st;
    PyErr_Clear();
    st = state_of_value(b);
    if (st == NULL) PyErr_Clear();
    return st;
}

/* Dispatches a binary operator: Tensor-Tensor, Tensor-scalar or scalar-Tensor. */
typedef PyObject *(*pair_fn)(needle_state *st, PyObject *a, PyObject *b);
typedef PyObject *(*scalar_fn)(needle_state *st, PyObject *t, double s, int scalar_on_left);

static PyObject *dispatch(PyObject *a, PyObject *b, pair_fn both, scalar_fn one) {
    needle_state *st = state_of_pair(a, b);
    if (st == NULL) Py_RETURN_NOTIMPLEMENTED;
    int ta = is_tensor(st, a), tb = is_tensor(st, b);
    if (ta && tb) return both(st, a, b);
    double s;
    int r = parse_scalar(ta ? b : a, &s);
    if (r < 0) return NULL;
    if (r == 0 && (ta || tb) && PyObject_HasAttrString(ta ? b : a, "__array_interface__")) {
        /* A NumPy array of several elements: say so (NumPy defers to us, so
         * returning NotImplemented would give a vaguer error). */
        PyErr_Format(PyExc_TypeError,
                     "needle does not mix a Tensor with a %.100s of several elements in an "
                     "operator; wrap it in ndl.Tensor(...) (numbers and one-element arrays are "
                     "scalars)",
                     Py_TYPE(ta ? b : a)->tp_name);
        return NULL;
    }
    if (r == 0 || (!ta && !tb)) Py_RETURN_NOTIMPLEMENTED;
    return one(st, ta ? a : b, s, !ta);
}

static PyObject *add_pair(needle_state *st, PyObject *a, PyObject *b) {
    return apply2(st, OP_EWISE_ADD, &no_params, a, b);
}
static PyObject *add_scalar(needle_state *st, PyObject *t, double s, int left) {
    (void)left;
    op_params p = scalar_params(s);
    return apply1(st, OP_ADD_SCALAR, &p, t);
}
static PyObject *sub_pair(needle_state *st, PyObject *a, PyObject *b) {
    /* The course's a - b is a + (-b). */
    PyObject *neg = apply1(st, OP_NEG, &no_params, b);
    if (neg == NULL) return NULL;
    PyObject *r = apply2(st, OP_EWISE_ADD, &no_params, a, neg);
    Py_DECREF(neg);
    return r;
}
static PyObject *sub_scalar(needle_state *st, PyObject *t, double s, int left) {
    if (!left) {
        op_params p = scalar_params(-s);
        return apply1(st, OP_ADD_SCALAR, &p, t);
    }
    PyObject *neg = apply1(st, OP_NEG, &no_params, t);
    if (neg == NULL) return NULL;
    op_params p = scalar_params(s);
    PyObject *r = apply1(st, OP_ADD_SCALAR, &p, neg);
    Py_DECREF(neg);
    return r;
}
static PyObject *mul_pair(needle_state *st, PyObject *a, PyObject *b) {
    return apply2(st, OP_EWISE_MUL, &no_params, a, b);
}
static PyObject *mul_scalar(needle_state *st, PyObject *t, double s, int left) {
    (void)left;
    op_params p = scalar_params(s);
    return apply1(st, OP_MUL_SCALAR, &p, t);
}
static PyObject *div_pair(needle_state *st, PyObject *a, PyObject *b) {
    return apply2(st, OP_EWISE_DIV, &no_params, a, b);
}
static PyObject *div_scalar(needle_state *st, PyObject *t, double s, int left) {
    if (!left) {
        op_params p = scalar_params(s);
        return apply1(st, OP_DIV_SCALAR, &p, t);
    }
    op_params inv = scalar_params(-1.0);
    PyObject *r = apply1(st, OP_POW_SCALAR, &inv, t);
    if (r == NULL) return NULL;
    op_params p = scalar_params(s);
    Py_SETREF(r, apply1(st, OP_MUL_SCALAR, &p, r));
    return r;
}
static PyObject *pow_pair(needle_state *st, PyObject *a, PyObject *b) {
    return apply2(st, OP_EWISE_POW, &no_params, a, b);
}
static PyObject *pow_scalar(needle_state *st, PyObject *t, double s, int left) {
    if (!left) {
        op_params p = scalar_params(s);
        return apply1(st, OP_POW_SCALAR, &p, t);
    }
    /* s ** t as EWisePow(full(s), t): exp(t * log s) would be NaN for
     * s <= 0 (0 ** 0 is 1, (-2) ** 2 is 4, as in NumPy) */
    PyObject *data = realize(st, t);
    if (data == NULL) return NULL;
    PyObject *base = NULL;
    if (!ndarray_check(st, data)) {
        PyErr_SetString(PyExc_TypeError, "scalar ** x needs a Tensor holding an NDArray");
    } else {
        const nd_layout *l = &NDArray_CAST(data)->array.layout;
        /* ones * s: s at the Tensor's dtype by the one scalar path */
        PyObject *ones = array_full_like(st, data, l->ndim, l->shape, 1.0f);
        PyObject *full = ones ? array_binary_scalar(st, ND_MUL, ones, s, 0) : NULL;
        base = full ? make_const(st, full, 0) : NULL;
        Py_XDECREF(ones);
        Py_XDECREF(full);
    }
    Py_DECREF(data);
    if (base == NULL) return NULL;
    PyObject *r = apply2(st, OP_EWISE_POW, &no_params, base, t);
    Py_DECREF(base);
    return r;
}

PyObject *tensor_add(PyObject *a, PyObject *b) { return dispatch(a, b, add_pair, add_scalar); }
PyObject *tensor_sub(PyObject *a, PyObject *b) { return dispatch(a, b, sub_pair, sub_scalar); }
PyObject *tensor_mul(PyObject *a, PyObject *b) { return dispatch(a, b, mul_pair, mul_scalar); }
PyObject *tensor_div(PyObject *a, PyObject *b) { return dispatch(a, b, div_pair, div_scalar); }
PyObject *tensor_pow(PyObject *a, PyObject *b, PyObject *mod) {
    if (mod != Py_None) {
        PyErr_SetString(PyExc_TypeError, "pow() with a modulus is not supported by Tensor");
        return NULL;
    }
    return dispatch(a, b, pow_pair, pow_scalar);
}

PyObject *tensor_neg(PyObject *a) {
    needle_state *st = state_of_value(a);
    return st ? apply1(st, OP_NEG, &no_params, a) : NULL;
}

PyObject *tensor_matmul(PyObject *a, PyObject *b) {
    needle_state *st = state_of_pair(a, b);
    if (st == NULL || !is_tensor(st, a) || !is_tensor(st, b)) Py_RETURN_NOTIMPLEMENTED;
    return apply2(st, OP_MATMUL, &no_params, a, b);
}

PyObject *tensor_matmul_method(PyObject *a, PyObject *b) {
    PyObject *r = tensor_matmul(a, b);
    if (r == Py_NotImplemented) {
        Py_DECREF(r);
        PyErr_Format(PyExc_TypeError, "matmul: expected a Tensor, got %.100s", Py_TYPE(b)->tp_name);
        return NULL;
    }
    return r;
}

PyObject *tensor_getitem(PyObject *a, PyObject *key) {
    needle_state *st = state_of_value(a);
    if (st == NULL) return NULL;
    op_params p = no_params;
    p.key = PyTuple_Check(key) ? Py_NewRef(key) : PyTuple_Pack(1, key);
    if (p.key == NULL) return NULL;
    PyObject *r = apply1(st, OP_GET_ITEM, &p, a);
    Py_DECREF(p.key);
    return r;
}

/* The course's fold_const: item i of a make_tuple(...) node is its input i
 * itself, not a TupleGetItem node. A new reference; NULL with no exception
 * when value is not such a node. */
PyObject *fold_make_tuple_item(needle_state *st, PyObject *value, Py_ssize_t i) {
    TensorObject *t = Tensor_CAST(value);
    if (!is_tensor_tuple(st, value) || t->op == NULL ||
        !PyObject_TypeCheck(t->op, st->autograd->op_type) || Op_CAST(t->op)->kind != OP_MAKE_TUPLE)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(t->inputs);
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
        PyErr_SetString(PyExc_IndexError, "TensorTuple index out of range");
        return NULL;
    }
    return Py_NewRef(PyTuple_GET_ITEM(t->inputs, i));
}

/* ---------------------------------------------------------- methods */

PyObject *tensor_sum(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"axes", NULL};
    PyObject *axes = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:sum", kwlist, &axes)) return NULL;
    needle_state *st = state_of_value(self);
    op_params p = no_params;
    if (st == NULL || op_parse_axes(st, axes, &p) < 0) return NULL;
    return apply1(st, OP_SUMMATION, &p, self);
}

static PyObject *shape_op(PyObject *self, PyObject *args, op_kind kind, const char *name) {
    needle_state *st = state_of_value(self);
    if (st == NULL) return NULL;
    PyObject *shape = PyTuple_GET_SIZE(args) == 1 ? PyTuple_GET_ITEM(args, 0) : args;
    if (PyTuple_GET_SIZE(args) == 0) {
        PyErr_Format(PyExc_TypeError, "%s() needs a shape", name);
        return NULL;
    }
    op_params p = no_params;
    shape_rule rule = kind == OP_RESHAPE ? SHAPE_INFER : SHAPE_EXACT;
    if (parse_shape(shape, rule, &p.ndim, p.shape) < 0) return NULL;
    return apply1(st, kind, &p, self);
}

PyObject *tensor_reshape(PyObject *self, PyObject *args) {
    return shape_op(self, args, OP_RESHAPE, "reshape");
}

PyObject *tensor_broadcast_to(PyObject *self, PyObject *args) {
    return shape_op(self, args, OP_BROADCAST_TO, "broadcast_to");
}

PyObject *tensor_transpose(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"axes", NULL};
    PyObject *axes = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:transpose", kwlist, &axes)) return NULL;
    needle_state *st = state_of_value(self);
    op_params p = no_params;
    if (st == NULL || op_parse_axes(st, axes, &p) < 0) return NULL;
    return apply1(st, OP_TRANSPOSE, &p, self);
}

#define TENSOR_UNARY(A, id, name, Class, doc, formula)                            \
    PyObject *tensor_unary_##name(PyObject *self, PyObject *Py_UNUSED(ignored)) { \
        needle_state *st = state_of_value(self);                                  \
        return st ? apply1(st, OP_##id, &no_params, self) : NULL;                 \
    }
ND_EWISE_UNARY_OPS(TENSOR_UNARY, )
#undef TENSOR_UNARY

PyObject *tensor_abs_slot(PyObject *a) { return tensor_unary_abs(a, NULL); }

/* A binary row's method (maximum, minimum): its Ewise op with a Tensor or
 * its Scalar op with a number (the number at the Tensor's dtype). */
static PyObject *binary_method(PyObject *self, PyObject *other, op_kind pair, op_kind scalar,
                               const char *name) {
    needle_state *st = state_of_value(self);
    if (st == NULL) return NULL;
    if (is_tensor(st, other)) return apply2(st, pair, &no_params, self, other);
    double s;
    int r = parse_scalar(other, &s);
    if (r < 0) return NULL;
    if (r == 0) {
        PyErr_Format(PyExc_TypeError, "%s: expected a Tensor or a number, got %.100s", name,
                     Py_TYPE(other)->tp_name);
        return NULL;
    }
    op_params p = scalar_params(s);
    return apply1(st, scalar, &p, self);
}

#define TENSOR_BINARY(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    ND_EW_IF(                                                                                \
        method, PyObject *tensor_binary_##name(PyObject *self, PyObject *other) {            \
            return binary_method(self, other, OP_EWISE_##id, OP_##id##_SCALAR, #method);     \
        })
ND_EWISE_BINARY_OPS(TENSOR_BINARY, )
#undef TENSOR_BINARY

/* A clamp bound: None is -inf (min) or inf (max); 1 when given. */
static int clamp_bound(PyObject *obj, double absent, double *out, const char *which) {
    if (obj == NULL || obj == Py_None) {
        *out = absent;
        return 0;
    }
    int r = parse_scalar(obj, out);
    if (r == 0)
        PyErr_Format(PyExc_TypeError, "clamp: %s must be a number or None, got %.100s", which,
                     Py_TYPE(obj)->tp_name);
    return r == 1 ? 1 : -1;
}

PyObject *tensor_clamp(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"min", "max", NULL};
    PyObject *lo = NULL, *hi = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:clamp", kwlist, &lo, &hi)) return NULL;
    needle_state *st = state_of_value(self);
    if (st == NULL) return NULL;
    op_params p = no_params;
    int has_lo = clamp_bound(lo, -INFINITY, &p.scalar, "min");
    int has_hi = has_lo < 0 ? -1 : clamp_bound(hi, INFINITY, &p.scalar2, "max");
    if (has_lo < 0 || has_hi < 0) return NULL;
    if (!has_lo && !has_hi) {
        PyErr_SetString(PyExc_ValueError, "clamp: at least one of 'min' or 'max' must not be None");
        return NULL;
    }
    return apply1(st, OP_CLAMP, &p, self);
}

/* ------------------------------------------------------ TensorTuple */

Py_ssize_t tuple_length(PyObject *self) {
    needle_state *st = state_of_value(self);
    if (st == NULL) return -1;
    PyObject *data = realize(st, self);
    if (data == NULL) return -1;
    Py_ssize_t n = PyTuple_Check(data) ? PyTuple_GET_SIZE(data) : -1;
    Py_DECREF(data);
    if (n < 0) PyErr_SetString(PyExc_TypeError, "TensorTuple data is not a tuple");
    return n;
}

PyObject *tuple_item(PyObject *self, PyObject *key) {
    needle_state *st = state_of_value(self);
    if (st == NULL) return NULL;
    if (!PyIndex_Check(key)) {
        PyErr_Format(PyExc_TypeError, "TensorTuple indices must be integers, got %.100s",
                     Py_TYPE(key)->tp_name);
        return NULL;
    }
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError), n = tuple_length(self);
    if ((i == -1 && PyErr_Occurred()) || n < 0) return NULL;
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
        PyErr_SetString(PyExc_IndexError, "TensorTuple index out of range");
        return NULL;
    }
    PyObject *folded = fold_make_tuple_item(st, self, i);
    if (folded != NULL || PyErr_Occurred()) return folded;
    op_params p = no_params;
    p.index = i;
    return apply1(st, OP_TUPLE_GET_ITEM, &p, self);
}

PyObject *tuple_sq_item(PyObject *self, Py_ssize_t i) {
    PyObject *key = PyLong_FromSsize_t(i);
    if (key == NULL) return NULL;
    PyObject *r = tuple_item(self, key);
    Py_DECREF(key);
    return r;
}

PyObject *tuple_as_tuple(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t n = tuple_length(self);
    if (n < 0) return NULL;
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t != NULL && i < n; i++) {
        PyObject *item = tuple_sq_item(self, i);
        if (item == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, item);
    }
    return t;
}

PyObject *tuple_add(PyObject *a, PyObject *b) {
    needle_state *st = state_of_pair(a, b);
    if (st == NULL || !is_tensor_tuple(st, a) || !is_tensor_tuple(st, b)) Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t n = tuple_length(a), m = tuple_length(b);
    if (n < 0 || m < 0) return NULL;
    if (n != m) {
        PyErr_Format(PyExc_ValueError, "cannot add TensorTuples of lengths %zd and %zd", n, m);
        return NULL;
    }
    PyObject *sums = PyTuple_New(n);
    for (Py_ssize_t i = 0; sums != NULL && i < n; i++) {
        PyObject *x = tuple_sq_item(a, i), *y = x ? tuple_sq_item(b, i) : NULL;
        PyObject *s = y ? apply2(st, OP_EWISE_ADD, &no_params, x, y) : NULL;
        Py_XDECREF(x);
        Py_XDECREF(y);
        if (s == NULL) {
            Py_CLEAR(sums);
            break;
        }
        PyTuple_SET_ITEM(sums, i, s);
    }
    if (sums == NULL) return NULL;
    PyObject *r = apply_op(st, OP_MAKE_TUPLE, &no_params, sums);
    Py_DECREF(sums);
    return r;
}

PyObject *tuple_repr(PyObject *self) {
    PyObject *items = tuple_as_tuple(self, NULL);
    if (items == NULL) return NULL;
    PyObject *r = PyUnicode_FromFormat("needle.TensorTuple%R", items);
    Py_DECREF(items);
    return r;
}
