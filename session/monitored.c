/* monitored.c - MonitoredSession and SingularMonitoredSession: the step
 * (user callback, updater, global step), the hook chain around it, bounded
 * recovery with exponential backoff, sticky stop, ending with a reason,
 * save-now / run-without-hooks, and the SIGTERM/SIGINT stop flag. The step
 * path does not allocate. */
#include <config.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "session_int.h"

struct keel_step {
    keel_session *s;
    const void *batch;
    int is_applied;
    int64_t global_step;
};

struct keel_session {
    keel_vars *vars;
    keel_step_fn step;
    void *step_ctx;
    keel_updater updater;
    keel_hook *hooks;
    size_t n_hooks;
    /* The hooks with a before_run / after_run, in order: the step path
     * walks only these (index into hooks). */
    size_t *before_idx, *after_idx;
    size_t n_before, n_after;
    keel_hook *owned;               /* built-in hooks this session frees */
    size_t n_owned;
    keel_session_creator creator;
    keel_session_manager *sm;       /* owned; NULL with a custom creator */
    keel_coord *coord;
    keel_saver *saver;
    keel_grads *grads;
    keel__values values;
    keel_step st;
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
};

/* ---- signals ------------------------------------------------------------ */

static volatile sig_atomic_t g_signal;
static struct sigaction g_old_term, g_old_int;
static int g_is_installed;

static void
on_signal(int sig)
{
    g_signal = sig;
}

keel_status
keel_session_install_signal_handlers(void)
{
    struct sigaction sa;
    if (g_is_installed)
        return KEEL_OK;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &sa, &g_old_term) != 0
        || sigaction(SIGINT, &sa, &g_old_int) != 0)
        return keel__fail(KEEL_EIO, "install SIGTERM/SIGINT handlers failed");
    g_is_installed = 1;
    return KEEL_OK;
}

void
keel_session_uninstall_signal_handlers(void)
{
    if (!g_is_installed)
        return;
    sigaction(SIGTERM, &g_old_term, NULL);
    sigaction(SIGINT, &g_old_int, NULL);
    g_is_installed = 0;
}

int
keel_session_signal_received(void)
{
    return g_signal;
}

void
keel_session_clear_signal(void)
{
    g_signal = 0;
}

int
keel__signal_pending(void)
{
    return g_signal;
}

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
    return st->s->grads;
}

int64_t
keel_step_global_step(const keel_step *st)
{
    return st->global_step;
}

keel_status
keel_step_set_value(keel_step *st, const char *name, double v)
{
    keel__values *t = &st->s->values;
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

/* ---- construction ------------------------------------------------------- */

void
keel_session_config_init(keel_session_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->is_chief = 1;
    cfg->max_wait_secs = 1800;
    cfg->recovery_wait_ms = 50;
    cfg->max_recovery_attempts = 8;
    cfg->backoff_ms = 50;
    cfg->backoff_max_ms = 5000;
    cfg->stop_grace_period_secs = 120;
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
    keel_status code = keel_status_is_recoverable(st) ? st : KEEL_EHOOK;
    return keel__wrap(code, "hook '%s' %s at step %lld",
                      h->name != NULL ? h->name : "?", where,
                      (long long)step);
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
                  "%d/%d", keel_status_str(st), keel_last_error(),
                  attempt + 1, s->max_attempts);
        st = backoff(s, attempt);
        if (st != KEEL_OK)
            return st;
        attempt++;
        is_recovery = 1;
    }
}

keel_status
keel__session_new(const keel_session_config *cfg, int is_recovering,
                  keel_hook *owned, size_t n_owned, keel_session **out)
{
    keel_session *s = NULL;
    size_t i;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "session: out is NULL");
    *out = NULL;
    if (cfg == NULL || cfg->vars == NULL || cfg->step == NULL)
        st = keel__fail(KEEL_EINVAL, "session: config needs vars and step");
    else if (cfg->n_hooks > 0 && cfg->hooks == NULL)
        st = keel__fail(KEEL_EINVAL, "session: n_hooks %zu but hooks NULL",
                        cfg->n_hooks);
    else if (cfg->max_recovery_attempts < 0 || cfg->backoff_ms < 0
             || cfg->backoff_max_ms < 0)
        st = keel__fail(KEEL_EINVAL, "session: negative recovery setting");
    else
        st = KEEL_OK;
    if (st != KEEL_OK)
        goto fail;
    s = calloc(1, sizeof *s);
    if (s == NULL) {
        st = keel__fail(KEEL_ENOMEM, "session: %zu bytes", sizeof *s);
        goto fail;
    }
    s->owned = owned;
    s->n_owned = n_owned;
    owned = NULL;
    s->vars = cfg->vars;
    s->step = cfg->step;
    s->step_ctx = cfg->step_ctx;
    s->updater = cfg->updater;
    if (cfg->backend != NULL && cfg->backend->updater.apply != NULL)
        s->updater = cfg->backend->updater;
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
    if (cfg->n_hooks > 0) {
        s->hooks = calloc(cfg->n_hooks, sizeof *s->hooks);
        if (s->hooks == NULL) {
            st = keel__fail(KEEL_ENOMEM, "session: %zu hooks", cfg->n_hooks);
            goto fail;
        }
    }
    for (i = 0; i < cfg->n_hooks; i++) {
        const keel_hook *h = &cfg->hooks[i];
        if (h->struct_size == 0 || h->struct_size > sizeof(keel_hook)) {
            st = keel__fail(KEEL_EINVAL, "session: hook %zu ('%s') has "
                            "struct_size %u (expected %zu)", i,
                            h->name != NULL ? h->name : "?", h->struct_size,
                            sizeof(keel_hook));
            goto fail;
        }
        memcpy(&s->hooks[i], h, h->struct_size);
        if (keel__hook_reads_step_time(&s->hooks[i]))
            s->needs_step_time = 1;
    }
    s->n_hooks = cfg->n_hooks;
    if (cfg->n_hooks > 0) {
        s->before_idx = calloc(cfg->n_hooks, sizeof *s->before_idx);
        s->after_idx = calloc(cfg->n_hooks, sizeof *s->after_idx);
        if (s->before_idx == NULL || s->after_idx == NULL) {
            st = keel__fail(KEEL_ENOMEM, "session: %zu hooks", cfg->n_hooks);
            goto fail;
        }
    }
    for (i = 0; i < s->n_hooks; i++) {
        if (s->hooks[i].before_run != NULL)
            s->before_idx[s->n_before++] = i;
        if (s->hooks[i].after_run != NULL)
            s->after_idx[s->n_after++] = i;
    }
    st = keel_coord_new(&s->coord);
    if (st != KEEL_OK)
        goto fail;
    st = keel_grads_new(s->vars, &s->grads);
    if (st != KEEL_OK)
        goto fail;
    if (cfg->checkpoint_dir != NULL) {
        keel_saver_config sc;
        if (cfg->scaffold != NULL)
            sc = cfg->scaffold->saver;
        else
            keel_saver_config_init(&sc);
        sc.dir = cfg->checkpoint_dir;
        st = keel__ckpt->saver_new(&sc, &s->saver);
        if (st != KEEL_OK) {
            st = keel__wrap(st, "session: open checkpoint dir %s",
                            cfg->checkpoint_dir);
            goto fail;
        }
    }
    if (cfg->creator.create != NULL) {
        s->creator = cfg->creator;
    } else {
        keel_session_manager_config mc;
        memset(&mc, 0, sizeof mc);
        mc.vars = cfg->vars;
        mc.scaffold = cfg->scaffold;
        mc.checkpoint_dir = cfg->checkpoint_dir;
        mc.restore_opts = cfg->restore_opts;
        mc.backend = cfg->backend;
        mc.recovery_wait_ms = cfg->recovery_wait_ms;
        mc.restore_fn = cfg->restore_fn;
        mc.restore_ctx = cfg->restore_ctx;
        st = keel_session_manager_new(&mc, &s->sm);
        if (st != KEEL_OK)
            goto fail;
        keel_session_manager_set_max_wait(s->sm, cfg->max_wait_secs);
        s->creator = cfg->is_chief ? keel_chief_creator(s->sm)
                                   : keel_worker_creator(s->sm);
    }
    for (i = 0; i < s->n_hooks; i++) {
        const keel_hook *h = &s->hooks[i];
        if (h->begin == NULL)
            continue;
        st = h->begin(h->ctx);
        if (st != KEEL_OK) {
            st = hook_error(st, h, "begin", 0);
            goto fail;
        }
    }
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
        for (i = 0; i < n_owned; i++)
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

/* One attempt at one step. */
static keel_status
run_once(keel_session *s, const void *batch, int with_hooks)
{
    keel_run_context *rc = &s->rc;
    int64_t gs = keel_vars_global_step(s->vars), t0 = 0;
    size_t i;
    keel_status st;
    rc->batch = batch;
    rc->has_batch = batch != NULL;
    rc->is_stop_requested = 0;
    rc->n_requested = 0;
    rc->global_step = gs;
    rc->hook_name = NULL;
    s->values.gen++;
    if (with_hooks) {
        for (i = 0; i < s->n_before; i++) {
            const keel_hook *h = &s->hooks[s->before_idx[i]];
            rc->hook_name = h->name;
            st = h->before_run(h->ctx, rc);
            if (st != KEEL_OK) {
                if (st == KEEL_EOUTOFRANGE)
                    return st;          // a feeder ran out of input
                return hook_error(st, h, "before_run", gs);
            }
        }
    }
    s->st.batch = rc->batch;
    s->st.is_applied = 0;
    s->st.global_step = gs;
    if (!s->skip_grad_zeroing)
        keel_grads_zero(s->grads);
    // Two clock reads are a third of keel's cost on a short step: only
    // when a hook can see them (a user hook or the profiler).
    if (with_hooks && s->needs_step_time)
        t0 = keel__now_mono_ns();
    st = s->step(s->step_ctx, &s->st);
    if (st != KEEL_OK)
        return st;
    for (i = 0; i < rc->n_requested; i++) {
        const keel__value *v = &s->values.v[rc->requested[i]];
        if (v->set_gen != s->values.gen)
            return keel__fail(KEEL_ENOTFOUND, "hook '%s' requested value "
                              "'%s' but the step at global step %lld did not "
                              "set it (keel_step_set_value)",
                              rc->requested_by[i] ? rc->requested_by[i] : "?",
                              v->name, (long long)gs);
    }
    if (!s->st.is_applied && s->updater.apply != NULL) {
        st = s->updater.apply(s->updater.ctx, s->vars, s->grads, gs);
        if (st != KEEL_OK)
            return keel__wrap(st, "apply gradients at step %lld",
                              (long long)gs);
    }
    if (keel_vars_global_step(s->vars) == gs)
        keel_vars_set_global_step(s->vars, gs + 1);
    s->local_step++;
    s->rv.step_before = gs;
    s->rv.step_after = keel_vars_global_step(s->vars);
    s->rv.local_step = s->local_step;
    if (!with_hooks)
        return KEEL_OK;
    s->rv.start_ns = t0;
    s->rv.duration_ns = s->needs_step_time ? keel__now_mono_ns() - t0 : 0;
    for (i = 0; i < s->n_after; i++) {
        const keel_hook *h = &s->hooks[s->after_idx[i]];
        rc->hook_name = h->name;
        st = h->after_run(h->ctx, rc, &s->rv);
        if (st != KEEL_OK)
            return hook_error(st, h, "after_run", s->rv.step_after);
    }
    if (rc->is_stop_requested)
        stop_with(s, KEEL_END_STOP_REQUESTED);
    return KEEL_OK;
}

/* Notice stops from outside the step (signal, coordinator). */
static int
check_stop(keel_session *s)
{
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

static keel_status
run(keel_session *s, const void *batch, int with_hooks)
{
    int attempt = 0;
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "run: NULL session");
    if (s->is_closed)
        return keel__fail(KEEL_ESTATE, "run: session is closed");
    if (s->is_stopped)
        return keel__fail(KEEL_ESTATE, "Run called even after should_stop "
                          "requested (%s)", keel_end_reason_str(s->reason));
    if (check_stop(s)) {
        if (s->reason == KEEL_END_SIGNAL)
            return keel__fail(KEEL_ECANCELLED, "run: stopped by signal %d "
                              "before global step %lld",
                              (int)keel__signal_pending(),
                              (long long)keel_vars_global_step(s->vars));
        return keel__fail(KEEL_ESTATE, "Run called even after should_stop "
                          "requested (%s)", keel_end_reason_str(s->reason));
    }
    for (;;) {
        keel_status st;
        if (s->needs_create) {
            st = create_once(s, 1);
            if (st != KEEL_OK)
                goto failed;
        }
        st = run_once(s, batch, with_hooks);
        if (st == KEEL_OK)
            return KEEL_OK;
failed:
        if (s->is_recovering && keel_status_is_recoverable(st)
            && attempt < s->max_attempts) {
            keel__log(KEEL_LOG_WARN, "recoverable error at global step "
                      "%lld (%s): %s; re-creating the session (attempt "
                      "%d/%d)", (long long)keel_vars_global_step(s->vars),
                      keel_status_str(st), keel_last_error(), attempt + 1,
                      s->max_attempts);
            s->needs_create = 1;
            /* The first re-creation is at once: what failed the step (a
             * restarted ps, a worker back) is usually over by the time it
             * is noticed, and the whole job waits on this step. Only
             * failures in a row back off (TF retries at once, forever). */
            st = backoff(s, attempt - 1);
            attempt++;
            if (st == KEEL_OK)
                continue;
            check_stop(s);
            stop_with(s, KEEL_END_STOP_REQUESTED);
            return st;
        }
        if (st == KEEL_EOUTOFRANGE) {
            keel__log(KEEL_LOG_INFO, "end of input at global step %lld",
                      (long long)keel_vars_global_step(s->vars));
            stop_with(s, KEEL_END_OUT_OF_RANGE);
            return st;
        }
        if (keel_status_is_recoverable(st) && s->is_recovering)
            st = keel__wrap(st, "gave up after %d recovery attempts",
                            attempt);
        stop_with(s, KEEL_END_ERROR);
        return st;
    }
}

keel_status
keel_session_run(keel_session *s, const void *batch)
{
    return run(s, batch, 1);
}

keel_status
keel_session_run_without_hooks(keel_session *s, const void *batch)
{
    return run(s, batch, 0);
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
    memset(meta, 0, sizeof *meta);
    if (s->meta_fn == NULL)
        return KEEL_OK;
    return s->meta_fn(s->meta_ctx, meta);
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
    st = keel_session_collect_meta(s, &meta);
    if (st != KEEL_OK)
        return keel__wrap(st, "save now: meta_fn");
    return keel__ckpt->saver_save(s->saver, s->vars, &meta, path, path_size);
}

keel_status
keel_session_close(keel_session *s)
{
    size_t i;
    keel_status st;
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "close: NULL session");
    if (s->is_closed)
        return KEEL_OK;
    check_stop(s);
    if (!s->is_stopped)
        stop_with(s, KEEL_END_CLEAN);
    keel__log(KEEL_LOG_INFO, "session ending at global step %lld: %s",
              (long long)keel_vars_global_step(s->vars),
              keel_end_reason_str(s->reason));
    for (i = 0; i < s->n_hooks; i++) {
        const keel_hook *h = &s->hooks[i];
        if (h->end != NULL)
            h->end(h->ctx, s, s->reason);
    }
    s->is_closed = 1;
    keel_coord_request_stop(s->coord, KEEL_OK, NULL);
    st = keel_coord_join(s->coord, (int64_t)(s->grace_secs * 1000), 1);
    if (s->saver != NULL) {
        keel_status ws = keel__ckpt->saver_wait(s->saver);
        if (st == KEEL_OK && ws != KEEL_OK)
            st = ws;
    }
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
    keel_coord_free(s->coord);
    if (s->saver != NULL)
        keel__ckpt->saver_free(s->saver);
    keel_grads_free(s->grads);
    keel_session_manager_free(s->sm);
    free(s->hooks);
    free(s->before_idx);
    free(s->after_idx);
    for (i = 0; i < s->n_owned; i++)
        keel_hook_release(&s->owned[i]);
    free(s->owned);
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

double
keel__session_grace_secs(const keel_session *s)
{
    return s->grace_secs;
}
