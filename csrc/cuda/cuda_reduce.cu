/* cuda_reduce.cu: sum, max and min over any set of axes of a strided view,
 * the CUDA backend's reduce entry. Writes every output (the front end fills
 * nothing first), so a reduction that one pass can do is one launch.
 *
 * The host splits a's dims into kept ones (M outputs) and reduced ones (R
 * elements each), turns negative strides around (a reversed dim reduces to
 * the same value) and orders both sets by a's stride, so that dims merge and
 * the innermost of each set is its fastest in memory. Then one of two
 * kernels runs:
 * - rows (the reduced dims are the faster ones: a row sum, a full sum): G
 *   threads share an output, G = 1..32 lanes of a warp or a whole block,
 *   chosen so that a thread makes about REDUCE_UNROLL loads per row and the
 *   grid has FILL_BLOCKS blocks where the shape allows. A contiguous row is
 *   read in 16-byte loads between a scalar head (up to its first 16-byte
 *   boundary, found per row) and tail; other rows element by element.
 * - columns (the kept dims are faster: a column sum, a middle axis): a block
 *   is L lanes on neighbouring outputs times 256 / L rows along the reduced
 *   dims; a lane covers 4 neighbouring outputs with one 16-byte load per
 *   reduced index when a's layout keeps that aligned, else one; the rows of
 *   a block meet pairwise in shared memory.
 * When the outputs alone cannot fill the GPU and the reduction is long, it is
 * split over many blocks and the partial results (a scratch block from the
 * caching allocator, never a float atomic: results are the same run to run)
 * are reduced by a second launch of the same kernels. Without scratch (a
 * tight memory limit) the one-pass launch runs instead.
 *
 * Sums fold values in float into short runs and the runs into a total per
 * thread, then pairwise across threads: long sums stay near the CPU's
 * double-accumulated ones. NaN propagates in max and min, as on the CPU.
 * Every kernel is grid-stride over a plan fixed by the host, so any grid
 * size gives the same bits.
 *
 * The other dtypes (float16, bfloat16: accumulated in float; float64: in
 * double; the result stored in the dtype) run one simpler kernel, one pass:
 * a thread, a warp or a block per output, the same runs and pairwise
 * combination across threads, no 16-byte loads and no split.
 */
#include "cuda_common.cuh"
#include "cuda_dtype.cuh"

#include <math.h>
#include <string.h>

struct reduce_sum {
    static constexpr bool rounds = true; /* float rounding depends on the order */
    __device__ static float identity() { return 0.0f; }
    __device__ static float combine(float acc, float x) { return acc + x; }
    __device__ static double combine(double acc, double x) { return acc + x; }
};
struct reduce_max {
    static constexpr bool rounds = false;
    __device__ static float identity() { return -INFINITY; }
    __device__ static float combine(float acc, float x) { return (x > acc || x != x) ? x : acc; }
    __device__ static double combine(double acc, double x) { return (x > acc || x != x) ? x : acc; }
};
struct reduce_min {
    static constexpr bool rounds = false;
    __device__ static float identity() { return INFINITY; }
    __device__ static float combine(float acc, float x) { return (x < acc || x != x) ? x : acc; }
    __device__ static double combine(double acc, double x) { return (x < acc || x != x) ? x : acc; }
};

/* Threads per block of both kernels. */
#define REDUCE_THREADS ND_CUDA_THREADS
/* Loads a thread issues before it combines them: enough bytes in flight per
 * SM to cover the memory latency (256 threads x 4 x 16 bytes = 16 KiB a
 * block). A power of two. */
#define REDUCE_UNROLL 4
/* A thread's run holds this many folds of REDUCE_UNROLL loads before it goes
 * into the thread's total. */
#define REDUCE_RUN 16
/* A one-pass grid of fewer blocks leaves part of a large GPU idle (132 SMs on
 * an H100, each holding several blocks); a long reduction is split then. */
#define FILL_BLOCKS 256
/* Blocks a split aims at: several per SM of the largest GPUs. */
#define SPLIT_TARGET_BLOCKS 1024
/* A split row's slices have at least this many elements (32 KiB: each of a
 * block's threads makes two rounds of REDUCE_UNROLL 16-byte loads). */
#define ROW_MIN_CHUNK ((int64_t)8192)
/* A split column reduction's slices read at least this many bytes a block. */
#define COL_MIN_SLICE_BYTES ((int64_t)16384)
/* Floats of partial results a split column reduction keeps at most: its
 * second pass has few outputs and so few blocks, and must stay short. */
#define COL_PARTIAL_CAP ((int64_t)16384)

/* ------------------------------------------------------------ device side */

/* 16 bytes aligned as CUDA's float4, so that nvcc emits one 128-bit load. */
#ifdef NEEDLE_CUDA_SIM
struct __align__(16) reduce_vec4 {
    float x, y, z, w;
};
#else
typedef float4 reduce_vec4;
#endif

__device__ __forceinline__ reduce_vec4 load_vec4(const float *p) {
#ifdef NEEDLE_CUDA_SIM
    /* A GPU faults on a misaligned 16-byte load (cudaErrorMisalignedAddress);
     * the simulator reads NaN there instead, which any test sees. */
    reduce_vec4 v;
    if ((uintptr_t)p % sizeof v != 0) {
        v.x = v.y = v.z = v.w = NAN;
        return v;
    }
    memcpy(&v, p, sizeof v);
    return v;
#else
    return *reinterpret_cast<const reduce_vec4 *>(p);
#endif
}

template <class R> __device__ __forceinline__ float combine_any(float a, float b) {
    return R::combine(a, b);
}
template <class R>
__device__ __forceinline__ reduce_vec4 combine_any(const reduce_vec4 &a, const reduce_vec4 &b) {
    reduce_vec4 v;
    v.x = R::combine(a.x, b.x);
    v.y = R::combine(a.y, b.y);
    v.z = R::combine(a.z, b.z);
    v.w = R::combine(a.w, b.w);
    return v;
}
template <class R> __device__ __forceinline__ void set_identity(float &v) { v = R::identity(); }
template <class R> __device__ __forceinline__ void set_identity(reduce_vec4 &v) {
    v.x = v.y = v.z = v.w = R::identity();
}

/* Pairwise over the REDUCE_UNROLL loads of one step; the result is in v[0]. */
template <class R, class T> __device__ __forceinline__ T fold_loads(T (&v)[REDUCE_UNROLL]) {
#pragma unroll
    for (int width = REDUCE_UNROLL / 2; width > 0; width /= 2)
#pragma unroll
        for (int i = 0; i < width; i++) v[i] = combine_any<R>(v[i], v[i + width]);
    return v[0];
}

/* A thread's results so far, for V neighbouring outputs, in accumulator
 * type C: values go into a short run and every REDUCE_RUN adds the run into
 * the total, so that no float sum grows long. Max and min keep the run
 * alone (order is exact). */
template <class R, int V = 1, class C = float> struct reduce_acc {
    C total[V], run[V];
    int count;
    __device__ reduce_acc() : count(0) {
#pragma unroll
        for (int c = 0; c < V; c++) total[c] = run[c] = R::identity();
    }
    __device__ __forceinline__ void add(const C (&x)[V]) {
#pragma unroll
        for (int c = 0; c < V; c++) run[c] = R::combine(run[c], x[c]);
        if (R::rounds && ++count == REDUCE_RUN) {
#pragma unroll
            for (int c = 0; c < V; c++) {
                total[c] = R::combine(total[c], run[c]);
                run[c] = R::identity();
            }
            count = 0;
        }
    }
    __device__ __forceinline__ void add(C x) {
        const C one[1] = {x};
        add(one);
    }
    __device__ __forceinline__ C result(int c = 0) const {
        return R::rounds ? R::combine(total[c], run[c]) : run[c];
    }
};

/* Offsets of reduced indices: of a 1-D space (most calls: the reduced dims
 * merged into one), one multiply; of any other, the general walk, out of
 * line (inlined at each unrolled load it costs registers, and spills, that
 * the common loop needs). The kernels branch once between the two. */
struct line_offsets {
    int64_t stride;
    __device__ __forceinline__ int64_t operator()(int64_t r) const { return r * stride; }
};
struct walk_offsets {
    const nd_cuda_iter *space;
    __device__ __noinline__ int64_t operator()(int64_t r) const {
        int64_t off[1];
        nd_cuda_offsets<1>(*space, r, off);
        return off[0];
    }
};

/* Combines the values (of type C) of the G consecutive threads of a group
 * (G = 1..32 or REDUCE_THREADS); the result is valid in the group's first
 * thread. Every thread of the block calls it (the block-wide version
 * synchronises). */
template <class R, int G, class C = float>
__device__ __forceinline__ C group_reduce(C v, C *shared) {
    if constexpr (G == 1) {
        (void)shared;
        return v;
    } else if constexpr (G <= 32) {
        (void)shared;
        /* Lane 0 of a group only ever reads lanes of its own group. */
#pragma unroll
        for (int delta = G / 2; delta > 0; delta /= 2)
            v = R::combine(v, __shfl_down_sync(0xffffffffu, v, delta));
        return v;
    } else {
        static_assert(G == REDUCE_THREADS, "a group is part of a warp or the whole block");
        const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
#pragma unroll
        for (int delta = 16; delta > 0; delta /= 2)
            v = R::combine(v, __shfl_down_sync(0xffffffffu, v, delta));
        if (lane == 0) shared[warp] = v;
        __syncthreads();
        if (warp == 0) {
            v = lane < REDUCE_THREADS / 32 ? shared[lane] : R::identity();
#pragma unroll
            for (int delta = 16; delta > 0; delta /= 2)
                v = R::combine(v, __shfl_down_sync(0xffffffffu, v, delta));
        }
        __syncthreads(); /* shared is reused by the next item */
        return v;
    }
}

/* Lane `lane` of G folds its share of the contiguous run p[0, n): the
 * elements before p's first 16-byte boundary, then whole 16-byte vectors
 * (lane l takes vectors l, l + G, ...: a group's loads are neighbours), then
 * the rest. */
template <class R, int G>
__device__ __forceinline__ void fold_contiguous(const float *__restrict__ p, int64_t n, int lane,
                                                reduce_acc<R> &acc) {
    int64_t head = (int64_t)((16 - (uintptr_t)p % 16) % 16 / sizeof(float));
    if (head > n) head = n;
    for (int64_t i = lane; i < head; i += G) acc.add(p[i]);
    const float *body = p + head;
    const int64_t vectors = (n - head) / 4;
    for (int64_t k = lane; k < vectors; k += (int64_t)G * REDUCE_UNROLL) {
        reduce_vec4 v[REDUCE_UNROLL];
#pragma unroll
        for (int j = 0; j < REDUCE_UNROLL; j++) {
            const int64_t kj = k + (int64_t)j * G;
            if (kj < vectors) v[j] = load_vec4(body + 4 * kj);
            else set_identity<R>(v[j]);
        }
        const reduce_vec4 s = fold_loads<R>(v);
        acc.add(R::combine(R::combine(s.x, s.y), R::combine(s.z, s.w)));
    }
    for (int64_t i = head + 4 * vectors + lane; i < n; i += G) acc.add(p[i]);
}

/* Lane `lane` of G folds reduced indices [begin, end) of base, any strides. */
template <class R, int G, class Offsets>
__device__ __forceinline__ void fold_strided(Offsets offset, const float *__restrict__ base,
                                             int64_t begin, int64_t end, int lane,
                                             reduce_acc<R> &acc) {
    for (int64_t r = begin + lane; r < end; r += (int64_t)G * REDUCE_UNROLL) {
        float v[REDUCE_UNROLL];
#pragma unroll
        for (int j = 0; j < REDUCE_UNROLL; j++) {
            const int64_t rj = r + (int64_t)j * G;
            v[j] = rj < end ? base[offset(rj)] : R::identity();
        }
        acc.add(fold_loads<R>(v));
    }
}

/* The rows kernel. kept: (out, a) strides over the kept dims (M outputs);
 * reduced: (a) strides over the reduced dims (R each). Item w < M * parts is
 * output w / parts, reduced indices [p * chunk, (p + 1) * chunk) for
 * p = w % parts, folded by G threads (a block holds REDUCE_THREADS / G
 * items). VEC: the reduced dims are one contiguous run (stride 1). The
 * result goes to out (parts == 1) or partial[w] (partial: (M, parts)). */
template <class R, int G, bool VEC>
__global__ void __launch_bounds__(REDUCE_THREADS)
    reduce_rows_kernel(nd_cuda_iter kept, nd_cuda_iter reduced, int64_t parts, int64_t chunk,
                       float *out, float *partial, const float *__restrict__ a) {
    __shared__ float shared[REDUCE_THREADS / 32];
    constexpr int per_block = REDUCE_THREADS / G;
    const int lane = (int)threadIdx.x % G;
    const int64_t items = kept.numel * parts;
    /* The loop bound is uniform over the block, so every thread takes part in
     * every shuffle and barrier; threads past the last item fold nothing. */
    for (int64_t first = (int64_t)blockIdx.x * per_block; first < items;
         first += (int64_t)gridDim.x * per_block) {
        const int64_t w = first + (int64_t)threadIdx.x / G;
        reduce_acc<R> acc;
        int64_t koff[2] = {0, 0};
        if (w < items) {
            const int64_t o = parts == 1 ? w : w / parts, p = parts == 1 ? 0 : w % parts;
            nd_cuda_offsets<2>(kept, o, koff);
            const int64_t begin = p * chunk;
            const int64_t end = reduced.numel - begin < chunk ? reduced.numel : begin + chunk;
            if constexpr (VEC) fold_contiguous<R, G>(a + koff[1] + begin, end - begin, lane, acc);
            else if (reduced.ndim == 1)
                fold_strided<R, G>(line_offsets{reduced.strides[0][0]}, a + koff[1], begin, end,
                                   lane, acc);
            else fold_strided<R, G>(walk_offsets{&reduced}, a + koff[1], begin, end, lane, acc);
        }
        const float v = group_reduce<R, G>(acc.result(), shared);
        if (w < items && lane == 0) {
            if (partial != NULL) partial[w] = v;
            else out[koff[0]] = v;
        }
    }
}

/* Thread (lane, row) of the columns kernel folds reduced indices begin + row,
 * + rows, ... below end of its V neighbouring columns at base. */
template <class R, int V, class Offsets>
__device__ __forceinline__ void fold_columns(Offsets offset, const float *__restrict__ base,
                                             int64_t begin, int64_t end, int rows,
                                             reduce_acc<R, V> &acc) {
    for (int64_t r = begin; r < end; r += (int64_t)rows * REDUCE_UNROLL) {
        if constexpr (V == 4) {
            reduce_vec4 v[REDUCE_UNROLL];
#pragma unroll
            for (int j = 0; j < REDUCE_UNROLL; j++) {
                const int64_t rj = r + (int64_t)j * rows;
                if (rj < end) v[j] = load_vec4(base + offset(rj));
                else set_identity<R>(v[j]);
            }
            const reduce_vec4 s = fold_loads<R>(v);
            const float x[4] = {s.x, s.y, s.z, s.w};
            acc.add(x);
        } else {
            float v[REDUCE_UNROLL];
#pragma unroll
            for (int j = 0; j < REDUCE_UNROLL; j++) {
                const int64_t rj = r + (int64_t)j * rows;
                v[j] = rj < end ? base[offset(rj)] : R::identity();
            }
            acc.add(fold_loads<R>(v));
        }
    }
}

/* The columns kernel: a block is `lanes` threads across outputs times
 * rows = REDUCE_THREADS / lanes along the reduced dims (threads past
 * lanes * rows idle, but reach every barrier). Lane l of tile t covers the V
 * outputs from (t * lanes + l) * V (V == 4: the kept inner dim has a-stride 1
 * and a length that 4 divides, and a's steps keep 16-byte alignment). Slice
 * p of parts covers reduced indices [p * chunk, (p + 1) * chunk); the result
 * goes to out (parts == 1) or partial[p * M + o] (partial: (parts, M)). */
template <class R, int V>
__global__ void __launch_bounds__(REDUCE_THREADS)
    reduce_cols_kernel(nd_cuda_iter kept, nd_cuda_iter reduced, int lanes, int64_t parts,
                       float *out, float *partial, const float *__restrict__ a) {
    /* [c][thread]: the rows of a lane, and a warp's lanes, in different banks. */
    __shared__ float shared[V][REDUCE_THREADS];
    const int t = (int)threadIdx.x, rows = REDUCE_THREADS / lanes;
    const int lane = t % lanes, row = t / lanes;
    const int64_t groups = kept.numel / V;
    const int64_t tiles = (groups + lanes - 1) / lanes;
    const int64_t chunk = (reduced.numel + parts - 1) / parts;
    const int64_t out_step = kept.strides[0][kept.ndim - 1];
    int top = 1; /* the largest power of two below rows */
    while (2 * top < rows) top *= 2;
    /* Both loop bounds are uniform over the block. */
    for (int64_t p = blockIdx.y; p < parts; p += gridDim.y) {
        const int64_t begin = p * chunk;
        const int64_t end = reduced.numel - begin < chunk ? reduced.numel : begin + chunk;
        for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int64_t g = tile * lanes + lane;
            reduce_acc<R, V> acc;
            int64_t koff[2] = {0, 0};
            if (row < rows && g < groups) {
                nd_cuda_offsets<2>(kept, g * V, koff);
                if (reduced.ndim == 1)
                    fold_columns<R, V>(line_offsets{reduced.strides[0][0]}, a + koff[1],
                                       begin + row, end, rows, acc);
                else
                    fold_columns<R, V>(walk_offsets{&reduced}, a + koff[1], begin + row, end, rows,
                                       acc);
            }
#pragma unroll
            for (int c = 0; c < V; c++) shared[c][t] = acc.result(c);
            __syncthreads();
            for (int h = top; h > 0; h /= 2) {
                if (row < h && row + h < rows)
#pragma unroll
                    for (int c = 0; c < V; c++)
                        shared[c][t] = R::combine(shared[c][t], shared[c][t + h * lanes]);
                __syncthreads();
            }
            /* Row 0 reads only its own slots, which the next tile's threads
             * do not write: no barrier before the next tile. */
            if (row == 0 && g < groups) {
#pragma unroll
                for (int c = 0; c < V; c++) {
                    if (partial != NULL) partial[p * kept.numel + g * V + c] = shared[c][t];
                    else out[koff[0] + c * out_step] = shared[c][t];
                }
            }
        }
    }
}

/* The kernel of the other dtypes: G threads (1, a warp or the block) fold
 * each output's reduced elements of storage type T in accumulator type C
 * (nd_dtype_traits<T>::compute) and the first stores the result as a T.
 * kept: (out, a) strides over the kept dims; reduced: (a) strides. */
template <class T, class R, int G>
__global__ void __launch_bounds__(REDUCE_THREADS)
    reduce_typed_kernel(nd_cuda_iter kept, nd_cuda_iter reduced, T *out, const T *__restrict__ a) {
    typedef nd_dtype_traits<T> traits;
    typedef typename traits::compute C;
    __shared__ C shared[REDUCE_THREADS / 32];
    constexpr int per_block = REDUCE_THREADS / G;
    const int lane = (int)threadIdx.x % G;
    /* The loop bound is uniform over the block (see reduce_rows_kernel). */
    for (int64_t first = (int64_t)blockIdx.x * per_block; first < kept.numel;
         first += (int64_t)gridDim.x * per_block) {
        const int64_t o = first + (int64_t)threadIdx.x / G;
        reduce_acc<R, 1, C> acc;
        int64_t koff[2] = {0, 0};
        if (o < kept.numel) {
            nd_cuda_offsets<2>(kept, o, koff);
            const T *base = a + koff[1];
            if (reduced.ndim == 1) {
                const int64_t stride = reduced.strides[0][0];
                for (int64_t r = lane; r < reduced.numel; r += G)
                    acc.add(traits::load(base[r * stride]));
            } else {
                const walk_offsets offset{&reduced};
                for (int64_t r = lane; r < reduced.numel; r += G)
                    acc.add(traits::load(base[offset(r)]));
            }
        }
        const C v = group_reduce<R, G, C>(acc.result(), shared);
        if (o < kept.numel && lane == 0) out[koff[0]] = traits::store(v);
    }
}

/* -------------------------------------------------------------- host side */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <class R, int G, bool VEC>
static nd_status launch_rows_with(const nd_cuda_iter &kept, const nd_cuda_iter &reduced,
                                  int64_t parts, int64_t chunk, float *out, float *partial,
                                  const float *a, cudaStream_t stream) {
    const unsigned int blocks = nd_cuda_blocks(kept.numel * parts, REDUCE_THREADS / G);
    ND_LAUNCH((reduce_rows_kernel<R, G, VEC>), blocks, REDUCE_THREADS, 0, stream, kept, reduced,
              parts, chunk, out, partial, a);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

template <class R, bool VEC>
static nd_status launch_rows_vec(int group, const nd_cuda_iter &kept, const nd_cuda_iter &reduced,
                                 int64_t parts, int64_t chunk, float *out, float *partial,
                                 const float *a, cudaStream_t s) {
    switch (group) {
    case 1: return launch_rows_with<R, 1, VEC>(kept, reduced, parts, chunk, out, partial, a, s);
    case 2: return launch_rows_with<R, 2, VEC>(kept, reduced, parts, chunk, out, partial, a, s);
    case 4: return launch_rows_with<R, 4, VEC>(kept, reduced, parts, chunk, out, partial, a, s);
    case 8: return launch_rows_with<R, 8, VEC>(kept, reduced, parts, chunk, out, partial, a, s);
    case 16: return launch_rows_with<R, 16, VEC>(kept, reduced, parts, chunk, out, partial, a, s);
    case 32: return launch_rows_with<R, 32, VEC>(kept, reduced, parts, chunk, out, partial, a, s);
    default:
        return launch_rows_with<R, REDUCE_THREADS, VEC>(kept, reduced, parts, chunk, out, partial,
                                                        a, s);
    }
}

/* One launch of the rows kernel (partial NULL: results to out). */
template <class R>
static nd_status launch_rows(int group, bool vec, const nd_cuda_iter &kept,
                             const nd_cuda_iter &reduced, int64_t parts, int64_t chunk, float *out,
                             float *partial, const float *a, cudaStream_t s) {
    return vec ? launch_rows_vec<R, true>(group, kept, reduced, parts, chunk, out, partial, a, s)
               : launch_rows_vec<R, false>(group, kept, reduced, parts, chunk, out, partial, a, s);
}

/* Threads per row for m rows of `units` loads each: about REDUCE_UNROLL
 * loads a thread; more (never more than the row has) while the grid would
 * not fill the GPU; a whole block when warps per row would leave it short
 * and the row gives each thread two loads or more. */
static int rows_group(int64_t m, int64_t units) {
    int g = 1;
    while (g < 32 && (int64_t)g * REDUCE_UNROLL < units) g *= 2;
    while (g < 32 && g < units && ceil_div(m * g, REDUCE_THREADS) < FILL_BLOCKS) g *= 2;
    if (g == 32 && ceil_div(m * 32, REDUCE_THREADS) < FILL_BLOCKS && units >= 2 * REDUCE_THREADS)
        g = REDUCE_THREADS;
    return g;
}

/* kept with a's strides replaced by those of a row-major (M x per_output)
 * scratch block, for the second pass of a split. */
static nd_cuda_iter scratch_kept(const nd_cuda_iter &kept, int64_t per_output) {
    nd_cuda_iter k = kept;
    int64_t stride = per_output;
    for (int d = k.ndim - 1; d >= 0; d--) {
        k.strides[1][d] = stride;
        stride *= k.shape[d];
    }
    return k;
}

/* A 1-D reduced space of n indices stride apart. */
static nd_cuda_iter line_of(int64_t n, int64_t stride) {
    nd_cuda_iter it;
    memset(&it, 0, sizeof it);
    it.ndim = 1;
    it.numel = it.shape[0] = n;
    it.strides[0][0] = stride;
    return it;
}

/* The reduced dims are the faster ones. Few outputs of long rows (a full sum)
 * are split into slices a block each, whose (M, parts) partials a second
 * rows pass reduces. */
template <class R>
static nd_status reduce_rows(nd_device *dev, const nd_cuda_iter &kept, const nd_cuda_iter &reduced,
                             float *out, const float *a, bool may_split, cudaStream_t stream) {
    const bool vec = reduced.ndim == 1 && reduced.strides[0][0] == 1;
    const int64_t m = kept.numel, n = reduced.numel;
    const int group = rows_group(m, vec ? ceil_div(n, 4) : n);
    int64_t parts = 1, chunk = n;
    if (may_split && group == REDUCE_THREADS && m < FILL_BLOCKS) {
        parts = min64(ceil_div(SPLIT_TARGET_BLOCKS, m), n / ROW_MIN_CHUNK);
        if (parts >= 2) {
            /* Slices a multiple of 4 long: an aligned row stays aligned in each. */
            chunk = ceil_div(ceil_div(n, parts), 4) * 4;
            parts = ceil_div(n, chunk);
        }
    }
    void *scratch = NULL;
    const int64_t bytes = m * parts * (int64_t)sizeof(float);
    if (parts < 2 || dev == NULL || nd_cuda_raw_alloc(dev, bytes, &scratch) != ND_OK)
        return launch_rows<R>(group, vec, kept, reduced, 1, n, out, NULL, a, stream);
    float *partial = (float *)scratch; /* (M, parts) */
    nd_status status =
        launch_rows<R>(REDUCE_THREADS, vec, kept, reduced, parts, chunk, NULL, partial, a, stream);
    if (status == ND_OK)
        status = reduce_rows<R>(dev, scratch_kept(kept, parts), line_of(parts, 1), out, partial,
                                false, stream);
    /* Back to the cache at once: later kernels on the stream run after these. */
    nd_cuda_raw_free(dev, scratch, bytes);
    return status;
}

/* Whether 4 neighbouring outputs can be read with one aligned 16-byte load:
 * the kept inner dim is contiguous in a and 4 divides its length, and a's
 * start and every other step of a are multiples of 16 bytes. */
static bool columns_vec4(const nd_cuda_iter &kept, const nd_cuda_iter &reduced, const float *a) {
    const int inner = kept.ndim - 1;
    if (kept.strides[1][inner] != 1 || kept.shape[inner] % 4 != 0 || (uintptr_t)a % 16 != 0)
        return false;
    for (int d = 0; d < inner; d++)
        if (kept.strides[1][d] % 4 != 0) return false;
    for (int d = 0; d < reduced.ndim; d++)
        if (reduced.strides[0][d] % 4 != 0) return false;
    return true;
}

template <class R>
static nd_status launch_columns(int v, int lanes, int64_t parts, const nd_cuda_iter &kept,
                                const nd_cuda_iter &reduced, float *out, float *partial,
                                const float *a, cudaStream_t stream) {
    const dim3 grid(nd_cuda_blocks(ceil_div(kept.numel / v, lanes), 1), nd_cuda_blocks(parts, 1));
    if (v == 4)
        ND_LAUNCH((reduce_cols_kernel<R, 4>), grid, REDUCE_THREADS, 0, stream, kept, reduced, lanes,
                  parts, out, partial, a);
    else
        ND_LAUNCH((reduce_cols_kernel<R, 1>), grid, REDUCE_THREADS, 0, stream, kept, reduced, lanes,
                  parts, out, partial, a);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* The kept dims are the faster ones. Lanes per block: up to 32, fewer (down
 * to 128 bytes of a row, whole sectors) while that gives more tiles to a grid
 * that would not fill the GPU, more while a block would have more rows than
 * the reduction. Few tiles of long columns split the rows into slices whose
 * (parts, M) partials a second columns pass reduces. */
template <class R>
static nd_status reduce_columns(nd_device *dev, const nd_cuda_iter &kept,
                                const nd_cuda_iter &reduced, float *out, const float *a,
                                bool may_split, cudaStream_t stream) {
    const int v = columns_vec4(kept, reduced, a) ? 4 : 1;
    const int64_t m = kept.numel, n = reduced.numel, groups = m / v;
    int lanes = (int)min64(groups, 32);
    while (lanes > 32 / v && ceil_div(groups, lanes) < FILL_BLOCKS) lanes /= 2;
    while (lanes < groups && lanes < REDUCE_THREADS && REDUCE_THREADS / lanes > n) lanes *= 2;
    const int rows = REDUCE_THREADS / lanes;
    const int64_t tiles = ceil_div(groups, lanes);
    int64_t parts = 1;
    if (may_split && tiles < FILL_BLOCKS) {
        const int64_t row_bytes = (int64_t)lanes * v * (int64_t)sizeof(float);
        const int64_t min_rows =
            max64((int64_t)rows * REDUCE_UNROLL, ceil_div(COL_MIN_SLICE_BYTES, row_bytes));
        parts =
            min64(min64(ceil_div(SPLIT_TARGET_BLOCKS, tiles), n / min_rows), COL_PARTIAL_CAP / m);
    }
    void *scratch = NULL;
    const int64_t bytes = parts * m * (int64_t)sizeof(float);
    if (parts < 2 || dev == NULL || nd_cuda_raw_alloc(dev, bytes, &scratch) != ND_OK)
        return launch_columns<R>(v, lanes, 1, kept, reduced, out, NULL, a, stream);
    float *partial = (float *)scratch; /* (parts, M) */
    nd_status status = launch_columns<R>(v, lanes, parts, kept, reduced, NULL, partial, a, stream);
    if (status == ND_OK)
        status = reduce_columns<R>(dev, scratch_kept(kept, 1), line_of(parts, m), out, partial,
                                   false, stream);
    /* Back to the cache at once: later kernels on the stream run after these. */
    nd_cuda_raw_free(dev, scratch, bytes);
    return status;
}

template <class R>
static nd_status reduce_any(nd_device *dev, const nd_cuda_iter &kept, const nd_cuda_iter &reduced,
                            float *out, const float *a) {
    const cudaStream_t stream = nd_cuda_stream();
    /* After ordering, the innermost dims are the fastest: lanes of the
     * columns kernel read neighbouring elements when the kept one is faster. */
    if (kept.numel > 1 && kept.strides[1][kept.ndim - 1] < reduced.strides[0][reduced.ndim - 1])
        return reduce_columns<R>(dev, kept, reduced, out, a, true, stream);
    return reduce_rows<R>(dev, kept, reduced, out, a, true, stream);
}

template <class T, class R, int G>
static nd_status launch_typed_with(const nd_cuda_iter &kept, const nd_cuda_iter &reduced, T *out,
                                   const T *a) {
    const unsigned int blocks = nd_cuda_blocks(kept.numel, REDUCE_THREADS / G);
    ND_LAUNCH((reduce_typed_kernel<T, R, G>), blocks, REDUCE_THREADS, 0, nd_cuda_stream(), kept,
              reduced, out, a);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* Storage type T (not float): one launch. Kept dims faster than the reduced
 * ones: a thread per output (neighbouring threads read neighbouring
 * elements); else a warp per output, or the whole block when few outputs of
 * long rows would leave the GPU idle. */
template <class T, class R>
static nd_status reduce_typed(const nd_cuda_iter &kept, const nd_cuda_iter &reduced, T *out,
                              const T *a) {
    const int64_t m = kept.numel, n = reduced.numel;
    if (n <= 1 || (m > 1 && kept.strides[1][kept.ndim - 1] < reduced.strides[0][reduced.ndim - 1]))
        return launch_typed_with<T, R, 1>(kept, reduced, out, a);
    if (ceil_div(m * 32, REDUCE_THREADS) < FILL_BLOCKS && n >= 2 * REDUCE_THREADS)
        return launch_typed_with<T, R, REDUCE_THREADS>(kept, reduced, out, a);
    return launch_typed_with<T, R, 32>(kept, reduced, out, a);
}

template <class T>
static nd_status reduce_typed_op(nd_reduce_op op, const nd_cuda_iter &kept,
                                 const nd_cuda_iter &reduced, void *out, const void *a) {
    T *o = (T *)out;
    const T *x = (const T *)a;
    switch (op) {
    case ND_REDUCE_SUM: return reduce_typed<T, reduce_sum>(kept, reduced, o, x);
    case ND_REDUCE_MAX: return reduce_typed<T, reduce_max>(kept, reduced, o, x);
    case ND_REDUCE_MIN: return reduce_typed<T, reduce_min>(kept, reduced, o, x);
    default: return nd_fail(ND_ERR_VALUE, "unknown reduction %d", (int)op);
    }
}

/* An iteration space over the given dims, merged where every operand steps
 * through two as one, ordered by operand order_by's stride (largest first). */
static void make_iter(nd_cuda_iter *it, int ndim, const int64_t *shape, int nops,
                      const nd_layout *const *layouts, int order_by) {
    memset(it, 0, sizeof *it);
    it->numel = 1;
    for (int d = 0; d < ndim; d++) it->numel *= shape[d];
    it->ndim = nd_coalesce(ndim, shape, nops, layouts, order_by, it->shape, it->strides);
}

nd_status nd_cuda_reduce(nd_reduce_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                         const nd_layout *a_layout, const void *a) {
    if (dtype != ND_FLOAT32 && dtype != ND_FLOAT16 && dtype != ND_BFLOAT16 && dtype != ND_FLOAT64)
        return nd_backend_lacks_dtype("cuda", "a reduction", dtype);
    /* Split the dims: reduced ones have out-stride 0 and length > 1. A dim
     * that a walks backwards is walked forwards from its other end (out
     * too, for a kept one). */
    nd_layout kept_out, kept_a, red_a;
    memset(&kept_out, 0, sizeof kept_out);
    memset(&kept_a, 0, sizeof kept_a);
    memset(&red_a, 0, sizeof red_a);
    int64_t kept_shape[ND_MAX_DIMS], red_shape[ND_MAX_DIMS];
    int64_t out_off = out_layout->offset, a_off = a_layout->offset;
    for (int d = 0; d < a_layout->ndim; d++) {
        const int64_t n = a_layout->shape[d];
        int64_t sa = a_layout->strides[d], so = out_layout->strides[d];
        if (n == 1) continue;
        if (sa < 0) {
            a_off += sa * (n - 1);
            out_off += so * (n - 1);
            sa = -sa;
            so = -so;
        }
        if (so == 0) {
            red_shape[red_a.ndim] = n;
            red_a.strides[red_a.ndim++] = sa;
        } else {
            kept_shape[kept_out.ndim] = n;
            kept_out.strides[kept_out.ndim++] = so;
            kept_a.strides[kept_a.ndim++] = sa;
        }
    }
    nd_cuda_iter kept, reduced;
    const nd_layout *kl[2] = {&kept_out, &kept_a};
    const nd_layout *rl[1] = {&red_a};
    make_iter(&kept, kept_out.ndim, kept_shape, 2, kl, 1);
    make_iter(&reduced, red_a.ndim, red_shape, 1, rl, 0);
    if (kept.numel == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(out, &dev));
    /* Offsets in elements of the dtype. */
    switch (dtype) {
    case ND_FLOAT16:
        return reduce_typed_op<nd_half_t>(op, kept, reduced, (nd_half_t *)out + out_off,
                                          (const nd_half_t *)(const void *)a + a_off);
    case ND_BFLOAT16:
        return reduce_typed_op<nd_bf16_t>(op, kept, reduced, (nd_bf16_t *)out + out_off,
                                          (const nd_bf16_t *)(const void *)a + a_off);
    case ND_FLOAT64:
        return reduce_typed_op<double>(op, kept, reduced, (double *)out + out_off,
                                       (const double *)(const void *)a + a_off);
    default: break; /* float32: below */
    }
    float *o = (float *)out + out_off;
    const float *x = (const float *)a + a_off;
    switch (op) {
    case ND_REDUCE_SUM: return reduce_any<reduce_sum>(dev, kept, reduced, o, x);
    case ND_REDUCE_MAX: return reduce_any<reduce_max>(dev, kept, reduced, o, x);
    case ND_REDUCE_MIN: return reduce_any<reduce_min>(dev, kept, reduced, o, x);
    default: return nd_fail(ND_ERR_VALUE, "unknown reduction %d", (int)op);
    }
}
