/* ps_skel.c - a parameter server without an optimizer (ps_skel.h): the
 * serve function of keel__ps_config for the wire tests in check_cluster
 * and bench/cluster_bench. The real server (cluster/ps.c with apply) never
 * sums raw gradients into its variables. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "ps_skel.h"
#include "../numeric/numeric_int.h"

#define PIN_WAIT_MS 5000

static keel_status
skel_pull(keel__ps *ps, keel__wire_msg *req)
{
    keel_vars *vs = keel__ps_vars(ps);
    size_t n = req->n ? req->n : keel_vars_count(vs);
    keel__wire_out *outs;
    keel_status st;
    if (!(req->h.flags & KEEL_WIRE_F_NAMES_ONLY) && req->n > 0)
        return keel__fail(KEEL_ECORRUPT, "PULL must carry names only");
    if ((st = keel__ps_check_tensors(ps, req, NULL)) != KEEL_OK)
        return st;
    outs = calloc(n ? n : 1, sizeof *outs);
    if (outs == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: pull of %zu variables", n);
    for (size_t i = 0; i < n; i++) {
        keel_var *v = req->n ? keel_vars_find(vs, req->tensors[i].name)
                             : keel_vars_at(vs, i);
        outs[i].name = keel_var_name(v);
        outs[i].t = keel_var_tensor(v);
        outs[i].pin = keel__ps_pin(ps, v);
    }
    st = keel__ps_reply(ps, req, KEEL_MSG_PULL_REPLY, 0, outs, n);
    free(outs);
    return st;
}

/* PUSH sums gradients into the variables; INIT assigns values. Checked
 * completely before anything changes. */
static keel_status
skel_update(keel__ps *ps, keel__wire_msg *req, int is_init)
{
    keel_vars *vs = keel__ps_vars(ps);
    keel_var **vars;
    keel_status st;
    uint8_t type = is_init ? KEEL_MSG_INIT : KEEL_MSG_PUSH_ACK;
    uint8_t flags = is_init ? KEEL_WIRE_F_REPLY : 0;
    int64_t deadline = keel__now_mono_ns() + (int64_t)PIN_WAIT_MS * 1000000;
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY)
        return keel__fail(KEEL_ECORRUPT, "%s without data",
                          is_init ? "INIT" : "PUSH");
    vars = calloc(req->n ? req->n : 1, sizeof *vars);
    if (vars == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %zu updates", req->n);
    if ((st = keel__ps_check_tensors(ps, req, vars)) != KEEL_OK)
        goto out;
    /* Replies in flight read these variables: let them finish (only
     * these: other variables' replies may still be on the wire). */
    for (size_t i = 0; i < req->n; i++) {
        int64_t left = deadline - keel__now_mono_ns();
        if (left < 0 ||
            keel__wire_pin_wait(keel__ps_pin(ps, vars[i]),
                                (int)(left / 1000000)) != KEEL_OK) {
            st = keel__fail(KEEL_EUNAVAILABLE, "ps busy: earlier replies "
                            "of '%s' not yet sent after %d ms",
                            keel_var_name(vars[i]), PIN_WAIT_MS);
            goto out;
        }
    }
    for (size_t i = 0; i < req->n; i++) {
        keel_tensor *t = keel_var_tensor(vars[i]);
        const float *g = req->tensors[i].t.data;
        if (is_init) {
            memcpy(t->data, g, t->count * sizeof(float));
            keel_var_set_initialized(vars[i], 1);
        } else {
            /* numeric/'s vectorized kernel (elementwise: the same bits) */
            keel__add_into(t->data, g, t->count);
        }
    }
    if (is_init && req->h.global_step > 0)
        keel_vars_set_global_step(vs, req->h.global_step);
    else if (!is_init && req->h.arg == 0)   /* the step's last part */
        keel_vars_set_global_step(vs, keel_vars_global_step(vs) + 1);
    if (!is_init && (req->h.flags & KEEL_WIRE_F_WANT_VALUES)) {
        keel__wire_out *outs = calloc(req->n ? req->n : 1, sizeof *outs);
        if (outs == NULL) {
            st = keel__fail(KEEL_ENOMEM, "ps: values of %zu variables",
                            req->n);
            goto out;
        }
        for (size_t i = 0; i < req->n; i++) {
            outs[i].name = keel_var_name(vars[i]);
            outs[i].t = keel_var_tensor(vars[i]);
            outs[i].pin = keel__ps_pin(ps, vars[i]);
        }
        st = keel__ps_reply(ps, req, type, flags, outs, req->n);
        free(outs);
        goto out;
    }
    st = keel__ps_reply(ps, req, type, flags, NULL, 0);
out:
    free(vars);
    return st;
}


keel_status
ps_skel_serve(void *ctx, keel__ps *ps, keel__wire_msg *req)
{
    (void)ctx;
    switch (req->h.type) {
    case KEEL_MSG_PULL:
        return skel_pull(ps, req);
    case KEEL_MSG_PUSH:
        return skel_update(ps, req, 0);
    case KEEL_MSG_INIT:
        return skel_update(ps, req, 1);
    case KEEL_MSG_HELLO:
        return keel__ps_reply(ps, req, KEEL_MSG_READY, 0, NULL, 0);
    default:
        return keel__fail(KEEL_EINVAL, "message type %u is not served by "
                          "this ps", req->h.type);
    }
}
