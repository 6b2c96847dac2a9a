/* wire.c - keel's binary message format over ZeroMQ: a fixed 64-byte
 * header frame, then a descriptor and a zero-copy data frame per tensor.
 * Decoding checks every count, length, name, shape and size against limits
 * before it allocates anything; nothing is ever deserialized beyond that.
 * Also the DEALER request/reply client. */
#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cluster_int.h"
#include "grow.h"

/* Message bytes this process sent and received (frames as sent; on
 * receipt without the identity frame): keel__wire_bytes. */
static _Atomic uint64_t bytes_out, bytes_in;

/* ---- header and descriptor ---------------------------------------------- */

void
keel__wire_limits_default(keel__wire_limits *l)
{
    if (l->max_tensors == 0)
        l->max_tensors = 65536;
    if (l->max_total_bytes == 0)
        l->max_total_bytes = (uint64_t)4 << 30;
    if (l->max_text == 0)
        l->max_text = 4096;
}

void
keel__wire_header_encode(const keel__wire_header *h,
                         unsigned char out[KEEL_WIRE_HEADER_SIZE])
{
    memset(out, 0, KEEL_WIRE_HEADER_SIZE);
    memcpy(out, "KEEL", 4);
    keel__le_put(out + 4, KEEL_WIRE_VERSION, 2);
    out[6] = h->type;
    out[7] = h->flags;
    keel__le_put(out + 8, h->request_id, 8);
    out[16] = h->sender_type;
    keel__le_put(out + 17, h->examples, 3);
    keel__le_put(out + 20, h->sender_index, 4);
    keel__le_put(out + 24, h->generation, 8);
    keel__le_put(out + 32, (uint64_t)h->global_step, 8);
    keel__le_put(out + 40, (uint64_t)h->local_step, 8);
    keel__le_put(out + 48, h->count, 4);
    keel__le_put(out + 52, h->arg, 4);
    keel__le_put(out + 56, h->peer_generation, 8);
}

keel_status
keel__wire_header_decode(const void *buf, size_t n, keel__wire_header *h)
{
    const unsigned char *p = buf;
    uint16_t version;
    if (n != KEEL_WIRE_HEADER_SIZE)
        return keel__fail(KEEL_ECORRUPT, "header frame is %zu bytes, not "
                          "%d", n, KEEL_WIRE_HEADER_SIZE);
    if (memcmp(p, "KEEL", 4) != 0)
        return keel__fail(KEEL_ECORRUPT, "bad magic (not a keel message)");
    version = keel__le_get(p + 4, 2);
    if (version != KEEL_WIRE_VERSION)
        return keel__fail(KEEL_ECORRUPT, "wire version %u (this keel speaks "
                          "%d)", version, KEEL_WIRE_VERSION);
    /* The request id first: a request refused below is still answered
     * under its own id, so its sender learns why instead of timing out. */
    h->request_id = keel__le_get(p + 8, 8);
    h->type = p[6];
    h->flags = p[7];
    if (h->type < KEEL_MSG_HELLO || h->type >= KEEL_MSG_TYPE_END)
        return keel__fail(KEEL_ECORRUPT, "unknown message type %u", h->type);
    if (h->flags & ~KEEL_WIRE_F_KNOWN)
        return keel__fail(KEEL_ECORRUPT, "unknown flags 0x%02x", h->flags);
    if ((h->flags & KEEL_WIRE_F_ROWS) && h->type != KEEL_MSG_PUSH)
        return keel__fail(KEEL_ECORRUPT, "flag ROWS in a message that is "
                          "not a PUSH");
    h->examples = (uint32_t)keel__le_get(p + 17, 3);
    if (h->examples != 0 && h->type != KEEL_MSG_PUSH)
        return keel__fail(KEEL_ECORRUPT, "example count %u in a message "
                          "that is not a PUSH", h->examples);
    h->sender_type = p[16];
    if (h->sender_type >= KEEL_TASK_TYPE_COUNT)
        return keel__fail(KEEL_ECORRUPT, "unknown sender task type %u",
                          h->sender_type);
    h->sender_index = keel__le_get(p + 20, 4);
    h->generation = keel__le_get(p + 24, 8);
    h->global_step = (int64_t)keel__le_get(p + 32, 8);
    h->local_step = (int64_t)keel__le_get(p + 40, 8);
    h->count = keel__le_get(p + 48, 4);
    h->arg = keel__le_get(p + 52, 4);
    h->peer_generation = keel__le_get(p + 56, 8);
    return KEEL_OK;
}

size_t
keel__wire_desc_encode(const char *name, int ndim, const int64_t *shape,
                       unsigned char *buf, size_t size)
{
    size_t len = strlen(name), need = 4 + 8 * (size_t)ndim + len;
    if (need > size || len > 0xffff || ndim < 0 || ndim > KEEL_MAX_DIMS)
        return 0;
    keel__le_put(buf, len, 2);
    buf[2] = KEEL_WIRE_DTYPE_F32;
    buf[3] = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++)
        keel__le_put(buf + 4 + 8 * i, (uint64_t)shape[i], 8);
    memcpy(buf + 4 + 8 * ndim, name, len);
    return need;
}

/* Decode one descriptor into wt (name copied, shape set, count computed). */
static keel_status
desc_decode(const unsigned char *p, size_t n, size_t i, keel__wire_tensor *wt)
{
    size_t len, ndim;
    if (n < 4)
        return keel__fail(KEEL_ECORRUPT, "tensor %zu: descriptor of %zu "
                          "bytes is truncated", i, n);
    len = keel__le_get(p, 2);
    if (p[2] != KEEL_WIRE_DTYPE_F32)
        return keel__fail(KEEL_ECORRUPT, "tensor %zu: dtype %u (only "
                          "float32=1)", i, p[2]);
    ndim = p[3];
    if (ndim > KEEL_MAX_DIMS)
        return keel__fail(KEEL_ECORRUPT, "tensor %zu: ndim %zu > %d", i,
                          ndim, KEEL_MAX_DIMS);
    if (len == 0 || len >= KEEL_NAME_MAX)
        return keel__fail(KEEL_ECORRUPT, "tensor %zu: name length %zu not in "
                          "1..%d", i, len, KEEL_NAME_MAX - 1);
    if (n != 4 + 8 * ndim + len)
        return keel__fail(KEEL_ECORRUPT, "tensor %zu: descriptor is %zu "
                          "bytes, expected %zu", i, n, 4 + 8 * ndim + len);
    memcpy(wt->name, p + 4 + 8 * ndim, len);
    wt->name[len] = '\0';
    /* a variable's or slot's name, or the metrics, membership or ids
     * tensor's (no variable's: keel_name_is_valid refuses ':') */
    if (memchr(wt->name, '\0', len) != NULL ||
        (!keel_name_is_valid(wt->name) &&
         strcmp(wt->name, KEEL__WIRE_METRICS_NAME) != 0 &&
         strcmp(wt->name, KEEL__WIRE_MEMBERSHIP_NAME) != 0 &&
         strcmp(wt->name, KEEL__WIRE_IDS_NAME) != 0))
        return keel__fail(KEEL_ECORRUPT, "tensor %zu: invalid name", i);
    wt->t.ndim = (int)ndim;
    for (int d = 0; d < KEEL_MAX_DIMS; d++)
        wt->t.shape[d] = 1;
    for (size_t d = 0; d < ndim; d++) {
        int64_t v = (int64_t)keel__le_get(p + 4 + 8 * d, 8);
        if (v <= 0)
            return keel__fail(KEEL_ECORRUPT, "tensor %zu '%s': dimension %zu "
                              "is %lld (must be > 0)", i, wt->name, d,
                              (long long)v);
        wt->t.shape[d] = v;
    }
    if (keel_shape_count(wt->t.ndim, wt->t.shape, &wt->t.count) != KEEL_OK)
        return keel__fail(KEEL_ECORRUPT, "tensor %zu '%s': element count "
                          "overflows", i, wt->name);
    return KEEL_OK;
}

/* ---- messages ----------------------------------------------------------- */

void
keel__wire_msg_init(keel__wire_msg *m)
{
    memset(m, 0, sizeof *m);
}

void
keel__wire_msg_clear(keel__wire_msg *m)
{
    if (m == NULL)
        return;
    if (m->has_identity)
        zmq_msg_close(&m->identity);
    for (size_t i = 0; i < m->n_frames; i++)
        zmq_msg_close(&m->frames[i]);
    free(m->frames);
    for (size_t i = 0; i < m->n_copies; i++)
        keel_aligned_free(m->copies[i]);
    free(m->copies);
    free(m->tensors);
    free(m->text);
    memset(m, 0, sizeof *m);
}

/* The frame layout the header announces, checked against n_frames and the
 * limits before anything is allocated: the tensor count, the number of
 * frames, and the text frame's length and content. */
static keel_status
decode_check_layout(const keel__wire_msg *m, const keel__wire_limits *lim)
{
    int names_only = (m->h.flags & KEEL_WIRE_F_NAMES_ONLY) != 0;
    int has_text = (m->h.flags & KEEL_WIRE_F_TEXT) != 0;
    size_t per, want;
    if (m->h.count > lim->max_tensors)
        return keel__fail(KEEL_ECORRUPT, "%u tensors (limit %zu)",
                          m->h.count, lim->max_tensors);
    per = names_only ? 1 : 2;
    want = 1 + per * (size_t)m->h.count + (has_text ? 1 : 0);
    if (m->n_frames != want)
        return keel__fail(KEEL_ECORRUPT, "%zu frames for %u tensor%s%s "
                          "(expected %zu)", m->n_frames, m->h.count,
                          m->h.count == 1 ? "" : "s",
                          has_text ? " and text" : "", want);
    if (has_text) {
        zmq_msg_t *tf = &m->frames[m->n_frames - 1];
        size_t tl = zmq_msg_size(tf);
        if (tl > lim->max_text)
            return keel__fail(KEEL_ECORRUPT, "text of %zu bytes (limit %zu)",
                              tl, lim->max_text);
        if (memchr(zmq_msg_data(tf), '\0', tl) != NULL)
            return keel__fail(KEEL_ECORRUPT, "text contains NUL");
    }
    return KEEL_OK;
}

/* Copy a data frame that libzmq delivered misaligned for float into an
 * aligned buffer m owns; *p then points at the copy. */
static keel_status
decode_align(keel__wire_msg *m, const keel__wire_tensor *wt, void **p,
             size_t bytes)
{
    void *c = keel_aligned_alloc(bytes);
    void **cs;
    if (c == NULL)
        return keel__fail(KEEL_ENOMEM, "aligned copy of '%s'", wt->name);
    cs = realloc(m->copies, (m->n_copies + 1) * sizeof *cs);
    if (cs == NULL) {
        keel_aligned_free(c);
        return keel__fail(KEEL_ENOMEM, "copy list");
    }
    m->copies = cs;
    m->copies[m->n_copies++] = c;
    memcpy(c, *p, bytes);
    *p = c;
    return KEEL_OK;
}

/* Point wt's data at its data frame (in place, unless misaligned), after
 * checking the frame's size against wt's shape and the running total
 * against the limit. */
static keel_status
decode_data(keel__wire_msg *m, keel__wire_tensor *wt, zmq_msg_t *data,
            const keel__wire_limits *lim, uint64_t *total)
{
    size_t bytes = zmq_msg_size(data);
    void *p = zmq_msg_data(data);
    if (wt->t.count > SIZE_MAX / sizeof(float) ||
        bytes != wt->t.count * sizeof(float))
        return keel__fail(KEEL_ECORRUPT, "tensor '%s': data frame is "
                          "%zu bytes, shape needs %zu x 4", wt->name,
                          bytes, wt->t.count);
    *total += bytes;
    if (*total > lim->max_total_bytes)
        return keel__fail(KEEL_ECORRUPT, "tensor data exceeds %llu "
                          "bytes at '%s'",
                          (unsigned long long)lim->max_total_bytes,
                          wt->name);
    /* the ids of gradient rows are int64 */
    if (((uintptr_t)p % (strcmp(wt->name, KEEL__WIRE_IDS_NAME) == 0
                         ? _Alignof(int64_t) : _Alignof(float))) != 0) {
        keel_status st = decode_align(m, wt, &p, bytes);
        if (st != KEEL_OK)
            return st;
    }
    wt->t.data = p;
    wt->t.is_owner = 0;
    return KEEL_OK;
}

/* Copy the last frame, already checked by decode_check_layout, into m->text
 * as a C string. */
static keel_status
decode_text(keel__wire_msg *m)
{
    zmq_msg_t *tf = &m->frames[m->n_frames - 1];
    size_t tl = zmq_msg_size(tf);
    m->text = malloc(tl + 1);
    if (m->text == NULL)
        return keel__fail(KEEL_ENOMEM, "text of %zu bytes", tl);
    memcpy(m->text, zmq_msg_data(tf), tl);
    m->text[tl] = '\0';
    return KEEL_OK;
}

keel_status
keel__wire_decode(zmq_msg_t *frames, size_t n_frames,
                  const keel__wire_limits *lim_in, keel__wire_msg *m)
{
    keel__wire_limits lim = *lim_in;
    int names_only;
    size_t per, i;
    uint64_t total = 0;
    keel_status st;

    keel__wire_limits_default(&lim);
    m->frames = frames;
    m->n_frames = n_frames;
    if (n_frames == 0)
        return keel__fail(KEEL_ECORRUPT, "empty message");
    st = keel__wire_header_decode(zmq_msg_data(&frames[0]),
                                  zmq_msg_size(&frames[0]), &m->h);
    if (st != KEEL_OK)
        return st;
    if ((st = decode_check_layout(m, &lim)) != KEEL_OK)
        return st;
    names_only = (m->h.flags & KEEL_WIRE_F_NAMES_ONLY) != 0;
    per = names_only ? 1 : 2;
    /* Every size is known to be bounded now: allocate. */
    if (m->h.count > 0) {
        m->tensors = calloc(m->h.count, sizeof *m->tensors);
        if (m->tensors == NULL)
            return keel__fail(KEEL_ENOMEM, "%u tensor slots", m->h.count);
    }
    for (i = 0; i < m->h.count; i++) {
        keel__wire_tensor *wt = &m->tensors[i];
        zmq_msg_t *df = &frames[1 + per * i];
        st = desc_decode(zmq_msg_data(df), zmq_msg_size(df), i, wt);
        if (st != KEEL_OK)
            return st;
        if (names_only)
            continue;
        st = decode_data(m, wt, &frames[2 + per * i], &lim, &total);
        if (st != KEEL_OK)
            return st;
    }
    if ((m->h.flags & KEEL_WIRE_F_TEXT) != 0 &&
        (st = decode_text(m)) != KEEL_OK)
        return st;
    m->n = m->h.count;
    return KEEL_OK;
}

/* Wait until sock has a message, up to timeout_ms (-1: forever). A signal
 * (SIGTERM for a clean stop) must not fail the call: poll again for the
 * rest of the time. */
static keel_status
recv_poll(void *sock, int timeout_ms)
{
    zmq_pollitem_t item = { sock, 0, ZMQ_POLLIN, 0 };
    int64_t deadline = keel__now_mono_ns() + (int64_t)timeout_ms * 1000000;
    int rc;
    for (;;) {
        int left = timeout_ms;
        if (timeout_ms >= 0) {
            int64_t l = (deadline - keel__now_mono_ns()) / 1000000;
            left = l < 0 ? 0 : (int)l;
        }
        rc = zmq_poll(&item, 1, left);
        if (rc >= 0 || errno != EINTR)
            break;
    }
    if (rc < 0)
        return keel__fail(errno == ETERM ? KEEL_ECANCELLED : KEEL_EIO,
                          "poll: %s", zmq_strerror(errno));
    if (rc == 0)
        return keel__fail(KEEL_ETIMEOUT, "no message within %d ms",
                          timeout_ms);
    return KEEL_OK;
}

/* A ROUTER's identity frame into m->identity; a header frame must follow. */
static keel_status
recv_identity(void *sock, keel__wire_msg *m)
{
    zmq_msg_init(&m->identity);
    if (zmq_msg_recv(&m->identity, sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m->identity);
        return keel__fail(KEEL_EIO, "recv identity: %s",
                          zmq_strerror(errno));
    }
    m->has_identity = 1;
    if (!zmq_msg_more(&m->identity))
        return keel__fail(KEEL_ECORRUPT, "message has no header frame");
    return KEEL_OK;
}

static void
frames_close(zmq_msg_t *frames, size_t n)
{
    for (size_t i = 0; i < n; i++)
        zmq_msg_close(&frames[i]);
    free(frames);
}

/* All parts of a multipart message arrive together: drain them into
 * *frames (*n of them). Frames past max_frames, or past a failed growth of
 * the array, are received and dropped, and *too_many is set. A failed
 * receive closes what was kept. */
static keel_status
recv_frames(void *sock, size_t max_frames, zmq_msg_t **frames, size_t *n,
            int *too_many)
{
    size_t cap = 0;
    int more = 1;
    while (more) {
        zmq_msg_t f;
        zmq_msg_t *nf;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            frames_close(*frames, *n);
            *frames = NULL;
            return keel__fail(KEEL_EIO, "recv frame %zu: %s", *n,
                              zmq_strerror(errno));
        }
        more = zmq_msg_more(&f);
        atomic_fetch_add_explicit(&bytes_in, (uint64_t)zmq_msg_size(&f),
                                  memory_order_relaxed);
        if (*n >= max_frames) {
            *too_many = 1;
            zmq_msg_close(&f);
            continue;
        }
        nf = keel__grow(*frames, &cap, *n, sizeof *nf, 8);
        if (nf == NULL) {
            zmq_msg_close(&f);
            *too_many = 1;          /* keep draining, then fail */
            continue;
        }
        *frames = nf;
        (*frames)[(*n)++] = f;
    }
    return KEEL_OK;
}

keel_status
keel__wire_recv(void *sock, int has_identity, const keel__wire_limits *lim_in,
                int timeout_ms, keel__wire_msg *m)
{
    keel__wire_limits lim = *lim_in;
    zmq_msg_t *frames = NULL;
    size_t n = 0, max_frames;
    int too_many = 0;
    keel_status st;

    keel__wire_limits_default(&lim);
    keel__wire_msg_init(m);
    max_frames = 2 + 2 * lim.max_tensors + 1;
    if ((st = recv_poll(sock, timeout_ms)) != KEEL_OK)
        return st;
    if (has_identity && (st = recv_identity(sock, m)) != KEEL_OK)
        return st;
    st = recv_frames(sock, max_frames, &frames, &n, &too_many);
    if (st != KEEL_OK)
        return st;
    if (too_many) {
        if (n > 0)      /* the request id, to answer under it */
            (void)keel__wire_header_decode(zmq_msg_data(&frames[0]),
                                           zmq_msg_size(&frames[0]), &m->h);
        frames_close(frames, n);
        return keel__fail(KEEL_ECORRUPT, "more than %zu frames", max_frames);
    }
    return keel__wire_decode(frames, n, &lim, m);
}

/* ---- sending ------------------------------------------------------------ */

/* A buffer handed over (keel__wire_pin_hand_over): freed with free_fn
 * when its last frame is released. */
typedef struct pin_owner {
    void *buf;
    void (*free_fn)(void *);
    long frames;
} pin_owner;

/* A tracking pin's frames in flight whose data starts at data. */
struct keel__wire_pinned {
    const void *data;
    long frames;
    pin_owner *owner;            /* NULL: the caller's buffer */
    keel__wire_pinned *next;
};

void
keel__wire_pin_init(keel__wire_pin *p, int track)
{
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->pending = 0;
    p->track = track;
    p->bufs = NULL;
}

/* Under p->mu: one frame of e released; the owner to free, if that was
 * its buffer's last. */
static pin_owner *
pinned_release(keel__wire_pin *p, keel__wire_pinned *e)
{
    pin_owner *done = NULL;
    e->frames--;
    if (e->owner != NULL) {
        if (--e->owner->frames == 0)
            done = e->owner;
    } else {
        p->pending--;
    }
    if (e->frames == 0) {
        keel__wire_pinned **pp = &p->bufs;
        while (*pp != e)
            pp = &(*pp)->next;
        *pp = e->next;
        free(e);
    }
    return done;
}

static void
owner_free(pin_owner *o)
{
    if (o == NULL)
        return;
    o->free_fn(o->buf);
    free(o);
}

void
keel__wire_pin_destroy(keel__wire_pin *p)
{
    while (p->bufs != NULL) {
        keel__wire_pinned *e = p->bufs;
        pin_owner *done = NULL;
        for (long n = e->frames; n > 0; n--) {  /* e goes with its last */
            pin_owner *d = pinned_release(p, e);
            if (d != NULL)
                done = d;
        }
        owner_free(done);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

static void
pin_release(void *data, void *hint)
{
    keel__wire_pin *p = hint;
    pin_owner *done = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->track) {
        keel__wire_pinned *e = p->bufs;
        while (e != NULL && e->data != data)
            e = e->next;
        if (e != NULL)
            done = pinned_release(p, e);
    } else {
        p->pending--;
    }
    if (p->pending == 0)
        pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    owner_free(done);
}

/* Count one more frame of data in flight under p; 0 when a tracking pin
 * has no memory for it (the frame is then copied). */
static int
pin_take(keel__wire_pin *p, const void *data)
{
    keel__wire_pinned *e = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->track) {
        for (e = p->bufs; e != NULL; e = e->next)
            if (e->data == data && e->owner == NULL)
                break;
        if (e == NULL && (e = calloc(1, sizeof *e)) != NULL) {
            e->data = data;
            e->next = p->bufs;
            p->bufs = e;
        }
        if (e == NULL) {
            pthread_mutex_unlock(&p->mu);
            return 0;
        }
        e->frames++;
    }
    p->pending++;
    pthread_mutex_unlock(&p->mu);
    return 1;
}

/* 1 when e's frames lie in [buf, buf + bytes) and are the caller's. */
static int
pinned_in(const keel__wire_pinned *e, const void *buf, size_t bytes)
{
    uintptr_t d = (uintptr_t)e->data, b = (uintptr_t)buf;
    return e->owner == NULL && d >= b && d - b < bytes;
}

int
keel__wire_pin_holds(keel__wire_pin *p, const void *buf, size_t bytes)
{
    int held = 0;
    pthread_mutex_lock(&p->mu);
    for (keel__wire_pinned *e = p->bufs; e != NULL && !held; e = e->next)
        held = pinned_in(e, buf, bytes);
    pthread_mutex_unlock(&p->mu);
    return held;
}

int
keel__wire_pin_hand_over(keel__wire_pin *p, void *buf, size_t bytes,
                         void (*free_fn)(void *))
{
    pin_owner *o = malloc(sizeof *o);
    long frames = 0;
    if (o == NULL)
        return -1;
    pthread_mutex_lock(&p->mu);
    for (keel__wire_pinned *e = p->bufs; e != NULL; e = e->next)
        if (pinned_in(e, buf, bytes))
            frames += e->frames;
    if (frames > 0) {
        o->buf = buf;
        o->free_fn = free_fn;
        o->frames = frames;
        for (keel__wire_pinned *e = p->bufs; e != NULL; e = e->next)
            if (pinned_in(e, buf, bytes)) {
                p->pending -= e->frames;
                e->owner = o;
            }
        if (p->pending == 0)
            pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (frames == 0)
        free(o);
    return frames > 0;
}

keel_status
keel__wire_pin_wait(keel__wire_pin *p, int timeout_ms)
{
    struct timespec dl;
    int rc = 0;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0 && rc == 0)
        rc = pthread_cond_timedwait(&p->cv, &p->mu, &dl);
    rc = p->pending > 0;
    pthread_mutex_unlock(&p->mu);
    return rc ? keel__fail(KEEL_ETIMEOUT, "zero-copy frames still in flight "
                           "after %d ms", timeout_ms) : KEEL_OK;
}

void
keel__wire_bytes(uint64_t *in, uint64_t *out)
{
    *in = atomic_load_explicit(&bytes_in, memory_order_relaxed);
    *out = atomic_load_explicit(&bytes_out, memory_order_relaxed);
}

static keel_status
send_frame(void *sock, zmq_msg_t *f, int more)
{
    int rc;
    do      /* a signal interrupting a blocking send: send again */
        rc = zmq_msg_send(f, sock, more ? ZMQ_SNDMORE : 0);
    while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        int e = errno;
        zmq_msg_close(f);
        return keel__fail(e == EAGAIN ? KEEL_ETIMEOUT : KEEL_EUNAVAILABLE,
                          "send: %s", zmq_strerror(e));
    }
    atomic_fetch_add_explicit(&bytes_out, (uint64_t)rc,
                              memory_order_relaxed);
    return KEEL_OK;
}

static keel_status
send_bytes(void *sock, const void *buf, size_t n, int more)
{
    zmq_msg_t f;
    if (zmq_msg_init_size(&f, n) != 0)
        return keel__fail(KEEL_ENOMEM, "message frame of %zu bytes", n);
    if (n > 0)
        memcpy(zmq_msg_data(&f), buf, n);
    return send_frame(sock, &f, more);
}

/* A copy of a ROUTER peer's identity frame, sent ahead of the message. */
static keel_status
send_identity(void *sock, zmq_msg_t *identity)
{
    zmq_msg_t id;
    zmq_msg_init(&id);
    if (zmq_msg_copy(&id, identity) != 0) {
        zmq_msg_close(&id);
        return keel__fail(KEEL_EINTERNAL, "copy identity");
    }
    return send_frame(sock, &id, 1);
}

/* t's data frame: zero-copy under pin (libzmq releases it later), copied
 * when pin is NULL. */
static keel_status
send_data(void *sock, const keel_tensor *t, keel__wire_pin *pin, int more)
{
    zmq_msg_t f;
    if (pin == NULL || !pin_take(pin, t->data))
        return send_bytes(sock, t->data, t->count * sizeof(float), more);
    if (zmq_msg_init_data(&f, t->data, t->count * sizeof(float),
                          pin_release, pin) != 0) {
        pin_release(t->data, pin);
        return keel__fail(KEEL_ENOMEM, "send: data frame");
    }
    return send_frame(sock, &f, more);
}

/* One tensor's descriptor frame and, unless names_only, its data frame;
 * last: no frame follows it. */
static keel_status
send_tensor(void *sock, const keel__wire_out *o, int names_only, int last,
            keel__wire_pin *pin)
{
    unsigned char desc[4 + 8 * KEEL_MAX_DIMS + KEEL_NAME_MAX];
    const keel_tensor *t = o->t;
    int64_t scalar[1] = { 1 };
    size_t dl = keel__wire_desc_encode(o->name, t ? t->ndim : 0,
                                       t ? t->shape : scalar, desc,
                                       sizeof desc);
    keel_status st;
    if (dl == 0)
        return keel__fail(KEEL_EINVAL, "send: tensor '%.64s' cannot be "
                          "described", o->name);
    if ((st = send_bytes(sock, desc, dl, !(names_only && last))) != KEEL_OK)
        return st;
    if (names_only)
        return KEEL_OK;
    if (t == NULL || t->data == NULL)
        return keel__fail(KEEL_EINVAL, "send: tensor '%s' has no data",
                          o->name);
    return send_data(sock, t, o->pin != NULL ? o->pin : pin, !last);
}

keel_status
keel__wire_send(void *sock, zmq_msg_t *identity, const keel__wire_header *h_in,
                const keel__wire_out *ts, size_t n, const char *text,
                keel__wire_pin *pin)
{
    keel__wire_header h = *h_in;
    unsigned char hdr[KEEL_WIRE_HEADER_SIZE];
    int names_only;
    keel_status st;

    if (n > UINT32_MAX)
        return keel__fail(KEEL_EINVAL, "send: %zu tensors", n);
    h.count = (uint32_t)n;
    h.flags &= (uint8_t)~KEEL_WIRE_F_TEXT;
    if (text != NULL)
        h.flags |= KEEL_WIRE_F_TEXT;
    names_only = (h.flags & KEEL_WIRE_F_NAMES_ONLY) != 0;
    keel__wire_header_encode(&h, hdr);
    if (identity != NULL && (st = send_identity(sock, identity)) != KEEL_OK)
        return st;
    st = send_bytes(sock, hdr, sizeof hdr, n > 0 || text != NULL);
    if (st != KEEL_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        int last = i + 1 == n && text == NULL;
        if ((st = send_tensor(sock, &ts[i], names_only, last, pin)) !=
            KEEL_OK)
            return st;
    }
    if (text != NULL)
        return send_bytes(sock, text, strlen(text), 0);
    return KEEL_OK;
}

uint64_t
keel__wire_new_generation(void)
{
    uint64_t g = 0;
    if (getrandom(&g, sizeof g, 0) != (ssize_t)sizeof g)
        g = (uint64_t)keel__now_mono_ns() ^ ((uint64_t)getpid() << 32);
    return g ? g : 1;
}

static _Atomic int wire_sndbuf = KEEL__WIRE_SNDBUF;
static _Atomic uint64_t wire_max_frame;

void
keel__wire_set_max_frame(uint64_t bytes)
{
    atomic_store(&wire_max_frame, bytes);
}

void
keel__wire_set_send_buffer(int bytes)
{
    atomic_store(&wire_sndbuf, bytes > 0 ? bytes : -1);
}

keel_status
keel__wire_sockopts(void *sock, const keel__wire_limits *lim_in)
{
    keel__wire_limits lim = *lim_in;
    /* Reconnect every 20 ms (libzmq's default is 100 ms): a restarted ps is
     * found again, by heartbeats and clients, within one such interval.
     * Send buffer: KEEL__WIRE_SNDBUF (cluster_int.h) or cluster.send_
     * buffer_kib instead of the kernel's autotuned one (-1: autotuned). */
    int zero = 0, sndto = 10000, reconnect_ms = 20,
        sndbuf = atomic_load(&wire_sndbuf);
    int64_t maxmsg;
    uint64_t frame = lim.max_frame ? lim.max_frame
                                   : atomic_load(&wire_max_frame);
    keel__wire_limits_default(&lim);
    if (frame == 0 || frame > lim.max_total_bytes + KEEL__WIRE_FRAME_SLACK)
        frame = lim.max_total_bytes + KEEL__WIRE_FRAME_SLACK;
    maxmsg = frame > INT64_MAX / 2 ? -1 : (int64_t)frame;
    if (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDTIMEO, &sndto, sizeof sndto) != 0 ||
        zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0 ||
        zmq_setsockopt(sock, ZMQ_RECONNECT_IVL, &reconnect_ms,
                       sizeof reconnect_ms) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDBUF, &sndbuf, sizeof sndbuf) != 0)
        return keel__fail(KEEL_EIO, "socket options: %s",
                          zmq_strerror(errno));
    return KEEL_OK;
}

/* ---- client ------------------------------------------------------------- */

struct keel__wire_client {
    void *zctx;
    void *sock;
    keel_task_type type;
    int index;
    uint64_t generation;
    uint64_t next_id;
    keel__wire_limits limits;
    keel__wire_pin pin;
    char endpoint[KEEL_ADDR_MAX + 16];
};

keel_status
keel__wire_client_new(const char *endpoint, const keel__curve *curve,
                      keel_task_type type, int index,
                      keel__wire_client **out)
{
    keel__wire_client *c;
    keel_status st;
    *out = NULL;
    c = calloc(1, sizeof *c);
    if (c == NULL)
        return keel__fail(KEEL_ENOMEM, "client: %zu bytes", sizeof *c);
    keel__wire_pin_init(&c->pin, 0);
    c->type = type;
    c->index = index;
    c->generation = keel__wire_new_generation();
    c->next_id = 1;
    keel__wire_limits_default(&c->limits);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL) {
        keel__wire_client_free(c);
        return keel__fail(KEEL_EIO, "client: zmq_ctx_new: %s",
                          zmq_strerror(errno));
    }
    c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
    if (c->sock == NULL) {
        keel__wire_client_free(c);
        return keel__fail(KEEL_EIO, "client: socket: %s",
                          zmq_strerror(errno));
    }
    if ((st = keel__wire_sockopts(c->sock, &c->limits)) != KEEL_OK ||
        (st = keel__curve_setup_client(c->sock, curve)) != KEEL_OK) {
        keel__wire_client_free(c);
        return st;
    }
    if ((st = keel__cluster_zmq_connect(c->sock, endpoint)) != KEEL_OK) {
        st = keel__wrap(st, "client");
        keel__wire_client_free(c);
        return st;
    }
    *out = c;
    return KEEL_OK;
}

void
keel__wire_client_free(keel__wire_client *c)
{
    if (c == NULL)
        return;
    if (c->sock != NULL)
        zmq_close(c->sock);
    if (c->zctx != NULL)
        zmq_ctx_term(c->zctx);      /* linger 0: releases pinned frames */
    keel__wire_pin_destroy(&c->pin);
    free(c);
}

keel_status
keel__wire_client_reconnect(keel__wire_client *c, const keel__curve *curve)
{
    keel_status st;
    /* Linger 0: whatever is queued for the old peer is dropped, and libzmq
     * lets go of zero-copy frames; wait for that before new sends. */
    if (c->sock != NULL)
        zmq_close(c->sock);
    c->sock = NULL;
    st = keel__wire_pin_wait(&c->pin, 10000);
    if (st != KEEL_OK)
        return keel__wrap(st, "reconnect to %s: frames of the abandoned "
                          "request still held", c->endpoint);
    c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
    if (c->sock == NULL)
        return keel__fail(KEEL_EIO, "client: socket: %s",
                          zmq_strerror(errno));
    if ((st = keel__wire_sockopts(c->sock, &c->limits)) != KEEL_OK ||
        (st = keel__curve_setup_client(c->sock, curve)) != KEEL_OK)
        return st;
    if ((st = keel__cluster_zmq_connect(c->sock, c->endpoint)) != KEEL_OK)
        return keel__wrap(st, "client");
    return KEEL_OK;
}

const char *
keel__wire_client_endpoint(const keel__wire_client *c)
{
    return c->endpoint;
}

keel_status
keel__wire_client_retarget(keel__wire_client *c, const char *endpoint,
                           const keel__curve *curve)
{
    if (strlen(endpoint) >= sizeof c->endpoint)
        return keel__fail(KEEL_EINVAL, "client: endpoint '%.80s...' longer "
                          "than %zu bytes", endpoint, sizeof c->endpoint - 1);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    return keel__wire_client_reconnect(c, curve);
}

void
keel__wire_client_set_generation(keel__wire_client *c, uint64_t generation)
{
    c->generation = generation;
}

keel_status
keel__wire_client_send(keel__wire_client *c, keel__wire_header *h,
                       const keel__wire_out *ts, size_t n, int zero_copy,
                       int timeout_ms)
{
    keel_status st;
    /* A DEALER whose peer is unreachable (or refused us) blocks on send:
     * the call's deadline bounds that too. */
    if (zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &timeout_ms,
                       sizeof timeout_ms) != 0)
        return keel__fail(KEEL_EIO, "client: send timeout: %s",
                          zmq_strerror(errno));
    h->request_id = c->next_id++;
    h->sender_type = (uint8_t)c->type;
    h->sender_index = (uint32_t)c->index;
    h->generation = c->generation;
    st = keel__wire_send(c->sock, NULL, h, ts, n, NULL,
                         zero_copy ? &c->pin : NULL);
    if (st == KEEL_ETIMEOUT)
        return keel__fail(KEEL_ETIMEOUT, "request to %s not accepted within "
                          "%d ms (peer unreachable or refused us)",
                          c->endpoint, timeout_ms);
    if (st != KEEL_OK)
        return keel__wrap(st, "request to %s", c->endpoint);
    return KEEL_OK;
}

/* The error reply m from c's peer as one line into buf: "<endpoint>
 * answered error <code> (<status name>): <its text>". */
static void
peer_error_text(const keel__wire_client *c, const keel__wire_msg *m,
                char *buf, size_t size)
{
    snprintf(buf, size, "%s answered error %u (%s): %s", c->endpoint,
             m->h.arg, keel_status_name((keel_status)m->h.arg),
             m->text ? m->text : "(no text)");
}

keel_status
keel__wire_client_wait(keel__wire_client *c, uint64_t request_id,
                       int zero_copy, int timeout_ms, keel__wire_msg *reply)
{
    int64_t deadline = keel__now_mono_ns() + (int64_t)timeout_ms * 1000000;
    keel_status st;
    keel__wire_msg_init(reply);
    for (;;) {
        int64_t left = (deadline - keel__now_mono_ns()) / 1000000;
        if (left < 0)
            left = 0;
        st = keel__wire_recv(c->sock, 0, &c->limits, (int)left, reply);
        if (st == KEEL_ETIMEOUT) {
            st = keel__fail(KEEL_ETIMEOUT, "no reply from %s within %d ms",
                            c->endpoint, timeout_ms);
            break;
        }
        if (st != KEEL_OK) {
            st = keel__wrap(st, "reply from %s", c->endpoint);
            break;
        }
        if (reply->h.request_id == request_id)
            break;
        keel__wire_msg_clear(reply);          /* stale: an old request's */
    }
    /* The reply proves the request arrived; wait for libzmq to let go of
     * zero-copy frames before the caller may touch them again. */
    if (zero_copy && st != KEEL_ETIMEOUT) {
        keel_status ps = keel__wire_pin_wait(&c->pin, 10000);
        if (st == KEEL_OK && ps != KEEL_OK)
            st = ps;
    }
    if (st == KEEL_OK && reply->h.type == KEEL_MSG_ERROR) {
        char why[KEEL_ERR_MAX];
        peer_error_text(c, reply, why, sizeof why);
        st = keel__fail(KEEL_EPEER, "%s", why);
    }
    return st;
}

keel_status
keel__wire_client_call(keel__wire_client *c, keel__wire_header *h,
                       const keel__wire_out *ts, size_t n, int zero_copy,
                       int timeout_ms, keel__wire_msg *reply)
{
    keel_status st;
    keel__wire_msg_init(reply);
    st = keel__wire_client_send(c, h, ts, n, zero_copy, timeout_ms);
    if (st != KEEL_OK)
        return st;
    return keel__wire_client_wait(c, h->request_id, zero_copy, timeout_ms,
                                  reply);
}

/* Split ts into parts of whole tensors, each closed once it reaches
 * part_bytes, at most 1024 of them: their first indices into starts, their
 * count returned. */
static size_t
push_split(const keel__wire_out *ts, size_t n, size_t part_bytes,
           size_t starts[1024])
{
    size_t parts = 0;
    for (size_t i = 0, acc = 0; i < n; i++) {
        if (acc == 0 && parts < 1024)
            starts[parts++] = i;
        acc += ts[i].t->count * sizeof(float);
        if (acc >= part_bytes)
            acc = 0;
    }
    return parts;
}

/* Send each part as a PUSH whose arg counts the parts after it. */
static keel_status
push_send(keel__wire_client *c, const keel__wire_out *ts, size_t n,
          const size_t *starts, size_t parts, uint8_t flags)
{
    for (size_t p = 0; p < parts; p++) {
        size_t end = p + 1 < parts ? starts[p + 1] : n;
        keel__wire_header h = { .type = KEEL_MSG_PUSH, .flags = flags,
                                .request_id = c->next_id++,
                                .sender_type = (uint8_t)c->type,
                                .sender_index = (uint32_t)c->index,
                                .generation = c->generation,
                                .arg = (uint32_t)(parts - 1 - p) };
        keel_status st = keel__wire_send(c->sock, NULL, &h, ts + starts[p],
                                         end - starts[p], NULL, &c->pin);
        if (st != KEEL_OK)
            return keel__wrap(st, "push part %zu/%zu to %s", p + 1, parts,
                              c->endpoint);
    }
    return KEEL_OK;
}

/* The replies to one push_parts call, counted as they come; the first
 * error reply is kept to report once all have come. */
typedef struct {
    uint64_t first_id;
    size_t parts, got;
    keel_status first_err;
    char err[KEEL_ERR_MAX];
} push_replies;

/* Count m if it answers one of r's parts: an error is remembered, any
 * other reply goes to on_reply. Stale replies are ignored. */
static void
push_take_reply(const keel__wire_client *c, push_replies *r,
                const keel__wire_msg *m,
                void (*on_reply)(void *, const keel__wire_msg *), void *ctx)
{
    if (m->h.request_id < r->first_id ||
        m->h.request_id >= r->first_id + r->parts)
        return;
    r->got++;
    if (m->h.type == KEEL_MSG_ERROR && r->first_err == KEEL_OK) {
        r->first_err = KEEL_EPEER;
        peer_error_text(c, m, r->err, sizeof r->err);
    } else if (m->h.type != KEEL_MSG_ERROR && on_reply != NULL) {
        on_reply(ctx, m);
    }
}

keel_status
keel__wire_client_push_parts(keel__wire_client *c, const keel__wire_out *ts,
                             size_t n, size_t part_bytes, uint8_t flags,
                             int timeout_ms,
                             void (*on_reply)(void *, const keel__wire_msg *),
                             void *ctx)
{
    int64_t deadline = keel__now_mono_ns() + (int64_t)timeout_ms * 1000000;
    size_t starts[1024];
    push_replies r = { .first_err = KEEL_OK, .err = "" };
    keel_status st;

    if (n == 0)
        return keel__fail(KEEL_EINVAL, "push_parts: nothing to push");
    r.parts = push_split(ts, n, part_bytes, starts);
    if (zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &timeout_ms,
                       sizeof timeout_ms) != 0)
        return keel__fail(KEEL_EIO, "client: send timeout: %s",
                          zmq_strerror(errno));
    r.first_id = c->next_id;
    if ((st = push_send(c, ts, n, starts, r.parts, flags)) != KEEL_OK)
        return st;
    while (r.got < r.parts) {
        keel__wire_msg m;
        int64_t left = (deadline - keel__now_mono_ns()) / 1000000;
        st = keel__wire_recv(c->sock, 0, &c->limits, left < 0 ? 0 : (int)left,
                             &m);
        if (st == KEEL_ETIMEOUT) {
            keel__wire_msg_clear(&m);
            return keel__fail(KEEL_ETIMEOUT, "%zu of %zu push replies from "
                              "%s within %d ms", r.got, r.parts, c->endpoint,
                              timeout_ms);
        }
        if (st != KEEL_OK) {
            keel__wire_msg_clear(&m);
            return keel__wrap(st, "push reply from %s", c->endpoint);
        }
        push_take_reply(c, &r, &m, on_reply, ctx);
        keel__wire_msg_clear(&m);
    }
    if ((st = keel__wire_pin_wait(&c->pin, 10000)) != KEEL_OK)
        return st;
    if (r.first_err != KEEL_OK)
        return keel__fail(r.first_err, "%s", r.err);
    return KEEL_OK;
}

/* ---- metrics ------------------------------------------------------------ */

static void
metrics_put(keel__wire_metrics *out, size_t *k, double x)
{
    memcpy(&out->words[2 * *k], &x, sizeof x);
    (*k)++;
}

static void
metrics_view(keel__wire_metrics *out, size_t doubles)
{
    memset(&out->t, 0, sizeof out->t);
    out->t.ndim = 1;
    out->t.shape[0] = (int64_t)(2 * doubles);
    for (int d = 1; d < KEEL_MAX_DIMS; d++)
        out->t.shape[d] = 1;
    out->t.count = 2 * doubles;
    out->t.data = out->words;
}

void
keel__wire_metrics_push(const keel__metrics *m, keel__wire_metrics *out)
{
    size_t k = 0;
    metrics_put(out, &k, m->n);
    for (int i = 0; i < m->n; i++)
        metrics_put(out, &k, m->sum[i]);
    for (int i = 0; i < m->n; i++)
        metrics_put(out, &k, m->count[i]);
    metrics_view(out, k);
}

void
keel__wire_metrics_ack(const keel__metrics *m, keel__wire_metrics *out)
{
    size_t k = 0;
    metrics_put(out, &k, m->n);
    metrics_put(out, &k, m->n_combined);
    for (int i = 0; i < m->n; i++)
        metrics_put(out, &k, m->total_sum[i]);
    for (int i = 0; i < m->n; i++)
        metrics_put(out, &k, m->total_count[i]);
    metrics_put(out, &k, m->n_kept);
    for (int r = 0; r < m->n_kept; r++) {
        metrics_put(out, &k, m->replica[r]);
        for (int i = 0; i < m->n; i++)
            metrics_put(out, &k, m->rsum[r][i]);
        for (int i = 0; i < m->n; i++)
            metrics_put(out, &k, m->rcount[r][i]);
    }
    metrics_view(out, k);
}

/* The flagged metrics tensor of msg, taken off its tensors: its float64s
 * in *d (count *nd); 0 in *nd without one. */
static keel_status
metrics_take(keel__wire_msg *msg, const double **d, size_t *nd,
             double *buf)
{
    const keel__wire_tensor *wt;
    *nd = 0;
    if (!(msg->h.flags & KEEL_WIRE_F_METRICS))
        return KEEL_OK;
    if (msg->n == 0)
        return keel__fail(KEEL_ECORRUPT, "metrics flagged without tensors");
    wt = &msg->tensors[msg->n - 1];
    if (strcmp(wt->name, KEEL__WIRE_METRICS_NAME) != 0 || wt->t.ndim != 1
        || wt->t.data == NULL || wt->t.count % 2 != 0 || wt->t.count < 2
        || wt->t.count > 2 * KEEL__WIRE_METRICS_DOUBLES)
        return keel__fail(KEEL_ECORRUPT, "metrics flagged but the last "
                          "tensor '%s' (%zu words) is not a metrics tensor "
                          "of at most %d float64s", wt->name, wt->t.count,
                          KEEL__WIRE_METRICS_DOUBLES);
    memcpy(buf, wt->t.data, wt->t.count * sizeof(float));
    *d = buf;
    *nd = wt->t.count / 2;
    msg->n--;
    return KEEL_OK;
}

/* A count d read from a metrics tensor: an integer in [0, max]. */
static int
metrics_int(double d, int max, int *out)
{
    if (!(d >= 0 && d <= max) || d != (double)(int)d)
        return 0;
    *out = (int)d;
    return 1;
}

keel_status
keel__wire_take_push_metrics(keel__wire_msg *msg,
                             keel__wire_push_metrics *out)
{
    double buf[KEEL__WIRE_METRICS_DOUBLES];
    const double *d = NULL;
    size_t nd;
    int n;
    keel_status st = metrics_take(msg, &d, &nd, buf);
    out->n = 0;
    if (st != KEEL_OK || nd == 0)
        return st;
    if (!metrics_int(d[0], KEEL__METRICS_MAX, &n) || nd != 1 + 2 * (size_t)n)
        return keel__fail(KEEL_ECORRUPT, "PUSH metrics: %zu float64s for "
                          "%g metrics (1 + 2 per metric, at most %d)", nd,
                          d[0], KEEL__METRICS_MAX);
    for (int i = 0; i < n; i++) {
        out->sum[i] = d[1 + i];
        out->count[i] = d[1 + n + i];
    }
    out->n = n;
    return KEEL_OK;
}

keel_status
keel__wire_take_ack_metrics(keel__wire_msg *msg, keel__metrics *m)
{
    double buf[KEEL__WIRE_METRICS_DOUBLES];
    const double *d = NULL;
    size_t nd, at;
    int n, combined, kept;
    keel_status st = metrics_take(msg, &d, &nd, buf);
    if (st != KEEL_OK || nd == 0)
        return st;
    if (nd < 3 || !metrics_int(d[0], KEEL__METRICS_MAX, &n) ||
        !metrics_int(d[1], INT32_MAX, &combined) || nd < 3 + 2 * (size_t)n
        || !metrics_int(d[2 + 2 * n], KEEL__METRICS_REPLICAS, &kept) ||
        kept > combined ||
        nd != 3 + 2 * (size_t)n + (size_t)kept * (1 + 2 * (size_t)n))
        return keel__fail(KEEL_ECORRUPT, "PUSH_ACK metrics: %zu float64s "
                          "do not match their counts", nd);
    if (m == NULL || n != m->n || combined == 0)
        return KEEL_OK;
    m->n_combined = combined;
    for (int i = 0; i < n; i++) {
        m->total_sum[i] = d[2 + i];
        m->total_count[i] = d[2 + n + i];
    }
    at = 3 + 2 * (size_t)n;
    m->n_kept = 0;
    for (int r = 0; r < kept; r++, at += 1 + 2 * (size_t)n) {
        int replica;
        if (!metrics_int(d[at], INT32_MAX, &replica))
            return keel__fail(KEEL_ECORRUPT, "PUSH_ACK metrics: replica "
                              "index %g", d[at]);
        m->replica[r] = replica;
        for (int i = 0; i < n; i++) {
            m->rsum[r][i] = d[at + 1 + i];
            m->rcount[r][i] = d[at + 1 + n + i];
        }
        m->n_kept = r + 1;
    }
    return KEEL_OK;
}

void
keel__wire_membership_put(uint64_t word, keel__wire_membership *out)
{
    memcpy(out->words, &word, sizeof word);
    memset(&out->t, 0, sizeof out->t);
    out->t.ndim = 1;
    for (int d = 0; d < KEEL_MAX_DIMS; d++)
        out->t.shape[d] = 1;
    out->t.shape[0] = 2;
    out->t.count = 2;
    out->t.data = out->words;
}

keel_status
keel__wire_take_membership(keel__wire_msg *msg, uint64_t *word)
{
    const keel__wire_tensor *wt;
    *word = 0;
    if (!(msg->h.flags & KEEL_WIRE_F_MEMBERSHIP))
        return KEEL_OK;
    if (msg->n == 0)
        return keel__fail(KEEL_ECORRUPT, "membership flagged without "
                          "tensors");
    wt = &msg->tensors[msg->n - 1];
    if (strcmp(wt->name, KEEL__WIRE_MEMBERSHIP_NAME) != 0 ||
        wt->t.ndim != 1 || wt->t.data == NULL || wt->t.count != 2)
        return keel__fail(KEEL_ECORRUPT, "membership flagged but the last "
                          "tensor '%s' (%zu words) is not a membership word "
                          "of two", wt->name, wt->t.count);
    memcpy(word, wt->t.data, sizeof *word);
    msg->n--;
    return KEEL_OK;
}
