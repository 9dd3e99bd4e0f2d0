/* grad_scope.c: the owning scope of a built-in gradient and the Tensor-level
 * building blocks gradients are written with (see grad_scope.h for the
 * contract: borrowed in, borrowed out, NULL passes through).
 */
#include "grad_scope.h"

#include "ops_util.h"

static const op_params no_params;

void scope_open(grad_scope *s, needle_state *st, PyObject *node) {
    s->st = st;
    s->node = Py_NewRef(node);
    s->inputs = Py_NewRef(Tensor_CAST(node)->inputs);
    s->held = s->inline_held;
    s->count = 0;
    s->capacity = GRAD_SCOPE_INLINE;
    s->failed = 0;
    s->prune = 0;
}

void scope_close(grad_scope *s) {
    for (Py_ssize_t i = 0; i < s->count; i++) Py_DECREF(s->held[i]);
    if (s->held != s->inline_held) PyMem_Free(s->held);
    s->held = s->inline_held;
    s->count = 0;
    Py_CLEAR(s->inputs);
    Py_CLEAR(s->node);
}

PyObject *scope_keep(grad_scope *s, PyObject *new_ref) {
    if (new_ref == NULL) {
        s->failed = 1;
        return NULL;
    }
    if (s->count == s->capacity) {
        Py_ssize_t capacity = s->capacity * 2;
        PyObject **grown = PyMem_Malloc(sizeof(PyObject *) * (size_t)capacity);
        if (grown == NULL) {
            Py_DECREF(new_ref);
            PyErr_NoMemory();
            s->failed = 1;
            return NULL;
        }
        memcpy(grown, s->held, sizeof(PyObject *) * (size_t)s->count);
        if (s->held != s->inline_held) PyMem_Free(s->held);
        s->held = grown;
        s->capacity = capacity;
    }
    s->held[s->count++] = new_ref;
    return new_ref;
}

PyObject *scope_fail(grad_scope *s) {
    s->failed = 1;
    return NULL;
}

PyObject *g_input(grad_scope *s, Py_ssize_t i) { return PyTuple_GET_ITEM(s->inputs, i); }

PyObject *g_data(grad_scope *s, PyObject *value) {
    return s->failed || value == NULL ? NULL : scope_keep(s, realize(s->st, value));
}

int g_shape(grad_scope *s, PyObject *value, int *ndim, int64_t *shape) {
    if (s->failed || value == NULL) return -1;
    if (value_shape(s->st, value, ndim, shape) == 0) return 0;
    s->failed = 1;
    return -1;
}

/* ------------------------------------------------------ built-in ops */

PyObject *g_apply1(grad_scope *s, op_kind kind, const op_params *p, PyObject *a) {
    return s->failed || a == NULL ? NULL : scope_keep(s, apply1(s->st, kind, p, a));
}

PyObject *g_apply2(grad_scope *s, op_kind kind, const op_params *p, PyObject *a, PyObject *b) {
    return s->failed || a == NULL || b == NULL ? NULL : scope_keep(s, apply2(s->st, kind, p, a, b));
}

PyObject *g_apply3(grad_scope *s, op_kind kind, const op_params *p, PyObject *a, PyObject *b,
                   PyObject *c) {
    if (s->failed || a == NULL || b == NULL || c == NULL) return NULL;
    PyObject *inputs = scope_keep(s, PyTuple_Pack(3, a, b, c));
    return inputs == NULL ? NULL : scope_keep(s, apply_op(s->st, kind, p, inputs));
}

PyObject *g_add(grad_scope *s, PyObject *a, PyObject *b) {
    return g_apply2(s, OP_EWISE_ADD, &no_params, a, b);
}
PyObject *g_sub(grad_scope *s, PyObject *a, PyObject *b) { return g_add(s, a, g_neg(s, b)); }
PyObject *g_mul(grad_scope *s, PyObject *a, PyObject *b) {
    return g_apply2(s, OP_EWISE_MUL, &no_params, a, b);
}
PyObject *g_div(grad_scope *s, PyObject *a, PyObject *b) {
    return g_apply2(s, OP_EWISE_DIV, &no_params, a, b);
}
PyObject *g_matmul(grad_scope *s, PyObject *a, PyObject *b) {
    return g_apply2(s, OP_MATMUL, &no_params, a, b);
}
PyObject *g_neg(grad_scope *s, PyObject *a) { return g_apply1(s, OP_NEG, &no_params, a); }
PyObject *g_unary(grad_scope *s, op_kind kind, PyObject *a) {
    return g_apply1(s, kind, &no_params, a);
}

PyObject *g_scalar(grad_scope *s, op_kind kind, PyObject *a, double scalar) {
    op_params p = no_params;
    p.scalar = scalar;
    return g_apply1(s, kind, &p, a);
}

static PyObject *shape_op(grad_scope *s, op_kind kind, PyObject *a, int ndim,
                          const int64_t *shape) {
    op_params p = no_params;
    p.ndim = ndim;
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)ndim);
    return g_apply1(s, kind, &p, a);
}

PyObject *g_reshape(grad_scope *s, PyObject *a, int ndim, const int64_t *shape) {
    return shape_op(s, OP_RESHAPE, a, ndim, shape);
}

PyObject *g_broadcast(grad_scope *s, PyObject *a, int ndim, const int64_t *shape) {
    return shape_op(s, OP_BROADCAST_TO, a, ndim, shape);
}

PyObject *g_sum_mask(grad_scope *s, PyObject *a, int ndim, uint32_t mask) {
    op_params p = no_params;
    p.axes_given = 1;
    for (int i = 0; i < ndim; i++)
        if (mask & (1u << i)) p.axes[p.naxes++] = i;
    return g_apply1(s, OP_SUMMATION, &p, a);
}

PyObject *g_axes_op(grad_scope *s, op_kind kind, PyObject *a, int naxes, const int *axes,
                    int dilation) {
    op_params p = no_params;
    p.axes_given = 1;
    p.naxes = naxes;
    memcpy(p.axes, axes, sizeof(int) * (size_t)naxes);
    p.dilation = dilation;
    return g_apply1(s, kind, &p, a);
}

PyObject *g_transpose(grad_scope *s, PyObject *a, int x, int y) {
    return g_axes_op(s, OP_TRANSPOSE, a, 2, (int[]){x, y}, 0);
}

PyObject *g_transpose_last(grad_scope *s, PyObject *a) {
    return g_apply1(s, OP_TRANSPOSE, &no_params, a);
}

PyObject *g_expand(grad_scope *s, PyObject *g, int ndim, const int64_t *shape, uint32_t mask) {
    int64_t kept[ND_MAX_DIMS];
    for (int i = 0; i < ndim; i++) kept[i] = (mask >> i) & 1u ? 1 : shape[i];
    return g_broadcast(s, g_reshape(s, g, ndim, kept), ndim, shape);
}

PyObject *g_cast(grad_scope *s, PyObject *a, nd_dtype dtype) {
    return s->failed || a == NULL ? NULL : scope_keep(s, cast_value(s->st, a, dtype));
}

PyObject *g_as_dtype_of(grad_scope *s, PyObject *a, PyObject *like) {
    nd_dtype dtype;
    if (s->failed || a == NULL || like == NULL) return NULL;
    if (value_dtype(s->st, like, &dtype) < 0) return scope_fail(s);
    return g_cast(s, a, dtype);
}

/* The sum is taken in g's (the wider) dtype and then cast. */
PyObject *unbroadcast(grad_scope *s, PyObject *g, PyObject *like) {
    if (s->failed || g == NULL || like == NULL) return NULL;
    int differ = shapes_differ(s->st, g, like);
    if (differ <= 0) return differ == 0 ? g_as_dtype_of(s, g, like) : scope_fail(s);
    int gnd, lnd;
    int64_t gs[ND_MAX_DIMS], ls[ND_MAX_DIMS];
    if (g_shape(s, g, &gnd, gs) < 0 || g_shape(s, like, &lnd, ls) < 0) return NULL;
    /* Only axes of g longer than 1 are summed: a dropped leading axis of
     * length 1 sums one element, which the reshape alone does, as a view of
     * g rather than a copy the graph would hold. */
    uint32_t mask = 0;
    for (int i = 0; i < gnd; i++) {
        int li = i - (gnd - lnd);
        if (gs[i] != 1 && (li < 0 || ls[li] == 1)) mask |= 1u << i;
    }
    return g_as_dtype_of(s, g_reshape(s, mask ? g_sum_mask(s, g, gnd, mask) : g, lnd, ls), like);
}

PyObject *g_const(grad_scope *s, PyObject *array) {
    return s->failed || array == NULL ? NULL : scope_keep(s, make_const(s->st, array, 0));
}

PyObject *g_weighted(grad_scope *s, PyObject *g, PyObject *w, PyObject *like) {
    return unbroadcast(s, g_mul(s, g, g_const(s, scope_keep(s, w))), like);
}

PyObject *g_zeros_like(grad_scope *s, PyObject *value) {
    PyObject *data = g_data(s, value);
    if (data == NULL) return NULL;
    if (!ndarray_check(s->st, data)) {
        PyErr_Format(PyExc_TypeError,
                     "a zero gradient needs a Tensor holding an NDArray, got %.100s",
                     Py_TYPE(data)->tp_name);
        return scope_fail(s);
    }
    const nd_layout *l = array_layout(data);
    return g_const(s, scope_keep(s, array_full_like(s->st, data, l->ndim, l->shape, 0.0f)));
}

int g_wanted(grad_scope *s, Py_ssize_t i) {
    if (!s->prune) return 1;
    TensorObject *t = Tensor_CAST(PyTuple_GET_ITEM(s->inputs, i));
    return t->requires_grad || t->retains_grad;
}

PyObject *g_unwanted(void) { return Py_None; }

PyObject *g_input_zeros(grad_scope *s, Py_ssize_t i) {
    return g_wanted(s, i) ? g_zeros_like(s, g_input(s, i)) : g_unwanted();
}

/* ----------------------------------------------------------- results */

PyObject *grads_n(grad_scope *s, PyObject *const *items, Py_ssize_t n) {
    if (s->failed) return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (items[i] == NULL) return NULL;
    PyObject *t = PyTuple_New(n);
    if (t == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, Py_NewRef(items[i]));
    return scope_keep(s, t);
}

PyObject *grads1(grad_scope *s, PyObject *a) { return grads_n(s, &a, 1); }

PyObject *grads2(grad_scope *s, PyObject *a, PyObject *b) {
    return grads_n(s, (PyObject *[]){a, b}, 2);
}
