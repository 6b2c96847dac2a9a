/* worker_sparse.c - the worker's gradient rows on the wire: a variable
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
    if (!keel_grads_has_rows(grads))
        return KEEL_OK;
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
