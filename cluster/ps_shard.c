/* ps_shard.c - a ps's part of a sharded checkpoint: SAVE_SHARD, the
 * chief's request to write this ps's variables and slots as one shard into
 * the shared checkpoint directory (the chief commits the index once every
 * ps answered), and the INIT that names a checkpoint instead of carrying
 * values: the ps reads the variables and slots it holds from it by name,
 * a part NAME/part_k of a partitioned variable as its rows of NAME. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/checkpoint.h>
#include "ps_int.h"

/* The ps serves one request at a time: a sync step is applied whole inside
 * the PUSH that completes it, so between requests the store holds whole
 * steps only, and the shard is written from it in place. The shard is
 * named by the chief's step (header global_step); a sync ps at another
 * step refuses (the shards of one checkpoint hold one step), an async ps
 * writes what it holds (as a pull for a whole checkpoint would). */
keel_status
keel__ps_real_save_shard(keel__ps *ps, keel__wire_msg *req)
{
    keel_ckpt_shard_config c;
    char path[KEEL_PATH_MAX];
    int64_t have = keel_vars_global_step(ps->vars);
    int64_t step = req->h.global_step;
    keel_status st;
    if (ps->checkpoint_dir == NULL || ps->checkpoint_dir[0] == '\0')
        return keel__fail(KEEL_EINVAL, "ps %d: SAVE_SHARD for step %lld: "
                          "this ps has no checkpoint directory "
                          "(checkpoint.sharded needs checkpoint.dir on "
                          "every ps, on a file system they share)",
                          ps->task_index, (long long)step);
    if (!ps->is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "ps %d: SAVE_SHARD for step "
                          "%lld before the chief's INIT", ps->task_index,
                          (long long)step);
    if (step < 0 || step > KEEL__MAX_GLOBAL_STEP || req->h.arg == 0 ||
        (int)req->h.arg <= ps->task_index || req->h.arg > 99999)
        return keel__fail(KEEL_EINVAL, "ps %d: SAVE_SHARD for step %lld "
                          "with %u shards", ps->task_index, (long long)step,
                          req->h.arg);
    if (ps->sync && have != step)
        return keel__fail(KEEL_EABORTED, "ps %d: SAVE_SHARD for step %lld, "
                          "but this ps is at step %lld", ps->task_index,
                          (long long)step, (long long)have);
    keel_ckpt_shard_config_init(&c);
    c.dir = ps->checkpoint_dir;
    c.step = step;
    c.run_id = req->h.peer_generation;
    c.shard_index = ps->task_index;
    c.shard_count = (int)req->h.arg;
    st = keel_ckpt_write_shard(&c, ps->vars, path, sizeof path);
    if (st != KEEL_OK)
        return keel__wrap(st, "ps %d: shard %d of %u of step %lld",
                          ps->task_index, ps->task_index, req->h.arg,
                          (long long)step);
    keel__log(KEEL_LOG_INFO, "ps %d: wrote shard %d of %u of step %lld: %s",
              ps->task_index, ps->task_index, req->h.arg, (long long)step,
              path);
    return keel__ps_send_done(ps, req, KEEL_MSG_SAVE_SHARD);
}

/* v's entry in ps->parts when v is a part of a partitioned variable,
 * else NULL. */
static const keel__ps_part *
part_of(const keel__ps *ps, keel_var *v)
{
    for (size_t i = 0; i < ps->n_parts; i++)
        if (strcmp(ps->parts[i].name, keel_var_name(v)) == 0)
            return &ps->parts[i];
    return NULL;
}

/* The tensors of variable v (and of its slots when with_slots) into
 * parts[*k..]: by v's name, or for a part of a partitioned variable (pp)
 * its rows of the whole variable's dataset (and of each slot's). */
static void
var_parts(keel_var *v, const keel__ps_part *pp, int with_slots,
          keel_ckpt_part *parts, size_t *k)
{
    keel_tensor *t = keel_var_tensor(v), *sl = NULL;
    const char *sn = NULL;
    for (size_t j = 0; j == 0 || (with_slots &&
                                  (sl = keel_var_slot_at(v, j - 1, &sn)) !=
                                      NULL); j++) {
        keel_ckpt_part *q = &parts[(*k)++];
        memset(q, 0, sizeof *q);
        q->name = pp != NULL ? pp->whole : keel_var_name(v);
        q->slot = j > 0 ? sn : NULL;
        q->dst = j > 0 ? sl->data : t->data;
        q->count = j > 0 ? sl->count : t->count;
        if (pp != NULL) {
            q->row_begin = pp->row_begin;
            q->row_end = pp->row_end;
        }
    }
}

/* The checkpoint an INIT names: one path segment (a file of this ps's
 * checkpoint directory), joined into path. */
static keel_status
init_path(keel__ps *ps, const keel__wire_msg *req, char *path, size_t size)
{
    const char *name = req->n == 1 ? req->tensors[0].name : NULL;
    if (name == NULL || strchr(name, '/') != NULL ||
        !keel_name_is_valid(name))
        return keel__fail(KEEL_ECORRUPT, "ps %d: INIT from a checkpoint "
                          "must name one checkpoint file (%zu names)",
                          ps->task_index, req->n);
    if (ps->checkpoint_dir == NULL || ps->checkpoint_dir[0] == '\0')
        return keel__fail(KEEL_EINVAL, "ps %d: INIT from checkpoint %s: "
                          "this ps has no checkpoint directory (it needs "
                          "checkpoint.dir and checkpoint.sharded)",
                          ps->task_index, name);
    return keel__path_join(path, size, ps->checkpoint_dir, name);
}

keel_status
keel__ps_read_checkpoint(keel__ps *ps, const keel__wire_msg *req)
{
    char path[KEEL_PATH_MAX];
    size_t nv = keel_vars_count(ps->vars), n = 0, k = 0, n_rows = 0;
    keel_ckpt_part *parts;
    keel_status st = init_path(ps, req, path, sizeof path);
    if (st != KEEL_OK)
        return st;
    for (size_t i = 0; i < nv; i++)
        n += 1 + keel_var_slot_count(keel_vars_at(ps->vars, i));
    parts = calloc(n > 0 ? n : 1, sizeof *parts);
    if (parts == NULL)
        return keel__fail(KEEL_ENOMEM, "ps %d: %zu tensors to restore",
                          ps->task_index, n);
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(ps->vars, i);
        const keel__ps_part *pp = part_of(ps, v);
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        var_parts(v, pp, 1, parts, &k);
        n_rows += pp != NULL;
    }
    /* the step and run id are the chief's: a file of another checkpoint
     * (or a shard of another run behind the index) is refused before
     * anything is read */
    st = keel_ckpt_read_parts(path, req->h.global_step,
                              req->h.peer_generation, parts, k, NULL);
    if (st == KEEL_OK) {
        size_t read = 0;
        for (size_t i = 0; i < nv; i++) {
            keel_var *v = keel_vars_at(ps->vars, i);
            if (keel_var_flags(v) & KEEL_VAR_LOCAL)
                continue;
            keel_var_set_initialized(v, 1);
            read++;
        }
        ps->init_vars += read;
        ps->init_slots += k - read;
        keel__log(KEEL_LOG_INFO, "ps %d: read %zu variables and %zu slot "
                  "tensors of step %lld from %s (no values through the "
                  "chief)", ps->task_index, read, k - read,
                  (long long)req->h.global_step, path);
        if (n_rows > 0)
            keel__log(KEEL_LOG_INFO, "ps %d: %zu of them parts of "
                      "partitioned variables, each (and its slots) read as "
                      "its rows of the whole variable", ps->task_index,
                      n_rows);
    }
    free(parts);
    if (st != KEEL_OK)
        return keel__wrap(st, "ps %d: INIT from checkpoint %s",
                          ps->task_index, path);
    return KEEL_OK;
}
