/* runtime.h: needle's process-wide runtime: the C state of the one engine a
 * process holds, in one struct, for the code that gets no module to find its
 * state through: the engine's callbacks (an allocation's collection, the
 * memory history's events, the CPU backend's sgemm), tp_traverse and
 * tp_dealloc, and the scoped collection they start.
 *
 * What lives here is C data only: counters, switches, the registry's list
 * heads, function pointers. Python objects never do: they are in the module
 * state (needle_state), which the module traverses and clears; `state` is a
 * borrowed pointer to it. A process holds one needle (module.c refuses
 * subinterpreters), so one runtime is the truth, not a shortcut.
 *
 * Written and read under the GIL. Nothing here calls Python.
 */
#ifndef NEEDLE_C_RUNTIME_H
#define NEEDLE_C_RUNTIME_H

#include "needle_c.h"

/* The registry entry every Value and Op carries (autograd/registry.c links
 * it; memory/scoped.c reads it during a scoped collection). */
typedef struct needle_link {
    struct needle_link *prev, *next; /* NULL while not linked */
    Py_ssize_t refs;
    uint32_t epoch;
    int state;
    int frozen; /* treated as frozen by gc.freeze() (memory/scoped.c) */
} needle_link;

/* The memory history's C tables (memory/history.c), made on first use. */
typedef struct memory_history memory_history;

/* A CBLAS sgemm found at import (array/blas.c); at most one is set. */
typedef void (*needle_cblas_sgemm64)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                                     int64_t, const float *, int64_t, float, float *, int64_t);
typedef void (*needle_cblas_sgemm32)(int, int, int, int, int, int, float, const float *, int,
                                     const float *, int, float, float *, int);

typedef struct needle_runtime {
    /* The module state of the needle_c module that installed the engine's
     * callbacks (borrowed); NULL once that module is cleared. */
    needle_state *state;

    struct {
        /* The registry: every live Value and every live Op, in creation order. */
        needle_link values, ops;
        Py_ssize_t linked;
        /* Live Values (the course's TENSOR_COUNTER), and whether each new
         * one records where it was made (alloc_sites.c). */
        Py_ssize_t live_values;
        int record_sites;
        /* 0: the gc_blind demonstration, every autograd tp_traverse reports
         * nothing (tensor.c, op.c). */
        int gc_visible;
        /* The mark of the last topological sort (autograd.c). */
        uint64_t sorts;
        /* Called where a step's old graph has just become garbage (backward);
         * module.c sets it to the collection policy's safe point, so that
         * autograd/ need not know memory/. NULL: none. */
        void (*safe_point)(void);
    } autograd;

    struct {
        uint32_t epoch; /* the current collection's mark on the registry's links */
        int in_progress;
        int enabled;           /* _set_scoped_enabled */
        int python_gc_running; /* between gc.callbacks' start and stop */
        /* gc.get_freeze_count() when the last scoped collection began (or
         * at install): how scoped.c tells that a freeze happened since. */
        Py_ssize_t freeze_count;
        scoped_totals totals;
    } scoped;

    memory_history *history; /* NULL until a history is first recorded */

    struct {
        needle_cblas_sgemm64 sgemm64;
        needle_cblas_sgemm32 sgemm32;
        char description[512]; /* what _blas() and _cpu_kernels() report */
    } blas;
} needle_runtime;

extern needle_runtime needle_rt;

#endif /* NEEDLE_C_RUNTIME_H */
