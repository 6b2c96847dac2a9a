/* bench_util.h - clocks and statistics the benchmark programs share (built
 * into each of them; not part of libkeel). */
#ifndef KEEL_BENCH_UTIL_H
#define KEEL_BENCH_UTIL_H

#include <stdint.h>
#include <keel/keel.h>

/* Seconds on the monotonic clock (wall time). */
double bench_now(void);

/* Seconds of CPU time this process has used (all its threads). */
double bench_cpu_now(void);

/* The median of v[0..n-1], n >= 1 (the mean of the middle two for an even
 * n); sorts v in place. */
double bench_median(double *v, int n);

/* What a training benchmark steps: a model, its variables (initialized from
 * seed) and a gradient buffer for them. */
typedef struct bench_model {
    keel_vars *vs;
    keel_model *m;
    keel_grads *g;
} bench_model;
/* Builds bm from mc; on failure frees what it made and leaves bm zeroed. */
keel_status bench_model_new(bench_model *bm, const keel_model_config *mc,
                            uint64_t seed);
void bench_model_free(bench_model *bm);

#endif
