/* internal.h: the engine's private structures: devices, their backend
 * function tables and allocators, and storages.
 *
 * Only csrc/ (and csrc/cuda/) include this. The binding reaches these through
 * the accessors of engine.h. Like the rest of the engine: no Python.h.
 */
#ifndef NEEDLE_INTERNAL_H
#define NEEDLE_INTERNAL_H

#include "engine.h"

#include <stdarg.h>

/* An operand as a backend kernel sees it: data plus a layout already
 * broadcast to the output's shape, or a scalar (data == NULL). data points
 * at elements of the operation's dtype (float32 for copy); the scalar is
 * converted to the type the dtype computes in. */
typedef struct nd_kernel_operand {
    const void *data;
    const nd_layout *layout;
    double scalar;
} nd_kernel_operand;

/* A batched matmul, row-major: out[b] (m x n, contiguous) = a[b] @ b[b].
 * Batch dims are already broadcast (stride 0 where an operand is shared).
 * a's element (i, p) is at a + a_batch_offset + i*a_row_stride + p*a_col_stride,
 * where one of the two inner strides is 1 (the front end guarantees it). */
typedef struct nd_matmul_desc {
    int64_t m, n, k;
    int batch_ndim;
    int64_t batch_shape[ND_MAX_DIMS];
    int64_t a_batch_strides[ND_MAX_DIMS];
    int64_t b_batch_strides[ND_MAX_DIMS];
    const void *a;
    int64_t a_row_stride, a_col_stride;
    const void *b;
    int64_t b_row_stride, b_col_stride;
    void *out; /* (batch..., m, n) contiguous */
    /* The operands' and the product's dtype: a, b and out point at its
     * elements (float32, the zero value, when the describer says nothing). */
    nd_dtype dtype;
    /* A row of n elements of dtype (element j at bias + j*bias_stride) added
     * to every row of every product before it is stored, or NULL. Set only
     * where the backend's matmul_adds_bias says it adds it. */
    const void *bias;
    int64_t bias_stride;
} nd_matmul_desc;

/* A linear layer's three gradients from its output's gradient g (m x n), its
 * input x (m x k) and weight w (k x n), all row-major and compact, of one
 * dtype: gx = g @ w^T (m x k), gw = x^T @ g (k x n), gb = g's column sums
 * (n), each summed in float32 and rounded once. */
typedef struct nd_linear_grads_desc {
    int64_t m, k, n;
    nd_dtype dtype;
    const void *g, *x, *w; /* elements of dtype */
    void *gx, *gw, *gb;
} nd_linear_grads_desc;

/* What row_apply writes for element x at column j of row r (m, s: the row's
 * stats; y: its label; k: *scale / rows, or 1 / rows without a scale). */
typedef enum nd_row_mode {
    ND_ROW_SOFTMAX,     /* exp(x - m) / s                          */
    ND_ROW_LOG_SOFTMAX, /* (x - m) - log(s)                        */
    ND_ROW_XENT_GRAD    /* (exp(x - m) / s - [j == y]) * k         */
} nd_row_mode;

/* A batch of rows for the softmax kernels: row r of x is cols contiguous
 * floats at x + r*ldx (ldx may be 0 or negative). stats (rows, 2), contiguous:
 * each row's max m, clamped to finite values (so that a row of -inf gives
 * -inf and a +inf gives +inf rather than nan), and s = sum(exp(x - m)). The
 * front end (softmax.c) validates shapes, devices and labels, and allocates;
 * kernels take device pointers and never fail on valid input. */
typedef struct nd_rows_desc {
    int64_t rows, cols;
    const void *x; /* elements of dtype */
    int64_t ldx;
    float *stats; /* (rows, 2) */
    void *out;    /* elements of dtype; see each entry */
    int64_t ldo;  /* out's row stride (row_stats: between log-sum-exps) */
    nd_row_mode mode;
    const float *labels; /* (rows,) class ids as floats, stride label_stride */
    int64_t label_stride;
    const float *scale; /* ND_ROW_XENT_GRAD: one element (the out_grad), or NULL */
    /* ND_ROW_XENT_GRAD with stats taken from a kept loss: that loss's value and
     * the loss recomputed from stats, one element each (device memory). Where
     * the two differ in any bit the stats do not belong to these logits and
     * the backend computes each row's own; NULL: stats are trusted. Checked on
     * the device so that a GPU backward never waits to read them. */
    const float *kept_loss, *again_loss;
    /* x's and out's element type: float32, or float16/bfloat16 for the
     * cross-entropy (loss and gradient) on a backend that reads them (the CPU
     * and CUDA ones; a backend that does not answers ND_ERR_DTYPE and the
     * front end converts instead).
     * Statistics, labels, scale and losses are float32 always. */
    nd_dtype dtype;
} nd_rows_desc;

/* Rows for the layer-norm kernels (fused_rows.c validates and allocates):
 * row r of x is cols contiguous floats at x + r*cols, normalised as the
 * course's LayerNorm1d: mean and biased variance over the row, y = w * (x -
 * mean) / sqrt(var + eps) + b. The backward splits the rows into `chunks`
 * runs of chunk_rows rows (the last may be shorter); chunk k writes its sums
 * of g * xhat and of g per column into partials[k] (2, cols), and dw, db are
 * those summed over the chunks in chunk order, so every backend and every
 * run adds in the same order. */
typedef struct nd_norm_desc {
    int64_t rows, cols;
    float eps;
    const float *x; /* (rows, cols) */
    const float *w; /* (cols,) */
    const float *b; /* (cols,): the forward's bias */
    const float *g; /* (rows, cols): the backward's out_grad */
    float *out;     /* (rows, cols): y (forward) or dx (backward) */
    int64_t chunks, chunk_rows;
    float *partials; /* (chunks, 2, cols): the backward's per-chunk sums */
    float *dw, *db;  /* (cols,) each: the backward's weight and bias gradients */
} nd_norm_desc;

/* Rows for the attention softmax kernels (fused_rows.c validates and
 * allocates); row r of each array is cols contiguous floats at r*cols. The
 * forward writes out = softmax(x / divisor + mask) over each row, where the
 * mask, when queries > 0, is the course's causal mask: row r is query
 * i = r % queries of its (queries, cols) matrix, and keys j > i + cols -
 * queries get -FLT_MAX added (which leaves a row with no key visible
 * uniform, as the course's addition does). The backward reads the forward's
 * output y (in x) and the out_grad g and writes dx = y * (g - sum(g * y)) /
 * divisor. */
typedef struct nd_attn_desc {
    int64_t rows, cols;
    int64_t queries; /* causal: the query count of each matrix; 0: no mask */
    float divisor;
    const float *x; /* (rows, cols): the logits (forward) or the output y (backward) */
    const float *g; /* (rows, cols): the backward's out_grad */
    float *out;     /* (rows, cols) */
} nd_attn_desc;

/* Indices and labels are float32 holding integers: v is one when it is an
 * integer in [0, count). Compared in double: (float)count may round up past
 * the last valid one; the cast runs only on values in range. */
static inline int nd_index_ok(float v, int64_t count) {
    return (double)v >= 0.0 && (double)v < (double)count && (float)(int64_t)v == v;
}
/* The ND_ERR_INDEX of a bad index v, one message for every backend
 * (gather.c): what names it ("index", "label"), unit what count counts
 * ("rows", "classes"). */
nd_status nd_index_error(const char *what, float v, int64_t count, const char *unit);

/* The value a reduction starts from (and gives over an empty extent). */
static inline float nd_reduce_identity(nd_reduce_op op) {
    return op == ND_REDUCE_SUM ? 0.0f : op == ND_REDUCE_MAX ? -__builtin_inff() : __builtin_inff();
}

/* The fused optimizer updates' descriptors (optim_update.h). */
struct nd_adam_desc;
struct nd_sgd_desc;
struct nd_amp_unscale_desc; /* amp_unscale.h */

/* One LSTM time step over a batch for the backends (csrc/lstm.c drives
 * them), gate order i, f, g, o as PyTorch's. Every buffer is contiguous and
 * row-major; H is `hidden`, B is `batch`. Forward:
 *   pre = xw + hw (+ b_ih + b_hh);  i, f, o = sigmoid(pre_i, pre_f, pre_o),
 *   g = tanh(pre_g);  c' = f*c + i*g;  h' = o*tanh(c')
 * and saved (B, 5H) = i, f, g, o, tanh(c') for the backward. */
typedef struct nd_lstm_step_desc {
    int64_t batch, hidden;
    const float *xw;          /* (B, 4H): x @ w_ih                       */
    const float *hw;          /* (B, 4H): h @ w_hh, or NULL (h = 0)      */
    const float *b_ih, *b_hh; /* (4H,) each, or both NULL                */
    const float *c;           /* (B, H), or NULL (c = 0)                 */
    float *h_out, *c_out;     /* (B, H)                                  */
    float *h_copy;            /* (B, H): h' written again, or NULL       */
    float *saved;             /* (B, 5H)                                 */
} nd_lstm_step_desc;

/* The backward of one step: from saved (as the forward wrote it), the
 * previous cell state c and the gradients of h' (dh + dh2) and of c' (dc),
 * any of them NULL for zeros, it writes
 *   dgates (B, 4H) = dL/dpre, and dc_prev (B, H) = dL/dc (when not NULL).
 * dc_prev may be dc itself (each element is read before it is written). */
typedef struct nd_lstm_step_grad_desc {
    int64_t batch, hidden;
    const float *saved; /* (B, 5H)            */
    const float *c;     /* (B, H) or NULL     */
    const float *dh;    /* (B, H) or NULL     */
    const float *dh2;   /* (B, H) or NULL     */
    const float *dc;    /* (B, H) or NULL     */
    float *dgates;      /* (B, 4H)            */
    float *dc_prev;     /* (B, H) or NULL     */
} nd_lstm_step_grad_desc;

/* What a device kind must provide. Every kernel takes layouts in elements and
 * reports a status; none allocates device memory through nd_memory_alloc
 * (scratch comes from the backend's own raw_alloc, reserved but never
 * counted as allocated; a kernel that needs memory to start, such as the
 * CUDA matmul's cuBLAS workspace, may run nd_memory_retry and so a
 * collection). */
struct nd_live_storage; /* below, with nd_storage_live */

typedef struct nd_backend {
    const char *name;
    nd_status (*raw_alloc)(nd_device *dev, int64_t nbytes, void **out);
    void (*raw_free)(nd_device *dev, void *ptr, int64_t nbytes);
    /* Returns cached bytes to the system; returns how many. */
    int64_t (*release_cache)(nd_device *dev);
    /* dst[view] = src broadcast to dst's shape (src->layout has dst's shape). */
    nd_status (*copy)(const nd_layout *dst_layout, void *dst, nd_kernel_operand src);
    /* binary, unary and reduce: out and the array operands point at
     * elements of dtype, which they compute in (float16 and bfloat16 in
     * float32 registers); ND_ERR_DTYPE for a dtype the backend lacks. */
    nd_status (*binary)(nd_binary_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                        nd_kernel_operand a, nd_kernel_operand b);
    nd_status (*unary)(nd_unary_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                       const nd_layout *a_layout, const void *a);
    /* out has a's shape with stride 0 along the reduced axes; out's storage
     * is contiguous over the kept axes. a has at least one element; every
     * output is written (out's prior contents are not read). */
    nd_status (*reduce)(nd_reduce_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                        const nd_layout *a_layout, const void *a);
    nd_status (*matmul)(const nd_matmul_desc *desc);
    /* Whether matmul adds nd_matmul_desc.bias for dtype (else the front end
     * adds the bias to the stored product); NULL: for no dtype. */
    int (*matmul_adds_bias)(nd_dtype dtype);
    /* The one transfer pair: a strided view of elements of dtype to or from
     * a contiguous, row-major host buffer. */
    nd_status (*to_host)(const nd_layout *src_layout, const void *src, nd_dtype dtype, void *host);
    nd_status (*from_host)(const nd_layout *dst_layout, void *dst, nd_dtype dtype,
                           const void *host);
    /* Row r of out (n x d) = row idx[r] of table (rows x d); idx is 1-D (n).
     * Checks every index (integer, in [0, rows)) before writing: ND_ERR_INDEX. */
    nd_status (*gather_rows)(const nd_layout *out_layout, float *out, const nd_layout *table_layout,
                             const float *table, const nd_layout *idx_layout, const float *idx);
    /* Row idx[r] of out (rows x d) += row r of src (n x d), in index order, so
     * repeated indices accumulate; indices checked first, as for gather_rows. */
    nd_status (*scatter_add_rows)(const nd_layout *out_layout, float *out,
                                  const nd_layout *src_layout, const float *src,
                                  const nd_layout *idx_layout, const float *idx);
    /* Softmax rows (see nd_rows_desc): row_stats writes each row's (max,
     * sum) into stats (when set) and its log-sum-exp into out[r*ldo] (when
     * set); row_apply writes (rows, cols) into out by mode; xent_loss writes
     * the mean loss into out[0] from x, stats and labels (checked before). */
    nd_status (*row_stats)(const nd_rows_desc *d);
    nd_status (*row_apply)(const nd_rows_desc *d);
    nd_status (*xent_loss)(const nd_rows_desc *d);
    /* ND_OK when every idx (n,) is an integer in [0, count), else the
     * nd_index_error of the first that is not. */
    nd_status (*check_indices)(const nd_layout *idx_layout, const float *idx, int64_t count,
                               const char *what, const char *unit);
    /* out (n,) contiguous = elements 0..n-1 of a draw (philox.h); params
     * already checked by the front end (random.c); n > 0. */
    nd_status (*random)(const nd_random_params *params, int64_t n, float *out);
    /* The fused optimizer updates (optim_update.h): contiguous operands,
     * validated by optim_update.c; one kernel launch each on a GPU. */
    nd_status (*adam_update)(const struct nd_adam_desc *d);
    nd_status (*sgd_update)(const struct nd_sgd_desc *d);
    /* One LSTM step forward and backward (nd_lstm_step_desc,
     * nd_lstm_step_grad_desc): one kernel each. */
    nd_status (*lstm_step)(const nd_lstm_step_desc *d);
    nd_status (*lstm_step_grad)(const nd_lstm_step_grad_desc *d);
    /* The fused layer norm (see nd_norm_desc): layer_norm writes y into out;
     * layer_norm_grad writes dx into out, each chunk's column sums into
     * partials and their totals into dw and db. */
    nd_status (*layer_norm)(const nd_norm_desc *d);
    nd_status (*layer_norm_grad)(const nd_norm_desc *d);
    /* The fused attention softmax (see nd_attn_desc): writes out. */
    nd_status (*attention_softmax)(const nd_attn_desc *d);
    nd_status (*attention_softmax_grad)(const nd_attn_desc *d);
    /* ND_OK when the device can serve expandable_segments, else ND_ERR_VALUE
     * saying why; NULL: the backend has no such segments. */
    nd_status (*check_expandable)(nd_device *dev);
    /* dst[view] (dst_dtype) = src (src_dtype, its layout broadcast to dst's
     * shape) converted element by element, or = scalar when src is NULL;
     * any pair of dtypes, the same included. */
    nd_status (*convert)(const nd_layout *dst_layout, void *dst, nd_dtype dst_dtype,
                         const nd_layout *src_layout, const void *src, nd_dtype src_dtype,
                         double scalar);
    /* GradScaler's in-place unscale and inf/NaN check of one gradient
     * (amp_unscale.h): one pass, one kernel launch on a GPU. */
    nd_status (*amp_unscale)(const struct nd_amp_unscale_desc *d);
    /* Whether linear_grads computes a linear layer's gradients of this dtype
     * and size in one pass over g (else the front end composes them from
     * matmuls and a sum); NULL: never. */
    int (*fuses_linear_grads)(nd_dtype dtype, int64_t m, int64_t k, int64_t n);
    nd_status (*linear_grads)(const nd_linear_grads_desc *d);
    /* The device's block map (memory_blocks.c): the first cap of every
     * segment and block its allocator holds, in any order, into out; returns
     * how many there are. live (nlive, sorted by address) are the device's
     * live storages: a backend that keeps no map of its own blocks builds
     * them from it; one that does may report a storage's block as
     * ND_BLOCK_ENGINE, which nd_memory_blocks then marks as the storage's. */
    int64_t (*memory_blocks)(nd_device *dev, const struct nd_live_storage *live, int64_t nlive,
                             nd_memory_block *out, int64_t cap);
} nd_backend;

typedef struct nd_allocator {
    nd_memory_stats stats;
    nd_alloc_settings settings;
    /* A CUDA graph is being captured on the device: nothing may collect or
     * release the cache until it ends (nd_memory_begin_capture). */
    int capturing;
    int collection_deferred; /* a collection was asked for during the capture */
} nd_allocator;

struct nd_device {
    int id;
    nd_device_kind kind;
    int ordinal;
    int available;
    int64_t capacity;
    char name[32];
    const nd_backend *backend;
    nd_allocator alloc;
};

struct nd_storage {
    int64_t refcount;
    int64_t numel;
    nd_dtype dtype;
    void *data;
    nd_device *device;
    /* Non-NULL for memory another library owns (nd_storage_wrap): the last
     * release hands it back through release(release_ctx) instead of freeing. */
    void (*release)(void *ctx);
    void *release_ctx;
    /* The device's live allocator-owned storages, a list that
     * nd_memory_blocks walks (borrowed ones are not on it). */
    struct nd_storage *prev_live, *next_live;
};

/* The buffer as float32, for the kernels that compute in float32 alone (their
 * front ends convert other dtypes first, dtype_island.c, or refuse them,
 * nd_array_require_float32); NULL for a storage of another dtype, so that a
 * missing check faults instead of reading other bytes as floats. */
static inline float *nd_storage_f32(const nd_storage *s) {
    return s->dtype == ND_FLOAT32 ? (float *)s->data : NULL;
}

/* Element `offset` (in elements of the storage's dtype) of s. */
static inline void *nd_storage_at(const nd_storage *s, int64_t offset) {
    return (char *)s->data + offset * nd_dtype_size(s->dtype);
}

/* The iteration space of an elementwise kernel, shared by the backends: drops
 * size-1 dims, orders dims by decreasing |stride| of operand order_by (-1
 * keeps row-major order), and merges dims that every operand steps through as
 * one. layouts[op] == NULL marks a scalar (stride 0). nops is at most
 * ND_COALESCE_MAX_OPS. Returns the number of dims left (>= 1). */
#define ND_COALESCE_MAX_OPS 3
int nd_coalesce(int ndim, const int64_t *shape, int nops, const nd_layout *const *layouts,
                int order_by, int64_t *out_shape, int64_t out_strides[][ND_MAX_DIMS]);

/* ND_ERR_DEVICE (with both devices' names) unless a and b share a device
 * (array_ops.c). */
nd_status nd_same_device(const nd_array *a, const nd_array *b);

/* ND_ERR_DTYPE: the backend `backend` has no kernel of `what` for dtype. */
nd_status nd_backend_lacks_dtype(const char *backend, const char *what, nd_dtype dtype);

/* The float32 island of the fused operations (dtype_island.c): float32
 * copies of the operands that are not float32, held until released. */
#define ND_ISLAND_MAX 12
typedef struct nd_island {
    int count;
    nd_array copies[ND_ISLAND_MAX];
} nd_island;
/* 1 when one of the n arrays (NULL entries skipped) is not float32. */
int nd_island_needed(int n, const nd_array *const *arrays);
/* The promotion of the n arrays' dtypes (NULL entries skipped). */
nd_dtype nd_island_promoted(int n, const nd_array *const *arrays);
/* Points each non-float32 arrays[i] at a float32 copy held by is. */
nd_status nd_island_enter(nd_island *is, int n, const nd_array **arrays);
/* The same with copies of dtype for the arrays of another dtype. */
nd_status nd_island_enter_as(nd_island *is, int n, const nd_array **arrays, nd_dtype dtype);
void nd_island_release(nd_island *is);
/* Replaces the new array *out by its conversion to dtype (nothing when it
 * has that dtype or is empty); *out is released on failure. */
nd_status nd_island_leave(nd_array *out, nd_dtype dtype);
/* Writes an in-place result computed in the converted copy `wide` back into
 * dst (nothing when wide is dst itself). */
nd_status nd_island_write_back(const nd_array *dst, const nd_array *wide);

/* Records the message of a failure and returns its status. */
nd_status nd_fail(nd_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Allocator entry points used by storages. */
nd_status nd_memory_alloc(nd_device *dev, int64_t nbytes, void **out);
void nd_memory_free(nd_device *dev, void *ptr, int64_t nbytes);
/* Backends take and return device memory through these (limit checked here). */
nd_status nd_memory_reserve(nd_device *dev, int64_t nbytes);
void nd_memory_unreserve(nd_device *dev, int64_t nbytes);
/* Moves one of the fragmentation statistics by n (n < 0: a removal). */
void nd_memory_stat_update(nd_memory_stat *stat, int64_t n);
/* 1 when a block or segment of size bytes is oversize under dev's settings. */
int nd_memory_oversize(const nd_device *dev, int64_t size);

/* Reports an allocator event to the host when the device is traced
 * (memory_history.c); backends report their segments through it. The block
 * map (memory_blocks.c) reaches the blocks through the backend table. */
void nd_memory_trace(nd_device *dev, nd_memory_action action, const void *address, int64_t size);

/* A live storage's buffer, as nd_storage_live lists it. */
typedef struct nd_live_storage {
    uintptr_t address;
    int64_t nbytes;
} nd_live_storage;
/* Writes the first cap of the device's live allocator-owned storages with
 * bytes into out; returns how many there are (storage.c). */
int64_t nd_storage_live(const nd_device *dev, nd_live_storage *out, int64_t cap);

/* The out-of-memory ladder around any attempt to get device memory, also
 * memory a library takes outside the allocator (cuBLAS's workspace and
 * handle): attempt(ctx); while it returns ND_ERR_OOM, release the cache and
 * retry, then ask the host for a collection of `requested` bytes (unless one
 * is running in this thread), release the cache and retry once more. Returns
 * the last attempt's status and records nothing else: the caller decides
 * what a final ND_ERR_OOM means (nd_memory_alloc raises it). The collection
 * may run arbitrary host code, as any allocation may. */
typedef nd_status (*nd_attempt_fn)(void *ctx);
nd_status nd_memory_retry(nd_device *dev, int64_t requested, nd_attempt_fn attempt, void *ctx);

/* Registers a device at start-up; returns NULL when the table is full. */
nd_device *nd_device_register(nd_device_kind kind, int ordinal, const char *name,
                              const nd_backend *backend, int64_t capacity, int available);

extern const nd_backend nd_cpu_backend;

/* The CPU backend's memory (cpu_memory.c). */
nd_status nd_cpu_raw_alloc(nd_device *dev, int64_t nbytes, void **out);
void nd_cpu_raw_free(nd_device *dev, void *ptr, int64_t nbytes);
int64_t nd_cpu_release_cache(nd_device *dev);
/* Host blocks of this size and more are rounded to it and cached on free;
 * smaller ones go straight back to the C library (a "small" segment). */
#define ND_CPU_LARGE_BLOCK ((int64_t)2 << 20)
/* nd_backend.memory_blocks: each live storage's buffer and each cached block
 * is a segment of its own. */
int64_t nd_cpu_memory_blocks(nd_device *dev, const struct nd_live_storage *live, int64_t nlive,
                             nd_memory_block *out, int64_t cap);

#ifdef NEEDLE_WITH_CUDA
/* csrc/cuda: registers one device per GPU (none without a driver or GPU). */
int nd_cuda_register_devices(void);
/* Writes the first cap blocks of the GPU's caching allocator into out (the
 * allocated ones as ND_BLOCK_ENGINE, requested = size; nd_memory_blocks
 * tells the storages apart); returns how many there are. */
int64_t nd_cuda_blocks(nd_device *dev, nd_memory_block *out, int64_t cap);
#endif

/* The CPU's batched matmul (cpu_matmul.c), and the dtypes whose bias it
 * adds (float16 and bfloat16: before the product is rounded to them),
 * entries of nd_cpu_backend. */
nd_status nd_cpu_matmul(const nd_matmul_desc *desc);
int nd_cpu_matmul_adds_bias(nd_dtype dtype);

/* A linear layer's gradients in one pass (cpu_linear_grads.c): float16, and
 * bfloat16 where it is widened (no AMX), entries of nd_cpu_backend. */
int nd_cpu_fuses_linear_grads(nd_dtype dtype, int64_t m, int64_t k, int64_t n);
nd_status nd_cpu_linear_grads(const nd_linear_grads_desc *d);

/* The CPU's row-indexing kernels (cpu_gather.c), entries of nd_cpu_backend. */
nd_status nd_cpu_check_indices(const nd_layout *idx_layout, const float *idx, int64_t count,
                               const char *what, const char *unit);
nd_status nd_cpu_gather_rows(const nd_layout *out_layout, float *out, const nd_layout *table_layout,
                             const float *table, const nd_layout *idx_layout, const float *idx);
nd_status nd_cpu_scatter_add_rows(const nd_layout *out_layout, float *out,
                                  const nd_layout *src_layout, const float *src,
                                  const nd_layout *idx_layout, const float *idx);

/* The CPU's softmax row kernels (cpu_softmax.c), entries of nd_cpu_backend. */
nd_status nd_cpu_row_stats(const nd_rows_desc *d);
nd_status nd_cpu_row_apply(const nd_rows_desc *d);
nd_status nd_cpu_xent_loss(const nd_rows_desc *d);

/* The CPU's random fill (cpu_random.c), an entry of nd_cpu_backend. */
nd_status nd_cpu_random(const nd_random_params *params, int64_t n, float *out);

/* The CPU's fused row kernels (cpu_fused_rows.c), entries of nd_cpu_backend. */
nd_status nd_cpu_layer_norm(const nd_norm_desc *d);
nd_status nd_cpu_layer_norm_grad(const nd_norm_desc *d);
nd_status nd_cpu_attention_softmax(const nd_attn_desc *d);
nd_status nd_cpu_attention_softmax_grad(const nd_attn_desc *d);

/* Runs fn(ctx, begin, end) over [0, n) split into contiguous ranges, one per
 * thread (cpu_parallel.c), when each of them gets at least `grain` items;
 * the calling thread takes the first range. fn must not fail or touch engine
 * state (nd_fail included): it only computes. */
typedef void (*nd_range_fn)(void *ctx, int64_t begin, int64_t end);
void nd_cpu_parallel_for(int64_t n, int64_t grain, nd_range_fn fn, void *ctx);

/* The CPU's dtype conversions and raw host transfers (cpu_convert.c),
 * entries of nd_cpu_backend. */
nd_status nd_cpu_convert(const nd_layout *dst_layout, void *dst, nd_dtype dst_dtype,
                         const nd_layout *src_layout, const void *src, nd_dtype src_dtype,
                         double scalar);

/* The CPU's LSTM step kernels (cpu_lstm.c), entries of nd_cpu_backend. */
nd_status nd_cpu_lstm_step(const nd_lstm_step_desc *d);
nd_status nd_cpu_lstm_step_grad(const nd_lstm_step_grad_desc *d);

#endif /* NEEDLE_INTERNAL_H */
