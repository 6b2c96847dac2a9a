/* cli.c - error reporting and logging for the keel CLI. */
#include <config.h>

#include <stdarg.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"

int
cli_error(int code, const char *fmt, ...)
{
    va_list ap;
    fputs("keel: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

int
cli_exit_code(keel_status st)
{
    switch (st) {
    case KEEL_OK:
        return CLI_OK;
    case KEEL_EINVAL:
        return CLI_USAGE;
    default:
        return CLI_RUNTIME;
    }
}

int
cli_fail(keel_status st, const char *context)
{
    const char *msg = keel_last_error();
    if (msg[0] == '\0')
        msg = keel_status_name(st);
    if (context != NULL && context[0] != '\0')
        return cli_error(cli_exit_code(st), "%s: %s", context, msg);
    return cli_error(cli_exit_code(st), "%s", msg);
}

int
cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            return 0;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return 1;
    }
    return 0;
}

int
cli_add_override(const char *verb, char **over, int *n_over, char *value)
{
    if (*n_over == CLI_MAX_OVERRIDES)
        return cli_error(CLI_USAGE, "%s: too many -s overrides (limit %d)",
                         verb, CLI_MAX_OVERRIDES);
    over[(*n_over)++] = value;
    return CLI_OK;
}

int cli_bar_drawn;

void
cli_bar_clear(void)
{
    if (!cli_bar_drawn)
        return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    cli_bar_drawn = 0;
}

void
cli_bar_make(cli_bar *b, double frac, double elapsed_secs)
{
    enum { WIDTH = 30 };
    char cells[WIDTH + 1];
    int filled;
    double eta;
    if (frac > 1)
        frac = 1;
    filled = (int)(frac * WIDTH);
    for (int i = 0; i < WIDTH; i++)
        cells[i] = i < filled ? '#' : '.';
    cells[WIDTH] = '\0';
    snprintf(b->head, sizeof b->head, "[%s] %3.0f%%", cells, frac * 100);
    eta = frac > 0 ? elapsed_secs * (1 - frac) / frac : 0;
    snprintf(b->eta, sizeof b->eta, "ETA %dh%02dm%02ds", (int)(eta / 3600),
             (int)fmod(eta / 60, 60), (int)fmod(eta, 60));
}

static void
log_to_stderr(void *ctx, keel_log_level level, const char *msg)
{
    (void)ctx;
    cli_bar_clear();            /* the line starts where the bar was */
    if (level >= KEEL_LOG_WARN)
        fprintf(stderr, "keel: %s: %s\n", keel_log_level_name(level), msg);
    else
        fprintf(stderr, "%s\n", msg);
}

void
cli_install_logger(int verbose)
{
    keel_log_set_handler(log_to_stderr, NULL,
                         verbose ? KEEL_LOG_DEBUG : KEEL_LOG_INFO);
}

const char *
cli_getopt_begin(const char *shorts)
{
    static char spec[64];
    optind = 0;             /* glibc: a full re-initialisation */
    opterr = 0;
    snprintf(spec, sizeof spec, ":%s", shorts);
    return spec;
}

int
cli_getopt_error(char **argv, int c, const char *what)
{
    return cli_getopt_error_as(argv[0], argv[0], argv, c, what);
}

int
cli_getopt_error_as(const char *name, const char *help, char **argv, int c,
                    const char *what)
{
    const char *typed = argv[optind - 1];
    char shortopt[3] = { '-', (char)optopt, '\0' };
    if (c == ':')
        return cli_error(CLI_USAGE, "%s: %s needs %s", name, typed, what);
    /* an unknown short option inside a group (-vx) is reported alone */
    if (optopt != 0 && optopt < 256 && typed[0] == '-' && typed[1] != '-')
        typed = shortopt;
    return cli_error(CLI_USAGE, "%s: unknown option '%s'; see 'keel %s "
                     "--help'", name, typed, help);
}
