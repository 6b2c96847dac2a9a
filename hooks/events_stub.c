/* events_stub.c - TEMPORARY: weak stand-ins for the events API until the
 * events branch is merged (real definitions override them). Opening fails
 * with KEEL_EINTERNAL. Delete when hooks/events.c lands. */
#include <config.h>

#include "util.h"
#include "events_api.h"

#define KEEL_WEAK __attribute__((weak))

KEEL_WEAK keel_status
keel_events_open(const char *dir, const char *suffix, keel_events **out)
{
    (void)dir; (void)suffix;
    *out = NULL;
    return keel__fail(KEEL_EINTERNAL, "events writer not built");
}

KEEL_WEAK keel_status
keel_events_scalar(keel_events *w, int64_t step, const char *tag, double v)
{
    (void)w; (void)step; (void)tag; (void)v;
    return KEEL_OK;
}

KEEL_WEAK keel_status
keel_events_flush(keel_events *w)
{
    (void)w;
    return KEEL_OK;
}

KEEL_WEAK void
keel_events_close(keel_events *w)
{
    (void)w;
}

KEEL_WEAK keel_status
keel_trace_open(const char *path, keel_trace **out)
{
    (void)path;
    *out = NULL;
    return keel__fail(KEEL_EINTERNAL, "trace writer not built");
}

KEEL_WEAK keel_status
keel_trace_event(keel_trace *t, const char *name, const char *cat,
                 int64_t ts_us, int64_t dur_us, int tid)
{
    (void)t; (void)name; (void)cat; (void)ts_us; (void)dur_us; (void)tid;
    return KEEL_OK;
}

KEEL_WEAK keel_status
keel_trace_close(keel_trace *t)
{
    (void)t;
    return KEEL_OK;
}
