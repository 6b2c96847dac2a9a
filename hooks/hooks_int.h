/* hooks_int.h - private to hooks/ and session/: the checkpoint call table
 * (tests swap in an in-memory fake to count saves without HDF5) and the
 * run-context internals shared by the session and the hook chain. */
#ifndef KEEL_HOOKS_INT_H
#define KEEL_HOOKS_INT_H

#include <keel/session.h>

typedef struct keel__ckpt_ops {
    keel_status (*saver_new)(const keel_saver_config *cfg, keel_saver **out);
    keel_status (*saver_save)(keel_saver *s, const keel_vars *vs,
                              const keel_ckpt_meta *meta, char *path,
                              size_t path_size);
    keel_status (*saver_wait)(keel_saver *s);
    void (*saver_free)(keel_saver *s);
    keel_status (*latest)(const char *dir, const char *basename, char *path,
                          size_t path_size, int64_t *step);
    keel_status (*restore)(const char *path, keel_vars *vs,
                           const keel_restore_opts *opts,
                           keel_restore_report *report);
    keel_status (*restore_latest)(const char *dir, const char *basename,
                                  keel_vars *vs,
                                  const keel_restore_opts *opts,
                                  keel_restore_report *report, char *path,
                                  size_t path_size);
    keel_status (*read_info)(const char *path, keel_ckpt_info **out);
    void (*info_free)(keel_ckpt_info *info);
} keel__ckpt_ops;

extern const keel__ckpt_ops *keel__ckpt;          /* current table */
extern const keel__ckpt_ops keel__ckpt_default;   /* checkpoint/ */
/* Install ops (NULL restores the default). Test use only. */
void keel__ckpt_set_ops(const keel__ckpt_ops *ops);

/* Named step values: a fixed table, names kept across steps so the step
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
} keel__value;

typedef struct keel__values {
    keel__value v[KEEL_MAX_VALUES];
    size_t n;
    int64_t gen;
} keel__values;

/* Slot of name (adding it if is_add); -1 if absent or the table is full. */
int keel__values_slot(keel__values *t, const char *name, int is_add);

/* keel__values_slot(t, name, 1) for a name in a buffer that does not
 * change while it is in use (a built-in hook's own copy): a slot whose
 * pointers include name holds that name, so *hint (the slot last found,
 * -1 at first) is checked by pointer alone. */
static inline int
keel__values_slot_fixed(keel__values *t, const char *name, int *hint)
{
    int k, h = *hint;
    if (h >= 0 && (size_t)h < t->n)
        for (k = 0; k < KEEL__VALUE_PTRS; k++)
            if (t->v[h].ptrs[k] == name)
                return h;
    h = keel__values_slot(t, name, 1);
    if (h >= 0)
        *hint = h;
    return h;
}

/* The value the step set in slot this step: 1 and *out, or 0 (no slot,
 * or not set this step). */
static inline int
keel__values_this_step(const keel__values *t, int slot, double *out)
{
    if (slot < 0 || t->v[slot].set_gen != t->gen)
        return 0;
    *out = t->v[slot].value;
    return 1;
}

/* keel_run_context_request of a slot already found. */
keel_status keel__run_context_request_slot(keel_run_context *rc, int slot,
                                           const char *name);

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
    /* after_run calls of the hook being called that the session skipped
     * since it last called the hook (0 unless its wake is dynamic): a hook
     * that counts iterations (LoggingTensorHook) adds them first. */
    int64_t n_skipped;
};

struct keel_run_values {
    int64_t step_before, step_after, local_step;
    int64_t start_ns, duration_ns;
    keel__values *values;
    /* For a hook whose wake has on_stall (set by the session before each
     * after_run): step_before of the last step whose after_run chain
     * reached this hook in this session, called or skipped;
     * has_prev_before 0 when there is none (first step of the session)
     * or the hook does not watch for stalls (it keeps its own). */
    int64_t prev_before;
    int has_prev_before;
    int64_t n_skipped;      /* as keel_run_context's, for after_run */
};

/* 1 when h's after_run may read the step's start or duration
 * (keel_run_values_start_ns/duration_ns): any hook keel did not build, and
 * the profiler. The session reads the clock around the step only when some
 * hook needs it. Per-file answers for the built-in hooks: */
/* keel_timer_should_trigger, with the common case (a step-based timer
 * that has triggered before) inline: the standard hooks ask four times a
 * step. */
static inline int
keel__timer_due(const keel_timer *t, int64_t step)
{
    if (t->every_secs <= 0 && !t->is_never && t->is_triggered)
        return step != t->last_step && step >= t->last_step + t->every_steps;
    return keel_timer_should_trigger(t, step);
}

/* ---- skipping calls that would do nothing --------------------------------
 * A built-in hook whose before_run / after_run do nothing until some global
 * step says so; the session skips those calls (docs/session.md, "Skipping
 * idle hooks"). The answer is a function of the hook's state, which
 * changes only in its own calls: the session asks again after every call
 * it makes and after after_create_session. Any other hook, a time-based
 * or fake-clock timer and a per-step duty (NaN check, at_end logging)
 * answer "always". */
#define KEEL__WAKE_ALWAYS INT64_MIN
#define KEEL__WAKE_NEVER INT64_MAX

typedef struct keel__hook_wake {
    int64_t before_gs;  /* before_run is a no-op while the global step
                         * before the step is < before_gs ... */
    int64_t before_iters; /* ... and fewer than this many after_run chains
                           * reaching the hook have started from now
                           * (KEEL__WAKE_NEVER: no limit) */
    int64_t after_gs;   /* after_run is a no-op while step_after < after_gs
                         * ... */
    int64_t after_ns;   /* ... or, if not KEEL__WAKE_NEVER, until
                         * CLOCK_MONOTONIC reaches after_ns (a time-based
                         * timer on the real clock; the session's alarm
                         * says when, the hook still checks exactly) */
    int on_stall;       /* ...except after a step whose step_before equals
                         * prev_before (StepCounter's "global step has not
                         * been increased"), or when there is no prev */
    int after_needs_before; /* after_run is a no-op in a step whose
                             * before_run was skipped */
} keel__hook_wake;

/* First step s for which keel__timer_due(t, s) can be 1: KEEL__WAKE_NEVER
 * for a NeverTriggerTimer, KEEL__WAKE_ALWAYS for a timer that has not
 * triggered yet or is time based (its clock is read by the hook). */
static inline int64_t
keel__timer_wake(const keel_timer *t)
{
    if (t->is_never)
        return KEEL__WAKE_NEVER;
    if (t->every_secs > 0 || !t->is_triggered || t->every_steps <= 0)
        return KEEL__WAKE_ALWAYS;
    // due <=> step != last && step >= last + every (every >= 1)
    if (t->last_step > INT64_MAX - t->every_steps)
        return KEEL__WAKE_NEVER;
    return t->last_step + t->every_steps;
}

/* Fill *w for h (always-call for hooks keel did not build); returns 1 when
 * the answer can change with the hook's state (ask again after calls), 0
 * when it never will (other hooks, time-based timers). */
int keel__hook_get_wake(const keel_hook *h, keel__hook_wake *w);
/* Off: every hook answers "always" (sessions made afterwards call every
 * hook every step, as before skipping existed). Test use only. */
void keel__hooks_set_skipping(int is_on);
int keel__basic_hook_wake(const keel_hook *h, keel__hook_wake *w);
int keel__summary_hook_wake(const keel_hook *h, keel__hook_wake *w);
int keel__ckpt_hook_wake(const keel_hook *h, keel__hook_wake *w);

int keel__hook_reads_step_time(const keel_hook *h);
int keel__basic_hook_is_timeless(const keel_hook *h);
int keel__summary_hook_is_timeless(const keel_hook *h);
int keel__ckpt_hook_is_timeless(const keel_hook *h);

#endif
