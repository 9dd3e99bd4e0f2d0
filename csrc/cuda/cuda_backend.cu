/* cuda_backend.cu: the CUDA backend's front door: discovers the GPUs,
 * registers one engine device per GPU with the backend table below, finds
 * which GPU a pointer lives on, and prepares the strided iteration spaces
 * the kernels receive.
 *
 * Discovery must be harmless without a driver or a GPU (the extension is
 * imported everywhere): a failing cudaGetDeviceCount means zero devices (its
 * error is kept for nd_cuda_init_error), and no CUDA context is created at
 * registration. A GPU this build has no code for (cuda_arch.h: a V100 under
 * a CUDA 13 build) is not registered either, with the reason kept, so that
 * it is "unavailable" rather than a failure at the first kernel. Never
 * prints, exits or aborts.
 */
#include "cuda_common.cuh"

#include "../cuda_arch.h"

#include <stdio.h>
#include <string.h>

/* Engine devices by CUDA ordinal (NULL: not registered). */
static nd_device *cuda_devices[ND_CUDA_MAX_DEVICES];
static int cuda_device_count = 0;
/* The GPU when there is exactly one: no pointer lookups then. */
static nd_device *sole_device = NULL;

/* nd_backend.memory_blocks: the caching allocator's map, which has every
 * block; nd_memory_blocks tells the storages among them apart. */
static int64_t cuda_memory_blocks(nd_device *dev, const nd_live_storage *live, int64_t nlive,
                                  nd_memory_block *out, int64_t cap) {
    (void)live;
    (void)nlive;
    return nd_cuda_blocks(dev, out, cap);
}

static const nd_backend nd_cuda_backend = {
    /* .name = */ "cuda",
    /* .raw_alloc = */ nd_cuda_raw_alloc,
    /* .raw_free = */ nd_cuda_raw_free,
    /* .release_cache = */ nd_cuda_release_cache,
    /* .copy = */ nd_cuda_copy,
    /* .binary = */ nd_cuda_binary,
    /* .unary = */ nd_cuda_unary,
    /* .reduce = */ nd_cuda_reduce,
    /* .matmul = */ nd_cuda_matmul,
    /* .matmul_adds_bias = */ nd_cuda_matmul_adds_bias,
    /* .to_host = */ nd_cuda_to_host,
    /* .from_host = */ nd_cuda_from_host,
    /* .gather_rows = */ nd_cuda_gather_rows,
    /* .scatter_add_rows = */ nd_cuda_scatter_add_rows,
    /* .row_stats = */ nd_cuda_row_stats,
    /* .row_apply = */ nd_cuda_row_apply,
    /* .xent_loss = */ nd_cuda_xent_loss,
    /* .check_indices = */ nd_cuda_check_indices,
    /* .random = */ nd_cuda_random,
    /* .adam_update = */ nd_cuda_adam_update,
    /* .sgd_update = */ nd_cuda_sgd_update,
    /* .lstm_step = */ nd_cuda_lstm_step,
    /* .lstm_step_grad = */ nd_cuda_lstm_step_grad,
    /* .layer_norm = */ nd_cuda_layer_norm,
    /* .layer_norm_grad = */ nd_cuda_layer_norm_grad,
    /* .attention_softmax = */ nd_cuda_attention_softmax,
    /* .attention_softmax_grad = */ nd_cuda_attention_softmax_grad,
    /* .check_expandable = */ nd_cuda_check_expandable,
    /* .convert = */ nd_cuda_convert,
    /* .amp_unscale = */ nd_cuda_amp_unscale,
    /* .fuses_linear_grads = */ nullptr, /* composed: cuBLAS reads g at its bandwidth */
    /* .linear_grads = */ nullptr,
    /* .memory_blocks = */ cuda_memory_blocks,
};

/* Why no GPU was registered ("" when one was): the CUDA error of discovery
 * and the driver's and runtime's CUDA versions, so that a user whose driver
 * is too old for the statically linked runtime is told so instead of seeing
 * CUDA tests skip. Written once, at registration. */
static char init_error[512];

static void record_init_error(const char *what, cudaError_t err) {
    /* Versions are 1000 * major + 10 * minor; the driver's is 0 without a driver. */
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    (void)cudaGetLastError();
    char driver_text[64];
    if (driver > 0)
        snprintf(driver_text, sizeof driver_text, "the driver supports CUDA %d.%d", driver / 1000,
                 driver % 1000 / 10);
    else snprintf(driver_text, sizeof driver_text, "no CUDA driver was found");
    snprintf(init_error, sizeof init_error, "%s: %s (%s); %s, needle's runtime is CUDA %d.%d", what,
             cudaGetErrorName(err), cudaGetErrorString(err), driver_text, CUDART_VERSION / 1000,
             CUDART_VERSION % 1000 / 10);
}

extern "C" const char *nd_cuda_init_error(void) { return init_error; }

/* setup.py passes the architectures it compiled for; a build made some other
 * way has no list and registers every GPU (the first kernel then says). */
#if defined(NEEDLE_CUDA_SASS) && defined(NEEDLE_CUDA_PTX)
#define BUILT_SASS NEEDLE_CUDA_SASS
#define BUILT_PTX NEEDLE_CUDA_PTX
#else
#define BUILT_SASS ""
#define BUILT_PTX ""
#endif

extern "C" void nd_cuda_build_archs(const char **sass, const char **ptx, int *runtime_version) {
    *sass = BUILT_SASS;
    *ptx = BUILT_PTX;
    *runtime_version = CUDART_VERSION;
}

/* 1 when GPU `ordinal` can run this build's code; else keeps the reason. */
static int gpu_has_code(int ordinal, const cudaDeviceProp *prop) {
    if (BUILT_SASS[0] == '\0') return 1;
    char why[400];
    int ok = nd_cuda_arch_check(BUILT_SASS, BUILT_PTX, CUDART_VERSION / 1000, prop->major,
                                prop->minor, why, sizeof why);
    if (ok == 1) return 1;
    snprintf(init_error, sizeof init_error, "GPU %d (%.80s): %.390s", ordinal, prop->name, why);
    return 0;
}

extern "C" int nd_cuda_register_devices(void) {
    int count = 0;
    /* No driver, no GPU, a driver older than the runtime: no CUDA devices,
     * and the reason is kept for nd_cuda_init_error. */
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();
        record_init_error("cudaGetDeviceCount failed",
                          err != cudaSuccess ? err : cudaErrorNoDevice);
        return 0;
    }
    if (count > ND_CUDA_MAX_DEVICES) count = ND_CUDA_MAX_DEVICES;
    for (int ordinal = 0; ordinal < count; ordinal++) {
        /* totalGlobalMem is the total cudaMemGetInfo reports, read without
         * creating a context (which costs time and device memory at import). */
        cudaDeviceProp prop;
        err = cudaGetDeviceProperties(&prop, ordinal);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            record_init_error("cudaGetDeviceProperties failed", err);
            continue;
        }
        if (!gpu_has_code(ordinal, &prop)) continue;
        nd_device *dev = nd_device_register(ND_DEVICE_CUDA, ordinal, "cuda", &nd_cuda_backend,
                                            (int64_t)prop.totalGlobalMem, 1);
        if (dev == NULL) break; /* the engine's device table is full */
        cuda_devices[ordinal] = dev;
        cuda_device_count++;
    }
    if (cuda_device_count == 1)
        for (int ordinal = 0; ordinal < ND_CUDA_MAX_DEVICES; ordinal++)
            if (cuda_devices[ordinal] != NULL) sole_device = cuda_devices[ordinal];
    if (cuda_device_count > 0) init_error[0] = '\0'; /* some GPU works */
    return cuda_device_count;
}

int nd_cuda_registered(int ordinal) {
    return ordinal >= 0 && ordinal < ND_CUDA_MAX_DEVICES && cuda_devices[ordinal] != NULL;
}

nd_device *nd_cuda_device(int ordinal) {
    return nd_cuda_registered(ordinal) ? cuda_devices[ordinal] : NULL;
}

nd_status nd_cuda_set_device(int ordinal) {
    nd_cuda_census_set_current(ordinal);
    int current = -1;
    ND_CUDA_CHECK(cudaGetDevice(&current));
    if (current != ordinal) ND_CUDA_CHECK(cudaSetDevice(ordinal));
    /* Every GPU's first use passes here (the allocator's first segment), so
     * needle's stream exists before any work is queued on the GPU. */
    return nd_cuda_stream_prepare(ordinal);
}

nd_status nd_cuda_activate(const void *ptr, nd_device **dev) {
    if (cuda_device_count <= 1) {
        /* One GPU: made current by the allocator when it took the memory. */
        if (dev != NULL) *dev = sole_device;
        return sole_device != NULL && sole_device->ordinal != 0
                   ? nd_cuda_set_device(sole_device->ordinal)
                   : ND_OK;
    }
    if (ptr == NULL) return nd_fail(ND_ERR_INTERNAL, "a CUDA kernel was given no buffer");
    cudaPointerAttributes attr;
    ND_CUDA_CHECK(cudaPointerGetAttributes(&attr, ptr));
    if (attr.type != cudaMemoryTypeDevice || attr.device < 0 ||
        attr.device >= ND_CUDA_MAX_DEVICES || cuda_devices[attr.device] == NULL)
        return nd_fail(ND_ERR_INTERNAL, "pointer %p is not memory of a registered GPU", ptr);
    if (dev != NULL) *dev = cuda_devices[attr.device];
    return nd_cuda_set_device(attr.device);
}

extern "C" nd_status nd_cuda_synchronize_device(int ordinal) {
    if (!nd_cuda_registered(ordinal))
        return nd_fail(ND_ERR_DEVICE, "there is no CUDA device %d", ordinal);
    ND_TRY(nd_cuda_set_device(ordinal));
    ND_CUDA_CHECK(nd_cuda_synchronize());
    return nd_cuda_index_errors(cuda_devices[ordinal]);
}

extern "C" nd_status nd_cuda_mem_get_info(int ordinal, int64_t *free_bytes, int64_t *total_bytes) {
    *free_bytes = 0;
    *total_bytes = 0;
    if (ordinal < 0 || ordinal >= ND_CUDA_MAX_DEVICES || cuda_devices[ordinal] == NULL)
        return nd_fail(ND_ERR_DEVICE, "there is no CUDA device %d", ordinal);
    ND_TRY(nd_cuda_set_device(ordinal));
    size_t free_now = 0, total = 0;
    ND_CUDA_CHECK(cudaMemGetInfo(&free_now, &total));
    *free_bytes = (int64_t)free_now;
    *total_bytes = (int64_t)total;
    return ND_OK;
}

void nd_cuda_iter_make(nd_cuda_iter *it, int ndim, const int64_t *shape, int nops,
                       const nd_layout *const *layouts) {
    memset(it, 0, sizeof *it);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    it->numel = numel;
    /* Row-major order is kept (order_by -1): outputs stay coalesced. */
    it->ndim = nd_coalesce(ndim, shape, nops, layouts, -1, it->shape, it->strides);
}

extern "C" int nd_cuda_simulated(void) {
#ifdef NEEDLE_CUDA_SIM
    return 1;
#else
    return 0;
#endif
}

extern "C" nd_status nd_cuda_device_name(int ordinal, char *buf, size_t size) {
    if (size > 0) buf[0] = '\0';
    if (ordinal < 0 || ordinal >= ND_CUDA_MAX_DEVICES || cuda_devices[ordinal] == NULL)
        return nd_fail(ND_ERR_DEVICE, "there is no CUDA device %d", ordinal);
    cudaDeviceProp prop;
    ND_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    if (size > 0) snprintf(buf, size, "%s", prop.name);
    return ND_OK;
}
