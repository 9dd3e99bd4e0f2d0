/* cpu_memory.c: host memory for the CPU backend, with a cache of large blocks.
 *
 * A training step allocates the same large arrays every time; returning them
 * to the C library hands them back to the kernel, which must fault and zero
 * them again next step (most of a PTB step's system time). Blocks of 2 MiB
 * and more are therefore rounded to 2 MiB, backed by transparent huge pages,
 * and kept on free for reuse by a request of the same size. Cached blocks
 * stay reserved (they count against the device limit, as on a GPU);
 * nd_memory_empty_cache and the out-of-memory ladder give them back.
 *
 * Every block is a segment of its own and is never split: a cached block
 * serves only a request of its exact rounded size, which max_split_size asks
 * of oversize blocks and this cache does for all (the setting changes only
 * what the statistics count as oversize); garbage_collection_threshold
 * applies as on a GPU (allocator.c); segments cannot grow in place.
 */
#define _DEFAULT_SOURCE /* posix_memalign, madvise: hidden by -std=c11 */

#include "internal.h"

#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define LARGE_BLOCK ND_CPU_LARGE_BLOCK /* internal.h */
#define MAX_CACHED_BYTES ((int64_t)4 << 30)

typedef struct cached_block {
    void *ptr;
    int64_t size;
} cached_block;

typedef struct block_cache {
    cached_block *blocks;
    int count, capacity;
    int64_t bytes;
} block_cache;

static block_cache caches[ND_MAX_DEVICES];

/* The bytes the CPU backend takes for a request of nbytes (rounding included). */
static int64_t block_size(int64_t nbytes) {
    return nbytes >= LARGE_BLOCK ? (nbytes + LARGE_BLOCK - 1) / LARGE_BLOCK * LARGE_BLOCK : nbytes;
}

static block_cache *cache_of(const nd_device *dev) {
    return dev->id >= 0 && dev->id < ND_MAX_DEVICES ? &caches[dev->id] : NULL;
}

/* A block of size bytes is handed out (active) or comes back (n = -1). */
static void count_active(nd_device *dev, int64_t size, int n) {
    nd_memory_stat_update(&dev->alloc.stats.active, n);
    nd_memory_stat_update(&dev->alloc.stats.active_bytes, n * size);
}

/* A segment of size bytes is taken from the C library or returned (n = -1). */
static void count_segment(nd_device *dev, int64_t size, int n) {
    nd_memory_stat_update(&dev->alloc.stats.segment, n);
    if (nd_memory_oversize(dev, size))
        nd_memory_stat_update(&dev->alloc.stats.oversize_segments, n);
}

nd_status nd_cpu_raw_alloc(nd_device *dev, int64_t nbytes, void **out) {
    int64_t size = block_size(nbytes);
    block_cache *cache = cache_of(dev);
    if (size >= LARGE_BLOCK && cache != NULL) {
        for (int i = cache->count - 1; i >= 0; i--) {
            if (cache->blocks[i].size != size) continue;
            *out = cache->blocks[i].ptr;
            cache->blocks[i] = cache->blocks[--cache->count];
            cache->bytes -= size;
            count_active(dev, size, 1);
            return ND_OK;
        }
    }
    nd_status status = nd_memory_reserve(dev, size);
    if (status != ND_OK) return status;
    /* 64-byte alignment: whole cache lines and aligned AVX-512 loads; large
     * blocks align to 2 MiB so they can be huge pages (as NumPy asks for). */
    void *ptr = NULL;
    if (posix_memalign(&ptr, size >= LARGE_BLOCK ? (size_t)LARGE_BLOCK : 64, (size_t)size) != 0 ||
        ptr == NULL) {
        nd_memory_unreserve(dev, size);
        return nd_fail(ND_ERR_OOM, "the host could not provide %lld bytes", (long long)size);
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (size >= LARGE_BLOCK) (void)madvise(ptr, (size_t)size, MADV_HUGEPAGE);
#endif
    nd_memory_trace(dev, ND_MEMORY_SEGMENT_ALLOC, ptr, size);
    count_segment(dev, size, 1);
    count_active(dev, size, 1);
    *out = ptr;
    return ND_OK;
}

void nd_cpu_raw_free(nd_device *dev, void *ptr, int64_t nbytes) {
    int64_t size = block_size(nbytes);
    block_cache *cache = cache_of(dev);
    count_active(dev, size, -1);
    if (size >= LARGE_BLOCK && cache != NULL && cache->bytes + size <= MAX_CACHED_BYTES) {
        if (cache->count == cache->capacity) {
            int capacity = cache->capacity ? cache->capacity * 2 : 16;
            cached_block *grown = realloc(cache->blocks, sizeof *grown * (size_t)capacity);
            if (grown != NULL) {
                cache->blocks = grown;
                cache->capacity = capacity;
            }
        }
        if (cache->count < cache->capacity) {
            cache->blocks[cache->count++] = (cached_block){ptr, size};
            cache->bytes += size;
            return;
        }
    }
    nd_memory_trace(dev, ND_MEMORY_SEGMENT_FREE, ptr, size);
    free(ptr);
    nd_memory_unreserve(dev, size);
    count_segment(dev, size, -1);
}

int64_t nd_cpu_release_cache(nd_device *dev) {
    block_cache *cache = cache_of(dev);
    if (cache == NULL) return 0;
    int64_t released = cache->bytes;
    for (int i = 0; i < cache->count; i++) {
        nd_memory_trace(dev, ND_MEMORY_SEGMENT_FREE, cache->blocks[i].ptr, cache->blocks[i].size);
        free(cache->blocks[i].ptr);
        nd_memory_unreserve(dev, cache->blocks[i].size);
        count_segment(dev, cache->blocks[i].size, -1);
    }
    cache->count = 0;
    cache->bytes = 0;
    return released;
}

/* Writes the first cap of the device's cached blocks (each its own segment,
 * ND_BLOCK_FREE) into out; returns how many there are. */
static int64_t cached_blocks(const nd_device *dev, nd_memory_block *out, int64_t cap) {
    const block_cache *cache = cache_of(dev);
    if (cache == NULL) return 0;
    for (int i = 0; i < cache->count && i < cap; i++) {
        uintptr_t address = (uintptr_t)cache->blocks[i].ptr;
        int64_t size = cache->blocks[i].size;
        out[i] = (nd_memory_block){.segment_address = address,
                                   .segment_size = size, /* large */
                                   .address = address,
                                   .size = size,
                                   .state = ND_BLOCK_FREE};
    }
    return cache->count;
}

/* The CPU backend keeps no map of its live blocks: each storage's buffer is
 * a segment of its own, as is each cached block. */
int64_t nd_cpu_memory_blocks(nd_device *dev, const nd_live_storage *live, int64_t nlive,
                             nd_memory_block *out, int64_t cap) {
    for (int64_t i = 0; i < nlive && i < cap; i++) {
        int64_t size = block_size(live[i].nbytes);
        out[i] = (nd_memory_block){.segment_address = live[i].address,
                                   .segment_size = size,
                                   .segment_small = size < ND_CPU_LARGE_BLOCK,
                                   .address = live[i].address,
                                   .size = size,
                                   .requested = live[i].nbytes,
                                   .state = ND_BLOCK_STORAGE};
    }
    int64_t room = cap > nlive ? cap - nlive : 0;
    return nlive + cached_blocks(dev, out + (cap > nlive ? nlive : cap), room);
}
