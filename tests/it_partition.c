/* it_partition.c - partitioned variables under `keel launch` (3 ps, the
 * chief, 1 worker; real processes): an MLP whose kernels are split by
 * rows over the ps (cluster.partition_bytes) trains bitwise equal to the
 * same run without partitioning (`keel ckpt diff` exit 0), its checkpoint
 * holds each kernel whole (`keel ckpt show`: one dataset of the full
 * shape, no part), each ps holds a part, and both runs resumed from their
 * checkpoints stay equal; the same partitioned run with sharded
 * checkpoints (each ps writes its parts, the index shows each kernel as
 * one virtual dataset) equals the gathered one, also after resuming; bad
 * values exit 2 naming the key. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define RUN_MS 90000         /* deadline of a whole run */
#define PARTS "partition_bytes = 4096\n"
#define GATHERED PARTS "[checkpoint]\nsharded = off\n"
#define SHARDED PARTS "[checkpoint]\nsharded = on\n"

static char out[65536], err[65536];

/* Run the job with the [cluster] tail into <tu_dir>/<name> on n_ps ps. */
static void
run_job_on(const char *name, const char *cluster, int max_steps, int n_ps)
{
    char ps[16];
    char text[2048], cfg[4200], env0[4200];
    char *env[] = { env0, NULL };
    char *argv[12];
    int n = 0, rc;
    TU_SNPRINTF(text, sizeof text,
                "[model]\ntype = mlp\nhidden = 64,64\n[data]\ndir = %s\n"
                "[optimizer]\nname = adam\nlearning_rate = 0.01\n"
                "[train]\nbatch_size = 32\nseed = 5\nmax_steps = %d\n"
                "threads = 1\n[checkpoint]\nsave_steps = 6\n"
                "[hooks]\nprogress = off\n"
                "[cluster]\nmax_wait_secs = 30\n%s", tu_dir, max_steps,
                cluster);
    TU_SNPRINTF(cfg, sizeof cfg, "%s/%s.ini", tu_dir, name);
    tu_write_file(cfg, text, strlen(text));
    argv[n++] = (char *)tu_build_path("keel");
    argv[n++] = "launch";
    argv[n++] = cfg;
    TU_SNPRINTF(ps, sizeof ps, "%d", n_ps);
    argv[n++] = "--ps";
    argv[n++] = ps;
    argv[n++] = "--workers";
    argv[n++] = "1";
    argv[n++] = "--no-status";
    argv[n] = NULL;
    TU_SNPRINTF(env0, sizeof env0, "OUTPUT_DIR=%s", tu_path(name));
    rc = tu_run(argv, env, RUN_MS, out, sizeof out, err, sizeof err);
    ck_assert_msg(rc == 0, "run '%s' exited %d:\n%s\n%s", name, rc,
                  tu_tail(out, 2000), tu_tail(err, 2000));
}

/* On 3 ps. */
static void
run_job(const char *name, const char *cluster, int max_steps)
{
    run_job_on(name, cluster, max_steps, 3);
}

/* A copy of <tu_dir>/<from> as <tu_dir>/<to> (cp -a). */
static void
copy_run(const char *from, const char *to)
{
    char a[4200], b[4200];
    char *argv[] = { "/bin/cp", "-a", a, b, NULL };
    TU_SNPRINTF(a, sizeof a, "%s/%s", tu_dir, from);
    TU_SNPRINTF(b, sizeof b, "%s/%s", tu_dir, to);
    ck_assert_int_eq(tu_run(argv, NULL, RUN_MS, NULL, 0, NULL, 0), 0);
}

/* Whether <tu_dir>/<name>/logs/<task>.log holds text. */
static int
log_has(const char *name, const char *task, const char *text)
{
    char path[4200], *log;
    int has;
    TU_SNPRINTF(path, sizeof path, "%s/%s/logs/%s.log", tu_dir, name, task);
    log = tu_read_file(path, NULL);
    has = log != NULL && strstr(log, text) != NULL;
    free(log);
    return has;
}

/* The last lines of <tu_dir>/<name>/logs/<task>.log, for a failure. */
static const char *
log_tail(const char *name, const char *task)
{
    static char tail[2048];
    char path[4200], *log;
    TU_SNPRINTF(path, sizeof path, "%s/%s/logs/%s.log", tu_dir, name, task);
    log = tu_read_file(path, NULL);
    snprintf(tail, sizeof tail, "%s", log != NULL ? tu_tail(log, 1500)
                                                  : "(no log)");
    free(log);
    return tail;
}

/* Run a's and b's checkpoints of step are bitwise equal. */
static void
assert_same(const char *a, const char *b, int step)
{
    char pa[4200], pb[4200];
    int rc;
    TU_SNPRINTF(pa, sizeof pa, "%s/%s/model.ckpt-%d.h5", tu_dir, a, step);
    TU_SNPRINTF(pb, sizeof pb, "%s/%s/model.ckpt-%d.h5", tu_dir, b, step);
    rc = TU_KEEL(RUN_MS, "ckpt", "diff", pa, pb);
    ck_assert_msg(rc == 0, "keel ckpt diff %s %s exited %d:\n%s%s", a, b,
                  rc, out, err);
}

/* Every ps of run name read its parts as rows from the checkpoint of
 * step 12 and the chief's INIT carried no values. */
static void
assert_ps_read_rows(const char *name, int n_ps)
{
    for (int p = 0; p < n_ps; p++) {
        char task[16], text[64];
        TU_SNPRINTF(task, sizeof task, "ps.%d", p);
        TU_SNPRINTF(text, sizeof text, "ps %d: read ", p);
        ck_assert_msg(log_has(name, task, text) &&
                      log_has(name, task, " of step 12 from ") &&
                      log_has(name, task, "of them parts of partitioned "
                              "variables"), "%s ps %d:\n%s", name, p,
                      log_tail(name, task));
    }
    ck_assert_msg(log_has(name, "chief", "(INIT of 0.0 MiB in ") &&
                  log_has(name, "chief", "3 read a checkpoint") ==
                      (n_ps == 3), "%s:\n%s", name,
                  log_tail(name, "chief"));
}

static void
setup(void)
{
    (void)tu_setup_job("max_steps = 1\n");
}

START_TEST(test_partitioned_run_equals_the_unpartitioned_one)
{
    char pa[4200], pb[4200];
    int rc;
    run_job("whole", "", 12);
    /* 784x64 and 64x64 kernels above 4 KiB: 3 parts each (one per ps) */
    run_job("parts", GATHERED, 12);
    TU_SNPRINTF(pa, sizeof pa, "%s/whole/model.ckpt-12.h5", tu_dir);
    TU_SNPRINTF(pb, sizeof pb, "%s/parts/model.ckpt-12.h5", tu_dir);
    rc = TU_KEEL(RUN_MS, "ckpt", "diff", pa, pb);
    ck_assert_msg(rc == 0, "keel ckpt diff exited %d:\n%s%s", rc, out, err);
    ck_assert_ptr_nonnull(strstr(out, "identical: "));
    rc = TU_KEEL(RUN_MS, "ckpt", "show", pb);
    ck_assert_msg(rc == 0, "keel ckpt show exited %d:\n%s%s", rc, out, err);
    ck_assert_msg(strstr(out, "part_") == NULL, "a part in the "
                  "checkpoint:\n%s", out);
    ck_assert_msg(strstr(out, "[784,64]") != NULL, "no whole 784x64 "
                  "kernel:\n%s", out);
    /* 3 + 3 parts, the 64x10 kernel and 3 biases on the ps; each ps
     * holds a part of each split kernel and something more */
    for (int p = 0; p < 3; p++) {
        char path[64], *log;
        TU_SNPRINTF(path, sizeof path, "parts/logs/ps.%d.log", p);
        log = tu_read_file(tu_path(path), NULL);
        ck_assert_ptr_nonnull(log);
        ck_assert_msg(strstr(log, " of 10 variables") != NULL &&
                      strstr(log, ": 1 of 10 variables") == NULL &&
                      strstr(log, ": 0 of 10 variables") == NULL,
                      "ps %d: %s", p, tu_tail(log, 2000));
        free(log);
    }
    /* both resumed from their step-12 checkpoints (the whole variables
     * split again for the ps) to step 18: still the same bits */
    run_job("whole", "", 18);
    run_job("parts", GATHERED, 18);
    TU_SNPRINTF(pa, sizeof pa, "%s/whole/model.ckpt-18.h5", tu_dir);
    TU_SNPRINTF(pb, sizeof pb, "%s/parts/model.ckpt-18.h5", tu_dir);
    rc = TU_KEEL(RUN_MS, "ckpt", "diff", pa, pb);
    ck_assert_msg(rc == 0, "keel ckpt diff after resuming exited %d:\n%s%s",
                  rc, out, err);
}
END_TEST

/* Partitioned and sharded: the ps write their parts, the index presents
 * each kernel whole (a virtual dataset over the parts' rows), and the run
 * equals the gathered partitioned one, at the end and after resuming from
 * the sharded checkpoint. */
START_TEST(test_partitioned_sharded_run_equals_the_gathered_one)
{
    char pa[4200], pb[4200], *shard, *log;
    int rc;
    run_job("parts", GATHERED, 12);
    run_job("sharded", SHARDED, 12);
    TU_SNPRINTF(pb, sizeof pb, "%s/sharded/model.ckpt-12.shard-00002-of-"
                "00003.h5", tu_dir);
    shard = tu_read_file(pb, NULL);
    ck_assert_msg(shard != NULL, "no shard %s", pb);
    free(shard);
    TU_SNPRINTF(pa, sizeof pa, "%s/parts/model.ckpt-12.h5", tu_dir);
    TU_SNPRINTF(pb, sizeof pb, "%s/sharded/model.ckpt-12.h5", tu_dir);
    rc = TU_KEEL(RUN_MS, "ckpt", "diff", pa, pb);
    ck_assert_msg(rc == 0, "keel ckpt diff exited %d:\n%s%s", rc, out, err);
    ck_assert_ptr_nonnull(strstr(out, "identical: "));
    rc = TU_KEEL(RUN_MS, "ckpt", "show", pb);
    ck_assert_msg(rc == 0, "keel ckpt show exited %d:\n%s%s", rc, out, err);
    ck_assert_msg(strstr(out, "part_") == NULL &&
                  strstr(out, "[784,64]") != NULL &&
                  strstr(out, "shards:         3") != NULL,
                  "not one whole 784x64 kernel over 3 shards:\n%s", out);
    rc = TU_KEEL(RUN_MS, "ckpt", "verify", pb);
    ck_assert_msg(rc == 0, "keel ckpt verify exited %d:\n%s%s", rc, out,
                  err);
    /* both resumed (the sharded one from its index, each kernel read
     * whole and split again) to step 18: still the same bits */
    run_job("parts", GATHERED, 18);
    run_job("sharded", SHARDED, 18);
    log = tu_read_file(tu_path("sharded/logs/chief.log"), NULL);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "model.ckpt-12.h5 at global step 12") != NULL,
                  "the sharded run did not resume from step 12:\n%s",
                  tu_tail(log, 2000));
    free(log);
    TU_SNPRINTF(pa, sizeof pa, "%s/parts/model.ckpt-18.h5", tu_dir);
    TU_SNPRINTF(pb, sizeof pb, "%s/sharded/model.ckpt-18.h5", tu_dir);
    rc = TU_KEEL(RUN_MS, "ckpt", "diff", pa, pb);
    ck_assert_msg(rc == 0, "keel ckpt diff after resuming exited %d:\n%s%s",
                  rc, out, err);
}
END_TEST

/* The ps restore their parts themselves, nothing through the chief: a
 * partitioned sharded checkpoint of 3 ps (kernels in 3 parts) resumed on
 * 2 ps (kernels in 2 parts), each ps reading its parts' rows through the
 * index's virtual datasets, equals the same checkpoint resumed with the
 * values through the chief's INIT; a gathered checkpoint of an
 * unpartitioned run resumed partitioned (each ps reading rows of the
 * plain datasets) equals that run resumed unpartitioned. */
START_TEST(test_ps_restore_their_parts_as_rows_of_the_checkpoint)
{
    run_job("sharded", SHARDED, 12);
    copy_run("sharded", "byinit");
    run_job_on("sharded", SHARDED, 18, 2);
    assert_ps_read_rows("sharded", 2);
    run_job_on("byinit", GATHERED, 18, 2);
    ck_assert_msg(!log_has("byinit", "chief", "(INIT of 0.0 MiB in "),
                  "%s", log_tail("byinit", "chief"));
    assert_same("byinit", "sharded", 18);

    run_job("whole", "", 12);
    copy_run("whole", "intoparts");
    run_job("whole", "", 18);
    run_job("intoparts", SHARDED, 18);
    assert_ps_read_rows("intoparts", 3);
    ck_assert_msg(log_has("intoparts", "chief", "from model.ckpt-12.h5 "
                          "(step 12, a gathered checkpoint): no values"),
                  "%s", log_tail("intoparts", "chief"));
    assert_same("whole", "intoparts", 18);
}
END_TEST

START_TEST(test_bad_partition_values_exit_2_naming_the_key)
{
    static const char *const bad[][2] = {
        { "[cluster]\npartition_bytes = -1\n", "cluster.partition_bytes" },
        { "[cluster]\nmax_partitions = 5000\n", "cluster.max_partitions" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512], cfg[4200];
        int rc;
        TU_SNPRINTF(text, sizeof text, "[train]\nmax_steps = 1\n%s",
                    bad[i][0]);
        TU_SNPRINTF(cfg, sizeof cfg, "%s/bad%zu.ini", tu_dir, i);
        tu_write_file(cfg, text, strlen(text));
        rc = TU_KEEL(RUN_MS, "config", "check", cfg);
        ck_assert_msg(rc == 2, "%s: exit %d", bad[i][0], rc);
        ck_assert_msg(strstr(err, bad[i][1]) != NULL, "%s: %s", bad[i][1],
                      err);
        ck_assert_msg(strstr(err, "partition") != NULL, "%s", err);
    }
}
END_TEST

static Suite *
partition_suite(void)
{
    Suite *s = suite_create("it_partition");
    tu_tcase(s, "launch", 240, setup, tu_teardown, TU_TESTS(
        test_partitioned_run_equals_the_unpartitioned_one,
        test_partitioned_sharded_run_equals_the_gathered_one,
        test_ps_restore_their_parts_as_rows_of_the_checkpoint,
        test_bad_partition_values_exit_2_naming_the_key));
    return s;
}

KEEL_TEST_MAIN(partition_suite)
