/* engine.h: the public interface of needle's array engine.
 *
 * The engine owns devices, the per-device allocator (accounting, limits, the
 * collection callback), refcounted storages and strided arrays of one
 * element type (nd_dtype) each, and runs operations on them through a
 * per-device backend table.
 *
 * It must not include Python.h, call Python, print, exit or abort: every
 * function reports an nd_status and, on failure, leaves a message that
 * nd_last_error() returns. The caller serialises all calls (needle_c holds
 * the GIL), so the engine keeps no locks.
 *
 * Strides and offsets are counted in elements, never in bytes.
 */
#ifndef NEEDLE_ENGINE_H
#define NEEDLE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "ewise_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ND_MAX_DIMS 16

/* The device table's size, which sizes every per-device array in every
 * layer (needle_c exports it as needle_c.MAX_DEVICES): up to
 * ND_MAX_HOST_DEVICES host devices, then up to ND_MAX_CUDA_DEVICES GPUs. */
#define ND_MAX_HOST_DEVICES 4
#define ND_MAX_CUDA_DEVICES 16
#define ND_MAX_DEVICES (ND_MAX_HOST_DEVICES + ND_MAX_CUDA_DEVICES)

typedef enum nd_status {
    ND_OK = 0,
    ND_ERR_SHAPE,        /* incompatible or invalid shapes        -> ValueError   */
    ND_ERR_AXIS,         /* axis out of range or repeated         -> ValueError   */
    ND_ERR_INDEX,        /* index out of range, too many indices  -> IndexError   */
    ND_ERR_VALUE,        /* any other bad argument value          -> ValueError   */
    ND_ERR_NOT_VIEWABLE, /* a view is impossible; the caller may copy instead      */
    ND_ERR_DEVICE,       /* mixing devices, device unavailable    -> DeviceError  */
    ND_ERR_OOM,          /* allocation refused after the retries  -> OutOfMemoryError */
    ND_ERR_BACKEND,      /* a backend (CUDA) call failed          -> DeviceError  */
    ND_ERR_INTERNAL,     /* a bug in the engine                   -> RuntimeError */
    ND_ERR_DTYPE         /* an operation given a dtype it lacks   -> TypeError    */
} nd_status;

/* The message of the last failure on this thread (never NULL). */
const char *nd_last_error(void);

/* ------------------------------------------------------------------- dtypes */

/* The element types of a storage. float32 is the default and the one every
 * operation computes in; the others are storage formats: float16 (IEEE
 * binary16) and bfloat16 (float32's upper half) convert to and from float32
 * with round-to-nearest-even, float64 to and from it as C does. */
typedef enum nd_dtype {
    ND_FLOAT32 = 0,
    ND_FLOAT16,
    ND_BFLOAT16,
    ND_FLOAT64,
    ND_DTYPE_COUNT
} nd_dtype;

/* Bytes per element (0 for a value outside the enum). */
int64_t nd_dtype_size(nd_dtype dtype);
/* "float32", "float16", "bfloat16", "float64" (NumPy's and PyTorch's names);
 * "unknown" outside the enum. */
const char *nd_dtype_name(nd_dtype dtype);
/* The dtype called name (the names above, or "half", "float", "double" as
 * PyTorch spells them); ND_ERR_VALUE listing the names otherwise. */
nd_status nd_dtype_from_name(const char *name, nd_dtype *out);

/* ------------------------------------------------------------------ devices */

typedef struct nd_device nd_device;

typedef enum nd_device_kind { ND_DEVICE_CPU = 0, ND_DEVICE_CUDA = 1 } nd_device_kind;

/* Devices are numbered 0..nd_device_count()-1. Device 0 is "cpu"; CUDA
 * devices follow when a CUDA backend is built; further host devices (the same
 * host kernels, their own accounting, so that mixing them with "cpu" is
 * detectable) are added by name with nd_host_device_register. */
int nd_device_count(void);
/* The host device called name, registered on first use (NULL when
 * ND_MAX_HOST_DEVICES are taken). */
nd_device *nd_host_device_register(const char *name);
nd_device *nd_device_at(int id);
int nd_device_id(const nd_device *dev);
const char *nd_device_name(const nd_device *dev);
nd_device_kind nd_device_get_kind(const nd_device *dev);
int nd_device_ordinal(const nd_device *dev);
int nd_device_available(const nd_device *dev);
/* Capacity in bytes (physical memory for the CPU); 0 when unknown. */
int64_t nd_device_capacity(const nd_device *dev);

/* ---------------------------------------------------------------- allocator */

/* One of PyTorch's statistics of the caching allocator: a count or bytes now,
 * their peak, and the cumulative additions and removals (current = allocated
 * - freed). */
typedef struct nd_memory_stat {
    int64_t current, peak, allocated, freed;
} nd_memory_stat;

typedef struct nd_memory_stats {
    int64_t allocated_current, allocated_peak, allocated_total, allocated_freed;
    int64_t reserved_current, reserved_peak, reserved_total, reserved_freed;
    int64_t blocks_current, blocks_peak, blocks_total, blocks_freed;
    /* A second peak of allocated bytes that only nd_memory_window_peak restarts
     * (nd_memory_reset_peaks leaves it), so that a tool can measure a stretch
     * of the program (the notebook extension: one cell) without resetting the
     * peak the user reads. */
    int64_t allocated_window_peak;
    int64_t num_alloc_retries; /* allocations retried after freeing memory */
    int64_t num_ooms;          /* allocations refused                      */
    /* The mechanism's view of collections: times the allocator called the
     * host's collection callback (both reasons, including calls the host
     * declined) and the allocated bytes that dropped during those calls.
     * Not the collections run: needle_c counts those in its pacer state
     * (csrc/gc_pacer.h), which also covers safe points. */
    int64_t num_collect_callbacks;
    int64_t collect_callback_freed_bytes;
    int64_t limit;   /* bytes; -1 when there is none             */
    int64_t trigger; /* pressure trigger in bytes; -1 when off    */
    /* Fragmentation, with torch.cuda.memory_stats' meanings: segments taken
     * from the system; active blocks (in use: storages and the backends'
     * scratch) and their bytes, rounding included; free blocks that are part
     * of a segment still in use (inactive splits: the fragments); requests
     * and segments of max_split_size or more (oversize). */
    nd_memory_stat segment, active, active_bytes, inactive_split, inactive_split_bytes;
    nd_memory_stat oversize_allocations, oversize_segments;
    int64_t num_gc_releases; /* cache releases made by garbage_collection_threshold */
} nd_memory_stats;

/* The caching allocator's settings (PyTorch's PYTORCH_ALLOC_CONF options). */
typedef struct nd_alloc_settings {
    /* Cached blocks of this many bytes or more are never split, and serve only
     * requests of this size or more that they exceed by less than
     * ND_OVERSIZE_SLACK; <= 0: no such limit (the default). */
    int64_t max_split_size;
    /* In (0, 1): before reserved memory would pass this share of the budget
     * (the limit, else the capacity), cached blocks are released; 0: off. */
    double gc_threshold;
    /* Large blocks come from one address range per GPU that grows in place
     * through the driver's virtual memory calls (CUDA only: ND_ERR_VALUE for
     * a device whose backend cannot, with the reason). */
    int expandable_segments;
} nd_alloc_settings;
#define ND_OVERSIZE_SLACK ((int64_t)20 << 20) /* PyTorch's kLargeBuffer */

/* Validates and applies s (ND_ERR_VALUE, nothing changed, for a value the
 * device cannot use). */
nd_status nd_memory_set_settings(nd_device *dev, const nd_alloc_settings *s);
void nd_memory_get_settings(const nd_device *dev, nd_alloc_settings *out);

void nd_memory_get_stats(const nd_device *dev, nd_memory_stats *out);
void nd_memory_reset_peaks(nd_device *dev);
/* The allocated peak since the last call (since start on the first); the
 * window restarts at the current allocated bytes. */
int64_t nd_memory_window_peak(nd_device *dev);
/* limit < 0 removes the limit. Limits apply to reserved bytes. */
void nd_memory_set_limit(nd_device *dev, int64_t limit);
int64_t nd_memory_get_limit(const nd_device *dev);
/* The bytes the device may use, the one rule for the allocator's
 * garbage_collection_threshold and the collection policy (csrc/gc_pacer.h):
 * its limit, else a GPU's capacity; -1 for none (a CPU without a limit: the
 * host's memory is not needle's to fill). */
int64_t nd_device_budget(const nd_device *dev);
/* Releases cached, unused blocks; returns the bytes released. */
int64_t nd_memory_empty_cache(nd_device *dev);

/* Why the engine asks for a collection. */
typedef enum nd_collect_reason {
    ND_COLLECT_PRESSURE = 0, /* an allocation would pass the device's trigger */
    ND_COLLECT_OOM = 1       /* an allocation failed even after the cache was released */
} nd_collect_reason;

/* The callback through which the engine asks its host to collect garbage.
 * It runs before the allocation it was asked for; it may free storages, and
 * allocations made inside it never start another collection. */
typedef void (*nd_collect_fn)(void *ctx, nd_device *dev, int64_t requested,
                              nd_collect_reason reason);
void nd_memory_set_collect_callback(nd_collect_fn fn, void *ctx);
/* An allocation that would take allocated bytes past trigger first calls the
 * callback with ND_COLLECT_PRESSURE. trigger < 0 switches that off. */
void nd_memory_set_trigger(nd_device *dev, int64_t trigger);
/* Nonzero while a collection callback is running in this thread. */
int nd_memory_collecting(void);

/* A CUDA graph capture on dev begins / ends (the CUDA backend's calls).
 * Between them nothing collects or gives the cache back: the pressure
 * collection, the out-of-memory ladder's release and collection, and aligned
 * collections are deferred (a cudaFree, or a finalizer's work, cannot run
 * inside a capture), and an allocation that does not fit fails at once. The
 * end runs a collection that was asked for meanwhile (through the callback,
 * as a pressure collection). nd_memory_capturing: nonzero while any device
 * captures; nd_memory_defer_collection: marks every capturing device's
 * collection as asked for. */
void nd_memory_begin_capture(nd_device *dev);
void nd_memory_end_capture(nd_device *dev);
int nd_memory_capturing(void);
void nd_memory_defer_collection(void);

/* What the last refused allocation on this thread saw. collected: the
 * allocated bytes that fell while the collections run for that request (the
 * pressure one before its first try, the out-of-memory ladder's) ran;
 * largest_free_block: the largest free block left in the device's cache when
 * it gave up (nd_memory_largest_free_block), 0 for none. */
typedef struct nd_oom_info {
    int device_id;
    int64_t requested, allocated, reserved, limit;
    int64_t collected, largest_free_block;
} nd_oom_info;
void nd_last_oom(nd_oom_info *out);

/* The allocator's history, for a host that records one (PyTorch's memory
 * snapshots; csrc/memory_history.c). While tracing is on for a device, the
 * engine reports each event through one callback. ND_MEMORY_ALLOC and
 * ND_MEMORY_OOM come on the allocating path with the allocator consistent, so
 * the callback may run host code there, as a collection may; every other
 * event may come while a collection frees memory: the callback then must not
 * run host code or allocate device memory. */
typedef enum nd_memory_action {
    ND_MEMORY_ALLOC = 0,         /* a storage got `size` bytes at `address` */
    ND_MEMORY_FREE = 1,          /* a storage gave them back */
    ND_MEMORY_SEGMENT_ALLOC = 2, /* the backend took a segment from the system */
    ND_MEMORY_SEGMENT_FREE = 3,  /* the backend gave one back */
    ND_MEMORY_OOM = 4            /* an allocation of `size` bytes was refused */
} nd_memory_action;

typedef struct nd_memory_event {
    nd_memory_action action;
    uintptr_t address;   /* 0 for ND_MEMORY_OOM */
    int64_t size;        /* bytes asked for, or the segment's size */
    int64_t device_free; /* ND_MEMORY_OOM: bytes left under the limit or capacity */
} nd_memory_event;

typedef void (*nd_memory_event_fn)(void *ctx, nd_device *dev, const nd_memory_event *event);
void nd_memory_set_event_callback(nd_memory_event_fn fn, void *ctx);
void nd_memory_set_tracing(nd_device *dev, int on);

/* What a block of a segment holds. */
typedef enum nd_block_state {
    ND_BLOCK_FREE = 0,    /* cached for reuse */
    ND_BLOCK_STORAGE = 1, /* a live storage's bytes (counted as allocated) */
    ND_BLOCK_ENGINE = 2   /* the engine's own (scratch, cuBLAS's workspace): reserved only */
} nd_block_state;

/* One block of memory the device's allocator holds, with its segment (what
 * was taken from the system in one piece). */
typedef struct nd_memory_block {
    uintptr_t segment_address;
    int64_t segment_size;
    int segment_small;      /* 1: a segment of the small-block pool (CUDA's <= 1 MiB requests) */
    int segment_expandable; /* 1: a mapped run of an expandable segment (expandable_segments) */
    int segment_pool;       /* 0: the device's cache; else the CUDA graph pool it belongs to */
    uintptr_t address;
    int64_t size;      /* the block's bytes, rounding included */
    int64_t requested; /* ND_BLOCK_STORAGE: the bytes asked for; else size (engine) or 0 */
    nd_block_state state;
} nd_memory_block;

/* Every block of every segment of the device, ordered by segment address,
 * then address: writes the first cap into out and the number of blocks into
 * *count (call again with room for *count when it is larger than cap). The
 * blocks' sizes add up to the reserved bytes and the storage blocks'
 * requested bytes to the allocated ones. Uses host memory only; calls
 * nothing. */
nd_status nd_memory_blocks(nd_device *dev, nd_memory_block *out, int64_t cap, int64_t *count);
/* The bytes of the largest free (cached, inactive) block of the device's
 * allocator: the most a request could get without a new segment (on the
 * CPU, whose blocks are never split, only a request of its exact size); 0
 * when the cache is empty or the host has no memory for the walk. Uses host
 * memory only; calls nothing. */
int64_t nd_memory_largest_free_block(nd_device *dev);

/* ------------------------------------------------------------------ storage */

typedef struct nd_storage nd_storage;

/* A refcounted buffer of `numel` elements of dtype on a device (64-byte
 * aligned on the host). The new storage has one reference. */
nd_status nd_storage_new_typed(nd_device *dev, int64_t numel, nd_dtype dtype, nd_storage **out);
/* nd_storage_new_typed for float32. */
nd_status nd_storage_new(nd_device *dev, int64_t numel, nd_storage **out);
void nd_storage_retain(nd_storage *s);
void nd_storage_release(nd_storage *s);
/* A storage's buffer and the dtype of its elements: the one way to a
 * storage's bytes (data is 64-byte aligned on the host). */
typedef struct nd_buffer {
    void *data;
    nd_dtype dtype;
} nd_buffer;
nd_buffer nd_storage_buffer(const nd_storage *s);
nd_dtype nd_storage_dtype(const nd_storage *s);
int64_t nd_storage_numel(const nd_storage *s);
nd_device *nd_storage_device(const nd_storage *s);
int64_t nd_storage_refcount(const nd_storage *s);
/* 1 for memory another library owns (nd_storage_wrap), 0 for the engine's. */
int nd_storage_borrowed(const nd_storage *s);
/* A storage over `numel` elements of dtype at `data` on dev that the engine does not own
 * (another library's buffer, for DLPack). The new storage has one reference;
 * when the last is released it calls release(ctx) (if release is non-NULL)
 * instead of freeing data. External memory is not counted by the allocator:
 * it never appears in memory_allocated or limits, since the engine cannot
 * free it under pressure. */
nd_status nd_storage_wrap(nd_device *dev, void *data, int64_t numel, nd_dtype dtype,
                          void (*release)(void *ctx), void *ctx, nd_storage **out);

/* ------------------------------------------------------------------- layout */

/* Shape, strides (elements) and offset (elements) of a view into a storage. */
typedef struct nd_layout {
    int ndim;
    int64_t offset;
    int64_t shape[ND_MAX_DIMS];
    int64_t strides[ND_MAX_DIMS];
} nd_layout;

nd_status nd_layout_contiguous(int ndim, const int64_t *shape, nd_layout *out);
int64_t nd_layout_numel(const nd_layout *l);
/* Row-major contiguous (strides of size-1 dims ignored). */
int nd_layout_is_contiguous(const nd_layout *l);
/* Smallest and one-past-largest element index the view touches (0,0 if empty). */
void nd_layout_extent(const nd_layout *l, int64_t *lo, int64_t *hi);
/* new_shape may hold one -1. ND_ERR_NOT_VIEWABLE when the data must be copied. */
nd_status nd_layout_reshape(const nd_layout *in, int ndim, const int64_t *new_shape,
                            nd_layout *out);
/* Resolves one -1 in shape against numel; checks the element count. */
nd_status nd_resolve_shape(int64_t numel, int ndim, const int64_t *shape, int64_t *resolved);
nd_status nd_layout_permute(const nd_layout *in, const int *axes, nd_layout *out);
/* NumPy rules: leading dims are added, size-1 dims are stretched (stride 0). */
nd_status nd_layout_broadcast_to(const nd_layout *in, int ndim, const int64_t *shape,
                                 nd_layout *out);
/* Restricts dim to indices start, start+step, ... (length of them); the caller
 * has already resolved Python slice semantics. keep_dim=0 drops the dim, which
 * requires length 1. */
nd_status nd_layout_slice(nd_layout *l, int dim, int64_t start, int64_t step, int64_t length);
nd_status nd_layout_drop_dim(nd_layout *l, int dim);
nd_status nd_layout_flip(const nd_layout *in, int naxes, const int *axes, nd_layout *out);
/* Checks that a view stays inside a storage of numel elements. */
nd_status nd_layout_check_bounds(const nd_layout *l, int64_t numel);
nd_status nd_broadcast_shapes(int andim, const int64_t *ashape, int bndim, const int64_t *bshape,
                              int *out_ndim, int64_t *out_shape);
/* Normalises axis (negative counts from the end) against ndim. */
nd_status nd_normalize_axis(int64_t axis, int ndim, int *out);

/* ------------------------------------------------------------------- arrays */

/* A view: one reference on storage plus a layout. Value type: whoever holds
 * an nd_array owns its storage reference. */
typedef struct nd_array {
    nd_storage *storage;
    nd_layout layout;
} nd_array;

/* Drops the storage reference and zeroes the array. */
void nd_array_release(nd_array *a);
/* A new contiguous float32 array (uninitialised). */
nd_status nd_array_empty(nd_device *dev, int ndim, const int64_t *shape, nd_array *out);
/* A new contiguous array of dtype (uninitialised). */
nd_status nd_array_empty_typed(nd_device *dev, int ndim, const int64_t *shape, nd_dtype dtype,
                               nd_array *out);
nd_dtype nd_array_dtype(const nd_array *a);
/* The dtype an operation on arrays of dtypes a and b computes in and
 * returns (PyTorch's promotion): float64 with anything is float64, float32
 * with a narrow type float32, float16 with bfloat16 float32. The elementwise
 * ops, reductions, matmul and linear take every dtype and promote; the fused
 * operations (softmax, layer norm, attention, LSTM, losses, gathers) are
 * float32 only; the optimizer updates compute in float32 or float64. */
nd_dtype nd_promote_dtypes(nd_dtype a, nd_dtype b);
/* ND_ERR_VALUE naming `what` and a's dtype unless a is float32: the check of
 * every operation that computes in float32 only. */
nd_status nd_array_require_float32(const nd_array *a, const char *what);
/* A new contiguous copy of src, of src's dtype, on dev (NULL: src's device). */
nd_status nd_array_compact_copy(const nd_array *src, nd_device *dev, nd_array *out);
/* A new contiguous copy of src converted to dtype, on src's device (rounded
 * to nearest even when narrowing; a value beyond float16's range becomes
 * infinite, as in NumPy and PyTorch). */
nd_status nd_array_astype(const nd_array *src, nd_dtype dtype, nd_array *out);
/* Writes src, broadcast to dst's shape and converted to dst's dtype, into
 * dst's view in place. */
nd_status nd_array_assign(const nd_array *dst, const nd_array *src);
/* value converted to dst's dtype into every element of dst's view. */
nd_status nd_array_fill(const nd_array *dst, double value);
/* Host transfers: host buffers are contiguous, row-major, numel elements of
 * the array's dtype. */
nd_status nd_array_to_host(const nd_array *src, void *host);
nd_status nd_array_from_host(const nd_array *dst, const void *host);

/* nd_binary_op and nd_unary_op, the elementwise ops, are made of their list
 * in ewise_ops.h (included above), which holds their formulas too. */

typedef enum nd_reduce_op {
    ND_REDUCE_SUM,
    ND_REDUCE_MAX,
    ND_REDUCE_MIN,
    ND_REDUCE_OP_COUNT
} nd_reduce_op;

/* An operand of a binary op: an array, or (array == NULL) a scalar. */
typedef struct nd_operand {
    const nd_array *array;
    double scalar; /* converted to the array operand's compute type */
} nd_operand;

/* out = a op b, broadcast (NumPy rules), into a new contiguous array. At least
 * one operand must be an array. Comparisons give 1.0 or 0.0. */
nd_status nd_array_binary(nd_binary_op op, nd_operand a, nd_operand b, nd_array *out);
nd_status nd_array_unary(nd_unary_op op, const nd_array *a, nd_array *out);
/* Reduces over the axes set in axes_mask (bit i = axis i). keepdims keeps them
 * as size-1 dims. Reducing an empty extent: sum gives 0, max/min fail. */
nd_status nd_array_reduce(nd_reduce_op op, const nd_array *a, uint32_t axes_mask, int keepdims,
                          nd_array *out);
/* NumPy matmul semantics: 1-D operands are promoted, batch dims broadcast. */
nd_status nd_array_matmul(const nd_array *a, const nd_array *b, nd_array *out);
/* out = x @ w + bias: the matmul, then bias (NULL: none) broadcast to the
 * product's shape and added into it in place, so a linear layer makes one
 * array, not two. bias must broadcast to the product's shape unchanged. A
 * bias that is one row, of the product's dtype, goes into the matmul where
 * the backend adds it there (float16/bfloat16 products on the CPU and on
 * CUDA: to the float32 sums, before the one rounding). */
nd_status nd_array_linear(const nd_array *x, const nd_array *w, const nd_array *bias,
                          nd_array *out);
/* The gradients of out = x @ w + bias (x: m x k, w: k x n) from out's
 * gradient g (m x n), in one pass over g where the backend has one for this
 * dtype and size (the CPU's float16/bfloat16 products): gx = g @ w^T, gw =
 * x^T @ g and gb = g summed over its rows (shape (n,)), and *fused = 1.
 * Elsewhere (other devices, dtypes or layouts; mixed dtypes or devices)
 * *fused = 0 and nothing is made: the caller composes them. */
nd_status nd_array_linear_grads(const nd_array *g, const nd_array *x, const nd_array *w,
                                nd_array *gx, nd_array *gw, nd_array *gb, int *fused);

/* ------------------------------------------------------------ CPU settings */

/* A row-major single-precision GEMM: C = alpha*op(A) op(B) + beta*C, where
 * op transposes when trans_* is nonzero. The host may install a BLAS (needle_c
 * installs NumPy's OpenBLAS); without one the engine uses its own kernel. */
typedef void (*nd_sgemm_fn)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                            const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                            float *c, int64_t ldc);
void nd_cpu_set_sgemm(nd_sgemm_fn fn);
nd_sgemm_fn nd_cpu_get_sgemm(void);
/* needle's own GEMM (cpu_gemm.c), an nd_sgemm_fn: what the CPU backend uses
 * below the BLAS split (nd_cpu_gemm_split) and everywhere without a BLAS. */
void nd_cpu_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc);

/* The instruction sets the CPU kernels are built for (cpu_isa.c), best last.
 * The engine starts on the best one the CPU (and its OS) supports; a lower
 * one can be chosen for comparison or to work around a problem. On a machine
 * that is not x86-64 (or with a compiler without function targets) only the
 * baseline exists. */
typedef enum nd_cpu_isa {
    ND_CPU_ISA_BASELINE = 0, /* plain C, the compiler's default target        */
    ND_CPU_ISA_AVX2,         /* x86-64-v3: AVX2 + FMA                         */
    ND_CPU_ISA_AVX512,       /* x86-64-v4: AVX-512 F/BW/DQ/VL                 */
    ND_CPU_ISA_COUNT
} nd_cpu_isa;

/* "baseline", "avx2", "avx512"; NULL for a value outside the enum. */
const char *nd_cpu_isa_name(nd_cpu_isa isa);
/* The ISA called name (one of the names above); ND_ERR_VALUE otherwise. */
nd_status nd_cpu_isa_from_name(const char *name, nd_cpu_isa *out);
/* Whether this CPU can run kernels built for isa. */
int nd_cpu_isa_supported(nd_cpu_isa isa);
/* The best ISA this CPU supports: what the kernels use unless told otherwise. */
nd_cpu_isa nd_cpu_isa_best(void);
/* The ISA the kernels use now. */
nd_cpu_isa nd_cpu_isa_current(void);
/* Makes the kernels use isa; ND_ERR_VALUE (nothing changes) when this CPU
 * cannot run it, so a forced ISA never ends in an illegal instruction. */
nd_status nd_cpu_set_isa(nd_cpu_isa isa);
/* Treats this CPU as if it ran nothing above ceiling (it never raises what
 * the CPU supports), for the rest of the process: emulates a lesser machine,
 * which is how the refusal of nd_cpu_set_isa is tested on any machine. */
nd_status nd_cpu_isa_limit(nd_cpu_isa ceiling);
/* The GEMM micro-kernel built for isa, in words ("avx512 8x32"). */
const char *nd_cpu_gemm_kernel_name(nd_cpu_isa isa);
/* The kernel a float16/bfloat16 matmul runs now, in words: bfloat16's pair
 * kernel ("avx512-bf16 8x32") where the CPU has one, else the current ISA's
 * float32 kernel on widened operands ("avx512 8x32"). */
const char *nd_cpu_gemm_narrow_kernel_name(nd_dtype dtype);
/* Whether a linear layer's gradients of dtype run in one pass over the
 * output's gradient on the CPU now (float16; bfloat16 without AMX): a layer
 * whose input is narrow enough for its float32 scratch (cpu_linear_grads.c). */
int nd_cpu_linear_grads_in_one_pass(nd_dtype dtype);

/* The split between needle's GEMM and the installed BLAS (cpu_matmul.c):
 * products of at least `split` multiply-adds (m*n*k) go to the BLAS, smaller
 * ones to needle's GEMM. -1 (the default) means: measure it at the first
 * product that could go either way (nd_cpu_gemm_calibrate). */
void nd_cpu_set_gemm_split(int64_t min_madds);
int64_t nd_cpu_gemm_split(void);

#define ND_GEMM_CALIBRATION_MAX 7
/* What a calibration measured: for each square size measured, the median
 * seconds of needle's GEMM and of the BLAS on it. */
typedef struct nd_gemm_calibration {
    int measured; /* 0: no calibration has run */
    int count;    /* sizes measured */
    int64_t size[ND_GEMM_CALIBRATION_MAX];
    double needle_seconds[ND_GEMM_CALIBRATION_MAX];
    double blas_seconds[ND_GEMM_CALIBRATION_MAX];
    int cut_short;  /* the time budget ran out (a slow BLAS) before the sizes did */
    int64_t split;  /* the split it chose; INT64_MAX: never the BLAS */
    nd_cpu_isa isa; /* needle's kernels it measured */
} nd_gemm_calibration;

/* Measures both on square products (64 ... 512, until the BLAS has won two
 * sizes in a row or 40 ms have passed), sets the split to the smallest
 * size from which the BLAS won, and fills report (may be NULL).
 * ND_ERR_VALUE without a BLAS, ND_ERR_OOM without memory for the matrices. */
nd_status nd_cpu_gemm_calibrate(nd_gemm_calibration *report);
/* The last calibration (measured == 0 if none ran). */
const nd_gemm_calibration *nd_cpu_gemm_last_calibration(void);

/* Threads the CPU's row kernels (softmax, cross-entropy) split large arrays
 * over. Default: NEEDLE_NUM_THREADS when set (1 to 256), else the number of
 * online processors. n < 1 restores the default. */
void nd_cpu_set_threads(int n);
int nd_cpu_get_threads(void);

/* ------------------------------------------------------------- row indexing */

/* Embedding-style row indexing. Indices are float32 arrays holding integer
 * values (every array here is float32); an index that is not an integer or
 * lies outside [0, rows) fails with ND_ERR_INDEX before anything is written.
 * Negative indices are errors, not counted from the end. */

/* out (indices.shape + (D,), new, contiguous) = table[indices], table (V, D). */
nd_status nd_array_gather_rows(const nd_array *table, const nd_array *indices, nd_array *out);
/* out (num_rows, D), new: zeros with src's rows added at their indices;
 * src has shape indices.shape + (D,). Repeated indices accumulate. */
nd_status nd_array_scatter_add_rows(const nd_array *src, const nd_array *indices, int64_t num_rows,
                                    nd_array *out);
/* The same, added in place into the existing 2-D view dst (num_rows, D). */
nd_status nd_array_scatter_add_rows_into(const nd_array *dst, const nd_array *src,
                                         const nd_array *indices);

/* ------------------------------------------------------------ softmax rows */

/* Row kernels over the last axis, each reading its input once: an online max
 * and sum of exponentials per row, with the max clamped to finite values (a
 * row of -inf gives -inf, a +inf gives +inf rather than nan; NaN
 * propagates). Arrays whose rows are not contiguous are compacted first. */

/* out (a's shape without its last axis, or with it as 1 when keepdims) =
 * log(sum(exp(a))) over the last axis (-inf for an empty one). */
nd_status nd_array_logsumexp_last(const nd_array *a, int keepdims, nd_array *out);
/* out (a's shape, new) = softmax, or log-softmax when `log`, over the last axis. */
nd_status nd_array_softmax_last(const nd_array *a, int log, nd_array *out);

/* Softmax cross-entropy of logits (N, C) against labels (N,) holding class
 * ids as floats: loss (1,), new = the mean over rows of logsumexp(row) -
 * row[label], summed in double (nan for no rows). A label that is not an
 * integer in [0, C) fails with ND_ERR_INDEX. The loss's storage
 * also holds each row's softmax statistics (after the loss element), which
 * nd_array_softmax_xent_grad reads back: holding the loss keeps them. */
nd_status nd_array_softmax_xent(const nd_array *logits, const nd_array *labels, nd_array *loss);
/* grad (N, C), new = out_grad * (softmax(logits) - one_hot(labels)) / N.
 * out_grad: a one-element array, or NULL for 1. When `loss` (may be NULL) is
 * what nd_array_softmax_xent returned for these logits and labels (checked:
 * its statistics must give back its value bit for bit), this reads the
 * logits once and writes grad once; otherwise a first pass recomputes the
 * statistics. Labels are checked as above. */
nd_status nd_array_softmax_xent_grad(const nd_array *logits, const nd_array *labels,
                                     const nd_array *loss, const nd_array *out_grad,
                                     nd_array *grad);

/* ---------------------------------------------------------- random numbers */

/* The engine's generator: Philox4x32-10 (philox.h), counter based, so
 * element i of a fill is a pure function of (key, stream, i), the same on
 * every backend and whatever the launch geometry. Draws under one key with
 * different streams are independent. */
typedef enum nd_random_kind {
    ND_RANDOM_UNIFORM,   /* [0, 1), multiples of 2^-24          */
    ND_RANDOM_NORMAL,    /* standard normal (Box-Muller)         */
    ND_RANDOM_BERNOULLI, /* 1.0 where the uniform is <= p, else 0.0 */
    ND_RANDOM_KIND_COUNT
} nd_random_kind;

typedef struct nd_random_params {
    nd_random_kind kind;
    uint64_t key;
    uint64_t stream;
    float p; /* ND_RANDOM_BERNOULLI: in [0, 1] */
    /* Set by the CUDA backend in a draw it captures into a graph: a device
     * counter that each replay of the graph advances, mixed into the stream
     * so that every replay draws new numbers (NULL otherwise). */
    const uint64_t *replay_counter;
} nd_random_params;

/* Fills dst (contiguous; row-major element i gets value i) in one kernel.
 * ND_ERR_VALUE for an unknown kind, a p outside [0, 1] (or NaN) or a view
 * that is not contiguous. */
nd_status nd_array_fill_random(const nd_array *dst, const nd_random_params *params);

/* ------------------------------------------------------ optimizer updates */

/* One pass per parameter of the course's optimizers (needle.optim), in the
 * order its unfused code runs them, with g = grad, plus param * weight_decay
 * when weight_decay != 0 (L2 decay added to the grad):
 *
 *   Adam: m = m * beta1 + g * one_minus_beta1
 *         v = v * beta2 + (g * g) * one_minus_beta2
 *         param_out = param - ((m / bias_correction1) * lr)
 *                             / (sqrt(v / bias_correction2) + eps)
 *   SGD:  u = u * momentum + g * one_minus_momentum
 *         param_out = param - u * lr
 *
 * The arithmetic runs in float64 when any operand is float64 (PyTorch
 * updates a float64 parameter in float64), else in float32: float16 and
 * bfloat16 operands are widened to float32 and the results rounded once, as
 * PyTorch's opmath does. The coefficients are what the host computed in
 * double (one_minus_beta1 = 1.0 - beta1, bias_correction1 =
 * nd_adam_bias_correction(beta1, t)); float32 arithmetic uses each one
 * rounded to float32 ((float)(1.0 - beta1), not 1.0f - (float)beta1), which
 * is what the unfused code multiplies by. sqrt is correctly rounded where the
 * unfused code's v**0.5 is a pow within an ulp.
 *
 * A capturable Adam (PyTorch's capturable=True, for CUDA graphs) sets
 * `state`: a float64 (2,) contiguous array [t, lr] on the parameter's
 * device. The update then takes lr and t from that memory when it runs (on a
 * GPU, in the kernel), computing the bias corrections from t there with the
 * same nd_adam_bias_correction, so the host passes nothing that changes from
 * step to step and a replayed graph reads each step's values: lr and the
 * bias corrections above are ignored. With a state the parameter is updated
 * IN PLACE (a replay reads and writes the captured addresses) and param_out
 * is left empty. NULL: the host scalars above, a new param_out. */
typedef struct nd_adam_hyper {
    double lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay;
    double bias_correction1, bias_correction2;
    const nd_array *state;
} nd_adam_hyper;

/* 1 - beta**t for an integer t >= 1, the same bits on the host and in a
 * GPU kernel (no libm pow, whose last bit differs between them): beta**t by
 * squaring in double-double arithmetic, within an ulp of the exact power
 * (the correctly rounded one but in rare near-ties), then 1 - it in double. */
double nd_adam_bias_correction(double beta, double t);

typedef struct nd_sgd_hyper {
    double lr, momentum, one_minus_momentum, weight_decay;
} nd_sgd_hyper;

/* param_out (new, contiguous, param's shape and dtype) from param and grad,
 * which may have any strides (a non-contiguous one is compacted first); the
 * moments m and v (u) are updated IN PLACE, each keeping its dtype: they must
 * be contiguous and must not share a storage with each other, param or grad
 * (ND_ERR_VALUE). All arrays have param's shape (ND_ERR_SHAPE) and device
 * (ND_ERR_DEVICE). An operand whose dtype is not the one computed in is
 * converted to a copy first (dtype_island.c). On a GPU, one kernel launch for
 * contiguous operands of the computed dtype and no host synchronisation;
 * param and grad are never written. On failure nothing was written. */
nd_status nd_array_adam_update(const nd_array *param, const nd_array *grad, const nd_array *m,
                               const nd_array *v, const nd_adam_hyper *hyper, nd_array *param_out);
/* Adds 1 to t in a capturable Adam's state (see nd_adam_hyper: float64 (2,)
 * contiguous, [t, lr]) where it lives: on a GPU one single-thread kernel on
 * the current stream, no host synchronisation, so a CUDA graph can capture
 * it. ND_ERR_VALUE for a state of another dtype or shape. */
nd_status nd_array_adam_count_step(const nd_array *state);
nd_status nd_array_sgd_update(const nd_array *param, const nd_array *grad, const nd_array *u,
                              const nd_sgd_hyper *hyper, nd_array *param_out);

/* -------------------------------------------------------------------- LSTM */

/* A one-layer LSTM over a sequence (csrc/lstm.c), PyTorch's gate order i, f,
 * g, o and the course's weight layout: x (T, B, in); h0, c0 (B, H) or NULL
 * (zeros); w_ih (in, 4H); w_hh (H, 4H); b_ih, b_hh (4H,), both or neither.
 * gates_t = x_t @ w_ih + h_{t-1} @ w_hh (+ b_ih + b_hh);
 * c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g); h_t = sigmoid(o) * tanh(c_t).
 * One GEMM for every step's input projection, then per step one GEMM
 * (h_{t-1} @ w_hh, none for h0 == NULL) and one fused kernel.
 * y (T, B, H), new: every h_t, in a storage that also holds what
 * nd_array_lstm_backward reads (the activated gates and tanh(c_t) of every
 * step, and the cell states); h_n (may be NULL: not wanted) and c_n (B, H),
 * new: the last step's states. T, B, in and H must be at least 1. */
nd_status nd_array_lstm(const nd_array *x, const nd_array *h0, const nd_array *c0,
                        const nd_array *w_ih, const nd_array *w_hh, const nd_array *b_ih,
                        const nd_array *b_hh, nd_array *y, nd_array *h_n, nd_array *c_n);

/* What nd_array_lstm_backward computes besides the weights' gradients. */
enum { ND_LSTM_GRAD_X = 1, ND_LSTM_GRAD_STATE = 2, ND_LSTM_GRAD_BIAS = 4 };

/* The gradients of an LSTM layer; an entry not asked for stays empty. */
typedef struct nd_lstm_grads {
    nd_array x;          /* (T, B, in)      ND_LSTM_GRAD_X      */
    nd_array h0, c0;     /* (B, H)          ND_LSTM_GRAD_STATE  */
    nd_array w_ih, w_hh; /* (in, 4H), (H, 4H), always           */
    nd_array bias;       /* (2, 4H): row 0 b_ih's, row 1 b_hh's (equal), ND_LSTM_GRAD_BIAS */
} nd_lstm_grads;

/* The backward of nd_array_lstm: its inputs as given to it, y what it
 * returned for them (checked to hold its saved values for these shapes; any
 * other y, or NULL, and the forward runs again first), and the gradients of
 * its outputs dy (T, B, H), dh_n, dc_n (B, H), any of them NULL for zeros.
 * Per step, in reverse: one fused kernel (the gates' gradient, the cell
 * state's) and one GEMM (h_{t-1}'s gradient; none at t = 0 unless the
 * state's gradient is wanted); then one GEMM each for x's, w_ih's and
 * w_hh's gradients and one column sum for both biases'. `want` is a mask
 * of ND_LSTM_GRAD_*; *out is filled (every entry released on failure). */
nd_status nd_array_lstm_backward(const nd_array *x, const nd_array *h0, const nd_array *c0,
                                 const nd_array *w_ih, const nd_array *w_hh, const nd_array *b_ih,
                                 const nd_array *b_hh, const nd_array *y, const nd_array *dy,
                                 const nd_array *dh_n, const nd_array *dc_n, int want,
                                 nd_lstm_grads *out);
void nd_lstm_grads_release(nd_lstm_grads *g);

/* -------------------------------------------------------------- layer norm */

/* The course's LayerNorm1d over the last axis, fused: each row of x (..., D)
 * is normalised by its mean and biased variance, y = w * (x - mean) /
 * sqrt(var + eps) + b, with w and b holding D elements each (any shape).
 * out (x's shape, new). ND_ERR_SHAPE for D == 0 or a w or b of another size,
 * ND_ERR_VALUE for an eps that is negative or not finite. */
nd_status nd_array_layer_norm(const nd_array *x, const nd_array *w, const nd_array *b, float eps,
                              nd_array *out);
/* Its gradients for the out_grad g (x's shape): dx (x's shape), dw and db
 * (D,) each, all new; the row statistics are recomputed from x. */
nd_status nd_array_layer_norm_grad(const nd_array *x, const nd_array *w, const nd_array *g,
                                   float eps, nd_array *dx, nd_array *dw, nd_array *db);

/* Attention's softmax over the last axis, fused: out (x's shape, new) =
 * softmax(x / divisor + mask), where mask, when causal, is the course's
 * create_causal_mask over the last two axes (Lq, Lk): -FLT_MAX where key j >
 * query i + Lk - Lq, 0 elsewhere; x needs 2 dims then. ND_ERR_VALUE for a
 * divisor that is zero or not finite. */
nd_status nd_array_attention_softmax(const nd_array *x, float divisor, int causal, nd_array *out);
/* Its gradient from the forward's output y and the out_grad g (y's shape):
 * dx (new) = y * (g - sum(g * y)) / divisor, the sum over the last axis. */
nd_status nd_array_attention_softmax_grad(const nd_array *y, const nd_array *g, float divisor,
                                          nd_array *dx);

/* dst += src in place, src broadcast to dst's shape (gradient accumulation).
 * dst must not overlap itself (no stride-0 dims of extent > 1). */
nd_status nd_array_add_into(const nd_array *dst, const nd_array *src);

/* -------------------------------------------------------------------- AMP */

/* GradScaler's unscale (csrc/amp_unscale.c), PyTorch's
 * _amp_foreach_non_finite_check_and_unscale_: each of the count gradients
 * (any strides; views write through; float32 or float64, else ND_ERR_DTYPE)
 * is multiplied IN PLACE by inv_scale in its own dtype, and found_inf (one
 * element, on the gradients' device) is set to 1.0f when any element was inf
 * or NaN before the multiply; otherwise it keeps its value, so calls OR into
 * it. One pass over each gradient; on a GPU one
 * kernel launch per gradient and no host synchronisation. Every operand is
 * checked before anything is written: ND_ERR_DEVICE (a gradient elsewhere),
 * ND_ERR_SHAPE (found_inf not one element), ND_ERR_VALUE (a gradient
 * overlapping found_inf, or two gradients overlapping in part). Each element
 * of memory is multiplied once: a broadcast view's one element once, and
 * gradients holding the same elements (one array given twice, or a reshape
 * or transpose of another) once. */
nd_status nd_array_amp_unscale(const nd_array *const *grads, int64_t count,
                               const nd_array *found_inf, float inv_scale);

#ifdef __cplusplus
}
#endif
#endif /* NEEDLE_ENGINE_H */
