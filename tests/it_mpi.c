/* it_mpi.c - train.strategy = multi_worker_mirrored as a user runs it:
 * `mpirun -n N keel train` and `keel launch --strategy
 * multi_worker_mirrored` on a small synthetic dataset, real MPI ranks on
 * this machine (shared memory and loopback only), real checkpoints.
 *  - 2 ranks train and learn; the chief's checkpoint restores with keel
 *    eval in one process;
 *  - 1, 2, 3 and 4 ranks give bitwise identical checkpoints (keel ckpt
 *    diff), also with leaves the ranks split unevenly (8 leaves on 3
 *    ranks, 6 on 4) and with the bytes a rank exchanges flat in the rank
 *    count;
 *  - a SIGKILLed rank ends the job, keel launch restarts every rank from
 *    the newest checkpoint, and the run ends bitwise equal to an
 *    uninterrupted one;
 *  - fewer leaves than ranks, and a cluster spec, are configuration
 *    errors (exit 2);
 *  - under Slurm (when a controller answers), srun --mpi=pmix ranks give
 *    mpirun's bits.
 * Skipped (exit 77) when keel was built without MPI. */
#include <config.h>

#include <dirent.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keel/keel.h>
#include "testutil.h"
#include "../tools/mpirun.h"

static char out[65536], err[65536];
static const char *cfg_path;

static void
setup(void)
{
#ifdef __SANITIZE_ADDRESS__
    {
        /* Open MPI's plugins keep buffers to the end and are unloaded by
         * MPI_Finalize, so no suppression can name their frames: the
         * ranks run without leak detection (every other check stays) */
        const char *a = getenv("ASAN_OPTIONS");
        char opts[2048];
        snprintf(opts, sizeof opts, "%s%sdetect_leaks=0", a != NULL ? a : "",
                 a != NULL && a[0] != '\0' ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
    }
#endif
    cfg_path = tu_setup_job(
        "max_steps = 30\nthreads = 1\nstrategy = multi_worker_mirrored\n"
        "[checkpoint]\ndir = %s/run\nsave_steps = 10\n"
        "[hooks]\nprogress = off\n", tu_dir);
}

/* The start of an mpirun command line: the options keel launch runs its
 * ranks with (every rank on this machine, shared memory and loopback
 * only); the next free index. */
static int
mpirun_options(char **argv)
{
    argv[0] = KEEL_MPIRUN;
    return 1 + mpirun_local_options(argv + 1);
}

/* One application context: -n n keel train cfg_path -s ckdir [-s extra
 * [-s extra2]] at argv[k]; the next free index. */
static int
mpirun_app2(char **argv, int k, const char *ranks, const char *ckdir,
            const char *extra, const char *extra2)
{
    argv[k++] = "-n";
    argv[k++] = (char *)ranks;
    argv[k++] = (char *)tu_build_path("keel");
    argv[k++] = "train";
    argv[k++] = (char *)cfg_path;
    argv[k++] = "-s";
    argv[k++] = (char *)ckdir;
    if (extra != NULL) {
        argv[k++] = "-s";
        argv[k++] = (char *)extra;
    }
    if (extra != NULL && extra2 != NULL) {
        argv[k++] = "-s";
        argv[k++] = (char *)extra2;
    }
    return k;
}

static int
mpirun_app(char **argv, int k, const char *ranks, const char *ckdir,
           const char *extra)
{
    return mpirun_app2(argv, k, ranks, ckdir, extra, NULL);
}

/* mpirun -n n keel train cfg_path -s checkpoint.dir=<tu_dir>/dir [-s
 * extra [-s extra2]] within the timeout; its exit status. */
static int
mpirun_train2(int n, const char *dir, const char *extra, const char *extra2)
{
    char ranks[8], ckdir[4200];
    char *argv[32];
    int k;
    snprintf(ranks, sizeof ranks, "%d", n);
    TU_SNPRINTF(ckdir, sizeof ckdir, "checkpoint.dir=%s", tu_path(dir));
    k = mpirun_options(argv);
    k = mpirun_app2(argv, k, ranks, ckdir, extra, extra2);
    argv[k] = NULL;
    return tu_run(argv, NULL, 120000, out, sizeof out, err, sizeof err);
}

static int
mpirun_train(int n, const char *dir, const char *extra)
{
    return mpirun_train2(n, dir, extra, NULL);
}

static int
ckpt_diff(const char *a, const char *b)
{
    char pa[4200], pb[4200];
    TU_SNPRINTF(pa, sizeof pa, "%s", tu_path(a));
    TU_SNPRINTF(pb, sizeof pb, "%s", tu_path(b));
    return TU_KEEL(60000, "ckpt", "diff", pa, pb);
}

START_TEST(test_two_ranks_train_and_restore_in_one_process)
{
    double acc = 0;
    char *p;
    int rc = mpirun_train(2, "run", NULL);
    ck_assert_msg(rc == 0, "mpirun -n 2: %d\n%s", rc, tu_tail(err, 3000));
    /* both ranks trained their half of every step's 32 examples */
    p = strstr(out, "trained steps 0..30 (480 examples");
    ck_assert_msg(p != NULL && strstr(p + 1, "trained steps 0..30 (480 "
                                      "examples") != NULL, "%s", out);
    ck_assert_msg(strstr(err, "collective: rank 1 of 2") != NULL, "%s",
                  tu_tail(err, 3000));
    /* the chief alone wrote; one process restores it */
    ck_assert_int_ge(tu_file_size(tu_path("run/model.ckpt-30.h5")), 1);
    ck_assert_int_eq(TU_KEEL(60000, "eval", tu_path("run")), 0);
    p = strstr(out, "accuracy ");
    ck_assert_msg(p != NULL && sscanf(p, "accuracy %lf", &acc) == 1, "%s",
                  out);
    /* 10 classes: chance is 0.1; the patches are learnt in 30 steps */
    ck_assert_msg(acc > 0.5, "accuracy %g after 30 steps:\n%s", acc, out);
    ck_assert_msg(strstr(out, "step 30") != NULL, "%s", out);
}
END_TEST

/* Every line of text starts with "rank 0 | " or "rank 1 | "; the first
 * other line, or NULL. */
static const char *
line_without_rank(const char *text)
{
    for (const char *p = text; *p != '\0';) {
        const char *nl = strchr(p, '\n');
        if (strncmp(p, "rank 0 | ", 9) != 0 && strncmp(p, "rank 1 | ", 9) != 0)
            return p;
        if (nl == NULL)
            break;
        p = nl + 1;
    }
    return NULL;
}

/* mpirun -H with host names (this machine's two names when its own
 * resolves): each rank starts every line it prints with its rank, names
 * its host, and the run ends with the bits of one process. */
START_TEST(test_ranks_on_named_hosts_prefix_their_lines)
{
    char hosts[600], host[256], ckdir[4200], want[400];
    char *argv[40];
    const char *bad;
    struct addrinfo *res = NULL;
    int k, rc;
    if (gethostname(host, sizeof host) == 0 &&
        getaddrinfo(host, NULL, NULL, &res) == 0) {
        freeaddrinfo(res);
        snprintf(hosts, sizeof hosts, "localhost,%s", host);
    } else {
        snprintf(host, sizeof host, "localhost");
        snprintf(hosts, sizeof hosts, "localhost:2");
    }
    TU_SNPRINTF(ckdir, sizeof ckdir, "checkpoint.dir=%s", tu_path("one"));
    rc = TU_KEEL(120000, "train", cfg_path, "-s", ckdir);
    ck_assert_msg(rc == 0, "one process: %d\n%s", rc, tu_tail(err, 3000));
    ck_assert_msg(strstr(out, "rank ") == NULL, "%s", out);

    TU_SNPRINTF(ckdir, sizeof ckdir, "checkpoint.dir=%s", tu_path("hosts"));
    k = mpirun_options(argv);
    argv[k++] = "-H";
    argv[k++] = hosts;
    argv[k++] = (char *)tu_build_path("keel");
    argv[k++] = "train";
    argv[k++] = (char *)cfg_path;
    argv[k++] = "-s";
    argv[k++] = ckdir;
    argv[k++] = "-s";
    argv[k++] = "hooks.log_every_steps=10";
    argv[k] = NULL;
    rc = tu_run(argv, NULL, 120000, out, sizeof out, err, sizeof err);
    ck_assert_msg(rc == 0, "mpirun -H %s: %d\n%s", hosts, rc,
                  tu_tail(err, 3000));
    /* step lines come from the chief, the report from every rank */
    ck_assert_msg(strstr(out, "rank 0 | step 30 ") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "rank 0 | trained steps 0..30") != NULL &&
                  strstr(out, "rank 1 | trained steps 0..30") != NULL, "%s",
                  out);
    bad = line_without_rank(out);
    ck_assert_msg(bad == NULL, "a line without its rank: %.200s", bad);
    TU_SNPRINTF(want, sizeof want, "rank 1 | collective: rank 1 of 2 on ");
    ck_assert_msg(strstr(err, want) != NULL, "no '%s' in:\n%s", want,
                  tu_tail(err, 3000));
    ck_assert_msg(strstr(err, "rank 0 | collective: rank 0 of 2 on ") !=
                  NULL, "%s", tu_tail(err, 3000));
    ck_assert_msg(ckpt_diff("one/model.ckpt-30.h5",
                            "hosts/model.ckpt-30.h5") == 0, "%s%s", out, err);
}
END_TEST

/* The bytes rank 0 sent to other ranks per step (its last log line),
 * or -1. */
static double
sent_per_step(const char *log)
{
    const char *p = log, *q;
    double sent = -1;
    while ((q = strstr(p, "collective: rank 0: ")) != NULL) {
        const char *b = strstr(q, "per step ");
        if (b != NULL)
            sscanf(b, "per step %lf", &sent);
        p = q + 1;
    }
    return sent;
}

/* train (one process) and mpirun -n ranks[i] into dirs "<tag>1",
 * "<tag>N" with extra and extra2: the step-10 and step-30 checkpoints all
 * equal the one process's; the last mpirun's log has expect (unless
 * NULL); sent[i] (unless NULL) is rank 0's bytes a step. */
static void
check_rank_counts(const char *tag, const int *ranks, int n,
                  const char *extra, const char *extra2, const char *expect,
                  double *sent)
{
    char a[128], b[128], dir[32], ckdir[4200];
    int rc;
    snprintf(dir, sizeof dir, "%s1", tag);
    TU_SNPRINTF(ckdir, sizeof ckdir, "checkpoint.dir=%s", tu_path(dir));
    /* one rank: a plain process (a singleton MPI job) */
    rc = extra2 != NULL
        ? TU_KEEL(120000, "train", cfg_path, "-s", ckdir, "-s", extra, "-s",
                  extra2)
        : extra != NULL
        ? TU_KEEL(120000, "train", cfg_path, "-s", ckdir, "-s", extra)
        : TU_KEEL(120000, "train", cfg_path, "-s", ckdir);
    ck_assert_msg(rc == 0, "%s 1 rank: %d\n%s", tag, rc, tu_tail(err, 3000));
    for (int i = 0; i < n; i++) {
        snprintf(dir, sizeof dir, "%s%d", tag, ranks[i]);
        rc = mpirun_train2(ranks[i], dir, extra, extra2);
        ck_assert_msg(rc == 0, "%s %d ranks: %d\n%s", tag, ranks[i], rc,
                      tu_tail(err, 3000));
        if (sent != NULL)
            sent[i] = sent_per_step(err);
        if (expect != NULL && i == n - 1)
            ck_assert_msg(strstr(err, expect) != NULL, "no '%s' in:\n%s",
                          expect, tu_tail(err, 3000));
        for (int step = 10; step <= 30; step += 20) {
            snprintf(a, sizeof a, "%s1/model.ckpt-%d.h5", tag, step);
            snprintf(b, sizeof b, "%s/model.ckpt-%d.h5", dir, step);
            ck_assert_msg(ckpt_diff(a, b) == 0, "%s vs %s:\n%s%s", a, b,
                          out, err);
        }
    }
}

START_TEST(test_one_to_four_ranks_give_identical_bits)
{
    static const int ranks[] = { 2, 3, 4 };
    double sent[3];
    int rc;
    /* 4 leaves: 2 ranks 2 each, 3 ranks 1, 1 and 2, 4 ranks 1 each */
    check_rank_counts("r", ranks, 3, NULL, NULL, NULL, sent);
    /* the bytes a rank sends do not grow with the ranks: its node sum and
     * its chunk of the sum, a little under two gradients */
    ck_assert_msg(sent[0] > 0 && sent[2] > 0, "%g %g", sent[0], sent[2]);
    ck_assert_msg(sent[2] < 1.6 * sent[0], "2 ranks: %g bytes a step, 4 "
                  "ranks: %g", sent[0], sent[2]);
    /* the diff can fail: another seed gives other bits */
    rc = mpirun_train(2, "seed", "train.seed=6");
    ck_assert_int_eq(rc, 0);
    ck_assert_int_ne(ckpt_diff("r1/model.ckpt-30.h5",
                               "seed/model.ckpt-30.h5"), 0);
}
END_TEST


/* The "loss X  accuracy Y" figures of every line of step n in o (any
 * rank's), checked equal to each other, into buf. */
static void
step_figures(const char *o, int n, char *buf, size_t size)
{
    char needle[64], one[128];
    const char *p = o;
    int found = 0;
    TU_SNPRINTF(needle, sizeof needle, "step %d  epoch", n);
    while ((p = strstr(p, needle)) != NULL) {
        const char *l = strstr(p, "loss "), *e;
        if (p != o && p[-1] != '\n' && p[-1] != ' ') {
            p++;
            continue;
        }
        e = l != NULL ? strstr(l, "  lr ") : NULL;
        ck_assert_msg(l != NULL && e != NULL && (size_t)(e - l) < size &&
                      (size_t)(e - l) < sizeof one,
                      "step %d: no loss and accuracy in %.200s", n, p);
        memcpy(found ? one : buf, l, (size_t)(e - l));
        (found ? one : buf)[e - l] = '\0';
        ck_assert_msg(!found || strcmp(one, buf) == 0, "step %d: lines "
                      "'%s' and '%s'", n, buf, one);
        found = 1;
        p = e;
    }
    ck_assert_msg(found, "no line of step %d in:\n%s", n, tu_tail(o, 2000));
}

/* The rows of tags loss and accuracy of a scalars.csv, time dropped
 * ("step,tag,value" lines in file order); the caller frees it. */
static char *
csv_figures(const char *path)
{
    char *csv = tu_read_file(path, NULL), *buf;
    size_t k = 0, size;
    ck_assert_msg(csv != NULL, "no %s", path);
    size = strlen(csv) + 1;
    buf = malloc(size);
    ck_assert_ptr_nonnull(buf);
    buf[0] = '\0';
    for (char *line = strtok(csv, "\n"); line != NULL;
         line = strtok(NULL, "\n")) {
        const char *rest = strchr(line, ',');
        if (rest == NULL || (strstr(rest, ",loss,") == NULL &&
                             strstr(rest, ",accuracy,") == NULL))
            continue;
        k += (size_t)snprintf(buf + k, size - k, "%s\n", rest + 1);
    }
    free(csv);
    ck_assert_msg(k > 0, "%s has no loss or accuracy rows", path);
    return buf;
}

/* Cluster-wide metrics: 2 ranks (each half of the leaves) print, step by
 * step, the loss and accuracy of the whole global batch, the figures one
 * process prints, and write them to scalars.csv. */
START_TEST(test_two_ranks_report_the_one_process_metrics)
{
    static char one[65536];
    static const char *extra = "hooks.log_every_steps=1";
    static const char *extra2 = "hooks.summary_every_steps=1";
    char ckdir[4200], *a, *b;
    int rc;
    TU_SNPRINTF(ckdir, sizeof ckdir, "checkpoint.dir=%s", tu_path("m1"));
    rc = TU_KEEL(120000, "train", cfg_path, "-s", ckdir, "-s", extra, "-s",
                 extra2);
    ck_assert_msg(rc == 0, "1 rank: %d\n%s", rc, tu_tail(err, 3000));
    memcpy(one, out, sizeof one);
    rc = mpirun_train2(2, "m2", extra, extra2);
    ck_assert_msg(rc == 0, "2 ranks: %d\n%s", rc, tu_tail(err, 3000));
    for (int n = 1; n <= 30; n++) {
        char f1[128], f2[128];
        step_figures(one, n, f1, sizeof f1);
        step_figures(out, n, f2, sizeof f2);
        ck_assert_msg(strcmp(f1, f2) == 0, "step %d: one process '%s', 2 "
                      "ranks '%s'", n, f1, f2);
    }
    a = csv_figures(tu_path("m1/scalars.csv"));
    b = csv_figures(tu_path("m2/scalars.csv"));
    ck_assert_msg(strcmp(a, b) == 0, "scalars.csv differs:\none process:"
                  "\n%s\n2 ranks:\n%s", a, b);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_uneven_leaves_give_identical_bits)
{
    static const int three[] = { 3 }, four[] = { 4 };
    /* 8 leaves on 3 ranks: 2, 3 and 3 leaves, the last two ranks send
     * two tree nodes each */
    check_rank_counts("e", three, 1, "train.leaves=8", NULL,
                      "leaves [2, 5) of 8, 2 tree node(s)", NULL);
    /* 6 leaves (not a power of two) of a 24-example batch on 4 ranks */
    check_rank_counts("s", four, 1, "train.leaves=6",
                      "train.batch_size=24", "leaves [3, 4) of 6", NULL);
}
END_TEST

/* A child of parent (one of mpirun's ranks), or 0. */
static pid_t
child_of(pid_t parent)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    ck_assert_ptr_nonnull(d);
    while (found == 0 && (e = readdir(d)) != NULL) {
        char path[300], buf[512], *rp;
        FILE *f;
        int ppid = 0;
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        f = fopen(path, "r");
        if (f == NULL)
            continue;
        if (fgets(buf, sizeof buf, f) != NULL &&
            (rp = strrchr(buf, ')')) != NULL &&
            sscanf(rp + 1, " %*c %d", &ppid) == 1 && ppid == parent &&
            strstr(buf, "(keel)") != NULL)
            found = (pid_t)atoi(e->d_name);
        fclose(f);
    }
    closedir(d);
    return found;
}

START_TEST(test_killed_rank_restarts_all_from_the_checkpoint_bit_exact)
{
    /* a bigger model: the run lasts long enough to be killed mid-way */
    char ckdir[4200], line[512];
    char *argv[] = { (char *)tu_build_path("keel"), "launch",
                     (char *)cfg_path, "--workers", "2", "--no-status",
                     "-s", "model.hidden=512,512", "-s", "train.max_steps=300",
                     "-s", "checkpoint.save_steps=50", "-s", ckdir, NULL };
    int fd = -1, rc, mpirun;
    pid_t launch, rank;
    TU_SNPRINTF(ckdir, sizeof ckdir, "checkpoint.dir=%s", tu_path("ref"));
    rc = TU_KEEL(120000, "train", cfg_path, "-s", "model.hidden=512,512", "-s",
                 "train.max_steps=300", "-s", "checkpoint.save_steps=50", "-s",
                 ckdir);
    ck_assert_msg(rc == 0, "uninterrupted: %d\n%s", rc, tu_tail(err, 3000));

    TU_SNPRINTF(ckdir, sizeof ckdir, "checkpoint.dir=%s", tu_path("run"));
    launch = tu_spawn_pipe(argv, NULL, TU_ERR_TO_PIPE, &fd);
    ck_assert_msg(tu_wait_for_line(fd, "started chief (pid", 60000, line,
                                   sizeof line), "no start line");
    mpirun = tu_pid_in(line);
    ck_assert_int_gt(mpirun, 0);
    ck_assert_msg(tu_wait_for_line(fd, "saved checkpoint for step 50",
                                   60000, NULL, 0), "no checkpoint at 50");
    rank = child_of(mpirun);
    ck_assert_msg(rank > 0, "no rank under mpirun %d", mpirun);
    ck_assert_int_eq(kill(rank, SIGKILL), 0);
    ck_assert_msg(tu_wait_for_line(fd, "restarting chief", 60000, NULL, 0),
                  "the launcher did not restart the ranks");
    ck_assert_msg(tu_wait_for_line(fd, "resumed from", 60000, line,
                                   sizeof line), "no resume");
    /* the ranks' lines carry their rank, not the launcher's task name */
    ck_assert_msg(strncmp(line, "rank 0 | ", 9) == 0 ||
                  strncmp(line, "rank 1 | ", 9) == 0, "%s", line);
    ck_assert_msg(strstr(line, "model.ckpt-0.h5") == NULL, "%s", line);
    ck_assert_msg(tu_wait_for_line(fd, "run complete", 120000, NULL, 0),
                  "the restarted job did not finish");
    rc = tu_wait(launch, 60000);
    close(fd);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(ckpt_diff("ref/model.ckpt-300.h5",
                            "run/model.ckpt-300.h5") == 0, "%s%s", out, err);
}
END_TEST

START_TEST(test_bad_setups_exit_2)
{
    char ckdir[4200];
    TU_SNPRINTF(ckdir, sizeof ckdir, "checkpoint.dir=%s", tu_path("bad"));
    /* 3 leaves cannot divide the 32-example batch */
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s", ckdir, "-s",
                             "train.leaves=3"), 2);
    ck_assert_msg(strstr(err, "train.leaves = 3") != NULL, "%s", err);
    /* 3 ranks cannot share 2 leaves */
    ck_assert_int_eq(mpirun_train(3, "bad", "train.leaves=2") != 0, 1);
    ck_assert_msg(strstr(err, "3 ranks and train.leaves = 2") != NULL, "%s",
                  tu_tail(err, 3000));
    /* ranks that built other models (rank 1: model.hidden = 16): every
     * rank fails with the reason before any value travels, none waits
     * for the others (mpirun's deadline would end a hang) */
    {
        char *argv[40];
        int k = mpirun_options(argv);
        k = mpirun_app(argv, k, "1", ckdir, NULL);
        argv[k++] = ":";
        k = mpirun_app(argv, k, "1", ckdir, "model.hidden=16");
        argv[k] = NULL;
        ck_assert_int_ne(tu_run(argv, NULL, 120000, out, sizeof out, err,
                                sizeof err), 0);
        ck_assert_msg(strstr(err, "every rank must build the same model")
                      != NULL, "%s", tu_tail(err, 3000));
        ck_assert_msg(strstr(err, "rank 1 holds") != NULL, "%s",
                      tu_tail(err, 3000));
    }
    /* the ranks come from MPI, not from a cluster spec */
    {
        char *argv[] = { (char *)tu_build_path("keel"), "train",
                         (char *)cfg_path, "-s", ckdir, NULL };
        char *env[] = { "TF_CONFIG={\"cluster\": {\"chief\": "
                        "[\"127.0.0.1:1\"], \"ps\": [\"127.0.0.1:2\"]}, "
                        "\"task\": {\"type\": \"chief\", \"index\": 0}}",
                        NULL };
        ck_assert_int_eq(tu_run(argv, env, 60000, out, sizeof out, err,
                                sizeof err), 2);
        ck_assert_msg(strstr(err, "takes its ranks from MPI") != NULL, "%s",
                      err);
    }
}
END_TEST

/* Under Slurm (a controller answering sinfo, with an idle node): srun
 * --mpi=pmix starts 2 ranks that train the bits mpirun's 2 ranks do.
 * Without Slurm it says so and checks nothing. */
START_TEST(test_srun_ranks_train_the_bits_of_mpirun)
{
    char ckdir[4200];
    char *probe[] = { "/usr/bin/env", "sinfo", "-h", "-t", "idle", "-o",
                      "%n", NULL };
    char *argv[] = { "/usr/bin/env", "srun", "--mpi=pmix", "-N", "1", "-n",
                     "2", "--overcommit", (char *)tu_build_path("keel"),
                     "train", (char *)cfg_path, "-s", ckdir, NULL };
    int rc = tu_run(probe, NULL, 20000, out, sizeof out, err, sizeof err);
    if (rc != 0 || out[0] == '\0') {
        printf("it_mpi: srun not tried: no Slurm controller with an idle "
               "node answers (sinfo: %d)\n", rc);
        return;
    }
    TU_SNPRINTF(ckdir, sizeof ckdir, "checkpoint.dir=%s", tu_path("srun"));
    rc = tu_run(argv, NULL, 120000, out, sizeof out, err, sizeof err);
    ck_assert_msg(rc == 0, "srun -n 2: %d\n%s", rc, tu_tail(err, 3000));
    ck_assert_msg(strstr(err, "collective: rank 1 of 2") != NULL, "%s",
                  tu_tail(err, 3000));
    rc = mpirun_train(2, "mpirun", NULL);
    ck_assert_msg(rc == 0, "mpirun -n 2: %d\n%s", rc, tu_tail(err, 3000));
    ck_assert_msg(ckpt_diff("srun/model.ckpt-30.h5",
                            "mpirun/model.ckpt-30.h5") == 0, "%s%s", out,
                  err);
}
END_TEST

static Suite *
mpi_suite(void)
{
    Suite *s = suite_create("it_mpi");
    tu_tcase(s, "mpi", 300, setup, tu_teardown, TU_TESTS(
        test_two_ranks_train_and_restore_in_one_process,
        test_ranks_on_named_hosts_prefix_their_lines,
        test_one_to_four_ranks_give_identical_bits,
        test_uneven_leaves_give_identical_bits,
        test_two_ranks_report_the_one_process_metrics,
        test_killed_rank_restarts_all_from_the_checkpoint_bit_exact,
        test_bad_setups_exit_2,
        test_srun_ranks_train_the_bits_of_mpirun));
    return s;
}

int
main(void)
{
    SRunner *sr;
    int failed;
    if (!keel_collective_is_available()) {
        printf("it_mpi: SKIP: keel was built without MPI (apt-get install "
               "libopenmpi-dev openmpi-bin, re-run configure)\n");
        return 77;
    }
    sr = srunner_create(mpi_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
