/* ops_basic.c: compute (NDArrays) and gradient (Tensors) of the elementwise,
 * shape, reduction, matmul, indexing and tuple ops, with the course's
 * gradient formulas (so "needle" mode builds the course's graphs).
 *
 * Elementwise ops broadcast like NumPy; their gradients sum back to each
 * input's shape (unbroadcast), which is a no-op for the course's equal shapes.
 */
#include "ops_util.h"

#define UNUSED(x) (void)(x)

/* ----------------------------------------------------------- ewise */

#define EWISE_COMPUTE(name, op)                                                           \
    static PyObject *name##_compute(needle_state *st, const op_params *p, PyObject *const *a, \
                                    Py_ssize_t n) {                                       \
        UNUSED(p);                                                                        \
        UNUSED(n);                                                                        \
        return nd_binary_arrays(st, op, a[0], a[1]);                                      \
    }
#define SCALAR_COMPUTE(name, op)                                                          \
    static PyObject *name##_compute(needle_state *st, const op_params *p, PyObject *const *a, \
                                    Py_ssize_t n) {                                       \
        UNUSED(n);                                                                        \
        return nd_binary_scalar(st, op, a[0], p->scalar, 0);                              \
    }
#define UNARY_COMPUTE(name, op)                                                           \
    static PyObject *name##_compute(needle_state *st, const op_params *p, PyObject *const *a, \
                                    Py_ssize_t n) {                                       \
        UNUSED(p);                                                                        \
        UNUSED(n);                                                                        \
        return nd_unary_array(st, op, a[0]);                                              \
    }

EWISE_COMPUTE(add, ND_ADD)
EWISE_COMPUTE(mul, ND_MUL)
EWISE_COMPUTE(div, ND_DIV)
EWISE_COMPUTE(pow, ND_POW)
SCALAR_COMPUTE(add_scalar, ND_ADD)
SCALAR_COMPUTE(mul_scalar, ND_MUL)
SCALAR_COMPUTE(div_scalar, ND_DIV)
SCALAR_COMPUTE(power_scalar, ND_POW)
UNARY_COMPUTE(negate, ND_NEG)
UNARY_COMPUTE(log, ND_LOG)
UNARY_COMPUTE(exp, ND_EXP)
UNARY_COMPUTE(relu, ND_RELU)
UNARY_COMPUTE(tanh, ND_TANH)
UNARY_COMPUTE(sigmoid, ND_SIGMOID)
UNARY_COMPUTE(sqrt, ND_SQRT)

static PyObject *add_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    return pack2(unbroadcast(st, g, node_input(node, 0)), unbroadcast(st, g, node_input(node, 1)));
}

static PyObject *mul_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    PyObject *a = node_input(node, 0), *b = node_input(node, 1);
    PyObject *ga = t_mul(st, g, b), *gb = ga ? t_mul(st, g, a) : NULL;
    PyObject *ra = ga ? unbroadcast(st, ga, a) : NULL, *rb = gb ? unbroadcast(st, gb, b) : NULL;
    Py_XDECREF(ga);
    Py_XDECREF(gb);
    return pack2(ra, rb);
}

static PyObject *div_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    PyObject *a = node_input(node, 0), *b = node_input(node, 1);
    /* (g / b, -g * a / b**2) */
    PyObject *ga = t_div(st, g, b);
    PyObject *ga_r = ga ? unbroadcast(st, ga, a) : NULL;
    Py_XDECREF(ga);
    PyObject *ab = ga_r ? t_mul(st, g, a) : NULL;
    PyObject *b2 = ab ? t_scalar(st, OP_POWER_SCALAR, b, 2.0) : NULL;
    PyObject *q = b2 ? t_div(st, ab, b2) : NULL;
    PyObject *gb = q ? t_unary(st, OP_NEGATE, q) : NULL;
    PyObject *gb_r = gb ? unbroadcast(st, gb, b) : NULL;
    Py_XDECREF(ab);
    Py_XDECREF(b2);
    Py_XDECREF(q);
    Py_XDECREF(gb);
    return pack2(ga_r, gb_r);
}

static PyObject *pow_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    PyObject *a = node_input(node, 0), *b = node_input(node, 1);
    /* (g * b * a**(b-1), g * log(a) * a**b) */
    PyObject *bm1 = t_scalar(st, OP_ADD_SCALAR, b, -1.0);
    PyObject *pw = bm1 ? apply2(st, OP_EWISE_POW, &(op_params){0}, a, bm1) : NULL;
    PyObject *gb_ = pw ? t_mul(st, g, b) : NULL;
    PyObject *ga = gb_ ? t_mul(st, gb_, pw) : NULL;
    PyObject *ga_r = ga ? unbroadcast(st, ga, a) : NULL;
    PyObject *la = ga_r ? t_unary(st, OP_LOG, a) : NULL;
    PyObject *gl = la ? t_mul(st, g, la) : NULL;
    PyObject *gb = gl ? t_mul(st, gl, node) : NULL;
    PyObject *gb_r = gb ? unbroadcast(st, gb, b) : NULL;
    Py_XDECREF(bm1);
    Py_XDECREF(pw);
    Py_XDECREF(gb_);
    Py_XDECREF(ga);
    Py_XDECREF(la);
    Py_XDECREF(gl);
    Py_XDECREF(gb);
    return pack2(ga_r, gb_r);
}

static PyObject *identity_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(st);
    UNUSED(p);
    UNUSED(node);
    return PyTuple_Pack(1, g);
}

static PyObject *mul_scalar_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return pack1(t_scalar(st, OP_MUL_SCALAR, g, p->scalar));
}

static PyObject *div_scalar_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return pack1(t_scalar(st, OP_DIV_SCALAR, g, p->scalar));
}

static PyObject *power_scalar_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    /* g * s * x**(s-1) */
    PyObject *x = node_input(node, 0);
    PyObject *pw = t_scalar(st, OP_POWER_SCALAR, x, p->scalar - 1.0);
    PyObject *sp = pw ? t_scalar(st, OP_MUL_SCALAR, pw, p->scalar) : NULL;
    PyObject *r = sp ? t_mul(st, g, sp) : NULL;
    Py_XDECREF(pw);
    Py_XDECREF(sp);
    return pack1(r);
}

static PyObject *negate_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    return pack1(t_unary(st, OP_NEGATE, g));
}

static PyObject *log_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    return pack1(t_div(st, g, node_input(node, 0)));
}

static PyObject *exp_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    /* The course builds a new Exp node here (the classic cycle). */
    PyObject *e = t_unary(st, OP_EXP, node_input(node, 0));
    PyObject *r = e ? t_mul(st, g, e) : NULL;
    Py_XDECREF(e);
    return pack1(r);
}

static PyObject *relu_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    PyObject *out = realize(st, node);
    PyObject *mask = out ? nd_binary_scalar(st, ND_GT, out, 0.0, 0) : NULL;
    PyObject *m = mask ? t_const(st, mask) : NULL;
    PyObject *r = m ? t_mul(st, g, m) : NULL;
    Py_XDECREF(mask);
    Py_XDECREF(m);
    return pack1(r);
}

static PyObject *tanh_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    /* g * (1 - out**2), reading the node itself as the course does */
    PyObject *sq = t_scalar(st, OP_POWER_SCALAR, node, 2.0);
    PyObject *neg = sq ? t_unary(st, OP_NEGATE, sq) : NULL;
    PyObject *one_minus = neg ? t_scalar(st, OP_ADD_SCALAR, neg, 1.0) : NULL;
    PyObject *r = one_minus ? t_mul(st, g, one_minus) : NULL;
    Py_XDECREF(sq);
    Py_XDECREF(neg);
    Py_XDECREF(one_minus);
    return pack1(r);
}

static PyObject *sigmoid_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    /* g * s * (1 - s) */
    PyObject *neg = t_unary(st, OP_NEGATE, node);
    PyObject *one_minus = neg ? t_scalar(st, OP_ADD_SCALAR, neg, 1.0) : NULL;
    PyObject *ss = one_minus ? t_mul(st, node, one_minus) : NULL;
    PyObject *r = ss ? t_mul(st, g, ss) : NULL;
    Py_XDECREF(neg);
    Py_XDECREF(one_minus);
    Py_XDECREF(ss);
    return pack1(r);
}

static PyObject *sqrt_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    /* g / (2 sqrt(x)) */
    PyObject *twice = t_scalar(st, OP_MUL_SCALAR, node, 2.0);
    PyObject *r = twice ? t_div(st, g, twice) : NULL;
    Py_XDECREF(twice);
    return pack1(r);
}

/* ----------------------------------------------------------- shapes */

static int transpose_axes(const op_params *p, int ndim, int *x, int *y) {
    if (!p->axes_given) {
        if (ndim < 2) {
            PyErr_Format(PyExc_ValueError, "transpose needs at least 2 dims, got %d", ndim);
            return -1;
        }
        *x = ndim - 2;
        *y = ndim - 1;
        return 0;
    }
    if (p->naxes != 2) {
        PyErr_Format(PyExc_ValueError, "transpose swaps two axes, got %d", p->naxes);
        return -1;
    }
    if (nd_normalize_axis(p->axes[0], ndim, x) != ND_OK || nd_normalize_axis(p->axes[1], ndim, y) != ND_OK) {
        PyErr_SetString(PyExc_ValueError, nd_last_error());
        return -1;
    }
    return 0;
}

static PyObject *transpose_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    const nd_layout *l = array_layout(a[0]);
    int x, y, axes[ND_MAX_DIMS];
    if (transpose_axes(p, l->ndim, &x, &y) < 0) return NULL;
    for (int i = 0; i < l->ndim; i++) axes[i] = i;
    axes[x] = y;
    axes[y] = x;
    nd_layout out;
    nd_status status = nd_layout_permute(l, axes, &out);
    if (status != ND_OK) return raise_status(st, status);
    return nd_layout_view(st, a[0], &out);
}

static PyObject *transpose_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return pack1(apply1(st, OP_TRANSPOSE, p, g));
}

static PyObject *reshape_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    return nd_reshape_array(st, a[0], p->ndim, p->shape);
}

static PyObject *reshape_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    int ndim;
    const int64_t *shape = value_shape(st, node_input(node, 0), &ndim);
    return shape ? pack1(t_reshape(st, g, ndim, shape)) : NULL;
}

static PyObject *broadcast_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    nd_layout out;
    nd_status status = nd_layout_broadcast_to(array_layout(a[0]), p->ndim, p->shape, &out);
    if (status != ND_OK) return raise_status(st, status);
    return nd_layout_view(st, a[0], &out);
}

static PyObject *broadcast_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    return pack1(unbroadcast(st, g, node_input(node, 0)));
}

/* ------------------------------------------------------- reductions */

static PyObject *reduce_compute(needle_state *st, const op_params *p, PyObject *a, nd_reduce_op op) {
    uint32_t mask;
    if (axes_to_mask(p, array_layout(a)->ndim, &mask) < 0) return NULL;
    PyObject *r = nd_reduce_array(st, op, a, mask, 0);
    if (r != NULL && !p->axes_given) {
        /* The course's full reduction has shape (1,). */
        int64_t one = 1;
        nd_layout_contiguous(1, &one, &NDArray_CAST(r)->array.layout);
    }
    return r;
}

static PyObject *summation_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    return reduce_compute(st, p, a[0], ND_REDUCE_SUM);
}

static PyObject *max_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    return reduce_compute(st, p, a[0], ND_REDUCE_MAX);
}

/* The input's shape with the reduced axes set to 1. */
static int kept_shape(needle_state *st, const op_params *p, PyObject *input, int *ndim, int64_t *kept,
                      const int64_t **full) {
    const int64_t *shape = value_shape(st, input, ndim);
    if (shape == NULL) return -1;
    uint32_t mask;
    if (axes_to_mask(p, *ndim, &mask) < 0) return -1;
    for (int i = 0; i < *ndim; i++) kept[i] = (mask >> i) & 1u ? 1 : shape[i];
    *full = shape;
    return 0;
}

static PyObject *summation_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    int ndim;
    int64_t kept[ND_MAX_DIMS];
    const int64_t *full;
    if (kept_shape(st, p, node_input(node, 0), &ndim, kept, &full) < 0) return NULL;
    int64_t shape[ND_MAX_DIMS];
    memcpy(shape, full, sizeof(int64_t) * (size_t)ndim);
    PyObject *r = t_reshape(st, g, ndim, kept);
    PyObject *b = r ? t_broadcast(st, r, ndim, shape) : NULL;
    Py_XDECREF(r);
    return pack1(b);
}

static PyObject *max_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    int ndim;
    int64_t kept[ND_MAX_DIMS], shape[ND_MAX_DIMS];
    const int64_t *full;
    PyObject *x = node_input(node, 0);
    if (kept_shape(st, p, x, &ndim, kept, &full) < 0) return NULL;
    memcpy(shape, full, sizeof(int64_t) * (size_t)ndim);
    uint32_t mask;
    if (axes_to_mask(p, ndim, &mask) < 0) return NULL;
    /* Weights: 1/ties at the maxima, 0 elsewhere; a constant of the graph. */
    PyObject *xd = realize(st, x), *md = realize(st, node);
    if (xd == NULL || md == NULL) return NULL;
    PyObject *mk = nd_reshape_array(st, md, ndim, kept);
    nd_layout bl;
    PyObject *weights = NULL;
    if (mk != NULL && nd_layout_broadcast_to(array_layout(mk), ndim, shape, &bl) == ND_OK) {
        PyObject *mb = nd_layout_view(st, mk, &bl);
        PyObject *eq = mb ? nd_binary_arrays(st, ND_EQ, xd, mb) : NULL;
        PyObject *count = eq ? nd_reduce_array(st, ND_REDUCE_SUM, eq, mask, 1) : NULL;
        if (count != NULL) weights = nd_binary_arrays(st, ND_DIV, eq, count);
        Py_XDECREF(mb);
        Py_XDECREF(eq);
        Py_XDECREF(count);
    } else if (mk != NULL) {
        raise_status(st, ND_ERR_SHAPE);
    }
    Py_XDECREF(mk);
    if (weights == NULL) return NULL;
    PyObject *w = t_const(st, weights);
    Py_DECREF(weights);
    PyObject *r = w ? t_reshape(st, g, ndim, kept) : NULL;
    PyObject *b = r ? t_broadcast(st, r, ndim, shape) : NULL;
    PyObject *out = b ? t_mul(st, b, w) : NULL;
    Py_XDECREF(w);
    Py_XDECREF(r);
    Py_XDECREF(b);
    return pack1(out);
}

/* ----------------------------------------------------------- matmul */

static PyObject *matmul_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(p);
    UNUSED(n);
    if (array_layout(a[0])->ndim < 2 || array_layout(a[1])->ndim < 2) {
        PyErr_SetString(PyExc_ValueError, "MatMul needs operands with at least 2 dimensions");
        return NULL;
    }
    nd_array out;
    nd_status status = nd_array_matmul(&NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array, &out);
    if (status != ND_OK) return raise_status(st, status);
    return ndarray_wrap(st, &out);
}

static PyObject *matmul_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    PyObject *a = node_input(node, 0), *b = node_input(node, 1);
    PyObject *bt = t_transpose_last(st, b);
    PyObject *ga = bt ? t_matmul(st, g, bt) : NULL;
    PyObject *at = ga ? t_transpose_last(st, a) : NULL;
    PyObject *gb = at ? t_matmul(st, at, g) : NULL;
    PyObject *ra = gb ? unbroadcast(st, ga, a) : NULL;
    PyObject *rb = ra ? unbroadcast(st, gb, b) : NULL;
    Py_XDECREF(bt);
    Py_XDECREF(ga);
    Py_XDECREF(at);
    Py_XDECREF(gb);
    return pack2(ra, rb);
}

/* -------------------------------------------------------- indexing */

/* Marks which result dims a getitem key indexed with an integer. */
static int int_dims(PyObject *key, int ndim, int *marked) {
    Py_ssize_t n = PyTuple_GET_SIZE(key), explicit_count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyTuple_GET_ITEM(key, i) != Py_Ellipsis) explicit_count++;
    int dim = 0;
    memset(marked, 0, sizeof(int) * ND_MAX_DIMS);
    for (Py_ssize_t i = 0; i < n && dim < ND_MAX_DIMS; i++) {
        PyObject *item = PyTuple_GET_ITEM(key, i);
        if (item == Py_Ellipsis) {
            dim += (int)(ndim - explicit_count);
            continue;
        }
        if (!PySlice_Check(item) && PyIndex_Check(item)) marked[dim] = 1;
        dim++;
    }
    return 0;
}

static PyObject *getitem_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    UNUSED(st);
    PyObject *view = PyObject_GetItem(a[0], p->key);
    if (view == NULL) return NULL;
    int marked[ND_MAX_DIMS];
    nd_layout *l = &NDArray_CAST(view)->array.layout;
    int_dims(p->key, l->ndim, marked);
    for (int d = l->ndim - 1; d >= 0; d--)
        if (marked[d]) nd_layout_drop_dim(l, d);
    return view;
}

static PyObject *getitem_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    int ndim;
    const int64_t *shape = value_shape(st, node_input(node, 0), &ndim);
    if (shape == NULL) return NULL;
    op_params q = *p;
    q.ndim = ndim;
    memcpy(q.shape, shape, sizeof(int64_t) * (size_t)ndim);
    return pack1(apply1(st, OP_SET_ITEM_GRAD, &q, g));
}

static PyObject *scatter_slice_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    PyObject *zeros = nd_full_like_shape(st, a[0], p->ndim, p->shape, 0.0f);
    if (zeros == NULL) return NULL;
    PyObject *view = PyObject_GetItem(zeros, p->key);
    PyObject *src = view ? nd_reshape_array(st, a[0], array_layout(view)->ndim, array_layout(view)->shape) : NULL;
    nd_status status = src ? nd_array_assign(&NDArray_CAST(view)->array, &NDArray_CAST(src)->array) : ND_OK;
    Py_XDECREF(view);
    if (src == NULL || status != ND_OK) {
        Py_XDECREF(src);
        Py_DECREF(zeros);
        return status != ND_OK ? raise_status(st, status) : NULL;
    }
    Py_DECREF(src);
    return zeros;
}

static PyObject *scatter_slice_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return pack1(apply1(st, OP_GET_ITEM, p, g));
}

/* ----------------------------------------------------------- tuples */

static PyObject *make_tuple_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(st);
    UNUSED(p);
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) PyTuple_SET_ITEM(t, i, Py_NewRef(a[i]));
    return t;
}

static PyObject *tuple_items(needle_state *st, PyObject *g, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        op_params q = {0};
        q.index = i;
        PyObject *item = apply1(st, OP_TUPLE_GET_ITEM, &q, g);
        if (item == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, item);
    }
    return t;
}

static PyObject *make_tuple_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    return tuple_items(st, g, PyTuple_GET_SIZE(Tensor_CAST(node)->inputs));
}

static PyObject *tuple_get_item_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(st);
    UNUSED(n);
    if (!PyTuple_Check(a[0])) {
        PyErr_SetString(PyExc_TypeError, "TupleGetItem needs a TensorTuple");
        return NULL;
    }
    Py_ssize_t size = PyTuple_GET_SIZE(a[0]), i = p->index < 0 ? p->index + size : p->index;
    if (i < 0 || i >= size) {
        PyErr_SetString(PyExc_IndexError, "TensorTuple index out of range");
        return NULL;
    }
    return Py_NewRef(PyTuple_GET_ITEM(a[0], i));
}

static PyObject *tuple_get_item_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    PyObject *data = realize(st, node_input(node, 0));
    if (data == NULL) return NULL;
    Py_ssize_t size = PyTuple_GET_SIZE(data), index = p->index < 0 ? p->index + size : p->index;
    PyObject *parts = PyTuple_New(size);
    for (Py_ssize_t i = 0; parts && i < size; i++) {
        PyObject *part;
        if (i == index) {
            part = Py_NewRef(g);
        } else {
            const nd_layout *l = array_layout(PyTuple_GET_ITEM(data, i));
            PyObject *z = nd_full_like_shape(st, PyTuple_GET_ITEM(data, i), l->ndim, l->shape, 0.0f);
            part = z ? t_const(st, z) : NULL;
            Py_XDECREF(z);
        }
        if (part == NULL) {
            Py_CLEAR(parts);
            break;
        }
        PyTuple_SET_ITEM(parts, i, part);
    }
    if (parts == NULL) return NULL;
    PyObject *r = apply_op(st, OP_MAKE_TUPLE, &(op_params){0}, parts);
    Py_DECREF(parts);
    return pack1(r);
}

static PyObject *fused_add_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    return pack2(nd_binary_scalar(st, ND_ADD, a[0], p->scalar, 0), nd_binary_scalar(st, ND_ADD, a[0], p->scalar2, 0));
}

static PyObject *fused_add_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    PyObject *items = tuple_items(st, g, 2);
    if (items == NULL) return NULL;
    PyObject *r = t_add(st, PyTuple_GET_ITEM(items, 0), PyTuple_GET_ITEM(items, 1));
    Py_DECREF(items);
    return pack1(r);
}

/* ----------------------------------------------------- stack/split */

static PyObject *stack_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    PyObject *items = a[0];
    if (!PyTuple_Check(items) || PyTuple_GET_SIZE(items) == 0) {
        PyErr_SetString(PyExc_ValueError, "stack needs a non-empty TensorTuple");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(items);
    const nd_layout *first = array_layout(PyTuple_GET_ITEM(items, 0));
    for (Py_ssize_t i = 1; i < count; i++) {
        const nd_layout *l = array_layout(PyTuple_GET_ITEM(items, i));
        if (l->ndim != first->ndim || memcmp(l->shape, first->shape, sizeof(int64_t) * (size_t)l->ndim)) {
            PyErr_SetString(PyExc_ValueError, "stack: all tensors must have the same shape");
            return NULL;
        }
    }
    int axis;
    if (first->ndim + 1 > ND_MAX_DIMS || nd_normalize_axis(p->axis, first->ndim + 1, &axis) != ND_OK) {
        PyErr_Format(PyExc_ValueError, "stack: axis %d out of range", p->axis);
        return NULL;
    }
    int64_t shape[ND_MAX_DIMS];
    for (int i = 0, j = 0; i <= first->ndim; i++) shape[i] = i == axis ? count : first->shape[j++];
    PyObject *out = nd_empty_like_shape(st, PyTuple_GET_ITEM(items, 0), first->ndim + 1, shape);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        nd_array slot = NDArray_CAST(out)->array;
        nd_layout_slice(&slot.layout, axis, i, 1, 1);
        nd_layout_drop_dim(&slot.layout, axis);
        nd_status status = nd_array_assign(&slot, &NDArray_CAST(PyTuple_GET_ITEM(items, i))->array);
        if (status != ND_OK) {
            Py_DECREF(out);
            return raise_status(st, status);
        }
    }
    return out;
}

static PyObject *stack_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return pack1(apply1(st, OP_SPLIT, p, g));
}

static PyObject *split_compute(needle_state *st, const op_params *p, PyObject *const *a, Py_ssize_t n) {
    UNUSED(n);
    const nd_layout *l = array_layout(a[0]);
    int axis;
    if (nd_normalize_axis(p->axis, l->ndim, &axis) != ND_OK) {
        PyErr_SetString(PyExc_ValueError, nd_last_error());
        return NULL;
    }
    PyObject *parts = PyTuple_New(l->shape[axis]);
    for (int64_t i = 0; parts && i < l->shape[axis]; i++) {
        nd_layout view = *l;
        nd_layout_slice(&view, axis, i, 1, 1);
        nd_layout_drop_dim(&view, axis);
        PyObject *part = nd_layout_view(st, a[0], &view);
        if (part == NULL) {
            Py_CLEAR(parts);
            break;
        }
        PyTuple_SET_ITEM(parts, i, part);
    }
    return parts;
}

static PyObject *split_gradient(needle_state *st, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return pack1(apply1(st, OP_STACK, p, g));
}

void ops_basic_register(op_impl *t) {
    t[OP_EWISE_ADD] = (op_impl){add_compute, add_gradient};
    t[OP_ADD_SCALAR] = (op_impl){add_scalar_compute, identity_gradient};
    t[OP_EWISE_MUL] = (op_impl){mul_compute, mul_gradient};
    t[OP_MUL_SCALAR] = (op_impl){mul_scalar_compute, mul_scalar_gradient};
    t[OP_EWISE_POW] = (op_impl){pow_compute, pow_gradient};
    t[OP_POWER_SCALAR] = (op_impl){power_scalar_compute, power_scalar_gradient};
    t[OP_EWISE_DIV] = (op_impl){div_compute, div_gradient};
    t[OP_DIV_SCALAR] = (op_impl){div_scalar_compute, div_scalar_gradient};
    t[OP_TRANSPOSE] = (op_impl){transpose_compute, transpose_gradient};
    t[OP_RESHAPE] = (op_impl){reshape_compute, reshape_gradient};
    t[OP_BROADCAST_TO] = (op_impl){broadcast_compute, broadcast_gradient};
    t[OP_SUMMATION] = (op_impl){summation_compute, summation_gradient};
    t[OP_MATMUL] = (op_impl){matmul_compute, matmul_gradient};
    t[OP_NEGATE] = (op_impl){negate_compute, negate_gradient};
    t[OP_LOG] = (op_impl){log_compute, log_gradient};
    t[OP_EXP] = (op_impl){exp_compute, exp_gradient};
    t[OP_RELU] = (op_impl){relu_compute, relu_gradient};
    t[OP_TANH] = (op_impl){tanh_compute, tanh_gradient};
    t[OP_SIGMOID] = (op_impl){sigmoid_compute, sigmoid_gradient};
    t[OP_SQRT] = (op_impl){sqrt_compute, sqrt_gradient};
    t[OP_MAX] = (op_impl){max_compute, max_gradient};
    t[OP_GET_ITEM] = (op_impl){getitem_compute, getitem_gradient};
    t[OP_SET_ITEM_GRAD] = (op_impl){scatter_slice_compute, scatter_slice_gradient};
    t[OP_MAKE_TUPLE] = (op_impl){make_tuple_compute, make_tuple_gradient};
    t[OP_TUPLE_GET_ITEM] = (op_impl){tuple_get_item_compute, tuple_get_item_gradient};
    t[OP_FUSED_ADD_SCALARS] = (op_impl){fused_add_compute, fused_add_gradient};
    t[OP_STACK] = (op_impl){stack_compute, stack_gradient};
    t[OP_SPLIT] = (op_impl){split_compute, split_gradient};
}
