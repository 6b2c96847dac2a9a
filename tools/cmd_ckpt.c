/* cmd_ckpt.c - `keel ckpt ls|show|verify|diff`: inspect checkpoint
 * directories and files through libkeel's public reader API. */
#include <config.h>

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

static const char ckpt_usage[] =
    "usage: keel ckpt <ls|show|verify|diff> [options] ...\n"
    "\n"
    "  keel ckpt ls DIR            checkpoints in DIR: step, size, time, "
    "valid\n"
    "  keel ckpt show FILE [VAR]   names, shapes, step, metadata; values "
    "of VAR\n"
    "  keel ckpt verify FILE|DIR   exit 0 only if every checksum matches\n"
    "  keel ckpt diff A B          per-variable max abs difference; exit 0 "
    "if\n"
    "                              bitwise equal, 1 if any differs, 2 on "
    "error\n"
    "\n"
    "`keel ckpt <sub> --help` describes one. Format: "
    "docs/checkpoint-format.md.\n";

static void
fmt_shape(char *buf, size_t size, const keel_ckpt_entry *e)
{
    keel_shape_format(buf, size, e->ndim, e->shape);
}

static void
entry_label(char *buf, size_t size, const keel_ckpt_entry *e)
{
    if (e->slot[0] == '\0')
        snprintf(buf, size, "%s", e->name);
    else
        snprintf(buf, size, "%s [slot %s]", e->name, e->slot);
}

static int
is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* ---- ls ----------------------------------------------------------------- */

static int
ckpt_ls(int argc, char **argv)
{
    keel_ckpt_file *f;
    size_t n;
    keel_status st;
    char latest[4096] = "";
    int64_t lstep = -1;

    if (cli_wants_help(argc, argv)) {
        printf("usage: keel ckpt ls DIR\n\n"
               "List the <basename>-<step>.h5 checkpoints in DIR by step "
               "with size,\nmodification time, whether every checksum "
               "verifies, and which one\nkeel would restore (latest).\n");
        return CLI_OK;
    }
    if (argc != 2)
        return cli_error(CLI_USAGE, "ckpt ls takes one directory; see "
                         "'keel ckpt ls --help'");
    st = keel_ckpt_scan(argv[1], NULL, &f, &n);
    if (st != KEEL_OK)
        return cli_fail(st, "ckpt ls");
    keel_log_set_handler(NULL, NULL, KEEL_LOG_ERROR);
    if (keel_ckpt_latest(argv[1], NULL, latest, sizeof latest, &lstep) !=
        KEEL_OK)
        lstep = -1;
    printf("%-12s %12s  %-19s  %-7s  %s\n", "step", "bytes", "modified",
           "valid", "file");
    for (size_t i = 0; i < n; i++) {
        char path[4096], when[32];
        time_t t = (time_t)f[i].mtime;
        struct tm tm;
        int ok;
        snprintf(path, sizeof path, "%s/%s", argv[1], f[i].name);
        ok = keel_ckpt_verify(path) == KEEL_OK;
        localtime_r(&t, &tm);
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        printf("%-12lld %12lld  %-19s  %-7s  %s%s%s\n",
               (long long)f[i].step, (long long)f[i].size, when,
               ok ? "valid" : "INVALID", f[i].name,
               f[i].in_state_file ? "" : " (not in state file)",
               ok && f[i].step == lstep &&
               strstr(latest, f[i].name) != NULL ? "  <- latest" : "");
        if (!ok)
            printf("    %s\n", keel_last_error());
    }
    if (n == 0)
        printf("(no checkpoints in %s)\n", argv[1]);
    keel_ckpt_scan_free(f);
    if (keel_ckpt_state_check(argv[1]) != KEEL_OK)
        return cli_error(CLI_RUNTIME, "ckpt ls: %s", keel_last_error());
    return CLI_OK;
}

/* ---- show --------------------------------------------------------------- */

/* What ckpt show's command line asks for: FILE, and VAR (its slot) to
 * print at most limit values of (-1: all). */
typedef struct show_args {
    const char *file, *var, *slot;
    long limit;
} show_args;

/* Parse argv into a (initialised here). CLI_OK or the usage error, on
 * stderr already. */
static int
show_parse(int argc, char **argv, show_args *a)
{
    static const struct option longs[] = {
        { "slot", required_argument, NULL, 's' },
        { "limit", required_argument, NULL, 'l' },
        { "all", no_argument, NULL, 'a' },
        { NULL, 0, NULL, 0 }
    };
    const char *spec = cli_getopt_begin("");
    int c;

    memset(a, 0, sizeof *a);
    a->limit = 1000;
    while ((c = getopt_long(argc, argv, spec, longs, NULL)) != -1) {
        char *end;
        switch (c) {
        case 's':
            a->slot = optarg;
            break;
        case 'l':
            a->limit = strtol(optarg, &end, 10);
            if (end == optarg || *end != '\0' || a->limit < 0)
                return cli_error(CLI_USAGE, "--limit needs a count >= 0");
            break;
        case 'a':
            a->limit = -1;
            break;
        default:
            return cli_getopt_error_as("ckpt show", "ckpt show", argv, c,
                                       optopt == 'l' ? "a count" : "a SLOT");
        }
    }
    for (int i = optind; i < argc; i++) {
        if (a->file == NULL) {
            a->file = argv[i];
        } else if (a->var == NULL) {
            a->var = argv[i];
        } else {
            return cli_error(CLI_USAGE, "ckpt show takes FILE [VAR]; see "
                             "'keel ckpt show --help'");
        }
    }
    if (a->file == NULL)
        return cli_error(CLI_USAGE, "ckpt show needs a checkpoint file; see "
                         "'keel ckpt show --help'");
    return CLI_OK;
}

/* The values of a->var (or of its slot), at most a->limit of them. */
static int
show_values(const show_args *a)
{
    keel_tensor t;
    char shape[96];
    keel_status st = keel_ckpt_read_tensor(a->file, a->var, a->slot, &t);

    if (st != KEEL_OK)
        return cli_fail(st, "ckpt show");
    printf("%s%s%s %s\n", a->var, a->slot ? " slot " : "",
           a->slot ? a->slot : "",
           keel_shape_format(shape, sizeof shape, t.ndim, t.shape));
    for (size_t j = 0; j < t.count; j++) {
        if (a->limit >= 0 && j >= (size_t)a->limit) {
            printf("... (%zu more; --all prints them)\n", t.count - j);
            break;
        }
        printf("%.9g\n", (double)t.data[j]);
    }
    keel_tensor_release(&t);
    return CLI_OK;
}

/* The checkpoint's header: step, wall time, versions, topology, blobs and
 * the config, indented. */
static void
show_info(const char *file, const keel_ckpt_info *info)
{
    time_t t = (time_t)info->wall_time;
    struct tm tm;
    char when[40];

    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    printf("file:           %s\n", file);
    printf("global_step:    %lld\n", (long long)info->global_step);
    printf("wall_time:      %.3f (%s)\n", info->wall_time, when);
    printf("format_version: %d\n", info->format_version);
    printf("keel_version:   %s\n", info->keel_version);
    printf("topology:       %s\n", info->topology ? info->topology
                                                  : "(none)");
    if (info->shard_count > 0)
        printf("shards:         %d (run id %016llx)\n", info->shard_count,
               (unsigned long long)info->run_id);
    for (size_t i = 0; i < info->n_blobs; i++)
        printf("blob:           %s (%zu bytes)\n", info->blobs[i].name,
               info->blobs[i].size);
    printf("config:%s\n", info->config_text ? "" : "         (none)");
    if (info->config_text != NULL) {
        const char *p = info->config_text;
        while (*p != '\0') {
            const char *nl = strchr(p, '\n');
            size_t len = nl ? (size_t)(nl - p) : strlen(p);
            printf("    %.*s\n", (int)len, p);
            p += len + (nl ? 1 : 0);
        }
    }
}

/* Every variable and slot of file with its shape. */
static int
show_datasets(const char *file)
{
    keel_ckpt_entry *e;
    size_t n;
    keel_status st = keel_ckpt_list(file, &e, &n);

    if (st != KEEL_OK)
        return cli_fail(st, "ckpt show");
    printf("%zu datasets:\n", n);
    for (size_t i = 0; i < n; i++) {
        char label[600], shape[96];
        entry_label(label, sizeof label, &e[i]);
        fmt_shape(shape, sizeof shape, &e[i]);
        printf("  %-50s %s\n", label, shape);
    }
    keel_ckpt_list_free(e);
    return CLI_OK;
}

static int
ckpt_show(int argc, char **argv)
{
    show_args a;
    keel_ckpt_info *info;
    keel_status st;
    int rc;

    if (cli_wants_help(argc, argv)) {
        printf("usage: keel ckpt show [--slot S] [--limit N|--all] FILE "
               "[VAR]\n\n"
               "Print a checkpoint's step, wall time, versions, topology, "
               "config and\nblobs, then every variable and slot with its "
               "shape. With VAR, print\nthe values of that variable (or of "
               "its slot S), verified against the\nchecksum; at most N "
               "values (default 1000) unless --all.\n");
        return CLI_OK;
    }
    if ((rc = show_parse(argc, argv, &a)) != CLI_OK)
        return rc;
    if (a.var != NULL)
        return show_values(&a);
    st = keel_ckpt_read_info(a.file, &info);
    if (st != KEEL_OK)
        return cli_fail(st, "ckpt show");
    show_info(a.file, info);
    keel_ckpt_info_free(info);
    return show_datasets(a.file);
}

/* ---- verify ------------------------------------------------------------- */

static int
ckpt_verify(int argc, char **argv)
{
    int bad = 0;
    if (cli_wants_help(argc, argv)) {
        printf("usage: keel ckpt verify FILE|DIR\n\n"
               "Check every dataset's xxh64 checksum, types, shapes and the "
               "format\nversion of one checkpoint, or of every checkpoint "
               "in DIR. Exit 0 only\nif all verify, 1 if any fails.\n");
        return CLI_OK;
    }
    if (argc != 2)
        return cli_error(CLI_USAGE, "ckpt verify takes one file or "
                         "directory; see 'keel ckpt verify --help'");
    if (is_dir(argv[1])) {
        keel_ckpt_file *f;
        size_t n;
        keel_status st = keel_ckpt_scan(argv[1], NULL, &f, &n);
        if (st != KEEL_OK)
            return cli_fail(st, "ckpt verify");
        if (n == 0) {
            keel_ckpt_scan_free(f);
            return cli_error(CLI_RUNTIME, "no checkpoints in %s", argv[1]);
        }
        for (size_t i = 0; i < n; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[1], f[i].name);
            if (keel_ckpt_verify(path) == KEEL_OK) {
                printf("ok       %s\n", path);
            } else {
                printf("CORRUPT  %s\n", path);
                fprintf(stderr, "keel: %s\n", keel_last_error());
                bad++;
            }
        }
        keel_ckpt_scan_free(f);
        if (keel_ckpt_state_check(argv[1]) != KEEL_OK) {
            printf("CORRUPT  %s/checkpoint\n", argv[1]);
            fprintf(stderr, "keel: %s\n", keel_last_error());
            bad++;
        }
        return bad ? CLI_RUNTIME : CLI_OK;
    }
    if (keel_ckpt_verify(argv[1]) != KEEL_OK) {
        printf("CORRUPT  %s\n", argv[1]);
        fprintf(stderr, "keel: %s\n", keel_last_error());
        return CLI_RUNTIME;
    }
    printf("ok       %s\n", argv[1]);
    return CLI_OK;
}

/* ---- diff --------------------------------------------------------------- */

static const keel_ckpt_entry *
find_entry(const keel_ckpt_entry *e, size_t n, const keel_ckpt_entry *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(e[i].name, key->name) == 0 &&
            strcmp(e[i].slot, key->slot) == 0)
            return &e[i];
    return NULL;
}

/* The largest |a[j] - b[j]|, INFINITY where either is NaN. */
static double
max_abs_diff(const keel_tensor *ta, const keel_tensor *tb)
{
    double maxd = 0;
    for (size_t j = 0; j < ta->count; j++) {
        double d = fabs((double)ta->data[j] - (double)tb->data[j]);
        if (isnan(d))
            d = INFINITY;
        if (d > maxd)
            maxd = d;
    }
    return maxd;
}

/* Entry a of file pa against its namesake b (NULL: none) of file pb: prints
 * a line and sets *differs when they differ. CLI_OK, or a usage error when
 * a tensor cannot be read. */
static int
diff_entry(const char *pa, const char *pb, const keel_ckpt_entry *a,
           const keel_ckpt_entry *b, int *differs)
{
    char label[600], sa[96], sb[96];
    keel_tensor ta, tb;
    entry_label(label, sizeof label, a);
    if (b == NULL) {
        printf("only in A   %s\n", label);
        *differs = 1;
        return CLI_OK;
    }
    if (!keel_shape_equal(a->ndim, a->shape, b->ndim, b->shape)) {
        fmt_shape(sa, sizeof sa, a);
        fmt_shape(sb, sizeof sb, b);
        printf("shape       %s: %s vs %s\n", label, sa, sb);
        *differs = 1;
        return CLI_OK;
    }
    if (keel_ckpt_read_tensor(pa, a->name, a->slot, &ta) != KEEL_OK)
        return cli_error(CLI_USAGE, "ckpt diff: %s", keel_last_error());
    if (keel_ckpt_read_tensor(pb, b->name, b->slot, &tb) != KEEL_OK) {
        keel_tensor_release(&ta);
        return cli_error(CLI_USAGE, "ckpt diff: %s", keel_last_error());
    }
    if (memcmp(ta.data, tb.data, ta.count * sizeof(float)) != 0) {
        printf("differs     %-50s max_abs_diff %.9g\n", label,
               max_abs_diff(&ta, &tb));
        *differs = 1;
    }
    keel_tensor_release(&ta);
    keel_tensor_release(&tb);
    return CLI_OK;
}

static int
ckpt_diff(int argc, char **argv)
{
    keel_ckpt_entry *ea = NULL, *eb = NULL;
    size_t na = 0, nb = 0;
    int differs = 0, rc = CLI_OK;
    keel_status st;

    if (cli_wants_help(argc, argv)) {
        printf("usage: keel ckpt diff A B\n\n"
               "Compare two checkpoint files variable by variable and slot "
               "by slot:\nprint the max absolute difference of each "
               "differing one and the\nnames found in only one file. Exit 0 "
               "when every variable and slot is\nbitwise equal, 1 when any "
               "differs, 2 on error (unreadable or corrupt).\n");
        return CLI_OK;
    }
    if (argc != 3)
        return cli_error(CLI_USAGE, "ckpt diff takes two files; see "
                         "'keel ckpt diff --help'");
    st = keel_ckpt_list(argv[1], &ea, &na);
    if (st == KEEL_OK)
        st = keel_ckpt_list(argv[2], &eb, &nb);
    if (st != KEEL_OK) {
        keel_ckpt_list_free(ea);
        cli_fail(st, "ckpt diff");
        return CLI_USAGE;
    }
    for (size_t i = 0; i < na && rc == CLI_OK; i++)
        rc = diff_entry(argv[1], argv[2], &ea[i], find_entry(eb, nb, &ea[i]),
                        &differs);
    for (size_t i = 0; i < nb && rc == CLI_OK; i++) {
        char label[600];
        if (find_entry(ea, na, &eb[i]) != NULL)
            continue;
        entry_label(label, sizeof label, &eb[i]);
        printf("only in B   %s\n", label);
        differs = 1;
    }
    keel_ckpt_list_free(ea);
    keel_ckpt_list_free(eb);
    if (rc != CLI_OK)
        return rc;
    if (!differs)
        printf("identical: %zu variables and slots bitwise equal\n", na);
    return differs ? CLI_RUNTIME : CLI_OK;
}

int
cmd_ckpt(int argc, char **argv)
{
    if (argc < 2) {
        fputs(ckpt_usage, stderr);
        return CLI_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        fputs(ckpt_usage, stdout);
        return CLI_OK;
    }
    if (strcmp(argv[1], "ls") == 0)
        return ckpt_ls(argc - 1, argv + 1);
    if (strcmp(argv[1], "show") == 0)
        return ckpt_show(argc - 1, argv + 1);
    if (strcmp(argv[1], "verify") == 0)
        return ckpt_verify(argc - 1, argv + 1);
    if (strcmp(argv[1], "diff") == 0)
        return ckpt_diff(argc - 1, argv + 1);
    return cli_error(CLI_USAGE, "unknown ckpt command '%s'; run 'keel ckpt "
                     "--help'", argv[1]);
}
