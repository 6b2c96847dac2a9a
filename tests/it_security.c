/* it_security.c - a running parameter server (real `keel train` processes
 * on 127.0.0.1) attacked by a raw ZeroMQ peer written against libzmq alone
 * (its own header encoding, no keel client code): SHUTDOWN, a forged INIT,
 * an unknown flag, an oversized frame, a storm of pushes and a message of
 * too many frames, in each security mode (the job token, CURVE). Every one
 * is refused, the ps's resident memory stays bounded, and the run ends
 * with the same checkpoint, bit for bit, as a run nobody attacked; a peer
 * holding the chief's credential cannot replace its held push nor send
 * LEAVE for it mid-step. Without any authentication a forged SHUTDOWN
 * stops the ps, and the chief then exits non-zero saying so. Garbage on
 * the ps's port while training ends (with and without the token) neither
 * aborts the ps nor floods its log, and a peer's odd user name is logged
 * escaped. */
#include <config.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "testutil.h"

/* Only to derive the evaluator's token password (HMAC), not to talk. */
#include "../cluster/cluster_int.h"

#define RUN_MS 120000
#define STEPS 60
#define TOKEN "it-security-job-token-0123456789"

static char out[65536], err[65536];
static char cfg_path[4200];

#define TU_SNPRINTF(buf, size, ...)                                   \
    ck_assert_int_lt(snprintf(buf, size, __VA_ARGS__), (int)(size))

static void
setup(void)
{
    char text[2048];
#ifdef __SANITIZE_ADDRESS__
    /* ASan keeps freed blocks in a quarantine (256 MiB by default): the
     * ps's resident memory would count refused messages long freed. */
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=0",
             asan != NULL ? asan : "", asan != NULL && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
#endif
    tu_setup();
    tu_write_idx_dataset(tu_path("train"), 640, 1);
    tu_write_idx_dataset(tu_path("t10k"), 200, 2);
    TU_SNPRINTF(text, sizeof text,
             "[model]\ntype = mlp\nhidden = 32\n"
             "[data]\ndir = %s\n"
             "[optimizer]\nname = adam\nlearning_rate = 0.01\n"
             "[train]\nbatch_size = 32\nmax_steps = %d\nseed = 5\n"
             "[checkpoint]\nsave_steps = 1000\n"
             "[hooks]\nlog_every_steps = 10\nsummary_every_steps = 0\n"
             "[cluster]\ndead_after_ms = 60000\nmax_wait_secs = 60\n",
             tu_dir, STEPS);
    TU_SNPRINTF(cfg_path, sizeof cfg_path, "%s", tu_path("job.ini"));
    tu_write_file(cfg_path, text, strlen(text));
}

typedef struct job {
    int ps_port, w_port[2];
    pid_t ps, w[2];
    int chief_fd;
    char tag[16];
    char ckpt[4200];
} job;

static pid_t
start_task(job *j, const char *type, int index, const char *const *sets,
           const char *token, int *out_fd)
{
    char tf[1024], log[64], tok[128], dir[4300];
    char *env[] = { tf, NULL, NULL };
    const char *all_sets[12] = { dir };
    TU_SNPRINTF(tf, sizeof tf, "TF_CONFIG={\"cluster\": {\"ps\": "
                     "[\"127.0.0.1:%d\"], \"worker\": [\"127.0.0.1:%d\", "
                     "\"127.0.0.1:%d\"]}, \"task\": {\"type\": \"%s\", "
                     "\"index\": %d}}", j->ps_port, j->w_port[0],
                     j->w_port[1], type, index);
    if (token != NULL) {
        TU_SNPRINTF(tok, sizeof tok, "KEEL_CLUSTER_TOKEN=%s", token);
        env[1] = tok;
    }
    TU_SNPRINTF(dir, sizeof dir, "checkpoint.dir=%s", j->ckpt);
    for (int i = 0; sets != NULL && sets[i] != NULL; i++) {
        ck_assert_int_lt(i + 1, 11);
        all_sets[i + 1] = sets[i];
    }
    snprintf(log, sizeof log, "%s-%s%d.log", j->tag, type, index);
    return tu_spawn_train(cfg_path, all_sets, env, tu_path(log), out_fd);
}

static void
job_init(job *j, const char *tag)
{
    memset(j, 0, sizeof *j);
    j->ps_port = tu_held_port();
    j->w_port[0] = tu_held_port();
    j->w_port[1] = tu_held_port();
    j->chief_fd = -1;
    snprintf(j->tag, sizeof j->tag, "%s", tag);
    TU_SNPRINTF(j->ckpt, sizeof j->ckpt, "%s/%s", tu_dir, tag);
}

static char *
task_log(const job *j, const char *task)
{
    char log[64];
    snprintf(log, sizeof log, "%s-%s.log", j->tag, task);
    return tu_read_file(tu_path(log), NULL);
}

static int
log_has(const job *j, const char *task, const char *needle)
{
    char log[64];
    char *text;
    snprintf(log, sizeof log, "%s-%s.log", j->tag, task);
    if (access(tu_path(log), F_OK) != 0)
        return 0;
    text = task_log(j, task);
    int found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

/* Wait until the ps log says it serves (it has bound its port). */
static void
wait_serving(const job *j)
{
    int64_t deadline = tu_now_ms() + RUN_MS;
    while (!log_has(j, "ps0", "serving") && tu_now_ms() < deadline)
        usleep(10000);
    ck_assert_msg(log_has(j, "ps0", "serving"), "ps never served");
}

/* The ps's resident set in KiB (VmRSS of /proc/PID/status). */
static long
rss_kib(const job *j)
{
    char path[64], line[256];
    long kib = -1;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/status", (int)j->ps);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmRSS: %ld", &kib) == 1)
            break;
    fclose(f);
    if (kib < 0) {
        char *log = task_log(j, "ps0");
        ck_abort_msg("the ps is gone: %s", tu_tail(log, 1500));
    }
    return kib;
}

/* ---- the raw peer: libzmq and a hand-written header ----------------- */

enum { T_HELLO = 1, T_PULL = 3, T_PUSH = 5, T_ERROR = 7, T_STEP = 8,
       T_SHUTDOWN = 9, T_INIT = 12, T_LEAVE = 16 };
enum { WORKER = 2, EVALUATOR = 4 };   /* the header's task type byte */

static void
le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* The header (HDR bytes), laid out as docs/protocol.md describes it. */
#define HDR 64
static void
header(unsigned char h[HDR], int type, int flags, uint64_t id, int sender,
       uint32_t index, int64_t step, uint32_t count)
{
    memset(h, 0, HDR);
    memcpy(h, "KEEL", 4);
    le(h + 4, KEEL_WIRE_VERSION, 2);
    h[6] = (unsigned char)type;
    h[7] = (unsigned char)flags;
    le(h + 8, id, 8);
    h[16] = (unsigned char)sender;
    le(h + 20, index, 4);
    le(h + 24, 0x5eed, 8);
    le(h + 32, (uint64_t)step, 8);
    le(h + 48, count, 4);
}

typedef struct peer_auth {
    const char *user, *password;           /* PLAIN */
    const char *server_key, *pub, *sec;    /* CURVE */
} peer_auth;

static void *
peer_new(void *ctx, const job *j, const peer_auth *a)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    char ep[64];
    int zero = 0, sndto = 5000;
    ck_assert_ptr_nonnull(s);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &sndto, sizeof sndto);
    if (a != NULL && a->user != NULL) {
        zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, a->user, strlen(a->user));
        zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, a->password,
                       strlen(a->password));
    } else if (a != NULL && a->server_key != NULL) {
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, a->server_key, 40);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, a->pub, 40);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, a->sec, 40);
    }
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", j->ps_port);
    ck_assert_int_eq(zmq_connect(s, ep), 0);
    return s;
}

/* Send a header and n (descriptor, data) pairs of one float tensor
 * named "dense_0/kernel" of data_bytes bytes. 0 when the send timed out. */
static int
peer_send(void *s, const unsigned char h[HDR], int n, size_t data_bytes)
{
    unsigned char desc[4 + 8 + 14];
    void *data = calloc(1, data_bytes ? data_bytes : 1);
    le(desc, 14, 2);
    desc[2] = 1;
    desc[3] = 1;
    le(desc + 4, data_bytes / 4, 8);
    memcpy(desc + 12, "dense_0/kernel", 14);
    if (zmq_send(s, h, HDR, n > 0 ? ZMQ_SNDMORE : 0) != HDR) {
        free(data);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        zmq_send(s, desc, sizeof desc, ZMQ_SNDMORE);
        zmq_send(s, data, data_bytes, i + 1 < n ? ZMQ_SNDMORE : 0);
    }
    free(data);
    return 1;
}

/* A PUSH of a well-formed gradient of "dense_1/kernel" (784 x 32) for
 * local step step, as task sender index. 0 when the send timed out. */
static int
peer_push_kernel(void *s, uint64_t id, int sender, uint32_t index,
                 int64_t step)
{
    unsigned char h[HDR], desc[4 + 16 + 14];
    size_t bytes = (size_t)784 * 32 * 4;
    float *g = calloc(1, bytes);
    int ok;
    ck_assert_ptr_nonnull(g);
    for (size_t i = 0; i < bytes / 4; i++)
        g[i] = 1000.0f;                 /* far from any real gradient */
    header(h, T_PUSH, 0, id, sender, index, 0, 1);
    le(h + 40, (uint64_t)step, 8);      /* local step */
    le(desc, 14, 2);
    desc[2] = 1;
    desc[3] = 2;
    le(desc + 4, 784, 8);
    le(desc + 12, 32, 8);
    memcpy(desc + 20, "dense_1/kernel", 14);
    ok = zmq_send(s, h, HDR, ZMQ_SNDMORE) == HDR &&
         zmq_send(s, desc, sizeof desc, ZMQ_SNDMORE) == (int)sizeof desc &&
         zmq_send(s, g, bytes, 0) == (int)bytes;
    free(g);
    return ok;
}

/* Wait for the reply to request id: its type and (into text) its text
 * frame; -1 when none came within ms. Replies to other ids are skipped. */
static int
peer_reply(void *s, uint64_t id, int ms, char *text, size_t size)
{
    int64_t deadline = tu_now_ms() + ms;
    text[0] = '\0';
    while (tu_now_ms() < deadline) {
        zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
        unsigned char h[HDR];
        int more = 1, type, nf = 0;
        uint64_t rid = 0;
        size_t len = sizeof more;
        if (zmq_poll(&it, 1, (long)(deadline - tu_now_ms())) <= 0)
            continue;
        type = -1;
        while (more) {
            zmq_msg_t f;
            zmq_msg_init(&f);
            ck_assert_int_ge(zmq_msg_recv(&f, s, 0), 0);
            if (nf == 0 && zmq_msg_size(&f) == HDR) {
                memcpy(h, zmq_msg_data(&f), HDR);
                type = h[6];
                for (int i = 7; i >= 0; i--)
                    rid = (rid << 8) | h[8 + i];
            } else if (nf > 0 && (h[7] & 4) != 0) {   /* the text frame */
                size_t n = zmq_msg_size(&f) < size - 1 ? zmq_msg_size(&f)
                                                        : size - 1;
                memcpy(text, zmq_msg_data(&f), n);
                text[n] = '\0';
            }
            nf++;
            zmq_getsockopt(s, ZMQ_RCVMORE, &more, &len);
            zmq_msg_close(&f);
        }
        if (rid == id)
            return type;
    }
    return -1;
}

/* One request whose answer must be an ERROR naming needle. */
static void
expect_refusal(void *s, int type, int flags, int sender, uint32_t index,
               int n, uint64_t id, const char *needle)
{
    unsigned char h[HDR];
    char text[1024];
    header(h, type, flags, id, sender, index, 0, (uint32_t)n);
    ck_assert(peer_send(s, h, n, 4));
    ck_assert_int_eq(peer_reply(s, id, RUN_MS, text, sizeof text), T_ERROR);
    ck_assert_msg(strstr(text, needle) != NULL, "request %llu: '%s' lacks "
                  "'%s'", (unsigned long long)id, text, needle);
}

/* A STEP query answered (the ps is alive and serving this peer). */
static void
expect_alive(void *ctx, const job *j, const peer_auth *a)
{
    void *s = peer_new(ctx, j, a);
    unsigned char h[HDR];
    char text[1024];
    header(h, T_STEP, 0, 4242, EVALUATOR, 0, 0, 0);
    ck_assert(peer_send(s, h, 0, 0));
    /* it first works through the storm queued before: no tight bound */
    ck_assert_int_eq(peer_reply(s, 4242, RUN_MS, text, sizeof text), T_STEP);
    zmq_close(s);
}

/* The ps's status (a STEP reply's text) into text. */
static void
ps_status(void *ctx, const job *j, const peer_auth *a, char *text,
          size_t size)
{
    void *s = peer_new(ctx, j, a);
    unsigned char h[HDR];
    header(h, T_STEP, 0, 4343, EVALUATOR, 0, 0, 0);
    ck_assert(peer_send(s, h, 0, 0));
    ck_assert_int_eq(peer_reply(s, 4343, RUN_MS, text, size), T_STEP);
    zmq_close(s);
}

/* A raw peer holding the chief's credential (worker 0: the job has no
 * chief task) while the chief's push of step 0 is held (worker 1 is not
 * started yet): its own push of that step is refused at once and the
 * chief's stays held (the run ends bitwise as the undisturbed one); its
 * LEAVE is refused too, as a replica leaves only between its steps. */
static void
impersonate(const job *j, const peer_auth *eval, const peer_auth *chief)
{
    void *ctx = zmq_ctx_new(), *s;
    char text[1024];
    int64_t deadline = tu_now_ms() + RUN_MS;
    unsigned char h[HDR];
    do {
        ps_status(ctx, j, eval, text, sizeof text);
        if (strstr(text, "have=1/2") == NULL)
            usleep(20000);
    } while (strstr(text, "have=1/2") == NULL && tu_now_ms() < deadline);
    ck_assert_msg(strstr(text, "have=1/2") != NULL, "%s", text);
    s = peer_new(ctx, j, chief);
    for (int i = 0; i < 3; i++) {
        ck_assert(peer_push_kernel(s, 500 + (uint64_t)i, WORKER, 0, 0));
        ck_assert_int_eq(peer_reply(s, 500 + (uint64_t)i, 5000, text,
                                    sizeof text), T_ERROR);
        ck_assert_msg(strstr(text, "already holds a push of worker 0 for "
                             "step 0") != NULL, "%s", text);
    }
    header(h, T_LEAVE, 0, 510, WORKER, 0, 0, 0);
    ck_assert(peer_send(s, h, 0, 0));
    ck_assert_int_eq(peer_reply(s, 510, 5000, text, sizeof text), T_ERROR);
    ck_assert_msg(strstr(text, "LEAVE of worker 0 refused") != NULL, "%s",
                  text);
    zmq_close(s);
    ps_status(ctx, j, eval, text, sizeof text);
    ck_assert_msg(strstr(text, "have=1/2") != NULL &&
                  strstr(text, "refused=3") != NULL, "%s", text);
    zmq_ctx_term(ctx);
}

/* Everything a raw peer tries against the ps of job j, as the evaluator
 * (a task of the job with a read-only role) and as a stranger; heavy: also
 * the frame, storm and size attacks, with the ps's memory measured. */
static void
attack(const job *j, const peer_auth *eval, const peer_auth *stranger,
       int heavy)
{
    void *ctx = zmq_ctx_new();
    void *s, *x;
    unsigned char h[HDR];
    char text[256];
    long rss0, rss1;
    int sent = 0;

    rss0 = rss_kib(j);
    /* a stranger (no or wrong credentials): not even an answer */
    x = peer_new(ctx, j, stranger);
    header(h, T_SHUTDOWN, 0, 1, WORKER, 0, 0, 0);
    peer_send(x, h, 0, 0);
    ck_assert_int_eq(peer_reply(x, 1, 500, text, sizeof text), -1);
    zmq_close(x);
    /* the evaluator: reads, and nothing else */
    s = peer_new(ctx, j, eval);
    expect_refusal(s, T_SHUTDOWN, 0, EVALUATOR, 0, 0, 11,
                   "evaluator0 may not send SHUTDOWN");
    expect_refusal(s, T_SHUTDOWN, 0, WORKER, 0, 0, 12,
                   "authenticated as evaluator0 but its header claims "
                   "worker0");
    expect_refusal(s, T_INIT, 0, WORKER, 0, 1, 13,
                   "authenticated as evaluator0");
    expect_refusal(s, T_INIT, 0, EVALUATOR, 0, 1, 14,
                   "evaluator0 may not send INIT");
    expect_refusal(s, T_PUSH, 0, EVALUATOR, 0, 1, 15,
                   "evaluator0 may not send PUSH");
    /* a LEAVE ends a sync job: only a training replica may send one */
    expect_refusal(s, T_LEAVE, 0, EVALUATOR, 0, 0, 115,
                   "evaluator0 may not send LEAVE");
    /* a flag the message may not carry (every flag bit has a meaning):
     * answered under its own request id */
    expect_refusal(s, T_PULL, 0x80, EVALUATOR, 0, 0, 16,
                   "flag ROWS in a message that is not a PUSH");
    if (!heavy) {
        zmq_close(s);
        zmq_ctx_term(ctx);
        return;
    }
    /* a message of too many frames */
    header(h, T_PULL, 2, 17, EVALUATOR, 0, 0, 0);
    zmq_send(s, h, HDR, ZMQ_SNDMORE);
    for (int i = 0; i < 100000; i++)
        zmq_send(s, "", 0, i + 1 < 100000 ? ZMQ_SNDMORE : 0);
    ck_assert_int_eq(peer_reply(s, 17, RUN_MS, text, sizeof text), T_ERROR);
    ck_assert_msg(strstr(text, "frames") != NULL, "%s", text);
    /* a storm: 1000 pushes of 64 KiB, not waiting for answers */
    header(h, T_PUSH, 0, 100, EVALUATOR, 0, 0, 1);
    for (int i = 0; i < 1000; i++)
        sent += peer_send(s, h, 1, 64 << 10);
    ck_assert_int_eq(sent, 1000);
    zmq_close(s);
    /* one frame of 64 MiB, far above any variable: the connection is
     * dropped as soon as the frame's length is read */
    x = peer_new(ctx, j, eval);
    header(h, T_PUSH, 0, 18, EVALUATOR, 0, 0, 1);
    peer_send(x, h, 1, (size_t)64 << 20);
    ck_assert_int_eq(peer_reply(x, 18, 1000, text, sizeof text), -1);
    zmq_close(x);
    /* the ps took it all and still serves */
    expect_alive(ctx, j, eval);
    rss1 = rss_kib(j);
    fprintf(stderr, "%s: ps resident memory %ld -> %ld KiB\n", j->tag, rss0,
            rss1);
    ck_assert_msg(rss1 - rss0 < 32 * 1024, "ps resident memory grew from "
                  "%ld to %ld KiB under 128 MiB of refused messages", rss0,
                  rss1);
    zmq_ctx_term(ctx);
}

/* Run the job (ps, chief = worker 0, worker 1) to its end; with eval,
 * attack the ps before the chief initializes it (the refusals), and while
 * training is under way (everything): the chief has initialized the ps
 * and pushed for step 0, which waits for worker 1, started only then. */
static void
run_job(job *j, const char *const *sets, const char *token,
        const peer_auth *eval, const peer_auth *stranger,
        const peer_auth *chief)
{
    j->ps = start_task(j, "ps", 0, sets, token, NULL);
    wait_serving(j);
    if (eval != NULL)
        attack(j, eval, stranger, 0);
    j->w[0] = start_task(j, "worker", 0, sets, token, &j->chief_fd);
    if (eval != NULL) {
        int64_t deadline = tu_now_ms() + RUN_MS;
        while (!log_has(j, "ps0", "initialized by the chief") &&
               tu_now_ms() < deadline)
            usleep(10000);
        attack(j, eval, stranger, 1);
        impersonate(j, eval, chief);
    }
    j->w[1] = start_task(j, "worker", 1, sets, token, NULL);
    ck_assert_msg(tu_wait(j->w[0], RUN_MS) == 0, "%s: the chief failed",
                  j->tag);
    ck_assert_int_eq(tu_wait(j->w[1], RUN_MS), 0);
    ck_assert_int_eq(tu_wait(j->ps, RUN_MS), 0);
    close(j->chief_fd);
    j->chief_fd = -1;
}

/* The attacked run's last checkpoint is bitwise the undisturbed one's. */
static void
expect_same_result(const job *a, const job *b)
{
    char p1[4300], p2[4300];
    TU_SNPRINTF(p1, sizeof p1, "%s/model.ckpt-%d.h5", a->ckpt, STEPS);
    TU_SNPRINTF(p2, sizeof p2, "%s/model.ckpt-%d.h5", b->ckpt, STEPS);
    ck_assert_msg(tu_keel(RUN_MS, out, sizeof out, err, sizeof err, "ckpt",
                          "diff", p1, p2, NULL) == 0, "%s%s", out, err);
}

/* A reference run (tag ref_tag) and a run j (tag tag) that eval and
 * stranger attack (run_job), both secured by sets and token: the ps logs
 * its mechanism ("(token)", "(CURVE)"), refuses the forged SHUTDOWN and
 * logs refused_client for the stranger, and j ends bitwise where the
 * reference did. */
static void
run_refusing_raw_peers(job *j, const char *tag, const char *ref_tag,
                       const char *const *sets, const char *token,
                       const peer_auth *eval, const peer_auth *stranger,
                       const peer_auth *chief, const char *mechanism,
                       const char *refused_client)
{
    job ref;
    job_init(&ref, ref_tag);
    run_job(&ref, sets, token, NULL, NULL, NULL);
    ck_assert(log_has(&ref, "ps0", mechanism));
    job_init(j, tag);
    run_job(j, sets, token, eval, stranger, chief);
    ck_assert(log_has(j, "ps0", "refused SHUTDOWN"));
    ck_assert(log_has(j, "ps0", refused_client));
    expect_same_result(&ref, j);
}

START_TEST(token_ps_refuses_a_raw_peer_and_trains_on)
{
    job j;
    keel__curve ev, w0;
    peer_auth eval = { 0 }, chief = { 0 },
              stranger = { .user = "worker0", .password = "0000" };
    memset(&ev, 0, sizeof ev);
    memset(&w0, 0, sizeof w0);
    ck_assert_int_eq(keel__auth_token(&ev, TOKEN, KEEL_TASK_EVALUATOR, 0),
                     KEEL_OK);
    ck_assert_int_eq(keel__auth_token(&w0, TOKEN, KEEL_TASK_WORKER, 0),
                     KEEL_OK);
    eval.user = ev.user;
    eval.password = ev.password;
    chief.user = w0.user;
    chief.password = w0.password;
    run_refusing_raw_peers(&j, "tok", "ref", NULL, TOKEN, &eval, &stranger,
                           &chief, "(token)", "refused PLAIN client");
    ck_assert(!log_has(&j, "ps0", ev.password));
    ck_assert(!log_has(&j, "ps0", TOKEN));
    keel__curve_clear(&ev);
    keel__curve_clear(&w0);
}
END_TEST

static void
read_key(const char *dir, const char *file, char out_key[41])
{
    char path[4300], *text;
    TU_SNPRINTF(path, sizeof path, "%s/%s", dir, file);
    text = tu_read_file(path, NULL);
    ck_assert_uint_ge(strlen(text), 40);
    memcpy(out_key, text, 40);
    out_key[40] = '\0';
    free(text);
}

START_TEST(curve_ps_refuses_a_raw_peer_and_trains_on)
{
    job j;
    char keys[4200], rogue[4200], set_keys[4300];
    char ps_pub[41], ev_pub[41], ev_sec[41], st_pub[41], st_sec[41];
    char w0_pub[41], w0_sec[41];
    const char *const sets[] = { "security.curve=true", set_keys, NULL };
    const char *names[] = { "ps0", "worker0", "worker1", "evaluator0" };
    peer_auth eval, stranger, chief;
    TU_SNPRINTF(keys, sizeof keys, "%s/keys", tu_dir);
    TU_SNPRINTF(rogue, sizeof rogue, "%s/rogue", tu_dir);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(TU_KEEL(RUN_MS, "keygen", keys, "--name",
                                 names[i]), 0);
    ck_assert_int_eq(TU_KEEL(RUN_MS, "keygen", rogue, "--name", "worker0"), 0);
    read_key(keys, "ps0.key", ps_pub);
    read_key(keys, "evaluator0.key", ev_pub);
    read_key(keys, "evaluator0.key_secret", ev_sec);
    read_key(keys, "worker0.key", w0_pub);
    read_key(keys, "worker0.key_secret", w0_sec);
    read_key(rogue, "worker0.key", st_pub);
    read_key(rogue, "worker0.key_secret", st_sec);
    eval = (peer_auth){ .server_key = ps_pub, .pub = ev_pub, .sec = ev_sec };
    stranger = (peer_auth){ .server_key = ps_pub, .pub = st_pub,
                            .sec = st_sec };
    chief = (peer_auth){ .server_key = ps_pub, .pub = w0_pub,
                         .sec = w0_sec };
    TU_SNPRINTF(set_keys, sizeof set_keys, "security.key_dir=%s", keys);
    run_refusing_raw_peers(&j, "curve", "cref", sets, NULL, &eval, &stranger,
                           &chief, "(CURVE)", "refused CURVE client");
}
END_TEST

START_TEST(without_authentication_a_forged_shutdown_fails_the_chief)
{
    job j;
    char line[256];
    void *ctx = zmq_ctx_new(), *s;
    unsigned char h[HDR];
    char text[256];
    int rc;
    /* a run far longer than the test: the forged SHUTDOWN, not the last
     * step, must be what ends it however slow the machine is */
    const char *const sets[] = { "train.max_steps=100000000", NULL };
    job_init(&j, "none");
    j.ps = start_task(&j, "ps", 0, sets, NULL, NULL);
    wait_serving(&j);
    ck_assert(log_has(&j, "ps0", "has no authentication"));
    j.w[0] = start_task(&j, "worker", 0, sets, NULL, &j.chief_fd);
    j.w[1] = start_task(&j, "worker", 1, sets, NULL, NULL);
    ck_assert(tu_wait_for_line(j.chief_fd, "step 20", RUN_MS, line,
                               sizeof line));
    /* the evaluator may still not shut a ps down... */
    s = peer_new(ctx, &j, NULL);
    expect_refusal(s, T_SHUTDOWN, 0, EVALUATOR, 0, 0, 1,
                   "evaluator0 may not send SHUTDOWN");
    /* ...but nothing tells a forged chief from the real one here */
    header(h, T_SHUTDOWN, 0, 2, WORKER, 0, 0, 0);
    ck_assert(peer_send(s, h, 0, 0));
    ck_assert_int_eq(peer_reply(s, 2, RUN_MS, text, sizeof text),
                     T_SHUTDOWN);
    zmq_close(s);
    zmq_ctx_term(ctx);
    rc = tu_wait(j.w[0], RUN_MS);
    ck_assert_msg(rc != 0 && rc != -1, "the chief exited %d", rc);
    ck_assert(log_has(&j, "worker0", "shut down by someone other than this "
                      "chief"));
    ck_assert(log_has(&j, "ps0", "shut down by worker 0"));
    close(j.chief_fd);
}
END_TEST

/* A child that connects to the ps's port again and again and writes
 * garbage into each connection, until killed: every other connection
 * starts like a legacy ZMTP 1.0 peer (a 5-byte first frame), the rest is
 * random. */
static pid_t
start_flood(int port)
{
    pid_t p = fork();
    ck_assert_int_ge(p, 0);
    if (p == 0) {
        unsigned char buf[4096];
        uint32_t x = (uint32_t)getpid();
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        for (unsigned k = 0;; k++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            for (size_t i = 0; i < sizeof buf; i++) {
                x = x * 1664525u + 1013904223u;
                buf[i] = (unsigned char)(x >> 24);
            }
            if (k % 2 == 0) {
                buf[0] = 5;
                buf[1] = 0;
            }
            if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
                for (int r = 0; r < 4; r++)
                    if (send(fd, buf, sizeof buf, MSG_NOSIGNAL) < 0)
                        break;
            if (fd >= 0)
                close(fd);
        }
    }
    return p;
}

static long
file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : 0;
}

/* A PLAIN client whose user name carries a newline and an ESC: refused,
 * and logged with both escaped. */
static void
odd_user_escaped(const job *j)
{
    void *ctx = zmq_ctx_new(), *s;
    peer_auth odd = { .user = "worker0\n\x1b[31mFAKE", .password = "x" };
    unsigned char h[HDR];
    int64_t deadline = tu_now_ms() + RUN_MS;
    char *log;
    s = peer_new(ctx, j, &odd);
    header(h, T_STEP, 0, 1, WORKER, 0, 0, 0);
    peer_send(s, h, 0, 0);
    while (!log_has(j, "ps0", "refused PLAIN client") &&
           tu_now_ms() < deadline)
        usleep(10000);
    zmq_close(s);
    zmq_ctx_term(ctx);
    log = task_log(j, "ps0");
    ck_assert_msg(strstr(log, "as worker0\\n\\x1b[31mFAKE") != NULL, "%s",
                  tu_tail(log, 1500));
    ck_assert_ptr_null(strchr(log, 0x1b));
    free(log);
}

/* Training ends while garbage keeps arriving on the ps's port, rounds
 * times: the ps exits 0 every time (libzmq does not abort it) and its log
 * grows by a few KB at most. */
static void
flood_at_shutdown(const char *tag, const char *token, int rounds)
{
    for (int round = 0; round < rounds; round++) {
        job j;
        char t[16], log[64];
        long before, after;
        pid_t flood;
        int rc;
        snprintf(t, sizeof t, "%s%d", tag, round);
        job_init(&j, t);
        snprintf(log, sizeof log, "%s-ps0.log", t);
        j.ps = start_task(&j, "ps", 0, NULL, token, NULL);
        wait_serving(&j);
        if (token != NULL && round == 0)
            odd_user_escaped(&j);
        j.w[0] = start_task(&j, "worker", 0, NULL, token, &j.chief_fd);
        j.w[1] = start_task(&j, "worker", 1, NULL, token, NULL);
        before = file_size(tu_path(log));
        flood = start_flood(j.ps_port);
        rc = tu_wait(j.ps, RUN_MS);
        usleep(200000);                 /* what a dying ps might still log */
        kill(flood, SIGKILL);
        waitpid(flood, NULL, 0);
        after = file_size(tu_path(log));
        if (rc != 0) {
            char *text = task_log(&j, "ps0");
            ck_abort_msg("%s: the ps exited %d: %s", t, rc,
                         tu_tail(text, 1500));
        }
        ck_assert_msg(after - before < 8192, "%s: the ps log grew by %ld "
                      "bytes under the flood", t, after - before);
        ck_assert_int_eq(tu_wait(j.w[0], RUN_MS), 0);
        ck_assert_int_eq(tu_wait(j.w[1], RUN_MS), 0);
        close(j.chief_fd);
    }
}

START_TEST(garbage_at_shutdown_without_authentication)
{
    flood_at_shutdown("fn", NULL, 3);
}
END_TEST

START_TEST(garbage_at_shutdown_with_the_token)
{
    flood_at_shutdown("ft", TOKEN, 3);
}
END_TEST

static Suite *
security_suite(void)
{
    Suite *s = suite_create("security");
    tu_tcase(s, "raw_peer", 300, setup, tu_teardown, TU_TESTS(
        token_ps_refuses_a_raw_peer_and_trains_on,
        curve_ps_refuses_a_raw_peer_and_trains_on,
        without_authentication_a_forged_shutdown_fails_the_chief));
    tu_tcase(s, "shutdown_flood", 300, setup, tu_teardown, TU_TESTS(
        garbage_at_shutdown_without_authentication,
        garbage_at_shutdown_with_the_token));
    return s;
}

KEEL_TEST_MAIN(security_suite)
