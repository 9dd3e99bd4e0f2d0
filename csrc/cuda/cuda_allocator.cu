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
 * expandable_segments (PyTorch's): large requests that no cached block serves
 * come from one address range per GPU that the driver's virtual memory calls
 * give memory page by page (see "expandable segments" below); a segment is
 * then each contiguous mapped run, and reserved bytes are the mapped pages.
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
    int expandable;       /* part of the GPU's expandable segment */
    int mapped;           /* 0: an expandable segment's address range without memory */
    int graph_pool;       /* 0: the GPU's cache; else the CUDA graph pool whose segment it is */
    int deferred;         /* freed during a capture, given back when it ends */
} cuda_block;

/* A sorted array of blocks. */
typedef struct block_vec {
    cuda_block **items;
    int64_t count, cap;
} block_vec;

/* expandable_segments: one address range per GPU, reserved once (PyTorch's
 * 1 1/8 of the GPU's memory, so that no run of requests can exhaust it),
 * whose pages (the driver's granularity) get memory only while a block that
 * is not free needs them (the driver's virtual memory calls: nd_cuda_vm_* in
 * cuda_common.cuh, made in cuda_census.cu). */
typedef struct expandable_segment {
    char *base; /* NULL: not reserved */
    int64_t size, page;
    unsigned long long *handles; /* each page's chunk; 0: not mapped */
    cuda_block *head;            /* the block at base (merges keep the lower block) */
    int64_t mapped_bytes;
} expandable_segment;

typedef struct cuda_allocator {
    block_vec free_blocks[POOL_COUNT]; /* mapped free blocks, by (size, ptr) */
    block_vec live;                    /* allocated blocks, by ptr */
    block_vec unmapped;                /* the expandable segment's blocks without memory, by ptr */
    int64_t blocks[POOL_COUNT];        /* blocks of the pool, free, unmapped or not */
    expandable_segment es;
    int64_t releases; /* release_cache calls that gave something back: plans made before
                       * one (nd_memory_reserve may run it) are stale */
    int capture_pool; /* a CUDA graph is being captured into this pool (0: none) */
    int64_t deferred; /* blocks freed during the capture (see nd_cuda_raw_free) */
} cuda_allocator;

static cuda_allocator allocators[ND_CUDA_MAX_DEVICES];

static cuda_allocator *allocator_of(nd_device *dev) { return &allocators[dev->ordinal]; }

/* ----------------------------------------------------------- sorted arrays */

/* By pool first: each graph pool's free blocks are one run of the list. */
static int by_size_less(const cuda_block *a, const cuda_block *b) {
    if (a->graph_pool != b->graph_pool) return a->graph_pool < b->graph_pool;
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

/* Whether free block b shares its segment (or, expandable, its mapped run)
 * with a block in use: a fragment. */
static int is_split(const cuda_block *b) {
    if (b->expandable) return (b->prev && b->prev->mapped) || (b->next && b->next->mapped);
    return b->prev != NULL || b->next != NULL;
}

static void count_inactive_split(nd_device *dev, const cuda_block *b, int n) {
    if (!is_split(b)) return;
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
    r->expandable = b->expandable;
    r->mapped = 1;
    r->graph_pool = b->graph_pool;
    r->deferred = 0;
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
    const int graph_pool = allocator_of(dev)->capture_pool;
    /* During a capture cudaMalloc is not captured but would invalidate a
     * capture in CUDA's global mode; relaxed mode lets it run, as PyTorch's
     * allocator does for its graph pools. */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (graph_pool != 0) (void)cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = nd_cuda_malloc(&ptr, (size_t)seg_size);
    if (graph_pool != 0) (void)cudaThreadExchangeStreamCaptureMode(&mode);
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
    b->expandable = 0;
    b->mapped = 1;
    b->graph_pool = graph_pool;
    b->deferred = 0;
    allocator_of(dev)->blocks[pool]++;
    nd_memory_stat_update(&dev->alloc.stats.segment, 1);
    if (b->oversize_segment) nd_memory_stat_update(&dev->alloc.stats.oversize_segments, 1);
    nd_memory_trace(dev, ND_MEMORY_SEGMENT_ALLOC, ptr, seg_size);
    *out = b;
    return ND_OK;
}

/* ------------------------------------------------- expandable segments */

/* expandable_segments (PyTorch's): large requests that no cached block
 * serves are carved from one address range per GPU whose pages get memory
 * (cuMemCreate + cuMemMap) only as blocks need them, so a free block at the
 * edge of mapped memory grows in place instead of a new segment being made
 * beside it, and release_cache unmaps the whole pages of free blocks
 * wherever they are. Blocks there are mapped (free or allocated, on the
 * usual lists) or unmapped (page-aligned, on `unmapped`, merged with their
 * unmapped neighbours). Every contiguous mapped run counts as one segment,
 * as PyTorch's snapshots show them; reserved bytes are the mapped pages. */

nd_status nd_cuda_check_expandable(nd_device *dev) {
    int64_t page = 0;
    ND_TRY(nd_cuda_set_device(dev->ordinal));
    ND_TRY(nd_cuda_vm_granularity(dev->ordinal, &page));
    if (dev->capacity <= 0)
        return nd_fail(ND_ERR_VALUE, "%s:%d reports no memory size to reserve addresses for",
                       dev->name, dev->ordinal);
    return ND_OK;
}

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

static int64_t es_page_index(const expandable_segment *es, const char *p) {
    return (int64_t)(p - es->base) / es->page;
}

static cuda_block *new_es_block(char *ptr, int64_t size, int mapped) {
    cuda_block *b = (cuda_block *)malloc(sizeof *b);
    if (b == NULL) return NULL;
    *b = (cuda_block){ptr, size, POOL_LARGE, 0, NULL, NULL, 0, 1, mapped, 0, 0};
    return b;
}

/* Reserves the GPU's address range: one unmapped block. */
static nd_status es_create(nd_device *dev) {
    cuda_allocator *a = allocator_of(dev);
    expandable_segment *es = &a->es;
    int64_t page = 0;
    ND_TRY(nd_cuda_vm_granularity(dev->ordinal, &page));
    int64_t size = round_up(dev->capacity + dev->capacity / 8, page);
    if (!vec_reserve(&a->unmapped, 1))
        return nd_fail(ND_ERR_BACKEND, "out of host memory for the CUDA allocator's bookkeeping");
    unsigned long long *handles =
        (unsigned long long *)calloc((size_t)(size / page), sizeof *handles);
    char *base = NULL;
    nd_status status = handles == NULL ? nd_fail(ND_ERR_BACKEND, "out of host memory for the "
                                                                 "expandable segment's page table")
                                       : nd_cuda_vm_reserve(size, page, &base);
    cuda_block *head = status == ND_OK ? new_es_block(base, size, 0) : NULL;
    if (status == ND_OK && head == NULL) {
        (void)nd_cuda_vm_release(base, size);
        status = nd_fail(ND_ERR_BACKEND, "out of host memory for the CUDA allocator's bookkeeping");
    }
    if (status != ND_OK) {
        free(handles);
        return status;
    }
    *es = (expandable_segment){base, size, page, handles, head, 0};
    vec_insert(&a->unmapped, head, by_ptr_less);
    a->blocks[POOL_LARGE]++;
    return ND_OK;
}

/* Where a request of size bytes fits: *start, the lowest free or unmapped
 * block from which free and unmapped blocks run for size bytes, and *need,
 * the bytes to map there. 0 when the range has no such run. */
static int es_find_room(const cuda_allocator *a, int64_t size, cuda_block **start, int64_t *need) {
    for (int64_t i = 0; i < a->unmapped.count; i++) {
        cuda_block *c = a->unmapped.items[i];
        if (c->prev != NULL && !c->prev->allocated) c = c->prev; /* a free block grows */
        int64_t left = size, bytes = 0;
        for (const cuda_block *b = c; b != NULL && !b->allocated && left > 0; b = b->next) {
            int64_t take = b->mapped ? b->size : min64(round_up(left, a->es.page), b->size);
            if (!b->mapped) bytes += take;
            left -= take;
        }
        if (left <= 0) {
            *start = c;
            *need = bytes;
            return 1;
        }
    }
    return 0;
}

/* Merges free block b into its free mapped neighbour before it; returns it. */
static cuda_block *merge_into_prev(nd_device *dev, cuda_block *b) {
    cuda_block *prev = b->prev;
    prev->size += b->size;
    prev->next = b->next;
    if (b->next != NULL) b->next->prev = prev;
    free(b);
    allocator_of(dev)->blocks[POOL_LARGE]--;
    return prev;
}

/* The change in mapped runs when block b turns mapped (+1) or unmapped (-1),
 * its neighbours as they are. */
static void count_run_change(nd_device *dev, const cuda_block *b, int mapped) {
    int neighbours = (b->prev && b->prev->mapped) + (b->next && b->next->mapped);
    nd_memory_stat_update(&dev->alloc.stats.segment, mapped ? 1 - neighbours : neighbours - 1);
}

/* Maps the first nbytes (whole pages) of unmapped block u; the mapped part
 * joins its free neighbours and goes on the free list. The caller has
 * reserved the bytes. */
static nd_status es_map(nd_device *dev, cuda_block *u, int64_t nbytes) {
    cuda_allocator *a = allocator_of(dev);
    expandable_segment *es = &a->es;
    cuda_block *rest = NULL;
    if (nbytes < u->size && (rest = new_es_block(u->ptr + nbytes, u->size - nbytes, 0)) == NULL)
        return nd_fail(ND_ERR_BACKEND, "out of host memory for the CUDA allocator's bookkeeping");
    for (int64_t off = 0; off < nbytes; off += es->page) {
        int64_t page = es_page_index(es, u->ptr + off);
        nd_status status = nd_cuda_vm_map(dev->ordinal, u->ptr + off, es->page, &es->handles[page]);
        if (status != ND_OK) {
            /* Nothing has used these pages yet: no wait before unmapping. */
            for (int64_t back = off - es->page; back >= 0; back -= es->page) {
                int64_t p = es_page_index(es, u->ptr + back);
                (void)nd_cuda_vm_unmap(u->ptr + back, es->page, es->handles[p]);
                es->handles[p] = 0;
            }
            free(rest);
            return status;
        }
    }
    vec_remove(&a->unmapped, u, by_ptr_less);
    if (rest != NULL) {
        rest->prev = u;
        rest->next = u->next;
        if (u->next != NULL) u->next->prev = rest;
        u->next = rest;
        u->size = nbytes;
        vec_insert(&a->unmapped, rest, by_ptr_less);
        a->blocks[POOL_LARGE]++;
    }
    /* Free neighbours leave the free list before u's mapping changes how
     * they count (is_split). */
    cuda_block *prev = u->prev, *next = u->next;
    int join_prev = prev != NULL && prev->mapped && !prev->allocated;
    int join_next = next != NULL && next->mapped && !next->allocated;
    if (join_prev) free_remove(dev, prev);
    if (join_next) free_remove(dev, next);
    count_run_change(dev, u, 1);
    u->mapped = 1;
    es->mapped_bytes += nbytes;
    nd_memory_trace(dev, ND_MEMORY_SEGMENT_ALLOC, u->ptr, nbytes);
    if (join_next) merge_into_prev(dev, next);
    if (join_prev) u = merge_into_prev(dev, u);
    free_insert(dev, u);
    return ND_OK;
}

/* A free mapped block of at least size bytes from the expandable segment,
 * taken off the free list (the caller splits it). */
static nd_status expandable_alloc(nd_device *dev, int64_t size, cuda_block **out) {
    cuda_allocator *a = allocator_of(dev);
    expandable_segment *es = &a->es;
    *out = NULL;
    /* The driver's calls act in the current context, and the census counts by
     * the current GPU. */
    ND_TRY(nd_cuda_set_device(dev->ordinal));
    if (es->base == NULL) ND_TRY(es_create(dev));
    cuda_block *c = NULL;
    int64_t need = 0;
    /* nd_memory_reserve may release the cache (garbage_collection_threshold),
     * which changes the blocks: plan again after it did. */
    for (int attempt = 0;; attempt++) {
        if (!es_find_room(a, size, &c, &need))
            return nd_fail(ND_ERR_OOM, "the expandable segment of %s:%d has no room for %lld bytes",
                           dev->name, dev->ordinal, (long long)size);
        int64_t releases = a->releases;
        ND_TRY(nd_memory_reserve(dev, need));
        if (releases == a->releases) break;
        nd_memory_unreserve(dev, need);
        if (attempt == 2)
            return nd_fail(ND_ERR_OOM, "%s:%d: the cache kept changing while memory was mapped",
                           dev->name, dev->ordinal);
    }
    int64_t mapped_before = es->mapped_bytes;
    /* c's predecessor is in use (es_find_room), so c stays the run's first
     * block; what follows it up to size is unmapped or free, and each mapped
     * piece joins c. */
    nd_status status = ND_OK;
    if (!c->mapped) status = es_map(dev, c, min64(round_up(size, es->page), c->size));
    while (status == ND_OK && c->size < size) {
        cuda_block *next = c->next;
        status = es_map(dev, next, min64(round_up(size - c->size, es->page), next->size));
    }
    if (status != ND_OK) {
        nd_memory_unreserve(dev, need - (es->mapped_bytes - mapped_before));
        return status;
    }
    free_remove(dev, c);
    *out = c;
    return ND_OK;
}

/* The page-aligned part [*lo, *hi) (offsets from the base) of free block b;
 * empty when b holds no whole page. */
static int es_whole_pages(const expandable_segment *es, const cuda_block *b, int64_t *lo,
                          int64_t *hi) {
    int64_t offset = (int64_t)(b->ptr - es->base);
    *lo = round_up(offset, es->page);
    *hi = (offset + b->size) / es->page * es->page;
    return *hi > *lo;
}

/* Unmaps the whole pages of free block b (on the free list): they become an
 * unmapped block, joined to its unmapped neighbours; the ends of b that
 * share a page with a neighbour stay mapped and free. The GPU has been
 * waited for. Returns the bytes unmapped (0: b kept as it was). */
static int64_t es_unmap(nd_device *dev, cuda_block *b) {
    cuda_allocator *a = allocator_of(dev);
    expandable_segment *es = &a->es;
    int64_t lo, hi, offset = (int64_t)(b->ptr - es->base), end = offset + b->size;
    if (!es_whole_pages(es, b, &lo, &hi)) return 0;
    cuda_block *spare[2] = {new_es_block(NULL, 0, 1), new_es_block(NULL, 0, 1)};
    if (spare[0] == NULL || spare[1] == NULL || !vec_reserve(&a->unmapped, a->unmapped.count + 1) ||
        !vec_reserve(&a->free_blocks[POOL_LARGE], a->blocks[POOL_LARGE] + 2)) {
        free(spare[0]);
        free(spare[1]);
        return 0; /* no host memory for the pieces: the pages stay */
    }
    /* From the end down: a page the driver refuses to give back ends the cut. */
    int64_t cut = hi;
    while (cut > lo) {
        int64_t page = es_page_index(es, es->base + cut - es->page);
        if (nd_cuda_vm_unmap(es->base + cut - es->page, es->page, es->handles[page]) != ND_OK)
            break;
        es->handles[page] = 0;
        cut -= es->page;
    }
    if (cut == hi) {
        free(spare[0]);
        free(spare[1]);
        return 0;
    }
    /* b becomes [offset, cut) (mapped) and [cut, hi) (unmapped) and [hi, end)
     * (mapped), the empty ones left out. */
    free_remove(dev, b);
    cuda_block *prev = b->prev, *next = b->next, *pieces[3];
    int n = 0;
    if (cut > offset) {
        b->size = cut - offset;
        pieces[n++] = b;
        b = spare[0];
        spare[0] = NULL;
    }
    cuda_block *mid = b;
    *mid = (cuda_block){es->base + cut, hi - cut, POOL_LARGE, 0, NULL, NULL, 0, 1, 0, 0, 0};
    pieces[n++] = mid;
    if (end > hi) {
        *spare[1] = (cuda_block){es->base + hi, end - hi, POOL_LARGE, 0, NULL, NULL, 0, 1, 1, 0, 0};
        pieces[n++] = spare[1];
        spare[1] = NULL;
    }
    free(spare[0]);
    free(spare[1]);
    for (int i = 0; i < n; i++) {
        pieces[i]->prev = i > 0 ? pieces[i - 1] : prev;
        pieces[i]->next = i + 1 < n ? pieces[i + 1] : next;
    }
    if (prev != NULL) prev->next = pieces[0];
    if (next != NULL) next->prev = pieces[n - 1];
    a->blocks[POOL_LARGE] += n - 1;
    count_run_change(dev, mid, 0);
    es->mapped_bytes -= hi - cut;
    nd_memory_unreserve(dev, hi - cut);
    nd_memory_trace(dev, ND_MEMORY_SEGMENT_FREE, mid->ptr, hi - cut);
    for (int i = 0; i < n; i++)
        if (pieces[i]->mapped) free_insert(dev, pieces[i]);
    if (next != NULL && next == mid->next && !next->mapped) {
        vec_remove(&a->unmapped, next, by_ptr_less);
        merge_into_prev(dev, next);
    }
    if (mid->prev != NULL && !mid->prev->mapped) merge_into_prev(dev, mid);
    else vec_insert(&a->unmapped, mid, by_ptr_less);
    return hi - cut;
}

/* Gives the address range back once nothing is mapped and the setting is off. */
static void es_destroy(nd_device *dev) {
    cuda_allocator *a = allocator_of(dev);
    expandable_segment *es = &a->es;
    if (nd_cuda_vm_release(es->base, es->size) != ND_OK) return; /* keep it: still reserved */
    vec_remove(&a->unmapped, es->head, by_ptr_less);
    free(es->head);
    a->blocks[POOL_LARGE]--;
    free(es->handles);
    *es = (expandable_segment){NULL, 0, 0, NULL, NULL, 0};
}

/* release_cache's part: unmaps the whole pages of every free block of the
 * expandable segment; returns the bytes. */
static int64_t expandable_release(nd_device *dev) {
    cuda_allocator *a = allocator_of(dev);
    expandable_segment *es = &a->es;
    if (es->base == NULL) return 0;
    block_vec *v = &a->free_blocks[POOL_LARGE];
    int64_t released = 0, lo, hi;
    int waited = 0;
    for (int64_t i = 0; i < v->count;) {
        cuda_block *b = v->items[i];
        if (!b->expandable || !es_whole_pages(es, b, &lo, &hi)) {
            i++;
            continue;
        }
        /* Unmapping does not wait for kernels that may still use the pages. */
        if (!waited && nd_cuda_synchronize() != cudaSuccess) {
            (void)cudaGetLastError();
            break;
        }
        waited = 1;
        int64_t n = es_unmap(dev, b);
        released += n;
        i = n > 0 ? 0 : i + 1; /* the list changed: from its start again */
    }
    if (es->mapped_bytes == 0 && !dev->alloc.settings.expandable_segments) es_destroy(dev);
    return released;
}

/* Writes block b of the segment at seg_address (seg_size bytes) into *out. */
static void put_block(nd_memory_block *out, const cuda_block *b, const char *seg_address,
                      int64_t seg_size) {
    out->segment_address = (uintptr_t)seg_address;
    out->segment_size = seg_size;
    out->segment_small = b->pool == POOL_SMALL;
    out->segment_expandable = b->expandable;
    out->segment_pool = b->graph_pool;
    out->address = (uintptr_t)b->ptr;
    out->size = b->size;
    out->requested = b->allocated ? b->size : 0;
    out->state = b->allocated ? ND_BLOCK_ENGINE : ND_BLOCK_FREE;
}

/* The expandable segment's blocks from out[n] on: each mapped run as a
 * segment, as PyTorch's snapshots show them. */
static int64_t expandable_blocks(const cuda_allocator *a, nd_memory_block *out, int64_t n,
                                 int64_t cap) {
    const cuda_block *b = a->es.base != NULL ? a->es.head : NULL;
    while (b != NULL) {
        if (!b->mapped) {
            b = b->next;
            continue;
        }
        const cuda_block *run = b;
        int64_t run_size = 0;
        for (const cuda_block *x = run; x != NULL && x->mapped; x = x->next) run_size += x->size;
        for (; b != NULL && b->mapped; b = b->next, n++)
            if (n < cap) put_block(&out[n], b, run->ptr, run_size);
    }
    return n;
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
    cuda_block key = {NULL, size, pool, 0, NULL, NULL, 0, 0, 1, a->capture_pool, 0};
    int64_t at = lower_bound(free_list, &key, by_size_less);
    cuda_block *b = NULL;
    /* The smallest that holds size decides: a larger one fits no better. During
     * a capture only the graph's pool serves (its blocks are the graph's to
     * reuse); otherwise only the cache does. */
    if (at < free_list->count && free_list->items[at]->graph_pool == key.graph_pool &&
        block_fits(dev, free_list->items[at], size)) {
        b = free_list->items[at];
        free_remove(dev, b);
    } else if (pool == POOL_LARGE && dev->alloc.settings.expandable_segments &&
               a->capture_pool == 0) {
        ND_TRY(expandable_alloc(dev, size, &b));
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
    cuda_block key = {(char *)ptr, 0, 0, 0, NULL, NULL, 0, 0, 1, 0, 0};
    int64_t at = lower_bound(&a->live, &key, by_ptr_less);
    if (at >= a->live.count || a->live.items[at]->ptr != (char *)ptr) return; /* not ours */
    cuda_block *b = a->live.items[at];
    if (a->capture_pool != 0 && b->graph_pool == 0) {
        /* A block of the cache freed while a graph is captured (a finalizer in
         * a collection, a dropped tensor): the cache must not hand it to work
         * after the capture that the graph's kernels may still touch, so it
         * comes back when the capture ends. */
        if (!b->deferred) a->deferred++;
        b->deferred = 1;
        return;
    }
    vec_remove(&a->live, b, by_ptr_less);
    b->allocated = 0;
    nd_memory_stat_update(&dev->alloc.stats.active, -1);
    nd_memory_stat_update(&dev->alloc.stats.active_bytes, -b->size);
    /* Merge with free neighbours: the segment heals as its blocks come back. */
    cuda_block *next = b->next;
    if (next != NULL && !next->allocated && next->mapped) {
        free_remove(dev, next);
        b->size += next->size;
        b->next = next->next;
        if (next->next != NULL) next->next->prev = b;
        free(next);
        a->blocks[b->pool]--;
    }
    cuda_block *prev = b->prev;
    if (prev != NULL && !prev->allocated && prev->mapped) {
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
    /* cudaFree cannot run during a capture: the cache waits for its end. */
    if (a->capture_pool != 0) return 0;
    if (nd_cuda_set_device(dev->ordinal) != ND_OK) return 0;
    for (int pool = 0; pool < POOL_COUNT; pool++) {
        block_vec *v = &a->free_blocks[pool];
        int64_t kept = 0;
        for (int64_t i = 0; i < v->count; i++) {
            cuda_block *b = v->items[i];
            /* A live graph pool's segments stay its own. */
            if (b->expandable || b->prev != NULL || b->next != NULL || b->graph_pool != 0) {
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
        v->count = kept; /* the order by (pool, size, ptr) is kept by the compaction */
    }
    released += expandable_release(dev);
    if (released > 0) a->releases++;
    return released;
}

/* Writes the blocks of the segment that starts at head, in address order. */
static int64_t segment_blocks(const cuda_block *head, nd_memory_block *out, int64_t n,
                              int64_t cap) {
    int64_t seg_size = 0;
    for (const cuda_block *b = head; b != NULL; b = b->next) seg_size += b->size;
    for (const cuda_block *b = head; b != NULL; b = b->next, n++)
        if (n < cap) put_block(&out[n], b, head->ptr, seg_size);
    return n;
}

/* Every segment has its first block (prev == NULL) on the live list or a
 * free list, so the heads found there reach every block once. */
int64_t nd_cuda_blocks(nd_device *dev, nd_memory_block *out, int64_t cap) {
    cuda_allocator *a = allocator_of(dev);
    int64_t n = 0;
    for (int64_t i = 0; i < a->live.count; i++) {
        const cuda_block *b = a->live.items[i];
        if (b->prev == NULL && !b->expandable) n = segment_blocks(b, out, n, cap);
    }
    for (int pool = 0; pool < POOL_COUNT; pool++) {
        const block_vec *v = &a->free_blocks[pool];
        for (int64_t i = 0; i < v->count; i++)
            if (v->items[i]->prev == NULL && !v->items[i]->expandable)
                n = segment_blocks(v->items[i], out, n, cap);
    }
    return expandable_blocks(a, out, n, cap);
}

/* ------------------------------------------------------ CUDA graph pools */

void nd_cuda_allocator_begin_capture(nd_device *dev, int graph_pool) {
    allocator_of(dev)->capture_pool = graph_pool;
}

void nd_cuda_allocator_end_capture(nd_device *dev) {
    cuda_allocator *a = allocator_of(dev);
    a->capture_pool = 0;
    /* The frees the capture deferred, now that the cache may reuse them. */
    while (a->deferred > 0) {
        cuda_block *found = NULL;
        for (int64_t i = 0; i < a->live.count && found == NULL; i++)
            if (a->live.items[i]->deferred) found = a->live.items[i];
        a->deferred--;
        if (found == NULL) continue;
        found->deferred = 0;
        nd_cuda_raw_free(dev, found->ptr, found->size);
    }
}

/* Moves pool p's free blocks of one list back to the cache (tag 0): they are
 * one run of the list, which re-sorts them among the cache's. */
static void dissolve_free_list(nd_device *dev, block_vec *v, int graph_pool) {
    for (;;) {
        cuda_block key = {NULL, 0, 0, 0, NULL, NULL, 0, 0, 1, graph_pool, 0};
        int64_t at = lower_bound(v, &key, by_size_less);
        if (at >= v->count || v->items[at]->graph_pool != graph_pool) return;
        cuda_block *b = v->items[at];
        free_remove(dev, b);
        b->graph_pool = 0;
        free_insert(dev, b); /* fits: the list just held it */
    }
}

void nd_cuda_allocator_dissolve_pool(nd_device *dev, int graph_pool) {
    cuda_allocator *a = allocator_of(dev);
    for (int pool = 0; pool < POOL_COUNT; pool++)
        dissolve_free_list(dev, &a->free_blocks[pool], graph_pool);
    /* Blocks still held by tensors return to the cache when those are freed. */
    for (int64_t i = 0; i < a->live.count; i++)
        if (a->live.items[i]->graph_pool == graph_pool) a->live.items[i]->graph_pool = 0;
}
