/* hook_calls.c - calling a session's hooks around a step: per hook, the
 * steps at which its calls can next do something (hook_slot, asked through
 * keel_hook.wake) so that idle hooks are skipped, the alarm thread that
 * raises a flag at clock deadlines, and the before_run and after_run
 * chains in order. A hook's error is named with the hook, the call and
 * the step. */
#include <config.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "util.h"
#include "monitored_int.h"

keel_status
keel__session_hook_error(keel_status st, const keel_hook *h, const char *where,
                         int64_t step)
{
    /* recoverable codes re-create the session; KEEL_ECANCELLED (a wait
     * given up for a stop) ends it as a stop */
    keel_status code = keel_status_is_recoverable(st) || st == KEEL_ECANCELLED
                           ? st : KEEL_EHOOK;
    return keel__wrap(code, "hook '%s' %s at step %lld",
                      h->name != NULL ? h->name : "?", where,
                      (long long)step);
}

/* How long before a clock deadline the alarm goes up: from then on the
 * hook is called every step and checks its timer exactly, so a trigger is
 * on time unless the alarm thread is kept off a CPU for longer than this
 * past its wake-up. */
#define ALARM_LEAD_NS ((int64_t)100 * 1000000)

static void *
alarm_main(void *arg)
{
    step_alarm *a = arg;
    pthread_mutex_lock(&a->mu);
    while (!a->is_quit) {
        if (a->at_ns == KEEL_WAKE_NEVER
            || atomic_load_explicit(&a->is_up, memory_order_relaxed))
            pthread_cond_wait(&a->cv, &a->mu);
        else if (keel__now_mono_ns() >= a->at_ns)
            atomic_store_explicit(&a->is_up, 1, memory_order_relaxed);
        else
            keel__cond_wait_until(&a->cv, &a->mu, a->at_ns);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* Raise the alarm at deadline_ns - ALARM_LEAD_NS (NEVER: none). Runs only
 * when the earliest deadline changes (a clock hook triggered). */
static void
alarm_set(keel_session *s, int64_t deadline_ns)
{
    step_alarm *a = &s->alarm;
    int64_t at = deadline_ns == KEEL_WAKE_NEVER
                 ? KEEL_WAKE_NEVER : deadline_ns - ALARM_LEAD_NS;
    if (!a->is_started && at != KEEL_WAKE_NEVER && !a->has_failed) {
        int rc;
        pthread_mutex_init(&a->mu, NULL);
        keel__cond_init_mono(&a->cv);
        a->at_ns = KEEL_WAKE_NEVER;
        rc = pthread_create(&a->thread, NULL, alarm_main, a);
        if (rc != 0) {
            size_t i;
            pthread_cond_destroy(&a->cv);
            pthread_mutex_destroy(&a->mu);
            a->has_failed = 1;
            keel__log(KEEL_LOG_WARN, "session: no alarm thread (%s): "
                      "time-based hooks are called every step",
                      strerror(rc));
            for (i = 0; i < s->n_hooks; i++)
                // has_failed: no clock deadlines
                keel__session_refresh_slot(s, i);
            return;                     // the caller recomputes the rest
        }
        a->is_started = 1;
    }
    if (!a->is_started)
        return;
    pthread_mutex_lock(&a->mu);
    a->at_ns = at;
    // Up at once if already due (the thread would, a little later).
    atomic_store_explicit(&a->is_up, at != KEEL_WAKE_NEVER
                                     && keel__now_mono_ns() >= at,
                          memory_order_relaxed);
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void
keel__session_alarm_stop(step_alarm *a)
{
    if (!a->is_started)
        return;
    pthread_mutex_lock(&a->mu);
    a->is_quit = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    a->is_started = 0;
    a->has_failed = 1;                  // closed: no new thread
    atomic_store_explicit(&a->is_up, 1, memory_order_relaxed);
}

/* The aggregates over the slots the step path tests first. */
void
keel__session_update_wakes(keel_session *s)
{
    int64_t min_ns = KEEL_WAKE_NEVER;
    size_t i;
    s->before_min = KEEL_WAKE_NEVER;
    s->after_min = KEEL_WAKE_NEVER;
    s->before_chain_min = KEEL_WAKE_NEVER;
    s->dyn_before_chain_min = KEEL_WAKE_NEVER;
    s->dyn_before_min = KEEL_WAKE_NEVER;
    s->dyn_after_min = KEEL_WAKE_NEVER;
    s->has_stall_hook = 0;
    s->has_dyn_stall_hook = 0;
    s->has_armed = 0;
    s->n_always_before = 0;
    s->n_always_after = 0;
    for (i = 0; i < s->n_before; i++) {
        size_t k = s->before_idx[i];
        const hook_slot *sl = &s->slots[k];
        if (sl->before_gs < s->before_min)
            s->before_min = sl->before_gs;
        if (sl->before_chain < s->before_chain_min)
            s->before_chain_min = sl->before_chain;
        if (sl->after_needs_before && sl->after_gs != KEEL_WAKE_NEVER)
            s->has_armed = 1;
        if (sl->is_dynamic && sl->before_gs < s->dyn_before_min)
            s->dyn_before_min = sl->before_gs;
        if (sl->is_dynamic && sl->before_chain < s->dyn_before_chain_min)
            s->dyn_before_chain_min = sl->before_chain;
        if (!sl->is_dynamic && sl->before_gs == KEEL_WAKE_ALWAYS)
            s->always_before[s->n_always_before++] = k;
        else if (!sl->is_dynamic)       // a fixed wake: not "always"
            s->dyn_before_min = KEEL_WAKE_ALWAYS;
    }
    for (i = 0; i < s->n_after; i++) {
        size_t k = s->after_idx[i];
        const hook_slot *sl = &s->slots[k];
        if (sl->after_gs < s->after_min)
            s->after_min = sl->after_gs;
        if (sl->on_stall)
            s->has_stall_hook = 1;
        if (sl->is_dynamic && sl->after_gs < s->dyn_after_min)
            s->dyn_after_min = sl->after_gs;
        if (sl->is_dynamic && sl->on_stall)
            s->has_dyn_stall_hook = 1;
        if (sl->after_ns < min_ns)
            min_ns = sl->after_ns;
        if (!sl->is_dynamic && sl->after_gs == KEEL_WAKE_ALWAYS)
            s->always_after[s->n_always_after++] = k;
        else if (!sl->is_dynamic)
            s->dyn_after_min = KEEL_WAKE_ALWAYS;
    }
    if (min_ns != s->min_after_ns) {
        s->min_after_ns = min_ns;
        alarm_set(s, min_ns);
        if (s->alarm.has_failed && min_ns != KEEL_WAKE_NEVER)
            keel__session_update_wakes(s);  // once: no clock deadlines now
    }
}

/* Ask hook k again when its calls can next do something. */
void
keel__session_refresh_slot(keel_session *s, size_t k)
{
    keel_hook_wake w;
    hook_slot *sl = &s->slots[k];
    int64_t base;
    sl->is_dynamic = keel__hook_get_wake(&s->hooks[k], &w);
    sl->before_gs = w.before_gs;
    // Iterations from the hook's own count, which stands at chain
    // sync_chain + n_missed (chains since then it has not been told of;
    // more misses later only make it wake early, a no-op call).
    base = sl->sync_chain + sl->n_missed;
    sl->before_chain = w.before_iters == KEEL_WAKE_NEVER
                       || w.before_iters > KEEL_WAKE_NEVER - base
                       ? KEEL_WAKE_NEVER : base + w.before_iters;
    sl->after_gs = w.after_gs;
    sl->after_ns = w.after_ns;
    if (sl->after_ns != KEEL_WAKE_NEVER && s->alarm.has_failed) {
        sl->after_gs = KEEL_WAKE_ALWAYS;   // no alarm: every step
        sl->after_ns = KEEL_WAKE_NEVER;
    }
    sl->on_stall = w.on_stall;
    sl->after_needs_before = w.after_needs_before;
}

/* ---- the chains around a step ------------------------------------------- */

/* before_run of every hook not idle at global step gs, in order. */
keel_status
keel__session_run_before(keel_session *s, int64_t gs)
{
    keel_run_context *rc = &s->rc;
    size_t i;
    int is_changed = 0;
    keel_status st = KEEL_OK;
    if (gs < s->dyn_before_min && s->n_chains < s->dyn_before_chain_min
        && !s->has_armed) {
        // Every dynamic hook idle: only the always-called ones, in order.
        rc->n_skipped = 0;
        for (i = 0; i < s->n_always_before; i++) {
            const keel_hook *h = &s->hooks[s->always_before[i]];
            rc->hook_name = h->name;
            st = h->before_run(h->ctx, rc);
            if (st != KEEL_OK)
                return st == KEEL_EOUTOFRANGE
                       ? st : keel__session_hook_error(st, h, "before_run", gs);
        }
        return KEEL_OK;
    }
    for (i = 0; i < s->n_before; i++) {
        size_t k = s->before_idx[i];
        hook_slot *sl = &s->slots[k];
        const keel_hook *h;
        if (gs < sl->before_gs && s->n_chains < sl->before_chain) {
            // Its after_run waits on this before_run: idle this step too.
            if (sl->after_needs_before && sl->after_gs != KEEL_WAKE_NEVER) {
                sl->after_gs = KEEL_WAKE_NEVER;
                is_changed = 1;
            }
            continue;
        }
        h = &s->hooks[k];
        rc->hook_name = h->name;
        rc->n_skipped = 0;
        if (sl->is_dynamic) {
            rc->n_skipped = s->n_chains - sl->sync_chain - sl->n_missed;
            sl->sync_chain = s->n_chains;
            sl->n_missed = 0;
        }
        st = h->before_run(h->ctx, rc);
        if (sl->is_dynamic) {
            keel__session_refresh_slot(s, k);
            is_changed = 1;
        }
        if (st != KEEL_OK) {
            if (st != KEEL_EOUTOFRANGE)     // a feeder ran out of input
                st = keel__session_hook_error(st, h, "before_run", gs);
            break;
        }
    }
    if (is_changed)
        keel__session_update_wakes(s);
    return st;
}

/* Hook k's after_run failed with st: the hooks after it did not see the
 * step (their last reached step stays chain_prev). */
static keel_status
after_failed(keel_session *s, size_t k, int64_t chain_prev,
             int has_chain_prev, int64_t after, keel_status st)
{
    size_t j = 0;
    while (j < s->n_after && s->after_idx[j] != k)
        j++;
    for (j++; j < s->n_after; j++) {
        hook_slot *later = &s->slots[s->after_idx[j]];
        later->n_missed++;
        if (later->is_behind)
            continue;
        later->is_behind = 1;
        later->prev_before = chain_prev;
        later->has_prev_before = has_chain_prev;
        s->n_behind++;
    }
    return keel__session_hook_error(st, &s->hooks[k], "after_run", after);
}

/* Every dynamic hook idle: only the always-called hooks' after_run, in
 * order (none watches for stalls: that is a dynamic hook's wake). A
 * failing one marks the hooks after it behind (after_failed). */
static keel_status
run_after_always(keel_session *s, int64_t chain_prev, int has_chain_prev,
                 int64_t after)
{
    keel_run_context *rc = &s->rc;
    s->rv.has_prev_before = 0;
    s->rv.n_skipped = 0;
    for (size_t i = 0; i < s->n_always_after; i++) {
        const keel_hook *h = &s->hooks[s->always_after[i]];
        keel_status st;
        rc->hook_name = h->name;
        st = h->after_run(h->ctx, rc, &s->rv);
        if (st != KEEL_OK)
            return after_failed(s, s->always_after[i], chain_prev,
                                has_chain_prev, after, st);
    }
    return KEEL_OK;
}

/* after_run of every hook not idle at this step, in order. A hook that
 * watches for stalls compares with the last step that reached it. */
keel_status
keel__session_run_after(keel_session *s, int64_t gs, int64_t after)
{
    keel_run_context *rc = &s->rc;
    int64_t chain_prev = s->chain_prev;
    int has_chain_prev = s->has_chain_prev;
    int is_alarm_up = keel__session_alarm_is_up(s);
    size_t i;
    int is_changed = 0;
    keel_status st = KEEL_OK;
    s->chain_prev = gs;
    s->has_chain_prev = 1;
    if (after < s->dyn_after_min && s->n_behind == 0 && !is_alarm_up
        && !(s->has_dyn_stall_hook
             && (!has_chain_prev || chain_prev == gs)))
        return run_after_always(s, chain_prev, has_chain_prev, after);
    for (i = 0; i < s->n_after; i++) {
        size_t k = s->after_idx[i];
        hook_slot *sl = &s->slots[k];
        const keel_hook *h;
        int64_t prev = chain_prev;
        int has_prev = has_chain_prev;
        if (sl->is_behind) {
            prev = sl->prev_before;
            has_prev = sl->has_prev_before;
            sl->is_behind = 0;
            s->n_behind--;
        }
        if (after < sl->after_gs
            && !(sl->after_ns != KEEL_WAKE_NEVER && is_alarm_up)
            && !(sl->on_stall && (!has_prev || prev == gs)))
            continue;
        h = &s->hooks[k];
        rc->hook_name = h->name;
        s->rv.prev_before = prev;
        s->rv.has_prev_before = sl->on_stall && has_prev;
        s->rv.n_skipped = 0;
        if (sl->is_dynamic) {
            // this chain (n_chains) is the one being delivered
            s->rv.n_skipped = s->n_chains - 1 - sl->sync_chain
                              - sl->n_missed;
            sl->sync_chain = s->n_chains;
            sl->n_missed = 0;
        }
        st = h->after_run(h->ctx, rc, &s->rv);
        if (sl->is_dynamic) {
            keel__session_refresh_slot(s, k);
            is_changed = 1;
        }
        if (st != KEEL_OK) {
            if (is_changed)
                keel__session_update_wakes(s);
            return after_failed(s, k, chain_prev, has_chain_prev, after,
                                st);
        }
    }
    if (is_changed)
        keel__session_update_wakes(s);
    return st;
}
