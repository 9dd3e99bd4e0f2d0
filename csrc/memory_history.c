/* memory_history.c: the allocator's events, reported to the host while a
 * device is traced (a memory snapshot's trace; the block map it shows is
 * memory_blocks.c's).
 *
 * Mechanism only: the host (needle_c/memory/history.c) decides what to keep.
 * Reporting an event costs one flag test when tracing is off. The allocator
 * and the backends call in here; nothing here calls them.
 */
#include "internal.h"

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
