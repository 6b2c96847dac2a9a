/* model_run.c - running a model on a batch: forward and backward passes
 * over the batch's pieces, spread over the model's threads (dense-only
 * models in fixed column halves), the pieces' gradients added along one
 * reduction tree; the train step, eval and predict; and the passes K-FAC
 * reads (its factor statistics, the last step's inputs and output
 * gradients). */
#include <config.h>

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <keel/train.h>
#include "util.h"
#include "model_int.h"

/* train_int.h; DIRECT_MAX_BATCH in model_int.h says why piece 0 goes
 * straight into the caller's grads. */
int keel__grads_direct = 1;

static keel_status
check_batch(const keel_model *m, const keel_batch *b, const char *what)
{
    if (b == NULL || b->x == NULL || b->y == NULL)
        return keel__fail(KEEL_EINVAL, "model %s: NULL batch", what);
    if (b->n < 1 || b->n > (size_t)m->cfg.max_batch)
        return keel__fail(KEEL_EINVAL, "model %s: batch of %zu examples "
                          "(1..max_batch %lld)", what, b->n,
                          (long long)m->cfg.max_batch);
    for (size_t i = 0; i < b->n; i++)
        if (b->y[i] < 0 || b->y[i] >= m->cfg.classes)
            return keel__fail(KEEL_EINVAL, "model %s: label %d of example "
                              "%zu outside [0, %lld)", what, (int)b->y[i], i,
                              (long long)m->cfg.classes);
    return KEEL_OK;
}

static void
forward(keel_model *m, lbuf *buf, const float *x, size_t n)
{
    const float *in = x;
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        lbuf *B = &buf[i];
        if (L->kind == L_DENSE) {
            keel__dense_forward(in, n, L->din, L->dout,
                                keel_var_tensor(L->w)->data, NULL, B->y);
            keel__bias_act_forward(L->act, B->y, n, L->dout,
                                   keel_var_tensor(L->b)->data);
        } else if (L->kind == L_CONV) {
            keel__conv_forward(&L->cg, in, n, keel_var_tensor(L->w)->data,
                               NULL, B->col, B->y);
            if (!L->fused)
                keel__bias_act_forward(L->act, B->y,
                                       n * L->cg.oh * L->cg.ow, L->cg.cout,
                                       keel_var_tensor(L->b)->data);
        } else {
            layer *P = i > 0 ? &m->l[i - 1] : NULL;
            keel__pool_forward(&L->pg, in, n, B->y, B->arg);
            if (P != NULL && P->fused)
                keel__bias_act_forward(P->act, B->y,
                                       n * L->pg.oh * L->pg.ow, L->pg.c,
                                       keel_var_tensor(P->b)->data);
        }
        in = B->y;
    }
}

/* Where a backward pass puts what it computes of the layers with
 * parameters: their gradients (kfac NULL), or K-FAC's factor statistics
 * (the upper triangles of sum a a^T and sum g g^T into A[f], G[f] for the
 * f-th such layer, added when accumulate; no parameter gradients). */
typedef struct kfac_sink {
    int accumulate;
    float *const *A, *const *G;
} kfac_sink;

/* Backward through every layer of one piece; dlogits already in place.
 * Parameter gradients are overwritten in g, except that with direct (piece
 * 0) dense layers add theirs straight into it (sgemm beta 1); with kfac,
 * the factor statistics instead (g and direct unused). */
static void
backward(keel_model *m, lbuf *buf, lgrad *g, const float *x, size_t n,
         keel_grads *direct, const kfac_sink *kfac)
{
    int f = 0;
    for (int i = 0; i < m->nl; i++)
        f += m->l[i].w != NULL;
    for (int i = m->nl - 1; i >= 0; i--) {
        layer *L = &m->l[i];
        lbuf *B = &buf[i];
        layer *P = i > 0 ? &m->l[i - 1] : NULL;
        const float *in = i > 0 ? buf[i - 1].y : x;
        float *dx = i > 0 ? buf[i - 1].dy : NULL;
        if (L->act != KEEL_ACT_NONE && !L->fused)
            keel__act_backward(L->act, B->y, B->dy, n * L->out_size);
        if (L->kind == L_POOL && P != NULL && P->fused) {
            /* the conv's activation and bias live on the pooled output */
            keel__act_backward(P->act, B->y, B->dy, n * L->out_size);
            if (kfac == NULL)
                keel__col_sums(B->dy, n * L->pg.oh * L->pg.ow, L->pg.c,
                               g[i - 1].db);
        }
        if (L->kind == L_POOL) {
            keel__pool_backward(&L->pg, B->dy, n, B->arg, dx);
            continue;
        }
        f--;
        if (kfac != NULL && L->kind == L_DENSE) {
            keel__cov_add(in, n, L->din, L->din, 1, kfac->accumulate,
                          kfac->A[f]);
            keel__cov_add(B->dy, n, L->dout, L->dout, 0, kfac->accumulate,
                          kfac->G[f]);
            if (dx != NULL)
                keel__sgemm(0, 1, n, L->din, L->dout, 1.0f, B->dy, L->dout,
                            keel_var_tensor(L->w)->data, L->dout, 0.0f, dx,
                            L->din);
        } else if (kfac != NULL) {
            keel__conv_patch_cov(&L->cg, in, n, B->col, 1, kfac->accumulate,
                                 kfac->A[f]);
            keel__cov_add(B->dy, n * L->cg.oh * L->cg.ow, L->cg.cout,
                          L->cg.cout, 0, kfac->accumulate, kfac->G[f]);
            if (dx != NULL)
                keel__conv_backward_dx(&L->cg, n, B->dy,
                                       keel_var_tensor(L->w)->data, B->col,
                                       dx);
        } else if (L->kind == L_DENSE && direct != NULL)
            keel__dense_backward(in, B->dy, n, L->din, L->dout,
                                 keel_var_tensor(L->w)->data,
                                 keel_grads_at(direct,
                                               keel_var_index(L->w))->data,
                                 keel_grads_at(direct,
                                               keel_var_index(L->b))->data,
                                 dx, 1);
        else if (L->kind == L_DENSE)
            keel__dense_backward(in, B->dy, n, L->din, L->dout,
                                 keel_var_tensor(L->w)->data, g[i].dw,
                                 g[i].db, dx, 0);
        else
            keel__conv_backward(&L->cg, in, n, B->dy,
                                keel_var_tensor(L->w)->data, B->col, 1,
                                g[i].dw, L->fused ? NULL : g[i].db, dx);
    }
}

enum { JOB_STEP, JOB_EVAL, JOB_PREDICT };

/* Dense-only models compute every dense layer in two fixed column halves
 * (of the outputs for y, dw and db; of the inputs for dx) on any thread
 * count, so two model threads share one piece and the bits never depend on
 * which thread ran a half (sgemm rounds a column by its call's shape).
 * Dimensions below DENSE_SPLIT_MIN are one half and an empty one. */
#define DENSE_SPLIT_MIN 64

static void
dense_half(size_t dim, int h, size_t *lo, size_t *hi)
{
    size_t mid = dim >= DENSE_SPLIT_MIN ? ((dim / 2 + 15) & ~(size_t)15)
                                        : dim;
    *lo = h == 0 ? 0 : mid;
    *hi = h == 0 ? mid : dim;
}

/* One model call spread over the pool: tasks are taken in any order by any
 * thread; each task's result lands in its own place. */
typedef struct job {
    keel_model *m;
    int what;
    const keel_batch *batch;
    size_t npieces;
    float scale;                 /* 1 / global batch size */
    float *probs;
    keel_grads *grads;           /* JOB_STEP: the caller's */
    keel_grads *direct;          /* JOB_STEP: piece 0's dense grads go
                                  * straight into the caller's grads */
    size_t base;                 /* task i is piece base + i */
    int ntasks;
    int nthreads;
    _Atomic int next;            /* next task */
    keel__spin_barrier bar;      /* the column halves' layer barrier */
    keel_optimizer *opt;         /* JOB_STEP: applied to grads in the same
                                  * pool run (keel__optimizer_begin done),
                                  * or NULL */
} job;

/* The end of a piece's forward for its rows [r0, r1): probabilities
 * (predict), or each row's loss and correct flag and (for a step) its
 * dlogits. Rows are independent: any split of the rows over threads gives
 * the same bits; sum_stats adds the rows' losses in row order. */
static void
finish_rows(job *j, lbuf *buf, size_t lo, size_t r0, size_t r1)
{
    keel_model *m = j->m;
    lbuf *last = &buf[m->nl - 1];
    size_t k = m->l[m->nl - 1].dout;
    if (j->what == JOB_PREDICT) {
        for (size_t i = r0; i < r1; i++) {
            const float *z = last->y + i * k;
            float *pr = j->probs + (lo + i) * k;
            float mx = z[0];
            double sum = 0.0;
            for (size_t c = 1; c < k; c++)
                mx = z[c] > mx ? z[c] : mx;
            for (size_t c = 0; c < k; c++)
                sum += exp((double)z[c] - (double)mx);
            for (size_t c = 0; c < k; c++)
                pr[c] = (float)(exp((double)z[c] - (double)mx) / sum);
        }
        return;
    }
    for (size_t i = r0; i < r1; i++) {
        int64_t ok = 0;
        keel__softmax_xent(last->y + i * k, j->batch->y + lo + i, 1, k,
                           j->scale,
                           j->what == JOB_STEP ? last->dy + i * k : NULL,
                           &m->row_loss[lo + i], &ok);
        m->row_ok[lo + i] = (unsigned char)ok;
    }
}

static void
finish_piece(job *j, lbuf *buf, size_t lo, size_t n)
{
    finish_rows(j, buf, lo, 0, n);
}

/* Piece p of a dense-only model in column halves: thread t of T computes
 * the halves h with h % T == t (T = 1: all of them). When T > 1 a barrier
 * follows every layer whose outputs the next reads in full: each forward
 * layer (the last one's merged with the dlogits' when it is a single
 * half: its thread finishes every row), and each backward dx but the
 * second layer's (the first layer's dw reads only its own half of it).
 * For a step, backward into g, or piece 0's straight into the caller's
 * grads. */
static void
dense_piece_part(job *j, lbuf *buf, int t, int T, size_t p, lgrad *g)
{
    keel_model *m = j->m;
    size_t lo = p * m->piece;
    size_t hi = lo + m->piece < j->batch->n ? lo + m->piece : j->batch->n;
    size_t n = hi - lo, c0, c1;
    const float *x = j->batch->x + lo * m->l[0].in_size;
    keel_grads *direct = p == 0 ? j->direct : NULL;
    /* the last layer in one half: that thread also finishes its rows */
    int last_one = m->l[m->nl - 1].dout < DENSE_SPLIT_MIN;
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        const float *in = i > 0 ? buf[i - 1].y : x;
        const float *w = keel_var_tensor(L->w)->data;
        const float *b = keel_var_tensor(L->b)->data;
        for (int h = t; h < 2; h += T) {
            dense_half(L->dout, h, &c0, &c1);
            if (c0 == c1)
                continue;
            keel__dense_forward_cols(in, n, L->din, L->dout, w, buf[i].y, c0,
                                     c1);
            keel__bias_act_forward_ld(L->act, buf[i].y + c0, n, c1 - c0,
                                      L->dout, b + c0);
        }
        if (T > 1 && !(last_one && i == m->nl - 1))
            keel__spin_barrier_wait(&j->bar);
    }
    /* the rows' losses and dlogits: any split of the rows gives the same
     * bits; two fixed row halves, or all of them on the thread that
     * computed the single-half last layer */
    if (last_one) {
        if (t == 0)
            finish_rows(j, buf, lo, 0, n);
    } else {
        for (int h = t; h < 2; h += T)
            finish_rows(j, buf, lo, h == 0 ? 0 : n / 2, h == 0 ? n / 2 : n);
    }
    if (j->what != JOB_STEP)
        return;
    if (T > 1)
        keel__spin_barrier_wait(&j->bar);       /* dlogits */
    for (int i = m->nl - 1; i >= 0; i--) {
        layer *L = &m->l[i];
        layer *P = i > 0 ? &m->l[i - 1] : NULL;
        const float *in = i > 0 ? buf[i - 1].y : x;
        const float *w = keel_var_tensor(L->w)->data;
        float *dw = g[i].dw, *db = g[i].db;
        if (direct != NULL) {
            dw = keel_grads_at(direct, keel_var_index(L->w))->data;
            db = keel_grads_at(direct, keel_var_index(L->b))->data;
        }
        for (int h = t; h < 2; h += T) {
            dense_half(L->dout, h, &c0, &c1);
            if (c0 < c1)
                keel__dense_backward_cols(in, buf[i].dy, n, L->din, L->dout,
                                          dw, db, c0, c1, direct != NULL);
        }
        if (P == NULL)
            break;
        /* dx, and the previous layer's activation gradient, by input
         * half: the same halves as that layer's outputs, so its dw below
         * reads only what this thread wrote; its dx needs the barrier */
        for (int h = t; h < 2; h += T) {
            dense_half(L->din, h, &c0, &c1);
            if (c0 == c1)
                continue;
            keel__dense_dx_cols(buf[i].dy, n, L->din, L->dout, w,
                                buf[i - 1].dy, c0, c1);
            if (P->act != KEEL_ACT_NONE)
                keel__act_backward_ld(P->act, buf[i - 1].y + c0,
                                      buf[i - 1].dy + c0, n, c1 - c0, L->din);
        }
        if (T > 1 && i > 1)
            keel__spin_barrier_wait(&j->bar);
    }
}

/* Forward (and for a step, backward into g) of piece p on thread t. */
static void
run_piece(job *j, int t, size_t p, lgrad *g)
{
    keel_model *m = j->m;
    lbuf *buf = m->buf[t];
    size_t lo = p * m->piece, hi, n;
    const float *x;
    if (m->is_dense_only) {
        dense_piece_part(j, buf, 0, 1, p, g);
        return;
    }
    hi = lo + m->piece < j->batch->n ? lo + m->piece : j->batch->n;
    n = hi - lo;
    x = j->batch->x + lo * m->l[0].in_size;
    forward(m, buf, x, n);
    finish_piece(j, buf, lo, n);
    if (j->what == JOB_STEP)
        backward(m, buf, g, x, n, p == 0 ? j->direct : NULL, NULL);
}

/* A dense-only model's only piece, its column halves over the threads;
 * then, for a fused step, thread t's share of the optimizer's update once
 * every gradient is final and no thread reads a weight any more. */
static void
halves_worker(void *ctx, int t)
{
    job *j = ctx;
    dense_piece_part(j, j->m->buf[0], t, j->nthreads, 0, j->m->slot[0]);
    if (j->opt != NULL) {
        keel__spin_barrier_wait(&j->bar);
        keel__optimizer_part(j->opt, t, j->nthreads);
    }
}

static void
opt_worker(void *ctx, int t)
{
    job *j = ctx;
    keel__optimizer_part(j->opt, t, j->nthreads);
}

static void
job_worker(void *ctx, int t)
{
    job *j = ctx;
    int task;
    while ((task = j->next++) < j->ntasks)
        run_piece(j, t, j->base + (size_t)task,
                  j->what == JOB_STEP ? j->m->slot[task] : NULL);
}

/* dst[lo, hi) = the round's pieces added along the reduction tree
 * (keel__tree_sum) whose leaf 0 is dst + slot 0 (or dst alone when piece
 * 0 went straight into it) and leaf i the slot i: for a round onto zero
 * gradients, the same bits as any split of the round into runs of pieces
 * that are tree nodes, whose sums are added later along the same tree
 * (mirrored replicas, cluster workers). Whichever thread does which
 * range. */
static void
reduce_range(float *dst, float *const *src, int S, int has_first,
             size_t lo, size_t hi)
{
    keel__tree_node nodes[MAX_SLOTS + 1];
    const float *parts[MAX_SLOTS + 1];
    int k = 0;
    if (lo >= hi)
        return;
    if (!has_first)
        keel__add_into(dst + lo, src[0] + lo, hi - lo);
    parts[k] = dst;
    nodes[k].lo = 0;
    nodes[k].hi = 1;
    k++;
    for (int s = 1; s < S + has_first; s++, k++) {
        parts[k] = src[s - has_first];
        nodes[k].lo = k;
        nodes[k].hi = k + 1;
    }
    if (k > 1)
        (void)keel__tree_sum(k, nodes, parts, k, dst, lo, hi);
}

/* Thread t's share of every parameter gradient: slots added into grads. */
static void
reduce_worker(void *ctx, int t)
{
    job *j = ctx;
    keel_model *m = j->m;
    int S = j->ntasks, T = j->nthreads;
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        float *src[MAX_SLOTS];
        keel_tensor *gw, *gb;
        size_t cw, cb;
        int s0 = L->kind == L_DENSE && j->direct != NULL && j->base == 0;
        if (L->w == NULL || s0 >= S)
            continue;                /* none, or piece 0 already added */
        gw = keel_grads_at(j->grads, keel_var_index(L->w));
        gb = keel_grads_at(j->grads, keel_var_index(L->b));
        cw = gw->count;
        cb = gb->count;
        for (int s = s0; s < S; s++)
            src[s - s0] = m->slot[s][i].dw;
        /* ranges in multiples of 16 floats (one cache line) */
        reduce_range(gw->data, src, S - s0, s0,
                     (cw * (size_t)t / (size_t)T) & ~(size_t)15,
                     t + 1 == T ? cw
                                : (cw * (size_t)(t + 1) / (size_t)T) &
                                      ~(size_t)15);
        if (t == 0) {
            for (int s = s0; s < S; s++)
                src[s - s0] = m->slot[s][i].db;
            reduce_range(gb->data, src, S - s0, s0, 0, cb);
        }
    }
}

/* The optimizer's update (keel__optimizer_begin done) in a run of its own,
 * or none for opt NULL. */
static void
run_opt(keel_model *m, job *j, keel_optimizer *opt)
{
    if (opt == NULL)
        return;
    j->opt = opt;
    j->nthreads = keel__pool_threads(m->pool);
    if (j->nthreads > 1)
        keel__pool_run(m->pool, opt_worker, j);
    else
        opt_worker(j, 0);
}

/* Cut the batch into pieces and run them over the pool: evaluation all at
 * once; a step MAX_SLOTS pieces at a time, each round's slots added into
 * grads before the next (piece 0's dense gradients straight into grads). */
static void
run_job(keel_model *m, job *j, int what, const keel_batch *batch,
        float scale, float *probs, keel_grads *grads, keel_optimizer *opt)
{
    size_t np = (batch->n + m->piece - 1) / m->piece;
    /* a step of one piece leaves its activations and output gradients in
     * buf[0] (one thread's piece, or the column halves' shared one) */
    m->last_io = what == JOB_STEP && m->is_dense_only && np == 1;
    m->last_x = batch->x;
    m->last_n = batch->n;
    m->last_grads = grads;
    *j = (job){ .m = m, .what = what, .batch = batch, .npieces = np,
                .scale = scale, .probs = probs, .grads = grads,
                .nthreads = keel__pool_threads(m->pool) };
    if (what == JOB_STEP)
        j->direct = keel__grads_direct ? grads : NULL;
    if (m->is_dense_only && np == 1 && j->nthreads > 1) {
        j->bar.n = j->nthreads;
        /* the optimizer inside this run when the halves are the gradient */
        j->opt = j->direct != NULL ? opt : NULL;
        keel__pool_run(m->pool, halves_worker, j);
        if (what == JOB_STEP && j->direct == NULL) {
            j->ntasks = 1;           /* the halves went into slot 0 */
            j->nthreads = 1;
            reduce_worker(j, 0);
        }
        if (j->opt == NULL)
            run_opt(m, j, opt);
        return;
    }
    if (what != JOB_STEP) {
        j->ntasks = (int)np;
        j->next = 0;
        if (np == 1)
            job_worker(j, 0);
        else
            keel__pool_run(m->pool, job_worker, j);
        return;
    }
    for (size_t base = 0; base < np; base += MAX_SLOTS) {
        j->base = base;
        j->ntasks = np - base < MAX_SLOTS ? (int)(np - base) : MAX_SLOTS;
        j->next = 0;
        j->nthreads = keel__pool_threads(m->pool);
        if (j->ntasks == 1 || j->nthreads == 1)
            job_worker(j, 0);
        else
            keel__pool_run(m->pool, job_worker, j);
        if (j->ntasks == 1 || j->nthreads == 1) {
            j->nthreads = 1;         /* reduce_worker: all of it here */
            reduce_worker(j, 0);
        } else {
            keel__pool_run(m->pool, reduce_worker, j);
        }
    }
    run_opt(m, j, opt);
}

static void
sum_stats(const keel_model *m, const job *j, keel_step_stats *stats)
{
    double loss = 0.0;
    int64_t correct = 0;
    /* each piece's rows in order, then the pieces in order */
    for (size_t p = 0; p < j->npieces; p++) {
        size_t lo = p * m->piece;
        size_t hi = lo + m->piece < j->batch->n ? lo + m->piece : j->batch->n;
        double piece_loss = 0.0;
        for (size_t i = lo; i < hi; i++) {
            piece_loss += m->row_loss[i];
            correct += m->row_ok[i];
        }
        loss += piece_loss;
    }
    if (stats != NULL) {
        stats->loss_sum = loss;
        stats->correct = correct;
        stats->count = (int64_t)j->batch->n;
    }
}

static keel_status
model_step_fp(keel_model *m, keel_vars *vs, const keel_batch *batch,
              int64_t global_batch_size, keel_grads *grads,
              keel_step_stats *stats, keel_optimizer *opt,
              int64_t global_step, int zero)
{
    keel_status st;
    job j;
    if (m == NULL || vs == NULL || grads == NULL)
        return keel__fail(KEEL_EINVAL, "model step: NULL argument");
    m->last_io = 0;
    if ((st = check_batch(m, batch, "step")) != KEEL_OK)
        return st;
    if (global_batch_size < (int64_t)batch->n)
        return keel__fail(KEEL_EINVAL, "model step: global batch size %lld "
                          "smaller than the batch (%zu)",
                          (long long)global_batch_size, batch->n);
    if (keel_grads_vars(grads) != vs)
        return keel__fail(KEEL_EINVAL, "model step: gradients were made "
                          "for another variable store");
    for (int i = 0; i < m->nl; i++)
        if (m->l[i].w != NULL &&
            (keel_grads_at(grads, keel_var_index(m->l[i].w)) == NULL ||
             keel_grads_at(grads, keel_var_index(m->l[i].b)) == NULL))
            return keel__fail(KEEL_EINVAL, "model step: no gradient for "
                              "'%s'", keel_var_name(m->l[i].w));
    if (opt != NULL &&
        (st = keel__optimizer_begin(opt, vs, grads, global_step, zero)) !=
            KEEL_OK)
        return st;
    run_job(m, &j, JOB_STEP, batch, (float)(1.0 / (double)global_batch_size),
            NULL, grads, opt);
    sum_stats(m, &j, stats);
    return KEEL_OK;
}

keel_status
keel_model_step(keel_model *m, keel_vars *vs, const keel_batch *batch,
                int64_t global_batch_size, keel_grads *grads,
                keel_step_stats *stats)
{
    return KEEL__FLUSHED(model_step_fp(m, vs, batch, global_batch_size, grads,
                                       stats, NULL, 0, 0));
}

keel_status
keel__model_step_apply(keel_model *m, keel_vars *vs, const keel_batch *batch,
                       int64_t global_batch_size, keel_grads *grads,
                       keel_step_stats *stats, keel_optimizer *opt,
                       int64_t global_step, int zero)
{
    if (opt == NULL)
        return KEEL__FLUSHED(keel__fail(KEEL_EINVAL, "model step: NULL "
                                        "optimizer"));
    return KEEL__FLUSHED(model_step_fp(m, vs, batch, global_batch_size, grads,
                                       stats, opt, global_step, zero));
}

static keel_status
model_eval_fp(keel_model *m, keel_vars *vs, const keel_batch *batch,
              keel_step_stats *stats)
{
    keel_status st;
    job j;
    if (m == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "model eval: NULL argument");
    if ((st = check_batch(m, batch, "eval")) != KEEL_OK)
        return st;
    run_job(m, &j, JOB_EVAL, batch, 1.0f, NULL, NULL, NULL);
    sum_stats(m, &j, stats);
    return KEEL_OK;
}

keel_status
keel_model_eval(keel_model *m, keel_vars *vs, const keel_batch *batch,
                keel_step_stats *stats)
{
    return KEEL__FLUSHED(model_eval_fp(m, vs, batch, stats));
}

static keel_status
model_predict_fp(keel_model *m, keel_vars *vs, const keel_batch *batch,
                 float *probs)
{
    job j;
    if (m == NULL || vs == NULL || batch == NULL || batch->x == NULL ||
        probs == NULL)
        return keel__fail(KEEL_EINVAL, "model predict: NULL argument");
    if (batch->n < 1 || batch->n > (size_t)m->cfg.max_batch)
        return keel__fail(KEEL_EINVAL, "model predict: batch of %zu "
                          "examples (1..max_batch %lld)", batch->n,
                          (long long)m->cfg.max_batch);
    run_job(m, &j, JOB_PREDICT, batch, 1.0f, probs, NULL, NULL);
    return KEEL_OK;
}

keel_status
keel_model_predict(keel_model *m, keel_vars *vs, const keel_batch *batch,
                   float *probs)
{
    return KEEL__FLUSHED(model_predict_fp(m, vs, batch, probs));
}

/* ---- K-FAC statistics ---------------------------------------------------- */

int
keel__model_kfac_layers(const keel_model *m, keel__kfac_layer *out, int max)
{
    int k = 0;
    for (int i = 0; i < m->nl; i++) {
        const layer *L = &m->l[i];
        keel__kfac_layer *o;
        if (L->w == NULL)
            continue;
        if (k < max) {
            o = &out[k];
            memset(o, 0, sizeof *o);
            o->is_conv = L->kind == L_CONV;
            o->w = L->w;
            o->b = L->b;
            if (o->is_conv) {
                o->a_dim = L->cg.kh * L->cg.kw * L->cg.cin + 1;
                o->g_dim = L->cg.cout;
                o->locations = L->cg.oh * L->cg.ow;
                o->cg = L->cg;
            } else {
                o->a_dim = L->din + 1;
                o->g_dim = L->dout;
                o->locations = 1;
            }
        }
        k++;
    }
    return k;
}

/* Targets of one piece: the labels, or one draw per example from the
 * softmax of its logits (inverse CDF of a uniform in [0, 1), in double). */
void
keel__kfac_draw_targets(const float *logits, size_t n, size_t k,
                        const int32_t *labels, keel__rng *rng, int32_t *t)
{
    for (size_t i = 0; i < n; i++) {
        const float *z = logits + i * k;
        float mx = z[0];
        double sum = 0.0, u, acc = 0.0;
        size_t c;
        if (rng == NULL) {
            t[i] = labels[i];
            continue;
        }
        for (c = 1; c < k; c++)
            mx = z[c] > mx ? z[c] : mx;
        for (c = 0; c < k; c++)
            sum += exp((double)z[c] - (double)mx);
        u = (double)(keel__rng_next(rng) >> 11) * 0x1.0p-53 * sum;
        for (c = 0; c + 1 < k; c++) {
            acc += exp((double)z[c] - (double)mx);
            if (u < acc)
                break;
        }
        t[i] = (int32_t)c;
    }
}

keel_status
keel__model_kfac_stats(keel_model *m, const keel_batch *batch, keel__rng *rng,
                       int32_t *targets, int accumulate, int after_step,
                       float *const *A, float *const *G)
{
    keel_status st;
    lbuf *buf;
    size_t k_out;
    kfac_sink sink = { accumulate, A, G };
    int have_fwd;
    if ((st = check_batch(m, batch, "K-FAC statistics")) != KEEL_OK)
        return st;
    /* the step's one piece left every layer's activations in buf[0]
     * (its backward writes only the gradients) */
    have_fwd = after_step && m->last_io && batch->x == m->last_x &&
               batch->n == m->last_n;
    m->last_io = 0;
    buf = m->buf[0];
    k_out = m->l[m->nl - 1].dout;
    for (size_t lo = 0; lo < batch->n; lo += m->piece) {
        size_t n = batch->n - lo < m->piece ? batch->n - lo : m->piece;
        const float *x = batch->x + lo * m->l[0].in_size;
        double loss = 0.0;
        int64_t correct = 0;
        if (!have_fwd)
            forward(m, buf, x, n);
        keel__kfac_draw_targets(buf[m->nl - 1].y, n, k_out, batch->y + lo,
                                rng, targets + lo);
        keel__softmax_xent(buf[m->nl - 1].y, targets + lo, n, k_out, 1.0f,
                           buf[m->nl - 1].dy, &loss, &correct);
        backward(m, buf, NULL, x, n, NULL, &sink);
        sink.accumulate = 1;
    }
    return KEEL_OK;
}

int
keel__model_step_io(const keel_model *m, const keel_batch *batch, int f,
                    const keel_grads **grads, const float **in,
                    const float **dy)
{
    int k = 0;
    if (m == NULL || batch == NULL || !m->last_io || batch->x != m->last_x ||
        batch->n != m->last_n)
        return 0;
    for (int i = 0; i < m->nl; i++) {
        if (m->l[i].w == NULL || k++ != f)
            continue;
        if (m->l[i].kind != L_DENSE)
            return 0;
        *grads = m->last_grads;
        *in = i > 0 ? m->buf[0][i - 1].y : batch->x;
        *dy = m->buf[0][i].dy;
        return 1;
    }
    return 0;
}
