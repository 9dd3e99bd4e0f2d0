/* cpu_backend.c: the host backend: memory from the C heap, and the kernels
 * for copies (float32), elementwise ops and reductions (every dtype) over
 * strided views.
 *
 * Kernels receive layouts already broadcast to the iteration shape; they
 * never allocate through the allocator and fail on valid input only when
 * the C heap has no room for the accumulators of another dtype's reduction. The
 * inner loops they run over those views are the current ISA's
 * (cpu_loops.h); this file walks the views and picks the loop.
 */

#include "amp_unscale.h"
#include "cpu_loops.h"
#include "optim_update.h"

#include <stdlib.h>
#include <string.h>

/* Memory comes from cpu_memory.c (a cache of large blocks). */

/* -------------------------------------------------------------- copies */

/* A 2-D transpose copy in tiles, so that neither side walks memory with a
 * large stride for long (compact() of a transposed matrix). */
static void copy_transposed(const nd_iter *it, float *dst, const float *src) {
    enum { TILE = 32 };
    int64_t rows = it->shape[0], cols = it->shape[1];
    int64_t dr = it->strides[0][0], dc = it->strides[0][1];
    int64_t sr = it->strides[1][0], sc = it->strides[1][1];
    for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
        int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
            int64_t c1 = c0 + TILE < cols ? c0 + TILE : cols;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) dst[r * dr + c * dc] = src[r * sr + c * sc];
        }
    }
}

/* float32 only (the front end converts every other pair of dtypes). */
static nd_status cpu_copy(const nd_layout *dst_layout, void *dst, nd_kernel_operand src) {
    float scalar = (float)src.scalar;
    const nd_layout *layouts[2] = {dst_layout, src.data ? src.layout : NULL};
    nd_iter it;
    nd_iter_prepare(&it, dst_layout->shape, dst_layout->ndim, 2, layouts, 0);
    float *base[2] = {(float *)dst + dst_layout->offset,
                      src.data ? (float *)src.data + src.layout->offset : &scalar};
    if (it.ndim == 2 && it.strides[0][1] == 1 && it.strides[1][0] == 1 && it.shape[0] >= 16 &&
        it.shape[1] >= 16) {
        copy_transposed(&it, base[0], base[1]);
        return ND_OK;
    }
    nd_iter_run(&it, base, nd_cpu_loops_current()->copy, NULL);
    return ND_OK;
}

/* Host memory is this device's: a transfer is a copy of the view, through
 * the float32 copy kernels (threaded; tiled transposes), or for the other
 * dtypes one memcpy when the view is contiguous, else the converter's bit
 * moves. */
static nd_status cpu_to_host(const nd_layout *src_layout, const void *src, nd_dtype dtype,
                             void *host) {
    if (nd_layout_numel(src_layout) == 0) return ND_OK;
    if (dtype != ND_FLOAT32 && nd_layout_is_contiguous(src_layout)) {
        const int64_t size = nd_dtype_size(dtype);
        memcpy(host, (const char *)src + src_layout->offset * size,
               (size_t)(nd_layout_numel(src_layout) * size));
        return ND_OK;
    }
    nd_layout host_layout;
    nd_layout_contiguous(src_layout->ndim, src_layout->shape, &host_layout);
    if (dtype != ND_FLOAT32)
        return nd_cpu_convert(&host_layout, host, dtype, src_layout, src, dtype, 0.0);
    nd_kernel_operand op = {src, src_layout, 0.0};
    return cpu_copy(&host_layout, host, op);
}

static nd_status cpu_from_host(const nd_layout *dst_layout, void *dst, nd_dtype dtype,
                               const void *host) {
    if (nd_layout_numel(dst_layout) == 0) return ND_OK;
    if (dtype != ND_FLOAT32 && nd_layout_is_contiguous(dst_layout)) {
        const int64_t size = nd_dtype_size(dtype);
        memcpy((char *)dst + dst_layout->offset * size, host,
               (size_t)(nd_layout_numel(dst_layout) * size));
        return ND_OK;
    }
    nd_layout host_layout;
    nd_layout_contiguous(dst_layout->ndim, dst_layout->shape, &host_layout);
    if (dtype != ND_FLOAT32)
        return nd_cpu_convert(dst_layout, dst, dtype, &host_layout, host, dtype, 0.0);
    nd_kernel_operand op = {host, &host_layout, 0.0};
    return cpu_copy(dst_layout, dst, op);
}

/* -------------------------------------------------------- binary ops */

/* The other dtypes' elementwise ops: the same iteration with byte offsets.
 * Scalars go in as their compute type: a double for float64 (stored as the
 * element it is), a float in the context for the narrow types (rounding it
 * to 16 bits would change x * 0.1 from what float32 computes). */
static nd_status binary_typed(nd_inner_fn fn, nd_dtype dtype, const nd_layout *out_layout,
                              void *out, nd_kernel_operand a, nd_kernel_operand b) {
    const int64_t size = nd_dtype_size(dtype);
    const int64_t sizes[3] = {size, size, size};
    double wide[2] = {a.scalar, b.scalar};
    uint16_t narrow[2] = {0, 0}; /* unread: the loops take the context's */
    nd_ew_scalars scalars = {a.data == NULL, b.data == NULL, (float)a.scalar, (float)b.scalar};
    const int in_ctx = dtype != ND_FLOAT64;
    void *sa = in_ctx ? (void *)&narrow[0] : (void *)&wide[0];
    void *sb = in_ctx ? (void *)&narrow[1] : (void *)&wide[1];
    const nd_layout *layouts[3] = {out_layout, a.data ? a.layout : NULL, b.data ? b.layout : NULL};
    nd_iter it;
    nd_iter_prepare(&it, out_layout->shape, out_layout->ndim, 3, layouts, 0);
    void *base[3] = {(char *)out + out_layout->offset * size,
                     a.data ? (char *)a.data + a.layout->offset * size : sa,
                     b.data ? (char *)b.data + b.layout->offset * size : sb};
    nd_iter_run_sized(&it, base, sizes, fn,
                      in_ctx && (scalars.a_set || scalars.b_set) ? &scalars : NULL);
    return ND_OK;
}

static nd_status cpu_binary(nd_binary_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                            nd_kernel_operand a, nd_kernel_operand b) {
    if (dtype < 0 || dtype >= ND_DTYPE_COUNT)
        return nd_backend_lacks_dtype("cpu", "a binary op", dtype);
    const nd_cpu_loops *loops = nd_cpu_loops_current();
    nd_inner_fn fn = loops->binary[dtype][op];
    if (op == ND_POW && b.data == NULL) {
        nd_pow_form form = nd_pow_form_of((float)b.scalar);
        /* float64 keeps exponents that only round to an exact form's. */
        if (dtype == ND_FLOAT64 && (double)(float)b.scalar != b.scalar) form = ND_POW_GENERAL;
        fn = loops->pow_form[dtype][form];
        /* The exact forms' loops add 0*y to use y (cpu_loops.inc). */
        if (form != ND_POW_GENERAL) b.scalar = 0.0f;
    }
    if (dtype != ND_FLOAT32) return binary_typed(fn, dtype, out_layout, out, a, b);
    float sa = (float)a.scalar, sb = (float)b.scalar;
    const nd_layout *layouts[3] = {out_layout, a.data ? a.layout : NULL, b.data ? b.layout : NULL};
    nd_iter it;
    nd_iter_prepare(&it, out_layout->shape, out_layout->ndim, 3, layouts, 0);
    float *base[3] = {(float *)out + out_layout->offset,
                      a.data ? (float *)a.data + a.layout->offset : &sa,
                      b.data ? (float *)b.data + b.layout->offset : &sb};
    nd_iter_run(&it, base, fn, NULL);
    return ND_OK;
}

/* --------------------------------------------------------- unary ops */

static nd_status cpu_unary(nd_unary_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                           const nd_layout *a_layout, const void *a) {
    if (dtype < 0 || dtype >= ND_DTYPE_COUNT)
        return nd_backend_lacks_dtype("cpu", "a unary op", dtype);
    const nd_layout *layouts[2] = {out_layout, a_layout};
    nd_iter it;
    nd_iter_prepare(&it, out_layout->shape, out_layout->ndim, 2, layouts, 0);
    nd_inner_fn fn = nd_cpu_loops_current()->unary[dtype][op];
    if (dtype != ND_FLOAT32) {
        const int64_t size = nd_dtype_size(dtype), sizes[2] = {size, size};
        void *base[2] = {(char *)out + out_layout->offset * size,
                         (char *)(void *)a + a_layout->offset * size};
        nd_iter_run_sized(&it, base, sizes, fn, NULL);
        return ND_OK;
    }
    float *base[2] = {(float *)out + out_layout->offset, (float *)a + a_layout->offset};
    nd_iter_run(&it, base, fn, NULL);
    return ND_OK;
}

/* -------------------------------------------------------- reductions */

/* A sum whose output elements each get several inner rows (a reduced dim
 * outside the inner loop: column sums, or a walk in another order than the
 * output's) would round its running sums to float once per row; these sums
 * run in a double shadow of the output instead (one double per output
 * element, so at most SHADOW_MAX of them), then round once. Column sums (the
 * next-outer dim reduced, inner rows contiguous in both) add BLOCK rows in
 * float first, at the float loop's speed, then add that block into the
 * shadow: error near float64's at a few percent of the time. */
enum { SHADOW_MAX = 1 << 24, SUM_BLOCK = 32 };

static int64_t sum_shadow_size(const nd_iter *it) {
    int several = 0;
    int64_t extent = 1;
    for (int d = 0; d < it->ndim; d++) {
        if (d < it->ndim - 1 && it->strides[0][d] == 0 && it->shape[d] > 1) several = 1;
        if (it->strides[0][d] < 0) return 0;
        extent += (it->shape[d] - 1) * it->strides[0][d];
    }
    return several && extent <= SHADOW_MAX ? extent : 0;
}

/* One inner row of n elements into the shadow. */
static void sum_row_into(double *o, const float *x, int64_t n, int64_t so, int64_t sa) {
    if (so == 0 && sa == 1) {
        o[0] += nd_cpu_loops_current()->sum_contiguous(x, n);
    } else if (so == 0) {
        double t = 0.0;
        for (int64_t i = 0; i < n; i++) t += x[i * sa];
        o[0] += t;
    } else if (so == 1 && sa == 1) {
        nd_cpu_loops_current()->add_row_double(o, x, n);
    } else {
        for (int64_t i = 0; i < n; i++) o[i * so] += x[i * sa];
    }
}

/* 0, or -1 when the staging row cannot be allocated (nothing written). */
static int sum_into_shadow(const nd_iter *it, double *acc, const float *a) {
    int inner = it->ndim - 1, mid = inner - 1; /* mid: the dim just outside */
    int64_t n = it->shape[inner], so = it->strides[0][inner], sa = it->strides[1][inner];
    int64_t m = mid >= 0 ? it->shape[mid] : 1;
    int64_t so1 = mid >= 0 ? it->strides[0][mid] : 0, sa1 = mid >= 0 ? it->strides[1][mid] : 0;
    int columns = mid >= 0 && so1 == 0 && so == 1 && sa == 1 && m > 1;
    const nd_cpu_loops *loops = nd_cpu_loops_current();
    float *stage = columns ? malloc(sizeof(float) * (size_t)n) : NULL;
    if (columns && stage == NULL) return -1;
    int64_t index[ND_MAX_DIMS] = {0}, outer = 1;
    for (int d = 0; d < mid; d++) outer *= it->shape[d];
    for (int64_t k = 0; k < outer; k++) {
        int64_t off_o = 0, off_a = 0;
        for (int d = 0; d < mid; d++) {
            off_o += index[d] * it->strides[0][d];
            off_a += index[d] * it->strides[1][d];
        }
        double *o = acc + off_o;
        const float *x = a + off_a;
        if (columns) {
            for (int64_t j0 = 0; j0 < m; j0 += SUM_BLOCK) {
                int64_t j1 = j0 + SUM_BLOCK < m ? j0 + SUM_BLOCK : m;
                memcpy(stage, x + j0 * sa1, sizeof(float) * (size_t)n);
                for (int64_t j = j0 + 1; j < j1; j++) loops->add_row_float(stage, x + j * sa1, n);
                loops->add_row_double(o, stage, n);
            }
        } else {
            for (int64_t j = 0; j < m; j++) sum_row_into(o + j * so1, x + j * sa1, n, so, sa);
        }
        for (int d = mid - 1; d >= 0; d--) {
            if (++index[d] < it->shape[d]) break;
            index[d] = 0;
        }
    }
    free(stage);
    return 0;
}

/* The other dtypes' reductions: every output accumulates in a double
 * (float16 and bfloat16 rows in float32 lanes first, cpu_loops.inc) and is
 * rounded into the dtype once, at the end. */
static nd_status reduce_wide(nd_reduce_op op, nd_dtype dtype, const nd_layout *out_layout,
                             void *out, const nd_layout *a_layout, const void *a) {
    int64_t outputs = 1;
    for (int d = 0; d < out_layout->ndim; d++)
        if (out_layout->strides[d] != 0) outputs *= out_layout->shape[d];
    double *acc = malloc(sizeof(double) * (size_t)outputs);
    if (acc == NULL) return nd_fail(ND_ERR_OOM, "no memory for a reduction's accumulators");
    const double identity = nd_reduce_identity(op);
    for (int64_t i = 0; i < outputs; i++) acc[i] = identity;
    const nd_layout *layouts[2] = {out_layout, a_layout};
    nd_iter it;
    nd_iter_prepare(&it, a_layout->shape, a_layout->ndim, 2, layouts, 1);
    const int64_t size = nd_dtype_size(dtype), sizes[2] = {(int64_t)sizeof(double), size};
    void *base[2] = {acc, (char *)(void *)a + a_layout->offset * size};
    nd_iter_run_sized(&it, base, sizes, nd_cpu_loops_current()->reduce_wide[dtype][op], NULL);
    /* One rounding per output, as nd_cpu_convert rounds (through float32 for
     * the narrow types). */
    nd_layout acc_layout;
    nd_layout_contiguous(1, &outputs, &acc_layout);
    nd_status st = nd_cpu_convert(&acc_layout, (char *)out + out_layout->offset * size, dtype,
                                  &acc_layout, acc, ND_FLOAT64, 0.0);
    free(acc);
    return st;
}

static nd_status cpu_reduce(nd_reduce_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                            const nd_layout *a_layout, const void *a) {
    if (dtype < 0 || dtype >= ND_DTYPE_COUNT)
        return nd_backend_lacks_dtype("cpu", "a reduction", dtype);
    if (dtype != ND_FLOAT32) return reduce_wide(op, dtype, out_layout, out, a_layout, a);
    const nd_layout *layouts[2] = {out_layout, a_layout};
    nd_iter it;
    /* Walk in the input's memory order; the output is small or contiguous. */
    nd_iter_prepare(&it, a_layout->shape, a_layout->ndim, 2, layouts, 1);
    float *base[2] = {(float *)out + out_layout->offset, (float *)a + a_layout->offset};
    /* The loops combine into out, which the contract does not fill: start
     * every output (contiguous over the kept axes) at the identity. */
    int64_t outputs = 1;
    for (int d = 0; d < out_layout->ndim; d++)
        if (out_layout->strides[d] != 0) outputs *= out_layout->shape[d];
    const float identity = nd_reduce_identity(op);
    for (int64_t i = 0; i < outputs; i++) base[0][i] = identity;
    int64_t shadow_size = op == ND_REDUCE_SUM ? sum_shadow_size(&it) : 0;
    double *shadow = shadow_size > 0 ? calloc((size_t)shadow_size, sizeof(double)) : NULL;
    if (shadow == NULL) { /* one row per output, or no memory for the shadow */
        nd_iter_run(&it, base, nd_cpu_loops_current()->reduce[op], NULL);
        return ND_OK;
    }
    for (int64_t i = 0; i < shadow_size; i++) shadow[i] = base[0][i];
    if (sum_into_shadow(&it, shadow, base[1]) < 0) {
        nd_iter_run(&it, base, nd_cpu_loops_current()->reduce[op], NULL);
    } else {
        for (int64_t i = 0; i < shadow_size; i++) base[0][i] = (float)shadow[i];
    }
    free(shadow);
    return ND_OK;
}

const nd_backend nd_cpu_backend = {
    .name = "cpu",
    .raw_alloc = nd_cpu_raw_alloc,
    .raw_free = nd_cpu_raw_free,
    .release_cache = nd_cpu_release_cache,
    .copy = cpu_copy,
    .binary = cpu_binary,
    .unary = cpu_unary,
    .reduce = cpu_reduce,
    .matmul = nd_cpu_matmul,
    .matmul_adds_bias = nd_cpu_matmul_adds_bias,
    .to_host = cpu_to_host,
    .from_host = cpu_from_host,
    .gather_rows = nd_cpu_gather_rows,
    .scatter_add_rows = nd_cpu_scatter_add_rows,
    .row_stats = nd_cpu_row_stats,
    .row_apply = nd_cpu_row_apply,
    .xent_loss = nd_cpu_xent_loss,
    .check_indices = nd_cpu_check_indices,
    .random = nd_cpu_random,
    .adam_update = nd_cpu_adam_update,
    .sgd_update = nd_cpu_sgd_update,
    .lstm_step = nd_cpu_lstm_step,
    .lstm_step_grad = nd_cpu_lstm_step_grad,
    .layer_norm = nd_cpu_layer_norm,
    .layer_norm_grad = nd_cpu_layer_norm_grad,
    .attention_softmax = nd_cpu_attention_softmax,
    .attention_softmax_grad = nd_cpu_attention_softmax_grad,
    .convert = nd_cpu_convert,
    .amp_unscale = nd_cpu_amp_unscale,
    .fuses_linear_grads = nd_cpu_fuses_linear_grads,
    .linear_grads = nd_cpu_linear_grads,
    .memory_blocks = nd_cpu_memory_blocks,
};
