/* keel/distributed.h - the distributed train step for any program: a
 * parameter-server task (keel_ps_run) and the worker backend that a
 * session, MonitoredTrainingSession or the Supervisor runs its step over
 * (keel_cluster_backend_new). Tasks and addresses come from a
 * keel_cluster_spec (keel/cluster.h: TF_CONFIG, Slurm or explicit lists);
 * the wire protocol stays internal (docs/protocol.md describes it).
 * docs/cluster.md has a complete program. */
#ifndef KEEL_DISTRIBUTED_H
#define KEEL_DISTRIBUTED_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/tensor.h>
#include <keel/cluster.h>
#include <keel/session.h>
#include <keel/optimizer.h>

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

/* How a task reaches a ps on its own host (cluster.local_transport). */
typedef enum keel_local_transport {
    /* A ps whose own address is an address of its host also listens on a
     * Unix socket, /tmp/keel-<uid>/<host>-<port> (a directory only that
     * user can enter), and a task whose ps address resolves to an address
     * of its own host connects there when that socket exists, tcp
     * otherwise. The job token or CURVE authenticate it as on tcp. The
     * default (keel_cluster_config_init). */
    KEEL_LOCAL_TRANSPORT_AUTO = 1,
    /* tcp always */
    KEEL_LOCAL_TRANSPORT_TCP = 0
} keel_local_transport;

/* The update rule of a cluster: what a worker computes between its
 * communications with the ps (local steps, accumulation, when it pulls and
 * commits, what it commits) and how a ps applies a commit to the center
 * variables. docs/algorithms.md gives each rule's formulas, its keys and
 * their sources, and what it does with a returning worker. */
typedef enum keel_algorithm {
    KEEL_ALGORITHM_SYNC = 0,        /* SyncReplicas: mean gradient, optimizer */
    KEEL_ALGORITHM_ASYNC,           /* every gradient applied as it comes */
    KEEL_ALGORITHM_HOGWILD,         /* over a ps: async, raw gradients */
    KEEL_ALGORITHM_DOWNPOUR,        /* local steps, accrued gradient,
                                     * Adagrad on the ps */
    KEEL_ALGORITHM_DOWNPOUR_EASY,   /* the same with SGD on the ps */
    KEEL_ALGORITHM_AGN,             /* normalised accumulated update */
    KEEL_ALGORITHM_SAGN,            /* AGN, synchronous (mean of commits) */
    KEEL_ALGORITHM_ADAG,            /* AGN commits damped per element by the
                                     * distance to the worker's last pull */
    KEEL_ALGORITHM_DYNSGD,          /* commits divided by staleness + 1 */
    KEEL_ALGORITHM_EASGD,           /* synchronous elastic averaging */
    KEEL_ALGORITHM_AEASGD,          /* asynchronous elastic averaging */
    KEEL_ALGORITHM_AEAMSGD,         /* the same with Nesterov momentum */
    KEEL_ALGORITHM_MODEL_AVERAGING  /* synchronous mean of local models */
} keel_algorithm;
#define KEEL_ALGORITHM_COUNT 13

/* "sync", "async", "hogwild", "downpour", "downpour_easy", "agn", "sagn",
 * "adag", "dynsgd", "easgd", "aeasgd", "aeamsgd", "model_averaging";
 * static, never NULL ("?" out of range). */
const char *keel_algorithm_name(keel_algorithm a);
/* The rule of a name above; KEEL_EINVAL naming the valid ones. */
keel_status keel_algorithm_from_name(const char *name, keel_algorithm *out);
/* 1 for the rules whose commits meet at a barrier (sync, sagn, easgd,
 * model_averaging): the ps aggregates one commit per replica per round. */
int keel_algorithm_is_sync(keel_algorithm a);
/* 1 for sync, async and hogwild: workers push gradients, the ps apply the
 * optimizer to them (its slots live on the ps). The other rules need no
 * optimizer slots. */
int keel_algorithm_pushes_gradients(keel_algorithm a);
/* 1 for the asynchronous rules whose ps keeps no state per replica
 * (async, hogwild, downpour, downpour_easy, agn, aeasgd, aeamsgd): a
 * running job accepts workers beyond the ones it started with (the ps's
 * membership, keel_launch_add_worker). 0 for the sync rules, dynsgd and
 * adag (their per-replica staleness and pull state is sized at start). */
int keel_algorithm_admits_joiners(keel_algorithm a);

/* A rule and its hyper-parameters. Every task of a cluster must use the
 * same values. Zero in a member marked "0:" selects what it says. */
typedef struct keel_algorithm_config {
    uint32_t struct_size;      /* set by keel_algorithm_config_init() */
    keel_algorithm name;       /* default sync */
    /* eta (alpha in DOWNPOUR): the workers' local SGD step; also ADAG's
     * eta on the ps. 0: the optimizer's learning rate at the step. */
    double learning_rate;
    /* gamma: the ps's step on a DOWNPOUR commit (Adagrad's base rate, or
     * SGD's for downpour_easy). 0: the optimizer's learning rate. */
    double ps_learning_rate;
    /* Local steps per commit: lambda (agn, sagn, adag, dynsgd,
     * model_averaging) or the communication period tau (easgd, aeasgd,
     * aeamsgd). 0: the rule's default (docs/algorithms.md). */
    int window;
    int n_fetch, n_push;       /* DOWNPOUR: pull every n_fetch steps,
                                * commit every n_push; 0: 5 each */
    double epsilon;            /* DOWNPOUR's Adagrad; 0: 1e-8 */
    /* alpha = eta * rho of elastic averaging; 0: 0.9 / replicas (the
     * paper's beta = p * alpha = 0.9). */
    double moving_rate;
    double momentum;           /* delta, AEAMSGD's Nesterov momentum; 0: 0.9 */
    /* sync: replica r (the chief 0, worker i i + 1; without a chief worker
     * i is i) scales its gradient by worker_learning_rates[r] / the
     * optimizer's learning rate, so the update is the mean of each
     * replica's own rate times its gradient. NULL: one rate for all.
     * Borrowed while the options are in use (keel_cluster_backend_new
     * copies it). */
    const double *worker_learning_rates;
    int n_worker_learning_rates;
} keel_algorithm_config;

/* The defaults above for rule name. Cannot fail. */
void keel_algorithm_config_init(keel_algorithm_config *cfg,
                                keel_algorithm name);

/* Options of a cluster task (ps, chief or worker). Fill with
 * keel_cluster_config_init() (the defaults below; the INI [cluster] and
 * [security] keys of `keel train` have the same defaults), then change
 * what you need. Every task of one cluster should use the same options. */
typedef struct keel_cluster_config {
    uint32_t struct_size;         /* set by keel_cluster_config_init() */
    /* The update rule the ps apply to the aggregated gradients (keel's
     * optimizers by kind and hyper-parameters; copied). Its slots live on
     * the ps, are pulled into the chief's variable store before each of
     * its checkpoints and restored from them. Required by keel_ps_run;
     * keel_cluster_backend_new creates the slots in the worker's store
     * when it is set. NULL for a backend: the store has no slots. */
    const keel_optimizer_config *optimizer;
    /* The cluster's update rule (copied). NULL: the spec's mode, sync or
     * async. The rules that need no optimizer (agn, sagn, adag, dynsgd,
     * easgd, aeasgd, aeamsgd, model_averaging, downpour and downpour_easy,
     * whose ps keep their own "downpour_accumulator" slot) create no
     * optimizer slots; optimizer still supplies the learning rate. ADAG
     * keeps one slot per replica ("adag_pull<r>": the center at replica
     * r's last pull) on the ps and in the chief's checkpoints. */
    const keel_algorithm_config *algorithm;
    keel_placement placement;     /* default size-balanced */
    int heartbeat_ms;             /* liveness pings to every ps; 200 */
    int dead_after_ms;            /* a silent ps is dead; 5000 */
    double stall_warn_secs;       /* log a waiting sync step; 10; 0 off */
    double step_timeout_secs;     /* a step's wait fails; 3600; 0 never */
    double orphan_secs;           /* a ps without its chief exits; 600 */
    int ready_retry_ms;           /* worker retry floor while waiting; 50 */
    double max_wait_secs;         /* a chief waits for the ps, a worker
                                   * for the chief; 300 */
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
    /* Sync results independent of the replica count: the step's gradient
     * is defined as L = reduce_leaves canonical leaves of the global batch
     * (consecutive runs of its examples; each leaf's gradient its piece of
     * the global batch's mean) added along the fixed binary tree over
     * them, unweighted (docs/strategy.md); replica r of R owns leaves
     * [r*L/R, (r+1)*L/R) (L a multiple of R) and pushes, in order, the
     * sums of the tree nodes that cover them (one store when R is a
     * power of two dividing L, else a few: keel_cluster_backend_set_micro);
     * the ps add every replica's node sums along the tree when all
     * replicas are aggregated (no backup workers). Every task of a
     * cluster must use the same value. 0 (default): the ps apply the
     * example-weighted mean of the replicas' gradients (each the mean over
     * keel_grads_examples of the session's store), summed in replica
     * order. */
    int64_t reduce_leaves;
    /* The chief applies the updates (the plain sync rule only: sync mode
     * or algorithm sync, no per-worker learning rates, else
     * KEEL_EINVAL; set on every task of the cluster; default 0): a sync step's mean gradient goes from the ps
     * to the chief instead of into an optimizer there; the chief calls
     * chief_apply on its own variables (equal to the ps's) and then sends
     * every ps its variables and slots; the step's other replicas get the
     * new values once that has arrived. For update rules that are not
     * elementwise per variable (K-FAC). The ps then need no optimizer and
     * hold every slot of their variables in the store they are given.
     * chief_apply (required on the chief, unused elsewhere) gets the step's
     * mean gradients in mean, a gradient store of vs (borrowed for the
     * call); chief_apply_ctx is passed through (borrowed for the
     * backend's life). */
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
    /* Where a ps listens (cluster.bind_address). NULL or "" (default):
     * every address of this machine its own entry's host resolves to;
     * "*": every interface; an interface name ("eth0"): its addresses; an
     * address of this machine: that one. Also what
     * keel_cluster_spec_detect checks the ps's entry against. Borrowed
     * while the config is in use. */
    const char *bind_address;
    /* Sharded checkpoints (checkpoint.sharded): 1: before each of the
     * chief's checkpoints every ps writes its own variables and slots as
     * one shard into checkpoint_dir (SAVE_SHARD) and the chief commits
     * the index (keel_saver_save_sharded) once all have; nothing travels
     * through the chief. checkpoint_dir must then be the same directory on
     * every task (a shared file system) and the chief's saver must use the
     * default basename. 0 (default): the chief pulls every variable and
     * slot and writes one file. Update rules whose chief keeps a model of
     * its own (elastic averaging, local SGD) always pull. */
    int sharded_checkpoints;
    const char *checkpoint_dir;   /* borrowed while the config is in use;
                                   * NULL: no sharded checkpoints */
    /* Elastic sync (default 0; every task of the cluster the same): the
     * job goes on when a replica leaves for good (silent past
     * dead_after_ms, or its LEAVE) and when one joins (a worker of any
     * index, up to 1024 replicas). The ps decide the live replicas at
     * step boundaries and tell each one its position among them
     * (keel_cluster_backend_membership); live replica p of M owns leaves
     * [p*L/M, (p+1)*L/M) of L = reduce_leaves, so every step is the same
     * sum of the same leaves whoever computed them. Needs sync mode,
     * reduce_leaves > 0, no backup workers, no chief_applies and one ps
     * task (KEEL_EINVAL otherwise). */
    int elastic;
    /* A ps on the task's own host over a Unix socket (default auto) or
     * tcp; every task of one host should use the same value. */
    keel_local_transport local_transport;
    /* Partitioned variables (every task of the cluster the same): a
     * non-local variable of at least two rows (the first dimension) whose
     * data exceeds partition_bytes is split by rows into
     * K = min(ceil(bytes / partition_bytes), max_partitions, rows) parts,
     * the first rows % K of them one row longer; part k is an ordinary
     * variable "NAME/part_k" on the ps (placed like any other, with its
     * own slots), and the backend assembles NAME from its parts after
     * each pull and splits NAME's gradient before each push, so the
     * caller's store, its checkpoints and the step see one variable. The
     * ps compute the same values as without partitioning (the update
     * rules are elementwise). 0 (default): no variable is split.
     * max_partitions: 0 (default): the number of ps tasks; else
     * 1..KEEL_CLUSTER_MAX_PARTITIONS. Not with sharded_checkpoints,
     * chief_applies or an update rule that keeps the chief's own model
     * (KEEL_EINVAL). */
    int64_t partition_bytes;
    int max_partitions;
} keel_cluster_config;

/* The largest keel_cluster_config.max_partitions. */
#define KEEL_CLUSTER_MAX_PARTITIONS 1024

/* The defaults above. Cannot fail. */
void keel_cluster_config_init(keel_cluster_config *opts);

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
                        const keel_cluster_config *opts);

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
                                     const keel_cluster_config *opts,
                                     keel_cluster_backend **out);
/* Stop the heartbeats and close the sockets (logs the per-step timing).
 * Does not stop the ps. NULL is a no-op. */
void keel_cluster_backend_free(keel_cluster_backend *b);

/* The session backend ("ps") to put in keel_session_config.manager.backend
 * (keel_supervisor_config.session.manager.backend): the updater pushes the step's gradients
 * to every ps (a variable's gradient rows as its ids and rows: the updater
 * is KEEL_UPDATER_ROWS, docs/cluster.md "Sparse rows") and takes back the new values and the cluster's global step
 * (in sync mode once replicas_to_aggregate replicas pushed); the chief
 * publishes its restored or initialized state to the ps (or joins live ps
 * without rollback: their state wins over any checkpoint), workers wait
 * for it (an event, not polling) and pull it; a restarted ps or chief
 * makes the step recoverable; before each checkpoint the chief pulls every
 * variable, slot and the global step; at a clean end the chief stops the
 * ps (opts->shutdown_at_end). *out is valid while b lives. */
void keel_cluster_backend_session_backend(keel_cluster_backend *b,
                                          keel_backend *out);

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
/* Elastic sync (keel_cluster_config.elastic): the membership the ps
 * last told this replica, for the step it computes next: *epoch (0: none
 * told yet, or not elastic), *position among the *count live replicas
 * (-1: not one of them yet; it is admitted at the next step boundary).
 * The replica owns leaves [position*L/count, (position+1)*L/count). */
keel_status keel_cluster_backend_membership(const keel_cluster_backend *b,
                                            int64_t *epoch, int *position,
                                            int *count);
/* Micro-batches: push these n gradient stores (1..64, one per
 * micro-batch, in order; borrowed while set) instead of the session's; the
 * ps add them in global order. They are pieces of the step's mean (each
 * micro-batch's examples' gradients divided by the global batch): the ps
 * add them unweighted, the example count is not used. Every replica sets
 * them or none does. n 0: the session's gradients again. */
keel_status keel_cluster_backend_set_micro(keel_cluster_backend *b,
                                           keel_grads *const *grads, int n);

/* This process's cluster from its environment: TF_CONFIG when it is set
 * and not empty, else Slurm's variables when SLURM_PROCID is set (with
 * opts' slurm_num_ps and slurm_port_base; opts NULL: the defaults), else a
 * local spec (train alone). A cluster of only a chief is local too. The
 * spec is validated: KEEL_EINVAL lists every problem. Caller owns *out:
 * keel_cluster_spec_free(). */
keel_status keel_cluster_spec_detect(const keel_cluster_config *opts,
                                     keel_cluster_spec **out);

/* ---- all-reduce (train.strategy = multi_worker_mirrored) ------------------
 * Every rank (an MPI process: mpirun -n N, srun) holds every variable and
 * computes its slice of the global batch; the ranks' gradients are summed
 * in a fixed order (a binary tree over gradient leaves, then over ranks in
 * rank order: for power-of-two leaf and rank counts the same tree whatever
 * the rank count, so 1, 2, 4 ranks give identical bits) and every rank
 * applies the same update. Rank 0 is the chief: it restores or initializes
 * the variables and broadcasts them, and alone writes checkpoints. A rank
 * that fails ends the job (no per-task recovery): restart every rank from
 * the newest checkpoint (docs/allreduce.md). Needs keel configured with
 * MPI (Debian: libopenmpi-dev, openmpi-bin). */

/* 1 if keel was built with MPI. */
int keel_collective_is_available(void);
/* 1 if this process was started as an MPI rank (mpirun's, srun's or a PMI
 * launcher's environment variables are set). */
int keel_collective_env_detected(void);

/* One process's link to the other ranks. Opaque; one per process. */
typedef struct keel_collective keel_collective;

/* Join the ranks (MPI_Init unless the program initialized MPI; a process
 * started without a launcher is a single rank; MPI allows one
 * initialization per process). update (copied; NULL: none) is the local
 * update the backend's updater applies after the all-reduce. Every rank
 * must build the same variables in the same order. SIGTERM/SIGINT handlers the process installed
 * (keel_session_install_signal_handlers) are deferred to the next
 * all-reduce, so that every rank stops after the same step. Without MPI:
 * KEEL_EINVAL naming the packages to install. Caller owns *out:
 * keel_collective_free(). */
keel_status keel_collective_new(const keel_updater *update,
                                keel_collective **out);
int keel_collective_rank(const keel_collective *c);   /* 0 .. size-1 */
int keel_collective_size(const keel_collective *c);
/* Sum these n gradient stores (this rank's leaves, in global order; a
 * power of two up to 1024; borrowed while set) instead of the session's
 * gradients. n 0: the session's gradients are the rank's one leaf. */
keel_status keel_collective_set_leaves(keel_collective *c,
                                       keel_grads *const *leaves, int n);
/* Every rank: g (the session's store; overwritten) becomes the sum of every
 * rank's leaves along the fixed tree (leaves are pieces of the global
 * batch's mean); without leaves, the example-weighted mean of every rank's
 * g (each the mean over keel_grads_examples(g) examples). A failed or dead
 * rank gives KEEL_EUNAVAILABLE. */
keel_status keel_collective_allreduce(keel_collective *c, keel_grads *g);
/* Every rank: rank 0's global step, variables and slots (not local
 * variables) into vs, marked initialized. */
keel_status keel_collective_broadcast(keel_collective *c, keel_vars *vs);
keel_status keel_collective_barrier(keel_collective *c);
/* The session backend ("allreduce") to put in
 * keel_session_config.manager.backend: the updater all-reduces then applies the update given to
 * keel_collective_new; the chief (rank 0) publishes its restored or
 * initialized state by broadcast, the other ranks (session workers with no
 * checkpoint directory) take it as their fetch. *out valid while c lives. */
void keel_collective_session_backend(keel_collective *c, keel_backend *out);
/* Restore the signal handlers and MPI_Finalize (when this handle
 * initialized MPI and the session ended without an error: a failed rank
 * exits without it, and the launcher ends the others). NULL is a no-op. */
void keel_collective_free(keel_collective *c);

#ifdef __cplusplus
}
#endif
#endif
