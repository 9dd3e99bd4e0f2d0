/* cuda_sim_selftest.h: what the CUDA simulator's self-test
 * (cuda_sim_selftest.cc, with main) shares with the part of it in
 * cuda_sim_capture.cc, linked into the same program: the failure count and
 * CHECK, device arrays, the kernels both launch, and the capture tests' entry.
 */
#ifndef NEEDLE_CUDA_SIM_SELFTEST_H
#define NEEDLE_CUDA_SIM_SELFTEST_H

/* The C++ library before cuda_runtime.h, whose __noinline__ macro it trips on. */
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include <cuda_runtime.h>

#include <stdio.h>

#include "cuda.h"
#include "cuda/cuda_launch.cuh"
#include "sim_cublas.h"
#include "sim_internal.h"

/* Records a failure; prints the first few (a wrong kernel fails many checks). */
extern int failures;
#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond) && failures++ < 20) printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
    } while (0)

/* Device memory holding n copies of value, or NULL. */
template <class T> static inline T *device_array(int64_t n, T value) {
    T *p = nullptr;
    if (cudaMalloc(&p, (size_t)n * sizeof(T)) != cudaSuccess) return nullptr;
    for (int64_t i = 0; i < n; i++) p[i] = value; /* simulated device memory is host memory */
    return p;
}

/* out[threadIdx.x] = 7 */
__global__ void nothing_kernel(int *out);
/* Thread 5 returns before a barrier the others wait at: the launch fails. */
__global__ void early_return_kernel(int *out);

/* Stream capture, graphs and their replay (cuda_sim_capture.cc). */
void test_capture(void);

#endif /* NEEDLE_CUDA_SIM_SELFTEST_H */
