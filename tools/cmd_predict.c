/* cmd_predict.c - `keel predict CKPT INPUT [--json]`: classify INPUT's
 * examples with a checkpoint's model, outside training, from the
 * checkpoint alone (its architecture attribute) or, for checkpoints
 * written before keel stored one, with --config. */
#include <config.h>

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int
predict_usage(FILE *out, int code)
{
    fprintf(out,
            "usage: keel predict CKPT INPUT [--json] [--labels FILE]\n"
            "                    [--config CONFIG]\n"
            "\n"
            "Classify the examples of INPUT with checkpoint CKPT's model, with\n"
            "no strategy and no cluster. INPUT: an IDX image file (gzip'd or\n"
            "not), a .npy array (uint8 or float32; (N,H,W), (N,H,W,C) or\n"
            "(N,D)) or an HDF5 file with dataset x (and optionally y).\n"
            "Prints one line per example: index, class, its probability; with\n"
            "labels (--labels IDX file, or y in the HDF5 input) the accuracy\n"
            "last.\n"
            "\n"
            "  --json            one JSON object per line: {\"index\", \"class\",\n"
            "                    \"probabilities\": [...]} (and \"label\"), then\n"
            "                    {\"examples\", \"accuracy\"} when labelled\n"
            "  --labels FILE     IDX label file (gzip'd or not) for INPUT\n"
            "  --config CONFIG   the job's config, for checkpoints that hold\n"
            "                    no architecture (written by older keel)\n");
    return code;
}

/* What cmd_predict's steps share: the command line, the model, and the
 * examples with their labels (-1: none) and predicted probabilities. */
typedef struct predict_run {
    const char *ckpt, *input, *labels, *config;
    int json, help;
    keel_inference *inf;
    const keel_model_config *mc;
    keel_dataset *ds;
    size_t n, esize;
    float *x, *probs;
    int32_t *y;
} predict_run;

/* Parse argv into r (initialised here): --json, --labels, --config, then
 * CKPT and INPUT. CLI_OK (r->help set for --help) or the usage error, on
 * stderr already. */
static int
predict_parse(int argc, char **argv, predict_run *r)
{
    static const struct option longs[] = {
        { "json", no_argument, NULL, 'j' },
        { "labels", required_argument, NULL, 'l' },
        { "config", required_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *spec = cli_getopt_begin("h");
    int opt;

    memset(r, 0, sizeof *r);
    while ((opt = getopt_long(argc, argv, spec, longs, NULL)) != -1) {
        switch (opt) {
        case 'j':
            r->json = 1;
            break;
        case 'l':
            r->labels = optarg;
            break;
        case 'c':
            r->config = optarg;
            break;
        case 'h':
            r->help = 1;
            return CLI_OK;
        default:
            return cli_getopt_error(argv, opt, "a FILE");
        }
    }
    for (int i = optind; i < argc; i++) {
        const char *a = argv[i];
        if (r->ckpt == NULL) {
            r->ckpt = a;
        } else if (r->input == NULL) {
            r->input = a;
        } else {
            return cli_error(CLI_USAGE, "predict takes CKPT and INPUT, got "
                             "a third argument '%s'", a);
        }
    }
    if (r->ckpt == NULL || r->input == NULL)
        return cli_error(CLI_USAGE, "predict needs CKPT and INPUT; see "
                         "'keel predict --help'");
    return CLI_OK;
}

/* The model, and INPUT (with --labels, its labels) as a dataset whose
 * examples are the size the model takes. */
static int
predict_open(predict_run *r)
{
    int64_t h, w, c;
    keel_status st;
    int rc = cli_open_model(r->ckpt, r->config, &r->inf);

    if (rc != CLI_OK)
        return rc;
    r->mc = keel_inference_model_config(r->inf);
    st = r->labels != NULL
        ? keel_dataset_open_idx(r->input, r->labels, (int)r->mc->classes,
                                &r->ds)
        : keel_dataset_open_inputs(r->input, &r->ds);
    if (st != KEEL_OK)
        return cli_fail(st, "predict: input");
    r->n = keel_dataset_count(r->ds);
    r->esize = keel_dataset_example_size(r->ds);
    keel_dataset_shape(r->ds, &h, &w, &c);
    if (r->esize != (size_t)(r->mc->height * r->mc->width *
                             r->mc->channels))
        return cli_error(CLI_USAGE, "predict: %s has examples of %lldx%lldx"
                         "%lld values; the model takes %lldx%lldx%lld",
                         r->input, (long long)h, (long long)w, (long long)c,
                         (long long)r->mc->height, (long long)r->mc->width,
                         (long long)r->mc->channels);
    return CLI_OK;
}

/* Every example and label into memory, and the model's probabilities for
 * all of them. */
static int
predict_compute(predict_run *r)
{
    keel_status st = KEEL_OK;

    r->x = malloc(r->n * r->esize * sizeof *r->x);
    r->y = malloc(r->n * sizeof *r->y);
    r->probs = malloc(r->n * (size_t)r->mc->classes * sizeof *r->probs);
    if (r->x == NULL || r->y == NULL || r->probs == NULL)
        return cli_error(CLI_RUNTIME, "predict: out of memory for %zu "
                         "examples", r->n);
    for (size_t i = 0; i < r->n && st == KEEL_OK; i++)
        st = keel_dataset_get(r->ds, i, r->x + i * r->esize, r->y + i);
    if (st != KEEL_OK)
        return cli_fail(st, "predict");
    /* labels from the input itself (HDF5 y) are read without knowing the
     * model: refuse those past its classes, as eval does */
    for (size_t i = 0; i < r->n; i++)
        if (r->y[i] >= r->mc->classes)
            return cli_error(CLI_RUNTIME, "predict: input %s: label %lld of "
                             "example %zu outside [0, %lld) (the model's "
                             "classes)", r->input, (long long)r->y[i], i,
                             (long long)r->mc->classes);
    st = keel_inference_predict(r->inf, r->x, r->n, r->probs);
    if (st != KEEL_OK)
        return cli_fail(st, "predict");
    /* the softmax subtracts the largest logit, so finite logits give
     * finite probabilities; inputs so large that a layer overflows float32
     * do not */
    for (size_t i = 0; i < r->n; i++)
        for (int64_t k = 0; k < r->mc->classes; k++)
            if (!isfinite(r->probs[i * (size_t)r->mc->classes + k]))
                return cli_error(CLI_RUNTIME, "predict: example %zu of %s: "
                                 "the model's output is not finite (a "
                                 "layer overflowed float32: inputs too "
                                 "large?); nothing printed", i, r->input);
    return CLI_OK;
}

/* The most probable of n classes (the first on a tie). */
static int64_t
argmax(const float *p, int64_t n)
{
    int64_t best = 0;
    for (int64_t k = 1; k < n; k++)
        if (p[k] > p[best])
            best = k;
    return best;
}

/* Example i's line: index, class and its probability (--json: every
 * probability), and its label when it has one. */
static void
print_example(const predict_run *r, size_t i, int64_t best)
{
    const float *p = r->probs + i * (size_t)r->mc->classes;
    int32_t label = r->y[i];

    if (r->json) {
        printf("{\"index\": %zu, \"class\": %lld", i, (long long)best);
        if (label >= 0)
            printf(", \"label\": %d", (int)label);
        printf(", \"probabilities\": [");
        for (int64_t k = 0; k < r->mc->classes; k++)
            printf("%s%.9g", k ? ", " : "", (double)p[k]);
        printf("]}\n");
    } else {
        printf("%zu\t%lld\t%.6f%s", i, (long long)best, (double)p[best],
               label >= 0 ? "" : "\n");
        if (label >= 0)
            printf("\tlabel %d\n", (int)label);
    }
}

/* One line per example, then the accuracy over the labelled ones. */
static void
predict_print(const predict_run *r)
{
    int64_t correct = 0, labelled = 0;

    for (size_t i = 0; i < r->n; i++) {
        int64_t best = argmax(r->probs + i * (size_t)r->mc->classes,
                              r->mc->classes);
        if (r->y[i] >= 0) {
            labelled++;
            correct += best == r->y[i];
        }
        print_example(r, i, best);
    }
    if (labelled > 0) {
        double acc = (double)correct / (double)labelled;
        if (r->json)
            printf("{\"examples\": %lld, \"accuracy\": %.6f}\n",
                   (long long)labelled, acc);
        else
            printf("accuracy %.4f (%lld of %lld examples)\n", acc,
                   (long long)correct, (long long)labelled);
    }
}

int
cmd_predict(int argc, char **argv)
{
    predict_run r;
    int rc = predict_parse(argc, argv, &r);

    if (rc != CLI_OK)
        return rc;
    if (r.help)
        return predict_usage(stdout, CLI_OK);
    rc = predict_open(&r);
    if (rc == CLI_OK)
        rc = predict_compute(&r);
    if (rc == CLI_OK)
        predict_print(&r);
    free(r.x);
    free(r.y);
    free(r.probs);
    keel_dataset_free(r.ds);
    keel_inference_free(r.inf);
    return rc;
}
