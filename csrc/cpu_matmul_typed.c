/* cpu_matmul_typed.c: the CPU backend's matmul in the dtypes other than
 * float32 (cpu_matmul.c dispatches here by nd_matmul_desc.dtype).
 *
 * float16 and bfloat16 widen blocks of their operands to float32 and run the
 * float32 product on them (needle's GEMM or the BLAS, float32 accumulation),
 * then round each output once into the dtype: the accuracy the issue asks
 * for, at float32's speed plus the conversions. float64 runs its own blocked GEMM in
 * double, full precision (the BLAS loader installs only an sgemm).
 */
#include "cpu_gemm.h"
#include "cpu_loops.h"
#include "dtype_convert.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------- float16 / bfloat16 */

/* The float32 copies of a narrow product are blocks of at most this many
 * floats each (A's rows, B's columns, the output's block: 4 MiB apiece),
 * host scratch outside the allocator's books like the GPU's cuBLAS
 * workspace, so their size is bounded whatever the operands' size. */
#define WIDE_BLOCK ((int64_t)1 << 20)

/* n elements of a narrow row at src, stride apart, into dst as float32. */
static void widen_row(nd_dtype dtype, float *dst, const uint16_t *src, int64_t stride, int64_t n) {
    if (dtype == ND_FLOAT16) {
        nd_cpu_loops_current()->f16_to_float(dst, src, stride, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = nd_bf16_to_float(src[i * stride]);
}

static void narrow_row_out(nd_dtype dtype, uint16_t *dst, const float *src, int64_t n) {
    if (dtype == ND_FLOAT16)
        for (int64_t i = 0; i < n; i++) dst[i] = nd_float_to_half(src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = nd_float_to_bf16(src[i]);
}

static int64_t clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Each batch's product in blocks of the output (mb rows x nb columns, the
 * full inner dimension each): the block's rows of A and columns of B
 * widened to float32, the float32 product (needle's GEMM or the BLAS,
 * float32 accumulation), each output rounded once into the dtype. */
static nd_status matmul_narrow(const nd_matmul_desc *d, int64_t batches) {
    const int64_t m = d->m, n = d->n, k = d->k;
    const int64_t mb = clamp(WIDE_BLOCK / (k > 0 ? k : 1), 1, m);
    const int64_t nb = clamp(WIDE_BLOCK / (k > mb ? k : mb), 1, n);
    float *a = malloc(sizeof(float) * (size_t)(mb * (k > 0 ? k : 1)));
    float *b = malloc(sizeof(float) * (size_t)((k > 0 ? k : 1) * nb));
    float *out = malloc(sizeof(float) * (size_t)(mb * nb));
    nd_status st = ND_OK;
    if (a == NULL || b == NULL || out == NULL)
        st = nd_fail(ND_ERR_OOM, "no memory for the float32 blocks of a %s matmul",
                     nd_dtype_name(d->dtype));
    const uint16_t *a0 = (const uint16_t *)(const void *)d->a;
    const uint16_t *b0 = (const uint16_t *)(const void *)d->b;
    uint16_t *o0 = (uint16_t *)(void *)d->out;
    int64_t index[ND_MAX_DIMS] = {0};
    for (int64_t batch = 0; batch < batches && st == ND_OK; batch++) {
        int64_t a_off = 0, b_off = 0;
        for (int i = 0; i < d->batch_ndim; i++) {
            a_off += index[i] * d->a_batch_strides[i];
            b_off += index[i] * d->b_batch_strides[i];
        }
        for (int64_t i0 = 0; i0 < m && st == ND_OK; i0 += mb) {
            const int64_t mi = m - i0 < mb ? m - i0 : mb;
            for (int64_t i = 0; i < mi; i++)
                widen_row(d->dtype, a + i * k, a0 + a_off + (i0 + i) * d->a_row_stride,
                          d->a_col_stride, k);
            for (int64_t j0 = 0; j0 < n && st == ND_OK; j0 += nb) {
                const int64_t nj = n - j0 < nb ? n - j0 : nb;
                for (int64_t p = 0; p < k; p++)
                    widen_row(d->dtype, b + p * nj,
                              b0 + b_off + p * d->b_row_stride + j0 * d->b_col_stride,
                              d->b_col_stride, nj);
                nd_matmul_desc block;
                memset(&block, 0, sizeof block);
                block.m = mi;
                block.n = nj;
                block.k = k;
                block.a = a;
                block.a_row_stride = k > 0 ? k : 1;
                block.a_col_stride = 1;
                block.b = b;
                block.b_row_stride = nj;
                block.b_col_stride = 1;
                block.out = out;
                block.dtype = ND_FLOAT32;
                if (k == 0) memset(out, 0, sizeof(float) * (size_t)(mi * nj));
                else st = nd_cpu_matmul_float32(&block);
                for (int64_t i = 0; i < mi && st == ND_OK; i++)
                    narrow_row_out(d->dtype, o0 + batch * m * n + (i0 + i) * n + j0, out + i * nj,
                                   nj);
            }
        }
        for (int i = d->batch_ndim - 1; i >= 0; i--) {
            if (++index[i] < d->batch_shape[i]) break;
            index[i] = 0;
        }
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
    case ND_BFLOAT16: return matmul_narrow(d, batches);
    case ND_FLOAT64: return matmul_float64(d, batches);
    default: return nd_backend_lacks_dtype("cpu", "matmul", d->dtype);
    }
}
