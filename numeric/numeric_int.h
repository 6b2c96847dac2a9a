/* numeric_int.h - private interface of numeric/: the vectorized kernels the
 * parameter server, the collective and the model add gradients with, the
 * canonical reduction tree, the thread pool with its spin barrier, the
 * optimizer's pooled and compare-and-swap forms and the numeric layer's profiling
 * counters. The model library (train/) and the layers above the numeric layer
 * include this; vars_int.h (included) is the variable store's. */
#ifndef KEEL_NUMERIC_INT_H
#define KEEL_NUMERIC_INT_H

#include <stddef.h>
#include <stdint.h>
#include <keel/tensor.h>
#include <keel/optimizer.h>

/* Hot elementwise loops: vectorized (O3) and cloned for AVX2/AVX-512 with
 * runtime dispatch. FMA contraction stays off so every clone computes the
 * same bits as the scalar code. (Makefile.am builds with -fno-math-errno,
 * without which no sqrtf loop is vectorized.) */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(KEEL_NO_CLONES)
#define KEEL__HOT \
    __attribute__((target_clones("avx512f", "avx2", "default")))
#define KEEL__VECTORIZE_FILE \
    _Pragma("GCC optimize(\"O3\", \"fp-contract=off\")")
#else
#define KEEL__HOT
#define KEEL__VECTORIZE_FILE
#endif

#include "vars_int.h"

/* ---- profiling: time of the numeric layer's work, collected only while
 * keel__prof_on (keel_train_profile_enable); keel_train_get_profile adds
 * these counters to the model's. Not thread-safe; for benchmarks. ---- */
typedef struct keel__core_prof {
    int64_t elementwise_ns;   /* keel__add_into, keel__zero_add_into */
    int64_t optimizer_ns;     /* keel_optimizer_apply* */
} keel__core_prof;
extern int keel__prof_on;
extern keel__core_prof keel__prof_core;
int64_t keel__prof_now(void);
#define KEEL__PROF_BEGIN() \
    int64_t prof_t0_ = keel__prof_on ? keel__prof_now() : 0
#define KEEL__CORE_PROF_END(field) \
    do { if (keel__prof_on) \
             keel__prof_core.field += keel__prof_now() - prof_t0_; } \
    while (0)

/* ---- kernels.c ---- */
/* dst += src. */
void keel__add_into(float *dst, const float *src, size_t count);
/* dst = 0 + src: the bits of zeroing dst and adding src (-0 becomes +0),
 * in one pass (a sum's first term). */
void keel__zero_add_into(float *dst, const float *src, size_t count);
/* dst[i] = (float)((w[0] * src[0][i] + ... + w[k-1] * src[k-1][i]) /
 * total): each product and sum in double, left to right, the quotient
 * rounded to double and then to float - per element the operations of
 * that scalar loop, so the same bits, in one pass over dst (k >= 1;
 * dst may not be one of the sources). */
void keel__weighted_mean_into(float *dst, const float *const *src,
                              const double *w, int k, double total,
                              size_t count);

/* ---- reduce_tree.c: the canonical reduction tree ---- */
/* The tree over leaves [0, n): a node [lo, hi) with two or more leaves
 * has the children [lo, mid) and [mid, hi), mid = lo + (hi - lo) / 2 (the
 * split depends on the node's size only, so a node's subtree is the tree
 * over that many leaves); the sum of the leaves is defined as its
 * children's sums added, each rounded alone. With R dividing n, R a power
 * of two, the R equal runs of leaves are nodes. A process that owns leaves
 * [lo, hi) sends the sums of the nodes that cover them (keel__tree_cover:
 * one node for such a run, about 2 log2(n) at most); whoever holds
 * the sums of nodes covering [0, n) completes the root with
 * keel__tree_sum, and gets the same bits however the leaves were
 * spread. */
#define KEEL__TREE_MAX_DEPTH 64
typedef struct keel__tree_node {
    int64_t lo, hi;               /* leaves [lo, hi) */
} keel__tree_node;
/* mid of node [lo, hi) (hi - lo >= 2). */
int64_t keel__tree_split(int64_t lo, int64_t hi);
/* The fewest nodes of the tree over [0, n) whose leaves are exactly
 * [lo, hi), left to right, into out (up to max): their count, or -1 on a
 * bad range or more than max nodes. */
int keel__tree_cover(int64_t n, int64_t lo, int64_t hi, keel__tree_node *out,
                     int max);
/* dst[lo, hi) = the root's sum over the tree of n leaves, where parts[i]
 * (k of them) holds the sum of nodes[i] and nodes[] are tree nodes
 * covering [0, n) left to right (keel__tree_cover of each owner's range,
 * concatenated). Elementwise, so threads may split [lo, hi) any way;
 * dst may be one of the parts. KEEL_EINVAL when nodes is not such a
 * cover. Allocation-free. */
keel_status keel__tree_sum(int64_t n, const keel__tree_node *nodes,
                           const float *const *parts, int k, float *dst,
                           size_t lo, size_t hi);

/* ---- pool.c: the model's persistent worker threads ---- */
#define KEEL__POOL_MAX 8
typedef struct keel__pool keel__pool;
/* fn(ctx, thread) runs once on each thread; thread 0 is the caller. */
typedef void (*keel__pool_fn)(void *ctx, int thread);
/* nthreads - 1 workers, parked until a run (fewer if creating one fails:
 * callers must not depend on the count). Caller owns *out. */
keel_status keel__pool_new(int nthreads, keel__pool **out);
/* Threads that take part in a run (the caller included); cannot fail. */
int keel__pool_threads(const keel__pool *p);
/* Run fn on every thread and wait for all (NULL pool: inline). */
void keel__pool_run(keel__pool *p, keel__pool_fn fn, void *ctx);
/* Stop and join the workers. NULL is a no-op. Cannot fail. */
void keel__pool_free(keel__pool *p);
/* A barrier for the n threads of one pool run (zeroed, then n set): they
 * spin, as the pool's threads do between runs. */
typedef struct keel__spin_barrier {
    _Atomic int count;
    _Atomic int phase;
    int n;
} keel__spin_barrier;
void keel__spin_barrier_wait(keel__spin_barrier *b);

/* ---- vars.c: the metric sums a step's gradients carry ---- */
/* A replica's step reports, with its gradients, the sums of its metrics
 * ("loss", "accuracy") and the examples each sum is over; a backend that
 * combines the step's replicas (the sync ps, the all-reduce) sets the
 * combined sums and each replica's, so every replica sees the cluster's
 * example-weighted means. The session fills `n`, `sum` and `count` before
 * the update and clears `n_replicas`; the backend sets the rest. */
#define KEEL__METRICS_MAX 4         /* metrics a step reports */
#define KEEL__METRICS_REPLICAS 64   /* replicas whose own sums are kept */
typedef struct keel__metrics {
    int n;                          /* metrics reported (0: none) */
    double sum[KEEL__METRICS_MAX];  /* this replica's sums */
    double count[KEEL__METRICS_MAX];
    /* combined by the backend: n_combined replicas (0: not combined),
     * their sums and counts added in ascending replica order */
    int n_combined;
    double total_sum[KEEL__METRICS_MAX];
    double total_count[KEEL__METRICS_MAX];
    /* the first n_kept (at most KEEL__METRICS_REPLICAS) of them, each
     * with its replica index */
    int n_kept;
    int replica[KEEL__METRICS_REPLICAS];
    double rsum[KEEL__METRICS_REPLICAS][KEEL__METRICS_MAX];
    double rcount[KEEL__METRICS_REPLICAS][KEEL__METRICS_MAX];
} keel__metrics;
/* g's metrics (never NULL for a non-NULL g; zeroed at keel_grads_new). */
keel__metrics *keel__grads_metrics(keel_grads *g);
/* Start a combination of the step's replicas in m (m->n metrics each). */
void keel__metrics_combine_begin(keel__metrics *m);
/* Add replica's m->n sums and counts to m's combination (in ascending
 * replica order: the sums' bits depend on the order). */
void keel__metrics_combine_add(keel__metrics *m, int replica,
                               const double *sum, const double *count);

/* Drop variable i's gradient rows (its dense gradient stays). */
void keel__grads_clear_rows(keel_grads *g, size_t i);

/* ---- optim.c ---- */
/* keel_optimizer_apply_and_zero with every variable element changed by
 * one compare-and-swap loop (Hogwild's CAS form); slots plain. */
keel_status keel__optimizer_apply_cas(keel_optimizer *o, keel_vars *vs,
                                      keel_grads *grads,
                                      int64_t global_step);
/* keel_optimizer_apply (zero: _and_zero) on the pool's threads (NULL: the
 * caller's): the same bits for any thread count. */
keel_status keel__optimizer_apply_pooled(keel_optimizer *o, keel_vars *vs,
                                         keel_grads *grads,
                                         int64_t global_step, int zero,
                                         keel__pool *pool);
/* keel__optimizer_apply_pooled in two parts, for a caller that runs the
 * dense updates inside its own pool run: _begin checks everything (a
 * failure changes nothing) and updates the variables with gradient rows;
 * then each of nthreads threads calls _part once with its index t, after
 * the gradients are final and nothing reads the variables any more. The
 * same bits as keel__optimizer_apply_pooled, for any nthreads. The
 * gradients' tensors must stay those of the _begin call. */
keel_status keel__optimizer_begin(keel_optimizer *o, keel_vars *vs,
                                  keel_grads *grads, int64_t global_step,
                                  int zero);
void keel__optimizer_part(keel_optimizer *o, int t, int nthreads);

#endif
