/* cuda_amp.cu: GradScaler's unscale on the GPU (amp_unscale.h): one
 * grid-stride kernel launch per gradient multiplies it in place through its
 * view, in float32 or float64 as the gradient is, and tests each element for
 * inf/NaN in the same pass, as PyTorch's
 * _amp_foreach_non_finite_check_and_unscale_ does.
 *
 * The flag is a device float that threads which saw a non-finite element
 * set to 1.0f (all writers store the same value, so no atomic is needed and
 * nothing is read back): the host reads it once per optimizer step, never
 * per gradient. The default stream; no device memory is allocated.
 */
#include "cuda_common.cuh"

extern "C" {
#include "../amp_unscale.h"
}

/* True for inf and NaN: the exponent bits all ones. Read from the bits so
 * that no fast-math flag can fold the test away. */
__device__ __forceinline__ bool non_finite(float v) {
#ifdef __CUDA_ARCH__
    const uint32_t bits = (uint32_t)__float_as_uint(v);
#else
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
#endif
    return (bits & 0x7f800000u) == 0x7f800000u;
}
__device__ __forceinline__ bool non_finite(double v) {
#ifdef __CUDA_ARCH__
    const uint64_t bits = (uint64_t)__double_as_longlong(v);
#else
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
#endif
    return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}

/* grad: it.numel elements of T reached through it.strides[0] (any view that
 * visits each element once), multiplied in T; found_inf: one float, set,
 * never cleared. */
template <typename T>
__device__ __forceinline__ void unscale_elements(const nd_cuda_iter &it, T *grad, float *found_inf,
                                                 T inv_scale) {
    bool seen = false;
    const bool contiguous = it.ndim == 1 && it.strides[0][0] == 1;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[1] = {i};
        if (!contiguous) nd_cuda_offsets<1>(it, i, off);
        const T v = grad[off[0]];
        seen |= non_finite(v);
        grad[off[0]] = v * inv_scale;
    }
    if (seen) *found_inf = 1.0f;
}

/* One kernel per dtype, named apart so that the census says which ran. */
__global__ void amp_unscale_kernel(nd_cuda_iter it, float *grad, float *found_inf,
                                   float inv_scale) {
    unscale_elements(it, grad, found_inf, inv_scale);
}

__global__ void amp_unscale_f64_kernel(nd_cuda_iter it, double *grad, float *found_inf,
                                       double inv_scale) {
    unscale_elements(it, grad, found_inf, inv_scale);
}

nd_status nd_cuda_amp_unscale(const nd_amp_unscale_desc *d) {
    const nd_layout *layouts[1] = {d->layout};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, d->layout->ndim, d->layout->shape, 1, layouts);
    if (it.numel == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(d->grad, NULL));
    cudaStream_t stream = nd_cuda_stream();
    const unsigned int blocks = nd_cuda_blocks(it.numel, ND_CUDA_THREADS);
    if (d->dtype == ND_FLOAT64)
        ND_LAUNCH(amp_unscale_f64_kernel, blocks, ND_CUDA_THREADS, 0, stream, it,
                  (double *)d->grad + d->layout->offset, d->found_inf, (double)d->inv_scale);
    else
        ND_LAUNCH(amp_unscale_kernel, blocks, ND_CUDA_THREADS, 0, stream, it,
                  (float *)d->grad + d->layout->offset, d->found_inf, d->inv_scale);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
