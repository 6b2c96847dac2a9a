/* chain.c - the pieces of the hook chain every hook sees: run context and
 * run values accessors, the named-value table, end reasons, the clock, TF's
 * SecondOrStepTimer (on a monotonic, injectable clock) and asking a hook
 * when it next needs to be called. */
#include <config.h>

#include <math.h>
#include <string.h>
#include <time.h>

#include "util.h"
#include "session_int.h"

/* How far CLOCK_MONOTONIC_COARSE may lag CLOCK_MONOTONIC, with margin. */
#define KEEL_COARSE_SLACK_NS ((int64_t)50 * 1000000)

const char *
keel_end_reason_name(keel_end_reason why)
{
    switch (why) {
    case KEEL_END_CLEAN: return "clean";
    case KEEL_END_OUT_OF_RANGE: return "end of input";
    case KEEL_END_STOP_REQUESTED: return "stop requested";
    case KEEL_END_ERROR: return "error";
    case KEEL_END_SIGNAL: return "signal";
    }
    return "unknown";
}

void
keel_hook_init(keel_hook *h)
{
    KEEL__STRUCT_INIT(h);
}

void
keel_hook_release(keel_hook *h)
{
    if (h == NULL)
        return;
    if (h->destroy != NULL)
        h->destroy(h->ctx);
    memset(h, 0, sizeof *h);
}

/* Names are short: an inline loop beats a call to strcmp on the per-step
 * path (three lookups per step with the standard hooks). */
static inline int
name_eq(const char *a, const char *b)
{
    while (*a != '\0' && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

int
keel__values_slot(keel__values *t, const char *name, int is_add)
{
    size_t i, len;
    int k;
    /* Callers pass the same pointers every step (a literal, the hooks' own
     * copies): look for the pointer first (the name is still compared: a
     * reused buffer may hold another name). */
    for (i = 0; i < t->n; i++)
        for (k = 0; k < KEEL__VALUE_PTRS; k++)
            if (t->v[i].ptrs[k] == name && name_eq(t->v[i].name, name))
                return (int)i;
    for (i = 0; i < t->n; i++) {
        if (name_eq(t->v[i].name, name)) {
            t->v[i].ptrs[t->v[i].next_ptr++ % KEEL__VALUE_PTRS] = name;
            return (int)i;
        }
    }
    len = strlen(name);
    if (!is_add || t->n >= KEEL_MAX_VALUES || len >= KEEL_VALUE_NAME_MAX)
        return -1;
    memcpy(t->v[t->n].name, name, len + 1);
    t->v[t->n].set_gen = -1;
    t->v[t->n].metric_gen = -1;
    memset(t->v[t->n].ptrs, 0, sizeof t->v[t->n].ptrs);
    t->v[t->n].ptrs[0] = name;
    t->v[t->n].next_ptr = 1;
    return (int)t->n++;
}

int
keel__values_find(const keel__values *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (name_eq(t->v[i].name, name))
            return (int)i;
    return -1;
}

/* ---- run context -------------------------------------------------------- */

void
keel_run_context_request_stop(keel_run_context *rc, const char *why)
{
    if (rc == NULL)
        return;
    if (!rc->is_stop_requested)
        keel__log(KEEL_LOG_INFO, "hook '%s' requested stop (step from "
                  "global step %lld): %s",
                  rc->hook_name != NULL ? rc->hook_name : "?",
                  (long long)rc->global_step, why != NULL ? why : "");
    rc->is_stop_requested = 1;
}

int
keel_run_context_stop_requested(const keel_run_context *rc)
{
    return rc != NULL && rc->is_stop_requested;
}


/* keel__values_slot(t, name, 1) for a name in a buffer that does not
 * change while it is in use: a slot whose pointers include name holds that
 * name, so *hint (the slot last found, -1 at first) is checked by pointer
 * alone. */
static inline int
values_slot_fixed(keel__values *t, const char *name, int *hint)
{
    int k, h = *hint;
    if (h >= 0 && (size_t)h < t->n)
        for (k = 0; k < KEEL__VALUE_PTRS; k++)
            if (t->v[h].ptrs[k] == name)
                return h;
    h = keel__values_slot(t, name, 1);
    if (h >= 0)
        *hint = h;
    return h;
}

/* The value the step set in slot this step: 1 and *out, or 0 (no slot,
 * or not set this step). */
static inline int
values_this_step(const keel__values *t, int slot, double *out)
{
    if (slot < 0 || t->v[slot].set_gen != t->gen)
        return 0;
    *out = t->v[slot].value;
    return 1;
}

static keel_status
request_slot(keel_run_context *rc, int slot, const char *name)
{
    size_t i;
    if (slot < 0)
        return keel__fail(KEEL_EINVAL, "hook '%s' requested value '%s': "
                          "name too long or more than %d names",
                          rc->hook_name != NULL ? rc->hook_name : "?", name,
                          KEEL_MAX_VALUES);
    for (i = 0; i < rc->n_requested; i++)
        if (rc->requested[i] == slot)
            return KEEL_OK;
    rc->requested[rc->n_requested] = slot;
    rc->requested_by[rc->n_requested] = rc->hook_name;
    rc->n_requested++;
    return KEEL_OK;
}

keel_status
keel_run_context_request(keel_run_context *rc, const char *name)
{
    if (rc == NULL || name == NULL)
        return keel__fail(KEEL_EINVAL, "request value: NULL argument");
    return request_slot(rc, keel__values_slot(rc->values, name, 1), name);
}

keel_status
keel_run_context_request_fixed(keel_run_context *rc, const char *name,
                               int *slot)
{
    if (rc == NULL || name == NULL || slot == NULL)
        return keel__fail(KEEL_EINVAL, "request value: NULL argument");
    return request_slot(rc, values_slot_fixed(rc->values, name, slot), name);
}

int64_t
keel_run_context_skipped(const keel_run_context *rc)
{
    return rc != NULL ? rc->n_skipped : 0;
}

keel_status
keel_run_context_set_batch(keel_run_context *rc, const void *batch)
{
    if (rc == NULL)
        return keel__fail(KEEL_EINVAL, "set batch: NULL run context");
    if (rc->has_batch)
        return keel__fail(KEEL_EINVAL, "hook '%s' supplied a batch but the "
                          "caller or another hook already did (one feeder "
                          "per step)",
                          rc->hook_name != NULL ? rc->hook_name : "?");
    rc->batch = batch;
    rc->has_batch = 1;
    return KEEL_OK;
}

keel_session *
keel_run_context_session(keel_run_context *rc)
{
    return rc != NULL ? rc->s : NULL;
}

int64_t
keel_run_context_global_step(const keel_run_context *rc)
{
    return rc != NULL ? rc->global_step : 0;
}

/* ---- run values --------------------------------------------------------- */

int64_t
keel_run_values_step_before(const keel_run_values *v)
{
    return v->step_before;
}

int64_t
keel_run_values_step_after(const keel_run_values *v)
{
    return v->step_after;
}

int64_t
keel_run_values_local_step(const keel_run_values *v)
{
    return v->local_step;
}

int64_t
keel_run_values_duration_ns(const keel_run_values *v)
{
    return v->duration_ns;
}

int64_t
keel_run_values_start_ns(const keel_run_values *v)
{
    return v->start_ns;
}

int
keel_run_values_find(const keel_run_values *v, const char *name, double *out)
{
    double x;
    if (v == NULL || v->values == NULL || name == NULL ||
        !values_this_step(v->values,
                                keel__values_slot(v->values, name, 0), &x))
        return 0;
    if (out != NULL)
        *out = x;
    return 1;
}

double
keel_run_values_get(const keel_run_values *v, const char *name)
{
    double x;
    return keel_run_values_find(v, name, &x) ? x : NAN;
}

int
keel_run_values_find_fixed(const keel_run_values *v, const char *name,
                           int *slot, double *out)
{
    double x;
    if (v == NULL || v->values == NULL || name == NULL || slot == NULL
        || !values_this_step(v->values,
                             values_slot_fixed(v->values, name, slot), &x))
        return 0;
    if (out != NULL)
        *out = x;
    return 1;
}

int64_t
keel_run_values_skipped(const keel_run_values *v)
{
    return v != NULL ? v->n_skipped : 0;
}

int
keel_run_values_prev_step_before(const keel_run_values *v, int64_t *out)
{
    if (v == NULL || !v->has_prev_before)
        return 0;
    if (out != NULL)
        *out = v->prev_before;
    return 1;
}

/* ---- clock and timer ---------------------------------------------------- */

int64_t
keel_clock_now_ns(const keel_clock *c)
{
    if (c != NULL && c->fn != NULL)
        return c->fn(c->ctx);
    return keel__now_mono_ns();
}

keel_status
keel_timer_init(keel_timer *t, double every_secs, int64_t every_steps,
                const keel_clock *clock)
{
    if (t == NULL)
        return keel__fail(KEEL_EINVAL, "timer: NULL");
    memset(t, 0, sizeof *t);
    if (every_secs <= 0 && every_steps <= 0)
        return keel__fail(KEEL_EINVAL, "timer: Either every_secs or "
                          "every_steps should be provided.");
    if (every_secs > 0 && every_steps > 0)
        return keel__fail(KEEL_EINVAL, "timer: Can not provide both "
                          "every_secs (%g) and every_steps (%lld).",
                          every_secs, (long long)every_steps);
    t->every_secs = every_secs > 0 ? every_secs : 0;
    t->every_steps = every_steps > 0 ? every_steps : 0;
    t->last_step = -1;
    if (clock != NULL)
        t->clock = *clock;
    return KEEL_OK;
}

void
keel_timer_init_never(keel_timer *t)
{
    memset(t, 0, sizeof *t);
    t->is_never = 1;
    t->last_step = -1;
}

int
keel_timer_should_trigger(const keel_timer *t, int64_t step)
{
    if (t->is_never)
        return 0;
    if (!t->is_triggered)
        return 1;
    if (step == t->last_step)
        return 0;
    if (t->every_secs > 0) {
        int64_t due = t->last_ns + (int64_t)(t->every_secs * 1e9);
        if (t->clock.fn == NULL) {
            /* CLOCK_MONOTONIC_COARSE is CLOCK_MONOTONIC as of the last
             * tick (<= 10 ms behind, HZ >= 100) and cheaper to read: far
             * from the deadline it decides alone, near it the exact
             * clock does. */
            struct timespec ts;
            if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0
                && (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec
                   + KEEL_COARSE_SLACK_NS < due)
                return 0;
        }
        return keel_clock_now_ns(&t->clock) >= due;
    }
    return step >= t->last_step + t->every_steps;
}

int
keel_timer_update(keel_timer *t, int64_t step, double *elapsed_secs,
                  int64_t *elapsed_steps)
{
    int64_t now = keel_clock_now_ns(&t->clock);
    int had = t->is_triggered;
    if (had) {
        if (elapsed_secs != NULL)
            *elapsed_secs = (double)(now - t->last_ns) / 1e9;
        if (elapsed_steps != NULL)
            *elapsed_steps = step - t->last_step;
    }
    t->is_triggered = 1;
    t->last_step = step;
    t->last_ns = now;
    return had;
}

void
keel_timer_reset(keel_timer *t)
{
    t->is_triggered = 0;
    t->last_step = -1;
    t->last_ns = 0;
}

int64_t
keel_timer_wake_step(const keel_timer *t)
{
    if (t == NULL || t->is_never)
        return KEEL_WAKE_NEVER;
    if (t->every_secs > 0 || !t->is_triggered || t->every_steps <= 0)
        return KEEL_WAKE_ALWAYS;
    // should_trigger <=> step != last && step >= last + every (every >= 1)
    if (t->last_step > INT64_MAX - t->every_steps)
        return KEEL_WAKE_NEVER;
    return t->last_step + t->every_steps;
}

/* ---- asking a hook when it next needs to be called ---------------------- */

int
keel__hook_reads_step_time(const keel_hook *h)
{
    return h->after_run != NULL && !(h->flags & KEEL_HOOK_NO_STEP_TIME);
}

static int g_is_skipping_off;       // tests compare runs with and without

void
keel__session_set_skipping(int is_on)
{
    g_is_skipping_off = !is_on;
}

int
keel__hook_get_wake(const keel_hook *h, keel_hook_wake *w)
{
    w->before_gs = KEEL_WAKE_ALWAYS;
    w->before_iters = KEEL_WAKE_NEVER;
    w->after_gs = KEEL_WAKE_ALWAYS;
    w->after_ns = KEEL_WAKE_NEVER;
    w->on_stall = 0;
    w->after_needs_before = 0;
    if (g_is_skipping_off || h->wake == NULL)
        return 0;
    return h->wake(h->ctx, w) != 0;
}
