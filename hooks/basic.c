/* basic.c - the small standard hooks: LoggingTensorHook, StopAtStepHook,
 * NanTensorHook, GlobalStepWaiterHook, FinalOpsHook and FeedFnHook. All of
 * them read the global step from the step's run values (no extra reads). */
#include <config.h>

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "defaults.h"
#include "hooks_int.h"
#include "util.h"
#include <keel/hooks.h>
#include <keel/session.h>

void *
keel__hooks_new_ctx(size_t size, const char *who)
{
    void *ctx = calloc(1, size);
    if (ctx == NULL)
        keel__fail(KEEL_ENOMEM, "%s: %zu bytes", who, size);
    return ctx;
}

void
keel__hooks_fill(keel_hook *out, const char *name, void *ctx,
                 keel_hook_kind kind, void (*destroy)(void *))
{
    KEEL__STRUCT_INIT(out);
    out->name = name;
    out->ctx = ctx;
    out->destroy = destroy;
    out->kind = kind;
}

keel_status
keel__hooks_check_names(const char *const *names, size_t n, const char *who)
{
    if (n > 0 && names == NULL)
        return keel__fail(KEEL_EINVAL, "%s: names is NULL", who);
    if (n == 0 || n > KEEL__HOOKS_NAMES_MAX)
        return keel__fail(KEEL_EINVAL, "%s: n_names %zu (1..%d)", who, n,
                          KEEL__HOOKS_NAMES_MAX);
    for (size_t i = 0; i < n; i++)
        if (names[i] == NULL || strlen(names[i]) >= KEEL_VALUE_NAME_MAX)
            return keel__fail(KEEL_EINVAL, "%s: names[%zu] is NULL or too "
                              "long", who, i);
    return KEEL_OK;
}

void
keel__hooks_copy_names(char (*dst)[KEEL_VALUE_NAME_MAX],
                       const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        memcpy(dst[i], names[i], strlen(names[i]) + 1);
}

keel_status
keel__hooks_request_names(keel_run_context *rc,
                          char (*names)[KEEL_VALUE_NAME_MAX], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        keel_status st = keel_run_context_request(rc, names[i]);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* ---- LoggingTensorHook -------------------------------------------------- */

typedef struct logging_hook {
    char names[KEEL__HOOKS_NAMES_MAX][KEEL_VALUE_NAME_MAX];
    size_t n;
    keel_timer timer;
    int at_end;
    int64_t iter;
    int is_triggered;         /* this step */
    double last[KEEL__HOOKS_NAMES_MAX];
    int has_last;
} logging_hook;

static keel_status
logging_before(void *ctx, keel_run_context *rc)
{
    logging_hook *h = ctx;
    h->iter += keel_run_context_skipped(rc);           // iterations the session skipped
    h->is_triggered = keel_timer_should_trigger(&h->timer, h->iter);
    if (!h->is_triggered && !h->at_end)
        return KEEL_OK;
    return keel__hooks_request_names(rc, h->names, h->n);
}

static void
log_values(logging_hook *h, const double *vals, double elapsed, int has_dt)
{
    char line[1024];
    size_t i, len = 0;
    line[0] = '\0';
    for (i = 0; i < h->n && len < sizeof line; i++) {
        int w = snprintf(line + len, sizeof line - len, "%s%s = %g",
                         i > 0 ? ", " : "", h->names[i], vals[i]);
        if (w > 0)
            len += (size_t)w;
    }
    if (has_dt && len < sizeof line)
        snprintf(line + len, sizeof line - len, " (%.3f sec)", elapsed);
    keel__log(KEEL_LOG_INFO, "%s", line);
}

static keel_status
logging_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    logging_hook *h = ctx;
    size_t i;
    (void)rc;
    h->iter += keel_run_values_skipped(v);
    if (h->is_triggered || h->at_end) {
        for (i = 0; i < h->n; i++)
            h->last[i] = keel_run_values_get(v, h->names[i]);
        h->has_last = 1;
    }
    if (h->is_triggered) {
        double dt = 0;
        int has_dt = keel_timer_update(&h->timer, h->iter, &dt, NULL);
        log_values(h, h->last, dt, has_dt);
    }
    // Consumed: until the next before_run decides, after_run only counts.
    h->is_triggered = 0;
    h->iter++;
    return KEEL_OK;
}

static keel_status
logging_end(void *ctx, keel_session *s, keel_end_reason why)
{
    logging_hook *h = ctx;
    (void)s;
    (void)why;
    if (h->at_end && h->has_last)
        log_values(h, h->last, 0, 0);
    return KEEL_OK;
}

/* With an iteration timer (and no at_end) the hook acts from its next due
 * iteration: its after_run only counts iterations, which the session hands
 * it as skipped steps. With at_end (a per-step duty) or seconds: always. */
static int
logging_wake(const void *ctx, keel_hook_wake *w)
{
    const logging_hook *lh = ctx;
    int64_t due;
    if (lh->at_end || lh->timer.every_secs > 0 || lh->timer.is_never)
        return 0;
    due = keel_timer_wake_step(&lh->timer);
    w->before_gs = KEEL_WAKE_NEVER;
    w->before_iters = due == KEEL_WAKE_ALWAYS ? 0
                      : due == KEEL_WAKE_NEVER ? KEEL_WAKE_NEVER
                      : due - lh->iter;
    w->after_gs = lh->is_triggered ? KEEL_WAKE_ALWAYS : KEEL_WAKE_NEVER;
    w->after_needs_before = 1;
    return 1;
}

void
keel_logging_hook_config_init(keel_logging_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
}

keel_status
keel_logging_hook_new(const keel_logging_hook_config *cfg, keel_hook *out)
{
    logging_hook *h;
    keel_timer timer;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_logging_hook_config,
                            "logging hook");
    if (st != KEEL_OK)
        return st;
    st = keel__hooks_check_names(cfg->names, cfg->n_names, "logging hook");
    if (st != KEEL_OK)
        return st;
    if (cfg->every_n_iter < 0)
        return keel__fail(KEEL_EINVAL, "logging hook: every_n_iter %lld <= 0",
                          (long long)cfg->every_n_iter);
    if (cfg->at_end && cfg->every_n_iter == 0 && cfg->every_n_secs <= 0) {
        keel_timer_init_never(&timer);
    } else {
        st = keel_timer_init(&timer, cfg->every_n_secs, cfg->every_n_iter,
                             &cfg->clock);
        if (st != KEEL_OK)
            return keel__wrap(st, "logging hook (every_n_iter/every_n_secs)");
    }
    h = keel__hooks_new_ctx(sizeof *h, "logging hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    keel__hooks_copy_names(h->names, cfg->names, cfg->n_names);
    h->n = cfg->n_names;
    h->at_end = cfg->at_end;
    h->timer = timer;
    keel__hooks_fill(out, "logging_tensor", h, KEEL_HOOK_LOGGING, free);
    out->before_run = logging_before;
    out->after_run = logging_after;
    out->end = logging_end;
    out->wake = logging_wake;
    out->flags = KEEL_HOOK_NO_STEP_TIME;
    return KEEL_OK;
}

/* ---- StopAtStepHook ----------------------------------------------------- */

typedef struct stop_hook {
    int64_t num_steps;
    int64_t last_step;
    int is_resolved;
} stop_hook;

static keel_status
stop_after_create(void *ctx, keel_session *s)
{
    stop_hook *h = ctx;
    int64_t gs = keel_session_global_step(s);
    if (!h->is_resolved) {
        h->last_step = gs + h->num_steps;
        h->is_resolved = 1;
        keel__log(KEEL_LOG_INFO, "stop_at_step: %lld steps from global step "
                  "%lld: last step %lld", (long long)h->num_steps,
                  (long long)gs, (long long)h->last_step);
    }
    if (gs >= h->last_step) {
        char why[128];
        snprintf(why, sizeof why, "stop_at_step: global step %lld already "
                 ">= last step %lld", (long long)gs, (long long)h->last_step);
        keel_session_request_stop(s, why);
    }
    return KEEL_OK;
}

static keel_status
stop_after_run(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    stop_hook *h = ctx;
    /* after_create_session ran first and fixed last_step */
    assert(h->is_resolved);
    if (keel_run_values_step_after(v) >= h->last_step) {
        char why[128];
        snprintf(why, sizeof why, "global step %lld reached last step %lld",
                 (long long)keel_run_values_step_after(v),
                 (long long)h->last_step);
        keel_run_context_request_stop(rc, why);
    }
    return KEEL_OK;
}

/* after_run acts only from the last step on. */
static int
stop_wake(const void *ctx, keel_hook_wake *w)
{
    const stop_hook *sh = ctx;
    w->after_gs = sh->is_resolved ? sh->last_step : KEEL_WAKE_ALWAYS;
    return 1;
}

void
keel_stop_at_step_hook_config_init(keel_stop_at_step_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
}

keel_status
keel_stop_at_step_hook_new(const keel_stop_at_step_hook_config *cfg,
                           keel_hook *out)
{
    stop_hook *h;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_stop_at_step_hook_config,
                            "stop_at_step hook");
    if (st != KEEL_OK)
        return st;
    if ((cfg->num_steps > 0) == (cfg->last_step > 0))
        return keel__fail(KEEL_EINVAL, "stop_at_step hook: give exactly one "
                          "of num_steps (%lld) and last_step (%lld) > 0",
                          (long long)cfg->num_steps,
                          (long long)cfg->last_step);
    h = keel__hooks_new_ctx(sizeof *h, "stop_at_step hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    h->num_steps = cfg->num_steps;
    h->last_step = cfg->last_step;
    h->is_resolved = cfg->last_step > 0;
    keel__hooks_fill(out, "stop_at_step", h, KEEL_HOOK_STOP_AT_STEP, free);
    out->after_create_session = stop_after_create;
    out->after_run = stop_after_run;
    out->wake = stop_wake;
    out->flags = KEEL_HOOK_NO_STEP_TIME;
    return KEEL_OK;
}

/* ---- NanTensorHook ------------------------------------------------------ */

typedef struct nan_hook {
    char name[KEEL_VALUE_NAME_MAX];
    int fail_on_nan;
    int fail_on_inf;
    int slot;                 /* name's slot in the values table, or -1 */
} nan_hook;

/* Every step: the name is this hook's own buffer, so its slot is found by
 * pointer (keel_run_context_request_fixed). */
static keel_status
nan_before(void *ctx, keel_run_context *rc)
{
    nan_hook *h = ctx;
    return keel_run_context_request_fixed(rc, h->name, &h->slot);
}

static keel_status
nan_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    nan_hook *h = ctx;
    double x;
    // keel_run_values_get by the cached slot: NaN unless the step set it
    // (it did: requested)
    if (!keel_run_values_find_fixed(v, h->name, &h->slot, &x))
        x = NAN;
    const char *what;
    if (isnan(x))
        what = "NaN";
    else if (h->fail_on_inf && isinf(x))
        what = "Inf";
    else
        return KEEL_OK;
    if (h->fail_on_nan) {
        keel__log(KEEL_LOG_ERROR, "Model diverged with %s = %s at global "
                  "step %lld", h->name, what,
                  (long long)keel_run_values_step_after(v));
        return keel__fail(KEEL_EHOOK, "%s %s during training (global step "
                          "%lld)", what, h->name,
                          (long long)keel_run_values_step_after(v));
    }
    keel__log(KEEL_LOG_WARN, "Model diverged with %s = %s; stopping", h->name,
              what);
    keel_run_context_request_stop(rc, "model diverged (NaN/Inf)");
    return KEEL_OK;
}

void
keel_nan_hook_config_init(keel_nan_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->name = "loss";
    cfg->fail_on_nan = 1;
}

keel_status
keel_nan_hook_new(const keel_nan_hook_config *cfg, keel_hook *out)
{
    nan_hook *h;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_nan_hook_config,
                            "nan hook");
    if (st != KEEL_OK)
        return st;
    if (cfg->name == NULL || cfg->name[0] == '\0'
        || strlen(cfg->name) >= KEEL_VALUE_NAME_MAX)
        return keel__fail(KEEL_EINVAL, "nan hook: name must be 1..%d "
                          "characters", KEEL_VALUE_NAME_MAX - 1);
    h = keel__hooks_new_ctx(sizeof *h, "nan hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    memcpy(h->name, cfg->name, strlen(cfg->name) + 1);
    h->fail_on_nan = cfg->fail_on_nan;
    h->fail_on_inf = cfg->fail_on_inf;
    h->slot = -1;
    keel__hooks_fill(out, "nan_tensor", h, KEEL_HOOK_NAN, free);
    out->before_run = nan_before;
    out->after_run = nan_after;
    out->flags = KEEL_HOOK_NO_STEP_TIME;     // a per-step duty: no wake
    return KEEL_OK;
}

/* ---- GlobalStepWaiterHook ----------------------------------------------- */

typedef struct waiter_hook {
    int64_t target;
    int poll_ms;
    int is_done;
} waiter_hook;

static keel_status
waiter_before(void *ctx, keel_run_context *rc)
{
    waiter_hook *h = ctx;
    keel_session *s = keel_run_context_session(rc);
    int64_t last_logged = -1;
    if (h->is_done || h->target <= 0) {
        h->is_done = 1;
        return KEEL_OK;
    }
    for (;;) {
        /* a cluster worker asks the parameter servers: its own copy of
         * the step does not move while it waits */
        int64_t gs;
        keel_status st = keel_session_read_shared_step(s, &gs);
        if (st != KEEL_OK)
            return st;
        if (gs >= h->target) {
            /* start from the shared state of that step, not the one
             * fetched when the session was made */
            if (gs != keel_session_global_step(s) &&
                (st = keel_session_refresh(s)) != KEEL_OK)
                return st;
            break;
        }
        if (last_logged < 0 || gs - last_logged > 1000) {
            keel__log(KEEL_LOG_INFO, "waiting for global step %lld before "
                      "starting (now %lld)", (long long)h->target,
                      (long long)gs);
            last_logged = gs;
        }
        if (keel_coord_wait_for_stop(keel_session_coord(s), h->poll_ms)
            || keel_session_signal_received())
            return keel__fail(KEEL_ECANCELLED, "global step waiter: stop "
                              "requested while waiting for step %lld",
                              (long long)h->target);
    }
    h->is_done = 1;
    return KEEL_OK;
}

void
keel_global_step_waiter_hook_config_init(
    keel_global_step_waiter_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->poll_ms = KEEL__DEFAULT_RETRY_MS;
}

keel_status
keel_global_step_waiter_hook_new(
    const keel_global_step_waiter_hook_config *cfg, keel_hook *out)
{
    waiter_hook *h;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_global_step_waiter_hook_config,
                            "global step waiter hook");
    if (st != KEEL_OK)
        return st;
    if (cfg->poll_ms <= 0)
        return keel__fail(KEEL_EINVAL, "global step waiter hook: poll_ms %d "
                          "must be > 0", cfg->poll_ms);
    h = keel__hooks_new_ctx(sizeof *h, "global_step_waiter hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    h->target = cfg->wait_until_step;
    h->poll_ms = cfg->poll_ms;
    keel__hooks_fill(out, "global_step_waiter", h,
                     KEEL_HOOK_GLOBAL_STEP_WAITER, free);
    out->before_run = waiter_before;
    return KEEL_OK;
}

/* ---- FinalOpsHook ------------------------------------------------------- */

typedef struct final_hook {
    keel_status (*fn)(void *ctx, keel_session *s, double *value);
    void *ctx;
    double value;
    int has_value;
} final_hook;

static keel_status
final_end(void *ctx, keel_session *s, keel_end_reason why)
{
    final_hook *h = ctx;
    keel_status st;
    (void)why;
    st = h->fn(h->ctx, s, &h->value);
    if (st == KEEL_OK)
        h->has_value = 1;
    else
        keel__log(KEEL_LOG_WARN, "final ops failed (%s): %s",
                  keel_status_name(st), keel_last_error());
    return KEEL_OK;
}

void
keel_final_ops_hook_config_init(keel_final_ops_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
}

keel_status
keel_final_ops_hook_new(const keel_final_ops_hook_config *cfg,
                        keel_hook *out)
{
    final_hook *h;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_final_ops_hook_config,
                            "final ops hook");
    if (st != KEEL_OK)
        return st;
    if (cfg->fn == NULL)
        return keel__fail(KEEL_EINVAL, "final ops hook: fn is NULL");
    h = keel__hooks_new_ctx(sizeof *h, "final_ops hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    h->fn = cfg->fn;
    h->ctx = cfg->ctx;
    keel__hooks_fill(out, "final_ops", h, KEEL_HOOK_FINAL_OPS, free);
    out->end = final_end;
    return KEEL_OK;
}

int
keel_final_ops_hook_value(const keel_hook *hk, double *value)
{
    const final_hook *h;
    if (hk == NULL || hk->kind != KEEL_HOOK_FINAL_OPS || hk->ctx == NULL)
        return 0;
    h = hk->ctx;
    if (!h->has_value)
        return 0;
    if (value != NULL)
        *value = h->value;
    return 1;
}

/* ---- FeedFnHook --------------------------------------------------------- */

typedef struct feed_hook {
    keel_status (*fn)(void *ctx, int64_t global_step, const void **batch);
    void *ctx;
} feed_hook;

static keel_status
feed_before(void *ctx, keel_run_context *rc)
{
    feed_hook *h = ctx;
    const void *batch = NULL;
    keel_status st = h->fn(h->ctx, keel_run_context_global_step(rc),
                           &batch);
    if (st != KEEL_OK)
        return st;
    return keel_run_context_set_batch(rc, batch);
}

void
keel_feed_fn_hook_config_init(keel_feed_fn_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
}

keel_status
keel_feed_fn_hook_new(const keel_feed_fn_hook_config *cfg, keel_hook *out)
{
    feed_hook *h;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_feed_fn_hook_config,
                            "feed fn hook");
    if (st != KEEL_OK)
        return st;
    if (cfg->fn == NULL)
        return keel__fail(KEEL_EINVAL, "feed fn hook: fn is NULL");
    h = keel__hooks_new_ctx(sizeof *h, "feed_fn hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    h->fn = cfg->fn;
    h->ctx = cfg->ctx;
    keel__hooks_fill(out, "feed_fn", h, KEEL_HOOK_FEED_FN, free);
    out->before_run = feed_before;
    return KEEL_OK;
}
