/* cmd_version.c - `keel version`: the version of keel this command is. */
#include <config.h>

#include <stdio.h>

#include "cli.h"

int
cmd_version(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: keel version\n\nPrint keel's version and exit.\n");
        return CLI_OK;
    }
    if (argc > 1)
        return cli_error(CLI_USAGE, "version takes no arguments; "
                         "see 'keel version --help'");
    printf("keel %s\n", keel_version());
    return CLI_OK;
}
