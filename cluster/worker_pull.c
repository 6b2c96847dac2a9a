/* worker_pull.c - the worker backend's way in: HELLO to learn whether the
 * ps are up and initialized, the chief's INIT (publish) or join of live ps,
 * the workers' fetch, the pulls (before a checkpoint, of named variables),
 * the step query and the wait between fetches. */
#include <config.h>

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <keel/session.h>
#include "worker_int.h"
#include "defaults.h"

#define HELLO_CHUNK_MS 2000
#define HELLO_SIGNAL_MS 250

static int
ms_of(double secs)
{
    double ms = secs * 1000.0;
    return ms > INT_MAX / 2 ? INT_MAX / 2 : ms < 1 ? 1 : (int)ms;
}

/* Pull the n tensors named in w->outs from ps p into vs (ps 0 holding
 * none: a step query); with dest, ps p's tensors there (and their slots,
 * with dest_slots) are faulted in meanwhile. *global_step (if not NULL):
 * ps p's step. */
keel_status
keel__worker_pull_outs(keel_cluster_backend *w, int p, size_t n,
                       keel_vars *vs, keel_vars *dest, int dest_slots,
                       int64_t *global_step)
{
    keel__wire_header h;
    keel__wire_msg r;
    keel_status st;
    memset(&h, 0, sizeof h);
    h.type = n == 0 ? KEEL_MSG_STEP : KEEL_MSG_PULL;
    h.flags = n == 0 ? 0 : KEEL_WIRE_F_NAMES_ONLY;
    st = keel__worker_call_ps(w, p, &h, w->outs, n, 0, "pull", dest,
                              dest_slots, &r);
    if (st == KEEL_OK)
        st = keel__worker_take_values(vs, &r);
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
        keel__worker_shard_outs(w, vs, p, 0, with_slots, &n);
        if (n == 0 && p != 0)
            continue;
        st = keel__worker_pull_outs(w, p, n, vs, vs, with_slots, &step);
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

/* Elastic sync with several ps: a follower applies a step at the COMMIT
 * a replica sends once ps 0 applied it, so a replica fetching in between
 * (one that joins, or recovers) would compute from two steps' values: it
 * pulls again until every ps answers at ps 0's step, for at most
 * cluster.dead_after_ms. */
keel_status
keel__worker_pull_all(keel_cluster_backend *w, keel_vars *vs,
                      int with_slots)
{
    int64_t end = keel__now_mono_ns() + (int64_t)
        (w->o.in.dead_after_ms > 0 ? w->o.in.dead_after_ms : 5000) * 1000000;
    for (;;) {
        int agreed = 1;
        keel_status st = pull_all_steps(w, vs, with_slots, &agreed);
        if (st == KEEL_OK && (agreed || !w->o.in.elastic))
            keel__worker_sparse_pulled(w, vs);
        if (st != KEEL_OK || agreed || !w->o.in.elastic)
            return st;
        if (keel__now_mono_ns() > end)
            return keel__fail(KEEL_EUNAVAILABLE, "elastic sync: the ps "
                              "answered the pulls at different global "
                              "steps for %d ms (cluster.dead_after_ms; a "
                              "step ps 0 applied is not committed on the "
                              "others)", w->o.in.dead_after_ms);
        {
            struct timespec ts = { 0, 5 * 1000000 };
            nanosleep(&ts, NULL);
        }
    }
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
        if ((st = keel__worker_prefer_local(w, p)) != KEEL_OK)
            return st;
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_HELLO;
        h.arg = (uint32_t)wait;
        st = keel__wire_client_call(w->clients[p], &h, NULL, 0, 0, piece, r);
        if (st == KEEL_OK || st == KEEL_EPEER)
            keel__worker_membership_take(w, p, r);
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

/* This task as "chief 0" / "worker 2", for the waiting messages. */
static void
self_name(const keel_cluster_backend *w, char *buf, size_t size)
{
    snprintf(buf, size, "%s %d",
             keel_task_type_name(keel_cluster_spec_task_type(w->spec)),
             keel_cluster_spec_task_index(w->spec));
}

/* 1 when a waiting message is due: the first of a wait (which begins
 * now when none is under way), then every KEEL__CLUSTER_WAIT_LOG_SECS. */
static int
wait_log_due(keel_cluster_backend *w)
{
    int64_t now = keel__now_mono_ns();
    if (w->wait_since_ns == 0) {
        w->wait_since_ns = now;
        w->wait_log_ns = now;
        return 1;
    }
    if (now - w->wait_log_ns <
        (int64_t)KEEL__CLUSTER_WAIT_LOG_SECS * 1000000000)
        return 0;
    w->wait_log_ns = now;
    return 1;
}

/* The ps from `from` on (with from_silent, from itself is known silent)
 * that do not answer a plain HELLO within HELLO_SIGNAL_MS, as
 * "ps 1 (h:p), ps 2 (h:p)". */
static void
list_missing_ps(keel_cluster_backend *w, int from, int from_silent,
                char *list, size_t size)
{
    size_t len = 0;
    list[0] = '\0';
    for (int q = from; q < w->n_ps && len < size - 1; q++) {
        keel__wire_msg r;
        int known = q == from && from_silent;
        keel_status st = known ? KEEL_ETIMEOUT
                               : hello_one(w, q, 0, HELLO_SIGNAL_MS, &r);
        if (!known)
            keel__wire_msg_clear(&r);
        if (st == KEEL_ETIMEOUT)
            len += (size_t)snprintf(list + len, size - len, "%sps %d (%s)",
                                    len ? ", " : "", q,
                                    keel_cluster_spec_address(
                                        w->spec, KEEL_TASK_PS, q));
    }
}

/* HELLO ps p with a plain HELLO until it answers or timeout_ms passes
 * (the wait beginning at start_ns), naming the ps not up at once and
 * every KEEL__CLUSTER_WAIT_LOG_SECS after. */
static keel_status
hello_until_up(keel_cluster_backend *w, int p, int64_t start_ns,
               int timeout_ms, keel__wire_msg *r)
{
    int64_t end = start_ns + (int64_t)timeout_ms * 1000000;
    for (;;) {
        int64_t left = (end - keel__now_mono_ns()) / 1000000;
        int piece = left < 1000 ? (int)(left > 0 ? left : 0) : 1000;
        char list[512], self[48];
        keel_status st = hello_one(w, p, 0, piece, r);
        if (st != KEEL_ETIMEOUT || keel__now_mono_ns() >= end)
            return st;
        keel__wire_msg_clear(r);
        if (!wait_log_due(w))
            continue;
        list_missing_ps(w, p, 1, list, sizeof list);
        self_name(w, self, sizeof self);
        keel__log(KEEL_LOG_INFO, "%s: waiting for %s: not up yet (%.0f s)",
                  self, list,
                  (double)(keel__now_mono_ns() - w->wait_since_ns) / 1e9);
    }
}

/* HELLO every ps (wait: held until ready, up to timeout_ms). *all_ready
 * and *same_chief (all ps initialized by the same chief incarnation).
 * ours (may be NULL): per ps, 1 when it is ready and initialized by this
 * task's incarnation (it survived the loss of another ps). */
static keel_status
hello_all(keel_cluster_backend *w, int wait, int timeout_ms, int *all_ready,
          int *same_chief, uint64_t *gens, char *why, size_t why_size,
          unsigned char *ours)
{
    uint64_t chief = 0;
    int64_t start = keel__now_mono_ns();
    *all_ready = 1;
    *same_chief = 1;
    for (int p = 0; p < w->n_ps; p++) {
        keel__wire_msg r;
        keel_status st = wait ? hello_one(w, p, wait, timeout_ms, &r)
                              : hello_until_up(w, p, start, timeout_ms, &r);
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
            st = keel__worker_call_error(w, p, st, &r, "hello");
            keel__wire_msg_clear(&r);
            return st;
        }
        /* the ps is up, so its Unix socket is too: nothing is under way
         * on the client to move */
        if ((st = keel__worker_prefer_local(w, p)) != KEEL_OK) {
            keel__wire_msg_clear(&r);
            return st;
        }
        if (gens != NULL)
            gens[p] = r.h.generation;
        if (ours != NULL)
            ours[p] = r.h.arg && (uint64_t)r.h.local_step == w->generation;
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
    w->wait_since_ns = 0;               /* every ps answered */
    if (chief == 0)
        *same_chief = 0;
    if (gens == w->ps_gen)
        w->gen_ns = keel__now_mono_ns();
    return KEEL_OK;
}

/* INIT of ps p with the values of vs (and the slots, with_slots: a ps
 * that survived keeps its own); its bytes added to *bytes. */
static keel_status
init_values(keel_cluster_backend *w, keel_vars *vs, int p, int with_slots,
            size_t *bytes)
{
    keel__wire_header h;
    keel__wire_msg r;
    size_t n;
    keel_status st;
    keel__worker_shard_outs(w, vs, p, 1, with_slots, &n);
    for (size_t k = 0; k < n; k++)
        *bytes += keel_tensor_bytes(w->outs[k].t);
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_INIT;
    h.global_step = keel_vars_global_step(vs);
    /* in place: nothing touches the variables until INIT is answered */
    st = keel__worker_call_ps(w, p, &h, w->outs, n, 1, "init", NULL, 0, &r);
    keel__wire_msg_clear(&r);
    return st;
}

/* Every ps initialized at vs's step. When vs is the step this chief
 * reached (it publishes its own current variables: no rollback), a ps
 * that survived the loss of another (ours: initialized by this chief and
 * ready) keeps its slots and gets the variables. The others read a
 * sharded checkpoint of that step when there is one (restored), else get
 * the values and slots. */
static keel_status
init_all(keel_cluster_backend *w, keel_vars *vs, int restored,
         unsigned char *ours, size_t *bytes, int *n_ckpt, int *n_kept)
{
    unsigned char *todo = calloc((size_t)w->n_ps, 2);
    unsigned char *done = todo + w->n_ps;
    int current = keel_vars_global_step(vs) == w->last_step_seen;
    keel_status st = KEEL_OK;
    if (todo == NULL)
        return keel__fail(KEEL_ENOMEM, "publish: %d ps", w->n_ps);
    for (int p = 0; p < w->n_ps; p++) {
        /* a rollback to a checkpoint takes its slots too; a rule's slots
         * are its state: every ps gets the chief's */
        if (!current || w->aw != NULL)
            ours[p] = 0;
        todo[p] = !ours[p];
    }
    if (restored)
        st = keel__worker_init_from_ckpt(w, vs, todo, done);
    for (int p = 0; p < w->n_ps && st == KEEL_OK; p++) {
        *n_ckpt += done[p];
        *n_kept += ours[p];
        if (!done[p])
            st = init_values(w, vs, p, !ours[p], bytes);
    }
    free(todo);
    return st;
}

keel_status
keel__worker_publish(void *ctx, keel_vars *vs, int restored)
{
    keel_cluster_backend *w = ctx;
    int ready, same, n_ckpt = 0, n_kept = 0;
    keel_status st;
    int timeout = ms_of(w->o.in.max_wait_secs);
    size_t bytes = 0;
    int64_t t0;
    unsigned char *ours = calloc((size_t)(w->n_ps > 0 ? w->n_ps : 1), 1);
    if (ours == NULL)
        return keel__fail(KEEL_ENOMEM, "publish: %d ps", w->n_ps);
    st = hello_all(w, 0, timeout, &ready, &same, w->ps_gen, NULL, 0, ours);
    if (st == KEEL_OK && ready && same) {
        free(ours);
        /* A live cluster (this chief restarted): join it, no rollback. */
        st = keel__worker_pull_all(w, vs, 1);
        if (st == KEEL_OK)
            keel__log(KEEL_LOG_INFO, "chief: joined live parameter servers "
                      "at step %lld (their state wins over any checkpoint)",
                      (long long)keel_vars_global_step(vs));
        if (st == KEEL_OK && w->aw != NULL)
            keel__algo_worker_restart(w->aw, vs);
        return st;
    }
    t0 = keel__now_mono_ns();
    if (st == KEEL_OK)
        st = init_all(w, vs, restored, ours, &bytes, &n_ckpt, &n_kept);
    free(ours);
    if (st != KEEL_OK)
        return st;
    keel__log(KEEL_LOG_INFO, "chief: %d parameter server(s) initialized at "
              "step %lld; cluster ready (INIT of %.1f MiB in %.3f s; %d read "
              "a checkpoint, %d kept their slots)",
              w->n_ps, (long long)keel_vars_global_step(vs),
              (double)bytes / (1 << 20),
              (double)(keel__now_mono_ns() - t0) / 1e9, n_ckpt, n_kept);
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

keel_status
keel__worker_is_intact(void *ctx, keel_vars *vs, int *is_intact)
{
    keel_cluster_backend *w = ctx;
    int ready, same;
    uint64_t *gens = calloc((size_t)w->n_ps, sizeof *gens);
    keel_status st;
    *is_intact = 0;
    if (gens == NULL)
        return keel__fail(KEEL_ENOMEM, "is_intact: %d ps", w->n_ps);
    st = hello_all(w, 0, w->o.in.dead_after_ms, &ready, &same, gens, NULL,
                   0, NULL);
    if (st == KEEL_OK && ready && same) {
        /* joining these incarnations: a restart during the pull is one */
        memcpy(w->ps_gen, gens, (size_t)w->n_ps * sizeof *gens);
        w->gen_ns = keel__now_mono_ns();
        st = keel__worker_pull_all(w, vs, 1);
        *is_intact = st == KEEL_OK;
        if (st == KEEL_OK && w->aw != NULL)
            keel__algo_worker_restart(w->aw, vs);
        w->restore_local = 0;
    }
    free(gens);
    return st;
}

/* The chief's address, for the waiting messages ("chief 0 (h:p)", or
 * worker 0's without a chief job). */
static void
chief_name(const keel_cluster_backend *w, char *buf, size_t size)
{
    keel_task_type t = keel_cluster_spec_num_tasks(w->spec,
                                                   KEEL_TASK_CHIEF) > 0
                           ? KEEL_TASK_CHIEF : KEEL_TASK_WORKER;
    snprintf(buf, size, "%s 0 (%s)", keel_task_type_name(t),
             keel_cluster_spec_address(w->spec, t, 0));
}

/* A worker's fetch found the cluster not ready: every
 * KEEL__CLUSTER_WAIT_LOG_SECS, name what it waits for - each ps that does
 * not answer, else the chief that has not initialized them. */
static void
log_not_ready(keel_cluster_backend *w)
{
    char list[512], self[48], chief[KEEL_ADDR_MAX + 32];
    if (!wait_log_due(w))
        return;
    list_missing_ps(w, 0, 0, list, sizeof list);
    self_name(w, self, sizeof self);
    chief_name(w, chief, sizeof chief);
    keel__log(KEEL_LOG_INFO, "%s: waiting for %s%s (%.0f s of "
              "cluster.max_wait_secs %.0f)", self,
              list[0] ? list : chief,
              list[0] ? ": not up yet" : " to initialize the ps",
              (double)(keel__now_mono_ns() - w->wait_since_ns) / 1e9,
              w->o.in.max_wait_secs);
}

keel_status
keel__worker_fetch(void *ctx, keel_vars *vs, int *is_ready, char *why,
                   size_t size)
{
    keel_cluster_backend *w = ctx;
    int same;
    keel_status st;
    int chunk = ms_of(w->o.in.max_wait_secs);
    int64_t t0;
    w->last_fetch_ns = keel__now_mono_ns();
    st = hello_all(w, 1, chunk < HELLO_CHUNK_MS ? chunk : HELLO_CHUNK_MS,
                   is_ready, &same, w->ps_gen, why, size, NULL);
    if (st == KEEL_OK && !*is_ready)
        log_not_ready(w);
    if (st != KEEL_OK || !*is_ready)
        return st;
    t0 = keel__now_mono_ns();
    st = keel__worker_pull_all(w, vs, 0);
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

/* The cluster's global step, ps 0's (the one keel__worker_apply adopts):
 * one STEP request, no values. A restarted ps 0 is a recoverable error. */
keel_status
keel__worker_read_step(void *ctx, int64_t *step)
{
    keel_cluster_backend *w = ctx;
    keel__wire_header h;
    keel__wire_msg r;
    keel_status st;
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_STEP;
    st = keel__worker_call_ps(w, 0, &h, NULL, 0, 0, "the step query", NULL,
                              0, &r);
    if (st == KEEL_OK && r.h.generation != w->ps_gen[0])
        st = keel__worker_restarted(w, 0, &r);
    if (st == KEEL_OK)
        *step = r.h.global_step;
    keel__wire_msg_clear(&r);
    return st;
}

/* fetch itself blocks until readiness (an event from the ps); only a
 * fetch that returned quickly is followed by the retry floor. */
keel_status
keel__worker_wait(void *ctx, int64_t deadline_ns)
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

/* The chief, before a checkpoint: the ps hold the truth. */
keel_status
keel__worker_before_save(void *ctx, keel_vars *vs)
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
