/* ps_values.c - the ps's values: the chief's INIT (and the HELLOs that
 * wait for it: readiness), PULL, and MIX of non-trainable variables. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "ps_int.h"

keel_status
keel__ps_real_pull(keel__ps *ps, keel__wire_msg *req)
{
    size_t n = req->n ? req->n : keel_vars_count(ps->vars);
    keel__wire_out *outs;
    keel__wire_header h;
    keel_status st = KEEL_OK;
    if (!ps->is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "ps %d holds no state yet "
                          "(waiting for the chief's INIT)", ps->task_index);
    if (!(req->h.flags & KEEL_WIRE_F_NAMES_ONLY) && req->n > 0)
        return keel__fail(KEEL_ECORRUPT, "PULL must carry names only");
    outs = calloc(n ? n : 1, sizeof *outs);
    if (outs == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: pull of %zu tensors", n);
    for (size_t i = 0; i < n && st == KEEL_OK; i++) {
        keel_var *v;
        keel_tensor *t;
        if (req->n) {
            st = keel__ps_resolve(ps, &req->tensors[i], 0, &v, &t);
            outs[i].name = req->tensors[i].name;
        } else {
            v = keel_vars_at(ps->vars, i);
            t = keel_var_tensor(v);
            outs[i].name = keel_var_name(v);
        }
        if (st == KEEL_OK) {
            outs[i].t = t;
            outs[i].pin = keel__ps_pin(ps, v);
        }
    }
    if (st == KEEL_OK && ps->rule != NULL)
        keel__ps_rule_pulled(ps, req, outs, n);
    if (st == KEEL_OK) {
        keel__ps_reply_header(ps, req, &h, KEEL_MSG_PULL_REPLY, 0);
        st = keel__wire_send(ps->sock, &req->identity, &h, outs, n, NULL,
                             NULL);
    }
    free(outs);
    return st;
}

void
keel__ps_answer_waiters(keel__ps *ps)
{
    for (int i = 0; i < ps->n_waiters; i++) {
        keel__wire_header h;
        keel__wire_msg fake;
        keel__wire_msg_init(&fake);
        fake.h.request_id = ps->waiters[i].request_id;
        fake.h.type = KEEL_MSG_HELLO;   /* the membership told, elastic */
        fake.h.sender_type = ps->waiters[i].sender_type;
        fake.h.sender_index = ps->waiters[i].sender_index;
        keel__ps_reply_header(ps, &fake, &h, KEEL_MSG_READY, 0);
        h.arg = (uint32_t)ps->is_ready;
        if (keel__wire_send(ps->sock, &ps->waiters[i].identity, &h, NULL, 0,
                            NULL, NULL) != KEEL_OK)
            keel__log(KEEL_LOG_WARN, "ps %d: readiness notice not sent: %s",
                      ps->task_index, keel_last_error());
        zmq_msg_close(&ps->waiters[i].identity);
        keel__wire_msg_clear(&fake);
    }
    ps->n_waiters = 0;
}

/* INIT's global step: 0..KEEL__MAX_GLOBAL_STEP (the step counter never
 * wraps, whatever a peer sends). */
static keel_status
check_init_step(const keel__wire_msg *req)
{
    if (req->h.global_step < 0 || req->h.global_step > KEEL__MAX_GLOBAL_STEP)
        return keel__fail(KEEL_EINVAL, "INIT with global step %lld (must be "
                          "0..%lld)", (long long)req->h.global_step,
                          (long long)KEEL__MAX_GLOBAL_STEP);
    return KEEL_OK;
}

/* The last part of the chief's INIT came: the ps is ready at its step. */
static void
init_complete(keel__ps *ps, const keel__wire_msg *req)
{
    /* Pending gradients were computed on the state just replaced (a new
     * chief, or a rollback after another ps was lost). */
    keel__ps_fail_pending(ps, KEEL_EABORTED, "the chief (re)initialized "
                          "this ps; wait for readiness again");
    keel_vars_set_global_step(ps->vars, req->h.global_step);
    if (ps->rule != NULL) {
        /* every replica pulls again; the chief holds these values */
        int chief = keel__ps_replica_of(ps, &req->h);
        keel__algo_ps_reset(ps->rule);
        for (size_t k = 0; chief >= 0 && k < keel_vars_count(ps->vars); k++)
            keel__algo_ps_pulled(ps->rule, keel_vars_at(ps->vars, k), chief);
    }
    ps->chief_generation = req->h.generation;
    ps->is_ready = 1;
    ps->ready_ns = keel__now_mono_ns();
    /* the slot count shows a rule's state (and an optimizer's) came with
     * the chief's values, e.g. from its checkpoint */
    keel__log(KEEL_LOG_INFO, "ps %d: initialized by the chief (generation "
              "%016llx) at step %lld: %zu variables, %zu slot tensors",
              ps->task_index, (unsigned long long)req->h.generation,
              (long long)req->h.global_step, ps->init_vars, ps->init_slots);
    ps->init_vars = 0;
    ps->init_slots = 0;
}

keel_status
keel__ps_real_init(keel__ps *ps, keel__wire_msg *req)
{
    keel_var **vars;
    keel_tensor **ts;
    keel_status st = KEEL_OK;
    if ((st = check_init_step(req)) != KEEL_OK)
        return st;
    if (req->h.sender_type != KEEL_TASK_CHIEF &&
        !(req->h.sender_type == KEEL_TASK_WORKER && !ps->has_chief &&
          req->h.sender_index == 0))
        return keel__fail(KEEL_EINVAL, "INIT from %s %u: only the chief "
                          "initializes parameter servers",
                          keel_task_type_name((keel_task_type)
                                              req->h.sender_type),
                          req->h.sender_index);
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY) {
        /* names a checkpoint instead of carrying values: one part only */
        if (req->h.arg != 0)
            return keel__fail(KEEL_ECORRUPT, "INIT from a checkpoint in "
                              "parts");
        if ((st = keel__ps_read_checkpoint(ps, req)) != KEEL_OK) {
            /* the store may be partly read: not ready until the chief's
             * next INIT (its values, when it falls back to them) */
            ps->init_vars = 0;
            ps->init_slots = 0;
            if (ps->is_ready) {
                keel__ps_fail_pending(ps, KEEL_EABORTED, "the chief's INIT "
                                      "from a checkpoint failed on this "
                                      "ps; wait for readiness again");
                ps->is_ready = 0;
            }
            return st;
        }
        init_complete(ps, req);
        st = keel__ps_send_done(ps, req, KEEL_MSG_INIT);
        keel__ps_answer_waiters(ps);
        return st;
    }
    if ((st = keel__ps_resolve_all(ps, req, "INIT", 0, &vars, &ts)) != KEEL_OK)
        return st;
    for (size_t i = 0; i < req->n; i++) {
        memcpy(ts[i]->data, req->tensors[i].t.data,
               ts[i]->count * sizeof(float));
        if (ts[i] == keel_var_tensor(vars[i])) {
            keel_var_set_initialized(vars[i], 1);
            ps->init_vars++;
        } else {
            ps->init_slots++;
        }
    }
    if (req->h.arg == 0)                /* the last part: ready */
        init_complete(ps, req);
    st = keel__ps_send_done(ps, req, KEEL_MSG_INIT);
    if (ps->is_ready)
        keel__ps_answer_waiters(ps);
    free(vars);
    free(ts);
    return st;
}

/* MIX: a moving average (or, with decay 0, an assignment) of
 * non-trainable variables by a replica (K-FAC's role-split factor
 * statistics and inverses). Everything is checked before anything
 * changes; answered with the global step. */
keel_status
keel__ps_real_mix(keel__ps *ps, keel__wire_msg *req)
{
    keel_var **vars;
    keel_tensor **ts;
    keel_status st = KEEL_OK;
    float d;
    uint32_t bits = req->h.arg;
    memcpy(&d, &bits, sizeof d);
    if (!ps->is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "ps %d holds no state yet "
                          "(waiting for the chief's INIT)", ps->task_index);
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY)
        return keel__fail(KEEL_ECORRUPT, "MIX without data");
    if (!(d >= 0.0f && d < 1.0f))
        return keel__fail(KEEL_EINVAL, "MIX with decay %g (must be in [0, "
                          "1))", (double)d);
    if ((st = keel__ps_resolve_all(ps, req, "MIX", 1, &vars, &ts)) != KEEL_OK)
        return st;
    {
        for (size_t i = 0; i < req->n; i++) {
            float *x = ts[i]->data;
            const float *t = req->tensors[i].t.data;
            if (d == 0.0f)
                memcpy(x, t, ts[i]->count * sizeof(float));
            else
                for (size_t j = 0; j < ts[i]->count; j++)
                    x[j] = d * x[j] + (1.0f - d) * t[j];
        }
        st = keel__ps_send_done(ps, req, KEEL_MSG_MIX);
    }
    free(vars);
    free(ts);
    return st;
}

keel_status
keel__ps_real_hello(keel__ps *ps, keel__wire_msg *req)
{
    keel__wire_header h;
    char text[512];
    if (!ps->is_ready && req->h.arg == 1) {   /* wait for readiness */
        hello_waiter *w;
        if (ps->n_waiters == MAX_WAITERS) {   /* forget the oldest */
            zmq_msg_close(&ps->waiters[0].identity);
            memmove(&ps->waiters[0], &ps->waiters[1],
                    (MAX_WAITERS - 1) * sizeof *ps->waiters);
            ps->n_waiters--;
        }
        w = &ps->waiters[ps->n_waiters++];
        zmq_msg_init(&w->identity);
        zmq_msg_copy(&w->identity, &req->identity);
        w->request_id = req->h.request_id;
        w->sender_type = req->h.sender_type;
        w->sender_index = req->h.sender_index;
        return KEEL_OK;
    }
    keel__ps_reply_header(ps, req, &h, KEEL_MSG_READY, 0);
    h.arg = (uint32_t)ps->is_ready;
    h.local_step = (int64_t)ps->chief_generation;
    keel__ps_status_text(ps, text, sizeof text);
    if (ps->note[0] != '\0' && keel__ps_replica_of(ps, &req->h) == 0) {
        size_t len = strlen(text);       /* elastic: the chief's news */
        char note[sizeof ps->note];
        snprintf(text + len, sizeof text - len, "; %s",
                 keel__ps_take_note(ps, req, note, sizeof note));
    }
    return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0, text,
                           NULL);
}
