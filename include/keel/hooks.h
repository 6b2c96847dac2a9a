/* keel/hooks.h - the hook chain: what user code can observe and veto around
 * every training step (TF1's SessionRunHook), the SecondOrStepTimer and the
 * standard hooks (logging, stop-at-step, checkpoints, NaN guard, step
 * counter, summaries, global-step waiter, final values, feeding, profiling).
 * Hooks run on the thread that runs the steps, in the order they were added,
 * and never free or re-enter their session. Docs: docs/session.md. */
#ifndef KEEL_HOOKS_H
#define KEEL_HOOKS_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/tensor.h>
#include <keel/checkpoint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_session keel_session;          /* session.h */
typedef struct keel_run_context keel_run_context;  /* one step, for hooks */
typedef struct keel_run_values keel_run_values;    /* one step's results */

/* Why a session ended; handed to every hook's end(). */
typedef enum keel_end_reason {
    KEEL_END_CLEAN = 0,       /* the caller closed the session */
    KEEL_END_OUT_OF_RANGE,    /* end of input: step or feed returned
                               * KEEL_EOUTOFRANGE */
    KEEL_END_STOP_REQUESTED,  /* a hook, listener or the coordinator */
    KEEL_END_ERROR,           /* a step, hook or creation failed */
    KEEL_END_SIGNAL           /* SIGTERM/SIGINT (see session.h) */
} keel_end_reason;

/* Static lowercase name of a reason ("signal"); never NULL. */
const char *keel_end_reason_name(keel_end_reason why);

/* ---- when a hook next needs to be called ---------------------------------
 * A hook may tell the session when its calls can next do something; the
 * session does not call it before then (docs/session.md, "Skipping idle
 * hooks"). Every field has a "no limit" value, and a hook without a wake
 * callback is called at every step. */
#define KEEL_WAKE_ALWAYS INT64_MIN
#define KEEL_WAKE_NEVER INT64_MAX

typedef struct keel_hook_wake {
    int64_t before_gs;    /* before_run does nothing while the global step
                           * before the step is < before_gs ... */
    int64_t before_iters; /* ... and fewer than this many steps (after_run
                           * chains reaching the hook) have started from
                           * now (KEEL_WAKE_NEVER: no limit) */
    int64_t after_gs;     /* after_run does nothing while the global step
                           * after the step is < after_gs ... */
    int64_t after_ns;     /* ... or, if not KEEL_WAKE_NEVER, until
                           * CLOCK_MONOTONIC reaches after_ns (a seconds
                           * timer on the real clock: the session's alarm
                           * says when, the hook still checks exactly) */
    int on_stall;         /* ... except after a step whose global step
                           * before equals that of the last step that
                           * reached the hook, or when there is none
                           * (keel_run_values_prev_step_before) */
    int after_needs_before; /* after_run does nothing in a step whose
                             * before_run was skipped */
} keel_hook_wake;

/* keel_hook.flags */
#define KEEL_HOOK_NO_STEP_TIME 1u  /* after_run never reads
                                    * keel_run_values_start_ns/duration_ns:
                                    * the session may skip the clock reads */

/* keel_hook.kind: which standard hook a constructor below built; hooks
 * built any other way leave it KEEL_HOOK_USER. */
typedef enum keel_hook_kind {
    KEEL_HOOK_USER = 0,
    KEEL_HOOK_LOGGING,
    KEEL_HOOK_STOP_AT_STEP,
    KEEL_HOOK_CHECKPOINT,
    KEEL_HOOK_NAN,
    KEEL_HOOK_STEP_COUNTER,
    KEEL_HOOK_SUMMARY,
    KEEL_HOOK_GLOBAL_STEP_WAITER,
    KEEL_HOOK_FINAL_OPS,
    KEEL_HOOK_FEED_FN,
    KEEL_HOOK_PROFILER
} keel_hook_kind;

/* A hook: function pointers plus a context. Start from keel_hook_init(),
 * then set the members you need; any member may be NULL. The session
 * copies the struct when it is added; name and ctx stay borrowed for the
 * session's life. Pointer arguments of the calls are borrowed for the
 * call. A non-OK return
 * stops the session; the caller sees KEEL_EHOOK (recoverable codes,
 * KEEL_EABORTED/KEEL_EUNAVAILABLE, are passed through so a MonitoredSession
 * re-creates itself; KEEL_ECANCELLED, a wait given up for a stop, is
 * passed through and ends the session as a stop, not an error). Call order: begin once; after_create_session after
 * every session (re)creation; before_run and after_run around every step
 * (after_run only for steps that succeeded); end once with the reason.
 * end's non-OK return (a final checkpoint that did not reach the disk)
 * does not stop the other hooks' end: keel_session_close returns the
 * first one, with its message. */
typedef struct keel_hook {
    uint32_t    struct_size;  /* set by keel_hook_init() */
    const char *name;         /* for logs: "checkpoint_saver"; borrowed */
    void       *ctx;          /* caller owns; must outlive the session */
    keel_status (*begin)(void *ctx);
    keel_status (*after_create_session)(void *ctx, keel_session *s);
    keel_status (*before_run)(void *ctx, keel_run_context *rc);
    keel_status (*after_run)(void *ctx, keel_run_context *rc,
                             const keel_run_values *v);
    keel_status (*end)(void *ctx, keel_session *s, keel_end_reason why);
    /* Frees ctx; called by keel_hook_release() only (sessions never call
     * it). Set by the built-in hook constructors below. */
    void        (*destroy)(void *ctx);
    /* Optional: fill *w (the session pre-fills "call at every step") with
     * when this hook's calls can next do something, from its own state
     * only. Return 1 when the answer changes with that state: the session
     * asks again after every call it makes to this hook and after
     * after_create_session; 0 when it never changes. A hook that skips
     * calls this way counts the steps it missed with
     * keel_run_context_skipped / keel_run_values_skipped. */
    int         (*wake)(const void *ctx, keel_hook_wake *w);
    uint32_t    flags;        /* KEEL_HOOK_NO_STEP_TIME, or 0 */
    uint32_t    kind;         /* keel_hook_kind */
} keel_hook;

/* Zero *h and set its struct_size: every member NULL, kind
 * KEEL_HOOK_USER. */
void keel_hook_init(keel_hook *h);

/* Free a built-in hook's context (h->destroy) and clear *h. NULL or a hook
 * without destroy is a no-op. Cannot fail. */
void keel_hook_release(keel_hook *h);

/* ---- run context and values --------------------------------------------- */

/* Request that the session stop after this step; every hook still sees
 * after_run of this step. why (copied) is logged with the hook's name.
 * On a cluster, where a stop-requesting hook belongs: in sync mode a
 * replica whose session ends by a stop request (or the end of its input)
 * stops the whole job at that step (docs/cluster.md, "Ending a sync job
 * early"): a hook in keel_training_config.session.hooks runs on every
 * replica and the first one to stop wins; in chief_only_hooks the chief
 * alone decides, from its own values. In async mode only the replica
 * that stopped ends; the chief's stop (and SHUTDOWN) ends the job. */
void keel_run_context_request_stop(keel_run_context *rc, const char *why);
/* 1 once any hook requested a stop in this step. */
int keel_run_context_stop_requested(const keel_run_context *rc);
/* Ask for the named value of this step (set by the step with
 * keel_step_set_value); call from before_run. The step must set it, else
 * the step fails with KEEL_ENOTFOUND naming the value and the hook. */
keel_status keel_run_context_request(keel_run_context *rc, const char *name);
/* Supply the step's batch (FeedFnHook). Supplying one when the caller or
 * another hook already did is KEEL_EINVAL. batch is borrowed until
 * after_run. */
keel_status keel_run_context_set_batch(keel_run_context *rc,
                                       const void *batch);
/* The session running the step (for keel_session_vars and such). */
keel_session *keel_run_context_session(keel_run_context *rc);
/* Global step before this step (what the step will see). */
int64_t keel_run_context_global_step(const keel_run_context *rc);
/* keel_run_context_request for a name in storage that stays in place and
 * unchanged while the hook lives (its own copy): *slot (-1 before the
 * first call; one per name) remembers where the session keeps the value,
 * so a call at every step compares one pointer instead of names. */
keel_status keel_run_context_request_fixed(keel_run_context *rc,
                                           const char *name, int *slot);
/* Steps this hook's wake let the session skip since it last called the
 * hook (0 for a hook without wake): a hook counting iterations adds them
 * first. */
int64_t keel_run_context_skipped(const keel_run_context *rc);

/* Global step before and after the step: hooks never need an extra read. */
int64_t keel_run_values_step_before(const keel_run_values *v);
int64_t keel_run_values_step_after(const keel_run_values *v);
/* Steps run by this session so far, counting this one (1 for the first). */
int64_t keel_run_values_local_step(const keel_run_values *v);
/* Monotonic duration of the step callback plus the update, in ns, and the
 * monotonic start time. */
int64_t keel_run_values_duration_ns(const keel_run_values *v);
int64_t keel_run_values_start_ns(const keel_run_values *v);
/* The named value set by the step in this step: 1 and *out, or 0 if the
 * step did not set it. */
int keel_run_values_find(const keel_run_values *v, const char *name,
                         double *out);
/* The named value, or NaN when it was not set. */
double keel_run_values_get(const keel_run_values *v, const char *name);
/* keel_run_values_find for a name and slot as with
 * keel_run_context_request_fixed. */
int keel_run_values_find_fixed(const keel_run_values *v, const char *name,
                               int *slot, double *out);
/* As keel_run_context_skipped, for after_run. */
int64_t keel_run_values_skipped(const keel_run_values *v);
/* For a hook whose wake sets on_stall: 1 and *out = the global step before
 * the last step whose after_run chain reached this hook in this session
 * (called or skipped); 0 when there is none or the wake does not set
 * on_stall. */
int keel_run_values_prev_step_before(const keel_run_values *v, int64_t *out);

/* ---- clocks and the SecondOrStepTimer ----------------------------------- */

/* A monotonic clock in nanoseconds; tests inject a fake one. fn NULL means
 * CLOCK_MONOTONIC. */
typedef struct keel_clock {
    int64_t (*fn)(void *ctx);
    void *ctx;
} keel_clock;

/* Read a clock (CLOCK_MONOTONIC when c or c->fn is NULL). */
int64_t keel_clock_now_ns(const keel_clock *c);

/* TF's SecondOrStepTimer: triggers every N seconds or every N steps. A value
 * type; no resources. */
typedef struct keel_timer {
    double every_secs;        /* > 0: time based */
    int64_t every_steps;      /* > 0: step based */
    int is_never;             /* NeverTriggerTimer */
    int is_triggered;         /* triggered at least once */
    int64_t last_step;
    int64_t last_ns;
    keel_clock clock;
} keel_timer;

/* Exactly one of every_secs > 0 / every_steps > 0, else KEEL_EINVAL
 * ("Either every_secs or every_steps should be provided." / "Can not
 * provide both ..."). clock may be NULL. */
keel_status keel_timer_init(keel_timer *t, double every_secs,
                            int64_t every_steps, const keel_clock *clock);
/* A timer that never triggers. Cannot fail. */
void keel_timer_init_never(keel_timer *t);
/* TF semantics: never triggered => 1; step == last triggered step => 0;
 * else secs: now >= last + every_secs; steps: step >= last + every_steps. */
int keel_timer_should_trigger(const keel_timer *t, int64_t step);
/* Record a trigger at step (now). Returns 0 on the first trigger, else 1
 * with the elapsed seconds and steps since the previous trigger (either
 * pointer may be NULL). */
int keel_timer_update(keel_timer *t, int64_t step, double *elapsed_secs,
                      int64_t *elapsed_steps);
/* Forget the last trigger. */
void keel_timer_reset(keel_timer *t);
/* The first step s for which keel_timer_should_trigger(t, s) can be 1:
 * KEEL_WAKE_NEVER for a NeverTriggerTimer, KEEL_WAKE_ALWAYS for a timer
 * that has not triggered yet or is time based (for keel_hook.wake). */
int64_t keel_timer_wake_step(const keel_timer *t);

/* ---- standard hooks -------------------------------------------------------
 * Each hook X has a config struct keel_X_hook_config, filled with its
 * defaults by keel_X_hook_config_init() (always call it first, then set the
 * members you need), and a constructor keel_X_hook_new(cfg, out). The
 * constructor validates the config (KEEL_EINVAL naming the member; the
 * struct and its strings are copied, pointers to callbacks' contexts are
 * borrowed), allocates the context and fills *out with a hook whose destroy
 * frees it: the caller owns it and calls keel_hook_release() after the
 * session is freed. A clock member with fn NULL is CLOCK_MONOTONIC. */

/* LoggingTensorHook: logs "name = value, ... (0.123 sec)" for the named
 * values every every_n_iter local iterations or every every_n_secs (exactly
 * one), and/or at_end with the last values seen. */
typedef struct keel_logging_hook_config {
    uint32_t struct_size;     /* set by keel_logging_hook_config_init() */
    const char *const *names; /* 1..16 value names; default none */
    size_t n_names;
    int64_t every_n_iter;     /* default 0 (unset) */
    double every_n_secs;      /* default 0 (unset) */
    int at_end;               /* default 0 */
    keel_clock clock;
} keel_logging_hook_config;
void keel_logging_hook_config_init(keel_logging_hook_config *cfg);
keel_status keel_logging_hook_new(const keel_logging_hook_config *cfg,
                                  keel_hook *out);

/* StopAtStepHook: exactly one of num_steps (relative to the global step at
 * the first session creation of this hook; a new process recomputes it from
 * the restored step) or last_step (absolute, restart safe). Stops after the
 * step that brings the global step to >= last_step. */
typedef struct keel_stop_at_step_hook_config {
    uint32_t struct_size;     /* set by keel_stop_at_step_hook_config_init() */
    int64_t num_steps;        /* default 0 (unset) */
    int64_t last_step;        /* default 0 (unset) */
} keel_stop_at_step_hook_config;
void keel_stop_at_step_hook_config_init(keel_stop_at_step_hook_config *cfg);
keel_status keel_stop_at_step_hook_new(
    const keel_stop_at_step_hook_config *cfg, keel_hook *out);

/* CheckpointSaverListener. Any member may be NULL. after_save setting
 * *should_stop to 1 makes the hook request a stop; its step is the saved
 * checkpoint's (the one in path), which differs from before_save's when
 * the session's backend brought a newer shared global step in before the
 * save (keel_session_prepare_save). */
typedef struct keel_ckpt_listener {
    void *ctx;
    keel_status (*begin)(void *ctx);
    keel_status (*before_save)(void *ctx, keel_session *s, int64_t step);
    keel_status (*after_save)(void *ctx, keel_session *s, int64_t step,
                              const char *path, int *should_stop);
    void (*end)(void *ctx, keel_session *s, int64_t step);
} keel_ckpt_listener;

/* CheckpointSaverHook: saves at every session creation, whenever its timer
 * triggers (exactly one of save_secs / save_steps) and at end (if the last
 * step was not already saved; on KEEL_END_ERROR only with save_on_error).
 * Never saves twice for one step. dir NULL uses the session's own saver
 * (its checkpoint_dir); otherwise the hook opens its own saver on dir with
 * saver_cfg (NULL: defaults). Metadata blobs come from the session's
 * meta_fn. */
typedef struct keel_ckpt_hook_config {
    uint32_t struct_size;     /* set by keel_ckpt_hook_config_init() */
    const char *dir;          /* default NULL: the session's saver */
    const keel_saver_config *saver_cfg;   /* default NULL */
    double save_secs;         /* default 0 (unset) */
    int64_t save_steps;       /* default 0 (unset) */
    const keel_ckpt_listener *listeners;
    size_t n_listeners;       /* <= 8; copied; default 0 */
    int save_on_error;        /* default 0 */
    keel_clock clock;
} keel_ckpt_hook_config;
void keel_ckpt_hook_config_init(keel_ckpt_hook_config *cfg);
keel_status keel_ckpt_hook_new(const keel_ckpt_hook_config *cfg,
                               keel_hook *out);
/* Saves this hook made so far (not counting a save of the checkpoint the
 * saver already had, such as the one just restored, which writes nothing),
 * and the step of its last save (-1). */
int64_t keel_ckpt_hook_save_count(const keel_hook *h);
int64_t keel_ckpt_hook_last_step(const keel_hook *h);

/* NanTensorHook: checks the named value after each step; NaN (and +-Inf
 * with fail_on_inf) either fails the step (fail_on_nan: KEEL_EHOOK "NaN
 * loss during training") or requests a stop. */
typedef struct keel_nan_hook_config {
    uint32_t struct_size;     /* set by keel_nan_hook_config_init() */
    const char *name;         /* default "loss" */
    int fail_on_nan;          /* default 1 */
    int fail_on_inf;          /* default 0 */
} keel_nan_hook_config;
void keel_nan_hook_config_init(keel_nan_hook_config *cfg);
keel_status keel_nan_hook_new(const keel_nan_hook_config *cfg,
                              keel_hook *out);

/* StepCounterHook: "global_step/sec" every every_n_steps or every_n_secs
 * (exactly one), logged and written as a scalar to the events writer in
 * output_dir (NULL: log only). */
typedef struct keel_step_counter_hook_config {
    uint32_t struct_size;     /* set by keel_step_counter_hook_config_init() */
    int64_t every_n_steps;    /* default 100 */
    double every_n_secs;      /* default 0 (unset) */
    const char *output_dir;   /* default NULL */
    keel_clock clock;
} keel_step_counter_hook_config;
void keel_step_counter_hook_config_init(keel_step_counter_hook_config *cfg);
keel_status keel_step_counter_hook_new(
    const keel_step_counter_hook_config *cfg, keel_hook *out);

/* SummarySaverHook: writes the named step values as TensorBoard scalars to
 * output_dir every save_steps or save_secs (exactly one). */
typedef struct keel_summary_hook_config {
    uint32_t struct_size;     /* set by keel_summary_hook_config_init() */
    const char *const *names; /* 1..16 value names; default none */
    size_t n_names;
    int64_t save_steps;       /* default 0 (unset) */
    double save_secs;         /* default 0 (unset) */
    const char *output_dir;   /* required; default NULL */
    keel_clock clock;
} keel_summary_hook_config;
void keel_summary_hook_config_init(keel_summary_hook_config *cfg);
keel_status keel_summary_hook_new(const keel_summary_hook_config *cfg,
                                  keel_hook *out);

/* GlobalStepWaiterHook: the first before_run blocks until the shared
 * global step (keel_session_read_shared_step: on a cluster worker the
 * parameter servers') reaches wait_until_step (<= 0: no wait), re-checking
 * every poll_ms and giving up at once (KEEL_ECANCELLED) on a coordinator
 * stop or signal; then the local copy is refreshed from the shared state
 * (keel_session_refresh) and the step runs at that step. Backend errors are
 * returned as they are (recoverable ones recover the session, and the wait
 * starts again). */
typedef struct keel_global_step_waiter_hook_config {
    /* set by keel_global_step_waiter_hook_config_init() */
    uint32_t struct_size;
    int64_t wait_until_step;  /* default 0 (no wait) */
    int poll_ms;              /* > 0; default 50 */
} keel_global_step_waiter_hook_config;
void keel_global_step_waiter_hook_config_init(
    keel_global_step_waiter_hook_config *cfg);
keel_status keel_global_step_waiter_hook_new(
    const keel_global_step_waiter_hook_config *cfg, keel_hook *out);

/* FinalOpsHook: at end, calls fn once (e.g. to compute eval metrics) and
 * keeps the double it returns; read with keel_final_ops_hook_value. */
typedef struct keel_final_ops_hook_config {
    uint32_t struct_size;     /* set by keel_final_ops_hook_config_init() */
    /* required; default NULL */
    keel_status (*fn)(void *ctx, keel_session *s, double *value);
    void *ctx;                /* borrowed: outlives the hook; default NULL */
} keel_final_ops_hook_config;
void keel_final_ops_hook_config_init(keel_final_ops_hook_config *cfg);
keel_status keel_final_ops_hook_new(const keel_final_ops_hook_config *cfg,
                                    keel_hook *out);
/* 1 and *value once the final op ran successfully, else 0. */
int keel_final_ops_hook_value(const keel_hook *h, double *value);

/* FeedFnHook: before every step, fn supplies the batch. global_step is
 * the global step before this step (what the step will see): a feeder
 * that derives its batch from it (and, on a cluster, from
 * keel_cluster_spec_replica_index) resumes at the right data after a
 * restore or a restart. fn returning KEEL_EOUTOFRANGE ends the input (the
 * session ends with KEEL_END_OUT_OF_RANGE). */
typedef struct keel_feed_fn_hook_config {
    uint32_t struct_size;     /* set by keel_feed_fn_hook_config_init() */
    /* required; default NULL. *batch is borrowed until after_run. */
    keel_status (*fn)(void *ctx, int64_t global_step, const void **batch);
    void *ctx;                /* borrowed: outlives the hook; default NULL */
} keel_feed_fn_hook_config;
void keel_feed_fn_hook_config_init(keel_feed_fn_hook_config *cfg);
keel_status keel_feed_fn_hook_new(const keel_feed_fn_hook_config *cfg,
                                  keel_hook *out);

/* ProfilerHook: per-step timing (step callback + update) as Chrome trace
 * JSON (chrome://tracing, Perfetto) in <output_dir>/timeline.json, one
 * complete event per traced step, every save_steps or save_secs (exactly
 * one). The file is closed (valid JSON) at end. */
typedef struct keel_profiler_hook_config {
    uint32_t struct_size;     /* set by keel_profiler_hook_config_init() */
    int64_t save_steps;       /* default 0 (unset) */
    double save_secs;         /* default 0 (unset) */
    const char *output_dir;   /* required; default NULL */
    keel_clock clock;
} keel_profiler_hook_config;
void keel_profiler_hook_config_init(keel_profiler_hook_config *cfg);
keel_status keel_profiler_hook_new(const keel_profiler_hook_config *cfg,
                                   keel_hook *out);

#ifdef __cplusplus
}
#endif
#endif
