/* cuda_ewise.cu: the elementwise kernels of the CUDA backend: copies and
 * fills into strided views, binary ops (arrays and scalars, broadcast) and
 * unary ops, over strided float32 operands. The ops and their formulas are
 * ewise_ops.h's list, expanded here into functors and dispatch switches,
 * for every dtype: float32 and float64 compute in their own precision,
 * float16 and bfloat16 load into float, compute there and round once on the
 * store (cuda_dtype.cuh's conversions, bit for bit the CPU backend's).
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
#include "cuda_dtype.cuh"

#include <string.h>

/* ----------------------------------------------------------- operations */

/* The functions of ewise_ops.h's formulas, overloaded on the compute type:
 * the device library's float versions for float, its double ones for
 * double (float32's kernels call exactly what they called before). */
#define ND_EW_OVERLOADS(name, float_fn, double_fn)                                \
    static __device__ __forceinline__ float name(float x) { return float_fn(x); } \
    static __device__ __forceinline__ double name(double x) { return double_fn(x); }
ND_EW_OVERLOADS(ew_log, logf, log)
ND_EW_OVERLOADS(ew_exp, expf, exp)
ND_EW_OVERLOADS(ew_tanh, tanhf, tanh)
ND_EW_OVERLOADS(ew_sqrt, sqrtf, sqrt)
ND_EW_OVERLOADS(ew_abs, fabsf, fabs)
ND_EW_OVERLOADS(ew_erf, erff, erf)
#undef ND_EW_OVERLOADS
static __device__ __forceinline__ float ew_pow(float x, float y) { return powf(x, y); }
static __device__ __forceinline__ double ew_pow(double x, double y) { return pow(x, y); }

#define ND_EW_LOG(x) ew_log(x)
#define ND_EW_EXP(x) ew_exp(x)
#define ND_EW_TANH(x) ew_tanh(x)
#define ND_EW_SQRT(x) ew_sqrt(x)
#define ND_EW_SIGMOID(x) nd_cuda_sigmoid(x)
#define ND_EW_ABS(x) ew_abs(x)
#define ND_EW_POW(x, y) ew_pow(x, y)
#define ND_EW_ERF(x) ew_erf(x)
#define ND_EW_K(x, c) static_cast<C>(c)

/* One functor per op of the list, over operands of any compute type C. */
#define ND_CUDA_BINARY_FUNCTOR(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, \
                               formula)                                                      \
    struct op_##name {                                                                       \
        template <class C> __device__ C operator()(C x, C y) const { return formula; }       \
    };
/* The exact powers ignore the scalar exponent they are passed as y. */
#define ND_CUDA_POW_FORM_FUNCTOR(A, id, name, exponent, formula)                     \
    struct pow_##name {                                                              \
        template <class C> __device__ C operator()(C x, C) const { return formula; } \
    };
#define ND_CUDA_UNARY_FUNCTOR(A, id, name, Class, doc, formula)                   \
    struct op_##name {                                                            \
        template <class C> __device__ C operator()(C x) const { return formula; } \
    };
ND_EWISE_BINARY_OPS(ND_CUDA_BINARY_FUNCTOR, )
ND_EWISE_POW_FORMS(ND_CUDA_POW_FORM_FUNCTOR, )
ND_EWISE_UNARY_OPS(ND_CUDA_UNARY_FUNCTOR, )

struct op_identity {
    template <class C> __device__ C operator()(C x) const { return x; }
};

/* A storage type T names the type its formulas compute in and the
 * conversions between the two (cuda_dtype.cuh's: float computes in float,
 * double in double, float16 and bfloat16 in float). */
template <class T> struct ewise_type {
    typedef T storage;
    typedef typename nd_dtype_traits<T>::compute compute;
    static __device__ __forceinline__ compute load(T v) { return nd_dtype_traits<T>::load(v); }
    static __device__ __forceinline__ T store(compute v) { return nd_dtype_traits<T>::store(v); }
};

/* Op F of the list over storage type T: what the kernels are instantiated
 * for (Op::storage in memory, F applied in Op::compute). One parameter, so
 * the census names the kernels binary_flat_kernel<Op> etc. */
template <class T, class F> struct on_storage : ewise_type<T>, F {};

/* -------------------------------------------------------------- kernels */

/* Offsets from a 1-D space: out, a, b at i * stride. NULL a/b: the scalar. */
template <class Op>
__global__ void binary_flat_kernel(int64_t n, typename Op::storage *out, int64_t so,
                                   const typename Op::storage *a, int64_t sa,
                                   typename Op::compute a_scalar, const typename Op::storage *b,
                                   int64_t sb, typename Op::compute b_scalar, Op op) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const typename Op::compute x = a != NULL ? Op::load(a[i * sa]) : a_scalar;
        const typename Op::compute y = b != NULL ? Op::load(b[i * sb]) : b_scalar;
        out[i * so] = Op::store(op(x, y));
    }
}

/* it: (out, a, b) strides over the output's shape. */
template <class Op>
__global__ void binary_kernel(nd_cuda_iter it, typename Op::storage *out,
                              const typename Op::storage *a, typename Op::compute a_scalar,
                              const typename Op::storage *b, typename Op::compute b_scalar, Op op) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3];
        nd_cuda_offsets<3>(it, i, off);
        const typename Op::compute x = a != NULL ? Op::load(a[off[1]]) : a_scalar;
        const typename Op::compute y = b != NULL ? Op::load(b[off[2]]) : b_scalar;
        out[off[0]] = Op::store(op(x, y));
    }
}

template <class Op>
__global__ void unary_flat_kernel(int64_t n, typename Op::storage *out, int64_t so,
                                  const typename Op::storage *a, int64_t sa, Op op) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i * so] = Op::store(op(Op::load(a[i * sa])));
}

/* it: (out, a) strides over the output's shape. */
template <class Op>
__global__ void unary_kernel(nd_cuda_iter it, typename Op::storage *out,
                             const typename Op::storage *a, Op op) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        nd_cuda_offsets<2>(it, i, off);
        out[off[0]] = Op::store(op(Op::load(a[off[1]])));
    }
}

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
static nd_status binary(const nd_cuda_iter &it, typename Op::storage *out,
                        const typename Op::storage *a, typename Op::compute a_scalar,
                        const typename Op::storage *b, typename Op::compute b_scalar, Op op,
                        cudaStream_t stream) {
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
static nd_status unary(const nd_cuda_iter &it, typename Op::storage *out,
                       const typename Op::storage *a, Op op, cudaStream_t stream) {
    unsigned int blocks = nd_cuda_blocks(it.numel, ND_CUDA_THREADS);
    if (it.ndim == 1)
        ND_LAUNCH(unary_flat_kernel<Op>, blocks, ND_CUDA_THREADS, 0, stream, it.numel, out,
                  it.strides[0][0], a, it.strides[1][0], op);
    else ND_LAUNCH(unary_kernel<Op>, blocks, ND_CUDA_THREADS, 0, stream, it, out, a, op);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

/* Every binary op of the list for storage type T; form: how ND_POW by a
 * scalar exponent runs (nd_pow_form_of). */
template <class T>
static nd_status binary_op(nd_binary_op op, nd_pow_form form, const nd_cuda_iter &it, T *o,
                           const T *x, typename ewise_type<T>::compute xs, const T *y,
                           typename ewise_type<T>::compute ys, cudaStream_t stream) {
#define ND_CUDA_POW_FORM_CASE(A, id, name, exponent, formula) \
    case id: return binary(it, o, x, xs, y, ys, on_storage<T, pow_##name>(), stream);
#define ND_CUDA_BINARY_CASE(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    case ND_##id: return binary(it, o, x, xs, y, ys, on_storage<T, op_##name>(), stream);
    if (op == ND_POW) {
        switch (form) {
            ND_EWISE_POW_FORMS(ND_CUDA_POW_FORM_CASE, )
        default: break; /* ND_POW_GENERAL: the ND_POW case below */
        }
    }
    switch (op) {
        ND_EWISE_BINARY_OPS(ND_CUDA_BINARY_CASE, )
    default: return nd_fail(ND_ERR_VALUE, "unknown binary op %d", (int)op);
    }
#undef ND_CUDA_POW_FORM_CASE
#undef ND_CUDA_BINARY_CASE
}

/* Every unary op of the list for storage type T. */
template <class T>
static nd_status unary_op(nd_unary_op op, const nd_cuda_iter &it, T *o, const T *x,
                          cudaStream_t stream) {
#define ND_CUDA_UNARY_CASE(A, id, name, Class, doc, formula) \
    case ND_##id: return unary(it, o, x, on_storage<T, op_##name>(), stream);
    switch (op) {
        ND_EWISE_UNARY_OPS(ND_CUDA_UNARY_CASE, )
    default: return nd_fail(ND_ERR_VALUE, "unknown unary op %d", (int)op);
    }
#undef ND_CUDA_UNARY_CASE
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

/* float32 only (the front end converts every other pair of dtypes). */
nd_status nd_cuda_copy(const nd_layout *dst_layout, void *dst, nd_kernel_operand src) {
    const nd_layout *layouts[2] = {dst_layout, src.data != NULL ? src.layout : NULL};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, dst_layout->ndim, dst_layout->shape, src.data != NULL ? 2 : 1, layouts);
    if (it.numel == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(dst, NULL));
    float *d = (float *)dst + dst_layout->offset;
    cudaStream_t stream = nd_cuda_stream();
    if (src.data == NULL) return fill(it, d, src.scalar, stream);
    const float *s = (const float *)src.data + src.layout->offset;
    if (it.ndim == 1 && it.strides[0][0] == 1 && it.strides[1][0] == 1) {
        /* The front end never passes overlapping source and destination. */
        ND_CUDA_CHECK(nd_cuda_copy_on_device(d, s, (size_t)it.numel * sizeof(float), stream));
        return ND_OK;
    }
    return unary(it, d, s, on_storage<float, op_identity>(), stream);
}

/* A scalar operand (passed as a double) in compute type C. */
template <class C> static C scalar_in(const nd_kernel_operand &k) { return (C)k.scalar; }

/* How x**e runs for a scalar exponent e, decided on e in the compute type
 * (as the kernel sees it): a double exponent near 2 is not 2. */
template <class C> static nd_pow_form pow_form_of(const nd_kernel_operand &b) {
    const C e = (C)b.scalar;
    if (b.data != NULL || (C)(float)e != e) return ND_POW_GENERAL;
    return nd_pow_form_of((float)e);
}

/* The binary op over storage type T; pointers at the storages' first
 * elements, offsets in elements of T. */
template <class T>
static nd_status binary_typed(nd_binary_op op, const nd_cuda_iter &it, const nd_layout *out_layout,
                              void *out, const nd_kernel_operand &a, const nd_kernel_operand &b) {
    typedef typename ewise_type<T>::compute C;
    T *o = (T *)out + out_layout->offset;
    const T *x = a.data != NULL ? (const T *)(const void *)a.data + a.layout->offset : NULL;
    const T *y = b.data != NULL ? (const T *)(const void *)b.data + b.layout->offset : NULL;
    return binary_op<T>(op, pow_form_of<C>(b), it, o, x, scalar_in<C>(a), y, scalar_in<C>(b),
                        nd_cuda_stream());
}

nd_status nd_cuda_binary(nd_binary_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                         nd_kernel_operand a, nd_kernel_operand b) {
    const nd_layout *layouts[3] = {out_layout, a.data != NULL ? a.layout : NULL,
                                   b.data != NULL ? b.layout : NULL};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, out_layout->ndim, out_layout->shape, 3, layouts);
    if (it.numel == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(out, NULL));
    switch (dtype) {
    case ND_FLOAT32: return binary_typed<float>(op, it, out_layout, out, a, b);
    case ND_FLOAT16: return binary_typed<nd_half_t>(op, it, out_layout, out, a, b);
    case ND_BFLOAT16: return binary_typed<nd_bf16_t>(op, it, out_layout, out, a, b);
    case ND_FLOAT64: return binary_typed<double>(op, it, out_layout, out, a, b);
    default: return nd_backend_lacks_dtype("cuda", "a binary op", dtype);
    }
}

template <class T>
static nd_status unary_typed(nd_unary_op op, const nd_cuda_iter &it, const nd_layout *out_layout,
                             void *out, const nd_layout *a_layout, const void *a) {
    return unary_op<T>(op, it, (T *)out + out_layout->offset, (const T *)a + a_layout->offset,
                       nd_cuda_stream());
}

nd_status nd_cuda_unary(nd_unary_op op, nd_dtype dtype, const nd_layout *out_layout, void *out,
                        const nd_layout *a_layout, const void *a) {
    const nd_layout *layouts[2] = {out_layout, a_layout};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, out_layout->ndim, out_layout->shape, 2, layouts);
    if (it.numel == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(out, NULL));
    switch (dtype) {
    case ND_FLOAT32: return unary_typed<float>(op, it, out_layout, out, a_layout, a);
    case ND_FLOAT16: return unary_typed<nd_half_t>(op, it, out_layout, out, a_layout, a);
    case ND_BFLOAT16: return unary_typed<nd_bf16_t>(op, it, out_layout, out, a_layout, a);
    case ND_FLOAT64: return unary_typed<double>(op, it, out_layout, out, a_layout, a);
    default: return nd_backend_lacks_dtype("cuda", "a unary op", dtype);
    }
}
