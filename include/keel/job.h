/* keel/job.h - keel's own trainer: a job described by a keel_config (model,
 * data, optimizer, checkpoints, hooks) run under MonitoredTrainingSession,
 * and evaluation of a checkpoint on the test set with no cluster. What
 * `keel train` and `keel eval` run; usable from any program. */
#ifndef KEEL_JOB_H
#define KEEL_JOB_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/config.h>
#include <keel/cluster.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A progress report, handed to the caller's progress_fn after every step
 * (borrowed for the call; keep the callback cheap). */
typedef struct keel_job_progress {
    int64_t global_step;
    int64_t last_step;        /* the step the run ends at (0: unknown) */
    int64_t epoch;            /* 0-based epoch of the next batch */
    double loss;              /* this step's mean loss */
    double accuracy;          /* this step's accuracy */
    double examples_per_sec;  /* this process, since the previous report */
    double elapsed_secs;      /* since training started */
    double learning_rate;     /* the rate this step applied */
    /* The whole cluster's examples/s since the previous report, from the
     * global step's progress (equal to examples_per_sec on one process). */
    double global_examples_per_sec;
    int64_t steps_per_epoch;  /* global steps per epoch */
    int64_t epochs;           /* train.epochs (0: no epoch limit) */
} keel_job_progress;

/* The end of an epoch, reported on the chief (one process: always). */
typedef struct keel_job_epoch {
    int64_t epoch;            /* epochs completed (1-based) */
    int64_t global_step;
    double learning_rate;     /* the rate of the epoch's last step */
    int validated;            /* 1: the fields below are set */
    double val_loss, val_accuracy;
    int64_t val_examples;
    char checkpoint[1024];    /* the end-of-epoch checkpoint saved, or "" */
} keel_job_epoch;

typedef struct keel_job_config {
    uint32_t struct_size;          /* set by keel_job_config_init() */
    /* Called after every step (NULL: none). */
    void (*progress_fn)(void *ctx, const keel_job_progress *p);
    void *progress_ctx;
    /* Called at the end of every epoch on the chief, after that epoch's
     * checkpoint (checkpoint.save_epochs) and validation
     * (train.validate_every_epochs), with progress_ctx (NULL: none). */
    void (*epoch_fn)(void *ctx, const keel_job_epoch *e);
    /* Install SIGTERM/SIGINT handlers for a preemption-safe stop. */
    int handle_signals;
    /* The cluster and this task's role (validated; borrowed). NULL or a
     * local spec: one process. ps: serve a shard until the chief's
     * shutdown; chief/worker: a training replica (docs/cluster.md). */
    const keel_cluster_spec *cluster;
} keel_job_config;

/* All zero but struct_size: no callbacks, no signal handlers, one
 * process. Cannot fail. */
void keel_job_config_init(keel_job_config *opts);

/* What a finished run reports. */
typedef struct keel_job_result {
    int64_t start_step;       /* global step at start (after any restore) */
    int64_t final_step;
    int64_t examples;         /* examples trained by this process */
    /* Examples the whole cluster trained in this run, from the global
     * step's progress (equal to examples on one process). */
    int64_t cluster_examples;
    double seconds;           /* wall time of the training loop */
    int restored;             /* 1 if it resumed from a checkpoint */
    char restored_from[1024]; /* that checkpoint's path */
    int end_reason;           /* a keel_end_reason */
} keel_job_result;

/* Train as cfg says (validated with keel_config_validate first), resuming
 * from the newest valid checkpoint in checkpoint.dir. Returns KEEL_OK when
 * the run reached its limit or stopped cleanly (a stop request, SIGTERM,
 * end of input); the final checkpoint is then written. opts and result may
 * be NULL. */
keel_status keel_job_train(const keel_config *cfg,
                           const keel_job_config *opts,
                           keel_job_result *result);

/* The K-FAC role of replica `replica` (0: the chief; worker i: i + 1) of a
 * cluster with `replicas` replicas when cfg splits roles
 * (optimizer.name = kfac, kfac.distributed = roles): "gradient.N",
 * "covariance.N" or "inverse.N" (N its number in the role) into buf.
 * KEEL_ENOTFOUND when cfg splits no roles; KEEL_EINVAL, naming the keys,
 * when the replicas cannot fill every role. */
keel_status keel_job_replica_role(const keel_config *cfg, int replica,
                                  int replicas, char *buf, size_t size);

typedef struct keel_eval_result {
    int64_t step;             /* global step of the checkpoint */
    double loss;              /* mean cross-entropy */
    double accuracy;
    int64_t examples;
    char checkpoint[1024];    /* the file evaluated */
} keel_eval_result;

/* Evaluate a checkpoint on the test set: checkpoint_path, or (NULL) the
 * newest valid one in cfg's checkpoint.dir. */
keel_status keel_job_eval(const keel_config *cfg, const char *checkpoint_path,
                          keel_eval_result *result);
/* keel_job_eval, calling progress_fn (may be NULL) with ctx after every
 * batch: examples evaluated so far and the test set's size. */
keel_status keel_job_eval_progress(const keel_config *cfg,
                                   const char *checkpoint_path,
                                   void (*progress_fn)(void *ctx,
                                                       int64_t done,
                                                       int64_t total),
                                   void *ctx, keel_eval_result *result);

/* The TF_CONFIG evaluator task (TF's Estimator evaluator): watch
 * checkpoint.dir and evaluate each new checkpoint on the test set. */
typedef struct keel_evaluator_config {
    uint32_t struct_size;          /* set by keel_evaluator_config_init() */
    /* Return after evaluating a checkpoint at or past this step; 0: the
     * config's last training step (train.max_steps / train.epochs). */
    int64_t final_step;
    /* KEEL_ETIMEOUT when no new checkpoint arrives for this long; 0:
     * cluster.eval_timeout_secs. */
    double timeout_secs;
    double poll_secs;         /* fallback poll beside inotify; 0: 0.5 */
    /* Install SIGTERM/SIGINT handlers: a signal ends the run with KEEL_OK
     * (after the evaluation in progress). */
    int handle_signals;
    /* Called after each evaluation (NULL: none); borrowed for the call. */
    void (*result_fn)(void *ctx, const keel_eval_result *r);
    void *ctx;
} keel_evaluator_config;

typedef struct keel_evaluator_result {
    int64_t evaluated;        /* checkpoints evaluated */
    int64_t skipped;          /* passed over: a newer one was there */
    int64_t last_step;        /* last evaluated step; -1: none */
    int stopped_by_signal;
} keel_evaluator_result;

/* All zero but struct_size: the defaults above. Cannot fail. */
void keel_evaluator_config_init(keel_evaluator_config *opts);

/* Evaluate every new checkpoint in cfg's checkpoint.dir (the newest when
 * several arrived during one evaluation) until the final step's checkpoint
 * is evaluated, a signal (handle_signals), or the timeout (KEEL_ETIMEOUT
 * naming the directory). Each file is read under a lease
 * (keel_ckpt_lease_take) so retention cannot delete it mid-read. Logs
 * "eval step N: loss X accuracy Y (model.ckpt-N.h5)" at INFO and writes
 * eval/loss and eval/accuracy to TensorBoard event files in
 * <checkpoint.dir>/eval/. opts and result may be NULL. */
keel_status keel_job_run_evaluator(const keel_config *cfg,
                                   const keel_evaluator_config *opts,
                                   keel_evaluator_result *result);

/* Load the config a checkpoint was saved with (its /meta config text) into
 * a new config: how `keel eval DIR` knows the model and data. Caller owns
 * *out. */
keel_status keel_config_from_checkpoint(const char *checkpoint_path,
                                        keel_config **out);

#ifdef __cplusplus
}
#endif
#endif
