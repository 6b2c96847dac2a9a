/* ps_shard.c - a ps's part of a sharded checkpoint: SAVE_SHARD, the
 * chief's request to write this ps's variables and slots as one shard into
 * the shared checkpoint directory (the chief commits the index once every
 * ps answered). */
#include <config.h>

#include <stdio.h>

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
