/* session_int.h - private to session/: the condition-variable helpers, the
 * run context, run values and named-value table of the hook chain
 * (chain.c), and what the session files share. Hooks see these only
 * through keel/hooks.h. Threads: a session is single-threaded (its alarm
 * thread, hook_calls.c, only raises a flag); the coordinator and the
 * manager's wait/notify are thread-safe. */
#ifndef KEEL_SESSION_INT_H
#define KEEL_SESSION_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <keel/session.h>
#include <keel/optimizer.h>
#include "../checkpoint/ckpt_ops.h"
#include "../numeric/vars_int.h"

/* A condition variable on CLOCK_MONOTONIC. */
void keel__cond_init_mono(pthread_cond_t *cv);
/* Wait until deadline_ns (monotonic; < 0: forever). 1 on timeout. */
int keel__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu,
                          int64_t deadline_ns);

/* The flag keel_coord_should_stop reads (valid while c lives): the step
 * path loads it without a call. */
const atomic_int *keel__coord_stop_flag(const keel_coord *c);

/* ---- the hook chain (chain.c) --------------------------------------------
 * Named step values: a fixed table, names kept across steps so the step
 * path never allocates. */
#define KEEL__VALUE_PTRS 4

typedef struct keel__value {
    char name[KEEL_VALUE_NAME_MAX];
    /* Callers' pointers recently used for this name (the step's literal,
     * each hook's own copy): the per-step lookups match on the pointer. */
    const char *ptrs[KEEL__VALUE_PTRS];
    unsigned next_ptr;
    double value;
    int64_t set_gen;          /* == values generation when set this step */
    /* keel_step_set_metric: the sum and count behind value, when
     * metric_gen == set_gen */
    int64_t metric_gen;
    double sum, count;
} keel__value;

typedef struct keel__values {
    keel__value v[KEEL_MAX_VALUES];
    size_t n;
    int64_t gen;
} keel__values;

/* Slot of name (adding it if is_add); -1 if absent or the table is full. */
int keel__values_slot(keel__values *t, const char *name, int is_add);
/* Slot of name, or -1; leaves t as it is (no pointer cache update). */
int keel__values_find(const keel__values *t, const char *name);

struct keel_run_context {
    keel_session *s;
    const void *batch;
    int has_batch;
    int is_stop_requested;
    const char *hook_name;          /* hook being called (for logs) */
    int64_t global_step;
    int requested[KEEL_MAX_VALUES]; /* slots */
    const char *requested_by[KEEL_MAX_VALUES];
    size_t n_requested;
    keel__values *values;
    int64_t n_skipped;              /* keel_run_context_skipped */
};

struct keel_run_values {
    int64_t step_before, step_after, local_step;
    int64_t start_ns, duration_ns;
    keel__values *values;
    /* keel_run_values_prev_step_before (set before each after_run) */
    int64_t prev_before;
    int has_prev_before;
    int64_t n_skipped;              /* keel_run_values_skipped */
};

/* Fill *w for h: "always" unless its wake callback says otherwise; returns
 * what the callback returns (1: ask again after calls), 0 without one. */
int keel__hook_get_wake(const keel_hook *h, keel_hook_wake *w);
/* 1 when h's after_run may read the step's start or duration. */
int keel__hook_reads_step_time(const keel_hook *h);
/* Off: every hook answers "always" (sessions made afterwards call every
 * hook every step, as before skipping existed). Test use only. */
void keel__session_set_skipping(int is_on);

/* Session internals used by supervise/ (training.c, supervisor.c). */
keel_status keel__session_new(const keel_session_config *cfg,
                              int is_recovering, keel_hook *owned,
                              size_t n_owned, keel_session **out);
/* Check a caller's backend: struct_size 0 (not from keel_backend_init or
 * a library getter), or outside the sizes this libkeel knows, is
 * KEEL_EINVAL naming the backend, prefixed with who. */
keel_status keel__backend_check(const keel_backend *be, const char *who);
/* Copy a checked backend (struct_size bytes; later members NULL). */
void keel__backend_copy(keel_backend *dst, const keel_backend *src);
/* Something the session frees after everything else at keel_session_free
 * (training.c: the optimizer and the cluster backend it made). */
void keel__session_set_cleanup(keel_session *s, void (*fn)(void *ctx),
                               void *ctx);

#endif
