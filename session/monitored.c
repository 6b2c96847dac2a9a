/* monitored.c - MonitoredSession and SingularMonitoredSession: the step
 * (user callback, updater, global step), the hook chain around it (idle
 * built-in hooks skipped; an alarm thread for clock deadlines), bounded
 * recovery with exponential backoff, sticky stop, ending with a reason,
 * save-now / run-without-hooks, and the SIGTERM/SIGINT stop flag. The step
 * path does not allocate. */
#include <config.h>

#include <assert.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "defaults.h"
#include "util.h"
#include "session_int.h"
#include "step_pool.h"
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

/* How long before a clock deadline the alarm goes up: from then on the
 * hook is called every step and checks its timer exactly, so a trigger is
 * on time unless the alarm thread is kept off a CPU for longer than this
 * past its wake-up. */
#define ALARM_LEAD_NS ((int64_t)100 * 1000000)

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
    /* Over all slots (update_wakes): with every hook idle a chain is one
     * compare. before_min / after_min: the earliest wake; has_armed: a
     * hook whose after_run waits on its skipped before_run is not idle
     * yet; chain_prev: step_before of the last step whose after_run chain
     * started (what an on_stall hook compares with). */
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

/* ---- the step ----------------------------------------------------------- */

keel_vars *
keel_step_vars(keel_step *st)
{
    return st->s->vars;
}

const void *
keel_step_batch(const keel_step *st)
{
    return st->batch;
}

keel_grads *
keel_step_grads(keel_step *st)
{
    return st->grads;
}

int
keel_step_replica(const keel_step *st)
{
    return st->replica;
}

int
keel_step_num_replicas(const keel_step *st)
{
    return st->n_replicas;
}

keel__pool *
keel__step_pool(const keel_step *st)
{
    return st->s->rep != NULL ? st->s->rep->pool : NULL;
}

int64_t
keel_step_global_step(const keel_step *st)
{
    return st->global_step;
}

keel_status
keel_step_set_value(keel_step *st, const char *name, double v)
{
    keel__values *t = st->values;
    int slot;
    if (name == NULL)
        return keel__fail(KEEL_EINVAL, "step value: NULL name");
    slot = keel__values_slot(t, name, 1);
    if (slot < 0)
        return keel__fail(strlen(name) >= KEEL_VALUE_NAME_MAX ? KEEL_EINVAL
                          : KEEL_ENOMEM, "step value '%s': name longer than "
                          "%d bytes or more than %d names", name,
                          KEEL_VALUE_NAME_MAX - 1, KEEL_MAX_VALUES);
    t->v[slot].value = v;
    t->v[slot].set_gen = t->gen;
    return KEEL_OK;
}

void
keel_step_mark_applied(keel_step *st)
{
    st->is_applied = 1;
}

/* ---- in-process replicas ------------------------------------------------ */

static void
replicas_free(replicas *r)
{
    if (r == NULL)
        return;
    keel__pool_free(r->pool);
    for (int i = 0; i < r->n; i++)
        keel_grads_free(r->grads[i]);
    free(r);
}

static keel_status
replicas_new(keel_session *s, int n)
{
    replicas *r = calloc(1, sizeof *r);
    keel_status st;
    if (r == NULL)
        return keel__fail(KEEL_ENOMEM, "session: %d replicas", n);
    r->s = s;
    for (int i = 0; i < n; i++) {
        if ((st = keel_grads_new(s->vars, &r->grads[i])) != KEEL_OK) {
            replicas_free(r);
            return keel__wrap(st, "session: replica %d's gradients", i);
        }
        r->n = i + 1;
        r->st[i].s = s;
        r->st[i].replica = i;
        r->st[i].n_replicas = n;
        r->st[i].grads = r->grads[i];
        r->st[i].values = &r->values[i];
    }
    if ((st = keel__pool_new(n, &r->pool)) != KEEL_OK) {
        replicas_free(r);
        return keel__wrap(st, "session: %d replica threads", n);
    }
    r->bar.n = keel__pool_threads(r->pool);
    s->rep = r;
    return KEEL_OK;
}

/* Thread t runs replicas t, t + T, ...: zeroes their gradients if a
 * failed step left them unreduced and calls the step, keeping its status
 * and message (messages are per thread). */
static void
replica_worker(void *ctx, int t)
{
    replicas *r = ctx;
    int T = keel__pool_threads(r->pool);
    for (int i = t; i < r->n; i += T) {
        if (r->dirty[i])
            keel_grads_zero(r->grads[i]);
        r->dirty[i] = 1;             /* until the reduction zeroes it */
        r->status[i] = r->s->step(r->s->step_ctx, &r->st[i]);
        if (r->status[i] != KEEL_OK)
            snprintf(r->error[i], sizeof r->error[i], "%s",
                     keel_last_error());
        else if (r->st[i].is_applied)
            snprintf(r->error[i], sizeof r->error[i], "%s", "it marked "
                     "the update applied, which one replica of several "
                     "cannot do");
    }
}

/* Floats a reduce worker sums before zeroing the replicas' copies of
 * them: the lines just read are still in L1 when they are zeroed. */
#define REDUCE_CHUNK 2048

/* Thread t's share of every gradient: the replicas' gradients added along
 * the tree whose leaf i is replica i, into the session's; the replicas'
 * shares zeroed behind it for their next step (one pass, not two). */
static void
reduce_worker(void *ctx, int t)
{
    replicas *r = ctx;
    keel_session *s = r->s;
    int T = keel__pool_threads(r->pool);
    keel__tree_node nodes[KEEL_MAX_REPLICAS];
    const float *parts[KEEL_MAX_REPLICAS];
    for (int i = 0; i < r->n; i++) {
        nodes[i].lo = i;
        nodes[i].hi = i + 1;
    }
    for (size_t v = 0; v < keel_grads_count(s->grads); v++) {
        keel_tensor *dst = keel_grads_at(s->grads, v);
        size_t lo, hi;
        if (dst == NULL)
            continue;
        for (int i = 0; i < r->n; i++)
            parts[i] = keel_grads_at(r->grads[i], v)->data;
        /* cache-line multiples of 16 floats per thread */
        lo = (dst->count * (size_t)t / (size_t)T) & ~(size_t)15;
        hi = t + 1 == T ? dst->count
                        : (dst->count * (size_t)(t + 1) / (size_t)T) &
                              ~(size_t)15;
        for (size_t c = lo; c < hi; c += REDUCE_CHUNK) {
            size_t e = hi - c < REDUCE_CHUNK ? hi : c + REDUCE_CHUNK;
            (void)keel__tree_sum(r->n, nodes, parts, r->n, dst->data, c, e);
            for (int i = 0; i < r->n; i++)
                memset(keel_grads_at(r->grads[i], v)->data + c, 0,
                       (e - c) * sizeof(float));
        }
    }
}

/* One pool run per step: every thread steps its replicas, all meet at the
 * barrier, then (every step succeeded) each reduces its share. */
static void
round_worker(void *ctx, int t)
{
    replicas *r = ctx;
    replica_worker(ctx, t);
    if (r->bar.n > 1)
        keel__spin_barrier_wait(&r->bar);
    for (int i = 0; i < r->n; i++)
        if (r->status[i] != KEEL_OK || r->st[i].is_applied)
            return;
    reduce_worker(ctx, t);
    if (t == 0)
        r->reduced = 1;
}

/* One step on every replica, then their gradients reduced into the
 * session's and their values averaged into the session's. */
static keel_status
replicas_step(keel_session *s, const void *batch, int64_t gs)
{
    replicas *r = s->rep;
    keel__values *t0 = &r->values[0];
    for (int i = 0; i < r->n; i++) {
        r->st[i].batch = batch;
        r->st[i].is_applied = 0;
        r->st[i].global_step = gs;
        r->status[i] = KEEL_OK;
        r->error[i][0] = 0;
        r->values[i].gen++;
    }
    r->reduced = 0;
    keel__pool_run(r->pool, round_worker, r);
    for (int i = 0; i < r->n; i++) {
        if (r->status[i] != KEEL_OK)
            return keel__fail(r->status[i], "replica %d of %d: %s", i, r->n,
                              r->error[i]);
        if (r->st[i].is_applied)
            return keel__fail(KEEL_EINVAL, "replica %d of %d: %s", i, r->n,
                              r->error[i]);
    }
    for (int i = 0; i < r->n; i++)
        r->dirty[i] = !r->reduced;
    for (size_t k = 0; k < t0->n; k++) {
        double sum = 0.0;
        keel_status st;
        if (t0->v[k].set_gen != t0->gen)
            continue;
        for (int i = 0; i < r->n; i++) {
            int slot = keel__values_slot(&r->values[i], t0->v[k].name, 0);
            if (slot < 0 || r->values[i].v[slot].set_gen != r->values[i].gen)
                return keel__fail(KEEL_EINVAL, "replica %d of %d did not set "
                                  "the value '%s' that replica 0 set", i,
                                  r->n, t0->v[k].name);
            sum += r->values[i].v[slot].value;
        }
        st = keel_step_set_value(&s->st, t0->v[k].name, sum / r->n);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* ---- construction ------------------------------------------------------- */

void
keel_session_config_init(keel_session_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    keel_session_manager_config_init(&cfg->manager);
    cfg->is_chief = 1;
    cfg->max_wait_secs = KEEL__DEFAULT_MAX_WAIT_SECS;
    cfg->max_recovery_attempts = 8;
    cfg->backoff_ms = KEEL__DEFAULT_RETRY_MS;
    cfg->backoff_max_ms = 5000;
    cfg->stop_grace_period_secs = KEEL__DEFAULT_STOP_GRACE_SECS;
    cfg->replicas = 1;
}

static void
stop_with(keel_session *s, keel_end_reason why)
{
    if (!s->is_stopped) {
        s->is_stopped = 1;
        s->reason = why;
    }
}

static keel_status
hook_error(keel_status st, const keel_hook *h, const char *where,
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

static void refresh_slot(keel_session *s, size_t k);

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
                refresh_slot(s, i);     // has_failed: no clock deadlines
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

static void
alarm_stop(step_alarm *a)
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

static int
alarm_is_up(const keel_session *s)
{
    return atomic_load_explicit(&s->alarm.is_up, memory_order_relaxed);
}

/* The aggregates over the slots the step path tests first. */
static void
update_wakes(keel_session *s)
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
            update_wakes(s);            // once: no clock deadlines now
    }
}

/* Ask hook k again when its calls can next do something. */
static void
refresh_slot(keel_session *s, size_t k)
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

/* Create (or re-create) the session: the creator, then every hook's
 * after_create_session in order. */
static keel_status
create_once(keel_session *s, int is_recovery)
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
            return hook_error(st, h, "after_create_session",
                              keel_vars_global_step(s->vars));
    }
    // after_create_session moves timers (CheckpointSaver) and resolves
    // StopAtStep's last step.
    for (i = 0; i < s->n_hooks; i++)
        refresh_slot(s, i);
    update_wakes(s);
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

static keel_status
create_with_retry(keel_session *s, int is_recovery)
{
    int attempt = 0;
    for (;;) {
        keel_status st = create_once(s, is_recovery);
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

static keel_status
optimizer_apply(void *ctx, keel_vars *vs, keel_grads *grads,
                int64_t global_step)
{
    return keel_optimizer_apply(ctx, vs, grads, global_step);
}

keel_updater
keel_optimizer_updater(keel_optimizer *opt)
{
    keel_updater u = { opt, optimizer_apply, KEEL_UPDATER_OPTIMIZER };
    return u;
}

static keel_status
sn_check_config(const keel_session_config *cfg)
{
    keel_status st;
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "session: config is NULL");
    if ((st = KEEL__STRUCT_CHECK(cfg, keel_session_config)) != KEEL_OK)
        return keel__wrap(st, "session");
    if (cfg->manager.vars == NULL || cfg->step == NULL)
        return keel__fail(KEEL_EINVAL, "session: config needs vars and step");
    if (cfg->n_hooks > 0 && cfg->hooks == NULL)
        return keel__fail(KEEL_EINVAL, "session: n_hooks %zu but hooks NULL",
                          cfg->n_hooks);
    if (cfg->manager.scaffold != NULL
        && (st = KEEL__STRUCT_CHECK(cfg->manager.scaffold, keel_scaffold))
           != KEEL_OK)
        return keel__wrap(st, "session: scaffold");
    if (cfg->max_recovery_attempts < 0 || cfg->backoff_ms < 0
        || cfg->backoff_max_ms < 0)
        return keel__fail(KEEL_EINVAL, "session: negative recovery setting");
    if (cfg->replicas < 0 || cfg->replicas > KEEL_MAX_REPLICAS)
        return keel__fail(KEEL_EINVAL, "session: replicas = %d out of range "
                          "(1..%d)", cfg->replicas, KEEL_MAX_REPLICAS);
    if (cfg->manager.backend != NULL)
        return keel__backend_check(cfg->manager.backend, "session");
    return KEEL_OK;
}

/* The step, the updater (the backend's wins), recovery and stop settings. */
static void
sn_take_settings(keel_session *s, const keel_session_config *cfg,
                 int is_recovering)
{
    s->vars = cfg->manager.vars;
    s->step = cfg->step;
    s->step_ctx = cfg->step_ctx;
    s->updater = cfg->updater;
    if (cfg->manager.backend != NULL) {
        keel__backend_copy(&s->backend, cfg->manager.backend);
        if (s->backend.updater.apply != NULL && cfg->updater.apply != NULL)
            keel__log(KEEL_LOG_WARN, "session: the updater given is not "
                      "used: backend '%s' applies the updates (on a "
                      "cluster, give the rule as "
                      "keel_cluster_config.optimizer)",
                      s->backend.name != NULL ? s->backend.name : "?");
        if (s->backend.updater.apply != NULL)
            s->updater = s->backend.updater;
    }
    s->is_chief = cfg->creator.create != NULL || cfg->is_chief;
    s->is_recovering = is_recovering;
    s->skip_grad_zeroing = cfg->skip_grad_zeroing;
    s->max_attempts = cfg->max_recovery_attempts;
    s->backoff_ms = cfg->backoff_ms > 0 ? cfg->backoff_ms : 1;
    s->backoff_max_ms = cfg->backoff_max_ms > s->backoff_ms
                        ? cfg->backoff_max_ms : s->backoff_ms;
    s->grace_secs = cfg->stop_grace_period_secs;
    s->meta_fn = cfg->meta_fn;
    s->meta_ctx = cfg->meta_ctx;
    s->st.s = s;
    s->rc.s = s;
    s->rc.values = &s->values;
    s->rv.values = &s->values;
}

/* Copy the caller's hooks (each checked by its struct_size) and index
 * which of them run before and after a step, and when they next wake. */
static keel_status
sn_add_hooks(keel_session *s, const keel_session_config *cfg)
{
    size_t n = cfg->n_hooks;
    if (n == 0) {
        s->min_after_ns = KEEL_WAKE_NEVER;
        update_wakes(s);
        return KEEL_OK;
    }
    s->hooks = calloc(n, sizeof *s->hooks);
    s->before_idx = calloc(n, sizeof *s->before_idx);
    s->after_idx = calloc(n, sizeof *s->after_idx);
    s->slots = calloc(n, sizeof *s->slots);
    s->always_before = calloc(n, sizeof *s->always_before);
    s->always_after = calloc(n, sizeof *s->always_after);
    if (s->hooks == NULL || s->before_idx == NULL || s->after_idx == NULL
        || s->slots == NULL || s->always_before == NULL
        || s->always_after == NULL)
        return keel__fail(KEEL_ENOMEM, "session: %zu hooks", n);
    for (size_t i = 0; i < n; i++) {
        const keel_hook *h = &cfg->hooks[i];
        if (h->struct_size == 0 || h->struct_size > sizeof(keel_hook))
            return keel__fail(KEEL_EINVAL, "session: hook %zu ('%s') has "
                              "struct_size %u (this libkeel knows up to "
                              "%zu): start it with keel_hook_init()", i,
                              h->name != NULL ? h->name : "?",
                              h->struct_size, sizeof(keel_hook));
        memcpy(&s->hooks[i], h, h->struct_size);
        if (keel__hook_reads_step_time(&s->hooks[i]))
            s->needs_step_time = 1;
    }
    s->n_hooks = n;
    for (size_t i = 0; i < n; i++) {
        if (s->hooks[i].before_run != NULL)
            s->before_idx[s->n_before++] = i;
        if (s->hooks[i].after_run != NULL)
            s->after_idx[s->n_after++] = i;
    }
    assert(s->n_before <= n && s->n_after <= n);
    s->min_after_ns = KEEL_WAKE_NEVER;
    for (size_t i = 0; i < n; i++)
        refresh_slot(s, i);
    update_wakes(s);
    return KEEL_OK;
}

/* The saver for checkpoint_dir (the scaffold's settings), if any. */
static keel_status
sn_open_saver(keel_session *s, const keel_session_config *cfg)
{
    keel_saver_config sc;
    keel_status st;
    if (cfg->manager.checkpoint_dir == NULL)
        return KEEL_OK;
    if (cfg->manager.scaffold != NULL)
        sc = cfg->manager.scaffold->saver;
    else
        keel_saver_config_init(&sc);
    sc.dir = cfg->manager.checkpoint_dir;
    st = keel__ckpt->saver_new(&sc, &s->saver);
    if (st != KEEL_OK)
        return keel__wrap(st, "session: open checkpoint dir %s",
                          cfg->manager.checkpoint_dir);
    return KEEL_OK;
}

/* The caller's session creator, or a SessionManager's chief or worker
 * creator. */
static keel_status
sn_make_creator(keel_session *s, const keel_session_config *cfg)
{
    keel_status st;
    if (cfg->creator.create != NULL) {
        s->creator = cfg->creator;
        return KEEL_OK;
    }
    st = keel_session_manager_new(&cfg->manager, &s->sm);
    if (st != KEEL_OK)
        return st;
    keel_session_manager_set_max_wait(s->sm, cfg->max_wait_secs);
    s->creator = cfg->is_chief ? keel_chief_creator(s->sm)
                               : keel_worker_creator(s->sm);
    return KEEL_OK;
}

/* Every hook's begin(), in order; the first failure stops. */
static keel_status
sn_begin_hooks(keel_session *s)
{
    for (size_t i = 0; i < s->n_hooks; i++) {
        const keel_hook *h = &s->hooks[i];
        keel_status st;
        if (h->begin == NULL)
            continue;
        st = h->begin(h->ctx);
        if (st != KEEL_OK)
            return hook_error(st, h, "begin", 0);
    }
    return KEEL_OK;
}

keel_status
keel__session_new(const keel_session_config *cfg, int is_recovering,
                  keel_hook *owned, size_t n_owned, keel_session **out)
{
    keel_session *s = NULL;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "session: out is NULL");
    *out = NULL;
    st = sn_check_config(cfg);
    if (st != KEEL_OK)
        goto fail;
    s = calloc(1, sizeof *s);
    if (s == NULL) {
        st = keel__fail(KEEL_ENOMEM, "session: %zu bytes", sizeof *s);
        goto fail;
    }
    s->owned = owned;               /* freed with s from here on */
    s->n_owned = n_owned;
    owned = NULL;
    sn_take_settings(s, cfg, is_recovering);
    st = sn_add_hooks(s, cfg);
    if (st == KEEL_OK) {
        s->gs = keel__vars_global_step_ptr(s->vars);
        st = keel_coord_new(&s->coord);
    }
    if (st == KEEL_OK) {
        s->coord_stop = keel__coord_stop_flag(s->coord);
        st = keel_grads_new(s->vars, &s->grads);
    }
    if (st == KEEL_OK) {
        s->st.grads = s->grads;
        s->st.values = &s->values;
        s->st.n_replicas = 1;
        if (cfg->replicas > 1)
            st = replicas_new(s, cfg->replicas);
    }
    if (st == KEEL_OK)
        st = sn_open_saver(s, cfg);
    if (st == KEEL_OK)
        st = sn_make_creator(s, cfg);
    if (st == KEEL_OK)
        st = sn_begin_hooks(s);
    if (st == KEEL_OK)
        st = create_with_retry(s, 0);
    if (st != KEEL_OK)
        goto fail;
    *out = s;
    return KEEL_OK;
fail:
    if (s != NULL) {
        s->is_closed = 1;           // no end(): the session never existed
        keel_session_free(s);
    } else if (owned != NULL) {
        for (size_t i = 0; i < n_owned; i++)
            keel_hook_release(&owned[i]);
        free(owned);
    }
    return st;
}

keel_status
keel_session_new(const keel_session_config *cfg, keel_session **out)
{
    return keel__session_new(cfg, 1, NULL, 0, out);
}

keel_status
keel_session_new_singular(const keel_session_config *cfg, keel_session **out)
{
    return keel__session_new(cfg, 0, NULL, 0, out);
}

/* ---- running ------------------------------------------------------------ */

/* before_run of every hook not idle at global step gs, in order. */
static keel_status
run_before(keel_session *s, int64_t gs)
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
                       ? st : hook_error(st, h, "before_run", gs);
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
            refresh_slot(s, k);
            is_changed = 1;
        }
        if (st != KEEL_OK) {
            if (st != KEEL_EOUTOFRANGE)     // a feeder ran out of input
                st = hook_error(st, h, "before_run", gs);
            break;
        }
    }
    if (is_changed)
        update_wakes(s);
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
    return hook_error(st, &s->hooks[k], "after_run", after);
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
static keel_status
run_after(keel_session *s, int64_t gs, int64_t after)
{
    keel_run_context *rc = &s->rc;
    int64_t chain_prev = s->chain_prev;
    int has_chain_prev = s->has_chain_prev;
    int is_alarm_up = alarm_is_up(s);
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
            refresh_slot(s, k);
            is_changed = 1;
        }
        if (st != KEEL_OK) {
            if (is_changed)
                update_wakes(s);
            return after_failed(s, k, chain_prev, has_chain_prev, after,
                                st);
        }
    }
    if (is_changed)
        update_wakes(s);
    return st;
}

/* The run context of a step at gs on batch: nothing requested, no stop;
 * values set before this step no longer count. */
static void
run_context_reset(keel_session *s, const void *batch, int64_t gs)
{
    keel_run_context *rc = &s->rc;
    rc->batch = batch;
    rc->has_batch = batch != NULL;
    rc->is_stop_requested = 0;
    rc->n_requested = 0;
    rc->global_step = gs;
    rc->hook_name = NULL;
    s->values.gen++;
}

/* The hooks' before_run unless every hook is idle. A hook that refreshed
 * the shared state (GlobalStepWaiterHook on a cluster worker) moves the
 * step to the global step it fetched (*gs). */
static keel_status
run_before_hooks(keel_session *s, int64_t *gs)
{
    keel_status st;
    if (!(*gs >= s->before_min || s->n_chains >= s->before_chain_min
          || s->has_armed))
        return KEEL_OK;
    st = run_before(s, *gs);
    if (st != KEEL_OK)
        return st;
    if (*s->gs != *gs)
        s->rc.global_step = *gs = *s->gs;
    return KEEL_OK;
}

/* Every value a hook requested for the step at gs was set by it. */
static keel_status
check_requested(const keel_session *s, int64_t gs)
{
    const keel_run_context *rc = &s->rc;
    for (size_t i = 0; i < rc->n_requested; i++) {
        const keel__value *v = &s->values.v[rc->requested[i]];
        if (v->set_gen != s->values.gen)
            return keel__fail(KEEL_ENOTFOUND, "hook '%s' requested value "
                              "'%s' but the step at global step %lld did not "
                              "set it (keel_step_set_value)",
                              rc->requested_by[i] ? rc->requested_by[i] : "?",
                              v->name, (long long)gs);
    }
    return KEEL_OK;
}

/* The step's gradients into the variables unless the step applied them:
 * keel's optimizer on the replicas' idle threads (the same bits), or the
 * updater. */
static keel_status
apply_update(keel_session *s, int64_t gs)
{
    keel_status st = KEEL_OK;
    if (s->st.is_applied)
        return KEEL_OK;
    if (s->updater.kind == KEEL_UPDATER_OPTIMIZER && s->updater.apply != NULL
        && s->rep != NULL)
        st = keel__optimizer_apply_pooled(s->updater.ctx, s->vars, s->grads,
                                          gs, 0, s->rep->pool);
    else if (s->updater.apply != NULL)
        st = s->updater.apply(s->updater.ctx, s->vars, s->grads, gs);
    else if (!s->is_updateless_told && s->grads != NULL
             && keel_grads_count(s->grads) > 0) {
        s->is_updateless_told = 1;
        keel__log(KEEL_LOG_WARN, "session: no update rule: the gradients "
                  "of %zu trainable variables are discarded at every step "
                  "(set keel_training_config.optimizer or "
                  "keel_session_config.updater, or call "
                  "keel_step_mark_applied in a step that updates the "
                  "variables itself)", keel_grads_count(s->grads));
    }
    if (st != KEEL_OK)
        return keel__wrap(st, "apply gradients at step %lld",
                          (long long)gs);
    return KEEL_OK;
}

/* The global step after the step at gs (gs + 1 unless the step or the
 * update moved it) and the run values' step counts; returns it. */
static int64_t
advance_step(keel_session *s, int64_t gs)
{
    int64_t after = *s->gs;
    if (after == gs)
        *s->gs = after = gs + 1;
    s->local_step++;
    s->rv.step_before = gs;
    s->rv.step_after = after;
    s->rv.local_step = s->local_step;
    return after;
}

/* The hooks' after_run for the step from gs to after (started at t0)
 * unless every hook is idle, then a stop one of them requested. */
static keel_status
run_after_hooks(keel_session *s, int64_t gs, int64_t after, int64_t t0)
{
    keel_status st;
    s->rv.start_ns = t0;
    s->rv.duration_ns = s->needs_step_time ? keel__now_mono_ns() - t0 : 0;
    s->n_chains++;
    if (after >= s->after_min || s->n_behind > 0 || alarm_is_up(s)
        || (s->has_stall_hook
            && (!s->has_chain_prev || s->chain_prev == gs))) {
        st = run_after(s, gs, after);
        if (st != KEEL_OK)
            return st;
    } else {
        s->chain_prev = gs;             // every hook idle: all reached
        s->has_chain_prev = 1;
    }
    if (s->rc.is_stop_requested)
        stop_with(s, KEEL_END_STOP_REQUESTED);
    return KEEL_OK;
}

/* One attempt at one step: hooks before, the step callback (or the
 * replicas), the update, the global step, hooks after. Hooks are skipped
 * while their calls would do nothing (hook_slot): skipping keeps the order
 * of the calls made. */
static keel_status
run_once(keel_session *s, const void *batch, int with_hooks)
{
    int64_t gs = *s->gs, after, t0 = 0;
    keel_status st;
    run_context_reset(s, batch, gs);
    if (with_hooks && (st = run_before_hooks(s, &gs)) != KEEL_OK)
        return st;
    s->st.batch = s->rc.batch;
    s->st.is_applied = 0;
    s->st.global_step = gs;
    if (!s->skip_grad_zeroing && s->rep == NULL)
        keel_grads_zero(s->grads);
    // Two clock reads are a third of keel's cost on a short step: only
    // when a hook can see them (a user hook or the profiler).
    if (with_hooks && s->needs_step_time)
        t0 = keel__now_mono_ns();
    st = s->rep != NULL ? replicas_step(s, s->rc.batch, gs)
                        : s->step(s->step_ctx, &s->st);
    if (st == KEEL_OK)
        st = check_requested(s, gs);
    if (st == KEEL_OK)
        st = apply_update(s, gs);
    if (st != KEEL_OK)
        return st;
    after = advance_step(s, gs);
    if (!with_hooks)
        return KEEL_OK;
    return run_after_hooks(s, gs, after, t0);
}

/* Notice stops from outside the step (signal, coordinator). */
static int
check_stop(keel_session *s)
{
    // One test on the step path: nothing stopped, no signal, no request.
    if (!(s->is_closed | s->is_stopped | keel__signal_flag
          | atomic_load_explicit(s->coord_stop, memory_order_acquire)))
        return 0;
    if (s->is_closed || s->is_stopped)
        return 1;
    if (keel__signal_pending()) {
        keel__log(KEEL_LOG_INFO, "signal %d received: stopping at global "
                  "step %lld", (int)keel__signal_pending(),
                  (long long)keel_vars_global_step(s->vars));
        stop_with(s, KEEL_END_SIGNAL);
        return 1;
    }
    if (keel_coord_should_stop(s->coord)) {
        stop_with(s, keel_coord_error(s->coord, NULL, 0) != KEEL_OK
                     ? KEEL_END_ERROR : KEEL_END_STOP_REQUESTED);
        return 1;
    }
    return 0;
}

/* Whether the session may run a step: KEEL_OK, or why not. */
static keel_status
run_allowed(keel_session *s)
{
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "run: NULL session");
    if (s->is_closed)
        return keel__fail(KEEL_ESTATE, "run: session is closed");
    if (s->is_stopped)
        return keel__fail(KEEL_ESTATE, "Run called even after should_stop "
                          "requested (%s)", keel_end_reason_name(s->reason));
    if (check_stop(s)) {
        if (s->reason == KEEL_END_SIGNAL)
            return keel__fail(KEEL_ECANCELLED, "run: stopped by signal %d "
                              "before global step %lld",
                              (int)keel__signal_pending(),
                              (long long)keel_vars_global_step(s->vars));
        return keel__fail(KEEL_ESTATE, "Run called even after should_stop "
                          "requested (%s)", keel_end_reason_name(s->reason));
    }
    return KEEL_OK;
}

/* A step (or the session creation before it) failed with st: KEEL_OK to
 * try it again (a recoverable error with attempts left, after the
 * backoff), else the session stops and the status to return. */
static keel_status
after_failed_step(keel_session *s, keel_status st, int *attempt)
{
    if (st == KEEL_ECANCELLED) {
        /* A wait inside the step or its update (a cluster's sync step)
         * ended by a stop: a signal, or another replica that ended the
         * job. Nothing of the step was applied: the session stops at the
         * step it was at, as at a step boundary. */
        keel__log(KEEL_LOG_INFO, "the step at global step %lld was given "
                  "up: %s", (long long)keel_vars_global_step(s->vars),
                  keel_last_error());
        if (!check_stop(s))
            stop_with(s, KEEL_END_STOP_REQUESTED);
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
        check_stop(s);
        stop_with(s, KEEL_END_STOP_REQUESTED);
        return bst;
    }
    if (st == KEEL_EOUTOFRANGE) {
        keel__log(KEEL_LOG_INFO, "end of input at global step %lld",
                  (long long)keel_vars_global_step(s->vars));
        stop_with(s, KEEL_END_OUT_OF_RANGE);
        return st;
    }
    if (keel_status_is_recoverable(st) && s->is_recovering)
        st = keel__wrap(st, "gave up after %d recovery attempts", *attempt);
    stop_with(s, KEEL_END_ERROR);
    return st;
}

/* One step, re-creating the session and trying again after recoverable
 * errors (MonitoredSession); a step that cannot run stops the session. */
static keel_status
run(keel_session *s, const void *batch, int with_hooks)
{
    int attempt = 0;
    keel_status st = run_allowed(s);
    while (st == KEEL_OK) {
        if (s->needs_create)
            st = create_once(s, 1);
        if (st == KEEL_OK)
            st = run_once(s, batch, with_hooks);
        if (st == KEEL_OK)
            return KEEL_OK;
        st = after_failed_step(s, st, &attempt);
    }
    return st;
}

/* A step, hooks included, computes with subnormals flushed to zero. */
static keel_status
run_flushed(keel_session *s, const void *batch, int with_hooks)
{
    return KEEL__FLUSHED(run(s, batch, with_hooks));
}

keel_status
keel_session_run(keel_session *s, const void *batch)
{
    return run_flushed(s, batch, 1);
}

keel_status
keel_session_run_without_hooks(keel_session *s, const void *batch)
{
    return run_flushed(s, batch, 0);
}

int
keel_session_should_stop(keel_session *s)
{
    return check_stop(s);
}

keel_status
keel_session_train(keel_session *s)
{
    while (!keel_session_should_stop(s)) {
        keel_status st = keel_session_run(s, NULL);
        if (st == KEEL_EOUTOFRANGE || st == KEEL_ECANCELLED)
            return KEEL_OK;
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

void
keel_session_request_stop(keel_session *s, const char *why)
{
    if (s == NULL)
        return;
    if (!s->is_stopped)
        keel__log(KEEL_LOG_INFO, "stop requested at global step %lld: %s",
                  (long long)keel_vars_global_step(s->vars),
                  why != NULL ? why : "");
    stop_with(s, KEEL_END_STOP_REQUESTED);
}

keel_status
keel_session_collect_meta(keel_session *s, keel_ckpt_meta *meta)
{
    keel_ckpt_meta_init(meta);
    if (s->meta_fn == NULL)
        return KEEL_OK;
    return s->meta_fn(s->meta_ctx, meta);
}

keel_status
keel_session_prepare_save(keel_session *s)
{
    keel_status st;
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "prepare save: NULL session");
    if (s->backend.before_save == NULL)
        return KEEL_OK;
    st = s->backend.before_save(s->backend.ctx, s->vars);
    if (st != KEEL_OK)
        return keel__wrap(st, "backend '%s' before the checkpoint at step "
                          "%lld", s->backend.name ? s->backend.name : "?",
                          (long long)keel_vars_global_step(s->vars));
    return KEEL_OK;
}

void
keel__session_set_cleanup(keel_session *s, void (*fn)(void *ctx), void *ctx)
{
    s->cleanup = fn;
    s->cleanup_ctx = ctx;
}

keel_status
keel_session_save_now(keel_session *s, char *path, size_t path_size)
{
    keel_ckpt_meta meta;
    keel_status st;
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "save now: NULL session");
    if (s->saver == NULL)
        return keel__fail(KEEL_ESTATE, "save now: the session has no "
                          "checkpoint_dir");
    st = keel_session_prepare_save(s);
    if (st != KEEL_OK)
        return st;
    st = keel_session_collect_meta(s, &meta);
    if (st != KEEL_OK)
        return keel__wrap(st, "save now: meta_fn");
    return keel__ckpt->saver_save(s->saver, s->vars, &meta, path, path_size);
}

keel_status
keel_session_close(keel_session *s)
{
    size_t i;
    keel_status st, end_st = KEEL_OK;
    char end_err[KEEL_ERR_MAX];
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "close: NULL session");
    if (s->is_closed)
        return KEEL_OK;
    check_stop(s);
    if (!s->is_stopped)
        stop_with(s, KEEL_END_CLEAN);
    assert(s->is_stopped);
    keel__log(KEEL_LOG_INFO, "session ending at global step %lld: %s",
              (long long)keel_vars_global_step(s->vars),
              keel_end_reason_name(s->reason));
    /* Every hook's end runs; the first failure (a final checkpoint not
     * on disk) is close's status, its message kept past the calls after
     * it. */
    for (i = 0; i < s->n_hooks; i++) {
        const keel_hook *h = &s->hooks[i];
        keel_status hs;
        if (h->end == NULL || (hs = h->end(h->ctx, s, s->reason)) == KEEL_OK)
            continue;
        if (end_st == KEEL_OK) {
            end_st = hs;
            snprintf(end_err, sizeof end_err, "hook '%s' end: %s",
                     h->name != NULL ? h->name : "?", keel_last_error());
        }
    }
    s->is_closed = 1;
    alarm_stop(&s->alarm);
    keel_coord_request_stop(s->coord, KEEL_OK, NULL);
    st = keel_coord_join(s->coord, (int64_t)(s->grace_secs * 1000), 1);
    if (s->saver != NULL) {
        keel_status ws = keel__ckpt->saver_wait(s->saver);
        if (ws != KEEL_OK && end_st == KEEL_OK) {
            end_st = ws;
            snprintf(end_err, sizeof end_err, "final checkpoint: %s",
                     keel_last_error());
        }
    }
    if (st == KEEL_OK && end_st != KEEL_OK)
        st = keel__fail(end_st, "%s", end_err);
    if (s->backend.end != NULL)
        s->backend.end(s->backend.ctx, s->vars, s->is_chief,
                       st == KEEL_OK ? s->reason : KEEL_END_ERROR);
    return st;
}

keel_end_reason
keel_session_end_reason(const keel_session *s)
{
    return s->reason;
}

void
keel_session_free(keel_session *s)
{
    size_t i;
    if (s == NULL)
        return;
    if (!s->is_closed)
        keel_session_close(s);
    alarm_stop(&s->alarm);
    keel_coord_free(s->coord);
    if (s->saver != NULL)
        keel__ckpt->saver_free(s->saver);
    replicas_free(s->rep);
    keel_grads_free(s->grads);
    keel_session_manager_free(s->sm);
    free(s->hooks);
    free(s->before_idx);
    free(s->after_idx);
    free(s->slots);
    free(s->always_before);
    free(s->always_after);
    for (i = 0; i < s->n_owned; i++)
        keel_hook_release(&s->owned[i]);
    free(s->owned);
    if (s->cleanup != NULL)
        s->cleanup(s->cleanup_ctx);
    free(s);
}

keel_vars *
keel_session_vars(keel_session *s)
{
    return s->vars;
}

keel_coord *
keel_session_coord(keel_session *s)
{
    return s->coord;
}

int64_t
keel_session_global_step(const keel_session *s)
{
    return keel_vars_global_step(s->vars);
}

keel_status
keel_session_refresh(keel_session *s)
{
    char why[512] = "";
    int is_ready = 1;
    keel_status st;
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "session refresh: session is NULL");
    if (s->backend.fetch == NULL)
        return KEEL_OK;
    st = s->backend.fetch(s->backend.ctx, s->vars, &is_ready, why,
                          sizeof why);
    if (st != KEEL_OK)
        return keel__wrap(st, "backend '%s' fetch",
                          s->backend.name ? s->backend.name : "?");
    if (!is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "backend '%s': the shared "
                          "state is not ready (%s)",
                          s->backend.name ? s->backend.name : "?",
                          why[0] ? why : "no reason given");
    return KEEL_OK;
}

keel_status
keel_session_read_shared_step(keel_session *s, int64_t *step)
{
    keel_status st = KEEL_OK;
    if (s == NULL || step == NULL)
        return keel__fail(KEEL_EINVAL, "read shared step: session or step "
                          "is NULL");
    if (s->backend.read_global_step != NULL) {
        st = s->backend.read_global_step(s->backend.ctx, step);
        return st == KEEL_OK ? KEEL_OK
               : keel__wrap(st, "backend '%s' read_global_step",
                            s->backend.name ? s->backend.name : "?");
    }
    st = keel_session_refresh(s);
    *step = keel_vars_global_step(s->vars);
    return st;
}

keel_saver *
keel_session_saver(keel_session *s)
{
    return s->saver;
}

int
keel_session_creation_count(const keel_session *s)
{
    return s->n_creations;
}

keel_session_manager *
keel_session_get_manager(keel_session *s)
{
    return s->sm;
}
