/* trace.c - Chrome trace JSON ({"traceEvents":[...]}, "X" complete events)
 * for chrome://tracing and Perfetto: one buffered append per event, the
 * closing brackets at close. Not an event file: no framing, no CRC. */
#include <config.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include <keel/events.h>
#include "util.h"
#include "events_int.h"

#define TRACE_HEAD "{\"traceEvents\":[\n"
#define TRACE_TAIL "\n]}\n"

struct keel_trace {
    keel__ev_out out;
    long pid;
    uint64_t n_events;
};

keel_status
keel_trace_open(const char *path, keel_trace **out)
{
    keel_trace *t;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "trace: out is NULL");
    *out = NULL;
    if (path == NULL || path[0] == '\0')
        return keel__fail(KEEL_EINVAL, "trace: no path given");
    t = calloc(1, sizeof *t);
    if (t == NULL)
        return keel__fail(KEEL_ENOMEM, "trace: %zu bytes", sizeof *t);
    t->pid = (long)getpid();
    st = keel__ev_out_open(&t->out, path, O_WRONLY | O_CREAT | O_TRUNC);
    if (st == KEEL_OK)
        st = keel__ev_out_write(&t->out, TRACE_HEAD, strlen(TRACE_HEAD));
    if (st != KEEL_OK) {
        keel__ev_out_close(&t->out);
        free(t);
        return keel__wrap(st, "trace");
    }
    *out = t;
    return KEEL_OK;
}

static keel_status
check_text(const keel_trace *t, const char *what, const char *s, size_t *len)
{
    *len = strnlen(s, KEEL_TRACE_NAME_MAX + 1);
    if (*len == 0 || *len > KEEL_TRACE_NAME_MAX)
        return keel__fail(KEEL_EINVAL, "trace %s: event %s must be 1..%d "
                          "bytes", t->out.path, what, KEEL_TRACE_NAME_MAX);
    if (!keel__utf8_is_clean(s, *len))
        return keel__fail(KEEL_EINVAL, "trace %s: event %s '%.32s' is not "
                          "printable UTF-8", t->out.path, what, s);
    return KEEL_OK;
}

keel_status
keel_trace_event(keel_trace *t, const char *name, const char *cat,
                 int64_t ts_us, int64_t dur_us, int tid)
{
    size_t name_len, cat_len = 0, n;
    json_object *ev;
    const char *rec;
    keel_status st;

    if (t == NULL)
        return keel__fail(KEEL_EINVAL, "trace: handle is NULL");
    if (name == NULL)
        return keel__fail(KEEL_EINVAL, "trace %s: event name is NULL",
                          t->out.path);
    st = check_text(t, "name", name, &name_len);
    if (st == KEEL_OK && cat != NULL)
        st = check_text(t, "category", cat, &cat_len);
    if (st != KEEL_OK)
        return st;
    if (ts_us < 0 || dur_us < 0)
        return keel__fail(KEEL_EINVAL, "trace %s: event '%s': negative "
                          "time (ts %lld us, dur %lld us)", t->out.path, name,
                          (long long)ts_us, (long long)dur_us);
    ev = json_object_new_object();
    if (ev == NULL)
        return keel__fail(KEEL_ENOMEM, "trace %s: event '%s'", t->out.path,
                          name);
    json_object_object_add(ev, "name", json_object_new_string_len(
                               name, (int)name_len));
    if (cat != NULL)
        json_object_object_add(ev, "cat", json_object_new_string_len(
                                   cat, (int)cat_len));
    json_object_object_add(ev, "ph", json_object_new_string("X"));
    json_object_object_add(ev, "ts", json_object_new_int64(ts_us));
    json_object_object_add(ev, "dur", json_object_new_int64(dur_us));
    json_object_object_add(ev, "pid", json_object_new_int64(t->pid));
    json_object_object_add(ev, "tid", json_object_new_int(tid));
    rec = json_object_to_json_string_length(
        ev, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n);
    st = rec == NULL ? keel__fail(KEEL_ENOMEM, "trace %s: event '%s'",
                                  t->out.path, name)
         : t->n_events > 0 ? keel__ev_out_write(&t->out, ",", 1)
                           : KEEL_OK;
    if (st == KEEL_OK)
        st = keel__ev_out_write(&t->out, rec, n);
    if (st == KEEL_OK)
        st = keel__ev_out_write(&t->out, "\n", 1);
    json_object_put(ev);
    if (st == KEEL_OK)
        t->n_events++;
    return st;
}

keel_status
keel_trace_flush(keel_trace *t)
{
    if (t == NULL)
        return keel__fail(KEEL_EINVAL, "trace: handle is NULL");
    return keel__ev_out_flush(&t->out, 1);
}

keel_status
keel_trace_close(keel_trace *t)
{
    keel_status st, st2;
    if (t == NULL)
        return KEEL_OK;
    st = keel__ev_out_write(&t->out, TRACE_TAIL, strlen(TRACE_TAIL));
    st2 = keel__ev_out_close(&t->out);      // flush + fsync + close
    free(t);
    return st != KEEL_OK ? st : st2;
}
