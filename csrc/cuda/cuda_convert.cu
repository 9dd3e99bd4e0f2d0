/* cuda_convert.cu: the CUDA backend's dtype conversions (nd_backend.convert):
 * one kernel writes a strided view of one dtype into a strided view of
 * another (or fills it with a scalar), converting as the CPU does
 * (cuda_dtype.cuh); and the raw byte transfers of contiguous device memory
 * to and from the host. Default stream; no device memory is allocated.
 */
#include "cuda_dtype.cuh"

/* it: (dst, src) strides over dst's shape. */
template <class D, class S> __global__ void convert_kernel(nd_cuda_iter it, D *dst, const S *src) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        nd_cuda_offsets<2>(it, i, off);
        dst[off[0]] = nd_dtype_traits<D>::store(nd_dtype_traits<S>::load(src[off[1]]));
    }
}

template <class D> __global__ void fill_kernel(nd_cuda_iter it, D *dst, D value) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[1];
        nd_cuda_offsets<1>(it, i, off);
        dst[off[0]] = value;
    }
}

/* The source's storage type S chosen for a destination of type D. */
template <class D> struct convert_from {
    const nd_cuda_iter *it;
    D *dst;
    const void *src;
    template <class S> nd_status operator()() {
        ND_LAUNCH((convert_kernel<D, S>), nd_cuda_blocks(it->numel, ND_CUDA_THREADS),
                  ND_CUDA_THREADS, 0, nd_cuda_stream(), *it, dst, (const S *)src);
        ND_CUDA_CHECK(cudaGetLastError());
        return ND_OK;
    }
};

/* The destination's storage type D. */
struct convert_to {
    const nd_cuda_iter *it;
    void *dst;
    int64_t dst_offset;
    const void *src;
    int64_t src_offset;
    nd_dtype src_dtype;
    double scalar;
    template <class D> nd_status operator()() {
        D *d = (D *)dst + dst_offset;
        if (src == NULL) {
            ND_LAUNCH(fill_kernel<D>, nd_cuda_blocks(it->numel, ND_CUDA_THREADS), ND_CUDA_THREADS,
                      0, nd_cuda_stream(), *it, d, nd_dtype_traits<D>::store(scalar));
            ND_CUDA_CHECK(cudaGetLastError());
            return ND_OK;
        }
        convert_from<D> from = {it, d, (const char *)src + src_offset * nd_dtype_size(src_dtype)};
        return nd_cuda_with_dtype(src_dtype, from);
    }
};

nd_status nd_cuda_convert(const nd_layout *dst_layout, void *dst, nd_dtype dst_dtype,
                          const nd_layout *src_layout, const void *src, nd_dtype src_dtype,
                          double scalar) {
    const nd_layout *layouts[2] = {dst_layout, src != NULL ? src_layout : NULL};
    nd_cuda_iter it;
    nd_cuda_iter_make(&it, dst_layout->ndim, dst_layout->shape, src != NULL ? 2 : 1, layouts);
    if (it.numel == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(dst, NULL));
    convert_to to = {
        &it, dst, dst_layout->offset, src, src != NULL ? src_layout->offset : 0, src_dtype, scalar};
    return nd_cuda_with_dtype(dst_dtype, to);
}
