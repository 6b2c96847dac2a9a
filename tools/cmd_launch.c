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
#include "mpirun.h"

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
            "An async or elastic sync job (cluster.elastic) scales while it\n"
            "runs: SIGUSR1 adds a worker (the next index), SIGUSR2 stops\n"
            "the last one added.\n"
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
/* multi_worker_mirrored: the one task is mpirun, whose ranks start their
 * lines with "rank R | " themselves (keel train); those lines are printed
 * as they are, mpirun's own as "mpirun | ...". */
static int lines_by_rank;

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
    if (lines_by_rank)
        printf(strncmp(line, "rank ", 5) == 0 && strstr(line, " | ") != NULL
               ? "%s\n" : "mpirun | %s\n", line);
    else if (t.type == KEEL_TASK_WORKER && t.index >= 0 &&
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

/* mpirun's arguments for n ranks of keel (Open MPI): the options of
 * ranks on this machine alone (mpirun.h), then the ranks and the program.
 * Returns the number of arguments written. */
static int
mpirun_argv(char **argv, char *n, char *keel)
{
    int k = 0;
    argv[k++] = "mpirun";
    k += mpirun_local_options(argv + k);
    argv[k++] = "-n";
    argv[k++] = n;
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

/* What cmd_launch's steps share: the command line as parsed, then the
 * launch's settings and the strings lc points into. */
typedef struct launch_args {
    const char *path, *out_opt, *strategy;
    char **program;                 /* -- PROGRAM [ARGS...], or NULL */
    char *over[CLI_MAX_OVERRIDES];
    int n_over, verbose, status_flag, async_mode, rta, workers_set, is_mwm;
    /* the rule that refuses workers beyond the start, or empty */
    char fixed_rule[32];
    char n_ranks[16];
    /* mpirun, its options, -n N keel, train CONFIG, -s strategy, the
     * overrides, -v, NULL */
    char *task_argv[MPIRUN_LOCAL_OPTIONS_MAX + 10 +
                    CLI_MAX_OVERRIDES * 2];
    char exe[PATH_MAX], outdir[PATH_MAX], keel_exe[PATH_MAX];
    keel_launch_config lc;
} launch_args;

/* The signal dispositions cmd_launch replaces, to restore at the end. */
typedef struct launch_signals {
    struct sigaction old_int, old_term, old_pipe, old_usr1, old_usr2;
} launch_signals;

/* Whether option o takes a value (the next argument). */
static int
launch_takes_value(const char *o)
{
    static const char *const valued[] = { "--ps", "--workers",
        "--output-dir", "--replicas-to-aggregate", "--max-restarts",
        "--chaos", "--chaos-targets", "--grace", "--backoff", "-s",
        "--strategy", "--set" };
    for (size_t i = 0; i < sizeof valued / sizeof *valued; i++)
        if (strcmp(o, valued[i]) == 0)
            return 1;
    return 0;
}

/* Option o with its value val into a: CLI_OK or the usage error, on
 * stderr already. */
static int
launch_option(launch_args *a, const char *o, const char *val)
{
    keel_launch_config *lc = &a->lc;

    if (strcmp(o, "--ps") == 0)
        return parse_int(o, val, 0, KEEL_LAUNCH_MAX_PS, &lc->num_ps);
    if (strcmp(o, "--workers") == 0) {
        a->workers_set = 1;
        return parse_int(o, val, 0, KEEL_LAUNCH_MAX_WORKERS,
                         &lc->num_workers);
    }
    if (strcmp(o, "--output-dir") == 0)
        a->out_opt = val;
    else if (strcmp(o, "--strategy") == 0)
        a->strategy = val;
    else if (strcmp(o, "--replicas-to-aggregate") == 0)
        return parse_int(o, val, 1, KEEL_LAUNCH_MAX_WORKERS + 1, &a->rta);
    else if (strcmp(o, "--max-restarts") == 0)
        return parse_int(o, val, 0, 1000000, &lc->max_restarts);
    else if (strcmp(o, "--chaos") == 0) {
        lc->chaos = 1;
        return parse_chaos(val, &lc->chaos_seed, &lc->chaos_period_secs);
    } else if (strcmp(o, "--chaos-targets") == 0)
        return parse_targets(val, &lc->chaos_types);
    else if (strcmp(o, "--grace") == 0)
        return parse_secs(o, val, 0.001, 86400, &lc->grace_secs);
    else if (strcmp(o, "--backoff") == 0)
        return parse_secs(o, val, 0, 60, &lc->backoff_secs);
    else                                /* -s, --set */
        return cli_add_override("launch", a->over, &a->n_over, (char *)val);
    return CLI_OK;
}

/* Argument o without a value: a flag, or the CONFIG. CLI_OK or the
 * usage error, on stderr already. */
static int
launch_flag(launch_args *a, const char *o)
{
    if (strcmp(o, "-v") == 0 || strcmp(o, "--verbose") == 0)
        a->verbose = 1;
    else if (strcmp(o, "--no-status") == 0)
        a->status_flag = 0;
    else if (strcmp(o, "--evaluator") == 0)
        a->lc.with_evaluator = 1;
    else if (strcmp(o, "--async") == 0)
        a->async_mode = 1;
    else if (o[0] == '-')
        return cli_error(CLI_USAGE, "launch: unknown option '%s'; see "
                         "'keel launch --help'", o);
    else if (a->path == NULL)
        a->path = o;
    else
        return cli_error(CLI_USAGE, "launch takes one CONFIG, got '%s' "
                         "and '%s'", a->path, o);
    return CLI_OK;
}

/* Parse argv into a (initialised here): options, flags, the CONFIG or
 * -- PROGRAM [ARGS...]. CLI_OK or the usage error, on stderr already. */
static int
launch_parse(int argc, char **argv, launch_args *a)
{
    int rc;

    memset(a, 0, sizeof *a);
    a->status_flag = 1;
    keel_launch_config_init(&a->lc);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--") == 0) {
            if (i + 1 >= argc)
                return cli_error(CLI_USAGE, "launch: -- needs a PROGRAM; "
                                 "see 'keel launch --help'");
            a->program = &argv[i + 1];
            break;
        }
        if (!launch_takes_value(o))
            rc = launch_flag(a, o);
        else if (i + 1 >= argc)
            return cli_error(CLI_USAGE, "launch: %s needs a value; see 'keel "
                             "launch --help'", o);
        else
            rc = launch_option(a, o, argv[++i]);
        if (rc != CLI_OK)
            return rc;
    }
    return CLI_OK;
}

/* The options that do not fit together (CONFIG against PROGRAM, the
 * replicas to aggregate, chaos with nothing to kill): CLI_OK or the
 * usage error, on stderr already. */
static int
launch_check_args(const launch_args *a)
{
    const keel_launch_config *lc = &a->lc;

    if (a->program != NULL && a->path != NULL)
        return cli_error(CLI_USAGE, "launch: give a CONFIG ('%s') or -- "
                         "PROGRAM ('%s'), not both", a->path, a->program[0]);
    if (a->program != NULL && (a->n_over > 0 || a->verbose))
        return cli_error(CLI_USAGE, "launch: -s and -v set keys of a keel "
                         "CONFIG; PROGRAM takes its own arguments after --");
    if (a->program != NULL && a->strategy != NULL)
        return cli_error(CLI_USAGE, "launch: --strategy is for a keel "
                         "CONFIG (PROGRAM chooses its own)");
    if (a->program == NULL &&
        (a->out_opt != NULL || a->async_mode || a->rta > 0))
        return cli_error(CLI_USAGE, "launch: --output-dir, --async and "
                         "--replicas-to-aggregate are for -- PROGRAM (a "
                         "CONFIG sets checkpoint.dir and [cluster] keys)");
    if (a->path == NULL && a->program == NULL)
        return cli_error(CLI_USAGE, "launch needs a CONFIG file or -- "
                         "PROGRAM [ARGS...]; see 'keel launch --help'");
    if (a->rta > lc->num_workers + 1)
        return cli_error(CLI_USAGE, "launch: --replicas-to-aggregate %d is "
                         "more than the %d replicas (the chief and %d "
                         "worker%s)", a->rta, lc->num_workers + 1,
                         lc->num_workers, lc->num_workers == 1 ? "" : "s");
    if (lc->chaos && lc->chaos_types != 0 &&
        !(lc->chaos_types & (1u << KEEL_TASK_CHIEF)) &&
        !(lc->num_workers > 0 &&
          (lc->chaos_types & (1u << KEEL_TASK_WORKER))) &&
        !(lc->num_ps > 0 && (lc->chaos_types & (1u << KEEL_TASK_PS))))
        return cli_error(CLI_USAGE, "launch: --chaos-targets leaves chaos "
                         "nothing to kill (no such task: add --workers or "
                         "--ps, or target chief)");
    return CLI_OK;
}

/* -- PROGRAM: its executable, OUTPUT_DIR and the TF_CONFIG mode. */
static int
launch_program_setup(launch_args *a)
{
    int rc = find_program(a->program[0], a->exe, sizeof a->exe);
    if (rc == CLI_OK)
        rc = absolute_dir(a->out_opt != NULL ? a->out_opt : "launch_output",
                          a->outdir, sizeof a->outdir);
    if (rc != CLI_OK)
        return rc;
    a->lc.mode = a->async_mode ? KEEL_CLUSTER_ASYNC : KEEL_CLUSTER_SYNC;
    a->lc.replicas_to_aggregate = a->rta;
    a->lc.argv = a->program;
    return CLI_OK;
}

/* A CONFIG against the cluster this launch makes: the strategy (sets
 * a->is_mwm), OUTPUT_DIR, the replica counts, the mode and an async
 * rule that refuses joiners (a->fixed_rule). */
static int
launch_config_check(launch_args *a, const keel_config *cfg)
{
    keel_launch_config *lc = &a->lc;
    int rc;

    if (a->strategy == NULL)
        a->strategy = keel_config_str(cfg, "train.strategy");
    a->is_mwm = strcmp(a->strategy, "multi_worker_mirrored") == 0;
    rc = absolute_dir(keel_config_str(cfg, "checkpoint.dir"), a->outdir,
                      sizeof a->outdir);
    if (rc == CLI_OK && a->is_mwm)
        rc = check_mwm(lc->num_ps, lc->with_evaluator,
                       a->workers_set ? lc->num_workers : 2);
    else if (rc == CLI_OK && strcmp(a->strategy, "parameter_server") != 0 &&
             strcmp(a->strategy, "auto") != 0)
        rc = cli_error(CLI_USAGE, "launch: --strategy '%s': want "
                       "parameter_server or multi_worker_mirrored",
                       a->strategy);
    if (rc == CLI_OK && !a->is_mwm)
        rc = check_replicas(cfg, lc->num_ps, lc->num_workers);
    lc->mode = keel_config_is_async(cfg, NULL) ? KEEL_CLUSTER_ASYNC
                                               : KEEL_CLUSTER_SYNC;
    lc->elastic = keel_config_bool(cfg, "cluster.elastic");
    if (lc->mode == KEEL_CLUSTER_ASYNC &&
        keel_config_is_set(cfg, "algorithm.name")) {
        keel_algorithm alg;
        if (keel_algorithm_from_name(keel_config_str(cfg, "algorithm.name"),
                                     &alg) == KEEL_OK &&
            !keel_algorithm_admits_joiners(alg))
            snprintf(a->fixed_rule, sizeof a->fixed_rule, "%s",
                     keel_algorithm_name(alg));
    }
    return rc;
}

/* K-FAC's roles (kfac.distributed = roles): print each replica's and
 * keep the workers' in role_label; CLI_OK when the config has none. */
static int
launch_kfac_roles(const launch_args *a, const keel_config *cfg)
{
    int num_workers = a->lc.num_workers;
    int rc = CLI_OK;

    for (int i = 0; rc == CLI_OK && i <= num_workers; i++) {
        char label[32];
        keel_status st = keel_job_replica_role(cfg, i, num_workers + 1,
                                               label, sizeof label);
        if (st == KEEL_ENOTFOUND)
            break;
        if (st != KEEL_OK)
            rc = cli_error(CLI_USAGE, "launch: with --workers %d: %s",
                           num_workers, keel_last_error());
        else if (i == 0)
            printf("launch | K-FAC roles: chief is %s\n", label);
        else
            snprintf(role_label[i - 1], sizeof role_label[i - 1], "%s",
                     label);
        if (i > 0 && st == KEEL_OK)
            printf("launch | K-FAC roles: worker.%d is %s\n", i - 1,
                   label);
    }
    return rc;
}

/* Every task's command: `keel train CONFIG [-s K=V]... [-v]`, for
 * multi_worker_mirrored one task of mpirun and its ranks. */
static int
launch_task_argv(launch_args *a)
{
    ssize_t len = readlink("/proc/self/exe", a->exe, sizeof a->exe - 1);
    int k = 0;

    if (len <= 0)
        return cli_error(CLI_RUNTIME, "launch: cannot find the keel "
                         "binary (/proc/self/exe): %s", strerror(errno));
    a->exe[len] = '\0';
    if (a->is_mwm) {
        /* one task: mpirun and its ranks, restarted as a whole */
        lines_by_rank = 1;
        snprintf(a->n_ranks, sizeof a->n_ranks, "%d",
                 a->workers_set ? a->lc.num_workers : 2);
        snprintf(a->keel_exe, sizeof a->keel_exe, "%s", a->exe);
        k = mpirun_argv(a->task_argv, a->n_ranks, a->keel_exe);
        a->lc.num_workers = 0;
        snprintf(a->exe, sizeof a->exe, "%s", KEEL_MPIRUN);
    } else {
        a->task_argv[k++] = "keel";
    }
    a->task_argv[k++] = "train";
    a->task_argv[k++] = (char *)a->path;
    if (a->is_mwm) {
        a->task_argv[k++] = "-s";
        a->task_argv[k++] = "train.strategy=multi_worker_mirrored";
    }
    for (int i = 0; i < a->n_over; i++) {
        a->task_argv[k++] = "-s";
        a->task_argv[k++] = a->over[i];
    }
    if (a->verbose)
        a->task_argv[k++] = "-v";
    a->task_argv[k] = NULL;
    a->lc.argv = a->task_argv;
    return CLI_OK;
}

/* CONFIG: load it with the -s overrides and check all of it before
 * anything starts, then build the tasks' command. */
static int
launch_config_setup(launch_args *a)
{
    keel_config *cfg = NULL;
    int rc = cli_load_config(a->path, a->n_over, a->over, &cfg);

    if (rc != CLI_OK)
        return rc;
    rc = launch_config_check(a, cfg);
    if (rc == CLI_OK)
        rc = launch_kfac_roles(a, cfg);
    keel_config_free(cfg);
    if (rc != CLI_OK)
        return rc;
    return launch_task_argv(a);
}

/* Catch SIGINT/SIGTERM (stop), SIGUSR1/SIGUSR2 (scale) and ignore
 * SIGPIPE, keeping the old dispositions in old. */
static void
launch_signals_install(launch_signals *old)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;          /* no SA_RESTART: poll wakes */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old->old_int);
    sigaction(SIGTERM, &sa, &old->old_term);
    sa.sa_handler = on_scale;
    sigaction(SIGUSR1, &sa, &old->old_usr1);
    sigaction(SIGUSR2, &sa, &old->old_usr2);
    sa.sa_handler = SIG_IGN;            /* a closed stdout must not kill us */
    sigaction(SIGPIPE, &sa, &old->old_pipe);
}

/* Put back the dispositions launch_signals_install replaced. */
static void
launch_signals_restore(const launch_signals *old)
{
    sigaction(SIGINT, &old->old_int, NULL);
    sigaction(SIGTERM, &old->old_term, NULL);
    sigaction(SIGPIPE, &old->old_pipe, NULL);
    sigaction(SIGUSR1, &old->old_usr1, NULL);
    sigaction(SIGUSR2, &old->old_usr2, NULL);
}

/* The launch's first lines: the cluster it runs and chaos's seed. */
static void
launch_announce(const launch_args *a)
{
    const keel_launch_config *lc = &a->lc;

    if (a->is_mwm)
        printf("launch | multi_worker_mirrored: %s MPI ranks under %s; "
               "OUTPUT_DIR=%s\n", a->n_ranks, a->exe, a->outdir);
    else
        printf("launch | %d ps, chief, %d worker%s%s%s%s; OUTPUT_DIR=%s\n",
               lc->num_ps, lc->num_workers,
               lc->num_workers == 1 ? "" : "s",
               lc->with_evaluator ? ", evaluator" : "",
               a->program != NULL ? " running " : "",
               a->program != NULL ? a->program[0] : "", a->outdir);
    if (lc->chaos)
        printf("chaos | seed %llu, mean period %g s\n",
               (unsigned long long)lc->chaos_seed, lc->chaos_period_secs);
    fflush(stdout);
}

/* The SIGUSR1/SIGUSR2 that arrived since the last call (*ups, *downs
 * count those handled): add or remove a worker each, unless fixed_rule
 * names an algorithm that refuses joiners. A refusal is printed, not
 * fatal. */
static void
launch_scale(view *v, const char *fixed_rule, int *ups, int *downs)
{
    while (*ups < n_scale_up || *downs < n_scale_down) {
        int up = *ups < n_scale_up;
        keel_status sst;
        if (up)
            (*ups)++;
        else
            (*downs)++;
        erase_status(v);
        if (up && fixed_rule[0] != '\0') {
            printf("launch | SIGUSR1: algorithm.name = %s keeps "
                   "state per worker the job started with; no "
                   "worker added\n", fixed_rule);
            continue;
        }
        sst = up ? keel_launch_add_worker(v->l)
                 : keel_launch_remove_worker(v->l);
        if (sst != KEEL_OK)
            printf("launch | %s: %s\n", up ? "SIGUSR1" : "SIGUSR2",
                   keel_last_error());
    }
}

/* The run loop until every task has ended: poll the tasks, forward
 * SIGINT/SIGTERM as a graceful stop (a second one kills), scale, redraw
 * the status. CLI_OK when the launch is done; a poll failure stops every
 * task and returns its exit status. */
static int
launch_loop(view *v, const char *fixed_rule)
{
    int done = 0, handled = 0, ups = 0, downs = 0;
    keel_status st;

    while (!done) {
        st = keel_launch_poll(v->l, 100, &done);
        if (st != KEEL_OK) {
            keel_launch_stop(v->l, 1);
            return cli_fail(st, NULL);
        }
        if (n_signals > handled) {
            int sig = got_signal;
            handled = n_signals;
            erase_status(v);
            printf("launch | %s: %s\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM",
                   handled == 1 ? "stopping every task gracefully "
                   "(again to kill at once)" : "killing every task");
            keel_launch_stop(v->l, handled > 1);
        }
        launch_scale(v, fixed_rule, &ups, &downs);
        if (v->status_on && !done && mono_secs() - v->last_draw >= 0.25)
            draw_status(v);
        fflush(stdout);
    }
    return CLI_OK;
}

/* The end: the last status block, the outcome line and the chief's
 * exit status (0 or 1, with its reason on stderr). */
static int
launch_finish(view *v)
{
    const char *why;
    int rc;

    if (v->status_on)
        draw_status(v);
    rc = keel_launch_exit_code(v->l, &why);
    if (rc == 0)
        printf("launch | %s in %.1f s\n", n_signals > 0
               ? "stopped on request: the chief saved and exited 0"
               : "the chief finished: run complete",
               keel_launch_elapsed(v->l));
    fflush(stdout);
    if (rc != 0)
        cli_error(CLI_RUNTIME, "launch: %s", why);
    return rc;
}

int
cmd_launch(int argc, char **argv)
{
    launch_args a;
    launch_signals old;
    keel_launch *l = NULL;
    keel_status st;
    view v;
    int rc;

    if (cli_wants_help(argc, argv))
        return launch_usage(stdout, CLI_OK);
    rc = launch_parse(argc, argv, &a);
    if (rc == CLI_OK)
        rc = launch_check_args(&a);
    if (rc == CLI_OK)
        rc = a.program != NULL ? launch_program_setup(&a)
                               : launch_config_setup(&a);
    if (rc != CLI_OK)
        return rc;

    memset(&v, 0, sizeof v);
    v.status_on = a.status_flag && isatty(1);
    a.lc.exe = a.exe;
    a.lc.output_dir = a.outdir;
    a.lc.line_fn = on_line;
    a.lc.event_fn = on_event;
    a.lc.ctx = &v;
    st = keel_launch_new(&a.lc, &l);
    if (st != KEEL_OK)
        return cli_fail(st, NULL);
    v.l = l;

    launch_signals_install(&old);
    launch_announce(&a);
    st = keel_launch_start(l);
    if (st != KEEL_OK)
        rc = cli_fail(st, NULL);
    else if ((rc = launch_loop(&v, a.fixed_rule)) == CLI_OK)
        rc = launch_finish(&v);
    keel_launch_free(l);
    launch_signals_restore(&old);
    return rc;
}
