/* cuda_gather.cu: row indexing on the GPU (embedding lookups and their
 * gradient): gather rows of a table by index, and add rows into a table by
 * index (atomicAdd, so repeated indices accumulate; their order, and so the
 * last bits of a sum, may differ from the CPU's fixed order); and the check
 * of indices (also the backend's check_indices entry, for the softmax
 * cross-entropy's labels).
 *
 * Indices are float32 holding integers. A bad index (not an integer in
 * [0, rows)) must give the CPU backend's IndexError, never a fault, and must
 * not make the host wait for the GPU in the middle of a training step: the
 * kernels check every index as they read it, skip a bad one (a gathered row
 * of zeros, a scatter that adds nothing) and record the first bad one
 * (position and value) in a word of page-locked memory that the GPU writes
 * directly. The host reads those words at the next synchronisation, a copy
 * to the host (reading the loss) or ndl.cuda.synchronize(): the error is
 * then reported there, with the message the CPU gives at the call, as CUDA
 * reports a kernel's errors asynchronously. One word per checked launch, in
 * a ring of CHECK_SLOTS per GPU; a full ring is drained with a synchronize.
 */
#include "cuda_common.cuh"

#include <math.h>
#include <string.h>

#define NO_BAD_INDEX 0xFFFFFFFFFFFFFFFFull
#define CHECK_SLOTS 64

/* The row an index names, or -1 when it is not an integer in [0, rows); a
 * bad one lowers *first_bad to (position << 32 | the value's bits), so the
 * smallest position wins and its value comes with it. */
__device__ __forceinline__ int64_t checked_row(float v, int64_t r, int64_t rows,
                                               unsigned long long *first_bad) {
    /* In double: (float)rows may round up past the last row. */
    bool ok = (double)v >= 0.0 && (double)v < (double)rows;
    if (ok) ok = (float)(long long)v == v;
    if (ok) return (int64_t)v;
    atomicMin(first_bad, (unsigned long long)r << 32 | (unsigned long long)__float_as_uint(v));
    return -1;
}

/* idx (n,) with stride is, each checked against rows. */
__global__ void check_indices_kernel(int64_t n, const float *idx, int64_t is, int64_t rows,
                                     unsigned long long *first_bad) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < n;
         r += (int64_t)gridDim.x * blockDim.x)
        (void)checked_row(idx[r * is], r, rows, first_bad);
}

/* out (n, d) [r, j] = table (rows, d) [idx[r], j]; a row of zeros for a bad index. */
__global__ void gather_rows_kernel(int64_t n, int64_t d, float *out, int64_t os0, int64_t os1,
                                   const float *table, int64_t rows, int64_t ts0, int64_t ts1,
                                   const float *idx, int64_t is, unsigned long long *first_bad) {
    const int64_t total = n * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / d, j = i - r * d;
        const int64_t row = checked_row(idx[r * is], r, rows, first_bad);
        out[r * os0 + j * os1] = row >= 0 ? table[row * ts0 + j * ts1] : 0.0f;
    }
}

/* out (rows, d) [idx[r], j] += src (n, d) [r, j]; nothing for a bad index. */
__global__ void scatter_add_rows_kernel(int64_t n, int64_t d, float *out, int64_t rows, int64_t os0,
                                        int64_t os1, const float *src, int64_t ss0, int64_t ss1,
                                        const float *idx, int64_t is,
                                        unsigned long long *first_bad) {
    const int64_t total = n * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / d, j = i - r * d;
        const int64_t row = checked_row(idx[r * is], r, rows, first_bad);
        if (row >= 0) atomicAdd(&out[row * os0 + j * os1], src[r * ss0 + j * ss1]);
    }
}

/* ------------------------------------------------ the asynchronous checks */

/* One checked launch: what its error would say. */
typedef struct index_check {
    int armed;
    int64_t seq; /* launch order */
    int64_t rows;
    const char *what, *unit;
} index_check;

typedef struct index_checks {
    unsigned long long *words; /* CHECK_SLOTS words of page-locked memory */
    index_check slots[CHECK_SLOTS];
    int next;
    int64_t seq;
} index_checks;

static index_checks checks[ND_CUDA_MAX_DEVICES];

/* The error of the earliest checked launch of dev that met a bad index, or
 * ND_OK; disarms every slot. Only after the GPU has finished those launches. */
static nd_status report(nd_device *dev) {
    index_checks *c = &checks[dev->ordinal];
    if (c->words == NULL) return ND_OK;
    const volatile unsigned long long *words = c->words;
    int first = -1;
    for (int i = 0; i < CHECK_SLOTS; i++) {
        if (!c->slots[i].armed) continue;
        c->slots[i].armed = 0;
        if (words[i] != NO_BAD_INDEX && (first < 0 || c->slots[i].seq < c->slots[first].seq))
            first = i;
    }
    if (first < 0) return ND_OK;
    const unsigned long long word = words[first];
    const uint32_t bits = (uint32_t)(word & 0xFFFFFFFFu);
    float v;
    memcpy(&v, &bits, sizeof v);
    const index_check *s = &c->slots[first];
    return nd_index_error(s->what, v, s->rows, s->unit);
}

nd_status nd_cuda_index_errors(nd_device *dev) { return dev != NULL ? report(dev) : ND_OK; }

/* The word the next checked launch of dev writes its first bad index to, in
 * *word; when every slot is in use, first waits for the GPU and reports. */
static nd_status arm(nd_device *dev, int64_t n, int64_t rows, const char *what, const char *unit,
                     unsigned long long **word) {
    if (n > (int64_t)UINT32_MAX)
        return nd_fail(ND_ERR_VALUE, "at most %llu %ss can be checked at once, got %lld",
                       (unsigned long long)UINT32_MAX, what, (long long)n);
    index_checks *c = &checks[dev->ordinal];
    if (c->words == NULL) {
        void *words = NULL;
        if (cudaMallocHost(&words, CHECK_SLOTS * sizeof(unsigned long long)) != cudaSuccess) {
            (void)cudaGetLastError();
            return nd_fail(ND_ERR_OOM, "no page-locked host memory for the GPU's index checks");
        }
        c->words = (unsigned long long *)words;
    }
    index_check *s = &c->slots[c->next];
    if (s->armed) { /* the ring is full: the oldest launches must be done first */
        ND_CUDA_CHECK(nd_cuda_synchronize());
        ND_TRY(report(dev));
    }
    c->words[c->next] = NO_BAD_INDEX; /* not armed: no launch writes it now */
    s->armed = 1;
    s->seq = c->seq++;
    s->rows = rows;
    s->what = what;
    s->unit = unit;
    *word = &c->words[c->next];
    c->next = (c->next + 1) % CHECK_SLOTS;
    return ND_OK;
}

nd_status nd_cuda_check_indices(const nd_layout *idx_layout, const float *idx, int64_t count,
                                const char *what, const char *unit) {
    if (idx_layout->shape[0] == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(idx, &dev));
    const int64_t n = idx_layout->shape[0];
    unsigned long long *first_bad = NULL;
    ND_TRY(arm(dev, n, count, what, unit, &first_bad));
    ND_LAUNCH(check_indices_kernel, nd_cuda_blocks(n, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
              nd_cuda_stream(), n, idx + idx_layout->offset, idx_layout->strides[0], count,
              first_bad);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

nd_status nd_cuda_gather_rows(const nd_layout *out_layout, float *out,
                              const nd_layout *table_layout, const float *table,
                              const nd_layout *idx_layout, const float *idx) {
    int64_t n = idx_layout->shape[0], d = table_layout->shape[1];
    if (n == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(idx, &dev));
    cudaStream_t stream = nd_cuda_stream();
    const float *ip = idx + idx_layout->offset;
    const int64_t rows = table_layout->shape[0];
    unsigned long long *first_bad = NULL;
    ND_TRY(arm(dev, n, rows, "index", "rows", &first_bad));
    /* Zero-width rows: the buffers may be NULL, and nothing is copied; the
     * indices are still checked. */
    if (d == 0)
        ND_LAUNCH(check_indices_kernel, nd_cuda_blocks(n, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
                  stream, n, ip, idx_layout->strides[0], rows, first_bad);
    else
        ND_LAUNCH(gather_rows_kernel, nd_cuda_blocks(n * d, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
                  stream, n, d, out + out_layout->offset, out_layout->strides[0],
                  out_layout->strides[1], table + table_layout->offset, rows,
                  table_layout->strides[0], table_layout->strides[1], ip, idx_layout->strides[0],
                  first_bad);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

nd_status nd_cuda_scatter_add_rows(const nd_layout *out_layout, float *out,
                                   const nd_layout *src_layout, const float *src,
                                   const nd_layout *idx_layout, const float *idx) {
    int64_t n = idx_layout->shape[0], d = out_layout->shape[1];
    if (n == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(idx, &dev));
    cudaStream_t stream = nd_cuda_stream();
    const float *ip = idx + idx_layout->offset;
    const int64_t rows = out_layout->shape[0];
    unsigned long long *first_bad = NULL;
    ND_TRY(arm(dev, n, rows, "index", "rows", &first_bad));
    if (d == 0)
        ND_LAUNCH(check_indices_kernel, nd_cuda_blocks(n, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
                  stream, n, ip, idx_layout->strides[0], rows, first_bad);
    else
        ND_LAUNCH(scatter_add_rows_kernel, nd_cuda_blocks(n * d, ND_CUDA_THREADS), ND_CUDA_THREADS,
                  0, stream, n, d, out + out_layout->offset, rows, out_layout->strides[0],
                  out_layout->strides[1], src + src_layout->offset, src_layout->strides[0],
                  src_layout->strides[1], ip, idx_layout->strides[0], first_bad);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
