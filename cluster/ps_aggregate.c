/* ps_aggregate.c - a sync step's update from the held pushes: its
 * tables (allocated once), the example-weighted mean of the replicas'
 * gradients, the sum along the reduction tree or of a rule's commits,
 * applied by the ps or handed to the chief (AGGREGATE, then its COMMIT),
 * and the tokens that answer the held pushes; the step's timing. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "ps_int.h"

/* The tree nodes covering each replica's leaves of L (elastic: of each
 * live replica's, by position, keel__ps_members_plan). */
keel_status
keel__ps_tree_plan(keel__ps *ps, int64_t L)
{
    int S = ps->n_slots;
    int most = ps->elastic ? (L < S ? (int)L : S) : ps->total_replicas;
    size_t nv = keel_vars_count(ps->vars);
    if ((!ps->elastic && L % ps->total_replicas != 0) ||
        L > (int64_t)1 << 40 || L < 1)
        return keel__fail(KEEL_EINVAL, "ps %d: reduce_leaves %lld is not a "
                          "multiple of the %d replicas up to 2^40",
                          ps->task_index, (long long)L, ps->total_replicas);
    ps->tcap = most * (2 * KEEL__TREE_MAX_DEPTH);
    ps->tnodes = calloc((size_t)ps->tcap, sizeof *ps->tnodes);
    ps->tfirst = calloc((size_t)S, sizeof *ps->tfirst);
    ps->tcount = calloc((size_t)S, sizeof *ps->tcount);
    if (ps->tnodes == NULL || ps->tfirst == NULL || ps->tcount == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: reduction plan");
    ps->leaves = L;
    /* tree_aggregate's tables, once for the ps's fixed variables: a step
     * allocates nothing */
    ps->tparts = calloc(nv * (size_t)ps->tcap + 1, sizeof *ps->tparts);
    ps->tcnt = calloc(nv * (size_t)S + 1, sizeof *ps->tcnt);
    if (ps->tparts == NULL || ps->tcnt == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: reduction tables of %zu "
                          "variables", nv);
    return keel__ps_members_plan(ps);
}

/* weighted_mean's lists of gradients and weights, and the double sums
 * of its sequential form, one per trainable float of the store (a rule's
 * ps sums its commits and an async ps applies each push: neither needs
 * them). */
static keel_status
alloc_weighted(keel__ps *ps)
{
    size_t nv = keel_vars_count(ps->vars), total = 0;
    if (ps->rule != NULL || !ps->sync)
        return KEEL_OK;
    ps->doff = calloc(nv ? nv : 1, sizeof *ps->doff);
    if (ps->doff == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: aggregation of %zu variables",
                          nv);
    for (size_t k = 0; k < nv; k++) {
        keel_tensor *t = keel_grads_at(ps->acc, k);
        ps->doff[k] = total;
        total += t != NULL ? t->count : 0;
    }
    ps->dacc = malloc((total ? total : 1) * sizeof *ps->dacc);
    ps->wsrc = calloc((nv ? nv : 1) * (size_t)ps->total_replicas,
                      sizeof *ps->wsrc);
    ps->wts = calloc((nv ? nv : 1) * (size_t)ps->total_replicas,
                     sizeof *ps->wts);
    ps->wcnt = calloc(nv ? nv : 1, sizeof *ps->wcnt);
    if (ps->dacc == NULL || ps->wsrc == NULL || ps->wts == NULL ||
        ps->wcnt == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: weighted sums of %zu floats",
                          total);
    return KEEL_OK;
}

/* The real server's sync tables, once: a sync step allocates nothing. */
keel_status
keel__ps_alloc_aggregation(keel__ps *ps)
{
    keel_status st;
    ps->pending = calloc((size_t)ps->n_slots, sizeof *ps->pending);
    if (ps->pending == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %d pending pushes",
                          ps->n_slots);
    for (int i = 0; i < ps->n_slots; i++)
        keel__wire_msg_init(&ps->pending[i].msg);
    if ((st = keel_grads_new(ps->vars, &ps->acc)) != KEEL_OK)
        return st;
    ps->all = calloc(ps->n_pins ? ps->n_pins : 1, sizeof *ps->all);
    ps->have = calloc(ps->n_pins ? ps->n_pins : 1, 1);
    if (ps->all == NULL || ps->have == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: aggregation of %zu variables",
                          ps->n_pins);
    for (size_t k = 0; k < ps->n_pins; k++)
        ps->all[k] = keel_vars_at(ps->vars, k);
    return alloc_weighted(ps);
}

void
keel__ps_log_timing(const keel__ps *ps)
{
    double n = (double)ps->timed_steps;
    if (ps->timed_steps == 0)
        return;
    keel__log(KEEL_LOG_INFO, "ps %d: per sync step (%ld steps, ms): idle "
              "%.3f (replicas computing), spread %.3f (first to last "
              "replica's gradient), aggregate %.3f (sum, apply, replies)",
              ps->task_index, ps->timed_steps, (double)ps->idle_ns / n / 1e6,
              (double)ps->spread_ns / n / 1e6,
              (double)ps->aggregate_ns / n / 1e6);
}

/* sum * total / fresh, each element rounded once (double inside: the
 * product of a float and a small count is exact there). */
static void
mean_of_shares(keel_tensor *sum, int total, int fresh)
{
    double f = (double)total;
    for (size_t i = 0; i < sum->count; i++)
        sum->data[i] = (float)((double)sum->data[i] * f / (double)fresh);
}

/* Every replica pushed: add their node sums along the tree into the
 * sums (have[k] for each variable summed). Replica r's tensors of a
 * variable, in message order, are the sums of its nodes left to right. */
static keel_status
tree_aggregate(keel__ps *ps, unsigned char *have)
{
    size_t nv = keel_vars_count(ps->vars);
    size_t K = (size_t)ps->tk;
    const float **parts = ps->tparts;   /* read only where cnt is full */
    int *cnt = ps->tcnt;
    keel_status st = KEEL_OK;
    size_t S = (size_t)ps->n_slots;     /* elastic: live ones have nodes */
    memset(cnt, 0, nv * S * sizeof *cnt);
    for (int r = 0; r < ps->n_slots && st == KEEL_OK; r++) {
        pending_push *p = &ps->pending[r];
        for (size_t i = 0; p->used && i < p->msg.n; i++) {
            size_t k = keel_var_index(p->vars[i]);
            int *c = &cnt[k * S + (size_t)r];
            if (*c >= ps->tcount[r] || p->msg.tensors[i].t.count !=
                keel_grads_at(ps->acc, k)->count) {
                st = keel__fail(KEEL_EINVAL, "replica %d pushed more than "
                                "its %d node sums of '%s' (or a wrong "
                                "size): do all tasks use the same "
                                "reduce_leaves (%lld)?", r, ps->tcount[r],
                                keel_var_name(p->vars[i]),
                                (long long)ps->leaves);
                break;
            }
            parts[k * K + (size_t)(ps->tfirst[r] + *c)] =
                p->msg.tensors[i].t.data;
            (*c)++;
        }
    }
    for (size_t k = 0; k < nv && st == KEEL_OK; k++) {
        keel_tensor *acc = keel_grads_at(ps->acc, k);
        int any = 0, all = 1;
        for (int r = 0; r < ps->n_slots; r++) {
            int c = cnt[k * S + (size_t)r];
            if (ps->tcount[r] == 0)
                continue;
            if (c != 0 && c != ps->tcount[r]) {
                st = keel__fail(KEEL_EINVAL, "replica %d pushed %d of its "
                                "%d node sums of '%s': do all tasks use "
                                "the same reduce_leaves (%lld)?", r, c,
                                ps->tcount[r],
                                keel_var_name(keel_vars_at(ps->vars, k)),
                                (long long)ps->leaves);
                break;
            }
            any |= c != 0;
            all &= c != 0;
        }
        if (st == KEEL_OK && any && !all)
            st = keel__fail(KEEL_EINVAL, "a replica pushed no gradient of "
                            "'%s' while others did",
                            keel_var_name(keel_vars_at(ps->vars, k)));
        if (st != KEEL_OK || !any)
            continue;
        st = keel__tree_sum(ps->leaves, ps->tnodes, parts + k * K, (int)K,
                            acc->data, 0, acc->count);
        have[k] = 1;
    }
    return st;
}

/* Chief applies: the step's mean gradients (acc of the variables that
 * have one) to the chief's held push, which is then forgotten (the other
 * replicas' stay held until the COMMIT). Copied, not pinned: acc is
 * rewritten by the next step. */
static keel_status
send_aggregate(keel__ps *ps, keel_var *const *all, const unsigned char *have,
               size_t nv)
{
    pending_push *p = &ps->pending[0];
    keel__wire_header h;
    keel__wire_out *outs = calloc(nv ? nv : 1, sizeof *outs);
    size_t n = 0;
    keel_status st;
    if (outs == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: mean of %zu gradients", nv);
    for (size_t k = 0; k < nv; k++)
        if (have[k]) {
            outs[n].name = keel_var_name(all[k]);
            outs[n].t = keel_grads_at(ps->acc, k);
            n++;
        }
    keel__ps_reply_header(ps, &p->msg, &h, KEEL_MSG_AGGREGATE, 0);
    h.local_step = (int64_t)ps->chief_generation;
    st = keel__wire_send(ps->sock, &p->msg.identity, &h, outs, n, NULL,
                         NULL);
    free(outs);
    keel__wire_msg_clear(&p->msg);
    free(p->vars);
    p->vars = NULL;
    p->used = 0;
    return st;
}

static keel_status follower_commit(keel__ps *ps, keel__wire_msg *req);
static keel_status aggregate_now(keel__ps *ps);

/* The chief's COMMIT of the step awaiting it: take the new values of the
 * variables and slots it names (checked first: a bad COMMIT changes
 * nothing), step + 1, answer every held push with the new values (their
 * sync token) and the COMMIT with the new step. */
keel_status
keel__ps_real_commit(keel__ps *ps, keel__wire_msg *req)
{
    int64_t step = keel_vars_global_step(ps->vars);
    keel_var **vars;
    keel_tensor **ts;
    keel_status st = KEEL_OK;
    if (KEEL__PS_FOLLOWS(ps))           /* a replica's */
        return follower_commit(ps, req);
    if (!ps->awaiting_commit)
        return keel__fail(KEEL_ESTATE, "COMMIT at step %lld: no step of ps "
                          "%d awaits the chief's update", (long long)
                          req->h.global_step, ps->task_index);
    if (req->h.global_step != step)
        return keel__fail(KEEL_EINVAL, "COMMIT for step %lld, but ps %d is "
                          "at step %lld", (long long)req->h.global_step,
                          ps->task_index, (long long)step);
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY)
        return keel__fail(KEEL_ECORRUPT, "COMMIT without data");
    if ((st = keel__ps_resolve_all(ps, req, "COMMIT", 0, &vars, &ts)) !=
        KEEL_OK)
        return st;
    {
        for (size_t i = 0; i < req->n; i++)
            memcpy(ts[i]->data, req->tensors[i].t.data,
                   ts[i]->count * sizeof(float));
        keel_vars_set_global_step(ps->vars, step + 1);
        ps->applied += ps->commit_fresh;
        keel__ps_push_budget_step(ps);
        ps->awaiting_commit = 0;
        keel__ps_release_pending(ps, KEEL_OK);
        st = keel__ps_send_done(ps, req, KEEL_MSG_COMMIT);
    }
    free(vars);
    free(ts);
    return st;
}

/* Sum the pending gradients into ps->acc in one pass per gradient: the
 * first one of a variable initializes its sum (no separate zeroing pass);
 * the order of the additions, and so every bit, is that of zero +
 * replica 0 + replica 1 + ... have[k] marks the variables summed; the
 * number of gradients summed is returned. */
static int
sum_pending(keel__ps *ps, unsigned char *have)
{
    int fresh = 0;
    for (int r = 0; r < ps->total_replicas; r++) {
        pending_push *p = &ps->pending[r];
        if (!p->used)
            continue;
        fresh++;
        for (size_t i = 0; i < p->msg.n; i++) {
            size_t k = keel_var_index(p->vars[i]);
            keel_tensor *acc = keel_grads_at(ps->acc, k);
            /* numeric/'s vectorized kernels: the first gradient as 0 + g */
            if (have[k])
                keel__add_into(acc->data, p->msg.tensors[i].t.data,
                               acc->count);
            else
                keel__zero_add_into(acc->data, p->msg.tensors[i].t.data,
                                    acc->count);
            have[k] = 1;
        }
    }
    return fresh;
}

/* The examples a held push's gradients are the mean over (0 on the wire:
 * one). */
static int64_t
examples_of(const pending_push *p)
{
    return p->msg.h.examples > 0 ? (int64_t)p->msg.h.examples : 1;
}

/* 1 in *pieces when every held push carries pieces of the step's mean
 * (KEEL_WIRE_F_PIECES: micro-batch stores, added as they are), 0 when none
 * does; KEEL_EINVAL when the replicas mix the two. */
static keel_status
pieces_of(const keel__ps *ps, int *pieces)
{
    int with = 0, without = 0;
    for (int r = 0; r < ps->total_replicas; r++)
        if (ps->pending[r].used) {
            if (ps->pending[r].msg.h.flags & KEEL_WIRE_F_PIECES)
                with++;
            else
                without++;
        }
    *pieces = with > 0;
    if (with > 0 && without > 0)
        return keel__fail(KEEL_EINVAL, "ps %d: %d replicas pushed "
                          "micro-batch pieces and %d their mean gradients "
                          "in one step (set micro-batches on every replica "
                          "or on none)", ps->task_index, with, without);
    return KEEL_OK;
}

/* weighted_mean's arithmetic one gradient at a time over the double sums
 * in dacc: for a step in which some variable has more gradients than
 * there are replicas (a push naming it twice), which the tables of
 * weighted_mean do not hold. */
static int
weighted_mean_seq(keel__ps *ps, unsigned char *have)
{
    int fresh = 0;
    double total = 0;
    for (int r = 0; r < ps->total_replicas; r++) {
        pending_push *p = &ps->pending[r];
        double w;
        if (!p->used)
            continue;
        fresh++;
        w = (double)examples_of(p);
        total += w;
        for (size_t i = 0; i < p->msg.n; i++) {
            size_t k = keel_var_index(p->vars[i]);
            double *d = ps->dacc + ps->doff[k];
            const float *g = p->msg.tensors[i].t.data;
            size_t n = keel_grads_at(ps->acc, k)->count;
            if (have[k])
                for (size_t e = 0; e < n; e++)
                    d[e] += w * (double)g[e];
            else
                for (size_t e = 0; e < n; e++)
                    d[e] = w * (double)g[e];
            have[k] = 1;
        }
    }
    for (size_t k = 0; k < ps->n_pins; k++) {
        keel_tensor *acc;
        const double *d = ps->dacc + ps->doff[k];
        if (!have[k])
            continue;
        acc = keel_grads_at(ps->acc, k);
        for (size_t e = 0; e < acc->count; e++)
            acc->data[e] = (float)(d[e] / total);
    }
    return fresh;
}

/* Gradient rules: each fresh replica pushed the mean gradient over its own
 * examples (its micro-batch stores add up to it). acc becomes the mean
 * over every example aggregated: sum_r n_r g_r / sum_r n_r, accumulated
 * in double in ascending replica order (n_r g_r is exact there) and
 * rounded once, so R replicas pushing the same gradient give its bits.
 * Each variable's gradients and weights are listed first, then summed in
 * one pass over its sum (keel__weighted_mean_into, numeric/'s vectorized
 * kernel: the same operations per element). have[k] marks the variables
 * summed; the number of pushes is returned. */
static int
weighted_mean(keel__ps *ps, unsigned char *have)
{
    size_t R = (size_t)ps->total_replicas;
    int fresh = 0;
    double total = 0;
    memset(ps->wcnt, 0, ps->n_pins * sizeof *ps->wcnt);
    for (int r = 0; r < ps->total_replicas; r++) {
        pending_push *p = &ps->pending[r];
        double w;
        if (!p->used)
            continue;
        fresh++;
        w = (double)examples_of(p);
        total += w;
        for (size_t i = 0; i < p->msg.n; i++) {
            size_t k = keel_var_index(p->vars[i]);
            if ((size_t)ps->wcnt[k] == R) {
                memset(have, 0, ps->n_pins);
                return weighted_mean_seq(ps, have);
            }
            ps->wsrc[k * R + (size_t)ps->wcnt[k]] = p->msg.tensors[i].t.data;
            ps->wts[k * R + (size_t)ps->wcnt[k]] = w;
            ps->wcnt[k]++;
        }
    }
    for (size_t k = 0; k < ps->n_pins; k++) {
        keel_tensor *acc;
        if (ps->wcnt[k] == 0)
            continue;
        acc = keel_grads_at(ps->acc, k);
        keel__weighted_mean_into(acc->data, ps->wsrc + k * R, ps->wts + k * R,
                                 ps->wcnt[k], total, acc->count);
        have[k] = 1;
    }
    return fresh;
}

/* chief_applies: send the sums (if st, the aggregation's status, is OK)
 * and wait for the chief's commit; on failure answer every pending push
 * with the error. */
static keel_status
hand_to_chief(keel__ps *ps, keel_status st, int fresh)
{
    if (st == KEEL_OK)
        st = send_aggregate(ps, ps->all, ps->have, ps->n_pins);
    if (st == KEEL_OK) {
        ps->awaiting_commit = 1;
        ps->commit_fresh = fresh;
        return KEEL_OK;
    }
    keel__ps_fail_pending(ps, KEEL_EINVAL, keel_last_error());
    return st;
}

/* Apply each summed variable's sum at step: by the algorithm's ps rule,
 * else by the ps's apply callback. */
static keel_status
apply_sums(keel__ps *ps, int64_t step)
{
    keel_status st = KEEL_OK;
    for (size_t k = 0; k < ps->n_pins && st == KEEL_OK; k++)
        if (ps->have[k])
            st = ps->rule != NULL
                ? keel__algo_ps_commit(ps->rule, ps->all[k],
                                       keel_grads_at(ps->acc, k), -1, step)
                : ps->apply(ps->apply_ctx, ps->all[k],
                            keel_grads_at(ps->acc, k), step);
    if (st == KEEL_OK && ps->rule != NULL)
        keel__algo_ps_commit_end(ps->rule, -1);
    return st;
}

/* The steps the pending pushes cover (the first one's, checked when it
 * came; 1 without any). */
static int64_t
pending_covered(const keel__ps *ps)
{
    int64_t covered = 1;
    for (int r = 0; r < ps->n_slots; r++)
        if (ps->pending[r].used) {
            (void)keel__ps_covered_of(&ps->pending[r].msg, &covered);
            break;
        }
    return covered;
}

/* The step's update from the pending pushes: the example-weighted mean of
 * the replicas' gradients (weighted_mean), or with declared pieces their
 * sum along the tree, or a rule's commits summed in ascending replica
 * order; apply, step + 1, answer every pending push (the sync token). */
static keel_status
aggregate(keel__ps *ps)
{
    int64_t step = keel_vars_global_step(ps->vars);
    size_t nv = ps->n_pins;
    unsigned char *have = ps->have;
    keel_status st;
    int fresh = 0, pieces = 0;
    memset(have, 0, nv);
    st = keel__ps_wait_pins(ps, ps->all, nv);
    for (int r = 0; r < ps->n_slots; r++)
        fresh += ps->pending[r].used;
    if (st == KEEL_OK && ps->leaves > 0 && fresh == ps->n_live)
        st = tree_aggregate(ps, have);
    else if (st == KEEL_OK && ps->rule == NULL && ps->leaves == 0 &&
             (st = pieces_of(ps, &pieces)) == KEEL_OK && !pieces)
        fresh = weighted_mean(ps, have);
    else
        fresh = st == KEEL_OK ? sum_pending(ps, have) : 0;
    /* Declared pieces (reduce_leaves, micro-batch stores) and a rule's
     * commits are shares of the step's update: each replica's part of the global batch's mean
     * (its examples' gradients divided by the global batch), or its
     * commit divided by total_replicas. With backup workers only `fresh`
     * shares came; total/fresh makes the sum the mean of those
     * aggregated. Without backups the factor is 1 and the sum's bits
     * stand as they are. Gradient rules already hold the mean. */
    if (st == KEEL_OK && fresh > 0 && fresh != ps->n_live &&
        (ps->rule != NULL || ps->leaves > 0 || pieces))
        for (size_t k = 0; k < nv; k++)
            if (have[k])
                mean_of_shares(keel_grads_at(ps->acc, k), ps->n_live,
                               fresh);
    if (ps->chief_applies)
        return hand_to_chief(ps, st, fresh);
    if (st == KEEL_OK)                  /* gradient rows: ps_sparse.c */
        st = keel__ps_sparse_aggregate(ps, step);
    if (st == KEEL_OK)
        st = apply_sums(ps, step);
    if (st == KEEL_OK) {
        keel_vars_set_global_step(ps->vars, step + pending_covered(ps));
        ps->applied += fresh;
        keel__ps_push_budget_step(ps);
        keel__ps_members_boundary(ps);  /* elastic: joiners, told below */
    }
    keel__ps_release_pending(ps, st);
    return st;
}

/* Sync: aggregate once enough replicas pushed (with the chief's push when
 * it applies), timing the step; an elastic follower's complete step is
 * prepared instead (applied at a replica's COMMIT). */
keel_status
keel__ps_aggregate_when_complete(keel__ps *ps)
{
    if (keel__ps_pending_count(ps) < ps->replicas_to_aggregate ||
        ps->awaiting_commit || ps->prepared ||
        (ps->chief_applies && !ps->pending[0].used))
        return KEEL_OK;
    if (keel__ps_members_follow(ps) != KEEL_OK) {  /* elastic, not ps 0 */
        keel__log(KEEL_LOG_WARN, "%s", keel_last_error());
        return KEEL_OK;
    }
    if (KEEL__PS_FOLLOWS(ps)) {         /* applied at a replica's COMMIT */
        keel__ps_members_prepare(ps);
        return KEEL_OK;
    }
    return aggregate_now(ps);
}

static keel_status
aggregate_now(keel__ps *ps)
{
    int64_t t0, t1;
    keel_status st;
    t0 = keel__now_mono_ns();
    st = aggregate(ps);
    t1 = keel__now_mono_ns();
    if (ps->last_step_end_ns != 0) {    /* the first step starts cold */
        ps->timed_steps++;
        ps->idle_ns += ps->pending_since_ns - ps->last_step_end_ns;
        ps->spread_ns += t0 - ps->pending_since_ns;
        ps->aggregate_ns += t1 - t0;
    }
    ps->last_step_end_ns = t1;
    return st;
}

/* Elastic sync, a follower: a replica's COMMIT of step global_step under
 * membership epoch arg (ps 0 applied it so), names only: the prepared
 * step is applied and the named variables' values answer it, as a
 * PULL's; a COMMIT of the step applied just before gets the values too. */
static keel_status
follower_commit(keel__ps *ps, keel__wire_msg *req)
{
    int64_t step = keel_vars_global_step(ps->vars);
    uint32_t e = req->h.arg;
    keel_status st;
    if (!ps->is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "ps %d holds no state yet "
                          "(restarted? waiting for the chief's INIT)",
                          ps->task_index);
    if (!(req->h.flags & KEEL_WIRE_F_NAMES_ONLY))
        return keel__fail(KEEL_ECORRUPT, "a replica's COMMIT carries names "
                          "only");
    if (req->h.global_step == step) {
        if (!ps->prepared || e != ps->epoch)
            return keel__fail(KEEL_EABORTED, "COMMIT of step %lld under "
                              "membership epoch %u, but ps %d holds %s "
                              "(epoch %u): the step is computed again",
                              (long long)step, e, ps->task_index,
                              ps->prepared ? "the step prepared under "
                              "another division" : "no complete step",
                              ps->epoch);
        if ((st = aggregate_now(ps)) != KEEL_OK)
            return st;
    } else if (req->h.global_step > step || req->h.global_step < step - 1) {
        return keel__fail(KEEL_EABORTED, "COMMIT of step %lld, but ps %d is "
                          "at step %lld", (long long)req->h.global_step,
                          ps->task_index, (long long)step);
    }
    return keel__ps_real_pull(ps, req);
}
