/* keel/session.h - the session layer: the train step as a C callback, the
 * updater and backend seams, Scaffold, SessionManager and session creators,
 * MonitoredSession (recovering), SingularMonitoredSession, Coordinator with
 * looper threads and preemption-safe signal handling (MonitoredTrainingSession
 * and the Supervisor, built on these: keel/supervise.h). TF1 tf.train
 * semantics with the fixes listed in docs/session.md. A session is used by
 * one thread at a time (the coordinator is thread-safe). */
#ifndef KEEL_SESSION_H
#define KEEL_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/tensor.h>
#include <keel/checkpoint.h>
#include <keel/hooks.h>
#include <keel/optimizer.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_MAX_VALUES 64          /* distinct named step values */
#define KEEL_VALUE_NAME_MAX 64      /* bytes, including the NUL */

/* ---- the step ----------------------------------------------------------- */

typedef struct keel_step keel_step;

/* A user's train step: read vars and the batch, write gradients and named
 * values. KEEL_OK: the session applies the update (unless the step marked
 * it applied) and advances the global step. KEEL_EOUTOFRANGE: end of input.
 * KEEL_EABORTED/KEEL_EUNAVAILABLE: recoverable (retried after re-creating
 * the session). Anything else fails the step. */
typedef keel_status (*keel_step_fn)(void *ctx, keel_step *st);

/* The variable store (borrowed for the call). */
keel_vars *keel_step_vars(keel_step *st);
/* The batch supplied by keel_session_run's caller or a FeedFnHook; NULL if
 * none. */
const void *keel_step_batch(const keel_step *st);
/* Gradients for the store's trainable variables, zeroed before each step
 * (unless the config's skip_grad_zeroing). */
keel_grads *keel_step_grads(keel_step *st);
/* Global step before this step. */
int64_t keel_step_global_step(const keel_step *st);
/* Set a named value ("loss") that hooks can read; name (copied) is at most
 * KEEL_VALUE_NAME_MAX-1 bytes; KEEL_ENOMEM past KEEL_MAX_VALUES names.
 * Allocation-free. */
keel_status keel_step_set_value(keel_step *st, const char *name, double v);
/* Set a metric: the named value sum / count, the mean over count (>= 1)
 * examples (the loss summed over the step's examples, the correct
 * predictions). Where the step's replicas are combined - in-process
 * replicas (keel_session_config.replicas), the parameter servers in sync
 * mode, multi_worker_mirrored's all-reduce - every replica's hooks see,
 * under name, the example-weighted mean over every replica of the step
 * (the replicas' sums added in ascending replica order, divided by their
 * counts added), as tf.distribute's strategy.reduce(MEAN) does; and under
 * "<name>/replica_<i>" replica i's own mean, for i below
 * KEEL_METRIC_REPLICAS_NAMED (a cluster's replicas, by task: the chief is
 * replica 0). Elsewhere (one process, async mode) name is this
 * replica's own mean. At most KEEL_MAX_METRICS a step (KEEL_ENOMEM);
 * KEEL_EINVAL for count < 1. docs/session.md, "Metrics". */
#define KEEL_MAX_METRICS 4
#define KEEL_METRIC_REPLICAS_NAMED 16
keel_status keel_step_set_metric(keel_step *st, const char *name,
                                 double sum, int64_t count);
/* The step applied its own update (K-FAC, ...): the session will not call
 * the updater; it still advances the global step unless the step set it. */
void keel_step_mark_applied(keel_step *st);
/* With keel_session_config.replicas R > 1 the session runs the step on R
 * threads at once, one call per replica: this call's replica (0..R-1) and
 * R (1 and 1 otherwise). Replica r trains its own slice of the batch,
 * examples [r*n/R, (r+1)*n/R) of an n-example batch, into its own
 * gradient store (keel_step_grads); it must not write the variables. */
int keel_step_replica(const keel_step *st);
int keel_step_num_replicas(const keel_step *st);

/* How gradients reach the variables. The session calls apply after each
 * successful step with the global step before the step. If apply leaves
 * keel_vars_global_step(vs) unchanged the session increments it; if apply
 * sets it (a parameter-server updater reporting the shared step), that value
 * is kept. */
typedef enum keel_updater_kind {
    KEEL_UPDATER_CUSTOM = 0,    /* apply is the caller's (zero-initialized) */
    KEEL_UPDATER_OPTIMIZER,     /* keel_optimizer_updater's: ctx is the
                                 * keel_optimizer, which the session may
                                 * run on its replicas' threads */
    KEEL_UPDATER_ROWS           /* apply reads gradient rows itself
                                 * (keel_grads_rows; the cluster backend
                                 * pushes them as rows): the session does
                                 * not add them into the dense gradients
                                 * first, as it does for a custom one */
} keel_updater_kind;

typedef struct keel_updater {
    void *ctx;
    keel_status (*apply)(void *ctx, keel_vars *vs, keel_grads *grads,
                         int64_t global_step);
    /* Set by the constructor (keel_optimizer_updater); an updater the
     * caller fills is KEEL_UPDATER_CUSTOM, the zero value. */
    keel_updater_kind kind;
} keel_updater;

/* An updater that applies one of keel's optimizers
 * (keel_optimizer_apply: the learning rate and bias correction of the
 * step's global step). opt is borrowed: it outlives every session the
 * updater is given to, and its slots exist (keel_optimizer_prepare on the
 * session's store) before the first step. Cannot fail. */
keel_updater keel_optimizer_updater(keel_optimizer *opt);

/* ---- scaffold ----------------------------------------------------------- */

/* What to run to make the model ready (TF's Scaffold). A NULL member means
 * "none" (as TF's None): ready NULL means always ready. Fill it with
 * keel_scaffold_init() (TF's default behaviour and saver settings) before
 * changing members; a scaffold (or its saver) that keel_scaffold_init did
 * not fill is refused (KEEL_EINVAL naming keel_scaffold_init). */
typedef struct keel_scaffold {
    uint32_t struct_size;     /* set by keel_scaffold_init() */
    void *ctx;
    /* Global init: runs only when nothing was restored. */
    keel_status (*init)(void *ctx, keel_vars *vs);
    /* After init, only when nothing was restored (e.g. warm start). */
    keel_status (*init_fn)(void *ctx, keel_vars *vs);
    /* Names of what is not ready into missing (comma separated), count in
     * *n_missing; 0 means ready. */
    keel_status (*ready)(void *ctx, const keel_vars *vs, char *missing,
                         size_t size, size_t *n_missing);
    /* The gate for local_init (global state ready). */
    keel_status (*ready_for_local_init)(void *ctx, const keel_vars *vs,
                                        char *missing, size_t size,
                                        size_t *n_missing);
    /* Per-process state; must be idempotent (may run more than once). */
    keel_status (*local_init)(void *ctx, keel_vars *vs);
    /* Checkpoint settings (dir ignored: the session's checkpoint_dir). */
    keel_saver_config saver;
} keel_scaffold;

/* TF's defaults: init marks every non-local variable initialized (their
 * current contents are the initial values), ready reports every
 * uninitialized variable (keel_vars_uninitialized), ready_for_local_init
 * reports uninitialized non-local variables, local_init marks local
 * variables initialized; saver defaults. Cannot fail. */
void keel_scaffold_init(keel_scaffold *sc);

/* ---- backend ------------------------------------------------------------ */

/* Where shared state lives. NULL (or NULL members) means local: this
 * process's variable store is the shared state. The cluster supplies a
 * parameter-server backend. */
typedef struct keel_backend {
    uint32_t struct_size;     /* set by keel_backend_init() */
    const char *name;         /* "local", "ps" */
    void *ctx;
    keel_updater updater;     /* apply NULL: the session config's updater */
    /* Chief, after restore/init and the ready check: publish the state and
     * announce readiness (restored: 1 if it came from a checkpoint). */
    keel_status (*publish)(void *ctx, keel_vars *vs, int restored);
    /* Chief recovery: 1 in *is_intact when the shared state survived, so
     * the manager skips the checkpoint restore (no rollback). */
    keel_status (*is_intact)(void *ctx, keel_vars *vs, int *is_intact);
    /* Worker: refresh the local copy of shared state; 1 in *is_ready when
     * the chief has made it ready (why: what is missing). NULL: the
     * scaffold's ready check on the local store. */
    keel_status (*fetch)(void *ctx, keel_vars *vs, int *is_ready, char *why,
                         size_t why_size);
    /* Block until shared state may have changed or the monotonic deadline
     * passes (KEEL_OK either way). NULL: a condition variable woken by
     * keel_session_manager_notify(), timing out after the retry
     * interval. */
    keel_status (*wait_for_change)(void *ctx, int64_t deadline_ns);
    /* The chief, before every checkpoint save (keel_session_prepare_save):
     * bring the shared state (variables, slots, global step) into vs.
     * NULL: vs is the state. */
    keel_status (*before_save)(void *ctx, keel_vars *vs);
    /* The session closed (after the hooks' end and the final checkpoint),
     * why: the end reason. The cluster backend's chief stops the ps here
     * unless the reason is KEEL_END_ERROR. NULL: nothing. */
    void (*end)(void *ctx, keel_vars *vs, int is_chief,
                keel_end_reason why);
    /* Worker: the shared global step in *step, leaving the local copy as
     * it is (one small request; what GlobalStepWaiterHook polls). NULL:
     * keel_session_read_shared_step refreshes through fetch instead. */
    keel_status (*read_global_step)(void *ctx, int64_t *step);
    /* The chief's checkpoint write, after before_save and in place of
     * keel_saver_save(saver, vs, meta, path, path_size) (the arguments
     * borrowed for the call): the cluster backend's sharded checkpoints
     * (every ps writes its shard, then the index). NULL: keel_saver_save. */
    keel_status (*save)(void *ctx, keel_saver *saver, keel_vars *vs,
                        const keel_ckpt_meta *meta, char *path,
                        size_t path_size);
} keel_backend;
/* A struct_size that ends before before_save (a backend compiled before
 * those members existed) is accepted: the missing members are NULL. 0
 * (not filled by keel_backend_init or a getter such as
 * keel_cluster_backend_session_backend) is KEEL_EINVAL naming the backend. */
/* All members NULL (local), struct_size set. Cannot fail. */
void keel_backend_init(keel_backend *be);

/* ---- session manager and creators --------------------------------------- */

typedef struct keel_session_manager keel_session_manager;

typedef struct keel_session_manager_config {
    uint32_t struct_size;     /* set by keel_session_manager_config_init() */
    keel_vars *vars;                  /* borrowed; required */
    const keel_scaffold *scaffold;    /* copied; NULL: keel_scaffold_init */
    const char *checkpoint_dir;       /* NULL: never restore */
    const keel_restore_config *restore_config; /* copied; NULL: strict */
    const keel_backend *backend;      /* copied; NULL: local */
    int recovery_wait_ms;             /* worker retry; default (and 0) 50 */
    /* After every restore: the checkpoint's metadata with blobs (data
     * iterator, RNG state), borrowed for the call. */
    keel_status (*restore_fn)(void *ctx, const keel_ckpt_info *info);
    void *restore_ctx;
    /* Warm start (TF's WarmStartSettings): a new run that starts from
     * another run's checkpoint. Only when checkpoint_dir holds no
     * checkpoint of its own: after init and init_fn, the variables whose
     * whole names match warm_start_vars are restored by name from
     * warm_start_from (a checkpoint file, or a directory: its newest
     * valid checkpoint); those it lacks keep their initial values;
     * optimizer slots, the global step and restore_fn's metadata start
     * fresh. A checkpoint_dir that holds a checkpoint resumes that run
     * and the warm start is not applied (logged): a restarted warm-started
     * run continues from its own checkpoints. warm_start_from in
     * checkpoint_dir itself, a warm start without checkpoint_dir, a
     * warm_start_from without a checkpoint, and one whose variables match
     * none of the model's are KEEL_EINVAL. */
    const char *warm_start_from;      /* copied; NULL: no warm start */
    const char *warm_start_vars;      /* copied; POSIX extended regex;
                                       * NULL: every variable */
} keel_session_manager_config;

/* The defaults above; vars NULL. Cannot fail. */
void keel_session_manager_config_init(keel_session_manager_config *cfg);

keel_status keel_session_manager_new(const keel_session_manager_config *cfg,
                                     keel_session_manager **out);
void keel_session_manager_free(keel_session_manager *sm);

/* Chief: restore the newest valid checkpoint (falling back past corrupt
 * ones), else init + init_fn (error if the scaffold has no init, init_fn
 * or local_init); then local_init (gated by ready_for_local_init: "Init
 * operations did not make model ready for local_init"); then ready ("Init
 * operations did not make model ready: <names>"), then backend publish.
 * *restored (may be NULL) says whether a checkpoint was used. On a
 * re-creation with is_recovery and a backend reporting intact state the
 * restore is skipped. */
keel_status keel_session_manager_prepare(keel_session_manager *sm,
                                         int is_recovery, int *restored);
/* Worker: until max_wait_secs (<= 0: forever) passes, fetch shared state,
 * run local_init when ready_for_local_init passes, return once ready;
 * between attempts wait for a change (event) or the retry interval. Logs
 * "Waiting for model to be ready ...". KEEL_ETIMEOUT at the deadline,
 * KEEL_ECANCELLED after keel_session_manager_cancel(). */
keel_status keel_session_manager_wait(keel_session_manager *sm,
                                      double max_wait_secs);
/* TF recover_session: restore if possible and local init; *is_ready 1 only
 * when a checkpoint was restored and the model is ready. Never inits. */
keel_status keel_session_manager_recover(keel_session_manager *sm,
                                         int *is_ready);
/* Wake waiters (readiness may have changed). Thread-safe. */
void keel_session_manager_notify(keel_session_manager *sm);
/* Make current and future waits return KEEL_ECANCELLED. Thread-safe. */
void keel_session_manager_cancel(keel_session_manager *sm);

/* How a session gets ready state, at start and after every recovery. */
typedef struct keel_session_creator {
    void *ctx;
    keel_status (*create)(void *ctx, int is_recovery);
} keel_session_creator;
/* Chief creator: keel_session_manager_prepare. sm borrowed. */
keel_session_creator keel_chief_creator(keel_session_manager *sm);
/* Worker creator: keel_session_manager_wait with the manager's
 * max_wait_secs set by keel_session_manager_set_max_wait (default 300). */
keel_session_creator keel_worker_creator(keel_session_manager *sm);
void keel_session_manager_set_max_wait(keel_session_manager *sm,
                                       double max_wait_secs);

/* ---- coordinator -------------------------------------------------------- */

typedef struct keel_coord keel_coord;

keel_status keel_coord_new(keel_coord **out);
/* Joins remaining registered threads (blocks until they exit). */
void keel_coord_free(keel_coord *c);
/* Request a stop. The first non-OK status (and its message) is kept; later
 * ones are ignored. Wakes every waiter at once. Thread-safe. */
void keel_coord_request_stop(keel_coord *c, keel_status error,
                             const char *why);
int keel_coord_should_stop(keel_coord *c);
/* Wait up to timeout_ms (< 0: forever) for a stop; 1 if stopped. */
int keel_coord_wait_for_stop(keel_coord *c, int64_t timeout_ms);
/* The first recorded error (KEEL_OK if none) and its message (msg may be
 * NULL). */
keel_status keel_coord_error(keel_coord *c, char *msg, size_t size);
/* Reset the stop flag and recorded error (threads must be joined). */
void keel_coord_clear_stop(keel_coord *c);
/* Start a registered thread running fn(arg, c); a non-OK return requests a
 * stop with that error. name copied. */
keel_status keel_coord_start_thread(keel_coord *c, const char *name,
                                    keel_status (*fn)(void *arg,
                                                      keel_coord *c),
                                    void *arg);
/* A looper thread: calls fn at once, then every interval_ms on fixed
 * boundaries (no drift; overruns catch up), until stop; interval_ms 0:
 * back to back. Wakes at once on a stop. */
keel_status keel_coord_start_looper(keel_coord *c, const char *name,
                                    int64_t interval_ms,
                                    keel_status (*fn)(void *arg),
                                    void *arg);
/* Wait until every registered thread exited or a stop was requested, then
 * up to grace_ms more for the rest. Stragglers: KEEL_ETIMEOUT naming them
 * (logged instead with ignore_live_threads; they are joined at free).
 * Returns the recorded error in preference. */
keel_status keel_coord_join(keel_coord *c, int64_t grace_ms,
                            int ignore_live_threads);

/* ---- MonitoredSession --------------------------------------------------- */

typedef struct keel_session_config {
    uint32_t struct_size;             /* set by keel_session_config_init() */
    /* What the session's manager restores, initializes and waits for, and
     * where it checkpoints: manager.vars (required), scaffold,
     * checkpoint_dir (restore and save_now; warm start and restore_fn on
     * the chief), restore_config, backend (also the updater when it has
     * one), recovery_wait_ms. Each setting lives only there, with the
     * default keel_session_manager_config_init gives it. */
    keel_session_manager_config manager;
    keel_step_fn step;                /* required */
    void *step_ctx;                   /* borrowed, like every ctx below */
    keel_updater updater;             /* used when the backend has none */
    const keel_hook *hooks;           /* copied, run in this order (each
                                       * hook's name and ctx borrowed) */
    size_t n_hooks;
    /* Creation: creator.create non-NULL wins; else is_chief (default 1)
     * picks the chief (prepare) or worker (wait max_wait_secs) creator over
     * a manager built from manager. */
    keel_session_creator creator;
    int is_chief;
    double max_wait_secs;             /* worker; default 300 */
    /* Recovery (MonitoredSession only): bounded retries, the first at
     * once, then with exponential backoff, doubling from backoff_ms up
     * to backoff_max_ms. */
    int max_recovery_attempts;        /* default 8 (consecutive) */
    int backoff_ms;                   /* default 50 */
    int backoff_max_ms;               /* default 5000 */
    double stop_grace_period_secs;    /* default 120 */
    /* Checkpoint metadata: called at every save; fill meta->blobs (data
     * iterator, RNG state; borrowed until the save returns). */
    keel_status (*meta_fn)(void *ctx, keel_ckpt_meta *meta);
    void *meta_ctx;
    /* 0 (default): gradients are zeroed before every step. 1: not (the step
     * overwrites every gradient; saves one pass over them per step). */
    int skip_grad_zeroing;
    /* In-process replicas (the mirrored strategy): 1 (default) calls the
     * step once; R in 2..KEEL_MAX_REPLICAS calls it on R threads, replica
     * r with its own gradient store, zeroed before every step whatever
     * skip_grad_zeroing says. The session then adds the replicas'
     * gradients in a fixed binary-tree order (replica r is leaf r of the
     * tree docs/determinism.md describes) into its own store, applies one
     * update, and reports the
     * mean over the replicas of every value they set. The step function
     * must be safe to run on R threads at once (its own state per
     * keel_step_replica). */
    int replicas;
} keel_session_config;

#define KEEL_MAX_REPLICAS 8

/* Defaults above (manager by keel_session_manager_config_init); vars,
 * step NULL. Cannot fail. */
void keel_session_config_init(keel_session_config *cfg);

/* MonitoredSession: runs begin on every hook, then creates the session
 * (creator, then after_create_session on every hook), retrying recoverable
 * errors. Caller owns *out: keel_session_close + keel_session_free. */
keel_status keel_session_new(const keel_session_config *cfg,
                             keel_session **out);
/* SingularMonitoredSession: the same without recovery. */
keel_status keel_session_new_singular(const keel_session_config *cfg,
                                      keel_session **out);

/* Run one step with hooks. batch (may be NULL) is borrowed for the call.
 * Recoverable errors re-create the session and retry the same step (bounded;
 * KEEL_EABORTED/KEEL_EUNAVAILABLE once exhausted). KEEL_EOUTOFRANGE: end of
 * input, the session is stopped. Any failure stops the session (sticky).
 * After a stop: KEEL_ESTATE; when the stop comes from a signal noticed at
 * this boundary: KEEL_ECANCELLED. */
keel_status keel_session_run(keel_session *s, const void *batch);
/* Run one step (and update) without hooks (TF issue 8425). */
keel_status keel_session_run_without_hooks(keel_session *s,
                                           const void *batch);
/* Run steps until should_stop. KEEL_OK for every clean ending (stop
 * request, end of input, signal), else the failing step's status. */
keel_status keel_session_train(keel_session *s);
/* 1 when closed, stopped (hook, coordinator, error, end of input) or a
 * signal arrived. Cheap. */
int keel_session_should_stop(keel_session *s);
/* Request a stop (logged with why). */
void keel_session_request_stop(keel_session *s, const char *why);
/* Save a checkpoint now through the session's saver (checkpoint_dir,
 * metadata from meta_fn). KEEL_ESTATE without a checkpoint_dir. path may
 * be NULL. */
keel_status keel_session_save_now(keel_session *s, char *path,
                                  size_t path_size);
/* End the session: every hook's end with the reason, then coordinator stop
 * and join (grace), then the session saver's pending save. Idempotent.
 * Returns KEEL_OK, an error from the coordinator's threads, or else the
 * first hook end's failure or the saver's (a final checkpoint that is not
 * on disk: the message names the hook, the step and the file), so a run
 * never ends well without its final checkpoint. MonitoredTrainingSession
 * and the Supervisor close through it. */
keel_status keel_session_close(keel_session *s);
/* The reason recorded (or that close used). */
keel_end_reason keel_session_end_reason(const keel_session *s);
/* Close if needed and release. NULL is a no-op. */
void keel_session_free(keel_session *s);

/* Accessors for hooks. All borrowed for the session's life. */
keel_vars *keel_session_vars(keel_session *s);
keel_coord *keel_session_coord(keel_session *s);
int64_t keel_session_global_step(const keel_session *s);
/* The named value of the last step run, as hooks read it in after_run
 * (keel_run_values_find: a metric combined over the step's replicas): 1
 * and *out (may be NULL), or 0 when that step did not set it or no step
 * ran. For loops without hooks (the Supervisor's). */
int keel_session_find_value(const keel_session *s, const char *name,
                            double *out);
/* The shared global step in *step: on a cluster worker the parameter
 * servers' (the backend's read_global_step; without one, a refresh as
 * below), locally keel_session_global_step. Errors as the backend's
 * (recoverable ones recover the session when returned from a hook). */
keel_status keel_session_read_shared_step(keel_session *s, int64_t *step);
/* Refresh the local copy of the shared state, variables and global step,
 * through the backend's fetch; KEEL_OK with nothing to do locally.
 * KEEL_EUNAVAILABLE (naming what is missing) while the shared state is not
 * ready. */
keel_status keel_session_refresh(keel_session *s);
/* The session's own saver (NULL without checkpoint_dir). */
keel_saver *keel_session_saver(keel_session *s);
/* Fill meta through the config's meta_fn (zeroed if none). */
keel_status keel_session_collect_meta(keel_session *s, keel_ckpt_meta *meta);
/* Before a checkpoint save: the backend's before_save (a cluster chief
 * pulls every variable, slot and the global step from the ps). Every save
 * of the session (keel_session_save_now, CheckpointSaverHook) calls it;
 * a hook that saves by itself must too. KEEL_OK for local sessions. */
keel_status keel_session_prepare_save(keel_session *s);
/* Write the checkpoint of s's variables with saver and meta (borrowed for
 * the call), after keel_session_prepare_save: the backend's save when it
 * has one, else keel_saver_save. path (may be NULL) receives the file. */
keel_status keel_session_write_checkpoint(keel_session *s, keel_saver *saver,
                                          const keel_ckpt_meta *meta,
                                          char *path, size_t path_size);
/* Times the session was created (1 + recoveries). */
int keel_session_creation_count(const keel_session *s);
/* The session manager (NULL with a custom creator). */
keel_session_manager *keel_session_get_manager(keel_session *s);

/* ---- signals ------------------------------------------------------------ */

/* Install SIGTERM and SIGINT handlers (sigaction) that set an
 * async-signal-safe flag; every session then stops at its next step
 * boundary with KEEL_END_SIGNAL and writes its final checkpoint. The library
 * never installs handlers by itself. Process-wide. */
keel_status keel_session_install_signal_handlers(void);
/* Restore the previous handlers. */
void keel_session_uninstall_signal_handlers(void);
/* The signal received (0 if none); clear it (tests, restart loops). */
int keel_session_signal_received(void);
void keel_session_clear_signal(void);

#ifdef __cplusplus
}
#endif
#endif
