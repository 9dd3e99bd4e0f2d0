/* cuda_optim.cu: the fused optimizer updates on the GPU (optim_update.h):
 * one grid-stride kernel launch per parameter reads param, grad and the
 * moments once and writes the new parameter and the moments once, where the
 * unfused course code ran about fourteen elementwise kernels (Adam) or five
 * (SGD), each into a new array.
 *
 * The arithmetic is the CPU's (cpu_optim.inc), operation for operation, in
 * float32 or float64 as the desc says: products and sums are rounded one at a
 * time (nvcc would otherwise contract a*b + c into an FMA), division and sqrt
 * are IEEE-rounded (nvcc's default -prec-div, -prec-sqrt for float; always
 * for double), so both backends give the same bits. Operands are
 * contiguous (optim_update.c compacts strided ones); the current stream; no
 * device memory is allocated and the host never waits here. A capturable Adam
 * (PyTorch's capturable=True) keeps t and lr in device memory: its kernels
 * read them, and compute the bias corrections from t, when they run, so a
 * CUDA graph replay takes each step's values; its t += 1 is a kernel too.
 */
#include "cuda_common.cuh"

extern "C" {
#include "../optim_update.h"
}

/* a * b, a + b and a - b rounded to their type each, never fused. The simulator's
 * host compiler contracts nothing in ISO C++ mode. */
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
__device__ __forceinline__ double mul_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
__device__ __forceinline__ double add_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}
__device__ __forceinline__ double sub_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}

__device__ __forceinline__ float sqrt_rn(float a) { return sqrtf(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return sqrt(a); }

/* The gradient with L2 decay added, as the unfused code adds it: only when
 * the decay is nonzero (p * 0 would turn an infinite p into NaN). */
template <typename T> __device__ __forceinline__ T decayed_grad(T g, T p, T weight_decay) {
    return weight_decay != T(0) ? add_rn(g, mul_rn(p, weight_decay)) : g;
}

/* The hyperparameters of one update in the type it computes in: the float32
 * kernels take each host double rounded to float32, as the CPU does. */
template <typename T> struct adam_coefs {
    T lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay;
    T bias_correction1, bias_correction2;
};
template <typename T> static adam_coefs<T> adam_coefs_of(const nd_adam_hyper &h) {
    adam_coefs<T> c = {(T)h.lr,
                       (T)h.beta1,
                       (T)h.one_minus_beta1,
                       (T)h.beta2,
                       (T)h.one_minus_beta2,
                       (T)h.eps,
                       (T)h.weight_decay,
                       (T)h.bias_correction1,
                       (T)h.bias_correction2};
    return c;
}
/* Where a capturable step's lr and t are (optim_update.h's desc.state: NULL
 * for the host's coefficients), with the betas in double to compute the bias
 * corrections from t in the kernel, as the host does for the others. */
struct adam_state {
    const double *state; /* (2,): t, lr */
    double beta1, beta2;
};

/* h, or with a state the lr and bias corrections read from it now (the same
 * inline double arithmetic as the host's, rounded to T as the host's are).
 * Thread 0 of each block computes them into `now` (the kernel's __shared__):
 * the double-double power is some hundred double operations, slow on a GPU
 * with few double units if every thread ran it. s.state is the same for the
 * whole grid, so every thread of a block reaches the barrier or none does. */
template <typename T>
__device__ __forceinline__ adam_coefs<T> adam_coefs_now(const adam_coefs<T> &h, const adam_state &s,
                                                        adam_coefs<T> *now) {
    if (s.state == NULL) return h;
    if (threadIdx.x == 0) {
        const double t = s.state[0];
        adam_coefs<T> c = h;
        c.lr = (T)s.state[1];
        c.bias_correction1 = (T)nd_adam_bias_correction_inline(s.beta1, t);
        c.bias_correction2 = (T)nd_adam_bias_correction_inline(s.beta2, t);
        *now = c;
    }
    __syncthreads();
    return *now;
}

template <typename T> struct sgd_coefs {
    T lr, momentum, one_minus_momentum, weight_decay;
};
template <typename T> static sgd_coefs<T> sgd_coefs_of(const nd_sgd_hyper &h) {
    sgd_coefs<T> c = {(T)h.lr, (T)h.momentum, (T)h.one_minus_momentum, (T)h.weight_decay};
    return c;
}

/* One element of the Adam step; m and v updated in place. Division and sqrt
 * are IEEE-rounded for both float and double. */
template <typename T>
__device__ __forceinline__ void adam_element(int64_t i, T *out, const T *param, const T *grad, T *m,
                                             T *v, const adam_coefs<T> &h) {
    const T p = param[i];
    const T g = decayed_grad(grad[i], p, h.weight_decay);
    const T mi = add_rn(mul_rn(m[i], h.beta1), mul_rn(g, h.one_minus_beta1));
    const T vi = add_rn(mul_rn(v[i], h.beta2), mul_rn(mul_rn(g, g), h.one_minus_beta2));
    m[i] = mi;
    v[i] = vi;
    const T step = mul_rn(mi / h.bias_correction1, h.lr);
    out[i] = sub_rn(p, step / add_rn(sqrt_rn(vi / h.bias_correction2), h.eps));
}

template <typename T>
__device__ __forceinline__ void sgd_element(int64_t i, T *out, const T *param, const T *grad, T *u,
                                            const sgd_coefs<T> &h) {
    const T p = param[i];
    const T g = decayed_grad(grad[i], p, h.weight_decay);
    const T ui = add_rn(mul_rn(u[i], h.momentum), mul_rn(g, h.one_minus_momentum));
    u[i] = ui;
    out[i] = sub_rn(p, mul_rn(ui, h.lr));
}

/* The kernels, one per dtype, named apart (not one template) so that the
 * census reports which ran. out, param, grad and the state: (n,) contiguous;
 * the state updated in place; out may be param (a capturable step, in place:
 * each element is read before it is written, by the same thread). */
__global__ void adam_update_kernel(int64_t n, float *out, const float *param, const float *grad,
                                   float *m, float *v, adam_coefs<float> h, adam_state s) {
    __shared__ adam_coefs<float> now;
    const adam_coefs<float> c = adam_coefs_now(h, s, &now);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        adam_element(i, out, param, grad, m, v, c);
}

__global__ void adam_update_f64_kernel(int64_t n, double *out, const double *param,
                                       const double *grad, double *m, double *v,
                                       adam_coefs<double> h, adam_state s) {
    __shared__ adam_coefs<double> now;
    const adam_coefs<double> c = adam_coefs_now(h, s, &now);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        adam_element(i, out, param, grad, m, v, c);
}

/* A capturable Adam's t += 1 (state (2,): t, lr), one thread, queued before
 * the step's updates on the same stream. */
__global__ void adam_count_step_kernel(double *state) { state[0] = state[0] + 1.0; }

__global__ void sgd_update_kernel(int64_t n, float *out, const float *param, const float *grad,
                                  float *u, sgd_coefs<float> h) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        sgd_element(i, out, param, grad, u, h);
}

__global__ void sgd_update_f64_kernel(int64_t n, double *out, const double *param,
                                      const double *grad, double *u, sgd_coefs<double> h) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        sgd_element(i, out, param, grad, u, h);
}

nd_status nd_cuda_adam_update(const nd_adam_desc *d) {
    if (d->count) {
        ND_TRY(nd_cuda_activate(d->state, NULL));
        ND_LAUNCH(adam_count_step_kernel, 1, 1, 0, nd_cuda_stream(), d->state);
        ND_CUDA_CHECK(cudaGetLastError());
        return ND_OK;
    }
    ND_TRY(nd_cuda_activate(d->param_out, NULL));
    cudaStream_t stream = nd_cuda_stream();
    const unsigned int blocks = nd_cuda_blocks(d->n, ND_CUDA_THREADS);
    const adam_state s = {d->state, d->hyper.beta1, d->hyper.beta2};
    if (d->dtype == ND_FLOAT64)
        ND_LAUNCH(adam_update_f64_kernel, blocks, ND_CUDA_THREADS, 0, stream, d->n,
                  (double *)d->param_out, (const double *)d->param, (const double *)d->grad,
                  (double *)d->m, (double *)d->v, adam_coefs_of<double>(d->hyper), s);
    else
        ND_LAUNCH(adam_update_kernel, blocks, ND_CUDA_THREADS, 0, stream, d->n,
                  (float *)d->param_out, (const float *)d->param, (const float *)d->grad,
                  (float *)d->m, (float *)d->v, adam_coefs_of<float>(d->hyper), s);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

nd_status nd_cuda_sgd_update(const nd_sgd_desc *d) {
    ND_TRY(nd_cuda_activate(d->param_out, NULL));
    cudaStream_t stream = nd_cuda_stream();
    const unsigned int blocks = nd_cuda_blocks(d->n, ND_CUDA_THREADS);
    if (d->dtype == ND_FLOAT64)
        ND_LAUNCH(sgd_update_f64_kernel, blocks, ND_CUDA_THREADS, 0, stream, d->n,
                  (double *)d->param_out, (const double *)d->param, (const double *)d->grad,
                  (double *)d->u, sgd_coefs_of<double>(d->hyper));
    else
        ND_LAUNCH(sgd_update_kernel, blocks, ND_CUDA_THREADS, 0, stream, d->n,
                  (float *)d->param_out, (const float *)d->param, (const float *)d->grad,
                  (float *)d->u, sgd_coefs_of<float>(d->hyper));
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
