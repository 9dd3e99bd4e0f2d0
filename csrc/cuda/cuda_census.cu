/* cuda_census.cu: the census of the GPU work the backend asks for, and the
 * one place where the backend calls the CUDA runtime for memory, copies and
 * waits, so that each such call is counted where it is made.
 *
 * Counted per GPU (the one current on the calling thread, which the backend
 * sets with nd_cuda_set_device before it works on a GPU): kernel launches
 * (ND_LAUNCH calls nd_cuda_count_launch, with its call site, so that the
 * launches can also be told apart by kernel), memsets, device-to-device copies,
 * cuBLAS calls, host synchronisations, device mallocs and frees, and the
 * copies and bytes in each direction. The same calls are counted on a real
 * GPU and on the simulator, so CI sees a step's GPU work without a GPU.
 *
 * What counts as a host synchronisation follows CUDA's documented API
 * synchronisation behaviour: a device-to-host copy returns only when the copy
 * is done; a cudaMemcpy from pageable host memory to the device performs a
 * stream sync first; cudaFree and the synchronize calls wait for the device.
 * A cudaMemcpyAsync from pinned memory does not wait, and neither does a
 * wait on an event that has already completed.
 *
 * Plain counters, no locks: the host serialises calls (the GIL). Never
 * prints, exits or aborts.
 */
#include "cuda_common.cuh"

#include <string.h>

static nd_cuda_work census[ND_CUDA_MAX_DEVICES];

/* Launches by call site: an open-addressed table keyed by the site's string
 * literal (one per ND_LAUNCH, so the pointer is the key). Sites past its
 * size are counted in the totals only. */
#define SITE_SLOTS 256
typedef struct site_count {
    const char *site;
    int64_t count;
} site_count;
static site_count sites[ND_CUDA_MAX_DEVICES][SITE_SLOTS];
/* The GPU the calling thread works on: CUDA's current device is per thread. */
static thread_local int current_ordinal = 0;

void nd_cuda_census_set_current(int ordinal) {
    if (ordinal >= 0 && ordinal < ND_CUDA_MAX_DEVICES) current_ordinal = ordinal;
}

static nd_cuda_work *here(void) { return &census[current_ordinal]; }

void nd_cuda_count_launch(const char *site) {
    here()->kernel_launches++;
    site_count *table = sites[current_ordinal];
    uintptr_t h = ((uintptr_t)site >> 3) * (uintptr_t)0x9E3779B97F4A7C15ull;
    for (int probe = 0; probe < SITE_SLOTS; probe++) {
        site_count *s = &table[(h + (uintptr_t)probe) % SITE_SLOTS];
        if (s->site == site || s->site == NULL) {
            s->site = site;
            s->count++;
            return;
        }
    }
}

extern "C" int nd_cuda_work_sites(int ordinal, const char **names, int64_t *counts, int max) {
    if (!nd_cuda_registered(ordinal)) return 0;
    int n = 0;
    for (int i = 0; i < SITE_SLOTS && n < max; i++)
        if (sites[ordinal][i].site != NULL && sites[ordinal][i].count > 0) {
            names[n] = sites[ordinal][i].site;
            counts[n] = sites[ordinal][i].count;
            n++;
        }
    return n;
}

void nd_cuda_count_blas(void) { here()->blas_calls++; }

extern "C" nd_status nd_cuda_work_get(int ordinal, nd_cuda_work *out) {
    memset(out, 0, sizeof *out);
    if (!nd_cuda_registered(ordinal))
        return nd_fail(ND_ERR_DEVICE, "there is no CUDA device %d", ordinal);
    *out = census[ordinal];
    return ND_OK;
}

extern "C" nd_status nd_cuda_work_reset(int ordinal) {
    if (!nd_cuda_registered(ordinal))
        return nd_fail(ND_ERR_DEVICE, "there is no CUDA device %d", ordinal);
    memset(&census[ordinal], 0, sizeof census[ordinal]);
    for (int i = 0; i < SITE_SLOTS; i++) sites[ordinal][i].count = 0;
    return ND_OK;
}

/* ------------------------------------------------- the counted runtime calls */

cudaError_t nd_cuda_malloc(void **ptr, size_t bytes) {
    here()->device_mallocs++;
    return cudaMalloc(ptr, bytes);
}

cudaError_t nd_cuda_free(void *ptr) {
    here()->device_frees++;
    here()->host_syncs++;
    return cudaFree(ptr);
}

cudaError_t nd_cuda_copy_to_host(void *host, const void *device, size_t bytes) {
    nd_cuda_work *w = here();
    w->d2h_copies++;
    w->d2h_bytes += (int64_t)bytes;
    w->host_syncs++;
    return cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost);
}

cudaError_t nd_cuda_copy_from_host(void *device, const void *host, size_t bytes) {
    nd_cuda_work *w = here();
    w->h2d_copies++;
    w->h2d_bytes += (int64_t)bytes;
    w->host_syncs++;
    return cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice);
}

cudaError_t nd_cuda_copy_from_pinned(void *device, const void *pinned, size_t bytes,
                                     cudaStream_t stream) {
    nd_cuda_work *w = here();
    w->h2d_copies++;
    w->h2d_bytes += (int64_t)bytes;
    return cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice, stream);
}

cudaError_t nd_cuda_copy_on_device(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
    here()->d2d_copies++;
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

cudaError_t nd_cuda_memset(void *ptr, int value, size_t bytes, cudaStream_t stream) {
    here()->memsets++;
    return cudaMemsetAsync(ptr, value, bytes, stream);
}

cudaError_t nd_cuda_synchronize(void) {
    here()->host_syncs++;
    return cudaDeviceSynchronize();
}

cudaError_t nd_cuda_event_wait(cudaEvent_t event) {
    cudaError_t err = cudaEventQuery(event);
    if (err != cudaErrorNotReady) return err;
    here()->host_syncs++;
    return cudaEventSynchronize(event);
}
