/* ps_auth.c - which task may send which request to a ps (the
 * connection's authenticated identity against the header's claim, then
 * the role), and the refusals logged rate-limited. */
#include <config.h>

#include <stdio.h>

#include "ps_int.h"

/* The stale drops and refusals counted but not logged yet, a line each. */
void
keel__ps_log_held(keel__ps *ps)
{
    long n = 0, stale = 0;
    for (int r = 0; ps->lim_stale != NULL && r < ps->n_slots; r++)
        stale += keel__log_limit_flush(&ps->lim_stale[r]);
    if (stale > 0)
        keel__log(KEEL_LOG_INFO, "ps %d: %ld more stale gradients dropped "
                  "since the last such line (%ld in all)", ps->task_index,
                  stale, ps->dropped);
    for (int t = 0; t < KEEL_MSG_TYPE_END; t++)
        n += keel__log_limit_flush(&ps->lim_refused[t]);
    n += keel__log_limit_flush(&ps->lim_rejected);
    n += keel__log_limit_flush(&ps->lim_dropped);
    n += keel__log_limit_flush(&ps->lim_push);
    if (n > 0)
        keel__log(KEEL_LOG_WARN, "ps %d: %ld more refused or dropped "
                  "requests since the last such lines (%ld pushes refused "
                  "in all)", ps->task_index, n, ps->refused_pushes);
}

static const char *
msg_type_name(unsigned type)
{
    static const char *const names[KEEL_MSG_TYPE_END] = {
        "?", "HELLO", "READY", "PULL", "PULL_REPLY", "PUSH", "PUSH_ACK",
        "ERROR", "STEP", "SHUTDOWN", "HEARTBEAT", "TOKEN", "INIT",
        "AGGREGATE", "COMMIT", "MIX", "LEAVE", "SAVE_SHARD", "PULL_ROWS" };
    return type < KEEL_MSG_TYPE_END ? names[type] : "?";
}

/* Which task may send which request. INIT, SHUTDOWN, COMMIT and
 * SAVE_SHARD: the chief (worker
 * 0 in a cluster without one); PUSH: the training replicas, and COMMIT
 * too at an elastic sync ps other than ps 0 (a step ps 0 applied); reads
 * (HELLO, PULL, PULL_ROWS, STEP, HEARTBEAT): every task of the job. */
static int
role_allows(const keel__ps *ps, keel_task_type t, uint32_t index,
            unsigned type)
{
    int chief = t == KEEL_TASK_CHIEF ||
                (t == KEEL_TASK_WORKER && index == 0 && !ps->has_chief);
    switch (type) {
    case KEEL_MSG_COMMIT:
        return chief || (KEEL__PS_FOLLOWS(ps) && t == KEEL_TASK_WORKER);
    case KEEL_MSG_INIT:
    case KEEL_MSG_SHUTDOWN:
    case KEEL_MSG_SAVE_SHARD:
        return chief;
    case KEEL_MSG_PUSH:
    case KEEL_MSG_MIX:
    case KEEL_MSG_LEAVE:
        return t == KEEL_TASK_CHIEF || t == KEEL_TASK_WORKER;
    case KEEL_MSG_HELLO:
    case KEEL_MSG_PULL:
    case KEEL_MSG_PULL_ROWS:
    case KEEL_MSG_STEP:
    case KEEL_MSG_HEARTBEAT:
        return 1;
    default:
        return 0;
    }
}

/* Who sent req: the task its connection authenticated as (the ZAP
 * handler's User-Id), or, without authentication, what its header says;
 * then whether that task may send it. A refusal is logged rate-limited per
 * request type (the first at once, then one line per interval with the
 * count between), the peer's address and name escaped (*logged set: the
 * caller logs nothing more). */
keel_status
keel__ps_authorize(keel__ps *ps, const keel__wire_msg *req, int *logged)
{
    keel_task_type t = (keel_task_type)req->h.sender_type;
    uint32_t index = req->h.sender_index;
    const char *addr = NULL, *user = NULL;
    char claim[KEEL__TASK_NAME_MAX], why[256];
    long held = 0;
    *logged = 0;
    if (req->n_frames > 0) {
        addr = zmq_msg_gets(&req->frames[0], "Peer-Address");
        if (ps->zap != NULL)
            user = zmq_msg_gets(&req->frames[0], "User-Id");
    }
    keel__task_name(t, (int)index, claim, sizeof claim);
    why[0] = '\0';
    if (ps->zap != NULL) {
        keel_task_type ut;
        int ui;
        if (user == NULL || !keel__task_parse(user, &ut, &ui))
            snprintf(why, sizeof why, "its connection has no task "
                     "identity");
        else if (ut != t || (uint32_t)ui != index)
            snprintf(why, sizeof why, "it authenticated as %s but its "
                     "header claims %s", user, claim);
    }
    if (why[0] == '\0' && !role_allows(ps, t, index, req->h.type))
        snprintf(why, sizeof why, "%s may not send %s to a ps", claim,
                 msg_type_name(req->h.type));
    if (why[0] == '\0')
        return KEEL_OK;
    ps->rejected++;
    *logged = 1;
    if (keel__log_limit_take(&ps->lim_refused[req->h.type < KEEL_MSG_TYPE_END
                                              ? req->h.type : 0],
                             keel__now_mono_ns(), &held)) {
        char e_addr[160], e_user[160], e_why[512];
        keel__log(KEEL_LOG_WARN, "ps %d: refused %s from %s (%s%s): %s "
                  "(%ld more %s refused since the last such line)",
                  ps->task_index, msg_type_name(req->h.type),
                  addr ? keel__log_escape(e_addr, sizeof e_addr, addr)
                       : "an unknown address",
                  ps->zap ? "authenticated as " : "unauthenticated, claims ",
                  keel__log_escape(e_user, sizeof e_user,
                                   user ? user : claim),
                  keel__log_escape(e_why, sizeof e_why, why), held,
                  msg_type_name(req->h.type));
    }
    return keel__fail(KEEL_EINVAL, "refused: %s", why);
}
