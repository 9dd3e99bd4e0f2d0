/* cpu_gemm.c: needle's own single-precision GEMM: the blocking, the packing,
 * the batch loop and the plain-C micro-kernel; the x86 micro-kernels are in
 * cpu_gemm_x86.c, and the current ISA (cpu_isa.c) picks one per call.
 *
 * The layout follows the Goto/BLIS scheme: op(B) is cut into KC x NC panels
 * and op(A) into MC x KC blocks, and an MR x NR register-blocked micro-kernel
 * does the arithmetic. Unlike the textbook scheme, A is never packed and B
 * only sometimes: the micro-kernels read A through any strides (by
 * broadcasts) and B through any row stride, and mask their edges, so a small
 * product runs straight from its operands. Packing B pays where its panel is
 * reused by many rows of C, or where its rows are not contiguous (B
 * transposed). Packing A was measured as a loss here at every size up to
 * 1024^3 (the broadcasts read MR rows that stay in L1/L2 anyway). Small products thus cost a few function calls and no
 * allocation, which is what matters for the 64x64 products of small models
 * and the (T, d) products of attention heads.
 */
#include "cpu_gemm.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One KC x NR sliver of B (32 KiB at NR = 32) is reused from L1 by all the
 * MR-row slivers of an MC x KC block of A (96 KiB, L2); the KC x NC panel of
 * B (512 KiB) stays in L2/L3. 128 or 384 for KC, 48 or 192 for MC measured
 * no better. */
#define KC 256
#define MC 96
#define NC 512
/* Packing a B panel costs a copy of it; it pays when the panel is reused by
 * more than this many rows of C (and always when B's rows are strided). */
#define PACK_B_MIN_M 128
/* Packing buffers up to this many floats live on the stack (16 KiB). */
#define STACK_PACK 4096

#define ALIGN_BYTES 64

#if defined(__GNUC__) && !defined(__clang__)
/* -std=c11 turns GCC's FMA contraction off, which would halve the plain
 * kernel's throughput on FMA hardware; the rounding change is harmless. */
#define ND_CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define ND_CONTRACT
#endif

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* ------------------------------------------------ the plain-C kernel */

/* 4 x 8: eight 4-float accumulators, two B vectors and a broadcast fit the
 * 16 registers of the baseline x86-64 target (SSE2), or any 128-bit SIMD.
 * GCC's vector types say so explicitly: left to the auto-vectorizer, the
 * same loops were vectorized across rows (shuffles, 3 GFLOP/s). */
enum { MR_C = 4, NR_C = 8 };

/* Edge tiles (and compilers without vector types): the sums with run-time
 * bounds, into acc. */
static void tile_scalar(int64_t kc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                        int64_t b_rs, int mr, int nr, float acc[MR_C][NR_C]) {
    for (int64_t p = 0; p < kc; p++) {
        const float *bp = b + p * b_rs, *ap = a + p * a_cs;
        for (int i = 0; i < mr; i++) {
            const float ai = ap[i * a_rs];
            for (int j = 0; j < nr; j++) acc[i][j] += ai * bp[j];
        }
    }
}

#if defined(__GNUC__)
typedef float v4f __attribute__((vector_size(16)));

static inline v4f load4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v); /* unaligned */
    return v;
}

ND_CONTRACT static void tile_vector(int64_t kc, const float *a, int64_t a_rs, int64_t a_cs,
                                    const float *b, int64_t b_rs, float acc[MR_C][NR_C]) {
    v4f c0[MR_C] = {{0}}, c1[MR_C] = {{0}};
    for (int64_t p = 0; p < kc; p++) {
        const v4f b0 = load4(b), b1 = load4(b + 4);
        for (int i = 0; i < MR_C; i++) {
            const float x = a[i * a_rs];
            const v4f ai = {x, x, x, x};
            c0[i] += ai * b0;
            c1[i] += ai * b1;
        }
        a += a_cs;
        b += b_rs;
    }
    for (int i = 0; i < MR_C; i++) {
        memcpy(acc[i], &c0[i], sizeof c0[i]);
        memcpy(acc[i] + 4, &c1[i], sizeof c1[i]);
    }
}
#endif

static void ukernel_c(int64_t kc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                      int64_t b_rs, float *c, int64_t ldc, int mr, int nr, float alpha,
                      int accumulate) {
    float acc[MR_C][NR_C] = {{0.0f}};
#if defined(__GNUC__)
    if (mr == MR_C && nr == NR_C) tile_vector(kc, a, a_rs, a_cs, b, b_rs, acc);
    else tile_scalar(kc, a, a_rs, a_cs, b, b_rs, mr, nr, acc);
#else
    tile_scalar(kc, a, a_rs, a_cs, b, b_rs, mr, nr, acc);
#endif
    for (int i = 0; i < mr; i++) {
        float *ci = c + i * ldc;
        for (int j = 0; j < nr; j++) ci[j] = alpha * acc[i][j] + (accumulate ? ci[j] : 0.0f);
    }
}

static const nd_gemm_ukernel ukernel_plain = {"plain C 4x8", ND_CPU_ISA_BASELINE, MR_C, NR_C,
                                              ukernel_c};

const nd_gemm_ukernel *nd_cpu_gemm_ukernel(nd_cpu_isa isa) {
#ifdef ND_GEMM_X86
    if (isa == ND_CPU_ISA_AVX512) return &nd_gemm_ukernel_avx512;
    if (isa == ND_CPU_ISA_AVX2) return &nd_gemm_ukernel_avx2;
#endif
    (void)isa;
    return &ukernel_plain;
}

const char *nd_cpu_gemm_kernel_name(nd_cpu_isa isa) { return nd_cpu_gemm_ukernel(isa)->name; }

/* ----------------------------------------------------------- packing */

/* A(i, p) = a[i * rs + p * cs]: a matrix view with any strides. */
typedef struct gemm_operand {
    const float *data;
    int64_t rs, cs;
} gemm_operand;

/* Packs B[p0 : p0+kc, j0 : j0+nc] as slivers of nr columns: sliver s holds
 * B(p, s*nr + j) at bp[s*nr*kc + p*nr + j]. */
static void pack_b(gemm_operand b, int64_t p0, int64_t j0, int64_t kc, int64_t nc, int nr,
                   float *restrict bp) {
    for (int64_t jr = 0; jr < nc; jr += nr) {
        const int64_t cols = min_i64(nr, nc - jr);
        const float *src = b.data + p0 * b.rs + (j0 + jr) * b.cs;
        if (b.cs == 1) {
            for (int64_t p = 0; p < kc; p++)
                memcpy(bp + p * nr, src + p * b.rs, (size_t)cols * sizeof(float));
        } else {
            /* B stored transposed: read along its rows, write across. */
            for (int64_t j = 0; j < cols; j++)
                for (int64_t p = 0; p < kc; p++) bp[p * nr + j] = src[j * b.cs + p * b.rs];
        }
        bp += (int64_t)nr * kc;
    }
}

/* ---------------------------------------------------------- the driver */

/* C = beta*C, where beta == 0 writes zeros without reading C. */
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

/* Whether a product packs B, decided from its shape (the same for every
 * product of a batch), and the buffer that takes. */
typedef struct gemm_plan {
    const nd_gemm_ukernel *uk;
    int pack_b;
    int64_t b_elems; /* floats */
} gemm_plan;

static gemm_plan plan_gemm(const nd_gemm_ukernel *uk, int64_t m, int64_t n, int64_t k,
                           int b_rows_contiguous) {
    gemm_plan plan = {uk, !b_rows_contiguous || m > PACK_B_MIN_M, 0};
    if (plan.pack_b) plan.b_elems = round_up(min_i64(NC, n), uk->nr) * min_i64(KC, k);
    return plan;
}

/* C (m x n, ldc) = alpha * A @ B + beta * C; bpack is the plan's buffer
 * (NULL: B is read in place, its rows contiguous). */
static void gemm_run(const gemm_plan *plan, int64_t m, int64_t n, int64_t k, float alpha,
                     gemm_operand a, gemm_operand b, float beta, float *c, int64_t ldc,
                     float *restrict bpack) {
    if (m <= 0 || n <= 0) return;
    /* As in reference BLAS, alpha == 0 skips the product entirely, so A and
     * B are not read and cannot inject NaNs. */
    if (k <= 0 || alpha == 0.0f) {
        scale_c(m, n, beta, c, ldc);
        return;
    }
    if (beta != 0.0f && beta != 1.0f) {
        scale_c(m, n, beta, c, ldc);
        beta = 1.0f;
    }
    const nd_gemm_ukernel *uk = plan->uk;
    const int mr = uk->mr, nr = uk->nr;
    for (int64_t jc = 0; jc < n; jc += NC) {
        const int64_t nc = min_i64(NC, n - jc);
        for (int64_t pc = 0; pc < k; pc += KC) {
            const int64_t kc = min_i64(KC, k - pc);
            /* Only the first K block sees the caller's beta; later ones add
             * onto the partial sums already stored in C. */
            const int accumulate = pc > 0 || beta == 1.0f;
            const float *bs;
            int64_t b_rs, b_step; /* B(p, j) of this panel = bs[p*b_rs + j]; next sliver */
            if (bpack != NULL) {
                pack_b(b, pc, jc, kc, nc, nr, bpack);
                bs = bpack, b_rs = nr, b_step = (int64_t)nr * kc;
            } else {
                /* unpacked: B's rows are contiguous (cs == 1, or n == 1) */
                bs = b.data + pc * b.rs + jc, b_rs = b.rs, b_step = nr;
            }
            for (int64_t ic = 0; ic < m; ic += MC) {
                const int64_t mc = min_i64(MC, m - ic);
                const float *as = a.data + ic * a.rs + pc * a.cs;
                for (int64_t jr = 0; jr < nc; jr += nr) {
                    const int cols = (int)min_i64(nr, nc - jr);
                    const float *bsl = bs + (jr / nr) * b_step;
                    for (int64_t ir = 0; ir < mc; ir += mr) {
                        const int rows = (int)min_i64(mr, mc - ir);
                        uk->fn(kc, as + ir * a.rs, a.rs, a.cs, bsl, b_rs,
                               c + (ic + ir) * ldc + jc + jr, ldc, rows, cols, alpha, accumulate);
                    }
                }
            }
        }
    }
}

static float *align_ptr(void *p) {
    return (float *)(((uintptr_t)p + (ALIGN_BYTES - 1)) & ~(uintptr_t)(ALIGN_BYTES - 1));
}

/* Floats an aligned buffer may lose to its alignment. */
#define ALIGN_FLOATS (ALIGN_BYTES / (int64_t)sizeof(float))

/* The plan's buffer: in `stack` (STACK_PACK floats plus an alignment) when
 * it fits, else from malloc (*heap, to free); NULL when the plan packs
 * nothing. Without memory the plan is downgraded to no packing: slower,
 * never wrong. */
static float *take_buffer(gemm_plan *plan, float *stack, void **heap) {
    *heap = NULL;
    if (!plan->pack_b) return NULL;
    if (plan->b_elems <= STACK_PACK) return align_ptr(stack);
    *heap = malloc((size_t)(plan->b_elems + ALIGN_FLOATS) * sizeof(float));
    if (*heap == NULL) plan->pack_b = 0;
    return *heap ? align_ptr(*heap) : NULL;
}

/* gemm_run, also where the plan could not get the buffer to pack a B whose
 * rows are strided: each column of C is then its own product (a column of
 * op(B) is read with stride b.rs as a 1-wide tile). */
static void run_planned(const gemm_plan *plan, int64_t m, int64_t n, int64_t k, float alpha,
                        gemm_operand a, gemm_operand b, float beta, float *c, int64_t ldc,
                        float *bpack) {
    if (bpack == NULL && b.cs != 1 && n > 1) {
        for (int64_t j = 0; j < n; j++) {
            gemm_operand col = {b.data + j * b.cs, b.rs, 1};
            gemm_run(plan, m, 1, k, alpha, a, col, beta, c + j, ldc, NULL);
        }
        return;
    }
    gemm_run(plan, m, n, k, alpha, a, b, beta, c, ldc, bpack);
}

void nd_cpu_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc) {
    gemm_operand ga = {a, trans_a ? 1 : lda, trans_a ? lda : 1};
    gemm_operand gb = {b, trans_b ? 1 : ldb, trans_b ? ldb : 1};
    const nd_gemm_ukernel *uk = nd_cpu_gemm_ukernel(nd_cpu_isa_current());
    gemm_plan plan = plan_gemm(uk, m, n, k, gb.cs == 1 || n == 1);
    float stack[STACK_PACK + ALIGN_FLOATS];
    void *heap;
    float *bpack = take_buffer(&plan, stack, &heap);
    run_planned(&plan, m, n, k, alpha, ga, gb, beta, c, ldc, bpack);
    free(heap);
}

void nd_cpu_sgemm_batched(const nd_matmul_desc *d) {
    int64_t batches = 1;
    for (int i = 0; i < d->batch_ndim; i++) batches *= d->batch_shape[i];
    if (batches == 0 || d->m == 0 || d->n == 0) return;
    const nd_gemm_ukernel *uk = nd_cpu_gemm_ukernel(nd_cpu_isa_current());
    gemm_plan plan = plan_gemm(uk, d->m, d->n, d->k, d->b_col_stride == 1 || d->n == 1);
    float stack[STACK_PACK + ALIGN_FLOATS];
    void *heap;
    float *bpack = take_buffer(&plan, stack, &heap);
    for (int64_t batch = 0; batch < batches; batch++) {
        int64_t a_off, b_off;
        nd_matmul_batch_offsets(d, batch, &a_off, &b_off);
        gemm_operand a = {(const float *)d->a + a_off, d->a_row_stride, d->a_col_stride};
        gemm_operand b = {(const float *)d->b + b_off, d->b_row_stride, d->b_col_stride};
        run_planned(&plan, d->m, d->n, d->k, 1.0f, a, b, 0.0f,
                    (float *)d->out + batch * d->m * d->n, d->n, bpack);
    }
    free(heap);
}
