/* cpu_softmax.c: the host's softmax row operations (see nd_rows_desc in
 * internal.h): each row's statistics and the passes that use them, split by
 * rows over threads (cpu_parallel.c) and run by the current ISA's kernels
 * (cpu_softmax_rows.inc, in cpu_loops.h's table), and the cross-entropy loss
 * from the statistics.
 */
#include "cpu_loops.h"
#include "dtype_convert.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Fewer elements than this per thread are not worth a thread. */
#define GRAIN_ELEMENTS ((int64_t)1 << 16)

/* The grain of a parallel loop over rows of cols elements. */
static int64_t row_grain(int64_t cols) {
    return cols >= GRAIN_ELEMENTS ? 1 : GRAIN_ELEMENTS / (cols > 0 ? cols : 1);
}

/* ------------------------------------------------------ narrow rows */

/* float16/bfloat16 rows (the cross-entropy's logits and gradient) run the
 * float32 row kernels on float32 copies of a few rows at a time (NARROW_FLOATS
 * floats at most), each thread its own, so no float32 copy of the whole
 * batch is ever made. */
#define NARROW_FLOATS ((int64_t)1 << 15)

static float narrow_load(nd_dtype dtype, const void *row, int64_t j) {
    const uint16_t h = ((const uint16_t *)row)[j];
    return dtype == ND_FLOAT16 ? nd_half_to_float(h) : nd_bf16_to_float(h);
}

/* A narrow row into float32 and back, by the current ISA's loops. */
static void narrow_widen(const nd_cpu_loops *loops, nd_dtype dtype, const void *row, int64_t n,
                         float *out) {
    (dtype == ND_FLOAT16 ? loops->f16_to_float : loops->bf16_to_float)(out, row, 1, n);
}

static void narrow_store(const nd_cpu_loops *loops, nd_dtype dtype, const float *in, int64_t n,
                         void *row) {
    (dtype == ND_FLOAT16 ? loops->float_to_f16 : loops->float_to_bf16)(row, 1, in, n);
}

/* Row r of a narrow operand at base with row stride ld (elements). */
static const void *narrow_row(const float *base, int64_t ld, int64_t r) {
    return (const uint16_t *)(const void *)base + r * ld;
}

typedef struct narrow_job {
    const nd_rows_desc *d;
    float k;    /* row_apply's factor */
    int apply;  /* 0: statistics, 1: the elementwise pass */
    int failed; /* no memory for a thread's rows (set by any thread) */
} narrow_job;

static void narrow_range(void *ctx, int64_t begin, int64_t end) {
    narrow_job *job = ctx;
    const nd_rows_desc *d = job->d;
    const int64_t cols = d->cols;
    int64_t per = NARROW_FLOATS / (cols > 0 ? cols : 1);
    if (per < 1) per = 1;
    const int two = job->apply && d->out != NULL;
    float *x = malloc((size_t)(per * cols * (two ? 2 : 1)) * sizeof(float));
    if (x == NULL) {
        __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *o = two ? x + per * cols : NULL;
    const nd_cpu_loops *loops = nd_cpu_loops_current();
    for (int64_t r0 = begin; r0 < end; r0 += per) {
        const int64_t nr = end - r0 < per ? end - r0 : per;
        for (int64_t i = 0; i < nr; i++)
            narrow_widen(loops, d->dtype, narrow_row(d->x, d->ldx, r0 + i), cols, x + i * cols);
        nd_rows_desc part = *d;
        part.rows = nr;
        part.x = x;
        part.ldx = cols;
        part.dtype = ND_FLOAT32;
        part.stats = d->stats + 2 * r0;
        part.labels = d->labels != NULL ? d->labels + r0 * d->label_stride : NULL;
        if (!job->apply) {
            part.out = NULL; /* the cross-entropy needs no log-sum-exp rows */
            loops->row_stats(&part, 0, nr);
            continue;
        }
        part.out = o;
        part.ldo = cols;
        nd_row_apply_ctx c = {&part, job->k};
        loops->row_apply(&c, 0, nr);
        for (int64_t i = 0; i < nr; i++)
            narrow_store(loops, d->dtype, o + i * cols, cols,
                         (uint16_t *)(void *)d->out + (r0 + i) * d->ldo);
    }
    free(x);
}

static nd_status narrow_rows(const nd_rows_desc *d, int apply, float k) {
    if (d->dtype != ND_FLOAT16 && d->dtype != ND_BFLOAT16)
        return nd_backend_lacks_dtype("cpu", "softmax rows", d->dtype);
    narrow_job job = {d, k, apply, 0};
    nd_cpu_parallel_for(d->rows, row_grain(d->cols), narrow_range, &job);
    if (job.failed) return nd_fail(ND_ERR_OOM, "out of host memory for float32 rows");
    return ND_OK;
}

/* ------------------------------------------------------------ entries */

nd_status nd_cpu_row_stats(const nd_rows_desc *d) {
    if (d->dtype != ND_FLOAT32) return narrow_rows(d, 0, 0.0f);
    nd_cpu_parallel_for(d->rows, row_grain(d->cols), nd_cpu_loops_current()->row_stats, (void *)d);
    return ND_OK;
}

nd_status nd_cpu_row_apply(const nd_rows_desc *d) {
    if (d->kept_loss != NULL && memcmp(d->kept_loss, d->again_loss, sizeof(float)) != 0) {
        /* The kept statistics are not these logits': this call's own. */
        nd_rows_desc own = *d;
        own.kept_loss = own.again_loss = NULL;
        own.out = NULL;
        own.stats = malloc((size_t)(d->rows > 0 ? d->rows : 1) * 2 * sizeof(float));
        if (own.stats == NULL) return nd_fail(ND_ERR_OOM, "out of host memory for row statistics");
        nd_cpu_row_stats(&own);
        own.out = d->out;
        nd_status status = nd_cpu_row_apply(&own);
        free(own.stats);
        return status;
    }
    nd_row_apply_ctx c = {d, 0.0f};
    if (d->mode == ND_ROW_XENT_GRAD) {
        double g = d->scale != NULL ? (double)d->scale[0] : 1.0;
        c.k = (float)(g / (double)(d->rows > 0 ? d->rows : 1));
    }
    if (d->dtype != ND_FLOAT32) return narrow_rows(d, 1, c.k);
    nd_cpu_parallel_for(d->rows, row_grain(d->cols), nd_cpu_loops_current()->row_apply, &c);
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
        const double x = d->dtype == ND_FLOAT32
                             ? (double)d->x[r * d->ldx + y]
                             : (double)narrow_load(d->dtype, narrow_row(d->x, d->ldx, r), y);
        total += (m - x) + log(s);
    }
    d->out[0] = (float)(total / (double)d->rows);
    return ND_OK;
}
