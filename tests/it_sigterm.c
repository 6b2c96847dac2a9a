/* it_sigterm.c - preemption safety end to end: SIGTERM to a training child
 * (tests/session_child: MonitoredTrainingSession, real HDF5 checkpoints)
 * in mid-run leaves a checkpoint at the step it stopped on and exit status
 * 0; a rerun resumes from that step and data position. The test learns the
 * child is mid-run from a line on its stdout pipe, never from a sleep. */
#include <config.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <keel/keel.h>
#include "testutil.h"

static pid_t child = -1;
static int out_fd = -1;
static char buf[8192];
static size_t buf_len;

/* Start session_child (a registered child: tu_teardown kills it) with its
 * stdout on out_fd and its stderr to /dev/null. */
static void
start_child(const char *dir, const char *last_step, const char *min_steps)
{
    char *argv[] = { (char *)tu_build_path("tests/session_child"),
                     (char *)dir, (char *)last_step, (char *)min_steps,
                     NULL };
    child = tu_spawn_pipe(argv, NULL, NULL, &out_fd);
    buf_len = 0;
    buf[0] = '\0';
}

/* Read the child's stdout until it contains want or deadline_ms passes. */
static int
wait_for_output(const char *want, int deadline_ms)
{
    int64_t deadline = tu_now_ms() + deadline_ms;
    while (strstr(buf, want) == NULL) {
        struct pollfd pfd = { out_fd, POLLIN, 0 };
        int64_t left = deadline - tu_now_ms();
        ssize_t n;
        if (left <= 0)
            return 0;
        if (poll(&pfd, 1, (int)left) <= 0)
            continue;
        n = read(out_fd, buf + buf_len, sizeof buf - 1 - buf_len);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;                   /* out_fd is non-blocking */
        if (n <= 0)
            return strstr(buf, want) != NULL;
        buf_len += (size_t)n;
        buf[buf_len] = '\0';
    }
    return 1;
}

static int
finish_child(void)
{
    int rc;
    wait_for_output("final_step", 20000);
    rc = tu_wait(child, 20000);
    close(out_fd);
    out_fd = -1;
    if (rc >= 0)
        child = -1;
    return rc;
}

static long long
field(const char *key)
{
    const char *p = strstr(buf, key);
    ck_assert_msg(p != NULL, "no '%s' in child output: %s", key, buf);
    return strtoll(p + strlen(key), NULL, 10);
}

static void
teardown(void)
{
    if (out_fd >= 0)
        close(out_fd);
    out_fd = -1;
    child = -1;
    tu_teardown();                      /* kills the child if it runs */
}

static void
interrupt_and_resume(int sig)
{
    char path[4096], last[32];
    int64_t step = -1;
    long long stopped, resumed;
    start_child(tu_dir, "1000000000", "200");
    ck_assert_msg(wait_for_output("running", 20000), "child never ran: %s",
                  buf);
    ck_assert_int_eq(kill(child, sig), 0);
    ck_assert_int_eq(finish_child(), 0);
    ck_assert_ptr_nonnull(strstr(buf, "reason signal"));
    stopped = field("final_step ");
    ck_assert_int_ge(stopped, 200);
    ck_assert_int_lt(stopped, 1000000000LL);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, path, sizeof path,
                                      &step), KEEL_OK);
    ck_assert_int_eq(step, stopped);        // the current step, not older

    snprintf(last, sizeof last, "%lld", stopped + 5);
    start_child(tu_dir, last, "1");
    ck_assert_int_eq(finish_child(), 0);
    resumed = field("start_step ");
    ck_assert_int_eq(resumed, stopped);
    ck_assert_int_eq(field("position "), stopped);  // data iterator blob
    ck_assert_int_eq(field("final_step "), stopped + 5);
}

START_TEST(test_sigterm_mid_run_checkpoints_current_step_exits_0_and_resumes)
{
    interrupt_and_resume(SIGTERM);
}
END_TEST

START_TEST(test_sigint_behaves_like_sigterm)
{
    interrupt_and_resume(SIGINT);
}
END_TEST

/* A SIGTERM whose final checkpoint cannot be written is no clean stop:
 * the child, resumed (no save due at its start) under a file size limit
 * below a checkpoint's size, exits 1 and the newest checkpoint stays the
 * one it resumed from. */
START_TEST(test_sigterm_whose_final_checkpoint_fails_exits_nonzero)
{
    char path[4096];
    struct rlimit old, lim;
    int64_t step = -1;
    off_t size;

    start_child(tu_dir, "5", "1");
    ck_assert_int_eq(finish_child(), 0);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, path, sizeof path,
                                      &step), KEEL_OK);
    ck_assert_int_eq(step, 5);
    size = tu_file_size(path);
    ck_assert_int_gt(size, 1024);
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)size / 2;
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    start_child(tu_dir, "1000000000", "200");
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_DFL);
    ck_assert_msg(wait_for_output("running", 20000), "child never ran: %s",
                  buf);
    ck_assert_int_eq(kill(child, SIGTERM), 0);
    ck_assert_int_eq(finish_child(), 1);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, path, sizeof path,
                                      &step), KEEL_OK);
    ck_assert_int_eq(step, 5);
}
END_TEST

static Suite *
sigterm_suite(void)
{
    Suite *s = suite_create("it_sigterm");
    tu_tcase(s, "sigterm", 60, tu_setup, teardown, TU_TESTS(
        test_sigterm_mid_run_checkpoints_current_step_exits_0_and_resumes,
        test_sigint_behaves_like_sigterm,
        test_sigterm_whose_final_checkpoint_fails_exits_nonzero));
    return s;
}

KEEL_TEST_MAIN(sigterm_suite)
