/* roles.h - private to libkeel (no <zmq.h>): the cluster roles the job layer
 * runs: variable placement, the parameter-server task and the worker's
 * session backend (cluster/roles.c). */
#ifndef KEEL_CLUSTER_ROLES_H
#define KEEL_CLUSTER_ROLES_H

#include <keel/cluster.h>
#include <keel/session.h>
#include <keel/train.h>

typedef struct keel__role_opts {
    const keel_cluster_spec *spec;  /* validated; this task's role set */
    int round_robin;                /* placement: 1 round robin, 0 size */
    int dead_after_ms;              /* a silent ps is dead after this */
    int heartbeat_ms;               /* liveness pings to every ps */
    double stall_warn_secs;         /* log a waiting step; 0: never */
    double step_timeout_secs;       /* a step's wait fails; 0: never */
    double orphan_secs;             /* a ps without its chief exits */
    int ready_retry_ms;             /* retry floor while waiting */
    double max_wait_secs;           /* waiting for the chief / the ps */
    int curve;                      /* CURVE on every socket */
    const char *key_dir;
    const char *token;              /* the job token (KEEL_CLUSTER_TOKEN)
                                     * when CURVE is off; NULL/"": none */
    int send_buffer_kib;            /* every socket's send buffer; 0: the
                                     * default (KEEL__WIRE_SNDBUF); -1: the
                                     * kernel's autotuning */
} keel__role_opts;

/* ps_of[i] = the ps holding variable i of vs (-1 for local variables).
 * Deterministic from the variable list alone. */
keel_status keel__cluster_place(const keel_vars *vs, int n_ps,
                                int round_robin, int *ps_of);

/* The ps task: hold this ps's shard of model's variables (and opt's slots),
 * serve until the chief's SHUTDOWN or a SIGTERM/SIGINT. */
keel_status keel__cluster_run_ps(const keel__role_opts *o,
                                 const keel_vars *model,
                                 keel_optimizer *opt);

/* A worker's (or the chief's) link to every ps. vs is borrowed. */
typedef struct keel__worker keel__worker;
keel_status keel__worker_new(const keel__role_opts *o, keel_vars *vs,
                             keel__worker **out);
void keel__worker_free(keel__worker *w);
/* The session backend: updater (push + token + fresh values), publish,
 * is_intact, fetch, wait_for_change, read_global_step (ps 0's step). */
void keel__worker_backend(keel__worker *w, keel_backend *out);
/* Copy every variable (and with_slots, every slot) and the global step
 * from the ps into vs (the chief, before each checkpoint). */
keel_status keel__worker_pull_all(keel__worker *w, keel_vars *vs,
                                  int with_slots);
/* Micro-batches: push these n gradients (one per micro-batch, in order)
 * instead of the session's; the ps left-folds them in global order. */
void keel__worker_set_micro(keel__worker *w, keel_grads *const *g, int n);
/* The chief, at the end: tell every ps to stop (best effort). */
void keel__worker_shutdown_cluster(keel__worker *w);

#endif
