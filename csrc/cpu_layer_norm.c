/* cpu_layer_norm.c: the host's layer-norm kernels (see nd_norm_desc in
 * internal.h): the forward by rows and the backward by chunks of rows, split
 * over threads (cpu_parallel.c), then the chunks' column sums added in chunk
 * order.
 *
 * The arithmetic follows the course's composition step by step (the mean
 * and the variance rounded to float32 before they are used, w * (x - mean)
 * divided by the standard deviation), with the row sums in double as the
 * host's reductions do, so the fused op agrees with LayerNorm1d's ops to
 * within a rounding or two.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

/* Fewer elements than this per thread are not worth a thread. */
#define GRAIN_ELEMENTS ((int64_t)1 << 15)

/* Row x's mean and standard deviation sqrt(var + eps), var biased. */
static void row_stats(const float *x, int64_t cols, float eps, float *mean, float *std) {
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++) sum += x[j];
    const float m = (float)sum / (float)cols;
    double squares = 0.0;
    for (int64_t j = 0; j < cols; j++) {
        const float c = x[j] - m;
        squares += c * c;
    }
    *mean = m;
    *std = sqrtf((float)squares / (float)cols + eps);
}

static void forward_range(void *ctx, int64_t begin, int64_t end) {
    const nd_norm_desc *d = ctx;
    const int64_t cols = d->cols;
    for (int64_t r = begin; r < end; r++) {
        const float *x = d->x + r * cols; /* (cols,) */
        float *y = d->out + r * cols;     /* (cols,) */
        float m, s;
        row_stats(x, cols, d->eps, &m, &s);
        for (int64_t j = 0; j < cols; j++) y[j] = d->w[j] * (x[j] - m) / s + d->b[j];
    }
}

/* Chunk k's rows: dx, and the chunk's sums of g * xhat and of g per column
 * into partials[k] (2, cols). */
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
            float m, s;
            row_stats(x, cols, d->eps, &m, &s);
            double gw_sum = 0.0, gwx_sum = 0.0;
            for (int64_t j = 0; j < cols; j++) {
                const float xhat = (x[j] - m) / s, gw = g[j] * d->w[j];
                gw_sum += gw;
                gwx_sum += gw * xhat;
                pw[j] += g[j] * xhat;
                pb[j] += g[j];
            }
            const float gw_mean = (float)(gw_sum / (double)cols);
            const float gwx_mean = (float)(gwx_sum / (double)cols);
            for (int64_t j = 0; j < cols; j++) {
                const float xhat = (x[j] - m) / s;
                dx[j] = (g[j] * d->w[j] - gw_mean - xhat * gwx_mean) / s;
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
