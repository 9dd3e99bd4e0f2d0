/* alignment.c: aligned collections for needle.distributed (the policy:
 * docs/design.md, "The collection policy", aligned collections; the Python
 * side: python/needle/memory/alignment.py). With alignment on, the pacer turns
 * a soft collection into a want; the wants ride on the next gradient
 * all-reduce, and when any rank wanted one, every rank runs the collection
 * here, right after that all-reduce. The state (on or off, the wants, the
 * seconds to report) lives in pressure.c's runtime struct (pressure.h).
 */
#include "pressure.h"

#include "collection_log.h"

/* The aligned collection every rank agreed on, run by each of them, wanted or
 * not (that is the alignment): with `ladder`, the ladder on the device that
 * wanted it (else the one that asks the most; one scoped collection covers
 * every device's graph); then the agreed Python generation (-1: none) unless
 * the ladder ran a full collection. Recorded as one aligned collection: the
 * chosen device's, or the process's when only a generation ran. */
static void run_aligned_collection(pressure_runtime *rt, int ladder, int generation) {
    double start = pressure_now();
    int ran_full = 0, owned = 0;
    if (ladder) {
        nd_device *chosen = NULL;
        int64_t most = -1;
        int chosen_wants = 0;
        for (int id = 0; id < nd_device_count() && id < ND_MAX_DEVICES; id++) {
            nd_device *dev = nd_device_at(id);
            if (dev == NULL) continue;
            int64_t asked =
                nd_pacer_soft_target(&rt->policy, pressure_allocated(dev), nd_device_budget(dev));
            if (asked < 0) asked = 0; /* below high water asks nothing, like no budget */
            int wants = rt->devices[id].want;
            /* A device that wanted it first, then the one that asks the most. */
            if (chosen == NULL || wants > chosen_wants || (wants == chosen_wants && asked > most)) {
                chosen = dev;
                most = asked;
                chosen_wants = wants;
            }
            rt->devices[id].want = 0;
        }
        if (chosen != NULL) {
            nd_pacer_state *st = &rt->devices[nd_device_id(chosen)];
            nd_pacer_event event = pressure_event(rt, chosen, ND_PACER_ALIGNED, start, 0);
            nd_pacer_decision decision = nd_pacer_decide(&rt->policy, st, &event);
            owned = collection_log_begin(chosen, COLLECTION_ALIGNED);
            pressure_run(rt, chosen, &event, &decision);
            ran_full = st->fallback.last_ran_full;
        }
    }
    if (generation >= 0 && !ran_full) {
        if (!owned) owned = collection_log_begin(NULL, COLLECTION_ALIGNED);
        pressure_collect_generation(generation);
    }
    collection_log_end(owned);
    rt->aligned_unreported_seconds += pressure_now() - start;
}

static PyObject *set_collection_alignment(PyObject *module, PyObject *arg) {
    (void)module;
    pressure_runtime *rt = pressure_runtime_get();
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    int previous = rt->aligned;
    rt->aligned = on;
    if (!on) {
        /* Back to local collections: pending wants fall to the next trigger. */
        for (int id = 0; id < ND_MAX_DEVICES; id++) rt->devices[id].want = 0;
    }
    return PyBool_FromLong(previous);
}

/* This round's wants: whether any device wants a collection, and the seconds
 * the aligned collections took since the last call (then zeroed). Called once
 * per all-reduce round: each pending want waited one more. */
static PyObject *collection_wants(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    pressure_runtime *rt = pressure_runtime_get();
    int wanted = 0;
    for (int id = 0; id < ND_MAX_DEVICES; id++)
        if (nd_pacer_want_round(&rt->devices[id])) wanted = 1;
    double seconds = rt->aligned_unreported_seconds;
    rt->aligned_unreported_seconds = 0.0;
    return Py_BuildValue("(Od)", wanted ? Py_True : Py_False, seconds);
}

static PyObject *run_aligned(PyObject *module, PyObject *args) {
    (void)module;
    pressure_runtime *rt = pressure_runtime_get();
    int ladder, generation;
    if (!PyArg_ParseTuple(args, "pi:_run_aligned_collection", &ladder, &generation)) return NULL;
    if (generation < -1 || generation > 2) {
        PyErr_Format(PyExc_ValueError, "generation must be -1 (none), 0, 1 or 2, got %d",
                     generation);
        return NULL;
    }
    if (!rt->aligned) {
        PyErr_SetString(PyExc_RuntimeError, "an aligned collection needs alignment on "
                                            "(needle.memory.alignment.enable(True))");
        return NULL;
    }
    /* During a CUDA graph capture the collection waits for its end (a
     * finalizer's frees cannot run inside it); the end runs it. */
    if (nd_memory_capturing()) {
        nd_memory_defer_collection();
        Py_RETURN_NONE;
    }
    /* Another thread's collection is running: it is this rank's collection. */
    if (!pressure_other_thread_collecting(rt)) run_aligned_collection(rt, ladder, generation);
    Py_RETURN_NONE;
}

PyMethodDef alignment_module_functions[] = {
    {"_set_collection_alignment", set_collection_alignment, METH_O,
     "_set_collection_alignment(on, /)\n--\n\nTurns aligned collections on or off (soft "
     "collections become wants); returns the previous setting."},
    {"_collection_wants", collection_wants, METH_NOARGS,
     "_collection_wants()\n--\n\n(wanted, seconds): whether a soft collection is wanted on "
     "any device, and the seconds aligned collections took since the last call."},
    {"_run_aligned_collection", run_aligned, METH_VARARGS,
     "_run_aligned_collection(ladder, generation, /)\n--\n\nRuns the collection the ranks "
     "agreed on: the ladder (when ladder is true), then gc.collect(generation) unless the ladder "
     "ran a full one (-1: no generation)."},
    {NULL, NULL, 0, NULL},
};
