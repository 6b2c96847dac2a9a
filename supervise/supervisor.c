/* supervisor.c - TF's Supervisor API over the same parts: a session from
 * the chief or worker creator, checkpoints every save_checkpoint_secs taken
 * at step boundaries (never concurrently with a step, unlike TF's
 * background thread) and a final checkpoint at stop. Alone the session
 * does not recover (TF's Supervisor); on a cluster (a backend that
 * publishes shared state) it is the recovering session
 * MonitoredTrainingSession runs, so a lost ps or worker costs a
 * re-creation of the session, not the task. The chief's re-creation
 * publishes its own current variables (joining live ps, re-initializing a
 * restarted one) instead of restoring its newest checkpoint: no rollback. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <keel/supervise.h>
#include "util.h"
#include "../session/session_int.h"

struct keel_supervisor {
    keel_supervisor_config cfg;     /* pointers borrowed from the caller's */
    char *checkpoint_dir;           /* cfg.session.manager.checkpoint_dir */
    keel_backend backend;           /* cfg.session.manager.backend's copy */
    keel_session *s;
    /* The chief's manager on a cluster (its creator is chief_create),
     * freed after s. */
    keel_session_manager *sm;
    int is_ready;                   /* sm's first creation succeeded */
};

/* On a cluster: the backend publishes shared state (the cluster worker
 * backend, or one of the caller's that does). */
static int
is_on_cluster(const keel_supervisor *sv)
{
    const keel_backend *be = sv->cfg.session.manager.backend;
    return be != NULL && be->publish != NULL;
}

/* The chief's creator on a cluster. The first creation is the manager's
 * (restore or init, then publish). A re-creation after a lost task keeps
 * the chief's variables, which hold the values and the global step of the
 * last step every ps answered: publishing them joins ps that kept their
 * state (pulling it) and initializes a restarted, empty ps from them, so
 * training continues at the step it reached. That holds where every
 * step's reply brings the chief the shared state (sync mode;
 * docs/session.md says what async mode and the local-model rules get).
 * Optimizer slots the ps keep are not in those replies: an empty ps gets
 * those of the chief's newest checkpoint pull (or of its start). */
static keel_status
chief_create(void *ctx, int is_recovery)
{
    keel_supervisor *sv = ctx;
    keel_vars *vs = sv->cfg.session.manager.vars;
    keel_status st;
    if (!sv->is_ready) {
        st = keel_session_manager_prepare(sv->sm, is_recovery, NULL);
        sv->is_ready = st == KEEL_OK;
        return st;
    }
    keel__log(KEEL_LOG_INFO, "supervisor (chief): recovering at global "
              "step %lld from the chief's own variables (no checkpoint "
              "restore)", (long long)keel_vars_global_step(vs));
    st = sv->backend.publish(sv->backend.ctx, vs, 1);
    if (st != KEEL_OK)
        return keel__wrap(st, "supervisor (chief): backend '%s' publish at "
                          "global step %lld",
                          sv->backend.name != NULL ? sv->backend.name : "?",
                          (long long)keel_vars_global_step(vs));
    keel_session_manager_notify(sv->sm);
    return KEEL_OK;
}

void
keel_supervisor_config_init(keel_supervisor_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    keel_session_config_init(&cfg->session);
    cfg->save_checkpoint_secs = 600;
}

keel_status
keel_supervisor_new(const keel_supervisor_config *cfg, keel_supervisor **out)
{
    const keel_session_config *c;
    keel_supervisor *sv;
    keel_status st;
    if (out != NULL)
        *out = NULL;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_supervisor_config, "supervisor");
    if (st != KEEL_OK)
        return st;
    c = &cfg->session;
    if ((st = KEEL__STRUCT_CHECK(c, keel_session_config)) != KEEL_OK)
        return keel__wrap(st, "supervisor: session");
    if (c->manager.vars == NULL || c->step == NULL)
        return keel__fail(KEEL_EINVAL, "supervisor: config needs "
                          "session.manager.vars and session.step");
    if (c->n_hooks > 0 || c->creator.create != NULL)
        return keel__fail(KEEL_EINVAL, "supervisor: session.hooks and "
                          "session.creator must be unset (the Supervisor "
                          "makes its own)");
    if (cfg->save_checkpoint_secs < 0)
        return keel__fail(KEEL_EINVAL, "supervisor: save_checkpoint_secs "
                          "%g < 0", cfg->save_checkpoint_secs);
    if (c->manager.backend != NULL &&
        (st = keel__backend_check(c->manager.backend, "supervisor"))
        != KEEL_OK)
        return st;
    sv = calloc(1, sizeof *sv);
    if (sv == NULL)
        return keel__fail(KEEL_ENOMEM, "supervisor");
    sv->cfg = *cfg;
    if (c->manager.checkpoint_dir != NULL
        && (sv->checkpoint_dir = strdup(c->manager.checkpoint_dir)) == NULL) {
        free(sv);
        return keel__fail(KEEL_ENOMEM, "supervisor: copy checkpoint_dir");
    }
    sv->cfg.session.manager.checkpoint_dir = sv->checkpoint_dir;
    if (c->manager.backend != NULL) {
        keel__backend_copy(&sv->backend, c->manager.backend);
        sv->cfg.session.manager.backend = &sv->backend;
    }
    *out = sv;
    return KEEL_OK;
}

keel_status
keel_supervisor_prepare_or_wait(keel_supervisor *sv, double max_wait_secs)
{
    keel_session_config sc;
    keel_hook *owned = NULL;
    size_t n_owned = 0;
    int is_recovering;
    keel_status st;
    if (sv == NULL)
        return keel__fail(KEEL_EINVAL, "supervisor: NULL");
    is_recovering = is_on_cluster(sv);
    if (sv->s != NULL) {            // clear_stop: a fresh session
        keel_session_free(sv->s);
        sv->s = NULL;
    }
    keel_session_manager_free(sv->sm);
    sv->sm = NULL;
    sv->is_ready = 0;
    sc = sv->cfg.session;
    if (!sc.is_chief)
        sc.manager.checkpoint_dir = NULL;
    sc.max_wait_secs = max_wait_secs;
    if (sc.is_chief && sv->checkpoint_dir != NULL
        && sv->cfg.save_checkpoint_secs > 0) {
        keel_ckpt_hook_config hc;
        keel_ckpt_hook_config_init(&hc);
        hc.save_secs = sv->cfg.save_checkpoint_secs;
        hc.clock = sv->cfg.clock;
        owned = calloc(1, sizeof *owned);
        if (owned == NULL)
            return keel__fail(KEEL_ENOMEM, "supervisor: hook");
        st = keel_ckpt_hook_new(&hc, owned);
        if (st != KEEL_OK) {
            free(owned);
            return st;
        }
        n_owned = 1;
        sc.hooks = owned;
        sc.n_hooks = 1;
    }
    if (is_recovering && sc.is_chief) {
        st = keel_session_manager_new(&sc.manager, &sv->sm);
        if (st != KEEL_OK) {
            for (size_t i = 0; i < n_owned; i++)
                keel_hook_release(&owned[i]);
            free(owned);
            return keel__wrap(st, "supervisor (chief)");
        }
        sc.creator.ctx = sv;
        sc.creator.create = chief_create;
    }
    /* the session takes the owned hooks, also on failure */
    return keel__session_new(&sc, is_recovering, owned, n_owned, &sv->s);
}

int
keel_supervisor_should_stop(keel_supervisor *sv)
{
    return sv == NULL || sv->s == NULL || keel_session_should_stop(sv->s);
}

void
keel_supervisor_request_stop(keel_supervisor *sv, const char *why)
{
    if (sv != NULL && sv->s != NULL)
        keel_session_request_stop(sv->s, why);
}

keel_status
keel_supervisor_run_step(keel_supervisor *sv, const void *batch)
{
    if (sv == NULL || sv->s == NULL)
        return keel__fail(KEEL_ESTATE, "supervisor: no session (call "
                          "keel_supervisor_prepare_or_wait first)");
    return keel_session_run(sv->s, batch);
}

keel_status
keel_supervisor_loop(keel_supervisor *sv, int64_t max_steps)
{
    int64_t n = 0;
    keel_status st = KEEL_OK, cs;
    if (sv == NULL || sv->s == NULL)
        return keel__fail(KEEL_ESTATE, "supervisor: no session (call "
                          "keel_supervisor_prepare_or_wait first)");
    while (!keel_supervisor_should_stop(sv)
           && (max_steps <= 0 || n < max_steps)) {
        st = keel_session_run(sv->s, NULL);
        if (st == KEEL_EOUTOFRANGE || st == KEEL_ECANCELLED)
            st = KEEL_OK;
        if (st != KEEL_OK || keel_session_should_stop(sv->s))
            break;
        n++;
    }
    cs = keel_supervisor_stop(sv);
    return st != KEEL_OK ? st : cs;
}

keel_status
keel_supervisor_stop(keel_supervisor *sv)
{
    if (sv == NULL || sv->s == NULL)
        return KEEL_OK;
    keel_session_request_stop(sv->s, "supervisor stop");
    return keel_session_close(sv->s);
}

keel_session *
keel_supervisor_session(keel_supervisor *sv)
{
    return sv != NULL ? sv->s : NULL;
}

void
keel_supervisor_free(keel_supervisor *sv)
{
    if (sv == NULL)
        return;
    keel_session_free(sv->s);
    keel_session_manager_free(sv->sm);
    free(sv->checkpoint_dir);
    free(sv);
}
