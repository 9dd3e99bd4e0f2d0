/* sim_vm.cc: the simulated GPU's virtual memory API (sim/cuda.h): address
 * ranges reserved with cuMemAddressReserve, physical chunks made by
 * cuMemCreate and charged against the simulated capacity (the same budget
 * cudaMalloc draws on), mapped into a reserved range by cuMemMap, made
 * usable by cuMemSetAccess, and given back by cuMemUnmap, cuMemRelease and
 * cuMemAddressFree, with the driver's checks (granularity, overlaps, a chunk
 * mapped once, a range freed only when nothing is mapped in it).
 *
 * A reserved range is host address space without memory (an anonymous
 * PROT_NONE mapping), so reserving more than the capacity costs nothing, as
 * on a GPU; a chunk's pages become readable and writable when their access
 * is set, filled with 0xFF bytes (float NaN) as cudaMalloc's blocks are, and
 * their memory goes back to the host when they are unmapped. Copies and
 * memsets accept ranges that lie in accessible mapped chunks
 * (nd_sim_vm_mapped). Creating, mapping, unmapping and releasing chunks are
 * refused during a stream capture as cudaMalloc and cudaFree are
 * (nd_sim_unsafe): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. Never prints,
 * exits or aborts.
 */
#include "cuda.h"
#include "sim_internal.h"

#include <string.h>
#include <sys/mman.h>

#include <map>
#include <mutex>

namespace {

constexpr size_t kGranularity = (size_t)2 << 20; /* a GPU's 2 MiB pages */

struct chunk {
    size_t size;
    uintptr_t mapped_at; /* 0: not mapped */
    bool released;       /* cuMemRelease'd: freed when unmapped */
};

struct mapping {
    size_t size;
    CUmemGenericAllocationHandle handle;
    bool accessible;
};

std::mutex vm_mutex;
std::map<uintptr_t, size_t> reservations; /* start -> size */
std::map<CUmemGenericAllocationHandle, chunk> chunks;
std::map<uintptr_t, mapping> mappings; /* start -> its chunk */
CUmemGenericAllocationHandle next_handle = 1;

CUresult fail(CUresult code, const char *what) {
    (void)nd_sim_fail(code == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation
                                                       : cudaErrorInvalidValue,
                      "%s", what);
    (void)cudaGetLastError(); /* the driver API has no last-error slot */
    return code;
}

/* The capture-mode rule (sim_graph.cc) for a call that changes device memory. */
bool capture_forbids(const char *call) {
    if (nd_sim_unsafe(call) == cudaSuccess) return false;
    (void)cudaGetLastError(); /* the driver API has no last-error slot */
    return true;
}

bool prop_valid(const CUmemAllocationProp *prop) {
    return prop != nullptr && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id == 0;
}

/* The reservation that holds [p, p + n) whole, or reservations.end(). */
std::map<uintptr_t, size_t>::iterator reservation_of(uintptr_t p, size_t n) {
    auto it = reservations.upper_bound(p);
    if (it == reservations.begin()) return reservations.end();
    --it;
    if (p - it->first >= it->second || n > it->second - (p - it->first)) return reservations.end();
    return it;
}

/* Whether any mapping overlaps [p, p + n). */
bool overlaps_mapping(uintptr_t p, size_t n) {
    auto it = mappings.lower_bound(p + n);
    if (it == mappings.begin()) return false;
    --it;
    return it->first + it->second.size > p;
}

} // namespace

int nd_sim_vm_mapped(const void *p, size_t n) {
    std::lock_guard<std::mutex> lock(vm_mutex);
    uintptr_t at = (uintptr_t)p, end = at + n;
    /* Adjacent chunks make one usable range, as on a GPU. */
    while (at < end) {
        auto it = mappings.upper_bound(at);
        if (it == mappings.begin()) return 0;
        --it;
        if (at - it->first >= it->second.size || !it->second.accessible) return 0;
        at = it->first + it->second.size;
    }
    return 1;
}

extern "C" {

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option) {
    if (!nd_sim_get_options()->vmm)
        return fail(CUDA_ERROR_NOT_SUPPORTED, "cuMemGetAllocationGranularity: NEEDLE_SIM_VMM=0");
    if (granularity == nullptr || !prop_valid(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: bad arguments");
    *granularity = kGranularity;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    if (!nd_sim_get_options()->vmm)
        return fail(CUDA_ERROR_NOT_SUPPORTED, "cuMemAddressReserve: NEEDLE_SIM_VMM=0");
    if (ptr == nullptr || size == 0 || size % kGranularity != 0 || addr != 0 || flags != 0 ||
        (alignment != 0 && alignment != kGranularity))
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: bad arguments");
    void *p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAddressReserve: no room");
    std::lock_guard<std::mutex> lock(vm_mutex);
    reservations[(uintptr_t)p] = size;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    std::lock_guard<std::mutex> lock(vm_mutex);
    auto it = reservations.find((uintptr_t)ptr);
    if (it == reservations.end() || it->second != size)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree: not a reserved range");
    if (overlaps_mapping((uintptr_t)ptr, size))
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree: chunks are still mapped in it");
    munmap((void *)(uintptr_t)ptr, size);
    reservations.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    if (capture_forbids("cuMemCreate")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!nd_sim_get_options()->vmm)
        return fail(CUDA_ERROR_NOT_SUPPORTED, "cuMemCreate: NEEDLE_SIM_VMM=0");
    if (handle == nullptr || size == 0 || size % kGranularity != 0 || !prop_valid(prop) ||
        flags != 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: bad arguments");
    if (!nd_sim_charge((int64_t)size))
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate: the simulated GPU is out of memory");
    std::lock_guard<std::mutex> lock(vm_mutex);
    *handle = next_handle++;
    chunks[*handle] = chunk{size, 0, false};
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    if (capture_forbids("cuMemRelease")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    std::lock_guard<std::mutex> lock(vm_mutex);
    auto it = chunks.find(handle);
    if (it == chunks.end() || it->second.released)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemRelease: not a live handle");
    if (it->second.mapped_at != 0) {
        it->second.released = true; /* the memory goes when it is unmapped */
        return CUDA_SUCCESS;
    }
    nd_sim_uncharge((int64_t)it->second.size);
    chunks.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    if (capture_forbids("cuMemMap")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    std::lock_guard<std::mutex> lock(vm_mutex);
    auto c = chunks.find(handle);
    uintptr_t p = (uintptr_t)ptr;
    if (c == chunks.end() || c->second.released || c->second.mapped_at != 0 || offset != 0 ||
        flags != 0 || size != c->second.size)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemMap: bad handle, size or flags");
    auto r = reservation_of(p, size);
    if (r == reservations.end() || (p - r->first) % kGranularity != 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemMap: not an aligned part of a reserved range");
    if (overlaps_mapping(p, size))
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemMap: the range is already mapped");
    c->second.mapped_at = p;
    mappings[p] = mapping{size, handle, false};
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (desc == nullptr || count == 0 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        desc->location.id != 0 || desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: bad access descriptor");
    std::lock_guard<std::mutex> lock(vm_mutex);
    uintptr_t p = (uintptr_t)ptr, end = p + size;
    /* The whole range must be mapped chunks, starting at a chunk. */
    for (uintptr_t at = p; at < end;) {
        auto it = mappings.find(at);
        if (it == mappings.end() || it->second.size > end - at)
            return fail(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: the range is not mapped");
        at += it->second.size;
    }
    if (mprotect((void *)p, size, PROT_READ | PROT_WRITE) != 0)
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemSetAccess: the host refused the pages");
    for (uintptr_t at = p; at < end; at += mappings[at].size) {
        if (!mappings[at].accessible) memset((void *)at, 0xFF, mappings[at].size);
        mappings[at].accessible = true;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (capture_forbids("cuMemUnmap")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    std::lock_guard<std::mutex> lock(vm_mutex);
    uintptr_t p = (uintptr_t)ptr, end = p + size;
    for (uintptr_t at = p; at < end;) {
        auto it = mappings.find(at);
        if (it == mappings.end() || it->second.size > end - at)
            return fail(CUDA_ERROR_INVALID_VALUE, "cuMemUnmap: not whole mapped chunks");
        at += it->second.size;
    }
    /* The pages' memory goes back to the host; touching them again faults. */
    madvise((void *)p, size, MADV_DONTNEED);
    mprotect((void *)p, size, PROT_NONE);
    for (uintptr_t at = p; at < end;) {
        auto it = mappings.find(at);
        auto c = chunks.find(it->second.handle);
        at += it->second.size;
        c->second.mapped_at = 0;
        if (c->second.released) {
            nd_sim_uncharge((int64_t)c->second.size);
            chunks.erase(c);
        }
        mappings.erase(it);
    }
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
        *name = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
        break;
    default: *name = nullptr; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

} /* extern "C" */
