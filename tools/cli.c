/* cli.c - what the keel CLI's verbs share: error reporting, logging,
 * options, progress bars, loading a config, finding this task's cluster,
 * opening a checkpoint's model. */
#include <config.h>

#include <stdarg.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

char cli_line_prefix[32];

void
cli_prefix_mpi_rank(void)
{
    static const char *const vars[] = { "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                        "PMI_RANK" };
    cli_line_prefix[0] = '\0';
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long r;
        if (v == NULL || v[0] == '\0')
            continue;
        r = strtol(v, &end, 10);
        if (*end == '\0' && r >= 0 && r <= 1 << 24)
            snprintf(cli_line_prefix, sizeof cli_line_prefix, "rank %ld | ",
                     r);
        return;
    }
}

int
cli_error(int code, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%skeel: ", cli_line_prefix);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

int
cli_exit_code(keel_status st)
{
    switch (st) {
    case KEEL_OK:
        return CLI_OK;
    case KEEL_EINVAL:
        return CLI_USAGE;
    default:
        return CLI_RUNTIME;
    }
}

int
cli_fail(keel_status st, const char *context)
{
    const char *msg = keel_last_error();
    if (msg[0] == '\0')
        msg = keel_status_name(st);
    if (context != NULL && context[0] != '\0')
        return cli_error(cli_exit_code(st), "%s: %s", context, msg);
    return cli_error(cli_exit_code(st), "%s", msg);
}

int
cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            return 0;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return 1;
    }
    return 0;
}

int
cli_add_override(const char *verb, char **over, int *n_over, char *value)
{
    if (*n_over == CLI_MAX_OVERRIDES)
        return cli_error(CLI_USAGE, "%s: too many -s overrides (limit %d)",
                         verb, CLI_MAX_OVERRIDES);
    over[(*n_over)++] = value;
    return CLI_OK;
}

int cli_bar_drawn;

void
cli_bar_clear(void)
{
    if (!cli_bar_drawn)
        return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    cli_bar_drawn = 0;
}

void
cli_bar_make(cli_bar *b, double frac, double elapsed_secs)
{
    enum { WIDTH = 30 };
    char cells[WIDTH + 1];
    int filled;
    double eta;
    if (frac > 1)
        frac = 1;
    filled = (int)(frac * WIDTH);
    for (int i = 0; i < WIDTH; i++)
        cells[i] = i < filled ? '#' : '.';
    cells[WIDTH] = '\0';
    snprintf(b->head, sizeof b->head, "[%s] %3.0f%%", cells, frac * 100);
    eta = frac > 0 ? elapsed_secs * (1 - frac) / frac : 0;
    snprintf(b->eta, sizeof b->eta, "ETA %dh%02dm%02ds", (int)(eta / 3600),
             (int)fmod(eta / 60, 60), (int)fmod(eta, 60));
}

static void
log_to_stderr(void *ctx, keel_log_level level, const char *msg)
{
    (void)ctx;
    cli_bar_clear();            /* the line starts where the bar was */
    if (level >= KEEL_LOG_WARN)
        fprintf(stderr, "%skeel: %s: %s\n", cli_line_prefix,
                keel_log_level_name(level), msg);
    else
        fprintf(stderr, "%s%s\n", cli_line_prefix, msg);
}

void
cli_install_logger(int verbose)
{
    keel_log_set_handler(log_to_stderr, NULL,
                         verbose ? KEEL_LOG_DEBUG : KEEL_LOG_INFO);
}

const char *
cli_getopt_begin(const char *shorts)
{
    static char spec[64];
    optind = 0;             /* glibc: a full re-initialisation */
    opterr = 0;
    snprintf(spec, sizeof spec, ":%s", shorts);
    return spec;
}

int
cli_getopt_error(char **argv, int c, const char *what)
{
    return cli_getopt_error_as(argv[0], argv[0], argv, c, what);
}

int
cli_getopt_error_as(const char *name, const char *help, char **argv, int c,
                    const char *what)
{
    const char *typed = argv[optind - 1];
    char shortopt[3] = { '-', (char)optopt, '\0' };
    if (c == ':')
        return cli_error(CLI_USAGE, "%s: %s needs %s", name, typed, what);
    /* an unknown short option inside a group (-vx) is reported alone */
    if (optopt != 0 && optopt < 256 && typed[0] == '-' && typed[1] != '-')
        typed = shortopt;
    return cli_error(CLI_USAGE, "%s: unknown option '%s'; see 'keel %s "
                     "--help'", name, typed, help);
}

/* TF_CONFIG's model_dir is checkpoint.dir. A TF_CONFIG that does not parse
 * is reported by cli_resolve_cluster, with every problem listed. */
static keel_status
apply_tf_config_model_dir(keel_config *cfg)
{
    const char *tf = getenv("TF_CONFIG");
    keel_cluster_spec *spec = NULL;
    keel_status st;
    if (tf == NULL || tf[0] == '\0' ||
        keel_cluster_spec_from_env(&spec) != KEEL_OK)
        return KEEL_OK;
    st = keel_config_apply_model_dir(cfg,
                                     keel_cluster_spec_model_dir(spec));
    keel_cluster_spec_free(spec);
    return st;
}

/* Load CONFIG, apply -s overrides and the environment, validate. */
int
cli_load_config(const char *path, int n_over, char **over, keel_config **out)
{
    keel_config *cfg;
    keel_status st = keel_config_new(&cfg);
    *out = NULL;
    if (st != KEEL_OK)
        return cli_fail(st, NULL);
    st = keel_config_load(cfg, path);
    for (int i = 0; st == KEEL_OK && i < n_over; i++)
        st = keel_config_override(cfg, over[i], "-s");
    if (st == KEEL_OK)
        st = keel_config_apply_env(cfg);
    if (st == KEEL_OK)
        st = apply_tf_config_model_dir(cfg);
    if (st == KEEL_OK)
        st = keel_config_validate(cfg);
    if (st != KEEL_OK) {
        keel_config_free(cfg);
        return cli_fail(st, NULL);
    }
    *out = cfg;
    return CLI_OK;
}

/* The cluster keel_cluster_spec_from_slurm derives from Slurm's
 * environment, with [cluster] num_ps and port_base. */
static keel_status
spec_from_slurm(const keel_config *cfg, keel_cluster_spec **spec)
{
    keel_cluster_slurm_config so;
    keel_cluster_slurm_config_init(&so);
    so.num_ps = (int)keel_config_int(cfg, "cluster.num_ps");
    so.port_base = (int)keel_config_int(cfg, "cluster.port_base");
    return keel_cluster_spec_from_slurm(&so, spec);
}

/* Whether the config's [cluster] lists any task. */
static int
config_lists_cluster(const keel_config *cfg)
{
    return keel_config_str(cfg, "cluster.ps")[0] != '\0' ||
           keel_config_str(cfg, "cluster.workers")[0] != '\0' ||
           keel_config_str(cfg, "cluster.chief")[0] != '\0';
}

/* --task TYPE:INDEX into *tt and *idx; a usage error naming it otherwise. */
static int
parse_task(const char *task, keel_task_type *tt, long *idx)
{
    char type[32];
    const char *colon = task ? strchr(task, ':') : NULL;
    char *end;
    if (task == NULL)
        return cli_error(CLI_USAGE, "the config lists a [cluster]: say "
                         "which task this is with --task TYPE:INDEX "
                         "(e.g. --task worker:0)");
    if (colon == NULL || (size_t)(colon - task) >= sizeof type)
        return cli_error(CLI_USAGE, "--task '%s': expected TYPE:INDEX "
                         "(chief:0, worker:1, ps:0)", task);
    memcpy(type, task, (size_t)(colon - task));
    type[colon - task] = '\0';
    *idx = strtol(colon + 1, &end, 10);
    if (keel_task_type_from_name(type, tt) != KEEL_OK || *end != '\0' ||
        end == colon + 1 || *idx < 0 || *idx > 65535)
        return cli_error(CLI_USAGE, "--task '%s': expected TYPE:INDEX "
                         "with TYPE chief, worker or ps", task);
    return CLI_OK;
}

/* The cluster the config's [cluster] lists, this process being --task.
 * A usage error for a bad --task; otherwise CLI_OK with *st the status of
 * building the spec. */
static int
spec_from_lists(const keel_config *cfg, const char *task,
                keel_cluster_spec **spec, keel_status *st)
{
    keel_task_type tt;
    long idx = 0;
    int rc = parse_task(task, &tt, &idx);
    if (rc != CLI_OK)
        return rc;
    *st = keel_cluster_spec_new(spec);
    if (*st == KEEL_OK)
        *st = keel_cluster_spec_add_list(*spec, KEEL_TASK_CHIEF,
                                         keel_config_str(cfg,
                                                         "cluster.chief"));
    if (*st == KEEL_OK)
        *st = keel_cluster_spec_add_list(*spec, KEEL_TASK_PS,
                                         keel_config_str(cfg, "cluster.ps"));
    if (*st == KEEL_OK)
        *st = keel_cluster_spec_add_list(*spec, KEEL_TASK_WORKER,
                                         keel_config_str(cfg,
                                                         "cluster.workers"));
    if (*st == KEEL_OK)
        *st = keel_cluster_spec_set_task(*spec, tt, (int)idx);
    if (*st == KEEL_OK && keel_config_is_async(cfg, NULL))
        keel_cluster_spec_set_mode(*spec, KEEL_CLUSTER_ASYNC);
    return CLI_OK;
}

/* TF: a cluster of one task (only the chief) is local, master ''; an
 * evaluator beside it still evaluates */
static int
runs_locally(const keel_cluster_spec *spec)
{
    return keel_cluster_spec_task_type(spec) != KEEL_TASK_EVALUATOR &&
           (keel_cluster_spec_is_local(spec) ||
            (keel_cluster_spec_num_tasks(spec, KEEL_TASK_CHIEF) == 1 &&
             keel_cluster_spec_num_tasks(spec, KEEL_TASK_PS) == 0 &&
             keel_cluster_spec_num_tasks(spec, KEEL_TASK_WORKER) == 0));
}

/* The config's sync/async mode and replica counts, then validation. */
static keel_status
spec_apply_config(const keel_config *cfg, keel_cluster_spec *spec)
{
    int mode_set = 0, is_async = keel_config_is_async(cfg, &mode_set);
    if (mode_set)
        keel_cluster_spec_set_mode(spec, is_async ? KEEL_CLUSTER_ASYNC
                                                  : KEEL_CLUSTER_SYNC);
    if (keel_config_int(cfg, "cluster.replicas_to_aggregate") > 0 ||
        keel_config_int(cfg, "cluster.total_num_replicas") > 0)
        keel_cluster_spec_set_replicas(spec,
            (int)keel_config_int(cfg, "cluster.replicas_to_aggregate"),
            (int)keel_config_int(cfg, "cluster.total_num_replicas"));
    return keel_cluster_spec_validate(spec);
}

int
cli_resolve_cluster(const keel_config *cfg, const char *task,
                    keel_cluster_spec **out)
{
    keel_cluster_spec *spec = NULL;
    const char *tf = getenv("TF_CONFIG");
    keel_status st;
    int rc;
    *out = NULL;
    if (tf != NULL && tf[0] != '\0') {
        st = keel_cluster_spec_from_env(&spec);
    } else if (getenv("SLURM_PROCID") != NULL) {
        st = spec_from_slurm(cfg, &spec);
    } else if (config_lists_cluster(cfg)) {
        rc = spec_from_lists(cfg, task, &spec, &st);
        if (rc != CLI_OK)
            return rc;
    } else {
        if (task != NULL)
            return cli_error(CLI_USAGE, "--task %s given but there is no "
                             "cluster (no TF_CONFIG, no Slurm, no [cluster] "
                             "lists)", task);
        return CLI_OK;
    }
    if (st == KEEL_OK && runs_locally(spec)) {
        keel_cluster_spec_free(spec);
        return CLI_OK;
    }
    if (st == KEEL_OK)
        st = spec_apply_config(cfg, spec);
    if (st == KEEL_OK)
        st = keel_cluster_spec_wait_hosts(
            spec, keel_config_str(cfg, "cluster.bind_address"),
            keel_config_double(cfg, "cluster.max_wait_secs"));
    if (st != KEEL_OK) {
        keel_cluster_spec_free(spec);
        return cli_error(CLI_USAGE, "cluster: %s", keel_last_error());
    }
    *out = spec;
    return CLI_OK;
}

int64_t
cli_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* hooks.progress: on, or auto with stderr a terminal. */
int
cli_wants_bar(const keel_config *cfg)
{
    const char *mode = keel_config_str(cfg, "hooks.progress");
    return strcmp(mode, "on") == 0 ||
           (strcmp(mode, "auto") == 0 && isatty(2));
}

enum { OPT_TASK = 256, OPT_JSON, OPT_CHECKPOINT, OPT_WARM_START };

/* Parse argv into a (initialised here); allow_eval_opts: eval's options,
 * else train's. CLI_OK or the usage error, on stderr already. */
int
cli_parse_common(int argc, char **argv, int allow_eval_opts,
                 cli_common_args *a)
{
    static const struct option train_opts[] = {
        { "set", required_argument, NULL, 's' },
        { "verbose", no_argument, NULL, 'v' },
        { "task", required_argument, NULL, OPT_TASK },
        { "warm-start", required_argument, NULL, OPT_WARM_START },
        { NULL, 0, NULL, 0 },
    };
    static const struct option eval_opts[] = {
        { "set", required_argument, NULL, 's' },
        { "verbose", no_argument, NULL, 'v' },
        { "json", no_argument, NULL, OPT_JSON },
        { "checkpoint", required_argument, NULL, OPT_CHECKPOINT },
        { NULL, 0, NULL, 0 },
    };
    /* --warm-start's override (the last one given wins, as with -s) */
    static char warm[4200];
    const char *spec = cli_getopt_begin("s:v");
    int c;
    memset(a, 0, sizeof *a);
    while ((c = getopt_long(argc, argv, spec,
                            allow_eval_opts ? eval_opts : train_opts,
                            NULL)) != -1) {
        switch (c) {
        case 's':
            if (cli_add_override(argv[0], a->over, &a->n_over, optarg) !=
                CLI_OK)
                return CLI_USAGE;
            break;
        case 'v':
            a->verbose = 1;
            break;
        case OPT_TASK:
        case OPT_CHECKPOINT:
            a->ckpt = optarg;
            break;
        case OPT_WARM_START:
            if ((size_t)snprintf(warm, sizeof warm,
                                 "checkpoint.warm_start_from=%s", optarg)
                >= sizeof warm)
                return cli_error(CLI_USAGE, "%s: --warm-start path too "
                                 "long", argv[0]);
            if (cli_add_override(argv[0], a->over, &a->n_over, warm) !=
                CLI_OK)
                return CLI_USAGE;
            break;
        case OPT_JSON:
            a->json = 1;
            break;
        default:
            return cli_getopt_error(argv, c,
                                    optopt == 's' ? "section.key=value"
                                    : optopt == OPT_TASK ? "TYPE:INDEX"
                                    : optopt == OPT_WARM_START ? "CKPT"
                                                         : "a FILE");
        }
    }
    for (int i = optind; i < argc; i++) {
        if (a->path != NULL)
            return cli_error(CLI_USAGE, "%s takes one CONFIG, got '%s' and "
                             "'%s'", argv[0], a->path, argv[i]);
        a->path = argv[i];
    }
    if (a->path == NULL)
        return cli_error(CLI_USAGE, "%s needs a CONFIG file; see 'keel %s "
                         "--help'", argv[0], argv[0]);
    return CLI_OK;
}

/* CKPT, or a directory's newest valid checkpoint, into buf. */
int
cli_resolve_ckpt(const char *arg, char *buf, size_t size)
{
    int64_t step;
    struct stat sb;
    if (stat(arg, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        keel_status st = keel_ckpt_latest(arg, NULL, buf, size, &step);
        return st == KEEL_OK ? CLI_OK : cli_fail(st, arg);
    }
    if ((size_t)snprintf(buf, size, "%s", arg) >= size)
        return cli_error(CLI_USAGE, "checkpoint path too long");
    return CLI_OK;
}

int
cli_open_model(const char *ckpt_arg, const char *config, keel_inference **inf)
{
    char ckpt[4096];
    keel_config *cfg = NULL;
    keel_status st;
    int rc = cli_resolve_ckpt(ckpt_arg, ckpt, sizeof ckpt);
    if (rc != CLI_OK)
        return rc;
    if (config != NULL && (rc = cli_load_config(config, 0, NULL, &cfg)) !=
        CLI_OK)
        return rc;
    st = keel_inference_open(ckpt, cfg, 256, inf);
    keel_config_free(cfg);
    if (st != KEEL_OK)
        return cli_fail(st, ckpt);
    return CLI_OK;
}
