/* cpu_matmul_typed.c: the CPU backend's matmul in the dtypes other than
 * float32 (cpu_matmul.c dispatches here by nd_matmul_desc.dtype).
 *
 * float16 and bfloat16 run a micro-kernel on blocks of the output: bfloat16
 * the AMX kernel on pairs of its values (cpu_gemm_bf16.c) where the CPU has
 * one, else (and float16 always) needle's float32 GEMM kernel (cpu_gemm.h),
 * each block's rows of A and columns of B widened to float32 as they are
 * packed. A block accumulates in float32 over the whole inner dimension, and
 * each output is rounded once into the dtype as the block is stored (a linear
 * layer's bias added to the float32 sums first: nd_matmul_desc.bias). The
 * packed copies are a block's worth (at most a megabyte or so a thread,
 * mostly in cache), never an operand's, and the output is
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

/* The unit of work is a group of at most GROUP_M rows by a panel of at most
 * PANEL_N columns of one product, its sums kept in float32 (576 KiB) over
 * the whole inner dimension, which is taken BLOCK_K at a time: each block of
 * B is packed once per group (256 KiB, in L2) and serves all its rows, each
 * block of A is packed BLOCK_M rows at a time (96 KiB). BLOCK_M and GROUP_M
 * are multiples of every micro-kernel's rows (8, 6, 4), PANEL_N of its
 * columns. */
enum { BLOCK_M = 96, GROUP_M = 576, PANEL_N = 256, BLOCK_K = 256 };
/* Threads share the units when each gets at least this many multiply-adds
 * (a thread's start costs tens of microseconds). */
#define MADDS_PER_THREAD ((int64_t)1 << 22)

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

typedef void (*widen_fn)(float *dst, const uint16_t *src, int64_t stride, int64_t n);
typedef void (*narrow_fn)(uint16_t *dst, int64_t stride, const float *src, int64_t n);
typedef void (*slivers_fn)(float *dst, const uint16_t *src, int64_t rs, int64_t kc, int64_t cols,
                           int nr);

/* One narrow product, shared read-only by the threads running its units. */
typedef struct narrow_product {
    const nd_matmul_desc *d;
    const nd_gemm_ukernel *uk;
    const nd_gemm_pair_ukernel *pairs; /* bfloat16's pair kernel, or NULL: widen */
    int mr, nr;                        /* the kernel's tile */
    widen_fn widen;
    slivers_fn widen_slivers;
    narrow_fn narrow;
    void (*narrow_sum)(uint16_t *dst, const float *src, const float *add, int64_t n);
    int64_t groups, panels;                     /* units of one product of the batch */
    int64_t group_m, panel_n, block_m, block_k; /* clipped to the product's sizes */
    int64_t k_room;                             /* floats (or pairs) a packed row may take */
    atomic_int out_of_memory;                   /* a thread found no memory for its scratch */
} narrow_product;

/* A thread's scratch: A's block and B's block packed for the kernel (as
 * float32, or as bfloat16 pairs in the same space: a pair is a float's size
 * and there are half as many), a column of B being widened, the unit's sums,
 * the unit's columns of the bias widened. */
typedef struct unit_scratch {
    float *a, *b, *column, *c, *bias;
} unit_scratch;

/* How a packed A block is read: A(i, p) = a[i * rs + p * cs]. */
typedef struct packed_a {
    int64_t rs, cs;
} packed_a;

/* The pairs a packed row of kc values takes: padded to the pair kernel's
 * multiple with zeros. */
static int64_t row_pairs(const narrow_product *np, int64_t kc) {
    const int64_t multiple = np->pairs->pair_multiple;
    return ((kc + 1) / 2 + multiple - 1) / multiple * multiple;
}

/* A[0 : mi, 0 : kc] (from a) packed into s->a: as pairs for the pair
 * kernel; else widened, by rows where A's rows are read along, or (A stored
 * transposed) by columns, so each widening reads contiguous elements. */
static packed_a pack_a(const narrow_product *np, const uint16_t *a, int64_t mi, int64_t kc,
                       const unit_scratch *s) {
    const int64_t a_rs = np->d->a_row_stride, a_cs = np->d->a_col_stride;
    if (np->pairs != NULL) {
        const int64_t kp = row_pairs(np, kc);
        nd_cpu_pack_bf16_pairs_a((uint32_t *)(void *)s->a, a, a_rs, a_cs, mi, kc, kp);
        return (packed_a){kp, 1};
    }
    if (a_rs == 1 && a_cs != 1) {
        for (int64_t p = 0; p < kc; p++) np->widen(s->a + p * mi, a + p * a_cs, 1, mi);
        return (packed_a){1, mi};
    }
    for (int64_t i = 0; i < mi; i++) np->widen(s->a + i * kc, a + i * a_rs, a_cs, kc);
    return (packed_a){kc, 1};
}

/* B[0 : kc, 0 : nj] (from b) packed into s->b as the kernel's slivers of nr
 * columns: pairs (sliver q's pair row r at q*nr*kpairs + r*nr), or float32
 * (B(p, q*nr + j) at q*nr*kc + p*nr + j). B's rows are widened along; B
 * stored transposed a column at a time (contiguous), scattered into its
 * sliver. */
static void pack_b(const narrow_product *np, const uint16_t *b, int64_t kc, int64_t nj,
                   const unit_scratch *s) {
    const int64_t b_rs = np->d->b_row_stride, b_cs = np->d->b_col_stride;
    const int nr = np->nr;
    if (np->pairs == NULL && !(b_rs == 1 && b_cs != 1)) {
        np->widen_slivers(s->b, b, b_rs, kc, nj, nr);
        return;
    }
    for (int64_t jr = 0; jr < nj; jr += nr) {
        const int64_t cols = min_i64(nr, nj - jr);
        if (np->pairs != NULL) {
            const int64_t kp = row_pairs(np, kc);
            uint32_t *sliver = (uint32_t *)(void *)s->b + (jr / nr) * nr * kp;
            nd_cpu_pack_bf16_pairs_b(sliver, b + jr * b_cs, b_rs, b_cs, kc, cols, nr, kp);
            continue;
        }
        float *sliver = s->b + (jr / nr) * nr * kc;
        for (int64_t j = 0; j < cols; j++) {
            np->widen(s->column, b + (jr + j) * b_cs, 1, kc);
            for (int64_t p = 0; p < kc; p++) sliver[p * nr + j] = s->column[p];
        }
    }
}

/* c[0 : mi, 0 : nj] (+)= the packed blocks' product, tile by tile. */
static void multiply_blocks(const narrow_product *np, const unit_scratch *s, packed_a pa,
                            int64_t mi, int64_t kc, int64_t nj, float *c, int64_t ldc,
                            int accumulate) {
    const int mr = np->mr, nr = np->nr;
    for (int64_t jr = 0; jr < nj; jr += nr) {
        const int cols = (int)min_i64(nr, nj - jr);
        for (int64_t ir = 0; ir < mi; ir += mr) {
            const int rows = (int)min_i64(mr, mi - ir);
            if (np->pairs != NULL) {
                const int64_t kp = pa.rs;
                np->pairs->fn(kp, (const uint32_t *)(const void *)s->a + ir * kp, kp,
                              (const uint32_t *)(const void *)s->b + (jr / nr) * nr * kp,
                              c + ir * ldc + jr, ldc, rows, cols, accumulate);
            } else {
                np->uk->fn(kc, s->a + ir * pa.rs, pa.rs, pa.cs, s->b + (jr / nr) * nr * kc, nr,
                           c + ir * ldc + jr, ldc, rows, cols, 1.0f, accumulate);
            }
        }
    }
}

/* rows x nj finished sums (c, ldc apart), plus the bias where there is one,
 * rounded into out (rows n apart). */
static void store_rows(const narrow_product *np, const unit_scratch *s, float *c, int64_t ldc,
                       int64_t rows, int64_t nj, uint16_t *out) {
    const int64_t n = np->d->n;
    for (int64_t i = 0; i < rows; i++) {
        if (np->d->bias != NULL) np->narrow_sum(out + i * n, c + i * ldc, s->bias, nj);
        else np->narrow(out + i * n, 1, c + i * ldc, nj);
    }
}

/* Unit u of the batch: its sums over the whole inner dimension, each
 * rounded once into the output (with the bias added first). */
static void run_unit(const narrow_product *np, const unit_scratch *s, int64_t u) {
    const nd_matmul_desc *d = np->d;
    const int64_t m = d->m, n = d->n, k = d->k;
    const int64_t per_product = np->groups * np->panels;
    const int64_t batch = u / per_product, within = u % per_product;
    const int64_t i0 = within / np->panels * np->group_m, j0 = within % np->panels * np->panel_n;
    const int64_t mg = min_i64(np->group_m, m - i0), nj = min_i64(np->panel_n, n - j0);
    int64_t a_off, b_off;
    nd_matmul_batch_offsets(d, batch, &a_off, &b_off);
    const uint16_t *a = (const uint16_t *)(const void *)d->a + a_off + i0 * d->a_row_stride;
    const uint16_t *b = (const uint16_t *)(const void *)d->b + b_off + j0 * d->b_col_stride;
    uint16_t *out = (uint16_t *)(void *)d->out + batch * m * n + i0 * n + j0;
    const int64_t ldc = np->panel_n;
    if (d->bias != NULL)
        np->widen(s->bias, (const uint16_t *)(const void *)d->bias + j0 * d->bias_stride,
                  d->bias_stride, nj);
    if (k == 0) {
        for (int64_t i = 0; i < mg; i++) memset(s->c + i * ldc, 0, sizeof(float) * (size_t)nj);
        store_rows(np, s, s->c, ldc, mg, nj, out);
    }
    for (int64_t p0 = 0; p0 < k; p0 += np->block_k) {
        const int64_t kc = min_i64(np->block_k, k - p0);
        pack_b(np, b + p0 * d->b_row_stride, kc, nj, s);
        for (int64_t r0 = 0; r0 < mg; r0 += np->block_m) {
            const int64_t mi = min_i64(np->block_m, mg - r0);
            const packed_a pa =
                pack_a(np, a + r0 * d->a_row_stride + p0 * d->a_col_stride, mi, kc, s);
            multiply_blocks(np, s, pa, mi, kc, nj, s->c + r0 * ldc, ldc, p0 > 0);
            /* Rows whose sums are complete are stored while they are in cache. */
            if (p0 + kc == k) store_rows(np, s, s->c + r0 * ldc, ldc, mi, nj, out + r0 * n);
        }
    }
}

/* Units [begin, end), an nd_cpu_parallel_for body: one scratch for them all. */
static void run_units(void *ctx, int64_t begin, int64_t end) {
    narrow_product *np = ctx;
    const int64_t kc = np->k_room, mr = np->mr, nr = np->nr;
    const int64_t mb = (np->block_m + mr - 1) / mr * mr, nb = (np->panel_n + nr - 1) / nr * nr;
    const int64_t a_floats = mb * kc, b_floats = kc * nb, c_floats = np->group_m * np->panel_n;
    float *buf =
        malloc((size_t)(a_floats + b_floats + kc + c_floats + np->panel_n) * sizeof(float));
    if (buf == NULL) {
        atomic_store(&np->out_of_memory, 1);
        return;
    }
    float *column = buf + a_floats + b_floats, *c = column + kc;
    const unit_scratch s = {buf, buf + a_floats, column, c, c + c_floats};
    if (np->pairs != NULL) np->pairs->begin();
    for (int64_t u = begin; u < end; u++) run_unit(np, &s, u);
    if (np->pairs != NULL) np->pairs->end();
    free(buf);
}

const char *nd_cpu_gemm_narrow_kernel_name(nd_dtype dtype) {
    const nd_gemm_pair_ukernel *pairs = dtype == ND_BFLOAT16 ? nd_cpu_gemm_bf16_ukernel() : NULL;
    return pairs != NULL ? pairs->name : nd_cpu_gemm_kernel_name(nd_cpu_isa_current());
}

static nd_status matmul_narrow(const nd_matmul_desc *d, int64_t batches) {
    const nd_cpu_loops *loops = nd_cpu_loops_current();
    narrow_product np = {
        .d = d,
        .uk = nd_cpu_gemm_ukernel(nd_cpu_isa_current()),
        .pairs = d->dtype == ND_BFLOAT16 ? nd_cpu_gemm_bf16_ukernel() : NULL,
        .widen = d->dtype == ND_FLOAT16 ? loops->f16_to_float : loops->bf16_to_float,
        .widen_slivers =
            d->dtype == ND_FLOAT16 ? loops->f16_to_float_slivers : loops->bf16_to_float_slivers,
        .narrow = d->dtype == ND_FLOAT16 ? loops->float_to_f16 : loops->float_to_bf16,
        .narrow_sum = d->dtype == ND_FLOAT16 ? loops->float_sum_to_f16 : loops->float_sum_to_bf16,
        .group_m = min_i64(GROUP_M, d->m),
        .panel_n = min_i64(PANEL_N, d->n),
        .block_m = min_i64(BLOCK_M, d->m),
        .block_k = min_i64(BLOCK_K, d->k),
    };
    np.mr = np.pairs != NULL ? np.pairs->mr : np.uk->mr;
    np.nr = np.pairs != NULL ? np.pairs->nr : np.uk->nr;
    np.k_room = np.block_k > 0 ? np.block_k : 1;
    if (np.pairs != NULL && row_pairs(&np, np.block_k) > np.k_room)
        np.k_room = row_pairs(&np, np.block_k);
    np.groups = (d->m + np.group_m - 1) / np.group_m;
    np.panels = (d->n + np.panel_n - 1) / np.panel_n;
    atomic_init(&np.out_of_memory, 0);
    const int64_t unit_madds = np.group_m * np.panel_n * (d->k > 0 ? d->k : 1);
    nd_cpu_parallel_for(batches * np.groups * np.panels, 1 + MADDS_PER_THREAD / unit_madds,
                        run_units, &np);
    if (atomic_load(&np.out_of_memory))
        return nd_fail(ND_ERR_OOM, "no memory for the float32 blocks of a %s matmul",
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
