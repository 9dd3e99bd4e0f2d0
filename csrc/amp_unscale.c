/* amp_unscale.c: the device-independent front end of engine.h's
 * nd_array_amp_unscale, what a GradScaler's unscale_ runs over the
 * gradients of one device: checks every operand first, then hands each
 * gradient to the device's backend (amp_unscale.h), which multiplies it in
 * place and ORs its inf/NaN test into one device flag.
 *
 * No device memory is allocated and the host never reads the flag here: on
 * a GPU the whole list is one kernel launch per gradient and no
 * synchronisation. A gradient array that several parameters share is
 * unscaled once (mark_aliases).
 */
#include "amp_unscale.h"

#include <stdint.h>
#include <stdlib.h>

/* The view of l's distinct elements: a broadcast dim (stride 0) reaches one
 * element through all its indices, and an in-place pass must multiply it
 * once (x.sum().backward() makes x.grad such a view of one element). */
static void distinct_elements(const nd_layout *l, nd_layout *out) {
    *out = *l;
    for (int d = 0; d < l->ndim; d++)
        if (l->strides[d] == 0 && l->shape[d] > 0) out->shape[d] = 1;
}

/* float32 and float64 gradients are unscaled in their own dtype; PyTorch
 * refuses float16 ones too (they are the parameters' dtype under autocast's
 * float32 master weights, never a narrow one). */
static nd_status check_gradient(const nd_array *g, int64_t i, const nd_array *found_inf) {
    nd_dtype dtype = g->storage->dtype;
    if (dtype != ND_FLOAT32 && dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE,
                       "amp_unscale is not implemented for %s arrays (gradient %lld): "
                       "gradients must be float32 or float64",
                       nd_dtype_name(dtype), (long long)i);
    nd_device *dg = g->storage->device, *df = found_inf->storage->device;
    if (dg != df)
        return nd_fail(ND_ERR_DEVICE,
                       "amp_unscale: gradient %lld is on %s() but found_inf is on %s()",
                       (long long)i, dg->name, df->name);
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

/* Where gradient `index` lies in its storage: elements [lo, hi). */
typedef struct extent_entry {
    const nd_storage *storage;
    int64_t lo, hi, numel, index;
} extent_entry;

static int by_storage_then_extent(const void *a_, const void *b_) {
    const extent_entry *a = a_, *b = b_;
    if (a->storage != b->storage) return (uintptr_t)a->storage < (uintptr_t)b->storage ? -1 : 1;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    if (a->hi != b->hi) return a->hi < b->hi ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* A view with as many elements as its extent, none visited twice, covers
 * every element of the extent: a reshape, transpose or flip of the same
 * memory holds the same elements. */
static int same_elements(const extent_entry *a, const extent_entry *b) {
    return a->lo == b->lo && a->hi == b->hi && a->numel == b->numel && a->numel == a->hi - a->lo;
}

/* The autograd hands several parameters one gradient array when an op's
 * backward passes its out_grad through (x + y: x.grad is y.grad), or views
 * of it (a reshape or transpose): multiplying each would unscale those
 * elements twice. skip[i] = 1 for a gradient that holds the same elements as
 * an earlier one; gradients that overlap only in part are refused. */
static nd_status mark_aliases(const nd_array *const *grads, int64_t count, unsigned char *skip) {
    extent_entry *e = malloc(sizeof *e * (size_t)count);
    if (e == NULL)
        return nd_fail(ND_ERR_OOM, "amp_unscale: no host memory for %lld entries",
                       (long long)count);
    for (int64_t i = 0; i < count; i++) {
        nd_layout distinct;
        distinct_elements(&grads[i]->layout, &distinct);
        e[i].storage = grads[i]->storage;
        nd_layout_extent(&distinct, &e[i].lo, &e[i].hi);
        e[i].numel = nd_layout_numel(&distinct);
        e[i].index = i;
    }
    qsort(e, (size_t)count, sizeof *e, by_storage_then_extent);
    nd_status status = ND_OK;
    int64_t kept = -1, end = 0; /* the last kept entry; the furthest hi in its storage */
    for (int64_t k = 0; k < count && status == ND_OK; k++) {
        if (e[k].numel == 0) continue;
        int fresh_storage = kept < 0 || e[kept].storage != e[k].storage;
        if (fresh_storage || e[k].lo >= end) {
            kept = k;
            end = fresh_storage || e[k].hi > end ? e[k].hi : end;
        } else if (same_elements(&e[kept], &e[k])) {
            skip[e[k].index] = 1;
        } else {
            int64_t i = e[kept].index < e[k].index ? e[kept].index : e[k].index;
            int64_t j = e[kept].index < e[k].index ? e[k].index : e[kept].index;
            status = nd_fail(ND_ERR_VALUE,
                             "amp_unscale: gradients %lld and %lld overlap in memory in part; "
                             "each element is unscaled once, so give them separate arrays",
                             (long long)i, (long long)j);
        }
    }
    free(e);
    return status;
}

nd_status nd_array_amp_unscale(const nd_array *const *grads, int64_t count,
                               const nd_array *found_inf, float inv_scale) {
    if (count < 0)
        return nd_fail(ND_ERR_VALUE, "amp_unscale: negative gradient count %lld", (long long)count);
    if (nd_layout_numel(&found_inf->layout) != 1)
        return nd_fail(ND_ERR_SHAPE,
                       "amp_unscale: found_inf must hold exactly one element, it holds %lld",
                       (long long)nd_layout_numel(&found_inf->layout));
    nd_status flag_status = nd_array_require_float32(found_inf, "amp_unscale");
    if (flag_status != ND_OK) return flag_status;
    for (int64_t i = 0; i < count; i++) {
        nd_status status = check_gradient(grads[i], i, found_inf);
        if (status != ND_OK) return status;
    }
    const nd_backend *backend = found_inf->storage->device->backend;
    if (backend->amp_unscale == NULL)
        return nd_fail(ND_ERR_DEVICE, "amp_unscale is not supported on %s()",
                       found_inf->storage->device->name);
    if (count == 0) return ND_OK;
    unsigned char *skip = calloc((size_t)count, 1);
    if (skip == NULL)
        return nd_fail(ND_ERR_OOM, "amp_unscale: no host memory for %lld flags", (long long)count);
    nd_status status = mark_aliases(grads, count, skip);
    float *flag = nd_storage_f32(found_inf->storage) + found_inf->layout.offset;
    for (int64_t i = 0; i < count && status == ND_OK; i++) {
        const nd_array *g = grads[i];
        nd_layout distinct;
        distinct_elements(&g->layout, &distinct);
        if (skip[i] || nd_layout_numel(&distinct) == 0) continue;
        nd_amp_unscale_desc d = {&distinct, g->storage->data, g->storage->dtype, flag, inv_scale};
        status = backend->amp_unscale(&d);
    }
    free(skip);
    return status;
}
