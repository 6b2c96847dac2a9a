/* cmd_export.c - `keel export CKPT --format F [-o FILE]`: a checkpoint in
 * a format other tools load: safetensors for any checkpoint; keras-h5 and
 * onnx from its layer description (keel train's, or one the program that
 * wrote it stored) or, for checkpoints of keel train written before keel
 * stored one, with --config. */
#include <config.h>

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static int
export_usage(FILE *out, int code)
{
    fprintf(out,
            "usage: keel export CKPT --format keras-h5|safetensors|onnx\n"
            "                   [-o FILE] [--config CONFIG]\n"
            "\n"
            "Write checkpoint CKPT (a .h5 file, or a checkpoint directory: its\n"
            "newest valid checkpoint) in a format other tools load\n"
            "(docs/export.md):\n"
            "  safetensors  every variable: JSON header, little-endian float32\n"
            "               tensors (any checkpoint)\n"
            "  keras-h5     Keras's HDF5 weight layout (model.load_weights)\n"
            "  onnx         an ONNX graph with the weights as initializers\n"
            "keras-h5 and onnx need the checkpoint's layer description: keel\n"
            "train stores one; a program stores its own with keel_model_desc_*.\n"
            "\n"
            "  -o, --output FILE  where to write (default: CKPT with the\n"
            "                     format's extension, e.g. model.ckpt-200.onnx)\n"
            "  --config CONFIG    the job's config, for checkpoints that hold\n"
            "                     no architecture (written by older keel)\n");
    return code;
}

/* What `keel export`'s command line gives. */
typedef struct export_args {
    const char *ckpt, *format, *output, *config;
    int help;
} export_args;

/* Parse argv into a (initialised here): --format, -o, --config and CKPT.
 * CLI_OK (a->help set for --help) or the usage error, on stderr already. */
static int
export_parse(int argc, char **argv, export_args *a)
{
    static const struct option longs[] = {
        { "format", required_argument, NULL, 'f' },
        { "output", required_argument, NULL, 'o' },
        { "config", required_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *spec = cli_getopt_begin("o:h");
    int c;

    memset(a, 0, sizeof *a);
    while ((c = getopt_long(argc, argv, spec, longs, NULL)) != -1) {
        switch (c) {
        case 'f':
            a->format = optarg;
            break;
        case 'o':
            a->output = optarg;
            break;
        case 'c':
            a->config = optarg;
            break;
        case 'h':
            a->help = 1;
            return CLI_OK;
        default:
            return cli_getopt_error(argv, c, "a value");
        }
    }
    for (int i = optind; i < argc; i++) {
        if (a->ckpt != NULL)
            return cli_error(CLI_USAGE, "export takes one CKPT, got '%s' and "
                             "'%s'", a->ckpt, argv[i]);
        a->ckpt = argv[i];
    }
    if (a->ckpt == NULL || a->format == NULL)
        return cli_error(CLI_USAGE, "export needs CKPT and --format "
                         "keras-h5|safetensors|onnx; see 'keel export "
                         "--help'");
    return CLI_OK;
}

/* Without -o: the checkpoint's path with the format's extension in place
 * of ".h5" (keras-h5: ".keras.h5"), into buf. */
static int
default_output(const char *ckpt, keel_export_format f, char *buf,
               size_t size)
{
    char src[4096];
    size_t n;
    int rc = cli_resolve_ckpt(ckpt, src, sizeof src);

    if (rc != CLI_OK)
        return rc;
    n = strlen(src);
    if (n > 3 && strcmp(src + n - 3, ".h5") == 0)
        n -= 3;
    snprintf(buf, size, "%.*s%s", (int)n, src, f == KEEL_EXPORT_KERAS_H5
             ? ".keras.h5" : keel_export_format_extension(f));
    return CLI_OK;
}

int
cmd_export(int argc, char **argv)
{
    export_args a;
    keel_export_format f;
    keel_config *cfg = NULL;
    char ckpt[4096], outbuf[4096];
    keel_status st;
    int rc = export_parse(argc, argv, &a);

    if (rc != CLI_OK)
        return rc;
    if (a.help)
        return export_usage(stdout, CLI_OK);
    if (keel_export_format_from_name(a.format, &f) != KEEL_OK)
        return cli_error(CLI_USAGE, "--format %s: %s", a.format,
                         keel_last_error());
    rc = cli_resolve_ckpt(a.ckpt, ckpt, sizeof ckpt);
    if (rc == CLI_OK && a.config != NULL)
        rc = cli_load_config(a.config, 0, NULL, &cfg);
    if (rc == CLI_OK && a.output == NULL &&
        (rc = default_output(a.ckpt, f, outbuf, sizeof outbuf)) == CLI_OK)
        a.output = outbuf;
    if (rc != CLI_OK) {
        keel_config_free(cfg);
        return rc;
    }
    st = keel_export_checkpoint(ckpt, cfg, f, a.output);
    keel_config_free(cfg);
    if (st != KEEL_OK)
        return cli_fail(st, "export");
    printf("exported %s (%s) to %s\n", a.ckpt, a.format, a.output);
    return CLI_OK;
}
