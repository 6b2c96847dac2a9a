/* cluster_int.h - private to cluster/: problem lists, the binary wire
 * protocol over ZeroMQ ROUTER/DEALER, CURVE keys and the ZAP handler, and
 * the parameter server. The only header that includes <zmq.h>. */
#ifndef KEEL_CLUSTER_INT_H
#define KEEL_CLUSTER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include <keel/cluster.h>
#include <keel/tensor.h>
#include <keel/distributed.h>
#include "util.h"
#include "../numeric/numeric_int.h"

/* ---- problem lists (spec.c) --------------------------------------------- */

/* Collects every problem of a validation; fails once with all of them. */
typedef struct keel__problems {
    int count;
    size_t len;
    char text[KEEL_ERR_MAX];
} keel__problems;
void keel__problems_add(keel__problems *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* KEEL_OK when empty, else KEEL_EINVAL "<what>: N problems: a; b; c". */
keel_status keel__problems_fail(const keel__problems *p, const char *what);

#define KEEL__MAX_TASKS_PER_JOB 65536
/* Append an address (copied) to a job; KEEL_EINVAL past the task limit. */
keel_status keel__cluster_spec_add(keel_cluster_spec *s, keel_task_type t,
                                   const char *a, size_t len);
/* The spec's own checks added to the problems p already found (reading
 * it from what: "TF_CONFIG", "slurm"); fails once naming all of them. */
keel_status keel__cluster_spec_check(const keel_cluster_spec *s,
                                     keel__problems *p, const char *what);
/* 1 if a is host:port (host non-empty, port 1..65535), else 0 with why. */
int keel__cluster_check_address(const char *a, char *why, size_t size);
/* ---- addresses on this machine (address.c) ------------------------------ */

/* Room for the endpoints keel__cluster_bind_endpoints writes. */
#define KEEL__BIND_ENDPOINTS_MAX 1280
/* a ("host:port", "[v6]:port", with or without "tcp://") into host (no
 * brackets, hsize bytes) and *port; 0 if it is not of that form. */
int keel__addr_split(const char *a, char *host, size_t hsize, int *port);
/* The endpoints a task listens on, space-separated "tcp://A:port" (IPv6
 * A bracketed): bind_address NULL or "" binds every address of this
 * machine its own entry's host resolves to (KEEL_EINVAL naming the task
 * and host when it does not resolve or none is local); "*" every
 * interface; an interface name its addresses; an address of this machine
 * that address. Never a wildcard unless bind_address says "*". With local
 * KEEL_LOCAL_TRANSPORT_AUTO and an entry whose host is this machine's,
 * last the task's Unix socket "ipc://<keel__cluster_ipc_path>" (its
 * directory created; left out, with a warning, when that directory is not
 * private to this user); with KEEL_LOCAL_TRANSPORT_TCP, a socket at that
 * path nobody listens on (left by an earlier task of this address) is
 * removed. */
keel_status keel__cluster_bind_endpoints(const keel_cluster_spec *s,
                                         keel_task_type type, int index,
                                         const char *bind_address,
                                         keel_local_transport local,
                                         char *buf, size_t size);
/* The Unix socket path of the task at address ("host:port") into buf: 1
 * when host resolves to an address of this machine and the directory
 * /tmp/keel-<euid> is private to this user (created first when create
 * is 1), else 0. Every task of the host computes the same path. */
int keel__cluster_ipc_path(const char *address, int create, char *buf,
                           size_t size);
/* The endpoint to reach the task at address: "ipc://<path>" when mode is
 * KEEL_LOCAL_TRANSPORT_AUTO and keel__cluster_ipc_path names a socket that
 * exists, else "tcp://<address>". */
keel_status keel__cluster_peer_endpoint(const char *address,
                                        keel_local_transport mode,
                                        char *buf, size_t size);
/* zmq_bind sock to each endpoint of the space-separated list (ZMQ_IPV6 set
 * for an IPv6 one, and for "*" where the machine has IPv6); who names the
 * task in the error. */
keel_status keel__cluster_zmq_bind(void *sock, const char *endpoints,
                                   const char *who);
/* 1 when a connect to endpoint needs ZMQ_IPV6: an IPv6 literal, or a name
 * without an IPv4 address (ZeroMQ then resolves its AAAA records). A name
 * with an IPv4 address is reached over IPv4, as its ps binds every local
 * address of that name. */
int keel__cluster_wants_ipv6(const char *endpoint);
/* zmq_connect sock to endpoint by name (ZeroMQ resolves it on each
 * attempt), ZMQ_IPV6 as keel__cluster_wants_ipv6 says. */
keel_status keel__cluster_zmq_connect(void *sock, const char *endpoint);

/* ---- wire format (wire.c) ------------------------------------------------
 * A message is one multipart ZeroMQ message:
 *   [identity]            ROUTER side only
 *   header                KEEL_WIRE_HEADER_SIZE bytes, little endian
 *   per tensor:  descriptor frame, then (unless F_NAMES_ONLY) data frame
 *   [text]                if F_TEXT: UTF-8, at most limits.max_text bytes
 * docs/protocol.md lays the header and descriptor out byte by byte. */

#define KEEL_WIRE_VERSION 6
#define KEEL_WIRE_HEADER_SIZE 64
#define KEEL_WIRE_DTYPE_F32 1

enum keel__msg_type {
    KEEL_MSG_HELLO = 1,     /* a task announces itself */
    KEEL_MSG_READY,         /* answer to HELLO: the server is serving */
    KEEL_MSG_PULL,          /* names only (count 0 = every variable) */
    KEEL_MSG_PULL_REPLY,    /* the variables' values */
    KEEL_MSG_PUSH,          /* gradients to apply */
    KEEL_MSG_PUSH_ACK,      /* global_step after the apply */
    KEEL_MSG_ERROR,         /* arg = keel_status, text = reason */
    KEEL_MSG_STEP,          /* global step query (reply: F_REPLY) */
    KEEL_MSG_SHUTDOWN,      /* stop serving (reply: F_REPLY) */
    KEEL_MSG_HEARTBEAT,     /* liveness (reply: F_REPLY) */
    KEEL_MSG_TOKEN,         /* sync token; arg/global_step carry it */
    KEEL_MSG_INIT,          /* chief pushes initial values */
    KEEL_MSG_AGGREGATE,     /* ps -> chief (chief applies): the step's
                             * mean gradients, instead of a PUSH_ACK */
    KEEL_MSG_COMMIT,        /* chief -> ps: the step's new values of the
                             * ps's variables and slots (reply: F_REPLY) */
    KEEL_MSG_MIX,           /* a replica -> ps: v = d v + (1 - d) t for
                             * non-trainable variables, d the float32 in
                             * arg (0: assign); reply: F_REPLY */
    KEEL_MSG_LEAVE,         /* a replica -> ps: its session ended (not by
                             * an error or a signal) at global_step; arg:
                             * its keel_end_reason, text: why; a sync ps
                             * then ends the job (reply: F_REPLY) */
    KEEL_MSG_SAVE_SHARD,    /* chief -> ps: write this ps's shard of the
                             * sharded checkpoint of global_step (arg: the
                             * shard count, peer_generation: the run id)
                             * into the ps's checkpoint directory, durably;
                             * reply: F_REPLY with the ps's global step */
    KEEL_MSG_PULL_ROWS,     /* rows of row variables: per variable one
                             * tensor named by it, its data the distinct
                             * ids (int64, two float32 words each, strictly
                             * ascending); reply: F_REPLY, per variable its
                             * rows [n, row shape] in that order */
    KEEL_MSG_TYPE_END
};

enum {
    KEEL_WIRE_F_REPLY = 1u << 0,       /* an answer of the same type */
    KEEL_WIRE_F_NAMES_ONLY = 1u << 1,  /* descriptors without data frames */
    KEEL_WIRE_F_TEXT = 1u << 2,        /* a trailing text frame */
    KEEL_WIRE_F_WANT_VALUES = 1u << 3, /* PUSH: ack carries the new values
                                        * of the pushed variables (push and
                                        * pull in one round trip) */
    KEEL_WIRE_F_PIECES = 1u << 4,      /* PUSH: pieces of the step's mean
                                        * (micro-batch or tree stores):
                                        * added, not weighted */
    KEEL_WIRE_F_METRICS = 1u << 5,     /* PUSH, PUSH_ACK: the last tensor
                                        * is the step's metrics
                                        * (keel__wire_metrics) */
    KEEL_WIRE_F_MEMBERSHIP = 1u << 6,  /* PUSH (elastic sync): the last
                                        * tensor is the membership word the
                                        * push was computed under
                                        * (keel__wire_membership) */
    KEEL_WIRE_F_ROWS = 1u << 7,        /* PUSH: some gradients are rows:
                                        * a KEEL__WIRE_IDS_NAME tensor,
                                        * then the variable's rows */
    KEEL_WIRE_F_KNOWN = 0xffu
};

typedef struct keel__wire_header {
    uint8_t type;
    uint8_t flags;
    uint64_t request_id;
    uint8_t sender_type;        /* keel_task_type */
    uint32_t examples;          /* PUSH: the examples its gradients are
                                 * the mean over (0: one; at most
                                 * KEEL_GRADS_MAX_EXAMPLES); else 0 */
    uint32_t sender_index;
    uint64_t generation;        /* the sender's incarnation (random) */
    int64_t global_step;
    int64_t local_step;
    uint32_t count;             /* tensors */
    uint32_t arg;               /* ERROR: keel_status; PUSH: parts that
                                 * follow in this step; TOKEN: payload */
    uint64_t peer_generation;   /* PUSH, COMMIT, MIX: the ps generation
                                 * whose values the update was computed
                                 * from (0: not known); in a ps's reply
                                 * its membership word
                                 * (KEEL__MEMBERSHIP_*; 0: not elastic) */
} keel__wire_header;

/* An elastic sync ps's membership word, in the peer_generation field of
 * its replies: the epoch (bits 32..63, counted from 1, one more at each
 * change of the live replicas), their count (bits 16..31) and the
 * recipient's position among them plus one (bits 0..15; 0: not a live
 * replica of the coming step). */
#define KEEL__MEMBERSHIP_WORD(epoch, count, pos1)                           \
    (((uint64_t)(epoch) << 32) | ((uint64_t)((count) & 0xffff) << 16) |    \
     (uint64_t)((pos1) & 0xffff))
#define KEEL__MEMBERSHIP_EPOCH(w) ((uint32_t)((w) >> 32))
#define KEEL__MEMBERSHIP_COUNT(w) ((int)(((w) >> 16) & 0xffff))
#define KEEL__MEMBERSHIP_POS1(w) ((int)((w) & 0xffff))

/* The largest global step a peer may set (INIT): far below INT64_MAX, so
 * step + 1 never overflows. */
#define KEEL__MAX_GLOBAL_STEP ((int64_t)1 << 62)

typedef struct keel__wire_limits {
    size_t max_tensors;         /* default 65536 */
    uint64_t max_total_bytes;   /* tensor data, default 4 GiB */
    size_t max_text;            /* default 4096 */
    uint64_t max_frame;         /* the largest frame libzmq accepts
                                 * (ZMQ_MAXMSGSIZE: a longer one drops the
                                 * connection before it is read); default
                                 * keel__wire_set_max_frame's, else
                                 * max_total_bytes */
} keel__wire_limits;
/* Fill zero members with the defaults. */
void keel__wire_limits_default(keel__wire_limits *l);

/* Header to and from its 64 bytes. decode checks magic, version, type,
 * flags, the example count (only a PUSH has one) and sender type
 * (KEEL_ECORRUPT naming the field). */
void keel__wire_header_encode(const keel__wire_header *h,
                              unsigned char out[KEEL_WIRE_HEADER_SIZE]);
keel_status keel__wire_header_decode(const void *buf, size_t n,
                                     keel__wire_header *h);
/* Descriptor frame: u16 name length, u8 dtype, u8 ndim, ndim x i64 dims,
 * name bytes. Returns the frame size; 0 if buf is too small. */
size_t keel__wire_desc_encode(const char *name, int ndim,
                              const int64_t *shape, unsigned char *buf,
                              size_t size);

/* One decoded tensor. t.data points into the received frame (or an
 * aligned copy when the frame's data is not float-aligned); t.is_owner is
 * 0: valid until keel__wire_msg_clear(). Names-only tensors have no data. */
typedef struct keel__wire_tensor {
    char name[KEEL_NAME_MAX];
    keel_tensor t;
} keel__wire_tensor;

typedef struct keel__wire_msg {
    keel__wire_header h;
    zmq_msg_t identity;         /* ROUTER peer (when has_identity) */
    int has_identity;
    size_t n;
    keel__wire_tensor *tensors;
    char *text;                 /* NUL-terminated, or NULL */
    zmq_msg_t *frames;
    size_t n_frames;
    void **copies;              /* aligned copies to free */
    size_t n_copies;
} keel__wire_msg;

void keel__wire_msg_init(keel__wire_msg *m);
void keel__wire_msg_clear(keel__wire_msg *m);

/* Decode frames (taking ownership of them: they are moved into m, and
 * closed by keel__wire_msg_clear even on failure). Everything is checked
 * before anything is allocated from a peer-given size. KEEL_ECORRUPT
 * naming the problem. */
keel_status keel__wire_decode(zmq_msg_t *frames, size_t n_frames,
                              const keel__wire_limits *lim,
                              keel__wire_msg *m);

/* Receive one whole multipart message within timeout_ms (-1: forever):
 * KEEL_ETIMEOUT when nothing came. has_identity: a ROUTER socket (first
 * frame is the peer). A malformed message is drained entirely and reported
 * as KEEL_ECORRUPT (m->has_identity still set so the caller can answer). */
/* Message bytes this process has sent and received through the wire
 * functions (frames as sent, identity frames not counted on receipt). */
void keel__wire_bytes(uint64_t *in, uint64_t *out);
keel_status keel__wire_recv(void *sock, int has_identity,
                            const keel__wire_limits *lim, int timeout_ms,
                            keel__wire_msg *m);

/* Zero-copy send bookkeeping: every data frame sent with a pin keeps the
 * pinned buffer in use until libzmq releases it (the frame is written to
 * the kernel, or its connection goes). Wait before changing or freeing
 * the data, or (a tracking pin) hand the buffer over to the pin. */
typedef struct keel__wire_pinned keel__wire_pinned;
typedef struct keel__wire_pin {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long pending;                /* frames in flight of buffers not handed
                                  * over */
    int track;                   /* per buffer: keel__wire_pin_hand_over */
    keel__wire_pinned *bufs;     /* tracking: the frames in flight, by the
                                  * address of their data */
} keel__wire_pin;
/* A pin; track 1: it keeps the frames in flight per buffer, for
 * keel__wire_pin_hand_over (a lookup per frame sent: for the few buffers
 * of a variable, not a message of many). */
void keel__wire_pin_init(keel__wire_pin *p, int track);
/* After libzmq released every frame (its context terminated): frees what
 * was handed over and not yet released. */
void keel__wire_pin_destroy(keel__wire_pin *p);
/* KEEL_ETIMEOUT if frames are still in flight after timeout_ms (frames of
 * buffers handed over are not waited for). */
keel_status keel__wire_pin_wait(keel__wire_pin *p, int timeout_ms);
/* 1 when frames whose data lies in [buf, buf + bytes) are in flight under
 * tracking pin p. */
int keel__wire_pin_holds(keel__wire_pin *p, const void *buf, size_t bytes);
/* Hand buf (bytes long) over to tracking pin p when frames whose data lies
 * in it are in flight: p then frees it with free_fn once libzmq released
 * the last of them, and the caller neither writes nor frees it again (it
 * goes on with a copy). 1 when handed over; 0 when nothing was in flight,
 * buf still the caller's. Never waits: a frozen reader of those frames
 * holds only that buffer, not the caller's next change. */
int keel__wire_pin_hand_over(keel__wire_pin *p, void *buf, size_t bytes,
                             void (*free_fn)(void *));

typedef struct keel__wire_out {
    const char *name;
    const keel_tensor *t;       /* NULL with F_NAMES_ONLY */
    keel__wire_pin *pin;        /* NULL: the message's pin (if any) */
} keel__wire_out;

/* Send a message. identity (ROUTER side) is copied, not consumed. With a
 * pin (the tensor's own, else the message's), data frames are zero-copy (the tensors must stay unchanged until
 * keel__wire_pin_wait); without one they are copied. h->count is set from
 * n; F_TEXT from text. */
keel_status keel__wire_send(void *sock, zmq_msg_t *identity,
                            const keel__wire_header *h,
                            const keel__wire_out *ts, size_t n,
                            const char *text, keel__wire_pin *pin);

/* ---- metrics (wire.c) ----------------------------------------------------
 * A step's metric sums travel with its gradients as one extra tensor, the
 * last of the message, flagged KEEL_WIRE_F_METRICS and named
 * KEEL__WIRE_METRICS_NAME (':' is in no variable's name): one dimension,
 * its float32 words holding float64s, two words each, in the byte order
 * of all tensor data.
 *   PUSH (to ps 0, sync): n, then n sums, then n counts.
 *   PUSH_ACK (the sync step's token): n, the replicas combined, n total
 *     sums, n total counts, the replicas kept K (at most
 *     KEEL__METRICS_REPLICAS), then K times (replica, n sums, n counts).
 * docs/protocol.md, "Metrics". */
#define KEEL__WIRE_METRICS_NAME "keel:metrics"
#define KEEL__WIRE_METRICS_DOUBLES \
    (3 + 2 * KEEL__METRICS_MAX + \
     KEEL__METRICS_REPLICAS * (1 + 2 * KEEL__METRICS_MAX))
typedef struct keel__wire_metrics {
    keel_tensor t;                  /* a view of words */
    float words[2 * KEEL__WIRE_METRICS_DOUBLES];
} keel__wire_metrics;
/* A replica's metrics as its PUSH carries them. */
typedef struct keel__wire_push_metrics {
    int n;                          /* 0: none */
    double sum[KEEL__METRICS_MAX];
    double count[KEEL__METRICS_MAX];
} keel__wire_push_metrics;
/* m's own sums (PUSH) or its combination (PUSH_ACK) into out's tensor. */
void keel__wire_metrics_push(const keel__metrics *m, keel__wire_metrics *out);
void keel__wire_metrics_ack(const keel__metrics *m, keel__wire_metrics *out);
/* A PUSH's metrics tensor (when flagged) out of msg (msg->n then counts
 * the gradients only) into *out (n 0 without one). KEEL_ECORRUPT naming
 * what is wrong. */
keel_status keel__wire_take_push_metrics(keel__wire_msg *msg,
                                         keel__wire_push_metrics *out);
/* A PUSH_ACK's metrics tensor (when flagged) out of msg; its combination
 * into m (NULL: dropped) when its metric count is m->n. */
keel_status keel__wire_take_ack_metrics(keel__wire_msg *msg,
                                        keel__metrics *m);

/* An elastic sync replica's PUSH (to every ps) carries the membership
 * word it divided its leaves by (ps 0's, KEEL__MEMBERSHIP_*) as one more
 * tensor, the last of the message (after the metrics), flagged
 * KEEL_WIRE_F_MEMBERSHIP and named KEEL__WIRE_MEMBERSHIP_NAME: one
 * dimension of two float32 words holding the word's 8 bytes in the byte
 * order of all tensor data. docs/protocol.md, "Membership". */
#define KEEL__WIRE_MEMBERSHIP_NAME "keel:membership"

/* A PUSH with KEEL_WIRE_F_ROWS sends a variable's gradient rows as two
 * tensors: this name, one dimension of 2n float32 words holding n
 * little-endian int64 ids (strictly ascending, each below the variable's
 * first dimension, n at most that), then the variable's name with shape
 * [n, d1, ...]: row k is the gradient of row ids[k]. */
#define KEEL__WIRE_IDS_NAME "keel:ids"
typedef struct keel__wire_membership {
    keel_tensor t;                  /* a view of words */
    float words[2];
} keel__wire_membership;
/* word into out's tensor. */
void keel__wire_membership_put(uint64_t word, keel__wire_membership *out);
/* A PUSH's membership tensor (when flagged) out of msg (msg->n then no
 * longer counts it) into *word (0 without one). KEEL_ECORRUPT naming what
 * is wrong. */
keel_status keel__wire_take_membership(keel__wire_msg *msg, uint64_t *word);

/* A random 64-bit incarnation id (getrandom). */
uint64_t keel__wire_new_generation(void);

/* SO_SNDBUF of every keel socket (the kernel doubles it: 1 MiB of a
 * connection's data in flight). Fixed instead of autotuned (up to
 * tcp_wmem's maximum): on loopback the bytes in flight then stay in the
 * CPUs' caches between the sender's and the receiver's copy, which makes
 * a large push + values reply faster (bench/cluster_bench.sh). The price
 * off loopback: at most 1 MiB per round trip per connection (1 ms RTT:
 * 1 GB/s), which cluster.send_buffer_kib raises. */
#define KEEL__WIRE_SNDBUF (512 << 10)

/* The largest frame a task's sockets created from now on accept when
 * their limits say none: its largest tensor's bytes plus
 * KEEL__WIRE_FRAME_SLACK (0: no process-wide bound). Set by a task before
 * its sockets exist. */
void keel__wire_set_max_frame(uint64_t bytes);
/* What a frame may hold beside a tensor's data: the header, a descriptor,
 * a text frame. */
#define KEEL__WIRE_FRAME_SLACK 8192

/* Common socket options: linger 0, send timeout, max message size, send
 * buffer. */
keel_status keel__wire_sockopts(void *sock, const keel__wire_limits *lim);
/* The send buffer of the sockets created from now on, in bytes
 * (cluster.send_buffer_kib; default KEEL__WIRE_SNDBUF); 0: the kernel's
 * autotuning. Process-wide, set by a task before its sockets exist. */
void keel__wire_set_send_buffer(int bytes);

/* ---- authentication (security.c) ---------------------------------------
 * Every server socket authenticates its peers through a ZAP handler, which
 * names each one by its task ("chief0", "worker1", "evaluator0", "ps0":
 * keel__task_name); the ps reads that name (the "User-Id" of each message)
 * and never trusts the header's sender fields for authorization.
 *  - CURVE (security.curve): DIR/<task>.key is the task's public key; a
 *    server allows every <task>.key in the key directory as that task.
 *  - token (KEEL_CLUSTER_TOKEN, when CURVE is off): ZAP PLAIN with user
 *    name <task> and password hex(HMAC-SHA256(SHA-256(token), "keel-task:"
 *    <task>)): the token itself never travels, and a password seen on the
 *    wire speaks only for its own task. */

#define KEEL_Z85_KEY 41     /* 40 characters + NUL */
#define KEEL__TASK_NAME_MAX 32
#define KEEL__TOKEN_MIN 16  /* characters of a KEEL_CLUSTER_TOKEN */

typedef struct keel__curve {
    int enabled;                     /* CURVE */
    char public_key[KEEL_Z85_KEY];
    char secret_key[KEEL_Z85_KEY];
    char server_key[KEEL_Z85_KEY];   /* clients: the server's public key */
    char (*allowed)[KEEL_Z85_KEY];   /* servers: allowed client keys */
    char (*allowed_task)[KEEL__TASK_NAME_MAX]; /* ... and the task each
                                      * one is ("" : none, refused) */
    size_t n_allowed;
    /* token authentication (ZAP PLAIN), used when CURVE is off */
    int plain;
    char user[KEEL__TASK_NAME_MAX];  /* clients: this task's name */
    char password[65];               /* clients: its HMAC, 64 hex digits */
    unsigned char token_key[32];     /* servers: SHA-256 of the token */
} keel__curve;

/* "<type><index>" ("worker1"); and back: 1 when name is one. */
void keel__task_name(keel_task_type t, int index, char *buf, size_t size);
int keel__task_parse(const char *name, keel_task_type *t, int *index);

/* Token authentication for task (type, index) from the job's token (at
 * least KEEL__TOKEN_MIN characters): sets plain, user, password and
 * token_key. The token is not kept. */
keel_status keel__auth_token(keel__curve *c, const char *token,
                             keel_task_type type, int index);

/* Load DIR/NAME.key and DIR/NAME.key_secret (the secret must not be
 * readable by group or others). Sets enabled. */
keel_status keel__curve_load(keel__curve *c, const char *dir,
                             const char *name);
/* Read a public key file (40 Z85 characters, optional newline). */
keel_status keel__curve_read_public(const char *path,
                                    char out[KEEL_Z85_KEY]);
/* Allow one client key as task (a task name, or "" for a key that may
 * connect to nothing), or every *.key file in dir as the task its file
 * name says (<task>.key; other names hold no task). */
keel_status keel__curve_allow_key(keel__curve *c, const char *z85,
                                  const char *task);
keel_status keel__curve_allow_dir(keel__curve *c, const char *dir);
/* Wipe the secrets and free the allowed list. */
void keel__curve_clear(keel__curve *c);
/* Socket setup: server (CURVE_SERVER + secret, or PLAIN_SERVER, + ZAP
 * domain; without authentication the ZAP domain alone, not enforced, which
 * refuses legacy ZMTP 1.0 / 2.0 peers) or client (server key + own pair,
 * or PLAIN user + password; no-op when c is NULL or neither is on). */
keel_status keel__curve_setup_server(void *sock, const keel__curve *c);
keel_status keel__curve_setup_client(void *sock, const keel__curve *c);
/* 1 when c authenticates peers (CURVE or token). */
int keel__auth_on(const keel__curve *c);

/* The ZAP handler of one zmq context: admits CURVE clients whose public
 * key is allowed as a task, or PLAIN clients whose password is their
 * task's under the token; the task's name becomes the connection's
 * User-Id. Refuses everything else (logged rate-limited, peer text
 * escaped). Its thread answers until zctx is terminated: the owner closes
 * its sockets, calls zmq_ctx_term (which returns once the handler has
 * closed its own), then keel__zap_stop, which joins the thread and frees
 * z (NULL accepted). */
typedef struct keel__zap keel__zap;
keel_status keel__zap_start(void *zctx, const keel__curve *c,
                            keel__zap **out);
void keel__zap_stop(keel__zap *z);

/* A small set remembering what was already logged (refused peers): 1 the
 * first time a key is added, 0 after (the oldest are forgotten past 256). */
typedef struct keel__once {
    uint64_t h[256];
    unsigned next, n;
} keel__once;
int keel__once_add(keel__once *o, const char *a, const char *b, long c);

/* ---- liveness (heartbeat.c) ----------------------------------------------
 * A thread of a worker or the chief pings every ps each interval on its own
 * sockets; the training thread reads snapshots while it waits. */
typedef struct keel__hb_config {
    const char *const *endpoints;  /* n "tcp://host:port" */
    const keel__curve *curves;     /* n client set-ups, or NULL */
    int n;
    int interval_ms;
    keel_task_type type;           /* the sender, as in requests */
    int index;
    uint64_t generation;
    int dead_after_ms;             /* > 0: the connection itself proves a
                                    * ps alive while it answers ZMTP pings
                                    * (its I/O thread, however busy its
                                    * serving thread), down after this
                                    * long without traffic; 0: only keel
                                    * HEARTBEAT answers count */
} keel__hb_config;

typedef struct keel__hb_peer {
    int64_t last_heard_ns;         /* monotonic; 0: never answered */
    int64_t since_ns;              /* the last sign of life: now while the
                                    * connection is up (dead_after_ms > 0),
                                    * else the later of last_heard_ns and
                                    * the last traffic on the connection,
                                    * or the start */
    int link_up;                   /* the connection is up (dead_after_ms
                                    * > 0 only) */
    int64_t link_seen_ns;          /* the last traffic known on it: now
                                    * while up; when it drops, the drop
                                    * less the ping timeout */
    uint64_t generation;           /* the ps's incarnation */
    int64_t global_step;
    uint64_t membership;           /* its last answer's membership word
                                    * (elastic sync, ps 0; else 0) */
    long beats;                    /* answers so far */
    char status[192];              /* the ps's text: counters and what its
                                    * current sync step still lacks */
} keel__hb_peer;

typedef struct keel__hb keel__hb;
keel_status keel__hb_start(const keel__hb_config *cfg, keel__hb **out);
/* Stops the thread at once (no interval wait). NULL is a no-op. */
void keel__hb_stop(keel__hb *hb);
void keel__hb_peer_get(keel__hb *hb, int p, keel__hb_peer *out);
/* Wait until peer p has answered more than beats times; 1 if it has. */
int keel__hb_wait(keel__hb *hb, int p, long beats, int timeout_ms);

/* ---- update rules (algorithm.c) ------------------------------------------
 * keel_algorithm's two halves. The worker's runs inside the cluster
 * backend's updater through an I/O seam (the network, or a test's ps in
 * the same process); the ps's applies one commit to one variable. */

/* A rule with every default resolved for a cluster of replicas. */
typedef struct keel__algo {
    keel_algorithm_config c;      /* window, n_fetch, ... filled in; its
                                   * worker_learning_rates is NULL */
    double *worker_lrs;           /* sync: per replica (owned), or NULL */
    int replicas;                 /* chief + workers */
    keel_lr_schedule schedule;    /* the optimizer's: eta and gamma at 0 */
} keel__algo;

/* in NULL: sync or async as mode says. opt (NULL: keel's default
 * schedule) supplies the learning rate. KEEL_EINVAL naming the member. */
keel_status keel__algo_resolve(const keel_algorithm_config *in,
                               keel_cluster_mode mode,
                               const keel_optimizer_config *opt,
                               int replicas, keel__algo *out);
void keel__algo_clear(keel__algo *a);
/* eta (the workers' local rate, ADAG's on the ps) and gamma (DOWNPOUR's
 * ps rate) at a step. */
double keel__algo_lr(const keel__algo *a, int64_t step);
double keel__algo_ps_lr(const keel__algo *a, int64_t step);
/* sync with per-worker rates: replica's factor on its gradient (its rate
 * / the optimizer's at step); 1 otherwise. */
double keel__algo_worker_scale(const keel__algo *a, int replica,
                               int64_t step);
/* The rule's slots on every trainable variable of vs: downpour:
 * "downpour_accumulator"; adag: "adag_pull<r>" per replica. */
keel_status keel__algo_prepare(const keel__algo *a, keel_vars *vs);

/* The ps's half: a's commits (a borrowed for the object's life) and the
 * per-replica state: the commit count at each replica's last pull
 * (dynsgd), the center at it (adag: slots, so that they travel with the
 * checkpoint). */
typedef struct keel__algo_ps {
    const keel__algo *a;
    int64_t commits;              /* the ps clock: commits applied */
    int64_t *pulled_at;           /* per replica: commits at its pull */
} keel__algo_ps;
keel_status keel__algo_ps_init(keel__algo_ps *p, const keel__algo *a);
void keel__algo_ps_clear(keel__algo_ps *p);
/* Apply commit c of replica (-1: a sync round's sum) to v at step. */
keel_status keel__algo_ps_commit(keel__algo_ps *p, keel_var *v,
                                 const keel_tensor *c, int replica,
                                 int64_t step);
/* After every variable of one commit: the clock advances. */
void keel__algo_ps_commit_end(keel__algo_ps *p, int replica);
/* replica receives v's value (a pull, or a commit's reply with values);
 * then _end once per message. */
void keel__algo_ps_pulled(keel__algo_ps *p, keel_var *v, int replica);
void keel__algo_ps_pulled_end(keel__algo_ps *p, int replica);
/* The chief (re)initialized the ps: every replica counts as having
 * pulled now (each pulls again before its next commit). */
void keel__algo_ps_reset(keel__algo_ps *p);

/* The worker's half. Where the values of a pull or a commit's reply go. */
enum { KEEL__ALGO_INTO_NONE = 0, KEEL__ALGO_INTO_VARS,
       KEEL__ALGO_INTO_CENTER };
typedef struct keel__algo_io {
    void *ctx;
    /* Commit c (one tensor per trainable variable) covering `covered`
     * local steps; sync rules name the round by local_step. With into,
     * the center after the commit arrives into vs or center. *new_step:
     * the cluster's global step after it (unchanged when not known). */
    keel_status (*commit)(void *ctx, keel_grads *c, int covered,
                          int64_t local_step, int into, keel_vars *vs,
                          keel_grads *center, int64_t *new_step);
    /* Pull the center into vs or center. */
    keel_status (*pull)(void *ctx, int into, keel_vars *vs,
                        keel_grads *center, int64_t *new_step);
} keel__algo_io;

typedef struct keel__algo_worker keel__algo_worker;
/* For the rules that do not push gradients (not sync, async, hogwild).
 * a is borrowed; vs is borrowed and must not gain trainable variables. */
keel_status keel__algo_worker_new(const keel__algo *a, int replica,
                                  const keel_vars *vs,
                                  keel__algo_worker **out);
void keel__algo_worker_free(keel__algo_worker *w);
/* vs holds the center just pulled or published: a new cycle starts. */
void keel__algo_worker_restart(keel__algo_worker *w, keel_vars *vs);
/* Local steps since the restart. */
long keel__algo_worker_steps(const keel__algo_worker *w);
keel_grads *keel__algo_worker_center(keel__algo_worker *w);
/* One step with the gradients grads of vs: the local update, and the
 * communication due after it through io. *new_step: the cluster's step
 * when a reply said it, else -1. */
keel_status keel__algo_worker_step(keel__algo_worker *w, keel_vars *vs,
                                   keel_grads *grads, int64_t global_step,
                                   const keel__algo_io *io,
                                   int64_t *new_step);

/* ---- client and parameter server (wire.c, ps*.c) ----------------------- */

typedef struct keel__wire_client keel__wire_client;
/* A DEALER connected to endpoint, in its own zmq context. */
keel_status keel__wire_client_new(const char *endpoint,
                                  const keel__curve *curve,
                                  keel_task_type type, int index,
                                  keel__wire_client **out);
void keel__wire_client_free(keel__wire_client *c);
/* Send a request (request id, sender and generation filled in) and wait
 * up to timeout_ms for the reply with the same request id (stale replies
 * are dropped). An ERROR reply is KEEL_EPEER naming the peer's reason;
 * the reply is kept in *reply either way (clear it). With zero_copy the
 * tensors are sent in place and must not change until this returns (after
 * a KEEL_ETIMEOUT, until the client is freed). */
keel_status keel__wire_client_call(keel__wire_client *c,
                                   keel__wire_header *h,
                                   const keel__wire_out *ts, size_t n,
                                   int zero_copy, int timeout_ms,
                                   keel__wire_msg *reply);
/* The two halves of a call, so that requests to several servers travel
 * at once: send (h->request_id set), then wait for that request's reply
 * (same rules as keel__wire_client_call). */
keel_status keel__wire_client_send(keel__wire_client *c,
                                   keel__wire_header *h,
                                   const keel__wire_out *ts, size_t n,
                                   int zero_copy, int timeout_ms);
keel_status keel__wire_client_wait(keel__wire_client *c, uint64_t request_id,
                                   int zero_copy, int timeout_ms,
                                   keel__wire_msg *reply);
/* Drop the connection and everything queued on it (an abandoned request
 * whose peer died), wait until zero-copy frames are released, connect
 * again. On failure the client is unusable (free it). */
keel_status keel__wire_client_reconnect(keel__wire_client *c,
                                        const keel__curve *curve);
/* The endpoint c connects to (owned by c). */
const char *keel__wire_client_endpoint(const keel__wire_client *c);
/* keel__wire_client_reconnect to endpoint (copied) instead: KEEL_EINVAL,
 * the client unchanged, when it is longer than a client keeps. */
keel_status keel__wire_client_retarget(keel__wire_client *c,
                                       const char *endpoint,
                                       const keel__curve *curve);
/* One incarnation id for all of a process's clients (the chief's
 * generation). */
void keel__wire_client_set_generation(keel__wire_client *c,
                                      uint64_t generation);
/* PUSH ts[0..n) split into parts of about part_bytes (whole tensors), all
 * sent before any reply is awaited so that the server applies one part
 * while the next is on the wire and the previous reply travels back. Each
 * part's header arg says how many parts follow (the server advances the
 * global step on the last). flags may add KEEL_WIRE_F_WANT_VALUES; every
 * reply is handed to on_reply (borrowed for the call). All replies are
 * collected even after an ERROR (the first error is returned). Tensors are
 * sent zero-copy: unchanged until this returns. */
keel_status keel__wire_client_push_parts(
    keel__wire_client *c, const keel__wire_out *ts, size_t n,
    size_t part_bytes, uint8_t flags, int timeout_ms,
    void (*on_reply)(void *ctx, const keel__wire_msg *m), void *ctx);

typedef struct keel__ps keel__ps;

/* A variable of a ps that is a part of a partitioned variable
 * (keel__partition): in a checkpoint, rows [row_begin, row_end) of the
 * dataset whole (and of each of its slots). Names borrowed. */
typedef struct keel__ps_part {
    const char *name;           /* the part on the ps: "NAME/part_k" */
    const char *whole;          /* NAME */
    int64_t row_begin, row_end;
} keel__ps_part;

typedef struct keel__ps_config {
    const char *bind;           /* space-separated endpoints: "tcp://"
                                 * "127.0.0.1:*", or the list of
                                 * keel__cluster_bind_endpoints */
    keel_vars *vars;            /* borrowed; the server is its only user */
    const keel__curve *curve;   /* NULL or !enabled: plain TCP */
    keel__wire_limits limits;   /* zeros: defaults */
    int task_index;
    /* The parameter server (ps_task.c): apply one aggregated gradient with
     * the optimizer (NULL: serve below answers the data messages). */
    keel_status (*apply)(void *ctx, keel_var *v, const keel_tensor *grad,
                         int64_t global_step);
    void *apply_ctx;
    /* Without apply: PULL / PUSH / INIT / HELLO go to serve (a server that
     * tests and benchmarks define, tests/ps_skel.c); it answers with
     * keel__ps_reply. */
    keel_status (*serve)(void *ctx, keel__ps *ps, keel__wire_msg *req);
    void *serve_ctx;
    int sync;                   /* SyncReplicas aggregation (with apply) */
    /* sync: fresh gradients per step (at most total_replicas; the rest
     * are backups). Each replica pushes its share of a step's gradient,
     * its mean gradient / total_replicas; the ps applies the mean of the
     * gradients aggregated (sum x total / aggregated). */
    int replicas_to_aggregate;
    int total_replicas;         /* chief + workers */
    int has_chief;              /* replica index: chief 0, worker i i+1 */
    /* > 0: replica r pushes the sums of the tree nodes covering leaves
     * [r*L/R, (r+1)*L/R) of L = reduce_leaves (keel_cluster_config); a
     * step of all replicas adds them along the tree. */
    int64_t reduce_leaves;
    /* An update rule's ps half (borrowed): each PUSH is then a commit it
     * applies (keel__algo_ps_commit; sync: once per round to the sum)
     * instead of apply, and pulls and INIT are reported to it. A PUSH's
     * header global_step says how many of the replica's steps it covers
     * (0: 1); the global step advances by that. */
    keel__algo_ps *rule;
    /* Membership (keel__ps_watch): a replica silent this long is
     * forgotten (logged; it joins again with its next message). 0: never.
     * Async also accepts workers beyond total_replicas (a worker started
     * later with a new index), up to KEEL__CLUSTER_MAX_REPLICAS. */
    int dead_after_ms;
    /* sync only: the chief applies the update. A step aggregates once the
     * chief's gradient and replicas_to_aggregate in all are held; the mean
     * goes to the chief (AGGREGATE) instead of to apply, and the step ends
     * when the chief's COMMIT brings the new values (apply is not called). */
    int chief_applies;
    /* The shared checkpoint directory a SAVE_SHARD writes this ps's shard
     * into (borrowed for the server's life); NULL: SAVE_SHARD is refused. */
    const char *checkpoint_dir;
    /* The parts of partitioned variables among vars (borrowed for the
     * server's life; n_parts 0: none): an INIT from a checkpoint reads
     * each as rows of its whole variable. */
    const keel__ps_part *parts;
    size_t n_parts;
    /* Elastic sync (keel_cluster_config.elastic; needs reduce_leaves and
     * no backups): the live replicas of each step are decided here, at
     * step boundaries (ps_members.c), and told in every reply. */
    int elastic;
    /* The lazy update of n gradient rows of v (a PUSH with
     * KEEL_WIRE_F_ROWS; keel_optimizer_apply_rows's contract); NULL:
     * rows are refused. */
    keel_status (*apply_rows)(void *ctx, keel_var *v, size_t n,
                              const int64_t *ids, const float *rows,
                              int64_t global_step);
} keel__ps_config;

/* The most local steps one commit may cover. */
#define KEEL__MAX_COVERED (1 << 20)

keel_status keel__ps_new(const keel__ps_config *cfg, keel__ps **out);
void keel__ps_free(keel__ps *ps);
/* The bound endpoint (ZMQ_LAST_ENDPOINT). */
const char *keel__ps_endpoint(const keel__ps *ps);
/* Serve one message (wait up to timeout_ms). KEEL_ETIMEOUT when none
 * came, KEEL_ECANCELLED after a SHUTDOWN, KEEL_OK otherwise (also when a
 * malformed message was answered with ERROR). */
keel_status keel__ps_serve_once(keel__ps *ps, int timeout_ms);
/* Serve until SHUTDOWN or *stop becomes nonzero (checked every 50 ms). */
keel_status keel__ps_run(keel__ps *ps, const atomic_int *stop);
/* Counters. */
long keel__ps_served(const keel__ps *ps);
long keel__ps_rejected(const keel__ps *ps);
/* Gradients applied and dropped as stale (with apply). */
long keel__ps_applied(const keel__ps *ps);
long keel__ps_dropped(const keel__ps *ps);
/* Liveness: log (at most once per stall_ms) a sync step that has waited
 * stall_ms for gradients, naming the replicas it lacks; 0: off. */
void keel__ps_watch(keel__ps *ps, int stall_ms);
/* Log (INFO) where a sync step's time went on this ps: idle, waiting
 * for the last replica, aggregating. Nothing when no step was timed. */
void keel__ps_log_timing(const keel__ps *ps);
/* Milliseconds since the chief (replica 0) was last heard from (or since
 * the start). */
int64_t keel__ps_chief_silent_ms(const keel__ps *ps);
/* For a serve function: the store, the pin of a variable's replies in
 * flight, the check that every tensor of req names a distinct variable
 * (of the same shape when vars is given: vars[i] = req's i-th), and a
 * reply to req (header filled in; outs sent zero-copy with their pins). */
keel_vars *keel__ps_vars(keel__ps *ps);
keel__wire_pin *keel__ps_pin(keel__ps *ps, const keel_var *v);
keel_status keel__ps_check_tensors(keel__ps *ps, const keel__wire_msg *req,
                                   keel_var **vars);
keel_status keel__ps_reply(keel__ps *ps, keel__wire_msg *req, uint8_t type,
                           uint8_t flags, const keel__wire_out *outs,
                           size_t n);
/* After a SHUTDOWN: answer whatever still comes (pushes of workers that
 * have not heard yet) with ERROR KEEL_ECANCELLED for up to ms. */
void keel__ps_drain(keel__ps *ps, int ms);

#endif
