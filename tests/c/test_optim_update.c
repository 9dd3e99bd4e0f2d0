/* test_optim_update.c: unit tests of the fused optimizer updates
 * (csrc/optim_update.c, cpu_optim.c, cpu_optim.inc) through the engine's
 * headers: the bits of a reference written out here in the unfused code's
 * order, in float32 and in float64 (a float64 update computes in float64, not
 * in float32), the same bits from every instruction set and thread count, strided
 * inputs, the state updated in place while the parameter is new, and every
 * error path writing nothing and leaving the allocator's books as they were.
 * Built and run by tests/test_engine_c.py; prints failures, exits nonzero. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* Large enough for the update to split over three threads (3 * 2^18:
 * cpu_optim.c's grain), and a multiple of 11 (the arrays are (N / 11, 11)). */
enum { N = 11 * 71500 };

static int equals_host(const nd_array *a, const float *want, int64_t n) {
    float *h = malloc(sizeof(float) * (size_t)n);
    int same = h != NULL && nd_array_to_host(a, h) == ND_OK &&
               memcmp(h, want, sizeof(float) * (size_t)n) == 0;
    free(h);
    return same;
}

static float p0[N], g0[N], m0[N], v0[N];

static void fill_inputs(void) {
    for (int64_t i = 0; i < N; i++) {
        p0[i] = (float)sin(0.37 * (double)i) * 2.0f;
        g0[i] = (float)cos(0.11 * (double)i + 1.0) * (i % 7 == 0 ? 1e-3f : 1.0f);
        m0[i] = (float)sin(0.05 * (double)i) * 0.1f;
        v0[i] = (float)(1.0 + cos(0.013 * (double)i)) * 0.01f;
    }
}

/* What the host computes in double (needle_c/optim.c), at step 3. */
static const nd_adam_hyper ADAM = {.lr = 0.01,
                                   .beta1 = 0.9,
                                   .one_minus_beta1 = 1.0 - 0.9,
                                   .beta2 = 0.999,
                                   .one_minus_beta2 = 1.0 - 0.999,
                                   .eps = 1e-8,
                                   .weight_decay = 0.01,
                                   .bias_correction1 = 1.0 - 0.9 * 0.9 * 0.9,
                                   .bias_correction2 = 1.0 - 0.999 * 0.999 * 0.999};
static const nd_sgd_hyper SGD = {
    .lr = 0.1, .momentum = 0.9, .one_minus_momentum = 1.0 - 0.9, .weight_decay = 0.01};

/* The unfused code's order, one rounding per operation (ISO C: no FMA); in
 * float32 with each coefficient rounded to float32 first, and in float64. */
static float want_p[N], want_m[N], want_v[N], want_sgd_p[N], want_u[N];
static double want_p64[N], want_m64[N], want_v64[N], want_sgd_p64[N], want_u64[N];

static void references(void) {
    const float lr = (float)ADAM.lr, b1 = (float)ADAM.beta1, c1 = (float)ADAM.one_minus_beta1;
    const float b2 = (float)ADAM.beta2, c2 = (float)ADAM.one_minus_beta2;
    const float eps = (float)ADAM.eps, wd = (float)ADAM.weight_decay;
    const float bc1 = (float)ADAM.bias_correction1, bc2 = (float)ADAM.bias_correction2;
    const float slr = (float)SGD.lr, mom = (float)SGD.momentum;
    const float cm = (float)SGD.one_minus_momentum, swd = (float)SGD.weight_decay;
    for (int64_t i = 0; i < N; i++) {
        float g = g0[i] + p0[i] * wd;
        float m = m0[i] * b1 + g * c1;
        float v = v0[i] * b2 + (g * g) * c2;
        float m_hat = m / bc1, v_hat = v / bc2;
        want_m[i] = m;
        want_v[i] = v;
        want_p[i] = p0[i] - (m_hat * lr) / (sqrtf(v_hat) + eps);
        float gs = g0[i] + p0[i] * swd;
        want_u[i] = m0[i] * mom + gs * cm;
        want_sgd_p[i] = p0[i] - want_u[i] * slr;
    }
    const nd_adam_hyper h = ADAM;
    for (int64_t i = 0; i < N; i++) {
        double p = p0[i], g = g0[i] + p * h.weight_decay;
        double m = m0[i] * h.beta1 + g * h.one_minus_beta1;
        double v = v0[i] * h.beta2 + (g * g) * h.one_minus_beta2;
        double m_hat = m / h.bias_correction1, v_hat = v / h.bias_correction2;
        want_m64[i] = m;
        want_v64[i] = v;
        want_p64[i] = p - (m_hat * h.lr) / (sqrt(v_hat) + h.eps);
        double gs = g0[i] + p * SGD.weight_decay;
        want_u64[i] = m0[i] * SGD.momentum + gs * SGD.one_minus_momentum;
        want_sgd_p64[i] = p - want_u64[i] * SGD.lr;
    }
}

/* A new contiguous float64 array holding values (float32 values widened). */
static nd_array make64(nd_device *dev, int ndim, const int64_t *shape, const float *values) {
    nd_array a;
    memset(&a, 0, sizeof a);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    double *h = malloc(sizeof(double) * (size_t)n);
    if (h == NULL || nd_array_empty_typed(dev, ndim, shape, ND_FLOAT64, &a) != ND_OK) {
        free(h);
        return a;
    }
    for (int64_t i = 0; i < n; i++) h[i] = values[i];
    nd_array_from_host(&a, h);
    free(h);
    return a;
}

static int equals_host64(const nd_array *a, const double *want, int64_t n) {
    double *h = malloc(sizeof(double) * (size_t)n);
    int same = h != NULL && nd_array_dtype(a) == ND_FLOAT64 && nd_array_to_host(a, h) == ND_OK &&
               memcmp(h, want, sizeof(double) * (size_t)n) == 0;
    free(h);
    return same;
}

/* The float64 update from the same start: the float64 reference's bits,
 * and the result differs from the float32 one (it was not computed in it). */
static void check_one_run64(nd_device *dev, const char *what) {
    int64_t shape[2] = {N / 11, 11}, before = allocated(dev);
    nd_array p = make64(dev, 2, shape, p0), g = make64(dev, 2, shape, g0);
    nd_array m = make64(dev, 2, shape, m0), v = make64(dev, 2, shape, v0), out;
    CHECK(nd_array_adam_update(&p, &g, &m, &v, &ADAM, &out) == ND_OK);
    int ok = equals_host64(&out, want_p64, N) && equals_host64(&m, want_m64, N) &&
             equals_host64(&v, want_v64, N);
    if (!ok) printf("FAIL: float64 adam_update differs from the reference with %s\n", what);
    CHECK(ok);
    int64_t differ = 0;
    for (int64_t i = 0; i < N; i++) differ += want_p64[i] != (double)want_p[i];
    CHECK(differ > N / 2);
    nd_array_release(&out);
    nd_array u = make64(dev, 2, shape, m0);
    CHECK(nd_array_sgd_update(&p, &g, &u, &SGD, &out) == ND_OK);
    ok = equals_host64(&out, want_sgd_p64, N) && equals_host64(&u, want_u64, N);
    if (!ok) printf("FAIL: float64 sgd_update differs from the reference with %s\n", what);
    CHECK(ok);
    nd_array_release(&out);
    nd_array_release(&p);
    nd_array_release(&g);
    nd_array_release(&m);
    nd_array_release(&v);
    nd_array_release(&u);
    CHECK(allocated(dev) == before);
}

/* One Adam and one SGD update from the same start, checked bit for bit. */
static void check_one_run(nd_device *dev, const char *what) {
    int64_t shape[2] = {N / 11, 11}, before = allocated(dev);
    nd_array p = make(dev, 2, shape, p0), g = make(dev, 2, shape, g0);
    nd_array m = make(dev, 2, shape, m0), v = make(dev, 2, shape, v0), out;
    CHECK(nd_array_adam_update(&p, &g, &m, &v, &ADAM, &out) == ND_OK);
    int ok = equals_host(&out, want_p, N) && equals_host(&m, want_m, N) &&
             equals_host(&v, want_v, N) && equals_host(&p, p0, N) && equals_host(&g, g0, N);
    if (!ok) printf("FAIL: adam_update differs from the reference with %s\n", what);
    CHECK(ok);
    CHECK(out.storage != p.storage && nd_layout_is_contiguous(&out.layout));
    nd_array_release(&out);
    nd_array u = make(dev, 2, shape, m0);
    CHECK(nd_array_sgd_update(&p, &g, &u, &SGD, &out) == ND_OK);
    ok = equals_host(&out, want_sgd_p, N) && equals_host(&u, want_u, N) && equals_host(&p, p0, N);
    if (!ok) printf("FAIL: sgd_update differs from the reference with %s\n", what);
    CHECK(ok);
    nd_array_release(&out);
    nd_array_release(&p);
    nd_array_release(&g);
    nd_array_release(&m);
    nd_array_release(&v);
    nd_array_release(&u);
    CHECK(allocated(dev) == before);
}

static void test_every_isa_and_thread_count(nd_device *dev) {
    nd_cpu_isa best = nd_cpu_isa_current();
    for (int isa = 0; isa < ND_CPU_ISA_COUNT; isa++) {
        if (!nd_cpu_isa_supported((nd_cpu_isa)isa)) continue;
        CHECK(nd_cpu_set_isa((nd_cpu_isa)isa) == ND_OK);
        for (int threads = 1; threads <= 3; threads += 2) {
            nd_cpu_set_threads(threads);
            char what[64];
            snprintf(what, sizeof what, "isa %s, %d thread(s)", nd_cpu_isa_name(isa), threads);
            check_one_run(dev, what);
            check_one_run64(dev, what);
        }
    }
    nd_cpu_set_threads(0);
    CHECK(nd_cpu_set_isa(best) == ND_OK);
}

/* A transposed parameter and a broadcast gradient: what their compact
 * copies give, and the copies are released. */
static void test_strided_inputs(nd_device *dev) {
    float pt[6] = {1, 4, 2, 5, 3, 6}, pc[6] = {1, 2, 3, 4, 5, 6}, grow[3] = {0.5f, -1, 2};
    float gc[6] = {0.5f, -1, 2, 0.5f, -1, 2}, zeros[6] = {0};
    nd_array base = make(dev, 2, (int64_t[]){3, 2}, pt), p = base;
    CHECK(nd_layout_permute(&base.layout, (int[]){1, 0}, &p.layout) == ND_OK);
    nd_array grow_a = make(dev, 2, (int64_t[]){1, 3}, grow), g = grow_a;
    CHECK(nd_layout_broadcast_to(&grow_a.layout, 2, (int64_t[]){2, 3}, &g.layout) == ND_OK);
    CHECK(!nd_layout_is_contiguous(&p.layout) && !nd_layout_is_contiguous(&g.layout));
    nd_array pc_a = make(dev, 2, (int64_t[]){2, 3}, pc), gc_a = make(dev, 2, (int64_t[]){2, 3}, gc);
    nd_array m1 = make(dev, 2, (int64_t[]){2, 3}, zeros),
             v1 = make(dev, 2, (int64_t[]){2, 3}, zeros);
    nd_array m2 = make(dev, 2, (int64_t[]){2, 3}, zeros),
             v2 = make(dev, 2, (int64_t[]){2, 3}, zeros);
    int64_t before = allocated(dev);
    nd_array out1, out2;
    CHECK(nd_array_adam_update(&p, &g, &m1, &v1, &ADAM, &out1) == ND_OK);
    CHECK(nd_array_adam_update(&pc_a, &gc_a, &m2, &v2, &ADAM, &out2) == ND_OK);
    float a[6], b[6];
    CHECK(nd_array_to_host(&out1, a) == ND_OK && nd_array_to_host(&out2, b) == ND_OK);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(nd_array_to_host(&m1, a) == ND_OK && nd_array_to_host(&m2, b) == ND_OK);
    CHECK(memcmp(a, b, sizeof a) == 0);
    /* Only the two results are left: the compact copies were released. */
    CHECK(allocated(dev) == before + 2 * (int64_t)sizeof a);
    nd_array *all[] = {&out1, &out2, &base, &grow_a, &pc_a, &gc_a, &m1, &v1, &m2, &v2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) nd_array_release(all[i]);
}

/* Each refusal: its status, nothing written, no bytes kept. */
static void test_errors(nd_device *dev) {
    float ones[6] = {1, 1, 1, 1, 1, 1};
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    nd_array p = make(dev, 2, s23, ones), g = make(dev, 2, s23, ones);
    nd_array m = make(dev, 2, s23, ones), v = make(dev, 2, s23, ones);
    nd_array wrong = make(dev, 2, s32, ones);
    nd_array other = make(nd_host_device_register("cpu_numpy"), 2, s23, ones);
    nd_array mt = wrong;
    CHECK(nd_layout_permute(&wrong.layout, (int[]){1, 0}, &mt.layout) == ND_OK);
    int64_t before = allocated(dev);
    nd_array out;
    CHECK(nd_array_adam_update(&p, &wrong, &m, &v, &ADAM, &out) == ND_ERR_SHAPE);
    CHECK(strstr(nd_last_error(), "the gradient has shape (3, 2)") != NULL);
    CHECK(out.storage == NULL);
    CHECK(nd_array_adam_update(&p, &g, &m, &wrong, &ADAM, &out) == ND_ERR_SHAPE);
    CHECK(nd_array_adam_update(&p, &g, &other, &v, &ADAM, &out) == ND_ERR_DEVICE);
    CHECK(strstr(nd_last_error(), "is on cpu_numpy() but the parameter is on cpu()") != NULL);
    CHECK(nd_array_adam_update(&p, &g, &m, &m, &ADAM, &out) == ND_ERR_VALUE);
    CHECK(nd_array_adam_update(&p, &g, &g, &v, &ADAM, &out) == ND_ERR_VALUE);
    CHECK(nd_array_adam_update(&p, &g, &mt, &v, &ADAM, &out) == ND_ERR_VALUE);
    CHECK(strstr(nd_last_error(), "contiguous") != NULL);
    CHECK(nd_array_sgd_update(&p, &g, &p, &SGD, &out) == ND_ERR_VALUE);
    CHECK(nd_array_sgd_update(&p, &other, &m, &SGD, &out) == ND_ERR_DEVICE);
    CHECK(out.storage == NULL);
    CHECK(allocated(dev) == before);
    const nd_array *all[] = {&p, &g, &m, &v};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CHECK(equals_host(all[i], ones, 6));
    nd_array_release(&p);
    nd_array_release(&g);
    nd_array_release(&m);
    nd_array_release(&v);
    nd_array_release(&wrong);
    nd_array_release(&other);
}

int main(void) {
    nd_device *cpu = nd_device_at(0);
    fill_inputs();
    references();
    test_every_isa_and_thread_count(cpu);
    test_strided_inputs(cpu);
    test_errors(cpu);
    if (failures > 0) printf("%d failure(s)\n", failures);
    return failures > 0;
}
