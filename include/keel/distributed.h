/* keel/distributed.h - the distributed train step for any program: a
 * parameter-server task (keel_ps_run) and the worker backend that a
 * session, MonitoredTrainingSession or the Supervisor runs its step over
 * (keel_cluster_backend_new). Tasks and addresses come from a
 * keel_cluster_spec (keel/cluster.h: TF_CONFIG, Slurm or explicit lists);
 * the wire protocol stays internal. docs/cluster.md has a complete
 * program. */
#ifndef KEEL_DISTRIBUTED_H
#define KEEL_DISTRIBUTED_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/tensor.h>
#include <keel/cluster.h>
#include <keel/session.h>
#include <keel/train.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How variables are spread over the ps tasks. Every task computes the
 * same placement from the variable list alone (names, shapes, order), so
 * every task must create the same variables in the same order. */
typedef enum keel_placement {
    KEEL_PLACEMENT_SIZE_BALANCED = 0, /* each to the least-loaded ps */
    KEEL_PLACEMENT_ROUND_ROBIN        /* variable i to ps i mod n */
} keel_placement;

/* Options of a cluster task (ps, chief or worker). Fill with
 * keel_cluster_options_init() (the defaults below; the INI [cluster] and
 * [security] keys of `keel train` have the same defaults), then change
 * what you need. Every task of one cluster should use the same options. */
typedef struct keel_cluster_options {
    uint32_t struct_size;         /* sizeof(keel_cluster_options) */
    /* The update rule the ps apply to the aggregated gradients (keel's
     * optimizers by kind and hyper-parameters; copied). Its slots live on
     * the ps, are pulled into the chief's variable store before each of
     * its checkpoints and restored from them. Required by keel_ps_run;
     * keel_cluster_backend_new creates the slots in the worker's store
     * when it is set. NULL for a backend: the store has no slots. */
    const keel_optimizer_config *optimizer;
    keel_placement placement;     /* default size-balanced */
    int heartbeat_ms;             /* liveness pings to every ps; 200 */
    int dead_after_ms;            /* a silent ps is dead; 5000 */
    double stall_warn_secs;       /* log a waiting sync step; 10; 0 off */
    double step_timeout_secs;     /* a step's wait fails; 3600; 0 never */
    double orphan_secs;           /* a ps without its chief exits; 600 */
    int ready_retry_ms;           /* worker retry floor while waiting; 50 */
    double max_wait_secs;         /* a worker waits for the chief; 7200 */
    int send_buffer_kib;          /* every socket's send buffer; 512;
                                   * 0: the kernel's autotuning */
    int curve;                    /* CURVE on every socket; 0 */
    const char *key_dir;          /* keel keygen's directory (with curve):
                                   * <type><index>.key(_secret) is this
                                   * task's pair; borrowed for the call */
    /* The job's shared secret when curve is off: every connection then
     * authenticates as its task (ZAP PLAIN, an HMAC of the task name under
     * the token) and the ps obeys a task only in its own role. Default:
     * the KEEL_CLUSTER_TOKEN environment variable when the options are
     * initialized (keel launch sets one per job); NULL or "": none, and a
     * ps then warns. Borrowed for the call. */
    const char *token;
    /* The chief, when its session closes for any reason but an error:
     * tell every ps to stop (they exit 0). Default 1; 0 leaves the ps
     * serving (e.g. for a second session over the same cluster). */
    int shutdown_at_end;
    /* keel_cluster_spec_detect under Slurm: the first slurm_num_ps ranks
     * are ps (default 1); task k on a node listens on slurm_port_base + k
     * (default 8888). */
    int slurm_num_ps;
    int slurm_port_base;
    /* The chief applies the updates (sync mode only; set on every task of
     * the cluster; default 0): a sync step's mean gradient goes from the ps
     * to the chief instead of into an optimizer there; the chief calls
     * chief_apply on its own variables (equal to the ps's) and then sends
     * every ps its variables and slots; the step's other replicas get the
     * new values once that has arrived. For update rules that are not
     * elementwise per variable (K-FAC). The ps then need no optimizer and
     * hold every slot of their variables in the store they are given.
     * chief_apply (required on the chief, unused elsewhere) gets the step's
     * mean gradients in mean, a gradient store of vs (borrowed for the
     * call); chief_apply_ctx is passed through. */
    int chief_applies;
    keel_status (*chief_apply)(void *ctx, keel_vars *vs, keel_grads *mean,
                               int64_t global_step);
    void *chief_apply_ctx;
    /* With chief_applies: the chief's COMMIT carries the trainable
     * variables and their slots only (other tasks write the rest with
     * keel_cluster_backend_mix). Default 0: every variable and slot. */
    int chief_commits_trainable_only;
    /* Sync mode: the replicas a step aggregates, overriding the spec's
     * (e.g. only the replicas that push gradients); 0: the spec's. */
    int replicas_to_aggregate;
} keel_cluster_options;

/* The defaults above. Cannot fail. */
void keel_cluster_options_init(keel_cluster_options *opts);

/* The ps task of spec (which must be a validated spec whose task is a
 * ps): hold this ps's shard of vars (borrowed for the call; only its
 * names, shapes, flags and order are read: the chief sends the values)
 * with opts->optimizer's slots, aggregate the workers' gradients
 * (SyncReplicas with tokens in sync mode, every push at once in async
 * mode) and apply them, until the chief's shutdown (KEEL_OK), a SIGTERM or
 * SIGINT once keel_session_install_signal_handlers() ran (KEEL_OK), or
 * opts->orphan_secs without the chief (KEEL_EUNAVAILABLE). With
 * opts->chief_applies, opts->optimizer may be NULL. */
keel_status keel_ps_run(const keel_cluster_spec *spec, const keel_vars *vars,
                        const keel_cluster_options *opts);

/* A chief's or worker's link to every ps. Opaque; used by one session at
 * a time. */
typedef struct keel_cluster_backend keel_cluster_backend;

/* Connect to every ps of spec (a validated spec whose task is the chief
 * or a worker; spec and vars are borrowed and must outlive the backend)
 * and start the heartbeats. The variables of vars are placed on the ps
 * (keel_placement); with opts->optimizer its slots are created in vars.
 * Nothing is sent until a session uses the backend. Caller owns *out:
 * keel_cluster_backend_free(). */
keel_status keel_cluster_backend_new(const keel_cluster_spec *spec,
                                     keel_vars *vars,
                                     const keel_cluster_options *opts,
                                     keel_cluster_backend **out);
/* Stop the heartbeats and close the sockets (logs the per-step timing).
 * Does not stop the ps. NULL is a no-op. */
void keel_cluster_backend_free(keel_cluster_backend *b);

/* The session backend ("ps") to put in keel_session_config.backend or
 * keel_supervisor_config.backend: the updater pushes the step's gradients
 * to every ps and takes back the new values and the cluster's global step
 * (in sync mode once replicas_to_aggregate replicas pushed); the chief
 * publishes its restored or initialized state to the ps (or joins live ps
 * without rollback: their state wins over any checkpoint), workers wait
 * for it (an event, not polling) and pull it; a restarted ps or chief
 * makes the step recoverable; before each checkpoint the chief pulls every
 * variable, slot and the global step; at a clean end the chief stops the
 * ps (opts->shutdown_at_end). *out is valid while b lives. */
void keel_cluster_backend_get(keel_cluster_backend *b, keel_backend *out);

/* The chief: copy every variable, slot and the global step from the ps
 * into vars now (what a checkpoint save does first). */
keel_status keel_cluster_backend_pull(keel_cluster_backend *b);
/* The chief: tell every ps to stop now (best effort; logged). */
void keel_cluster_backend_shutdown(keel_cluster_backend *b);
/* Read the named variables of the store (n of them; no slots) from the
 * ps into it now, and the cluster's global step into *global_step (may be
 * NULL). Any task. */
keel_status keel_cluster_backend_pull_vars(keel_cluster_backend *b,
                                           const char *const *names,
                                           size_t n, int64_t *global_step);
/* On the ps, for each named non-trainable variable of the store:
 * v = decay v + (1 - decay) t[i] (decay in [0, 1); 0 assigns t[i]), as
 * one message per ps, each applied whole. For state other tasks read
 * (K-FAC's role-split factors and inverses). Any training task. */
keel_status keel_cluster_backend_mix(keel_cluster_backend *b,
                                     const char *const *names,
                                     const keel_tensor *const *t, size_t n,
                                     double decay);
/* Micro-batches: push these n gradient stores (1..64, one per
 * micro-batch, in order; borrowed while set) instead of the session's; the
 * ps add them in global order. n 0: the session's gradients again. */
keel_status keel_cluster_backend_set_micro(keel_cluster_backend *b,
                                           keel_grads *const *grads, int n);

/* This process's cluster from its environment: TF_CONFIG when it is set
 * and not empty, else Slurm's variables when SLURM_PROCID is set (with
 * opts' slurm_num_ps and slurm_port_base; opts NULL: the defaults), else a
 * local spec (train alone). A cluster of only a chief is local too. The
 * spec is validated: KEEL_EINVAL lists every problem. Caller owns *out:
 * keel_cluster_spec_free(). */
keel_status keel_cluster_spec_detect(const keel_cluster_options *opts,
                                     keel_cluster_spec **out);

#ifdef __cplusplus
}
#endif
#endif
