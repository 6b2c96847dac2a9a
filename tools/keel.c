/* keel.c - the keel command: dispatches to one verb per tools/cmd_<verb>.c.
 * Exit codes: 0 success, 1 runtime failure, 2 usage or configuration. */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include "cli.h"

/* The verbs, in the order `keel --help` lists them. */
static const cli_verb verbs[] = {
    { "train", "train the job a config file describes", cmd_train },
    { "launch", "run a local cluster of keel train tasks", cmd_launch },
    { "eval", "evaluate a checkpoint on the test set", cmd_eval },
    { "predict", "classify inputs with a checkpoint's model", cmd_predict },
    { "export", "write a checkpoint's model as Keras HDF5, safetensors "
      "or ONNX", cmd_export },
    { "ckpt", "list, show, verify and diff checkpoints", cmd_ckpt },
    { "config", "check a config file; list every key", cmd_config },
    { "keygen", "write a CURVE key pair for cluster sockets", cmd_keygen },
    { "version", "print keel's version", cmd_version },
};
static const size_t n_verbs = sizeof verbs / sizeof verbs[0];

static void
usage(FILE *out)
{
    fprintf(out,
            "usage: keel [--help] [--version] <verb> [options] [args]\n"
            "\n"
            "keel supervises training: sessions, hooks, crash-safe HDF5\n"
            "checkpoints and parameter-server clusters.\n"
            "\n"
            "verbs:\n");
    for (size_t i = 0; i < n_verbs; i++)
        fprintf(out, "  %-10s %s\n", verbs[i].name, verbs[i].summary);
    fprintf(out,
            "\n"
            "`keel <verb> --help` describes a verb; `man keel` has the rest.\n"
            "Exit status: 0 success, 1 runtime failure, 2 usage or "
            "configuration error.\n");
}

int
main(int argc, char **argv)
{
    const char *verb;
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    verb = argv[1];
    if (strcmp(verb, "-h") == 0 || strcmp(verb, "--help") == 0 ||
        strcmp(verb, "help") == 0) {
        usage(stdout);
        return CLI_OK;
    }
    if (strcmp(verb, "-V") == 0 || strcmp(verb, "--version") == 0)
        return cmd_version(1, argv + 1);
    cli_install_logger(0);
    for (size_t i = 0; i < n_verbs; i++)
        if (strcmp(verb, verbs[i].name) == 0)
            return verbs[i].run(argc - 1, argv + 1);
    if (verb[0] == '-')
        return cli_error(CLI_USAGE, "unknown option '%s' before the verb; "
                         "run 'keel --help' for usage", verb);
    return cli_error(CLI_USAGE, "unknown verb '%s'; run 'keel --help' to "
                     "list the verbs", verb);
}
