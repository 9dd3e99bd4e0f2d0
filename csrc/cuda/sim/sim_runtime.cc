/* sim_runtime.cc: the host side of the CUDA simulator: one simulated GPU, its
 * memory (host memory with a capacity, so that running out of it is real),
 * device queries, the per-thread last error with CUDA's names and strings,
 * and streams and events that exist and are checked but are synchronous
 * (everything has finished when the call that started it returns). What a
 * stream capture (sim_graph.cc) changes goes through its hooks: copies and
 * memsets queued on a capturing stream are recorded, not run; the calls that
 * capture restricts ask whether the capture forbids them.
 *
 * Device pointers are host pointers. Every cudaMalloc'd block is kept in a
 * table, so copies and memsets check that the device side of a transfer lies
 * inside one live block or mapped range (sim_vm.cc; cudaErrorInvalidValue
 * otherwise), and freeing a pointer that is not a block's start fails as
 * CUDA does. New blocks are filled with 0xFF bytes (float NaN) so that
 * reading memory nobody wrote shows. Never prints, exits or aborts.
 */
#include "sim_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <map>
#include <mutex>
#include <new>
#include <set>

namespace {

constexpr int64_t kDefaultMemory = (int64_t)4 << 30;
constexpr size_t kAlign = 256; /* cudaMalloc's alignment */
/* An H100's (9.0): the GPU needle is measured on, so that what host code
 * decides by capability (cuBLAS's 32 MiB workspace on Hopper) is what CI runs;
 * NEEDLE_SIM_COMPUTE_CAPABILITY changes it. */
constexpr int kCapabilityMajor = 9, kCapabilityMinor = 0;
constexpr int kMultiprocessors = 4;
constexpr size_t kSharedPerBlock = 48 * 1024;
const char *const kDeviceName = "needle CUDA simulator (CPU)";

/* ------------------------------------------------------------- switches */

/* Parses "<n>[KiB|MiB|GiB]" (also K, M, G, KB, MB, GB as binary units). */
int parse_bytes(const char *text, int64_t *out) {
    errno = 0;
    char *end = nullptr;
    long long n = strtoll(text, &end, 10);
    if (end == text || errno != 0 || n < 0) return 0;
    int64_t unit = 1;
    if (*end == 'K' || *end == 'k') unit = (int64_t)1 << 10;
    else if (*end == 'M' || *end == 'm') unit = (int64_t)1 << 20;
    else if (*end == 'G' || *end == 'g') unit = (int64_t)1 << 30;
    if (unit != 1) {
        end++;
        if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0) end += strlen(end);
    }
    if (*end != '\0' || n > INT64_MAX / unit) return 0;
    *out = (int64_t)n * unit;
    return 1;
}

/* A 0-or-1 switch: *out is left as it is when the variable is unset. */
void read_flag(nd_sim_options *o, const char *name, int *out) {
    const char *value = getenv(name);
    if (value == nullptr || value[0] == '\0') return;
    if (strcmp(value, "0") == 0 || strcmp(value, "1") == 0) {
        *out = value[0] == '1';
    } else {
        o->valid = 0;
        snprintf(o->error, sizeof o->error, "%s=%.64s: expected 0 or 1", name, value);
    }
}

nd_sim_options read_options() {
    nd_sim_options o;
    memset(&o, 0, sizeof o);
    o.valid = 1;
    o.memory = kDefaultMemory;
    const char *memory = getenv("NEEDLE_SIM_MEMORY");
    if (memory != nullptr && memory[0] != '\0' &&
        (!parse_bytes(memory, &o.memory) || o.memory < (int64_t)kAlign)) {
        o.valid = 0;
        snprintf(o.error, sizeof o.error,
                 "NEEDLE_SIM_MEMORY=%.64s: expected a byte count such as 536870912 or 512MiB",
                 memory);
    }
    const char *blocks = getenv("NEEDLE_SIM_MAX_BLOCKS");
    if (blocks != nullptr && blocks[0] != '\0') {
        char *end = nullptr;
        errno = 0;
        long long n = strtoll(blocks, &end, 10);
        if (end == blocks || *end != '\0' || errno != 0 || n < 0) {
            o.valid = 0;
            snprintf(o.error, sizeof o.error,
                     "NEEDLE_SIM_MAX_BLOCKS=%.64s: expected a block count (0: no cap)", blocks);
        } else {
            o.max_blocks = n;
        }
    }
    read_flag(&o, "NEEDLE_SIM_PERTURB", &o.perturb);
    o.vmm = 1;
    read_flag(&o, "NEEDLE_SIM_VMM", &o.vmm);
    o.cc_major = kCapabilityMajor;
    o.cc_minor = kCapabilityMinor;
    const char *cc = getenv("NEEDLE_SIM_COMPUTE_CAPABILITY");
    if (cc != nullptr && cc[0] != '\0') {
        int major = 0, minor = 0, used = 0;
        if (sscanf(cc, "%2d.%1d%n", &major, &minor, &used) == 2 && cc[used] == '\0' && major >= 1 &&
            minor >= 0) {
            o.cc_major = major;
            o.cc_minor = minor;
        } else {
            o.valid = 0;
            snprintf(o.error, sizeof o.error,
                     "NEEDLE_SIM_COMPUTE_CAPABILITY=%.64s: expected <major>.<minor> such as 7.0 "
                     "or 9.0",
                     cc);
        }
    }
    return o;
}

/* --------------------------------------------------------------- errors */

thread_local cudaError_t last_error = cudaSuccess;
/* The detail of the calling thread's latest failure, for cudaGetErrorString. */
thread_local cudaError_t detail_code = cudaSuccess;
thread_local char detail_text[1024];

struct error_entry {
    cudaError_t code;
    const char *name;
    const char *text;
};

const error_entry kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorSystemDriverMismatch, "cudaErrorSystemDriverMismatch",
     "system has unsupported display driver / cuda driver combination"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const error_entry *find_error(cudaError_t code) {
    for (const error_entry &e : kErrors)
        if (e.code == code) return &e;
    return nullptr;
}

/* ---------------------------------------------------------------- memory */

std::mutex memory_mutex;
std::map<uintptr_t, size_t> blocks; /* start -> size, of live cudaMalloc blocks */
int64_t used_bytes = 0;

/* 1 when [p, p + n) lies inside one live block (n >= 1). */
int inside_block(const void *p, size_t n) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    uintptr_t a = (uintptr_t)p;
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return 0;
    --it;
    return a - it->first < it->second && n <= it->second - (a - it->first);
}

cudaError_t check_range(const void *p, size_t n, const char *what, const char *call) {
    if (p == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "%s: the %s pointer is NULL", call, what);
    if (!inside_block(p, n) && !nd_sim_vm_mapped(p, n))
        return nd_sim_fail(cudaErrorInvalidValue,
                           "%s: %zu bytes at %s pointer %p are not inside one cudaMalloc block "
                           "or mapped range",
                           call, n, what, p);
    return cudaSuccess;
}

/* The copy of a cudaMemcpy whose arguments were checked: its device sides are
 * checked again at the time it runs (a graph replays it later). */
cudaError_t copy_now(void *dst, const void *src, size_t count, int dst_device, int src_device) {
    cudaError_t err = cudaSuccess;
    if (dst_device) err = check_range(dst, count, "destination", "cudaMemcpy");
    if (err == cudaSuccess && src_device) err = check_range(src, count, "source", "cudaMemcpy");
    if (err != cudaSuccess) return err;
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t memset_now(void *ptr, int value, size_t count) {
    cudaError_t err = check_range(ptr, count, "device", "cudaMemset");
    if (err != cudaSuccess) return err;
    memset(ptr, value, count);
    return cudaSuccess;
}

/* ------------------------------------------------------ streams, events */

struct sim_event {
    unsigned flags;
    int recorded;
    std::chrono::steady_clock::time_point when;
    int64_t capture; /* the capture it was last recorded into (0: none) */
};

std::mutex handle_mutex;
std::set<cudaStream_t> streams;
std::set<cudaEvent_t> events;

int event_valid(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(handle_mutex);
    return events.count(event) != 0;
}

cudaError_t check_options(const char *call) {
    const nd_sim_options *o = nd_sim_get_options();
    if (o->valid) return cudaSuccess;
    return nd_sim_fail(cudaErrorInvalidValue, "%s: %s", call, o->error);
}

} /* namespace */

/* ============================================================ internals */

const nd_sim_options *nd_sim_get_options(void) {
    static const nd_sim_options options = read_options(); /* C++11: initialised once */
    return &options;
}

int nd_sim_charge(int64_t bytes) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    if (bytes > nd_sim_get_options()->memory - used_bytes) return 0;
    used_bytes += bytes;
    return 1;
}

void nd_sim_uncharge(int64_t bytes) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    used_bytes -= bytes;
}

cudaError_t nd_sim_fail(cudaError_t code, const char *format, ...) {
    last_error = code;
    detail_code = code;
    va_list args;
    va_start(args, format);
    const error_entry *e = find_error(code);
    int n =
        snprintf(detail_text, sizeof detail_text,
                 "%s [needle CUDA simulator: ", e != nullptr ? e->text : "unrecognized error code");
    if (n > 0 && (size_t)n < sizeof detail_text)
        vsnprintf(detail_text + n, sizeof detail_text - (size_t)n, format, args);
    va_end(args);
    size_t len = strlen(detail_text);
    if (len + 1 < sizeof detail_text) {
        detail_text[len] = ']';
        detail_text[len + 1] = '\0';
    }
    return code;
}

int nd_sim_stream_valid(cudaStream_t stream) {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return 1;
    std::lock_guard<std::mutex> lock(handle_mutex);
    return streams.count(stream) != 0;
}

/* A created stream's one byte holds its flags. */
int nd_sim_stream_blocking(cudaStream_t stream) {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return 1;
    std::lock_guard<std::mutex> lock(handle_mutex);
    return streams.count(stream) != 0 &&
           (*(const unsigned char *)stream & cudaStreamNonBlocking) == 0;
}

/* ============================================================ the CUDA API */

extern "C" {

/* --------------------------------------------------------------- errors */

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t error) {
    const error_entry *e = find_error(error);
    return e != nullptr ? e->name : "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t error) {
    if (error != cudaSuccess && error == detail_code) return detail_text;
    const error_entry *e = find_error(error);
    return e != nullptr ? e->text : "unrecognized error code";
}

/* --------------------------------------------------------------- devices */

cudaError_t cudaGetDeviceCount(int *count) {
    if (count == nullptr) return nd_sim_fail(cudaErrorInvalidValue, "cudaGetDeviceCount: NULL");
    *count = 0;
    cudaError_t err = check_options("cudaGetDeviceCount");
    if (err != cudaSuccess) return err;
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (device == nullptr) return nd_sim_fail(cudaErrorInvalidValue, "cudaGetDevice: NULL");
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device != 0)
        return nd_sim_fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): there is one device, 0",
                           device);
    return check_options("cudaSetDevice");
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (prop == nullptr) return nd_sim_fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: NULL");
    if (device != 0)
        return nd_sim_fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d)", device);
    cudaError_t err = check_options("cudaGetDeviceProperties");
    if (err != cudaSuccess) return err;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "%s", kDeviceName);
    prop->totalGlobalMem = (size_t)nd_sim_get_options()->memory;
    prop->sharedMemPerBlock = kSharedPerBlock;
    prop->regsPerBlock = 65536;
    prop->warpSize = warpSize;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 65536;
    prop->major = nd_sim_get_options()->cc_major;
    prop->minor = nd_sim_get_options()->cc_minor;
    prop->multiProcessorCount = kMultiprocessors;
    prop->concurrentKernels = 0; /* launches run one at a time */
    prop->unifiedAddressing = 1;
    prop->memoryBusWidth = 64;
    prop->l2CacheSize = 1 << 20;
    prop->maxThreadsPerMultiProcessor = 1024;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (value == nullptr) return nd_sim_fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute");
    struct cudaDeviceProp p;
    cudaError_t err = cudaGetDeviceProperties(&p, device);
    if (err != cudaSuccess) return err;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrConcurrentKernels: *value = p.concurrentKernels; break;
    case cudaDevAttrUnifiedAddressing: *value = p.unifiedAddressing; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    default:
        return nd_sim_fail(cudaErrorInvalidValue,
                           "cudaDeviceGetAttribute: attribute %d is not simulated", (int)attr);
    }
    return cudaSuccess;
}

/* Launches and copies are synchronous: there is never anything to wait for. */
cudaError_t cudaDeviceSynchronize(void) { return nd_sim_unsafe("cudaDeviceSynchronize"); }

cudaError_t cudaDriverGetVersion(int *version) {
    if (version == nullptr) return nd_sim_fail(cudaErrorInvalidValue, "cudaDriverGetVersion");
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) {
    if (version == nullptr) return nd_sim_fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion");
    *version = CUDART_VERSION;
    return cudaSuccess;
}

/* ---------------------------------------------------------------- memory */

cudaError_t cudaMalloc(void **ptr, size_t size) {
    if (ptr == nullptr) return nd_sim_fail(cudaErrorInvalidValue, "cudaMalloc: NULL result");
    *ptr = nullptr;
    cudaError_t err = nd_sim_unsafe("cudaMalloc");
    if (err != cudaSuccess) return err;
    err = check_options("cudaMalloc");
    if (err != cudaSuccess) return err;
    if (size == 0) return cudaSuccess; /* as CUDA: success, NULL */
    int64_t capacity = nd_sim_get_options()->memory;
    size_t rounded = (size + kAlign - 1) / kAlign * kAlign;
    if (rounded < size || (int64_t)rounded < 0) /* wrapped */
        return nd_sim_fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes", size);
    {
        std::lock_guard<std::mutex> lock(memory_mutex);
        if ((int64_t)rounded > capacity - used_bytes)
            return nd_sim_fail(cudaErrorMemoryAllocation,
                               "cudaMalloc of %zu bytes with %lld of %lld in use", size,
                               (long long)used_bytes, (long long)capacity);
        used_bytes += (int64_t)rounded;
    }
    void *p = aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
        std::lock_guard<std::mutex> lock(memory_mutex);
        used_bytes -= (int64_t)rounded;
        return nd_sim_fail(cudaErrorMemoryAllocation,
                           "cudaMalloc of %zu bytes: the host is out of memory", size);
    }
    memset(p, 0xFF, rounded);
    {
        std::lock_guard<std::mutex> lock(memory_mutex);
        blocks[(uintptr_t)p] = rounded;
    }
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    cudaError_t err = nd_sim_unsafe("cudaFree"); /* even cudaFree(NULL), as CUDA */
    if (err != cudaSuccess) return err;
    if (ptr == nullptr) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lock(memory_mutex);
        auto it = blocks.find((uintptr_t)ptr);
        if (it == blocks.end())
            return nd_sim_fail(cudaErrorInvalidValue,
                               "cudaFree(%p): not the start of a live cudaMalloc block", ptr);
        used_bytes -= (int64_t)it->second;
        blocks.erase(it);
    }
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    if (ptr == nullptr) return nd_sim_fail(cudaErrorInvalidValue, "cudaMallocHost: NULL result");
    *ptr = nullptr;
    cudaError_t err = nd_sim_unsafe("cudaMallocHost");
    if (err != cudaSuccess) return err;
    *ptr = size == 0 ? nullptr : malloc(size);
    if (size != 0 && *ptr == nullptr)
        return nd_sim_fail(cudaErrorMemoryAllocation, "cudaMallocHost of %zu bytes", size);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
    cudaError_t err = nd_sim_unsafe("cudaFreeHost");
    if (err != cudaSuccess) return err;
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    if (free_bytes == nullptr || total_bytes == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaMemGetInfo: NULL");
    cudaError_t err = check_options("cudaMemGetInfo");
    if (err != cudaSuccess) return err;
    int64_t capacity = nd_sim_get_options()->memory;
    std::lock_guard<std::mutex> lock(memory_mutex);
    *free_bytes = (size_t)(capacity - used_bytes);
    *total_bytes = (size_t)capacity;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    if (!nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaMemcpy: stream %p", (void *)stream);
    if (count == 0) return cudaSuccess;
    if (dst == nullptr || src == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaMemcpy of %zu bytes with a NULL pointer",
                           count);
    int dst_device = 0, src_device = 0;
    switch (kind) {
    case cudaMemcpyHostToHost: break;
    case cudaMemcpyHostToDevice: dst_device = 1; break;
    case cudaMemcpyDeviceToHost: src_device = 1; break;
    case cudaMemcpyDeviceToDevice: dst_device = src_device = 1; break;
    case cudaMemcpyDefault:
        dst_device = inside_block(dst, 1);
        src_device = inside_block(src, 1);
        break;
    default: return nd_sim_fail(cudaErrorInvalidMemcpyDirection, "cudaMemcpy kind %d", (int)kind);
    }
    cudaError_t err = cudaSuccess;
    const int64_t capture = nd_sim_route(stream, "cudaMemcpyAsync", &err);
    if (capture < 0) return err;
    if (capture == 0) return copy_now(dst, src, count, dst_device, src_device);
    /* Checked now as well as at every replay, as CUDA checks a captured copy. */
    if (dst_device) err = check_range(dst, count, "destination", "cudaMemcpy");
    if (err == cudaSuccess && src_device) err = check_range(src, count, "source", "cudaMemcpy");
    if (err != cudaSuccess) return err;
    return nd_sim_capture(
        stream, capture, cudaGraphNodeTypeMemcpy, "cudaMemcpyAsync",
        [=](cudaStream_t) { return copy_now(dst, src, count, dst_device, src_device); });
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    cudaError_t err = nd_sim_unsafe("cudaMemcpy");
    if (err != cudaSuccess) return err;
    return cudaMemcpyAsync(dst, src, count, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
    if (!nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaMemset: stream %p", (void *)stream);
    if (count == 0) return cudaSuccess;
    cudaError_t err = cudaSuccess;
    const int64_t capture = nd_sim_route(stream, "cudaMemsetAsync", &err);
    if (capture < 0) return err;
    if (capture == 0) return memset_now(ptr, value, count);
    err = check_range(ptr, count, "device", "cudaMemset");
    if (err != cudaSuccess) return err;
    return nd_sim_capture(stream, capture, cudaGraphNodeTypeMemset, "cudaMemsetAsync",
                          [=](cudaStream_t) { return memset_now(ptr, value, count); });
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
    cudaError_t err = nd_sim_unsafe("cudaMemset");
    if (err != cudaSuccess) return err;
    return cudaMemsetAsync(ptr, value, count, nullptr);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
    if (attributes == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaPointerGetAttributes: NULL");
    memset(attributes, 0, sizeof *attributes);
    attributes->device = -1;
    if (ptr != nullptr && inside_block(ptr, 1)) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = 0;
        attributes->devicePointer = (void *)ptr;
    }
    return cudaSuccess;
}

/* --------------------------------------------------------------- streams */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    if (stream == nullptr || (flags & ~(unsigned)cudaStreamNonBlocking) != 0)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags(flags %u)", flags);
    /* A handle is a unique address; its byte holds the flags. */
    cudaStream_t s = (cudaStream_t)malloc(1);
    if (s == nullptr) return nd_sim_fail(cudaErrorMemoryAllocation, "cudaStreamCreate");
    *(unsigned char *)s = (unsigned char)flags;
    std::lock_guard<std::mutex> lock(handle_mutex);
    streams.insert(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (nd_sim_stream_valid(stream) && nd_sim_stream_capturing(stream))
        return nd_sim_fail(cudaErrorStreamCaptureUnsupported,
                           "cudaStreamDestroy(%p): the stream is capturing; end the capture "
                           "first",
                           (void *)stream);
    std::lock_guard<std::mutex> lock(handle_mutex);
    if (streams.erase(stream) == 0)
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p)", (void *)stream);
    free((void *)stream);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (!nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize(%p)",
                           (void *)stream);
    return nd_sim_sync_check(stream, "cudaStreamSynchronize");
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    if (!nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery(%p)", (void *)stream);
    return nd_sim_sync_check(stream, "cudaStreamQuery");
}

/* Within a capture a wait adds no node: the capture is one stream, in order. */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    if (!nd_sim_stream_valid(stream) || !event_valid(event))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent(%p, %p)",
                           (void *)stream, (void *)event);
    if (flags != 0)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaStreamWaitEvent(flags %u)", flags);
    cudaError_t err = cudaSuccess;
    const int64_t capture = nd_sim_route(stream, "cudaStreamWaitEvent", &err);
    if (capture < 0) return err;
    return nd_sim_event_wait_check(((const sim_event *)event)->capture, capture,
                                   "cudaStreamWaitEvent");
}

/* ---------------------------------------------------------------- events */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    const unsigned known = cudaEventBlockingSync | cudaEventDisableTiming;
    if (event == nullptr || (flags & ~known) != 0)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags(flags %u)", flags);
    sim_event *e = new (std::nothrow) sim_event{flags, 0, {}, 0};
    if (e == nullptr) return nd_sim_fail(cudaErrorMemoryAllocation, "cudaEventCreate");
    std::lock_guard<std::mutex> lock(handle_mutex);
    events.insert((cudaEvent_t)e);
    *event = (cudaEvent_t)e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(handle_mutex);
    if (events.erase(event) == 0)
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p)", (void *)event);
    delete (sim_event *)event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event_valid(event) || !nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaEventRecord(%p, %p)", (void *)event,
                           (void *)stream);
    cudaError_t err = cudaSuccess;
    const int64_t capture = nd_sim_route(stream, "cudaEventRecord", &err);
    if (capture < 0) return err;
    sim_event *e = (sim_event *)event;
    e->capture = capture;
    /* Recorded into a capture, it stands for work that has not run: no time. */
    e->recorded = capture == 0;
    e->when = std::chrono::steady_clock::now();
    return cudaSuccess;
}

/* Recorded work has always finished; an event never recorded counts as done. */
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event_valid(event))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaEventQuery(%p)", (void *)event);
    return nd_sim_event_check(((const sim_event *)event)->capture, "cudaEventQuery");
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!event_valid(event))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize(%p)",
                           (void *)event);
    return nd_sim_event_check(((const sim_event *)event)->capture, "cudaEventSynchronize");
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (ms == nullptr) return nd_sim_fail(cudaErrorInvalidValue, "cudaEventElapsedTime: NULL");
    if (!event_valid(start) || !event_valid(end))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime(%p, %p)",
                           (void *)start, (void *)end);
    const sim_event *a = (const sim_event *)start, *b = (const sim_event *)end;
    cudaError_t err = nd_sim_event_check(a->capture, "cudaEventElapsedTime");
    if (err == cudaSuccess) err = nd_sim_event_check(b->capture, "cudaEventElapsedTime");
    if (err != cudaSuccess) return err;
    if (!a->recorded || !b->recorded || ((a->flags | b->flags) & cudaEventDisableTiming))
        return nd_sim_fail(cudaErrorInvalidResourceHandle,
                           "cudaEventElapsedTime: an event was not recorded or has no timing");
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return cudaSuccess;
}

} /* extern "C" */
