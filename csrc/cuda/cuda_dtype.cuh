/* cuda_dtype.cuh: the CUDA backend's element types: one storage type per
 * nd_dtype (the narrow ones as 16-bit words, converted by dtype_convert.h's
 * bit-exact functions so the GPU rounds as the CPU does), the type each one
 * computes in, and the dispatch from a run-time nd_dtype to a template. */
#ifndef NEEDLE_CUDA_DTYPE_CUH
#define NEEDLE_CUDA_DTYPE_CUH

#include "cuda_common.cuh"

#define ND_CONVERT_FN static __host__ __device__ __forceinline__
#include "../dtype_convert.h"

/* float16 and bfloat16 in memory: distinct types for the templates. */
struct nd_half_t {
    uint16_t bits;
};
struct nd_bf16_t {
    uint16_t bits;
};

/* compute: what values of storage type T are worked on in (float for the
 * 32- and 16-bit types, double for float64); load/store convert. */
template <class T> struct nd_dtype_traits;
template <> struct nd_dtype_traits<float> {
    typedef float compute;
    static __host__ __device__ __forceinline__ float load(float v) { return v; }
    static __host__ __device__ __forceinline__ float store(double v) { return (float)v; }
    static __host__ __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct nd_dtype_traits<double> {
    typedef double compute;
    static __host__ __device__ __forceinline__ double load(double v) { return v; }
    static __host__ __device__ __forceinline__ double store(double v) { return v; }
};
template <> struct nd_dtype_traits<nd_half_t> {
    typedef float compute;
    static __host__ __device__ __forceinline__ float load(nd_half_t v) {
        return nd_half_to_float(v.bits);
    }
    static __host__ __device__ __forceinline__ nd_half_t store(float v) {
        nd_half_t h = {nd_float_to_half(v)};
        return h;
    }
    static __host__ __device__ __forceinline__ nd_half_t store(double v) { return store((float)v); }
};
template <> struct nd_dtype_traits<nd_bf16_t> {
    typedef float compute;
    static __host__ __device__ __forceinline__ float load(nd_bf16_t v) {
        return nd_bf16_to_float(v.bits);
    }
    static __host__ __device__ __forceinline__ nd_bf16_t store(float v) {
        nd_bf16_t h = {nd_float_to_bf16(v)};
        return h;
    }
    static __host__ __device__ __forceinline__ nd_bf16_t store(double v) { return store((float)v); }
};

/* Calls f.template operator()<T>() for the storage type T of dtype;
 * ND_ERR_VALUE for a value outside the enum. */
template <class F> static nd_status nd_cuda_with_dtype(nd_dtype dtype, F &f) {
    switch (dtype) {
    case ND_FLOAT32: return f.template operator()<float>();
    case ND_FLOAT16: return f.template operator()<nd_half_t>();
    case ND_BFLOAT16: return f.template operator()<nd_bf16_t>();
    case ND_FLOAT64: return f.template operator()<double>();
    default: return nd_fail(ND_ERR_VALUE, "unknown dtype %d", (int)dtype);
    }
}

#endif /* NEEDLE_CUDA_DTYPE_CUH */
