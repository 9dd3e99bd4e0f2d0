/* ops_basic.c: compute (NDArrays) and gradient (Tensors) of the shape,
 * reduction, matmul, indexing, tuple and cast ops, with the course's
 * gradient formulas (so "needle" mode builds the course's graphs). The
 * elementwise ops are the catalogue's (ops_unary.c, ops_binary.c).
 *
 * In a cycle_free backward, the ops a step uses skip the partials of inputs
 * that nothing differentiates (g_wanted): a dropout mask, a constant mask, a
 * matmul's data operand.
 */
#include "grad_scope.h"
#include "ops_util.h"

#define UNUSED(x) (void)(x)

static const op_params no_params;

/* ----------------------------------------------------------- shapes */

static int transpose_axes(needle_state *st, const op_params *p, int ndim, int *x, int *y) {
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
    int pair[2];
    if (normalize_axes(st, 2, p->axes, ndim, pair) < 0) return -1;
    *x = pair[0];
    *y = pair[1];
    return 0;
}

static PyObject *transpose_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                   Py_ssize_t n) {
    UNUSED(n);
    const nd_layout *l = array_layout(a[0]);
    int x, y, axes[ND_MAX_DIMS];
    if (transpose_axes(st, p, l->ndim, &x, &y) < 0) return NULL;
    for (int i = 0; i < l->ndim; i++) axes[i] = i;
    axes[x] = y;
    axes[y] = x;
    nd_layout out;
    nd_status status = nd_layout_permute(l, axes, &out);
    if (status != ND_OK) return raise_status(st, status);
    return array_view(st, a[0], &out);
}

static PyObject *transpose_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                    PyObject *node) {
    UNUSED(node);
    return grads1(s, g_apply1(s, OP_TRANSPOSE, p, g)); /* the same swap */
}

static PyObject *reshape_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                 Py_ssize_t n) {
    UNUSED(n);
    return array_reshape(st, a[0], p->ndim, p->shape);
}

static PyObject *reshape_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (g_shape(s, g_input(s, 0), &ndim, shape) < 0) return NULL;
    return grads1(s, g_reshape(s, g, ndim, shape)); /* g reshaped back to x's shape */
}

static PyObject *broadcast_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                   Py_ssize_t n) {
    UNUSED(n);
    nd_layout out;
    nd_status status = nd_layout_broadcast_to(array_layout(a[0]), p->ndim, p->shape, &out);
    if (status != ND_OK) return raise_status(st, status);
    return array_view(st, a[0], &out);
}

static PyObject *broadcast_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                    PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    return grads1(s, unbroadcast(s, g, g_input(s, 0))); /* g summed over the broadcast axes */
}

/* ------------------------------------------------------- reductions */

static PyObject *reduce_compute(needle_state *st, const op_params *p, PyObject *a,
                                nd_reduce_op op) {
    uint32_t mask;
    if (axes_to_mask(st, p, array_layout(a)->ndim, &mask) < 0) return NULL;
    PyObject *r = array_reduce(st, op, a, mask, 0);
    if (r != NULL && !p->axes_given) {
        /* The course's full reduction has shape (1,). */
        int64_t one = 1;
        nd_layout_contiguous(1, &one, &NDArray_CAST(r)->array.layout);
    }
    return r;
}

static PyObject *summation_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                   Py_ssize_t n) {
    UNUSED(n);
    return reduce_compute(st, p, a[0], ND_REDUCE_SUM);
}

static PyObject *max_compute(needle_state *st, const op_params *p, PyObject *const *a,
                             Py_ssize_t n) {
    UNUSED(n);
    return reduce_compute(st, p, a[0], ND_REDUCE_MAX);
}

/* The reduction's input shape and its reduced axes as a mask. */
static int reduced_shape(grad_scope *s, const op_params *p, int *ndim, int64_t *shape,
                         uint32_t *mask) {
    if (g_shape(s, g_input(s, 0), ndim, shape) < 0) return -1;
    return axes_to_mask(s->st, p, *ndim, mask);
}

/* The weights of Max's gradient: x == max (broadcast back), divided by the
 * number of ties in each reduced slice. x and max are held by the scope. */
static PyObject *max_weights(grad_scope *s, PyObject *x, PyObject *max, int ndim,
                             const int64_t *shape, uint32_t mask) {
    if (x == NULL || max == NULL) return NULL;
    int64_t kept[ND_MAX_DIMS];
    for (int i = 0; i < ndim; i++) kept[i] = (mask >> i) & 1u ? 1 : shape[i];
    PyObject *mk = scope_keep(s, array_reshape(s->st, max, ndim, kept));
    if (mk == NULL) return NULL;
    nd_layout bl;
    if (nd_layout_broadcast_to(array_layout(mk), ndim, shape, &bl) != ND_OK) {
        raise_status(s->st, ND_ERR_SHAPE);
        return scope_fail(s);
    }
    PyObject *mb = scope_keep(s, array_view(s->st, mk, &bl));
    PyObject *eq = mb ? scope_keep(s, array_binary(s->st, ND_EQ, x, mb)) : NULL;
    PyObject *count = eq ? scope_keep(s, array_reduce(s->st, ND_REDUCE_SUM, eq, mask, 1)) : NULL;
    return count ? scope_keep(s, array_binary(s->st, ND_DIV, eq, count)) : NULL;
}

static PyObject *summation_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                    PyObject *node) {
    UNUSED(node);
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    uint32_t mask;
    if (reduced_shape(s, p, &ndim, shape, &mask) < 0) return scope_fail(s);
    return grads1(s, g_expand(s, g, ndim, shape, mask)); /* broadcast(reshape(g)) */
}

static PyObject *max_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    uint32_t mask;
    if (reduced_shape(s, p, &ndim, shape, &mask) < 0) return scope_fail(s);
    /* broadcast(reshape(g)) * w, w: 1/ties at the maxima, 0 elsewhere (a constant) */
    PyObject *weights =
        max_weights(s, g_data(s, g_input(s, 0)), g_data(s, node), ndim, shape, mask);
    return grads1(s, g_mul(s, g_expand(s, g, ndim, shape, mask), g_const(s, weights)));
}

/* ----------------------------------------------------------- matmul */

static PyObject *matmul_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                Py_ssize_t n) {
    UNUSED(p);
    UNUSED(n);
    if (array_layout(a[0])->ndim < 2 || array_layout(a[1])->ndim < 2) {
        PyErr_SetString(PyExc_ValueError, "MatMul needs operands with at least 2 dimensions");
        return NULL;
    }
    nd_array out;
    nd_status status =
        nd_array_matmul(&NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array, &out);
    return array_result(st, status, &out);
}

/* The gradients of a @ b with respect to a and b (inputs 0 and 1): (g @ b^T,
 * a^T @ g), batch dims summed back; an unwanted one is not computed. */
static void matmul_grads(grad_scope *s, PyObject *g, PyObject *a, PyObject *b, PyObject **ga,
                         PyObject **gb) {
    *ga = g_wanted(s, 0) ? unbroadcast(s, g_matmul(s, g, g_transpose_last(s, b)), a) : g_unwanted();
    *gb = g_wanted(s, 1) ? unbroadcast(s, g_matmul(s, g_transpose_last(s, a), g), b) : g_unwanted();
}

static PyObject *matmul_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    PyObject *ga, *gb;
    matmul_grads(s, g, g_input(s, 0), g_input(s, 1), &ga, &gb);
    return grads2(s, ga, gb);
}

/* MatMulBias(x, w, bias) = x @ w + bias: one output array where the
 * composite keeps two (the graph holds every node's data), which is what a
 * linear layer's forward pass peaks on. */
static PyObject *matmul_bias_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                     Py_ssize_t n) {
    UNUSED(p);
    UNUSED(n);
    if (array_layout(a[0])->ndim < 2 || array_layout(a[1])->ndim < 2) {
        PyErr_SetString(PyExc_ValueError, "MatMulBias needs x and w with at least 2 dimensions");
        return NULL;
    }
    nd_array out;
    nd_status status = nd_array_linear(&NDArray_CAST(a[0])->array, &NDArray_CAST(a[1])->array,
                                       &NDArray_CAST(a[2])->array, &out);
    return array_result(st, status, &out);
}

/* A wrapped engine array as a constant gradient held by the scope. */
static PyObject *g_array(grad_scope *s, nd_array *a) {
    return g_const(s, scope_keep(s, ndarray_wrap(s->st, a)));
}

/* All three gradients from one pass over g where the engine has one (the
 * CPU's narrow products: nd_array_linear_grads), when they are values, not
 * a recorded graph; NULL without failing: compose them. */
static PyObject *matmul_bias_fused_grads(grad_scope *s, PyObject *g) {
    if (is_recording() || !g_wanted(s, 0) || !g_wanted(s, 1) || !g_wanted(s, 2)) return NULL;
    PyObject *data[4] = {g_data(s, g), g_data(s, g_input(s, 0)), g_data(s, g_input(s, 1)),
                         g_data(s, g_input(s, 2))};
    for (int i = 0; i < 4; i++)
        if (data[i] == NULL || !ndarray_check(s->st, data[i])) return NULL;
    const nd_array *gd = &NDArray_CAST(data[0])->array, *bias = &NDArray_CAST(data[3])->array;
    const nd_layout *bl = &bias->layout;
    /* The bias is a row, (n,) or (1, n), of g's dtype. */
    if (gd->layout.ndim != 2 || bl->ndim < 1 || bl->ndim > 2 ||
        (bl->ndim == 2 && bl->shape[0] != 1) || bl->shape[bl->ndim - 1] != gd->layout.shape[1] ||
        nd_array_dtype(bias) != nd_array_dtype(gd))
        return NULL;
    nd_array gx, gw, gb;
    int fused;
    nd_status status = nd_array_linear_grads(gd, &NDArray_CAST(data[1])->array,
                                             &NDArray_CAST(data[2])->array, &gx, &gw, &gb, &fused);
    if (status != ND_OK) {
        raise_status(s->st, status);
        return scope_fail(s);
    }
    if (!fused) return NULL;
    PyObject *x_grad = g_array(s, &gx), *w_grad = g_array(s, &gw);
    PyObject *b_row = scope_keep(s, ndarray_wrap(s->st, &gb));
    if (b_row == NULL) return NULL;
    PyObject *b_grad = g_const(s, scope_keep(s, array_reshape(s->st, b_row, bl->ndim, bl->shape)));
    return grads_n(s, (PyObject *[]){x_grad, w_grad, b_grad}, 3);
}

static PyObject *matmul_bias_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                      PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    PyObject *fused = matmul_bias_fused_grads(s, g);
    if (fused != NULL || s->failed) return fused;
    /* MatMul's two gradients, and g summed down to the bias' shape */
    PyObject *gx, *gw;
    matmul_grads(s, g, g_input(s, 0), g_input(s, 1), &gx, &gw);
    PyObject *gb = g_wanted(s, 2) ? unbroadcast(s, g, g_input(s, 2)) : g_unwanted();
    return grads_n(s, (PyObject *[]){gx, gw, gb}, 3);
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

static PyObject *getitem_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                 Py_ssize_t n) {
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

static PyObject *getitem_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    /* g scattered into zeros of x's shape at the key */
    op_params q = *p;
    if (g_shape(s, g_input(s, 0), &q.ndim, q.shape) < 0) return NULL;
    return grads1(s, g_apply1(s, OP_SET_ITEM_GRAD, &q, g));
}

static PyObject *scatter_slice_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                       Py_ssize_t n) {
    UNUSED(n);
    PyObject *zeros = array_full_like(st, a[0], p->ndim, p->shape, 0.0f);
    if (zeros == NULL) return NULL;
    PyObject *view = PyObject_GetItem(zeros, p->key);
    PyObject *src =
        view ? array_reshape(st, a[0], array_layout(view)->ndim, array_layout(view)->shape) : NULL;
    nd_status status =
        src ? nd_array_assign(&NDArray_CAST(view)->array, &NDArray_CAST(src)->array) : ND_OK;
    Py_XDECREF(view);
    if (src == NULL || status != ND_OK) {
        Py_XDECREF(src);
        Py_DECREF(zeros);
        return status != ND_OK ? raise_status(st, status) : NULL;
    }
    Py_DECREF(src);
    return zeros;
}

static PyObject *scatter_slice_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                        PyObject *node) {
    UNUSED(node);
    return grads1(s, g_apply1(s, OP_GET_ITEM, p, g)); /* g[key] */
}

/* ----------------------------------------------------------- tuples */

static PyObject *make_tuple_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                    Py_ssize_t n) {
    UNUSED(st);
    UNUSED(p);
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) PyTuple_SET_ITEM(t, i, Py_NewRef(a[i]));
    return t;
}

static PyObject *make_tuple_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                     PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    /* (g[0], g[1], ...) */
    Py_ssize_t n = PyTuple_GET_SIZE(s->inputs);
    PyObject *items = scope_keep(s, PyTuple_New(n));
    for (Py_ssize_t i = 0; items != NULL && i < n; i++) {
        op_params q = no_params;
        q.index = i;
        PyObject *item = g_apply1(s, OP_TUPLE_GET_ITEM, &q, g);
        if (item == NULL) return NULL;
        PyTuple_SET_ITEM(items, i, Py_NewRef(item));
    }
    return items;
}

static PyObject *tuple_get_item_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                        Py_ssize_t n) {
    UNUSED(st);
    UNUSED(n);
    Py_ssize_t size = PyTuple_GET_SIZE(a[0]), i = p->index < 0 ? p->index + size : p->index;
    if (i < 0 || i >= size) {
        PyErr_SetString(PyExc_IndexError, "TensorTuple index out of range");
        return NULL;
    }
    return Py_NewRef(PyTuple_GET_ITEM(a[0], i));
}

static PyObject *tuple_get_item_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                         PyObject *node) {
    UNUSED(node);
    /* make_tuple(zeros, ..., g at the index, ..., zeros) */
    PyObject *data = g_data(s, g_input(s, 0));
    if (data == NULL) return NULL;
    if (!PyTuple_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "TupleGetItem's input holds no tuple of arrays");
        return scope_fail(s);
    }
    Py_ssize_t size = PyTuple_GET_SIZE(data), index = p->index < 0 ? p->index + size : p->index;
    PyObject *parts = scope_keep(s, PyTuple_New(size));
    for (Py_ssize_t i = 0; parts != NULL && i < size; i++) {
        PyObject *item = PyTuple_GET_ITEM(data, i), *part;
        if (i == index) {
            part = g;
        } else if (ndarray_check(s->st, item)) {
            const nd_layout *l = array_layout(item);
            part = g_const(s, scope_keep(s, array_full_like(s->st, item, l->ndim, l->shape, 0.0f)));
        } else {
            PyErr_SetString(PyExc_TypeError, "a TensorTuple's data must be a tuple of NDArrays");
            return scope_fail(s);
        }
        if (part == NULL) return NULL;
        PyTuple_SET_ITEM(parts, i, Py_NewRef(part));
    }
    return parts ? grads1(s, scope_keep(s, apply_op(s->st, OP_MAKE_TUPLE, &no_params, parts)))
                 : NULL;
}

static PyObject *fused_add_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                   Py_ssize_t n) {
    UNUSED(n);
    /* (x + c0, x + c1) */
    PyObject *first = array_binary_scalar(st, ND_ADD, a[0], p->scalar, 0);
    PyObject *second = first ? array_binary_scalar(st, ND_ADD, a[0], p->scalar2, 0) : NULL;
    PyObject *pair = second ? PyTuple_Pack(2, first, second) : NULL;
    Py_XDECREF(first);
    Py_XDECREF(second);
    return pair;
}

static PyObject *fused_add_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                    PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    op_params first = no_params, second = no_params;
    second.index = 1;
    /* g[0] + g[1] */
    return grads1(s, g_add(s, g_apply1(s, OP_TUPLE_GET_ITEM, &first, g),
                           g_apply1(s, OP_TUPLE_GET_ITEM, &second, g)));
}

/* ----------------------------------------------------- stack/split */

static PyObject *stack_compute(needle_state *st, const op_params *p, PyObject *const *a,
                               Py_ssize_t n) {
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
        if (l->ndim != first->ndim ||
            memcmp(l->shape, first->shape, sizeof(int64_t) * (size_t)l->ndim)) {
            PyErr_SetString(PyExc_ValueError, "stack: all tensors must have the same shape");
            return NULL;
        }
    }
    int axis;
    if (first->ndim + 1 > ND_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "stack: the result would have more than %d dimensions",
                     ND_MAX_DIMS);
        return NULL;
    }
    if (normalize_axis(st, p->axis, first->ndim + 1, &axis) < 0) return NULL;
    int64_t shape[ND_MAX_DIMS];
    for (int i = 0, j = 0; i <= first->ndim; i++) shape[i] = i == axis ? count : first->shape[j++];
    PyObject *out = array_empty_like(st, PyTuple_GET_ITEM(items, 0), first->ndim + 1, shape);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        nd_array slot = NDArray_CAST(out)->array;
        nd_layout_slice(&slot.layout, axis, i, 1, 1);
        nd_layout_drop_dim(&slot.layout, axis);
        if (array_assign_into(st, out, &slot, &NDArray_CAST(PyTuple_GET_ITEM(items, i))->array) ==
            NULL)
            return NULL;
    }
    return out;
}

static PyObject *stack_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return grads1(s, g_apply1(s, OP_SPLIT, p, g)); /* split(g, axis) */
}

static PyObject *split_compute(needle_state *st, const op_params *p, PyObject *const *a,
                               Py_ssize_t n) {
    UNUSED(n);
    const nd_layout *l = array_layout(a[0]);
    int axis;
    if (normalize_axis(st, p->axis, l->ndim, &axis) < 0) return NULL;
    PyObject *parts = PyTuple_New(l->shape[axis]);
    for (int64_t i = 0; parts && i < l->shape[axis]; i++) {
        nd_layout view = *l;
        nd_layout_slice(&view, axis, i, 1, 1);
        nd_layout_drop_dim(&view, axis);
        PyObject *part = array_view(st, a[0], &view);
        if (part == NULL) {
            Py_CLEAR(parts);
            break;
        }
        PyTuple_SET_ITEM(parts, i, part);
    }
    return parts;
}

static PyObject *split_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    return grads1(s, g_apply1(s, OP_STACK, p, g)); /* stack(g, axis) */
}

/* ------------------------------------------------------------- cast */

/* Cast(dtype): a converted copy, or the array itself when it already has
 * dtype (an op object called directly; astype makes no node then). */
static PyObject *cast_compute(needle_state *st, const op_params *p, PyObject *const *a,
                              Py_ssize_t n) {
    UNUSED(n);
    const nd_array *src = &NDArray_CAST(a[0])->array;
    if (nd_array_dtype(src) == p->dtype) return Py_NewRef(a[0]);
    nd_array out;
    nd_status status = nd_array_astype(src, p->dtype, &out);
    return array_result(st, status, &out);
}

static PyObject *cast_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    return grads1(s, g_as_dtype_of(s, g, g_input(s, 0))); /* g cast back to x's dtype */
}

void ops_basic_register(op_impl *t) {
    t[OP_TRANSPOSE] = (op_impl){transpose_compute, transpose_gradient};
    t[OP_RESHAPE] = (op_impl){reshape_compute, reshape_gradient};
    t[OP_BROADCAST_TO] = (op_impl){broadcast_compute, broadcast_gradient};
    t[OP_SUMMATION] = (op_impl){summation_compute, summation_gradient};
    t[OP_MATMUL] = (op_impl){matmul_compute, matmul_gradient};
    t[OP_MATMUL_BIAS] = (op_impl){matmul_bias_compute, matmul_bias_gradient};
    t[OP_MAX] = (op_impl){max_compute, max_gradient};
    t[OP_GET_ITEM] = (op_impl){getitem_compute, getitem_gradient};
    t[OP_SET_ITEM_GRAD] = (op_impl){scatter_slice_compute, scatter_slice_gradient};
    t[OP_MAKE_TUPLE] = (op_impl){make_tuple_compute, make_tuple_gradient};
    t[OP_TUPLE_GET_ITEM] = (op_impl){tuple_get_item_compute, tuple_get_item_gradient};
    t[OP_FUSED_ADD_SCALARS] = (op_impl){fused_add_compute, fused_add_gradient};
    t[OP_STACK] = (op_impl){stack_compute, stack_gradient};
    t[OP_SPLIT] = (op_impl){split_compute, split_gradient};
    t[OP_CAST] = (op_impl){cast_compute, cast_gradient};
}
