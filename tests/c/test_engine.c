/* test_engine.c: unit tests of the engine through its public header:
 * allocator accounting, limits and the collection callback (the mechanism of
 * the OOM ladder), layouts and views, and a few operations checked by hand.
 * Built and run by tests/test_engine_c.py; prints failures, exits nonzero. */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

static void test_accounting(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    nd_storage *s;
    CHECK(nd_storage_new(cpu, 1000, &s) == ND_OK);
    CHECK(allocated(cpu) == base + 4000);
    CHECK(((uintptr_t)nd_storage_buffer(s).data % 64) == 0);
    CHECK(nd_storage_buffer(s).dtype == ND_FLOAT32);
    nd_storage_retain(s);
    nd_storage_release(s);
    CHECK(allocated(cpu) == base + 4000);
    nd_storage_release(s);
    CHECK(allocated(cpu) == base);
    nd_memory_stats st;
    nd_memory_get_stats(cpu, &st);
    CHECK(st.allocated_peak >= base + 4000);
    nd_memory_reset_peaks(cpu);
    nd_memory_get_stats(cpu, &st);
    CHECK(st.allocated_peak == base);
    /* The window peak is a second peak: reset_peaks leaves it, and each read restarts it. */
    nd_memory_window_peak(cpu);
    CHECK(nd_storage_new(cpu, 1000, &s) == ND_OK);
    nd_storage_release(s);
    nd_memory_reset_peaks(cpu);
    CHECK(nd_memory_window_peak(cpu) == base + 4000);
    CHECK(nd_memory_window_peak(cpu) == base);
    nd_memory_get_stats(cpu, &st);
    CHECK(st.allocated_peak == base);
    /* cpu_numpy is another device with its own books. */
    nd_device *other = nd_host_device_register("cpu_numpy");
    CHECK(other != NULL && strcmp(nd_device_name(other), "cpu_numpy") == 0);
    int64_t other_base = allocated(other);
    CHECK(nd_storage_new(other, 10, &s) == ND_OK);
    CHECK(allocated(other) == other_base + 40 && allocated(cpu) == base);
    nd_storage_release(s);
}

static void test_limit(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    nd_memory_set_limit(cpu, base + 1000);
    nd_storage *a, *b;
    CHECK(nd_storage_new(cpu, 200, &a) == ND_OK); /* 800 bytes */
    nd_memory_stats st;
    nd_memory_get_stats(cpu, &st);
    int64_t ooms = st.num_ooms;
    CHECK(nd_storage_new(cpu, 100, &b) == ND_ERR_OOM); /* 400 more would pass it */
    nd_oom_info info;
    nd_last_oom(&info);
    CHECK(info.device_id == 0 && info.requested == 400 && info.allocated == base + 800 &&
          info.limit == base + 1000);
    nd_memory_get_stats(cpu, &st);
    CHECK(st.num_ooms == ooms + 1);
    CHECK(allocated(cpu) == base + 800);
    CHECK(nd_storage_new(cpu, 50, &b) == ND_OK); /* 200 fits */
    nd_storage_release(b);
    nd_storage_release(a);
    nd_memory_set_limit(cpu, -1);
}

/* The callback frees a storage that "garbage" held, as a collection would. */
static nd_storage *garbage = NULL;
static int calls[2];
static int nested_ok = 1;
static void collect(void *ctx, nd_device *dev, int64_t requested, nd_collect_reason reason) {
    (void)ctx;
    (void)requested;
    calls[reason]++;
    CHECK(nd_memory_collecting());
    /* An allocation made during a collection must not start another one. */
    nd_storage *tmp;
    int before = calls[0] + calls[1];
    if (nd_storage_new(dev, 1, &tmp) == ND_OK) nd_storage_release(tmp);
    if (calls[0] + calls[1] != before) nested_ok = 0;
    if (garbage != NULL) {
        nd_storage_release(garbage);
        garbage = NULL;
    }
}

static void test_collect_callback(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    nd_memory_set_collect_callback(collect, NULL);
    /* OOM path: the allocation fits only after the callback frees garbage. */
    nd_memory_set_limit(cpu, base + 1000);
    CHECK(nd_storage_new(cpu, 200, &garbage) == ND_OK);
    nd_memory_stats st;
    nd_memory_get_stats(cpu, &st);
    int64_t retries = st.num_alloc_retries;
    nd_storage *s;
    CHECK(nd_storage_new(cpu, 200, &s) == ND_OK);
    CHECK(calls[ND_COLLECT_OOM] == 1 && garbage == NULL);
    nd_memory_get_stats(cpu, &st);
    CHECK(st.num_alloc_retries == retries + 1 && st.collect_callback_freed_bytes >= 800);
    nd_storage_release(s);
    nd_memory_set_limit(cpu, -1);
    /* Pressure path: the trigger asks for a collection before allocating. */
    nd_memory_set_trigger(cpu, base + 100);
    CHECK(nd_storage_new(cpu, 10, &s) == ND_OK); /* 40 bytes: below the trigger */
    CHECK(calls[ND_COLLECT_PRESSURE] == 0);
    nd_storage *t;
    CHECK(nd_storage_new(cpu, 100, &t) == ND_OK); /* passes it */
    CHECK(calls[ND_COLLECT_PRESSURE] == 1);
    nd_storage_release(t);
    nd_storage_release(s);
    nd_memory_set_trigger(cpu, -1);
    CHECK(nested_ok);
    CHECK(!nd_memory_collecting());
    nd_memory_set_collect_callback(NULL, NULL);
    CHECK(allocated(cpu) == base);
}

static void test_layouts(void) {
    nd_layout l, v;
    int64_t shape[3] = {2, 3, 4};
    CHECK(nd_layout_contiguous(3, shape, &l) == ND_OK);
    CHECK(l.strides[0] == 12 && l.strides[1] == 4 && l.strides[2] == 1);
    CHECK(nd_layout_reshape(&l, 2, (int64_t[]){-1, 4}, &v) == ND_OK && v.shape[0] == 6);
    CHECK(nd_layout_reshape(&l, 2, (int64_t[]){-1, 5}, &v) == ND_ERR_SHAPE);
    CHECK(nd_layout_reshape(&l, 2, (int64_t[]){-1, -1}, &v) == ND_ERR_SHAPE);
    int axes[3] = {2, 0, 1};
    CHECK(nd_layout_permute(&l, axes, &v) == ND_OK && v.strides[0] == 1 && v.shape[0] == 4);
    nd_layout r;
    /* A permuted view cannot merge its dims: reshape needs a copy. */
    CHECK(nd_layout_reshape(&v, 1, (int64_t[]){24}, &r) == ND_ERR_NOT_VIEWABLE);
    /* Splitting one dim of a permuted view works without a copy. */
    CHECK(nd_layout_reshape(&v, 4, (int64_t[]){2, 2, 2, 3}, &r) == ND_OK && r.strides[0] == 2);
    int dup[3] = {0, 0, 1};
    CHECK(nd_layout_permute(&l, dup, &v) == ND_ERR_AXIS);
    CHECK(nd_layout_broadcast_to(&l, 4, (int64_t[]){5, 2, 3, 4}, &v) == ND_OK && v.strides[0] == 0);
    CHECK(nd_layout_broadcast_to(&l, 3, (int64_t[]){2, 3, 5}, &v) == ND_ERR_SHAPE);
    v = l;
    CHECK(nd_layout_slice(&v, 2, 3, -2, 2) == ND_OK && v.offset == 3 && v.strides[2] == -2);
    CHECK(nd_layout_slice(&v, 1, 0, 0, 1) == ND_ERR_VALUE);
    CHECK(nd_layout_flip(&l, 1, (int[]){0}, &v) == ND_OK && v.offset == 12 && v.strides[0] == -12);
    int64_t lo, hi;
    nd_layout_extent(&v, &lo, &hi);
    CHECK(lo == 0 && hi == 24);
    CHECK(nd_layout_check_bounds(&v, 24) == ND_OK &&
          nd_layout_check_bounds(&v, 23) == ND_ERR_VALUE);
    int nd;
    int64_t out[ND_MAX_DIMS];
    CHECK(nd_broadcast_shapes(2, (int64_t[]){3, 1}, 1, (int64_t[]){4}, &nd, out) == ND_OK &&
          nd == 2 && out[0] == 3 && out[1] == 4);
    CHECK(nd_layout_contiguous(ND_MAX_DIMS + 1, shape, &l) == ND_ERR_SHAPE);
}

/* Slice steps whose products overflow int64 (Python's a[::-2**63] passes
 * -(2**63 - 1)): checked before multiplying, never wrapped. */
static void test_huge_slice_steps(void) {
    nd_layout l, v;
    CHECK(nd_layout_contiguous(2, (int64_t[]){4, 3}, &l) == ND_OK && l.strides[0] == 3);
    /* One element, the last, as NumPy gives; stride 3 * step does not fit: it stays 3. */
    v = l;
    CHECK(nd_layout_slice(&v, 0, 3, INT64_MIN + 1, 1) == ND_OK && v.shape[0] == 1 &&
          v.offset == 9 && v.strides[0] == 3);
    v = l;
    CHECK(nd_layout_slice(&v, 0, 0, INT64_MAX, 1) == ND_OK && v.offset == 0 && v.strides[0] == 3);
    CHECK(nd_layout_slice(&v, 0, 0, INT64_MIN, 1) == ND_OK && v.strides[0] == 3);
    /* A product that fits is the stride, as in NumPy (stride 1 here). */
    v = l;
    CHECK(nd_layout_slice(&v, 1, 2, INT64_MIN + 1, 1) == ND_OK && v.offset == 2 &&
          v.strides[1] == INT64_MIN + 1);
    /* (length - 1) * step past int64 is out of range, not wrapped back into it. */
    v = l;
    CHECK(nd_layout_slice(&v, 0, 0, (int64_t)1 << 62, 5) == ND_ERR_INDEX && v.offset == 0 &&
          v.strides[0] == 3 && v.shape[0] == 4);
    CHECK(nd_layout_slice(&v, 0, 3, INT64_MIN, 2) == ND_ERR_INDEX);
    CHECK(nd_layout_slice(&v, 0, 3, -1, 4) == ND_OK && v.offset == 9 && v.strides[0] == -3);
}

static void test_ops(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    nd_array a, b, c;
    CHECK(nd_array_empty(cpu, 2, (int64_t[]){2, 3}, &a) == ND_OK);
    float values[6] = {1, 2, 3, 4, 5, 6};
    CHECK(nd_array_from_host(&a, values) == ND_OK);
    CHECK(nd_array_empty(cpu, 1, (int64_t[]){3}, &b) == ND_OK);
    CHECK(nd_array_fill(&b, 10.0f) == ND_OK);
    nd_operand x = {&a, 0}, y = {&b, 0};
    CHECK(nd_array_binary(ND_ADD, x, y, &c) == ND_OK);
    float host[6];
    CHECK(nd_array_to_host(&c, host) == ND_OK && host[0] == 11 && host[5] == 16);
    nd_array_release(&c);
    nd_operand two = {NULL, 2.0f};
    CHECK(nd_array_binary(ND_SUB, two, x, &c) == ND_OK);
    CHECK(nd_array_to_host(&c, host) == ND_OK && host[0] == 1 && host[5] == -4);
    nd_array_release(&c);
    CHECK(nd_array_reduce(ND_REDUCE_SUM, &a, 1u << 1, 0, &c) == ND_OK && c.layout.ndim == 1);
    CHECK(nd_array_to_host(&c, host) == ND_OK && host[0] == 6 && host[1] == 15);
    nd_array_release(&c);
    CHECK(nd_array_reduce(ND_REDUCE_MAX, &a, 1u << 0, 1, &c) == ND_OK && c.layout.ndim == 2);
    CHECK(nd_array_to_host(&c, host) == ND_OK && host[0] == 4 && host[2] == 6);
    nd_array_release(&c);
    /* (2,3) @ (3,) -> (2,) */
    CHECK(nd_array_matmul(&a, &b, &c) == ND_OK && c.layout.ndim == 1 && c.layout.shape[0] == 2);
    CHECK(nd_array_to_host(&c, host) == ND_OK && host[0] == 60 && host[1] == 150);
    nd_array_release(&c);
    CHECK(nd_array_matmul(&a, &a, &c) == ND_ERR_SHAPE);
    CHECK(nd_array_unary(ND_EXP, &a, &c) == ND_OK);
    CHECK(nd_array_to_host(&c, host) == ND_OK && fabsf(host[0] - expf(1.0f)) < 1e-6f);
    nd_array_release(&c);
    /* Mixing devices is refused. */
    nd_array z;
    CHECK(nd_array_empty(nd_device_at(1), 1, (int64_t[]){3}, &z) == ND_OK);
    nd_operand w = {&z, 0};
    CHECK(nd_array_binary(ND_ADD, y, w, &c) == ND_ERR_DEVICE);
    nd_array_release(&z);
    /* Overlapping assignment copies the source first, like NumPy. */
    nd_array dst = a, src = a;
    dst.layout.shape[1] = 2;
    dst.layout.offset = 1;
    src.layout.shape[1] = 2;
    CHECK(nd_array_assign(&dst, &src) == ND_OK);
    CHECK(nd_array_to_host(&a, host) == ND_OK && host[1] == 1 && host[2] == 2 && host[4] == 4 &&
          host[5] == 5);
    nd_array_release(&a);
    nd_array_release(&b);
    CHECK(allocated(cpu) == base);
}

/* Large host blocks are cached on free: allocated drops, reserved stays until
 * the cache is emptied; a same-size request reuses the block. */
static void test_large_block_cache(void) {
    nd_device *cpu = nd_device_at(0);
    nd_memory_empty_cache(cpu);
    nd_memory_stats st;
    nd_memory_get_stats(cpu, &st);
    int64_t allocated = st.allocated_current, reserved = st.reserved_current;
    nd_storage *s;
    CHECK(nd_storage_new(cpu, 3 << 20, &s) == ND_OK); /* 12 MiB */
    void *first = nd_storage_buffer(s).data;
    nd_storage_release(s);
    nd_memory_get_stats(cpu, &st);
    CHECK(st.allocated_current == allocated);
    CHECK(st.reserved_current == reserved + (12 << 20));
    CHECK(nd_storage_new(cpu, 3 << 20, &s) == ND_OK);
    CHECK(nd_storage_buffer(s).data == first);
    nd_memory_get_stats(cpu, &st);
    CHECK(st.reserved_current == reserved + (12 << 20));
    nd_storage_release(s);
    CHECK(nd_memory_empty_cache(cpu) == (12 << 20));
    nd_memory_get_stats(cpu, &st);
    CHECK(st.reserved_current == reserved && st.allocated_current == allocated);
    /* With a limit, cached blocks are released before an allocation fails. */
    CHECK(nd_storage_new(cpu, 3 << 20, &s) == ND_OK);
    nd_storage_release(s);
    nd_memory_set_limit(cpu, reserved + (16 << 20));
    CHECK(nd_storage_new(cpu, 2 << 20, &s) == ND_OK); /* 8 MiB: fits only without the cached 12 */
    nd_storage_release(s);
    nd_memory_set_limit(cpu, -1);
    nd_memory_empty_cache(cpu);
}

int main(void) {
    test_large_block_cache();
    test_accounting();
    test_limit();
    test_collect_callback();
    test_layouts();
    test_huge_slice_steps();
    test_ops();
    if (failures == 0) printf("test_engine: all checks passed\n");
    return failures == 0 ? 0 : 1;
}
