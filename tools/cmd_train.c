/* cmd_train.c - `keel train CONFIG` and `keel eval CONFIG|DIR`: the main
 * job on one process. Step lines go to stdout; on a terminal a progress bar
 * with ETA is redrawn on stderr. */
#include <config.h>

#include <getopt.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include <keel/keel.h>
#include "cli.h"

static int
train_usage(FILE *out, int code)
{
    fprintf(out,
            "usage: keel train CONFIG [-s section.key=value]... [-v]\n"
            "                  [--task TYPE:INDEX]\n"
            "\n"
            "Train the job CONFIG describes under a MonitoredTrainingSession:\n"
            "resume from the newest valid checkpoint in checkpoint.dir (or\n"
            "$OUTPUT_DIR), log step lines, write checkpoints and TensorBoard\n"
            "scalars, and stop at train.max_steps or after train.epochs.\n"
            "SIGTERM or SIGINT stops at the next step, writes a final\n"
            "checkpoint and exits 0.\n"
            "\n"
            "In a cluster (TF_CONFIG, Slurm, or the [cluster] lists with\n"
            "--task) this process takes its role: ps serves a shard of the\n"
            "variables until the chief says stop; chief and workers train\n"
            "replicas (docs/cluster.md); an evaluator task evaluates each\n"
            "new checkpoint in checkpoint.dir until the final step's.\n"
            "\n"
            "  -s, --set K=V       override a config key (repeatable)\n"
            "  --task TYPE:INDEX   this task (chief:0, worker:1, ps:0) when\n"
            "                      the cluster comes from [cluster] lists\n"
            "  -v, --verbose       debug logging\n");
    return code;
}

typedef struct progress_state {
    int64_t every;          /* step line every N steps (0: none) */
    int bar;                /* draw a bar on stderr */
    int cluster;            /* a cluster replica: report global examples/s */
    double eps_smooth;      /* examples/s for the bar, smoothed */
    int64_t last_draw_ns;
} progress_state;

static int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void
on_progress(void *ctx, const keel_job_progress *p)
{
    progress_state *ps = ctx;
    ps->eps_smooth = ps->eps_smooth > 0
        ? 0.9 * ps->eps_smooth + 0.1 * p->examples_per_sec
        : p->examples_per_sec;
    if (ps->every > 0 && p->global_step % ps->every == 0) {
        cli_bar_clear();
        printf("step %lld  epoch %lld  loss %.4f  accuracy %.4f  lr %.3g  "
               "%.0f examples/s", (long long)p->global_step,
               (long long)p->epoch + 1, p->loss, p->accuracy,
               p->learning_rate, p->examples_per_sec);
        if (ps->cluster)
            printf(" (cluster %.0f examples/s)", p->global_examples_per_sec);
        putchar('\n');
        fflush(stdout);
    }
    if (ps->bar && p->last_step > 0) {
        int64_t t = now_ns();
        if (t - ps->last_draw_ns >= 100000000 ||
            p->global_step >= p->last_step) {
            cli_bar b;
            cli_bar_make(&b, (double)p->global_step / (double)p->last_step,
                         p->elapsed_secs);
            fprintf(stderr, "\r\033[K");
            if (p->epochs > 0)
                fprintf(stderr, "epoch %lld/%lld ", (long long)p->epoch + 1
                        > (long long)p->epochs ? (long long)p->epochs
                        : (long long)p->epoch + 1, (long long)p->epochs);
            else
                fprintf(stderr, "epoch %lld ", (long long)p->epoch + 1);
            fprintf(stderr, "%s  step %lld/%lld  %.0f ex/s  loss %.4f  %s",
                    b.head, (long long)p->global_step,
                    (long long)p->last_step, ps->eps_smooth, p->loss, b.eta);
            fflush(stderr);
            cli_bar_drawn = 1;
            ps->last_draw_ns = t;
        }
    }
}

static void
on_epoch(void *ctx, const keel_job_epoch *e)
{
    (void)ctx;
    cli_bar_clear();
    printf("epoch %lld ended at step %lld: learning rate %g",
           (long long)e->epoch, (long long)e->global_step, e->learning_rate);
    if (e->validated)
        printf("; validation loss %.4f, accuracy %.4f (%lld examples)",
               e->val_loss, e->val_accuracy, (long long)e->val_examples);
    if (e->checkpoint[0] != '\0')
        printf("; saved %s", e->checkpoint);
    putchar('\n');
    fflush(stdout);
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
    if (st != KEEL_OK) {
        keel_cluster_spec_free(spec);
        return cli_error(CLI_USAGE, "cluster: %s", keel_last_error());
    }
    *out = spec;
    return CLI_OK;
}

enum { OPT_TASK = 256, OPT_JSON, OPT_CHECKPOINT };

/* What train's and eval's command lines give: CONFIG (eval: or DIR or
 * CKPT.h5), the -s overrides, -v, and train's --task or eval's --checkpoint
 * and --json. */
typedef struct common_args {
    const char *path;
    const char *ckpt;             /* --task (train), --checkpoint (eval) */
    char *over[CLI_MAX_OVERRIDES];
    int n_over, verbose, json;
} common_args;

/* Parse argv into a (initialised here); allow_eval_opts: eval's options,
 * else train's. CLI_OK or the usage error, on stderr already. */
static int
parse_common(int argc, char **argv, int allow_eval_opts, common_args *a)
{
    static const struct option train_opts[] = {
        { "set", required_argument, NULL, 's' },
        { "verbose", no_argument, NULL, 'v' },
        { "task", required_argument, NULL, OPT_TASK },
        { NULL, 0, NULL, 0 },
    };
    static const struct option eval_opts[] = {
        { "set", required_argument, NULL, 's' },
        { "verbose", no_argument, NULL, 'v' },
        { "json", no_argument, NULL, OPT_JSON },
        { "checkpoint", required_argument, NULL, OPT_CHECKPOINT },
        { NULL, 0, NULL, 0 },
    };
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
        case OPT_JSON:
            a->json = 1;
            break;
        default:
            return cli_getopt_error(argv, c,
                                    optopt == 's' ? "section.key=value"
                                    : optopt == OPT_TASK ? "TYPE:INDEX"
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

/* A cluster task receives every variable or gradient in buffers libzmq
 * mallocs per message (on its I/O thread) and keel frees (on the training
 * or ps thread); glibc hands freed multi-MiB blocks back to the kernel,
 * and with one arena per thread a block freed into the I/O thread's arena
 * heap is unmapped with that heap, so each receive page-faults them in
 * again (sys time above user time, half the wire speed; bench/README.md).
 * This process keeps them, in one arena: up to 1 GiB of freed memory
 * stays mapped (docs/cluster.md, keel(1)). A process-wide choice, so the
 * program's, never libkeel's; a user's own GLIBC_TUNABLES malloc settings
 * win. */
static void
keep_message_buffers(void)
{
    const char *t = getenv("GLIBC_TUNABLES");
    if (t != NULL && strstr(t, "glibc.malloc.") != NULL)
        return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);    /* glibc's largest */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_ARENA_MAX, 1);
}

/* TF_CONFIG task type evaluator: no training; evaluate each new
 * checkpoint until the final step's (docs/cluster.md, "Evaluator"). */
static int
run_evaluator(const keel_config *cfg)
{
    keel_evaluator_config o;
    keel_evaluator_result r;
    keel_status st;
    keel_evaluator_config_init(&o);
    o.handle_signals = 1;
    st = keel_job_run_evaluator(cfg, &o, &r);
    if (st != KEEL_OK)
        return cli_fail(st, "evaluator");
    printf("evaluator: %lld checkpoint%s evaluated (%lld skipped), last "
           "step %lld%s\n", (long long)r.evaluated,
           r.evaluated == 1 ? "" : "s", (long long)r.skipped,
           (long long)r.last_step,
           r.stopped_by_signal ? "; stopped by a signal" : "");
    return CLI_OK;
}

/* hooks.progress: on, or auto with stderr a terminal. */
static int
wants_bar(const keel_config *cfg)
{
    const char *mode = keel_config_str(cfg, "hooks.progress");
    return strcmp(mode, "on") == 0 ||
           (strcmp(mode, "auto") == 0 && isatty(2));
}

/* The cluster this task belongs to (NULL: one process).
 * multi_worker_mirrored: the ranks come from MPI, not a cluster spec
 * (srun's SLURM_PROCID is then an MPI rank, not a ps task). */
static int
train_cluster(const keel_config *cfg, const char *task,
              keel_cluster_spec **spec)
{
    *spec = NULL;
    if (strcmp(keel_config_str(cfg, "train.strategy"),
               "multi_worker_mirrored") != 0 || getenv("TF_CONFIG") != NULL)
        return cli_resolve_cluster(cfg, task, spec);
    return CLI_OK;
}

/* The run's last line: the steps trained and the examples/s (a cluster's
 * chief also the whole cluster's), or a stop before training began. */
static void
train_report(const keel_config *cfg, const keel_job_result *res,
             int cluster_chief)
{
    if (res->end_reason == KEEL_END_SIGNAL && res->examples == 0 &&
        res->seconds == 0.0) {
        /* SIGTERM while waiting for the cluster: no session ever ran */
        printf("stopped by a signal before training started; checkpoints "
               "in %s\n", keel_config_str(cfg, "checkpoint.dir"));
        return;
    }
    printf("trained steps %lld..%lld (%lld examples, %.1f s, %.0f "
           "examples/s", (long long)res->start_step,
           (long long)res->final_step, (long long)res->examples,
           res->seconds,
           res->seconds > 0 ? res->examples / res->seconds : 0.0);
    if (cluster_chief)
        printf("; cluster %lld examples, %.0f examples/s",
               (long long)res->cluster_examples, res->seconds > 0
               ? res->cluster_examples / res->seconds : 0.0);
    printf("); checkpoints in %s\n", keel_config_str(cfg, "checkpoint.dir"));
}

/* Train as this task of spec (NULL: one process), with the progress lines
 * and bar, then report: a ps its stop, the others the run. */
static int
train_task(const keel_config *cfg, const keel_cluster_spec *spec)
{
    int in_cluster = spec != NULL && !keel_cluster_spec_is_local(spec);
    keel_job_config opts;
    keel_job_result res;
    progress_state ps;
    keel_status st;

    if (in_cluster)
        keep_message_buffers();
    memset(&ps, 0, sizeof ps);
    ps.every = keel_config_int(cfg, "hooks.log_every_steps");
    ps.bar = wants_bar(cfg);
    ps.cluster = in_cluster;
    keel_job_config_init(&opts);
    opts.progress_fn = on_progress;
    opts.epoch_fn = on_epoch;
    opts.progress_ctx = &ps;
    opts.handle_signals = 1;
    opts.cluster = spec;
    st = keel_job_train(cfg, &opts, &res);
    cli_bar_clear();
    if (st != KEEL_OK)
        return cli_fail(st, "train");
    if (spec != NULL && keel_cluster_spec_task_type(spec) == KEEL_TASK_PS) {
        printf("ps %d: stopped\n", keel_cluster_spec_task_index(spec));
        return CLI_OK;
    }
    train_report(cfg, &res, in_cluster && keel_cluster_spec_is_chief(spec));
    return CLI_OK;
}

int
cmd_train(int argc, char **argv)
{
    common_args a;
    keel_config *cfg;
    keel_cluster_spec *spec;
    int rc;

    if (cli_wants_help(argc, argv))
        return train_usage(stdout, CLI_OK);
    rc = parse_common(argc, argv, 0, &a);
    if (rc != CLI_OK)
        return rc;
    cli_install_logger(a.verbose);
    rc = cli_load_config(a.path, a.n_over, a.over, &cfg);
    if (rc != CLI_OK)
        return rc;
    rc = train_cluster(cfg, a.ckpt, &spec);         /* a.ckpt: --task */
    if (rc == CLI_OK && spec != NULL &&
        keel_cluster_spec_task_type(spec) == KEEL_TASK_EVALUATOR) {
        keel_cluster_spec_free(spec);
        spec = NULL;
        rc = run_evaluator(cfg);
    } else if (rc == CLI_OK) {
        rc = train_task(cfg, spec);
    }
    keel_cluster_spec_free(spec);
    keel_config_free(cfg);
    return rc;
}

static int
eval_usage(FILE *out, int code)
{
    fprintf(out,
            "usage: keel eval CONFIG|DIR|CKPT.h5 [--checkpoint FILE] [--json]\n"
            "                 [-s section.key=value]...\n"
            "\n"
            "Restore a checkpoint with no cluster and print the test loss and\n"
            "accuracy. CONFIG: its checkpoint.dir's newest valid checkpoint;\n"
            "DIR: a checkpoint directory, whose newest checkpoint also gives\n"
            "the model and data settings it was trained with; CKPT.h5: that\n"
            "checkpoint, with the settings it holds (no CONFIG needed).\n"
            "\n"
            "  --checkpoint FILE  evaluate this checkpoint instead\n"
            "  --json             print one JSON object: step, loss, accuracy,\n"
            "                     examples, checkpoint\n");
    return code;
}

/* A double as JSON with 6 decimals (the figure keel eval prints). */
static json_object *
json_fixed6(double v)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.6f", v);
    return json_object_new_double_s(v, buf);
}

/* keel eval --json: {"step": N, "loss": x, "accuracy": x, "examples": N,
 * "checkpoint": "path"} on one line. */
static void
print_eval_json(const keel_eval_result *res)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "step", json_object_new_int64(res->step));
    json_object_object_add(o, "loss", json_fixed6(res->loss));
    json_object_object_add(o, "accuracy", json_fixed6(res->accuracy));
    json_object_object_add(o, "examples",
                           json_object_new_int64(res->examples));
    json_object_object_add(o, "checkpoint",
                           json_object_new_string(res->checkpoint));
    puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_SPACED |
                                        JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
}

/* keel eval's bar: examples done of the test set, examples/s, ETA. */
typedef struct eval_bar {
    int64_t t0_ns, last_ns;
} eval_bar;

static void
on_eval_progress(void *ctx, int64_t done, int64_t total)
{
    eval_bar *eb = ctx;
    int64_t t = now_ns();
    double secs = (t - eb->t0_ns) / 1e9;
    cli_bar b;
    if (t - eb->last_ns < 100000000 && done < total)
        return;
    eb->last_ns = t;
    cli_bar_make(&b, total > 0 ? (double)done / (double)total : 1, secs);
    fprintf(stderr, "\r\033[Keval %s  %lld/%lld examples  %.0f ex/s  %s",
            b.head, (long long)done, (long long)total,
            secs > 0 ? done / secs : 0.0, b.eta);
    fflush(stderr);
    cli_bar_drawn = 1;
}

/* 1 if path starts with the HDF5 signature. */
static int
is_hdf5(const char *path)
{
    unsigned char sig[8];
    FILE *f = fopen(path, "rb");
    size_t n;
    if (f == NULL)
        return 0;
    n = fread(sig, 1, sizeof sig, f);
    fclose(f);
    return n == 8 && memcmp(sig, "\211HDF\r\n\032\n", 8) == 0;
}

/* The config checkpoint src carries, with a's -s overrides. */
static keel_status
config_from_checkpoint(const char *src, const common_args *a,
                       keel_config **cfg)
{
    keel_status st = keel_config_from_checkpoint(src, cfg);
    for (int i = 0; st == KEEL_OK && i < a->n_over; i++)
        st = keel_config_override(*cfg, a->over[i], "-s");
    return st;
}

/* What eval evaluates: the checkpoint (NULL: the newest in
 * checkpoint.dir), which may be latest. */
typedef struct eval_target {
    const char *ckpt;
    char latest[1024];
} eval_target;

/* A checkpoint directory: the config of --checkpoint or of its newest
 * checkpoint, which is then the one evaluated; checkpoint.dir is dir. */
static int
eval_dir_config(const common_args *a, eval_target *t, keel_config **cfg)
{
    const char *src = a->ckpt;
    char set[1100];
    int64_t step;
    keel_status st;

    if (src == NULL) {
        st = keel_ckpt_latest(a->path, NULL, t->latest, sizeof t->latest,
                              &step);
        if (st != KEEL_OK)
            return cli_fail(st, "eval");
        src = t->latest;
    }
    st = config_from_checkpoint(src, a, cfg);
    if (st == KEEL_OK) {
        snprintf(set, sizeof set, "checkpoint.dir=%s", a->path);
        st = keel_config_override(*cfg, set, "eval DIR");
    }
    if (st != KEEL_OK) {
        keel_config_free(*cfg);
        return cli_fail(st, "eval");
    }
    t->ckpt = src;
    return CLI_OK;
}

/* The config and checkpoint of a->path: a checkpoint file (its own
 * config), a checkpoint directory, or a CONFIG file (--checkpoint, or the
 * newest checkpoint in its checkpoint.dir). */
static int
eval_config(common_args *a, eval_target *t, keel_config **cfg)
{
    struct stat sb;
    keel_status st;

    *cfg = NULL;
    t->ckpt = a->ckpt;
    if (is_hdf5(a->path)) {
        /* A checkpoint file: it carries its config (and architecture). */
        if (a->ckpt != NULL)
            return cli_error(CLI_USAGE, "eval %s: --checkpoint is for CONFIG "
                             "or DIR, not a checkpoint file", a->path);
        st = config_from_checkpoint(a->path, a, cfg);
        if (st != KEEL_OK) {
            keel_config_free(*cfg);
            return cli_fail(st, "eval");
        }
        t->ckpt = a->path;
        return CLI_OK;
    }
    if (stat(a->path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return eval_dir_config(a, t, cfg);
    return cli_load_config(a->path, a->n_over, a->over, cfg);
}

int
cmd_eval(int argc, char **argv)
{
    common_args a;
    eval_target t;
    keel_config *cfg;
    keel_eval_result res;
    keel_status st;
    eval_bar eb;
    int rc;

    if (cli_wants_help(argc, argv))
        return eval_usage(stdout, CLI_OK);
    rc = parse_common(argc, argv, 1, &a);
    if (rc != CLI_OK)
        return rc;
    cli_install_logger(a.verbose);
    rc = eval_config(&a, &t, &cfg);
    if (rc != CLI_OK)
        return rc;
    eb.t0_ns = eb.last_ns = now_ns();
    st = keel_job_eval_progress(cfg, t.ckpt, wants_bar(cfg)
                                ? on_eval_progress : NULL, &eb, &res);
    cli_bar_clear();
    keel_config_free(cfg);
    if (st != KEEL_OK)
        return cli_fail(st, "eval");
    if (a.json)
        print_eval_json(&res);
    else
        printf("step %lld: test loss %.4f, accuracy %.4f (%lld examples, "
               "%s)\n", (long long)res.step, res.loss, res.accuracy,
               (long long)res.examples, res.checkpoint);
    return CLI_OK;
}
