/* allocator.c: per-device memory accounting, limits, and the path an
 * allocation takes when memory is short.
 *
 * Mechanism only: when to collect is the host's policy, expressed by the
 * trigger it sets and the callback it registers. An allocation may call the
 * callback (so callers must hold their own references across any call that
 * allocates); freeing never calls anything, so it is safe during collections.
 */
#include "internal.h"

#include <string.h>

static nd_collect_fn collect_fn = NULL;
static void *collect_ctx = NULL;
/* This thread is inside a collection: its allocations (a finalizer's) never
 * start another. Per thread: another thread that runs short meanwhile still
 * calls back, and the host decides (it waits for the running collection). */
static _Thread_local int collecting = 0;
static _Thread_local nd_oom_info last_oom = {-1, 0, 0, 0, -1, 0, 0};
/* What the last out-of-memory ladder on this thread (nd_memory_retry)
 * collected: set as the ladder ends, after any nested ladder a finalizer's
 * allocation ran inside its collection, so the caller reads its own. */
static _Thread_local int64_t ladder_collected = 0;

void nd_memory_set_collect_callback(nd_collect_fn fn, void *ctx) {
    collect_fn = fn;
    collect_ctx = ctx;
}

int nd_memory_collecting(void) { return collecting; }

void nd_memory_set_trigger(nd_device *dev, int64_t trigger) {
    dev->alloc.stats.trigger = trigger < 0 ? -1 : trigger;
}

void nd_memory_set_limit(nd_device *dev, int64_t limit) {
    dev->alloc.stats.limit = limit < 0 ? -1 : limit;
}

int64_t nd_memory_get_limit(const nd_device *dev) { return dev->alloc.stats.limit; }

int64_t nd_device_budget(const nd_device *dev) {
    if (dev->alloc.stats.limit >= 0) return dev->alloc.stats.limit;
    if (dev->kind == ND_DEVICE_CUDA && dev->capacity > 0) return dev->capacity;
    return -1;
}

void nd_memory_get_stats(const nd_device *dev, nd_memory_stats *out) { *out = dev->alloc.stats; }

void nd_memory_reset_peaks(nd_device *dev) {
    nd_memory_stats *st = &dev->alloc.stats;
    st->allocated_peak = st->allocated_current;
    st->reserved_peak = st->reserved_current;
    st->blocks_peak = st->blocks_current;
    nd_memory_stat *fragmentation[] = {&st->segment,
                                       &st->active,
                                       &st->active_bytes,
                                       &st->inactive_split,
                                       &st->inactive_split_bytes,
                                       &st->oversize_allocations,
                                       &st->oversize_segments};
    for (size_t i = 0; i < sizeof fragmentation / sizeof *fragmentation; i++)
        fragmentation[i]->peak = fragmentation[i]->current;
}

int64_t nd_memory_window_peak(nd_device *dev) {
    nd_memory_stats *st = &dev->alloc.stats;
    int64_t peak = st->allocated_window_peak;
    st->allocated_window_peak = st->allocated_current;
    return peak;
}

void nd_memory_stat_update(nd_memory_stat *stat, int64_t n) {
    stat->current += n;
    if (n > 0) stat->allocated += n;
    else stat->freed -= n;
    if (stat->current > stat->peak) stat->peak = stat->current;
}

int nd_memory_oversize(const nd_device *dev, int64_t size) {
    int64_t max_split = dev->alloc.settings.max_split_size;
    return max_split > 0 && size >= max_split;
}

nd_status nd_memory_set_settings(nd_device *dev, const nd_alloc_settings *s) {
    if (s->max_split_size > 0 && s->max_split_size <= ND_OVERSIZE_SLACK)
        return nd_fail(ND_ERR_VALUE, "max_split_size must be more than %lld bytes, got %lld",
                       (long long)ND_OVERSIZE_SLACK, (long long)s->max_split_size);
    if (!(s->gc_threshold >= 0.0 && s->gc_threshold < 1.0))
        return nd_fail(ND_ERR_VALUE, "garbage_collection_threshold must be in (0, 1), got %g",
                       s->gc_threshold);
    if (s->expandable_segments && dev->backend->check_expandable == NULL)
        return nd_fail(ND_ERR_VALUE,
                       "expandable_segments is not supported on %s: its allocator never splits "
                       "a host block, so there is no segment to grow in place (a CUDA setting)",
                       dev->name);
    if (s->expandable_segments && !dev->alloc.settings.expandable_segments) {
        nd_status status = dev->backend->check_expandable(dev);
        if (status != ND_OK) return status;
    }
    dev->alloc.settings = *s;
    return ND_OK;
}

void nd_memory_get_settings(const nd_device *dev, nd_alloc_settings *out) {
    *out = dev->alloc.settings;
}

int64_t nd_memory_empty_cache(nd_device *dev) {
    return dev->backend->release_cache ? dev->backend->release_cache(dev) : 0;
}

void nd_last_oom(nd_oom_info *out) { *out = last_oom; }

/* Backends call these around obtaining and returning memory, so the limit
 * applies to what is really taken from the device, cache included. */
nd_status nd_memory_reserve(nd_device *dev, int64_t nbytes) {
    nd_memory_stats *st = &dev->alloc.stats;
    /* garbage_collection_threshold: the whole cache goes back (not PyTorch's
     * oldest blocks first) before reserved memory passes the share. */
    double threshold = dev->alloc.settings.gc_threshold;
    int64_t budget = nd_device_budget(dev);
    if (threshold > 0.0 && budget > 0 &&
        (double)(st->reserved_current + nbytes) > threshold * (double)budget &&
        nd_memory_empty_cache(dev) > 0)
        st->num_gc_releases++;
    if (st->limit >= 0 && st->reserved_current + nbytes > st->limit)
        return nd_fail(ND_ERR_OOM, "the memory limit of %s would be passed", dev->name);
    st->reserved_current += nbytes;
    st->reserved_total += nbytes;
    if (st->reserved_current > st->reserved_peak) st->reserved_peak = st->reserved_current;
    return ND_OK;
}

void nd_memory_unreserve(nd_device *dev, int64_t nbytes) {
    nd_memory_stats *st = &dev->alloc.stats;
    st->reserved_current -= nbytes;
    st->reserved_freed += nbytes;
}

/* Returns the allocated bytes that fell while the host collected. */
static int64_t run_collection(nd_device *dev, int64_t requested, nd_collect_reason reason) {
    if (collect_fn == NULL || collecting) return 0;
    if (dev->alloc.capturing) {
        dev->alloc.collection_deferred = 1;
        return 0;
    }
    nd_memory_stats *st = &dev->alloc.stats;
    int64_t before = st->allocated_current;
    collecting = 1;
    st->num_collect_callbacks++;
    collect_fn(collect_ctx, dev, requested, reason);
    collecting = 0;
    int64_t freed = st->allocated_current < before ? before - st->allocated_current : 0;
    st->collect_callback_freed_bytes += freed;
    return freed;
}

/* The out-of-memory ladder, the one place it is written: try; on ND_ERR_OOM
 * give back the cache and try again; then ask the host for a collection,
 * give back what it freed, and try a last time. */
nd_status nd_memory_retry(nd_device *dev, int64_t requested, nd_attempt_fn attempt, void *ctx) {
    nd_memory_stats *st = &dev->alloc.stats;
    int64_t collected = 0;
    nd_status status = attempt(ctx);
    /* During a capture the cache cannot go back (cudaFree) nor a collection
     * run: the first refusal stands. */
    if (status == ND_ERR_OOM && dev->alloc.capturing) {
        ladder_collected = 0;
        return status;
    }
    if (status == ND_ERR_OOM && nd_memory_empty_cache(dev) > 0) {
        st->num_alloc_retries++;
        status = attempt(ctx);
    }
    if (status == ND_ERR_OOM && collect_fn != NULL && !collecting) {
        collected = run_collection(dev, requested, ND_COLLECT_OOM);
        nd_memory_empty_cache(dev);
        st->num_alloc_retries++;
        status = attempt(ctx);
    }
    ladder_collected = collected;
    return status;
}

typedef struct raw_alloc_attempt {
    nd_device *dev;
    int64_t nbytes;
    void **out;
} raw_alloc_attempt;

static nd_status try_raw_alloc(void *ctx) {
    raw_alloc_attempt *a = (raw_alloc_attempt *)ctx;
    return a->dev->backend->raw_alloc(a->dev, a->nbytes, a->out);
}

nd_status nd_memory_alloc(nd_device *dev, int64_t nbytes, void **out) {
    nd_memory_stats *st = &dev->alloc.stats;
    *out = NULL;
    if (nbytes < 0)
        return nd_fail(ND_ERR_VALUE, "negative allocation size %lld", (long long)nbytes);
    if (!dev->available) return nd_fail(ND_ERR_DEVICE, "device %s is not available", dev->name);
    int64_t collected = 0;
    if (st->trigger >= 0 && st->allocated_current + nbytes > st->trigger)
        collected = run_collection(dev, nbytes, ND_COLLECT_PRESSURE);

    nd_status status = ND_OK;
    if (nbytes > 0) {
        raw_alloc_attempt attempt = {dev, nbytes, out};
        status = nd_memory_retry(dev, nbytes, try_raw_alloc, &attempt);
        if (status == ND_ERR_OOM) {
            st->num_ooms++;
            nd_memory_trace(dev, ND_MEMORY_OOM, NULL, nbytes);
            last_oom.device_id = dev->id;
            last_oom.requested = nbytes;
            last_oom.allocated = st->allocated_current;
            last_oom.reserved = st->reserved_current;
            last_oom.limit = st->limit;
            last_oom.collected = collected + ladder_collected;
            last_oom.largest_free_block = nd_memory_largest_free_block(dev);
            return nd_fail(ND_ERR_OOM,
                           "out of memory on %s: tried to allocate %lld bytes; %lld allocated, "
                           "%lld reserved, limit %lld%s",
                           dev->name, (long long)nbytes, (long long)st->allocated_current,
                           (long long)st->reserved_current, (long long)st->limit,
                           dev->alloc.capturing
                               ? " (during a CUDA graph capture, which neither collects nor "
                                 "releases the cache)"
                               : "");
        }
        if (status != ND_OK) return status;
    }
    st->allocated_current += nbytes;
    st->allocated_total += nbytes;
    if (st->allocated_current > st->allocated_peak) st->allocated_peak = st->allocated_current;
    if (st->allocated_current > st->allocated_window_peak)
        st->allocated_window_peak = st->allocated_current;
    st->blocks_current++;
    st->blocks_total++;
    if (st->blocks_current > st->blocks_peak) st->blocks_peak = st->blocks_current;
    if (nd_memory_oversize(dev, nbytes)) nd_memory_stat_update(&st->oversize_allocations, 1);
    if (nbytes > 0) nd_memory_trace(dev, ND_MEMORY_ALLOC, *out, nbytes);
    return ND_OK;
}

void nd_memory_free(nd_device *dev, void *ptr, int64_t nbytes) {
    nd_memory_stats *st = &dev->alloc.stats;
    if (ptr != NULL) {
        /* Before raw_free, so that a segment it gives back comes after. */
        nd_memory_trace(dev, ND_MEMORY_FREE, ptr, nbytes);
        dev->backend->raw_free(dev, ptr, nbytes);
    }
    st->allocated_current -= nbytes;
    st->allocated_freed += nbytes;
    st->blocks_current--;
    st->blocks_freed++;
    if (nd_memory_oversize(dev, nbytes)) nd_memory_stat_update(&st->oversize_allocations, -1);
}

/* ------------------------------------------------------- graph captures */

void nd_memory_begin_capture(nd_device *dev) {
    dev->alloc.capturing = 1;
    dev->alloc.collection_deferred = 0;
}

void nd_memory_end_capture(nd_device *dev) {
    dev->alloc.capturing = 0;
    if (dev->alloc.collection_deferred) {
        dev->alloc.collection_deferred = 0;
        (void)run_collection(dev, 0, ND_COLLECT_PRESSURE);
    }
}

int nd_memory_capturing(void) {
    for (int id = 0; id < nd_device_count() && id < ND_MAX_DEVICES; id++) {
        nd_device *dev = nd_device_at(id);
        if (dev != NULL && dev->alloc.capturing) return 1;
    }
    return 0;
}

void nd_memory_defer_collection(void) {
    for (int id = 0; id < nd_device_count() && id < ND_MAX_DEVICES; id++) {
        nd_device *dev = nd_device_at(id);
        if (dev != NULL && dev->alloc.capturing) dev->alloc.collection_deferred = 1;
    }
}
