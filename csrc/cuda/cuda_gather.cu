/* cuda_gather.cu: row indexing on the GPU (embedding lookups and their
 * gradient): gather rows of a table by index, and add rows into a table by
 * index (atomicAdd, so repeated indices accumulate; their order, and so the
 * last bits of a sum, may differ from the CPU's fixed order).
 *
 * Indices are float32 holding integers. Every index is checked on the device
 * before anything is written; the position of the first bad one comes back
 * through a per-GPU flag word, and the call fails with ND_ERR_INDEX and the
 * CPU backend's message, never with a fault. The flag word (8 bytes per GPU,
 * allocated once with cudaMalloc) is the backend's only memory outside the
 * caching allocator. The same check is the backend's check_indices entry
 * (the softmax cross-entropy's labels).
 */
#include "cuda_common.cuh"

#include <math.h>

#define NO_BAD_INDEX 0xFFFFFFFFFFFFFFFFull

/* first_bad: lowers to the smallest position r whose index is not an integer
 * in [0, rows). idx (n,) with stride is. */
__global__ void check_indices_kernel(int64_t n, const float *idx, int64_t is, int64_t rows,
                                     unsigned long long *first_bad) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < n;
         r += (int64_t)gridDim.x * blockDim.x) {
        const float v = idx[r * is];
        /* In double: (float)rows may round up past the last row. */
        bool ok = (double)v >= 0.0 && (double)v < (double)rows;
        if (ok) ok = (float)(long long)v == v;
        if (!ok) atomicMin(first_bad, (unsigned long long)r);
    }
}

/* out (n, d) [r, j] = table (rows, d) [idx[r], j]. */
__global__ void gather_rows_kernel(int64_t n, int64_t d, float *out, int64_t os0, int64_t os1,
                                   const float *table, int64_t ts0, int64_t ts1, const float *idx,
                                   int64_t is) {
    const int64_t total = n * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / d, j = i - r * d;
        const int64_t row = (int64_t)idx[r * is];
        out[r * os0 + j * os1] = table[row * ts0 + j * ts1];
    }
}

/* out (rows, d) [idx[r], j] += src (n, d) [r, j]. */
__global__ void scatter_add_rows_kernel(int64_t n, int64_t d, float *out, int64_t os0, int64_t os1,
                                        const float *src, int64_t ss0, int64_t ss1,
                                        const float *idx, int64_t is) {
    const int64_t total = n * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / d, j = i - r * d;
        const int64_t row = (int64_t)idx[r * is];
        atomicAdd(&out[row * os0 + j * os1], src[r * ss0 + j * ss1]);
    }
}

static unsigned long long *flags[ND_CUDA_MAX_DEVICES];

/* Checks idx (n,) against rows; the nd_index_error of the first bad one
 * (what: "index" or "label", unit: what rows counts). */
static nd_status check_indices(nd_device *dev, const nd_layout *idx_layout, const float *idx,
                               int64_t rows, const char *what, const char *unit,
                               cudaStream_t stream) {
    int64_t n = idx_layout->shape[0], is = idx_layout->strides[0];
    int ordinal = dev != NULL ? dev->ordinal : 0;
    if (flags[ordinal] == NULL)
        ND_CUDA_CHECK(nd_cuda_malloc((void **)&flags[ordinal], sizeof(unsigned long long)));
    unsigned long long *flag = flags[ordinal];
    ND_CUDA_CHECK(nd_cuda_memset(flag, 0xFF, sizeof *flag, stream));
    ND_LAUNCH(check_indices_kernel, nd_cuda_blocks(n, ND_CUDA_THREADS), ND_CUDA_THREADS, 0, stream,
              n, idx, is, rows, flag);
    ND_CUDA_CHECK(cudaGetLastError());
    unsigned long long first_bad = NO_BAD_INDEX;
    ND_CUDA_CHECK(nd_cuda_copy_to_host(&first_bad, flag, sizeof first_bad));
    if (first_bad == NO_BAD_INDEX) return ND_OK;
    float v = 0.0f;
    ND_CUDA_CHECK(nd_cuda_copy_to_host(&v, idx + (int64_t)first_bad * is, sizeof v));
    return nd_index_error(what, v, rows, unit);
}

nd_status nd_cuda_check_indices(const nd_layout *idx_layout, const float *idx, int64_t count,
                                const char *what, const char *unit) {
    if (idx_layout->shape[0] == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(idx, &dev));
    return check_indices(dev, idx_layout, idx + idx_layout->offset, count, what, unit, 0);
}

nd_status nd_cuda_gather_rows(const nd_layout *out_layout, float *out,
                              const nd_layout *table_layout, const float *table,
                              const nd_layout *idx_layout, const float *idx) {
    int64_t n = idx_layout->shape[0], d = table_layout->shape[1];
    if (n == 0) return ND_OK;
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(idx, &dev));
    cudaStream_t stream = 0;
    const float *ip = idx + idx_layout->offset;
    ND_TRY(check_indices(dev, idx_layout, ip, table_layout->shape[0], "index", "rows", stream));
    /* Zero-width rows: the buffers may be NULL, and there is nothing to copy. */
    if (d == 0) return ND_OK;
    ND_LAUNCH(gather_rows_kernel, nd_cuda_blocks(n * d, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
              stream, n, d, out + out_layout->offset, out_layout->strides[0],
              out_layout->strides[1], table + table_layout->offset, table_layout->strides[0],
              table_layout->strides[1], ip, idx_layout->strides[0]);
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
    cudaStream_t stream = 0;
    const float *ip = idx + idx_layout->offset;
    ND_TRY(check_indices(dev, idx_layout, ip, out_layout->shape[0], "index", "rows", stream));
    if (d == 0) return ND_OK;
    ND_LAUNCH(scatter_add_rows_kernel, nd_cuda_blocks(n * d, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
              stream, n, d, out + out_layout->offset, out_layout->strides[0],
              out_layout->strides[1], src + src_layout->offset, src_layout->strides[0],
              src_layout->strides[1], ip, idx_layout->strides[0]);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
