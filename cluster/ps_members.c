/* ps_members.c - the replicas a ps serves: membership (joined, silent
 * past the liveness deadline, LEAVE), the status text naming the ones a
 * sync step lacks, the stall watch, and each replica's budget of pushes
 * that make no progress. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/hooks.h>
#include "ps_int.h"
#include "defaults.h"

/* The replicas tracked for liveness (a replica not heard from yet counts
 * from now) and membership: the spec's (sync, or a rule that admits no
 * joiners), else up to KEEL__CLUSTER_MAX_REPLICAS. */
keel_status
keel__ps_alloc_members(keel__ps *ps)
{
    ps->started_ns = keel__now_mono_ns();
    ps->fixed = (ps->sync && !ps->elastic) ||
        (ps->rule != NULL &&
         !keel_algorithm_admits_joiners(ps->rule->a->c.name));
    ps->n_slots = ps->fixed || ps->total_replicas > KEEL__CLUSTER_MAX_REPLICAS
        ? ps->total_replicas : KEEL__CLUSTER_MAX_REPLICAS;
    ps->last_heard = calloc((size_t)ps->n_slots, sizeof *ps->last_heard);
    ps->member = calloc((size_t)ps->n_slots, 1);
    ps->push_budget = calloc((size_t)ps->n_slots, sizeof *ps->push_budget);
    ps->push_budget_ns = calloc((size_t)ps->n_slots,
                                sizeof *ps->push_budget_ns);
    ps->lim_stale = calloc((size_t)ps->n_slots, sizeof *ps->lim_stale);
    ps->live = calloc((size_t)ps->n_slots, 1);
    ps->carried = calloc((size_t)ps->n_slots, sizeof *ps->carried);
    if (ps->last_heard == NULL || ps->member == NULL ||
        ps->push_budget == NULL || ps->push_budget_ns == NULL ||
        ps->lim_stale == NULL || ps->live == NULL || ps->carried == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %d replicas", ps->total_replicas);
    /* the spec's replicas are the first step's; elastic: epoch 1 */
    for (int r = 0; r < ps->total_replicas && r < ps->n_slots; r++)
        ps->live[r] = 1;
    ps->n_live = ps->total_replicas;
    ps->epoch = ps->elastic ? 1 : 0;
    for (int r = 0; r < ps->n_slots; r++) {
        ps->push_budget[r] = PUSH_BURST;
        ps->push_budget_ns[r] = ps->started_ns;
    }
    return KEEL_OK;
}

/* "applied=A dropped=D ready=R step=S", " refused=P" once pushes were
 * refused (a step already held, over budget) and, while a sync step is
 * partly filled, " waiting=K/N missing=worker 1 (silent 2.5 s),...". */
void
keel__ps_status_text(const keel__ps *ps, char *buf, size_t size)
{
    size_t len;
    int k = keel__ps_pending_count(ps);
    int64_t now = keel__now_mono_ns();
    snprintf(buf, size, "applied=%ld dropped=%ld ready=%d step=%lld",
             ps->applied, ps->dropped, ps->is_ready,
             (long long)keel_vars_global_step(ps->vars));
    if (ps->refused_pushes > 0) {
        len = strlen(buf);
        snprintf(buf + len, size - len, " refused=%ld", ps->refused_pushes);
    }
    if (!ps->sync || k == 0)
        return;
    len = strlen(buf);
    snprintf(buf + len, size - len, " waiting=%.1fs have=%d/%d missing=",
             (double)(now - ps->pending_since_ns) / 1e9, k,
             ps->replicas_to_aggregate);
    for (int r = 0, first = 1; r < ps->n_slots; r++) {
        char name[32];
        int64_t heard = ps->last_heard[r] ? ps->last_heard[r]
                                          : ps->started_ns;
        if (!ps->live[r] || ps->pending[r].used)
            continue;
        keel__ps_replica_name(ps, r, name, sizeof name);
        len = strlen(buf);
        if (len + 1 >= size)
            break;
        snprintf(buf + len, size - len, "%s%s (silent %.1f s)",
                 first ? "" : ",", name, (double)(now - heard) / 1e9);
        first = 0;
    }
}

/* Why a worker beyond the spec is refused ("" when one may join). */
const char *
keel__ps_fixed_why(const keel__ps *ps)
{
    if (!ps->fixed)
        return "";
    if (ps->sync)
        return "; sync mode keeps this fixed count: a worker joins a "
               "running job only in async mode";
    return "; this update rule keeps state per replica the job started "
           "with (dynsgd, adag): a worker joins a running job only under "
           "async, hogwild, downpour, downpour_easy, agn, aeasgd or "
           "aeamsgd";
}

/* A replica was heard from: it joins when it was not a member. */
void
keel__ps_member_heard(keel__ps *ps, int r, int64_t now)
{
    char name[32];
    ps->last_heard[r] = now;
    if (ps->member[r])
        return;
    ps->member[r] = 1;
    ps->n_members++;
    keel__ps_replica_name(ps, r, name, sizeof name);
    keel__log(KEEL_LOG_INFO, "ps %d: %s joined%s; %d live replica%s",
              ps->task_index, name, ps->elastic && !ps->live[r]
              ? " (elastic: it takes part from the next step boundary)"
              : r >= ps->total_replicas
              ? " (async: not in the cluster spec this ps started with; "
                "its pushes are applied)" : "",
              ps->n_members, ps->n_members == 1 ? "" : "s");
}

/* Forget the members silent for longer than the liveness deadline. */
static void
member_sweep(keel__ps *ps, int64_t now)
{
    int64_t dead = (int64_t)ps->dead_after_ms * 1000000;
    if (ps->dead_after_ms <= 0 || ps->n_members == 0)
        return;
    for (int r = 0; r < ps->n_slots; r++) {
        char name[32];
        if (!ps->member[r] || now - ps->last_heard[r] <= dead)
            continue;
        ps->member[r] = 0;
        ps->n_members--;
        keel__ps_replica_name(ps, r, name, sizeof name);
        keel__log(KEEL_LOG_INFO, "ps %d: %s left: silent %.1f s "
                  "(cluster.dead_after_ms = %d); forgotten, %d live "
                  "replica%s", ps->task_index, name,
                  (double)(now - ps->last_heard[r]) / 1e9,
                  ps->dead_after_ms, ps->n_members,
                  ps->n_members == 1 ? "" : "s");
    }
}

keel_status
keel__ps_members_plan(keel__ps *ps)
{
    int M = ps->n_live, p = 0;
    int64_t L = ps->leaves;
    ps->tk = 0;
    for (int r = 0; r < ps->n_slots; r++) {
        int k;
        ps->tcount[r] = 0;
        ps->tfirst[r] = ps->tk;
        if (!ps->live[r])
            continue;
        k = keel__tree_cover(L, (int64_t)p * L / M,
                             (int64_t)(p + 1) * L / M, ps->tnodes + ps->tk,
                             ps->tcap - ps->tk);
        if (k < 1)
            return keel__fail(KEEL_EINTERNAL, "ps %d: cover of replica %d "
                              "(%d of %d live, %lld leaves)", ps->task_index,
                              r, p, M, (long long)L);
        ps->tcount[r] = k;
        ps->tk += k;
        p++;
    }
    return KEEL_OK;
}

/* A change of the live replicas, described by what (" (worker 2 left)"):
 * a new epoch, its plan, logged and kept for the chief (the changes it
 * has not been told yet, joined by "; "). */
static void
membership_changed(keel__ps *ps, int before, const char *what)
{
    char line[256];
    size_t len = strlen(ps->note);
    ps->epoch++;
    ps->replicas_to_aggregate = ps->n_live;
    if (keel__ps_members_plan(ps) != KEEL_OK)
        keel__log(KEEL_LOG_ERROR, "ps %d: %s", ps->task_index,
                  keel_last_error());
    snprintf(line, sizeof line, "membership: %d -> %d replica%s (%s) at "
             "step %lld", before, ps->n_live, ps->n_live == 1 ? "" : "s",
             what, (long long)keel_vars_global_step(ps->vars));
    keel__log(KEEL_LOG_INFO, "ps %d: %s", ps->task_index, line);
    snprintf(ps->note + len, sizeof ps->note - len, "%s%s",
             len > 0 ? "; " : "", line);
}

/* Append "worker 2 left" (or joined) to buf. */
static void
add_change(const keel__ps *ps, int r, const char *how, char *buf,
           size_t size)
{
    char name[32];
    size_t len = strlen(buf);
    keel__ps_replica_name(ps, r, name, sizeof name);
    snprintf(buf + len, size - len, "%s%s %s", len > 0 ? ", " : "", name,
             how);
}

/* Elastic: replica r is no longer live (silent, or its LEAVE): a new
 * division of the leaves, so every push held for the step (computed under
 * the old one) is answered KEEL_EABORTED and computed again. */
static void
members_drop(keel__ps *ps, const unsigned char *gone, const char *what)
{
    int before = ps->n_live;
    char why[512];
    for (int r = 0; r < ps->n_slots; r++)
        if (gone[r] && ps->live[r]) {
            ps->live[r] = 0;
            ps->n_live--;
        }
    membership_changed(ps, before, what);
    snprintf(why, sizeof why, "%s; step %lld is computed again by the "
             "%d live replica%s", ps->note,
             (long long)keel_vars_global_step(ps->vars), ps->n_live,
             ps->n_live == 1 ? "" : "s");
    if (ps->pending != NULL && ps->pending[0].used)
        ps->note[0] = '\0';            /* the chief's push is told below */
    keel__ps_fail_pending(ps, KEEL_EABORTED, why);
}

/* Elastic: the live replicas silent past the liveness deadline leave (a
 * replica not heard from since the ps became ready counts from then);
 * when every one is silent, none leaves. */
static void
elastic_sweep(keel__ps *ps, int64_t now)
{
    int64_t dead = (int64_t)ps->dead_after_ms * 1000000;
    unsigned char gone[KEEL__CLUSTER_MAX_REPLICAS];
    char what[200] = "";
    int n = 0;
    if (!KEEL__PS_DECIDES(ps) || ps->dead_after_ms <= 0 || !ps->is_ready)
        return;
    memset(gone, 0, sizeof gone);
    for (int r = 0; r < ps->n_slots; r++) {
        int64_t heard = ps->last_heard[r] > ps->ready_ns
            ? ps->last_heard[r] : ps->ready_ns;
        if (ps->live[r] && now - heard > dead) {
            gone[r] = 1;
            n++;
            add_change(ps, r, "left", what, sizeof what);
        }
    }
    if (n == 0 || n >= ps->n_live)
        return;
    members_drop(ps, gone, what);
}

void
keel__ps_members_boundary(keel__ps *ps)
{
    char what[200] = "";
    int before = ps->n_live;
    if (!KEEL__PS_DECIDES(ps))
        return;
    for (int r = 0; r < ps->n_slots; r++)
        if (ps->member[r] && !ps->live[r] && ps->n_live < ps->leaves) {
            ps->live[r] = 1;
            ps->n_live++;
            add_change(ps, r, "joined", what, sizeof what);
        }
    if (ps->n_live != before)
        membership_changed(ps, before, what);
}

/* ps 0: refuse replica r's push unless word is the step's, for r. */
static int
decider_refused(keel__ps *ps, keel__wire_msg *req, int r, uint64_t word)
{
    char name[32], text[512], note[sizeof ps->note];
    if (ps->live[r] && KEEL__MEMBERSHIP_EPOCH(word) == ps->epoch &&
        KEEL__MEMBERSHIP_COUNT(word) == ps->n_live &&
        KEEL__MEMBERSHIP_POS1(word) == keel__ps_position(ps, r) + 1)
        return 0;
    keel__ps_take_note(ps, req, note, sizeof note);
    keel__ps_replica_name(ps, r, name, sizeof name);
    if (!ps->live[r])
        snprintf(text, sizeof text, "%s is not a live replica of step %lld "
                 "(%d live): it takes part from the next step boundary",
                 name, (long long)keel_vars_global_step(ps->vars),
                 ps->n_live);
    else
        snprintf(text, sizeof text, "%s%sthe live replicas changed "
                 "(epoch %u) since %s divided its leaves (epoch %u): step "
                 "%lld is computed again", note, note[0] ? "; " : "",
                 ps->epoch, name, KEEL__MEMBERSHIP_EPOCH(word),
                 (long long)keel_vars_global_step(ps->vars));
    keel__ps_send_error(ps, req, KEEL_EABORTED, text);
    return 1;
}

/* Another ps: the step's membership is the newest epoch its pushes
 * carried. Only a push for the step under way tells it: a stale one is
 * dropped and a later one refused by take_sync (a replica that fetched
 * while this ps was behind ps 0), neither changes the step's division. A
 * replica whose push is held in a prepared step is told so again. */
static int
follower_refused(keel__ps *ps, keel__wire_msg *req, int r, uint64_t word)
{
    char name[32], text[512];
    uint32_t e = KEEL__MEMBERSHIP_EPOCH(word);
    int M = KEEL__MEMBERSHIP_COUNT(word), pos1 = KEEL__MEMBERSHIP_POS1(word);
    long long step = (long long)keel_vars_global_step(ps->vars);
    if (req->h.local_step != step)
        return 0;
    if (ps->prepared && ps->pending[r].used && e == ps->epoch &&
        word == ps->carried[r]) {
        (void)keel__ps_send_ack(ps, req, NULL, 0);
        return 1;
    }
    keel__ps_replica_name(ps, r, name, sizeof name);
    if (e == 0 || pos1 == 0 || pos1 > M || M > ps->n_slots ||
        (int64_t)M > ps->leaves) {
        snprintf(text, sizeof text, "%s is not a live replica of step %lld "
                 "(its push carries membership epoch %u, position %d of "
                 "%d): it takes part from the next step boundary ps 0 "
                 "admits it at", name, step, e, pos1 - 1, M);
        keel__ps_send_error(ps, req, KEEL_EABORTED, text);
        return 1;
    }
    if (e < ps->epoch) {
        snprintf(text, sizeof text, "%s divided its leaves by membership "
                 "epoch %u, but ps %d aggregates step %lld under epoch %u "
                 "(ps 0 decided it): step %lld is computed again", name, e,
                 ps->task_index, step, ps->epoch, step);
        keel__ps_send_error(ps, req, KEEL_EABORTED, text);
        return 1;
    }
    if (e > ps->epoch) {
        snprintf(text, sizeof text, "the live replicas changed (epoch %u "
                 "-> %u, %d replica%s, decided by ps 0): step %lld is "
                 "computed again", ps->epoch, e, M, M == 1 ? "" : "s", step);
        keel__log(KEEL_LOG_INFO, "ps %d: membership: %d -> %d replica%s "
                  "(epoch %u -> %u, as ps 0 decided; %s's push told it) at "
                  "step %lld", ps->task_index, ps->n_live, M,
                  M == 1 ? "" : "s", ps->epoch, e, name, step);
        ps->epoch = e;
        ps->n_live = M;
        ps->replicas_to_aggregate = M;
        keel__ps_fail_pending(ps, KEEL_EABORTED, text);
    } else if (M != ps->n_live) {
        snprintf(text, sizeof text, "%s's push carries membership epoch %u "
                 "with %d replicas; the step's other pushes carried %d",
                 name, e, M, ps->n_live);
        keel__ps_send_error(ps, req, KEEL_EINVAL, text);
        return 1;
    }
    ps->carried[r] = word;
    return 0;
}

int
keel__ps_members_push_refused(keel__ps *ps, keel__wire_msg *req, int r)
{
    char text[512];
    uint64_t word;
    keel_status st = keel__wire_take_membership(req, &word);
    if (st != KEEL_OK) {
        keel__ps_send_error(ps, req, st, keel_last_error());
        return 1;
    }
    if (!ps->elastic && !(req->h.flags & KEEL_WIRE_F_MEMBERSHIP))
        return 0;
    if (!ps->elastic || !(req->h.flags & KEEL_WIRE_F_MEMBERSHIP)) {
        snprintf(text, sizeof text, "a push %s a membership word at ps %d, "
                 "which is %selastic: do all tasks use the same "
                 "cluster.elastic?", ps->elastic ? "without" : "with",
                 ps->task_index, ps->elastic ? "" : "not ");
        keel__ps_send_error(ps, req, KEEL_EINVAL, text);
        return 1;
    }
    return ps->task_index == 0 ? decider_refused(ps, req, r, word)
                               : follower_refused(ps, req, r, word);
}

void
keel__ps_members_prepare(keel__ps *ps)
{
    for (int r = 0; r < ps->n_slots; r++) {
        pending_push *p = &ps->pending[r];
        if (!p->used || p->answered)
            continue;
        if (keel__ps_send_ack(ps, &p->msg, NULL, 0) != KEEL_OK)
            keel__log(KEEL_LOG_WARN, "ps %d: \"prepared\" to replica %d "
                      "not sent: %s", ps->task_index, r, keel_last_error());
        p->answered = 1;
    }
    ps->prepared = 1;
}

keel_status
keel__ps_members_follow(keel__ps *ps)
{
    char text[512];
    int n = 0;
    if (!ps->elastic || ps->task_index == 0)
        return KEEL_OK;
    for (int r = 0; r < ps->n_slots; r++) {
        ps->live[r] = ps->pending[r].used;
        n += ps->live[r];
    }
    for (int r = 0, p = 0; r < ps->n_slots && n == ps->n_live; r++) {
        uint64_t w = ps->carried[r];
        if (!ps->live[r])
            continue;
        if (KEEL__MEMBERSHIP_EPOCH(w) != ps->epoch ||
            KEEL__MEMBERSHIP_POS1(w) != p + 1) {
            n = -1;
            break;
        }
        p++;
    }
    if (n == ps->n_live)
        return keel__ps_members_plan(ps);
    snprintf(text, sizeof text, "ps %d: the pushes of step %lld do not "
             "make one division of the leaves among %d live replicas "
             "(membership epoch %u): the step is computed again",
             ps->task_index, (long long)keel_vars_global_step(ps->vars),
             ps->n_live, ps->epoch);
    keel__ps_fail_pending(ps, KEEL_EABORTED, text);
    return keel__fail(KEEL_EABORTED, "%s", text);
}

void
keel__ps_watch(keel__ps *ps, int stall_ms)
{
    int64_t now = keel__now_mono_ns();
    int64_t stall = (int64_t)stall_ms * 1000000;
    char text[512];
    member_sweep(ps, now);
    elastic_sweep(ps, now);
    if (stall_ms <= 0 || !ps->sync || keel__ps_pending_count(ps) == 0 ||
        now - ps->pending_since_ns < stall ||
        now - ps->last_stall_log_ns < stall)
        return;
    ps->last_stall_log_ns = now;
    keel__ps_status_text(ps, text, sizeof text);
    keel__log(KEEL_LOG_WARN, "ps %d: sync step %lld is stalled: %s",
              ps->task_index, (long long)keel_vars_global_step(ps->vars),
              strstr(text, "waiting=") ? strstr(text, "waiting=") : text);
}

int64_t
keel__ps_chief_silent_ms(const keel__ps *ps)
{
    int64_t heard = ps->last_heard[0] ? ps->last_heard[0] : ps->started_ns;
    return (keel__now_mono_ns() - heard) / 1000000;
}

/* Take one from replica r's budget of pushes that make no progress, after
 * regaining what time gave it; 0 when it is empty. */
int
keel__ps_push_budget_take(keel__ps *ps, int r)
{
    int64_t now = keel__now_mono_ns();
    int64_t every = (int64_t)PUSH_REFILL_MS * 1000000;
    int64_t gained = (now - ps->push_budget_ns[r]) / every;
    if (gained > 0) {
        int64_t b = ps->push_budget[r] + gained;
        ps->push_budget[r] = b > PUSH_BURST ? PUSH_BURST : (int)b;
        ps->push_budget_ns[r] += gained * every;
    }
    if (ps->push_budget[r] == 0)
        return 0;
    ps->push_budget[r]--;
    return 1;
}

/* A sync step completed: every replica regains one (a backup worker's
 * stale push each step costs it nothing in the end). */
void
keel__ps_push_budget_step(keel__ps *ps)
{
    for (int r = 0; r < ps->n_slots; r++)
        if (ps->push_budget[r] < PUSH_BURST)
            ps->push_budget[r]++;
}

/* A replica's session ended by itself (a stop request, the end of its
 * input, its program closing it) at the step in the header. A sync step
 * needs every replica (no backups) or a fixed count of them, so a sync job
 * ends there, as TF's never did: the held pushes and every later one are
 * answered KEEL_EOUTOFRANGE with the reason, and the other replicas end
 * their sessions at the step they were at (the chief with its final
 * checkpoint, then SHUTDOWN). Async: the replica is forgotten. */
keel_status
keel__ps_real_leave(keel__ps *ps, keel__wire_msg *req)
{
    int r = keel__ps_replica_of(ps, &req->h);
    char name[32], what[320];
    if (r < 0)
        return keel__fail(KEEL_EINVAL, "LEAVE from a task that is not a "
                          "training replica");
    keel__ps_replica_name(ps, r, name, sizeof name);
    if (ps->pending != NULL && ps->pending[r].used)
        return keel__fail(KEEL_EINVAL, "LEAVE of %s refused: its push for "
                          "step %lld is held here, and a replica leaves only "
                          "between its steps (after its last push was "
                          "answered); the held push stands", name,
                          (long long)keel_vars_global_step(ps->vars));
    snprintf(what, sizeof what, "%s ended its session at step %lld (%s)",
             name, (long long)req->h.global_step,
             req->h.arg <= KEEL_END_SIGNAL
                 ? keel_end_reason_name((keel_end_reason)req->h.arg)
                 : "no reason given");
    if (ps->member[r]) {
        ps->member[r] = 0;
        ps->n_members--;
    }
    if (KEEL__PS_DECIDES(ps) && r != 0 && ps->live[r] && ps->n_live > 1) {
        unsigned char gone[KEEL__CLUSTER_MAX_REPLICAS];
        char how[200] = "";
        memset(gone, 0, sizeof gone);
        gone[r] = 1;
        add_change(ps, r, "left", how, sizeof how);
        keel__log(KEEL_LOG_INFO, "ps %d: %s", ps->task_index, what);
        members_drop(ps, gone, how);
    } else if (ps->elastic && r != 0) {
        keel__log(KEEL_LOG_INFO, "ps %d: %s", ps->task_index, what);
    } else if (ps->sync && ps->job_end[0] == '\0') {
        snprintf(ps->job_end, sizeof ps->job_end, "%s; a sync job stops "
                 "when one of its replicas does: every replica stops at "
                 "its current step", what);
        keel__log(KEEL_LOG_INFO, "ps %d: %s; the sync job stops (at step "
                  "%lld here)", ps->task_index, what,
                  (long long)keel_vars_global_step(ps->vars));
        /* a step the chief is applying (backups) completes first: its
         * COMMIT answers the held pushes, and their next ones end */
        if (!ps->awaiting_commit)
            keel__ps_fail_pending(ps, KEEL_EOUTOFRANGE, ps->job_end);
    } else {
        keel__log(KEEL_LOG_INFO, "ps %d: %s; %d live replica%s",
                  ps->task_index, what, ps->n_members,
                  ps->n_members == 1 ? "" : "s");
    }
    return keel__ps_send_done(ps, req, KEEL_MSG_LEAVE);
}
