/* it_cluster.c - parameter-server training across real processes of the
 * keel CLI on 127.0.0.1: ps / chief / worker roles from a generated
 * TF_CONFIG, SyncReplicas accounting, determinism, backup workers, several
 * ps and re-placement on restore, a chief restarted while the ps live,
 * bad TF_CONFIGs, and CURVE refusing a worker without an allowed key. */
#include <config.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define MAX_TASKS 8
#define RUN_MS 40000

static char out[65536], err[65536];

static const char *cfg_path;

static void
setup(void)
{
    cfg_path = tu_setup_job(
             "max_steps = 40\n"
             "[checkpoint]\ndir = %s/run\nsave_steps = 20\n"
             "[hooks]\nlog_every_steps = 10\nsummary_every_steps = 0\n"
             "[cluster]\ndead_after_ms = 8000\nmax_wait_secs = 20\n",
             tu_dir);
}

/* One cluster: n_ps ps and n_workers workers (worker 0 is the chief). */
typedef struct cluster {
    int n_ps, n_workers;
    int ps_port[MAX_TASKS], w_port[MAX_TASKS];
    char extra[256];                 /* more TF_CONFIG keys */
    char host[300];                  /* every task's host; 127.0.0.1 */
    pid_t ps[MAX_TASKS], w[MAX_TASKS];
    int chief_fd;                    /* worker 0's stdout */
    char tag[32];                    /* log file prefix */
} cluster;

static void
cluster_init(cluster *c, int n_ps, int n_workers, const char *extra,
             const char *tag)
{
    memset(c, 0, sizeof *c);
    c->n_ps = n_ps;
    c->n_workers = n_workers;
    c->chief_fd = -1;
    for (int i = 0; i < n_ps; i++)
        c->ps_port[i] = tu_held_port();
    for (int i = 0; i < n_workers; i++)
        c->w_port[i] = tu_held_port();
    snprintf(c->extra, sizeof c->extra, "%s", extra ? extra : "");
    snprintf(c->tag, sizeof c->tag, "%s", tag);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
}

static void
tf_config(const cluster *c, const char *type, int index, char *buf,
          size_t size)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n,
                          "TF_CONFIG={\"cluster\": {\"ps\": [");
    for (int i = 0; i < c->n_ps; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s\"%s:%d\"",
                              i ? ", " : "", c->host, c->ps_port[i]);
    n += (size_t)snprintf(buf + n, size - n, "], \"worker\": [");
    for (int i = 0; i < c->n_workers; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s\"%s:%d\"",
                              i ? ", " : "", c->host, c->w_port[i]);
    n += (size_t)snprintf(buf + n, size - n, "]}, \"task\": {\"type\": "
                          "\"%s\", \"index\": %d}%s}", type, index, c->extra);
    ck_assert_uint_lt(n, size);
}

/* Start one task with extra "-s" overrides (NULL-terminated list). */
static pid_t
start_task(cluster *c, const char *type, int index, const char *const *sets,
           int *out_fd)
{
    char tf[2048], log[64];
    char *env[] = { tf, NULL };
    tf_config(c, type, index, tf, sizeof tf);
    snprintf(log, sizeof log, "%s-%s%d.log", c->tag, type, index);
    return tu_spawn_train(cfg_path, sets, env, tu_path(log), out_fd);
}

static void
cluster_start(cluster *c, const char *const *sets)
{
    for (int i = 0; i < c->n_ps; i++)
        c->ps[i] = start_task(c, "ps", i, sets, NULL);
    for (int i = 0; i < c->n_workers; i++)
        c->w[i] = start_task(c, "worker", i, sets, i == 0 ? &c->chief_fd
                                                          : NULL);
}

/* Every task exits 0 within the deadline. */
static void
cluster_wait_ok(cluster *c)
{
    int64_t deadline = tu_now_ms() + RUN_MS;
    for (int i = 0; i < c->n_workers; i++)
        ck_assert_msg(tu_wait(c->w[i], (int)(deadline - tu_now_ms())) == 0,
                      "%s worker %d did not exit 0", c->tag, i);
    for (int i = 0; i < c->n_ps; i++)
        ck_assert_msg(tu_wait(c->ps[i], (int)(deadline - tu_now_ms())) == 0,
                      "%s ps %d did not exit 0", c->tag, i);
    if (c->chief_fd >= 0)
        close(c->chief_fd);
    c->chief_fd = -1;
}

/* A clean run of n_ps ps and n_workers workers tagged tag that saves into
 * <tu_dir>/<tag>: dir_set (one of sets, dir_size bytes) is made
 * "checkpoint.dir=<tu_dir>/<tag>" first. */
static void
run_into(cluster *c, int n_ps, int n_workers, const char *tag, char *dir_set,
         size_t dir_size, const char *const *sets)
{
    TU_SNPRINTF(dir_set, dir_size, "checkpoint.dir=%s/%s", tu_dir, tag);
    cluster_init(c, n_ps, n_workers, NULL, tag);
    cluster_start(c, sets);
    cluster_wait_ok(c);
}

/* From ps i's log: "done at step S: gradients applied A, dropped D". */
static void
ps_stats(const cluster *c, int i, long *step, long *applied, long *dropped)
{
    char log[64];
    char *text, *p;
    snprintf(log, sizeof log, "%s-ps%d.log", c->tag, i);
    text = tu_read_file(tu_path(log), NULL);
    p = strstr(text, "done at step ");
    ck_assert_msg(p != NULL, "ps %d log has no summary: %s", i, text);
    ck_assert_int_eq(sscanf(p, "done at step %ld: gradients applied %ld, "
                            "dropped %ld", step, applied, dropped), 3);
    free(text);
}

static int
log_has(const cluster *c, const char *task, const char *needle)
{
    char log[64];
    char *text;
    int found;
    snprintf(log, sizeof log, "%s-%s.log", c->tag, task);
    text = tu_read_file(tu_path(log), NULL);
    found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

/* Read the chief's step lines until one reports a global step >= min
 * (steps may jump: a backup replica's stale push returns the newer step). */
static int
wait_step(int fd, long min)
{
    int64_t deadline = tu_now_ms() + RUN_MS;
    char line[256];
    while (tu_now_ms() < deadline) {
        long step;
        const char *p;
        if (!tu_wait_for_line(fd, "step ", (int)(deadline - tu_now_ms()),
                              line, sizeof line))
            return 0;
        p = strstr(line, "step ");
        if (p != NULL && sscanf(p, "step %ld", &step) == 1 && step >= min)
            return 1;
    }
    return 0;
}

/* The last bytes of a task's log, for failure messages. */
static const char *
log_tail(const cluster *c, const char *task)
{
    static char tail[1024];
    char log[64];
    char *text;
    size_t n;
    snprintf(log, sizeof log, "%s-%s.log", c->tag, task);
    text = tu_read_file(tu_path(log), &n);
    snprintf(tail, sizeof tail, "%s", n > 1000 ? text + n - 1000 : text);
    free(text);
    return tail;
}

static double
eval_accuracy(const char *dir)
{
    ck_assert_int_eq(TU_KEEL(RUN_MS, "eval", dir, "--json"), 0);
    return tu_json_number(out, "accuracy");
}

START_TEST(sync_1ps_2workers_trains_like_one_process)
{
    cluster c;
    long step, applied, dropped;
    double acc_cluster, acc_single;
    char set[4200];
    cluster_init(&c, 1, 2, NULL, "a");
    cluster_start(&c, NULL);
    cluster_wait_ok(&c);
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_eq(step, 40);
    ck_assert_int_eq(applied, step * 2);     /* global_step x R */
    ck_assert_int_eq(dropped, 0);
    ck_assert(log_has(&c, "worker0", "saved checkpoint for step 40"));
    ck_assert(!log_has(&c, "worker1", "saved checkpoint"));
    /* the chief's checkpoints restore in one process */
    acc_cluster = eval_accuracy(tu_path("run"));
    TU_SNPRINTF(set, sizeof set, "checkpoint.dir=%s/single", tu_dir);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "train", cfg_path, "-s", set), 0);
    acc_single = eval_accuracy(tu_path("single"));
    ck_assert_msg(acc_cluster >= acc_single - 0.05, "cluster accuracy %.3f "
                  "vs one process %.3f", acc_cluster, acc_single);
    ck_assert(acc_cluster > 0.5);
}
END_TEST

/* A rerun gives the same bits, over the Unix sockets of
 * cluster.local_transport=auto, the default, and over tcp (each task logs
 * which). */
START_TEST(sync_rerun_is_bitwise_identical)
{
    cluster c;
    char d1[4200], d2[4200];
    const char *sets[3] = { d1, NULL, NULL };
    run_into(&c, 1, 2, "r1", d1, sizeof d1, sets);
    ck_assert_msg(log_has(&c, "worker0", "ps 0 over ipc://") &&
                  log_has(&c, "worker1", "ps 0 over ipc://"), "%s",
                  log_tail(&c, "worker1"));
    sets[1] = "cluster.local_transport=tcp";
    run_into(&c, 1, 2, "r2", d1, sizeof d1, sets);
    ck_assert(!log_has(&c, "worker0", "over ipc://"));
    ck_assert(!log_has(&c, "worker1", "over ipc://"));
    ck_assert(log_has(&c, "worker1", "ps 0 over tcp://"));
    TU_SNPRINTF(d1, sizeof d1, "%s/r1/model.ckpt-40.h5", tu_dir);
    TU_SNPRINTF(d2, sizeof d2, "%s/r2/model.ckpt-40.h5", tu_dir);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "ckpt", "diff", d1, d2), 0);
}
END_TEST

/* Poll task's log (the ps and the other workers log to files only) until
 * it has needle or RUN_MS pass. */
static int
wait_log(const cluster *c, const char *task, const char *needle)
{
    int64_t deadline = tu_now_ms() + RUN_MS;
    while (!log_has(c, task, needle) && tu_now_ms() < deadline)
        usleep(10000);
    return log_has(c, task, needle);
}

/* Worker 2 of three replicas (two aggregated) is SIGSTOPped, most often
 * while it waits for its step's reply; that reply (1.6 MB of values,
 * more than a Unix socket's kernel buffers hold) then stays queued to it,
 * and the chief must go on all the same. */
START_TEST(backup_worker_stopped_training_goes_on)
{
    cluster c;
    const char *const sets[] = { "train.max_steps=1000000",
                                 "hooks.log_every_steps=1",
                                 "model.hidden=512", NULL };
    long step, applied, dropped;
    cluster_init(&c, 1, 3, ", \"replicas_to_aggregate\": 2, "
                 "\"total_num_replicas\": 3", "b");
    cluster_start(&c, sets);
    ck_assert(wait_step(c.chief_fd, 20));
    ck_assert(wait_log(&c, "worker2", "model ready"));
    /* its pull before the first step is timed in its log (restart.sh) */
    ck_assert_msg(log_has(&c, "worker2", " MiB at step ") &&
                  log_has(&c, "worker2", "from 1 ps in "), "%s",
                  log_tail(&c, "worker2"));
    /* one host: the Unix socket of the default cluster.local_transport */
    ck_assert_msg(log_has(&c, "worker2", "ps 0 over ipc://"), "%s",
                  log_tail(&c, "worker2"));
    ck_assert_int_eq(kill(c.w[2], SIGSTOP), 0);
    /* two replicas are enough: the chief goes on while worker 2 sleeps */
    ck_assert_msg(wait_step(c.chief_fd, 120), "chief stuck: %s",
                  log_tail(&c, "worker0"));
    ck_assert_int_eq(kill(c.w[2], SIGCONT), 0);
    /* its late gradient is dropped as stale; the run is stopped only
     * then, so a loaded machine cannot end it first */
    ck_assert_msg(wait_log(&c, "ps0", "dropped a stale gradient of "
                           "replica 2"), "%s", log_tail(&c, "ps0"));
    ck_assert_int_eq(kill(c.w[0], SIGTERM), 0);
    cluster_wait_ok(&c);
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_ge(step, 120);
    ck_assert_int_eq(applied, step * 2);
    ck_assert_int_ge(dropped, 1);
    ck_assert_msg(log_has(&c, "worker0", "sync results depend on the number "
                          "of replicas (3) in this run: backup workers"),
                  "%s", log_tail(&c, "worker0"));
}
END_TEST

/* Until pid exits (not reaped: WNOWAIT keeps it for cluster_wait_ok) or
 * RUN_MS pass, run victim at half speed: stopped 20 ms of every 40 ms. */
static void
slow_down_until_exit(pid_t victim, pid_t pid)
{
    int64_t deadline = tu_now_ms() + RUN_MS;
    siginfo_t info;
    for (;;) {
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0
            || info.si_pid == pid || tu_now_ms() >= deadline)
            break;
        kill(victim, SIGSTOP);
        usleep(20000);
        kill(victim, SIGCONT);
        usleep(20000);
    }
    kill(victim, SIGCONT);
}

/* Backup workers make stale drops routine (the slowest of three replicas,
 * here one run at half speed, misses most steps): the ps logs a replica's
 * first at once and then one line per interval with the count held, not a
 * line per drop, and says at exit how many it held since its last such
 * line. */
START_TEST(backup_workers_stale_drops_are_logged_per_interval)
{
    cluster c;
    const char *const sets[] = { "train.max_steps=300", NULL };
    long step, applied, dropped, lines = 0;
    int64_t t0 = tu_now_ms(), secs;
    char *text, *p;
    cluster_init(&c, 1, 3, ", \"replicas_to_aggregate\": 2, "
                 "\"total_num_replicas\": 3", "st");
    cluster_start(&c, sets);
    slow_down_until_exit(c.w[2], c.w[0]);
    cluster_wait_ok(&c);
    secs = (tu_now_ms() - t0) / 1000;
    ps_stats(&c, 0, &step, &applied, &dropped);
    text = tu_read_file(tu_path("st-ps0.log"), NULL);
    for (p = text; (p = strstr(p, "dropped a stale gradient of")) != NULL;
         p++)
        lines++;
    ck_assert_msg(dropped >= 20, "only %ld stale drops in %ld steps: %s",
                  dropped, step, log_tail(&c, "ps0"));
    /* a replica's first at once, then at most one a 10 s interval */
    ck_assert_msg(lines >= 1 && lines <= 3 * (2 + secs / 10),
                  "%ld lines for %ld drops in %lld s", lines, dropped,
                  (long long)secs);
    ck_assert_msg(strstr(text, "more stale gradients dropped since the last "
                         "such line") != NULL, "%s", log_tail(&c, "ps0"));
    free(text);
}
END_TEST

START_TEST(two_ps_split_and_restore_into_1_3_and_no_cluster)
{
    cluster c;
    const char *const more[] = { "train.max_steps=60", NULL };
    long step, applied, dropped, s2;
    cluster_init(&c, 2, 2, NULL, "p2");
    cluster_start(&c, NULL);
    cluster_wait_ok(&c);
    /* size-balanced: the 784x32 kernel alone on ps 0, the rest on ps 1 */
    ck_assert(log_has(&c, "ps0", "ps 0: 1 of 4 variables"));
    ck_assert(log_has(&c, "ps1", "ps 1: 3 of 4 variables"));
    ps_stats(&c, 0, &step, &applied, &dropped);
    ps_stats(&c, 1, &s2, &applied, &dropped);
    ck_assert_int_eq(step, 40);
    ck_assert_int_eq(s2, 40);
    /* one process */
    ck_assert(eval_accuracy(tu_path("run")) > 0.5);
    /* 1 ps: resumes at 40, trains to 60 */
    cluster_init(&c, 1, 2, NULL, "p1");
    cluster_start(&c, more);
    cluster_wait_ok(&c);
    ck_assert(log_has(&c, "worker0", "resumed from"));
    ck_assert(log_has(&c, "ps0", "initialized by the chief"));
    ck_assert(log_has(&c, "ps0", "at step 40"));
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_eq(step, 60);
    ck_assert_int_eq(applied, 2 * 20);
    /* 3 ps: resumes at 60, trains to 80 (placement recomputed) */
    cluster_init(&c, 3, 2, NULL, "p3");
    {
        const char *const m80[] = { "train.max_steps=80", NULL };
        cluster_start(&c, m80);
    }
    cluster_wait_ok(&c);
    ck_assert(log_has(&c, "ps2", "initialized by the chief"));
    ps_stats(&c, 2, &step, &applied, &dropped);
    ck_assert_int_eq(step, 80);
    ck_assert(eval_accuracy(tu_path("run")) > 0.5);
}
END_TEST

START_TEST(chief_killed_and_restarted_rejoins_without_rollback)
{
    cluster c;
    const char *const sets[] = { "train.max_steps=600",
                                 "checkpoint.save_steps=100000",
                                 "hooks.log_every_steps=50", NULL };
    char log[64];
    char *text, *p;
    long joined = -1, step, applied, dropped;
    cluster_init(&c, 1, 2, NULL, "k");
    cluster_start(&c, sets);
    ck_assert(wait_step(c.chief_fd, 100));
    tu_kill(c.w[0]);
    close(c.chief_fd);
    snprintf(c.tag, sizeof c.tag, "k2");
    c.w[0] = start_task(&c, "worker", 0, sets, &c.chief_fd);
    snprintf(c.tag, sizeof c.tag, "k");
    {
        /* worker 1 and the ps logged under "k", the new chief "k2" */
        int64_t deadline = tu_now_ms() + RUN_MS;
        ck_assert_int_eq(tu_wait(c.w[0], RUN_MS), 0);
        ck_assert_int_eq(tu_wait(c.w[1], (int)(deadline - tu_now_ms())), 0);
        ck_assert_int_eq(tu_wait(c.ps[0], (int)(deadline - tu_now_ms())), 0);
        close(c.chief_fd);
    }
    snprintf(log, sizeof log, "k2-worker0.log");
    text = tu_read_file(tu_path(log), NULL);
    p = strstr(text, "joined live parameter servers at step ");
    ck_assert_msg(p != NULL, "restarted chief did not join: %s", text);
    ck_assert_int_eq(sscanf(p, "joined live parameter servers at step %ld",
                            &joined), 1);
    free(text);
    ck_assert_int_ge(joined, 100);           /* no rollback to step 0 */
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_eq(step, 600);
}
END_TEST

START_TEST(bad_tf_config_exits_2_listing_problems)
{
    char *argv[] = { (char *)tu_build_path("keel"), "train",
                     (char *)cfg_path, NULL };
    char *env1[] = { "TF_CONFIG={\"cluster\": {\"ps\": [\"nohost\"], "
                     "\"worker\": [\"127.0.0.1:99999\"]}, \"task\": "
                     "{\"type\": \"worker\", \"index\": 3}}", NULL };
    char *env2[] = { "TF_CONFIG={not json", NULL };
    char *env3[] = { "TF_CONFIG={\"cluster\": {\"worker\": "
                     "[\"127.0.0.1:1\"]}, \"task\": {\"type\": \"worker\", "
                     "\"index\": 0}}", NULL };
    ck_assert_int_eq(tu_run(argv, env1, RUN_MS, out, sizeof out, err,
                            sizeof err), 2);
    ck_assert_msg(strstr(err, "problems") != NULL, "%s", err);
    ck_assert_msg(strstr(err, "nohost") != NULL, "%s", err);
    ck_assert_msg(strstr(err, "99999") != NULL, "%s", err);
    ck_assert_int_eq(tu_run(argv, env2, RUN_MS, out, sizeof out, err,
                            sizeof err), 2);
    ck_assert_msg(strstr(err, "TF_CONFIG") != NULL, "%s", err);
    ck_assert_int_eq(tu_run(argv, env3, RUN_MS, out, sizeof out, err,
                            sizeof err), 2);
    ck_assert_msg(strstr(err, "no ps") != NULL, "%s", err);
}
END_TEST

/* More replicas to aggregate than the cluster has (2 workers, 3 to
 * aggregate), or a total that is not the cluster's: every task exits 2 at
 * start naming both numbers, instead of a ps that waits forever. */
START_TEST(replica_counts_beyond_the_cluster_exit_2_at_start)
{
    cluster c;
    static const char *const roles[][2] = { { "ps", "0" }, { "worker", "0" },
                                            { "worker", "1" } };
    char tf[2048];
    char *argv[] = { (char *)tu_build_path("keel"), "train",
                     (char *)cfg_path, NULL, NULL, NULL };
    char *env[] = { tf, NULL };
    cluster_init(&c, 1, 2, ", \"replicas_to_aggregate\": 3", "x");
    for (int i = 0; i < 3; i++) {
        int64_t t0 = tu_now_ms();
        tf_config(&c, roles[i][0], atoi(roles[i][1]), tf, sizeof tf);
        ck_assert_int_eq(tu_run(argv, env, RUN_MS, out, sizeof out, err,
                                sizeof err), 2);
        ck_assert_msg(tu_now_ms() - t0 < 10000, "%s took %lld ms",
                      roles[i][0], (long long)(tu_now_ms() - t0));
        ck_assert_msg(strstr(err, "replicas_to_aggregate 3 is more than the "
                             "2 training replicas") != NULL, "%s", err);
    }
    /* the same from the INI key, and a total_num_replicas that is not the
     * cluster's */
    cluster_init(&c, 1, 2, NULL, "x");
    tf_config(&c, "worker", 0, tf, sizeof tf);
    argv[3] = "-s";
    argv[4] = "cluster.replicas_to_aggregate=3";
    ck_assert_int_eq(tu_run(argv, env, RUN_MS, out, sizeof out, err,
                            sizeof err), 2);
    ck_assert_msg(strstr(err, "replicas_to_aggregate 3 is more than the 2 "
                         "training replicas") != NULL, "%s", err);
    argv[4] = "cluster.total_num_replicas=3";
    ck_assert_int_eq(tu_run(argv, env, RUN_MS, out, sizeof out, err,
                            sizeof err), 2);
    ck_assert_msg(strstr(err, "total_num_replicas 3 does not match the 2 "
                         "training replicas") != NULL, "%s", err);
}
END_TEST

START_TEST(config_check_prints_the_role_from_tf_config_slurm_and_lists)
{
    char *check[] = { (char *)tu_build_path("keel"), "config", "check",
                      (char *)cfg_path, NULL, NULL, NULL };
    char *tf[] = { "TF_CONFIG={\"cluster\": {\"ps\": [\"127.0.0.1:7000\"], "
                   "\"worker\": [\"127.0.0.1:7001\", \"127.0.0.1:7002\"]}, "
                   "\"task\": {\"type\": \"worker\", \"index\": 1}}", NULL };
    char *slurm[] = { "SLURM_PROCID=0", "SLURM_NTASKS=3",
                      "SLURM_JOB_NODELIST=localhost",
                      "SLURM_TASKS_PER_NODE=3", NULL };
    ck_assert_int_eq(tu_run(check, tf, RUN_MS, out, sizeof out, err,
                            sizeof err), 0);
    ck_assert_msg(strstr(out, "this task: worker 1") != NULL, "%s", out);
    ck_assert_int_eq(tu_run(check, slurm, RUN_MS, out, sizeof out, err,
                            sizeof err), 0);
    ck_assert_msg(strstr(out, "this task: ps 0") != NULL, "%s%s", out, err);
    check[4] = "-s";
    check[5] = "cluster.ps=127.0.0.1:7000";
    ck_assert_int_eq(tu_run(check, NULL, RUN_MS, out, sizeof out, err,
                            sizeof err), 2);      /* lists need --task */
    ck_assert_msg(strstr(err, "--task") != NULL, "%s", err);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "config", "check", cfg_path, "-s",
                             "cluster.ps=127.0.0.1:7000", "-s",
                             "cluster.workers=127.0.0.1:7001", "--task",
                             "worker:0"), 0);
    ck_assert_msg(strstr(out, "this task: worker 0") != NULL, "%s", out);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "config", "check", cfg_path), 0);
    ck_assert_msg(strstr(out, "cluster: none") != NULL, "%s", out);
}
END_TEST

START_TEST(curve_worker_without_allowed_key_cannot_join)
{
    cluster c;
    char keys[4200], rogue[4200], src[4200], dst[4200];
    char set_keys[4300], set_rogue[4300];
    const char *const sets[] = { "security.curve=true", set_keys,
                                 "cluster.max_wait_secs=3", NULL };
    const char *const rsets[] = { "security.curve=true", set_rogue,
                                  "cluster.max_wait_secs=3", NULL };
    char *data;
    size_t n;
    long step, applied, dropped;
    TU_SNPRINTF(keys, sizeof keys, "%s/keys", tu_dir);
    TU_SNPRINTF(rogue, sizeof rogue, "%s/rogue", tu_dir);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "keygen", keys, "--name", "ps0"), 0);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "keygen", keys, "--name", "worker0"), 0);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "keygen", rogue, "--name", "worker1"), 0);
    TU_SNPRINTF(src, sizeof src, "%s/ps0.key", keys);
    TU_SNPRINTF(dst, sizeof dst, "%s/ps0.key", rogue);
    data = tu_read_file(src, &n);
    tu_write_file(dst, data, n);
    free(data);
    TU_SNPRINTF(set_keys, sizeof set_keys, "security.key_dir=%s", keys);
    TU_SNPRINTF(set_rogue, sizeof set_rogue, "security.key_dir=%s",
                     rogue);
    cluster_init(&c, 1, 2, ", \"replicas_to_aggregate\": 1", "c");
    c.ps[0] = start_task(&c, "ps", 0, sets, NULL);
    c.w[0] = start_task(&c, "worker", 0, sets, &c.chief_fd);
    c.w[1] = start_task(&c, "worker", 1, rsets, NULL);
    ck_assert_int_eq(tu_wait(c.w[0], RUN_MS), 0);
    ck_assert_int_eq(tu_wait(c.ps[0], RUN_MS), 0);
    ck_assert_int_ne(tu_wait(c.w[1], RUN_MS), 0);
    close(c.chief_fd);
    ck_assert(log_has(&c, "ps0", "(CURVE)"));
    ck_assert(log_has(&c, "ps0", "refused"));
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_eq(step, 40);
    ck_assert_int_eq(applied, 40);           /* only the chief's */
}
END_TEST

START_TEST(chief_sigterm_stops_everyone_with_exit_0)
{
    cluster c;
    const char *const sets[] = { "train.max_steps=100000",
                                 "hooks.log_every_steps=20", NULL };
    long step, applied, dropped;
    int64_t t0;
    char ck[64];
    cluster_init(&c, 1, 2, NULL, "t");
    cluster_start(&c, sets);
    ck_assert(wait_step(c.chief_fd, 40));
    ck_assert_int_eq(kill(c.w[0], SIGTERM), 0);
    t0 = tu_now_ms();
    cluster_wait_ok(&c);
    /* Well below every timeout that would end it otherwise (orphan_secs
     * 600, step_timeout_secs 3600); a loaded machine may take seconds. */
    ck_assert_msg(tu_now_ms() - t0 < 120000, "shutdown took %lld ms",
                  (long long)(tu_now_ms() - t0));
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_ge(step, 40);
    ck_assert_int_eq(applied, 2 * step);
    snprintf(ck, sizeof ck, "saved checkpoint for step %ld", step);
    ck_assert(log_has(&c, "worker0", ck));      /* the final checkpoint */
}
END_TEST

/* Start task worker `index` with max_wait_secs 600, wait for its line
 * `waiting`, SIGTERM it: it must exit 0 long before max_wait_secs, saying
 * it stopped before training started. */
static void
sigterm_in_wait(const cluster *c, int index, const char *waiting)
{
    char tf[2048], line[512];
    char *env[] = { tf, NULL };
    char *argv[] = { (char *)tu_build_path("keel"), "train", (char *)cfg_path,
                     "-s", "cluster.max_wait_secs=600", NULL };
    int fd;
    pid_t pid;
    int64_t t0;
    tf_config(c, "worker", index, tf, sizeof tf);
    pid = tu_spawn_pipe(argv, env, TU_ERR_TO_PIPE, &fd);
    ck_assert_msg(tu_wait_for_line(fd, waiting, RUN_MS, line, sizeof line),
                  "worker %d never logged '%s'", index, waiting);
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    t0 = tu_now_ms();
    ck_assert_int_eq(tu_wait(pid, 120000), 0);
    ck_assert_msg(tu_now_ms() - t0 < 120000, "worker %d took %lld ms", index,
                  (long long)(tu_now_ms() - t0));
    ck_assert(tu_wait_for_line(fd, "before training started", 1000, line,
                               sizeof line));
    close(fd);
}

/* Preemption before training starts: a chief waiting for a ps that is not
 * up, and a worker (and a ps) waiting for a chief that never came, stop at
 * once on SIGTERM with exit 0, not after cluster.max_wait_secs and not
 * killed by the signal. */
START_TEST(sigterm_while_waiting_for_the_chief_exits_0_at_once)
{
    cluster c;
    const char *const sets[] = { "cluster.max_wait_secs=600", NULL };
    cluster_init(&c, 1, 2, NULL, "w");
    sigterm_in_wait(&c, 0, "initializing");         /* the chief, no ps */
    c.ps[0] = start_task(&c, "ps", 0, sets, NULL);
    sigterm_in_wait(&c, 1, "Waiting for model to be ready");  /* no chief */
    ck_assert_int_eq(kill(c.ps[0], SIGTERM), 0);
    ck_assert_int_eq(tu_wait(c.ps[0], 10000), 0);
}
END_TEST

START_TEST(worker_losing_the_ps_fails_clearly)
{
    cluster c;
    /* deadlines short enough for a quick test, long enough that a loaded
     * machine's late heartbeat does not end the run before the kill */
    const char *const sets[] = { "train.max_steps=100000",
                                 "hooks.log_every_steps=20",
                                 "cluster.dead_after_ms=2000",
                                 "cluster.max_wait_secs=2", NULL };
    int rc;
    cluster_init(&c, 1, 2, NULL, "l");
    cluster_start(&c, sets);
    ck_assert_msg(wait_step(c.chief_fd, 20), "no step 20: %s",
                  log_tail(&c, "worker0"));
    tu_kill(c.ps[0]);
    rc = tu_wait(c.w[1], RUN_MS);
    ck_assert_int_eq(rc, 1);
    ck_assert(log_has(&c, "worker1", "127.0.0.1:"));
    ck_assert(log_has(&c, "worker1", "unavailable"));
    ck_assert_int_eq(tu_wait(c.w[0], RUN_MS), 1);
    close(c.chief_fd);
}
END_TEST

START_TEST(micro_batches_give_identical_bits_for_1_2_and_4_workers)
{
    cluster c;
    char d[4200], a[4200], b[4200];
    const char *const sets[] = { "train.micro_batch=8", d, NULL };
    TU_SNPRINTF(d, sizeof d, "checkpoint.dir=%s/m1", tu_dir);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "train", cfg_path, "-s", sets[0], "-s",
                             d), 0);
    run_into(&c, 1, 2, "m2", d, sizeof d, sets);
    run_into(&c, 2, 4, "m4", d, sizeof d, sets);
    /* the micro-batches' fold is the guarantee: no warning that says
     * otherwise */
    ck_assert_msg(!log_has(&c, "worker0", "sync results depend on the "
                           "number of replicas"), "%s",
                  log_tail(&c, "worker0"));
    TU_SNPRINTF(a, sizeof a, "%s/m1/model.ckpt-40.h5", tu_dir);
    TU_SNPRINTF(b, sizeof b, "%s/m2/model.ckpt-40.h5", tu_dir);
    ck_assert_msg(tu_keel(RUN_MS, out, sizeof out, err, sizeof err, "ckpt",
                          "diff", a, b, NULL) == 0, "1 vs 2 workers: %s",
                  out);
    TU_SNPRINTF(b, sizeof b, "%s/m4/model.ckpt-40.h5", tu_dir);
    ck_assert_msg(tu_keel(RUN_MS, out, sizeof out, err, sizeof err, "ckpt",
                          "diff", a, b, NULL) == 0, "1 vs 4 workers: %s",
                  out);
    /* a micro-batch that does not divide a replica's part: exit 2 */
    ck_assert_int_eq(TU_KEEL(RUN_MS, "train", cfg_path, "-s",
                             "train.micro_batch=5"), 2);
}
END_TEST

START_TEST(ps_restarted_is_reinitialized_from_checkpoint)
{
    cluster c;
    const char *const sets[] = { "train.max_steps=400",
                                 "checkpoint.save_steps=50",
                                 "hooks.log_every_steps=1",
                                 "cluster.dead_after_ms=1000", NULL };
    long step, applied, dropped, from = -1;
    char *text, *p;
    cluster_init(&c, 1, 2, NULL, "q");
    cluster_start(&c, sets);
    ck_assert(wait_step(c.chief_fd, 120));
    tu_kill(c.ps[0]);
    snprintf(c.tag, sizeof c.tag, "q2");
    c.ps[0] = start_task(&c, "ps", 0, sets, NULL);
    cluster_wait_ok(&c);
    text = tu_read_file(tu_path("q2-ps0.log"), NULL);
    p = strstr(text, "initialized by the chief");
    ck_assert_msg(p != NULL, "%s", text);
    p = strstr(p, "at step ");
    ck_assert_int_eq(sscanf(p, "at step %ld", &from), 1);
    free(text);
    ck_assert_int_ge(from, 100);                 /* the newest checkpoint */
    ck_assert_int_eq(from % 50, 0);
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_eq(step, 400);
    ck_assert_int_eq(applied, 2 * (400 - from));
}
END_TEST

START_TEST(async_applies_every_push_as_a_step)
{
    cluster c;
    long step, applied, dropped;
    /* enough steps that worker 1 joins before the chief alone finishes */
    const char *const sets[] = { "train.max_steps=300", NULL };
    cluster_init(&c, 1, 2, ", \"mode\": \"async\"", "as");
    cluster_start(&c, sets);
    cluster_wait_ok(&c);
    ck_assert(log_has(&c, "ps0", "async mode"));
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_ge(step, 300);
    ck_assert_int_le(step, 301);         /* the other replica's last push */
    ck_assert_int_eq(applied, step);
    ck_assert_int_eq(dropped, 0);
    ck_assert(eval_accuracy(tu_path("run")) > 0.5);
}
END_TEST

/* Worker index 2 of a TF_CONFIG with one more worker than the cluster
 * started with (its own port added). */
static pid_t
start_extra_worker(cluster *c, const char *const *sets)
{
    pid_t pid;
    c->w_port[c->n_workers] = tu_held_port();
    c->n_workers++;
    pid = start_task(c, "worker", c->n_workers - 1, sets, NULL);
    c->n_workers--;
    return pid;
}

START_TEST(async_worker_joins_with_a_new_index_and_leaves_without_a_stall)
{
    cluster c;
    const char *const sets[] = { "train.max_steps=1000000",
                                 "hooks.log_every_steps=1",
                                 "cluster.dead_after_ms=1500", NULL };
    long step, applied, dropped;
    char *log;
    pid_t extra;
    cluster_init(&c, 1, 2, ", \"mode\": \"async\"", "jl");
    cluster_start(&c, sets);
    ck_assert(wait_step(c.chief_fd, 20));
    extra = start_extra_worker(&c, sets);
    ck_assert_msg(wait_log(&c, "ps0", "worker 2 joined (async: not in the "
                           "cluster spec"), "%s", log_tail(&c, "ps0"));
    /* its pushes are applied: it trains past its first pull */
    ck_assert_msg(wait_log(&c, "worker2", "model ready"), "%s",
                  log_tail(&c, "worker2"));
    ck_assert_msg(wait_log(&c, "worker2", "step "), "%s",
                  log_tail(&c, "worker2"));
    ck_assert_int_eq(kill(extra, SIGKILL), 0);
    ck_assert_int_ne(tu_wait(extra, RUN_MS), 0);
    ck_assert_msg(wait_log(&c, "ps0", "worker 2 left: silent"), "%s",
                  log_tail(&c, "ps0"));
    /* nobody waits for it: the chief goes on */
    log = tu_read_file(tu_path("jl-ps0.log"), NULL);
    ck_assert_ptr_null(strstr(log, "rejected a request from task worker"));
    free(log);
    ck_assert(wait_step(c.chief_fd, 200));
    ck_assert_int_eq(kill(c.w[0], SIGTERM), 0);
    cluster_wait_ok(&c);
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_eq(applied, step);
    ck_assert_int_eq(dropped, 0);
}
END_TEST

/* A job of `extra` (TF_CONFIG's tail) and sets refuses a worker index
 * beyond its spec: that worker exits 1 with why in its log. */
static void
refuses_an_extra_worker(const char *extra, const char *tag,
                        const char *const *sets, const char *why)
{
    cluster c;
    pid_t pid;
    cluster_init(&c, 1, 2, extra, tag);
    cluster_start(&c, sets);
    ck_assert(wait_step(c.chief_fd, 5));
    pid = start_extra_worker(&c, sets);
    ck_assert_int_eq(tu_wait(pid, RUN_MS), 1);
    ck_assert_msg(log_has(&c, "worker2", why), "%s",
                  log_tail(&c, "worker2"));
    ck_assert_int_eq(kill(c.w[0], SIGTERM), 0);
    cluster_wait_ok(&c);
}

START_TEST(sync_refuses_a_worker_index_beyond_its_replicas)
{
    const char *const sets[] = { "train.max_steps=1000000", NULL };
    refuses_an_extra_worker("", "sr", sets, "sync mode keeps this fixed "
                            "count");
}
END_TEST

/* A local-step rule stops with local steps not committed: model averaging
 * with window 4 and last step 10 commits rounds at local steps 4 and 8,
 * so the ps counts 2 rounds x 4 = 8 steps and the chief's final
 * checkpoint (the center) is at step 8, not 10. The chief reached its
 * last step: every task exits 0 (it used to exit 1, "before its last
 * step", and a launcher then restarted it against stopped ps). A save
 * every 5 steps makes the chief pull the center (step 8) at its last
 * step, as an epoch's end does: it still exits 0. */
START_TEST(local_step_rule_ends_with_unsent_steps_and_exits_0)
{
    const char *const sets[] = { "train.max_steps=10",
                                 "algorithm.name=model_averaging",
                                 "algorithm.window=4",
                                 "algorithm.learning_rate=0.05",
                                 "checkpoint.save_steps=5", NULL };
    cluster c;
    long step, applied, dropped;
    cluster_init(&c, 1, 2, NULL, "ma");
    cluster_start(&c, sets);
    cluster_wait_ok(&c);
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_eq(step, 8);
    ck_assert_int_eq(applied, 2 * 2);          /* 2 rounds x 2 replicas */
    ck_assert_int_gt(tu_file_size(tu_path("run/model.ckpt-8.h5")), 0);
    ck_assert_int_lt(tu_file_size(tu_path("run/model.ckpt-10.h5")), 0);
    ck_assert_msg(log_has(&c, "worker0", "training ended (stop requested) "
                          "at step 8 (the parameter servers' committed "
                          "steps; this replica stopped at step 10)"),
                  "%s", log_tail(&c, "worker0"));
}
END_TEST

/* dynsgd's ps keeps each starting replica's pull clock: an async job
 * under it refuses a worker beyond its spec, naming the rule. */
START_TEST(dynsgd_refuses_a_worker_index_beyond_its_replicas)
{
    const char *const sets[] = { "train.max_steps=1000000",
                                 "algorithm.name=dynsgd", NULL };
    refuses_an_extra_worker(", \"mode\": \"async\"", "dr", sets,
                            "keeps state per replica the job started with "
                            "(dynsgd, adag)");
}
END_TEST

/* Start task (type, index) of c as tests/cluster_child (a user's own
 * program) checkpointing into dir, with one more environment variable
 * env_set ("K=V") or none: its output to <tag>-<type><index>.log, which
 * exists (empty) when this returns, so that it can be polled at once. */
static pid_t
start_child(cluster *c, const char *type, int index, const char *dir,
            const char *env_set)
{
    char tf[2048], log[64], prog[4200], d[4200], path[4200];
    char *env[] = { tf, (char *)env_set, NULL };
    char *argv[] = { prog, d, "1000000", NULL };
    TU_SNPRINTF(prog, sizeof prog, "%s", tu_build_path("tests/cluster_child"));
    TU_SNPRINTF(d, sizeof d, "%s", dir);
    tf_config(c, type, index, tf, sizeof tf);
    snprintf(log, sizeof log, "%s-%s%d.log", c->tag, type, index);
    TU_SNPRINTF(path, sizeof path, "%s", tu_path(log));
    tu_write_file(path, "", 0);      /* the child appends to it */
    return tu_spawn(argv, env, path);
}

/* A sync job of cluster_child: one ps, the chief (worker 0), workers 1
 * and 2; worker 2 with env_set. */
static void
child_cluster_start(cluster *c, const char *tag, const char *env_set)
{
    char dir[4200];
    TU_SNPRINTF(dir, sizeof dir, "%s/%s", tu_dir, tag);
    cluster_init(c, 1, 3, NULL, tag);
    c->ps[0] = start_child(c, "ps", 0, dir, NULL);
    c->w[0] = start_child(c, "worker", 0, dir, NULL);
    c->w[1] = start_child(c, "worker", 1, dir, NULL);
    c->w[2] = start_child(c, "worker", 2, dir, env_set);
}

/* The step in a task's "final_step N reason R" line. */
static long
final_step(const cluster *c, const char *task)
{
    char log[64];
    char *text, *p;
    long step = -1;
    snprintf(log, sizeof log, "%s-%s.log", c->tag, task);
    text = tu_read_file(tu_path(log), NULL);
    p = strstr(text, "final_step ");
    ck_assert_msg(p != NULL && sscanf(p, "final_step %ld", &step) == 1,
                  "%s has no final step: %s", task, tu_tail(text, 1000));
    free(text);
    return step;
}

/* A replica's own stop request in a sync job (an early-stopping hook in
 * session.hooks that fires on worker 2 only, at step 30): every replica
 * ends its session at step 30 as for a stop request and exits 0 at once,
 * the chief after its final checkpoint of step 30 and the ps after its
 * SHUTDOWN, instead of waiting for worker 2's next push until
 * cluster.step_timeout_secs (an hour). */
START_TEST(sync_replica_stop_request_stops_every_replica_at_its_step)
{
    cluster c;
    long step, applied, dropped;
    child_cluster_start(&c, "s", "CHILD_STOP_AT=30");
    cluster_wait_ok(&c);
    for (int i = 0; i < 3; i++) {
        char task[16];
        snprintf(task, sizeof task, "worker%d", i);
        ck_assert_msg(log_has(&c, task, "final_step 30 reason stop "
                              "requested"), "%s: %s", task,
                      log_tail(&c, task));
    }
    ck_assert_msg(log_has(&c, "worker0", "worker 2 ended its session at "
                          "step 30 (stop requested)"), "%s",
                  log_tail(&c, "worker0"));
    ck_assert(log_has(&c, "worker0", "saved checkpoint for step 30"));
    ck_assert(log_has(&c, "ps0", "worker 2 ended its session at step 30"));
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_eq(step, 30);
    ck_assert_int_eq(applied, 3 * 30);
}
END_TEST

/* Preemption while a sync step waits for a replica that does not come
 * (worker 2 SIGSTOPped, no backups): SIGTERM gives a waiting worker's step
 * up at once (exit 0, nothing to save), then the chief's, which saves the
 * final checkpoint of the last completed step and stops the ps; every
 * task exits 0 well within keel launch's grace period. */
START_TEST(sigterm_ends_a_sync_step_waiting_for_a_stopped_replica)
{
    cluster c;
    long step, applied, dropped, last;
    char ck[64];
    int64_t t0;
    child_cluster_start(&c, "p", NULL);
    ck_assert_msg(wait_log(&c, "worker0", "step 20\n"), "%s",
                  log_tail(&c, "worker0"));
    ck_assert_int_eq(kill(c.w[2], SIGSTOP), 0);
    usleep(500000);                 /* the next step waits for worker 2 */
    ck_assert_int_eq(kill(c.w[1], SIGTERM), 0);
    t0 = tu_now_ms();
    ck_assert_msg(tu_wait(c.w[1], 10000) == 0, "worker 1 did not exit 0: "
                  "%s", log_tail(&c, "worker1"));
    ck_assert(log_has(&c, "worker1", "reason signal"));
    ck_assert_int_eq(kill(c.w[0], SIGTERM), 0);
    ck_assert_msg(tu_wait(c.w[0], 10000) == 0, "the chief did not exit 0: "
                  "%s", log_tail(&c, "worker0"));
    ck_assert_int_lt(tu_now_ms() - t0, 20000);
    ck_assert(log_has(&c, "worker0", "reason signal"));
    last = final_step(&c, "worker0");
    ck_assert_int_ge(last, 20);
    snprintf(ck, sizeof ck, "saved checkpoint for step %ld", last);
    ck_assert_msg(log_has(&c, "worker0", ck), "%s", log_tail(&c, "worker0"));
    ck_assert_msg(tu_wait(c.ps[0], 10000) == 0, "ps: %s",
                  log_tail(&c, "ps0"));
    ps_stats(&c, 0, &step, &applied, &dropped);
    ck_assert_int_eq(step, last);
    ck_assert_int_eq(applied, 3 * last);
    tu_kill(c.w[2]);
}
END_TEST


/* A ps and a chief whose addresses name their host by host (a name, or an
 * IPv6 literal): both train to the end and exit 0. */
static void
train_on_host(const char *host, const char *tag)
{
    cluster c;
    char dir[300];
    const char *const sets[] = { dir, NULL };
    int st;
    TU_SNPRINTF(dir, sizeof dir, "checkpoint.dir=%s/%s", tu_dir, tag);
    cluster_init(&c, 1, 1, NULL, tag);
    snprintf(c.host, sizeof c.host, "%s", host);
    cluster_start(&c, sets);
    st = tu_wait(c.w[0], RUN_MS);
    ck_assert_msg(st == 0, "%s: chief exited %d: %s", host, st,
                  log_tail(&c, "worker0"));
    ck_assert_msg(tu_wait(c.ps[0], RUN_MS) == 0, "%s: ps: %s", host,
                  log_tail(&c, "ps0"));
    ck_assert_msg(log_has(&c, "worker0", "step 40"), "%s: %s", host,
                  log_tail(&c, "worker0"));
    if (c.chief_fd >= 0)
        close(c.chief_fd);
}

/* 1 when this machine can listen on ::1. */
static int
ipv6_loopback_works(void)
{
    struct sockaddr_in6 a;
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;
    if (fd < 0)
        return 0;
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

START_TEST(ps_and_chief_train_by_localhost_host_name_and_ipv6)
{
    char name[256];
    struct addrinfo *res = NULL;
    train_on_host("localhost", "localhost");
    if (gethostname(name, sizeof name) == 0 &&
        getaddrinfo(name, NULL, NULL, &res) == 0) {
        freeaddrinfo(res);
        train_on_host(name, "hostname");
    } else {
        fprintf(stderr, "it_cluster: skipping the host name run: this "
                "machine's name does not resolve\n");
    }
    if (ipv6_loopback_works())
        train_on_host("[::1]", "ipv6");
    else
        fprintf(stderr, "it_cluster: skipping the [::1] run: no IPv6 "
                "loopback\n");
}
END_TEST

/* keel train of task (a TF_CONFIG task) with cluster: exit 2 with a
 * message naming every needle. */
static void
exits_2_naming(const char *cluster_json, const char *task,
               const char *const *needles)
{
    char tf[1024];
    /* a name that does not resolve is waited for up to max_wait_secs */
    char *argv[] = { (char *)tu_build_path("keel"), "train",
                     (char *)cfg_path, "-s", "cluster.max_wait_secs=1",
                     NULL };
    char *env[] = { tf, NULL };
    TU_SNPRINTF(tf, sizeof tf, "TF_CONFIG={\"cluster\": %s, \"task\": %s}",
                cluster_json, task);
    ck_assert_int_eq(tu_run(argv, env, RUN_MS, out, sizeof out, err,
                            sizeof err), 2);
    for (size_t i = 0; needles[i] != NULL; i++)
        ck_assert_msg(strstr(err, needles[i]) != NULL, "no '%s' in: %s",
                      needles[i], err);
}

/* An unresolvable host, a ps entry on another machine, two names of one
 * address and a wildcard each stop a task at start with exit 2, naming
 * the task and the host. */
START_TEST(bad_hosts_exit_2_at_start_naming_task_and_host)
{
    char cl[512];
    int p1 = tu_held_port(), p2 = tu_held_port();
    const char *const unres[] = { "ps 0", "no-such-host.invalid",
                                  "does not resolve", NULL };
    const char *const foreign[] = { "ps 0", "198.51.100.7",
                                    "no address of this machine", NULL };
    const char *const shared[] = { "ps 0", "worker 0", "one address",
                                   NULL };
    const char *const wildcard[] = { "wildcard", "bind_address", NULL };
    TU_SNPRINTF(cl, sizeof cl, "{\"ps\": [\"no-such-host.invalid:%d\"], "
                "\"worker\": [\"127.0.0.1:%d\"]}", p1, p2);
    exits_2_naming(cl, "{\"type\": \"worker\", \"index\": 0}", unres);
    exits_2_naming(cl, "{\"type\": \"ps\", \"index\": 0}", unres);
    TU_SNPRINTF(cl, sizeof cl, "{\"ps\": [\"198.51.100.7:%d\"], "
                "\"worker\": [\"127.0.0.1:%d\"]}", p1, p2);
    exits_2_naming(cl, "{\"type\": \"ps\", \"index\": 0}", foreign);
    TU_SNPRINTF(cl, sizeof cl, "{\"ps\": [\"localhost:%d\"], "
                "\"worker\": [\"127.0.0.1:%d\"]}", p1, p1);
    exits_2_naming(cl, "{\"type\": \"worker\", \"index\": 0}", shared);
    TU_SNPRINTF(cl, sizeof cl, "{\"ps\": [\"*:%d\"], "
                "\"worker\": [\"127.0.0.1:%d\"]}", p1, p2);
    exits_2_naming(cl, "{\"type\": \"ps\", \"index\": 0}", wildcard);
}
END_TEST

/* keel train with env added: exit 2 at once (well before max_wait_secs)
 * with a message naming every needle. */
static void
env_exits_2_naming(char *const *env, const char *const *needles)
{
    char *argv[] = { (char *)tu_build_path("keel"), "train",
                     (char *)cfg_path, "-s", "cluster.max_wait_secs=30",
                     NULL };
    int64_t t0 = tu_now_ms();
    ck_assert_int_eq(tu_run(argv, env, RUN_MS, out, sizeof out, err,
                            sizeof err), 2);
    ck_assert_msg(tu_now_ms() - t0 < 20000, "exit 2 only after %lld ms",
                  (long long)(tu_now_ms() - t0));
    ck_assert_msg(strstr(err, "keel: cluster: ") != NULL, "%s", err);
    for (size_t i = 0; needles[i] != NULL; i++)
        ck_assert_msg(strstr(err, needles[i]) != NULL, "no '%s' in: %s",
                      needles[i], err);
}

/* Bad input from the schedulers (docs/deploy.md, "Bad input"): a task
 * listed twice in TF_CONFIG, a Slurm node list that does not parse, more
 * Slurm tasks than the nodes give, a node listed twice, too few reserved
 * ports; each stops keel train at start with exit 2 naming the job, the
 * task or the variable. Unresolvable hosts and shared addresses:
 * bad_hosts_exit_2_at_start_naming_task_and_host. */
START_TEST(bad_cluster_input_exits_2_through_keel_train)
{
    char tf[512];
    int p1 = tu_held_port(), p2 = tu_held_port(), p3 = tu_held_port();
    char *twice[] = { tf, NULL };
    char *nodelist[] = { "SLURM_PROCID=1", "SLURM_NTASKS=3",
                         "SLURM_JOB_NODELIST=node[01-03,]", NULL };
    char *too_many[] = { "SLURM_PROCID=1", "SLURM_NTASKS=3",
                         "SLURM_JOB_NODELIST=localhost",
                         "SLURM_TASKS_PER_NODE=2", NULL };
    char *node_twice[] = { "SLURM_PROCID=1", "SLURM_NTASKS=2",
                           "SLURM_JOB_NODELIST=localhost,localhost",
                           "SLURM_TASKS_PER_NODE=1(x2)", NULL };
    char *ports[] = { "SLURM_PROCID=1", "SLURM_NTASKS=3",
                      "SLURM_JOB_NODELIST=localhost",
                      "SLURM_TASKS_PER_NODE=3",
                      "SLURM_STEP_RESV_PORTS=12000", NULL };
    const char *const n_twice[] = { "TF_CONFIG", "cluster job 'worker' "
                                    "given twice", NULL };
    const char *const n_index[] = { "TF_CONFIG", "cluster.worker index 1 "
                                    "given twice", NULL };
    const char *const n_nodelist[] = { "SLURM_JOB_NODELIST",
                                       "node[01-03,]", NULL };
    const char *const n_too_many[] = { "tasks per node sum to 2",
                                       "SLURM_NTASKS is 3", NULL };
    const char *const n_node_twice[] = { "duplicate address "
                                         "'localhost:", NULL };
    const char *const n_ports[] = { "SLURM_STEP_RESV_PORTS", "localhost",
                                    "3 tasks", NULL };
    TU_SNPRINTF(tf, sizeof tf, "TF_CONFIG={\"cluster\": {\"worker\": "
                "[\"127.0.0.1:%d\"], \"ps\": [\"127.0.0.1:%d\"], "
                "\"worker\": [\"127.0.0.1:%d\"]}, \"task\": {\"type\": "
                "\"worker\", \"index\": 0}}", p1, p2, p3);
    env_exits_2_naming(twice, n_twice);
    TU_SNPRINTF(tf, sizeof tf, "TF_CONFIG={\"cluster\": {\"worker\": "
                "{\"0\": \"127.0.0.1:%d\", \"1\": \"127.0.0.1:%d\", "
                "\"1\": \"127.0.0.1:%d\"}}, \"task\": {\"type\": "
                "\"worker\", \"index\": 0}}", p1, p2, p3);
    env_exits_2_naming(twice, n_index);
    env_exits_2_naming(nodelist, n_nodelist);
    env_exits_2_naming(too_many, n_too_many);
    env_exits_2_naming(node_twice, n_node_twice);
    env_exits_2_naming(ports, n_ports);
}
END_TEST

/* A chief whose ps is not up names it (task and address) while it
 * waits, from the start. */
START_TEST(chief_waiting_for_a_ps_names_it)
{
    cluster c;
    char want[128];
    int64_t deadline = tu_now_ms() + 15000;
    cluster_init(&c, 1, 1, NULL, "nops");
    c.w[0] = start_task(&c, "worker", 0, NULL, NULL);
    TU_SNPRINTF(want, sizeof want, "waiting for ps 0 (127.0.0.1:%d)",
                c.ps_port[0]);
    while (tu_now_ms() < deadline &&
           (access(tu_path("nops-worker0.log"), F_OK) != 0 ||
            !log_has(&c, "worker0", want)))
        usleep(100000);
    ck_assert_msg(log_has(&c, "worker0", want), "no '%s' in: %s", want,
                  log_tail(&c, "worker0"));
    tu_kill(c.w[0]);
}
END_TEST

/* checkpoint.sharded=on: every checkpoint of a 2-ps sync job is an index
 * and 2 shards, each ps writing its own; keel ckpt verify and a
 * one-process eval read it; the shards hold every variable and slot (the
 * run resumes from them in one process, bitwise like the cluster's). */
START_TEST(sharded_checkpoints_are_an_index_and_one_shard_per_ps)
{
    cluster c;
    const char *const sets[] = { "checkpoint.sharded=on", NULL };
    char index[512], shard[512];
    cluster_init(&c, 2, 2, NULL, "sh");
    cluster_start(&c, sets);
    cluster_wait_ok(&c);
    for (int step = 20; step <= 40; step += 20) {
        TU_SNPRINTF(index, sizeof index, "%s/run/model.ckpt-%d.h5", tu_dir,
                    step);
        ck_assert_msg(access(index, F_OK) == 0, "%s", index);
        for (int k = 0; k < 2; k++) {
            TU_SNPRINTF(shard, sizeof shard, "%s/run/model.ckpt-%d.shard-"
                        "%05d-of-00002.h5", tu_dir, step, k);
            ck_assert_msg(access(shard, F_OK) == 0, "%s", shard);
        }
    }
    ck_assert(log_has(&c, "ps0", "ps 0: wrote shard 0 of 2 of step 40"));
    ck_assert(log_has(&c, "ps1", "ps 1: wrote shard 1 of 2 of step 40"));
    ck_assert(log_has(&c, "worker0", "shards of step 40 are written"));
    ck_assert_int_eq(TU_KEEL(RUN_MS, "ckpt", "verify", index), 0);
    ck_assert(eval_accuracy(tu_path("run")) > 0.5);
    ck_assert_int_eq((int)tu_json_number(out, "step"), 40);
    /* a chief killed after the shards, before the index: step 40's shards
     * without their index are no checkpoint, the previous one is read */
    ck_assert_int_eq(unlink(index), 0);
    ck_assert(eval_accuracy(tu_path("run")) > 0.5);
    ck_assert_int_eq((int)tu_json_number(out, "step"), 20);
}
END_TEST

/* checkpoint.sharded=on, a ps killed and restarted: the run restores
 * from the newest sharded checkpoint and ends at its last step, every
 * step after the checkpoint applied once. */
START_TEST(sharded_ps_restarted_restores_from_the_newest_checkpoint)
{
    cluster c;
    const char *const sets[] = { "train.max_steps=400",
                                 "checkpoint.save_steps=50",
                                 "checkpoint.sharded=on",
                                 "hooks.log_every_steps=1",
                                 "cluster.dead_after_ms=1000", NULL };
    long step, applied, dropped;
    cluster_init(&c, 2, 2, NULL, "sq");
    cluster_start(&c, sets);
    ck_assert(wait_step(c.chief_fd, 120));
    tu_kill(c.ps[1]);
    snprintf(c.tag, sizeof c.tag, "sq2");
    c.ps[1] = start_task(&c, "ps", 1, sets, NULL);
    cluster_wait_ok(&c);
    ck_assert(log_has(&c, "ps1", "wrote shard 1 of 2 of step 400"));
    ps_stats(&c, 1, &step, &applied, &dropped);
    ck_assert_int_eq(step, 400);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "ckpt", "verify",
                             tu_path("run/model.ckpt-400.h5")), 0);
}
END_TEST

/* A copy of <tu_dir>/<from> as <tu_dir>/<to> (cp -a). */
static void
copy_run(const char *from, const char *to)
{
    char a[4200], b[4200];
    char *argv[] = { "/bin/cp", "-a", a, b, NULL };
    TU_SNPRINTF(a, sizeof a, "%s/%s", tu_dir, from);
    TU_SNPRINTF(b, sizeof b, "%s/%s", tu_dir, to);
    ck_assert_int_eq(tu_run(argv, NULL, RUN_MS, NULL, 0, NULL, 0), 0);
}

/* A sharded checkpoint of 2 ps restores without the values passing
 * through the chief: restored by 2 ps, each reads its own variables and
 * slots from the checkpoint (the chief's INIT carries 0.0 MiB); by 1 ps,
 * which reads all of them through the index's links into both shards;
 * and by one process. The three runs then train the same steps to the
 * same bits (micro-batches make 2 workers one process's arithmetic). */
START_TEST(sharded_checkpoint_is_read_by_each_ps_in_any_placement)
{
    cluster c;
    char d[4200], a[4200], b[4200];
    const char *sets[] = { "train.micro_batch=8", "checkpoint.sharded=on",
                           NULL, NULL, NULL };
    const char *const tags[] = { "sr1", "sr0" };
    sets[2] = d;
    run_into(&c, 2, 2, "sr", d, sizeof d, sets);
    copy_run("sr", "sr1");
    copy_run("sr", "sr0");
    sets[3] = "train.max_steps=60";
    /* 2 ps: each its own shard */
    run_into(&c, 2, 2, "sr", d, sizeof d, sets);
    ck_assert_msg(log_has(&c, "ps0", "ps 0: read 1 variables and ") &&
                  log_has(&c, "ps0", " of step 40 from "), "%s",
                  log_tail(&c, "ps0"));
    ck_assert_msg(log_has(&c, "ps1", "ps 1: read 3 variables and ") &&
                  log_has(&c, "ps1", "(no values through the chief)"), "%s",
                  log_tail(&c, "ps1"));
    ck_assert_msg(log_has(&c, "worker0", "2 parameter server(s) read their "
                          "variables and slots from model.ckpt-40.h5") &&
                  log_has(&c, "worker0", "(INIT of 0.0 MiB in "), "%s",
                  log_tail(&c, "worker0"));
    /* 1 ps: every variable through the index, from both shards */
    run_into(&c, 1, 2, tags[0], d, sizeof d, sets);
    ck_assert_msg(log_has(&c, "ps0", "ps 0: read 4 variables and ") &&
                  log_has(&c, "ps0", " of step 40 from "), "%s",
                  log_tail(&c, "ps0"));
    ck_assert(log_has(&c, "worker0", "(INIT of 0.0 MiB in "));
    /* one process */
    TU_SNPRINTF(d, sizeof d, "checkpoint.dir=%s/%s", tu_dir, tags[1]);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "train", cfg_path, "-s", sets[0], "-s",
                             d, "-s", sets[3]), 0);
    TU_SNPRINTF(a, sizeof a, "%s/sr/model.ckpt-60.h5", tu_dir);
    for (int i = 0; i < 2; i++) {
        TU_SNPRINTF(b, sizeof b, "%s/%s/model.ckpt-60.h5", tu_dir, tags[i]);
        ck_assert_msg(tu_keel(RUN_MS, out, sizeof out, err, sizeof err,
                              "ckpt", "diff", a, b, NULL) == 0,
                      "2 ps vs %s: %s %s", tags[i], out, err);
    }
    ck_assert_int_eq(TU_KEEL(RUN_MS, "ckpt", "verify", a), 0);
}
END_TEST

/* The newest entry of dir's state file (model_checkpoint_path), into
 * name. */
static void
newest_entry(const char *dir, char *name, size_t size)
{
    char path[4200];
    char *text, *p, *q;
    TU_SNPRINTF(path, sizeof path, "%s/%s/checkpoint", tu_dir, dir);
    text = tu_read_file(path, NULL);
    p = strstr(text, "model_checkpoint_path: \"");
    ck_assert_msg(p != NULL, "%s: %s", path, text);
    p += strlen("model_checkpoint_path: \"");
    q = strchr(p, '"');
    ck_assert(q != NULL && (size_t)(q - p) < size);
    memcpy(name, p, (size_t)(q - p));
    name[q - p] = '\0';
    free(text);
}

/* Start the cluster's tasks; the chief pauses before each index until
 * the file pause is removed (KEEL_TEST_PAUSE_BEFORE_INDEX). */
static void
cluster_start_paused(cluster *c, const char *const *sets, const char *pause)
{
    char tf[2048], env_pause[4200], log[64];
    char *env[] = { tf, env_pause, NULL };
    for (int i = 0; i < c->n_ps; i++)
        c->ps[i] = start_task(c, "ps", i, sets, NULL);
    TU_SNPRINTF(env_pause, sizeof env_pause,
                "KEEL_TEST_PAUSE_BEFORE_INDEX=%s", pause);
    tf_config(c, "worker", 0, tf, sizeof tf);
    snprintf(log, sizeof log, "%s-worker0.log", c->tag);
    c->w[0] = tu_spawn_train(cfg_path, sets, env, tu_path(log), NULL);
    for (int i = 1; i < c->n_workers; i++)
        c->w[i] = start_task(c, "worker", i, sets, NULL);
}

/* The step in the pause file once the chief paused at a step >= min (the
 * pauses before are let go), or -1 after RUN_MS. */
static long
wait_pause(const char *pause, long min)
{
    int64_t deadline = tu_now_ms() + RUN_MS;
    while (tu_now_ms() < deadline) {
        char *text;
        long step = -1;
        if (access(pause, F_OK) != 0) {
            usleep(10000);
            continue;
        }
        text = tu_read_file(pause, NULL);
        if (sscanf(text, "%ld", &step) != 1)
            step = -1;          /* being written */
        free(text);
        if (step >= min)
            return step;
        if (step >= 0)
            unlink(pause);
        usleep(10000);
    }
    return -1;
}

/* One trial: a 2-ps sharded job's chief pauses between step 40's shards
 * and its index; the chief (kill_chief) or ps 1 is SIGKILLed there, then
 * the job. Whatever died, `keel ckpt verify` passes, the state file's
 * newest entry is a whole checkpoint (40 when the chief committed it, 20
 * when it died first), and the job restarted resumes from it, each ps
 * reading its own shard, to step 60. */
static void
kill_before_index(int trial, int kill_chief)
{
    cluster c;
    char d[4200], pause[4200], tag[16], newest[256], want[64], path[4200];
    const char *const sets[] = { "checkpoint.sharded=on",
                                 "train.max_steps=60", d, NULL };
    long step;
    snprintf(tag, sizeof tag, "kt%d", trial % 100000);
    TU_SNPRINTF(d, sizeof d, "checkpoint.dir=%s/%s", tu_dir, tag);
    TU_SNPRINTF(pause, sizeof pause, "%s/%s.pause", tu_dir, tag);
    cluster_init(&c, 2, 2, NULL, tag);
    cluster_start_paused(&c, sets, pause);
    step = wait_pause(pause, 40);
    ck_assert_msg(step == 40, "trial %d: no pause at step 40: %s", trial,
                  log_tail(&c, "worker0"));
    if (kill_chief) {
        tu_kill(c.w[0]);
        tu_kill(c.ps[1]);
    } else {
        tu_kill(c.ps[1]);
        unlink(pause);              /* the chief commits step 40 */
        ck_assert_msg(wait_log(&c, "worker0", "saved checkpoint for step "
                               "40"), "trial %d: %s", trial,
                      log_tail(&c, "worker0"));
        tu_kill(c.w[0]);
    }
    tu_kill(c.w[1]);
    tu_kill(c.ps[0]);
    unlink(pause);
    TU_SNPRINTF(path, sizeof path, "%s/%s", tu_dir, tag);
    ck_assert_msg(tu_keel(RUN_MS, out, sizeof out, err, sizeof err, "ckpt",
                          "verify", path, NULL) == 0, "trial %d: %s %s",
                  trial, out, err);
    newest_entry(tag, newest, sizeof newest);
    snprintf(want, sizeof want, "model.ckpt-%d.h5", kill_chief ? 20 : 40);
    ck_assert_msg(strcmp(newest, want) == 0, "trial %d: newest %s, want %s",
                  trial, newest, want);
    TU_SNPRINTF(path, sizeof path, "%s/%s/%s", tu_dir, tag, newest);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "ckpt", "verify", path), 0);
    /* the whole job again: it resumes from that checkpoint */
    snprintf(c.tag, sizeof c.tag, "kt%dr", trial % 100000);
    cluster_start(&c, sets);
    cluster_wait_ok(&c);
    snprintf(want, sizeof want, " of step %d from ", kill_chief ? 20 : 40);
    ck_assert_msg(log_has(&c, "ps0", want) && log_has(&c, "ps1", want),
                  "trial %d: %s", trial, log_tail(&c, "ps1"));
    TU_SNPRINTF(path, sizeof path, "%s/%s/model.ckpt-60.h5", tu_dir, tag);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "ckpt", "verify", path), 0);
}

/* Trials of kill_before_index, the chief and ps 1 in turn:
 * KEEL_SHARD_KILL_TRIALS of them (default 2; `make check-long` runs
 * tests/sharded_kills.sh, hundreds). */
static int
kill_trials(void)
{
    const char *v = getenv("KEEL_SHARD_KILL_TRIALS");
    int n = v != NULL ? atoi(v) : 2;
    return n > 0 ? n : 2;
}

START_TEST(sharded_kill_between_shards_and_index_leaves_a_whole_checkpoint)
{
    for (int t = 0; t < kill_trials(); t++) {
        kill_before_index(t, t % 2 == 0);
        if (t + 1 < kill_trials()) {
            char path[4200];
            /* the trials' files would fill a long run's tu_dir */
            TU_SNPRINTF(path, sizeof path, "%s/kt%d", tu_dir, t);
            tu_rmrf(path);
        }
    }
}
END_TEST

static Suite *
suite(void)
{
    Suite *s = suite_create("it_cluster");
    tu_tcase(s, "cluster", 90, setup, tu_teardown, TU_TESTS(
        sync_1ps_2workers_trains_like_one_process,
        sync_rerun_is_bitwise_identical,
        async_applies_every_push_as_a_step,
        async_worker_joins_with_a_new_index_and_leaves_without_a_stall,
        sync_refuses_a_worker_index_beyond_its_replicas,
        dynsgd_refuses_a_worker_index_beyond_its_replicas,
        local_step_rule_ends_with_unsent_steps_and_exits_0,
        micro_batches_give_identical_bits_for_1_2_and_4_workers,
        backup_worker_stopped_training_goes_on,
        backup_workers_stale_drops_are_logged_per_interval,
        two_ps_split_and_restore_into_1_3_and_no_cluster,
        chief_killed_and_restarted_rejoins_without_rollback,
        chief_sigterm_stops_everyone_with_exit_0,
        sync_replica_stop_request_stops_every_replica_at_its_step,
        sigterm_ends_a_sync_step_waiting_for_a_stopped_replica,
        ps_restarted_is_reinitialized_from_checkpoint,
        worker_losing_the_ps_fails_clearly,
        sigterm_while_waiting_for_the_chief_exits_0_at_once,
        bad_tf_config_exits_2_listing_problems,
        replica_counts_beyond_the_cluster_exit_2_at_start,
        config_check_prints_the_role_from_tf_config_slurm_and_lists,
        curve_worker_without_allowed_key_cannot_join));
    tu_tcase(s, "sharded", 120, setup, tu_teardown, TU_TESTS(
        sharded_checkpoints_are_an_index_and_one_shard_per_ps,
        sharded_ps_restarted_restores_from_the_newest_checkpoint,
        sharded_checkpoint_is_read_by_each_ps_in_any_placement));
    tu_tcase(s, "sharded_kill", 60 + 40 * kill_trials(), setup, tu_teardown,
             TU_TESTS(
        sharded_kill_between_shards_and_index_leaves_a_whole_checkpoint));
    tu_tcase(s, "hosts", 150, setup, tu_teardown, TU_TESTS(
        ps_and_chief_train_by_localhost_host_name_and_ipv6,
        bad_hosts_exit_2_at_start_naming_task_and_host,
        bad_cluster_input_exits_2_through_keel_train,
        chief_waiting_for_a_ps_names_it));
    return s;
}

KEEL_TEST_MAIN(suite)
