/* cpu_random.c: the CPU backend's random fill: philox.h's blocks of four
 * values, split over threads in whole blocks. Each value depends only on
 * its index, so the split (and the thread count) never changes a result.
 */
#include "internal.h"
#include "philox.h"

/* Blocks of four per thread before a fill is split: about a millisecond of
 * normals, well above the cost of starting a thread. */
#define RANDOM_GRAIN (1 << 14)

typedef struct random_job {
    const nd_random_params *params;
    int64_t n;
    float *out; /* (n,) */
} random_job;

static void random_range(void *ctx, int64_t begin, int64_t end) {
    const random_job *job = (const random_job *)ctx;
    const nd_random_params *p = job->params;
    for (int64_t block = begin; block < end; block++) {
        float values[4];
        nd_random_block(p->kind, p->key, p->stream, (uint64_t)block, p->p, values);
        const int64_t first = 4 * block;
        const int64_t count = job->n - first < 4 ? job->n - first : 4;
        for (int64_t j = 0; j < count; j++) job->out[first + j] = values[j];
    }
}

nd_status nd_cpu_random(const nd_random_params *params, int64_t n, float *out) {
    random_job job = {params, n, out};
    nd_cpu_parallel_for((n + 3) / 4, RANDOM_GRAIN, random_range, &job);
    return ND_OK;
}
