/* ps_sparse.c - row variables on the ps: a PULL_ROWS answered with the
 * rows asked for (row variables are never sent whole in a push's
 * reply), and a PUSH's gradient rows (KEEL_WIRE_F_ROWS): each pair of
 * an ids tensor and the rows of one variable is checked against the
 * variable (count, range, strictly ascending ids) before anything is
 * applied, taken out of the message, and applied lazily: as it comes
 * (async) or, sync, as the example-weighted mean over the union of the
 * replicas' ids, each row with the dense path's arithmetic. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_int.h"

/* The rows pair starting at req->tensors[i] (ids, then rows) checked
 * against the trainable variable it names, into *out. who names the
 * sender in errors. */
static keel_status
take_pair(keel__ps *ps, const keel__wire_msg *req, size_t i, const char *who,
          keel__ps_rows *out)
{
    const keel__wire_tensor *wi = &req->tensors[i], *wr;
    keel_var *v;
    keel_tensor *vt, *t;
    int64_t rows, n;
    const int64_t *ids;
    keel_status st;
    if (i + 1 >= req->n || strcmp(wi->name, KEEL__WIRE_IDS_NAME) != 0 ||
        wi->t.ndim != 1 || wi->t.data == NULL || wi->t.count % 2 != 0)
        return keel__fail(KEEL_ECORRUPT, "PUSH from %s: tensor %zu ('%s') "
                          "is not an ids tensor followed by rows", who, i,
                          wi->name);
    wr = &req->tensors[i + 1];
    if ((st = keel__ps_resolve(ps, wr, 0, &v, &t)) != KEEL_OK)
        return keel__wrap(st, "PUSH from %s: rows", who);
    vt = keel_var_tensor(v);
    if (t != vt || !keel_var_is_trainable(v) || vt->ndim < 1)
        return keel__fail(KEEL_EINVAL, "PUSH from %s: rows of '%s', which "
                          "is not a trainable variable of rank >= 1", who,
                          wr->name);
    rows = vt->shape[0];
    n = (int64_t)(wi->t.count / 2);
    if (n > rows)
        return keel__fail(KEEL_EINVAL, "PUSH from %s: %lld rows of '%s', "
                          "which has %lld", who, (long long)n, wr->name,
                          (long long)rows);
    if (wr->t.data == NULL || wr->t.ndim != vt->ndim ||
        wr->t.shape[0] != n ||
        (vt->ndim > 1 && !keel_shape_equal(vt->ndim - 1, vt->shape + 1,
                                           wr->t.ndim - 1,
                                           wr->t.shape + 1)))
        return keel__fail(KEEL_EINVAL, "PUSH from %s: the rows of '%s' are "
                          "not %lld rows of its row shape", who, wr->name,
                          (long long)n);
    ids = (const int64_t *)(const void *)wi->t.data;
    for (int64_t k = 0; k < n; k++) {
        if (ids[k] < 0 || ids[k] >= rows)
            return keel__fail(KEEL_EINVAL, "PUSH from %s: id %lld (entry "
                              "%lld) is outside the %lld rows of '%s'", who,
                              (long long)ids[k], (long long)k,
                              (long long)rows, wr->name);
        if (k > 0 && ids[k] <= ids[k - 1])
            return keel__fail(KEEL_EINVAL, "PUSH from %s: the ids of '%s' "
                              "are not strictly ascending (%lld after "
                              "%lld, entry %lld)", who, wr->name,
                              (long long)ids[k], (long long)ids[k - 1],
                              (long long)k);
    }
    out->v = v;
    out->n = (size_t)n;
    out->ids = ids;
    out->rows = wr->t.data;
    return KEEL_OK;
}

keel_status
keel__ps_sparse_take(keel__ps *ps, keel__wire_msg *req, int replica,
                     keel__ps_rows **out, size_t *n_out)
{
    char who[32];
    keel__ps_rows *rs;
    size_t n = 0, dense = 0;
    keel_status st = KEEL_OK;
    *out = NULL;
    *n_out = 0;
    if (!(req->h.flags & KEEL_WIRE_F_ROWS))
        return KEEL_OK;
    keel__ps_replica_name(ps, replica, who, sizeof who);
    if (ps->rule != NULL || ps->leaves > 0 || ps->chief_applies ||
        (req->h.flags & KEEL_WIRE_F_PIECES))
        return keel__fail(KEEL_EINVAL, "PUSH from %s: gradient rows are "
                          "for the sync and async gradient rules without "
                          "micro-batches, reduce_leaves or chief_applies",
                          who);
    rs = calloc(req->n / 2 + 1, sizeof *rs);
    if (rs == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: rows of %zu tensors", req->n);
    for (size_t i = 0; i < req->n && st == KEEL_OK;) {
        if (strcmp(req->tensors[i].name, KEEL__WIRE_IDS_NAME) != 0) {
            i++;
            continue;
        }
        st = take_pair(ps, req, i, who, &rs[n]);
        for (size_t j = 0; j < n && st == KEEL_OK; j++)
            if (rs[j].v == rs[n].v)
                st = keel__fail(KEEL_EINVAL, "PUSH from %s: rows of '%s' "
                                "twice", who, keel_var_name(rs[n].v));
        n++;
        i += 2;
    }
    if (st != KEEL_OK || n == 0) {
        free(rs);
        return st != KEEL_OK ? st
            : keel__fail(KEEL_ECORRUPT, "PUSH from %s: rows flagged but "
                         "none sent", who);
    }
    /* the dense gradients stay, in order, in front */
    for (size_t i = 0; i < req->n;) {
        if (strcmp(req->tensors[i].name, KEEL__WIRE_IDS_NAME) == 0) {
            i += 2;
            continue;
        }
        if (dense != i)
            req->tensors[dense] = req->tensors[i];
        dense++;
        i++;
    }
    req->n = dense;
    *out = rs;
    *n_out = n;
    return KEEL_OK;
}

keel_status
keel__ps_sparse_check_dense(keel__ps *ps, const keel__ps_rows *rs, size_t n,
                            keel_var *const *vars, size_t n_dense)
{
    for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < n_dense; i++)
            if (vars[i] == rs[j].v)
                return keel__fail(KEEL_EINVAL, "PUSH to ps %d: '%s' both "
                                  "as rows and dense", ps->task_index,
                                  keel_var_name(rs[j].v));
    return KEEL_OK;
}

keel_status
keel__ps_sparse_apply(keel__ps *ps, const keel__ps_rows *rs, size_t n,
                      int64_t step)
{
    keel_status st = KEEL_OK;
    if (n > 0 && ps->apply_rows == NULL)
        return keel__fail(KEEL_EINVAL, "ps %d: rows pushed, but this ps "
                          "applies no optimizer", ps->task_index);
    for (size_t j = 0; j < n && st == KEEL_OK; j++)
        st = ps->apply_rows(ps->apply_ctx, rs[j].v, rs[j].n, rs[j].ids,
                            rs[j].rows, step);
    return st;
}

/* The sync mean of variable v's rows over the held pushes into
 * ps->srows (ids) and ps->srow_data: every id any replica sent, in
 * ascending order; for each, the example-weighted mean over the pushes
 * that sent rows of v, in ascending replica order, a push without that
 * id adding a zero row (as its dense gradient would), with
 * keel__weighted_mean_into (the dense path's arithmetic per element).
 * total: the weights of every fresh push. *n_out: the ids. */
static keel_status
mean_rows(keel__ps *ps, keel_var *v, double total, size_t *n_out)
{
    size_t R = (size_t)ps->n_slots, row, cap = 0, n = 0;
    keel_tensor *vt = keel_var_tensor(v);
    const keel__ps_rows **of;
    size_t *at;
    const float **src;
    double *w;
    float *zero;
    keel_status st = KEEL_OK;
    int k = 0;
    row = vt->count / (size_t)vt->shape[0];
    of = calloc(R, sizeof *of);
    at = calloc(R, sizeof *at);
    src = calloc(R, sizeof *src);
    w = calloc(R, sizeof *w);
    zero = calloc(row, sizeof *zero);
    if (of == NULL || at == NULL || src == NULL || w == NULL ||
        zero == NULL) {
        st = keel__fail(KEEL_ENOMEM, "ps: rows of '%s'", keel_var_name(v));
        goto out;
    }
    for (size_t r = 0; r < R; r++) {
        pending_push *p = &ps->pending[r];
        for (size_t j = 0; p->used && j < p->n_rows; j++)
            if (p->rows[j].v == v) {
                of[k] = &p->rows[j];
                w[k] = p->msg.h.examples > 0 ? (double)p->msg.h.examples
                                             : 1.0;
                cap += p->rows[j].n;
                k++;
            }
    }
    if (cap > ps->srows_cap) {
        int64_t *ids = realloc(ps->srows, cap * sizeof *ids);
        float *d = ids == NULL ? NULL
            : realloc(ps->srow_data, cap * row * sizeof *d);
        if (ids != NULL)
            ps->srows = ids;
        if (d != NULL)
            ps->srow_data = d;
        if (ids == NULL || d == NULL) {
            st = keel__fail(KEEL_ENOMEM, "ps: %zu rows of '%s'", cap,
                            keel_var_name(v));
            goto out;
        }
        ps->srows_cap = cap;
    }
    for (;;) {
        int64_t id = -1;
        for (int q = 0; q < k; q++)      /* the smallest id not yet done */
            if (at[q] < of[q]->n && (id < 0 || of[q]->ids[at[q]] < id))
                id = of[q]->ids[at[q]];
        if (id < 0)
            break;
        for (int q = 0; q < k; q++)
            if (at[q] < of[q]->n && of[q]->ids[at[q]] == id)
                src[q] = of[q]->rows + row * at[q]++;
            else
                src[q] = zero;
        ps->srows[n] = id;
        keel__weighted_mean_into(ps->srow_data + n * row, src, w, k, total,
                                 row);
        n++;
    }
out:
    free(of);
    free(at);
    free(src);
    free(w);
    free(zero);
    *n_out = n;
    return st;
}

keel_status
keel__ps_sparse_aggregate(keel__ps *ps, int64_t step)
{
    double total = 0;
    keel_status st = KEEL_OK;
    int any = 0;
    for (int r = 0; r < ps->n_slots; r++)
        if (ps->pending[r].used) {
            const pending_push *p = &ps->pending[r];
            total += p->msg.h.examples > 0 ? (double)p->msg.h.examples : 1;
            any |= p->n_rows > 0;
        }
    if (!any)
        return KEEL_OK;
    for (size_t k = 0; k < ps->n_pins && st == KEEL_OK; k++) {
        keel_var *v = ps->all[k];
        int sparse = 0;
        size_t n;
        for (int r = 0; r < ps->n_slots && !sparse; r++)
            for (size_t j = 0; ps->pending[r].used &&
                 j < ps->pending[r].n_rows; j++)
                sparse |= ps->pending[r].rows[j].v == v;
        if (!sparse)
            continue;
        if (ps->have[k])
            return keel__fail(KEEL_EINVAL, "ps %d: step %lld: '%s' came as "
                              "rows from some replicas and dense from "
                              "others", ps->task_index, (long long)step,
                              keel_var_name(v));
        if ((st = mean_rows(ps, v, total, &n)) == KEEL_OK && n > 0)
            st = ps->apply_rows != NULL
                ? ps->apply_rows(ps->apply_ctx, v, n, ps->srows,
                                 ps->srow_data, step)
                : keel__fail(KEEL_EINVAL, "ps %d: rows pushed, but this "
                             "ps applies no optimizer", ps->task_index);
    }
    return st;
}

/* One PULL_ROWS tensor wt checked against the row variable it names:
 * *v, its ids and their count. who names the sender in errors. */
static keel_status
rows_request(keel__ps *ps, const keel__wire_tensor *wt, const char *who,
             keel_var **v, const int64_t **ids, size_t *n)
{
    keel_var *var = keel_vars_find(ps->vars, wt->name);
    const keel_tensor *vt;
    const int64_t *id;
    size_t k, cnt;
    if (var == NULL || !(keel_var_flags(var) & KEEL_VAR_ROWS))
        return keel__fail(KEEL_EINVAL, "PULL_ROWS from %s: '%s' is not a "
                          "row variable on ps %d", who, wt->name,
                          ps->task_index);
    vt = keel_var_tensor(var);
    if (wt->t.ndim != 1 || wt->t.count % 2 != 0 ||
        (wt->t.count > 0 && wt->t.data == NULL))
        return keel__fail(KEEL_ECORRUPT, "PULL_ROWS from %s: the ids of "
                          "'%s' are not a flat tensor of int64 words", who,
                          wt->name);
    cnt = wt->t.count / 2;
    if (cnt == 0 || cnt > (size_t)vt->shape[0])
        return keel__fail(KEEL_EINVAL, "PULL_ROWS from %s: %zu ids of '%s', "
                          "which has %lld rows", who, cnt, wt->name,
                          (long long)vt->shape[0]);
    id = (const int64_t *)(const void *)wt->t.data;
    for (k = 0; k < cnt; k++) {
        if (id[k] < 0 || id[k] >= vt->shape[0])
            return keel__fail(KEEL_EINVAL, "PULL_ROWS from %s: id %lld "
                              "(entry %zu) is outside the %lld rows of '%s'",
                              who, (long long)id[k], k,
                              (long long)vt->shape[0], wt->name);
        if (k > 0 && id[k] <= id[k - 1])
            return keel__fail(KEEL_EINVAL, "PULL_ROWS from %s: the ids of "
                              "'%s' are not strictly ascending (%lld after "
                              "%lld, entry %zu)", who, wt->name,
                              (long long)id[k], (long long)id[k - 1], k);
    }
    *v = var;
    *ids = id;
    *n = cnt;
    return KEEL_OK;
}

keel_status
keel__ps_real_pull_rows(keel__ps *ps, keel__wire_msg *req)
{
    char who[64];
    keel__wire_out *outs;
    keel_tensor *ts;
    keel__wire_header h;
    keel_status st = KEEL_OK;
    size_t i;
    snprintf(who, sizeof who, "%s %u",
             keel_task_type_name((keel_task_type)req->h.sender_type),
             req->h.sender_index);
    if (!ps->is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "ps %d holds no state yet "
                          "(waiting for the chief's INIT)", ps->task_index);
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY)
        return keel__fail(KEEL_ECORRUPT, "PULL_ROWS from %s without ids",
                          who);
    outs = calloc(req->n + 1, sizeof *outs);
    ts = calloc(req->n + 1, sizeof *ts);
    if (outs == NULL || ts == NULL) {
        free(outs);
        free(ts);
        return keel__fail(KEEL_ENOMEM, "ps: rows of %zu variables", req->n);
    }
    for (i = 0; i < req->n && st == KEEL_OK; i++) {
        keel_var *v = NULL;
        const int64_t *ids = NULL;
        const keel_tensor *vt;
        size_t n = 0, row;
        st = rows_request(ps, &req->tensors[i], who, &v, &ids, &n);
        for (size_t j = 0; st == KEEL_OK && j < i; j++)
            if (strcmp(outs[j].name, req->tensors[i].name) == 0)
                st = keel__fail(KEEL_EINVAL, "PULL_ROWS from %s: '%s' "
                                "twice", who, req->tensors[i].name);
        if (st != KEEL_OK)
            break;
        vt = keel_var_tensor(v);
        row = vt->count / (size_t)vt->shape[0];
        ts[i] = *vt;
        ts[i].is_owner = 0;
        ts[i].shape[0] = (int64_t)n;
        ts[i].count = n * row;
        /* a copy: the variable may change once the reply is queued */
        ts[i].data = n > 0 ? malloc(n * row * sizeof(float)) : NULL;
        if (n > 0 && ts[i].data == NULL) {
            st = keel__fail(KEEL_ENOMEM, "ps: %zu rows of '%s'", n,
                            keel_var_name(v));
            break;
        }
        for (size_t k = 0; k < n; k++)
            memcpy(ts[i].data + k * row, vt->data + (size_t)ids[k] * row,
                   row * sizeof(float));
        outs[i].name = keel_var_name(v);
        outs[i].t = &ts[i];
        outs[i].pin = NULL;
    }
    if (st == KEEL_OK) {
        keel__ps_reply_header(ps, req, &h, KEEL_MSG_PULL_ROWS,
                              KEEL_WIRE_F_REPLY);
        st = keel__wire_send(ps->sock, &req->identity, &h, outs, req->n,
                             NULL, NULL);
    }
    for (size_t j = 0; j <= req->n; j++)
        free(ts[j].data);
    free(ts);
    free(outs);
    return st;
}
