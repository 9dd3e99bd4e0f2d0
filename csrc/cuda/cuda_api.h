/* cuda_api.h: the few CUDA-backend entry points that live outside the
 * nd_backend table, for the binding (needle_c/cuda_info.c) and device.c.
 *
 * Plain C, no CUDA headers, no Python.h: it is included by C files compiled
 * without nvcc. Every function reports an nd_status like the rest of the
 * engine and never prints.
 */
#ifndef NEEDLE_CUDA_API_H
#define NEEDLE_CUDA_API_H

#include "../engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers one engine device per visible GPU; returns how many. A failure
 * of device discovery (no driver, no GPU) registers none, silently. */
int nd_cuda_register_devices(void);

/* The driver's view of GPU `ordinal`: free and total bytes (cudaMemGetInfo).
 * ND_ERR_DEVICE when there is no such registered GPU. */
nd_status nd_cuda_mem_get_info(int ordinal, int64_t *free_bytes, int64_t *total_bytes);

/* Which GEMM the CUDA backend runs: "cublas (<library>)" or a description of
 * needle's own kernel when cuBLAS cannot be loaded. Loads cuBLAS on first
 * use; never fails. */
const char *nd_cuda_gemm_description(void);

/* 1 when the backend runs on the CUDA simulator (a NEEDLE_CUDA=sim build:
 * csrc/cuda/sim), 0 on a real GPU runtime. */
int nd_cuda_simulated(void);

/* The name of GPU `ordinal` (cudaDeviceProp.name) into buf (NUL-terminated,
 * cut to size). ND_ERR_DEVICE when there is no such registered GPU. */
nd_status nd_cuda_device_name(int ordinal, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* NEEDLE_CUDA_API_H */
