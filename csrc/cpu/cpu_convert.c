/* cpu_convert.c: the CPU backend's dtype conversions (nd_backend.convert):
 * a strided view of one dtype written into a strided view of another (or of
 * the same, for the narrow types' copies), and the host transfers of raw
 * bytes (host memory is the CPU's own: a memcpy).
 *
 * Values pass through float64, which holds every value of every dtype, so a
 * conversion rounds once: float32 -> float16 rounds the float32 value, and
 * float64 -> float16 rounds the float64 value to float32 first (as
 * PyTorch's casts do), then to float16.
 */
#include "cpu_iter.h"
#include "cpu_loops.h"
#include "dtype_convert.h"

#include <string.h>

/* Elements converted per step of the inner loop (a stack buffer). */
#define CHUNK 256

static void load_chunk(nd_dtype dtype, const char *src, int64_t stride, int64_t n, double *out) {
    switch (dtype) {
    case ND_FLOAT32:
        for (int64_t i = 0; i < n; i++) out[i] = ((const float *)(const void *)src)[i * stride];
        break;
    case ND_FLOAT64:
        for (int64_t i = 0; i < n; i++) out[i] = ((const double *)(const void *)src)[i * stride];
        break;
    case ND_FLOAT16:
        for (int64_t i = 0; i < n; i++)
            out[i] = nd_half_to_float(((const uint16_t *)(const void *)src)[i * stride]);
        break;
    case ND_BFLOAT16:
        for (int64_t i = 0; i < n; i++)
            out[i] = nd_bf16_to_float(((const uint16_t *)(const void *)src)[i * stride]);
        break;
    default: break;
    }
}

static void store_chunk(nd_dtype dtype, char *dst, int64_t stride, int64_t n, const double *in) {
    switch (dtype) {
    case ND_FLOAT32:
        for (int64_t i = 0; i < n; i++) ((float *)(void *)dst)[i * stride] = (float)in[i];
        break;
    case ND_FLOAT64:
        for (int64_t i = 0; i < n; i++) ((double *)(void *)dst)[i * stride] = in[i];
        break;
    case ND_FLOAT16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)(void *)dst)[i * stride] = nd_float_to_half((float)in[i]);
        break;
    case ND_BFLOAT16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)(void *)dst)[i * stride] = nd_float_to_bf16((float)in[i]);
        break;
    default: break;
    }
}

/* Rows that need no trip through float64: copies within a dtype, and
 * float32 <-> float16/bfloat16 rows the current ISA's loops convert
 * directly (vectorized, the same bits as through float64: one rounding of
 * the float32 value): contiguous float32, the narrow side at any stride.
 * Returns 0 where the row is not such a row. */
static int convert_row_fast(char *dst, nd_dtype dst_dtype, int64_t dst_stride, const char *src,
                            nd_dtype src_dtype, int64_t src_stride, int64_t n) {
    if (src_dtype == dst_dtype) {
        /* A copy (a narrow view made compact, a slice assigned): the bits as they are. */
        const size_t size = (size_t)nd_dtype_size(dst_dtype);
        if (dst_stride == 1 && src_stride == 1) {
            memmove(dst, src, (size_t)n * size);
            return 1;
        }
        for (int64_t i = 0; i < n; i++)
            memcpy(dst + i * dst_stride * (int64_t)size, src + i * src_stride * (int64_t)size,
                   size);
        return 1;
    }
    const nd_cpu_loops *loops = nd_cpu_loops_current();
    if (src_dtype == ND_FLOAT32 && src_stride == 1 &&
        (dst_dtype == ND_FLOAT16 || dst_dtype == ND_BFLOAT16)) {
        (dst_dtype == ND_FLOAT16 ? loops->float_to_f16 : loops->float_to_bf16)(
            (uint16_t *)(void *)dst, dst_stride, (const float *)(const void *)src, n);
        return 1;
    }
    if (dst_dtype == ND_FLOAT32 && dst_stride == 1 &&
        (src_dtype == ND_FLOAT16 || src_dtype == ND_BFLOAT16)) {
        (src_dtype == ND_FLOAT16 ? loops->f16_to_float : loops->bf16_to_float)(
            (float *)(void *)dst, (const uint16_t *)(const void *)src, src_stride, n);
        return 1;
    }
    return 0;
}

/* One inner row: n elements at the given element strides. */
static void convert_row(char *dst, nd_dtype dst_dtype, int64_t dst_stride, const char *src,
                        nd_dtype src_dtype, int64_t src_stride, double scalar, int64_t n) {
    if (src != NULL && convert_row_fast(dst, dst_dtype, dst_stride, src, src_dtype, src_stride, n))
        return;
    double buf[CHUNK];
    int64_t dst_size = nd_dtype_size(dst_dtype), src_size = nd_dtype_size(src_dtype);
    for (int64_t done = 0; done < n; done += CHUNK) {
        int64_t m = n - done < CHUNK ? n - done : CHUNK;
        if (src != NULL)
            load_chunk(src_dtype, src + done * src_stride * src_size, src_stride, m, buf);
        else
            for (int64_t i = 0; i < m; i++) buf[i] = scalar;
        store_chunk(dst_dtype, dst + done * dst_stride * dst_size, dst_stride, m, buf);
    }
}

nd_status nd_cpu_convert(const nd_layout *dst_layout, void *dst, nd_dtype dst_dtype,
                         const nd_layout *src_layout, const void *src, nd_dtype src_dtype,
                         double scalar) {
    if (nd_layout_numel(dst_layout) == 0) return ND_OK;
    const nd_layout *layouts[2] = {dst_layout, src != NULL ? src_layout : NULL};
    nd_iter it;
    nd_iter_prepare(&it, dst_layout->shape, dst_layout->ndim, 2, layouts, 0);
    int64_t dst_size = nd_dtype_size(dst_dtype), src_size = nd_dtype_size(src_dtype);
    char *d0 = (char *)dst + dst_layout->offset * dst_size;
    const char *s0 = src != NULL ? (const char *)src + src_layout->offset * src_size : NULL;
    /* Walks every inner row in row-major order of the outer dims. */
    int64_t index[ND_MAX_DIMS] = {0};
    int inner = it.ndim - 1;
    for (;;) {
        int64_t d_off = 0, s_off = 0;
        for (int k = 0; k < inner; k++) {
            d_off += index[k] * it.strides[0][k];
            s_off += index[k] * it.strides[1][k];
        }
        convert_row(d0 + d_off * dst_size, dst_dtype, it.strides[0][inner],
                    s0 != NULL ? s0 + s_off * src_size : NULL, src_dtype, it.strides[1][inner],
                    scalar, it.shape[inner]);
        int k = inner - 1;
        while (k >= 0 && ++index[k] == it.shape[k]) index[k--] = 0;
        if (k < 0) break;
    }
    return ND_OK;
}
