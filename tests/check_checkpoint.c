/* check_checkpoint.c - the checkpoint module against real HDF5 files:
 * round trips, h5py compatibility (the documented snippet), corruption and
 * bad files, fallback, retention across restarts, injected I/O faults,
 * SIGKILL crash safety and the `keel ckpt` CLI. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hdf5.h>
#include <keel/keel.h>
#include "util.h"
#include "testutil.h"

static char out[65536], err[65536];

static int
long_mode(void)
{
    const char *e = getenv("KEEL_LONG");
    return e != NULL && strcmp(e, "1") == 0;
}

/* A store holding one rows x cols matrix (zeros) named name. */
static keel_vars *
matrix_store(const char *name, int64_t rows, int64_t cols)
{
    keel_vars *vs;
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, name, 2, (int64_t[]){ rows, cols },
                                      0, NULL), KEEL_OK);
    return vs;
}

/* A store with every shape kind, path-like names, slots and a local var;
 * values derived from seed. */
static keel_vars *
make_store(float seed, int with_data)
{
    static const struct { const char *name; int ndim; int64_t shape[4]; }
    spec[] = {
        { "global_scale", 0, { 1 } },
        { "dense/bias", 1, { 7 } },
        { "dense/kernel", 2, { 5, 7 } },
        { "conv1/kernel", 4, { 3, 3, 2, 4 } },
        { "deep/er/still/w", 3, { 2, 3, 4 } },
    };
    keel_vars *vs;
    keel_var *v;
    keel_tensor *sl;
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        keel_tensor *t;
        ck_assert_int_eq(keel_vars_create(vs, spec[i].name, spec[i].ndim,
                                          spec[i].shape, KEEL_VAR_TRAINABLE,
                                          &v), KEEL_OK);
        t = keel_var_tensor(v);
        for (size_t j = 0; with_data && j < t->count; j++)
            t->data[j] = seed + (float)i * 100.0f + (float)j * 0.25f;
        if (i >= 1) {
            ck_assert_int_eq(keel_var_add_slot(v, "m", &sl), KEEL_OK);
            for (size_t j = 0; with_data && j < sl->count; j++)
                sl->data[j] = -seed - (float)j;
        }
        if (i == 2) {
            ck_assert_int_eq(keel_var_add_slot(v, "v", &sl), KEEL_OK);
            for (size_t j = 0; with_data && j < sl->count; j++)
                sl->data[j] = seed * 0.5f + (float)j;
        }
    }
    ck_assert_int_eq(keel_vars_create(vs, "local/counter", 1,
                                      (int64_t[]){ 3 }, KEEL_VAR_LOCAL,
                                      &v), KEEL_OK);
    keel_var_tensor(v)->data[0] = 42;
    return vs;
}

/* Bitwise equality of every non-local variable and slot. */
static void
assert_stores_equal(keel_vars *a, keel_vars *b)
{
    for (size_t i = 0; i < keel_vars_count(a); i++) {
        keel_var *va = keel_vars_at(a, i), *vb;
        keel_tensor *ta, *tb, *sa;
        const char *sn;
        if (keel_var_flags(va) & KEEL_VAR_LOCAL)
            continue;
        vb = keel_vars_find(b, keel_var_name(va));
        ck_assert_ptr_nonnull(vb);
        ta = keel_var_tensor(va);
        tb = keel_var_tensor(vb);
        ck_assert(keel_shape_equal(ta->ndim, ta->shape, tb->ndim, tb->shape));
        ck_assert_msg(memcmp(ta->data, tb->data, keel_tensor_bytes(ta)) == 0,
                      "variable %s differs", keel_var_name(va));
        ck_assert_uint_eq(keel_var_slot_count(va), keel_var_slot_count(vb));
        for (size_t j = 0; (sa = keel_var_slot_at(va, j, &sn)) != NULL;
             j++) {
            keel_tensor *sb = keel_var_slot(vb, sn);
            ck_assert_ptr_nonnull(sb);
            ck_assert_msg(memcmp(sa->data, sb->data,
                                 keel_tensor_bytes(sa)) == 0,
                          "slot %s of %s differs", sn, keel_var_name(va));
        }
    }
    ck_assert_int_eq(keel_vars_global_step(a), keel_vars_global_step(b));
}

/* A saver config or restore options not filled by their init function are
 * refused, naming the struct; nothing is written or read. */
START_TEST(test_configs_without_their_init_are_refused_by_name)
{
    keel_saver_config cfg;
    keel_restore_config o;
    keel_saver *s = NULL;
    keel_vars *vs;
    memset(&cfg, 0, sizeof cfg);
    cfg.dir = tu_path("never");
    ck_assert_int_eq(keel_saver_new(&cfg, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "keel_saver_config_init()"));
    ck_assert_ptr_null(s);
    ck_assert_int_eq(access(tu_path("never"), F_OK), -1);
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    memset(&o, 0, sizeof o);
    ck_assert_int_eq(keel_ckpt_restore(tu_path("none.h5"), vs, &o, NULL),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "keel_restore_config has struct_size 0"));
    keel_vars_free(vs);
}
END_TEST

static keel_saver *
new_saver(const char *dir, int max_to_keep, int is_async)
{
    keel_saver_config cfg;
    keel_saver *s;
    keel_saver_config_init(&cfg);
    cfg.dir = dir;
    cfg.max_to_keep = max_to_keep;
    cfg.is_async = is_async;
    ck_assert_msg(keel_saver_new(&cfg, &s) == KEEL_OK, "%s",
                  keel_last_error());
    return s;
}

static void
save_step(keel_saver *s, keel_vars *vs, int64_t step, char *path,
          size_t size)
{
    keel_vars_set_global_step(vs, step);
    ck_assert_msg(keel_saver_save(s, vs, NULL, path, size) == KEEL_OK, "%s",
                  keel_last_error());
    ck_assert_msg(keel_saver_wait(s) == KEEL_OK, "%s", keel_last_error());
}

/* One checkpoint of vs at step in tu_dir, written by a saver (async when
 * is_async) made for it alone; its path into path (size bytes). */
static void
save_once(keel_vars *vs, int64_t step, int is_async, char *path, size_t size)
{
    keel_saver *s = new_saver(tu_dir, 5, is_async);
    save_step(s, vs, step, path, size);
    keel_saver_free(s);
}

/* ---- round trips -------------------------------------------------------- */

static void
roundtrip(int is_async)
{
    keel_vars *a = make_store(1.5f, 1), *b = make_store(0, 0);
    keel_saver *s = new_saver(tu_dir, 5, is_async);
    char path[4096], latest[4096];
    unsigned char blob1[300];
    keel_ckpt_blob blobs[2] = { { "data_iterator", blob1, sizeof blob1 },
                                { "rng", "", 0 } };
    keel_ckpt_meta meta = { sizeof meta, "[train]\nlr = 0.1\n",
                            "ps=2 workers=4", blobs, 2,
                            "{\"model\": \"mlp\"}", 0 };
    keel_restore_report rep;
    keel_ckpt_info *info;
    const void *bd;
    size_t bs;
    int64_t step;

    for (size_t i = 0; i < sizeof blob1; i++)
        blob1[i] = (unsigned char)(i * 7);
    keel_vars_set_global_step(a, 1234);
    {   /* a meta keel_ckpt_meta_init did not fill is refused, naming it */
        keel_ckpt_meta raw = meta;
        raw.struct_size = 0;
        ck_assert_int_eq(keel_saver_save(s, a, &raw, path, sizeof path),
                         KEEL_EINVAL);
        ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                     "keel_ckpt_meta_init"));
    }
    ck_assert_int_eq(keel_saver_save(s, a, &meta, path, sizeof path),
                     KEEL_OK);
    if (is_async) {
        /* The staging copy was taken: scribbling now must not matter. */
        keel_tensor *t = keel_var_tensor(keel_vars_find(a, "dense/kernel"));
        float keep = t->data[0];
        t->data[0] = 999.0f;
        blob1[0] = 77;
        ck_assert_int_eq(keel_saver_wait(s), KEEL_OK);
        t->data[0] = keep;
        blob1[0] = 0;
    }
    ck_assert_int_eq(keel_saver_last_step(s), 1234);
    ck_assert_ptr_nonnull(strstr(path, "model.ckpt-1234.h5"));
    ck_assert_int_eq(keel_ckpt_verify(path), KEEL_OK);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, latest, sizeof latest,
                                      &step), KEEL_OK);
    ck_assert_str_eq(latest, path);
    ck_assert_int_eq(step, 1234);

    ck_assert_msg(keel_ckpt_restore(path, b, NULL, &rep) == KEEL_OK, "%s",
                  keel_last_error());
    assert_stores_equal(a, b);
    ck_assert_uint_eq(rep.n_restored, 5);
    ck_assert_uint_eq(rep.n_missing, 0);
    ck_assert_uint_eq(rep.n_unexpected, 0);
    ck_assert_int_eq(rep.global_step, 1234);
    /* The local variable was neither saved nor touched. */
    ck_assert_float_eq(keel_var_tensor(keel_vars_find(b, "local/counter"))
                       ->data[0], 42.0f);

    ck_assert_int_eq(keel_ckpt_read_info(path, &info), KEEL_OK);
    ck_assert_int_eq(info->global_step, 1234);
    ck_assert_int_eq(info->format_version, KEEL_CKPT_FORMAT_VERSION);
    ck_assert_str_eq(info->keel_version, keel_version());
    ck_assert_str_eq(info->config_text, meta.config_text);
    ck_assert_str_eq(info->topology, meta.topology);
    ck_assert_str_eq(info->architecture, "{\"model\": \"mlp\"}");
    ck_assert_int_eq(info->epoch, 0);
    ck_assert_uint_eq(info->n_variables, 5);
    ck_assert_uint_eq(info->n_slots, 5);
    ck_assert(fabs(info->wall_time - keel__now_wall()) < 600);
    bd = keel_ckpt_info_blob(info, "data_iterator", &bs);
    ck_assert_ptr_nonnull(bd);
    ck_assert_uint_eq(bs, sizeof blob1);
    ck_assert_int_eq(memcmp(bd, blob1, bs), 0);
    ck_assert_ptr_nonnull(keel_ckpt_info_blob(info, "rng", &bs));
    ck_assert_uint_eq(bs, 0);
    ck_assert_ptr_null(keel_ckpt_info_blob(info, "nope", &bs));
    keel_ckpt_info_free(info);

    /* Saving the same step again is a no-op. */
    ck_assert_int_eq(keel_saver_save(s, a, NULL, NULL, 0), KEEL_OK);
    ck_assert_int_eq(keel_saver_wait(s), KEEL_OK);

    /* An end-of-epoch checkpoint: named and marked by its epoch, found by
     * latest and listed in the state file like any other. */
    meta.epoch = 3;
    meta.architecture = NULL;
    keel_vars_set_global_step(a, 1500);
    ck_assert_int_eq(keel_saver_save(s, a, &meta, path, sizeof path),
                     KEEL_OK);
    ck_assert_int_eq(keel_saver_wait(s), KEEL_OK);
    ck_assert_ptr_nonnull(strstr(path, "model.ckpt-epoch3-1500.h5"));
    ck_assert_int_eq(keel_saver_last_step(s), 1500);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, latest, sizeof latest,
                                      &step), KEEL_OK);
    ck_assert_str_eq(latest, path);
    ck_assert_int_eq(step, 1500);
    ck_assert_int_eq(keel_ckpt_read_info(path, &info), KEEL_OK);
    ck_assert_int_eq(info->epoch, 3);
    ck_assert_int_eq(info->global_step, 1500);
    ck_assert_ptr_null(info->architecture);
    keel_ckpt_info_free(info);
    meta.epoch = -1;
    ck_assert_int_eq(keel_saver_save(s, a, &meta, NULL, 0), KEEL_EINVAL);
    keel_saver_free(s);
    keel_vars_free(a);
    keel_vars_free(b);
}

START_TEST(test_sync_roundtrip_every_shape_slot_and_meta)
{
    roundtrip(0);
}
END_TEST

START_TEST(test_async_roundtrip_uses_staging_copy)
{
    roundtrip(1);
}
END_TEST

START_TEST(test_list_and_read_tensor)
{
    keel_vars *a = make_store(3.0f, 1);
    char path[4096];
    keel_ckpt_entry *e;
    size_t n;
    keel_tensor t;
    keel_tensor *want;

    save_once(a, 7, 0, path, sizeof path);
    ck_assert_int_eq(keel_ckpt_list(path, &e, &n), KEEL_OK);
    ck_assert_uint_eq(n, 10);
    ck_assert_str_eq(e[0].name, "conv1/kernel");
    ck_assert_str_eq(e[0].slot, "");
    ck_assert_int_eq(e[0].ndim, 4);
    ck_assert_int_eq(e[0].shape[3], 4);
    ck_assert_str_eq(e[5].slot, "m");
    ck_assert_str_eq(e[9].slot, "v");
    keel_ckpt_list_free(e);
    ck_assert_int_eq(keel_ckpt_read_tensor(path, "dense/kernel", "v", &t),
                     KEEL_OK);
    want = keel_var_slot(keel_vars_find(a, "dense/kernel"), "v");
    ck_assert_int_eq(memcmp(t.data, want->data, keel_tensor_bytes(want)), 0);
    keel_tensor_release(&t);
    ck_assert_int_eq(keel_ckpt_read_tensor(path, "global_scale", NULL, &t),
                     KEEL_OK);
    ck_assert_int_eq(t.ndim, 0);
    ck_assert_float_eq(t.data[0], 3.0f);
    keel_tensor_release(&t);
    ck_assert_int_eq(keel_ckpt_read_tensor(path, "nope", NULL, &t),
                     KEEL_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "nope"));
    keel_vars_free(a);
}
END_TEST

START_TEST(test_large_checkpoint_checksums_recorded_after_data)
{
    /* Over 4 MiB the writer records checksums after writing the data;
     * both savers, then a flipped byte deep in the data. */
    keel_vars *a, *b;
    keel_var *v;
    keel_tensor *t;
    char path[4096];
    int64_t shape[2] = { 2304, 4096 };   /* 36 MiB */

    ck_assert_int_eq(keel_vars_new(&a), KEEL_OK);
    ck_assert_int_eq(keel_vars_new(&b), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(a, "big", 2, shape, 0, &v), KEEL_OK);
    t = keel_var_tensor(v);
    for (size_t j = 0; j < t->count; j++)
        t->data[j] = (float)j;
    ck_assert_int_eq(keel_vars_create(b, "big", 2, shape, 0, NULL), KEEL_OK);
    for (int is_async = 0; is_async < 2; is_async++) {
        save_once(a, 1 + is_async, is_async, path, sizeof path);
        ck_assert_msg(keel_ckpt_verify(path) == KEEL_OK, "%s",
                      keel_last_error());
        ck_assert_int_eq(keel_ckpt_restore(path, b, NULL, NULL), KEEL_OK);
        ck_assert_int_eq(memcmp(keel_var_tensor(keel_vars_find(b, "big"))
                                ->data, t->data, keel_tensor_bytes(t)), 0);
    }
    tu_flip_byte(path, tu_file_size(path) - 1000, 0x01);
    ck_assert_int_eq(keel_ckpt_verify(path), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'big'"));
    keel_vars_free(a);
    keel_vars_free(b);
}
END_TEST

/* Restore reads every dataset in one pass with a reader thread (over
 * 1 MiB in all): a flipped byte in any variable or slot, in any of its
 * 8 MiB pieces, fails the restore naming that dataset; a truncated file
 * fails cleanly. */
START_TEST(test_one_pass_restore_detects_corruption_in_any_dataset)
{
    const char *names[3] = { "a", "b/kernel", "c" };
    int64_t rows[3] = { 300, 2500, 7 };     /* ~1.2 MiB, ~9.8 MiB, tiny */
    keel_vars *vs, *back;
    char path[4096], *file;
    size_t fsize;

    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_new(&back), KEEL_OK);
    srand(4242);                    /* no dataset's bytes inside another's */
    for (int i = 0; i < 3; i++) {
        int64_t shape[2] = { rows[i], 1024 };
        keel_var *v;
        keel_tensor *t, *slot;
        ck_assert_int_eq(keel_vars_create(vs, names[i], 2, shape, 0, &v),
                         KEEL_OK);
        t = keel_var_tensor(v);
        for (size_t j = 0; j < t->count; j++)
            t->data[j] = (float)rand() / (float)RAND_MAX;
        ck_assert_int_eq(keel_var_add_slot(v, "m", &slot), KEEL_OK);
        for (size_t j = 0; j < slot->count; j++)
            slot->data[j] = -(float)rand() / (float)RAND_MAX;
        ck_assert_int_eq(keel_vars_create(back, names[i], 2, shape, 0, NULL),
                         KEEL_OK);
    }
    save_once(vs, 1, 0, path, sizeof path);
    ck_assert_msg(keel_ckpt_restore(path, back, NULL, NULL) == KEEL_OK, "%s",
                  keel_last_error());
    assert_stores_equal(vs, back);
    file = tu_read_file(path, &fsize);
    srand(777);
    for (int i = 0; i < 3; i++) {
        keel_var *v = keel_vars_find(vs, names[i]);
        keel_tensor *t = keel_var_tensor(v);
        keel_tensor *slot = keel_var_slot(v, "m");
        for (int k = 0; k < 2; k++) {
            const keel_tensor *x = k == 0 ? t : slot;
            char *hit = memmem(file, fsize, x->data, keel_tensor_bytes(x));
            off_t at;
            char want[64];
            ck_assert_ptr_nonnull(hit);
            at = (off_t)(hit - file) + rand() % (int)keel_tensor_bytes(x);
            tu_flip_byte(path, at, 0x10);
            ck_assert_int_eq(keel_ckpt_restore(path, back, NULL, NULL),
                             KEEL_ECORRUPT);
            snprintf(want, sizeof want, "'%s'", names[i]);
            ck_assert_msg(strstr(keel_last_error(), want) != NULL, "%s",
                          keel_last_error());
            ck_assert_msg(strstr(keel_last_error(), k == 1 ? "slot 'm'"
                                                           : "variable '")
                          != NULL, "%s", keel_last_error());
            tu_flip_byte(path, at, 0x10);
        }
    }
    free(file);
    ck_assert_int_eq(keel_ckpt_restore(path, back, NULL, NULL), KEEL_OK);
    tu_truncate(path, fsize / 2);
    ck_assert_int_ne(keel_ckpt_restore(path, back, NULL, NULL), KEEL_OK);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), path));
    keel_vars_free(vs);
    keel_vars_free(back);
}
END_TEST

/* ---- O_DIRECT data path ------------------------------------------------- */

/* Debug log lines of the checkpoint code, collected for the test. */
static tu_log io_log = { .filter = "O_DIRECT" };

/* 1 when the file system under path takes aligned O_DIRECT reads. */
static int
fs_has_direct_io(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECT);
    void *buf = NULL;
    ssize_t r = -1;
    if (fd < 0)
        return 0;
    if (posix_memalign(&buf, 4096, 4096) == 0)
        r = pread(fd, buf, 4096, 0);
    free(buf);
    close(fd);
    return r > 0;
}

/* Push path out of the page cache (what a restore after a reboot sees). */
static void
drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fdatasync(fd), 0);
    ck_assert_int_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* Large tensors are written and cold-restored with O_DIRECT, sub-page
 * tails and small tensors through the page cache, in one file, by both
 * savers; a cached file is restored from the cache. The bytes are the
 * same whichever way they went, and a flipped byte in a direct-read body
 * or in a buffered tail is caught either way. */
START_TEST(test_direct_io_save_and_cold_restore_roundtrip)
{
    /* 5 MiB page multiple; 1000 x 27 floats = 108000 bytes, a page
     * multiple plus a 1504-byte tail; 300 bytes; a 1.5 MiB slot. */
    const char *names[3] = { "big/kernel", "odd/kernel", "tiny" };
    int64_t shapes[3][2] = { { 1280, 1024 }, { 1000, 27 }, { 5, 15 } };
    keel_vars *vs, *back;
    char path[4096];
    size_t fsize;
    char *file;
    int has_direct = -1;

    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_new(&back), KEEL_OK);
    srand(99);
    for (int i = 0; i < 3; i++) {
        keel_var *v;
        keel_tensor *t, *sl;
        ck_assert_int_eq(keel_vars_create(vs, names[i], 2, shapes[i], 0, &v),
                         KEEL_OK);
        t = keel_var_tensor(v);
        for (size_t j = 0; j < t->count; j++)
            t->data[j] = (float)rand() / (float)RAND_MAX + (float)i;
        if (i == 0) {
            ck_assert_int_eq(keel_var_add_slot(v, "m", &sl), KEEL_OK);
            for (size_t j = 0; j < sl->count; j++)
                sl->data[j] = -(float)rand() / (float)RAND_MAX;
        }
        ck_assert_int_eq(keel_vars_create(back, names[i], 2, shapes[i], 0,
                                          NULL), KEEL_OK);
    }
    keel_log_set_handler(tu_log_append, &io_log, KEEL_LOG_DEBUG);
    for (int is_async = 0; is_async < 2; is_async++) {
        io_log.text[0] = '\0';
        save_once(vs, 10 + is_async, is_async, path, sizeof path);
        if (has_direct < 0)
            has_direct = fs_has_direct_io(path);
        if (has_direct)
            ck_assert_msg(strstr(io_log.text, "wrote ") != NULL &&
                          strstr(io_log.text, "(0 of ") == NULL,
                          "no O_DIRECT write (async %d): %s", is_async,
                          io_log.text);
        ck_assert_msg(keel_ckpt_verify(path) == KEEL_OK, "%s",
                      keel_last_error());
        /* Cold: the data comes from the disk by O_DIRECT. */
        drop_cache(path);
        io_log.text[0] = '\0';
        ck_assert_msg(keel_ckpt_restore(path, back, NULL, NULL) == KEEL_OK,
                      "%s", keel_last_error());
        assert_stores_equal(vs, back);
        if (has_direct)
            ck_assert_msg(strstr(io_log.text, "read ") != NULL,
                          "cold restore without O_DIRECT: '%s'", io_log.text);
        /* Warm: every page is cached, so no O_DIRECT read. The kernel
         * may reclaim a page between the read and the restore (memory
         * pressure from other processes): three tries. */
        for (int tries = 0; tries < 3; tries++) {
            free(tu_read_file(path, NULL));
            io_log.text[0] = '\0';
            ck_assert_int_eq(keel_ckpt_restore(path, back, NULL, NULL),
                             KEEL_OK);
            assert_stores_equal(vs, back);
            if (strstr(io_log.text, "read ") == NULL)
                break;
        }
        ck_assert_msg(strstr(io_log.text, "read ") == NULL, "warm restore "
                      "read with O_DIRECT: %s", io_log.text);
    }
    keel_log_set_handler(NULL, NULL, KEEL_LOG_WARN);
    /* A flipped byte in the middle of the big body, in the slot, and in
     * the odd tensor's buffered tail, each read cold. */
    file = tu_read_file(path, &fsize);
    for (int k = 0; k < 3; k++) {
        keel_var *v = keel_vars_find(vs, names[k == 2 ? 1 : 0]);
        const keel_tensor *x = k == 1 ? keel_var_slot(v, "m")
                                      : keel_var_tensor(v);
        size_t n = keel_tensor_bytes(x);
        char *hit = memmem(file, fsize, x->data, n);
        off_t at;
        ck_assert_ptr_nonnull(hit);
        at = (off_t)(hit - file) + (off_t)(k == 2 ? n - 3 : n / 2 + 5);
        tu_flip_byte(path, at, 0x04);
        drop_cache(path);
        ck_assert_int_eq(keel_ckpt_restore(path, back, NULL, NULL),
                         KEEL_ECORRUPT);
        ck_assert_msg(strstr(keel_last_error(), k == 2 ? "'odd/kernel'"
                                                       : "'big/kernel'")
                      != NULL, "%s", keel_last_error());
        ck_assert_msg((strstr(keel_last_error(), "slot 'm'") != NULL) ==
                      (k == 1), "%s", keel_last_error());
        tu_flip_byte(path, at, 0x04);
    }
    free(file);
    drop_cache(path);
    ck_assert_int_eq(keel_ckpt_restore(path, back, NULL, NULL), KEEL_OK);
    assert_stores_equal(vs, back);
    keel_vars_free(vs);
    keel_vars_free(back);
}
END_TEST

/* A file system that opens files with O_DIRECT but refuses the writes
 * (EINVAL on the first one): every piece goes through the page cache,
 * no byte counts as direct, and the checksums, hashed again from the
 * start, still verify. */
static int n_direct_refused;

static ssize_t
refuse_direct_write(int fd, const void *buf, size_t n)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && (fl & O_DIRECT)) {
        n_direct_refused++;
        errno = EINVAL;
        return -1;
    }
    return write(fd, buf, n);
}

static const keel__fs_ops refuse_direct_ops = { refuse_direct_write, fsync,
                                                rename };

START_TEST(test_refused_direct_writes_fall_back_to_buffered)
{
    const char *names[2] = { "big/kernel", "odd/kernel" };
    int64_t shapes[2][2] = { { 1280, 1024 }, { 1000, 27 } };
    keel_vars *vs, *back;
    char path[4096];
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_new(&back), KEEL_OK);
    for (int i = 0; i < 2; i++) {
        keel_var *v;
        keel_tensor *t;
        ck_assert_int_eq(keel_vars_create(vs, names[i], 2, shapes[i], 0, &v),
                         KEEL_OK);
        t = keel_var_tensor(v);
        for (size_t j = 0; j < t->count; j++)
            t->data[j] = (float)j * 0.5f + (float)i;
        ck_assert_int_eq(keel_vars_create(back, names[i], 2, shapes[i], 0,
                                          NULL), KEEL_OK);
    }
    keel_log_set_handler(tu_log_append, &io_log, KEEL_LOG_DEBUG);
    for (int is_async = 0; is_async < 2; is_async++) {
        n_direct_refused = 0;
        io_log.text[0] = '\0';
        keel__fs_set_ops(&refuse_direct_ops);
        save_once(vs, 10 + is_async, is_async, path, sizeof path);
        keel__fs_set_ops(NULL);
        if (fs_has_direct_io(path)) {
            ck_assert_int_gt(n_direct_refused, 0);
            ck_assert_msg(strstr(io_log.text, "(0 of ") != NULL,
                          "bytes counted as direct (async %d): %s", is_async,
                          io_log.text);
        }
        ck_assert_msg(keel_ckpt_verify(path) == KEEL_OK, "%s",
                      keel_last_error());
        ck_assert_int_eq(keel_ckpt_restore(path, back, NULL, NULL), KEEL_OK);
        assert_stores_equal(vs, back);
    }
    keel_log_set_handler(NULL, NULL, KEEL_LOG_INFO);
    keel_vars_free(vs);
    keel_vars_free(back);
}
END_TEST

/* Restore reads 2 MiB pieces on several reader threads, so later pieces
 * can arrive before earlier ones: with two corrupt datasets the error
 * still names the first in file order, read cold (O_DIRECT where the file
 * system has it) or warm (buffered); every other piece arrives intact; a
 * truncated file read cold fails cleanly, naming the file. */
START_TEST(test_multi_reader_restore_names_first_bad_dataset)
{
    const char *names[3] = { "a", "b/kernel", "c" };
    int64_t rows[3] = { 768, 1280, 600 };   /* 3 MiB, 5 MiB, 2.3 MiB */
    keel_vars *vs, *back;
    char path[4096], *file, *hit[3];
    size_t fsize;

    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_new(&back), KEEL_OK);
    srand(31337);
    for (int i = 0; i < 3; i++) {
        int64_t shape[2] = { rows[i], 1024 };
        keel_var *v;
        keel_tensor *t;
        ck_assert_int_eq(keel_vars_create(vs, names[i], 2, shape, 0, &v),
                         KEEL_OK);
        t = keel_var_tensor(v);
        for (size_t j = 0; j < t->count; j++)
            t->data[j] = (float)rand() / (float)RAND_MAX + (float)i;
        ck_assert_int_eq(keel_vars_create(back, names[i], 2, shape, 0, NULL),
                         KEEL_OK);
    }
    save_once(vs, 1, 0, path, sizeof path);
    file = tu_read_file(path, &fsize);
    for (int i = 0; i < 3; i++) {
        const keel_tensor *t = keel_var_tensor(keel_vars_find(vs, names[i]));
        hit[i] = memmem(file, fsize, t->data, keel_tensor_bytes(t));
        ck_assert_ptr_nonnull(hit[i]);
    }
    for (int cold = 0; cold < 2; cold++) {
        /* b's third piece (past 4 MiB of it) and c's first are bad, b in
         * file order first; then a's last piece and c's. */
        off_t bad[2][2] = {
            { (off_t)(hit[1] - file) + ((off_t)9 << 19) + 17,
              (off_t)(hit[2] - file) + 100 },
            { (off_t)(hit[0] - file) + ((off_t)3 << 20) - 9,
              (off_t)(hit[2] - file) + ((off_t)2 << 20) + 5 },
        };
        const char *want[2] = { "'b/kernel'", "variable 'a'" };
        for (int c = 0; c < 2; c++) {
            tu_flip_byte(path, bad[c][0], 0x20);
            tu_flip_byte(path, bad[c][1], 0x20);
            if (cold)
                drop_cache(path);
            else
                free(tu_read_file(path, NULL));
            ck_assert_int_eq(keel_ckpt_restore(path, back, NULL, NULL),
                             KEEL_ECORRUPT);
            ck_assert_msg(strstr(keel_last_error(), want[c]) != NULL &&
                          strstr(keel_last_error(), "'c'") == NULL &&
                          strstr(keel_last_error(), path) != NULL, "%s",
                          keel_last_error());
            tu_flip_byte(path, bad[c][0], 0x20);
            tu_flip_byte(path, bad[c][1], 0x20);
        }
        if (cold)
            drop_cache(path);
        ck_assert_msg(keel_ckpt_restore(path, back, NULL, NULL) == KEEL_OK,
                      "%s", keel_last_error());
        assert_stores_equal(vs, back);
    }
    free(file);
    tu_truncate(path, (off_t)fsize - ((off_t)1 << 20));
    drop_cache(path);
    ck_assert_int_ne(keel_ckpt_restore(path, back, NULL, NULL), KEEL_OK);
    ck_assert_msg(strstr(keel_last_error(), path) != NULL, "%s",
                  keel_last_error());
    keel_vars_free(vs);
    keel_vars_free(back);
}
END_TEST

/* ---- restore options ---------------------------------------------------- */

START_TEST(test_restore_shape_mismatch_names_variable_and_shapes)
{
    keel_vars *a = make_store(1, 1), *b;
    char path[4096];
    save_once(a, 5, 0, path, sizeof path);
    b = matrix_store("dense/kernel", 7, 5);
    ck_assert_int_eq(keel_ckpt_restore(path, b, NULL, NULL), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dense/kernel"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "[5,7]"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "[7,5]"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), path));
    keel_vars_free(b);
    keel_vars_free(a);
}
END_TEST

START_TEST(test_restore_strict_partial_report_and_name_map)
{
    keel_vars *a = make_store(2, 1), *b;
    char path[4096];
    keel_restore_report rep;
    keel_restore_config o;
    const char *map[] = { "dense=fc" };
    keel_var *v;

    save_once(a, 9, 0, path, sizeof path);
    b = matrix_store("fc/kernel", 5, 7);
    ck_assert_int_eq(keel_vars_create(b, "new/thing", 1, (int64_t[]){ 2 },
                                      0, &v), KEEL_OK);
    keel_var_tensor(v)->data[0] = 17;
    /* Strict: "new/thing" and "fc/kernel" are missing. */
    ck_assert_int_eq(keel_ckpt_restore(path, b, NULL, &rep), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "new/thing"));
    ck_assert_uint_eq(rep.n_missing, 2);
    /* Partial with a map: fc/kernel restored from dense/kernel with its
     * slots; new/thing keeps its value. */
    keel_restore_config_init(&o);
    o.mode = KEEL_RESTORE_PARTIAL;
    o.name_map = map;
    o.n_name_map = 1;
    ck_assert_msg(keel_ckpt_restore(path, b, &o, &rep) == KEEL_OK, "%s",
                  keel_last_error());
    ck_assert_uint_eq(rep.n_restored, 1);
    ck_assert_uint_eq(rep.n_missing, 1);
    ck_assert_str_eq(rep.missing, "new/thing");
    ck_assert_uint_eq(rep.n_unexpected, 4);
    ck_assert_ptr_nonnull(strstr(rep.unexpected, "conv1/kernel"));
    ck_assert_ptr_nonnull(strstr(rep.unexpected, "dense/bias"));
    ck_assert_float_eq(keel_var_tensor(v)->data[0], 17);
    ck_assert_int_eq(memcmp(keel_var_tensor(keel_vars_find(b, "fc/kernel"))
                            ->data,
                            keel_var_tensor(keel_vars_find(a, "dense/kernel"))
                            ->data, 35 * sizeof(float)), 0);
    ck_assert_ptr_nonnull(keel_var_slot(keel_vars_find(b, "fc/kernel"),
                                        "v"));
    ck_assert_int_eq(keel_vars_global_step(b), 9);
    /* skip_slots leaves a fresh store without slots. */
    keel_vars_free(b);
    b = matrix_store("fc/kernel", 5, 7);
    o.skip_slots = 1;
    ck_assert_int_eq(keel_ckpt_restore(path, b, &o, &rep), KEEL_OK);
    ck_assert_uint_eq(keel_var_slot_count(keel_vars_find(b, "fc/kernel")),
                      0);
    /* A malformed map entry is a clear EINVAL. */
    map[0] = "nonsense";
    ck_assert_int_eq(keel_ckpt_restore(path, b, &o, &rep), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "nonsense"));
    keel_vars_free(b);
    keel_vars_free(a);
}
END_TEST

/* ---- h5py --------------------------------------------------------------- */

/* The ```python block after the keel-test marker in the format doc. */
static char *
doc_snippet(void)
{
    char *doc = tu_read_file(tu_src_path("docs/checkpoint-format.md"), NULL);
    char *m = strstr(doc, "<!-- keel-test: python-snippet");
    char *b, *e, *snip;
    ck_assert_ptr_nonnull(m);
    b = strstr(m, "```python\n");
    ck_assert_ptr_nonnull(b);
    b += 10;
    e = strstr(b, "```");
    ck_assert_ptr_nonnull(e);
    snip = strndup(b, (size_t)(e - b));
    free(doc);
    return snip;
}

START_TEST(test_python_snippet_reads_same_values)
{
    const char *py = getenv("PYTHON3");
    keel_vars *a = make_store(0.1f, 1);
    char path[4096], *snip, *script, *line, *save = NULL;
    size_t len;
    int n_lines = 0, n_vals = 0;
    static const char driver[] =
        "\nimport sys\n"
        "v, s, m = load_keel_checkpoint(sys.argv[1])\n"
        "def dump(kind, slot, n, a):\n"
        "    print(kind, slot, n, ','.join(str(d) for d in a.shape) or '-',"
        " ' '.join(float(x).hex() for x in a.ravel()))\n"
        "for n, a in sorted(v.items()): dump('var', '-', n, a)\n"
        "for (sl, n), a in sorted(s.items()): dump('slot', sl, n, a)\n"
        "print('step', int(m['global_step']))\n";

    /* $PYTHON3 from configure may be a python3 without h5py (pyenv);
     * then the system one, where Debian's python3-h5py lives. */
    {
        const char *cands[2] = { py, "/usr/bin/python3" };
        const char *pick = NULL;
        for (int i = 0; i < 2 && pick == NULL; i++) {
            char *argv[] = { (char *)cands[i], "-c", "import h5py, numpy",
                             NULL };
            if (cands[i] != NULL && cands[i][0] != '\0' &&
                tu_run(argv, NULL, 60000, NULL, 0, NULL, 0) == 0)
                pick = cands[i];
        }
        ck_assert_msg(pick != NULL, "no python3 with h5py and numpy "
                      "($PYTHON3=%s, /usr/bin/python3)", py ? py : "");
        py = pick;
    }
    save_once(a, 321, 0, path, sizeof path);
    snip = doc_snippet();
    len = strlen(snip) + sizeof driver;
    script = malloc(len);
    snprintf(script, len, "%s%s", snip, driver);
    tu_write_file(tu_path("load.py"), script, strlen(script));
    {
        char *argv[] = { (char *)py, (char *)tu_path("load.py"), path, NULL };
        int rc = tu_run(argv, NULL, 60000, out, sizeof out, err, sizeof err);
        ck_assert_msg(rc == 0, "python snippet failed (%d): %s", rc, err);
    }
    for (line = strtok_r(out, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char kind[8], slot[64], name[256], shape[64];
        int off = 0;
        keel_tensor t;
        if (strncmp(line, "step ", 5) == 0) {
            ck_assert_int_eq(atoll(line + 5), 321);
            n_lines++;
            continue;
        }
        ck_assert_int_eq(sscanf(line, "%7s %63s %255s %63s %n", kind, slot,
                                name, shape, &off), 4);
        ck_assert_msg(keel_ckpt_read_tensor(path, name,
                                            strcmp(kind, "slot") == 0 ?
                                            slot : NULL, &t) == KEEL_OK,
                      "%s", keel_last_error());
        {
            char want[64] = "";
            for (int d = 0; d < t.ndim; d++) {
                char tmp[24];
                snprintf(tmp, sizeof tmp, d ? ",%lld" : "%lld",
                         (long long)t.shape[d]);
                strcat(want, tmp);
            }
            ck_assert_str_eq(shape, t.ndim ? want : "-");
        }
        {
            char *p = line + off, *end;
            for (size_t j = 0; j < t.count; j++) {
                float x = (float)strtod(p, &end);
                ck_assert_msg(end != p, "short value list for %s", name);
                ck_assert_msg(memcmp(&x, &t.data[j], 4) == 0,
                              "%s[%zu]: python %a keel %a", name, j,
                              (double)x, (double)t.data[j]);
                p = end;
                n_vals++;
            }
        }
        keel_tensor_release(&t);
        n_lines++;
    }
    ck_assert_int_eq(n_lines, 11);     /* 5 vars + 5 slots + step */
    ck_assert_int_gt(n_vals, 200);
    free(script);
    free(snip);
    keel_vars_free(a);
}
END_TEST

/* ---- corruption and bad files ------------------------------------------- */

START_TEST(test_flipped_tensor_byte_detected_every_time)
{
    keel_vars *vs;
    keel_var *v;
    char path[4096], *file;
    size_t fsize;
    char *hit;
    int64_t off;
    keel_tensor *t;
    int trials = long_mode() ? 1000 : 100;

    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "w", 2, (int64_t[]){ 64, 64 }, 0,
                                      &v), KEEL_OK);
    t = keel_var_tensor(v);
    for (size_t j = 0; j < t->count; j++)
        t->data[j] = (float)j * 1.000123f + 0.5f;
    save_once(vs, 1, 0, path, sizeof path);
    file = tu_read_file(path, &fsize);
    hit = memmem(file, fsize, t->data, keel_tensor_bytes(t));
    ck_assert_ptr_nonnull(hit);
    off = hit - file;
    free(file);
    srand(12345);
    for (int i = 0; i < trials; i++) {
        off_t at = off + rand() % (int)keel_tensor_bytes(t);
        unsigned char mask = (unsigned char)(1 + rand() % 255);
        keel_tensor got;
        tu_flip_byte(path, at, mask);
        ck_assert_int_eq(keel_ckpt_verify(path), KEEL_ECORRUPT);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), path));
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "'w'"));
        ck_assert_int_eq(keel_ckpt_restore(path, vs, NULL, NULL),
                         KEEL_ECORRUPT);
        ck_assert_int_eq(keel_ckpt_read_tensor(path, "w", NULL, &got),
                         KEEL_ECORRUPT);
        tu_flip_byte(path, at, mask);
    }
    ck_assert_int_eq(keel_ckpt_verify(path), KEEL_OK);
    keel_vars_free(vs);
}
END_TEST

/* Replace /variables/<name> with a float64 dataset (with a checksum). */
static void
rewrite_as_float64(const char *path, const char *dset)
{
    hid_t f, sp, d, a, asp;
    hsize_t dims[2] = { 5, 7 };
    double buf[35] = { 0 };
    unsigned long long h = 0;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    ck_assert_int_ge(H5Ldelete(f, dset, H5P_DEFAULT), 0);
    sp = H5Screate_simple(2, dims, NULL);
    d = H5Dcreate2(f, dset, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT,
                   H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    asp = H5Screate(H5S_SCALAR);
    a = H5Acreate2(d, "xxh64", H5T_STD_U64LE, asp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_ULLONG, &h);
    H5Aclose(a);
    H5Sclose(asp);
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(f);
}

START_TEST(test_bad_files_give_clear_errors_and_latest_falls_back)
{
    keel_vars *a = make_store(4, 1), *b = make_store(0, 0);
    keel_saver *s = new_saver(tu_dir, 0, 0);
    char good[4096], bad[4096], got[4096];
    char *orig;
    size_t osize;
    int64_t step;
    keel_status st;

    save_step(s, a, 10, good, sizeof good);
    save_step(s, a, 20, bad, sizeof bad);
    orig = tu_read_file(bad, &osize);

    /* Truncations at many points, zero length, not HDF5, wrong dtype,
     * slot with the wrong shape. */
    for (int k = 0; k < 12; k++) {
        off_t cut = k == 0 ? 0 : (off_t)(osize * (size_t)k / 12);
        tu_write_file(bad, orig, osize);
        tu_truncate(bad, cut);
        st = keel_ckpt_verify(bad);
        ck_assert_msg(st == KEEL_ECORRUPT, "cut at %lld: %d %s",
                      (long long)cut, st, keel_last_error());
        ck_assert_ptr_nonnull(strstr(keel_last_error(), bad));
        if (k == 0)
            ck_assert_ptr_nonnull(strstr(keel_last_error(), "empty"));
        ck_assert_int_ne(keel_ckpt_restore(bad, b, NULL, NULL), KEEL_OK);
        ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got,
                                          &step), KEEL_OK);
        ck_assert_str_eq(got, good);
        ck_assert_int_eq(step, 10);
    }
    tu_write_file(bad, "model_checkpoint_path: nope\n", 28);
    ck_assert_int_eq(keel_ckpt_verify(bad), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "not an HDF5 file"));
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_OK);
    ck_assert_int_eq(step, 10);

    tu_write_file(bad, orig, osize);
    ck_assert_int_eq(keel_ckpt_verify(bad), KEEL_OK);
    keel__h5_lock();
    rewrite_as_float64(bad, "/variables/dense/kernel");
    keel__h5_unlock();
    /* a whole file of another dtype does not fit, like a shape: an error
     * naming the file, the dataset and the dtype; no fallback past it */
    ck_assert_int_eq(keel_ckpt_verify(bad), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dense/kernel"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "float64"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "float32"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), bad));
    ck_assert_int_eq(keel_ckpt_restore(bad, b, NULL, NULL), KEEL_EINVAL);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), bad));

    /* Missing file named by the state file: fallback. */
    ck_assert_int_eq(unlink(bad), 0);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_OK);
    ck_assert_int_eq(step, 10);
    ck_assert_int_eq(keel_ckpt_verify(bad), KEEL_ENOTFOUND);
    /* No valid checkpoint at all: not "no checkpoint" (KEEL_ENOTFOUND,
     * on which a trainer starts afresh) but an error naming the files,
     * the state file's missing one too. */
    tu_write_file(good, "junk", 4);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), tu_dir) != NULL
                  && strstr(keel_last_error(), good) != NULL
                  && strstr(keel_last_error(), bad) != NULL
                  && strstr(keel_last_error(), "2 found") != NULL, "%s",
                  keel_last_error());
    /* a state file naming only files that are gone is no empty
     * directory either */
    ck_assert_int_eq(unlink(good), 0);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), good));
    /* nothing there at all: KEEL_ENOTFOUND */
    ck_assert_int_eq(unlink(tu_path("checkpoint")), 0);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_ENOTFOUND);
    free(orig);
    keel_saver_free(s);
    keel_vars_free(a);
    keel_vars_free(b);
}
END_TEST

/* restore_latest reads the newest checkpoint once, verifying as it reads:
 * a corrupt, truncated, retyped or missing newest one is skipped for the
 * next, whose values arrive whole; a store that does not fit is an error,
 * not a reason to fall back. */
START_TEST(test_restore_latest_verifies_while_reading_and_falls_back)
{
    keel_vars *a = make_store(4, 1), *a2 = make_store(9, 1);
    keel_vars *b = make_store(0, 0);
    keel_saver *s = new_saver(tu_dir, 0, 0);
    char good[4096], bad[4096], got[4096];
    char *orig;
    size_t osize;
    keel_restore_report rep;
    keel_vars *odd;
    int64_t shape[1] = { 8 };

    save_step(s, a, 10, good, sizeof good);
    save_step(s, a2, 20, bad, sizeof bad);
    ck_assert_int_eq(keel_ckpt_restore_latest(tu_dir, NULL, b, NULL, &rep,
                                              got, sizeof got), KEEL_OK);
    ck_assert_str_eq(got, bad);
    ck_assert_int_eq(rep.global_step, 20);
    assert_stores_equal(a2, b);
    orig = tu_read_file(bad, &osize);
    for (int k = 0; k < 3; k++) {
        keel_vars_free(b);
        b = make_store(0, 0);
        tu_write_file(bad, orig, osize);
        if (k == 0) {                     /* a flipped byte in the data */
            const keel_tensor *t =
                keel_var_tensor(keel_vars_find(a2, "dense/kernel"));
            char *hit = memmem(orig, osize, t->data, keel_tensor_bytes(t));
            ck_assert_ptr_nonnull(hit);
            tu_flip_byte(bad, (off_t)(hit - orig) + 17, 0x01);
        }
        else if (k == 1)
            tu_truncate(bad, (off_t)osize / 2);
        else
            ck_assert_int_eq(unlink(bad), 0);
        ck_assert_msg(keel_ckpt_restore_latest(tu_dir, NULL, b, NULL, &rep,
                                               got, sizeof got) == KEEL_OK,
                      "case %d: %s", k, keel_last_error());
        ck_assert_str_eq(got, good);
        ck_assert_int_eq(rep.global_step, 10);
        ck_assert_int_eq(keel_vars_global_step(b), 10);
        assert_stores_equal(a, b);
    }
    /* a newest file that opens whole but holds float64 does not fit: no
     * fallback, the error names the file and the dataset */
    tu_write_file(bad, orig, osize);
    keel__h5_lock();
    rewrite_as_float64(bad, "/variables/dense/kernel");
    keel__h5_unlock();
    ck_assert_int_eq(keel_ckpt_restore_latest(tu_dir, NULL, b, NULL, &rep,
                                              got, sizeof got), KEEL_EINVAL);
    ck_assert_msg(strstr(keel_last_error(), bad) != NULL
                  && strstr(keel_last_error(), "dense/kernel") != NULL
                  && strstr(keel_last_error(), "float64") != NULL, "%s",
                  keel_last_error());
    /* the model does not fit: no fallback, the error names the variable */
    tu_write_file(bad, orig, osize);
    ck_assert_int_eq(keel_vars_new(&odd), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(odd, "dense/bias", 1, shape,
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    ck_assert_int_eq(keel_ckpt_restore_latest(tu_dir, NULL, odd, NULL, NULL,
                                              NULL, 0), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dense/bias"));
    /* a model that only adds a variable does not fit either: an error
     * naming the newest file and the variable, not "no checkpoint" */
    keel_vars_free(b);
    b = make_store(0, 0);
    ck_assert_int_eq(keel_vars_create(b, "head/extra", 1, shape,
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    ck_assert_int_eq(keel_ckpt_restore_latest(tu_dir, NULL, b, NULL, NULL,
                                              NULL, 0), KEEL_EINVAL);
    ck_assert_msg(strstr(keel_last_error(), bad) != NULL
                  && strstr(keel_last_error(), "head/extra") != NULL, "%s",
                  keel_last_error());
    keel_vars_free(b);
    b = make_store(0, 0);
    /* nothing restores: an error naming the directory and both files,
     * not KEEL_ENOTFOUND (no checkpoint: start afresh) */
    tu_write_file(bad, "junk", 4);
    tu_write_file(good, "junk", 4);
    ck_assert_int_eq(keel_ckpt_restore_latest(tu_dir, NULL, b, NULL, NULL,
                                              NULL, 0), KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), tu_dir) != NULL
                  && strstr(keel_last_error(), good) != NULL
                  && strstr(keel_last_error(), bad) != NULL, "%s",
                  keel_last_error());
    free(orig);
    keel_saver_free(s);
    keel_vars_free(odd);
    keel_vars_free(a);
    keel_vars_free(a2);
    keel_vars_free(b);
}
END_TEST

START_TEST(test_latest_without_state_file_scans)
{
    keel_vars *a = make_store(1, 1);
    keel_saver *s = new_saver(tu_dir, 0, 0);
    char got[4096];
    int64_t step;
    save_step(s, a, 3, NULL, 0);
    save_step(s, a, 11, NULL, 0);
    save_step(s, a, 7, NULL, 0);     /* newest saved, older step */
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_OK);
    ck_assert_int_eq(step, 7);       /* the state file's latest */
    ck_assert_int_eq(unlink(tu_path("checkpoint")), 0);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_OK);
    ck_assert_int_eq(step, 11);      /* highest step by scan */
    tu_write_file(tu_path("checkpoint"), "garbage without colon\n", 22);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_OK);
    ck_assert_int_eq(step, 11);
    keel_saver_free(s);
    keel_vars_free(a);
}
END_TEST

/* ---- retention ---------------------------------------------------------- */

START_TEST(test_retention_survives_restart_and_lowered_max_prunes)
{
    keel_vars *a = make_store(1, 1);
    keel_saver *s = new_saver(tu_dir, 3, 0);
    char *state;
    for (int i = 1; i <= 6; i++)
        save_step(s, a, i * 10, NULL, 0);
    ck_assert_int_eq(tu_count_names(tu_dir, ".h5"), 3);
    state = tu_read_file(tu_path("checkpoint"), NULL);
    ck_assert_ptr_nonnull(strstr(state, "model_checkpoint_path: "
                                        "\"model.ckpt-60.h5\""));
    ck_assert_ptr_nonnull(strstr(state, "all_model_checkpoint_paths: "
                                        "\"model.ckpt-40.h5\""));
    ck_assert_ptr_null(strstr(state, "\"model.ckpt-30.h5\""));
    ck_assert_ptr_nonnull(strstr(state, "max_to_keep=3"));
    free(state);
    keel_saver_free(s);
    ck_assert_int_eq(access(tu_path("model.ckpt-30.h5"), F_OK), -1);

    /* Restart with max_to_keep 1: the first save prunes down to 1. */
    s = new_saver(tu_dir, 1, 0);
    ck_assert_int_eq(keel_saver_last_step(s), 60);
    save_step(s, a, 70, NULL, 0);
    ck_assert_int_eq(tu_count_names(tu_dir, ".h5"), 1);
    ck_assert_int_eq(access(tu_path("model.ckpt-70.h5"), F_OK), 0);
    keel_saver_free(s);

    /* Restart with keep all: nothing is removed. */
    s = new_saver(tu_dir, 0, 0);
    for (int i = 8; i <= 10; i++)
        save_step(s, a, i * 10, NULL, 0);
    ck_assert_int_eq(tu_count_names(tu_dir, ".h5"), 4);
    keel_saver_free(s);
    keel_vars_free(a);
}
END_TEST

/* The "# keel: delete=" line of a save's retention stays in the state file
 * until the file is gone (a crash before leaves it for the next saver),
 * and a clean end removes it: only a deletion still pending, here one a
 * reader's lease defers, is left listed. */
START_TEST(test_clean_end_leaves_no_pending_deletion)
{
    keel_vars *a = make_store(1, 1);
    keel_ckpt_lease *l = NULL;
    keel_saver *s;
    char *state;
    for (int is_async = 0; is_async <= 1; is_async++) {
        s = new_saver(tu_dir, 2, is_async);
        for (int i = 1; i <= 3; i++)
            save_step(s, a, is_async * 100 + i * 10, NULL, 0);
        state = tu_read_file(tu_path("checkpoint"), NULL);
        ck_assert_msg(strstr(state, "# keel: delete=model.ckpt-") != NULL,
                      "%s", state);
        free(state);
        keel_saver_free(s);
        state = tu_read_file(tu_path("checkpoint"), NULL);
        ck_assert_msg(strstr(state, "# keel: delete=") == NULL, "%s", state);
        ck_assert_msg(strstr(state, "max_to_keep=2") != NULL, "%s", state);
        free(state);
        ck_assert_int_eq(tu_count_names(tu_dir, "model.ckpt-"), 2);
    }
    s = new_saver(tu_dir, 1, 0);
    ck_assert_int_eq(keel_ckpt_lease_take(tu_dir, "model.ckpt-130.h5", &l),
                     KEEL_OK);
    save_step(s, a, 140, NULL, 0);
    keel_saver_free(s);
    state = tu_read_file(tu_path("checkpoint"), NULL);
    ck_assert_msg(strstr(state, "# keel: delete=model.ckpt-130.h5\n") !=
                  NULL, "%s", state);
    ck_assert_msg(strstr(state, "# keel: delete=model.ckpt-120.h5") == NULL,
                  "%s", state);
    free(state);
    keel_ckpt_lease_release(l);
    keel_vars_free(a);
}
END_TEST

START_TEST(test_keep_every_n_hours_preserves_pruned_files)
{
    keel_vars *a = make_store(1, 1);
    keel_saver_config cfg;
    keel_saver *s;
    char *state;
    keel_saver_config_init(&cfg);
    cfg.dir = tu_dir;
    cfg.max_to_keep = 1;
    cfg.keep_every_n_hours = 1e-9;   /* every pruned file is "old enough" */
    ck_assert_int_eq(keel_saver_new(&cfg, &s), KEEL_OK);
    for (int i = 1; i <= 4; i++)
        save_step(s, a, i, NULL, 0);
    ck_assert_int_eq(tu_count_names(tu_dir, ".h5"), 4);
    state = tu_read_file(tu_path("checkpoint"), NULL);
    ck_assert_ptr_null(strstr(state, "\"model.ckpt-3.h5\""));
    ck_assert_ptr_nonnull(strstr(state, "keep_every_n_hours=1e-09"));
    free(state);
    keel_saver_free(s);
    keel_vars_free(a);
}
END_TEST

START_TEST(test_dead_process_temp_files_cleaned_at_start)
{
    pid_t dead = tu_dead_pid();
    char name[256], mine[256];
    keel_saver *s;
    snprintf(name, sizeof name, ".model.ckpt-5.h5.tmp.%d", (int)dead);
    tu_write_file(tu_path(name), "x", 1);
    snprintf(name, sizeof name, ".checkpoint.tmp.%d", (int)dead);
    tu_write_file(tu_path(name), "x", 1);
    snprintf(mine, sizeof mine, ".model.ckpt-6.h5.tmp.%d", (int)getppid());
    tu_write_file(tu_path(mine), "x", 1);
    tu_write_file(tu_path(".other.tmp.1"), "x", 1);
    s = new_saver(tu_dir, 5, 0);
    ck_assert_int_eq(tu_count_names(tu_dir, ".tmp."), 2);
    ck_assert_int_eq(access(tu_path(mine), F_OK), 0);
    keel_saver_free(s);
}
END_TEST

/* ---- injected I/O faults ------------------------------------------------ */

static int fail_fsync_at, fail_rename_at, n_fsync, n_rename;

static int
inj_fsync(int fd)
{
    if (++n_fsync == fail_fsync_at) {
        errno = EIO;
        return -1;
    }
    return fsync(fd);
}

static int
inj_rename(const char *a, const char *b)
{
    if (++n_rename == fail_rename_at) {
        errno = ENOSPC;
        return -1;
    }
    return rename(a, b);
}

static ssize_t
inj_write(int fd, const void *buf, size_t n)
{
    return write(fd, buf, n);
}

static const keel__fs_ops inj_ops = { inj_write, inj_fsync, inj_rename };

static void
fault_run(int is_async)
{
    keel_vars *a = make_store(1, 1), *b = make_store(0, 0);
    keel_saver *s = new_saver(tu_dir, 2, is_async);
    char got[4096];
    int64_t step, next = 2;
    int failures = 0;

    save_step(s, a, 1, NULL, 0);
    /* A save does 4 fsyncs (file, dir, state file, dir) and 2 renames. */
    for (int which = 0; which < 6; which++) {
        keel_status st;
        n_fsync = n_rename = 0;
        fail_fsync_at = which < 4 ? which + 1 : 0;
        fail_rename_at = which >= 4 ? which - 3 : 0;
        keel__fs_set_ops(&inj_ops);
        keel_vars_set_global_step(a, next++);
        st = keel_saver_save(s, a, NULL, NULL, 0);
        if (st == KEEL_OK)
            st = keel_saver_wait(s);
        keel__fs_set_ops(NULL);
        ck_assert_msg(st == KEEL_EIO, "fault %d: %d %s", which, st,
                      keel_last_error());
        failures++;
        ck_assert_int_eq(tu_count_names(tu_dir, ".tmp."), 0);
        ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got,
                                          &step), KEEL_OK);
        ck_assert_int_eq(keel_ckpt_restore(got, b, NULL, NULL), KEEL_OK);
        ck_assert_int_eq(keel_vars_global_step(b), step);
    }
    /* After the faults, saving works again. */
    save_step(s, a, 100, NULL, 0);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_OK);
    ck_assert_int_eq(step, 100);
    ck_assert_int_eq(failures, 6);
    keel_saver_free(s);
    keel_vars_free(a);
    keel_vars_free(b);
}

START_TEST(test_io_faults_keep_previous_checkpoint_findable)
{
    fault_run(0);
}
END_TEST

START_TEST(test_async_failure_is_reported_not_dropped)
{
    fault_run(1);
}
END_TEST

/* ---- SIGKILL crash safety ----------------------------------------------- */

static void
crash_trials(int is_async)
{
    const char *child = tu_build_path("tests/ckpt_child");
    int trials = long_mode() ? 1000 : 10;
    char first[32];
    char *argv0[] = { (char *)child, tu_dir, "1", "1", "0", "3", NULL };
    keel_vars *b = make_store(0, 0);
    long next = 2;

    ck_assert_int_eq(tu_wait(tu_spawn(argv0, NULL, NULL), 30000), 0);
    srand(777 + is_async);
    for (int i = 0; i < trials; i++) {
        char got[4096];
        int64_t step;
        keel_tensor t;
        pid_t pid;
        snprintf(first, sizeof first, "%ld", next);
        {
            /* Every other trial saves 9 MiB checkpoints: O_DIRECT data. */
            char *argv[] = { (char *)child, tu_dir, first, "-1",
                             is_async ? "1" : "0", "3",
                             i % 2 ? "2048" : "256", NULL };
            pid = tu_spawn(argv, NULL, NULL);
        }
        next += 100000;
        usleep((useconds_t)(rand() % 60000));
        tu_kill(pid);
        ck_assert_msg(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step)
                      == KEEL_OK, "trial %d: %s", i, keel_last_error());
        ck_assert_msg(keel_ckpt_read_tensor(got, "dense/kernel", "m", &t) ==
                      KEEL_OK, "%s", keel_last_error());
        ck_assert_float_eq(t.data[0], (float)step);
        keel_tensor_release(&t);
    }
    /* Leftover temp files of the killed children go at the next start,
     * and nothing leaks: after one more save exactly 3 files remain. */
    {
        keel_saver *s = new_saver(tu_dir, 3, 0);
        int64_t last = keel_saver_last_step(s);
        ck_assert_int_ge(last, 1);
        ck_assert_int_eq(tu_count_names(tu_dir, ".tmp."), 0);
        char *state, *p;
        int listed = 0;
        save_step(s, b, last + 1, NULL, 0);
        state = tu_read_file(tu_path("checkpoint"), NULL);
        for (p = state; (p = strstr(p, "all_model_checkpoint_paths")); p++)
            listed++;
        free(state);
        ck_assert_int_le(listed, 3);
        ck_assert_int_eq(tu_count_names(tu_dir, ".h5"), listed);
        keel_saver_free(s);
    }
    keel_vars_free(b);
}

START_TEST(test_sigkill_at_random_moments_leaves_valid_latest)
{
    crash_trials(0);
}
END_TEST

START_TEST(test_sigkill_async_saver_leaves_valid_latest)
{
    crash_trials(1);
}
END_TEST

/* ---- CLI ---------------------------------------------------------------- */

/* keel ckpt diff's report, line by line: a variable only in A, one only in
 * B, a shape that changed, a value that changed, and the all-equal
 * summary. */
START_TEST(test_cli_diff_names_every_difference)
{
    keel_vars *a = matrix_store("w", 2, 3), *b = matrix_store("w", 3, 2);
    char pa[4096], pb[4096], pc[4096];
    ck_assert_int_eq(keel_vars_create(a, "gone", 1, (int64_t[]){ 4 }, 0,
                                      NULL), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(b, "new", 1, (int64_t[]){ 4 }, 0,
                                      NULL), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(b, "same", 1, (int64_t[]){ 2 }, 0,
                                      NULL), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(a, "same", 1, (int64_t[]){ 2 }, 0,
                                      NULL), KEEL_OK);
    save_once(a, 1, 0, pa, sizeof pa);
    keel_var_tensor(keel_vars_find(a, "same"))->data[1] = 0.25f;
    save_once(a, 2, 0, pc, sizeof pc);
    save_once(b, 3, 0, pb, sizeof pb);

    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "diff", pa, pb), 1);
    ck_assert_msg(strstr(out, "only in A   gone\n") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "only in B   new\n") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "shape       w: [2,3] vs [3,2]\n") != NULL,
                  "%s", out);
    ck_assert_msg(strstr(out, "same") == NULL, "%s", out);
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "diff", pa, pc), 1);
    ck_assert_msg(strncmp(out, "differs     same ", 17) == 0 &&
                  strstr(out, "max_abs_diff 0.25\n") != NULL, "%s", out);
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "diff", pa, pa), 0);
    ck_assert_msg(strcmp(out, "identical: 3 variables and slots bitwise "
                         "equal\n") == 0, "%s", out);
    keel_vars_free(a);
    keel_vars_free(b);
}
END_TEST

START_TEST(test_cli_ls_show_verify_diff)
{
    keel_vars *a = make_store(1, 1);
    keel_saver *s = new_saver(tu_dir, 0, 0);
    char p1[4096], p2[4096], p3[4096];
    keel_tensor *t;

    save_step(s, a, 10, p1, sizeof p1);
    save_step(s, a, 20, p2, sizeof p2);
    t = keel_var_slot(keel_vars_find(a, "dense/bias"), "m");
    t->data[3] += 0.5f;
    save_step(s, a, 30, p3, sizeof p3);

    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "--help"), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: keel ckpt"));
    {
        const char *subs[] = { "ls", "show", "verify", "diff" };
        for (int i = 0; i < 4; i++) {
            ck_assert_int_eq(TU_KEEL(20000, "ckpt", subs[i], "--help"), 0);
            ck_assert_ptr_nonnull(strstr(out, "usage: keel ckpt"));
        }
    }
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "ls", tu_dir), 0);
    ck_assert_ptr_nonnull(strstr(out, "model.ckpt-20.h5"));
    ck_assert_ptr_nonnull(strstr(out, "valid"));

    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "show", p1), 0);
    ck_assert_ptr_nonnull(strstr(out, "conv1/kernel"));
    ck_assert_ptr_nonnull(strstr(out, "[3,3,2,4]"));
    ck_assert_ptr_nonnull(strstr(out, "10"));
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "show", p1, "dense/bias"), 0);
    ck_assert_ptr_nonnull(strstr(out, "101.25"));
    /* getopt_long: --opt=value, --opt value, options after operands */
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "show", "--slot=m", p1,
                             "dense/bias", "--limit", "2"), 0);
    ck_assert_ptr_nonnull(strstr(out, "dense/bias slot m"));
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "show", p1, "--limit=x"), 2);
    ck_assert_ptr_nonnull(strstr(err, "--limit needs a count"));
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "show", p1, "-q"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: ckpt show: unknown option "
                                 "'-q'"));
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "show", p1, "dense/bias",
                             "--slot"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: ckpt show: --slot needs a "
                                 "SLOT"));

    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "verify", tu_dir), 0);
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "diff", p1, p2), 0);
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "diff", p2, p3), 1);
    ck_assert_ptr_nonnull(strstr(out, "dense/bias"));
    ck_assert_ptr_nonnull(strstr(out, "0.5"));
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "diff", p1,
                             tu_path("nope.h5")), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: "));

    tu_flip_byte(p3, tu_file_size(p3) - 1, 0x40);
    tu_truncate(p2, tu_file_size(p2) / 2);
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "verify", p2), 1);
    ck_assert_ptr_nonnull(strstr(err, p2));
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "verify", tu_dir), 1);
    ck_assert_msg(tu_keel(20000, out, sizeof out, err, sizeof err,
                          "ckpt", "ls", tu_dir, NULL) == 0, "ls: %s", err);
    ck_assert_ptr_nonnull(strstr(out, "INVALID"));
    ck_assert_int_eq(TU_KEEL(20000, "ckpt", "frob"), 2);
    keel_saver_free(s);
    keel_vars_free(a);
}
END_TEST

/* ---- read leases -------------------------------------------------------- */

START_TEST(test_lease_defers_retention_until_released)
{
    keel_vars *a = make_store(1, 1);
    keel_saver *s = new_saver(tu_dir, 2, 0);
    keel_ckpt_lease *l1 = NULL, *l2 = NULL;
    char got[4096], *state;
    int64_t step;
    int leased = -1;

    save_step(s, a, 10, NULL, 0);
    ck_assert_int_eq(keel_ckpt_lease_take(tu_dir, "model.ckpt-10.h5", &l1),
                     KEEL_OK);
    ck_assert_int_eq(keel_ckpt_lease_take(tu_dir, "model.ckpt-10.h5", &l2),
                     KEEL_OK);
    ck_assert_str_ne(keel_ckpt_lease_path(l1), keel_ckpt_lease_path(l2));
    ck_assert_int_eq(access(keel_ckpt_lease_path(l1), F_OK), 0);
    save_step(s, a, 20, NULL, 0);
    save_step(s, a, 30, NULL, 0);      /* retention would remove 10 */
    ck_assert_int_eq(access(tu_path("model.ckpt-10.h5"), F_OK), 0);
    ck_assert_int_eq(access(tu_path(".deferred-model.ckpt-10.h5"), F_OK), 0);
    state = tu_read_file(tu_path("checkpoint"), NULL);
    ck_assert_ptr_null(strstr(state, "\"model.ckpt-10.h5\""));
    free(state);
    /* leases and markers are never taken for checkpoints */
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_OK);
    ck_assert_int_eq(step, 30);

    keel_ckpt_lease_release(l1);       /* one of two: still leased */
    ck_assert_int_eq(keel_ckpt_lease_is_leased(tu_dir, "model.ckpt-10.h5",
                                               &leased), KEEL_OK);
    ck_assert_int_eq(leased, 1);
    save_step(s, a, 40, NULL, 0);
    ck_assert_int_eq(access(tu_path("model.ckpt-10.h5"), F_OK), 0);
    keel_ckpt_lease_release(l2);
    ck_assert_int_eq(keel_ckpt_lease_is_leased(tu_dir, "model.ckpt-10.h5",
                                               &leased), KEEL_OK);
    ck_assert_int_eq(leased, 0);
    save_step(s, a, 50, NULL, 0);      /* the next save deletes it */
    ck_assert_int_eq(access(tu_path("model.ckpt-10.h5"), F_OK), -1);
    ck_assert_int_eq(access(tu_path(".deferred-model.ckpt-10.h5"), F_OK), -1);
    ck_assert_int_eq(tu_count_names(tu_dir, ".lease-"), 0);
    ck_assert_int_eq(access(tu_path("model.ckpt-40.h5"), F_OK), 0);
    ck_assert_int_eq(access(tu_path("model.ckpt-50.h5"), F_OK), 0);
    ck_assert_int_eq(tu_count_names(tu_dir, "model.ckpt-"), 2);
    keel_saver_free(s);
    keel_vars_free(a);
}
END_TEST

START_TEST(test_stale_lease_of_dead_pid_is_ignored_and_removed)
{
    /* forked before anything is allocated: the child leaves nothing for
     * valgrind to report */
    pid_t gone = tu_dead_pid();
    keel_vars *a = make_store(1, 1);
    keel_saver *s = new_saver(tu_dir, 1, 0);
    char name[256];
    int leased = -1;

    save_step(s, a, 10, NULL, 0);
    snprintf(name, sizeof name, ".lease-%d.7-model.ckpt-10.h5",
             (int)gone);
    tu_write_file(tu_path(name), "", 0);
    ck_assert_int_eq(keel_ckpt_lease_is_leased(tu_dir, "model.ckpt-10.h5",
                                               &leased), KEEL_OK);
    ck_assert_int_eq(leased, 0);
    ck_assert_int_eq(access(tu_path(name), F_OK), -1);
    tu_write_file(tu_path(name), "", 0);
    save_step(s, a, 20, NULL, 0);      /* deleted despite the stale lease */
    ck_assert_int_eq(access(tu_path("model.ckpt-10.h5"), F_OK), -1);
    ck_assert_int_eq(access(tu_path(".deferred-model.ckpt-10.h5"), F_OK), -1);
    keel_saver_free(s);

    /* At start-up: a deferred deletion whose reader died is finished. */
    tu_write_file(tu_path("model.ckpt-5.h5"), "x", 1);
    tu_write_file(tu_path(".deferred-model.ckpt-5.h5"), "", 0);
    snprintf(name, sizeof name, ".lease-%d.1-model.ckpt-5.h5",
             (int)gone);
    tu_write_file(tu_path(name), "", 0);
    s = new_saver(tu_dir, 1, 0);
    ck_assert_int_eq(access(tu_path("model.ckpt-5.h5"), F_OK), -1);
    ck_assert_int_eq(access(tu_path(".deferred-model.ckpt-5.h5"), F_OK), -1);
    ck_assert_int_eq(access(tu_path(name), F_OK), -1);
    ck_assert_int_eq(access(tu_path("model.ckpt-20.h5"), F_OK), 0);
    ck_assert_int_eq(keel_saver_last_step(s), 20);
    keel_saver_free(s);
    keel_vars_free(a);
}
END_TEST

START_TEST(test_lease_rejects_names_outside_the_directory)
{
    keel_ckpt_lease *l = (keel_ckpt_lease *)1;
    int leased;
    ck_assert_int_eq(keel_ckpt_lease_take(tu_dir, "../x.h5", &l),
                     KEEL_EINVAL);
    ck_assert_ptr_null(l);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "../x.h5"));
    ck_assert_int_eq(keel_ckpt_lease_take(tu_dir, ".hidden", &l),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_ckpt_lease_take(tu_dir, "", &l), KEEL_EINVAL);
    ck_assert_int_eq(keel_ckpt_lease_is_leased(tu_dir, "a/b", &leased),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_ckpt_lease_take(tu_path("nodir"), "m-1.h5", &l),
                     KEEL_EIO);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "m-1.h5"));
    keel_ckpt_lease_release(NULL);
}
END_TEST

/* ---- name maps, retention bounds, real disk faults ------------------ */

static keel_vars *
two_by_three(const char *a, const char *b)
{
    keel_vars *vs;
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, a, 1, (int64_t[]){ 3 },
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    if (b != NULL)
        ck_assert_int_eq(keel_vars_create(vs, b, 1, (int64_t[]){ 3 },
                                          KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    return vs;
}

START_TEST(test_name_map_of_two_onto_one_names_both)
{
    keel_vars *a = two_by_three("a/w", "b/w"), *b = two_by_three("x/w", NULL);
    const char *map[] = { "a=x", "b=x" };
    keel_restore_config o;
    char path[4096];
    float before[3];
    save_once(a, 3, 0, path, sizeof path);
    memcpy(before, keel_var_tensor(keel_vars_at(b, 0))->data, sizeof before);
    keel_restore_config_init(&o);
    o.mode = KEEL_RESTORE_PARTIAL;
    o.name_map = map;
    o.n_name_map = 2;
    ck_assert_int_eq(keel_ckpt_restore(path, b, &o, NULL), KEEL_EINVAL);
    ck_assert_msg(strstr(keel_last_error(), "'a/w' and 'b/w'") != NULL &&
                  strstr(keel_last_error(), "'x/w'") != NULL, "%s",
                  keel_last_error());
    /* nothing was read */
    ck_assert_int_eq(memcmp(before, keel_var_tensor(keel_vars_at(b, 0))->data,
                            sizeof before), 0);
    keel_vars_free(a);
    keel_vars_free(b);
}
END_TEST

/* A state file may list any name: retention unlinks only
 * <basename>-<step>.h5 files of its own directory. */
START_TEST(test_retention_never_unlinks_outside_the_checkpoint_set)
{
    char ck[4200], text[16384], p1[4300], p2[4300];
    const char *victims[] = { "victim.h5", "model.ckpt-7.h5", "ck/notes.txt",
                              "ck/other-3.h5" };
    keel_vars *a = two_by_three("a/w", NULL);
    keel_saver *s;
    int n;
    snprintf(ck, sizeof ck, "%s/ck", tu_dir);
    s = new_saver(ck, 5, 0);
    save_step(s, a, 1, NULL, 0);
    keel_saver_free(s);
    for (size_t i = 0; i < 4; i++)
        tu_write_file(tu_path(victims[i]), "keep me\n", 8);
    snprintf(p1, sizeof p1, "%s/model.ckpt-7.h5", tu_dir);
    snprintf(p2, sizeof p2, "%s/ck/model.ckpt-1.h5", tu_dir);
    n = snprintf(text, sizeof text,
                 "model_checkpoint_path: \"%s\"\n"
                 "all_model_checkpoint_paths: \"../victim.h5\"\n"
                 "all_model_checkpoint_paths: \"%s\"\n"
                 "all_model_checkpoint_paths: \"notes.txt\"\n"
                 "all_model_checkpoint_paths: \"other-3.h5\"\n"
                 "all_model_checkpoint_paths: \"%s\"\n"
                 "# keel: delete=../victim.h5\n", p2, p1, p2);
    ck_assert_int_lt(n, (int)sizeof text);
    tu_write_file(tu_path("ck/checkpoint"), text, (size_t)n);
    s = new_saver(ck, 1, 0);
    save_step(s, a, 2, NULL, 0);
    keel_saver_free(s);
    for (size_t i = 0; i < 4; i++)
        ck_assert_msg(access(tu_path(victims[i]), F_OK) == 0, "%s was "
                      "removed", victims[i]);
    /* its own checkpoint, even named by an absolute path, went */
    ck_assert_int_eq(access(p2, F_OK), -1);
    ck_assert_int_eq(access(tu_path("ck/model.ckpt-2.h5"), F_OK), 0);
    keel_vars_free(a);
}
END_TEST

/* The disk fills up in the middle of a checkpoint's data: a 96 KiB tmpfs
 * (ENOSPC) in a private mount namespace, so only as root (SKIP otherwise).
 * The save fails naming the file and the reason, leaves no partial file,
 * and the previous checkpoint stays the verified latest. */
START_TEST(test_disk_full_mid_data_keeps_the_previous_checkpoint)
{
    char dir[4200], latest[4096], *e;
    keel_vars *vs;
    keel_var *v;
    keel_saver *s;
    keel_status st = KEEL_OK;
    int64_t step = -1;
    if (getuid() != 0) {
        fprintf(stderr, "SKIP disk full: mounting a small tmpfs needs "
                "root\n");
        return;
    }
    snprintf(dir, sizeof dir, "%s/small", tu_dir);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    ck_assert_msg(unshare(CLONE_NEWNS) == 0, "unshare: %s", strerror(errno));
    /* the type is ignored for a propagation change; a string, not NULL,
     * keeps valgrind from reporting an unaddressable argument */
    ck_assert_int_eq(mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL),
                     0);
    ck_assert_msg(mount("tmpfs", dir, "tmpfs", 0, "size=96k") == 0,
                  "mount tmpfs: %s", strerror(errno));
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "big/w", 1, (int64_t[]){ 16384 },
                                      KEEL_VAR_TRAINABLE, &v), KEEL_OK);
    for (int i = 0; i < 16384; i++)
        keel_var_tensor(v)->data[i] = (float)i;
    s = new_saver(dir, 5, 0);
    save_step(s, vs, 1, NULL, 0);                /* 64 KiB of data fits */
    for (int k = 2; k <= 3; k++) {               /* the next one cannot */
        keel_vars_set_global_step(vs, k);
        st = keel_saver_save(s, vs, NULL, NULL, 0);
        if (st == KEEL_OK)
            st = keel_saver_wait(s);
        if (st != KEEL_OK)
            break;
    }
    e = strdup(keel_last_error());
    ck_assert_msg(st != KEEL_OK, "saves did not fail");
    ck_assert_msg(strstr(e, strerror(ENOSPC)) != NULL &&
                  strstr(e, dir) != NULL, "%s", e);
    keel_saver_free(s);
    /* no partial or temporary file left; the last good one is latest */
    ck_assert_int_eq(tu_count_names(dir, ".tmp"), 0);
    ck_assert_msg(keel_ckpt_latest(dir, NULL, latest, sizeof latest, &step) ==
                  KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(step, 1);
    ck_assert_int_eq(keel_ckpt_verify(latest), KEEL_OK);
    for (int64_t k = 2; k <= 3; k++) {
        char p[4300];
        snprintf(p, sizeof p, "%s/model.ckpt-%lld.h5", dir, (long long)k);
        ck_assert_msg(access(p, F_OK) != 0, "%s exists", p);
    }
    free(e);
    keel_vars_free(vs);
    ck_assert_int_eq(umount2(dir, MNT_DETACH), 0);
}
END_TEST

/* A save larger than the process's file size limit (RLIMIT_FSIZE, with
 * SIGXFSZ ignored as a long job would) fails before anything is written,
 * naming the limit, at the save call itself for a sync and an async saver
 * alike; a smaller one still succeeds; the process exits normally (HDF5 is
 * left with no half-closed file to crash on at exit). In a child, so the
 * limit stays there. */
START_TEST(test_file_size_limit_fails_the_save_cleanly)
{
    char top[4200];
    pid_t pid;
    int status;
    snprintf(top, sizeof top, "%s/fsize", tu_dir);
    ck_assert_int_eq(mkdir(top, 0755), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct rlimit rl = { 1 << 20, 1 << 20 };
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(10);
        for (int is_async = 0; is_async < 2; is_async++) {
            keel_vars *vs;
            keel_var *v;
            keel_saver *s;
            keel_status st;
            int64_t step = -1;
            char dir[4300], latest[4096];
            snprintf(dir, sizeof dir, "%s/%s", top, is_async ? "async"
                                                             : "sync");
            if (mkdir(dir, 0755) != 0 ||
                keel_vars_new(&vs) != KEEL_OK ||
                keel_vars_create(vs, "small/w", 1, (int64_t[]){ 1024 },
                                 KEEL_VAR_TRAINABLE, &v) != KEEL_OK ||
                keel_vars_create(vs, "big/w", 1, (int64_t[]){ 1 << 19 },
                                 KEEL_VAR_TRAINABLE, &v) != KEEL_OK)
                _exit(10);
            s = new_saver(dir, 5, is_async);
            keel_vars_set_global_step(vs, 1);
            /* 2 MiB of data: refused by the call, not by a later wait */
            if (keel_saver_save(s, vs, NULL, NULL, 0) == KEEL_OK)
                _exit(11);
            if (strstr(keel_last_error(), "file size limit") == NULL) {
                fprintf(stderr, "message: %s\n", keel_last_error());
                _exit(12);
            }
            if (keel_saver_wait(s) != KEEL_OK ||
                tu_count_names(dir, ".tmp") != 0 ||
                tu_count_names(dir, ".h5") != 0)
                _exit(13);
            keel_saver_free(s);
            keel_vars_free(vs);
            if (keel_vars_new(&vs) != KEEL_OK ||
                keel_vars_create(vs, "small/w", 1, (int64_t[]){ 1024 },
                                 KEEL_VAR_TRAINABLE, &v) != KEEL_OK)
                _exit(14);
            s = new_saver(dir, 5, is_async);
            keel_vars_set_global_step(vs, 2);
            st = keel_saver_save(s, vs, NULL, NULL, 0);
            if (st == KEEL_OK)
                st = keel_saver_wait(s);
            if (st != KEEL_OK ||
                keel_ckpt_latest(dir, NULL, latest, sizeof latest, &step) !=
                    KEEL_OK || step != 2)
                _exit(15);
            keel_saver_free(s);
            keel_vars_free(vs);
        }
        exit(0);                /* atexit handlers, HDF5's included, run */
    }
    status = tu_wait(pid, 120000);
    if (status < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    ck_assert_msg(status == 0, "child ended with %d (10+: which check "
                  "failed; 128+: killed by signal)", status);
}
END_TEST

/* A checkpoint directory the user may not write: as root the check runs
 * in a child that became nobody. The failure names the directory and
 * the reason; nothing is created. */
static int
try_unwritable(const char *dir, char *why, size_t size)
{
    keel_vars *vs = two_by_three("a/w", NULL);
    keel_saver_config cfg;
    keel_saver *s = NULL;
    keel_status st;
    keel_saver_config_init(&cfg);
    cfg.dir = dir;
    st = keel_saver_new(&cfg, &s);
    if (st == KEEL_OK) {
        keel_vars_set_global_step(vs, 1);
        st = keel_saver_save(s, vs, NULL, NULL, 0);
        if (st == KEEL_OK)
            st = keel_saver_wait(s);
    }
    snprintf(why, size, "%s", keel_last_error());
    keel_saver_free(s);
    keel_vars_free(vs);
    return st != KEEL_OK && strstr(why, strerror(EACCES)) != NULL &&
           strstr(why, dir) != NULL;
}

START_TEST(test_unwritable_checkpoint_dir_fails_clearly)
{
    char dir[4200], why[4096];
    snprintf(dir, sizeof dir, "%s/ro", tu_dir);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    if (getuid() == 0) {
        int pipefd[2], status;
        pid_t pid;
        ssize_t n;
        ck_assert_int_eq(chmod(tu_dir, 0755), 0);
        ck_assert_int_eq(pipe(pipefd), 0);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            int ok;
            close(pipefd[0]);
            if (setgroups(0, NULL) != 0 || setgid(65534) != 0 ||
                setuid(65534) != 0)
                _exit(3);
            ok = try_unwritable(dir, why, sizeof why);
            if (write(pipefd[1], why, strlen(why)) < 0)
                _exit(4);
            _exit(ok ? 0 : 1);
        }
        close(pipefd[1]);
        n = read(pipefd[0], why, sizeof why - 1);
        why[n > 0 ? n : 0] = '\0';
        close(pipefd[0]);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "as nobody: status %d: %s", status, why);
    } else {
        ck_assert_int_eq(chmod(dir, 0555), 0);
        ck_assert_msg(try_unwritable(dir, why, sizeof why), "%s", why);
        chmod(dir, 0755);
    }
    ck_assert_int_eq(tu_count_names(dir, ".h5"), 0);
    ck_assert_int_eq(tu_count_names(dir, "checkpoint"), 0);
}
END_TEST

/* ---- the state file ---------------------------------------------------- */

/* keel_ckpt_state_check: no state file or one whose newest entry is a
 * regular file (through a symlink too) is fine; a newest entry that is
 * missing, a dangling symlink or a directory is KEEL_ENOTFOUND naming the
 * state file, the entry and what it is; an unparseable file
 * KEEL_ECORRUPT. */
START_TEST(test_state_check_names_a_missing_newest_entry)
{
    keel_vars *a = make_store(1, 1);
    keel_saver *s = new_saver(tu_dir, 5, 0);
    char p10[4096], p20[4096], want[4200];
    static const char two[] =
        "model_checkpoint_path: \"model.ckpt-20.h5\"\n"
        "all_model_checkpoint_paths: \"model.ckpt-10.h5\"\n"
        "all_model_checkpoint_paths: \"model.ckpt-20.h5\"\n";

    ck_assert_int_eq(keel_ckpt_state_check(tu_dir), KEEL_OK);   /* none */
    save_step(s, a, 10, p10, sizeof p10);
    save_step(s, a, 20, p20, sizeof p20);
    keel_saver_free(s);
    ck_assert_msg(keel_ckpt_state_check(tu_dir) == KEEL_OK, "%s",
                  keel_last_error());
    tu_write_file(tu_path("checkpoint"), two, sizeof two - 1);
    ck_assert_int_eq(keel_ckpt_state_check(tu_dir), KEEL_OK);
    TU_SNPRINTF(want, sizeof want, "%s/checkpoint", tu_dir);

    ck_assert_int_eq(rename(p20, tu_path("aside.h5")), 0);
    ck_assert_int_eq(keel_ckpt_state_check(tu_dir), KEEL_ENOTFOUND);
    ck_assert_msg(strstr(keel_last_error(), want) != NULL
                  && strstr(keel_last_error(), "'model.ckpt-20.h5'") != NULL
                  && strstr(keel_last_error(), "missing") != NULL, "%s",
                  keel_last_error());
    /* a symlink to a regular file is followed */
    ck_assert_int_eq(symlink(tu_path("aside.h5"), p20), 0);
    ck_assert_int_eq(keel_ckpt_state_check(tu_dir), KEEL_OK);
    ck_assert_int_eq(unlink(tu_path("aside.h5")), 0);
    ck_assert_int_eq(keel_ckpt_state_check(tu_dir), KEEL_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dangling symlink"));
    ck_assert_int_eq(unlink(p20), 0);
    ck_assert_int_eq(mkdir(p20, 0700), 0);
    ck_assert_int_eq(keel_ckpt_state_check(tu_dir), KEEL_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "not a regular file"));
    ck_assert_int_eq(rmdir(p20), 0);
    /* an older entry that is gone is no error: only the newest counts */
    ck_assert_int_eq(unlink(p10), 0);
    {
        static const char one[] =
            "model_checkpoint_path: \"model.ckpt-10.h5\"\n";
        tu_write_file(tu_path("checkpoint"), one, sizeof one - 1);
        ck_assert_int_eq(keel_ckpt_state_check(tu_dir), KEEL_ENOTFOUND);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "model.ckpt-10.h5"));
    }
    tu_write_file(tu_path("checkpoint"), "garbage without colon\n", 22);
    ck_assert_int_eq(keel_ckpt_state_check(tu_dir), KEEL_ECORRUPT);
    ck_assert_int_eq(keel_ckpt_state_check(NULL), KEEL_EINVAL);
    keel_vars_free(a);
}
END_TEST

/* A state file listing the newest checkpoint several times (and an older
 * one twice): the next saver keeps one entry per file, and retention
 * deletes no file the list still names. */
START_TEST(test_retention_dedups_the_state_file_and_keeps_what_it_lists)
{
    keel_vars *a = make_store(1, 1);
    keel_saver *s = new_saver(tu_dir, 3, 0);
    char *state, *p;
    char text[4096];
    size_t len = 0;
    int n;

    for (int64_t step = 10; step <= 30; step += 10)
        save_step(s, a, step, NULL, 0);
    keel_saver_free(s);
    len += (size_t)snprintf(text + len, sizeof text - len,
                            "model_checkpoint_path: \"model.ckpt-30.h5\"\n"
                            "all_model_checkpoint_paths: "
                            "\"model.ckpt-20.h5\"\n");
    for (int i = 0; i < 2; i++)
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "all_model_checkpoint_paths: \"%s/"
                                "model.ckpt-10.h5\"\n", tu_dir);
    for (int i = 0; i < 6; i++)
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "all_model_checkpoint_paths: "
                                "\"model.ckpt-30.h5\"\n");
    tu_write_file(tu_path("checkpoint"), text, len);

    s = new_saver(tu_dir, 3, 0);
    save_step(s, a, 40, NULL, 0);
    keel_saver_free(s);
    state = tu_read_file(tu_path("checkpoint"), NULL);
    /* one entry each for 10, 30, 40 (max_to_keep 3: 20, the oldest, went;
     * 10 is listed by its path into the directory) */
    for (n = 0, p = state; (p = strstr(p, "model.ckpt-30.h5\"")) != NULL;
         p++)
        n++;
    ck_assert_msg(n == 1, "%d mentions of step 30: %s", n,
                  state);
    ck_assert_msg(strstr(state, "model.ckpt-10.h5\"") != NULL
                  && strstr(strstr(state, "model.ckpt-10.h5\"") + 1,
                            "model.ckpt-10.h5\"") == NULL, "%s", state);
    ck_assert_ptr_null(strstr(state, "model.ckpt-20.h5\""));
    free(state);
    ck_assert_int_ge(tu_file_size(tu_path("model.ckpt-10.h5")), 1);
    ck_assert_int_ge(tu_file_size(tu_path("model.ckpt-30.h5")), 1);
    ck_assert_int_ge(tu_file_size(tu_path("model.ckpt-40.h5")), 1);
    ck_assert_int_lt(tu_file_size(tu_path("model.ckpt-20.h5")), 0);
    ck_assert_msg(keel_ckpt_state_check(tu_dir) == KEEL_OK, "%s",
                  keel_last_error());
    keel_vars_free(a);
}
END_TEST

/* ---- resume and warm start through the session manager ------------------ */

/* The chief's prepare over vs with checkpoints in dir, warm starting from
 * warm (NULL: none) with the vars regex: its status, *restored. */
static keel_status
prepare_in(keel_vars *vs, const char *dir, const char *warm,
           const char *vars, int *restored)
{
    keel_session_manager_config mc;
    keel_session_manager *sm;
    keel_status st;
    keel_session_manager_config_init(&mc);
    mc.vars = vs;
    mc.checkpoint_dir = dir;
    mc.warm_start_from = warm;
    mc.warm_start_vars = vars;
    st = keel_session_manager_new(&mc, &sm);
    if (st == KEEL_OK)
        st = keel_session_manager_prepare(sm, 0, restored);
    keel_session_manager_free(sm);
    return st;
}

/* A model with a variable more than its run's checkpoint: resuming is an
 * error naming the file, the variable and the warm start, and nothing is
 * written; a warm start into a new directory takes the variables by name
 * (the new one keeps its initializer, the step and slots start fresh),
 * only those warm_start_vars matches; a restarted warm-started run resumes
 * its own checkpoints; the run's own directory is refused as the source. */
START_TEST(test_misfit_resume_fails_and_warm_start_starts_a_new_run)
{
    keel_vars *a = make_store(4, 1), *b;
    char path[4096], *old, want[4200], *now;
    size_t osize, nsize;
    int restored = -1;
    int64_t shape[1] = { 3 };
    keel_var *extra;

    ck_assert_int_eq(mkdir(tu_path("old"), 0700), 0);
    ck_assert_int_eq(mkdir(tu_path("new"), 0700), 0);
    {
        keel_saver *s = new_saver(tu_path("old"), 5, 0);
        save_step(s, a, 10, path, sizeof path);
        keel_saver_free(s);
    }
    old = tu_read_file(tu_path("old/checkpoint"), &osize);
    b = make_store(0, 0);
    ck_assert_int_eq(keel_vars_create(b, "head/extra", 1, shape,
                                      KEEL_VAR_TRAINABLE, &extra), KEEL_OK);
    keel_var_tensor(extra)->data[0] = 42;

    /* resume: an error, not "no checkpoint: initializing" */
    ck_assert_int_eq(prepare_in(b, tu_path("old"), NULL, NULL, &restored),
                     KEEL_EINVAL);
    ck_assert_msg(strstr(keel_last_error(), path) != NULL
                  && strstr(keel_last_error(), "head/extra") != NULL
                  && strstr(keel_last_error(), "warm start") != NULL, "%s",
                  keel_last_error());
    now = tu_read_file(tu_path("old/checkpoint"), &nsize);
    ck_assert(nsize == osize && memcmp(old, now, osize) == 0);
    free(now);

    /* the run's own directory is no warm-start source */
    ck_assert_int_eq(prepare_in(b, tu_path("new"), tu_path("new"), NULL,
                                &restored), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "own checkpoint "
                                 "directory"));
    /* a regex matching nothing the checkpoint has is refused */
    ck_assert_int_eq(prepare_in(b, tu_path("new"), tu_path("old"),
                                "head/.*", &restored), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'head/.*'"));
    ck_assert_int_eq(prepare_in(b, tu_path("new"), tu_path("old"), "(",
                                &restored), KEEL_EINVAL);

    /* warm start: by name, only what matches, step and slots fresh */
    ck_assert_msg(prepare_in(b, tu_path("new"), tu_path("old"),
                             "dense/.*", &restored) == KEEL_OK, "%s",
                  keel_last_error());
    ck_assert_int_eq(restored, 0);
    ck_assert_int_eq(keel_vars_global_step(b), 0);
    ck_assert(memcmp(keel_var_tensor(keel_vars_find(a, "dense/kernel"))->data,
                     keel_var_tensor(keel_vars_find(b, "dense/kernel"))->data,
                     5 * 7 * sizeof(float)) == 0);
    ck_assert_float_eq(keel_var_tensor(keel_vars_find(b, "global_scale"))
                       ->data[0], 0);
    ck_assert_float_eq(keel_var_tensor(extra)->data[0], 42);
    ck_assert_float_eq(keel_var_slot(keel_vars_find(b, "dense/kernel"),
                                     "m")->data[1], 0);     /* not -5 */
    /* the new run's checkpoint, then its restart: resumed, not warm */
    {
        keel_saver *s = new_saver(tu_path("new"), 5, 0);
        keel_var_tensor(extra)->data[0] = 7;
        save_step(s, b, 3, NULL, 0);
        keel_saver_free(s);
    }
    keel_var_tensor(extra)->data[0] = 0;
    ck_assert_msg(prepare_in(b, tu_path("new"), tu_path("old"), NULL,
                             &restored) == KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(restored, 1);
    ck_assert_int_eq(keel_vars_global_step(b), 3);
    ck_assert_float_eq(keel_var_tensor(extra)->data[0], 7);
    TU_SNPRINTF(want, sizeof want, "%s", tu_path("old/checkpoint"));
    now = tu_read_file(want, &nsize);
    ck_assert(nsize == osize && memcmp(old, now, osize) == 0);
    free(now);
    free(old);
    keel_vars_free(a);
    keel_vars_free(b);
}
END_TEST

/* A checkpoint directory in which no checkpoint restores (all damaged, or
 * a state file naming files that are gone) is not an empty one: prepare
 * fails naming the directory and the files and how to go on, and writes
 * nothing (no fresh run over them). */
START_TEST(test_all_corrupt_dir_is_an_error_not_a_fresh_start)
{
    keel_vars *a = make_store(4, 1), *b = make_store(0, 0);
    char p1[4096], p2[4096], *st1, *st2;
    size_t n1, n2;
    int restored = -1;
    keel_saver *s = new_saver(tu_dir, 5, 0);

    save_step(s, a, 10, p1, sizeof p1);
    save_step(s, a, 20, p2, sizeof p2);
    keel_saver_free(s);
    tu_truncate(p1, 100);
    tu_write_file(p2, "junk", 4);
    st1 = tu_read_file(tu_path("checkpoint"), &n1);
    ck_assert_int_eq(prepare_in(b, tu_dir, NULL, NULL, &restored),
                     KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), tu_dir) != NULL
                  && strstr(keel_last_error(), p1) != NULL
                  && strstr(keel_last_error(), p2) != NULL
                  && strstr(keel_last_error(), "move") != NULL
                  && strstr(keel_last_error(), "warm") != NULL, "%s",
                  keel_last_error());
    ck_assert_int_eq(restored, 0);
    ck_assert_int_eq(tu_file_size(p1), 100);
    ck_assert_int_eq(tu_file_size(p2), 4);
    st2 = tu_read_file(tu_path("checkpoint"), &n2);
    ck_assert(n1 == n2 && memcmp(st1, st2, n1) == 0);
    free(st2);
    /* the state file names two files, both gone */
    ck_assert_int_eq(unlink(p1), 0);
    ck_assert_int_eq(unlink(p2), 0);
    ck_assert_int_eq(prepare_in(b, tu_dir, NULL, NULL, &restored),
                     KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), p2) != NULL, "%s",
                  keel_last_error());
    st2 = tu_read_file(tu_path("checkpoint"), &n2);
    ck_assert(n1 == n2 && memcmp(st1, st2, n1) == 0);
    free(st2);
    free(st1);
    keel_vars_free(a);
    keel_vars_free(b);
}
END_TEST

/* ---- sharded checkpoints ---------------------------------------------- */

/* Which of the 3 shards make_store's variable i goes to; -1: the chief's
 * own (global_scale, in the index). */
static int
shard_of_var(size_t i)
{
    return i == 0 ? -1 : (int)(i % 3);
}

/* Write shard k of 3 of full's variables at step with run_id into tu_dir
 * (as parameter server k does). */
static void
write_one_shard(keel_vars *full, int64_t step, uint64_t run_id, int k)
{
    const char *names[8];
    size_t n = 0;
    keel_ckpt_shard_config cfg;
    for (size_t i = 0; i < keel_vars_count(full); i++) {
        keel_var *v = keel_vars_at(full, i);
        if (!(keel_var_flags(v) & KEEL_VAR_LOCAL) && shard_of_var(i) == k)
            names[n++] = keel_var_name(v);
    }
    keel_ckpt_shard_config_init(&cfg);
    cfg.dir = tu_dir;
    cfg.step = step;
    cfg.run_id = run_id;
    cfg.shard_index = k;
    cfg.shard_count = 3;
    cfg.names = names;
    cfg.n_names = n;
    ck_assert_msg(keel_ckpt_write_shard(&cfg, full, NULL, 0) == KEEL_OK,
                  "%s", keel_last_error());
}

static void
write_shards(keel_vars *full, int64_t step, uint64_t run_id)
{
    for (int k = 0; k < 3; k++)
        write_one_shard(full, step, run_id, k);
}

/* The chief's store: full's global_scale, at step. */
static keel_vars *
chief_store(keel_vars *full, int64_t step)
{
    keel_vars *vs;
    keel_var *v;
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "global_scale", 0, NULL,
                                      KEEL_VAR_TRAINABLE, &v), KEEL_OK);
    keel_var_tensor(v)->data[0] =
        keel_var_tensor(keel_vars_find(full, "global_scale"))->data[0];
    keel_vars_set_global_step(vs, step);
    return vs;
}

/* Shards, then the index through a saver (max_to_keep keep; async when
 * keep is negative, keeping -keep): one whole sharded checkpoint of step,
 * its index path into path. */
static keel_status
save_sharded(keel_vars *full, int64_t step, uint64_t run_id, int keep,
             char *path, size_t size)
{
    keel_saver_config sc;
    keel_ckpt_index_config ic;
    keel_saver *s;
    keel_vars *chief = chief_store(full, step);
    keel_status st;
    write_shards(full, step, run_id);
    keel_saver_config_init(&sc);
    sc.dir = tu_dir;
    sc.max_to_keep = keep < 0 ? -keep : keep;
    sc.is_async = keep < 0;
    ck_assert_int_eq(keel_saver_new(&sc, &s), KEEL_OK);
    keel_ckpt_index_config_init(&ic);
    ic.run_id = run_id;
    ic.shard_count = 3;
    st = keel_saver_save_sharded(s, chief, NULL, &ic, path, size);
    if (st == KEEL_OK)
        st = keel_saver_wait(s);
    keel_saver_free(s);
    keel_vars_free(chief);
    return st;
}

START_TEST(test_sharded_checkpoint_reads_as_one_file)
{
    keel_vars *full = make_store(3.0f, 1), *back = make_store(0.0f, 0);
    keel_vars *part;
    keel_ckpt_info *info = NULL;
    keel_ckpt_file *files = NULL;
    size_t nf = 0;
    char path[4096], cwd[4096];
    keel_restore_report rep;
    hid_t f, d;
    float w[35];

    keel_vars_set_global_step(full, 10);
    ck_assert_msg(save_sharded(full, 10, 0xabcdef01, 5, path, sizeof path)
                  == KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(tu_count_names(tu_dir, ".shard-"), 3);
    ck_assert_ptr_nonnull(strstr(path, "model.ckpt-10.h5"));
    ck_assert(access(tu_path("model.ckpt-10.shard-00002-of-00003.h5"),
                     F_OK) == 0);
    /* one process restores the whole checkpoint, strict */
    ck_assert_msg(keel_ckpt_restore(path, back, NULL, &rep) == KEEL_OK, "%s",
                  keel_last_error());
    ck_assert_int_eq(rep.global_step, 10);
    assert_stores_equal(full, back);
    ck_assert_int_eq(keel_ckpt_verify(path), KEEL_OK);
    ck_assert_int_eq(keel_ckpt_read_info(path, &info), KEEL_OK);
    ck_assert_int_eq(info->shard_count, 3);
    ck_assert_uint_eq(info->run_id, 0xabcdef01);
    ck_assert_uint_eq(info->n_variables, 5);
    ck_assert_uint_eq(info->n_slots, 5);
    keel_ckpt_info_free(info);
    /* the directory lists the checkpoint once, not its shards */
    ck_assert_int_eq(keel_ckpt_scan(tu_dir, NULL, &files, &nf), KEEL_OK);
    ck_assert_uint_eq(nf, 1);
    keel_ckpt_scan_free(files);
    ck_assert_msg(TU_KEEL(20000, "ckpt", "verify", tu_dir) == 0, "%s%s",
                  out, err);
    ck_assert_msg(TU_KEEL(20000, "ckpt", "show", path) == 0, "%s", err);
    ck_assert_ptr_nonnull(strstr(out, "dense/kernel"));
    ck_assert_ptr_nonnull(strstr(out, "shards:         3 (run id "
                                      "00000000abcdef01)"));
    /* one shard's variables alone, by name (a ps restoring its part):
     * dense/kernel (index 2) is shard 2's */
    ck_assert_int_eq(keel_vars_new(&part), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(part, "dense/kernel", 2,
                                      (int64_t[]){ 5, 7 }, 0, NULL),
                     KEEL_OK);
    ck_assert_msg(keel_ckpt_restore_shard(path, 2, part, NULL, &rep) ==
                  KEEL_OK, "%s", keel_last_error());
    ck_assert_uint_eq(rep.n_restored, 1);
    ck_assert(memcmp(keel_var_tensor(keel_vars_find(part, "dense/kernel"))
                         ->data,
                     keel_var_tensor(keel_vars_find(full, "dense/kernel"))
                         ->data, 35 * sizeof(float)) == 0);
    ck_assert_ptr_nonnull(keel_var_slot(keel_vars_find(part, "dense/kernel"),
                                        "v"));
    /* shard 1 holds other variables: strict restore of this store fails */
    ck_assert_int_eq(keel_ckpt_restore_shard(path, 1, part, NULL, NULL),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_ckpt_restore_shard(path, 3, part, NULL, NULL),
                     KEEL_EINVAL);
    keel_vars_free(part);
    /* plain HDF5 (what h5py uses) follows the index's external links, from
     * another working directory */
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir("/"), 0);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    d = H5Dopen2(f, "/variables/dense/kernel", H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    ck_assert_int_ge(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                             H5P_DEFAULT, w), 0);
    ck_assert(memcmp(w, keel_var_tensor(keel_vars_find(full, "dense/kernel"))
                            ->data, sizeof w) == 0);
    H5Dclose(d);
    H5Fclose(f);
    ck_assert_int_eq(chdir(cwd), 0);
    keel_vars_free(back);
    keel_vars_free(full);
}
END_TEST

/* keel_ckpt_read_parts, a ps's restore: named variables and slots, whole
 * or rows of the first dimension, through the index from whichever shard
 * holds them; the step and run id checked before anything is read. */
START_TEST(test_read_parts_by_name_through_the_index)
{
    keel_vars *full = make_store(7.0f, 1);
    const float *kernel, *bias_m;
    char path[4096];
    float k[35], rows[14], m[7], junk[35];
    int64_t step = -1;
    keel_ckpt_part parts[3];

    keel_vars_set_global_step(full, 30);
    ck_assert_msg(save_sharded(full, 30, 0x5eed, 5, path, sizeof path)
                  == KEEL_OK, "%s", keel_last_error());
    kernel = keel_var_tensor(keel_vars_find(full, "dense/kernel"))->data;
    bias_m = keel_var_slot(keel_vars_find(full, "dense/bias"), "m")->data;
    memset(parts, 0, sizeof parts);
    parts[0].name = "dense/kernel";
    parts[0].dst = k;
    parts[0].count = 35;
    parts[1].name = "dense/kernel";         /* rows [1, 3) of 5 x 7 */
    parts[1].row_begin = 1;
    parts[1].row_end = 3;
    parts[1].dst = rows;
    parts[1].count = 14;
    parts[2].name = "dense/bias";
    parts[2].slot = "m";
    parts[2].dst = m;
    parts[2].count = 7;
    ck_assert_msg(keel_ckpt_read_parts(path, 30, 0x5eed, parts, 3, &step)
                  == KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(step, 30);
    ck_assert(memcmp(k, kernel, sizeof k) == 0);
    ck_assert(memcmp(rows, kernel + 7, sizeof rows) == 0);
    ck_assert(memcmp(m, bias_m, sizeof m) == 0);
    /* any step and run */
    ck_assert_int_eq(keel_ckpt_read_parts(path, -1, 0, parts, 3, NULL),
                     KEEL_OK);
    /* another checkpoint's step or run: refused, nothing read */
    memset(junk, 0, sizeof junk);
    parts[0].dst = junk;
    ck_assert_int_eq(keel_ckpt_read_parts(path, 20, 0x5eed, parts, 1, NULL),
                     KEEL_EABORTED);
    ck_assert_int_eq(keel_ckpt_read_parts(path, 30, 0x5eee, parts, 1, NULL),
                     KEEL_EABORTED);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "run 0000000000005eee"));
    ck_assert_float_eq(junk[0], 0.0f);
    /* absent, wrong size, rows out of range */
    parts[0].name = "dense/nope";
    ck_assert_int_eq(keel_ckpt_read_parts(path, 30, 0, parts, 1, NULL),
                     KEEL_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dense/nope"));
    parts[0].name = "dense/kernel";
    parts[0].count = 34;
    ck_assert_int_eq(keel_ckpt_read_parts(path, 30, 0, parts, 1, NULL),
                     KEEL_EINVAL);
    parts[1].row_end = 6;
    ck_assert_int_eq(keel_ckpt_read_parts(path, 30, 0, parts + 1, 1, NULL),
                     KEEL_EINVAL);
    ck_assert_float_eq(junk[0], 0.0f);
    keel_vars_free(full);
}
END_TEST

/* A whole store "emb" [10,3] (slot m) and "global_scale"; its parts
 * "emb/part_k" (rows 4, 3, 3) in *wire, with their slots. */
static void
partitioned_stores(keel_vars **whole, keel_vars **wire)
{
    static const int64_t rows[3] = { 4, 3, 3 };
    keel_var *v, *pv;
    keel_tensor *t, *sl, *ps;
    int64_t first = 0;
    ck_assert_int_eq(keel_vars_new(whole), KEEL_OK);
    ck_assert_int_eq(keel_vars_new(wire), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(*whole, "global_scale", 0, NULL,
                                      KEEL_VAR_TRAINABLE, &v), KEEL_OK);
    keel_var_tensor(v)->data[0] = 2.5f;
    ck_assert_int_eq(keel_vars_create(*whole, "emb", 2, (int64_t[]){ 10, 3 },
                                      KEEL_VAR_TRAINABLE, &v), KEEL_OK);
    ck_assert_int_eq(keel_var_add_slot(v, "m", &sl), KEEL_OK);
    t = keel_var_tensor(v);
    for (size_t j = 0; j < t->count; j++) {
        t->data[j] = 1.0f + (float)j * 0.5f;
        sl->data[j] = -(float)j;
    }
    for (int k = 0; k < 3; k++) {
        char name[32];
        snprintf(name, sizeof name, "emb/part_%d", k);
        ck_assert_int_eq(keel_vars_create(*wire, name, 2,
                                          (int64_t[]){ rows[k], 3 },
                                          KEEL_VAR_TRAINABLE, &pv), KEEL_OK);
        ck_assert_int_eq(keel_var_add_slot(pv, "m", &ps), KEEL_OK);
        memcpy(keel_var_tensor(pv)->data, t->data + first * 3,
               (size_t)rows[k] * 3 * sizeof(float));
        memcpy(ps->data, sl->data + first * 3,
               (size_t)rows[k] * 3 * sizeof(float));
        first += rows[k];
    }
    keel_vars_set_global_step(*whole, 30);
    keel_vars_set_global_step(*wire, 30);
}

/* Parts 0 and 2 in shard 0, part 1 in shard 1 (unless without_part1),
 * then the index over partitioned variables with whole's global_scale. */
static keel_status
save_partitioned(keel_vars *whole, keel_vars *wire, int without_part1,
                 char *path, size_t size)
{
    static const char *const in0[] = { "emb/part_0", "emb/part_2" };
    static const char *const in1[] = { "emb/part_1" };
    keel_ckpt_shard_config cfg;
    keel_ckpt_index_config ic;
    keel_saver_config sc;
    keel_saver *s;
    keel_vars *chief;
    keel_var *v;
    keel_status st;
    for (int k = 0; k < 2; k++) {
        keel_ckpt_shard_config_init(&cfg);
        cfg.dir = tu_dir;
        cfg.run_id = 77;
        cfg.shard_index = k;
        cfg.shard_count = 2;
        cfg.names = k == 0 ? in0 : in1;
        cfg.n_names = k == 0 ? 2 : (size_t)!without_part1;
        ck_assert_msg(keel_ckpt_write_shard(&cfg, wire, NULL, 0) == KEEL_OK,
                      "%s", keel_last_error());
    }
    ck_assert_int_eq(keel_vars_new(&chief), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(chief, "global_scale", 0, NULL,
                                      KEEL_VAR_TRAINABLE, &v), KEEL_OK);
    keel_var_tensor(v)->data[0] =
        keel_var_tensor(keel_vars_find(whole, "global_scale"))->data[0];
    keel_vars_set_global_step(chief, 30);
    keel_saver_config_init(&sc);
    sc.dir = tu_dir;
    ck_assert_int_eq(keel_saver_new(&sc, &s), KEEL_OK);
    keel_ckpt_index_config_init(&ic);
    ic.run_id = 77;
    ic.shard_count = 2;
    ic.partitioned = 1;
    st = keel_saver_save_sharded(s, chief, NULL, &ic, path, size);
    if (st == KEEL_OK)
        st = keel_saver_wait(s);
    keel_saver_free(s);
    keel_vars_free(chief);
    return st;
}

/* A sharded checkpoint over partitioned variables: each shard holds its
 * parts "emb/part_k", the index one virtual dataset "emb" (and "m" of
 * it) of the whole shape over their rows, which keel's readers and plain
 * HDF5 read whole (tests/ckpt_vds.py: h5py, and the refusal of a
 * virtual source outside the index's shards). */
START_TEST(test_sharded_partitioned_checkpoint_reads_whole)
{
    keel_vars *whole, *wire, *back, *dummy;
    keel_restore_report rep;
    keel_ckpt_info *info = NULL;
    char path[4096], cwd[4096];
    hid_t f, d, dcpl;
    float w[30];

    partitioned_stores(&whole, &wire);
    ck_assert_msg(save_partitioned(whole, wire, 0, path, sizeof path) ==
                  KEEL_OK, "%s", keel_last_error());
    partitioned_stores(&back, &dummy);
    keel_vars_free(dummy);
    memset(keel_var_tensor(keel_vars_find(back, "emb"))->data, 0,
           30 * sizeof(float));
    memset(keel_var_slot(keel_vars_find(back, "emb"), "m")->data, 0,
           30 * sizeof(float));
    ck_assert_msg(keel_ckpt_restore(path, back, NULL, &rep) == KEEL_OK, "%s",
                  keel_last_error());
    assert_stores_equal(whole, back);
    ck_assert_msg(keel_ckpt_verify(path) == KEEL_OK, "%s",
                  keel_last_error());
    ck_assert_int_eq(keel_ckpt_read_info(path, &info), KEEL_OK);
    ck_assert_uint_eq(info->n_variables, 2);
    ck_assert_uint_eq(info->n_slots, 1);
    keel_ckpt_info_free(info);
    ck_assert_msg(TU_KEEL(20000, "ckpt", "show", path) == 0, "%s", err);
    ck_assert_msg(strstr(out, "part_") == NULL && strstr(out, "emb") != NULL
                  && strstr(out, "[10,3]") != NULL, "%s", out);
    /* plain HDF5 reads emb whole from another working directory */
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir("/"), 0);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    d = H5Dopen2(f, "/slots/m/emb", H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    dcpl = H5Dget_create_plist(d);
    ck_assert_int_eq(H5Pget_layout(dcpl), H5D_VIRTUAL);
    H5Pclose(dcpl);
    ck_assert_int_ge(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                             H5P_DEFAULT, w), 0);
    ck_assert(memcmp(w, keel_var_slot(keel_vars_find(whole, "emb"), "m")
                            ->data, sizeof w) == 0);
    H5Dclose(d);
    H5Fclose(f);
    ck_assert_int_eq(chdir(cwd), 0);
    keel_vars_free(back);
    keel_vars_free(wire);
    keel_vars_free(whole);
}
END_TEST

/* Parts of a partitioned variable that are not 0..K-1 (part 1 in no
 * shard) fail the index's commit, naming the variable; nothing is
 * committed. */
START_TEST(test_sharded_partitioned_index_needs_every_part)
{
    keel_vars *whole, *wire;
    char path[4096];
    partitioned_stores(&whole, &wire);
    ck_assert_int_eq(save_partitioned(whole, wire, 1, path, sizeof path),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'emb'"));
    ck_assert(access(tu_path("model.ckpt-30.h5"), F_OK) != 0);
    keel_vars_free(wire);
    keel_vars_free(whole);
}
END_TEST

START_TEST(test_sharded_checkpoint_is_whole_or_absent)
{
    keel_vars *full = make_store(5.0f, 1), *back = make_store(0.0f, 0);
    char p10[4096], p20[4096], got[4096];
    const char *shard1 = tu_path("model.ckpt-20.shard-00001-of-00003.h5");
    keel_ckpt_shard_config cfg;
    keel_ckpt_index_config ic;
    keel_saver_config sc;
    keel_saver *s;
    keel_vars *chief;
    int64_t step = -1;

    keel_vars_set_global_step(full, 10);
    ck_assert_int_eq(save_sharded(full, 10, 7, 0, p10, sizeof p10), KEEL_OK);
    /* killed after the shards of step 20, before its index: absent */
    write_shards(full, 20, 7);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_OK);
    ck_assert_int_eq(step, 10);
    /* the index of step 20 cannot be committed over a shard missing or of
     * another run: the save fails, nothing is committed */
    keel_saver_config_init(&sc);
    sc.dir = tu_dir;
    sc.max_to_keep = 0;
    ck_assert_int_eq(keel_saver_new(&sc, &s), KEEL_OK);
    chief = chief_store(full, 20);
    keel_ckpt_index_config_init(&ic);
    ic.run_id = 8;
    ic.shard_count = 3;
    ck_assert_int_eq(keel_saver_save_sharded(s, chief, NULL, &ic, p20,
                                             sizeof p20), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "run"));
    ck_assert(access(p20, F_OK) != 0);
    ic.run_id = 7;
    ck_assert_msg(keel_saver_save_sharded(s, chief, NULL, &ic, p20,
                                          sizeof p20) == KEEL_OK, "%s",
                  keel_last_error());
    keel_saver_free(s);
    keel_vars_free(chief);
    ck_assert_int_eq(keel_ckpt_verify(p20), KEEL_OK);
    /* a shard lost after the commit: invalid, restore falls back to 10 */
    ck_assert_int_eq(rename(shard1, tu_path("aside.h5")), 0);
    ck_assert_int_eq(keel_ckpt_verify(p20), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "missing"));
    ck_assert_int_eq(keel_ckpt_restore_latest(tu_dir, NULL, back, NULL, NULL,
                                              got, sizeof got), KEEL_OK);
    ck_assert_str_eq(got, p10);
    ck_assert_int_eq(keel_vars_global_step(back), 10);
    ck_assert_int_ne(TU_KEEL(20000, "ckpt", "verify", p20), 0);
    /* a shard of another generation in its place (same variables):
     * refused */
    write_one_shard(full, 20, 99, 1);
    ck_assert_int_eq(keel_ckpt_verify(p20), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "run 0000000000000063"));
    /* one holding datasets the index does not link: refused too */
    keel_ckpt_shard_config_init(&cfg);
    cfg.dir = tu_dir;
    cfg.step = 20;
    cfg.run_id = 7;
    cfg.shard_index = 1;
    cfg.shard_count = 3;
    ck_assert_int_eq(keel_ckpt_write_shard(&cfg, full, NULL, 0), KEEL_OK);
    ck_assert_int_eq(keel_ckpt_verify(p20), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "not this"));
    /* the right shard back: whole again; then a torn one */
    ck_assert_int_eq(rename(tu_path("aside.h5"), shard1), 0);
    ck_assert_int_eq(keel_ckpt_verify(p20), KEEL_OK);
    tu_truncate(shard1, tu_file_size(shard1) - 8);
    ck_assert_int_ne(keel_ckpt_verify(p20), KEEL_OK);
    ck_assert_int_eq(keel_ckpt_latest(tu_dir, NULL, got, sizeof got, &step),
                     KEEL_OK);
    ck_assert_int_eq(step, 10);
    keel_vars_free(back);
    keel_vars_free(full);
}
END_TEST

START_TEST(test_retention_deletes_shards_with_their_index)
{
    keel_vars *full = make_store(1.0f, 1);
    char p[4096];
    keel_vars_set_global_step(full, 10);
    ck_assert_int_eq(save_sharded(full, 10, 1, 1, p, sizeof p), KEEL_OK);
    keel_vars_set_global_step(full, 20);
    ck_assert_msg(save_sharded(full, 20, 1, -1, p, sizeof p) == KEEL_OK,
                  "%s", keel_last_error());
    ck_assert(access(tu_path("model.ckpt-10.h5"), F_OK) != 0);
    ck_assert_int_eq(tu_count_names(tu_dir, "model.ckpt-10."), 0);
    ck_assert_int_eq(tu_count_names(tu_dir, "model.ckpt-20.shard-"), 3);
    ck_assert_int_eq(keel_ckpt_verify(p), KEEL_OK);
    keel_vars_free(full);
}
END_TEST

static Suite *
checkpoint_suite(void)
{
    Suite *s = suite_create("checkpoint");
    /* Children (the keel CLI) inherit this; only matters under
     * --enable-sanitizers. */
    if (getenv("LSAN_OPTIONS") == NULL && getenv("KEEL_SRCDIR") != NULL) {
        static char opt[4200];
        snprintf(opt, sizeof opt, "suppressions=%s/tests/lsan-hdf5.supp:"
                 "print_suppressions=0", getenv("KEEL_SRCDIR"));
        setenv("LSAN_OPTIONS", opt, 1);
    }
    tu_tcase(s, "core", 60, tu_setup, tu_teardown, TU_TESTS(
        test_sync_roundtrip_every_shape_slot_and_meta,
        test_configs_without_their_init_are_refused_by_name,
        test_async_roundtrip_uses_staging_copy,
        test_list_and_read_tensor,
        test_large_checkpoint_checksums_recorded_after_data,
        test_one_pass_restore_detects_corruption_in_any_dataset,
        test_multi_reader_restore_names_first_bad_dataset,
        test_direct_io_save_and_cold_restore_roundtrip,
        test_refused_direct_writes_fall_back_to_buffered,
        test_restore_shape_mismatch_names_variable_and_shapes,
        test_restore_strict_partial_report_and_name_map,
        test_python_snippet_reads_same_values,
        test_flipped_tensor_byte_detected_every_time,
        test_restore_latest_verifies_while_reading_and_falls_back,
        test_bad_files_give_clear_errors_and_latest_falls_back,
        test_latest_without_state_file_scans,
        test_retention_survives_restart_and_lowered_max_prunes,
        test_clean_end_leaves_no_pending_deletion,
        test_keep_every_n_hours_preserves_pruned_files,
        test_dead_process_temp_files_cleaned_at_start,
        test_io_faults_keep_previous_checkpoint_findable,
        test_async_failure_is_reported_not_dropped,
        test_cli_diff_names_every_difference,
        test_cli_ls_show_verify_diff,
        test_lease_defers_retention_until_released,
        test_stale_lease_of_dead_pid_is_ignored_and_removed,
        test_lease_rejects_names_outside_the_directory,
        test_name_map_of_two_onto_one_names_both,
        test_retention_never_unlinks_outside_the_checkpoint_set,
        test_disk_full_mid_data_keeps_the_previous_checkpoint,
        test_unwritable_checkpoint_dir_fails_clearly,
        test_file_size_limit_fails_the_save_cleanly,
        test_misfit_resume_fails_and_warm_start_starts_a_new_run,
        test_all_corrupt_dir_is_an_error_not_a_fresh_start,
        test_state_check_names_a_missing_newest_entry,
        test_retention_dedups_the_state_file_and_keeps_what_it_lists));
    tu_tcase(s, "sharded", 60, tu_setup, tu_teardown, TU_TESTS(
        test_sharded_checkpoint_reads_as_one_file,
        test_read_parts_by_name_through_the_index,
        test_sharded_partitioned_checkpoint_reads_whole,
        test_sharded_partitioned_index_needs_every_part,
        test_sharded_checkpoint_is_whole_or_absent,
        test_retention_deletes_shards_with_their_index));
    tu_tcase(s, "slow", long_mode() ? 7200 : 120, tu_setup, tu_teardown,
             TU_TESTS(
        test_sigkill_at_random_moments_leaves_valid_latest,
        test_sigkill_async_saver_leaves_valid_latest));
    return s;
}

KEEL_TEST_MAIN(checkpoint_suite)
