/* training.c - MonitoredTrainingSession: TF's arguments and defaults
 * resolved, the default chief hooks assembled in TF's order (chief-only,
 * StepCounter, SummarySaver, CheckpointSaver, then user hooks; workers get
 * only user hooks) and a recovering MonitoredSession returned. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <keel/distributed.h>
#include "util.h"
#include "session_int.h"
#include "../train/train_int.h"

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
    st = keel__train_name_lookup("strategy", name, strategy_names,
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
        if (cfg->session.backend == NULL)
            return keel__fail(KEEL_EINVAL, "training session: strategy "
                              "multi_worker_mirrored all-reduces over MPI: "
                              "set session.backend from "
                              "keel_collective_get_backend");
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

/* The update rule and the cluster of cfg into sc (and *own): a cluster
 * backend when the spec (given or detected) has tasks, with the spec's
 * is_chief and the cluster's max_wait_secs, else the optimizer applied
 * here. */
static keel_status
resolve_cluster(const keel_training_config *cfg, keel_session_config *sc,
                training_owned *own)
{
    const keel_cluster_spec *spec = cfg->cluster;
    keel_status st;
    if (spec == NULL && cfg->cluster_from_env) {
        st = keel_cluster_spec_detect(cfg->cluster_options, &own->spec);
        if (st != KEEL_OK)
            return keel__wrap(st, "training session: the cluster");
        spec = own->spec;
    }
    /* a backend of the caller's is shared state elsewhere: a cluster */
    st = check_strategy(cfg, (spec != NULL &&
                              !keel_cluster_spec_is_local(spec)) ||
                             cfg->session.backend != NULL, sc);
    if (st != KEEL_OK)
        return st;
    if (spec != NULL && !keel_cluster_spec_is_local(spec)) {
        keel_cluster_options co;
        if (cfg->session.backend != NULL)
            return keel__fail(KEEL_EINVAL, "training session: both a "
                              "cluster and session.backend are set; give "
                              "one");
        if (keel_cluster_spec_is_ps(spec))
            return keel__fail(KEEL_EINVAL, "training session: this task is "
                              "ps %d, which trains nothing: call "
                              "keel_ps_run() on a ps task (see "
                              "keel_cluster_spec_is_ps)",
                              keel_cluster_spec_task_index(spec));
        if (cfg->cluster_options != NULL)
            co = *cfg->cluster_options;
        else
            keel_cluster_options_init(&co);
        if (co.optimizer == NULL)
            co.optimizer = cfg->optimizer;
        st = keel_cluster_backend_new(spec, sc->vars, &co, &own->cluster);
        if (st != KEEL_OK)
            return keel__wrap(st, "training session");
        keel_cluster_backend_get(own->cluster, &own->backend);
        sc->backend = &own->backend;
        sc->is_chief = keel_cluster_spec_is_chief(spec);
        sc->max_wait_secs = co.max_wait_secs;
        return KEEL_OK;
    }
    if (cfg->optimizer != NULL) {
        if (cfg->session.updater.apply != NULL)
            return keel__fail(KEEL_EINVAL, "training session: both "
                              "optimizer and session.updater are set; give "
                              "one");
        st = keel_optimizer_new(cfg->optimizer, &own->opt);
        if (st == KEEL_OK)
            st = keel_optimizer_prepare(own->opt, sc->vars);
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

keel_status
keel_training_session_new(const keel_training_config *cfg,
                          keel_session **out)
{
    keel_session_config sc;
    keel_hook *all = NULL, *owned = NULL;
    size_t n_all = 0, n_owned = 0, i, cap;
    double ck_secs, sum_secs;
    int64_t ck_steps, sum_steps;
    const char *summary_dir;
    static const char *const default_names[] = { "loss" };
    training_owned *own = NULL;
    const char *ckpt_dir;
    int is_chief;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "training session: out is NULL");
    *out = NULL;
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "training session: config is NULL");
    if ((st = KEEL__STRUCT_CHECK(cfg, keel_training_config)) != KEEL_OK
        || (st = KEEL__STRUCT_CHECK(&cfg->session, keel_session_config))
           != KEEL_OK)
        return keel__wrap(st, "training session");
    if (cfg->session.vars == NULL)
        return keel__fail(KEEL_EINVAL, "training session: config needs "
                          "session.vars");
    ck_secs = cfg->save_checkpoint_secs;
    ck_steps = cfg->save_checkpoint_steps;
    sum_secs = cfg->save_summaries_secs;
    sum_steps = cfg->save_summaries_steps;
    st = resolve_pair("save_checkpoint", &ck_secs, &ck_steps, 600, 0);
    if (st == KEEL_OK)
        st = resolve_pair("save_summaries", &sum_secs, &sum_steps, 0, 100);
    if (st != KEEL_OK)
        return st;
    sc = cfg->session;
    ckpt_dir = sc.checkpoint_dir;
    own = calloc(1, sizeof *own);
    if (own == NULL)
        return keel__fail(KEEL_ENOMEM, "training session");
    st = resolve_cluster(cfg, &sc, own);
    if (st != KEEL_OK) {
        training_owned_free(own);
        return st;
    }
    is_chief = sc.is_chief;
    summary_dir = cfg->summary_dir != NULL ? cfg->summary_dir : ckpt_dir;
    cap = cfg->n_chief_only_hooks + 3 + cfg->session.n_hooks;
    all = calloc(cap, sizeof *all);
    owned = calloc(3, sizeof *owned);
    if (all == NULL || owned == NULL) {
        free(all);
        free(owned);
        training_owned_free(own);
        return keel__fail(KEEL_ENOMEM, "training session: %zu hooks", cap);
    }
    if (is_chief) {
        for (i = 0; i < cfg->n_chief_only_hooks; i++)
            all[n_all++] = cfg->chief_only_hooks[i];
        if (summary_dir != NULL && cfg->log_step_count_steps > 0) {
            keel_step_counter_hook_config cc;
            keel_step_counter_hook_config_init(&cc);
            cc.every_n_steps = cfg->log_step_count_steps;
            cc.output_dir = summary_dir;
            cc.clock = cfg->clock;
            st = keel_step_counter_hook_new(&cc, &owned[n_owned]);
            if (st != KEEL_OK)
                goto fail;
            all[n_all++] = owned[n_owned++];
        }
        if (summary_dir != NULL && (sum_secs > 0 || sum_steps > 0)) {
            keel_summary_hook_config mc;
            keel_summary_hook_config_init(&mc);
            mc.names = cfg->n_summary_names > 0 ? cfg->summary_names
                                                : default_names;
            mc.n_names = cfg->n_summary_names > 0 ? cfg->n_summary_names : 1;
            mc.save_steps = sum_steps;
            mc.save_secs = sum_secs;
            mc.output_dir = summary_dir;
            mc.clock = cfg->clock;
            st = keel_summary_hook_new(&mc, &owned[n_owned]);
            if (st != KEEL_OK)
                goto fail;
            all[n_all++] = owned[n_owned++];
        }
        if (ckpt_dir != NULL && (ck_secs > 0 || ck_steps > 0)) {
            keel_ckpt_hook_config hc;
            keel_ckpt_hook_config_init(&hc);
            hc.save_secs = ck_secs;
            hc.save_steps = ck_steps;
            hc.listeners = cfg->listeners;
            hc.n_listeners = cfg->n_listeners;
            hc.save_on_error = cfg->save_on_error;
            hc.clock = cfg->clock;
            st = keel_ckpt_hook_new(&hc, &owned[n_owned]);
            if (st != KEEL_OK)
                goto fail;
            all[n_all++] = owned[n_owned++];
        }
    }
    for (i = 0; i < cfg->session.n_hooks; i++)
        all[n_all++] = cfg->session.hooks[i];
    sc.hooks = all;
    sc.n_hooks = n_all;
    sc.checkpoint_dir = is_chief ? ckpt_dir : NULL;
    keel__log(KEEL_LOG_INFO, "training session (%s): %zu hooks, checkpoints "
              "%s every %g s / %lld steps", is_chief ? "chief" : "worker",
              n_all, ckpt_dir != NULL ? ckpt_dir : "(none)",
              ck_secs, (long long)ck_steps);
    st = keel__session_new(&sc, 1, owned, n_owned, out);
    free(all);              // the session copied the hooks
    if (st == KEEL_OK)
        keel__session_set_cleanup(*out, training_owned_free, own);
    else
        training_owned_free(own);
    return st;
fail:
    for (i = 0; i < n_owned; i++)
        keel_hook_release(&owned[i]);
    free(owned);
    free(all);
    training_owned_free(own);
    return st;
}
