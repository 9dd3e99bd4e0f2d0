/* gc_pacer.c: the collection policy (docs/design.md, "The collection
 * policy"): the trigger, the fixed watermark, the time-share pacing, the
 * useless-collection cooldown, the safe points, the ladder's target and the
 * full-fallback back-off. Pure: no clock, no globals, no Python; the runner
 * (needle_c/memory/pressure.c) collects. Each rule is written once, here,
 * with the why in the design document.
 */
#include "gc_pacer.h"

#include <math.h>
#include <string.h>

enum { MAX_FALLBACK_SKIPS = 64 };

const nd_gc_policy nd_gc_policy_default = ND_GC_POLICY_DEFAULTS;

const char *nd_gc_policy_invalid(const nd_gc_policy *p) {
    if (!(isfinite(p->growth) && p->growth >= 0.0) || p->min_growth < 0 ||
        !(p->high_water > 0.0 && p->high_water <= 1.0) ||
        !(p->max_gc_fraction > 0.0 && p->max_gc_fraction <= 0.5))
        return "gc policy: need growth >= 0, min_growth >= 0, 0 < high_water <= 1 "
               "and 0 < max_gc_fraction <= 0.5";
    return NULL;
}

void nd_pacer_init(nd_pacer_state *state) {
    memset(state, 0, sizeof *state);
    state->safe.baseline = -1;
}

/* high_water * budget: where soft collections stop waiting; -1 without a budget. */
static int64_t cap_of(const nd_gc_policy *p, int64_t budget) {
    return budget < 0 ? -1 : (int64_t)(p->high_water * (double)budget);
}

static int watermark_set(const nd_gc_policy *p) {
    return p->watermark >= 0 || p->watermark_fraction > 0.0;
}

/* The fixed watermark: bytes, or a fraction of the device's own budget (-1
 * on a device without one). */
static int64_t watermark_of(const nd_gc_policy *p, int64_t budget) {
    if (p->watermark >= 0) return p->watermark;
    return budget < 0 ? -1 : (int64_t)(p->watermark_fraction * (double)budget);
}

/* The trigger for a live set of `survivors` bytes; -1 for none. */
static int64_t trigger_for(const nd_gc_policy *p, int64_t survivors, int64_t budget) {
    if (!p->enabled) return -1;
    if (watermark_set(p)) return watermark_of(p, budget);
    int64_t cap = cap_of(p, budget);
    if (cap < 0) return -1;
    double grown = (double)survivors * (1.0 + p->growth);
    double stepped = (double)survivors + (double)p->min_growth;
    double t = grown > stepped ? grown : stepped;
    return t < (double)cap ? (int64_t)t : cap;
}

int64_t nd_pacer_trigger(const nd_gc_policy *policy, const nd_pacer_state *state, int64_t budget) {
    return trigger_for(policy, state->survivors, budget);
}

int64_t nd_pacer_soft_target(const nd_gc_policy *policy, int64_t level, int64_t budget) {
    int64_t mark = watermark_set(policy) ? watermark_of(policy, budget) : cap_of(policy, budget);
    return mark < 0 ? 0 : level - mark;
}

/* Safe points are steering collections: they keep coming (the next is not
 * overdue) and the last collection at one was not useless. */
static int safe_points_active(const nd_pacer_state *s, double now) {
    return !s->safe.useless && s->safe.last > 0.0 &&
           now - s->safe.last <= 2.0 * s->safe.interval + 0.01;
}

/* Pacing and cooldown for the soft path: ND_PACER_WHY_COLLECT when a
 * collection may run now. A safe point is not held back by useless
 * collections before it (neither their cooldown nor their pacing); nor is the
 * first ladder that would run a full collection after ladders that did not. */
static nd_pacer_why soft_pacing(const nd_gc_policy *p, const nd_pacer_state *s,
                                const nd_pacer_event *e, int64_t level, int64_t target) {
    int at_safe_point = e->kind == ND_PACER_SAFE_POINT;
    /* Under alignment the automatic collector is off by alignment.py's hand. */
    if (!e->aligned && !e->gc_enabled) return ND_PACER_WHY_GC_DISABLED;
    double fraction = p->max_gc_fraction;
    if (e->budget > 0 && (double)level > 0.9 * (double)e->budget) fraction = 0.5;
    if (at_safe_point && s->pacing.last_freed_little) return ND_PACER_WHY_COLLECT;
    if (target > 0 && !s->fallback.last_ran_full && s->fallback.skips_left == 0)
        return ND_PACER_WHY_COLLECT;
    if (s->pacing.last_duration > 0.0 &&
        e->now - s->pacing.last_end < s->pacing.last_duration * (1.0 / fraction - 1.0))
        return ND_PACER_WHY_PACED;
    return at_safe_point || e->now >= s->pacing.cooldown_until ? ND_PACER_WHY_COLLECT
                                                               : ND_PACER_WHY_COOLDOWN;
}

static nd_pacer_decision nothing(nd_pacer_why why) {
    nd_pacer_decision d = {ND_PACER_NOTHING, why, 0};
    return d;
}

/* A ladder for `target` bytes: what it will run as the state stands. */
static nd_pacer_decision ladder(const nd_pacer_state *s, const nd_pacer_event *e, int64_t target) {
    nd_pacer_decision d = {ND_PACER_SCOPED, ND_PACER_WHY_COLLECT, target};
    int soft = e->kind != ND_PACER_OUT_OF_MEMORY;
    if (!e->scoped_available) d.action = ND_PACER_FULL;
    else if (target > 0 && !(soft && s->fallback.skips_left > 0))
        d.action = ND_PACER_SCOPED_THEN_FULL;
    return d;
}

/* A soft collection that passed its checks: a want under alignment (the
 * ranks collect together later), else the ladder. */
static nd_pacer_decision soft_collection(nd_pacer_state *s, const nd_pacer_event *e,
                                         int64_t target) {
    if (!e->aligned) return ladder(s, e, target);
    if (!s->want) {
        s->want = 1;
        s->counts.aligned_wants++;
    }
    nd_pacer_decision d = {ND_PACER_WANT, ND_PACER_WHY_COLLECT, target};
    return d;
}

static nd_pacer_decision decide_allocation(const nd_gc_policy *p, nd_pacer_state *s,
                                           const nd_pacer_event *e) {
    int64_t level = e->allocated + e->requested;
    int64_t trigger = nd_pacer_trigger(p, s, e->budget);
    if (trigger < 0 || level <= trigger) return nothing(ND_PACER_WHY_BELOW_TRIGGER);
    int64_t target = nd_pacer_soft_target(p, level, e->budget);
    int64_t cap = cap_of(p, e->budget);
    if (!watermark_set(p) && safe_points_active(s, e->now) && cap >= 0 && level <= cap) {
        s->counts.deferred++;
        return nothing(ND_PACER_WHY_DEFERRED);
    }
    nd_pacer_why why = soft_pacing(p, s, e, level, target);
    if (why != ND_PACER_WHY_COLLECT) {
        s->counts.skipped++;
        return nothing(why);
    }
    return soft_collection(s, e, target);
}

static nd_pacer_decision decide_safe_point(const nd_gc_policy *p, nd_pacer_state *s,
                                           const nd_pacer_event *e) {
    if (watermark_set(p) || e->budget < 0) return nothing(ND_PACER_WHY_OFF);
    /* The usual gap follows the longest recent one (a step), not the short
     * one between reset_grad() and backward(). */
    if (s->safe.last > 0.0) {
        double gap = e->now - s->safe.last;
        double decayed = s->safe.interval * 0.9;
        s->safe.interval = gap > decayed ? gap : decayed;
    }
    s->safe.last = e->now;
    int64_t level = e->allocated;
    if (s->safe.baseline < 0) s->safe.baseline = s->survivors;
    if (level < s->safe.baseline) s->safe.baseline = level;
    int64_t trigger = trigger_for(p, s->safe.baseline, e->budget);
    if (trigger < 0 || level <= trigger) return nothing(ND_PACER_WHY_BELOW_TRIGGER);
    int64_t target = nd_pacer_soft_target(p, level, e->budget);
    nd_pacer_why why = soft_pacing(p, s, e, level, target);
    if (why != ND_PACER_WHY_COLLECT) {
        s->counts.skipped++;
        return nothing(why);
    }
    return soft_collection(s, e, target);
}

nd_pacer_decision nd_pacer_decide(const nd_gc_policy *policy, nd_pacer_state *state,
                                  const nd_pacer_event *event) {
    switch (event->kind) {
    case ND_PACER_ALIGNED: {
        /* Unpaced (every rank agreed); below high water it asks nothing. */
        int64_t target = nd_pacer_soft_target(policy, event->allocated, event->budget);
        return ladder(state, event, target > 0 ? target : 0);
    }
    case ND_PACER_OUT_OF_MEMORY:
        if (!policy->enabled) return nothing(ND_PACER_WHY_OFF);
        return ladder(state, event, event->requested);
    case ND_PACER_SAFE_POINT:
        if (!policy->enabled) return nothing(ND_PACER_WHY_OFF);
        return decide_safe_point(policy, state, event);
    case ND_PACER_ALLOCATION:
    default:
        if (!policy->enabled) return nothing(ND_PACER_WHY_OFF);
        return decide_allocation(policy, state, event);
    }
}

nd_pacer_step nd_pacer_after_scoped(nd_pacer_state *state, const nd_pacer_event *event,
                                    int64_t target, const nd_scoped_report *scoped) {
    if (scoped->status == ND_SCOPED_BUSY) return ND_PACER_DONE;
    if (scoped->status != ND_SCOPED_RAN) return ND_PACER_RUN_FULL;
    nd_pacer_counts *c = &state->counts;
    c->scoped_collections++;
    c->scoped_examined += scoped->examined;
    c->scoped_seconds += scoped->seconds;
    c->scoped_freed_bytes += scoped->freed_bytes;
    if (scoped->freed_bytes >= target) return ND_PACER_DONE;
    if (event->kind != ND_PACER_OUT_OF_MEMORY && state->fallback.skips_left > 0) {
        state->fallback.skips_left--;
        c->fallbacks_skipped++;
        return ND_PACER_DONE;
    }
    c->full_fallbacks++;
    return ND_PACER_RUN_FALLBACK;
}

void nd_pacer_after_full(nd_pacer_state *state, nd_pacer_step step, int64_t before, int64_t after) {
    state->counts.full_collections++;
    if (step != ND_PACER_RUN_FALLBACK) return;
    /* Under 1% of what was allocated: the garbage was not there; the next
     * 1, 2, 4, ... 64 soft ladders run the scoped step alone. */
    int64_t freed = before > after ? before - after : 0;
    if (freed * 100 >= before) {
        state->fallback.useless = 0;
        state->fallback.skips_left = 0;
        return;
    }
    if (state->fallback.useless < 30) state->fallback.useless++;
    int64_t skips = (int64_t)1 << (state->fallback.useless - 1);
    state->fallback.skips_left = (int)(skips < MAX_FALLBACK_SKIPS ? skips : MAX_FALLBACK_SKIPS);
}

void nd_pacer_after_collection(const nd_gc_policy *policy, nd_pacer_state *state,
                               const nd_pacer_event *event, int ran_full, double end,
                               int64_t after) {
    nd_pacer_counts *c = &state->counts;
    int64_t before = event->allocated;
    int64_t freed = before > after ? before - after : 0;
    int soft = event->kind != ND_PACER_OUT_OF_MEMORY;
    c->seconds += end - event->now;
    c->freed_bytes += freed;
    if (soft) c->pressure_collections++;
    else c->oom_collections++;
    state->fallback.last_ran_full = ran_full;
    state->pacing.last_end = end;
    state->pacing.last_duration = end - event->now;
    state->pacing.last_freed_little = freed * 100 < before;
    /* Almost nothing freed: the live set is real; wait longer next time. */
    if (soft && state->pacing.last_freed_little) {
        double base = state->pacing.last_duration * (1.0 / policy->max_gc_fraction - 1.0);
        if (base < 0.001) base = 0.001;
        double cooldown = state->pacing.cooldown_seconds;
        cooldown = cooldown > 0.0 ? cooldown * 2.0 : base;
        state->pacing.cooldown_seconds = cooldown > 1.0 ? 1.0 : cooldown;
        state->pacing.cooldown_until = end + state->pacing.cooldown_seconds;
    } else {
        state->pacing.cooldown_seconds = 0.0;
        state->pacing.cooldown_until = 0.0;
    }
    state->survivors = after;
    switch (event->kind) {
    case ND_PACER_ALLOCATION:
        /* Garbage found between safe points (the first ones, with no graph
         * yet to free, were useless): hand the next collections back to them. */
        if (!state->pacing.last_freed_little) state->safe.useless = 0;
        break;
    case ND_PACER_SAFE_POINT:
        c->safe_point_collections++;
        state->safe.useless = state->pacing.last_freed_little;
        state->safe.baseline = after;
        break;
    case ND_PACER_ALIGNED: c->aligned_collections++; break;
    case ND_PACER_OUT_OF_MEMORY: break;
    }
}

void nd_pacer_refresh(nd_pacer_state *state, int64_t allocated) {
    state->survivors = allocated;
    state->pacing.cooldown_seconds = 0.0;
    state->pacing.cooldown_until = 0.0;
    state->safe.useless = 0;
    state->safe.baseline = -1;
}

int nd_pacer_want_round(nd_pacer_state *state) {
    if (state->want) state->counts.aligned_rounds_waited++;
    return state->want;
}
