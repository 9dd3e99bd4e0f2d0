/* sim_cublas.h (simulator): the cuBLAS stand-in of a NEEDLE_CUDA=sim build:
 * the few cuBLAS v2 entry points the backend calls (cuda_cublas.cu), with
 * cuBLAS's C ABI (enums as ints, column-major GEMMs), computed on the CPU
 * over the simulator's device memory (which is host memory).
 *
 * It exists so that the simulated build follows the real cuBLAS code path
 * of the backend: the handle per GPU, the workspace taken from needle's
 * caching allocator (cublasSetWorkspace), the choice between strided and
 * pointer-array batches, the census's BLAS count and the out-of-memory
 * ladder around each call. It checks arguments as cuBLAS documents them
 * (CUBLAS_STATUS_INVALID_VALUE, NOT_INITIALIZED, NOT_SUPPORTED for a type
 * combination the Ex calls do not take) but is not cuBLAS: its arithmetic
 * is a plain loop (float accumulation for float32, float16 and bfloat16 as
 * CUBLAS_COMPUTE_32F, double for the D calls), its speed is the CPU's.
 *
 * Status values are cuBLAS's: 0 success, 1 not initialized, 7 invalid value,
 * 15 not supported.
 */
#ifndef NEEDLE_SIM_CUBLAS_H
#define NEEDLE_SIM_CUBLAS_H

#include "cuda_runtime.h"

extern "C" {

struct cublas_context;

int nd_sim_cublas_create(struct cublas_context **handle);
int nd_sim_cublas_destroy(struct cublas_context *handle);
int nd_sim_cublas_set_stream(struct cublas_context *handle, cudaStream_t stream);
int nd_sim_cublas_set_workspace(struct cublas_context *handle, void *workspace, size_t bytes);
int nd_sim_cublas_sgemm_strided(struct cublas_context *handle, int transa, int transb, int m, int n,
                                int k, const float *alpha, const float *a, int lda,
                                long long stride_a, const float *b, int ldb, long long stride_b,
                                const float *beta, float *c, int ldc, long long stride_c,
                                int batch_count);
int nd_sim_cublas_sgemm_batched(struct cublas_context *handle, int transa, int transb, int m, int n,
                                int k, const float *alpha, const float *const a[], int lda,
                                const float *const b[], int ldb, const float *beta,
                                float *const c[], int ldc, int batch_count);
int nd_sim_cublas_dgemm_strided(struct cublas_context *handle, int transa, int transb, int m, int n,
                                int k, const double *alpha, const double *a, int lda,
                                long long stride_a, const double *b, int ldb, long long stride_b,
                                const double *beta, double *c, int ldc, long long stride_c,
                                int batch_count);
int nd_sim_cublas_dgemm_batched(struct cublas_context *handle, int transa, int transb, int m, int n,
                                int k, const double *alpha, const double *const a[], int lda,
                                const double *const b[], int ldb, const double *beta,
                                double *const c[], int ldc, int batch_count);
/* cublasGemmStridedBatchedEx / cublasGemmBatchedEx for A, B and C all
 * CUDA_R_16F (2), CUDA_R_16BF (14) or CUDA_R_32F (0), compute type
 * CUBLAS_COMPUTE_32F (68), float alpha and beta, any algo. */
int nd_sim_cublas_gemm_strided_ex(struct cublas_context *handle, int transa, int transb, int m,
                                  int n, int k, const void *alpha, const void *a, int a_type,
                                  int lda, long long stride_a, const void *b, int b_type, int ldb,
                                  long long stride_b, const void *beta, void *c, int c_type,
                                  int ldc, long long stride_c, int batch_count, int compute_type,
                                  int algo);
int nd_sim_cublas_gemm_batched_ex(struct cublas_context *handle, int transa, int transb, int m,
                                  int n, int k, const void *alpha, const void *const a[],
                                  int a_type, int lda, const void *const b[], int b_type, int ldb,
                                  const void *beta, void *const c[], int c_type, int ldc,
                                  int batch_count, int compute_type, int algo);
const char *nd_sim_cublas_status_string(int status);

/* The workspace bytes the handle was given (0: none), for the simulator's test. */
size_t nd_sim_cublas_workspace_bytes(const struct cublas_context *handle);

} /* extern "C" */

#endif /* NEEDLE_SIM_CUBLAS_H */
