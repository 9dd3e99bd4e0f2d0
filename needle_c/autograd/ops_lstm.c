/* ops_lstm.c: the fused LSTM ops, compute (NDArrays) and gradient (Tensors):
 *   FusedLSTMCell(x, h, c, W_ih, W_hh[, b_ih, b_hh]) -> (h', c'), one step;
 *   FusedLSTM(X, h0, c0, W_ih, W_hh[, b_ih, b_hh]) -> (Y, h_n, c_n), one
 *   layer over a sequence X (T, B, in), Y (T, B, H) every step's h.
 * Both run the engine's LSTM (csrc/lstm.c): per step one GEMM and one fused
 * kernel forward, one kernel and one GEMM backward, the weight gradients one
 * GEMM each over the whole sequence. The cell is the layer with T = 1.
 *
 * The gradient, as for SoftmaxCrossEntropy (ops_nn.c): not recorded (a
 * cycle_free backward), constants from the engine's fused backward, which
 * reads what the forward saved in its output's storage; recorded ("needle"
 * mode, create_graph), the cell's formulas composed from primitive ops on
 * the node's inputs (the forward recomputed as ops too), so the gradient is
 * itself differentiable. Both give the same values.
 */
#include "grad_scope.h"
#include "ops_util.h"

enum { IN_X, IN_H, IN_C, IN_W_IH, IN_W_HH, IN_B_IH, IN_B_HH, IN_MAX };

static const op_params no_params;

static const nd_array *array_of(PyObject *a) { return &NDArray_CAST(a)->array; }

/* 5 inputs (no biases) or 7. */
static int check_arity(op_kind kind, Py_ssize_t n) {
    if (n == 5 || n == 7) return 0;
    PyErr_Format(PyExc_TypeError,
                 "%s takes 5 inputs (x, h, c, W_ih, W_hh) or 7 (and b_ih, b_hh), got %zd",
                 op_table[kind].name, n);
    return -1;
}

/* a (B, in) seen as (1, B, in): a leading 1 is always a view. */
static nd_array as_sequence(const nd_array *a) {
    nd_array v = *a;
    if (a->layout.ndim == 2)
        nd_layout_reshape(&a->layout, 3, (int64_t[]){1, a->layout.shape[0], a->layout.shape[1]},
                          &v.layout);
    return v;
}

/* The engine's forward on arrays a (the op's inputs): y, and h_n when
 * wanted, c_n. */
static nd_status run_forward(PyObject *const *a, Py_ssize_t n, const nd_array *x, nd_array *y,
                             nd_array *h_n, nd_array *c_n) {
    return nd_array_lstm(x, array_of(a[IN_H]), array_of(a[IN_C]), array_of(a[IN_W_IH]),
                         array_of(a[IN_W_HH]), n == IN_MAX ? array_of(a[IN_B_IH]) : NULL,
                         n == IN_MAX ? array_of(a[IN_B_HH]) : NULL, y, h_n, c_n);
}

/* A tuple of n new NDArrays made from arrays (each taken over). */
static PyObject *wrap_tuple(needle_state *st, nd_array *arrays, int n) {
    PyObject *t = PyTuple_New(n);
    for (int i = 0; i < n; i++) {
        PyObject *item = t != NULL ? ndarray_wrap(st, &arrays[i]) : NULL;
        if (item == NULL) {
            for (int k = i; k < n; k++)
                if (arrays[k].storage != NULL) nd_array_release(&arrays[k]);
            Py_XDECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, item);
    }
    return t;
}

/* ------------------------------------------------------------ compute */

static PyObject *cell_compute(needle_state *st, const op_params *p, PyObject *const *a,
                              Py_ssize_t n) {
    (void)p;
    if (check_arity(OP_LSTM_CELL, n) < 0) return NULL;
    const nd_layout *xl = array_layout(a[IN_X]);
    if (xl->ndim != 2) {
        PyErr_Format(PyExc_ValueError, "FusedLSTMCell: x must be 2-D (batch, input_size), got %d-D",
                     xl->ndim);
        return NULL;
    }
    nd_array x = as_sequence(array_of(a[IN_X])), out[2];
    nd_status status = run_forward(a, n, &x, &out[0], NULL, &out[1]);
    if (status != ND_OK) return raise_status(st, status);
    /* h' is y (1, B, H) seen as (B, H): its storage keeps the saved gates */
    nd_layout_reshape(&out[0].layout, 2, out[1].layout.shape, &out[0].layout);
    return wrap_tuple(st, out, 2);
}

static PyObject *layer_compute(needle_state *st, const op_params *p, PyObject *const *a,
                               Py_ssize_t n) {
    (void)p;
    if (check_arity(OP_LSTM, n) < 0) return NULL;
    nd_array out[3];
    nd_status status = run_forward(a, n, array_of(a[IN_X]), &out[0], &out[1], &out[2]);
    if (status != ND_OK) return raise_status(st, status);
    return wrap_tuple(st, out, 3);
}

/* ------------------------------------------- gradient: fused (constants) */

/* g's data as NDArrays: the k items of a TensorTuple's tuple. */
static int tuple_arrays(grad_scope *s, PyObject *value, Py_ssize_t k, PyObject **items) {
    PyObject *data = g_data(s, value);
    if (data == NULL) return -1;
    if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != k) {
        PyErr_Format(PyExc_TypeError, "an LSTM op's output and out_grad must be %zd-tuples", k);
        scope_fail(s);
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        items[i] = PyTuple_GET_ITEM(data, i);
        if (!ndarray_check(s->st, items[i])) {
            PyErr_SetString(PyExc_TypeError, "an LSTM op's output and out_grad hold NDArrays");
            scope_fail(s);
            return -1;
        }
    }
    return 0;
}

/* A constant Tensor taking over arr (held by the scope). */
static PyObject *g_const_array(grad_scope *s, nd_array *arr) {
    if (s->failed) {
        if (arr->storage != NULL) nd_array_release(arr);
        return NULL;
    }
    return g_const(s, scope_keep(s, ndarray_wrap(s->st, arr)));
}

/* The partials from the engine's backward: outputs[] are the node's data
 * (y first), douts[] the out_grad's; x is the input seen as (T, B, in). */
static PyObject *fused_gradient(grad_scope *s, Py_ssize_t n, const nd_array *x, const nd_array *y,
                                const nd_array *dy, const nd_array *dh_n, const nd_array *dc_n,
                                int cell) {
    PyObject *a[IN_MAX];
    for (Py_ssize_t i = 0; i < n; i++) {
        a[i] = g_data(s, g_input(s, i));
        if (a[i] == NULL) return NULL;
        if (!ndarray_check(s->st, a[i])) {
            PyErr_SetString(PyExc_TypeError, "an LSTM op's inputs must hold NDArrays");
            return scope_fail(s);
        }
    }
    int want = ND_LSTM_GRAD_X | ND_LSTM_GRAD_STATE | (n == IN_MAX ? ND_LSTM_GRAD_BIAS : 0);
    nd_lstm_grads gr;
    /* y is the node's own output; should it not hold the saved values (a
     * node whose data was replaced), the engine runs the forward again */
    nd_status status = nd_array_lstm_backward(
        x, array_of(a[IN_H]), array_of(a[IN_C]), array_of(a[IN_W_IH]), array_of(a[IN_W_HH]),
        n == IN_MAX ? array_of(a[IN_B_IH]) : NULL, n == IN_MAX ? array_of(a[IN_B_HH]) : NULL, y, dy,
        dh_n, dc_n, want, &gr);
    if (status != ND_OK) {
        raise_status(s->st, status);
        return scope_fail(s);
    }
    if (cell) /* (1, B, in) back to the input's (B, in) */
        nd_layout_reshape(&gr.x.layout, 2, array_layout(a[IN_X])->shape, &gr.x.layout);
    nd_array b_ih = {0}, b_hh = {0};
    if (n == IN_MAX) {
        /* the two rows of (2, 4H) as (4H,) views; gr.bias's reference goes to b_ih */
        b_ih = b_hh = gr.bias;
        nd_layout_slice(&b_ih.layout, 0, 0, 1, 1);
        nd_layout_drop_dim(&b_ih.layout, 0);
        nd_layout_slice(&b_hh.layout, 0, 1, 1, 1);
        nd_layout_drop_dim(&b_hh.layout, 0);
        nd_storage_retain(b_hh.storage);
    }
    PyObject *items[IN_MAX] = {
        g_const_array(s, &gr.x),
        g_const_array(s, &gr.h0),
        g_const_array(s, &gr.c0),
        g_const_array(s, &gr.w_ih),
        g_const_array(s, &gr.w_hh),
        NULL,
        NULL,
    };
    if (n == IN_MAX) {
        items[IN_B_IH] = g_const_array(s, &b_ih);
        items[IN_B_HH] = g_const_array(s, &b_hh);
    }
    return grads_n(s, items, n);
}

/* ----------------------------------- gradient: composed (recorded ops) */

/* One step's forward as ops: the activated gates, c' and tanh(c'). */
typedef struct step_terms {
    PyObject *i, *f, *g, *o, *c, *tc, *h;
} step_terms;

static PyObject *g_index(grad_scope *s, PyObject *tuple, Py_ssize_t index) {
    op_params p = no_params;
    p.index = index;
    return g_apply1(s, OP_TUPLE_GET_ITEM, &p, tuple);
}

static PyObject *g_axis_op(grad_scope *s, op_kind kind, PyObject *a, int axis) {
    op_params p = no_params;
    p.axis = axis;
    return g_apply1(s, kind, &p, a);
}

/* 1 - v, as the course writes it: (-v) + 1 */
static PyObject *one_minus(grad_scope *s, PyObject *v) {
    return g_scalar(s, OP_ADD_SCALAR, g_neg(s, v), 1.0);
}

/* The unfused cell of nn_sequence.py's course version: gates = x @ W_ih +
 * h @ W_hh (+ b_ih + b_hh), split into i, f, g, o. w: W_ih, W_hh, b_ih,
 * b_hh (the biases NULL without them). */
static void composed_step(grad_scope *s, PyObject *x, PyObject *h, PyObject *c, PyObject *const *w,
                          int64_t B, int64_t H, step_terms *t) {
    PyObject *pre = g_add(s, g_matmul(s, x, w[0]), g_matmul(s, h, w[1]));
    int64_t gates[2] = {B, 4 * H}, row[2] = {1, 4 * H};
    for (int k = 2; k < 4 && w[2] != NULL; k++)
        pre = g_add(s, pre, g_broadcast(s, g_reshape(s, w[k], 2, row), 2, gates));
    PyObject *parts = g_axis_op(s, OP_SPLIT, g_reshape(s, pre, 3, (int64_t[]){B, 4, H}), 1);
    t->i = g_unary(s, OP_SIGMOID, g_index(s, parts, 0));
    t->f = g_unary(s, OP_SIGMOID, g_index(s, parts, 1));
    t->g = g_unary(s, OP_TANH, g_index(s, parts, 2));
    t->o = g_unary(s, OP_SIGMOID, g_index(s, parts, 3));
    t->c = g_add(s, g_mul(s, t->f, c), g_mul(s, t->i, t->g));
    t->tc = g_unary(s, OP_TANH, t->c);
    t->h = g_mul(s, t->o, t->tc);
}

/* What one step's VJP gives. */
typedef struct step_grads {
    PyObject *x, *h, *c, *w_ih, *w_hh, *b;
} step_grads;

/* The step's VJP as ops, the fused kernel's formulas in its order:
 * dc~ = dc + dh*o*(1 - tc^2); d(pre) = (dc~*g*i*(1-i), dc~*c*f*(1-f),
 * dc~*i*(1-g^2), dh*tc*o*(1-o)); then the GEMMs and the column sum. */
static void composed_step_vjp(grad_scope *s, PyObject *x, PyObject *h, PyObject *c,
                              PyObject *const *w, const step_terms *t, PyObject *dh, PyObject *dc,
                              int64_t B, int64_t H, step_grads *out) {
    PyObject *dct =
        g_add(s, dc, g_mul(s, g_mul(s, dh, t->o), one_minus(s, g_mul(s, t->tc, t->tc))));
    PyObject *d[4] = {
        g_mul(s, g_mul(s, g_mul(s, dct, t->g), t->i), one_minus(s, t->i)),
        g_mul(s, g_mul(s, g_mul(s, dct, c), t->f), one_minus(s, t->f)),
        g_mul(s, g_mul(s, dct, t->i), one_minus(s, g_mul(s, t->g, t->g))),
        g_mul(s, g_mul(s, g_mul(s, dh, t->tc), t->o), one_minus(s, t->o)),
    };
    PyObject *parts = NULL;
    if (!s->failed) {
        PyObject *items = scope_keep(s, PyTuple_Pack(4, d[0], d[1], d[2], d[3]));
        parts = items ? scope_keep(s, apply_op(s->st, OP_MAKE_TUPLE, &no_params, items)) : NULL;
    }
    PyObject *dpre = g_reshape(s, g_axis_op(s, OP_STACK, parts, 1), 2, (int64_t[]){B, 4 * H});
    out->x = g_matmul(s, dpre, g_transpose_last(s, w[0]));
    out->h = g_matmul(s, dpre, g_transpose_last(s, w[1]));
    out->c = g_mul(s, dct, t->f);
    out->w_ih = g_matmul(s, g_transpose_last(s, x), dpre);
    out->w_hh = g_matmul(s, g_transpose_last(s, h), dpre);
    out->b = w[2] != NULL ? g_sum_mask(s, dpre, 2, 1u) : NULL;
}

/* The recorded gradient over T steps: xs[t] (B, in) and dys[t] (B, H) the
 * inputs and the gradients of h_t; dh_n (may be NULL) h_T's other
 * gradient, dc_n c_T's. Fills dxs[t] (x_t's partials) and items[1..n-1]
 * (the other inputs' partials, in input order); the caller makes
 * items[IN_X] from dxs. Returns -1 when the scope failed. */
static int composed_gradient(grad_scope *s, Py_ssize_t n, PyObject *const *xs, PyObject *const *dys,
                             Py_ssize_t T, PyObject *dh_n, PyObject *dc_n, PyObject **dxs,
                             PyObject **items) {
    PyObject *w[4] = {g_input(s, IN_W_IH), g_input(s, IN_W_HH), NULL, NULL};
    if (n == IN_MAX) {
        w[2] = g_input(s, IN_B_IH);
        w[3] = g_input(s, IN_B_HH);
    }
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    if (g_shape(s, g_input(s, IN_C), &ndim, shape) < 0) return -1;
    const int64_t B = shape[0], H = shape[1];
    step_terms *terms = PyMem_Calloc((size_t)T, sizeof *terms);
    PyObject **hs = PyMem_Calloc((size_t)T + 1, sizeof *hs);
    PyObject **cs = PyMem_Calloc((size_t)T + 1, sizeof *cs);
    if (terms == NULL || hs == NULL || cs == NULL) {
        PyErr_NoMemory();
        scope_fail(s);
    }
    if (!s->failed) {
        hs[0] = g_input(s, IN_H);
        cs[0] = g_input(s, IN_C);
        for (Py_ssize_t t = 0; t < T; t++) {
            composed_step(s, xs[t], hs[t], cs[t], w, B, H, &terms[t]);
            hs[t + 1] = terms[t].h;
            cs[t + 1] = terms[t].c;
        }
    }
    PyObject *dh = dh_n != NULL ? g_add(s, dys[T - 1], dh_n) : dys[T - 1], *dc = dc_n;
    step_grads sum = {0};
    for (Py_ssize_t t = T - 1; t >= 0 && !s->failed; t--) {
        step_grads g;
        composed_step_vjp(s, xs[t], hs[t], cs[t], w, &terms[t], dh, dc, B, H, &g);
        dxs[t] = g.x;
        if (t == T - 1) {
            sum = g;
        } else {
            sum.w_ih = g_add(s, sum.w_ih, g.w_ih);
            sum.w_hh = g_add(s, sum.w_hh, g.w_hh);
            if (g.b != NULL) sum.b = g_add(s, sum.b, g.b);
        }
        sum.h = g.h;
        sum.c = g.c;
        if (t > 0) dh = g_add(s, dys[t - 1], g.h);
        dc = g.c;
    }
    PyMem_Free(terms);
    PyMem_Free(hs);
    PyMem_Free(cs);
    items[IN_H] = sum.h;
    items[IN_C] = sum.c;
    items[IN_W_IH] = sum.w_ih;
    items[IN_W_HH] = sum.w_hh;
    items[IN_B_IH] = items[IN_B_HH] = sum.b;
    return s->failed ? -1 : 0;
}

/* ------------------------------------------------------------ gradients */

static PyObject *cell_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    (void)p;
    Py_ssize_t n = PyTuple_GET_SIZE(s->inputs);
    if (check_arity(OP_LSTM_CELL, n) < 0) return scope_fail(s);
    if (is_recording()) {
        /* (dh', dc') = the out_grad's items */
        PyObject *x = g_input(s, IN_X), *dy = g_index(s, g, 0), *dc = g_index(s, g, 1);
        PyObject *items[IN_MAX];
        if (s->failed || composed_gradient(s, n, &x, &dy, 1, NULL, dc, &items[IN_X], items) < 0)
            return NULL;
        return grads_n(s, items, n);
    }
    PyObject *outs[2], *douts[2], *x = g_data(s, g_input(s, IN_X));
    if (x == NULL || tuple_arrays(s, node, 2, outs) < 0 || tuple_arrays(s, g, 2, douts) < 0)
        return NULL;
    if (!ndarray_check(s->st, x)) {
        PyErr_SetString(PyExc_TypeError, "an LSTM op's inputs must hold NDArrays");
        return scope_fail(s);
    }
    nd_array x3 = as_sequence(array_of(x)), y3 = as_sequence(array_of(outs[0]));
    nd_array dy3 = as_sequence(array_of(douts[0]));
    return fused_gradient(s, n, &x3, &y3, &dy3, NULL, array_of(douts[1]), 1);
}

static PyObject *layer_gradient(grad_scope *s, const op_params *p, PyObject *g, PyObject *node) {
    (void)p;
    Py_ssize_t n = PyTuple_GET_SIZE(s->inputs);
    if (check_arity(OP_LSTM, n) < 0) return scope_fail(s);
    if (is_recording()) {
        int ndim;
        int64_t shape[ND_MAX_DIMS];
        PyObject *x = g_input(s, IN_X);
        if (g_shape(s, x, &ndim, shape) < 0) return NULL;
        Py_ssize_t T = (Py_ssize_t)shape[0];
        PyObject **xs = PyMem_Calloc((size_t)T * 3, sizeof *xs);
        if (xs == NULL) {
            PyErr_NoMemory();
            return scope_fail(s);
        }
        PyObject **dys = xs + T, **dxs = xs + 2 * T;
        PyObject *x_parts = g_axis_op(s, OP_SPLIT, x, 0);
        PyObject *dy_parts = g_axis_op(s, OP_SPLIT, g_index(s, g, 0), 0);
        for (Py_ssize_t t = 0; t < T; t++) {
            xs[t] = g_index(s, x_parts, t);
            dys[t] = g_index(s, dy_parts, t);
        }
        PyObject *items[IN_MAX], *dh_n = g_index(s, g, 1), *dc_n = g_index(s, g, 2);
        if (!s->failed && composed_gradient(s, n, xs, dys, T, dh_n, dc_n, dxs, items) == 0) {
            /* dX = stack(dx_0, ..., dx_{T-1}) */
            PyObject *list = scope_keep(s, PyTuple_New(T));
            for (Py_ssize_t t = 0; list != NULL && t < T; t++)
                PyTuple_SET_ITEM(list, t, Py_NewRef(dxs[t]));
            PyObject *tuple =
                list ? scope_keep(s, apply_op(s->st, OP_MAKE_TUPLE, &no_params, list)) : NULL;
            items[IN_X] = g_axis_op(s, OP_STACK, tuple, 0);
        }
        PyMem_Free(xs);
        return grads_n(s, items, n);
    }
    PyObject *outs[3], *douts[3], *x = g_data(s, g_input(s, IN_X));
    if (x == NULL || tuple_arrays(s, node, 3, outs) < 0 || tuple_arrays(s, g, 3, douts) < 0)
        return NULL;
    if (!ndarray_check(s->st, x)) {
        PyErr_SetString(PyExc_TypeError, "an LSTM op's inputs must hold NDArrays");
        return scope_fail(s);
    }
    return fused_gradient(s, n, array_of(x), array_of(outs[0]), array_of(douts[0]),
                          array_of(douts[1]), array_of(douts[2]), 0);
}

void ops_lstm_register(op_impl *t) {
    t[OP_LSTM_CELL] = (op_impl){cell_compute, cell_gradient};
    t[OP_LSTM] = (op_impl){layer_compute, layer_gradient};
}
