/* job_cluster.c - the training job's roles in a cluster or a collective:
 * the ps task, a chief's or worker's backend (its cluster options, the
 * reduction tree's leaves, micro-batches, K-FAC's roles), and
 * multi_worker_mirrored's checks, ranks and backend; a replica's session
 * moves its data slice to the global step after every creation. */
#include <config.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <keel/cluster.h>
#include <keel/config.h>
#include <keel/distributed.h>
#include <keel/session.h>
#include <keel/train.h>
#include "util.h"
#include "app_int.h"
#include "job_int.h"
#include "../train/train_int.h"

/* train.strategy = multi_worker_mirrored: what the config and the
 * process must offer before MPI starts. */
keel_status
keel__job_mwm_check(const keel_config *cfg, int in_cluster)
{
    int64_t leaves = keel_config_int(cfg, "train.leaves");
    int64_t batch = keel_config_int(cfg, "train.batch_size");
    if (!keel_collective_is_available())
        return keel__fail(KEEL_EINVAL, "train.strategy = "
                          "multi_worker_mirrored (%s) needs MPI, and this "
                          "keel was built without it: apt-get install "
                          "libopenmpi-dev openmpi-bin, re-run configure and "
                          "rebuild (or use train.strategy = "
                          "parameter_server)",
                          keel_config_origin(cfg, "train.strategy"));
    if (in_cluster)
        return keel__fail(KEEL_EINVAL, "train.strategy = "
                          "multi_worker_mirrored takes its ranks from MPI "
                          "(mpirun -n N, srun, keel launch --strategy "
                          "multi_worker_mirrored), not from a cluster spec: "
                          "unset TF_CONFIG and the [cluster] task lists");
    if (strcmp(keel_config_str(cfg, "optimizer.name"), "kfac") == 0)
        return keel__fail(KEEL_EINVAL, "optimizer.name = kfac does not run "
                          "under train.strategy = multi_worker_mirrored yet "
                          "(one process only)");
    if (keel_config_is_set(cfg, "algorithm.name") &&
        strcmp(keel_config_str(cfg, "algorithm.name"), "sync") != 0)
        return keel__fail(KEEL_EINVAL, "algorithm.name = %s (%s) does not "
                          "apply to train.strategy = multi_worker_mirrored "
                          "(its ranks all-reduce every step, as sync): "
                          "remove algorithm.name or use parameter_server",
                          keel_config_str(cfg, "algorithm.name"),
                          keel_config_origin(cfg, "algorithm.name"));
    if (keel_config_int(cfg, "train.micro_batch") > 0)
        return keel__fail(KEEL_EINVAL, "train.micro_batch (%s) does not "
                          "apply to multi_worker_mirrored: its gradients are "
                          "always summed over train.leaves fixed leaves",
                          keel_config_origin(cfg, "train.micro_batch"));
    if (batch % leaves != 0)
        return keel__fail(KEEL_EINVAL, "train.leaves = %lld (%s) must "
                          "divide train.batch_size = %lld",
                          (long long)leaves,
                          keel_config_origin(cfg, "train.leaves"),
                          (long long)batch);
    return KEEL_OK;
}

static keel_status
mwm_check_ranks(const keel_config *cfg, int ranks)
{
    int64_t leaves = keel_config_int(cfg, "train.leaves");
    if (leaves < ranks || (leaves + ranks - 1) / ranks > 64)
        return keel__fail(KEEL_EINVAL, "multi_worker_mirrored: %d ranks "
                          "and train.leaves = %lld: every rank needs at "
                          "least one leaf and at most 64 (start at most %lld "
                          "ranks, or set train.leaves)",
                          ranks, (long long)leaves, (long long)leaves);
    return KEEL_OK;
}

/* A cluster task's role: sets r->is_ps for a ps task (and looks no
 * further), else r->is_chief, r->replica and r->replicas of a chief or
 * worker; refuses other task types and a cluster without a ps. */
keel_status
keel__job_cluster_role(keel__train_run *r)
{
    const keel_cluster_spec *spec = r->spec;
    keel_task_type t = keel_cluster_spec_task_type(spec);
    keel_status st;

    if ((st = keel_cluster_spec_validate(spec)) != KEEL_OK)
        return st;
    if (t == KEEL_TASK_PS) {
        r->is_ps = 1;
        return KEEL_OK;
    }
    if (t != KEEL_TASK_CHIEF && t != KEEL_TASK_WORKER)
        return keel__fail(KEEL_EINVAL, "train: task type %s does not "
                          "train (use chief, worker or ps)",
                          keel_task_type_name(t));
    if (keel_cluster_spec_num_tasks(spec, KEEL_TASK_PS) == 0)
        return keel__fail(KEEL_EINVAL, "train: the cluster has no ps "
                          "task (parameter-server training needs at "
                          "least one)");
    r->is_chief = keel_cluster_spec_is_chief(spec);
    r->replicas = keel_cluster_spec_num_replicas(spec);
    r->replica = keel_cluster_spec_replica_index(spec);
    return KEEL_OK;
}

/* multi_worker_mirrored: start the collective in r->coll (the caller
 * frees it, on failure too) and take this process's rank, the number of
 * ranks and the chief role from it. */
keel_status
keel__job_ranks(keel__train_run *r)
{
    keel_updater up;
    keel_status st;

    /* the ranks before the data: a rank's slice is its rank's part */
    up.ctx = &r->j;
    up.apply = keel__job_apply;
    st = keel_collective_new(&up, &r->coll);
    if (st != KEEL_OK)
        return st;
    r->replica = keel_collective_rank(r->coll);
    r->replicas = keel_collective_size(r->coll);
    r->is_chief = r->replica == 0;
    return mwm_check_ranks(r->cfg, r->replicas);
}

/* checkpoint.sharded: on, off, or auto (on when every ps listens on a
 * loopback address: one machine, one checkpoint directory). A basename
 * other than the shards' default keeps it off. */
static int
sharded_from(const keel_config *cfg, const keel_cluster_spec *spec)
{
    const char *v = keel_config_str(cfg, "checkpoint.sharded");
    size_t n_ps = spec ? keel_cluster_spec_num_tasks(spec, KEEL_TASK_PS) : 0;
    if (strcmp(v, "off") == 0 || n_ps == 0 ||
        strcmp(keel_config_str(cfg, "checkpoint.basename"),
               "model.ckpt") != 0)
        return 0;
    if (strcmp(v, "on") == 0)
        return 1;
    for (size_t i = 0; i < n_ps; i++) {
        const char *a = keel_cluster_spec_address(spec, KEEL_TASK_PS,
                                                  (int)i);
        if (a == NULL || (strncmp(a, "127.", 4) != 0 &&
                          strncmp(a, "localhost:", 10) != 0 &&
                          strncmp(a, "[::1]:", 6) != 0))
            return 0;
    }
    return 1;
}

/* The cluster options of the config's [cluster] and [security] keys. */
static void
cluster_options_from(const keel_config *cfg, keel__job *j,
                     const keel_cluster_spec *spec, keel_cluster_config *o)
{
    keel_cluster_config_init(o);
    o->optimizer = keel_optimizer_get_config(j->opt);
    o->algorithm = j->has_algo ? &j->algo : NULL;
    o->placement = strcmp(keel_config_str(cfg, "cluster.placement"),
                          "round_robin") == 0
                       ? KEEL_PLACEMENT_ROUND_ROBIN
                       : KEEL_PLACEMENT_SIZE_BALANCED;
    o->dead_after_ms = (int)keel_config_int(cfg, "cluster.dead_after_ms");
    o->heartbeat_ms = (int)keel_config_int(cfg, "cluster.heartbeat_ms");
    o->stall_warn_secs = keel_config_double(cfg, "cluster.stall_warn_secs");
    o->step_timeout_secs =
        keel_config_double(cfg, "cluster.step_timeout_secs");
    o->orphan_secs = keel_config_double(cfg, "cluster.orphan_secs");
    o->ready_retry_ms = (int)keel_config_int(cfg, "cluster.ready_retry_ms");
    o->max_wait_secs = keel_config_double(cfg, "cluster.max_wait_secs");
    o->bind_address = keel_config_str(cfg, "cluster.bind_address");
    o->local_transport =
        strcmp(keel_config_str(cfg, "cluster.local_transport"), "tcp") == 0
            ? KEEL_LOCAL_TRANSPORT_TCP : KEEL_LOCAL_TRANSPORT_AUTO;
    o->curve = keel_config_bool(cfg, "security.curve");
    o->key_dir = keel_config_str(cfg, "security.key_dir");
    o->send_buffer_kib =
        (int)keel_config_int(cfg, "cluster.send_buffer_kib");
    o->reduce_leaves = j->leaves;
    o->elastic = keel_config_bool(cfg, "cluster.elastic");
    o->sharded_checkpoints = sharded_from(cfg, spec);
    o->partition_bytes = keel_config_int(cfg, "cluster.partition_bytes");
    o->max_partitions = (int)keel_config_int(cfg, "cluster.max_partitions");
    o->checkpoint_dir = keel_config_str(cfg, "checkpoint.dir");
    if (j->kfac != NULL) {
        /* K-FAC's update is not per variable: the chief applies it, its
         * state (factors, inverses, velocity) lives on the ps */
        o->optimizer = NULL;
        o->chief_applies = 1;
        o->chief_apply = keel__job_chief_apply;
        o->chief_apply_ctx = j;
        if (j->kdist != NULL)      /* roles: the library's chief */
            (void)keel_kfac_dist_cluster_config(j->kdist, o);
        o->replicas_to_aggregate = j->kfac_rta;
    }
}

/* K-FAC in a cluster of replicas: the replicas a sync step aggregates
 * (roles: the gradient workers; chief with kfac.replicas_to_aggregate =
 * kfac: ceil(0.6 N) for N >= 3, tensorflow/kfac's convnet rule). */
static keel_status
kfac_replicas(const keel_config *cfg, int replicas, keel__job *j)
{
    int role, index, counts[3];
    keel_status st;
    if (j->kfac == NULL)
        return KEEL_OK;
    if (keel__kfac_dist_roles(cfg)) {
        st = keel__kfac_dist_role(cfg, 0, replicas, &role, &index, counts);
        if (st == KEEL_OK)
            j->kfac_rta = counts[0];
        return st;
    }
    if (strcmp(keel_config_str(cfg, "kfac.replicas_to_aggregate"), "kfac")
        == 0 && replicas >= 3)
        j->kfac_rta = (int)ceil(0.6 * replicas);
    return KEEL_OK;
}

/* j's update rule in cluster (NULL: one process, or ranks of a collective:
 * sync SGD): [algorithm] when set, else the cluster's mode. A rule pushing
 * gradients gets the optimizer's slots here. */
keel_status
keel__job_rule(keel__job *j, const keel_cluster_spec *cluster)
{
    j->rule_sync = j->opt_slots = 1;
    if (cluster != NULL && j->has_algo) {
        j->rule_sync = keel_algorithm_is_sync(j->algo.name);
        j->opt_slots = keel_algorithm_pushes_gradients(j->algo.name);
    } else if (cluster != NULL) {
        j->rule_sync = keel_cluster_spec_mode(cluster) == KEEL_CLUSTER_SYNC;
    }
    return j->opt_slots && j->opt != NULL
        ? keel_optimizer_prepare(j->opt, j->vs) : KEEL_OK;
}

/* The canonical leaves of a sync cluster's global batch: the model's
 * pieces, when every replica's slice is a whole number of them and one
 * process computes the whole batch as one tree (at most
 * KEEL__MODEL_TREE_PIECES pieces); 0 otherwise (logged: results then
 * depend on the replica count). */
static int64_t
leaves_for(const keel_config *cfg, const keel__job *j,
           const keel_cluster_spec *spec)
{
    int R = keel_cluster_spec_num_replicas(spec);
    int64_t p = (int64_t)keel__model_piece(j->model), L;
    const char *why = NULL;
    if (keel_cluster_spec_mode(spec) != KEEL_CLUSTER_SYNC ||
        !keel_config_bool(cfg, "cluster.reduce_tree"))
        return 0;
    /* an update rule of its own, or per-worker rates: the ps needs each
     * replica's commit, not one tree of the batch */
    if (j->has_algo && (j->algo.name != KEEL_ALGORITHM_SYNC ||
                        j->algo.n_worker_learning_rates > 0))
        return 0;
    L = j->global_batch / p;
    if (keel_cluster_spec_replicas_to_aggregate(spec) != R)
        why = "backup workers (replicas_to_aggregate < replicas)";
    else if (j->kfac_rta > 0 && j->kfac_rta != R)
        why = "K-FAC's sync steps aggregate the gradients of some replicas "
              "only (kfac.replicas_to_aggregate, kfac.distributed)";
    else if (keel_config_int(cfg, "train.micro_batch") > 0)
        /* a left fold of micro-batch gradients in global order: the same
         * sum for any replica count, without the tree */
        return 0;
    else if (j->global_batch % p != 0 ||
             (L % R != 0 && !keel_config_bool(cfg, "cluster.elastic")))
        why = "train.batch_size is not a multiple of the replicas times "
              "the model's piece";
    else if (L > KEEL__MODEL_TREE_PIECES)
        why = "the global batch has more pieces than one tree of the model";
    if (why != NULL) {
        if (R > 1)
            keel__log(KEEL_LOG_INFO, "sync results depend on the number of "
                      "replicas (%d) in this run: %s; the model's piece is "
                      "%lld examples (docs/determinism.md)", R, why,
                      (long long)p);
        return 0;
    }
    return L;
}

/* This replica's nodes of the tree over j->leaves: more than one gets a
 * gradient store each, pushed in order instead of the session's. */
static keel_status
tree_nodes_build(keel__job *j, int replica, int replicas)
{
    keel__tree_node nodes[64];
    int64_t per = j->leaves / replicas, first = replica * per;
    size_t piece = keel__model_piece(j->model);
    int k = keel__tree_cover(j->leaves, first, first + per, nodes, 64);
    keel_status st;
    if (k < 1)
        return keel__fail(KEEL_EINTERNAL, "tree cover of replica %d", replica);
    keel__log(KEEL_LOG_INFO, "sync results independent of the replica "
              "count: the global batch is %lld leaves of %zu examples; "
              "this replica pushes %d node sum(s)", (long long)j->leaves,
              piece, k);
    if (k == 1)
        return KEEL_OK;
    for (int c = 0; c < k; c++) {
        j->node_off[c] = (size_t)(nodes[c].lo - first) * piece;
        j->node_len[c] = (size_t)(nodes[c].hi - nodes[c].lo) * piece;
        if ((st = keel_grads_new(j->vs, &j->micro_g[c])) != KEEL_OK)
            return st;
        j->n_micro = c + 1;
    }
    j->n_nodes = k;
    return keel_cluster_backend_set_micro(j->worker, j->micro_g, k);
}

/* The ps task: build the model only to know the variables, then serve. */
keel_status
keel__job_run_ps(const keel_config *cfg, const keel_cluster_spec *spec,
       const keel_job_config *opts)
{
    keel__job j;
    keel_cluster_config o;
    keel_status st = KEEL_OK;
    /* Before anything slow: a SIGTERM during start-up then ends the task
     * cleanly instead of killing it. */
    if (opts->handle_signals)
        st = keel_session_install_signal_handlers();
    if (st == KEEL_OK)
        st = keel__job_build(&j, cfg, 0, 1, 0, 0);
    else
        memset(&j, 0, sizeof j);
    if (st == KEEL_OK)
        st = kfac_replicas(cfg, keel_cluster_spec_num_replicas(spec), &j);
    if (st == KEEL_OK) {
        j.leaves = leaves_for(cfg, &j, spec);
        cluster_options_from(cfg, &j, spec, &o);
        st = keel_ps_run(spec, j.vs, &o);
    }
    if (opts->handle_signals)
        keel_session_uninstall_signal_handlers();
    keel__job_free(&j);
    return st;
}

/* A cluster replica, after every session creation: its data slice goes
 * to the global step's batch (a worker that joins or rejoins, a chief that
 * joined live ps). Exact for sync without backups, where every step takes
 * one global batch. The state blob is train/'s little-endian layout
 * (epoch at byte 8, offset at 16), checked against the accessors first. */
static keel_status
position_after_create(void *ctx, keel_session *s)
{
    keel__job *j = ctx;
    int64_t g = keel_session_global_step(s);
    int64_t spe = keel_data_iter_steps_per_epoch(j->it);
    int64_t epoch, offset;
    unsigned char b[KEEL_DATA_ITER_STATE_BYTES];
    size_t len = 0;
    keel_status st;
    if (spe <= 0)
        return KEEL_OK;
    epoch = g / spe;
    offset = (g % spe) * j->global_batch;
    if (epoch == keel_data_iter_epoch(j->it) &&
        offset == keel_data_iter_offset(j->it))
        return KEEL_OK;
    st = keel_data_iter_state(j->it, b, sizeof b, &len);
    if (st != KEEL_OK)
        return st;
    for (int k = 0; k < 8; k++) {
        if (b[8 + k] != (unsigned char)((uint64_t)keel_data_iter_epoch(j->it)
                                        >> (8 * k)) ||
            b[16 + k] != (unsigned char)((uint64_t)
                                         keel_data_iter_offset(j->it)
                                         >> (8 * k))) {
            keel__log(KEEL_LOG_WARN, "data: unknown iterator state layout; "
                      "this replica's data position is not moved to step "
                      "%lld", (long long)g);
            return KEEL_OK;
        }
        b[8 + k] = (unsigned char)((uint64_t)epoch >> (8 * k));
        b[16 + k] = (unsigned char)((uint64_t)offset >> (8 * k));
    }
    st = keel_data_iter_set_state(j->it, b, len);
    if (st == KEEL_OK)
        keel__log(KEEL_LOG_INFO, "data: this replica's slice continues at "
                  "epoch %lld, example %lld (global step %lld)",
                  (long long)epoch + 1, (long long)offset, (long long)g);
    return st;
}

/* One gradient store per micro-batch (or leaf) of this replica: k of them
 * (at most 64). */
static keel_status
alloc_micro(keel__job *j, int k)
{
    keel_status st = KEEL_OK;
    for (; st == KEEL_OK && j->n_micro < k; j->n_micro++)
        st = keel_grads_new(j->vs, &j->micro_g[j->n_micro]);
    if (st != KEEL_OK)
        j->n_micro--;
    return st;
}

/* A replica of several (parameter-server or all-reduce): its session runs
 * over backend (borrowed: lives until the session is freed), moves its
 * data slice to the global step after every creation (a hook after
 * hooks[0..n)), and only the chief writes checkpoints. A backend that
 * applies the updates (the ps's, K-FAC's roles) takes the place of
 * keel__job_apply: the session is given no updater of its own. */
static void
replica_session(keel__job *j, keel_training_config *tc,
                const keel_backend *backend, keel_hook *hooks, size_t n_hooks,
                int is_chief)
{
    keel_hook *position = &hooks[n_hooks];     /* owns nothing */
    KEEL__STRUCT_INIT(position);
    position->name = "data_position";
    position->ctx = j;
    position->after_create_session = position_after_create;
    tc->session.manager.backend = backend;
    if (backend->updater.apply != NULL)
        memset(&tc->session.updater, 0, sizeof tc->session.updater);
    tc->session.n_hooks = n_hooks + 1;
    tc->session.is_chief = is_chief;
    if (!is_chief) {
        tc->session.manager.checkpoint_dir = NULL;
        tc->session.manager.warm_start_from = NULL; /* the chief's to apply */
    }
}

/* A K-FAC job in a cluster: its replicas and, with distributed roles,
 * this replica's role (gradient, covariance or inverse worker) in
 * r->j.kfac_role and r->j.kdist (which keel__job_free frees). */
keel_status
keel__job_kfac_roles(keel__train_run *r)
{
    const keel_config *cfg = r->cfg;
    keel__job *j = &r->j;
    int counts[3] = { 0, 0, 0 }, index = 0;
    keel_status st;

    st = kfac_replicas(cfg, r->replicas, j);
    if (st == KEEL_OK && keel__kfac_dist_roles(cfg))
        st = keel__kfac_dist_role(cfg, r->replica, r->replicas,
                                  &j->kfac_role, &index, counts);
    if (st == KEEL_OK && keel__kfac_dist_roles(cfg)) {
        st = keel__kfac_dist_new(cfg, j->kfac, j->vs, r->replica,
                                 r->replicas, &j->kdist);
        j->kfac_observes = j->kfac_role == 1;
        keel__log(KEEL_LOG_INFO, "K-FAC roles: this replica (%d of %d) "
                  "is %s worker %d (%d gradient, %d covariance, %d "
                  "inverse)", r->replica, r->replicas,
                  keel__kfac_role_name(j->kfac_role), index, counts[0],
                  counts[1], counts[2]);
    }
    return st;
}

/* multi_worker_mirrored: train.leaves are this rank's leaves, each
 * computed alone (the micro-batch path) and summed along the
 * collective's tree; the session runs over the collective's backend. */
keel_status
keel__job_mwm_backend(keel__train_run *r)
{
    keel__job *j = &r->j;
    int64_t leaves = keel_config_int(r->cfg, "train.leaves");
    int64_t first = leaves * r->replica / r->replicas;
    int64_t end = leaves * (r->replica + 1) / r->replicas;
    keel_status st;

    /* rank r's leaves: [L r / R, L (r + 1) / R), in rank order (the
     * collective places them in its tree by the ranks' counts) */
    j->micro = j->global_batch / leaves;
    if (leaves % r->replicas != 0) {
        j->slice_off = (size_t)(first * j->micro);
        j->slice_len = (size_t)((end - first) * j->micro);
    }
    if ((st = alloc_micro(j, (int)(end - first))) != KEEL_OK ||
        (st = keel_collective_set_leaves(r->coll, j->micro_g, j->n_micro)) !=
        KEEL_OK)
        return st;
    keel_collective_session_backend(r->coll, &r->backend);
    replica_session(j, &r->tc, &r->backend, r->hooks, r->n_hooks,
                    r->is_chief);
    return KEEL_OK;
}

/* A cluster's chief or worker: the cluster through the public seam
 * (keel/distributed.h) in r->worker (which train_free frees); the
 * backend pulls before the chief's checkpoints and stops the ps when the
 * chief's session ends cleanly. */
keel_status
keel__job_cluster_backend(keel__train_run *r)
{
    keel__job *j = &r->j;
    keel_cluster_config o;
    keel_status st;

    j->leaves = leaves_for(r->cfg, j, r->spec);
    /* each replica's gradient is the mean over its own slice (the ps
     * forms the example-weighted mean of the replicas'); the tree's node
     * sums (j->leaves) and micro-batches stay pieces of the global
     * batch's mean, which the ps add */
    if (j->leaves == 0 && j->micro == 0)
        j->local_norm = 1;
    cluster_options_from(r->cfg, j, r->spec, &o);
    st = keel_cluster_backend_new(r->spec, j->vs, &o, &r->worker);
    if (st != KEEL_OK)
        return st;
    j->worker = r->worker;
    j->elastic = o.elastic;             /* the nodes: before each step */
    if (j->leaves > 0 && !j->elastic &&
        (st = tree_nodes_build(j, r->replica, r->replicas)) != KEEL_OK)
        return st;
    if (j->micro > 0) {
        int k = (int)(j->global_batch / r->replicas / j->micro);
        if ((st = alloc_micro(j, k)) != KEEL_OK ||
            (st = keel_cluster_backend_set_micro(r->worker, j->micro_g,
                                                 j->n_micro)) != KEEL_OK)
            return st;
    }
    keel_cluster_backend_session_backend(r->worker, &r->backend);
    if (j->kdist != NULL) {
        keel__kfac_dist_set_backend(j->kdist, r->worker);
        if (j->kfac_role != 0) {     /* statistics or inverses, no push */
            keel_updater u = keel_kfac_dist_role_updater(j->kdist);
            r->backend.updater.ctx = u.ctx;
            r->backend.updater.apply = u.apply;
            r->backend.updater.kind = u.kind;   /* dense gradients */
        }
    }
    replica_session(j, &r->tc, &r->backend, r->hooks, r->n_hooks,
                    r->is_chief);
    return KEEL_OK;
}
