/* cmd_config.c - `keel config check FILE` (validate and print the resolved
 * settings) and `keel config keys` (the reference of every key). */
#include <config.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/config.h>
#include "cli.h"

static int
usage(FILE *out, int code)
{
    fprintf(out,
            "usage: keel config check CONFIG [-s section.key=value]... "
            "[--task T:I]\n"
            "       keel config keys\n"
            "\n"
            "check  validate CONFIG (with overrides and $OUTPUT_DIR) and print\n"
            "       every resolved setting with where it came from, then the\n"
            "       cluster (TF_CONFIG, Slurm or [cluster] + --task) and this\n"
            "       task's role\n"
            "keys   print the reference of every section and key (Markdown)\n");
    return code;
}

/* `keel config keys`: the reference of every key. */
static int
config_keys(int argc, char **argv)
{
    keel_status st;
    if (cli_wants_help(argc - 1, argv + 1))
        return usage(stdout, CLI_OK);
    if (argc > 2)
        return cli_error(CLI_USAGE, "config keys takes no arguments");
    st = keel_config_write_reference(stdout);
    return st == KEEL_OK ? CLI_OK : cli_fail(st, NULL);
}

/* What `keel config check`'s command line gives: CONFIG, the -s
 * overrides and --task. */
typedef struct check_args {
    const char *path, *task;
    char *over[CLI_MAX_OVERRIDES];
    int n_over, help;
} check_args;

/* Parse argv (argv[1] is "check") into a (initialised here). CLI_OK (a->help
 * set for --help) or the usage error, on stderr already. */
static int
check_parse(int argc, char **argv, check_args *a)
{
    static const struct option longs[] = {
        { "set", required_argument, NULL, 's' },
        { "task", required_argument, NULL, 't' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *optspec = cli_getopt_begin("s:h");
    int c;

    memset(a, 0, sizeof *a);
    /* argv + 1: "check" is the verb getopt starts after */
    while ((c = getopt_long(argc - 1, argv + 1, optspec, longs, NULL))
           != -1) {
        switch (c) {
        case 's':
            if (cli_add_override("config check", a->over, &a->n_over,
                                 optarg) != CLI_OK)
                return CLI_USAGE;
            break;
        case 't':
            a->task = optarg;
            break;
        case 'h':
            a->help = 1;
            return CLI_OK;
        default:
            return cli_getopt_error_as("config check", "config", argv + 1,
                                       c, optopt == 't' ? "TYPE:INDEX"
                                                        : "section.key=value");
        }
    }
    for (int i = optind + 1; i < argc; i++) {
        if (a->path != NULL)
            return cli_error(CLI_USAGE, "config check takes one CONFIG "
                             "file, got '%s' and '%s'", a->path, argv[i]);
        a->path = argv[i];
    }
    if (a->path == NULL)
        return cli_error(CLI_USAGE, "config check needs a CONFIG file; "
                         "see 'keel config --help'");
    return CLI_OK;
}

/* The resolved settings of cfg with their origins, then the cluster spec
 * (NULL: one process) and this task's role. */
static int
check_print(const char *path, const keel_config *cfg,
            const keel_cluster_spec *spec)
{
    char buf[8192], *text;
    keel_status st = keel_config_dump(cfg, 1, &text);

    if (st == KEEL_OK && spec != NULL)
        st = keel_cluster_spec_format(spec, buf, sizeof buf);
    if (st != KEEL_OK) {
        free(text);
        return cli_fail(st, NULL);
    }
    printf("# %s: valid\n%s", path, text);
    free(text);
    if (spec == NULL)
        printf("# cluster: none (one process)\n");
    else
        printf("# cluster (this task: %s %d%s):\n%s",
               keel_task_type_name(keel_cluster_spec_task_type(spec)),
               keel_cluster_spec_task_index(spec),
               keel_cluster_spec_is_chief(spec) ? ", chief" : "", buf);
    return CLI_OK;
}

/* `keel config check`. Everything is checked before anything is printed:
 * an error prints only the error and exits 2. */
static int
config_check(int argc, char **argv)
{
    check_args a;
    keel_config *cfg;
    keel_cluster_spec *spec = NULL;
    int rc = check_parse(argc, argv, &a);

    if (rc != CLI_OK)
        return rc;
    if (a.help)
        return usage(stdout, CLI_OK);
    rc = cli_load_config(a.path, a.n_over, a.over, &cfg);
    if (rc != CLI_OK)
        return rc;
    rc = cli_resolve_cluster(cfg, a.task, &spec);
    if (rc == CLI_OK)
        rc = check_print(a.path, cfg, spec);
    keel_cluster_spec_free(spec);
    keel_config_free(cfg);
    return rc;
}

int
cmd_config(int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : NULL;
    if (sub == NULL)
        return usage(stderr, CLI_USAGE);
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0)
        return usage(stdout, CLI_OK);
    if (strcmp(sub, "keys") == 0)
        return config_keys(argc, argv);
    if (strcmp(sub, "check") == 0)
        return config_check(argc, argv);
    return cli_error(CLI_USAGE, "unknown config command '%s'; use check or "
                     "keys (see 'keel config --help')", sub);
}
