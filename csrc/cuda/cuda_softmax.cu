/* cuda_softmax.cu: the CUDA backend's softmax row kernels (nd_rows_desc in
 * internal.h): each row's statistics by an online max and sum of
 * exponentials (one read of the row), the elementwise passes that use them
 * (softmax, log-softmax, the cross-entropy gradient) and the cross-entropy
 * loss. Rows of float32, or of float16/bfloat16 (autocast's logits), read
 * and written as they are stored and computed in float32, as on the CPU: no
 * float32 copy of the logits or of their gradient.
 *
 * A short row (at most WARP_ROW_MAX elements) goes to a warp, a longer one
 * to a whole block; blocks stride over the rows. Each thread keeps its own
 * (max, sum) and the pairs are merged through shuffles and shared memory.
 * The max is clamped to finite values, as on the CPU, so a row of -inf gives
 * -inf and a +inf gives +inf; a NaN reaches the sum. The loss is summed in
 * double by one block in a fixed order, so it gives the same bits every
 * time: nd_array_softmax_xent_grad recognises a loss's statistics that way.
 * Labels arrive checked (softmax.c, through check_indices).
 */
#include "cuda_common.cuh"
#include "cuda_dtype.cuh"

#include <float.h>
#include <math.h>

#define WARP_ROW_MAX 1024
#define FULL_MASK 0xffffffffu

/* Adds v to a running (max m, sum s of exp(x - m)). */
__device__ __forceinline__ void stat_add(float &m, float &s, float v) {
    if (v > m) { /* a NaN compares false and goes into the sum */
        const float mn = fminf(v, FLT_MAX);
        s = s * expf(m - mn) + expf(v - mn);
        m = mn;
    } else {
        s += expf(v - m);
    }
}

/* Merges (m2, s2) into (m, s); symmetric, so every lane of a butterfly ends
 * with the same bits. */
__device__ __forceinline__ void stat_merge(float &m, float &s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

/* Merges the pairs of the G threads of a group (a warp, or the block); every
 * thread of the group gets the result. The block-wide version synchronises,
 * so every thread of the block must call it. */
template <int G>
__device__ __forceinline__ void group_stat(float &m, float &s, float *shared_m, float *shared_s) {
#pragma unroll
    for (int delta = 16; delta > 0; delta /= 2) {
        const float m2 = __shfl_xor_sync(FULL_MASK, m, delta);
        const float s2 = __shfl_xor_sync(FULL_MASK, s, delta);
        stat_merge(m, s, m2, s2);
    }
    if constexpr (G > 32) {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        if (lane == 0) {
            shared_m[warp] = m;
            shared_s[warp] = s;
        }
        __syncthreads();
        if (warp == 0) {
            m = lane < G / 32 ? shared_m[lane] : -FLT_MAX;
            s = lane < G / 32 ? shared_s[lane] : 0.0f;
#pragma unroll
            for (int delta = 16; delta > 0; delta /= 2) {
                const float m2 = __shfl_xor_sync(FULL_MASK, m, delta);
                const float s2 = __shfl_xor_sync(FULL_MASK, s, delta);
                stat_merge(m, s, m2, s2);
            }
            if (lane == 0) {
                shared_m[0] = m;
                shared_s[0] = s;
            }
        }
        __syncthreads();
        m = shared_m[0];
        s = shared_s[0];
        __syncthreads(); /* shared is reused by the next row */
    } else {
        (void)shared_m;
        (void)shared_s;
    }
}

/* Element j of row r of d.x, whose elements are T, as float. */
template <class T>
__device__ __forceinline__ float row_x(const nd_rows_desc &d, int64_t r, int64_t j) {
    return nd_dtype_traits<T>::load(((const T *)(const void *)d.x)[r * d.ldx + j]);
}

/* G threads per row, ND_CUDA_THREADS / G rows per block at a time. The loop
 * bound is uniform over a group, so a group's threads reach group_stat
 * together. T: the rows' element type. */
template <int G, class T> __global__ void row_stats_kernel(nd_rows_desc d) {
    __shared__ float shared_m[ND_CUDA_THREADS / 32], shared_s[ND_CUDA_THREADS / 32];
    const int groups = ND_CUDA_THREADS / G, lane = threadIdx.x % G;
    for (int64_t r = (int64_t)blockIdx.x * groups + threadIdx.x / G; r < d.rows;
         r += (int64_t)gridDim.x * groups) {
        float m = -FLT_MAX, s = 0.0f;
        for (int64_t j = lane; j < d.cols; j += G) stat_add(m, s, row_x<T>(d, r, j));
        group_stat<G>(m, s, shared_m, shared_s);
        if (lane == 0) {
            if (d.stats != NULL) {
                d.stats[2 * r] = m;
                d.stats[2 * r + 1] = s;
            }
            if (d.out != NULL) ((float *)d.out)[r * d.ldo] = (float)((double)m + log((double)s));
        }
    }
}

/* Row r's label, or -1 when it is not a class: the labels were checked
 * (check_indices), but on the GPU that check reports at the next
 * synchronisation, after these kernels ran, so they must not read past the
 * row with a bad one. */
__device__ __forceinline__ int64_t label_of(const nd_rows_desc &d, int64_t r) {
    const float v = d.labels[r * d.label_stride];
    const bool ok = (double)v >= 0.0 && (double)v < (double)d.cols && (float)(long long)v == v;
    return ok ? (int64_t)v : -1;
}

/* out's rows are T too. */
template <int G, class T> __global__ void row_apply_kernel(nd_rows_desc d) {
    typedef nd_dtype_traits<T> traits;
    __shared__ float shared_m[ND_CUDA_THREADS / 32], shared_s[ND_CUDA_THREADS / 32];
    const int groups = ND_CUDA_THREADS / G, lane = threadIdx.x % G;
    /* Kept statistics that are not these logits' (see nd_rows_desc): each row
     * computes its own. The same for every thread, so the groups' barriers
     * stay uniform. */
    const bool own_stats =
        d.kept_loss != NULL && __float_as_uint(*d.kept_loss) != __float_as_uint(*d.again_loss);
    /* ND_ROW_XENT_GRAD: out_grad / rows, the out_grad read here, on the device */
    const float k = d.mode == ND_ROW_XENT_GRAD
                        ? (float)((d.scale != NULL ? (double)d.scale[0] : 1.0) /
                                  (double)(d.rows > 0 ? d.rows : 1))
                        : 0.0f;
    for (int64_t r = (int64_t)blockIdx.x * groups + threadIdx.x / G; r < d.rows;
         r += (int64_t)gridDim.x * groups) {
        T *o = (T *)(void *)d.out + r * d.ldo; /* (cols,) */
        const int64_t y = d.labels != NULL ? label_of(d, r) : -1;
        float m, s;
        if (own_stats) {
            m = -FLT_MAX;
            s = 0.0f;
            for (int64_t j = lane; j < d.cols; j += G) stat_add(m, s, row_x<T>(d, r, j));
            group_stat<G>(m, s, shared_m, shared_s);
        } else {
            m = d.stats[2 * r];
            s = d.stats[2 * r + 1];
        }
        switch (d.mode) {
        case ND_ROW_SOFTMAX: {
            const float inv = 1.0f / s;
            for (int64_t j = lane; j < d.cols; j += G)
                o[j] = traits::store(expf(row_x<T>(d, r, j) - m) * inv);
            break;
        }
        case ND_ROW_LOG_SOFTMAX: {
            const float ls = (float)log((double)s);
            for (int64_t j = lane; j < d.cols; j += G)
                o[j] = traits::store((row_x<T>(d, r, j) - m) - ls);
            break;
        }
        default: { /* ND_ROW_XENT_GRAD; the label's element as (p - 1) * k, as on the CPU */
            const float w = k / s;
            for (int64_t j = lane; j < d.cols; j += G) {
                const float e = expf(row_x<T>(d, r, j) - m);
                o[j] = traits::store(j == y ? (e / s - 1.0f) * k : e * w);
            }
            break;
        }
        }
    }
}

/* One block: thread t sums rows t, t + ND_CUDA_THREADS, ... in double, then a
 * fixed tree adds the partial sums. */
template <class T> __global__ void xent_loss_kernel(nd_rows_desc d) {
    __shared__ double partial[ND_CUDA_THREADS];
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < d.rows; r += ND_CUDA_THREADS) {
        const int64_t y = label_of(d, r);
        const double m = d.stats[2 * r], s = d.stats[2 * r + 1];
        acc += y >= 0 ? (m - (double)row_x<T>(d, r, y)) + log(s) : (double)NAN;
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int w = ND_CUDA_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
        __syncthreads();
    }
    /* no rows: 0 / 0, nan, as on the CPU */
    if (threadIdx.x == 0) ((float *)d.out)[0] = (float)(partial[0] / (double)d.rows);
}

/* A warp per short row, a block per long one. */
static int row_group(int64_t cols) { return cols <= WARP_ROW_MAX ? 32 : ND_CUDA_THREADS; }

template <class T> static nd_status row_stats_as(const nd_rows_desc *d) {
    cudaStream_t stream = nd_cuda_stream();
    const int group = row_group(d->cols);
    const unsigned int blocks = nd_cuda_blocks(d->rows, ND_CUDA_THREADS / group);
    if (group == 32) ND_LAUNCH((row_stats_kernel<32, T>), blocks, ND_CUDA_THREADS, 0, stream, *d);
    else ND_LAUNCH((row_stats_kernel<ND_CUDA_THREADS, T>), blocks, ND_CUDA_THREADS, 0, stream, *d);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

template <class T> static nd_status row_apply_as(const nd_rows_desc *d) {
    cudaStream_t stream = nd_cuda_stream();
    const int group = row_group(d->cols);
    const unsigned int blocks = nd_cuda_blocks(d->rows, ND_CUDA_THREADS / group);
    if (group == 32) ND_LAUNCH((row_apply_kernel<32, T>), blocks, ND_CUDA_THREADS, 0, stream, *d);
    else ND_LAUNCH((row_apply_kernel<ND_CUDA_THREADS, T>), blocks, ND_CUDA_THREADS, 0, stream, *d);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

template <class T> static nd_status xent_loss_as(const nd_rows_desc *d) {
    cudaStream_t stream = nd_cuda_stream();
    ND_LAUNCH(xent_loss_kernel<T>, 1, ND_CUDA_THREADS, 0, stream, *d);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* f<T>(d) for the rows' element type: float32, float16 or bfloat16 (others go
 * through the front end's float32 copies: ND_ERR_DTYPE). */
#define ND_ROWS_BY_DTYPE(f, d)                                                  \
    switch ((d)->dtype) {                                                       \
    case ND_FLOAT32: return f<float>(d);                                        \
    case ND_FLOAT16: return f<nd_half_t>(d);                                    \
    case ND_BFLOAT16: return f<nd_bf16_t>(d);                                   \
    default: return nd_backend_lacks_dtype("cuda", "softmax rows", (d)->dtype); \
    }

nd_status nd_cuda_row_stats(const nd_rows_desc *d) {
    if (d->rows == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(d->x, NULL));
    ND_ROWS_BY_DTYPE(row_stats_as, d)
}

nd_status nd_cuda_row_apply(const nd_rows_desc *d) {
    if (d->rows == 0 || d->cols == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(d->out, NULL));
    ND_ROWS_BY_DTYPE(row_apply_as, d)
}

nd_status nd_cuda_xent_loss(const nd_rows_desc *d) {
    ND_TRY(nd_cuda_activate(d->out, NULL));
    ND_ROWS_BY_DTYPE(xent_loss_as, d)
}
