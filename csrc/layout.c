/* layout.c: shapes, strides and offsets: every view is computed here, on
 * metadata alone, without touching device memory.
 *
 * Strides are in elements and may be 0 (broadcast) or negative (flips).
 */
#include "internal.h"

#include <string.h>

static nd_status check_ndim(int ndim) {
    if (ndim < 0 || ndim > ND_MAX_DIMS)
        return nd_fail(ND_ERR_SHAPE, "arrays have at most %d dimensions, got %d", ND_MAX_DIMS,
                       ndim);
    return ND_OK;
}

/* Element counts, extents and offsets stay below ND_MAX_ELEMENTS, so that any
 * of them times an element size, and the sum of two of them, fits in int64:
 * every view is checked against it where it is made, and arithmetic on a
 * checked layout cannot overflow. */
#define ND_MAX_ELEMENTS ((int64_t)1 << 56)

/* The element count of shape, or an error when a dimension is negative or
 * the count would reach ND_MAX_ELEMENTS. */
static nd_status checked_numel(int ndim, const int64_t *shape, int64_t *numel) {
    int64_t n = 1;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return nd_fail(ND_ERR_SHAPE, "negative dimension %lld", (long long)shape[i]);
        if (shape[i] == 0) zero = 1;
        /* A 0 anywhere makes the count 0, but the other dims must still be
         * representable: their product bounds what strides can reach. */
        int64_t d = shape[i] > 0 ? shape[i] : 1;
        if (n > ND_MAX_ELEMENTS / d) return nd_fail(ND_ERR_SHAPE, "array is too large");
        n *= d;
    }
    *numel = zero ? 0 : n;
    return ND_OK;
}

/* Checks that a view's offset and its reach along every dim stay within
 * +-ND_MAX_ELEMENTS (strides may be huge in as_strided). */
static nd_status checked_extent(const nd_layout *l) {
    int64_t low = l->offset, high = l->offset;
    if (low < -ND_MAX_ELEMENTS || low > ND_MAX_ELEMENTS)
        return nd_fail(ND_ERR_VALUE, "view offset is too large");
    for (int i = 0; i < l->ndim; i++) {
        if (l->shape[i] <= 1) continue;
        int64_t stride = l->strides[i] < 0 ? -l->strides[i] : l->strides[i];
        if (l->strides[i] == INT64_MIN ||
            (stride > 0 && l->shape[i] - 1 > ND_MAX_ELEMENTS / stride))
            return nd_fail(ND_ERR_VALUE, "view strides reach too far");
        int64_t span = (l->shape[i] - 1) * stride;
        if (l->strides[i] < 0) low -= span;
        else high += span;
        if (low < -ND_MAX_ELEMENTS || high > ND_MAX_ELEMENTS)
            return nd_fail(ND_ERR_VALUE, "view strides reach too far");
    }
    return ND_OK;
}

nd_status nd_layout_contiguous(int ndim, const int64_t *shape, nd_layout *out) {
    nd_status status = check_ndim(ndim);
    if (status != ND_OK) return status;
    int64_t numel;
    if ((status = checked_numel(ndim, shape, &numel)) != ND_OK) return status;
    memset(out, 0, sizeof *out);
    out->ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        out->shape[i] = shape[i];
        out->strides[i] = stride;
        stride *= shape[i] > 0 ? shape[i] : 1;
    }
    return ND_OK;
}

int64_t nd_layout_numel(const nd_layout *l) {
    int64_t n = 1;
    for (int i = 0; i < l->ndim; i++) n *= l->shape[i];
    return n;
}

int nd_layout_is_contiguous(const nd_layout *l) {
    int64_t expected = 1;
    if (nd_layout_numel(l) == 0) return 1;
    for (int i = l->ndim - 1; i >= 0; i--) {
        if (l->shape[i] == 1) continue;
        if (l->strides[i] != expected) return 0;
        expected *= l->shape[i];
    }
    return 1;
}

void nd_layout_extent(const nd_layout *l, int64_t *lo, int64_t *hi) {
    *lo = *hi = l->offset;
    if (nd_layout_numel(l) == 0) return;
    int64_t low = l->offset, high = l->offset;
    for (int i = 0; i < l->ndim; i++) {
        int64_t span = (l->shape[i] - 1) * l->strides[i];
        if (span < 0) low += span;
        else high += span;
    }
    *lo = low;
    *hi = high + 1;
}

nd_status nd_resolve_shape(int64_t numel, int ndim, const int64_t *shape, int64_t *resolved) {
    nd_status status = check_ndim(ndim);
    if (status != ND_OK) return status;
    int unknown = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (unknown >= 0)
                return nd_fail(ND_ERR_SHAPE, "can only specify one unknown dimension");
            unknown = i;
            resolved[i] = 1;
        } else {
            resolved[i] = shape[i];
        }
    }
    if ((status = checked_numel(ndim, resolved, &known)) != ND_OK) return status;
    if (unknown >= 0) {
        if (known == 0 || numel % known != 0)
            return nd_fail(ND_ERR_SHAPE,
                           "cannot reshape array of size %lld with an unknown dimension",
                           (long long)numel);
        resolved[unknown] = numel / known;
    } else if (known != numel) {
        return nd_fail(ND_ERR_SHAPE, "cannot reshape array of size %lld into a shape of size %lld",
                       (long long)numel, (long long)known);
    }
    return ND_OK;
}

nd_status nd_layout_reshape(const nd_layout *in, int ndim, const int64_t *new_shape,
                            nd_layout *out) {
    int64_t shape[ND_MAX_DIMS];
    int64_t numel = nd_layout_numel(in);
    nd_status status = nd_resolve_shape(numel, ndim, new_shape, shape);
    if (status != ND_OK) return status;
    nd_layout result;
    if (numel == 0 || nd_layout_is_contiguous(in)) {
        nd_layout_contiguous(ndim, shape, &result);
        result.offset = in->offset;
        *out = result;
        return ND_OK;
    }
    /* NumPy's no-copy reshape: match groups of old and new dims with equal
     * products; a group is viewable when its old dims are mutually contiguous. */
    int64_t old_shape[ND_MAX_DIMS], old_strides[ND_MAX_DIMS];
    int old_ndim = 0;
    for (int i = 0; i < in->ndim; i++) {
        if (in->shape[i] == 1) continue;
        old_shape[old_ndim] = in->shape[i];
        old_strides[old_ndim] = in->strides[i];
        old_ndim++;
    }
    memset(&result, 0, sizeof result);
    result.ndim = ndim;
    result.offset = in->offset;
    int oi = 0, oj = 1, ni = 0, nj = 1;
    while (ni < ndim && oi < old_ndim) {
        int64_t np = shape[ni], op = old_shape[oi];
        while (np != op) {
            if (np < op) {
                if (nj >= ndim) return nd_fail(ND_ERR_INTERNAL, "reshape mismatch");
                np *= shape[nj++];
            } else {
                if (oj >= old_ndim) return nd_fail(ND_ERR_INTERNAL, "reshape mismatch");
                op *= old_shape[oj++];
            }
        }
        for (int ok = oi; ok < oj - 1; ok++)
            if (old_strides[ok] != old_shape[ok + 1] * old_strides[ok + 1])
                return nd_fail(ND_ERR_NOT_VIEWABLE, "reshape needs a copy");
        result.strides[nj - 1] = old_strides[oj - 1];
        for (int nk = nj - 1; nk > ni; nk--)
            result.strides[nk - 1] = result.strides[nk] * shape[nk];
        ni = nj++;
        oi = oj++;
    }
    int64_t last = ni >= 1 ? result.strides[ni - 1] : 1;
    for (int nk = ni; nk < ndim; nk++) result.strides[nk] = last;
    for (int i = 0; i < ndim; i++) result.shape[i] = shape[i];
    *out = result;
    return ND_OK;
}

nd_status nd_normalize_axis(int64_t axis, int ndim, int *out) {
    if (axis < -(int64_t)ndim || axis >= ndim)
        return nd_fail(ND_ERR_AXIS, "axis %lld is out of bounds for an array of dimension %d",
                       (long long)axis, ndim);
    *out = (int)(axis < 0 ? axis + ndim : axis);
    return ND_OK;
}

nd_status nd_layout_permute(const nd_layout *in, const int *axes, nd_layout *out) {
    nd_layout result = *in;
    int seen[ND_MAX_DIMS] = {0};
    for (int i = 0; i < in->ndim; i++) {
        int axis = 0;
        nd_status status = nd_normalize_axis(axes[i], in->ndim, &axis);
        if (status != ND_OK) return status;
        if (seen[axis]) return nd_fail(ND_ERR_AXIS, "repeated axis %d in permutation", axis);
        seen[axis] = 1;
        result.shape[i] = in->shape[axis];
        result.strides[i] = in->strides[axis];
    }
    *out = result;
    return ND_OK;
}

nd_status nd_layout_broadcast_to(const nd_layout *in, int ndim, const int64_t *shape,
                                 nd_layout *out) {
    nd_status status = check_ndim(ndim);
    if (status != ND_OK) return status;
    if (ndim < in->ndim)
        return nd_fail(ND_ERR_SHAPE, "cannot broadcast an array of %d dims to %d dims", in->ndim,
                       ndim);
    nd_layout result;
    memset(&result, 0, sizeof result);
    result.ndim = ndim;
    result.offset = in->offset;
    int lead = ndim - in->ndim;
    int64_t numel;
    if ((status = checked_numel(ndim, shape, &numel)) != ND_OK) return status;
    for (int i = 0; i < ndim; i++) {
        result.shape[i] = shape[i];
        if (i < lead) {
            result.strides[i] = 0;
            continue;
        }
        int64_t dim = in->shape[i - lead];
        if (dim == shape[i]) {
            result.strides[i] = in->strides[i - lead];
        } else if (dim == 1) {
            result.strides[i] = 0;
        } else {
            return nd_fail(ND_ERR_SHAPE, "cannot broadcast dimension %d of size %lld to size %lld",
                           i - lead, (long long)dim, (long long)shape[i]);
        }
    }
    *out = result;
    return ND_OK;
}

/* 1 with a * b in *out when the product fits in int64, else 0; the check
 * comes before the multiplication, since signed overflow is undefined
 * (CERT INT32-C's test). */
static int mul_fits(int64_t a, int64_t b, int64_t *out) {
    int overflows;
    if (a > 0) overflows = b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a;
    else overflows = b > 0 ? a < INT64_MIN / b : a != 0 && b < INT64_MAX / a;
    if (overflows) return 0;
    *out = a * b;
    return 1;
}

/* Any step is taken, down to Python's -(2**63 - 1): a step past the
 * dimension leaves one element (NumPy's answer to a[::-2**63]). The dim's
 * stride becomes stride * step, as in NumPy, where that fits in int64; it
 * always does for two elements or more (the view's checked extent bounds
 * it), and for one element or none, whose stride moves through nothing, a
 * product that does not fit leaves the stride it had. */
nd_status nd_layout_slice(nd_layout *l, int dim, int64_t start, int64_t step, int64_t length) {
    if (dim < 0 || dim >= l->ndim) return nd_fail(ND_ERR_INDEX, "too many indices");
    if (step == 0) return nd_fail(ND_ERR_VALUE, "slice step cannot be zero");
    if (length < 0) length = 0;
    int64_t reach; /* (length - 1) * step: from the first index to the last */
    if (length > 0 && (start < 0 || start >= l->shape[dim] || !mul_fits(length - 1, step, &reach) ||
                       reach < -start || reach > l->shape[dim] - 1 - start))
        return nd_fail(ND_ERR_INDEX, "slice out of range for dimension %d", dim);
    int64_t stride = l->strides[dim];
    if (!mul_fits(l->strides[dim], step, &stride) && length > 1)
        return nd_fail(ND_ERR_INDEX,
                       "slice step %lld times the stride %lld of dimension %d overflows int64",
                       (long long)step, (long long)l->strides[dim], dim);
    if (length > 0) l->offset += start * l->strides[dim];
    l->strides[dim] = stride;
    l->shape[dim] = length;
    return ND_OK;
}

nd_status nd_layout_drop_dim(nd_layout *l, int dim) {
    if (dim < 0 || dim >= l->ndim || l->shape[dim] != 1)
        return nd_fail(ND_ERR_INTERNAL, "only a size-1 dimension can be dropped");
    for (int i = dim; i < l->ndim - 1; i++) {
        l->shape[i] = l->shape[i + 1];
        l->strides[i] = l->strides[i + 1];
    }
    l->ndim--;
    return ND_OK;
}

nd_status nd_layout_flip(const nd_layout *in, int naxes, const int *axes, nd_layout *out) {
    nd_layout result = *in;
    int seen[ND_MAX_DIMS] = {0};
    for (int i = 0; i < naxes; i++) {
        int axis = 0;
        nd_status status = nd_normalize_axis(axes[i], in->ndim, &axis);
        if (status != ND_OK) return status;
        if (seen[axis]) return nd_fail(ND_ERR_AXIS, "repeated axis %d in flip", axis);
        seen[axis] = 1;
        if (result.shape[axis] > 0)
            result.offset += (result.shape[axis] - 1) * result.strides[axis];
        result.strides[axis] = -result.strides[axis];
    }
    *out = result;
    return ND_OK;
}

nd_status nd_layout_check_bounds(const nd_layout *l, int64_t numel) {
    nd_status status = check_ndim(l->ndim);
    int64_t count;
    if (status != ND_OK || (status = checked_numel(l->ndim, l->shape, &count)) != ND_OK ||
        (status = checked_extent(l)) != ND_OK)
        return status;
    int64_t lo, hi;
    nd_layout_extent(l, &lo, &hi);
    if (nd_layout_numel(l) > 0 && (lo < 0 || hi > numel))
        return nd_fail(ND_ERR_VALUE, "view reaches elements [%lld, %lld) outside a storage of %lld",
                       (long long)lo, (long long)hi, (long long)numel);
    return ND_OK;
}

nd_status nd_broadcast_shapes(int andim, const int64_t *ashape, int bndim, const int64_t *bshape,
                              int *out_ndim, int64_t *out_shape) {
    int ndim = andim > bndim ? andim : bndim;
    nd_status status = check_ndim(ndim);
    if (status != ND_OK) return status;
    for (int i = 0; i < ndim; i++) {
        int ai = i - (ndim - andim), bi = i - (ndim - bndim);
        int64_t a = ai >= 0 ? ashape[ai] : 1, b = bi >= 0 ? bshape[bi] : 1;
        if (a == b || b == 1) {
            out_shape[i] = a;
        } else if (a == 1) {
            out_shape[i] = b;
        } else {
            return nd_fail(ND_ERR_SHAPE,
                           "operands could not be broadcast together: dimension %d has sizes %lld "
                           "and %lld",
                           i, (long long)a, (long long)b);
        }
    }
    *out_ndim = ndim;
    return ND_OK;
}

int nd_coalesce(int ndim, const int64_t *shape, int nops, const nd_layout *const *layouts,
                int order_by, int64_t *out_shape, int64_t out_strides[][ND_MAX_DIMS]) {
    int64_t dims[ND_MAX_DIMS];
    int64_t strides[ND_COALESCE_MAX_OPS][ND_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        dims[n] = shape[d];
        for (int op = 0; op < nops; op++)
            strides[op][n] = layouts[op] ? layouts[op]->strides[d] : 0;
        n++;
    }
    /* Stable insertion sort: outermost first by the chosen operand's |stride|. */
    for (int i = 1; order_by >= 0 && i < n; i++) {
        for (int j = i; j > 0; j--) {
            int64_t prev = strides[order_by][j - 1], cur = strides[order_by][j];
            if ((prev < 0 ? -prev : prev) >= (cur < 0 ? -cur : cur)) break;
            int64_t t = dims[j];
            dims[j] = dims[j - 1];
            dims[j - 1] = t;
            for (int op = 0; op < nops; op++) {
                t = strides[op][j];
                strides[op][j] = strides[op][j - 1];
                strides[op][j - 1] = t;
            }
        }
    }
    if (n == 0) {
        out_shape[0] = 1;
        for (int op = 0; op < nops; op++) out_strides[op][0] = 0;
        return 1;
    }
    /* Merge dim d into the one before it when every operand steps through both as one. */
    int out = 0;
    out_shape[0] = dims[0];
    for (int op = 0; op < nops; op++) out_strides[op][0] = strides[op][0];
    for (int d = 1; d < n; d++) {
        int mergeable = 1;
        for (int op = 0; op < nops; op++)
            if (out_strides[op][out] != strides[op][d] * dims[d]) mergeable = 0;
        if (mergeable) {
            out_shape[out] *= dims[d];
        } else {
            out++;
            out_shape[out] = dims[d];
        }
        for (int op = 0; op < nops; op++) out_strides[op][out] = strides[op][d];
    }
    return out + 1;
}
