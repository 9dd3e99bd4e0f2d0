/* cpu_matmul_typed.c: the CPU backend's matmul in the dtypes other than
 * float32 (cpu_matmul.c dispatches here by nd_matmul_desc.dtype).
 *
 * float16 and bfloat16 widen their operands to float32 and run the float32
 * product (needle's GEMM or the BLAS, float32 accumulation), then round each
 * output once into the dtype: the accuracy the issue asks for, at float32's
 * speed plus two conversion passes. float64 runs its own blocked GEMM in
 * double, full precision (the BLAS loader installs only an sgemm).
 */
#include "cpu_gemm.h"
#include "cpu_loops.h"
#include "dtype_convert.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------- float16 / bfloat16 */

/* The span of elements an operand's view reaches, relative to its first
 * element: [*lo, *hi]. Every element in between lies in its storage. */
static void operand_span(const nd_matmul_desc *d, const int64_t *batch_strides, int64_t rows,
                         int64_t row_stride, int64_t cols, int64_t col_stride, int64_t *lo,
                         int64_t *hi) {
    int64_t low = 0, high = 0;
    for (int i = 0; i <= d->batch_ndim + 1; i++) {
        int64_t extent = i < d->batch_ndim ? d->batch_shape[i] : i == d->batch_ndim ? rows : cols;
        int64_t stride = i < d->batch_ndim    ? batch_strides[i]
                         : i == d->batch_ndim ? row_stride
                                              : col_stride;
        int64_t reach = (extent > 0 ? extent - 1 : 0) * stride;
        if (reach < 0) low += reach;
        else high += reach;
    }
    *lo = low;
    *hi = high;
}

/* A float32 copy of the operand's span (NULL without memory); *first: the
 * index of its first element in the copy, so the view's strides still hold. */
static float *widen_operand(const nd_matmul_desc *d, const void *src, const int64_t *batch_strides,
                            int64_t rows, int64_t row_stride, int64_t cols, int64_t col_stride,
                            int64_t *first) {
    int64_t lo, hi;
    operand_span(d, batch_strides, rows, row_stride, cols, col_stride, &lo, &hi);
    const int64_t count = hi - lo + 1;
    float *wide = malloc(sizeof(float) * (size_t)count);
    if (wide == NULL) return NULL;
    const uint16_t *narrow = (const uint16_t *)src + lo;
    if (d->dtype == ND_FLOAT16) nd_cpu_loops_current()->f16_to_float(wide, narrow, 1, count);
    else
        for (int64_t i = 0; i < count; i++) wide[i] = nd_bf16_to_float(narrow[i]);
    *first = -lo;
    return wide;
}

static nd_status matmul_narrow(const nd_matmul_desc *d, int64_t outputs) {
    int64_t a_first = 0, b_first = 0;
    float *a = widen_operand(d, d->a, d->a_batch_strides, d->m, d->a_row_stride, d->k,
                             d->a_col_stride, &a_first);
    float *b = widen_operand(d, d->b, d->b_batch_strides, d->k, d->b_row_stride, d->n,
                             d->b_col_stride, &b_first);
    float *out = malloc(sizeof(float) * (size_t)(outputs > 0 ? outputs : 1));
    nd_status st = ND_OK;
    if (a == NULL || b == NULL || out == NULL) {
        st = nd_fail(ND_ERR_OOM, "no memory for the float32 copies of a %s matmul",
                     nd_dtype_name(d->dtype));
    } else {
        nd_matmul_desc wide = *d;
        wide.dtype = ND_FLOAT32;
        wide.a = a + a_first;
        wide.b = b + b_first;
        wide.out = out;
        st = nd_cpu_matmul_float32(&wide);
        uint16_t *dst = (uint16_t *)(void *)d->out;
        if (st == ND_OK && d->dtype == ND_FLOAT16)
            for (int64_t i = 0; i < outputs; i++) dst[i] = nd_float_to_half(out[i]);
        else if (st == ND_OK)
            for (int64_t i = 0; i < outputs; i++) dst[i] = nd_float_to_bf16(out[i]);
    }
    free(a);
    free(b);
    free(out);
    return st;
}

/* ------------------------------------------------------------ float64 */

/* Blocks of B packed contiguous (KC x NC doubles: 256 KiB, L2-sized), so
 * the current ISA's block kernel (cpu_loops.inc) reads them at unit stride
 * whatever B's layout. */
enum { KC = 128, NC = 256 };

static void f64_gemm(const nd_matmul_desc *d, const double *a, const double *b, double *c,
                     double *pack) {
    const int64_t m = d->m, n = d->n, k = d->k;
    memset(c, 0, sizeof(double) * (size_t)(m * n));
    for (int64_t j0 = 0; j0 < n; j0 += NC) {
        const int64_t nc = n - j0 < NC ? n - j0 : NC;
        for (int64_t p0 = 0; p0 < k; p0 += KC) {
            const int64_t kc = k - p0 < KC ? k - p0 : KC;
            for (int64_t p = 0; p < kc; p++)
                for (int64_t j = 0; j < nc; j++)
                    pack[p * nc + j] = b[(p0 + p) * d->b_row_stride + (j0 + j) * d->b_col_stride];
            const nd_f64_block blk = {
                a + p0 * d->a_col_stride, d->a_row_stride, d->a_col_stride, pack, kc, nc, c + j0, n,
            };
            /* Rows in chunks of about 64K multiply-adds per thread. */
            const int64_t grain = 1 + 65536 / (kc * nc);
            nd_cpu_parallel_for(m, grain, nd_cpu_loops_current()->f64_block_rows, (void *)&blk);
        }
    }
}

static nd_status matmul_float64(const nd_matmul_desc *d, int64_t batches) {
    double *pack = malloc(sizeof(double) * KC * NC);
    if (pack == NULL) return nd_fail(ND_ERR_OOM, "no memory for a float64 matmul's packing");
    const double *a = (const double *)(const void *)d->a;
    const double *b = (const double *)(const void *)d->b;
    double *out = (double *)(void *)d->out;
    int64_t index[ND_MAX_DIMS] = {0};
    for (int64_t batch = 0; batch < batches; batch++) {
        int64_t a_off = 0, b_off = 0;
        for (int i = 0; i < d->batch_ndim; i++) {
            a_off += index[i] * d->a_batch_strides[i];
            b_off += index[i] * d->b_batch_strides[i];
        }
        f64_gemm(d, a + a_off, b + b_off, out + batch * d->m * d->n, pack);
        for (int i = d->batch_ndim - 1; i >= 0; i--) {
            if (++index[i] < d->batch_shape[i]) break;
            index[i] = 0;
        }
    }
    free(pack);
    return ND_OK;
}

nd_status nd_cpu_matmul_typed(const nd_matmul_desc *d) {
    int64_t batches = 1;
    for (int i = 0; i < d->batch_ndim; i++) batches *= d->batch_shape[i];
    const int64_t outputs = batches * d->m * d->n;
    if (outputs == 0) return ND_OK;
    switch (d->dtype) {
    case ND_FLOAT16:
    case ND_BFLOAT16: return matmul_narrow(d, outputs);
    case ND_FLOAT64: return matmul_float64(d, batches);
    default: return nd_backend_lacks_dtype("cpu", "matmul", d->dtype);
    }
}
