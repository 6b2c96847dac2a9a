/* keel/supervise.h - training supervised from start to end over the
 * session layer: MonitoredTrainingSession (keel_training_session_new: a
 * recovering session with the standard hooks and, on a cluster, the worker
 * backend), the distribution strategies it runs (keel_strategy) and the
 * Supervisor (the older API over the same parts). TF1 tf.train semantics
 * with the fixes listed in docs/session.md. */
#ifndef KEEL_SUPERVISE_H
#define KEEL_SUPERVISE_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/checkpoint.h>
#include <keel/hooks.h>
#include <keel/session.h>
#include <keel/train.h>
#include <keel/cluster.h>
#include <keel/distributed.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- distribution strategies ------------------------------------------- */

/* How a training program spreads its replicas (tf.distribute's
 * strategies). Every strategy writes the same checkpoint layout from its
 * chief alone, divides the loss by the global batch and splits the input
 * evenly over its replicas, so a checkpoint of any strategy restores
 * under any other or none. */
typedef enum keel_strategy {
    /* parameter_server when the cluster has tasks, else one_device */
    KEEL_STRATEGY_AUTO = 0,
    /* one replica in one process (model threads may share its steps) */
    KEEL_STRATEGY_ONE_DEVICE,
    /* replicas in one process: threads with their own batch slice, the
     * gradients added in a fixed order, one update (session.replicas) */
    KEEL_STRATEGY_MIRRORED,
    /* one replica per process, gradients all-reduced, no ps; the rank 0
     * process is the chief */
    KEEL_STRATEGY_MULTI_WORKER_MIRRORED,
    /* replicas in the cluster's chief and workers, variables on its ps
     * tasks (keel/distributed.h) */
    KEEL_STRATEGY_PARAMETER_SERVER
} keel_strategy;

#define KEEL_STRATEGY_COUNT 5

/* "auto", "one_device", "mirrored", "multi_worker_mirrored",
 * "parameter_server"; never NULL ("?" for a value out of range). */
const char *keel_strategy_name(keel_strategy s);
/* The inverse of keel_strategy_name; KEEL_EINVAL listing the names. */
keel_status keel_strategy_from_name(const char *name, keel_strategy *out);
/* The strategy auto stands for: parameter_server when has_cluster (a
 * cluster spec with tasks), else one_device; any other value unchanged. */
keel_strategy keel_strategy_resolve(keel_strategy s, int has_cluster);

/* ---- MonitoredTrainingSession ------------------------------------------ */

#define KEEL_USE_DEFAULT (-1)

typedef struct keel_training_config {
    uint32_t struct_size;             /* set by keel_training_config_init() */
    /* step, updater, hooks and the settings a plain session has:
     * manager.vars, manager.checkpoint_dir (restore and the checkpoint
     * hook; NULL: neither), is_chief, max_wait_secs,
     * stop_grace_period_secs, replicas. Each
     * lives only there, with the default keel_session_config_init gives
     * it; the training session changes them only as stated below. */
    keel_session_config session;
    /* Pointer members below are copied by keel_training_session_new,
     * except cluster (borrowed for the session's life) and, borrowed
     * likewise, each hook's name and ctx, each listener's ctx and
     * clock.ctx. */
    /* NULL: session.manager.checkpoint_dir */
    const char *summary_dir;
    const keel_hook *chief_only_hooks;
    size_t n_chief_only_hooks;
    /* KEEL_USE_DEFAULT (-1): 600 s iff steps also default. Both set > 0:
     * KEEL_EINVAL. 0: off. */
    double save_checkpoint_secs;
    int64_t save_checkpoint_steps;
    int64_t save_summaries_steps;     /* default 100 iff secs default */
    double save_summaries_secs;
    const char *const *summary_names; /* values SummarySaverHook writes */
    size_t n_summary_names;           /* default: "loss" */
    int64_t log_step_count_steps;     /* default 100; 0: off */
    int save_on_error;                /* final checkpoint on error; 0 */
    const keel_ckpt_listener *listeners;
    size_t n_listeners;
    keel_clock clock;                 /* for the default hooks */
    /* The update rule as one of keel's optimizers (copied; NULL: the
     * session's updater). Alone, the session applies it to session.manager.vars
     * with its slots there (session.updater must be unset); on a cluster
     * the ps apply it (keel_cluster_config.optimizer) and the chief's
     * checkpoints hold the slots. */
    const struct keel_optimizer_config *optimizer;
    /* The cluster (MonitoredTrainingSession's master/is_chief): a
     * validated spec, borrowed for the session's life, or NULL. With
     * cluster_from_env 1 and cluster NULL the session finds it itself
     * (keel_cluster_spec_detect: TF_CONFIG, else Slurm, else alone). A
     * local spec (no tasks, or only a chief) trains alone. Otherwise the
     * session makes a cluster backend (keel/distributed.h) with
     * cluster_config (NULL: the defaults) and
     * frees it with the session; session.is_chief is replaced by the
     * spec's, session.max_wait_secs by cluster_config's max_wait_secs
     * (the cluster's one wait for its chief), a worker
     * writes no checkpoints, the chief pulls before each save and stops
     * the ps at a clean end. A ps task is an error (KEEL_EINVAL): it runs
     * keel_ps_run instead; a worker that finds the cluster already shut
     * down gets KEEL_EOUTOFRANGE (nothing left to train).
     * session.manager.backend must then be NULL. */
    const struct keel_cluster_spec *cluster;
    int cluster_from_env;
    const struct keel_cluster_config *cluster_config;
    /* The strategy (default auto: parameter_server with a cluster, else
     * one_device). one_device and mirrored train in this process and
     * refuse a cluster with tasks; parameter_server needs one;
     * mirrored runs session.step on session.replicas threads (set it:
     * its default 1 is one replica); the others need session.replicas 1.
     * multi_worker_mirrored needs session.manager.backend set from
     * keel_collective_session_backend (keel/distributed.h) and no cluster. */
    keel_strategy strategy;
    /* K-FAC as the update rule (keel/kfac_dist.h), borrowed for the
     * session's life; NULL: none. optimizer and session.updater must then
     * be unset. Alone, the session applies the handle's K-FAC
     * (keel_kfac_updater); the handle is for replica 0 of 1. On a cluster
     * the handle is for this task's replica of the spec's replicas; the
     * session applies keel_kfac_dist_cluster_config to its copy of
     * cluster_config (the program does the same for its ps) and, in roles
     * mode, gives the handle its worker backend and a covariance or
     * inverse worker the role's updater in place of the backend's
     * (keel_kfac_dist_set_backend, keel_kfac_dist_role_updater). */
    struct keel_kfac_dist *kfac_dist;
} keel_training_config;

void keel_training_config_init(keel_training_config *cfg);
/* MonitoredTrainingSession: chief hooks = chief_only, StepCounter,
 * SummarySaver, CheckpointSaver, then session.hooks; workers get only
 * session.hooks. Returns a recovering session. */
keel_status keel_training_session_new(const keel_training_config *cfg,
                                      keel_session **out);

/* ---- Supervisor (older API over the same parts) ------------------------- */

typedef struct keel_supervisor keel_supervisor;

typedef struct keel_supervisor_config {
    uint32_t struct_size;             /* set by keel_supervisor_config_init() */
    /* vars, step, updater and the settings a plain session has: is_chief
     * (default 1; set it from the spec, keel_cluster_spec_is_chief, on a
     * cluster), session.manager.checkpoint_dir (checkpoints, the chief
     * only; NULL: none), scaffold, recovery_wait_ms,
     * stop_grace_period_secs, meta_fn, restore_fn and backend. Each lives
     * only there, with the default keel_session_config_init gives it. The
     * Supervisor's session has no hooks or creator of the caller's and
     * waits max_wait_secs of keel_supervisor_prepare_or_wait. Alone it
     * does not recover (max_recovery_attempts and the backoff are
     * unused); on a cluster (a backend with publish) it recovers a lost
     * ps or worker as MonitoredTrainingSession's does, except that the
     * chief publishes its own current variables instead of restoring its
     * newest checkpoint (no rollback; a restarted ps gets the optimizer
     * slots of the chief's newest checkpoint or start).
     * With a cluster backend (keel_cluster_backend_session_backend) in
     * session.manager.backend the chief initializes or restores and
     * publishes, workers wait for it (every recovery_wait_ms at most, else
     * on the chief's event), steps push to the ps (SyncReplicas in sync
     * mode), the chief's checkpoints pull first, and the chief's
     * keel_supervisor_stop stops the ps. */
    keel_session_config session;
    double save_checkpoint_secs;      /* default 600; 0: off */
    keel_clock clock;                 /* for the checkpoint timer */
} keel_supervisor_config;

void keel_supervisor_config_init(keel_supervisor_config *cfg);
keel_status keel_supervisor_new(const keel_supervisor_config *cfg,
                                keel_supervisor **out);
/* Chief: restore or init; worker: wait (max_wait_secs). Clears a previous
 * stop. Checkpoints (chief with session.manager.checkpoint_dir) every
 * save_checkpoint_secs, taken at step boundaries, the first at once. */
keel_status keel_supervisor_prepare_or_wait(keel_supervisor *sv,
                                            double max_wait_secs);
int keel_supervisor_should_stop(keel_supervisor *sv);
void keel_supervisor_request_stop(keel_supervisor *sv, const char *why);
/* One step at a step boundary (checkpoint when due). */
keel_status keel_supervisor_run_step(keel_supervisor *sv, const void *batch);
/* The managed loop: steps until should_stop (or max_steps > 0 steps), then
 * stop. KEEL_OK on a clean ending. */
keel_status keel_supervisor_loop(keel_supervisor *sv, int64_t max_steps);
/* Request stop, write a final checkpoint (TF did not), join threads. */
keel_status keel_supervisor_stop(keel_supervisor *sv);
keel_session *keel_supervisor_session(keel_supervisor *sv);
void keel_supervisor_free(keel_supervisor *sv);

#ifdef __cplusplus
}
#endif
#endif
