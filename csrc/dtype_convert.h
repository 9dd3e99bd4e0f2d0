/* dtype_convert.h: conversions between float32 and the narrow storage types
 * (float16, bfloat16), bit for bit the same on the host and on the GPU, so
 * that the CPU and CUDA backends round alike (to nearest, ties to even;
 * NaN stays NaN, float16 overflows to infinity and keeps subnormals).
 *
 * C11 and CUDA C++ alike: the including file may define ND_CONVERT_FN (CUDA:
 * __host__ __device__) before including it.
 */
#ifndef NEEDLE_DTYPE_CONVERT_H
#define NEEDLE_DTYPE_CONVERT_H

#include <stdint.h>
#include <string.h>

#ifndef ND_CONVERT_FN
#define ND_CONVERT_FN static inline
#endif

ND_CONVERT_FN uint32_t nd_bits_of_float(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

ND_CONVERT_FN float nd_float_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

ND_CONVERT_FN float nd_bf16_to_float(uint16_t h) { return nd_float_of_bits((uint32_t)h << 16); }

ND_CONVERT_FN uint16_t nd_float_to_bf16(float f) {
    uint32_t u = nd_bits_of_float(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

ND_CONVERT_FN float nd_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0x1Fu) return nd_float_of_bits(sign | 0x7F800000u | (man << 13));
    if (exp != 0) return nd_float_of_bits(sign | ((exp + 112u) << 23) | (man << 13));
    /* Zero and the subnormals: man * 2**-24, exact in float32. */
    float magnitude = (float)man * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
}

ND_CONVERT_FN uint16_t nd_float_to_half(float f) {
    uint32_t u = nd_bits_of_float(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu)); /* NaN */
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds past 65504: inf */
    if (a >= 0x38800000u) {                                  /* a normal half */
        uint32_t r = a - 0x38000000u;                        /* rebias the exponent */
        r += 0xFFFu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return sign; /* below half the smallest subnormal: zero */
    /* A subnormal half: the significand shifted right, rounded to even. */
    uint32_t exp = a >> 23, man = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - exp; /* 14..24 */
    uint32_t half = man >> shift, rest = man & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
    if (rest > mid || (rest == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
}

#endif /* NEEDLE_DTYPE_CONVERT_H */
