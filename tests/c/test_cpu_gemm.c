/* test_cpu_gemm.c: checks needle's SGEMM (csrc/cpu/cpu_gemm.c) against a naive
 * double-precision reference, with each micro-kernel this CPU can run
 * (baseline, AVX2, AVX-512), over every transpose combination, alpha/beta
 * cases, padded leading dimensions and sizes chosen to hit empty, tiny,
 * exact-tile and ragged-edge shapes of every kernel's tiles and of the
 * blocking, packed and unpacked.
 *
 * Built and run by tests/test_engine_c.py (with every engine source).
 */
#include "engine.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* A fixed-seed generator keeps failures reproducible across platforms. */
static float rand_float(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static int failures = 0;
static int cases = 0;

/* Sentinel written into the padding of C: it must survive untouched. */
#define PAD_VALUE 12345.0f

static void run_case(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                     int64_t pad) {
    /* Stored shapes: A is (ta ? k x m : m x k), B is (tb ? n x k : k x n). */
    const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
    const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
    const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;

    float *a = malloc((size_t)(a_rows * lda + 1) * sizeof(float));
    float *b = malloc((size_t)(b_rows * ldb + 1) * sizeof(float));
    float *c = malloc((size_t)(m * ldc + 1) * sizeof(float));
    float *c0 = malloc((size_t)(m * ldc + 1) * sizeof(float));
    if (!a || !b || !c || !c0) {
        printf("FAIL: out of memory\n");
        failures++;
        free(a), free(b), free(c), free(c0);
        return;
    }
    for (int64_t i = 0; i < a_rows * lda; ++i) a[i] = rand_float();
    for (int64_t i = 0; i < b_rows * ldb; ++i) b[i] = rand_float();
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldc; ++j)
            c[i * ldc + j] = j >= n ? PAD_VALUE : (beta == 0.0f ? NAN : rand_float());
    for (int64_t i = 0; i < m * ldc; ++i) c0[i] = c[i];

    nd_cpu_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    cases++;

    int bad = 0;
    for (int64_t i = 0; i < m && bad < 5; ++i) {
        for (int64_t j = 0; j < ldc && bad < 5; ++j) {
            const float got = c[i * ldc + j];
            if (j >= n) {
                if (got != PAD_VALUE) {
                    printf("FAIL ta=%d tb=%d m=%lld n=%lld k=%lld alpha=%g beta=%g pad=%lld: "
                           "padding C[%lld][%lld] overwritten with %g\n",
                           ta, tb, (long long)m, (long long)n, (long long)k, alpha, beta,
                           (long long)pad, (long long)i, (long long)j, got);
                    bad++;
                }
                continue;
            }
            double dot = 0.0, mag = 0.0;
            for (int64_t p = 0; p < k; ++p) {
                const double av = ta ? a[p * lda + i] : a[i * lda + p];
                const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                dot += av * bv;
                mag += fabs(av * bv);
            }
            double ref = (double)alpha * dot;
            double tol_mag = fabs((double)alpha) * mag;
            if (beta != 0.0f) {
                ref += (double)beta * c0[i * ldc + j];
                tol_mag += fabs((double)beta * c0[i * ldc + j]);
            }
            const double tol = 1e-4 * tol_mag + 1e-6;
            if (!(fabs((double)got - ref) <= tol)) {
                printf("FAIL ta=%d tb=%d m=%lld n=%lld k=%lld alpha=%g beta=%g pad=%lld: "
                       "C[%lld][%lld] = %.9g, expected %.9g (tol %.3g)\n",
                       ta, tb, (long long)m, (long long)n, (long long)k, alpha, beta,
                       (long long)pad, (long long)i, (long long)j, got, ref, tol);
                bad++;
            }
        }
    }
    if (bad) failures++;
    free(a), free(b), free(c), free(c0);
}

static void run_all(void) {
    static const int64_t sizes[] = {0, 1, 2, 3, 7, 17, 33, 64, 65, 127, 200};
    static const int64_t shapes[][3] = {
        {1, 300, 5},    {300, 1, 300},  {129, 257, 65}, {5, 1, 300},  {1, 1, 1000},
        {97, 513, 257}, {6, 16, 256},   {12, 32, 512},  {7, 17, 257}, {300, 3, 1},
        {0, 5, 7},      {5, 0, 7},      {5, 7, 0},      {8, 32, 8},   {6, 16, 7},
        {13, 20, 32},   {200, 300, 40}, {140, 10, 300}, {20, 20, 32}, {20, 32, 20},
    };
    static const struct {
        float alpha, beta;
    } ab[] = {
        {1.0f, 0.0f}, {1.0f, 1.0f}, {0.75f, 0.5f}, {-2.0f, 0.0f}, {0.0f, 0.5f},
    };
    const size_t n_sizes = sizeof sizes / sizeof sizes[0];
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    const size_t n_ab = sizeof ab / sizeof ab[0];

    for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
            /* Square sizes, every alpha/beta, tight and padded strides. */
            for (size_t s = 0; s < n_sizes; ++s)
                for (size_t v = 0; v < n_ab; ++v)
                    run_case(ta, tb, sizes[s], sizes[s], sizes[s], ab[v].alpha, ab[v].beta,
                             v % 2 ? 3 : 0);
            /* Mixed sizes: every (m, n, k) triple of a smaller set. */
            static const int64_t mixed[] = {1, 3, 17, 65};
            for (size_t i = 0; i < 4; ++i)
                for (size_t j = 0; j < 4; ++j)
                    for (size_t l = 0; l < 4; ++l)
                        run_case(ta, tb, mixed[i], mixed[j], mixed[l], 1.5f, 0.5f, (i + j + l) % 3);
            for (size_t s = 0; s < n_shapes; ++s)
                for (size_t v = 0; v < 3; ++v)
                    run_case(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], ab[v].alpha,
                             ab[v].beta, v == 2 ? 5 : 0);
        }
    }
}

int main(void) {
    for (int isa = 0; isa < ND_CPU_ISA_COUNT; isa++) {
        if (!nd_cpu_isa_supported((nd_cpu_isa)isa)) {
            printf("test_cpu_gemm: %s not supported here, skipped\n", nd_cpu_isa_name(isa));
            continue;
        }
        if (nd_cpu_set_isa((nd_cpu_isa)isa) != ND_OK) {
            printf("FAIL: nd_cpu_set_isa(%s): %s\n", nd_cpu_isa_name(isa), nd_last_error());
            return 1;
        }
        int before = failures;
        run_all();
        printf("test_cpu_gemm: %s kernel: %d failed cases\n", nd_cpu_isa_name(isa),
               failures - before);
    }
    if (nd_cpu_set_isa(ND_CPU_ISA_COUNT) == ND_OK) {
        printf("FAIL: an unknown ISA was accepted\n");
        failures++;
    }
    if (failures) {
        printf("test_cpu_gemm: %d of %d cases FAILED\n", failures, cases);
        return 1;
    }
    printf("test_cpu_gemm: all %d cases passed\n", cases);
    return 0;
}
