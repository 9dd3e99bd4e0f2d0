/* cpu_linear_grads.c: a linear layer's three gradients (nd_linear_grads_desc)
 * from one pass over its output's gradient g, for the float16/bfloat16
 * products the CPU widens to float32 (nd_cpu_backend.linear_grads).
 *
 * Composed, they read g three times and widen it twice: g @ w^T packs g's
 * rows, x^T @ g packs its columns, and the bias' sum reads it again (the
 * course's vocabulary Linear: g is 5120 x 10000, 102 MB). Here each block
 * of g is widened once into a float32 block in L2 and serves all three: its
 * column sums (gb), x^T @ block (gw), block @ w^T (gx), through the
 * current ISA's GEMM micro-kernel (cpu_gemm.h), which reads both products'
 * operands where they lie.
 *
 * The columns are split into chunks of CHUNK, the unit of work. A chunk owns
 * its columns of gw and gb (summed over the rows in order) and writes its
 * own share of gx (float32, m x k); the shares are added in chunk order and
 * rounded once. The chunks depend on n only, so the result is the same bits
 * on any number of threads.
 */
#include "cpu_gemm.h"
#include "cpu_loops.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A block of g is ROWS x PANEL (256 KiB widened, in L2), its rows PAD floats
 * further apart than PANEL so that a column of them spreads over L1's sets. */
enum { ROWS = 256, PANEL = 256, PAD = 16, CHUNK = 512 };
/* Rows of g are far apart (a row of the course's logits is 20 KB): the one
 * AHEAD rows on is prefetched while a row is widened. */
enum { AHEAD = 8 };

typedef void (*widen_fn)(float *dst, const uint16_t *src, int64_t stride, int64_t n);
typedef void (*narrow_fn)(uint16_t *dst, int64_t stride, const float *src, int64_t n);

typedef struct linear_job {
    const nd_linear_grads_desc *d;
    const nd_gemm_ukernel *uk;
    widen_fn widen;
    narrow_fn narrow;
    const float *xf; /* x widened (m x k) */
    float *shares;   /* chunks x (m x k): each chunk's share of gx */
    int64_t chunks;
    atomic_int out_of_memory;
} linear_job;

static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t chunk_count(int64_t n) { return (n + CHUNK - 1) / CHUNK; }

int nd_cpu_linear_grads_in_one_pass(nd_dtype dtype) {
    /* bfloat16 with AMX multiplies pairs of its values (cpu_gemm_bf16.c),
     * which this pass, on float32 blocks, would give up. */
    return dtype == ND_FLOAT16 || (dtype == ND_BFLOAT16 && nd_cpu_gemm_bf16_ukernel() == NULL);
}

int nd_cpu_fuses_linear_grads(nd_dtype dtype, int64_t m, int64_t k, int64_t n) {
    if (!nd_cpu_linear_grads_in_one_pass(dtype) || m <= 0 || k <= 0 || n <= 0) return 0;
    /* The float32 scratch (x widened, the chunks' shares of gx) is at most a
     * quarter of g's bytes: a layer with a wide input is composed instead. */
    const double scratch = (double)(chunk_count(n) + 1) * (double)m * (double)k * sizeof(float);
    return scratch <= (double)m * (double)n * 2.0 / 4.0;
}

/* Rows [i0, i0 + mi) of g's columns [j0, j0 + nj) widened into block (rows
 * ld apart), each row added into the columns' sums as it is widened. */
static void widen_block(const linear_job *job, int64_t i0, int64_t mi, int64_t j0, int64_t nj,
                        float *block, int64_t ld, float *col_sums) {
    const int64_t n = job->d->n;
    const uint16_t *g = (const uint16_t *)(const void *)job->d->g + i0 * n + j0;
    for (int64_t i = 0; i < mi; i++) {
        if (i + AHEAD < mi)
            for (int64_t j = 0; j < nj; j += 32) __builtin_prefetch(g + (i + AHEAD) * n + j);
        float *row = block + i * ld;
        job->widen(row, g + i * n, 1, nj);
        for (int64_t j = 0; j < nj; j++) col_sums[j] += row[j];
    }
}

/* C[0:rows, 0:cols] (+)= A @ B over kc, tile by tile (the operands as the
 * micro-kernel reads them: cpu_gemm.h). */
static void multiply(const nd_gemm_ukernel *uk, int64_t rows, int64_t cols, int64_t kc,
                     const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs,
                     float *c, int64_t ldc, int accumulate) {
    for (int64_t j = 0; j < cols; j += uk->nr)
        for (int64_t i = 0; i < rows; i += uk->mr)
            uk->fn(kc, a + i * a_rs, a_rs, a_cs, b + j, b_rs, c + i * ldc + j, ldc,
                   (int)min_i64(uk->mr, rows - i), (int)min_i64(uk->nr, cols - j), 1.0f,
                   accumulate);
}

/* Chunks [begin, end): an nd_cpu_parallel_for body. */
static void run_chunks(void *ctx, int64_t begin, int64_t end) {
    linear_job *job = ctx;
    const nd_linear_grads_desc *d = job->d;
    const int64_t m = d->m, k = d->k, n = d->n, ld = PANEL + PAD;
    /* A block of g widened; the panel's w^T (PANEL x k) and a row of w; the
     * panel's gw sums (k x PANEL) and gb sums. */
    const size_t floats = (size_t)(ROWS * ld + PANEL * k + PANEL + k * PANEL + PANEL);
    float *buf = malloc(floats * sizeof(float));
    if (buf == NULL) {
        atomic_store(&job->out_of_memory, 1);
        return;
    }
    float *block = buf, *wt = block + ROWS * ld, *w_row = wt + PANEL * k;
    float *gw_sums = w_row + PANEL, *gb_sums = gw_sums + k * PANEL;
    const uint16_t *w = (const uint16_t *)(const void *)d->w;
    for (int64_t c = begin; c < end; c++) {
        float *share = job->shares + c * m * k;
        const int64_t c0 = c * CHUNK, c1 = min_i64(n, c0 + CHUNK);
        for (int64_t j0 = c0; j0 < c1; j0 += PANEL) {
            const int64_t nj = min_i64(PANEL, c1 - j0);
            for (int64_t q = 0; q < k; q++) { /* wt[j * k + q] = w[q, j0 + j] */
                job->widen(w_row, w + q * n + j0, 1, nj);
                for (int64_t j = 0; j < nj; j++) wt[j * k + q] = w_row[j];
            }
            memset(gb_sums, 0, sizeof(float) * (size_t)nj);
            for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
                const int64_t mi = min_i64(ROWS, m - i0);
                widen_block(job, i0, mi, j0, nj, block, ld, gb_sums);
                /* gx's share: rows [i0, i0 + mi) (+)= block @ w^T */
                multiply(job->uk, mi, k, nj, block, ld, 1, wt, k, share + i0 * k, k, j0 > c0);
                /* gw's columns [j0, j0 + nj) (+)= x[i0 : i0 + mi]^T @ block */
                multiply(job->uk, k, nj, mi, job->xf + i0 * k, 1, k, block, ld, gw_sums, PANEL,
                         i0 > 0);
            }
            uint16_t *gw = (uint16_t *)(void *)d->gw + j0;
            for (int64_t q = 0; q < k; q++) job->narrow(gw + q * n, 1, gw_sums + q * PANEL, nj);
            job->narrow((uint16_t *)(void *)d->gb + j0, 1, gb_sums, nj);
        }
    }
    free(buf);
}

/* Rows [begin, end) of gx: the chunks' shares added in chunk order (into the
 * first's) and rounded once. */
static void finish_gx(void *ctx, int64_t begin, int64_t end) {
    const linear_job *job = ctx;
    const int64_t m = job->d->m, k = job->d->k;
    for (int64_t i = begin; i < end; i++) {
        float *sum = job->shares + i * k;
        for (int64_t c = 1; c < job->chunks; c++) {
            const float *share = job->shares + c * m * k + i * k;
            for (int64_t q = 0; q < k; q++) sum[q] += share[q];
        }
        job->narrow((uint16_t *)(void *)job->d->gx + i * k, 1, sum, k);
    }
}

nd_status nd_cpu_linear_grads(const nd_linear_grads_desc *d) {
    if (!nd_cpu_fuses_linear_grads(d->dtype, d->m, d->k, d->n))
        return nd_fail(ND_ERR_INTERNAL, "cpu: no one-pass linear gradients of %s %lldx%lldx%lld",
                       nd_dtype_name(d->dtype), (long long)d->m, (long long)d->k, (long long)d->n);
    const nd_cpu_loops *loops = nd_cpu_loops_current();
    const int64_t m = d->m, k = d->k, chunks = chunk_count(d->n);
    linear_job job = {
        .d = d,
        .uk = nd_cpu_gemm_ukernel(nd_cpu_isa_current()),
        .widen = d->dtype == ND_FLOAT16 ? loops->f16_to_float : loops->bf16_to_float,
        .narrow = d->dtype == ND_FLOAT16 ? loops->float_to_f16 : loops->float_to_bf16,
        .chunks = chunks,
    };
    atomic_init(&job.out_of_memory, 0);
    float *xf = malloc((size_t)((chunks + 1) * m * k) * sizeof(float));
    if (xf == NULL) return nd_fail(ND_ERR_OOM, "no host memory for a linear layer's gradients");
    job.xf = xf;
    job.shares = xf + m * k;
    job.widen(xf, (const uint16_t *)(const void *)d->x, 1, m * k);
    nd_cpu_parallel_for(chunks, 1, run_chunks, &job);
    if (!atomic_load(&job.out_of_memory))
        nd_cpu_parallel_for(m, 1 + ((int64_t)1 << 14) / (chunks * k), finish_gx, &job);
    free(xf);
    if (atomic_load(&job.out_of_memory))
        return nd_fail(ND_ERR_OOM, "no host memory for a linear layer's gradient blocks");
    return ND_OK;
}
