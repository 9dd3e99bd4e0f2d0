/* cuda_amp.cu: GradScaler's unscale on the GPU (amp_unscale.h): one
 * grid-stride kernel launch per gradient multiplies it in place through its
 * view and tests each element for inf/NaN in the same pass, as PyTorch's
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

/* grad: it.numel elements reached through it.strides[0] (any view that
 * visits each element once); found_inf: one float, set, never cleared. */
__global__ void amp_unscale_kernel(nd_cuda_iter it, float *grad, float *found_inf,
                                   float inv_scale) {
    bool seen = false;
    const bool contiguous = it.ndim == 1 && it.strides[0][0] == 1;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[1] = {i};
        if (!contiguous) nd_cuda_offsets<1>(it, i, off);
        const float v = grad[off[0]];
        seen |= non_finite(v);
        grad[off[0]] = v * inv_scale;
    }
    if (seen) *found_inf = 1.0f;
}

nd_status nd_cuda_amp_unscale(const nd_amp_unscale_desc *d) {
    const nd_layout *layouts[1] = {d->layout};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, d->layout->ndim, d->layout->shape, 1, layouts);
    if (it.numel == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(d->grad, NULL));
    cudaStream_t stream = 0;
    ND_LAUNCH(amp_unscale_kernel, nd_cuda_blocks(it.numel, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
              stream, it, d->grad + d->layout->offset, d->found_inf, d->inv_scale);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
