/* ckpt_hook.c - CheckpointSaverHook: a checkpoint at every session creation,
 * at every timer trigger and at end (by reason), never twice for one step,
 * with listeners that can veto training; metadata blobs from the session's
 * meta_fn so data-iterator and RNG state resume exactly. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <keel/hooks.h>
#include <keel/session.h>
#include "hooks_int.h"
#include "util.h"
#include "../checkpoint/ckpt_ops.h"

#define LISTENERS_MAX 8

typedef struct ckpt_hook {
    char *dir;                       /* NULL: the session's saver */
    keel_saver_config saver_cfg;
    char *basename;
    keel_saver *own;
    keel_timer timer;
    keel_ckpt_listener listeners[LISTENERS_MAX];
    size_t n_listeners;
    int save_on_error;
    int64_t last_saved;
    int64_t n_saves;
} ckpt_hook;

static keel_status
resolve_saver(ckpt_hook *h, keel_session *s, keel_saver **out)
{
    keel_status st;
    if (h->dir == NULL) {
        *out = keel_session_saver(s);
        if (*out == NULL)
            return keel__fail(KEEL_EINVAL, "checkpoint saver hook: no dir "
                              "and the session has no checkpoint_dir");
        return KEEL_OK;
    }
    if (h->own == NULL) {
        st = keel__ckpt->saver_new(&h->saver_cfg, &h->own);
        if (st != KEEL_OK)
            return keel__wrap(st, "checkpoint saver hook: open %s", h->dir);
    }
    *out = h->own;
    return KEEL_OK;
}

/* Say what a save did: existed when the saver already had the step's
 * checkpoint (and so wrote nothing); saved is the step the checkpoint is
 * named by, step this replica's. */
static void
log_save(int existed, int64_t saved, int64_t step, const char *path)
{
    if (existed)
        keel__log(KEEL_LOG_INFO, "checkpoint for step %lld already saved: "
                  "%s", (long long)saved, path);
    else if (saved == step)
        keel__log(KEEL_LOG_INFO, "saved checkpoint for step %lld: %s",
                  (long long)saved, path);
    else
        keel__log(KEEL_LOG_INFO, "saved checkpoint for step %lld: %s (the "
                  "shared global step; this replica was at step %lld)",
                  (long long)saved, path, (long long)step);
}

/* Save at step unless already saved; *should_stop from listeners. */
static keel_status
save(ckpt_hook *h, keel_session *s, int64_t step, int *should_stop)
{
    char path[KEEL_PATH_MAX];
    keel_ckpt_meta meta;
    keel_saver *sv;
    size_t i;
    int64_t saved;
    int existed;
    keel_status st;
    if (step == h->last_saved)
        return KEEL_OK;
    st = resolve_saver(h, s, &sv);
    if (st != KEEL_OK)
        return st;
    for (i = 0; i < h->n_listeners; i++) {
        if (h->listeners[i].before_save == NULL)
            continue;
        st = h->listeners[i].before_save(h->listeners[i].ctx, s, step);
        if (st != KEEL_OK)
            return keel__wrap(st, "checkpoint listener %zu before_save", i);
    }
    st = keel_session_prepare_save(s);
    if (st != KEEL_OK)
        return st;
    /* The step the checkpoint is saved at, which names its file: the
     * backend may have brought the shared global step (a local-step
     * rule's ps count, or another replica's pushes) into the store. */
    saved = keel_vars_global_step(keel_session_vars(s));
    /* the saver's newest checkpoint (just restored, or saved by
     * keel_session_save_now): its save below writes nothing */
    existed = keel__ckpt->saver_last_step(sv) == saved;
    st = keel_session_collect_meta(s, &meta);
    if (st != KEEL_OK)
        return keel__wrap(st, "checkpoint at step %lld: meta_fn",
                          (long long)step);
    path[0] = '\0';
    st = keel_session_write_checkpoint(s, sv, &meta, path, sizeof path);
    if (st != KEEL_OK && path[0] != '\0')     /* the saver names it first */
        return keel__wrap(st, "checkpoint at step %lld (%s)",
                          (long long)step, path);
    if (st != KEEL_OK)
        return keel__wrap(st, "checkpoint at step %lld", (long long)step);
    h->last_saved = step;
    h->n_saves += !existed;
    log_save(existed, saved, step, path);
    for (i = 0; i < h->n_listeners; i++) {
        int stop = 0;
        if (h->listeners[i].after_save == NULL)
            continue;
        st = h->listeners[i].after_save(h->listeners[i].ctx, s, saved,
                                        path, &stop);
        if (st != KEEL_OK)
            return keel__wrap(st, "checkpoint listener %zu after_save", i);
        if (stop) {
            keel__log(KEEL_LOG_INFO, "A CheckpointSaverListener (%zu) "
                      "requested that training be stopped (step %lld)", i,
                      (long long)step);
            *should_stop = 1;
        }
    }
    return KEEL_OK;
}

static keel_status
ck_begin(void *ctx)
{
    ckpt_hook *h = ctx;
    size_t i;
    for (i = 0; i < h->n_listeners; i++) {
        if (h->listeners[i].begin == NULL)
            continue;
        keel_status st = h->listeners[i].begin(h->listeners[i].ctx);
        if (st != KEEL_OK)
            return keel__wrap(st, "checkpoint listener %zu begin", i);
    }
    return KEEL_OK;
}

static keel_status
ck_after_create(void *ctx, keel_session *s)
{
    ckpt_hook *h = ctx;
    int64_t gs = keel_session_global_step(s);
    int stop = 0;
    keel_status st = save(h, s, gs, &stop);
    if (st != KEEL_OK)
        return st;
    keel_timer_update(&h->timer, gs, NULL, NULL);
    if (stop)
        keel_session_request_stop(s, "checkpoint listener");
    return KEEL_OK;
}

static keel_status
ck_after_run(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    ckpt_hook *h = ctx;
    int64_t gs = keel_run_values_step_after(v);
    int stop = 0;
    keel_status st;
    if (!keel_timer_should_trigger(&h->timer, gs))
        return KEEL_OK;
    keel_timer_update(&h->timer, gs, NULL, NULL);
    st = save(h, keel_run_context_session(rc), gs, &stop);
    if (st != KEEL_OK)
        return st;
    if (stop)
        keel_run_context_request_stop(rc, "a checkpoint listener asked to "
                                      "stop");
    return KEEL_OK;
}

/* The final checkpoint: due at every end but an error's without
 * save_on_error. Its failure (or the own saver's pending async save's) is
 * the returned status, so the session's close reports it: a run whose
 * final checkpoint is not on disk has not ended well. The listeners' end
 * runs either way. */
static keel_status
ck_end(void *ctx, keel_session *s, keel_end_reason why)
{
    ckpt_hook *h = ctx;
    int64_t gs = keel_session_global_step(s);
    int stop = 0;
    size_t i;
    keel_status st = KEEL_OK, ws;
    char err[KEEL_ERR_MAX] = "";
    if (why == KEEL_END_ERROR && !h->save_on_error) {
        keel__log(KEEL_LOG_WARN, "session ended with an error at step %lld: "
                  "no final checkpoint (save_on_error is off)",
                  (long long)gs);
    } else {
        st = save(h, s, gs, &stop);
        if (st != KEEL_OK)
            snprintf(err, sizeof err, "%s", keel_last_error());
    }
    if (h->own != NULL && (ws = keel__ckpt->saver_wait(h->own)) != KEEL_OK
        && st == KEEL_OK) {
        st = ws;
        snprintf(err, sizeof err, "%s", keel_last_error());
    }
    if (st != KEEL_OK)
        keel__log(KEEL_LOG_ERROR, "final checkpoint at step %lld failed: %s",
                  (long long)gs, err);
    for (i = 0; i < h->n_listeners; i++)
        if (h->listeners[i].end != NULL)
            h->listeners[i].end(h->listeners[i].ctx, s, h->last_saved);
    if (st != KEEL_OK)
        return keel__fail(st, "final checkpoint at step %lld not saved: %s",
                          (long long)gs, err);
    return KEEL_OK;
}

static void
ck_destroy(void *ctx)
{
    ckpt_hook *h = ctx;
    if (h == NULL)
        return;
    if (h->own != NULL)
        keel__ckpt->saver_free(h->own);
    free(h->dir);
    free(h->basename);
    free(h);
}

/* after_run acts when the timer is due. A seconds timer on the real clock
 * (the MTS default, every 600 s) is idle until its deadline; on a fake
 * clock (the test's to move) it is called always, for good. */
static int
ck_wake(const void *ctx, keel_hook_wake *w)
{
    const keel_timer *t = &((const ckpt_hook *)ctx)->timer;
    if (t->every_secs > 0 && t->clock.fn == NULL && t->is_triggered
        && t->every_secs < 1e9) {
        w->after_gs = KEEL_WAKE_NEVER;
        w->after_ns = t->last_ns + (int64_t)(t->every_secs * 1e9);
        return 1;
    }
    w->after_gs = keel_timer_wake_step(t);
    return !(t->every_secs > 0 && t->clock.fn != NULL);
}

void
keel_ckpt_hook_config_init(keel_ckpt_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
}

keel_status
keel_ckpt_hook_new(const keel_ckpt_hook_config *cfg, keel_hook *out)
{
    ckpt_hook *h;
    keel_timer timer;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_ckpt_hook_config,
                            "checkpoint saver hook");
    if (st != KEEL_OK)
        return st;
    if (cfg->saver_cfg != NULL
        && (st = KEEL__STRUCT_CHECK(cfg->saver_cfg, keel_saver_config))
           != KEEL_OK)
        return keel__wrap(st, "checkpoint saver hook (saver_cfg)");
    if (cfg->n_listeners > LISTENERS_MAX
        || (cfg->n_listeners > 0 && cfg->listeners == NULL))
        return keel__fail(KEEL_EINVAL, "checkpoint saver hook: %zu listeners "
                          "(at most %d)", cfg->n_listeners, LISTENERS_MAX);
    st = keel_timer_init(&timer, cfg->save_secs, cfg->save_steps,
                         &cfg->clock);
    if (st != KEEL_OK)
        return keel__wrap(st, "checkpoint saver hook (save_secs/save_steps)");
    h = keel__hooks_new_ctx(sizeof *h, "checkpoint saver hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    h->last_saved = -1;
    h->timer = timer;
    if (cfg->saver_cfg != NULL)
        h->saver_cfg = *cfg->saver_cfg;
    else
        keel_saver_config_init(&h->saver_cfg);
    if (cfg->dir != NULL) {
        h->dir = strdup(cfg->dir);
        h->basename = h->saver_cfg.basename != NULL
                      ? strdup(h->saver_cfg.basename) : NULL;
        if (h->dir == NULL
            || (h->saver_cfg.basename != NULL && h->basename == NULL)) {
            ck_destroy(h);
            return keel__fail(KEEL_ENOMEM, "checkpoint saver hook: copy dir");
        }
        h->saver_cfg.dir = h->dir;
        h->saver_cfg.basename = h->basename;
    }
    if (cfg->n_listeners > 0)
        memcpy(h->listeners, cfg->listeners,
               cfg->n_listeners * sizeof *h->listeners);
    h->n_listeners = cfg->n_listeners;
    h->save_on_error = cfg->save_on_error;
    keel__hooks_fill(out, "checkpoint_saver", h, KEEL_HOOK_CHECKPOINT,
                     ck_destroy);
    out->begin = ck_begin;
    out->after_create_session = ck_after_create;
    out->after_run = ck_after_run;
    out->end = ck_end;
    out->wake = ck_wake;
    out->flags = KEEL_HOOK_NO_STEP_TIME;
    return KEEL_OK;
}

int64_t
keel_ckpt_hook_save_count(const keel_hook *hk)
{
    if (hk == NULL || hk->kind != KEEL_HOOK_CHECKPOINT || hk->ctx == NULL)
        return 0;
    return ((const ckpt_hook *)hk->ctx)->n_saves;
}

int64_t
keel_ckpt_hook_last_step(const keel_hook *hk)
{
    if (hk == NULL || hk->kind != KEEL_HOOK_CHECKPOINT || hk->ctx == NULL)
        return -1;
    return ((const ckpt_hook *)hk->ctx)->last_saved;
}
