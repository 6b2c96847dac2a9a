/* monitored_int.h - private to the MonitoredSession's files (monitored.c,
 * step.c, hook_calls.c, recover.c, stop.c): the session, its step and
 * replicas, the per-hook wake slots and the alarm, and the internal
 * functions one of those files defines for the others. A file calls only
 * the files on the lines below its own, never back:
 *   monitored.c   construction, the step, close
 *   recover.c     creation and re-creation after errors
 *   hook_calls.c  calling the hooks; step.c  the step and replicas;
 *   stop.c        stop requests and reasons */
#ifndef KEEL_SESSION_MONITORED_INT_H
#define KEEL_SESSION_MONITORED_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include "util.h"
#include "session_int.h"
#include "../numeric/numeric_int.h"

struct keel_step {
    keel_session *s;
    const void *batch;
    int is_applied;
    int64_t global_step;
    int replica, n_replicas;
    keel_grads *grads;              /* this replica's (the session's) */
    keel__values *values;           /* where its values go */
};

/* In-process replicas (keel_session_config.replicas > 1): one step, its
 * own gradients and values per replica, run on a pool of threads. */
typedef struct replicas {
    int n;
    keel__pool *pool;
    keel_step st[KEEL_MAX_REPLICAS];
    keel_grads *grads[KEEL_MAX_REPLICAS];
    keel__values values[KEEL_MAX_REPLICAS];
    keel_status status[KEEL_MAX_REPLICAS];
    char error[KEEL_MAX_REPLICAS][256];
    /* the reduction zeroes what it read: a replica's store is zero
     * before its step unless its last step failed (dirty) */
    int dirty[KEEL_MAX_REPLICAS];
    int reduced;                    /* the last round reached its reduce */
    keel__spin_barrier bar;         /* steps done, before the reduce */
    keel_session *s;
} replicas;

/* A thread that raises is_up at at_ns (CLOCK_MONOTONIC): the step path
 * notices clock deadlines with one relaxed load, no clock read. Started
 * with the first clock deadline; stopped at close. */
typedef struct step_alarm {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t at_ns;              /* KEEL_WAKE_NEVER: none */
    int is_quit;
    int is_started;
    int has_failed;             /* no thread: clock hooks called always */
    atomic_int is_up;
} step_alarm;

/* Per hook: the steps at which its calls can do something
 * (keel__hook_get_wake); the step path skips the calls before them. */
typedef struct hook_slot {
    int64_t before_gs, after_gs;
    int64_t after_ns;           /* clock deadline (alarm), or NEVER */
    int64_t before_chain;       /* before_run idle while n_chains < this */
    /* Dynamic hooks: n_chains when the hook was last called, and chains
     * since then that did not reach it: the rest it missed by skipping
     * (n_skipped). */
    int64_t sync_chain, n_missed;
    int on_stall;
    int after_needs_before;
    int is_dynamic;             /* ask keel__hook_get_wake again after calls */
    /* Behind: an after_run chain stopped (a hook failed) before reaching
     * this hook, whose last reached step is then prev_before, not the
     * session's chain_prev. */
    int is_behind;
    int has_prev_before;
    int64_t prev_before;
} hook_slot;

struct keel_session {
    keel_vars *vars;
    keel_step_fn step;
    void *step_ctx;
    keel_updater updater;
    int is_updateless_told;         /* "no update rule" logged once */
    keel_backend backend;           /* zero: local */
    keel_hook *hooks;
    size_t n_hooks;
    /* The hooks with a before_run / after_run, in order: the step path
     * walks only these (index into hooks). */
    size_t *before_idx, *after_idx;
    size_t n_before, n_after;
    hook_slot *slots;               /* one per hook */
    /* Over all slots (keel__session_update_wakes): with every hook idle a
     * chain is one compare. before_min / after_min: the earliest wake;
     * has_armed: a hook whose after_run waits on its skipped before_run is
     * not idle yet; chain_prev: step_before of the last step whose
     * after_run chain started (what an on_stall hook compares with). */
    int64_t before_min, after_min, before_chain_min;
    int has_stall_hook, has_armed;
    int64_t n_chains;               /* after_run chains started */
    /* The same over the dynamic hooks only, and the hooks that are always
     * called (not dynamic, wake ALWAYS) in order: while every dynamic hook
     * is idle, a chain calls just those. */
    int64_t dyn_before_min, dyn_after_min, dyn_before_chain_min;
    int has_dyn_stall_hook;
    size_t *always_before, *always_after;
    size_t n_always_before, n_always_after;
    int64_t chain_prev;
    int has_chain_prev;
    size_t n_behind;
    int64_t min_after_ns;           /* earliest clock deadline, or NEVER */
    step_alarm alarm;
    int64_t *gs;                    /* vars' global step */
    const atomic_int *coord_stop;   /* the coordinator's stop flag */
    keel_hook *owned;               /* built-in hooks this session frees */
    size_t n_owned;
    keel_session_creator creator;
    keel_session_manager *sm;       /* owned; NULL with a custom creator */
    keel_coord *coord;
    keel_saver *saver;
    keel_grads *grads;
    keel__values values;
    /* the metrics of the step (slots of values) in the order the gradients
     * carry them (keel__grads_metrics) */
    int metric_slot[KEEL__METRICS_MAX];
    int n_metrics;
    keel_step st;
    replicas *rep;                  /* NULL: one replica */
    keel_run_context rc;
    keel_run_values rv;
    int is_recovering;
    int skip_grad_zeroing;
    int needs_step_time;            /* some hook reads start/duration */
    int max_attempts, backoff_ms, backoff_max_ms;
    double grace_secs;
    int needs_create;
    int n_creations;
    int is_stopped;
    keel_end_reason reason;
    int is_closed;
    int64_t local_step;
    keel_status (*meta_fn)(void *ctx, keel_ckpt_meta *meta);
    void *meta_ctx;
    int is_chief;
    void (*cleanup)(void *ctx);
    void *cleanup_ctx;
};

/* ---- stop.c ---------------------------------------------------------------
 * Stop the session with why, unless it is stopped (the first reason
 * stays). */
void keel__session_stop_with(keel_session *s, keel_end_reason why);
/* The rest of keel__session_check_stop once its first test found
 * something: 1 when the session is closed or stopped (a signal or the
 * coordinator's stop now stops it, with its reason). */
int keel__session_notice_stop(keel_session *s);

/* Notice stops from outside the step (signal, coordinator): 1 when the
 * session is stopped. */
static inline int
keel__session_check_stop(keel_session *s)
{
    // One test on the step path: nothing stopped, no signal, no request.
    if (!(s->is_closed | s->is_stopped | keel__signal_flag
          | atomic_load_explicit(s->coord_stop, memory_order_acquire)))
        return 0;
    return keel__session_notice_stop(s);
}

/* ---- step.c --------------------------------------------------------------
 * n replicas of the session's step (s->rep; each its own gradients and
 * values) and the pool they run on. */
keel_status keel__session_replicas_new(keel_session *s, int n);
/* Accepts NULL. */
void keel__session_replicas_free(replicas *r);
/* One step on every replica, then their gradients reduced into the
 * session's and their values averaged into the session's. */
keel_status keel__session_replicas_step(keel_session *s, const void *batch,
                                        int64_t gs);
/* Before the update: the step's metrics (keel_step_set_metric) into the
 * session's gradients, for a backend that combines replicas. */
void keel__session_metrics_out(keel_session *s);
/* After the update: when the backend combined the step's replicas, each
 * metric's value becomes the combined mean and "<name>/replica_<i>" each
 * replica's own. */
keel_status keel__session_metrics_in(keel_session *s);

/* ---- hook_calls.c --------------------------------------------------------
 * A hook's failure st in its call where at step: recoverable codes and
 * KEEL_ECANCELLED stay, others become KEEL_EHOOK; the message names the
 * hook, the call and the step. */
keel_status keel__session_hook_error(keel_status st, const keel_hook *h,
                                     const char *where, int64_t step);
/* Ask hook k again when its calls can next do something. */
void keel__session_refresh_slot(keel_session *s, size_t k);
/* The aggregates over the slots the step path tests first (and the
 * alarm at the earliest clock deadline). */
void keel__session_update_wakes(keel_session *s);
/* Stop and join the alarm thread, if any; no new one starts after. */
void keel__session_alarm_stop(step_alarm *a);
/* before_run of every hook not idle at global step gs, in order. */
keel_status keel__session_run_before(keel_session *s, int64_t gs);
/* after_run of every hook not idle at this step (from gs to after), in
 * order. */
keel_status keel__session_run_after(keel_session *s, int64_t gs,
                                    int64_t after);

/* The alarm is up: a clock deadline is near (one relaxed load). */
static inline int
keel__session_alarm_is_up(const keel_session *s)
{
    return atomic_load_explicit(&s->alarm.is_up, memory_order_relaxed);
}

/* ---- recover.c -----------------------------------------------------------
 * Create (or re-create) the session once: the creator, then every hook's
 * after_create_session in order. */
keel_status keel__session_create_once(keel_session *s, int is_recovery);
/* keel__session_create_once, retried after recoverable errors (a
 * recovering session) with backoff, up to max_attempts. */
keel_status keel__session_create_with_retry(keel_session *s,
                                            int is_recovery);
/* A step (or the session creation before it) failed with st: KEEL_OK to
 * try it again (a recoverable error with attempts left, after the
 * backoff), else the session stops and the status to return. */
keel_status keel__session_after_failed_step(keel_session *s, keel_status st,
                                            int *attempt);

#endif
