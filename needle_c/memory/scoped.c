/* scoped.c: the scoped collection: Python's cycle-collection algorithm run
 * over needle's own objects only, so that freeing a training step's graph
 * costs what the graph costs, not what every tracked object of the process
 * costs (docs/design.md, "The scoped collection").
 *
 * The set: the linked objects of the registry (autograd/registry.c: every
 * live Value and Op) that are GC-tracked (an untracked one is in its
 * dealloc, e.g. a subclass instance waiting in the trashcan; it is left out,
 * which only keeps more alive), seen through the tuples and dicts they own
 * alone (refcount 1: a node's inputs tuple, its __dict__).
 *
 * The algorithm (the collector's): refs = refcount for each object of the
 * set; subtract every reference that comes from inside the set (tp_traverse);
 * an object with refs != 0 is referenced from outside (a list, a dict, a
 * frame, a closure, a C local): a root. Objects whose type has a finalizer
 * (tp_finalize: a Python subclass with __del__) are roots too, so finalizers
 * are left to the full collection. So are frozen objects (gc.freeze()), which
 * the collector never examines. Everything reachable from a root (an
 * explicit stack, no recursion) is kept; the rest is garbage nothing outside
 * the set can reach. Garbage is freed as the collector frees it: a reference
 * is held to each, tp_clear is called on each, the references are released.
 * Weakrefs behave as under reference counting: their callbacks run when the
 * object is freed (and may see other garbage already cleared: fields None,
 * inputs empty). No Python object is allocated until the clearing starts, no
 * Python code runs while the set is examined.
 *
 * Frozen objects. The public API cannot tell which objects are frozen, and
 * needle patches nothing of Python's (gc.freeze stays the gc module's), so
 * the scoped collection reads gc.get_freeze_count() as it begins and keeps a
 * mark per linked object (needle_link.frozen), compared with the count it
 * read the time before (needle_rt.scoped.freeze_count):
 * - 0: nothing is frozen (an unfreeze, or no freeze ever): every mark goes;
 * - grown: a freeze ran since; every object linked now is marked, also those
 *   linked after that freeze and before this collection (not frozen in
 *   truth: they are left to the full collection, which only collects less);
 * - shrunk but not 0: frozen objects died, or an unfreeze and a smaller
 *   freeze ran since; the two look alike, so every linked object is marked
 *   as for a freeze (the same conservative answer);
 * - unchanged: the marks stand; an object linked since starts unmarked.
 * The freezes this misses are those that leave the count where it was
 * between two scoped collections (an unfreeze and a freeze of as many
 * objects, or a freeze of as many objects as frozen ones died): objects
 * linked in between may then be freed while frozen (their memory is handled
 * as under reference counting; only freeze's promise to leave them be is
 * broken). gc.freeze() is meant for a process's setup, before its garbage
 * starts; needle takes this over replacing gc.freeze for the whole process.
 *
 * On 3.12 the collector parks the immortal containers it meets in the
 * permanent generation, which the count includes: the gc.callbacks observer
 * takes the count a collection leaves as the one seen last (no freeze).
 *
 * Never during Python's own collection (a gc.callbacks observer tracks the
 * phases), never nested (including from code run while garbage is freed), and
 * not at all on free-threaded builds (Py_GIL_DISABLED: the lists would need
 * locking; scoped_collect refuses and callers fall back to a full
 * collection).
 */
#include "../autograd/tensor.h"
#include "collection_log.h"
#include "pressure.h"
#include "runtime.h"

#include <time.h>

enum { LINK_OUT = 0, LINK_IN = 1, LINK_REACHABLE = 2 };

/* The registry's lists are needle_rt.autograd's; the collection's own
 * state is needle_rt.scoped (the engine's allocation callback starts a
 * collection with no module at hand); its Python objects (the observers,
 * gc.get_freeze_count) are module state, reached through needle_rt.state. */
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
    const needle_state *st = needle_rt.state;
    if (!(tp->tp_flags & Py_TPFLAGS_HEAPTYPE) || st == NULL || st->autograd == NULL) return NULL;
    const autograd_state *types = st->autograd;
    if (types->value_type != NULL && PyType_IsSubtype(tp, types->value_type))
        return &Tensor_CAST(o)->link;
    if (types->op_type != NULL && PyType_IsSubtype(tp, types->op_type)) return &Op_CAST(o)->link;
    return NULL;
}

/* In this collection's set. */
static int member(const needle_link *l) {
    return l->epoch == needle_rt.scoped.epoch && l->state != LINK_OUT;
}

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
    return needle_rt.state != NULL && needle_rt.state->gc_get_freeze_count != NULL &&
           needle_rt.scoped.enabled;
#endif
}

int scoped_busy(void) { return needle_rt.scoped.in_progress || needle_rt.scoped.python_gc_running; }

/* Calls each observer with (phase, info); never raises. */
static void notify(const char *phase, Py_ssize_t collected) {
    PyObject *observers = needle_rt.state ? needle_rt.state->scoped_observers : NULL;
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
        l->epoch = needle_rt.scoped.epoch;
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

/* Brings the frozen marks up to date with gc.get_freeze_count() (the
 * header's rules). 0, or -1 (no exception set) when the count cannot be read:
 * the collection is then not run. */
static int sync_frozen(void) {
    PyObject *result = PyObject_CallNoArgs(needle_rt.state->gc_get_freeze_count);
    Py_ssize_t count = result != NULL ? PyLong_AsSsize_t(result) : -1;
    Py_XDECREF(result);
    if (count < 0) {
        PyErr_Clear();
        return -1;
    }
    if (count != needle_rt.scoped.freeze_count) {
        mark_frozen(&needle_rt.autograd.values, count > 0);
        mark_frozen(&needle_rt.autograd.ops, count > 0);
        needle_rt.scoped.freeze_count = count;
    }
    return 0;
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
    needle_rt.scoped.in_progress = 1;
    double start = now_seconds();
    notify("start", 0);
    /* Python may run while the count is read (a collection, finalizers);
     * from here on nothing runs until the clearing. */
    if (sync_frozen() < 0) {
        r->refused = SCOPED_NO_MEMORY;
        notify("stop", 0);
        needle_rt.scoped.in_progress = 0;
        return -1;
    }
    if (++needle_rt.scoped.epoch == 0) needle_rt.scoped.epoch = 1;
    /* Examining the set runs no Python code and allocates no Python object:
     * nothing can change the registry or any refcount until clearing. */
    r->examined = enter_set(&needle_rt.autograd.values, value_of_link) +
                  enter_set(&needle_rt.autograd.ops, op_of_link);
    subtract_internal(&needle_rt.autograd.values, value_of_link);
    subtract_internal(&needle_rt.autograd.ops, op_of_link);
    mark_stack s = {NULL, 0, 0, 0, 1}, garbage = {NULL, 0, 0, 0, 0};
    push_roots(&needle_rt.autograd.values, value_of_link, &s);
    push_roots(&needle_rt.autograd.ops, op_of_link, &s);
    while (s.n > 0 && !s.failed) {
        PyObject *o = s.items[--s.n];
        Py_TYPE(o)->tp_traverse(o, visit_mark, &s);
    }
    if (!s.failed) {
        gather_garbage(&needle_rt.autograd.values, value_of_link, &garbage);
        gather_garbage(&needle_rt.autograd.ops, op_of_link, &garbage);
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
    scoped_totals *totals = &needle_rt.scoped.totals;
    totals->collections++;
    totals->examined += r->examined;
    totals->collected += r->collected;
    totals->seconds += r->seconds;
    needle_rt.scoped.in_progress = 0;
    return r->refused ? -1 : r->collected;
}

const scoped_totals *scoped_get_totals(void) { return &needle_rt.scoped.totals; }

/* ------------------------------------------------- the gc.callbacks observer */

static PyObject *on_gc_phase(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *phase, *info;
    if (!PyArg_ParseTuple(args, "OO", &phase, &info)) return NULL;
    int start = PyUnicode_Check(phase) && PyUnicode_CompareWithASCIIString(phase, "start") == 0;
    needle_rt.scoped.python_gc_running = start;
    /* The collection log's part (the user's gc.collect()): what info says. */
    PyObject *gen = PyDict_Check(info) ? PyDict_GetItemString(info, "generation") : NULL;
    PyObject *done = PyDict_Check(info) ? PyDict_GetItemString(info, "collected") : NULL;
    long generation = gen != NULL && PyLong_Check(gen) ? PyLong_AsLong(gen) : -1;
    long long collected = done != NULL && PyLong_Check(done) ? PyLong_AsLongLong(done) : 0;
    if (PyErr_Occurred()) PyErr_Clear();
    collection_log_python_phase(start, (int)generation, collected);
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
    /* 3.12's collector moves every immortal container it meets into the
     * permanent generation, and gc.get_freeze_count() counts those too: a
     * count grown across a collection is no freeze. So the marks catch up as
     * a collection starts (what changed before it is a freeze or an
     * unfreeze), and the count it leaves is taken as the one seen last. */
    if (!needle_rt.scoped.in_progress && needle_rt.state != NULL &&
        needle_rt.state->gc_get_freeze_count != NULL) {
        if (start) {
            (void)sync_frozen(); /* an unreadable count: the next scoped collection refuses */
        } else {
            PyObject *result = PyObject_CallNoArgs(needle_rt.state->gc_get_freeze_count);
            Py_ssize_t count = result != NULL ? PyLong_AsSsize_t(result) : -1;
            Py_XDECREF(result);
            if (count >= 0) needle_rt.scoped.freeze_count = count;
            PyErr_Clear();
        }
    }
#endif
    Py_RETURN_NONE;
}

static PyMethodDef on_gc_phase_def = {
    "_scoped_gc_phase", on_gc_phase, METH_VARARGS,
    "_scoped_gc_phase(phase, info, /)\n--\n\nThe gc.callbacks observer that keeps scoped "
    "collections out of Python's own collections."};

/* ------------------------------------------------- install */

/* Adds the gc.callbacks observer and takes gc.get_freeze_count and the
 * observers' list into the module state; the runtime's collection then
 * belongs to this module. The gc module itself is left as it is. */
int scoped_install(PyObject *module, needle_state *st) {
    if (st->scoped_observers == NULL && (st->scoped_observers = PyList_New(0)) == NULL) return -1;
    PyObject *fn = PyCFunction_NewEx(&on_gc_phase_def, module, NULL);
    PyObject *gc = fn ? PyImport_ImportModule("gc") : NULL;
    PyObject *callbacks = gc ? PyObject_GetAttrString(gc, "callbacks") : NULL;
    int rc = callbacks != NULL && PyList_Check(callbacks) ? PyList_Append(callbacks, fn) : -1;
    if (rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "gc.callbacks missing");
    PyObject *count_fn = rc == 0 ? PyObject_GetAttrString(gc, "get_freeze_count") : NULL;
    PyObject *count = count_fn ? PyObject_CallNoArgs(count_fn) : NULL;
    Py_ssize_t n = count ? PyLong_AsSsize_t(count) : -1;
    if (n < 0) {
        rc = -1;
        Py_CLEAR(count_fn);
    }
    Py_XDECREF(count);
    Py_XDECREF(callbacks);
    Py_XDECREF(gc);
    Py_XDECREF(fn);
    if (rc < 0) return -1;
    Py_XSETREF(st->gc_get_freeze_count, count_fn);
    /* What is frozen already holds no needle object: none existed before. */
    if (needle_rt.state == NULL) needle_rt.scoped.freeze_count = n;
    return 0;
}

int scoped_traverse(needle_state *st, visitproc visit, void *arg) {
    Py_VISIT(st->scoped_observers);
    Py_VISIT(st->gc_get_freeze_count);
    return 0;
}

void scoped_forget(needle_state *st) {
    Py_CLEAR(st->scoped_observers);
    Py_CLEAR(st->gc_get_freeze_count);
}

/* ------------------------------------------------- module functions */

static PyObject *collect_needle(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    scoped_result r;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    pressure_collect_user_scoped(&r);
    PyErr_Restore(type, value, traceback);
    static const char *why[] = {NULL, "unsupported", "busy", "no memory"};
    return Py_BuildValue("{s:n,s:n,s:d,s:O,s:s}", "collected", r.collected, "examined", r.examined,
                         "seconds", r.seconds, "ran", r.refused == 0 ? Py_True : Py_False,
                         "refused", why[r.refused] ? why[r.refused] : "");
}

static PyObject *scoped_info(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    PyObject *observers = state_of_module(module)->scoped_observers;
    const scoped_totals *totals = &needle_rt.scoped.totals;
    return Py_BuildValue(
        "{s:O,s:n,s:L,s:L,s:L,s:d,s:O}", "supported", scoped_supported() ? Py_True : Py_False,
        "registered", needle_rt.autograd.linked, "collections", (long long)totals->collections,
        "examined", (long long)totals->examined, "collected", (long long)totals->collected,
        "seconds", totals->seconds, "observers", observers ? observers : Py_None);
}

static PyObject *set_scoped_enabled(PyObject *module, PyObject *arg) {
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    PyObject *previous = PyBool_FromLong(needle_rt.scoped.enabled);
    needle_rt.scoped.enabled = on;
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
