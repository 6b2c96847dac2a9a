/* bench_util.h - clocks and statistics the benchmark programs share (built
 * into each of them; not part of libkeel). */
#ifndef KEEL_BENCH_UTIL_H
#define KEEL_BENCH_UTIL_H

/* Seconds on the monotonic clock (wall time). */
double bench_now(void);

/* Seconds of CPU time this process has used (all its threads). */
double bench_cpu_now(void);

/* The median of v[0..n-1], n >= 1 (the mean of the middle two for an even
 * n); sorts v in place. */
double bench_median(double *v, int n);

#endif
