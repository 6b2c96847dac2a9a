/* keel/kfac_dist.h - K-FAC (keel/kfac.h) in a session and on a
 * parameter-server cluster in sync mode (docs/kfac.md, "Distributed
 * K-FAC"): the updater of one process, and tensorflow/kfac's two
 * distributed ways. chief: every replica computes gradients, the chief
 * observes its slice of the batch and applies the whole K-FAC step to the
 * aggregated gradient (keel_cluster_config.chief_applies). roles: replicas
 * by index are gradient workers (the chief among them: the preconditioned
 * update with the newest inverses on the ps), covariance workers (the
 * factor statistics into the ps's moving averages) and inverse workers
 * (the damped inverses of the layers in a shared, seeded, shuffled queue,
 * published on the ps with the step they were computed at). */
#ifndef KEEL_KFAC_DIST_H
#define KEEL_KFAC_DIST_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/tensor.h>
#include <keel/train.h>
#include <keel/kfac.h>
#include <keel/session.h>
#include <keel/distributed.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One process: an updater that runs keel_kfac_apply (the session's
 * updater; the step observes the statistics first). k borrowed for the
 * sessions the updater is given to. Cannot fail. */
keel_updater keel_kfac_updater(keel_kfac *k);

typedef enum keel_kfac_distributed {
    KEEL_KFAC_DIST_CHIEF = 0,    /* "chief" */
    KEEL_KFAC_DIST_ROLES         /* "roles" */
} keel_kfac_distributed;

typedef enum keel_kfac_role {
    KEEL_KFAC_ROLE_GRADIENT = 0, /* "gradient" */
    KEEL_KFAC_ROLE_COVARIANCE,   /* "covariance" */
    KEEL_KFAC_ROLE_INVERSE       /* "inverse" */
} keel_kfac_role;

const char *keel_kfac_distributed_name(keel_kfac_distributed d);
keel_status keel_kfac_distributed_from_name(const char *name,
                                            keel_kfac_distributed *out);
const char *keel_kfac_role_name(keel_kfac_role r);

typedef struct keel_kfac_dist_config {
    uint32_t struct_size;        /* set by keel_kfac_dist_config_init() */
    keel_kfac_distributed mode;  /* default chief */
    /* This task's replica (the chief 0, worker i i + 1) and the cluster's
     * replicas (chief and workers); required on a cluster's training
     * tasks (default 0 of 1: one process, where either mode is the
     * one-process K-FAC: the task observes and applies). */
    int replica, replicas;
    /* chief: 1 aggregates ceil(0.6 N) of N >= 3 replicas' gradients a
     * step (tensorflow/kfac's convnet example); 0 (default) the cluster's
     * own rule. */
    int kfac_replicas_to_aggregate;
    /* roles: replicas [0, g) gradient workers, g = max(1, floor(f N)),
     * then c = max(1, floor(f N)) covariance workers, the rest inverse
     * workers; every role needs a task. Defaults 0.6 and 0.2. */
    double gradient_fraction;
    double covariance_fraction;
    /* roles: a wait for the next global step or for the first inverses
     * fails after this long; default 3600, 0 never. */
    double step_timeout_secs;
    /* roles: the inverse queue's shuffles; default 0. */
    uint64_t seed;
    /* roles: the chief logs the inverses' staleness every this many steps;
     * default 100, 0 never. */
    int64_t log_every_steps;
} keel_kfac_dist_config;

typedef struct keel_kfac_dist keel_kfac_dist;

/* Defaults above. Cannot fail. */
void keel_kfac_dist_config_init(keel_kfac_dist_config *cfg);
/* The role of cfg->replica of cfg->replicas in roles mode, its number in
 * that role (*index) and the tasks of every role (counts, may be NULL).
 * KEEL_EINVAL, naming the counts and fractions, when a role would be
 * empty (fewer than 3 replicas, or fractions that leave none). */
keel_status keel_kfac_dist_config_role(const keel_kfac_dist_config *cfg,
                                       keel_kfac_role *role, int *index,
                                       int counts[3]);
/* Roles mode's extra state in vs: "<layer>/kfac_inv_step" of every layer
 * of k (-1: no inverses published yet), created when missing. Every task
 * of the cluster, the ps too, calls it after making k on vs. */
keel_status keel_kfac_dist_add_state(keel_kfac *k, keel_vars *vs);

/* K-FAC distributed as cfg says, for this training task (a ps makes one
 * with replica 0 for keel_kfac_dist_cluster_config only): k and vs
 * borrowed for the handle's life; roles mode needs the state of
 * keel_kfac_dist_add_state in vs. Caller owns *out: keel_kfac_dist_free(). */
keel_status keel_kfac_dist_new(const keel_kfac_dist_config *cfg,
                               keel_kfac *k, keel_vars *vs,
                               keel_kfac_dist **out);
void keel_kfac_dist_free(keel_kfac_dist *d);
/* This task's role (gradient in chief mode). */
keel_kfac_role keel_kfac_dist_role(const keel_kfac_dist *d);
/* Whether this task runs the statistics (keel_kfac_observe or
 * keel_kfac_observe_layer) each step: the chief in chief mode, the
 * covariance workers in roles mode, the one replica of one process. */
int keel_kfac_dist_observes(const keel_kfac_dist *d);
/* The cluster settings K-FAC needs, into co (every task of the cluster,
 * the ps too, with the same): the chief applies the update (chief_applies,
 * chief_apply: this handle; no ps optimizer), in roles mode it commits
 * only the trainable variables and the ps aggregate the gradient workers'
 * pushes, and replicas_to_aggregate as the config says. d borrowed for
 * the cluster's life. Roles mode with one replica: KEEL_EINVAL, as
 * keel_kfac_dist_config_role. MonitoredTrainingSession calls it (and the
 * two below) itself for a handle in keel_training_config.kfac_dist; a
 * program calls it for its ps (keel_ps_run). */
keel_status keel_kfac_dist_cluster_config(keel_kfac_dist *d,
                                          keel_cluster_config *co);
/* Roles mode: the worker backend the roles pull from and mix into
 * (borrowed for d's life); set before the first step. */
void keel_kfac_dist_set_backend(keel_kfac_dist *d, keel_cluster_backend *b);
/* Roles mode, a covariance or inverse worker: the updater that replaces
 * the backend's (it pushes no gradient: statistics or inverses, then the
 * next global step's values). d borrowed. Cannot fail. */
keel_updater keel_kfac_dist_role_updater(keel_kfac_dist *d);

#ifdef __cplusplus
}
#endif

#endif /* KEEL_KFAC_DIST_H */
