/* cuda_reduce.cu: sum, max and min over any set of axes of a strided view,
 * the CUDA backend's reduce entry.
 *
 * The front end passes out with a's shape and stride 0 along the reduced
 * axes, already filled with the identity; the result is combined into it.
 * The host splits the axes into kept ones (M outputs) and reduced ones (R
 * elements each). When the reduced axes are outer in memory (a column sum)
 * and there are at least 32 outputs, the outer kernel runs: a block is 8
 * rows of 32 threads, the 32 on neighbouring outputs (coalesced reads), the
 * 8 rows stepping along the reduced axes, combined in shared memory; few
 * output tiles and long columns split R over gridDim.y too, through a
 * scratch block and a second pass. Otherwise the host picks how many
 * threads share one output: 1 (a thread loops over R), a warp (rows that
 * are contiguous in memory), or a whole block (few outputs, long rows: a
 * tree reduction through shuffles and shared memory); a few very long rows
 * (a full sum) are split over many blocks and reduced in two passes through
 * a scratch block from the caching allocator. NaN propagates in max and
 * min, as on the CPU. Sums accumulate in float in short runs per thread and
 * then pairwise, so long sums stay close to the CPU's double-accumulated
 * ones. Every kernel is grid-stride: any grid size is correct.
 */
#include "cuda_common.cuh"

#include <math.h>
#include <string.h>

struct reduce_sum {
    __device__ static float identity() { return 0.0f; }
    __device__ static float combine(float acc, float x) { return acc + x; }
};
struct reduce_max {
    __device__ static float identity() { return -INFINITY; }
    __device__ static float combine(float acc, float x) { return (x > acc || x != x) ? x : acc; }
};
struct reduce_min {
    __device__ static float identity() { return INFINITY; }
    __device__ static float combine(float acc, float x) { return (x < acc || x != x) ? x : acc; }
};

/* Combines the values of the G consecutive threads of a group (G = 1, 32 or
 * ND_CUDA_THREADS); the result is valid in the group's first thread. Every
 * thread of the block calls it (the block-wide version synchronises). */
template <class R, int G> __device__ __forceinline__ float group_reduce(float v, float *shared) {
    if constexpr (G == 1) {
        (void)shared;
        return v;
    } else {
#pragma unroll
        for (int delta = 16; delta > 0; delta /= 2)
            v = R::combine(v, __shfl_down_sync(0xffffffffu, v, delta));
        if constexpr (G == 32) {
            (void)shared;
            return v;
        } else {
            const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
            if (lane == 0) shared[warp] = v;
            __syncthreads();
            if (warp == 0) {
                v = lane < (int)(blockDim.x / 32) ? shared[lane] : R::identity();
#pragma unroll
                for (int delta = 16; delta > 0; delta /= 2)
                    v = R::combine(v, __shfl_down_sync(0xffffffffu, v, delta));
            }
            __syncthreads(); /* shared is reused by the next output */
            return v;
        }
    }
}

/* kept: (out, a) strides over the kept dims (M = kept.numel outputs);
 * reduced: (a) strides over the reduced dims (R = reduced.numel each).
 * G threads cooperate on one output; a block holds ND_CUDA_THREADS / G groups. */
template <class R, int G>
__global__ void reduce_kernel(nd_cuda_iter kept, nd_cuda_iter reduced, float *out, const float *a) {
    __shared__ float shared[ND_CUDA_THREADS / 32];
    const int groups = ND_CUDA_THREADS / G;
    const int lane = threadIdx.x % G;
    /* The loop bound is uniform over a group, so whole groups (and, for
     * G == ND_CUDA_THREADS, the whole block) iterate together. */
    for (int64_t o = (int64_t)blockIdx.x * groups + threadIdx.x / G; o < kept.numel;
         o += (int64_t)gridDim.x * groups) {
        int64_t koff[2];
        nd_cuda_offsets<2>(kept, o, koff);
        float acc = R::identity();
        for (int64_t r = lane; r < reduced.numel; r += G) {
            int64_t roff[1];
            nd_cuda_offsets<1>(reduced, r, roff);
            acc = R::combine(acc, a[koff[1] + roff[0]]);
        }
        acc = group_reduce<R, G>(acc, shared);
        if (lane == 0) out[koff[0]] = R::combine(out[koff[0]], acc);
    }
}

/* The first pass of a split reduction (few outputs, very long rows): block w
 * reduces part w % parts of output w / parts, elements [p * chunk, (p + 1) *
 * chunk), into partial[w]. */
template <class R>
__global__ void reduce_partial_kernel(nd_cuda_iter kept, nd_cuda_iter reduced, int64_t chunk,
                                      int64_t parts, float *partial, const float *a) {
    __shared__ float shared[ND_CUDA_THREADS / 32];
    for (int64_t w = blockIdx.x; w < kept.numel * parts; w += gridDim.x) {
        const int64_t o = w / parts, p = w % parts;
        int64_t koff[2];
        nd_cuda_offsets<2>(kept, o, koff);
        const int64_t end = (p + 1) * chunk < reduced.numel ? (p + 1) * chunk : reduced.numel;
        float acc = R::identity();
        for (int64_t r = p * chunk + threadIdx.x; r < end; r += ND_CUDA_THREADS) {
            int64_t roff[1];
            nd_cuda_offsets<1>(reduced, r, roff);
            acc = R::combine(acc, a[koff[1] + roff[0]]);
        }
        acc = group_reduce<R, ND_CUDA_THREADS>(acc, shared);
        if (threadIdx.x == 0) partial[w] = acc;
    }
}

/* Offset of reduced index r; one multiply when the reduced dims merged into
 * one (most calls), else the general walk. */
__device__ __forceinline__ int64_t reduced_offset(const nd_cuda_iter &reduced, int64_t r) {
    if (reduced.ndim == 1) return r * reduced.strides[0][0];
    int64_t off[1];
    nd_cuda_offsets<1>(reduced, r, off);
    return off[0];
}

/* The outer kernel: OUTER_LANES neighbouring outputs per block, OUTER_ROWS
 * rows of threads along the reduced axes. Each thread folds runs of
 * OUTER_RUN of its elements into its total (short float sums, then sums of
 * those); the rows meet pairwise in shared memory. Slice p of `parts` covers
 * reduced indices [p * chunk, (p + 1) * chunk); with parts == 1 the result
 * is combined into out, else written to partial[p * M + o]. */
#define OUTER_LANES 32
#define OUTER_ROWS (ND_CUDA_THREADS / OUTER_LANES)
#define OUTER_RUN 64

template <class R>
__global__ void reduce_outer_kernel(nd_cuda_iter kept, nd_cuda_iter reduced, int64_t parts,
                                    float *out, float *partial, const float *a) {
    __shared__ float shared[OUTER_ROWS][OUTER_LANES + 1];
    const int lane = threadIdx.x % OUTER_LANES, row = threadIdx.x / OUTER_LANES;
    const int64_t tiles = (kept.numel + OUTER_LANES - 1) / OUTER_LANES;
    const int64_t chunk = (reduced.numel + parts - 1) / parts;
    const int64_t step = (int64_t)OUTER_ROWS * OUTER_RUN;
    /* Both loop bounds are uniform over the block, so every thread reaches
     * every __syncthreads. */
    for (int64_t p = blockIdx.y; p < parts; p += gridDim.y) {
        const int64_t begin = p * chunk;
        const int64_t end = begin + chunk < reduced.numel ? begin + chunk : reduced.numel;
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int64_t o = tile * OUTER_LANES + lane;
            int64_t koff[2] = {0, 0};
            float acc = R::identity();
            if (o < kept.numel) {
                nd_cuda_offsets<2>(kept, o, koff);
                const float *base = a + koff[1];
                for (int64_t r0 = begin + row; r0 < end; r0 += step) {
                    const int64_t r1 = r0 + step < end ? r0 + step : end;
                    float run = R::identity();
                    for (int64_t r = r0; r < r1; r += OUTER_ROWS)
                        run = R::combine(run, base[reduced_offset(reduced, r)]);
                    acc = R::combine(acc, run);
                }
            }
            shared[row][lane] = acc;
            __syncthreads();
            if (row == 0 && o < kept.numel) {
                float v[OUTER_ROWS];
#pragma unroll
                for (int i = 0; i < OUTER_ROWS; i++) v[i] = shared[i][lane];
#pragma unroll
                for (int width = OUTER_ROWS / 2; width > 0; width /= 2)
#pragma unroll
                    for (int i = 0; i < width; i++) v[i] = R::combine(v[i], v[i + width]);
                if (partial == NULL) out[koff[0]] = R::combine(out[koff[0]], v[0]);
                else partial[p * kept.numel + o] = v[0];
            }
            __syncthreads(); /* shared is reused by the next tile */
        }
    }
}

/* One launch of the outer kernel (p: parts, w: partial or NULL). */
template <class R>
static nd_status outer_pass(const nd_cuda_iter &kept, const nd_cuda_iter &red, int64_t p,
                            float *out, float *w, const float *a, cudaStream_t s) {
    const int64_t tiles = (kept.numel + OUTER_LANES - 1) / OUTER_LANES;
    dim3 grid(nd_cuda_blocks(tiles, 1), nd_cuda_blocks(p, 1));
    ND_LAUNCH(reduce_outer_kernel<R>, grid, ND_CUDA_THREADS, 0, s, kept, red, p, out, w, a);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* Enough blocks to fill a large GPU a few times over; slices of R shorter
 * than OUTER_MIN_SLICE are not worth a second pass. */
#define OUTER_TARGET_BLOCKS 1024
#define OUTER_MIN_SLICE ((int64_t)OUTER_ROWS * OUTER_RUN)

/* The outer reduction: one pass when there are enough output tiles to fill
 * the GPU (or no scratch can be had), else R split into slices whose
 * partial results (parts x M, from the caching allocator) are reduced by a
 * second, one-slice pass. */
template <class R>
static nd_status reduce_outer(nd_device *dev, const nd_cuda_iter &kept, const nd_cuda_iter &reduced,
                              float *out, const float *a, cudaStream_t stream) {
    const int64_t tiles = (kept.numel + OUTER_LANES - 1) / OUTER_LANES;
    int64_t parts = 1;
    if (tiles < OUTER_TARGET_BLOCKS) {
        parts = (OUTER_TARGET_BLOCKS + tiles - 1) / tiles;
        const int64_t most = (reduced.numel + OUTER_MIN_SLICE - 1) / OUTER_MIN_SLICE;
        if (parts > most) parts = most;
    }
    void *scratch = NULL;
    const int64_t bytes = parts * kept.numel * (int64_t)sizeof(float);
    if (parts > 1 && (dev == NULL || nd_cuda_raw_alloc(dev, bytes, &scratch) != ND_OK)) parts = 1;
    if (parts == 1) return outer_pass<R>(kept, reduced, 1, out, NULL, a, stream);
    float *partial = (float *)scratch;
    nd_status status = outer_pass<R>(kept, reduced, parts, out, partial, a, stream);
    if (status == ND_OK) {
        /* Second pass: output o's partials are partial[q * M + o], q < parts. */
        nd_cuda_iter kept2 = kept, slices;
        int64_t stride = 1;
        for (int d = kept2.ndim - 1; d >= 0; d--) {
            kept2.strides[1][d] = stride;
            stride *= kept2.shape[d];
        }
        memset(&slices, 0, sizeof slices);
        slices.ndim = 1;
        slices.numel = slices.shape[0] = parts;
        slices.strides[0][0] = kept.numel;
        status = outer_pass<R>(kept2, slices, 1, out, NULL, partial, stream);
    }
    /* Back to the cache at once: later kernels on the stream run after these. */
    nd_cuda_raw_free(dev, scratch, bytes);
    return status;
}

template <class R>
static nd_status reduce(const nd_cuda_iter &kept, const nd_cuda_iter &reduced, int group,
                        float *out, const float *a, cudaStream_t stream);

/* Rows at least this long, when there are few of them, are split over many
 * blocks (SPLIT_CHUNK elements each) and the partial results reduced again. */
#define SPLIT_MIN_ROW ((int64_t)1 << 16)
#define SPLIT_MAX_OUTPUTS 64
#define SPLIT_CHUNK ((int64_t)16384)

/* Two passes through a scratch block of kept.numel * parts partials. Returns
 * ND_ERR_OOM without launching anything when no scratch can be had. */
template <class R>
static nd_status reduce_split(nd_device *dev, const nd_cuda_iter &kept, const nd_cuda_iter &reduced,
                              float *out, const float *a, cudaStream_t stream) {
    int64_t parts = (reduced.numel + SPLIT_CHUNK - 1) / SPLIT_CHUNK;
    if (parts > 4096) parts = 4096;
    const int64_t chunk = (reduced.numel + parts - 1) / parts;
    const int64_t count = kept.numel * parts;
    void *scratch = NULL;
    if (dev == NULL) return ND_ERR_OOM;
    nd_status status = nd_cuda_raw_alloc(dev, count * (int64_t)sizeof(float), &scratch);
    if (status != ND_OK) return status;
    float *partial = (float *)scratch;
    ND_LAUNCH(reduce_partial_kernel<R>, nd_cuda_blocks(count, 1), ND_CUDA_THREADS, 0, stream, kept,
              reduced, chunk, parts, partial, a);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) {
        /* Second pass: the partials of output o are partial[o * parts + q]. */
        nd_cuda_iter kept2 = kept, rows;
        int64_t stride = parts;
        for (int d = kept2.ndim - 1; d >= 0; d--) {
            kept2.strides[1][d] = stride;
            stride *= kept2.shape[d];
        }
        memset(&rows, 0, sizeof rows);
        rows.ndim = 1;
        rows.numel = rows.shape[0] = parts;
        rows.strides[0][0] = 1;
        status = reduce<R>(kept2, rows, 32, out, partial, stream);
    }
    /* Back to the cache at once: later kernels on the stream run after these. */
    nd_cuda_raw_free(dev, scratch, count * (int64_t)sizeof(float));
    ND_CUDA_CHECK(err);
    return status;
}

template <class R>
static nd_status reduce(const nd_cuda_iter &kept, const nd_cuda_iter &reduced, int group,
                        float *out, const float *a, cudaStream_t stream) {
    const int64_t groups_per_block = ND_CUDA_THREADS / group;
    unsigned int blocks = nd_cuda_blocks(kept.numel, groups_per_block);
    if (group == 1)
        ND_LAUNCH((reduce_kernel<R, 1>), blocks, ND_CUDA_THREADS, 0, stream, kept, reduced, out, a);
    else if (group == 32)
        ND_LAUNCH((reduce_kernel<R, 32>), blocks, ND_CUDA_THREADS, 0, stream, kept, reduced, out,
                  a);
    else
        ND_LAUNCH((reduce_kernel<R, ND_CUDA_THREADS>), blocks, ND_CUDA_THREADS, 0, stream, kept,
                  reduced, out, a);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* How many threads share an output: M outputs of R elements each; the
 * innermost reduced dim has a-stride r_inner. */
static int choose_group(int64_t m, int64_t r, int64_t r_inner) {
    if (r < 16) return 1;
    if (r_inner == 1 || r_inner == -1) {
        /* Rows contiguous in memory: a warp reads each coalesced. */
        return (m < 1024 && r >= 8192) ? ND_CUDA_THREADS : 32;
    }
    /* The reduced axes are outer and the outer kernel did not take it (under
     * 32 outputs, or the kept axes are no faster in memory). */
    if (m >= 2048) return 1;
    return r >= 8192 ? ND_CUDA_THREADS : 32;
}

nd_status nd_cuda_reduce(nd_reduce_op op, const nd_layout *out_layout, float *out,
                         const nd_layout *a_layout, const float *a) {
    /* Split the dims: reduced ones have out-stride 0 and length > 1. */
    nd_layout kept_out, kept_a, red_a;
    kept_out.ndim = kept_a.ndim = red_a.ndim = 0;
    kept_out.offset = kept_a.offset = red_a.offset = 0;
    int64_t kept_shape[ND_MAX_DIMS], red_shape[ND_MAX_DIMS];
    for (int d = 0; d < a_layout->ndim; d++) {
        int64_t n = a_layout->shape[d];
        if (n == 1) continue;
        if (out_layout->strides[d] == 0) {
            red_shape[red_a.ndim] = n;
            red_a.strides[red_a.ndim++] = a_layout->strides[d];
        } else {
            kept_shape[kept_out.ndim] = n;
            kept_out.strides[kept_out.ndim++] = out_layout->strides[d];
            kept_a.strides[kept_a.ndim++] = a_layout->strides[d];
        }
    }
    nd_cuda_iter kept, reduced;
    const nd_layout *kl[2] = {&kept_out, &kept_a};
    const nd_layout *rl[1] = {&red_a};
    nd_cuda_iter_make(&kept, kept_out.ndim, kept_shape, 2, kl);
    nd_cuda_iter_make(&reduced, red_a.ndim, red_shape, 1, rl);
    if (kept.numel == 0 || reduced.numel == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(out, &dev));
    float *o = out + out_layout->offset;
    const float *x = a + a_layout->offset;
    cudaStream_t stream = 0;
    /* The reduced axes step through memory slower than the kept ones: the
     * outer kernel's lanes read neighbouring elements. */
    const int64_t r_inner = reduced.strides[0][reduced.ndim - 1];
    const int64_t k_inner = kept.strides[1][kept.ndim - 1];
    if (reduced.numel >= 16 && kept.numel >= OUTER_LANES &&
        (r_inner < 0 ? -r_inner : r_inner) > (k_inner < 0 ? -k_inner : k_inner)) {
        switch (op) {
        case ND_REDUCE_SUM: return reduce_outer<reduce_sum>(dev, kept, reduced, o, x, stream);
        case ND_REDUCE_MAX: return reduce_outer<reduce_max>(dev, kept, reduced, o, x, stream);
        case ND_REDUCE_MIN: return reduce_outer<reduce_min>(dev, kept, reduced, o, x, stream);
        default: return nd_fail(ND_ERR_VALUE, "unknown reduction %d", (int)op);
        }
    }
    if (kept.numel <= SPLIT_MAX_OUTPUTS && reduced.numel >= SPLIT_MIN_ROW) {
        nd_status status = ND_ERR_OOM;
        switch (op) {
        case ND_REDUCE_SUM:
            status = reduce_split<reduce_sum>(dev, kept, reduced, o, x, stream);
            break;
        case ND_REDUCE_MAX:
            status = reduce_split<reduce_max>(dev, kept, reduced, o, x, stream);
            break;
        case ND_REDUCE_MIN:
            status = reduce_split<reduce_min>(dev, kept, reduced, o, x, stream);
            break;
        default: break;
        }
        /* Without scratch (a tight limit) the one-pass kernels below still work. */
        if (status != ND_ERR_OOM) return status;
    }
    int group = choose_group(kept.numel, reduced.numel, reduced.strides[0][reduced.ndim - 1]);
    switch (op) {
    case ND_REDUCE_SUM: return reduce<reduce_sum>(kept, reduced, group, o, x, stream);
    case ND_REDUCE_MAX: return reduce<reduce_max>(kept, reduced, group, o, x, stream);
    case ND_REDUCE_MIN: return reduce<reduce_min>(kept, reduced, group, o, x, stream);
    default: return nd_fail(ND_ERR_VALUE, "unknown reduction %d", (int)op);
    }
}
