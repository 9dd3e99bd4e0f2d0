/* hooks.c: gradient hooks, PyTorch's semantics, and the callbacks that run
 * when a backward pass ends.
 *
 * - Tensor.register_hook(fn): fn(grad) runs when the gradient with respect
 *   to the tensor has been summed, before it is written to .grad or passed
 *   on; a Tensor it returns replaces the gradient (same shape and dtype).
 * - Tensor.register_post_accumulate_grad_hook(fn): on a leaf, fn(tensor)
 *   runs once its .grad holds this backward's gradient.
 * Both return a RemovableHandle. A tensor's hooks live in two dicts (id ->
 * fn, in registration order) that it owns and the collector traverses; a
 * tensor with none pays one NULL test per backward node.
 *
 * _queue_backward_callback(fn) runs fn when the outermost backward of this
 * thread returns successfully (PyTorch's Engine.queue_callback): what a
 * reducer needs to finish the work its hooks started. A backward that raises
 * drops its queued callbacks unrun.
 *
 * _set_hooks_paused(flag) turns hooks off in this thread: checkpoint's inner
 * backward recomputes a segment and must not fire its parameters' hooks
 * (the outer backward fires them once, on the summed gradient).
 */
#include "tensor.h"

/* The backward passes running in this thread (nested ones come from
 * finalizers or checkpointed segments) and the callbacks queued for the
 * outermost; a list, or NULL while none is queued. */
static _Thread_local int backward_depth = 0;
static _Thread_local PyObject *backward_callbacks = NULL;
static _Thread_local int hooks_paused = 0;
/* The outermost backward running in this thread, numbered process-wide (0:
 * none): a hook tells a new backward from the one it started in. */
static _Thread_local uint64_t backward_id = 0;
static uint64_t backwards_started = 0;

/* The handle's ids: process-wide, so a handle never names another hook. */
static uint64_t next_hook_id = 1;

enum hook_kind { HOOK_GRAD = 0, HOOK_POST_ACCUMULATE = 1 };

static PyObject **hook_slot(TensorObject *t, int kind) {
    return kind == HOOK_GRAD ? &t->grad_hooks : &t->post_accumulate_hooks;
}

/* ------------------------------------------------ RemovableHandle */

/* A handle holds the dict its hook is in (not the tensor): removing works as
 * long as the handle lives, and the dict, which a hook's closure may lead
 * back to, is traversed. */
typedef struct {
    PyObject_HEAD PyObject *hooks;
    PyObject *id;
    int kind;
} HandleObject;

static PyTypeObject *handle_type = NULL;

static int handle_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((HandleObject *)op)->hooks);
    return 0;
}

static int handle_clear(PyObject *op) {
    Py_CLEAR(((HandleObject *)op)->hooks);
    return 0;
}

static void handle_dealloc(PyObject *op) {
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    handle_clear(op);
    Py_CLEAR(((HandleObject *)op)->id);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* Removes the hook (nothing when it is gone already: removing twice is
 * allowed, as in PyTorch). */
static PyObject *handle_remove(PyObject *op, PyObject *Py_UNUSED(ignored)) {
    HandleObject *h = (HandleObject *)op;
    PyObject *hooks = h->hooks;
    if (hooks == NULL) Py_RETURN_NONE;
    Py_INCREF(hooks);
    int has = PyDict_Contains(hooks, h->id);
    int rc = (has < 0 || (has > 0 && PyDict_DelItem(hooks, h->id) < 0)) ? -1 : 0;
    Py_DECREF(hooks);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *handle_enter(PyObject *op, PyObject *Py_UNUSED(ignored)) { return Py_NewRef(op); }

static PyObject *handle_exit(PyObject *op, PyObject *args) {
    (void)args;
    PyObject *r = handle_remove(op, NULL);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *handle_get_id(PyObject *op, void *c) {
    (void)c;
    return Py_NewRef(((HandleObject *)op)->id);
}

static PyObject *handle_repr(PyObject *op) {
    HandleObject *h = (HandleObject *)op;
    return PyUnicode_FromFormat("<RemovableHandle %S (%s)>", h->id,
                                h->kind == HOOK_GRAD ? "grad hook" : "post-accumulate-grad hook");
}

static PyMethodDef handle_methods[] = {
    {"remove", handle_remove, METH_NOARGS,
     "remove($self, /)\n--\n\nRemoves the hook (does nothing when it is already gone)."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", handle_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef handle_getset[] = {
    {"id", handle_get_id, NULL, "The hook's id (an int).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot handle_slots[] = {
    {Py_tp_doc, "What register_hook and register_post_accumulate_grad_hook return: .remove() "
                "takes the hook off (also on leaving a with block)."},
    {Py_tp_dealloc, handle_dealloc},
    {Py_tp_traverse, handle_traverse},
    {Py_tp_clear, handle_clear},
    {Py_tp_methods, handle_methods},
    {Py_tp_getset, handle_getset},
    {Py_tp_repr, handle_repr},
    {0, NULL},
};

static PyType_Spec handle_spec = {
    .name = "needle.autograd.RemovableHandle",
    .basicsize = sizeof(HandleObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_HAVE_GC,
    .slots = handle_slots,
};

/* ------------------------------------------------ registration */

static PyObject *register_hook_of_kind(PyObject *self, PyObject *fn, int kind) {
    TensorObject *t = Tensor_CAST(self);
    if (!PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "%s: the hook must be callable, got %.100s",
                     kind == HOOK_GRAD ? "register_hook" : "register_post_accumulate_grad_hook",
                     Py_TYPE(fn)->tp_name);
        return NULL;
    }
    if (!t->requires_grad) {
        PyErr_SetString(PyExc_RuntimeError,
                        "cannot register a hook on a tensor that doesn't require gradient");
        return NULL;
    }
    if (kind == HOOK_POST_ACCUMULATE && t->op != NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "post accumulate grad hooks cannot be registered on non-leaf tensors");
        return NULL;
    }
    PyObject **slot = hook_slot(t, kind);
    if (*slot == NULL && (*slot = PyDict_New()) == NULL) return NULL;
    /* held: the allocations below may run the collector and any finalizer */
    PyObject *hooks = Py_NewRef(*slot);
    PyObject *id = PyLong_FromUnsignedLongLong(next_hook_id++);
    HandleObject *h = id ? PyObject_GC_New(HandleObject, handle_type) : NULL;
    if (h == NULL) {
        Py_XDECREF(id);
        Py_DECREF(hooks);
        return NULL;
    }
    h->kind = kind;
    h->hooks = hooks;
    h->id = id;
    PyObject_GC_Track(h);
    if (PyDict_SetItem(h->hooks, id, fn) < 0) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

PyObject *value_register_hook(PyObject *self, PyObject *fn) {
    return register_hook_of_kind(self, fn, HOOK_GRAD);
}

PyObject *value_register_post_accumulate_grad_hook(PyObject *self, PyObject *fn) {
    return register_hook_of_kind(self, fn, HOOK_POST_ACCUMULATE);
}

/* ------------------------------------------------ running them */

/* A snapshot of a hook dict's functions: a hook may add or remove hooks. */
static PyObject *hook_functions(PyObject *hooks) {
    Py_INCREF(hooks);
    PyObject *fns = PyDict_Values(hooks);
    Py_DECREF(hooks);
    return fns;
}

/* One Tensor of a replacement against the gradient's: same shape and dtype
 * (PyTorch refuses a change of either). */
static int check_same_kind(needle_state *st, PyObject *fn, PyObject *old, PyObject *new) {
    int differ = shapes_differ(st, new, old);
    if (differ) {
        if (differ > 0)
            PyErr_Format(PyExc_RuntimeError, "hook %R has changed the size of the gradient", fn);
        return -1;
    }
    nd_dtype want, have;
    if (value_dtype(st, old, &want) < 0 || value_dtype(st, new, &have) < 0) return -1;
    if (want != have) {
        PyErr_Format(PyExc_RuntimeError, "hook %R has changed the dtype of the gradient", fn);
        return -1;
    }
    return 0;
}

/* What a grad hook returned must stand in for the gradient: a Tensor for a
 * Tensor's, a TensorTuple of as many items for a TensorTuple's, each of the
 * gradient's shape and dtype. */
static int check_replacement(needle_state *st, PyObject *fn, PyObject *old, PyObject *new) {
    int tuple = is_tensor_tuple(st, old);
    if (tuple ? !is_tensor_tuple(st, new) : !is_tensor(st, new)) {
        PyErr_Format(PyExc_TypeError, "hook %R returned a %.100s, not a %s or None", fn,
                     Py_TYPE(new)->tp_name, tuple ? "TensorTuple" : "Tensor");
        return -1;
    }
    if (!tuple) return check_same_kind(st, fn, old, new);
    PyObject *olds = PySequence_Tuple(old);
    PyObject *news = olds ? PySequence_Tuple(new) : NULL;
    int rc = news ? 0 : -1;
    if (rc == 0 && PyTuple_GET_SIZE(olds) != PyTuple_GET_SIZE(news)) {
        PyErr_Format(PyExc_RuntimeError,
                     "hook %R has changed the number of gradients (%zd, not %zd)", fn,
                     PyTuple_GET_SIZE(news), PyTuple_GET_SIZE(olds));
        rc = -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < PyTuple_GET_SIZE(olds); i++)
        rc = check_same_kind(st, fn, PyTuple_GET_ITEM(olds, i), PyTuple_GET_ITEM(news, i));
    Py_XDECREF(olds);
    Py_XDECREF(news);
    return rc;
}

PyObject *run_grad_hooks(needle_state *st, PyObject *node, PyObject *grad) {
    PyObject *hooks = Tensor_CAST(node)->grad_hooks;
    if (hooks == NULL || hooks_paused || PyDict_GET_SIZE(hooks) == 0) return Py_NewRef(grad);
    PyObject *fns = hook_functions(hooks);
    if (fns == NULL) return NULL;
    Py_INCREF(grad);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fns); i++) {
        PyObject *fn = PyList_GET_ITEM(fns, i);
        PyObject *r = PyObject_CallOneArg(fn, grad);
        if (r == NULL || (r != Py_None && check_replacement(st, fn, grad, r) < 0)) {
            Py_XDECREF(r);
            Py_CLEAR(grad);
            break;
        }
        if (r == Py_None) Py_DECREF(r);
        else Py_SETREF(grad, r);
    }
    Py_DECREF(fns);
    return grad;
}

int run_post_accumulate_hooks(PyObject *node) {
    PyObject *hooks = Tensor_CAST(node)->post_accumulate_hooks;
    if (hooks == NULL || hooks_paused || PyDict_GET_SIZE(hooks) == 0) return 0;
    PyObject *fns = hook_functions(hooks);
    if (fns == NULL) return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fns) && rc == 0; i++) {
        PyObject *fn = PyList_GET_ITEM(fns, i);
        PyObject *r = PyObject_CallOneArg(fn, node);
        if (r == NULL) {
            rc = -1;
        } else if (r != Py_None) {
            PyErr_Format(PyExc_RuntimeError,
                         "post accumulate grad hook %R returned a %.100s: it must return None", fn,
                         Py_TYPE(r)->tp_name);
            rc = -1;
        }
        Py_XDECREF(r);
    }
    Py_DECREF(fns);
    return rc;
}

/* ------------------------------------------------ backward's end */

void backward_enter(void) {
    if (backward_depth++ == 0) backward_id = ++backwards_started;
}

int backward_exit(int rc) {
    if (--backward_depth > 0) return rc;
    PyObject *callbacks = backward_callbacks;
    backward_callbacks = NULL;
    if (callbacks == NULL) {
        backward_id = 0;
        return rc;
    }
    /* A callback may queue another (run in this same loop): the thread is
     * still "in" this backward until the list is empty. */
    backward_depth++;
    backward_callbacks = callbacks;
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(callbacks); i++) {
        PyObject *fn = Py_NewRef(PyList_GET_ITEM(callbacks, i));
        PyObject *r = PyObject_CallNoArgs(fn);
        Py_DECREF(fn);
        if (r == NULL) rc = -1;
        Py_XDECREF(r);
    }
    backward_callbacks = NULL;
    backward_depth--;
    backward_id = 0;
    Py_DECREF(callbacks);
    return rc;
}

static PyObject *mod_queue_backward_callback(PyObject *module, PyObject *fn) {
    (void)module;
    if (!PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "the callback must be callable, got %.100s",
                     Py_TYPE(fn)->tp_name);
        return NULL;
    }
    if (backward_depth == 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "_queue_backward_callback: no backward is running in this thread");
        return NULL;
    }
    if (backward_callbacks == NULL && (backward_callbacks = PyList_New(0)) == NULL) return NULL;
    if (PyList_Append(backward_callbacks, fn) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *mod_in_backward(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyBool_FromLong(backward_depth > 0);
}

static PyObject *mod_backward_id(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyLong_FromUnsignedLongLong(backward_id);
}

static PyObject *mod_set_hooks_paused(PyObject *module, PyObject *arg) {
    (void)module;
    int paused = PyObject_IsTrue(arg);
    if (paused < 0) return NULL;
    int previous = hooks_paused;
    hooks_paused = paused;
    return PyBool_FromLong(previous);
}

static PyMethodDef hook_functions_table[] = {
    {"_queue_backward_callback", mod_queue_backward_callback, METH_O,
     "_queue_backward_callback(fn, /)\n--\n\nRuns fn() when this thread's outermost running "
     "backward returns (not when it raises). RuntimeError outside a backward."},
    {"_in_backward", mod_in_backward, METH_NOARGS,
     "_in_backward()\n--\n\nWhether a backward is running in this thread."},
    {"_backward_id", mod_backward_id, METH_NOARGS,
     "_backward_id()\n--\n\nThe number of the outermost backward running in this thread "
     "(0: none); each backward gets a new one."},
    {"_set_hooks_paused", mod_set_hooks_paused, METH_O,
     "_set_hooks_paused(paused, /)\n--\n\nTurns this thread's gradient hooks off (True) or on; "
     "returns the previous setting."},
    {NULL, NULL, 0, NULL},
};

int hooks_module_init(PyObject *module) {
    if (handle_type == NULL) {
        handle_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &handle_spec, NULL);
        if (handle_type == NULL) return -1;
    }
    if (PyModule_AddType(module, handle_type) < 0) return -1;
    return PyModule_AddFunctions(module, hook_functions_table);
}
