/* it_train.c - `keel train` and `keel eval` as a user runs them: a small
 * synthetic MNIST-format dataset, real checkpoints, resume after a clean
 * stop and after SIGKILL (bitwise equal to an uninterrupted run), bad
 * configs exiting 2 with one clear message. */
#include <config.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include <keel/keel.h>
#include "testutil.h"

static char out[65536], err[65536];

static const char *cfg_path;

static void
setup(void)
{
    cfg_path = tu_setup_job(
             "max_steps = 40\nthreads = 1\n"
             "[checkpoint]\ndir = %s/run\nsave_steps = 5\n"
             "[hooks]\nlog_every_steps = 1\nsummary_every_steps = 10\n"
             "progress = off\n", tu_dir);
}

START_TEST(test_train_then_eval_learns_and_reports_json)
{
    double acc = 0;
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path), 0);
    ck_assert_ptr_nonnull(strstr(out, "step 40 "));
    ck_assert_ptr_nonnull(strstr(out, "trained steps 0..40"));
    ck_assert_int_ge(tu_file_size(tu_path("run/model.ckpt-40.h5")), 1);
    ck_assert_int_ge(tu_file_size(tu_path("run/checkpoint")), 1);
    ck_assert_int_ge(tu_file_size(tu_path("run/scalars.csv")), 1);
    ck_assert_int_eq(TU_KEEL(60000, "eval", cfg_path, "--json"), 0);
    ck_assert_double_eq(tu_json_number(out, "step"), 40);
    acc = tu_json_number(out, "accuracy");
    ck_assert_msg(acc > 0.9, "the synthetic task is easy: accuracy %g", acc);
    ck_assert_ptr_nonnull(strstr(out, "\"examples\": 200"));
    ck_assert_ptr_nonnull(strstr(out, "model.ckpt-40.h5"));
    /* eval DIR: the checkpoint carries the config */
    ck_assert_int_eq(TU_KEEL(60000, "eval", tu_path("run")), 0);
    ck_assert_ptr_nonnull(strstr(out, "step 40: test loss"));
}
END_TEST

/* The checkpoint stores the resolved config, -s overrides included: a model
 * widened on the command line is rebuilt as trained by `keel eval DIR`. */
START_TEST(test_eval_dir_rebuilds_a_model_changed_by_overrides)
{
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s", "model.hidden=48",
                             "-s", "train.max_steps=10"), 0);
    ck_assert_int_eq(TU_KEEL(60000, "eval", tu_path("run")), 0);
    ck_assert_ptr_nonnull(strstr(out, "step 10: test loss"));
    /* with the file alone the shapes differ: a configuration error that
     * names the shapes */
    ck_assert_int_eq(TU_KEEL(60000, "eval", cfg_path), 2);
    ck_assert_ptr_nonnull(strstr(err, "shape"));
}
END_TEST

START_TEST(test_rerun_resumes_at_the_right_step)
{
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s",
                             "train.max_steps=12"), 0);
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s",
                             "train.max_steps=20"), 0);
    ck_assert_ptr_nonnull(strstr(err, "resumed from"));
    ck_assert_ptr_nonnull(strstr(err, "model.ckpt-12.h5 at step 12"));
    ck_assert_ptr_nonnull(strstr(out, "trained steps 12..20"));
    /* at the limit already: nothing to do, still success */
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s",
                             "train.max_steps=20"), 0);
}
END_TEST

/* argv (24 slots) of keel train cfg_path into checkpoint.dir = tu_dir/dir
 * (the setting written into set_dir, 4200 bytes) with the -s settings sets
 * (NULL-ended, at most 8). */
static void
train_argv(char *argv[], char *set_dir, const char *dir,
           const char *const sets[])
{
    int n = 0;
    TU_SNPRINTF(set_dir, 4200, "checkpoint.dir=%s/%s", tu_dir, dir);
    argv[n++] = (char *)tu_build_path("keel");
    argv[n++] = "train";
    argv[n++] = (char *)cfg_path;
    argv[n++] = "-s";
    argv[n++] = set_dir;
    for (int i = 0; sets[i] != NULL; i++) {
        ck_assert_int_lt(i, 8);
        argv[n++] = "-s";
        argv[n++] = (char *)sets[i];
    }
    argv[n] = NULL;
}

/* keel train (train_argv) run to its end: its exit status. */
static int
train_into(const char *dir, const char *const sets[])
{
    char set_dir[4200], *argv[24];
    train_argv(argv, set_dir, dir, sets);
    return tu_run(argv, NULL, 60000, out, sizeof out, err, sizeof err);
}

/* Kill-and-resume gives the bits of a run without a stop: ref_sets train
 * into ref; run_sets into dir, SIGKILLed at the first line holding each of
 * kills (NULL-ended) in turn; resume_sets finish dir. Checkpoint ckpt (a
 * file name) of both runs is identical. */
static void
check_kill_and_resume(const char *const ref_sets[],
                      const char *const run_sets[],
                      const char *const resume_sets[], const char *dir,
                      const char *const kills[], const char *ckpt)
{
    char set_dir[4200], log[4200], ref_ckpt[4200], run_ckpt[4200];
    char line[256], *argv[24];
    int fd;
    pid_t pid;
    ck_assert_int_eq(train_into("ref", ref_sets), 0);
    train_argv(argv, set_dir, dir, run_sets);
    TU_SNPRINTF(log, sizeof log, "%s/%s.log", tu_dir, dir);
    for (int k = 0; kills[k] != NULL; k++) {
        pid = tu_spawn_pipe(argv, NULL, log, &fd);
        ck_assert_msg(tu_wait_for_line(fd, kills[k], 60000, line,
                                       sizeof line),
                      "no '%s' line from keel train", kills[k]);
        kill(pid, SIGKILL);
        ck_assert_int_eq(tu_wait(pid, 10000), 128 + SIGKILL);
        close(fd);
    }
    ck_assert_int_eq(train_into(dir, resume_sets), 0);
    ck_assert_ptr_nonnull(strstr(err, "resumed from"));
    TU_SNPRINTF(ref_ckpt, sizeof ref_ckpt, "%s/ref/%s", tu_dir, ckpt);
    TU_SNPRINTF(run_ckpt, sizeof run_ckpt, "%s/%s/%s", tu_dir, dir, ckpt);
    ck_assert_int_eq(TU_KEEL(60000, "ckpt", "diff", ref_ckpt, run_ckpt), 0);
}

START_TEST(test_sigkill_and_resume_is_bitwise_identical)
{
    /* 300 steps with a checkpoint every 5: a killed run is always far from
     * its end when the SIGKILL lands (each save is an fsync or four).
     * Killed mid-run, then restarted and killed again at its first step. */
    static const char *const sets[] = { "train.max_steps=300", NULL };
    static const char *const kills[] = { "step 13 ", "step ", NULL };
    check_kill_and_resume(sets, sets, sets, "killed", kills,
                          "model.ckpt-300.h5");
}
END_TEST

START_TEST(test_kfac_sigkill_and_resume_is_bitwise_identical)
{
    /* K-FAC's factors, inverses (every 3 steps: checkpoints every 5 land
     * between inversions), velocities and preconditioned velocities (16
     * examples, fewer than the first layer's 785 x 32 pays for: its update
     * continues from them between inversions) restore bit for bit; its
     * checkpoint evaluates; its keys belong to optimizer.name = kfac only */
    static const char *const sets[] = { "train.max_steps=60",
                                        "train.batch_size=16",
                                        "optimizer.name=kfac",
                                        "kfac.invert_every=3", NULL };
    static const char *const kills[] = { "step 13 ", NULL };
    check_kill_and_resume(sets, sets, sets, "killed", kills,
                          "model.ckpt-60.h5");
    ck_assert_int_eq(TU_KEEL(60000, "eval", tu_path("killed")), 0);
    ck_assert_ptr_nonnull(strstr(out, "accuracy"));
    ck_assert_int_eq(TU_KEEL(20000, "train", tu_path("job.ini"), "-s",
                             "kfac.damping=0.1"), 2);
    ck_assert_msg(strstr(err, "kfac.damping") != NULL, "%s", err);
    ck_assert_ptr_nonnull(strstr(err, "optimizer.name = kfac"));
}
END_TEST

START_TEST(test_thread_counts_and_resume_give_identical_bits)
{
    /* batches of 600 are three pieces of 200: the reference runs on one
     * thread; the other run trains on 3 model threads, is SIGKILLed, and
     * resumes on 2. The last checkpoints are identical. */
    static const char *const ref[] = { "train.max_steps=60",
                                       "train.batch_size=600", NULL };
    static const char *const run[] = { "train.max_steps=60",
                                       "train.batch_size=600",
                                       "train.model_threads=3", NULL };
    static const char *const resume[] = { "train.max_steps=60",
                                          "train.batch_size=600",
                                          "train.model_threads=2", NULL };
    static const char *const kills[] = { "step 13 ", NULL };
    check_kill_and_resume(ref, run, resume, "mt", kills, "model.ckpt-60.h5");
}
END_TEST

START_TEST(test_no_periodic_saves_still_saves_at_start_and_end)
{
    char set_dir[4200];
    TU_SNPRINTF(set_dir, sizeof set_dir, "checkpoint.dir=%s/ends",
                     tu_dir);
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s", set_dir, "-s",
                             "checkpoint.save_steps=0", "-s",
                             "checkpoint.save_secs=0", "-s",
                             "train.max_steps=7"), 0);
    ck_assert_int_ge(tu_file_size(tu_path("ends/model.ckpt-0.h5")), 1);
    ck_assert_int_ge(tu_file_size(tu_path("ends/model.ckpt-7.h5")), 1);
    ck_assert_int_lt(tu_file_size(tu_path("ends/model.ckpt-5.h5")), 0);
}
END_TEST

/* A learning rate that jumps to 1e6 after step 10 makes the loss NaN a
 * few steps later: keel train stops with exit 1 and a message naming the
 * step; the checkpoints saved before stay intact and the newest verifies
 * (no checkpoint of the diverged model is written). */
START_TEST(test_nan_loss_stops_naming_the_step_and_keeps_the_last_good)
{
    char set_dir[4200], latest[4300], *state;
    long nan_step = -1;
    const char *p;
    TU_SNPRINTF(set_dir, sizeof set_dir, "checkpoint.dir=%s/nan",
                     tu_dir);
    int rc = TU_KEEL(60000, "train", cfg_path, "-s", set_dir, "-s",
                     "optimizer.name=sgd", "-s",
                     "optimizer.schedule=piecewise", "-s",
                     "optimizer.boundaries=10", "-s",
                     "optimizer.values=0.01,1000000");
    ck_assert_msg(rc == 1, "exit %d: %s", rc, tu_tail(err, 2000));
    p = strstr(err, "NaN loss during training (global step ");
    ck_assert_msg(p != NULL, "%s", tu_tail(err, 2000));
    ck_assert_int_eq(sscanf(p, "NaN loss during training (global step %ld",
                            &nan_step), 1);
    ck_assert_int_gt(nan_step, 10);
    ck_assert_int_lt(nan_step, 40);
    /* the step-10 checkpoint (lr 0.01 up to there) is intact */
    ck_assert_int_eq(TU_KEEL(60000, "ckpt", "verify",
                             tu_path("nan/model.ckpt-10.h5")), 0);
    /* the newest listed checkpoint predates the NaN and verifies */
    state = tu_read_file(tu_path("nan/checkpoint"), NULL);
    p = strstr(state, "model_checkpoint_path: \"");
    ck_assert_ptr_nonnull(p);
    {
        long step = -1;
        const char *dash = strstr(p, "model.ckpt-");
        ck_assert_ptr_nonnull(dash);
        ck_assert_int_eq(sscanf(dash, "model.ckpt-%ld", &step), 1);
        ck_assert_int_lt(step, nan_step);
        TU_SNPRINTF(latest, sizeof latest, "%s/nan/model.ckpt-%ld.h5",
                         tu_dir, step);
    }
    free(state);
    ck_assert_int_eq(TU_KEEL(60000, "ckpt", "verify", latest), 0);
}
END_TEST

START_TEST(test_bad_configs_exit_2_with_one_message)
{
    const char *bad = tu_path("bad.ini");
    char text[512];
    /* typo'd key */
    tu_write_file(bad, "[train]\nmax_stpes = 3\n", 22);
    ck_assert_int_eq(TU_KEEL(20000, "train", bad), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: "));
    ck_assert_ptr_nonnull(strstr(err, "bad.ini:2"));
    ck_assert_ptr_nonnull(strstr(err, "max_stpes"));
    ck_assert_ptr_null(strchr(strchr(err, '\n') + 1, '\n'));   /* one line */
    /* wrong model name */
    ck_assert_int_eq(TU_KEEL(20000, "train", cfg_path, "-s",
                             "model.type=resnet"), 2);
    ck_assert_ptr_nonnull(strstr(err, "softmax, mlp, cnn"));
    /* missing data file */
    TU_SNPRINTF(text, sizeof text, "[data]\ndir = %s/nodata\n[train]\n"
             "max_steps = 3\n[checkpoint]\ndir = %s/x\n", tu_dir, tu_dir);
    tu_write_file(bad, text, strlen(text));
    ck_assert_int_eq(TU_KEEL(20000, "train", bad), 2);
    ck_assert_ptr_nonnull(strstr(err, "nodata/train-images-idx3-ubyte"));
    /* eval with nothing trained yet is a runtime failure, not usage */
    ck_assert_int_eq(TU_KEEL(20000, "eval", cfg_path), 1);
    ck_assert_ptr_nonnull(strstr(err, "no valid checkpoint"));
}
END_TEST

static const char *
write_ini(const char *name, const char *text)
{
    static char path[4][4200];
    static int k;
    char *p = path[k++ % 4];
    TU_SNPRINTF(p, sizeof path[0], "%s", tu_path(name));
    tu_write_file(p, text, strlen(text));
    return p;
}

/* train.strategy = mirrored: 2 replicas of the CNN in one process give the
 * bits of one_device (their 16-example pieces add along the same tree);
 * the checkpoint evaluates with keel eval, resumes under one_device and
 * under parameter_server (keel launch: 1 ps, the chief). The MLP's
 * mirrored run is reproducible; multi_worker_mirrored is refused with
 * exit 2. */
START_TEST(test_mirrored_matches_one_device_and_restores_anywhere)
{
    char text[2048];
    const char *cnn;
    char *log;
    TU_SNPRINTF(text, sizeof text,
                "[model]\ntype = cnn\n[data]\ndir = %s\n"
                "[optimizer]\nname = adam\nlearning_rate = 0.01\n"
                "[train]\nbatch_size = 32\nseed = 5\nmax_steps = 6\n"
                "threads = 1\n[checkpoint]\ndir = %s/one\nsave_steps = 3\n"
                "[hooks]\nprogress = off\n", tu_dir, tu_dir);
    cnn = write_ini("cnn.ini", text);
    ck_assert_int_eq(TU_KEEL(60000, "train", cnn), 0);
    TU_SNPRINTF(text, sizeof text, "checkpoint.dir=%s/mir", tu_dir);
    ck_assert_int_eq(TU_KEEL(60000, "train", cnn, "-s", text, "-s",
                             "train.strategy=mirrored"), 0);
    ck_assert_int_eq(TU_KEEL(60000, "ckpt", "diff",
                             tu_path("one/model.ckpt-6.h5"),
                             tu_path("mir/model.ckpt-6.h5")), 0);
    ck_assert_int_eq(TU_KEEL(60000, "eval", tu_path("mir")), 0);
    ck_assert_ptr_nonnull(strstr(out, "step 6: test loss"));
    /* one_device resumes the mirrored checkpoint */
    ck_assert_int_eq(TU_KEEL(60000, "train", cnn, "-s", text, "-s",
                             "train.max_steps=8"), 0);
    ck_assert_ptr_nonnull(strstr(err, "resumed from"));
    ck_assert_ptr_nonnull(strstr(err, "mir/model.ckpt-6.h5"));
    /* parameter_server (the chief and 1 ps) resumes it too */
    ck_assert_int_eq(TU_KEEL(90000, "launch", cnn, "--ps", "1", "--workers",
                             "0", "-s", text, "-s", "train.max_steps=10", "-s",
                             "train.strategy=parameter_server"), 0);
    log = tu_read_file(tu_path("mir/logs/chief.log"), NULL);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "mir/model.ckpt-8.h5") != NULL, "%s",
                  tu_tail(log, 2000));
    free(log);
    ck_assert_int_ge(tu_file_size(tu_path("mir/model.ckpt-10.h5")), 1);
    /* the MLP: mirrored reruns give the same bits */
    TU_SNPRINTF(text, sizeof text, "checkpoint.dir=%s/m1", tu_dir);
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s", text, "-s",
                             "train.max_steps=10", "-s",
                             "train.strategy=mirrored", "-s",
                             "train.replicas=4"), 0);
    TU_SNPRINTF(text, sizeof text, "checkpoint.dir=%s/m2", tu_dir);
    ck_assert_int_eq(TU_KEEL(60000, "train", cfg_path, "-s", text, "-s",
                             "train.max_steps=10", "-s",
                             "train.strategy=mirrored", "-s",
                             "train.replicas=4"), 0);
    ck_assert_int_eq(TU_KEEL(60000, "ckpt", "diff",
                             tu_path("m1/model.ckpt-10.h5"),
                             tu_path("m2/model.ckpt-10.h5")), 0);
    /* strategies that do not fit exit 2 with one message (with MPI: a
     * leaf count that does not fit; without: MPI missing) */
    ck_assert_int_eq(TU_KEEL(20000, "train", cfg_path, "-s",
                             "train.strategy=" "multi_worker_mirrored", "-s",
                             "train.leaves=3"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: "));
#ifdef HAVE_MPI
    ck_assert_msg(strstr(err, "train.leaves = 3") != NULL, "%s", err);
#else
    ck_assert_msg(strstr(err, "multi_worker_mirrored") != NULL, "%s", err);
#endif
    ck_assert_int_eq(TU_KEEL(20000, "train", cfg_path, "-s",
                             "algorithm.name=hogwild", "-s",
                             "train.strategy=mirrored"), 2);
    ck_assert_ptr_nonnull(strstr(err, "algorithm.name = hogwild"));
    ck_assert_int_eq(TU_KEEL(20000, "train", cfg_path, "-s",
                             "train.strategy=mirrored", "-s",
                             "train.replicas=3"), 2);
    ck_assert_ptr_nonnull(strstr(err, "train.replicas = 3"));
}
END_TEST

/* A final checkpoint the file system refuses fails the run: resumed at
 * step 5 (so no save is due before the end), keel train runs with a file
 * size limit below a checkpoint's size (SIGXFSZ ignored), which the saver
 * refuses. Exit 1, a 'keel:' line naming the step, the checkpoint file
 * and the cause; the state file still names step 5. */
START_TEST(test_final_checkpoint_that_cannot_be_written_fails_the_run)
{
    const char *const first[] = { "train.max_steps=5",
                                  "checkpoint.save_secs=0", NULL };
    const char *const second[] = { "train.max_steps=9",
                                   "checkpoint.save_secs=0", NULL };
    struct rlimit old, lim;
    char *state;
    off_t size;
    int rc;

    ck_assert_int_eq(train_into("full", first), 0);
    size = tu_file_size(tu_path("full/model.ckpt-5.h5"));
    ck_assert_int_gt(size, 8192);
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)size / 2;
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    rc = train_into("full", second);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_DFL);
    ck_assert_msg(rc == 1, "exit %d: %s", rc, tu_tail(err, 2000));
    ck_assert_msg(strstr(err, "keel: train: ") != NULL
                  && strstr(err, "final checkpoint at step 9 not saved")
                  != NULL && strstr(err, "model.ckpt-9.h5") != NULL
                  && strstr(err, "file size limit") != NULL, "%s",
                  tu_tail(err, 2000));
    ck_assert_ptr_null(strstr(out, "trained steps"));
    ck_assert_int_lt(tu_file_size(tu_path("full/model.ckpt-9.h5")), 0);
    state = tu_read_file(tu_path("full/checkpoint"), NULL);
    ck_assert_msg(strstr(state, "model_checkpoint_path: \"model.ckpt-5.h5\"")
                  != NULL, "%s", state);
    free(state);
}
END_TEST

/* A checkpoint directory whose run does not fit the model (here a wider
 * hidden layer) is an error, exit 2, naming the file and the variable and
 * pointing to the warm start; nothing is written. The warm start from that
 * directory into a new one trains; the old run is left as it was. */
START_TEST(test_misfit_is_refused_and_warm_start_starts_a_new_run)
{
    const char *const first[] = { "train.max_steps=5", NULL };
    const char *const wider[] = { "train.max_steps=5", "model.hidden=48",
                                  NULL };
    char warm[4200], *before, *after;
    size_t nb, na;
    int rc;

    ck_assert_int_eq(train_into("base", first), 0);
    before = tu_read_file(tu_path("base/checkpoint"), &nb);
    rc = train_into("base", wider);
    ck_assert_msg(rc == 2, "exit %d: %s", rc, tu_tail(err, 2000));
    ck_assert_msg(strstr(err, "keel: train: resume from ") != NULL
                  && strstr(err, "model.ckpt-5.h5") != NULL
                  && strstr(err, "shape") != NULL
                  && strstr(err, "warm_start_from") != NULL, "%s",
                  tu_tail(err, 2000));
    ck_assert_ptr_null(strstr(err, "initializing"));
    after = tu_read_file(tu_path("base/checkpoint"), &na);
    ck_assert(na == nb && memcmp(before, after, nb) == 0);
    free(after);
    free(before);
    /* the same model again warm-starts by name into a new directory */
    TU_SNPRINTF(warm, sizeof warm, "checkpoint.warm_start_from=%s/base",
                tu_dir);
    {
        const char *const sets[] = { "train.max_steps=3", warm, NULL };
        rc = train_into("warm", sets);
    }
    ck_assert_msg(rc == 0, "exit %d: %s", rc, tu_tail(err, 2000));
    ck_assert_msg(strstr(err, "warm start from ") != NULL
                  && strstr(err, "model.ckpt-5.h5") != NULL, "%s",
                  tu_tail(err, 2000));
    ck_assert_ptr_nonnull(strstr(out, "trained steps 0..3"));
    ck_assert_int_ge(tu_file_size(tu_path("warm/model.ckpt-3.h5")), 1);
    /* its own directory as the source is refused */
    TU_SNPRINTF(warm, sizeof warm, "checkpoint.warm_start_from=%s/fresh",
                tu_dir);
    ck_assert_int_eq(mkdir(tu_path("fresh"), 0700), 0);
    {
        const char *const sets[] = { "train.max_steps=3", warm, NULL };
        rc = train_into("fresh", sets);
    }
    ck_assert_msg(rc == 2 && strstr(err, "own checkpoint directory") != NULL,
                  "exit %d: %s", rc, tu_tail(err, 2000));
}
END_TEST


/* ---- the user's data: HDF5 tabular sets ---- */

static uint64_t
rng_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static float
rng_unit(uint64_t *x)          /* uniform in [-1, 1) */
{
    return (float)((double)(rng_next(x) >> 11) / 4503599627370496.0 - 1.0);
}

/* An HDF5 set at path of n rows of d float32 features uniform in [-1, 1)
 * and labels argmax(x W) of a fixed random linear model W [d, classes]
 * (seeded: the train and test sets share it), written 4096 rows at a
 * time (so a set larger than memory is written in bounded memory). */
static void
write_linear_h5(const char *path, size_t n, size_t d, int classes,
                uint64_t data_seed)
{
    const size_t chunk = 4096;
    uint64_t ws = 12345, xs = data_seed;
    float *w = malloc(d * (size_t)classes * sizeof *w);
    float *x = malloc(chunk * d * sizeof *x);
    int32_t *y = malloc(chunk * sizeof *y);
    hsize_t xd[2] = { n, d }, yd = n;
    hid_t f, sx, sy, dx, dy;
    ck_assert(w != NULL && x != NULL && y != NULL);
    for (size_t i = 0; i < d * (size_t)classes; i++)
        w[i] = rng_unit(&ws);
    f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    sx = H5Screate_simple(2, xd, NULL);
    sy = H5Screate_simple(1, &yd, NULL);
    dx = H5Dcreate2(f, "x", H5T_IEEE_F32LE, sx, H5P_DEFAULT, H5P_DEFAULT,
                    H5P_DEFAULT);
    dy = H5Dcreate2(f, "y", H5T_STD_I32LE, sy, H5P_DEFAULT, H5P_DEFAULT,
                    H5P_DEFAULT);
    ck_assert(dx >= 0 && dy >= 0);
    for (size_t r0 = 0; r0 < n; r0 += chunk) {
        size_t rows = n - r0 < chunk ? n - r0 : chunk;
        hsize_t start[2] = { r0, 0 }, cnt[2] = { rows, d };
        hid_t mx = H5Screate_simple(2, cnt, NULL), my;
        for (size_t i = 0; i < rows; i++) {
            int best = 0;
            float bestv = -1e30f;
            for (size_t j = 0; j < d; j++)
                x[i * d + j] = rng_unit(&xs);
            for (int k = 0; k < classes; k++) {
                float v = 0;
                for (size_t j = 0; j < d; j++)
                    v += x[i * d + j] * w[j * (size_t)classes + (size_t)k];
                if (v > bestv) {
                    bestv = v;
                    best = k;
                }
            }
            y[i] = best;
        }
        ck_assert_int_ge(H5Sselect_hyperslab(sx, H5S_SELECT_SET, start, NULL,
                                             cnt, NULL), 0);
        ck_assert_int_ge(H5Dwrite(dx, H5T_NATIVE_FLOAT, mx, sx, H5P_DEFAULT,
                                  x), 0);
        my = H5Screate_simple(1, cnt, NULL);
        ck_assert_int_ge(H5Sselect_hyperslab(sy, H5S_SELECT_SET, start, NULL,
                                             cnt, NULL), 0);
        ck_assert_int_ge(H5Dwrite(dy, H5T_NATIVE_INT32, my, sy, H5P_DEFAULT,
                                  y), 0);
        H5Sclose(mx);
        H5Sclose(my);
    }
    H5Dclose(dx);
    H5Dclose(dy);
    H5Sclose(sx);
    H5Sclose(sy);
    H5Fclose(f);
    free(w);
    free(x);
    free(y);
}

/* job.ini for the HDF5 files train.h5 and test.h5 in tu_dir; returns its
 * path (cfg_path is set to it too). */
static const char *
tabular_job(const char *model, const char *extra)
{
    static char path[4200];
    char text[2048];
    TU_SNPRINTF(text, sizeof text,
                "[model]\ntype = %s\n%s"
                "[data]\nformat = hdf5\ndir = %s\ntrain_file = train.h5\n"
                "test_file = test.h5\n"
                "[optimizer]\nname = adam\nlearning_rate = 0.02\n"
                "[train]\nbatch_size = 64\nseed = 5\nmax_steps = 300\n"
                "threads = 1\n"
                "[checkpoint]\ndir = %s/run\nsave_steps = 5\n"
                "[hooks]\nlog_every_steps = 1\nsummary_every_steps = 100\n"
                "progress = off\n%s", model,
                strcmp(model, "mlp") == 0 ? "hidden = 64\n" : "", tu_dir,
                tu_dir, extra);
    TU_SNPRINTF(path, sizeof path, "%s", tu_path("tab.ini"));
    tu_write_file(path, text, strlen(text));
    cfg_path = path;
    return path;
}

/* keel train on a tabular set with 5 classes (counted from the labels)
 * and with 100 (set): both learn the linear model well above chance,
 * evaluate and export with the model's class count; a cnn refuses
 * tabular data; a label beyond model.classes names file, row, value. */
START_TEST(test_tabular_sets_of_5_and_100_classes_learn)
{
    static const struct { int classes; size_t n; const char *model;
                          const char *extra; double min_acc; } cases[] = {
        { 5, 4000, "softmax", "", 0.8 },
        { 100, 12000, "mlp", "[model]\nclasses = 100\n", 0.1 },
    };
    for (size_t c = 0; c < 2; c++) {
        const char *ini;
        char dir[4200];
        double acc;
        write_linear_h5(tu_path("train.h5"), cases[c].n, 16,
                        cases[c].classes, 1);
        write_linear_h5(tu_path("test.h5"), 1000, 16, cases[c].classes, 2);
        ini = tabular_job(cases[c].model, cases[c].extra);
        TU_SNPRINTF(dir, sizeof dir, "checkpoint.dir=%s/run%zu", tu_dir, c);
        ck_assert_msg(TU_KEEL(120000, "train", ini, "-s", dir) == 0, "%s",
                      tu_tail(err, 2000));
        if (c == 0)
            ck_assert_msg(strstr(err, "model.classes = 5 from the training "
                                 "set's labels (largest 4)") != NULL, "%s",
                          tu_tail(err, 2000));
        ck_assert_int_eq(TU_KEEL(60000, "eval", ini, "-s", dir, "--json"),
                         0);
        acc = tu_json_number(out, "accuracy");
        ck_assert_msg(acc > cases[c].min_acc, "%d classes: accuracy %g "
                      "(chance %g)", cases[c].classes, acc,
                      1.0 / cases[c].classes);
    }
    /* the architecture records 100 classes: keel eval DIR rebuilds it */
    ck_assert_int_eq(TU_KEEL(60000, "eval", tu_path("run1")), 0);
    ck_assert_ptr_nonnull(strstr(out, "accuracy"));
    /* a cnn needs images */
    tabular_job("cnn", "");
    ck_assert_int_eq(TU_KEEL(20000, "train", cfg_path), 2);
    ck_assert_msg(strstr(err, "model.type = cnn needs images") != NULL &&
                  strstr(err, "tabular") != NULL, "%s", err);
    /* labels 0..99 with model.classes = 50 */
    tabular_job("mlp", "");
    ck_assert_int_eq(TU_KEEL(20000, "train", cfg_path, "-s",
                             "model.classes=50"), 1);
    ck_assert_msg(strstr(err, "train.h5: dataset 'y' row ") != NULL &&
                  strstr(err, "outside [0, 50)") != NULL, "%s", err);
}
END_TEST

/* A streamed set resumes bit for bit after SIGKILL, and it gives the
 * bits of the same set read into memory (the reference run). */
START_TEST(test_streamed_set_resumes_bitwise_and_matches_in_memory)
{
    static const char *const ref[] = { "data.stream=off",
                                       "data.shuffle_block=100", NULL };
    static const char *const run[] = { "data.stream=on",
                                       "data.shuffle_block=100", NULL };
    static const char *const kills[] = { "step 13 ", NULL };
    char *log;
    write_linear_h5(tu_path("train.h5"), 2000, 8, 5, 1);
    write_linear_h5(tu_path("test.h5"), 200, 8, 5, 2);
    tabular_job("mlp", "");
    check_kill_and_resume(ref, run, run, "killed", kills,
                          "model.ckpt-300.h5");
    log = tu_read_file(tu_path("killed.log"), NULL);
    ck_assert_msg(strstr(log, "streamed in blocks of 100 rows") != NULL,
                  "%s", tu_tail(log, 2000));
    free(log);
}
END_TEST

/* A set larger than the process may map trains streamed (data.stream =
 * auto) and fails read into memory with an error that says so. Not under
 * the sanitizers, whose shadow memory needs more address space. */
START_TEST(test_set_larger_than_memory_trains_streamed)
{
    const long limit_mb = 520;  /* keel train's peak (OpenBLAS's buffer
                                 * included) and some room */
    char sh[256], dir[4200];
    char *argv[16];
    int rc, n = 0;
    if (getenv("ASAN_OPTIONS") != NULL)
        return;
    /* 576 MiB of features: more than the address-space limit */
    write_linear_h5(tu_path("train.h5"), 294912, 512, 5, 1);
    write_linear_h5(tu_path("test.h5"), 500, 512, 5, 2);
    ck_assert_int_gt(tu_file_size(tu_path("train.h5")), limit_mb << 20);
    tabular_job("softmax", "");
    TU_SNPRINTF(sh, sizeof sh, "ulimit -v %ld && exec \"$0\" \"$@\"",
                limit_mb << 10);
    TU_SNPRINTF(dir, sizeof dir, "checkpoint.dir=%s/big", tu_dir);
    argv[n++] = "/bin/sh";
    argv[n++] = "-c";
    argv[n++] = sh;
    argv[n++] = (char *)tu_build_path("keel");
    argv[n++] = "train";
    argv[n++] = (char *)cfg_path;
    argv[n++] = "-s";
    argv[n++] = dir;
    argv[n++] = "-s";
    argv[n++] = "train.max_steps=40";
    argv[n++] = "-s";
    argv[n++] = "data.memory_budget_mb=64";
    argv[n] = NULL;
    rc = tu_run(argv, NULL, 120000, out, sizeof out, err, sizeof err);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, tu_tail(err, 2000));
    ck_assert_ptr_nonnull(strstr(err, "streamed in blocks of 4096 rows"));
    ck_assert_int_ge(tu_file_size(tu_path("big/model.ckpt-40.h5")), 1);
    /* read into memory it does not fit */
    argv[n++] = "-s";
    argv[n++] = "data.stream=off";
    argv[n] = NULL;
    rc = tu_run(argv, NULL, 120000, out, sizeof out, err, sizeof err);
    ck_assert_msg(rc == 1 || rc == 2, "exit %d: %s", rc, tu_tail(err, 2000));
    ck_assert_msg(strstr(err, "data.stream") != NULL, "%s",
                  tu_tail(err, 2000));
}
END_TEST

static int
str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every entry of tu_dir/dir with its size and an FNV-1a hash of its bytes,
 * sorted by name, one per line: what "no checkpoint was written" compares.
 * With before (an earlier snapshot), an event file it does not list is
 * left out: the summary hook opens its event file before the restore.
 * Caller frees. */
static char *
dir_snapshot(const char *dir, const char *before)
{
    char path[4200], *names[64], *snap;
    size_t n = 0, len = 0, cap = 64 * 300;
    struct dirent *e;
    DIR *d;
    TU_SNPRINTF(path, sizeof path, "%s/%s", tu_dir, dir);
    d = opendir(path);
    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        ck_assert_int_lt(n, 64);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, str_cmp);
    snap = calloc(1, cap);
    ck_assert_ptr_nonnull(snap);
    for (size_t i = 0; i < n; i++) {
        size_t size = 0;
        uint64_t h = 1469598103934665603ULL;
        char *data;
        TU_SNPRINTF(path, sizeof path, "%s/%s/%s", tu_dir, dir, names[i]);
        data = tu_read_file(path, &size);
        for (size_t k = 0; data != NULL && k < size; k++)
            h = (h ^ (unsigned char)data[k]) * 1099511628211ULL;
        free(data);
        len += (size_t)snprintf(snap + len, cap - len, "%s %zu %016llx\n",
                                names[i], size, (unsigned long long)h);
        ck_assert_int_lt(len, cap);
        free(names[i]);
    }
    return snap;
}

/* A checkpoint directory in which no checkpoint opens is no empty one:
 * keel train exits 1 naming the directory, the files and how to go on,
 * and changes nothing there (no fresh run over the old one). */
START_TEST(test_all_corrupt_checkpoints_are_refused_not_overwritten)
{
    const char *const sets[] = { "train.max_steps=5", NULL };
    char path[4200], *before, *after;
    int rc, n = 0;
    struct dirent *e;
    DIR *d;

    ck_assert_int_eq(train_into("dead", sets), 0);
    TU_SNPRINTF(path, sizeof path, "%s/dead", tu_dir);
    d = opendir(path);
    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 3 && strcmp(e->d_name + len - 3, ".h5") == 0) {
            TU_SNPRINTF(path, sizeof path, "%s/dead/%s", tu_dir, e->d_name);
            tu_truncate(path, tu_file_size(path) / 2);
            n++;
        }
    }
    closedir(d);
    ck_assert_int_ge(n, 2);
    before = dir_snapshot("dead", NULL);
    rc = train_into("dead", sets);
    ck_assert_msg(rc == 1, "exit %d: %s", rc, tu_tail(err, 2000));
    TU_SNPRINTF(path, sizeof path, "%s/dead", tu_dir);
    ck_assert_msg(strstr(err, "keel: train: resume from ") != NULL
                  && strstr(err, path) != NULL
                  && strstr(err, "model.ckpt-5.h5") != NULL
                  && strstr(err, "none restores") != NULL
                  && strstr(err, "move") != NULL
                  && strstr(err, "warm_start_from") != NULL, "%s",
                  tu_tail(err, 2000));
    ck_assert_ptr_null(strstr(err, "initializing"));
    ck_assert_ptr_null(strstr(out, "trained steps"));
    after = dir_snapshot("dead", before);
    ck_assert_str_eq(before, after);
    free(after);
    free(before);
}
END_TEST

/* A model that only adds variables to a run (a layer more, the old
 * layers' shapes unchanged) does not resume it: exit 2 naming the new
 * variable and the warm start; the old directory is left byte for byte.
 * keel train --warm-start=DIR (= -s checkpoint.warm_start_from=DIR) then
 * starts the new model's run in a new directory. */
START_TEST(test_added_layer_is_refused_and_warm_start_flag_starts_anew)
{
    const char *const first[] = { "train.max_steps=5", NULL };
    const char *const deeper[] = { "train.max_steps=3", "model.hidden=32,10",
                                   NULL };
    char set_dir[4200], flag[4200], *argv[24], *before, *after;
    int rc, n;

    ck_assert_int_eq(train_into("old", first), 0);
    before = dir_snapshot("old", NULL);
    rc = train_into("old", deeper);
    ck_assert_msg(rc == 2, "exit %d: %s", rc, tu_tail(err, 2000));
    ck_assert_msg(strstr(err, "keel: train: resume from ") != NULL
                  && strstr(err, "model.ckpt-5.h5") != NULL
                  && strstr(err, "dense_3") != NULL
                  && strstr(err, "warm_start_from") != NULL, "%s",
                  tu_tail(err, 2000));
    ck_assert_ptr_null(strstr(err, "initializing"));
    after = dir_snapshot("old", before);
    ck_assert_str_eq(before, after);
    free(after);

    train_argv(argv, set_dir, "new", deeper);
    for (n = 0; argv[n] != NULL; n++)
        ;
    TU_SNPRINTF(flag, sizeof flag, "--warm-start=%s/old", tu_dir);
    argv[n++] = flag;
    argv[n] = NULL;
    rc = tu_run(argv, NULL, 60000, out, sizeof out, err, sizeof err);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, tu_tail(err, 2000));
    ck_assert_msg(strstr(err, "warm start from ") != NULL
                  && strstr(err, "model.ckpt-5.h5") != NULL, "%s",
                  tu_tail(err, 2000));
    ck_assert_ptr_nonnull(strstr(out, "trained steps 0..3"));
    ck_assert_int_ge(tu_file_size(tu_path("new/model.ckpt-3.h5")), 1);
    after = dir_snapshot("old", before);
    ck_assert_str_eq(before, after);
    free(after);
    free(before);
}
END_TEST

static Suite *
train_cli_suite(void)
{
    Suite *s = suite_create("it_train");
    tu_tcase(s, "train", 120, setup, tu_teardown, TU_TESTS(
        test_train_then_eval_learns_and_reports_json,
        test_eval_dir_rebuilds_a_model_changed_by_overrides,
        test_rerun_resumes_at_the_right_step,
        test_sigkill_and_resume_is_bitwise_identical,
        test_thread_counts_and_resume_give_identical_bits,
        test_kfac_sigkill_and_resume_is_bitwise_identical,
        test_no_periodic_saves_still_saves_at_start_and_end,
        test_bad_configs_exit_2_with_one_message,
        test_mirrored_matches_one_device_and_restores_anywhere,
        test_nan_loss_stops_naming_the_step_and_keeps_the_last_good,
        test_final_checkpoint_that_cannot_be_written_fails_the_run,
        test_misfit_is_refused_and_warm_start_starts_a_new_run,
        test_all_corrupt_checkpoints_are_refused_not_overwritten,
        test_added_layer_is_refused_and_warm_start_flag_starts_anew));
    tu_tcase(s, "userdata", 300, tu_setup, tu_teardown, TU_TESTS(
        test_tabular_sets_of_5_and_100_classes_learn,
        test_streamed_set_resumes_bitwise_and_matches_in_memory,
        test_set_larger_than_memory_trains_streamed));
    return s;
}

KEEL_TEST_MAIN(train_cli_suite)
