/* it_eval.c - the evaluator task and read leases with real processes: a
 * `keel train` evaluator (TF_CONFIG task type evaluator) beside a training
 * run, its timeout and SIGTERM, a reader's lease against the chief's
 * retention (and a dead reader's stale lease), TF_CONFIG model_dir, and
 * `keel launch --evaluator` end to end. */
#include <config.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <keel/keel.h>
#include "testutil.h"

#define EVAL_TF_CONFIG \
    "TF_CONFIG={\"cluster\": {\"chief\": [\"127.0.0.1:1\"]}, " \
    "\"task\": {\"type\": \"evaluator\", \"index\": 0}}"

static char out[262144], err[65536];
static const char *cfg_path;
static char run_dir[4096];

static void
setup(void)
{
    unsetenv("TF_CONFIG");
    cfg_path = tu_setup_job(
             "max_steps = 40\nthreads = 1\n"
             "[checkpoint]\ndir = %s/run\nsave_steps = 5\n"
             "[hooks]\nlog_every_steps = 10\nsummary_every_steps = 10\n"
             "progress = off\n", tu_dir);
    TU_SNPRINTF(run_dir, sizeof run_dir, "%s/run", tu_dir);
}

/* Start an evaluator task on cfg_path; *fd reads its stdout and stderr
 * (keel's log lines), one pipe, in order. */
static pid_t
spawn_evaluator(int *fd)
{
    char *env[] = { EVAL_TF_CONFIG, NULL };
    char *argv[] = { "/bin/sh", "-c", "exec \"$0\" train \"$1\" 2>&1",
                     (char *)tu_build_path("keel"), (char *)cfg_path, NULL };
    return tu_spawn_pipe(argv, env, NULL, fd);
}

/* Read fd to its EOF (the task has exited) and close it, so that
 * tu_wait_for_line's buffer never carries lines over to a later pipe that
 * gets the same descriptor number. */
static void
drain_and_close(int fd)
{
    ck_assert_int_eq(tu_wait_for_line(fd, "\001 never printed", 10000, NULL,
                                      0), 0);
    close(fd);
}

/* The evaluator ev ends: needle arrives on fd within line_ms, then ev exits
 * 0 within exit_ms; fd is drained and closed. */
static void
expect_last_line_and_exit_0(pid_t ev, int fd, const char *needle,
                            int line_ms, int exit_ms)
{
    ck_assert_msg(tu_wait_for_line(fd, needle, line_ms, NULL, 0),
                  "no line '%s' before the evaluator's exit", needle);
    ck_assert_int_eq(tu_wait(ev, exit_ms), 0);
    drain_and_close(fd);
}

START_TEST(test_evaluator_follows_training_and_exits_0_at_final_step)
{
    char line[1024], *csv;
    long prev = -1;
    int fd;
    pid_t ev = spawn_evaluator(&fd);
    ck_assert_msg(tu_wait_for_line(fd, "evaluator: watching", 15000, line,
                                   sizeof line),
                  "the evaluator never started");
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path), 0);
    /* every evaluation is of a newer checkpoint than the one before */
    while (prev < 40) {
        long step;
        ck_assert_msg(tu_wait_for_line(fd, "eval step ", 30000, line,
                                       sizeof line),
                      "no eval line after step %ld", prev);
        step = strtol(strstr(line, "eval step ") + 10, NULL, 10);
        ck_assert_msg(step > prev, "eval step %ld after %ld", step, prev);
        ck_assert_msg(step % 5 == 0, "eval step %ld is not a save step",
                      step);
        ck_assert_ptr_nonnull(strstr(line, ": loss "));
        prev = step;
    }
    ck_assert_int_eq(prev, 40);
    ck_assert_ptr_nonnull(strstr(line, "(model.ckpt-40.h5)"));
    expect_last_line_and_exit_0(ev, fd, "evaluator: done: evaluated the "
                                "final step 40", 10000, 30000);
    /* TensorBoard event files and the CSV under <checkpoint.dir>/eval */
    ck_assert_int_eq(tu_count_names(tu_path("run/eval"),
                                    "events.out.tfevents"), 1);
    csv = tu_read_file(tu_path("run/eval/scalars.csv"), NULL);
    ck_assert_ptr_nonnull(strstr(csv, ",40,eval/accuracy,"));
    ck_assert_ptr_nonnull(strstr(csv, ",40,eval/loss,"));
    free(csv);
    /* it released every lease it took */
    ck_assert_int_eq(tu_count_names(run_dir, ".lease-"), 0);
    /* started after training finished: evaluates the newest and exits */
    ev = spawn_evaluator(&fd);
    expect_last_line_and_exit_0(ev, fd, "eval step 40: ", 30000, 30000);
}
END_TEST

START_TEST(test_evaluator_without_checkpoints_times_out_with_exit_1)
{
    char *env[] = { EVAL_TF_CONFIG, NULL };
    char *argv[] = { (char *)tu_build_path("keel"), "train",
                     (char *)cfg_path, "-s", "cluster.eval_timeout_secs=0.7",
                     NULL };
    int64_t t0 = tu_now_ms();
    ck_assert_int_eq(tu_run(argv, env, 120000, out, sizeof out, err,
                            sizeof err), 1);
    ck_assert_int_lt(tu_now_ms() - t0, 120000);  // not the 7200 s default
    ck_assert_ptr_nonnull(strstr(err, "keel: evaluator: "));
    ck_assert_ptr_nonnull(strstr(err, "no checkpoint appeared in"));
    ck_assert_ptr_nonnull(strstr(err, run_dir));
    ck_assert_ptr_nonnull(strstr(err, "cluster.eval_timeout_secs"));
}
END_TEST

START_TEST(test_evaluator_stops_on_sigterm_with_exit_0)
{
    char line[1024];
    int fd;
    pid_t ev = spawn_evaluator(&fd);
    ck_assert_msg(tu_wait_for_line(fd, "evaluator: watching", 15000, line,
                                   sizeof line),
                  "the evaluator never started");
    ck_assert_int_eq(kill(ev, SIGTERM), 0);
    expect_last_line_and_exit_0(ev, fd, "stopped by signal", 10000, 10000);
}
END_TEST

START_TEST(test_lease_keeps_a_checkpoint_from_the_chiefs_retention)
{
    keel_ckpt_lease *lease = NULL;
    char stale[256];
    /* 10 steps, max_to_keep 2: steps 0, 5, 10 */
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s",
                             "train.max_steps=10", "-s",
                             "checkpoint.max_to_keep=2"), 0);
    ck_assert_int_eq(access(tu_path("run/model.ckpt-0.h5"), F_OK), -1);
    ck_assert_int_eq(keel_ckpt_lease_take(run_dir, "model.ckpt-5.h5",
                                          &lease), KEEL_OK);
    /* a reader that died holding a lease on step 10 blocks nothing */
    TU_SNPRINTF(stale, sizeof stale, "run/.lease-%d.3-model.ckpt-10.h5",
                     (int)tu_dead_pid());
    tu_write_file(tu_path(stale), "", 0);
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s",
                             "train.max_steps=25", "-s",
                             "checkpoint.max_to_keep=2"), 0);
    ck_assert_int_eq(access(tu_path("run/model.ckpt-5.h5"), F_OK), 0);
    ck_assert_int_eq(access(tu_path("run/.deferred-model.ckpt-5.h5"), F_OK),
                     0);
    ck_assert_int_eq(access(tu_path("run/model.ckpt-10.h5"), F_OK), -1);
    ck_assert_int_eq(access(tu_path(stale), F_OK), -1);
    ck_assert_int_eq(access(tu_path("run/model.ckpt-25.h5"), F_OK), 0);
    /* not listed, never the latest, still readable by its reader */
    ck_assert_int_eq(TU_KEEL(60000, "eval", run_dir, "--checkpoint",
                             tu_path("run/model.ckpt-5.h5")), 0);
    ck_assert_ptr_nonnull(strstr(out, "step 5: test loss"));
    ck_assert_int_eq(TU_KEEL(60000, "eval", run_dir), 0);
    ck_assert_ptr_nonnull(strstr(out, "step 25: test loss"));
    /* released: the chief's next save deletes it */
    keel_ckpt_lease_release(lease);
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s",
                             "train.max_steps=30", "-s",
                             "checkpoint.max_to_keep=2"), 0);
    ck_assert_int_eq(access(tu_path("run/model.ckpt-5.h5"), F_OK), -1);
    ck_assert_int_eq(access(tu_path("run/.deferred-model.ckpt-5.h5"), F_OK),
                     -1);
    ck_assert_int_eq(tu_count_names(run_dir, "model.ckpt-"), 2);
}
END_TEST

START_TEST(test_tf_config_model_dir_is_checkpoint_dir_and_conflicts_exit_2)
{
    char text[1024], ini[4200], tf[4400], md[4200];
    char *env[] = { tf, NULL };
    char *argv[] = { (char *)tu_build_path("keel"), "train", ini, NULL };
    char *argv2[] = { (char *)tu_build_path("keel"), "train", (char *)cfg_path,
                      NULL };
    /* a config without checkpoint.dir: model_dir decides */
    TU_SNPRINTF(text, sizeof text,
             "[model]\ntype = softmax\n[data]\ndir = %s\n"
             "[train]\nbatch_size = 32\nmax_steps = 3\nthreads = 1\n"
             "[hooks]\nprogress = off\n", tu_dir);
    TU_SNPRINTF(ini, sizeof ini, "%s", tu_path("md.ini"));
    tu_write_file(ini, text, strlen(text));
    TU_SNPRINTF(md, sizeof md, "%s/from_tf_config", tu_dir);
    TU_SNPRINTF(tf, sizeof tf, "TF_CONFIG={\"model_dir\": \"%s\"}", md);
    ck_assert_msg(tu_run(argv, env, 60000, out, sizeof out, err,
                         sizeof err) == 0, "%s", err);
    ck_assert_int_ge(tu_file_size(tu_path("from_tf_config/model.ckpt-3.h5")),
                     1);
    /* the job's config names another checkpoint.dir: exit 2 at once */
    ck_assert_int_eq(tu_run(argv2, env, 20000, out, sizeof out, err,
                            sizeof err), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: TF_CONFIG model_dir"));
    ck_assert_ptr_nonnull(strstr(err, md));
    ck_assert_ptr_nonnull(strstr(err, run_dir));
    ck_assert_ptr_nonnull(strstr(err, "job.ini"));
    ck_assert_int_eq(access(run_dir, F_OK), -1);
}
END_TEST

START_TEST(test_launch_evaluator_end_to_end)
{
    char *log;
    const char *ev_end, *chief_end;
    ck_assert_int_eq(TU_KEEL(90000, "launch", cfg_path, "--ps", "1",
                             "--workers", "1", "--evaluator"), 0);
    ck_assert_ptr_nonnull(strstr(out, "launch | 1 ps, chief, 1 worker, "
                                      "evaluator;"));
    ck_assert_ptr_nonnull(strstr(out, "launch | started evaluator (pid "));
    ck_assert_ptr_nonnull(strstr(out, "evaluator | eval step 40: loss "));
    ck_assert_ptr_nonnull(strstr(out, "evaluator | evaluator: done"));
    ev_end = strstr(out, "launch | evaluator (pid ");
    chief_end = strstr(out, "launch | chief (pid ");
    ck_assert_ptr_nonnull(ev_end);
    ck_assert_ptr_nonnull(chief_end);
    ck_assert_ptr_nonnull(strstr(ev_end, "ended: exit status 0"));
    ck_assert_ptr_null(strstr(out, "giving up"));
    ck_assert_ptr_nonnull(strstr(out, "the chief finished: run complete"));
    log = tu_read_file(tu_path("run/logs/evaluator.log"), NULL);
    ck_assert_ptr_nonnull(strstr(log, "TF_CONFIG task evaluator 0"));
    ck_assert_ptr_nonnull(strstr(log, "eval step 40:"));
    free(log);
    ck_assert_int_eq(tu_count_names(run_dir, ".lease-"), 0);
}
END_TEST

START_TEST(test_launch_evaluator_failure_keeps_the_chiefs_exit_status)
{
    /* no test set: the evaluator cannot start (a configuration error, not
     * restarted); the chief needs only the training set */
    ck_assert_int_eq(unlink(tu_path("t10k-images-idx3-ubyte")), 0);
    ck_assert_int_eq(TU_KEEL(90000, "launch", cfg_path, "--evaluator"), 0);
    ck_assert_ptr_nonnull(strstr(out, "launch | giving up on evaluator: "
                                      "exit status 2"));
    ck_assert_ptr_nonnull(strstr(out, "the exit status is the chief's"));
    ck_assert_ptr_nonnull(strstr(out, "chief | step 40 "));
    ck_assert_ptr_nonnull(strstr(out, "the chief finished: run complete"));
    ck_assert_ptr_null(strstr(err, "keel: launch:"));
}
END_TEST

static Suite *
eval_suite(void)
{
    Suite *s = suite_create("eval");
    tu_tcase(s, "evaluator", 120, setup, tu_teardown, TU_TESTS(
        test_evaluator_follows_training_and_exits_0_at_final_step,
        test_evaluator_without_checkpoints_times_out_with_exit_1,
        test_evaluator_stops_on_sigterm_with_exit_0,
        test_lease_keeps_a_checkpoint_from_the_chiefs_retention,
        test_tf_config_model_dir_is_checkpoint_dir_and_conflicts_exit_2,
        test_launch_evaluator_end_to_end,
        test_launch_evaluator_failure_keeps_the_chiefs_exit_status));
    return s;
}

KEEL_TEST_MAIN(eval_suite)
