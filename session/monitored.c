/* monitored.c - MonitoredSession and SingularMonitoredSession: the
 * session's construction from its config, the step (user callback or
 * replicas, updater, global step) with the hooks around it, save-now and
 * run-without-hooks, close and free. The step path does not allocate.
 * Around it: the step and replicas (step.c), calling the hooks
 * (hook_calls.c), creation and recovery (recover.c) and stopping
 * (stop.c); monitored_int.h has what they share. */
#include <config.h>

#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "defaults.h"
#include "util.h"
#include "monitored_int.h"
#include "../numeric/numeric_int.h"

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
        keel__session_update_wakes(s);
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
        keel__session_refresh_slot(s, i);
    keel__session_update_wakes(s);
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
            return keel__session_hook_error(st, h, "begin", 0);
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
            st = keel__session_replicas_new(s, cfg->replicas);
    }
    if (st == KEEL_OK)
        st = sn_open_saver(s, cfg);
    if (st == KEEL_OK)
        st = sn_make_creator(s, cfg);
    if (st == KEEL_OK)
        st = sn_begin_hooks(s);
    if (st == KEEL_OK)
        st = keel__session_create_with_retry(s, 0);
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
    st = keel__session_run_before(s, *gs);
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
    /* keel's optimizers apply gradient rows lazily, the cluster backend
     * pushes them as rows; another updater reads dense gradients only */
    if (s->updater.kind != KEEL_UPDATER_OPTIMIZER &&
        s->updater.kind != KEEL_UPDATER_ROWS)
        keel_grads_densify(s->grads);
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
    if (after >= s->after_min || s->n_behind > 0
        || keel__session_alarm_is_up(s)
        || (s->has_stall_hook
            && (!s->has_chain_prev || s->chain_prev == gs))) {
        st = keel__session_run_after(s, gs, after);
        if (st != KEEL_OK)
            return st;
    } else {
        s->chain_prev = gs;             // every hook idle: all reached
        s->has_chain_prev = 1;
    }
    if (s->rc.is_stop_requested)
        keel__session_stop_with(s, KEEL_END_STOP_REQUESTED);
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
    st = s->rep != NULL ? keel__session_replicas_step(s, s->rc.batch, gs)
                        : s->step(s->step_ctx, &s->st);
    if (st == KEEL_OK)
        st = check_requested(s, gs);
    if (st == KEEL_OK && s->grads != NULL) {
        keel__session_metrics_out(s);
        st = apply_update(s, gs);
        if (st == KEEL_OK)
            st = keel__session_metrics_in(s);
    } else if (st == KEEL_OK) {
        st = apply_update(s, gs);
    }
    if (st != KEEL_OK)
        return st;
    after = advance_step(s, gs);
    if (!with_hooks)
        return KEEL_OK;
    return run_after_hooks(s, gs, after, t0);
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
    if (keel__session_check_stop(s)) {
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

/* One step, re-creating the session and trying again after recoverable
 * errors (MonitoredSession); a step that cannot run stops the session. */
static keel_status
run(keel_session *s, const void *batch, int with_hooks)
{
    int attempt = 0;
    keel_status st = run_allowed(s);
    while (st == KEEL_OK) {
        if (s->needs_create)
            st = keel__session_create_once(s, 1);
        if (st == KEEL_OK)
            st = run_once(s, batch, with_hooks);
        if (st == KEEL_OK)
            return KEEL_OK;
        st = keel__session_after_failed_step(s, st, &attempt);
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
    return keel_session_write_checkpoint(s, s->saver, &meta, path,
                                         path_size);
}

keel_status
keel_session_write_checkpoint(keel_session *s, keel_saver *saver,
                              const keel_ckpt_meta *meta, char *path,
                              size_t path_size)
{
    if (s == NULL || saver == NULL)
        return keel__fail(KEEL_EINVAL, "write checkpoint: NULL %s",
                          s == NULL ? "session" : "saver");
    if (s->backend.save != NULL)
        return s->backend.save(s->backend.ctx, saver, s->vars, meta, path,
                               path_size);
    return keel__ckpt->saver_save(saver, s->vars, meta, path, path_size);
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
    keel__session_check_stop(s);
    if (!s->is_stopped)
        keel__session_stop_with(s, KEEL_END_CLEAN);
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
    keel__session_alarm_stop(&s->alarm);
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

void
keel_session_free(keel_session *s)
{
    size_t i;
    if (s == NULL)
        return;
    if (!s->is_closed)
        keel_session_close(s);
    keel__session_alarm_stop(&s->alarm);
    keel_coord_free(s->coord);
    if (s->saver != NULL)
        keel__ckpt->saver_free(s->saver);
    keel__session_replicas_free(s->rep);
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

int
keel_session_find_value(const keel_session *s, const char *name, double *out)
{
    int slot;
    if (s == NULL || name == NULL ||
        (slot = keel__values_find(&s->values, name)) < 0 ||
        s->values.v[slot].set_gen != s->values.gen)
        return 0;
    if (out != NULL)
        *out = s->values.v[slot].value;
    return 1;
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
