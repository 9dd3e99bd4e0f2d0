/* sim_cublas.cc (simulator): the cuBLAS stand-in (see sim_cublas.h): handles
 * that keep their stream and workspace, and GEMMs in cuBLAS's column-major
 * convention (float32, float64, and float16/bfloat16 through the Ex calls),
 * strided or through arrays of pointers, computed on the CPU. Device memory is host memory in the simulator, so
 * the operands (and the pointer arrays of a batched call, which cuBLAS
 * reads from device memory) are read where they are. A call on a handle whose
 * stream captures (sim_graph.cc) is checked, then recorded as a kernel node:
 * alpha and beta (host pointers) are read when it is captured, as cuBLAS
 * reads them, the operands and pointer arrays at every replay.
 */
#include "sim_cublas.h"

#include <stdlib.h>
#include <string.h>

#include <new>

#include "sim_internal.h"

#include "../../dtype_convert.h"

enum {
    STATUS_SUCCESS = 0,
    STATUS_NOT_INITIALIZED = 1,
    STATUS_INVALID_VALUE = 7,
    STATUS_EXECUTION_FAILED = 13,
    STATUS_NOT_SUPPORTED = 15,
};
/* cudaDataType_t and cublasComputeType_t values the Ex calls take. */
enum { R_32F = 0, R_16F = 2, R_16BF = 14 };
enum { COMPUTE_32F = 68 };
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

/* An element type E of memory: the type it accumulates in and the
 * conversions (float16 and bfloat16 round as dtype_convert.h does). */
struct half_elem {
    uint16_t bits;
};
struct bf16_elem {
    uint16_t bits;
};
template <class E> struct elem {
    typedef E acc;
    static E load(E v) { return v; }
    static E store(E v) { return v; }
};
template <> struct elem<half_elem> {
    typedef float acc;
    static float load(half_elem v) { return nd_half_to_float(v.bits); }
    static half_elem store(float v) { return half_elem{nd_float_to_half(v)}; }
};
template <> struct elem<bf16_elem> {
    typedef float acc;
    static float load(bf16_elem v) { return nd_bf16_to_float(v.bits); }
    static bf16_elem store(float v) { return bf16_elem{nd_float_to_bf16(v)}; }
};

/* c (m, n; ldc) = alpha op(a) (m, k) op(b) (k, n) + beta c, column-major; a
 * beta of 0 ignores c's old values (NaN included), as cuBLAS does. */
template <class E, class A>
static void gemm(int transa, int transb, int m, int n, int k, A alpha, const E *a, int lda,
                 const E *b, int ldb, A beta, E *c, int ldc, A *column) {
    typedef elem<E> el;
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) column[i] = 0;
        for (int p = 0; p < k; p++) {
            const A bpj =
                el::load(transb == OP_N ? b[p + (int64_t)j * ldb] : b[j + (int64_t)p * ldb]);
            if (transa == OP_N) {
                const E *ap = a + (int64_t)p * lda;
                for (int i = 0; i < m; i++) column[i] += el::load(ap[i]) * bpj;
            } else {
                for (int i = 0; i < m; i++) column[i] += el::load(a[p + (int64_t)i * lda]) * bpj;
            }
        }
        E *cj = c + (int64_t)j * ldc;
        for (int i = 0; i < m; i++)
            cj[i] = el::store(beta == 0 ? alpha * column[i]
                                        : alpha * column[i] + beta * el::load(cj[i]));
    }
}

/* One strided batched GEMM over element type E (argument checks done). */
template <class E>
static int gemm_strided(int transa, int transb, int m, int n, int k, const void *alpha,
                        const void *a, int lda, long long stride_a, const void *b, int ldb,
                        long long stride_b, const void *beta, void *c, int ldc, long long stride_c,
                        int batch_count) {
    typedef typename elem<E>::acc A;
    if (m == 0 || n == 0 || batch_count == 0) return STATUS_SUCCESS;
    A *column = (A *)malloc((size_t)m * sizeof(A));
    if (column == nullptr) return 3; /* alloc failed */
    const E *ea = (const E *)a, *eb = (const E *)b;
    E *ec = (E *)c;
    for (int z = 0; z < batch_count; z++)
        gemm(transa, transb, m, n, k, *(const A *)alpha, ea + z * stride_a, lda, eb + z * stride_b,
             ldb, *(const A *)beta, ec + z * stride_c, ldc, column);
    free(column);
    return STATUS_SUCCESS;
}

/* One pointer-array batched GEMM over element type E (argument checks done). */
template <class E>
static int gemm_batched(int transa, int transb, int m, int n, int k, const void *alpha,
                        const void *const a[], int lda, const void *const b[], int ldb,
                        const void *beta, void *const c[], int ldc, int batch_count) {
    typedef typename elem<E>::acc A;
    if (m == 0 || n == 0 || batch_count == 0) return STATUS_SUCCESS;
    A *column = (A *)malloc((size_t)m * sizeof(A));
    if (column == nullptr) return 3; /* alloc failed */
    for (int z = 0; z < batch_count; z++)
        gemm(transa, transb, m, n, k, *(const A *)alpha, (const E *)a[z], lda, (const E *)b[z], ldb,
             *(const A *)beta, (E *)c[z], ldc, column);
    free(column);
    return STATUS_SUCCESS;
}

/* The checks every call makes: 0 when they pass, else the status. */
static int check_call(const struct cublas_context *handle, const void *alpha, const void *beta,
                      int transa, int transb, int m, int n, int k, int lda, int ldb, int ldc,
                      int batch_count) {
    if (handle == nullptr) return STATUS_NOT_INITIALIZED;
    if (alpha == nullptr || beta == nullptr ||
        !check_gemm(transa, transb, m, n, k, lda, ldb, ldc, batch_count))
        return STATUS_INVALID_VALUE;
    return STATUS_SUCCESS;
}

/* A batched call's pointer arrays, needed when there is anything to compute. */
static int check_arrays(int m, int n, int batch_count, const void *a, const void *b,
                        const void *c) {
    if (m == 0 || n == 0 || batch_count == 0) return STATUS_SUCCESS;
    return a == nullptr || b == nullptr || c == nullptr ? STATUS_INVALID_VALUE : STATUS_SUCCESS;
}

/* Runs a checked call now (run() returns its status), or records it into the
 * capture of the handle's stream; a capture's refusal is an execution failure,
 * its detail in cudaGetLastError. */
template <class Run>
static int run_or_capture(const struct cublas_context *handle, const char *call, Run run) {
    cudaError_t err = cudaSuccess;
    const int64_t capture = nd_sim_route(handle->stream, call, &err);
    if (capture < 0) return STATUS_EXECUTION_FAILED;
    if (capture == 0) return run();
    try {
        err = nd_sim_capture(
            handle->stream, capture, cudaGraphNodeTypeKernel, call, [run, call](cudaStream_t) {
                const int st = run();
                if (st == STATUS_SUCCESS) return cudaSuccess;
                return nd_sim_fail(cudaErrorLaunchFailure, "%s replayed from a graph: %s", call,
                                   nd_sim_cublas_status_string(st));
            });
    } catch (const std::bad_alloc &) { return 3; /* alloc failed */ }
    return err == cudaSuccess ? STATUS_SUCCESS : STATUS_EXECUTION_FAILED;
}

/* The Ex calls' type combinations: one type for A, B and C, float compute. */
static int check_types(int a_type, int b_type, int c_type, int compute_type) {
    if (a_type != b_type || a_type != c_type || compute_type != COMPUTE_32F)
        return STATUS_NOT_SUPPORTED;
    if (a_type != R_32F && a_type != R_16F && a_type != R_16BF) return STATUS_NOT_SUPPORTED;
    return STATUS_SUCCESS;
}

/* A checked strided GEMM over E, run now or captured: alpha and beta are
 * copied now, the operands are read when it runs. */
template <class E>
static int strided_call(const struct cublas_context *handle, const char *call, int transa,
                        int transb, int m, int n, int k, const void *alpha, const void *a, int lda,
                        long long stride_a, const void *b, int ldb, long long stride_b,
                        const void *beta, void *c, int ldc, long long stride_c, int batch_count) {
    typedef typename elem<E>::acc A;
    const A al = *(const A *)alpha, be = *(const A *)beta;
    return run_or_capture(handle, call, [=]() {
        return gemm_strided<E>(transa, transb, m, n, k, &al, a, lda, stride_a, b, ldb, stride_b,
                               &be, c, ldc, stride_c, batch_count);
    });
}

/* The same for a batch given by arrays of pointers (read when it runs). */
template <class E>
static int batched_call(const struct cublas_context *handle, const char *call, int transa,
                        int transb, int m, int n, int k, const void *alpha, const void *const a[],
                        int lda, const void *const b[], int ldb, const void *beta, void *const c[],
                        int ldc, int batch_count) {
    typedef typename elem<E>::acc A;
    const int st = check_arrays(m, n, batch_count, a, b, c);
    if (st != STATUS_SUCCESS) return st;
    const A al = *(const A *)alpha, be = *(const A *)beta;
    return run_or_capture(handle, call, [=]() {
        return gemm_batched<E>(transa, transb, m, n, k, &al, a, lda, b, ldb, &be, c, ldc,
                               batch_count);
    });
}

extern "C" int nd_sim_cublas_sgemm_strided(struct cublas_context *handle, int transa, int transb,
                                           int m, int n, int k, const float *alpha, const float *a,
                                           int lda, long long stride_a, const float *b, int ldb,
                                           long long stride_b, const float *beta, float *c, int ldc,
                                           long long stride_c, int batch_count) {
    int st = check_call(handle, alpha, beta, transa, transb, m, n, k, lda, ldb, ldc, batch_count);
    if (st != STATUS_SUCCESS) return st;
    return strided_call<float>(handle, "cublasSgemmStridedBatched", transa, transb, m, n, k, alpha,
                               a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                               batch_count);
}

extern "C" int nd_sim_cublas_sgemm_batched(struct cublas_context *handle, int transa, int transb,
                                           int m, int n, int k, const float *alpha,
                                           const float *const a[], int lda, const float *const b[],
                                           int ldb, const float *beta, float *const c[], int ldc,
                                           int batch_count) {
    int st = check_call(handle, alpha, beta, transa, transb, m, n, k, lda, ldb, ldc, batch_count);
    if (st != STATUS_SUCCESS) return st;
    return batched_call<float>(handle, "cublasSgemmBatched", transa, transb, m, n, k, alpha,
                               (const void *const *)a, lda, (const void *const *)b, ldb, beta,
                               (void *const *)c, ldc, batch_count);
}

extern "C" int nd_sim_cublas_dgemm_strided(struct cublas_context *handle, int transa, int transb,
                                           int m, int n, int k, const double *alpha,
                                           const double *a, int lda, long long stride_a,
                                           const double *b, int ldb, long long stride_b,
                                           const double *beta, double *c, int ldc,
                                           long long stride_c, int batch_count) {
    int st = check_call(handle, alpha, beta, transa, transb, m, n, k, lda, ldb, ldc, batch_count);
    if (st != STATUS_SUCCESS) return st;
    return strided_call<double>(handle, "cublasDgemmStridedBatched", transa, transb, m, n, k, alpha,
                                a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                                batch_count);
}

extern "C" int nd_sim_cublas_dgemm_batched(struct cublas_context *handle, int transa, int transb,
                                           int m, int n, int k, const double *alpha,
                                           const double *const a[], int lda,
                                           const double *const b[], int ldb, const double *beta,
                                           double *const c[], int ldc, int batch_count) {
    int st = check_call(handle, alpha, beta, transa, transb, m, n, k, lda, ldb, ldc, batch_count);
    if (st != STATUS_SUCCESS) return st;
    return batched_call<double>(handle, "cublasDgemmBatched", transa, transb, m, n, k, alpha,
                                (const void *const *)a, lda, (const void *const *)b, ldb, beta,
                                (void *const *)c, ldc, batch_count);
}

extern "C" int nd_sim_cublas_gemm_strided_ex(struct cublas_context *handle, int transa, int transb,
                                             int m, int n, int k, const void *alpha, const void *a,
                                             int a_type, int lda, long long stride_a, const void *b,
                                             int b_type, int ldb, long long stride_b,
                                             const void *beta, void *c, int c_type, int ldc,
                                             long long stride_c, int batch_count, int compute_type,
                                             int algo) {
    (void)algo; /* any algorithm computes the same product here */
    int st = check_call(handle, alpha, beta, transa, transb, m, n, k, lda, ldb, ldc, batch_count);
    if (st == STATUS_SUCCESS) st = check_types(a_type, b_type, c_type, compute_type);
    if (st != STATUS_SUCCESS) return st;
    const char *call = "cublasGemmStridedBatchedEx";
    switch (a_type) {
    case R_16F:
        return strided_call<half_elem>(handle, call, transa, transb, m, n, k, alpha, a, lda,
                                       stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                                       batch_count);
    case R_16BF:
        return strided_call<bf16_elem>(handle, call, transa, transb, m, n, k, alpha, a, lda,
                                       stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                                       batch_count);
    default:
        return strided_call<float>(handle, call, transa, transb, m, n, k, alpha, a, lda, stride_a,
                                   b, ldb, stride_b, beta, c, ldc, stride_c, batch_count);
    }
}

extern "C" int nd_sim_cublas_gemm_batched_ex(struct cublas_context *handle, int transa, int transb,
                                             int m, int n, int k, const void *alpha,
                                             const void *const a[], int a_type, int lda,
                                             const void *const b[], int b_type, int ldb,
                                             const void *beta, void *const c[], int c_type, int ldc,
                                             int batch_count, int compute_type, int algo) {
    (void)algo;
    int st = check_call(handle, alpha, beta, transa, transb, m, n, k, lda, ldb, ldc, batch_count);
    if (st == STATUS_SUCCESS) st = check_types(a_type, b_type, c_type, compute_type);
    if (st != STATUS_SUCCESS) return st;
    const char *call = "cublasGemmBatchedEx";
    switch (a_type) {
    case R_16F:
        return batched_call<half_elem>(handle, call, transa, transb, m, n, k, alpha, a, lda, b, ldb,
                                       beta, c, ldc, batch_count);
    case R_16BF:
        return batched_call<bf16_elem>(handle, call, transa, transb, m, n, k, alpha, a, lda, b, ldb,
                                       beta, c, ldc, batch_count);
    default:
        return batched_call<float>(handle, call, transa, transb, m, n, k, alpha, a, lda, b, ldb,
                                   beta, c, ldc, batch_count);
    }
}

extern "C" const char *nd_sim_cublas_status_string(int status) {
    switch (status) {
    case STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN (simulated cuBLAS)";
    }
}
