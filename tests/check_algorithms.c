/* check_algorithms.c - the cluster's update rules (keel_algorithm): for
 * each rule one ps commit and one worker cycle against values worked out
 * by hand from the rule's formulas (docs/algorithms.md), in the comment
 * beside each check; then every rule end to end on real sockets (a ps, the
 * chief and a worker as threads: few steps, the loss falls, the run ends),
 * and ADAG's per-replica ps state through a checkpoint and a resume. */
#include <config.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/keel.h>
#include <keel/distributed.h>
#include "util.h"
#include "../cluster/cluster_int.h"
#include "testutil.h"

#define TOL 2e-6f

/* ---- helpers ------------------------------------------------------------ */

/* A store with one trainable variable "w" of two elements. */
static keel_vars *
two_vars(float a, float b)
{
    keel_vars *vs;
    int64_t two[1] = { 2 };
    keel_var *v;
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "w", 1, two, KEEL_VAR_TRAINABLE,
                                      &v), KEEL_OK);
    keel_var_tensor(v)->data[0] = a;
    keel_var_tensor(v)->data[1] = b;
    keel_var_set_initialized(v, 1);
    return vs;
}

static float *
wdata(keel_vars *vs)
{
    return keel_var_tensor(keel_vars_find(vs, "w"))->data;
}

#define CK2(p, a, b)                                                        \
    do {                                                                    \
        ck_assert_float_eq_tol((p)[0], (float)(a), TOL);                    \
        ck_assert_float_eq_tol((p)[1], (float)(b), TOL);                    \
    } while (0)

/* p[0], p[1] = a, b */
static void
set2(float *p, float a, float b)
{
    p[0] = a;
    p[1] = b;
}

static keel__algo
algo(keel_algorithm name, int replicas, double eta, int window)
{
    keel_algorithm_config c;
    keel_optimizer_config oc;
    keel__algo a;
    keel_algorithm_config_init(&c, name);
    c.learning_rate = eta;
    c.window = window;
    keel_optimizer_config_init(&oc, KEEL_OPT_SGD);
    oc.schedule.learning_rate = 0.1;
    ck_assert_int_eq(keel__algo_resolve(&c, KEEL_CLUSTER_SYNC, &oc, replicas,
                                        &a), KEEL_OK);
    return a;
}

/* The ps in this process: commits go through keel__algo_ps_commit as
 * replica `replica` (-1 for a sync round's sum, as the ps's aggregate
 * passes it), the center travels back like the network's replies. */
typedef struct fake {
    keel__algo_ps ps;
    keel_vars *center;
    int replica;
    int sync;
    int64_t step;
    int commits, pulls, last_covered;
    int64_t last_local_step;
    float last_commit[2];
    keel_status pull_fails;     /* KEEL_OK, or what every pull returns */
} fake;

static void
fake_send(fake *f, int into, keel_vars *vs, keel_grads *center)
{
    keel_var *v = keel_vars_find(f->center, "w");
    float *src = keel_var_tensor(v)->data;
    if (into == KEEL__ALGO_INTO_VARS)
        memcpy(wdata(vs), src, 2 * sizeof(float));
    else if (into == KEEL__ALGO_INTO_CENTER)
        memcpy(keel_grads_find(center, "w")->data, src, 2 * sizeof(float));
    if (into != KEEL__ALGO_INTO_NONE) {
        keel__algo_ps_pulled(&f->ps, v, f->replica);
        keel__algo_ps_pulled_end(&f->ps, f->replica);
    }
}

static keel_status
fake_commit(void *ctx, keel_grads *c, int covered, int64_t local_step,
            int into, keel_vars *vs, keel_grads *center, int64_t *new_step)
{
    fake *f = ctx;
    keel_tensor *t = keel_grads_find(c, "w");
    keel_status st = keel__algo_ps_commit(&f->ps,
                                          keel_vars_find(f->center, "w"), t,
                                          f->sync ? -1 : f->replica, f->step);
    if (st != KEEL_OK)
        return st;
    keel__algo_ps_commit_end(&f->ps, f->sync ? -1 : f->replica);
    memcpy(f->last_commit, t->data, sizeof f->last_commit);
    f->commits++;
    f->last_covered = covered;
    f->last_local_step = local_step;
    f->step += covered;
    *new_step = f->step;
    fake_send(f, into, vs, center);
    return KEEL_OK;
}

static keel_status
fake_pull(void *ctx, int into, keel_vars *vs, keel_grads *center,
          int64_t *new_step)
{
    fake *f = ctx;
    f->pulls++;
    if (f->pull_fails != KEEL_OK)
        return keel__fail(f->pull_fails, "fake ps: pull refused");
    *new_step = f->step;
    fake_send(f, into, vs, center);
    return KEEL_OK;
}

/* A worker of rule a whose model is pulled from the fake ps's center
 * (c0, c1); the gradient each step is g. */
typedef struct cycle {
    keel__algo a;
    fake f;
    keel__algo_io io;
    keel_vars *vs;
    keel_grads *g;
    keel__algo_worker *w;
    int64_t gstep;
} cycle;

static void
cycle_init(cycle *c, keel__algo a, int replica, float c0, float c1)
{
    memset(c, 0, sizeof *c);
    c->a = a;
    ck_assert_int_eq(keel__algo_ps_init(&c->f.ps, &c->a), KEEL_OK);
    c->f.center = two_vars(c0, c1);
    ck_assert_int_eq(keel__algo_prepare(&c->a, c->f.center), KEEL_OK);
    c->f.replica = replica;
    c->f.sync = keel_algorithm_is_sync(a.c.name);
    c->io.ctx = &c->f;
    c->io.commit = fake_commit;
    c->io.pull = fake_pull;
    c->vs = two_vars(c0, c1);
    ck_assert_int_eq(keel_grads_new(c->vs, &c->g), KEEL_OK);
    ck_assert_int_eq(keel__algo_worker_new(&c->a, replica, c->vs, &c->w),
                     KEEL_OK);
    /* the worker pulled: the ps knows, the worker starts a cycle */
    keel__algo_ps_pulled(&c->f.ps, keel_vars_find(c->f.center, "w"),
                         replica);
    keel__algo_ps_pulled_end(&c->f.ps, replica);
    keel__algo_worker_restart(c->w, c->vs);
}

/* One step with gradient (g0, g1); the session's step count as the
 * backend keeps it (the reply's step, else + 1). */
static void
cycle_step(cycle *c, float g0, float g1)
{
    int64_t ns = -1;
    set2(keel_grads_find(c->g, "w")->data, g0, g1);
    ck_assert_int_eq(keel__algo_worker_step(c->w, c->vs, c->g, c->gstep,
                                            &c->io, &ns), KEEL_OK);
    c->gstep = ns >= 0 ? ns : c->gstep + 1;
}

static void
cycle_free(cycle *c)
{
    keel__algo_worker_free(c->w);
    keel_grads_free(c->g);
    keel_vars_free(c->vs);
    keel_vars_free(c->f.center);
    keel__algo_ps_clear(&c->f.ps);
    keel__algo_clear(&c->a);
}

/* The ps's commit of a sync round's sum (s0, s1) to a fresh center (1, 2);
 * the center after it must be (e0, e1). */
static void
round_sum(keel__algo_ps *ps, float s0, float s1, float e0, float e1)
{
    keel_vars *center = two_vars(1, 2);
    keel_grads *g;
    keel_tensor *sum;
    ck_assert_int_eq(keel_grads_new(center, &g), KEEL_OK);
    sum = keel_grads_find(g, "w");
    set2(sum->data, s0, s1);
    ck_assert_int_eq(keel__algo_ps_commit(ps, keel_vars_find(center, "w"),
                                          sum, -1, 0), KEEL_OK);
    CK2(wdata(center), e0, e1);
    keel_grads_free(g);
    keel_vars_free(center);
}

/* DOWNPOUR or DOWNPOUR-Easy, 2 replicas, alpha = eta = 0.5, n_fetch =
 * n_push = 2, gamma = 0.25: replica 1 over the center (1, 2). */
static void
downpour_init(cycle *c, keel_algorithm name)
{
    keel__algo a = algo(name, 2, 0.5, 0);
    a.c.n_fetch = a.c.n_push = 2;
    a.c.ps_learning_rate = 0.25;
    cycle_init(c, a, 1, 1, 2);
}

/* An elastic rule (EASGD, AEASGD, AEAMSGD), 2 replicas, eta 0.5, alpha
 * 0.25, window tau, momentum delta (0: the default) over the center
 * (1, 2). */
static void
elastic_init(cycle *c, keel_algorithm name, int tau, int replica,
             double delta)
{
    keel__algo a = algo(name, 2, 0.5, tau);
    a.c.moving_rate = 0.25;
    if (delta > 0)
        a.c.momentum = delta;
    cycle_init(c, a, replica, 1, 2);
}

/* ---- names and defaults -------------------------------------------------- */

START_TEST(test_names_round_trip_and_bad_names_are_named)
{
    keel_algorithm a;
    for (int i = 0; i < KEEL_ALGORITHM_COUNT; i++) {
        ck_assert_int_eq(keel_algorithm_from_name(
                             keel_algorithm_name((keel_algorithm)i), &a),
                         KEEL_OK);
        ck_assert_int_eq(a, i);
    }
    ck_assert_str_eq(keel_algorithm_name(KEEL_ALGORITHM_DOWNPOUR_EASY),
                     "downpour_easy");
    ck_assert_str_eq(keel_algorithm_name((keel_algorithm)99), "?");
    ck_assert_int_eq(keel_algorithm_from_name("elastic", &a), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'elastic'"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "aeamsgd"));
    ck_assert(keel_algorithm_is_sync(KEEL_ALGORITHM_SAGN));
    ck_assert(keel_algorithm_is_sync(KEEL_ALGORITHM_EASGD));
    ck_assert(keel_algorithm_is_sync(KEEL_ALGORITHM_MODEL_AVERAGING));
    ck_assert(!keel_algorithm_is_sync(KEEL_ALGORITHM_AEASGD));
    ck_assert(!keel_algorithm_is_sync(KEEL_ALGORITHM_HOGWILD));
}
END_TEST

/* Defaults (docs/algorithms.md): agn/sagn/adag lambda 12, dynsgd 5,
 * aeasgd/aeamsgd tau 32, model_averaging 10, easgd 1; n_fetch = n_push =
 * 5; alpha = 0.9 / p (p = 4: 0.225); delta 0.9; no config: the mode. */
START_TEST(test_defaults_resolve_per_rule)
{
    keel__algo a;
    keel_algorithm_config c;
    static const struct { keel_algorithm n; int window; } w[] = {
        { KEEL_ALGORITHM_AGN, 12 }, { KEEL_ALGORITHM_SAGN, 12 },
        { KEEL_ALGORITHM_ADAG, 12 }, { KEEL_ALGORITHM_DYNSGD, 5 },
        { KEEL_ALGORITHM_AEASGD, 32 }, { KEEL_ALGORITHM_AEAMSGD, 32 },
        { KEEL_ALGORITHM_MODEL_AVERAGING, 10 }, { KEEL_ALGORITHM_EASGD, 1 },
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        keel_algorithm_config_init(&c, w[i].n);
        ck_assert_int_eq(keel__algo_resolve(&c, KEEL_CLUSTER_SYNC, NULL, 4,
                                            &a), KEEL_OK);
        ck_assert_int_eq(a.c.window, w[i].window);
        ck_assert_int_eq(a.c.n_fetch, 5);
        ck_assert_int_eq(a.c.n_push, 5);
        ck_assert_float_eq_tol(a.c.moving_rate, 0.225, 1e-12);
        ck_assert_float_eq_tol(a.c.momentum, 0.9, 1e-12);
        keel__algo_clear(&a);
    }
    ck_assert_int_eq(keel__algo_resolve(NULL, KEEL_CLUSTER_ASYNC, NULL, 2,
                                        &a), KEEL_OK);
    ck_assert_int_eq(a.c.name, KEEL_ALGORITHM_ASYNC);
    keel_algorithm_config_init(&c, KEEL_ALGORITHM_AGN);
    c.momentum = 1.0;
    ck_assert_int_eq(keel__algo_resolve(&c, KEEL_CLUSTER_SYNC, NULL, 2, &a),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "momentum"));
    c.momentum = 0;
    c.struct_size = 4;
    ck_assert_int_eq(keel__algo_resolve(&c, KEEL_CLUSTER_SYNC, NULL, 2, &a),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "struct_size"));
}
END_TEST

/* Sync with per-worker rates: base rate 0.1, rates (0.1, 0.05, 0.2):
 * replica 1 scales its gradient by 0.05 / 0.1 = 0.5, replica 2 by 2. A
 * list of the wrong length or for another rule is an error. */
START_TEST(test_sync_per_worker_learning_rates)
{
    keel_algorithm_config c;
    keel_optimizer_config oc;
    keel__algo a;
    double rates[3] = { 0.1, 0.05, 0.2 };
    keel_optimizer_config_init(&oc, KEEL_OPT_SGD);
    oc.schedule.learning_rate = 0.1;
    keel_algorithm_config_init(&c, KEEL_ALGORITHM_SYNC);
    c.worker_learning_rates = rates;
    c.n_worker_learning_rates = 3;
    ck_assert_int_eq(keel__algo_resolve(&c, KEEL_CLUSTER_SYNC, &oc, 3, &a),
                     KEEL_OK);
    rates[1] = 7;                       /* copied */
    ck_assert_float_eq_tol(keel__algo_worker_scale(&a, 0, 0), 1.0, 1e-12);
    ck_assert_float_eq_tol(keel__algo_worker_scale(&a, 1, 0), 0.5, 1e-12);
    ck_assert_float_eq_tol(keel__algo_worker_scale(&a, 2, 0), 2.0, 1e-12);
    keel__algo_clear(&a);
    ck_assert_int_eq(keel__algo_resolve(&c, KEEL_CLUSTER_SYNC, &oc, 2, &a),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "3 per-worker"));
    c.name = KEEL_ALGORITHM_AGN;
    ck_assert_int_eq(keel__algo_resolve(&c, KEEL_CLUSTER_SYNC, &oc, 3, &a),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "sync only"));
}
END_TEST

/* ---- one worker cycle and one commit per rule ------------------------------
 * In every cycle the center starts at (1, 2), the worker pulls it, and
 * each step's gradient is g = (1, -2) unless said otherwise. */

/* AGN, lambda 2, eta 0.5:
 *   step 1: u = -0.5 g = (-0.5, 1); a = (-0.5, 1); theta = (0.5, 3)
 *   step 2: a = (-1, 2); theta = (0, 4); commit a / 2 = (-0.5, 1)
 *   ps: center = (1, 2) + (-0.5, 1) = (0.5, 3); theta = the center;
 *   the commit covers 2 steps: the global step 0 -> 2. */
START_TEST(test_agn_cycle)
{
    cycle c;
    cycle_init(&c, algo(KEEL_ALGORITHM_AGN, 2, 0.5, 2), 1, 1, 2);
    cycle_step(&c, 1, -2);
    CK2(wdata(c.vs), 0.5, 3);
    ck_assert_int_eq(c.f.commits, 0);
    ck_assert_int_eq(c.gstep, 1);
    cycle_step(&c, 1, -2);
    ck_assert_int_eq(c.f.commits, 1);
    CK2(c.f.last_commit, -0.5, 1);
    CK2(wdata(c.f.center), 0.5, 3);
    CK2(wdata(c.vs), 0.5, 3);
    ck_assert_int_eq(c.f.last_covered, 2);
    ck_assert_int_eq(c.gstep, 2);
    cycle_free(&c);
}
END_TEST

/* SAGN, lambda 2, eta 0.5, 2 replicas: the same a = (-1, 2), the share
 * a / (lambda R) = (-0.25, 0.5). The ps adds a round's sum; with the other
 * replica's share (0.75, -0.5) the sum is (0.5, 0): the mean of the two
 * normalised updates (-0.5, 1) and (1.5, -1). Center (1, 2) -> (1.5, 2).
 * The round is named by the step it began at: 2 - (2 - 1) - 1 = 0 when
 * the commit comes at step 1 (the second step of the round). */
START_TEST(test_sagn_cycle_and_round_sum)
{
    cycle c;
    cycle_init(&c, algo(KEEL_ALGORITHM_SAGN, 2, 0.5, 2), 0, 1, 2);
    /* the worker: the fake ps applies its share alone (1,2)+share */
    cycle_step(&c, 1, -2);
    cycle_step(&c, 1, -2);
    CK2(c.f.last_commit, -0.25, 0.5);
    ck_assert_int_eq(c.f.last_local_step, 0);
    CK2(wdata(c.vs), 0.75, 2.5);
    /* the ps: one round's sum of two shares */
    round_sum(&c.f.ps, -0.25f + 0.75f, 0.5f - 0.5f, 1.5f, 2);
    cycle_free(&c);
}
END_TEST

/* DOWNPOUR, n_fetch = n_push = 2, alpha = eta = 0.5, gamma = 0.25:
 *   t = 0: accrued = (1, -2); theta = (0.5, 3); 0 mod 2 = 0: commit
 *          (1, -2) (covers 1 step). ps Adagrad: acc = (1, 4); center -=
 *          0.25 (1 / 1, -2 / 2) -> (0.75, 2.25). t = 1: no pull.
 *   t = 1: accrued = (1, -2); theta = (0, 4); no commit; t = 2: pull,
 *          theta = (0.75, 2.25).
 *   t = 2: accrued = (2, -4); theta = (0.25, 3.25); commit (2, -4)
 *          (covers 2). acc = (5, 20); center -= 0.25 (2 / sqrt 5,
 *          -4 / sqrt 20) = 0.25 (0.8944272, -0.8944272) -> (0.5263932,
 *          2.4736068). (epsilon 1e-8 is below the tolerance.) */
START_TEST(test_downpour_cycle)
{
    cycle c;
    downpour_init(&c, KEEL_ALGORITHM_DOWNPOUR);
    cycle_step(&c, 1, -2);
    ck_assert_int_eq(c.f.commits, 1);
    ck_assert_int_eq(c.f.last_covered, 1);
    CK2(wdata(c.f.center), 0.75, 2.25);
    CK2(wdata(c.vs), 0.5, 3);
    CK2(keel_var_slot(keel_vars_find(c.f.center, "w"),
                      "downpour_accumulator")->data, 1, 4);
    cycle_step(&c, 1, -2);
    ck_assert_int_eq(c.f.commits, 1);
    ck_assert_int_eq(c.f.pulls, 1);
    CK2(wdata(c.vs), 0.75, 2.25);
    cycle_step(&c, 1, -2);
    ck_assert_int_eq(c.f.commits, 2);
    ck_assert_int_eq(c.f.last_covered, 2);
    CK2(c.f.last_commit, 2, -4);
    CK2(wdata(c.vs), 0.25, 3.25);
    CK2(wdata(c.f.center), 0.5263932, 2.4736068);
    cycle_free(&c);
}
END_TEST

/* DOWNPOUR-Easy: the same worker, SGD on the ps (center -= gamma commit):
 *   t = 0: center = (1, 2) - 0.25 (1, -2) = (0.75, 2.5)
 *   t = 1: pull after it: theta = (0.75, 2.5)
 *   t = 2: accrued (2, -4), theta = (0.25, 3.5); center = (0.75 - 0.5,
 *          2.5 + 1) = (0.25, 3.5). */
START_TEST(test_downpour_easy_cycle)
{
    cycle c;
    downpour_init(&c, KEEL_ALGORITHM_DOWNPOUR_EASY);
    cycle_step(&c, 1, -2);
    CK2(wdata(c.f.center), 0.75, 2.5);
    cycle_step(&c, 1, -2);
    CK2(wdata(c.vs), 0.75, 2.5);
    cycle_step(&c, 1, -2);
    CK2(wdata(c.vs), 0.25, 3.5);
    CK2(wdata(c.f.center), 0.25, 3.5);
    ck_assert_ptr_null(keel_var_slot(keel_vars_find(c.f.center, "w"),
                                     "downpour_accumulator"));
    cycle_free(&c);
}
END_TEST

/* ADAG, lambda 2, eta 0.5, replica 1 of 2. The worker is AGN's: commit
 * (-0.5, 1). Replica 1 pulled the center (1, 2): m_1 = (1, 2). Before
 * its commit another replica moved the center to (2, 2.5). Per element
 * the commit is divided by eta^-1 (center - m_1)^2 + 1:
 *   distance (1, 0.5): 2 * (1, 0.25) + 1 = (3, 1.5)
 *   center = (2 - 0.5 / 3, 2.5 + 1 / 1.5) = (1.8333333, 3.1666667)
 * and the reply (its new pull) sets m_1 to that center. */
START_TEST(test_adag_cycle)
{
    cycle c;
    keel_var *v;
    cycle_init(&c, algo(KEEL_ALGORITHM_ADAG, 2, 0.5, 2), 1, 1, 2);
    v = keel_vars_find(c.f.center, "w");
    CK2(keel_var_slot(v, "adag_pull1")->data, 1, 2);
    ck_assert_ptr_nonnull(keel_var_slot(v, "adag_pull0"));
    cycle_step(&c, 1, -2);
    set2(wdata(c.f.center), 2, 2.5f);   /* another replica's commit */
    cycle_step(&c, 1, -2);
    CK2(c.f.last_commit, -0.5, 1);
    CK2(wdata(c.f.center), 1.8333333, 3.1666667);
    CK2(wdata(c.vs), 1.8333333, 3.1666667);
    CK2(keel_var_slot(v, "adag_pull1")->data, 1.8333333, 3.1666667);
    cycle_free(&c);
}
END_TEST

/* DynSGD, lambda 2, eta 0.5: the worker commits a = (-1, 2) unscaled.
 * The ps clock: replica 1 pulled at c = 0; replica 0 (also at 0) commits
 * (3, 3) twice: tau = 0, then 1: center (1, 2) + (3, 3) + (1.5, 1.5) =
 * (5.5, 6.5), c = 2. Replica 1's commit: tau = 2 - 0 = 2: center += (-1,
 * 2) / 3 -> (5.1666667, 7.1666667), c = 3; its reply is a pull: its next
 * commit is fresh (tau 0). */
START_TEST(test_dynsgd_cycle)
{
    cycle c;
    keel_tensor t;
    float three[2] = { 3, 3 };
    int64_t shape[1] = { 2 };
    cycle_init(&c, algo(KEEL_ALGORITHM_DYNSGD, 2, 0.5, 2), 1, 1, 2);
    keel__algo_ps_pulled_end(&c.f.ps, 0);
    memset(&t, 0, sizeof t);
    t.ndim = 1;
    t.shape[0] = shape[0];
    t.count = 2;
    t.data = three;
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(keel__algo_ps_commit(&c.f.ps,
                                              keel_vars_find(c.f.center,
                                                             "w"),
                                              &t, 0, 0), KEEL_OK);
        keel__algo_ps_commit_end(&c.f.ps, 0);
    }
    CK2(wdata(c.f.center), 5.5, 6.5);
    cycle_step(&c, 1, -2);
    cycle_step(&c, 1, -2);
    CK2(c.f.last_commit, -1, 2);
    CK2(wdata(c.f.center), 5.1666667, 7.1666667);
    CK2(wdata(c.vs), 5.1666667, 7.1666667);
    /* fresh: the same commit again is applied whole: tau 0 */
    cycle_step(&c, 1, -2);
    cycle_step(&c, 1, -2);
    CK2(wdata(c.f.center), 4.1666667, 9.1666667);
    cycle_free(&c);
}
END_TEST

/* Model averaging, lambda 2, eta 0.5, 2 replicas:
 *   theta: (1, 2) -> (0.5, 3) -> (0, 4); commit (theta - center) / 2 =
 *   (-0.5, 1); alone on the fake ps the center becomes (0.5, 3).
 * With the other replica's move (2, 2) - (1, 2) = (1, 0), share (0.5, 0),
 * the round's sum (0, 1) makes the center (1, 3) = mean((0, 4), (2, 2)). */
START_TEST(test_model_averaging_cycle_and_mean)
{
    cycle c;
    cycle_init(&c, algo(KEEL_ALGORITHM_MODEL_AVERAGING, 2, 0.5, 2), 0, 1, 2);
    cycle_step(&c, 1, -2);
    CK2(wdata(c.vs), 0.5, 3);
    cycle_step(&c, 1, -2);
    CK2(c.f.last_commit, -0.5, 1);
    CK2(wdata(c.vs), 0.5, 3);
    round_sum(&c.f.ps, -0.5f + 0.5f, 1.0f + 0.0f, 1, 3);
    cycle_free(&c);
}
END_TEST

/* Synchronous EASGD, tau 1, eta 0.5, alpha 0.25:
 *   step 1: e = 0.25 ((1, 2) - (1, 2)) = 0; theta = (0.5, 3); commit 0;
 *           the center stays (1, 2) and comes back.
 *   step 2: e = 0.25 ((0.5, 3) - (1, 2)) = (-0.125, 0.25);
 *           theta = (0.5 - 0.5 + 0.125, 3 + 1 - 0.25) = (0.125, 3.75);
 *           ps: center + e = (0.875, 2.25), the worker's copy too. */
START_TEST(test_easgd_cycle)
{
    cycle c;
    elastic_init(&c, KEEL_ALGORITHM_EASGD, 1, 0, 0);
    cycle_step(&c, 1, -2);
    CK2(c.f.last_commit, 0, 0);
    CK2(wdata(c.vs), 0.5, 3);
    cycle_step(&c, 1, -2);
    CK2(c.f.last_commit, -0.125, 0.25);
    CK2(wdata(c.vs), 0.125, 3.75);
    CK2(wdata(c.f.center), 0.875, 2.25);
    CK2(keel_grads_find(keel__algo_worker_center(c.w), "w")->data,
        0.875, 2.25);
    ck_assert_int_eq(c.f.commits, 2);
    cycle_free(&c);
}
END_TEST

/* AEASGD, tau 2, eta 0.5, alpha 0.25:
 *   step 1: theta = (0.5, 3)
 *   (another replica moves the center to (2, 2))
 *   step 2: theta = (0, 4); t = 2: pull (2, 2); E = 0.25 ((0, 4) - (2, 2))
 *           = (-0.5, 0.5); theta = (0.5, 3.5); commit E: center (1.5,
 *           2.5). */
START_TEST(test_aeasgd_cycle)
{
    cycle c;
    elastic_init(&c, KEEL_ALGORITHM_AEASGD, 2, 1, 0);
    cycle_step(&c, 1, -2);
    CK2(wdata(c.vs), 0.5, 3);
    ck_assert_int_eq(c.f.pulls + c.f.commits, 0);
    set2(wdata(c.f.center), 2, 2);
    cycle_step(&c, 1, -2);
    ck_assert_int_eq(c.f.pulls, 1);
    CK2(c.f.last_commit, -0.5, 0.5);
    CK2(wdata(c.vs), 0.5, 3.5);
    CK2(wdata(c.f.center), 1.5, 2.5);
    cycle_free(&c);
}
END_TEST

/* AEAMSGD, tau 2, eta 0.5, alpha 0.25, delta 0.5; the step's gradient is
 * taken at the look-ahead phi = theta + delta v, which the store holds:
 *   step 1: v = -0.5 (1, -2) = (-0.5, 1); theta = (0.5, 3);
 *           phi = (0.25, 3.5)
 *   (the center moves to (2, 2))
 *   step 2: v = 0.5 (-0.5, 1) - (0.5, -1) = (-0.75, 1.5);
 *           theta = (-0.25, 4.5); pull (2, 2):
 *           E = 0.25 (-2.25, 2.5) = (-0.5625, 0.625);
 *           theta = (0.3125, 3.875); center = (1.4375, 2.625);
 *           phi = theta + 0.5 v = (-0.0625, 4.625). */
START_TEST(test_aeamsgd_cycle)
{
    cycle c;
    elastic_init(&c, KEEL_ALGORITHM_AEAMSGD, 2, 1, 0.5);
    cycle_step(&c, 1, -2);
    CK2(wdata(c.vs), 0.25, 3.5);
    set2(wdata(c.f.center), 2, 2);
    cycle_step(&c, 1, -2);
    CK2(c.f.last_commit, -0.5625, 0.625);
    CK2(wdata(c.f.center), 1.4375, 2.625);
    CK2(wdata(c.vs), -0.0625, 4.625);
    cycle_free(&c);
}
END_TEST

/* A pull that fails at the elastic step ends the step there: nothing is
 * committed and aeamsgd's vs keeps the look-ahead of the step before
 * (test_aeamsgd_cycle's step 1). */
START_TEST(test_aeamsgd_failed_pull_leaves_vs)
{
    cycle c;
    int64_t ns = -1;
    elastic_init(&c, KEEL_ALGORITHM_AEAMSGD, 2, 1, 0.5);
    cycle_step(&c, 1, -2);
    CK2(wdata(c.vs), 0.25, 3.5);
    c.f.pull_fails = KEEL_EIO;
    set2(keel_grads_find(c.g, "w")->data, 1, -2);
    ck_assert_int_eq(keel__algo_worker_step(c.w, c.vs, c.g, c.gstep, &c.io,
                                            &ns), KEEL_EIO);
    ck_assert_int_eq(c.f.pulls, 1);
    ck_assert_int_eq(c.f.commits, 0);
    CK2(wdata(c.vs), 0.25, 3.5);
    cycle_free(&c);
}
END_TEST

/* ---- end to end on real sockets --------------------------------------------
 * One ps, the chief and one worker (threads of this process, each with its
 * own store), least squares toward the target (3, -1): each replica's
 * gradient is 2 (w - target) plus a replica-dependent push that averages
 * out (+0.5 for the chief, -0.5 for the worker), so the loss |w - target|^2
 * must fall from 10 to well under 1 and every rule must end. */

typedef struct replica {
    keel_cluster_spec *spec;
    keel_cluster_config *opts;
    keel_optimizer_config *opt;
    keel_vars *vs;
    const char *dir;
    int64_t steps;
    float bias;
    keel_status st;
    int64_t final_step;
} replica;

static keel_status
lsq_step(void *ctx, keel_step *st)
{
    const replica *r = ctx;
    const float *w = keel_var_tensor(keel_vars_find(keel_step_vars(st),
                                                    "w"))->data;
    float *g = keel_grads_find(keel_step_grads(st), "w")->data;
    g[0] = 2 * (w[0] - 3) + r->bias;
    g[1] = 2 * (w[1] + 1) - r->bias;
    return KEEL_OK;
}

static void *
replica_main(void *arg)
{
    replica *r = arg;
    keel_training_config cfg;
    keel_session *s = NULL;
    keel_hook stop;
    keel_stop_at_step_hook_config stop_cfg;
    keel_stop_at_step_hook_config_init(&stop_cfg);
    stop_cfg.last_step = r->steps;
    r->st = keel_stop_at_step_hook_new(&stop_cfg, &stop);
    if (r->st != KEEL_OK)
        return NULL;
    keel_training_config_init(&cfg);
    cfg.session.manager.vars = r->vs;
    cfg.session.step = lsq_step;
    cfg.session.step_ctx = r;
    cfg.session.hooks = &stop;
    cfg.session.n_hooks = 1;
    cfg.optimizer = r->opt;
    cfg.cluster = r->spec;
    cfg.cluster_config = r->opts;
    cfg.session.manager.checkpoint_dir = r->dir;
    cfg.save_checkpoint_steps = 1000000;
    cfg.log_step_count_steps = 0;
    cfg.save_summaries_steps = 0;
    cfg.session.max_wait_secs = 60;
    r->st = keel_training_session_new(&cfg, &s);
    if (r->st == KEEL_OK)
        r->st = keel_session_train(s);
    if (r->st == KEEL_OK)
        r->st = keel_session_close(s);
    if (r->st == KEEL_EOUTOFRANGE)      /* the chief finished first */
        r->st = KEEL_OK;
    r->final_step = s ? keel_session_global_step(s) : -1;
    keel_session_free(s);
    keel_hook_release(&stop);
    return NULL;
}

static double
loss_of(const float *w)
{
    return (w[0] - 3.0) * (w[0] - 3.0) + (w[1] + 1.0) * (w[1] + 1.0);
}

static int
is_gradient_rule(keel_algorithm name)
{
    return name == KEEL_ALGORITHM_SYNC || name == KEEL_ALGORITHM_ASYNC ||
           name == KEEL_ALGORITHM_HOGWILD;
}

/* Train rule `name` for `steps` steps per replica; returns the loss of
 * the chief's final checkpointed model (the center). */
static double
e2e_train(keel_algorithm name, int with_worker, int64_t steps,
          const char *dir, keel_vars **keep)
{
    tu_cluster cl;
    keel_vars *ps_vs = two_vars(0, 0);
    keel_optimizer_config sgd;
    keel_algorithm_config ac;
    keel_cluster_config co;
    tu_ps p;
    keel_status ps_st;
    replica chief, worker;
    pthread_t tc, tw;
    double loss;

    tu_cluster_new(&cl, with_worker);
    keel_optimizer_config_init(&sgd, KEEL_OPT_SGD);
    sgd.schedule.learning_rate = 0.05;
    keel_algorithm_config_init(&ac, name);
    ac.window = 2;
    ac.n_fetch = ac.n_push = 2;
    ac.moving_rate = 0.2;
    ac.momentum = 0.5;
    if (name == KEEL_ALGORITHM_DOWNPOUR)
        ac.ps_learning_rate = 0.5;      /* Adagrad's steps shrink */
    keel_cluster_config_init(&co);
    co.optimizer = &sgd;
    co.algorithm = &ac;
    co.orphan_secs = 60;
    co.token = NULL;
    tu_ps_start(&p, cl.ps, ps_vs, &co);
    memset(&chief, 0, sizeof chief);
    chief.spec = cl.chief;
    chief.opts = &co;
    chief.opt = &sgd;
    chief.vs = two_vars(0, 0);
    chief.dir = dir;
    chief.steps = steps;
    chief.bias = 0.5f;
    worker = chief;
    worker.spec = cl.worker;
    worker.vs = two_vars(0, 0);
    worker.dir = NULL;
    worker.bias = -0.5f;
    ck_assert_int_eq(pthread_create(&tc, NULL, replica_main, &chief), 0);
    if (with_worker)
        ck_assert_int_eq(pthread_create(&tw, NULL, replica_main, &worker), 0);
    pthread_join(tc, NULL);
    if (with_worker)
        pthread_join(tw, NULL);
    ps_st = tu_ps_join(&p);
    ck_assert_msg(chief.st == KEEL_OK, "%s chief: %s",
                  keel_algorithm_name(name), keel_last_error());
    ck_assert_msg(!with_worker || worker.st == KEEL_OK, "%s worker failed",
                  keel_algorithm_name(name));
    ck_assert_int_eq(ps_st, KEEL_OK);
    /* a local-step rule's final checkpoint counts the ps's committed
     * steps: the chief's last window - 1 local steps may be unsent */
    ck_assert_int_ge(chief.final_step,
                     is_gradient_rule(name) ? steps : steps - 1);
    loss = loss_of(wdata(chief.vs));
    if (keep != NULL)
        *keep = chief.vs;
    else
        keel_vars_free(chief.vs);
    keel_vars_free(worker.vs);
    keel_vars_free(ps_vs);
    tu_cluster_free(&cl);
    return loss;
}

START_TEST(test_every_rule_trains_on_a_cluster)
{
    keel_algorithm name = (keel_algorithm)_i;
    char dir[256];
    double loss;
    tu_mkdtemp(dir, sizeof dir);
    /* from (0, 0) the loss is 9 + 1 = 10 */
    loss = e2e_train(name, 1, 60, dir, NULL);
    ck_assert_msg(loss < 1.0, "%s: loss %g after 60 steps",
                  keel_algorithm_name(name), loss);
    tu_rmrf(dir);
}
END_TEST

/* ADAG keeps, per replica, the center at that replica's last pull; it is
 * a slot on the ps, pulled into the chief's checkpoint and sent back by
 * the INIT of a resumed run. Chief alone, lambda 2: the final checkpoint
 * holds w/adag_pull0 equal to the final center (the chief's last commit
 * reply was its pull); a second run resumes at that step with that state
 * and goes on from the checkpoint's values. */
/* The chief applies each sync step's update itself (K-FAC) only under the
 * plain sync rule: any other rule, sync with per-worker rates and an async
 * cluster without a rule are refused by the ps and by the chief before
 * anything binds or connects, the error naming chief_applies and the
 * rule. */
static keel_status
no_apply(void *ctx, keel_vars *vs, keel_grads *mean, int64_t global_step)
{
    (void)ctx;
    (void)vs;
    (void)mean;
    (void)global_step;
    return KEEL_EINTERNAL;
}

START_TEST(test_chief_applies_needs_the_plain_sync_rule)
{
    tu_cluster cl;
    keel_vars *vs = two_vars(0, 0);
    keel_algorithm_config ac;
    keel_cluster_config co;
    keel_cluster_backend *b;
    double rate = 0.1;
    tu_cluster_new(&cl, 0);
    keel_cluster_config_init(&co);
    co.chief_applies = 1;
    co.chief_apply = no_apply;
    co.algorithm = &ac;
    for (int i = 0; i <= KEEL_ALGORITHM_COUNT; i++) {
        /* i == COUNT: sync with one per-worker rate (one replica) */
        keel_algorithm a = i < KEEL_ALGORITHM_COUNT ? (keel_algorithm)i
                                                    : KEEL_ALGORITHM_SYNC;
        const char *want = i < KEEL_ALGORITHM_COUNT ? keel_algorithm_name(a)
                                                    : "per-worker";
        if (i == KEEL_ALGORITHM_SYNC)
            continue;
        keel_algorithm_config_init(&ac, a);
        if (i == KEEL_ALGORITHM_COUNT) {
            ac.worker_learning_rates = &rate;
            ac.n_worker_learning_rates = 1;
        }
        ck_assert_int_eq(keel_ps_run(cl.ps, vs, &co), KEEL_EINVAL);
        ck_assert_msg(strstr(keel_last_error(), "chief_applies") != NULL &&
                      strstr(keel_last_error(), want) != NULL, "%s",
                      keel_last_error());
        b = (keel_cluster_backend *)1;
        ck_assert_int_eq(keel_cluster_backend_new(cl.chief, vs, &co, &b),
                         KEEL_EINVAL);
        ck_assert_ptr_null(b);
        ck_assert_msg(strstr(keel_last_error(), "chief_applies") != NULL &&
                      strstr(keel_last_error(), want) != NULL, "%s",
                      keel_last_error());
    }
    /* no rule given: the spec's async mode is the async rule */
    co.algorithm = NULL;
    keel_cluster_spec_set_mode(cl.ps, KEEL_CLUSTER_ASYNC);
    ck_assert_int_eq(keel_ps_run(cl.ps, vs, &co), KEEL_EINVAL);
    ck_assert_msg(strstr(keel_last_error(), "chief_applies") != NULL &&
                  strstr(keel_last_error(), "async") != NULL, "%s",
                  keel_last_error());
    keel_vars_free(vs);
    tu_cluster_free(&cl);
}
END_TEST

START_TEST(test_adag_state_resumes_from_a_checkpoint)
{
    char dir[256];
    keel_vars *vs = NULL, *back;
    keel_tensor *slot;
    keel_restore_report rep;
    int64_t step = 0;
    float w0, w1;
    tu_mkdtemp(dir, sizeof dir);
    (void)e2e_train(KEEL_ALGORITHM_ADAG, 0, 6, dir, &vs);
    w0 = wdata(vs)[0];
    w1 = wdata(vs)[1];
    keel_vars_free(vs);
    /* the checkpoint: variables, the rule's slot, step 6 */
    back = two_vars(0, 0);
    ck_assert_int_eq(keel_var_add_slot(keel_vars_find(back, "w"),
                                       "adag_pull0", &slot), KEEL_OK);
    {
        char path[512];
        snprintf(path, sizeof path, "%s/model.ckpt-6.h5", dir);
        memset(&rep, 0, sizeof rep);
        ck_assert_int_eq(keel_ckpt_restore(path, back, NULL, &rep),
                         KEEL_OK);
    }
    step = rep.global_step;
    ck_assert_int_eq(step, 6);
    CK2(wdata(back), w0, w1);
    CK2(slot->data, w0, w1);
    keel_vars_free(back);
    /* resume: 4 more steps from step 6, nearer the target */
    (void)e2e_train(KEEL_ALGORITHM_ADAG, 0, 10, dir, &vs);
    ck_assert_int_eq(keel_vars_global_step(vs), 10);
    ck_assert(loss_of(wdata(vs)) < loss_of((float[]){ w0, w1 }));
    keel_vars_free(vs);
    tu_rmrf(dir);
}
END_TEST

static Suite *
algorithms_suite(void)
{
    Suite *s = suite_create("algorithms");
    TCase *e;
    tu_tcase(s, "rules", 0, NULL, NULL, TU_TESTS(
        test_names_round_trip_and_bad_names_are_named,
        test_defaults_resolve_per_rule,
        test_sync_per_worker_learning_rates,
        test_agn_cycle,
        test_sagn_cycle_and_round_sum,
        test_downpour_cycle,
        test_downpour_easy_cycle,
        test_adag_cycle,
        test_dynsgd_cycle,
        test_model_averaging_cycle_and_mean,
        test_easgd_cycle,
        test_aeasgd_cycle,
        test_aeamsgd_cycle,
        test_aeamsgd_failed_pull_leaves_vs));
    e = tu_tcase(s, "cluster", 120, NULL, NULL, NULL);
    tcase_add_loop_test(e, test_every_rule_trains_on_a_cluster, 0,
                        KEEL_ALGORITHM_COUNT);
    tcase_add_test(e, test_adag_state_resumes_from_a_checkpoint);
    tcase_add_test(e, test_chief_applies_needs_the_plain_sync_rule);
    return s;
}

KEEL_TEST_MAIN(algorithms_suite)
