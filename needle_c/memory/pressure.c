/* pressure.c: the collection runner. It is the engine's collection callback
 * and the safe points' entry: it reads the clock and the device's bytes,
 * asks the pacer (csrc/gc_pacer.c, the policy: docs/design.md, "The
 * collection policy") what to do, runs the collections (the scoped one of
 * scoped.c, the full one through Python's gc), and hands what they did back
 * to the pacer. It decides nothing itself. Also the policy's module
 * functions (set_gc_policy and friends) and the one runtime struct
 * (pressure.h) that holds the collector's process-wide state.
 */
#include "pressure.h"

#include "collection_log.h"

#include <math.h>
#include <time.h>

static pressure_runtime runtime = {.policy = ND_GC_POLICY_DEFAULTS};

pressure_runtime *pressure_runtime_get(void) { return &runtime; }

static double monotonic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double pressure_now(void) { return runtime.manual_clock ? runtime.manual_now : monotonic_now(); }

int64_t pressure_allocated(const nd_device *dev) {
    nd_memory_stats s;
    nd_memory_get_stats(dev, &s);
    return s.allocated_current;
}

static nd_pacer_state *state_of(pressure_runtime *rt, const nd_device *dev) {
    int id = nd_device_id(dev);
    return id >= 0 && id < ND_MAX_DEVICES ? &rt->devices[id] : NULL;
}

const nd_pacer_state *pressure_device_state(const nd_device *dev) {
    return state_of(&runtime, dev);
}

nd_pacer_event pressure_event(const pressure_runtime *rt, const nd_device *dev,
                              nd_pacer_event_kind kind, double now, int64_t requested) {
    nd_pacer_event e = {
        .kind = kind,
        .now = now,
        .allocated = pressure_allocated(dev),
        .requested = requested,
        .budget = nd_device_budget(dev),
        .gc_enabled = PyGC_IsEnabled(),
        .aligned = rt->aligned,
        .scoped_available = scoped_supported(),
    };
    return e;
}

/* Sets dev's trigger from its pacer state: the engine's cheap test before
 * it calls back. */
static void set_trigger(pressure_runtime *rt, nd_device *dev, const nd_pacer_state *st) {
    nd_memory_set_trigger(dev, nd_pacer_trigger(&rt->policy, st, nd_device_budget(dev)));
}

void pressure_refresh(nd_device *dev) {
    nd_pacer_state *st = state_of(&runtime, dev);
    if (st == NULL) return;
    nd_pacer_refresh(st, pressure_allocated(dev));
    set_trigger(&runtime, dev, st);
}

/* Another thread is collecting: wait, with the GIL released, until it is done
 * (or a minute has passed), so that the caller's allocation is retried on
 * what the collection freed. */
static void wait_for_collector(const pressure_runtime *rt) {
    /* Real time, also under a test's clock (which does not move by itself). */
    double deadline = monotonic_now() + 60.0;
    while (rt->collector_thread != 0 && monotonic_now() < deadline) {
        Py_BEGIN_ALLOW_THREADS struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
        Py_END_ALLOW_THREADS
    }
}

int pressure_other_thread_collecting(const pressure_runtime *rt) {
    return rt->collector_thread != 0 && rt->collector_thread != PyThread_get_thread_ident();
}

/* Runs a full collection. The OOM path goes through gc.collect(), which
 * ignores gc.disable(), after gc.unfreeze(): objects frozen by
 * needle.memory.freeze_heap() (or anyone's gc.freeze()) are invisible to
 * collections, and frozen cycles holding device memory must not cause an
 * out-of-memory error. They stay unfrozen afterwards. Under alignment the
 * soft path's full collections go through gc.collect() too (the disabled
 * automatic collector must not stop them). Returns the objects collected. */
static Py_ssize_t run_full_collection(const pressure_runtime *rt, nd_pacer_event_kind kind) {
    int oom = kind == ND_PACER_OUT_OF_MEMORY;
    if (!oom && !rt->aligned) return PyGC_Collect();
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *thawed = gc == NULL ? NULL
                       : !oom     ? Py_NewRef(Py_None)
                                  : PyObject_CallMethod(gc, "unfreeze", NULL);
    PyObject *result = thawed ? PyObject_CallMethod(gc, "collect", NULL) : NULL;
    Py_ssize_t collected = result != NULL ? PyLong_AsSsize_t(result) : 0;
    Py_XDECREF(result);
    Py_XDECREF(thawed);
    Py_XDECREF(gc);
    return collected;
}

/* The ladder: the scoped step (unless the decision is a full collection
 * alone), then what the pacer says follows it. Returns whether a full
 * collection ran. */
static int run_ladder(pressure_runtime *rt, nd_device *dev, nd_pacer_state *st,
                      const nd_pacer_event *event, const nd_pacer_decision *decision) {
    nd_pacer_step step = ND_PACER_RUN_FULL;
    if (decision->action != ND_PACER_FULL) {
        scoped_result r;
        nd_scoped_report report = {ND_SCOPED_FAILED, 0, 0, 0.0};
        if (scoped_collect(&r) >= 0) {
            int64_t after = pressure_allocated(dev);
            collection_log_note(-1, r.collected);
            report.status = ND_SCOPED_RAN;
            report.examined = r.examined;
            report.seconds = r.seconds;
            report.freed_bytes = event->allocated > after ? event->allocated - after : 0;
        } else if (r.refused == SCOPED_BUSY) {
            report.status = ND_SCOPED_BUSY;
        }
        step = nd_pacer_after_scoped(st, event, decision->target, &report);
    }
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    if (step == ND_PACER_DONE) return 0;
    int64_t before = pressure_allocated(dev);
    Py_ssize_t collected = run_full_collection(rt, event->kind);
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    collection_log_note(2, collected);
    nd_pacer_after_full(st, step, before, pressure_allocated(dev));
    return 1;
}

/* What the collection log calls a ladder run for this event. */
static collection_trigger trigger_of(nd_pacer_event_kind kind) {
    switch (kind) {
    case ND_PACER_SAFE_POINT: return COLLECTION_SAFE_POINT;
    case ND_PACER_OUT_OF_MEMORY: return COLLECTION_OOM;
    case ND_PACER_ALIGNED: return COLLECTION_ALIGNED;
    case ND_PACER_ALLOCATION: break;
    }
    return COLLECTION_PRESSURE;
}

void pressure_run(pressure_runtime *rt, nd_device *dev, const nd_pacer_event *event,
                  const nd_pacer_decision *decision) {
    nd_pacer_state *st = state_of(rt, dev);
    if (st == NULL) return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    unsigned long previous = rt->collector_thread;
    rt->collector_thread = PyThread_get_thread_ident();
    /* A scoped step refused as busy ends the ladder with nothing run: no
     * record (and no mark in the trace) for it. */
    int owned = decision->action != ND_PACER_FULL && scoped_busy()
                    ? 0
                    : collection_log_begin(dev, trigger_of(event->kind));
    int ran_full = run_ladder(rt, dev, st, event, decision);
    collection_log_end(owned);
    rt->collector_thread = previous;
    /* A finalizer's exception must not surface inside an unrelated op. */
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    PyErr_Restore(type, value, traceback);
    nd_pacer_after_collection(&rt->policy, st, event, ran_full, pressure_now(),
                              pressure_allocated(dev));
    set_trigger(rt, dev, st);
}

static void collect_for_engine(void *ctx, nd_device *dev, int64_t requested,
                               nd_collect_reason reason) {
    pressure_runtime *rt = ctx;
    nd_pacer_state *st = state_of(rt, dev);
    if (!rt->policy.enabled || st == NULL) return;
    if (pressure_other_thread_collecting(rt)) {
        /* Out of memory: what that collection frees may be enough; the soft
         * path just lets it finish. */
        if (reason == ND_COLLECT_OOM) wait_for_collector(rt);
        return;
    }
    nd_pacer_event_kind kind =
        reason == ND_COLLECT_OOM ? ND_PACER_OUT_OF_MEMORY : ND_PACER_ALLOCATION;
    nd_pacer_event event = pressure_event(rt, dev, kind, pressure_now(), requested);
    nd_pacer_decision decision = nd_pacer_decide(&rt->policy, st, &event);
    if (decision.action >= ND_PACER_SCOPED) pressure_run(rt, dev, &event, &decision);
}

void pressure_collect_generation(int generation) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *result = gc ? PyObject_CallMethod(gc, "collect", "i", generation) : NULL;
    if (result != NULL) collection_log_note(generation, PyLong_AsSsize_t(result));
    Py_XDECREF(result);
    Py_XDECREF(gc);
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    PyErr_Restore(type, value, traceback);
}

Py_ssize_t pressure_collect_user_scoped(scoped_result *r) {
    /* Refused (busy or unsupported): nothing runs, nothing is recorded. */
    int owned =
        scoped_supported() && !scoped_busy() ? collection_log_begin(NULL, COLLECTION_USER) : 0;
    Py_ssize_t collected = scoped_collect(r);
    if (collected >= 0) collection_log_note(-1, collected);
    collection_log_end(owned);
    return collected;
}

void pressure_safe_point(void) {
    pressure_runtime *rt = &runtime;
    if (!rt->policy.enabled || pressure_other_thread_collecting(rt)) return;
    double now = pressure_now();
    int count = nd_device_count();
    for (int id = 0; id < count && id < ND_MAX_DEVICES; id++) {
        nd_device *dev = nd_device_at(id);
        if (dev == NULL) continue;
        nd_pacer_event event = pressure_event(rt, dev, ND_PACER_SAFE_POINT, now, 0);
        nd_pacer_decision decision = nd_pacer_decide(&rt->policy, &rt->devices[id], &event);
        if (decision.action >= ND_PACER_SCOPED) pressure_run(rt, dev, &event, &decision);
    }
}

void pressure_install(void) {
    /* No safe point seen yet; the counters stay (the runtime is the
     * process's, as the engine's callback is, whatever initialises it). */
    for (int id = 0; id < ND_MAX_DEVICES; id++) runtime.devices[id].safe.baseline = -1;
    nd_memory_set_collect_callback(collect_for_engine, &runtime);
}

/* ------------------------------------------------- module functions */

static void refresh_all(void) {
    for (int id = 0; id < nd_device_count(); id++) pressure_refresh(nd_device_at(id));
}

static PyObject *set_gc_policy(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"enabled",         "growth",    "min_growth", "high_water",
                             "max_gc_fraction", "watermark", NULL};
    nd_gc_policy p = runtime.policy;
    long long min_growth = p.min_growth;
    PyObject *watermark = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$pdLddO:_set_gc_policy", kwlist, &p.enabled,
                                     &p.growth, &min_growth, &p.high_water, &p.max_gc_fraction,
                                     &watermark))
        return NULL;
    p.min_growth = min_growth;
    const char *invalid = nd_gc_policy_invalid(&p);
    if (invalid != NULL) {
        PyErr_SetString(PyExc_ValueError, invalid);
        return NULL;
    }
    if (watermark == Py_None) {
        p.watermark = -1;
        p.watermark_fraction = -1.0;
    } else if (watermark != NULL && PyFloat_Check(watermark)) {
        double fraction = PyFloat_AsDouble(watermark);
        if (!(fraction > 0.0 && fraction <= 1.0)) {
            PyErr_Format(PyExc_ValueError, "a fractional watermark must be in (0, 1], got %R",
                         watermark);
            return NULL;
        }
        p.watermark = -1;
        p.watermark_fraction = fraction;
    } else if (watermark != NULL) {
        long long bytes = PyLong_AsLongLong(watermark);
        if (bytes == -1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "a watermark of %R bytes is out of range",
                             watermark);
            }
            return NULL;
        }
        p.watermark = bytes < 0 ? -1 : bytes;
        p.watermark_fraction = -1.0;
    }
    runtime.policy = p;
    refresh_all();
    Py_RETURN_NONE;
}

/* A policy as the dict get_gc_policy returns (watermark: bytes, a fraction
 * of each device's budget, or None for the computed trigger). */
static PyObject *policy_dict(const nd_gc_policy *p) {
    PyObject *watermark = p->watermark >= 0           ? PyLong_FromLongLong(p->watermark)
                          : p->watermark_fraction > 0 ? PyFloat_FromDouble(p->watermark_fraction)
                                                      : Py_NewRef(Py_None);
    if (watermark == NULL) return NULL;
    return Py_BuildValue("{s:O,s:d,s:L,s:d,s:d,s:N}", "enabled", p->enabled ? Py_True : Py_False,
                         "growth", p->growth, "min_growth", (long long)p->min_growth, "high_water",
                         p->high_water, "max_gc_fraction", p->max_gc_fraction, "watermark",
                         watermark);
}

static PyObject *get_gc_policy(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return policy_dict(&runtime.policy);
}

static PyObject *gc_policy_defaults(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return policy_dict(&nd_gc_policy_default);
}

static PyObject *reset_pressure_stats(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_of_engine_id(arg);
    if (dev == NULL) return NULL;
    nd_pacer_state *st = state_of(&runtime, dev);
    if (st != NULL) nd_pacer_init(st);
    pressure_refresh(dev);
    Py_RETURN_NONE;
}

/* _set_pressure_clock(now): the pacer reads `now` (seconds > 0, never
 * earlier than the last one set) until the next call; None: the monotonic
 * clock again. */
static PyObject *set_pressure_clock(PyObject *module, PyObject *arg) {
    (void)module;
    if (arg == Py_None) {
        runtime.manual_clock = 0;
        Py_RETURN_NONE;
    }
    if (PyBool_Check(arg) || !(PyFloat_Check(arg) || PyLong_Check(arg))) {
        PyErr_Format(PyExc_TypeError,
                     "_set_pressure_clock: now must be a number or None, got %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (!(isfinite(now) && now > 0.0) || (runtime.manual_clock && now < runtime.manual_now)) {
        PyErr_Format(PyExc_ValueError,
                     "_set_pressure_clock: now must be finite, > 0 and not before the clock's "
                     "last value, got %R",
                     arg);
        return NULL;
    }
    runtime.manual_clock = 1;
    runtime.manual_now = now;
    Py_RETURN_NONE;
}

static PyObject *safe_point(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    pressure_safe_point();
    Py_RETURN_NONE;
}

PyMethodDef pressure_module_functions[] = {
    {"_gc_safe_point", safe_point, METH_NOARGS,
     "_gc_safe_point()\n--\n\nTells the pressure policy that a training step's old graph has "
     "probably just "
     "become garbage (Optimizer.reset_grad calls it); collects if allocations are past the "
     "trigger."},
    {"_set_gc_policy", (PyCFunction)(void (*)(void))set_gc_policy, METH_VARARGS | METH_KEYWORDS,
     "_set_gc_policy(*, enabled, growth, min_growth, high_water, max_gc_fraction, "
     "watermark)\n--\n\n"
     "Sets the pressure policy (omitted values are kept). watermark: bytes (int), a fraction "
     "(float in "
     "(0, 1]) of each device's budget, or None or -1 for the computed trigger."},
    {"_get_gc_policy", get_gc_policy, METH_NOARGS,
     "_get_gc_policy()\n--\n\nThe pressure policy as a dict."},
    {"_gc_policy_defaults", gc_policy_defaults, METH_NOARGS,
     "_gc_policy_defaults()\n--\n\nThe policy needle starts with, as a dict like "
     "_get_gc_policy()'s."},
    {"_set_pressure_clock", set_pressure_clock, METH_O,
     "_set_pressure_clock(now, /)\n--\n\nFor tests: the collection pacer reads now (seconds) as "
     "the time until the next call (None: the monotonic clock again), so that its decisions "
     "follow a test's steps, not the machine's load."},
    {"_reset_pressure_stats", reset_pressure_stats, METH_O,
     "_reset_pressure_stats(device_id, /)\n--\n\nZeroes the device's collection statistics."},
    {NULL, NULL, 0, NULL},
};
