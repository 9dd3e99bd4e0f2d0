/* cpu_lstm.c: the host's fused LSTM step kernels (nd_lstm_step_desc and
 * nd_lstm_step_grad_desc in internal.h), entries of nd_cpu_backend: the
 * loops of cpu_lstm_step.inc compiled once per instruction set, the current
 * ISA's chosen per call (as the elementwise loops are), and batch rows split
 * over threads when a step is large enough to pay for them.
 */
#include "cpu_math.h"
#include "internal.h"

/* Columns per chunk of a row: the chunk's pre-activations stay in L1. */
#define ND_LSTM_CHUNK 64
/* Fewer (row, column) cells than this per thread are not worth a thread. */
#define GRAIN_CELLS ((int64_t)1 << 15)

#define ND_LSTM_FN(name) name##_baseline
#include "cpu_lstm_step.inc"
#undef ND_LSTM_FN

#if defined(__x86_64__) && defined(__GNUC__)
#define ND_LSTM_X86 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("arch=x86-64-v3"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#endif
#define ND_LSTM_FN(name) name##_avx2
#include "cpu_lstm_step.inc"
#undef ND_LSTM_FN
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("arch=x86-64-v4"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#endif
#define ND_LSTM_FN(name) name##_avx512
#include "cpu_lstm_step.inc"
#undef ND_LSTM_FN
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

/* nd_range_fn bodies: the current ISA's copy of each loop. */
static void step_range(void *ctx, int64_t r0, int64_t r1) {
    const nd_lstm_step_desc *d = ctx;
#ifdef ND_LSTM_X86
    switch (nd_cpu_isa_current()) {
    case ND_CPU_ISA_AVX512: step_rows_avx512(d, r0, r1); return;
    case ND_CPU_ISA_AVX2: step_rows_avx2(d, r0, r1); return;
    default: break;
    }
#endif
    step_rows_baseline(d, r0, r1);
}

static void step_grad_range(void *ctx, int64_t r0, int64_t r1) {
    const nd_lstm_step_grad_desc *d = ctx;
#ifdef ND_LSTM_X86
    switch (nd_cpu_isa_current()) {
    case ND_CPU_ISA_AVX512: step_grad_rows_avx512(d, r0, r1); return;
    case ND_CPU_ISA_AVX2: step_grad_rows_avx2(d, r0, r1); return;
    default: break;
    }
#endif
    step_grad_rows_baseline(d, r0, r1);
}

static int64_t row_grain(int64_t hidden) {
    return hidden >= GRAIN_CELLS ? 1 : GRAIN_CELLS / hidden;
}

nd_status nd_cpu_lstm_step(const nd_lstm_step_desc *d) {
    nd_cpu_parallel_for(d->batch, row_grain(d->hidden), step_range, (void *)d);
    return ND_OK;
}

nd_status nd_cpu_lstm_step_grad(const nd_lstm_step_grad_desc *d) {
    nd_cpu_parallel_for(d->batch, row_grain(d->hidden), step_grad_range, (void *)d);
    return ND_OK;
}
