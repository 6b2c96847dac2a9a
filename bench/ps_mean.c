/* ps_mean.c - the sync ps's example-weighted mean of R replicas'
 * gradients, three ways in one run: the scalar pass per replica over a
 * double sum per float and a final division pass (the ps's sequential
 * path), the float kernels (0 + g0, += g1 ..., then one scale pass: not
 * the ps's bits), and keel__weighted_mean_into (the ps's path: the
 * scalar pass's bits). Prints the median seconds per call.
 *
 * usage: ps_mean [FLOATS...]   (default: 1000000 20000000) */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "../numeric/numeric_int.h"

static void
mean_seq(float *dst, double *d, const float *const *g, const double *w,
         int k, double total, size_t n)
{
    for (int r = 0; r < k; r++) {
        if (r > 0)
            for (size_t e = 0; e < n; e++)
                d[e] += w[r] * (double)g[r][e];
        else
            for (size_t e = 0; e < n; e++)
                d[e] = w[r] * (double)g[r][e];
    }
    for (size_t e = 0; e < n; e++)
        dst[e] = (float)(d[e] / total);
}

static void
mean_float(float *dst, const float *const *g, int k, double total,
           size_t n)
{
    float s = (float)(1.0 / (double)k);
    (void)total;
    keel__zero_add_into(dst, g[0], n);
    for (int r = 1; r < k; r++)
        keel__add_into(dst, g[r], n);
    for (size_t e = 0; e < n; e++)
        dst[e] *= s;
}

int
main(int argc, char **argv)
{
    size_t sizes[8] = { 1000000, 20000000 };
    int n_sizes = argc > 1 ? argc - 1 : 2;
    for (int i = 1; i < argc && i <= 8; i++)
        sizes[i - 1] = (size_t)strtoull(argv[i], NULL, 10);
    if (n_sizes > 8)
        n_sizes = 8;
    printf("%-9s %2s %7s %12s %12s %12s %6s\n", "floats", "R", "weight",
           "seq_s", "float_s", "kernel_s", "same");
    for (int si = 0; si < n_sizes; si++) {
        size_t n = sizes[si];
        int reps = n > 4000000 ? 7 : 21;
        float *g[4], *dst = malloc(n * sizeof *dst),
              *ref = malloc(n * sizeof *ref);
        double *d = malloc(n * sizeof *d);
        if (dst == NULL || ref == NULL || d == NULL)
            return 1;
        for (int r = 0; r < 4; r++) {
            uint32_t x = 1u + (uint32_t)r;
            g[r] = malloc(n * sizeof *g[r]);
            if (g[r] == NULL)
                return 1;
            for (size_t e = 0; e < n; e++) {
                x = x * 1664525u + 1013904223u;
                g[r][e] = (float)(int32_t)x / 3.0e9f;
            }
        }
        for (int k = 2; k <= 4; k += 2)
            for (int wi = 0; wi < 2; wi++) {
                double wv = wi == 0 ? 32 : 3, w[4] = { wv, wv, wv, wv };
                double total = wv * k, t[3][32];
                const float *const *src = (const float *const *)g;
                for (int rep = 0; rep < reps; rep++) {
                    double t0 = bench_now();
                    mean_seq(ref, d, src, w, k, total, n);
                    double t1 = bench_now();
                    mean_float(dst, src, k, total, n);
                    double t2 = bench_now();
                    keel__weighted_mean_into(dst, src, w, k, total, n);
                    double t3 = bench_now();
                    t[0][rep] = t1 - t0;
                    t[1][rep] = t2 - t1;
                    t[2][rep] = t3 - t2;
                }
                printf("%-9zu %2d %7g %12.6f %12.6f %12.6f %6s\n", n, k, wv,
                       bench_median(t[0], reps), bench_median(t[1], reps),
                       bench_median(t[2], reps),
                       memcmp(dst, ref, n * sizeof *dst) == 0 ? "yes"
                                                              : "NO");
            }
        for (int r = 0; r < 4; r++)
            free(g[r]);
        free(dst);
        free(ref);
        free(d);
    }
    return 0;
}
