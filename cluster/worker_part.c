/* worker_part.c - the worker backend over partitioned variables
 * (keel_cluster_config.partition_bytes): the backend runs over the split
 * store (partition.c), and the session's store gets the variables whole:
 * each call that hands the backend the session's store splits it (values,
 * slots, gradients) before and assembles it after. */
#include <config.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <keel/session.h>
#include "worker_int.h"

keel_status
keel__worker_part_take(keel_cluster_backend *w, keel__partition *part,
                       keel_vars *user_vs)
{
    size_t split = 0;
    w->part = part;
    w->user_vs = user_vs;
    for (size_t i = 0; i < part->n; i++)
        split += part->parts[i] > 1;
    keel__log(KEEL_LOG_INFO, "%zu of %zu variables partitioned by rows: "
              "%zu variables on the ps (cluster.partition_bytes)", split,
              part->n, keel_vars_count(part->wire));
    return keel_grads_new(part->wire, &w->part_grads);
}

void
keel__worker_part_free(keel_cluster_backend *w)
{
    for (int m = 0; m < KEEL__MAX_MICRO; m++)
        keel_grads_free(w->part_micro[m]);
    keel_grads_free(w->part_grads);
    keel__partition_free(w->part);
}

keel_status
keel__worker_part_set_micro(keel_cluster_backend *w, keel_grads *const *g,
                            int n)
{
    for (int m = 0; m < n; m++) {
        keel_status st;
        if (w->part_micro[m] != NULL)
            continue;
        st = keel_grads_new(w->part->wire, &w->part_micro[m]);
        if (st != KEEL_OK)
            return st;
    }
    w->user_micro = n > 0 ? g : NULL;
    w->micro = n > 0 ? w->part_micro : NULL;
    w->n_micro = n;
    return KEEL_OK;
}

void
keel__worker_part_gather(keel_cluster_backend *w, const char *const *names,
                         size_t n, int with_slots)
{
    if (names == NULL) {
        keel__partition_gather(w->part, w->user_vs, with_slots, 0);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        keel_var *v = keel_vars_find(w->user_vs, names[i]);
        if (v != NULL)
            keel__partition_gather_var(w->part, w->user_vs,
                                       keel_var_index(v));
    }
}

static keel_status
part_publish(void *ctx, keel_vars *vs, int restored)
{
    keel_cluster_backend *w = ctx;
    keel_status st;
    keel__partition_scatter(w->part, vs, 1);
    st = keel__worker_publish(ctx, w->part->wire, restored);
    if (st == KEEL_OK)          /* joined live ps: their state */
        keel__partition_gather(w->part, vs, 1, 0);
    return st;
}

static keel_status
part_is_intact(void *ctx, keel_vars *vs, int *is_intact)
{
    keel_cluster_backend *w = ctx;
    keel_status st = keel__worker_is_intact(ctx, w->part->wire, is_intact);
    if (st == KEEL_OK && *is_intact)
        keel__partition_gather(w->part, vs, 1, 0);
    return st;
}

static keel_status
part_fetch(void *ctx, keel_vars *vs, int *is_ready, char *why, size_t size)
{
    keel_cluster_backend *w = ctx;
    keel_status st = keel__worker_fetch(ctx, w->part->wire, is_ready, why,
                                        size);
    if (st == KEEL_OK && *is_ready)
        keel__partition_gather(w->part, vs, 0, 0);
    return st;
}

/* Before a checkpoint: a sharded one needs only the global step (each ps
 * writes its parts, the index shows each variable whole); else every
 * variable and slot is pulled and assembled. */
static keel_status
part_before_save(void *ctx, keel_vars *vs)
{
    keel_cluster_backend *w = ctx;
    keel_status st;
    if (keel__worker_sharded(w)) {
        int64_t step;
        st = keel__worker_read_step(ctx, &step);
        if (st == KEEL_OK)
            keel_vars_set_global_step(vs, step);
        return st;
    }
    st = keel__worker_before_save(ctx, w->part->wire);
    if (st == KEEL_OK)
        keel__partition_gather(w->part, vs, 1, 0);
    return st;
}

/* The step's gradients (and micro-batch stores, metrics) split, the push,
 * and the new values of the trainable variables assembled. */
static keel_status
part_apply(void *ctx, keel_vars *vs, keel_grads *grads, int64_t global_step)
{
    keel_cluster_backend *w = ctx;
    keel_status st;
    keel_grads_densify(grads);          /* the parts are pushed dense */
    for (int m = 0; w->micro != NULL && m < w->n_micro; m++)
        keel_grads_densify(w->user_micro[m]);
    keel__partition_grads(w->part, grads, w->part_grads);
    *keel__grads_metrics(w->part_grads) = *keel__grads_metrics(grads);
    for (int m = 0; w->micro != NULL && m < w->n_micro; m++)
        keel__partition_grads(w->part, w->user_micro[m], w->part_micro[m]);
    keel_vars_set_global_step(w->part->wire, keel_vars_global_step(vs));
    st = keel__worker_apply(ctx, w->part->wire, w->part_grads, global_step);
    *keel__grads_metrics(grads) = *keel__grads_metrics(w->part_grads);
    if (st == KEEL_OK)
        keel__partition_gather(w->part, vs, 0, 1);
    return st;
}

void
keel__worker_part_backend(keel_cluster_backend *w, keel_backend *out)
{
    if (w->part == NULL)
        return;
    out->updater.apply = part_apply;
    out->publish = part_publish;
    out->is_intact = part_is_intact;
    out->fetch = part_fetch;
    out->before_save = part_before_save;
}
