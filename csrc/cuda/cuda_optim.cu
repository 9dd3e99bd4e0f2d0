/* cuda_optim.cu: the fused optimizer updates on the GPU (optim_update.h):
 * one grid-stride kernel launch per parameter reads param, grad and the
 * moments once and writes the new parameter and the moments once, where the
 * unfused course code ran about fourteen elementwise kernels (Adam) or five
 * (SGD), each into a new array.
 *
 * The arithmetic is the CPU's (cpu_optim.inc), operation for operation:
 * products and sums are rounded one at a time (nvcc would otherwise contract
 * a*b + c into an FMA), division and sqrtf are IEEE-rounded (nvcc's default
 * -prec-div, -prec-sqrt), so both backends give the same bits. Operands are
 * contiguous (optim_update.c compacts strided ones); the default stream; no
 * device memory is allocated and the host never waits here.
 */
#include "cuda_common.cuh"

extern "C" {
#include "../optim_update.h"
}

/* a * b, a + b and a - b rounded to float each, never fused. The
 * simulator's host compiler contracts nothing in ISO C++ mode. */
__device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
__device__ __forceinline__ float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
__device__ __forceinline__ float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

/* The gradient with L2 decay added, as the unfused code adds it: only when
 * the decay is nonzero (p * 0 would turn an infinite p into NaN). */
__device__ __forceinline__ float decayed_grad(float g, float p, float weight_decay) {
    return weight_decay != 0.0f ? add_rn(g, mul_rn(p, weight_decay)) : g;
}

/* out, param, grad, m, v: (n,) contiguous; m and v updated in place. */
__global__ void adam_update_kernel(int64_t n, float *out, const float *param, const float *grad,
                                   float *m, float *v, nd_adam_hyper h) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float p = param[i];
        const float g = decayed_grad(grad[i], p, h.weight_decay);
        const float mi = add_rn(mul_rn(m[i], h.beta1), mul_rn(g, h.one_minus_beta1));
        const float vi = add_rn(mul_rn(v[i], h.beta2), mul_rn(mul_rn(g, g), h.one_minus_beta2));
        m[i] = mi;
        v[i] = vi;
        const float step = mul_rn(mi / h.bias_correction1, h.lr);
        out[i] = sub_rn(p, step / add_rn(sqrtf(vi / h.bias_correction2), h.eps));
    }
}

/* out, param, grad, u: (n,) contiguous; u updated in place. */
__global__ void sgd_update_kernel(int64_t n, float *out, const float *param, const float *grad,
                                  float *u, nd_sgd_hyper h) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float p = param[i];
        const float g = decayed_grad(grad[i], p, h.weight_decay);
        const float ui = add_rn(mul_rn(u[i], h.momentum), mul_rn(g, h.one_minus_momentum));
        u[i] = ui;
        out[i] = sub_rn(p, mul_rn(ui, h.lr));
    }
}

nd_status nd_cuda_adam_update(const nd_adam_desc *d) {
    ND_TRY(nd_cuda_activate(d->param_out, NULL));
    cudaStream_t stream = 0;
    ND_LAUNCH(adam_update_kernel, nd_cuda_blocks(d->n, ND_CUDA_THREADS), ND_CUDA_THREADS, 0, stream,
              d->n, d->param_out, d->param, d->grad, d->m, d->v, d->hyper);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

nd_status nd_cuda_sgd_update(const nd_sgd_desc *d) {
    ND_TRY(nd_cuda_activate(d->param_out, NULL));
    cudaStream_t stream = 0;
    ND_LAUNCH(sgd_update_kernel, nd_cuda_blocks(d->n, ND_CUDA_THREADS), ND_CUDA_THREADS, 0, stream,
              d->n, d->param_out, d->param, d->grad, d->u, d->hyper);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
