/* roles.c - the cluster roles: deterministic placement of variables on
 * parameter servers, the ps task (its shard, the optimizer's slots, the
 * SyncReplicas aggregation in ps.c) and the worker's session backend
 * (push gradients, receive the token with fresh values, publish, fetch). */
#include <config.h>

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <stddef.h>
#include <keel/session.h>
#include "cluster_int.h"
#include <keel/distributed.h>
#include "defaults.h"

#define SHUTDOWN_TIMEOUT_MS 2000
#define DRAIN_MS 300
#define HELLO_CHUNK_MS 2000
#define HELLO_SIGNAL_MS 250
/* A replica's LEAVE at the end of its session: a live ps answers at once;
 * one already gone (the chief stopped the job) costs at most this. */
#define LEAVE_TIMEOUT_MS 1000
/* The micro-batch gradient stores one push may carry (each trainable
 * variable once per store): keel_cluster_backend_set_micro's bound, and
 * what a ps and a worker size their messages for. */
#define MAX_MICRO 64

/* The options every role function reads: the caller's options, checked,
 * and what they resolve to for this spec. */
typedef struct keel__role_opts {
    keel_cluster_options in;        /* optimizer and algorithm NULL: the
                                     * update rule is algo */
    const keel_cluster_spec *spec;
    int round_robin;                /* in.placement is round-robin */
    int send_buffer_bytes;          /* keel__wire_set_send_buffer's
                                     * in.send_buffer_kib; 0: the kernel's
                                     * autotuning */
    keel__algo algo;                /* the update rule (owns its rates:
                                     * keel__algo_clear) */
} keel__role_opts;

/* ---- placement ---------------------------------------------------------- */

static keel_status
cluster_place(const keel_vars *vs, int n_ps, int round_robin, int *ps_of)
{
    size_t n = keel_vars_count(vs), rr = 0;
    uint64_t *load;
    if (n_ps < 1)
        return keel__fail(KEEL_EINVAL, "placement: the cluster has no ps");
    load = calloc((size_t)n_ps, sizeof *load);
    if (load == NULL)
        return keel__fail(KEEL_ENOMEM, "placement: %d ps", n_ps);
    for (size_t i = 0; i < n; i++) {
        keel_var *v = keel_vars_at(vs, i);
        int best = 0;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL) {
            ps_of[i] = -1;
            continue;
        }
        if (round_robin) {
            best = (int)(rr++ % (size_t)n_ps);
        } else {                /* least loaded so far; ties: lowest */
            for (int p = 1; p < n_ps; p++)
                if (load[p] < load[best])
                    best = p;
        }
        load[best] += keel_var_tensor(v)->count;
        ps_of[i] = best;
    }
    free(load);
    return KEEL_OK;
}

/* ---- keys --------------------------------------------------------------- */

/* CURVE: KEY_DIR/<type><index>.key(_secret) is this task's pair; each
 * <task>.key file in KEY_DIR is allowed by servers as that task; clients
 * read ps<i>.key. Else the job token, if there is one. */
static keel_status
load_curve(const keel__role_opts *o, keel__curve *c)
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
static uint64_t
largest_tensor(const keel_vars *vs)
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

/* 1 for a loopback host ("tcp://127.x.y.z:port", localhost, [::1]). */
static int
is_loopback(const char *endpoint)
{
    const char *h = strncmp(endpoint, "tcp://", 6) == 0 ? endpoint + 6
                                                         : endpoint;
    return strncmp(h, "127.", 4) == 0 || strncmp(h, "localhost:", 10) == 0 ||
           strncmp(h, "[::1]:", 6) == 0;
}

/* ---- the ps task -------------------------------------------------------- */

static keel_status
ps_apply(void *ctx, keel_var *v, const keel_tensor *grad, int64_t step)
{
    if (ctx == NULL)                    /* the chief applies */
        return keel__fail(KEEL_EINTERNAL, "ps: no optimizer for '%s' at "
                          "step %lld (the chief applies)", keel_var_name(v),
                          (long long)step);
    return keel_optimizer_apply_var(ctx, v, grad, step);
}

/* cluster.send_buffer_kib for every socket this task creates. */
static void
set_send_buffer(const keel__role_opts *o)
{
    keel__wire_set_send_buffer(o->send_buffer_bytes);
}

/* A ps task while it runs (run_ps): its shard of the model, the rule's
 * state, the security set-up and the server. */
typedef struct ps_task {
    const keel__role_opts *o;
    int idx;                        /* this ps's task index */
    size_t n_model;                 /* variables of the whole model */
    keel_vars *shard;
    int has_rule;                   /* the rule updates (not an optimizer) */
    keel__algo_ps rule;
    keel__curve curve;
    char bind[KEEL_ADDR_MAX + 16];
    keel__ps_config pc;
    keel__ps *ps;
} ps_task;

/* The model's variables placed on this ps, into a new store: with the
 * slots of the chief's update rule when the chief applies (they are the
 * store's). */
static keel_status
build_shard(ps_task *t, const keel_vars *model)
{
    int n_ps = (int)keel_cluster_spec_num_tasks(t->o->spec, KEEL_TASK_PS);
    size_t n = t->n_model;
    int *ps_of = calloc(n ? n : 1, sizeof *ps_of);
    keel_status st;
    if (ps_of == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: placement of %zu", n);
    st = cluster_place(model, n_ps, t->o->round_robin, ps_of);
    if (st == KEEL_OK)
        st = keel_vars_new(&t->shard);
    for (size_t i = 0; i < n && st == KEEL_OK; i++) {
        keel_var *v = keel_vars_at(model, i);
        keel_tensor *vt = keel_var_tensor(v);
        keel_var *sv = NULL;
        if (ps_of[i] == t->idx)
            st = keel_vars_create(t->shard, keel_var_name(v), vt->ndim,
                                  vt->shape, keel_var_flags(v), &sv);
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
 * variable once per micro-batch, at most MAX_MICRO) can carry. */
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
    lim->max_frame = largest_tensor(shard) + KEEL__WIRE_FRAME_SLACK;
    lim->max_total_bytes = all > MAX_MICRO * trainable
                               ? all : MAX_MICRO * trainable;
    lim->max_tensors = n_tensors > MAX_MICRO * n_trainable
                           ? n_tensors : MAX_MICRO * n_trainable;
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
    keel_status st = load_curve(o, &t->curve);
    if (st == KEEL_OK && o->in.curve)
        st = keel__curve_allow_dir(&t->curve, o->in.key_dir);
    if (st == KEEL_OK)
        st = keel__cluster_bind_address(o->spec, KEEL_TASK_PS, t->idx,
                                        t->bind, sizeof t->bind);
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
    st = keel__ps_new(pc, &t->ps);
    if (st != KEEL_OK)
        return st;
    keel__log(KEEL_LOG_INFO, "ps %d: %zu of %zu variables (%s placement), "
              "%s mode, %d of %d replicas per step, algorithm %s%s", t->idx,
              keel_vars_count(t->shard), t->n_model,
              o->round_robin ? "round-robin" : "size-balanced",
              pc->sync ? "sync" : "async", pc->replicas_to_aggregate,
              pc->total_replicas, keel_algorithm_name(o->algo.c.name),
              pc->chief_applies ? ", the chief applies the updates" : "");
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
run_ps(const keel__role_opts *o, const keel_vars *model, keel_optimizer *opt)
{
    ps_task t;
    keel_status st;
    memset(&t, 0, sizeof t);
    t.o = o;
    t.idx = keel_cluster_spec_task_index(o->spec);
    t.n_model = keel_vars_count(model);
    t.has_rule = !keel_algorithm_pushes_gradients(o->algo.c.name);
    set_send_buffer(o);
    st = build_shard(&t, model);
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
    return st;
}

/* ---- the worker backend ------------------------------------------------- */

struct keel_cluster_backend {
    const keel_cluster_spec *spec;
    keel__role_opts o;
    keel_vars *vs;
    int n_ps;
    keel__wire_client **clients;
    uint64_t *req_ids;             /* per ps: the push in flight */
    uint64_t *ps_gen;              /* each ps's incarnation when joined */
    int *ps_of;                    /* per variable */
    size_t n_vars;
    keel__wire_out *outs;          /* scratch, n_vars + slots */
    char (*names)[KEEL_NAME_MAX];  /* scratch slot names */
    size_t n_names;
    int is_chief;
    uint64_t generation;           /* this process's incarnation */
    keel_grads *const *micro;      /* micro-batch gradients, or NULL */
    int n_micro;
    int64_t last_fetch_ns;
    keel__curve *curves;           /* per ps: client set-up (server key) */
    keel__hb *hb;                  /* liveness of every ps */
    int64_t gen_ns;                /* when ps_gen was last learned */
    int64_t last_step_seen;        /* the cluster's step before a loss */
    int is_sync;                   /* the ps aggregate sync steps */
    int heard_end;                 /* a ps said the job ended (SHUTDOWN, or
                                    * a replica's LEAVE): nothing to tell */
    int replica;                   /* chief 0, worker i i + has_chief */
    keel__algo_worker *aw;         /* the rule's worker half, or NULL
                                    * (sync, async, hogwild: gradients) */
    keel_grads *local;             /* the chief's local model across a
                                    * checkpoint's pull (with aw) */
    int restore_local;             /* local holds it until the next step */
    /* step timing (logged by keel_cluster_backend_free), monotonic ns summed over
     * steps: compute (the previous apply's end to this one's start: input,
     * forward, backward, hooks), send (queueing the pushes), wait (for the
     * replies: the other replicas, the ps's aggregation, the transfer
     * back), copy (the new values into the model) */
    long timed_steps;
    int64_t last_apply_end_ns, compute_ns, send_ns, wait_ns, copy_ns;
};

static int
ms_of(double secs)
{
    double ms = secs * 1000.0;
    return ms > INT_MAX / 2 ? INT_MAX / 2 : ms < 1 ? 1 : (int)ms;
}

static keel_status
start_heartbeats(keel_cluster_backend *w)
{
    char (*eps)[KEEL_ADDR_MAX + 16] = calloc((size_t)w->n_ps, sizeof *eps);
    const char **ptrs = calloc((size_t)w->n_ps, sizeof *ptrs);
    keel__hb_config hc;
    keel_status st = KEEL_OK;
    if (eps == NULL || ptrs == NULL) {
        free(eps);
        free(ptrs);
        return keel__fail(KEEL_ENOMEM, "heartbeat: %d ps", w->n_ps);
    }
    for (int p = 0; p < w->n_ps && st == KEEL_OK; p++) {
        st = keel__fmt(eps[p], sizeof eps[p], "ps address", "tcp://%s",
                       keel_cluster_spec_address(w->spec, KEEL_TASK_PS, p));
        ptrs[p] = eps[p];
    }
    memset(&hc, 0, sizeof hc);
    hc.endpoints = ptrs;
    hc.curves = keel__auth_on(&w->curves[0]) ? w->curves : NULL;
    hc.n = w->n_ps;
    hc.interval_ms = w->o.in.heartbeat_ms > 0 ? w->o.in.heartbeat_ms : 200;
    hc.type = keel_cluster_spec_task_type(w->spec);
    hc.index = keel_cluster_spec_task_index(w->spec);
    hc.generation = w->generation;
    if (st == KEEL_OK)
        st = keel__hb_start(&hc, &w->hb);
    free(eps);
    free(ptrs);
    return st;
}

/* This task's role from o (the rule's rates moved into w) over vs. */
static void
take_role(keel_cluster_backend *w, keel__role_opts *o, keel_vars *vs)
{
    w->spec = o->spec;
    w->o = *o;
    o->algo.worker_lrs = NULL;          /* moved into w */
    w->vs = vs;
    w->is_chief = keel_cluster_spec_is_chief(o->spec);
    w->is_sync = keel_algorithm_is_sync(w->o.algo.c.name);
    w->replica = keel_cluster_spec_replica_index(o->spec);
    w->generation = keel__wire_new_generation();
}

/* A rule's worker half, and the chief's copy of its own model across a
 * checkpoint's pull. */
static keel_status
new_rule_state(keel_cluster_backend *w)
{
    keel_status st = keel__algo_worker_new(&w->o.algo, w->replica, w->vs,
                                           &w->aw);
    if (st == KEEL_OK && w->is_chief)
        st = keel_grads_new(w->vs, &w->local);
    return st;
}

/* The per-ps and per-variable tables, once: a step allocates nothing. */
static keel_status
alloc_tables(keel_cluster_backend *w)
{
    size_t slots = 0, n_ps;
    w->n_ps = (int)keel_cluster_spec_num_tasks(w->spec, KEEL_TASK_PS);
    n_ps = (size_t)(w->n_ps ? w->n_ps : 1);
    w->n_vars = keel_vars_count(w->vs);
    for (size_t i = 0; i < w->n_vars; i++)
        slots += keel_var_slot_count(keel_vars_at(w->vs, i));
    w->n_names = w->n_vars + slots;
    w->clients = calloc(n_ps, sizeof *w->clients);
    w->ps_gen = calloc(n_ps, sizeof *w->ps_gen);
    w->req_ids = calloc(n_ps, sizeof *w->req_ids);
    w->ps_of = calloc(w->n_vars ? w->n_vars : 1, sizeof *w->ps_of);
    w->curves = calloc(n_ps, sizeof *w->curves);
    w->outs = calloc(w->n_names + w->n_vars * MAX_MICRO + 1,
                     sizeof *w->outs);
    w->names = calloc(w->n_names ? w->n_names : 1, sizeof *w->names);
    if (w->clients == NULL || w->ps_gen == NULL || w->req_ids == NULL ||
        w->ps_of == NULL || w->curves == NULL ||
        w->outs == NULL || w->names == NULL)
        return keel__fail(KEEL_ENOMEM, "worker: tables for %zu variables",
                          w->n_vars);
    return KEEL_OK;
}

/* A client of ps p (with CURVE, its public key from key_dir/ps<p>.key). */
static keel_status
connect_one(keel_cluster_backend *w, int p, keel__curve *curve)
{
    const keel__role_opts *o = &w->o;
    char ep[KEEL_ADDR_MAX + 16];
    keel_status st = keel__fmt(ep, sizeof ep, "ps address", "tcp://%s",
                               keel_cluster_spec_address(o->spec,
                                                         KEEL_TASK_PS, p));
    if (st != KEEL_OK)
        return st;
    if (o->in.curve) {
        char path[KEEL_PATH_MAX], fname[32];
        snprintf(fname, sizeof fname, "ps%d.key", p);
        if ((st = keel__path_join(path, sizeof path, o->in.key_dir,
                                  fname)) != KEEL_OK ||
            (st = keel__curve_read_public(path, curve->server_key)) !=
                KEEL_OK)
            return st;
    }
    w->curves[p] = *curve;
    st = keel__wire_client_new(ep, curve,
                               keel_cluster_spec_task_type(o->spec),
                               keel_cluster_spec_task_index(o->spec),
                               &w->clients[p]);
    if (st == KEEL_OK)
        keel__wire_client_set_generation(w->clients[p], w->generation);
    return st;
}

/* This task's keys, then a client of every ps. */
static keel_status
connect_all(keel_cluster_backend *w)
{
    keel__curve curve;
    keel_status st = load_curve(&w->o, &curve);
    /* no reply frame above the largest tensor this task receives */
    if (st == KEEL_OK)
        keel__wire_set_max_frame(largest_tensor(w->vs) +
                                 KEEL__WIRE_FRAME_SLACK);
    for (int p = 0; p < w->n_ps && st == KEEL_OK; p++)
        st = connect_one(w, p, &curve);
    keel__curve_clear(&curve);
    return st;
}

static keel_status
worker_new(keel__role_opts *o, keel_vars *vs, keel_cluster_backend **out)
{
    keel_cluster_backend *w = calloc(1, sizeof *w);
    keel_status st = KEEL_OK;
    *out = NULL;
    if (w == NULL)
        return keel__fail(KEEL_ENOMEM, "worker: %zu bytes", sizeof *w);
    set_send_buffer(o);
    take_role(w, o, vs);
    if (!keel_algorithm_pushes_gradients(w->o.algo.c.name))
        st = new_rule_state(w);
    if (st == KEEL_OK)
        st = alloc_tables(w);
    if (st == KEEL_OK)
        st = cluster_place(vs, w->n_ps, w->o.round_robin, w->ps_of);
    if (st == KEEL_OK)
        st = connect_all(w);
    /* key_dir and token are the caller's for the call only (the keys are
     * loaded and the sockets made): none kept past it */
    w->o.in.key_dir = NULL;
    w->o.in.token = NULL;
    if (st == KEEL_OK && w->n_ps > 0)
        st = start_heartbeats(w);
    if (st != KEEL_OK) {
        keel_cluster_backend_free(w);
        return st;
    }
    *out = w;
    return KEEL_OK;
}

void
keel_cluster_backend_free(keel_cluster_backend *w)
{
    if (w == NULL)
        return;
    if (w->timed_steps > 0) {
        double n = (double)w->timed_steps;
        keel__log(KEEL_LOG_INFO, "%s %d: per step (%ld steps, ms): compute "
                  "%.3f, push %.3f, wait for the ps %.3f, copy values "
                  "%.3f", keel_task_type_name(
                      keel_cluster_spec_task_type(w->spec)),
                  keel_cluster_spec_task_index(w->spec), w->timed_steps,
                  (double)w->compute_ns / n / 1e6,
                  (double)w->send_ns / n / 1e6, (double)w->wait_ns / n / 1e6,
                  (double)w->copy_ns / n / 1e6);
    }
    keel__hb_stop(w->hb);
    keel__algo_worker_free(w->aw);
    keel_grads_free(w->local);
    keel__algo_clear(&w->o.algo);
    for (int p = 0; w->clients != NULL && p < w->n_ps; p++)
        keel__wire_client_free(w->clients[p]);
    for (int p = 0; w->curves != NULL && p < w->n_ps; p++)
        keel__curve_clear(&w->curves[p]);
    free(w->curves);
    free(w->clients);
    free(w->ps_gen);
    free(w->req_ids);
    free(w->ps_of);
    free(w->outs);
    free(w->names);
    free(w);
}

/* KEEL_EABORTED for a reply r of ps p from another generation than the one
 * this task knows: the ps restarted. */
static keel_status
restarted(const keel_cluster_backend *w, int p, const keel__wire_msg *r)
{
    return keel__fail(KEEL_EABORTED, "ps %d restarted (generation %016llx, "
                      "was %016llx)", p, (unsigned long long)r->h.generation,
                      (unsigned long long)w->ps_gen[p]);
}

/* The end of ps p's reply r to a step's request: when st is KEEL_OK, ps 0's
 * global step (the step's authority) into *new_step; r cleared. Returns st. */
static keel_status
end_reply(keel__wire_msg *r, int p, keel_status st, int64_t *new_step)
{
    if (st == KEEL_OK && p == 0)
        *new_step = r->h.global_step;
    keel__wire_msg_clear(r);
    return st;
}

/* A failed call to ps p as a session status: timeouts and a restarted or
 * uninitialized ps are recoverable, a shut-down cluster ends the input. */
static keel_status
call_error(keel_cluster_backend *w, int p, keel_status st, const keel__wire_msg *r,
           const char *what)
{
    if (st == KEEL_ETIMEOUT)
        return keel__wrap(KEEL_EUNAVAILABLE, "ps %d did not answer %s", p,
                          what);
    if (st == KEEL_EPEER && r->h.type == KEEL_MSG_ERROR) {
        switch ((keel_status)r->h.arg) {
        case KEEL_EOUTOFRANGE:
            /* Another replica ended its session (the ps's text says who
             * and at which step): a sync job ends with it. The step is
             * given up and the session stops as for a stop request (it
             * logs why). */
            w->heard_end = 1;
            return keel__wrap(KEEL_ECANCELLED, "ps %d: %s", p, what);
        case KEEL_ECANCELLED:
            /* A worker's input ends when the chief stops the cluster; the
             * chief itself has not (it does so only after its last
             * step): someone else did, and the run is cut short. */
            w->heard_end = 1;
            if (w->is_chief)
                return keel__wrap(KEEL_EPEER, "ps %d (%s) was shut down "
                                  "by someone other than this chief before "
                                  "training finished; %s failed",
                                  p, keel_cluster_spec_address(
                                         w->spec, KEEL_TASK_PS, p), what);
            return keel__wrap(KEEL_EOUTOFRANGE, "ps %d: %s", p, what);
        case KEEL_EABORTED:
        case KEEL_EUNAVAILABLE:
            return keel__wrap(KEEL_EABORTED, "ps %d: %s", p, what);
        default:
            break;
        }
    }
    return keel__wrap(st, "ps %d: %s", p, what);
}

/* Copy the tensors of a reply into vs (variables or "var/slot"). */
static keel_status
take_values(keel_vars *vs, const keel__wire_msg *r)
{
    for (size_t i = 0; i < r->n; i++) {
        const keel__wire_tensor *wt = &r->tensors[i];
        keel_var *v = keel_vars_find(vs, wt->name);
        keel_tensor *t = NULL;
        if (v != NULL) {
            t = keel_var_tensor(v);
            keel_var_set_initialized(v, 1);
        } else {
            const char *slash = strrchr(wt->name, '/');
            char base[KEEL_NAME_MAX];
            size_t n = slash ? (size_t)(slash - wt->name) : 0;
            if (slash != NULL && n < sizeof base) {
                memcpy(base, wt->name, n);
                base[n] = '\0';
                if ((v = keel_vars_find(vs, base)) != NULL)
                    t = keel_var_slot(v, slash + 1);
            }
        }
        if (t == NULL || wt->t.data == NULL ||
            !keel_shape_equal(t->ndim, t->shape, wt->t.ndim, wt->t.shape))
            return keel__fail(KEEL_ECORRUPT, "ps sent '%s', which does not "
                              "match any local variable or slot", wt->name);
        memcpy(t->data, wt->t.data, t->count * sizeof(float));
    }
    return KEEL_OK;
}

/* Names (and tensors, for INIT) of ps p's variables and slots into
 * w->outs; count in *n. */
static void
shard_outs(keel_cluster_backend *w, keel_vars *vs, int p, int with_data,
           int with_slots, size_t *n)
{
    size_t k = 0, nn = 0;
    for (size_t i = 0; i < w->n_vars; i++) {
        keel_var *v = keel_vars_at(vs, i);
        if (w->ps_of[i] != p)
            continue;
        w->outs[k].name = keel_var_name(v);
        w->outs[k].t = with_data ? keel_var_tensor(v) : NULL;
        w->outs[k].pin = NULL;
        k++;
        for (size_t s = 0; with_slots && s < keel_var_slot_count(v); s++) {
            const char *sname;
            keel_tensor *st = keel_var_slot_at(v, s, &sname);
            snprintf(w->names[nn], KEEL_NAME_MAX, "%s/%s", keel_var_name(v),
                     sname);
            w->outs[k].name = w->names[nn++];
            w->outs[k].t = with_data ? st : NULL;
            w->outs[k].pin = NULL;
            k++;
        }
    }
    *n = k;
}

static keel_status wait_reply(keel_cluster_backend *w, int p, const char *what,
                              int on_signal, keel__wire_msg *r);

/* Fault in the pages of [p, p + bytes) for writing, keeping their
 * contents: a new process's tensors come from calloc and are first
 * written by the copy out of a reply, one page fault per 4 KiB (~30 ms
 * per 100 MiB here, more under load). Done while the request is in
 * flight, that cost overlaps the transfer instead of following it. */
static void
fault_in(void *p, size_t bytes)
{
    size_t page = 4096;
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)p + bytes) & ~(uintptr_t)(page - 1);
    if (hi <= lo)
        return;
#ifdef MADV_POPULATE_WRITE
    if (madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0)
        return;
#endif
    /* a read then a write of the same value: a fault, no change */
    for (uintptr_t a = lo; a < hi; a += page) {
        volatile char *c = (volatile char *)a;
        *c = *c;
    }
}

/* fault_in() the tensors ps p is about to send into vs (see shard_outs) */
static void
fault_in_shard(keel_cluster_backend *w, keel_vars *vs, int p, int with_slots)
{
    for (size_t i = 0; i < w->n_vars; i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_tensor *t = keel_var_tensor(v);
        if (w->ps_of[i] != p)
            continue;
        if (t != NULL && t->data != NULL)
            fault_in(t->data, t->count * sizeof(float));
        for (size_t k = 0; with_slots && k < keel_var_slot_count(v); k++) {
            t = keel_var_slot_at(v, k, NULL);
            if (t != NULL && t->data != NULL)
                fault_in(t->data, t->count * sizeof(float));
        }
    }
}

/* One request to ps p and its reply, waited for like a step's push: a ps
 * that dies or restarts meanwhile ends the wait at once (heartbeats), not
 * after a fixed timeout. Errors through call_error. With zero_copy the
 * tensors go out in place: they must not change until this returns (the
 * wait, or an abandon's reconnect, waits until libzmq lets go of them).
 * With dest (a pull), ps p's tensors in dest (and their slots, with
 * dest_slots) are faulted in while the reply is on its way. */
static keel_status
call_ps(keel_cluster_backend *w, int p, keel__wire_header *h,
        const keel__wire_out *outs, size_t n, int zero_copy,
        const char *what, keel_vars *dest, int dest_slots,
        keel__wire_msg *r)
{
    keel_status st = keel__wire_client_send(w->clients[p], h, outs, n,
                                            zero_copy, w->o.in.dead_after_ms);
    keel__wire_msg_init(r);
    if (st == KEEL_OK) {
        w->req_ids[p] = h->request_id;
        if (dest != NULL)
            fault_in_shard(w, dest, p, dest_slots);
        st = wait_reply(w, p, what, 0, r);
        if (st != KEEL_OK && r->h.type == 0)
            return st;            /* abandoned: the reason is set */
    }
    return st == KEEL_OK ? KEEL_OK : call_error(w, p, st, r, what);
}

/* Pull the n tensors named in w->outs from ps p into vs (ps 0 holding
 * none: a step query); with dest, ps p's tensors there (and their slots,
 * with dest_slots) are faulted in meanwhile. *global_step (if not NULL):
 * ps p's step. */
static keel_status
pull_outs(keel_cluster_backend *w, int p, size_t n, keel_vars *vs,
          keel_vars *dest, int dest_slots, int64_t *global_step)
{
    keel__wire_header h;
    keel__wire_msg r;
    keel_status st;
    memset(&h, 0, sizeof h);
    h.type = n == 0 ? KEEL_MSG_STEP : KEEL_MSG_PULL;
    h.flags = n == 0 ? 0 : KEEL_WIRE_F_NAMES_ONLY;
    st = call_ps(w, p, &h, w->outs, n, 0, "pull", dest, dest_slots, &r);
    if (st == KEEL_OK)
        st = take_values(vs, &r);
    if (st == KEEL_OK && global_step != NULL)
        *global_step = r.h.global_step;
    keel__wire_msg_clear(&r);
    return st;
}

/* Pull every ps's variables (with_slots: and slots) into vs; the global
 * step is ps 0's. *agreed (if not NULL): 0 when a ps answered at another
 * global step than ps 0. */
static keel_status
pull_all_steps(keel_cluster_backend *w, keel_vars *vs, int with_slots,
               int *agreed)
{
    int64_t step0 = 0;
    for (int p = 0; p < w->n_ps; p++) {
        int64_t step;
        size_t n;
        keel_status st;
        shard_outs(w, vs, p, 0, with_slots, &n);
        if (n == 0 && p != 0)
            continue;
        st = pull_outs(w, p, n, vs, vs, with_slots, &step);
        if (st != KEEL_OK)
            return st;
        if (p == 0) {
            keel_vars_set_global_step(vs, step);
            step0 = step;
        } else if (agreed != NULL && step != step0) {
            *agreed = 0;
        }
    }
    return KEEL_OK;
}

static keel_status
worker_pull_all(keel_cluster_backend *w, keel_vars *vs, int with_slots)
{
    return pull_all_steps(w, vs, with_slots, NULL);
}

#define PULL_AGREE_TRIES 5

/* The chief's pull before a checkpoint, again while the ps answer at
 * different global steps: a sync step can complete on them while they are
 * pulled one after the other (the chief's push of a step it gave up on a
 * signal is still held there; backup replicas complete steps without the
 * chief), and a checkpoint must hold one step's values. After
 * PULL_AGREE_TRIES the last pull is kept, with a warning. */
static keel_status
pull_for_save(keel_cluster_backend *w, keel_vars *vs)
{
    for (int i = 1;; i++) {
        int agreed = 1;
        keel_status st = pull_all_steps(w, vs, 1, &agreed);
        if (st != KEEL_OK || agreed || !w->is_sync)
            return st;
        if (i == PULL_AGREE_TRIES) {
            keel__log(KEEL_LOG_WARN, "chief: the ps answered the pulls for "
                      "the checkpoint at different global steps %d times "
                      "in a row; saving the last pull (step %lld)",
                      PULL_AGREE_TRIES,
                      (long long)keel_vars_global_step(vs));
            return KEEL_OK;
        }
    }
}

/* One HELLO to ps p and its reply (KEEL_ETIMEOUT after timeout_ms). A
 * plain HELLO (wait 0: is the ps up?) is sent again every HELLO_SIGNAL_MS,
 * so a SIGTERM during a long wait for a ps that is not up yet ends it
 * (KEEL_ECANCELLED) instead of being ignored until the deadline; a stale
 * reply to an earlier one is discarded. A held HELLO (wait 1) goes once:
 * the ps keeps every held one until it is ready, and its callers come back
 * every HELLO_CHUNK_MS, through the session manager that sees signals. */
static keel_status
hello_one(keel_cluster_backend *w, int p, int wait, int timeout_ms,
          keel__wire_msg *r)
{
    int64_t end = keel__now_mono_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        int64_t left = (end - keel__now_mono_ns()) / 1000000;
        int piece = left > 0 ? (int)left : 0;
        keel__wire_header h;
        keel_status st;
        if (!wait && piece > HELLO_SIGNAL_MS)
            piece = HELLO_SIGNAL_MS;
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_HELLO;
        h.arg = (uint32_t)wait;
        st = keel__wire_client_call(w->clients[p], &h, NULL, 0, 0, piece, r);
        if (st != KEEL_ETIMEOUT || wait || keel__now_mono_ns() >= end)
            return st;
        keel__wire_msg_clear(r);
        if (keel_session_signal_received())
            return keel__fail(KEEL_ECANCELLED, "signal %d received while "
                              "waiting for ps %d (%s)",
                              keel_session_signal_received(), p,
                              keel_cluster_spec_address(w->spec,
                                                        KEEL_TASK_PS, p));
    }
}

/* HELLO every ps (wait: held until ready, up to timeout_ms). *all_ready
 * and *same_chief (all ps initialized by the same chief incarnation). */
static keel_status
hello_all(keel_cluster_backend *w, int wait, int timeout_ms, int *all_ready,
          int *same_chief, uint64_t *gens, char *why, size_t why_size)
{
    uint64_t chief = 0;
    *all_ready = 1;
    *same_chief = 1;
    for (int p = 0; p < w->n_ps; p++) {
        keel__wire_msg r;
        keel_status st = hello_one(w, p, wait, timeout_ms, &r);
        if (st == KEEL_ECANCELLED && keel_session_signal_received()) {
            keel__wire_msg_clear(&r);
            return st;              /* preempted: no peer to blame */
        }
        if (st == KEEL_ETIMEOUT && wait) {
            keel__wire_msg_clear(&r);
            *all_ready = 0;
            if (why != NULL)
                snprintf(why, why_size, "ps %d (%s) not ready", p,
                         keel_cluster_spec_address(w->spec, KEEL_TASK_PS,
                                                   p));
            return KEEL_OK;
        }
        if (st != KEEL_OK) {
            st = call_error(w, p, st, &r, "hello");
            keel__wire_msg_clear(&r);
            return st;
        }
        if (gens != NULL)
            gens[p] = r.h.generation;
        if (!r.h.arg) {
            *all_ready = 0;
            if (why != NULL)
                snprintf(why, why_size, "ps %d not initialized", p);
        }
        if (p == 0)
            chief = (uint64_t)r.h.local_step;
        else if ((uint64_t)r.h.local_step != chief)
            *same_chief = 0;
        keel__wire_msg_clear(&r);
    }
    if (chief == 0)
        *same_chief = 0;
    if (gens == w->ps_gen)
        w->gen_ns = keel__now_mono_ns();
    return KEEL_OK;
}

static keel_status
be_publish(void *ctx, keel_vars *vs, int restored)
{
    keel_cluster_backend *w = ctx;
    int ready, same;
    keel_status st;
    int timeout = ms_of(w->o.in.max_wait_secs);
    size_t bytes = 0;
    int64_t t0;
    (void)restored;
    st = hello_all(w, 0, timeout, &ready, &same, w->ps_gen, NULL, 0);
    if (st != KEEL_OK)
        return st;
    if (ready && same) {
        /* A live cluster (this chief restarted): join it, no rollback. */
        st = worker_pull_all(w, vs, 1);
        if (st == KEEL_OK)
            keel__log(KEEL_LOG_INFO, "chief: joined live parameter servers "
                      "at step %lld (their state wins over any checkpoint)",
                      (long long)keel_vars_global_step(vs));
        if (st == KEEL_OK && w->aw != NULL)
            keel__algo_worker_restart(w->aw, vs);
        return st;
    }
    t0 = keel__now_mono_ns();
    for (int p = 0; p < w->n_ps; p++) {
        keel__wire_header h;
        keel__wire_msg r;
        size_t n;
        shard_outs(w, vs, p, 1, 1, &n);
        for (size_t k = 0; k < n; k++)
            bytes += keel_tensor_bytes(w->outs[k].t);
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_INIT;
        h.global_step = keel_vars_global_step(vs);
        /* in place: nothing touches the variables until INIT is answered */
        st = call_ps(w, p, &h, w->outs, n, 1, "init", NULL, 0, &r);
        keel__wire_msg_clear(&r);
        if (st != KEEL_OK)
            return st;
    }
    keel__log(KEEL_LOG_INFO, "chief: %d parameter server(s) initialized at "
              "step %lld; cluster ready (INIT of %.1f MiB in %.3f s)",
              w->n_ps, (long long)keel_vars_global_step(vs),
              (double)bytes / (1 << 20),
              (double)(keel__now_mono_ns() - t0) / 1e9);
    if (w->last_step_seen > 0)          /* this process trained before */
        keel__log(KEEL_LOG_WARN, "chief: the cluster had reached step %lld "
                  "before it lost its state; restarting from step %lld: "
                  "%lld step(s) lost", (long long)w->last_step_seen,
                  (long long)keel_vars_global_step(vs),
                  (long long)(w->last_step_seen -
                              keel_vars_global_step(vs)));
    w->last_step_seen = keel_vars_global_step(vs);
    if (w->aw != NULL)
        keel__algo_worker_restart(w->aw, vs);
    w->restore_local = 0;
    return KEEL_OK;
}

static keel_status
be_is_intact(void *ctx, keel_vars *vs, int *is_intact)
{
    keel_cluster_backend *w = ctx;
    int ready, same;
    uint64_t *gens = calloc((size_t)w->n_ps, sizeof *gens);
    keel_status st;
    *is_intact = 0;
    if (gens == NULL)
        return keel__fail(KEEL_ENOMEM, "is_intact: %d ps", w->n_ps);
    st = hello_all(w, 0, w->o.in.dead_after_ms, &ready, &same, gens, NULL, 0);
    if (st == KEEL_OK && ready && same) {
        /* joining these incarnations: a restart during the pull is one */
        memcpy(w->ps_gen, gens, (size_t)w->n_ps * sizeof *gens);
        w->gen_ns = keel__now_mono_ns();
        st = worker_pull_all(w, vs, 1);
        *is_intact = st == KEEL_OK;
        if (st == KEEL_OK && w->aw != NULL)
            keel__algo_worker_restart(w->aw, vs);
        w->restore_local = 0;
    }
    free(gens);
    return st;
}

static keel_status
be_fetch(void *ctx, keel_vars *vs, int *is_ready, char *why, size_t size)
{
    keel_cluster_backend *w = ctx;
    int same;
    keel_status st;
    int chunk = ms_of(w->o.in.max_wait_secs);
    int64_t t0;
    w->last_fetch_ns = keel__now_mono_ns();
    st = hello_all(w, 1, chunk < HELLO_CHUNK_MS ? chunk : HELLO_CHUNK_MS,
                   is_ready, &same, w->ps_gen, why, size);
    if (st != KEEL_OK || !*is_ready)
        return st;
    t0 = keel__now_mono_ns();
    st = worker_pull_all(w, vs, 0);
    if (st == KEEL_OK && w->aw != NULL)
        keel__algo_worker_restart(w->aw, vs);
    if (st == KEEL_OK) {
        double bytes = 0;
        for (size_t i = 0; i < w->n_vars; i++)
            bytes += (double)keel_var_tensor(keel_vars_at(vs, i))->count *
                     sizeof(float);
        keel__log(KEEL_LOG_INFO, "pulled %.1f MiB at step %lld from %d "
                  "ps in %.3f s", bytes / (1 << 20),
                  (long long)keel_vars_global_step(vs), w->n_ps,
                  (double)(keel__now_mono_ns() - t0) / 1e9);
    }
    return st;
}

/* The cluster's global step, ps 0's (the one be_apply adopts): one STEP
 * request, no values. A restarted ps 0 is a recoverable error. */
static keel_status
be_read_step(void *ctx, int64_t *step)
{
    keel_cluster_backend *w = ctx;
    keel__wire_header h;
    keel__wire_msg r;
    keel_status st;
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_STEP;
    st = call_ps(w, 0, &h, NULL, 0, 0, "the step query", NULL, 0, &r);
    if (st == KEEL_OK && r.h.generation != w->ps_gen[0])
        st = restarted(w, 0, &r);
    if (st == KEEL_OK)
        *step = r.h.global_step;
    keel__wire_msg_clear(&r);
    return st;
}

/* fetch itself blocks until readiness (an event from the ps); only a
 * fetch that returned quickly is followed by the retry floor. */
static keel_status
be_wait(void *ctx, int64_t deadline_ns)
{
    keel_cluster_backend *w = ctx;
    int64_t until = w->last_fetch_ns +
                    (int64_t)w->o.in.ready_retry_ms * 1000000;
    if (until > deadline_ns)
        until = deadline_ns;
    for (;;) {
        int64_t now = keel__now_mono_ns();
        struct timespec ts;
        if (now >= until || keel_session_signal_received())
            return KEEL_OK;     /* the session manager sees the signal */
        ts.tv_sec = (until - now) / 1000000000;
        ts.tv_nsec = (until - now) % 1000000000;
        nanosleep(&ts, NULL);
    }
}

#define WAIT_CHUNK_MS 20

/* Give up a push to ps p: drop its connection (and the queued frames, so
 * the gradient buffers are ours again) and say why. */
static keel_status
abandon(keel_cluster_backend *w, int p, keel_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static keel_status
abandon(keel_cluster_backend *w, int p, keel_status code, const char *fmt, ...)
{
    char why[KEEL_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (keel__wire_client_reconnect(w->clients[p], &w->curves[p]) !=
        KEEL_OK)
        return keel__wrap(KEEL_EIO, "%s; then", why);
    return keel__fail(code, "%s", why);
}

/* Wait for the reply to the request in flight to ps p (what: "step N"
 * for a push, "the pull at step N" for a pull): as long as it needs (a
 * sync step waits for the other replicas), but no longer than the ps stays
 * alive and the same incarnation (heartbeats), and no longer than
 * cluster.step_timeout_secs; a long wait is logged with what the step
 * lacks. on_signal (a step's push): a SIGTERM/SIGINT gives the step up
 * within WAIT_CHUNK_MS (KEEL_ECANCELLED; nothing of it was applied here),
 * so that a preempted task saves and exits while its step waits for a
 * replica that may never come. Pulls and commits are not given up: the
 * final checkpoint after a signal needs them. *r is initialized either
 * way (type 0 when abandoned). */
static keel_status
wait_reply(keel_cluster_backend *w, int p, const char *what, int on_signal,
           keel__wire_msg *r)
{
    int64_t start = keel__now_mono_ns(), last_warn = start;
    int64_t stall = (int64_t)(w->o.in.stall_warn_secs * 1e9);
    int64_t limit = (int64_t)(w->o.in.step_timeout_secs * 1e9);
    int64_t dead = (int64_t)w->o.in.dead_after_ms * 1000000;
    const char *addr = keel_cluster_spec_address(w->spec, KEEL_TASK_PS, p);
    for (;;) {
        keel__hb_peer peer;
        int64_t now, quiet;
        keel_status st = keel__wire_client_wait(w->clients[p],
                                                w->req_ids[p], 1,
                                                WAIT_CHUNK_MS, r);
        if (st != KEEL_ETIMEOUT)
            return st;
        keel__wire_msg_clear(r);
        keel__wire_msg_init(r);
        if (on_signal && keel_session_signal_received())
            return abandon(w, p, KEEL_ECANCELLED, "signal %d received "
                           "while %s waited for ps %d (%s): the step is "
                           "given up", keel_session_signal_received(),
                           what, p, addr);
        now = keel__now_mono_ns();
        keel__hb_peer_get(w->hb, p, &peer);
        quiet = now - (peer.since_ns > start ? peer.since_ns : start);
        if (peer.last_heard_ns > w->gen_ns &&
            peer.generation != w->ps_gen[p])
            return abandon(w, p, KEEL_EABORTED, "ps %d (%s) restarted "
                           "(generation %016llx, was %016llx) while %s "
                           "waited", p, addr,
                           (unsigned long long)peer.generation,
                           (unsigned long long)w->ps_gen[p], what);
        if (quiet > dead)
            return abandon(w, p, KEEL_EUNAVAILABLE, "ps %d (%s) silent for "
                           "%.1f s (cluster.dead_after_ms = %d): declared "
                           "dead during %s", p, addr, (double)quiet / 1e9,
                           w->o.in.dead_after_ms, what);
        if (limit > 0 && now - start > limit)
            return abandon(w, p, KEEL_ETIMEOUT, "%s did not complete "
                           "within %.0f s (cluster.step_timeout_secs); ps %d "
                           "says: %s", what, w->o.in.step_timeout_secs, p,
                           peer.status[0] ? peer.status : "(nothing)");
        if (stall > 0 && now - last_warn >= stall) {
            last_warn = now;
            keel__log(KEEL_LOG_WARN, "%s has waited %.1f s for ps %d "
                      "(alive, heard %.1f s ago): %s", what,
                      (double)(now - start) / 1e9, p,
                      (double)(now - peer.since_ns) / 1e9,
                      strstr(peer.status, "waiting=")
                          ? strstr(peer.status, "waiting=")
                          : "not a sync step in progress there");
        }
    }
}

/* The chief applies: ps's AGGREGATE (the step's mean gradients of its
 * variables) into grads. */
static keel_status
take_grads(keel_vars *vs, keel_grads *grads, const keel__wire_msg *r)
{
    for (size_t i = 0; i < r->n; i++) {
        const keel__wire_tensor *wt = &r->tensors[i];
        keel_var *v = keel_vars_find(vs, wt->name);
        keel_tensor *t = v != NULL ? keel_grads_at(grads, keel_var_index(v))
                                   : NULL;
        if (t == NULL || wt->t.data == NULL ||
            !keel_shape_equal(t->ndim, t->shape, wt->t.ndim, wt->t.shape))
            return keel__fail(KEEL_ECORRUPT, "ps sent the mean gradient of "
                              "'%s', which matches no trainable variable "
                              "here", wt->name);
        memcpy(t->data, wt->t.data, t->count * sizeof(float));
    }
    return KEEL_OK;
}

/* Keep the outs (from shard_outs) of trainable variables and their slots,
 * in order; returns how many. */
static size_t
keep_trainable(keel_vars *vs, keel__wire_out *outs, size_t n)
{
    size_t k = 0;
    int keep = 0;
    for (size_t i = 0; i < n; i++) {
        keel_var *v = keel_vars_find(vs, outs[i].name);
        if (v != NULL)                  /* a variable: its slots follow */
            keep = keel_var_is_trainable(v);
        if (keep)
            outs[k++] = outs[i];
    }
    return k;
}

/* The chief applies: its update of step global_step (mean holds the
 * step's mean gradients), then every ps's variables and slots to it
 * (COMMIT); *new_step from ps 0's answer. */
static keel_status
chief_commit(keel_cluster_backend *w, keel_vars *vs, keel_grads *mean,
             int64_t global_step, int64_t *new_step)
{
    keel_status st = w->o.in.chief_apply(w->o.in.chief_apply_ctx, vs, mean,
                                      global_step);
    if (st != KEEL_OK)
        return keel__wrap(st, "chief: update of step %lld",
                          (long long)global_step);
    for (int p = 0; p < w->n_ps; p++) {
        keel__wire_header h;
        keel__wire_msg r;
        size_t n;
        char what[64];
        shard_outs(w, vs, p, 1, 1, &n);     /* every ps awaits it */
        if (w->o.in.chief_commits_trainable_only)
            n = keep_trainable(vs, w->outs, n);
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_COMMIT;
        h.peer_generation = w->ps_gen[p];
        h.global_step = global_step;
        snprintf(what, sizeof what, "the commit of step %lld",
                 (long long)global_step);
        /* in place: nothing touches the variables until it is answered */
        st = call_ps(w, p, &h, w->outs, n, 1, what, NULL, 0, &r);
        if (st == KEEL_OK && r.h.generation != w->ps_gen[p])
            st = keel__fail(KEEL_EABORTED, "ps %d restarted during %s", p,
                            what);
        if ((st = end_reply(&r, p, st, new_step)) != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* Copy a reply's tensors into center (the trainable variables of vs by
 * name), skipping the others. */
static keel_status
take_center(keel_grads *center, keel_vars *vs, const keel__wire_msg *r)
{
    for (size_t i = 0; i < r->n; i++) {
        const keel__wire_tensor *wt = &r->tensors[i];
        keel_var *v = keel_vars_find(vs, wt->name);
        keel_tensor *t = v ? keel_grads_at(center, keel_var_index(v)) : NULL;
        if (v == NULL || wt->t.data == NULL)
            return keel__fail(KEEL_ECORRUPT, "ps sent '%s', which does not "
                              "match any local variable", wt->name);
        if (t == NULL)
            continue;
        if (!keel_shape_equal(t->ndim, t->shape, wt->t.ndim, wt->t.shape))
            return keel__fail(KEEL_ECORRUPT, "ps sent '%s' with another "
                              "shape", wt->name);
        memcpy(t->data, wt->t.data, t->count * sizeof(float));
    }
    return KEEL_OK;
}

/* One push round, as its callers describe it. */
typedef struct push_req {
    keel_vars *vs;
    keel_grads *const *srcs;    /* the tensors pushed, in order */
    int n_src;
    int64_t local_step;
    int covered;                /* the steps the push covers */
    int into;                   /* KEEL__ALGO_INTO_*: where values go */
    keel_grads *center;         /* with KEEL__ALGO_INTO_CENTER */
    keel_grads *mean;           /* the chief that applies, else NULL */
    int64_t *new_step;
    int64_t *t_copy;            /* time spent copying values in */
    int64_t *t_sent;            /* when every PUSH was queued */
} push_req;

/* Queue the PUSH of ps p's tensors of q->srcs (zero-copy). */
static keel_status
send_push(keel_cluster_backend *w, const push_req *q, int p)
{
    keel__wire_header h;
    size_t k = 0;
    keel_status st;
    for (int m = 0; m < q->n_src; m++) {
        keel_grads *src = q->srcs[m];
        for (size_t i = 0; i < w->n_vars; i++) {
            keel_tensor *g;
            if (w->ps_of[i] != p || (g = keel_grads_at(src, i)) == NULL)
                continue;
            w->outs[k].name = keel_var_name(keel_vars_at(q->vs, i));
            w->outs[k].t = g;
            w->outs[k].pin = NULL;
            k++;
        }
    }
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_PUSH;
    h.peer_generation = w->ps_gen[p];
    h.flags = q->into != KEEL__ALGO_INTO_NONE ? KEEL_WIRE_F_WANT_VALUES : 0;
    h.local_step = q->local_step;
    h.global_step = q->covered;         /* the steps this push covers */
    st = keel__wire_client_send(w->clients[p], &h, w->outs, k, 1,
                                w->o.in.dead_after_ms);
    if (st != KEEL_OK)
        return keel__wrap(st == KEEL_ETIMEOUT ? KEEL_EUNAVAILABLE : st,
                          "ps %d: push", p);
    w->req_ids[p] = h.request_id;
    return KEEL_OK;
}

/* The step failed elsewhere (first): give ps p's push up too, so that its
 * zero-copy frames are released before the next step. Returns the step's
 * status (KEEL_EIO when the connection could not be made again). */
static keel_status
give_up_push(keel_cluster_backend *w, int p, keel_status first,
             int64_t local_step)
{
    char keep[KEEL_ERR_MAX];
    snprintf(keep, sizeof keep, "%s", keel_last_error());
    if (abandon(w, p, KEEL_EABORTED, "step %lld abandoned",
                (long long)local_step) == KEEL_EIO)
        return KEEL_EIO;
    (void)keel__fail(first, "%s", keep);
    return first;
}

/* ps p's reply to the push: the new values (into q->into), or the step's
 * mean gradients for the chief (*aggregated counts them). */
static keel_status
take_push_reply(keel_cluster_backend *w, const push_req *q, int p,
                int *aggregated)
{
    keel__wire_msg r;
    char what[64];
    keel_status st;
    snprintf(what, sizeof what, "step %lld", (long long)q->local_step);
    st = wait_reply(w, p, what, 1, &r);
    if (st != KEEL_OK && r.h.type == 0) {
        /* abandoned or failed locally: nothing was read */
    } else if (st != KEEL_OK) {
        st = call_error(w, p, st, &r, "push");
    } else if (r.h.generation != w->ps_gen[p]) {
        st = restarted(w, p, &r);
    } else if (r.h.type == KEEL_MSG_AGGREGATE) {
        st = q->mean != NULL
            ? take_grads(q->vs, q->mean, &r)
            : keel__fail(KEEL_ECORRUPT, "ps %d sent the step's mean "
                         "gradient to a task that does not apply", p);
        (*aggregated)++;
    } else if (q->into != KEEL__ALGO_INTO_NONE) {
        int64_t t = keel__now_mono_ns();
        st = q->into == KEEL__ALGO_INTO_CENTER
            ? take_center(q->center, q->vs, &r) : take_values(q->vs, &r);
        *q->t_copy += keel__now_mono_ns() - t;
    }
    return end_reply(&r, p, st, q->new_step);
}

/* One PUSH to every ps of the tensors of q->srcs[0..n_src) (in order)
 * and the replies: the new values go into q->vs (into VARS) or q->center
 * (CENTER) or nowhere; *q->new_step is ps 0's step after it. Sent to every
 * ps first, then collected: the ps work in parallel. q->mean (the chief
 * when it applies the updates, else NULL): where the ps's AGGREGATE
 * answers put the step's mean gradients; once every ps sent its part the
 * chief applies them and commits (chief_commit). */
static keel_status
push_round(keel_cluster_backend *w, const push_req *q)
{
    keel_status first = KEEL_OK;
    int sent, aggregated = 0;
    for (sent = 0; sent < w->n_ps; sent++)
        if ((first = send_push(w, q, sent)) != KEEL_OK)
            break;
    *q->t_sent = keel__now_mono_ns();
    for (int p = 0; p < sent; p++) {
        keel_status st;
        if (first != KEEL_OK) {
            first = give_up_push(w, p, first, q->local_step);
            continue;
        }
        st = take_push_reply(w, q, p, &aggregated);
        if (st != KEEL_OK && first == KEEL_OK)
            first = st;
    }
    if (first == KEEL_OK && aggregated > 0)
        first = aggregated == sent
            ? chief_commit(w, q->vs, q->mean, q->local_step, q->new_step)
            : keel__fail(KEEL_EABORTED, "step %lld: %d of %d ps sent the "
                         "mean gradient for the chief's update",
                         (long long)q->local_step, aggregated, sent);
    return first;
}

/* The rule's I/O over the network (keel__algo_io). */
static keel_status
net_commit(void *ctx, keel_grads *c, int covered, int64_t local_step,
           int into, keel_vars *vs, keel_grads *center, int64_t *new_step)
{
    keel_cluster_backend *w = ctx;
    int64_t t_copy = 0, t_sent;
    push_req q = { .vs = vs, .srcs = &c, .n_src = 1,
                   .local_step = local_step, .covered = covered,
                   .into = into, .center = center, .mean = NULL,
                   .new_step = new_step, .t_copy = &t_copy,
                   .t_sent = &t_sent };
    return push_round(w, &q);
}

static keel_status
net_pull(void *ctx, int into, keel_vars *vs, keel_grads *center,
         int64_t *new_step)
{
    keel_cluster_backend *w = ctx;
    for (int p = 0; p < w->n_ps; p++) {
        keel__wire_header h;
        keel__wire_msg r;
        size_t n;
        keel_status st;
        shard_outs(w, vs, p, 0, 0, &n);
        if (n == 0)
            continue;
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_PULL;
        h.flags = KEEL_WIRE_F_NAMES_ONLY;
        st = call_ps(w, p, &h, w->outs, n, 0, "pull", NULL, 0, &r);
        if (st == KEEL_OK && r.h.generation != w->ps_gen[p])
            st = restarted(w, p, &r);
        if (st == KEEL_OK)
            st = into == KEEL__ALGO_INTO_CENTER ? take_center(center, vs, &r)
                                                : take_values(vs, &r);
        if ((st = end_reply(&r, p, st, new_step)) != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* A rule's step (w->aw): local update, then its commits and pulls. */
static keel_status
rule_apply(keel_cluster_backend *w, keel_vars *vs, keel_grads *grads,
           int64_t global_step)
{
    keel__algo_io io;
    int64_t new_step = -1;
    keel_status st;
    if (w->micro != NULL)
        return keel__fail(KEEL_EINVAL, "algorithm %s: micro-batches are "
                          "for gradient rules (sync, async, hogwild)",
                          keel_algorithm_name(w->o.algo.c.name));
    if (w->restore_local) {
        /* the chief's own model, replaced by the center for its last
         * checkpoint: this step's update continues from it */
        for (size_t i = 0; i < w->n_vars; i++) {
            keel_tensor *t = keel_grads_at(w->local, i);
            if (t != NULL)
                memcpy(keel_var_tensor(keel_vars_at(vs, i))->data, t->data,
                       t->count * sizeof(float));
        }
        w->restore_local = 0;
    }
    io.ctx = w;
    io.commit = net_commit;
    io.pull = net_pull;
    st = keel__algo_worker_step(w->aw, vs, grads, global_step, &io,
                                &new_step);
    if (st == KEEL_OK && new_step >= 0) {
        keel_vars_set_global_step(vs, new_step);
        w->last_step_seen = new_step;
    }
    return st;
}

static keel_status
be_apply(void *ctx, keel_vars *vs, keel_grads *grads, int64_t global_step)
{
    keel_cluster_backend *w = ctx;
    int64_t new_step = global_step;
    keel_status first;
    int64_t t_start = keel__now_mono_ns(), t_sent, t_copy = 0;
    keel_grads *one = grads;
    if (w->aw != NULL)
        return rule_apply(w, vs, grads, global_step);
    if (w->o.algo.worker_lrs != NULL) {
        /* sync with per-worker rates: this replica's share, scaled */
        float f = (float)keel__algo_worker_scale(&w->o.algo, w->replica,
                                                 global_step);
        int n_src = w->micro != NULL ? w->n_micro : 1;
        for (int m = 0; m < n_src; m++) {
            keel_grads *src = w->micro != NULL ? w->micro[m] : grads;
            for (size_t i = 0; i < w->n_vars; i++) {
                keel_tensor *g = keel_grads_at(src, i);
                for (size_t k = 0; g != NULL && k < g->count; k++)
                    g->data[k] *= f;
            }
        }
    }
    push_req q = {
        .vs = vs,
        .srcs = w->micro != NULL ? w->micro : &one,
        .n_src = w->micro != NULL ? w->n_micro : 1,
        .local_step = global_step, .covered = 1,
        .into = KEEL__ALGO_INTO_VARS, .center = NULL,
        .mean = w->is_chief && w->o.in.chief_applies ? grads : NULL,
        .new_step = &new_step, .t_copy = &t_copy, .t_sent = &t_sent,
    };
    first = push_round(w, &q);
    if (first != KEEL_OK) {
        w->last_apply_end_ns = 0;       /* recovery is not compute */
        return first;
    }
    if (w->last_apply_end_ns != 0) {    /* the first step starts cold */
        int64_t end = keel__now_mono_ns();
        w->timed_steps++;
        w->compute_ns += t_start - w->last_apply_end_ns;
        w->send_ns += t_sent - t_start;
        w->wait_ns += end - t_sent - t_copy;
        w->copy_ns += t_copy;
    }
    w->last_apply_end_ns = keel__now_mono_ns();
    keel_vars_set_global_step(vs, new_step);
    w->last_step_seen = new_step;
    return KEEL_OK;
}

/* The chief, before a checkpoint: the ps hold the truth. */
static keel_status
be_before_save(void *ctx, keel_vars *vs)
{
    keel_cluster_backend *w = ctx;
    keel_status st;
    if (w->local != NULL && !w->restore_local)
        for (size_t i = 0; i < w->n_vars; i++) {
            keel_tensor *t = keel_grads_at(w->local, i);
            if (t != NULL)
                memcpy(t->data, keel_var_tensor(keel_vars_at(vs, i))->data,
                       t->count * sizeof(float));
        }
    st = pull_for_save(w, vs);
    /* a rule's chief keeps training its own model after the save */
    if (st == KEEL_OK && w->local != NULL)
        w->restore_local = 1;
    return st;
}

/* Tell every ps that this replica's session ended by itself at its
 * global step (real_leave in ps.c): the other replicas of a sync job
 * would otherwise wait for its next push until step_timeout_secs. Best
 * effort: a ps that does not answer within LEAVE_TIMEOUT_MS is gone. */
static void
send_leave(keel_cluster_backend *w, keel_vars *vs, keel_end_reason why)
{
    for (int p = 0; p < w->n_ps; p++) {
        keel__wire_header h;
        keel__wire_msg r;
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_LEAVE;
        h.global_step = keel_vars_global_step(vs);
        h.arg = (uint32_t)why;
        if (keel__wire_client_call(w->clients[p], &h, NULL, 0, 0,
                                   LEAVE_TIMEOUT_MS, &r) != KEEL_OK)
            keel__log(KEEL_LOG_INFO, "ps %d not told that this replica "
                      "ended: %s", p, keel_last_error());
        keel__wire_msg_clear(&r);
    }
}

/* The chief stops the ps unless its session failed. A replica of a sync
 * job whose session ended by itself (a stop request, end of input, closed
 * by its program) and that is not the chief about to do that tells the ps,
 * which end the job (docs/cluster.md). */
static void
be_end(void *ctx, keel_vars *vs, int is_chief, keel_end_reason why)
{
    keel_cluster_backend *w = ctx;
    int stops_ps = w->is_chief && w->o.in.shutdown_at_end;
    (void)is_chief;
    if (stops_ps && why != KEEL_END_ERROR)
        keel_cluster_backend_shutdown(w);
    else if (w->is_sync && !w->heard_end && !stops_ps &&
             (why == KEEL_END_STOP_REQUESTED || why == KEEL_END_CLEAN ||
              why == KEEL_END_OUT_OF_RANGE))
        send_leave(w, vs, why);
}

void
keel_cluster_backend_get(keel_cluster_backend *w, keel_backend *out)
{
    KEEL__STRUCT_INIT(out);
    out->name = "ps";
    out->ctx = w;
    out->updater.ctx = w;
    out->updater.apply = be_apply;
    out->publish = be_publish;
    out->is_intact = be_is_intact;
    out->fetch = be_fetch;
    out->wait_for_change = be_wait;
    out->before_save = be_before_save;
    out->end = be_end;
    out->read_global_step = be_read_step;
}

keel_status
keel_cluster_backend_set_micro(keel_cluster_backend *w,
                               keel_grads *const *g, int n)
{
    if (w == NULL || n < 0 || n > MAX_MICRO || (n > 0 && g == NULL))
        return keel__fail(KEEL_EINVAL, "cluster backend: %d micro-batch "
                          "gradient stores (want 0..%d)", n, MAX_MICRO);
    w->micro = n > 0 ? g : NULL;
    w->n_micro = n;
    return KEEL_OK;
}

/* The named variables of the store placed on ps p into w->outs (with
 * t[i] as data, or names only when t is NULL); *k of them. With data,
 * each must be non-trainable and of t[i]'s shape. */
static keel_status
named_outs(keel_cluster_backend *w, int p, const char *const *names,
           const keel_tensor *const *t, size_t n, size_t *k)
{
    *k = 0;
    for (size_t i = 0; i < n; i++) {
        keel_var *v = keel_vars_find(w->vs, names[i]);
        keel_tensor *vt = v != NULL ? keel_var_tensor(v) : NULL;
        if (v == NULL || w->ps_of[keel_var_index(v)] < 0)
            return keel__fail(KEEL_ENOTFOUND, "cluster backend: no variable "
                              "'%s' on the ps", names[i]);
        if (t != NULL && (keel_var_is_trainable(v) ||
                          !keel_shape_equal(vt->ndim, vt->shape, t[i]->ndim,
                                            t[i]->shape)))
            return keel__fail(KEEL_EINVAL, "cluster backend mix: '%s' is "
                              "not a non-trainable variable of that shape",
                              names[i]);
        if (w->ps_of[keel_var_index(v)] != p)
            continue;
        w->outs[*k].name = keel_var_name(v);
        w->outs[*k].t = t != NULL ? t[i] : NULL;
        w->outs[*k].pin = NULL;
        (*k)++;
    }
    return KEEL_OK;
}

keel_status
keel_cluster_backend_pull_vars(keel_cluster_backend *w,
                               const char *const *names, size_t n,
                               int64_t *global_step)
{
    if (w == NULL || (n > 0 && names == NULL))
        return keel__fail(KEEL_EINVAL, "cluster backend pull: NULL");
    for (int p = 0; p < w->n_ps; p++) {
        size_t k = 0;
        keel_status st = named_outs(w, p, names, NULL, n, &k);
        if (st == KEEL_OK && (k > 0 || p == 0))
            st = pull_outs(w, p, k, w->vs, NULL, 0,
                           p == 0 ? global_step : NULL);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

keel_status
keel_cluster_backend_mix(keel_cluster_backend *w, const char *const *names,
                         const keel_tensor *const *t, size_t n, double decay)
{
    float d = (float)decay;
    uint32_t bits;
    if (w == NULL || (n > 0 && (names == NULL || t == NULL)))
        return keel__fail(KEEL_EINVAL, "cluster backend mix: NULL");
    if (!(d >= 0.0f && d < 1.0f))
        return keel__fail(KEEL_EINVAL, "cluster backend mix: decay %g not "
                          "in [0, 1)", decay);
    memcpy(&bits, &d, sizeof bits);
    for (int p = 0; p < w->n_ps; p++) {
        keel__wire_header h;
        keel__wire_msg r;
        size_t k = 0;
        keel_status st = named_outs(w, p, names, t, n, &k);
        if (st != KEEL_OK)
            return st;
        if (k == 0)
            continue;
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_MIX;
        h.peer_generation = w->ps_gen[p];
        h.arg = bits;
        st = call_ps(w, p, &h, w->outs, k, 0, "mix", NULL, 0, &r);
        keel__wire_msg_clear(&r);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

keel_status
keel_cluster_backend_pull(keel_cluster_backend *w)
{
    if (w == NULL)
        return keel__fail(KEEL_EINVAL, "cluster backend: NULL");
    return worker_pull_all(w, w->vs, 1);
}

void
keel_cluster_backend_shutdown(keel_cluster_backend *w)
{
    if (w == NULL)
        return;
    for (int p = 0; p < w->n_ps; p++) {
        keel__wire_header h;
        keel__wire_msg r;
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_SHUTDOWN;
        if (keel__wire_client_call(w->clients[p], &h, NULL, 0, 0,
                                   SHUTDOWN_TIMEOUT_MS, &r) != KEEL_OK)
            keel__log(KEEL_LOG_WARN, "chief: ps %d did not confirm the "
                      "shutdown: %s", p, keel_last_error());
        keel__wire_msg_clear(&r);
    }
    keel__log(KEEL_LOG_INFO, "chief: told %d parameter server(s) to stop",
              w->n_ps);
}

/* ---- the public options and entry points -------------------------------- */

void
keel_cluster_options_init(keel_cluster_options *o)
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
    o->token = getenv("KEEL_CLUSTER_TOKEN");
    o->shutdown_at_end = 1;
    o->slurm_num_ps = KEEL__CLUSTER_SLURM_NUM_PS;
    o->slurm_port_base = KEEL__CLUSTER_SLURM_PORT_BASE;
}

/* What role_opts_from refuses in in (the options) for spec. */
static keel_status
check_options(const keel_cluster_spec *spec, const keel_cluster_options *in,
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
    if (in->reduce_leaves < 0 ||
        (in->reduce_leaves > 0 && in->reduce_leaves % replicas != 0))
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
    return KEEL_OK;
}

/* The checked options in into *o (placement as a flag, the send buffer in
 * bytes); the update rule is resolved by role_opts_from. */
static void
copy_options(const keel_cluster_spec *spec, const keel_cluster_options *in,
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

/* Check opts (NULL: the defaults) and resolve them for spec into *o. */
static keel_status
role_opts_from(const keel_cluster_spec *spec, const keel_cluster_options *in,
               const char *who, keel__role_opts *o)
{
    keel_cluster_options d;
    keel_status st;
    if (spec == NULL)
        return keel__fail(KEEL_EINVAL, "%s: spec is NULL", who);
    if (in == NULL) {
        keel_cluster_options_init(&d);
        in = &d;
    } else if ((st = KEEL__STRUCT_CHECK(in, keel_cluster_options))
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

keel_status
keel_ps_run(const keel_cluster_spec *spec, const keel_vars *vars,
            const keel_cluster_options *opts)
{
    keel__role_opts o;
    keel_optimizer *opt = NULL;
    keel_status st = role_opts_from(spec, opts, "ps", &o);
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
        st = keel__fail(KEEL_EINVAL, "ps %d: keel_cluster_options."
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
    st = KEEL__FLUSHED(run_ps(&o, vars, opt));  /* as the workers compute */
    keel_optimizer_free(opt);
    keel__algo_clear(&o.algo);
    return st;
}

keel_status
keel_cluster_backend_new(const keel_cluster_spec *spec, keel_vars *vars,
                         const keel_cluster_options *opts,
                         keel_cluster_backend **out)
{
    keel__role_opts o;
    keel_status st;
    keel_task_type t;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "cluster backend: out is NULL");
    *out = NULL;
    st = role_opts_from(spec, opts, "cluster backend", &o);
    if (st != KEEL_OK)
        return st;
    t = keel_cluster_spec_task_type(spec);
    if (vars == NULL) {
        st = keel__fail(KEEL_EINVAL, "cluster backend: vars is NULL");
    } else if (t != KEEL_TASK_CHIEF && t != KEEL_TASK_WORKER) {
        st = keel__fail(KEEL_EINVAL, "cluster backend: this task is %s "
                        "%d; only the chief and workers train (a ps runs "
                        "keel_ps_run)", keel_task_type_name(t),
                        keel_cluster_spec_task_index(spec));
    } else if (o.in.chief_applies && o.in.chief_apply == NULL &&
               t == KEEL_TASK_CHIEF) {
        st = keel__fail(KEEL_EINVAL, "cluster backend: chief_applies "
                        "without chief_apply on the chief");
    } else if (!keel_algorithm_pushes_gradients(o.algo.c.name)) {
        st = keel__algo_prepare(&o.algo, vars);   /* the rule's slots */
    } else if (opts != NULL && opts->optimizer != NULL) {
        keel_optimizer *opt = NULL;
        st = keel_optimizer_new(opts->optimizer, &opt);
        if (st == KEEL_OK)
            st = keel_optimizer_prepare(opt, vars);   /* the slots */
        keel_optimizer_free(opt);
        if (st != KEEL_OK)
            st = keel__wrap(st, "cluster backend: optimizer");
    }
    if (st == KEEL_OK)
        st = worker_new(&o, vars, out);     /* owns o.algo's rates now */
    keel__algo_clear(&o.algo);
    return st;
}

int
keel_cluster_spec_is_ps(const keel_cluster_spec *spec)
{
    return spec != NULL && !keel_cluster_spec_is_local(spec) &&
           keel_cluster_spec_task_type(spec) == KEEL_TASK_PS;
}

keel_status
keel_cluster_spec_detect(const keel_cluster_options *opts,
                         keel_cluster_spec **out)
{
    keel_cluster_spec *spec = NULL;
    const char *tf = getenv("TF_CONFIG");
    keel_cluster_options d;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "cluster: out is NULL");
    *out = NULL;
    if (opts == NULL) {
        keel_cluster_options_init(&d);
        opts = &d;
    }
    if (tf != NULL && tf[0] != '\0') {
        st = keel_cluster_spec_from_env(&spec);
    } else if (getenv("SLURM_PROCID") != NULL) {
        keel_cluster_slurm_options so;
        keel_cluster_slurm_options_init(&so);
        so.num_ps = opts->slurm_num_ps;
        so.port_base = opts->slurm_port_base;
        st = keel_cluster_spec_from_slurm(&so, &spec);
    } else {
        st = keel_cluster_spec_new(&spec);
    }
    if (st == KEEL_OK && !keel_cluster_spec_is_local(spec) &&
        keel_cluster_spec_num_tasks(spec, KEEL_TASK_CHIEF) == 1 &&
        keel_cluster_spec_num_tasks(spec, KEEL_TASK_PS) == 0 &&
        keel_cluster_spec_num_tasks(spec, KEEL_TASK_WORKER) == 0 &&
        keel_cluster_spec_task_type(spec) == KEEL_TASK_CHIEF) {
        /* TF: a cluster of one chief is local (master '') */
        keel_cluster_spec_free(spec);
        spec = NULL;
        st = keel_cluster_spec_new(&spec);
    }
    if (st == KEEL_OK)
        st = keel_cluster_spec_validate(spec);
    if (st != KEEL_OK) {
        keel_cluster_spec_free(spec);
        return st;
    }
    *out = spec;
    return KEEL_OK;
}
