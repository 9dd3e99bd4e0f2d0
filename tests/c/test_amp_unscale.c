/* test_amp_unscale.c: unit tests of GradScaler's engine op
 * (csrc/amp_unscale.c, cpu_amp.c) through the engine's headers: the
 * multiply in place through strided views (the rest of the storage
 * untouched), the flag set by inf and NaN and never cleared, each element of
 * memory multiplied once however many views reach it, and every refusal
 * writing nothing. Built and run by tests/test_engine_c.py; prints failures,
 * exits nonzero. */
#include "internal.h"

#include <math.h>

#include "check.h"

static float read1(const nd_array *a) {
    float x = -1.0f;
    CHECK(nd_array_to_host(a, &x) == ND_OK);
    return x;
}

/* A view of base with the given layout (no new storage; the caller releases
 * base only). */
static nd_array view_of(const nd_array *base, const nd_layout *l) {
    nd_array v = *base;
    v.layout = *l;
    return v;
}

static void test_strided_views(nd_device *dev) {
    enum { R = 6, C = 8 };
    float host[R * C], want[R * C];
    for (int i = 0; i < R * C; i++) host[i] = want[i] = (float)i * 4.0f;
    int64_t shape[2] = {R, C}, one = 1;
    nd_array bucket = make(dev, 2, shape, host), flag = make(dev, 1, &one, NULL);
    /* rows 0..2, transposed (8, 3); and rows 4..5, every other column (2, 4) */
    nd_layout a = bucket.layout, b = bucket.layout;
    CHECK(nd_layout_slice(&a, 0, 0, 1, 3) == ND_OK);
    nd_layout at;
    CHECK(nd_layout_permute(&a, (int[]){1, 0}, &at) == ND_OK);
    CHECK(nd_layout_slice(&b, 0, 4, 1, 2) == ND_OK && nd_layout_slice(&b, 1, 0, 2, 4) == ND_OK);
    nd_array va = view_of(&bucket, &at), vb = view_of(&bucket, &b);
    const nd_array *grads[2] = {&va, &vb};
    CHECK(nd_array_amp_unscale(grads, 2, &flag, 0.25f) == ND_OK);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            if (r < 3 || (r >= 4 && c % 2 == 0)) want[r * C + c] *= 0.25f;
    float got[R * C];
    CHECK(nd_array_to_host(&bucket, got) == ND_OK);
    CHECK(memcmp(got, want, sizeof got) == 0);
    CHECK(read1(&flag) == 0.0f);
    nd_array_release(&bucket);
    nd_array_release(&flag);
}

static void test_flag(nd_device *dev) {
    const float bad[3] = {INFINITY, -INFINITY, NAN};
    for (int k = 0; k < 3; k++) {
        float host[5] = {2, 2, 2, 2, 2};
        host[3] = bad[k];
        int64_t n = 5, one = 1;
        nd_array g = make(dev, 1, &n, host), ok = make(dev, 1, &n, NULL);
        nd_array flag = make(dev, 1, &one, NULL);
        const nd_array *grads[2] = {&ok, &g};
        CHECK(nd_array_amp_unscale(grads, 2, &flag, 0.5f) == ND_OK);
        CHECK(read1(&flag) == 1.0f);
        float got[5];
        CHECK(nd_array_to_host(&g, got) == ND_OK);
        CHECK(got[0] == 1.0f && got[4] == 1.0f && !isfinite(got[3]));
        /* A clean call leaves it set. */
        CHECK(nd_array_amp_unscale(grads, 1, &flag, 1.0f) == ND_OK && read1(&flag) == 1.0f);
        nd_array_release(&g);
        nd_array_release(&ok);
        nd_array_release(&flag);
    }
}

/* The same memory through itself and a transpose, given twice: once; a
 * broadcast view's one row: once. */
static void test_each_element_once(nd_device *dev) {
    float host[6] = {8, 8, 8, 8, 8, 8};
    int64_t shape[2] = {2, 3}, one = 1, three = 3;
    nd_array a = make(dev, 2, shape, host), flag = make(dev, 1, &one, NULL);
    nd_array r = make(dev, 1, &three, host);
    nd_layout t, wide;
    CHECK(nd_layout_permute(&a.layout, (int[]){1, 0}, &t) == ND_OK);
    CHECK(nd_layout_broadcast_to(&r.layout, 2, (int64_t[]){4, 3}, &wide) == ND_OK);
    nd_array vt = view_of(&a, &t), vw = view_of(&r, &wide);
    const nd_array *grads[4] = {&a, &vt, &a, &vw};
    CHECK(nd_array_amp_unscale(grads, 4, &flag, 0.5f) == ND_OK);
    float got[6];
    CHECK(nd_array_to_host(&a, got) == ND_OK);
    for (int i = 0; i < 6; i++) CHECK(got[i] == 4.0f);
    CHECK(nd_array_to_host(&r, got) == ND_OK);
    for (int i = 0; i < 3; i++) CHECK(got[i] == 4.0f);
    /* A broadcast of a part of another gradient overlaps it in part. */
    nd_layout row = a.layout, part;
    CHECK(nd_layout_slice(&row, 0, 1, 1, 1) == ND_OK);
    CHECK(nd_layout_broadcast_to(&row, 2, (int64_t[]){4, 3}, &part) == ND_OK);
    nd_array vp = view_of(&a, &part);
    const nd_array *partial[2] = {&a, &vp};
    CHECK(nd_array_amp_unscale(partial, 2, &flag, 0.5f) == ND_ERR_VALUE);
    nd_array_release(&a);
    nd_array_release(&r);
    nd_array_release(&flag);
}

static void test_errors(nd_device *dev) {
    float host[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    int64_t n = 8, one = 1, two = 2;
    nd_array g = make(dev, 1, &n, host), flag = make(dev, 1, &one, NULL);
    nd_array flag2 = make(dev, 1, &two, NULL);
    nd_array other = make(nd_host_device_register("cpu_numpy"), 1, &n, host);
    nd_layout half = g.layout, tail = g.layout, cell = g.layout;
    CHECK(nd_layout_slice(&half, 0, 0, 1, 4) == ND_OK);
    CHECK(nd_layout_slice(&tail, 0, 2, 1, 6) == ND_OK);
    CHECK(nd_layout_slice(&cell, 0, 7, 1, 1) == ND_OK);
    nd_array vh = view_of(&g, &half), vt = view_of(&g, &tail), vc = view_of(&g, &cell);
    const nd_array *overlap[2] = {&vh, &vt};
    CHECK(nd_array_amp_unscale(overlap, 2, &flag, 0.5f) == ND_ERR_VALUE);
    CHECK(strstr(nd_last_error(), "gradients 0 and 1 overlap in memory in part") != NULL);
    const nd_array *mixed[2] = {&g, &other};
    CHECK(nd_array_amp_unscale(mixed, 2, &flag, 0.5f) == ND_ERR_DEVICE);
    CHECK(strstr(nd_last_error(), "gradient 1 is on cpu_numpy()") != NULL);
    const nd_array *single[1] = {&vh};
    CHECK(nd_array_amp_unscale(single, 1, &flag2, 0.5f) == ND_ERR_SHAPE);
    CHECK(nd_array_amp_unscale(single, 1, &vc, 0.5f) == ND_OK); /* disjoint from the flag */
    const nd_array *whole[1] = {&g};
    CHECK(nd_array_amp_unscale(whole, 1, &vc, 0.5f) == ND_ERR_VALUE);
    CHECK(strstr(nd_last_error(), "shares memory with found_inf") != NULL);
    float got[8];
    CHECK(nd_array_to_host(&g, got) == ND_OK);
    for (int i = 0; i < 8; i++) CHECK(got[i] == (i < 4 ? 1.0f : 2.0f));
    CHECK(nd_array_to_host(&other, got) == ND_OK && got[0] == 2.0f);
    CHECK(read1(&flag) == 0.0f);
    CHECK(nd_array_amp_unscale(NULL, 0, &flag, 0.5f) == ND_OK);
    nd_array_release(&g);
    nd_array_release(&flag);
    nd_array_release(&flag2);
    nd_array_release(&other);
}

int main(void) {
    nd_device *cpu = nd_device_at(0);
    test_strided_views(cpu);
    test_flag(cpu);
    test_each_element_once(cpu);
    test_errors(cpu);
    if (failures > 0) printf("%d failure(s)\n", failures);
    return failures > 0;
}
