/* cuda_common.cuh: what the CUDA backend's files share: the engine's private
 * header (C linkage), the check macros, the launch macro (cuda_launch.cuh),
 * the strided iteration space that kernels receive by value, launch
 * geometry, and the internal entry points
 * that one file implements and another calls.
 *
 * No Python.h; nothing here prints, exits or aborts: every failure becomes
 * an nd_status with a message that names the file and line.
 */
#ifndef NEEDLE_CUDA_COMMON_CUH
#define NEEDLE_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../internal.h"
}
#include "cuda_api.h"
#include "cuda_launch.cuh"

/* The most GPUs the backend registers: engine.h's ND_MAX_CUDA_DEVICES. */
#define ND_CUDA_MAX_DEVICES ND_MAX_CUDA_DEVICES

/* Runs a CUDA runtime call; on failure records "<error> at file:line: call"
 * and returns ND_ERR_BACKEND from the enclosing function. The error is
 * cleared from the runtime's last-error slot so that the next call starts
 * clean (sticky errors, such as a kernel fault, stay in the context). */
#define ND_CUDA_CHECK(call)                                                                  \
    do {                                                                                     \
        cudaError_t nd_cuda_err_ = (call);                                                   \
        if (nd_cuda_err_ != cudaSuccess) {                                                   \
            (void)cudaGetLastError();                                                        \
            return nd_fail(ND_ERR_BACKEND, "CUDA error %s (%s) at %s:%d: %s",                \
                           cudaGetErrorName(nd_cuda_err_), cudaGetErrorString(nd_cuda_err_), \
                           __FILE__, __LINE__, #call);                                       \
        }                                                                                    \
    } while (0)

/* Returns from the enclosing function when an engine call failed. */
#define ND_TRY(expr)                                        \
    do {                                                    \
        nd_status nd_try_status_ = (expr);                  \
        if (nd_try_status_ != ND_OK) return nd_try_status_; \
    } while (0)

/* Threads per block of the elementwise and reduction kernels. */
#define ND_CUDA_THREADS 256
/* Grid-stride loops cover the rest; enough blocks to fill any current GPU. */
#define ND_CUDA_MAX_BLOCKS 65535

static inline unsigned int nd_cuda_blocks(int64_t work, int64_t per_block) {
    int64_t blocks = (work + per_block - 1) / per_block;
    if (blocks < 1) blocks = 1;
    if (blocks > ND_CUDA_MAX_BLOCKS) blocks = ND_CUDA_MAX_BLOCKS;
    return (unsigned int)blocks;
}

/* ------------------------------------------------------ strided iteration */

#define ND_CUDA_MAX_OPS ND_COALESCE_MAX_OPS

/* An N-d iteration space walked in row-major order, with up to three
 * operands' strides (elements; 0 = broadcast or scalar). Passed to kernels
 * by value (about 520 bytes of parameter space). Size-1 dims are dropped and
 * dims that every operand steps through as one are merged, so most calls
 * become ndim == 1. */
typedef struct nd_cuda_iter {
    int ndim; /* >= 1 */
    int64_t numel;
    int64_t shape[ND_MAX_DIMS];
    int64_t strides[ND_CUDA_MAX_OPS][ND_MAX_DIMS];
} nd_cuda_iter;

/* layouts[op] == NULL marks a scalar operand (all strides 0). */
void nd_cuda_iter_make(nd_cuda_iter *it, int ndim, const int64_t *shape, int nops,
                       const nd_layout *const *layouts);

/* Unrolls a loop in device code; the host compiler does not know the pragma. */
#ifdef __CUDA_ARCH__
#define ND_UNROLL _Pragma("unroll")
#else
#define ND_UNROLL
#endif

/* Offsets of linear index i (row-major over it.shape) for each operand.
 * 32-bit division when the whole space fits, which is most of the time.
 * Host-callable too, so that the index arithmetic can be tested without a GPU. */
template <int NOPS>
__host__ __device__ __forceinline__ void nd_cuda_offsets(const nd_cuda_iter &it, int64_t i,
                                                         int64_t (&off)[NOPS]) {
    ND_UNROLL
    for (int op = 0; op < NOPS; op++) off[op] = 0;
    if (it.numel <= (int64_t)UINT32_MAX) {
        uint32_t rest = (uint32_t)i;
        for (int d = it.ndim - 1; d >= 0; d--) {
            uint32_t extent = (uint32_t)it.shape[d];
            uint32_t c = rest % extent;
            rest /= extent;
            ND_UNROLL
            for (int op = 0; op < NOPS; op++) off[op] += (int64_t)c * it.strides[op][d];
        }
    } else {
        int64_t rest = i;
        for (int d = it.ndim - 1; d >= 0; d--) {
            int64_t c = rest % it.shape[d];
            rest /= it.shape[d];
            ND_UNROLL
            for (int op = 0; op < NOPS; op++) off[op] += c * it.strides[op][d];
        }
    }
}

/* 1/(1+e^-x) through e = e^-|x| <= 1, so nothing overflows and tiny results
 * for very negative x survive (e/(1+e)): the Sigmoid op's and the LSTM
 * cell's, one definition (float64 arrays: the same in double). */
__device__ __forceinline__ float nd_cuda_sigmoid(float x) {
    float e = expf(-fabsf(x));
    return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}
__device__ __forceinline__ double nd_cuda_sigmoid(double x) {
    double e = exp(-fabs(x));
    return (x < 0.0 ? e : 1.0) / (1.0 + e);
}

/* ---------------------------------------------------------------- devices */

/* Makes the GPU that owns ptr current (a no-op with one GPU) and returns its
 * engine device in *dev (may be NULL). ptr may point inside a buffer. */
nd_status nd_cuda_activate(const void *ptr, nd_device **dev);
/* Makes GPU `ordinal` current. */
nd_status nd_cuda_set_device(int ordinal);

/* 1 when `ordinal` is a registered GPU (cuda_backend.cu). */
int nd_cuda_registered(int ordinal);
/* The engine device of GPU `ordinal`; NULL when it is not registered. */
nd_device *nd_cuda_device(int ordinal);

/* ---------------------------------------------------------------- streams */

/* cuda_stream.cu: the calling thread's current stream on its current GPU,
 * which every launch, copy, memset and cuBLAS call of the backend uses. */
cudaStream_t nd_cuda_stream(void);
/* Makes needle's own stream of GPU ordinal (that GPU current) if missing. */
nd_status nd_cuda_stream_prepare(int ordinal);

/* ---------------------------------------------------------------- census */

/* cuda_census.cu: the runtime calls the backend makes for memory, copies and
 * waits, each counted in the census of the current GPU (see cuda_api.h's
 * nd_cuda_work). The backend calls the CUDA runtime for these through here
 * only (tests/test_cuda_census.py checks the sources). */
void nd_cuda_census_set_current(int ordinal);
/* The GPU the calling thread works on, as nd_cuda_set_device last set it. */
int nd_cuda_current_ordinal(void);
void nd_cuda_count_blas(void);
cudaError_t nd_cuda_malloc(void **ptr, size_t bytes);
cudaError_t nd_cuda_free(void *ptr);
/* Synchronous copies: the host waits (a host sync each). */
cudaError_t nd_cuda_copy_to_host(void *host, const void *device, size_t bytes);
cudaError_t nd_cuda_copy_from_host(void *device, const void *host, size_t bytes);
/* An asynchronous copy from page-locked host memory: no wait. */
cudaError_t nd_cuda_copy_from_pinned(void *device, const void *pinned, size_t bytes,
                                     cudaStream_t stream);
cudaError_t nd_cuda_copy_on_device(void *dst, const void *src, size_t bytes, cudaStream_t stream);
cudaError_t nd_cuda_memset(void *ptr, int value, size_t bytes, cudaStream_t stream);
cudaError_t nd_cuda_synchronize(void);
/* Replays a CUDA graph of `nodes` kernels, copies and memsets on stream:
 * one host launch (graph_launches), its nodes counted apart (graph_nodes). */
cudaError_t nd_cuda_graph_launch(cudaGraphExec_t exec, int64_t nodes, cudaStream_t stream);
/* Waits for one stream's work (a host sync). */
cudaError_t nd_cuda_stream_sync(cudaStream_t stream);

/* The driver's virtual memory calls, for expandable segments (loaded from
 * libcuda at run time by the census; the simulator's own on a sim build).
 * Each returns ND_OK, ND_ERR_OOM when the GPU is out of memory, or
 * ND_ERR_BACKEND naming the call. nd_cuda_vm_granularity: the size of GPU
 * `ordinal`'s physical chunks, or ND_ERR_VALUE saying why the calls cannot
 * be used there. A chunk is created, mapped at ptr and made read-write in
 * one nd_cuda_vm_map (counted as a device malloc), unmapped and released in
 * one nd_cuda_vm_unmap (a device free; the caller waits for the GPU first,
 * as cudaFree would). */
nd_status nd_cuda_vm_granularity(int ordinal, int64_t *out);
nd_status nd_cuda_vm_reserve(int64_t bytes, int64_t alignment, char **out);
nd_status nd_cuda_vm_release(char *base, int64_t bytes);
nd_status nd_cuda_vm_map(int ordinal, char *ptr, int64_t bytes, unsigned long long *handle);
nd_status nd_cuda_vm_unmap(char *ptr, int64_t bytes, unsigned long long handle);
/* Waits for event; a host sync only when it had not completed yet. */
cudaError_t nd_cuda_event_wait(cudaEvent_t event);

/* ------------------------------------------------- backend entry points */

/* cuda_graph.cu: the device counter of the capture under way on GPU
 * `ordinal`, which each replay of its graph advances (random draws read it). */
nd_status nd_cuda_graph_replay_counter(int ordinal, const uint64_t **out);

/* cuda_allocator.cu */
nd_status nd_cuda_raw_alloc(nd_device *dev, int64_t nbytes, void **out);
/* CUDA graph pools (cuda_graph.cu decides when): during a capture into
 * graph_pool, allocations come from that pool's blocks or new segments of its
 * own, and frees of the cache's blocks wait for the end; dissolve gives a
 * pool's blocks to the cache. */
void nd_cuda_allocator_begin_capture(nd_device *dev, int graph_pool);
void nd_cuda_allocator_end_capture(nd_device *dev);
void nd_cuda_allocator_dissolve_pool(nd_device *dev, int graph_pool);
void nd_cuda_raw_free(nd_device *dev, void *ptr, int64_t nbytes);
int64_t nd_cuda_release_cache(nd_device *dev);
nd_status nd_cuda_check_expandable(nd_device *dev);

/* cuda_ewise.cu */
nd_status nd_cuda_copy(const nd_layout *dst_layout, void *dst, nd_kernel_operand src);
nd_status nd_cuda_binary(nd_binary_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                         nd_kernel_operand a, nd_kernel_operand b);
nd_status nd_cuda_unary(nd_unary_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                        const nd_layout *a_layout, const void *a);

/* cuda_convert.cu */
nd_status nd_cuda_convert(const nd_layout *dst_layout, void *dst, nd_dtype dst_dtype,
                          const nd_layout *src_layout, const void *src, nd_dtype src_dtype,
                          double scalar);

/* cuda_transfer.cu */
nd_status nd_cuda_to_host(const nd_layout *src_layout, const void *src, nd_dtype dtype, void *host);
nd_status nd_cuda_from_host(const nd_layout *dst_layout, void *dst, nd_dtype dtype,
                            const void *host);

/* cuda_reduce.cu */
nd_status nd_cuda_reduce(nd_reduce_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                         const nd_layout *a_layout, const void *a);

/* cuda_matmul.cu */
nd_status nd_cuda_matmul(const nd_matmul_desc *desc);
int nd_cuda_matmul_adds_bias(nd_dtype dtype);

/* cuda_cublas.cu: cuBLAS, loaded at run time. */
typedef struct cublas_context *nd_cublas_handle;
/* dev's handle (dev's GPU current), with a workspace from its caching
 * allocator; NULL when cuBLAS cannot be used now (not found, disabled, cannot
 * run on this GPU, or memory for the handle or workspace is short even after
 * the out-of-memory ladder): needle's kernel serves then. Never fails. */
nd_cublas_handle nd_cublas_handle_for(nd_device *dev);
/* What a cuBLAS failure for want of memory asks the ladder to free. */
int64_t nd_cublas_workspace_bytes(nd_device *dev);
/* Whether the loaded cuBLAS has GEMMs for dtype (float32 always; the
 * others need cublasDgemm* / cublasGemm*Ex). 0 when cuBLAS is not loaded. */
int nd_cublas_supports(nd_dtype dtype);
/* c = a b (+ c when accumulate) in dtype through cuBLAS's strided batched
 * GEMM (column-major, alpha 1, beta 0 or 1; trans 0 = N, 1 = T; float16 and
 * bfloat16 accumulate in float, c's old values added to the float sums
 * before the one rounding). ND_ERR_OOM when cuBLAS could not allocate, else
 * ND_ERR_BACKEND with the status. Only for a dtype nd_cublas_supports. */
nd_status nd_cublas_gemm_strided(nd_cublas_handle h, nd_dtype dtype, int transa, int transb, int m,
                                 int n, int k, const void *a, int lda, long long stride_a,
                                 const void *b, int ldb, long long stride_b, void *c, int ldc,
                                 long long stride_c, int batch_count, int accumulate);
/* c[z] = a[z] b[z] for each z through cuBLAS's pointer-array batched GEMM:
 * the arrays of pointers live in device memory. Same conventions and
 * failures. */
nd_status nd_cublas_gemm_batched(nd_cublas_handle h, nd_dtype dtype, int transa, int transb, int m,
                                 int n, int k, const void *const a[], int lda,
                                 const void *const b[], int ldb, void *const c[], int ldc,
                                 int batch_count, int accumulate);

/* cuda_gather.cu */
nd_status nd_cuda_gather_rows(const nd_layout *out_layout, float *out,
                              const nd_layout *table_layout, const float *table,
                              const nd_layout *idx_layout, const float *idx);
nd_status nd_cuda_scatter_add_rows(const nd_layout *out_layout, float *out,
                                   const nd_layout *src_layout, const float *src,
                                   const nd_layout *idx_layout, const float *idx);
nd_status nd_cuda_check_indices(const nd_layout *idx_layout, const float *idx, int64_t count,
                                const char *what, const char *unit);
/* The IndexError of the earliest checked launch of dev that met a bad index
 * since the last report, or ND_OK. Call only once the GPU has finished them
 * (after a synchronisation): the checks report asynchronously. */
nd_status nd_cuda_index_errors(nd_device *dev);

/* cuda_softmax.cu */
nd_status nd_cuda_row_stats(const nd_rows_desc *d);
nd_status nd_cuda_row_apply(const nd_rows_desc *d);
nd_status nd_cuda_xent_loss(const nd_rows_desc *d);

/* cuda_random.cu */
nd_status nd_cuda_random(const nd_random_params *params, int64_t n, float *out);

/* cuda_optim.cu: the fused optimizer updates (optim_update.h). */
nd_status nd_cuda_adam_update(const struct nd_adam_desc *d);
nd_status nd_cuda_sgd_update(const struct nd_sgd_desc *d);

/* cuda_lstm.cu */
nd_status nd_cuda_lstm_step(const nd_lstm_step_desc *d);
nd_status nd_cuda_lstm_step_grad(const nd_lstm_step_grad_desc *d);

/* cuda_fused_rows.cu */
nd_status nd_cuda_layer_norm(const nd_norm_desc *d);
nd_status nd_cuda_layer_norm_grad(const nd_norm_desc *d);
nd_status nd_cuda_attention_softmax(const nd_attn_desc *d);
nd_status nd_cuda_attention_softmax_grad(const nd_attn_desc *d);

/* cuda_amp.cu: GradScaler's unscale (amp_unscale.h). */
nd_status nd_cuda_amp_unscale(const struct nd_amp_unscale_desc *d);

#endif /* NEEDLE_CUDA_COMMON_CUH */
