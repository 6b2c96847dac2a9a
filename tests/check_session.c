/* check_session.c - unit tests for session/ and hooks/: the exact hook call
 * sequences (clean, stop request, step error, recovery, end of input,
 * SIGTERM), timers on an injected clock, StopAtStepHook across a restore,
 * CheckpointSaverHook timing, the coordinator, SessionManager readiness,
 * MonitoredTrainingSession assembly and the Supervisor. Checkpoints go
 * through an in-memory fake (tests/fake_ckpt.c). */
#include <config.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keel/keel.h>
#include "util.h"
#include "testutil.h"
#include "fake_ckpt.h"
#include "../app/job_int.h"

/* ---- a shared event log ------------------------------------------------- */

static char ev[8192];

static void
logev(const char *fmt, ...)
{
    va_list ap;
    size_t n = strlen(ev);
    va_start(ap, fmt);
    vsnprintf(ev + n, sizeof ev - n, fmt, ap);
    va_end(ap);
}

static void
on_save(int64_t step)
{
    logev("S%lld ", (long long)step);
}

/* A recording hook: "b:x c:x r:x a:x e:x:reason". */
typedef struct rec {
    const char *tag;
    int64_t stop_at;          /* request stop in after_run at this gs */
} rec;

static keel_status
rec_begin(void *ctx)
{
    logev("b:%s ", ((rec *)ctx)->tag);
    return KEEL_OK;
}

static keel_status
rec_create(void *ctx, keel_session *s)
{
    (void)s;
    logev("c:%s ", ((rec *)ctx)->tag);
    return KEEL_OK;
}

static keel_status
rec_before(void *ctx, keel_run_context *rc)
{
    logev("r:%s ", ((rec *)ctx)->tag);
    (void)rc;
    return KEEL_OK;
}

static keel_status
rec_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    rec *r = ctx;
    logev("a:%s%lld ", r->tag, (long long)keel_run_values_step_after(v));
    if (r->stop_at > 0 && keel_run_values_step_after(v) == r->stop_at)
        keel_run_context_request_stop(rc, "test");
    return KEEL_OK;
}

static keel_status
rec_end(void *ctx, keel_session *s, keel_end_reason why)
{
    (void)s;
    logev("e:%s:%s ", ((rec *)ctx)->tag, keel_end_reason_name(why));
    return KEEL_OK;
}

static keel_hook
rec_hook(rec *r)
{
    keel_hook h = { .struct_size = sizeof h, .name = r->tag, .ctx = r,
                    .begin = rec_begin, .after_create_session = rec_create,
                    .before_run = rec_before, .after_run = rec_after,
                    .end = rec_end };
    return h;
}

/* ---- a scripted step ---------------------------------------------------- */

typedef struct script {
    int64_t fail_at;          /* global step (before) at which to fail */
    keel_status fail_code;
    int fail_times;           /* how many times (then succeed) */
    int64_t signal_at;
    double loss;
    int calls;
    int applies_own;          /* the step marks its update applied */
    const void *last_batch;
} script;

static keel_status
scripted_step(void *ctx, keel_step *st)
{
    script *sc = ctx;
    int64_t gs = keel_step_global_step(st);
    sc->calls++;
    sc->last_batch = keel_step_batch(st);
    logev("s%lld ", (long long)gs);
    if (sc->fail_times != 0 && gs == sc->fail_at) {
        if (sc->fail_times > 0)
            sc->fail_times--;
        return keel_error_set(sc->fail_code, "scripted failure at %lld",
                              (long long)gs);
    }
    if (sc->signal_at > 0 && gs == sc->signal_at)
        raise(SIGTERM);
    keel_tensor *g = keel_grads_find(keel_step_grads(st), "w");
    g->data[0] = 1.0f;
    if (sc->applies_own)
        keel_step_mark_applied(st);
    return keel_step_set_value(st, "loss", sc->loss);
}

static int n_applied;

static keel_status
count_apply(void *ctx, keel_vars *vs, keel_grads *g, int64_t gs)
{
    (void)ctx;
    (void)gs;
    n_applied++;
    keel_var_tensor(keel_vars_find(vs, "w"))->data[0] -=
        0.5f * keel_grads_find(g, "w")->data[0];
    return KEEL_OK;
}

static keel_vars *vs;

static void
setup(void)
{
    tu_setup();
    ev[0] = '\0';
    n_applied = 0;
    fake_install();
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "w", 0, NULL, KEEL_VAR_TRAINABLE,
                                      NULL), KEEL_OK);
    keel_session_clear_signal();
}

static void
teardown(void)
{
    keel_session_uninstall_signal_handlers();
    keel_session_clear_signal();
    keel_vars_free(vs);
    vs = NULL;
    fake_uninstall();
    tu_teardown();
}

static void
base_cfg(keel_session_config *c, script *sc, keel_hook *hooks, size_t n)
{
    keel_session_config_init(c);
    c->manager.vars = vs;
    c->step = scripted_step;
    c->step_ctx = sc;
    c->updater.apply = count_apply;
    c->hooks = hooks;
    c->n_hooks = n;
    c->backoff_ms = 1;
    c->backoff_max_ms = 4;
}

/* A session on base_cfg's configuration; fails the test unless it opens. */
static keel_session *
open_session(script *sc, keel_hook *hooks, size_t n)
{
    keel_session_config c;
    keel_session *s;
    base_cfg(&c, sc, hooks, n);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    return s;
}

/* ---- sequences ---------------------------------------------------------- */

START_TEST(test_clean_run_calls_hooks_in_order_and_end_clean)
{
    rec a = { "A", 0 }, b = { "B", 0 };
    keel_hook h[2] = { rec_hook(&a), rec_hook(&b) };
    script sc = { 0 };
    keel_session *s = open_session(&sc, h, 2);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);   // idempotent
    ck_assert_str_eq(ev, "b:A b:B c:A c:B r:A r:B s0 a:A1 a:B1 "
                         "r:A r:B s1 a:A2 a:B2 e:A:clean e:B:clean ");
    ck_assert_int_eq(keel_vars_global_step(vs), 2);
    ck_assert_int_eq(n_applied, 2);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_ESTATE);
    keel_session_free(s);
}
END_TEST

/* keel_optimizer_updater: the session applies keel's momentum optimizer.
 * By hand (TF's MomentumOptimizer, lr 0.25, momentum 0.9, gradient 1 at
 * every step): accumulators 1, 1.9, 2.71; w moves by
 * -0.25 * (1 + 1.9 + 2.71) = -1.4025. */
START_TEST(test_optimizer_updater_applies_the_optimizer)
{
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    keel_optimizer_config oc;
    keel_optimizer *opt;
    float w0;
    keel_optimizer_config_init(&oc, KEEL_OPT_MOMENTUM);
    oc.schedule.learning_rate = 0.25;
    oc.momentum = 0.9;
    ck_assert_int_eq(keel_optimizer_new(&oc, &opt), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_prepare(opt, vs), KEEL_OK);
    base_cfg(&c, &sc, NULL, 0);
    c.updater = keel_optimizer_updater(opt);
    ck_assert_ptr_eq(c.updater.ctx, opt);
    ck_assert_int_eq(c.updater.kind, KEEL_UPDATER_OPTIMIZER);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    w0 = keel_var_tensor(keel_vars_find(vs, "w"))->data[0];
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    ck_assert_int_eq(keel_vars_global_step(vs), 3);
    ck_assert_double_eq_tol(keel_var_tensor(keel_vars_find(vs, "w"))->data[0],
                            w0 - 1.4025, 1e-6);
    ck_assert_int_eq(n_applied, 0);          /* not the test's updater */
    keel_session_free(s);
    keel_optimizer_free(opt);
}
END_TEST

/* A session with trainable variables and no update rule discards the
 * gradients: it says so once, naming the settings that fix it; a step that
 * applies its own update is not told. */
START_TEST(test_no_update_rule_is_logged_once)
{
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    tu_log log = { .filter = "no update rule" };
    keel_log_set_handler(tu_log_append, &log, KEEL_LOG_WARN);
    base_cfg(&c, &sc, NULL, 0);
    c.updater.apply = NULL;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    keel_session_free(s);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_INFO);
    ck_assert_int_eq(keel_vars_global_step(vs), 3);
    ck_assert_ptr_nonnull(strstr(log.text, "gradients of 1 trainable "
                                 "variables are discarded"));
    ck_assert_ptr_nonnull(strstr(log.text, "keel_training_config.optimizer"));
    ck_assert_ptr_null(strstr(strchr(log.text, '\n') + 1, "no update rule"));

    log.text[0] = '\0';                      /* an updater: silent */
    keel_log_set_handler(tu_log_append, &log, KEEL_LOG_WARN);
    s = open_session(&sc, NULL, 0);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    keel_session_free(s);
    sc.applies_own = 1;                       /* the step's own update */
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    keel_session_free(s);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_INFO);
    ck_assert_str_eq(log.text, "");
}
END_TEST

/* A backend that applies the updates wins over the session's updater, and
 * the session says the updater it was given goes unused. */
static int n_backend_applied;

static keel_status
backend_apply(void *ctx, keel_vars *v, keel_grads *g, int64_t gs)
{
    (void)ctx;
    (void)v;
    (void)g;
    (void)gs;
    n_backend_applied++;
    return KEEL_OK;
}

START_TEST(test_backend_updater_wins_and_an_unused_updater_is_named)
{
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    keel_backend be;
    tu_log log = { .filter = "not used" };
    keel_backend_init(&be);
    be.name = "mine";
    be.updater.apply = backend_apply;
    base_cfg(&c, &sc, NULL, 0);
    c.manager.backend = &be;
    n_applied = n_backend_applied = 0;
    keel_log_set_handler(tu_log_append, &log, KEEL_LOG_WARN);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    keel_session_free(s);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_INFO);
    ck_assert_int_eq(n_backend_applied, 1);
    ck_assert_int_eq(n_applied, 0);
    ck_assert_ptr_nonnull(strstr(log.text, "the updater given is not used: "
                                 "backend 'mine' applies the updates"));
}
END_TEST

/* keel_hook_init gives a user's hook its struct_size; a hook without one is
 * refused with the call that fixes it. */
START_TEST(test_user_hook_starts_from_keel_hook_init)
{
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    keel_hook h;
    rec r = { "mine", 0 };
    memset(&h, 0xff, sizeof h);
    keel_hook_init(&h);
    ck_assert_uint_eq(h.struct_size, sizeof h);
    ck_assert_ptr_null(h.before_run);
    ck_assert_uint_eq(h.kind, KEEL_HOOK_USER);
    h.name = "mine";
    h.ctx = &r;
    h.after_run = rec_after;
    s = open_session(&sc, &h, 1);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    keel_session_free(s);
    ck_assert_ptr_nonnull(strstr(ev, "a:mine1 "));

    h.struct_size = 0;
    base_cfg(&c, &sc, &h, 1);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "hook 0 ('mine') has "
                                 "struct_size 0"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "start it with keel_hook_init()"));
}
END_TEST

/* A user's step running Hogwild rounds (keel_hogwild) on the session's
 * store: every element's gradient is 1 in each of 2 threads. */
static keel_status
ones_grad(void *ctx, int thread, keel_grads *grads, int64_t global_step)
{
    (void)ctx;
    (void)thread;
    (void)global_step;
    for (size_t i = 0; i < keel_grads_count(grads); i++) {
        keel_tensor *g = keel_grads_at(grads, i);
        for (size_t k = 0; g != NULL && k < g->count; k++)
            g->data[k] += 1.0f;
    }
    return KEEL_OK;
}

static keel_status
hogwild_step(void *ctx, keel_step *st)
{
    keel_hogwild *h = ctx;
    int64_t g = keel_step_global_step(st);
    keel_status rc = keel_hogwild_run(h, ones_grad, NULL, g);
    if (rc != KEEL_OK)
        return rc;
    keel_step_mark_applied(st);
    keel_vars_set_global_step(keel_step_vars(st),
                              g + keel_hogwild_threads(h));
    return KEEL_OK;
}

START_TEST(test_a_step_runs_hogwild_rounds_of_one_step_per_thread)
{
    /* 2 threads, SGD 0.25, CAS: a round is 2 global steps and -0.5 on w;
     * the session's updater is never called (the step applied) and the
     * hooks see the steps the round counted */
    rec a = { "A", 0 };
    keel_hook h[1] = { rec_hook(&a) };
    keel_optimizer_config oc;
    keel_hogwild_config hc;
    keel_hogwild *hw;
    keel_session_config c;
    keel_session *s;
    script sc = { 0 };
    keel_optimizer_config_init(&oc, KEEL_OPT_SGD);
    oc.schedule.learning_rate = 0.25;
    keel_hogwild_config_init(&hc);
    hc.threads = 2;
    hc.use_cas = 1;
    ck_assert_int_eq(keel_hogwild_new(&hc, &oc, vs, &hw), KEEL_OK);
    base_cfg(&c, &sc, h, 1);
    c.step = hogwild_step;
    c.step_ctx = hw;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    ck_assert_str_eq(ev, "b:A c:A r:A a:A2 r:A a:A4 e:A:clean ");
    ck_assert_int_eq(keel_vars_global_step(vs), 4);
    ck_assert_float_eq(keel_var_tensor(keel_vars_find(vs, "w"))->data[0],
                       -1.0f);
    ck_assert_int_eq(n_applied, 0);
    keel_session_free(s);
    keel_hogwild_free(hw);
}
END_TEST

START_TEST(test_hook_stop_request_lets_all_hooks_see_after_run_then_refuses)
{
    rec a = { "A", 2 }, b = { "B", 0 };
    keel_hook h[2] = { rec_hook(&a), rec_hook(&b) };
    script sc = { 0 };
    keel_session *s = open_session(&sc, h, 2);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    ck_assert(keel_session_should_stop(s));
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_ESTATE);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "should_stop"));
    keel_session_close(s);
    ck_assert_str_eq(ev, "b:A b:B c:A c:B r:A r:B s0 a:A1 a:B1 r:A r:B s1 "
                         "a:A2 a:B2 e:A:stop requested "
                         "e:B:stop requested ");
    keel_session_free(s);
}
END_TEST

START_TEST(test_step_error_skips_after_run_and_ends_with_error)
{
    rec a = { "A", 0 };
    keel_hook h[1] = { rec_hook(&a) };
    script sc = { .fail_at = 1, .fail_code = KEEL_EIO, .fail_times = -1 };
    keel_session *s = open_session(&sc, h, 1);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_EIO);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "scripted failure"));
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_ESTATE);
    keel_session_close(s);
    ck_assert_str_eq(ev, "b:A c:A r:A s0 a:A1 r:A s1 e:A:error ");
    ck_assert_int_eq(keel_session_end_reason(s), KEEL_END_ERROR);
    keel_session_free(s);
}
END_TEST

START_TEST(test_recoverable_error_recreates_session_and_retries_same_step)
{
    rec a = { "A", 0 };
    keel_hook h[1] = { rec_hook(&a) };
    script sc = { .fail_at = 1, .fail_code = KEEL_EABORTED, .fail_times = 1 };
    keel_session *s = open_session(&sc, h, 1);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_creation_count(s), 2);
    keel_session_close(s);
    /* begin once; after_create_session again; step 1 retried */
    ck_assert_str_eq(ev, "b:A c:A r:A s0 a:A1 r:A s1 c:A r:A s1 a:A2 "
                         "e:A:clean ");
    keel_session_free(s);
}
END_TEST

/* The first re-creation after a recoverable failure is at once (a minute's
 * backoff here would outlast the test's timeout); only a failure in a row
 * waits backoff_ms. */
START_TEST(test_first_recovery_is_at_once_then_backs_off)
{
    script sc = { .fail_at = 0, .fail_code = KEEL_EABORTED, .fail_times = 1 };
    keel_session_config c;
    keel_session *s;
    int64_t t0;
    base_cfg(&c, &sc, NULL, 0);
    c.backoff_ms = 60000;
    c.backoff_max_ms = 60000;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_creation_count(s), 2);
    keel_session_free(s);
    /* two failures in a row: the second retry waits backoff_ms */
    memset(&sc, 0, sizeof sc);
    sc.fail_at = keel_vars_global_step(vs);
    sc.fail_code = KEEL_EABORTED;
    sc.fail_times = 2;
    base_cfg(&c, &sc, NULL, 0);
    c.backoff_ms = 300;
    c.backoff_max_ms = 300;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    t0 = tu_now_ms();
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_ge(tu_now_ms() - t0, 250);
    ck_assert_int_eq(keel_session_creation_count(s), 3);
    keel_session_free(s);
}
END_TEST

START_TEST(test_recovery_is_bounded_and_singular_does_not_recover)
{
    script sc = { .fail_at = 0, .fail_code = KEEL_EUNAVAILABLE,
                  .fail_times = -1 };
    keel_session_config c;
    keel_session *s;
    base_cfg(&c, &sc, NULL, 0);
    c.max_recovery_attempts = 3;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_EUNAVAILABLE);
    ck_assert_int_eq(sc.calls, 4);
    ck_assert_int_eq(keel_session_creation_count(s), 4);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    ck_assert_int_eq(keel_session_end_reason(s), KEEL_END_ERROR);
    keel_session_free(s);
    sc.calls = 0;
    ck_assert_int_eq(keel_session_new_singular(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_EUNAVAILABLE);
    ck_assert_int_eq(sc.calls, 1);
    keel_session_free(s);
}
END_TEST

START_TEST(test_end_of_input_ends_with_out_of_range)
{
    rec a = { "A", 0 };
    keel_hook h[1] = { rec_hook(&a) };
    script sc = { .fail_at = 1, .fail_code = KEEL_EOUTOFRANGE,
                  .fail_times = -1 };
    keel_session *s = open_session(&sc, h, 1);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    keel_session_close(s);
    ck_assert_str_eq(ev, "b:A c:A r:A s0 a:A1 r:A s1 e:A:end of input ");
    keel_session_free(s);
}
END_TEST

/* A CheckpointSaverHook config saving every save_steps steps. */
static keel_ckpt_hook_config
ckpt_every(int64_t save_steps)
{
    keel_ckpt_hook_config hc;
    keel_ckpt_hook_config_init(&hc);
    hc.save_steps = save_steps;
    return hc;
}

/* A NanTensorHook on "loss". */
static keel_status
new_nan_hook(int fail_on_nan, int fail_on_inf, keel_hook *out)
{
    keel_nan_hook_config nc;
    keel_nan_hook_config_init(&nc);
    nc.fail_on_nan = fail_on_nan;
    nc.fail_on_inf = fail_on_inf;
    return keel_nan_hook_new(&nc, out);
}

START_TEST(test_sigterm_stops_at_step_boundary_and_saves_final_checkpoint)
{
    rec a = { "A", 0 };
    keel_hook h[2];
    keel_ckpt_hook_config hc = ckpt_every(100);
    script sc = { .signal_at = 2 };
    keel_session_config c;
    keel_session *s;
    fake_on_save = on_save;
    h[0] = rec_hook(&a);
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h[1]), KEEL_OK);
    base_cfg(&c, &sc, h, 2);
    c.manager.checkpoint_dir = tu_dir;
    ck_assert_int_eq(keel_session_install_signal_handlers(), KEEL_OK);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    ck_assert_int_eq(keel_session_signal_received(), SIGTERM);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    /* the step that saw the signal completes (after_run), then stop */
    ck_assert_str_eq(ev, "b:A c:A S0 r:A s0 a:A1 r:A s1 a:A2 r:A s2 a:A3 "
                         "e:A:signal S3 ");
    ck_assert_int_eq(keel_session_end_reason(s), KEEL_END_SIGNAL);
    keel_session_free(s);
    keel_hook_release(&h[1]);
}
END_TEST

/* ---- values, feeding, NaN ----------------------------------------------- */

static keel_status
want_missing(void *ctx, keel_run_context *rc)
{
    (void)ctx;
    return keel_run_context_request(rc, "accuracy");
}

START_TEST(test_requested_value_the_step_never_sets_fails_naming_it)
{
    keel_hook h = { .struct_size = sizeof h, .name = "wants_acc",
                    .before_run = want_missing };
    script sc = { 0 };
    keel_session *s = open_session(&sc, &h, 1);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "accuracy"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "wants_acc"));
    keel_session_free(s);
}
END_TEST

START_TEST(test_nan_hook_fails_or_stops_and_inf_is_optional)
{
    script sc = { .loss = NAN };
    keel_session_config c;
    keel_session *s;
    keel_hook h;
    ck_assert_int_eq(new_nan_hook(1, 0, &h), KEEL_OK);
    base_cfg(&c, &sc, &h, 1);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_EHOOK);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "NaN"));
    keel_session_free(s);
    keel_hook_release(&h);

    sc.loss = INFINITY;
    ck_assert_int_eq(new_nan_hook(0, 0, &h), KEEL_OK);
    c.hooks = &h;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert(!keel_session_should_stop(s));        // Inf passes
    keel_session_free(s);
    keel_hook_release(&h);

    ck_assert_int_eq(new_nan_hook(0, 1, &h), KEEL_OK);
    c.hooks = &h;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert(keel_session_should_stop(s));         // Inf stops
    keel_session_free(s);
    keel_hook_release(&h);
}
END_TEST

static int feed_left = 2;
static int batch_value = 7;
static int64_t fed_steps[4];         /* the global step of each call */
static int n_fed;

static keel_status
feed(void *ctx, int64_t global_step, const void **batch)
{
    (void)ctx;
    if (n_fed < 4)
        fed_steps[n_fed++] = global_step;
    if (feed_left-- <= 0)
        return KEEL_EOUTOFRANGE;
    *batch = &batch_value;
    return KEEL_OK;
}

START_TEST(test_feed_fn_supplies_batch_and_its_end_of_input_ends_cleanly)
{
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    keel_feed_fn_hook_config fc;
    keel_hook h;
    int mine = 1;
    feed_left = 2;
    keel_feed_fn_hook_config_init(&fc);
    fc.fn = feed;
    ck_assert_int_eq(keel_feed_fn_hook_new(&fc, &h), KEEL_OK);
    base_cfg(&c, &sc, &h, 1);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, &mine), KEEL_EHOOK); // two feeders
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "one feeder"));
    keel_session_free(s);
    feed_left = 2;
    n_fed = 0;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    ck_assert_ptr_eq(sc.last_batch, &batch_value);
    ck_assert_int_eq(keel_vars_global_step(vs), 2);
    ck_assert_int_eq(keel_session_end_reason(s), KEEL_END_OUT_OF_RANGE);
    keel_session_free(s);
    /* fn is told the global step each batch is for: 0, 1, then 2 ends */
    ck_assert_int_eq(n_fed, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(fed_steps[i], i);
    /* a session that starts at step 5 (as after a restore) feeds from 5 */
    feed_left = 1;
    n_fed = 0;
    keel_vars_set_global_step(vs, 5);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    keel_session_free(s);
    ck_assert_int_eq(n_fed, 2);
    ck_assert_int_eq(fed_steps[0], 5);
    ck_assert_int_eq(fed_steps[1], 6);
    keel_hook_release(&h);
}
END_TEST

START_TEST(test_run_without_hooks_skips_hooks_but_updates)
{
    rec a = { "A", 0 };
    keel_hook h[1] = { rec_hook(&a) };
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    char path[256];
    base_cfg(&c, &sc, h, 1);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_save_now(s, NULL, 0), KEEL_ESTATE);
    ck_assert_int_eq(keel_session_run_without_hooks(s, NULL), KEEL_OK);
    ck_assert_str_eq(ev, "b:A c:A s0 ");
    ck_assert_int_eq(n_applied, 1);
    keel_session_free(s);
    c.manager.checkpoint_dir = tu_dir;
    keel_vars_set_global_step(vs, 0);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_save_now(s, path, sizeof path), KEEL_OK);
    ck_assert_str_eq(path, "fake-1");
    keel_session_free(s);
}
END_TEST

/* The session skips its clock reads when only built-in hooks run; a user
 * hook must still see the step's real start and duration. */
static int64_t seen_duration_ns, seen_start_ns;
static double seen_loss_a, seen_loss_b;
static char loss_buf[16];

static keel_status
sleepy_step(void *ctx, keel_step *st)
{
    struct timespec ts = { 0, 2000000 };
    (void)ctx;
    nanosleep(&ts, NULL);
    return keel_step_set_value(st, "loss", 3.0);
}

static keel_status
timing_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    (void)ctx;
    (void)rc;
    seen_duration_ns = keel_run_values_duration_ns(v);
    seen_start_ns = keel_run_values_start_ns(v);
    /* The same name through another pointer, then a reused buffer that
     * now holds a name the step never set. */
    snprintf(loss_buf, sizeof loss_buf, "%s", "loss");
    seen_loss_a = keel_run_values_get(v, loss_buf);
    snprintf(loss_buf, sizeof loss_buf, "%s", "lost");
    seen_loss_b = keel_run_values_get(v, loss_buf);
    return KEEL_OK;
}

START_TEST(test_user_hook_sees_step_duration_and_values_by_any_pointer)
{
    keel_hook h[2];
    keel_session_config c;
    keel_session *s;
    script sc = { 0 };
    base_cfg(&c, &sc, h, 2);
    c.step = sleepy_step;
    ck_assert_int_eq(new_nan_hook(1, 0, &h[0]), KEEL_OK);
    memset(&h[1], 0, sizeof h[1]);
    h[1].struct_size = sizeof h[1];
    h[1].name = "timing";
    h[1].after_run = timing_after;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    for (int i = 0; i < 3; i++) {
        seen_duration_ns = -1;
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
        ck_assert_int_ge(seen_duration_ns, 2000000);
        ck_assert_int_gt(seen_start_ns, 0);
        ck_assert(seen_loss_a == 3.0);
        ck_assert(isnan(seen_loss_b));
    }
    keel_session_free(s);
    keel_hook_release(&h[0]);
}
END_TEST

/* ---- timers ------------------------------------------------------------- */

static int64_t fake_now;

START_TEST(test_timer_trigger_semantics_with_injected_clock)
{
    keel_clock clk = { tu_clock_read, &fake_now };
    keel_timer t;
    double dt;
    int64_t ds;
    ck_assert_int_eq(keel_timer_init(&t, 0, 0, NULL), KEEL_EINVAL);
    ck_assert_int_eq(keel_timer_init(&t, 1.0, 5, NULL), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "both"));
    ck_assert_int_eq(keel_timer_init(&t, 0, 5, NULL), KEEL_OK);
    ck_assert(keel_timer_should_trigger(&t, 3));        // never triggered
    ck_assert_int_eq(keel_timer_update(&t, 3, &dt, &ds), 0);
    ck_assert(!keel_timer_should_trigger(&t, 3));       // same step
    ck_assert(!keel_timer_should_trigger(&t, 7));
    ck_assert(keel_timer_should_trigger(&t, 8));
    ck_assert_int_eq(keel_timer_update(&t, 9, &dt, &ds), 1);
    ck_assert_int_eq(ds, 6);
    fake_now = 1000000000;
    ck_assert_int_eq(keel_timer_init(&t, 2.0, 0, &clk), KEEL_OK);
    ck_assert(keel_timer_should_trigger(&t, 0));
    keel_timer_update(&t, 0, NULL, NULL);
    fake_now += 1999999999;
    ck_assert(!keel_timer_should_trigger(&t, 1));
    fake_now += 1;
    ck_assert(keel_timer_should_trigger(&t, 1));
    ck_assert(!keel_timer_should_trigger(&t, 0));       // same step
    ck_assert_int_eq(keel_timer_update(&t, 4, &dt, &ds), 1);
    ck_assert(fabs(dt - 2.0) < 1e-9);
    ck_assert_int_eq(ds, 4);
    keel_timer_init_never(&t);
    ck_assert(!keel_timer_should_trigger(&t, 0));
}
END_TEST

/* ---- stop at step across a restore -------------------------------------- */

static int64_t
train_with_stop(int64_t num_steps, int64_t last_step, int64_t *start)
{
    keel_hook h[2];
    keel_stop_at_step_hook_config stop;
    keel_ckpt_hook_config hc = ckpt_every(1000);
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    int64_t end;
    keel_stop_at_step_hook_config_init(&stop);
    stop.num_steps = num_steps;
    stop.last_step = last_step;
    ck_assert_int_eq(keel_stop_at_step_hook_new(&stop, &h[0]), KEEL_OK);
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h[1]), KEEL_OK);
    base_cfg(&c, &sc, h, 2);
    c.manager.checkpoint_dir = tu_dir;
    keel_vars_set_global_step(vs, 0);       // a "new process"
    keel_vars_set_all_initialized(vs, 0);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    *start = keel_session_global_step(s);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    end = keel_session_global_step(s);
    keel_session_free(s);
    keel_hook_release(&h[0]);
    keel_hook_release(&h[1]);
    return end;
}

START_TEST(test_stop_at_step_num_steps_is_relative_last_step_absolute)
{
    int64_t start;
    ck_assert_int_eq(train_with_stop(3, 0, &start), 3);
    ck_assert_int_eq(start, 0);
    ck_assert_int_eq(train_with_stop(3, 0, &start), 6);  // from restore
    ck_assert_int_eq(start, 3);
    ck_assert_int_eq(train_with_stop(0, 8, &start), 8);  // absolute
    ck_assert_int_eq(start, 6);
    ck_assert_int_eq(train_with_stop(0, 8, &start), 8);  // nothing to do
    ck_assert_int_eq(fake.n_restores, 3);
    {
        keel_stop_at_step_hook_config both;
        keel_hook h;
        keel_stop_at_step_hook_config_init(&both);
        both.num_steps = 1;
        both.last_step = 1;
        ck_assert_int_eq(keel_stop_at_step_hook_new(&both, &h), KEEL_EINVAL);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "num_steps"));
    }
}
END_TEST

/* ---- checkpoint saver hook ---------------------------------------------- */

static int listener_saves;

static keel_status
stop_after_second(void *ctx, keel_session *s, int64_t step, const char *path,
                  int *should_stop)
{
    (void)ctx;
    (void)s;
    (void)step;
    (void)path;
    if (++listener_saves == 2)
        *should_stop = 1;
    return KEEL_OK;
}

START_TEST(test_ckpt_hook_saves_at_creation_every_n_and_end_never_twice)
{
    keel_hook h;
    keel_ckpt_hook_config hc = ckpt_every(2);
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    int i;
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h), KEEL_OK);
    base_cfg(&c, &sc, &h, 1);
    c.manager.checkpoint_dir = tu_dir;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    for (i = 0; i < 4; i++)
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    keel_session_close(s);
    ck_assert_int_eq(fake.n_saves, 3);      // 0, 2, 4; not again at end
    ck_assert_int_eq(fake.steps[0], 0);
    ck_assert_int_eq(fake.steps[1], 2);
    ck_assert_int_eq(fake.steps[2], 4);
    ck_assert_int_eq(keel_ckpt_hook_save_count(&h), 3);
    keel_session_free(s);
    keel_hook_release(&h);

    fake_install();
    keel_vars_set_global_step(vs, 0);
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h), KEEL_OK);
    c.hooks = &h;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    for (i = 0; i < 5; i++)
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    keel_session_close(s);
    ck_assert_int_eq(fake.n_saves, 4);      // 0, 2, 4 and 5 at end
    ck_assert_int_eq(fake.steps[3], 5);
    keel_session_free(s);
    keel_hook_release(&h);
}
END_TEST

START_TEST(test_ckpt_listener_can_stop_training_and_error_skips_final_save)
{
    keel_ckpt_listener l = { .after_save = stop_after_second };
    keel_hook h;
    keel_ckpt_hook_config hc = ckpt_every(3);
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    listener_saves = 0;
    hc.listeners = &l;
    hc.n_listeners = 1;
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h), KEEL_OK);
    base_cfg(&c, &sc, &h, 1);
    c.manager.checkpoint_dir = tu_dir;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    ck_assert_int_eq(keel_session_global_step(s), 3);
    keel_session_free(s);
    keel_hook_release(&h);

    fake_install();
    keel_vars_set_global_step(vs, 0);
    sc.fail_at = 2;
    sc.fail_code = KEEL_EIO;
    sc.fail_times = -1;
    hc.n_listeners = 0;
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h), KEEL_OK);
    c.hooks = &h;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_train(s), KEEL_EIO);
    keel_session_close(s);
    ck_assert_int_eq(fake.n_saves, 1);      // creation only
    keel_session_free(s);
    keel_hook_release(&h);
}
END_TEST

/* ---- metadata blobs ----------------------------------------------------- */

static int64_t data_pos;

static keel_status
meta(void *ctx, keel_ckpt_meta *m)
{
    static keel_ckpt_blob b;
    (void)ctx;
    b.name = "data_iterator";
    b.data = &data_pos;
    b.size = sizeof data_pos;
    m->blobs = &b;
    m->n_blobs = 1;
    return KEEL_OK;
}

static keel_status
restore_blob(void *ctx, const keel_ckpt_info *info)
{
    (void)ctx;
    ck_assert_str_eq(info->blobs[0].name, "data_iterator");
    memcpy(&data_pos, info->blobs[0].data, sizeof data_pos);
    return KEEL_OK;
}

START_TEST(test_meta_blobs_saved_and_handed_back_after_restore)
{
    script sc = { 0 };
    keel_session_config c;
    keel_session *s;
    base_cfg(&c, &sc, NULL, 0);
    c.manager.checkpoint_dir = tu_dir;
    c.meta_fn = meta;
    c.manager.restore_fn = restore_blob;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    data_pos = 1234;
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel_session_save_now(s, NULL, 0), KEEL_OK);
    keel_session_free(s);
    data_pos = 0;
    keel_vars_set_global_step(vs, 0);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(data_pos, 1234);
    ck_assert_int_eq(keel_session_global_step(s), 1);
    keel_session_free(s);
}
END_TEST

/* ---- session manager ---------------------------------------------------- */

static keel_status
mark_ready_init_fn_fails_nothing(void *ctx, keel_vars *v)
{
    (void)ctx;
    (void)v;
    return KEEL_OK;         // a warm start that forgot a variable
}

/* A SessionManager config on the suite's store. */
static keel_session_manager_config
manager_config(void)
{
    keel_session_manager_config mc;
    keel_session_manager_config_init(&mc);
    mc.vars = vs;
    return mc;
}

START_TEST(test_prepare_errors_match_tf_conditions)
{
    keel_session_manager_config mc = manager_config();
    keel_session_manager *sm;
    keel_scaffold empty;
    int restored = -1;
    memset(&empty, 0, sizeof empty);        // its saver settings unset
    mc.scaffold = &empty;
    ck_assert_int_eq(keel_session_manager_new(&mc, &sm), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "keel_scaffold_init"));
    keel_scaffold_init(&empty);             // TF's None for every member
    empty.init = NULL;
    empty.init_fn = NULL;
    empty.ready = NULL;
    empty.ready_for_local_init = NULL;
    empty.local_init = NULL;
    ck_assert_int_eq(keel_session_manager_new(&mc, &sm), KEEL_OK);
    ck_assert_int_eq(keel_session_manager_prepare(sm, 0, &restored),
                     KEEL_ESTATE);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "no init"));
    keel_session_manager_free(sm);
    keel_scaffold_init(&empty);
    empty.init = NULL;
    empty.init_fn = NULL;
    ck_assert_int_eq(keel_session_manager_new(&mc, &sm), KEEL_OK);
    ck_assert_int_eq(keel_session_manager_prepare(sm, 0, &restored),
                     KEEL_ESTATE);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "ready for local_init: w"));  /* no hint:
                                                                * no init */
    keel_session_manager_free(sm);
    empty.local_init = NULL;
    empty.ready_for_local_init = NULL;
    ck_assert_int_eq(keel_session_manager_new(&mc, &sm), KEEL_OK);
    ck_assert_int_eq(keel_session_manager_prepare(sm, 0, &restored),
                     KEEL_ESTATE);      // only init_fn would be... none
    keel_session_manager_free(sm);
    empty.init_fn = mark_ready_init_fn_fails_nothing;
    ck_assert_int_eq(keel_session_manager_new(&mc, &sm), KEEL_OK);
    ck_assert_int_eq(keel_session_manager_prepare(sm, 0, &restored),
                     KEEL_ESTATE);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "did not make model ready (your scaffold "
                                 "init or init_fn marks what it sets with "
                                 "keel_var_set_initialized or "
                                 "keel_vars_set_all_initialized): 1 not "
                                 "initialized: w"));
    keel_session_manager_free(sm);
    mc.scaffold = NULL;
    ck_assert_int_eq(keel_session_manager_new(&mc, &sm), KEEL_OK);
    ck_assert_int_eq(keel_session_manager_prepare(sm, 0, &restored),
                     KEEL_OK);
    ck_assert_int_eq(restored, 0);
    keel_session_manager_free(sm);
}
END_TEST

START_TEST(test_recover_session_ready_only_after_a_restore)
{
    keel_session_manager_config mc = manager_config();
    keel_session_manager *sm;
    int is_ready = -1;
    mc.checkpoint_dir = "x";
    ck_assert_int_eq(keel_session_manager_new(&mc, &sm), KEEL_OK);
    ck_assert_int_eq(keel_session_manager_recover(sm, &is_ready), KEEL_OK);
    ck_assert_int_eq(is_ready, 0);          // nothing to restore: no init
    ck_assert(!keel_var_is_initialized(keel_vars_find(vs, "w")));
    keel_vars_set_global_step(vs, 42);
    keel_var_tensor(keel_vars_find(vs, "w"))->data[0] = 2.5f;
    ck_assert_int_eq(fake_save_vars(vs), KEEL_OK);
    keel_vars_set_global_step(vs, 0);
    keel_var_tensor(keel_vars_find(vs, "w"))->data[0] = 0;
    ck_assert_int_eq(keel_session_manager_recover(sm, &is_ready), KEEL_OK);
    ck_assert_int_eq(is_ready, 1);
    ck_assert_int_eq(keel_vars_global_step(vs), 42);
    ck_assert(keel_var_tensor(keel_vars_find(vs, "w"))->data[0] == 2.5f);
    keel_session_manager_free(sm);
}
END_TEST

static void *
init_later(void *arg)
{
    keel_session_manager *sm = arg;
    usleep(20000);          // the chief is "slow"; the waiter must not poll
    keel_vars_set_all_initialized(vs, 1);
    keel_session_manager_notify(sm);
    return NULL;
}

START_TEST(test_worker_wait_wakes_on_notify_and_times_out)
{
    keel_session_manager_config mc = manager_config();
    keel_session_manager *sm;
    pthread_t t;
    int64_t t0;
    mc.recovery_wait_ms = 60000;
    ck_assert_int_eq(keel_session_manager_new(&mc, &sm), KEEL_OK);
    t0 = tu_now_ms();
    ck_assert_int_eq(keel_session_manager_wait(sm, 0.1), KEEL_ETIMEOUT);
    ck_assert_int_lt(tu_now_ms() - t0, 30000);  // not the 60 s retry
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "w"));
    t0 = tu_now_ms();
    ck_assert_int_eq(pthread_create(&t, NULL, init_later, sm), 0);
    ck_assert_int_eq(keel_session_manager_wait(sm, 30), KEEL_OK);
    ck_assert_int_lt(tu_now_ms() - t0, 30000);  // not the 60 s retry
    pthread_join(t, NULL);
    keel_session_manager_cancel(sm);
    keel_vars_set_all_initialized(vs, 0);
    ck_assert_int_eq(keel_session_manager_wait(sm, 30), KEEL_ECANCELLED);
    keel_session_manager_free(sm);
}
END_TEST

/* ---- coordinator -------------------------------------------------------- */

static keel_status
wait_stop(void *arg, keel_coord *c)
{
    (void)arg;
    keel_coord_wait_for_stop(c, -1);
    return KEEL_OK;
}

static volatile int release_stubborn;

static keel_status
stubborn(void *arg, keel_coord *c)
{
    (void)arg;
    (void)c;
    while (!release_stubborn)
        usleep(1000);
    return KEEL_OK;
}

static keel_status
failing(void *arg, keel_coord *c)
{
    (void)arg;
    (void)c;
    return keel_error_set(KEEL_EPEER, "peer 3 went away");
}

static atomic_int looper_calls;

static keel_status
loop_fn(void *arg)
{
    (void)arg;
    atomic_fetch_add(&looper_calls, 1);
    return KEEL_OK;
}

START_TEST(test_coordinator_wakes_waiters_on_stop_and_join_honours_grace)
{
    keel_coord *c;
    int64_t t0;
    char msg[128];
    ck_assert_int_eq(keel_coord_new(&c), KEEL_OK);
    ck_assert_int_eq(keel_coord_start_thread(c, "waiter", wait_stop, NULL),
                     KEEL_OK);
    atomic_store(&looper_calls, 0);
    ck_assert_int_eq(keel_coord_start_looper(c, "loop", 3600000, loop_fn,
                                             NULL), KEEL_OK);
    /* the first call comes at once (not after the 1 h period); a stop
     * requested before the looper thread runs would skip it, so the stop
     * waits for it (a loaded machine may start the thread late) */
    t0 = tu_now_ms();
    while (atomic_load(&looper_calls) == 0 && tu_now_ms() - t0 < 30000)
        ck_assert(!keel_coord_wait_for_stop(c, 10));
    t0 = tu_now_ms();
    keel_coord_request_stop(c, KEEL_OK, "test");
    ck_assert_int_eq(keel_coord_join(c, 60000, 0), KEEL_OK);
    ck_assert_int_lt(tu_now_ms() - t0, 60000);  // not the 1 h period
    ck_assert_int_eq(atomic_load(&looper_calls), 1);  // once in 1 h
    keel_coord_clear_stop(c);
    release_stubborn = 0;
    ck_assert_int_eq(keel_coord_start_thread(c, "stubborn", stubborn, NULL),
                     KEEL_OK);
    keel_coord_request_stop(c, KEEL_OK, NULL);
    t0 = tu_now_ms();
    ck_assert_int_eq(keel_coord_join(c, 100, 0), KEEL_ETIMEOUT);
    ck_assert_int_ge(tu_now_ms() - t0, 90);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "stubborn"));
    release_stubborn = 1;
    keel_coord_clear_stop(c);
    ck_assert_int_eq(keel_coord_start_thread(c, "bad", failing, NULL),
                     KEEL_OK);
    keel_coord_request_stop(c, KEEL_EIO, "second error");   // may race
    ck_assert(keel_coord_wait_for_stop(c, 5000));
    ck_assert_int_ne(keel_coord_join(c, 1000, 0), KEEL_OK);
    ck_assert_int_ne(keel_coord_error(c, msg, sizeof msg), KEEL_OK);
    keel_coord_free(c);
}
END_TEST

START_TEST(test_coordinator_keeps_first_error_only)
{
    keel_coord *c;
    char msg[128];
    ck_assert_int_eq(keel_coord_new(&c), KEEL_OK);
    keel_coord_request_stop(c, KEEL_EPEER, "first");
    keel_coord_request_stop(c, KEEL_EIO, "second");
    ck_assert_int_eq(keel_coord_error(c, msg, sizeof msg), KEEL_EPEER);
    ck_assert_str_eq(msg, "first");
    ck_assert_int_eq(keel_coord_join(c, 10, 0), KEEL_EPEER);
    keel_coord_free(c);
}
END_TEST

/* ---- in-process replicas and strategies ---------------------------------- */

/* Replica r's gradient of w is leaf[r]; its loss r. Replica fail_replica
 * fails; mark_applied makes replica 1 claim the update. */
static const float leaf4[4] = { 1.0f, 1e8f, -1e8f, 1.0f };
static int fail_replica = -1, mark_applied_replica = -1;
static _Atomic int replica_calls;

static keel_status
replica_step(void *ctx, keel_step *st)
{
    int r = keel_step_replica(st);
    (void)ctx;
    replica_calls++;
    if (keel_step_num_replicas(st) != 4 && keel_step_num_replicas(st) != 2)
        return keel_error_set(KEEL_EINTERNAL, "replicas %d",
                              keel_step_num_replicas(st));
    if (r == fail_replica)
        return keel_error_set(KEEL_EIO, "replica's disk is gone");
    if (r == mark_applied_replica)
        keel_step_mark_applied(st);
    keel_grads_find(keel_step_grads(st), "w")->data[0] = leaf4[r];
    return keel_step_set_value(st, "loss", (double)r);
}

static float applied_grad;
static double seen_loss;

static keel_status
record_apply(void *ctx, keel_vars *v, keel_grads *g, int64_t gs)
{
    (void)ctx;
    (void)v;
    (void)gs;
    applied_grad = keel_grads_find(g, "w")->data[0];
    n_applied++;
    return KEEL_OK;
}

/* A session config whose steps are step and whose updates record_apply
 * records: the replica tests' base. */
static void
replica_cfg(keel_session_config *c, keel_step_fn step)
{
    keel_session_config_init(c);
    c->manager.vars = vs;
    c->step = step;
    c->updater.apply = record_apply;
}

static keel_status
loss_before(void *ctx, keel_run_context *rc)
{
    (void)ctx;
    return keel_run_context_request(rc, "loss");
}

static keel_status
loss_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    (void)ctx;
    (void)rc;
    seen_loss = keel_run_values_get(v, "loss");
    return KEEL_OK;
}

/* Four replicas: one update with their gradients added along the tree,
 * (1 + 1e8) + (-1e8 + 1) = 1e8 + -1e8 = 0 in float (adding in replica
 * order would give ((1 + 1e8) - 1e8) + 1 = 1), and the mean of their
 * losses (0+1+2+3)/4 = 1.5. */
START_TEST(test_replicas_add_gradients_along_the_tree_and_average_values)
{
    keel_hook h = { .struct_size = sizeof h, .name = "loss",
                    .before_run = loss_before, .after_run = loss_after };
    keel_session_config c;
    keel_session *s;
    replica_cfg(&c, replica_step);
    c.hooks = &h;
    c.n_hooks = 1;
    c.replicas = 4;
    c.skip_grad_zeroing = 1;  /* replicas' stores are zeroed regardless */
    replica_calls = 0;
    applied_grad = -1.0f;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(replica_calls, 4);
    ck_assert_int_eq(n_applied, 1);
    ck_assert(applied_grad == 0.0f);
    ck_assert(seen_loss == 1.5);
    ck_assert_int_eq(keel_vars_global_step(vs), 1);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(replica_calls, 8);
    ck_assert(applied_grad == 0.0f);
    keel_session_close(s);
    keel_session_free(s);
}
END_TEST


static float rows_dense[6];
static int rows_left;

/* Replica r adds the row r + 1 (twice, for ids 2 and 0) of table "t". */
static keel_status
rows_step(void *ctx, keel_step *st)
{
    const int64_t ids[2] = { 2, 0 };
    float r1 = (float)(keel_step_replica(st) + 1);
    float rows[4] = { r1, -r1, 10 * r1, 0 };
    keel_grads *g = keel_step_grads(st);
    (void)ctx;
    return keel_grads_add_rows(g, keel_var_index(keel_vars_find(vs, "t")),
                               2, ids, rows);
}

static keel_status
record_rows_apply(void *ctx, keel_vars *v, keel_grads *g, int64_t gs)
{
    (void)ctx;
    (void)gs;
    memcpy(rows_dense, keel_grads_find(g, "t")->data, sizeof rows_dense);
    rows_left = keel_grads_has_rows(g) ||
                keel_grads_rows(g, keel_var_index(keel_vars_find(v, "t")),
                                NULL, NULL) > 0;
    n_applied++;
    return KEEL_OK;
}

/* An updater other than keel's optimizer reads dense gradients: the
 * session gives it the step's rows scattered into the dense gradient,
 * alone and summed over in-process replicas. */
START_TEST(test_gradient_rows_reach_a_custom_updater_dense)
{
    int64_t shape[2] = { 3, 2 };
    keel_session_config c;
    keel_session *s;
    ck_assert_int_eq(keel_vars_create(vs, "t", 2, shape, KEEL_VAR_TRAINABLE,
                                      NULL), KEEL_OK);
    for (int replicas = 1; replicas <= 2; replicas++) {
        float sum = replicas == 1 ? 1.0f : 3.0f;
        replica_cfg(&c, rows_step);
        c.updater.apply = record_rows_apply;
        c.replicas = replicas;
        n_applied = 0;
        rows_left = 1;
        ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
        ck_assert_int_eq(n_applied, 1);
        ck_assert_int_eq(rows_left, 0);
        ck_assert(rows_dense[4] == sum && rows_dense[5] == -sum);
        ck_assert(rows_dense[0] == 10 * sum && rows_dense[1] == 0.0f);
        ck_assert(rows_dense[2] == 0.0f && rows_dense[3] == 0.0f);
        /* the next step starts from zero: the same gradient again */
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
        ck_assert(rows_dense[4] == sum && rows_dense[0] == 10 * sum);
        keel_session_close(s);
        keel_session_free(s);
    }
}
END_TEST

static double seen_replica2, seen_lr;
static keel_status metric_status[2];

/* Replica r's loss is a metric summed over r + 1 examples (sum r), its
 * learning rate a plain value; replica 0 also tries the bad calls. */
static keel_status
metric_step(void *ctx, keel_step *st)
{
    int r = keel_step_replica(st);
    keel_status rc;
    (void)ctx;
    if (r == 0)
        metric_status[0] = keel_step_set_metric(st, "n", 1.0, 0);
    for (int k = 0; k < KEEL_MAX_METRICS - 1; k++) {
        static const char *const names[] = { "m0", "m1", "m2" };
        (void)keel_step_set_metric(st, names[k % 3], 1.0, 1);
    }
    rc = keel_step_set_metric(st, "loss", (double)r, r + 1);
    if (r == 0)
        metric_status[1] = keel_step_set_metric(st, "one_too_many", 1.0, 1);
    if (rc == KEEL_OK)
        rc = keel_step_set_value(st, "lr", 0.5 * (r + 1));
    return rc;
}

static keel_status
metric_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    (void)ctx;
    (void)rc;
    seen_loss = keel_run_values_get(v, "loss");
    seen_replica2 = keel_run_values_get(v, "loss/replica_2");
    seen_lr = keel_run_values_get(v, "lr");
    return KEEL_OK;
}

/* In-process replicas: a metric is the example-weighted mean over every
 * replica (sums added, counts added: (0+1+2+3) / (1+2+3+4)), not the mean
 * of their means; each replica's own mean is "loss/replica_<i>"; a plain
 * value stays the replicas' mean. A metric over no example and a metric
 * past KEEL_MAX_METRICS are refused. keel_session_find_value gives the
 * hooks' figures after the step. */
START_TEST(test_replicas_weigh_metrics_by_examples)
{
    keel_hook h = { .struct_size = sizeof h, .name = "metrics",
                    .before_run = loss_before, .after_run = metric_after };
    keel_session_config c;
    keel_session *s;
    replica_cfg(&c, metric_step);
    c.hooks = &h;
    c.n_hooks = 1;
    c.replicas = 4;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_find_value(s, "loss", NULL), 0);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert(seen_loss == 6.0 / 10.0);
    ck_assert(seen_replica2 == 2.0 / 3.0);
    ck_assert(seen_lr == (0.5 + 1.0 + 1.5 + 2.0) / 4);
    ck_assert_int_eq(metric_status[0], KEEL_EINVAL);
    ck_assert_int_eq(metric_status[1], KEEL_ENOMEM);
    /* after the step, the session gives what the hooks read */
    {
        double x = -1.0;
        ck_assert_int_eq(keel_session_find_value(s, "loss", &x), 1);
        ck_assert(x == 6.0 / 10.0);
        ck_assert_int_eq(keel_session_find_value(s, "loss/replica_2", &x),
                         1);
        ck_assert(x == 2.0 / 3.0);
        ck_assert_int_eq(keel_session_find_value(s, "no_such", &x), 0);
        ck_assert(x == 2.0 / 3.0);
    }
    keel_session_close(s);
    keel_session_free(s);
}
END_TEST

START_TEST(test_replica_failures_name_the_replica_and_apply_nothing)
{
    keel_session_config c;
    keel_session *s;
    replica_cfg(&c, replica_step);
    c.max_recovery_attempts = 0;
    c.replicas = KEEL_MAX_REPLICAS + 1;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "replicas"));
    c.replicas = 4;
    fail_replica = 2;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_EIO);
    ck_assert_msg(strstr(keel_last_error(), "replica 2 of 4: replica's "
                         "disk is gone") != NULL, "%s", keel_last_error());
    ck_assert_int_eq(n_applied, 0);
    keel_session_free(s);
    fail_replica = -1;
    mark_applied_replica = 1;
    c.replicas = 2;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "replica 1 of 2"));
    ck_assert_int_eq(n_applied, 0);
    ck_assert_int_eq(keel_vars_global_step(vs), 0);
    keel_session_free(s);
    mark_applied_replica = -1;
}
END_TEST

/* A replica step that adds 1 to its store and notes a store that was not
 * zero on entry; replica 1 fails (recoverably) once, after its add. */
static _Atomic int dirty_entries, fails_left;

static keel_status
adding_step(void *ctx, keel_step *st)
{
    keel_tensor *g = keel_grads_find(keel_step_grads(st), "w");
    (void)ctx;
    if (g->data[0] != 0.0f)
        dirty_entries++;
    g->data[0] += 1.0f;
    if (keel_step_replica(st) == 1 && fails_left > 0) {
        fails_left--;
        return keel_error_set(KEEL_EUNAVAILABLE, "replica 1 lost its ps");
    }
    return KEEL_OK;
}

/* Every replica's store is zero when its step starts: after a step whose
 * gradients were reduced, and after a failed step that the session
 * retried (its half-written store not reduced); each update sees 1 + 1. */
START_TEST(test_replica_stores_start_zero_every_step_and_after_a_failure)
{
    keel_session_config c;
    keel_session *s;
    replica_cfg(&c, adding_step);
    c.replicas = 2;
    c.manager.recovery_wait_ms = 1;
    c.backoff_ms = 1;
    dirty_entries = 0;
    fails_left = 0;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    for (int i = 0; i < 3; i++) {
        applied_grad = -1.0f;
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
        ck_assert(applied_grad == 2.0f);
    }
    fails_left = 1;
    applied_grad = -1.0f;
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(fails_left, 0);
    ck_assert(applied_grad == 2.0f);
    ck_assert_int_eq(n_applied, 4);
    ck_assert_int_eq(dirty_entries, 0);
    keel_session_close(s);
    keel_session_free(s);
}
END_TEST

/* Session, training and supervisor configs and backends not filled by
 * their init function are refused, naming the struct and the function:
 * each zc_ function passes one such struct to one constructor, which
 * leaves its output NULL. */
static script zc_script;
static keel_session *zc_s;
static keel_supervisor *zc_sv;
static keel_backend zc_be;

/* A session config as a caller fills it, but for its init function */
static void
zc_fill(keel_session_config *c)
{
    c->manager.vars = vs;
    c->step = scripted_step;
    c->step_ctx = &zc_script;
}

/* A backend made without keel_backend_init */
static keel_backend *
zc_backend(void)
{
    memset(&zc_be, 0, sizeof zc_be);
    zc_be.name = "mine";
    return &zc_be;
}

static keel_status
zc_session_config(void)
{
    keel_session_config c;
    memset(&c, 0, sizeof c);
    zc_fill(&c);
    return keel_session_new(&c, &zc_s);
}

static keel_status
zc_nested_session_config(void)
{
    keel_training_config tc;
    keel_training_config_init(&tc);
    memset(&tc.session, 0, sizeof tc.session);
    zc_fill(&tc.session);
    return keel_training_session_new(&tc, &zc_s);
}

static keel_status
zc_training_config(void)
{
    keel_training_config tc;
    memset(&tc, 0, sizeof tc);
    keel_session_config_init(&tc.session);
    zc_fill(&tc.session);
    return keel_training_session_new(&tc, &zc_s);
}

static keel_status
zc_supervisor_config(void)
{
    keel_supervisor_config vc;
    memset(&vc, 0, sizeof vc);
    vc.session.manager.vars = vs;
    vc.session.step = scripted_step;
    return keel_supervisor_new(&vc, &zc_sv);
}

/* st, once the message is seen to name the taker (who) and the backend */
static keel_status
zc_backend_named(keel_status st, const char *who)
{
    char want[64];
    TU_SNPRINTF(want, sizeof want, "%s: backend 'mine': ", who);
    ck_assert_msg(strstr(keel_last_error(), want) != NULL, "'%s' lacks '%s'",
                  keel_last_error(), want);
    return st;
}

static keel_status
zc_session_backend(void)
{
    keel_session_config c;
    keel_session_config_init(&c);
    zc_fill(&c);
    c.manager.backend = zc_backend();
    return zc_backend_named(keel_session_new(&c, &zc_s), "session");
}

static keel_status
zc_supervisor_backend(void)
{
    keel_supervisor_config vc;
    keel_supervisor_config_init(&vc);
    vc.session.manager.vars = vs;
    vc.session.step = scripted_step;
    vc.session.manager.backend = zc_backend();
    return zc_backend_named(keel_supervisor_new(&vc, &zc_sv), "supervisor");
}

static keel_status
zc_manager_backend(void)
{
    keel_session_manager_config mc;
    keel_session_manager *sm = NULL;
    keel_status st;
    keel_session_manager_config_init(&mc);
    mc.vars = vs;
    mc.backend = zc_backend();
    st = keel_session_manager_new(&mc, &sm);
    ck_assert_ptr_null(sm);
    return st;
}

START_TEST(test_configs_without_their_init_are_refused_by_name)
{
    static const tu_zeroed_case cases[] = {
        { "keel_session_config", zc_session_config },
        { "keel_session_config", zc_nested_session_config },
        { "keel_training_config", zc_training_config },
        { "keel_supervisor_config", zc_supervisor_config },
        { "keel_backend", zc_session_backend },
        { "keel_backend", zc_supervisor_backend },
        { "keel_backend", zc_manager_backend },
    };
    keel_session_manager_config mc;
    keel_session_manager *sm = NULL;
    zc_s = NULL;
    zc_sv = NULL;
    tu_assert_zeroed_refused(cases, sizeof cases / sizeof *cases);
    ck_assert_ptr_null(zc_s);
    ck_assert_ptr_null(zc_sv);
    /* the same backend filled by keel_backend_init (all NULL: a local
     * backend) is taken */
    keel_backend_init(&zc_be);
    keel_session_manager_config_init(&mc);
    mc.vars = vs;
    mc.backend = &zc_be;
    ck_assert_int_eq(keel_session_manager_new(&mc, &sm), KEEL_OK);
    keel_session_manager_free(sm);
}
END_TEST

START_TEST(test_strategy_names_and_the_training_sessions_rules)
{
    static const char *names[] = { "auto", "one_device", "mirrored",
                                   "multi_worker_mirrored",
                                   "parameter_server" };
    keel_training_config tc;
    keel_strategy k;
    keel_session *s;
    for (int i = 0; i < 5; i++) {
        ck_assert_str_eq(keel_strategy_name((keel_strategy)i), names[i]);
        ck_assert_int_eq(keel_strategy_from_name(names[i], &k), KEEL_OK);
        ck_assert_int_eq((int)k, i);
    }
    ck_assert_str_eq(keel_strategy_name((keel_strategy)99), "?");
    ck_assert_int_eq(keel_strategy_from_name("mirror", &k), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "parameter_server"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'mirror'"));
    ck_assert_int_eq(keel_strategy_resolve(KEEL_STRATEGY_AUTO, 1),
                     KEEL_STRATEGY_PARAMETER_SERVER);
    ck_assert_int_eq(keel_strategy_resolve(KEEL_STRATEGY_AUTO, 0),
                     KEEL_STRATEGY_ONE_DEVICE);
    ck_assert_int_eq(keel_strategy_resolve(KEEL_STRATEGY_MIRRORED, 1),
                     KEEL_STRATEGY_MIRRORED);
    keel_training_config_init(&tc);
    replica_cfg(&tc.session, replica_step);
    tc.strategy = KEEL_STRATEGY_PARAMETER_SERVER;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "needs a cluster"));
    tc.strategy = KEEL_STRATEGY_MULTI_WORKER_MIRRORED;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "MPI"));
    tc.strategy = KEEL_STRATEGY_ONE_DEVICE;
    tc.session.replicas = 2;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "needs strategy "
                                                    "mirrored"));
    /* mirrored runs session.replicas (still 2) replicas */
    tc.strategy = KEEL_STRATEGY_MIRRORED;
    replica_calls = 0;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_eq(replica_calls, 2);
    ck_assert(applied_grad == 1.0f + 1e8f);
    keel_session_free(s);
}
END_TEST

/* ---- MonitoredTrainingSession and Supervisor ---------------------------- */

START_TEST(test_training_session_rejects_both_secs_and_steps)
{
    keel_training_config tc;
    keel_session *s;
    script sc = { 0 };
    keel_training_config_init(&tc);
    tc.session.manager.vars = vs;
    tc.session.step = scripted_step;
    tc.session.step_ctx = &sc;
    tc.session.manager.checkpoint_dir = tu_dir;
    tc.save_checkpoint_secs = 10;
    tc.save_checkpoint_steps = 10;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "save_checkpoint"));
    ck_assert_ptr_null(s);
}
END_TEST

START_TEST(test_training_session_hook_order_chief_and_worker)
{
    keel_training_config tc;
    keel_session *s;
    script sc = { 0 };
    rec ch = { "C", 0 }, us = { "U", 0 };
    keel_hook chief = rec_hook(&ch), user = rec_hook(&us);
    fake_on_save = on_save;
    keel_training_config_init(&tc);
    tc.session.manager.vars = vs;
    tc.session.step = scripted_step;
    tc.session.step_ctx = &sc;
    tc.session.hooks = &user;
    tc.session.n_hooks = 1;
    tc.chief_only_hooks = &chief;
    tc.n_chief_only_hooks = 1;
    tc.session.manager.checkpoint_dir = tu_dir;
    tc.save_summaries_steps = 0;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    keel_session_free(s);
    /* chief-only first, the checkpoint hook (S0), then user hooks; the
     * default 600 s timer does not trigger again; final save at end. */
    ck_assert_str_eq(ev, "b:C b:U c:C S0 c:U r:C r:U s0 a:C1 a:U1 "
                         "e:C:clean S1 e:U:clean ");
    ev[0] = '\0';
    fake_install();
    keel_vars_set_all_initialized(vs, 1);  // the chief made it ready
    tc.session.is_chief = 0;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_OK);
    keel_session_free(s);
    ck_assert_str_eq(ev, "b:U c:U e:U:clean ");
    ck_assert_int_eq(fake.n_saves, 0);
}
END_TEST

/* The setup line says only what this task does with checkpoints: none
 * without a directory, the chief's period, and a worker writes none. */
START_TEST(test_training_session_logs_only_the_checkpoints_it_writes)
{
    keel_training_config tc;
    keel_session *s;
    script sc = { 0 };
    tu_log log = { .filter = "training session (" };
    char want[sizeof log.text];
    keel_training_config_init(&tc);
    tc.session.manager.vars = vs;
    tc.session.step = scripted_step;
    tc.session.step_ctx = &sc;
    tc.save_summaries_steps = 0;
    keel_log_set_handler(tu_log_append, &log, KEEL_LOG_INFO);
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_OK);
    keel_session_free(s);
    tc.session.manager.checkpoint_dir = tu_dir;
    tc.save_checkpoint_steps = 50;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_OK);
    keel_session_free(s);
    keel_vars_set_all_initialized(vs, 1);  // the chief made it ready
    tc.session.is_chief = 0;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_OK);
    keel_session_free(s);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_INFO);
    snprintf(want, sizeof want,
             "training session (chief): 0 hooks, checkpoints off (no "
             "checkpoint_dir)\n"
             "training session (chief): 2 hooks, checkpoints %s every 50 "
             "steps\n"
             "training session (worker): 0 hooks, checkpoints: written by "
             "the chief\n", tu_dir);
    ck_assert_str_eq(log.text, want);
}
END_TEST

START_TEST(test_supervisor_checkpoints_at_start_and_at_stop)
{
    keel_supervisor_config cfg;
    keel_supervisor *sv;
    script sc = { 0 };
    keel_supervisor_config_init(&cfg);
    cfg.session.manager.vars = vs;
    cfg.session.step = scripted_step;
    cfg.session.step_ctx = &sc;
    cfg.session.manager.checkpoint_dir = tu_dir;
    ck_assert_int_eq(keel_supervisor_new(&cfg, &sv), KEEL_OK);
    ck_assert_int_eq(keel_supervisor_run_step(sv, NULL), KEEL_ESTATE);
    ck_assert_int_eq(keel_supervisor_prepare_or_wait(sv, 1), KEEL_OK);
    ck_assert_int_eq(keel_supervisor_loop(sv, 5), KEEL_OK);
    ck_assert(keel_supervisor_should_stop(sv));
    ck_assert_int_eq(fake.n_saves, 2);
    ck_assert_int_eq(fake.steps[0], 0);
    ck_assert_int_eq(fake.steps[1], 5);
    keel_supervisor_free(sv);
}
END_TEST

/* A final checkpoint that fails (fake: ENOSPC after the creation's save)
 * is the close status of MonitoredTrainingSession (last step reached) and
 * of the Supervisor (keel_supervisor_loop, keel_supervisor_stop); the
 * hooks after the failing one still see end. */
START_TEST(test_final_checkpoint_failure_is_the_close_status)
{
    keel_training_config tc;
    keel_supervisor_config vc;
    keel_supervisor *sv;
    keel_session *s;
    script sc = { 0 };
    rec r = { "after", 0 };
    keel_hook h[2];
    keel_stop_at_step_hook_config pc;

    keel_stop_at_step_hook_config_init(&pc);
    pc.last_step = 4;
    ck_assert_int_eq(keel_stop_at_step_hook_new(&pc, &h[0]), KEEL_OK);
    h[1] = rec_hook(&r);
    keel_training_config_init(&tc);
    tc.session.manager.vars = vs;
    tc.session.step = scripted_step;
    tc.session.step_ctx = &sc;
    tc.session.manager.checkpoint_dir = tu_dir;
    tc.session.hooks = h;
    tc.session.n_hooks = 2;
    tc.save_summaries_steps = 0;
    fake.fail_after_saves = 1;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    ck_assert_int_eq(keel_session_global_step(s), 4);
    ck_assert_int_eq(keel_session_close(s), KEEL_EIO);
    ck_assert_msg(strstr(keel_last_error(), "final checkpoint at step 4 "
                         "not saved") != NULL && strstr(keel_last_error(),
                         "fake-4: No space left on device") != NULL, "%s",
                  keel_last_error());
    ck_assert_msg(strstr(ev, "e:after:") != NULL, "%s", ev);
    keel_session_free(s);
    keel_hook_release(&h[0]);
    ck_assert_int_eq(fake.n_saves, 1);

    fake_install();
    fake.fail_after_saves = 1;
    keel_vars_set_global_step(vs, 0);
    keel_supervisor_config_init(&vc);
    vc.session.manager.vars = vs;
    vc.session.step = scripted_step;
    vc.session.step_ctx = &sc;
    vc.session.manager.checkpoint_dir = tu_dir;
    ck_assert_int_eq(keel_supervisor_new(&vc, &sv), KEEL_OK);
    ck_assert_int_eq(keel_supervisor_prepare_or_wait(sv, 1), KEEL_OK);
    ck_assert_int_eq(keel_supervisor_loop(sv, 3), KEEL_EIO);
    ck_assert_msg(strstr(keel_last_error(), "final checkpoint at step 3 "
                         "not saved") != NULL, "%s", keel_last_error());
    ck_assert_int_eq(keel_supervisor_stop(sv), KEEL_OK);    /* closed */
    keel_supervisor_free(sv);
}
END_TEST

/* The step of test_training_session_takes_kfac_dist: a dense layer
 * x (2 x 3) W (3 x 2) + b, gradients and K-FAC's statistics from fixed
 * numbers. */
static keel_status
kfac_dist_step(void *ctx, keel_step *st)
{
    static const float x[6] = { 1, 2, 0.5f, -1, 0.25f, 3 };
    static const float d[4] = { 0.5f, -0.25f, -1, 0.75f };
    keel_grads *g = keel_step_grads(st);
    float *gw = keel_grads_find(g, "dense/kernel")->data;
    float *gb = keel_grads_find(g, "dense/bias")->data;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            gw[i * 2 + j] = (x[i] * d[j] + x[3 + i] * d[2 + j]) / 2;
    for (int j = 0; j < 2; j++)
        gb[j] = (d[j] + d[2 + j]) / 2;
    return keel_kfac_observe_layer(ctx, 0, x, d, 2,
                                   keel_step_global_step(st));
}

/* keel_training_config.kfac_dist alone: the session applies the handle's
 * K-FAC (any mode: one replica is one process); it refuses a handle of
 * another replica count, an optimizer beside it, and a cluster config of
 * roles mode with one replica. */
START_TEST(test_training_session_takes_kfac_dist)
{
    static const int64_t ws[2] = { 3, 2 }, bs[1] = { 2 };
    keel_vars *kv;
    keel_var *w, *b;
    keel_kfac_layers *lc;
    keel_kfac *k;
    keel_kfac_config kc;
    keel_kfac_dist_config dc;
    keel_kfac_dist *d, *d3;
    keel_cluster_config co;
    keel_optimizer_config sgd;
    keel_training_config tc;
    keel_session *s;
    float before;
    ck_assert_int_eq(keel_vars_new(&kv), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(kv, "dense/kernel", 2, ws,
                                      KEEL_VAR_TRAINABLE, &w), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(kv, "dense/bias", 1, bs,
                                      KEEL_VAR_TRAINABLE, &b), KEEL_OK);
    for (int i = 0; i < 6; i++)
        keel_var_tensor(w)->data[i] = 0.1f * (float)(i + 1);
    before = keel_var_tensor(w)->data[0];
    ck_assert_int_eq(keel_kfac_layers_new(&lc), KEEL_OK);
    ck_assert_int_eq(keel_kfac_layers_add_dense(lc, w, b, NULL), KEEL_OK);
    keel_kfac_config_init(&kc);
    ck_assert_int_eq(keel_kfac_new_from_layers(&kc, lc, kv, &k), KEEL_OK);
    keel_kfac_layers_free(lc);
    ck_assert_int_eq(keel_kfac_dist_add_state(k, kv), KEEL_OK);
    keel_kfac_dist_config_init(&dc);
    dc.mode = KEEL_KFAC_DIST_ROLES;
    ck_assert_int_eq(keel_kfac_dist_new(&dc, k, kv, &d), KEEL_OK);
    ck_assert_int_eq(keel_kfac_dist_observes(d), 1);
    keel_cluster_config_init(&co);
    ck_assert_int_eq(keel_kfac_dist_cluster_config(d, &co), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "1 replica(s)"));

    keel_training_config_init(&tc);
    tc.session.manager.vars = kv;
    tc.session.step = kfac_dist_step;
    tc.session.step_ctx = k;
    tc.log_step_count_steps = 0;
    tc.kfac_dist = d;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
    keel_session_free(s);
    /* K-FAC's update ran: its EMA took the step's statistics */
    ck_assert(keel_var_tensor(w)->data[0] != before);
    ck_assert(keel_var_tensor(keel_vars_find(kv, "kfac/ema_weight"))
                  ->data[0] > 0.0f);

    keel_optimizer_config_init(&sgd, KEEL_OPT_SGD);
    tc.optimizer = &sgd;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "kfac_dist"));
    tc.optimizer = NULL;
    dc.mode = KEEL_KFAC_DIST_CHIEF;
    dc.replica = 1;
    dc.replicas = 3;
    ck_assert_int_eq(keel_kfac_dist_new(&dc, k, kv, &d3), KEEL_OK);
    tc.kfac_dist = d3;
    ck_assert_int_eq(keel_training_session_new(&tc, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "replica 1 of 3"));
    keel_kfac_dist_free(d3);
    keel_kfac_dist_free(d);
    keel_kfac_free(k);
    keel_vars_free(kv);
}
END_TEST

/* ---- keel train's one process: the step and its update in one run ---- */

static const char *job_ini;
static char out[65536], err[65536];

static void
job_setup(void)
{
    job_ini = tu_setup_job("max_steps = 12\n");
}

/* keel_job_train of job_ini with these "section.key=value" settings
 * (NULL-terminated) and checkpoints in dir, the step and update fused or
 * not; returns the steps that fused. */
static int64_t
train_job(const char *dir, int fused, const char *const *sets)
{
    keel_config *cfg;
    char set_dir[4200];
    int64_t before = keel__job_fused_steps;
    keel_status st;
    TU_SNPRINTF(set_dir, sizeof set_dir, "checkpoint.dir=%s", tu_path(dir));
    ck_assert_int_eq(keel_config_new(&cfg), KEEL_OK);
    ck_assert_int_eq(keel_config_load(cfg, job_ini), KEEL_OK);
    ck_assert_int_eq(keel_config_override(cfg, set_dir, "test"), KEEL_OK);
    for (int i = 0; sets[i] != NULL; i++)
        ck_assert_int_eq(keel_config_override(cfg, sets[i], "test"),
                         KEEL_OK);
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    keel__job_fused_update = fused;
    st = keel_job_train(cfg, NULL, NULL);
    keel__job_fused_update = 1;
    keel_config_free(cfg);
    ck_assert_msg(st == KEEL_OK, "keel_job_train %s: %s", dir,
                  keel_last_error());
    return keel__job_fused_steps - before;
}

/* keel train in one process makes each dense step and its update in one
 * pool run (keel__model_step_apply): on 1 and 2 model threads, with the
 * batch in one piece and in several, the final checkpoint is bitwise the
 * one of the step and the update made apart; where a backend, replicas or
 * micro-batches come between them, the two stay apart. */
START_TEST(test_train_fused_step_update_gives_identical_bits)
{
    static const char *const cases[][4] = {
        { "train.model_threads=1", NULL },
        { "train.model_threads=2", NULL },
        { "train.model_threads=2", "train.batch_size=320", NULL },
        { "train.model_threads=1", "optimizer.name=momentum",
          "train.batch_size=320", NULL },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char fused[64], apart[64], a[4300], b[4300];
        TU_SNPRINTF(fused, sizeof fused, "fused%zu", c);
        TU_SNPRINTF(apart, sizeof apart, "apart%zu", c);
        ck_assert_int_eq(train_job(fused, 1, cases[c]), 12);
        ck_assert_int_eq(train_job(apart, 0, cases[c]), 0);
        TU_SNPRINTF(a, sizeof a, "%s/model.ckpt-12.h5", tu_path(fused));
        TU_SNPRINTF(b, sizeof b, "%s/model.ckpt-12.h5", tu_path(apart));
        ck_assert_msg(TU_KEEL(20000, "ckpt", "diff", a, b) == 0,
                      "case %zu: %s %s", c, tu_tail(out, 1500),
                      tu_tail(err, 1500));
    }
    {   /* micro-batches sit between: the step and its update stay apart */
        static const char *const micro[] = { "train.micro_batch=16", NULL };
        ck_assert_int_eq(train_job("micro", 1, micro), 0);
    }
}
END_TEST

static Suite *
session_suite(void)
{
    Suite *s = suite_create("session");
    tu_tcase(s, "session", 20, setup, teardown, TU_TESTS(
        test_clean_run_calls_hooks_in_order_and_end_clean,
        test_optimizer_updater_applies_the_optimizer,
        test_training_session_takes_kfac_dist,
        test_no_update_rule_is_logged_once,
        test_user_hook_starts_from_keel_hook_init,
        test_backend_updater_wins_and_an_unused_updater_is_named,
        test_a_step_runs_hogwild_rounds_of_one_step_per_thread,
        test_hook_stop_request_lets_all_hooks_see_after_run_then_refuses,
        test_step_error_skips_after_run_and_ends_with_error,
        test_recoverable_error_recreates_session_and_retries_same_step,
        test_recovery_is_bounded_and_singular_does_not_recover,
        test_first_recovery_is_at_once_then_backs_off,
        test_end_of_input_ends_with_out_of_range,
        test_sigterm_stops_at_step_boundary_and_saves_final_checkpoint,
        test_requested_value_the_step_never_sets_fails_naming_it,
        test_nan_hook_fails_or_stops_and_inf_is_optional,
        test_feed_fn_supplies_batch_and_its_end_of_input_ends_cleanly,
        test_run_without_hooks_skips_hooks_but_updates,
        test_user_hook_sees_step_duration_and_values_by_any_pointer,
        test_timer_trigger_semantics_with_injected_clock,
        test_stop_at_step_num_steps_is_relative_last_step_absolute,
        test_ckpt_hook_saves_at_creation_every_n_and_end_never_twice,
        test_ckpt_listener_can_stop_training_and_error_skips_final_save,
        test_meta_blobs_saved_and_handed_back_after_restore,
        test_prepare_errors_match_tf_conditions,
        test_worker_wait_wakes_on_notify_and_times_out,
        test_recover_session_ready_only_after_a_restore,
        test_coordinator_wakes_waiters_on_stop_and_join_honours_grace,
        test_coordinator_keeps_first_error_only,
        test_training_session_rejects_both_secs_and_steps,
        test_training_session_hook_order_chief_and_worker,
        test_training_session_logs_only_the_checkpoints_it_writes,
        test_supervisor_checkpoints_at_start_and_at_stop,
        test_final_checkpoint_failure_is_the_close_status,
        test_replicas_add_gradients_along_the_tree_and_average_values,
        test_replicas_weigh_metrics_by_examples,
        test_gradient_rows_reach_a_custom_updater_dense,
        test_replica_failures_name_the_replica_and_apply_nothing,
        test_replica_stores_start_zero_every_step_and_after_a_failure,
        test_strategy_names_and_the_training_sessions_rules,
        test_configs_without_their_init_are_refused_by_name));
    tu_tcase(s, "train", 60, job_setup, tu_teardown, TU_TESTS(
        test_train_fused_step_update_gives_identical_bits));
    return s;
}

KEEL_TEST_MAIN(session_suite)
