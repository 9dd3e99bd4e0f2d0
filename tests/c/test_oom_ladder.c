/* test_oom_ladder.c: unit tests of nd_memory_retry, the engine's one
 * out-of-memory ladder, which nd_memory_alloc and the CUDA backend's cuBLAS
 * setup (memory taken outside the allocator) both run: the order of its
 * steps (try, release the cache, collect, try again), what it counts, that
 * it returns whatever the attempt last said and records no OOM itself, and
 * that no collection starts while one is running. Built and run by
 * tests/test_engine_c.py; prints failures, exits nonzero. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#include "check.h"

/* An attempt that fails with ND_ERR_OOM until `succeed_after` tries, and
 * writes the order of events into a log. */
static char log_text[64];
static int tries = 0, succeed_after = 0;
static nd_status fail_with = ND_ERR_OOM;

static void note(char c) {
    size_t n = strlen(log_text);
    if (n + 1 >= sizeof log_text) return;
    log_text[n] = c;
    log_text[n + 1] = '\0';
}

static nd_status attempt(void *ctx) {
    (void)ctx;
    note('a');
    return ++tries >= succeed_after ? ND_OK : fail_with;
}

static int64_t asked = 0;
static nd_status inner_status = ND_OK;
static int nest = 0;

static void collect(void *ctx, nd_device *dev, int64_t requested, nd_collect_reason reason) {
    (void)ctx;
    note(reason == ND_COLLECT_OOM ? 'C' : 'P');
    asked = requested;
    /* A ladder run by code inside the collection (a finalizer's) must not collect again. */
    if (nest) {
        int before = tries;
        succeed_after = tries + 100;
        inner_status = nd_memory_retry(dev, 8, attempt, NULL);
        succeed_after = before + 1; /* the outer ladder's next try succeeds */
    }
}

static void reset(int after) {
    log_text[0] = '\0';
    tries = 0;
    succeed_after = after;
    fail_with = ND_ERR_OOM;
    asked = 0;
}

static nd_memory_stats stats(nd_device *dev) {
    nd_memory_stats s;
    nd_memory_get_stats(dev, &s);
    return s;
}

static void test_ladder_order_and_counts(void) {
    nd_device *cpu = nd_device_at(0);
    nd_memory_set_collect_callback(collect, NULL);
    nd_memory_empty_cache(cpu);

    reset(1); /* first try works: nothing else happens */
    nd_memory_stats before = stats(cpu);
    CHECK(nd_memory_retry(cpu, 1000, attempt, NULL) == ND_OK);
    CHECK(strcmp(log_text, "a") == 0);
    CHECK(stats(cpu).num_alloc_retries == before.num_alloc_retries);

    reset(2); /* nothing cached to release: straight to the collection */
    before = stats(cpu);
    CHECK(nd_memory_retry(cpu, 1000, attempt, NULL) == ND_OK);
    CHECK(strcmp(log_text, "aCa") == 0);
    CHECK(asked == 1000);
    CHECK(stats(cpu).num_alloc_retries == before.num_alloc_retries + 1);
    CHECK(stats(cpu).num_collect_callbacks == before.num_collect_callbacks + 1);

    reset(100); /* never works: the last status comes back, no OOM recorded */
    before = stats(cpu);
    CHECK(nd_memory_retry(cpu, 77, attempt, NULL) == ND_ERR_OOM);
    CHECK(strcmp(log_text, "aCa") == 0);
    CHECK(stats(cpu).num_ooms == before.num_ooms);

    reset(100); /* only ND_ERR_OOM climbs the ladder */
    fail_with = ND_ERR_BACKEND;
    CHECK(nd_memory_retry(cpu, 77, attempt, NULL) == ND_ERR_BACKEND);
    CHECK(strcmp(log_text, "a") == 0);

    nd_memory_set_collect_callback(NULL, NULL);
    reset(100); /* no host callback: try, and that is all there is to do */
    CHECK(nd_memory_retry(cpu, 77, attempt, NULL) == ND_ERR_OOM);
    CHECK(strcmp(log_text, "a") == 0);
}

static void test_cached_blocks_are_released_first(void) {
    nd_device *cpu = nd_device_at(0);
    /* A large host block freed stays cached (cpu_memory.c): the ladder's first
     * step gives it back and retries, and the collection is not needed. */
    nd_memory_empty_cache(cpu);
    nd_storage *big;
    CHECK(nd_storage_new(cpu, (int64_t)1 << 22, &big) == ND_OK); /* 16 MiB */
    nd_storage_release(big);
    nd_memory_set_collect_callback(collect, NULL);
    reset(2);
    nd_memory_stats before = stats(cpu);
    CHECK(nd_memory_retry(cpu, 5, attempt, NULL) == ND_OK);
    nd_memory_stats after = stats(cpu);
    CHECK(strcmp(log_text, "aa") == 0);
    CHECK(before.reserved_current - after.reserved_current == (int64_t)16 << 20);
    CHECK(after.num_alloc_retries == before.num_alloc_retries + 1);
    CHECK(after.num_collect_callbacks == before.num_collect_callbacks);
    nd_memory_set_collect_callback(NULL, NULL);
}

static void test_no_collection_inside_a_collection(void) {
    nd_device *cpu = nd_device_at(0);
    nd_memory_set_collect_callback(collect, NULL);
    nd_memory_empty_cache(cpu);
    reset(2);
    nest = 1;
    CHECK(nd_memory_retry(cpu, 64, attempt, NULL) == ND_OK);
    nest = 0;
    /* outer try, its collection, the inner ladder's one try (no 'C'), outer retry */
    CHECK(strcmp(log_text, "aCaa") == 0);
    CHECK(inner_status == ND_ERR_OOM);
    CHECK(!nd_memory_collecting());
    nd_memory_set_collect_callback(NULL, NULL);
}

int main(void) {
    test_ladder_order_and_counts();
    test_cached_blocks_are_released_first();
    test_no_collection_inside_a_collection();
    if (failures == 0) printf("test_oom_ladder: all checks passed\n");
    return failures == 0 ? 0 : 1;
}
