/* storage.c: refcounted device buffers, the only owners of device memory.
 *
 * Views (nd_array) hold one reference each; the buffer goes back to its
 * device's allocator when the last reference is released.
 */
#include "internal.h"

#include <stdlib.h>

/* Per device, the live storages whose memory came from its allocator (the
 * list nd_memory_blocks reads; linking costs two pointer writes). */
static nd_storage *live_storages[ND_MAX_DEVICES];

static nd_storage **live_head(const nd_device *dev) {
    return dev->id >= 0 && dev->id < ND_MAX_DEVICES ? &live_storages[dev->id] : NULL;
}

static void link_live(nd_storage *s) {
    nd_storage **head = live_head(s->device);
    s->prev_live = NULL;
    s->next_live = NULL;
    if (head == NULL) return;
    s->next_live = *head;
    if (*head != NULL) (*head)->prev_live = s;
    *head = s;
}

static void unlink_live(nd_storage *s) {
    nd_storage **head = live_head(s->device);
    if (head == NULL) return;
    if (s->prev_live != NULL) s->prev_live->next_live = s->next_live;
    else if (*head == s) *head = s->next_live;
    if (s->next_live != NULL) s->next_live->prev_live = s->prev_live;
}

int64_t nd_storage_live(const nd_device *dev, nd_live_storage *out, int64_t cap) {
    nd_storage **head = live_head(dev);
    int64_t n = 0;
    for (nd_storage *s = head != NULL ? *head : NULL; s != NULL; s = s->next_live) {
        if (s->data == NULL) continue; /* empty: holds no memory */
        if (n < cap)
            out[n] = (nd_live_storage){(uintptr_t)s->data, s->numel * nd_dtype_size(s->dtype)};
        n++;
    }
    return n;
}

nd_status nd_storage_new_typed(nd_device *dev, int64_t numel, nd_dtype dtype, nd_storage **out) {
    *out = NULL;
    int64_t itemsize = nd_dtype_size(dtype);
    if (itemsize == 0) return nd_fail(ND_ERR_VALUE, "unknown dtype %d", (int)dtype);
    if (numel < 0) return nd_fail(ND_ERR_VALUE, "negative element count %lld", (long long)numel);
    if (numel > INT64_MAX / itemsize)
        return nd_fail(ND_ERR_VALUE, "array of %lld elements is too large", (long long)numel);
    nd_storage *s = malloc(sizeof *s);
    if (s == NULL) return nd_fail(ND_ERR_OOM, "out of host memory for a storage header");
    void *data = NULL;
    nd_status status = nd_memory_alloc(dev, numel * itemsize, &data);
    if (status != ND_OK) {
        free(s);
        return status;
    }
    s->refcount = 1;
    s->numel = numel;
    s->dtype = dtype;
    s->data = data;
    s->device = dev;
    s->release = NULL;
    s->release_ctx = NULL;
    link_live(s);
    *out = s;
    return ND_OK;
}

nd_status nd_storage_new(nd_device *dev, int64_t numel, nd_storage **out) {
    return nd_storage_new_typed(dev, numel, ND_FLOAT32, out);
}

/* Stands in for a NULL release so that release != NULL alone marks a
 * borrowed buffer. */
static void release_nothing(void *ctx) { (void)ctx; }

/* Borrowed memory skips the allocator on both ends, so its books only ever
 * show memory the engine can give back. */
nd_status nd_storage_wrap(nd_device *dev, void *data, int64_t numel, nd_dtype dtype,
                          void (*release)(void *ctx), void *ctx, nd_storage **out) {
    *out = NULL;
    if (nd_dtype_size(dtype) == 0) return nd_fail(ND_ERR_VALUE, "unknown dtype %d", (int)dtype);
    if (numel < 0) return nd_fail(ND_ERR_VALUE, "negative element count %lld", (long long)numel);
    if (data == NULL && numel > 0) return nd_fail(ND_ERR_VALUE, "wrapping a NULL buffer");
    nd_storage *s = malloc(sizeof *s);
    if (s == NULL) return nd_fail(ND_ERR_OOM, "out of host memory for a storage header");
    s->refcount = 1;
    s->numel = numel;
    s->dtype = dtype;
    s->data = data;
    s->device = dev;
    s->release = release != NULL ? release : release_nothing;
    s->release_ctx = ctx;
    s->prev_live = NULL;
    s->next_live = NULL;
    *out = s;
    return ND_OK;
}

void nd_storage_retain(nd_storage *s) { s->refcount++; }

void nd_storage_release(nd_storage *s) {
    if (s == NULL || --s->refcount > 0) return;
    if (s->release != NULL) s->release(s->release_ctx);
    else {
        unlink_live(s);
        nd_memory_free(s->device, s->data, s->numel * nd_dtype_size(s->dtype));
    }
    free(s);
}

nd_buffer nd_storage_buffer(const nd_storage *s) { return (nd_buffer){s->data, s->dtype}; }
nd_dtype nd_storage_dtype(const nd_storage *s) { return s->dtype; }
int64_t nd_storage_numel(const nd_storage *s) { return s->numel; }
nd_device *nd_storage_device(const nd_storage *s) { return s->device; }
int64_t nd_storage_refcount(const nd_storage *s) { return s->refcount; }
int nd_storage_borrowed(const nd_storage *s) { return s->release != NULL; }
