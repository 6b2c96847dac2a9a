/* check_hooks.c - unit tests for the standard hooks not covered by
 * check_session: logging, step counter and summaries (real event files),
 * profiler traces, the global-step waiter, final ops, struct_size checks and
 * the backend seams (publish, fetch + wait_for_change, is_intact). */
#include <config.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keel/keel.h>
#include "util.h"
#include "testutil.h"
#include "fake_ckpt.h"

static keel_vars *vs;
static char logbuf[16384];

static void
capture(void *ctx, keel_log_level level, const char *msg)
{
    size_t n = strlen(logbuf);
    (void)ctx;
    (void)level;
    snprintf(logbuf + n, sizeof logbuf - n, "%s\n", msg);
}

static int
count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static int fail_with_abort_once;

static keel_status
step(void *ctx, keel_step *st)
{
    (void)ctx;
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
    logbuf[0] = '\0';
    fail_with_abort_once = 0;
    keel_log_set_handler(capture, NULL, KEEL_LOG_DEBUG);
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "w", 0, NULL, KEEL_VAR_TRAINABLE,
                                      NULL), KEEL_OK);
}

static void
teardown(void)
{
    keel_log_set_handler(NULL, NULL, KEEL_LOG_DEBUG);
    keel_vars_free(vs);
    fake_uninstall();
    tu_teardown();
}

static keel_session *
session_with(keel_hook *h, size_t n)
{
    keel_session_config c;
    keel_session *s;
    keel_session_config_init(&c);
    c.vars = vs;
    c.step = step;
    c.hooks = h;
    c.n_hooks = n;
    c.backoff_ms = 1;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    return s;
}

static void
run_steps(keel_session *s, int n)
{
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(keel_session_run(s, NULL), KEEL_OK);
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
    keel_logging_hook_config lc = { .names = names, .n_names = 1,
                                    .every_n_iter = 2, .at_end = 1 };
    keel_hook h;
    keel_session *s;
    ck_assert_int_eq(keel_logging_hook_new(&lc, &h), KEEL_OK);
    s = session_with(&h, 1);
    run_steps(s, 5);
    ck_assert_int_eq(count(logbuf, "loss = 0.5"), 3);   // iters 0, 2, 4
    keel_session_free(s);
    ck_assert_int_eq(count(logbuf, "loss = 0.5"), 4);   // + at end
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
    keel_hook h[2];
    keel_session *s;
    char *csv;
    ck_assert_int_eq(keel_step_counter_hook_new(2, 0, tu_dir, &clk, &h[0]),
                     KEEL_OK);
    ck_assert_int_eq(keel_summary_hook_new(names, 1, 2, 0, tu_dir, &clk,
                                           &h[1]), KEEL_OK);
    s = session_with(h, 2);
    run_steps(s, 5);
    keel_session_free(s);
    keel_hook_release(&h[0]);
    keel_hook_release(&h[1]);
    csv = tu_read_file(tu_path("scalars.csv"), NULL);
    /* counter triggers at 1, 3, 5: the first only sets the baseline */
    ck_assert_int_eq(count(csv, ",global_step/sec,"), 2);
    ck_assert_int_eq(count(logbuf, "global_step/sec: "), 2);
    /* summaries at steps 1, 3, 5 */
    ck_assert_int_eq(count(csv, ",loss,"), 3);
    ck_assert_ptr_nonnull(strstr(csv, ",5,loss,"));
    free(csv);
    ck_assert_int_eq(keel_step_counter_hook_new(2, 1.0, NULL, NULL, &h[0]),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_summary_hook_new(names, 1, 2, 0, NULL, NULL, &h[0]),
                     KEEL_EINVAL);
}
END_TEST

START_TEST(test_profiler_hook_writes_closed_chrome_trace_skipping_first)
{
    keel_hook h;
    keel_session *s;
    char *json;
    ck_assert_int_eq(keel_profiler_hook_new(1, 0, tu_path("prof"), NULL, &h),
                     KEEL_OK);
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
    keel_hook h;
    keel_session *s;
    pthread_t t;
    int64_t t0;
    ck_assert_int_eq(keel_global_step_waiter_hook_new(3, 0, &h), KEEL_OK);
    keel_vars_set_global_step(vs, 5);
    s = session_with(&h, 1);
    run_steps(s, 1);
    keel_session_free(s);
    keel_hook_release(&h);
    ck_assert_int_eq(keel_global_step_waiter_hook_new(100, 60000, &h),
                     KEEL_OK);
    keel_vars_set_global_step(vs, 0);
    s = session_with(&h, 1);
    ck_assert_int_eq(pthread_create(&t, NULL, stop_soon,
                                    keel_session_coord(s)), 0);
    t0 = tu_now_ms();
    ck_assert_int_ne(keel_session_run(s, NULL), KEEL_OK);
    ck_assert_int_lt(tu_now_ms() - t0, 5000);    // not the 60 s poll
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "waiting for step 100"));
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
    keel_hook h;
    keel_session *s;
    double v = 0;
    ck_assert_int_eq(keel_final_ops_hook_new(final_fn, NULL, &h), KEEL_OK);
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
    keel_session_config_init(&c);
    c.vars = vs;
    c.step = step;
    c.hooks = &h;
    c.n_hooks = 1;
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
    keel_session_config_init(&c);
    c.vars = vs;
    c.step = step;
    c.backend = &be;
    c.is_chief = 0;
    ck_assert_int_eq(keel_session_new(&c, &s), KEEL_OK);
    ck_assert_int_eq(fb.n_fetch, 3);
    ck_assert_int_eq(fb.n_wait, 2);
    ck_assert_int_eq(fb.n_publish, 0);
    keel_session_free(s);

    keel_vars_set_all_initialized(vs, 0);
    c.is_chief = 1;
    c.checkpoint_dir = tu_dir;
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

START_TEST(test_supervisor_worker_times_out_when_chief_never_ready)
{
    keel_supervisor_config cfg;
    keel_supervisor *sv;
    keel_supervisor_config_init(&cfg);
    cfg.vars = vs;
    cfg.step = step;
    cfg.is_chief = 0;
    ck_assert_int_eq(keel_supervisor_new(&cfg, &sv), KEEL_OK);
    ck_assert_int_eq(keel_supervisor_prepare_or_wait(sv, 0.1), KEEL_ETIMEOUT);
    ck_assert(keel_supervisor_should_stop(sv));
    keel_supervisor_free(sv);
}
END_TEST

static Suite *
hooks_suite(void)
{
    Suite *s = suite_create("hooks");
    TCase *tc = tcase_create("hooks");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc,
        test_logging_hook_logs_first_then_every_n_iter_and_at_end);
    tcase_add_test(tc, test_step_counter_and_summary_write_event_files);
    tcase_add_test(tc,
        test_profiler_hook_writes_closed_chrome_trace_skipping_first);
    tcase_add_test(tc,
        test_global_step_waiter_passes_when_reached_and_wakes_on_stop);
    tcase_add_test(tc, test_final_ops_hook_runs_once_at_end);
    tcase_add_test(tc, test_hook_with_bad_struct_size_is_rejected);
    tcase_add_test(tc,
        test_backend_worker_waits_on_events_and_chief_skips_rollback);
    tcase_add_test(tc, test_supervisor_worker_times_out_when_chief_never_ready);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(hooks_suite)
