/* dtype_island.c: how the fused operations serve every dtype with float32
 * kernels. The softmax rows, the softmax cross-entropy, layer norm, the
 * attention softmax, the row gathers, the LSTM and the random fills have
 * float32 kernels only; given arrays of another dtype, each converts them to
 * float32 copies (the island), runs on those, and converts its results to
 * the dtype they are due in (an input's, or the inputs' promotion), writing
 * in-place results back through a conversion. So float16 and bfloat16
 * compute in float32 and round once at the end, as their elementwise ops do;
 * float64 computes in float32 precision here (the elementwise ops,
 * reductions and matmul are the ones with float64 kernels). The optimizer
 * updates have float32 and float64 kernels: nd_island_enter_as converts to
 * the one they compute in, float64 when any operand is float64. */
#include "internal.h"

#include <string.h>

int nd_island_needed(int n, const nd_array *const *arrays) {
    for (int i = 0; i < n; i++)
        if (arrays[i] != NULL && arrays[i]->storage->dtype != ND_FLOAT32) return 1;
    return 0;
}

nd_dtype nd_island_promoted(int n, const nd_array *const *arrays) {
    nd_dtype dtype = ND_FLOAT32;
    int first = 1;
    for (int i = 0; i < n; i++) {
        if (arrays[i] == NULL) continue;
        dtype =
            first ? arrays[i]->storage->dtype : nd_promote_dtypes(dtype, arrays[i]->storage->dtype);
        first = 0;
    }
    return dtype;
}

nd_status nd_island_enter(nd_island *is, int n, const nd_array **arrays) {
    return nd_island_enter_as(is, n, arrays, ND_FLOAT32);
}

nd_status nd_island_enter_as(nd_island *is, int n, const nd_array **arrays, nd_dtype dtype) {
    for (int i = 0; i < n; i++) {
        if (arrays[i] == NULL || arrays[i]->storage->dtype == dtype) continue;
        if (is->count == ND_ISLAND_MAX)
            return nd_fail(ND_ERR_INTERNAL, "dtype island: more than %d operands", ND_ISLAND_MAX);
        nd_status status = nd_array_astype(arrays[i], dtype, &is->copies[is->count]);
        if (status != ND_OK) return status;
        arrays[i] = &is->copies[is->count++];
    }
    return ND_OK;
}

void nd_island_release(nd_island *is) {
    for (int i = 0; i < is->count; i++) nd_array_release(&is->copies[i]);
    is->count = 0;
}

nd_status nd_island_leave(nd_array *out, nd_dtype dtype) {
    if (out->storage == NULL || out->storage->dtype == dtype) return ND_OK;
    nd_array converted;
    nd_status status = nd_array_astype(out, dtype, &converted);
    nd_array_release(out);
    if (status == ND_OK) *out = converted;
    return status;
}

nd_status nd_island_write_back(const nd_array *dst, const nd_array *wide) {
    return dst == wide ? ND_OK : nd_array_assign(dst, wide);
}
