/* gc_pacer.h: when needle collects garbage for device memory, as pure
 * functions: the collection policy of docs/design.md ("The collection
 * policy"), written once, here.
 *
 * The pacer decides; it never collects, reads a clock or touches a global.
 * Its caller (needle_c/memory/pressure.c, the runner) reads the clock and the
 * device's bytes, asks nd_pacer_decide what an event calls for, runs the
 * collections and hands what they did back to the nd_pacer_after_* updates.
 * Every input is an argument and every effect is on the state passed in, so
 * tests/c/test_gc_pacer.c checks the policy as table rows: inputs, the
 * decision and the state that follows.
 */
#ifndef NEEDLE_GC_PACER_H
#define NEEDLE_GC_PACER_H

#include <stdint.h>

/* What the user sets (needle.memory.set_gc_policy). */
typedef struct nd_gc_policy {
    int enabled; /* 0: no collections at all, the out-of-memory path's neither */
    double growth;
    int64_t min_growth;
    double high_water;
    double max_gc_fraction;
    int64_t watermark;         /* bytes; -1: none */
    double watermark_fraction; /* of each device's budget; -1: none */
} nd_gc_policy;

/* The policy's defaults: the one place they are written down (Python reads
 * them through needle_c._gc_policy_defaults()); an initializer, so that a
 * static policy can start from them. */
#define ND_GC_POLICY_DEFAULTS            \
    {                                    \
        .enabled = 1,                    \
        .growth = 0.25,                  \
        .min_growth = (int64_t)64 << 20, \
        .high_water = 0.8,               \
        .max_gc_fraction = 0.05,         \
        .watermark = -1,                 \
        .watermark_fraction = -1.0,      \
    }
extern const nd_gc_policy nd_gc_policy_default;

/* NULL when the policy's numbers are usable, else what is wrong (for a
 * ValueError). Written so that NaN fails every test. */
const char *nd_gc_policy_invalid(const nd_gc_policy *policy);

/* The collector's figures of one device (needle.memory.memory_stats(); what
 * each counts is written beside the keys in needle_c/memory/stats.c). */
typedef struct nd_pacer_counts {
    int64_t pressure_collections, safe_point_collections, oom_collections;
    int64_t skipped, deferred;
    double seconds;
    int64_t freed_bytes;
    int64_t scoped_collections, scoped_examined, scoped_freed_bytes;
    double scoped_seconds;
    int64_t full_collections, full_fallbacks, fallbacks_skipped;
    int64_t aligned_wants, aligned_rounds_waited, aligned_collections;
} nd_pacer_counts;

/* One device's pacer state. Zero it with nd_pacer_init. */
typedef struct nd_pacer_state {
    /* What was allocated right after the last collection (the trigger's base). */
    int64_t survivors;
    struct {
        double last_end, last_duration; /* the last collection */
        int last_freed_little;          /* it freed under 1% of what was allocated */
        double cooldown_seconds, cooldown_until;
    } pacing;
    /* Safe points: when the last one came, the usual gap between them,
     * whether the last collection at one freed almost nothing, and the live
     * set seen at them (-1: none yet). */
    struct {
        double last, interval;
        int useless;
        int64_t baseline;
    } safe;
    /* The ladder: whether the last one ran a full collection; the fallback
     * back-off (useless fallbacks in a row, soft ladders still to run
     * without one). */
    struct {
        int last_ran_full;
        int useless, skips_left;
    } fallback;
    int want; /* alignment: a soft collection waits for every rank */
    nd_pacer_counts counts;
} nd_pacer_state;

typedef enum nd_pacer_event_kind {
    ND_PACER_ALLOCATION = 0,    /* an allocation would pass the device's trigger */
    ND_PACER_SAFE_POINT = 1,    /* reset_grad()/backward(): a step's graph just became garbage */
    ND_PACER_OUT_OF_MEMORY = 2, /* an allocation failed even after the cache went back */
    ND_PACER_ALIGNED = 3        /* every rank agreed to collect now (needle.distributed) */
} nd_pacer_event_kind;

/* What the runner saw when the event came. */
typedef struct nd_pacer_event {
    nd_pacer_event_kind kind;
    double now;           /* seconds on a monotonic clock (> 0) */
    int64_t allocated;    /* the device's allocated bytes */
    int64_t requested;    /* the allocation's bytes (allocation and out-of-memory events) */
    int64_t budget;       /* nd_device_budget(): -1 for none */
    int gc_enabled;       /* Python's automatic collector is on (gc.isenabled()) */
    int aligned;          /* aligned collections are on */
    int scoped_available; /* the scoped collection can run at all */
} nd_pacer_event;

typedef enum nd_pacer_action {
    ND_PACER_NOTHING = 0,
    ND_PACER_WANT = 1,   /* alignment: recorded; every rank collects later */
    ND_PACER_SCOPED = 2, /* the scoped step alone (nothing asked, or fallbacks backed off) */
    ND_PACER_SCOPED_THEN_FULL = 3, /* then a full one if the scoped freed under the target */
    ND_PACER_FULL = 4              /* the full collection alone: the scoped one cannot run */
} nd_pacer_action;

typedef enum nd_pacer_why {
    ND_PACER_WHY_COLLECT = 0,       /* a collection or a want */
    ND_PACER_WHY_OFF = 1,           /* disabled, no budget, or a watermark at a safe point */
    ND_PACER_WHY_BELOW_TRIGGER = 2, /* allocated bytes have not passed the trigger */
    ND_PACER_WHY_DEFERRED = 3,      /* left to the next safe point (counted: deferred) */
    ND_PACER_WHY_GC_DISABLED = 4,   /* gc.disable() holds the soft path (counted: skipped) */
    ND_PACER_WHY_PACED = 5,         /* the time share since the last one (counted: skipped) */
    ND_PACER_WHY_COOLDOWN = 6       /* after useless collections (counted: skipped) */
} nd_pacer_why;

typedef struct nd_pacer_decision {
    nd_pacer_action action;
    nd_pacer_why why;
    /* The bytes the ladder asks for: a scoped step that frees less is
     * followed by a full one (soft path: the bytes above high water or the
     * fixed watermark, at least 0 for an aligned collection; out of memory:
     * the request). */
    int64_t target;
} nd_pacer_decision;

void nd_pacer_init(nd_pacer_state *state);

/* The trigger for the state's survivors: the allocated bytes past which an
 * allocation is an ND_PACER_ALLOCATION event (-1: none). The runner hands it
 * to nd_memory_set_trigger after every update. */
int64_t nd_pacer_trigger(const nd_gc_policy *policy, const nd_pacer_state *state, int64_t budget);

/* What a soft collection at `level` bytes asks its ladder for: the bytes
 * above the fixed watermark, else above high_water * budget (0 without
 * either; negative below it). */
int64_t nd_pacer_soft_target(const nd_gc_policy *policy, int64_t level, int64_t budget);

/* What the event calls for. Also updates what deciding implies: the safe
 * points' timing and baseline, the deferral and skip counts, a want. */
nd_pacer_decision nd_pacer_decide(const nd_gc_policy *policy, nd_pacer_state *state,
                                  const nd_pacer_event *event);

/* The scoped step of a ladder, as the runner saw it. */
typedef enum nd_scoped_status {
    ND_SCOPED_RAN = 0,
    ND_SCOPED_BUSY = 1,   /* refused: a collection is running (this is code it runs) */
    ND_SCOPED_FAILED = 2, /* refused otherwise: cannot run, or ran out of memory */
} nd_scoped_status;
typedef struct nd_scoped_report {
    nd_scoped_status status;
    int64_t examined, freed_bytes;
    double seconds;
} nd_scoped_report;

/* What follows the scoped step. */
typedef enum nd_pacer_step {
    ND_PACER_DONE = 0,
    ND_PACER_RUN_FULL = 1,     /* a full collection in place of the scoped one */
    ND_PACER_RUN_FALLBACK = 2, /* a full one after a scoped one that freed too little */
} nd_pacer_step;

/* After the scoped step of the ladder for `event` (target: the decision's):
 * counts it and says whether a full collection follows (the fallback's
 * back-off spends a skip here). */
nd_pacer_step nd_pacer_after_scoped(nd_pacer_state *state, const nd_pacer_event *event,
                                    int64_t target, const nd_scoped_report *scoped);
/* After the full collection `step` ran: `before` and `after` are the
 * allocated bytes around it (a useless fallback doubles the back-off). */
void nd_pacer_after_full(nd_pacer_state *state, nd_pacer_step step, int64_t before, int64_t after);
/* After the whole ladder for `event`: it ended at `end` with `after` bytes
 * allocated, and ran a full collection or not. */
void nd_pacer_after_collection(const nd_gc_policy *policy, nd_pacer_state *state,
                               const nd_pacer_event *event, int ran_full, double end,
                               int64_t after);

/* The live set is `allocated` bytes now (a new policy, limit or reset):
 * the trigger starts from it, cooldowns and the safe points' verdicts go. */
void nd_pacer_refresh(nd_pacer_state *state, int64_t allocated);
/* An all-reduce round passed with the wants as they were: a pending want
 * waited one more. Returns whether one is pending. */
int nd_pacer_want_round(nd_pacer_state *state);

#endif /* NEEDLE_GC_PACER_H */
