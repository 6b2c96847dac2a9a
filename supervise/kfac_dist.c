/* kfac_dist.c - K-FAC in a session and on a cluster (keel/kfac_dist.h,
 * docs/kfac.md): the one-process updater, chief mode (the chief applies
 * the whole K-FAC step to the aggregated gradient) and split roles
 * (KEEL_KFAC_DIST_ROLES): replicas by index are gradient workers (the chief
 * among them: it applies each sync step's update, preconditioned with the
 * newest inverses on the ps), covariance workers (each global step, the
 * factor statistics of a batch into the ps's moving averages, once
 * cov_update_every steps have passed) and inverse
 * workers (each global step, the next layer of a shared, seeded, shuffled,
 * endlessly repeating queue: its damped inverses from the ps's factors,
 * published on the ps with the step they were computed at). */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <keel/distributed.h>
#include <keel/kfac.h>
#include <keel/kfac_dist.h>
#include <keel/session.h>
#include <keel/train.h>
#include "util.h"
#include "supervise_int.h"

/* Poll interval of a role task waiting for the next global step. */
#define ROLE_POLL_NS 2000000L

struct keel_kfac_dist {
    keel_kfac_dist_config cfg;
    keel_kfac *k;
    keel_vars *vs;
    keel_cluster_backend *b;
    int role, index, n_role;     /* this task's role, its number in it */
    int counts[3];               /* tasks of each role (roles mode) */
    int nl;
    double decay;                /* per factor update (cov_ema_decay to
                                  * the power cov_update_every) */
    int64_t every;               /* cov_update_every */
    double wait_secs;            /* step_timeout_secs; 0 never */
    uint64_t seed;
    int64_t log_every;           /* staleness lines (chief) */
    int64_t last_step;           /* of this task's last statistics/op */
    int64_t ops;                 /* inverse ops done since the start */
    const char **names;          /* scratch, 6 per layer + 2 */
    const keel_tensor **ts;
    float **Ab, **Gb;            /* covariance: this step's factors */
    keel_tensor *Abt, *Gbt;      /* views of Ab, Gb */
    keel_tensor one;             /* scalar 1 (the EMA weight's input) */
    keel_tensor **ver;           /* per layer "<scope>/kfac_inv_step" */
    char (*vnames)[KEEL_NAME_MAX];
    char (*fnames)[4][KEEL_NAME_MAX];  /* A, G, A_inv, G_inv */
    int *perm;                   /* inverse: the queue's current pass */
    float *held;                 /* chief: versions of its inverses */
    int64_t n_updates, pull_ns, update_ns;  /* chief: its update's time */
    int64_t inv_pulls;           /* chief: layers' inverses pulled */
    int64_t perm_pass;
};

static const char *const role_names[] = { "gradient", "covariance",
                                          "inverse" };
static const char *const mode_names[] = { "chief", "roles" };

/* ---- one process ---- */

static keel_status
kfac_updater_apply(void *ctx, keel_vars *vs, keel_grads *grads,
                   int64_t global_step)
{
    return keel_kfac_apply(ctx, vs, grads, global_step);
}

keel_updater
keel_kfac_updater(keel_kfac *k)
{
    keel_updater u = { 0 };
    u.ctx = k;
    u.apply = kfac_updater_apply;
    return u;
}

/* ---- names, config, roles ---- */

const char *
keel_kfac_role_name(keel_kfac_role role)
{
    return (unsigned)role < 3 ? role_names[role] : "?";
}

const char *
keel_kfac_distributed_name(keel_kfac_distributed d)
{
    return (unsigned)d < 2 ? mode_names[d] : "?";
}

KEEL__FROM_NAME(keel_kfac_distributed_from_name, keel_kfac_distributed,
                "K-FAC distributed mode", mode_names)

void
keel_kfac_dist_config_init(keel_kfac_dist_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->mode = KEEL_KFAC_DIST_CHIEF;
    cfg->replica = 0;
    cfg->replicas = 1;
    cfg->kfac_replicas_to_aggregate = 0;
    cfg->gradient_fraction = 0.6;
    cfg->covariance_fraction = 0.2;
    cfg->step_timeout_secs = 3600.0;
    cfg->seed = 0;
    cfg->log_every_steps = 100;
}

static keel_status
dist_role_fp(const keel_kfac_dist_config *cfg, keel_kfac_role *role,
             int *index, int counts[3])
{
    double gf, cf;
    int ng, nc, replicas, replica;
    keel_status st;
    if (cfg == NULL || role == NULL || index == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC roles: NULL argument");
    if ((st = KEEL__STRUCT_CHECK(cfg, keel_kfac_dist_config)) != KEEL_OK)
        return keel__wrap(st, "K-FAC roles");
    gf = cfg->gradient_fraction;
    cf = cfg->covariance_fraction;
    replicas = cfg->replicas;
    replica = cfg->replica;
    if (!(gf >= 0.0 && gf <= 1.0) || !(cf >= 0.0 && cf <= 1.0))
        return keel__fail(KEEL_EINVAL, "K-FAC roles: gradient_fraction %g "
                          "and covariance_fraction %g must be in [0, 1]",
                          gf, cf);
    ng = (int)floor(gf * replicas + 1e-9);
    nc = (int)floor(cf * replicas + 1e-9);
    if (ng < 1)
        ng = 1;
    if (nc < 1)
        nc = 1;
    if (replicas - ng - nc < 1)
        return keel__fail(KEEL_EINVAL, "kfac.distributed = roles needs at "
                          "least one gradient, one covariance and one "
                          "inverse worker: %d replica(s) with "
                          "kfac.gradient_fraction = %g and "
                          "kfac.covariance_fraction = %g give %d gradient, "
                          "%d covariance and %d inverse; use 3 or more "
                          "replicas, lower the fractions, or "
                          "kfac.distributed = chief", replicas, gf, cf, ng,
                          nc, replicas - ng - nc < 0 ? 0
                                                     : replicas - ng - nc);
    if (replica < 0 || replica >= replicas)
        return keel__fail(KEEL_EINVAL, "K-FAC roles: replica %d of %d",
                          replica, replicas);
    if (counts != NULL) {
        counts[0] = ng;
        counts[1] = nc;
        counts[2] = replicas - ng - nc;
    }
    if (replica < ng) {
        *role = KEEL_KFAC_ROLE_GRADIENT;
        *index = replica;
    } else if (replica < ng + nc) {
        *role = KEEL_KFAC_ROLE_COVARIANCE;
        *index = replica - ng;
    } else {
        *role = KEEL_KFAC_ROLE_INVERSE;
        *index = replica - ng - nc;
    }
    return KEEL_OK;
}

keel_status
keel_kfac_dist_config_role(const keel_kfac_dist_config *cfg,
                           keel_kfac_role *role, int *index, int counts[3])
{
    return KEEL__FLUSHED(dist_role_fp(cfg, role, index, counts));
}

/* "<scope>/kfac_inv_step": the global step layer i's published inverses
 * were computed at; -1 before the first. */
static keel_status
version_name(keel_kfac *k, int i, char *buf, size_t size)
{
    const char *scope;
    keel_status st = keel_kfac_layer(k, i, &scope, NULL, NULL);
    if (st == KEEL_OK)
        st = keel__fmt(buf, size, "K-FAC version name", "%s/kfac_inv_step",
                       scope);
    return st;
}

keel_status
keel_kfac_dist_add_state(keel_kfac *k, keel_vars *vs)
{
    if (k == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC roles: NULL argument");
    for (int i = 0; i < keel_kfac_num_layers(k); i++) {
        char name[KEEL_NAME_MAX];
        keel_var *v;
        keel_status st = version_name(k, i, name, sizeof name);
        if (st != KEEL_OK)
            return st;
        if (keel_vars_find(vs, name) != NULL)
            continue;
        if ((st = keel_vars_create(vs, name, 0, NULL, 0, &v)) != KEEL_OK)
            return keel__wrap(st, "K-FAC roles");
        keel_var_tensor(v)->data[0] = -1.0f;
        keel_var_set_initialized(v, 1);
    }
    return KEEL_OK;
}

void
keel_kfac_dist_free(keel_kfac_dist *d)
{
    if (d == NULL)
        return;
    if (d->n_updates > 0)
        keel__log(KEEL_LOG_INFO, "K-FAC: the chief's update per step (%lld "
                  "steps, ms): pull of the inverses %.3f (%.2f of %d layers' "
                  "inverses pulled), preconditioned update %.3f",
                  (long long)d->n_updates,
                  (double)d->pull_ns / (double)d->n_updates / 1e6,
                  (double)d->inv_pulls / (double)d->n_updates, d->nl,
                  (double)d->update_ns / (double)d->n_updates / 1e6);
    for (int i = 0; i < d->nl; i++) {
        if (d->Abt != NULL)
            keel_tensor_release(&d->Abt[i]);
        if (d->Gbt != NULL)
            keel_tensor_release(&d->Gbt[i]);
    }
    free(d->Ab);
    free(d->Gb);
    free(d->Abt);
    free(d->Gbt);
    keel_tensor_release(&d->one);
    free(d->ver);
    free(d->vnames);
    free(d->fnames);
    free(d->names);
    free(d->ts);
    free(d->perm);
    free(d->held);
    free(d);
}

/* The settings the roles read from the config and from K-FAC's. */
static void
dist_read_config(keel_kfac_dist *d, const keel_kfac_dist_config *cfg)
{
    const keel_kfac_config *kc = keel_kfac_get_config(d->k);
    d->cfg = *cfg;
    d->every = kc->cov_update_every;
    if (d->every < 1)
        d->every = 1;
    d->decay = pow(kc->cov_ema_decay, (double)d->every);
    d->wait_secs = cfg->step_timeout_secs;
    d->seed = cfg->seed;
    d->log_every = cfg->log_every_steps;
}

/* The per-layer arrays, zeroed, and the name and tensor arrays a pull or
 * push of up to 6 names per layer (+2) uses. */
static keel_status
dist_alloc_arrays(keel_kfac_dist *d, int nl)
{
    d->names = calloc((size_t)nl * 6 + 2, sizeof *d->names);
    d->ts = calloc((size_t)nl * 6 + 2, sizeof *d->ts);
    d->ver = calloc((size_t)nl, sizeof *d->ver);
    d->vnames = calloc((size_t)nl, sizeof *d->vnames);
    d->fnames = calloc((size_t)nl, sizeof *d->fnames);
    d->perm = calloc((size_t)nl, sizeof *d->perm);
    d->held = calloc((size_t)nl, sizeof *d->held);
    d->Ab = calloc((size_t)nl, sizeof *d->Ab);
    d->Gb = calloc((size_t)nl, sizeof *d->Gb);
    d->Abt = calloc((size_t)nl, sizeof *d->Abt);
    d->Gbt = calloc((size_t)nl, sizeof *d->Gbt);
    if (d->names == NULL || d->ts == NULL || d->ver == NULL ||
        d->vnames == NULL || d->fnames == NULL || d->perm == NULL ||
        d->held == NULL ||
        d->Ab == NULL || d->Gb == NULL || d->Abt == NULL || d->Gbt == NULL)
        return keel__fail(KEEL_ENOMEM, "K-FAC roles: %d layers", nl);
    return KEEL_OK;
}

/* Layer i's version and factor names, its version tensor in the store and,
 * for a covariance worker (role 1), its A and G statistics buffers. */
static keel_status
dist_init_layer(keel_kfac_dist *d, int i)
{
    static const char *const leaf[4] = { "kfac_A", "kfac_G",
                                         "kfac_A_inv", "kfac_G_inv" };
    const char *scope;
    size_t a, g;
    keel_var *v;
    keel_status st = keel_kfac_layer(d->k, i, &scope, &a, &g);
    if (st == KEEL_OK)
        st = version_name(d->k, i, d->vnames[i], sizeof d->vnames[i]);
    for (int f = 0; f < 4 && st == KEEL_OK; f++)
        st = keel__fmt(d->fnames[i][f], KEEL_NAME_MAX, "K-FAC name",
                       "%s/%s", scope, leaf[f]);
    if (st != KEEL_OK)
        return st;
    if ((v = keel_vars_find(d->vs, d->vnames[i])) == NULL)
        return keel__fail(KEEL_EINTERNAL, "K-FAC roles: no '%s'",
                          d->vnames[i]);
    d->ver[i] = keel_var_tensor(v);
    if (d->role == 1) {
        int64_t as[2] = { (int64_t)a, (int64_t)a };
        int64_t gs[2] = { (int64_t)g, (int64_t)g };
        if ((st = keel_tensor_alloc(&d->Abt[i], 2, as)) != KEEL_OK ||
            (st = keel_tensor_alloc(&d->Gbt[i], 2, gs)) != KEEL_OK)
            return st;
        d->Ab[i] = d->Abt[i].data;
        d->Gb[i] = d->Gbt[i].data;
    }
    return KEEL_OK;
}

static keel_status
kfac_dist_new_fp(const keel_kfac_dist_config *cfg, keel_kfac *k,
                 keel_vars *vs, keel_kfac_dist **out)
{
    keel_kfac_dist *d;
    keel_status st = KEEL_OK;
    keel_kfac_role role = KEEL_KFAC_ROLE_GRADIENT;
    int nl, index = 0, counts[3] = { 0, 0, 0 };
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC distributed: out is NULL");
    *out = NULL;
    if (cfg == NULL || k == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC distributed: NULL argument");
    if ((st = KEEL__STRUCT_CHECK(cfg, keel_kfac_dist_config)) != KEEL_OK)
        return keel__wrap(st, "K-FAC distributed");
    if ((unsigned)cfg->mode > KEEL_KFAC_DIST_ROLES)
        return keel__fail(KEEL_EINVAL, "K-FAC distributed: unknown mode %d",
                          (int)cfg->mode);
    if (cfg->replicas < 1 || cfg->replica < 0 ||
        cfg->replica >= cfg->replicas)
        return keel__fail(KEEL_EINVAL, "K-FAC distributed: replica %d of "
                          "%d", cfg->replica, cfg->replicas);
    /* one replica trains alone: every mode is the one-process K-FAC */
    if (cfg->mode == KEEL_KFAC_DIST_ROLES && cfg->replicas > 1 &&
        (st = keel_kfac_dist_config_role(cfg, &role, &index, counts)) !=
        KEEL_OK)
        return st;
    d = calloc(1, sizeof *d);
    if (d == NULL)
        return keel__fail(KEEL_ENOMEM, "K-FAC roles");
    nl = keel_kfac_num_layers(k);
    d->k = k;
    d->vs = vs;
    d->role = (int)role;
    d->index = index;
    d->n_role = counts[role] > 0 ? counts[role] : 1;
    memcpy(d->counts, counts, sizeof counts);
    d->nl = nl;
    dist_read_config(d, cfg);
    if (cfg->mode == KEEL_KFAC_DIST_CHIEF || cfg->replicas == 1) {
        *out = d;               /* the chief's update is keel_kfac_apply */
        return KEEL_OK;
    }
    d->last_step = -1;
    d->perm_pass = -1;
    st = dist_alloc_arrays(d, nl);
    if (st == KEEL_OK)
        st = keel_tensor_alloc(&d->one, 0, NULL);
    if (st == KEEL_OK)
        d->one.data[0] = 1.0f;
    for (int i = 0; i < nl && st == KEEL_OK; i++)
        st = dist_init_layer(d, i);
    if (st != KEEL_OK) {
        keel_kfac_dist_free(d);
        return st;
    }
    *out = d;
    return KEEL_OK;
}

keel_status
keel_kfac_dist_new(const keel_kfac_dist_config *cfg, keel_kfac *k,
                   keel_vars *vs, keel_kfac_dist **out)
{
    return KEEL__FLUSHED(kfac_dist_new_fp(cfg, k, vs, out));
}

keel_kfac_role
keel_kfac_dist_role(const keel_kfac_dist *d)
{
    return d != NULL ? (keel_kfac_role)d->role : KEEL_KFAC_ROLE_GRADIENT;
}

int
keel_kfac_dist_observes(const keel_kfac_dist *d)
{
    if (d == NULL)
        return 0;
    if (d->cfg.mode == KEEL_KFAC_DIST_CHIEF || d->cfg.replicas == 1)
        return d->cfg.replica == 0;
    return d->role == KEEL_KFAC_ROLE_COVARIANCE;
}

keel_kfac *
keel__kfac_dist_kfac(const keel_kfac_dist *d)
{
    return d->k;
}

const keel_kfac_dist_config *
keel__kfac_dist_config(const keel_kfac_dist *d)
{
    return &d->cfg;
}

void
keel_kfac_dist_set_backend(keel_kfac_dist *d, keel_cluster_backend *b)
{
    d->b = b;
}

static void
nap(void)
{
    struct timespec ts = { 0, ROLE_POLL_NS };
    nanosleep(&ts, NULL);
}

/* Wait until the cluster's global step passes after (or any version is
 * still -1, when first is set: the first inverses do not wait for a step,
 * which waits for them). *step: the step seen. */
static keel_status
wait_step(keel_kfac_dist *d, int64_t after, int unpublished_too,
          int64_t *step)
{
    double t0 = (double)keel__now_mono_ns() / 1e9;
    for (;;) {
        keel_status st;
        size_t n = 0;
        int missing = 0;
        if (unpublished_too)
            for (int i = 0; i < d->nl; i++)
                d->names[n++] = d->vnames[i];
        st = keel_cluster_backend_pull_vars(d->b, d->names, n, step);
        if (st != KEEL_OK)
            return st;
        for (int i = 0; unpublished_too && i < d->nl; i++)
            missing |= d->ver[i]->data[0] < 0.0f;
        if (*step > after || missing)
            return KEEL_OK;
        if (keel_session_signal_received())
            return keel__fail(KEEL_ECANCELLED, "K-FAC %s worker: signal "
                              "while waiting for step %lld",
                              role_names[d->role], (long long)after + 1);
        if (d->wait_secs > 0 &&
            (double)keel__now_mono_ns() / 1e9 - t0 > d->wait_secs)
            return keel__fail(KEEL_ETIMEOUT, "K-FAC %s worker: the global "
                              "step stayed at %lld for %.0f s "
                              "(cluster.step_timeout_secs)",
                              role_names[d->role], (long long)*step,
                              d->wait_secs);
        nap();
    }
}

/* After a role's work: the new weights and the global step into the
 * store (what the session's updater leaves). */
static keel_status
pull_weights(keel_kfac_dist *d)
{
    size_t n = 0;
    int64_t step = 0;
    keel_status st;
    const char **names = calloc(keel_vars_count(d->vs) + 1, sizeof *names);
    if (names == NULL)
        return keel__fail(KEEL_ENOMEM, "K-FAC roles: pull");
    for (size_t i = 0; i < keel_vars_count(d->vs); i++) {
        keel_var *v = keel_vars_at(d->vs, i);
        if (keel_var_is_trainable(v))
            names[n++] = keel_var_name(v);
    }
    st = keel_cluster_backend_pull_vars(d->b, names, n, &step);
    free(names);
    if (st == KEEL_OK)
        keel_vars_set_global_step(d->vs, step);
    return st;
}

/* Covariance worker: this step's statistics into the ps's averages (one
 * MIX: every factor and the EMA weight, so a reader never sees them
 * apart on one ps) once cov_update_every global steps have passed since
 * its last (the first step it takes always), then wait for the next global
 * step. Which steps keel_kfac_observe takes statistics at is steered by
 * the local EMA weight, a scratch flag on this task (the ps hold the
 * real one): 0 makes the next step observe; otherwise only multiples of
 * cov_update_every do, whose statistics are dropped when not due (a
 * worker that lags the chief may never land on a multiple). */
static keel_status
covariance_apply(keel_kfac_dist *d, int64_t step)
{
    size_t n = 0;
    int64_t now = step;
    keel_status st = KEEL_OK;
    float *w = keel_var_tensor(keel_vars_find(d->vs,
                                              "kfac/ema_weight"))->data;
    int observed = step % d->every == 0 || w[0] == 0.0f;
    int due = d->last_step < 0 || step - d->last_step >= d->every;
    if (observed)
        st = keel_kfac_take_statistics(d->k, d->Ab, d->Gb);
    if (st == KEEL_OK && observed && due) {
        for (int i = 0; i < d->nl; i++) {
            d->names[n] = d->fnames[i][0];
            d->ts[n++] = &d->Abt[i];
            d->names[n] = d->fnames[i][1];
            d->ts[n++] = &d->Gbt[i];
        }
        d->names[n] = "kfac/ema_weight";
        d->ts[n++] = &d->one;
        st = keel_cluster_backend_mix(d->b, d->names, d->ts, n, d->decay);
        if (st == KEEL_OK)
            d->last_step = step;
    }
    if (st == KEEL_OK)
        st = wait_step(d, step, 0, &now);
    if (st == KEEL_OK)
        st = pull_weights(d);
    w[0] = d->last_step < 0 || now - d->last_step >= d->every ? 0.0f : 1.0f;
    return st;
}

/* splitmix64 */
static uint64_t
mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Position q of the op queue: pass q / nl is a Fisher-Yates shuffle of
 * the layers seeded by train.seed and the pass, the same on every task. */
static int
queue_at(keel_kfac_dist *d, int64_t q)
{
    int64_t pass = q / d->nl;
    if (pass != d->perm_pass) {
        uint64_t s = mix64(d->seed ^ 0x696e7671ULL) ^ mix64((uint64_t)pass);
        for (int i = 0; i < d->nl; i++)
            d->perm[i] = i;
        for (int i = d->nl - 1; i > 0; i--) {
            int j, t;
            s = mix64(s);
            j = (int)(s % (uint64_t)(i + 1));
            t = d->perm[i];
            d->perm[i] = d->perm[j];
            d->perm[j] = t;
        }
        d->perm_pass = pass;
    }
    return d->perm[q % d->nl];
}

/* Whether every layer has inverses from the inverse workers. */
static int
has_every_inverse(const keel_kfac_dist *d)
{
    int missing = 0;
    for (int i = 0; i < d->nl; i++)
        missing |= d->ver[i]->data[0] < 0.0f;
    return !missing;
}

/* Inverse worker: the next op of the queue (this task takes positions
 * index, index + n, ...): the layer's factors from the ps, its damped
 * inverses, published with the step; once every layer has inverses, one
 * op per global step. */
static keel_status
inverse_apply(keel_kfac_dist *d, int64_t step)
{
    int64_t now = step;
    int layer;
    float w;
    keel_status st;
    if (d->last_step >= 0 &&
        (st = wait_step(d, d->last_step, 1, &now)) != KEEL_OK)
        return st;
    if (d->ops == 0)
        d->ops = now;           /* a (re)started task joins the queue here */
    layer = queue_at(d, (int64_t)d->index + (int64_t)d->n_role * d->ops);
    d->names[0] = d->fnames[layer][0];
    d->names[1] = d->fnames[layer][1];
    d->names[2] = "kfac/ema_weight";
    st = keel_cluster_backend_pull_vars(d->b, d->names, 3, &now);
    if (st != KEEL_OK)
        return st;
    w = keel_var_tensor(keel_vars_find(d->vs, "kfac/ema_weight"))->data[0];
    if (w > 0.0f) {
        if ((st = keel_kfac_invert_layer(d->k, layer)) != KEEL_OK)
            return st;
        d->ver[layer]->data[0] = (float)now;
        d->names[0] = d->fnames[layer][2];
        d->ts[0] = keel_var_tensor(keel_vars_find(d->vs, d->names[0]));
        d->names[1] = d->fnames[layer][3];
        d->ts[1] = keel_var_tensor(keel_vars_find(d->vs, d->names[1]));
        d->names[2] = d->vnames[layer];
        d->ts[2] = d->ver[layer];
        if ((st = keel_cluster_backend_mix(d->b, d->names, d->ts, 3, 0.0)) !=
            KEEL_OK)
            return st;
        keel__log(KEEL_LOG_DEBUG, "K-FAC inverse worker %d: '%s' inverted "
                  "at step %lld (queue position %lld)", d->index,
                  d->fnames[layer][0], (long long)now,
                  (long long)(d->index + d->n_role * d->ops));
        d->ops++;
        d->last_step = now;
    } else {
        nap();                  /* no statistics yet: poll */
    }
    /* Once every layer has inverses the chief steps on: the step ends
     * past the global step it began at, as a pushing replica's does, so
     * the session's step count (a stop at the last step) is the
     * cluster's. */
    if (has_every_inverse(d) && (st = wait_step(d, step, 0, &now)) !=
        KEEL_OK)
        return st;
    return pull_weights(d);
}

static keel_status
role_apply(void *ctx, keel_vars *vs, keel_grads *g, int64_t global_step)
{
    keel_kfac_dist *d = ctx;
    (void)vs;
    (void)g;
    /* The cluster went back (a lost ps was rebuilt from a checkpoint):
     * this task's last statistics or op lie ahead of the global step, and
     * its next is due now, not once the step has caught up with them. */
    if (global_step < d->last_step)
        d->last_step = -1;
    return d->role == 1 ? covariance_apply(d, global_step)
                        : inverse_apply(d, global_step);
}

/* One pull round: every layer's version (and at step 0 its statistics,
 * which apply_update inverts then), then the inverses of the layers whose
 * version moved, each with its version again. *pulled: how many layers'
 * inverses came. The local store's versions are those of the local
 * inverses, so the names array is rebuilt in place, nothing allocated. */
static keel_status
pull_new_inverses(keel_kfac_dist *d, int64_t global_step, int64_t *pulled)
{
    int64_t step = 0;
    size_t n = 0;
    keel_status st;
    for (int i = 0; i < d->nl; i++) {
        d->held[i] = d->ver[i]->data[0];
        d->names[n++] = d->vnames[i];
        if (global_step == 0) {     /* apply_update inverts at step 0 */
            d->names[n++] = d->fnames[i][0];
            d->names[n++] = d->fnames[i][1];
        }
    }
    d->names[n++] = "kfac/ema_weight";
    st = keel_cluster_backend_pull_vars(d->b, d->names, n, &step);
    if (st != KEEL_OK)
        return st;
    n = 0;
    for (int i = 0; i < d->nl; i++)
        if (d->ver[i]->data[0] != d->held[i] || d->held[i] < 0.0f) {
            d->names[n++] = d->fnames[i][2];
            d->names[n++] = d->fnames[i][3];
            d->names[n++] = d->vnames[i];
        }
    *pulled = (int64_t)n / 3;
    if (n > 0 &&
        (st = keel_cluster_backend_pull_vars(d->b, d->names, n, &step)) !=
        KEEL_OK) {
        /* the versions stand for inverses not pulled: pull all next */
        for (int i = 0; i < d->nl; i++)
            d->ver[i]->data[0] = -1.0f;
        return st;
    }
    return KEEL_OK;
}

/* Whether the chief may keep waiting for the first inverses: not once a
 * signal came or cluster.step_timeout_secs passed since t0. */
static keel_status
may_keep_waiting(const keel_kfac_dist *d, double t0)
{
    if (keel_session_signal_received())
        return keel__fail(KEEL_ECANCELLED, "K-FAC: signal while waiting "
                          "for the inverse workers' first inverses");
    if (d->wait_secs > 0 &&
        (double)keel__now_mono_ns() / 1e9 - t0 > d->wait_secs)
        return keel__fail(KEEL_ETIMEOUT, "K-FAC: no inverses of every "
                          "layer from the inverse workers after %.0f s "
                          "(cluster.step_timeout_secs): are the "
                          "covariance and inverse workers running?",
                          d->wait_secs);
    return KEEL_OK;
}

/* How old the inverses preconditioning this step are: mean and worst. */
static void
log_staleness(const keel_kfac_dist *d, int64_t global_step)
{
    double sum = 0.0, worst = 0.0;
    int wi = 0;
    for (int i = 0; i < d->nl; i++) {
        double s = (double)global_step - (double)d->ver[i]->data[0];
        sum += s;
        if (s > worst || i == 0) {
            worst = s;
            wi = i;
        }
    }
    keel__log(KEEL_LOG_INFO, "K-FAC: step %lld preconditioned with "
              "inverses %.1f steps old on average, at most %.0f ('%s')",
              (long long)global_step, sum / d->nl, worst,
              d->fnames[wi][2]);
}

/* Roles mode: the chief's update of a sync step: the newest inverses
 * from the ps, staleness logged, keel_kfac_apply_update. */
static keel_status
roles_chief_apply(void *ctx, keel_vars *vs, keel_grads *mean,
                  int64_t global_step)
{
    keel_kfac_dist *d = ctx;
    int64_t t_pull = keel__now_mono_ns(), t_update;
    double t0 = (double)t_pull / 1e9;
    int64_t pulled = 0;
    int waited = 0;
    keel_status st;
    for (;;) {
        st = pull_new_inverses(d, global_step, &pulled);
        if (st != KEEL_OK)
            return st;
        if (has_every_inverse(d))
            break;
        st = may_keep_waiting(d, t0);
        if (st != KEEL_OK)
            return st;
        waited = 1;
        nap();
    }
    if (d->log_every > 0 && global_step % d->log_every == 0)
        log_staleness(d, global_step);
    t_update = keel__now_mono_ns();
    st = keel_kfac_apply_update(d->k, vs, mean, global_step);
    if (!waited) {              /* not the wait for the first inverses */
        d->n_updates++;
        d->inv_pulls += pulled;
        d->pull_ns += t_update - t_pull;
        d->update_ns += keel__now_mono_ns() - t_update;
    }
    return st;
}

/* Chief mode: the whole K-FAC step on the chief, with the step's mean
 * gradient from the ps and the chief's own statistics. */
static keel_status
chief_apply(void *ctx, keel_vars *vs, keel_grads *mean, int64_t global_step)
{
    keel_kfac_dist *d = ctx;
    return keel_kfac_apply(d->k, vs, mean, global_step);
}

keel_updater
keel_kfac_dist_role_updater(keel_kfac_dist *d)
{
    keel_updater u = { 0 };
    u.ctx = d;
    u.apply = role_apply;
    return u;
}

keel_status
keel_kfac_dist_cluster_config(keel_kfac_dist *d, keel_cluster_config *co)
{
    int n;
    if (d == NULL || co == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC cluster config: NULL "
                          "argument");
    if (d->cfg.mode == KEEL_KFAC_DIST_ROLES && d->cfg.replicas == 1) {
        keel_kfac_role role;
        int index;
        /* a cluster of one replica has no roles to split: the error */
        return keel_kfac_dist_config_role(&d->cfg, &role, &index, NULL);
    }
    /* K-FAC's update is not per variable: the chief applies it, its state
     * (factors, inverses, velocity) lives on the ps */
    co->optimizer = NULL;
    co->chief_applies = 1;
    co->chief_apply_ctx = d;
    n = d->cfg.replicas;
    if (d->cfg.mode == KEEL_KFAC_DIST_ROLES) {
        co->chief_apply = roles_chief_apply;
        co->chief_commits_trainable_only = 1;
        co->replicas_to_aggregate = d->counts[0];
    } else {
        co->chief_apply = chief_apply;
        if (d->cfg.kfac_replicas_to_aggregate && n >= 3)
            co->replicas_to_aggregate = (int)ceil(0.6 * n);
    }
    return KEEL_OK;
}
