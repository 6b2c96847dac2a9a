/* training.c - MonitoredTrainingSession: TF's arguments and defaults
 * resolved, the default chief hooks assembled in TF's order (chief-only,
 * StepCounter, SummarySaver, CheckpointSaver, then user hooks; workers get
 * only user hooks) and a recovering MonitoredSession returned. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <keel/distributed.h>
#include <keel/kfac_dist.h>
#include <keel/supervise.h>
#include "util.h"
#include "supervise_int.h"
#include "../session/session_int.h"

/* What a training session made for itself and frees with it: the
 * optimizer it applies alone, the spec it detected, the cluster backend. */
typedef struct training_owned {
    keel_optimizer *opt;
    keel_cluster_spec *spec;
    keel_cluster_backend *cluster;
    keel_backend backend;
} training_owned;

static void
training_owned_free(void *ctx)
{
    training_owned *o = ctx;
    if (o == NULL)
        return;
    keel_cluster_backend_free(o->cluster);
    keel_cluster_spec_free(o->spec);
    keel_optimizer_free(o->opt);
    free(o);
}

static const char *const strategy_names[KEEL_STRATEGY_COUNT] = {
    "auto", "one_device", "mirrored", "multi_worker_mirrored",
    "parameter_server"
};

const char *
keel_strategy_name(keel_strategy s)
{
    if ((int)s < 0 || (int)s >= KEEL_STRATEGY_COUNT)
        return "?";
    return strategy_names[s];
}

keel_status
keel_strategy_from_name(const char *name, keel_strategy *out)
{
    int i = 0;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "strategy: NULL argument");
    st = keel__name_lookup("strategy", name, strategy_names,
                           KEEL_STRATEGY_COUNT, &i);
    if (st == KEEL_OK)
        *out = (keel_strategy)i;
    return st;
}

keel_strategy
keel_strategy_resolve(keel_strategy s, int has_cluster)
{
    if (s != KEEL_STRATEGY_AUTO)
        return s;
    return has_cluster ? KEEL_STRATEGY_PARAMETER_SERVER
                       : KEEL_STRATEGY_ONE_DEVICE;
}

/* cfg's strategy against the cluster it has (has_cluster: tasks) and
 * sc->replicas (more than 1 only for mirrored). */
static keel_status
check_strategy(const keel_training_config *cfg, int has_cluster,
               keel_session_config *sc)
{
    keel_strategy s = keel_strategy_resolve(cfg->strategy, has_cluster);
    const char *name = keel_strategy_name(s);
    if ((int)s < 0 || (int)s >= KEEL_STRATEGY_COUNT)
        return keel__fail(KEEL_EINVAL, "training session: strategy %d is "
                          "not a keel_strategy", (int)cfg->strategy);
    if (s == KEEL_STRATEGY_MULTI_WORKER_MIRRORED) {
        /* a cluster and a backend together are refused after this */
        if (cfg->session.manager.backend == NULL)
            return keel__fail(KEEL_EINVAL, "training session: strategy "
                              "multi_worker_mirrored all-reduces over MPI: "
                              "set session.manager.backend from "
                              "keel_collective_session_backend");
        return KEEL_OK;
    }
    if (s == KEEL_STRATEGY_PARAMETER_SERVER && !has_cluster)
        return keel__fail(KEEL_EINVAL, "training session: strategy "
                          "parameter_server needs a cluster with ps tasks "
                          "(cluster, cluster_from_env); none was given");
    if (s != KEEL_STRATEGY_PARAMETER_SERVER && has_cluster)
        return keel__fail(KEEL_EINVAL, "training session: strategy %s "
                          "trains in one process, but a cluster with tasks "
                          "was given; use parameter_server (or auto) for "
                          "it", name);
    if (s != KEEL_STRATEGY_MIRRORED && sc->replicas > 1) {
        return keel__fail(KEEL_EINVAL, "training session: session.replicas "
                          "= %d needs strategy mirrored, not %s",
                          sc->replicas, name);
    }
    return KEEL_OK;
}

/* cfg->kfac_dist's replica and replicas against this task's: the spec's
 * (NULL: alone, replica 0 of 1). */
static keel_status
check_kfac_dist(const keel_training_config *cfg,
                const keel_cluster_spec *spec)
{
    const keel_kfac_dist_config *dc = keel__kfac_dist_config(cfg->kfac_dist);
    int replica = 0, replicas = 1;
    if (cfg->optimizer != NULL || cfg->session.updater.apply != NULL)
        return keel__fail(KEEL_EINVAL, "training session: kfac_dist is the "
                          "update rule; optimizer and session.updater must "
                          "be unset");
    if (spec != NULL) {
        replica = keel_cluster_spec_replica_index(spec);
        replicas = keel_cluster_spec_num_replicas(spec);
    }
    if (dc->replica != replica || dc->replicas != replicas)
        return keel__fail(KEEL_EINVAL, "training session: kfac_dist is for "
                          "replica %d of %d, but this task is replica %d of "
                          "%d (keel_kfac_dist_config.replica, .replicas)",
                          dc->replica, dc->replicas, replica, replicas);
    return KEEL_OK;
}

/* K-FAC on the cluster backend just made: the handle pulls and mixes
 * through it (roles mode), and a covariance or inverse worker's step ends
 * in its role's work instead of a push. */
static void
kfac_dist_attach(keel_kfac_dist *d, training_owned *own)
{
    if (keel__kfac_dist_config(d)->mode != KEEL_KFAC_DIST_ROLES)
        return;
    keel_kfac_dist_set_backend(d, own->cluster);
    if (keel_kfac_dist_role(d) != KEEL_KFAC_ROLE_GRADIENT) {
        keel_updater u = keel_kfac_dist_role_updater(d);
        own->backend.updater.ctx = u.ctx;
        own->backend.updater.apply = u.apply;
        own->backend.updater.kind = u.kind;     /* reads dense gradients */
    }
}

/* The update rule and the cluster of cfg into sc (and *own): a cluster
 * backend when the spec (given or detected) has tasks, with the spec's
 * is_chief and the cluster's max_wait_secs, else the optimizer (or
 * K-FAC) applied here. */
static keel_status
resolve_cluster(const keel_training_config *cfg, keel_session_config *sc,
                training_owned *own)
{
    const keel_cluster_spec *spec = cfg->cluster;
    keel_status st;
    if (spec == NULL && cfg->cluster_from_env) {
        st = keel_cluster_spec_detect(cfg->cluster_config, &own->spec);
        if (st != KEEL_OK)
            return keel__wrap(st, "training session: the cluster");
        spec = own->spec;
    }
    /* a backend of the caller's is shared state elsewhere: a cluster */
    st = check_strategy(cfg, (spec != NULL &&
                              !keel_cluster_spec_is_local(spec)) ||
                             cfg->session.manager.backend != NULL, sc);
    if (st != KEEL_OK)
        return st;
    if (spec != NULL && !keel_cluster_spec_is_local(spec)) {
        keel_cluster_config co;
        if (cfg->session.manager.backend != NULL)
            return keel__fail(KEEL_EINVAL, "training session: both a "
                              "cluster and session.manager.backend are set; "
                              "give one");
        if (keel_cluster_spec_is_ps(spec))
            return keel__fail(KEEL_EINVAL, "training session: this task is "
                              "ps %d, which trains nothing: call "
                              "keel_ps_run() on a ps task (see "
                              "keel_cluster_spec_is_ps)",
                              keel_cluster_spec_task_index(spec));
        if (cfg->cluster_config != NULL)
            co = *cfg->cluster_config;
        else
            keel_cluster_config_init(&co);
        if (co.optimizer == NULL)
            co.optimizer = cfg->optimizer;
        if (cfg->kfac_dist != NULL &&
            ((st = check_kfac_dist(cfg, spec)) != KEEL_OK ||
             (st = keel_kfac_dist_cluster_config(cfg->kfac_dist, &co)) !=
             KEEL_OK))
            return keel__wrap(st, "training session");
        st = keel_cluster_backend_new(spec, sc->manager.vars, &co,
                                      &own->cluster);
        if (st != KEEL_OK)
            return keel__wrap(st, "training session");
        keel_cluster_backend_session_backend(own->cluster, &own->backend);
        if (cfg->kfac_dist != NULL)
            kfac_dist_attach(cfg->kfac_dist, own);
        sc->manager.backend = &own->backend;
        sc->is_chief = keel_cluster_spec_is_chief(spec);
        sc->max_wait_secs = co.max_wait_secs;
        return KEEL_OK;
    }
    if (cfg->kfac_dist != NULL) {
        if ((st = check_kfac_dist(cfg, NULL)) != KEEL_OK)
            return st;
        sc->updater = keel_kfac_updater(keel__kfac_dist_kfac(cfg->kfac_dist));
        return KEEL_OK;
    }
    if (cfg->optimizer != NULL) {
        if (cfg->session.updater.apply != NULL)
            return keel__fail(KEEL_EINVAL, "training session: both "
                              "optimizer and session.updater are set; give "
                              "one");
        st = keel_optimizer_new(cfg->optimizer, &own->opt);
        if (st == KEEL_OK)
            st = keel_optimizer_prepare(own->opt, sc->manager.vars);
        if (st != KEEL_OK)
            return keel__wrap(st, "training session: optimizer");
        sc->updater = keel_optimizer_updater(own->opt);
    }
    return KEEL_OK;
}

void
keel_training_config_init(keel_training_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    keel_session_config_init(&cfg->session);
    cfg->save_checkpoint_secs = KEEL_USE_DEFAULT;
    cfg->save_checkpoint_steps = KEEL_USE_DEFAULT;
    cfg->save_summaries_steps = KEEL_USE_DEFAULT;
    cfg->save_summaries_secs = KEEL_USE_DEFAULT;
    cfg->log_step_count_steps = 100;
}

/* TF's USE_DEFAULT pair: secs defaults to dflt_secs (steps to dflt_steps)
 * only when both are defaulted; both positive is an error. */
static keel_status
resolve_pair(const char *what, double *secs, int64_t *steps,
             double dflt_secs, int64_t dflt_steps)
{
    int secs_default = *secs == KEEL_USE_DEFAULT;
    int steps_default = *steps == KEEL_USE_DEFAULT;
    if (secs_default && steps_default) {
        *secs = dflt_secs;
        *steps = dflt_steps;
    } else {
        if (secs_default)
            *secs = 0;
        if (steps_default)
            *steps = 0;
    }
    if (*secs < 0 || *steps < 0)
        return keel__fail(KEEL_EINVAL, "training session: %s_secs %g and "
                          "%s_steps %lld must be >= 0 (or KEEL_USE_DEFAULT)",
                          what, *secs, what, (long long)*steps);
    if (*secs > 0 && *steps > 0)
        return keel__fail(KEEL_EINVAL, "training session: both %s_secs (%g) "
                          "and %s_steps (%lld) are set; give only one",
                          what, *secs, what, (long long)*steps);
    return KEEL_OK;
}

/* The checkpoint and summary periods after resolve_pair. */
typedef struct save_periods {
    double ck_secs, sum_secs;
    int64_t ck_steps, sum_steps;
} save_periods;

/* The hooks a training session runs, in order (all), and those it made
 * itself (owned, which the session takes). */
typedef struct hook_list {
    keel_hook *all, *owned;
    size_t n_all, n_owned;
} hook_list;

static keel_status
check_training_config(const keel_training_config *cfg)
{
    keel_status st;
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "training session: config is NULL");
    if ((st = KEEL__STRUCT_CHECK(cfg, keel_training_config)) != KEEL_OK
        || (st = KEEL__STRUCT_CHECK(&cfg->session, keel_session_config))
           != KEEL_OK)
        return keel__wrap(st, "training session");
    if (cfg->session.manager.vars == NULL)
        return keel__fail(KEEL_EINVAL, "training session: config needs "
                          "session.manager.vars");
    return KEEL_OK;
}

static keel_status
resolve_periods(const keel_training_config *cfg, save_periods *p)
{
    keel_status st;
    p->ck_secs = cfg->save_checkpoint_secs;
    p->ck_steps = cfg->save_checkpoint_steps;
    p->sum_secs = cfg->save_summaries_secs;
    p->sum_steps = cfg->save_summaries_steps;
    st = resolve_pair("save_checkpoint", &p->ck_secs, &p->ck_steps, 600, 0);
    if (st == KEEL_OK)
        st = resolve_pair("save_summaries", &p->sum_secs, &p->sum_steps, 0,
                          100);
    return st;
}

/* Room for the chief-only hooks, the three default ones and the user's. */
static keel_status
hook_list_alloc(hook_list *hl, const keel_training_config *cfg)
{
    size_t cap = cfg->n_chief_only_hooks + 3 + cfg->session.n_hooks;
    hl->all = calloc(cap, sizeof *hl->all);
    hl->owned = calloc(3, sizeof *hl->owned);
    if (hl->all == NULL || hl->owned == NULL)
        return keel__fail(KEEL_ENOMEM, "training session: %zu hooks", cap);
    return KEEL_OK;
}

static void
hook_list_free(hook_list *hl)
{
    for (size_t i = 0; i < hl->n_owned; i++)
        keel_hook_release(&hl->owned[i]);
    free(hl->owned);
    free(hl->all);
}

/* Appends the hook a constructor made in the next owned slot; st is the
 * constructor's status (nothing is appended when it failed). */
static keel_status
hook_list_adopt(hook_list *hl, keel_status st)
{
    if (st == KEEL_OK)
        hl->all[hl->n_all++] = hl->owned[hl->n_owned++];
    return st;
}

static keel_status
new_step_counter(const keel_training_config *cfg, const char *summary_dir,
                 keel_hook *out)
{
    keel_step_counter_hook_config cc;
    keel_step_counter_hook_config_init(&cc);
    cc.every_n_steps = cfg->log_step_count_steps;
    cc.output_dir = summary_dir;
    cc.clock = cfg->clock;
    return keel_step_counter_hook_new(&cc, out);
}

static keel_status
new_summary_saver(const keel_training_config *cfg, const save_periods *p,
                  const char *summary_dir, keel_hook *out)
{
    static const char *const default_names[] = { "loss" };
    keel_summary_hook_config mc;
    keel_summary_hook_config_init(&mc);
    mc.names = cfg->n_summary_names > 0 ? cfg->summary_names
                                        : default_names;
    mc.n_names = cfg->n_summary_names > 0 ? cfg->n_summary_names : 1;
    mc.save_steps = p->sum_steps;
    mc.save_secs = p->sum_secs;
    mc.output_dir = summary_dir;
    mc.clock = cfg->clock;
    return keel_summary_hook_new(&mc, out);
}

static keel_status
new_ckpt_saver(const keel_training_config *cfg, const save_periods *p,
               keel_hook *out)
{
    keel_ckpt_hook_config hc;
    keel_ckpt_hook_config_init(&hc);
    hc.save_secs = p->ck_secs;
    hc.save_steps = p->ck_steps;
    hc.listeners = cfg->listeners;
    hc.n_listeners = cfg->n_listeners;
    hc.save_on_error = cfg->save_on_error;
    hc.clock = cfg->clock;
    return keel_ckpt_hook_new(&hc, out);
}

/* The chief's hooks in TF's order: chief-only, StepCounter,
 * SummarySaver, CheckpointSaver (each default one when its directory and
 * period are set). */
static keel_status
add_chief_hooks(const keel_training_config *cfg, const save_periods *p,
                const char *ckpt_dir, hook_list *hl)
{
    const char *summary_dir = cfg->summary_dir != NULL ? cfg->summary_dir
                                                       : ckpt_dir;
    keel_status st = KEEL_OK;
    for (size_t i = 0; i < cfg->n_chief_only_hooks; i++)
        hl->all[hl->n_all++] = cfg->chief_only_hooks[i];
    if (summary_dir != NULL && cfg->log_step_count_steps > 0)
        st = hook_list_adopt(hl, new_step_counter(cfg, summary_dir,
                                                  &hl->owned[hl->n_owned]));
    if (st == KEEL_OK && summary_dir != NULL &&
        (p->sum_secs > 0 || p->sum_steps > 0))
        st = hook_list_adopt(hl, new_summary_saver(cfg, p, summary_dir,
                                                   &hl->owned[hl->n_owned]));
    if (st == KEEL_OK && ckpt_dir != NULL &&
        (p->ck_secs > 0 || p->ck_steps > 0))
        st = hook_list_adopt(hl, new_ckpt_saver(cfg, p,
                                                &hl->owned[hl->n_owned]));
    return st;
}

/* Say what the session does about checkpoints: only what this task does
 * (a worker restores from the chief's, never writes one). */
static void
log_setup(const keel_session_config *sc, size_t n_hooks, const char *ckpt_dir,
          const save_periods *p)
{
    const char *who = sc->is_chief ? "chief" : "worker";
    if (ckpt_dir == NULL)
        keel__log(KEEL_LOG_INFO, "training session (%s): %zu hooks, "
                  "checkpoints off (no checkpoint_dir)", who, n_hooks);
    else if (!sc->is_chief)
        keel__log(KEEL_LOG_INFO, "training session (worker): %zu hooks, "
                  "checkpoints: written by the chief", n_hooks);
    else if (p->ck_secs > 0)
        keel__log(KEEL_LOG_INFO, "training session (chief): %zu hooks, "
                  "checkpoints %s every %g s", n_hooks, ckpt_dir, p->ck_secs);
    else if (p->ck_steps > 0)
        keel__log(KEEL_LOG_INFO, "training session (chief): %zu hooks, "
                  "checkpoints %s every %lld steps", n_hooks, ckpt_dir,
                  (long long)p->ck_steps);
    else
        keel__log(KEEL_LOG_INFO, "training session (chief): %zu hooks, "
                  "checkpoints restored from %s, no periodic saves "
                  "(save_checkpoint_secs and _steps are 0)", n_hooks,
                  ckpt_dir);
}

/* Check cfg, resolve its periods and cluster, assemble the hooks (the
 * chief's defaults, then the user's) and make a recovering session that
 * owns what was made here. */
keel_status
keel_training_session_new(const keel_training_config *cfg,
                          keel_session **out)
{
    keel_session_config sc;
    hook_list hl = { 0 };
    save_periods per;
    training_owned *own;
    const char *ckpt_dir;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "training session: out is NULL");
    *out = NULL;
    st = check_training_config(cfg);
    if (st == KEEL_OK)
        st = resolve_periods(cfg, &per);
    if (st != KEEL_OK)
        return st;
    sc = cfg->session;
    ckpt_dir = sc.manager.checkpoint_dir;
    own = calloc(1, sizeof *own);
    if (own == NULL)
        return keel__fail(KEEL_ENOMEM, "training session");
    st = resolve_cluster(cfg, &sc, own);
    if (st == KEEL_OK)
        st = hook_list_alloc(&hl, cfg);
    if (st == KEEL_OK && sc.is_chief)
        st = add_chief_hooks(cfg, &per, ckpt_dir, &hl);
    if (st != KEEL_OK) {
        hook_list_free(&hl);
        training_owned_free(own);
        return st;
    }
    for (size_t i = 0; i < cfg->session.n_hooks; i++)
        hl.all[hl.n_all++] = cfg->session.hooks[i];
    sc.hooks = hl.all;
    sc.n_hooks = hl.n_all;
    sc.manager.checkpoint_dir = sc.is_chief ? ckpt_dir : NULL;
    log_setup(&sc, hl.n_all, ckpt_dir, &per);
    /* the session takes the owned hooks and copies the list */
    st = keel__session_new(&sc, 1, hl.owned, hl.n_owned, out);
    free(hl.all);
    if (st == KEEL_OK)
        keel__session_set_cleanup(*out, training_owned_free, own);
    else
        training_owned_free(own);
    return st;
}
