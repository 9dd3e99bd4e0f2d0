/* device.c: the table of devices and the backend each one runs on.
 *
 * The table is filled once, on first use: the host devices now, CUDA devices
 * when the CUDA backend registers them. Callers look devices up by id.
 */
/* sysconf(_SC_PHYS_PAGES) is a common extension, hidden by -std=c11. */
#define _DEFAULT_SOURCE

#include "internal.h"

#include <string.h>
#include <unistd.h>

static nd_device devices[ND_MAX_DEVICES];
static int device_count = 0;
static int initialised = 0;

static int64_t host_capacity(void) {
    long pages = sysconf(_SC_PHYS_PAGES);
    long page_size = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_size <= 0) return 0;
    return (int64_t)pages * (int64_t)page_size;
}

static void ensure_initialised(void) {
    if (initialised) return;
    initialised = 1;
    nd_device_register(ND_DEVICE_CPU, 0, "cpu", &nd_cpu_backend, host_capacity(), 1);
#ifdef NEEDLE_WITH_CUDA
    nd_cuda_register_devices();
#endif
}

nd_device *nd_device_register(nd_device_kind kind, int ordinal, const char *name,
                              const nd_backend *backend, int64_t capacity, int available) {
    ensure_initialised();
    if (device_count >= ND_MAX_DEVICES) return NULL;
    nd_device *dev = &devices[device_count];
    memset(dev, 0, sizeof *dev);
    dev->id = device_count;
    dev->kind = kind;
    dev->ordinal = ordinal;
    dev->available = available;
    dev->capacity = capacity;
    strncpy(dev->name, name, sizeof dev->name - 1);
    dev->backend = backend;
    dev->alloc.stats.limit = -1;
    dev->alloc.stats.trigger = -1;
    device_count++;
    return dev;
}

nd_device *nd_host_device_register(const char *name) {
    ensure_initialised();
    int hosts = 0;
    for (int id = 0; id < device_count; id++) {
        if (devices[id].kind != ND_DEVICE_CPU) continue;
        if (strncmp(devices[id].name, name, sizeof devices[id].name - 1) == 0) return &devices[id];
        hosts++;
    }
    if (hosts >= ND_MAX_HOST_DEVICES) return NULL;
    return nd_device_register(ND_DEVICE_CPU, hosts, name, &nd_cpu_backend, host_capacity(), 1);
}

int nd_device_count(void) {
    ensure_initialised();
    return device_count;
}

nd_device *nd_device_at(int id) {
    ensure_initialised();
    if (id < 0 || id >= device_count) return NULL;
    return &devices[id];
}

int nd_device_id(const nd_device *dev) { return dev->id; }
const char *nd_device_name(const nd_device *dev) { return dev->name; }
nd_device_kind nd_device_get_kind(const nd_device *dev) { return dev->kind; }
int nd_device_ordinal(const nd_device *dev) { return dev->ordinal; }
int nd_device_available(const nd_device *dev) { return dev->available; }
int64_t nd_device_capacity(const nd_device *dev) { return dev->capacity; }
