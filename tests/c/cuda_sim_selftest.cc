/* cuda_sim_selftest.cc: the CUDA simulator's own test (csrc/cuda/sim), with
 * kernels written for it: built ids, barriers, warp operations, atomics,
 * dynamic shared memory; the failures a launch must report instead of
 * hanging (a thread that returns before a barrier, divergent barriers, a
 * shuffle with lanes gone, bad configurations); memory, copies, errors,
 * streams and events; stream capture and graphs (cuda_sim_capture.cc, linked
 * in); and that the switches work: NEEDLE_SIM_MAX_BLOCKS caps
 * gridDim, NEEDLE_SIM_PERTURB=1 turns a missing __syncthreads into wrong
 * results, NEEDLE_SIM_MEMORY sets the capacity.
 *
 * Built with g++ against the stand-in runtime and run once per combination of
 * switches by tests/test_cuda_sim.py; reads the switches it runs under from
 * the simulator. Prints failures, exits nonzero when there are any.
 */
#include "cuda_sim_selftest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ND_LAUNCH counts each launch in the backend's census (cuda_census.cu, not
 * linked here): this count stands in for it, and is checked below. */
static int launches = 0;
void nd_cuda_count_launch(const char *site, const void *stream) {
    (void)stream;
    launches += site != nullptr;
}

int failures = 0;

/* ------------------------------------------------------------- kernels */

/* out[global id] = global id, over a 3-D grid of 3-D blocks; *blocks: how
 * many blocks the grid has (fewer than launched under NEEDLE_SIM_MAX_BLOCKS). */
__global__ void ids_kernel(int *out, int *blocks) {
    const unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned id = bx * (blockDim.x * blockDim.y * blockDim.z) + tx;
    out[id] = (int)id;
    if (id == 0) *blocks = (int)(gridDim.x * gridDim.y * gridDim.z);
}

/* Tree sum of each block's 256 values through shared memory: out[block]. */
__global__ void block_sum_kernel(const float *in, float *out, int blocks) {
    __shared__ float s[256];
    for (int b = blockIdx.x; b < blocks; b += gridDim.x) {
        s[threadIdx.x] = in[b * 256 + threadIdx.x];
        __syncthreads();
        for (int half = 128; half > 0; half /= 2) {
            if ((int)threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
            __syncthreads();
        }
        if (threadIdx.x == 0) out[b] = s[0];
        __syncthreads(); /* s is refilled for the next b */
    }
}

/* Warp 0 publishes a value per block; the other warps read it. With
 * `barrier` 0 the __syncthreads between is missing: warp 0 runs first in the
 * simulator's plain order, so only NEEDLE_SIM_PERTURB=1 shows the race. */
__global__ void publish_kernel(int *out, int blocks, int barrier) {
    __shared__ int token;
    for (int b = blockIdx.x; b < blocks; b += gridDim.x) {
        if (threadIdx.x == 0) token = 1000 + b;
        if (barrier) __syncthreads();
        out[b * blockDim.x + threadIdx.x] = token;
        __syncthreads(); /* token is rewritten for the next b */
    }
}

/* A warp-then-block reduction like the backend's: each warp's lane 0 writes
 * its partial, warp 0 combines them. With `second` 0 the barrier after warp
 * 0's read is missing, so a held-back warp 0 reads partials that the other
 * warps already overwrote for the next output (grid-stride, several outputs
 * per block). */
__global__ void two_level_sum_kernel(const float *in, float *out, int outputs, int second) {
    __shared__ float partial[8];
    for (int o = blockIdx.x; o < outputs; o += gridDim.x) {
        float v = in[o * 256 + threadIdx.x];
        for (int delta = 16; delta > 0; delta /= 2) v += __shfl_down_sync(0xffffffffu, v, delta);
        if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
        __syncthreads();
        if (threadIdx.x < 32) {
            v = threadIdx.x < 8 ? partial[threadIdx.x] : 0.0f;
            for (int delta = 16; delta > 0; delta /= 2)
                v += __shfl_down_sync(0xffffffffu, v, delta);
            if (threadIdx.x == 0) out[o] = v;
        }
        if (second) __syncthreads();
    }
}

/* Every warp operation, results per thread: out[t * 8 + k]. */
__global__ void warp_ops_kernel(int *out) {
    const int t = threadIdx.x, lane = t % 32;
    int *o = out + t * 8;
    int sum = lane;
    for (int delta = 16; delta > 0; delta /= 2) sum += __shfl_down_sync(0xffffffffu, sum, delta);
    o[0] = sum; /* lane 0: 0 + ... + 31 */
    int x = lane;
    for (int m = 1; m < 32; m *= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
    o[1] = x;                                      /* every lane: 496 */
    o[2] = __shfl_sync(0xffffffffu, lane * 10, 3); /* 30 */
    o[3] = __shfl_sync(0xffffffffu, lane, 1, 8);   /* lane's group of 8, + 1 */
    int scan = 1;                                  /* inclusive prefix count */
    for (int delta = 1; delta < 32; delta *= 2) {
        int y = __shfl_up_sync(0xffffffffu, scan, (unsigned)delta);
        if (lane >= delta) scan += y;
    }
    o[4] = scan; /* lane + 1 */
    o[5] = (int)__ballot_sync(0xffffffffu, lane % 2 == 0);
    o[6] = __any_sync(0xffffffffu, lane == 7) + 2 * __all_sync(0xffffffffu, lane < 32) +
           4 * __all_sync(0xffffffffu, lane < 31);
    __syncwarp();
    if (lane < 16) o[7] = __shfl_down_sync(0x0000ffffu, lane, 8, 16); /* half a warp */
    else o[7] = -1;
}

/* Atomics from every thread of every block. */
__global__ void atomics_kernel(float *fsum, int *count, unsigned long long *lowest) {
    const int id = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(fsum, 0.5f);
    atomicAdd(count, 1);
    atomicMin(lowest, (unsigned long long)(1000 - id % 700));
}

/* Dynamic shared memory: what a block finds there at its start, then a
 * reversal through it. out_before[t] reads the word before anyone wrote. */
__global__ void dynamic_kernel(const float *in, float *out, unsigned *out_before) {
    ND_DYNAMIC_SHARED(float, buf);
    const int t = threadIdx.x, n = blockDim.x;
    unsigned bits;
    memcpy(&bits, &buf[t], sizeof bits);
    out_before[blockIdx.x * n + t] = bits;
    __syncthreads();
    buf[t] = in[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * n + t] = buf[n - 1 - t];
}

/* A by-value parameter is each thread's own copy. */
__global__ void by_value_kernel(int start, int *out) {
    start += (int)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = start;
}

/* gridDim.x as the kernel sees it, and a grid-stride fill of n values. */
__global__ void grid_stride_kernel(int n, int *out, unsigned *grid_seen) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *grid_seen = gridDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = 2 * i;
}

/* Broken kernels: each must fail the launch, not hang. */
/* Not static: cuda_sim_capture.cc replays them too. */
__global__ void early_return_kernel(int *out) {
    if (threadIdx.x == 5) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void divergent_barrier_kernel(int *out) {
    if (threadIdx.x < 64) {
        out[threadIdx.x] = 1;
        __syncthreads();
    } else {
        out[threadIdx.x] = 2;
        __syncthreads();
    }
}

__global__ void shuffle_after_return_kernel(int *out) {
    if (threadIdx.x % 32 == 31) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void nothing_kernel(int *out) { out[threadIdx.x] = 7; }

/* ------------------------------------------------------------------ tests */

/* The launch's error, with the simulator's detail checked for `needle`. */
static cudaError_t launched(const char *needle) {
    cudaError_t err = cudaGetLastError();
    const int found = needle != nullptr && strstr(cudaGetErrorString(err), needle) != nullptr;
    if (err != cudaSuccess && !found) printf("launch error: %s\n", cudaGetErrorString(err));
    if (err != cudaSuccess && needle != nullptr && !found) failures++;
    return err;
}

static void test_ids() {
    const int n = 2 * 3 * 2 * 4 * 2 * 4;
    int *out = device_array(n, -1), *blocks = device_array(1, 0);
    ND_LAUNCH(ids_kernel, dim3(2, 3, 2), dim3(4, 2, 4), 0, 0, out, blocks);
    CHECK(launched(nullptr) == cudaSuccess);
    const int64_t cap = nd_sim_get_options()->max_blocks;
    CHECK(cap > 0 && cap < 12 ? *blocks >= 1 && *blocks <= cap : *blocks == 12);
    int wrong = 0;
    for (int i = 0; i < n; i++) wrong += out[i] != (i < *blocks * 32 ? i : -1);
    CHECK(wrong == 0);
    cudaFree(out);
    cudaFree(blocks);
}

static void test_block_sum() {
    const int blocks = 40;
    float *in = device_array(blocks * 256, 0.0f), *out = device_array(blocks, -1.0f);
    for (int i = 0; i < blocks * 256; i++) in[i] = (float)(i % 256) + (float)(i / 256);
    ND_LAUNCH(block_sum_kernel, blocks, 256, 0, 0, in, out, blocks);
    CHECK(launched(nullptr) == cudaSuccess);
    for (int b = 0; b < blocks; b++) CHECK(out[b] == 255.0f * 128.0f + 256.0f * (float)b);
    cudaFree(in);
    cudaFree(out);
}

/* Whether a kernel without a needed barrier went wrong as it should: always
 * under NEEDLE_SIM_PERTURB=1; never in the plain order with every block
 * launched (which is why the perturbation exists); with the grid capped, the
 * plain order may or may not show it. */
static void check_race_shown(int wrong) {
    const nd_sim_options *o = nd_sim_get_options();
    if (o->perturb) CHECK(wrong > 0);
    else if (o->max_blocks == 0) CHECK(wrong == 0);
}

/* The kernel with the barrier is right however threads are scheduled. */
static void test_missing_barrier() {
    const int blocks = 64, threads = 256;
    int *out = device_array(blocks * threads, -1);
    for (int barrier = 1; barrier >= 0; barrier--) {
        ND_LAUNCH(publish_kernel, blocks, threads, 0, 0, out, blocks, barrier);
        CHECK(launched(nullptr) == cudaSuccess);
        int wrong = 0;
        for (int i = 0; i < blocks * threads; i++) wrong += out[i] != 1000 + i / threads;
        if (barrier) CHECK(wrong == 0);
        else check_race_shown(wrong);
        if (!barrier) printf("missing barrier: %d of %d values wrong\n", wrong, blocks * threads);
    }
    cudaFree(out);
}

static void test_missing_second_barrier() {
    const int outputs = 48;
    float *in = device_array(outputs * 256, 0.0f), *out = device_array(outputs, -1.0f);
    for (int i = 0; i < outputs * 256; i++) in[i] = (float)(i / 256 + 1);
    for (int second = 1; second >= 0; second--) {
        /* 4 blocks: each block reduces 12 outputs, so partial is reused. */
        ND_LAUNCH(two_level_sum_kernel, 4, 256, 0, 0, in, out, outputs, second);
        CHECK(launched(nullptr) == cudaSuccess);
        int wrong = 0;
        for (int o = 0; o < outputs; o++) wrong += out[o] != 256.0f * (float)(o + 1);
        if (second) CHECK(wrong == 0);
        else check_race_shown(wrong);
        if (!second) printf("missing second barrier: %d of %d sums wrong\n", wrong, outputs);
    }
    cudaFree(in);
    cudaFree(out);
}

static void test_warp_ops() {
    const int threads = 64;
    int *out = device_array(threads * 8, -99);
    ND_LAUNCH(warp_ops_kernel, 1, threads, 0, 0, out);
    CHECK(launched(nullptr) == cudaSuccess);
    for (int t = 0; t < threads; t++) {
        const int lane = t % 32, *o = out + t * 8;
        if (lane == 0) CHECK(o[0] == 496);
        CHECK(o[1] == 496);
        CHECK(o[2] == 30);
        CHECK(o[3] == lane / 8 * 8 + 1);
        CHECK(o[4] == lane + 1);
        CHECK((unsigned)o[5] == 0x55555555u);
        CHECK(o[6] == 3);
        CHECK(o[7] == (lane < 16 ? (lane % 16 + 8 < 16 ? lane + 8 : lane) : -1));
    }
    cudaFree(out);
}

static void test_atomics() {
    float *fsum = device_array(1, 0.0f);
    int *count = device_array(1, 0);
    unsigned long long *lowest = device_array(1, ~0ull);
    ND_LAUNCH(atomics_kernel, 10, 128, 0, 0, fsum, count, lowest);
    CHECK(launched(nullptr) == cudaSuccess);
    const nd_sim_options *o = nd_sim_get_options();
    const int blocks = o->max_blocks > 0 && o->max_blocks < 10 ? (int)o->max_blocks : 10;
    CHECK(*count == blocks * 128);
    CHECK(*fsum == 0.5f * (float)(blocks * 128));
    CHECK(*lowest ==
          (blocks * 128 > 699 ? 301ull : 1000ull - (unsigned long long)(blocks * 128 - 1)));
    cudaFree(fsum);
    cudaFree(count);
    cudaFree(lowest);
}

static void test_dynamic_shared() {
    const int blocks = 3, threads = 96;
    float *in = device_array(blocks * threads, 0.0f), *out = device_array(blocks * threads, 0.0f);
    unsigned *before = device_array(blocks * threads, 0u);
    for (int i = 0; i < blocks * threads; i++) in[i] = (float)i;
    ND_LAUNCH(dynamic_kernel, blocks, threads, threads * sizeof(float), 0, in, out, before);
    CHECK(launched(nullptr) == cudaSuccess);
    const nd_sim_options *o = nd_sim_get_options();
    const int ran = o->max_blocks > 0 && o->max_blocks < blocks ? (int)o->max_blocks : blocks;
    for (int b = 0; b < ran; b++)
        for (int t = 0; t < threads; t++) {
            CHECK(out[b * threads + t] == (float)(b * threads + threads - 1 - t));
            CHECK(before[b * threads + t] == 0xFFFFFFFFu); /* refilled before every block */
        }
    cudaFree(in);
    cudaFree(out);
    cudaFree(before);
}

static void test_by_value_and_block_cap() {
    int *out = device_array(64, 0);
    ND_LAUNCH(by_value_kernel, 1, 64, 0, 0, 100, out);
    CHECK(launched(nullptr) == cudaSuccess);
    for (int t = 0; t < 64; t++) CHECK(out[t] == 100 + t);
    cudaFree(out);

    const int n = 100000;
    int *values = device_array(n, -1);
    unsigned *grid_seen = device_array(1, 0u);
    ND_LAUNCH(grid_stride_kernel, (n + 255) / 256, 256, 0, 0, n, values, grid_seen);
    CHECK(launched(nullptr) == cudaSuccess);
    int wrong = 0;
    for (int i = 0; i < n; i++) wrong += values[i] != 2 * i;
    CHECK(wrong == 0);
    const int64_t cap = nd_sim_get_options()->max_blocks;
    CHECK(*grid_seen == (cap > 0 && cap < (n + 255) / 256 ? (unsigned)cap : (n + 255) / 256u));
    cudaFree(values);
    cudaFree(grid_seen);
}

static void test_failures() {
    int *out = device_array(256, 0);
    ND_LAUNCH(early_return_kernel, 2, 256, 0, 0, out);
    CHECK(launched("returned") == cudaErrorLaunchFailure);
    CHECK(cudaGetLastError() == cudaSuccess); /* read once, and not sticky: */
    ND_LAUNCH(nothing_kernel, 1, 256, 0, 0, out);
    CHECK(launched(nullptr) == cudaSuccess && out[255] == 7);

    ND_LAUNCH(divergent_barrier_kernel, 1, 128, 0, 0, out);
    CHECK(launched("divergent barriers") == cudaErrorLaunchFailure);
    ND_LAUNCH(shuffle_after_return_kernel, 1, 64, 0, 0, out);
    CHECK(launched("__shfl_down_sync") == cudaErrorLaunchFailure);
    CHECK(strcmp(cudaGetErrorName(cudaErrorLaunchFailure), "cudaErrorLaunchFailure") == 0);
    /* CUDA's own names and strings */
    CHECK(strcmp(cudaGetErrorString(cudaSuccess), "no error") == 0);
    CHECK(strcmp(cudaGetErrorName(cudaErrorInsufficientDriver), "cudaErrorInsufficientDriver") ==
          0);
    CHECK(strcmp(cudaGetErrorString(cudaErrorInsufficientDriver),
                 "CUDA driver version is insufficient for CUDA runtime version") == 0);
    CHECK(strcmp(cudaGetErrorName((cudaError_t)12345), "unrecognized error code") == 0);
    CHECK(strcmp(cudaGetErrorString((cudaError_t)12345), "unrecognized error code") == 0);

    ND_LAUNCH(nothing_kernel, 1, 2048, 0, 0, out);
    CHECK(launched(nullptr) == cudaErrorInvalidConfiguration);
    ND_LAUNCH(nothing_kernel, 0, 32, 0, 0, out);
    CHECK(launched(nullptr) == cudaErrorInvalidConfiguration);
    ND_LAUNCH(nothing_kernel, dim3(1, 70000), 32, 0, 0, out);
    CHECK(launched(nullptr) == cudaErrorInvalidConfiguration);
    ND_LAUNCH(nothing_kernel, 1, 32, 64 * 1024, 0, out);
    CHECK(launched(nullptr) == cudaErrorInvalidValue);
    ND_LAUNCH(nothing_kernel, 1, 32, 0, (cudaStream_t)0x1234, out);
    CHECK(launched(nullptr) == cudaErrorInvalidResourceHandle);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    cudaFree(out);
}

static void test_memory() {
    const int64_t capacity = nd_sim_get_options()->memory;
    size_t free0 = 0, total = 0;
    CHECK(cudaMemGetInfo(&free0, &total) == cudaSuccess);
    CHECK((int64_t)total == capacity && free0 <= total);
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    CHECK((int64_t)prop.totalGlobalMem == capacity);
    CHECK(strcmp(prop.name, "needle CUDA simulator (CPU)") == 0);
    CHECK(cudaGetDeviceProperties(&prop, 1) == cudaErrorInvalidDevice);
    (void)cudaGetLastError();

    void *p = nullptr;
    CHECK(cudaMalloc(&p, 1000) == cudaSuccess && p != nullptr && (uintptr_t)p % 256 == 0);
    size_t free1 = 0;
    cudaMemGetInfo(&free1, &total);
    CHECK(free0 - free1 == 1024);             /* 256-byte granules */
    CHECK(((unsigned char *)p)[999] == 0xFF); /* new memory reads as NaN */
    void *too_big = &free1;
    CHECK(cudaMalloc(&too_big, (size_t)capacity) == cudaErrorMemoryAllocation);
    CHECK(too_big == nullptr); /* as CUDA: a failed cudaMalloc sets *ptr NULL */
    CHECK(strstr(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") != nullptr);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    void *q = nullptr;
    CHECK(cudaMalloc(&q, 1000) == cudaSuccess);
    char host[2000];
    memset(host, 3, sizeof host);
    CHECK(cudaMemcpy(q, host, 1000, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(q, host, 1025, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(host, (char *)q + 10, 1020, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(host, host + 1, 10, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(host, q, 10, (cudaMemcpyKind)9) == cudaErrorInvalidMemcpyDirection);
    CHECK(cudaMemsetAsync((char *)q + 1000, 0, 100, 0) == cudaErrorInvalidValue);
    CHECK(cudaMemset(q, 0, 1000) == cudaSuccess && ((char *)q)[999] == 0);
    CHECK(cudaFree((char *)q + 8) == cudaErrorInvalidValue);
    cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, (char *)q + 8) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice && attr.device == 0);
    CHECK(cudaPointerGetAttributes(&attr, host) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeUnregistered);
    CHECK(cudaFree(q) == cudaSuccess && cudaFree(p) == cudaSuccess && cudaFree(nullptr) == 0);
    size_t free2 = 0;
    cudaMemGetInfo(&free2, &total);
    CHECK(free2 == free0);
    (void)cudaGetLastError();
}

static void test_streams_and_events() {
    cudaStream_t s = nullptr;
    cudaEvent_t a = nullptr, b = nullptr;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    CHECK(cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess);
    CHECK(cudaEventRecord(a, s) == cudaSuccess);
    int *out = device_array(32, 0);
    ND_LAUNCH(nothing_kernel, 1, 32, 0, s, out);
    CHECK(launched(nullptr) == cudaSuccess && out[31] == 7);
    CHECK(cudaEventRecord(b, s) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(cudaStreamPerThread, b, 0) == cudaSuccess);
    CHECK(cudaEventQuery(b) == cudaSuccess && cudaStreamQuery(s) == cudaSuccess);
    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 0.0f);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cudaEventDestroy(a) == cudaSuccess && cudaEventDestroy(b) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaErrorInvalidResourceHandle);
    CHECK(cudaEventQuery(a) == cudaErrorInvalidResourceHandle);
    CHECK(cudaMemcpyAsync(out, out, 4, cudaMemcpyDeviceToDevice, s) ==
          cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    cudaFree(out);
}

int main() {
    const nd_sim_options *o = nd_sim_get_options();
    int count = -1;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (!o->valid) {
        /* A malformed switch: no device, and the error names the variable. */
        CHECK(err == cudaErrorInvalidValue && count == 0);
        CHECK(strstr(cudaGetErrorString(err), "NEEDLE_SIM_") != nullptr);
        printf("%s\n", cudaGetErrorString(err));
        ND_LAUNCH(nothing_kernel, 1, 32, 0, 0, (int *)nullptr);
        CHECK(cudaGetLastError() == cudaErrorInvalidValue);
        printf("%d failure(s)\n", failures);
        return failures != 0;
    }
    CHECK(err == cudaSuccess && count == 1);
    printf("switches: memory %lld, max_blocks %lld, perturb %d\n", (long long)o->memory,
           (long long)o->max_blocks, o->perturb);
    test_memory();
    if (o->memory >= (int64_t)64 << 20) { /* the kernels need a few MiB */
        const int before = launches;
        test_ids();
        CHECK(launches == before + 1); /* test_ids launches once */
        test_block_sum();
        test_missing_barrier();
        test_missing_second_barrier();
        test_warp_ops();
        test_atomics();
        test_dynamic_shared();
        test_by_value_and_block_cap();
        test_failures();
        test_streams_and_events();
        test_capture(); /* cuda_sim_capture.cc */
    }
    printf("%d failure(s)\n", failures);
    return failures != 0;
}
