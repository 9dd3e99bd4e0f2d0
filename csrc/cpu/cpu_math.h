/* cpu_math.h: vectorizable float32 replacements of libm for the CPU kernels.
 *
 * libm's expf/logf/tanhf/powf are opaque calls, so a loop such as
 * `out[i] = expf(a[i])` runs one element at a time. These functions are
 * static inline and branch-free (every special case is a select or an
 * added term, never a jump), so GCC -O3 if-converts and auto-vectorizes such
 * loops with plain SSE2 as well as with AVX2/FMA target attributes.
 *
 * Bound: <= 2 ulp from the exact result for every input (libm's is < 1);
 * nd_logf <= 1.5 ulp. Measured over all 2^32 inputs (pow: ~1e8 samples
 * spanning its range):
 *   nd_expf 0.99, nd_logf 0.96, nd_tanhf 1.50, nd_sigmoidf 1.97, nd_powf 0.98
 * nd_erff 1.59 (every 997th bit pattern, dense over [-4.5, 4.5] and the tiny inputs)
 * Subnormal results are gradual and correctly scaled; special values (inf,
 * nan, signed zero, C99 Annex F pow cases) follow libm;
 * tests/c/test_cpu_math.c checks the bounds and the cases.
 *
 * Speed on 1M-element loops (AMD EPYC): exp/log/tanh/sigmoid run 1.4-10x
 * faster than glibc with plain SSE2 and 3-25x with AVX2. nd_powf needs double
 * precision inside, so with plain SSE2 it is ~1.6x slower than glibc's scalar
 * powf, and only ~1.3x faster with AVX2.
 *
 * Without FMA contraction (ISO C mode) such a loop runs at about one vector
 * operation per cycle on that machine, well below the two it can issue: the
 * time follows the operation count, so the functions are written to minimize
 * it (nd_logf 1M: 0.44 ms with AVX-512, nd_tanhf 0.50 ms).
 *
 * Assumes only IEEE-754 binary32/binary64 and round-to-nearest; stays correct
 * with or without FMA contraction, but not under -ffast-math (the rounding
 * tricks below rely on additions that must not be reassociated, and the
 * special cases on NaN and infinity comparisons).
 */
#ifndef NEEDLE_CPU_MATH_H
#define NEEDLE_CPU_MATH_H

#include <stdint.h>
#include <string.h>

/* memcpy is the C11 way to reinterpret bits; GCC lowers it to a register
 * move, which the vectorizer treats as a free view conversion. */
static inline uint32_t nd__f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float nd__u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint64_t nd__d2u(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}
static inline double nd__u2d(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Selects built from bit masks rather than `?:`. A conditional expression
 * evaluates only one arm, so with -ftrapping-math (the default) GCC may not
 * speculate the floating-point arithmetic in it, and jump threading turns a
 * clamp to a constant into a separate path; either leaves control flow in the
 * loop and blocks vectorization. Masks keep every arm computed and the loop
 * body a single basic block. c must be 0 or 1. There is deliberately no
 * double version: GCC 12 cannot vectorize a 64-bit select on a double
 * comparison for plain SSE2, so nd_powf makes all its decisions on float
 * lanes. */
static inline float nd__self(int c, float a, float b) {
    uint32_t m = 0u - (uint32_t)c;
    return nd__u2f((nd__f2u(a) & m) | (nd__f2u(b) & ~m));
}
static inline uint32_t nd__selu(int c, uint32_t a, uint32_t b) {
    uint32_t m = 0u - (uint32_t)c;
    return (a & m) | (b & ~m);
}

#define ND__INF nd__u2f(0x7F800000u)
#define ND__NAN nd__u2f(0x7FC00000u)

/* e^r for |r| <= ~0.35: Cephes expf polynomial, ~1 ulp. */
static inline float nd__exp_poly(float r) {
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

/* p * 2^n for p in [0.7, 1.5] and n in [-160, 130]. That is wider than one
 * float exponent field, so two normal factors build 2^n. The first product
 * is exact and the second rounds once: correct gradual underflow, and a
 * natural overflow to +inf. */
static inline float nd__scale(float p, int32_t n) {
    int32_t n1 = n >> 1;
    int32_t n2 = n - n1;
    float s1 = nd__u2f((uint32_t)(n1 + 127) << 23);
    float s2 = nd__u2f((uint32_t)(n2 + 127) << 23);
    return p * s1 * s2;
}

/* exp(x): n = round(x / ln2), r = x - n*ln2 in two pieces (Cody-Waite, the
 * high piece has few bits so n*hi is exact), e^r by polynomial, times 2^n. */
static inline float nd_expf(float x) {
    /* Beyond these bounds the result is already inf or rounds to 0; clamping
     * keeps n inside the range nd__scale handles. The comparisons are
     * written so that a NaN falls through unchanged. */
    x = nd__self(x > 89.0f, 89.0f, x);
    x = nd__self(x < -104.0f, -104.0f, x);

    /* Adding 1.5*2^23 rounds to an integer (the ulp there is 1) without a
     * call to rintf, which would not vectorize on baseline SSE2; the integer
     * itself then sits in the low mantissa bits, so no float->int conversion
     * (undefined for NaN) is needed. */
    const float shift = 12582912.0f;
    float t = x * 1.44269504088896341f + shift;
    float nf = t - shift;
    int32_t n = (int32_t)(nd__f2u(t) - 0x4B400000u);

    float r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    return nd__scale(nd__exp_poly(r), n);
}

/* log(x) = e*ln2 + log1p(f), f = m - 1 for m in [sqrt(1/2), sqrt(2)), with
 * log1p(f) = 2 atanh(s), s = f/(2+f) (the fdlibm reduction, in the form
 * f - s*(f - R) that needs no separate f^2/2 term).
 *
 * These loops run at about one vector operation per cycle, so every
 * operation counts: one division and a degree-3 polynomial in s^2 replace
 * the degree-8 polynomial in f of Cephes, and the special cases cost one
 * added term instead of a chain of selects. */
static inline float nd_logf(float x) {
    uint32_t ix = nd__f2u(x);

    /* Subnormals (and +0) have no implicit leading bit; scaling them by 2^23
     * makes them normal. Subtracting the scale's own bits below takes its
     * 23 back out of the exponent, so e needs no second select. */
    float scale = nd__self(ix < 0x00800000u, 0x1p23f, 1.0f);
    float xs = x * scale;

    /* Offsetting the bits by those of sqrt(1/2) makes the exponent field
     * round at sqrt(2) instead of 2, so m lands in [sqrt(1/2), sqrt(2)) with
     * integer ops alone (the musl trick): 0x004AFB0D = 0x3F800000 -
     * 0x3F3504F3, the bits of 1.0 (the unscaled case) less those of
     * sqrt(1/2). */
    uint32_t off = nd__f2u(xs) - nd__f2u(scale) + 0x004AFB0Du;
    int32_t e = (int32_t)off >> 23;
    float m = nd__u2f((off & 0x007FFFFFu) + 0x3F3504F3u);

    /* |s| <= 0.1716, z <= 0.0295. R(z) = 2 atanh(s)/s - 2 by a minimax
     * polynomial (error < 2e-9, negligible); s's rounding only enters
     * through s*(f - R), a term about f^2/2 in size. */
    float f = m - 1.0f; /* exact (Sterbenz) */
    float s = f / (2.0f + f);
    float z = s * s;
    float R = z * (6.666677594e-1f + z * (3.997754753e-1f + z * 2.987158895e-1f));
    float l = f - s * (f - R);

    /* ln2 in two pieces; e*hi is exact and the small terms go first, so
     * e*ln2 loses nothing for the large exponents where it dominates. */
    float fe = (float)e;
    float r = fe * 0.693359375f + (l + fe * -2.12194440e-4f);

    /* The path above gives finite garbage for x <= 0, inf and nan; adding a
     * term that is 0 for every other input gives those their results: nan
     * for x < 0 (including -inf), -inf for +-0, x itself for +inf and nan.
     * The three cases exclude each other, so each is one masked constant
     * and the terms combine with plain ors. */
    uint32_t special = (0x7FC00000u & (0u - (uint32_t)(x < 0.0f))) |
                       (0xFF800000u & (0u - (uint32_t)(x == 0.0f))) |
                       (ix & (0u - (uint32_t)!(x < ND__INF)));
    return r + nd__u2f(special);
}

/* tanh(x) in two pieces, both always evaluated and one selected:
 *
 * |x| >= 0.3: with e = expm1(2|x|), tanh|x| = e/(e+2). 2|x| = n*ln2 + 2r,
 * |r| <= ln2/4, gives e = 2^n*u + (2^n - 1) for u = expm1(2r): both terms
 * are exact, so e is rounded once, and from 0.3 on (n >= 1) u is the smaller
 * term, so its own error shrinks rather than grows. The error stays below
 * 1.5 ulp there; below 0.3 the roundings of e, e+2 and the quotient add up
 * to 2.4 ulp.
 *
 * |x| < 0.3 (and nan): the odd series x - x*z*P(z), z = x^2, where only
 * the final addition rounds at the result's size.
 *
 * The sign is applied to the quotient's numerator and, on the polynomial
 * side, comes with x; written as x + x*(0 - z*P), the correction is +0 for
 * x = +-0, so tanh(-0) = -0. */
static inline float nd_tanhf(float x) {
    uint32_t ix = nd__f2u(x);
    uint32_t sign = ix & 0x80000000u;
    int32_t ia = (int32_t)(ix & 0x7FFFFFFFu);
    float ax = nd__u2f((uint32_t)ia);

    /* Minimax on [0, 0.3]: relative error < 1.3e-8. */
    float z = x * x;
    float p = 5.036624148e-2f;
    p = p * z - 1.331483275e-1f;
    p = p * z + 3.333306015e-1f;
    float small = x * (0.0f - p * z) + x;

    /* tanh rounds to 1 from |x| = 9.01 on; clamping at 9.1 keeps n <= 26.
     * An integer min on the bits is one operation; it would turn a nan into
     * 9.1, but nan takes the other path. */
    int32_t ic = ia < 0x4111999A ? ia : 0x4111999A; /* 9.1f */
    float c = nd__u2f((uint32_t)ic);

    /* n = round(2c/ln2) with the 1.5*2^23 trick (see nd_expf); t's low bits
     * are n, so 2^n comes from them by a shift. r = c - n*ln2/2 in two
     * pieces (Cody-Waite; n*hi is exact). */
    const float shift = 12582912.0f;
    float t = c * 2.88539008177792681f + shift;
    float nf = t - shift;
    float s = nd__u2f((nd__f2u(t) << 23) + 0x3F800000u);
    float r = c - nf * 0.3466796875f;
    r = r - nf * -1.06097220e-4f;

    /* u = expm1(2r) = 2r + r^2*Q(r), Q minimax (relative error of u below
     * 1.7e-8), evaluated by Estrin's scheme. */
    float r2 = r * r;
    float r4 = r2 * r2;
    float q = (1.999999881e+0f + 1.333323479e+0f * r) +
              r2 * (6.666752100e-1f + 2.677284479e-1f * r) + r4 * 8.884806931e-2f;
    float u = (r + r) + r2 * q;

    /* For |x| >= 9.01, e >= 2^26 and e+2 rounds to e: the quotient is 1. */
    float e = s * u + (s - 1.0f);
    float large = nd__u2f(nd__f2u(e) ^ sign) / (e + 2.0f);

    return nd__self(!(ax >= 0.3f), small, large);
}

/* 1/(1+e^-x), evaluated through e = e^-|x| <= 1 so that nothing overflows:
 * for x < 0 the identity e/(1+e) keeps the tiny results (down to the
 * subnormals) that 1/(1+e^-x) would lose to an overflowing exponential. */
static inline float nd_sigmoidf(float x) {
    float ax = nd__u2f(nd__f2u(x) & 0x7FFFFFFFu);
    float e = nd_expf(-ax);
    float num = nd__self(x < 0.0f, e, 1.0f);
    /* The rounding of 1+e alone costs up to ~0.75 ulp on top of the
     * exponential's; since 1 >= e, its error lo is exact (Fast2Sum) and
     * feeds a first-order correction of the quotient. */
    float d = 1.0f + e;
    float lo = (1.0f - d) + e;
    float q = num / d;
    return q - q * (lo / d);
}

/* pow(x, y) = 2^(y*log2|x|). |y*log2|x|| reaches ~150 before the result
 * saturates, and an absolute error d there is a relative error 0.69*d in the
 * result, so log2|x| and the product are computed in double (~1e-11). Once
 * the product is split into integer and fraction, the fraction is small and
 * the rest runs in float, twice as many lanes wide. Signs and the Annex F
 * cases are selects applied at the end. */
static inline float nd_powf(float x, float y) {
    float ax = nd__u2f(nd__f2u(x) & 0x7FFFFFFFu);
    float ay = nd__u2f(nd__f2u(y) & 0x7FFFFFFFu);

    /* log2|x|: same exponent/mantissa split as nd_logf. */
    int sub = ax < 0x1p-126f;
    float axs = nd__self(sub, ax * 0x1p23f, ax);
    uint32_t off = nd__f2u(axs) - 0x3F3504F3u;
    int32_t e = (int32_t)off >> 23;
    e = (int32_t)nd__selu(sub, (uint32_t)(e - 23), (uint32_t)e);
    double m = (double)nd__u2f((off & 0x007FFFFFu) + 0x3F3504F3u);

    /* ln m = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716; the series through
     * s^13 is within 5e-11 relative. Estrin's scheme rather than Horner: the
     * loop body is long enough to be latency-bound. */
    double s = (m - 1.0) / (m + 1.0);
    double s2 = s * s;
    double s4 = s2 * s2;
    double qa = 1.0 / 3 + 1.0 / 5 * s2;
    double qb = 1.0 / 7 + 1.0 / 9 * s2;
    double qc = 1.0 / 11 + 1.0 / 13 * s2;
    double q = qa + s4 * (qb + s4 * qc);
    double lnm = 2.0 * s + 2.0 * s * s2 * q;
    /* log2 0 = -inf and log2 inf = inf enter as an added float term, so the
     * select stays on float lanes; the split above gave finite values there. */
    float l2_special = nd__self(ax == 0.0f, -ND__INF, nd__self(ax == ND__INF, ND__INF, 0.0f));
    double l2 = ((double)e + lnm * 1.44269504088896340736) + (double)l2_special;

    /* 2^t = 2^k * e^(f*ln2), valid for t in [-160, 130]; outside it (and for
     * a NaN t from 0*inf or NaN inputs) the integer steps below produce
     * garbage, which the selects after them replace by 0 or inf (and the NaN
     * and 0*inf cases the Annex F selects at the end). t - k is exact, and
     * rounding (t - k)*ln2 to float costs < 0.1 ulp of the result. */
    double t = (double)y * l2;
    float tf = (float)t;
    int t_over = tf > 130.0f;
    int t_under = !(tf >= -160.0f);
    const double shift = 0x1.8p52;
    double tk = t + shift;
    double kd = tk - shift;
    float fr = (float)((t - kd) * 0.69314718055994530942);
    int32_t k = (int32_t)(uint32_t)nd__d2u(tk); /* low bits, as in nd_expf */
    float r = nd__scale(nd__exp_poly(fr), k);
    r = nd__self(t_over, ND__INF, r);
    r = nd__self(t_under, 0.0f, r);

    /* Integer and parity tests on y without truncf: below 2^23, adding 2^23
     * rounds y to an integer whose parity is the lowest mantissa bit; from
     * 2^23 on every float is an integer, odd only below 2^24. inf counts as
     * an even integer, as Annex F wants. */
    float yt = ay + 8388608.0f;
    int big = ay >= 8388608.0f;
    int yint = big | ((yt - 8388608.0f) == ay);
    uint32_t ybits = nd__selu(big, nd__f2u(ay), nd__f2u(yt));
    int yodd = yint & (ay < 16777216.0f) & (int)(ybits & 1u);

    uint32_t xsign = nd__f2u(x) & 0x80000000u;
    r = nd__u2f(nd__f2u(r) | nd__selu(yodd, xsign, 0u));
    r = nd__self((x < 0.0f) & (x > -ND__INF) & !yint, ND__NAN, r);
    r = nd__self((x != x) | (y != y), x + y, r);
    r = nd__self((x == -1.0f) & (ay == ND__INF), 1.0f, r);
    r = nd__self((x == 1.0f) | (y == 0.0f), 1.0f, r);
    return r;
}

/* erf(x) as the odd rational x P(x^2) / Q(x^2) of XLA's and Eigen's float
 * erf on x clamped to [-4, 4] (beyond it erf rounds to +-1 in float32),
 * evaluated in double: in float the two polynomials cost up to 7 ulp near
 * |x| = 3.6, in double the approximation's own 1.6 ulp remain. The clamp is
 * a select on float lanes (see nd__self), so NaN passes through and the
 * loop vectorizes; erf(-0) is -0 (+0 / Q(0) < 0). */
static inline float nd_erff(float x) {
    float c = nd__self(x > 4.0f, 4.0f, x);
    c = nd__self(c < -4.0f, -4.0f, c);
    const double d = (double)c, z = d * d;
    double p = -2.72614225801306e-10;
    p = p * z + 2.77068142495902e-08;
    p = p * z - 2.10102402082508e-06;
    p = p * z - 5.69250639462346e-05;
    p = p * z - 7.34990630326855e-04;
    p = p * z - 2.95459980854025e-03;
    p = p * z - 1.60960333262415e-02;
    double q = -1.45660718464996e-05;
    q = q * z - 2.13374055278905e-04;
    q = q * z - 1.68282697438203e-03;
    q = q * z - 7.37332916720468e-03;
    q = q * z - 1.42647390514189e-02;
    return (float)(d * p / q);
}

#endif /* NEEDLE_CPU_MATH_H */
