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

/* A micro-kernel on bfloat16 pairs (cpu_gemm_bf16.c): the mr x nr tile
 * C[0:mr, 0:nr] = A @ B (+ C when accumulate) over kpairs pairs of the inner
 * dimension (a multiple of the kernel's pair_multiple), float32 sums, where
 * pair q of A's row i is a[i * a_rs + q] and pair q of B's column j is
 * b[q * NR + j] (NR the kernel's nr). Pairs hold the even index in their low
 * 16 bits. The packed operands hold whole mr x nr tiles (rows and columns
 * past the edge are read, their results dropped). A thread calls begin
 * before its first tile and end after its last. */
typedef void (*nd_gemm_pair_ukernel_fn)(int64_t kpairs, const uint32_t *a, int64_t a_rs,
                                        const uint32_t *b, float *c, int64_t ldc, int mr, int nr,
                                        int accumulate);

typedef struct nd_gemm_pair_ukernel {
    const char *name;
    int mr, nr, pair_multiple;
    nd_gemm_pair_ukernel_fn fn;
    void (*begin)(void);
    void (*end)(void);
} nd_gemm_pair_ukernel;

/* The bfloat16 pair kernel (AMX) where the CPU has one, the OS grants it
 * and the ISA in force is AVX-512; NULL elsewhere (bfloat16 is then widened
 * to float32). */
const nd_gemm_pair_ukernel *nd_cpu_gemm_bf16_ukernel(void);

/* Packs rows x kc of bfloat16 A (A(i, p) = a[i * a_rs + p * a_cs]) as pairs,
 * row_pairs a row; and kc x cols of B (B(p, j) = b[p * b_rs + j * b_cs]) as
 * row_pairs rows of pairs, nr apart. Pairs past kc are zeros. */
void nd_cpu_pack_bf16_pairs_a(uint32_t *dst, const uint16_t *a, int64_t a_rs, int64_t a_cs,
                              int64_t rows, int64_t kc, int64_t row_pairs);
void nd_cpu_pack_bf16_pairs_b(uint32_t *dst, const uint16_t *b, int64_t b_rs, int64_t b_cs,
                              int64_t kc, int64_t cols, int nr, int64_t row_pairs);

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
