/* optim_update.c: the device-independent front end of the fused optimizer
 * updates (engine.h's nd_array_adam_update and nd_array_sgd_update): picks
 * the dtype to compute in (float64 when any operand is float64, else
 * float32), converts operands of other dtypes, checks shapes, devices, the
 * state's layout and aliasing, compacts a strided parameter or gradient,
 * allocates the new parameter and hands the device's backend plain
 * contiguous buffers of that dtype (optim_update.h).
 *
 * Everything that can fail runs before the backend writes anything, so a
 * refused update leaves the optimizer's state as it was.
 */
#include "optim_update.h"

#include <stdio.h>
#include <string.h>

/* A shape as Python writes it ("(4, 3)", "(5,)", "()") into buf. */
enum { SHAPE_TEXT_SIZE = ND_MAX_DIMS * 24 + 8 };
static const char *shape_text(const nd_layout *l, char *buf) {
    int used = snprintf(buf, SHAPE_TEXT_SIZE, "(");
    for (int d = 0; d < l->ndim; d++)
        used += snprintf(buf + used, (size_t)(SHAPE_TEXT_SIZE - used), d == 0 ? "%lld" : ", %lld",
                         (long long)l->shape[d]);
    snprintf(buf + used, (size_t)(SHAPE_TEXT_SIZE - used), l->ndim == 1 ? ",)" : ")");
    return buf;
}

/* a must have param's device and shape; `name` says which operand it is. */
static nd_status check_like_param(const char *op, const nd_array *param, const nd_array *a,
                                  const char *name) {
    nd_device *dp = param->storage->device, *da = a->storage->device;
    if (da != dp)
        return nd_fail(ND_ERR_DEVICE, "%s: %s is on %s() but the parameter is on %s()", op, name,
                       da->name, dp->name);
    if (a->layout.ndim != param->layout.ndim ||
        memcmp(a->layout.shape, param->layout.shape, sizeof(int64_t) * (size_t)a->layout.ndim)) {
        char sa[SHAPE_TEXT_SIZE], sp[SHAPE_TEXT_SIZE];
        return nd_fail(ND_ERR_SHAPE, "%s: %s has shape %s but the parameter has shape %s", op, name,
                       shape_text(&a->layout, sa), shape_text(&param->layout, sp));
    }
    return ND_OK;
}

/* What both updates share: the checked operands as contiguous buffers, the
 * new parameter, and the copies made for strided inputs. */
typedef struct prepared {
    int64_t n;
    nd_dtype dtype;
    void *param_out;
    const void *param, *grad;
    nd_array param_copy, grad_copy; /* storage NULL when not needed */
} prepared;

/* a's first element; every operand has the dtype computed in by now. */
static void *data_of(const nd_array *a) { return nd_storage_at(a->storage, a->layout.offset); }

/* data_of(a), or of a contiguous copy of a kept in *copy. */
static nd_status contiguous_input(const nd_array *a, nd_array *copy, const void **out) {
    if (nd_layout_is_contiguous(&a->layout)) {
        *out = data_of(a);
        return ND_OK;
    }
    nd_status status = nd_array_compact_copy(a, NULL, copy);
    if (status == ND_OK) *out = data_of(copy);
    return status;
}

static void release_copies(prepared *pr) {
    if (pr->param_copy.storage != NULL) nd_array_release(&pr->param_copy);
    if (pr->grad_copy.storage != NULL) nd_array_release(&pr->grad_copy);
}

/* Checks grad and the nstates state arrays against param: the state is
 * updated in place, so it must be contiguous and share no storage with any
 * other operand. Runs on the caller's arrays, before any conversion to the
 * dtype computed in, whose copies would hide an alias. */
static nd_status check_operands(const char *op, const nd_array *param, const nd_array *grad,
                                int nstates, const nd_array *const *states,
                                const char *const *names) {
    nd_status status = check_like_param(op, param, grad, "the gradient");
    for (int i = 0; i < nstates && status == ND_OK; i++) {
        const nd_array *s = states[i];
        if ((status = check_like_param(op, param, s, names[i])) != ND_OK) break;
        if (!nd_layout_is_contiguous(&s->layout))
            return nd_fail(ND_ERR_VALUE,
                           "%s: %s must be a contiguous array (it is updated in place)", op,
                           names[i]);
        int shared = s->storage == param->storage || s->storage == grad->storage;
        for (int j = 0; j < i; j++) shared |= s->storage == states[j]->storage;
        if (shared)
            return nd_fail(ND_ERR_VALUE,
                           "%s: %s shares memory with another operand (it is updated in place)", op,
                           names[i]);
    }
    return status;
}

/* Makes param_out and the contiguous inputs of checked operands that all
 * have the dtype computed in. in_place (a contiguous param): param_out stays
 * empty and the backend writes param itself. On failure nothing is held. */
static nd_status prepare(const nd_array *param, const nd_array *grad, int in_place,
                         nd_array *param_out, prepared *pr) {
    nd_device *dev = param->storage->device;
    nd_status status = ND_OK;
    pr->n = nd_layout_numel(&param->layout);
    pr->dtype = param->storage->dtype;
    if (pr->n > 0 && ((status = contiguous_input(param, &pr->param_copy, &pr->param)) != ND_OK ||
                      (status = contiguous_input(grad, &pr->grad_copy, &pr->grad)) != ND_OK)) {
        release_copies(pr);
        return status;
    }
    if (in_place) {
        pr->param_out = data_of(param);
        return ND_OK;
    }
    status =
        nd_array_empty_typed(dev, param->layout.ndim, param->layout.shape, pr->dtype, param_out);
    if (status != ND_OK) {
        release_copies(pr);
        return status;
    }
    pr->param_out = data_of(param_out);
    return ND_OK;
}

/* Releases what prepare made; param_out too when the backend failed. */
static nd_status finish(prepared *pr, nd_status status, nd_array *param_out) {
    release_copies(pr);
    if (status != ND_OK && param_out->storage != NULL) nd_array_release(param_out);
    return status;
}

static nd_status unsupported(const char *op, const nd_array *param) {
    return nd_fail(ND_ERR_DEVICE, "%s is not supported on %s()", op, param->storage->device->name);
}

/* The dtype an update of these operands computes in: float64 when any is
 * float64 (PyTorch updates a float64 parameter in float64; rounding it to
 * float32 every step would lose its precision even with a zero gradient),
 * else float32 (float16 and bfloat16 widen to it and round once at the end,
 * as PyTorch's opmath does). */
static nd_dtype compute_dtype(int n, const nd_array *const *arrays) {
    return nd_island_promoted(n, arrays) == ND_FLOAT64 ? ND_FLOAT64 : ND_FLOAT32;
}

static int all_of_dtype(int n, const nd_array *const *arrays, nd_dtype dtype) {
    for (int i = 0; i < n; i++)
        if (arrays[i]->storage->dtype != dtype) return 0;
    return 1;
}

/* A capturable Adam's state (engine.h's nd_adam_hyper): float64, shape
 * (2,), contiguous, on dev when dev is not NULL. */
static nd_status check_adam_state(const char *op, const nd_array *state, const nd_device *dev) {
    nd_device *ds = state->storage->device;
    if (dev != NULL && ds != dev)
        return nd_fail(ND_ERR_DEVICE, "%s: the step state is on %s() but the parameter is on %s()",
                       op, ds->name, dev->name);
    if (state->storage->dtype != ND_FLOAT64 || state->layout.ndim != 1 ||
        state->layout.shape[0] != 2 || !nd_layout_is_contiguous(&state->layout))
        return nd_fail(ND_ERR_VALUE,
                       "%s: the step state must be a contiguous float64 array of shape (2,) "
                       "holding [t, lr]",
                       op);
    return ND_OK;
}

/* The capturable step's extra checks, on the caller's arrays: the state, and
 * no gradient in the parameter's memory (the parameter is written in place
 * while the gradient is read). */
static nd_status check_capturable(const nd_array *param, const nd_array *grad, const nd_array *m,
                                  const nd_array *v, const nd_array *state) {
    nd_status status = check_adam_state("adam_update", state, param->storage->device);
    if (status != ND_OK) return status;
    const nd_storage *st = state->storage;
    if (st == param->storage || st == grad->storage || st == m->storage || st == v->storage)
        return nd_fail(ND_ERR_VALUE,
                       "adam_update: the step state shares memory with another operand");
    if (grad->storage == param->storage)
        return nd_fail(ND_ERR_VALUE,
                       "adam_update: the gradient shares memory with the parameter, which a "
                       "capturable step updates in place");
    return ND_OK;
}

double nd_adam_bias_correction(double beta, double t) {
    return nd_adam_bias_correction_inline(beta, t);
}

nd_status nd_array_adam_update(const nd_array *param, const nd_array *grad, const nd_array *m,
                               const nd_array *v, const nd_adam_hyper *hyper, nd_array *param_out) {
    static const char *const names[2] = {"the first moment m", "the second moment v"};
    const nd_array *states[2] = {m, v};
    const nd_array *state = hyper->state;
    memset(param_out, 0, sizeof *param_out);
    nd_status status = check_operands("adam_update", param, grad, 2, states, names);
    if (status != ND_OK) return status;
    if (state != NULL) {
        if ((status = check_capturable(param, grad, m, v, state)) != ND_OK) return status;
    } else if (param->storage->device->alloc.capturing) {
        /* The bias corrections and the learning rate are the kernel's
         * arguments, fixed at the capture: replays would repeat that step's. */
        return nd_fail(ND_ERR_BACKEND,
                       "Adam's step cannot be captured in a CUDA graph on %s: its learning rate "
                       "and bias corrections are host numbers fixed at the capture, and a replay "
                       "would repeat the captured step's; pass capturable=True to "
                       "needle.optim.Adam, which keeps them in device memory",
                       param->storage->device->name);
    }
    const nd_array *in[4] = {param, grad, m, v};
    const nd_dtype dtype = compute_dtype(4, in);
    if (!all_of_dtype(4, in, dtype)) { /* dtype_island.c: m and v (and a capturable step's
                                          param) written back, else param_out in param's
                                          dtype */
        nd_island is = {0};
        status = nd_island_enter_as(&is, 4, in, dtype);
        if (status == ND_OK)
            status = nd_array_adam_update(in[0], in[1], in[2], in[3], hyper, param_out);
        if (status == ND_OK && state != NULL) status = nd_island_write_back(param, in[0]);
        if (status == ND_OK && (status = nd_island_write_back(m, in[2])) == ND_OK)
            status = nd_island_write_back(v, in[3]);
        nd_island_release(&is);
        if (status == ND_OK)
            return state != NULL ? ND_OK : nd_island_leave(param_out, param->storage->dtype);
        if (param_out->storage != NULL) nd_array_release(param_out);
        return status;
    }
    if (state != NULL && !nd_layout_is_contiguous(&param->layout)) {
        /* In place through a contiguous copy, written back into the view. */
        nd_array copy;
        if ((status = nd_array_compact_copy(param, NULL, &copy)) != ND_OK) return status;
        status = nd_array_adam_update(&copy, grad, m, v, hyper, param_out);
        if (status == ND_OK) status = nd_array_assign(param, &copy);
        nd_array_release(&copy);
        return status;
    }
    prepared pr = {0};
    if ((status = prepare(param, grad, state != NULL, param_out, &pr)) != ND_OK) return status;
    const nd_backend *backend = param->storage->device->backend;
    if (backend->adam_update == NULL) {
        status = unsupported("adam_update", param);
    } else if (pr.n > 0) {
        nd_adam_desc d = {pr.n,       pr.dtype, pr.param_out,
                          pr.param,   pr.grad,  data_of(m),
                          data_of(v), *hyper,   state != NULL ? data_of(state) : NULL,
                          0};
        status = backend->adam_update(&d);
    }
    return finish(&pr, status, param_out);
}

nd_status nd_array_adam_count_step(const nd_array *state) {
    nd_status status = check_adam_state("adam_count_step", state, NULL);
    if (status != ND_OK) return status;
    const nd_backend *backend = state->storage->device->backend;
    if (backend->adam_update == NULL) return unsupported("adam_count_step", state);
    nd_adam_desc d = {0};
    d.dtype = ND_FLOAT64;
    d.state = data_of(state);
    d.count = 1;
    return backend->adam_update(&d);
}

nd_status nd_array_sgd_update(const nd_array *param, const nd_array *grad, const nd_array *u,
                              const nd_sgd_hyper *hyper, nd_array *param_out) {
    static const char *const names[1] = {"the momentum u"};
    memset(param_out, 0, sizeof *param_out);
    nd_status status = check_operands("sgd_update", param, grad, 1, &u, names);
    if (status != ND_OK) return status;
    const nd_array *in[3] = {param, grad, u};
    const nd_dtype dtype = compute_dtype(3, in);
    if (!all_of_dtype(3, in, dtype)) { /* dtype_island.c: u written back, param_out in
                                          param's dtype */
        nd_island is = {0};
        status = nd_island_enter_as(&is, 3, in, dtype);
        if (status == ND_OK) status = nd_array_sgd_update(in[0], in[1], in[2], hyper, param_out);
        if (status == ND_OK) status = nd_island_write_back(u, in[2]);
        nd_island_release(&is);
        if (status == ND_OK) return nd_island_leave(param_out, param->storage->dtype);
        if (param_out->storage != NULL) nd_array_release(param_out);
        return status;
    }
    prepared pr = {0};
    if ((status = prepare(param, grad, 0, param_out, &pr)) != ND_OK) return status;
    const nd_backend *backend = param->storage->device->backend;
    if (backend->sgd_update == NULL) {
        status = unsupported("sgd_update", param);
    } else if (pr.n > 0) {
        nd_sgd_desc d = {pr.n, pr.dtype, pr.param_out, pr.param, pr.grad, data_of(u), *hyper};
        status = backend->sgd_update(&d);
    }
    return finish(&pr, status, param_out);
}
