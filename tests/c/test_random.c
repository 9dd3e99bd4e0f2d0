/* test_random.c: unit tests of the engine's random fills: philox.h's
 * Philox4x32-10 against the published known answers (Random123's
 * kat_vectors), the element-to-counter mapping through nd_array_fill_random,
 * the distributions' ranges, and every bad request refused with ND_ERR_VALUE
 * and nothing written.
 * Built and run by tests/test_engine_c.py; prints failures, exits nonzero. */
#include "engine.h"
#include "philox.h"

#include <math.h>
#include <string.h>

#include "check.h"

static void test_known_answers(void) {
    static const uint32_t cases[3][10] = {
        /* counter (4), key (2), expected (4) */
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int c = 0; c < 3; c++) {
        nd_philox4 ctr = {{cases[c][0], cases[c][1], cases[c][2], cases[c][3]}};
        nd_philox4 out = nd_philox4x32_10(ctr, cases[c][4], cases[c][5]);
        for (int j = 0; j < 4; j++) CHECK(out.v[j] == cases[c][6 + j]);
    }
    /* The block function puts the block index in the counter's low words and
     * the stream in its high words: the third case again, through it. */
    float values[4];
    nd_random_block(ND_RANDOM_UNIFORM, 0x299f31d0a4093822ull, 0x0370734413198a2eull,
                    0x85a308d3243f6a88ull, 0.0f, values);
    for (int j = 0; j < 4; j++)
        CHECK(values[j] == (float)(cases[2][6 + j] >> 8) * (1.0f / 16777216.0f));
}

static void test_conversions(void) {
    /* The extremes of a word: uniform 0 and 1 - 2^-24 (never 1); the normal's
     * radius at its largest and at 0, all finite. */
    CHECK(nd_philox_uniform(0) == 0.0f);
    CHECK(nd_philox_uniform(0xffffffffu) == 1.0f - 1.0f / 16777216.0f);
    float z0, z1;
    nd_philox_normal2(0, 0, &z0, &z1);
    CHECK(isfinite(z0) && fabsf(z0 - sqrtf(-2.0f * logf(1.0f / 16777216.0f))) < 1e-5f);
    CHECK(z1 == 0.0f);
    nd_philox_normal2(0xffffffffu, 0x12345678u, &z0, &z1);
    CHECK(z0 == 0.0f && z1 == 0.0f);
}

static void test_fill(void) {
    nd_device *cpu = nd_device_at(0);
    nd_array a;
    CHECK(nd_array_empty(cpu, 2, (int64_t[]){3, 5}, &a) == ND_OK);
    nd_random_params params = {ND_RANDOM_UNIFORM, 0, 0, 0.0f, NULL};
    CHECK(nd_array_fill_random(&a, &params) == ND_OK);
    float host[15];
    CHECK(nd_array_to_host(&a, host) == ND_OK);
    static const uint32_t first[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    for (int j = 0; j < 4; j++) CHECK(host[j] == nd_philox_uniform(first[j]));
    for (int i = 0; i < 15; i++) CHECK(host[i] >= 0.0f && host[i] < 1.0f);
    /* Element 14 is word 2 of block 3, whatever the fill's size. */
    float block3[4];
    nd_random_block(ND_RANDOM_UNIFORM, 0, 0, 3, 0.0f, block3);
    CHECK(host[14] == block3[2]);

    params.kind = ND_RANDOM_BERNOULLI;
    params.p = 0.5f;
    float bern[15];
    CHECK(nd_array_fill_random(&a, &params) == ND_OK && nd_array_to_host(&a, bern) == ND_OK);
    for (int i = 0; i < 15; i++) CHECK(bern[i] == (host[i] <= 0.5f ? 1.0f : 0.0f));

    /* Bad requests: nothing written. */
    float before[15], after[15];
    CHECK(nd_array_to_host(&a, before) == ND_OK);
    nd_random_params bad = {ND_RANDOM_BERNOULLI, 1, 0, -0.25f, NULL};
    CHECK(nd_array_fill_random(&a, &bad) == ND_ERR_VALUE);
    CHECK(strstr(nd_last_error(), "[0, 1]") != NULL);
    bad.p = 1.5f;
    CHECK(nd_array_fill_random(&a, &bad) == ND_ERR_VALUE);
    bad.p = NAN;
    CHECK(nd_array_fill_random(&a, &bad) == ND_ERR_VALUE);
    bad.kind = ND_RANDOM_KIND_COUNT;
    bad.p = 0.5f;
    CHECK(nd_array_fill_random(&a, &bad) == ND_ERR_VALUE);
    CHECK(nd_array_fill_random(&a, NULL) == ND_ERR_VALUE);
    nd_array view = a;
    CHECK(nd_layout_slice(&view.layout, 1, 0, 2, 3) == ND_OK); /* columns 0, 2, 4 */
    CHECK(nd_array_fill_random(&view, &params) == ND_ERR_VALUE);
    CHECK(strstr(nd_last_error(), "contiguous") != NULL);
    CHECK(nd_array_to_host(&a, after) == ND_OK);
    CHECK(memcmp(before, after, sizeof before) == 0);

    /* An empty array is filled by doing nothing. */
    nd_array empty;
    CHECK(nd_array_empty(cpu, 2, (int64_t[]){0, 4}, &empty) == ND_OK);
    CHECK(nd_array_fill_random(&empty, &params) == ND_OK);
    nd_array_release(&empty);
    nd_array_release(&a);
}

int main(void) {
    test_known_answers();
    test_conversions();
    test_fill();
    if (failures) printf("%d check(s) failed\n", failures);
    return failures != 0;
}
