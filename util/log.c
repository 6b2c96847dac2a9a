/* log.c - the process-wide log handler (keel/log.h), clocks and the HDF5
 * lock. libkeel hands
 * lines to the handler and never writes to a stream itself. */
#include <config.h>

#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
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

const char *
keel__log_escape_n(char *out, size_t size, const char *in, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (size == 0)
        return out;
    for (size_t i = 0; in != NULL && i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        char e[4];
        size_t k = 0;
        if (c == '\\' || c == '\n' || c == '\r' || c == '\t') {
            e[k++] = '\\';
            e[k++] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't'
                                                                : '\\';
        } else if (c < 0x20 || c >= 0x7f) {
            e[k++] = '\\';
            e[k++] = 'x';
            e[k++] = hex[c >> 4];
            e[k++] = hex[c & 15];
        } else {
            e[k++] = (char)c;
        }
        if (o + k + 1 > size || (i + 1 < n && o + k + 4 > size)) {
            /* no room for this character and a cut mark after it */
            if (size >= 4) {
                while (o + 4 > size)
                    o--;
                memcpy(out + o, "...", 3);
                o += 3;
            }
            break;
        }
        memcpy(out + o, e, k);
        o += k;
    }
    out[o < size ? o : size - 1] = '\0';
    return out;
}

const char *
keel__log_escape(char *out, size_t size, const char *in)
{
    return keel__log_escape_n(out, size, in, in != NULL ? strlen(in) : 0);
}

int
keel__log_limit_take(keel__log_limit *l, int64_t now_ns, long *held)
{
    int64_t every = l->interval_ns > 0 ? l->interval_ns : KEEL__LOG_LIMIT_NS;
    l->total++;
    if (l->logged_ns != 0 && now_ns - l->logged_ns < every) {
        l->held++;
        return 0;
    }
    *held = l->held;
    l->held = 0;
    l->logged_ns = now_ns != 0 ? now_ns : 1;
    return 1;
}

long
keel__log_limit_flush(keel__log_limit *l)
{
    long n = l->held;
    l->held = 0;
    return n;
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
