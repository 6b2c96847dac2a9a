/* bench_util.c - see bench_util.h. */
#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

static double
clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double
bench_now(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

double
bench_cpu_now(void)
{
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double
bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

keel_status
bench_model_new(bench_model *bm, const keel_model_config *mc, uint64_t seed)
{
    keel_status st;
    memset(bm, 0, sizeof *bm);
    if ((st = keel_vars_new(&bm->vs)) != KEEL_OK ||
        (st = keel_model_new(mc, bm->vs, &bm->m)) != KEEL_OK ||
        (st = keel_model_init_vars(bm->m, bm->vs, seed)) != KEEL_OK ||
        (st = keel_grads_new(bm->vs, &bm->g)) != KEEL_OK)
        bench_model_free(bm);
    return st;
}

void
bench_model_free(bench_model *bm)
{
    keel_grads_free(bm->g);
    keel_model_free(bm->m);
    keel_vars_free(bm->vs);
    memset(bm, 0, sizeof *bm);
}
