/* memory_blocks.c: the map of every segment and block a device's allocator
 * holds, for a memory snapshot (nd_memory_blocks).
 *
 * It joins the backend's view (segments, cached blocks: nd_backend
 * .memory_blocks) with the live storages (what was asked for: storage.c),
 * so that it adds up to the allocator's statistics; also the largest free
 * block, which an out-of-memory error reports. It reaches the blocks
 * through the backend table only, so the allocator, the backends and the
 * storages never call back up into it.
 */
#include "internal.h"

#include <stdlib.h>

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

/* The blocks the backend reports as the engine's are storages when a live
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

nd_status nd_memory_blocks(nd_device *dev, nd_memory_block *out, int64_t cap, int64_t *count) {
    *count = 0;
    if (cap < 0 || (cap > 0 && out == NULL))
        return nd_fail(ND_ERR_VALUE, "a block map needs room for cap >= 0 blocks");
    nd_live_storage *live = NULL;
    int64_t nlive = 0;
    nd_status status = live_storages(dev, &live, &nlive);
    if (status != ND_OK) return status;
    if (dev->backend->memory_blocks == NULL) {
        status = nd_fail(ND_ERR_DEVICE, "no block map for device %s", dev->name);
    } else {
        *count = dev->backend->memory_blocks(dev, live, nlive, out, cap);
        if (*count <= cap) mark_storages(out, *count, live, nlive);
    }
    free(live);
    if (status == ND_OK && *count > 0 && *count <= cap)
        qsort(out, (size_t)*count, sizeof *out, by_segment_then_address);
    return status;
}

int64_t nd_memory_largest_free_block(nd_device *dev) {
    if (dev->backend->memory_blocks == NULL) return 0;
    /* Free blocks are the backend's own: no live storage is needed to find
     * them (with none, the CPU backend lists its cache alone). */
    int64_t count = dev->backend->memory_blocks(dev, NULL, 0, NULL, 0);
    if (count <= 0) return 0;
    nd_memory_block *blocks = malloc(sizeof *blocks * (size_t)count);
    if (blocks == NULL) return 0;
    int64_t n = dev->backend->memory_blocks(dev, NULL, 0, blocks, count);
    int64_t largest = 0;
    for (int64_t i = 0; i < n && i < count; i++)
        if (blocks[i].state == ND_BLOCK_FREE && blocks[i].size > largest) largest = blocks[i].size;
    free(blocks);
    return largest;
}
