/* cpu_gemm.h: needle's own single-precision GEMM (cpu_gemm.c), and the
 * per-ISA micro-kernels it is built on (cpu_gemm_x86.c, and a plain-C one).
 *
 * The CPU backend multiplies through this GEMM below a size measured per
 * machine and through the BLAS it finds (NumPy's OpenBLAS) above it
 * (cpu_matmul.c); without a BLAS it uses this one for every size. It takes
 * only temporary packing buffers (from the stack when small, else malloc),
 * never prints and never fails: without memory it runs unpacked.
 */
#ifndef NEEDLE_CPU_GEMM_H
#define NEEDLE_CPU_GEMM_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A micro-kernel: the mr x nr tile C[0:mr, 0:nr] = alpha * A @ B (+ C when
 * accumulate), over kc steps, where
 *   A(i, p) = a[i * a_rs + p * a_cs]   (any strides: A is read by broadcasts)
 *   B(p, j) = b[p * b_rs + j]          (each row's nr values contiguous)
 *   C(i, j) = c[i * ldc + j].
 * mr <= MR and nr <= NR of the kernel; only those rows of A, columns of B and
 * elements of C are touched. kc may be 0 (C = 0, or left as it is). */
typedef void (*nd_gemm_ukernel_fn)(int64_t kc, const float *a, int64_t a_rs, int64_t a_cs,
                                   const float *b, int64_t b_rs, float *c, int64_t ldc, int mr,
                                   int nr, float alpha, int accumulate);

typedef struct nd_gemm_ukernel {
    const char *name; /* e.g. "avx512 8x32" */
    nd_cpu_isa isa;
    int mr, nr; /* the largest tile */
    nd_gemm_ukernel_fn fn;
} nd_gemm_ukernel;

#if defined(__x86_64__) && defined(__GNUC__)
#define ND_GEMM_X86 1
extern const nd_gemm_ukernel nd_gemm_ukernel_avx2;   /* cpu_gemm_x86.c */
extern const nd_gemm_ukernel nd_gemm_ukernel_avx512; /* cpu_gemm_x86.c */
#endif

/* The micro-kernel built for isa (the baseline one where isa has none). */
const nd_gemm_ukernel *nd_cpu_gemm_ukernel(nd_cpu_isa isa);

/* nd_cpu_sgemm (engine.h) runs the current ISA's kernel: row-major
 * C = alpha*op(A)*op(B) + beta*C, op(A) m x k, op(B) k x n; trans_a: A stored
 * k x m, else m x k; trans_b: B stored n x k, else k x n; ldc >= n. beta == 0
 * overwrites C without reading it (NaN/garbage in C must not propagate);
 * alpha == 0 reads neither A nor B. */

/* The element offsets of A's and B's operands in product `batch` of a
 * batched matmul (the batch index row-major over d->batch_shape). */
static inline void nd_matmul_batch_offsets(const nd_matmul_desc *d, int64_t batch, int64_t *a_off,
                                           int64_t *b_off) {
    *a_off = 0, *b_off = 0;
    for (int i = d->batch_ndim - 1; i >= 0; i--) {
        const int64_t index = batch % d->batch_shape[i];
        batch /= d->batch_shape[i];
        *a_off += index * d->a_batch_strides[i];
        *b_off += index * d->b_batch_strides[i];
    }
}

/* Every product of a batched matmul (internal.h: out[b] = a[b] @ b[b], batch
 * dims broadcast), in one call: packing buffers are taken once for the whole
 * batch, and small products are multiplied straight from their operands. */
void nd_cpu_sgemm_batched(const nd_matmul_desc *d);

/* nd_cpu_matmul (the backend's entry) by dtype: float32's product, split
 * between needle's GEMM and the BLAS (cpu_matmul.c), and the other dtypes'
 * (cpu_matmul_typed.c). */
nd_status nd_cpu_matmul_float32(const nd_matmul_desc *d);
nd_status nd_cpu_matmul_typed(const nd_matmul_desc *d);

#ifdef __cplusplus
}
#endif

#endif /* NEEDLE_CPU_GEMM_H */
