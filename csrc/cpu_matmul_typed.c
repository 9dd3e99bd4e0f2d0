/* cpu_matmul_typed.c: the CPU backend's matmul in the dtypes other than
 * float32 (cpu_matmul.c dispatches here by nd_matmul_desc.dtype).
 *
 * float16 and bfloat16 run needle's GEMM micro-kernel (cpu_gemm.h) on tiles
 * of the output: each tile's rows of A and columns of B are widened to
 * float32 as they are packed, the tile accumulates in float32 over the
 * whole inner dimension, and each output is rounded once into the dtype as
 * the tile is stored. The float32 copies are a tile's worth (at most a few
 * hundred KiB a thread, in cache), never an operand's, and the output is
 * written once, in the narrow type: the accuracy the issue asks for, and
 * half float32's memory traffic on the products that are bound by it (the
 * vocabulary's Linear). float64 runs its own blocked GEMM in double, full
 * precision (the BLAS loader installs only an sgemm).
 */
#include "cpu_gemm.h"
#include "cpu_loops.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------- float16 / bfloat16 */

/* A tile of the output is TILE_M x TILE_N, its inner dimension taken
 * TILE_K at a time: the float32 copies of A's block (96 KiB), of B's
 * (256 KiB) and the tile's sums (96 KiB) stay in a core's L2. TILE_M is a
 * multiple of every micro-kernel's rows (8, 6, 4), TILE_N of its columns. */
enum { TILE_M = 96, TILE_N = 256, TILE_K = 256 };
/* Threads share the tiles when each gets at least this many multiply-adds
 * (a thread's start costs tens of microseconds). */
#define MADDS_PER_THREAD ((int64_t)1 << 22)

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

typedef void (*widen_fn)(float *dst, const uint16_t *src, int64_t stride, int64_t n);
typedef void (*narrow_fn)(uint16_t *dst, int64_t stride, const float *src, int64_t n);

/* One narrow product, shared read-only by the threads running its tiles. */
typedef struct narrow_product {
    const nd_matmul_desc *d;
    const nd_gemm_ukernel *uk;
    widen_fn widen;
    narrow_fn narrow;
    int64_t tiles_m, tiles_n;       /* tiles of one product of the batch */
    int64_t tile_m, tile_n, tile_k; /* the tile's sizes, clipped to the product's */
    atomic_int out_of_memory;       /* a thread found no memory for its scratch */
} narrow_product;

/* A thread's float32 scratch: A's block, B's block as the micro-kernel's
 * slivers (nr columns each, contiguous), a column of B being widened, the
 * tile's sums. */
typedef struct tile_scratch {
    float *a, *b, *column, *c;
} tile_scratch;

/* A[i0 : i0+mi, p0 : p0+kc] into s->a, returning its strides there: by rows
 * where A's rows are read along, else (A stored transposed) by columns, so
 * each widening reads contiguous elements. */
static void widen_a(const narrow_product *np, const uint16_t *a, int64_t mi, int64_t kc, float *dst,
                    int64_t *rs, int64_t *cs) {
    const int64_t a_rs = np->d->a_row_stride, a_cs = np->d->a_col_stride;
    if (a_rs == 1 && a_cs != 1) {
        for (int64_t p = 0; p < kc; p++) np->widen(dst + p * mi, a + p * a_cs, 1, mi);
        *rs = 1, *cs = mi;
        return;
    }
    for (int64_t i = 0; i < mi; i++) np->widen(dst + i * kc, a + i * a_rs, a_cs, kc);
    *rs = kc, *cs = 1;
}

/* B[p0 : p0+kc, j0 : j0+nj] into s->b as slivers of nr columns: sliver q
 * holds B(p, q*nr + j) at b[q*nr*kc + p*nr + j]. B stored transposed is
 * widened a column at a time (contiguous) and scattered into the sliver. */
static void widen_b(const narrow_product *np, const uint16_t *b, int64_t kc, int64_t nj,
                    const tile_scratch *s) {
    const int64_t b_rs = np->d->b_row_stride, b_cs = np->d->b_col_stride;
    const int nr = np->uk->nr;
    for (int64_t jr = 0; jr < nj; jr += nr) {
        const int64_t cols = min_i64(nr, nj - jr);
        float *sliver = s->b + (jr / nr) * nr * kc;
        if (b_rs == 1 && b_cs != 1) {
            for (int64_t j = 0; j < cols; j++) {
                np->widen(s->column, b + (jr + j) * b_cs, 1, kc);
                for (int64_t p = 0; p < kc; p++) sliver[p * nr + j] = s->column[p];
            }
        } else {
            for (int64_t p = 0; p < kc; p++)
                np->widen(sliver + p * nr, b + p * b_rs + jr * b_cs, b_cs, cols);
        }
    }
}

/* Tile t of the batch: its sums over the whole inner dimension, then each
 * rounded once into the output. */
static void run_tile(const narrow_product *np, const tile_scratch *s, int64_t t) {
    const nd_matmul_desc *d = np->d;
    const int64_t m = d->m, n = d->n, k = d->k;
    const int64_t per_product = np->tiles_m * np->tiles_n;
    const int64_t batch = t / per_product, within = t % per_product;
    const int64_t i0 = within / np->tiles_n * np->tile_m, j0 = within % np->tiles_n * np->tile_n;
    const int64_t mi = min_i64(np->tile_m, m - i0), nj = min_i64(np->tile_n, n - j0);
    int64_t a_off, b_off;
    nd_matmul_batch_offsets(d, batch, &a_off, &b_off);
    const uint16_t *a = (const uint16_t *)(const void *)d->a + a_off + i0 * d->a_row_stride;
    const uint16_t *b = (const uint16_t *)(const void *)d->b + b_off + j0 * d->b_col_stride;
    const int mr = np->uk->mr, nr = np->uk->nr;
    const int64_t ldc = np->tile_n;
    if (k == 0)
        for (int64_t i = 0; i < mi; i++) memset(s->c + i * ldc, 0, sizeof(float) * (size_t)nj);
    for (int64_t p0 = 0; p0 < k; p0 += np->tile_k) {
        const int64_t kc = min_i64(np->tile_k, k - p0);
        int64_t a_rs, a_cs;
        widen_a(np, a + p0 * d->a_col_stride, mi, kc, s->a, &a_rs, &a_cs);
        widen_b(np, b + p0 * d->b_row_stride, kc, nj, s);
        for (int64_t jr = 0; jr < nj; jr += nr) {
            const int cols = (int)min_i64(nr, nj - jr);
            const float *sliver = s->b + (jr / nr) * nr * kc;
            for (int64_t ir = 0; ir < mi; ir += mr)
                np->uk->fn(kc, s->a + ir * a_rs, a_rs, a_cs, sliver, nr, s->c + ir * ldc + jr, ldc,
                           (int)min_i64(mr, mi - ir), cols, 1.0f, p0 > 0);
        }
    }
    uint16_t *out = (uint16_t *)(void *)d->out + batch * m * n + i0 * n + j0;
    for (int64_t i = 0; i < mi; i++) np->narrow(out + i * n, 1, s->c + i * ldc, nj);
}

/* Tiles [begin, end), an nd_cpu_parallel_for body: one scratch for them all. */
static void run_tiles(void *ctx, int64_t begin, int64_t end) {
    narrow_product *np = ctx;
    const int64_t kc = np->tile_k > 0 ? np->tile_k : 1, nr = np->uk->nr;
    const int64_t nb = (np->tile_n + nr - 1) / nr * nr;
    const size_t floats = (size_t)(np->tile_m * kc + kc * nb + kc + np->tile_m * np->tile_n);
    float *buf = malloc(floats * sizeof(float));
    if (buf == NULL) {
        atomic_store(&np->out_of_memory, 1);
        return;
    }
    const tile_scratch s = {buf, buf + np->tile_m * kc, buf + np->tile_m * kc + kc * nb,
                            buf + np->tile_m * kc + kc * nb + kc};
    for (int64_t t = begin; t < end; t++) run_tile(np, &s, t);
    free(buf);
}

static nd_status matmul_narrow(const nd_matmul_desc *d, int64_t batches) {
    const nd_cpu_loops *loops = nd_cpu_loops_current();
    narrow_product np = {
        .d = d,
        .uk = nd_cpu_gemm_ukernel(nd_cpu_isa_current()),
        .widen = d->dtype == ND_FLOAT16 ? loops->f16_to_float : loops->bf16_to_float,
        .narrow = d->dtype == ND_FLOAT16 ? loops->float_to_f16 : loops->float_to_bf16,
        .tile_m = min_i64(TILE_M, d->m),
        .tile_n = min_i64(TILE_N, d->n),
        .tile_k = min_i64(TILE_K, d->k),
    };
    np.tiles_m = (d->m + np.tile_m - 1) / np.tile_m;
    np.tiles_n = (d->n + np.tile_n - 1) / np.tile_n;
    atomic_init(&np.out_of_memory, 0);
    const int64_t tile_madds = np.tile_m * np.tile_n * (d->k > 0 ? d->k : 1);
    nd_cpu_parallel_for(batches * np.tiles_m * np.tiles_n, 1 + MADDS_PER_THREAD / tile_madds,
                        run_tiles, &np);
    if (atomic_load(&np.out_of_memory))
        return nd_fail(ND_ERR_OOM, "no memory for the float32 tiles of a %s matmul",
                       nd_dtype_name(d->dtype));
    return ND_OK;
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
    for (int64_t batch = 0; batch < batches; batch++) {
        int64_t a_off, b_off;
        nd_matmul_batch_offsets(d, batch, &a_off, &b_off);
        f64_gemm(d, a + a_off, b + b_off, out + batch * d->m * d->n, pack);
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
