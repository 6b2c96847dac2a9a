/* check_config.c - the job configuration: schema validation with file:line
 * errors, overrides, $OUTPUT_DIR, cross-key rules, and the CLI verb. */
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/keel.h>
#include <keel/app.h>
#include <keel/launch.h>
#include "testutil.h"

static keel_config *cfg;

static void
setup(void)
{
    tu_setup();
    unsetenv("OUTPUT_DIR");
    ck_assert_int_eq(keel_config_new(&cfg), KEEL_OK);
}

static void
teardown(void)
{
    keel_config_free(cfg);
    cfg = NULL;
    tu_teardown();
}

static const char *
write_ini(const char *text)
{
    const char *p = tu_path("job.ini");
    tu_write_file(p, text, strlen(text));
    return p;
}

/* The last error message holds needle and each string after it in ap, up
 * to a NULL. */
static void
error_holds(const char *needle, va_list ap)
{
    for (; needle != NULL; needle = va_arg(ap, const char *))
        ck_assert_msg(strstr(keel_last_error(), needle) != NULL,
                      "no '%s' in: %s", needle, keel_last_error());
}

/* Loading text (written to job.ini) fails with KEEL_EINVAL and a message
 * that holds each needle (a NULL-terminated list after text). */
static void
load_fails_naming(const char *text, ...)
{
    va_list ap;
    ck_assert_int_eq(keel_config_load(cfg, write_ini(text)), KEEL_EINVAL);
    va_start(ap, text);
    error_holds(va_arg(ap, const char *), ap);
    va_end(ap);
}

/* keel_config_validate fails with KEEL_EINVAL and a message that holds
 * each needle (a NULL-terminated list). */
static void
validate_fails_naming(const char *needle, ...)
{
    va_list ap;
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_EINVAL);
    va_start(ap, needle);
    error_holds(needle, ap);
    va_end(ap);
}

START_TEST(test_defaults_match_tf_and_issue)
{
    ck_assert_str_eq(keel_config_str(cfg, "model.type"), "mlp");
    ck_assert_int_eq(keel_config_int(cfg, "train.batch_size"), 64);
    ck_assert(keel_config_double(cfg, "checkpoint.save_secs") == 600.0);
    ck_assert_int_eq(keel_config_int(cfg, "checkpoint.max_to_keep"), 5);
    ck_assert_int_eq(keel_config_int(cfg, "hooks.log_every_steps"), 100);
    ck_assert_int_eq(keel_config_bool(cfg, "hooks.nan_check"), 1);
    ck_assert(keel_config_double(cfg, "cluster.max_wait_secs") == 300.0);
    ck_assert_str_eq(keel_config_str(cfg, "cluster.bind_address"), "");
    ck_assert_str_eq(keel_config_origin(cfg, "model.type"), "default");
    ck_assert(!keel_config_is_set(cfg, "model.type"));
}
END_TEST

START_TEST(test_load_valid_file_records_origin_lines)
{
    int64_t h[4];
    const char *p = write_ini("; a job\n[model]\ntype = mlp\nhidden = 128, 64\n"
                              "\n[train]\nmax_steps = 100\nseed=7 ; inline\n");
    ck_assert_int_eq(keel_config_load(cfg, p), KEEL_OK);
    ck_assert_int_eq(keel_config_int(cfg, "train.max_steps"), 100);
    ck_assert_int_eq(keel_config_int(cfg, "train.seed"), 7);
    ck_assert_int_eq(keel_config_int_list(cfg, "model.hidden", h, 4), 2);
    ck_assert_int_eq(h[0], 128);
    ck_assert_int_eq(h[1], 64);
    ck_assert(keel_config_is_set(cfg, "train.seed"));
    ck_assert_ptr_nonnull(strstr(keel_config_origin(cfg, "train.seed"),
                                 "job.ini:8"));
    ck_assert_ptr_nonnull(strstr(keel_config_source_text(cfg), "[model]"));
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
}
END_TEST

START_TEST(test_typo_key_names_file_line_and_choices)
{
    load_fails_naming("[train]\nbatch_size = 32\nmax_stpes = 10\n",
                      "job.ini:3", "unknown key 'max_stpes'", "max_steps",
                      NULL);
}
END_TEST

START_TEST(test_unknown_section_even_when_empty)
{
    load_fails_naming("[train]\nmax_steps = 1\n\n[trian]\n", "job.ini:4",
                      "[trian]", "[checkpoint]", NULL);
}
END_TEST

START_TEST(test_bad_values_explain_valid_range)
{
    load_fails_naming("[model]\ntype = resnet\n", "job.ini:2",
                      "softmax, mlp, cnn", NULL);
    load_fails_naming("[train]\nbatch_size = 0\n", "from 1 to", NULL);
    load_fails_naming("[checkpoint]\nasync = maybe\n", "true or false", NULL);
    load_fails_naming("[optimizer]\nlearning_rate = fast\n", NULL);
    load_fails_naming("[model]\nhidden = 256,,x\n", "model.hidden", NULL);
    load_fails_naming("[model]\nclasses = 2000000\n", "model.classes",
                      NULL);
    load_fails_naming("[data]\nstream = maybe\n", "auto, on, off", NULL);
    load_fails_naming("[checkpoint]\nsharded = yes\n", "job.ini:2",
                      "auto, on, off", NULL);
    /* the failed loads changed nothing that was valid before */
    ck_assert_str_eq(keel_config_str(cfg, "model.type"), "mlp");
    ck_assert_str_eq(keel_config_str(cfg, "checkpoint.sharded"), "off");
    ck_assert_int_eq(keel_config_override(cfg, "checkpoint.sharded=on",
                                          "-s"), KEEL_OK);
    ck_assert_str_eq(keel_config_str(cfg, "checkpoint.sharded"), "on");
}
END_TEST

START_TEST(test_duplicate_key_and_key_outside_section)
{
    load_fails_naming("[train]\nseed = 1\nseed = 2\n", "set twice", NULL);
    load_fails_naming("seed = 1\n", "outside any section", NULL);
}
END_TEST

/* 16 workers on one line (over inih's 200-byte line buffer), a long
 * comment, then the same list continued on indented lines: every value is
 * whole and every origin names its real line. */
START_TEST(test_long_lines_and_continued_lists)
{
    char workers[1024], text[8192], comment[600], want[1024];
    int64_t h[8];
    size_t used = 0;
    const char *p;
    for (int i = 0; i < 16; i++)
        used += (size_t)snprintf(workers + used, sizeof workers - used,
                                 "%s127.0.0.1:%d", i ? ", " : "", 3000 + i);
    ck_assert_uint_gt(strlen(workers), 200);
    memset(comment, 'c', sizeof comment - 1);
    comment[sizeof comment - 1] = '\0';
    snprintf(text, sizeof text,
             "[cluster]\n"                       /* 1 */
             "; %s\n"                            /* 2 */
             "workers = %s ; %s\n"               /* 3 */
             "ps = 127.0.0.1:2999\n"             /* 4 */
             "[model]\n"                         /* 5 */
             "hidden = 64,\n"                    /* 6 */
             "  32 ; a comment\n"                /* 7 */
             "\n"                                /* 8 */
             "\t16\n"                            /* 9 */
             "[train]\n"                         /* 10 */
             "max_steps = 7\n",                  /* 11 */
             comment, workers, comment);
    p = write_ini(text);
    ck_assert_int_eq(keel_config_load(cfg, p), KEEL_OK);
    ck_assert_str_eq(keel_config_str(cfg, "cluster.workers"), workers);
    ck_assert_ptr_nonnull(strstr(keel_config_origin(cfg, "cluster.workers"),
                                 "job.ini:3"));
    ck_assert_str_eq(keel_config_str(cfg, "cluster.ps"), "127.0.0.1:2999");
    ck_assert_ptr_nonnull(strstr(keel_config_origin(cfg, "cluster.ps"),
                                 "job.ini:4"));
    ck_assert_int_eq(keel_config_int_list(cfg, "model.hidden", h, 8), 3);
    ck_assert_int_eq(h[0], 64);
    ck_assert_int_eq(h[1], 32);
    ck_assert_int_eq(h[2], 16);
    ck_assert_int_eq(keel_config_int(cfg, "train.max_steps"), 7);
    ck_assert_ptr_nonnull(strstr(keel_config_origin(cfg, "train.max_steps"),
                                 "job.ini:11"));

    /* The same hosts one per indented line. */
    keel_config_free(cfg);
    ck_assert_int_eq(keel_config_new(&cfg), KEEL_OK);
    used = (size_t)snprintf(text, sizeof text, "[cluster]\nworkers =\n");
    for (int i = 0; i < 16; i++)
        used += (size_t)snprintf(text + used, sizeof text - used,
                                 "    127.0.0.1:%d,\n", 3000 + i);
    snprintf(text + used, sizeof text - used, "mode = async\n");
    p = write_ini(text);
    ck_assert_int_eq(keel_config_load(cfg, p), KEEL_OK);
    snprintf(want, sizeof want, "%s", workers);
    /* "a," + "b," joins as "a,b" (the last comma dropped): compare
     * without the blanks. */
    {
        char got[1024], exp[1024];
        size_t g = 0, e = 0;
        for (const char *c = keel_config_str(cfg, "cluster.workers"); *c; c++)
            if (*c != ' ')
                got[g++] = *c;
        got[g] = '\0';
        for (const char *c = want; *c; c++)
            if (*c != ' ')
                exp[e++] = *c;
        exp[e] = '\0';
        ck_assert_str_eq(got, exp);
    }
    ck_assert_str_eq(keel_config_str(cfg, "cluster.mode"), "async");
    ck_assert_ptr_nonnull(strstr(keel_config_origin(cfg, "cluster.mode"),
                                 "job.ini:19"));
}
END_TEST

/* An error after a long line names its own line; a long line's own error
 * names it too. */
START_TEST(test_errors_after_long_lines_name_the_right_line)
{
    char text[4096], pad[1000];
    memset(pad, 'x', sizeof pad - 1);
    pad[sizeof pad - 1] = '\0';
    snprintf(text, sizeof text, "# %s\n[train]\n# %s\nmax_stpes = 1\n", pad,
             pad);
    load_fails_naming(text, "job.ini:4:", "'max_stpes'", NULL);
    snprintf(text, sizeof text, "[train]\n\nmax_steps = 1\nseed = %s\n", pad);
    load_fails_naming(text, "job.ini:4:", "train.seed", NULL);
    snprintf(text, sizeof text, "[train]\nmax_steps = 1\n%s\n", pad);
    load_fails_naming(text, "job.ini:3:", "syntax error", NULL);
}
END_TEST

START_TEST(test_only_lists_continue_and_values_have_a_limit)
{
    const char *p;
    char *big;
    size_t n = 70000;
    load_fails_naming("[train]\nmax_steps = 5\n  seed = 3\n", "job.ini:3:",
                      "train.max_steps", "not a list", NULL);
    /* Indented keys right after a section header are keys, not lines
     * continuing anything. */
    keel_config_free(cfg);
    ck_assert_int_eq(keel_config_new(&cfg), KEEL_OK);
    p = write_ini("[train]\n  max_steps = 5\n");
    ck_assert_int_eq(keel_config_load(cfg, p), KEEL_OK);
    ck_assert_int_eq(keel_config_int(cfg, "train.max_steps"), 5);
    /* A continued list is validated whole. */
    load_fails_naming("[model]\nhidden = 8,\n  nine\n", "job.ini:3:", "'nine'",
                      NULL);
    /* Over the value limit: named with the line and the limit. */
    big = malloc(n + 64);
    ck_assert_ptr_nonnull(big);
    memcpy(big, "[data]\n\ndir = ", 14);
    memset(big + 14, 'd', n);
    memcpy(big + 14 + n, "\n", 2);
    load_fails_naming(big, "job.ini:3:", "limit 65536", NULL);
    free(big);
}
END_TEST

START_TEST(test_missing_and_binary_files)
{
    ck_assert_int_eq(keel_config_load(cfg, tu_path("nope.ini")), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "nope.ini"));
    tu_write_file(tu_path("bin.ini"), "[train]\0x", 9);
    ck_assert_int_eq(keel_config_load(cfg, tu_path("bin.ini")), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "NUL"));
}
END_TEST

START_TEST(test_overrides_and_output_dir)
{
    ck_assert_int_eq(keel_config_override(cfg, "train.max_steps=50", "-s"),
                     KEEL_OK);
    ck_assert_int_eq(keel_config_int(cfg, "train.max_steps"), 50);
    ck_assert_str_eq(keel_config_origin(cfg, "train.max_steps"), "-s");
    ck_assert_int_eq(keel_config_override(cfg, "train.max_step=5", "-s"),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "unknown key 'max_step'"));
    ck_assert_int_eq(keel_config_override(cfg, "nosection", "-s"),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_config_override(cfg, "x.y=1", "-s"), KEEL_EINVAL);
    ck_assert_int_eq(keel_config_override(cfg, "cluster.bind_address=*",
                                          "-s"), KEEL_OK);
    ck_assert_str_eq(keel_config_str(cfg, "cluster.bind_address"), "*");
    ck_assert_str_eq(keel_config_str(cfg, "cluster.local_transport"),
                     "auto");
    ck_assert_int_eq(keel_config_override(cfg, "cluster.local_transport=tcp",
                                          "-s"), KEEL_OK);
    ck_assert_str_eq(keel_config_str(cfg, "cluster.local_transport"), "tcp");
    ck_assert_int_eq(keel_config_override(cfg, "cluster.local_transport=shm",
                                          "-s"), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "local_transport"));
    setenv("OUTPUT_DIR", "/tmp/out-from-env", 1);
    ck_assert_int_eq(keel_config_apply_env(cfg), KEEL_OK);
    ck_assert_str_eq(keel_config_str(cfg, "checkpoint.dir"),
                     "/tmp/out-from-env");
    ck_assert_str_eq(keel_config_origin(cfg, "checkpoint.dir"), "$OUTPUT_DIR");
    /* -s beats the environment */
    ck_assert_int_eq(keel_config_override(cfg, "checkpoint.dir=/tmp/cli",
                                          "-s"), KEEL_OK);
    ck_assert_int_eq(keel_config_apply_env(cfg), KEEL_OK);
    ck_assert_str_eq(keel_config_str(cfg, "checkpoint.dir"), "/tmp/cli");
    unsetenv("OUTPUT_DIR");
}
END_TEST

START_TEST(test_conflicting_options_are_errors)
{
    keel_config_override(cfg, "train.max_steps=10", "-s");
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    keel_config_override(cfg, "checkpoint.save_steps=100", "-s");
    keel_config_override(cfg, "checkpoint.save_secs=60", "-s");
    validate_fails_naming("both set", NULL);
    keel_config_override(cfg, "checkpoint.save_secs=0", "-s");
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    keel_config_override(cfg, "model.classes=100", "-s");
    ck_assert_int_eq(keel_config_int(cfg, "model.classes"), 100);
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    keel_config_override(cfg, "model.classes=1", "-s");
    validate_fails_naming("model.classes = 1", "at least 2", NULL);
    keel_config_override(cfg, "model.classes=0", "-s");
    keel_config_override(cfg, "model.type=cnn", "-s");
    keel_config_override(cfg, "model.hidden=10", "-s");
    validate_fails_naming("model.hidden", NULL);
}
END_TEST

/* cluster.elastic: taken with sync mode over the reduction tree; with
 * async mode, the tree off, micro-batches or backup workers it is refused,
 * naming both keys. */
START_TEST(test_elastic_needs_sync_over_the_tree)
{
    keel_config_override(cfg, "train.max_steps=10", "-s");
    keel_config_override(cfg, "cluster.elastic=true", "-s");
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    keel_config_override(cfg, "cluster.mode=async", "-s");
    validate_fails_naming("cluster.elastic", "cluster.mode = async", NULL);
    keel_config_override(cfg, "cluster.mode=sync", "-s");
    keel_config_override(cfg, "cluster.reduce_tree=false", "-s");
    validate_fails_naming("cluster.elastic", "cluster.reduce_tree", NULL);
    keel_config_override(cfg, "cluster.reduce_tree=true", "-s");
    keel_config_override(cfg, "cluster.replicas_to_aggregate=2", "-s");
    validate_fails_naming("cluster.elastic", "backup workers", NULL);
}
END_TEST

/* cluster.partition_bytes and max_partitions: in range they are taken;
 * with checkpoint.sharded = on too; out of range, or partitioning with
 * K-FAC or an update rule keeping the chief's model, refused by name. */
START_TEST(test_partition_keys)
{
    keel_config_override(cfg, "train.max_steps=10", "-s");
    ck_assert_int_eq(keel_config_override(cfg, "cluster.partition_bytes="
                                          "1048576", "-s"), KEEL_OK);
    ck_assert_int_eq(keel_config_override(cfg, "cluster.max_partitions=8",
                                          "-s"), KEEL_OK);
    ck_assert_int_eq(keel_config_int(cfg, "cluster.partition_bytes"),
                     1048576);
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    ck_assert_int_eq(keel_config_override(cfg, "cluster.partition_bytes=-1",
                                          "-s"), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "cluster.partition_bytes"));
    ck_assert_int_eq(keel_config_override(cfg, "cluster.max_partitions="
                                          "1025", "-s"), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "cluster.max_partitions"));
    keel_config_override(cfg, "checkpoint.sharded=on", "-s");
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    keel_config_override(cfg, "checkpoint.sharded=auto", "-s");
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    keel_config_override(cfg, "algorithm.name=easgd", "-s");
    validate_fails_naming("cluster.partition_bytes", "algorithm.name", NULL);
}
END_TEST

/* checkpoint.warm_start_from / warm_start_vars: a file or directory and a
 * regex are taken; a regex that does not compile, a regex without a source
 * and the run's own checkpoint.dir as the source are refused by name. */
START_TEST(test_warm_start_keys)
{
    keel_config_override(cfg, "train.max_steps=10", "-s");
    keel_config_override(cfg, "checkpoint.dir=/tmp/run2", "-s");
    keel_config_override(cfg, "checkpoint.warm_start_from=/tmp/run1", "-s");
    keel_config_override(cfg, "checkpoint.warm_start_vars=dense_[12]/.*",
                         "-s");
    ck_assert_msg(keel_config_validate(cfg) == KEEL_OK, "%s",
                  keel_last_error());
    ck_assert_str_eq(keel_config_str(cfg, "checkpoint.warm_start_from"),
                     "/tmp/run1");
    keel_config_override(cfg, "checkpoint.warm_start_vars=dense_(1", "-s");
    validate_fails_naming("checkpoint.warm_start_vars 'dense_(1'", "regex",
                          NULL);
    keel_config_override(cfg, "checkpoint.warm_start_vars=dense_1/.*", "-s");
    keel_config_override(cfg, "checkpoint.warm_start_from=", "-s");
    validate_fails_naming("checkpoint.warm_start_vars",
                          "needs checkpoint.warm_start_from", NULL);
    keel_config_override(cfg, "checkpoint.warm_start_from=/tmp/run2/", "-s");
    validate_fails_naming("checkpoint.warm_start_from", "checkpoint.dir",
                          "own checkpoint directory", NULL);
}
END_TEST

START_TEST(test_algorithm_name_picks_the_mode_and_checks_its_partners)
{
    int is_set = -1;
    keel_config_override(cfg, "train.max_steps=10", "-s");
    /* neither key set: sync, not set */
    ck_assert_int_eq(keel_config_is_async(cfg, &is_set), 0);
    ck_assert_int_eq(is_set, 0);
    keel_config_override(cfg, "cluster.mode=async", "-s");
    ck_assert_int_eq(keel_config_is_async(cfg, &is_set), 1);
    ck_assert_int_eq(is_set, 1);
    /* hogwild on a cluster is async; it agrees with cluster.mode */
    ck_assert_int_eq(keel_config_override(cfg, "algorithm.name=hogwild",
                                          "-s"), KEEL_OK);
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    ck_assert_int_eq(keel_config_is_async(cfg, NULL), 1);
    keel_config_override(cfg, "cluster.mode=sync", "-s");
    validate_fails_naming("algorithm.name = hogwild", "cluster.mode = sync",
                          NULL);
    keel_config_override(cfg, "algorithm.name=sync", "-s");
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    ck_assert_int_eq(keel_config_is_async(cfg, NULL), 0);
    keel_config_override(cfg, "algorithm.name=hogwild", "-s");
    keel_config_override(cfg, "cluster.mode=async", "-s");
    keel_config_override(cfg, "train.micro_batch=16", "-s");
    validate_fails_naming("train.micro_batch", NULL);
    keel_config_override(cfg, "train.micro_batch=0", "-s");
    keel_config_override(cfg, "optimizer.name=kfac", "-s");
    validate_fails_naming("optimizer.name = kfac", NULL);
    /* an unknown scheme names the choices */
    ck_assert_int_eq(keel_config_override(cfg, "algorithm.name=downpur",
                                          "-s"), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "hogwild"));
    ck_assert_int_eq(keel_config_override(cfg, "algorithm.hogwild_cas=yes",
                                          "-s"), KEEL_OK);
    ck_assert_int_eq(keel_config_bool(cfg, "algorithm.hogwild_cas"), 1);
}
END_TEST

START_TEST(test_run_needs_an_end_and_piecewise_needs_values)
{
    validate_fails_naming("no end", NULL);
    keel_config_override(cfg, "train.epochs=2", "-s");
    keel_config_override(cfg, "optimizer.schedule=piecewise", "-s");
    keel_config_override(cfg, "optimizer.boundaries=100,200", "-s");
    keel_config_override(cfg, "optimizer.values=0.1,0.01", "-s");
    validate_fails_naming("one more", NULL);
    keel_config_override(cfg, "optimizer.values=0.1,0.01,0.001", "-s");
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    keel_config_override(cfg, "optimizer.boundaries=200,100", "-s");
    validate_fails_naming("increase", NULL);
}
END_TEST

START_TEST(test_dump_lists_every_section_with_origins)
{
    char *text;
    keel_config_override(cfg, "train.seed=42", "-s");
    ck_assert_int_eq(keel_config_dump(cfg, 1, &text), KEEL_OK);
    ck_assert_ptr_nonnull(strstr(text, "[security]"));
    ck_assert_ptr_nonnull(strstr(text, "; -s"));
    ck_assert_ptr_nonnull(strstr(text, "42"));
    free(text);
}
END_TEST

/* What a checkpoint stores: the dump loads back to the same settings. */
START_TEST(test_dump_round_trips_through_load_text)
{
    char *text, *again;
    keel_config *back;
    ck_assert_int_eq(keel_config_override(cfg, "model.type=mlp", "-s"),
                     KEEL_OK);
    ck_assert_int_eq(keel_config_override(cfg, "model.hidden=48,12", "-s"),
                     KEEL_OK);
    ck_assert_int_eq(keel_config_dump(cfg, 0, &text), KEEL_OK);
    ck_assert_int_eq(keel_config_new(&back), KEEL_OK);
    ck_assert_int_eq(keel_config_load_text(back, text, "dump"), KEEL_OK);
    ck_assert_str_eq(keel_config_str(back, "model.type"), "mlp");
    ck_assert_int_eq(keel_config_dump(back, 0, &again), KEEL_OK);
    ck_assert_str_eq(again, text);
    free(again);
    free(text);
    keel_config_free(back);
}
END_TEST

START_TEST(test_cli_config_check_contract)
{
    static char out[65536], err[8192];
    const char *good = write_ini("[train]\nmax_steps = 5\n");
    const char *bad;
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", good, "-s",
                             "train.seed=3"), 0);
    ck_assert_ptr_nonnull(strstr(out, "valid"));
    ck_assert_ptr_nonnull(strstr(out, "max_steps"));
    bad = tu_path("bad.ini");
    tu_write_file(bad, "[train]\nmax_stpes = 5\n", 22);
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", bad), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: "));
    ck_assert_ptr_nonnull(strstr(err, "bad.ini:2"));
    ck_assert_int_eq(TU_KEEL(10000, "config", "check"), 2);
    ck_assert_int_eq(TU_KEEL(10000, "config", "frob"), 2);
}
END_TEST

START_TEST(test_tf_config_model_dir_is_checkpoint_dir_unless_another)
{
    static char out[65536], err[8192];
    const char *ini = write_ini("[train]\nmax_steps = 5\n");
    const char *other;
    char same[4200], tf[4400];
    /* unset: model_dir becomes checkpoint.dir */
    ck_assert_int_eq(keel_config_apply_model_dir(cfg, NULL), KEEL_OK);
    ck_assert_int_eq(keel_config_apply_model_dir(cfg, tu_dir), KEEL_OK);
    ck_assert_str_eq(keel_config_str(cfg, "checkpoint.dir"), tu_dir);
    ck_assert_str_eq(keel_config_origin(cfg, "checkpoint.dir"),
                     "TF_CONFIG model_dir");
    /* the same directory spelled differently is no conflict */
    snprintf(same, sizeof same, "%s/", tu_dir);
    ck_assert_int_eq(keel_config_override(cfg, "checkpoint.dir=/tmp/a/",
                                          "-s"), KEEL_OK);
    ck_assert_int_eq(keel_config_apply_model_dir(cfg, "/tmp/a"), KEEL_OK);
    /* a different one is a configuration error naming both */
    ck_assert_int_eq(keel_config_apply_model_dir(cfg, same), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "/tmp/a"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), same));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "-s"));

    /* the CLI: TF_CONFIG's model_dir, and a conflict exits 2 */
    snprintf(tf, sizeof tf, "{\"model_dir\": \"%s\"}", tu_dir);
    setenv("TF_CONFIG", tf, 1);
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", ini), 0);
    ck_assert_ptr_nonnull(strstr(out, "TF_CONFIG model_dir"));
    other = tu_path("other");
    ck_assert_int_eq(TU_KEEL(10000, "config", "check", ini, "-s",
                             "checkpoint.dir=x"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: TF_CONFIG model_dir"));
    setenv("OUTPUT_DIR", other, 1);
    ck_assert_int_eq(TU_KEEL(10000, "train", ini), 2);
    ck_assert_ptr_nonnull(strstr(err, other));
    ck_assert_ptr_nonnull(strstr(err, tu_dir));
    ck_assert_ptr_nonnull(strstr(err, "$OUTPUT_DIR"));
    unsetenv("OUTPUT_DIR");
    unsetenv("TF_CONFIG");
}
END_TEST

START_TEST(test_docs_config_md_is_the_generated_reference)
{
    static char out[131072];
    char *doc;
    ck_assert_int_eq(tu_keel(10000, out, sizeof out, NULL, 0, "config",
                             "keys", NULL), 0);
    doc = tu_read_file(tu_src_path("docs/config.md"), NULL);
    ck_assert_msg(strcmp(doc, out) == 0, "docs/config.md is stale: "
                  "regenerate it with 'keel config keys > docs/config.md'");
    free(doc);
}
END_TEST

/* [algorithm]: every rule's name parses; cluster.mode is the older name
 * of sync/async and must agree with algorithm.name; per-worker rates are
 * for sync only; K-FAC takes plain sync only. */
START_TEST(test_algorithm_keys_and_their_conflicts)
{
    keel_config_override(cfg, "train.max_steps=10", "-s");
    ck_assert_int_eq(keel_config_override(cfg, "algorithm.name=aeamsgd",
                                          "-s"), KEEL_OK);
    ck_assert_int_eq(keel_config_override(cfg, "algorithm.window=4", "-s"),
                     KEEL_OK);
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    ck_assert_int_eq(keel_config_int(cfg, "algorithm.window"), 4);
    ck_assert_int_eq(keel_config_override(cfg, "algorithm.name=elastic",
                                          "-s"), KEEL_EINVAL);
    ck_assert_int_eq(keel_config_override(cfg, "cluster.mode=sync", "-s"),
                     KEEL_OK);
    validate_fails_naming("cluster.mode", NULL);
    ck_assert_int_eq(keel_config_override(cfg, "algorithm.name=easgd", "-s"),
                     KEEL_OK);
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    ck_assert_int_eq(keel_config_override(
                         cfg, "algorithm.worker_learning_rates=0.1,0.05",
                         "-s"), KEEL_OK);
    validate_fails_naming("sync", NULL);
    ck_assert_int_eq(keel_config_override(cfg, "algorithm.name=sync", "-s"),
                     KEEL_OK);
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    /* K-FAC: the chief applies each sync step's update, so the plain sync
     * rule only (per-worker rates and every other rule refused) */
    ck_assert_int_eq(keel_config_override(cfg, "optimizer.name=kfac", "-s"),
                     KEEL_OK);
    validate_fails_naming("algorithm.worker_learning_rates", "kfac", NULL);
    ck_assert_int_eq(keel_config_override(
                         cfg, "algorithm.worker_learning_rates=", "-s"),
                     KEEL_OK);
    ck_assert_int_eq(keel_config_validate(cfg), KEEL_OK);
    ck_assert_int_eq(keel_config_override(cfg, "algorithm.name=sagn", "-s"),
                     KEEL_OK);
    validate_fails_naming("algorithm.name", "kfac", NULL);
    /* the cluster's mode follows the rule (its "sync" column), whatever
     * cluster.mode says */
    ck_assert_int_eq(keel_config_is_async(cfg, NULL), 0);
    keel_config_override(cfg, "algorithm.name=easgd", "-s");
    ck_assert_int_eq(keel_config_is_async(cfg, NULL), 0);
    keel_config_override(cfg, "algorithm.name=model_averaging", "-s");
    ck_assert_int_eq(keel_config_is_async(cfg, NULL), 0);
    keel_config_override(cfg, "algorithm.name=downpour", "-s");
    ck_assert_int_eq(keel_config_is_async(cfg, NULL), 1);
    keel_config_override(cfg, "algorithm.name=dynsgd", "-s");
    ck_assert_int_eq(keel_config_is_async(cfg, NULL), 1);
}
END_TEST

/* Which rules let a running job take workers beyond its spec: the
 * asynchronous ones whose ps keeps nothing per replica. */
START_TEST(test_algorithm_admits_joiners_only_without_per_replica_state)
{
    static const struct { const char *name; int joins; } want[] = {
        { "sync", 0 }, { "async", 1 }, { "hogwild", 1 }, { "downpour", 1 },
        { "downpour_easy", 1 }, { "agn", 1 }, { "sagn", 0 }, { "adag", 0 },
        { "dynsgd", 0 }, { "easgd", 0 }, { "aeasgd", 1 }, { "aeamsgd", 1 },
        { "model_averaging", 0 },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        keel_algorithm a;
        ck_assert_int_eq(keel_algorithm_from_name(want[i].name, &a), KEEL_OK);
        ck_assert_msg(keel_algorithm_admits_joiners(a) == want[i].joins,
                      "%s", want[i].name);
    }
}
END_TEST

/* The option structs of the cluster, job and launch APIs made without
 * their init function (struct_size 0) are refused by the function taking
 * them, naming the struct and its init function, before anything runs. */
static keel_status
zc_slurm(void)
{
    keel_cluster_slurm_config o;
    keel_cluster_spec *spec = NULL;
    memset(&o, 0, sizeof o);
    return keel_cluster_spec_from_slurm(&o, &spec);
}

static keel_status
zc_launch(void)
{
    char *argv[] = { "/bin/true", NULL };
    keel_launch_config c;
    keel_launch *l = NULL;
    memset(&c, 0, sizeof c);
    c.exe = argv[0];
    c.argv = argv;
    c.output_dir = tu_path("out");
    return keel_launch_new(&c, &l);
}

static keel_status
zc_job_options(void)
{
    keel_job_config o;
    keel_job_result r;
    memset(&o, 0, sizeof o);
    return keel_job_train(cfg, &o, &r);
}

static keel_status
zc_evaluator_options(void)
{
    keel_evaluator_config o;
    keel_evaluator_result r;
    memset(&o, 0, sizeof o);
    return keel_job_run_evaluator(cfg, &o, &r);
}

START_TEST(test_zeroed_option_structs_are_refused_by_name)
{
    static const tu_zeroed_case cases[] = {
        { "keel_cluster_slurm_config", zc_slurm },
        { "keel_launch_config", zc_launch },
        { "keel_job_config", zc_job_options },
        { "keel_evaluator_config", zc_evaluator_options },
    };
    tu_assert_zeroed_refused(cases, sizeof cases / sizeof *cases);
}
END_TEST

static Suite *
config_suite(void)
{
    Suite *s = suite_create("config");
    tu_tcase(s, "config", 30, setup, teardown, TU_TESTS(
        test_defaults_match_tf_and_issue,
        test_load_valid_file_records_origin_lines,
        test_typo_key_names_file_line_and_choices,
        test_unknown_section_even_when_empty,
        test_bad_values_explain_valid_range,
        test_duplicate_key_and_key_outside_section,
        test_long_lines_and_continued_lists,
        test_errors_after_long_lines_name_the_right_line,
        test_only_lists_continue_and_values_have_a_limit,
        test_missing_and_binary_files,
        test_overrides_and_output_dir,
        test_conflicting_options_are_errors,
        test_elastic_needs_sync_over_the_tree,
        test_partition_keys,
        test_warm_start_keys,
        test_algorithm_name_picks_the_mode_and_checks_its_partners,
        test_run_needs_an_end_and_piecewise_needs_values,
        test_dump_lists_every_section_with_origins,
        test_dump_round_trips_through_load_text,
        test_cli_config_check_contract,
        test_tf_config_model_dir_is_checkpoint_dir_unless_another,
        test_docs_config_md_is_the_generated_reference,
        test_algorithm_keys_and_their_conflicts,
        test_algorithm_admits_joiners_only_without_per_replica_state,
        test_zeroed_option_structs_are_refused_by_name));
    return s;
}

KEEL_TEST_MAIN(config_suite)
