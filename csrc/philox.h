/* philox.h: the engine's counter-based random generator, Philox4x32-10
 * (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11; the generator cuRAND and PyTorch use on GPUs), and the three
 * distributions made from its output.
 *
 * One implementation for every backend: the CPU backend (plain C) and the
 * CUDA kernel (csrc/cuda/cuda_random.cu) both call nd_random_block, so that
 * the GPU's output can be checked against the CPU's bit for bit (uniform
 * and bernoulli always; normal wherever the math library is the same, as on
 * the CUDA simulator: a GPU's logf/sinf/cosf differ from the host's in the
 * last bits). Static inline, host and device under nvcc; no state, no
 * allocation, nothing that can fail.
 *
 * Element i of a draw is a pure function of (key, stream, i): it comes from
 * Philox block i / 4, counter (i / 4 as 64 bits, stream as 64 bits), so a
 * draw's values do not depend on how the work is split over threads.
 */
#ifndef NEEDLE_PHILOX_H
#define NEEDLE_PHILOX_H

#include "engine.h"

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define ND_PHILOX_FN static inline __host__ __device__
#else
#define ND_PHILOX_FN static inline
#endif

/* The round multipliers and the key schedule's increments (the golden
 * ratio and sqrt(3) - 1 as 32-bit fractions), from the paper. */
#define ND_PHILOX_M0 0xD2511F53u
#define ND_PHILOX_M1 0xCD9E8D57u
#define ND_PHILOX_W0 0x9E3779B9u
#define ND_PHILOX_W1 0xBB67AE85u
#define ND_PHILOX_ROUNDS 10

/* 2^-24: a 24-bit integer times this is an exact float in [0, 1). */
#define ND_PHILOX_UNIT (1.0f / 16777216.0f)
#define ND_PHILOX_TWO_PI 6.28318530717958647692f

typedef struct nd_philox4 {
    uint32_t v[4];
} nd_philox4;

/* Philox4x32 with ND_PHILOX_ROUNDS rounds of counter ctr under key (k0, k1).
 * The 32x32 -> 64-bit products give each round's high and low halves (one
 * wide multiply on a GPU). */
ND_PHILOX_FN nd_philox4 nd_philox4x32_10(nd_philox4 ctr, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < ND_PHILOX_ROUNDS; round++) {
        if (round > 0) {
            k0 += ND_PHILOX_W0;
            k1 += ND_PHILOX_W1;
        }
        const uint64_t p0 = (uint64_t)ND_PHILOX_M0 * ctr.v[0];
        const uint64_t p1 = (uint64_t)ND_PHILOX_M1 * ctr.v[2];
        nd_philox4 next;
        next.v[0] = (uint32_t)(p1 >> 32) ^ ctr.v[1] ^ k0;
        next.v[1] = (uint32_t)p1;
        next.v[2] = (uint32_t)(p0 >> 32) ^ ctr.v[3] ^ k1;
        next.v[3] = (uint32_t)p0;
        ctr = next;
    }
    return ctr;
}

/* A uniform float in [0, 1) from a 32-bit word: its top 24 bits over 2^24,
 * exact, so never 1.0 (rounding a 32-bit fraction to float could give 1.0). */
ND_PHILOX_FN float nd_philox_uniform(uint32_t word) { return (float)(word >> 8) * ND_PHILOX_UNIT; }

/* Two standard normals from two words (Box-Muller): the radius from a
 * uniform in (0, 1] (the top 24 bits plus one, over 2^24), so log never sees
 * 0 and the radius is at most sqrt(2 log 2^24) = 5.77; the angle from a
 * uniform in [0, 1). */
ND_PHILOX_FN void nd_philox_normal2(uint32_t a, uint32_t b, float *z0, float *z1) {
    const float u = (float)((a >> 8) + 1u) * ND_PHILOX_UNIT;
    const float r = sqrtf(-2.0f * logf(u));
    const float theta = ND_PHILOX_TWO_PI * nd_philox_uniform(b);
    *z0 = r * cosf(theta);
    *z1 = r * sinf(theta);
}

/* Elements 4 * block .. 4 * block + 3 of a draw of `kind` under (key, stream):
 * uniform [0, 1); standard normal (words 0, 1 and 2, 3 make one pair each);
 * bernoulli 1.0 where the element's uniform is <= p, else 0.0 (the course's
 * `rand(...) <= p`: a bernoulli draw equals the uniform draw of the same key
 * compared with p). */
/* The Philox stream of replay r of a captured draw whose stream is `stream`:
 * the golden-ratio increment keeps replays' streams apart from each other
 * and from eager draws' (stream 0 with another key). */
ND_PHILOX_FN uint64_t nd_philox_replay_stream(uint64_t stream, uint64_t replay) {
    return stream + (replay + 1) * 0x9E3779B97F4A7C15ull;
}

ND_PHILOX_FN void nd_random_block(nd_random_kind kind, uint64_t key, uint64_t stream,
                                  uint64_t block, float p, float out[4]) {
    nd_philox4 ctr;
    ctr.v[0] = (uint32_t)block;
    ctr.v[1] = (uint32_t)(block >> 32);
    ctr.v[2] = (uint32_t)stream;
    ctr.v[3] = (uint32_t)(stream >> 32);
    const nd_philox4 x = nd_philox4x32_10(ctr, (uint32_t)key, (uint32_t)(key >> 32));
    if (kind == ND_RANDOM_NORMAL) {
        nd_philox_normal2(x.v[0], x.v[1], &out[0], &out[1]);
        nd_philox_normal2(x.v[2], x.v[3], &out[2], &out[3]);
    } else if (kind == ND_RANDOM_BERNOULLI) {
        for (int j = 0; j < 4; j++) out[j] = nd_philox_uniform(x.v[j]) <= p ? 1.0f : 0.0f;
    } else {
        for (int j = 0; j < 4; j++) out[j] = nd_philox_uniform(x.v[j]);
    }
}

#endif /* NEEDLE_PHILOX_H */
