/* cuda_fused_rows.cu: the CUDA backend's fused row operations (nd_norm_desc
 * and nd_attn_desc in internal.h): the layer norm, forward in one kernel and
 * backward in two (dx with each chunk's column sums, then the sums over
 * chunks), where the course's composition of ops takes 14 launches forward
 * and about 25 backward; and the attention softmax (scale, causal mask,
 * softmax) in one kernel each way, where the course's ops take six forward
 * and about a dozen backward.
 *
 * A warp takes a row (the course's rows are short: 20 features, 20 keys);
 * its sums are butterfly shuffles, which leave the same bits in every lane.
 * The layer norm backward's blocks stride over chunks of rows; inside a
 * chunk, a tile of one row per warp is normalised, its statistics kept in
 * shared memory, and then the block's threads add the tile's g * xhat and g
 * into the chunk's column sums, one column per thread, rows in order. The
 * sums over chunks run in chunk order, in double: the gradients are the same
 * bits on every run. Grid-stride loops throughout, so any grid is correct.
 */
#include "cuda_common.cuh"

#include <float.h>
#include <math.h>

#define FULL_MASK 0xffffffffu
#define WARPS_PER_BLOCK (ND_CUDA_THREADS / 32)

/* The sum of v over the warp, in every lane. */
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int delta = 16; delta > 0; delta /= 2) v += __shfl_xor_sync(FULL_MASK, v, delta);
    return v;
}

/* The maximum of v over the warp, in every lane (NaN ignored, as fmaxf). */
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int delta = 16; delta > 0; delta /= 2) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, delta));
    return v;
}

/* The sum of v over the warp, in every lane, in double. */
__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
    for (int delta = 16; delta > 0; delta /= 2) v += __shfl_xor_sync(FULL_MASK, v, delta);
    return v;
}

/* Row x's mean and standard deviation sqrt(var + eps) (var biased), in
 * double, read by the calling warp: every lane of it must call. The layer
 * norm computes in double from its float32 inputs and rounds each result
 * once, as the host's does: its backward is a difference of terms that
 * cancel (for a row of three, sum(xhat**4) is constant and its gradient is
 * eps's effect alone), where float32 terms lose most of the result's digits. */
__device__ __forceinline__ void row_stats(const float *x, int64_t cols, float eps, int lane,
                                          double &mean, double &std) {
    double sum = 0.0;
    for (int64_t j = lane; j < cols; j += 32) sum += x[j];
    mean = warp_sum_double(sum) / (double)cols;
    double squares = 0.0;
    for (int64_t j = lane; j < cols; j += 32) {
        const double c = x[j] - mean;
        squares += c * c;
    }
    std = sqrt(warp_sum_double(squares) / (double)cols + eps);
}

/* A warp per row; the row index is the same in every lane of a warp, so
 * whole warps enter row_stats. */
__global__ void layer_norm_kernel(nd_norm_desc d) {
    const int lane = threadIdx.x % 32;
    for (int64_t r = (int64_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32; r < d.rows;
         r += (int64_t)gridDim.x * WARPS_PER_BLOCK) {
        const float *x = d.x + r * d.cols; /* (cols,) */
        float *y = d.out + r * d.cols;     /* (cols,) */
        double m, s;
        row_stats(x, d.cols, d.eps, lane, m, s);
        const double inv = 1.0 / s;
        for (int64_t j = lane; j < d.cols; j += 32)
            y[j] = (float)(d.w[j] * ((x[j] - m) * inv) + d.b[j]);
    }
}

/* dx row by row, and chunk k's column sums into partials[k] (2, cols). The
 * chunk and tile loops have the same bounds in every thread of a block, so
 * the whole block reaches each barrier. */
__global__ void layer_norm_grad_kernel(nd_norm_desc d) {
    __shared__ double tile_mean[WARPS_PER_BLOCK], tile_inv[WARPS_PER_BLOCK];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t cols = d.cols;
    for (int64_t k = blockIdx.x; k < d.chunks; k += gridDim.x) {
        const int64_t r0 = k * d.chunk_rows;
        const int64_t r1 = r0 + d.chunk_rows < d.rows ? r0 + d.chunk_rows : d.rows;
        float *pw = d.partials + k * 2 * cols, *pb = pw + cols; /* (cols,) each */
        for (int64_t t = r0; t < r1; t += WARPS_PER_BLOCK) {
            const int64_t r = t + warp;
            if (r < r1) {
                const float *x = d.x + r * cols, *g = d.g + r * cols; /* (cols,) each */
                float *dx = d.out + r * cols;                         /* (cols,) */
                double m, s;
                row_stats(x, cols, d.eps, lane, m, s);
                const double inv = 1.0 / s;
                double gw_sum = 0.0, gwx_sum = 0.0;
                for (int64_t j = lane; j < cols; j += 32) {
                    const double gw = (double)g[j] * d.w[j];
                    gw_sum += gw;
                    gwx_sum += gw * ((x[j] - m) * inv);
                }
                const double gw_mean = warp_sum_double(gw_sum) / (double)cols;
                const double gwx_mean = warp_sum_double(gwx_sum) / (double)cols;
                for (int64_t j = lane; j < cols; j += 32)
                    dx[j] =
                        (float)(((double)g[j] * d.w[j] - gw_mean - (x[j] - m) * inv * gwx_mean) *
                                inv);
                if (lane == 0) {
                    tile_mean[warp] = m;
                    tile_inv[warp] = inv;
                }
            }
            __syncthreads();
            const int n = (int)(r1 - t < WARPS_PER_BLOCK ? r1 - t : WARPS_PER_BLOCK);
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
                float sw = t == r0 ? 0.0f : pw[j], sb = t == r0 ? 0.0f : pb[j];
                for (int i = 0; i < n; i++) {
                    const float gv = d.g[(t + i) * cols + j];
                    sw += (float)(gv * ((d.x[(t + i) * cols + j] - tile_mean[i]) * tile_inv[i]));
                    sb += gv;
                }
                pw[j] = sw;
                pb[j] = sb;
            }
            __syncthreads(); /* the tile's statistics are overwritten next */
        }
    }
}

/* dw and db: a thread per column adds the chunks' partial sums in order. */
__global__ void layer_norm_grad_sum_kernel(nd_norm_desc d) {
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < 2 * d.cols;
         j += (int64_t)gridDim.x * blockDim.x) {
        double total = 0.0;
        for (int64_t k = 0; k < d.chunks; k++) total += d.partials[k * 2 * d.cols + j];
        if (j < d.cols) d.dw[j] = (float)total;
        else d.db[j - d.cols] = (float)total;
    }
}

nd_status nd_cuda_layer_norm(const nd_norm_desc *d) {
    ND_TRY(nd_cuda_activate(d->out, NULL));
    cudaStream_t stream = nd_cuda_stream();
    ND_LAUNCH(layer_norm_kernel, nd_cuda_blocks(d->rows, WARPS_PER_BLOCK), ND_CUDA_THREADS, 0,
              stream, *d);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

nd_status nd_cuda_layer_norm_grad(const nd_norm_desc *d) {
    ND_TRY(nd_cuda_activate(d->out, NULL));
    cudaStream_t stream = nd_cuda_stream();
    ND_LAUNCH(layer_norm_grad_kernel, nd_cuda_blocks(d->chunks, 1), ND_CUDA_THREADS, 0, stream, *d);
    ND_CUDA_CHECK(cudaGetLastError());
    ND_LAUNCH(layer_norm_grad_sum_kernel, nd_cuda_blocks(2 * d->cols, ND_CUDA_THREADS),
              ND_CUDA_THREADS, 0, stream, *d);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* ------------------------------------------------------ attention softmax */

/* Element j of a row's masked, scaled logits, as the course computes them:
 * keys from `visible` on get -FLT_MAX added. */
__device__ __forceinline__ float masked_logit(const float *x, int64_t j, int64_t visible,
                                              float divisor) {
    const float v = x[j] / divisor;
    return j < visible ? v : v + -FLT_MAX;
}

/* A warp per row: the max, the sum of exponentials, then the row written. */
__global__ void attention_softmax_kernel(nd_attn_desc d) {
    const int lane = threadIdx.x % 32;
    for (int64_t r = (int64_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32; r < d.rows;
         r += (int64_t)gridDim.x * WARPS_PER_BLOCK) {
        const float *x = d.x + r * d.cols; /* (cols,) */
        float *y = d.out + r * d.cols;     /* (cols,) */
        const int64_t visible = d.queries > 0 ? r % d.queries + d.cols - d.queries + 1 : d.cols;
        float m = -FLT_MAX;
        for (int64_t j = lane; j < d.cols; j += 32)
            m = fmaxf(m, masked_logit(x, j, visible, d.divisor));
        m = fminf(warp_max(m), FLT_MAX);
        float s = 0.0f;
        for (int64_t j = lane; j < d.cols; j += 32)
            s += expf(masked_logit(x, j, visible, d.divisor) - m);
        const float inv = 1.0f / warp_sum(s);
        for (int64_t j = lane; j < d.cols; j += 32)
            y[j] = expf(masked_logit(x, j, visible, d.divisor) - m) * inv;
    }
}

/* A warp per row: dx = y * (g - sum(g * y)) / divisor. */
__global__ void attention_softmax_grad_kernel(nd_attn_desc d) {
    const int lane = threadIdx.x % 32;
    for (int64_t r = (int64_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32; r < d.rows;
         r += (int64_t)gridDim.x * WARPS_PER_BLOCK) {
        const float *y = d.x + r * d.cols, *g = d.g + r * d.cols; /* (cols,) each */
        float *dx = d.out + r * d.cols;                           /* (cols,) */
        float dot = 0.0f;
        for (int64_t j = lane; j < d.cols; j += 32) dot += g[j] * y[j];
        dot = warp_sum(dot);
        for (int64_t j = lane; j < d.cols; j += 32) dx[j] = y[j] * (g[j] - dot) / d.divisor;
    }
}

nd_status nd_cuda_attention_softmax(const nd_attn_desc *d) {
    ND_TRY(nd_cuda_activate(d->out, NULL));
    cudaStream_t stream = nd_cuda_stream();
    ND_LAUNCH(attention_softmax_kernel, nd_cuda_blocks(d->rows, WARPS_PER_BLOCK), ND_CUDA_THREADS,
              0, stream, *d);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

nd_status nd_cuda_attention_softmax_grad(const nd_attn_desc *d) {
    ND_TRY(nd_cuda_activate(d->out, NULL));
    cudaStream_t stream = nd_cuda_stream();
    ND_LAUNCH(attention_softmax_grad_kernel, nd_cuda_blocks(d->rows, WARPS_PER_BLOCK),
              ND_CUDA_THREADS, 0, stream, *d);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
