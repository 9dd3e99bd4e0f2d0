/* collection_log.h: the record of every collection (collection_log.c): what
 * started it, what it ran, how long it took and what it freed, kept in a
 * bounded ring that needle.memory.collection_history() reads. The runner
 * (pressure.c, alignment.c) and the gc.callbacks observer (scoped.c) open
 * and close the records; nothing else writes them.
 */
#ifndef NEEDLE_C_MEMORY_COLLECTION_LOG_H
#define NEEDLE_C_MEMORY_COLLECTION_LOG_H

#include "needle_c.h"

/* The ring keeps the latest COLLECTION_LOG_CAPACITY records; a record's
 * index keeps counting past it (and past a clear). */
#define COLLECTION_LOG_CAPACITY 1024

/* What started a collection (COLLECTION_TRIGGER_NAMES in collection_log.c). */
typedef enum collection_trigger {
    COLLECTION_PRESSURE = 0,   /* an allocation passed the device's trigger */
    COLLECTION_SAFE_POINT = 1, /* reset_grad()/backward() with allocations past it */
    COLLECTION_OOM = 2,        /* the out-of-memory ladder */
    COLLECTION_ALIGNED = 3,    /* agreed across ranks (alignment.c) */
    COLLECTION_USER = 4,       /* gc.collect() (full ones) or needle.memory.collect() */
} collection_trigger;

/* Opens the record of a collection that starts now, for `dev` (NULL: the
 * whole process; its bytes are summed over the devices). One record per
 * outermost collection: while one is open, a collection started inside it
 * (needle's gc.collect() seen by the observer, a ladder run from a
 * finalizer) is part of it, and this returns 0; 1 when this call opened it
 * and must close it with collection_log_end. Also puts the collection's mark
 * in the memory history's trace (history.c) of the devices recording one. */
int collection_log_begin(nd_device *dev, collection_trigger trigger);
/* A step of the open record ran: a scoped collection (generation -1) or a
 * full one of `generation`, which freed `objects` Python objects. Nothing
 * when no record is open. */
void collection_log_note(int generation, int64_t objects);
/* Closes the record opened by a begin that returned `owned` (nothing when 0):
 * its seconds and bytes are taken now. A record whose steps never ran (no
 * note) is dropped. */
void collection_log_end(int owned);
/* The gc.callbacks observer's part: Python's collection of `generation`
 * starts (start=1) or stops having collected `collected` objects. A
 * collection of the oldest generation that no needle collection started is
 * the user's (gc.collect(); Python's rare automatic full collections look the
 * same through gc.callbacks and are recorded so too); younger generations,
 * Python's automatic collections, are not recorded. */
void collection_log_python_phase(int start, int generation, int64_t collected);

extern PyMethodDef collection_log_module_functions[];

#endif /* NEEDLE_C_MEMORY_COLLECTION_LOG_H */
