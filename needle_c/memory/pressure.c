/* pressure.c: when to run Python's collector for device memory (the policy
 * of docs/design.md, "The memory policy"), registered as the
 * engine's collection callback.
 *
 * Trigger: collect before an allocation that would take allocated bytes
 * past max(survivors * (1 + growth), survivors + min_growth), capped at
 * high_water * budget, where survivors is what was allocated right after
 * the last pressure collection and budget is the device limit (or a CUDA
 * device's capacity). A fixed watermark replaces the computed trigger. The
 * CPU without a limit has no budget, hence no pressure collections.
 * Pacing: a collection that took d seconds is followed by at least
 * d / fraction - d seconds without one (fraction: max_gc_fraction, 0.5 near
 * the budget), so the collector's share of wall time stays bounded. A
 * collection that frees almost nothing doubles a cooldown (a time without
 * soft collections, up to a second), so a legitimately large live set does
 * not cause a collection per allocation. The cooldown is time, not bytes:
 * garbage often appears just after a useless collection (a training step
 * drops the previous step's graph when it resets gradients), and a trigger
 * pushed up by a byte cooldown would let it pile up.
 * Safe points: the moment a training step's previous graph becomes garbage
 * is known. Optimizer.reset_grad() drops the gradients that pin it and
 * Tensor.backward() follows; both call pressure_safe_point(), which collects
 * when allocated bytes are past the trigger computed from the live set seen
 * at safe points (a forward pass's transients, which the allocation path's
 * survivors may include, would push it too high). A byte trigger alone
 * cannot find that moment: the forward pass climbs higher than the backward
 * pass while holding no garbage, so a trigger low enough to fire in backward
 * also fires, uselessly, in forward (two full collections a step instead of
 * one). So while safe points keep coming (within twice their usual
 * interval) and the last collection at one was not useless, the allocation
 * path defers until high_water * budget; when they stop (an evaluation
 * loop, a loop without backward) the plain trigger applies again. A useful
 * collection on the allocation path re-arms them: the first safe points of
 * a run come before any graph is garbage, and their useless collections
 * must not leave the garbage of every later step to the allocation path.
 * The soft path honours gc.disable(); the out-of-memory path does not.
 * enabled=False turns both off (how the course's leak is reproduced).
 *
 * The ladder (every collection above): a scoped collection first
 * (scoped.c: needle's own objects, cost proportional to the graph); a full
 * collection only when the scoped one freed less than the pressure asked
 * for. On the soft path (allocation path and safe points) that is the bytes
 * above high_water * budget, or above the fixed watermark when one is set:
 * the computed trigger only paces the cheap scoped step. A full collection
 * costs the whole heap (30-140 ms in a Jupyter kernel, several GPU steps),
 * and below high water nothing says it would free anything: a forward pass
 * climbs past the trigger holding no garbage, a first step's live set grows
 * with no garbage at all, and a training step's garbage (the previous graph)
 * is needle's own, which the scoped step frees. Garbage held by cycles
 * through other objects waits for real pressure (high water), the
 * out-of-memory path or Python's own collections. On the out-of-memory
 * path, the ladder asks for the requested bytes (then the allocation fits
 * under a limit). A full fallback that frees almost nothing (under 1% of
 * what is allocated: the garbage was not there) makes the next soft
 * fallbacks wait: the next 1, 2, 4, ... up to 64 soft ladders run the
 * scoped step alone, so that a live set held above high water does not pay
 * a full collection at every ladder; a useful fallback ends the back-off,
 * and the one fallback in every 64 that still runs is the backstop for
 * cycles through other objects.
 * The out-of-memory path always falls back. A scoped collection that cannot
 * run (a free-threaded build) means a full one; one refused because a
 * collection is already running means none. The full collection on the out-of-memory path runs after
 * gc.unfreeze(); the engine then releases cached blocks and retries.
 *
 * Aligned collections (needle.distributed; python/needle/memory/alignment.py):
 * in data-parallel training every step ends in an all-reduce that waits for
 * the slowest rank, so a collection on one rank stalls all of them, and
 * independent collectors add their stalls up. With alignment on, a soft
 * collection that would run (allocation path or safe point, past every
 * check above) only records a want; the want travels with the next gradient
 * all-reduce, and when any rank wanted one, every rank runs the ladder right
 * after that all-reduce (run_aligned: the same point of the same step
 * everywhere; the previous step's graph is garbage there, and collecting
 * before the next forward pass keeps the peak down), unpaced, since all
 * ranks agreed. Python's own generational collections are driven the same
 * way (alignment.py disables the automatic ones and asks for a generation
 * here; a generation alone runs without the ladder). Full collections then
 * go through gc.collect(), which the disabled collector does not stop, as
 * PyGC_Collect() would. The out-of-memory path stays local: a rank that
 * cannot allocate collects at once.
 */
#include "needle_c.h"

#include <math.h>
#include <time.h>

typedef struct gc_policy {
    int enabled;
    double growth;
    int64_t min_growth;
    double high_water;
    double max_gc_fraction;
    int64_t watermark;         /* bytes; -1: none */
    double watermark_fraction; /* of each device's budget; -1: none */
} gc_policy;

typedef struct device_pressure {
    int64_t survivors;
    double cooldown_seconds, cooldown_until;
    double last_end, last_duration;
    int last_freed_little;
    /* Whether the last collection's ladder ran a full collection. */
    int last_ran_full;
    /* Safe points: when the last one came, the usual gap between them, and
     * whether the last collection at one freed almost nothing. */
    double last_safe_point, safe_point_interval;
    int safe_point_useless;
    /* The live set at safe points: what the last collection at one left, or
     * the lowest level seen at one since (-1: none yet; then it starts from
     * the allocation path's survivors). The allocation-path
     * survivors can include a forward pass's transients; this cannot. */
    int64_t safe_baseline;
    int64_t pressure_collections, oom_collections, skipped, freed_bytes;
    int64_t safe_point_collections, deferred;
    double seconds;
    /* The ladder: scoped collections, what they examined and freed, and the
     * full collections (of which fallbacks after a scoped one). */
    int64_t scoped_collections, scoped_examined, scoped_freed_bytes;
    int64_t full_collections, full_fallbacks, fallbacks_skipped;
    double scoped_seconds;
    /* The fallback back-off: useless fallbacks in a row, and how many soft
     * ladders are still to run without one. */
    int useless_fallbacks, fallback_skips_left;
    /* Alignment: a soft collection is wanted (and since when), the wants
     * recorded, all-reduce rounds they waited, aligned ladders run here. */
    int wants;
    double want_since;
    int64_t aligned_wants, aligned_rounds_waited, aligned_collections;
} device_pressure;

enum { MAX_FALLBACK_SKIPS = 64 };

/* The policy's defaults: the one place they are written down. The
 * environment (NEEDLE_GC, NEEDLE_GC_GROWTH, ...) is parsed beside the
 * Python policy functions (python/needle/memory/policy.py, which reads these
 * through _gc_policy_defaults()), because its sizes ("64MiB", "50%") use
 * needle.memory.parse_size. */
static const gc_policy default_policy = {
    .enabled = 1,
    .growth = 0.25,
    .min_growth = (int64_t)64 << 20,
    .high_water = 0.8,
    .max_gc_fraction = 0.05,
    .watermark = -1,
    .watermark_fraction = -1.0,
};
static gc_policy policy = default_policy;
static device_pressure pressure[ND_MAX_DEVICES];

/* Alignment (the header): on or off; the seconds the last aligned
 * collections took, until reported. */
static int aligned = 0;
static double aligned_unreported_seconds = 0.0;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t allocated_of(const nd_device *dev) {
    nd_memory_stats s;
    nd_memory_get_stats(dev, &s);
    return s.allocated_current;
}

/* The bytes a device may use before collections are due; -1 when unknown. */
static int64_t budget_of(const nd_device *dev) {
    int64_t limit = nd_memory_get_limit(dev);
    if (limit >= 0) return limit;
    if (nd_device_get_kind(dev) == ND_DEVICE_CUDA) return nd_device_capacity(dev);
    return -1;
}

/* high_water * budget: where soft collections stop waiting; -1 without a budget. */
static int64_t cap_of(const nd_device *dev) {
    int64_t budget = budget_of(dev);
    return budget < 0 ? -1 : (int64_t)(policy.high_water * (double)budget);
}

/* Whether a fixed watermark replaces the computed trigger. */
static int watermark_set(void) { return policy.watermark >= 0 || policy.watermark_fraction > 0.0; }

/* The fixed watermark on dev: bytes, or a fraction of dev's own budget (-1
 * on a device without one). */
static int64_t watermark_of(const nd_device *dev) {
    if (policy.watermark >= 0) return policy.watermark;
    int64_t budget = budget_of(dev);
    return budget < 0 ? -1 : (int64_t)(policy.watermark_fraction * (double)budget);
}

/* The trigger for a live set of `survivors` bytes; -1 for none. */
static int64_t next_trigger(const nd_device *dev, int64_t survivors) {
    if (!policy.enabled) return -1;
    if (watermark_set()) return watermark_of(dev);
    int64_t cap = cap_of(dev);
    if (cap < 0) return -1;
    double grown = (double)survivors * (1.0 + policy.growth);
    double stepped = (double)survivors + (double)policy.min_growth;
    double t = grown > stepped ? grown : stepped;
    return t < (double)cap ? (int64_t)t : cap;
}

void pressure_refresh(nd_device *dev) {
    int id = nd_device_id(dev);
    if (id < 0 || id >= ND_MAX_DEVICES) return;
    device_pressure *ps = &pressure[id];
    int64_t allocated = allocated_of(dev);
    ps->survivors = allocated;
    ps->cooldown_seconds = 0.0;
    ps->cooldown_until = 0.0;
    ps->safe_point_useless = 0;
    ps->safe_baseline = -1;
    nd_memory_set_trigger(dev, next_trigger(dev, allocated));
}

/* The thread running a collection for needle (0: none); read and written
 * with the GIL held. The engine keeps a thread's own allocations from
 * starting another collection (allocator.c); this keeps other threads from
 * starting one while it runs, which would do nothing (Python collects in one
 * thread at a time) and fail their allocation for nothing. */
static unsigned long collector_thread = 0;

/* Another thread is collecting: wait, with the GIL released, until it is done
 * (or a minute has passed), so that the caller's allocation is retried on
 * what the collection freed. */
static void wait_for_collector(void) {
    double deadline = now_seconds() + 60.0;
    while (collector_thread != 0 && now_seconds() < deadline) {
        Py_BEGIN_ALLOW_THREADS struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
        Py_END_ALLOW_THREADS
    }
}

static int other_thread_collecting(void) {
    return collector_thread != 0 && collector_thread != PyThread_get_thread_ident();
}

/* Runs a full collection. The OOM path goes through gc.collect(), which
 * ignores gc.disable(), after gc.unfreeze(): objects frozen by
 * needle.memory.freeze_heap() (or anyone's gc.freeze()) are invisible to
 * collections, and frozen cycles holding device memory must not cause an
 * out-of-memory error. They stay unfrozen afterwards. Under alignment the
 * soft path's full collections go through gc.collect() too (the header). */
static void run_full_collection(nd_collect_reason reason) {
    if (reason == ND_COLLECT_PRESSURE && !aligned) {
        PyGC_Collect();
        return;
    }
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *thawed = gc == NULL                      ? NULL
                       : reason == ND_COLLECT_PRESSURE ? Py_NewRef(Py_None)
                                                       : PyObject_CallMethod(gc, "unfreeze", NULL);
    PyObject *result = thawed ? PyObject_CallMethod(gc, "collect", NULL) : NULL;
    Py_XDECREF(result);
    Py_XDECREF(thawed);
    Py_XDECREF(gc);
}

/* After a fallback that freed `freed` bytes out of `before`: end the
 * back-off, or double it (the header's fallback back-off). */
static void note_fallback(device_pressure *ps, int64_t freed, int64_t before) {
    if (freed * 100 >= before) {
        ps->useless_fallbacks = 0;
        ps->fallback_skips_left = 0;
        return;
    }
    if (ps->useless_fallbacks < 30) ps->useless_fallbacks++;
    int64_t skips = (int64_t)1 << (ps->useless_fallbacks - 1);
    ps->fallback_skips_left = (int)(skips < MAX_FALLBACK_SKIPS ? skips : MAX_FALLBACK_SKIPS);
}

/* The ladder of the header comment for dev: scoped, then full when the
 * scoped one freed less than `asked` bytes (unless backed off). */
static void run_ladder(nd_device *dev, device_pressure *ps, nd_collect_reason reason,
                       int64_t before, int64_t asked) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    unsigned long previous = collector_thread;
    collector_thread = PyThread_get_thread_ident();
    scoped_result r;
    int full = 1, fallback = 0;
    if (scoped_collect(&r) >= 0) {
        int64_t after = allocated_of(dev);
        int64_t freed = before > after ? before - after : 0;
        ps->scoped_collections++;
        ps->scoped_examined += r.examined;
        ps->scoped_seconds += r.seconds;
        ps->scoped_freed_bytes += freed;
        full = fallback = freed < asked;
        if (fallback && reason == ND_COLLECT_PRESSURE && ps->fallback_skips_left > 0) {
            ps->fallback_skips_left--;
            ps->fallbacks_skipped++;
            full = fallback = 0;
        }
        if (fallback) ps->full_fallbacks++;
    } else if (r.refused == SCOPED_BUSY) {
        full = 0; /* a collection is running (this is code it ran) */
    }
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    if (full) {
        int64_t mid = allocated_of(dev);
        run_full_collection(reason);
        ps->full_collections++;
        int64_t after = allocated_of(dev);
        if (fallback) note_fallback(ps, mid > after ? mid - after : 0, mid);
    }
    ps->last_ran_full = full;
    collector_thread = previous;
    /* A finalizer's exception must not surface inside an unrelated op. */
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    PyErr_Restore(type, value, traceback);
}

/* Safe points are steering collections: they keep coming (the next is not
 * overdue) and the last collection at one was not useless. */
static int safe_points_active(const device_pressure *ps, double now) {
    return !ps->safe_point_useless && ps->last_safe_point > 0.0 &&
           now - ps->last_safe_point <= 2.0 * ps->safe_point_interval + 0.01;
}

/* What a soft collection at `level` bytes (a request included) asks its
 * ladder for (the header): the bytes above the fixed watermark, or else
 * above high_water * budget. */
static int64_t soft_path_asked(const nd_device *dev, int64_t level) {
    int64_t mark = watermark_set() ? watermark_of(dev) : cap_of(dev);
    return mark < 0 ? 0 : level - mark;
}

/* Pacing and back-off for the soft path; 1 when a collection may run now.
 * A safe point is not held back by useless collections before it (neither
 * their back-off nor their pacing): garbage is likeliest there, and a
 * useless collection at a safe point raises its trigger to the live set,
 * which stops the next ones. Nor is the first ladder that would run a full
 * collection (asked > 0, no back-off left) after ladders that did not: the
 * cooldown they earned says nothing about garbage that only a full
 * collection frees (cycles through other objects, piling up to high water). */
static int soft_collection_allowed(const nd_device *dev, device_pressure *ps, int64_t before,
                                   int64_t requested, double now, int at_safe_point,
                                   int64_t asked) {
    /* Under alignment the automatic collector is off by alignment.py's hand. */
    if (!aligned && !PyGC_IsEnabled()) return 0;
    int64_t budget = budget_of(dev);
    double fraction = policy.max_gc_fraction;
    if (budget > 0 && (double)(before + requested) > 0.9 * (double)budget) fraction = 0.5;
    if (at_safe_point && ps->last_freed_little) return 1;
    if (asked > 0 && !ps->last_ran_full && ps->fallback_skips_left == 0) return 1;
    if (ps->last_duration > 0.0 && now - ps->last_end < ps->last_duration * (1.0 / fraction - 1.0))
        return 0;
    return at_safe_point || now >= ps->cooldown_until;
}

/* Runs one collection for dev and updates its figures and trigger. */
static void collect_and_account(nd_device *dev, device_pressure *ps, nd_collect_reason reason,
                                double start, int64_t before, int64_t asked) {
    run_ladder(dev, ps, reason, before, asked);
    double end = now_seconds();
    int64_t after = allocated_of(dev);
    int64_t freed = before > after ? before - after : 0;
    ps->seconds += end - start;
    ps->freed_bytes += freed;
    ps->last_end = end;
    ps->last_duration = end - start;
    if (reason == ND_COLLECT_PRESSURE) ps->pressure_collections++;
    else ps->oom_collections++;
    ps->last_freed_little = freed * 100 < before;
    /* Almost nothing freed: the live set is real; wait longer next time. */
    if (reason == ND_COLLECT_PRESSURE && ps->last_freed_little) {
        double base = ps->last_duration * (1.0 / policy.max_gc_fraction - 1.0);
        if (base < 0.001) base = 0.001;
        ps->cooldown_seconds = ps->cooldown_seconds > 0.0 ? ps->cooldown_seconds * 2.0 : base;
        if (ps->cooldown_seconds > 1.0) ps->cooldown_seconds = 1.0;
        ps->cooldown_until = end + ps->cooldown_seconds;
    } else {
        ps->cooldown_seconds = 0.0;
        ps->cooldown_until = 0.0;
    }
    ps->survivors = after;
    nd_memory_set_trigger(dev, next_trigger(dev, after));
}

/* Alignment: a soft collection is due here; it waits for every rank. */
static void record_want(device_pressure *ps, double now) {
    if (ps->wants) return;
    ps->wants = 1;
    ps->want_since = now;
    ps->aligned_wants++;
}

static void collect_for_engine(void *ctx, nd_device *dev, int64_t requested,
                               nd_collect_reason reason) {
    (void)ctx;
    int id = nd_device_id(dev);
    if (!policy.enabled || id < 0 || id >= ND_MAX_DEVICES) return;
    if (other_thread_collecting()) {
        /* Out of memory: what that collection frees may be enough; the soft
         * path just lets it finish. */
        if (reason == ND_COLLECT_OOM) wait_for_collector();
        return;
    }
    device_pressure *ps = &pressure[id];
    double start = now_seconds();
    int64_t before = allocated_of(dev);
    int64_t asked = requested;
    if (reason == ND_COLLECT_PRESSURE) {
        asked = soft_path_asked(dev, before + requested);
        int64_t cap = cap_of(dev);
        if (!watermark_set() && safe_points_active(ps, start) && cap >= 0 &&
            before + requested <= cap) {
            ps->deferred++;
            return;
        }
        if (!soft_collection_allowed(dev, ps, before, requested, start, 0, asked)) {
            ps->skipped++;
            return;
        }
        if (aligned) {
            record_want(ps, start);
            return;
        }
    }
    collect_and_account(dev, ps, reason, start, before, asked);
    /* Garbage found between safe points (the first ones, with no graph yet
     * to free, were useless): hand the next collections back to them. */
    if (reason == ND_COLLECT_PRESSURE && !ps->last_freed_little) ps->safe_point_useless = 0;
}

/* Runs gc.collect(generation) with the caller's exception kept aside. */
static void collect_generation(int generation) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *result = gc ? PyObject_CallMethod(gc, "collect", "i", generation) : NULL;
    Py_XDECREF(result);
    Py_XDECREF(gc);
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    PyErr_Restore(type, value, traceback);
}

/* The aligned collection every rank agreed on, run by each of them, wanted or
 * not (that is the alignment): with `ladder`, the ladder on the device that
 * wanted it (else the one that asks the most; one scoped collection covers
 * every device's graph); then the agreed Python generation (-1: none) unless
 * the ladder ran a full collection. */
static void run_aligned_collection(int ladder, int generation) {
    double start = now_seconds();
    int ran_full = 0;
    if (ladder) {
        nd_device *chosen = NULL;
        int64_t most = -1;
        int chosen_wants = 0;
        for (int id = 0; id < nd_device_count() && id < ND_MAX_DEVICES; id++) {
            nd_device *dev = nd_device_at(id);
            if (dev == NULL) continue;
            int64_t asked = soft_path_asked(dev, allocated_of(dev));
            if (asked < 0) asked = 0; /* below high water asks nothing, like no budget */
            int wants = pressure[id].wants;
            /* A device that wanted it first, then the one that asks the most. */
            if (chosen == NULL || wants > chosen_wants || (wants == chosen_wants && asked > most)) {
                chosen = dev;
                most = asked;
                chosen_wants = wants;
            }
            pressure[id].wants = 0;
        }
        if (chosen != NULL) {
            device_pressure *ps = &pressure[nd_device_id(chosen)];
            collect_and_account(chosen, ps, ND_COLLECT_PRESSURE, start, allocated_of(chosen), most);
            ps->aligned_collections++;
            ran_full = ps->last_ran_full;
        }
    }
    if (generation >= 0 && !ran_full) collect_generation(generation);
    aligned_unreported_seconds += now_seconds() - start;
}

void pressure_safe_point(void) {
    if (!policy.enabled || watermark_set() || other_thread_collecting()) return;
    double now = now_seconds();
    int count = nd_device_count();
    for (int id = 0; id < count && id < ND_MAX_DEVICES; id++) {
        nd_device *dev = nd_device_at(id);
        device_pressure *ps = &pressure[id];
        if (dev == NULL || budget_of(dev) < 0) continue;
        /* The usual gap follows the longest recent one (a step), not the
         * short one between reset_grad() and backward(). */
        if (ps->last_safe_point > 0.0) {
            double gap = now - ps->last_safe_point;
            double decayed = ps->safe_point_interval * 0.9;
            ps->safe_point_interval = gap > decayed ? gap : decayed;
        }
        ps->last_safe_point = now;
        int64_t before = allocated_of(dev);
        if (ps->safe_baseline < 0) ps->safe_baseline = ps->survivors;
        if (before < ps->safe_baseline) ps->safe_baseline = before;
        int64_t trigger = next_trigger(dev, ps->safe_baseline);
        if (trigger < 0 || before <= trigger) continue;
        int64_t asked = soft_path_asked(dev, before);
        if (!soft_collection_allowed(dev, ps, before, 0, now, 1, asked)) {
            ps->skipped++;
            continue;
        }
        if (aligned) {
            record_want(ps, now);
            continue;
        }
        collect_and_account(dev, ps, ND_COLLECT_PRESSURE, now, before, asked);
        ps->safe_point_collections++;
        ps->safe_point_useless = ps->last_freed_little;
        ps->safe_baseline = ps->survivors;
    }
}

void pressure_install(void) {
    for (int id = 0; id < ND_MAX_DEVICES; id++) pressure[id].safe_baseline = -1;
    nd_memory_set_collect_callback(collect_for_engine, NULL);
}

/* The collection figures of memory_stats(), all from the one set of counters
 * above (collect_and_account updates them for every collection needle runs:
 * allocation path and safe points):
 *   num_pressure_collections  soft collections (of which num_safe_point_collections at safe points)
 *   num_oom_collections       collections on the out-of-memory path
 *   num_collect_calls         both of them: every collection run for this device
 *   num_pressure_skips        soft collections that pacing or back-off skipped
 *   num_pressure_deferrals    soft collections left to the next safe point
 *   gc_seconds                time spent in them
 *   gc_freed_bytes            allocated bytes on this device that dropped during them
 *   collect_freed_bytes       the same figure, under its older name
 *   gc_survivor_bytes         allocated bytes after the last one
 * Each of them runs the ladder; its steps:
 *   num_scoped_collections    scoped collections run (scoped.c)
 *   scoped_gc_seconds         their time (part of gc_seconds)
 *   scoped_objects_examined   needle objects they examined
 *   scoped_freed_bytes        allocated bytes that dropped during them
 *   num_full_collections      full collections run (gc.collect)
 *   num_full_fallbacks        of which after a scoped one that freed too little
 *   num_fallbacks_skipped     fallbacks the back-off skipped (the header)
 * Alignment (the header):
 *   num_aligned_wants         soft collections turned into wants
 *   aligned_rounds_waited     all-reduce rounds those wants waited for (one each when every
 *                             step carries them)
 *   num_aligned_collections   aligned collections run with this device's ladder */
int pressure_add_stats(const nd_device *dev, PyObject *dict) {
    int id = nd_device_id(dev);
    device_pressure empty = {0};
    const device_pressure *ps = id >= 0 && id < ND_MAX_DEVICES ? &pressure[id] : &empty;
    struct {
        const char *key;
        PyObject *value;
    } items[] = {
        {"num_pressure_collections", PyLong_FromLongLong(ps->pressure_collections)},
        {"num_oom_collections", PyLong_FromLongLong(ps->oom_collections)},
        {"num_collect_calls", PyLong_FromLongLong(ps->pressure_collections + ps->oom_collections)},
        {"num_pressure_skips", PyLong_FromLongLong(ps->skipped)},
        {"num_safe_point_collections", PyLong_FromLongLong(ps->safe_point_collections)},
        {"num_pressure_deferrals", PyLong_FromLongLong(ps->deferred)},
        {"gc_seconds", PyFloat_FromDouble(ps->seconds)},
        {"gc_freed_bytes", PyLong_FromLongLong(ps->freed_bytes)},
        {"collect_freed_bytes", PyLong_FromLongLong(ps->freed_bytes)},
        {"gc_survivor_bytes", PyLong_FromLongLong(ps->survivors)},
        {"num_scoped_collections", PyLong_FromLongLong(ps->scoped_collections)},
        {"scoped_gc_seconds", PyFloat_FromDouble(ps->scoped_seconds)},
        {"scoped_objects_examined", PyLong_FromLongLong(ps->scoped_examined)},
        {"scoped_freed_bytes", PyLong_FromLongLong(ps->scoped_freed_bytes)},
        {"num_full_collections", PyLong_FromLongLong(ps->full_collections)},
        {"num_full_fallbacks", PyLong_FromLongLong(ps->full_fallbacks)},
        {"num_fallbacks_skipped", PyLong_FromLongLong(ps->fallbacks_skipped)},
        {"num_aligned_wants", PyLong_FromLongLong(ps->aligned_wants)},
        {"aligned_rounds_waited", PyLong_FromLongLong(ps->aligned_rounds_waited)},
        {"num_aligned_collections", PyLong_FromLongLong(ps->aligned_collections)},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        if (rc == 0 && (items[i].value == NULL ||
                        PyDict_SetItemString(dict, items[i].key, items[i].value) < 0))
            rc = -1;
        Py_XDECREF(items[i].value);
    }
    return rc;
}

/* ------------------------------------------------- module functions */

static void refresh_all(void) {
    for (int id = 0; id < nd_device_count(); id++) pressure_refresh(nd_device_at(id));
}

static PyObject *set_gc_policy(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"enabled",         "growth",    "min_growth", "high_water",
                             "max_gc_fraction", "watermark", NULL};
    gc_policy p = policy;
    long long min_growth = p.min_growth;
    PyObject *watermark = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$pdLddO:_set_gc_policy", kwlist, &p.enabled,
                                     &p.growth, &min_growth, &p.high_water, &p.max_gc_fraction,
                                     &watermark))
        return NULL;
    /* Written so that NaN fails every test (isfinite for growth). */
    if (!(isfinite(p.growth) && p.growth >= 0.0) || min_growth < 0 ||
        !(p.high_water > 0.0 && p.high_water <= 1.0) ||
        !(p.max_gc_fraction > 0.0 && p.max_gc_fraction <= 0.5)) {
        PyErr_SetString(PyExc_ValueError,
                        "gc policy: need growth >= 0, min_growth >= 0, 0 < high_water <= 1 "
                        "and 0 < max_gc_fraction <= 0.5");
        return NULL;
    }
    p.min_growth = min_growth;
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
    policy = p;
    refresh_all();
    Py_RETURN_NONE;
}

/* A policy as the dict get_gc_policy returns (watermark: bytes, a fraction
 * of each device's budget, or None for the computed trigger). */
static PyObject *policy_dict(const gc_policy *p) {
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
    return policy_dict(&policy);
}

static PyObject *gc_policy_defaults(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return policy_dict(&default_policy);
}

static PyObject *reset_pressure_stats(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = memory_device_arg(arg);
    if (dev == NULL) return NULL;
    int id = nd_device_id(dev);
    memset(&pressure[id], 0, sizeof pressure[id]);
    pressure_refresh(dev);
    Py_RETURN_NONE;
}

static PyObject *safe_point(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    pressure_safe_point();
    Py_RETURN_NONE;
}

static PyObject *set_collection_alignment(PyObject *module, PyObject *arg) {
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    int previous = aligned;
    aligned = on;
    if (!on) {
        /* Back to local collections: pending wants fall to the next trigger. */
        for (int id = 0; id < ND_MAX_DEVICES; id++) pressure[id].wants = 0;
    }
    return PyBool_FromLong(previous);
}

/* This round's wants: whether any device wants a collection, and the seconds
 * the aligned collections took since the last call (then zeroed). Called once
 * per all-reduce round: each pending want waited one more. */
static PyObject *collection_wants(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    int wanted = 0;
    for (int id = 0; id < ND_MAX_DEVICES; id++) {
        if (!pressure[id].wants) continue;
        wanted = 1;
        pressure[id].aligned_rounds_waited++;
    }
    double seconds = aligned_unreported_seconds;
    aligned_unreported_seconds = 0.0;
    return Py_BuildValue("(Od)", wanted ? Py_True : Py_False, seconds);
}

static PyObject *run_aligned(PyObject *module, PyObject *args) {
    (void)module;
    int ladder, generation;
    if (!PyArg_ParseTuple(args, "pi:_run_aligned_collection", &ladder, &generation)) return NULL;
    if (generation < -1 || generation > 2) {
        PyErr_Format(PyExc_ValueError, "generation must be -1 (none), 0, 1 or 2, got %d",
                     generation);
        return NULL;
    }
    if (!aligned) {
        PyErr_SetString(PyExc_RuntimeError, "an aligned collection needs alignment on "
                                            "(needle.memory.alignment.enable(True))");
        return NULL;
    }
    /* Another thread's collection is running: it is this rank's collection. */
    if (!other_thread_collecting()) run_aligned_collection(ladder, generation);
    Py_RETURN_NONE;
}

PyMethodDef pressure_module_functions[] = {
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
    {"_reset_pressure_stats", reset_pressure_stats, METH_O,
     "_reset_pressure_stats(device_id, /)\n--\n\nZeroes the device's collection statistics."},
    {NULL, NULL, 0, NULL},
};
