/* autograd.c: the one place that walks backward: find_topo_sort,
 * compute_gradient_of_variables in both graph modes, Tensor.backward, and
 * the graph-mode and recording switches.
 *
 * "needle" mode is the course's backward: gradients are recorded graph
 * tensors, .grad is set on every node, and the graphs point back into the
 * forward graph (the reference cycles). "cycle_free" mode runs the same
 * gradient formulas with recording off, sums contributions as they arrive
 * and drops them once used, and writes .grad only on leaves that require it
 * (and nodes that asked with retain_grad): no cycles, so reference counting
 * frees a step's graph.
 */
#include "tensor.h"

#include "config.h"

static const op_params no_params;

/* Grad mode is per thread, as in PyTorch: no_grad() in one thread never
 * turns recording off in another. Recording is on in every new thread. */
static _Thread_local int recording_off = 0;

int is_recording(void) { return !recording_off; }

int set_recording(int on) {
    int previous = !recording_off;
    recording_off = !on;
    return previous;
}

/* The graph modes' names, indexed by graph_mode: the one list of them, which
 * Python reads as needle_c.GRAPH_MODES. */
static const char *const graph_mode_names[] = {
    [GRAPH_CYCLE_FREE] = "cycle_free",
    [GRAPH_NEEDLE] = "needle",
};
enum { GRAPH_MODE_COUNT = sizeof graph_mode_names / sizeof *graph_mode_names };

/* The graph mode is per thread too: graph_mode(...) sets this thread's own
 * mode and puts the previous one back on exit, so another thread's context
 * never changes this thread's backward. A thread with no context active
 * (NO_THREAD_MODE, as every new thread starts) follows the process default,
 * st->autograd->mode, which set_graph_mode changes. */
enum { NO_THREAD_MODE = -1 };
static _Thread_local int thread_mode = NO_THREAD_MODE;

static graph_mode current_graph_mode(const needle_state *st) {
    return thread_mode == NO_THREAD_MODE ? st->autograd->mode : (graph_mode)thread_mode;
}

/* The course's post-order DFS, iteratively: a deep graph needs no recursion.
 * A node on the current path carries this sort's mark (path_mark); meeting a
 * child that carries it means .inputs were set to form a cycle. Each frame
 * saves the mark it overwrote and puts it back when it pops, so a sort that
 * runs inside another (from a finalizer) leaves the outer one's marks as they
 * were. The path holds a reference to each node on it and to its inputs (a
 * collection may change them meanwhile). */
PyObject *find_topo_sort(needle_state *st, PyObject *roots) {
    uint64_t mark = ++needle_rt.autograd.sorts;
    PyObject *order = PyList_New(0), *visited = PySet_New(NULL);
    /* A small graph's path lives on the C stack; a deeper one moves to the heap. */
    enum { INLINE_PATH = 32 };
    struct frame {
        PyObject *node, *inputs;
        Py_ssize_t next;
        uint64_t saved_mark;
    } inline_path[INLINE_PATH], *path = inline_path;
    Py_ssize_t cap = INLINE_PATH, depth = 0;
    if (order == NULL || visited == NULL) goto fail;
    for (Py_ssize_t r = 0; r < PyTuple_GET_SIZE(roots); r++) {
        PyObject *next = PyTuple_GET_ITEM(roots, r);
        if (!is_value(st, next)) {
            PyErr_Format(PyExc_TypeError, "find_topo_sort takes Tensors, got %.100s",
                         Py_TYPE(next)->tp_name);
            goto fail;
        }
        while (next != NULL || depth > 0) {
            if (next != NULL) {
                if (Tensor_CAST(next)->path_mark == mark) {
                    PyErr_SetString(PyExc_ValueError,
                                    "graph has a cycle: a node is among its own inputs");
                    goto fail;
                }
                int seen = PySet_Contains(visited, next);
                if (seen < 0) goto fail;
                if (!seen) {
                    if (depth == cap) {
                        struct frame *grown = PyMem_Malloc(sizeof *path * (size_t)cap * 2);
                        if (grown == NULL) {
                            PyErr_NoMemory();
                            goto fail;
                        }
                        memcpy(grown, path, sizeof *path * (size_t)depth);
                        if (path != inline_path) PyMem_Free(path);
                        path = grown;
                        cap *= 2;
                    }
                    struct frame *f = &path[depth++];
                    f->node = Py_NewRef(next);
                    f->inputs = Py_NewRef(Tensor_CAST(next)->inputs);
                    f->next = 0;
                    f->saved_mark = Tensor_CAST(next)->path_mark;
                    Tensor_CAST(next)->path_mark = mark;
                }
                next = NULL;
                continue;
            }
            struct frame *top = &path[depth - 1];
            if (top->next < PyTuple_GET_SIZE(top->inputs)) {
                next = PyTuple_GET_ITEM(top->inputs, top->next++);
                continue;
            }
            if (PySet_Add(visited, top->node) < 0 || PyList_Append(order, top->node) < 0) goto fail;
            depth--;
            Tensor_CAST(top->node)->path_mark = top->saved_mark;
            Py_DECREF(top->node);
            Py_DECREF(top->inputs);
        }
    }
    if (path != inline_path) PyMem_Free(path);
    Py_DECREF(visited);
    return order;
fail:
    for (Py_ssize_t i = depth - 1; i >= 0; i--) {
        Tensor_CAST(path[i].node)->path_mark = path[i].saved_mark;
        Py_DECREF(path[i].node);
        Py_DECREF(path[i].inputs);
    }
    if (path != inline_path) PyMem_Free(path);
    Py_XDECREF(visited);
    Py_XDECREF(order);
    return NULL;
}

/* a + b for gradient contributions: EWiseAdd for tensors, the course's
 * elementwise make_tuple for TensorTuples (tuple ops' adjoints). */
static PyObject *add_gradients(needle_state *st, PyObject *a, PyObject *b) {
    if (is_tensor_tuple(st, a) || is_tensor_tuple(st, b)) return PyNumber_Add(a, b);
    return apply2(st, OP_EWISE_ADD, &no_params, a, b);
}

/* Whether a running sum of gradient contributions may take the next one in
 * place: a constant Tensor that only the running sums hold (the dict's one
 * reference, no weak references), whose data is an NDArray only it holds,
 * over a storage only that array holds and the engine owns, laid out without
 * repeats. Anything else may be seen elsewhere (a .grad, another input's
 * contribution, a node's data, an array the user or another library holds)
 * and must not change. */
static int owned_sum(needle_state *st, PyObject *sum) {
    if (Py_REFCNT(sum) != 1 || !is_tensor(st, sum)) return 0;
    TensorObject *t = Tensor_CAST(sum);
    if (t->op != NULL || t->requires_grad || t->weakreflist != NULL) return 0;
    PyObject *data = t->cached_data;
    if (data == NULL || Py_REFCNT(data) != 1 || !ndarray_check(st, data) ||
        NDArray_CAST(data)->weakreflist != NULL)
        return 0;
    const nd_array *a = &NDArray_CAST(data)->array;
    return nd_storage_refcount(a->storage) == 1 && !nd_storage_borrowed(a->storage) &&
           nd_layout_is_contiguous(&a->layout);
}

/* sum + partial for a backward that records nothing: added into sum's own
 * buffer when owned_sum allows (N contributions cost N - 1 adds and at most
 * one new array), else a new sum. Returns a new reference to the sum. */
static PyObject *accumulate(needle_state *st, PyObject *sum, PyObject *partial) {
    PyObject *data = is_tensor(st, partial) ? realize(st, partial) : NULL;
    if (data == NULL && PyErr_Occurred()) return NULL;
    if (data != NULL && ndarray_check(st, data) && owned_sum(st, sum)) {
        const nd_array *dst = &NDArray_CAST(Tensor_CAST(sum)->cached_data)->array;
        const nd_array *src = &NDArray_CAST(data)->array;
        if (dst->layout.ndim == src->layout.ndim &&
            memcmp(dst->layout.shape, src->layout.shape,
                   sizeof(int64_t) * (size_t)dst->layout.ndim) == 0) {
            nd_status status = nd_array_add_into(dst, src);
            Py_DECREF(data);
            return status == ND_OK ? Py_NewRef(sum) : raise_status(st, status);
        }
    }
    Py_XDECREF(data);
    Py_INCREF(sum); /* the addition may run the collector */
    PyObject *total = add_gradients(st, sum, partial);
    Py_DECREF(sum);
    return total;
}

/* The sum of a node's gradient contributions; a snapshot of the list is held
 * across the additions, which may run the collector. */
static PyObject *sum_contributions(needle_state *st, PyObject *list) {
    PyObject *items = PyList_AsTuple(list);
    if (items == NULL) return NULL;
    PyObject *total = Py_NewRef(PyTuple_GET_ITEM(items, 0));
    for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(items) && total != NULL; i++)
        Py_SETREF(total, add_gradients(st, total, PyTuple_GET_ITEM(items, i)));
    Py_DECREF(items);
    return total;
}

/* A gradient's partials: one Tensor per input, each of its input's shape;
 * anything else would be stored as a wrong .grad. A pruning walk also takes
 * None for an input that neither requires nor retains grad. */
static int check_partials(needle_state *st, PyObject *op, PyObject *partials, PyObject *inputs,
                          int prune) {
    if (partials == NULL) return -1;
    if (PyTuple_GET_SIZE(partials) != PyTuple_GET_SIZE(inputs)) {
        PyErr_Format(PyExc_ValueError, "%R.gradient returned %zd gradients for %zd inputs", op,
                     PyTuple_GET_SIZE(partials), PyTuple_GET_SIZE(inputs));
        return -1;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(inputs); k++) {
        PyObject *partial = PyTuple_GET_ITEM(partials, k);
        TensorObject *input = Tensor_CAST(PyTuple_GET_ITEM(inputs, k));
        if (prune && partial == Py_None && !input->requires_grad && !input->retains_grad) continue;
        if (!is_value(st, partial)) {
            PyErr_Format(PyExc_TypeError,
                         "%R.gradient returned a %.100s for input %zd, not a Tensor", op,
                         Py_TYPE(partial)->tp_name, k);
            return -1;
        }
        int differ = shapes_differ(st, partial, PyTuple_GET_ITEM(inputs, k));
        if (differ) {
            if (differ > 0)
                PyErr_Format(PyExc_ValueError,
                             "%R.gradient returned a gradient of the wrong shape for input %zd", op,
                             k);
            return -1;
        }
    }
    return 0;
}

/* Each partial in its input's dtype: a Python op's gradient (or a
 * gradient called on promoted operands) may return the promoted dtype, and
 * a node's contributions are summed in the node's own dtype. Replaces
 * *partials when some cast was needed. */
static int partials_in_input_dtypes(needle_state *st, PyObject **partials, PyObject *inputs) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(inputs); k++) {
        PyObject *partial = PyTuple_GET_ITEM(*partials, k), *input = PyTuple_GET_ITEM(inputs, k);
        if (!is_tensor(st, partial) || !is_tensor(st, input)) continue;
        nd_dtype want, have;
        if (value_dtype(st, input, &want) < 0 || value_dtype(st, partial, &have) < 0) return -1;
        if (want == have) continue;
        PyObject *cast = cast_value(st, partial, want);
        if (cast == NULL) return -1;
        if (Py_REFCNT(*partials) > 1 || !PyTuple_CheckExact(*partials)) {
            PyObject *copy = PyTuple_GetSlice(*partials, 0, PyTuple_GET_SIZE(*partials));
            if (copy == NULL) {
                Py_DECREF(cast);
                return -1;
            }
            Py_SETREF(*partials, copy);
        }
        PyObject *old = PyTuple_GET_ITEM(*partials, k);
        PyTuple_SET_ITEM(*partials, k, cast);
        Py_DECREF(old);
    }
    return 0;
}

/* node.op.gradient(adjoint, node), checked, with the inputs it is for (a
 * new reference in *inputs): a gradient may run Python code and the
 * collector, which may change the node's op and inputs, so both are held.
 * prune: see run_gradient_for. */
static PyObject *node_partials(needle_state *st, PyObject *node, PyObject *adjoint,
                               PyObject **inputs, int prune) {
    PyObject *op = Py_NewRef(Tensor_CAST(node)->op);
    *inputs = Py_NewRef(Tensor_CAST(node)->inputs);
    PyObject *partials = run_gradient_for(st, op, adjoint, node, prune);
    if (check_partials(st, op, partials, *inputs, prune) < 0 ||
        partials_in_input_dtypes(st, &partials, *inputs) < 0) {
        Py_XDECREF(partials);
        Py_CLEAR(*inputs);
        partials = NULL;
    }
    Py_DECREF(op);
    return partials;
}

/* The course's algorithm, verbatim in effect. */
static int backward_needle(needle_state *st, PyObject *topo, PyObject *output, PyObject *out_grad) {
    PyObject *grads = PyDict_New();
    if (grads == NULL) return -1;
    PyObject *first = PyList_New(1);
    if (first == NULL || PyDict_SetItem(grads, output, first) < 0) goto fail;
    PyList_SET_ITEM(first, 0, Py_NewRef(out_grad));
    Py_CLEAR(first);
    for (Py_ssize_t i = PyList_GET_SIZE(topo) - 1; i >= 0; i--) {
        PyObject *node = PyList_GET_ITEM(topo, i);
        PyObject *list = PyDict_GetItemWithError(grads, node);
        if (list == NULL) {
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        PyObject *adjoint = sum_contributions(st, list);
        if (adjoint != NULL && Tensor_CAST(node)->grad_hooks != NULL)
            Py_SETREF(adjoint, run_grad_hooks(st, node, adjoint));
        if (adjoint == NULL) goto fail;
        /* held: the gradient below may run code that replaces .grad */
        Py_XSETREF(Tensor_CAST(node)->grad, Py_NewRef(adjoint));
        if (Tensor_CAST(node)->op == NULL) {
            Py_DECREF(adjoint);
            if (Tensor_CAST(node)->requires_grad && run_post_accumulate_hooks(node) < 0) goto fail;
            continue;
        }
        PyObject *inputs;
        PyObject *partials = node_partials(st, node, adjoint, &inputs, 0);
        Py_DECREF(adjoint);
        if (partials == NULL) goto fail;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(inputs); k++) {
            PyObject *input = PyTuple_GET_ITEM(inputs, k);
            PyObject *contributions = PyDict_GetItemWithError(grads, input);
            if (contributions == NULL) {
                if (PyErr_Occurred() || (contributions = PyList_New(0)) == NULL ||
                    PyDict_SetItem(grads, input, contributions) < 0) {
                    Py_XDECREF(contributions);
                    Py_DECREF(partials);
                    Py_DECREF(inputs);
                    goto fail;
                }
                Py_DECREF(contributions);
            }
            if (PyList_Append(contributions, PyTuple_GET_ITEM(partials, k)) < 0) {
                Py_DECREF(partials);
                Py_DECREF(inputs);
                goto fail;
            }
        }
        Py_DECREF(partials);
        Py_DECREF(inputs);
    }
    Py_DECREF(grads);
    return 0;
fail:
    Py_XDECREF(first);
    Py_DECREF(grads);
    return -1;
}

/* .grad += grad on a node that keeps its gradient, as PyTorch's
 * AccumulateGrad: the first gradient is stored as it is; a later one is
 * added into the stored one's buffer when nothing else can see it
 * (accumulate's owned_sum: only this node holds it), else into a new
 * tensor, and recorded when the backward records (create_graph). */
static int accumulate_grad(needle_state *st, PyObject *node, PyObject *grad) {
    TensorObject *t = Tensor_CAST(node);
    if (t->grad == NULL) {
        t->grad = Py_NewRef(grad);
        return 0;
    }
    PyObject *old = t->grad;
    int differ = shapes_differ(st, old, grad);
    if (differ) {
        if (differ > 0)
            PyErr_SetString(PyExc_ValueError,
                            "backward: the tensor's .grad has another shape than its gradient "
                            "(set .grad to None, or to a tensor of its shape, before backward)");
        return -1;
    }
    PyObject *sum;
    if (is_recording()) {
        Py_INCREF(old); /* the addition may run the collector */
        sum = add_gradients(st, old, grad);
        Py_DECREF(old);
    } else {
        sum = accumulate(st, old, grad);
    }
    if (sum == NULL) return -1;
    Py_XSETREF(t->grad, sum);
    return 0;
}

static int backward_cycle_free(needle_state *st, PyObject *topo, PyObject *output,
                               PyObject *out_grad, int create_graph) {
    PyObject *grads = PyDict_New();
    if (grads == NULL) return -1;
    PyObject *seed;
    if (create_graph) {
        seed = Py_NewRef(out_grad); /* part of the recorded gradient graph */
    } else {
        PyObject *seed_data = realize(st, out_grad);
        seed = seed_data ? make_const(st, seed_data, 0) : NULL;
        Py_XDECREF(seed_data);
    }
    if (seed == NULL || PyDict_SetItem(grads, output, seed) < 0) {
        Py_XDECREF(seed);
        Py_DECREF(grads);
        return -1;
    }
    Py_DECREF(seed);
    for (Py_ssize_t i = PyList_GET_SIZE(topo) - 1; i >= 0; i--) {
        PyObject *node = PyList_GET_ITEM(topo, i);
        TensorObject *t = Tensor_CAST(node);
        PyObject *adjoint = PyDict_GetItemWithError(grads, node);
        if (adjoint == NULL) {
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        Py_INCREF(adjoint);
        /* Used once, then dropped: the running sum goes as soon as it is read. */
        if (PyDict_DelItem(grads, node) < 0) {
            Py_DECREF(adjoint);
            goto fail;
        }
        if (t->grad_hooks != NULL) {
            Py_SETREF(adjoint, run_grad_hooks(st, node, adjoint));
            if (adjoint == NULL) goto fail;
        }
        if ((t->op == NULL && t->requires_grad) || t->retains_grad) {
            if (accumulate_grad(st, node, adjoint) < 0 ||
                (t->op == NULL && run_post_accumulate_hooks(node) < 0)) {
                Py_DECREF(adjoint);
                goto fail;
            }
        }
        if (t->op == NULL || !t->requires_grad) {
            Py_DECREF(adjoint);
            continue;
        }
        PyObject *inputs;
        PyObject *partials = node_partials(st, node, adjoint, &inputs, 1);
        Py_DECREF(adjoint);
        if (partials == NULL) goto fail;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(inputs); k++) {
            PyObject *input = PyTuple_GET_ITEM(inputs, k);
            PyObject *partial = PyTuple_GET_ITEM(partials, k);
            /* a pruned input, or one whose flags a finalizer changed meanwhile */
            if ((!Tensor_CAST(input)->requires_grad && !Tensor_CAST(input)->retains_grad) ||
                partial == Py_None)
                continue;
            PyObject *existing = PyDict_GetItemWithError(grads, input);
            PyObject *value;
            if (existing != NULL) {
                /* in place when nothing is recorded and the sum is ours alone */
                if (is_recording()) {
                    Py_INCREF(existing); /* the addition may run the collector */
                    value = add_gradients(st, existing, partial);
                    Py_DECREF(existing);
                } else {
                    value = accumulate(st, existing, partial);
                }
            } else if (PyErr_Occurred()) {
                value = NULL;
            } else {
                value = Py_NewRef(partial);
            }
            if (value == NULL || PyDict_SetItem(grads, input, value) < 0) {
                Py_XDECREF(value);
                Py_DECREF(partials);
                Py_DECREF(inputs);
                goto fail;
            }
            Py_DECREF(value);
        }
        Py_DECREF(partials);
        Py_DECREF(inputs);
    }
    Py_DECREF(grads);
    return 0;
fail:
    Py_DECREF(grads);
    return -1;
}

/* create_graph (PyTorch's name) records the gradient computation in
 * cycle_free mode too, so the .grad it writes can be differentiated again;
 * "needle" mode always records it. */
static int compute_gradients(needle_state *st, PyObject *output, PyObject *out_grad,
                             int create_graph) {
    if (!is_value(st, out_grad)) {
        PyErr_Format(PyExc_TypeError, "out_grad must be a Tensor, got %.100s",
                     Py_TYPE(out_grad)->tp_name);
        return -1;
    }
    int differ = shapes_differ(st, out_grad, output);
    if (differ) {
        if (differ > 0) PyErr_SetString(PyExc_ValueError, "out_grad must have the output's shape");
        return -1;
    }
    if (is_tensor(st, out_grad) && is_tensor(st, output)) {
        /* Computed by shapes_differ; a seed on another device would put every gradient there. */
        PyObject *g = Tensor_CAST(out_grad)->cached_data, *o = Tensor_CAST(output)->cached_data;
        if (g != NULL && o != NULL && ndarray_check(st, g) && ndarray_check(st, o) &&
            nd_storage_device(NDArray_CAST(g)->array.storage) !=
                nd_storage_device(NDArray_CAST(o)->array.storage)) {
            PyErr_SetString(st->device_error, "out_grad must be on the output's device");
            return -1;
        }
    }
    PyObject *roots = PyTuple_Pack(1, output);
    if (roots == NULL) return -1;
    PyObject *topo = find_topo_sort(st, roots);
    Py_DECREF(roots);
    if (topo == NULL) return -1;
    int rc;
    /* Gradients run in the dtypes the forward chose, as in PyTorch. */
    int autocast = autocast_suspend();
    backward_enter();
    if (current_graph_mode(st) == GRAPH_NEEDLE) {
        rc = backward_needle(st, topo, output, out_grad);
    } else {
        int recording = set_recording(create_graph && is_recording());
        rc = backward_cycle_free(st, topo, output, out_grad, create_graph);
        set_recording(recording);
    }
    autocast_resume(autocast);
    Py_DECREF(topo);
    /* the callbacks queued by hooks (a reducer's) run after the walk, with
     * autocast and recording as the caller had them */
    return backward_exit(rc);
}

int compute_gradient_of_variables(needle_state *st, PyObject *output, PyObject *out_grad) {
    return compute_gradients(st, output, out_grad, 0);
}

/* Tensor.backward(out_grad=None, create_graph=False): the default seed is
 * ones of the output's shape. A tensor with no graph (no op, not requiring
 * grad) has nothing to differentiate: that is an error, as in PyTorch, not
 * a silent no-op. In cycle_free mode this is what a .grad is unless the
 * backward that wrote it had create_graph=True. */
PyObject *tensor_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"out_grad", "create_graph", NULL};
    PyObject *out_grad = Py_None;
    int create_graph = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Op:backward", kwlist, &out_grad,
                                     &create_graph))
        return NULL;
    needle_state *st = state_of_value(self);
    if (st == NULL) return NULL;
    if (Tensor_CAST(self)->op == NULL && !Tensor_CAST(self)->requires_grad) {
        PyErr_SetString(
            PyExc_RuntimeError,
            "backward(): this tensor does not require grad and does not have a grad_fn (it is "
            "a constant or a detached tensor, so there is nothing to differentiate). In the "
            "default 'cycle_free' graph mode a .grad is such a tensor: to differentiate a "
            "gradient, run the first backward with create_graph=True (or use graph mode "
            "'needle', the course's).");
        return NULL;
    }
    /* The previous step's graph is usually garbage by now (module.c hands
     * the collection policy's safe point to the runtime). */
    if (needle_rt.autograd.safe_point != NULL) needle_rt.autograd.safe_point();
    PyObject *seed;
    if (out_grad == Py_None) {
        PyObject *data = realize(st, self);
        if (data == NULL) return NULL;
        if (!ndarray_check(st, data)) {
            Py_DECREF(data);
            PyErr_SetString(PyExc_TypeError, "backward() needs out_grad for a TensorTuple");
            return NULL;
        }
        const nd_array *a = &NDArray_CAST(data)->array;
        nd_array ones;
        nd_status status = nd_array_empty_typed(nd_storage_device(a->storage), a->layout.ndim,
                                                a->layout.shape, nd_array_dtype(a), &ones);
        if (status == ND_OK && (status = nd_array_fill(&ones, 1.0f)) != ND_OK)
            nd_array_release(&ones);
        Py_DECREF(data);
        if (status != ND_OK) return raise_status(st, status);
        PyObject *array = ndarray_wrap(st, &ones);
        if (array == NULL) return NULL;
        seed = make_const(st, array, 0);
        Py_DECREF(array);
        if (seed == NULL) return NULL;
    } else {
        seed = Py_NewRef(out_grad);
    }
    int rc = compute_gradients(st, self, seed, create_graph);
    Py_DECREF(seed);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------- module functions */

static PyObject *mod_find_topo_sort(PyObject *module, PyObject *nodes) {
    needle_state *st = state_of_module(module);
    PyObject *seq = sequence_tuple(nodes, "find_topo_sort takes a list of Tensors");
    if (seq == NULL) return NULL;
    PyObject *r = find_topo_sort(st, seq);
    Py_DECREF(seq);
    return r;
}

static PyObject *mod_compute_gradient(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "compute_gradient_of_variables(output_tensor, out_grad)");
        return NULL;
    }
    needle_state *st = state_of_module(module);
    if (!PyObject_TypeCheck(args[0], st->autograd->value_type)) {
        PyErr_SetString(PyExc_TypeError, "output_tensor must be a Tensor");
        return NULL;
    }
    if (compute_gradient_of_variables(st, args[0], args[1]) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *graph_mode_tuple(void) {
    PyObject *names = PyTuple_New(GRAPH_MODE_COUNT);
    for (int k = 0; names != NULL && k < GRAPH_MODE_COUNT; k++) {
        PyObject *name = PyUnicode_FromString(graph_mode_names[k]);
        if (name == NULL) Py_CLEAR(names);
        else PyTuple_SET_ITEM(names, k, name);
    }
    return names;
}

/* A graph mode's name to its graph_mode, or -1 with an exception set. */
static int parse_graph_mode(PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "graph mode must be a str, got %.100s",
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    for (int k = 0; k < GRAPH_MODE_COUNT; k++) {
        if (PyUnicode_CompareWithASCIIString(arg, graph_mode_names[k]) == 0) return k;
    }
    PyObject *names = graph_mode_tuple();
    if (names != NULL)
        PyErr_Format(PyExc_ValueError, "unknown graph mode %R (expected one of %R)", arg, names);
    Py_XDECREF(names);
    return -1;
}

static PyObject *graph_mode_name(int mode) {
    if (mode == NO_THREAD_MODE) Py_RETURN_NONE;
    return PyUnicode_FromString(graph_mode_names[mode]);
}

/* The process default; returns the previous default. */
static PyObject *mod_set_graph_mode(PyObject *module, PyObject *arg) {
    needle_state *st = state_of_module(module);
    int mode = parse_graph_mode(arg);
    if (mode < 0) return NULL;
    graph_mode previous = st->autograd->mode;
    st->autograd->mode = (graph_mode)mode;
    return graph_mode_name((int)previous);
}

/* graph_mode(name)'s entry: this thread's own mode becomes name; returns the
 * thread's previous one (None: it followed the process default) for the
 * exit to put back. */
static PyObject *mod_enter_graph_mode(PyObject *module, PyObject *arg) {
    (void)module;
    int mode = parse_graph_mode(arg);
    if (mode < 0) return NULL;
    int previous = thread_mode;
    thread_mode = mode;
    return graph_mode_name(previous);
}

/* graph_mode(name)'s exit: puts back what the entry returned. */
static PyObject *mod_exit_graph_mode(PyObject *module, PyObject *previous) {
    (void)module;
    int mode = NO_THREAD_MODE;
    if (previous != Py_None && (mode = parse_graph_mode(previous)) < 0) return NULL;
    thread_mode = mode;
    Py_RETURN_NONE;
}

static PyObject *mod_get_graph_mode(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    return graph_mode_name((int)current_graph_mode(state_of_module(module)));
}

static PyObject *mod_set_grad_enabled(PyObject *module, PyObject *arg) {
    int enabled = PyObject_IsTrue(arg);
    if (enabled < 0) return NULL;
    (void)module;
    return PyBool_FromLong(set_recording(enabled));
}

static PyObject *mod_is_grad_enabled(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyBool_FromLong(is_recording());
}

static PyMethodDef autograd_functions[] = {
    {"find_topo_sort", mod_find_topo_sort, METH_O,
     "find_topo_sort(node_list, /)\n--\n\nNodes in the course's post-order DFS order (iterative)."},
    {"compute_gradient_of_variables", (PyCFunction)(void (*)(void))mod_compute_gradient,
     METH_FASTCALL,
     "compute_gradient_of_variables(output_tensor, out_grad, /)\n--\n\nBackward from output_tensor "
     "in the current graph mode."},
    {"_set_graph_mode", mod_set_graph_mode, METH_O,
     "_set_graph_mode(name, /)\n--\n\nSets the process default graph mode; returns the previous "
     "default."},
    {"_enter_graph_mode", mod_enter_graph_mode, METH_O,
     "_enter_graph_mode(name, /)\n--\n\nSets this thread's own graph mode; returns its previous "
     "one (None: the process default) for _exit_graph_mode."},
    {"_exit_graph_mode", mod_exit_graph_mode, METH_O,
     "_exit_graph_mode(previous, /)\n--\n\nPuts back what _enter_graph_mode returned."},
    {"_get_graph_mode", mod_get_graph_mode, METH_NOARGS,
     "_get_graph_mode()\n--\n\nThe graph mode this thread's backward uses."},
    {"_set_grad_enabled", mod_set_grad_enabled, METH_O,
     "_set_grad_enabled(enabled, /)\n--\n\nRecording on or off; returns the previous setting."},
    {"_is_grad_enabled", mod_is_grad_enabled, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

int autograd_module_init(PyObject *module, needle_state *st) {
    st->autograd = PyMem_Calloc(1, sizeof(autograd_state));
    if (st->autograd == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* The table's choices are "cycle_free|needle", graph_mode_names' order; "nd|np" is
     * backend_names'. A bad value fails the import. */
    int mode = GRAPH_CYCLE_FREE, backend = 0;
    if (nd_config_choice(ND_CFG_GRAPH_MODE, &mode) < 0 ||
        nd_config_choice(ND_CFG_BACKEND, &backend) < 0) {
        PyErr_SetString(PyExc_ValueError, nd_last_error());
        return -1;
    }
    st->autograd->mode = (graph_mode)mode;
    static const char *const backend_names[] = {"nd", "np"};
    st->numpy_dtypes = backend == 1;
    if (PyModule_AddStringConstant(module, "BACKEND", backend_names[backend]) < 0) return -1;
    ops_basic_register(op_impls);
    ops_unary_register(op_impls);
    ops_binary_register(op_impls);
    ops_select_register(op_impls);
    ops_nn_register(op_impls);
    ops_fused_register(op_impls);
    for (int k = 1; k < OP_KIND_COUNT; k++)
        if (op_impls[k].compute == NULL || op_impls[k].gradient == NULL) {
            PyErr_Format(PyExc_SystemError, "built-in op %s has no implementation",
                         op_table[k].name);
            return -1;
        }
    if (tensor_types_init(module, st) < 0 || op_types_init(module, st) < 0 ||
        ops_unary_export(module) < 0 || ops_binary_export(module) < 0)
        return -1;
    if (PyModule_AddFunctions(module, alloc_site_functions) < 0 ||
        PyModule_AddFunctions(module, gc_visibility_functions) < 0)
        return -1;
    if (hooks_module_init(module) < 0) return -1;
    if (PyModule_AddFunctions(module, autograd_functions) < 0 ||
        PyModule_AddFunctions(module, autocast_functions) < 0)
        return -1;
    PyObject *names = graph_mode_tuple();
    if (names == NULL) return -1;
    int rc = PyModule_AddObjectRef(module, "GRAPH_MODES", names);
    Py_DECREF(names);
    return rc;
}

int autograd_traverse(needle_state *st, visitproc visit, void *arg) {
    autograd_state *ag = st->autograd;
    if (ag == NULL) return 0;
    Py_VISIT(ag->value_type);
    Py_VISIT(ag->tensor_type);
    Py_VISIT(ag->tensor_tuple_type);
    Py_VISIT(ag->op_type);
    Py_VISIT(ag->tensor_op_type);
    Py_VISIT(ag->tensor_tuple_op_type);
    for (int k = 0; k < OP_KIND_COUNT; k++) Py_VISIT(ag->op_types[k]);
    return 0;
}

void autograd_clear(needle_state *st) {
    autograd_state *ag = st->autograd;
    if (ag == NULL) return;
    Py_CLEAR(ag->value_type);
    Py_CLEAR(ag->tensor_type);
    Py_CLEAR(ag->tensor_tuple_type);
    Py_CLEAR(ag->op_type);
    Py_CLEAR(ag->tensor_op_type);
    Py_CLEAR(ag->tensor_tuple_op_type);
    for (int k = 0; k < OP_KIND_COUNT; k++) Py_CLEAR(ag->op_types[k]);
}
