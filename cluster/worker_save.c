/* worker_save.c - the chief's sharded checkpoint (keel_cluster_config.
 * sharded_checkpoints): every ps writes its own shard (SAVE_SHARD, all
 * sent before any reply is waited for), then the chief commits the index
 * with its own variables. A kill of any task at any moment leaves the
 * checkpoint whole or absent: the index, written last and durably, is what
 * makes it one. */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include <keel/checkpoint.h>
#include "worker_int.h"

int
keel__worker_sharded(const keel_cluster_backend *w)
{
    return w->is_chief && w->aw == NULL && w->n_ps > 0 &&
           w->o.in.sharded_checkpoints && w->o.in.checkpoint_dir != NULL &&
           w->o.in.checkpoint_dir[0] != '\0';
}

/* The chief's variables no ps holds, with the global step, in *own (a new
 * store the caller frees): the index's own part. With partitioned
 * variables w's table is the parts' store (part->wire); a variable no ps
 * holds is never split, and its values are vs's. */
static keel_status
own_vars(keel_cluster_backend *w, const keel_vars *vs, keel_vars **own)
{
    const keel_vars *table = w->part != NULL ? w->part->wire : vs;
    keel_status st = keel_vars_new(own);
    for (size_t i = 0; i < w->n_vars && st == KEEL_OK; i++) {
        keel_var *v = keel_vars_at(table, i), *c = NULL;
        keel_tensor *t;
        if (w->ps_of[i] >= 0 || (keel_var_flags(v) & KEEL_VAR_LOCAL))
            continue;
        if (table != vs && keel_vars_find(vs, keel_var_name(v)) != NULL)
            v = keel_vars_find(vs, keel_var_name(v));
        t = keel_var_tensor(v);
        st = keel_vars_create(*own, keel_var_name(v), t->ndim, t->shape,
                              keel_var_flags(v), &c);
        if (st == KEEL_OK)
            memcpy(keel_var_tensor(c)->data, t->data,
                   keel_tensor_bytes(t));
    }
    if (st == KEEL_OK)
        keel_vars_set_global_step(*own, keel_vars_global_step(vs));
    return st;
}

/* SAVE_SHARD to every ps, then every reply: each ps's shard of step
 * written, at that step. */
static keel_status
write_shards(keel_cluster_backend *w, int64_t step, uint64_t run_id)
{
    keel_status st = KEEL_OK;
    int sent = 0;
    for (int p = 0; p < w->n_ps && st == KEEL_OK; p++) {
        keel__wire_header h;
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_SAVE_SHARD;
        h.global_step = step;
        h.arg = (uint32_t)w->n_ps;
        h.peer_generation = run_id;
        st = keel__wire_client_send(w->clients[p], &h, NULL, 0, 0,
                                    w->o.in.dead_after_ms);
        if (st != KEEL_OK)
            st = keel__wrap(st == KEEL_ETIMEOUT ? KEEL_EUNAVAILABLE : st,
                            "ps %d: SAVE_SHARD", p);
        else
            w->req_ids[p] = h.request_id;
        sent = p + (st == KEEL_OK);
    }
    for (int p = 0; p < sent; p++) {
        keel__wire_msg r;
        char what[64];
        keel_status rs;
        snprintf(what, sizeof what, "the shard of step %lld",
                 (long long)step);
        rs = keel__worker_wait_reply(w, p, what, 0, &r);
        if (rs != KEEL_OK && r.h.type != 0)
            rs = keel__worker_call_error(w, p, rs, &r, what);
        if (rs == KEEL_OK && r.h.generation != w->ps_gen[p])
            rs = keel__worker_restarted(w, p, &r);
        keel__wire_msg_clear(&r);
        if (st == KEEL_OK)
            st = rs;
    }
    return st;
}

keel_status
keel__worker_save(void *ctx, keel_saver *saver, keel_vars *vs,
                  const keel_ckpt_meta *meta, char *path, size_t path_size)
{
    keel_cluster_backend *w = ctx;
    keel_ckpt_index_config ic;
    keel_vars *own = NULL;
    int64_t step = keel_vars_global_step(vs);
    keel_status st;
    if (!keel__worker_sharded(w) || keel_saver_last_step(saver) == step)
        return keel_saver_save(saver, vs, meta, path, path_size);
    st = write_shards(w, step, w->generation);
    if (st != KEEL_OK)
        return keel__wrap(st, "sharded checkpoint of step %lld: no index "
                          "written", (long long)step);
    keel__log(KEEL_LOG_INFO, "chief: the %d shards of step %lld are "
              "written; committing the index", w->n_ps, (long long)step);
    st = own_vars(w, vs, &own);
    keel_ckpt_index_config_init(&ic);
    ic.run_id = w->generation;
    ic.shard_count = w->n_ps;
    /* the ps hold parts NAME/part_k: the index shows each NAME whole */
    ic.partitioned = w->part != NULL;
    if (st == KEEL_OK)
        st = keel_saver_save_sharded(saver, own, meta, &ic, path, path_size);
    /* an async saver keeps a copy: own is not needed past the call */
    keel_vars_free(own);
    return st;
}
