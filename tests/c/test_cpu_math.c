/* test_cpu_math.c: checks the vectorizable libm replacements (csrc/cpu/cpu_math.h)
 * against double-precision libm, over strided sweeps of all float bit
 * patterns, dense sweeps of the ranges where the algorithms switch or lose
 * precision, a pow grid aimed at the whole exponent range, and the special
 * values of C99 Annex F.
 *
 * Errors are counted as the distance in representable floats between the
 * result and the libm result rounded to float; that also covers subnormal
 * results (one step is 2^-149) and the overflow edge (inf follows FLT_MAX).
 *
 * Build and run from the repository root:
 *   gcc -std=c11 -O2 -Wall -Wextra -Werror -fno-math-errno -I csrc \
 *       tests/c/test_cpu_math.c -lm -o /tmp/test_cpu_math
 *   /tmp/test_cpu_math
 */
#include "cpu/cpu_math.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define TOL_UNARY 2 /* exp, log, tanh, sigmoid */
#define TOL_POW 4
/* Bounds on the error against the exact result, in fractional ulps, for the
 * functions whose documented bound is tighter than the distance above. */
#define BOUND_LOG 1.5
#define BOUND_TANH 2.0
#define BOUND_ERF 2.0

static int failures = 0;

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Maps floats onto integers in the same order, so that subtracting two of
 * them counts the representable floats in between (+0 and -0 both map to 0). */
static int64_t ordinal(float f) {
    uint32_t u = bits_of(f);
    return (u & 0x80000000u) ? -(int64_t)(u & 0x7FFFFFFFu) : (int64_t)u;
}

typedef struct stats {
    const char *name;
    int tol;
    double bound;     /* max fractional ulps vs exact; 0 = not checked */
    int64_t max_dist; /* in representable floats, vs libm rounded to float */
    double max_ulp;   /* fractional, vs the unrounded double result */
    double worst_x, worst_y;
    long checked;
} stats;

static void fail(stats *s, float x, float y, float got, double ref, const char *why) {
    if (failures < 30)
        printf("FAIL %s(%a, %a) = %a (%.9g), expected %a (%.9g): %s\n", s->name, x, y, got, got,
               ref, ref, why);
    failures++;
}

/* The size of one float ulp at the magnitude of d. */
static double ulp_at(double d) {
    int e;
    frexp(fabs(d), &e);
    double u = ldexp(1.0, e - 24);
    return u < 0x1p-149 ? 0x1p-149 : u;
}

static void check(stats *s, float x, float y, float got, double ref) {
    s->checked++;
    float rf = (float)ref;
    if (isnan(rf) || isnan(got)) {
        if (!(isnan(rf) && isnan(got))) fail(s, x, y, got, ref, "nan mismatch");
        return;
    }
    if (signbit(got) != signbit(rf)) {
        fail(s, x, y, got, ref, "wrong sign");
        return;
    }
    int64_t d = ordinal(got) - ordinal(rf);
    if (d < 0) d = -d;
    if (d > s->max_dist) {
        s->max_dist = d;
        s->worst_x = x;
        s->worst_y = y;
    }
    if (isfinite(got) && isfinite(ref)) {
        double e = fabs((double)got - ref) / ulp_at(ref);
        if (e > s->max_ulp) s->max_ulp = e;
    }
    if (d > s->tol) fail(s, x, y, got, ref, "ulp error above tolerance");
    if (s->bound > 0 && isfinite(got) && isfinite(ref) &&
        fabs((double)got - ref) / ulp_at(ref) > s->bound)
        fail(s, x, y, got, ref, "error above the documented bound");
}

/* Special values must match bit for bit (signed zeros, infinities, exact
 * ones), or both be NaN. */
static void check_exact(stats *s, float x, float y, float got, float want) {
    if (isnan(want) ? !isnan(got) : bits_of(got) != bits_of(want))
        fail(s, x, y, got, want, "special value mismatch");
}

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* The sweeps evaluate in batches through plain loops, the shape the kernels
 * use, so that an -O3 build of this test checks the vectorized code. */
#define BATCH 4096
#define DEFINE_BATCH(fn)                                                           \
    static void batch_##fn(float *restrict out, const float *restrict in, int n) { \
        for (int i = 0; i < n; i++) out[i] = fn(in[i]);                            \
    }
DEFINE_BATCH(nd_expf)
DEFINE_BATCH(nd_logf)
DEFINE_BATCH(nd_tanhf)
DEFINE_BATCH(nd_sigmoidf)
DEFINE_BATCH(nd_erff)

typedef void (*batch_f)(float *restrict, const float *restrict, int);
typedef double (*unary_d)(double);

static float in_buf[BATCH], out_buf[BATCH], y_buf[BATCH];
static int n_buf;

static void flush(stats *s, batch_f f, unary_d ref) {
    f(out_buf, in_buf, n_buf);
    for (int i = 0; i < n_buf; i++) check(s, in_buf[i], 0.0f, out_buf[i], ref(in_buf[i]));
    n_buf = 0;
}

static void push(stats *s, batch_f f, unary_d ref, float x) {
    in_buf[n_buf++] = x;
    if (n_buf == BATCH) flush(s, f, ref);
}

static void sweep(stats *s, batch_f f, unary_d ref, float lo, float hi, uint32_t stride) {
    /* Walks the ordinals between lo and hi, so negative ranges work too. */
    for (int64_t o = ordinal(lo); o <= ordinal(hi); o += stride)
        push(s, f, ref, o < 0 ? float_of((uint32_t)(-o) | 0x80000000u) : float_of((uint32_t)o));
    flush(s, f, ref);
}

static void sweep_all_bits(stats *s, batch_f f, unary_d ref) {
    for (uint64_t b = 0; b <= 0xFFFFFFFFu; b += 997) push(s, f, ref, float_of((uint32_t)b));
    flush(s, f, ref);
}

static void report(const stats *s) {
    printf("%-8s max %lld ulp (vs libm rounded), %.3f ulp (vs exact), worst at x=%a y=%a, "
           "%ld checked\n",
           s->name, (long long)s->max_dist, s->max_ulp, s->worst_x, s->worst_y, s->checked);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double rand_uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(rng() >> 11) * 0x1p-53;
}

static void batch_pow(float *restrict out, const float *restrict x, const float *restrict y,
                      int n) {
    for (int i = 0; i < n; i++) out[i] = nd_powf(x[i], y[i]);
}

static void flush_pow(stats *s) {
    batch_pow(out_buf, in_buf, y_buf, n_buf);
    for (int i = 0; i < n_buf; i++)
        check(s, in_buf[i], y_buf[i], out_buf[i], pow((double)in_buf[i], (double)y_buf[i]));
    n_buf = 0;
}

static void check_pow(stats *s, float x, float y) {
    in_buf[n_buf] = x;
    y_buf[n_buf++] = y;
    if (n_buf == BATCH) flush_pow(s);
}

static void test_pow(stats *s) {
    /* Grid: x over all positive magnitudes (subnormals included) of both
     * signs, y over moderate magnitudes where results stay mostly finite. */
    for (uint32_t xb = 0; xb < 0x7F800000u; xb += 0x7F800000u / 700) {
        for (int sgn = 0; sgn < 2; sgn++) {
            float x = float_of(xb | (sgn ? 0x80000000u : 0));
            for (int j = -300; j <= 300; j++) {
                float y = (float)j * 0.37f;
                check_pow(s, x, y);
                check_pow(s, x, (float)j); /* integers: signed results */
            }
        }
    }
    /* Targeted: y chosen so that y*log2|x| covers the whole finite range,
     * where the float result is most sensitive to the error of the product. */
    for (int i = 0; i < 400000; i++) {
        float x = float_of((uint32_t)(rng() % 0x7F800000u));
        double l2 = log2((double)x);
        if (l2 == 0.0) continue;
        float y = (float)(rand_uniform(-152.0, 130.0) / l2);
        check_pow(s, x, y);
    }
    /* x near 1 with huge y: log2 x is tiny, so it needs full relative
     * accuracy. */
    for (int k = -2000; k <= 2000; k++) {
        float x = float_of((uint32_t)((int32_t)bits_of(1.0f) + k));
        for (int j = 0; j < 40; j++) {
            float y = (float)rand_uniform(-3e9, 3e9);
            check_pow(s, x, y);
        }
    }
    /* Random bit patterns: mostly zeros, infinities and NaNs, which exercise
     * the sign and special-case selects. */
    for (int i = 0; i < 300000; i++) {
        uint64_t b = rng();
        check_pow(s, float_of((uint32_t)b), float_of((uint32_t)(b >> 32)));
    }
    /* Negative bases with integer exponents up to the overflow range. */
    for (int i = 0; i < 200000; i++) {
        float x = -(float)rand_uniform(0.0, 8.0);
        float y = (float)(int)rand_uniform(-200.0, 200.0);
        check_pow(s, x, y);
    }

    flush_pow(s);

    /* Annex F special cases against libm's own pow. */
    const float specials[] = {
        0.0f,  0x1p-149f,  0x1p-126f,  0.5f,        1.0f,        1.5f,  2.0f,    2.5f,     3.0f,
        10.0f, 8388607.5f, 8388609.0f, 16777215.0f, 16777216.0f, 1e10f, FLT_MAX, INFINITY,
    };
    const int ns = (int)(sizeof specials / sizeof specials[0]);
    for (int i = 0; i < 2 * ns + 1; i++) {
        float x = i == 2 * ns ? NAN : (i & 1 ? -specials[i / 2] : specials[i / 2]);
        for (int j = 0; j < 2 * ns + 1; j++) {
            float y = j == 2 * ns ? NAN : (j & 1 ? -specials[j / 2] : specials[j / 2]);
            float want = (float)pow((double)x, (double)y);
            float got = nd_powf(x, y);
            if (isnan(want) || isinf(want) || want == 0.0f || fabsf(want) == 1.0f)
                check_exact(s, x, y, got, want);
            else check(s, x, y, got, pow((double)x, (double)y));
        }
    }
    check_exact(s, -1.0f, INFINITY, nd_powf(-1.0f, INFINITY), 1.0f);
    check_exact(s, -1.0f, -INFINITY, nd_powf(-1.0f, -INFINITY), 1.0f);
    check_exact(s, 1.0f, NAN, nd_powf(1.0f, NAN), 1.0f);
    check_exact(s, NAN, 0.0f, nd_powf(NAN, 0.0f), 1.0f);
    check_exact(s, NAN, -0.0f, nd_powf(NAN, -0.0f), 1.0f);
    check_exact(s, -2.0f, 0.5f, nd_powf(-2.0f, 0.5f), NAN);
    check_exact(s, -0.0f, -3.0f, nd_powf(-0.0f, -3.0f), -INFINITY);
    check_exact(s, -0.0f, 3.0f, nd_powf(-0.0f, 3.0f), -0.0f);
    check_exact(s, -0.0f, 2.0f, nd_powf(-0.0f, 2.0f), 0.0f);
    check_exact(s, -INFINITY, 3.0f, nd_powf(-INFINITY, 3.0f), -INFINITY);
    check_exact(s, -INFINITY, 2.5f, nd_powf(-INFINITY, 2.5f), INFINITY);
    check_exact(s, -INFINITY, -3.0f, nd_powf(-INFINITY, -3.0f), -0.0f);
    /* Integer powers of integers that are exact in float come out exact, as
     * with libm (nothing guarantees it, but callers notice when 3^2 != 9). */
    for (int xi = -64; xi <= 64; xi++) {
        for (int yi = -8; yi <= 12; yi++) {
            double r = pow(xi, yi);
            if (fabs(r) <= 0x1p24 && (double)(float)r == r)
                check_exact(s, (float)xi, (float)yi, nd_powf((float)xi, (float)yi), (float)r);
        }
    }
}

int main(void) {
    stats se = {.name = "expf", .tol = TOL_UNARY, .max_dist = -1};
    stats sl = {.name = "logf", .tol = TOL_UNARY, .bound = BOUND_LOG, .max_dist = -1};
    stats st = {.name = "tanhf", .tol = TOL_UNARY, .bound = BOUND_TANH, .max_dist = -1};
    stats ss = {.name = "sigmoidf", .tol = TOL_UNARY, .max_dist = -1};
    stats sp = {.name = "powf", .tol = TOL_POW, .max_dist = -1};
    stats sr = {.name = "erff", .tol = TOL_UNARY, .bound = BOUND_ERF, .max_dist = -1};

    sweep_all_bits(&se, batch_nd_expf, exp);
    sweep(&se, batch_nd_expf, exp, -1.0f, 1.0f, 257);
    sweep(&se, batch_nd_expf, exp, -104.0f, -87.0f, 7); /* gradual underflow */
    sweep(&se, batch_nd_expf, exp, 88.0f, 89.0f, 7);    /* overflow edge */
    check_exact(&se, 0.0f, 0, nd_expf(0.0f), 1.0f);
    check_exact(&se, -0.0f, 0, nd_expf(-0.0f), 1.0f);
    check_exact(&se, INFINITY, 0, nd_expf(INFINITY), INFINITY);
    check_exact(&se, -INFINITY, 0, nd_expf(-INFINITY), 0.0f);
    check_exact(&se, NAN, 0, nd_expf(NAN), NAN);
    check_exact(&se, -NAN, 0, nd_expf(-NAN), NAN);
    check_exact(&se, 88.7229f, 0, nd_expf(88.7229f), INFINITY);
    check_exact(&se, FLT_MAX, 0, nd_expf(FLT_MAX), INFINITY);
    check_exact(&se, -FLT_MAX, 0, nd_expf(-FLT_MAX), 0.0f);
    check_exact(&se, -200.0f, 0, nd_expf(-200.0f), 0.0f);
    check(&se, 88.72283f, 0, nd_expf(88.72283f), exp(88.72283f));
    check(&se, -87.3f, 0, nd_expf(-87.3f), exp(-87.3f));
    check(&se, -103.9f, 0, nd_expf(-103.9f), exp(-103.9f));

    sweep_all_bits(&sl, batch_nd_logf, log);
    sweep(&sl, batch_nd_logf, log, 0.5f, 2.0f, 3);        /* mantissa range, near 1 */
    sweep(&sl, batch_nd_logf, log, 0.0f, 0x1p-126f, 101); /* subnormal inputs */
    check_exact(&sl, 0.0f, 0, nd_logf(0.0f), -INFINITY);
    check_exact(&sl, -0.0f, 0, nd_logf(-0.0f), -INFINITY);
    check_exact(&sl, -1.0f, 0, nd_logf(-1.0f), NAN);
    check_exact(&sl, -0x1p-149f, 0, nd_logf(-0x1p-149f), NAN);
    check_exact(&sl, -INFINITY, 0, nd_logf(-INFINITY), NAN);
    check_exact(&sl, INFINITY, 0, nd_logf(INFINITY), INFINITY);
    check_exact(&sl, NAN, 0, nd_logf(NAN), NAN);
    check_exact(&sl, 1.0f, 0, nd_logf(1.0f), 0.0f);
    check(&sl, 0x1p-149f, 0, nd_logf(0x1p-149f), log(0x1p-149));
    check(&sl, FLT_MAX, 0, nd_logf(FLT_MAX), log(FLT_MAX));

    sweep_all_bits(&st, batch_nd_tanhf, tanh);
    sweep(&st, batch_nd_tanhf, tanh, 0.25f, 0.35f, 3); /* around the 0.3 switch */
    sweep(&st, batch_nd_tanhf, tanh, -0.35f, -0.25f, 31);
    sweep(&st, batch_nd_tanhf, tanh, 0.35f, 8.5f, 97); /* the e/(e+2) form */
    sweep(&st, batch_nd_tanhf, tanh, 8.5f, 9.5f, 7);   /* saturation and the clamp */
    check_exact(&st, 0.0f, 0, nd_tanhf(0.0f), 0.0f);
    check_exact(&st, -0.0f, 0, nd_tanhf(-0.0f), -0.0f);
    check_exact(&st, INFINITY, 0, nd_tanhf(INFINITY), 1.0f);
    check_exact(&st, -INFINITY, 0, nd_tanhf(-INFINITY), -1.0f);
    check_exact(&st, NAN, 0, nd_tanhf(NAN), NAN);
    check_exact(&st, 20.0f, 0, nd_tanhf(20.0f), 1.0f);
    check_exact(&st, -100.0f, 0, nd_tanhf(-100.0f), -1.0f);
    check_exact(&st, FLT_MAX, 0, nd_tanhf(FLT_MAX), 1.0f);
    check_exact(&st, -0x1p-149f, 0, nd_tanhf(-0x1p-149f), -0x1p-149f);

    sweep_all_bits(&sr, batch_nd_erff, erf);
    sweep(&sr, batch_nd_erff, erf, -4.5f, 4.5f, 31);        /* the rational's range, the clamp */
    sweep(&sr, batch_nd_erff, erf, 0.0f, 0x1p-120f, 10007); /* tiny and subnormal */
    check_exact(&sr, 0.0f, 0, nd_erff(0.0f), 0.0f);
    check_exact(&sr, -0.0f, 0, nd_erff(-0.0f), -0.0f);
    check_exact(&sr, INFINITY, 0, nd_erff(INFINITY), 1.0f);
    check_exact(&sr, -INFINITY, 0, nd_erff(-INFINITY), -1.0f);
    check_exact(&sr, NAN, 0, nd_erff(NAN), NAN);
    check_exact(&sr, 4.0f, 0, nd_erff(4.0f), 1.0f);
    check_exact(&sr, -FLT_MAX, 0, nd_erff(-FLT_MAX), -1.0f);

    sweep_all_bits(&ss, batch_nd_sigmoidf, ref_sigmoid);
    sweep(&ss, batch_nd_sigmoidf, ref_sigmoid, -20.0f, 20.0f, 307);
    sweep(&ss, batch_nd_sigmoidf, ref_sigmoid, -104.0f, -87.0f, 7); /* subnormal results */
    check_exact(&ss, 0.0f, 0, nd_sigmoidf(0.0f), 0.5f);
    check_exact(&ss, INFINITY, 0, nd_sigmoidf(INFINITY), 1.0f);
    check_exact(&ss, -INFINITY, 0, nd_sigmoidf(-INFINITY), 0.0f);
    check_exact(&ss, NAN, 0, nd_sigmoidf(NAN), NAN);
    check_exact(&ss, FLT_MAX, 0, nd_sigmoidf(FLT_MAX), 1.0f);
    check_exact(&ss, -FLT_MAX, 0, nd_sigmoidf(-FLT_MAX), 0.0f);
    check_exact(&ss, -200.0f, 0, nd_sigmoidf(-200.0f), 0.0f);
    check(&ss, -88.8f, 0, nd_sigmoidf(-88.8f), ref_sigmoid(-88.8f));

    test_pow(&sp);

    report(&se);
    report(&sl);
    report(&st);
    report(&ss);
    report(&sp);
    report(&sr);
    if (failures) {
        printf("%d failures\n", failures);
        return 1;
    }
    printf("all cpu_math checks passed\n");
    return 0;
}
