/* cpu_matmul.c: the CPU backend's batched matmul, and where it splits the
 * work between needle's GEMM (cpu_gemm.c) and the BLAS the host installed.
 *
 * Which is faster depends on the machine: the CPU (AVX-512 or not, Intel or
 * AMD), the BLAS build and its kernels, and how busy the cores are (OpenBLAS
 * runs threads). So the split is not a constant: the first product that could
 * go either way measures both on a few square sizes and keeps the smallest
 * size from which the BLAS wins (nd_cpu_gemm_calibrate); the host may also
 * set it (needle_c: NEEDLE_GEMM_SPLIT). Small products always stay here:
 * a BLAS call costs more than their arithmetic.
 */
#include "cpu_gemm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static nd_sgemm_fn installed_sgemm = NULL;

void nd_cpu_set_sgemm(nd_sgemm_fn fn) { installed_sgemm = fn; }
nd_sgemm_fn nd_cpu_get_sgemm(void) { return installed_sgemm; }

/* Products below this many multiply-adds never go to the BLAS, and never
 * start a calibration: on the machines measured, a BLAS call won nothing
 * below 64^3 (docs/benchmarks.md). */
#define CALIBRATE_FROM ((int64_t)64 * 64 * 64)
/* The split used when a calibration cannot run (no memory for its
 * matrices); the value measured on the development machine before. */
#define DEFAULT_SPLIT ((int64_t)256 * 256 * 256)
/* The square sizes measured, how many times each (median taken), and the
 * time the whole measurement may take: a BLAS whose threads wait for busy
 * cores can take tens of milliseconds a call (measured here: 32 ms for a
 * 96^3 product that takes 10 us on idle cores), and one such call ends it. */
static const int64_t calibration_sizes[ND_GEMM_CALIBRATION_MAX] = {64, 96, 128, 192, 256, 384, 512};
#define CALIBRATION_REPEATS 3
#define CALIBRATION_BUDGET_SECONDS 0.04

/* -1: measure at the first product that could go either way. */
static int64_t split = -1;
static nd_gemm_calibration last_calibration;

void nd_cpu_set_gemm_split(int64_t min_madds) { split = min_madds < 0 ? -1 : min_madds; }
int64_t nd_cpu_gemm_split(void) { return split; }
const nd_gemm_calibration *nd_cpu_gemm_last_calibration(void) { return &last_calibration; }

static double now_seconds(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return v[n / 2];
}

nd_status nd_cpu_gemm_calibrate(nd_gemm_calibration *report) {
    nd_gemm_calibration r;
    memset(&r, 0, sizeof r);
    r.split = -1;
    if (installed_sgemm == NULL)
        return nd_fail(ND_ERR_VALUE, "no BLAS is installed: needle's GEMM runs every product");
    const int64_t top = calibration_sizes[ND_GEMM_CALIBRATION_MAX - 1];
    float *buf = malloc((size_t)(3 * top * top) * sizeof(float));
    if (buf == NULL) return nd_fail(ND_ERR_OOM, "no memory for the GEMM calibration");
    float *a = buf, *b = buf + top * top, *c = buf + 2 * top * top;
    for (int64_t i = 0; i < 2 * top * top; i++) buf[i] = (float)((i * 7919) % 1024) / 1024.0f;
    /* The smallest size from which the BLAS won every size measured. Two
     * wins in a row end the measurement: larger sizes favour the BLAS more
     * (its threads), and each costs 8x the time of the one before. */
    int wins = 0;
    const double start = now_seconds();
    for (int s = 0; s < ND_GEMM_CALIBRATION_MAX && wins < 2 && !r.cut_short; s++) {
        const int64_t n = calibration_sizes[s];
        double t_needle[CALIBRATION_REPEATS], t_blas[CALIBRATION_REPEATS];
        /* One untimed call each (the BLAS starts its threads), then turns
         * taken alternately, so a change of load affects both. */
        nd_cpu_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        installed_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        int reps = 0;
        while (reps < CALIBRATION_REPEATS) {
            double t0 = now_seconds();
            nd_cpu_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            double t1 = now_seconds();
            installed_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            double t2 = now_seconds();
            t_needle[reps] = t1 - t0;
            t_blas[reps++] = t2 - t1;
            if (t2 - start > CALIBRATION_BUDGET_SECONDS) {
                r.cut_short = 1;
                break;
            }
        }
        r.size[s] = n;
        r.needle_seconds[s] = median(t_needle, reps);
        r.blas_seconds[s] = median(t_blas, reps);
        r.count = s + 1;
        if (r.blas_seconds[s] < r.needle_seconds[s]) {
            if (wins++ == 0) r.split = n * n * n;
        } else {
            wins = 0;
            r.split = -1;
        }
    }
    free(buf);
    if (r.split < 0) {
        /* The BLAS never won (or lost the last size). Measured in full, it
         * still takes products 8x the largest one, where its threads win on
         * every machine measured; cut short by a slow BLAS, it takes none
         * (nd_cpu_gemm_calibrate or the host can measure again). */
        r.split = r.cut_short ? INT64_MAX : 8 * top * top * top;
    }
    r.isa = nd_cpu_isa_current();
    r.measured = 1;
    split = r.split;
    last_calibration = r;
    if (report != NULL) *report = r;
    return ND_OK;
}

/* The split in force, measured now if it never was. */
static int64_t current_split(void) {
    if (split < 0 && nd_cpu_gemm_calibrate(NULL) != ND_OK) split = DEFAULT_SPLIT;
    return split;
}

nd_status nd_cpu_matmul(const nd_matmul_desc *d) {
    if (d->dtype != ND_FLOAT32) return nd_cpu_matmul_typed(d);
    return nd_cpu_matmul_float32(d);
}

/* The narrow products add it to their float32 sums as they round them
 * (cpu_matmul_typed.c): one rounding instead of two, and no second pass over
 * the output. */
int nd_cpu_matmul_adds_bias(nd_dtype dtype) { return dtype == ND_FLOAT16 || dtype == ND_BFLOAT16; }

nd_status nd_cpu_matmul_float32(const nd_matmul_desc *d) {
    const int64_t madds = d->m * d->n * d->k;
    if (installed_sgemm == NULL || madds < CALIBRATE_FROM || madds < current_split()) {
        nd_cpu_sgemm_batched(d);
        return ND_OK;
    }
    int64_t batches = 1;
    for (int i = 0; i < d->batch_ndim; i++) batches *= d->batch_shape[i];
    int trans_a = d->a_col_stride != 1, trans_b = d->b_col_stride != 1;
    int64_t lda = trans_a ? d->a_col_stride : d->a_row_stride;
    int64_t ldb = trans_b ? d->b_col_stride : d->b_row_stride;
    for (int64_t batch = 0; batch < batches; batch++) {
        int64_t a_off, b_off;
        nd_matmul_batch_offsets(d, batch, &a_off, &b_off);
        installed_sgemm(trans_a, trans_b, d->m, d->n, d->k, 1.0f, (const float *)d->a + a_off, lda,
                        (const float *)d->b + b_off, ldb, 0.0f,
                        (float *)d->out + batch * d->m * d->n, d->n);
    }
    return ND_OK;
}
