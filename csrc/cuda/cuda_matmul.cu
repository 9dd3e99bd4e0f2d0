/* cuda_matmul.cu: the CUDA backend's batched matmul, in every dtype: cuBLAS
 * when it can be used (cuda_cublas.cu loads it and keeps the handles:
 * SGEMM, DGEMM, and GemmEx with float accumulation for float16/bfloat16),
 * else needle's own tiled GEMM kernel (accumulating in float, or double for
 * float64, and rounding once to the dtype).
 *
 * Row-major C (m x n) = A B is computed as the column-major C^T = B^T A^T; a
 * transposed operand (unit row stride) becomes CUBLAS_OP_T, never a copy.
 * Batches whose strides collapse to one dim run as one strided batched
 * GEMM (stride 0 broadcasts an operand). Others (the
 * attention's matmuls over (batch, heads) views of a (batch, seq, heads,
 * dim) array, say) run as one pointer-array batched GEMM whose arrays of pointers a
 * small kernel writes into a scratch block: two launches whatever the batch,
 * no copy of the operands, where a loop of strided calls was one call per
 * index of the outer batch dims (256 for the course's transformer), and a
 * compaction would copy both operands first. A cuBLAS call that fails for want of memory goes through
 * the engine's out-of-memory ladder (release the cache, collect, retry) and,
 * if memory is still short, the kernel (which needs none) computes the
 * product; other cuBLAS failures are ND_ERR_BACKEND with the call site.
 * Default math mode: full FP32, no TF32, so results track the CPU's.
 * A float16/bfloat16 product with a linear layer's bias row
 * (nd_matmul_desc.bias) has it added to the float32 sums before the one
 * rounding, as the CPU does: cuBLAS's beta 1 over the bias written into
 * every row first, or the kernel's last step.
 */
#include "cuda_common.cuh"
#include "cuda_dtype.cuh"

#include <limits.h>
#include <string.h>

/* ----------------------------------------------------- batch dimensions */

/* Batch dims with size-1 dims dropped and mergeable neighbours merged. */
typedef struct gemm_batch {
    int ndim;
    int64_t count; /* product of shape */
    int64_t shape[ND_MAX_DIMS];
    int64_t a[ND_MAX_DIMS];
    int64_t b[ND_MAX_DIMS];
} gemm_batch;

static void batch_make(const nd_matmul_desc *d, gemm_batch *g) {
    memset(g, 0, sizeof *g);
    g->count = 1;
    for (int i = 0; i < d->batch_ndim; i++) {
        int64_t s = d->batch_shape[i];
        g->count *= s;
        if (s == 1) continue;
        int last = g->ndim - 1;
        /* out's batch strides are contiguous, so a and b decide. */
        if (last >= 0 && g->a[last] == d->a_batch_strides[i] * s &&
            g->b[last] == d->b_batch_strides[i] * s) {
            g->shape[last] *= s;
            g->a[last] = d->a_batch_strides[i];
            g->b[last] = d->b_batch_strides[i];
            continue;
        }
        g->shape[g->ndim] = s;
        g->a[g->ndim] = d->a_batch_strides[i];
        g->b[g->ndim] = d->b_batch_strides[i];
        g->ndim++;
    }
}

/* ---------------------------------------------------------- the kernel */

#define TILE_M 64
#define TILE_N 64
#define TILE_K 16
/* 256 threads as 16 x 16; each computes 4 x 4 outputs, rows ty + 16 r and
 * columns tx + 16 c, so shared-memory reads hit distinct banks. */

/* out[batch] (m, n) contiguous = a[batch] (m, k) @ b[batch] (k, n) (+ the
 * row bias, bias[j * bias_stride], when bias is not NULL), where a's (i, p)
 * is at a + i * ars + p * acs and b's (p, j) at b + p * brs + j * bcs;
 * elements of storage type T, computed in nd_dtype_traits<T>::compute and
 * rounded once. */
template <class T>
__global__ void __launch_bounds__(256)
    gemm_kernel(int64_t m, int64_t n, int64_t k, const T *a, int64_t ars, int64_t acs, const T *b,
                int64_t brs, int64_t bcs, T *out, gemm_batch batch, const T *bias,
                int64_t bias_stride) {
    typedef nd_dtype_traits<T> traits;
    typedef typename traits::compute C;
    __shared__ C as[TILE_K][TILE_M + 4];
    __shared__ C bs[TILE_K][TILE_N + 4];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t tiles_n = (n + TILE_N - 1) / TILE_N;
    const int64_t tiles = tiles_n * ((m + TILE_M - 1) / TILE_M);
    for (int64_t z = blockIdx.z; z < batch.count; z += gridDim.z) {
        int64_t a_off = 0, b_off = 0, rest = z;
        for (int d = batch.ndim - 1; d >= 0; d--) {
            int64_t c = rest % batch.shape[d];
            rest /= batch.shape[d];
            a_off += c * batch.a[d];
            b_off += c * batch.b[d];
        }
        const T *A = a + a_off;
        const T *B = b + b_off;
        T *O = out + z * m * n;
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int64_t row0 = tile / tiles_n * TILE_M, col0 = tile % tiles_n * TILE_N;
            C acc[4][4] = {{0}};
            for (int64_t p0 = 0; p0 < k; p0 += TILE_K) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    /* Consecutive threads take consecutive p (A) and j (B). */
                    int idx = threadIdx.x + e * 256;
                    int i = idx / TILE_K, p = idx % TILE_K;
                    int64_t gi = row0 + i, gp = p0 + p;
                    as[p][i] = (gi < m && gp < k) ? traits::load(A[gi * ars + gp * acs]) : C(0);
                    int pb = idx / TILE_N, j = idx % TILE_N;
                    int64_t gpb = p0 + pb, gj = col0 + j;
                    bs[pb][j] = (gpb < k && gj < n) ? traits::load(B[gpb * brs + gj * bcs]) : C(0);
                }
                __syncthreads();
#pragma unroll
                for (int p = 0; p < TILE_K; p++) {
                    C af[4], bf[4];
#pragma unroll
                    for (int r = 0; r < 4; r++) af[r] = as[p][ty + 16 * r];
#pragma unroll
                    for (int c = 0; c < 4; c++) bf[c] = bs[p][tx + 16 * c];
#pragma unroll
                    for (int r = 0; r < 4; r++)
#pragma unroll
                        for (int c = 0; c < 4; c++) acc[r][c] += af[r] * bf[c];
                }
                __syncthreads();
            }
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int64_t gi = row0 + ty + 16 * r;
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    int64_t gj = col0 + tx + 16 * c;
                    if (gi < m && gj < n)
                        O[gi * n + gj] = traits::store(
                            bias != NULL ? acc[r][c] + traits::load(bias[gj * bias_stride])
                                         : acc[r][c]);
                }
            }
        }
    }
}

template <class T>
static nd_status gemm_typed(const nd_matmul_desc *d, const gemm_batch &g, cudaStream_t stream) {
    int64_t tiles = ((d->m + TILE_M - 1) / TILE_M) * ((d->n + TILE_N - 1) / TILE_N);
    dim3 grid(nd_cuda_blocks(tiles, 1), 1, nd_cuda_blocks(g.count, 1));
    ND_LAUNCH(gemm_kernel<T>, grid, 256, 0, stream, d->m, d->n, d->k, (const T *)d->a,
              d->a_row_stride, d->a_col_stride, (const T *)d->b, d->b_row_stride, d->b_col_stride,
              (T *)d->out, g, (const T *)d->bias, d->bias_stride);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* needle's kernel for the whole product in d's dtype. */
static nd_status gemm(const nd_matmul_desc *d, const gemm_batch &g, cudaStream_t stream) {
    switch (d->dtype) {
    case ND_FLOAT32: return gemm_typed<float>(d, g, stream);
    case ND_FLOAT16: return gemm_typed<nd_half_t>(d, g, stream);
    case ND_BFLOAT16: return gemm_typed<nd_bf16_t>(d, g, stream);
    case ND_FLOAT64: return gemm_typed<double>(d, g, stream);
    default: return nd_backend_lacks_dtype("cuda", "matmul", d->dtype);
    }
}

/* ---------------------------------------------------------- the cuBLAS path */

/* Every row of out (rows x n) = the bias row (element j at bias[j * stride]):
 * what cuBLAS then adds the product to (beta 1), in float, before its one
 * rounding, as the kernel above and the CPU add a linear layer's bias. */
template <class T>
__global__ void bias_rows_kernel(int64_t rows, int64_t n, const T *bias, int64_t stride, T *out) {
    for (int64_t z = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; z < rows * n;
         z += (int64_t)gridDim.x * blockDim.x)
        out[z] = bias[z % n * stride];
}

template <class T>
static nd_status fill_bias_rows_typed(const nd_matmul_desc *d, int64_t rows, cudaStream_t stream) {
    ND_LAUNCH(bias_rows_kernel<T>, nd_cuda_blocks(rows * d->n, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
              stream, rows, d->n, (const T *)d->bias, d->bias_stride, (T *)d->out);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* out = the bias in every row of every product (the dtypes whose bias the
 * matmul adds: nd_cuda_matmul_adds_bias). */
static nd_status fill_bias_rows(const nd_matmul_desc *d, int64_t count, cudaStream_t stream) {
    const int64_t rows = count * d->m;
    switch (d->dtype) {
    case ND_FLOAT16: return fill_bias_rows_typed<nd_half_t>(d, rows, stream);
    case ND_BFLOAT16: return fill_bias_rows_typed<nd_bf16_t>(d, rows, stream);
    default: return nd_backend_lacks_dtype("cuda", "a matmul's bias", d->dtype);
    }
}

int nd_cuda_matmul_adds_bias(nd_dtype dtype) { return dtype == ND_FLOAT16 || dtype == ND_BFLOAT16; }

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

#define CUBLAS_OP_N_ 0
#define CUBLAS_OP_T_ 1

/* The (a, b, out) pointers of each matrix of the batch, for the pointer-array
 * GEMM; elements of storage type T. */
template <class T>
__global__ void gemm_pointers_kernel(int64_t m_n, const T *a, const T *b, T *out, gemm_batch batch,
                                     const void **a_ptrs, const void **b_ptrs, void **out_ptrs) {
    for (int64_t z = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; z < batch.count;
         z += (int64_t)gridDim.x * blockDim.x) {
        int64_t a_off = 0, b_off = 0, rest = z;
        for (int d = batch.ndim - 1; d >= 0; d--) {
            int64_t c = rest % batch.shape[d];
            rest /= batch.shape[d];
            a_off += c * batch.a[d];
            b_off += c * batch.b[d];
        }
        a_ptrs[z] = a + a_off;
        b_ptrs[z] = b + b_off;
        out_ptrs[z] = out + z * m_n;
    }
}

template <class T>
static void launch_pointers(const nd_matmul_desc *d, const gemm_batch &g, const void **a_ptrs,
                            const void **b_ptrs, void **out_ptrs, cudaStream_t stream) {
    ND_LAUNCH(gemm_pointers_kernel<T>, nd_cuda_blocks(g.count, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
              stream, d->m * d->n, (const T *)d->a, (const T *)d->b, (T *)d->out, g, a_ptrs, b_ptrs,
              out_ptrs);
}

/* One pointer-array batched GEMM over the whole batch; the pointer arrays live in a
 * scratch block that goes back to the cache at once (later work on the
 * stream runs after the GEMM has read them). */
static nd_status cublas_matmul_pointers(nd_cublas_handle h, nd_device *dev, const nd_matmul_desc *d,
                                        const gemm_batch &g, int op_a, int64_t lda, int op_b,
                                        int64_t ldb) {
    const int64_t bytes = 3 * g.count * (int64_t)sizeof(void *);
    void *scratch = NULL;
    ND_TRY(nd_cuda_raw_alloc(dev, bytes, &scratch));
    const void **a_ptrs = (const void **)scratch;
    const void **b_ptrs = a_ptrs + g.count;
    void **out_ptrs = (void **)(b_ptrs + g.count);
    cudaStream_t stream = nd_cuda_stream();
    switch (d->dtype) {
    case ND_FLOAT16: launch_pointers<nd_half_t>(d, g, a_ptrs, b_ptrs, out_ptrs, stream); break;
    case ND_BFLOAT16: launch_pointers<nd_bf16_t>(d, g, a_ptrs, b_ptrs, out_ptrs, stream); break;
    case ND_FLOAT64: launch_pointers<double>(d, g, a_ptrs, b_ptrs, out_ptrs, stream); break;
    default: launch_pointers<float>(d, g, a_ptrs, b_ptrs, out_ptrs, stream); break;
    }
    nd_status status = ND_OK;
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess)
        status = nd_cublas_gemm_batched(h, d->dtype, op_b, op_a, (int)d->n, (int)d->m, (int)d->k,
                                        b_ptrs, (int)ldb, a_ptrs, (int)lda, out_ptrs, (int)d->n,
                                        (int)g.count, d->bias != NULL);
    nd_cuda_raw_free(dev, scratch, bytes);
    ND_CUDA_CHECK(err);
    return status;
}

/* The whole batched product in one cuBLAS call. */
static nd_status cublas_matmul(nd_cublas_handle h, nd_device *dev, const nd_matmul_desc *d,
                               const gemm_batch &g) {
    /* Column-major: C^T (n x m, ld n) = op(B^T) (n x k) op(A^T) (k x m). A
     * row-major operand (unit column stride) read column-major is already
     * its transpose: CUBLAS_OP_N with ld = row stride; a transposed one is
     * CUBLAS_OP_T with ld = column stride. */
    int op_b = d->b_col_stride == 1 ? CUBLAS_OP_N_ : CUBLAS_OP_T_;
    int64_t ldb = d->b_col_stride == 1 ? d->b_row_stride : d->b_col_stride;
    int op_a = d->a_col_stride == 1 ? CUBLAS_OP_N_ : CUBLAS_OP_T_;
    int64_t lda = d->a_col_stride == 1 ? d->a_row_stride : d->a_col_stride;
    if (g.ndim > 1) return cublas_matmul_pointers(h, dev, d, g, op_a, lda, op_b, ldb);
    long long stride_a = g.ndim == 1 ? g.a[0] : 0, stride_b = g.ndim == 1 ? g.b[0] : 0;
    return nd_cublas_gemm_strided(h, d->dtype, op_b, op_a, (int)d->n, (int)d->m, (int)d->k, d->b,
                                  (int)ldb, stride_b, d->a, (int)lda, stride_a, d->out, (int)d->n,
                                  (long long)(d->m * d->n), (int)g.count, d->bias != NULL);
}

/* One try of the whole product through cuBLAS, for the out-of-memory ladder
 * (a retry recomputes every output: out is fresh and never an operand; a
 * bias is written into it again first). */
typedef struct cublas_attempt {
    nd_cublas_handle h;
    nd_device *dev;
    const nd_matmul_desc *d;
    const gemm_batch *g;
} cublas_attempt;

static nd_status try_cublas(void *ctx) {
    const cublas_attempt *at = (const cublas_attempt *)ctx;
    if (at->d->bias != NULL) ND_TRY(fill_bias_rows(at->d, at->g->count, nd_cuda_stream()));
    return cublas_matmul(at->h, at->dev, at->d, *at->g);
}

nd_status nd_cuda_matmul(const nd_matmul_desc *d) {
    if (d->dtype != ND_FLOAT32 && d->dtype != ND_FLOAT16 && d->dtype != ND_BFLOAT16 &&
        d->dtype != ND_FLOAT64)
        return nd_backend_lacks_dtype("cuda", "matmul", d->dtype);
    gemm_batch g;
    batch_make(d, &g);
    if (g.count == 0 || d->m == 0 || d->n == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(d->out, &dev));
    cudaStream_t stream = nd_cuda_stream();
    if (d->k == 0 && d->bias != NULL) return fill_bias_rows(d, g.count, stream);
    if (d->k == 0) {
        ND_CUDA_CHECK(nd_cuda_memset(
            d->out, 0, (size_t)(g.count * d->m * d->n * nd_dtype_size(d->dtype)), stream));
        return ND_OK;
    }
    int64_t lda = d->a_col_stride == 1 ? d->a_row_stride : d->a_col_stride;
    int64_t ldb = d->b_col_stride == 1 ? d->b_row_stride : d->b_col_stride;
    int cublas_ok = fits_int(d->m) && fits_int(d->n) && fits_int(d->k) && fits_int(lda) &&
                    fits_int(ldb) && fits_int(g.count);
    /* A cuBLAS without this dtype's GEMM leaves it to the kernel. */
    nd_cublas_handle h = cublas_ok ? nd_cublas_handle_for(dev) : NULL;
    if (h != NULL && !nd_cublas_supports(d->dtype)) h = NULL;
    if (h != NULL) {
        cublas_attempt at = {h, dev, d, &g};
        nd_status status = nd_memory_retry(dev, nd_cublas_workspace_bytes(dev), try_cublas, &at);
        /* Still short of memory after the ladder: the kernel needs none. */
        if (status != ND_ERR_OOM) return status;
    }
    return gemm(d, g, stream);
}
