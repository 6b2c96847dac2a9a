/* ps_request.c - what every request handler of the ps shares: the
 * replica a request comes from, its tensors resolved to variables and
 * slots (their pins waited for), and the replies (done, error, the values
 * with a PUSH_ACK, the answers to the held pushes); the calls a serve
 * function answers with. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_int.h"

#define PIN_WAIT_MS 5000

/* The pin of a variable's in-flight replies. */
static keel__wire_pin *
pin_of(keel__ps *ps, const keel_var *v)
{
    size_t i = keel_var_index(v);
    return i < ps->n_pins ? &ps->pins[i] : &ps->pin;
}

/* The training replica a request comes from (chief 0, worker i i+1, or
 * worker i i without a chief), or -1. Sync: the replicas of the spec the
 * ps started with; async: any up to n_slots (workers that join later). */
int
keel__ps_replica_of(const keel__ps *ps, const keel__wire_header *h)
{
    int r = -1;
    if (h->sender_type == KEEL_TASK_CHIEF)
        r = 0;
    else if (h->sender_type == KEEL_TASK_WORKER &&
             h->sender_index < (uint32_t)ps->n_slots)
        r = (int)h->sender_index + ps->has_chief;
    return r >= 0 && r < ps->n_slots ? r : -1;
}

void
keel__ps_replica_name(const keel__ps *ps, int r, char *buf, size_t size)
{
    if (ps->has_chief && r == 0)
        snprintf(buf, size, "chief");
    else
        snprintf(buf, size, "worker %d", r - ps->has_chief);
}

int
keel__ps_pending_count(const keel__ps *ps)
{
    int k = 0;
    for (int r = 0; ps->pending != NULL && r < ps->n_slots; r++)
        k += ps->pending[r].used;
    return k;
}

void
keel__ps_reply_header(keel__ps *ps, const keel__wire_msg *req,
                      keel__wire_header *h, uint8_t type, uint8_t flags)
{
    memset(h, 0, sizeof *h);
    h->type = type;
    h->flags = flags;
    h->request_id = req ? req->h.request_id : 0;
    h->sender_type = KEEL_TASK_PS;
    h->sender_index = (uint32_t)ps->task_index;
    h->generation = ps->generation;
    h->global_step = keel_vars_global_step(ps->vars);
    h->peer_generation = keel__ps_membership_word(ps, req);
}

/* Elastic sync: ps 0's membership word of a reply to req (0 when not
 * elastic, and from any other ps: ps 0 decides). */
uint64_t
keel__ps_membership_word(keel__ps *ps, const keel__wire_msg *req)
{
    int r, pos1;
    if (!KEEL__PS_DECIDES(ps) || req == NULL)
        return 0;
    r = keel__ps_replica_of(ps, &req->h);
    pos1 = r >= 0 && ps->live[r] ? keel__ps_position(ps, r) + 1 : 0;
    return KEEL__MEMBERSHIP_WORD(ps->epoch, ps->n_live, pos1);
}

/* Elastic sync: the membership changes the chief was not told yet, for a
 * reply to req when it is the chief's (then they count as told), into
 * buf; "" otherwise. */
const char *
keel__ps_take_note(keel__ps *ps, const keel__wire_msg *req, char *buf,
                   size_t size)
{
    buf[0] = '\0';
    if (ps->note[0] == '\0' || keel__ps_replica_of(ps, &req->h) != 0)
        return buf;
    snprintf(buf, size, "%s", ps->note);
    ps->note[0] = '\0';
    return buf;
}

/* Replica r's position among the live replicas (ascending index). */
int
keel__ps_position(const keel__ps *ps, int r)
{
    int p = 0;
    for (int i = 0; i < r; i++)
        p += ps->live[i];
    return p;
}

/* The reply to a request that carries no data back: done, with the global
 * step and the chief's generation (local_step). */
keel_status
keel__ps_send_done(keel__ps *ps, keel__wire_msg *req, uint8_t type)
{
    keel__wire_header h;
    keel__ps_reply_header(ps, req, &h, type, KEEL_WIRE_F_REPLY);
    h.local_step = (int64_t)ps->chief_generation;
    return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0, NULL,
                           NULL);
}

void
keel__ps_send_error(keel__ps *ps, keel__wire_msg *req, keel_status code,
                    const char *text)
{
    keel__wire_header h;
    keel__ps_reply_header(ps, req, &h, KEEL_MSG_ERROR, 0);
    h.arg = (uint32_t)code;
    if (keel__wire_send(ps->sock, &req->identity, &h, NULL, 0, text, NULL)
        != KEEL_OK)
        keel__log(KEEL_LOG_WARN, "ps %d: could not send error reply: %s",
                  ps->task_index, keel_last_error());
}

static keel_status
ensure_seen(keel__ps *ps)
{
    size_t n = keel_vars_count(ps->vars);
    if (ps->seen_size < n) {
        unsigned char *s = realloc(ps->seen, n);
        if (s == NULL)
            return keel__fail(KEEL_ENOMEM, "ps: %zu flags", n);
        ps->seen = s;
        ps->seen_size = n;
    }
    memset(ps->seen, 0, ps->seen_size);
    return KEEL_OK;
}

/* Every tensor of req names a distinct variable of the same shape. */
static keel_status
check_tensors(keel__ps *ps, const keel__wire_msg *req, keel_var **vars)
{
    keel_status st = ensure_seen(ps);
    if (st != KEEL_OK)
        return st;
    for (size_t i = 0; i < req->n; i++) {
        const keel__wire_tensor *wt = &req->tensors[i];
        keel_var *v = keel_vars_find(ps->vars, wt->name);
        keel_tensor *t;
        char a[96], b[96];
        if (v == NULL)
            return keel__fail(KEEL_ENOTFOUND, "no variable '%s' on ps %d",
                              wt->name, ps->task_index);
        if (ps->seen[keel_var_index(v)]++)
            return keel__fail(KEEL_ECORRUPT, "variable '%s' given twice",
                              wt->name);
        t = keel_var_tensor(v);
        if (vars != NULL &&
            !keel_shape_equal(t->ndim, t->shape, wt->t.ndim, wt->t.shape))
            return keel__fail(KEEL_EINVAL, "'%s' has shape %s on ps %d, "
                              "message has %s", wt->name,
                              keel_shape_format(a, sizeof a, t->ndim,
                                                t->shape),
                              ps->task_index,
                              keel_shape_format(b, sizeof b, wt->t.ndim,
                                                wt->t.shape));
        if (vars != NULL)
            vars[i] = v;
    }
    return KEEL_OK;
}

keel_vars *
keel__ps_vars(keel__ps *ps)
{
    return ps->vars;
}

keel__wire_pin *
keel__ps_pin(keel__ps *ps, const keel_var *v)
{
    return pin_of(ps, v);
}

keel_status
keel__ps_check_tensors(keel__ps *ps, const keel__wire_msg *req,
                       keel_var **vars)
{
    return check_tensors(ps, req, vars);
}

keel_status
keel__ps_reply(keel__ps *ps, keel__wire_msg *req, uint8_t type,
               uint8_t flags, const keel__wire_out *outs, size_t n)
{
    keel__wire_header h;
    keel__ps_reply_header(ps, req, &h, type, flags);
    return keel__wire_send(ps->sock, &req->identity, &h, outs, n, NULL,
                           NULL);
}

/* A variable ("dense_1/kernel") or one of its slots ("dense_1/kernel/m"). */
keel_status
keel__ps_resolve(keel__ps *ps, const keel__wire_tensor *wt, int want_shape,
                 keel_var **vout, keel_tensor **tout)
{
    keel_var *v = keel_vars_find(ps->vars, wt->name);
    keel_tensor *t = NULL;
    char a[96], b[96];
    if (v != NULL) {
        t = keel_var_tensor(v);
    } else {
        char base[KEEL_NAME_MAX];
        const char *slash = strrchr(wt->name, '/');
        size_t n = slash ? (size_t)(slash - wt->name) : 0;
        if (slash != NULL && n < sizeof base) {
            memcpy(base, wt->name, n);
            base[n] = '\0';
            v = keel_vars_find(ps->vars, base);
            if (v != NULL)
                t = keel_var_slot(v, slash + 1);
        }
        if (t == NULL)
            return keel__fail(KEEL_ENOTFOUND, "no variable or slot '%s' on "
                              "ps %d", wt->name, ps->task_index);
    }
    if (want_shape &&
        !keel_shape_equal(t->ndim, t->shape, wt->t.ndim, wt->t.shape))
        return keel__fail(KEEL_EINVAL, "'%s' has shape %s on ps %d, message "
                          "has %s", wt->name,
                          keel_shape_format(a, sizeof a, t->ndim, t->shape),
                          ps->task_index,
                          keel_shape_format(b, sizeof b, wt->t.ndim,
                                            wt->t.shape));
    *vout = v;
    *tout = t;
    return KEEL_OK;
}

/* t's buffer handed over to pin when replies in flight still carry it,
 * a copy taking its place: those replies keep the values they were sent
 * with and t may change at once, however long their reader (a frozen
 * worker) leaves them queued. 0 when t is free to change; -1 when its
 * frames must be waited for (no memory for the copy, a buffer t does not
 * own). */
static int
unpin(keel__wire_pin *pin, keel_tensor *t)
{
    size_t bytes;
    float *copy;
    int r;
    if (t == NULL || t->data == NULL)
        return 0;
    bytes = t->count * sizeof(float);
    if (!keel__wire_pin_holds(pin, t->data, bytes))
        return 0;
    if (!t->is_owner || (copy = keel_aligned_alloc(bytes)) == NULL)
        return -1;
    memcpy(copy, t->data, bytes);
    r = keel__wire_pin_hand_over(pin, t->data, bytes, keel_aligned_free);
    if (r == 1)
        t->data = copy;
    else
        keel_aligned_free(copy);
    return r < 0 ? -1 : 0;
}

keel_status
keel__ps_wait_pins(keel__ps *ps, keel_var *const *vars, size_t n)
{
    int64_t deadline = keel__now_mono_ns() + (int64_t)PIN_WAIT_MS * 1000000;
    for (size_t i = 0; i < n; i++) {
        keel__wire_pin *pin = pin_of(ps, vars[i]);
        int64_t left;
        int stuck = unpin(pin, keel_var_tensor(vars[i])) < 0;
        for (size_t s = 0; s < keel_var_slot_count(vars[i]); s++)
            stuck |= unpin(pin, keel_var_slot_at(vars[i], s, NULL)) < 0;
        if (!stuck)
            continue;
        left = deadline - keel__now_mono_ns();
        if (left < 0 ||
            keel__wire_pin_wait(pin, (int)(left / 1000000)) != KEEL_OK)
            return keel__fail(KEEL_EUNAVAILABLE, "ps %d busy: earlier "
                              "replies of '%s' not yet sent after %d ms",
                              ps->task_index, keel_var_name(vars[i]),
                              PIN_WAIT_MS);
    }
    return KEEL_OK;
}

/* The update rule's record of what replica req's sender now holds: the
 * variables among outs (not their slots). */
void
keel__ps_rule_pulled(keel__ps *ps, const keel__wire_msg *req,
                     const keel__wire_out *outs, size_t n)
{
    int replica = keel__ps_replica_of(ps, &req->h);
    if (replica < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        keel_var *v = keel_vars_find(ps->vars, outs[i].name);
        if (v != NULL && outs[i].t == keel_var_tensor(v))
            keel__algo_ps_pulled(ps->rule, v, replica);
    }
    keel__algo_ps_pulled_end(ps->rule, replica);
}

/* How many of a replica's steps a PUSH covers (its header's global_step;
 * 0 from a client that does not say: 1). */
keel_status
keel__ps_covered_of(const keel__wire_msg *req, int64_t *out)
{
    int64_t c = req->h.global_step;
    if (c < 0 || c > KEEL__MAX_COVERED)
        return keel__fail(KEEL_EINVAL, "PUSH covering %lld steps (want "
                          "0..%d)", (long long)c, KEEL__MAX_COVERED);
    *out = c > 0 ? c : 1;
    return KEEL_OK;
}

/* Answer (and forget) every pending push with an ERROR. */
void
keel__ps_fail_pending(keel__ps *ps, keel_status code, const char *why)
{
    for (int r = 0; ps->pending != NULL && r < ps->n_slots; r++) {
        pending_push *p = &ps->pending[r];
        if (!p->used)
            continue;
        if (!p->answered)
            keel__ps_send_error(ps, &p->msg, code, why);
        p->answered = 0;
        keel__wire_msg_clear(&p->msg);
        free(p->vars);
        p->vars = NULL;
        free(p->rows);
        p->rows = NULL;
        p->n_rows = 0;
        p->used = 0;
    }
    if (ps->awaiting_commit)
        keel__log(KEEL_LOG_WARN, "ps %d: step %lld abandoned before the "
                  "chief's commit: %s", ps->task_index,
                  (long long)keel_vars_global_step(ps->vars), why);
    ps->awaiting_commit = 0;
    ps->prepared = 0;
}

/* Every tensor of req resolved (with its shape) into *vars_out and
 * *ts_out (caller frees both), state_only: non-trainable variables only
 * (no weights, no slots); then their pins waited for. On failure nothing
 * is allocated. */
keel_status
keel__ps_resolve_all(keel__ps *ps, const keel__wire_msg *req,
                     const char *what, int state_only, keel_var ***vars_out,
                     keel_tensor ***ts_out)
{
    keel_var **vars = calloc(req->n ? req->n : 1, sizeof *vars);
    keel_tensor **ts = calloc(req->n ? req->n : 1, sizeof *ts);
    keel_status st = KEEL_OK;
    *vars_out = NULL;
    *ts_out = NULL;
    if (vars == NULL || ts == NULL) {
        free(vars);
        free(ts);
        return keel__fail(KEEL_ENOMEM, "ps: %s of %zu tensors", what,
                          req->n);
    }
    for (size_t i = 0; i < req->n && st == KEEL_OK; i++) {
        st = keel__ps_resolve(ps, &req->tensors[i], 1, &vars[i], &ts[i]);
        if (st == KEEL_OK && state_only &&
            (ts[i] != keel_var_tensor(vars[i]) ||
             keel_var_is_trainable(vars[i])))
            st = keel__fail(KEEL_EINVAL, "%s into '%s': only non-trainable "
                            "variables (not weights, not slots)", what,
                            req->tensors[i].name);
    }
    if (st == KEEL_OK)
        st = keel__ps_wait_pins(ps, vars, req->n);
    if (st != KEEL_OK) {
        free(vars);
        free(ts);
        return st;
    }
    *vars_out = vars;
    *ts_out = ts;
    return KEEL_OK;
}

keel_status
keel__ps_send_ack(keel__ps *ps, keel__wire_msg *req, keel_var *const *vars,
                  size_t n)
{
    keel__wire_header h;
    keel_status st;
    keel__wire_out *outs;
    size_t n0 = n;
    char note[sizeof ps->note];
    /* elastic: the chief gets the membership changes it was not told */
    keel__ps_take_note(ps, req, note, sizeof note);
    keel__ps_reply_header(ps, req, &h, KEEL_MSG_PUSH_ACK, 0);
    h.local_step = (int64_t)ps->chief_generation;
    if (!(req->h.flags & KEEL_WIRE_F_WANT_VALUES))
        return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0,
                               note[0] ? note : NULL, NULL);
    outs = calloc(n + 1, sizeof *outs);
    if (outs == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: values of %zu variables", n);
    /* row variables go by rows (PULL_ROWS), never whole */
    for (size_t i = 0, k = 0; i < n0; i++) {
        if (keel_var_flags(vars[i]) & KEEL_VAR_ROWS) {
            n--;
            continue;
        }
        outs[k].name = keel_var_name(vars[i]);
        outs[k].t = keel_var_tensor(vars[i]);
        outs[k].pin = pin_of(ps, vars[i]);
        k++;
    }
    if (ps->rule != NULL)
        keel__ps_rule_pulled(ps, req, outs, n);
    if (ps->has_ack_metrics && (req->h.flags & KEEL_WIRE_F_METRICS)) {
        /* the step's metrics, copied into the frame (no pin) */
        h.flags |= KEEL_WIRE_F_METRICS;
        outs[n].name = KEEL__WIRE_METRICS_NAME;
        outs[n].t = &ps->ack_metrics.t;
        outs[n].pin = NULL;
        n++;
    }
    st = keel__wire_send(ps->sock, &req->identity, &h, outs, n,
                         note[0] ? note : NULL, NULL);
    free(outs);
    return st;
}

/* The metric sums of the step's held pushes, combined in ascending
 * replica order into ps->ack_metrics (has_ack_metrics: some replica sent
 * them; a replica whose metric count differs from the first one's is left
 * out). */
static void
combine_metrics(keel__ps *ps)
{
    keel__metrics m;
    ps->has_ack_metrics = 0;
    m.n = -1;
    for (int r = 0; r < ps->n_slots; r++) {
        const pending_push *p = &ps->pending[r];
        if (!p->used || p->metrics.n == 0)
            continue;
        if (m.n < 0) {
            m.n = p->metrics.n;
            keel__metrics_combine_begin(&m);
        }
        if (p->metrics.n == m.n)
            keel__metrics_combine_add(&m, r, p->metrics.sum,
                                      p->metrics.count);
    }
    if (m.n > 0) {
        keel__wire_metrics_ack(&m, &ps->ack_metrics);
        ps->has_ack_metrics = 1;
    }
}

/* Answer and forget every held push of the step: with the new values
 * (its sync token) after st == KEEL_OK, else with st's error. */
void
keel__ps_release_pending(keel__ps *ps, keel_status st)
{
    if (st == KEEL_OK)
        combine_metrics(ps);
    for (int r = 0; r < ps->n_slots; r++) {
        pending_push *p = &ps->pending[r];
        if (!p->used)
            continue;
        if (p->answered) {
            /* elastic follower: its COMMIT gets the values */
        } else if (st == KEEL_OK) {
            if (keel__ps_send_ack(ps, &p->msg, p->vars,
                                  p->msg.n + p->n_rows) != KEEL_OK)
                keel__log(KEEL_LOG_WARN, "ps %d: token to replica %d not "
                          "sent: %s", ps->task_index, r, keel_last_error());
        } else {
            keel__ps_send_error(ps, &p->msg, KEEL_EINVAL, keel_last_error());
        }
        keel__wire_msg_clear(&p->msg);
        free(p->vars);
        p->vars = NULL;
        free(p->rows);
        p->rows = NULL;
        p->n_rows = 0;
        p->metrics.n = 0;
        p->answered = 0;
        p->used = 0;
    }
    ps->has_ack_metrics = 0;
    ps->prepared = 0;
}
