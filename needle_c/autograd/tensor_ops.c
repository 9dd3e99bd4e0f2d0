/* tensor_ops.c: Tensor's operators and shape methods, and TensorTuple's
 * sequence methods. Each builds its node through apply_op with the op the
 * course uses, so graphs (and their cycles in "needle" mode) match it.
 */
#include "tensor.h"

#include <math.h>

static const op_params no_params;

static int scalar_value(PyObject *obj, double *out) {
    if (PyFloat_Check(obj) || PyLong_Check(obj)) {
        *out = PyFloat_AsDouble(obj);
        return (*out == -1.0 && PyErr_Occurred()) ? -1 : 1;
    }
    /* NumPy scalars and 0-d arrays are real numbers too. */
    if (PyComplex_Check(obj) || PyUnicode_Check(obj) || PyBytes_Check(obj) || obj == Py_None ||
        PySequence_Check(obj) || !PyNumber_Check(obj))
        return 0;
    PyObject *f = PyNumber_Float(obj);
    if (f == NULL) {
        PyErr_Clear();
        return 0;
    }
    *out = PyFloat_AS_DOUBLE(f);
    Py_DECREF(f);
    return 1;
}

static op_params scalar_params(double s) {
    op_params p = no_params;
    p.scalar = s;
    return p;
}

static needle_state *state_of_pair(PyObject *a, PyObject *b, PyObject **tensor) {
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(a), &needle_c_module);
    if (module != NULL) {
        *tensor = a;
        return state_of_module(module);
    }
    PyErr_Clear();
    module = PyType_GetModuleByDef(Py_TYPE(b), &needle_c_module);
    if (module == NULL) return NULL;
    *tensor = b;
    return state_of_module(module);
}

/* Dispatches a binary operator: Tensor-Tensor, Tensor-scalar or scalar-Tensor. */
typedef PyObject *(*pair_fn)(needle_state *st, PyObject *a, PyObject *b);
typedef PyObject *(*scalar_fn)(needle_state *st, PyObject *t, double s, int scalar_on_left);

static PyObject *dispatch(PyObject *a, PyObject *b, pair_fn both, scalar_fn one) {
    PyObject *tensor;
    needle_state *st = state_of_pair(a, b, &tensor);
    if (st == NULL) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int ta = is_tensor(st, a), tb = is_tensor(st, b);
    if (ta && tb) return both(st, a, b);
    double s;
    int r = scalar_value(ta ? b : a, &s);
    if (r < 0) return NULL;
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
    PyObject *neg = apply1(st, OP_NEGATE, &no_params, b);
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
    PyObject *neg = apply1(st, OP_NEGATE, &no_params, t);
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
    PyObject *r = apply1(st, OP_POWER_SCALAR, &inv, t);
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
        return apply1(st, OP_POWER_SCALAR, &p, t);
    }
    /* s ** t = exp(t * log s) */
    op_params p = scalar_params(log(s));
    PyObject *r = apply1(st, OP_MUL_SCALAR, &p, t);
    if (r == NULL) return NULL;
    Py_SETREF(r, apply1(st, OP_EXP, &no_params, r));
    return r;
}

static PyObject *tensor_add(PyObject *a, PyObject *b) { return dispatch(a, b, add_pair, add_scalar); }
static PyObject *tensor_sub(PyObject *a, PyObject *b) { return dispatch(a, b, sub_pair, sub_scalar); }
static PyObject *tensor_mul(PyObject *a, PyObject *b) { return dispatch(a, b, mul_pair, mul_scalar); }
static PyObject *tensor_div(PyObject *a, PyObject *b) { return dispatch(a, b, div_pair, div_scalar); }
static PyObject *tensor_pow(PyObject *a, PyObject *b, PyObject *mod) {
    if (mod != Py_None) {
        PyErr_SetString(PyExc_TypeError, "pow() with a modulus is not supported by Tensor");
        return NULL;
    }
    return dispatch(a, b, pow_pair, pow_scalar);
}

static PyObject *tensor_neg(PyObject *a) {
    needle_state *st = state_of_value(a);
    return st ? apply1(st, OP_NEGATE, &no_params, a) : NULL;
}

static PyObject *tensor_matmul(PyObject *a, PyObject *b) {
    PyObject *tensor;
    needle_state *st = state_of_pair(a, b, &tensor);
    if (st == NULL || !is_tensor(st, a) || !is_tensor(st, b)) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    return apply2(st, OP_MATMUL, &no_params, a, b);
}

static PyObject *tensor_matmul_method(PyObject *a, PyObject *b) {
    PyObject *r = tensor_matmul(a, b);
    if (r == Py_NotImplemented) {
        Py_DECREF(r);
        PyErr_Format(PyExc_TypeError, "matmul: expected a Tensor, got %.100s", Py_TYPE(b)->tp_name);
        return NULL;
    }
    return r;
}

static PyObject *tensor_getitem(PyObject *a, PyObject *key) {
    needle_state *st = state_of_value(a);
    if (st == NULL) return NULL;
    op_params p = no_params;
    p.key = PyTuple_Check(key) ? Py_NewRef(key) : PyTuple_Pack(1, key);
    if (p.key == NULL) return NULL;
    PyObject *r = apply1(st, OP_GET_ITEM, &p, a);
    Py_DECREF(p.key);
    return r;
}

/* ---------------------------------------------------------- methods */

static int axes_from_object(PyObject *obj, op_params *p) {
    p->axes_given = 0;
    p->naxes = 0;
    if (obj == NULL || obj == Py_None) return 0;
    p->axes_given = 1;
    int64_t values[ND_MAX_DIMS];
    if (parse_shape(obj, &p->naxes, values) < 0) return -1;
    for (int i = 0; i < p->naxes; i++) p->axes[i] = (int)values[i];
    return 0;
}

static PyObject *tensor_sum(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"axes", NULL};
    PyObject *axes = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:sum", kwlist, &axes)) return NULL;
    needle_state *st = state_of_value(self);
    op_params p = no_params;
    if (st == NULL || axes_from_object(axes, &p) < 0) return NULL;
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
    if (parse_shape(shape, &p.ndim, p.shape) < 0) return NULL;
    return apply1(st, kind, &p, self);
}

static PyObject *tensor_reshape(PyObject *self, PyObject *args) {
    return shape_op(self, args, OP_RESHAPE, "reshape");
}

static PyObject *tensor_broadcast_to(PyObject *self, PyObject *args) {
    return shape_op(self, args, OP_BROADCAST_TO, "broadcast_to");
}

static PyObject *tensor_transpose(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"axes", NULL};
    PyObject *axes = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:transpose", kwlist, &axes)) return NULL;
    needle_state *st = state_of_value(self);
    op_params p = no_params;
    if (st == NULL || axes_from_object(axes, &p) < 0) return NULL;
    return apply1(st, OP_TRANSPOSE, &p, self);
}

#define TENSOR_UNARY(name, kind)                                                          \
    static PyObject *tensor_##name(PyObject *self, PyObject *Py_UNUSED(ignored)) {        \
        needle_state *st = state_of_value(self);                                          \
        return st ? apply1(st, kind, &no_params, self) : NULL;                            \
    }
TENSOR_UNARY(exp, OP_EXP)
TENSOR_UNARY(log, OP_LOG)
TENSOR_UNARY(tanh, OP_TANH)
TENSOR_UNARY(relu, OP_RELU)
TENSOR_UNARY(sigmoid, OP_SIGMOID)
TENSOR_UNARY(sqrt, OP_SQRT)

PyMethodDef tensor_op_methods[] = {
    {"sum", (PyCFunction)(void (*)(void))tensor_sum, METH_VARARGS | METH_KEYWORDS,
     "sum($self, /, axes=None)\n--\n\nSummation over axes (all when None)."},
    {"reshape", tensor_reshape, METH_VARARGS, "reshape($self, /, *shape)\n--\n\nReshape."},
    {"broadcast_to", tensor_broadcast_to, METH_VARARGS,
     "broadcast_to($self, /, *shape)\n--\n\nBroadcastTo (NumPy rules)."},
    {"transpose", (PyCFunction)(void (*)(void))tensor_transpose, METH_VARARGS | METH_KEYWORDS,
     "transpose($self, /, axes=None)\n--\n\nSwaps two axes (the last two when None)."},
    {"matmul", tensor_matmul_method, METH_O, "matmul($self, other, /)\n--\n\nself @ other."},
    {"exp", tensor_exp, METH_NOARGS, "exp($self, /)\n--\n\nExp."},
    {"log", tensor_log, METH_NOARGS, "log($self, /)\n--\n\nLog."},
    {"tanh", tensor_tanh, METH_NOARGS, "tanh($self, /)\n--\n\nTanh."},
    {"relu", tensor_relu, METH_NOARGS, "relu($self, /)\n--\n\nReLU."},
    {"sigmoid", tensor_sigmoid, METH_NOARGS, "sigmoid($self, /)\n--\n\nSigmoid."},
    {"sqrt", tensor_sqrt, METH_NOARGS, "sqrt($self, /)\n--\n\nSqrt."},
    {NULL, NULL, 0, NULL},
};

PyType_Slot tensor_number_slots[] = {
    {Py_nb_add, tensor_add},
    {Py_nb_subtract, tensor_sub},
    {Py_nb_multiply, tensor_mul},
    {Py_nb_true_divide, tensor_div},
    {Py_nb_power, tensor_pow},
    {Py_nb_negative, tensor_neg},
    {Py_nb_matrix_multiply, tensor_matmul},
    {Py_mp_subscript, tensor_getitem},
    {0, NULL},
};

/* ------------------------------------------------------ TensorTuple */

static Py_ssize_t tuple_length(PyObject *self) {
    needle_state *st = state_of_value(self);
    if (st == NULL) return -1;
    PyObject *data = realize(st, self);
    if (data == NULL) return -1;
    if (!PyTuple_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "TensorTuple data is not a tuple");
        return -1;
    }
    return PyTuple_GET_SIZE(data);
}

static PyObject *tuple_item(PyObject *self, PyObject *key) {
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
    /* The course's fold_const: an item of make_tuple(...) is its input. */
    TensorObject *t = Tensor_CAST(self);
    if (t->op != NULL && PyObject_TypeCheck(t->op, st->autograd->op_type) &&
        Op_CAST(t->op)->kind == OP_MAKE_TUPLE)
        return Py_NewRef(PyTuple_GET_ITEM(t->inputs, i));
    op_params p = no_params;
    p.index = i;
    return apply1(st, OP_TUPLE_GET_ITEM, &p, self);
}

static PyObject *tuple_sq_item(PyObject *self, Py_ssize_t i) {
    PyObject *key = PyLong_FromSsize_t(i);
    if (key == NULL) return NULL;
    PyObject *r = tuple_item(self, key);
    Py_DECREF(key);
    return r;
}

static PyObject *tuple_as_tuple(PyObject *self, PyObject *Py_UNUSED(ignored)) {
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

static PyObject *tuple_add(PyObject *a, PyObject *b) {
    PyObject *tensor;
    needle_state *st = state_of_pair(a, b, &tensor);
    if (st == NULL || !is_tensor_tuple(st, a) || !is_tensor_tuple(st, b)) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
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

static PyObject *tuple_repr(PyObject *self) {
    PyObject *items = tuple_as_tuple(self, NULL);
    if (items == NULL) return NULL;
    PyObject *r = PyUnicode_FromFormat("needle.TensorTuple%R", items);
    Py_DECREF(items);
    return r;
}

PyMethodDef tensor_tuple_methods[] = {
    {"tuple", tuple_as_tuple, METH_NOARGS, "tuple($self, /)\n--\n\nThe items as a tuple of Tensors."},
    {NULL, NULL, 0, NULL},
};

PyType_Slot tensor_tuple_extra_slots[] = {
    {Py_mp_length, tuple_length},
    {Py_sq_length, tuple_length},
    {Py_mp_subscript, tuple_item},
    {Py_sq_item, tuple_sq_item},
    {Py_nb_add, tuple_add},
    {Py_tp_repr, tuple_repr},
    {Py_tp_str, tuple_repr},
    {0, NULL},
};
