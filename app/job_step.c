/* job_step.c - the training session's callbacks on the job: one step's
 * gradients from its batch (mirrored replicas, Hogwild threads,
 * micro-batches, tree nodes or the whole batch), the update, variable
 * initialization, the feed, the checkpoint's metadata and the restore of
 * the data iterator's position. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <keel/checkpoint.h>
#include <keel/config.h>
#include <keel/distributed.h>
#include <keel/session.h>
#include <keel/train.h>
#include "util.h"
#include "job_int.h"
#include "../train/train_int.h"
#include "../session/step_pool.h"

#define ITER_BLOB "data_iterator"   /* the iterator's state in checkpoints */

/* Set the step's loss and accuracy (metrics: on a cluster the means over
 * every replica's examples) and learning rate from stats. */
static keel_status
step_values(keel__job *j, keel_step *stp, const keel_step_stats *stats)
{
    keel_status st = stats->count > 0
        ? keel_step_set_metric(stp, "loss", stats->loss_sum, stats->count)
        : keel_step_set_value(stp, "loss", 0.0);
    if (st == KEEL_OK)
        st = stats->count > 0
            ? keel_step_set_metric(stp, "accuracy", (double)stats->correct,
                                   stats->count)
            : keel_step_set_value(stp, "accuracy", 0.0);
    if (st == KEEL_OK)
        st = keel_step_set_value(stp, "learning_rate", keel_lr_at(
            &j->schedule, keel_step_global_step(stp)));
    return st;
}

/* Examples [off, off + n) of b: a view, nothing copied; stride is
 * one example's floats. */
static keel_batch
batch_slice(const keel_batch *b, size_t off, size_t n, size_t stride)
{
    keel_batch s = { b->x + off * stride, b->y + off, n };
    return s;
}

static void
stats_add(keel_step_stats *sum, const keel_step_stats *one)
{
    sum->loss_sum += one->loss_sum;
    sum->correct += one->correct;
    sum->count += one->count;
}

/* Mirrored: replica r of R trains examples [r*n/R, (r+1)*n/R) of the
 * batch on its own model into its own gradients (the session adds them).
 * Runs on R threads at once: it writes only replica r's state. */
static keel_status
replica_step(keel__job *j, keel_step *stp, const keel_batch *b)
{
    int r = keel_step_replica(stp), R = keel_step_num_replicas(stp);
    size_t lo = b->n * (size_t)r / (size_t)R;
    size_t hi = b->n * (size_t)(r + 1) / (size_t)R;
    size_t stride = keel_dataset_example_size(j->ds);
    keel_step_stats stats;
    keel_batch slice;
    keel_status st;
    if (R != j->replicas || hi <= lo)
        return keel__fail(KEEL_EINTERNAL, "replica %d of %d: batch of %zu "
                          "for %d replicas", r, R, b->n, j->replicas);
    slice = batch_slice(b, lo, hi - lo, stride);
    st = keel_model_step(j->rmodel[r], keel_step_vars(stp), &slice,
                         j->global_batch, keel_step_grads(stp), &stats);
    if (st != KEEL_OK)
        return keel__wrap(st, "replica %d", r);
    if (r == 0) {
        j->examples += (int64_t)b->n;
        j->rpool = keel__step_pool(stp);
    }
    return step_values(j, stp, &stats);
}

/* Hogwild thread t: its slice of the round's batch on its own model. */
static keel_status
hogwild_thread(void *ctx, int t, keel_grads *grads, int64_t global_step)
{
    keel__job *j = ctx;
    const keel_batch *b = j->hw_batch;
    size_t lo = b->n * (size_t)t / (size_t)j->hw_threads;
    size_t hi = b->n * ((size_t)t + 1) / (size_t)j->hw_threads;
    keel_batch mb = batch_slice(b, lo, hi - lo,
                                keel_dataset_example_size(j->ds));
    (void)global_step;
    memset(&j->hw_stats[t], 0, sizeof j->hw_stats[t]);
    if (mb.n == 0)
        return KEEL_OK;
    return keel_model_step(j->hw_model[t], j->vs, &mb, (int64_t)mb.n, grads,
                           &j->hw_stats[t]);
}

/* One Hogwild round: every thread trains its mini-batch and updates the
 * store lock-free; the round counts one global step per thread. */
static keel_status
hogwild_step(keel__job *j, keel_step *stp, const keel_batch *b,
             keel_step_stats *stats)
{
    int64_t gs = keel_step_global_step(stp);
    keel_status st;
    j->hw_batch = b;
    st = keel_hogwild_run(j->hw, hogwild_thread, j, gs);
    if (st != KEEL_OK)
        return st;
    memset(stats, 0, sizeof *stats);
    for (int t = 0; t < j->hw_threads; t++)
        stats_add(stats, &j->hw_stats[t]);
    keel_step_mark_applied(stp);
    keel_vars_set_global_step(keel_step_vars(stp), gs + j->hw_threads);
    return KEEL_OK;
}

/* One piece of the step's batch through the model, its loss and accuracy
 * added to stats: into own (zeroed first), or with own NULL into the
 * step's gradients; norm divides the loss. */
static keel_status
piece_step(keel__job *j, keel_step *stp, const keel_batch *piece, int64_t norm,
           keel_grads *own, keel_step_stats *stats)
{
    keel_step_stats one;
    keel_status st;
    if (own != NULL)
        keel_grads_zero(own);
    st = keel_model_step(j->model, keel_step_vars(stp), piece, norm,
                         own != NULL ? own : keel_step_grads(stp), &one);
    if (st == KEEL_OK)
        stats_add(stats, &one);
    return st;
}

/* train.micro_batch: fixed micro-batches, each computed alone and added in
 * order (in a cluster each into its own gradient store, pushed
 * separately). */
static keel_status
micro_step(keel__job *j, keel_step *stp, const keel_batch *b,
           keel_step_stats *stats)
{
    size_t m = (size_t)j->micro, stride = keel_dataset_example_size(j->ds);
    int64_t norm = j->local_norm ? (int64_t)b->n : j->global_batch;
    keel_status st;
    if (b->n % m != 0)
        return keel__fail(KEEL_EINVAL, "train.micro_batch = %zu does not "
                          "divide this batch of %zu examples", m, b->n);
    memset(stats, 0, sizeof *stats);
    for (size_t k = 0; k < b->n / m; k++) {
        keel_batch mb = batch_slice(b, k * m, m, stride);
        keel_grads *own = NULL;
        if (j->n_micro > 0) {
            if (k >= (size_t)j->n_micro)
                return keel__fail(KEEL_EINTERNAL, "micro-batch %zu of %d",
                                  k, j->n_micro);
            own = j->micro_g[k];
        }
        if ((st = piece_step(j, stp, &mb, norm, own, stats)) != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* Canonical leaves on a cluster: each tree node's sum alone, into its own
 * gradient store; the ps adds them along the tree. */
static keel_status
tree_step(keel__job *j, keel_step *stp, const keel_batch *b,
          keel_step_stats *stats)
{
    size_t stride = keel_dataset_example_size(j->ds);
    keel_status st;
    memset(stats, 0, sizeof *stats);
    for (int c = 0; c < j->n_nodes; c++) {
        keel_batch nb;
        if (j->node_off[c] + j->node_len[c] > b->n)
            return keel__fail(KEEL_EINTERNAL, "tree node %d: examples "
                              "[%zu, +%zu) of a batch of %zu", c,
                              j->node_off[c], j->node_len[c], b->n);
        nb = batch_slice(b, j->node_off[c], j->node_len[c], stride);
        st = piece_step(j, stp, &nb, j->global_batch, j->micro_g[c], stats);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

int keel__job_fused_update = 1;
int64_t keel__job_fused_steps;

/* The whole batch and the update keel__job_apply would make next, in one
 * run of the model's pool (keel__model_step_apply: the same bits as the
 * step and then the update, one hand-off less); the step is marked
 * applied, so the session calls no updater. Only where the session's
 * updater is keel__job_apply and nothing comes between the step and it
 * (j->fuse_update). */
static keel_status
fused_step(keel__job *j, keel_step *stp, const keel_batch *b,
           keel_step_stats *stats)
{
    keel_grads *g = keel_step_grads(stp);
    keel_status st;
    st = keel__model_step_apply(j->model, keel_step_vars(stp), b,
                                j->local_norm ? (int64_t)b->n
                                              : j->global_batch,
                                g, stats, j->opt, keel_step_global_step(stp),
                                1);
    if (st != KEEL_OK)
        return st;
    keel_step_mark_applied(stp);
    j->zeroed = g;                  /* the update zeroed them as it passed */
    keel__job_fused_steps++;
    return KEEL_OK;
}

/* The step's gradients (and with Hogwild the update) from batch b: by
 * Hogwild's threads, fixed micro-batches, tree nodes, or all at once. */
static keel_status
batch_step(keel__job *j, keel_step *stp, const keel_batch *b,
           keel_step_stats *stats)
{
    if (j->hw != NULL)
        return hogwild_step(j, stp, b, stats);
    if (j->micro > 0)
        return micro_step(j, stp, b, stats);
    if (j->n_nodes > 0)
        return tree_step(j, stp, b, stats);
    if (j->fuse_update && keel__job_fused_update && j->opt != NULL &&
        j->kfac == NULL)
        return fused_step(j, stp, b, stats);
    return keel_model_step(j->model, keel_step_vars(stp), b,
                           j->local_norm ? (int64_t)b->n : j->global_batch,
                           keel_step_grads(stp), stats);
}

/* cluster.elastic, before each step: the tree nodes of this replica's
 * leaves under the membership the ps told it last (live replica p of M
 * owns leaves [p*L/M, (p+1)*L/M) of the whole global batch it reads),
 * each computed into its own store and pushed in order. Not live: nothing
 * is computed (the ps refuses the push; the session recovers and the
 * replica takes part from the next step boundary). */
static keel_status
elastic_division(keel__job *j)
{
    keel__tree_node nodes[64];
    size_t piece = keel__model_piece(j->model);
    int64_t epoch, lo, hi;
    int pos, count, k;
    keel_status st = keel_cluster_backend_membership(j->worker, &epoch,
                                                     &pos, &count);
    if (st != KEEL_OK || epoch == j->el_epoch)
        return st;
    j->el_epoch = epoch;
    j->el_member = epoch > 0 && pos >= 0 && pos < count &&
        count <= j->leaves;
    if (!j->el_member) {
        keel__log(KEEL_LOG_INFO, "elastic: this replica is not live yet "
                  "(membership epoch %lld); it takes part from the next "
                  "step boundary", (long long)epoch);
        return keel_cluster_backend_set_micro(j->worker, NULL, 0);
    }
    lo = (int64_t)pos * j->leaves / count;
    hi = (int64_t)(pos + 1) * j->leaves / count;
    k = keel__tree_cover(j->leaves, lo, hi, nodes, 64);
    if (k < 1)
        return keel__fail(KEEL_EINTERNAL, "elastic: tree cover of leaves "
                          "[%lld, %lld) of %lld", (long long)lo,
                          (long long)hi, (long long)j->leaves);
    for (; j->n_micro < k; j->n_micro++)  /* a store per node, kept */
        if ((st = keel_grads_new(j->vs, &j->micro_g[j->n_micro])) != KEEL_OK)
            return st;
    for (int c = 0; c < k; c++) {
        j->node_off[c] = (size_t)nodes[c].lo * piece;
        j->node_len[c] = (size_t)(nodes[c].hi - nodes[c].lo) * piece;
    }
    j->n_nodes = k;
    j->el_examples = (size_t)(hi - lo) * piece;
    keel__log(KEEL_LOG_INFO, "elastic: replica %d of %d live (membership "
              "epoch %lld): leaves [%lld, %lld) of %lld, %d node sum(s)",
              pos, count, (long long)epoch, (long long)lo, (long long)hi,
              (long long)j->leaves, k);
    return keel_cluster_backend_set_micro(j->worker, j->micro_g, k);
}

keel_status
keel__job_step(void *ctx, keel_step *stp)
{
    keel__job *j = ctx;
    const keel_batch *b = keel_step_batch(stp);
    keel_step_stats stats;
    keel_batch slice;
    keel_status st;
    if (b == NULL)
        return keel__fail(KEEL_EINTERNAL, "train step: no batch was fed");
    if (keel_step_num_replicas(stp) > 1)
        return replica_step(j, stp, b);
    /* one replica only: mirrored replicas run on several threads, and no
     * local-step rule runs mirrored */
    j->own_step = keel_step_global_step(stp) + 1;
    if (j->own_zeroing && j->hw == NULL &&
        j->zeroed != keel_step_grads(stp))
        keel_grads_zero(keel_step_grads(stp));
    j->zeroed = NULL;
    if (j->kfac_role == 2)              /* an inverse worker: no batch */
        return keel_step_set_value(stp, "loss", 0.0);
    if (j->elastic) {
        if ((st = elastic_division(j)) != KEEL_OK)
            return st;
        if (!j->el_member)
            return keel_step_set_value(stp, "loss", 0.0);
    }
    if (j->slice_len > 0) {
        if (j->slice_off + j->slice_len > b->n)
            return keel__fail(KEEL_EINTERNAL, "this rank's examples [%zu, "
                              "+%zu) of a batch of %zu", j->slice_off,
                              j->slice_len, b->n);
        slice = batch_slice(b, j->slice_off, j->slice_len,
                            keel_dataset_example_size(j->ds));
        b = &slice;
    }
    if ((st = batch_step(j, stp, b, &stats)) != KEEL_OK)
        return st;
    if (j->worker != NULL &&
        (st = keel_grads_set_examples(keel_step_grads(stp), (int64_t)b->n))
        != KEEL_OK)
        return st;
    if (j->kfac != NULL && j->kfac_observes &&
        (st = keel_kfac_observe(j->kfac, keel_step_vars(stp), b,
                                keel_step_global_step(stp))) != KEEL_OK)
        return st;
    j->examples += j->elastic ? (int64_t)j->el_examples : (int64_t)b->n;
    return step_values(j, stp, &stats);
}

keel_status
keel__job_apply(void *ctx, keel_vars *vs, keel_grads *g, int64_t global_step)
{
    keel__job *j = ctx;
    keel_status st;
    if (j->kfac != NULL) {
        j->zeroed = NULL;            /* keel__job_step zeroes them */
        return keel_kfac_apply(j->kfac, vs, g, global_step);
    }
    if (!j->own_zeroing)              /* mirrored: on the replicas' threads */
        return keel__optimizer_apply_pooled(j->opt, vs, g, global_step, 0,
                                            j->replicas > 1 ? j->rpool
                                                            : NULL);
    /* zeroing g as the update passes saves the next step a pass over it */
    st = keel__optimizer_apply_pooled(j->opt, vs, g, global_step, 1,
                                      keel__model_pool(j->model));
    j->zeroed = st == KEEL_OK ? g : NULL;
    return st;
}

/* kfac.distributed = chief: the chief's update of a sync step, with the
 * step's mean gradient from the ps (keel_cluster_config.chief_apply). */
keel_status
keel__job_chief_apply(void *ctx, keel_vars *vs, keel_grads *mean,
                int64_t global_step)
{
    keel__job *j = ctx;
    return keel_kfac_apply(j->kfac, vs, mean, global_step);
}

keel_status
keel__job_init(void *ctx, keel_vars *vs)
{
    keel__job *j = ctx;
    return keel_model_init_vars(j->model, vs, j->seed);
}

keel_status
keel__job_feed(void *ctx, int64_t global_step, const void **batch)
{
    keel__job *j = ctx;
    (void)global_step;      /* the iterator's state is in the checkpoint */
    keel_status st = keel_data_iter_next(j->it, &j->batch);
    if (st != KEEL_OK)
        return st;
    *batch = &j->batch;
    return KEEL_OK;
}

keel_status
keel__job_meta(void *ctx, keel_ckpt_meta *meta)
{
    keel__job *j = ctx;
    size_t len = 0;
    keel_status st = keel_data_iter_state(j->it, j->iter_state,
                                              sizeof j->iter_state, &len);
    if (st != KEEL_OK)
        return st;
    j->blob.name = ITER_BLOB;
    j->blob.data = j->iter_state;
    j->blob.size = len;
    meta->blobs = &j->blob;
    meta->n_blobs = 1;
    meta->config_text = j->config_dump;
    meta->topology = j->topology;
    meta->architecture = j->arch_dump;
    /* a save at the end of an epoch save_epochs asks for is named by it */
    if (j->save_epochs > 0 && j->steps_per_epoch > 0) {
        int64_t g = keel_vars_global_step(j->vs);
        if (g > 0 && g % j->steps_per_epoch == 0 &&
            (g / j->steps_per_epoch) % j->save_epochs == 0)
            meta->epoch = g / j->steps_per_epoch;
    }
    return KEEL_OK;
}

keel_status
keel__job_restore(void *ctx, const keel_ckpt_info *info)
{
    keel__job *j = ctx;
    size_t size = 0;
    const void *blob = keel_ckpt_info_blob(info, ITER_BLOB, &size);
    j->restored = 1;
    snprintf(j->restored_from, sizeof j->restored_from, "%s/%s-%lld.h5",
             keel_config_str(j->cfg, "checkpoint.dir"),
             keel_config_str(j->cfg, "checkpoint.basename"),
             (long long)info->global_step);
    if (blob == NULL) {
        keel__log(KEEL_LOG_WARN, "%s has no data-iterator state: the data "
                  "restarts from the first example of epoch 0",
                  j->restored_from);
        return KEEL_OK;
    }
    return keel_data_iter_set_state(j->it, blob, size);
}
