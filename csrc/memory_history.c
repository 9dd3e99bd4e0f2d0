/* memory_history.c: what a memory snapshot needs from the engine: the
 * allocator's events, reported to the host while a device is traced, and
 * the map of every segment and block a device's allocator holds.
 *
 * Mechanism only: the host (needle_c/memory/history.c) decides what to keep.
 * Reporting an event costs one flag test when tracing is off. The block map
 * joins the backend's view (segments, cached blocks) with the live storages
 * (what was asked for), so that it adds up to the allocator's statistics.
 */
#include "internal.h"

#include <stdlib.h>

static nd_memory_event_fn event_fn = NULL;
static void *event_ctx = NULL;
static int tracing[ND_MAX_DEVICES];

void nd_memory_set_event_callback(nd_memory_event_fn fn, void *ctx) {
    event_fn = fn;
    event_ctx = ctx;
}

void nd_memory_set_tracing(nd_device *dev, int on) {
    if (dev->id >= 0 && dev->id < ND_MAX_DEVICES) tracing[dev->id] = on != 0;
}

void nd_memory_trace(nd_device *dev, nd_memory_action action, const void *address, int64_t size) {
    if (event_fn == NULL || dev->id < 0 || dev->id >= ND_MAX_DEVICES || !tracing[dev->id]) return;
    nd_memory_event event = {action, (uintptr_t)address, size, 0};
    if (action == ND_MEMORY_OOM) {
        const nd_memory_stats *st = &dev->alloc.stats;
        int64_t budget = st->limit >= 0 ? st->limit : dev->capacity;
        event.device_free = budget > st->reserved_current ? budget - st->reserved_current : 0;
    }
    event_fn(event_ctx, dev, &event);
}

static int by_address(const void *a, const void *b) {
    uintptr_t x = ((const nd_live_storage *)a)->address, y = ((const nd_live_storage *)b)->address;
    return (x > y) - (x < y);
}

static int by_segment_then_address(const void *a, const void *b) {
    const nd_memory_block *x = (const nd_memory_block *)a, *y = (const nd_memory_block *)b;
    if (x->segment_address != y->segment_address)
        return (x->segment_address > y->segment_address) -
               (x->segment_address < y->segment_address);
    return (x->address > y->address) - (x->address < y->address);
}

/* The live storages of dev, sorted by address, in a malloc'd array. */
static nd_status live_storages(const nd_device *dev, nd_live_storage **out, int64_t *count) {
    *out = NULL;
    *count = nd_storage_live(dev, NULL, 0);
    if (*count == 0) return ND_OK;
    nd_live_storage *live = malloc(sizeof *live * (size_t)*count);
    if (live == NULL) return nd_fail(ND_ERR_OOM, "out of host memory for a memory snapshot");
    nd_storage_live(dev, live, *count);
    qsort(live, (size_t)*count, sizeof *live, by_address);
    *out = live;
    return ND_OK;
}

/* The CPU backend keeps no map of its live blocks: each storage's buffer is
 * a segment of its own, as is each cached block. */
static nd_status host_blocks(const nd_device *dev, const nd_live_storage *live, int64_t nlive,
                             nd_memory_block *out, int64_t cap, int64_t *count) {
    for (int64_t i = 0; i < nlive && i < cap; i++) {
        int64_t size = nd_cpu_block_size(live[i].nbytes);
        out[i] = (nd_memory_block){.segment_address = live[i].address,
                                   .segment_size = size,
                                   .segment_small = size < ND_CPU_LARGE_BLOCK,
                                   .address = live[i].address,
                                   .size = size,
                                   .requested = live[i].nbytes,
                                   .state = ND_BLOCK_STORAGE};
    }
    int64_t room = cap > nlive ? cap - nlive : 0;
    *count = nlive + nd_cpu_cached_blocks(dev, out + (cap > nlive ? nlive : cap), room);
    return ND_OK;
}

#ifdef NEEDLE_WITH_CUDA
/* The blocks the backend reports as allocated are storages when a live
 * storage starts there; the others are the engine's own. */
static void mark_storages(nd_memory_block *blocks, int64_t n, const nd_live_storage *live,
                          int64_t nlive) {
    for (int64_t i = 0; i < n; i++) {
        if (blocks[i].state != ND_BLOCK_ENGINE) continue;
        nd_live_storage key = {blocks[i].address, 0};
        const nd_live_storage *hit =
            nlive > 0 ? bsearch(&key, live, (size_t)nlive, sizeof *live, by_address) : NULL;
        if (hit == NULL) continue;
        blocks[i].state = ND_BLOCK_STORAGE;
        blocks[i].requested = hit->nbytes;
    }
}
#endif

nd_status nd_memory_blocks(nd_device *dev, nd_memory_block *out, int64_t cap, int64_t *count) {
    *count = 0;
    if (cap < 0 || (cap > 0 && out == NULL))
        return nd_fail(ND_ERR_VALUE, "a block map needs room for cap >= 0 blocks");
    nd_live_storage *live = NULL;
    int64_t nlive = 0;
    nd_status status = live_storages(dev, &live, &nlive);
    if (status != ND_OK) return status;
    if (dev->kind == ND_DEVICE_CPU) {
        status = host_blocks(dev, live, nlive, out, cap, count);
    } else {
#ifdef NEEDLE_WITH_CUDA
        *count = nd_cuda_blocks(dev, out, cap);
        if (*count <= cap) mark_storages(out, *count, live, nlive);
#else
        status = nd_fail(ND_ERR_DEVICE, "no block map for device %s", dev->name);
#endif
    }
    free(live);
    if (status == ND_OK && *count > 0 && *count <= cap)
        qsort(out, (size_t)*count, sizeof *out, by_segment_then_address);
    return status;
}
