/* cuda_transfer.cu: to_host and from_host of the CUDA backend: moving a
 * strided device view to or from a contiguous, row-major host buffer.
 *
 * A contiguous view is one cudaMemcpy. A strided view is compacted on the
 * device through a scratch block from the GPU's caching allocator (reserved,
 * never counted as allocated) and then copied; when the view touches a range
 * of memory not much larger than itself (or no scratch can be had under the
 * memory limit), the touched range is copied instead and gathered or
 * scattered on the host. A device-to-host cudaMemcpy is synchronous, so
 * to_host returns with the data in place; it then reports the bad indices
 * the GPU's kernels found since the last synchronisation (cuda_gather.cu).
 *
 * from_host does not make the host wait for the GPU when it can help it: a
 * cudaMemcpy from pageable memory first synchronises the stream (CUDA's API
 * synchronisation rules), which in a training step would stall the host once
 * per batch uploaded. Uploads up to STAGE_BYTES are copied into a ring of
 * page-locked staging buffers instead and sent with cudaMemcpyAsync; a slot
 * is reused once the event recorded after its copy has completed (by then,
 * normally, long ago). Larger uploads, or any when page-locked memory cannot
 * be had, fall back to the synchronous copy.
 */
#include "cuda_common.cuh"

#include <stdlib.h>
#include <string.h>

/* Views whose touched range is at most this many elements beyond twice
 * their size go through the host. */
#define HOST_SLACK ((int64_t)1 << 16)

/* Walks a collapsed space in row-major order: the offset (elements, relative
 * to the view's first element) of each position, in turn. */
typedef struct host_walk {
    const nd_cuda_iter *it;
    int64_t index[ND_MAX_DIMS];
    int64_t offset;
} host_walk;

static void walk_next(host_walk *w) {
    const nd_cuda_iter *it = w->it;
    for (int d = it->ndim - 1; d >= 0; d--) {
        w->offset += it->strides[0][d];
        if (++w->index[d] < it->shape[d]) return;
        w->offset -= it->strides[0][d] * it->shape[d];
        w->index[d] = 0;
    }
}

/* host[i] = view element i (es bytes each); base is the view's first element. */
static void host_gather(const nd_cuda_iter *it, const char *base, char *host, size_t es) {
    host_walk w = {it, {0}, 0};
    for (int64_t i = 0; i < it->numel; i++, walk_next(&w))
        memcpy(host + (size_t)i * es, base + w.offset * (int64_t)es, es);
}

static void host_scatter(const nd_cuda_iter *it, char *base, const char *host, size_t es) {
    host_walk w = {it, {0}, 0};
    for (int64_t i = 0; i < it->numel; i++, walk_next(&w))
        memcpy(base + w.offset * (int64_t)es, host + (size_t)i * es, es);
}

/* A scratch block of nbytes, or NULL when none can be had. */
static void *scratch_alloc(nd_device *dev, int64_t nbytes) {
    void *p = NULL;
    if (dev == NULL || nd_cuda_raw_alloc(dev, nbytes, &p) != ND_OK) return NULL;
    return p;
}

static void scratch_free(nd_device *dev, void *p, int64_t nbytes) {
    nd_cuda_raw_free(dev, p, nbytes);
}

/* dst (dst_layout) = src (src_layout) on the device, both of dtype: the
 * float32 copy kernel, or the converter (a same-dtype conversion moves bits). */
static nd_status copy_view(const nd_layout *dst_layout, void *dst, const nd_layout *src_layout,
                           const void *src, nd_dtype dtype) {
    if (dtype != ND_FLOAT32)
        return nd_cuda_convert(dst_layout, dst, dtype, src_layout, src, dtype, 0.0);
    nd_kernel_operand view = {src, src_layout, 0.0};
    return nd_cuda_copy(dst_layout, dst, view);
}

/* ------------------------------------------------------ the staging ring */

#define STAGE_SLOTS 4
#define STAGE_BYTES ((size_t)1 << 20)

typedef struct stage_slot {
    void *pinned; /* STAGE_BYTES of page-locked host memory */
    cudaEvent_t done;
} stage_slot;

typedef struct stage_ring {
    stage_slot slots[STAGE_SLOTS];
    int next;
    int broken; /* page-locked memory or an event could not be had: copy synchronously */
} stage_ring;

static stage_ring rings[ND_CUDA_MAX_DEVICES];

/* The next slot of dev's ring, ready to be written, or NULL. */
static stage_slot *stage_take(nd_device *dev) {
    stage_ring *r = &rings[dev->ordinal];
    if (r->broken) return NULL;
    stage_slot *s = &r->slots[r->next];
    if (s->pinned == NULL) {
        if (cudaMallocHost(&s->pinned, STAGE_BYTES) != cudaSuccess) {
            (void)cudaGetLastError();
            s->pinned = NULL;
            r->broken = 1;
            return NULL;
        }
        if (cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            (void)cudaFreeHost(s->pinned);
            s->pinned = NULL;
            r->broken = 1;
            return NULL;
        }
    } else if (nd_cuda_event_wait(s->done) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    r->next = (r->next + 1) % STAGE_SLOTS;
    return s;
}

/* bytes from host to device memory at dst, without a host sync when staged. */
static cudaError_t upload(nd_device *dev, void *dst, const void *host, size_t bytes) {
    stage_slot *s = bytes <= STAGE_BYTES && dev != NULL ? stage_take(dev) : NULL;
    if (s == NULL) return nd_cuda_copy_from_host(dst, host, bytes);
    memcpy(s->pinned, host, bytes);
    cudaStream_t stream = nd_cuda_stream();
    cudaError_t err = nd_cuda_copy_from_pinned(dst, s->pinned, bytes, stream);
    if (err != cudaSuccess) return err;
    return cudaEventRecord(s->done, stream);
}

/* The touched range of the view, copied to a host buffer, gathered. */
static nd_status to_host_through_range(const nd_layout *l, const nd_cuda_iter *it, const void *src,
                                       size_t es, void *host) {
    int64_t lo, hi;
    nd_layout_extent(l, &lo, &hi);
    char *range = (char *)malloc((size_t)(hi - lo) * es);
    if (range == NULL) return nd_fail(ND_ERR_OOM, "out of host memory for a device transfer");
    cudaError_t err =
        nd_cuda_copy_to_host(range, (const char *)src + lo * (int64_t)es, (size_t)(hi - lo) * es);
    if (err == cudaSuccess)
        host_gather(it, range + (l->offset - lo) * (int64_t)es, (char *)host, es);
    free(range);
    ND_CUDA_CHECK(err);
    return ND_OK;
}

/* The view into host; dev's GPU is current. */
static nd_status view_to_host(nd_device *dev, const nd_layout *src_layout, const nd_cuda_iter &it,
                              const void *src, nd_dtype dtype, void *host) {
    const size_t es = (size_t)nd_dtype_size(dtype);
    const char *first = (const char *)src + src_layout->offset * (int64_t)es;
    if (it.ndim == 1 && it.strides[0][0] == 1) {
        ND_CUDA_CHECK(nd_cuda_copy_to_host(host, first, (size_t)it.numel * es));
        return ND_OK;
    }
    int64_t lo, hi;
    nd_layout_extent(src_layout, &lo, &hi);
    const int64_t nbytes = it.numel * (int64_t)es;
    void *scratch = hi - lo <= 2 * it.numel + HOST_SLACK ? NULL : scratch_alloc(dev, nbytes);
    if (scratch == NULL) return to_host_through_range(src_layout, &it, src, es, host);
    /* Compact on the device, then one copy. */
    nd_layout packed;
    nd_layout_contiguous(src_layout->ndim, src_layout->shape, &packed);
    nd_status status = copy_view(&packed, scratch, src_layout, src, dtype);
    cudaError_t err = cudaSuccess;
    if (status == ND_OK) err = nd_cuda_copy_to_host(host, scratch, (size_t)nbytes);
    scratch_free(dev, scratch, nbytes);
    ND_TRY(status);
    ND_CUDA_CHECK(err);
    return ND_OK;
}

/* Transfers with the host cannot be part of a CUDA graph: one to the host
 * waits for the GPU, and one from the host would be replayed from a staging
 * buffer that other copies reuse, not from the caller's data. Refused before
 * anything is queued, so the capture stays valid. */
static nd_status refuse_in_capture(nd_device *dev, const char *what) {
    if (!nd_cuda_graph_capturing(dev->ordinal)) return ND_OK;
    return nd_fail(ND_ERR_BACKEND,
                   "%s cannot be captured in a CUDA graph on %s:%d: do it before the capture "
                   "or between replays (copy_ new inputs into the graph's static tensors)",
                   what, dev->name, dev->ordinal);
}

nd_status nd_cuda_to_host(const nd_layout *src_layout, const void *src, nd_dtype dtype,
                          void *host) {
    if (nd_dtype_size(dtype) == 0) return nd_backend_lacks_dtype("cuda", "a transfer", dtype);
    const nd_layout *layouts[1] = {src_layout};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, src_layout->ndim, src_layout->shape, 1, layouts);
    if (it.numel == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(src, &dev));
    ND_TRY(refuse_in_capture(dev, "a copy to the host (.numpy(), printing, a Python number)"));
    ND_TRY(view_to_host(dev, src_layout, it, src, dtype, host));
    /* The copy waited for the GPU: errors its kernels found are reported now. */
    return nd_cuda_index_errors(dev);
}

/* The touched range read, patched on the host, written back (synchronous,
 * so the elements between the view's are written back unchanged). */
static nd_status from_host_through_range(const nd_layout *l, const nd_cuda_iter *it, void *dst,
                                         size_t es, const void *host) {
    int64_t lo, hi;
    nd_layout_extent(l, &lo, &hi);
    size_t bytes = (size_t)(hi - lo) * es;
    char *range = (char *)malloc(bytes);
    if (range == NULL) return nd_fail(ND_ERR_OOM, "out of host memory for a device transfer");
    char *first = (char *)dst + lo * (int64_t)es;
    cudaError_t err = nd_cuda_copy_to_host(range, first, bytes);
    if (err == cudaSuccess) {
        host_scatter(it, range + (l->offset - lo) * (int64_t)es, (const char *)host, es);
        err = nd_cuda_copy_from_host(first, range, bytes);
    }
    free(range);
    ND_CUDA_CHECK(err);
    return ND_OK;
}

nd_status nd_cuda_from_host(const nd_layout *dst_layout, void *dst, nd_dtype dtype,
                            const void *host) {
    if (nd_dtype_size(dtype) == 0) return nd_backend_lacks_dtype("cuda", "a transfer", dtype);
    const size_t es = (size_t)nd_dtype_size(dtype);
    const nd_layout *layouts[1] = {dst_layout};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, dst_layout->ndim, dst_layout->shape, 1, layouts);
    if (it.numel == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(dst, &dev));
    ND_TRY(refuse_in_capture(dev, "a copy from the host (a new tensor from NumPy or a list, "
                                  "a host random draw, copy_ of host data)"));
    char *first = (char *)dst + dst_layout->offset * (int64_t)es;
    const int64_t nbytes = it.numel * (int64_t)es;
    if (it.ndim == 1 && it.strides[0][0] == 1) {
        ND_CUDA_CHECK(upload(dev, first, host, (size_t)nbytes));
        return ND_OK;
    }
    void *scratch = scratch_alloc(dev, nbytes);
    if (scratch == NULL) return from_host_through_range(dst_layout, &it, dst, es, host);
    /* One copy up, then a strided copy kernel into the view. The scratch block
     * goes back to the cache at once: later kernels on the stream run after
     * this one. */
    nd_status status = ND_OK;
    cudaError_t err = upload(dev, scratch, host, (size_t)nbytes);
    if (err == cudaSuccess) {
        nd_layout packed;
        nd_layout_contiguous(dst_layout->ndim, dst_layout->shape, &packed);
        status = copy_view(dst_layout, dst, &packed, scratch, dtype);
    }
    scratch_free(dev, scratch, nbytes);
    ND_CUDA_CHECK(err);
    return status;
}
