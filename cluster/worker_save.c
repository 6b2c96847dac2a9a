/* worker_save.c - the chief's sharded checkpoint (keel_cluster_config.
 * sharded_checkpoints): every ps writes its own shard (SAVE_SHARD, all
 * sent before any reply is waited for), then the chief commits the index
 * with its own variables. A kill of any task at any moment leaves the
 * checkpoint whole or absent: the index, written last and durably, is what
 * makes it one. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* A test's pause between the shards and the index: with
 * KEEL_TEST_PAUSE_BEFORE_INDEX naming a file, the chief writes the step
 * into it once the shards of that step are written and waits, before
 * committing the index, until the file is gone (at most
 * TEST_PAUSE_MAX_MS): a test kills a task there and checks that the
 * checkpoint is whole or absent. Unset (every real job), nothing. */
#define TEST_PAUSE_MAX_MS 60000

static void
test_pause_before_index(int64_t step)
{
    const char *path = getenv("KEEL_TEST_PAUSE_BEFORE_INDEX");
    struct timespec ts = { 0, 10 * 1000000 };
    FILE *f;
    if (path == NULL || path[0] == '\0' || (f = fopen(path, "w")) == NULL)
        return;
    fprintf(f, "%lld\n", (long long)step);
    fclose(f);
    keel__log(KEEL_LOG_INFO, "chief: paused before the index of step %lld "
              "until %s is removed", (long long)step, path);
    for (int ms = 0; ms < TEST_PAUSE_MAX_MS && access(path, F_OK) == 0;
         ms += 10)
        nanosleep(&ts, NULL);
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
    test_pause_before_index(step);
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

/* The checkpoint of checkpoint_dir at step the ps can read from: its
 * file name in name and its run id (a sharded checkpoint's index; 0: a
 * gathered checkpoint, one file the chief wrote), or 0 when there is
 * none (none of that step, one that cannot be read: the values are sent
 * instead). */
static int
find_sharded(const char *dir, int64_t step, char *name, size_t size,
             uint64_t *run_id)
{
    keel_ckpt_file *files = NULL;
    size_t n = 0;
    int found = 0;
    if (keel_ckpt_scan(dir, NULL, &files, &n) != KEEL_OK)
        return 0;
    /* only a file the state file lists: this job's checkpoints (one the
     * manager restores or this chief wrote), never a stray file of an
     * older run that happens to have the step */
    for (size_t i = n; i > 0 && !found; i--) {
        const keel_ckpt_file *f = &files[i - 1];
        char path[KEEL_PATH_MAX];
        keel_ckpt_info *info = NULL;
        if (f->step != step || !f->in_state_file ||
            strstr(f->name, ".shard-") != NULL || strlen(f->name) >= size ||
            snprintf(path, sizeof path, "%s/%s", dir, f->name) >=
                (int)sizeof path ||
            keel_ckpt_read_info(path, &info) != KEEL_OK)
            continue;
        if (info->global_step == step &&
            (info->shard_count == 0 || info->run_id != 0)) {
            strcpy(name, f->name);
            *run_id = info->run_id;
            found = 1;
        }
        keel_ckpt_info_free(info);
    }
    keel_ckpt_scan_free(files);
    return found;
}

keel_status
keel__worker_init_from_ckpt(keel_cluster_backend *w, keel_vars *vs,
                            const unsigned char *todo, unsigned char *done)
{
    char name[KEEL_NAME_MAX];
    int64_t step = keel_vars_global_step(vs);
    uint64_t run_id = 0;
    keel__wire_out out;
    keel_status st = KEEL_OK;
    int sent = 0, n_done = 0;
    memset(done, 0, (size_t)w->n_ps);
    /* a ps holding parts NAME/part_k of a partitioned variable reads
     * their rows of NAME (the index's virtual dataset, or a gathered
     * checkpoint's dataset): the same split on every task (partition.c) */
    if (!keel__worker_sharded(w) ||
        !find_sharded(w->o.in.checkpoint_dir, step, name, sizeof name,
                      &run_id))
        return KEEL_OK;
    memset(&out, 0, sizeof out);
    out.name = name;
    /* every ps reads at once: all sent before any reply is waited for */
    for (int p = 0; p < w->n_ps && st == KEEL_OK; p++) {
        keel__wire_header h;
        sent = p;
        if (!todo[p])
            continue;
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_INIT;
        h.flags = KEEL_WIRE_F_NAMES_ONLY;
        h.global_step = step;
        h.peer_generation = run_id;
        st = keel__wire_client_send(w->clients[p], &h, &out, 1, 0,
                                    w->o.in.dead_after_ms);
        if (st != KEEL_OK)
            st = keel__wrap(st == KEEL_ETIMEOUT ? KEEL_EUNAVAILABLE : st,
                            "ps %d: INIT from checkpoint %s", p, name);
        else
            w->req_ids[p] = h.request_id;
        sent = p + (st == KEEL_OK);
    }
    for (int p = 0; p < sent; p++) {
        keel__wire_msg r;
        char what[KEEL_NAME_MAX + 32];
        keel_status rs;
        if (!todo[p])
            continue;
        snprintf(what, sizeof what, "the INIT from %s", name);
        rs = keel__worker_wait_reply(w, p, what, 0, &r);
        if (rs == KEEL_EPEER && r.h.type == KEEL_MSG_ERROR) {
            /* the ps could not read it (no directory, a damaged shard):
             * the caller sends it the values */
            keel__log(KEEL_LOG_WARN, "chief: ps %d did not initialize "
                      "from %s (%s); sending it the values", p, name,
                      r.text != NULL ? r.text : "no reason given");
            rs = KEEL_OK;
        } else if (rs != KEEL_OK && r.h.type != 0) {
            rs = keel__worker_call_error(w, p, rs, &r, what);
        } else if (rs == KEEL_OK && r.h.generation != w->ps_gen[p]) {
            rs = keel__worker_restarted(w, p, &r);
        } else if (rs == KEEL_OK) {
            done[p] = 1;
            n_done++;
        }
        keel__wire_msg_clear(&r);
        if (st == KEEL_OK)
            st = rs;
    }
    if (st == KEEL_OK && n_done > 0 && run_id != 0)
        keel__log(KEEL_LOG_INFO, "chief: %d parameter server(s) read their "
                  "variables and slots from %s (step %lld, run %016llx): "
                  "no values sent", n_done, name, (long long)step,
                  (unsigned long long)run_id);
    else if (st == KEEL_OK && n_done > 0)
        keel__log(KEEL_LOG_INFO, "chief: %d parameter server(s) read their "
                  "variables and slots from %s (step %lld, a gathered "
                  "checkpoint): no values sent", n_done, name,
                  (long long)step);
    return st;
}
