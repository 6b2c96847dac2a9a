/* log.c - the process-wide log handler (keel/log.h), clocks and the HDF5
 * lock. libkeel hands
 * lines to the handler and never writes to a stream itself. */
#include <config.h>

#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include <keel/log.h>
#include "util.h"

struct handler {
    keel_log_fn fn;
    void *ctx;
    keel_log_level min_level;
};

/* Copied out under the lock, so a background thread never sees a
 * half-updated handler; logging is never on a hot path. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct handler current;

static struct handler
get_handler(void)
{
    struct handler h;
    pthread_mutex_lock(&lock);
    h = current;
    pthread_mutex_unlock(&lock);
    return h;
}

void
keel_log_set_handler(keel_log_fn fn, void *ctx, keel_log_level min_level)
{
    pthread_mutex_lock(&lock);
    current.fn = fn;
    current.ctx = ctx;
    current.min_level = min_level;
    pthread_mutex_unlock(&lock);
}

const char *
keel_log_level_name(keel_log_level level)
{
    switch (level) {
    case KEEL_LOG_DEBUG: return "debug";
    case KEEL_LOG_INFO: return "info";
    case KEEL_LOG_WARN: return "warning";
    case KEEL_LOG_ERROR: return "error";
    }
    return "log";
}

void
keel__log(keel_log_level level, const char *fmt, ...)
{
    struct handler h = get_handler();
    char line[1024];
    va_list ap;
    if (h.fn == NULL || level < h.min_level)
        return;
    va_start(ap, fmt);
    if (vsnprintf(line, sizeof line, fmt, ap) < 0)
        line[0] = '\0';
    va_end(ap);
    h.fn(h.ctx, level, line);
}

int64_t
keel__now_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double
keel__now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static pthread_mutex_t h5_mutex = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

void
keel__h5_lock(void)
{
    pthread_mutex_lock(&h5_mutex);
}

void
keel__h5_unlock(void)
{
    pthread_mutex_unlock(&h5_mutex);
}
