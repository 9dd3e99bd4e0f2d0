/* amp_unscale.c: the device-independent front end of engine.h's
 * nd_array_amp_unscale, what a GradScaler's unscale_ runs over the
 * gradients of one device: checks every operand first, then hands each
 * gradient to the device's backend (amp_unscale.h), which multiplies it in
 * place and ORs its inf/NaN test into one device flag.
 *
 * Nothing is allocated and the host never reads the flag here: on a GPU the
 * whole list is one kernel launch per gradient and no synchronisation.
 */
#include "amp_unscale.h"

/* A view that reaches an element through two indices (a broadcast dim)
 * would be multiplied twice by an in-place pass. */
static int visits_an_element_twice(const nd_layout *l) {
    for (int d = 0; d < l->ndim; d++)
        if (l->shape[d] > 1 && l->strides[d] == 0) return 1;
    return 0;
}

static nd_status check_gradient(const nd_array *g, int64_t i, const nd_array *found_inf) {
    nd_device *dg = g->storage->device, *df = found_inf->storage->device;
    if (dg != df)
        return nd_fail(ND_ERR_DEVICE,
                       "amp_unscale: gradient %lld is on %s() but found_inf is on %s()",
                       (long long)i, dg->name, df->name);
    if (visits_an_element_twice(&g->layout))
        return nd_fail(ND_ERR_VALUE,
                       "amp_unscale: gradient %lld is a broadcast view (a stride-0 dimension); it "
                       "is updated in place, so each element must appear once",
                       (long long)i);
    if (g->storage == found_inf->storage) {
        int64_t glo, ghi, flo, fhi;
        nd_layout_extent(&g->layout, &glo, &ghi);
        nd_layout_extent(&found_inf->layout, &flo, &fhi);
        if (glo < fhi && flo < ghi)
            return nd_fail(ND_ERR_VALUE, "amp_unscale: gradient %lld shares memory with found_inf",
                           (long long)i);
    }
    return ND_OK;
}

nd_status nd_array_amp_unscale(const nd_array *const *grads, int64_t count,
                               const nd_array *found_inf, float inv_scale) {
    if (count < 0)
        return nd_fail(ND_ERR_VALUE, "amp_unscale: negative gradient count %lld", (long long)count);
    if (nd_layout_numel(&found_inf->layout) != 1)
        return nd_fail(ND_ERR_SHAPE,
                       "amp_unscale: found_inf must hold exactly one element, it holds %lld",
                       (long long)nd_layout_numel(&found_inf->layout));
    for (int64_t i = 0; i < count; i++) {
        nd_status status = check_gradient(grads[i], i, found_inf);
        if (status != ND_OK) return status;
    }
    const nd_backend *backend = found_inf->storage->device->backend;
    if (backend->amp_unscale == NULL)
        return nd_fail(ND_ERR_DEVICE, "amp_unscale is not supported on %s()",
                       found_inf->storage->device->name);
    float *flag = nd_storage_data(found_inf->storage) + found_inf->layout.offset;
    for (int64_t i = 0; i < count; i++) {
        const nd_array *g = grads[i];
        if (nd_layout_numel(&g->layout) == 0) continue;
        nd_amp_unscale_desc d = {&g->layout, nd_storage_data(g->storage), flag, inv_scale};
        nd_status status = backend->amp_unscale(&d);
        if (status != ND_OK) return status;
    }
    return ND_OK;
}
