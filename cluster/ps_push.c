/* ps_push.c - a PUSH: checked, refused (a step already held, over
 * budget), applied as it comes (async) or held as the replica's token of
 * the sync step, which is aggregated once complete (ps_aggregate.c). */
#include <config.h>

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

#include "ps_int.h"

/* Answer replica's push req with an ERROR (code, text) without reading
 * it further; counted, logged rate-limited. */
static void
refuse_push(keel__ps *ps, keel__wire_msg *req, int replica,
            keel_status code, const char *text)
{
    long held = 0;
    ps->refused_pushes++;
    ps->rejected++;
    if (keel__log_limit_take(&ps->lim_push, keel__now_mono_ns(), &held))
        keel__log(KEEL_LOG_WARN, "ps %d: refused a push of replica %d: %s "
                  "(%ld more pushes refused since the last such line, %ld "
                  "in all)", ps->task_index, replica, text, held,
                  ps->refused_pushes);
    keel__ps_send_error(ps, req, code, text);
}

/* Sync, before anything of req is read: a replica whose push of this step
 * is held (one held push per replica per step: a second one is another
 * sender under its identity, or the replica itself from a new connection
 * after it gave its first up) is refused and the held push stands; a
 * stale push costs budget, and without any it is refused. 1 when req was
 * answered so. */
static int
sync_push_refused(keel__ps *ps, keel__wire_msg *req, int replica,
                  int64_t step)
{
    char name[32], text[512];
    keel__ps_replica_name(ps, replica, name, sizeof name);
    if (ps->pending[replica].used) {
        (void)keel__ps_push_budget_take(ps, replica);
        snprintf(text, sizeof text, "ps %d already holds a push of %s for "
                 "step %lld: a replica pushes once per step; this push is "
                 "refused, the held one stands and is answered when the "
                 "step completes", ps->task_index, name, (long long)step);
        refuse_push(ps, req, replica, KEEL_EABORTED, text);
        return 1;
    }
    if (req->h.local_step < step && !keel__ps_push_budget_take(ps, replica)) {
        snprintf(text, sizeof text, "%s pushed more stale or refused "
                 "gradients than its budget (%d, one more each %d ms and "
                 "each step): refused unread; pull and push for step %lld",
                 name, PUSH_BURST, PUSH_REFILL_MS, (long long)step);
        refuse_push(ps, req, replica, KEEL_EUNAVAILABLE, text);
        return 1;
    }
    return 0;
}

/* Whether ps may take a PUSH req at all: ready, with data, from a training
 * replica (*replica), covering *covered steps. */
static keel_status
check_push(const keel__ps *ps, const keel__wire_msg *req, int *replica,
           int64_t *covered)
{
    if (!ps->is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "ps %d holds no state yet "
                          "(restarted? waiting for the chief's INIT)",
                          ps->task_index);
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY)
        return keel__fail(KEEL_ECORRUPT, "PUSH without data");
    *replica = keel__ps_replica_of(ps, &req->h);
    if (*replica < 0 || (ps->fixed && *replica >= ps->total_replicas))
        return keel__fail(KEEL_EINVAL, "PUSH from %s %u: not a training "
                          "replica of this cluster (%d replicas%s)",
                          keel_task_type_name((keel_task_type)
                                              req->h.sender_type),
                          req->h.sender_index, ps->total_replicas,
                          keel__ps_fixed_why(ps));
    return keel__ps_covered_of(req, covered);
}

/* The trainable variable of each gradient of req into vars. Sync pushes
 * may name a variable once per micro-batch (folded in message order);
 * async ones once. */
static keel_status
resolve_push(keel__ps *ps, const keel__wire_msg *req, keel_var **vars)
{
    keel_status st;
    if (ps->sync) {
        for (size_t i = 0; i < req->n; i++) {
            keel_tensor *t;
            if ((st = keel__ps_resolve(ps, &req->tensors[i], 1, &vars[i],
                                       &t)) != KEEL_OK)
                return st;
            if (t != keel_var_tensor(vars[i]))
                return keel__fail(KEEL_EINVAL, "PUSH to slot '%s'",
                                  req->tensors[i].name);
        }
    } else if ((st = keel__ps_check_tensors(ps, req, vars)) != KEEL_OK) {
        return st;
    }
    for (size_t i = 0; i < req->n; i++)
        if (!keel_var_is_trainable(vars[i]))
            return keel__fail(KEEL_EINVAL, "PUSH to '%s', which is not "
                              "trainable", keel_var_name(vars[i]));
    return KEEL_OK;
}

/* Async: apply replica's push of step as it comes (the optimizer or the
 * rule), step + covered, answer it. */
static keel_status
apply_async(keel__ps *ps, keel__wire_msg *req, keel_var **vars, int replica,
            int64_t step, int64_t covered, const keel__ps_rows *rows,
            size_t n_rows)
{
    keel_status st = keel__ps_wait_pins(ps, vars, req->n + n_rows);
    if (st == KEEL_OK)                  /* gradient rows: ps_sparse.c */
        st = keel__ps_sparse_apply(ps, rows, n_rows, step);
    for (size_t i = 0; i < req->n && st == KEEL_OK; i++)
        st = ps->rule != NULL
            ? keel__algo_ps_commit(ps->rule, vars[i], &req->tensors[i].t,
                                   replica, step)
            : ps->apply(ps->apply_ctx, vars[i], &req->tensors[i].t, step);
    if (st != KEEL_OK)
        return st;
    if (ps->rule != NULL)
        keel__algo_ps_commit_end(ps->rule, replica);
    keel_vars_set_global_step(ps->vars, step + covered);
    ps->applied++;
    return keel__ps_send_ack(ps, req, vars, req->n + n_rows);
}

/* Sync: hold req (and *vars, taken: *vars set NULL) as replica's push of
 * this step, which holds none (sync_push_refused). */
static void
hold_push(keel__ps *ps, keel__wire_msg *req, int replica, keel_var ***vars,
          keel__ps_rows **rows, size_t n_rows)
{
    pending_push *p = &ps->pending[replica];
    assert(!p->used);
    p->msg = *req;
    zmq_msg_init(&p->msg.identity);
    zmq_msg_move(&p->msg.identity, &req->identity);
    keel__wire_msg_init(req);           /* moved: the caller clears nothing */
    p->vars = *vars;
    p->rows = *rows;
    p->n_rows = n_rows;
    *rows = NULL;
    p->metrics = ps->push_metrics;
    if (keel__ps_pending_count(ps) == 0)
        ps->pending_since_ns = keel__now_mono_ns();
    p->used = 1;
    *vars = NULL;
}

/* Sync: a push for an earlier step is dropped (counted, answered), one for
 * a later step refused; one for this step is held until the step is
 * complete. */
static keel_status
take_sync(keel__ps *ps, keel__wire_msg *req, int replica, int64_t step,
          keel_var ***vars, keel__ps_rows **rows, size_t n_rows)
{
    if (req->h.local_step < step) {     /* stale: drop, count, go on */
        long held = 0;
        ps->dropped++;
        /* backup workers make drops routine: a replica's first at once,
         * then a line per interval with the count */
        if (replica < 0 || replica >= ps->n_slots ||
            keel__log_limit_take(&ps->lim_stale[replica],
                                 keel__now_mono_ns(), &held))
            keel__log(KEEL_LOG_INFO, "ps %d: dropped a stale gradient of "
                      "replica %d (computed at step %lld, now %lld; %ld "
                      "more since the last such line, %ld in all)",
                      ps->task_index, replica, (long long)req->h.local_step,
                      (long long)step, held, ps->dropped);
        return keel__ps_send_ack(ps, req, *vars, req->n + n_rows);
    }
    if (ps->job_end[0] != '\0') {
        keel__ps_send_error(ps, req, KEEL_EOUTOFRANGE, ps->job_end);
        return KEEL_OK;
    }
    if (req->h.local_step > step)
        return keel__fail(KEEL_EABORTED, "replica %d pushed for step %lld "
                          "but ps %d is at step %lld (the ps restarted or "
                          "was re-initialized)", replica,
                          (long long)req->h.local_step, ps->task_index,
                          (long long)step);
    hold_push(ps, req, replica, vars, rows, n_rows);
    if (ps->awaiting_commit && replica == 0) {
        /* the chief pushes again instead of committing: it restarted (and
         * joined this live ps) or gave the step up; aggregate anew */
        keel__log(KEEL_LOG_WARN, "ps %d: the chief pushed step %lld again "
                  "before committing it: aggregating it anew",
                  ps->task_index, (long long)step);
        ps->awaiting_commit = 0;
    }
    return keel__ps_aggregate_when_complete(ps);
}

keel_status
keel__ps_real_push(keel__ps *ps, keel__wire_msg *req)
{
    keel_var **vars;
    keel__ps_rows *rows = NULL;
    size_t n_rows = 0;
    keel_status st;
    int64_t step = keel_vars_global_step(ps->vars), covered = 1;
    int replica = -1;
    if ((st = check_push(ps, req, &replica, &covered)) != KEEL_OK)
        return st;
    if (keel__ps_members_push_refused(ps, req, replica))
        return KEEL_OK;
    if (ps->sync && sync_push_refused(ps, req, replica, step))
        return KEEL_OK;
    /* the step's metric sums (sync: combined into the tokens; async: not
     * used) are no gradient */
    if ((st = keel__wire_take_push_metrics(req, &ps->push_metrics))
        != KEEL_OK)
        return st;
    /* gradient rows (ps_sparse.c): checked, taken out of req; their
     * variables follow the dense ones in vars (the ack's values) */
    if ((st = keel__ps_sparse_take(ps, req, replica, &rows, &n_rows))
        != KEEL_OK)
        return st;
    vars = calloc(req->n + n_rows + 1, sizeof *vars);
    if (vars == NULL) {
        free(rows);
        return keel__fail(KEEL_ENOMEM, "ps: %zu updates", req->n);
    }
    st = resolve_push(ps, req, vars);
    for (size_t j = 0; j < n_rows; j++)
        vars[req->n + j] = rows[j].v;
    if (st == KEEL_OK)
        st = keel__ps_sparse_check_dense(ps, rows, n_rows, vars, req->n);
    if (st == KEEL_OK && !ps->sync)     /* async: apply as it comes */
        st = apply_async(ps, req, vars, replica, step, covered, rows,
                         n_rows);
    else if (st == KEEL_OK)
        st = take_sync(ps, req, replica, step, &vars, &rows, n_rows);
    free(vars);
    free(rows);
    return st;
}
