/* cpu_loops.h: the table of the CPU backend's inner loops, one per
 * instruction set (cpu_loops.inc, compiled by cpu_loops_*.c), and how the
 * backend finds the one for the current ISA. */
#ifndef NEEDLE_CPU_LOOPS_H
#define NEEDLE_CPU_LOOPS_H

#include "cpu_iter.h"

/* The context of row_apply below: the rows, and for ND_ROW_XENT_GRAD the
 * factor out_grad / rows. */
typedef struct nd_row_apply_ctx {
    const nd_rows_desc *d;
    float k;
} nd_row_apply_ctx;

/* The context of a binary loop of float16 or bfloat16 (NULL: none): the
 * scalar operands, in the compute type (a scalar is not rounded to 16 bits). */
typedef struct nd_ew_scalars {
    int a_set, b_set; /* whether a / b is this scalar */
    float a, b;
} nd_ew_scalars;

/* A block of a float64 product (cpu_matmul_typed.c): C[i, 0:nc] +=
 * A[i, 0:kc] @ B for the rows given, B packed (kc x nc, contiguous). */
typedef struct nd_f64_block {
    const double *a; /* A(0, 0) of the block */
    int64_t a_rs, a_cs;
    const double *b;
    int64_t kc, nc;
    double *c; /* C(0, 0) of the block */
    int64_t ldc;
} nd_f64_block;

typedef struct nd_cpu_loops {
    nd_inner_fn copy; /* p[0] = p[1] */
    /* The elementwise loops, by dtype then op; p points at elements of the
     * dtype (run through nd_iter_run_sized but for float32). */
    nd_inner_fn binary[ND_DTYPE_COUNT][ND_BINARY_OP_COUNT];
    /* ND_POW by a scalar exponent, by nd_pow_form_of(exponent): the general
     * loop or an exact form, which takes the exponent zeroed. */
    nd_inner_fn pow_form[ND_DTYPE_COUNT][ND_POW_FORM_COUNT];
    nd_inner_fn unary[ND_DTYPE_COUNT][ND_UNARY_OP_COUNT];
    /* float32: p[0] (stride 0 along reduced dims) combined with p[1]. */
    nd_inner_fn reduce[ND_REDUCE_OP_COUNT];
    /* The other dtypes (none for float32): p[0] double accumulators (stride 0
     * along reduced dims) combined with p[1], elements of the dtype. */
    nd_inner_fn reduce_wide[ND_DTYPE_COUNT][ND_REDUCE_OP_COUNT];
    /* The sum of a contiguous row, float lanes flushed into a double. */
    double (*sum_contiguous)(const float *a, int64_t n);
    void (*add_row_double)(double *o, const float *a, int64_t n); /* o += a */
    void (*add_row_float)(float *o, const float *a, int64_t n);   /* o += a */
    /* The narrow types' rows to and from float32: n elements of src at
     * stride into dst, and n floats into dst at stride, rounded to nearest
     * even (float16 by F16C where present; bit for bit dtype_convert.h's). */
    void (*f16_to_float)(float *dst, const uint16_t *src, int64_t stride, int64_t n);
    void (*bf16_to_float)(float *dst, const uint16_t *src, int64_t stride, int64_t n);
    void (*float_to_f16)(uint16_t *dst, int64_t stride, const float *src, int64_t n);
    void (*float_to_bf16)(uint16_t *dst, int64_t stride, const float *src, int64_t n);
    /* dst[i] = src[i] + add[i], rounded as float_to_*, for n contiguous values. */
    void (*float_sum_to_f16)(uint16_t *dst, const float *src, const float *add, int64_t n);
    void (*float_sum_to_bf16)(uint16_t *dst, const float *src, const float *add, int64_t n);
    /* A block B[0:kc, 0:cols] of narrow elements (row p at src + p*rs,
     * contiguous) widened into the GEMM kernel's slivers of nr columns:
     * B(p, j) to dst[(j - j % nr) * kc + p * nr + j % nr] (the last sliver's
     * lanes past cols left as they are). Rows are read along, each once. */
    void (*f16_to_float_slivers)(float *dst, const uint16_t *src, int64_t rs, int64_t kc,
                                 int64_t cols, int nr);
    void (*bf16_to_float_slivers)(float *dst, const uint16_t *src, int64_t rs, int64_t kc,
                                  int64_t cols, int nr);
    /* Rows [begin, end) of an nd_f64_block, an nd_cpu_parallel_for body. */
    void (*f64_block_rows)(void *block, int64_t begin, int64_t end);
    /* Softmax rows [begin, end) (cpu_softmax_rows.inc), as nd_cpu_parallel_for
     * bodies: statistics of an nd_rows_desc, the pass of an nd_row_apply_ctx. */
    void (*row_stats)(void *desc, int64_t begin, int64_t end);
    void (*row_apply)(void *ctx, int64_t begin, int64_t end);
    /* Fused optimizer updates over elements [begin, end) (cpu_optim.inc), as
     * nd_cpu_parallel_for bodies of an nd_adam_desc / nd_sgd_desc. */
    void (*adam_update)(void *desc, int64_t begin, int64_t end);
    void (*sgd_update)(void *desc, int64_t begin, int64_t end);
} nd_cpu_loops;

extern const nd_cpu_loops nd_cpu_loops_baseline;
#if defined(__x86_64__) && defined(__GNUC__)
#define ND_CPU_LOOPS_X86 1
extern const nd_cpu_loops nd_cpu_loops_avx2, nd_cpu_loops_avx512;
#endif

/* The loops of the current ISA. */
static inline const nd_cpu_loops *nd_cpu_loops_current(void) {
#ifdef ND_CPU_LOOPS_X86
    switch (nd_cpu_isa_current()) {
    case ND_CPU_ISA_AVX512: return &nd_cpu_loops_avx512;
    case ND_CPU_ISA_AVX2: return &nd_cpu_loops_avx2;
    default: break;
    }
#endif
    return &nd_cpu_loops_baseline;
}

#endif /* NEEDLE_CPU_LOOPS_H */
