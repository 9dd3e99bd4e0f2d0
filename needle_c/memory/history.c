/* history.c: the memory history behind needle.memory._record_memory_history
 * and _snapshot (PyTorch's snapshot format): per device, the Python frames of
 * every live block allocated while recording, and a bounded trace of the
 * allocator's events.
 *
 * The engine reports events through one callback (engine.h). Only an
 * allocation runs Python here (it walks the frames, as a collection could run
 * at that point anyway); every other event may come while the collector
 * frees memory, so it only moves C data: a frame stack whose last reference
 * goes then waits on a pending list and drops its code objects at the next
 * allocation or call from Python. A snapshot copies the C state first and
 * builds Python objects afterwards, since building them may run the collector
 * and so change that state.
 *
 * While recording, each device also keeps a peak record: the frames of the
 * allocation at which the allocated bytes last reached a new high, and which
 * blocks were live then (needle.testing names them when a test passes its
 * limit_device_memory). The blocks live at the peak are the live map's
 * blocks allocated up to it plus those freed since, which the record keeps;
 * a new peak drops them, so the record holds at most the blocks live at the
 * peak, and costs one comparison per allocation.
 */
#include "history.h"
#include "runtime.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_FRAMES 64

/* The frames of one allocation, innermost first; shared by the live map and
 * the trace, freed with its last reference. */
typedef struct frame_stack {
    int64_t refs;
    struct frame_stack *next_pending;
    int depth;
    struct {
        PyObject *code; /* a strong reference to the frame's code object */
        int line;
    } frames[];
} frame_stack;

/* The trace's actions, in PyTorch's names (ACTION_NAMES). A_SNAPSHOT, the
 * viewer's zero-size mark, is where a collection started (its address is
 * the collection's index in collection_log.c, which snapshot.py resolves). */
enum {
    A_ALLOC,
    A_FREE_REQUESTED,
    A_FREE_COMPLETED,
    A_SEGMENT_ALLOC,
    A_SEGMENT_FREE,
    A_OOM,
    A_SNAPSHOT
};
static const char *const ACTION_NAMES[] = {"alloc",         "free_requested", "free_completed",
                                           "segment_alloc", "segment_free",   "oom",
                                           "snapshot"};
#define ACTION_COUNT ((int)(sizeof ACTION_NAMES / sizeof ACTION_NAMES[0]))

typedef struct trace_entry {
    int action;
    uintptr_t address;
    int64_t size, device_free, time_us;
    frame_stack *stack; /* NULL: no frames */
} trace_entry;

/* address -> frames (NULL: none recorded), allocation number and bytes of a
 * live block (open addressing, linear probing; key 0 is empty: no block lives
 * at address 0). */
typedef struct live_map {
    uintptr_t *keys;
    frame_stack **stacks;
    int64_t *seqs, *sizes;
    int64_t cap, count;
} live_map;

/* A block live at the peak and freed since. */
typedef struct freed_block {
    int64_t seq, size;
    frame_stack *stack;
} freed_block;

/* Where the device's allocated bytes peaked since the record was reset.
 * Allocations are numbered (seq); those after `since` are the measured ones,
 * `at` is the one that reached the peak (== since: none passed the bytes
 * allocated at the reset yet). */
typedef struct peak_record {
    int64_t seq, since, at;
    int64_t bytes;      /* allocated bytes at the peak (at the reset while at == since) */
    frame_stack *stack; /* the frames of allocation `at` */
    freed_block *freed; /* measured blocks live at the peak and freed since */
    int64_t nfreed, freed_cap;
} peak_record;

typedef struct device_history {
    int enabled;    /* HISTORY_OFF, _STATE (frames of live blocks), _ALL (and the trace) */
    int context;    /* CONTEXT_*: which records get frames */
    int all_frames; /* also needle's own innermost frames (stacks="all") */
    unsigned skip;  /* 1 << action: actions the trace leaves out */
    int64_t max_entries;
    live_map live;
    trace_entry *ring; /* the trace; once full, the oldest entry is overwritten */
    int64_t ring_cap, ring_count, ring_next;
    peak_record peak;
} device_history;

/* The history's C state: the runtime's (needle_rt.history), since the
 * engine's event callback has no module to reach. Made on first use (a
 * process that never records a history never pays for the tables). The code
 * objects its frame stacks hold are owned by C data the engine's events
 * reach, not by the module state: code objects are no GC containers, so no
 * cycle can run through them. */
struct memory_history {
    device_history devices[ND_MAX_DEVICES];
    frame_stack *pending; /* stacks whose last reference went where Python may not run */
    /* needle's package directory: frames from files under it are needle's own. */
    char *needle_prefix;
    size_t needle_prefix_len;
};

static void on_event(void *ctx, nd_device *dev, const nd_memory_event *event);

/* The runtime's tables, made (and the engine's event callback installed with
 * them) when they are not there yet; NULL with MemoryError set when they
 * cannot be. */
static memory_history *history_tables(void) {
    if (needle_rt.history != NULL) return needle_rt.history;
    needle_rt.history = calloc(1, sizeof *needle_rt.history);
    if (needle_rt.history == NULL) return (memory_history *)PyErr_NoMemory();
    nd_memory_set_event_callback(on_event, NULL);
    return needle_rt.history;
}

/* ---------------------------------------------------------- frame stacks */

/* Drops a reference without running Python: a stack whose last reference
 * goes waits for release_pending. */
static void stack_unref(frame_stack *s) {
    if (s == NULL || --s->refs > 0) return;
    /* A stack exists only once the tables do (it was captured for them). */
    s->next_pending = needle_rt.history->pending;
    needle_rt.history->pending = s;
}

/* Only where Python may run: code objects may be freed. */
static void release_pending(void) {
    memory_history *mh = needle_rt.history;
    while (mh != NULL && mh->pending != NULL) {
        frame_stack *s = mh->pending;
        mh->pending = s->next_pending;
        for (int i = 0; i < s->depth; i++) Py_DECREF(s->frames[i].code);
        free(s);
    }
}

static int is_needle_file(PyObject *filename) {
    const memory_history *mh = needle_rt.history;
    if (mh == NULL || mh->needle_prefix == NULL || !PyUnicode_Check(filename)) return 0;
    Py_ssize_t n = 0;
    const char *utf8 = PyUnicode_AsUTF8AndSize(filename, &n);
    if (utf8 == NULL) {
        PyErr_Clear();
        return 0;
    }
    return (size_t)n >= mh->needle_prefix_len &&
           memcmp(utf8, mh->needle_prefix, mh->needle_prefix_len) == 0;
}

/* The calling Python frames, innermost first, from the innermost one outside
 * needle's package (all of them with all_frames); NULL when there are none
 * or no host memory. */
static frame_stack *capture_stack(int all_frames) {
    PyObject *codes[MAX_FRAMES];
    int lines[MAX_FRAMES];
    int depth = 0;
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(frame);
    while (frame != NULL && depth < MAX_FRAMES) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        if (depth > 0 || all_frames || !is_needle_file(code->co_filename)) {
            codes[depth] = (PyObject *)code;
            lines[depth] = PyFrame_GetLineNumber(frame);
            depth++;
        } else {
            Py_DECREF(code);
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    if (depth == 0) return NULL;
    frame_stack *s = malloc(sizeof *s + sizeof s->frames[0] * (size_t)depth);
    if (s == NULL) {
        for (int i = 0; i < depth; i++) Py_DECREF(codes[i]);
        return NULL;
    }
    s->refs = 1;
    s->next_pending = NULL;
    s->depth = depth;
    for (int i = 0; i < depth; i++) {
        s->frames[i].code = codes[i];
        s->frames[i].line = lines[i];
    }
    return s;
}

/* -------------------------------------------------------------- live map */

static int64_t slot_of(const live_map *m, uintptr_t key) {
    uint64_t h = (uint64_t)key * UINT64_C(0x9E3779B97F4A7C15);
    return (int64_t)(h >> 20) & (m->cap - 1);
}

static int64_t find_slot(const live_map *m, uintptr_t key) {
    if (m->cap == 0) return -1;
    for (int64_t i = slot_of(m, key);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key) return i;
        if (m->keys[i] == 0) return -1;
    }
}

static void live_free_arrays(live_map *m) {
    free(m->keys);
    free(m->stacks);
    free(m->seqs);
    free(m->sizes);
}

/* Takes over the caller's reference on s (which may be NULL); 0 when the map
 * cannot grow. */
static int live_put(live_map *m, uintptr_t key, frame_stack *s, int64_t seq, int64_t size) {
    if (2 * (m->count + 1) > m->cap) {
        int64_t cap = m->cap > 0 ? 2 * m->cap : 1024;
        live_map grown = {calloc((size_t)cap, sizeof *grown.keys),
                          calloc((size_t)cap, sizeof *grown.stacks),
                          calloc((size_t)cap, sizeof *grown.seqs),
                          calloc((size_t)cap, sizeof *grown.sizes),
                          cap,
                          0};
        if (grown.keys == NULL || grown.stacks == NULL || grown.seqs == NULL ||
            grown.sizes == NULL) {
            live_free_arrays(&grown);
            return 0;
        }
        for (int64_t i = 0; i < m->cap; i++) {
            if (m->keys[i] == 0) continue;
            int64_t j = slot_of(&grown, m->keys[i]);
            while (grown.keys[j] != 0) j = (j + 1) & (cap - 1);
            grown.keys[j] = m->keys[i];
            grown.stacks[j] = m->stacks[i];
            grown.seqs[j] = m->seqs[i];
            grown.sizes[j] = m->sizes[i];
            grown.count++;
        }
        live_free_arrays(m);
        *m = grown;
    }
    int64_t i = slot_of(m, key);
    while (m->keys[i] != 0 && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    if (m->keys[i] == key) stack_unref(m->stacks[i]); /* a block we missed the free of */
    else m->count++;
    m->keys[i] = key;
    m->stacks[i] = s;
    m->seqs[i] = seq;
    m->sizes[i] = size;
    return 1;
}

/* Removes key (backward-shift deletion: no tombstones) and hands the caller
 * its entry, the stack's reference with it; 0 when key is not there. Never
 * allocates. */
static int live_take(live_map *m, uintptr_t key, frame_stack **stack, int64_t *seq, int64_t *size) {
    int64_t i = find_slot(m, key);
    if (i < 0) return 0;
    *stack = m->stacks[i];
    *seq = m->seqs[i];
    *size = m->sizes[i];
    m->count--;
    for (int64_t j = (i + 1) & (m->cap - 1); m->keys[j] != 0; j = (j + 1) & (m->cap - 1)) {
        int64_t home = slot_of(m, m->keys[j]);
        /* Entry j may fill hole i unless its home lies cyclically in (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            m->keys[i] = m->keys[j];
            m->stacks[i] = m->stacks[j];
            m->seqs[i] = m->seqs[j];
            m->sizes[i] = m->sizes[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->stacks[i] = NULL;
    return 1;
}

static void live_clear(live_map *m) {
    for (int64_t i = 0; i < m->cap; i++)
        if (m->keys[i] != 0) stack_unref(m->stacks[i]);
    live_free_arrays(m);
    *m = (live_map){NULL, NULL, NULL, NULL, 0, 0};
}

/* ----------------------------------------------------------- peak record */

/* Starts the record afresh from the device's allocated bytes now. Never runs
 * Python. */
static void peak_reset(device_history *h, const nd_device *dev) {
    peak_record *p = &h->peak;
    for (int64_t i = 0; i < p->nfreed; i++) stack_unref(p->freed[i].stack);
    free(p->freed);
    p->freed = NULL;
    p->nfreed = p->freed_cap = 0;
    stack_unref(p->stack);
    p->stack = NULL;
    p->since = p->at = p->seq;
    nd_memory_stats st;
    nd_memory_get_stats(dev, &st);
    p->bytes = st.allocated_current;
}

/* A new peak at allocation seq: the blocks freed before it were not live at
 * it. Never runs Python. */
static void peak_reached(peak_record *p, int64_t seq, int64_t bytes) {
    for (int64_t i = 0; i < p->nfreed; i++) stack_unref(p->freed[i].stack);
    p->nfreed = 0;
    stack_unref(p->stack);
    p->stack = NULL;
    p->at = seq;
    p->bytes = bytes;
}

/* A block leaves the live map: kept when it was a measured block live at the
 * peak. Takes over the reference on s; never runs Python (a block the host
 * has no memory to keep is dropped). */
static void peak_freed(peak_record *p, frame_stack *s, int64_t seq, int64_t size) {
    if (seq <= p->since || seq > p->at) {
        stack_unref(s);
        return;
    }
    if (p->nfreed == p->freed_cap) {
        int64_t cap = p->freed_cap > 0 ? 2 * p->freed_cap : 64;
        freed_block *grown = realloc(p->freed, sizeof *grown * (size_t)cap);
        if (grown == NULL) {
            stack_unref(s);
            return;
        }
        p->freed = grown;
        p->freed_cap = cap;
    }
    p->freed[p->nfreed++] = (freed_block){seq, size, s};
}

/* ----------------------------------------------------------------- trace */

static int64_t now_us(void) {
    struct timespec ts;
    if (timespec_get(&ts, TIME_UTC) != TIME_UTC) return 0;
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Takes over a reference on e->stack. Never runs Python; an entry the host
 * has no memory for is dropped. */
static void trace_add(device_history *h, trace_entry e) {
    if (h->enabled != HISTORY_ALL || (h->skip & (1u << e.action))) {
        stack_unref(e.stack);
        return;
    }
    if (h->ring_count < h->max_entries) {
        if (h->ring_count == h->ring_cap) {
            int64_t cap = h->ring_cap > 0 ? 2 * h->ring_cap : 1024;
            if (cap > h->max_entries) cap = h->max_entries;
            trace_entry *ring = realloc(h->ring, sizeof *ring * (size_t)cap);
            if (ring == NULL) {
                stack_unref(e.stack);
                return;
            }
            h->ring = ring;
            h->ring_cap = cap;
        }
        h->ring[h->ring_count++] = e;
        return;
    }
    stack_unref(h->ring[h->ring_next].stack);
    h->ring[h->ring_next] = e;
    h->ring_next = (h->ring_next + 1) % h->max_entries;
}

static void trace_clear(device_history *h) {
    for (int64_t i = 0; i < h->ring_count; i++) stack_unref(h->ring[i].stack);
    free(h->ring);
    h->ring = NULL;
    h->ring_cap = h->ring_count = h->ring_next = 0;
}

/* --------------------------------------------------------- engine events */

static void on_event(void *ctx, nd_device *dev, const nd_memory_event *event) {
    (void)ctx;
    int id = nd_device_id(dev);
    memory_history *mh = needle_rt.history;
    if (mh == NULL || id < 0 || id >= ND_MAX_DEVICES || mh->devices[id].enabled == HISTORY_OFF)
        return;
    device_history *h = &mh->devices[id];
    trace_entry e = {0, event->address, event->size, 0, now_us(), NULL};
    switch (event->action) {
    case ND_MEMORY_ALLOC:
    case ND_MEMORY_OOM: {
        /* The peak is taken before Python runs, so that a block freed
         * meanwhile (a collection) counts as live at it, as it was. */
        int64_t seq = 0;
        if (event->action == ND_MEMORY_ALLOC) {
            seq = ++h->peak.seq;
            nd_memory_stats st;
            nd_memory_get_stats(dev, &st);
            if (st.allocated_current > h->peak.bytes)
                peak_reached(&h->peak, seq, st.allocated_current);
        }
        /* The allocating path: Python may run (and change h meanwhile). */
        release_pending();
        frame_stack *s = h->context != CONTEXT_NONE ? capture_stack(h->all_frames) : NULL;
        if (h->enabled == HISTORY_OFF) {
            stack_unref(s);
            return;
        }
        if (event->action == ND_MEMORY_OOM) {
            e.action = A_OOM;
            e.device_free = event->device_free;
        } else {
            e.action = A_ALLOC;
            if (s != NULL) s->refs++;
            if (!live_put(&h->live, event->address, s, seq, event->size)) stack_unref(s);
            if (s != NULL && h->peak.at == seq) {
                s->refs++;
                h->peak.stack = s;
            }
        }
        if (s != NULL && h->context < CONTEXT_ALLOC) {
            stack_unref(s);
            s = NULL;
        }
        e.stack = s;
        trace_add(h, e);
        return;
    }
    case ND_MEMORY_FREE: {
        frame_stack *s;
        int64_t seq, size;
        if (live_take(&h->live, event->address, &s, &seq, &size))
            peak_freed(&h->peak, s, seq, size);
        e.action = A_FREE_REQUESTED;
        trace_add(h, e);
        e.action = A_FREE_COMPLETED;
        trace_add(h, e);
        return;
    }
    case ND_MEMORY_SEGMENT_ALLOC:
        e.action = A_SEGMENT_ALLOC;
        trace_add(h, e);
        return;
    case ND_MEMORY_SEGMENT_FREE:
        e.action = A_SEGMENT_FREE;
        trace_add(h, e);
        return;
    }
}

void history_note_collection(const nd_device *dev, int64_t index, int64_t time_us) {
    memory_history *mh = needle_rt.history;
    if (mh == NULL) return;
    int first = dev != NULL ? nd_device_id(dev) : 0;
    int last = dev != NULL ? first : ND_MAX_DEVICES - 1;
    for (int id = first; id >= 0 && id <= last && id < ND_MAX_DEVICES; id++) {
        if (mh->devices[id].enabled == HISTORY_OFF) continue;
        trace_entry e = {A_SNAPSHOT, (uintptr_t)index, 0, 0, time_us, NULL};
        trace_add(&mh->devices[id], e);
    }
}

/* 0, or -1 with MemoryError set (the tables could not be made). */
static int history_set(nd_device *dev, int enabled, int context, int all_frames,
                       int64_t max_entries, unsigned skip, int clear) {
    if (history_tables() == NULL) return -1;
    device_history *h = &needle_rt.history->devices[nd_device_id(dev)];
    if (enabled == HISTORY_OFF || clear) trace_clear(h);
    if (enabled == HISTORY_OFF) live_clear(&h->live);
    /* The peak record starts with the recording and ends with it. */
    if ((enabled == HISTORY_OFF) != (h->enabled == HISTORY_OFF)) peak_reset(h, dev);
    h->enabled = enabled;
    h->context = context;
    h->all_frames = all_frames;
    h->skip = skip;
    if (max_entries != h->max_entries) trace_clear(h); /* the ring's order assumes one size */
    h->max_entries = max_entries;
    nd_memory_set_tracing(dev, enabled != HISTORY_OFF);
    release_pending();
    return 0;
}

/* 0, or -1 with MemoryError set. */
static int history_set_prefix(const char *prefix) {
    memory_history *mh = history_tables();
    char *copy = mh != NULL ? malloc(strlen(prefix) + 1) : NULL;
    if (copy == NULL) {
        if (mh != NULL) PyErr_NoMemory();
        return -1;
    }
    strcpy(copy, prefix);
    free(mh->needle_prefix);
    mh->needle_prefix = copy;
    mh->needle_prefix_len = strlen(copy);
    return 0;
}


/* -------------------------------------------------------------- snapshot */

/* The frames of s as a tuple of (filename, line, name), one tuple per stack
 * (memo: stack pointer -> tuple), so that entries of one allocation share it. */
static PyObject *frames_of(const frame_stack *s, PyObject *memo) {
    if (s == NULL) return PyTuple_New(0);
    PyObject *key = PyLong_FromVoidPtr((void *)s);
    if (key == NULL) return NULL;
    PyObject *frames = PyDict_GetItemWithError(memo, key); /* borrowed */
    if (frames != NULL || PyErr_Occurred()) {
        Py_DECREF(key);
        return Py_XNewRef(frames);
    }
    frames = PyTuple_New(s->depth);
    for (int i = 0; frames != NULL && i < s->depth; i++) {
        PyCodeObject *code = (PyCodeObject *)s->frames[i].code;
        PyObject *f = Py_BuildValue("(OiO)", code->co_filename, s->frames[i].line, code->co_name);
        if (f == NULL) Py_CLEAR(frames);
        else PyTuple_SET_ITEM(frames, i, f);
    }
    if (frames != NULL && PyDict_SetItem(memo, key, frames) < 0) Py_CLEAR(frames);
    Py_DECREF(key);
    return frames;
}

/* The C state copied out before any Python object is built. */
typedef struct snapshot_copy {
    nd_memory_block *blocks;
    frame_stack **block_stacks;
    int64_t nblocks;
    trace_entry *trace;
    int64_t ntrace;
} snapshot_copy;

static void copy_release(snapshot_copy *c) {
    for (int64_t i = 0; c->block_stacks != NULL && i < c->nblocks; i++)
        stack_unref(c->block_stacks[i]);
    for (int64_t i = 0; c->trace != NULL && i < c->ntrace; i++) stack_unref(c->trace[i].stack);
    free(c->blocks);
    free(c->block_stacks);
    free(c->trace);
    release_pending();
}

/* 0, or -1 with a Python error set or (*failed != ND_OK) the engine's. */
static int copy_state(nd_device *dev, snapshot_copy *c, nd_status *failed) {
    *c = (snapshot_copy){NULL, NULL, 0, NULL, 0};
    *failed = ND_OK;
    int64_t cap = 0, count = 0;
    for (;;) {
        nd_status status = nd_memory_blocks(dev, c->blocks, cap, &count);
        if (status != ND_OK) {
            copy_release(c);
            *failed = status;
            return -1;
        }
        if (count <= cap) break;
        cap = count + 16;
        free(c->blocks);
        c->blocks = malloc(sizeof *c->blocks * (size_t)cap);
        if (c->blocks == NULL) goto no_memory;
    }
    c->nblocks = count;
    static const device_history never_recorded; /* const: a process that never recorded */
    const device_history *h =
        needle_rt.history ? &needle_rt.history->devices[nd_device_id(dev)] : &never_recorded;
    c->block_stacks = calloc((size_t)(count > 0 ? count : 1), sizeof *c->block_stacks);
    c->trace = malloc(sizeof *c->trace * (size_t)(h->ring_count > 0 ? h->ring_count : 1));
    if (c->block_stacks == NULL || c->trace == NULL) goto no_memory;
    for (int64_t i = 0; i < count; i++) {
        if (c->blocks[i].state != ND_BLOCK_STORAGE) continue;
        int64_t slot = find_slot(&h->live, c->blocks[i].address);
        if (slot < 0 || h->live.stacks[slot] == NULL) continue;
        c->block_stacks[i] = h->live.stacks[slot];
        c->block_stacks[i]->refs++;
    }
    /* Oldest first: once the ring is full, the oldest entry is the next one. */
    int64_t start = h->ring_count < h->max_entries ? 0 : h->ring_next;
    for (int64_t i = 0; i < h->ring_count; i++) {
        c->trace[i] = h->ring[(start + i) % h->ring_count];
        if (c->trace[i].stack != NULL) c->trace[i].stack->refs++;
    }
    c->ntrace = h->ring_count;
    return 0;
no_memory:
    copy_release(c);
    PyErr_NoMemory();
    return -1;
}

static const char *const BLOCK_STATES[] = {"inactive", "active_allocated", "active_allocated"};

/* (blocks, trace): blocks as (segment_address, segment_size, segment_small,
 * segment_expandable, segment_pool, address, size, requested_size, state, engine, frames),
 * trace entries as
 * (action, address, size, time_us, device_free, frames). */
static PyObject *history_snapshot(snapshot_copy *copy) {
    snapshot_copy c = *copy;
    PyObject *memo = PyDict_New();
    PyObject *blocks = PyList_New(0), *trace = PyList_New(0), *result = NULL;
    if (memo == NULL || blocks == NULL || trace == NULL) goto done;
    for (int64_t i = 0; i < c.nblocks; i++) {
        const nd_memory_block *b = &c.blocks[i];
        PyObject *frames = frames_of(c.block_stacks[i], memo);
        PyObject *row =
            frames == NULL
                ? NULL
                : Py_BuildValue("(KLiOiKLLsON)", (unsigned long long)b->segment_address,
                                (long long)b->segment_size, b->segment_small,
                                b->segment_expandable ? Py_True : Py_False, b->segment_pool,
                                (unsigned long long)b->address, (long long)b->size,
                                (long long)b->requested, BLOCK_STATES[b->state],
                                b->state == ND_BLOCK_ENGINE ? Py_True : Py_False, frames);
        if (row == NULL || PyList_Append(blocks, row) < 0) {
            Py_XDECREF(row);
            goto done;
        }
        Py_DECREF(row);
    }
    for (int64_t i = 0; i < c.ntrace; i++) {
        const trace_entry *e = &c.trace[i];
        PyObject *frames = frames_of(e->stack, memo);
        PyObject *row = frames == NULL ? NULL
                                       : Py_BuildValue("(sKLLLN)", ACTION_NAMES[e->action],
                                                       (unsigned long long)e->address,
                                                       (long long)e->size, (long long)e->time_us,
                                                       (long long)e->device_free, frames);
        if (row == NULL || PyList_Append(trace, row) < 0) {
            Py_XDECREF(row);
            goto done;
        }
        Py_DECREF(row);
    }
    result = PyTuple_Pack(2, blocks, trace);
done:
    Py_XDECREF(memo);
    Py_XDECREF(blocks);
    Py_XDECREF(trace);
    copy_release(&c);
    return result;
}

/* ------------------------------------------------------ Python functions */


PyObject *history_py_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "_memory_record_history(device_id, enabled, context, "
                                         "all_frames, max_entries, skip_mask, clear)");
        return NULL;
    }
    nd_device *dev = device_of_engine_id(args[0]);
    if (dev == NULL) return NULL;
    long enabled = PyLong_AsLong(args[1]), context = PyLong_AsLong(args[2]);
    int all_frames = PyObject_IsTrue(args[3]), clear = PyObject_IsTrue(args[6]);
    long long max_entries = PyLong_AsLongLong(args[4]);
    unsigned long skip = PyLong_AsUnsignedLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (enabled < HISTORY_OFF || enabled > HISTORY_ALL || context < CONTEXT_NONE ||
        context > CONTEXT_ALL || max_entries < 1 || skip >= (1ul << ACTION_COUNT)) {
        PyErr_SetString(PyExc_ValueError, "_memory_record_history: an argument is out of range");
        return NULL;
    }
    if (history_set(dev, (int)enabled, (int)context, all_frames, max_entries, (unsigned)skip,
                    clear) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *history_py_snapshot(PyObject *module, PyObject *arg) {
    nd_device *dev = device_of_engine_id(arg);
    if (dev == NULL) return NULL;
    snapshot_copy c;
    nd_status failed;
    if (copy_state(dev, &c, &failed) < 0)
        return failed != ND_OK ? raise_status(state_of_module(module), failed) : NULL;
    return history_snapshot(&c);
}

PyObject *history_py_settings(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev = device_of_engine_id(arg);
    if (dev == NULL) return NULL;
    static const device_history never_recorded;
    const device_history *h =
        needle_rt.history ? &needle_rt.history->devices[nd_device_id(dev)] : &never_recorded;
    /* A device never recorded has max_entries 0; 1 is as good: nothing is traced. */
    return Py_BuildValue("(iiOLk)", h->enabled, h->context, h->all_frames ? Py_True : Py_False,
                         (long long)(h->max_entries > 0 ? h->max_entries : 1),
                         (unsigned long)h->skip);
}

/* The device's history, or NULL with ValueError set when it is not recording. */
static device_history *recording(PyObject *arg, nd_device **dev) {
    *dev = device_of_engine_id(arg);
    if (*dev == NULL) return NULL;
    device_history *h = needle_rt.history ? &needle_rt.history->devices[nd_device_id(*dev)] : NULL;
    if (h == NULL || h->enabled == HISTORY_OFF) {
        PyErr_SetString(PyExc_ValueError, "the device's memory history is not being recorded");
        return NULL;
    }
    return h;
}

PyObject *history_py_reset_peak(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev;
    device_history *h = recording(arg, &dev);
    if (h == NULL) return NULL;
    peak_reset(h, dev);
    release_pending();
    Py_RETURN_NONE;
}

PyObject *history_py_peak(PyObject *module, PyObject *arg) {
    (void)module;
    nd_device *dev;
    device_history *h = recording(arg, &dev);
    if (h == NULL) return NULL;
    const peak_record *p = &h->peak;
    if (p->at == p->since) Py_RETURN_NONE;
    /* Copied first (each stack referenced), since building the result may run a
     * collection, whose frees change the map and the record. */
    int64_t n = 0, cap = p->nfreed + h->live.count;
    freed_block *blocks = malloc(sizeof *blocks * (size_t)(cap > 0 ? cap : 1));
    if (blocks == NULL) return PyErr_NoMemory();
    for (int64_t i = 0; i < h->live.cap; i++) {
        int64_t seq = h->live.seqs[i];
        if (h->live.keys[i] == 0 || seq <= p->since || seq > p->at) continue;
        blocks[n++] = (freed_block){seq, h->live.sizes[i], h->live.stacks[i]};
    }
    for (int64_t i = 0; i < p->nfreed; i++) blocks[n++] = p->freed[i];
    for (int64_t i = 0; i < n; i++)
        if (blocks[i].stack != NULL) blocks[i].stack->refs++;
    frame_stack *at = p->stack;
    if (at != NULL) at->refs++;
    int64_t bytes = p->bytes;

    PyObject *memo = PyDict_New(), *list = PyList_New(0), *result = NULL;
    PyObject *frames = memo != NULL ? frames_of(at, memo) : NULL;
    if (list == NULL || frames == NULL) goto done;
    for (int64_t i = 0; i < n; i++) {
        PyObject *block_frames = frames_of(blocks[i].stack, memo);
        PyObject *row = block_frames == NULL
                            ? NULL
                            : Py_BuildValue("(LLN)", (long long)blocks[i].seq,
                                            (long long)blocks[i].size, block_frames);
        if (row == NULL || PyList_Append(list, row) < 0) {
            Py_XDECREF(row);
            goto done;
        }
        Py_DECREF(row);
    }
    result = Py_BuildValue("(LOO)", (long long)bytes, frames, list);
done:
    Py_XDECREF(memo);
    Py_XDECREF(list);
    Py_XDECREF(frames);
    for (int64_t i = 0; i < n; i++) stack_unref(blocks[i].stack);
    free(blocks);
    stack_unref(at);
    release_pending();
    return result;
}

PyObject *history_py_set_prefix(PyObject *module, PyObject *arg) {
    (void)module;
    const char *prefix = PyUnicode_AsUTF8(arg);
    if (prefix == NULL) return NULL;
    if (history_set_prefix(prefix) < 0) return NULL;
    Py_RETURN_NONE;
}

PyObject *history_py_actions(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    PyObject *names = PyTuple_New(ACTION_COUNT);
    for (int i = 0; names != NULL && i < ACTION_COUNT; i++) {
        PyObject *name = PyUnicode_FromString(ACTION_NAMES[i]);
        if (name == NULL) Py_CLEAR(names);
        else PyTuple_SET_ITEM(names, i, name);
    }
    return names;
}
