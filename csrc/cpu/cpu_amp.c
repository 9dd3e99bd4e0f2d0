/* cpu_amp.c: the CPU backend's amp_unscale (amp_unscale.h): one strided
 * walk (cpu_iter.h) that multiplies each gradient element in place, in
 * float32 or float64 as the gradient is, and tests it for inf/NaN in the
 * same pass.
 *
 * The test reads the exponent bits rather than calling isfinite, so that it
 * survives any floating-point flags a build may add (-ffinite-math-only
 * would fold isfinite to 1).
 */
#include "amp_unscale.h"
#include "cpu_iter.h"

#include <stdint.h>
#include <string.h>

typedef struct unscale_ctx {
    float inv_scale;
    uint32_t non_finite; /* nonzero once an inf or NaN was seen */
} unscale_ctx;

static void unscale_row_f64(int64_t n, float **p, const int64_t *s, const void *ctx_) {
    unscale_ctx *ctx = (unscale_ctx *)ctx_;
    double *g = (double *)p[0];
    const int64_t stride = s[0];
    const double inv_scale = ctx->inv_scale;
    uint32_t all_ones_exponent = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = g[i * stride];
        uint64_t bits;
        memcpy(&bits, &v, sizeof bits);
        all_ones_exponent |= (uint32_t)((bits & 0x7ff0000000000000u) == 0x7ff0000000000000u);
        g[i * stride] = v * inv_scale;
    }
    ctx->non_finite |= all_ones_exponent;
}

static void unscale_row(int64_t n, float **p, const int64_t *s, const void *ctx_) {
    unscale_ctx *ctx = (unscale_ctx *)ctx_;
    float *g = p[0];
    const int64_t stride = s[0];
    const float inv_scale = ctx->inv_scale;
    uint32_t all_ones_exponent = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = g[i * stride];
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        all_ones_exponent |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
        g[i * stride] = v * inv_scale;
    }
    ctx->non_finite |= all_ones_exponent;
}

nd_status nd_cpu_amp_unscale(const nd_amp_unscale_desc *d) {
    const nd_layout *layouts[1] = {d->layout};
    nd_iter it;
    nd_iter_prepare(&it, d->layout->shape, d->layout->ndim, 1, layouts, 0);
    unscale_ctx ctx = {d->inv_scale, 0};
    if (d->dtype == ND_FLOAT64) {
        void *base[1] = {(double *)d->grad + d->layout->offset};
        const int64_t itemsize[1] = {sizeof(double)};
        nd_iter_run_sized(&it, base, itemsize, unscale_row_f64, &ctx);
    } else {
        float *base[1] = {(float *)d->grad + d->layout->offset};
        nd_iter_run(&it, base, unscale_row, &ctx);
    }
    if (ctx.non_finite) *d->found_inf = 1.0f;
    return ND_OK;
}
