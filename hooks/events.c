/* events.c - TensorBoard event files: Event protos encoded by hand in
 * TFRecord framing (events.out.tfevents.*), plus a scalars.csv mirror for
 * tools without TensorBoard. Also the buffered append-only file used by
 * trace.c. Field numbers follow tensorflow/core/util/event.proto and
 * tensorflow/core/framework/summary.proto. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <keel/events.h>
#include "util.h"
#include "events_int.h"

#define EV_BUF_BYTES (64u * 1024u)
#define EV_NAME_TRIES 100
#define EV_HOST_MAX 256
#define EV_FILE_VERSION "brain.Event:2"
#define EV_CSV_NAME "scalars.csv"
#define EV_CSV_HEADER "wall_time,step,tag,value\n"

/* Protobuf wire keys: (field << 3) | wire type (0 varint, 1 fixed64,
 * 2 length-delimited, 5 fixed32). */
#define PB_EVENT_WALL_TIME 0x09u    /* Event.wall_time = 1, double */
#define PB_EVENT_STEP 0x10u         /* Event.step = 2, int64 */
#define PB_EVENT_FILE_VERSION 0x1au /* Event.file_version = 3, string */
#define PB_EVENT_SUMMARY 0x2au      /* Event.summary = 5, Summary */
#define PB_SUMMARY_VALUE 0x0au      /* Summary.value = 1, repeated Value */
#define PB_VALUE_TAG 0x0au          /* Summary.Value.tag = 1, string */
#define PB_VALUE_SIMPLE 0x15u       /* Summary.Value.simple_value = 2, float */

/* Largest Event we build: wall_time 9 + step 11 + summary key/len 3 + value
 * key/len 3 + tag key/len 3 + tag + simple_value 5. */
#define EV_EVENT_MAX (64 + KEEL_EVENTS_TAG_MAX)

struct keel_events {
    keel__ev_out ev;
    keel__ev_out csv;
};

/* ---- buffered output ---------------------------------------------------- */

keel_status
keel__ev_out_open(keel__ev_out *o, const char *path, int flags)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->path = strdup(path);
    o->buf = malloc(EV_BUF_BYTES);
    if (o->path == NULL || o->buf == NULL) {
        free(o->path);
        free(o->buf);
        memset(o, 0, sizeof *o);
        o->fd = -1;
        return keel__fail(KEEL_ENOMEM, "open %s: buffer", path);
    }
    o->cap = EV_BUF_BYTES;
    o->fd = open(path, flags | O_CLOEXEC, 0644);
    if (o->fd < 0) {
        int e = errno;
        free(o->path);
        free(o->buf);
        memset(o, 0, sizeof *o);
        o->fd = -1;
        keel__fail(KEEL_EIO, "open %s: %s", path, strerror(e));
        errno = e;                      // callers look for EEXIST
        return KEEL_EIO;
    }
    return KEEL_OK;
}

static keel_status
ev_out_check(const keel__ev_out *o)
{
    if (o->fd < 0)
        return keel__fail(KEEL_ESTATE, "%s: already closed",
                          o->path ? o->path : "output file");
    if (o->is_broken)
        return keel__fail(KEEL_ESTATE, "%s: an earlier write failed (the file "
                          "may end in a torn record); open a new writer",
                          o->path);
    return KEEL_OK;
}

static keel_status
ev_out_drain(keel__ev_out *o, const void *data, size_t n)
{
    keel_status st = keel__fs_write_all(o->fd, data, n, o->path);
    if (st != KEEL_OK)
        o->is_broken = 1;
    return st;
}

keel_status
keel__ev_out_write(keel__ev_out *o, const void *data, size_t n)
{
    keel_status st = ev_out_check(o);
    if (st != KEEL_OK)
        return st;
    if (n > o->cap - o->len) {
        st = ev_out_drain(o, o->buf, o->len);
        o->len = 0;
        if (st != KEEL_OK)
            return st;
        if (n > o->cap)
            return ev_out_drain(o, data, n);
    }
    memcpy(o->buf + o->len, data, n);
    o->len += n;
    return KEEL_OK;
}

keel_status
keel__ev_out_flush(keel__ev_out *o, int do_fsync)
{
    keel_status st = ev_out_check(o);
    if (st != KEEL_OK)
        return st;
    if (o->len > 0) {
        st = ev_out_drain(o, o->buf, o->len);
        o->len = 0;
        if (st != KEEL_OK)
            return st;
    }
    if (do_fsync && keel__fs->fsync(o->fd) != 0) {
        o->is_broken = 1;
        return keel__fail(KEEL_EIO, "fsync %s: %s", o->path, strerror(errno));
    }
    return KEEL_OK;
}

keel_status
keel__ev_out_close(keel__ev_out *o)
{
    keel_status st = KEEL_OK;
    if (o->fd >= 0) {
        if (!o->is_broken)
            st = keel__ev_out_flush(o, 1);
        if (close(o->fd) != 0 && st == KEEL_OK)
            st = keel__fail(KEEL_EIO, "close %s: %s", o->path,
                            strerror(errno));
    }
    free(o->path);
    free(o->buf);
    memset(o, 0, sizeof *o);
    o->fd = -1;
    return st;
}

/* ---- protobuf encoding -------------------------------------------------- */

static size_t
pb_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80u) {
        p[n++] = (uint8_t)(v | 0x80u);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static size_t
pb_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80u) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t
pb_fixed64(uint8_t *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    keel__le_put(p, v, 8);
    return 8;
}

static size_t
pb_fixed32(uint8_t *p, float f)
{
    uint32_t v;
    memcpy(&v, &f, sizeof v);
    keel__le_put(p, v, 4);
    return 4;
}

/* Event header common to both kinds: wall_time, then step when nonzero
 * (proto3 leaves defaults out, as TensorFlow's serializer does). */
static size_t
pb_event_head(uint8_t *p, double wall_time, int64_t step)
{
    size_t n = 0;
    p[n++] = PB_EVENT_WALL_TIME;
    n += pb_fixed64(p + n, wall_time);
    if (step != 0) {
        p[n++] = PB_EVENT_STEP;
        n += pb_varint(p + n, (uint64_t)step);    // negatives: 10 bytes
    }
    return n;
}

static size_t
pb_scalar_event(uint8_t *p, double wall_time, int64_t step, const char *tag,
                size_t tag_len, float value)
{
    size_t value_len = 1 + pb_varint_len(tag_len) + tag_len + 1 + 4;
    size_t summary_len = 1 + pb_varint_len(value_len) + value_len;
    size_t n = pb_event_head(p, wall_time, step);
    p[n++] = PB_EVENT_SUMMARY;
    n += pb_varint(p + n, summary_len);
    p[n++] = PB_SUMMARY_VALUE;
    n += pb_varint(p + n, value_len);
    p[n++] = PB_VALUE_TAG;
    n += pb_varint(p + n, tag_len);
    memcpy(p + n, tag, tag_len);
    n += tag_len;
    p[n++] = PB_VALUE_SIMPLE;
    n += pb_fixed32(p + n, value);
    return n;
}

/* Frame an encoded Event at rec + KEEL__TFRECORD_HEAD (n bytes) in place
 * and append it to the event file. */
static keel_status
write_record(keel_events *w, uint8_t *rec, size_t n)
{
    keel__tfrecord_frame(rec + KEEL__TFRECORD_HEAD, n, rec,
                         rec + KEEL__TFRECORD_HEAD + n);
    return keel__ev_out_write(&w->ev, rec,
                              KEEL__TFRECORD_HEAD + n + KEEL__TFRECORD_TAIL);
}

/* ---- the writer --------------------------------------------------------- */

static void
host_name(char *buf, size_t size)
{
    if (gethostname(buf, size) != 0)
        buf[0] = '\0';
    buf[size - 1] = '\0';
    // The name becomes part of a file name: keep it to one path component.
    for (char *p = buf; *p != '\0'; p++)
        if (*p == '/')
            *p = '_';
    if (buf[0] == '\0')
        snprintf(buf, size, "localhost");
}

static keel_status
create_event_file(keel_events *w, const char *dir, const char *suffix,
                  long long secs)
{
    char host[EV_HOST_MAX];
    char name[KEEL_PATH_MAX], path[KEEL_PATH_MAX];
    keel_status st;
    host_name(host, sizeof host);
    for (int i = 0; i < EV_NAME_TRIES; i++) {
        char extra[16] = "";
        if (i > 0)
            snprintf(extra, sizeof extra, ".%d", i);
        // TensorFlow pads the seconds to 10 digits (%010lld); so do we.
        st = keel__fmt(name, sizeof name, "event file name",
                       "events.out.tfevents.%010lld.%s%s%s", secs, host,
                       suffix, extra);
        if (st == KEEL_OK)
            st = keel__path_join(path, sizeof path, dir, name);
        if (st != KEEL_OK)
            return st;
        st = keel__ev_out_open(&w->ev, path, O_WRONLY | O_CREAT | O_EXCL);
        if (st == KEEL_OK || errno != EEXIST)
            return st;
    }
    return keel__fail(KEEL_EIO, "events: %d event files named like %s "
                      "already exist; pass a distinct suffix",
                      EV_NAME_TRIES, path);
}

static keel_status
open_csv(keel_events *w, const char *dir)
{
    char path[KEEL_PATH_MAX];
    struct stat sb;
    keel_status st = keel__path_join(path, sizeof path, dir, EV_CSV_NAME);
    if (st != KEEL_OK)
        return st;
    st = keel__ev_out_open(&w->csv, path, O_RDWR | O_CREAT | O_APPEND);
    if (st != KEEL_OK)
        return st;
    if (fstat(w->csv.fd, &sb) != 0)
        return keel__fail(KEEL_EIO, "stat %s: %s", path, strerror(errno));
    if (sb.st_size == 0)
        return keel__ev_out_write(&w->csv, EV_CSV_HEADER,
                                  strlen(EV_CSV_HEADER));
    // A crash can leave a half row: end it so our first row starts clean.
    {
        char last;
        ssize_t r = pread(w->csv.fd, &last, 1, sb.st_size - 1);
        if (r != 1)
            return keel__fail(KEEL_EIO, "read %s: %s", path,
                              r < 0 ? strerror(errno) : "short read");
        if (last != '\n')
            return keel__ev_out_write(&w->csv, "\n", 1);
    }
    return KEEL_OK;
}

keel_status
keel_events_open(const char *dir, const char *suffix, keel_events **out)
{
    keel_events *w;
    keel_status st;
    double now = keel__now_wall();
    uint8_t rec[KEEL__TFRECORD_HEAD + EV_EVENT_MAX + KEEL__TFRECORD_TAIL];
    size_t n;

    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "events: out is NULL");
    *out = NULL;
    if (dir == NULL || dir[0] == '\0')
        return keel__fail(KEEL_EINVAL, "events: no directory given");
    if (suffix == NULL)
        suffix = "";
    if (strchr(suffix, '/') != NULL ||
        !keel__utf8_is_clean(suffix, strlen(suffix)))
        return keel__fail(KEEL_EINVAL, "events: suffix '%s' must be one "
                          "printable file name part (no '/')", suffix);
    st = keel__fs_mkdirs(dir);
    if (st != KEEL_OK)
        return keel__wrap(st, "events: output directory %s", dir);
    w = calloc(1, sizeof *w);
    if (w == NULL)
        return keel__fail(KEEL_ENOMEM, "events: %zu bytes", sizeof *w);
    w->ev.fd = -1;
    w->csv.fd = -1;
    st = create_event_file(w, dir, suffix, (long long)now);
    if (st == KEEL_OK)
        st = open_csv(w, dir);
    if (st == KEEL_OK) {
        n = pb_event_head(rec + KEEL__TFRECORD_HEAD, now, 0);
        rec[KEEL__TFRECORD_HEAD + n++] = PB_EVENT_FILE_VERSION;
        n += pb_varint(rec + KEEL__TFRECORD_HEAD + n,
                       strlen(EV_FILE_VERSION));
        memcpy(rec + KEEL__TFRECORD_HEAD + n, EV_FILE_VERSION,
               strlen(EV_FILE_VERSION));
        n += strlen(EV_FILE_VERSION);
        st = write_record(w, rec, n);
    }
    if (st == KEEL_OK)
        st = keel_events_flush(w);
    if (st == KEEL_OK)
        st = keel__fs_fsync_parent(w->ev.path);
    if (st != KEEL_OK) {
        // Leave no empty or half-written event file behind for TensorBoard.
        if (w->ev.path != NULL)
            unlink(w->ev.path);
        keel_events_close(w);
        return st;
    }
    *out = w;
    return KEEL_OK;
}

/* Tag in CSV form: quoted (RFC 4180, quotes doubled) only when needed. */
static void
csv_tag(char *buf, const char *tag, size_t len)
{
    size_t n = 0;
    if (strcspn(tag, ",\"") == len) {
        memcpy(buf, tag, len);
        buf[len] = '\0';
        return;
    }
    buf[n++] = '"';
    for (size_t i = 0; i < len; i++) {
        if (tag[i] == '"')
            buf[n++] = '"';
        buf[n++] = tag[i];
    }
    buf[n++] = '"';
    buf[n] = '\0';
}

keel_status
keel_events_scalar(keel_events *w, int64_t step, const char *tag,
                   double value)
{
    uint8_t rec[KEEL__TFRECORD_HEAD + EV_EVENT_MAX + KEEL__TFRECORD_TAIL];
    char qtag[2 * KEEL_EVENTS_TAG_MAX + 3];
    char row[2 * KEEL_EVENTS_TAG_MAX + 128];
    double now;
    size_t len, n;
    keel_status st;
    int r;

    if (w == NULL)
        return keel__fail(KEEL_EINVAL, "events: writer is NULL");
    if (tag == NULL)
        return keel__fail(KEEL_EINVAL, "events %s: tag is NULL", w->ev.path);
    len = strnlen(tag, KEEL_EVENTS_TAG_MAX + 1);
    if (len == 0 || len > KEEL_EVENTS_TAG_MAX)
        return keel__fail(KEEL_EINVAL, "events %s: step %lld: tag must be "
                          "1..%d bytes (got %s'%.32s...')", w->ev.path,
                          (long long)step, KEEL_EVENTS_TAG_MAX,
                          len == 0 ? "empty " : "", tag);
    if (!keel__utf8_is_clean(tag, len))
        return keel__fail(KEEL_EINVAL, "events %s: step %lld: tag is not "
                          "printable UTF-8 (control characters or bad "
                          "bytes)", w->ev.path, (long long)step);
    now = keel__now_wall();
    n = pb_scalar_event(rec + KEEL__TFRECORD_HEAD, now, step, tag, len,
                        (float)value);
    st = write_record(w, rec, n);
    if (st != KEEL_OK)
        return st;
    csv_tag(qtag, tag, len);
    r = snprintf(row, sizeof row, "%.6f,%lld,%s,%.9g\n", now,
                 (long long)step, qtag, value);
    if (r < 0 || (size_t)r >= sizeof row)
        return keel__fail(KEEL_EINTERNAL, "events %s: CSV row too long",
                          w->csv.path);
    return keel__ev_out_write(&w->csv, row, (size_t)r);
}

keel_status
keel_events_flush(keel_events *w)
{
    keel_status st;
    if (w == NULL)
        return keel__fail(KEEL_EINVAL, "events: writer is NULL");
    st = keel__ev_out_flush(&w->ev, 1);
    if (st == KEEL_OK)
        st = keel__ev_out_flush(&w->csv, 1);
    return st;
}

void
keel_events_close(keel_events *w)
{
    if (w == NULL)
        return;
    keel__ev_out_close(&w->ev);
    keel__ev_out_close(&w->csv);
    free(w);
}

const char *
keel_events_path(const keel_events *w)
{
    return w != NULL ? w->ev.path : NULL;
}

const char *
keel_events_csv_path(const keel_events *w)
{
    return w != NULL ? w->csv.path : NULL;
}
