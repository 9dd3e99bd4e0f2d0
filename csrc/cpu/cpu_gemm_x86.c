/* cpu_gemm_x86.c: the x86-64 micro-kernels of needle's GEMM: AVX2 + FMA
 * (6 x 16) and AVX-512 (8 x 32), written with intrinsics.
 *
 * Each function carries its ISA as a target attribute, so this file builds
 * with the project's plain flags and a generic -O3 build still has both;
 * cpu_isa.c decides at run time which one may run, and nothing here is
 * called on a CPU without its ISA. The contract is nd_gemm_ukernel_fn's
 * (cpu_gemm.h): any A strides (A is only read by broadcasts, so the driver
 * can skip packing it), rows of B contiguous, edges by masks, so the driver
 * needs no zero-padded scratch tiles.
 *
 * A tile is an always-inlined template instantiated for every row count
 * 1..MR: the accumulators are then indexed by constants only, which is what
 * keeps all of them in registers (24 of 32 zmm, 12 of 16 ymm).
 */
#include "cpu_gemm.h"

#ifdef ND_GEMM_X86

#include <immintrin.h>

#define ND_UNROLL_(x) _Pragma(#x)
#define ND_UNROLL(n) ND_UNROLL_(GCC unroll n)

/* ------------------------------------------------------------- AVX-512 */

#define AVX512_ATTR target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
#define AVX512_TILE static inline __attribute__((always_inline, AVX512_ATTR))

enum { MR512 = 8, NR512 = 32 };

/* An mr x (16 * NV) tile, NV = 1 or 2 vectors a row; columns past nr are
 * masked off (masked loads do not fault on the bytes they skip). */
AVX512_TILE void tile512(const int mr, const int nv, int64_t kc, const float *a, int64_t a_rs,
                         int64_t a_cs, const float *b, int64_t b_rs, float *c, int64_t ldc, int nr,
                         float alpha, int accumulate) {
    const __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    const __mmask16 m1 = nr >= 32   ? (__mmask16)0xFFFF
                         : nr <= 16 ? 0
                                    : (__mmask16)((1u << (nr - 16)) - 1u);
    __m512 acc0[MR512], acc1[MR512];
    ND_UNROLL(8)
    for (int i = 0; i < mr; i++) {
        acc0[i] = _mm512_setzero_ps();
        acc1[i] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kc; p++) {
        const __m512 b0 = _mm512_maskz_loadu_ps(m0, b);
        const __m512 b1 = nv == 2 ? _mm512_maskz_loadu_ps(m1, b + 16) : b0;
        ND_UNROLL(8)
        for (int i = 0; i < mr; i++) {
            const __m512 ai = _mm512_set1_ps(a[i * a_rs]);
            acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
            if (nv == 2) acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
        }
        a += a_cs;
        b += b_rs;
    }
    const __m512 va = _mm512_set1_ps(alpha);
    ND_UNROLL(8)
    for (int i = 0; i < mr; i++) {
        float *ci = c + i * ldc;
        __m512 r0 = _mm512_mul_ps(va, acc0[i]);
        if (accumulate) r0 = _mm512_add_ps(r0, _mm512_maskz_loadu_ps(m0, ci));
        _mm512_mask_storeu_ps(ci, m0, r0);
        if (nv == 2) {
            __m512 r1 = _mm512_mul_ps(va, acc1[i]);
            if (accumulate) r1 = _mm512_add_ps(r1, _mm512_maskz_loadu_ps(m1, ci + 16));
            _mm512_mask_storeu_ps(ci + 16, m1, r1);
        }
    }
}

#define TILE512_CASES(nv)                                                                      \
    switch (mr) {                                                                              \
    case 8: tile512(8, nv, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate); break;  \
    case 7: tile512(7, nv, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate); break;  \
    case 6: tile512(6, nv, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate); break;  \
    case 5: tile512(5, nv, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate); break;  \
    case 4: tile512(4, nv, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate); break;  \
    case 3: tile512(3, nv, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate); break;  \
    case 2: tile512(2, nv, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate); break;  \
    default: tile512(1, nv, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate); break; \
    }

__attribute__((AVX512_ATTR)) static void ukernel_avx512(int64_t kc, const float *a, int64_t a_rs,
                                                        int64_t a_cs, const float *b, int64_t b_rs,
                                                        float *c, int64_t ldc, int mr, int nr,
                                                        float alpha, int accumulate) {
    /* Narrow tiles (n <= 16, or the last columns) skip the second vector's
     * multiply-adds instead of running them on zeros. */
    if (nr > 16) {
        TILE512_CASES(2)
    } else {
        TILE512_CASES(1)
    }
}

const nd_gemm_ukernel nd_gemm_ukernel_avx512 = {"avx512 8x32", ND_CPU_ISA_AVX512, MR512, NR512,
                                                ukernel_avx512};

/* ---------------------------------------------------------- AVX2 + FMA */

#define AVX2_ATTR target("avx2,fma")
#define AVX2_TILE static inline __attribute__((always_inline, AVX2_ATTR))

enum { MR256 = 6, NR256 = 16 };

/* Lane j of the result is all ones when j < n: the mask of maskload/store. */
AVX2_TILE __m256i lanes_below(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* An mr x (8 * NV) tile; `full` tiles use plain loads and stores (AVX2's
 * masked ones are slower), the others masks for columns past nr. */
AVX2_TILE void tile256(const int mr, const int nv, const int full, int64_t kc, const float *a,
                       int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, float *c,
                       int64_t ldc, int nr, float alpha, int accumulate) {
    const __m256i m0 = lanes_below(nr), m1 = lanes_below(nr - 8);
    __m256 acc0[MR256], acc1[MR256];
    ND_UNROLL(6)
    for (int i = 0; i < mr; i++) {
        acc0[i] = _mm256_setzero_ps();
        acc1[i] = _mm256_setzero_ps();
    }
    for (int64_t p = 0; p < kc; p++) {
        const __m256 b0 = full ? _mm256_loadu_ps(b) : _mm256_maskload_ps(b, m0);
        const __m256 b1 = nv == 1 ? b0
                          : full  ? _mm256_loadu_ps(b + 8)
                                  : _mm256_maskload_ps(b + 8, m1);
        ND_UNROLL(6)
        for (int i = 0; i < mr; i++) {
            const __m256 ai = _mm256_broadcast_ss(a + i * a_rs);
            acc0[i] = _mm256_fmadd_ps(ai, b0, acc0[i]);
            if (nv == 2) acc1[i] = _mm256_fmadd_ps(ai, b1, acc1[i]);
        }
        a += a_cs;
        b += b_rs;
    }
    const __m256 va = _mm256_set1_ps(alpha);
    ND_UNROLL(6)
    for (int i = 0; i < mr; i++) {
        float *ci = c + i * ldc;
        __m256 r0 = _mm256_mul_ps(va, acc0[i]);
        __m256 r1 = _mm256_mul_ps(va, acc1[i]);
        if (full) {
            if (accumulate) r0 = _mm256_add_ps(r0, _mm256_loadu_ps(ci));
            _mm256_storeu_ps(ci, r0);
            if (nv == 2) {
                if (accumulate) r1 = _mm256_add_ps(r1, _mm256_loadu_ps(ci + 8));
                _mm256_storeu_ps(ci + 8, r1);
            }
        } else {
            if (accumulate) r0 = _mm256_add_ps(r0, _mm256_maskload_ps(ci, m0));
            _mm256_maskstore_ps(ci, m0, r0);
            if (nv == 2) {
                if (accumulate) r1 = _mm256_add_ps(r1, _mm256_maskload_ps(ci + 8, m1));
                _mm256_maskstore_ps(ci + 8, m1, r1);
            }
        }
    }
}

#define TILE256_CASES(nv, full)                                                               \
    switch (mr) {                                                                             \
    case 6: tile256(6, nv, full, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate);  \
        break;                                                                                \
    case 5: tile256(5, nv, full, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate);  \
        break;                                                                                \
    case 4: tile256(4, nv, full, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate);  \
        break;                                                                                \
    case 3: tile256(3, nv, full, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate);  \
        break;                                                                                \
    case 2: tile256(2, nv, full, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate);  \
        break;                                                                                \
    default: tile256(1, nv, full, kc, a, a_rs, a_cs, b, b_rs, c, ldc, nr, alpha, accumulate); \
        break;                                                                                \
    }

__attribute__((AVX2_ATTR)) static void ukernel_avx2(int64_t kc, const float *a, int64_t a_rs,
                                                    int64_t a_cs, const float *b, int64_t b_rs,
                                                    float *c, int64_t ldc, int mr, int nr,
                                                    float alpha, int accumulate) {
    if (nr == 16) {
        TILE256_CASES(2, 1)
    } else if (nr > 8) {
        TILE256_CASES(2, 0)
    } else if (nr == 8) {
        TILE256_CASES(1, 1)
    } else {
        TILE256_CASES(1, 0)
    }
}

const nd_gemm_ukernel nd_gemm_ukernel_avx2 = {"avx2 6x16", ND_CPU_ISA_AVX2, MR256, NR256,
                                              ukernel_avx2};

#else
/* ISO C forbids an empty translation unit. */
typedef int nd_cpu_gemm_x86_unused;
#endif /* ND_GEMM_X86 */
