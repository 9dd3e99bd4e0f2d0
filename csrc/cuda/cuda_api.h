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

/* Streams (cuda_stream.cu), as intptr_t handles: 0 names needle's own
 * non-blocking stream of GPU `ordinal`, anything else a cudaStream_t the
 * caller got from nd_cuda_stream_create (or another library). Each makes
 * `ordinal` the current GPU; ND_ERR_DEVICE when it is not a registered GPU.
 * stream_default/current: needle's stream / the calling thread's current one
 * on that GPU (as a cudaStream_t value, never 0). stream_set: makes `handle`
 * the calling thread's current stream there (0: back to needle's own).
 * stream_create: a new non-blocking stream. stream_destroy: destroys one made
 * by stream_create (needle's own: ND_ERR_VALUE); a thread that had it current
 * goes back to needle's. stream_wait: `waiter`'s later work waits for the
 * work queued on `waited` so far (no host wait). stream_query: *done is 1
 * when all its work has finished. */
nd_status nd_cuda_stream_default(int ordinal, intptr_t *out);
nd_status nd_cuda_stream_current(int ordinal, intptr_t *out);
nd_status nd_cuda_stream_set(int ordinal, intptr_t handle);
nd_status nd_cuda_stream_create(int ordinal, intptr_t *out);
nd_status nd_cuda_stream_destroy(int ordinal, intptr_t handle);
nd_status nd_cuda_stream_synchronize(int ordinal, intptr_t handle);
nd_status nd_cuda_stream_query(int ordinal, intptr_t handle, int *done);
nd_status nd_cuda_stream_wait(int ordinal, intptr_t waiter, intptr_t waited);

/* Stream order for exports (DLPack, CUDA Array Interface). `stream` is a
 * protocol value: 1 the legacy default stream, 2 the per-thread default
 * stream, > 2 a cudaStream_t (needle's current one: nothing to do), -1 "no
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
    int64_t graph_launches;     /* CUDA graph replays: one host launch each */
    int64_t graph_nodes;        /* the kernels, copies and memsets those replays ran */
    int64_t legacy_stream_work; /* launches, copies, memsets queued on the legacy default
                                 * stream: 0 unless a bug, since a capture misses them */
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

/* CUDA graphs (cuda_graph.cu), PyTorch's torch.cuda.CUDAGraph underneath.
 *
 * A graph pool is memory that only captures into it allocate from: blocks a
 * capture allocates stay the pool's (freed ones are reused by later captures
 * into it, never by the cache) while anything references the pool, since a
 * replay writes them. pool_create: a new pool with one reference;
 * pool_retain/release: its references (the last release gives its blocks to
 * the GPU's cache; those still in use follow when they are freed).
 *
 * capture_begin: captures the calling thread's current stream of GPU
 * `ordinal` into pool `pool` (0: a new pool of the graph's own), in CUDA's
 * global mode, so that work that cannot be captured fails. Only one capture
 * at a time per GPU (ND_ERR_VALUE). While it runs, allocations come from the
 * pool, frees of other blocks wait for its end, and nothing collects or
 * releases the cache (nd_memory_begin_capture). capture_end: ends it and
 * instantiates the graph into *out; when an operation could not be captured
 * it fails (ND_ERR_BACKEND) and the capture is abandoned with the allocator
 * consistent (so does capture_abandon, for an exception inside the capture).
 * Either way the GPU leaves capture mode. graph_replay: launches the graph on
 * the calling thread's current stream (one host launch). graph_destroy:
 * frees it and drops its pool reference. graph_pool/graph_nodes: its pool,
 * and how many kernels, copies and memsets one replay runs. */
typedef struct nd_cuda_graph nd_cuda_graph;
nd_status nd_cuda_graph_pool_create(int ordinal, int *out);
nd_status nd_cuda_graph_pool_retain(int ordinal, int pool);
void nd_cuda_graph_pool_release(int ordinal, int pool);
nd_status nd_cuda_graph_capture_begin(int ordinal, int pool);
nd_status nd_cuda_graph_capture_end(int ordinal, nd_cuda_graph **out);
void nd_cuda_graph_capture_abandon(int ordinal);
int nd_cuda_graph_capturing(int ordinal);
nd_status nd_cuda_graph_replay(nd_cuda_graph *g);
void nd_cuda_graph_destroy(nd_cuda_graph *g);
int nd_cuda_graph_pool(const nd_cuda_graph *g);
int64_t nd_cuda_graph_nodes(const nd_cuda_graph *g);

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
