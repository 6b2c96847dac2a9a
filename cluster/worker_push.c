/* worker_push.c - the worker backend's step: the PUSH of the gradients to
 * every ps and the token that answers it (the new values), the chief's
 * update and COMMIT when it applies, and an update rule's commits and
 * pulls (keel__algo_io). */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker_int.h"

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

/* Keep the outs (from keel__worker_shard_outs) of trainable variables and
 * their slots, in order; returns how many. */
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
        keel__worker_shard_outs(w, vs, p, 1, 1, &n);  /* every ps awaits it */
        if (w->o.in.chief_commits_trainable_only)
            n = keep_trainable(vs, w->outs, n);
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_COMMIT;
        h.peer_generation = w->ps_gen[p];
        h.global_step = global_step;
        snprintf(what, sizeof what, "the commit of step %lld",
                 (long long)global_step);
        /* in place: nothing touches the variables until it is answered */
        st = keel__worker_call_ps(w, p, &h, w->outs, n, 1, what, NULL, 0, &r);
        if (st == KEEL_OK && r.h.generation != w->ps_gen[p])
            st = keel__fail(KEEL_EABORTED, "ps %d restarted during %s", p,
                            what);
        if ((st = keel__worker_end_reply(&r, p, st, new_step)) != KEEL_OK)
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
    int64_t examples;           /* the gradients' example count; 0: none */
    int pieces;                 /* srcs are pieces of the step's mean */
    int sparse;                 /* srcs[0]'s rows go as rows
                                 * (keel__worker_sparse_prepare) */
    int into;                   /* KEEL__ALGO_INTO_*: where values go */
    keel_grads *center;         /* with KEEL__ALGO_INTO_CENTER */
    keel_grads *mean;           /* the chief that applies, else NULL */
    keel__metrics *metrics;     /* sent to ps 0 and combined there, or
                                 * NULL */
    int64_t *new_step;
    int64_t *t_copy;            /* time spent copying values in */
    int64_t *t_sent;            /* when every PUSH was queued */
} push_req;

/* Queue the PUSH of ps p's tensors of q->srcs (zero-copy). */
static keel_status
send_push(keel_cluster_backend *w, const push_req *q, int p)
{
    keel__wire_header h;
    size_t k = 0, rk;
    int rows = 0;
    keel_status st;
    for (int m = 0; m < q->n_src; m++) {
        keel_grads *src = q->srcs[m];
        for (size_t i = 0; i < w->n_vars; i++) {
            keel_tensor *g;
            if (w->ps_of[i] != p || (g = keel_grads_at(src, i)) == NULL)
                continue;
            if (q->sparse && (rk = keel__worker_sparse_outs(
                                  w, q->vs, src, i, w->outs + k)) > 0) {
                k += rk;                /* its ids and rows */
                rows = 1;
                continue;
            }
            if (q->sparse && (keel_var_flags(keel_vars_at(q->vs, i)) &
                              KEEL_VAR_ROWS))
                continue;               /* a row variable without rows */
            w->outs[k].name = keel_var_name(keel_vars_at(q->vs, i));
            w->outs[k].t = g;
            w->outs[k].pin = NULL;
            k++;
        }
    }
    memset(&h, 0, sizeof h);
    if (rows)
        h.flags |= KEEL_WIRE_F_ROWS;
    if (p == 0 && q->metrics != NULL) {
        keel__wire_metrics_push(q->metrics, &w->push_metrics);
        w->outs[k].name = KEEL__WIRE_METRICS_NAME;
        w->outs[k].t = &w->push_metrics.t;
        w->outs[k].pin = NULL;
        k++;
        h.flags |= KEEL_WIRE_F_METRICS;
    }
    if (w->o.in.elastic) {              /* every ps aggregates by it */
        keel__wire_membership_put(w->membership, &w->push_membership);
        w->outs[k].name = KEEL__WIRE_MEMBERSHIP_NAME;
        w->outs[k].t = &w->push_membership.t;
        w->outs[k].pin = NULL;
        k++;
        h.flags |= KEEL_WIRE_F_MEMBERSHIP;
    }
    h.type = KEEL_MSG_PUSH;
    h.peer_generation = w->ps_gen[p];
    h.flags |= q->into != KEEL__ALGO_INTO_NONE ? KEEL_WIRE_F_WANT_VALUES : 0;
    if (q->pieces)
        h.flags |= KEEL_WIRE_F_PIECES;
    h.local_step = q->local_step;
    h.global_step = q->covered;         /* the steps this push covers */
    h.examples = (uint32_t)q->examples;
    for (size_t j = 0; j < k; j++)
        w->step_bytes += w->outs[j].t->count * sizeof(float);
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
    if (keel__worker_abandon(w, p, KEEL_EABORTED, "step %lld abandoned",
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
    st = keel__worker_wait_reply(w, p, what, 1, &r);
    if (st != KEEL_OK && r.h.type == 0) {
        /* abandoned or failed locally: nothing was read */
    } else if (st != KEEL_OK) {
        st = keel__worker_call_error(w, p, st, &r, "push");
    } else if (r.h.generation != w->ps_gen[p]) {
        st = keel__worker_restarted(w, p, &r);
    } else if ((st = keel__wire_take_ack_metrics(&r, p == 0 ? q->metrics
                                                        : NULL)) != KEEL_OK) {
        st = keel__wrap(st, "ps %d: push reply", p);
    } else if (r.h.type == KEEL_MSG_AGGREGATE) {
        st = q->mean != NULL
            ? take_grads(q->vs, q->mean, &r)
            : keel__fail(KEEL_ECORRUPT, "ps %d sent the step's mean "
                         "gradient to a task that does not apply", p);
        (*aggregated)++;
    } else if (q->into != KEEL__ALGO_INTO_NONE) {
        int64_t t = keel__now_mono_ns();
        for (size_t k = 0; k < r.n; k++)
            w->step_pull_bytes += r.tensors[k].t.count * sizeof(float);
        st = q->into == KEEL__ALGO_INTO_CENTER
            ? take_center(q->center, q->vs, &r)
            : keel__worker_take_values(q->vs, &r);
        *q->t_copy += keel__now_mono_ns() - t;
    }
    return keel__worker_end_reply(&r, p, st, q->new_step);
}

/* The PUSH to ps from..to-1 (sent to all first, then each reply taken:
 * the ps work in parallel); a failed send gives up the pushes already
 * sent. *aggregated counts the AGGREGATE answers. */
static keel_status
push_range(keel_cluster_backend *w, const push_req *q, int from, int to,
           int *aggregated)
{
    keel_status first = KEEL_OK;
    int sent;
    for (sent = from; sent < to; sent++)
        if ((first = send_push(w, q, sent)) != KEEL_OK)
            break;
    *q->t_sent = keel__now_mono_ns();
    for (int p = from; p < sent; p++) {
        keel_status st;
        if (first != KEEL_OK) {
            first = give_up_push(w, p, first, q->local_step);
            continue;
        }
        st = take_push_reply(w, q, p, aggregated);
        if (st != KEEL_OK && first == KEEL_OK)
            first = st;
    }
    return first;
}

/* A test's pause between the phases of an elastic step: with the
 * variable env set to "STEP:FILE", the replica writes the step into FILE
 * at that point of step STEP and waits until the file is gone (at most
 * TEST_PAUSE_MAX_MS): a test kills it there. Unset (every real job),
 * nothing. */
#define TEST_PAUSE_MAX_MS 60000

static void
test_pause(const char *env, int64_t step)
{
    const char *v = getenv(env), *path;
    struct timespec ts = { 0, 10 * 1000000 };
    char *end;
    FILE *f;
    if (v == NULL || strtoll(v, &end, 10) != step || *end != ':')
        return;
    path = end + 1;
    if ((f = fopen(path, "w")) == NULL)
        return;
    fprintf(f, "%lld\n", (long long)step);
    fclose(f);
    keel__log(KEEL_LOG_INFO, "paused at step %lld (%s) until %s is "
              "removed", (long long)step, env, path);
    for (int ms = 0; ms < TEST_PAUSE_MAX_MS && access(path, F_OK) == 0;
         ms += 10)
        nanosleep(&ts, NULL);
}

/* Elastic sync with several ps: the step's COMMIT to follower p (ps 0
 * applied the step under membership epoch e; names only): p applies its
 * prepared step and answers with the new values of its variables. */
static keel_status
commit_follower(keel_cluster_backend *w, const push_req *q, int p,
                uint32_t e)
{
    keel__wire_header h;
    keel__wire_msg r;
    char what[64];
    size_t n;
    keel_status st;
    int64_t t;
    keel__worker_shard_outs(w, q->vs, p, 0, 0, &n);
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_COMMIT;
    h.flags = KEEL_WIRE_F_NAMES_ONLY;
    h.peer_generation = w->ps_gen[p];
    h.global_step = q->local_step;
    h.arg = e;
    snprintf(what, sizeof what, "the commit of step %lld",
             (long long)q->local_step);
    st = keel__worker_call_ps(w, p, &h, w->outs, n, 0, what, q->vs, 0, &r);
    if (st == KEEL_OK && r.h.generation != w->ps_gen[p])
        st = keel__worker_restarted(w, p, &r);
    t = keel__now_mono_ns();
    if (st == KEEL_OK)
        st = keel__worker_take_values(q->vs, &r);
    *q->t_copy += keel__now_mono_ns() - t;
    keel__wire_msg_clear(&r);
    return st;
}

/* Elastic sync with several ps: a step applied on every ps or on none,
 * with the same division of the leaves. The push goes to the other ps
 * (followers) first; each answers "prepared" once the step's pushes make
 * one division (it waits for the other replicas there, or gives up when
 * ps 0's heartbeats tell a newer epoch: keel__worker_wait_reply). Then to
 * ps 0, which applies the step once every live replica's push came (so
 * every follower holds the step prepared under that epoch) and answers
 * with the values, or refuses the push (a replica dropped: nothing was
 * applied anywhere, the step is computed again). Last the COMMIT to each
 * follower: it applies its prepared step (the first COMMIT does) and
 * answers with its values. A replica killed between the phases leaves
 * every ps able to go on: before ps 0 applied, ps 0 drops it and the
 * followers adopt the new division; after, the other replicas commit. */
static keel_status
push_round_elastic(keel_cluster_backend *w, const push_req *q)
{
    keel_status first;
    int aggregated = 0;
    uint32_t e = KEEL__MEMBERSHIP_EPOCH(w->membership);
    if ((first = push_range(w, q, 1, w->n_ps, &aggregated)) != KEEL_OK)
        return first;
    test_pause("KEEL_TEST_PAUSE_ELASTIC_BEFORE_PS0", q->local_step);
    if ((first = push_range(w, q, 0, 1, &aggregated)) != KEEL_OK)
        return first;
    test_pause("KEEL_TEST_PAUSE_ELASTIC_BEFORE_COMMIT", q->local_step);
    for (int p = 1; p < w->n_ps && first == KEEL_OK; p++)
        first = commit_follower(w, q, p, e);
    return first;
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
    keel_status first;
    int aggregated = 0;
    if (w->o.in.elastic && w->n_ps > 1 && q->mean == NULL)
        return push_round_elastic(w, q);
    if (w->o.in.elastic)
        test_pause("KEEL_TEST_PAUSE_ELASTIC_BEFORE_PS0", q->local_step);
    first = push_range(w, q, 0, w->n_ps, &aggregated);
    if (first == KEEL_OK && aggregated > 0)
        first = aggregated == w->n_ps
            ? chief_commit(w, q->vs, q->mean, q->local_step, q->new_step)
            : keel__fail(KEEL_EABORTED, "step %lld: %d of %d ps sent the "
                         "mean gradient for the chief's update",
                         (long long)q->local_step, aggregated, w->n_ps);
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
        keel__worker_shard_outs(w, vs, p, 0, 0, &n);
        if (n == 0)
            continue;
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_PULL;
        h.flags = KEEL_WIRE_F_NAMES_ONLY;
        st = keel__worker_call_ps(w, p, &h, w->outs, n, 0, "pull", NULL, 0,
                                  &r);
        if (st == KEEL_OK && r.h.generation != w->ps_gen[p])
            st = keel__worker_restarted(w, p, &r);
        if (st == KEEL_OK)
            st = into == KEEL__ALGO_INTO_CENTER
                ? take_center(center, vs, &r)
                : keel__worker_take_values(vs, &r);
        if ((st = keel__worker_end_reply(&r, p, st, new_step)) != KEEL_OK)
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

keel_status
keel__worker_apply(void *ctx, keel_vars *vs, keel_grads *grads,
                   int64_t global_step)
{
    keel_cluster_backend *w = ctx;
    int64_t new_step = global_step;
    keel_status first;
    int64_t t_start = keel__now_mono_ns(), t_sent, t_copy = 0;
    keel_grads *one = grads;
    int sparse = 0;
    /* gradient rows: pushed as rows, or added into the dense gradients
     * (worker_sparse.c) */
    if ((first = keel__worker_sparse_prepare(w, grads, &sparse)) != KEEL_OK)
        return first;
    w->step_bytes = 0;
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
        /* the ps weighs each replica's mean gradient by its examples */
        .examples = keel_grads_examples(grads),
        /* micro-batch / tree stores: pieces of the global batch's mean */
        .pieces = w->micro != NULL,
        .sparse = sparse,
        .into = KEEL__ALGO_INTO_VARS, .center = NULL,
        .mean = w->is_chief && w->o.in.chief_applies ? grads : NULL,
        /* sync: the step's metric sums go to ps 0, which answers with
         * every replica's */
        .metrics = w->is_sync && keel__grads_metrics(grads)->n > 0
            ? keel__grads_metrics(grads) : NULL,
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
        w->push_bytes += w->step_bytes;
        w->pull_bytes += w->step_pull_bytes;
    }
    w->step_pull_bytes = 0;     /* the next step's row pulls count anew */
    w->last_apply_end_ns = keel__now_mono_ns();
    keel_vars_set_global_step(vs, new_step);
    w->last_step_seen = new_step;
    return KEEL_OK;
}
