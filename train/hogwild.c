/* hogwild.c - Hogwild! in one process (keel/train.h): a round hands every
 * thread of a pool its own gradient and optimizer; each computes from the
 * shared store and applies to it with no lock. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/train.h>
#include "util.h"
#include "train_int.h"

#define HW_MSG 512

struct keel_hogwild {
    keel_hogwild_config cfg;
    keel_vars *vs;
    keel__pool *pool;             /* NULL with one thread */
    keel_grads *grads[KEEL_HOGWILD_MAX_THREADS];
    keel_optimizer *opt[KEEL_HOGWILD_MAX_THREADS];
    /* the current round */
    keel_hogwild_fn fn;
    void *ctx;
    int64_t step;
    keel_status st[KEEL_HOGWILD_MAX_THREADS];
    char msg[KEEL_HOGWILD_MAX_THREADS][HW_MSG];
};

void
keel_hogwild_config_init(keel_hogwild_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->threads = 1;
}

keel_status
keel_hogwild_new(const keel_hogwild_config *cfg,
                 const keel_optimizer_config *opt, keel_vars *vs,
                 keel_hogwild **out)
{
    keel_hogwild *h;
    keel_status st = KEEL_OK;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "hogwild: out is NULL");
    *out = NULL;
    if (cfg == NULL || opt == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "hogwild: NULL argument");
    if ((st = KEEL__STRUCT_CHECK(cfg, keel_hogwild_config)) != KEEL_OK ||
        (st = KEEL__STRUCT_CHECK(opt, keel_optimizer_config)) != KEEL_OK)
        return keel__wrap(st, "hogwild");
    if (cfg->threads < 1 || cfg->threads > KEEL_HOGWILD_MAX_THREADS)
        return keel__fail(KEEL_EINVAL, "hogwild: %d threads (1..%d)",
                          cfg->threads, KEEL_HOGWILD_MAX_THREADS);
    h = calloc(1, sizeof *h);
    if (h == NULL)
        return keel__fail(KEEL_ENOMEM, "hogwild");
    h->cfg = *cfg;
    h->vs = vs;
    for (int t = 0; t < cfg->threads && st == KEEL_OK; t++) {
        st = keel_grads_new(vs, &h->grads[t]);
        if (st == KEEL_OK)
            st = keel_optimizer_new(opt, &h->opt[t]);
    }
    if (st == KEEL_OK && cfg->threads > 1) {
        st = keel__pool_new(cfg->threads, &h->pool);
        if (st == KEEL_OK && keel__pool_threads(h->pool) != cfg->threads)
            st = keel__fail(KEEL_ENOMEM, "hogwild: started %d of %d "
                            "threads", keel__pool_threads(h->pool),
                            cfg->threads);
    }
    if (st != KEEL_OK) {
        keel_hogwild_free(h);
        return st;
    }
    *out = h;
    return KEEL_OK;
}

void
keel_hogwild_free(keel_hogwild *h)
{
    if (h == NULL)
        return;
    keel__pool_free(h->pool);
    for (int t = 0; t < KEEL_HOGWILD_MAX_THREADS; t++) {
        keel_grads_free(h->grads[t]);
        keel_optimizer_free(h->opt[t]);
    }
    free(h);
}

int
keel_hogwild_threads(const keel_hogwild *h)
{
    return h != NULL ? h->cfg.threads : 0;
}

static void
round_worker(void *ctx, int t)
{
    keel_hogwild *h = ctx;
    int64_t step = h->step + t;
    keel_status st = h->fn(h->ctx, t, h->grads[t], step);
    if (st == KEEL_OK)
        st = h->cfg.use_cas
            ? keel__optimizer_apply_cas(h->opt[t], h->vs, h->grads[t], step)
            : keel_optimizer_apply_and_zero(h->opt[t], h->vs, h->grads[t],
                                            step);
    else
        keel_grads_zero(h->grads[t]);
    h->st[t] = st;
    if (st != KEEL_OK)
        snprintf(h->msg[t], HW_MSG, "%s", keel_last_error());
}

keel_status
keel_hogwild_run(keel_hogwild *h, keel_hogwild_fn fn, void *ctx,
                 int64_t global_step)
{
    if (h == NULL || fn == NULL)
        return keel__fail(KEEL_EINVAL, "hogwild run: NULL argument");
    if (global_step < 0)
        return keel__fail(KEEL_EINVAL, "hogwild run: negative global step "
                          "%lld", (long long)global_step);
    h->fn = fn;
    h->ctx = ctx;
    h->step = global_step;
    if (h->pool != NULL)
        keel__pool_run(h->pool, round_worker, h);
    else
        round_worker(h, 0);
    for (int t = 0; t < h->cfg.threads; t++)
        if (h->st[t] != KEEL_OK)
            return keel__fail(h->st[t], "hogwild thread %d at step %lld: "
                              "%s", t, (long long)(global_step + t),
                              h->msg[t]);
    return KEEL_OK;
}
