/* ops_unary.c: the autograd side of the engine's catalogue of unary ops
 * (ND_EWISE_UNARY_OPS in csrc/ewise_ops.h): one gradient per row, named
 * <name>_gradient, and the compute and table entries expanded from the rows.
 * A row without its gradient here does not compile, which is the point.
 *
 * Gradients are written with the differentiable blocks of grad_scope.h, so
 * "needle" mode and create_graph record them as graphs; masks (relu, abs)
 * are constants of the graph, as the course's relu mask is. Each formula is
 * PyTorch's derivative, special values included (NaN stays NaN where
 * PyTorch's does; inf * 0 gives NaN as it does in PyTorch).
 */
#include "grad_scope.h"
#include "ops_util.h"

#define UNUSED(x) (void)(x)

/* A constant mask array op(x, 0) held by the scope (NULL passes through). */
static PyObject *mask_of(grad_scope *s, PyObject *x, nd_binary_op op) {
    PyObject *data = g_data(s, x);
    return data ? scope_keep(s, array_binary_scalar(s->st, op, data, 0.0, 0)) : NULL;
}

static PyObject *neg_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    UNUSED(node);
    return g_neg(s, g); /* -g */
}

static PyObject *log_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    UNUSED(node);
    return g_div(s, g, g_input(s, 0)); /* g / x */
}

static PyObject *exp_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    UNUSED(node);
    /* g * exp(x): the course builds a new Exp node here (the classic cycle) */
    return g_mul(s, g, g_unary(s, OP_EXP, g_input(s, 0)));
}

static PyObject *tanh_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    /* g * (1 - out**2), reading the node itself as the course does */
    return g_mul(s, g,
                 g_scalar(s, OP_ADD_SCALAR, g_neg(s, g_scalar(s, OP_POW_SCALAR, node, 2.0)), 1.0));
}

static PyObject *sqrt_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    return g_div(s, g, g_scalar(s, OP_MUL_SCALAR, node, 2.0)); /* g / (2 * out) */
}

static PyObject *sigmoid_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    /* g * (out * (1 - out)) */
    return g_mul(s, g, g_mul(s, node, g_scalar(s, OP_ADD_SCALAR, g_neg(s, node), 1.0)));
}

static PyObject *abs_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    UNUSED(node);
    /* g * sign(x), sign 0 at +-0 and NaN (PyTorch's sgn), a constant */
    PyObject *x = g_input(s, 0), *pos = mask_of(s, x, ND_GT), *neg = mask_of(s, x, ND_LT);
    PyObject *sign = pos && neg ? scope_keep(s, array_binary(s->st, ND_SUB, pos, neg)) : NULL;
    return g_mul(s, g, g_const(s, sign));
}

static PyObject *relu_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    /* g * (out > 0), the mask a constant of the graph */
    return g_mul(s, g, g_const(s, mask_of(s, node, ND_GT)));
}

/* x in float32 when it is float16 or bfloat16: the derivatives below cancel
 * (1 + erf, 1 + tanh near -1), so they are computed as PyTorch's kernels
 * compute them, in float32, and g * f'(x) rounds once, to x's dtype
 * (narrow_result). A recorded Cast, so the graph stays differentiable. */
static PyObject *widened(grad_scope *s, PyObject *x) {
    PyObject *data = g_data(s, x);
    if (data == NULL) return NULL;
    nd_dtype dtype = nd_array_dtype(&NDArray_CAST(data)->array);
    return dtype == ND_FLOAT16 || dtype == ND_BFLOAT16 ? g_cast(s, x, ND_FLOAT32) : x;
}

static PyObject *narrow_result(grad_scope *s, PyObject *g, PyObject *derivative) {
    return g_as_dtype_of(s, g_mul(s, g, derivative), g_input(s, 0));
}

/* 2 / sqrt(pi), 1 / sqrt(2), 1 / sqrt(2 pi), and gelu_tanh's sqrt(2 / pi) and 0.044715. */
#define TWO_OVER_SQRT_PI 1.12837916709551257390
#define SQRT_HALF 0.70710678118654752440
#define INV_SQRT_2PI 0.39894228040143267794
#define GELU_BETA 0.79788456080286535588
#define GELU_KAPPA 0.044715

static PyObject *erf_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    UNUSED(node);
    /* g * 2/sqrt(pi) * exp(-x**2) */
    PyObject *x = widened(s, g_input(s, 0));
    PyObject *e = g_unary(s, OP_EXP, g_neg(s, g_scalar(s, OP_POW_SCALAR, x, 2.0)));
    return narrow_result(s, g, g_scalar(s, OP_MUL_SCALAR, e, TWO_OVER_SQRT_PI));
}

static PyObject *gelu_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    UNUSED(node);
    /* g * (Phi(x) + x * phi(x)): Phi = (1 + erf(x / sqrt 2)) / 2, phi = exp(-x**2 / 2) / sqrt(2 pi) */
    PyObject *x = widened(s, g_input(s, 0));
    PyObject *cdf =
        g_scalar(s, OP_ADD_SCALAR,
                 g_scalar(s, OP_MUL_SCALAR,
                          g_unary(s, OP_ERF, g_scalar(s, OP_MUL_SCALAR, x, SQRT_HALF)), 0.5),
                 0.5);
    PyObject *pdf = g_scalar(
        s, OP_MUL_SCALAR,
        g_unary(s, OP_EXP, g_scalar(s, OP_MUL_SCALAR, g_scalar(s, OP_POW_SCALAR, x, 2.0), -0.5)),
        INV_SQRT_2PI);
    return narrow_result(s, g, g_add(s, cdf, g_mul(s, x, pdf)));
}

static PyObject *gelu_tanh_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    UNUSED(node);
    /* PyTorch's: t = tanh(beta * (x + kappa x**3));
     * g * (0.5 (1 + t) + 0.5 x (1 - t**2) beta (1 + 3 kappa x**2)) */
    PyObject *x = widened(s, g_input(s, 0)), *x2 = g_scalar(s, OP_POW_SCALAR, x, 2.0);
    PyObject *inner =
        g_scalar(s, OP_MUL_SCALAR,
                 g_add(s, x, g_scalar(s, OP_MUL_SCALAR, g_mul(s, x2, x), GELU_KAPPA)), GELU_BETA);
    PyObject *t = g_unary(s, OP_TANH, inner);
    PyObject *left = g_scalar(s, OP_MUL_SCALAR, g_scalar(s, OP_ADD_SCALAR, t, 1.0), 0.5);
    PyObject *sech2 = g_scalar(s, OP_ADD_SCALAR, g_neg(s, g_scalar(s, OP_POW_SCALAR, t, 2.0)), 1.0);
    PyObject *slope = g_scalar(
        s, OP_ADD_SCALAR, g_scalar(s, OP_MUL_SCALAR, x2, 3.0 * GELU_KAPPA * GELU_BETA), GELU_BETA);
    PyObject *right = g_mul(s, g_mul(s, g_scalar(s, OP_MUL_SCALAR, x, 0.5), sech2), slope);
    return narrow_result(s, g, g_add(s, left, right));
}

static PyObject *silu_gradient(grad_scope *s, PyObject *g, PyObject *node) {
    UNUSED(node);
    /* PyTorch's: g * sigmoid(x) * (1 + x * (1 - sigmoid(x))) */
    PyObject *x = widened(s, g_input(s, 0)), *sig = g_unary(s, OP_SIGMOID, x);
    PyObject *inner = g_scalar(s, OP_ADD_SCALAR,
                               g_mul(s, x, g_scalar(s, OP_ADD_SCALAR, g_neg(s, sig), 1.0)), 1.0);
    return narrow_result(s, g, g_mul(s, sig, inner));
}

/* ------------------------------------------- expanded from the catalogue */

#define UNARY_COMPUTE(A, id, name, Class, doc, formula)                                       \
    static PyObject *name##_compute(needle_state *st, const op_params *p, PyObject *const *a, \
                                    Py_ssize_t n) {                                           \
        UNUSED(p);                                                                            \
        UNUSED(n);                                                                            \
        return array_unary(st, ND_##id, a[0]);                                                \
    }
ND_EWISE_UNARY_OPS(UNARY_COMPUTE, )
#undef UNARY_COMPUTE

/* The op_gradient_fn of a row: its formula's one gradient as the tuple. */
#define UNARY_GRADIENT(A, id, name, Class, doc, formula)                          \
    static PyObject *name##_grads(grad_scope *s, const op_params *p, PyObject *g, \
                                  PyObject *node) {                               \
        UNUSED(p);                                                                \
        return grads1(s, name##_gradient(s, g, node));                            \
    }
ND_EWISE_UNARY_OPS(UNARY_GRADIENT, )
#undef UNARY_GRADIENT

void ops_unary_register(op_impl *t) {
#define UNARY_ENTRY(A, id, name, Class, doc, formula) \
    t[OP_##id] = (op_impl){name##_compute, name##_grads};
    ND_EWISE_UNARY_OPS(UNARY_ENTRY, )
#undef UNARY_ENTRY
}

int ops_unary_export(PyObject *module) {
#define UNARY_ROW(A, id, name, Class, doc, formula) {#name, #Class, doc},
    static const char *const rows[][3] = {ND_EWISE_UNARY_OPS(UNARY_ROW, )};
#undef UNARY_ROW
    const Py_ssize_t n = (Py_ssize_t)(sizeof rows / sizeof rows[0]);
    PyObject *catalogue = PyTuple_New(n);
    for (Py_ssize_t i = 0; catalogue != NULL && i < n; i++) {
        PyObject *row = Py_BuildValue("(sss)", rows[i][0], rows[i][1], rows[i][2]);
        if (row == NULL) Py_CLEAR(catalogue);
        else PyTuple_SET_ITEM(catalogue, i, row);
    }
    int rc = catalogue != NULL ? PyModule_AddObjectRef(module, "UNARY_OPS", catalogue) : -1;
    Py_XDECREF(catalogue);
    return rc;
}
