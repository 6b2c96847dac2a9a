/* options.c - keel_cluster_config: the defaults, the checks, and what
 * they resolve to for a spec (keel__role_opts: the update rule, the
 * placement, the socket sizes and the keys a task runs with). */
#include <config.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_int.h"
#include "role_int.h"
#include "defaults.h"

/* ---- what the options set up for a task: keys, socket sizes ------------ */

/* CURVE: KEY_DIR/<type><index>.key(_secret) is this task's pair; each
 * <task>.key file in KEY_DIR is allowed by servers as that task; clients
 * read ps<i>.key. Else the job token, if there is one. */
keel_status
keel__role_load_curve(const keel__role_opts *o, keel__curve *c)
{
    char name[KEEL__TASK_NAME_MAX];
    keel_task_type t = keel_cluster_spec_task_type(o->spec);
    int index = keel_cluster_spec_task_index(o->spec);
    memset(c, 0, sizeof *c);
    if (!o->in.curve)
        return o->in.token != NULL && o->in.token[0] != '\0'
                   ? keel__auth_token(c, o->in.token, t, index) : KEEL_OK;
    keel__task_name(t, index, name, sizeof name);
    return keel__curve_load(c, o->in.key_dir, name);
}

/* The largest tensor of vs (variables and their slots), in bytes. */
uint64_t
keel__role_largest_tensor(const keel_vars *vs)
{
    uint64_t most = 0;
    for (size_t i = 0; i < keel_vars_count(vs); i++) {
        keel_var *v = keel_vars_at(vs, i);
        uint64_t b = keel_tensor_bytes(keel_var_tensor(v));
        most = b > most ? b : most;
        for (size_t k = 0; k < keel_var_slot_count(v); k++) {
            b = keel_tensor_bytes(keel_var_slot_at(v, k, NULL));
            most = b > most ? b : most;
        }
    }
    return most;
}

/* cluster.send_buffer_kib for every socket this task creates. */
void
keel__role_set_send_buffer(const keel__role_opts *o)
{
    keel__wire_set_send_buffer(o->send_buffer_bytes);
}

/* ---- the options: defaults, checks, resolution ------------------------- */

void
keel_cluster_config_init(keel_cluster_config *o)
{
    KEEL__STRUCT_INIT(o);
    o->placement = KEEL_PLACEMENT_SIZE_BALANCED;
    o->heartbeat_ms = KEEL__CLUSTER_HEARTBEAT_MS;
    o->dead_after_ms = KEEL__CLUSTER_DEAD_AFTER_MS;
    o->stall_warn_secs = KEEL__CLUSTER_STALL_WARN_SECS;
    o->step_timeout_secs = KEEL__CLUSTER_STEP_TIMEOUT_SECS;
    o->orphan_secs = KEEL__CLUSTER_ORPHAN_SECS;
    o->ready_retry_ms = KEEL__CLUSTER_READY_RETRY_MS;
    o->max_wait_secs = KEEL__CLUSTER_MAX_WAIT_SECS;
    o->send_buffer_kib = KEEL__CLUSTER_SEND_BUFFER_KIB;
    o->local_transport = KEEL_LOCAL_TRANSPORT_AUTO;
    o->token = getenv("KEEL_CLUSTER_TOKEN");
    o->shutdown_at_end = 1;
    o->slurm_num_ps = KEEL__CLUSTER_SLURM_NUM_PS;
    o->slurm_port_base = KEEL__CLUSTER_SLURM_PORT_BASE;
}

/* What keel__role_opts_from refuses in in (the options) for spec. */
static keel_status
check_options(const keel_cluster_spec *spec, const keel_cluster_config *in,
              const char *who)
{
    int replicas = keel_cluster_spec_num_replicas(spec);
    if (keel_cluster_spec_num_tasks(spec, KEEL_TASK_PS) == 0)
        return keel__fail(KEEL_EINVAL, "%s: the cluster has no ps task "
                          "(parameter-server training needs at least one)",
                          who);
    if (in->placement != KEEL_PLACEMENT_SIZE_BALANCED &&
        in->placement != KEEL_PLACEMENT_ROUND_ROBIN)
        return keel__fail(KEEL_EINVAL, "%s: placement %d is not a "
                          "keel_placement", who, (int)in->placement);
    if (in->local_transport != KEEL_LOCAL_TRANSPORT_AUTO &&
        in->local_transport != KEEL_LOCAL_TRANSPORT_TCP)
        return keel__fail(KEEL_EINVAL, "%s: local_transport %d is not a "
                          "keel_local_transport", who,
                          (int)in->local_transport);
    if (in->heartbeat_ms < 1 || in->dead_after_ms <= in->heartbeat_ms)
        return keel__fail(KEEL_EINVAL, "%s: heartbeat_ms %d must be >= 1 "
                          "and less than dead_after_ms %d (a peer is "
                          "declared dead only after missed heartbeats)",
                          who, in->heartbeat_ms, in->dead_after_ms);
    if (in->ready_retry_ms < 1)
        return keel__fail(KEEL_EINVAL, "%s: ready_retry_ms %d < 1", who,
                          in->ready_retry_ms);
    if (!(in->stall_warn_secs >= 0) || !(in->step_timeout_secs >= 0) ||
        !(in->orphan_secs >= 0) || !(in->max_wait_secs >= 0))
        return keel__fail(KEEL_EINVAL, "%s: stall_warn_secs %g, "
                          "step_timeout_secs %g, orphan_secs %g and "
                          "max_wait_secs %g must be >= 0", who,
                          in->stall_warn_secs, in->step_timeout_secs,
                          in->orphan_secs, in->max_wait_secs);
    if (in->send_buffer_kib < 0 || in->send_buffer_kib > 65536)
        return keel__fail(KEEL_EINVAL, "%s: send_buffer_kib %d out of "
                          "0..65536", who, in->send_buffer_kib);
    if (in->reduce_leaves < 0 || (in->reduce_leaves > 0 && !in->elastic &&
                                  in->reduce_leaves % replicas != 0))
        return keel__fail(KEEL_EINVAL, "%s: reduce_leaves %lld is not a "
                          "multiple of the cluster's %d replicas", who,
                          (long long)in->reduce_leaves, replicas);
    if (in->curve && (in->key_dir == NULL || in->key_dir[0] == '\0'))
        return keel__fail(KEEL_EINVAL, "%s: curve needs key_dir (make keys "
                          "with 'keel keygen')", who);
    if (in->replicas_to_aggregate < 0 ||
        in->replicas_to_aggregate > replicas)
        return keel__fail(KEEL_EINVAL, "%s: replicas_to_aggregate %d out of "
                          "0..%d (the cluster's replicas)", who,
                          in->replicas_to_aggregate, replicas);
    if (in->partition_bytes < 0 || in->max_partitions < 0 ||
        in->max_partitions > KEEL_CLUSTER_MAX_PARTITIONS)
        return keel__fail(KEEL_EINVAL, "%s: partition_bytes %lld (want >= "
                          "0) or max_partitions %d (want 0..%d) out of "
                          "range", who, (long long)in->partition_bytes,
                          in->max_partitions, KEEL_CLUSTER_MAX_PARTITIONS);
    if (in->partition_bytes > 0 && in->chief_applies)
        return keel__fail(KEEL_EINVAL, "%s: partitioned variables "
                          "(cluster.partition_bytes) need the ps to apply "
                          "the updates (not chief_applies, K-FAC)", who);
    return KEEL_OK;
}

/* The checked options in into *o (placement as a flag, the send buffer in
 * bytes); the update rule is resolved by keel__role_opts_from. */
static void
copy_options(const keel_cluster_spec *spec, const keel_cluster_config *in,
             keel__role_opts *o)
{
    memset(o, 0, sizeof *o);
    o->in = *in;
    o->in.optimizer = NULL;         /* the caller's: not kept */
    o->in.algorithm = NULL;
    o->spec = spec;
    o->round_robin = in->placement == KEEL_PLACEMENT_ROUND_ROBIN;
    o->send_buffer_bytes = in->send_buffer_kib * 1024;
}

/* Elastic sync's conditions: the plain sync rule over the reduction
 * tree, every live replica aggregated (ps 0 decides the membership, the
 * other ps follow the word each push carries). */
static keel_status
check_elastic(const keel_cluster_spec *spec, const keel_cluster_config *in,
              const keel__algo *algo, const char *who)
{
    int replicas = keel_cluster_spec_num_replicas(spec);
    const char *why = NULL;
    if (algo->c.name != KEEL_ALGORITHM_SYNC || algo->worker_lrs != NULL)
        why = "the plain sync rule (sync mode, algorithm sync or unset, no "
              "per-worker learning rates)";
    else if (in->reduce_leaves <= 0)
        why = "the reduction tree (reduce_leaves > 0: train.batch_size a "
              "multiple of the model's piece, cluster.reduce_tree on, no "
              "train.micro_batch)";
    else if (in->chief_applies)
        why = "the ps to apply the updates (not chief_applies)";
    else if (keel_cluster_spec_replicas_to_aggregate(spec) != replicas ||
             (in->replicas_to_aggregate != 0 &&
              in->replicas_to_aggregate != replicas))
        why = "every replica aggregated (no backup workers)";
    if (why == NULL)
        return KEEL_OK;
    return keel__fail(KEEL_EINVAL, "%s: elastic sync (cluster.elastic) "
                      "needs %s", who, why);
}

/* Check opts (NULL: the defaults) and resolve them for spec into *o. */
keel_status
keel__role_opts_from(const keel_cluster_spec *spec,
                     const keel_cluster_config *in, const char *who,
                     keel__role_opts *o)
{
    keel_cluster_config d;
    keel_status st;
    if (spec == NULL)
        return keel__fail(KEEL_EINVAL, "%s: spec is NULL", who);
    if (in == NULL) {
        keel_cluster_config_init(&d);
        in = &d;
    } else if ((st = KEEL__STRUCT_CHECK(in, keel_cluster_config))
               != KEEL_OK) {
        return keel__wrap(st, "%s", who);
    }
    if ((st = keel_cluster_spec_validate(spec)) != KEEL_OK)
        return keel__wrap(st, "%s", who);
    if ((st = check_options(spec, in, who)) != KEEL_OK)
        return st;
    copy_options(spec, in, o);
    st = keel__algo_resolve(in->algorithm, keel_cluster_spec_mode(spec),
                            in->optimizer,
                            keel_cluster_spec_num_replicas(spec), &o->algo);
    if (st != KEEL_OK)
        return keel__wrap(st, "%s", who);
    if (o->in.elastic && (st = check_elastic(spec, in, &o->algo, who))
        != KEEL_OK) {
        keel__algo_clear(&o->algo);
        return st;
    }
    if (o->in.partition_bytes > 0 &&
        !keel_algorithm_pushes_gradients(o->algo.c.name)) {
        st = keel__fail(KEEL_EINVAL, "%s: partitioned variables "
                        "(cluster.partition_bytes) need an update rule "
                        "that pushes gradients (sync, async), not "
                        "algorithm %s", who,
                        keel_algorithm_name(o->algo.c.name));
        keel__algo_clear(&o->algo);
        return st;
    }
    if (o->in.chief_applies && (o->algo.c.name != KEEL_ALGORITHM_SYNC ||
                             o->algo.worker_lrs != NULL)) {
        /* the other rules update on the ps or locally: nothing would
         * reach the chief's update */
        st = keel__fail(KEEL_EINVAL, "%s: chief_applies needs the plain "
                        "sync rule (SyncReplicas: sync mode, algorithm sync "
                        "or unset, no per-worker learning rates), not "
                        "algorithm %s%s", who,
                        keel_algorithm_name(o->algo.c.name),
                        o->algo.worker_lrs != NULL
                            ? " with per-worker learning rates" : "");
        keel__algo_clear(&o->algo);
        return st;
    }
    return KEEL_OK;
}
