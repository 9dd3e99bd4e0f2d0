/* ops_binary.c: the autograd side of the engine's catalogue of binary ops
 * (ND_EWISE_BINARY_OPS in csrc/ewise_ops.h): the gradients of the rows that
 * name autograd classes, <name>_gradient (Ewise: two Tensors) and
 * <name>_scalar_gradient (Scalar: a Tensor and p->scalar), and the compute,
 * table entries, Tensor methods and needle_c.BINARY_OPS expanded from the
 * rows. A row that names a class without its gradient here does not
 * compile, which is the point.
 *
 * add, mul, div and pow keep the course's gradient formulas (so "needle"
 * mode builds the course's graphs); elementwise ops broadcast like NumPy and
 * their gradients sum back to each input's shape (unbroadcast), a no-op for
 * the course's equal shapes. In a cycle_free backward an unwanted input's
 * partial is not computed (g_wanted).
 *
 * maximum/minimum propagate NaN and return the first operand at a tie (so
 * maximum(-0, 0) is -0, as PyTorch's); their gradient splits a tie evenly
 * and passes g to both sides where either is NaN (PyTorch's masks: the
 * first operand's weight is 1, 0 where it lost, 1/2 at a tie). The masks
 * are constants of the graph, as relu's is.
 */
#include "grad_scope.h"
#include "ops_util.h"

#define UNUSED(x) (void)(x)

static const op_params no_params;

/* ------------------------------------------------ add, mul, div, pow */

static PyObject *add_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    /* (g, g), each summed back to its input's shape */
    return grads2(s, g_wanted(s, 0) ? unbroadcast(s, g, g_input(s, 0)) : g_unwanted(),
                  g_wanted(s, 1) ? unbroadcast(s, g, g_input(s, 1)) : g_unwanted());
}

static PyObject *mul_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    PyObject *a = g_input(s, 0), *b = g_input(s, 1);
    /* (g * b, g * a) */
    return grads2(s, g_wanted(s, 0) ? unbroadcast(s, g_mul(s, g, b), a) : g_unwanted(),
                  g_wanted(s, 1) ? unbroadcast(s, g_mul(s, g, a), b) : g_unwanted());
}

static PyObject *div_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    PyObject *a = g_input(s, 0), *b = g_input(s, 1);
    /* (g / b, -g * a / b**2) */
    PyObject *ga = g_wanted(s, 0) ? unbroadcast(s, g_div(s, g, b), a) : g_unwanted();
    PyObject *gb =
        g_wanted(s, 1)
            ? unbroadcast(s, g_neg(s, g_div(s, g_mul(s, g, a), g_scalar(s, OP_POW_SCALAR, b, 2.0))),
                          b)
            : g_unwanted();
    return grads2(s, ga, gb);
}

static PyObject *pow_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    PyObject *a = g_input(s, 0), *b = g_input(s, 1);
    /* (g * b * a**(b-1), g * log(a) * a**b), a**b being the node itself */
    PyObject *pw = g_apply2(s, OP_EWISE_POW, &no_params, a, g_scalar(s, OP_ADD_SCALAR, b, -1.0));
    PyObject *ga = unbroadcast(s, g_mul(s, g_mul(s, g, b), pw), a);
    PyObject *gb = unbroadcast(s, g_mul(s, g_mul(s, g, g_unary(s, OP_LOG, a)), node), b);
    return grads2(s, ga, gb);
}

static PyObject *add_scalar_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                     PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    return grads1(s, g); /* g */
}

static PyObject *mul_scalar_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                     PyObject *node) {
    UNUSED(node);
    return grads1(s, g_scalar(s, OP_MUL_SCALAR, g, p->scalar)); /* g * c */
}

static PyObject *div_scalar_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                     PyObject *node) {
    UNUSED(node);
    return grads1(s, g_scalar(s, OP_DIV_SCALAR, g, p->scalar)); /* g / c */
}

static PyObject *pow_scalar_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                     PyObject *node) {
    UNUSED(node);
    /* g * (c * x**(c-1)) */
    PyObject *x = g_input(s, 0);
    return grads1(s, g_mul(s, g,
                           g_scalar(s, OP_MUL_SCALAR,
                                    g_scalar(s, OP_POW_SCALAR, x, p->scalar - 1.0), p->scalar)));
}

/* ---------------------------------------------------- maximum, minimum */

/* The weight 1 - (x `lose` y) - (x == y) / 2 of maximum/minimum's gradient;
 * y is an NDArray, or NULL for the scalar ys. A new reference. */
static PyObject *tie_weights(needle_state *st, PyObject *x, PyObject *y, double ys,
                             nd_binary_op lose) {
    PyObject *lost = y ? array_binary(st, lose, x, y) : array_binary_scalar(st, lose, x, ys, 0);
    PyObject *tie =
        lost ? (y ? array_binary(st, ND_EQ, x, y) : array_binary_scalar(st, ND_EQ, x, ys, 0))
             : NULL;
    PyObject *half = tie ? array_binary_scalar(st, ND_MUL, tie, 0.5, 0) : NULL;
    PyObject *won = half ? array_binary_scalar(st, ND_SUB, lost, 1.0, 1) : NULL;
    PyObject *w = won ? array_binary(st, ND_SUB, won, half) : NULL;
    Py_XDECREF(lost);
    Py_XDECREF(tie);
    Py_XDECREF(half);
    Py_XDECREF(won);
    return w;
}

static PyObject *minmax_gradient(grad_scope *s, PyObject *g, nd_binary_op a_loses,
                                 nd_binary_op b_loses) {
    PyObject *a = g_input(s, 0), *b = g_input(s, 1);
    PyObject *x = g_data(s, a), *y = g_data(s, b);
    if (x == NULL || y == NULL) return NULL;
    PyObject *ga =
        g_wanted(s, 0) ? g_weighted(s, g, tie_weights(s->st, x, y, 0.0, a_loses), a) : g_unwanted();
    PyObject *gb =
        g_wanted(s, 1) ? g_weighted(s, g, tie_weights(s->st, y, x, 0.0, b_loses), b) : g_unwanted();
    return grads2(s, ga, gb);
}

static PyObject *maximum_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    return minmax_gradient(s, g, ND_LT, ND_LT);
}

static PyObject *minimum_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    return minmax_gradient(s, g, ND_GT, ND_GT);
}

static PyObject *minmax_scalar_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                        nd_binary_op loses) {
    PyObject *x = g_data(s, g_input(s, 0));
    if (x == NULL) return NULL;
    return grads1(s,
                  g_weighted(s, g, tie_weights(s->st, x, NULL, p->scalar, loses), g_input(s, 0)));
}

static PyObject *maximum_scalar_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                         PyObject *node) {
    UNUSED(node);
    return minmax_scalar_gradient(s, p, g, ND_LT);
}

static PyObject *minimum_scalar_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                         PyObject *node) {
    UNUSED(node);
    return minmax_scalar_gradient(s, p, g, ND_GT);
}

/* ------------------------------------------- expanded from the catalogue */

/* The compute of a row's Ewise and Scalar ops: the engine's op on the
 * arrays, or on the array and p->scalar at its dtype (array_binary_scalar,
 * which also picks pow's exact forms). */
#define BINARY_COMPUTE(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    ND_EW_IF(                                                                                 \
        Ewise, static PyObject *name##_compute(needle_state *st, const op_params *p,          \
                                               PyObject *const *a, Py_ssize_t n) {            \
            UNUSED(p);                                                                        \
            UNUSED(n);                                                                        \
            return array_binary(st, ND_##id, a[0], a[1]);                                     \
        })                                                                                    \
    ND_EW_IF(                                                                                 \
        Scalar, static PyObject *name##_scalar_compute(needle_state *st, const op_params *p,  \
                                                       PyObject *const *a, Py_ssize_t n) {    \
            UNUSED(n);                                                                        \
            return array_binary_scalar(st, ND_##id, a[0], p->scalar, 0);                      \
        })
ND_EWISE_BINARY_OPS(BINARY_COMPUTE, )
#undef BINARY_COMPUTE

void ops_binary_register(op_impl *t) {
#define BINARY_ENTRY(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    ND_EW_IF(Ewise, t[OP_EWISE_##id] = (op_impl){name##_compute, name##_gradient};)         \
    ND_EW_IF(Scalar,                                                                        \
             t[OP_##id##_SCALAR] = (op_impl){name##_scalar_compute, name##_scalar_gradient};)
    ND_EWISE_BINARY_OPS(BINARY_ENTRY, )
#undef BINARY_ENTRY
}

/* A row's field as Python sees it: its name, or None for the marker _. */
#define BINARY_FIELD(field) ND_EW_CAT_(BINARY_FIELD_, ND_EW_IS_NONE_(field))(#field)
#define BINARY_FIELD_0(text) text
#define BINARY_FIELD_1(text) NULL

int ops_binary_export(PyObject *module) {
#define BINARY_ROW(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    {#name,                                                                               \
     BINARY_FIELD(Ewise),                                                                 \
     BINARY_FIELD(ewise_fn),                                                              \
     BINARY_FIELD(Scalar),                                                                \
     BINARY_FIELD(scalar_fn),                                                             \
     BINARY_FIELD(method),                                                                \
     doc},
    static const char *const rows[][7] = {ND_EWISE_BINARY_OPS(BINARY_ROW, )};
#undef BINARY_ROW
    const Py_ssize_t n = (Py_ssize_t)(sizeof rows / sizeof rows[0]);
    PyObject *catalogue = PyTuple_New(n);
    for (Py_ssize_t i = 0; catalogue != NULL && i < n; i++) {
        /* z: a NULL field is None */
        PyObject *row = Py_BuildValue("(szzzzzs)", rows[i][0], rows[i][1], rows[i][2], rows[i][3],
                                      rows[i][4], rows[i][5], rows[i][6]);
        if (row == NULL) Py_CLEAR(catalogue);
        else PyTuple_SET_ITEM(catalogue, i, row);
    }
    int rc = catalogue != NULL ? PyModule_AddObjectRef(module, "BINARY_OPS", catalogue) : -1;
    Py_XDECREF(catalogue);
    return rc;
}
