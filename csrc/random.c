/* random.c: the front end of the engine's random fills: checks the request
 * and hands a contiguous buffer to the device's backend, which runs the
 * Philox generator of philox.h over it (cpu_random.c, cuda/cuda_random.cu).
 *
 * Where keys come from is the caller's business (needle_c draws one from
 * NumPy's global RNG per call); the engine keeps no generator state.
 */
#include "internal.h"

#include <math.h>

nd_status nd_array_fill_random(const nd_array *dst, const nd_random_params *params) {
    if (params == NULL) return nd_fail(ND_ERR_VALUE, "a random fill needs its parameters");
    if ((unsigned)params->kind >= ND_RANDOM_KIND_COUNT)
        return nd_fail(ND_ERR_VALUE, "unknown random distribution %d", (int)params->kind);
    /* Written so that NaN fails too. */
    if (params->kind == ND_RANDOM_BERNOULLI && !(params->p >= 0.0f && params->p <= 1.0f))
        return nd_fail(ND_ERR_VALUE, "a bernoulli probability must be in [0, 1], got %g",
                       (double)params->p);
    if (!nd_layout_is_contiguous(&dst->layout))
        return nd_fail(ND_ERR_VALUE, "random fills write contiguous arrays only");
    /* A draw captured into a CUDA graph reads the graph's replay counter
     * (the CUDA backend sets params->replay_counter), so replays differ. */
    int64_t n = nd_layout_numel(&dst->layout);
    if (n == 0) return ND_OK;
    if (dst->storage->dtype != ND_FLOAT32) { /* drawn in float32, stored in the dtype */
        nd_array wide;
        nd_status status =
            nd_array_empty(dst->storage->device, dst->layout.ndim, dst->layout.shape, &wide);
        if (status != ND_OK) return status;
        if ((status = nd_array_fill_random(&wide, params)) == ND_OK)
            status = nd_array_assign(dst, &wide);
        nd_array_release(&wide);
        return status;
    }
    float *data = nd_storage_f32(dst->storage) + dst->layout.offset;
    return dst->storage->device->backend->random(params, n, data);
}
