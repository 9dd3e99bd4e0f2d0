/* test_gc_pacer.c: the collection policy (csrc/gc_pacer.c; docs/design.md,
 * "The collection policy") as table rows: for each heuristic alone and for
 * their interactions, the inputs (policy, state, event, what a collection
 * did) and the decision and state that must follow. The pacer reads no
 * clock, so times are plain numbers. Also the one budget rule
 * (nd_device_budget) the allocator and the pacer share. Built and run by
 * tests/test_engine_c.py; prints failures, exits nonzero. */
#include "gc_pacer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

#define MiB ((int64_t)1 << 20)
#define BUDGET (1000 * MiB) /* high water (0.8): 800 MiB; 0.9 of it: 900 MiB */
#define NOW 100.0

/* Short names for the tables. */
#define A ND_PACER_ALLOCATION
#define SP ND_PACER_SAFE_POINT
#define OUT ND_PACER_OUT_OF_MEMORY
#define ALIGNED ND_PACER_ALIGNED
#define NOTHING ND_PACER_NOTHING
#define WANT ND_PACER_WANT
#define SCOPED ND_PACER_SCOPED
#define THEN_FULL ND_PACER_SCOPED_THEN_FULL
#define FULL ND_PACER_FULL
#define COLLECT ND_PACER_WHY_COLLECT
#define OFF ND_PACER_WHY_OFF
#define BELOW ND_PACER_WHY_BELOW_TRIGGER
#define DEFERRED ND_PACER_WHY_DEFERRED
#define GC_OFF ND_PACER_WHY_GC_DISABLED
#define PACED ND_PACER_WHY_PACED
#define COOLING ND_PACER_WHY_COOLDOWN
#define DONE ND_PACER_DONE
#define RUN_FULL ND_PACER_RUN_FULL
#define FALLBACK ND_PACER_RUN_FALLBACK

static const nd_gc_policy DEFAULTS = ND_GC_POLICY_DEFAULTS;
static const nd_gc_policy DISABLED = {0, 0.25, 64 * MiB, 0.8, 0.05, -1, -1.0};
static const nd_gc_policy MARK_300MIB = {1, 0.25, 64 * MiB, 0.8, 0.05, 300 * MiB, -1.0};
static const nd_gc_policy MARK_HALF = {1, 0.25, 64 * MiB, 0.8, 0.05, -1, 0.5};
static const nd_gc_policy STEEP = {1, 1.0, 0, 0.5, 0.05, -1, -1.0};

/* A row's failure names the row. */
#define CHECK_ROW(name, cond)                                                       \
    do {                                                                            \
        if (!(cond)) {                                                              \
            printf("FAIL row \"%s\" %s:%d: %s\n", name, __FILE__, __LINE__, #cond); \
            failures++;                                                             \
        }                                                                           \
    } while (0)

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (1.0 + fabs(b)); }

/* ------------------------------------------------------ trigger and target */

typedef struct trigger_row {
    const char *name;
    const nd_gc_policy *policy;
    int64_t survivors, budget;
    int64_t trigger;
    int64_t level, target; /* nd_pacer_soft_target at level */
} trigger_row;

static const trigger_row TRIGGERS[] = {
    {"min_growth wins over growth on a small live set", &DEFAULTS, 100 * MiB, BUDGET, 164 * MiB,
     900 * MiB, 100 * MiB},
    {"growth wins over min_growth on a large live set", &DEFAULTS, 400 * MiB, BUDGET, 500 * MiB,
     500 * MiB, -300 * MiB},
    {"capped at high_water * budget", &DEFAULTS, 700 * MiB, BUDGET, 800 * MiB, 800 * MiB, 0},
    {"no budget (a CPU without a limit): no trigger, nothing asked", &DEFAULTS, 100 * MiB, -1, -1,
     900 * MiB, 0},
    {"a zero limit is a budget: trigger 0", &DEFAULTS, 0, 0, 0, 10 * MiB, 10 * MiB},
    {"disabled: no trigger", &DISABLED, 100 * MiB, BUDGET, -1, 900 * MiB, 100 * MiB},
    {"a fixed watermark replaces the computed trigger", &MARK_300MIB, 700 * MiB, BUDGET, 300 * MiB,
     400 * MiB, 100 * MiB},
    {"a fixed watermark in bytes needs no budget", &MARK_300MIB, 100 * MiB, -1, 300 * MiB,
     400 * MiB, 100 * MiB},
    {"a fractional watermark is a share of the device's budget", &MARK_HALF, 100 * MiB, BUDGET,
     500 * MiB, 600 * MiB, 100 * MiB},
    {"a fractional watermark without a budget: none", &MARK_HALF, 100 * MiB, -1, -1, 600 * MiB, 0},
    {"growth 1, min_growth 0, high water 0.5", &STEEP, 100 * MiB, BUDGET, 200 * MiB, 600 * MiB,
     100 * MiB},
};

static void test_triggers(void) {
    for (size_t i = 0; i < sizeof TRIGGERS / sizeof TRIGGERS[0]; i++) {
        const trigger_row *r = &TRIGGERS[i];
        nd_pacer_state s;
        nd_pacer_init(&s);
        s.survivors = r->survivors;
        CHECK_ROW(r->name, nd_pacer_trigger(r->policy, &s, r->budget) == r->trigger);
        CHECK_ROW(r->name, nd_pacer_soft_target(r->policy, r->level, r->budget) == r->target);
    }
}

/* ------------------------------------------------------------ nd_pacer_decide */

/* What deciding may change in the state; everything else must stay. */
typedef struct decide_effect {
    int64_t deferred, skipped, aligned_wants; /* added to the counts */
    int want;
    double safe_last, safe_interval;
    int64_t safe_baseline;
} decide_effect;

typedef struct decide_row {
    const char *name;
    const nd_gc_policy *policy;
    nd_pacer_state state;
    nd_pacer_event event;
    nd_pacer_action action;
    nd_pacer_why why;
    int64_t target;
    decide_effect effect; /* safe_* of -2: as in the state */
} decide_row;

#define KEEP_SAFE .safe_last = -2, .safe_interval = -2, .safe_baseline = -2
/* A fresh state whose last collection left 100 MiB (trigger: 164 MiB). */
#define FRESH .survivors = 100 * MiB, .safe = {.baseline = -1}
/* Safe points coming every 0.4 s, the last 0.5 s ago: still steering. */
#define STEERING \
    .survivors = 100 * MiB, .safe = {.last = NOW - 0.5, .interval = 0.4, .baseline = -1}
/* A live set of 700 MiB (trigger: high water, 800 MiB). */
#define HIGH_LIVE_SET .survivors = 700 * MiB, .safe = {.baseline = -1}
/* No safe point seen yet. */
#define NO_BASE .safe = {.baseline = -1}
/* The last collection took 10 ms and ended 0.1 s ago: under 5% of the time
 * it must wait 0.19 s; under 50% (near the budget) 0.01 s. */
#define RECENT .pacing = {.last_end = NOW - 0.1, .last_duration = 0.01}

#define ALLOC(allocated_mib, requested_mib) \
    {ND_PACER_ALLOCATION, NOW, (allocated_mib) * MiB, (requested_mib) * MiB, BUDGET, 1, 0, 1}
#define SAFE(allocated_mib) {ND_PACER_SAFE_POINT, NOW, (allocated_mib) * MiB, 0, BUDGET, 1, 0, 1}
#define OOM(allocated_mib, requested_mib) \
    {ND_PACER_OUT_OF_MEMORY, NOW, (allocated_mib) * MiB, (requested_mib) * MiB, BUDGET, 1, 0, 1}

/* clang-format off */
static const decide_row DECISIONS[] = {
    /* The computed trigger. */
    {"allocation below the trigger",
     &DEFAULTS, {FRESH}, ALLOC(150, 14), NOTHING, BELOW, 0, {KEEP_SAFE}},
    {"allocation past the trigger, below high water: scoped alone",
     &DEFAULTS, {FRESH}, ALLOC(150, 15), SCOPED, COLLECT, -635 * MiB, {KEEP_SAFE}},
    {"allocation past high water: scoped, then full for the bytes above it",
     &DEFAULTS, {FRESH}, ALLOC(850, 10), THEN_FULL, COLLECT, 60 * MiB, {KEEP_SAFE}},
    {"no budget: never past a trigger",
     &DEFAULTS, {FRESH}, {A, NOW, 5000 * MiB, MiB, -1, 1, 0, 1}, NOTHING, BELOW, 0, {KEEP_SAFE}},
    /* The fixed watermark. */
    {"watermark: collect past it, ask for the bytes above it",
     &MARK_300MIB, {FRESH}, ALLOC(305, 5), THEN_FULL, COLLECT, 10 * MiB, {KEEP_SAFE}},
    {"watermark in bytes on a device without a budget",
     &MARK_300MIB, {FRESH}, {A, NOW, 305 * MiB, 5 * MiB, -1, 1, 0, 1}, THEN_FULL, COLLECT,
     10 * MiB, {KEEP_SAFE}},
    {"watermark: steering safe points do not defer it",
     &MARK_300MIB, {STEERING}, ALLOC(305, 5), THEN_FULL, COLLECT, 10 * MiB, {KEEP_SAFE}},
    /* enabled=False and gc.disable(). */
    {"disabled: no allocation-path collection",
     &DISABLED, {FRESH}, ALLOC(950, 10), NOTHING, OFF, 0, {KEEP_SAFE}},
    {"disabled: no out-of-memory collection either",
     &DISABLED, {FRESH}, OOM(950, 100), NOTHING, OFF, 0, {KEEP_SAFE}},
    {"disabled: no safe point",
     &DISABLED, {FRESH}, SAFE(950), NOTHING, OFF, 0, {KEEP_SAFE}},
    {"gc.disable() holds the soft path",
     &DEFAULTS, {FRESH}, {A, NOW, 850 * MiB, 10 * MiB, BUDGET, 0, 0, 1}, NOTHING, GC_OFF, 0,
     {.skipped = 1, KEEP_SAFE}},
    {"gc.disable() holds safe points",
     &DEFAULTS, {.survivors = 100 * MiB, .safe = {.baseline = 100 * MiB}},
     {SP, NOW, 300 * MiB, 0, BUDGET, 0, 0, 1}, NOTHING, GC_OFF, 0,
     {.skipped = 1, .safe_last = NOW, .safe_interval = 0, .safe_baseline = 100 * MiB}},
    {"gc.disable() does not hold the out-of-memory path",
     &DEFAULTS, {FRESH}, {OUT, NOW, 850 * MiB, 10 * MiB, BUDGET, 0, 0, 1}, THEN_FULL, COLLECT,
     10 * MiB, {KEEP_SAFE}},
    {"gc.disable() under alignment (alignment.py's doing) does not hold it",
     &DEFAULTS, {FRESH}, {A, NOW, 850 * MiB, 10 * MiB, BUDGET, 0, 1, 1}, WANT, COLLECT,
     60 * MiB, {.aligned_wants = 1, .want = 1, KEEP_SAFE}},
    /* The time share. */
    {"paced: 0.1 s after a 10 ms collection, under 5%",
     &DEFAULTS, {HIGH_LIVE_SET, .fallback = {.last_ran_full = 1}, RECENT}, ALLOC(870, 10),
     NOTHING, PACED, 0, {.skipped = 1, KEEP_SAFE}},
    {"near the budget the share is 50%: not paced",
     &DEFAULTS, {HIGH_LIVE_SET, .fallback = {.last_ran_full = 1}, RECENT}, ALLOC(895, 10),
     THEN_FULL, COLLECT, 105 * MiB, {KEEP_SAFE}},
    {"the first ladder that would run a full collection is not paced",
     &DEFAULTS, {HIGH_LIVE_SET, RECENT}, ALLOC(870, 10), THEN_FULL, COLLECT, 80 * MiB,
     {KEEP_SAFE}},
    {"...a ladder that asks nothing above high water is paced",
     &DEFAULTS, {FRESH, RECENT}, ALLOC(300, 10), NOTHING, PACED, 0, {.skipped = 1, KEEP_SAFE}},
    {"...and so is one while the fallback is backed off",
     &DEFAULTS, {HIGH_LIVE_SET, .fallback = {.skips_left = 3}, RECENT}, ALLOC(870, 10),
     NOTHING, PACED, 0, {.skipped = 1, KEEP_SAFE}},
    {"backed off and unpaced: the scoped step alone, target kept",
     &DEFAULTS, {HIGH_LIVE_SET, .fallback = {.skips_left = 3}}, ALLOC(870, 10), SCOPED,
     COLLECT, 80 * MiB, {KEEP_SAFE}},
    /* The useless-collection cooldown. */
    {"cooldown after useless collections",
     &DEFAULTS, {FRESH, .pacing = {.cooldown_seconds = 0.5, .cooldown_until = NOW + 0.2}},
     ALLOC(300, 10), NOTHING, COOLING, 0, {.skipped = 1, KEEP_SAFE}},
    {"the cooldown is over",
     &DEFAULTS, {FRESH, .pacing = {.cooldown_seconds = 0.5, .cooldown_until = NOW - 0.01}},
     ALLOC(300, 10), SCOPED, COLLECT, -490 * MiB, {KEEP_SAFE}},
    /* Deferral to steering safe points. */
    {"steering safe points: the allocation path defers",
     &DEFAULTS, {STEERING}, ALLOC(190, 10), NOTHING, DEFERRED, 0, {.deferred = 1, KEEP_SAFE}},
    {"...up to high water",
     &DEFAULTS, {STEERING}, ALLOC(795, 10), THEN_FULL, COLLECT, 5 * MiB, {KEEP_SAFE}},
    {"...while the next one is not overdue (twice the interval)",
     &DEFAULTS,
     {.survivors = 100 * MiB, .safe = {.last = NOW - 0.82, .interval = 0.4, .baseline = -1}},
     ALLOC(190, 10), SCOPED, COLLECT, -600 * MiB, {KEEP_SAFE}},
    {"...and the last collection at one was not useless",
     &DEFAULTS,
     {.survivors = 100 * MiB,
      .safe = {.last = NOW - 0.5, .interval = 0.4, .useless = 1, .baseline = -1}},
     ALLOC(190, 10), SCOPED, COLLECT, -600 * MiB, {KEEP_SAFE}},
    {"no budget: nothing to defer to",
     &DEFAULTS, {STEERING}, {A, NOW, 190 * MiB, 10 * MiB, -1, 1, 0, 1}, NOTHING, BELOW, 0,
     {KEEP_SAFE}},
    /* Safe points. */
    {"first safe point: the baseline starts from the survivors",
     &DEFAULTS, {FRESH}, SAFE(150), NOTHING, BELOW, 0,
     {.safe_last = NOW, .safe_interval = 0, .safe_baseline = 100 * MiB}},
    {"the baseline follows the lowest level seen",
     &DEFAULTS, {.survivors = 300 * MiB, .safe = {.baseline = -1}}, SAFE(200), NOTHING, BELOW,
     0, {.safe_last = NOW, .safe_interval = 0, .safe_baseline = 200 * MiB}},
    {"the baseline, not the allocation path's survivors, sets the trigger",
     &DEFAULTS, {.survivors = 400 * MiB, .safe = {.baseline = 100 * MiB}}, SAFE(300), SCOPED,
     COLLECT, -500 * MiB, {.safe_last = NOW, .safe_interval = 0, .safe_baseline = 100 * MiB}},
    {"the interval follows the longest recent gap",
     &DEFAULTS,
     {.survivors = 100 * MiB, .safe = {.last = NOW - 1.0, .interval = 0.5, .baseline = 100 * MiB}},
     SAFE(120), NOTHING, BELOW, 0,
     {.safe_last = NOW, .safe_interval = 1.0, .safe_baseline = 100 * MiB}},
    {"...and decays by 10% over a short one",
     &DEFAULTS,
     {.survivors = 100 * MiB, .safe = {.last = NOW - 0.2, .interval = 1.0, .baseline = 100 * MiB}},
     SAFE(120), NOTHING, BELOW, 0,
     {.safe_last = NOW, .safe_interval = 0.9, .safe_baseline = 100 * MiB}},
    {"safe points do nothing under a fixed watermark",
     &MARK_300MIB, {FRESH}, SAFE(900), NOTHING, OFF, 0, {KEEP_SAFE}},
    {"safe points do nothing without a budget",
     &DEFAULTS, {FRESH}, {SP, NOW, 900 * MiB, 0, -1, 1, 0, 1}, NOTHING, OFF, 0, {KEEP_SAFE}},
    {"a safe point ignores the cooldown",
     &DEFAULTS,
     {.survivors = 100 * MiB, .safe = {.baseline = 100 * MiB},
      .pacing = {.cooldown_seconds = 1.0, .cooldown_until = NOW + 0.9}},
     SAFE(300), SCOPED, COLLECT, -500 * MiB,
     {.safe_last = NOW, .safe_interval = 0, .safe_baseline = 100 * MiB}},
    {"a safe point is paced after a useful collection",
     &DEFAULTS, {.survivors = 100 * MiB, .safe = {.baseline = 100 * MiB}, RECENT}, SAFE(300),
     NOTHING, PACED, 0,
     {.skipped = 1, .safe_last = NOW, .safe_interval = 0, .safe_baseline = 100 * MiB}},
    {"...not after a useless one",
     &DEFAULTS,
     {.survivors = 100 * MiB, .safe = {.baseline = 100 * MiB},
      .pacing = {.last_end = NOW - 0.1, .last_duration = 0.01, .last_freed_little = 1}},
     SAFE(300), SCOPED, COLLECT, -500 * MiB,
     {.safe_last = NOW, .safe_interval = 0, .safe_baseline = 100 * MiB}},
    /* The out-of-memory path. */
    {"out of memory: the ladder asks for the request, unpaced",
     &DEFAULTS, {FRESH, RECENT, .fallback = {.last_ran_full = 1}}, OOM(100, 30), THEN_FULL,
     COLLECT, 30 * MiB, {KEEP_SAFE}},
    {"out of memory: the back-off does not hold the fallback",
     &DEFAULTS, {FRESH, .fallback = {.skips_left = 8}}, OOM(100, 30), THEN_FULL, COLLECT,
     30 * MiB, {KEEP_SAFE}},
    {"out of memory under alignment stays local",
     &DEFAULTS, {FRESH}, {OUT, NOW, 100 * MiB, 30 * MiB, BUDGET, 1, 1, 1}, THEN_FULL, COLLECT,
     30 * MiB, {KEEP_SAFE}},
    {"out of memory for nothing: scoped alone",
     &DEFAULTS, {FRESH}, OOM(100, 0), SCOPED, COLLECT, 0, {KEEP_SAFE}},
    {"no scoped collection (free-threaded build): full alone",
     &DEFAULTS, {FRESH}, {OUT, NOW, 100 * MiB, 30 * MiB, BUDGET, 1, 0, 0}, FULL, COLLECT,
     30 * MiB, {KEEP_SAFE}},
    {"no scoped collection on the soft path: full alone",
     &DEFAULTS, {FRESH}, {A, NOW, 300 * MiB, 10 * MiB, BUDGET, 1, 0, 0}, FULL, COLLECT,
     -490 * MiB, {KEEP_SAFE}},
    /* Alignment. */
    {"aligned: a soft collection becomes a want",
     &DEFAULTS, {FRESH}, {A, NOW, 300 * MiB, 10 * MiB, BUDGET, 1, 1, 1}, WANT, COLLECT,
     -490 * MiB, {.aligned_wants = 1, .want = 1, KEEP_SAFE}},
    {"aligned: a pending want is counted once",
     &DEFAULTS, {FRESH, .want = 1}, {A, NOW, 300 * MiB, 10 * MiB, BUDGET, 1, 1, 1}, WANT,
     COLLECT, -490 * MiB, {.want = 1, KEEP_SAFE}},
    {"aligned: a paced collection is no want",
     &DEFAULTS, {FRESH, RECENT}, {A, NOW, 300 * MiB, 10 * MiB, BUDGET, 1, 1, 1}, NOTHING, PACED,
     0, {.skipped = 1, KEEP_SAFE}},
    {"aligned: a safe point's collection becomes a want",
     &DEFAULTS, {.survivors = 100 * MiB, .safe = {.baseline = 100 * MiB}},
     {SP, NOW, 300 * MiB, 0, BUDGET, 1, 1, 1}, WANT, COLLECT, -500 * MiB,
     {.aligned_wants = 1, .want = 1, .safe_last = NOW, .safe_interval = 0,
      .safe_baseline = 100 * MiB}},
    {"the agreed collection: unpaced, cooldown ignored, nothing asked below high water",
     &DEFAULTS,
     {FRESH, .pacing = {.last_end = NOW - 0.01, .last_duration = 0.01, .cooldown_until = NOW + 1}},
     {ALIGNED, NOW, 300 * MiB, 0, BUDGET, 1, 1, 1}, SCOPED, COLLECT, 0, {KEEP_SAFE}},
    {"the agreed collection above high water falls back",
     &DEFAULTS, {FRESH}, {ALIGNED, NOW, 850 * MiB, 0, BUDGET, 1, 1, 1}, THEN_FULL, COLLECT,
     50 * MiB, {KEEP_SAFE}},
    {"the agreed collection keeps the back-off",
     &DEFAULTS, {FRESH, .fallback = {.skips_left = 2}},
     {ALIGNED, NOW, 850 * MiB, 0, BUDGET, 1, 1, 1}, SCOPED, COLLECT, 50 * MiB, {KEEP_SAFE}},
};
/* clang-format on */

/* Whether two states are the same, field by field (no padding compared). */
static int same_state(const nd_pacer_state *a, const nd_pacer_state *b) {
    const nd_pacer_counts *x = &a->counts, *y = &b->counts;
    return a->survivors == b->survivors && a->pacing.last_end == b->pacing.last_end &&
           a->pacing.last_duration == b->pacing.last_duration &&
           a->pacing.last_freed_little == b->pacing.last_freed_little &&
           near(a->pacing.cooldown_seconds, b->pacing.cooldown_seconds) &&
           near(a->pacing.cooldown_until, b->pacing.cooldown_until) &&
           a->safe.last == b->safe.last && near(a->safe.interval, b->safe.interval) &&
           a->safe.useless == b->safe.useless && a->safe.baseline == b->safe.baseline &&
           a->fallback.last_ran_full == b->fallback.last_ran_full &&
           a->fallback.useless == b->fallback.useless &&
           a->fallback.skips_left == b->fallback.skips_left && a->want == b->want &&
           x->pressure_collections == y->pressure_collections &&
           x->safe_point_collections == y->safe_point_collections &&
           x->oom_collections == y->oom_collections && x->skipped == y->skipped &&
           x->deferred == y->deferred && near(x->seconds, y->seconds) &&
           x->freed_bytes == y->freed_bytes && x->scoped_collections == y->scoped_collections &&
           x->scoped_examined == y->scoped_examined &&
           x->scoped_freed_bytes == y->scoped_freed_bytes &&
           near(x->scoped_seconds, y->scoped_seconds) &&
           x->full_collections == y->full_collections && x->full_fallbacks == y->full_fallbacks &&
           x->fallbacks_skipped == y->fallbacks_skipped && x->aligned_wants == y->aligned_wants &&
           x->aligned_rounds_waited == y->aligned_rounds_waited &&
           x->aligned_collections == y->aligned_collections;
}

static void test_decisions(void) {
    for (size_t i = 0; i < sizeof DECISIONS / sizeof DECISIONS[0]; i++) {
        const decide_row *r = &DECISIONS[i];
        nd_pacer_state s = r->state, want = r->state;
        nd_pacer_decision d = nd_pacer_decide(r->policy, &s, &r->event);
        CHECK_ROW(r->name, d.action == r->action);
        CHECK_ROW(r->name, d.why == r->why);
        CHECK_ROW(r->name, d.target == r->target);
        want.counts.deferred += r->effect.deferred;
        want.counts.skipped += r->effect.skipped;
        want.counts.aligned_wants += r->effect.aligned_wants;
        want.want = r->effect.want;
        if (r->effect.safe_last != -2) want.safe.last = r->effect.safe_last;
        if (r->effect.safe_interval != -2) want.safe.interval = r->effect.safe_interval;
        if (r->effect.safe_baseline != -2) want.safe.baseline = r->effect.safe_baseline;
        CHECK_ROW(r->name, same_state(&s, &want));
    }
}

/* ------------------------------------------------------------ the ladder */

typedef struct ladder_row {
    const char *name;
    nd_pacer_event_kind kind;
    int useless, skips_left; /* the back-off before */
    int64_t target;
    nd_scoped_report scoped;
    nd_pacer_step step;
    int64_t full_before, full_after; /* when a full collection ran */
    /* after */
    int useless_after, skips_after;
    int64_t scoped_collections, full_collections, full_fallbacks, fallbacks_skipped;
} ladder_row;

#define RAN(freed_mib) {ND_SCOPED_RAN, 500, (freed_mib) * MiB, 0.002}

/* clang-format off */
static const ladder_row LADDERS[] = {
    /* name, kind, useless and skips before, target, scoped step, next step, full collection's
     * before and after; useless and skips after, scoped, full, fallbacks, skipped fallbacks */
    {"a scoped step that frees the target ends the ladder",
     A, 0, 0, 60 * MiB, RAN(60), DONE, 0, 0, 0, 0, 1, 0, 0, 0},
    {"nothing asked (below high water): scoped alone",
     SP, 0, 0, -200 * MiB, RAN(0), DONE, 0, 0, 0, 0, 1, 0, 0, 0},
    {"freed too little: the full fallback",
     A, 0, 0, 60 * MiB, RAN(10), FALLBACK, 900 * MiB, 700 * MiB, 0, 0, 1, 1, 1, 0},
    {"a refused scoped step (a collection is running): nothing more",
     OUT, 0, 0, 60 * MiB, {ND_SCOPED_BUSY, 0, 0, 0.0}, DONE, 0, 0, 0, 0, 0, 0, 0, 0},
    {"a scoped step that cannot run: full in its place, no back-off change",
     A, 2, 1, 60 * MiB, {ND_SCOPED_FAILED, 0, 0, 0.0}, RUN_FULL, 900 * MiB, 899 * MiB,
     2, 1, 0, 1, 0, 0},
    {"a useless fallback starts the back-off: 1 ladder",
     A, 0, 0, 60 * MiB, RAN(0), FALLBACK, 900 * MiB, 899 * MiB, 1, 1, 1, 1, 1, 0},
    {"a second useless one doubles it: 2",
     SP, 1, 0, 60 * MiB, RAN(0), FALLBACK, 900 * MiB, 899 * MiB, 2, 2, 1, 1, 1, 0},
    {"up to 64 ladders",
     A, 7, 0, 60 * MiB, RAN(0), FALLBACK, 900 * MiB, 899 * MiB, 8, 64, 1, 1, 1, 0},
    {"the count of useless ones stops at 30",
     A, 30, 0, 60 * MiB, RAN(0), FALLBACK, 900 * MiB, 899 * MiB, 30, 64, 1, 1, 1, 0},
    {"a useful fallback (1% freed) ends it",
     A, 5, 0, 60 * MiB, RAN(0), FALLBACK, 900 * MiB, 891 * MiB, 0, 0, 1, 1, 1, 0},
    {"backed off: the fallback is skipped",
     A, 3, 4, 60 * MiB, RAN(0), DONE, 0, 0, 3, 3, 1, 0, 0, 1},
    {"backed off, at an aligned collection too",
     ALIGNED, 3, 4, 60 * MiB, RAN(0), DONE, 0, 0, 3, 3, 1, 0, 0, 1},
    {"backed off, but the scoped step freed enough: no skip spent",
     A, 3, 4, 60 * MiB, RAN(70), DONE, 0, 0, 3, 4, 1, 0, 0, 0},
    {"out of memory always falls back, and a useless one counts",
     OUT, 3, 4, 60 * MiB, RAN(0), FALLBACK, 900 * MiB, 899 * MiB, 4, 8, 1, 1, 1, 0},
};
/* clang-format on */

static void test_ladders(void) {
    for (size_t i = 0; i < sizeof LADDERS / sizeof LADDERS[0]; i++) {
        const ladder_row *r = &LADDERS[i];
        nd_pacer_state s;
        nd_pacer_init(&s);
        s.fallback.useless = r->useless;
        s.fallback.skips_left = r->skips_left;
        nd_pacer_event e = {r->kind, NOW, 900 * MiB, 0, BUDGET, 1, 0, 1};
        nd_pacer_step step = nd_pacer_after_scoped(&s, &e, r->target, &r->scoped);
        CHECK_ROW(r->name, step == r->step);
        if (step != ND_PACER_DONE) nd_pacer_after_full(&s, step, r->full_before, r->full_after);
        CHECK_ROW(r->name, s.fallback.useless == r->useless_after);
        CHECK_ROW(r->name, s.fallback.skips_left == r->skips_after);
        CHECK_ROW(r->name, s.counts.scoped_collections == r->scoped_collections);
        CHECK_ROW(r->name, s.counts.full_collections == r->full_collections);
        CHECK_ROW(r->name, s.counts.full_fallbacks == r->full_fallbacks);
        CHECK_ROW(r->name, s.counts.fallbacks_skipped == r->fallbacks_skipped);
        int ran = r->scoped.status == ND_SCOPED_RAN;
        CHECK_ROW(r->name, s.counts.scoped_examined == (ran ? 500 : 0));
        CHECK_ROW(r->name, s.counts.scoped_freed_bytes == (ran ? r->scoped.freed_bytes : 0));
        CHECK_ROW(r->name, near(s.counts.scoped_seconds, ran ? 0.002 : 0.0));
    }
}

/* ------------------------------------------- nd_pacer_after_collection */

typedef struct after_row {
    const char *name;
    nd_pacer_state state;
    nd_pacer_event_kind kind;
    int64_t before, after;
    double seconds; /* the collection's */
    int ran_full;
    /* after */
    int freed_little;
    double cooldown; /* cooldown_until = end + cooldown when > 0, else 0 */
    int safe_useless;
    int64_t safe_baseline;
    int64_t pressure, safe_point, oom, aligned; /* collections counted */
} after_row;

/* clang-format off */
static const after_row AFTERS[] = {
    /* name, state before, kind, allocated before and after, seconds, ran a full one; freed
     * little, cooldown, safe points useless, their baseline, collections counted (pressure,
     * safe point, out of memory, aligned) */
    {"a useful collection: no cooldown, survivors, counts",
     {NO_BASE}, A, 500 * MiB, 100 * MiB, 0.01, 0, 0, 0.0, 0, -1, 1, 0, 0, 0},
    {"a useless one (under 1% freed) starts the cooldown at d/f - d",
     {NO_BASE}, A, 500 * MiB, 496 * MiB, 0.01, 0, 1, 0.19, 0, -1, 1, 0, 0, 0},
    {"...of at least a millisecond",
     {NO_BASE}, A, 500 * MiB, 500 * MiB, 1e-6, 0, 1, 0.001, 0, -1, 1, 0, 0, 0},
    {"the next useless one doubles it",
     {NO_BASE, .pacing = {.cooldown_seconds = 0.19}}, A, 500 * MiB, 500 * MiB, 0.01, 0,
     1, 0.38, 0, -1, 1, 0, 0, 0},
    {"up to a second",
     {NO_BASE, .pacing = {.cooldown_seconds = 0.76}}, A, 500 * MiB, 500 * MiB, 0.01, 0,
     1, 1.0, 0, -1, 1, 0, 0, 0},
    {"a useful one ends it",
     {NO_BASE, .pacing = {.cooldown_seconds = 0.76, .cooldown_until = 1e9}}, A, 500 * MiB,
     400 * MiB, 0.01, 0, 0, 0.0, 0, -1, 1, 0, 0, 0},
    {"out of memory: no cooldown, even when useless; it ends one",
     {NO_BASE, .pacing = {.cooldown_seconds = 0.76, .cooldown_until = 1e9}}, OUT, 500 * MiB,
     500 * MiB, 0.01, 1, 1, 0.0, 0, -1, 0, 0, 1, 0},
    {"a useful allocation-path collection re-arms the safe points",
     {.safe = {.useless = 1, .baseline = 50 * MiB}}, A, 500 * MiB, 100 * MiB, 0.01, 0,
     0, 0.0, 0, 50 * MiB, 1, 0, 0, 0},
    {"a useless one does not",
     {.safe = {.useless = 1, .baseline = 50 * MiB}}, A, 500 * MiB, 500 * MiB, 0.01, 0,
     1, 0.19, 1, 50 * MiB, 1, 0, 0, 0},
    {"a useless safe point disarms them; its level is the new baseline",
     {.safe = {.baseline = 50 * MiB}}, SP, 300 * MiB, 299 * MiB, 0.01, 0,
     1, 0.19, 1, 299 * MiB, 1, 1, 0, 0},
    {"a useful safe point arms them",
     {.safe = {.useless = 1, .baseline = 50 * MiB}}, SP, 300 * MiB, 120 * MiB, 0.01, 0,
     0, 0.0, 0, 120 * MiB, 1, 1, 0, 0},
    {"an aligned collection is a soft one, counted as aligned",
     {NO_BASE}, ALIGNED, 500 * MiB, 100 * MiB, 0.01, 1, 0, 0.0, 0, -1, 1, 0, 0, 1},
    {"growth during a collection (a finalizer allocated) frees nothing",
     {NO_BASE}, A, 500 * MiB, 510 * MiB, 0.01, 0, 1, 0.19, 0, -1, 1, 0, 0, 0},
};
/* clang-format on */

static void test_afters(void) {
    for (size_t i = 0; i < sizeof AFTERS / sizeof AFTERS[0]; i++) {
        const after_row *r = &AFTERS[i];
        nd_pacer_state s = r->state;
        nd_pacer_event e = {r->kind, NOW, r->before, 0, BUDGET, 1, 0, 1};
        double end = NOW + r->seconds;
        nd_pacer_after_collection(&DEFAULTS, &s, &e, r->ran_full, end, r->after);
        int64_t freed = r->before > r->after ? r->before - r->after : 0;
        CHECK_ROW(r->name, s.survivors == r->after);
        CHECK_ROW(r->name, s.pacing.last_freed_little == r->freed_little);
        CHECK_ROW(r->name, near(s.pacing.cooldown_seconds, r->cooldown));
        CHECK_ROW(r->name, near(s.pacing.cooldown_until, r->cooldown > 0 ? end + r->cooldown : 0));
        CHECK_ROW(r->name, s.pacing.last_end == end && near(s.pacing.last_duration, r->seconds));
        CHECK_ROW(r->name, s.fallback.last_ran_full == r->ran_full);
        CHECK_ROW(r->name, s.safe.useless == r->safe_useless);
        CHECK_ROW(r->name, s.safe.baseline == r->safe_baseline);
        CHECK_ROW(r->name, s.counts.pressure_collections == r->pressure);
        CHECK_ROW(r->name, s.counts.safe_point_collections == r->safe_point);
        CHECK_ROW(r->name, s.counts.oom_collections == r->oom);
        CHECK_ROW(r->name, s.counts.aligned_collections == r->aligned);
        CHECK_ROW(r->name, s.counts.freed_bytes == freed);
        CHECK_ROW(r->name, near(s.counts.seconds, r->seconds));
    }
}

/* ------------------------------------------------ interactions over time */

/* One step of a run: an event, and when the pacer collects, what the
 * scoped step and the full one free; the decision each step must get. */
typedef struct step_row {
    nd_pacer_event_kind kind;
    double at;
    int64_t allocated_mib, requested_mib;
    int64_t scoped_freed_mib, full_freed_mib;
    nd_pacer_action action;
    nd_pacer_why why;
} step_row;

/* Runs steps on s as the runner would (each collection takes 10 ms). */
static void run_steps(const char *name, const nd_gc_policy *p, nd_pacer_state *s,
                      const step_row *steps, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const step_row *t = &steps[i];
        nd_pacer_event e = {
            t->kind, t->at, t->allocated_mib * MiB, t->requested_mib * MiB, BUDGET, 1, 0, 1};
        nd_pacer_decision d = nd_pacer_decide(p, s, &e);
        if (d.action != t->action || d.why != t->why) {
            printf("FAIL row \"%s\" step %zu: action %d why %d, expected %d %d\n", name, i,
                   (int)d.action, (int)d.why, (int)t->action, (int)t->why);
            failures++;
        }
        if (d.action < ND_PACER_SCOPED) continue;
        int64_t level = e.allocated;
        nd_scoped_report scoped = {ND_SCOPED_RAN, 100, t->scoped_freed_mib * MiB, 0.001};
        nd_pacer_step step = nd_pacer_after_scoped(s, &e, d.target, &scoped);
        level -= scoped.freed_bytes;
        if (step != ND_PACER_DONE) {
            nd_pacer_after_full(s, step, level, level - t->full_freed_mib * MiB);
            level -= t->full_freed_mib * MiB;
        }
        nd_pacer_after_collection(p, s, &e, step != ND_PACER_DONE, t->at + 0.01, level);
    }
}

/* A live set held above high water (850 MiB, nothing to free), allocations 10
 * s apart (no pacing, no cooldown): a useless full fallback, then 1 scoped-only
 * ladder, a fallback, 2 scoped-only; an out-of-memory collection falls back
 * regardless, and its useless fallback doubles the back-off to 4; a useful
 * fallback ends it. */
static const step_row BACKOFF[] = {
    {A, 10, 850, 1, 0, 0, THEN_FULL, COLLECT}, /* useless: back off 1 */
    {A, 20, 850, 1, 0, 0, SCOPED, COLLECT},
    {A, 30, 850, 1, 0, 0, THEN_FULL, COLLECT}, /* useless: back off 2 */
    {A, 40, 850, 1, 0, 0, SCOPED, COLLECT},
    {OUT, 45, 850, 200, 0, 0, THEN_FULL, COLLECT}, /* useless: back off 4 */
    {A, 50, 850, 1, 0, 0, SCOPED, COLLECT},
    {A, 60, 850, 1, 0, 0, SCOPED, COLLECT},
    {A, 70, 850, 1, 0, 0, SCOPED, COLLECT},
    {A, 80, 850, 1, 0, 0, SCOPED, COLLECT},
    {A, 90, 850, 1, 0, 100, THEN_FULL, COLLECT}, /* useful: back-off ends */
    {A, 100, 850, 1, 0, 0, THEN_FULL, COLLECT},
};

/* Useless collections 10 ms long: cooldown 0.19 s (the pacing's wait too),
 * 0.38, 0.76, then 1 s. An allocation inside each cooldown is skipped, one
 * after it collects; a safe point is not held by it. */
static const step_row COOLDOWN[] = {
    {A, 10.00, 300, 100, 0, 0, SCOPED, COLLECT}, /* useless: 0.19 s */
    {A, 10.15, 300, 100, 0, 0, NOTHING, PACED},
    {A, 10.25, 300, 100, 0, 0, SCOPED, COLLECT}, /* useless: 0.38 s */
    {A, 10.60, 300, 100, 0, 0, NOTHING, COOLING},
    {A, 10.70, 300, 100, 0, 0, SCOPED, COLLECT}, /* useless: 0.76 s */
    {A, 11.40, 300, 100, 0, 0, NOTHING, COOLING},
    {A, 11.50, 300, 100, 0, 0, SCOPED, COLLECT}, /* useless: 1 s */
    {A, 12.45, 300, 100, 0, 0, NOTHING, COOLING},
    {SP, 12.47, 300, 0, 150, 0, SCOPED, COLLECT}, /* useful: cooldown over */
    {A, 12.48, 150, 10, 0, 0, NOTHING, BELOW},
};

/* A training loop: safe points every second (reset_grad, then backward 0.3 s
 * later), 200 MiB of graph garbage at each reset_grad. The first safe points
 * see no garbage (useless: the allocation path is not deferred); the
 * allocation path frees a graph (re-arms them); from then on the forward
 * pass defers to them and each reset_grad collects. When backward stops
 * (evaluation), deferral ends after twice the interval. */
static const step_row TRAINING[] = {
    {SP, 1.0, 150, 0, 0, 0, NOTHING, BELOW},
    {SP, 1.3, 180, 0, 0, 0, SCOPED, COLLECT},   /* no graph yet: useless */
    {A, 1.7, 250, 10, 200, 0, SCOPED, COLLECT}, /* not deferred; useful: re-arms */
    {SP, 2.0, 100, 0, 0, 0, NOTHING, BELOW},
    {SP, 2.3, 120, 0, 0, 0, NOTHING, BELOW},
    {A, 2.7, 330, 10, 0, 0, NOTHING, DEFERRED}, /* a forward pass */
    {SP, 3.0, 350, 0, 200, 0, SCOPED, COLLECT}, /* reset_grad */
    {SP, 3.3, 160, 0, 0, 0, NOTHING, BELOW},
    {A, 3.7, 330, 10, 0, 0, NOTHING, DEFERRED},
    {A, 3.8, 790, 10, 0, 0, NOTHING, DEFERRED},  /* up to high water */
    {A, 3.9, 800, 10, 0, 0, THEN_FULL, COLLECT}, /* past it */
    {SP, 4.0, 350, 0, 200, 0, SCOPED, COLLECT},
    {A, 4.5, 330, 10, 0, 0, NOTHING, DEFERRED}, /* evaluation... */
    {A, 6.1, 330, 10, 200, 0, SCOPED, COLLECT}, /* safe points overdue: collects */
};

/* gc.disable() and a policy switched off, over a run: the soft path waits,
 * the out-of-memory path collects, a disabled policy does neither. */
static void test_gc_disabled_run(void) {
    nd_pacer_state s;
    nd_pacer_init(&s);
    nd_pacer_refresh(&s, 100 * MiB);
    nd_pacer_event soft = {A, 10.0, 850 * MiB, MiB, BUDGET, 0, 0, 1};
    nd_pacer_event oom = {OUT, 10.1, 850 * MiB, 200 * MiB, BUDGET, 0, 0, 1};
    for (int i = 0; i < 3; i++) {
        soft.now += 1.0;
        CHECK(nd_pacer_decide(&DEFAULTS, &s, &soft).why == ND_PACER_WHY_GC_DISABLED);
    }
    CHECK(s.counts.skipped == 3);
    CHECK(nd_pacer_decide(&DEFAULTS, &s, &oom).action == ND_PACER_SCOPED_THEN_FULL);
    nd_pacer_state off = s;
    CHECK(nd_pacer_decide(&DISABLED, &off, &oom).action == ND_PACER_NOTHING);
    CHECK(nd_pacer_decide(&DISABLED, &off, &soft).action == ND_PACER_NOTHING);
    CHECK(same_state(&off, &s));
    CHECK(nd_pacer_trigger(&DISABLED, &s, BUDGET) == -1);
}

static void test_runs(void) {
    nd_pacer_state s;
    nd_pacer_init(&s);
    nd_pacer_refresh(&s, 100 * MiB);
    run_steps("back-off over a run", &DEFAULTS, &s, BACKOFF, sizeof BACKOFF / sizeof BACKOFF[0]);
    CHECK(s.counts.full_fallbacks == 5 && s.counts.fallbacks_skipped == 6);
    CHECK(s.counts.full_collections == 5 && s.fallback.useless == 1);
    CHECK(s.counts.oom_collections == 1 && s.counts.pressure_collections == 10);

    nd_pacer_init(&s);
    nd_pacer_refresh(&s, 100 * MiB);
    s.safe.baseline = 100 * MiB;
    run_steps("cooldown over a run", &DEFAULTS, &s, COOLDOWN, sizeof COOLDOWN / sizeof COOLDOWN[0]);
    CHECK(s.counts.skipped == 4 && s.pacing.cooldown_seconds == 0.0);
    CHECK(s.counts.safe_point_collections == 1 && s.survivors == 150 * MiB);

    nd_pacer_init(&s);
    nd_pacer_refresh(&s, 100 * MiB);
    run_steps("safe points steering a training loop", &DEFAULTS, &s, TRAINING,
              sizeof TRAINING / sizeof TRAINING[0]);
    CHECK(s.counts.deferred == 4 && s.counts.safe_point_collections == 3);
    CHECK(s.counts.pressure_collections == 6 && s.counts.full_fallbacks == 1);

    test_gc_disabled_run();
}

/* ------------------------------------------------ refresh, wants, policy */

static void test_refresh_and_wants(void) {
    nd_pacer_state s;
    nd_pacer_init(&s);
    s.survivors = 700 * MiB;
    s.pacing.cooldown_seconds = 0.5;
    s.pacing.cooldown_until = 1e9;
    s.safe.useless = 1;
    s.safe.baseline = 600 * MiB;
    s.counts.pressure_collections = 7;
    nd_pacer_refresh(&s, 120 * MiB);
    CHECK(s.survivors == 120 * MiB && s.pacing.cooldown_seconds == 0.0);
    CHECK(s.pacing.cooldown_until == 0.0 && s.safe.useless == 0 && s.safe.baseline == -1);
    CHECK(s.counts.pressure_collections == 7); /* the counters stay */
    CHECK(nd_pacer_trigger(&DEFAULTS, &s, BUDGET) == 184 * MiB);

    CHECK(nd_pacer_want_round(&s) == 0 && s.counts.aligned_rounds_waited == 0);
    s.want = 1;
    CHECK(nd_pacer_want_round(&s) == 1 && nd_pacer_want_round(&s) == 1);
    CHECK(s.counts.aligned_rounds_waited == 2);
}

static void test_policy_checks(void) {
    CHECK(nd_gc_policy_invalid(&DEFAULTS) == NULL);
    CHECK(nd_gc_policy_invalid(&MARK_HALF) == NULL);
    nd_gc_policy bad[] = {
        {1, -0.1, 0, 0.8, 0.05, -1, -1.0},     {1, NAN, 0, 0.8, 0.05, -1, -1.0},
        {1, INFINITY, 0, 0.8, 0.05, -1, -1.0}, {1, 0.25, -1, 0.8, 0.05, -1, -1.0},
        {1, 0.25, 0, 0.0, 0.05, -1, -1.0},     {1, 0.25, 0, 1.5, 0.05, -1, -1.0},
        {1, 0.25, 0, NAN, 0.05, -1, -1.0},     {1, 0.25, 0, 0.8, 0.0, -1, -1.0},
        {1, 0.25, 0, 0.8, 0.6, -1, -1.0},      {1, 0.25, 0, 0.8, NAN, -1, -1.0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *why = nd_gc_policy_invalid(&bad[i]);
        CHECK(why != NULL && strstr(why, "gc policy") != NULL);
    }
    nd_gc_policy edge = {1, 0.0, 0, 1.0, 0.5, -1, -1.0};
    CHECK(nd_gc_policy_invalid(&edge) == NULL);
}

/* The one budget rule, on the engine's CPU: its limit, else none (a GPU's
 * capacity is the CUDA tests'). */
static void test_budget(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t limit = nd_memory_get_limit(cpu);
    CHECK(nd_device_capacity(cpu) > 0);
    nd_memory_set_limit(cpu, -1);
    CHECK(nd_device_budget(cpu) == -1);
    nd_memory_set_limit(cpu, 300 * MiB);
    CHECK(nd_device_budget(cpu) == 300 * MiB);
    nd_memory_set_limit(cpu, 0);
    CHECK(nd_device_budget(cpu) == 0);
    nd_memory_set_limit(cpu, limit);
}

int main(void) {
    test_triggers();
    test_decisions();
    test_ladders();
    test_afters();
    test_runs();
    test_refresh_and_wants();
    test_policy_checks();
    test_budget();
    if (failures > 0) printf("%d failure(s)\n", failures);
    return failures > 0;
}
