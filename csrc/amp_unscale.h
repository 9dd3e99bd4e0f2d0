/* amp_unscale.h: the nd_backend slot amp_unscale (GradScaler's one pass over
 * a gradient) and the CPU's entry.
 *
 * amp_unscale.c checks devices, shapes and overlap for every gradient before
 * any backend writes, so a backend sees one valid strided gradient at a time
 * and never fails on it. Engine-private, like internal.h: no Python.h.
 */
#ifndef NEEDLE_AMP_UNSCALE_H
#define NEEDLE_AMP_UNSCALE_H

#include "internal.h"

/* One gradient of dtype (ND_FLOAT32 or ND_FLOAT64), multiplied IN PLACE
 * through its view by inv_scale, in its dtype (a float64 gradient by the
 * float32 inv_scale widened, as PyTorch's opmath does); the element
 * *found_inf (one float, on the gradient's device) becomes 1.0f when any
 * element was inf or NaN before the multiply, and is left alone otherwise
 * (so it ORs over calls). Element layout->offset of grad (elements of dtype)
 * is the first; the view has at least one element and never visits an
 * element twice. */
typedef struct nd_amp_unscale_desc {
    const nd_layout *layout;
    void *grad;
    nd_dtype dtype;
    float *found_inf;
    float inv_scale;
} nd_amp_unscale_desc;

/* The CPU backend's entry (cpu_amp.c). */
nd_status nd_cpu_amp_unscale(const nd_amp_unscale_desc *d);

#endif /* NEEDLE_AMP_UNSCALE_H */
