/* job.c - keel's own trainer (keel/job.h): keel_job_train builds the
 * model, data, optimizer and hooks a keel_config describes and runs them
 * under MonitoredTrainingSession. This file is the run from start to end:
 * the strategy and the task's role, the start, the session's settings, the
 * run loop, the check that it reached its end, the release; job_int.h
 * names the files that build the pieces. The glue between train/,
 * checkpoint/ and the session layer; no math lives here. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <keel/checkpoint.h>
#include <keel/cluster.h>
#include <keel/config.h>
#include <keel/hooks.h>
#include <keel/job.h>
#include <keel/distributed.h>
#include <keel/session.h>
#include <keel/train.h>
#include "util.h"
#include "app_int.h"
#include "job_int.h"

/* Steps the run will end at: max_steps and/or epochs, whichever first. */
static int64_t
planned_last_step(const keel__job *j)
{
    int64_t max_steps = keel_config_int(j->cfg, "train.max_steps");
    int64_t epochs = keel_config_int(j->cfg, "train.epochs");
    int64_t by_epochs = epochs > 0 ? epochs * j->steps_per_epoch : 0;
    if (max_steps > 0 && (by_epochs == 0 || max_steps < by_epochs))
        return max_steps;
    return by_epochs;
}

/* A chief or a process alone that ends cleanly must have reached its last
 * step; only a signal (a stop request) may end it before. keel train adds
 * no hook that stops early without an error, so anything else is a bug or
 * an outside stop, and the run must not look successful. at: the global
 * step training stopped at, before the final checkpoint. Under a
 * local-step rule the final checkpoint's step (the parameter servers'
 * count of committed steps, which its save reads back) may be lower by the
 * local steps not committed yet (docs/algorithms.md); the run still
 * reached its end. */
static keel_status
check_reached_end(const keel__job *j, const keel_session *s, int64_t at)
{
    keel_end_reason why = keel_session_end_reason(s);
    if (j->last_step <= 0 || at >= j->last_step || why == KEEL_END_SIGNAL)
        return KEEL_OK;
    return keel__fail(KEEL_EINTERNAL, "training ended (%s) at step %lld, "
                      "before its last step %lld, and not by a signal; "
                      "the newest checkpoint in %s resumes it",
                      keel_end_reason_name(why), (long long)at,
                      (long long)j->last_step,
                      keel_config_str(j->cfg, "checkpoint.dir"));
}

/* The session of j's run (hooks, strategy and gradient zeroing are the
 * caller's): its callbacks, the scaffold sc (the saver of the
 * [checkpoint] keys), where and how often it saves checkpoints and
 * summaries, how often it logs. */
static void
session_config_from(const keel_config *cfg, keel__job *j, keel_scaffold *sc,
                    keel_training_config *tc)
{
    static const char *const summary_names[] = { "loss", "accuracy",
                                                 "learning_rate" };
    int64_t every = keel_config_int(cfg, "checkpoint.save_steps");
    double secs = keel_config_double(cfg, "checkpoint.save_secs");
    keel_scaffold_init(sc);
    sc->ctx = j;
    sc->init = keel__job_init;
    keel_saver_config_init(&sc->saver);
    sc->saver.basename = keel_config_str(cfg, "checkpoint.basename");
    sc->saver.max_to_keep =
        (int)keel_config_int(cfg, "checkpoint.max_to_keep");
    sc->saver.keep_every_n_hours =
        keel_config_double(cfg, "checkpoint.keep_checkpoint_every_n_hours");
    sc->saver.is_async = keel_config_bool(cfg, "checkpoint.async");

    keel_training_config_init(tc);
    tc->session.manager.vars = j->vs;
    tc->session.step = keel__job_step;
    tc->session.step_ctx = j;
    tc->session.updater.ctx = j;
    tc->session.updater.apply = keel__job_apply;
    tc->session.manager.scaffold = sc;
    tc->session.meta_fn = keel__job_meta;
    tc->session.meta_ctx = j;
    tc->session.manager.restore_fn = keel__job_restore;
    tc->session.manager.restore_ctx = j;
    tc->session.manager.checkpoint_dir = keel_config_str(cfg, "checkpoint.dir");
    if (keel_config_str(cfg, "checkpoint.warm_start_from")[0] != '\0')
        tc->session.manager.warm_start_from =
            keel_config_str(cfg, "checkpoint.warm_start_from");
    if (keel_config_str(cfg, "checkpoint.warm_start_vars")[0] != '\0')
        tc->session.manager.warm_start_vars =
            keel_config_str(cfg, "checkpoint.warm_start_vars");
    tc->save_checkpoint_steps = every > 0 ? every : 0;
    tc->save_checkpoint_secs = every > 0 ? 0 : secs;
    if (j->save_epochs > 0 &&
        !keel_config_is_set(cfg, "checkpoint.save_steps") &&
        !keel_config_is_set(cfg, "checkpoint.save_secs"))
        secs = tc->save_checkpoint_secs = 0;   /* by epochs only */
    if (every <= 0 && secs <= 0)        /* only at start and at the end */
        tc->save_checkpoint_steps = INT64_MAX;
    tc->save_summaries_steps =
        keel_config_int(cfg, "hooks.summary_every_steps");
    tc->save_summaries_secs = 0;
    tc->summary_names = summary_names;
    tc->n_summary_names = 3;
    tc->log_step_count_steps = keel_config_int(cfg, "hooks.log_every_steps");
    tc->save_on_error = keel_config_bool(cfg, "checkpoint.save_on_error");
    if (j->replicas > 0)                        /* mirrored */
        tc->session.replicas = j->replicas;
}

void
keel_job_config_init(keel_job_config *opts)
{
    KEEL__STRUCT_INIT(opts);
}

/* Resolve train.strategy against r->in_cluster into r->strategy and
 * r->is_mwm; refuse a strategy (or K-FAC's mode) this process cannot
 * run. Acquires nothing. */
static keel_status
train_strategy(keel__train_run *r)
{
    const keel_config *cfg = r->cfg;
    keel_status st;

    st = keel_strategy_from_name(keel_config_str(cfg, "train.strategy"),
                                 &r->strategy);
    if (st != KEEL_OK)
        return keel__wrap(st, "train.strategy");
    r->strategy = keel_strategy_resolve(r->strategy, r->in_cluster);
    r->is_mwm = r->strategy == KEEL_STRATEGY_MULTI_WORKER_MIRRORED;
    if (r->is_mwm && (st = keel__job_mwm_check(cfg, r->in_cluster)) != KEEL_OK)
        return st;
    if (r->strategy == KEEL_STRATEGY_PARAMETER_SERVER && !r->in_cluster)
        return keel__fail(KEEL_EINVAL, "train.strategy = parameter_server "
                          "(%s) needs a cluster (TF_CONFIG, Slurm, [cluster] "
                          "or keel launch --ps N --workers M), and this "
                          "process has none; use one_device, mirrored or "
                          "auto", keel_config_origin(cfg, "train.strategy"));
    if (r->strategy != KEEL_STRATEGY_PARAMETER_SERVER && !r->is_mwm &&
        r->in_cluster)
        return keel__fail(KEEL_EINVAL, "train.strategy = %s (%s) trains in "
                          "one process, but this process is %s %d of a "
                          "cluster; use parameter_server (or auto) there",
                          keel_strategy_name(r->strategy),
                          keel_config_origin(cfg, "train.strategy"),
                          keel_task_type_name(
                              keel_cluster_spec_task_type(r->spec)),
                          keel_cluster_spec_task_index(r->spec));
    /* algorithm.name other than sync is refused by keel_config_validate */
    if (r->in_cluster &&
        strcmp(keel_config_str(cfg, "optimizer.name"), "kfac") == 0 &&
        keel_cluster_spec_mode(r->spec) != KEEL_CLUSTER_SYNC &&
        !keel_config_is_set(cfg, "algorithm.name"))
        return keel__fail(KEEL_EINVAL, "optimizer.name = kfac in a cluster "
                          "needs sync mode (cluster.mode = sync): the chief "
                          "applies each step's K-FAC update (docs/kfac.md)");
    return KEEL_OK;
}

/* Build r->j (model, data, optimizer) for this replica and its update
 * rule; on failure the caller frees r->j. */
static keel_status
train_build_job(keel__train_run *r)
{
    const keel_config *cfg = r->cfg;
    keel_status st;

    /* multi_worker_mirrored ranks that split the leaves unevenly read
     * the whole batch: the iterator's even slices would cut leaves */
    int even = !r->is_mwm ||
               keel_config_int(cfg, "train.leaves") % r->replicas == 0;
    /* so do elastic replicas: their leaves change with the membership */
    if (r->in_cluster && keel_config_bool(cfg, "cluster.elastic"))
        even = 0;
    st = keel__job_build(&r->j, cfg, even ? r->replica : 0,
                         even ? r->replicas : 1,
                         !r->in_cluster && !r->is_mwm &&
                         strcmp(keel_config_str(cfg, "algorithm.name"),
                                "hogwild") == 0,
                         !r->in_cluster && !r->is_mwm);
    if (st == KEEL_OK)
        st = keel__job_rule(&r->j, r->in_cluster ? r->spec : NULL);
    if (st == KEEL_OK && r->is_mwm)
        snprintf(r->j.topology, sizeof r->j.topology,
                 "multi_worker_mirrored ranks=%d batch=%lld leaves=%lld",
                 r->replicas, (long long)r->j.global_batch,
                 (long long)keel_config_int(cfg, "train.leaves"));
    return st;
}

/* Set up the signal handlers, the collective and the job. On failure
 * nothing is left held (train_free must not run); on success train_free
 * releases them. */
static keel_status
train_start(keel__train_run *r)
{
    int signals = r->opts != NULL && r->opts->handle_signals;
    int built = 0;
    keel_status st = KEEL_OK;

    /* Before loading the data: a SIGTERM during start-up then ends the run
     * cleanly (a chief with its checkpoint) instead of killing it. */
    if (signals && (st = keel_session_install_signal_handlers()) != KEEL_OK)
        return st;
    if (r->is_mwm)
        st = keel__job_ranks(r);
    if (st == KEEL_OK) {
        built = 1;
        st = train_build_job(r);
    }
    if (st != KEEL_OK) {
        keel_collective_free(r->coll);
        if (built)
            keel__job_free(&r->j);
        if (signals)
            keel_session_uninstall_signal_handlers();
        return st;
    }
    if (r->opts != NULL)
        r->j.opts = *r->opts;
    return KEEL_OK;
}

/* Refuse a train.micro_batch that does not split each replica's part of
 * the batch into at most 64 equal micro-batches (not for
 * multi_worker_mirrored, whose micro-batches are its leaves). */
static keel_status
train_micro_check(const keel__train_run *r)
{
    const keel__job *j = &r->j;
    int64_t slice;

    if (j->micro <= 0 || r->is_mwm)
        return KEEL_OK;
    slice = j->global_batch / r->replicas;
    if (j->global_batch % r->replicas != 0 || slice % j->micro != 0 ||
        slice / j->micro > 64)
        return keel__fail(KEEL_EINVAL, "train.micro_batch = %lld: each "
                          "of the %d replicas' %lld-example part of "
                          "train.batch_size = %lld must be a multiple of "
                          "it, at most 64 micro-batches",
                          (long long)j->micro, r->replicas,
                          (long long)slice, (long long)j->global_batch);
    return KEEL_OK;
}

/* Fill r->tc and r->sc, the training session's settings: the config's,
 * the hooks, K-FAC's roles, the micro-batches and the backend of a
 * collective or a cluster. */
static keel_status
train_session_config(keel__train_run *r)
{
    const keel_config *cfg = r->cfg;
    keel__job *j = &r->j;
    keel_status st;

    session_config_from(cfg, j, &r->sc, &r->tc);
    /* one process: keel__job_step zeroes the gradients unless
     * keel__job_apply left them zero (a replica pushes them and the
     * session zeroes them) */
    j->own_zeroing = !r->in_cluster && j->replicas <= 1;
    j->kfac_observes = r->is_chief;
    if (r->in_cluster && j->kfac != NULL &&
        (st = keel__job_kfac_roles(r)) != KEEL_OK)
        return st;
    r->tc.session.skip_grad_zeroing = j->own_zeroing;
    r->tc.session.hooks = r->hooks;
    r->tc.session.n_hooks = r->n_hooks;
    r->tc.chief_only_hooks = r->chief_hooks;
    r->tc.n_chief_only_hooks = r->n_chief_hooks;
    r->tc.strategy = r->strategy;
    j->micro = keel_config_int(cfg, "train.micro_batch");
    if ((st = train_micro_check(r)) != KEEL_OK)
        return st;
    if (r->is_mwm && (st = keel__job_mwm_backend(r)) != KEEL_OK)
        return st;
    if (r->in_cluster && (st = keel__job_cluster_backend(r)) != KEEL_OK)
        return st;
    j->fuse_update = j->own_zeroing && !r->in_cluster && !r->is_mwm &&
                     r->tc.session.manager.backend == NULL &&
                     r->tc.session.updater.apply == keel__job_apply;
    if (r->in_cluster || r->is_mwm) {
        r->tc.session.max_wait_secs =
            keel_config_double(cfg, "cluster.max_wait_secs");
        r->tc.session.stop_grace_period_secs =
            keel_config_double(cfg, "cluster.stop_grace_secs");
    }
    return KEEL_OK;
}

/* Open the training session in *out (caller owns). KEEL_OK with *out
 * NULL is a clean end with nothing to train: a worker whose chief
 * already finished, or a signal before training started. */
static keel_status
train_open(keel__train_run *r, keel_session **out)
{
    keel_session *s = NULL;
    keel_status st;

    *out = NULL;
    if (r->tc.session.manager.checkpoint_dir != NULL &&
        (st = keel__fs_mkdirs(r->tc.session.manager.checkpoint_dir)) != KEEL_OK)
        return st;
    st = keel_training_session_new(&r->tc, &s);
    if (st == KEEL_EOUTOFRANGE && r->in_cluster && !r->is_chief) {
        /* the chief finished and shut the ps down before we joined */
        keel__log(KEEL_LOG_INFO, "training already finished: %s",
                  keel_last_error());
        return KEEL_OK;
    }
    if (st == KEEL_ECANCELLED && keel_session_signal_received()) {
        /* SIGTERM while waiting for the chief or the ps: nothing trained,
         * nothing to save; a clean stop, like one in mid-run */
        keel__log(KEEL_LOG_INFO, "signal %d received before training "
                  "started: stopping (%s)", keel_session_signal_received(),
                  keel_last_error());
        if (r->result != NULL)
            r->result->end_reason = (int)KEEL_END_SIGNAL;
        return KEEL_OK;
    }
    if (st == KEEL_OK)
        *out = s;
    return st;
}

/* Before the run loop: the planned last step, the resume log line, the
 * result's start and the progress clocks. Cannot fail. */
static void
train_begin(keel__train_run *r, const keel_session *s)
{
    keel__job *j = &r->j;

    j->last_step = planned_last_step(j);
    if (j->restored)
        keel__log(KEEL_LOG_INFO, "resumed from %s at step %lld",
                  j->restored_from, (long long)keel_session_global_step(s));
    if (r->result != NULL) {
        r->result->start_step = keel_session_global_step(s);
        r->result->restored = j->restored;
        snprintf(r->result->restored_from, sizeof r->result->restored_from,
                 "%s", j->restored_from);
    }
    j->t0_ns = j->last_report_ns = keel__now_mono_ns();
    j->last_report_gstep = keel_session_global_step(s);
    if (j->steps_per_epoch > 0)
        j->epoch_done = j->last_report_gstep / j->steps_per_epoch;
}

/* After the run loop: the result's figures, the end check (the chief or
 * the one process must have reached the planned end; reached is the
 * step this replica stopped at) and the log line. Takes st, the run's
 * status so far, and returns the final one. */
static keel_status
train_end(keel__train_run *r, const keel_session *s, int64_t reached,
          keel_status st)
{
    const keel__job *j = &r->j;
    keel_job_result *result = r->result;

    if (result != NULL) {
        result->final_step = keel_session_global_step(s);
        result->examples = j->examples;
        result->cluster_examples = (result->final_step - result->start_step)
                                   * j->examples_per_gstep;
        result->seconds = (keel__now_mono_ns() - j->t0_ns) / 1e9;
        result->end_reason = (int)keel_session_end_reason(s);
    }
    if (st == KEEL_OK && (!r->in_cluster || r->is_chief))
        st = check_reached_end(j, s, reached);
    if (st == KEEL_OK && keel_session_global_step(s) < reached)
        keel__log(KEEL_LOG_INFO, "training ended (%s) at step %lld (the "
                  "parameter servers' committed steps; this replica "
                  "stopped at step %lld)",
                  keel_end_reason_name(keel_session_end_reason(s)),
                  (long long)keel_session_global_step(s), (long long)reached);
    else if (st == KEEL_OK)
        keel__log(KEEL_LOG_INFO, "training ended (%s) at step %lld",
                  keel_end_reason_name(keel_session_end_reason(s)),
                  (long long)keel_session_global_step(s));
    return st;
}

/* The run loop over session s (takes ownership: closed and freed here),
 * between train_begin and train_end. */
static keel_status
train_loop(keel__train_run *r, keel_session *s)
{
    keel_status st, cst;
    int64_t reached;

    train_begin(r, s);
    st = keel_session_train(s);
    reached = keel_session_global_step(s);
    if (r->j.own_step > reached) /* a sync local-step rule's chief pulled */
        reached = r->j.own_step; /* the center before its final save */
    cst = keel_session_close(s);
    if (st == KEEL_OK)
        st = cst;
    st = train_end(r, s, reached, st);
    keel_session_free(s);
    return st;
}

/* Release what a started run holds, in reverse order: the cluster
 * backend, the collective, the signal handlers, the hooks, the job.
 * Cannot fail. */
static void
train_free(keel__train_run *r)
{
    keel_cluster_backend_free(r->worker);
    /* after the session: MPI_Finalize (or, after a failure, not: the
     * launcher then ends the other ranks) */
    keel_collective_free(r->coll);
    if (r->j.opts.handle_signals)
        keel_session_uninstall_signal_handlers();
    for (size_t i = 0; i < r->n_hooks; i++)
        keel_hook_release(&r->hooks[i]);
    if (r->has_nan && r->is_chief)
        keel_hook_release(&r->nan);
    keel__job_free(&r->j);
}

keel_status
keel_job_train(const keel_config *cfg, const keel_job_config *opts,
               keel_job_result *result)
{
    keel__train_run r;
    keel_session *s = NULL;
    keel_status st;

    if (result != NULL)
        memset(result, 0, sizeof *result);
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "train: config is NULL");
    if (opts != NULL &&
        (st = KEEL__STRUCT_CHECK(opts, keel_job_config)) != KEEL_OK)
        return keel__wrap(st, "train");
    st = keel_config_validate(cfg);
    if (st != KEEL_OK)
        return st;
    memset(&r, 0, sizeof r);
    r.cfg = cfg;
    r.opts = opts;
    r.result = result;
    r.spec = opts ? opts->cluster : NULL;
    r.in_cluster = r.spec != NULL && !keel_cluster_spec_is_local(r.spec);
    r.is_chief = 1;
    r.replicas = 1;
    r.strategy = KEEL_STRATEGY_AUTO;
    if ((st = train_strategy(&r)) != KEEL_OK ||
        (r.in_cluster && (st = keel__job_cluster_role(&r)) != KEEL_OK))
        return st;
    if (r.is_ps)
        return keel__job_run_ps(cfg, r.spec, opts);
    if ((st = train_start(&r)) != KEEL_OK)
        return st;
    st = keel__job_hooks(&r);
    if (st == KEEL_OK)
        st = train_session_config(&r);
    if (st == KEEL_OK)
        st = train_open(&r, &s);
    if (st == KEEL_OK && s != NULL)
        st = train_loop(&r, s);
    train_free(&r);
    return st;
}
