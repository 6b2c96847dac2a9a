/* it_determinism.c - bitwise reproducibility of synchronous training under
 * `keel launch` (1 ps, the chief, 1 worker; real processes): two runs of
 * one config give identical final checkpoints, and a run whose ps, worker
 * or chief is SIGKILLed mid-run and restarted by the launcher ends with the
 * undisturbed run's bits (`keel ckpt diff` exit 0), as does one process
 * killed and resumed from its checkpoint. Thread counts are fixed;
 * different model_threads values are not compared here. */
#include <config.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#define MAX_STEPS 300
#define KILL_AT 100          /* the chief's step line that triggers a kill */
#define LINE_MS 30000        /* deadline of each awaited launcher line */
#define RUN_MS 60000         /* deadline of a whole run */

static char out[65536], err[65536];
static const char *cfg_path;

static void
setup(void)
{
    /* every step logged, so a kill lands at a known step; checkpoints
     * often, so a restarted ps reloads a recent one and recomputes */
    cfg_path = tu_setup_job(
             "max_steps = %d\nthreads = 1\nmodel_threads = 1\n"
             "[checkpoint]\ndir = %s/unused\nsave_steps = 40\n"
             "max_to_keep = 0\n"
             "[hooks]\nlog_every_steps = 1\nsummary_every_steps = 0\n"
             "progress = off\n"
             "[cluster]\nmax_wait_secs = 30\n", MAX_STEPS, tu_dir);
}

/* "OUTPUT_DIR=<tu_dir>/<name>" for a run's environment. */
static void
output_env(char *buf, size_t size, const char *name)
{
    TU_SNPRINTF(buf, size, "OUTPUT_DIR=%s", tu_path(name));
}

/* `keel launch` arguments: 1 ps, the chief and 1 worker, or (is_local)
 * the chief alone, which trains in one process. */
static void
launch_argv(char **argv, int is_local)
{
    int n = 0;
    argv[n++] = (char *)tu_build_path("keel");
    argv[n++] = "launch";
    argv[n++] = (char *)cfg_path;
    if (!is_local) {
        argv[n++] = "--ps";
        argv[n++] = "1";
        argv[n++] = "--workers";
        argv[n++] = "1";
    }
    argv[n++] = "--no-status";
    argv[n++] = "--max-restarts";
    argv[n++] = "1";
    argv[n] = NULL;
}

/* An undisturbed run into <tu_dir>/<name>; it must end with exit 0. */
static void
run_undisturbed(const char *name, int is_local)
{
    char env0[4200];
    char *env[] = { env0, NULL };
    char *argv[12];
    int rc;
    launch_argv(argv, is_local);
    output_env(env0, sizeof env0, name);
    rc = tu_run(argv, env, RUN_MS, out, sizeof out, err, sizeof err);
    ck_assert_msg(rc == 0, "undisturbed run '%s' exited %d:\n%s\n%s", name,
                  rc, out, err);
    ck_assert_ptr_null(strstr(out, "restarting"));
}

/* keel ckpt diff of the final checkpoints of runs a and b: exit 0. */
static void
assert_final_equal(const char *a, const char *b)
{
    char pa[4200], pb[4200], name[64];
    int rc;
    TU_SNPRINTF(name, sizeof name, "model.ckpt-%d.h5", MAX_STEPS);
    TU_SNPRINTF(pa, sizeof pa, "%s/%s/%s", tu_dir, a, name);
    TU_SNPRINTF(pb, sizeof pb, "%s/%s/%s", tu_dir, b, name);
    rc = TU_KEEL(RUN_MS, "ckpt", "diff", pa, pb);
    ck_assert_msg(rc == 0, "keel ckpt diff %s %s exited %d:\n%s%s", pa, pb,
                  rc, out, err);
    ck_assert_ptr_nonnull(strstr(out, "identical: "));
}

/* Run into <tu_dir>/<name>, SIGKILL task victim ("ps.0", "chief",
 * "worker.0") when the chief reports step KILL_AT, let the launcher restart
 * it, and wait for the run to complete with exit 0. evidence (or NULL) is a
 * line that must appear after the restart: what the recovery did. */
static void
run_with_kill(const char *name, int is_local, const char *victim,
              const char *evidence)
{
    char env0[4200], needle[128], line[512];
    char *env[] = { env0, NULL };
    char *argv[12];
    int fd, victim_pid, rc;
    pid_t pid;
    launch_argv(argv, is_local);
    output_env(env0, sizeof env0, name);
    pid = tu_spawn_pipe(argv, env, tu_path("launch.err"), &fd);
    victim_pid = tu_launch_pid(fd, "started", victim, LINE_MS);
    TU_SNPRINTF(needle, sizeof needle, "chief | step %d ", KILL_AT);
    tu_expect_line(fd, needle, LINE_MS, line, sizeof line);
    ck_assert_int_eq(kill(victim_pid, SIGKILL), 0);
    ck_assert_int_ne(tu_launch_pid(fd, "restarted", victim, LINE_MS),
                     victim_pid);
    if (evidence != NULL)
        tu_expect_line(fd, evidence, LINE_MS, line, sizeof line);
    TU_SNPRINTF(needle, sizeof needle, "chief | step %d ", MAX_STEPS);
    tu_expect_line(fd, needle, LINE_MS, line, sizeof line);
    tu_expect_line(fd, "launch | the chief finished: run complete", LINE_MS,
                   line, sizeof line);
    /* drain to EOF so nothing of this run stays buffered */
    (void)tu_wait_for_line(fd, "\001", LINE_MS, NULL, 0);
    close(fd);
    rc = tu_wait(pid, RUN_MS);
    ck_assert_msg(rc == 0, "keel launch with %s killed exited %d", victim,
                  rc);
}

START_TEST(test_two_runs_of_one_config_are_bitwise_identical)
{
    run_undisturbed("a", 0);
    run_undisturbed("b", 0);
    assert_final_equal("a", "b");
}
END_TEST

/* The restarted ps is empty: the chief reloads the newest checkpoint into
 * it and the steps since are computed again, to the same bits. */
START_TEST(test_ps_killed_and_restarted_ends_bitwise_equal)
{
    run_undisturbed("ref", 0);
    run_with_kill("killed", 0, "ps.0", " step(s) lost");
    assert_final_equal("ref", "killed");
}
END_TEST

/* The restarted worker rejoins at the cluster's step and reads that
 * step's part of the global batch. */
START_TEST(test_worker_killed_and_restarted_ends_bitwise_equal)
{
    run_undisturbed("ref", 0);
    run_with_kill("killed", 0, "worker.0", NULL);
    assert_final_equal("ref", "killed");
}
END_TEST

/* The restarted chief joins the live ps (no rollback, no second INIT). */
START_TEST(test_chief_killed_and_restarted_ends_bitwise_equal)
{
    run_undisturbed("ref", 0);
    run_with_kill("killed", 0, "chief", "chief | chief: joined live parameter "
                  "servers at step ");
    assert_final_equal("ref", "killed");
}
END_TEST

/* One process (a chief-only cluster is local): the restarted chief
 * resumes from its newest checkpoint (variables, slots, global step and
 * the data iterator's position) and recomputes the steps since. */
START_TEST(test_one_process_killed_and_resumed_ends_bitwise_equal)
{
    run_undisturbed("ref", 1);
    run_with_kill("killed", 1, "chief", "chief | resumed from ");
    assert_final_equal("ref", "killed");
}
END_TEST

/* No determinism key set: the CNN at a global batch of 192 (12 pieces of
 * 16) trained 6 steps by one process and by 2, 3 and 4 replicas (the chief
 * and 1 to 3 workers, 1 ps) ends with the same bits for every pair. 2 and
 * 4 replicas own 6 and 3 pieces (one tree node each); of 3 replicas the
 * chief owns pieces [0, 4), the nodes [0, 3) and [3, 4). */
START_TEST(test_one_to_four_replicas_give_the_same_bits_by_default)
{
    static const char *names[4] = { "r1", "r2", "r3", "r4" };
    char text[1024], cnn[4200], env0[4200], nw[8], pa[4200], pb[4200];
    char *env[] = { env0, NULL };
    char *log;
    TU_SNPRINTF(text, sizeof text,
                "[model]\ntype = cnn\n[data]\ndir = %s\n"
                "[optimizer]\nname = adam\nlearning_rate = 0.01\n"
                "[train]\nbatch_size = 192\nseed = 3\nmax_steps = 6\n"
                "threads = 1\n[checkpoint]\nsave_steps = 3\n"
                "[hooks]\nprogress = off\n[cluster]\nmax_wait_secs = 30\n",
                tu_dir);
    TU_SNPRINTF(cnn, sizeof cnn, "%s", tu_path("cnn.ini"));
    tu_write_file(cnn, text, strlen(text));
    for (int r = 0; r < 4; r++) {
        char *argv[12];
        int n = 0, rc;
        TU_SNPRINTF(nw, sizeof nw, "%d", r);
        argv[n++] = (char *)tu_build_path("keel");
        argv[n++] = r == 0 ? "train" : "launch";
        argv[n++] = cnn;
        if (r > 0) {
            argv[n++] = "--ps";
            argv[n++] = "1";
            argv[n++] = "--workers";
            argv[n++] = nw;
            argv[n++] = "--no-status";
        }
        argv[n] = NULL;
        output_env(env0, sizeof env0, names[r]);
        rc = tu_run(argv, env, RUN_MS * 2, out, sizeof out, err,
                    sizeof err);
        ck_assert_msg(rc == 0, "%d replicas exited %d:\n%s\n%s", r + 1, rc,
                      tu_tail(out, 2000), tu_tail(err, 2000));
    }
    for (int r = 1; r <= 2; r++) {
        char path[64], want[96];
        TU_SNPRINTF(path, sizeof path, "%s/logs/chief.log", names[r]);
        TU_SNPRINTF(want, sizeof want, "12 leaves of 16 examples; this "
                    "replica pushes %d node sum(s)", r);
        log = tu_read_file(tu_path(path), NULL);
        ck_assert_ptr_nonnull(log);
        ck_assert_msg(strstr(log, want) != NULL, "%s: %s", want,
                      tu_tail(log, 2000));
        free(log);
    }
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++) {
            int rc;
            TU_SNPRINTF(pa, sizeof pa, "%s/%s/model.ckpt-6.h5", tu_dir,
                        names[a]);
            TU_SNPRINTF(pb, sizeof pb, "%s/%s/model.ckpt-6.h5", tu_dir,
                        names[b]);
            rc = TU_KEEL(RUN_MS, "ckpt", "diff", pa, pb);
            ck_assert_msg(rc == 0, "%d and %d replicas differ (exit %d):"
                          "\n%s%s", a + 1, b + 1, rc, out, err);
        }
}
END_TEST


/* The loss and accuracy figures of step n in run output o (keel train's or
 * the chief's lines under keel launch): "loss X  accuracy Y" into buf. */
static void
step_figures(const char *o, int n, char *buf, size_t size)
{
    char needle[64];
    const char *p = o, *l, *e;
    TU_SNPRINTF(needle, sizeof needle, "step %d  epoch", n);
    while ((p = strstr(p, needle)) != NULL &&
           p != o && p[-1] != '\n' && p[-1] != ' ')
        p++;
    ck_assert_msg(p != NULL, "no line of step %d in:\n%s", n,
                  tu_tail(o, 2000));
    l = strstr(p, "loss ");
    e = l != NULL ? strstr(l, "  lr ") : NULL;
    ck_assert_msg(l != NULL && e != NULL && (size_t)(e - l) < size,
                  "step %d: no loss and accuracy in %.200s", n, p);
    memcpy(buf, l, (size_t)(e - l));
    buf[e - l] = '\0';
}

/* The rows of tags loss and accuracy of a scalars.csv (time dropped):
 * "step,tag,value" lines, in file order. */
static void
csv_figures(const char *path, char *buf, size_t size)
{
    char *csv = tu_read_file(path, NULL);
    size_t k = 0;
    ck_assert_msg(csv != NULL, "no %s", path);
    for (char *line = strtok(csv, "\n"); line != NULL;
         line = strtok(NULL, "\n")) {
        const char *rest = strchr(line, ',');
        int n;
        if (rest == NULL || (strstr(rest, ",loss,") == NULL &&
                             strstr(rest, ",accuracy,") == NULL))
            continue;
        n = snprintf(buf + k, size - k, "%s\n", rest + 1);
        ck_assert(n > 0 && (size_t)n < size - k);
        k += (size_t)n;
    }
    free(csv);
    ck_assert_msg(k > 0, "%s has no loss or accuracy rows", path);
}

/* Cluster-wide metrics: a sync job of 2 replicas (the chief and a worker,
 * each half of the global batch's leaves) prints, step by step, the loss
 * and accuracy of the whole global batch - the figures the one-process
 * run of the config prints - and writes them to scalars.csv. */
START_TEST(test_cluster_metrics_equal_one_process_figures)
{
    static const char *names[2] = { "m1", "m2" };
    static char outs[2][65536], csvs[2][16384];
    char text[1024], cnn[4200], env0[4200], path[4200];
    char *env[] = { env0, NULL };
    TU_SNPRINTF(text, sizeof text,
                "[model]\ntype = cnn\n[data]\ndir = %s\n"
                "[optimizer]\nname = adam\nlearning_rate = 0.01\n"
                "[train]\nbatch_size = 192\nseed = 3\nmax_steps = 6\n"
                "threads = 1\n[checkpoint]\nsave_steps = 3\n"
                "[hooks]\nprogress = off\nlog_every_steps = 1\n"
                "summary_every_steps = 1\n"
                "[cluster]\nmax_wait_secs = 30\n", tu_dir);
    TU_SNPRINTF(cnn, sizeof cnn, "%s", tu_path("cnn.ini"));
    tu_write_file(cnn, text, strlen(text));
    for (int r = 0; r < 2; r++) {
        char *argv[12];
        int n = 0, rc;
        argv[n++] = (char *)tu_build_path("keel");
        argv[n++] = r == 0 ? "train" : "launch";
        argv[n++] = cnn;
        if (r > 0) {
            argv[n++] = "--ps";
            argv[n++] = "1";
            argv[n++] = "--workers";
            argv[n++] = "1";
            argv[n++] = "--no-status";
        }
        argv[n] = NULL;
        output_env(env0, sizeof env0, names[r]);
        rc = tu_run(argv, env, RUN_MS * 2, outs[r], sizeof outs[r], err,
                    sizeof err);
        ck_assert_msg(rc == 0, "%d replicas exited %d:\n%s\n%s", r + 1, rc,
                      tu_tail(outs[r], 2000), tu_tail(err, 2000));
        TU_SNPRINTF(path, sizeof path, "%s/%s/scalars.csv", tu_dir,
                    names[r]);
        csv_figures(path, csvs[r], sizeof csvs[r]);
    }
    for (int n = 1; n <= 6; n++) {
        char one[128], two[128];
        step_figures(outs[0], n, one, sizeof one);
        step_figures(outs[1], n, two, sizeof two);
        ck_assert_msg(strcmp(one, two) == 0, "step %d: one process '%s', "
                      "the cluster's chief '%s'", n, one, two);
    }
    ck_assert_msg(strcmp(csvs[0], csvs[1]) == 0, "scalars.csv differs:\n"
                  "one process:\n%s\ncluster:\n%s", csvs[0], csvs[1]);
}
END_TEST

static Suite *
determinism_suite(void)
{
    Suite *s = suite_create("it_determinism");
    tu_tcase(s, "launch", 180, setup, tu_teardown, TU_TESTS(
        test_two_runs_of_one_config_are_bitwise_identical,
        test_ps_killed_and_restarted_ends_bitwise_equal,
        test_worker_killed_and_restarted_ends_bitwise_equal,
        test_chief_killed_and_restarted_ends_bitwise_equal,
        test_one_process_killed_and_resumed_ends_bitwise_equal,
        test_one_to_four_replicas_give_the_same_bits_by_default));
    tu_tcase(s, "metrics", 180, setup, tu_teardown, TU_TESTS(
        test_cluster_metrics_equal_one_process_figures));
    return s;
}

KEEL_TEST_MAIN(determinism_suite)
