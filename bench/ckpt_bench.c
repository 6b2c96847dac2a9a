/* ckpt_bench.c - checkpoint save/restore speed against raw write()+fsync()
 * and a raw cold read() of the same bytes, interleaved in one process so
 * the ratios see the same disk noise; plus the async save's stall against
 * a memcpy of the variables. Prints one JSON object per line.
 * Which of keel and raw goes first alternates with the repetition, offset
 * by --round (bench/ckpt.sh runs one repetition per process and passes
 * its round, so the first writer - the one that meets the previous run's
 * file deletions and discards - alternates too).
 * usage: ckpt_bench [--dir D] [--sizes 16,256,1024] [--reps 3] [--round R] */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <keel/keel.h>
#include "bench_util.h"

#define N_VARS 8

static void
die(const char *what)
{
    fprintf(stderr, "ckpt_bench: %s: %s\n", what,
            errno ? strerror(errno) : keel_last_error());
    exit(1);
}

/* Push a file out of the page cache. */
static void
drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        die(path);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static void
log_line(void *ctx, keel_log_level level, const char *msg)
{
    (void)ctx;
    fprintf(stderr, "%s: %s\n", keel_log_level_name(level), msg);
}

/* Every variable's bytes in store order, written to (is_write) or read
 * from fd in full: the raw I/O keel's checkpoint is measured against. */
static void
raw_transfer(int fd, keel_vars *vs, int is_write)
{
    for (size_t i = 0; i < keel_vars_count(vs); i++) {
        keel_tensor *t = keel_var_tensor(keel_vars_at(vs, i));
        char *p = (char *)t->data;
        size_t n = keel_tensor_bytes(t);
        while (n > 0) {
            ssize_t k = is_write ? write(fd, p, n) : read(fd, p, n);
            if (k <= 0)
                die(is_write ? "raw write" : "raw read");
            p += k;
            n -= (size_t)k;
        }
    }
}

static void
raw_write(const char *path, keel_vars *vs)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die(path);
    raw_transfer(fd, vs, 1);
    if (fsync(fd) != 0)
        die("raw fsync");
    close(fd);
}

static void
raw_read(const char *path, keel_vars *vs)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        die(path);
    raw_transfer(fd, vs, 0);
    close(fd);
}

static void
emit(const char *op, int mib, double *v, int reps, const char *unit)
{
    double s[64], med;
    memcpy(s, v, (size_t)reps * sizeof *v);
    med = bench_median(s, reps);
    printf("{\"bench\":\"ckpt\",\"op\":\"%s\",\"size_mib\":%d,\"median\":%.4f,"
           "\"min\":%.4f,\"max\":%.4f,\"reps\":%d,\"unit\":\"%s\"}\n", op,
           mib, med, s[0], s[reps - 1], reps, unit);
}

/* The command line: see the usage at the top of this file. */
typedef struct ckpt_opts {
    const char *dir;
    char sizes[256];
    int reps;
    int round;
} ckpt_opts;

/* One size's variables, savers and files, shared by its timed steps. */
typedef struct size_run {
    keel_vars *vs;
    keel_saver *sync_s, *async_s;
    char *scratch;
    char raw_path[4096], ck_path[4096];
    double gb;
    int64_t step;
} size_run;

/* One sample per repetition of each quantity emitted. */
typedef struct ckpt_samples {
    double w_raw[64], w_keel[64], r_raw[64], r_keel[64], stall[64],
           cpy[64], w_ratio[64], r_ratio[64], s_ratio[64];
} ckpt_samples;

static int
parse_args(int argc, char **argv, ckpt_opts *o)
{
    o->dir = "/tmp/keel_ckpt_bench";
    snprintf(o->sizes, sizeof o->sizes, "%s", "16,256,1024");
    o->reps = 3;
    o->round = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            o->dir = argv[++i];
        else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc)
            snprintf(o->sizes, sizeof o->sizes, "%s", argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            o->reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--round") == 0 && i + 1 < argc)
            o->round = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: ckpt_bench [--dir D] [--sizes 16,256] "
                    "[--reps N] [--round R]\n");
            return 2;
        }
    }
    return 0;
}

/* N_VARS variables of mib MiB in all, filled with a fixed pattern. */
static keel_vars *
vars_of_size(int mib)
{
    size_t per = ((size_t)mib << 20) / N_VARS;
    keel_vars *vs;
    if (keel_vars_new(&vs) != KEEL_OK)
        die("vars");
    for (int i = 0; i < N_VARS; i++) {
        char name[64];
        int64_t shape[2] = { (int64_t)(per / 4 / 1024), 1024 };
        keel_var *v;
        keel_tensor *t;
        snprintf(name, sizeof name, "layer%d/kernel", i);
        if (keel_vars_create(vs, name, 2, shape, 0, &v) != KEEL_OK)
            die("create");
        t = keel_var_tensor(v);
        for (size_t j = 0; j < t->count; j++)
            t->data[j] = (float)(j % 1000) * 0.001f + (float)i;
    }
    return vs;
}

/* The variables, a scratch buffer for the memcpy, a sync saver in dir and
 * an async one in dir/async whose staging buffer is already allocated. */
static void
size_run_open(size_run *sr, const char *dir, int mib)
{
    keel_saver_config cfg;
    char adir[4096];
    sr->gb = (double)((size_t)mib << 20) / 1e9;
    sr->step = 0;
    sr->vs = vars_of_size(mib);
    sr->scratch = keel_aligned_alloc(keel_vars_bytes(sr->vs, 0));
    memset(sr->scratch, 1, keel_vars_bytes(sr->vs, 0));
    snprintf(sr->raw_path, sizeof sr->raw_path, "%s/raw-%d.bin", dir, mib);
    snprintf(adir, sizeof adir, "%s/async", dir);
    keel_saver_config_init(&cfg);
    cfg.dir = dir;
    cfg.max_to_keep = 1;
    if (keel_saver_new(&cfg, &sr->sync_s) != KEEL_OK)
        die("saver");
    cfg.dir = adir;
    cfg.is_async = 1;
    if (keel_saver_new(&cfg, &sr->async_s) != KEEL_OK)
        die("async saver");
    /* Warm-up: allocate the staging buffer once. */
    keel_vars_set_global_step(sr->vs, ++sr->step);
    if (keel_saver_save(sr->async_s, sr->vs, NULL, NULL, 0) != KEEL_OK ||
        keel_saver_wait(sr->async_s) != KEEL_OK)
        die("async warm-up");
}

static void
size_run_close(size_run *sr)
{
    keel_saver_free(sr->sync_s);
    keel_saver_free(sr->async_s);
    unlink(sr->raw_path);
    keel_aligned_free(sr->scratch);
    keel_vars_free(sr->vs);
}

/* One timed measurement of repetition r into sm. */
typedef void timed_fn(size_run *sr, int r, ckpt_samples *sm);

/* keel's measurement and its raw twin, keel's first when keel_first. */
static void
time_pair(timed_fn *keel, timed_fn *raw, size_run *sr, int r, int keel_first,
          ckpt_samples *sm)
{
    if (keel_first == 1) {
        keel(sr, r, sm);
        raw(sr, r, sm);
    } else {
        raw(sr, r, sm);
        keel(sr, r, sm);
    }
}

static void
time_keel_save(size_run *sr, int r, ckpt_samples *sm)
{
    double t0;
    keel_vars_set_global_step(sr->vs, ++sr->step);
    t0 = bench_now();
    if (keel_saver_save(sr->sync_s, sr->vs, NULL, sr->ck_path,
                        sizeof sr->ck_path) != KEEL_OK)
        die("save");
    sm->w_keel[r] = sr->gb / (bench_now() - t0);
    /* Retention's unlink of the previous file runs on a thread; let it
     * finish before the raw run. */
    if (keel_saver_wait(sr->sync_s) != KEEL_OK)
        die("wait");
}

static void
time_raw_write(size_run *sr, int r, ckpt_samples *sm)
{
    double t0;
    unlink(sr->raw_path);
    t0 = bench_now();
    raw_write(sr->raw_path, sr->vs);
    sm->w_raw[r] = sr->gb / (bench_now() - t0);
}

/* keel's restore, from a cold page cache. */
static void
time_keel_restore(size_run *sr, int r, ckpt_samples *sm)
{
    double t0;
    drop_cache(sr->ck_path);
    t0 = bench_now();
    if (keel_ckpt_restore(sr->ck_path, sr->vs, NULL, NULL) != KEEL_OK)
        die("restore");
    sm->r_keel[r] = sr->gb / (bench_now() - t0);
}

/* The raw read, from a cold page cache. */
static void
time_raw_read(size_run *sr, int r, ckpt_samples *sm)
{
    double t0;
    drop_cache(sr->raw_path);
    t0 = bench_now();
    raw_read(sr->raw_path, sr->vs);
    sm->r_raw[r] = sr->gb / (bench_now() - t0);
}

/* Async stall vs one memcpy of every variable. */
static void
time_async_stall(size_run *sr, int r, ckpt_samples *sm)
{
    double t0 = bench_now();
    for (size_t i = 0, off = 0; i < keel_vars_count(sr->vs); i++) {
        keel_tensor *t = keel_var_tensor(keel_vars_at(sr->vs, i));
        memcpy(sr->scratch + off, t->data, keel_tensor_bytes(t));
        off += keel_tensor_bytes(t);
    }
    sm->cpy[r] = (bench_now() - t0) * 1e3;
    keel_vars_set_global_step(sr->vs, ++sr->step);
    t0 = bench_now();
    if (keel_saver_save(sr->async_s, sr->vs, NULL, NULL, 0) != KEEL_OK)
        die("async save");
    sm->stall[r] = (bench_now() - t0) * 1e3;
    if (keel_saver_wait(sr->async_s) != KEEL_OK)
        die("async wait");
}

static void
emit_all(int mib, ckpt_samples *sm, int reps)
{
    emit("raw_write_fsync", mib, sm->w_raw, reps, "GB/s");
    emit("keel_save", mib, sm->w_keel, reps, "GB/s");
    emit("save_ratio_keel_over_raw", mib, sm->w_ratio, reps, "x");
    emit("raw_read_cold", mib, sm->r_raw, reps, "GB/s");
    emit("keel_restore_cold", mib, sm->r_keel, reps, "GB/s");
    emit("restore_ratio_keel_over_raw", mib, sm->r_ratio, reps, "x");
    emit("memcpy_vars", mib, sm->cpy, reps, "ms");
    emit("async_stall", mib, sm->stall, reps, "ms");
    emit("stall_ratio_over_memcpy", mib, sm->s_ratio, reps, "x");
    fflush(stdout);
}

/* Every measurement at one size, reps times, then its JSON lines. */
static void
bench_size(const ckpt_opts *o, int mib)
{
    size_run sr;
    ckpt_samples sm;
    size_run_open(&sr, o->dir, mib);
    for (int r = 0; r < o->reps; r++) {
        int keel_first = (r + o->round) % 2;
        time_pair(time_keel_save, time_raw_write, &sr, r, keel_first, &sm);
        time_pair(time_keel_restore, time_raw_read, &sr, r, keel_first,
                  &sm);
        time_async_stall(&sr, r, &sm);
        sm.w_ratio[r] = sm.w_keel[r] / sm.w_raw[r];
        sm.r_ratio[r] = sm.r_keel[r] / sm.r_raw[r];
        sm.s_ratio[r] = sm.stall[r] / sm.cpy[r];
    }
    emit_all(mib, &sm, o->reps);
    size_run_close(&sr);
}

int
main(int argc, char **argv)
{
    ckpt_opts o;
    char *tok, *save = NULL;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    if (getenv("KEEL_BENCH_VERBOSE") != NULL)
        keel_log_set_handler(log_line, NULL, KEEL_LOG_DEBUG);
    if (o.reps < 1 || o.reps > 64)
        o.reps = 3;
    mkdir(o.dir, 0755);
    for (tok = strtok_r(o.sizes, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save))
        bench_size(&o, atoi(tok));
    return 0;
}
