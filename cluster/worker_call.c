/* worker_call.c - one request of the worker backend to a ps and its
 * reply, waited for as long as the ps stays alive and the same
 * incarnation (heartbeats); the failures as session statuses. */
#include <config.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <keel/session.h>
#include "worker_int.h"

#define WAIT_CHUNK_MS 20

keel_status
keel__worker_prefer_local(keel_cluster_backend *w, int p)
{
    char ep[KEEL_ADDR_MAX + 16];
    keel_status st;
    if (w->o.in.local_transport != KEEL_LOCAL_TRANSPORT_AUTO ||
        strncmp(keel__wire_client_endpoint(w->clients[p]), "tcp://", 6) != 0)
        return KEEL_OK;
    st = keel__cluster_peer_endpoint(
        keel_cluster_spec_address(w->spec, KEEL_TASK_PS, p),
        KEEL_LOCAL_TRANSPORT_AUTO, ep, sizeof ep);
    if (st != KEEL_OK || strncmp(ep, "ipc://", 6) != 0)
        return KEEL_OK;
    st = keel__wire_client_retarget(w->clients[p], ep, &w->curves[p]);
    if (st == KEEL_OK)
        keel__log(KEEL_LOG_INFO, "%s %d: ps %d over %s",
                  keel_task_type_name(keel_cluster_spec_task_type(w->spec)),
                  keel_cluster_spec_task_index(w->spec), p, ep);
    return st;
}

/* KEEL_EABORTED for a reply r of ps p from another generation than the one
 * this task knows: the ps restarted. */
keel_status
keel__worker_restarted(const keel_cluster_backend *w, int p,
                       const keel__wire_msg *r)
{
    return keel__fail(KEEL_EABORTED, "ps %d restarted (generation %016llx, "
                      "was %016llx)", p, (unsigned long long)r->h.generation,
                      (unsigned long long)w->ps_gen[p]);
}

/* The end of ps p's reply r to a step's request: when st is KEEL_OK, ps 0's
 * global step (the step's authority) into *new_step; r cleared. Returns st. */
keel_status
keel__worker_end_reply(keel__wire_msg *r, int p, keel_status st,
                       int64_t *new_step)
{
    if (st == KEEL_OK && p == 0)
        *new_step = r->h.global_step;
    keel__wire_msg_clear(r);
    return st;
}

/* A failed call to ps p as a session status: timeouts and a restarted or
 * uninitialized ps are recoverable, a shut-down cluster ends the input. */
keel_status
keel__worker_call_error(keel_cluster_backend *w, int p, keel_status st,
                        const keel__wire_msg *r, const char *what)
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

/* Elastic sync: ps p's reply r tells this replica the membership (ps 0's
 * word, when it has one); the chief logs the ps's note of the changes
 * whenever a reply carries it (ps 0 sends each once: a change learned
 * first from a pull reply is named by a later token), else a line of its
 * own when the epoch changed. */
void
keel__worker_membership_take(keel_cluster_backend *w, int p,
                             const keel__wire_msg *r)
{
    uint64_t was = w->membership, now = r->h.peer_generation;
    const char *note;
    if (p != 0 || now == 0 || r->h.sender_type != KEEL_TASK_PS)
        return;
    w->membership = now;
    /* the replies that carry the ps's note of a change to the chief */
    if (!w->is_chief || was == 0 ||
        (r->h.type != KEEL_MSG_READY && r->h.type != KEEL_MSG_PUSH_ACK &&
         r->h.type != KEEL_MSG_ERROR))
        return;
    note = r->text != NULL ? strstr(r->text, "membership: ") : NULL;
    if (note != NULL)
        keel__log(KEEL_LOG_INFO, "%s", note);
    else if (KEEL__MEMBERSHIP_EPOCH(was) != KEEL__MEMBERSHIP_EPOCH(now))
        keel__log(KEEL_LOG_INFO, "membership: %d -> %d replica%s at step "
                  "%lld", KEEL__MEMBERSHIP_COUNT(was),
                  KEEL__MEMBERSHIP_COUNT(now),
                  KEEL__MEMBERSHIP_COUNT(now) == 1 ? "" : "s",
                  (long long)r->h.global_step);
}

/* Copy the tensors of a reply into vs (variables or "var/slot"). */
keel_status
keel__worker_take_values(keel_vars *vs, const keel__wire_msg *r)
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
void
keel__worker_shard_outs(keel_cluster_backend *w, keel_vars *vs, int p,
                        int with_data, int with_slots, size_t *n)
{
    size_t k = 0, nn = 0;
    for (size_t i = 0; i < w->n_vars; i++) {
        keel_var *v = keel_vars_at(vs, i);
        if (w->ps_of[i] != p || keel__worker_sparse_skip(v, with_slots))
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

/* fault_in() the tensors ps p is about to send into vs (see
 * keel__worker_shard_outs) */
static void
fault_in_shard(keel_cluster_backend *w, keel_vars *vs, int p, int with_slots)
{
    for (size_t i = 0; i < w->n_vars; i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_tensor *t = keel_var_tensor(v);
        if (w->ps_of[i] != p || keel__worker_sparse_skip(v, with_slots))
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
 * after a fixed timeout. Errors through keel__worker_call_error. With
 * zero_copy the tensors go out in place: they must not change until this
 * returns (the wait, or an abandon's reconnect, waits until libzmq lets go
 * of them).
 * With dest (a pull), ps p's tensors in dest (and their slots, with
 * dest_slots) are faulted in while the reply is on its way. */
keel_status
keel__worker_call_ps(keel_cluster_backend *w, int p, keel__wire_header *h,
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
        st = keel__worker_wait_reply(w, p, what, 0, r);
        if (st != KEEL_OK && r->h.type == 0)
            return st;            /* abandoned: the reason is set */
    }
    return st == KEEL_OK ? KEEL_OK
                         : keel__worker_call_error(w, p, st, r, what);
}

/* Give up a push to ps p: drop its connection (and the queued frames, so
 * the gradient buffers are ours again) and say why. */
keel_status
keel__worker_abandon(keel_cluster_backend *w, int p, keel_status code,
                     const char *fmt, ...)
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
 * final checkpoint after a signal needs them. A step's push is also given
 * up when another ps of the step restarted or died: the step cannot
 * complete, and ps p may hold this push until the other replicas come,
 * which wait for the lost ps to be initialized again (by this task's
 * recovery). Elastic sync: a step's push to another ps than ps 0 is
 * given up when ps 0's heartbeats tell a newer membership epoch than the
 * one the push was divided by: ps 0 dropped a replica, the step is
 * computed again, and this ps may wait for the dropped one's push. *r is
 * initialized either way (type 0 when abandoned). */
keel_status
keel__worker_wait_reply(keel_cluster_backend *w, int p, const char *what,
                        int on_signal, keel__wire_msg *r)
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
        if (st == KEEL_OK || st == KEEL_EPEER)   /* an ERROR tells it too */
            keel__worker_membership_take(w, p, r);
        if (st != KEEL_ETIMEOUT)
            return st;
        keel__wire_msg_clear(r);
        keel__wire_msg_init(r);
        if (on_signal && keel_session_signal_received())
            return keel__worker_abandon(
                w, p, KEEL_ECANCELLED, "signal %d received while %s waited "
                "for ps %d (%s): the step is given up",
                keel_session_signal_received(), what, p, addr);
        now = keel__now_mono_ns();
        keel__hb_peer_get(w->hb, p, &peer);
        quiet = now - (peer.since_ns > start ? peer.since_ns : start);
        if (peer.last_heard_ns > w->gen_ns &&
            peer.generation != w->ps_gen[p])
            return keel__worker_abandon(
                w, p, KEEL_EABORTED, "ps %d (%s) restarted (generation "
                "%016llx, was %016llx) while %s waited", p, addr,
                (unsigned long long)peer.generation,
                (unsigned long long)w->ps_gen[p], what);
        if (quiet > dead)
            return keel__worker_abandon(
                w, p, KEEL_EUNAVAILABLE, "ps %d (%s) silent for %.1f s "
                "(cluster.dead_after_ms = %d): declared dead during %s", p,
                addr, (double)quiet / 1e9, w->o.in.dead_after_ms, what);
        for (int q = 0; on_signal && q < w->n_ps; q++) {
            keel__hb_peer other;
            if (q == p)
                continue;
            keel__hb_peer_get(w->hb, q, &other);
            if (other.last_heard_ns > w->gen_ns &&
                other.generation != w->ps_gen[q])
                return keel__worker_abandon(
                    w, p, KEEL_EABORTED, "ps %d restarted (generation "
                    "%016llx, was %016llx) while %s waited for ps %d", q,
                    (unsigned long long)other.generation,
                    (unsigned long long)w->ps_gen[q], what, p);
            if (now - (other.since_ns > start ? other.since_ns : start) >
                dead)
                return keel__worker_abandon(
                    w, p, KEEL_EUNAVAILABLE, "ps %d silent for more than "
                    "%d ms (cluster.dead_after_ms) while %s waited for ps "
                    "%d: declared dead", q, w->o.in.dead_after_ms, what, p);
        }
        if (on_signal && p != 0 && w->o.in.elastic) {
            keel__hb_peer ps0;
            keel__hb_peer_get(w->hb, 0, &ps0);
            if (KEEL__MEMBERSHIP_EPOCH(ps0.membership) >
                KEEL__MEMBERSHIP_EPOCH(w->membership))
                return keel__worker_abandon(
                    w, p, KEEL_EABORTED, "ps 0 changed the membership "
                    "(epoch %u -> %u) while %s waited for ps %d: the step "
                    "is computed again",
                    KEEL__MEMBERSHIP_EPOCH(w->membership),
                    KEEL__MEMBERSHIP_EPOCH(ps0.membership), what, p);
        }
        if (limit > 0 && now - start > limit)
            return keel__worker_abandon(
                w, p, KEEL_ETIMEOUT, "%s did not complete within %.0f s "
                "(cluster.step_timeout_secs); ps %d says: %s", what,
                w->o.in.step_timeout_secs, p,
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
