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
 *                      [--mallopt]
 * --mallopt: keel train's allocator setting for cluster tasks
 * (M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 1 GiB, M_ARENA_MAX 1). */
#include <config.h>

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* One size: returns per-op seconds for each rep in secs[]. */
static int g_mode = 3;      /* bit 0: push, bit 1: pull, 4: both at once,
                             * 5: both at once, pipelined in parts,
                             * 6: raw ZeroMQ */
static size_t g_reply_count;

static void
count_reply(void *ctx, const keel__wire_msg *m)
{
    (void)ctx;
    g_reply_count += m->n;
}

static void
run_size(size_t mib, int nvars, int reps, size_t total_mib, double *secs,
         long *iters_out)
{
    keel_vars *vars;
    keel__ps_config cfg = { .bind = "tcp://127.0.0.1:*",
                            .serve = ps_skel_serve };
    srv s;
    pthread_t th;
    keel__wire_client *c;
    keel_tensor *grads = calloc((size_t)nvars, sizeof *grads);
    keel__wire_out *outs = calloc((size_t)nvars, sizeof *outs);
    char (*names)[32] = calloc((size_t)nvars, sizeof *names);
    size_t per = (mib << 20) / sizeof(float) / (size_t)nvars;
    long iters = (long)(total_mib / mib);
    if (iters < 3)
        iters = 3;

    if (keel_vars_new(&vars) != KEEL_OK)
        DIE("vars");
    for (int i = 0; i < nvars; i++) {
        int64_t shape[1] = { (int64_t)per };
        keel_var *v;
        snprintf(names[i], sizeof names[i], "layer%d/w", i);
        if (keel_vars_create(vars, names[i], 1, shape, KEEL_VAR_TRAINABLE,
                             &v) != KEEL_OK ||
            keel_tensor_alloc(&grads[i], 1, shape) != KEEL_OK)
            DIE("alloc");
        for (size_t k = 0; k < per; k++)
            grads[i].data[k] = 1e-3f;
        outs[i].name = names[i];
        outs[i].t = &grads[i];
    }
    cfg.vars = vars;
    memset(&s, 0, sizeof s);
    if (keel__ps_new(&cfg, &s.ps) != KEEL_OK)
        DIE("ps");
    pthread_create(&th, NULL, srv_main, &s);
    if (keel__wire_client_new(keel__ps_endpoint(s.ps), NULL, KEEL_TASK_WORKER,
                              0, &c) != KEEL_OK)
        DIE("client");
    for (int r = -1; r < reps; r++) {       /* r = -1: warm-up */
        double t0 = now_s();
        long n = r < 0 ? 2 : iters;
        for (long i = 0; i < n; i++) {
            keel__wire_header h = { .type = KEEL_MSG_PUSH };
            keel__wire_msg m;
            if (g_mode == 5) {
                size_t part = (mib << 20) / 8;
                g_reply_count = 0;
                if (keel__wire_client_push_parts(
                        c, outs, (size_t)nvars, part < (256u << 10)
                                                    ? (256u << 10) : part,
                        KEEL_WIRE_F_WANT_VALUES, 60000, count_reply, NULL)
                    != KEEL_OK)
                    DIE("pipelined push");
                if (g_reply_count != (size_t)nvars)
                    DIE("pipelined push: %zu values", g_reply_count);
            }
            if (g_mode == 4) {
                h.flags = KEEL_WIRE_F_WANT_VALUES;
                if (keel__wire_client_call(c, &h, outs, (size_t)nvars, 1,
                                           60000, &m) != KEEL_OK)
                    DIE("push+values");
                if (m.n != (size_t)nvars || m.tensors[0].t.count != per)
                    DIE("push+values reply shape");
                keel__wire_msg_clear(&m);
            }
            if (g_mode & 1) {
                if (keel__wire_client_call(c, &h, outs, (size_t)nvars, 1,
                                           60000, &m) != KEEL_OK)
                    DIE("push");
                keel__wire_msg_clear(&m);
            }
            if (g_mode & 2) {
                memset(&h, 0, sizeof h);
                h.type = KEEL_MSG_PULL;
                h.flags = KEEL_WIRE_F_NAMES_ONLY;
                if (keel__wire_client_call(c, &h, NULL, 0, 0, 60000, &m) !=
                    KEEL_OK)
                    DIE("pull");
                if (m.n != (size_t)nvars || m.tensors[0].t.count != per)
                    DIE("pull reply shape");
                keel__wire_msg_clear(&m);
            }
        }
        if (r >= 0)
            secs[r] = (now_s() - t0) / (double)n;
    }
    *iters_out = iters;
    keel__wire_client_free(c);
    atomic_store(&s.stop, 1);
    pthread_join(th, NULL);
    keel__ps_free(s.ps);
    keel_vars_free(vars);
    for (int i = 0; i < nvars; i++)
        keel_tensor_release(&grads[i]);
    free(grads);
    free(outs);
    free(names);
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

int
main(int argc, char **argv)
{
    int reps = 5, nvars = 16;
    size_t total_mib = 256, sizes[16] = { 1, 16, 64 }, nsizes = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vars") && i + 1 < argc)
            nvars = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mallopt")) {
            /* exactly keel train's setting for cluster tasks
             * (tools/cmd_train.c): keep freed message buffers instead of
             * returning them to the kernel (no page faults on every
             * receive), one arena for the zmq I/O thread that mallocs
             * them and the thread that frees them. A process-wide knob
             * for a program, never set by libkeel. */
            if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) ||
                !mallopt(M_TRIM_THRESHOLD, 1 << 30) ||
                !mallopt(M_ARENA_MAX, 1)) {
                fprintf(stderr, "cluster_bench: mallopt refused\n");
                return 1;
            }
        } else if (!strcmp(argv[i], "--mode") && i + 1 < argc)
            g_mode = !strcmp(argv[++i], "push") ? 1
                     : !strcmp(argv[i], "pull") ? 2
                     : !strcmp(argv[i], "fused") ? 4
                     : !strcmp(argv[i], "pipelined") ? 5
                     : !strcmp(argv[i], "raw") ? 6 : 3;
        else if (!strcmp(argv[i], "--total-mib") && i + 1 < argc)
            total_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--sizes-mib") && i + 1 < argc) {
            char *d = strdup(argv[++i]), *sv = NULL;
            nsizes = 0;
            for (char *p = strtok_r(d, ",", &sv); p && nsizes < 16;
                 p = strtok_r(NULL, ",", &sv))
                sizes[nsizes++] = (size_t)atol(p);
            free(d);
        } else {
            fprintf(stderr, "usage: cluster_bench [--reps N] [--sizes-mib "
                    "1,16,64] [--vars K] [--total-mib T] [--mode "
                    "pushpull|fused|pipelined|push|pull|raw] [--mallopt]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 100 || nvars < 1 || nvars > 1024)
        return 2;
    if (g_mode == 6) {
        for (size_t si = 0; si < nsizes; si++)
            raw_size(sizes[si], reps, total_mib);
        return 0;
    }
    for (size_t si = 0; si < nsizes; si++) {
        double secs[100], alg[100], wire[100];
        long iters;
        size_t bytes = sizes[si] << 20;
        run_size(sizes[si], nvars, reps, total_mib, secs, &iters);
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
               sizes[si], bytes, nvars, iters, reps, alg[reps / 2], alg[0],
               alg[reps - 1], wire[reps / 2], secs[reps / 2] * 1e3);
        fflush(stdout);
    }
    return 0;
}
