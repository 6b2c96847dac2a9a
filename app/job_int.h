/* job_int.h - private to app/'s training job (keel_job_train), split by
 * what each file does:
 *   job.c          the run from start to end: strategy, start, session
 *                  settings, the run loop, the end check, release
 *   job_cluster.c  the roles of a cluster or collective: ps, chief and
 *                  worker backends, multi_worker_mirrored ranks, K-FAC's
 *                  roles, the reduction tree's leaves
 *   job_hooks.c    the run's hooks: feed, stop, NaN, profiler, and the
 *                  chief's progress and end-of-epoch (checkpoint,
 *                  validation) hooks
 *   job_step.c     the session's callbacks: one step's gradients, the
 *                  update, variable init, feed, checkpoint meta, restore
 *   job_build.c    the job's pieces from the config: data iterator,
 *                  model, optimizer or K-FAC, architecture, mirrored
 *                  replicas, Hogwild threads
 *   job_data.c     the data sets and model settings a config names (also
 *                  the evaluator's and export's, app_int.h)
 * Each file calls only files listed below it here (and evaluator.c,
 * kfac_dist.c). */
#ifndef KEEL_JOB_INT_H
#define KEEL_JOB_INT_H

#include <stddef.h>
#include <stdint.h>

#include <keel/checkpoint.h>
#include <keel/cluster.h>
#include <keel/config.h>
#include <keel/distributed.h>
#include <keel/events.h>
#include <keel/hooks.h>
#include <keel/job.h>
#include <keel/session.h>
#include <keel/supervise.h>
#include <keel/train.h>
#include "app_int.h"
#include "../session/step_pool.h"

/* Everything a training or evaluation run holds; freed by
 * keel__job_free. */
typedef struct keel__job {
    const keel_config *cfg;
    keel_dataset *ds;
    keel_data_iter *it;
    keel_vars *vs;
    keel_model *model;
    /* train.strategy = mirrored: replica r steps rmodel[r] (rmodel[0] is
     * model; the others share its variables) on its slice of the batch */
    int replicas;
    keel_model *rmodel[KEEL_MAX_REPLICAS];
    keel__pool *rpool;            /* the session's replica threads (set by
                                   * replica 0 each step), for the update */
    keel_optimizer *opt;          /* NULL with kfac */
    keel_kfac *kfac;              /* optimizer.name = kfac */
    keel_lr_schedule schedule;    /* the learning rate, either way */
    int64_t global_batch;
    int64_t classes;              /* the model's class count */
    uint64_t seed;
    /* step-to-step state */
    unsigned char iter_state[KEEL_DATA_ITER_STATE_BYTES];
    keel_ckpt_blob blob;
    keel_batch batch;
    keel_job_config opts;
    int64_t last_step;
    int64_t examples;
    int64_t t0_ns, last_report_ns, last_report_examples;
    int restored;
    char restored_from[1024];
    char topology[128];
    /* The resolved config (file + -s overrides + environment) as INI text,
     * stored in every checkpoint so `keel eval DIR` rebuilds this model. */
    char *config_dump;
    /* The model, optimizer and input preprocessing as JSON
     * (docs/checkpoint-format.md), stored in every checkpoint. */
    char *arch_dump;
    int64_t steps_per_epoch;      /* global steps per epoch */
    int64_t examples_per_gstep;   /* examples one global step trains */
    int64_t last_report_gstep;
    int64_t save_epochs, validate_epochs;
    int64_t epoch_done;           /* epochs completed, reported */
    keel__validator *validator;
    keel_events *val_events;
    keel_cluster_backend *worker; /* a cluster chief's, for pulls */
    /* train.micro_batch: size, and in a cluster one gradient store per
     * micro-batch of this replica's slice (pushed separately) */
    int64_t micro;
    int n_micro;
    keel_grads *micro_g[64];
    /* Sync on a cluster with canonical leaves (reduce_leaves > 0): this
     * replica's slice cut into the tree nodes that cover its leaves, node
     * c being examples [node_off[c], + node_len[c]) computed into
     * micro_g[c] (n_nodes > 1; 0: one node, the session's gradients) */
    int64_t leaves;
    int n_nodes;
    size_t node_off[64], node_len[64];
    /* cluster.elastic: every replica reads the whole global batch and
     * computes the nodes of its leaves under the membership the ps told it
     * (el_epoch; el_member 0: not live, nothing computed), el_examples of
     * them */
    int elastic, el_member;
    int64_t el_epoch;
    size_t el_examples;
    /* multi_worker_mirrored with leaves the ranks do not split evenly:
     * every rank reads the whole global batch and trains examples
     * [slice_off, + slice_len) of it, its leaves (0: the iterator's
     * slice is the rank's) */
    size_t slice_off, slice_len;
    /* One process: the job zeroes the step's gradients itself (the session
     * is told to skip it) and knows when the last update already did. */
    int own_zeroing;
    keel_grads *zeroed;           /* zero since keel__job_apply; NULL:
                                   * unknown */
    /* The session's updater is keel__job_apply and nothing runs between
     * the step and it (one process, no backend, no replicas): a step of
     * the whole batch may make the update itself (job_step.c) */
    int fuse_update;
    /* [algorithm] when algorithm.name is set (else the spec's mode) */
    int has_algo;
    /* the step after this replica's newest step: under a local-step rule
     * ahead of the shared global step by its uncommitted local steps */
    int64_t own_step;
    keel_algorithm_config algo;
    double algo_rates[1024];
    /* each replica's gradient is the mean over its own slice (not a share
     * of the global batch): a rule with local steps, and every replica
     * over the ps (the ps weighs the replicas' means by their examples) */
    int local_norm;
    /* The update rule, decided once by keel__job_rule: its rounds take one
     * global batch (else each replica's own slice), and its workers push
     * gradients (the optimizer's slots live in this process). */
    int rule_sync, opt_slots;
    /* algorithm.name = hogwild in one process: hw_threads threads, each
     * with its own model on the shared store (hw_model[0] is model) and
     * its own global_batch slice of the iterator's hw_threads-fold batch */
    keel_hogwild *hw;
    int hw_threads;
    keel_model *hw_model[KEEL_HOGWILD_MAX_THREADS];
    const keel_batch *hw_batch;
    keel_step_stats hw_stats[KEEL_HOGWILD_MAX_THREADS];
    /* K-FAC: this task computes factor statistics (one process, or the
     * chief of kfac.distributed = chief) */
    int kfac_observes;
    int kfac_role;                /* kfac.distributed = roles: 0 gradient,
                                   * 1 covariance, 2 inverse */
    int kfac_rta;                 /* replicas a sync step aggregates; 0:
                                   * the spec's */
    keel__kfac_dist *kdist;       /* kfac.distributed = roles */
} keel__job;

/* What the steps of one keel_job_train share. It lives on that call's
 * stack: the hooks, the session and the backend hold pointers into it. */
typedef struct keel__train_run {
    const keel_config *cfg;
    const keel_job_config *opts;        /* borrowed; may be NULL */
    keel_job_result *result;             /* borrowed; may be NULL */
    const keel_cluster_spec *spec;       /* opts' cluster, or NULL */
    int in_cluster, is_chief, replica, replicas, is_mwm;
    int is_ps;                           /* a ps task: keel__job_run_ps
                                          * serves it */
    keel_strategy strategy;
    keel_cluster_backend *worker;
    keel_collective *coll;
    keel_backend backend;
    keel__job j;
    keel_training_config tc;
    keel_scaffold sc;
    keel_hook hooks[5], chief_hooks[3], nan;
    size_t n_hooks, n_chief_hooks;
    int has_nan;
} keel__train_run;

/* ---- job_build.c ---- */
/* Build dataset, iterator, variables, model and optimizer; hogwild: one
 * process runs algorithm.name = hogwild; one_process: no cluster and no
 * collective (K-FAC then applies the gradients the model step wrote). */
keel_status keel__job_build(keel__job *j, const keel_config *cfg,
                            int worker_index, int num_workers, int hogwild,
                            int one_process);
void keel__job_free(keel__job *j);
/* Mirrored: train.replicas models over one variable store, each with
 * train.model_threads threads. */
keel_status keel__job_mirrored_build(keel__job *j, const keel_config *cfg);

/* ---- job_step.c: the session's callbacks, ctx a keel__job ---- */
keel_status keel__job_step(void *ctx, keel_step *stp);
keel_status keel__job_apply(void *ctx, keel_vars *vs, keel_grads *g,
                            int64_t global_step);
/* Tests' switch: 0 keeps the step and the update apart even where
 * fuse_update allows one pool run (the same bits either way); and the
 * steps that made their update themselves so far. */
extern int keel__job_fused_update;
extern int64_t keel__job_fused_steps;
/* kfac.distributed = chief: the chief's update of a sync step, with the
 * step's mean gradient from the ps (keel_cluster_config.chief_apply). */
keel_status keel__job_chief_apply(void *ctx, keel_vars *vs,
                                  keel_grads *mean, int64_t global_step);
keel_status keel__job_init(void *ctx, keel_vars *vs);
keel_status keel__job_feed(void *ctx, int64_t global_step,
                           const void **batch);
keel_status keel__job_meta(void *ctx, keel_ckpt_meta *meta);
keel_status keel__job_restore(void *ctx, const keel_ckpt_info *info);

/* ---- job_hooks.c ---- */
/* Build the hooks: the mirrored replicas' models, the step hooks and the
 * chief's. What it made train_free releases. */
keel_status keel__job_hooks(keel__train_run *r);

/* ---- job_cluster.c ---- */
/* train.strategy = multi_worker_mirrored: what the config and the
 * process must offer before MPI starts. */
keel_status keel__job_mwm_check(const keel_config *cfg, int in_cluster);
/* A cluster task's role: sets r->is_ps for a ps task (and looks no
 * further), else r->is_chief, r->replica and r->replicas of a chief or
 * worker; refuses other task types and a cluster without a ps. */
keel_status keel__job_cluster_role(keel__train_run *r);
/* multi_worker_mirrored: start the collective in r->coll (the caller
 * frees it, on failure too) and take this process's rank, the number of
 * ranks and the chief role from it. */
keel_status keel__job_ranks(keel__train_run *r);
/* The ps task: build the model only to know the variables, then serve. */
keel_status keel__job_run_ps(const keel_config *cfg,
                             const keel_cluster_spec *spec,
                             const keel_job_config *opts);
/* j's update rule in cluster (NULL: one process, or ranks of a
 * collective: sync SGD): [algorithm] when set, else the cluster's mode. A
 * rule pushing gradients gets the optimizer's slots here. */
keel_status keel__job_rule(keel__job *j, const keel_cluster_spec *cluster);
/* A K-FAC job in a cluster: its replicas and, with distributed roles,
 * this replica's role (gradient, covariance or inverse worker) in
 * r->j.kfac_role and r->j.kdist (which keel__job_free frees). */
keel_status keel__job_kfac_roles(keel__train_run *r);
/* multi_worker_mirrored: train.leaves are this rank's leaves, each
 * computed alone (the micro-batch path) and summed along the
 * collective's tree; the session runs over the collective's backend. */
keel_status keel__job_mwm_backend(keel__train_run *r);
/* A cluster's chief or worker: the cluster through the public seam
 * (keel/distributed.h) in r->worker (which train_free frees); the
 * backend pulls before the chief's checkpoints and stops the ps when the
 * chief's session ends cleanly. */
keel_status keel__job_cluster_backend(keel__train_run *r);

#endif
