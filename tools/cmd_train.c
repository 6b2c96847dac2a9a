/* cmd_train.c - `keel train CONFIG`: the main job, on one process or as
 * this task of a cluster. Step lines go to stdout; on a terminal a progress
 * bar with ETA is redrawn on stderr. */
#include <config.h>

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int
train_usage(FILE *out, int code)
{
    fprintf(out,
            "usage: keel train CONFIG [-s section.key=value]... [-v]\n"
            "                  [--task TYPE:INDEX] [--warm-start=CKPT]\n"
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
            "  --warm-start=CKPT   start a new run from the variables of\n"
            "                      checkpoint CKPT (a file or a directory),\n"
            "                      by name; same as -s\n"
            "                      checkpoint.warm_start_from=CKPT\n"
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

static void
on_progress(void *ctx, const keel_job_progress *p)
{
    progress_state *ps = ctx;
    ps->eps_smooth = ps->eps_smooth > 0
        ? 0.9 * ps->eps_smooth + 0.1 * p->examples_per_sec
        : p->examples_per_sec;
    if (ps->every > 0 && p->global_step % ps->every == 0) {
        cli_bar_clear();
        printf("%sstep %lld  epoch %lld  loss %.4f  accuracy %.4f  lr %.3g  "
               "%.0f examples/s", cli_line_prefix, (long long)p->global_step,
               (long long)p->epoch + 1, p->loss, p->accuracy,
               p->learning_rate, p->examples_per_sec);
        if (ps->cluster)
            printf(" (cluster %.0f examples/s)", p->global_examples_per_sec);
        putchar('\n');
        fflush(stdout);
    }
    if (ps->bar && p->last_step > 0) {
        int64_t t = cli_now_ns();
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
    printf("%sepoch %lld ended at step %lld: learning rate %g",
           cli_line_prefix, (long long)e->epoch, (long long)e->global_step,
           e->learning_rate);
    if (e->validated)
        printf("; validation loss %.4f, accuracy %.4f (%lld examples)",
               e->val_loss, e->val_accuracy, (long long)e->val_examples);
    if (e->checkpoint[0] != '\0')
        printf("; saved %s", e->checkpoint);
    putchar('\n');
    fflush(stdout);
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
        printf("%sstopped by a signal before training started; "
               "checkpoints in %s\n", cli_line_prefix,
               keel_config_str(cfg, "checkpoint.dir"));
        return;
    }
    printf("%strained steps %lld..%lld (%lld examples, %.1f s, %.0f "
           "examples/s", cli_line_prefix, (long long)res->start_step,
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
    ps.bar = cli_wants_bar(cfg);
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
    cli_common_args a;
    keel_config *cfg;
    keel_cluster_spec *spec;
    int rc;

    if (cli_wants_help(argc, argv))
        return train_usage(stdout, CLI_OK);
    rc = cli_parse_common(argc, argv, 0, &a);
    if (rc != CLI_OK)
        return rc;
    cli_install_logger(a.verbose);
    /* ranks of multi_worker_mirrored name themselves on every line, from
     * the start (a config error too); other tasks get no prefix */
    cli_prefix_mpi_rank();
    rc = cli_load_config(a.path, a.n_over, a.over, &cfg);
    if (rc != CLI_OK)
        return rc;
    if (strcmp(keel_config_str(cfg, "train.strategy"),
               "multi_worker_mirrored") != 0)
        cli_line_prefix[0] = '\0';
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
