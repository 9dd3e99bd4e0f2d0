/* cpu_parallel.c: splits a CPU kernel's independent rows over threads, and
 * the thread count the kernels use.
 *
 * Threads are started for the call and joined before it returns: the
 * kernels that use this touch hundreds of megabytes, next to which starting
 * a thread (tens of microseconds) is noise, and nothing is left running
 * between calls (no pool to shut down, nothing across fork()). A thread that
 * cannot be started has its range run by the caller, so this never fails.
 * The work functions only compute: they never call the allocator or set the
 * engine's per-thread error message.
 */
#define _DEFAULT_SOURCE /* sysconf: hidden by -std=c11 */

#include "config.h"
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

/* The table's bound for NEEDLE_NUM_THREADS, which the arrays below are sized by. */
#define MAX_THREADS 256

static int chosen_threads = 0; /* 0: not decided yet */

/* NEEDLE_NUM_THREADS (config.h's parser, the one needle_c checks at import,
 * so that a bad value never gets here under needle), else the online
 * processors. */
static int default_threads(void) {
    int64_t n = 0;
    if (nd_config_count(ND_CFG_NUM_THREADS, &n) == 1) return (int)n;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) return 1;
    return online > MAX_THREADS ? MAX_THREADS : (int)online;
}

void nd_cpu_set_threads(int n) { chosen_threads = n < 1 ? 0 : n > MAX_THREADS ? MAX_THREADS : n; }

int nd_cpu_get_threads(void) {
    if (chosen_threads == 0) chosen_threads = default_threads();
    return chosen_threads;
}

typedef struct range_job {
    nd_range_fn fn;
    void *ctx;
    int64_t begin, end;
} range_job;

static void *run_job(void *arg) {
    range_job *job = arg;
    job->fn(job->ctx, job->begin, job->end);
    return NULL;
}

void nd_cpu_parallel_for(int64_t n, int64_t grain, nd_range_fn fn, void *ctx) {
    if (n <= 0) return;
    int64_t threads = nd_cpu_get_threads();
    if (grain < 1) grain = 1;
    if (threads > n / grain) threads = n / grain;
    if (threads <= 1) {
        fn(ctx, 0, n);
        return;
    }
    range_job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS];
    for (int64_t t = 0; t < threads; t++) {
        jobs[t] = (range_job){fn, ctx, n * t / threads, n * (t + 1) / threads};
        started[t] = t > 0 && pthread_create(&ids[t], NULL, run_job, &jobs[t]) == 0;
    }
    run_job(&jobs[0]);
    for (int64_t t = 1; t < threads; t++) {
        if (started[t]) pthread_join(ids[t], NULL);
        else run_job(&jobs[t]);
    }
}
