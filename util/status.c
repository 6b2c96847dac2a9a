/* status.c - status names and the thread-local failure message. */
#include <config.h>

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
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

static keel_status
vfail(keel_status code, const char *fmt, va_list ap)
{
    char tmp[KEEL_ERR_MAX];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    if (n < 0)
        snprintf(tmp, sizeof tmp, "%s", keel_status_name(code));
    memcpy(last_error, tmp, sizeof tmp);
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
    char cause[KEEL_ERR_MAX], head[KEEL_ERR_MAX];
    va_list ap;
    memcpy(cause, last_error, sizeof cause);
    va_start(ap, fmt);
    if (vsnprintf(head, sizeof head, fmt, ap) < 0)
        head[0] = '\0';
    va_end(ap);
    if (cause[0] != '\0')
        snprintf(last_error, sizeof last_error, "%s: %s", head, cause);
    else
        snprintf(last_error, sizeof last_error, "%s", head);
    return code;
}
