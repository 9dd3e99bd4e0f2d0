/* test_softmax.c: unit tests of the softmax row kernels (csrc/softmax.c,
 * cpu_softmax.c, cpu_parallel.c) through the engine's headers: values
 * against double-precision sums, the statistics a loss keeps (used only when
 * they are its own), the same bits on any thread count, the row split itself,
 * and every error path leaving the allocator's books as they were.
 * Built and run by tests/test_engine_c.py; prints failures, exits nonzero. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static int same_bits(const nd_array *a, const nd_array *b) {
    int64_t n = nd_layout_numel(&a->layout);
    if (n != nd_layout_numel(&b->layout)) return 0;
    float *x = host_copy(a), *y = host_copy(b);
    int same = x != NULL && y != NULL && memcmp(x, y, sizeof(float) * (size_t)n) == 0;
    free(x);
    free(y);
    return same;
}

/* Rows whose max grows along the row: the kernel rescales its running sum. */
enum { ROWS = 3, COLS = 5000 };
static float logits[ROWS * COLS];

static void fill_logits(void) {
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < COLS; j++)
            logits[r * COLS + j] = (float)(-30.0 + 60.0 * j / COLS + sin(j * 0.7 + r));
}

static double lse_ref(const float *x, int64_t n) {
    double m = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    for (int64_t j = 0; j < n; j++) s += exp(x[j] - m);
    return m + log(s);
}

static void test_rows(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    nd_array a = make(cpu, 2, (int64_t[]){ROWS, COLS}, logits), lse, soft, logsoft;
    CHECK(nd_array_logsumexp_last(&a, 0, &lse) == ND_OK);
    CHECK(lse.layout.ndim == 1 && lse.layout.shape[0] == ROWS);
    CHECK(nd_array_softmax_last(&a, 0, &soft) == ND_OK);
    CHECK(nd_array_softmax_last(&a, 1, &logsoft) == ND_OK);
    float *l = host_copy(&lse), *p = host_copy(&soft), *lp = host_copy(&logsoft);
    CHECK(l != NULL && p != NULL && lp != NULL);
    for (int r = 0; l && p && lp && r < ROWS; r++) {
        double want = lse_ref(logits + r * COLS, COLS), total = 0.0;
        CHECK(fabs(l[r] - want) <= 1e-6 * fabs(want));
        for (int j = 0; j < COLS; j++) {
            double ref = exp(logits[r * COLS + j] - want);
            total += p[r * COLS + j];
            CHECK(fabs(p[r * COLS + j] - ref) <= 1e-6 * ref + 1e-9);
            CHECK(fabs(lp[r * COLS + j] - (logits[r * COLS + j] - want)) <= 1e-5);
        }
        CHECK(fabs(total - 1.0) < 1e-5);
    }
    free(l);
    free(p);
    free(lp);
    nd_array_release(&lse);
    nd_array_release(&soft);
    nd_array_release(&logsoft);

    /* keepdims, and a view whose rows are not contiguous (compacted first) */
    nd_array t = a;
    CHECK(nd_layout_permute(&a.layout, (int[]){1, 0}, &t.layout) == ND_OK);
    CHECK(nd_array_logsumexp_last(&t, 1, &lse) == ND_OK);
    CHECK(lse.layout.ndim == 2 && lse.layout.shape[0] == COLS && lse.layout.shape[1] == 1);
    l = host_copy(&lse);
    float col[ROWS];
    for (int r = 0; r < ROWS; r++) col[r] = logits[r * COLS + 17];
    CHECK(l != NULL && fabs(l[17] - lse_ref(col, ROWS)) < 1e-5);
    free(l);
    nd_array_release(&lse);

    /* an empty last axis: log(0) */
    nd_array empty;
    CHECK(nd_array_empty(cpu, 2, (int64_t[]){2, 0}, &empty) == ND_OK);
    CHECK(nd_array_logsumexp_last(&empty, 0, &lse) == ND_OK);
    l = host_copy(&lse);
    CHECK(l != NULL && isinf(l[0]) && l[0] < 0 && isinf(l[1]));
    free(l);
    nd_array_release(&lse);
    nd_array_release(&empty);
    nd_array_release(&a);
    CHECK(allocated(cpu) == base);
}

static void test_xent_statistics(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    nd_array z = make(cpu, 2, (int64_t[]){ROWS, COLS}, logits);
    nd_array y = make(cpu, 1, (int64_t[]){ROWS}, (float[]){0, COLS - 1, 1234});
    nd_array g = make(cpu, 1, (int64_t[]){1}, (float[]){2.0f});
    nd_array loss, fast, fresh, swapped;
    CHECK(nd_array_softmax_xent(&z, &y, &loss) == ND_OK);
    /* the loss is one element after the (N, 2) statistics of its storage */
    CHECK(nd_layout_numel(&loss.layout) == 1 && loss.layout.offset == 2 * ROWS);
    CHECK(nd_storage_numel(loss.storage) == 2 * ROWS + 1);
    float value;
    CHECK(nd_array_to_host(&loss, &value) == ND_OK);
    double want = 0.0;
    for (int r = 0; r < ROWS; r++) {
        int label = r == 0 ? 0 : r == 1 ? COLS - 1 : 1234;
        want += lse_ref(logits + r * COLS, COLS) - logits[r * COLS + label];
    }
    CHECK(fabs(value - want / ROWS) <= 1e-6 * fabs(want / ROWS));

    CHECK(nd_array_softmax_xent_grad(&z, &y, &loss, &g, &fast) == ND_OK);
    CHECK(nd_array_softmax_xent_grad(&z, &y, NULL, &g, &fresh) == ND_OK);
    CHECK(same_bits(&fast, &fresh));
    float *gr = host_copy(&fast);
    CHECK(gr != NULL &&
          fabs(gr[0] - 2.0 * (exp(logits[0] - lse_ref(logits, COLS)) - 1) / ROWS) < 1e-6);
    free(gr);

    /* statistics written over: not used, the gradient is still right */
    float *stats = nd_storage_buffer(loss.storage).data;
    stats[1] *= 2.0f;
    CHECK(nd_array_softmax_xent_grad(&z, &y, &loss, &g, &swapped) == ND_OK);
    CHECK(same_bits(&swapped, &fresh));
    nd_array_release(&swapped);
    /* the loss of other logits (the same shape) is not used either */
    stats[1] /= 2.0f;
    nd_array other_z = make(cpu, 2, (int64_t[]){ROWS, COLS}, logits), other;
    nd_array_fill(&other_z, 0.5f);
    CHECK(nd_array_softmax_xent(&other_z, &y, &other) == ND_OK);
    CHECK(nd_array_softmax_xent_grad(&z, &y, &other, &g, &swapped) == ND_OK);
    CHECK(same_bits(&swapped, &fresh));
    nd_array_release(&swapped);
    nd_array_release(&other);
    nd_array_release(&other_z);

    nd_array_release(&fast);
    nd_array_release(&fresh);
    nd_array_release(&loss);
    nd_array_release(&g);
    nd_array_release(&y);
    nd_array_release(&z);
    CHECK(allocated(cpu) == base);
}

static void test_threads(void) {
    nd_device *cpu = nd_device_at(0);
    enum { N = 257, C = 700 };
    float *v = malloc(sizeof(float) * N * C), labels[N];
    CHECK(v != NULL);
    if (v == NULL) return;
    for (int i = 0; i < N * C; i++) v[i] = (float)(10.0 * sin(i * 0.37));
    for (int r = 0; r < N; r++) labels[r] = (float)((r * 31) % C);
    nd_array z = make(cpu, 2, (int64_t[]){N, C}, v), y = make(cpu, 1, (int64_t[]){N}, labels);
    nd_array loss[3], grad[3];
    int counts[3] = {1, 2, 5};
    for (int k = 0; k < 3; k++) {
        nd_cpu_set_threads(counts[k]);
        CHECK(nd_cpu_get_threads() == counts[k]);
        CHECK(nd_array_softmax_xent(&z, &y, &loss[k]) == ND_OK);
        CHECK(nd_array_softmax_xent_grad(&z, &y, &loss[k], NULL, &grad[k]) == ND_OK);
    }
    for (int k = 1; k < 3; k++) {
        CHECK(same_bits(&loss[k], &loss[0]));
        CHECK(same_bits(&grad[k], &grad[0]));
    }
    for (int k = 0; k < 3; k++) {
        nd_array_release(&loss[k]);
        nd_array_release(&grad[k]);
    }
    nd_cpu_set_threads(0);
    CHECK(nd_cpu_get_threads() >= 1);
    nd_array_release(&z);
    nd_array_release(&y);
    free(v);
}

/* nd_cpu_parallel_for covers [0, n) once, in ranges of at least grain. */
static void count_range(void *ctx, int64_t begin, int64_t end) {
    int *seen = ctx;
    for (int64_t i = begin; i < end; i++) seen[i]++;
}

static void test_parallel_for(void) {
    static int seen[1000];
    const int64_t grains[] = {1, 7, 333, 1000, 5000};
    for (int t = 1; t <= 9; t += 4) {
        nd_cpu_set_threads(t);
        for (size_t k = 0; k < sizeof grains / sizeof grains[0]; k++) {
            memset(seen, 0, sizeof seen);
            nd_cpu_parallel_for(1000, grains[k], count_range, seen);
            int once = 1;
            for (int i = 0; i < 1000; i++) once &= seen[i] == 1;
            CHECK(once);
        }
    }
    nd_cpu_parallel_for(0, 1, count_range, seen); /* nothing to do */
    nd_cpu_set_threads(0);
}

static void test_errors(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    nd_array z = make(cpu, 2, (int64_t[]){2, 3}, (float[]){0, 1, 2, 3, 4, 5}), out;
    static const float bad[][2] = {{0, 3}, {-1, 0}, {1.5f, 0}, {NAN, 0}, {INFINITY, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nd_array y = make(cpu, 1, (int64_t[]){2}, bad[i]);
        CHECK(nd_array_softmax_xent(&z, &y, &out) == ND_ERR_INDEX && out.storage == NULL);
        CHECK(strstr(nd_last_error(), "label") != NULL);
        CHECK(nd_array_softmax_xent_grad(&z, &y, NULL, NULL, &out) == ND_ERR_INDEX);
        CHECK(out.storage == NULL);
        nd_array_release(&y);
    }
    nd_array y3 = make(cpu, 1, (int64_t[]){3}, (float[]){0, 0, 0});
    CHECK(nd_array_softmax_xent(&z, &y3, &out) == ND_ERR_SHAPE);
    nd_array y = make(cpu, 1, (int64_t[]){2}, (float[]){0, 1});
    nd_array g2 = make(cpu, 1, (int64_t[]){2}, (float[]){1, 1});
    CHECK(nd_array_softmax_xent_grad(&z, &y, NULL, &g2, &out) == ND_ERR_SHAPE);
    nd_array other = make(nd_host_device_register("cpu_numpy"), 1, (int64_t[]){2}, (float[]){0, 1});
    CHECK(nd_array_softmax_xent(&z, &other, &out) == ND_ERR_DEVICE);
    nd_array scalar = make(cpu, 0, NULL, (float[]){1});
    CHECK(nd_array_softmax_last(&scalar, 0, &out) == ND_ERR_SHAPE && out.storage == NULL);
    nd_array_release(&scalar);
    nd_array_release(&other);
    nd_array_release(&g2);
    nd_array_release(&y);
    nd_array_release(&y3);
    nd_array_release(&z);
    CHECK(allocated(cpu) == base);
}

int main(void) {
    fill_logits();
    test_rows();
    test_xent_statistics();
    test_threads();
    test_parallel_for();
    test_errors();
    if (failures > 0) printf("%d check(s) failed\n", failures);
    return failures > 0;
}
