/* check_hooks.c - unit tests for the standard hooks not covered by
 * check_session: logging, step counter and summaries (real event files),
 * profiler traces, the global-step waiter, final ops, struct_size checks,
 * the backend seams (publish, fetch + wait_for_change, is_intact) and the
 * session skipping idle built-in hooks (same output as calling them all). */
#include <config.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keel/keel.h>
#include "util.h"
#include "testutil.h"
#include "fake_ckpt.h"
#include "../session/session_int.h"

static keel_vars *vs;
static tu_log hook_log;   /* every message, for count() */

static int
count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static int fail_with_abort_once;
static int64_t input_ends_at;     /* > 0: the step's end of input */

static keel_status
step(void *ctx, keel_step *st)
{
    (void)ctx;
    if (input_ends_at > 0 && keel_step_global_step(st) >= input_ends_at)
        return keel_error_set(KEEL_EOUTOFRANGE, "input exhausted");
    if (fail_with_abort_once && keel_step_global_step(st) == 1) {
        fail_with_abort_once = 0;
        return keel_error_set(KEEL_EABORTED, "peer restarted");
    }
    return keel_step_set_value(st, "loss", 0.5);
}

static void
setup(void)
{
    tu_setup();
    fake_install();
    hook_log.text[0] = '\0';
    fail_with_abort_once = 0;
    input_ends_at = 0;
    keel_log_set_handler(tu_log_append, &hook_log, KEEL_LOG_DEBUG);
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "w", 0, NULL, KEEL_VAR_TRAINABLE,
                                      NULL), KEEL_OK);
}

static void
teardown(void)
{
    keel__session_set_skipping(1);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_DEBUG);
    keel_vars_free(vs);
    fake_uninstall();
    tu_teardown();
}

/* c: a session config over vs whose steps are step_fn, with these hooks. */
static void
hooks_cfg(keel_session_config *c, keel_step_fn step_fn, keel_hook *h,
          size_t n)
{
    keel_session_config_init(c);
    c->manager.vars = vs;
    c->step = step_fn;
    c->hooks = h;
    c->n_hooks = n;
}

/* A session over vs and step with these hooks; checkpoints in dir (NULL:
 * none). */
static keel_session *
session_in(keel_hook *h, size_t n, const char *dir)
{
    keel_session_config c;
    keel_session *s;
    hooks_cfg(&c, step, h, n);
    c.backoff_ms = 1;
    c.manager.checkpoint_dir = dir;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    return s;
}

static keel_session *
session_with(keel_hook *h, size_t n)
{
    return session_in(h, n, NULL);
}

static void
run_steps(keel_session *s, int n)
{
    for (int i = 0; i < n; i++)
        ck_assert_msg(keel_session_run(s, NULL) == KEEL_OK, "run: %s; %s",
                      keel_last_error(), hook_log.text);
}

static int64_t clock_ns;

static int64_t
ticking_clock(void *ctx)
{
    (void)ctx;
    return clock_ns += 250000000;       // 0.25 s per reading
}

START_TEST(test_logging_hook_logs_first_then_every_n_iter_and_at_end)
{
    const char *names[] = { "loss" };
    keel_logging_hook_config lc;
    keel_hook h;
    keel_session *s;
    keel_logging_hook_config_init(&lc);
    lc.names = names;
    lc.n_names = 1;
    lc.every_n_iter = 2;
    lc.at_end = 1;
    ck_assert_int_eq(keel_logging_hook_new(&lc, &h), KEEL_OK);
    s = session_with(&h, 1);
    run_steps(s, 5);
    ck_assert_int_eq(count(hook_log.text, "loss = 0.5"), 3); // iters 0, 2, 4
    keel_session_free(s);
    ck_assert_int_eq(count(hook_log.text, "loss = 0.5"), 4);   // + at end
    keel_hook_release(&h);
    lc.every_n_iter = 0;
    lc.at_end = 0;
    ck_assert_int_eq(keel_logging_hook_new(&lc, &h), KEEL_EINVAL);
}
END_TEST

START_TEST(test_step_counter_and_summary_write_event_files)
{
    keel_clock clk = { ticking_clock, NULL };
    const char *names[] = { "loss" };
    keel_step_counter_hook_config cc;
    keel_summary_hook_config mc;
    keel_hook h[2];
    keel_session *s;
    char *csv;
    keel_step_counter_hook_config_init(&cc);
    ck_assert_int_eq(cc.every_n_steps, 100);            // TF's default
    cc.every_n_steps = 2;
    cc.output_dir = tu_dir;
    cc.clock = clk;
    ck_assert_int_eq(keel_step_counter_hook_new(&cc, &h[0]), KEEL_OK);
    keel_summary_hook_config_init(&mc);
    mc.names = names;
    mc.n_names = 1;
    mc.save_steps = 2;
    mc.output_dir = tu_dir;
    mc.clock = clk;
    ck_assert_int_eq(keel_summary_hook_new(&mc, &h[1]), KEEL_OK);
    s = session_with(h, 2);
    run_steps(s, 5);
    keel_session_free(s);
    keel_hook_release(&h[0]);
    keel_hook_release(&h[1]);
    csv = tu_read_file(tu_path("scalars.csv"), NULL);
    /* counter triggers at 1, 3, 5: the first only sets the baseline */
    ck_assert_int_eq(count(csv, ",global_step/sec,"), 2);
    ck_assert_int_eq(count(hook_log.text, "global_step/sec: "), 2);
    /* summaries at steps 1, 3, 5 */
    ck_assert_int_eq(count(csv, ",loss,"), 3);
    ck_assert_ptr_nonnull(strstr(csv, ",5,loss,"));
    free(csv);
    cc.every_n_secs = 1.0;                              // both: refused
    ck_assert_int_eq(keel_step_counter_hook_new(&cc, &h[0]), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "every_n_secs"));
    mc.output_dir = NULL;
    ck_assert_int_eq(keel_summary_hook_new(&mc, &h[0]), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "output_dir"));
    mc.output_dir = tu_dir;
    mc.n_names = 0;
    ck_assert_int_eq(keel_summary_hook_new(&mc, &h[0]), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "n_names"));
}
END_TEST

START_TEST(test_profiler_hook_writes_closed_chrome_trace_skipping_first)
{
    keel_profiler_hook_config pc;
    keel_hook h;
    keel_session *s;
    char *json;
    keel_profiler_hook_config_init(&pc);
    ck_assert_int_eq(keel_profiler_hook_new(&pc, &h), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "output_dir"));
    pc.save_steps = 1;
    pc.output_dir = tu_path("prof");
    ck_assert_int_eq(keel_profiler_hook_new(&pc, &h), KEEL_OK);
    s = session_with(&h, 1);
    run_steps(s, 4);
    keel_session_free(s);
    keel_hook_release(&h);
    json = tu_read_file(tu_path("prof/timeline.json"), NULL);
    ck_assert_ptr_nonnull(strstr(json, "traceEvents"));
    ck_assert_int_eq(count(json, "\"step_"), 3);
    ck_assert_ptr_null(strstr(json, "\"step_1\""));
    ck_assert_ptr_nonnull(strstr(json, "]}"));
    free(json);
}
END_TEST

static void *
stop_soon(void *arg)
{
    usleep(20000);
    keel_coord_request_stop(arg, KEEL_OK, "test stop");
    return NULL;
}

START_TEST(test_global_step_waiter_passes_when_reached_and_wakes_on_stop)
{
    keel_global_step_waiter_hook_config wc;
    keel_hook h;
    keel_session *s;
    pthread_t t;
    int64_t t0;
    keel_global_step_waiter_hook_config_init(&wc);
    ck_assert_int_eq(wc.wait_until_step, 0);
    ck_assert_int_eq(wc.poll_ms, 50);
    wc.poll_ms = 0;
    ck_assert_int_eq(keel_global_step_waiter_hook_new(&wc, &h), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "poll_ms"));
    wc.poll_ms = 50;
    wc.wait_until_step = 3;
    ck_assert_int_eq(keel_global_step_waiter_hook_new(&wc, &h), KEEL_OK);
    keel_vars_set_global_step(vs, 5);
    s = session_with(&h, 1);
    run_steps(s, 1);
    keel_session_free(s);
    keel_hook_release(&h);
    wc.wait_until_step = 100;
    wc.poll_ms = 60000;
    ck_assert_int_eq(keel_global_step_waiter_hook_new(&wc, &h), KEEL_OK);
    keel_vars_set_global_step(vs, 0);
    s = session_with(&h, 1);
    ck_assert_int_eq(pthread_create(&t, NULL, stop_soon,
                                    keel_session_coord(s)), 0);
    t0 = tu_now_ms();
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_ECANCELLED);
    ck_assert_int_lt(tu_now_ms() - t0, 30000);   // not the 60 s poll
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "waiting for step 100"));
    /* a stop, not an error: the session ends as one */
    ck_assert_int_eq(keel_session_end_reason(s), KEEL_END_STOP_REQUESTED);
    pthread_join(t, NULL);
    keel_session_free(s);
    keel_hook_release(&h);
}
END_TEST

static keel_status
final_fn(void *ctx, keel_session *s, double *v)
{
    (void)ctx;
    *v = (double)keel_session_global_step(s) * 10;
    return KEEL_OK;
}

START_TEST(test_final_ops_hook_runs_once_at_end)
{
    keel_final_ops_hook_config fc;
    keel_hook h;
    keel_session *s;
    double v = 0;
    keel_final_ops_hook_config_init(&fc);
    ck_assert_int_eq(keel_final_ops_hook_new(&fc, &h), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "fn is NULL"));
    fc.fn = final_fn;
    ck_assert_int_eq(keel_final_ops_hook_new(&fc, &h), KEEL_OK);
    s = session_with(&h, 1);
    run_steps(s, 3);
    ck_assert(!keel_final_ops_hook_value(&h, &v));
    keel_session_free(s);
    ck_assert(keel_final_ops_hook_value(&h, &v));
    ck_assert(v == 30.0);
    keel_hook_release(&h);
}
END_TEST

START_TEST(test_hook_with_bad_struct_size_is_rejected)
{
    keel_hook h = { .struct_size = 0, .name = "old" };
    keel_session_config c;
    keel_session *s = (keel_session *)&c;
    hooks_cfg(&c, step, &h, 1);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "struct_size"));
}
END_TEST

/* ---- backend seams ------------------------------------------------------ */

typedef struct fake_backend {
    int n_publish, last_restored, n_fetch, n_wait, ready_after, n_intact;
    int is_intact;
} fake_backend;

static keel_status
be_publish(void *ctx, keel_vars *v, int restored)
{
    fake_backend *b = ctx;
    (void)v;
    b->n_publish++;
    b->last_restored = restored;
    return KEEL_OK;
}

static keel_status
be_fetch(void *ctx, keel_vars *v, int *is_ready, char *why, size_t n)
{
    fake_backend *b = ctx;
    *is_ready = ++b->n_fetch > b->ready_after;
    if (*is_ready)
        keel_vars_set_all_initialized(v, 1);    // the chief's state arrived
    else
        snprintf(why, n, "chief not ready (generation 0)");
    return KEEL_OK;
}

static keel_status
be_wait(void *ctx, int64_t deadline_ns)
{
    fake_backend *b = ctx;
    (void)deadline_ns;
    b->n_wait++;            // an event arrived at once
    return KEEL_OK;
}

static keel_status
be_intact(void *ctx, keel_vars *v, int *is_intact)
{
    fake_backend *b = ctx;
    (void)v;
    b->n_intact++;
    *is_intact = b->is_intact;
    return KEEL_OK;
}

START_TEST(test_backend_worker_waits_on_events_and_chief_skips_rollback)
{
    fake_backend fb = { .ready_after = 2, .is_intact = 1 };
    keel_backend be = { .struct_size = sizeof be, .name = "fake", .ctx = &fb,
                        .publish = be_publish, .is_intact = be_intact,
                        .fetch = be_fetch, .wait_for_change = be_wait };
    keel_session_config c;
    keel_session *s;
    hooks_cfg(&c, step, NULL, 0);
    c.manager.backend = &be;
    c.is_chief = 0;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(fb.n_fetch, 3);
    ck_assert_int_eq(fb.n_wait, 2);
    ck_assert_int_eq(fb.n_publish, 0);
    keel_session_free(s);

    keel_vars_set_all_initialized(vs, 0);
    c.is_chief = 1;
    c.manager.checkpoint_dir = tu_dir;
    c.backoff_ms = 1;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(fb.n_publish, 1);
    ck_assert_int_eq(fb.last_restored, 0);
    ck_assert_int_eq(keel_session_save_now(s, NULL, 0), KEEL_OK);
    fail_with_abort_once = 1;
    run_steps(s, 1);
    run_steps(s, 1);            // aborted once, recovered, retried
    ck_assert_int_eq(fb.n_intact, 1);
    ck_assert_int_eq(fake.n_restores, 0);      // no rollback
    ck_assert_int_eq(keel_session_global_step(s), 2);
    keel_session_free(s);
}
END_TEST

/* A chief's backend that brings a newer shared global step into the store
 * before each save (a ps that counted other replicas' commits): the
 * checkpoint is at that step, and the log line and after_save say so. */
static keel_status
be_ahead_before_save(void *ctx, keel_vars *v)
{
    (void)ctx;
    keel_vars_set_global_step(v, keel_vars_global_step(v) + 10);
    return KEEL_OK;
}

static int64_t listened_steps[8];
static char listened_paths[8][32];
static int n_listened;

static keel_status
record_after_save(void *ctx, keel_session *s, int64_t step, const char *path,
                  int *should_stop)
{
    (void)ctx;
    (void)s;
    (void)should_stop;
    if (n_listened < 8) {
        listened_steps[n_listened] = step;
        snprintf(listened_paths[n_listened], sizeof listened_paths[0], "%s",
                 path);
        n_listened++;
    }
    return KEEL_OK;
}

START_TEST(test_ckpt_hook_reports_the_step_the_backend_saved_at)
{
    fake_backend fb = { .is_intact = 1 };
    keel_backend be = { .struct_size = sizeof be, .name = "ahead",
                        .ctx = &fb, .publish = be_publish,
                        .is_intact = be_intact,
                        .before_save = be_ahead_before_save };
    keel_ckpt_listener li = { .after_save = record_after_save };
    keel_ckpt_hook_config hc;
    keel_hook h;
    keel_session_config c;
    keel_session *s;
    n_listened = 0;
    keel_ckpt_hook_config_init(&hc);
    hc.save_steps = 1000;
    hc.listeners = &li;
    hc.n_listeners = 1;
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h), KEEL_OK);
    hooks_cfg(&c, step, &h, 1);
    c.manager.backend = &be;
    c.is_chief = 1;
    c.manager.checkpoint_dir = tu_dir;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);  /* saves at 0 */
    run_steps(s, 2);                                      /* 11, 12 */
    keel_session_close(s);                                /* saves at 12 */
    /* 0 + 10 at creation; 12 + 10 at the end */
    ck_assert_int_eq(fake.n_saves, 2);
    ck_assert_int_eq(fake.steps[0], 10);
    ck_assert_int_eq(fake.steps[1], 22);
    ck_assert_int_eq(n_listened, 2);
    ck_assert_int_eq(listened_steps[0], 10);
    ck_assert_str_eq(listened_paths[0], "fake-10");
    ck_assert_int_eq(listened_steps[1], 22);
    ck_assert_str_eq(listened_paths[1], "fake-22");
    ck_assert_msg(strstr(hook_log.text, "saved checkpoint for step 10: "
                         "fake-10 (the shared global step; this replica was "
                         "at step 0)") != NULL, "%s", hook_log.text);
    ck_assert_msg(strstr(hook_log.text, "saved checkpoint for step 22: "
                         "fake-22 (the shared global step; this replica was "
                         "at step 12)") != NULL, "%s", hook_log.text);
    keel_session_free(s);
    keel_hook_release(&h);
}
END_TEST

/* A session that restored step 3 does not claim to save it again: the
 * saver writes nothing for the checkpoint it already has. */
START_TEST(test_ckpt_hook_does_not_claim_the_restored_checkpoint)
{
    keel_ckpt_hook_config hc;
    keel_hook h;
    keel_session *s;
    keel_ckpt_hook_config_init(&hc);
    hc.save_steps = 1000;
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h), KEEL_OK);
    s = session_in(&h, 1, tu_dir);                  /* saves at 0 */
    run_steps(s, 3);
    keel_session_close(s);                          /* saves at 3 */
    keel_session_free(s);
    ck_assert_int_eq(keel_ckpt_hook_save_count(&h), 2);
    keel_hook_release(&h);
    hook_log.text[0] = '\0';
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h), KEEL_OK);
    s = session_in(&h, 1, tu_dir);                  /* restores 3 */
    ck_assert_int_eq(keel_session_global_step(s), 3);
    ck_assert_int_eq(fake.n_saves, 2);
    ck_assert_int_eq(keel_ckpt_hook_save_count(&h), 0);
    ck_assert_msg(strstr(hook_log.text, "checkpoint for step 3 already "
                         "saved: fake-3") != NULL, "%s", hook_log.text);
    ck_assert_msg(strstr(hook_log.text, "saved checkpoint for step 3") ==
                  NULL, "%s", hook_log.text);
    run_steps(s, 1);
    keel_session_close(s);                          /* saves at 4 */
    ck_assert_msg(strstr(hook_log.text, "saved checkpoint for step 4: "
                         "fake-4") != NULL, "%s", hook_log.text);
    ck_assert_int_eq(keel_ckpt_hook_save_count(&h), 1);
    keel_session_free(s);
    keel_hook_release(&h);
}
END_TEST

START_TEST(test_supervisor_worker_times_out_when_chief_never_ready)
{
    keel_supervisor_config cfg;
    keel_supervisor *sv;
    keel_supervisor_config_init(&cfg);
    cfg.session.manager.vars = vs;
    cfg.session.step = step;
    cfg.session.is_chief = 0;
    ck_assert_int_eq(keel_supervisor_new(&cfg, &sv), KEEL_OK);
    ck_assert_int_eq(keel_supervisor_prepare_or_wait(sv, 0.1), KEEL_ETIMEOUT);
    ck_assert(keel_supervisor_should_stop(sv));
    keel_supervisor_free(sv);
}
END_TEST

/* ---- skipping idle hooks ------------------------------------------------ */

static int64_t jump_at = -1, jump_to;     /* an async peer moves the step */
static int64_t abort_at = -1;             /* fail once, recoverably */

static keel_status
scenario_step(void *ctx, keel_step *st)
{
    int64_t gs = keel_step_global_step(st);
    (void)ctx;
    if (gs == abort_at) {
        abort_at = -1;
        return keel_error_set(KEEL_EABORTED, "peer restarted");
    }
    if (gs == jump_at)
        keel_vars_set_global_step(keel_step_vars(st), jump_to);
    return keel_step_set_value(st, "loss", 0.5);
}

/* A user hook first in the chain whose after_run fails recoverably once,
 * when the step reaches abort_after_at: the hooks after it miss the step. */
static int64_t abort_after_at = -1;

static keel_status
abort_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    (void)ctx;
    (void)rc;
    if (keel_run_values_step_after(v) != abort_after_at)
        return KEEL_OK;
    abort_after_at = -1;
    return keel_error_set(KEEL_EABORTED, "peer restarted after the step");
}

/* The six built-in hooks the benchmark uses, with step-based timers, after
 * a user hook, on a run with a global-step jump (7 -> 12), an after_run
 * failure at 13 (the restore moves the step back to 12), a stall (15 set
 * back to 14), a step failure at 17 whose restore moves the step back to
 * 15, and StopAtStep at 20. Writes what the hooks did (saves, event rows
 * without wall time and rate, log counts, end) into out. */
static void
skip_scenario(int is_skipping, const char *sub, char *out, size_t out_size)
{
    const char *names[] = { "loss" };
    keel_step_counter_hook_config cc;
    keel_summary_hook_config mc;
    keel_ckpt_hook_config hc;
    keel_stop_at_step_hook_config sc;
    keel_nan_hook_config nc;
    keel_logging_hook_config lc;
    keel_hook h[7], order[7];
    keel_session_config c;
    keel_session *s;
    char dir[512], *csv, *line, *save;
    size_t n = 0, i;
    int is_stalled = 0;
    keel_step_counter_hook_config_init(&cc);
    cc.every_n_steps = 4;
    cc.output_dir = dir;
    keel_summary_hook_config_init(&mc);
    mc.names = names;
    mc.n_names = 1;
    mc.save_steps = 5;
    mc.output_dir = dir;
    keel_ckpt_hook_config_init(&hc);
    hc.save_steps = 3;
    keel_stop_at_step_hook_config_init(&sc);
    sc.last_step = 20;
    keel_nan_hook_config_init(&nc);
    nc.fail_on_inf = 1;
    keel_logging_hook_config_init(&lc);
    lc.names = names;
    lc.n_names = 1;
    lc.every_n_iter = 6;
    keel__session_set_skipping(is_skipping);
    fake_install();
    hook_log.text[0] = '\0';
    keel_vars_set_global_step(vs, 0);
    snprintf(dir, sizeof dir, "%s", tu_path(sub));
    ck_assert_int_eq(keel__fs_mkdirs(dir), KEEL_OK);
    ck_assert_int_eq(keel_step_counter_hook_new(&cc, &h[0]), KEEL_OK);
    ck_assert_int_eq(keel_summary_hook_new(&mc, &h[1]), KEEL_OK);
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h[2]), KEEL_OK);
    ck_assert_int_eq(keel_stop_at_step_hook_new(&sc, &h[3]), KEEL_OK);
    ck_assert_int_eq(keel_nan_hook_new(&nc, &h[4]), KEEL_OK);
    ck_assert_int_eq(keel_logging_hook_new(&lc, &h[5]), KEEL_OK);
    h[6] = (keel_hook){ .struct_size = sizeof h[6], .name = "abort_after",
                        .after_run = abort_after };
    hooks_cfg(&c, scenario_step, order, 7);
    order[0] = h[6];
    for (i = 0; i < 6; i++)
        order[i + 1] = h[i];
    c.backoff_ms = 1;
    c.manager.checkpoint_dir = tu_dir;  // the fake saver: nothing written
    jump_at = 7;
    jump_to = 12;
    abort_at = -1;
    abort_after_at = 13;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    while (!keel_session_should_stop(s)) {
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
        if (keel_session_global_step(s) == 15 && !is_stalled) {
            keel_vars_set_global_step(vs, 14);
            is_stalled = 1;
            abort_at = 17;
        }
    }
    ck_assert_int_eq(keel_session_global_step(s), 20);
    n += (size_t)snprintf(out + n, out_size - n, "end %s; saves",
                          keel_end_reason_name(keel_session_end_reason(s)));
    keel_session_free(s);
    for (i = 0; i < 6; i++)
        keel_hook_release(&h[i]);
    for (i = 0; i < (size_t)fake.n_saves && n < out_size; i++)
        n += (size_t)snprintf(out + n, out_size - n, " %lld",
                              (long long)fake.steps[i]);
    snprintf(dir, sizeof dir, "%s/scalars.csv", tu_path(sub));
    csv = tu_read_file(dir, NULL);
    ck_assert_ptr_nonnull(csv);
    for (line = strtok_r(csv, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *step = strchr(line, ','), *tag, *end;
        if (step == NULL || (tag = strchr(step + 1, ',')) == NULL
            || (end = strchr(tag + 1, ',')) == NULL || n >= out_size)
            continue;
        *end = '\0';
        n += (size_t)snprintf(out + n, out_size - n, " | %s", step + 1);
    }
    free(csv);
    if (n < out_size)
        snprintf(out + n, out_size - n, " | stalls %d logged %d restores %d",
                 count(hook_log.text, "has not been increased"),
                 count(hook_log.text, "loss = 0.5"), fake.n_restores);
}

START_TEST(test_skipping_idle_hooks_changes_no_save_event_log_or_stop)
{
    char off[4096], on[4096];
    skip_scenario(0, "off", off, sizeof off);
    skip_scenario(1, "on", on, sizeof on);
    ck_assert_str_eq(on, off);
    /* creation, every 3 (12 after the jump, 18 after the restore to 15),
     * at end; only the stall at 14 warned (the counter missed the step of
     * the after_run failure, so the rerun of 12 is no stall for it);
     * logging at iterations 0, 6, 12, 18 (failed steps are none) */
    /* summaries every 5 (13 after the jump), the counter every 4 after
     * its baseline at 1 (12 after the jump) */
    ck_assert_str_eq(on, "end stop requested; saves 0 3 6 12 15 18 20 | "
                     "step,tag | 1,loss | 5,global_step/sec | 6,loss | "
                     "12,global_step/sec | 13,loss | 16,global_step/sec | "
                     "18,loss | 20,global_step/sec | stalls 1 logged 4 "
                     "restores 2");
}
END_TEST

static keel_session *
session_with_ckpt(keel_hook *h, size_t n)
{
    return session_in(h, n, tu_dir);
}

/* h[0] a StepCounterHook every every_n_steps, h[2] a StopAtStepHook at
 * last_step; h[1] is left to the caller. */
static void
step_hooks_around(keel_hook h[3], int64_t every_n_steps, int64_t last_step)
{
    keel_step_counter_hook_config cc;
    keel_stop_at_step_hook_config sc;
    keel_step_counter_hook_config_init(&cc);
    cc.every_n_steps = every_n_steps;
    ck_assert_int_eq(keel_step_counter_hook_new(&cc, &h[0]), KEEL_OK);
    keel_stop_at_step_hook_config_init(&sc);
    sc.last_step = last_step;
    ck_assert_int_eq(keel_stop_at_step_hook_new(&sc, &h[2]), KEEL_OK);
}

START_TEST(test_time_trigger_fires_while_step_hooks_skip)
{
    keel_clock clk = { tu_clock_read, &clock_ns };
    keel_ckpt_hook_config hc;
    keel_hook h[3];
    keel_session *s;
    int64_t deadline;
    clock_ns = 1000000000;
    keel_ckpt_hook_config_init(&hc);
    hc.save_secs = 2;
    hc.clock = clk;
    step_hooks_around(h, 1000, (int64_t)1 << 40);
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h[1]), KEEL_OK);
    s = session_with_ckpt(h, 3);
    run_steps(s, 3);
    clock_ns += 1999999999;
    run_steps(s, 1);
    ck_assert_int_eq(fake.n_saves, 1);              // creation only
    clock_ns += 1;
    run_steps(s, 1);                                // due: saves at 5
    ck_assert_int_eq(fake.n_saves, 2);
    ck_assert_int_eq(fake.steps[1], 5);
    keel_session_free(s);
    keel_hook_release(&h[1]);
    /* The real clock: a 50 ms timer saves within its deadline. */
    fake_install();
    hc.save_secs = 0.05;
    hc.clock.fn = NULL;
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h[1]), KEEL_OK);
    s = session_with_ckpt(h, 3);
    deadline = keel__now_mono_ns() + (int64_t)2000000000;
    while (fake.n_saves < 2 && keel__now_mono_ns() < deadline)
        run_steps(s, 1);
    ck_assert_int_eq(fake.n_saves, 2);
    ck_assert_int_eq(fake.steps[1], keel_session_global_step(s));
    keel_session_free(s);
    for (int i = 0; i < 3; i++)
        keel_hook_release(&h[i]);
}
END_TEST

START_TEST(test_stop_request_lands_at_next_step_boundary_with_idle_hooks)
{
    keel_ckpt_hook_config hc;
    keel_stop_at_step_hook_config sc;
    keel_hook h[2];
    keel_session *s;
    keel_ckpt_hook_config_init(&hc);
    hc.save_steps = 1000;
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h[0]), KEEL_OK);
    keel_stop_at_step_hook_config_init(&sc);
    sc.last_step = 1000;
    ck_assert_int_eq(keel_stop_at_step_hook_new(&sc, &h[1]), KEEL_OK);
    s = session_with_ckpt(h, 2);
    run_steps(s, 3);
    keel_coord_request_stop(keel_session_coord(s), KEEL_OK, NULL);
    ck_assert(keel_session_should_stop(s));
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_ESTATE);
    ck_assert_int_eq(keel_session_global_step(s), 3);
    ck_assert_int_eq(keel_session_end_reason(s), KEEL_END_STOP_REQUESTED);
    keel_session_free(s);
    ck_assert_int_eq(fake.steps[fake.n_saves - 1], 3);  // final save
    /* A signal between steps: the next run refuses, the step stays. */
    fake_install();
    keel_vars_set_global_step(vs, 0);
    ck_assert_int_eq(keel_session_install_signal_handlers(), KEEL_OK);
    s = session_with_ckpt(h, 2);
    run_steps(s, 2);
    raise(SIGTERM);
    ck_assert_int_eq(keel_session_run(s, NULL), KEEL_ECANCELLED);
    ck_assert_int_eq(keel_session_global_step(s), 2);
    ck_assert_int_eq(keel_session_end_reason(s), KEEL_END_SIGNAL);
    keel_session_free(s);
    keel_session_clear_signal();
    keel_session_uninstall_signal_handlers();
    ck_assert_int_eq(fake.steps[fake.n_saves - 1], 2);
    keel_hook_release(&h[0]);
    keel_hook_release(&h[1]);
}
END_TEST

/* Step start times (the previous step's too) and what a listener saw at
 * each save: a real-clock time trigger read against them. */
static int64_t last_cb_ns, prev_cb_ns, first_cb_ns;
static int64_t save_ns[2], save_prev_cb_ns[2], save_last_cb_ns[2];
static int n_timed_saves;

static keel_status
timed_step(void *ctx, keel_step *st)
{
    (void)ctx;
    prev_cb_ns = last_cb_ns;
    last_cb_ns = keel__now_mono_ns();
    if (first_cb_ns == 0)
        first_cb_ns = last_cb_ns;
    return keel_step_set_value(st, "loss", 0.5);
}

static keel_status
timed_before_save(void *ctx, keel_session *s, int64_t step)
{
    (void)ctx;
    (void)s;
    (void)step;
    if (first_cb_ns != 0 && n_timed_saves < 2) {
        save_ns[n_timed_saves] = keel__now_mono_ns();
        save_prev_cb_ns[n_timed_saves] = prev_cb_ns;
        save_last_cb_ns[n_timed_saves] = last_cb_ns;
        n_timed_saves++;
    }
    return KEEL_OK;
}

START_TEST(test_real_clock_trigger_is_neither_late_nor_early_while_idle)
{
    const int64_t period = 300000000;       // 0.3 s; the alarm leads 0.1 s
    keel_ckpt_listener li = { .before_save = timed_before_save };
    keel_ckpt_hook_config hc;
    keel_hook h[3];
    keel_session_config c;
    keel_session *s;
    int64_t t_new, deadline;
    last_cb_ns = prev_cb_ns = first_cb_ns = 0;
    n_timed_saves = 0;
    keel_ckpt_hook_config_init(&hc);
    hc.save_secs = 0.3;
    hc.listeners = &li;
    hc.n_listeners = 1;
    step_hooks_around(h, 1000, (int64_t)1 << 40);
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h[1]), KEEL_OK);
    hooks_cfg(&c, timed_step, h, 3);
    c.manager.checkpoint_dir = tu_dir;
    t_new = keel__now_mono_ns();
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);  // saves, timer
    deadline = keel__now_mono_ns() + (int64_t)5000000000;
    while (n_timed_saves < 2 && keel__now_mono_ns() < deadline)
        run_steps(s, 1);
    ck_assert_int_eq(n_timed_saves, 2);
    /* The timer's base is read between t_new and the first step; the
     * trigger is exact: at the first step whose after_run is past it, so
     * the step before it started before the deadline, and not before. */
    ck_assert_int_ge(save_ns[0], t_new + period);
    ck_assert_int_lt(save_prev_cb_ns[0], first_cb_ns + period);
    /* The second deadline: based between that step's start and save. */
    ck_assert_int_ge(save_ns[1], save_last_cb_ns[0] + period);
    ck_assert_int_lt(save_prev_cb_ns[1], save_ns[0] + period);
    keel_session_free(s);
    for (int i = 0; i < 3; i++)
        keel_hook_release(&h[i]);
}
END_TEST

static keel_status
acc_before(void *ctx, keel_run_context *rc)
{
    (void)ctx;
    return keel_run_context_request(rc, "acc");
}

static keel_status
acc_nan_step(void *ctx, keel_step *st)
{
    (void)ctx;
    if (keel_step_set_value(st, "acc", NAN) != KEEL_OK)
        return KEEL_EINTERNAL;
    return keel_step_set_value(st, "loss", 0.5);
}

START_TEST(test_nan_hook_finds_its_value_again_in_a_new_session)
{
    keel_nan_hook_config nc;
    keel_hook h[2];
    keel_session_config c;
    keel_session *s;
    keel_nan_hook_config_init(&nc);
    ck_assert_str_eq(nc.name, "loss");                  // TF's defaults
    ck_assert_int_eq(nc.fail_on_nan, 1);
    ck_assert_int_eq(nc.fail_on_inf, 0);
    nc.fail_on_inf = 1;
    ck_assert_int_eq(keel_nan_hook_new(&nc, &h[1]), KEEL_OK);
    s = session_with(&h[1], 1);             // "loss" is slot 0 here
    run_steps(s, 2);
    keel_session_free(s);
    /* A new session where "acc" (NaN) takes slot 0 and "loss" slot 1:
     * the slot the hook found before is not its name's any more. */
    h[0] = (keel_hook){ .struct_size = sizeof h[0], .name = "acc",
                        .before_run = acc_before };
    hooks_cfg(&c, acc_nan_step, h, 2);
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    run_steps(s, 2);
    ck_assert(!keel_session_should_stop(s));
    keel_session_free(s);
    keel_hook_release(&h[1]);
}
END_TEST

/* A user hook that wants its after_run every third global step only. */
typedef struct every3 {
    int64_t last;               /* step_after of the last call */
    int64_t called[8], skipped[8];
    int n;
} every3;

static int
every3_wake(const void *ctx, keel_hook_wake *w)
{
    w->after_gs = ((const every3 *)ctx)->last + 3;
    return 1;                   // changes with each call: ask again
}

static keel_status
every3_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    every3 *e = ctx;
    (void)rc;
    e->last = keel_run_values_step_after(v);
    if (e->n < 8) {
        e->called[e->n] = e->last;
        e->skipped[e->n] = keel_run_values_skipped(v);
        e->n++;
    }
    return KEEL_OK;
}

START_TEST(test_user_hook_wake_skips_calls_and_counts_them)
{
    every3 e = { 0 };
    keel_hook h = { .struct_size = sizeof h, .name = "every3", .ctx = &e,
                    .after_run = every3_after, .wake = every3_wake,
                    .flags = KEEL_HOOK_NO_STEP_TIME };
    keel_session *s = session_with(&h, 1);
    run_steps(s, 9);                        // global steps 1..9 after
    keel_session_free(s);
    ck_assert_int_eq(e.n, 3);
    ck_assert_int_eq(e.called[0], 3);
    ck_assert_int_eq(e.called[1], 6);
    ck_assert_int_eq(e.called[2], 9);
    for (int i = 0; i < 3; i++)             // two steps missed before each
        ck_assert_int_eq(e.skipped[i], 2);
    /* The same hook without wake is called at every step. */
    memset(&e, 0, sizeof e);
    h.wake = NULL;
    s = session_with(&h, 1);
    run_steps(s, 4);
    keel_session_free(s);
    ck_assert_int_eq(e.n, 4);
    ck_assert_int_eq(e.skipped[3], 0);
}
END_TEST

/* A config not filled by its init function (struct_size 0), or from newer
 * headers (struct_size larger than this libkeel's), is refused by name. */
START_TEST(test_hook_config_without_its_init_is_refused_by_name)
{
    keel_nan_hook_config nc;
    keel_summary_hook_config mc;
    keel_hook h;
    memset(&nc, 0, sizeof nc);
    nc.name = "loss";
    ck_assert_int_eq(keel_nan_hook_new(&nc, &h), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "keel_nan_hook_config "
                                 "has struct_size 0"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "keel_nan_hook_config_init()"));
    keel_summary_hook_config_init(&mc);
    mc.struct_size += 8;
    ck_assert_int_eq(keel_summary_hook_new(&mc, &h), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "keel_summary_hook_config has struct_size"));
}
END_TEST

START_TEST(test_hooks_are_told_apart_by_kind)
{
    keel_hook ck, user = { .struct_size = sizeof user, .name = "u",
                           .ctx = &user };
    keel_ckpt_hook_config hc;
    keel_ckpt_hook_config_init(&hc);
    hc.save_steps = 5;
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &ck), KEEL_OK);
    ck_assert_int_eq(ck.kind, KEEL_HOOK_CHECKPOINT);
    ck_assert_int_eq(keel_ckpt_hook_save_count(&ck), 0);
    ck_assert_int_eq(keel_ckpt_hook_last_step(&ck), -1);
    user.end = ck.end;          // same callbacks, not a checkpoint hook
    ck_assert_int_eq(user.kind, KEEL_HOOK_USER);
    ck_assert_int_eq(keel_ckpt_hook_save_count(&user), 0);
    ck_assert_int_eq(keel_ckpt_hook_last_step(&user), -1);
    keel_hook_release(&ck);
}
END_TEST

/* The session of a final-save test: h[0] a CheckpointSaverHook on the
 * session's saver (own: a saver of its own in tu_dir instead), h[1] a
 * StopAtStepHook at step 3; the creation's save at step 0 succeeds,
 * every later one fails (fake: ENOSPC). */
static keel_session *
final_save_session(keel_hook h[2], int own)
{
    keel_ckpt_hook_config hc;
    keel_stop_at_step_hook_config sc;
    keel_ckpt_hook_config_init(&hc);
    hc.save_steps = 1000;
    hc.dir = own ? tu_dir : NULL;
    ck_assert_int_eq(keel_ckpt_hook_new(&hc, &h[0]), KEEL_OK);
    keel_stop_at_step_hook_config_init(&sc);
    sc.last_step = 3;
    ck_assert_int_eq(keel_stop_at_step_hook_new(&sc, &h[1]), KEEL_OK);
    fake_install();
    fake.fail_after_saves = 1;
    keel_vars_set_global_step(vs, 0);
    return session_in(h, 2, own ? NULL : tu_dir);
}

/* close's status: the final save's failure, naming the step and cause. */
static void
assert_final_save_failed(keel_session *s, keel_hook h[2],
                         keel_end_reason why, int64_t step)
{
    char want[64];
    ck_assert_int_eq(keel_session_close(s), KEEL_EIO);
    ck_assert_int_eq(keel_session_end_reason(s), why);
    snprintf(want, sizeof want, "final checkpoint at step %lld not saved",
             (long long)step);
    ck_assert_msg(strstr(keel_last_error(), want) != NULL
                  && strstr(keel_last_error(), "No space left") != NULL,
                  "%s", keel_last_error());
    ck_assert_int_eq(keel_session_end_reason(s), why);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);       /* idempotent */
    keel_session_free(s);
    ck_assert_int_eq(fake.n_saves, 1);
    keel_hook_release(&h[0]);
    keel_hook_release(&h[1]);
}

/* Every end path with a final save due reports its failure from close:
 * the last step reached, the end of input, a stop request, a signal, and
 * a plain close; a save the hook's own async saver finishes late too. */
START_TEST(test_ckpt_hook_final_save_failure_reaches_close_on_every_end)
{
    keel_hook h[2];
    keel_session *s;

    s = final_save_session(h, 0);                       /* max steps */
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    assert_final_save_failed(s, h, KEEL_END_STOP_REQUESTED, 3);

    s = final_save_session(h, 0);                       /* end of input */
    input_ends_at = 2;
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    assert_final_save_failed(s, h, KEEL_END_OUT_OF_RANGE, 2);
    input_ends_at = 0;

    s = final_save_session(h, 0);                       /* stop request */
    run_steps(s, 1);
    keel_session_request_stop(s, "test");
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    assert_final_save_failed(s, h, KEEL_END_STOP_REQUESTED, 1);

    s = final_save_session(h, 0);                       /* SIGTERM */
    ck_assert_int_eq(keel_session_install_signal_handlers(), KEEL_OK);
    run_steps(s, 2);
    raise(SIGTERM);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    assert_final_save_failed(s, h, KEEL_END_SIGNAL, 2);
    keel_session_clear_signal();
    keel_session_uninstall_signal_handlers();

    s = final_save_session(h, 1);                       /* own saver */
    run_steps(s, 2);
    assert_final_save_failed(s, h, KEEL_END_CLEAN, 2);

    /* the own saver's pending save fails when the hook waits for it */
    s = final_save_session(h, 1);
    fake.fail_after_saves = 0;
    fake.fail_wait = 1;
    run_steps(s, 1);
    ck_assert_int_eq(keel_session_close(s), KEEL_EIO);
    ck_assert_msg(strstr(keel_last_error(), "fake async save failure")
                  != NULL, "%s", keel_last_error());
    keel_session_free(s);
    keel_hook_release(&h[0]);
    keel_hook_release(&h[1]);
}
END_TEST

static Suite *
hooks_suite(void)
{
    Suite *s = suite_create("hooks");
    tu_tcase(s, "hooks", 20, setup, teardown, TU_TESTS(
        test_logging_hook_logs_first_then_every_n_iter_and_at_end,
        test_step_counter_and_summary_write_event_files,
        test_profiler_hook_writes_closed_chrome_trace_skipping_first,
        test_global_step_waiter_passes_when_reached_and_wakes_on_stop,
        test_final_ops_hook_runs_once_at_end,
        test_hook_with_bad_struct_size_is_rejected,
        test_backend_worker_waits_on_events_and_chief_skips_rollback,
        test_ckpt_hook_reports_the_step_the_backend_saved_at,
        test_ckpt_hook_does_not_claim_the_restored_checkpoint,
        test_ckpt_hook_final_save_failure_reaches_close_on_every_end,
        test_supervisor_worker_times_out_when_chief_never_ready));
    tu_tcase(s, "skip", 20, setup, teardown, TU_TESTS(
        test_skipping_idle_hooks_changes_no_save_event_log_or_stop,
        test_time_trigger_fires_while_step_hooks_skip,
        test_stop_request_lands_at_next_step_boundary_with_idle_hooks,
        test_nan_hook_finds_its_value_again_in_a_new_session,
        test_user_hook_wake_skips_calls_and_counts_them,
        test_hooks_are_told_apart_by_kind,
        test_hook_config_without_its_init_is_refused_by_name,
        test_real_clock_trigger_is_neither_late_nor_early_while_idle));
    return s;
}

KEEL_TEST_MAIN(hooks_suite)
