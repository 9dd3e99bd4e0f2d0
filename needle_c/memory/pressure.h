/* pressure.h: what the collection runner (pressure.c) shares with the
 * aligned collections (alignment.c) and the statistics (stats.c): the
 * collector's one runtime struct and the way a decided collection is run.
 * The policy itself is csrc/gc_pacer.h; docs/design.md, "The collection
 * policy", says why it is what it is.
 */
#ifndef NEEDLE_C_MEMORY_PRESSURE_H
#define NEEDLE_C_MEMORY_PRESSURE_H

#include "needle_c.h"

#include "gc_pacer.h"

/* The collector's process-wide state, all of it: the engine's collection
 * callback is process-wide, as Python's collector is. Read and written with
 * the GIL held. */
typedef struct pressure_runtime {
    nd_gc_policy policy;
    nd_pacer_state devices[ND_MAX_DEVICES];
    /* The thread running a collection for needle (0: none). The engine keeps
     * a thread's own allocations from starting another collection
     * (allocator.c); this keeps other threads from starting one while it
     * runs, which would do nothing (Python collects in one thread at a time)
     * and fail their allocation for nothing. */
    unsigned long collector_thread;
    /* Aligned collections (alignment.c): on or off; the seconds the last
     * aligned collections took, until reported. */
    int aligned;
    double aligned_unreported_seconds;
    /* A test's clock (_set_pressure_clock): when manual_clock is set the
     * pacer's now is manual_now, so that its decisions follow the steps a
     * test takes rather than how busy the machine is. */
    int manual_clock;
    double manual_now;
} pressure_runtime;

pressure_runtime *pressure_runtime_get(void);
/* Seconds on the monotonic clock, or the test's clock when one is set: the
 * pacer's `now`. */
double pressure_now(void);
int64_t pressure_allocated(const nd_device *dev);
/* Another thread is running needle's collection. */
int pressure_other_thread_collecting(const pressure_runtime *rt);
/* The pacer's event for dev now, with what the runner reads (budget,
 * gc.isenabled(), the scoped collection's availability). */
nd_pacer_event pressure_event(const pressure_runtime *rt, const nd_device *dev,
                              nd_pacer_event_kind kind, double now, int64_t requested);
/* Runs the collection the pacer decided on dev (a ladder or a full one) and
 * hands what it did back to the pacer; sets dev's new trigger. */
void pressure_run(pressure_runtime *rt, nd_device *dev, const nd_pacer_event *event,
                  const nd_pacer_decision *decision);
/* Runs gc.collect(generation) with the caller's exception kept aside (a step
 * of the open collection record: collection_log.h). */
void pressure_collect_generation(int generation);
/* needle.memory.collect(scope="needle"): the scoped collection now, recorded
 * as the user's; scoped_collect's result. */
Py_ssize_t pressure_collect_user_scoped(scoped_result *r);
/* The device's pacer state (its counters: memory_stats), or NULL. */
const nd_pacer_state *pressure_device_state(const nd_device *dev);

#endif /* NEEDLE_C_MEMORY_PRESSURE_H */
