/* sim_cublas.cc (simulator): the cuBLAS stand-in (see sim_cublas.h): handles
 * that keep their stream and workspace, and single-precision GEMMs in
 * cuBLAS's column-major convention, strided or through arrays of pointers,
 * computed on the CPU. Device memory is host memory in the simulator, so
 * the operands (and the pointer arrays of a batched call, which cuBLAS
 * reads from device memory) are read where they are.
 */
#include "sim_cublas.h"

#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"

enum {
    STATUS_SUCCESS = 0,
    STATUS_NOT_INITIALIZED = 1,
    STATUS_INVALID_VALUE = 7,
};
enum { OP_N = 0, OP_T = 1, OP_C = 2 };

struct cublas_context {
    cudaStream_t stream;
    void *workspace;
    size_t workspace_bytes;
};

extern "C" int nd_sim_cublas_create(struct cublas_context **handle) {
    if (handle == nullptr) return STATUS_INVALID_VALUE;
    *handle = (struct cublas_context *)calloc(1, sizeof(struct cublas_context));
    return *handle == nullptr ? 3 /* alloc failed */ : STATUS_SUCCESS;
}

extern "C" int nd_sim_cublas_destroy(struct cublas_context *handle) {
    if (handle == nullptr) return STATUS_NOT_INITIALIZED;
    free(handle);
    return STATUS_SUCCESS;
}

extern "C" int nd_sim_cublas_set_stream(struct cublas_context *handle, cudaStream_t stream) {
    if (handle == nullptr) return STATUS_NOT_INITIALIZED;
    if (!nd_sim_stream_valid(stream)) return STATUS_INVALID_VALUE;
    handle->stream = stream;
    return STATUS_SUCCESS;
}

extern "C" int nd_sim_cublas_set_workspace(struct cublas_context *handle, void *workspace,
                                           size_t bytes) {
    if (handle == nullptr) return STATUS_NOT_INITIALIZED;
    /* cuBLAS wants 256-byte alignment and a size that is a multiple of 4. */
    if ((bytes > 0 && workspace == nullptr) || (uintptr_t)workspace % 256 != 0 || bytes % 4 != 0)
        return STATUS_INVALID_VALUE;
    handle->workspace = workspace;
    handle->workspace_bytes = bytes;
    return STATUS_SUCCESS;
}

extern "C" size_t nd_sim_cublas_workspace_bytes(const struct cublas_context *handle) {
    return handle != nullptr ? handle->workspace_bytes : 0;
}

/* cuBLAS's argument checks for one GEMM shape. */
static int check_gemm(int transa, int transb, int m, int n, int k, int lda, int ldb, int ldc,
                      int batch_count) {
    if (transa < OP_N || transa > OP_C || transb < OP_N || transb > OP_C) return 0;
    if (m < 0 || n < 0 || k < 0 || batch_count < 0) return 0;
    const int rows_a = transa == OP_N ? m : k, rows_b = transb == OP_N ? k : n;
    return lda >= (rows_a > 1 ? rows_a : 1) && ldb >= (rows_b > 1 ? rows_b : 1) &&
           ldc >= (m > 1 ? m : 1);
}

/* c (m, n; ldc) = alpha op(a) (m, k) op(b) (k, n) + beta c, column-major; a
 * beta of 0 ignores c's old values (NaN included), as cuBLAS does. */
static void gemm(int transa, int transb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc, float *column) {
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) column[i] = 0.0f;
        for (int p = 0; p < k; p++) {
            const float bpj = transb == OP_N ? b[p + (int64_t)j * ldb] : b[j + (int64_t)p * ldb];
            if (transa == OP_N) {
                const float *ap = a + (int64_t)p * lda;
                for (int i = 0; i < m; i++) column[i] += ap[i] * bpj;
            } else {
                for (int i = 0; i < m; i++) column[i] += a[p + (int64_t)i * lda] * bpj;
            }
        }
        float *cj = c + (int64_t)j * ldc;
        for (int i = 0; i < m; i++)
            cj[i] = beta == 0.0f ? alpha * column[i] : alpha * column[i] + beta * cj[i];
    }
}

extern "C" int nd_sim_cublas_sgemm_strided(struct cublas_context *handle, int transa, int transb,
                                           int m, int n, int k, const float *alpha, const float *a,
                                           int lda, long long stride_a, const float *b, int ldb,
                                           long long stride_b, const float *beta, float *c, int ldc,
                                           long long stride_c, int batch_count) {
    if (handle == nullptr) return STATUS_NOT_INITIALIZED;
    if (alpha == nullptr || beta == nullptr ||
        !check_gemm(transa, transb, m, n, k, lda, ldb, ldc, batch_count))
        return STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || batch_count == 0) return STATUS_SUCCESS;
    float *column = (float *)malloc((size_t)m * sizeof(float));
    if (column == nullptr) return 3; /* alloc failed */
    for (int z = 0; z < batch_count; z++)
        gemm(transa, transb, m, n, k, *alpha, a + z * stride_a, lda, b + z * stride_b, ldb, *beta,
             c + z * stride_c, ldc, column);
    free(column);
    return STATUS_SUCCESS;
}

extern "C" int nd_sim_cublas_sgemm_batched(struct cublas_context *handle, int transa, int transb,
                                           int m, int n, int k, const float *alpha,
                                           const float *const a[], int lda, const float *const b[],
                                           int ldb, const float *beta, float *const c[], int ldc,
                                           int batch_count) {
    if (handle == nullptr) return STATUS_NOT_INITIALIZED;
    if (alpha == nullptr || beta == nullptr ||
        !check_gemm(transa, transb, m, n, k, lda, ldb, ldc, batch_count))
        return STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || batch_count == 0) return STATUS_SUCCESS;
    if (a == nullptr || b == nullptr || c == nullptr) return STATUS_INVALID_VALUE;
    float *column = (float *)malloc((size_t)m * sizeof(float));
    if (column == nullptr) return 3; /* alloc failed */
    for (int z = 0; z < batch_count; z++)
        gemm(transa, transb, m, n, k, *alpha, a[z], lda, b[z], ldb, *beta, c[z], ldc, column);
    free(column);
    return STATUS_SUCCESS;
}

extern "C" const char *nd_sim_cublas_status_string(int status) {
    switch (status) {
    case STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    default: return "CUBLAS_STATUS_UNKNOWN (simulated cuBLAS)";
    }
}
