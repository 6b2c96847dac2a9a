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

int
main(int argc, char **argv)
{
    const char *dir = "/tmp/keel_ckpt_bench";
    char sizes[256] = "16,256,1024";
    int reps = 3, round = 0;
    char *tok, *save = NULL;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc)
            snprintf(sizes, sizeof sizes, "%s", argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--round") == 0 && i + 1 < argc)
            round = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: ckpt_bench [--dir D] [--sizes 16,256] "
                    "[--reps N] [--round R]\n");
            return 2;
        }
    }
    if (getenv("KEEL_BENCH_VERBOSE") != NULL)
        keel_log_set_handler(log_line, NULL, KEEL_LOG_DEBUG);
    if (reps < 1 || reps > 64)
        reps = 3;
    mkdir(dir, 0755);
    for (tok = strtok_r(sizes, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        int mib = atoi(tok);
        size_t bytes = (size_t)mib << 20, per = bytes / N_VARS;
        double gb = (double)bytes / 1e9;
        double w_raw[64], w_keel[64], r_raw[64], r_keel[64], stall[64],
               cpy[64], w_ratio[64], r_ratio[64], s_ratio[64];
        keel_vars *vs;
        keel_saver_config cfg;
        keel_saver *sync_s, *async_s;
        char raw_path[4096], ck_path[4096], adir[4096];
        char *scratch;
        int64_t step = 0;

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
        scratch = keel_aligned_alloc(keel_vars_bytes(vs, 0));
        memset(scratch, 1, keel_vars_bytes(vs, 0));
        snprintf(raw_path, sizeof raw_path, "%s/raw-%d.bin", dir, mib);
        snprintf(adir, sizeof adir, "%s/async", dir);
        keel_saver_config_init(&cfg);
        cfg.dir = dir;
        cfg.max_to_keep = 1;
        if (keel_saver_new(&cfg, &sync_s) != KEEL_OK)
            die("saver");
        cfg.dir = adir;
        cfg.is_async = 1;
        if (keel_saver_new(&cfg, &async_s) != KEEL_OK)
            die("async saver");
        /* Warm-up: allocate the staging buffer once. */
        keel_vars_set_global_step(vs, ++step);
        if (keel_saver_save(async_s, vs, NULL, NULL, 0) != KEEL_OK ||
            keel_saver_wait(async_s) != KEEL_OK)
            die("async warm-up");
        for (int r = 0; r < reps; r++) {
            double t0;
            int keel_first = (r + round) % 2;
            for (int k = 0; k < 2; k++) {
                if ((k == 0) == (keel_first == 1)) {
                    keel_vars_set_global_step(vs, ++step);
                    t0 = bench_now();
                    if (keel_saver_save(sync_s, vs, NULL, ck_path,
                                        sizeof ck_path) != KEEL_OK)
                        die("save");
                    w_keel[r] = gb / (bench_now() - t0);
                    /* Retention's unlink of the previous file runs on a
                     * thread; let it finish before the raw run. */
                    if (keel_saver_wait(sync_s) != KEEL_OK)
                        die("wait");
                } else {
                    unlink(raw_path);
                    t0 = bench_now();
                    raw_write(raw_path, vs);
                    w_raw[r] = gb / (bench_now() - t0);
                }
            }
            for (int k = 0; k < 2; k++) {
                if ((k == 0) == (keel_first == 1)) {
                    drop_cache(ck_path);
                    t0 = bench_now();
                    if (keel_ckpt_restore(ck_path, vs, NULL, NULL) !=
                        KEEL_OK)
                        die("restore");
                    r_keel[r] = gb / (bench_now() - t0);
                } else {
                    drop_cache(raw_path);
                    t0 = bench_now();
                    raw_read(raw_path, vs);
                    r_raw[r] = gb / (bench_now() - t0);
                }
            }
            /* Async stall vs one memcpy of every variable. */
            t0 = bench_now();
            for (size_t i = 0, off = 0; i < keel_vars_count(vs); i++) {
                keel_tensor *t = keel_var_tensor(keel_vars_at(vs, i));
                memcpy(scratch + off, t->data, keel_tensor_bytes(t));
                off += keel_tensor_bytes(t);
            }
            cpy[r] = (bench_now() - t0) * 1e3;
            keel_vars_set_global_step(vs, ++step);
            t0 = bench_now();
            if (keel_saver_save(async_s, vs, NULL, NULL, 0) != KEEL_OK)
                die("async save");
            stall[r] = (bench_now() - t0) * 1e3;
            if (keel_saver_wait(async_s) != KEEL_OK)
                die("async wait");
            w_ratio[r] = w_keel[r] / w_raw[r];
            r_ratio[r] = r_keel[r] / r_raw[r];
            s_ratio[r] = stall[r] / cpy[r];
        }
        emit("raw_write_fsync", mib, w_raw, reps, "GB/s");
        emit("keel_save", mib, w_keel, reps, "GB/s");
        emit("save_ratio_keel_over_raw", mib, w_ratio, reps, "x");
        emit("raw_read_cold", mib, r_raw, reps, "GB/s");
        emit("keel_restore_cold", mib, r_keel, reps, "GB/s");
        emit("restore_ratio_keel_over_raw", mib, r_ratio, reps, "x");
        emit("memcpy_vars", mib, cpy, reps, "ms");
        emit("async_stall", mib, stall, reps, "ms");
        emit("stall_ratio_over_memcpy", mib, s_ratio, reps, "x");
        fflush(stdout);
        keel_saver_free(sync_s);
        keel_saver_free(async_s);
        unlink(raw_path);
        keel_aligned_free(scratch);
        keel_vars_free(vs);
    }
    return 0;
}
