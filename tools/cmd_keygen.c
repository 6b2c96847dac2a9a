/* cmd_keygen.c - `keel keygen DIR [--name NAME]`: write a CURVE key pair
 * for the cluster's encrypted sockets (NAME.key public, NAME.key_secret
 * mode 0600). Never prints the secret key. */
#include <config.h>

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void
keygen_usage(FILE *out)
{
    fprintf(out,
            "usage: keel keygen DIR [--name NAME]\n"
            "\n"
            "Write a CURVE key pair for keel's cluster sockets into DIR\n"
            "(created if needed): NAME.key holds the public key (share it:\n"
            "copy it into the servers' allowed-keys directory), and\n"
            "NAME.key_secret the secret key (mode 0600; keep it on this\n"
            "host). Existing keys are never overwritten.\n"
            "\n"
            "options:\n"
            "  --name NAME   key name, [A-Za-z0-9_.-] (default: keel)\n"
            "  -h, --help    show this help\n");
}

int
cmd_keygen(int argc, char **argv)
{
    static const struct option longs[] = {
        { "name", required_argument, NULL, 'n' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *spec = cli_getopt_begin("h");
    const char *dir = NULL, *name = "keel";
    char pub[41];
    keel_status st;
    int c;
    while ((c = getopt_long(argc, argv, spec, longs, NULL)) != -1) {
        switch (c) {
        case 'n':
            name = optarg;
            break;
        case 'h':
            keygen_usage(stdout);
            return CLI_OK;
        default:
            return cli_getopt_error(argv, c, "a NAME");
        }
    }
    for (int i = optind; i < argc; i++) {
        if (dir != NULL)
            return cli_error(CLI_USAGE, "keygen: more than one directory "
                             "('%s'); see 'keel keygen --help'", argv[i]);
        dir = argv[i];
    }
    if (dir == NULL)
        return cli_error(CLI_USAGE, "keygen: missing DIR; usage: keel keygen "
                         "DIR [--name NAME]");
    st = keel_cluster_keygen(dir, name, pub);
    if (st != KEEL_OK)
        return cli_fail(st, "keygen");
    printf("public key: %s\n", pub);
    printf("wrote %s/%s.key (public) and %s/%s.key_secret (secret, 0600)\n",
           dir, name, dir, name);
    return CLI_OK;
}
