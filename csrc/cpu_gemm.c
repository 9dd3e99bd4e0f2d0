/* cpu_gemm.c: the engine's fallback single-precision GEMM, used when no BLAS
 * was found at run time.
 *
 * The layout follows the usual Goto/BLIS scheme: op(B) is cut into KC x NC
 * panels and op(A) into MC x KC blocks, both are copied ("packed") into
 * contiguous buffers laid out in exactly the order the micro-kernel reads
 * them, and an MR x NR register-blocked micro-kernel does the arithmetic.
 * Packing is what makes the four transpose cases equally fast and removes
 * every edge case from the inner loop: partial tiles are zero-padded in the
 * packed buffers, so the kernel always runs a full MR x NR tile and only the
 * final store to C looks at the real tile size.
 *
 * The kernel is plain C written so that GCC vectorizes it (the NR columns
 * become whole SIMD registers, the MR rows are unrolled). On x86-64 with GCC
 * the hot code is compiled twice, for x86-64-v3 (AVX2 + FMA) and for the
 * baseline, and the loader picks one, so a generic -O3 build still gets
 * AVX2/FMA speed on machines that have it.
 */
#include "cpu_gemm.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* MR x NR = 3 x 32 is 12 AVX2 accumulators, four B vectors and one A
 * broadcast: it fits the 16 ymm registers, and it is the shape GCC turns
 * into a clean spill-free FMA loop. Squarer tiles (6 x 16, 8 x 8) look
 * better on paper, but GCC 12 then keeps accumulators on the stack or
 * vectorizes across rows with shuffles, and runs 2-8x slower. */
#define MR 3
#define NR 32
/* One KC x NR sliver of packed B (32 KiB) is reused from L1 by all MC / MR
 * slivers of the packed A block; the MC x KC block of A (96 KiB) stays in L2
 * and the KC x NC panel of B (512 KiB) in L2/L3. Halving or doubling any
 * one of these changed the measured speed by only a few percent. */
#define KC 256
#define MC 96
#define NC 512

#define ALIGN_BYTES 64

#if defined(__GNUC__) && !defined(__clang__)
/* -std=c11 turns GCC's FMA contraction off, which would halve the kernel's
 * throughput on FMA hardware; the rounding change is harmless for GEMM.
 * (Clang contracts within a statement by default, which is all we need.) */
#define ND_CONTRACT optimize("fp-contract=fast")
#if defined(__x86_64__)
#define ND_HOT __attribute__((target_clones("arch=x86-64-v3", "default"), ND_CONTRACT))
#else
#define ND_HOT __attribute__((ND_CONTRACT))
#endif
/* The helpers are always inlined into the cloned driver so that each clone
 * gets its own copy compiled for its target. */
#define ND_INLINE static inline __attribute__((always_inline, ND_CONTRACT))
#elif defined(__GNUC__)
#define ND_HOT
#define ND_INLINE static inline __attribute__((always_inline))
#else
#define ND_HOT
#define ND_INLINE static inline
#endif

#if defined(__GNUC__)
#define ND_PRAGMA_(x) _Pragma(#x)
#define ND_UNROLL(n) ND_PRAGMA_(GCC unroll n)
#else
#define ND_UNROLL(n)
#endif

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* C = beta*C, where beta == 0 must write zeros without reading C. */
static void scale_c(int64_t m, int64_t n, float beta, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) {
        float *ci = c + i * ldc;
        if (beta == 0.0f) {
            for (int64_t j = 0; j < n; ++j) ci[j] = 0.0f;
        } else if (beta != 1.0f) {
            for (int64_t j = 0; j < n; ++j) ci[j] *= beta;
        }
    }
}

/* Used only when the packing buffers cannot be allocated: slow, but exact
 * in the same sense as the blocked path and it needs no memory. */
static void sgemm_unpacked(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                           float *c, int64_t ldc) {
    scale_c(m, n, beta, c, ldc);
    for (int64_t i = 0; i < m; ++i) {
        float *ci = c + i * ldc;
        if (!trans_b) {
            /* Rows of B are contiguous: sweep them with an axpy per p. */
            for (int64_t p = 0; p < k; ++p) {
                const float aip = alpha * (trans_a ? a[p * lda + i] : a[i * lda + p]);
                const float *bp = b + p * ldb;
                for (int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];
            }
        } else {
            /* Rows of B^T are contiguous: a dot product per element. */
            for (int64_t j = 0; j < n; ++j) {
                const float *bj = b + j * ldb;
                float s = 0.0f;
                for (int64_t p = 0; p < k; ++p)
                    s += (trans_a ? a[p * lda + i] : a[i * lda + p]) * bj[p];
                ci[j] += alpha * s;
            }
        }
    }
}

/* Packs op(A)[i0 : i0+mc, p0 : p0+kc] as ceil(mc/MR) slivers, each kc
 * columns of MR consecutive values, rows past mc padded with zeros. */
ND_INLINE void pack_a(int trans_a, const float *a, int64_t lda, int64_t i0, int64_t p0, int64_t mc,
                      int64_t kc, float *restrict ap) {
    for (int64_t ir = 0; ir < mc; ir += MR) {
        const int64_t mr = min_i64(MR, mc - ir);
        if (trans_a) {
            /* Stored k x m: the MR values of one column are adjacent. */
            const float *src = a + p0 * lda + (i0 + ir);
            if (mr == MR) {
                for (int64_t p = 0; p < kc; ++p)
                    for (int r = 0; r < MR; ++r) ap[p * MR + r] = src[p * lda + r];
            } else {
                for (int64_t p = 0; p < kc; ++p) {
                    int r = 0;
                    for (; r < mr; ++r) ap[p * MR + r] = src[p * lda + r];
                    for (; r < MR; ++r) ap[p * MR + r] = 0.0f;
                }
            }
        } else {
            const float *src = a + (i0 + ir) * lda + p0;
            if (mr == MR) {
                for (int64_t p = 0; p < kc; ++p)
                    for (int r = 0; r < MR; ++r) ap[p * MR + r] = src[r * lda + p];
            } else {
                for (int64_t p = 0; p < kc; ++p) {
                    int r = 0;
                    for (; r < mr; ++r) ap[p * MR + r] = src[r * lda + p];
                    for (; r < MR; ++r) ap[p * MR + r] = 0.0f;
                }
            }
        }
        ap += kc * MR;
    }
}

/* Packs op(B)[p0 : p0+kc, j0 : j0+nc] as ceil(nc/NR) slivers, each kc rows
 * of NR consecutive values, columns past nc padded with zeros. */
ND_INLINE void pack_b(int trans_b, const float *b, int64_t ldb, int64_t p0, int64_t j0, int64_t kc,
                      int64_t nc, float *restrict bp) {
    for (int64_t jr = 0; jr < nc; jr += NR) {
        const int64_t nr = min_i64(NR, nc - jr);
        if (!trans_b) {
            /* Stored k x n: the NR values of one row are adjacent. */
            const float *src = b + p0 * ldb + (j0 + jr);
            if (nr == NR) {
                for (int64_t p = 0; p < kc; ++p)
                    for (int j = 0; j < NR; ++j) bp[p * NR + j] = src[p * ldb + j];
            } else {
                for (int64_t p = 0; p < kc; ++p) {
                    int j = 0;
                    for (; j < nr; ++j) bp[p * NR + j] = src[p * ldb + j];
                    for (; j < NR; ++j) bp[p * NR + j] = 0.0f;
                }
            }
        } else {
            const float *src = b + (j0 + jr) * ldb + p0;
            if (nr == NR) {
                for (int64_t p = 0; p < kc; ++p)
                    for (int j = 0; j < NR; ++j) bp[p * NR + j] = src[j * ldb + p];
            } else {
                for (int64_t p = 0; p < kc; ++p) {
                    int j = 0;
                    for (; j < nr; ++j) bp[p * NR + j] = src[j * ldb + p];
                    for (; j < NR; ++j) bp[p * NR + j] = 0.0f;
                }
            }
        }
        bp += kc * NR;
    }
}

/* C[0:MR, 0:NR] = alpha * (packed A sliver * packed B sliver) + beta * C.
 * The accumulators are only ever indexed by constants once the row loop is
 * unrolled, which is what lets GCC keep all of them in registers; the column
 * loop is the one it vectorizes. */
ND_INLINE void micro_kernel(int64_t kc, const float *restrict ap, const float *restrict bp,
                            float alpha, float beta, float *restrict c, int64_t ldc) {
    float acc[MR][NR] = {{0.0f}};
    for (int64_t p = 0; p < kc; ++p) {
        const float *restrict bq = bp + p * NR;
        const float *restrict aq = ap + p * MR;
        ND_UNROLL(MR)
        for (int i = 0; i < MR; ++i) {
            const float ai = aq[i];
            for (int j = 0; j < NR; ++j) acc[i][j] += ai * bq[j];
        }
    }
    if (beta == 0.0f) {
        for (int i = 0; i < MR; ++i)
            for (int j = 0; j < NR; ++j) c[i * ldc + j] = alpha * acc[i][j];
    } else if (beta == 1.0f) {
        for (int i = 0; i < MR; ++i)
            for (int j = 0; j < NR; ++j) c[i * ldc + j] += alpha * acc[i][j];
    } else {
        for (int i = 0; i < MR; ++i)
            for (int j = 0; j < NR; ++j) c[i * ldc + j] = alpha * acc[i][j] + beta * c[i * ldc + j];
    }
}

/* Partial tiles go through a full-size scratch tile: indexing the kernel's
 * accumulators with the run-time tile size would force them into memory for
 * the full tiles too. */
ND_INLINE void edge_tile(int64_t kc, const float *restrict ap, const float *restrict bp,
                         float alpha, float beta, float *restrict c, int64_t ldc, int64_t mr,
                         int64_t nr) {
    float tmp[MR * NR];
    micro_kernel(kc, ap, bp, alpha, 0.0f, tmp, NR);
    for (int64_t i = 0; i < mr; ++i)
        for (int64_t j = 0; j < nr; ++j) {
            const float v = tmp[i * NR + j];
            c[i * ldc + j] = beta == 0.0f ? v : v + beta * c[i * ldc + j];
        }
}

ND_HOT
static void sgemm_blocked(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc, float *restrict apack, float *restrict bpack) {
    for (int64_t jc = 0; jc < n; jc += NC) {
        const int64_t nc = min_i64(NC, n - jc);
        for (int64_t pc = 0; pc < k; pc += KC) {
            const int64_t kc = min_i64(KC, k - pc);
            /* Only the first K block sees the caller's beta; later ones add
             * onto the partial sums already stored in C. */
            const float beta_eff = pc == 0 ? beta : 1.0f;
            pack_b(trans_b, b, ldb, pc, jc, kc, nc, bpack);
            for (int64_t ic = 0; ic < m; ic += MC) {
                const int64_t mc = min_i64(MC, m - ic);
                pack_a(trans_a, a, lda, ic, pc, mc, kc, apack);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    const int64_t nr = min_i64(NR, nc - jr);
                    const float *bs = bpack + jr * kc;
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        const int64_t mr = min_i64(MR, mc - ir);
                        float *ct = c + (ic + ir) * ldc + (jc + jr);
                        if (mr == MR && nr == NR)
                            micro_kernel(kc, apack + ir * kc, bs, alpha, beta_eff, ct, ldc);
                        else edge_tile(kc, apack + ir * kc, bs, alpha, beta_eff, ct, ldc, mr, nr);
                    }
                }
            }
        }
    }
}

static float *align_ptr(void *p) {
    return (float *)(((uintptr_t)p + (ALIGN_BYTES - 1)) & ~(uintptr_t)(ALIGN_BYTES - 1));
}

void nd_cpu_sgemm_fallback(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                           float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    /* As in reference BLAS, alpha == 0 skips the product entirely, so A and
     * B are not read and cannot inject NaNs. */
    if (k <= 0 || alpha == 0.0f) {
        scale_c(m, n, beta, c, ldc);
        return;
    }

    /* Size the buffers to the problem so that small products stay cheap. */
    const int64_t kc_max = min_i64(KC, k);
    const int64_t a_elems = round_up(min_i64(MC, m), MR) * kc_max;
    const int64_t b_elems = round_up(min_i64(NC, n), NR) * kc_max;
    void *raw = malloc((size_t)(a_elems + b_elems) * sizeof(float) + 2 * ALIGN_BYTES);
    if (raw == NULL) {
        sgemm_unpacked(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    float *apack = align_ptr(raw);
    float *bpack = align_ptr(apack + a_elems);
    sgemm_blocked(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, apack, bpack);
    free(raw);
}
