/* recover.c - creating and re-creating a MonitoredSession: the session
 * creator and every hook's after_create_session, retried after
 * recoverable errors with exponential backoff (cut short by a stop); and
 * what a failed step leads to: re-creation and another attempt, or the
 * session's end with its reason. */
#include <config.h>

#include "util.h"
#include "monitored_int.h"

/* Create (or re-create) the session: the creator, then every hook's
 * after_create_session in order. */
keel_status
keel__session_create_once(keel_session *s, int is_recovery)
{
    size_t i;
    keel_status st;
    if (s->creator.create != NULL) {
        st = s->creator.create(s->creator.ctx, is_recovery);
        if (st != KEEL_OK)
            return st;
    }
    s->n_creations++;
    for (i = 0; i < s->n_hooks; i++) {
        const keel_hook *h = &s->hooks[i];
        if (h->after_create_session == NULL)
            continue;
        st = h->after_create_session(h->ctx, s);
        if (st != KEEL_OK)
            return keel__session_hook_error(st, h, "after_create_session",
                                            keel_vars_global_step(s->vars));
    }
    // after_create_session moves timers (CheckpointSaver) and resolves
    // StopAtStep's last step.
    for (i = 0; i < s->n_hooks; i++)
        keel__session_refresh_slot(s, i);
    keel__session_update_wakes(s);
    s->needs_create = 0;
    return KEEL_OK;
}

/* Sleep before retry attempt n (0-based; n < 0: no sleep, only the stop
 * check), waking at once on a stop. KEEL_ECANCELLED if a stop or signal
 * came. */
static keel_status
backoff(keel_session *s, int attempt)
{
    int64_t ms = attempt < 0 ? 0 : s->backoff_ms;
    int i;
    for (i = 0; i < attempt && ms < s->backoff_max_ms; i++)
        ms *= 2;
    if (ms > s->backoff_max_ms)
        ms = s->backoff_max_ms;
    if (keel_coord_wait_for_stop(s->coord, ms) || keel__signal_pending())
        return keel__fail(KEEL_ECANCELLED, "stop requested during recovery "
                          "backoff");
    return KEEL_OK;
}

keel_status
keel__session_create_with_retry(keel_session *s, int is_recovery)
{
    int attempt = 0;
    for (;;) {
        keel_status st = keel__session_create_once(s, is_recovery);
        if (st == KEEL_OK)
            return KEEL_OK;
        if (!s->is_recovering || !keel_status_is_recoverable(st))
            return st;
        if (attempt >= s->max_attempts)
            return keel__wrap(st, "session creation failed %d times",
                              attempt + 1);
        keel__log(KEEL_LOG_WARN, "session creation failed (%s): %s; retry "
                  "%d/%d", keel_status_name(st), keel_last_error(),
                  attempt + 1, s->max_attempts);
        st = backoff(s, attempt);
        if (st != KEEL_OK)
            return st;
        attempt++;
        is_recovery = 1;
    }
}

/* A step (or the session creation before it) failed with st: KEEL_OK to
 * try it again (a recoverable error with attempts left, after the
 * backoff), else the session stops and the status to return. */
keel_status
keel__session_after_failed_step(keel_session *s, keel_status st, int *attempt)
{
    if (st == KEEL_ECANCELLED) {
        /* A wait inside the step or its update (a cluster's sync step)
         * ended by a stop: a signal, or another replica that ended the
         * job. Nothing of the step was applied: the session stops at the
         * step it was at, as at a step boundary. */
        keel__log(KEEL_LOG_INFO, "the step at global step %lld was given "
                  "up: %s", (long long)keel_vars_global_step(s->vars),
                  keel_last_error());
        if (!keel__session_check_stop(s))
            keel__session_stop_with(s, KEEL_END_STOP_REQUESTED);
        return st;
    }
    if (s->is_recovering && keel_status_is_recoverable(st)
        && *attempt < s->max_attempts) {
        keel_status bst;
        keel__log(KEEL_LOG_WARN, "recoverable error at global step %lld "
                  "(%s): %s; re-creating the session (attempt %d/%d)",
                  (long long)keel_vars_global_step(s->vars),
                  keel_status_name(st), keel_last_error(), *attempt + 1,
                  s->max_attempts);
        s->needs_create = 1;
        /* The first re-creation is at once: what failed the step (a
         * restarted ps, a worker back) is usually over by the time it is
         * noticed, and the whole job waits on this step. Only failures in
         * a row back off (TF retries at once, forever). */
        bst = backoff(s, *attempt - 1);
        (*attempt)++;
        if (bst == KEEL_OK)
            return KEEL_OK;
        keel__session_check_stop(s);
        keel__session_stop_with(s, KEEL_END_STOP_REQUESTED);
        return bst;
    }
    if (st == KEEL_EOUTOFRANGE) {
        keel__log(KEEL_LOG_INFO, "end of input at global step %lld",
                  (long long)keel_vars_global_step(s->vars));
        keel__session_stop_with(s, KEEL_END_OUT_OF_RANGE);
        return st;
    }
    if (keel_status_is_recoverable(st) && s->is_recovering)
        st = keel__wrap(st, "gave up after %d recovery attempts", *attempt);
    keel__session_stop_with(s, KEEL_END_ERROR);
    return st;
}
