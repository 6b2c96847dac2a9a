/* worker.c - the worker backend (keel_cluster_backend): a chief's or
 * worker's clients of every ps and their heartbeats, the session backend
 * over them (keel_cluster_backend_session_backend: the step in
 * worker_push.c, HELLO, INIT and pulls in worker_pull.c), the end of a
 * replica's session, and the public calls of any training task. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/session.h>
#include "worker_int.h"

#define SHUTDOWN_TIMEOUT_MS 2000
/* A replica's LEAVE at the end of its session: a live ps answers at once;
 * one already gone (the chief stopped the job) costs at most this. */
#define LEAVE_TIMEOUT_MS 1000

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
        st = keel__cluster_peer_endpoint(
            keel_cluster_spec_address(w->spec, KEEL_TASK_PS, p),
            w->o.in.local_transport, eps[p], sizeof eps[p]);
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
    hc.dead_after_ms = w->o.in.dead_after_ms;
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
    w->outs = calloc(w->n_names + w->n_vars * KEEL__MAX_MICRO + 2,
                     sizeof *w->outs);  /* + metrics and membership */
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
    keel_status st = keel__cluster_peer_endpoint(
        keel_cluster_spec_address(o->spec, KEEL_TASK_PS, p),
        o->in.local_transport, ep, sizeof ep);
    if (st != KEEL_OK)
        return st;
    keel__log(KEEL_LOG_INFO, "%s %d: ps %d over %s",
              keel_task_type_name(keel_cluster_spec_task_type(o->spec)),
              keel_cluster_spec_task_index(o->spec), p, ep);
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
    keel_status st = keel__role_load_curve(&w->o, &curve);
    /* no reply frame above the largest tensor this task receives */
    if (st == KEEL_OK)
        keel__wire_set_max_frame(keel__role_largest_tensor(w->vs) +
                                 KEEL__WIRE_FRAME_SLACK);
    for (int p = 0; p < w->n_ps && st == KEEL_OK; p++)
        st = connect_one(w, p, &curve);
    keel__curve_clear(&curve);
    return st;
}

/* The backend over vs, or over part's split store (part owned by the
 * backend from here on) when part is not NULL. */
static keel_status
worker_new(keel__role_opts *o, keel_vars *vs, keel__partition *part,
           keel_cluster_backend **out)
{
    keel_cluster_backend *w = calloc(1, sizeof *w);
    keel_status st = KEEL_OK;
    *out = NULL;
    if (w == NULL) {
        keel__partition_free(part);
        return keel__fail(KEEL_ENOMEM, "worker: %zu bytes", sizeof *w);
    }
    keel__role_set_send_buffer(o);
    take_role(w, o, vs);
    if (part != NULL) {
        st = keel__worker_part_take(w, part, vs);
        w->vs = vs = part->wire;
    }
    if (st == KEEL_OK && !keel_algorithm_pushes_gradients(w->o.algo.c.name))
        st = new_rule_state(w);
    if (st == KEEL_OK)
        st = alloc_tables(w);
    if (st == KEEL_OK)
        st = keel__cluster_place(vs, w->n_ps, w->o.round_robin, w->ps_of);
    if (st == KEEL_OK)
        st = connect_all(w);
    /* key_dir and token are the caller's for the call only (the keys are
     * loaded and the sockets made): none kept past it */
    w->o.in.key_dir = NULL;
    w->o.in.token = NULL;
    if (st == KEEL_OK && w->n_ps > 0)
        st = start_heartbeats(w);
    if (st == KEEL_OK)
        keel__worker_sparse_attach(w);
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
                  "%.3f; bytes pushed %.0f, pulled %.0f",
                  keel_task_type_name(
                      keel_cluster_spec_task_type(w->spec)),
                  keel_cluster_spec_task_index(w->spec), w->timed_steps,
                  (double)w->compute_ns / n / 1e6,
                  (double)w->send_ns / n / 1e6, (double)w->wait_ns / n / 1e6,
                  (double)w->copy_ns / n / 1e6,
                  (double)w->push_bytes / n, (double)w->pull_bytes / n);
    }
    keel__worker_sparse_detach(w);
    keel__hb_stop(w->hb);
    free(w->sparse_t);
    keel__worker_part_free(w);
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

/* Tell every ps that this replica's session ended by itself at its
 * global step (keel__ps_real_leave, ps_members.c): the other replicas of
 * a sync job would otherwise wait for its next push until
 * step_timeout_secs. Best effort: a ps that does not answer within
 * LEAVE_TIMEOUT_MS is gone. */
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

/* Before a checkpoint: a sharded one needs only the shared global step
 * (each ps writes its own values); else every variable and slot. */
static keel_status
be_before_save(void *ctx, keel_vars *vs)
{
    keel_cluster_backend *w = ctx;
    int64_t step;
    keel_status st;
    if (!keel__worker_sharded(w))
        return (st = keel__worker_sparse_check_gather(w)) != KEEL_OK
            ? st : keel__worker_before_save(ctx, vs);
    st = keel__worker_read_step(ctx, &step);
    if (st == KEEL_OK)
        keel_vars_set_global_step(vs, step);
    return st;
}

void
keel_cluster_backend_session_backend(keel_cluster_backend *w, keel_backend *out)
{
    KEEL__STRUCT_INIT(out);
    out->name = "ps";
    out->ctx = w;
    out->updater.ctx = w;
    out->updater.apply = keel__worker_apply;
    out->updater.kind = KEEL_UPDATER_ROWS;  /* worker_sparse.c */
    out->publish = keel__worker_publish;
    out->is_intact = keel__worker_is_intact;
    out->fetch = keel__worker_fetch;
    out->wait_for_change = keel__worker_wait;
    out->before_save = be_before_save;
    out->save = keel__worker_save;
    out->end = be_end;
    out->read_global_step = keel__worker_read_step;
    keel__worker_part_backend(w, out);
}

keel_status
keel_cluster_backend_membership(const keel_cluster_backend *w,
                                int64_t *epoch, int *position, int *count)
{
    if (w == NULL || epoch == NULL || position == NULL || count == NULL)
        return keel__fail(KEEL_EINVAL, "cluster backend membership: a "
                          "NULL argument");
    *epoch = KEEL__MEMBERSHIP_EPOCH(w->membership);
    *position = KEEL__MEMBERSHIP_POS1(w->membership) - 1;
    *count = KEEL__MEMBERSHIP_COUNT(w->membership);
    return KEEL_OK;
}

keel_status
keel_cluster_backend_set_micro(keel_cluster_backend *w,
                               keel_grads *const *g, int n)
{
    if (w == NULL || n < 0 || n > KEEL__MAX_MICRO || (n > 0 && g == NULL))
        return keel__fail(KEEL_EINVAL, "cluster backend: %d micro-batch "
                          "gradient stores (want 0..%d)", n, KEEL__MAX_MICRO);
    if (w->part != NULL)
        return keel__worker_part_set_micro(w, g, n);
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
            st = keel__worker_pull_outs(w, p, k, w->vs, NULL, 0,
                                        p == 0 ? global_step : NULL);
        if (st != KEEL_OK)
            return st;
    }
    if (w->part != NULL)
        keel__worker_part_gather(w, names, n, 0);
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
        st = keel__worker_call_ps(w, p, &h, w->outs, k, 0, "mix", NULL, 0, &r);
        keel__wire_msg_clear(&r);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

keel_status
keel_cluster_backend_pull(keel_cluster_backend *w)
{
    keel_status st;
    if (w == NULL)
        return keel__fail(KEEL_EINVAL, "cluster backend: NULL");
    st = keel__worker_pull_all(w, w->vs, 1);
    if (st == KEEL_OK && w->part != NULL)
        keel__worker_part_gather(w, NULL, 0, 1);
    return st;
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

keel_status
keel_cluster_backend_new(const keel_cluster_spec *spec, keel_vars *vars,
                         const keel_cluster_config *opts,
                         keel_cluster_backend **out)
{
    keel__role_opts o;
    keel_status st;
    keel_task_type t;
    keel__partition *part = NULL;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "cluster backend: out is NULL");
    *out = NULL;
    st = keel__role_opts_from(spec, opts, "cluster backend", &o);
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
    if (st == KEEL_OK)          /* the same split on every task */
        st = keel__partition_new(
            vars, (int)keel_cluster_spec_num_tasks(spec, KEEL_TASK_PS),
            o.in.partition_bytes, o.in.max_partitions, 1, &part);
    if (st == KEEL_OK)      /* owns o.algo's rates and part now */
        st = worker_new(&o, vars, part, out);
    keel__algo_clear(&o.algo);
    return st;
}
