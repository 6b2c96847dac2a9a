/* cluster_bench.c - push+pull throughput of keel's wire protocol: a
 * variable server (own zmq context, own thread) holding S MiB of float32
 * variables and a client (own context) that PUSHes S MiB of gradients
 * (zero-copy, summed into the variables) and PULLs the S MiB back, over
 * tcp://127.0.0.1. One JSON line per size. bench/cluster_bench.sh runs it
 * beside the raw ZeroMQ and gloo baselines and prints the ratios.
 * --mode pushpull (default: a PUSH call then a PULL call, TF's pattern),
 * fused (one PUSH with F_WANT_VALUES: the ack carries the new values),
 * pipelined (fused, split into parts of S/8 sent back to back so the
 * server applies one part while the next arrives), push or pull (one
 * direction only). --vars K: S is split into K variables (default 16).
 * --mode raw: the baseline, plain ZeroMQ: PUSH -> PULL of S-byte messages
 * sent zero-copy (zmq_msg_init_data on one buffer), each end with its own
 * context and thread, timed from the first send to the last receive.
 * usage: cluster_bench [--reps N] [--sizes-mib 1,16,64] [--vars K]
 *                      [--total-mib T]
 *                      [--mode pushpull|fused|pipelined|push|pull|raw]
 *                      [--mallopt] [--transport tcp|ipc]
 * --transport ipc: the server listens on a Unix socket (ipc://, what
 * cluster.local_transport auto uses between tasks of one host) instead.
 * --mallopt: keel train's allocator setting for cluster tasks
 * (M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 1 GiB, M_ARENA_MAX 1). */
#include <config.h>

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include <keel/keel.h>
#include "../cluster/cluster_int.h"
#include "../tests/ps_skel.h"

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int
cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct srv {
    keel__ps *ps;
    atomic_int stop;
} srv;

static void *
srv_main(void *arg)
{
    srv *s = arg;
    keel__ps_run(s->ps, &s->stop);
    return NULL;
}

#define DIE(...)                                                          \
    do {                                                                  \
        fprintf(stderr, "cluster_bench: " __VA_ARGS__);                   \
        fprintf(stderr, ": %s\n", keel_last_error());                     \
        exit(1);                                                          \
    } while (0)

static int g_ipc = 0;       /* --transport ipc */
static int g_mode = 3;      /* 1: push, 2: pull, 3: push then pull,
                             * 4: both at once, 5: both at once,
                             * pipelined in parts, 6: raw ZeroMQ */
static size_t g_reply_count;

static void
count_reply(void *ctx, const keel__wire_msg *m)
{
    (void)ctx;
    g_reply_count += m->n;
}

/* A variable server on its own thread and a client of it, with nvars
 * gradients of per floats each to push. */
typedef struct wire_run {
    size_t mib, per;
    int nvars;
    keel_vars *vars;
    srv s;
    pthread_t th;
    keel__wire_client *c;
    keel_tensor *grads;
    keel__wire_out *outs;
    char (*names)[32];
} wire_run;

static void
wire_run_open(wire_run *w, size_t mib, int nvars)
{
    keel__ps_config cfg = { .bind = "tcp://127.0.0.1:*",
                            .serve = ps_skel_serve };
    char ipc[64];
    if (g_ipc) {
        snprintf(ipc, sizeof ipc, "ipc:///tmp/keel-cluster-bench-%ld",
                 (long)getpid());
        cfg.bind = ipc;
    }
    w->mib = mib;
    w->nvars = nvars;
    w->grads = calloc((size_t)nvars, sizeof *w->grads);
    w->outs = calloc((size_t)nvars, sizeof *w->outs);
    w->names = calloc((size_t)nvars, sizeof *w->names);
    w->per = (mib << 20) / sizeof(float) / (size_t)nvars;
    if (keel_vars_new(&w->vars) != KEEL_OK)
        DIE("vars");
    for (int i = 0; i < nvars; i++) {
        int64_t shape[1] = { (int64_t)w->per };
        keel_var *v;
        snprintf(w->names[i], sizeof w->names[i], "layer%d/w", i);
        if (keel_vars_create(w->vars, w->names[i], 1, shape,
                             KEEL_VAR_TRAINABLE, &v) != KEEL_OK ||
            keel_tensor_alloc(&w->grads[i], 1, shape) != KEEL_OK)
            DIE("alloc");
        for (size_t k = 0; k < w->per; k++)
            w->grads[i].data[k] = 1e-3f;
        w->outs[i].name = w->names[i];
        w->outs[i].t = &w->grads[i];
    }
    cfg.vars = w->vars;
    memset(&w->s, 0, sizeof w->s);
    if (keel__ps_new(&cfg, &w->s.ps) != KEEL_OK)
        DIE("ps");
    pthread_create(&w->th, NULL, srv_main, &w->s);
    if (keel__wire_client_new(keel__ps_endpoint(w->s.ps), NULL,
                              KEEL_TASK_WORKER, 0, &w->c) != KEEL_OK)
        DIE("client");
}

static void
wire_run_close(wire_run *w)
{
    keel__wire_client_free(w->c);
    atomic_store(&w->s.stop, 1);
    pthread_join(w->th, NULL);
    keel__ps_free(w->s.ps);
    keel_vars_free(w->vars);
    for (int i = 0; i < w->nvars; i++)
        keel_tensor_release(&w->grads[i]);
    free(w->grads);
    free(w->outs);
    free(w->names);
}

/* --mode pipelined: one PUSH with F_WANT_VALUES in parts of S/8 (at
 * least 256 KiB). */
static void
push_pipelined(wire_run *w)
{
    size_t part = (w->mib << 20) / 8;
    g_reply_count = 0;
    if (keel__wire_client_push_parts(
            w->c, w->outs, (size_t)w->nvars, part < (256u << 10)
                                               ? (256u << 10) : part,
            KEEL_WIRE_F_WANT_VALUES, 60000, count_reply, NULL)
        != KEEL_OK)
        DIE("pipelined push");
    if (g_reply_count != (size_t)w->nvars)
        DIE("pipelined push: %zu values", g_reply_count);
}

/* One operation of g_mode: what is timed. */
static void
wire_op(wire_run *w)
{
    keel__wire_header h = { .type = KEEL_MSG_PUSH };
    keel__wire_msg m;
    size_t nvars = (size_t)w->nvars;
    if (g_mode == 5)
        push_pipelined(w);
    if (g_mode == 4) {
        h.flags = KEEL_WIRE_F_WANT_VALUES;
        if (keel__wire_client_call(w->c, &h, w->outs, nvars, 1, 60000, &m)
            != KEEL_OK)
            DIE("push+values");
        if (m.n != nvars || m.tensors[0].t.count != w->per)
            DIE("push+values reply shape");
        keel__wire_msg_clear(&m);
    }
    if (g_mode == 1 || g_mode == 3) {
        if (keel__wire_client_call(w->c, &h, w->outs, nvars, 1, 60000, &m)
            != KEEL_OK)
            DIE("push");
        keel__wire_msg_clear(&m);
    }
    if (g_mode == 2 || g_mode == 3) {
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_PULL;
        h.flags = KEEL_WIRE_F_NAMES_ONLY;
        if (keel__wire_client_call(w->c, &h, NULL, 0, 0, 60000, &m) !=
            KEEL_OK)
            DIE("pull");
        if (m.n != nvars || m.tensors[0].t.count != w->per)
            DIE("pull reply shape");
        keel__wire_msg_clear(&m);
    }
}

/* One size: returns per-op seconds for each rep in secs[]. */
static void
run_size(size_t mib, int nvars, int reps, size_t total_mib, double *secs,
         long *iters_out)
{
    wire_run w;
    long iters = (long)(total_mib / mib);
    if (iters < 3)
        iters = 3;
    wire_run_open(&w, mib, nvars);
    for (int r = -1; r < reps; r++) {       /* r = -1: warm-up */
        double t0 = now_s();
        long n = r < 0 ? 2 : iters;
        for (long i = 0; i < n; i++)
            wire_op(&w);
        if (r >= 0)
            secs[r] = (now_s() - t0) / (double)n;
    }
    *iters_out = iters;
    wire_run_close(&w);
}

/* --mode raw: plain ZeroMQ PUSH -> PULL, the ceiling keel's wire runs
 * against. */
typedef struct raw_sender {
    const char *endpoint;
    const char *buf;
    size_t size;
    long n;
} raw_sender;

static void
raw_nofree(void *data, void *hint)
{
    (void)data;
    (void)hint;
}

static void *
raw_send_main(void *arg)
{
    raw_sender *s = arg;
    void *ctx = zmq_ctx_new(), *push = zmq_socket(ctx, ZMQ_PUSH);
    if (zmq_connect(push, s->endpoint) != 0) {
        fprintf(stderr, "cluster_bench: connect %s: %s\n", s->endpoint,
                zmq_strerror(zmq_errno()));
        exit(1);
    }
    for (long i = 0; i < s->n; i++) {
        zmq_msg_t m;
        zmq_msg_init_data(&m, (void *)s->buf, s->size, raw_nofree, NULL);
        if (zmq_msg_send(&m, push, 0) < 0) {
            fprintf(stderr, "cluster_bench: send: %s\n",
                    zmq_strerror(zmq_errno()));
            exit(1);
        }
    }
    zmq_close(push);
    zmq_ctx_term(ctx);
    return NULL;
}

/* Seconds per message of n messages of size bytes (one warm-up first). */
static double
raw_run(const char *buf, size_t size, long n)
{
    void *ctx = zmq_ctx_new(), *pull = zmq_socket(ctx, ZMQ_PULL);
    char ep[256];
    size_t eplen = sizeof ep;
    pthread_t th;
    zmq_msg_t m;
    double t0 = 0;
    if (zmq_bind(pull, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &eplen) != 0) {
        fprintf(stderr, "cluster_bench: bind: %s\n", zmq_strerror(zmq_errno()));
        exit(1);
    }
    raw_sender s = { ep, buf, size, n + 1 };
    pthread_create(&th, NULL, raw_send_main, &s);
    zmq_msg_init(&m);
    for (long i = 0; i <= n; i++) {
        if (zmq_msg_recv(&m, pull, 0) != (int)size) {
            fprintf(stderr, "cluster_bench: raw receive: wrong size\n");
            exit(1);
        }
        if (i == 0)
            t0 = now_s();       /* after the warm-up message */
    }
    double secs = (now_s() - t0) / (double)n;
    zmq_msg_close(&m);
    pthread_join(th, NULL);
    zmq_close(pull);
    zmq_ctx_term(ctx);
    return secs;
}

static void
raw_size(size_t mib, int reps, size_t total_mib)
{
    size_t bytes = mib << 20;
    long n = (long)(total_mib / mib) < 3 ? 3 : (long)(total_mib / mib);
    char *buf = malloc(bytes);
    double gbs[100];
    if (!buf)
        DIE("raw buffer");
    memset(buf, 1, bytes);
    for (int r = 0; r < reps; r++)
        gbs[r] = (double)bytes / raw_run(buf, bytes, n) / 1e9;
    qsort(gbs, (size_t)reps, sizeof gbs[0], cmp_d);
    printf("{\"bench\":\"raw_zmq\",\"transport\":\"tcp\",\"send\":\"zerocopy\","
           "\"msg_bytes\":%zu,\"msgs_per_rep\":%ld,\"reps\":%d,\"unit\":\"GB/s\","
           "\"median\":%.4f,\"min\":%.4f,\"max\":%.4f}\n",
           bytes, n, reps, gbs[reps / 2], gbs[0], gbs[reps - 1]);
    fflush(stdout);
    free(buf);
}

/* The command line: see the usage at the top of this file. */
typedef struct bench_opts {
    int reps, nvars;
    size_t total_mib, sizes[16], nsizes;
} bench_opts;

/* exactly keel train's setting for cluster tasks (tools/cmd_train.c): keep
 * freed message buffers instead of returning them to the kernel (no page
 * faults on every receive), one arena for the zmq I/O thread that mallocs
 * them and the thread that frees them. A process-wide knob for a program,
 * never set by libkeel. */
static int
set_mallopt(void)
{
    if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) ||
        !mallopt(M_TRIM_THRESHOLD, 1 << 30) ||
        !mallopt(M_ARENA_MAX, 1)) {
        fprintf(stderr, "cluster_bench: mallopt refused\n");
        return 1;
    }
    return 0;
}

static int
mode_from_name(const char *name)
{
    return !strcmp(name, "push") ? 1
           : !strcmp(name, "pull") ? 2
           : !strcmp(name, "fused") ? 4
           : !strcmp(name, "pipelined") ? 5
           : !strcmp(name, "raw") ? 6 : 3;
}

static void
parse_sizes(bench_opts *o, const char *list)
{
    char *d = strdup(list), *sv = NULL;
    o->nsizes = 0;
    for (char *p = strtok_r(d, ",", &sv); p && o->nsizes < 16;
         p = strtok_r(NULL, ",", &sv))
        o->sizes[o->nsizes++] = (size_t)atol(p);
    free(d);
}

/* Returns -1 to go on, else the exit code. */
static int
parse_args(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){ .reps = 5, .nvars = 16, .total_mib = 256,
                       .sizes = { 1, 16, 64 }, .nsizes = 3 };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            o->reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vars") && i + 1 < argc)
            o->nvars = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mallopt")) {
            if (set_mallopt() != 0)
                return 1;
        } else if (!strcmp(argv[i], "--transport") && i + 1 < argc)
            g_ipc = !strcmp(argv[++i], "ipc");
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc)
            g_mode = mode_from_name(argv[++i]);
        else if (!strcmp(argv[i], "--total-mib") && i + 1 < argc)
            o->total_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--sizes-mib") && i + 1 < argc)
            parse_sizes(o, argv[++i]);
        else {
            fprintf(stderr, "usage: cluster_bench [--reps N] [--sizes-mib "
                    "1,16,64] [--vars K] [--total-mib T] [--mode "
                    "pushpull|fused|pipelined|push|pull|raw] [--mallopt]\n");
            return 2;
        }
    }
    return -1;
}

/* One size through keel's wire: its JSON line. */
static void
keel_size(const bench_opts *o, size_t mib)
{
    int reps = o->reps;
    double secs[100], alg[100], wire[100];
    long iters;
    size_t bytes = mib << 20;
    run_size(mib, o->nvars, reps, o->total_mib, secs, &iters);
    for (int r = 0; r < reps; r++) {
        alg[r] = (double)bytes / secs[r] / 1e9;
        wire[r] = 2.0 * (double)bytes / secs[r] / 1e9;
    }
    qsort(alg, (size_t)reps, sizeof alg[0], cmp_d);
    qsort(wire, (size_t)reps, sizeof wire[0], cmp_d);
    qsort(secs, (size_t)reps, sizeof secs[0], cmp_d);
    printf("{\"bench\":\"keel_%s\",\"mib\":%zu,\"bytes\":%zu,"
           "\"vars\":%d,\"ops_per_rep\":%ld,\"reps\":%d,"
           "\"unit\":\"GB/s\",\"algbw_median\":%.4f,\"algbw_min\":%.4f,"
           "\"algbw_max\":%.4f,\"wire_median\":%.4f,"
           "\"op_ms_median\":%.3f}\n",
           g_mode == 5 ? "pushpull_pipelined"
           : g_mode == 4 ? "pushpull_fused" : g_mode == 3 ? "pushpull"
           : g_mode == 1 ? "push" : "pull",
           mib, bytes, o->nvars, iters, reps, alg[reps / 2], alg[0],
           alg[reps - 1], wire[reps / 2], secs[reps / 2] * 1e3);
    fflush(stdout);
}

int
main(int argc, char **argv)
{
    bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.reps < 1 || o.reps > 100 || o.nvars < 1 || o.nvars > 1024)
        return 2;
    for (size_t si = 0; si < o.nsizes; si++) {
        if (g_mode == 6)
            raw_size(o.sizes[si], o.reps, o.total_mib);
        else
            keel_size(&o, o.sizes[si]);
    }
    return 0;
}
