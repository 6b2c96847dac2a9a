/* coord.c - the Coordinator: stop requests with first-error capture,
 * registered threads joined with a grace period, and looper threads for
 * periodic work. Every wait is a condition variable, so a stop wakes all
 * waiters at once (no polling). */
#include <config.h>

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"
#include "session_int.h"

typedef struct coord_thread {
    struct coord_thread *next;
    keel_coord *c;
    pthread_t tid;
    char name[64];
    int is_done;
    keel_status (*fn)(void *arg, keel_coord *c);
    keel_status (*loop_fn)(void *arg);
    void *arg;
    int64_t interval_ms;
} coord_thread;

struct keel_coord {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int is_stopped;
    atomic_int stop_flag;     /* mirrors is_stopped: lock-free should_stop */
    keel_status error;
    char msg[KEEL_ERR_MAX];
    coord_thread *threads;
};

void
keel__cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

int
keel__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu,
                      int64_t deadline_ns)
{
    struct timespec ts;
    if (deadline_ns < 0) {
        pthread_cond_wait(cv, mu);
        return 0;
    }
    ts.tv_sec = (time_t)(deadline_ns / 1000000000);
    ts.tv_nsec = (long)(deadline_ns % 1000000000);
    return pthread_cond_timedwait(cv, mu, &ts) == ETIMEDOUT;
}

keel_status
keel_coord_new(keel_coord **out)
{
    keel_coord *c;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "coordinator: out is NULL");
    c = calloc(1, sizeof *c);
    if (c == NULL)
        return keel__fail(KEEL_ENOMEM, "coordinator: %zu bytes", sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    keel__cond_init_mono(&c->cv);
    *out = c;
    return KEEL_OK;
}

void
keel_coord_free(keel_coord *c)
{
    coord_thread *t, *next;
    if (c == NULL)
        return;
    keel_coord_request_stop(c, KEEL_OK, NULL);
    for (t = c->threads; t != NULL; t = next) {
        next = t->next;
        pthread_join(t->tid, NULL);
        free(t);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void
keel_coord_request_stop(keel_coord *c, keel_status error, const char *why)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    if (error != KEEL_OK && c->error == KEEL_OK) {
        c->error = error;
        snprintf(c->msg, sizeof c->msg, "%s",
                 why != NULL ? why : keel_last_error());
    }
    if (!c->is_stopped && why != NULL)
        keel__log(error == KEEL_OK ? KEEL_LOG_INFO : KEEL_LOG_ERROR,
                  "coordinator: stop requested: %s", why);
    c->is_stopped = 1;
    atomic_store_explicit(&c->stop_flag, 1, memory_order_release);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

int
keel_coord_should_stop(keel_coord *c)
{
    return atomic_load_explicit(&c->stop_flag, memory_order_acquire);
}

const atomic_int *
keel__coord_stop_flag(const keel_coord *c)
{
    return &c->stop_flag;
}

int
keel_coord_wait_for_stop(keel_coord *c, int64_t timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? -1
                       : keel__now_mono_ns() + timeout_ms * 1000000;
    int r;
    pthread_mutex_lock(&c->mu);
    while (!c->is_stopped)
        if (keel__cond_wait_until(&c->cv, &c->mu, deadline))
            break;
    r = c->is_stopped;
    pthread_mutex_unlock(&c->mu);
    return r;
}

keel_status
keel_coord_error(keel_coord *c, char *msg, size_t size)
{
    keel_status st;
    pthread_mutex_lock(&c->mu);
    st = c->error;
    if (msg != NULL && size > 0)
        snprintf(msg, size, "%s", c->msg);
    pthread_mutex_unlock(&c->mu);
    return st;
}

void
keel_coord_clear_stop(keel_coord *c)
{
    pthread_mutex_lock(&c->mu);
    c->is_stopped = 0;
    atomic_store_explicit(&c->stop_flag, 0, memory_order_release);
    c->error = KEEL_OK;
    c->msg[0] = '\0';
    pthread_mutex_unlock(&c->mu);
}

/* A thread's function failed: the coordinator stops, naming the thread
 * (what: "thread" or "looper") and the failure's message. */
static void
stop_on_failure(coord_thread *t, const char *what, keel_status st)
{
    char why[KEEL_ERR_MAX];
    snprintf(why, sizeof why, "%s '%s' failed: %s", what, t->name,
             keel_last_error());
    keel_coord_request_stop(t->c, st, why);
}

static void
run_looper(coord_thread *t)
{
    keel_coord *c = t->c;
    int64_t next = keel__now_mono_ns();
    int64_t step = t->interval_ms * 1000000;
    for (;;) {
        keel_status st;
        if (keel_coord_should_stop(c))
            return;
        st = t->loop_fn(t->arg);
        if (st != KEEL_OK) {
            stop_on_failure(t, "looper", st);
            return;
        }
        if (step <= 0)
            continue;
        next += step;               // fixed boundaries: no drift
        pthread_mutex_lock(&c->mu);
        while (!c->is_stopped && keel__now_mono_ns() < next)
            keel__cond_wait_until(&c->cv, &c->mu, next);
        pthread_mutex_unlock(&c->mu);
    }
}

static void *
thread_main(void *arg)
{
    coord_thread *t = arg;
    keel_coord *c = t->c;
    if (t->loop_fn != NULL) {
        run_looper(t);
    } else {
        keel_status st = t->fn(t->arg, c);
        if (st != KEEL_OK)
            stop_on_failure(t, "thread", st);
    }
    pthread_mutex_lock(&c->mu);
    t->is_done = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static keel_status
start(keel_coord *c, const char *name, keel_status (*fn)(void *, keel_coord *),
      keel_status (*loop_fn)(void *), int64_t interval_ms, void *arg)
{
    coord_thread *t;
    int rc;
    if (c == NULL || (fn == NULL && loop_fn == NULL))
        return keel__fail(KEEL_EINVAL, "coordinator: thread '%s' has no "
                          "function", name != NULL ? name : "?");
    t = calloc(1, sizeof *t);
    if (t == NULL)
        return keel__fail(KEEL_ENOMEM, "coordinator: thread record");
    t->c = c;
    snprintf(t->name, sizeof t->name, "%s", name != NULL ? name : "thread");
    t->fn = fn;
    t->loop_fn = loop_fn;
    t->interval_ms = interval_ms;
    t->arg = arg;
    pthread_mutex_lock(&c->mu);
    rc = pthread_create(&t->tid, NULL, thread_main, t);
    if (rc != 0) {
        pthread_mutex_unlock(&c->mu);
        free(t);
        return keel__fail(KEEL_ENOMEM, "coordinator: start thread '%s': %s",
                          name != NULL ? name : "?", strerror(rc));
    }
    t->next = c->threads;
    c->threads = t;
    pthread_mutex_unlock(&c->mu);
    return KEEL_OK;
}

keel_status
keel_coord_start_thread(keel_coord *c, const char *name,
                        keel_status (*fn)(void *arg, keel_coord *c),
                        void *arg)
{
    return start(c, name, fn, NULL, 0, arg);
}

keel_status
keel_coord_start_looper(keel_coord *c, const char *name, int64_t interval_ms,
                        keel_status (*fn)(void *arg), void *arg)
{
    if (interval_ms < 0)
        return keel__fail(KEEL_EINVAL, "looper '%s': interval %lld ms < 0",
                          name != NULL ? name : "?", (long long)interval_ms);
    return start(c, name, NULL, fn, interval_ms, arg);
}

static int
all_done(const keel_coord *c)
{
    const coord_thread *t;
    for (t = c->threads; t != NULL; t = t->next)
        if (!t->is_done)
            return 0;
    return 1;
}

keel_status
keel_coord_join(keel_coord *c, int64_t grace_ms, int ignore_live_threads)
{
    coord_thread **pp, *t, *done = NULL;
    char live[KEEL_ERR_MAX] = "";
    size_t n_live = 0;
    int64_t deadline;
    keel_status st;
    if (c == NULL)
        return keel__fail(KEEL_EINVAL, "coordinator: NULL");
    pthread_mutex_lock(&c->mu);
    while (!c->is_stopped && !all_done(c))
        keel__cond_wait_until(&c->cv, &c->mu, -1);
    deadline = keel__now_mono_ns() + (grace_ms > 0 ? grace_ms : 0) * 1000000;
    while (!all_done(c))
        if (keel__cond_wait_until(&c->cv, &c->mu, deadline))
            break;
    for (pp = &c->threads; *pp != NULL;) {
        t = *pp;
        if (t->is_done) {
            *pp = t->next;
            t->next = done;
            done = t;
        } else {
            size_t len = strlen(live);
            snprintf(live + len, sizeof live - len, "%s%s",
                     n_live > 0 ? ", " : "", t->name);
            n_live++;
            pp = &t->next;
        }
    }
    st = c->error;
    pthread_mutex_unlock(&c->mu);
    while (done != NULL) {
        t = done;
        done = t->next;
        pthread_join(t->tid, NULL);
        free(t);
    }
    if (st != KEEL_OK) {
        char msg[KEEL_ERR_MAX];
        keel_coord_error(c, msg, sizeof msg);
        return keel__fail(st, "%s", msg);
    }
    if (n_live > 0) {
        if (ignore_live_threads) {
            keel__log(KEEL_LOG_WARN, "coordinator stopped with threads still "
                      "running: %s", live);
            return KEEL_OK;
        }
        return keel__fail(KEEL_ETIMEOUT, "coordinator stopped with threads "
                          "still running after %lld ms grace: %s",
                          (long long)grace_ms, live);
    }
    return KEEL_OK;
}
