/* worker_sparse.c - the worker's row variables and gradient rows on the
 * wire. A row variable (KEEL_VAR_ROWS) is never pulled whole: a step's
 * keel_var_gather_rows asks the ps holding it for the distinct ids it
 * reads (PULL_ROWS), so the worker's copy of the table stays untouched
 * (no memory). A variable
 * whose step gradient is rows (keel_grads_add_rows) is pushed as its
 * coalesced ids and rows (KEEL_WIRE_F_ROWS) instead of its dense tensor,
 * where the ps can apply them (the sync and async gradient rules without
 * micro-batches, partitions, per-worker rates, reduce_leaves, elastic
 * membership or chief_applies); elsewhere the rows are added into the dense gradients
 * first. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "worker_int.h"
#include "../numeric/numeric_int.h"

int
keel__worker_sparse_usable(const keel_cluster_backend *w)
{
    return w->aw == NULL && w->micro == NULL && w->part == NULL &&
           w->o.algo.worker_lrs == NULL && !w->o.in.chief_applies &&
           w->o.in.reduce_leaves == 0 && !w->o.in.elastic;
}

keel_status
keel__worker_sparse_prepare(keel_cluster_backend *w, keel_grads *grads,
                            int *sparse)
{
    *sparse = 0;
    if (!keel__worker_sparse_usable(w)) {
        keel_grads_densify(grads);
        for (int m = 0; w->micro != NULL && m < w->n_micro; m++)
            keel_grads_densify(w->micro[m]);
        return KEEL_OK;
    }
    if (!keel_grads_has_rows(grads) && !w->rows_attached)
        return KEEL_OK;         /* (a row variable's gradient is rows) */
    if (w->sparse_t == NULL) {
        w->sparse_t = calloc(2 * w->n_vars + 1, sizeof *w->sparse_t);
        if (w->sparse_t == NULL)
            return keel__fail(KEEL_ENOMEM, "cluster backend: rows of %zu "
                              "variables", w->n_vars);
    }
    *sparse = 1;
    return KEEL_OK;
}

size_t
keel__worker_sparse_outs(keel_cluster_backend *w, keel_vars *vs,
                         keel_grads *g, size_t i, keel__wire_out *outs)
{
    const int64_t *ids;
    const float *rows;
    keel_tensor *ti, *tr;
    const keel_tensor *vt;
    size_t n;
    if (w->sparse_t == NULL || (n = keel_grads_rows(g, i, &ids, &rows)) == 0)
        return 0;
    vt = keel_var_tensor(keel_vars_at(vs, i));
    ti = &w->sparse_t[2 * i];
    tr = &w->sparse_t[2 * i + 1];
    memset(ti, 0, sizeof *ti);
    ti->ndim = 1;
    for (int d = 0; d < KEEL_MAX_DIMS; d++)
        ti->shape[d] = 1;
    ti->shape[0] = (int64_t)(2 * n);    /* two float32 words per id */
    ti->count = 2 * n;
    ti->data = (float *)(void *)(uintptr_t)ids;
    *tr = *vt;
    tr->is_owner = 0;
    tr->shape[0] = (int64_t)n;
    tr->count = vt->count / (size_t)vt->shape[0] * n;
    tr->data = (float *)(uintptr_t)rows;
    outs[0].name = KEEL__WIRE_IDS_NAME;
    outs[0].t = ti;
    outs[0].pin = NULL;
    outs[1].name = keel_var_name(keel_vars_at(vs, i));
    outs[1].t = tr;
    outs[1].pin = NULL;
    return 2;
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The row source of a row variable (keel__row_source): one PULL_ROWS of
 * the distinct ids to the ps holding v, the rows then copied out in the
 * caller's order. */
static keel_status
pull_rows(void *ctx, keel_var *v, size_t n, const int64_t *ids, float *out)
{
    keel_cluster_backend *w = ctx;
    size_t i = keel_var_index(v), u = 0, row;
    const keel_tensor *vt = keel_var_tensor(v);
    int p = w->ps_of[i];
    int64_t *uid;
    keel_tensor ti;
    keel__wire_out o;
    keel__wire_header h;
    keel__wire_msg r;
    const keel__wire_tensor *rt;
    keel_status st;
    if (p < 0 || p >= w->n_ps)
        return keel__fail(KEEL_EINVAL, "rows of '%s': no ps holds it",
                          keel_var_name(v));
    row = vt->count / (size_t)vt->shape[0];
    uid = malloc(n * sizeof *uid);
    if (uid == NULL)
        return keel__fail(KEEL_ENOMEM, "rows of '%s': %zu ids",
                          keel_var_name(v), n);
    memcpy(uid, ids, n * sizeof *uid);
    qsort(uid, n, sizeof *uid, cmp_i64);
    for (size_t k = 0; k < n; k++)
        if (u == 0 || uid[k] != uid[u - 1])
            uid[u++] = uid[k];
    memset(&ti, 0, sizeof ti);
    ti.ndim = 1;
    for (int d = 0; d < KEEL_MAX_DIMS; d++)
        ti.shape[d] = 1;
    ti.shape[0] = (int64_t)(2 * u);     /* two float32 words per id */
    ti.count = 2 * u;
    ti.data = (float *)(void *)uid;
    o.name = keel_var_name(v);
    o.t = &ti;
    o.pin = NULL;
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_PULL_ROWS;
    h.peer_generation = w->ps_gen[p];
    st = keel__worker_call_ps(w, p, &h, &o, 1, 0, "the row pull", NULL, 0,
                              &r);
    if (st == KEEL_OK && r.h.generation != w->ps_gen[p])
        st = keel__worker_restarted(w, p, &r);
    rt = st == KEEL_OK && r.n == 1 ? &r.tensors[0] : NULL;
    if (st == KEEL_OK &&
        (rt == NULL || strcmp(rt->name, keel_var_name(v)) != 0 ||
         rt->t.data == NULL || rt->t.ndim != vt->ndim ||
         rt->t.shape[0] != (int64_t)u || rt->t.count != u * row))
        st = keel__fail(KEEL_ECORRUPT, "ps %d answered the row pull of "
                        "'%s' (%zu rows) with other tensors", p,
                        keel_var_name(v), u);
    if (st == KEEL_OK) {
        w->step_pull_bytes += u * row * sizeof(float);
        for (size_t k = 0; k < n; k++) {
            const int64_t *at = bsearch(&ids[k], uid, u, sizeof *uid,
                                        cmp_i64);
            memcpy(out + k * row, rt->t.data + (size_t)(at - uid) * row,
                   row * sizeof *out);
        }
    }
    keel__wire_msg_clear(&r);
    free(uid);
    return st;
}

void
keel__worker_sparse_attach(keel_cluster_backend *w)
{
    if (w->part != NULL || w->n_ps < 1)
        return;                 /* partitioned: the parts are pulled dense */
    for (size_t i = 0; i < w->n_vars; i++) {
        keel_var *v = keel_vars_at(w->vs, i);
        if (keel_var_flags(v) & KEEL_VAR_ROWS) {
            keel__var_set_row_source(v, pull_rows, w);
            w->rows_attached = 1;
        }
    }
}

void
keel__worker_sparse_detach(keel_cluster_backend *w)
{
    for (size_t i = 0; w->rows_attached && i < w->n_vars; i++) {
        keel_var *v = keel_vars_at(w->vs, i);
        if (keel_var_flags(v) & KEEL_VAR_ROWS)
            keel__var_set_row_source(v, NULL, NULL);
    }
    w->rows_attached = 0;
}

keel_status
keel__worker_sparse_check_gather(const keel_cluster_backend *w)
{
    uint64_t total = 0, big = 0;
    const char *name = NULL;
    for (size_t i = 0; w->rows_attached && i < w->n_vars; i++) {
        keel_var *v = keel_vars_at(w->vs, i);
        uint64_t b;
        if (!(keel_var_flags(v) & KEEL_VAR_ROWS))
            continue;
        /* its slots as the ps holds them: one per slot of the rule */
        b = keel_tensor_bytes(keel_var_tensor(v)) *
            (1 + (uint64_t)keel_var_slot_count(v));
        total += b;
        if (b > big) {
            big = b;
            name = keel_var_name(v);
        }
    }
    if (total <= KEEL__ROWS_GATHER_MAX)
        return KEEL_OK;
    return keel__fail(KEEL_EINVAL, "chief: a gathered checkpoint would pull "
                      "%.1f MiB of row variables (the largest '%s') into "
                      "this process, above the %.0f MiB it takes; use "
                      "sharded checkpoints (checkpoint.sharded: each ps "
                      "writes its own)", (double)total / (1 << 20), name,
                      (double)KEEL__ROWS_GATHER_MAX / (1 << 20));
}

void
keel__worker_sparse_pulled(keel_cluster_backend *w, keel_vars *vs)
{
    for (size_t i = 0; w->rows_attached && i < w->n_vars; i++) {
        keel_var *v = keel_vars_at(vs, i);
        if (keel_var_flags(v) & KEEL_VAR_ROWS)
            keel_var_set_initialized(v, 1);
    }
}
