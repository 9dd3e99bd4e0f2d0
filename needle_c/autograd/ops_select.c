/* ops_select.c: the ops that choose between values: clamp and where, with
 * PyTorch's semantics and gradients (maximum and minimum are rows of the
 * catalogue: ops_binary.c).
 *
 * clamp is minimum(maximum(x, min), max); its gradient passes g where min <= x <= max, 0 elsewhere and at NaN. where's
 * gradients are where(c, g, 0) and where(c, 0, g); the condition has none.
 * The masks are constants of the graph, as relu's is.
 */
#include "grad_scope.h"
#include "ops_util.h"

#define UNUSED(x) (void)(x)

static const op_params no_params;

/* --------------------------------------------------- array building */

/* where(c, x, y) on arrays: m = (c != 0) in the result's dtype, then
 * pick(x, m) + pick(y, m == 0), pick giving -0 where not chosen, which the
 * sum leaves unchanged whatever the chosen value (ewise_ops.h). */
static PyObject *where_arrays(needle_state *st, PyObject *c, PyObject *x, PyObject *y) {
    nd_dtype dtype = nd_promote_dtypes(nd_array_dtype(&NDArray_CAST(x)->array),
                                       nd_array_dtype(&NDArray_CAST(y)->array));
    PyObject *set = array_binary_scalar(st, ND_NE, c, 0.0, 0), *m = NULL;
    if (set != NULL) {
        nd_array cast;
        m = array_result(st, nd_array_astype(&NDArray_CAST(set)->array, dtype, &cast), &cast);
    }
    PyObject *unset = m ? array_binary_scalar(st, ND_EQ, m, 0.0, 0) : NULL;
    PyObject *px = unset ? array_binary(st, ND_PICK, x, m) : NULL;
    PyObject *py = px ? array_binary(st, ND_PICK, y, unset) : NULL;
    PyObject *out = py ? array_binary(st, ND_ADD, px, py) : NULL;
    Py_XDECREF(set);
    Py_XDECREF(m);
    Py_XDECREF(unset);
    Py_XDECREF(px);
    Py_XDECREF(py);
    return out;
}

/* ------------------------------------------------------------ compute */

/* Clamp(min, max): minimum(maximum(x, min), max), so min > max gives max
 * everywhere, as PyTorch's; an absent bound is -inf / inf. */
static PyObject *clamp_compute(needle_state *st, const op_params *p, PyObject *const *a,
                               Py_ssize_t n) {
    UNUSED(n);
    PyObject *low = array_binary_scalar(st, ND_MAXIMUM, a[0], p->scalar, 0);
    PyObject *out = low ? array_binary_scalar(st, ND_MINIMUM, low, p->scalar2, 0) : NULL;
    Py_XDECREF(low);
    return out;
}

/* ClampTensor(x, min, max): the same with Tensor bounds (broadcast). */
static PyObject *clamp_tensor_compute(needle_state *st, const op_params *p, PyObject *const *a,
                                      Py_ssize_t n) {
    UNUSED(p);
    UNUSED(n);
    PyObject *low = array_binary(st, ND_MAXIMUM, a[0], a[1]);
    PyObject *out = low ? array_binary(st, ND_MINIMUM, low, a[2]) : NULL;
    Py_XDECREF(low);
    return out;
}

static PyObject *where_compute(needle_state *st, const op_params *p, PyObject *const *a,
                               Py_ssize_t n) {
    UNUSED(p);
    UNUSED(n);
    return where_arrays(st, a[0], a[1], a[2]);
}

/* ---------------------------------------------------------- gradients */

static PyObject *clamp_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(node);
    /* g * (min <= x) * (x <= max) */
    PyObject *x = g_data(s, g_input(s, 0));
    if (x == NULL) return NULL;
    PyObject *above = array_binary_scalar(s->st, ND_GE, x, p->scalar, 0);
    PyObject *below = above ? array_binary_scalar(s->st, ND_LE, x, p->scalar2, 0) : NULL;
    PyObject *inside = below ? array_binary(s->st, ND_MUL, above, below) : NULL;
    Py_XDECREF(above);
    Py_XDECREF(below);
    if (inside == NULL) return scope_fail(s);
    return grads1(s, g_weighted(s, g, inside, g_input(s, 0)));
}

/* PyTorch's masks: x gets g where min <= x <= max; min where x < min < max;
 * max where x > max or max < min (NaN x: none of them). */
static PyObject *clamp_tensor_gradient(grad_scope *s, const op_params *p, PyObject *g,
                                       PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    PyObject *x = g_data(s, g_input(s, 0)), *lo = g_data(s, g_input(s, 1)),
             *hi = g_data(s, g_input(s, 2));
    if (x == NULL || lo == NULL || hi == NULL) return NULL;
    needle_state *st = s->st;
    PyObject *gx = g_unwanted(), *glo = g_unwanted(), *ghi = g_unwanted();
    if (g_wanted(s, 0)) {
        PyObject *ge = scope_keep(s, array_binary(st, ND_GE, x, lo));
        PyObject *le = ge ? scope_keep(s, array_binary(st, ND_LE, x, hi)) : NULL;
        gx = le ? g_weighted(s, g, array_binary(st, ND_MUL, ge, le), g_input(s, 0)) : NULL;
    }
    if (g_wanted(s, 1)) {
        PyObject *below = scope_keep(s, array_binary(st, ND_LT, x, lo));
        PyObject *ordered = below ? scope_keep(s, array_binary(st, ND_LT, lo, hi)) : NULL;
        glo = ordered ? g_weighted(s, g, array_binary(st, ND_MUL, below, ordered), g_input(s, 1))
                      : NULL;
    }
    if (g_wanted(s, 2)) {
        PyObject *above = scope_keep(s, array_binary(st, ND_GT, x, hi));
        PyObject *crossed = above ? scope_keep(s, array_binary(st, ND_LT, hi, lo)) : NULL;
        ghi = crossed
                  ? g_weighted(s, g, array_binary(st, ND_MAXIMUM, above, crossed), g_input(s, 2))
                  : NULL;
    }
    return grads_n(s, (PyObject *[]){gx, glo, ghi}, 3);
}

static PyObject *where_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    UNUSED(p);
    UNUSED(node);
    /* (none, where(c, g, 0), where(c, 0, g)) */
    PyObject *c = g_input(s, 0),
             *zeros = g_wanted(s, 1) || g_wanted(s, 2) ? g_zeros_like(s, g) : NULL;
    PyObject *gx = g_wanted(s, 1) ? unbroadcast(s, g_apply3(s, OP_WHERE, &no_params, c, g, zeros),
                                                g_input(s, 1))
                                  : g_unwanted();
    PyObject *gy = g_wanted(s, 2) ? unbroadcast(s, g_apply3(s, OP_WHERE, &no_params, c, zeros, g),
                                                g_input(s, 2))
                                  : g_unwanted();
    return grads_n(s, (PyObject *[]){g_input_zeros(s, 0), gx, gy}, 3);
}

void ops_select_register(op_impl *t) {
    t[OP_CLAMP] = (op_impl){clamp_compute, clamp_gradient};
    t[OP_CLAMP_TENSOR] = (op_impl){clamp_tensor_compute, clamp_tensor_gradient};
    t[OP_WHERE] = (op_impl){where_compute, where_gradient};
}
