/* summary.c - the hooks that write TensorBoard data through keel_events:
 * StepCounterHook ("global_step/sec"), SummarySaverHook (named step values
 * as scalars) and ProfilerHook (per-step timing as a Chrome trace). */
#include <config.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <keel/events.h>
#include <keel/hooks.h>
#include <keel/session.h>
#include "hooks_int.h"
#include "util.h"

/* Hooks writing to the same directory share one event file, as TF's
 * FileWriterCache does (TensorBoard shows one run, scalars.csv gets one
 * writer). The cache is process-wide, refcounted and locked: hooks of
 * different sessions may live on different threads, though a writer is used
 * by one step thread at a time. */
typedef struct shared_writer {
    char *dir;
    keel_events *w;
    int refs;
    struct shared_writer *next;
} shared_writer;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static shared_writer *cache;

/* An event file that cannot be opened degrades the hook to logging only
 * (a warning names the cause): losing TensorBoard output must not stop
 * training. */
static keel_status
open_events(const char *dir, keel_events **w, const char *who)
{
    shared_writer *e;
    keel_status st = KEEL_OK;
    *w = NULL;
    pthread_mutex_lock(&cache_lock);
    for (e = cache; e != NULL; e = e->next)
        if (strcmp(e->dir, dir) == 0)
            break;
    if (e == NULL) {
        e = calloc(1, sizeof *e);
        if (e == NULL || (e->dir = strdup(dir)) == NULL) {
            free(e);
            e = NULL;
            st = keel__fail(KEEL_ENOMEM, "event writer for %s", dir);
        } else if ((st = keel_events_open(dir, "", &e->w)) != KEEL_OK) {
            free(e->dir);
            free(e);
            e = NULL;
        } else {
            e->next = cache;
            cache = e;
        }
    }
    if (e != NULL) {
        e->refs++;
        *w = e->w;
    }
    pthread_mutex_unlock(&cache_lock);
    if (st != KEEL_OK)
        keel__log(KEEL_LOG_WARN, "%s hook: no event file in %s (%s): "
                  "logging only", who, dir, keel_last_error());
    return KEEL_OK;
}

/* Drop one reference; the last closes the file. NULL is a no-op. */
static void
close_events(keel_events *w)
{
    shared_writer **pp;
    if (w == NULL)
        return;
    pthread_mutex_lock(&cache_lock);
    for (pp = &cache; *pp != NULL; pp = &(*pp)->next) {
        shared_writer *e = *pp;
        if (e->w != w)
            continue;
        if (--e->refs == 0) {
            *pp = e->next;
            keel_events_close(e->w);
            free(e->dir);
            free(e);
        } else {
            keel_events_flush(w);
        }
        break;
    }
    pthread_mutex_unlock(&cache_lock);
}

/* A hook's event output: the directory it was given (owned; NULL: none)
 * and, from its first event on, the shared writer for it (NULL until
 * then and when the file could not be opened: tried is set after the
 * first attempt, so a failure warns once); who is the hook in messages
 * ("step counter"). */
typedef struct events_out {
    char *dir;
    keel_events *w;
    const char *who;
    int tried;
} events_out;

/* Copy dir (NULL: no output) into e; ENOMEM names who. */
static keel_status
events_out_init(events_out *e, const char *dir, const char *who)
{
    e->w = NULL;
    e->dir = NULL;
    e->who = who;
    e->tried = 0;
    if (dir != NULL && (e->dir = strdup(dir)) == NULL)
        return keel__fail(KEEL_ENOMEM, "%s hook: copy dir", who);
    return KEEL_OK;
}

/* The writer, opened at the first event rather than at begin: a run
 * refused before its first step (a checkpoint that does not fit, a bad
 * directory) leaves no empty event file behind. NULL: no output. */
static keel_events *
events_out_writer(events_out *e)
{
    if (e->dir != NULL && e->w == NULL && !e->tried) {
        e->tried = 1;
        (void)open_events(e->dir, &e->w, e->who);
    }
    return e->w;
}

/* At end: flush what was written; a failure is a warning. */
static void
events_out_flush(events_out *e)
{
    if (e->w != NULL && keel_events_flush(e->w) != KEEL_OK)
        keel__log(KEEL_LOG_WARN, "%s: flush: %s", e->who, keel_last_error());
}

/* Drop the writer and the dir (e may be zeroed: a no-op). */
static void
events_out_free(events_out *e)
{
    close_events(e->w);
    free(e->dir);
}

/* The hooks that write events (step counter, summary saver) keep their
 * events_out first in their context, so one end and destroy serve
 * them all. */
static keel_status
events_hook_end(void *ctx, keel_session *s, keel_end_reason why)
{
    (void)s;
    (void)why;
    events_out_flush(ctx);
    return KEEL_OK;
}

static void
events_hook_destroy(void *ctx)
{
    if (ctx == NULL)
        return;
    events_out_free(ctx);
    free(ctx);
}

/* ---- StepCounterHook ---------------------------------------------------- */

typedef struct counter_hook {
    events_out ev;                /* first: events_hook_* */
    keel_timer timer;
    int64_t last_before;
    int64_t n_stalled;
} counter_hook;

static keel_status
counter_after_run(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    counter_hook *h = ctx;
    int64_t gs = keel_run_values_step_after(v), dsteps = 0;
    int64_t before = keel_run_values_step_before(v);
    double dt = 0;
    (void)rc;
    /* The session may skip calls until the timer is due (keeping the
     * previous step_before for us): it still calls on a stall. */
    keel_run_values_prev_step_before(v, &h->last_before);
    if (before == h->last_before) {
        if (++h->n_stalled <= 5)
            keel__log(KEEL_LOG_WARN, "It seems that the global step has not "
                      "been increased (still %lld)", (long long)gs);
    }
    h->last_before = before;
    if (!keel_timer_should_trigger(&h->timer, gs))
        return KEEL_OK;
    if (keel_timer_update(&h->timer, gs, &dt, &dsteps) && dt > 0) {
        double rate = (double)dsteps / dt;
        keel__log(KEEL_LOG_INFO, "global_step/sec: %g", rate);
        keel_events *w = events_out_writer(&h->ev);
        if (w != NULL) {
            keel_status st = keel_events_scalar(w, gs,
                                                "global_step/sec", rate);
            if (st != KEEL_OK)
                return keel__wrap(st, "step counter hook at step %lld",
                                  (long long)gs);
        }
    }
    return KEEL_OK;
}

/* after_run acts when the timer is due or on a stall; seconds: always. */
static int
counter_wake(const void *ctx, keel_hook_wake *w)
{
    const keel_timer *t = &((const counter_hook *)ctx)->timer;
    if (t->every_secs > 0)
        return 0;
    w->after_gs = keel_timer_wake_step(t);
    w->on_stall = 1;
    return 1;
}

void
keel_step_counter_hook_config_init(keel_step_counter_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->every_n_steps = 100;
}

keel_status
keel_step_counter_hook_new(const keel_step_counter_hook_config *cfg,
                           keel_hook *out)
{
    counter_hook *h;
    keel_timer timer;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_step_counter_hook_config,
                            "step counter hook");
    if (st != KEEL_OK)
        return st;
    st = keel_timer_init(&timer, cfg->every_n_secs, cfg->every_n_steps,
                         &cfg->clock);
    if (st != KEEL_OK)
        return keel__wrap(st, "step counter hook: exactly one of "
                          "every_n_steps and every_n_secs should be "
                          "provided");
    h = keel__hooks_new_ctx(sizeof *h, "step counter hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    h->last_before = -1;
    h->timer = timer;
    st = events_out_init(&h->ev, cfg->output_dir, "step counter");
    if (st != KEEL_OK) {
        free(h);
        return st;
    }
    keel__hooks_fill(out, "step_counter", h, KEEL_HOOK_STEP_COUNTER,
                     events_hook_destroy);
    out->after_run = counter_after_run;
    out->end = events_hook_end;
    out->wake = counter_wake;
    out->flags = KEEL_HOOK_NO_STEP_TIME; // reads its own timer's clock
    return KEEL_OK;
}

/* ---- SummarySaverHook --------------------------------------------------- */

typedef struct summary_hook {
    events_out ev;                /* first: events_hook_* */
    char names[KEEL__HOOKS_NAMES_MAX][KEEL_VALUE_NAME_MAX];
    size_t n;
    keel_timer timer;
    int is_requested;
} summary_hook;

static keel_status
summary_before(void *ctx, keel_run_context *rc)
{
    summary_hook *h = ctx;
    /* The step about to run ends at global step + 1. */
    h->is_requested = keel_timer_should_trigger(
        &h->timer, keel_run_context_global_step(rc) + 1);
    if (!h->is_requested)
        return KEEL_OK;
    return keel__hooks_request_names(rc, h->names, h->n);
}

static keel_status
summary_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    summary_hook *h = ctx;
    int64_t gs = keel_run_values_step_after(v);
    keel_events *w;
    size_t i;
    (void)rc;
    if (!h->is_requested)
        return KEEL_OK;
    // Consumed: until the next before_run asks again, after_run is idle.
    h->is_requested = 0;
    keel_timer_update(&h->timer, gs, NULL, NULL);
    w = events_out_writer(&h->ev);
    for (i = 0; i < h->n && w != NULL; i++) {
        keel_status st = keel_events_scalar(w, gs, h->names[i],
                                            keel_run_values_get(v,
                                                                h->names[i]));
        if (st != KEEL_OK)
            return keel__wrap(st, "summary saver hook: '%s' at step %lld",
                              h->names[i], (long long)gs);
    }
    return KEEL_OK;
}

/* before_run acts when the step about to run ends at a due step; after_run
 * only after a before_run that requested values. Seconds: always. */
static int
summary_wake(const void *ctx, keel_hook_wake *w)
{
    const summary_hook *sh = ctx;
    int64_t due = keel_timer_wake_step(&sh->timer);
    if (sh->timer.every_secs > 0)
        return 0;
    // due(global step + 1) <=> global step >= due - 1
    w->before_gs = due == KEEL_WAKE_ALWAYS || due == KEEL_WAKE_NEVER
                   ? due : due - 1;
    w->after_gs = sh->is_requested ? KEEL_WAKE_ALWAYS : KEEL_WAKE_NEVER;
    w->after_needs_before = 1;
    return 1;
}

void
keel_summary_hook_config_init(keel_summary_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
}

keel_status
keel_summary_hook_new(const keel_summary_hook_config *cfg, keel_hook *out)
{
    summary_hook *h;
    keel_timer timer;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_summary_hook_config,
                            "summary saver hook");
    if (st != KEEL_OK)
        return st;
    if (cfg->output_dir == NULL)
        return keel__fail(KEEL_EINVAL, "summary saver hook: output_dir is "
                          "required");
    st = keel__hooks_check_names(cfg->names, cfg->n_names,
                                 "summary saver hook");
    if (st != KEEL_OK)
        return st;
    st = keel_timer_init(&timer, cfg->save_secs, cfg->save_steps,
                         &cfg->clock);
    if (st != KEEL_OK)
        return keel__wrap(st, "summary saver hook (save_steps/save_secs)");
    h = keel__hooks_new_ctx(sizeof *h, "summary saver hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    keel__hooks_copy_names(h->names, cfg->names, cfg->n_names);
    h->n = cfg->n_names;
    h->timer = timer;
    st = events_out_init(&h->ev, cfg->output_dir, "summary saver");
    if (st != KEEL_OK) {
        free(h);
        return st;
    }
    keel__hooks_fill(out, "summary_saver", h, KEEL_HOOK_SUMMARY,
                     events_hook_destroy);
    out->before_run = summary_before;
    out->after_run = summary_after;
    out->end = events_hook_end;
    out->wake = summary_wake;
    out->flags = KEEL_HOOK_NO_STEP_TIME;
    return KEEL_OK;
}

/* ---- ProfilerHook ------------------------------------------------------- */

typedef struct profiler_hook {
    keel_timer timer;
    char path[KEEL_PATH_MAX];
    keel_trace *t;
    int is_first;
} profiler_hook;

static keel_status
profiler_begin(void *ctx)
{
    profiler_hook *h = ctx;
    keel_status st;
    char dir[KEEL_PATH_MAX];
    char *slash;
    if (h->t != NULL)
        return KEEL_OK;
    snprintf(dir, sizeof dir, "%s", h->path);
    slash = strrchr(dir, '/');
    if (slash != NULL) {
        *slash = '\0';
        st = keel__fs_mkdirs(dir);
        if (st != KEEL_OK)
            return keel__wrap(st, "profiler hook: create %s", dir);
    }
    st = keel_trace_open(h->path, &h->t);
    if (st != KEEL_OK)
        return keel__wrap(st, "profiler hook: open %s", h->path);
    return KEEL_OK;
}

static keel_status
profiler_after(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    profiler_hook *h = ctx;
    int64_t gs = keel_run_values_step_after(v);
    char name[48];
    keel_status st;
    (void)rc;
    if (h->is_first) {          // TF skips the first run: prime the timer
        h->is_first = 0;
        keel_timer_update(&h->timer, gs, NULL, NULL);
        return KEEL_OK;
    }
    if (!keel_timer_should_trigger(&h->timer, gs))
        return KEEL_OK;
    keel_timer_update(&h->timer, gs, NULL, NULL);
    snprintf(name, sizeof name, "step_%lld", (long long)gs);
    st = keel_trace_event(h->t, name, "step",
                          keel_run_values_start_ns(v) / 1000,
                          keel_run_values_duration_ns(v) / 1000, 0);
    if (st != KEEL_OK)
        return keel__wrap(st, "profiler hook: %s", h->path);
    return KEEL_OK;
}

static keel_status
profiler_end(void *ctx, keel_session *s, keel_end_reason why)
{
    profiler_hook *h = ctx;
    (void)s;
    (void)why;
    if (h->t != NULL) {
        if (keel_trace_close(h->t) != KEEL_OK)
            keel__log(KEEL_LOG_WARN, "profiler: close %s: %s", h->path,
                      keel_last_error());
        h->t = NULL;
    }
    return KEEL_OK;
}

static void
profiler_destroy(void *ctx)
{
    profiler_hook *h = ctx;
    if (h == NULL)
        return;
    if (h->t != NULL)
        keel_trace_close(h->t);
    free(h);
}

void
keel_profiler_hook_config_init(keel_profiler_hook_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
}

keel_status
keel_profiler_hook_new(const keel_profiler_hook_config *cfg, keel_hook *out)
{
    profiler_hook *h;
    keel_timer timer;
    keel_status st;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_profiler_hook_config,
                            "profiler hook");
    if (st != KEEL_OK)
        return st;
    if (cfg->output_dir == NULL)
        return keel__fail(KEEL_EINVAL, "profiler hook: output_dir is "
                          "required");
    st = keel_timer_init(&timer, cfg->save_secs, cfg->save_steps,
                         &cfg->clock);
    if (st != KEEL_OK)
        return keel__wrap(st, "profiler hook (save_steps/save_secs)");
    h = keel__hooks_new_ctx(sizeof *h, "profiler hook");
    if (h == NULL)
        return KEEL_ENOMEM;
    h->is_first = 1;
    h->timer = timer;
    st = keel__path_join(h->path, sizeof h->path, cfg->output_dir,
                         "timeline.json");
    if (st != KEEL_OK) {
        free(h);
        return keel__wrap(st, "profiler hook (output_dir)");
    }
    keel__hooks_fill(out, "profiler", h, KEEL_HOOK_PROFILER,
                     profiler_destroy);
    out->begin = profiler_begin;
    out->after_run = profiler_after;
    out->end = profiler_end;
    // reads every step's time: no KEEL_HOOK_NO_STEP_TIME
    return KEEL_OK;
}
