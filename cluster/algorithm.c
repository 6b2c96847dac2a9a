/* algorithm.c - the cluster's update rules (keel_algorithm): their names
 * and defaults, the worker's half (local steps, accumulation, when to pull
 * and commit, what it commits: keel__algo_worker_step over an I/O seam)
 * and the ps's half (how a commit changes the center variables, with the
 * per-replica state a rule keeps: keel__algo_ps_commit). The formulas are
 * in docs/algorithms.md; every function here follows them literally. */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/distributed.h>
#include "cluster_int.h"

static const char *const algo_names[KEEL_ALGORITHM_COUNT] = {
    "sync", "async", "hogwild", "downpour", "downpour_easy", "agn", "sagn",
    "adag", "dynsgd", "easgd", "aeasgd", "aeamsgd", "model_averaging"
};

const char *
keel_algorithm_name(keel_algorithm a)
{
    return (unsigned)a < KEEL_ALGORITHM_COUNT ? algo_names[a] : "?";
}

keel_status
keel_algorithm_from_name(const char *name, keel_algorithm *out)
{
    for (int i = 0; name != NULL && i < KEEL_ALGORITHM_COUNT; i++)
        if (strcmp(name, algo_names[i]) == 0) {
            *out = (keel_algorithm)i;
            return KEEL_OK;
        }
    return keel__fail(KEEL_EINVAL, "unknown algorithm '%s' (want sync, "
                      "async, hogwild, downpour, downpour_easy, agn, sagn, "
                      "adag, dynsgd, easgd, aeasgd, aeamsgd or "
                      "model_averaging)", name ? name : "(null)");
}

int
keel_algorithm_is_sync(keel_algorithm a)
{
    return a == KEEL_ALGORITHM_SYNC || a == KEEL_ALGORITHM_SAGN ||
           a == KEEL_ALGORITHM_EASGD || a == KEEL_ALGORITHM_MODEL_AVERAGING;
}

void
keel_algorithm_config_init(keel_algorithm_config *cfg, keel_algorithm name)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->name = name;
}

/* The window a rule uses when the config says 0 (docs/algorithms.md has
 * the sources). */
static int
default_window(keel_algorithm a)
{
    switch (a) {
    case KEEL_ALGORITHM_AGN:
    case KEEL_ALGORITHM_SAGN:
    case KEEL_ALGORITHM_ADAG:
        return 12;
    case KEEL_ALGORITHM_DYNSGD:
        return 5;
    case KEEL_ALGORITHM_AEASGD:
    case KEEL_ALGORITHM_AEAMSGD:
        return 32;
    case KEEL_ALGORITHM_MODEL_AVERAGING:
        return 10;
    default:
        return 1;
    }
}

int
keel_algorithm_pushes_gradients(keel_algorithm a)
{
    return a == KEEL_ALGORITHM_SYNC || a == KEEL_ALGORITHM_ASYNC ||
           a == KEEL_ALGORITHM_HOGWILD;
}

int
keel_algorithm_admits_joiners(keel_algorithm a)
{
    return !keel_algorithm_is_sync(a) && a != KEEL_ALGORITHM_DYNSGD &&
           a != KEEL_ALGORITHM_ADAG;
}

/* Every rate and count of c is >= 0 and finite, momentum in [0, 1). */
static keel_status
resolve_check_ranges(const keel_algorithm_config *c)
{
    if (!(c->learning_rate >= 0) || !(c->ps_learning_rate >= 0) ||
        !(c->epsilon >= 0) || !(c->moving_rate >= 0) ||
        !(c->momentum >= 0) || c->momentum >= 1 || c->window < 0 ||
        c->n_fetch < 0 || c->n_push < 0 || !isfinite(c->learning_rate) ||
        !isfinite(c->ps_learning_rate) || !isfinite(c->moving_rate))
        return keel__fail(KEEL_EINVAL, "algorithm %s: learning_rate %g, "
                          "ps_learning_rate %g, epsilon %g, moving_rate %g, "
                          "window %d, n_fetch %d, n_push %d must be >= 0 "
                          "and finite, momentum %g in [0, 1)",
                          keel_algorithm_name(c->name), c->learning_rate,
                          c->ps_learning_rate, c->epsilon, c->moving_rate,
                          c->window, c->n_fetch, c->n_push, c->momentum);
    return KEEL_OK;
}

/* The defaults of the members left 0; out->replicas is set (moving_rate's
 * default depends on it). */
static void
resolve_defaults(keel__algo *out)
{
    keel_algorithm_config *c = &out->c;
    if (c->window == 0)
        c->window = default_window(c->name);
    if (c->n_fetch == 0)
        c->n_fetch = 5;
    if (c->n_push == 0)
        c->n_push = 5;
    if (c->epsilon == 0)
        c->epsilon = 1e-8;
    if (c->momentum == 0)
        c->momentum = 0.9;
    if (c->moving_rate == 0)
        c->moving_rate = 0.9 / out->replicas;
}

/* Sync's per-worker learning rates from in: one per replica, each >= 0
 * and finite, copied into out->worker_lrs. */
static keel_status
resolve_worker_lrs(const keel_algorithm_config *in, keel__algo *out)
{
    keel_algorithm_config *c = &out->c;
    if (c->name != KEEL_ALGORITHM_SYNC)
        return keel__fail(KEEL_EINVAL, "algorithm %s: per-worker "
                          "learning rates apply to sync only",
                          keel_algorithm_name(c->name));
    if (in->worker_learning_rates == NULL ||
        in->n_worker_learning_rates != out->replicas)
        return keel__fail(KEEL_EINVAL, "algorithm sync: %d per-worker "
                          "learning rates for %d replicas (give one "
                          "per replica: the chief's first)",
                          in->n_worker_learning_rates, out->replicas);
    out->worker_lrs = malloc((size_t)out->replicas * sizeof *out->worker_lrs);
    if (out->worker_lrs == NULL)
        return keel__fail(KEEL_ENOMEM, "algorithm: %d rates", out->replicas);
    for (int r = 0; r < out->replicas; r++) {
        double v = in->worker_learning_rates[r];
        if (!(v >= 0) || !isfinite(v)) {
            free(out->worker_lrs);
            out->worker_lrs = NULL;
            return keel__fail(KEEL_EINVAL, "algorithm sync: learning "
                              "rate %g of replica %d must be >= 0", v, r);
        }
        out->worker_lrs[r] = v;
    }
    c->n_worker_learning_rates = out->replicas;
    return KEEL_OK;
}

keel_status
keel__algo_resolve(const keel_algorithm_config *in, keel_cluster_mode mode,
                   const keel_optimizer_config *opt, int replicas,
                   keel__algo *out)
{
    keel_algorithm_config d;
    keel_algorithm_config *c = &out->c;
    keel_status st;
    memset(out, 0, sizeof *out);
    if (in == NULL) {
        keel_algorithm_config_init(&d, mode == KEEL_CLUSTER_ASYNC
                                           ? KEEL_ALGORITHM_ASYNC
                                           : KEEL_ALGORITHM_SYNC);
        in = &d;
    } else if ((st = KEEL__STRUCT_CHECK(in, keel_algorithm_config)) !=
               KEEL_OK) {
        return st;
    }
    if ((unsigned)in->name >= KEEL_ALGORITHM_COUNT)
        return keel__fail(KEEL_EINVAL, "algorithm %d is not a "
                          "keel_algorithm", (int)in->name);
    *c = *in;
    c->worker_learning_rates = NULL;
    if ((st = resolve_check_ranges(c)) != KEEL_OK)
        return st;
    out->replicas = replicas > 0 ? replicas : 1;
    resolve_defaults(out);
    if (opt != NULL)
        out->schedule = opt->schedule;
    else
        keel_lr_schedule_init(&out->schedule);
    if (in->n_worker_learning_rates > 0)
        return resolve_worker_lrs(in, out);
    return KEEL_OK;
}

void
keel__algo_clear(keel__algo *a)
{
    if (a == NULL)
        return;
    free(a->worker_lrs);
    a->worker_lrs = NULL;
}

double
keel__algo_lr(const keel__algo *a, int64_t step)
{
    return a->c.learning_rate > 0 ? a->c.learning_rate
                                  : keel_lr_at(&a->schedule, step);
}

double
keel__algo_ps_lr(const keel__algo *a, int64_t step)
{
    return a->c.ps_learning_rate > 0 ? a->c.ps_learning_rate
                                     : keel_lr_at(&a->schedule, step);
}

double
keel__algo_worker_scale(const keel__algo *a, int replica, int64_t step)
{
    double base;
    if (a->worker_lrs == NULL || replica < 0 || replica >= a->replicas)
        return 1.0;
    base = keel_lr_at(&a->schedule, step);
    return base > 0 ? a->worker_lrs[replica] / base : 0.0;
}

/* ADAG's slot of the center at replica's last pull, "adag_pull<replica>",
 * into name. */
static void
adag_slot_name(int replica, char *name, size_t size)
{
    snprintf(name, size, "adag_pull%d", replica);
}

keel_status
keel__algo_prepare(const keel__algo *a, keel_vars *vs)
{
    for (size_t i = 0; i < keel_vars_count(vs); i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_status st = KEEL_OK;
        if (!keel_var_is_trainable(v))
            continue;
        if (a->c.name == KEEL_ALGORITHM_DOWNPOUR)
            st = keel_var_add_slot(v, "downpour_accumulator", NULL);
        for (int r = 0; a->c.name == KEEL_ALGORITHM_ADAG && r < a->replicas &&
                        st == KEEL_OK; r++) {
            char name[32];
            adag_slot_name(r, name, sizeof name);
            st = keel_var_add_slot(v, name, NULL);
        }
        if (st != KEEL_OK)
            return keel__wrap(st, "algorithm %s: slots of '%s'",
                              keel_algorithm_name(a->c.name),
                              keel_var_name(v));
    }
    return KEEL_OK;
}

/* ---- the ps's half ------------------------------------------------------ */

keel_status
keel__algo_ps_init(keel__algo_ps *p, const keel__algo *a)
{
    memset(p, 0, sizeof *p);
    p->a = a;
    p->pulled_at = calloc((size_t)a->replicas, sizeof *p->pulled_at);
    if (p->pulled_at == NULL)
        return keel__fail(KEEL_ENOMEM, "algorithm: %d replicas",
                          a->replicas);
    return KEEL_OK;
}

void
keel__algo_ps_clear(keel__algo_ps *p)
{
    if (p == NULL)
        return;
    free(p->pulled_at);
    p->pulled_at = NULL;
}

static keel_tensor *
adag_slot(keel_var *v, int replica)
{
    char name[32];
    adag_slot_name(replica, name, sizeof name);
    return keel_var_slot(v, name);
}

/* DOWNPOUR's Adagrad: acc += d^2; theta -= gamma * d / (sqrt(acc) + eps) */
static keel_status
commit_downpour(const keel__algo *a, keel_var *v, const keel_tensor *c,
                int64_t step)
{
    keel_tensor *t = keel_var_tensor(v);
    keel_tensor *acc = keel_var_slot(v, "downpour_accumulator");
    double g = keel__algo_ps_lr(a, step), eps = a->c.epsilon;
    float *th = t->data;
    const float *d = c->data;
    if (acc == NULL)
        return keel__fail(KEEL_EINTERNAL, "'%s' has no "
                          "downpour_accumulator slot", keel_var_name(v));
    for (size_t i = 0, n = t->count; i < n; i++) {
        acc->data[i] += d[i] * d[i];
        th[i] = (float)(th[i] - g * d[i] / (sqrt((double)acc->data[i]) + eps));
    }
    return KEEL_OK;
}

/* DOWNPOUR_EASY: theta -= gamma * d */
static void
commit_sgd(const keel__algo *a, keel_tensor *t, const keel_tensor *c,
           int64_t step)
{
    double g = keel__algo_ps_lr(a, step);
    float *th = t->data;
    const float *d = c->data;
    for (size_t i = 0, n = t->count; i < n; i++)
        th[i] = (float)(th[i] - g * d[i]);
}

/* DYNSGD: theta += d / (tau + 1), tau = commits since the replica's pull */
static void
commit_dynsgd(const keel__algo_ps *p, keel_tensor *t, const keel_tensor *c,
              int replica)
{
    int64_t tau = replica >= 0 && replica < p->a->replicas
                      ? p->commits - p->pulled_at[replica] : 0;
    double f = 1.0 / (double)((tau > 0 ? tau : 0) + 1);
    float *th = t->data;
    const float *d = c->data;
    for (size_t i = 0, n = t->count; i < n; i++)
        th[i] = (float)(th[i] + f * d[i]);
}

/* ADAG: theta += d / (eta^-1 * (theta - m_r)^2 + 1), element-wise */
static keel_status
commit_adag(const keel__algo *a, keel_var *v, const keel_tensor *c,
            int replica, int64_t step)
{
    keel_tensor *t = keel_var_tensor(v);
    keel_tensor *m = replica >= 0 ? adag_slot(v, replica) : NULL;
    double eta = keel__algo_lr(a, step);
    float *th = t->data;
    const float *d = c->data;
    if (m == NULL)
        return keel__fail(KEEL_EINVAL, "ADAG commit to '%s' from replica "
                          "%d, which has no pull state", keel_var_name(v),
                          replica);
    if (!(eta > 0))
        return keel__fail(KEEL_EINVAL, "ADAG needs a learning rate > 0 "
                          "(algorithm.learning_rate or the optimizer's)");
    for (size_t i = 0, n = t->count; i < n; i++) {
        double dist = (double)th[i] - (double)m->data[i];
        th[i] = (float)(th[i] + d[i] / (dist * dist / eta + 1.0));
    }
    return KEEL_OK;
}

/* The averaging family: theta += d (the worker sent the change) */
static void
commit_add(keel_tensor *t, const keel_tensor *c)
{
    float *th = t->data;
    const float *d = c->data;
    for (size_t i = 0, n = t->count; i < n; i++)
        th[i] += d[i];
}

keel_status
keel__algo_ps_commit(keel__algo_ps *p, keel_var *v, const keel_tensor *c,
                     int replica, int64_t step)
{
    const keel__algo *a = p->a;
    keel_tensor *t = keel_var_tensor(v);
    size_t n = t->count;
    if (c->count != n)
        return keel__fail(KEEL_EINVAL, "commit to '%s': %zu values for %zu",
                          keel_var_name(v), c->count, n);
    switch (a->c.name) {
    case KEEL_ALGORITHM_DOWNPOUR:
        return commit_downpour(a, v, c, step);
    case KEEL_ALGORITHM_DOWNPOUR_EASY:
        commit_sgd(a, t, c, step);
        return KEEL_OK;
    case KEEL_ALGORITHM_DYNSGD:
        commit_dynsgd(p, t, c, replica);
        return KEEL_OK;
    case KEEL_ALGORITHM_ADAG:
        return commit_adag(a, v, c, replica, step);
    case KEEL_ALGORITHM_AGN:
    case KEEL_ALGORITHM_SAGN:
    case KEEL_ALGORITHM_EASGD:
    case KEEL_ALGORITHM_AEASGD:
    case KEEL_ALGORITHM_AEAMSGD:
    case KEEL_ALGORITHM_MODEL_AVERAGING:
        commit_add(t, c);
        return KEEL_OK;
    default:
        return keel__fail(KEEL_EINTERNAL, "algorithm %s has no ps commit",
                          keel_algorithm_name(a->c.name));
    }
}

void
keel__algo_ps_commit_end(keel__algo_ps *p, int replica)
{
    (void)replica;
    p->commits++;
}

void
keel__algo_ps_pulled(keel__algo_ps *p, keel_var *v, int replica)
{
    keel_tensor *m;
    if (p->a->c.name != KEEL_ALGORITHM_ADAG || replica < 0 ||
        !keel_var_is_trainable(v) || (m = adag_slot(v, replica)) == NULL)
        return;
    memcpy(m->data, keel_var_tensor(v)->data, m->count * sizeof(float));
}

void
keel__algo_ps_pulled_end(keel__algo_ps *p, int replica)
{
    if (replica >= 0 && replica < p->a->replicas)
        p->pulled_at[replica] = p->commits;
}

void
keel__algo_ps_reset(keel__algo_ps *p)
{
    for (int r = 0; r < p->a->replicas; r++)
        p->pulled_at[r] = p->commits;
}

/* ---- the worker's half -------------------------------------------------- */

struct keel__algo_worker {
    const keel__algo *a;
    int replica;
    long t;                     /* local steps since the (re)start */
    long since;                 /* steps since the last commit */
    keel_grads *acc;            /* a (agn family), accrued (downpour) */
    keel_grads *center;         /* the center last received */
    keel_grads *vel;            /* v (aeamsgd) */
    keel_grads *theta;          /* theta (aeamsgd: vs holds the look-ahead
                                 * theta + delta v) */
    keel_grads *commit;         /* what goes to the ps */
};

keel_status
keel__algo_worker_new(const keel__algo *a, int replica, const keel_vars *vs,
                      keel__algo_worker **out)
{
    keel__algo_worker *w = calloc(1, sizeof *w);
    keel_status st;
    *out = NULL;
    if (w == NULL)
        return keel__fail(KEEL_ENOMEM, "algorithm worker");
    w->a = a;
    w->replica = replica;
    st = keel_grads_new(vs, &w->acc);
    if (st == KEEL_OK)
        st = keel_grads_new(vs, &w->center);
    if (st == KEEL_OK)
        st = keel_grads_new(vs, &w->commit);
    if (st == KEEL_OK && a->c.name == KEEL_ALGORITHM_AEAMSGD) {
        st = keel_grads_new(vs, &w->vel);
        if (st == KEEL_OK)
            st = keel_grads_new(vs, &w->theta);
    }
    if (st != KEEL_OK) {
        keel__algo_worker_free(w);
        return st;
    }
    *out = w;
    return KEEL_OK;
}

void
keel__algo_worker_free(keel__algo_worker *w)
{
    if (w == NULL)
        return;
    keel_grads_free(w->acc);
    keel_grads_free(w->center);
    keel_grads_free(w->vel);
    keel_grads_free(w->theta);
    keel_grads_free(w->commit);
    free(w);
}

keel_grads *
keel__algo_worker_center(keel__algo_worker *w)
{
    return w->center;
}

/* dst = the trainable variables of vs */
static void
copy_vars(keel_grads *dst, keel_vars *vs)
{
    for (size_t i = 0; i < keel_grads_count(dst); i++) {
        keel_tensor *d = keel_grads_at(dst, i);
        if (d != NULL)
            memcpy(d->data, keel_var_tensor(keel_vars_at(vs, i))->data,
                   d->count * sizeof(float));
    }
}

void
keel__algo_worker_restart(keel__algo_worker *w, keel_vars *vs)
{
    w->t = 0;
    w->since = 0;
    keel_grads_zero(w->acc);
    copy_vars(w->center, vs);
    if (w->vel != NULL) {
        keel_grads_zero(w->vel);
        copy_vars(w->theta, vs);
    }
}

long
keel__algo_worker_steps(const keel__algo_worker *w)
{
    return w->t;
}

/* Each trainable variable i: its value x, gradient g, and the worker's
 * tensors of the same index. */
#define FOR_TRAINABLE(w, vs, grads, i)                                       \
    for (size_t i = 0; i < keel_grads_count((w)->acc); i++)                   \
        if (keel_grads_at((w)->acc, i) != NULL &&                             \
            keel_grads_at((grads), i) != NULL)

/* One worker step: what every rule's step reads (on the stack: a step
 * allocates nothing). */
typedef struct algo_step {
    keel__algo_worker *w;
    keel_vars *vs;
    keel_grads *grads;
    int64_t global_step;
    double eta;                 /* the local learning rate at global_step */
    const keel__algo_io *io;
    int64_t *new_step;
} algo_step;

static float *
var_data(keel_vars *vs, size_t i)
{
    return keel_var_tensor(keel_vars_at(vs, i))->data;
}

/* The local step is taken: one more since the restart and the commit. */
static void
count_step(keel__algo_worker *w)
{
    w->t++;
    w->since++;
}

/* Commit w->commit (covering the steps since the last commit); with into,
 * the center comes back into vs or w->center. */
static keel_status
io_commit(const algo_step *s, int into)
{
    keel__algo_worker *w = s->w;
    int sync = keel_algorithm_is_sync(w->a->c.name);
    int covered = (int)w->since;
    /* a sync round is named by the step it began at (the ps's step) */
    int64_t local_step = sync ? s->global_step - (covered - 1)
                              : s->global_step;
    w->since = 0;
    return s->io->commit(s->io->ctx, w->commit, covered, local_step, into,
                         s->vs, w->center, s->new_step);
}

/* downpour, downpour_easy: accrued += g; theta -= alpha g; commit at step
 * mod n_push == 0; pull before each step with step mod n_fetch == 0 */
static keel_status
downpour_step(const algo_step *s)
{
    keel__algo_worker *w = s->w;
    const keel_algorithm_config *c = &w->a->c;
    double eta = s->eta;
    long step = w->t;
    keel_status st = KEEL_OK;
    FOR_TRAINABLE(w, s->vs, s->grads, i) {
        keel_tensor *acc = keel_grads_at(w->acc, i);
        float *x = var_data(s->vs, i);
        const float *g = keel_grads_at(s->grads, i)->data;
        for (size_t k = 0; k < acc->count; k++) {
            acc->data[k] += g[k];
            x[k] = (float)(x[k] - eta * g[k]);
        }
    }
    count_step(w);
    if (step % c->n_push == 0) {
        FOR_TRAINABLE(w, s->vs, s->grads, i) {
            keel_tensor *acc = keel_grads_at(w->acc, i);
            memcpy(keel_grads_at(w->commit, i)->data, acc->data,
                   acc->count * sizeof(float));
            memset(acc->data, 0, acc->count * sizeof(float));
        }
        st = io_commit(s, KEEL__ALGO_INTO_NONE);
    }
    if (st == KEEL_OK && w->t % c->n_fetch == 0)
        st = s->io->pull(s->io->ctx, KEEL__ALGO_INTO_VARS, s->vs, w->center,
                         s->new_step);
    return st;
}

/* agn, sagn, adag, dynsgd: a -= eta g; theta -= eta g; every lambda steps
 * commit a / lambda (agn, adag), a / (lambda R) (sagn: the ps sums the R
 * shares), a (dynsgd), then theta = the center */
static keel_status
agn_step(const algo_step *s)
{
    keel__algo_worker *w = s->w;
    const keel_algorithm_config *c = &w->a->c;
    double eta = s->eta;
    double scale = c->name == KEEL_ALGORITHM_DYNSGD ? 1.0
                   : c->name == KEEL_ALGORITHM_SAGN
                       ? 1.0 / ((double)c->window * w->a->replicas)
                       : 1.0 / (double)c->window;
    FOR_TRAINABLE(w, s->vs, s->grads, i) {
        keel_tensor *acc = keel_grads_at(w->acc, i);
        float *x = var_data(s->vs, i);
        const float *g = keel_grads_at(s->grads, i)->data;
        for (size_t k = 0; k < acc->count; k++) {
            float u = (float)(-eta * g[k]);
            acc->data[k] += u;
            x[k] += u;
        }
    }
    count_step(w);
    if (w->t % c->window != 0)
        return KEEL_OK;
    FOR_TRAINABLE(w, s->vs, s->grads, i) {
        keel_tensor *acc = keel_grads_at(w->acc, i);
        float *out = keel_grads_at(w->commit, i)->data;
        for (size_t k = 0; k < acc->count; k++)
            out[k] = (float)(acc->data[k] * scale);
        memset(acc->data, 0, acc->count * sizeof(float));
    }
    return io_commit(s, KEEL__ALGO_INTO_VARS);
}

/* model_averaging: theta -= eta g; every lambda steps commit (theta -
 * center) / R (the ps sums: center += mean of the local moves = mean
 * theta), then theta = center = the new center */
static keel_status
model_averaging_step(const algo_step *s)
{
    keel__algo_worker *w = s->w;
    double eta = s->eta;
    int R = w->a->replicas;
    keel_status st;
    FOR_TRAINABLE(w, s->vs, s->grads, i) {
        float *x = var_data(s->vs, i);
        const float *g = keel_grads_at(s->grads, i)->data;
        for (size_t k = 0; k < keel_grads_at(w->acc, i)->count; k++)
            x[k] = (float)(x[k] - eta * g[k]);
    }
    count_step(w);
    if (w->t % w->a->c.window != 0)
        return KEEL_OK;
    FOR_TRAINABLE(w, s->vs, s->grads, i) {
        keel_tensor *ct = keel_grads_at(w->center, i);
        const float *x = var_data(s->vs, i);
        float *out = keel_grads_at(w->commit, i)->data;
        for (size_t k = 0; k < ct->count; k++)
            out[k] = (float)(((double)x[k] - ct->data[k]) / R);
    }
    st = io_commit(s, KEEL__ALGO_INTO_VARS);
    if (st == KEEL_OK)
        copy_vars(w->center, s->vs);
    return st;
}

/* easgd: every tau-th step: e = alpha (theta - center); theta -= eta g +
 * e; commit e (the ps sums: center += alpha sum (theta_i - center)); the
 * new center comes back. Other steps: theta -= eta g. */
static keel_status
easgd_step(const algo_step *s)
{
    keel__algo_worker *w = s->w;
    double eta = s->eta, alpha = w->a->c.moving_rate;
    int elastic = (w->t + 1) % w->a->c.window == 0;
    FOR_TRAINABLE(w, s->vs, s->grads, i) {
        float *x = var_data(s->vs, i);
        const float *g = keel_grads_at(s->grads, i)->data;
        const float *ct = keel_grads_at(w->center, i)->data;
        float *e = keel_grads_at(w->commit, i)->data;
        for (size_t k = 0; k < keel_grads_at(w->acc, i)->count; k++) {
            float ek = elastic ? (float)(alpha * ((double)x[k] - ct[k]))
                               : 0.0f;
            e[k] = ek;
            x[k] = (float)(x[k] - eta * g[k] - ek);
        }
    }
    count_step(w);
    if (!elastic)
        return KEEL_OK;
    return io_commit(s, KEEL__ALGO_INTO_CENTER);
}

static int
is_aeamsgd(const keel__algo_worker *w)
{
    return w->a->c.name == KEEL_ALGORITHM_AEAMSGD;
}

/* The theta aeasgd and aeamsgd move: vs (aeasgd), w->theta (aeamsgd, whose
 * vs holds the look-ahead). */
static float *
aeasgd_theta(const algo_step *s, size_t i)
{
    return is_aeamsgd(s->w) ? keel_grads_at(s->w->theta, i)->data
                            : var_data(s->vs, i);
}

/* aeasgd: theta -= eta g. aeamsgd: g was taken at the look-ahead theta +
 * delta v (vs); v = delta v - eta g; theta += v. */
static void
aeasgd_local(const algo_step *s)
{
    keel__algo_worker *w = s->w;
    double eta = s->eta, delta = w->a->c.momentum;
    int mom = is_aeamsgd(w);
    FOR_TRAINABLE(w, s->vs, s->grads, i) {
        float *x = aeasgd_theta(s, i);
        float *v = mom ? keel_grads_at(w->vel, i)->data : NULL;
        const float *g = keel_grads_at(s->grads, i)->data;
        for (size_t k = 0; k < keel_grads_at(w->acc, i)->count; k++) {
            if (mom) {
                v[k] = (float)(delta * v[k] - eta * g[k]);
                x[k] += v[k];
            } else {
                x[k] = (float)(x[k] - eta * g[k]);
            }
        }
    }
}

/* With the center just pulled: E = alpha (theta - center); theta -= E;
 * Commit(E) (the ps adds it). */
static keel_status
aeasgd_elastic(const algo_step *s)
{
    keel__algo_worker *w = s->w;
    double alpha = w->a->c.moving_rate;
    FOR_TRAINABLE(w, s->vs, s->grads, i) {
        float *x = aeasgd_theta(s, i);
        const float *ct = keel_grads_at(w->center, i)->data;
        float *e = keel_grads_at(w->commit, i)->data;
        for (size_t k = 0; k < keel_grads_at(w->acc, i)->count; k++) {
            e[k] = (float)(alpha * ((double)x[k] - ct[k]));
            x[k] -= e[k];
        }
    }
    return io_commit(s, KEEL__ALGO_INTO_NONE);
}

/* aeamsgd: vs = the look-ahead theta + delta v for the next gradient */
static void
aeamsgd_look_ahead(const algo_step *s)
{
    keel__algo_worker *w = s->w;
    double delta = w->a->c.momentum;
    FOR_TRAINABLE(w, s->vs, s->grads, i) {
        float *out = var_data(s->vs, i);
        const float *x = keel_grads_at(w->theta, i)->data;
        const float *v = keel_grads_at(w->vel, i)->data;
        for (size_t k = 0; k < keel_grads_at(w->acc, i)->count; k++)
            out[k] = (float)(x[k] + delta * v[k]);
    }
}

/* aeasgd, aeamsgd: the local step, then every tau steps the elastic
 * exchange with the center. */
static keel_status
aeasgd_step(const algo_step *s)
{
    keel_status st = KEEL_OK;
    aeasgd_local(s);
    count_step(s->w);
    if (s->w->t % s->w->a->c.window == 0) {
        /* a failed pull ends the step here, vs untouched (no look-ahead);
         * a failed commit still leaves vs at the look-ahead */
        st = s->io->pull(s->io->ctx, KEEL__ALGO_INTO_CENTER, s->vs,
                         s->w->center, s->new_step);
        if (st != KEEL_OK)
            return st;
        st = aeasgd_elastic(s);
    }
    if (is_aeamsgd(s->w))
        aeamsgd_look_ahead(s);
    return st;
}

keel_status
keel__algo_worker_step(keel__algo_worker *w, keel_vars *vs,
                       keel_grads *grads, int64_t global_step,
                       const keel__algo_io *io, int64_t *new_step)
{
    algo_step s = { w, vs, grads, global_step,
                    keel__algo_lr(w->a, global_step), io, new_step };
    *new_step = -1;                     /* the session's own count */
    switch (w->a->c.name) {
    case KEEL_ALGORITHM_DOWNPOUR:
    case KEEL_ALGORITHM_DOWNPOUR_EASY:
        return downpour_step(&s);
    case KEEL_ALGORITHM_AGN:
    case KEEL_ALGORITHM_SAGN:
    case KEEL_ALGORITHM_ADAG:
    case KEEL_ALGORITHM_DYNSGD:
        return agn_step(&s);
    case KEEL_ALGORITHM_MODEL_AVERAGING:
        return model_averaging_step(&s);
    case KEEL_ALGORITHM_EASGD:
        return easgd_step(&s);
    case KEEL_ALGORITHM_AEASGD:
    case KEEL_ALGORITHM_AEAMSGD:
        return aeasgd_step(&s);
    default:
        return keel__fail(KEEL_EINTERNAL, "algorithm %s has no worker step",
                          keel_algorithm_name(w->a->c.name));
    }
}
