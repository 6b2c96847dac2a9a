/* cmd_export.c - `keel export CKPT --format F [-o FILE]` and `keel predict
 * CKPT INPUT [--json]`: a checkpoint's model outside training, from the
 * checkpoint alone (its architecture attribute) or, for checkpoints
 * written before keel stored one, with --config. */
#include <config.h>

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <keel/keel.h>
#include "cli.h"

static int
export_usage(FILE *out, int code)
{
    fprintf(out,
            "usage: keel export CKPT --format keras-h5|safetensors|onnx\n"
            "                   [-o FILE] [--config CONFIG]\n"
            "\n"
            "Write the model of checkpoint CKPT (a .h5 file, or a checkpoint\n"
            "directory: its newest valid checkpoint) in a format other tools\n"
            "load (docs/export.md):\n"
            "  keras-h5     Keras's HDF5 weight layout (model.load_weights)\n"
            "  safetensors  JSON header and little-endian float32 tensors\n"
            "  onnx         an ONNX graph with the weights as initializers\n"
            "\n"
            "  -o, --output FILE  where to write (default: CKPT with the\n"
            "                     format's extension, e.g. model.ckpt-200.onnx)\n"
            "  --config CONFIG    the job's config, for checkpoints that hold\n"
            "                     no architecture (written by older keel)\n");
    return code;
}

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

/* CKPT, or a directory's newest valid checkpoint, into buf. */
static int
resolve_ckpt(const char *arg, char *buf, size_t size)
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

static int
open_model(const char *ckpt_arg, const char *config, keel_inference **inf)
{
    char ckpt[4096];
    keel_config *cfg = NULL;
    keel_status st;
    int rc = resolve_ckpt(ckpt_arg, ckpt, sizeof ckpt);
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

int
cmd_export(int argc, char **argv)
{
    const char *ckpt = NULL, *format = NULL, *output = NULL, *config = NULL;
    keel_export_format f;
    keel_inference *inf = NULL;
    char outbuf[4096];
    keel_status st;
    int rc, c;
    static const struct option longs[] = {
        { "format", required_argument, NULL, 'f' },
        { "output", required_argument, NULL, 'o' },
        { "config", required_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *spec = cli_getopt_begin("o:h");
    while ((c = getopt_long(argc, argv, spec, longs, NULL)) != -1) {
        switch (c) {
        case 'f':
            format = optarg;
            break;
        case 'o':
            output = optarg;
            break;
        case 'c':
            config = optarg;
            break;
        case 'h':
            return export_usage(stdout, CLI_OK);
        default:
            return cli_getopt_error(argv, c, "a value");
        }
    }
    for (int i = optind; i < argc; i++) {
        const char *a = argv[i];
        if (ckpt == NULL) {
            ckpt = a;
        } else {
            return cli_error(CLI_USAGE, "export takes one CKPT, got '%s' and "
                             "'%s'", ckpt, a);
        }
    }
    if (ckpt == NULL || format == NULL)
        return cli_error(CLI_USAGE, "export needs CKPT and --format "
                         "keras-h5|safetensors|onnx; see 'keel export "
                         "--help'");
    if (keel_export_format_from_name(format, &f) != KEEL_OK)
        return cli_error(CLI_USAGE, "--format %s: %s", format,
                         keel_last_error());
    rc = open_model(ckpt, config, &inf);
    if (rc != CLI_OK)
        return rc;
    if (output == NULL) {
        char src[4096];
        size_t n;
        if ((rc = resolve_ckpt(ckpt, src, sizeof src)) != CLI_OK) {
            keel_inference_free(inf);
            return rc;
        }
        n = strlen(src);
        if (n > 3 && strcmp(src + n - 3, ".h5") == 0)
            n -= 3;
        if (f == KEEL_EXPORT_KERAS_H5) {
            snprintf(outbuf, sizeof outbuf, "%.*s.keras.h5", (int)n, src);
        } else {
            snprintf(outbuf, sizeof outbuf, "%.*s%s", (int)n, src,
                     keel_export_format_extension(f));
        }
        output = outbuf;
    }
    st = keel_export(inf, f, output);
    keel_inference_free(inf);
    if (st != KEEL_OK)
        return cli_fail(st, "export");
    printf("exported %s (%s) to %s\n", ckpt, format, output);
    return CLI_OK;
}

int
cmd_predict(int argc, char **argv)
{
    const char *ckpt = NULL, *input = NULL, *labels = NULL, *config = NULL;
    int json = 0, rc;
    keel_inference *inf = NULL;
    keel_dataset *ds = NULL, *lds = NULL;
    const keel_model_config *mc;
    float *x = NULL, *probs = NULL;
    int32_t *y = NULL;
    size_t n, esize;
    int64_t h, w, c, correct = 0, labelled = 0;
    keel_status st;
    int opt;
    static const struct option longs[] = {
        { "json", no_argument, NULL, 'j' },
        { "labels", required_argument, NULL, 'l' },
        { "config", required_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *spec = cli_getopt_begin("h");
    while ((opt = getopt_long(argc, argv, spec, longs, NULL)) != -1) {
        switch (opt) {
        case 'j':
            json = 1;
            break;
        case 'l':
            labels = optarg;
            break;
        case 'c':
            config = optarg;
            break;
        case 'h':
            return predict_usage(stdout, CLI_OK);
        default:
            return cli_getopt_error(argv, opt, "a FILE");
        }
    }
    for (int i = optind; i < argc; i++) {
        const char *a = argv[i];
        if (ckpt == NULL) {
            ckpt = a;
        } else if (input == NULL) {
            input = a;
        } else {
            return cli_error(CLI_USAGE, "predict takes CKPT and INPUT, got "
                             "a third argument '%s'", a);
        }
    }
    if (ckpt == NULL || input == NULL)
        return cli_error(CLI_USAGE, "predict needs CKPT and INPUT; see "
                         "'keel predict --help'");
    rc = open_model(ckpt, config, &inf);
    if (rc != CLI_OK)
        return rc;
    mc = keel_inference_model_config(inf);
    st = labels != NULL
        ? keel_dataset_open_idx(input, labels, (int)mc->classes, &ds)
        : keel_dataset_open_inputs(input, &ds);
    if (st != KEEL_OK) {
        keel_inference_free(inf);
        return cli_fail(st, "predict: input");
    }
    n = keel_dataset_count(ds);
    esize = keel_dataset_example_size(ds);
    keel_dataset_shape(ds, &h, &w, &c);
    if (esize != (size_t)(mc->height * mc->width * mc->channels)) {
        rc = cli_error(CLI_USAGE, "predict: %s has examples of %lldx%lldx"
                       "%lld values; the model takes %lldx%lldx%lld", input,
                       (long long)h, (long long)w, (long long)c,
                       (long long)mc->height, (long long)mc->width,
                       (long long)mc->channels);
        goto out;
    }
    x = malloc(n * esize * sizeof *x);
    y = malloc(n * sizeof *y);
    probs = malloc(n * (size_t)mc->classes * sizeof *probs);
    if (x == NULL || y == NULL || probs == NULL) {
        rc = cli_error(CLI_RUNTIME, "predict: out of memory for %zu "
                       "examples", n);
        goto out;
    }
    for (size_t i = 0; i < n && st == KEEL_OK; i++)
        st = keel_dataset_get(ds, i, x + i * esize, y + i);
    if (st == KEEL_OK)
        st = keel_inference_predict(inf, x, n, probs);
    if (st != KEEL_OK) {
        rc = cli_fail(st, "predict");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const float *p = probs + i * (size_t)mc->classes;
        int64_t best = 0;
        for (int64_t k = 1; k < mc->classes; k++)
            if (p[k] > p[best])
                best = k;
        if (y[i] >= 0) {
            labelled++;
            correct += best == y[i];
        }
        if (json) {
            printf("{\"index\": %zu, \"class\": %lld", i, (long long)best);
            if (y[i] >= 0)
                printf(", \"label\": %d", (int)y[i]);
            printf(", \"probabilities\": [");
            for (int64_t k = 0; k < mc->classes; k++)
                printf("%s%.9g", k ? ", " : "", (double)p[k]);
            printf("]}\n");
        } else {
            printf("%zu\t%lld\t%.6f%s", i, (long long)best, (double)p[best],
                   y[i] >= 0 ? "" : "\n");
            if (y[i] >= 0)
                printf("\tlabel %d\n", (int)y[i]);
        }
    }
    if (labelled > 0) {
        double acc = (double)correct / (double)labelled;
        if (json)
            printf("{\"examples\": %lld, \"accuracy\": %.6f}\n",
                   (long long)labelled, acc);
        else
            printf("accuracy %.4f (%lld of %lld examples)\n", acc,
                   (long long)correct, (long long)labelled);
    }
    rc = CLI_OK;
out:
    free(x);
    free(y);
    free(probs);
    keel_dataset_free(ds);
    keel_dataset_free(lds);
    keel_inference_free(inf);
    return rc;
}
