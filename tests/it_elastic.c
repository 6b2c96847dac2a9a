/* it_elastic.c - elastic sync (cluster.elastic) with real processes: a
 * job of 4 replicas (workers 0..3, worker 0 the chief; one ps, or two
 * that split the variables) loses two workers for good (SIGKILL; dropped
 * after cluster.dead_after_ms) and goes on with 2; the whole job is
 * restarted from its checkpoint with 2 replicas, and a worker started by
 * hand with a new index joins (3). The final checkpoint is bitwise equal
 * (`keel ckpt diff`) to one process training the same config for the same
 * steps, and the chief's log names each membership change (with two ps,
 * ps 1 names the ones ps 0 decided). keel launch scales such a job with
 * SIGUSR1 and SIGUSR2. */
#include <config.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#define PHASE_A 12           /* steps of the 4 -> 2 run */
#define PHASE_B 24           /* the restarted 2 -> 3 run's last step */
#define KILL_AT 2            /* checkpoint step that triggers the kills */
#define PAUSE_AT 4           /* step between whose phases worker 3 dies */
#define JOIN_AT 14           /* step worker 1 waits at for the join */
#define WAIT_MS 120000       /* deadline of each awaited checkpoint */
#define RUN_MS 180000        /* deadline of a whole run */

static char out[65536], err[65536];
static char cnn[4200];

/* The CNN at a global batch of 192: 12 leaves of 16 examples, which 4, 2
 * and 3 replicas divide; a checkpoint every 2 steps; a silent replica is
 * dropped after 1.5 s. */
static void
setup(void)
{
    char text[2048];
    (void)tu_setup_job("max_steps = 1\n");       /* the data set */
    TU_SNPRINTF(text, sizeof text,
                "[model]\ntype = cnn\n[data]\ndir = %s\n"
                "[optimizer]\nname = adam\nlearning_rate = 0.01\n"
                "[train]\nbatch_size = 192\nseed = 3\nthreads = 1\n"
                "model_threads = 1\n"
                "[checkpoint]\nsave_steps = 2\nmax_to_keep = 0\n"
                "[hooks]\nprogress = off\nsummary_every_steps = 0\n"
                "log_every_steps = 1\n"
                "[cluster]\nelastic = true\ndead_after_ms = 1500\n"
                "heartbeat_ms = 100\nmax_wait_secs = 60\n", tu_dir);
    TU_SNPRINTF(cnn, sizeof cnn, "%s", tu_path("cnn.ini"));
    tu_write_file(cnn, text, strlen(text));
}

/* TF_CONFIG of task (type, index) in a cluster of n_ps ps on
 * ps_port[0..n_ps) and n workers on w_port[0..n). */
static void
tf_config(char *buf, size_t size, const int *ps_port, int n_ps,
          const int *w_port, int n, const char *type, int index)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, size - k, "TF_CONFIG={\"cluster\": "
                          "{\"ps\": [");
    for (int i = 0; i < n_ps; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s\"127.0.0.1:%d\"",
                              i ? ", " : "", ps_port[i]);
    k += (size_t)snprintf(buf + k, size - k, "], \"worker\": [");
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s\"127.0.0.1:%d\"",
                              i ? ", " : "", w_port[i]);
    k += (size_t)snprintf(buf + k, size - k, "]}, \"task\": {\"type\": "
                          "\"%s\", \"index\": %d}}", type, index);
    ck_assert_uint_lt(k, size);
}

/* Start `keel train cnn.ini` as task (type, index) of that cluster,
 * training to max_steps, with pause (NULL: none) in its environment; its
 * output in <tag>-<type><index>.log. */
static pid_t
start_task_env(const char *tag, const int *ps_port, int n_ps,
               const int *w_port, int n, const char *type, int index,
               int max_steps, char *pause)
{
    char tf[1024], log[64], steps[64], dir[4200];
    char *env[] = { tf, pause, NULL };
    const char *sets[] = { steps, dir, NULL };
    tf_config(tf, sizeof tf, ps_port, n_ps, w_port, n, type, index);
    TU_SNPRINTF(log, sizeof log, "%s-%s%d.log", tag, type, index);
    TU_SNPRINTF(steps, sizeof steps, "train.max_steps=%d", max_steps);
    TU_SNPRINTF(dir, sizeof dir, "checkpoint.dir=%s", tu_path("elastic"));
    return tu_spawn_train(cnn, sets, env, tu_path(log), NULL);
}

static pid_t
start_task(const char *tag, const int *ps_port, int n_ps, const int *w_port,
           int n, const char *type, int index, int max_steps)
{
    return start_task_env(tag, ps_port, n_ps, w_port, n, type, index,
                          max_steps, NULL);
}

/* Wait until the file exists (a replica paused there). */
static void
wait_for_file(const char *path)
{
    int64_t deadline = tu_now_ms() + WAIT_MS;
    while (access(path, F_OK) != 0) {
        ck_assert_msg(tu_now_ms() < deadline, "%s not written within %d ms",
                      path, WAIT_MS);
        usleep(20000);
    }
}

/* Wait until the elastic run's checkpoint of step exists. */
static void
wait_for_checkpoint(int step)
{
    char path[4200];
    int64_t deadline = tu_now_ms() + WAIT_MS;
    TU_SNPRINTF(path, sizeof path, "%s/model.ckpt-%d.h5",
                tu_path("elastic"), step);
    while (access(path, F_OK) != 0) {
        ck_assert_msg(tu_now_ms() < deadline, "no checkpoint of step %d "
                      "within %d ms", step, WAIT_MS);
        usleep(20000);
    }
}

/* Wait until the log holds needle. */
static void
wait_for_log(const char *log, const char *needle)
{
    int64_t deadline = tu_now_ms() + WAIT_MS;
    for (;;) {
        char *text = tu_read_file(tu_path(log), NULL);
        int found = text != NULL && strstr(text, needle) != NULL;
        free(text);
        if (found)
            return;
        ck_assert_msg(tu_now_ms() < deadline, "%s lacks '%s' after %d ms",
                      log, needle, WAIT_MS);
        usleep(20000);
    }
}

/* Task pid ends with exit status 0 within RUN_MS. */
static void
expect_clean_exit(pid_t pid, const char *log)
{
    int rc = tu_wait(pid, RUN_MS);
    char *text = tu_read_file(tu_path(log), NULL);
    ck_assert_msg(rc == 0, "%s exited %d:\n%s", log, rc,
                  text != NULL ? tu_tail(text, 3000) : "(no log)");
    free(text);
}

/* The log holds every needle. */
static void
expect_in_log(const char *log, const char *const *needles)
{
    char *text = tu_read_file(tu_path(log), NULL);
    ck_assert_ptr_nonnull(text);
    for (int i = 0; needles[i] != NULL; i++)
        ck_assert_msg(strstr(text, needles[i]) != NULL, "%s lacks '%s':\n%s",
                      log, needles[i], tu_tail(text, 4000));
    free(text);
}

/* 4 -> 2 -> 3 replicas with n_ps ps, then the fixed run and the diff.
 * between_phases (two ps): worker 3 is killed after its push of step
 * PAUSE_AT reached ps 0 (which applies the step; the others commit it on
 * ps 1), worker 2 after its push of step PAUSE_AT + 1 was prepared on ps
 * 1 but before it reached ps 0 (ps 0 drops it, ps 1 adopts the new
 * division); else both are killed at once after checkpoint KILL_AT. */
static void
four_two_three(int n_ps, int between_phases)
{
    int ps_port[2], w_port[4], rc;
    pid_t ps[2], w[4];
    char steps[64], dir[4200], a[4200], b[4200];
    char pause2[4200], pause3[4200], env2[4300], env3[4300];
    const char *fixed_sets[] = { steps, dir, NULL };
    for (int i = 0; i < n_ps; i++)
        ps_port[i] = tu_held_port();
    for (int i = 0; i < 4; i++)
        w_port[i] = tu_held_port();

    /* 4 -> 2: workers 2 and 3 killed for good */
    for (int i = 0; i < n_ps; i++)
        ps[i] = start_task("a", ps_port, n_ps, w_port, 4, "ps", i, PHASE_A);
    TU_SNPRINTF(pause2, sizeof pause2, "%s", tu_path("pause-worker2"));
    TU_SNPRINTF(pause3, sizeof pause3, "%s", tu_path("pause-worker3"));
    TU_SNPRINTF(env2, sizeof env2, "KEEL_TEST_PAUSE_ELASTIC_BEFORE_PS0=%d:%s",
                PAUSE_AT + 1, pause2);
    TU_SNPRINTF(env3, sizeof env3,
                "KEEL_TEST_PAUSE_ELASTIC_BEFORE_COMMIT=%d:%s", PAUSE_AT,
                pause3);
    for (int i = 0; i < 4; i++)
        w[i] = start_task_env("a", ps_port, n_ps, w_port, 4, "worker", i,
                              PHASE_A, !between_phases ? NULL
                              : i == 2 ? env2 : i == 3 ? env3 : NULL);
    if (between_phases) {
        wait_for_file(pause3);
        tu_kill(w[3]);
        wait_for_file(pause2);
        tu_kill(w[2]);
    } else {
        wait_for_checkpoint(KILL_AT);
        tu_kill(w[2]);
        tu_kill(w[3]);
    }
    expect_clean_exit(w[0], "a-worker0.log");
    expect_clean_exit(w[1], "a-worker1.log");
    expect_clean_exit(ps[0], "a-ps0.log");
    if (n_ps > 1) {
        expect_clean_exit(ps[1], "a-ps1.log");
        expect_in_log("a-ps1.log", (const char *const[]){
            "membership: ", "-> 2 replicas (epoch ", "as ps 0 decided",
            NULL });
    }
    expect_in_log("a-worker0.log", (const char *const[]){
        "membership: ", "worker 2 left", "worker 3 left", "-> 2 replicas",
        NULL });

    /* the whole job restarted from its checkpoint with 2 replicas; then
     * worker 2, a new index, started by hand: 2 -> 3 */
    for (int i = 0; i < n_ps; i++)
        ps_port[i] = tu_held_port();
    for (int i = 0; i < 3; i++)
        w_port[i] = tu_held_port();
    for (int i = 0; i < n_ps; i++)
        ps[i] = start_task("b", ps_port, n_ps, w_port, 2, "ps", i, PHASE_B);
    /* worker 1 waits at step JOIN_AT (two ps: before its commit; one:
     * before its push) until ps 0 heard worker 2, so the job cannot end
     * before it joins, however slow its start */
    TU_SNPRINTF(env2, sizeof env2, "KEEL_TEST_PAUSE_ELASTIC_BEFORE_%s=%d:%s",
                n_ps > 1 ? "COMMIT" : "PS0", JOIN_AT, pause2);
    (void)unlink(pause2);
    for (int i = 0; i < 2; i++)
        w[i] = start_task_env("b", ps_port, n_ps, w_port, 2, "worker", i,
                              PHASE_B, i == 1 ? env2 : NULL);
    wait_for_file(pause2);
    w[2] = start_task("b", ps_port, n_ps, w_port, 3, "worker", 2, PHASE_B);
    wait_for_log("b-ps0.log", "ps 0: worker 2 joined");
    ck_assert_int_eq(unlink(pause2), 0);
    expect_clean_exit(w[0], "b-worker0.log");
    expect_clean_exit(w[1], "b-worker1.log");
    expect_clean_exit(w[2], "b-worker2.log");
    for (int i = 0; i < n_ps; i++) {
        char log[32];
        TU_SNPRINTF(log, sizeof log, "b-ps%d.log", i);
        expect_clean_exit(ps[i], log);
    }
    expect_in_log("b-worker0.log", (const char *const[]){
        "membership: 2 -> 3 replicas (worker 2 joined)", NULL });
    expect_in_log("b-worker2.log", (const char *const[]){
        "elastic: replica 2 of 3 live", NULL });
    if (n_ps > 1)
        expect_in_log("b-ps1.log", (const char *const[]){
            "membership: 2 -> 3 replicas (epoch 1 -> 2, as ps 0 decided",
            NULL });

    /* fixed membership: one process, the same config and steps */
    TU_SNPRINTF(steps, sizeof steps, "train.max_steps=%d", PHASE_B);
    TU_SNPRINTF(dir, sizeof dir, "checkpoint.dir=%s", tu_path("fixed"));
    rc = tu_wait(tu_spawn_train(cnn, fixed_sets, NULL, tu_path("fixed.log"),
                                NULL), RUN_MS);
    ck_assert_int_eq(rc, 0);
    TU_SNPRINTF(a, sizeof a, "%s/model.ckpt-%d.h5", tu_path("elastic"),
                PHASE_B);
    TU_SNPRINTF(b, sizeof b, "%s/model.ckpt-%d.h5", tu_path("fixed"),
                PHASE_B);
    rc = TU_KEEL(RUN_MS, "ckpt", "diff", a, b);
    ck_assert_msg(rc == 0, "elastic and fixed runs differ (exit %d):\n%s%s",
                  rc, out, err);
}

START_TEST(test_four_two_three_replicas_end_as_a_fixed_run)
{
    four_two_three(1, 0);
}
END_TEST

/* Two ps: ps 0 decides each step's membership, ps 1 aggregates its
 * variables by the word every push carries; the bits are the same. */
START_TEST(test_two_ps_four_two_three_replicas_end_as_a_fixed_run)
{
    four_two_three(2, 0);
}
END_TEST

/* Two ps, workers killed between the phases of their step (after ps 0
 * applied it; after ps 1 prepared it, before ps 0 had it): every ps
 * applies each step once, with one division; the bits are the same. */
START_TEST(test_two_ps_workers_killed_between_phases_end_as_a_fixed_run)
{
    four_two_three(2, 1);
}
END_TEST

/* keel launch scales an elastic sync job: SIGUSR1 adds worker 1 (2 -> 3
 * replicas), SIGUSR2 removes it again (3 -> 2), and the job trains on. */
START_TEST(test_keel_launch_scales_an_elastic_sync_job)
{
    char line[2048], dir[4200];
    int fd;
    pid_t pid;
    char *argv[] = { (char *)tu_build_path("keel"), "launch", cnn, "--ps",
                     "1", "--workers", "1", "-s", "train.max_steps=1000000",
                     "-s", dir, NULL };
    TU_SNPRINTF(dir, sizeof dir, "checkpoint.dir=%s", tu_path("launched"));
    pid = tu_spawn_pipe(argv, NULL, tu_path("launch.err"), &fd);
    tu_expect_line(fd, "chief | step ", WAIT_MS, line, sizeof line);
    ck_assert_int_eq(kill(pid, SIGUSR1), 0);
    tu_expect_line(fd, "launch | added worker.1 (pid ", WAIT_MS, line,
                   sizeof line);
    tu_expect_line(fd, "chief | membership: 2 -> 3 replicas (worker 1 "
                   "joined)", WAIT_MS, line, sizeof line);
    tu_expect_line(fd, "worker.1 | elastic: replica 2 of 3 live", WAIT_MS,
                   line, sizeof line);
    ck_assert_int_eq(kill(pid, SIGUSR2), 0);
    tu_expect_line(fd, "launch | removing worker.1 (pid ", WAIT_MS, line,
                   sizeof line);
    tu_expect_line(fd, "chief | membership: 3 -> 2 replicas (worker 1 left)",
                   WAIT_MS, line, sizeof line);
    tu_expect_line(fd, "chief | step ", WAIT_MS, line, sizeof line);
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    ck_assert_int_eq(tu_wait(pid, RUN_MS), 0);
    close(fd);
}
END_TEST

static Suite *
elastic_suite(void)
{
    Suite *s = suite_create("it_elastic");
    tu_tcase(s, "elastic", 600, setup, tu_teardown, TU_TESTS(
        test_four_two_three_replicas_end_as_a_fixed_run,
        test_two_ps_four_two_three_replicas_end_as_a_fixed_run,
        test_two_ps_workers_killed_between_phases_end_as_a_fixed_run,
        test_keel_launch_scales_an_elastic_sync_job));
    return s;
}

KEEL_TEST_MAIN(elastic_suite)
