/* cuda_ewise.cu: the elementwise kernels of the CUDA backend: copies and
 * fills into strided views, binary ops (arrays and scalars, broadcast) and
 * unary ops, over strided float32 operands.
 *
 * The host side collapses each iteration space (nd_cuda_iter_make); a space
 * that becomes one dimension runs a flat kernel, others compute offsets per
 * element. Results match the CPU backend's definitions (NaN propagation in
 * maximum/minimum/relu, 1.0/0.0 comparisons, exact small scalar powers); the
 * transcendental functions are CUDA's (expf, logf, tanhf, powf), within a
 * few ulp of the CPU's. Launches use the default stream; no device memory is
 * allocated here.
 */
#include "cuda_common.cuh"

#include <string.h>

/* ----------------------------------------------------------- operations */

struct op_add {
    __device__ float operator()(float x, float y) const { return x + y; }
};
struct op_sub {
    __device__ float operator()(float x, float y) const { return x - y; }
};
struct op_mul {
    __device__ float operator()(float x, float y) const { return x * y; }
};
struct op_div {
    __device__ float operator()(float x, float y) const { return x / y; }
};
struct op_pow {
    __device__ float operator()(float x, float y) const { return powf(x, y); }
};
/* NaN propagates from either side, as in NumPy's maximum/minimum. */
struct op_maximum {
    __device__ float operator()(float x, float y) const { return (x >= y || x != x) ? x : y; }
};
struct op_minimum {
    __device__ float operator()(float x, float y) const { return (x <= y || x != x) ? x : y; }
};
struct op_eq {
    __device__ float operator()(float x, float y) const { return x == y ? 1.0f : 0.0f; }
};
struct op_ne {
    __device__ float operator()(float x, float y) const { return x != y ? 1.0f : 0.0f; }
};
struct op_ge {
    __device__ float operator()(float x, float y) const { return x >= y ? 1.0f : 0.0f; }
};
struct op_gt {
    __device__ float operator()(float x, float y) const { return x > y ? 1.0f : 0.0f; }
};
struct op_le {
    __device__ float operator()(float x, float y) const { return x <= y ? 1.0f : 0.0f; }
};
struct op_lt {
    __device__ float operator()(float x, float y) const { return x < y ? 1.0f : 0.0f; }
};
/* Exact forms of common scalar powers, as on the CPU (x**2 in norms). */
struct op_square {
    __device__ float operator()(float x, float) const { return x * x; }
};
struct op_cube {
    __device__ float operator()(float x, float) const { return x * x * x; }
};
struct op_reciprocal {
    __device__ float operator()(float x, float) const { return 1.0f / x; }
};

struct op_neg {
    __device__ float operator()(float x) const { return -x; }
};
struct op_log {
    __device__ float operator()(float x) const { return logf(x); }
};
struct op_exp {
    __device__ float operator()(float x) const { return expf(x); }
};
struct op_tanh {
    __device__ float operator()(float x) const { return tanhf(x); }
};
struct op_sqrt {
    __device__ float operator()(float x) const { return sqrtf(x); }
};
struct op_sigmoid {
    __device__ float operator()(float x) const { return nd_cuda_sigmoid(x); }
};
struct op_abs {
    __device__ float operator()(float x) const { return fabsf(x); }
};
struct op_relu {
    __device__ float operator()(float x) const { return (x > 0.0f || x != x) ? x : 0.0f; }
};

/* -------------------------------------------------------------- kernels */

/* Offsets from a 1-D space: out, a, b at i * stride. NULL a/b: the scalar. */
template <class Op>
__global__ void binary_flat_kernel(int64_t n, float *out, int64_t so, const float *a, int64_t sa,
                                   float a_scalar, const float *b, int64_t sb, float b_scalar,
                                   Op op) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float x = a != NULL ? a[i * sa] : a_scalar;
        const float y = b != NULL ? b[i * sb] : b_scalar;
        out[i * so] = op(x, y);
    }
}

/* it: (out, a, b) strides over the output's shape. */
template <class Op>
__global__ void binary_kernel(nd_cuda_iter it, float *out, const float *a, float a_scalar,
                              const float *b, float b_scalar, Op op) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3];
        nd_cuda_offsets<3>(it, i, off);
        const float x = a != NULL ? a[off[1]] : a_scalar;
        const float y = b != NULL ? b[off[2]] : b_scalar;
        out[off[0]] = op(x, y);
    }
}

template <class Op>
__global__ void unary_flat_kernel(int64_t n, float *out, int64_t so, const float *a, int64_t sa,
                                  Op op) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i * so] = op(a[i * sa]);
}

/* it: (out, a) strides over the output's shape. */
template <class Op>
__global__ void unary_kernel(nd_cuda_iter it, float *out, const float *a, Op op) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        nd_cuda_offsets<2>(it, i, off);
        out[off[0]] = op(a[off[1]]);
    }
}

struct op_identity {
    __device__ float operator()(float x) const { return x; }
};

/* it: (dst) strides; every element of the view gets value. */
__global__ void fill_kernel(nd_cuda_iter it, float *dst, float value) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[1];
        nd_cuda_offsets<1>(it, i, off);
        dst[off[0]] = value;
    }
}

/* ------------------------------------------------------------ launchers */

template <class Op>
static nd_status binary(const nd_cuda_iter &it, float *out, const float *a, float a_scalar,
                        const float *b, float b_scalar, Op op, cudaStream_t stream) {
    unsigned int blocks = nd_cuda_blocks(it.numel, ND_CUDA_THREADS);
    if (it.ndim == 1)
        ND_LAUNCH(binary_flat_kernel<Op>, blocks, ND_CUDA_THREADS, 0, stream, it.numel, out,
                  it.strides[0][0], a, it.strides[1][0], a_scalar, b, it.strides[2][0], b_scalar,
                  op);
    else
        ND_LAUNCH(binary_kernel<Op>, blocks, ND_CUDA_THREADS, 0, stream, it, out, a, a_scalar, b,
                  b_scalar, op);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

template <class Op>
static nd_status unary(const nd_cuda_iter &it, float *out, const float *a, Op op,
                       cudaStream_t stream) {
    unsigned int blocks = nd_cuda_blocks(it.numel, ND_CUDA_THREADS);
    if (it.ndim == 1)
        ND_LAUNCH(unary_flat_kernel<Op>, blocks, ND_CUDA_THREADS, 0, stream, it.numel, out,
                  it.strides[0][0], a, it.strides[1][0], op);
    else ND_LAUNCH(unary_kernel<Op>, blocks, ND_CUDA_THREADS, 0, stream, it, out, a, op);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

static nd_status fill(const nd_cuda_iter &it, float *dst, float value, cudaStream_t stream) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if (it.ndim == 1 && it.strides[0][0] == 1 && bits == 0u) { /* +0.0f: all bytes zero */
        ND_CUDA_CHECK(nd_cuda_memset(dst, 0, (size_t)it.numel * sizeof(float), stream));
        return ND_OK;
    }
    ND_LAUNCH(fill_kernel, nd_cuda_blocks(it.numel, ND_CUDA_THREADS), ND_CUDA_THREADS, 0, stream,
              it, dst, value);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* ------------------------------------------------------- backend entries */

nd_status nd_cuda_copy(const nd_layout *dst_layout, float *dst, nd_kernel_operand src) {
    const nd_layout *layouts[2] = {dst_layout, src.data != NULL ? src.layout : NULL};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, dst_layout->ndim, dst_layout->shape, src.data != NULL ? 2 : 1, layouts);
    if (it.numel == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(dst, NULL));
    float *d = dst + dst_layout->offset;
    cudaStream_t stream = 0;
    if (src.data == NULL) return fill(it, d, src.scalar, stream);
    const float *s = src.data + src.layout->offset;
    if (it.ndim == 1 && it.strides[0][0] == 1 && it.strides[1][0] == 1) {
        /* The front end never passes overlapping source and destination. */
        ND_CUDA_CHECK(nd_cuda_copy_on_device(d, s, (size_t)it.numel * sizeof(float), stream));
        return ND_OK;
    }
    return unary(it, d, s, op_identity{}, stream);
}

nd_status nd_cuda_binary(nd_binary_op op, const nd_layout *out_layout, float *out,
                         nd_kernel_operand a, nd_kernel_operand b) {
    const nd_layout *layouts[3] = {out_layout, a.data != NULL ? a.layout : NULL,
                                   b.data != NULL ? b.layout : NULL};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, out_layout->ndim, out_layout->shape, 3, layouts);
    if (it.numel == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(out, NULL));
    float *o = out + out_layout->offset;
    const float *x = a.data != NULL ? a.data + a.layout->offset : NULL;
    const float *y = b.data != NULL ? b.data + b.layout->offset : NULL;
    float xs = a.scalar, ys = b.scalar;
    cudaStream_t stream = 0;
    switch (op) {
    case ND_ADD: return binary(it, o, x, xs, y, ys, op_add{}, stream);
    case ND_SUB: return binary(it, o, x, xs, y, ys, op_sub{}, stream);
    case ND_MUL: return binary(it, o, x, xs, y, ys, op_mul{}, stream);
    case ND_DIV: return binary(it, o, x, xs, y, ys, op_div{}, stream);
    case ND_POW:
        if (y == NULL && ys == 2.0f) return binary(it, o, x, xs, y, ys, op_square{}, stream);
        if (y == NULL && ys == 3.0f) return binary(it, o, x, xs, y, ys, op_cube{}, stream);
        if (y == NULL && ys == -1.0f) return binary(it, o, x, xs, y, ys, op_reciprocal{}, stream);
        return binary(it, o, x, xs, y, ys, op_pow{}, stream);
    case ND_MAXIMUM: return binary(it, o, x, xs, y, ys, op_maximum{}, stream);
    case ND_MINIMUM: return binary(it, o, x, xs, y, ys, op_minimum{}, stream);
    case ND_EQ: return binary(it, o, x, xs, y, ys, op_eq{}, stream);
    case ND_NE: return binary(it, o, x, xs, y, ys, op_ne{}, stream);
    case ND_GE: return binary(it, o, x, xs, y, ys, op_ge{}, stream);
    case ND_GT: return binary(it, o, x, xs, y, ys, op_gt{}, stream);
    case ND_LE: return binary(it, o, x, xs, y, ys, op_le{}, stream);
    case ND_LT: return binary(it, o, x, xs, y, ys, op_lt{}, stream);
    default: return nd_fail(ND_ERR_VALUE, "unknown binary op %d", (int)op);
    }
}

nd_status nd_cuda_unary(nd_unary_op op, const nd_layout *out_layout, float *out,
                        const nd_layout *a_layout, const float *a) {
    const nd_layout *layouts[2] = {out_layout, a_layout};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, out_layout->ndim, out_layout->shape, 2, layouts);
    if (it.numel == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(out, NULL));
    float *o = out + out_layout->offset;
    const float *x = a + a_layout->offset;
    cudaStream_t stream = 0;
    switch (op) {
    case ND_NEG: return unary(it, o, x, op_neg{}, stream);
    case ND_LOG: return unary(it, o, x, op_log{}, stream);
    case ND_EXP: return unary(it, o, x, op_exp{}, stream);
    case ND_TANH: return unary(it, o, x, op_tanh{}, stream);
    case ND_SQRT: return unary(it, o, x, op_sqrt{}, stream);
    case ND_SIGMOID: return unary(it, o, x, op_sigmoid{}, stream);
    case ND_ABS: return unary(it, o, x, op_abs{}, stream);
    case ND_RELU: return unary(it, o, x, op_relu{}, stream);
    default: return nd_fail(ND_ERR_VALUE, "unknown unary op %d", (int)op);
    }
}
