/* check.h: what the engine's C unit tests share: CHECK(cond) records a
 * failure with the engine's last error message instead of stopping, so one
 * run reports every failed check (main returns nonzero when failures > 0);
 * and the helpers every test builds arrays and reads memory with. */
#ifndef NEEDLE_TEST_CHECK_H
#define NEEDLE_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static int failures = 0;
#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            printf("FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
                   nd_last_error());                                               \
            failures++;                                                            \
        }                                                                          \
    } while (0)

/* The bytes of live arrays on dev. */
static inline int64_t allocated(nd_device *dev) {
    nd_memory_stats s;
    nd_memory_get_stats(dev, &s);
    return s.allocated_current;
}

/* A new contiguous array on dev holding values (zeros when values is NULL);
 * all zero (no storage) when it cannot be made. */
static inline nd_array make(nd_device *dev, int ndim, const int64_t *shape, const float *values) {
    nd_array a;
    memset(&a, 0, sizeof a);
    if (nd_array_empty(dev, ndim, shape, &a) != ND_OK) return a;
    if (values != NULL) nd_array_from_host(&a, values);
    else nd_array_fill(&a, 0.0f);
    return a;
}

/* a's elements in a new host buffer (the caller frees it), or NULL. */
static inline float *host_copy(const nd_array *a) {
    int64_t n = nd_layout_numel(&a->layout);
    float *h = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (h != NULL && nd_array_to_host(a, h) != ND_OK) {
        free(h);
        return NULL;
    }
    return h;
}

#endif /* NEEDLE_TEST_CHECK_H */
