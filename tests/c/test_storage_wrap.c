/* test_storage_wrap.c: unit tests of nd_storage_wrap, the storage over memory
 * another library owns (DLPack imports): the engine reads and writes it in
 * place, never counts it in the allocator, and hands it back through the
 * release callback exactly once, when the last reference goes.
 * Built and run by tests/test_engine_c.py; prints failures, exits nonzero. */
#include "engine.h"

#include <stdio.h>
#include <string.h>

#include "check.h"

static int released = 0;
static void *released_ctx = NULL;
static void on_release(void *ctx) {
    released++;
    released_ctx = ctx;
}

static void test_wrap_release(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    float buffer[6] = {0, 1, 2, 3, 4, 5};
    int token;
    nd_storage *s;
    CHECK(nd_storage_wrap(cpu, buffer, 6, ND_FLOAT32, on_release, &token, &s) == ND_OK);
    CHECK(nd_storage_buffer(s).data == buffer);
    CHECK(nd_storage_numel(s) == 6);
    CHECK(nd_storage_device(s) == cpu);
    CHECK(nd_storage_refcount(s) == 1);
    /* External memory is not the allocator's. */
    CHECK(allocated(cpu) == base);
    nd_storage_retain(s);
    nd_storage_release(s);
    CHECK(released == 0);
    nd_storage_release(s);
    CHECK(released == 1 && released_ctx == &token);
    CHECK(allocated(cpu) == base);
}

static void test_views_write_through(void) {
    nd_device *cpu = nd_device_at(0);
    float buffer[6] = {0, 1, 2, 3, 4, 5};
    nd_storage *s;
    released = 0;
    CHECK(nd_storage_wrap(cpu, buffer, 6, ND_FLOAT32, on_release, NULL, &s) == ND_OK);
    /* A transposed 2x3 view: the engine writes into the borrowed buffer. */
    nd_array a = {s, {0}};
    int64_t shape[2] = {2, 3};
    CHECK(nd_layout_contiguous(2, shape, &a.layout) == ND_OK);
    int axes[2] = {1, 0};
    nd_layout t;
    CHECK(nd_layout_permute(&a.layout, axes, &t) == ND_OK);
    nd_storage_retain(s);
    nd_array view = {s, t};
    CHECK(nd_array_fill(&view, 7.0f) == ND_OK);
    for (int i = 0; i < 6; i++) CHECK(buffer[i] == 7.0f);
    /* A copy is ordinary engine memory and outlives the borrowed buffer. */
    nd_array copy;
    CHECK(nd_array_compact_copy(&view, NULL, &copy) == ND_OK);
    CHECK(nd_storage_buffer(copy.storage).data != buffer);
    nd_array_release(&view);
    CHECK(released == 0);
    nd_array_release(&a);
    CHECK(released == 1);
    float host[6];
    CHECK(nd_array_to_host(&copy, host) == ND_OK);
    CHECK(host[5] == 7.0f);
    nd_array_release(&copy);
}

static void test_wrap_without_callback(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    float buffer[2] = {1, 2};
    nd_storage *s;
    /* No callback: the engine just drops the header and leaves the memory. */
    CHECK(nd_storage_wrap(cpu, buffer, 2, ND_FLOAT32, NULL, NULL, &s) == ND_OK);
    nd_storage_release(s);
    CHECK(allocated(cpu) == base);
    CHECK(buffer[1] == 2.0f);
    CHECK(nd_storage_wrap(cpu, buffer, -1, ND_FLOAT32, NULL, NULL, &s) == ND_ERR_VALUE &&
          s == NULL);
    CHECK(nd_storage_wrap(cpu, NULL, 4, ND_FLOAT32, NULL, NULL, &s) == ND_ERR_VALUE && s == NULL);
    /* An empty tensor may come with no data pointer. */
    CHECK(nd_storage_wrap(cpu, NULL, 0, ND_FLOAT32, NULL, NULL, &s) == ND_OK);
    nd_storage_release(s);
}

int main(void) {
    test_wrap_release();
    test_views_write_through();
    test_wrap_without_callback();
    if (failures) {
        printf("%d failure(s)\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
