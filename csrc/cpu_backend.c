/* cpu_backend.c: the host backend: memory from the C heap, and the kernels
 * for copies, elementwise ops and reductions over strided float32 views.
 *
 * Kernels receive layouts already broadcast to the iteration shape; they
 * never allocate through the allocator and never fail on valid input.
 */

#include "cpu_iter.h"
#include "cpu_math.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Memory comes from cpu_memory.c (a cache of large blocks). */

/* -------------------------------------------------------------- copies */

ND_SIMD_CLONES static void copy_inner(int64_t n, float **p, const int64_t *s, const void *ctx) {
    (void)ctx;
    float *dst = p[0];
    const float *src = p[1];
    int64_t sd = s[0], ss = s[1];
    if (sd == 1 && ss == 1) {
        memmove(dst, src, (size_t)n * sizeof(float));
    } else if (sd == 1 && ss == 0) {
        const float v = src[0];
        for (int64_t i = 0; i < n; i++) dst[i] = v;
    } else {
        for (int64_t i = 0; i < n; i++) dst[i * sd] = src[i * ss];
    }
}

/* A 2-D transpose copy in tiles, so that neither side walks memory with a
 * large stride for long (compact() of a transposed matrix). */
static void copy_transposed(const nd_iter *it, float *dst, const float *src) {
    enum { TILE = 32 };
    int64_t rows = it->shape[0], cols = it->shape[1];
    int64_t dr = it->strides[0][0], dc = it->strides[0][1];
    int64_t sr = it->strides[1][0], sc = it->strides[1][1];
    for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
        int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
            int64_t c1 = c0 + TILE < cols ? c0 + TILE : cols;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) dst[r * dr + c * dc] = src[r * sr + c * sc];
        }
    }
}

static nd_status cpu_copy(const nd_layout *dst_layout, float *dst, nd_kernel_operand src) {
    float scalar = src.scalar;
    const nd_layout *layouts[2] = {dst_layout, src.data ? src.layout : NULL};
    nd_iter it;
    nd_iter_prepare(&it, dst_layout->shape, dst_layout->ndim, 2, layouts, 0);
    float *base[2] = {dst + dst_layout->offset,
                      src.data ? (float *)src.data + src.layout->offset : &scalar};
    if (it.ndim == 2 && it.strides[0][1] == 1 && it.strides[1][0] == 1 && it.shape[0] >= 16 &&
        it.shape[1] >= 16) {
        copy_transposed(&it, base[0], base[1]);
        return ND_OK;
    }
    nd_iter_run(&it, base, copy_inner, NULL);
    return ND_OK;
}

static nd_status cpu_to_host(const nd_layout *src_layout, const float *src, float *host) {
    nd_layout host_layout;
    nd_layout_contiguous(src_layout->ndim, src_layout->shape, &host_layout);
    nd_kernel_operand op = {src, src_layout, 0.0f};
    return cpu_copy(&host_layout, host, op);
}

static nd_status cpu_from_host(const nd_layout *dst_layout, float *dst, const float *host) {
    nd_layout host_layout;
    nd_layout_contiguous(dst_layout->ndim, dst_layout->shape, &host_layout);
    nd_kernel_operand op = {host, &host_layout, 0.0f};
    return cpu_copy(dst_layout, dst, op);
}

/* -------------------------------------------------------- binary ops */

/* Each op gets contiguous, scalar-right, scalar-left and strided loops so
 * the common cases vectorise. x and y are the operands, the expression the
 * result. */
#define DEFINE_BINARY(name, expr)                                                    \
    ND_SIMD_CLONES static void binary_##name(int64_t n, float **p, const int64_t *s, \
                                             const void *ctx) {                      \
        (void)ctx;                                                                   \
        float *o = p[0];                                                             \
        const float *a = p[1], *b = p[2];                                            \
        int64_t so = s[0], sa = s[1], sb = s[2];                                     \
        if (so == 1 && sa == 1 && sb == 1) {                                         \
            for (int64_t i = 0; i < n; i++) {                                        \
                const float x = a[i], y = b[i];                                      \
                o[i] = (expr);                                                       \
            }                                                                        \
        } else if (so == 1 && sa == 1 && sb == 0) {                                  \
            const float y = b[0];                                                    \
            for (int64_t i = 0; i < n; i++) {                                        \
                const float x = a[i];                                                \
                o[i] = (expr);                                                       \
            }                                                                        \
        } else if (so == 1 && sa == 0 && sb == 1) {                                  \
            const float x = a[0];                                                    \
            for (int64_t i = 0; i < n; i++) {                                        \
                const float y = b[i];                                                \
                o[i] = (expr);                                                       \
            }                                                                        \
        } else {                                                                     \
            for (int64_t i = 0; i < n; i++) {                                        \
                const float x = a[i * sa], y = b[i * sb];                            \
                o[i * so] = (expr);                                                  \
            }                                                                        \
        }                                                                            \
    }

DEFINE_BINARY(add, x + y)
DEFINE_BINARY(sub, x - y)
DEFINE_BINARY(mul, x *y)
DEFINE_BINARY(div, x / y)
DEFINE_BINARY(pow, nd_powf(x, y))
/* NaN propagates from either side, as in NumPy's maximum/minimum. */
DEFINE_BINARY(maximum, (x >= y || x != x) ? x : y)
DEFINE_BINARY(minimum, (x <= y || x != x) ? x : y)
DEFINE_BINARY(eq, x == y ? 1.0f : 0.0f)
DEFINE_BINARY(ne, x != y ? 1.0f : 0.0f)
DEFINE_BINARY(ge, x >= y ? 1.0f : 0.0f)
DEFINE_BINARY(gt, x > y ? 1.0f : 0.0f)
DEFINE_BINARY(le, x <= y ? 1.0f : 0.0f)
DEFINE_BINARY(lt, x < y ? 1.0f : 0.0f)
/* Exact forms of common scalar powers (x**2 in norms and variances). */
DEFINE_BINARY(square, x *x + 0.0f * y)
DEFINE_BINARY(cube, x * x * x + 0.0f * y)
DEFINE_BINARY(reciprocal, 1.0f / x + 0.0f * y)

static const nd_inner_fn binary_kernels[ND_BINARY_OP_COUNT] = {
    [ND_ADD] = binary_add,         [ND_SUB] = binary_sub, [ND_MUL] = binary_mul,
    [ND_DIV] = binary_div,         [ND_POW] = binary_pow, [ND_MAXIMUM] = binary_maximum,
    [ND_MINIMUM] = binary_minimum, [ND_EQ] = binary_eq,   [ND_NE] = binary_ne,
    [ND_GE] = binary_ge,           [ND_GT] = binary_gt,   [ND_LE] = binary_le,
    [ND_LT] = binary_lt,
};

static nd_status cpu_binary(nd_binary_op op, const nd_layout *out_layout, float *out,
                            nd_kernel_operand a, nd_kernel_operand b) {
    nd_inner_fn fn = binary_kernels[op];
    if (op == ND_POW && b.data == NULL) {
        /* 0*y keeps y "used" so these share the binary signature; y is a
         * finite constant here, so the term is exactly 0 unless x is inf/nan,
         * where x*x (or 1/x) already decides the result. */
        if (b.scalar == 2.0f) fn = binary_square;
        else if (b.scalar == 3.0f) fn = binary_cube;
        else if (b.scalar == -1.0f) fn = binary_reciprocal;
        if (fn != binary_pow) b.scalar = 0.0f;
    }
    float sa = a.scalar, sb = b.scalar;
    const nd_layout *layouts[3] = {out_layout, a.data ? a.layout : NULL, b.data ? b.layout : NULL};
    nd_iter it;
    nd_iter_prepare(&it, out_layout->shape, out_layout->ndim, 3, layouts, 0);
    float *base[3] = {out + out_layout->offset, a.data ? (float *)a.data + a.layout->offset : &sa,
                      b.data ? (float *)b.data + b.layout->offset : &sb};
    nd_iter_run(&it, base, fn, NULL);
    return ND_OK;
}

/* --------------------------------------------------------- unary ops */

#define DEFINE_UNARY(name, expr)                                                    \
    ND_SIMD_CLONES static void unary_##name(int64_t n, float **p, const int64_t *s, \
                                            const void *ctx) {                      \
        (void)ctx;                                                                  \
        float *o = p[0];                                                            \
        const float *a = p[1];                                                      \
        int64_t so = s[0], sa = s[1];                                               \
        if (so == 1 && sa == 1) {                                                   \
            for (int64_t i = 0; i < n; i++) {                                       \
                const float x = a[i];                                               \
                o[i] = (expr);                                                      \
            }                                                                       \
        } else {                                                                    \
            for (int64_t i = 0; i < n; i++) {                                       \
                const float x = a[i * sa];                                          \
                o[i * so] = (expr);                                                 \
            }                                                                       \
        }                                                                           \
    }

DEFINE_UNARY(neg, -x)
DEFINE_UNARY(log, nd_logf(x))
DEFINE_UNARY(exp, nd_expf(x))
DEFINE_UNARY(tanh, nd_tanhf(x))
DEFINE_UNARY(sqrt, sqrtf(x))
DEFINE_UNARY(sigmoid, nd_sigmoidf(x))
DEFINE_UNARY(abs, fabsf(x))
DEFINE_UNARY(relu, (x > 0.0f || x != x) ? x : 0.0f)

static const nd_inner_fn unary_kernels[ND_UNARY_OP_COUNT] = {
    [ND_NEG] = unary_neg,   [ND_LOG] = unary_log,   [ND_EXP] = unary_exp,
    [ND_TANH] = unary_tanh, [ND_SQRT] = unary_sqrt, [ND_SIGMOID] = unary_sigmoid,
    [ND_ABS] = unary_abs,   [ND_RELU] = unary_relu,
};

static nd_status cpu_unary(nd_unary_op op, const nd_layout *out_layout, float *out,
                           const nd_layout *a_layout, const float *a) {
    const nd_layout *layouts[2] = {out_layout, a_layout};
    nd_iter it;
    nd_iter_prepare(&it, out_layout->shape, out_layout->ndim, 2, layouts, 0);
    float *base[2] = {out + out_layout->offset, (float *)a + a_layout->offset};
    nd_iter_run(&it, base, unary_kernels[op], NULL);
    return ND_OK;
}

/* -------------------------------------------------------- reductions */

/* Sums a contiguous row in 64 float lanes (several independent vector
 * accumulators, so the adds pipeline), flushed into a double every block, so
 * long rows keep float32-level accuracy at vector speed. */
ND_SIMD_CLONES static double sum_contiguous(const float *a, int64_t n) {
    enum { LANES = 64, BLOCK = 1024 };
    double total = 0.0;
    int64_t i = 0;
    while (n - i >= LANES) {
        float acc[LANES] = {0};
        int64_t stop = i + BLOCK <= n ? i + BLOCK : n - (n - i) % LANES;
        for (; i < stop; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += a[i + l];
        double block = 0.0;
        for (int l = 0; l < LANES; l++) block += acc[l];
        total += block;
    }
    for (; i < n; i++) total += a[i];
    return total;
}

/* max/min of a contiguous row in independent lanes: a select chain over one
 * accumulator cannot vectorise, 64 of them vectorise and pipeline. NaN wins,
 * as in NumPy. The compare-select ignores NaN (better(NaN, acc) is false),
 * so NaN is tracked apart, by an integer max of |bits| in other lanes: any
 * value above those of +inf means a NaN was there. Both are one vector
 * operation per 16 floats, where testing x != x and or-ing per element took
 * three more. The lanes are folded in halves, also vectorised. */
#define DEFINE_EXTREMUM_ROW(name, better)                                                  \
    ND_SIMD_CLONES static float name##_contiguous(const float *a, int64_t n, float init) { \
        enum { LANES = 64 };                                                               \
        float acc[LANES];                                                                  \
        uint32_t mag[LANES];                                                               \
        for (int l = 0; l < LANES; l++) {                                                  \
            acc[l] = init;                                                                 \
            mag[l] = 0;                                                                    \
        }                                                                                  \
        int64_t i = 0;                                                                     \
        for (; i + LANES <= n; i += LANES)                                                 \
            for (int l = 0; l < LANES; l++) {                                              \
                const float x = a[i + l];                                                  \
                const uint32_t m = nd__f2u(x) & 0x7FFFFFFFu;                               \
                acc[l] = better(x, acc[l]) ? x : acc[l];                                   \
                mag[l] = m > mag[l] ? m : mag[l];                                          \
            }                                                                              \
        for (int w = LANES / 2; w > 0; w /= 2)                                             \
            for (int l = 0; l < w; l++) {                                                  \
                acc[l] = better(acc[l + w], acc[l]) ? acc[l + w] : acc[l];                 \
                mag[l] = mag[l + w] > mag[l] ? mag[l + w] : mag[l];                        \
            }                                                                              \
        /* A NaN init (a NaN from an earlier row of the same output) stays. */             \
        int nan = mag[0] > 0x7F800000u || init != init;                                    \
        float r = acc[0];                                                                  \
        for (; i < n; i++) {                                                               \
            const float x = a[i];                                                          \
            nan |= x != x;                                                                 \
            r = better(x, r) ? x : r;                                                      \
        }                                                                                  \
        return nan ? __builtin_nanf("") : r;                                               \
    }
#define GREATER(x, y) ((x) > (y))
#define LESS(x, y) ((x) < (y))
DEFINE_EXTREMUM_ROW(max, GREATER)
DEFINE_EXTREMUM_ROW(min, LESS)

#define DEFINE_REDUCE(name, combine)                                                 \
    ND_SIMD_CLONES static void reduce_##name(int64_t n, float **p, const int64_t *s, \
                                             const void *ctx) {                      \
        (void)ctx;                                                                   \
        float *o = p[0];                                                             \
        const float *a = p[1];                                                       \
        int64_t so = s[0], sa = s[1];                                                \
        if (so == 0 && sa == 1) {                                                    \
            o[0] = name##_contiguous(a, n, o[0]);                                    \
        } else if (so == 0) {                                                        \
            float acc = o[0];                                                        \
            for (int64_t i = 0; i < n; i++) {                                        \
                const float x = a[i * sa];                                           \
                acc = (combine);                                                     \
            }                                                                        \
            o[0] = acc;                                                              \
        } else if (so == 1 && sa == 1) {                                             \
            for (int64_t i = 0; i < n; i++) {                                        \
                const float x = a[i], acc = o[i];                                    \
                o[i] = (combine);                                                    \
            }                                                                        \
        } else {                                                                     \
            for (int64_t i = 0; i < n; i++) {                                        \
                const float x = a[i * sa], acc = o[i * so];                          \
                o[i * so] = (combine);                                               \
            }                                                                        \
        }                                                                            \
    }

DEFINE_REDUCE(max, (x > acc || x != x) ? x : acc)
DEFINE_REDUCE(min, (x < acc || x != x) ? x : acc)

ND_SIMD_CLONES static void reduce_sum_strided(int64_t n, float **p, const int64_t *s,
                                              const void *ctx) {
    (void)ctx;
    float *o = p[0];
    const float *a = p[1];
    int64_t so = s[0], sa = s[1];
    if (so == 1 && sa == 1) {
        for (int64_t i = 0; i < n; i++) o[i] += a[i];
    } else {
        for (int64_t i = 0; i < n; i++) o[i * so] += a[i * sa];
    }
}

static void reduce_sum(int64_t n, float **p, const int64_t *s, const void *ctx) {
    if (s[0] == 0 && s[1] == 1) {
        p[0][0] = (float)((double)p[0][0] + sum_contiguous(p[1], n));
        return;
    }
    if (s[0] == 0) {
        double acc = p[0][0];
        for (int64_t i = 0; i < n; i++) acc += p[1][i * s[1]];
        p[0][0] = (float)acc;
        return;
    }
    reduce_sum_strided(n, p, s, ctx);
}

static const nd_inner_fn reduce_kernels[ND_REDUCE_OP_COUNT] = {
    [ND_REDUCE_SUM] = reduce_sum,
    [ND_REDUCE_MAX] = reduce_max,
    [ND_REDUCE_MIN] = reduce_min,
};

/* A sum whose output elements each get several inner rows (a reduced dim
 * outside the inner loop: column sums, or a walk in another order than the
 * output's) would round its running sums to float once per row; these sums
 * run in a double shadow of the output instead (one double per output
 * element, so at most SHADOW_MAX of them), then round once. Column sums (the
 * next-outer dim reduced, inner rows contiguous in both) add BLOCK rows in
 * float first, at the float loop's speed, then add that block into the
 * shadow: error near float64's at a few percent of the time. */
enum { SHADOW_MAX = 1 << 24, SUM_BLOCK = 32 };

ND_SIMD_CLONES static void add_row_double(double *o, const float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) o[i] += a[i];
}

ND_SIMD_CLONES static void add_row_float(float *o, const float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) o[i] += a[i];
}

static int64_t sum_shadow_size(const nd_iter *it) {
    int several = 0;
    int64_t extent = 1;
    for (int d = 0; d < it->ndim; d++) {
        if (d < it->ndim - 1 && it->strides[0][d] == 0 && it->shape[d] > 1) several = 1;
        if (it->strides[0][d] < 0) return 0;
        extent += (it->shape[d] - 1) * it->strides[0][d];
    }
    return several && extent <= SHADOW_MAX ? extent : 0;
}

/* One inner row of n elements into the shadow. */
static void sum_row_into(double *o, const float *x, int64_t n, int64_t so, int64_t sa) {
    if (so == 0 && sa == 1) {
        o[0] += sum_contiguous(x, n);
    } else if (so == 0) {
        double t = 0.0;
        for (int64_t i = 0; i < n; i++) t += x[i * sa];
        o[0] += t;
    } else if (so == 1 && sa == 1) {
        add_row_double(o, x, n);
    } else {
        for (int64_t i = 0; i < n; i++) o[i * so] += x[i * sa];
    }
}

/* 0, or -1 when the staging row cannot be allocated (nothing written). */
static int sum_into_shadow(const nd_iter *it, double *acc, const float *a) {
    int inner = it->ndim - 1, mid = inner - 1; /* mid: the dim just outside */
    int64_t n = it->shape[inner], so = it->strides[0][inner], sa = it->strides[1][inner];
    int64_t m = mid >= 0 ? it->shape[mid] : 1;
    int64_t so1 = mid >= 0 ? it->strides[0][mid] : 0, sa1 = mid >= 0 ? it->strides[1][mid] : 0;
    int columns = mid >= 0 && so1 == 0 && so == 1 && sa == 1 && m > 1;
    float *stage = columns ? malloc(sizeof(float) * (size_t)n) : NULL;
    if (columns && stage == NULL) return -1;
    int64_t index[ND_MAX_DIMS] = {0}, outer = 1;
    for (int d = 0; d < mid; d++) outer *= it->shape[d];
    for (int64_t k = 0; k < outer; k++) {
        int64_t off_o = 0, off_a = 0;
        for (int d = 0; d < mid; d++) {
            off_o += index[d] * it->strides[0][d];
            off_a += index[d] * it->strides[1][d];
        }
        double *o = acc + off_o;
        const float *x = a + off_a;
        if (columns) {
            for (int64_t j0 = 0; j0 < m; j0 += SUM_BLOCK) {
                int64_t j1 = j0 + SUM_BLOCK < m ? j0 + SUM_BLOCK : m;
                memcpy(stage, x + j0 * sa1, sizeof(float) * (size_t)n);
                for (int64_t j = j0 + 1; j < j1; j++) add_row_float(stage, x + j * sa1, n);
                add_row_double(o, stage, n);
            }
        } else {
            for (int64_t j = 0; j < m; j++) sum_row_into(o + j * so1, x + j * sa1, n, so, sa);
        }
        for (int d = mid - 1; d >= 0; d--) {
            if (++index[d] < it->shape[d]) break;
            index[d] = 0;
        }
    }
    free(stage);
    return 0;
}

static nd_status cpu_reduce(nd_reduce_op op, const nd_layout *out_layout, float *out,
                            const nd_layout *a_layout, const float *a) {
    const nd_layout *layouts[2] = {out_layout, a_layout};
    nd_iter it;
    /* Walk in the input's memory order; the output is small or contiguous. */
    nd_iter_prepare(&it, a_layout->shape, a_layout->ndim, 2, layouts, 1);
    float *base[2] = {out + out_layout->offset, (float *)a + a_layout->offset};
    int64_t shadow_size = op == ND_REDUCE_SUM ? sum_shadow_size(&it) : 0;
    double *shadow = shadow_size > 0 ? calloc((size_t)shadow_size, sizeof(double)) : NULL;
    if (shadow == NULL) { /* one row per output, or no memory for the shadow */
        nd_iter_run(&it, base, reduce_kernels[op], NULL);
        return ND_OK;
    }
    for (int64_t i = 0; i < shadow_size; i++) shadow[i] = base[0][i];
    if (sum_into_shadow(&it, shadow, base[1]) < 0) {
        nd_iter_run(&it, base, reduce_kernels[op], NULL);
    } else {
        for (int64_t i = 0; i < shadow_size; i++) base[0][i] = (float)shadow[i];
    }
    free(shadow);
    return ND_OK;
}

/* ------------------------------------------------------------ matmul */

static nd_sgemm_fn installed_sgemm = NULL;

void nd_cpu_set_sgemm(nd_sgemm_fn fn) { installed_sgemm = fn; }
nd_sgemm_fn nd_cpu_get_sgemm(void) { return installed_sgemm; }

#include "cpu_gemm.h"

/* Below this many multiply-adds a BLAS call costs more than the work. */
#define SMALL_MATMUL_FLOPS 4096
/* Below this many, the built-in single-threaded GEMM is as fast as a
 * threaded BLAS and never waits on a thread pool (OpenBLAS's threads took
 * milliseconds for 64x128x256 on a busy 2-core machine); bench/ndarray_bench.py
 * measures both. */
#define BLAS_MIN_FLOPS (256 * 256 * 256)

static void small_matmul(const nd_matmul_desc *d, const float *a, const float *b, float *out) {
    for (int64_t i = 0; i < d->m; i++) {
        float *row = out + i * d->n;
        for (int64_t j = 0; j < d->n; j++) row[j] = 0.0f;
        for (int64_t p = 0; p < d->k; p++) {
            const float av = a[i * d->a_row_stride + p * d->a_col_stride];
            const float *brow = b + p * d->b_row_stride;
            for (int64_t j = 0; j < d->n; j++) row[j] += av * brow[j * d->b_col_stride];
        }
    }
}

static nd_status cpu_matmul(const nd_matmul_desc *d) {
    int64_t batches = 1;
    for (int i = 0; i < d->batch_ndim; i++) batches *= d->batch_shape[i];
    int64_t index[ND_MAX_DIMS] = {0};
    nd_sgemm_fn gemm = installed_sgemm != NULL && d->m * d->n * d->k >= BLAS_MIN_FLOPS
                           ? installed_sgemm
                           : nd_cpu_sgemm_fallback;
    int small = d->m * d->n * d->k <= SMALL_MATMUL_FLOPS;
    int trans_a = d->a_col_stride != 1, trans_b = d->b_col_stride != 1;
    int64_t lda = trans_a ? d->a_col_stride : d->a_row_stride;
    int64_t ldb = trans_b ? d->b_col_stride : d->b_row_stride;
    for (int64_t batch = 0; batch < batches; batch++) {
        int64_t a_off = 0, b_off = 0;
        for (int i = 0; i < d->batch_ndim; i++) {
            a_off += index[i] * d->a_batch_strides[i];
            b_off += index[i] * d->b_batch_strides[i];
        }
        float *out = d->out + batch * d->m * d->n;
        if (d->k == 0) {
            memset(out, 0, (size_t)(d->m * d->n) * sizeof(float));
        } else if (small) {
            small_matmul(d, d->a + a_off, d->b + b_off, out);
        } else {
            gemm(trans_a, trans_b, d->m, d->n, d->k, 1.0f, d->a + a_off, lda, d->b + b_off, ldb,
                 0.0f, out, d->n);
        }
        for (int i = d->batch_ndim - 1; i >= 0; i--) {
            if (++index[i] < d->batch_shape[i]) break;
            index[i] = 0;
        }
    }
    return ND_OK;
}

const nd_backend nd_cpu_backend = {
    .name = "cpu",
    .raw_alloc = nd_cpu_raw_alloc,
    .raw_free = nd_cpu_raw_free,
    .release_cache = nd_cpu_release_cache,
    .copy = cpu_copy,
    .binary = cpu_binary,
    .unary = cpu_unary,
    .reduce = cpu_reduce,
    .matmul = cpu_matmul,
    .to_host = cpu_to_host,
    .from_host = cpu_from_host,
    .gather_rows = nd_cpu_gather_rows,
    .scatter_add_rows = nd_cpu_scatter_add_rows,
    .row_stats = nd_cpu_row_stats,
    .row_apply = nd_cpu_row_apply,
    .xent_loss = nd_cpu_xent_loss,
    .check_indices = nd_cpu_check_indices,
};
