/* cmd_launch.c - `keel launch CONFIG` and `keel launch [options] --
 * PROGRAM [ARGS...]`: run a whole cluster (ps, chief, workers) of `keel
 * train` processes, or of any program that reads TF_CONFIG, on this
 * machine through keel_launch; prefixes their lines with the task name,
 * draws a live status block on a terminal, forwards SIGINT/SIGTERM and
 * exits with the chief's status. */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keel/keel.h>
#include <keel/launch.h>
#include "cli.h"

#define MAX_OVERRIDES 256

static int
launch_usage(FILE *out, int code)
{
    fprintf(out,
            "usage: keel launch CONFIG [--ps N] [--workers N] "
            "[--max-restarts N]\n"
            "                   [--chaos SEED[,PERIOD]] [--chaos-targets "
            "LIST]\n"
            "                   [--grace SECS] [--backoff SECS] [--no-status]"
            "\n"
            "                   [--evaluator] [--strategy NAME]\n"
            "                   [-s section.key=value]... [-v]\n"
            "       keel launch [options] [--output-dir DIR] [--async]\n"
            "                   [--replicas-to-aggregate N] -- PROGRAM "
            "[ARGS...]\n"
            "\n"
            "Run a local cluster of `keel train CONFIG` processes: N ps, a\n"
            "chief, N workers (and an evaluator) on 127.0.0.1 (free ports,\n"
            "one TF_CONFIG each), sharing OUTPUT_DIR (default: the config's\n"
            "checkpoint.dir). Lines are prefixed with the task name; per-task\n"
            "logs go to OUTPUT_DIR/logs/<task>.log. A failed task is\n"
            "restarted; when the chief finishes the rest are stopped.\n"
            "SIGINT/SIGTERM stop every task gracefully (twice: at once).\n"
            "An async job scales while it runs: SIGUSR1 adds a worker (the\n"
            "next index), SIGUSR2 stops the last one added.\n"
            "Exit status: the chief's (0 or 1); 2 for usage/config errors.\n"
            "\n"
            "With -- PROGRAM, every task runs PROGRAM ARGS instead (found on\n"
            "PATH unless it names a path), with its TF_CONFIG (task, cluster,\n"
            "mode) and OUTPUT_DIR in the environment, as torchrun runs a\n"
            "script; every option below but -s and -v applies.\n"
            "\n"
            "  --ps N               parameter servers (0..%d, default 0)\n"
            "  --workers N          workers besides the chief (0..%d, "
            "default 0)\n"
            "  --max-restarts N     restarts per task after failures "
            "(default 3)\n"
            "  --chaos SEED[,PERIOD]  SIGKILL a random task every PERIOD s "
            "on\n"
            "                       average (default 10), reproducibly\n"
            "  --chaos-targets LIST which task types chaos may kill: "
            "comma list\n"
            "                       of chief, worker, ps (default: all)\n"
            "  --grace SECS         SIGTERM to SIGKILL when stopping "
            "(default 10)\n"
            "  --backoff SECS       restart delay in a crash loop (default "
            "0.1), doubled\n"
            "                       per failure in a row before any "
            "progress (at most\n"
            "                       5); a task that made progress restarts "
            "at once\n"
            "  --no-status          no live status block on a terminal\n"
            "  --evaluator          also run an evaluator task: it evaluates\n"
            "                       each new checkpoint on the test set until\n"
            "                       the final step's; its failure does not\n"
            "                       change the exit status\n"
            "  --strategy NAME      parameter_server (the tasks above) or\n"
            "                       multi_worker_mirrored: --workers N MPI "
            "ranks\n"
            "                       (default 2) under one mpirun, all "
            "restarted\n"
            "                       from the newest checkpoint when one "
            "fails\n"
            "                       (default: the config's train.strategy)\n"
            "  -s, --set K=V        override a config key in every task "
            "(repeatable)\n"
            "  -v, --verbose        debug logging in every task\n"
            "  --output-dir DIR     PROGRAM: OUTPUT_DIR and logs/ (default\n"
            "                       ./launch_output)\n"
            "  --async              PROGRAM: TF_CONFIG mode async (default "
            "sync)\n"
            "  --replicas-to-aggregate N  PROGRAM: sync replicas per step\n"
            "                       (default: all of them)\n",
            KEEL_LAUNCH_MAX_PS, KEEL_LAUNCH_MAX_WORKERS);
    return code;
}

static volatile sig_atomic_t got_signal;
static volatile sig_atomic_t n_signals;
static volatile sig_atomic_t n_scale_up, n_scale_down;

static void
on_signal(int sig)
{
    got_signal = sig;
    n_signals++;
}

/* SIGUSR1: one more worker; SIGUSR2: one fewer (async jobs). */
static void
on_scale(int sig)
{
    if (sig == SIGUSR1)
        n_scale_up++;
    else
        n_scale_down++;
}

/* K-FAC's roles (kfac.distributed = roles): the prefix of each worker's
 * lines ("inverse.0"); empty: the task's name. Index: worker i at i. */
static char role_label[KEEL_LAUNCH_MAX_WORKERS][32];

typedef struct view {
    keel_launch *l;
    int status_on;          /* draw the status block */
    int drawn;              /* lines of the block on screen */
    double last_draw;
} view;

static double
mono_secs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
erase_status(view *v)
{
    if (v->drawn > 0) {
        printf("\033[%dA\033[J", v->drawn);
        v->drawn = 0;
    }
}

static void
draw_status(view *v)
{
    size_t n = keel_launch_num_tasks(v->l);
    erase_status(v);
    for (size_t i = 0; i < n; i++) {
        keel_launch_task_info t;
        char step[32] = "-";
        if (keel_launch_task(v->l, i, &t) != KEEL_OK)
            continue;
        if (t.global_step >= 0)
            snprintf(step, sizeof step, "%lld", (long long)t.global_step);
        /* 78 columns at most so the block never wraps */
        printf("  %-10s %-8s pid %-7d step %-8s cpu %4.0f%% rss %7.1f MiB "
               "r%d\n", t.name, keel_launch_state_name(t.state), t.pid, step,
               t.cpu_percent, (double)t.rss_bytes / (1024.0 * 1024.0),
               t.restarts + t.chaos_kills);
        v->drawn++;
    }
    fflush(stdout);
    v->last_draw = mono_secs();
}

static void
on_line(void *ctx, int task, int stream, const char *line)
{
    view *v = ctx;
    keel_launch_task_info t;
    (void)stream;
    if (keel_launch_task(v->l, (size_t)task, &t) != KEEL_OK)
        return;
    erase_status(v);
    if (t.type == KEEL_TASK_WORKER && t.index >= 0 &&
        t.index < KEEL_LAUNCH_MAX_WORKERS && role_label[t.index][0] != '\0')
        printf("%s | %s\n", role_label[t.index], line);
    else
        printf("%s | %s\n", t.name, line);
}

static void
on_event(void *ctx, const keel_launch_event *ev)
{
    view *v = ctx;
    erase_status(v);
    printf("%s | %s\n", ev->kind == KEEL_LAUNCH_EV_CHAOS ? "chaos" : "launch",
           ev->message);
    fflush(stdout);
}

static int
parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return cli_error(CLI_USAGE, "launch: %s '%s': want an integer in "
                         "%ld..%ld", opt, s, lo, hi);
    *out = (int)v;
    return CLI_OK;
}

static int
parse_secs(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi))
        return cli_error(CLI_USAGE, "launch: %s '%s': want seconds in "
                         "%g..%g", opt, s, lo, hi);
    *out = v;
    return CLI_OK;
}

/* SEED[,PERIOD] */
static int
parse_chaos(const char *s, uint64_t *seed, double *period)
{
    char *end;
    unsigned long long v;
    errno = 0;
    if (s[0] == '-' || s[0] == '\0')
        goto bad;
    v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || (*end != '\0' && *end != ','))
        goto bad;
    *seed = v;
    *period = 10;
    if (*end == ',') {
        char *e2;
        double p;
        errno = 0;
        p = strtod(end + 1, &e2);
        if (errno != 0 || e2 == end + 1 || *e2 != '\0' || !(p > 0) ||
            p > 1e6)
            goto bad;
        *period = p;
    }
    return CLI_OK;
bad:
    return cli_error(CLI_USAGE, "launch: --chaos '%s': want SEED[,PERIOD] "
                     "(a non-negative integer seed, a period in seconds > 0)",
                     s);
}

static int
parse_targets(const char *s, unsigned *mask)
{
    char buf[128], *save = NULL, *tok;
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf)
        goto bad;
    *mask = 0;
    for (tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "chief") == 0)
            *mask |= 1u << KEEL_TASK_CHIEF;
        else if (strcmp(tok, "worker") == 0)
            *mask |= 1u << KEEL_TASK_WORKER;
        else if (strcmp(tok, "ps") == 0)
            *mask |= 1u << KEEL_TASK_PS;
        else
            goto bad;
    }
    if (*mask != 0)
        return CLI_OK;
bad:
    return cli_error(CLI_USAGE, "launch: --chaos-targets '%s': want a comma "
                     "list of chief, worker, ps", s);
}

/* OUTPUT_DIR as an absolute path (tasks and logs agree whatever cwd). */
static int
absolute_dir(const char *dir, char *buf, size_t size)
{
    char cwd[PATH_MAX];
    if (dir[0] == '/')
        return snprintf(buf, size, "%s", dir) < (int)size ? CLI_OK
               : cli_error(CLI_USAGE, "launch: OUTPUT_DIR is too long");
    if (getcwd(cwd, sizeof cwd) == NULL)
        return cli_error(CLI_RUNTIME, "launch: getcwd: %s", strerror(errno));
    if (snprintf(buf, size, "%s/%s", cwd, dir) >= (int)size)
        return cli_error(CLI_USAGE, "launch: OUTPUT_DIR is too long");
    return CLI_OK;
}

/* The SyncReplicas counts of the config against the cluster this launch
 * makes (a chief and num_workers workers), by the same validation every
 * task runs: a mismatch is a config error before anything starts, not a
 * sync step that waits forever. A lone chief trains alone (no check). */
static int
check_replicas(const keel_config *cfg, int num_ps, int num_workers)
{
    keel_cluster_spec *spec = NULL;
    keel_status st;
    int rc = CLI_OK;
    if (num_ps == 0 && num_workers == 0)
        return CLI_OK;
    st = keel_cluster_spec_new(&spec);
    for (int i = 0; i <= num_workers && st == KEEL_OK; i++) {
        char addr[32];      /* placeholders: only the counts matter */
        snprintf(addr, sizeof addr, "127.0.0.1:%d", 1 + i);
        st = keel_cluster_spec_add_list(spec, i == 0 ? KEEL_TASK_CHIEF
                                                     : KEEL_TASK_WORKER,
                                        addr);
    }
    if (st == KEEL_OK)
        st = keel_cluster_spec_set_task(spec, KEEL_TASK_CHIEF, 0);
    if (st == KEEL_OK) {
        keel_cluster_spec_set_mode(spec, keel_config_is_async(cfg, NULL)
                                         ? KEEL_CLUSTER_ASYNC
                                         : KEEL_CLUSTER_SYNC);
        keel_cluster_spec_set_replicas(spec,
            (int)keel_config_int(cfg, "cluster.replicas_to_aggregate"),
            (int)keel_config_int(cfg, "cluster.total_num_replicas"));
        st = keel_cluster_spec_validate(spec);
        if (st != KEEL_OK)
            rc = cli_error(CLI_USAGE, "launch: with --workers %d: %s "
                           "(cluster.replicas_to_aggregate, "
                           "cluster.total_num_replicas)", num_workers,
                           keel_last_error());
    }
    if (st != KEEL_OK && rc == CLI_OK)
        rc = cli_fail(st, NULL);
    keel_cluster_spec_free(spec);
    return rc;
}

/* multi_worker_mirrored: no ps, no evaluator task (it would evaluate
 * checkpoints beside the ranks; run keel eval instead). */
static int
check_mwm(int num_ps, int with_evaluator, int ranks)
{
    if (!keel_collective_is_available())
        return cli_error(CLI_USAGE, "launch: --strategy "
                         "multi_worker_mirrored needs MPI, and this keel was "
                         "built without it: apt-get install libopenmpi-dev "
                         "openmpi-bin, re-run configure and rebuild");
    if (ranks < 1)
        return cli_error(CLI_USAGE, "launch: --strategy "
                         "multi_worker_mirrored: --workers is the number of "
                         "MPI ranks (at least 1)");
    if (num_ps > 0)
        return cli_error(CLI_USAGE, "launch: --strategy "
                         "multi_worker_mirrored has no parameter servers "
                         "(drop --ps %d)", num_ps);
    if (with_evaluator)
        return cli_error(CLI_USAGE, "launch: --evaluator is not run beside "
                         "multi_worker_mirrored ranks yet; evaluate the "
                         "checkpoints with keel eval");
    return CLI_OK;
}

/* mpirun's arguments for n ranks of keel (Open MPI): every rank on this
 * machine, more ranks than cores allowed, shared memory between them and
 * the loopback interface only (no network); as root, Open MPI's own
 * consent flag. Returns the number of arguments written. */
static int
mpirun_argv(char **argv, char *n, char *keel)
{
    int k = 0;
    argv[k++] = "mpirun";
    if (getuid() == 0)
        argv[k++] = "--allow-run-as-root";
    argv[k++] = "-n";
    argv[k++] = n;
    argv[k++] = "--oversubscribe";
    argv[k++] = "--mca";
    argv[k++] = "btl";
    argv[k++] = "self,vader";
    argv[k++] = "--mca";
    argv[k++] = "oob_tcp_if_include";
    argv[k++] = "lo";
    argv[k++] = keel;
    return k;
}

/* PROGRAM as execve wants it: a name with a slash as given, else the
 * first executable of that name on PATH. */
static int
find_program(const char *name, char *buf, size_t size)
{
    const char *path = getenv("PATH");
    if (strchr(name, '/') != NULL) {
        if (access(name, X_OK) != 0)
            return cli_error(CLI_USAGE, "launch: %s: %s (PROGRAM must be "
                             "an executable file)", name, strerror(errno));
        return snprintf(buf, size, "%s", name) < (int)size ? CLI_OK
               : cli_error(CLI_USAGE, "launch: PROGRAM path is too long");
    }
    while (path != NULL && *path != '\0') {
        const char *end = strchr(path, ':');
        size_t len = end != NULL ? (size_t)(end - path) : strlen(path);
        if (len > 0 &&
            snprintf(buf, size, "%.*s/%s", (int)len, path, name) < (int)size
            && access(buf, X_OK) == 0)
            return CLI_OK;
        path = end != NULL ? end + 1 : NULL;
    }
    return cli_error(CLI_USAGE, "launch: PROGRAM '%s' is not on PATH (give "
                     "its path, e.g. ./%s)", name, name);
}

int
cmd_launch(int argc, char **argv)
{
    const char *path = NULL, *out_opt = NULL, *strategy = NULL;
    int is_mwm = 0, workers_set = 0;
    char n_ranks[16];
    char **program = NULL;          /* -- PROGRAM [ARGS...] */
    int async_mode = 0, rta = 0;
    /* the rule that refuses workers beyond the start, or empty */
    char fixed_rule[32] = "";
    char *over[MAX_OVERRIDES];
    char *task_argv[MAX_OVERRIDES * 2 + 8];
    char exe[PATH_MAX], outdir[PATH_MAX], keel_exe[PATH_MAX];
    int n_over = 0, verbose = 0, rc, done = 0, k = 0, status_flag = 1;
    ssize_t len;
    keel_config *cfg = NULL;
    keel_launch_config lc;
    keel_launch *l = NULL;
    keel_status st;
    view v;
    struct sigaction sa, old_int, old_term, old_pipe, old_usr1, old_usr2;
    const char *why;

    if (cli_wants_help(argc, argv))
        return launch_usage(stdout, CLI_OK);
    keel_launch_config_init(&lc);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = strcmp(a, "--ps") == 0 || strcmp(a, "--workers") == 0 ||
                    strcmp(a, "--output-dir") == 0 ||
                    strcmp(a, "--replicas-to-aggregate") == 0 ||
                    strcmp(a, "--max-restarts") == 0 ||
                    strcmp(a, "--chaos") == 0 ||
                    strcmp(a, "--chaos-targets") == 0 ||
                    strcmp(a, "--grace") == 0 ||
                    strcmp(a, "--backoff") == 0 || strcmp(a, "-s") == 0 ||
                    strcmp(a, "--strategy") == 0 ||
                    strcmp(a, "--set") == 0;
        if (strcmp(a, "--") == 0) {
            if (i + 1 >= argc)
                return cli_error(CLI_USAGE, "launch: -- needs a PROGRAM; "
                                 "see 'keel launch --help'");
            program = &argv[i + 1];
            break;
        }
        if (takes && val == NULL)
            return cli_error(CLI_USAGE, "launch: %s needs a value; see 'keel "
                             "launch --help'", a);
        rc = CLI_OK;
        if (strcmp(a, "--ps") == 0)
            rc = parse_int(a, val, 0, KEEL_LAUNCH_MAX_PS, &lc.num_ps);
        else if (strcmp(a, "--workers") == 0)
            rc = parse_int(a, val, 0, KEEL_LAUNCH_MAX_WORKERS,
                           &lc.num_workers), workers_set = 1;
        else if (strcmp(a, "--output-dir") == 0)
            out_opt = val;
        else if (strcmp(a, "--strategy") == 0)
            strategy = val;
        else if (strcmp(a, "--replicas-to-aggregate") == 0)
            rc = parse_int(a, val, 1, KEEL_LAUNCH_MAX_WORKERS + 1, &rta);
        else if (strcmp(a, "--max-restarts") == 0)
            rc = parse_int(a, val, 0, 1000000, &lc.max_restarts);
        else if (strcmp(a, "--chaos") == 0) {
            lc.chaos = 1;
            rc = parse_chaos(val, &lc.chaos_seed, &lc.chaos_period_secs);
        } else if (strcmp(a, "--chaos-targets") == 0)
            rc = parse_targets(val, &lc.chaos_types);
        else if (strcmp(a, "--grace") == 0)
            rc = parse_secs(a, val, 0.001, 86400, &lc.grace_secs);
        else if (strcmp(a, "--backoff") == 0)
            rc = parse_secs(a, val, 0, 60, &lc.backoff_secs);
        else if (strcmp(a, "-s") == 0 || strcmp(a, "--set") == 0) {
            if (n_over == MAX_OVERRIDES)
                return cli_error(CLI_USAGE, "launch: too many -s overrides");
            over[n_over++] = (char *)val;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            verbose = 1;
            continue;
        } else if (strcmp(a, "--no-status") == 0) {
            status_flag = 0;
            continue;
        } else if (strcmp(a, "--evaluator") == 0) {
            lc.with_evaluator = 1;
            continue;
        } else if (strcmp(a, "--async") == 0) {
            async_mode = 1;
            continue;
        } else if (a[0] == '-') {
            return cli_error(CLI_USAGE, "launch: unknown option '%s'; see "
                             "'keel launch --help'", a);
        } else if (path == NULL) {
            path = a;
            continue;
        } else {
            return cli_error(CLI_USAGE, "launch takes one CONFIG, got '%s' "
                             "and '%s'", path, a);
        }
        if (rc != CLI_OK)
            return rc;
        i++;
    }
    if (program != NULL && path != NULL)
        return cli_error(CLI_USAGE, "launch: give a CONFIG ('%s') or -- "
                         "PROGRAM ('%s'), not both", path, program[0]);
    if (program != NULL && (n_over > 0 || verbose))
        return cli_error(CLI_USAGE, "launch: -s and -v set keys of a keel "
                         "CONFIG; PROGRAM takes its own arguments after --");
    if (program != NULL && strategy != NULL)
        return cli_error(CLI_USAGE, "launch: --strategy is for a keel "
                         "CONFIG (PROGRAM chooses its own)");
    if (program == NULL && (out_opt != NULL || async_mode || rta > 0))
        return cli_error(CLI_USAGE, "launch: --output-dir, --async and "
                         "--replicas-to-aggregate are for -- PROGRAM (a "
                         "CONFIG sets checkpoint.dir and [cluster] keys)");
    if (path == NULL && program == NULL)
        return cli_error(CLI_USAGE, "launch needs a CONFIG file or -- "
                         "PROGRAM [ARGS...]; see 'keel launch --help'");
    if (rta > lc.num_workers + 1)
        return cli_error(CLI_USAGE, "launch: --replicas-to-aggregate %d is "
                         "more than the %d replicas (the chief and %d "
                         "worker%s)", rta, lc.num_workers + 1,
                         lc.num_workers, lc.num_workers == 1 ? "" : "s");
    if (lc.chaos && lc.chaos_types != 0 &&
        !(lc.chaos_types & (1u << KEEL_TASK_CHIEF)) &&
        !(lc.num_workers > 0 && (lc.chaos_types & (1u << KEEL_TASK_WORKER))) &&
        !(lc.num_ps > 0 && (lc.chaos_types & (1u << KEEL_TASK_PS))))
        return cli_error(CLI_USAGE, "launch: --chaos-targets leaves chaos "
                         "nothing to kill (no such task: add --workers or "
                         "--ps, or target chief)");
    if (program != NULL) {
        rc = find_program(program[0], exe, sizeof exe);
        if (rc == CLI_OK)
            rc = absolute_dir(out_opt != NULL ? out_opt : "launch_output",
                              outdir, sizeof outdir);
        if (rc != CLI_OK)
            return rc;
        lc.mode = async_mode ? KEEL_CLUSTER_ASYNC : KEEL_CLUSTER_SYNC;
        lc.replicas_to_aggregate = rta;
        lc.argv = program;
    } else {
        /* the whole config is checked here, before anything starts */
        rc = cli_load_config(path, n_over, over, &cfg);
        if (rc != CLI_OK)
            return rc;
        if (strategy == NULL)
            strategy = keel_config_str(cfg, "train.strategy");
        is_mwm = strcmp(strategy, "multi_worker_mirrored") == 0;
        rc = absolute_dir(keel_config_str(cfg, "checkpoint.dir"), outdir,
                          sizeof outdir);
        if (rc == CLI_OK && is_mwm)
            rc = check_mwm(lc.num_ps, lc.with_evaluator,
                           workers_set ? lc.num_workers : 2);
        else if (rc == CLI_OK && strcmp(strategy, "parameter_server") != 0 &&
                 strcmp(strategy, "auto") != 0)
            rc = cli_error(CLI_USAGE, "launch: --strategy '%s': want "
                           "parameter_server or multi_worker_mirrored",
                           strategy);
        if (rc == CLI_OK && !is_mwm)
            rc = check_replicas(cfg, lc.num_ps, lc.num_workers);
        lc.mode = keel_config_is_async(cfg, NULL) ? KEEL_CLUSTER_ASYNC
                                                  : KEEL_CLUSTER_SYNC;
        if (lc.mode == KEEL_CLUSTER_ASYNC &&
            keel_config_is_set(cfg, "algorithm.name")) {
            keel_algorithm a;
            if (keel_algorithm_from_name(keel_config_str(cfg,
                                             "algorithm.name"), &a)
                == KEEL_OK && !keel_algorithm_admits_joiners(a))
                snprintf(fixed_rule, sizeof fixed_rule, "%s",
                         keel_algorithm_name(a));
        }
        for (int i = 0; rc == CLI_OK && i <= lc.num_workers; i++) {
            char label[32];
            st = keel_job_replica_role(cfg, i, lc.num_workers + 1, label,
                                       sizeof label);
            if (st == KEEL_ENOTFOUND)
                break;
            if (st != KEEL_OK)
                rc = cli_error(CLI_USAGE, "launch: with --workers %d: %s",
                               lc.num_workers, keel_last_error());
            else if (i == 0)
                printf("launch | K-FAC roles: chief is %s\n", label);
            else
                snprintf(role_label[i - 1], sizeof role_label[i - 1], "%s",
                         label);
            if (i > 0 && st == KEEL_OK)
                printf("launch | K-FAC roles: worker.%d is %s\n", i - 1,
                       label);
        }
        keel_config_free(cfg);
        if (rc != CLI_OK)
            return rc;
        len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (len <= 0)
            return cli_error(CLI_RUNTIME, "launch: cannot find the keel "
                             "binary (/proc/self/exe): %s", strerror(errno));
        exe[len] = '\0';
        if (is_mwm) {
            /* one task: mpirun and its ranks, restarted as a whole */
            snprintf(n_ranks, sizeof n_ranks, "%d",
                     workers_set ? lc.num_workers : 2);
            snprintf(keel_exe, sizeof keel_exe, "%s", exe);
            k = mpirun_argv(task_argv, n_ranks, keel_exe);
            lc.num_workers = 0;
            snprintf(exe, sizeof exe, "%s", KEEL_MPIRUN);
        } else {
            task_argv[k++] = "keel";
        }
        task_argv[k++] = "train";
        task_argv[k++] = (char *)path;
        if (is_mwm) {
            task_argv[k++] = "-s";
            task_argv[k++] = "train.strategy=multi_worker_mirrored";
        }
        for (int i = 0; i < n_over; i++) {
            task_argv[k++] = "-s";
            task_argv[k++] = over[i];
        }
        if (verbose)
            task_argv[k++] = "-v";
        task_argv[k] = NULL;
        lc.argv = task_argv;
    }

    memset(&v, 0, sizeof v);
    v.status_on = status_flag && isatty(1);
    lc.exe = exe;
    lc.output_dir = outdir;
    lc.line_fn = on_line;
    lc.event_fn = on_event;
    lc.ctx = &v;
    st = keel_launch_new(&lc, &l);
    if (st != KEEL_OK)
        return cli_fail(st, NULL);
    v.l = l;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;          /* no SA_RESTART: poll wakes */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sa.sa_handler = on_scale;
    sigaction(SIGUSR1, &sa, &old_usr1);
    sigaction(SIGUSR2, &sa, &old_usr2);
    sa.sa_handler = SIG_IGN;            /* a closed stdout must not kill us */
    sigaction(SIGPIPE, &sa, &old_pipe);

    if (is_mwm)
        printf("launch | multi_worker_mirrored: %s MPI ranks under %s; "
               "OUTPUT_DIR=%s\n", n_ranks, exe, outdir);
    else
    printf("launch | %d ps, chief, %d worker%s%s%s%s; OUTPUT_DIR=%s\n",
           lc.num_ps, lc.num_workers, lc.num_workers == 1 ? "" : "s",
           lc.with_evaluator ? ", evaluator" : "",
           program != NULL ? " running " : "",
           program != NULL ? program[0] : "", outdir);
    if (lc.chaos)
        printf("chaos | seed %llu, mean period %g s\n",
               (unsigned long long)lc.chaos_seed, lc.chaos_period_secs);
    fflush(stdout);
    st = keel_launch_start(l);
    if (st != KEEL_OK) {
        rc = cli_fail(st, NULL);
        goto out;
    }
    {
        int handled = 0, ups = 0, downs = 0;
        while (!done) {
            st = keel_launch_poll(l, 100, &done);
            if (st != KEEL_OK) {
                keel_launch_stop(l, 1);
                rc = cli_fail(st, NULL);
                goto out;
            }
            if (n_signals > handled) {
                int sig = got_signal;
                handled = n_signals;
                erase_status(&v);
                printf("launch | %s: %s\n",
                       sig == SIGINT ? "SIGINT" : "SIGTERM",
                       handled == 1 ? "stopping every task gracefully "
                       "(again to kill at once)" : "killing every task");
                keel_launch_stop(l, handled > 1);
            }
            while (ups < n_scale_up || downs < n_scale_down) {
                int up = ups < n_scale_up;
                keel_status sst;
                if (up)
                    ups++;
                else
                    downs++;
                erase_status(&v);
                if (up && fixed_rule[0] != '\0') {
                    printf("launch | SIGUSR1: algorithm.name = %s keeps "
                           "state per worker the job started with; no "
                           "worker added\n", fixed_rule);
                    continue;
                }
                sst = up ? keel_launch_add_worker(l)
                         : keel_launch_remove_worker(l);
                if (sst != KEEL_OK)
                    printf("launch | %s: %s\n", up ? "SIGUSR1" : "SIGUSR2",
                           keel_last_error());
            }
            if (v.status_on && !done && mono_secs() - v.last_draw >= 0.25)
                draw_status(&v);
            fflush(stdout);
        }
    }
    if (v.status_on)
        draw_status(&v);
    rc = keel_launch_exit_code(l, &why);
    if (rc == 0)
        printf("launch | %s in %.1f s\n", n_signals > 0
               ? "stopped on request: the chief saved and exited 0"
               : "the chief finished: run complete",
               keel_launch_elapsed(l));
    fflush(stdout);
    if (rc != 0)
        cli_error(CLI_RUNTIME, "launch: %s", why);
out:
    keel_launch_free(l);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGPIPE, &old_pipe, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    sigaction(SIGUSR2, &old_usr2, NULL);
    return rc;
}
