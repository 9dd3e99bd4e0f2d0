/* cuda_allocator.cu: the caching allocator of each GPU: raw_alloc, raw_free
 * and release_cache of the CUDA backend.
 *
 * cudaMalloc and cudaFree are slow (cudaFree synchronises the device), so
 * freed blocks stay cached and are handed out again. Sizes are rounded to
 * 512 bytes. Requests up to 1 MiB ("small") are carved out of 2 MiB segments;
 * larger ones get segments rounded up to 2 MiB. A cached block larger than a
 * request is split and the rest stays cached; when a block is freed it merges
 * with free neighbours of its segment. Only whole free segments go back to
 * the driver (release_cache, which the engine's out-of-memory ladder calls).
 *
 * Accounting: every segment taken from the driver is reserved with
 * nd_memory_reserve (which enforces the device's limit) and unreserved when
 * it is released, so "reserved" counts the cache too. When a full-size
 * segment would pass the limit or the driver refuses it, a segment of just
 * the request's size is tried, so a limit is never missed by rounding alone.
 *
 * max_split_size (PyTorch's max_split_size_mb): a block of that size or more
 * is never split, serves no smaller request, and serves a request of that
 * size or more only when it exceeds it by less than ND_OVERSIZE_SLACK, so
 * that large blocks do not fragment into pieces no request fits. Free blocks
 * of a segment still in use are counted as inactive splits (the fragments),
 * as torch.cuda.memory_stats counts them.
 *
 * Host bookkeeping only (malloc'd structs and sorted arrays); raw_free never
 * allocates, never calls the driver and cannot fail, so freeing is safe while
 * a garbage collection runs. Never prints, exits or aborts.
 */
#include "cuda_common.cuh"

#include <stdlib.h>
#include <string.h>

#define ROUND_BYTES ((int64_t)512)
#define SMALL_LIMIT ((int64_t)1 << 20)   /* requests up to 1 MiB are small */
#define SMALL_SEGMENT ((int64_t)2 << 20) /* small blocks come from 2 MiB segments */
#define LARGE_ROUND ((int64_t)2 << 20)   /* large segments are multiples of 2 MiB */

enum { POOL_SMALL = 0, POOL_LARGE = 1, POOL_COUNT = 2 };

/* One block: a piece of a segment, in address order with its neighbours. A
 * block with neither neighbour is a whole segment. */
typedef struct cuda_block {
    char *ptr;
    int64_t size;
    int pool;
    int allocated;
    struct cuda_block *prev, *next;
    int oversize_segment; /* the head of a segment counted in oversize_segments */
} cuda_block;

/* A sorted array of blocks. */
typedef struct block_vec {
    cuda_block **items;
    int64_t count, cap;
} block_vec;

typedef struct cuda_allocator {
    block_vec free_blocks[POOL_COUNT]; /* by (size, ptr) */
    block_vec live;                    /* allocated blocks, by ptr */
    int64_t blocks[POOL_COUNT];        /* blocks of the pool, free or not */
} cuda_allocator;

static cuda_allocator allocators[ND_CUDA_MAX_DEVICES];

static cuda_allocator *allocator_of(nd_device *dev) { return &allocators[dev->ordinal]; }

/* ----------------------------------------------------------- sorted arrays */

static int by_size_less(const cuda_block *a, const cuda_block *b) {
    return a->size < b->size || (a->size == b->size && a->ptr < b->ptr);
}

static int by_ptr_less(const cuda_block *a, const cuda_block *b) { return a->ptr < b->ptr; }

/* First position whose item is not less than key. */
static int64_t lower_bound(const block_vec *v, const cuda_block *key,
                           int (*less)(const cuda_block *, const cuda_block *)) {
    int64_t lo = 0, hi = v->count;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (less(v->items[mid], key)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Grows v to hold at least cap items; 0 on failure (v unchanged). */
static int vec_reserve(block_vec *v, int64_t cap) {
    if (v->cap >= cap) return 1;
    int64_t new_cap = v->cap > 0 ? v->cap : 64;
    while (new_cap < cap) new_cap *= 2;
    cuda_block **items = (cuda_block **)realloc(v->items, (size_t)new_cap * sizeof *items);
    if (items == NULL) return 0;
    v->items = items;
    v->cap = new_cap;
    return 1;
}

/* Inserts into a vector whose capacity the caller has ensured. */
static void vec_insert(block_vec *v, cuda_block *b,
                       int (*less)(const cuda_block *, const cuda_block *)) {
    int64_t at = lower_bound(v, b, less);
    memmove(v->items + at + 1, v->items + at, (size_t)(v->count - at) * sizeof *v->items);
    v->items[at] = b;
    v->count++;
}

static void vec_remove(block_vec *v, cuda_block *b,
                       int (*less)(const cuda_block *, const cuda_block *)) {
    int64_t at = lower_bound(v, b, less);
    if (at >= v->count || v->items[at] != b) return; /* not there: nothing to do */
    memmove(v->items + at, v->items + at + 1, (size_t)(v->count - at - 1) * sizeof *v->items);
    v->count--;
}

/* -------------------------------------------------------------- blocks */

/* Room for every block of the pool to be free at once, plus the one a split
 * adds: after this, raw_free never needs to grow anything. */
static int ensure_room(cuda_allocator *a, int pool) {
    return vec_reserve(&a->free_blocks[pool], a->blocks[pool] + 2) &&
           vec_reserve(&a->live, a->live.count + 1);
}

static int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* A free block that is part of a segment still in use is a fragment. */
static void count_inactive_split(nd_device *dev, const cuda_block *b, int n) {
    if (b->prev == NULL && b->next == NULL) return;
    nd_memory_stat_update(&dev->alloc.stats.inactive_split, n);
    nd_memory_stat_update(&dev->alloc.stats.inactive_split_bytes, n * b->size);
}

/* Every block enters and leaves a free list through these two, and no block
 * changes its neighbours while it is on one, so the counts stay exact. */
static void free_insert(nd_device *dev, cuda_block *b) {
    vec_insert(&allocator_of(dev)->free_blocks[b->pool], b, by_size_less);
    count_inactive_split(dev, b, 1);
}

static void free_remove(nd_device *dev, cuda_block *b) {
    vec_remove(&allocator_of(dev)->free_blocks[b->pool], b, by_size_less);
    count_inactive_split(dev, b, -1);
}

/* Whether cached block b may serve a request of size bytes (b->size >= size). */
static int block_fits(const nd_device *dev, const cuda_block *b, int64_t size) {
    if (!nd_memory_oversize(dev, b->size)) return 1;
    return nd_memory_oversize(dev, size) && b->size < size + ND_OVERSIZE_SLACK;
}

/* Cuts block b down to size; the rest becomes a free block after it. Keeps
 * the whole block when the rest is too small to be useful or when the host
 * cannot provide the bookkeeping. */
static void split(nd_device *dev, cuda_block *b, int64_t size) {
    int64_t rest = b->size - size;
    if (b->pool == POOL_SMALL ? rest < ROUND_BYTES : rest <= SMALL_LIMIT) return;
    if (nd_memory_oversize(dev, size)) return;
    cuda_block *r = (cuda_block *)malloc(sizeof *r);
    if (r == NULL) return;
    r->ptr = b->ptr + size;
    r->size = rest;
    r->pool = b->pool;
    r->allocated = 0;
    r->prev = b;
    r->next = b->next;
    r->oversize_segment = 0;
    if (b->next != NULL) b->next->prev = r;
    b->next = r;
    b->size = size;
    allocator_of(dev)->blocks[b->pool]++;
    free_insert(dev, r);
}

/* A new segment of seg_size bytes from the driver, as one block. */
static nd_status new_segment(nd_device *dev, int pool, int64_t seg_size, cuda_block **out) {
    *out = NULL;
    ND_TRY(nd_memory_reserve(dev, seg_size));
    nd_status status = nd_cuda_set_device(dev->ordinal);
    if (status != ND_OK) {
        nd_memory_unreserve(dev, seg_size);
        return status;
    }
    void *ptr = NULL;
    cudaError_t err = nd_cuda_malloc(&ptr, (size_t)seg_size);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        nd_memory_unreserve(dev, seg_size);
        if (err == cudaErrorMemoryAllocation)
            return nd_fail(ND_ERR_OOM,
                           "cudaMalloc of %lld bytes failed on %s:%d: the GPU is out of memory",
                           (long long)seg_size, dev->name, dev->ordinal);
        return nd_fail(ND_ERR_BACKEND, "CUDA error %s (%s) at %s:%d: cudaMalloc of %lld bytes",
                       cudaGetErrorName(err), cudaGetErrorString(err), __FILE__, __LINE__,
                       (long long)seg_size);
    }
    cuda_block *b = (cuda_block *)malloc(sizeof *b);
    if (b == NULL) {
        nd_cuda_free(ptr);
        (void)cudaGetLastError();
        nd_memory_unreserve(dev, seg_size);
        return nd_fail(ND_ERR_BACKEND, "out of host memory for the CUDA allocator's bookkeeping");
    }
    b->ptr = (char *)ptr;
    b->size = seg_size;
    b->pool = pool;
    b->allocated = 0;
    b->prev = b->next = NULL;
    b->oversize_segment = nd_memory_oversize(dev, seg_size);
    allocator_of(dev)->blocks[pool]++;
    nd_memory_stat_update(&dev->alloc.stats.segment, 1);
    if (b->oversize_segment) nd_memory_stat_update(&dev->alloc.stats.oversize_segments, 1);
    nd_memory_trace(dev, ND_MEMORY_SEGMENT_ALLOC, ptr, seg_size);
    *out = b;
    return ND_OK;
}

/* --------------------------------------------------------- entry points */

nd_status nd_cuda_raw_alloc(nd_device *dev, int64_t nbytes, void **out) {
    *out = NULL;
    cuda_allocator *a = allocator_of(dev);
    int64_t size = round_up(nbytes > 0 ? nbytes : 1, ROUND_BYTES);
    int pool = size <= SMALL_LIMIT ? POOL_SMALL : POOL_LARGE;
    /* Room for a new segment's block and a split's, before anything changes. */
    a->blocks[pool] += 2;
    int room = ensure_room(a, pool);
    a->blocks[pool] -= 2;
    if (!room)
        return nd_fail(ND_ERR_BACKEND, "out of host memory for the CUDA allocator's bookkeeping");

    /* Best fit: the smallest cached block that holds size. */
    block_vec *free_list = &a->free_blocks[pool];
    cuda_block key = {NULL, size, pool, 0, NULL, NULL, 0};
    int64_t at = lower_bound(free_list, &key, by_size_less);
    cuda_block *b = NULL;
    /* The smallest that holds size decides: a larger one fits no better. */
    if (at < free_list->count && block_fits(dev, free_list->items[at], size)) {
        b = free_list->items[at];
        free_remove(dev, b);
    } else {
        int64_t seg_size = pool == POOL_SMALL ? SMALL_SEGMENT : round_up(size, LARGE_ROUND);
        nd_status status = new_segment(dev, pool, seg_size, &b);
        /* Near the limit (or the GPU's end) take only what was asked for. */
        if (status == ND_ERR_OOM && seg_size > size) status = new_segment(dev, pool, size, &b);
        if (status != ND_OK) return status;
    }
    split(dev, b, size);
    b->allocated = 1;
    vec_insert(&a->live, b, by_ptr_less);
    nd_memory_stat_update(&dev->alloc.stats.active, 1);
    nd_memory_stat_update(&dev->alloc.stats.active_bytes, b->size);
    *out = b->ptr;
    return ND_OK;
}

void nd_cuda_raw_free(nd_device *dev, void *ptr, int64_t nbytes) {
    (void)nbytes;
    cuda_allocator *a = allocator_of(dev);
    cuda_block key = {(char *)ptr, 0, 0, 0, NULL, NULL, 0};
    int64_t at = lower_bound(&a->live, &key, by_ptr_less);
    if (at >= a->live.count || a->live.items[at]->ptr != (char *)ptr) return; /* not ours */
    cuda_block *b = a->live.items[at];
    vec_remove(&a->live, b, by_ptr_less);
    b->allocated = 0;
    nd_memory_stat_update(&dev->alloc.stats.active, -1);
    nd_memory_stat_update(&dev->alloc.stats.active_bytes, -b->size);
    /* Merge with free neighbours: the segment heals as its blocks come back. */
    cuda_block *next = b->next;
    if (next != NULL && !next->allocated) {
        free_remove(dev, next);
        b->size += next->size;
        b->next = next->next;
        if (next->next != NULL) next->next->prev = b;
        free(next);
        a->blocks[b->pool]--;
    }
    cuda_block *prev = b->prev;
    if (prev != NULL && !prev->allocated) {
        free_remove(dev, prev);
        prev->size += b->size;
        prev->next = b->next;
        if (b->next != NULL) b->next->prev = prev;
        free(b);
        a->blocks[prev->pool]--;
        b = prev;
    }
    free_insert(dev, b);
}

int64_t nd_cuda_release_cache(nd_device *dev) {
    cuda_allocator *a = allocator_of(dev);
    int64_t released = 0;
    if (nd_cuda_set_device(dev->ordinal) != ND_OK) return 0;
    for (int pool = 0; pool < POOL_COUNT; pool++) {
        block_vec *v = &a->free_blocks[pool];
        int64_t kept = 0;
        for (int64_t i = 0; i < v->count; i++) {
            cuda_block *b = v->items[i];
            if (b->prev != NULL || b->next != NULL) {
                v->items[kept++] = b; /* part of a segment still in use */
                continue;
            }
            /* cudaFree waits for the kernels that may still use the block. */
            if (nd_cuda_free(b->ptr) != cudaSuccess) {
                (void)cudaGetLastError();
                v->items[kept++] = b; /* keep it reserved: the driver still has it */
                continue;
            }
            nd_memory_trace(dev, ND_MEMORY_SEGMENT_FREE, b->ptr, b->size);
            nd_memory_unreserve(dev, b->size);
            nd_memory_stat_update(&dev->alloc.stats.segment, -1);
            if (b->oversize_segment) nd_memory_stat_update(&dev->alloc.stats.oversize_segments, -1);
            released += b->size;
            a->blocks[pool]--;
            free(b);
        }
        v->count = kept; /* the order by (size, ptr) is kept by the compaction */
    }
    return released;
}

/* Writes the blocks of the segment that starts at head, in address order. */
static int64_t segment_blocks(const cuda_block *head, nd_memory_block *out, int64_t n,
                              int64_t cap) {
    int64_t seg_size = 0;
    for (const cuda_block *b = head; b != NULL; b = b->next) seg_size += b->size;
    for (const cuda_block *b = head; b != NULL; b = b->next, n++) {
        if (n >= cap) continue;
        out[n].segment_address = (uintptr_t)head->ptr;
        out[n].segment_size = seg_size;
        out[n].segment_small = head->pool == POOL_SMALL;
        out[n].address = (uintptr_t)b->ptr;
        out[n].size = b->size;
        out[n].requested = b->allocated ? b->size : 0;
        out[n].state = b->allocated ? ND_BLOCK_ENGINE : ND_BLOCK_FREE;
    }
    return n;
}

/* Every segment has its first block (prev == NULL) on the live list or a
 * free list, so the heads found there reach every block once. */
int64_t nd_cuda_blocks(nd_device *dev, nd_memory_block *out, int64_t cap) {
    cuda_allocator *a = allocator_of(dev);
    int64_t n = 0;
    for (int64_t i = 0; i < a->live.count; i++)
        if (a->live.items[i]->prev == NULL) n = segment_blocks(a->live.items[i], out, n, cap);
    for (int pool = 0; pool < POOL_COUNT; pool++) {
        const block_vec *v = &a->free_blocks[pool];
        for (int64_t i = 0; i < v->count; i++)
            if (v->items[i]->prev == NULL) n = segment_blocks(v->items[i], out, n, cap);
    }
    return n;
}
