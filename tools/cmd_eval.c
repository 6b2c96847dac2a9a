/* cmd_eval.c - `keel eval CONFIG|DIR|CKPT.h5`: a checkpoint on the test
 * set, with no cluster. The result goes to stdout (one line, or one JSON
 * object); on a terminal a progress bar with ETA is redrawn on stderr. */
#include <config.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <json-c/json.h>

#include "cli.h"

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
    int64_t t = cli_now_ns();
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
config_from_checkpoint(const char *src, const cli_common_args *a,
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
eval_dir_config(const cli_common_args *a, eval_target *t, keel_config **cfg)
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
eval_config(cli_common_args *a, eval_target *t, keel_config **cfg)
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
    cli_common_args a;
    eval_target t;
    keel_config *cfg;
    keel_eval_result res;
    keel_status st;
    eval_bar eb;
    int rc;

    if (cli_wants_help(argc, argv))
        return eval_usage(stdout, CLI_OK);
    rc = cli_parse_common(argc, argv, 1, &a);
    if (rc != CLI_OK)
        return rc;
    cli_install_logger(a.verbose);
    rc = eval_config(&a, &t, &cfg);
    if (rc != CLI_OK)
        return rc;
    eb.t0_ns = eb.last_ns = cli_now_ns();
    st = keel_job_eval_progress(cfg, t.ckpt, cli_wants_bar(cfg)
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
