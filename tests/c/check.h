/* check.h: the assertion the engine's C unit tests share: CHECK(cond) records
 * a failure with the engine's last error message instead of stopping, so one
 * run reports every failed check; main returns nonzero when failures > 0. */
#ifndef NEEDLE_TEST_CHECK_H
#define NEEDLE_TEST_CHECK_H

#include <stdio.h>

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

#endif /* NEEDLE_TEST_CHECK_H */
