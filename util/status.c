/* status.c - status names and the thread-local failure message. */
#include <config.h>

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/status.h>
#include "util.h"

static _Thread_local char last_error[KEEL_ERR_MAX];

const char *
keel_status_name(keel_status s)
{
    switch (s) {
    case KEEL_OK: return "success";
    case KEEL_EINVAL: return "invalid argument";
    case KEEL_ENOMEM: return "out of memory";
    case KEEL_EIO: return "I/O error";
    case KEEL_ECORRUPT: return "corrupt data";
    case KEEL_ETIMEOUT: return "timed out";
    case KEEL_EPEER: return "peer failed";
    case KEEL_EHOOK: return "hook failed";
    case KEEL_ESTATE: return "invalid state";
    case KEEL_EINTERNAL: return "internal error";
    case KEEL_ENOTFOUND: return "not found";
    case KEEL_EABORTED: return "aborted";
    case KEEL_EUNAVAILABLE: return "unavailable";
    case KEEL_EOUTOFRANGE: return "end of input";
    case KEEL_ECANCELLED: return "cancelled";
    }
    return "unknown status";
}

const char *
keel_last_error(void)
{
    return last_error;
}

int
keel_status_is_recoverable(keel_status s)
{
    return s == KEEL_EABORTED || s == KEEL_EUNAVAILABLE;
}

/* Store text (n bytes) as the thread's message. One longer than the
 * buffer keeps its head and its tail, where the reason usually is, with
 * " ... " between: a message is never cut before its reason. */
static void
put_error(const char *text, size_t n)
{
    static const char mid[] = " ... ";
    size_t head, tail;
    if (n < sizeof last_error) {
        memcpy(last_error, text, n + 1);
        return;
    }
    head = (sizeof last_error - sizeof mid) / 3;
    tail = sizeof last_error - sizeof mid - head;
    memcpy(last_error, text, head);
    memcpy(last_error + head, mid, sizeof mid - 1);
    memcpy(last_error + head + sizeof mid - 1, text + n - tail, tail);
    last_error[sizeof last_error - 1] = '\0';
}

/* fmt with ap into a malloc'd string (NULL when out of memory or fmt is
 * bad); *len its length. */
static char *
vformat(const char *fmt, va_list ap, size_t *len)
{
    va_list aq;
    char *buf;
    int n;
    va_copy(aq, ap);
    n = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    if (n < 0 || (buf = malloc((size_t)n + 1)) == NULL)
        return NULL;
    vsnprintf(buf, (size_t)n + 1, fmt, ap);
    *len = (size_t)n;
    return buf;
}

static keel_status
vfail(keel_status code, const char *fmt, va_list ap)
{
    size_t n = 0;
    char *text = vformat(fmt, ap, &n);
    if (text == NULL)
        snprintf(last_error, sizeof last_error, "%s", keel_status_name(code));
    else
        put_error(text, n);
    free(text);
    return code;
}

keel_status
keel_error_set(keel_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

/* The library's own name for the same call (util.h). */
keel_status keel__fail(keel_status code, const char *fmt, ...)
    __attribute__((alias("keel_error_set")));

keel_status
keel__struct_size_check(uint32_t struct_size, size_t min_size, size_t size,
                        const char *type)
{
    assert(type != NULL && min_size > 0 && min_size <= size);
    if (struct_size == 0)
        return keel__fail(KEEL_EINVAL, "%s has struct_size 0: fill it with "
                          "%s_init() before setting its members", type, type);
    if (struct_size < min_size || struct_size > size)
        return keel__fail(KEEL_EINVAL, "%s has struct_size %u, this libkeel "
                          "knows %zu..%zu: rebuild against its headers and "
                          "fill it with %s_init()", type, struct_size,
                          min_size, size, type);
    return KEEL_OK;
}

keel_status
keel__config_check(const void *cfg, const void *out, size_t min_size,
                   size_t size, const char *type, const char *who)
{
    uint32_t struct_size;
    keel_status st;
    if (cfg == NULL || out == NULL)
        return keel__fail(KEEL_EINVAL, "%s: %s is NULL", who,
                          cfg == NULL ? "cfg" : "out");
    memcpy(&struct_size, cfg, sizeof struct_size);
    st = keel__struct_size_check(struct_size, min_size, size, type);
    return st == KEEL_OK ? KEEL_OK : keel__wrap(st, "%s", who);
}

keel_status
keel__wrap(keel_status code, const char *fmt, ...)
{
    char cause[KEEL_ERR_MAX], *head, *all = NULL;
    size_t hn = 0, cn;
    va_list ap;
    memcpy(cause, last_error, sizeof cause);
    cn = strlen(cause);
    va_start(ap, fmt);
    head = vformat(fmt, ap, &hn);
    va_end(ap);
    if (head != NULL && cn > 0 && (all = malloc(hn + cn + 3)) != NULL) {
        memcpy(all, head, hn);
        memcpy(all + hn, ": ", 2);
        memcpy(all + hn + 2, cause, cn + 1);
        put_error(all, hn + cn + 2);
    } else if (head != NULL && cn == 0) {
        put_error(head, hn);
    } else if (head == NULL) {
        put_error(cause, cn);
    } else {
        snprintf(last_error, sizeof last_error, "%s: %s", head, cause);
    }
    free(all);
    free(head);
    return code;
}
