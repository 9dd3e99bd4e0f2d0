/* cpu_softmax.c: the host's softmax row kernels: each row's statistics (an
 * online max and sum of exponentials), the elementwise passes that use them
 * (softmax, log-softmax, the cross-entropy gradient) and the cross-entropy
 * loss (see nd_rows_desc in internal.h).
 *
 * The statistics read a row once from memory: it goes in blocks small
 * enough to stay in L1 while the block's max and then its exponentials are
 * computed, and the running sum is rescaled when the max grows. Large arrays
 * are split by rows over threads (cpu_parallel.c). The loops are written for
 * GCC's vectoriser (independent lanes, nd_expf from cpu_math.h) and cloned
 * per ISA like the other hot kernels. Labels arrive checked (softmax.c).
 */
#include "cpu_iter.h"
#include "cpu_math.h"

#include <float.h>
#include <math.h>

/* The helpers below must be inlined into each ISA clone of their callers:
 * a helper left out of line is compiled for the baseline ISA only. */
#if defined(__GNUC__)
#define ROW_INLINE inline __attribute__((always_inline))
#else
#define ROW_INLINE inline
#endif

/* BLOCK floats (8 KiB) stay in L1 between the max and the sum; LANES
 * independent accumulators vectorise and hide the latency of nd_expf. */
enum { BLOCK = 2048, LANES = 32 };
/* Fewer elements than this per thread are not worth a thread. */
#define GRAIN_ELEMENTS ((int64_t)1 << 16)

/* The block helpers take a block of n elements at x that ends a stretch of
 * at least LANES readable floats (a row longer than SHORT_ROW): a partial
 * last step reads the LANES floats that end the block, some of them read
 * before, instead of a scalar tail. */

static ROW_INLINE float block_max(const float *x, int64_t n) {
    float acc[LANES];
    for (int l = 0; l < LANES; l++) acc[l] = -FLT_MAX;
    int64_t i = 0;
    /* A NaN compares false and is skipped here; the sum below carries it. */
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
    if (i < n) { /* elements seen twice change no max */
        const float *last = x + n - LANES;
        for (int l = 0; l < LANES; l++) acc[l] = last[l] > acc[l] ? last[l] : acc[l];
    }
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
    return acc[0];
}

static ROW_INLINE float block_exp_sum(const float *x, int64_t n, float m) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += nd_expf(x[i + l] - m);
    if (i < n) { /* the lanes already summed are selected out (not multiplied: a NaN) */
        const float *last = x + n - LANES;
        const int skip = (int)(LANES - (n - i));
        for (int l = 0; l < LANES; l++) {
            const float e = nd_expf(last[l] - m);
            acc[l] += nd__self(l >= skip, e, 0.0f);
        }
    }
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* Rows of at most SHORT_ROW elements would leave a vector loop along the
 * row mostly in its scalar tail (an attention row has 20): they go in
 * chunks of BLOCK elements' worth of rows, vectorised across rows. */
enum { SHORT_ROW = 64 };

/* The grain of a parallel loop over rows of cols elements. */
static int64_t row_grain(int64_t cols) {
    return cols >= GRAIN_ELEMENTS ? 1 : GRAIN_ELEMENTS / (cols > 0 ? cols : 1);
}

/* ------------------------------------------------------------ statistics */

/* Writes row r's statistics and log-sum-exp where the descriptor asks. */
static ROW_INLINE void put_stats(const nd_rows_desc *d, int64_t r, float m, float s, float lse) {
    if (d->stats != NULL) {
        d->stats[2 * r] = m;
        d->stats[2 * r + 1] = s;
    }
    if (d->out != NULL) d->out[r * d->ldo] = lse;
}

/* Short rows: a chunk of them transposed into t (column j holds element j of
 * every row), so that the max, the exponentials and the sums run down the
 * columns, one lane per row. */
ND_SIMD_CLONES static void stats_short(const nd_rows_desc *d, int64_t begin, int64_t end) {
    float t[BLOCK], m[BLOCK], s[BLOCK];
    const int64_t cols = d->cols, per = BLOCK / cols;
    for (int64_t r0 = begin; r0 < end; r0 += per) {
        const int64_t nr = end - r0 < per ? end - r0 : per;
        for (int64_t i = 0; i < nr; i++)
            for (int64_t j = 0; j < cols; j++) t[j * nr + i] = d->x[(r0 + i) * d->ldx + j];
        for (int64_t i = 0; i < nr; i++) m[i] = -FLT_MAX;
        for (int64_t j = 0; j < cols; j++) {
            const float *col = t + j * nr;
            for (int64_t i = 0; i < nr; i++) m[i] = col[i] > m[i] ? col[i] : m[i];
        }
        for (int64_t i = 0; i < nr; i++) {
            m[i] = m[i] < FLT_MAX ? m[i] : FLT_MAX;
            s[i] = 0.0f;
        }
        for (int64_t j = 0; j < cols; j++) {
            const float *col = t + j * nr;
            for (int64_t i = 0; i < nr; i++) s[i] += nd_expf(col[i] - m[i]);
        }
        for (int64_t i = 0; i < nr; i++) put_stats(d, r0 + i, m[i], s[i], m[i] + nd_logf(s[i]));
    }
}

ND_SIMD_CLONES static void stats_range(void *ctx, int64_t begin, int64_t end) {
    const nd_rows_desc *d = ctx;
    if (d->cols <= SHORT_ROW) {
        stats_short(d, begin, end);
        return;
    }
    for (int64_t r = begin; r < end; r++) {
        const float *x = d->x + r * d->ldx;
        float m = -FLT_MAX;
        double s = 0.0;
        for (int64_t i = 0; i < d->cols; i += BLOCK) {
            int64_t n = d->cols - i < BLOCK ? d->cols - i : BLOCK;
            float bm = block_max(x + i, n);
            bm = bm < FLT_MAX ? bm : FLT_MAX; /* +inf: exp(inf - FLT_MAX) = inf below */
            if (bm > m) {
                if (s != 0.0) s *= exp((double)m - (double)bm); /* 0 before the first block */
                m = bm;
            }
            s += block_exp_sum(x + i, n, m);
        }
        put_stats(d, r, m, (float)s, d->out != NULL ? (float)((double)m + log(s)) : 0.0f);
    }
}

nd_status nd_cpu_row_stats(const nd_rows_desc *d) {
    nd_cpu_parallel_for(d->rows, row_grain(d->cols), stats_range, (void *)d);
    return ND_OK;
}

/* ------------------------------------------------------- elementwise rows */

typedef struct apply_ctx {
    const nd_rows_desc *d;
    float k; /* ND_ROW_XENT_GRAD: out_grad / rows */
} apply_ctx;

/* The label's own element of a cross-entropy gradient row, as (p - 1) * k:
 * exact where p is near 1. */
static ROW_INLINE void xent_label(const apply_ctx *c, int64_t r, const float *x, float *o) {
    const nd_rows_desc *d = c->d;
    const int64_t y = (int64_t)d->labels[r * d->label_stride];
    const float m = d->stats[2 * r], s = d->stats[2 * r + 1];
    o[y] = (nd_expf(x[y] - m) / s - 1.0f) * c->k;
}

/* Short rows laid end to end (x and out compact): a chunk of them as one
 * flat loop, each element with its row's max and factor spread beside it. */
ND_SIMD_CLONES static void apply_short(const apply_ctx *c, int64_t begin, int64_t end) {
    const nd_rows_desc *d = c->d;
    const int64_t cols = d->cols, per = BLOCK / cols;
    float mx[BLOCK], fx[BLOCK];
    for (int64_t r0 = begin; r0 < end; r0 += per) {
        const int64_t nr = end - r0 < per ? end - r0 : per, n = nr * cols;
        for (int64_t i = 0; i < nr; i++) {
            const float m = d->stats[2 * (r0 + i)], s = d->stats[2 * (r0 + i) + 1];
            const float f = d->mode == ND_ROW_SOFTMAX       ? 1.0f / s
                            : d->mode == ND_ROW_LOG_SOFTMAX ? nd_logf(s)
                                                            : c->k / s;
            for (int64_t j = 0; j < cols; j++) {
                mx[i * cols + j] = m;
                fx[i * cols + j] = f;
            }
        }
        const float *restrict x = d->x + r0 * cols;
        float *restrict o = d->out + r0 * cols;
        if (d->mode == ND_ROW_LOG_SOFTMAX) {
            for (int64_t k = 0; k < n; k++) o[k] = (x[k] - mx[k]) - fx[k];
        } else {
            for (int64_t k = 0; k < n; k++) o[k] = nd_expf(x[k] - mx[k]) * fx[k];
        }
        if (d->mode == ND_ROW_XENT_GRAD)
            for (int64_t i = 0; i < nr; i++) xent_label(c, r0 + i, x + i * cols, o + i * cols);
    }
}

ND_SIMD_CLONES static void apply_range(void *ctx, int64_t begin, int64_t end) {
    const apply_ctx *c = ctx;
    const nd_rows_desc *d = c->d;
    const int64_t cols = d->cols;
    if (cols <= SHORT_ROW && d->ldx == cols && d->ldo == cols) {
        apply_short(c, begin, end);
        return;
    }
    for (int64_t r = begin; r < end; r++) {
        const float *restrict x = d->x + r * d->ldx;
        float *restrict o = d->out + r * d->ldo;
        const float m = d->stats[2 * r], s = d->stats[2 * r + 1];
        switch (d->mode) {
        case ND_ROW_SOFTMAX: {
            const float inv = 1.0f / s;
            for (int64_t j = 0; j < cols; j++) o[j] = nd_expf(x[j] - m) * inv;
            break;
        }
        case ND_ROW_LOG_SOFTMAX: {
            const float ls = (float)log((double)s);
            for (int64_t j = 0; j < cols; j++) o[j] = (x[j] - m) - ls;
            break;
        }
        case ND_ROW_XENT_GRAD: {
            const float w = c->k / s;
            for (int64_t j = 0; j < cols; j++) o[j] = nd_expf(x[j] - m) * w;
            xent_label(c, r, x, o);
            break;
        }
        }
    }
}

nd_status nd_cpu_row_apply(const nd_rows_desc *d) {
    apply_ctx c = {d, 0.0f};
    if (d->mode == ND_ROW_XENT_GRAD) {
        double g = d->scale != NULL ? (double)d->scale[0] : 1.0;
        c.k = (float)(g / (double)(d->rows > 0 ? d->rows : 1));
    }
    nd_cpu_parallel_for(d->rows, row_grain(d->cols), apply_range, &c);
    return ND_OK;
}

/* ------------------------------------------------------------------ loss */

/* One thread, rows in order: the sum is the same bits every time, which
 * nd_array_softmax_xent_grad relies on to recognise a loss's statistics. */
nd_status nd_cpu_xent_loss(const nd_rows_desc *d) {
    if (d->rows == 0) {
        d->out[0] = NAN;
        return ND_OK;
    }
    double total = 0.0;
    for (int64_t r = 0; r < d->rows; r++) {
        const int64_t y = (int64_t)d->labels[r * d->label_stride];
        const double m = d->stats[2 * r], s = d->stats[2 * r + 1];
        total += (m - (double)d->x[r * d->ldx + y]) + log(s);
    }
    d->out[0] = (float)(total / (double)d->rows);
    return ND_OK;
}
