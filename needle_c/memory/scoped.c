/* scoped.c: the scoped collection: Python's cycle-collection algorithm run
 * over needle's own objects only, so that freeing a training step's graph
 * costs what the graph costs, not what every tracked object of the process
 * costs (docs/design.md, "The scoped collection").
 *
 * The registry: every live Value (Tensor, TensorTuple, subclasses) and Op
 * (built-in ops, TensorOp, TensorTupleOp, Python subclasses) is on one of two
 * intrusive doubly linked lists (the needle_link field of its layout): linked
 * in value_alloc / op_new / op_new_builtin once its fields are valid, which
 * every construction goes through (a Python subclass's tp_new included), and
 * unlinked first thing in its dealloc, before weakref callbacks or the
 * trashcan can run code. O(1) both ways, no allocation.
 *
 * The set: the linked objects that are GC-tracked (an untracked one is in
 * its dealloc, e.g. a subclass instance waiting in the trashcan; it is left
 * out, which only keeps more alive), seen through the tuples and dicts they
 * own alone (refcount 1: a node's inputs tuple, its __dict__).
 *
 * The algorithm (the collector's): refs = refcount for each object of the
 * set; subtract every reference that comes from inside the set (tp_traverse);
 * an object with refs != 0 is referenced from outside (a list, a dict, a
 * frame, a closure, a C local): a root. Objects whose type has a finalizer
 * (tp_finalize: a Python subclass with __del__) are roots too, so finalizers
 * are left to the full collection. So are frozen objects (gc.freeze()), which
 * the collector never examines. The public API cannot tell which objects
 * are frozen, so needle wraps gc.freeze and gc.unfreeze (the gc module's
 * attributes, replaced when needle_c is imported): a freeze marks every
 * linked object, an unfreeze clears the marks, objects linked later start
 * unmarked. A freeze through a reference to the original function taken
 * before needle_c was imported goes unseen (then frozen needle garbage may
 * be freed; objects made before needle_c cannot be needle objects).
 * Everything reachable from a root (an
 * explicit stack, no recursion) is kept; the rest is garbage nothing outside
 * the set can reach. Garbage is freed as the collector frees it: a reference
 * is held to each, tp_clear is called on each, the references are released.
 * Weakrefs behave as under reference counting: their callbacks run when the
 * object is freed (and may see other garbage already cleared: fields None,
 * inputs empty). No Python object is allocated until the clearing starts, no
 * Python code runs while the set is examined.
 *
 * Never during Python's own collection (a gc.callbacks observer tracks the
 * phases), never nested (including from code run while garbage is freed), and
 * not at all on free-threaded builds (Py_GIL_DISABLED: the lists would need
 * locking; scoped_collect refuses and callers fall back to a full
 * collection).
 */
#include "../autograd/tensor.h"

#include <time.h>

enum { LINK_OUT = 0, LINK_IN = 1, LINK_REACHABLE = 2 };

static needle_link values_head = {&values_head, &values_head, 0, 0, LINK_OUT, 0};
static needle_link ops_head = {&ops_head, &ops_head, 0, 0, LINK_OUT, 0};
static Py_ssize_t linked_count = 0;

/* Borrowed: the types of the module that installed the scoped collection
 * (they live in module state); NULL once it is cleared. */
static autograd_state *types = NULL;
static uint32_t epoch = 0;
static int in_progress = 0;
/* _set_scoped_enabled(False): the ladder runs full collections only (for
 * comparisons in benchmarks and tests). */
static int enabled = 1;
static int python_gc_running = 0;
/* Observers called like gc.callbacks ("start"/"stop", info) around each
 * scoped collection (warn_on_cycles uses it); a list, or NULL. */
static PyObject *observers = NULL;
/* The gc module's own freeze and unfreeze, which needle's wrappers call. */
static PyObject *gc_freeze = NULL, *gc_unfreeze = NULL;

static scoped_totals totals;

static void link_insert(needle_link *head, needle_link *l) {
#ifndef Py_GIL_DISABLED
    l->next = head->next;
    l->prev = head;
    l->frozen = 0;
    head->next->prev = l;
    head->next = l;
    linked_count++;
#else
    (void)head;
    (void)l;
#endif
}

static void link_remove(needle_link *l) {
    if (l->prev == NULL) return;
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = NULL;
    linked_count--;
}

void scoped_link_value(PyObject *value) { link_insert(&values_head, &Tensor_CAST(value)->link); }
void scoped_unlink_value(PyObject *value) { link_remove(&Tensor_CAST(value)->link); }
void scoped_link_op(PyObject *op) { link_insert(&ops_head, &Op_CAST(op)->link); }
void scoped_unlink_op(PyObject *op) { link_remove(&Op_CAST(op)->link); }

static PyObject *value_of_link(needle_link *l) {
    return (PyObject *)((char *)l - offsetof(TensorObject, link));
}
static PyObject *op_of_link(needle_link *l) {
    return (PyObject *)((char *)l - offsetof(OpObject, link));
}

/* The registry entry of a needle object, NULL for anything else. */
static needle_link *link_of(PyObject *o) {
    PyTypeObject *tp = Py_TYPE(o);
    if (tp->tp_traverse == value_traverse) return &Tensor_CAST(o)->link;
    if (tp->tp_traverse == op_traverse) return &Op_CAST(o)->link;
    if (!(tp->tp_flags & Py_TPFLAGS_HEAPTYPE) || types == NULL) return NULL;
    if (PyType_IsSubtype(tp, types->value_type)) return &Tensor_CAST(o)->link;
    if (PyType_IsSubtype(tp, types->op_type)) return &Op_CAST(o)->link;
    return NULL;
}

/* In this collection's set. */
static int member(const needle_link *l) { return l->epoch == epoch && l->state != LINK_OUT; }

/* A tuple or dict that only its referrer holds: seen through as part of it. */
static int owned(PyObject *o) {
    return (PyTuple_CheckExact(o) || PyDict_CheckExact(o)) && Py_REFCNT(o) == 1;
}

static int visit_subtract(PyObject *o, void *see_through) {
    needle_link *l = link_of(o);
    if (l != NULL) {
        if (member(l)) l->refs--;
    } else if (see_through != NULL && owned(o)) {
        Py_TYPE(o)->tp_traverse(o, visit_subtract, NULL);
    }
    return 0;
}

typedef struct mark_stack {
    PyObject **items;
    size_t n, cap;
    int failed; /* out of C memory: the collection is abandoned */
    int see_through;
} mark_stack;

static void push(mark_stack *s, PyObject *o) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        PyObject **items = PyMem_RawRealloc(s->items, cap * sizeof(PyObject *));
        if (items == NULL) {
            s->failed = 1;
            return;
        }
        s->items = items;
        s->cap = cap;
    }
    s->items[s->n++] = o;
}

static int visit_mark(PyObject *o, void *arg) {
    mark_stack *s = arg;
    needle_link *l = link_of(o);
    if (l != NULL) {
        if (member(l) && l->state != LINK_REACHABLE) {
            l->state = LINK_REACHABLE;
            push(s, o);
        }
    } else if (s->see_through && owned(o)) {
        s->see_through = 0;
        Py_TYPE(o)->tp_traverse(o, visit_mark, s);
        s->see_through = 1;
    }
    return 0;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int scoped_supported(void) {
#ifdef Py_GIL_DISABLED
    return 0;
#else
    return types != NULL && enabled;
#endif
}

int scoped_busy(void) { return in_progress || python_gc_running; }

/* Calls each observer with (phase, info); never raises. */
static void notify(const char *phase, Py_ssize_t collected) {
    if (observers == NULL || PyList_GET_SIZE(observers) == 0) return;
    PyObject *copy = PyList_GetSlice(observers, 0, PyList_GET_SIZE(observers));
    PyObject *info = Py_BuildValue("{s:i,s:n,s:n,s:s}", "generation", -1, "collected", collected,
                                   "uncollectable", (Py_ssize_t)0, "scope", "needle");
    for (Py_ssize_t i = 0; copy != NULL && info != NULL && i < PyList_GET_SIZE(copy); i++) {
        PyObject *r = PyObject_CallFunction(PyList_GET_ITEM(copy, i), "sO", phase, info);
        if (r == NULL) PyErr_WriteUnraisable(PyList_GET_ITEM(copy, i));
        Py_XDECREF(r);
    }
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    Py_XDECREF(copy);
    Py_XDECREF(info);
}

/* Pass 1: the set. Returns its size. */
static Py_ssize_t enter_set(needle_link *head, PyObject *(*object_of)(needle_link *)) {
    Py_ssize_t n = 0;
    for (needle_link *l = head->next; l != head; l = l->next) {
        PyObject *o = object_of(l);
        l->epoch = epoch;
        if (!PyObject_GC_IsTracked(o)) {
            l->state = LINK_OUT;
            continue;
        }
        l->state = LINK_IN;
        l->refs = Py_REFCNT(o);
        n++;
    }
    return n;
}

static void subtract_internal(needle_link *head, PyObject *(*object_of)(needle_link *)) {
    for (needle_link *l = head->next; l != head; l = l->next)
        if (l->state != LINK_OUT) {
            PyObject *o = object_of(l);
            Py_TYPE(o)->tp_traverse(o, visit_subtract, (void *)1);
        }
}

static void push_roots(needle_link *head, PyObject *(*object_of)(needle_link *), mark_stack *s) {
    for (needle_link *l = head->next; l != head; l = l->next) {
        PyObject *o = object_of(l);
        if (l->state == LINK_IN && (l->refs != 0 || l->frozen || Py_TYPE(o)->tp_finalize != NULL)) {
            l->state = LINK_REACHABLE;
            push(s, o);
        }
    }
}

static void gather_garbage(needle_link *head, PyObject *(*object_of)(needle_link *),
                           mark_stack *g) {
    for (needle_link *l = head->next; l != head; l = l->next)
        if (l->state == LINK_IN) push(g, object_of(l));
}

static void mark_frozen(needle_link *head, int frozen) {
    for (needle_link *l = head->next; l != head; l = l->next) l->frozen = frozen;
}

Py_ssize_t scoped_collect(scoped_result *r) {
    memset(r, 0, sizeof *r);
    if (!scoped_supported()) {
        r->refused = SCOPED_UNSUPPORTED;
        return -1;
    }
    if (scoped_busy()) {
        r->refused = SCOPED_BUSY;
        return -1;
    }
    in_progress = 1;
    double start = now_seconds();
    notify("start", 0);
    if (++epoch == 0) epoch = 1;
    /* Examining the set runs no Python code and allocates no Python object:
     * nothing can change the registry or any refcount until clearing. */
    r->examined = enter_set(&values_head, value_of_link) + enter_set(&ops_head, op_of_link);
    subtract_internal(&values_head, value_of_link);
    subtract_internal(&ops_head, op_of_link);
    mark_stack s = {NULL, 0, 0, 0, 1}, garbage = {NULL, 0, 0, 0, 0};
    push_roots(&values_head, value_of_link, &s);
    push_roots(&ops_head, op_of_link, &s);
    while (s.n > 0 && !s.failed) {
        PyObject *o = s.items[--s.n];
        Py_TYPE(o)->tp_traverse(o, visit_mark, &s);
    }
    if (!s.failed) {
        gather_garbage(&values_head, value_of_link, &garbage);
        gather_garbage(&ops_head, op_of_link, &garbage);
    }
    PyMem_RawFree(s.items);
    if (s.failed || garbage.failed) {
        garbage.n = 0; /* abandoned: nothing is freed */
        r->refused = SCOPED_NO_MEMORY;
    }
    /* Free as the collector does: hold each, clear each, release each. */
    for (size_t i = 0; i < garbage.n; i++) Py_INCREF(garbage.items[i]);
    for (size_t i = 0; i < garbage.n; i++) {
        inquiry clear = Py_TYPE(garbage.items[i])->tp_clear;
        if (clear != NULL) clear(garbage.items[i]);
        if (PyErr_Occurred()) PyErr_WriteUnraisable(garbage.items[i]);
    }
    for (size_t i = 0; i < garbage.n; i++) Py_DECREF(garbage.items[i]);
    PyMem_RawFree(garbage.items);
    r->collected = (Py_ssize_t)garbage.n;
    notify("stop", r->collected);
    r->seconds = now_seconds() - start;
    totals.collections++;
    totals.examined += r->examined;
    totals.collected += r->collected;
    totals.seconds += r->seconds;
    in_progress = 0;
    return r->refused ? -1 : r->collected;
}

const scoped_totals *scoped_get_totals(void) { return &totals; }

/* ------------------------------------------------- the gc.callbacks observer */

static PyObject *on_gc_phase(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *phase, *info;
    if (!PyArg_ParseTuple(args, "OO", &phase, &info)) return NULL;
    python_gc_running =
        PyUnicode_Check(phase) && PyUnicode_CompareWithASCIIString(phase, "start") == 0;
    Py_RETURN_NONE;
}

static PyMethodDef on_gc_phase_def = {
    "_scoped_gc_phase", on_gc_phase, METH_VARARGS,
    "_scoped_gc_phase(phase, info, /)\n--\n\nThe gc.callbacks observer that keeps scoped "
    "collections out of Python's own collections."};

/* ------------------------------------------------- gc.freeze / gc.unfreeze */

static PyObject *call_and_mark(PyObject *original, int frozen) {
    PyObject *result = PyObject_CallNoArgs(original);
    if (result != NULL) {
        mark_frozen(&values_head, frozen);
        mark_frozen(&ops_head, frozen);
    }
    return result;
}

static PyObject *freeze_wrapper(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return call_and_mark(gc_freeze, 1);
}

static PyObject *unfreeze_wrapper(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return call_and_mark(gc_unfreeze, 0);
}

static PyMethodDef freeze_def = {
    "freeze", freeze_wrapper, METH_NOARGS,
    "freeze()\n--\n\nFreeze all current tracked objects and ignore them for future "
    "collections (Python's gc.freeze; needle's wrapper also tells its scoped collection, "
    "which then leaves these objects alone too)."};
static PyMethodDef unfreeze_def = {
    "unfreeze", unfreeze_wrapper, METH_NOARGS,
    "unfreeze()\n--\n\nUnfreeze all objects in the permanent generation (Python's "
    "gc.unfreeze; needle's wrapper also tells its scoped collection)."};

/* Replaces gc.<name> by a wrapper of def around it, keeping the original in
 * *original; a wrapper already there (a second import) is kept. */
static int wrap_one(PyObject *module, PyObject *gc, const char *name, PyMethodDef *def,
                    PyObject **original) {
    PyObject *current = PyObject_GetAttrString(gc, name);
    if (current == NULL) return -1;
    if (PyCFunction_Check(current) && PyCFunction_GetFunction(current) == def->ml_meth) {
        Py_DECREF(current);
        return 0;
    }
    PyObject *wrapper = PyCFunction_NewEx(def, module, NULL);
    int rc = wrapper != NULL ? PyObject_SetAttrString(gc, name, wrapper) : -1;
    Py_XDECREF(wrapper);
    if (rc == 0) {
        Py_XSETREF(*original, current);
    } else {
        Py_DECREF(current);
    }
    return rc;
}

static int wrap_freezing(PyObject *module, PyObject *gc) {
    if (wrap_one(module, gc, "freeze", &freeze_def, &gc_freeze) < 0) return -1;
    return wrap_one(module, gc, "unfreeze", &unfreeze_def, &gc_unfreeze);
}

int scoped_install(PyObject *module, needle_state *st) {
    types = st->autograd;
    if (observers == NULL && (observers = PyList_New(0)) == NULL) return -1;
    PyObject *fn = PyCFunction_NewEx(&on_gc_phase_def, module, NULL);
    PyObject *gc = fn ? PyImport_ImportModule("gc") : NULL;
    PyObject *callbacks = gc ? PyObject_GetAttrString(gc, "callbacks") : NULL;
    int rc = callbacks != NULL && PyList_Check(callbacks) ? PyList_Append(callbacks, fn) : -1;
    if (rc == 0) rc = wrap_freezing(module, gc);
    if (rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "gc.callbacks missing");
    Py_XDECREF(callbacks);
    Py_XDECREF(gc);
    Py_XDECREF(fn);
    return rc;
}

void scoped_forget(needle_state *st) {
    if (st->autograd == types) types = NULL;
}

/* ------------------------------------------------- module functions */

static PyObject *collect_needle(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    scoped_result r;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    scoped_collect(&r);
    PyErr_Restore(type, value, traceback);
    static const char *why[] = {NULL, "unsupported", "busy", "no memory"};
    return Py_BuildValue("{s:n,s:n,s:d,s:O,s:s}", "collected", r.collected, "examined", r.examined,
                         "seconds", r.seconds, "ran", r.refused == 0 ? Py_True : Py_False,
                         "refused", why[r.refused] ? why[r.refused] : "");
}

static PyObject *scoped_info(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return Py_BuildValue("{s:O,s:n,s:L,s:L,s:L,s:d,s:O}", "supported",
                         scoped_supported() ? Py_True : Py_False, "registered", linked_count,
                         "collections", (long long)totals.collections, "examined",
                         (long long)totals.examined, "collected", (long long)totals.collected,
                         "seconds", totals.seconds, "observers", observers ? observers : Py_None);
}

static PyObject *set_scoped_enabled(PyObject *module, PyObject *arg) {
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    PyObject *previous = PyBool_FromLong(enabled);
    enabled = on;
    return previous;
}

PyMethodDef scoped_module_functions[] = {
    {"_set_scoped_enabled", set_scoped_enabled, METH_O,
     "_set_scoped_enabled(on, /)\n--\n\nFalse: the collection ladder skips the scoped step and "
     "runs full collections only (as before it existed). Returns the previous value."},
    {"_collect_needle", collect_needle, METH_NOARGS,
     "_collect_needle()\n--\n\nRuns a scoped collection over needle's objects now (even with "
     "gc.disable()); a dict: collected, examined, seconds, ran, refused."},
    {"_scoped_info", scoped_info, METH_NOARGS,
     "_scoped_info()\n--\n\nThe registry size and the totals of every scoped collection; "
     "'observers' is the list of (phase, info) callbacks run around each."},
    {NULL, NULL, 0, NULL},
};
