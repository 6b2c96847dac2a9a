/* bench_events.c - speed of hooks/: CRC32C (ISA-L, on 1 KiB and 1 MiB
 * buffers, against zlib's IEEE crc32 as the in-process baseline, and the
 * bit-at-a-time reference) and keel_events_scalar
 * against a plain fprintf CSV row. Prints medians of several repetitions
 * and ratios; the machine is shared, so compare ratios, not absolutes.
 * Usage: bench/bench_events [reps]   (writes only under a mkdtemp dir) */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <keel/keel.h>
#include <keel/events.h>
#include "util.h"
#include "events_int.h"

#define CRC_BYTES (1u << 20)
#define CRC_SMALL 1024u
#define CRC_TOTAL (64u << 20)   /* bytes hashed per measurement */
#define N_SCALARS 200000
#define MAX_REPS 31

static double
now_s(void)
{
    return (double)keel__now_mono_ns() / 1e9;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double
median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static uint32_t
zlib_crc(uint32_t crc, const void *p, size_t n)
{
    return (uint32_t)crc32(crc, p, (uInt)n);
}

static volatile uint32_t sink;

/* GB/s over total bytes hashed as calls of len bytes each. */
static double
crc_rate(crc_fn f, const uint8_t *buf, size_t len, size_t total)
{
    size_t calls = total / len;
    double t0 = now_s();
    uint32_t c = 0;
    for (size_t i = 0; i < calls; i++)
        c = f(c, buf, len);
    sink = c;
    return (double)(len * calls) / (now_s() - t0) / 1e9;
}

/* Scalars per second through keel_events (into dir/keel) or fprintf. */
static double
events_rate(const char *dir, int rep)
{
    char sub[4096];
    keel_events *w;
    snprintf(sub, sizeof sub, "%s/keel%d", dir, rep);
    if (keel_events_open(sub, NULL, &w) != KEEL_OK) {
        fprintf(stderr, "bench_events: %s\n", keel_last_error());
        exit(1);
    }
    double t0 = now_s();
    for (int i = 0; i < N_SCALARS; i++)
        keel_events_scalar(w, i, "train/loss", 1.0 / (i + 1));
    if (keel_events_flush(w) != KEEL_OK) {
        fprintf(stderr, "bench_events: %s\n", keel_last_error());
        exit(1);
    }
    double dt = now_s() - t0;
    keel_events_close(w);
    return N_SCALARS / dt;
}

static double
fprintf_rate(const char *dir, int rep)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/plain%d.csv", dir, rep);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    double t0 = now_s();
    for (int i = 0; i < N_SCALARS; i++)
        fprintf(f, "%.6f,%d,%s,%.9g\n", keel__now_wall(), i, "train/loss",
                1.0 / (i + 1));
    fflush(f);
    fsync(fileno(f));
    double dt = now_s() - t0;
    fclose(f);
    return N_SCALARS / dt;
}

int
main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    double z[MAX_REPS], zs[MAX_REPS], is[MAX_REPS], ib[MAX_REPS];
    double bw[MAX_REPS];
    double ev[MAX_REPS], pf[MAX_REPS];
    char dir[] = "/tmp/keel-bench-events.XXXXXX";
    uint8_t *buf = malloc(CRC_BYTES);
    if (reps < 1 || reps > MAX_REPS || buf == NULL || mkdtemp(dir) == NULL) {
        fprintf(stderr, "usage: bench_events [reps 1..%d]\n", MAX_REPS);
        return 2;
    }
    for (size_t i = 0; i < CRC_BYTES; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    for (int r = 0; r < reps; r++) {
        z[r] = crc_rate(zlib_crc, buf, CRC_BYTES, CRC_TOTAL);
        ib[r] = crc_rate(keel__crc32c_extend, buf, CRC_BYTES, CRC_TOTAL);
        zs[r] = crc_rate(zlib_crc, buf, CRC_SMALL, CRC_TOTAL);
        is[r] = crc_rate(keel__crc32c_extend, buf, CRC_SMALL, CRC_TOTAL);
        bw[r] = crc_rate(keel__crc32c_bitwise, buf, CRC_BYTES, 2 * CRC_BYTES);
        ev[r] = events_rate(dir, r);
        pf[r] = fprintf_rate(dir, r);
    }
    double mz = median(z, reps), mzs = median(zs, reps);
    double mi = median(ib, reps), mis = median(is, reps);
    double mb = median(bw, reps), me = median(ev, reps), mp = median(pf, reps);
    printf("medians of %d repetitions\n\n", reps);
    printf("| quantity | median | ratio vs baseline |\n|---|---|---|\n");
    printf("| zlib crc32 (IEEE), 1 MiB buffer (baseline) | %.2f GB/s "
           "| 1.00 |\n", mz);
    printf("| crc32c ISA-L crc32_iscsi, 1 MiB buffer | %.2f GB/s | %.2f |\n",
           mi, mi / mz);
    printf("| crc32c bit-at-a-time reference, 1 MiB | %.3f GB/s | %.3f |\n",
           mb, mb / mz);
    printf("| zlib crc32 (IEEE), 1 KiB buffer (baseline) | %.2f GB/s "
           "| 1.00 |\n", mzs);
    printf("| crc32c ISA-L crc32_iscsi, 1 KiB buffer | %.2f GB/s | %.2f |\n",
           mis, mis / mzs);
    printf("| fprintf CSV row + fsync at end (baseline) | %.0f rows/s | 1.00 |"
           "\n", mp);
    printf("| keel_events_scalar (event + CSV) + flush | %.0f scalars/s | "
           "%.2f |\n", me, me / mp);
    free(buf);
    {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_events: could not remove %s\n", dir);
    }
    return 0;
}
