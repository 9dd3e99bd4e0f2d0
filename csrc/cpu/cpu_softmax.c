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

/* The row kernels read and write float32, float16 and bfloat16 rows (a
 * narrow block widened in L1 as it is reached: cpu_softmax_rows.inc). */
static nd_status check_row_dtype(const nd_rows_desc *d) {
    if (d->dtype == ND_FLOAT32 || d->dtype == ND_FLOAT16 || d->dtype == ND_BFLOAT16) return ND_OK;
    return nd_backend_lacks_dtype("cpu", "softmax rows", d->dtype);
}

/* Element j of row r of a narrow x (the loss's label logit). */
static float narrow_load(const nd_rows_desc *d, int64_t r, int64_t j) {
    const uint16_t h = ((const uint16_t *)(const void *)d->x)[r * d->ldx + j];
    return d->dtype == ND_FLOAT16 ? nd_half_to_float(h) : nd_bf16_to_float(h);
}

/* ------------------------------------------------------------ entries */

nd_status nd_cpu_row_stats(const nd_rows_desc *d) {
    nd_status status = check_row_dtype(d);
    if (status != ND_OK) return status;
    nd_cpu_parallel_for(d->rows, row_grain(d->cols), nd_cpu_loops_current()->row_stats, (void *)d);
    return ND_OK;
}

nd_status nd_cpu_row_apply(const nd_rows_desc *d) {
    nd_status status = check_row_dtype(d);
    if (status != ND_OK) return status;
    if (d->kept_loss != NULL && memcmp(d->kept_loss, d->again_loss, sizeof(float)) != 0) {
        /* The kept statistics are not these logits': this call's own. */
        nd_rows_desc own = *d;
        own.kept_loss = own.again_loss = NULL;
        own.out = NULL;
        own.stats = malloc((size_t)(d->rows > 0 ? d->rows : 1) * 2 * sizeof(float));
        if (own.stats == NULL) return nd_fail(ND_ERR_OOM, "out of host memory for row statistics");
        nd_cpu_row_stats(&own);
        own.out = d->out;
        status = nd_cpu_row_apply(&own);
        free(own.stats);
        return status;
    }
    nd_row_apply_ctx c = {d, 0.0f};
    if (d->mode == ND_ROW_XENT_GRAD) {
        double g = d->scale != NULL ? (double)d->scale[0] : 1.0;
        c.k = (float)(g / (double)(d->rows > 0 ? d->rows : 1));
    }
    nd_cpu_parallel_for(d->rows, row_grain(d->cols), nd_cpu_loops_current()->row_apply, &c);
    return ND_OK;
}

/* ------------------------------------------------------------------ loss */

/* One thread, rows in order: the sum is the same bits every time, which
 * nd_array_softmax_xent_grad relies on to recognise a loss's statistics. */
nd_status nd_cpu_xent_loss(const nd_rows_desc *d) {
    if (d->rows == 0) {
        ((float *)d->out)[0] = NAN;
        return ND_OK;
    }
    double total = 0.0;
    for (int64_t r = 0; r < d->rows; r++) {
        const int64_t y = (int64_t)d->labels[r * d->label_stride];
        const double m = d->stats[2 * r], s = d->stats[2 * r + 1];
        const double x = d->dtype == ND_FLOAT32 ? (double)((const float *)d->x)[r * d->ldx + y]
                                                : (double)narrow_load(d, r, y);
        total += (m - x) + log(s);
    }
    ((float *)d->out)[0] = (float)(total / (double)d->rows);
    return ND_OK;
}
