/* heartbeat.c - liveness of the parameter servers, seen from a worker or
 * the chief: a background thread with its own sockets sends a HEARTBEAT to
 * every ps each interval and records when each last answered, with which
 * incarnation, at which step, and what its current sync step still lacks.
 * The training thread reads snapshots while it waits for a step, so a dead
 * or restarted ps is noticed in about one interval, however long the step
 * legitimately waits for other replicas.
 * With dead_after_ms, the sockets also send ZMTP pings, which the ps's
 * libzmq I/O thread answers: a ps whose serving thread is busy for longer
 * than dead_after_ms (a large apply or INIT on a loaded machine) stays
 * alive while its connection answers; a killed, frozen or cut-off one
 * loses the connection after dead_after_ms without traffic. A ps gets at
 * most MAX_UNANSWERED beats it has not answered: a busy one's connection
 * never fills the ps's per-connection queue (PS_RCVHWM), so libzmq keeps
 * reading it and answering its pings (a connection it stopped reading
 * would miss them, drop, and abort libzmq 4.3.4 when read again). */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster_int.h"

#define RETRY_MS 20
/* Beats a ps may hold unanswered: well under the ps's PS_RCVHWM. */
#define MAX_UNANSWERED 4

struct keel__hb {
    void *zctx;
    void **socks;                  /* one DEALER per ps */
    void **mons;                   /* one PAIR per ps: its socket's
                                    * handshake events */
    int *unanswered;               /* per ps: beats sent since its last
                                    * answer or (re)connection (this
                                    * thread only) */
    void *wake_rx, *wake_tx;       /* inproc PAIR: stop now */
    int n;
    int interval_ms;
    keel_task_type type;
    int index;
    uint64_t generation;
    int dead_after_ms;
    uint64_t next_id;
    keel__wire_limits limits;
    int64_t started_ns;
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t cv;             /* broadcast on every answer */
    keel__hb_peer *peers;          /* guarded by mu */
};

static void
close_all(keel__hb *hb)
{
    for (int p = 0; hb->socks != NULL && p < hb->n; p++)
        if (hb->socks[p] != NULL)
            zmq_close(hb->socks[p]);
    for (int p = 0; hb->mons != NULL && p < hb->n; p++)
        if (hb->mons[p] != NULL)
            zmq_close(hb->mons[p]);
    if (hb->wake_rx != NULL)
        zmq_close(hb->wake_rx);
    if (hb->wake_tx != NULL)
        zmq_close(hb->wake_tx);
    if (hb->zctx != NULL)
        zmq_ctx_term(hb->zctx);
}

/* 1 if the beat could not be sent (no live connection to ps p); 0 also
 * when ps p still holds MAX_UNANSWERED beats (it is busy, not gone). */
static int
send_beat(keel__hb *hb, int p)
{
    keel__wire_header h;
    if (hb->unanswered[p] >= MAX_UNANSWERED)
        return 0;
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_HEARTBEAT;
    h.request_id = hb->next_id++;
    h.sender_type = (uint8_t)hb->type;
    h.sender_index = (uint32_t)hb->index;
    h.generation = hb->generation;
    /* Non-blocking, and only on a live connection (ZMQ_IMMEDIATE): a ps
     * that is down misses this beat, and the next comes soon. */
    if (keel__wire_send(hb->socks[p], NULL, &h, NULL, 0, NULL, NULL) !=
        KEEL_OK)
        return 1;
    hb->unanswered[p]++;
    return 0;
}

/* 1 if a beat could not be sent to some ps. */
static int
send_beats(keel__hb *hb)
{
    int missed = 0;
    for (int p = 0; p < hb->n; p++)
        missed |= send_beat(hb, p);
    return missed;
}

/* Drain ps p's monitor; 1 if a connection to it was (re)established.
 * Keeps the peer's link state: up from a handshake, down from a drop
 * (the last traffic then dead_after_ms before it: the ping timeout). */
static int
take_events(keel__hb *hb, int p)
{
    int is_up = 0;
    for (;;) {
        zmq_msg_t m;
        int more = 0;
        size_t more_size = sizeof more;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, hb->mons[p], ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return is_up;
        }
        /* frame 1: uint16 event, uint32 value; frame 2: the endpoint */
        if (zmq_msg_size(&m) >= 2) {
            uint16_t ev;
            int64_t now = keel__now_mono_ns();
            memcpy(&ev, zmq_msg_data(&m), sizeof ev);
            pthread_mutex_lock(&hb->mu);
            /* beats queued to a connection that is gone are lost */
            hb->unanswered[p] = 0;
            if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
                is_up = 1;
                hb->peers[p].link_up = hb->dead_after_ms > 0;
                hb->peers[p].link_seen_ns = now;
            } else if (ev == ZMQ_EVENT_DISCONNECTED &&
                       hb->peers[p].link_up) {
                int64_t seen = now - (int64_t)hb->dead_after_ms * 1000000;
                hb->peers[p].link_up = 0;
                if (seen > hb->peers[p].link_seen_ns)
                    hb->peers[p].link_seen_ns = seen;
            }
            pthread_mutex_unlock(&hb->mu);
        }
        zmq_msg_close(&m);
        while (zmq_getsockopt(hb->mons[p], ZMQ_RCVMORE, &more,
                              &more_size) == 0 && more) {
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, hb->mons[p], ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                return is_up;
            }
            zmq_msg_close(&m);
        }
    }
}

static void
take_reply(keel__hb *hb, int p, const keel__wire_msg *m)
{
    keel__hb_peer *peer = &hb->peers[p];
    if (m->h.type != KEEL_MSG_HEARTBEAT || !(m->h.flags & KEEL_WIRE_F_REPLY))
        return;
    pthread_mutex_lock(&hb->mu);
    peer->last_heard_ns = keel__now_mono_ns();
    peer->generation = m->h.generation;
    peer->global_step = m->h.global_step;
    peer->membership = m->h.peer_generation;
    peer->beats++;
    snprintf(peer->status, sizeof peer->status, "%s",
             m->text != NULL ? m->text : "");
    pthread_cond_broadcast(&hb->cv);
    pthread_mutex_unlock(&hb->mu);
}

static void *
hb_main(void *arg)
{
    keel__hb *hb = arg;
    /* the ps sockets, their monitors, the wake-up socket */
    int n_items = 2 * hb->n + 1;
    zmq_pollitem_t *items = calloc((size_t)n_items, sizeof *items);
    if (items == NULL)
        return NULL;
    for (int p = 0; p < hb->n; p++) {
        items[p].socket = hb->socks[p];
        items[p].events = ZMQ_POLLIN;
        items[hb->n + p].socket = hb->mons[p];
        items[hb->n + p].events = ZMQ_POLLIN;
    }
    items[2 * hb->n].socket = hb->wake_rx;
    items[2 * hb->n].events = ZMQ_POLLIN;
    for (;;) {
        /* A ps that could not be reached is tried again after RETRY_MS, so
         * a restarted one answers (with its new generation) about as soon
         * as it binds, not up to an interval later. */
        int missed = send_beats(hb);
        int64_t next = keel__now_mono_ns() +
                       (int64_t)(missed && hb->interval_ms > RETRY_MS
                                     ? RETRY_MS : hb->interval_ms) * 1000000;
        for (;;) {
            int64_t left = (next - keel__now_mono_ns()) / 1000000;
            int rc;
            if (left <= 0)
                break;
            rc = zmq_poll(items, n_items, (long)left);
            if (rc < 0 && errno == EINTR)
                continue;
            if (rc < 0 || (items[2 * hb->n].revents & ZMQ_POLLIN))
                goto out;           /* stopped (or the context is gone) */
            /* A connection to a ps came (back) up: beat it now. A killed
             * and restarted ps is so noticed (its new generation) as soon
             * as the socket reconnects to it, not at the next interval,
             * up to interval_ms later. */
            for (int p = 0; p < hb->n; p++)
                if ((items[hb->n + p].revents & ZMQ_POLLIN) &&
                    take_events(hb, p))
                    (void)send_beat(hb, p);
            for (int p = 0; p < hb->n; p++) {
                keel__wire_msg m;
                if (!(items[p].revents & ZMQ_POLLIN))
                    continue;
                hb->unanswered[p] = 0;   /* ps p reads its beats */
                if (keel__wire_recv(hb->socks[p], 0, &hb->limits, 0, &m) ==
                    KEEL_OK)
                    take_reply(hb, p, &m);
                keel__wire_msg_clear(&m);
            }
        }
    }
out:
    free(items);
    return NULL;
}

/* cfg into hb: the peers, the beat interval, who beats; replies carry a
 * text only. */
static void
take_hb_config(keel__hb *hb, const keel__hb_config *cfg)
{
    pthread_condattr_t a;
    pthread_mutex_init(&hb->mu, NULL);
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&hb->cv, &a);
    pthread_condattr_destroy(&a);
    hb->n = cfg->n;
    hb->interval_ms = cfg->interval_ms;
    hb->type = cfg->type;
    hb->index = cfg->index;
    hb->generation = cfg->generation;
    hb->dead_after_ms = cfg->dead_after_ms > 0 ? cfg->dead_after_ms : 0;
    hb->next_id = 1;
    hb->started_ns = keel__now_mono_ns();
    keel__wire_limits_default(&hb->limits);
    hb->limits.max_tensors = 1;
    hb->limits.max_total_bytes = 1024;
}

/* A DEALER to ps p (never blocking a send, queueing nothing for a peer
 * not connected; with dead_after_ms, pinging it at the interval and
 * dropping the connection after dead_after_ms without traffic) and the
 * monitor that says when its handshake succeeds and when it drops. */
static keel_status
connect_peer(keel__hb *hb, const keel__hb_config *cfg, int p)
{
    int zero = 0, one = 1;
    int ivl = hb->interval_ms, timeout = hb->dead_after_ms;
    char mon[64];
    keel_status st = KEEL_OK;
    void *s = zmq_socket(hb->zctx, ZMQ_DEALER);
    if (s == NULL)
        return keel__fail(KEEL_EIO, "heartbeat: socket: %s",
                          zmq_strerror(errno));
    hb->socks[p] = s;
    if ((st = keel__wire_sockopts(s, &hb->limits)) != KEEL_OK ||
        zmq_setsockopt(s, ZMQ_SNDTIMEO, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(s, ZMQ_IMMEDIATE, &one, sizeof one) != 0 ||
        (timeout > 0 &&
         (zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
          zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &timeout,
                         sizeof timeout) != 0)) ||
        (st = keel__curve_setup_client(
             s, cfg->curves != NULL ? &cfg->curves[p] : NULL)) != KEEL_OK)
        return st != KEEL_OK ? st
                             : keel__fail(KEEL_EIO, "heartbeat: options: %s",
                                          zmq_strerror(errno));
    snprintf(mon, sizeof mon, "inproc://keel-hb-%p-mon-%d", (void *)hb, p);
    hb->mons[p] = zmq_socket(hb->zctx, ZMQ_PAIR);
    if (hb->mons[p] == NULL ||
        zmq_setsockopt(hb->mons[p], ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_socket_monitor(s, mon, ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                       ZMQ_EVENT_DISCONNECTED) != 0 ||
        zmq_connect(hb->mons[p], mon) != 0)
        return keel__fail(KEEL_EIO, "heartbeat: monitor of ps %d: %s", p,
                          zmq_strerror(errno));
    if ((st = keel__cluster_zmq_connect(s, cfg->endpoints[p])) != KEEL_OK)
        return keel__wrap(st, "heartbeat");
    return KEEL_OK;
}

/* The pair keel__hb_stop wakes the thread through. */
static keel_status
open_wake_pair(keel__hb *hb)
{
    int zero = 0;
    char wake[64];
    snprintf(wake, sizeof wake, "inproc://keel-hb-%p", (void *)hb);
    hb->wake_rx = zmq_socket(hb->zctx, ZMQ_PAIR);
    hb->wake_tx = zmq_socket(hb->zctx, ZMQ_PAIR);
    if (hb->wake_rx == NULL || hb->wake_tx == NULL ||
        zmq_setsockopt(hb->wake_tx, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(hb->wake_rx, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_bind(hb->wake_rx, wake) != 0 ||
        zmq_connect(hb->wake_tx, wake) != 0)
        return keel__fail(KEEL_EIO, "heartbeat: wake-up pair: %s",
                          zmq_strerror(errno));
    return KEEL_OK;
}

keel_status
keel__hb_start(const keel__hb_config *cfg, keel__hb **out)
{
    keel__hb *hb;
    keel_status st = KEEL_OK;
    *out = NULL;
    if (cfg->n < 1 || cfg->interval_ms < 1)
        return keel__fail(KEEL_EINVAL, "heartbeat: %d peers every %d ms",
                          cfg->n, cfg->interval_ms);
    hb = calloc(1, sizeof *hb);
    if (hb == NULL)
        return keel__fail(KEEL_ENOMEM, "heartbeat: %zu bytes", sizeof *hb);
    take_hb_config(hb, cfg);
    hb->socks = calloc((size_t)cfg->n, sizeof *hb->socks);
    hb->mons = calloc((size_t)cfg->n, sizeof *hb->mons);
    hb->peers = calloc((size_t)cfg->n, sizeof *hb->peers);
    hb->unanswered = calloc((size_t)cfg->n, sizeof *hb->unanswered);
    hb->zctx = zmq_ctx_new();
    if (hb->socks == NULL || hb->mons == NULL || hb->peers == NULL ||
        hb->unanswered == NULL || hb->zctx == NULL)
        st = keel__fail(KEEL_ENOMEM, "heartbeat: tables for %d ps", cfg->n);
    for (int p = 0; p < cfg->n && st == KEEL_OK; p++)
        st = connect_peer(hb, cfg, p);
    if (st == KEEL_OK)
        st = open_wake_pair(hb);
    if (st == KEEL_OK && pthread_create(&hb->thread, NULL, hb_main, hb) != 0)
        st = keel__fail(KEEL_EIO, "heartbeat: thread: %s", strerror(errno));
    if (st != KEEL_OK) {
        keel__hb_stop(hb);          /* not running: frees what was made */
        return st;
    }
    hb->running = 1;
    *out = hb;
    return KEEL_OK;
}

void
keel__hb_stop(keel__hb *hb)
{
    if (hb == NULL)
        return;
    if (hb->running) {
        (void)zmq_send(hb->wake_tx, "", 0, ZMQ_DONTWAIT);
        pthread_join(hb->thread, NULL);
    }
    close_all(hb);
    free(hb->socks);
    free(hb->mons);
    free(hb->peers);
    free(hb->unanswered);
    pthread_mutex_destroy(&hb->mu);
    pthread_cond_destroy(&hb->cv);
    free(hb);
}

void
keel__hb_peer_get(keel__hb *hb, int p, keel__hb_peer *out)
{
    memset(out, 0, sizeof *out);
    if (hb == NULL || p < 0 || p >= hb->n)
        return;
    pthread_mutex_lock(&hb->mu);
    *out = hb->peers[p];
    pthread_mutex_unlock(&hb->mu);
    if (out->link_up)
        out->link_seen_ns = keel__now_mono_ns();
    out->since_ns = out->last_heard_ns > out->link_seen_ns
                        ? out->last_heard_ns : out->link_seen_ns;
    if (out->since_ns == 0)
        out->since_ns = hb->started_ns;
}

int
keel__hb_wait(keel__hb *hb, int p, long beats, int timeout_ms)
{
    int64_t deadline = keel__now_mono_ns() + (int64_t)timeout_ms * 1000000;
    int ok;
    if (hb == NULL || p < 0 || p >= hb->n)
        return 0;
    pthread_mutex_lock(&hb->mu);
    while (hb->peers[p].beats <= beats) {
        struct timespec ts;
        if (keel__now_mono_ns() >= deadline)
            break;
        ts.tv_sec = deadline / 1000000000;
        ts.tv_nsec = deadline % 1000000000;
        pthread_cond_timedwait(&hb->cv, &hb->mu, &ts);
    }
    ok = hb->peers[p].beats > beats;
    pthread_mutex_unlock(&hb->mu);
    return ok;
}
