/* keel/events.h - TensorBoard event files (TFRecord-framed Event protos,
 * readable by `tensorboard --logdir DIR`), a scalars.csv beside them, and
 * Chrome trace JSON (chrome://tracing, Perfetto). Depends on nothing but
 * libc. Thread-compatible: one thread per writer or trace at a time. */
#ifndef KEEL_EVENTS_H
#define KEEL_EVENTS_H

#include <stdint.h>
#include <keel/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_events keel_events;
typedef struct keel_trace keel_trace;

/* Longest tag accepted by keel_events_scalar, in bytes. */
#define KEEL_EVENTS_TAG_MAX 256
/* Longest trace event name or category, in bytes. */
#define KEEL_TRACE_NAME_MAX 1024

/* Create <dir>/events.out.tfevents.<unix-seconds>.<hostname><suffix> (suffix
 * may be NULL/"") and <dir>/scalars.csv (append; header
 * "wall_time,step,tag,value" when new). dir is created if missing. Writes
 * the first Event {wall_time, file_version: "brain.Event:2"}. If that event
 * file name is taken (same second, host and suffix), ".1", ".2", ... is
 * appended. Caller owns *out (keel_events_close); NULL on failure. */
keel_status keel_events_open(const char *dir, const char *suffix,
                             keel_events **out);
/* One Event {wall_time, step, summary {value {tag, simple_value}}} and one
 * CSV row. tag: 1..KEEL_EVENTS_TAG_MAX bytes of UTF-8 without control
 * characters (KEEL_EINVAL otherwise). value is stored as a float in the
 * event file (TensorBoard's simple_value) and as %.9g in the CSV. Data is
 * buffered until keel_events_flush/close. After a failed write the writer
 * refuses further calls (KEEL_ESTATE): the file may end in a torn record. */
keel_status keel_events_scalar(keel_events *w, int64_t step, const char *tag,
                               double value);
/* fflush + fsync both files. */
keel_status keel_events_flush(keel_events *w);
/* Flush and release; NULL is a no-op. Cannot report failure: call
 * keel_events_flush first when the last rows matter. */
void keel_events_close(keel_events *w);
/* Path of the event file / the CSV; borrowed until keel_events_close. */
const char *keel_events_path(const keel_events *w);
const char *keel_events_csv_path(const keel_events *w);

/* Chrome trace JSON: {"traceEvents":[ ... ]} with "X" (complete) events.
 * Creates or truncates path (its directory must exist). Caller owns *out
 * (keel_trace_close); NULL on failure. */
keel_status keel_trace_open(const char *path, keel_trace **out);
/* One complete event: name (required) and cat (NULL for none) are UTF-8
 * without control characters, at most KEEL_TRACE_NAME_MAX bytes; ts_us and
 * dur_us >= 0 are microseconds; pid is this process, tid is the caller's
 * lane number. Buffered until flush/close. */
keel_status keel_trace_event(keel_trace *t, const char *name, const char *cat,
                             int64_t ts_us, int64_t dur_us, int tid);
/* Write buffered events and fsync. The file is not valid JSON until close
 * (appending "]}" repairs a file left by a crash). */
keel_status keel_trace_flush(keel_trace *t);
/* Writes the closing brackets, fsync; frees t even on error. NULL is
 * KEEL_OK. */
keel_status keel_trace_close(keel_trace *t);

#ifdef __cplusplus
}
#endif
#endif
