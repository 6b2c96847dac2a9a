/* ps_task.c - a parameter-server task (keel_ps_run): its shard of the
 * model, the optimizer's or the update rule's slots, its keys and bind
 * address, and the server (ps.c) run until the chief stops it. */
#include <config.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <keel/session.h>
#include "cluster_int.h"
#include "role_int.h"

#define DRAIN_MS 300

/* 1 for a loopback host ("tcp://127.x.y.z:port", localhost, [::1]; of a
 * list, the first). */
static int
is_loopback(const char *endpoint)
{
    const char *h = strncmp(endpoint, "tcp://", 6) == 0 ? endpoint + 6
                                                         : endpoint;
    return strncmp(h, "127.", 4) == 0 || strncmp(h, "localhost:", 10) == 0 ||
           strncmp(h, "[::1]:", 6) == 0;
}

static keel_status
ps_apply(void *ctx, keel_var *v, const keel_tensor *grad, int64_t step)
{
    if (ctx == NULL)                    /* the chief applies */
        return keel__fail(KEEL_EINTERNAL, "ps: no optimizer for '%s' at "
                          "step %lld (the chief applies)", keel_var_name(v),
                          (long long)step);
    return keel_optimizer_apply_var(ctx, v, grad, step);
}

static keel_status
ps_apply_rows(void *ctx, keel_var *v, size_t n, const int64_t *ids,
              const float *rows, int64_t step)
{
    if (ctx == NULL)                    /* the chief applies */
        return keel__fail(KEEL_EINTERNAL, "ps: no optimizer for the rows "
                          "of '%s' at step %lld (the chief applies)",
                          keel_var_name(v), (long long)step);
    return keel_optimizer_apply_rows(ctx, v, n, ids, rows, step);
}

/* A ps task while it runs (run_ps): its shard of the model, the rule's
 * state, the security set-up and the server. */
typedef struct ps_task {
    const keel__role_opts *o;
    int idx;                        /* this ps's task index */
    size_t n_model;                 /* variables of the whole model */
    keel_vars *shard;
    keel__ps_part *parts;           /* the shard's parts of partitioned
                                     * variables (names: the shard's and
                                     * the caller's store's) */
    size_t n_parts;
    int has_rule;                   /* the rule updates (not an optimizer) */
    keel__algo_ps rule;
    keel__curve curve;
    char bind[KEEL__BIND_ENDPOINTS_MAX];   /* keel__cluster_bind_endpoints */
    keel__ps_config pc;
    keel__ps *ps;
} ps_task;

/* The model's variables placed on this ps, into a new store: with the
 * slots of the chief's update rule when the chief applies (they are the
 * store's). model is part's wire store (part NULL: vars); the shard's
 * parts of vars's partitioned variables go into t->parts. */
static keel_status
build_shard(ps_task *t, const keel_vars *model, const keel__partition *part,
            const keel_vars *vars)
{
    int n_ps = (int)keel_cluster_spec_num_tasks(t->o->spec, KEEL_TASK_PS);
    size_t n = t->n_model;
    int *ps_of = calloc(n ? n : 1, sizeof *ps_of);
    keel_status st;
    if (ps_of == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: placement of %zu", n);
    st = keel__cluster_place(model, n_ps, t->o->round_robin, ps_of);
    if (st == KEEL_OK)
        st = keel_vars_new(&t->shard);
    if (st == KEEL_OK && part != NULL &&
        (t->parts = calloc(n, sizeof *t->parts)) == NULL)
        st = keel__fail(KEEL_ENOMEM, "ps: parts of %zu", n);
    for (size_t i = 0; i < n && st == KEEL_OK; i++) {
        keel_var *v = keel_vars_at(model, i);
        keel_tensor *vt = keel_var_tensor(v);
        keel_var *sv = NULL;
        if (ps_of[i] == t->idx)
            st = keel_vars_create(t->shard, keel_var_name(v), vt->ndim,
                                  vt->shape, keel_var_flags(v), &sv);
        if (sv != NULL && part != NULL && keel__partition_part_of(
                              part, vars, i, &t->parts[t->n_parts].whole,
                              &t->parts[t->n_parts].row_begin,
                              &t->parts[t->n_parts].row_end))
            t->parts[t->n_parts++].name = keel_var_name(sv);
        for (size_t k = 0; sv != NULL && t->o->in.chief_applies &&
                           st == KEEL_OK && k < keel_var_slot_count(v); k++) {
            const char *sname;
            keel_tensor *unused;
            (void)keel_var_slot_at(v, k, &sname);
            st = keel_var_add_slot(sv, sname, &unused);
        }
    }
    free(ps_of);
    return st;
}

/* The shard's slots for its update (the rule's or the optimizer's) and the
 * rule's per-replica state. */
static keel_status
prepare_shard(ps_task *t, keel_optimizer *opt)
{
    keel_status st = KEEL_OK;
    if (t->has_rule)
        st = keel__algo_prepare(&t->o->algo, t->shard);
    else if (opt != NULL)
        st = keel_optimizer_prepare(opt, t->shard);
    if (st == KEEL_OK && t->has_rule)
        st = keel__algo_ps_init(&t->rule, &t->o->algo);
    return st;
}

/* Bounded memory: no frame above the largest tensor served, no message
 * above what INIT (every variable and slot) or a sync push (each trainable
 * variable once per micro-batch, at most KEEL__MAX_MICRO) can carry. */
static void
shard_limits(const keel_vars *shard, keel__wire_limits *lim)
{
    uint64_t all = 0, trainable = 0;
    size_t n_tensors = 0, n_trainable = 0;
    for (size_t i = 0; i < keel_vars_count(shard); i++) {
        keel_var *v = keel_vars_at(shard, i);
        uint64_t b = keel_tensor_bytes(keel_var_tensor(v));
        all += b * (1 + keel_var_slot_count(v));
        n_tensors += 1 + keel_var_slot_count(v);
        if (keel_var_is_trainable(v)) {
            trainable += b;
            n_trainable++;
        }
    }
    lim->max_frame = keel__role_largest_tensor(shard) + KEEL__WIRE_FRAME_SLACK;
    lim->max_total_bytes = all > KEEL__MAX_MICRO * trainable
                               ? all : KEEL__MAX_MICRO * trainable;
    lim->max_tensors = n_tensors > KEEL__MAX_MICRO * n_trainable
                           ? n_tensors : KEEL__MAX_MICRO * n_trainable;
    if (lim->max_total_bytes == 0)
        lim->max_total_bytes = 1;
    if (lim->max_tensors == 0)
        lim->max_tensors = 1;
}

/* The keys or token the ps admits tasks with, and the address it binds;
 * a ps without authentication says what that exposes. */
static keel_status
ps_security(ps_task *t)
{
    const keel__role_opts *o = t->o;
    keel_status st = keel__role_load_curve(o, &t->curve);
    if (st == KEEL_OK && o->in.curve)
        st = keel__curve_allow_dir(&t->curve, o->in.key_dir);
    if (st == KEEL_OK)
        st = keel__cluster_bind_endpoints(o->spec, KEEL_TASK_PS, t->idx,
                                          o->in.bind_address,
                                          o->in.local_transport, t->bind,
                                          sizeof t->bind);
    if (st != KEEL_OK || keel__auth_on(&t->curve))
        return st;
    keel__log(KEEL_LOG_WARN, is_loopback(t->bind)
              ? "ps %d: %s has no authentication: any local process "
                "can act as any task of this job (keel launch sets "
                "KEEL_CLUSTER_TOKEN for its tasks; set it, or "
                "security.curve, when starting tasks yourself)"
              : "ps %d: %s HAS NO AUTHENTICATION: anyone who reaches "
                "this address can read the model and shut the job "
                "down; set KEEL_CLUSTER_TOKEN (the same on every "
                "task) or security.curve = true", t->idx, t->bind);
    return KEEL_OK;
}

/* The server over the shard, bound and serving. */
static keel_status
start_ps(ps_task *t, keel_optimizer *opt)
{
    const keel__role_opts *o = t->o;
    keel__ps_config *pc = &t->pc;
    keel_status st;
    memset(pc, 0, sizeof *pc);
    shard_limits(t->shard, &pc->limits);
    pc->bind = t->bind;
    pc->vars = t->shard;
    pc->curve = &t->curve;
    pc->task_index = t->idx;
    pc->apply = ps_apply;
    pc->apply_ctx = opt;
    pc->apply_rows = ps_apply_rows;
    pc->sync = keel_algorithm_is_sync(o->algo.c.name);
    pc->rule = t->has_rule ? &t->rule : NULL;
    pc->total_replicas = keel_cluster_spec_num_replicas(o->spec);
    pc->replicas_to_aggregate = o->in.replicas_to_aggregate > 0
        ? o->in.replicas_to_aggregate
        : keel_cluster_spec_replicas_to_aggregate(o->spec);
    pc->has_chief = keel_cluster_spec_num_tasks(o->spec, KEEL_TASK_CHIEF) > 0;
    pc->reduce_leaves = o->in.reduce_leaves;
    pc->dead_after_ms = o->in.dead_after_ms;
    pc->chief_applies = o->in.chief_applies;
    pc->checkpoint_dir = o->in.sharded_checkpoints ? o->in.checkpoint_dir
                                                   : NULL;
    pc->parts = t->parts;
    pc->n_parts = t->n_parts;
    pc->elastic = o->in.elastic;
    st = keel__ps_new(pc, &t->ps);
    if (st != KEEL_OK)
        return st;
    keel__log(KEEL_LOG_INFO, "ps %d: %zu of %zu variables (%s placement), "
              "%s mode, %d of %d replicas per step, algorithm %s%s", t->idx,
              keel_vars_count(t->shard), t->n_model,
              o->round_robin ? "round-robin" : "size-balanced",
              pc->sync ? "sync" : "async", pc->replicas_to_aggregate,
              pc->total_replicas, keel_algorithm_name(o->algo.c.name),
              pc->chief_applies ? ", the chief applies the updates"
              : pc->elastic ? ", elastic (replicas leave and join at step "
              "boundaries)" : "");
    return KEEL_OK;
}

/* Serve until the chief says stop (KEEL_OK), a signal (KEEL_OK), the chief
 * is silent past cluster.orphan_secs or serving fails. */
static keel_status
serve_until_done(ps_task *t)
{
    const keel__role_opts *o = t->o;
    for (;;) {
        keel_status st = keel__ps_serve_once(t->ps, 100);
        keel__ps_watch(t->ps, (int)(o->in.stall_warn_secs * 1000));
        if (o->in.orphan_secs > 0 && keel__ps_chief_silent_ms(t->ps) >
                                      (int64_t)(o->in.orphan_secs * 1000))
            return keel__fail(KEEL_EUNAVAILABLE, "ps %d: no word from the "
                              "chief (%s) for %.0f s (cluster.orphan_secs): "
                              "the job is gone; exiting", t->idx,
                              t->pc.has_chief ? "chief 0" : "worker 0",
                              o->in.orphan_secs);
        if (st == KEEL_ECANCELLED) {        /* the chief said stop */
            keel__ps_drain(t->ps, DRAIN_MS);
            return KEEL_OK;
        }
        if (st != KEEL_OK && st != KEEL_ETIMEOUT)
            return st;
        if (keel_session_signal_received()) {
            keel__log(KEEL_LOG_INFO, "ps %d: signal %d, stopping", t->idx,
                      keel_session_signal_received());
            return KEEL_OK;
        }
    }
}

static void
log_ps_done(const ps_task *t)
{
    uint64_t in, out;
    keel__wire_bytes(&in, &out);
    keel__log(KEEL_LOG_INFO, "ps %d: done at step %lld: gradients applied "
              "%ld, dropped %ld (stale); bytes received %llu, sent %llu",
              t->idx, (long long)keel_vars_global_step(t->shard),
              keel__ps_applied(t->ps), keel__ps_dropped(t->ps),
              (unsigned long long)in, (unsigned long long)out);
    keel__ps_log_timing(t->ps);
}

static keel_status
run_ps(const keel__role_opts *o, const keel__partition *part,
       const keel_vars *vars, keel_optimizer *opt)
{
    const keel_vars *model = part != NULL ? part->wire : vars;
    ps_task t;
    keel_status st;
    memset(&t, 0, sizeof t);
    t.o = o;
    t.idx = keel_cluster_spec_task_index(o->spec);
    t.n_model = keel_vars_count(model);
    t.has_rule = !keel_algorithm_pushes_gradients(o->algo.c.name);
    keel__role_set_send_buffer(o);
    st = build_shard(&t, model, part, vars);
    if (st == KEEL_OK)
        st = prepare_shard(&t, opt);
    if (st == KEEL_OK)
        st = ps_security(&t);
    if (st == KEEL_OK)
        st = start_ps(&t, opt);
    if (st == KEEL_OK) {
        st = serve_until_done(&t);
        log_ps_done(&t);
    }
    keel__ps_free(t.ps);
    keel__algo_ps_clear(&t.rule);
    keel__curve_clear(&t.curve);
    keel_vars_free(t.shard);
    free(t.parts);
    return st;
}

keel_status
keel_ps_run(const keel_cluster_spec *spec, const keel_vars *vars,
            const keel_cluster_config *opts)
{
    keel__role_opts o;
    keel_optimizer *opt = NULL;
    keel_status st = keel__role_opts_from(spec, opts, "ps", &o);
    if (st != KEEL_OK)
        return st;
    if (vars == NULL)
        st = keel__fail(KEEL_EINVAL, "ps: vars is NULL");
    else if (!keel_cluster_spec_is_ps(spec))
        st = keel__fail(KEEL_EINVAL, "ps: this task is %s %d, not a ps",
                        keel_task_type_name(
                            keel_cluster_spec_task_type(spec)),
                        keel_cluster_spec_task_index(spec));
    else if (!o.in.chief_applies && (opts == NULL || opts->optimizer == NULL))
        st = keel__fail(KEEL_EINVAL, "ps %d: keel_cluster_config."
                        "optimizer is NULL: the ps needs the update rule "
                        "(keel_optimizer_config_init)",
                        keel_cluster_spec_task_index(spec));
    else if (opts != NULL && opts->optimizer != NULL &&
             (st = keel_optimizer_new(opts->optimizer, &opt)) != KEEL_OK)
        st = keel__wrap(st, "ps %d: optimizer",
                        keel_cluster_spec_task_index(spec));
    if (st != KEEL_OK) {
        keel__algo_clear(&o.algo);
        return st;
    }
    {   /* the parts of a partitioned variable are this ps's variables */
        keel__partition *part = NULL;
        st = keel__partition_new(vars, (int)keel_cluster_spec_num_tasks(
                                     spec, KEEL_TASK_PS),
                                 o.in.partition_bytes, o.in.max_partitions,
                                 0, &part);
        if (st == KEEL_OK)      /* as the workers compute */
            st = KEEL__FLUSHED(run_ps(&o, part, vars, opt));
        keel__partition_free(part);
    }
    keel_optimizer_free(opt);
    keel__algo_clear(&o.algo);
    return st;
}
