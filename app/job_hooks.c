/* job_hooks.c - the training job's hooks: feed, stop at
 * train.max_steps, the NaN check and the profiler on every replica; on
 * the chief, progress (keel_job_config.progress_fn) and the end of an
 * epoch (its checkpoint, validation with its events, epoch_fn). */
#include <config.h>

#include <stdint.h>
#include <string.h>

#include <keel/config.h>
#include <keel/events.h>
#include <keel/hooks.h>
#include <keel/job.h>
#include <keel/session.h>
#include <keel/distributed.h>
#include "util.h"
#include "app_int.h"
#include "job_int.h"

static keel_status
progress_after_run(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    keel__job *j = ctx;
    keel_job_progress p;
    int64_t now = keel__now_mono_ns();
    double dt = (now - j->last_report_ns) / 1e9;
    (void)rc;
    if (j->opts.progress_fn == NULL)
        return KEEL_OK;
    memset(&p, 0, sizeof p);
    p.global_step = keel_run_values_step_after(v);
    p.last_step = j->last_step;
    p.epoch = keel_data_iter_epoch(j->it);
    p.loss = keel_run_values_get(v, "loss");
    p.accuracy = keel_run_values_get(v, "accuracy");
    p.examples_per_sec = dt > 0 ? (j->examples - j->last_report_examples) / dt
                                : 0.0;
    p.global_examples_per_sec = dt > 0
        ? (double)((p.global_step - j->last_report_gstep) *
                   j->examples_per_gstep) / dt : 0.0;
    p.learning_rate = keel_run_values_get(v, "learning_rate");
    p.steps_per_epoch = j->steps_per_epoch;
    p.epochs = keel_config_int(j->cfg, "train.epochs");
    p.elapsed_secs = (now - j->t0_ns) / 1e9;
    j->last_report_ns = now;
    j->last_report_examples = j->examples;
    j->last_report_gstep = p.global_step;
    j->opts.progress_fn(j->opts.progress_ctx, &p);
    return KEEL_OK;
}

static keel_status
progress_before_run(void *ctx, keel_run_context *rc)
{
    (void)ctx;
    keel_status st = keel_run_context_request(rc, "loss");
    if (st == KEEL_OK)
        st = keel_run_context_request(rc, "accuracy");
    if (st == KEEL_OK)
        st = keel_run_context_request(rc, "learning_rate");
    return st;
}

/* Epoch e's end is an end-of-epoch checkpoint (checkpoint.save_epochs)
 * and this task saves. */
static int
epoch_saves(const keel__job *j, keel_session *s, int64_t e)
{
    return j->save_epochs > 0 && e % j->save_epochs == 0 &&
           keel_session_saver(s) != NULL;
}

/* The end-of-epoch checkpoint, its path into ep. save_now pulls the ps's
 * state first (the backend's before_save). */
static keel_status
epoch_save(keel_session *s, keel_job_epoch *ep)
{
    keel_status st = keel_session_save_now(s, ep->checkpoint,
                                           sizeof ep->checkpoint);
    if (st != KEEL_OK)
        return keel__wrap(st, "checkpoint at the end of epoch %lld",
                          (long long)ep->epoch);
    keel__log(KEEL_LOG_INFO, "saved end-of-epoch checkpoint: %s",
              ep->checkpoint);
    return KEEL_OK;
}

/* validation/loss and validation/accuracy at step g, flushed. */
static keel_status
validation_events(keel__job *j, int64_t g, const keel_eval_result *er)
{
    keel_status st = keel_events_scalar(j->val_events, g, "validation/loss",
                                        er->loss);
    if (st == KEEL_OK)
        st = keel_events_scalar(j->val_events, g, "validation/accuracy",
                                er->accuracy);
    if (st == KEEL_OK)
        st = keel_events_flush(j->val_events);
    if (st != KEEL_OK)
        return keel__wrap(st, "validation events");
    return KEEL_OK;
}

/* The test set evaluated on the session's variables (a cluster chief
 * pulls them first unless pull is 0: a save just did), into ep, the log
 * and the validation events. */
static keel_status
epoch_validate(keel__job *j, keel_session *s, int pull, keel_job_epoch *ep)
{
    keel_eval_result er;
    keel_status st;
    if (j->worker != NULL && pull &&
        (st = keel_cluster_backend_pull(j->worker)) != KEEL_OK)
        return keel__wrap(st, "validation after epoch %lld",
                          (long long)ep->epoch);
    st = keel__validator_run(j->validator, keel_session_vars(s), &er);
    if (st != KEEL_OK)
        return keel__wrap(st, "validation after epoch %lld",
                          (long long)ep->epoch);
    ep->validated = 1;
    ep->val_loss = er.loss;
    ep->val_accuracy = er.accuracy;
    ep->val_examples = er.examples;
    keel__log(KEEL_LOG_INFO, "validation after epoch %lld (step %lld): "
              "loss %.4f accuracy %.4f (%lld examples)",
              (long long)ep->epoch, (long long)ep->global_step, er.loss,
              er.accuracy, (long long)er.examples);
    if (j->val_events != NULL)
        return validation_events(j, ep->global_step, &er);
    return KEEL_OK;
}

/* The chief's end of an epoch: the learning rate (Keras's PrintLR), the
 * end-of-epoch checkpoint, validation, then the caller's epoch_fn. */
static keel_status
epoch_after_run(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    keel__job *j = ctx;
    keel_session *s = keel_run_context_session(rc);
    int64_t g = keel_run_values_step_after(v), e;
    keel_job_epoch ep;
    int saves;
    keel_status st;
    if (j->steps_per_epoch <= 0 || g <= 0 || g % j->steps_per_epoch != 0)
        return KEEL_OK;
    e = g / j->steps_per_epoch;
    if (e <= j->epoch_done)
        return KEEL_OK;
    j->epoch_done = e;
    memset(&ep, 0, sizeof ep);
    ep.epoch = e;
    ep.global_step = g;
    ep.learning_rate = keel_run_values_get(v, "learning_rate");
    /* debug: keel train prints its own epoch line (epoch_fn) */
    keel__log(KEEL_LOG_DEBUG, "epoch %lld ended at step %lld: learning rate "
              "for epoch %lld was %g", (long long)e, (long long)g,
              (long long)e, ep.learning_rate);
    saves = epoch_saves(j, s, e);
    if (saves && (st = epoch_save(s, &ep)) != KEEL_OK)
        return st;
    if (j->validator != NULL && e % j->validate_epochs == 0 &&
        (st = epoch_validate(j, s, !saves, &ep)) != KEEL_OK)
        return st;
    if (j->opts.epoch_fn != NULL)
        j->opts.epoch_fn(j->opts.progress_ctx, &ep);
    return KEEL_OK;
}

/* The hooks every replica runs: feed, stop at train.max_steps, a
 * worker's NaN check, the profiler (r->hooks[0..r->n_hooks)); the NaN
 * hook in r->nan (r->has_nan). What it made train_free releases. */
static keel_status
train_step_hooks(keel__train_run *r)
{
    const keel_config *cfg = r->cfg;
    keel_feed_fn_hook_config feed_cfg;
    keel_stop_at_step_hook_config stop_cfg;
    keel_nan_hook_config nan_cfg;
    keel_profiler_hook_config prof_cfg;
    int64_t max_steps, every;
    keel_status st;

    keel_feed_fn_hook_config_init(&feed_cfg);
    feed_cfg.fn = keel__job_feed;
    feed_cfg.ctx = &r->j;
    st = keel_feed_fn_hook_new(&feed_cfg, &r->hooks[r->n_hooks]);
    if (st == KEEL_OK)
        r->n_hooks++;
    max_steps = keel_config_int(cfg, "train.max_steps");
    if (st == KEEL_OK && max_steps > 0) {
        keel_stop_at_step_hook_config_init(&stop_cfg);
        stop_cfg.last_step = max_steps;
        st = keel_stop_at_step_hook_new(&stop_cfg, &r->hooks[r->n_hooks]);
        if (st == KEEL_OK)
            r->n_hooks++;
    }
    if (st == KEEL_OK && keel_config_bool(cfg, "hooks.nan_check")) {
        keel_nan_hook_config_init(&nan_cfg);
        nan_cfg.fail_on_inf = keel_config_bool(cfg, "hooks.inf_check");
        st = keel_nan_hook_new(&nan_cfg, &r->nan);
        r->has_nan = st == KEEL_OK;
        /* A worker checks among its hooks; the chief before its saver
         * (chief-only hooks run first), so that the step whose loss is
         * NaN fails before a checkpoint of its update is written. */
        if (r->has_nan && !r->is_chief)
            r->hooks[r->n_hooks++] = r->nan;
    }
    every = keel_config_int(cfg, "hooks.profile_steps");
    if (st == KEEL_OK && every > 0) {
        keel_profiler_hook_config_init(&prof_cfg);
        prof_cfg.save_steps = every;
        prof_cfg.output_dir = keel_config_str(cfg, "checkpoint.dir");
        st = keel_profiler_hook_new(&prof_cfg, &r->hooks[r->n_hooks]);
        if (st == KEEL_OK)
            r->n_hooks++;
    }
    return st;
}

/* The chief-only hooks (the chief's NaN check first, before its saver;
 * progress; epoch_end) in r->chief_hooks, the job's epoch settings and,
 * with train.validate_every_epochs, the chief's validator and its event
 * file. Takes st, the status so far: builds the validator only on OK. */
static keel_status
train_chief_hooks(keel__train_run *r, keel_status st)
{
    const keel_config *cfg = r->cfg;
    keel__job *j = &r->j;
    keel_hook *ch = r->chief_hooks;

    if (r->has_nan && r->is_chief)
        *ch++ = r->nan;
    ch[0].struct_size = sizeof ch[0];
    ch[0].name = "progress";
    ch[0].ctx = j;
    ch[0].before_run = progress_before_run;
    ch[0].after_run = progress_after_run;
    ch[1].struct_size = sizeof ch[1];
    ch[1].name = "epoch_end";
    ch[1].ctx = j;
    ch[1].before_run = progress_before_run;
    ch[1].after_run = epoch_after_run;
    r->n_chief_hooks = (size_t)(ch - r->chief_hooks) + 2;
    j->save_epochs = keel_config_int(cfg, "checkpoint.save_epochs");
    j->validate_epochs = keel_config_int(cfg, "train.validate_every_epochs");
    j->examples_per_gstep = j->rule_sync ? j->global_batch
        : j->global_batch / r->replicas;
    /* local steps: each replica's own mean gradient */
    j->local_norm = !j->opt_slots;
    if (st == KEEL_OK && r->is_chief && j->validate_epochs > 0) {
        char vdir[KEEL_PATH_MAX];
        st = keel__validator_new(cfg, &j->validator);
        if (st == KEEL_OK)
            st = keel__path_join(vdir, sizeof vdir,
                                 keel_config_str(cfg, "checkpoint.dir"),
                                 "validation");
        if (st == KEEL_OK)
            st = keel__fs_mkdirs(vdir);
        if (st == KEEL_OK)
            st = keel_events_open(vdir, NULL, &j->val_events);
    }
    return st;
}

/* Build the hooks: the mirrored replicas' models, the step hooks and the
 * chief's. What it made train_free releases. */
keel_status
keel__job_hooks(keel__train_run *r)
{
    keel_status st;

    if (r->strategy == KEEL_STRATEGY_MIRRORED &&
        (st = keel__job_mirrored_build(&r->j, r->cfg)) != KEEL_OK)
        return st;
    st = train_step_hooks(r);
    return train_chief_hooks(r, st);
}
