/* check_cli.c - the keel binary's contract: --help, --version, unknown
 * verbs and options exit 2 with a "keel: " message on stderr. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <keel/keel.h>
#include "testutil.h"

static char out[65536], err[65536];

/* Before a verb: `keel [ARG]` exits with status and answers on one stream
 * (stdout for 0, else stderr) with each text, and nothing on the other. */
START_TEST(test_top_level_answers_with_exit_status_and_stream)
{
    static const struct {
        const char *arg;            /* NULL: no argument at all */
        int status;
        const char *says[2];        /* the second may be NULL */
    } cases[] = {
        { "--help", 0, { "usage: keel", "version" } },
        { "nosuchverb", 2, { "keel: unknown verb 'nosuchverb'",
                             "keel --help" } },
        { NULL, 2, { "usage: keel", NULL } },
        { "--frobnicate", 2, { "keel: unknown option '--frobnicate'",
                               NULL } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *arg = cases[i].arg ? cases[i].arg : "(none)";
        const char *answer = cases[i].status == 0 ? out : err;
        const char *other = cases[i].status == 0 ? err : out;
        int rc = tu_keel(10000, out, sizeof out, err, sizeof err,
                         cases[i].arg, NULL);
        ck_assert_msg(rc == cases[i].status, "keel %s: exit %d, want %d",
                      arg, rc, cases[i].status);
        for (int k = 0; k < 2 && cases[i].says[k] != NULL; k++)
            ck_assert_msg(strstr(answer, cases[i].says[k]) != NULL,
                          "keel %s: no '%s' in '%s'", arg, cases[i].says[k],
                          answer);
        ck_assert_msg(other[0] == '\0', "keel %s: unexpected '%s'", arg,
                      other);
    }
}
END_TEST

START_TEST(test_version_prints_library_version)
{
    char want[64];
    snprintf(want, sizeof want, "keel %s\n", keel_version());
    ck_assert_int_eq(TU_KEEL(10000, "--version"), 0);
    ck_assert_str_eq(out, want);
    ck_assert_int_eq(TU_KEEL(10000, "version"), 0);
    ck_assert_str_eq(out, want);
}
END_TEST

/* Options parse as getopt_long does: --opt=value and --opt value, short
 * flags grouped, "--" ends options, errors name the option typed. */
START_TEST(test_options_parse_the_getopt_long_way)
{
    char cfg[4200];
    TU_SNPRINTF(cfg, sizeof cfg, "%s", tu_src_path("examples/fashion_mnist.ini"));
    /* --set=VALUE reaches the config: the unknown key is reported */
    ck_assert_int_eq(TU_KEEL(10000, "train", "--set=train.nosuch=1", cfg), 2);
    ck_assert_ptr_nonnull(strstr(err, "unknown key 'nosuch' in [train]"));
    /* -vs VALUE: -v then -s with the next word */
    ck_assert_int_eq(TU_KEEL(10000, "train", "-vs", "train.nosuch=2", cfg), 2);
    ck_assert_ptr_nonnull(strstr(err, "unknown key 'nosuch' in [train]"));
    /* an unknown flag inside a group is named alone */
    ck_assert_int_eq(TU_KEEL(10000, "train", "-vx", cfg), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: train: unknown option '-x'"));
    /* a missing argument names the option as typed */
    ck_assert_int_eq(TU_KEEL(10000, "eval", cfg, "--checkpoint"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: eval: --checkpoint needs a FILE"));
    /* after "--", "-s" is the CONFIG operand, not an option */
    ck_assert_int_eq(TU_KEEL(10000, "train", "--", "-s"), 2);
    ck_assert_ptr_nonnull(strstr(err, "config file -s does not exist"));
}
END_TEST

/* More -s overrides than keel takes (256) is a usage error that names the
 * verb and the limit, the same for every verb that takes them. */
START_TEST(test_too_many_overrides_exit_2_naming_the_limit)
{
    static const char *verbs[][2] = { { "train", NULL },
                                      { "config", "check" },
                                      { "launch", NULL } };
    char cfg[4200], want[64];
    char *argv[4 + 2 * 257 + 2];
    TU_SNPRINTF(cfg, sizeof cfg, "%s",
                tu_src_path("examples/fashion_mnist.ini"));
    for (size_t v = 0; v < sizeof verbs / sizeof *verbs; v++) {
        int k = 0;
        argv[k++] = (char *)tu_build_path("keel");
        argv[k++] = (char *)verbs[v][0];
        if (verbs[v][1] != NULL)
            argv[k++] = (char *)verbs[v][1];
        for (int i = 0; i < 257; i++) {
            argv[k++] = "-s";
            argv[k++] = "train.seed=1";
        }
        argv[k++] = cfg;
        argv[k] = NULL;
        ck_assert_int_eq(tu_run(argv, NULL, 10000, out, sizeof out, err,
                                sizeof err), 2);
        TU_SNPRINTF(want, sizeof want, "%s%s%s: too many -s overrides "
                    "(limit 256)", verbs[v][0], verbs[v][1] ? " " : "",
                    verbs[v][1] ? verbs[v][1] : "");
        ck_assert_msg(strstr(err, want) != NULL, "%s: %s", want, err);
    }
}
END_TEST

START_TEST(test_every_verb_has_help)
{
    /* Each verb named in `keel --help` answers `keel <verb> --help` with 0
     * and a usage line. */
    char *line, *save = NULL;
    char listing[65536];
    int in_verbs = 0, checked = 0;
    ck_assert_int_eq(tu_keel(10000, listing, sizeof listing, NULL, 0,
                             "--help", NULL), 0);
    for (line = strtok_r(listing, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char verb[64];
        if (strcmp(line, "verbs:") == 0) {
            in_verbs = 1;
            continue;
        }
        if (!in_verbs || strncmp(line, "  ", 2) != 0)
            continue;
        ck_assert_int_eq(sscanf(line, " %63s", verb), 1);
        ck_assert_msg(tu_keel(10000, out, sizeof out, err, sizeof err, verb,
                              "--help", NULL) == 0, "keel %s --help", verb);
        ck_assert_msg(strstr(out, "usage: keel") != NULL,
                      "keel %s --help prints no usage", verb);
        checked++;
    }
    ck_assert_int_ge(checked, 1);
}
END_TEST

/* `keel config check` prints an error only with exit 2, and nothing on
 * stdout then; a valid file prints no error and exits 0. */
START_TEST(test_config_check_exits_2_on_every_error)
{
    static const struct {
        const char *ini, *arg1, *arg2, *tf_config, *says;
    } bad[] = {
        { "[train]\nmax_stpes = 5\n", NULL, NULL, NULL, "job.ini:2:" },
        { "[train]\nbatch_size = 0\n", NULL, NULL, NULL, "job.ini:2:" },
        { "[train]\nmax_steps\n", NULL, NULL, NULL, "syntax error" },
        { "[train]\n[trian]\n", NULL, NULL, NULL, "job.ini:2:" },
        { "[train]\nmax_steps = 5\n  seed = 1\n", NULL, NULL, NULL,
          "not a list" },
        { "[train]\nseed = 1\nseed = 2\n", NULL, NULL, NULL, "set twice" },
        { "[train]\nmax_steps = 5\n[cluster]\nps = 127.0.0.1:2999\nworkers = 127.0.0.1:3000\n",
          NULL, NULL, NULL, "--task" },
        { "[train]\nmax_steps = 5\n[cluster]\nps = 127.0.0.1:2999\nworkers = nohost\n", "--task",
          "worker:0", NULL, "nohost" },
        { "[train]\nmax_steps = 5\n", "-s", "train.nope=1", NULL, "nope" },
        { "[train]\nmax_steps = 5\n", "--task", "worker", NULL, "" },
        { "[train]\nmax_steps = 5\n", NULL, NULL, "{\"cluster\": ", "" },
        { "[train]\nmax_steps = 5\n", NULL, NULL,
          "{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
          "\"worker\", \"index\": 3}}", "" },
    };
    char ini[4096], absent[4096];
    tu_setup();
    /* tu_path's buffer is reused by tu_keel: keep copies. */
    snprintf(ini, sizeof ini, "%s", tu_path("job.ini"));
    snprintf(absent, sizeof absent, "%s", tu_path("absent.ini"));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc;
        tu_write_file(ini, bad[i].ini, strlen(bad[i].ini));
        if (bad[i].tf_config != NULL)
            setenv("TF_CONFIG", bad[i].tf_config, 1);
        else
            unsetenv("TF_CONFIG");
        rc = TU_KEEL(60000, "config", "check", ini, bad[i].arg1, bad[i].arg2);
        if (rc != 2 || strncmp(err, "keel: ", 6) != 0 ||
            strstr(err, bad[i].says) == NULL || out[0] != '\0')
            ck_abort_msg("case %zu: exit %d, stderr '%s', stdout '%.80s'",
                         i, rc, err, out);
    }
    unsetenv("TF_CONFIG");
    ck_assert_int_eq(TU_KEEL(60000, "config", "check", absent), 2);
    ck_assert_ptr_nonnull(strstr(err, "absent.ini"));
    ck_assert_str_eq(out, "");
    /* 16 workers, one per indented line (trailing commas and comments),
     * resolve into a 16-worker cluster. */
    {
        char text[2048];
        size_t used = (size_t)snprintf(text, sizeof text,
                                       "[train]\nmax_steps = 5\n[cluster]\nps = 127.0.0.1:2999\n"
                                       "workers =\n");
        for (int i = 0; i < 16; i++)
            used += (size_t)snprintf(text + used, sizeof text - used,
                                     "    127.0.0.1:%d,   ; host %d\n",
                                     3000 + i, i);
        tu_write_file(ini, text, used);
    }
    ck_assert_int_eq(TU_KEEL(60000, "config", "check", ini, "--task",
                             "worker:15"), 0);
    ck_assert_str_eq(err, "");
    ck_assert_ptr_nonnull(strstr(out, "127.0.0.1:3015"));
    ck_assert_ptr_nonnull(strstr(out, "this task: worker 15"));
    tu_teardown();
}
END_TEST

/* keel launch -- PROGRAM: usage errors exit 2 before anything starts. */
/* config check, keygen, export and predict parse the getopt_long way */
START_TEST(test_more_verbs_parse_the_getopt_long_way)
{
    char cfg[4200], dir[256], key[300];
    struct stat sb;
    TU_SNPRINTF(cfg, sizeof cfg, "%s", tu_src_path("examples/fashion_mnist.ini"));
    tu_mkdtemp(dir, sizeof dir);
    /* --set=VALUE and -s VALUE reach the config */
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", "--set=train.nosuch=1",
                             cfg), 2);
    ck_assert_ptr_nonnull(strstr(err, "unknown key 'nosuch' in [train]"));
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", cfg, "-s",
                             "train.nosuch=2"), 2);
    ck_assert_ptr_nonnull(strstr(err, "unknown key 'nosuch' in [train]"));
    /* unknown options, a missing argument, two operands */
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", "-x", cfg), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: config check: unknown option "
                                 "'-x'"));
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", cfg, "--task"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: config check: --task needs "
                                 "TYPE:INDEX"));
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", cfg, cfg), 2);
    ck_assert_ptr_nonnull(strstr(err, "takes one CONFIG file"));
    /* after "--", "-s" is the CONFIG operand */
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", "--", "-s"), 2);
    ck_assert_ptr_nonnull(strstr(err, "-s"));
    ck_assert_ptr_null(strstr(err, "needs"));
    /* keygen: --name=VALUE, and --name VALUE after the operand */
    ck_assert_int_eq(TU_KEEL(10000, "keygen", "--name=alpha", dir), 0);
    TU_SNPRINTF(key, sizeof key, "%s/alpha.key", dir);
    ck_assert_int_eq(stat(key, &sb), 0);
    ck_assert_int_eq(TU_KEEL(10000, "keygen", dir, "--name", "beta"), 0);
    TU_SNPRINTF(key, sizeof key, "%s/beta.key_secret", dir);
    ck_assert_int_eq(stat(key, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    ck_assert_int_eq(TU_KEEL(10000, "keygen", dir, "--name"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: keygen: --name needs a NAME"));
    ck_assert_int_eq(TU_KEEL(10000, "keygen", "-q", dir), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: keygen: unknown option '-q'"));
    /* export and predict */
    ck_assert_int_eq(TU_KEEL(10000, "export", "--format=onnx"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: export needs CKPT"));
    ck_assert_int_eq(TU_KEEL(10000, "export", "a.h5", "--format"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: export: --format needs a "
                                 "value"));
    ck_assert_int_eq(TU_KEEL(10000, "export", "--bogus", "a.h5"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: export: unknown option "
                                 "'--bogus'"));
    ck_assert_int_eq(TU_KEEL(10000, "predict", "a.h5", "b.idx",
                             "--labels"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: predict: --labels needs a "
                                 "FILE"));
    ck_assert_int_eq(TU_KEEL(10000, "predict", "--json", "a.h5"), 2);
    ck_assert_ptr_nonnull(strstr(err, "predict needs CKPT and INPUT"));
    tu_rmrf(dir);
}
END_TEST

START_TEST(test_launch_program_usage_errors_exit_2)
{
    ck_assert_int_eq(TU_KEEL(10000, "launch", "--"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: launch: -- needs a PROGRAM"));
    ck_assert_int_eq(TU_KEEL(10000, "launch", "job.ini", "--",
                             "/bin/true"), 2);
    ck_assert_ptr_nonnull(strstr(err, "not both"));
    ck_assert_int_eq(TU_KEEL(10000, "launch", "-s", "train.seed=1", "--",
                             "/bin/true"), 2);
    ck_assert_ptr_nonnull(strstr(err, "PROGRAM takes its own arguments"));
    ck_assert_int_eq(TU_KEEL(10000, "launch", "--",
                             "keel-no-such-program-x"), 2);
    ck_assert_ptr_nonnull(strstr(err, "is not on PATH"));
    ck_assert_int_eq(TU_KEEL(10000, "launch", "--workers", "1",
                             "--replicas-to-aggregate", "3", "--",
                             "/bin/true"), 2);
    ck_assert_ptr_nonnull(strstr(err, "more than the 2 replicas"));
    ck_assert_int_eq(TU_KEEL(10000, "launch", "--async", "job.ini"), 2);
    ck_assert_ptr_nonnull(strstr(err, "are for -- PROGRAM"));
}
END_TEST

/* Every task runs PROGRAM ARGS with its own TF_CONFIG (the cluster, its
 * task, the mode) and OUTPUT_DIR; the run's status is the chief's. */
START_TEST(test_launch_program_gives_each_task_its_tf_config)
{
    char dir[256], outdir[300];
    tu_mkdtemp(dir, sizeof dir);
    snprintf(outdir, sizeof outdir, "%s/out", dir);
    ck_assert_int_eq(tu_keel(30000, out, sizeof out, err, sizeof err,
                             "launch", "--ps", "1", "--workers", "1",
                             "--async", "--no-status", "--output-dir",
                             outdir, "--", "sh", "-c",
                             /* the chief waits (20 s at most) until all
                              * three tasks printed: its end stops them */
                             "echo \"tf=$TF_CONFIG out=$OUTPUT_DIR\"; "
                             ": > \"$OUTPUT_DIR/seen.$$\"; "
                             "if echo \"$TF_CONFIG\" | "
                             "grep -q '\"type\": *\"chief\"'; then i=0; "
                             "while [ $(ls \"$OUTPUT_DIR\" | grep -c "
                             "'^seen[.]') -lt 3 ] && [ $i -lt 400 ]; do "
                             "sleep 0.05; i=$((i+1)); done; fi", NULL),
                     0);
    ck_assert_ptr_nonnull(strstr(out, "running sh; OUTPUT_DIR="));
    ck_assert_ptr_nonnull(strstr(out, "chief | tf={"));
    ck_assert_ptr_nonnull(strstr(out, "worker.0 | tf={"));
    ck_assert_ptr_nonnull(strstr(out, "ps.0 | tf={"));
    ck_assert_ptr_nonnull(strstr(out, "\"async\""));
    ck_assert_ptr_nonnull(strstr(out, outdir));
    ck_assert_ptr_nonnull(strstr(out, "the chief finished: run complete"));
    {
        char log[400];
        struct stat sb;
        snprintf(log, sizeof log, "%s/logs/chief.log", outdir);
        ck_assert_int_eq(stat(log, &sb), 0);
    }
    /* the chief's failure is the run's (after its restarts) */
    ck_assert_int_eq(TU_KEEL(30000, "launch", "--max-restarts", "0",
                             "--no-status", "--output-dir", outdir, "--", "sh",
                             "-c", "exit 3"), 1);
    ck_assert_ptr_nonnull(strstr(err, "chief"));
    tu_rmrf(dir);
}
END_TEST

static Suite *
cli_suite(void)
{
    Suite *s = suite_create("cli");
    tu_tcase(s, "contract", 30, NULL, NULL, TU_TESTS(
        test_top_level_answers_with_exit_status_and_stream,
        test_version_prints_library_version,
        test_every_verb_has_help,
        test_config_check_exits_2_on_every_error,
        test_options_parse_the_getopt_long_way,
        test_too_many_overrides_exit_2_naming_the_limit,
        test_more_verbs_parse_the_getopt_long_way,
        test_launch_program_usage_errors_exit_2,
        test_launch_program_gives_each_task_its_tf_config));
    return s;
}

KEEL_TEST_MAIN(cli_suite)
