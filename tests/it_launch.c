/* it_launch.c - the local cluster launcher: keel_launch driving small
 * /bin/sh tasks (TF_CONFIG per task, restarts, give-up, stop order, grace
 * SIGKILL, reproducible chaos), and `keel launch` running real `keel train`
 * chiefs (prefixed lines, per-task logs, SIGKILL -> resume, SIGTERM ->
 * final checkpoint, a failing chief, usage errors). */
#include <config.h>

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <keel/keel.h>
#include <keel/launch.h>
#include "testutil.h"

/* ---- library: /bin/sh tasks -------------------------------------------- */

#define MAX_RECORDS 512
/* The deadline of one `keel launch` run. Chaos runs restart a task every
 * fraction of a second: on a small, busy machine one takes minutes, so
 * this deadline catches hangs, not slowness. */
#define RUN_MS 600000
/* The deadline of each awaited launcher line. */
#define LINE_MS 30000

typedef struct record {
    int is_event;
    int kind;                 /* event kind */
    int task;
    int pid;
    char text[512];
} record;

typedef struct recorder {
    keel_launch *l;
    record r[MAX_RECORDS];
    int n;
    int chaos_outstanding;    /* a chaos victim not restarted yet */
    int chaos_overlap;        /* a kill while another was outstanding */
    int chaos_kills;
} recorder;

static void
rec_line(void *ctx, int task, int stream, const char *line)
{
    recorder *rc = ctx;
    (void)stream;
    if (rc->n < MAX_RECORDS) {
        record *r = &rc->r[rc->n++];
        r->is_event = 0;
        r->task = task;
        snprintf(r->text, sizeof r->text, "%s", line);
    }
}

static void
rec_event(void *ctx, const keel_launch_event *ev)
{
    recorder *rc = ctx;
    if (ev->kind == KEEL_LAUNCH_EV_CHAOS) {
        if (rc->chaos_outstanding)
            rc->chaos_overlap = 1;
        rc->chaos_outstanding = 1;
        rc->chaos_kills++;
    } else if (ev->kind == KEEL_LAUNCH_EV_START && rc->chaos_outstanding &&
               strstr(ev->message, "restarted") != NULL) {
        rc->chaos_outstanding = 0;
    }
    if (rc->n < MAX_RECORDS) {
        record *r = &rc->r[rc->n++];
        r->is_event = 1;
        r->kind = (int)ev->kind;
        r->task = ev->task;
        r->pid = ev->pid;
        snprintf(r->text, sizeof r->text, "%s", ev->message);
    }
}

/* Index of the first record containing needle (of task, -1: any) at or
 * after from, or -1. */
static int
find_rec(const recorder *rc, int from, int task, const char *needle)
{
    for (int i = from; i < rc->n; i++)
        if ((task < 0 || rc->r[i].task == task) &&
            strstr(rc->r[i].text, needle) != NULL)
            return i;
    return -1;
}

static char *sh_argv[4] = { "sh", "-c", NULL, NULL };

static void
lib_config(keel_launch_config *c, recorder *rc, const char *script, int ps,
           int workers)
{
    keel_launch_config_init(c);
    memset(rc, 0, sizeof *rc);
    sh_argv[2] = (char *)script;
    c->exe = "/bin/sh";
    c->argv = sh_argv;
    c->num_ps = ps;
    c->num_workers = workers;
    c->output_dir = tu_path("out");
    c->max_restarts = 3;
    c->backoff_secs = 0.01;
    c->grace_secs = 5;
    c->line_fn = rec_line;
    c->event_fn = rec_event;
    c->ctx = rc;
}

/* keel_launch_new on c, then keel_launch_start; fails the test unless
 * both succeed. */
static keel_launch *
start_launch(keel_launch_config *c)
{
    keel_launch *l;
    ck_assert_int_eq(keel_launch_new(c, &l), KEEL_OK);
    ck_assert_int_eq(keel_launch_start(l), KEEL_OK);
    return l;
}

/* Poll until done or the deadline; returns 1 when done. */
static int
run_until_done(keel_launch *l, int timeout_ms)
{
    int64_t deadline = tu_now_ms() + timeout_ms;
    int done = 0;
    while (!done && tu_now_ms() < deadline)
        ck_assert_int_eq(keel_launch_poll(l, 50, &done), KEEL_OK);
    return done;
}

/* 1 when no process of that pid exists any more (reaped, not a zombie). */
static int
is_gone(int pid)
{
    return kill(pid, 0) != 0 && errno == ESRCH;
}

/* Free l; none of the n tasks described in info may be left behind. */
static void
free_launch_leaving_none(keel_launch *l, const keel_launch_task_info *info,
                         int n)
{
    keel_launch_free(l);
    for (int i = 0; i < n; i++)
        ck_assert_msg(is_gone(info[i].pid), "%s left behind", info[i].name);
}

START_TEST(test_each_task_gets_own_tf_config_and_output_dir)
{
    /* the chief finishes at once; the others wait to be told to stop */
    const char *script =
        "echo \"TF=$TF_CONFIG\"; echo \"OUT=$OUTPUT_DIR\"; echo step 7; "
        "case \"$TF_CONFIG\" in *'\"type\": \"chief\"'*|*'\"type\":\"chief\"'*)"
        " sleep 0.3; exit 0;; esac; exec sleep 30";
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info info[4];
    char want[128];
    lib_config(&c, &rc, script, 1, 2);
    ck_assert_int_eq(keel_launch_new(&c, &l), KEEL_OK);
    rc.l = l;
    ck_assert_uint_eq(keel_launch_num_tasks(l), 4);
    ck_assert_int_eq(keel_launch_start(l), KEEL_OK);
    ck_assert(run_until_done(l, 10000));
    ck_assert_int_eq(keel_launch_exit_code(l, NULL), 0);
    for (int i = 0; i < 4; i++) {
        const char *type;
        ck_assert_int_eq(keel_launch_task(l, (size_t)i, &info[i]), KEEL_OK);
        type = keel_task_type_name(info[i].type);
        /* its TF_CONFIG names its own role and its own address */
        TU_SNPRINTF(want, sizeof want, "\"type\":\"%s\"", type);
        ck_assert_msg(find_rec(&rc, 0, i, want) >= 0, "%s: no %s",
                      info[i].name, want);
        ck_assert_int_ge(find_rec(&rc, 0, i, info[i].address), 0);
        ck_assert_int_ge(find_rec(&rc, 0, i, "OUT="), 0);
        ck_assert_int_ge(find_rec(&rc, 0, i, tu_path("out")), 0);
        ck_assert_int_eq(info[i].global_step, 7);
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(info[i].address, info[j].address);
    }
    ck_assert_str_eq(info[0].name, "ps.0");
    ck_assert_str_eq(info[1].name, "chief");
    ck_assert_str_eq(info[3].name, "worker.1");
    ck_assert_int_eq(info[1].state, KEEL_LAUNCH_DONE);
    ck_assert_int_eq(info[3].state, KEEL_LAUNCH_STOPPED);
    /* the ps is told to stop only after the chief and workers are gone */
    {
        int w0 = find_rec(&rc, 0, 2, "ended"), w1 = find_rec(&rc, 0, 3,
                                                             "ended");
        int p = find_rec(&rc, 0, 0, "ended");
        ck_assert_int_ge(w0, 0);
        ck_assert_int_ge(w1, 0);
        ck_assert_int_gt(p, w0);
        ck_assert_int_gt(p, w1);
    }
    ck_assert_int_ge(tu_file_size(tu_path("out/logs/ps.0.log")), 1);
    ck_assert_int_ge(tu_file_size(tu_path("out/logs/worker.1.log")), 1);
    free_launch_leaving_none(l, info, 4);
}
END_TEST

START_TEST(test_failing_task_restarts_with_backoff_then_gives_up)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info info;
    const char *why = NULL;
    char *log;
    int starts = 0, at = 0;
    lib_config(&c, &rc, "echo step 1; echo oops >&2; exit 3", 0, 0);
    c.max_restarts = 2;
    l = start_launch(&c);
    ck_assert(run_until_done(l, 10000));
    ck_assert_int_eq(keel_launch_exit_code(l, &why), 1);
    ck_assert_ptr_nonnull(strstr(why, "chief failed 3 times"));
    ck_assert_ptr_nonnull(strstr(why, "exit status 3"));
    ck_assert_int_eq(keel_launch_task(l, 0, &info), KEEL_OK);
    ck_assert_int_eq(info.state, KEEL_LAUNCH_FAILED);
    ck_assert_int_eq(info.restarts, 2);
    /* one start and two restarts */
    ck_assert_int_ge(find_rec(&rc, 0, 0, "started chief"), 0);
    while ((at = find_rec(&rc, at, 0, "restarted chief")) >= 0) {
        starts++;
        at++;
    }
    ck_assert_int_eq(starts, 2);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "restart 2 of 2 after exit "
                              "status 3"), 0);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "giving up on chief"), 0);
    keel_launch_free(l);
    /* the log keeps every attempt's output and notes each restart */
    log = tu_read_file(tu_path("out/logs/chief.log"), NULL);
    ck_assert_ptr_nonnull(strstr(log, "oops"));
    ck_assert_ptr_nonnull(strstr(log, "restarted chief"));
    {
        int n = 0;
        for (char *p = log; (p = strstr(p, "ended: exit status 3")) != NULL;
             p++)
            n++;
        ck_assert_int_eq(n, 3);
    }
    free(log);
}
END_TEST

/* The chief tells the ps to stop (the ps then exits 0) and fails before
 * it exits itself: the restarted chief needs the ps again, so the
 * launcher brings it back (without it the new chief would wait for it
 * until cluster.max_wait_secs). Here the chief's second run exits 0 once
 * the ps has started a second time, and 5 if it has not within 10 s. */
START_TEST(test_ps_stopped_by_a_chief_that_then_fails_comes_back_with_it)
{
    const char *script =
        "O=$OUTPUT_DIR; n() { cat \"$O/$1\" 2>/dev/null | wc -l; }; "
        "case \"$TF_CONFIG\" in *'\"type\": \"ps\"'*|*'\"type\":\"ps\"'*) "
        "  echo x >> \"$O/ps.starts\"; "
        "  if [ \"$(n ps.starts)\" = 1 ]; then i=0; "
        "    while [ ! -f \"$O/stop\" ] && [ $i -lt 200 ]; do "
        "      sleep 0.05; i=$((i + 1)); done; exit 0; fi; "
        "  exec sleep 30;; esac; "
        "echo x >> \"$O/chief.starts\"; "
        "if [ \"$(n chief.starts)\" = 1 ]; then touch \"$O/stop\"; exit 1; fi; "
        "i=0; while [ \"$(n ps.starts)\" -lt 2 ] && [ $i -lt 200 ]; do "
        "  sleep 0.05; i=$((i + 1)); done; "
        "[ \"$(n ps.starts)\" -ge 2 ] && exit 0; exit 5";
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info ps;
    const char *why = NULL;
    lib_config(&c, &rc, script, 1, 0);
    c.max_restarts = 1;
    l = start_launch(&c);
    ck_assert(run_until_done(l, 30000));
    ck_assert_msg(keel_launch_exit_code(l, &why) == 0, "%s",
                  why ? why : "");
    ck_assert_int_ge(find_rec(&rc, 0, 0, "restarting ps.0: it stopped when "
                              "the chief told it to, and the chief failed"),
                     0);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "restarted ps.0"), 0);
    ck_assert_int_eq(keel_launch_task(l, 0, &ps), KEEL_OK);
    ck_assert_int_eq(ps.restarts, 0);           /* not a failure */
    ck_assert_int_eq(tu_file_size(tu_path("out/ps.starts")), 4); /* x\nx\n */
    keel_launch_free(l);
}
END_TEST

/* A worker that never comes back: after its restarts the launcher names
 * it, stops every other task and exits 1 (not the chief's 0). */
START_TEST(test_worker_that_never_comes_back_stops_all_with_exit_1)
{
    const char *script =
        "case \"$TF_CONFIG\" in *'\"type\":\"worker\"'*) echo lost >&2; "
        "exit 3;; esac; exec sleep 30";
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info info[3];
    const char *why = NULL;
    lib_config(&c, &rc, script, 1, 1);
    c.max_restarts = 1;
    l = start_launch(&c);
    ck_assert(run_until_done(l, 20000));
    ck_assert_int_eq(keel_launch_exit_code(l, &why), 1);
    ck_assert_msg(strstr(why, "worker.0") != NULL, "%s", why);
    ck_assert_msg(strstr(why, "exit status 3") != NULL, "%s", why);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(keel_launch_task(l, (size_t)i, &info[i]), KEEL_OK);
    ck_assert_str_eq(info[2].name, "worker.0");
    ck_assert_int_eq(info[2].state, KEEL_LAUNCH_FAILED);
    ck_assert_int_eq(info[2].restarts, 1);
    ck_assert_int_ge(find_rec(&rc, 0, 2, "giving up on worker.0"), 0);
    free_launch_leaving_none(l, info, 3);
}
END_TEST

START_TEST(test_backoff_doubles_only_in_a_crash_loop)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    /* no step line: a crash loop, 0.05 -> 0.1 -> 0.2 s */
    lib_config(&c, &rc, "exit 1", 0, 0);
    c.backoff_secs = 0.05;
    l = start_launch(&c);
    ck_assert(run_until_done(l, 10000));
    ck_assert_int_ge(find_rec(&rc, 0, 0, "in 0.05 s (restart 1 of 3"), 0);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "in 0.1 s (restart 2 of 3"), 0);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "in 0.2 s (restart 3 of 3"), 0);
    keel_launch_free(l);
    /* a step line before each failure: healthy, so back at once */
    lib_config(&c, &rc, "echo step 3; exit 1", 0, 0);
    c.backoff_secs = 0.05;
    l = start_launch(&c);
    ck_assert(run_until_done(l, 10000));
    ck_assert_int_ge(find_rec(&rc, 0, 0, "in 0 s (restart 1 of 3"), 0);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "in 0 s (restart 3 of 3"), 0);
    ck_assert_int_lt(find_rec(&rc, 0, 0, "in 0.05 s"), 0);
    ck_assert_int_lt(find_rec(&rc, 0, 0, "in 0.1 s"), 0);
    keel_launch_free(l);
}
END_TEST

/* A task that was running healthily is restarted at once, whatever the
 * backoff (a crash loop's protection must not slow every recovery), and
 * its next failure without progress waits the base delay again: a task
 * that steps once, then crashes before stepping on each restart. */
START_TEST(test_healthy_task_restarts_at_once_then_backs_off)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    char script[512];
    int at;
    snprintf(script, sizeof script, "if mkdir %s 2>/dev/null; then "
             "echo step 3; fi; exit 1", tu_path("stepped"));
    lib_config(&c, &rc, script, 0, 0);
    c.backoff_secs = 3;
    c.max_restarts = 2;
    l = start_launch(&c);
    /* restart 1 at once; restart 2 (no step line since) after 3 s: the
     * test ends the launch once it is announced */
    at = -1;
    for (int64_t deadline = tu_now_ms() + 10000;
         (at = find_rec(&rc, 0, 0, "restart 2 of 2")) < 0 &&
         tu_now_ms() < deadline;)
        ck_assert_int_eq(keel_launch_poll(l, 50, NULL), KEEL_OK);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "restarting chief in 0 s "
                              "(restart 1 of 2"), 0);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "restarted chief"), 0);
    ck_assert_int_ge(at, 0);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "restarting chief in 3 s "
                              "(restart 2 of 2"), 0);
    keel_launch_free(l);
}
END_TEST

START_TEST(test_task_ignoring_sigterm_is_killed_after_grace)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info info;
    int64_t t0;
    lib_config(&c, &rc, "trap '' TERM; echo step 1; "
               "while :; do sleep 0.05; done", 0, 0);
    c.grace_secs = 0.3;
    l = start_launch(&c);
    while (find_rec(&rc, 0, 0, "step 1") < 0)
        ck_assert_int_eq(keel_launch_poll(l, 50, NULL), KEEL_OK);
    t0 = tu_now_ms();
    keel_launch_stop(l, 0);
    ck_assert(run_until_done(l, 5000));
    ck_assert_int_ge(tu_now_ms() - t0, 250);
    ck_assert_int_ge(find_rec(&rc, 0, 0, "SIGKILL"), 0);
    ck_assert_int_eq(keel_launch_task(l, 0, &info), KEEL_OK);
    ck_assert_int_eq(info.last_status, 128 + SIGKILL);
    ck_assert_int_eq(keel_launch_exit_code(l, NULL), 1);
    free_launch_leaving_none(l, &info, 1);
}
END_TEST

/* A stop while the chief is down (killed, waiting out its backoff)
 * restarts it at once, and its SIGTERM waits until it is up (its first
 * step line): this chief needs 0.3 s before it handles SIGTERM, so an
 * early one would kill it. The run ends with the chief's clean exit 0. */
START_TEST(test_stop_while_chief_is_down_restarts_it_for_a_clean_end)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info info;
    int64_t deadline = tu_now_ms() + 10000;
    int at;
    lib_config(&c, &rc, "sleep 0.3; trap 'echo saved; exit 0' TERM; "
               "echo step 5; while :; do sleep 0.05; done", 0, 0);
    c.backoff_secs = 30;           /* down until the stop brings it back */
    l = start_launch(&c);
    /* killed before its first step line, so this is a crash loop's
     * backoff (a chief that had stepped would come back at once) */
    ck_assert_int_eq(keel_launch_task(l, 0, &info), KEEL_OK);
    ck_assert_int_eq(kill(info.pid, SIGKILL), 0);
    do {
        ck_assert_int_eq(keel_launch_poll(l, 50, NULL), KEEL_OK);
        ck_assert_int_eq(keel_launch_task(l, 0, &info), KEEL_OK);
    } while (info.state != KEEL_LAUNCH_BACKOFF && tu_now_ms() < deadline);
    ck_assert_int_eq(info.state, KEEL_LAUNCH_BACKOFF);
    keel_launch_stop(l, 0);
    ck_assert(run_until_done(l, 10000));
    at = find_rec(&rc, 0, 0, "restarted chief");
    ck_assert_int_ge(at, 0);
    ck_assert_int_ge(find_rec(&rc, at, 0, "step 5"), 0);
    ck_assert_int_ge(find_rec(&rc, at, 0, "saved"), 0);
    ck_assert_int_lt(find_rec(&rc, 0, 0, "still running"), 0);
    ck_assert_int_eq(keel_launch_task(l, 0, &info), KEEL_OK);
    ck_assert_int_eq(info.last_status, 0);
    ck_assert_int_eq(keel_launch_exit_code(l, NULL), 0);
    free_launch_leaving_none(l, &info, 1);
}
END_TEST

/* The victims of the first n chaos kills, as names joined by ','. */
static void
chaos_victims(uint64_t seed, int n, char *out, size_t size, int *overlap)
{
    keel_launch_config c;
    static recorder rc;
    keel_launch *l;
    int64_t deadline = tu_now_ms() + 15000;
    size_t used = 0;
    lib_config(&c, &rc, "echo step 1; exec sleep 30", 1, 3);
    c.chaos = 1;
    c.chaos_seed = seed;
    c.chaos_period_secs = 0.02;
    c.max_restarts = 0;            /* chaos kills must not count */
    l = start_launch(&c);
    while (rc.chaos_kills < n && tu_now_ms() < deadline)
        ck_assert_int_eq(keel_launch_poll(l, 50, NULL), KEEL_OK);
    ck_assert_int_eq(rc.chaos_kills, n);
    keel_launch_stop(l, 0);
    ck_assert(run_until_done(l, 10000));
    out[0] = '\0';
    for (int i = 0; i < rc.n; i++) {
        if (!rc.r[i].is_event || rc.r[i].kind != KEEL_LAUNCH_EV_CHAOS)
            continue;
        {
            keel_launch_task_info info;
            ck_assert_int_eq(keel_launch_task(l, (size_t)rc.r[i].task, &info),
                             KEEL_OK);
            used += (size_t)snprintf(out + used, size - used, "%s,",
                                     info.name);
            ck_assert_uint_lt(used, size);
        }
    }
    /* nothing failed for good even with max_restarts 0 */
    ck_assert_int_lt(find_rec(&rc, 0, -1, "giving up"), 0);
    *overlap = rc.chaos_overlap;
    keel_launch_free(l);
}

START_TEST(test_chaos_is_reproducible_bounded_and_not_counted)
{
    char a[512], b[512], c[512];
    int overlap = 0;
    chaos_victims(42, 8, a, sizeof a, &overlap);
    ck_assert_int_eq(overlap, 0);
    chaos_victims(42, 8, b, sizeof b, &overlap);
    ck_assert_int_eq(overlap, 0);
    ck_assert_str_eq(a, b);
    chaos_victims(43, 8, c, sizeof c, &overlap);
    /* another seed, another story (checked for these two seeds) */
    ck_assert_str_ne(a, c);
    /* more than one task type was hit: the draw is over every task */
    ck_assert(strstr(a, "worker.") != NULL || strstr(a, "ps.") != NULL);
}
END_TEST

/* A program that prints no step line on stdout, only log lines on stderr
 * that mention a step (a worker's "pulled ... at step 0"): a victim is
 * back as soon as it runs again, so the kills keep coming at their mean
 * period instead of waiting forever for a step line that never comes. */
START_TEST(test_chaos_without_step_lines_keeps_killing)
{
    keel_launch_config c;
    static recorder rc;
    keel_launch *l;
    int64_t deadline = tu_now_ms() + 15000;
    lib_config(&c, &rc, "echo 'pulled 0.0 MiB at step 0 from 1 ps' >&2; "
               "exec sleep 30", 1, 3);
    c.chaos = 1;
    c.chaos_seed = 42;
    c.chaos_period_secs = 0.02;
    c.max_restarts = 0;
    l = start_launch(&c);
    while (rc.chaos_kills < 8 && tu_now_ms() < deadline)
        ck_assert_int_eq(keel_launch_poll(l, 50, NULL), KEEL_OK);
    ck_assert_int_eq(rc.chaos_kills, 8);
    ck_assert_int_eq(rc.chaos_overlap, 0);
    keel_launch_stop(l, 0);
    ck_assert(run_until_done(l, 10000));
    keel_launch_free(l);
}
END_TEST

/* The evaluator: its own TF_CONFIG outside the cluster, time to finish
 * after the chief, a SIGTERM (then SIGKILL) when it does not, and a
 * failure that changes nothing for the run. */
static const char *
eval_script(const char *evaluator)
{
    static char s[1024];
    snprintf(s, sizeof s,
             "echo \"TF=$TF_CONFIG\"; case \"$TF_CONFIG\" in "
             "*'\"type\":\"evaluator\"'*) %s;; "
             "*'\"type\":\"chief\"'*) sleep 0.6; exit 0;; esac; "
             "exec sleep 30", evaluator);
    return s;
}

START_TEST(test_evaluator_finishes_after_the_chief_in_its_own_time)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info ev, ch;
    lib_config(&c, &rc, eval_script("sleep 1.2; echo eval step 3; exit 0"),
               1, 1);
    c.with_evaluator = 1;
    ck_assert_int_eq(keel_launch_new(&c, &l), KEEL_OK);
    rc.l = l;
    ck_assert_uint_eq(keel_launch_num_tasks(l), 4);
    ck_assert_int_eq(keel_launch_task(l, 3, &ev), KEEL_OK);
    ck_assert_str_eq(ev.name, "evaluator");
    ck_assert_int_eq(ev.type, KEEL_TASK_EVALUATOR);
    ck_assert_int_eq(keel_launch_start(l), KEEL_OK);
    ck_assert(run_until_done(l, 15000));
    ck_assert_int_eq(keel_launch_exit_code(l, NULL), 0);
    ck_assert_int_eq(keel_launch_task(l, 3, &ev), KEEL_OK);
    ck_assert_int_eq(keel_launch_task(l, 1, &ch), KEEL_OK);
    ck_assert_int_eq(ev.state, KEEL_LAUNCH_DONE);      /* not SIGTERMed */
    ck_assert_int_eq(ev.last_status, 0);
    ck_assert_int_eq(ev.global_step, 3);
    ck_assert_int_eq(ch.state, KEEL_LAUNCH_DONE);
    /* evaluator 0, beside a cluster that does not list it */
    ck_assert_int_ge(find_rec(&rc, 0, 3, "\"type\":\"evaluator\""), 0);
    ck_assert_int_ge(find_rec(&rc, 0, 3, "\"index\":0"), 0);
    ck_assert_int_lt(find_rec(&rc, 0, 1, "evaluator"), 0);
    ck_assert_int_lt(find_rec(&rc, 0, -1, "still running"), 0);
    ck_assert_int_gt(find_rec(&rc, 0, 3, "ended"),
                     find_rec(&rc, 0, 1, "ended"));
    keel_launch_free(l);
    ck_assert(is_gone(ev.pid));
}
END_TEST

START_TEST(test_evaluator_still_running_after_the_chief_is_stopped)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info ev;
    int64_t t0;
    lib_config(&c, &rc, eval_script("trap '' TERM; sleep 30 & wait; "
                                    "sleep 30"), 0, 0);
    c.with_evaluator = 1;
    c.grace_secs = 0.5;
    l = start_launch(&c);
    t0 = tu_now_ms();
    ck_assert(run_until_done(l, 28000));
    ck_assert_int_lt(tu_now_ms() - t0, 28000);  // not the evaluator's 30 s
    ck_assert_int_eq(keel_launch_exit_code(l, NULL), 0);
    ck_assert_int_eq(keel_launch_task(l, 1, &ev), KEEL_OK);
    ck_assert_int_eq(ev.state, KEEL_LAUNCH_STOPPED);
    ck_assert_int_eq(ev.last_status, 128 + SIGKILL);
    ck_assert_int_ge(find_rec(&rc, 0, 1, "after the chief finished: "
                                         "SIGTERM"), 0);
    ck_assert_int_ge(find_rec(&rc, 0, 1, "after SIGTERM: SIGKILL"), 0);
    keel_launch_free(l);
    ck_assert(is_gone(ev.pid));
}
END_TEST

START_TEST(test_failing_evaluator_is_given_up_without_stopping_the_run)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info ev, ch;
    const char *why = NULL;
    int g, done = 0;
    int64_t deadline;
    char script[1024], mark[512];
    FILE *f;
    /* the chief runs until the launcher has given the evaluator up (the
     * test then leaves a mark), however slowly the machine forks */
    snprintf(mark, sizeof mark, "%s", tu_path("given-up"));
    snprintf(script, sizeof script,
             "echo \"TF=$TF_CONFIG\"; case \"$TF_CONFIG\" in "
             "*'\"type\":\"evaluator\"'*) echo broken >&2; exit 1;; "
             "*'\"type\":\"chief\"'*) i=0; while [ ! -e '%s' ] && "
             "[ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; exit 0;; "
             "esac; exec sleep 30", mark);
    lib_config(&c, &rc, script, 1, 0);
    c.with_evaluator = 1;
    c.max_restarts = 2;
    l = start_launch(&c);
    deadline = tu_now_ms() + 15000;
    while (!done && find_rec(&rc, 0, 2, "giving up on evaluator") < 0 &&
           tu_now_ms() < deadline)
        ck_assert_int_eq(keel_launch_poll(l, 50, &done), KEEL_OK);
    ck_assert_int_ge(find_rec(&rc, 0, 2, "giving up on evaluator"), 0);
    ck_assert_ptr_nonnull(f = fopen(mark, "w"));
    fclose(f);
    ck_assert(run_until_done(l, 15000));
    ck_assert_int_eq(keel_launch_exit_code(l, &why), 0);
    ck_assert_int_eq(keel_launch_task(l, 2, &ev), KEEL_OK);
    ck_assert_int_eq(keel_launch_task(l, 1, &ch), KEEL_OK);
    ck_assert_int_eq(ev.state, KEEL_LAUNCH_FAILED);
    ck_assert_int_eq(ev.restarts, 2);
    ck_assert_int_eq(ch.state, KEEL_LAUNCH_DONE);     /* ran to its end */
    g = find_rec(&rc, 0, 2, "giving up on evaluator: exit status 1");
    ck_assert_int_ge(g, 0);
    ck_assert_int_ge(find_rec(&rc, g, -1, "the chief finished"), 0);
    ck_assert_int_lt(find_rec(&rc, 0, -1, "a task failed for good"), 0);
    keel_launch_free(l);
}
END_TEST

START_TEST(test_bad_launch_configs_are_rejected)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l = (keel_launch *)1;
    lib_config(&c, &rc, "exit 0", 0, 0);
    c.num_ps = KEEL_LAUNCH_MAX_PS + 1;
    ck_assert_int_eq(keel_launch_new(&c, &l), KEEL_EINVAL);
    ck_assert_ptr_null(l);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "num_ps"));
    c.num_ps = 0;
    c.num_workers = -1;
    ck_assert_int_eq(keel_launch_new(&c, &l), KEEL_EINVAL);
    c.num_workers = 0;
    c.output_dir = "";
    ck_assert_int_eq(keel_launch_new(&c, &l), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "output_dir"));
    keel_launch_free(NULL);
}
END_TEST

/* ---- keel launch: real keel train chiefs ------------------------------- */

/* A chaos run on a loaded machine restarts tasks many times: its output
 * passed 280 KB. */
static char out[4 << 20], err[65536];
static const char *cfg_path;

static void
setup(void)
{
    cfg_path = tu_setup_job(
             "max_steps = 40\nthreads = 1\n"
             "[checkpoint]\ndir = %s/run\nsave_steps = 5\n"
             "[hooks]\nlog_every_steps = 1\nsummary_every_steps = 10\n"
             "progress = off\n", tu_dir);
}

START_TEST(test_launch_chief_prefixes_lines_and_keeps_logs)
{
    char *log;
    char *env[] = { NULL, NULL };
    char outdir[4200];
    char *argv[] = { (char *)tu_build_path("keel"), "launch",
                     (char *)cfg_path, NULL };
    ck_assert_int_eq(TU_KEEL(RUN_MS, "launch", cfg_path), 0);
    ck_assert_ptr_nonnull(strstr(out, "launch | started chief (pid "));
    ck_assert_ptr_nonnull(strstr(out, "chief | step 40 "));
    ck_assert_ptr_nonnull(strstr(out, "chief | trained steps 0..40"));
    ck_assert_ptr_nonnull(strstr(out, "chief | no checkpoint in"));
    ck_assert_ptr_nonnull(strstr(out, "launch | the chief finished"));
    ck_assert_int_ge(tu_file_size(tu_path("run/model.ckpt-40.h5")), 1);
    log = tu_read_file(tu_path("run/logs/chief.log"), NULL);
    ck_assert_ptr_nonnull(strstr(log, "started chief"));
    ck_assert_ptr_nonnull(strstr(log, "\nstep 40 "));
    ck_assert_ptr_null(strstr(log, "chief | "));   /* raw lines in the log */
    free(log);
    /* $OUTPUT_DIR wins over checkpoint.dir, for checkpoints and logs */
    TU_SNPRINTF(outdir, sizeof outdir, "OUTPUT_DIR=%s/elsewhere",
                     tu_dir);
    env[0] = outdir;
    ck_assert_int_eq(tu_run(argv, env, 60000, out, sizeof out, err,
                            sizeof err), 0);
    ck_assert_int_ge(tu_file_size(tu_path("elsewhere/model.ckpt-40.h5")), 1);
    ck_assert_int_ge(tu_file_size(tu_path("elsewhere/logs/chief.log")), 1);
    /* and the evaluation of what the launched chief trained works */
    ck_assert_int_eq(TU_KEEL(RUN_MS, "eval", tu_path("run")), 0);
    ck_assert_ptr_nonnull(strstr(out, "step 40: test loss"));
}
END_TEST

/* The global step of the chief's next "chief | step N" line. */
static long long
chief_step(int fd)
{
    char line[512];
    long long step = -1;
    tu_expect_line(fd, "chief | step ", LINE_MS, line, sizeof line);
    ck_assert_int_eq(sscanf(strstr(line, "chief | step "), "chief | step %lld",
                            &step), 1);
    return step;
}

/* SIGTERM to keel launch: it says it stopped on request and exits 0 within
 * timeout_ms; fd (its stderr) is closed. */
static void
stop_launch(pid_t pid, int fd, int timeout_ms)
{
    char line[512];
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    tu_expect_line(fd, "launch | stopped on request", LINE_MS, line,
                   sizeof line);
    ck_assert_int_eq(tu_wait(pid, timeout_ms), 0);
    close(fd);
}

/* Start `keel launch cfg_path <lead>... <arg>...` (lead NULL-terminated or
 * NULL; the args from arg on, up to a NULL, in ap) as a registered child:
 * its stdout on *fd (tu_spawn_pipe), its stderr in err_log (NULL:
 * /dev/null). */
static pid_t
spawn_launch_va(const char *err_log, int *fd, const char *const *lead,
                const char *arg, va_list ap)
{
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)tu_build_path("keel");
    argv[n++] = "launch";
    argv[n++] = (char *)cfg_path;
    for (; lead != NULL && *lead != NULL; lead++)
        argv[n++] = (char *)*lead;
    for (; arg != NULL; arg = va_arg(ap, const char *)) {
        ck_assert_int_lt(n, 31);
        argv[n++] = (char *)arg;
    }
    argv[n] = NULL;
    return tu_spawn_pipe(argv, NULL, err_log, fd);
}

/* `keel launch cfg_path <arg>...` (NULL-terminated); see spawn_launch_va. */
static pid_t
spawn_launch(const char *err_log, int *fd, const char *arg, ...)
{
    va_list ap;
    pid_t pid;
    va_start(ap, arg);
    pid = spawn_launch_va(err_log, fd, NULL, arg, ap);
    va_end(ap);
    return pid;
}

/* A cluster run with no reachable end: `keel launch cfg_path --ps 1
 * --workers <workers> -s train.max_steps=1000000 <arg>...`
 * (NULL-terminated), its stderr in <tu_dir>/launch.err. */
static pid_t
spawn_cluster(int *fd, int workers, const char *arg, ...)
{
    char n_workers[16];
    const char *lead[] = { "--ps", "1", "--workers", n_workers, "-s",
                           "train.max_steps=1000000", NULL };
    va_list ap;
    pid_t pid;
    TU_SNPRINTF(n_workers, sizeof n_workers, "%d", workers);
    va_start(ap, arg);
    pid = spawn_launch_va(tu_path("launch.err"), fd, lead, arg, ap);
    va_end(ap);
    return pid;
}

START_TEST(test_sigkilled_chief_restarts_resumes_and_sigterm_saves)
{
    char line[512], *log;
    int fd, chief, chief2;
    long long resumed = -1, final = -1, back = -1;
    pid_t pid = spawn_launch(tu_path("launch.err"), &fd, "-s",
                             "train.max_steps=1000000", "--max-restarts", "1",
                             NULL);
    const char *p;
    chief = tu_launch_pid(fd, "started", "chief", LINE_MS);
    tu_expect_line(fd, "chief | saved checkpoint for step 10:", LINE_MS, line,
                   sizeof line);
    /* an outside SIGKILL: a failure, restarted, resumed from a checkpoint */
    ck_assert_int_eq(kill(chief, SIGKILL), 0);
    tu_expect_line(fd, "launch | chief (pid ", LINE_MS, line, sizeof line);
    ck_assert_ptr_nonnull(strstr(line, "killed by SIGKILL"));
    tu_expect_line(fd, "restarting chief", LINE_MS, line, sizeof line);
    ck_assert_ptr_nonnull(strstr(line, "restart 1 of 1"));
    chief2 = tu_launch_pid(fd, "restarted", "chief", LINE_MS);
    ck_assert_int_ne(chief2, chief);
    ck_assert(is_gone(chief));
    tu_expect_line(fd, "launch | chief back at step ", LINE_MS, line,
                   sizeof line);
    ck_assert_int_eq(sscanf(strstr(line, "at step ") + 8, "%lld", &back),
                     1);
    /* SIGTERM to the launcher: forwarded; the chief saves and exits 0 */
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    tu_expect_line(fd, "chief | trained steps ", LINE_MS, line, sizeof line);
    p = strstr(line, "..");
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p, "..%lld", &final), 1);
    ck_assert_int_ge(final, back);
    tu_expect_line(fd, "launch | chief (pid ", LINE_MS, line, sizeof line);
    ck_assert_ptr_nonnull(strstr(line, "exit status 0"));
    ck_assert_int_eq(tu_wait(pid, 30000), 0);
    close(fd);
    ck_assert(is_gone(chief2));
    {
        char name[64];
        TU_SNPRINTF(name, sizeof name, "run/model.ckpt-%lld.h5", final);
        ck_assert_int_ge(tu_file_size(tu_path(name)), 1);
    }
    log = tu_read_file(tu_path("run/logs/chief.log"), NULL);
    ck_assert_ptr_nonnull(strstr(log, "restarted chief"));
    ck_assert_ptr_nonnull(strstr(log, "ended: killed by SIGKILL"));
    /* the restarted chief resumed from a checkpoint at or after step 10 */
    p = strstr(log, "resumed from ");
    ck_assert_ptr_nonnull(p);
    p = strstr(p, " at step ");
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p, " at step %lld", &resumed), 1);
    ck_assert_int_ge(resumed, 10);
    ck_assert_int_lt(resumed, back);
    free(log);
}
END_TEST

START_TEST(test_configuration_error_exit_2_is_not_restarted)
{
    keel_launch_config c;
    recorder rc;
    keel_launch *l;
    keel_launch_task_info info;
    const char *why = NULL;
    lib_config(&c, &rc, "echo 'keel: bad key' >&2; exit 2", 0, 0);
    c.max_restarts = 3;
    l = start_launch(&c);
    ck_assert(run_until_done(l, 10000));
    ck_assert_int_ne(keel_launch_exit_code(l, &why), 0);
    ck_assert_ptr_nonnull(strstr(why, "chief failed 1 time"));
    ck_assert_ptr_nonnull(strstr(why, "configuration error"));
    ck_assert_int_eq(keel_launch_task(l, 0, &info), KEEL_OK);
    ck_assert_int_eq(info.restarts, 0);
    ck_assert_int_lt(find_rec(&rc, 0, 0, "restarted chief"), 0);
    keel_launch_free(l);
}
END_TEST

START_TEST(test_chief_failing_for_good_exits_1_naming_it)
{
    char set[4200];
    char *bad = tu_read_file(tu_path("train-images-idx3-ubyte"), NULL);
    ck_assert_int_eq(mkdir(tu_path("bad"), 0755), 0);
    /* a truncated images file: valid config, fails when training starts */
    tu_write_file(tu_path("bad/train-images-idx3-ubyte"), bad, 5000);
    free(bad);
    bad = tu_read_file(tu_path("train-labels-idx1-ubyte"), NULL);
    tu_write_file(tu_path("bad/train-labels-idx1-ubyte"), bad, 8 + 640);
    free(bad);
    TU_SNPRINTF(set, sizeof set, "data.dir=%s/bad", tu_dir);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "launch", cfg_path, "-s", set,
                             "--max-restarts", "2", "--backoff", "0.01"), 1);
    ck_assert_ptr_nonnull(strstr(out, "chief | keel: train: IDX images"));
    ck_assert_ptr_nonnull(strstr(out, "restart 2 of 2"));
    ck_assert_ptr_nonnull(strstr(err, "keel: launch: chief failed 3 times"));
    ck_assert_ptr_nonnull(strstr(err, "logs/chief.log"));
}
END_TEST

/* A chief whose final checkpoint cannot be written fails the launch: a
 * chief-only cluster resumed at step 5 (no save due before the end) runs
 * under a file size limit below a checkpoint's size (SIGXFSZ ignored), so
 * the chief's final save is refused; keel launch exits 1 saying the chief
 * failed, and the state file still names step 5. */
START_TEST(test_chief_whose_final_checkpoint_fails_fails_the_launch)
{
    struct rlimit old, lim;
    char *state;
    off_t size;
    int rc;

    ck_assert_int_eq(TU_KEEL(RUN_MS, "launch", cfg_path, "--ps", "0",
                             "--workers", "0", "--no-status", "-s",
                             "train.max_steps=5"), 0);
    size = tu_file_size(tu_path("run/model.ckpt-5.h5"));
    ck_assert_int_gt(size, 8192);
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)size / 2;
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    rc = TU_KEEL(RUN_MS, "launch", cfg_path, "--ps", "0", "--workers", "0",
                 "--no-status", "--max-restarts", "0", "-s",
                 "train.max_steps=9");
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_DFL);
    ck_assert_msg(rc == 1, "exit %d: %s\n%s", rc, tu_tail(out, 2000),
                  tu_tail(err, 2000));
    ck_assert_msg(strstr(err, "keel: launch: chief failed") != NULL, "%s",
                  tu_tail(err, 2000));
    ck_assert_msg(strstr(out, "final checkpoint at step 9 not saved")
                  != NULL, "%s", tu_tail(out, 2000));
    ck_assert_int_lt(tu_file_size(tu_path("run/model.ckpt-9.h5")), 0);
    state = tu_read_file(tu_path("run/checkpoint"), NULL);
    ck_assert_msg(strstr(state, "model_checkpoint_path: \"model.ckpt-5.h5\"")
                  != NULL, "%s", state);
    free(state);
}
END_TEST

START_TEST(test_chaos_kills_chief_reproducibly_and_run_finishes)
{
    char gaps[2][1024];
    for (int run = 0; run < 2; run++) {
        char set[4200];
        const char *p = out;
        size_t used = 0;
        int kills = 0;
        TU_SNPRINTF(set, sizeof set, "checkpoint.dir=%s/chaos%d",
                         tu_dir, run);
        ck_assert_int_eq(TU_KEEL(RUN_MS, "launch", cfg_path, "-s", set, "-s",
                                 "train.max_steps=600", "--chaos", "7,0.15",
                                 "--max-restarts", "0"), 0);
        gaps[run][0] = '\0';
        while ((p = strstr(p, "chaos | killed chief (pid ")) != NULL) {
            const char *g = strstr(p, "gap ");
            ck_assert_ptr_nonnull(g);
            if (used + 32 < sizeof gaps[0])     /* the first gaps */
                used += (size_t)snprintf(gaps[run] + used,
                                         sizeof gaps[0] - used, "%.*s;",
                                         (int)strcspn(g, " s"), g + 4);
            kills++;
            p++;
        }
        ck_assert_msg(kills >= 1, "no chaos kill in:\n%s",
                      tu_tail(out, 3000));
        ck_assert_ptr_nonnull(strstr(out, "chief | resumed from"));
        ck_assert_ptr_nonnull(strstr(out, "chief | step 600 "));
        ck_assert_ptr_nonnull(strstr(out, "chaos | seed 7, mean period "
                                          "0.15 s"));
    }
    /* the same seed draws the same gaps (compare the common prefix) */
    {
        size_t n = strlen(gaps[0]) < strlen(gaps[1]) ? strlen(gaps[0])
                                                     : strlen(gaps[1]);
        ck_assert_int_eq(strncmp(gaps[0], gaps[1], n), 0);
    }
}
END_TEST

/* 1 when pid is gone or a zombie (no longer running) within timeout_ms. */
static int
stops_running(int pid, int timeout_ms)
{
    int64_t deadline = tu_now_ms() + timeout_ms;
    do {
        char path[64], buf[512], *p;
        FILE *f;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        f = fopen(path, "r");
        if (f == NULL)
            return 1;
        p = fgets(buf, sizeof buf, f);
        fclose(f);
        if (p == NULL || (p = strrchr(buf, ')')) == NULL || p[2] == 'Z' ||
            p[2] == 'X')
            return 1;
        usleep(10000);      /* no event for another process's death */
    } while (tu_now_ms() < deadline);
    return 0;
}

START_TEST(test_sigkilled_launcher_takes_its_tasks_along)
{
    /* a silent chief (no step, checkpoint or summary lines), so that no
     * SIGPIPE on a dead launcher's pipe can stand in for PDEATHSIG */
    char line[512];
    int fd, chief;
    pid_t pid = spawn_launch(NULL, &fd, "-s", "train.max_steps=100000000",
                             "-s", "hooks.log_every_steps=0", "-s",
                             "hooks.summary_every_steps=0", "-s",
                             "checkpoint.save_steps=0", NULL);
    chief = tu_launch_pid(fd, "started", "chief", LINE_MS);
    tu_expect_line(fd, "chief | no checkpoint in", LINE_MS, line, sizeof line);
    ck_assert(!stops_running(chief, 0));
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(tu_wait(pid, 10000), 128 + SIGKILL);
    /* PR_SET_PDEATHSIG: the chief dies with the launcher */
    ck_assert_msg(stops_running(chief, 5000), "chief %d outlived its "
                  "launcher", chief);
    close(fd);
}
END_TEST

/* ---- keel launch: parameter-server clusters (cluster roles) ------------ */

START_TEST(test_sigterm_stops_a_cluster_with_a_final_checkpoint)
{
    char line[512], name[64];
    int fd;
    long long final = -1;
    const char *p;
    pid_t pid = spawn_cluster(&fd, 2, NULL);
    tu_expect_line(fd, "chief | step 20 ", LINE_MS, line, sizeof line);
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    tu_expect_line(fd, "launch | SIGTERM: stopping every task", LINE_MS, line,
                   sizeof line);
    tu_expect_line(fd, "chief | trained steps ", LINE_MS, line, sizeof line);
    p = strstr(line, "..");
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p, "..%lld", &final), 1);
    ck_assert_int_ge(final, 20);
    tu_expect_line(fd, "launch | chief (pid ", LINE_MS, line, sizeof line);
    ck_assert_ptr_nonnull(strstr(line, "exit status 0"));
    /* the ps goes last, once the chief has saved through it */
    tu_expect_line(fd, "launch | ps.0 (pid ", LINE_MS, line, sizeof line);
    tu_expect_line(fd, "launch | stopped on request", LINE_MS, line,
                   sizeof line);
    ck_assert_int_eq(tu_wait(pid, 30000), 0);
    close(fd);
    TU_SNPRINTF(name, sizeof name, "run/model.ckpt-%lld.h5", final);
    ck_assert_int_ge(tu_file_size(tu_path(name)), 1);
    /* a rerun resumes from that final checkpoint and goes on */
    {
        char set[64], want[128];
        TU_SNPRINTF(set, sizeof set, "train.max_steps=%lld", final + 5);
        ck_assert_int_eq(TU_KEEL(RUN_MS, "launch", cfg_path, "--ps", "1",
                                 "--workers", "2", "-s", set), 0);
        TU_SNPRINTF(want, sizeof want, "chief | resumed from %s at "
                         "step %lld", tu_path(name), final);
        ck_assert_msg(strstr(out, want) != NULL, "no '%s' in:\n%s", want,
                      out);
        TU_SNPRINTF(want, sizeof want, "chief | step %lld ", final + 5);
        ck_assert_msg(strstr(out, want) != NULL, "no '%s' in:\n%s", want,
                      out);
    }
}
END_TEST

START_TEST(test_async_job_scales_with_sigusr1_and_sigusr2_sync_refuses)
{
    char line[512], *log;
    int fd;
    pid_t pid = spawn_cluster(&fd, 1, "-s", "algorithm.name=async", "-s",
                              "cluster.dead_after_ms=1500", NULL);
    /* async: the global step moves by every replica's push */
    tu_expect_line(fd, "chief | step ", LINE_MS, line, sizeof line);
    /* up: workers 1 and 2, indexes the cluster did not start with */
    ck_assert_int_eq(kill(pid, SIGUSR1), 0);
    tu_expect_line(fd, "launch | added worker.1 (pid ", LINE_MS, line,
                   sizeof line);
    tu_expect_line(fd, "worker 1 joined (async: not in the cluster spec",
                   LINE_MS, line, sizeof line);
    ck_assert_int_eq(kill(pid, SIGUSR1), 0);
    tu_expect_line(fd, "launch | added worker.2 (pid ", LINE_MS, line,
                   sizeof line);
    tu_expect_line(fd, "worker 2 joined (async", LINE_MS, line, sizeof line);
    /* down: the last added first; they end cleanly, are not restarted and
     * are forgotten by the ps; the chief goes on */
    ck_assert_int_eq(kill(pid, SIGUSR2), 0);
    tu_expect_line(fd, "launch | removing worker.2 (pid ", LINE_MS, line,
                   sizeof line);
    tu_expect_line(fd, "launch | worker.2 (pid ", LINE_MS, line, sizeof line);
    ck_assert_msg(strstr(line, "exit status 0") != NULL, "%s", line);
    tu_expect_line(fd, "worker 2 left: silent", LINE_MS, line, sizeof line);
    ck_assert_int_eq(kill(pid, SIGUSR2), 0);
    tu_expect_line(fd, "launch | removing worker.1 (pid ", LINE_MS, line,
                   sizeof line);
    ck_assert_int_eq(kill(pid, SIGUSR2), 0);
    tu_expect_line(fd, "launch | SIGUSR2: launch: no added worker is running",
                   LINE_MS, line, sizeof line);
    tu_expect_line(fd, "worker 1 left: silent", LINE_MS, line, sizeof line);
    tu_expect_line(fd, "chief | step ", LINE_MS, line, sizeof line);
    stop_launch(pid, fd, 30000);
    /* worker 1 trained: it got past its first pull */
    log = tu_read_file(tu_path("run/logs/worker.1.log"), NULL);
    ck_assert_msg(strstr(log, "model ready") != NULL, "%s", log);
    ck_assert_ptr_null(strstr(log, "restarted"));
    free(log);

    /* a sync job keeps its replica count */
    pid = spawn_launch(tu_path("launch2.err"), &fd, "--ps", "1", "-s",
                       "train.max_steps=1000000", NULL);
    tu_expect_line(fd, "chief | step ", LINE_MS, line, sizeof line);
    ck_assert_int_eq(kill(pid, SIGUSR1), 0);
    tu_expect_line(fd, "launch | SIGUSR1: launch: not adding a worker: a sync "
                   "job keeps its fixed replica count", LINE_MS, line,
                   sizeof line);
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    ck_assert_int_eq(tu_wait(pid, 30000), 0);
    close(fd);
}
END_TEST

START_TEST(test_ps_and_two_workers_train_and_the_result_evaluates)
{
    char *log;
    ck_assert_int_eq(TU_KEEL(RUN_MS, "launch", cfg_path, "--ps", "1",
                             "--workers", "2"), 0);
    ck_assert_ptr_nonnull(strstr(out, "launch | started ps.0 (pid "));
    ck_assert_ptr_nonnull(strstr(out, "launch | started worker.1 (pid "));
    ck_assert_ptr_nonnull(strstr(out, "ps.0 | "));
    ck_assert_ptr_nonnull(strstr(out, "worker.0 | "));
    ck_assert_ptr_nonnull(strstr(out, "chief | step 40 "));
    /* the chief reports the cluster's examples too: 40 sync steps of the
     * 32-example global batch, whichever replica computed them */
    ck_assert_msg(strstr(out, "; cluster 1280 examples, ") != NULL, "%s",
                  out);
    ck_assert_ptr_nonnull(strstr(out, " examples/s (cluster "));
    ck_assert_ptr_nonnull(strstr(out, "launch | chief (pid "));
    ck_assert_ptr_nonnull(strstr(out, "launch | the chief finished"));
    ck_assert_ptr_null(strstr(out, "restarting"));
    /* the ps is stopped after the chief: its end comes last */
    ck_assert_ptr_nonnull(strstr(out, "launch | ps.0 (pid "));
    ck_assert(strstr(out, "launch | ps.0 (pid ") >
              strstr(out, "launch | chief (pid "));
    for (int i = 0; i < 4; i++) {
        static const char *const names[] = { "ps.0", "chief", "worker.0",
                                             "worker.1" };
        char name[64];
        TU_SNPRINTF(name, sizeof name, "run/logs/%s.log", names[i]);
        ck_assert_int_ge(tu_file_size(tu_path(name)), 1);
    }
    log = tu_read_file(tu_path("run/logs/ps.0.log"), NULL);
    ck_assert_ptr_nonnull(strstr(log, "TF_CONFIG task ps 0"));
    /* the launcher's job token: the ps authenticates its peers */
    ck_assert_ptr_nonnull(strstr(log, "(token)"));
    ck_assert_ptr_null(strstr(log, "no authentication"));
    free(log);
    /* one process, no cluster: the checkpoint the cluster wrote */
    ck_assert_int_eq(TU_KEEL(RUN_MS, "eval", tu_path("run"), "--json"), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"step\": 40"));
    ck_assert_double_gt(tu_json_number(out, "accuracy"), 0.9);
}
END_TEST

/* keel's main job (examples/fashion_mnist.ini, as ./quickstart.sh launches
 * it: a ps, the chief and a worker) with its own settings but for the
 * data, the output directory and a few steps: no task prints a warning
 * (the trainer gives the session no updater of its own where the ps
 * applies the updates). */
START_TEST(test_main_job_defaults_warn_on_no_task)
{
    char data[4200], dir[4200];
    TU_SNPRINTF(data, sizeof data, "data.dir=%s", tu_dir);
    TU_SNPRINTF(dir, sizeof dir, "checkpoint.dir=%s/main", tu_dir);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "launch",
                             tu_src_path("examples/fashion_mnist.ini"),
                             "--ps", "1", "--workers", "1", "-s", data,
                             "-s", dir, "-s", "train.max_steps=3",
                             "-s", "train.model_threads=1"), 0);
    ck_assert_msg(strstr(out, "chief | trained steps 0..3") != NULL, "%s",
                  tu_tail(out, 3000));
    ck_assert_ptr_nonnull(strstr(out, "ps.0 | "));
    ck_assert_ptr_nonnull(strstr(out, "worker.0 | "));
    ck_assert_msg(strstr(out, "warning") == NULL, "%s", tu_tail(out, 3000));
    ck_assert_msg(strstr(err, "warning") == NULL, "%s", err);
}
END_TEST

START_TEST(test_chaos_killing_workers_mid_run_still_finishes)
{
    int kills = 0;
    for (const char *p = out;
         (p = strstr(p, "chaos | killed worker.")) != NULL; p++)
        kills++;
    ck_assert_int_eq(kills, 0);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "launch", cfg_path, "--ps", "1",
                             "--workers", "2", "-s", "train.max_steps=1500",
                             "--chaos", "3,0.3", "--chaos-targets", "worker",
                             "--max-restarts", "0"), 0);
    for (const char *p = out;
         (p = strstr(p, "chaos | killed worker.")) != NULL; p++)
        kills++;
    ck_assert_msg(kills >= 2, "%d chaos kills:\n%s", kills,
                  tu_tail(out, 3000));
    ck_assert_ptr_null(strstr(out, "chaos | killed chief"));
    ck_assert_ptr_null(strstr(out, "chaos | killed ps"));
    ck_assert_ptr_nonnull(strstr(out, "launch | restarted worker."));
    ck_assert_ptr_nonnull(strstr(out, "chief | step 1500 "));
    ck_assert_int_ge(tu_file_size(tu_path("run/model.ckpt-1500.h5")), 1);
}
END_TEST

/* A SIGKILLed ps comes back empty; the heartbeats see its new incarnation
 * (dead_after_ms is set far beyond the test's deadlines, so only that can
 * end the wait), the chief reloads it from the latest checkpoint, logs the
 * steps lost, and training goes on. */
START_TEST(test_sigkilled_ps_is_reloaded_and_the_steps_lost_are_logged)
{
    char line[512];
    int fd, ps;
    long long saved = -1, lost_from = -1, lost_to = -1, after = -1;
    pid_t pid = spawn_cluster(&fd, 1, "-s", "cluster.dead_after_ms=120000",
                              "--max-restarts", "1", NULL);
    const char *p;
    ps = tu_launch_pid(fd, "started", "ps.0", LINE_MS);
    tu_expect_line(fd, "chief | saved checkpoint for step ", LINE_MS, line,
                   sizeof line);
    p = strstr(line, "for step ");
    ck_assert_int_eq(sscanf(p, "for step %lld", &saved), 1);
    tu_expect_line(fd, "chief | step ", LINE_MS, line, sizeof line);
    ck_assert_int_eq(kill(ps, SIGKILL), 0);
    ck_assert_int_ne(tu_launch_pid(fd, "restarted", "ps.0", LINE_MS), ps);
    /* the chief learns of it from the heartbeats (a new generation) or,
     * when its request was queued until the new ps was up, from that ps's
     * answer (no state yet, or, once it holds state, an update computed
     * from the old generation's values); never from a timeout */
    tu_expect_line(fd, "chief | keel: warning: recoverable error ", LINE_MS,
                   line, sizeof line);
    ck_assert_msg(strstr(line, "restarted (generation ") != NULL ||
                  strstr(line, "holds no state yet") != NULL ||
                  strstr(line, "restarted: this update was computed from "
                                "the values of generation ") != NULL,
                  "%s", line);
    tu_expect_line(fd, "the cluster had reached step ", LINE_MS, line,
                   sizeof line);
    p = strstr(line, "reached step ");
    ck_assert_int_eq(sscanf(p, "reached step %lld", &lost_from), 1);
    p = strstr(line, "restarting from step ");
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p, "restarting from step %lld", &lost_to), 1);
    ck_assert_int_ge(lost_to, saved);            /* the latest checkpoint */
    ck_assert_int_ge(lost_from, lost_to);
    ck_assert_ptr_nonnull(strstr(line, " step(s) lost"));
    /* training goes on past the point where the ps was lost */
    while ((after = chief_step(fd)) <= lost_from)
        continue;
    stop_launch(pid, fd, 30000);
}
END_TEST

/* A ps lost while the chief pulls the variables for a checkpoint: the pull
 * ends when the heartbeats see the new incarnation, like a step's push
 * does, not after a fixed timeout (dead_after_ms is far beyond the test's
 * deadlines). The ps is stopped until the chief's stall line shows it
 * waiting in a pull (every step saves), then killed. */
START_TEST(test_ps_lost_during_a_checkpoint_pull_is_found_at_once)
{
    char line[512];
    int fd, ps, in_pull = 0;
    pid_t pid = spawn_cluster(&fd, 1, "-s", "cluster.dead_after_ms=120000",
                              "-s", "cluster.stall_warn_secs=0.2", "-s",
                              "checkpoint.save_steps=1", "--max-restarts", "1",
                              NULL);
    ps = tu_launch_pid(fd, "started", "ps.0", LINE_MS);
    for (int attempt = 0; attempt < 40 && !in_pull; attempt++) {
        tu_expect_line(fd, "chief | step ", LINE_MS, line, sizeof line);
        ck_assert_int_eq(kill(ps, SIGSTOP), 0);
        tu_expect_line(fd, "chief | keel: warning: ", LINE_MS, line,
                       sizeof line);
        ck_assert_msg(strstr(line, " has waited ") != NULL, "%s", line);
        in_pull = strstr(line, "warning: pull has waited ") != NULL;
        if (!in_pull)
            ck_assert_int_eq(kill(ps, SIGCONT), 0);
    }
    ck_assert_msg(in_pull, "the chief was never caught in a pull");
    ck_assert_int_eq(kill(ps, SIGKILL), 0);
    tu_expect_line(fd, "launch | restarted ps.0 (pid ", LINE_MS, line,
                   sizeof line);
    tu_expect_line(fd, "chief | keel: warning: recoverable error ", LINE_MS,
                   line, sizeof line);
    ck_assert_msg(strstr(line, "restarted (generation ") != NULL &&
                  strstr(line, "while pull waited") != NULL, "%s", line);
    tu_expect_line(fd, "chief: 1 parameter server(s) initialized", LINE_MS,
                   line, sizeof line);
    tu_expect_line(fd, "chief | step ", LINE_MS, line, sizeof line);
    stop_launch(pid, fd, 30000);
}
END_TEST

/* Sync without backups: a worker that stops (SIGSTOP: alive to TCP, silent
 * to everyone) holds its step's gradient back; the waiting chief and the
 * ps name it; killed and restarted, it rejoins and training goes on, with
 * every gradient applied exactly once (global_step x 2 = applied). */
START_TEST(test_stalled_worker_is_named_then_killed_and_the_step_resumes)
{
    char line[512], *log;
    int fd, worker;
    long long stalled = -1, after = -1, step = -1;
    long applied = -1, dropped = -1;
    pid_t pid = spawn_cluster(&fd, 1, "-s", "cluster.stall_warn_secs=0.5",
                              "--max-restarts", "1", NULL);
    const char *p;
    worker = tu_launch_pid(fd, "started", "worker.0", LINE_MS);
    tu_expect_line(fd, "chief | step 3 ", LINE_MS, line, sizeof line);
    ck_assert_int_eq(kill(worker, SIGSTOP), 0);
    tu_expect_line(fd, "missing=worker 0 (silent ", LINE_MS, line, sizeof line);
    p = strstr(line, "step ");
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p, "step %lld", &stalled), 1);
    ck_assert_int_eq(kill(worker, SIGKILL), 0);
    tu_expect_line(fd, "launch | restarted worker.0 (pid ", LINE_MS, line,
                   sizeof line);
    while ((after = chief_step(fd)) <= stalled + 2)
        continue;
    stop_launch(pid, fd, 30000);
    log = tu_read_file(tu_path("run/logs/ps.0.log"), NULL);
    ck_assert_ptr_nonnull(log);
    ck_assert_ptr_nonnull(strstr(log, "is stalled: waiting="));
    p = strstr(log, "done at step ");
    ck_assert_msg(p != NULL, "%s", log);
    ck_assert_int_eq(sscanf(p, "done at step %lld: gradients applied %ld, "
                            "dropped %ld", &step, &applied, &dropped), 3);
    ck_assert_int_eq(applied, step * 2);       /* none lost, none twice */
    ck_assert_int_eq(dropped, 0);
    free(log);
}
END_TEST

START_TEST(test_usage_and_config_errors_exit_2_before_starting)
{
    static const char *const bad[][4] = {
        { "--ps", "-1", NULL, NULL },
        { "--ps", "99", NULL, NULL },
        { "--workers", "x", NULL, NULL },
        { "--workers", "65", NULL, NULL },
        { "--chaos", "abc", NULL, NULL },
        { "--chaos", "1,0", NULL, NULL },
        { "--chaos-targets", "boss", NULL, NULL },
        { "--chaos", "1", "--chaos-targets", "ps" },    /* but --ps 0 */
        { "--max-restarts", "-2", NULL, NULL },
        { "-s", "train.max_stpes=3", NULL, NULL },
        { "--frobnicate", NULL, NULL, NULL },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(TU_KEEL(20000, "launch", cfg_path, bad[i][0],
                                 bad[i][1], bad[i][2], bad[i][3]), 2);
        ck_assert_msg(strncmp(err, "keel: ", 6) == 0, "%s", err);
        ck_assert_msg(strstr(err, bad[i][0][0] == '-' && bad[i][0][1] == 's'
                              ? "max_stpes" : bad[i][0]) != NULL,
                      "'%s' not named in: %s", bad[i][0], err);
    }
    ck_assert_int_eq(TU_KEEL(20000, "launch"), 2);
    ck_assert_int_eq(TU_KEEL(20000, "launch", tu_path("missing.ini")), 2);
    /* nothing was started: no log directory */
    ck_assert_int_eq(tu_file_size(tu_path("run/logs")), -1);
    ck_assert_int_eq(TU_KEEL(20000, "launch", "--help"), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: keel launch CONFIG"));
}
END_TEST

/* SyncReplicas counts that do not fit the cluster the launch makes: exit 2
 * at once (before any task starts), naming both numbers. */
START_TEST(test_replica_counts_beyond_the_cluster_exit_2_at_once)
{
    int64_t t0 = tu_now_ms();
    ck_assert_int_eq(TU_KEEL(20000, "launch", cfg_path, "--ps", "1",
                             "--workers", "1", "-s",
                             "cluster.replicas_to_aggregate=3"), 2);
    ck_assert_msg(tu_now_ms() - t0 < 10000, "took %lld ms",
                  (long long)(tu_now_ms() - t0));
    ck_assert_msg(strncmp(err, "keel: ", 6) == 0, "%s", err);
    ck_assert_msg(strstr(err, "replicas_to_aggregate 3 is more than the 2 "
                          "training replicas") != NULL, "%s", err);
    ck_assert_int_eq(TU_KEEL(20000, "launch", cfg_path, "--ps", "1",
                             "--workers", "2", "-s",
                             "cluster.total_num_replicas=2"), 2);
    ck_assert_msg(strstr(err, "total_num_replicas 2 does not match the 3 "
                          "training replicas") != NULL, "%s", err);
    /* nothing was started: no log directory */
    ck_assert_int_eq(tu_file_size(tu_path("run/logs")), -1);
}
END_TEST

/* ---- K-FAC in a cluster (docs/kfac.md) ---------------------------------- */

/* The test loss of checkpoint FILE (keel eval --json). */
static double
eval_loss(const char *file)
{
    ck_assert_int_eq(TU_KEEL(RUN_MS, "eval", file, "--json"), 0);
    return tu_json_number(out, "loss");
}

/* Launch 1 ps + chief + 2 workers with K-FAC in mode (40 steps), check it
 * trained (the test loss fell from the initial checkpoint's by a third),
 * that its K-FAC state is in the checkpoint, then resume the checkpoint
 * directory in one process with no cluster for 20 more steps. */
static void
kfac_cluster_run(const char *mode)
{
    char m[64];
    double l0, l40, l60;
    TU_SNPRINTF(m, sizeof m, "kfac.distributed=%s", mode);
    ck_assert_msg(tu_keel(RUN_MS, out, sizeof out, err, sizeof err, "launch",
                          cfg_path, "--ps", "1", "--workers", "2", "-s",
                          "optimizer.name=kfac", "-s",
                          "optimizer.learning_rate=0.003", "-s", m, "-s",
                          "checkpoint.max_to_keep=100", NULL) == 0,
                  "%s\n%s", out, err);
    ck_assert_ptr_nonnull(strstr(out, "chief | step 40 "));
    ck_assert_ptr_nonnull(strstr(out, "ps 0: done at step 40"));
    ck_assert_ptr_nonnull(strstr(out, "the chief applies the updates"));
    ck_assert_ptr_null(strstr(out, "restarting"));
    l0 = eval_loss(tu_path("run/model.ckpt-0.h5"));
    l40 = eval_loss(tu_path("run/model.ckpt-40.h5"));
    ck_assert_msg(l40 < 0.67 * l0, "test loss %g at step 0, %g at 40", l0,
                  l40);
    /* the factors the cluster kept are in the checkpoint (not zero) */
    ck_assert_int_eq(TU_KEEL(RUN_MS, "ckpt", "diff",
                             tu_path("run/model.ckpt-0.h5"),
                             tu_path("run/model.ckpt-40.h5")), 1);
    ck_assert_ptr_nonnull(strstr(out, "differs     dense_1/kfac_A "));
    ck_assert_ptr_nonnull(strstr(out, "differs     dense_1/kfac_G_inv "));
    ck_assert_ptr_nonnull(strstr(out, "differs     dense_1/kernel [slot "
                                      "velocity]"));
    /* one process, no cluster: resumes and trains on */
    ck_assert_msg(tu_keel(RUN_MS, out, sizeof out, err, sizeof err, "train",
                          cfg_path, "-s", "optimizer.name=kfac", "-s",
                          "optimizer.learning_rate=0.003", "-s", m, "-s",
                          "checkpoint.max_to_keep=100", "-s",
                          "train.max_steps=60", NULL) == 0, "%s\n%s", out,
                  err);
    ck_assert_msg(strstr(out, "resumed from ") != NULL ||
                  strstr(err, "resumed from ") != NULL, "%s\n%s", out, err);
    ck_assert_ptr_nonnull(strstr(out, "trained steps 40..60"));
    l60 = eval_loss(tu_path("run/model.ckpt-60.h5"));
    ck_assert_msg(l60 < l0, "test loss %g at step 0, %g at 60", l0, l60);
}

START_TEST(test_kfac_chief_mode_trains_and_resumes_in_one_process)
{
    kfac_cluster_run("chief");
}
END_TEST

START_TEST(test_kfac_roles_mode_trains_and_resumes_in_one_process)
{
    kfac_cluster_run("roles");
    /* (the launch's output was replaced by the later commands') */
}
END_TEST

/* Role-split K-FAC: each role's task SIGKILLed in turn (inverse,
 * covariance, the chief) is restarted, and training goes on past each
 * kill; the launcher names the roles. */
START_TEST(test_kfac_roles_survive_sigkill_of_each_role)
{
    char line[512];
    int fd, pids[3] = { 0, 0, 0 };
    long long at = -1, after = -1;
    static const char *const tasks[3] = { "worker.1", "worker.0", "chief" };
    pid_t pid = spawn_cluster(&fd, 2, "-s", "optimizer.name=kfac", "-s",
                              "optimizer.learning_rate=0.003", "-s",
                              "kfac.distributed=roles", "--max-restarts", "2",
                              NULL);
    tu_expect_line(fd, "launch | K-FAC roles: worker.0 is covariance.0",
                   LINE_MS, line, sizeof line);
    tu_expect_line(fd, "launch | K-FAC roles: worker.1 is inverse.0", LINE_MS,
                   line, sizeof line);
    for (int k = 2; k >= 0; k--)            /* started in this order */
        pids[k] = tu_launch_pid(fd, "started", tasks[k], LINE_MS);
    tu_expect_line(fd, "inverse.0 | K-FAC roles: this replica (2 of 3) is "
                   "inverse worker 0", LINE_MS, line, sizeof line);
    for (int k = 0; k < 3; k++) {
        at = chief_step(fd);
        ck_assert_int_eq(kill(pids[k], SIGKILL), 0);
        ck_assert_int_ne(tu_launch_pid(fd, "restarted", tasks[k], LINE_MS),
                         pids[k]);
        /* the cluster trains past the kill: the new task does its part */
        while ((after = chief_step(fd)) <= at + 10)
            continue;
    }
    stop_launch(pid, fd, 60000);
}
END_TEST

static Suite *
launch_suite(void)
{
    Suite *s = suite_create("it_launch");
    tu_tcase(s, "library", 60, tu_setup, tu_teardown, TU_TESTS(
        test_each_task_gets_own_tf_config_and_output_dir,
        test_failing_task_restarts_with_backoff_then_gives_up,
        test_ps_stopped_by_a_chief_that_then_fails_comes_back_with_it,
        test_worker_that_never_comes_back_stops_all_with_exit_1,
        test_configuration_error_exit_2_is_not_restarted,
        test_task_ignoring_sigterm_is_killed_after_grace,
        test_stop_while_chief_is_down_restarts_it_for_a_clean_end,
        test_backoff_doubles_only_in_a_crash_loop,
        test_healthy_task_restarts_at_once_then_backs_off,
        test_chaos_is_reproducible_bounded_and_not_counted,
        test_chaos_without_step_lines_keeps_killing,
        test_bad_launch_configs_are_rejected,
        test_evaluator_finishes_after_the_chief_in_its_own_time,
        test_evaluator_still_running_after_the_chief_is_stopped,
        test_failing_evaluator_is_given_up_without_stopping_the_run));
    /* hangs only: see RUN_MS */
    tu_tcase(s, "cli", 1200, setup, tu_teardown, TU_TESTS(
        test_launch_chief_prefixes_lines_and_keeps_logs,
        test_sigkilled_chief_restarts_resumes_and_sigterm_saves,
        test_chief_failing_for_good_exits_1_naming_it,
        test_chief_whose_final_checkpoint_fails_fails_the_launch,
        test_chaos_kills_chief_reproducibly_and_run_finishes,
        test_usage_and_config_errors_exit_2_before_starting,
        test_replica_counts_beyond_the_cluster_exit_2_at_once,
        test_ps_and_two_workers_train_and_the_result_evaluates,
        test_main_job_defaults_warn_on_no_task,
        test_chaos_killing_workers_mid_run_still_finishes,
        test_sigkilled_launcher_takes_its_tasks_along,
        test_sigterm_stops_a_cluster_with_a_final_checkpoint,
        test_async_job_scales_with_sigusr1_and_sigusr2_sync_refuses,
        test_ps_lost_during_a_checkpoint_pull_is_found_at_once,
        test_sigkilled_ps_is_reloaded_and_the_steps_lost_are_logged,
        test_stalled_worker_is_named_then_killed_and_the_step_resumes));
    /* hangs only: see RUN_MS */
    tu_tcase(s, "kfac", 1200, setup, tu_teardown, TU_TESTS(
        test_kfac_chief_mode_trains_and_resumes_in_one_process,
        test_kfac_roles_mode_trains_and_resumes_in_one_process,
        test_kfac_roles_survive_sigkill_of_each_role));
    return s;
}

KEEL_TEST_MAIN(launch_suite)
