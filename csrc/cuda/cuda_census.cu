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
 * The driver's virtual memory calls behind expandable segments
 * (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
 * cuMemRelease, cuMemAddressFree, cuMemGetAllocationGranularity) are here
 * too, loaded from libcuda.so.1 at run time (dlopen, as cuBLAS is) so that
 * the extension needs no libcuda to import; a simulated build takes the
 * simulator's (sim/cuda.h). Mapping a chunk counts as a device malloc,
 * unmapping one as a device free.
 *
 * Plain counters, no locks: the host serialises calls (the GIL). Never
 * prints, exits or aborts.
 */
#include "cuda_common.cuh"

#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
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

int nd_cuda_current_ordinal(void) { return current_ordinal; }

static nd_cuda_work *here(void) { return &census[current_ordinal]; }

/* Work queued on the legacy default stream (0, cudaStreamLegacy): none of
 * needle's should be, since a capture of needle's stream would miss it. */
static void count_stream(cudaStream_t stream) {
    if (stream == NULL || stream == cudaStreamLegacy) here()->legacy_stream_work++;
}

void nd_cuda_count_launch(const char *site, const void *stream) {
    here()->kernel_launches++;
    count_stream((cudaStream_t)stream);
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
    /* On needle's stream, behind the kernels that wrote the data: a plain
     * cudaMemcpy would go to the legacy stream, which does not wait for a
     * non-blocking one. */
    cudaStream_t stream = nd_cuda_stream();
    cudaError_t err = cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream);
    return err != cudaSuccess ? err : cudaStreamSynchronize(stream);
}

cudaError_t nd_cuda_copy_from_host(void *device, const void *host, size_t bytes) {
    nd_cuda_work *w = here();
    w->h2d_copies++;
    w->h2d_bytes += (int64_t)bytes;
    w->host_syncs++;
    /* Synchronous, as cudaMemcpy from pageable memory was: the caller may
     * reuse its buffer on return. */
    cudaStream_t stream = nd_cuda_stream();
    cudaError_t err = cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream);
    return err != cudaSuccess ? err : cudaStreamSynchronize(stream);
}

cudaError_t nd_cuda_copy_from_pinned(void *device, const void *pinned, size_t bytes,
                                     cudaStream_t stream) {
    nd_cuda_work *w = here();
    w->h2d_copies++;
    w->h2d_bytes += (int64_t)bytes;
    count_stream(stream);
    return cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice, stream);
}

cudaError_t nd_cuda_copy_on_device(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
    here()->d2d_copies++;
    count_stream(stream);
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

cudaError_t nd_cuda_memset(void *ptr, int value, size_t bytes, cudaStream_t stream) {
    here()->memsets++;
    count_stream(stream);
    return cudaMemsetAsync(ptr, value, bytes, stream);
}

cudaError_t nd_cuda_stream_sync(cudaStream_t stream) {
    here()->host_syncs++;
    return cudaStreamSynchronize(stream);
}

cudaError_t nd_cuda_synchronize(void) {
    here()->host_syncs++;
    return cudaDeviceSynchronize();
}

cudaError_t nd_cuda_graph_launch(cudaGraphExec_t exec, int64_t nodes, cudaStream_t stream) {
    nd_cuda_work *w = here();
    w->graph_launches++;
    w->graph_nodes += nodes;
    return cudaGraphLaunch(exec, stream);
}

cudaError_t nd_cuda_event_wait(cudaEvent_t event) {
    cudaError_t err = cudaEventQuery(event);
    if (err != cudaErrorNotReady) return err;
    here()->host_syncs++;
    return cudaEventSynchronize(event);
}

/* ------------------------------------- the driver's virtual memory calls */

typedef CUresult (*granularity_fn)(size_t *, const CUmemAllocationProp *,
                                   CUmemAllocationGranularity_flags);
typedef CUresult (*address_reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                       unsigned long long);
typedef CUresult (*address_free_fn)(CUdeviceptr, size_t);
typedef CUresult (*mem_create_fn)(CUmemGenericAllocationHandle *, size_t,
                                  const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*mem_release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*mem_map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                               unsigned long long);
typedef CUresult (*mem_unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*set_access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*error_name_fn)(CUresult, const char **);

/* Loaded once (the host serialises calls); ok stays 0 with the reason in
 * why when the driver lacks them. */
static struct {
    int tried, ok;
    char why[192];
    granularity_fn granularity;
    address_reserve_fn address_reserve;
    address_free_fn address_free;
    mem_create_fn create;
    mem_release_fn release;
    mem_map_fn map;
    mem_unmap_fn unmap;
    set_access_fn set_access;
    error_name_fn error_name;
} vm;

static int vm_load(void) {
    if (vm.tried) return vm.ok;
    vm.tried = 1;
#ifdef NEEDLE_CUDA_SIM
    vm.granularity = cuMemGetAllocationGranularity;
    vm.address_reserve = cuMemAddressReserve;
    vm.address_free = cuMemAddressFree;
    vm.create = cuMemCreate;
    vm.release = cuMemRelease;
    vm.map = cuMemMap;
    vm.unmap = cuMemUnmap;
    vm.set_access = cuMemSetAccess;
    vm.error_name = cuGetErrorName;
#else
    /* The runtime has loaded the driver already; this finds the same copy. Not
     * linked, so that the extension never needs libcuda to import. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *why = dlerror();
        snprintf(vm.why, sizeof vm.why, "libcuda.so.1 could not be loaded: %s",
                 why != NULL ? why : "no reason given");
        return 0;
    }
    vm.granularity = (granularity_fn)dlsym(lib, "cuMemGetAllocationGranularity");
    vm.address_reserve = (address_reserve_fn)dlsym(lib, "cuMemAddressReserve");
    vm.address_free = (address_free_fn)dlsym(lib, "cuMemAddressFree");
    vm.create = (mem_create_fn)dlsym(lib, "cuMemCreate");
    vm.release = (mem_release_fn)dlsym(lib, "cuMemRelease");
    vm.map = (mem_map_fn)dlsym(lib, "cuMemMap");
    vm.unmap = (mem_unmap_fn)dlsym(lib, "cuMemUnmap");
    vm.set_access = (set_access_fn)dlsym(lib, "cuMemSetAccess");
    vm.error_name = (error_name_fn)dlsym(lib, "cuGetErrorName");
    if (!vm.granularity || !vm.address_reserve || !vm.address_free || !vm.create || !vm.release ||
        !vm.map || !vm.unmap || !vm.set_access) {
        snprintf(vm.why, sizeof vm.why, "the driver (libcuda.so.1) lacks the virtual memory calls");
        return 0;
    }
#endif
    vm.ok = 1;
    return 1;
}

static nd_status vm_fail(CUresult err, const char *call, int line) {
    const char *name = NULL;
    if (vm.error_name == NULL || vm.error_name(err, &name) != CUDA_SUCCESS || name == NULL)
        name = "an unknown driver error";
    if (err == CUDA_ERROR_OUT_OF_MEMORY)
        return nd_fail(ND_ERR_OOM, "%s failed: the GPU is out of memory (%s)", call, name);
    return nd_fail(ND_ERR_BACKEND, "CUDA driver error %s (%d) at %s:%d: %s", name, (int)err,
                   __FILE__, line, call);
}

#define VM_CHECK(call)                                                         \
    do {                                                                       \
        CUresult vm_err_ = (call);                                             \
        if (vm_err_ != CUDA_SUCCESS) return vm_fail(vm_err_, #call, __LINE__); \
    } while (0)

static CUmemAllocationProp vm_prop(int ordinal) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    return prop;
}

nd_status nd_cuda_vm_granularity(int ordinal, int64_t *out) {
    *out = 0;
    if (!vm_load())
        return nd_fail(ND_ERR_VALUE, "the driver's virtual memory calls are not available: %s",
                       vm.why);
    CUmemAllocationProp prop = vm_prop(ordinal);
    size_t granularity = 0;
    CUresult err = vm.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (err != CUDA_SUCCESS || granularity == 0)
        return nd_fail(ND_ERR_VALUE,
                       "GPU %d does not support the driver's virtual memory calls "
                       "(cuMemGetAllocationGranularity failed with %d)",
                       ordinal, (int)err);
    *out = (int64_t)granularity;
    return ND_OK;
}

nd_status nd_cuda_vm_reserve(int64_t bytes, int64_t alignment, char **out) {
    *out = NULL;
    CUdeviceptr base = 0;
    VM_CHECK(vm.address_reserve(&base, (size_t)bytes, (size_t)alignment, 0, 0));
    *out = (char *)(uintptr_t)base;
    return ND_OK;
}

nd_status nd_cuda_vm_release(char *base, int64_t bytes) {
    VM_CHECK(vm.address_free((CUdeviceptr)(uintptr_t)base, (size_t)bytes));
    return ND_OK;
}

nd_status nd_cuda_vm_map(int ordinal, char *ptr, int64_t bytes, unsigned long long *handle) {
    CUmemAllocationProp prop = vm_prop(ordinal);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)ptr;
    here()->device_mallocs++;
    VM_CHECK(vm.create(&h, (size_t)bytes, &prop, 0));
    CUresult err = vm.map(at, (size_t)bytes, 0, h, 0);
    if (err == CUDA_SUCCESS) {
        CUmemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        err = vm.set_access(at, (size_t)bytes, &access, 1);
        if (err != CUDA_SUCCESS) (void)vm.unmap(at, (size_t)bytes);
    }
    if (err != CUDA_SUCCESS) {
        (void)vm.release(h);
        return vm_fail(err, "cuMemMap/cuMemSetAccess of a new chunk", __LINE__);
    }
    *handle = h;
    return ND_OK;
}

nd_status nd_cuda_vm_unmap(char *ptr, int64_t bytes, unsigned long long handle) {
    here()->device_frees++;
    VM_CHECK(vm.unmap((CUdeviceptr)(uintptr_t)ptr, (size_t)bytes));
    VM_CHECK(vm.release(handle));
    return ND_OK;
}
