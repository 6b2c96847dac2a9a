/* events_api.h - TEMPORARY: the keel_events/keel_trace contract (branch
 * `events`, include/keel/events.h) until that branch is merged; then this
 * file includes <keel/events.h> instead. */
#ifndef KEEL_HOOKS_EVENTS_API_H
#define KEEL_HOOKS_EVENTS_API_H

#include <stdint.h>
#include <keel/status.h>

typedef struct keel_events keel_events;
typedef struct keel_trace keel_trace;

keel_status keel_events_open(const char *dir, const char *suffix,
                             keel_events **out);
keel_status keel_events_scalar(keel_events *w, int64_t step, const char *tag,
                               double value);
keel_status keel_events_flush(keel_events *w);
void keel_events_close(keel_events *w);
keel_status keel_trace_open(const char *path, keel_trace **out);
keel_status keel_trace_event(keel_trace *t, const char *name, const char *cat,
                             int64_t ts_us, int64_t dur_us, int tid);
keel_status keel_trace_close(keel_trace *t);

#endif
