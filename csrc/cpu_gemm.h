/* cpu_gemm.h: the engine's own single-precision GEMM.
 *
 * The CPU backend normally multiplies through the BLAS it finds at run time
 * (NumPy's OpenBLAS, through a function pointer). This is what it uses when
 * no BLAS is available, so that matmul still works everywhere, correctly for
 * every shape and at a usable speed. It takes only temporary packing buffers
 * from malloc, never prints and never fails: without memory it falls back
 * to a slower loop that needs none.
 */
#ifndef NEEDLE_CPU_GEMM_H
#define NEEDLE_CPU_GEMM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Row-major C = alpha*op(A)*op(B) + beta*C. op(A) is m x k, op(B) is k x n.
 * trans_a != 0: A is stored k x m (row-major, leading dimension lda), else m x k.
 * trans_b != 0: B is stored n x k, else k x n. ldc >= n. beta == 0 means C is
 * overwritten without being read (NaN/garbage in C must not propagate). */
void nd_cpu_sgemm_fallback(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                           float *c, int64_t ldc);

#ifdef __cplusplus
}
#endif

#endif /* NEEDLE_CPU_GEMM_H */
