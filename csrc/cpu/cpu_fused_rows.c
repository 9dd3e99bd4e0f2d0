/* cpu_fused_rows.c: the host's kernels of the fused row operations (see
 * nd_norm_desc and nd_attn_desc in internal.h), split over threads
 * (cpu_parallel.c): the layer norm forward by rows and backward by chunks of
 * rows (then the chunks' column sums added in chunk order), and the
 * attention softmax forward and backward by rows.
 *
 * The layer norm's arithmetic follows the course's composition step by step
 * (the mean and the variance rounded to float32 before they are used, w * (x
 * - mean) divided by the standard deviation), with the row sums in double as
 * the host's reductions do, so the fused op agrees with LayerNorm1d's ops to
 * within a rounding or two. The backward computes in double (row_stats_double
 * says why) and rounds dx once. The attention softmax adds the causal mask as
 * the course does (x / divisor + -FLT_MAX) and takes its exponentials from
 * cpu_math.h; short rows (an attention row has as many elements as keys) go
 * in chunks transposed so that the loops run across rows and vectorise.
 */
#include "cpu_math.h"
#include "internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Fewer elements than this per thread are not worth a thread. */
#define GRAIN_ELEMENTS ((int64_t)1 << 15)

/* Row x's mean and standard deviation sqrt(var + eps) in double, for the
 * backward: dx is a difference of terms that cancel (for a row of three,
 * sum(xhat**4) is constant, and its gradient is eps's effect alone), so
 * float32 statistics and terms lose most of dx's digits there. */
static void row_stats_double(const float *x, int64_t cols, float eps, double *mean, double *std) {
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++) sum += x[j];
    const double m = sum / (double)cols;
    double squares = 0.0;
    for (int64_t j = 0; j < cols; j++) {
        const double c = x[j] - m;
        squares += c * c;
    }
    *mean = m;
    *std = sqrt(squares / (double)cols + eps);
}

static void forward_range(void *ctx, int64_t begin, int64_t end) {
    const nd_norm_desc *d = ctx;
    const int64_t cols = d->cols;
    for (int64_t r = begin; r < end; r++) {
        const float *x = d->x + r * cols; /* (cols,) */
        float *y = d->out + r * cols;     /* (cols,) */
        double m, s;
        row_stats_double(x, cols, d->eps, &m, &s);
        const double inv = 1.0 / s;
        for (int64_t j = 0; j < cols; j++) y[j] = (float)(d->w[j] * ((x[j] - m) * inv) + d->b[j]);
    }
}

/* Chunk k's rows: dx, and the chunk's sums of g * xhat and of g per column
 * into partials[k] (2, cols). dx is computed in double from the float32
 * inputs (row_stats_double says why) and rounded once. */
static void backward_range(void *ctx, int64_t begin, int64_t end) {
    const nd_norm_desc *d = ctx;
    const int64_t cols = d->cols;
    for (int64_t k = begin; k < end; k++) {
        float *pw = d->partials + k * 2 * cols, *pb = pw + cols; /* (cols,) each */
        memset(pw, 0, sizeof(float) * (size_t)(2 * cols));
        const int64_t r0 = k * d->chunk_rows;
        const int64_t r1 = r0 + d->chunk_rows < d->rows ? r0 + d->chunk_rows : d->rows;
        for (int64_t r = r0; r < r1; r++) {
            const float *x = d->x + r * cols, *g = d->g + r * cols; /* (cols,) each */
            float *dx = d->out + r * cols;                          /* (cols,) */
            double m, s;
            row_stats_double(x, cols, d->eps, &m, &s);
            const double inv = 1.0 / s;
            double gw_sum = 0.0, gwx_sum = 0.0;
            for (int64_t j = 0; j < cols; j++) {
                const double xhat = (x[j] - m) * inv, gw = (double)g[j] * d->w[j];
                gw_sum += gw;
                gwx_sum += gw * xhat;
                pw[j] += (float)(g[j] * xhat);
                pb[j] += g[j];
            }
            const double gw_mean = gw_sum / (double)cols, gwx_mean = gwx_sum / (double)cols;
            for (int64_t j = 0; j < cols; j++) {
                const double xhat = (x[j] - m) * inv;
                dx[j] = (float)(((double)g[j] * d->w[j] - gw_mean - xhat * gwx_mean) * inv);
            }
        }
    }
}

nd_status nd_cpu_layer_norm(const nd_norm_desc *d) {
    const int64_t grain = GRAIN_ELEMENTS / d->cols > 0 ? GRAIN_ELEMENTS / d->cols : 1;
    nd_cpu_parallel_for(d->rows, grain, forward_range, (void *)d);
    return ND_OK;
}

nd_status nd_cpu_layer_norm_grad(const nd_norm_desc *d) {
    const int64_t per_chunk = d->chunk_rows * d->cols;
    const int64_t grain = GRAIN_ELEMENTS / per_chunk > 0 ? GRAIN_ELEMENTS / per_chunk : 1;
    nd_cpu_parallel_for(d->chunks, grain, backward_range, (void *)d);
    for (int64_t j = 0; j < 2 * d->cols; j++) {
        double total = 0.0;
        for (int64_t k = 0; k < d->chunks; k++) total += d->partials[k * 2 * d->cols + j];
        if (j < d->cols) d->dw[j] = (float)total;
        else d->db[j - d->cols] = (float)total;
    }
    return ND_OK;
}

/* ------------------------------------------------------ attention softmax */

/* Rows of at most SHORT_ROW elements go in chunks of BLOCK elements' worth
 * of rows, transposed (column j of a chunk holds element j of every row). */
enum { SHORT_ROW = 64, BLOCK = 2048 };

/* How many leading keys row r sees: all, or up to its query's diagonal. */
static int64_t visible_keys(const nd_attn_desc *d, int64_t r) {
    return d->queries > 0 ? r % d->queries + d->cols - d->queries + 1 : d->cols;
}

/* Element j of row r's masked, scaled logits, as the course computes them. */
static float masked_logit(const nd_attn_desc *d, int64_t r, int64_t j, int64_t visible) {
    const float v = d->x[r * d->cols + j] / d->divisor;
    return j < visible ? v : v + -FLT_MAX;
}

/* exp(a), with a below -104 (where the float result is 0) given 0 by a
 * select: nd_expf's subnormal path, which a masked logit's -FLT_MAX takes, is
 * several times slower than its normal one. */
static inline float exp_or_zero(float a) {
    const int zero = a < -104.0f;
    return nd__self(zero, 0.0f, nd_expf(nd__self(zero, 0.0f, a))); /* selects: no branch */
}

/* Softmax of the n values in v (in place), written to out with stride. */
static void softmax_row(float *v, int64_t n, float *out) {
    float m = -FLT_MAX, s = 0.0f;
    for (int64_t j = 0; j < n; j++) m = v[j] > m ? v[j] : m;
    m = m < FLT_MAX ? m : FLT_MAX;
    for (int64_t j = 0; j < n; j++) {
        v[j] = exp_or_zero(v[j] - m);
        s += v[j];
    }
    const float inv = 1.0f / s;
    for (int64_t j = 0; j < n; j++) out[j] = v[j] * inv;
}

static void attention_forward_range(void *ctx, int64_t begin, int64_t end) {
    const nd_attn_desc *d = ctx;
    const int64_t cols = d->cols;
    float t[BLOCK], m[BLOCK], s[BLOCK];
    if (cols > SHORT_ROW) {
        for (int64_t r = begin; r < end; r++) {
            float *out = d->out + r * cols; /* (cols,), the logits first */
            const int64_t visible = visible_keys(d, r);
            for (int64_t j = 0; j < cols; j++) out[j] = masked_logit(d, r, j, visible);
            softmax_row(out, cols, out);
        }
        return;
    }
    const int64_t per = BLOCK / cols;
    for (int64_t r0 = begin; r0 < end; r0 += per) {
        const int64_t nr = end - r0 < per ? end - r0 : per;
        for (int64_t i = 0; i < nr; i++) {
            const int64_t visible = visible_keys(d, r0 + i);
            for (int64_t j = 0; j < cols; j++) t[j * nr + i] = masked_logit(d, r0 + i, j, visible);
            m[i] = -FLT_MAX;
            s[i] = 0.0f;
        }
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < nr; i++) m[i] = t[j * nr + i] > m[i] ? t[j * nr + i] : m[i];
        for (int64_t i = 0; i < nr; i++) m[i] = m[i] < FLT_MAX ? m[i] : FLT_MAX;
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < nr; i++) {
                t[j * nr + i] = exp_or_zero(t[j * nr + i] - m[i]);
                s[i] += t[j * nr + i];
            }
        for (int64_t i = 0; i < nr; i++) s[i] = 1.0f / s[i];
        for (int64_t i = 0; i < nr; i++)
            for (int64_t j = 0; j < cols; j++) d->out[(r0 + i) * cols + j] = t[j * nr + i] * s[i];
    }
}

static void attention_backward_range(void *ctx, int64_t begin, int64_t end) {
    const nd_attn_desc *d = ctx;
    const int64_t cols = d->cols;
    for (int64_t r = begin; r < end; r++) {
        const float *y = d->x + r * cols, *g = d->g + r * cols; /* (cols,) each */
        float *dx = d->out + r * cols;                          /* (cols,) */
        float dot = 0.0f;
        for (int64_t j = 0; j < cols; j++) dot += g[j] * y[j];
        for (int64_t j = 0; j < cols; j++) dx[j] = y[j] * (g[j] - dot) / d->divisor;
    }
}

nd_status nd_cpu_attention_softmax(const nd_attn_desc *d) {
    const int64_t grain = GRAIN_ELEMENTS / d->cols > 0 ? GRAIN_ELEMENTS / d->cols : 1;
    nd_cpu_parallel_for(d->rows, grain, attention_forward_range, (void *)d);
    return ND_OK;
}

nd_status nd_cpu_attention_softmax_grad(const nd_attn_desc *d) {
    const int64_t grain = GRAIN_ELEMENTS / d->cols > 0 ? GRAIN_ELEMENTS / d->cols : 1;
    nd_cpu_parallel_for(d->rows, grain, attention_backward_range, (void *)d);
    return ND_OK;
}
