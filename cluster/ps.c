/* ps.c - the parameter server: a ROUTER socket bound to one address
 * serving PULL / PUSH / INIT / STEP / HELLO / HEARTBEAT / SHUTDOWN on a
 * keel_vars store. PUSH applies gradients with the job's optimizer (async,
 * or SyncReplicas aggregation with held pushes as tokens); slots travel on
 * the wire. A server without an optimizer hands PULL / PUSH / INIT / HELLO
 * to the config's serve function (tests and benchmarks: tests/ps_skel.c).
 * A malformed or wrong request gets an ERROR reply naming the problem and
 * the server goes on serving everyone else. This file: the server's
 * set-up and end, its serve loop and the dispatch of each request to the
 * files of ps_int.h. */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_int.h"
#include "defaults.h"

#define PS_RCVHWM 64

/* One pin per variable of the store (replies in flight). */
static keel_status
alloc_pins(keel__ps *ps)
{
    keel__wire_pin_init(&ps->pin, 1);
    size_t n = keel_vars_count(ps->vars);
    ps->pins = calloc(n ? n : 1, sizeof *ps->pins);
    if (ps->pins == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %zu pins", n);
    ps->n_pins = n;
    for (size_t i = 0; i < ps->n_pins; i++)
        keel__wire_pin_init(&ps->pins[i], 1);
    return KEEL_OK;
}

/* cfg's settings into ps, with their defaults, checked together. */
static keel_status
take_config(keel__ps *ps, const keel__ps_config *cfg)
{
    ps->limits = cfg->limits;
    keel__wire_limits_default(&ps->limits);
    ps->task_index = cfg->task_index;
    ps->generation = keel__wire_new_generation();
    ps->apply = cfg->apply;
    ps->apply_ctx = cfg->apply_ctx;
    ps->apply_rows = cfg->apply_rows;
    ps->serve = cfg->serve;
    ps->serve_ctx = cfg->serve_ctx;
    ps->sync = cfg->sync;
    ps->rule = cfg->rule;
    ps->total_replicas = cfg->total_replicas > 0 ? cfg->total_replicas : 1;
    ps->replicas_to_aggregate = cfg->replicas_to_aggregate > 0
        ? cfg->replicas_to_aggregate : ps->total_replicas;
    ps->has_chief = cfg->has_chief;
    ps->chief_applies = cfg->chief_applies;
    ps->dead_after_ms = cfg->dead_after_ms;
    ps->checkpoint_dir = cfg->checkpoint_dir;
    ps->parts = cfg->parts;
    ps->n_parts = cfg->n_parts;
    ps->elastic = cfg->elastic;
    if (ps->elastic && (!ps->sync || cfg->reduce_leaves <= 0 ||
                        ps->total_replicas > KEEL__CLUSTER_MAX_REPLICAS ||
                        ps->chief_applies || ps->rule != NULL ||
                        ps->replicas_to_aggregate != ps->total_replicas))
        return keel__fail(KEEL_EINVAL, "ps %d: elastic sync needs sync "
                          "mode, reduce_leaves, every replica aggregated "
                          "and the ps applying the updates",
                          cfg->task_index);
    if (ps->chief_applies && !ps->sync)
        return keel__fail(KEEL_EINVAL, "ps %d: the chief applies updates "
                          "only in sync mode (SyncReplicas)", cfg->task_index);
    if (ps->replicas_to_aggregate > ps->total_replicas)
        return keel__fail(KEEL_EINVAL, "ps %d: replicas_to_aggregate %d is "
                          "more than the %d replicas (no sync step could "
                          "complete)", cfg->task_index,
                          ps->replicas_to_aggregate, ps->total_replicas);
    return KEEL_OK;
}

/* The ROUTER socket, its authentication (ZAP) and limits, bound to
 * cfg->bind; the address it got into ps->endpoint. */
static keel_status
open_socket(keel__ps *ps, const keel__ps_config *cfg)
{
    size_t len = sizeof ps->endpoint;
    /* Held messages: at most PS_RCVHWM whole messages per connection wait
     * in libzmq (past that it stops reading the connection: the sender
     * waits, nothing is lost), each within limits. */
    int hwm = PS_RCVHWM;
    char who[32];
    keel_status st;
    ps->zctx = zmq_ctx_new();
    if (ps->zctx == NULL)
        return keel__fail(KEEL_EIO, "ps: zmq_ctx_new: %s",
                          zmq_strerror(errno));
    if (keel__auth_on(cfg->curve) &&
        (st = keel__zap_start(ps->zctx, cfg->curve, &ps->zap)) != KEEL_OK)
        return st;
    ps->sock = zmq_socket(ps->zctx, ZMQ_ROUTER);
    if (ps->sock == NULL)
        return keel__fail(KEEL_EIO, "ps: socket: %s", zmq_strerror(errno));
    if ((st = keel__wire_sockopts(ps->sock, &ps->limits)) != KEEL_OK ||
        (st = keel__curve_setup_server(ps->sock, cfg->curve)) != KEEL_OK)
        return st;
    if (zmq_setsockopt(ps->sock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0)
        return keel__fail(KEEL_EIO, "ps: receive limit: %s",
                          zmq_strerror(errno));
    snprintf(who, sizeof who, "ps %d", cfg->task_index);
    if ((st = keel__cluster_zmq_bind(ps->sock, cfg->bind, who)) != KEEL_OK)
        return st;
    if (zmq_getsockopt(ps->sock, ZMQ_LAST_ENDPOINT, ps->endpoint, &len) != 0)
        return keel__fail(KEEL_EIO, "ps: last endpoint: %s",
                          zmq_strerror(errno));
    return KEEL_OK;
}

keel_status
keel__ps_new(const keel__ps_config *cfg, keel__ps **out)
{
    keel__ps *ps;
    keel_status st;
    *out = NULL;
    if (cfg == NULL || cfg->bind == NULL || cfg->vars == NULL)
        return keel__fail(KEEL_EINVAL, "ps: bind address and vars needed");
    if (cfg->apply == NULL && cfg->serve == NULL)
        return keel__fail(KEEL_EINVAL, "ps: an optimizer (apply) or a serve "
                          "function needed");
    ps = calloc(1, sizeof *ps);
    if (ps == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %zu bytes", sizeof *ps);
    ps->vars = cfg->vars;
    st = alloc_pins(ps);
    if (st == KEEL_OK)
        st = take_config(ps, cfg);
    if (st == KEEL_OK)
        st = keel__ps_alloc_members(ps);
    if (st == KEEL_OK && cfg->reduce_leaves > 0)
        st = keel__ps_tree_plan(ps, cfg->reduce_leaves);
    if (st == KEEL_OK && ps->apply != NULL)
        st = keel__ps_alloc_aggregation(ps);
    if (st == KEEL_OK)
        st = open_socket(ps, cfg);
    if (st != KEEL_OK) {
        keel__ps_free(ps);
        return st;
    }
    /* every address it listens on (tcp and, for tasks of its host, its
     * Unix socket), as configured; the bound one when a port was left to
     * the system */
    keel__log(KEEL_LOG_INFO, "ps %d: serving %zu variables on %s%s",
              ps->task_index, keel_vars_count(ps->vars),
              strchr(cfg->bind, ' ') != NULL && strchr(cfg->bind, '*') == NULL
                  ? cfg->bind : ps->endpoint,
              ps->zap == NULL ? " (no authentication)"
              : cfg->curve->enabled ? " (CURVE)" : " (token)");
    *out = ps;
    return KEEL_OK;
}

void
keel__ps_free(keel__ps *ps)
{
    if (ps == NULL)
        return;
    /* Its Unix socket's file (bound last, after the tcp endpoints), which
     * libzmq leaves behind: removed while this ps still holds its tcp
     * port, so no successor of its address can have replaced it yet. */
    if (strncmp(ps->endpoint, "ipc://", 6) == 0)
        unlink(ps->endpoint + 6);
    /* The ROUTER first (linger 0: its connections go, pinned frames are
     * released), while the ZAP handler still answers the handshakes under
     * way; the context's end then stops the handler, which closes its
     * socket so that zmq_ctx_term returns; then its thread is joined. */
    if (ps->sock != NULL)
        zmq_close(ps->sock);
    if (ps->zctx != NULL)
        zmq_ctx_term(ps->zctx);
    keel__zap_stop(ps->zap);
    keel__ps_log_held(ps);
    for (int i = 0; ps->pending != NULL && i < ps->n_slots; i++) {
        keel__wire_msg_clear(&ps->pending[i].msg);
        free(ps->pending[i].vars);
        free(ps->pending[i].rows);
    }
    free(ps->pending);
    free(ps->tnodes);
    free(ps->tfirst);
    free(ps->tcount);
    free(ps->tparts);
    free(ps->tcnt);
    free(ps->all);
    free(ps->have);
    keel_grads_free(ps->acc);
    free(ps->dacc);
    free(ps->srows);
    free(ps->srow_data);
    free(ps->doff);
    free(ps->wsrc);
    free(ps->wts);
    free(ps->wcnt);
    for (int i = 0; i < ps->n_waiters; i++)
        zmq_msg_close(&ps->waiters[i].identity);
    keel__wire_pin_destroy(&ps->pin);
    for (size_t i = 0; i < ps->n_pins; i++)
        keel__wire_pin_destroy(&ps->pins[i]);
    free(ps->pins);
    free(ps->seen);
    free(ps->last_heard);
    free(ps->member);
    free(ps->lim_stale);
    free(ps->live);
    free(ps->carried);
    free(ps->push_budget);
    free(ps->push_budget_ns);
    free(ps);
}

const char *
keel__ps_endpoint(const keel__ps *ps)
{
    return ps->endpoint;
}

long
keel__ps_served(const keel__ps *ps)
{
    return ps->served;
}

long
keel__ps_rejected(const keel__ps *ps)
{
    return ps->rejected;
}

long
keel__ps_applied(const keel__ps *ps)
{
    return ps->applied;
}

long
keel__ps_dropped(const keel__ps *ps)
{
    return ps->dropped;
}

void
keel__ps_drain(keel__ps *ps, int ms)
{
    int64_t deadline = keel__now_mono_ns() + (int64_t)ms * 1000000;
    for (;;) {
        keel__wire_msg req;
        int64_t left = (deadline - keel__now_mono_ns()) / 1000000;
        keel_status st;
        if (left <= 0)
            return;
        st = keel__wire_recv(ps->sock, 1, &ps->limits, (int)left, &req);
        if (req.has_identity && (st == KEEL_OK || st == KEEL_ECORRUPT))
            keel__ps_send_error(ps, &req, KEEL_ECANCELLED, "training "
                                "finished: the chief shut this ps down");
        keel__wire_msg_clear(&req);
        if (st == KEEL_ETIMEOUT)
            return;
    }
}

/* An update (PUSH, COMMIT, MIX) computed from an earlier incarnation's
 * values: answered with an error, not applied. Returns 1 when refused. */
static int
refuse_stale_update(keel__ps *ps, keel__wire_msg *req)
{
    char text[256];
    if (ps->apply == NULL || req->h.peer_generation == 0 ||
        req->h.peer_generation == ps->generation ||
        (req->h.type != KEEL_MSG_PUSH && req->h.type != KEEL_MSG_COMMIT &&
         req->h.type != KEEL_MSG_MIX))
        return 0;
    snprintf(text, sizeof text, "ps %d restarted: this update was computed "
             "from the values of generation %016llx, the ps is now "
             "generation %016llx; pull and compute it again",
             ps->task_index, (unsigned long long)req->h.peer_generation,
             (unsigned long long)ps->generation);
    keel__ps_send_error(ps, req, KEEL_EABORTED, text);
    return 1;
}

/* The real server's requests; *handled 0 for the ones every server
 * answers alike (handle_common). */
static keel_status
handle_real(keel__ps *ps, keel__wire_msg *req, int *handled)
{
    *handled = 1;
    switch (req->h.type) {
    case KEEL_MSG_PULL:
        return keel__ps_real_pull(ps, req);
    case KEEL_MSG_PULL_ROWS:
        return keel__ps_real_pull_rows(ps, req);
    case KEEL_MSG_PUSH:
        return keel__ps_real_push(ps, req);
    case KEEL_MSG_INIT:
        return keel__ps_real_init(ps, req);
    case KEEL_MSG_COMMIT:
        return keel__ps_real_commit(ps, req);
    case KEEL_MSG_MIX:
        return keel__ps_real_mix(ps, req);
    case KEEL_MSG_HELLO:
        return keel__ps_real_hello(ps, req);
    case KEEL_MSG_LEAVE:
        return keel__ps_real_leave(ps, req);
    case KEEL_MSG_SAVE_SHARD:
        return keel__ps_real_save_shard(ps, req);
    case KEEL_MSG_SHUTDOWN:
        keel__ps_fail_pending(ps, KEEL_ECANCELLED, "training finished: "
                              "the chief shut this ps down");
        ps->is_ready = 0;
        keel__ps_answer_waiters(ps);
        break;
    default:
        break;
    }
    *handled = 0;
    return KEEL_OK;
}

/* STEP, HEARTBEAT (with the real server's stats) and SHUTDOWN. */
static keel_status
handle_common(keel__ps *ps, keel__wire_msg *req)
{
    keel__wire_header h;
    switch (req->h.type) {
    case KEEL_MSG_STEP:
    case KEEL_MSG_HEARTBEAT:
        keel__ps_reply_header(ps, req, &h, req->h.type, KEEL_WIRE_F_REPLY);
        if (ps->apply != NULL) {        /* stats for tests and tools */
            char text[512];
            h.local_step = (int64_t)ps->chief_generation;
            keel__ps_status_text(ps, text, sizeof text);
            return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0,
                                   text, NULL);
        }
        break;
    case KEEL_MSG_SHUTDOWN: {
        const char *addr = zmq_msg_gets(&req->frames[0], "Peer-Address");
        keel__ps_reply_header(ps, req, &h, req->h.type, KEEL_WIRE_F_REPLY);
        ps->is_shutdown = 1;
        keel__log(KEEL_LOG_INFO, "ps %d: shut down by %s %u (generation "
                  "%016llx) from %s", ps->task_index,
                  keel_task_type_name((keel_task_type)req->h.sender_type),
                  req->h.sender_index, (unsigned long long)req->h.generation,
                  addr ? addr : "an unknown address");
        break;
    }
    default:
        return keel__fail(KEEL_EINVAL, "message type %u is not served by "
                          "this ps", req->h.type);
    }
    return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0, NULL, NULL);
}

static keel_status
handle(keel__ps *ps, keel__wire_msg *req)
{
    int handled = 0;
    keel_status st = KEEL_OK;
    if (req->h.flags & KEEL_WIRE_F_REPLY)
        return keel__fail(KEEL_EINVAL, "a reply (type %u) sent as a request",
                          req->h.type);
    if (refuse_stale_update(ps, req))
        return KEEL_OK;
    if (ps->apply != NULL)
        st = handle_real(ps, req, &handled);
    else if (req->h.type == KEEL_MSG_PULL || req->h.type == KEEL_MSG_PUSH ||
             req->h.type == KEEL_MSG_INIT || req->h.type == KEEL_MSG_HELLO)
        return ps->serve(ps->serve_ctx, ps, req);
    if (handled)
        return st;
    return handle_common(ps, req);
}

keel_status
keel__ps_serve_once(keel__ps *ps, int timeout_ms)
{
    keel__wire_msg req;
    keel_status st;
    int logged = 0;
    if (ps->is_shutdown)
        return keel__fail(KEEL_ECANCELLED, "ps %d was shut down",
                          ps->task_index);
    st = keel__wire_recv(ps->sock, 1, &ps->limits, timeout_ms, &req);
    if (st == KEEL_ETIMEOUT || st == KEEL_ECANCELLED) {
        keel__wire_msg_clear(&req);
        return st;
    }
    if (st == KEEL_OK)
        st = keel__ps_authorize(ps, &req, &logged);
    if (st == KEEL_OK) {
        int r = keel__ps_replica_of(ps, &req.h);
        if (r < 0 && req.h.sender_type == KEEL_TASK_WORKER)
            st = keel__fail(KEEL_EINVAL, "worker %u is not a training "
                            "replica of this cluster (%d replicas%s)",
                            req.h.sender_index, ps->total_replicas,
                            ps->fixed ? keel__ps_fixed_why(ps) : ", at most "
                            KEEL__XSTR(KEEL__CLUSTER_MAX_REPLICAS));
        else if (r >= 0)
            keel__ps_member_heard(ps, r, keel__now_mono_ns());
    }
    if (st == KEEL_OK)
        st = handle(ps, &req);
    if (st != KEEL_OK && req.has_identity) {
        char why[KEEL_ERR_MAX];
        snprintf(why, sizeof why, "%s", keel_last_error());
        if (!logged) {
            long held = 0;
            char e_why[KEEL_ERR_MAX];
            ps->rejected++;
            if (keel__log_limit_take(&ps->lim_rejected, keel__now_mono_ns(),
                                     &held))
                keel__log(KEEL_LOG_WARN, "ps %d: rejected a request from "
                          "task %s %u (request %llu): %s (%ld more "
                          "rejected since the last such line)",
                          ps->task_index,
                          keel_task_type_name((keel_task_type)
                                              req.h.sender_type),
                          req.h.sender_index,
                          (unsigned long long)req.h.request_id,
                          keel__log_escape(e_why, sizeof e_why, why), held);
        }
        keel__ps_send_error(ps, &req,
                            st == KEEL_ECORRUPT || st == KEEL_ENOTFOUND ||
                            st == KEEL_EUNAVAILABLE || st == KEEL_EABORTED ||
                            st == KEEL_ECANCELLED ? st : KEEL_EINVAL,
                            why);
    } else if (st != KEEL_OK) {
        long held = 0;
        char e_why[KEEL_ERR_MAX];
        ps->rejected++;
        if (keel__log_limit_take(&ps->lim_dropped, keel__now_mono_ns(),
                                 &held))
            keel__log(KEEL_LOG_WARN, "ps %d: dropped a message: %s (%ld "
                      "more dropped since the last such line)",
                      ps->task_index, keel__log_escape(e_why, sizeof e_why,
                                                       keel_last_error()),
                      held);
    } else {
        ps->served++;
    }
    keel__wire_msg_clear(&req);
    return ps->is_shutdown ? KEEL_ECANCELLED : KEEL_OK;
}

keel_status
keel__ps_run(keel__ps *ps, const atomic_int *stop)
{
    while (stop == NULL || !atomic_load(stop)) {
        keel_status st = keel__ps_serve_once(ps, 50);
        if (st == KEEL_ECANCELLED)
            return KEEL_OK;
        if (st != KEEL_OK && st != KEEL_ETIMEOUT)
            return st;
    }
    return KEEL_OK;
}
