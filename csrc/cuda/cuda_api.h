/* cuda_api.h: the few CUDA-backend entry points that live outside the
 * nd_backend table, for the binding (needle_c/cuda_info.c) and device.c.
 *
 * Plain C, no CUDA headers, no Python.h: it is included by C files compiled
 * without nvcc. Every function reports an nd_status like the rest of the
 * engine and never prints.
 */
#ifndef NEEDLE_CUDA_API_H
#define NEEDLE_CUDA_API_H

#include "../engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers one engine device per visible GPU; returns how many. A failure
 * of device discovery (no driver, no GPU) registers none, silently: its
 * reason is kept for nd_cuda_init_error. */
int nd_cuda_register_devices(void);

/* Why device discovery found no usable GPU: the CUDA error's name and text
 * and the driver's and runtime's CUDA versions; "" when a GPU was registered.
 * Call after the device table is initialised (nd_device_count). */
const char *nd_cuda_init_error(void);

/* The driver's view of GPU `ordinal`: free and total bytes (cudaMemGetInfo).
 * ND_ERR_DEVICE when there is no such registered GPU. */
nd_status nd_cuda_mem_get_info(int ordinal, int64_t *free_bytes, int64_t *total_bytes);

/* Which GEMM the CUDA backend runs: "cublas (<library>)" or a description of
 * needle's own kernel when cuBLAS cannot be loaded (with where it looked).
 * Loads cuBLAS on first use; never fails. */
const char *nd_cuda_gemm_description(void);

/* Directories to look for libcublas.so.<the runtime's major> in, after NEEDLE_CUBLAS
 * and the build's hint and before the loader's path: the host names the lib
 * directory of a pip-installed nvidia-cublas wheel. Replaces earlier ones; a
 * cuBLAS not found before is looked for again. At most 8, each shorter than
 * 1024 bytes (ND_ERR_VALUE). */
nd_status nd_cuda_set_cublas_dirs(int count, const char *const *dirs);
/* The directories set, up to max of them, into out; returns how many. */
int nd_cuda_cublas_dirs(const char **out, int max);

/* Stream order for exports (DLPack, CUDA Array Interface). `stream` is a
 * protocol value: 1 the legacy default stream (needle's: nothing to do),
 * 2 the per-thread default stream, > 2 a cudaStream_t, -1 "no
 * synchronisation" (nothing to do); 0 and values below -1 are ND_ERR_VALUE.
 * export_to_stream: work queued later on `stream` waits for needle's work so
 * far on GPU `ordinal`. release_from_stream: needle's later work waits for
 * the work queued on `stream` so far (call it before the exported storage is
 * released, so the block is not reused under the consumer); when `stream`
 * cannot be used it waits for the whole GPU instead and reports the error. */
nd_status nd_cuda_export_to_stream(int ordinal, intptr_t stream);
nd_status nd_cuda_release_from_stream(int ordinal, intptr_t stream);

/* The census of the work the backend asked of one GPU since the last reset:
 * what decides a step's speed on a GPU besides the kernels' own time (how
 * many launches, whether the host waits, whether the driver allocates). The
 * same calls are counted on a real GPU and on the simulator. */
typedef struct nd_cuda_work {
    int64_t kernel_launches; /* needle's kernels (ND_LAUNCH) */
    int64_t memsets;         /* cudaMemsetAsync */
    int64_t d2d_copies;      /* device-to-device cudaMemcpyAsync */
    int64_t blas_calls;      /* cuBLAS GEMM calls (each launches cuBLAS's own kernels) */
    int64_t host_syncs;      /* the host waited for the GPU: a device-to-host copy, a
                              * synchronous host-to-device copy, a synchronize call, a wait
                              * on an unfinished event, cudaFree */
    int64_t device_mallocs;  /* cudaMalloc (the caching allocator's segments, scratch) */
    int64_t device_frees;    /* cudaFree */
    int64_t h2d_copies, h2d_bytes;
    int64_t d2h_copies, d2h_bytes;
} nd_cuda_work;

/* GPU `ordinal`'s census into *out, or zeroes it; ND_ERR_DEVICE when there
 * is no such registered GPU. */
nd_status nd_cuda_work_get(int ordinal, nd_cuda_work *out);
nd_status nd_cuda_work_reset(int ordinal);
/* GPU `ordinal`'s kernel launches by call site since the reset: up to max
 * ("kernel file:line", count) pairs, in no order; returns how many. */
int nd_cuda_work_sites(int ordinal, const char **names, int64_t *counts, int max);

/* Waits for all of GPU `ordinal`'s work (cudaDeviceSynchronize, a host sync
 * in the census), then reports what its kernels found: the IndexError of
 * the earliest bad index or label since the last synchronisation (the GPU's
 * index checks report asynchronously). ND_ERR_DEVICE for no such GPU. */
nd_status nd_cuda_synchronize_device(int ordinal);

/* 1 when the backend runs on the CUDA simulator (a NEEDLE_CUDA=sim build:
 * csrc/cuda/sim), 0 on a real GPU runtime. */
int nd_cuda_simulated(void);

/* The name of GPU `ordinal` (cudaDeviceProp.name) into buf (NUL-terminated,
 * cut to size). ND_ERR_DEVICE when there is no such registered GPU. */
nd_status nd_cuda_device_name(int ordinal, char *buf, size_t size);

/* What this build embeds, as setup.py recorded it: the SASS architectures
 * ("75 80 86 89 90"), the PTX one ("90", "" for none), and the CUDA runtime
 * it links (CUDART_VERSION: 12080, 13000). Device discovery registers only
 * the GPUs nd_cuda_arch_check (cuda_arch.h) says can run it. */
void nd_cuda_build_archs(const char **sass, const char **ptx, int *runtime_version);

#ifdef __cplusplus
}
#endif
#endif /* NEEDLE_CUDA_API_H */
