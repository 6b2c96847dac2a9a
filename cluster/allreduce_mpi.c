/* allreduce_mpi.c - the multi_worker_mirrored engine (keel/distributed.h,
 * keel_collective_*): every rank holds every variable; each step the ranks'
 * gradients are summed in a fixed order that does not depend on the rank
 * count, and every rank applies the same update. Over MPI when keel was
 * configured with it; without MPI every call but the availability checks
 * fails with the install command.
 *
 * The sum is the canonical tree's (numeric_int.h, keel__tree_*) over the
 * leaves of every rank: rank r's leaves (keel_collective_set_leaves; one
 * leaf, the session's gradients, when none are set) follow those of the
 * ranks before it, any count per rank. A rank adds its leaves into the
 * tree nodes that cover them (one node when the ranks split a power-of-two
 * tree evenly), the flattened gradient is cut into one contiguous chunk
 * per rank, chunk c of every node sum goes to rank c (MPI_Ialltoallv),
 * rank c adds the nodes of its chunk along the tree, and the summed chunks
 * are gathered by every rank (MPI_Iallgatherv). Every addition is the
 * tree's, so any rank count gives the bits of one process; a rank sends
 * and receives its node sums and one sum a step, whatever the rank count.
 * MPI_Allreduce is not used: its order is the implementation's. Leaves
 * are pieces of the global batch's mean, so their sum is the step's
 * gradient; without leaves each rank's gradient is the mean over its own
 * examples (keel_grads_examples), and the owner of a chunk forms the
 * ranks' example-weighted mean instead (weighted_chunk), the parameter
 * servers' rule. */
#include <config.h>

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef HAVE_MPI
#include <mpi.h>
#endif

#include <keel/distributed.h>
#include "util.h"
#include "../numeric/numeric_int.h"

/* A waiting rank polls this many times, then sleeps this long between
 * polls. */
#define KEEL__COLL_SPIN_POLLS 200
#define KEEL__COLL_SLEEP_NS 20000
/* A rank waits this long for the others in one exchange before it fails:
 * longer than any step or checkpoint a rank may wait out. */
#define KEEL__COLL_DEADLINE_SECS 1800
/* Leaves one rank may hold (each is a gradient store of its own). */
#define KEEL__COLL_MAX_LEAVES 4096

#define NO_MPI_HINT "keel was built without MPI: install Open MPI " \
    "(apt-get install libopenmpi-dev openmpi-bin), re-run configure and " \
    "rebuild, or use train.strategy = parameter_server"

/* Environment variables a rank started by mpirun, srun or another PMI
 * launcher has. */
static const char *const launcher_env[] = {
    "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
    "MPI_LOCALNRANKS", NULL
};

int
keel_collective_is_available(void)
{
#ifdef HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

int
keel_collective_env_detected(void)
{
    for (int i = 0; launcher_env[i] != NULL; i++) {
        const char *v = getenv(launcher_env[i]);
        if (v != NULL && v[0] != '\0')
            return 1;
    }
    return 0;
}

#ifndef HAVE_MPI

struct keel_collective { int unused; };

keel_status
keel_collective_new(const keel_updater *update, keel_collective **out)
{
    (void)update;
    if (out != NULL)
        *out = NULL;
    return keel__fail(KEEL_EINVAL, "train.strategy = multi_worker_mirrored: "
                      NO_MPI_HINT);
}

int keel_collective_rank(const keel_collective *c) { (void)c; return 0; }
int keel_collective_size(const keel_collective *c) { (void)c; return 1; }

keel_status
keel_collective_set_leaves(keel_collective *c, keel_grads *const *leaves,
                           int n)
{
    (void)c; (void)leaves; (void)n;
    return keel__fail(KEEL_EINVAL, "collective: %s", NO_MPI_HINT);
}

keel_status
keel_collective_allreduce(keel_collective *c, keel_grads *g)
{
    (void)c; (void)g;
    return keel__fail(KEEL_EINVAL, "collective: %s", NO_MPI_HINT);
}

keel_status
keel_collective_broadcast(keel_collective *c, keel_vars *vs)
{
    (void)c; (void)vs;
    return keel__fail(KEEL_EINVAL, "collective: %s", NO_MPI_HINT);
}

keel_status
keel_collective_barrier(keel_collective *c)
{
    (void)c;
    return keel__fail(KEEL_EINVAL, "collective: %s", NO_MPI_HINT);
}

void
keel_collective_session_backend(keel_collective *c, keel_backend *out)
{
    (void)c;
    if (out != NULL)
        memset(out, 0, sizeof *out);
}

void
keel_collective_free(keel_collective *c)
{
    (void)c;
}

#else /* HAVE_MPI */

/* Floats before a reduce-scatter message's chunks: the stop flag and the
 * sender's example count. */
#define HDR 2
/* Floats behind each rank's gathered chunk and its stop flag: the rank's
 * metrics (keel__grads_metrics), float64s held two floats each: their
 * count, then KEEL__METRICS_MAX sums and KEEL__METRICS_MAX counts. */
#define MET (2 * (1 + 2 * KEEL__METRICS_MAX))

struct keel_collective {
    keel_vars *vs;              /* the session's, once it used the backend */
    keel_updater inner;
    int rank, size;
    int did_init;               /* this handle called MPI_Init */
    int has_fetched;            /* a worker took rank 0's broadcast */
    int is_clean;               /* the session ended without an error */
    keel_grads *const *leaves;  /* borrowed; NULL: the session's grads */
    int n_leaves;
    /* The exchange, fixed at the first all-reduce (make_plan) */
    int has_plan;
    size_t n_floats;            /* trainable gradient floats */
    int64_t n_tree;             /* leaves over every rank: the tree's */
    int64_t first;              /* this rank's first leaf in the tree */
    keel__tree_node *nodes;     /* every rank's cover nodes, rank order */
    int n_nodes;                /* ... all of them */
    int *node0, *nk;            /* size: rank r's first node, its count */
    keel__tree_node *leaf_nodes;/* [i, i + 1) for a node's own leaves */
    const float **parts;        /* max(n_nodes, n_leaves) pointers */
    size_t *chunk;              /* size + 1: chunk c is floats
                                 * [chunk[c], chunk[c + 1]) */
    int *scount, *sdispl, *rcount, *rdispl, *gcount, *gdispl;
    float *send;                /* per rank c: flag, own nodes' chunk c */
    float *recv;                /* per rank r: flag, r's nodes' chunk */
    float *gath;                /* per chunk c: its sum, the stop flag */
    int64_t steps, reduce_ns;
    uint64_t sent_bytes, recv_bytes;   /* to and from other ranks */
    struct sigaction old_term, old_int;
    int has_handlers;
};

/* SIGTERM/SIGINT while ranks train: held here and handed to the session on
 * every rank after the same step's all-reduce, so that every rank stops at
 * the same step (a rank that stopped alone would leave the others waiting
 * in the next all-reduce). */
static volatile sig_atomic_t g_held_signal;

static void
hold_signal(int sig)
{
    g_held_signal = sig;
}

/* Defer the process's SIGTERM/SIGINT handlers (installed by
 * keel_session_install_signal_handlers) to the all-reduce. A default or
 * ignored disposition is left as it is. */
static void
defer_signals(keel_collective *c)
{
    struct sigaction cur, sa;
    if (sigaction(SIGTERM, NULL, &cur) != 0 || cur.sa_handler == SIG_DFL ||
        cur.sa_handler == SIG_IGN)
        return;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = hold_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    g_held_signal = 0;
    if (sigaction(SIGTERM, &sa, &c->old_term) != 0)
        return;
    if (sigaction(SIGINT, &sa, &c->old_int) != 0) {
        sigaction(SIGTERM, &c->old_term, NULL);
        return;
    }
    c->has_handlers = 1;
}

static keel_status
mpi_fail(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    return keel__fail(KEEL_EUNAVAILABLE, "collective: %s failed: %s (a rank "
                      "died or its link broke; restart every rank from the "
                      "newest checkpoint)", what, msg);
}

keel_status
keel_collective_new(const keel_updater *update, keel_collective **out)
{
    keel_collective *c;
    int is_init = 0, provided = 0, rc;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "collective: out is NULL");
    *out = NULL;
    c = calloc(1, sizeof *c);
    if (c == NULL)
        return keel__fail(KEEL_ENOMEM, "collective: %zu bytes", sizeof *c);
    if (update != NULL)
        c->inner = *update;
    MPI_Initialized(&is_init);
    if (!is_init) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            free(c);
            return keel__fail(KEEL_EUNAVAILABLE, "collective: MPI_Init "
                              "failed (%d): start the ranks with mpirun -n "
                              "N or srun", rc);
        }
        c->did_init = 1;
    }
    /* errors come back as codes: a failed rank ends this one with a
     * message instead of MPI's abort */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    defer_signals(c);
    keel__log(KEEL_LOG_DEBUG, "collective: rank %d of %d", c->rank,
              c->size);
    *out = c;
    return KEEL_OK;
}

int
keel_collective_rank(const keel_collective *c)
{
    return c != NULL ? c->rank : 0;
}

int
keel_collective_size(const keel_collective *c)
{
    return c != NULL ? c->size : 1;
}

keel_status
keel_collective_set_leaves(keel_collective *c, keel_grads *const *leaves,
                           int n)
{
    if (c == NULL)
        return keel__fail(KEEL_EINVAL, "collective: handle is NULL");
    if (n < 0 || n > KEEL__COLL_MAX_LEAVES || (n > 0 && leaves == NULL))
        return keel__fail(KEEL_EINVAL, "collective: %d leaves (1 to %d, or "
                          "0 for the session's gradients)", n,
                          KEEL__COLL_MAX_LEAVES);
    if (c->has_plan && (n > 0 ? n : 1) != (c->n_leaves > 0 ? c->n_leaves
                                                            : 1))
        return keel__fail(KEEL_ESTATE, "collective: rank %d changes its "
                          "leaves from %d to %d after the first all-reduce",
                          c->rank, c->n_leaves, n);
    c->leaves = n > 0 ? leaves : NULL;
    c->n_leaves = n;
    return KEEL_OK;
}

/* Floats [lo, hi) of g's trainable tensors flattened in store order: into
 * dst (to_g = 0) or from src into g (to_g = 1). */
static void
copy_range(keel_grads *g, size_t lo, size_t hi, float *buf, int to_g)
{
    size_t off = 0;
    for (size_t i = 0; i < keel_grads_count(g) && off < hi; i++) {
        keel_tensor *t = keel_grads_at(g, i);
        size_t a, b;
        if (t == NULL)
            continue;
        a = lo > off ? lo - off : 0;
        b = hi - off < t->count ? hi - off : t->count;
        if (a < b) {
            if (to_g)
                memcpy(t->data + a, buf + (off + a - lo),
                       (b - a) * sizeof(float));
            else
                memcpy(buf + (off + a - lo), t->data + a,
                       (b - a) * sizeof(float));
        }
        off += t->count;
    }
}

/* The sum of local leaves [lo, lo + n) along the tree over n leaves (a
 * node's subtree), tensor by tensor, into leaf lo: the node's sum. */
static keel_status
sum_node(keel_collective *c, int64_t lo, int64_t n)
{
    keel_grads *const *leaves = c->leaves;
    if (n < 2)
        return KEEL_OK;
    for (size_t i = 0; i < keel_grads_count(leaves[lo]); i++) {
        keel_tensor *t = keel_grads_at(leaves[lo], i);
        keel_status st;
        if (t == NULL)
            continue;
        for (int64_t k = 0; k < n; k++)
            c->parts[k] = keel_grads_at(leaves[lo + k], i)->data;
        st = keel__tree_sum(n, c->leaf_nodes, c->parts, (int)n, t->data, 0,
                            t->count);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* The gradient store holding the sum of this rank's node i (after
 * sum_node): its first leaf, or the session's gradients g. */
static keel_grads *
node_grads(keel_collective *c, int i, keel_grads *g)
{
    if (c->leaves == NULL)
        return g;
    return c->leaves[c->nodes[c->node0[c->rank] + i].lo - c->first];
}

/* Wait for req without holding a core: a short spin, then MPI_Test
 * between sleeps (a blocking collective polls at full speed, and a rank
 * waiting for a slower one would take the CPU the slower one, or other
 * ranks on the same cores, needs). Gives up after
 * KEEL__COLL_DEADLINE_SECS: a rank that stopped answering ends this one
 * with a message instead of a hang. */
static keel_status
wait_for(keel_collective *c, MPI_Request *req, const char *what)
{
    int done = 0, rc = MPI_SUCCESS, polls = 0;
    int64_t deadline = keel__now_mono_ns() +
                       (int64_t)KEEL__COLL_DEADLINE_SECS * 1000000000;
    for (;;) {
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, what);
        if (done)
            return KEEL_OK;
        if (++polls > KEEL__COLL_SPIN_POLLS) {
            struct timespec ts = { 0, KEEL__COLL_SLEEP_NS };
            nanosleep(&ts, NULL);
            if ((polls & 1023) == 0 && keel__now_mono_ns() > deadline)
                return keel__fail(KEEL_ETIMEOUT, "collective: rank %d "
                                  "waited %d s in %s for the other %d "
                                  "ranks (one died or stopped answering; "
                                  "restart every rank from the newest "
                                  "checkpoint)", c->rank,
                                  KEEL__COLL_DEADLINE_SECS, what,
                                  c->size - 1);
        }
    }
}

static void *
plan_alloc(int *bad, size_t n, size_t size)
{
    void *p = calloc(n > 0 ? n : 1, size);
    if (p == NULL)
        *bad = 1;
    return p;
}

/* The exchange for g's trainable tensors: every rank's leaf count (one
 * MPI_Allgather, once) places its leaves in the tree; each rank's range
 * is covered by tree nodes; the gradient is cut into size chunks, chunk c
 * reduced by rank c. */
static keel_status
make_plan(keel_collective *c, keel_grads *g)
{
    int mine = c->n_leaves > 0 ? c->n_leaves : 1, bad = 0, rc, max_k;
    int *counts, host_len = 0;
    char host[MPI_MAX_PROCESSOR_NAME + 1];
    size_t stride, need;
    keel_status st = KEEL_OK;
    c->n_floats = 0;
    for (size_t i = 0; i < keel_grads_count(g); i++) {
        keel_tensor *t = keel_grads_at(g, i);
        if (t != NULL)
            c->n_floats += t->count;
    }
    if (c->n_floats >= (size_t)1 << 30)
        return keel__fail(KEEL_EINVAL, "collective: %zu gradient floats "
                          "(at most 2^30 per step)", c->n_floats);
    counts = plan_alloc(&bad, (size_t)c->size, sizeof *counts);
    c->node0 = plan_alloc(&bad, (size_t)c->size + 1, sizeof *c->node0);
    c->nk = plan_alloc(&bad, (size_t)c->size, sizeof *c->nk);
    c->chunk = plan_alloc(&bad, (size_t)c->size + 1, sizeof *c->chunk);
    c->scount = plan_alloc(&bad, 6 * (size_t)c->size, sizeof(int));
    if (bad) {
        free(counts);
        return keel__fail(KEEL_ENOMEM, "collective: the plan for %d ranks",
                          c->size);
    }
    c->sdispl = c->scount + c->size;
    c->rcount = c->sdispl + c->size;
    c->rdispl = c->rcount + c->size;
    c->gcount = c->rdispl + c->size;
    c->gdispl = c->gcount + c->size;
    counts[c->rank] = mine;
    rc = MPI_Allgather(&mine, 1, MPI_INT, counts, 1, MPI_INT,
                       MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        free(counts);
        return mpi_fail(rc, "the exchange of the ranks' leaf counts");
    }
    c->n_tree = 0;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank)
            c->first = c->n_tree;
        c->n_tree += counts[r];
    }
    /* every rank's cover, rank order: the nodes left to right */
    max_k = 2 * KEEL__TREE_MAX_DEPTH;
    c->nodes = plan_alloc(&bad, (size_t)c->size * (size_t)max_k,
                          sizeof *c->nodes);
    for (int64_t r = 0, lo = 0, k = 0; !bad && r < c->size; r++) {
        int n = keel__tree_cover(c->n_tree, lo, lo + counts[r],
                                 c->nodes + k, max_k);
        if (n < 1) {
            st = keel__fail(KEEL_EINTERNAL, "collective: the tree cover of "
                            "rank %d's leaves [%lld, %lld) of %lld", (int)r,
                            (long long)lo, (long long)(lo + counts[r]),
                            (long long)c->n_tree);
            break;
        }
        c->node0[r] = (int)k;
        c->nk[r] = n;
        k += n;
        lo += counts[r];
        c->n_nodes = (int)k;
    }
    free(counts);
    if (st != KEEL_OK)
        return st;
    c->node0[c->size] = c->n_nodes;
    c->leaf_nodes = plan_alloc(&bad, (size_t)mine, sizeof *c->leaf_nodes);
    c->parts = plan_alloc(&bad, (size_t)(mine > c->n_nodes ? mine
                                          : c->n_nodes), sizeof *c->parts);
    for (int i = 0; !bad && i < mine; i++) {
        c->leaf_nodes[i].lo = i;
        c->leaf_nodes[i].hi = i + 1;
    }
    /* chunk c: floats [n c / size, n (c + 1) / size); each message
     * carries HDR more floats, the stop flag and the sender's example
     * count (0: it sends leaves' node sums), and each gathered chunk
     * 1 + MET, the stop flag and its owner's metrics */
    for (int r = 0; r <= c->size; r++)
        c->chunk[r] = c->n_floats * (size_t)r / (size_t)c->size;
    stride = 0;
    need = 0;
    for (int r = 0; r < c->size; r++) {
        size_t to_r = c->chunk[r + 1] - c->chunk[r];
        size_t from_r = c->chunk[c->rank + 1] - c->chunk[c->rank];
        c->scount[r] = HDR + c->nk[c->rank] * (int)to_r;
        c->sdispl[r] = (int)stride;
        stride += (size_t)c->scount[r];
        c->rcount[r] = HDR + c->nk[r] * (int)from_r;
        c->rdispl[r] = (int)need;
        need += (size_t)c->rcount[r];
        c->gcount[r] = 1 + MET + (int)to_r;
        c->gdispl[r] = (int)(c->chunk[r] + (size_t)r * (1 + MET));
    }
    if (stride >= (size_t)1 << 31 || need >= (size_t)1 << 31)
        return keel__fail(KEEL_EINVAL, "collective: %zu gradient floats "
                          "over %d tree nodes exceed one exchange's 2^31 "
                          "floats (fewer leaves per rank, or leaves that "
                          "the ranks split evenly)", c->n_floats,
                          c->n_nodes);
    c->send = keel_aligned_alloc((stride + 1) * sizeof(float));
    c->recv = keel_aligned_alloc((need + 1) * sizeof(float));
    c->gath = keel_aligned_alloc((c->n_floats + (size_t)c->size *
                                  (1 + MET)) * sizeof(float));
    if (bad || c->send == NULL || c->recv == NULL || c->gath == NULL)
        return keel__fail(KEEL_ENOMEM, "collective: buffers of %zu floats "
                          "for %d ranks", c->n_floats, c->size);
    c->has_plan = 1;
    /* the host names which machine each rank of a multi-host run is on */
    if (MPI_Get_processor_name(host, &host_len) != MPI_SUCCESS)
        snprintf(host, sizeof host, "?");
    keel__log(KEEL_LOG_INFO, "collective: rank %d of %d on %s, %zu gradient "
              "floats per step; leaves [%lld, %lld) of %lld, %d tree "
              "node(s) sent (reduce-scatter, then all-gather)", c->rank,
              c->size, host, c->n_floats, (long long)c->first,
              (long long)(c->first + mine), (long long)c->n_tree,
              c->nk[c->rank]);
    return KEEL_OK;
}

/* This rank's node sums, cut into chunks: chunk c of every node to rank
 * c, behind this rank's stop flag and example count (0 with leaves). */
static void
pack_send(keel_collective *c, keel_grads *g, float flag)
{
    /* exact in a float: at most KEEL_GRADS_MAX_EXAMPLES = 2^24 - 1 */
    float examples = c->leaves != NULL ? 0.0f
        : (float)keel_grads_examples(g);
    int k = c->nk[c->rank];
    for (int r = 0; r < c->size; r++) {
        float *p = c->send + c->sdispl[r];
        size_t len = c->chunk[r + 1] - c->chunk[r];
        *p++ = flag;
        *p++ = examples;
        for (int i = 0; i < k; i++, p += len)
            copy_range(node_grads(c, i, g), c->chunk[r], c->chunk[r + 1], p,
                       0);
    }
}

/* Without leaves every rank sent one node, its mean gradient, with its
 * example count: out = sum_r n_r g_r / sum_r n_r, accumulated in double in
 * rank order and rounded once, so ranks that computed the same gradient
 * keep its bits. */
static void
weighted_chunk(keel_collective *c, size_t len, float *out)
{
    double total = 0;
    for (int r = 0; r < c->size; r++)
        total += (double)c->recv[c->rdispl[r] + 1];
    for (size_t e = 0; e < len; e++) {
        double d = 0;
        for (int r = 0; r < c->size; r++)
            d += (double)c->recv[c->rdispl[r] + 1] *
                 (double)c->parts[r][e];
        out[e] = (float)(d / total);
    }
}

/* This rank's chunk: every rank's node sums for it (rank order: the
 * nodes left to right) added along the tree into the gathered buffer, or
 * without leaves the ranks' example-weighted mean, with the first stop
 * flag any rank sent. */
static keel_status
reduce_chunk(keel_collective *c)
{
    size_t len = c->chunk[c->rank + 1] - c->chunk[c->rank];
    float *out = c->gath + c->gdispl[c->rank];
    float flag = 0.0f;
    int j = 0, means = 0;
    for (int r = 0; r < c->size; r++) {
        const float *p = c->recv + c->rdispl[r];
        if (flag == 0.0f)
            flag = p[0];
        means += p[1] > 0.0f;
        for (int i = 0; i < c->nk[r]; i++)
            c->parts[j++] = p + HDR + (size_t)i * len;
    }
    out[len] = flag;
    if (means != 0 && means != c->size)
        return keel__fail(KEEL_EINVAL, "collective: %d of %d ranks send "
                          "their mean gradient and the others leaves "
                          "(keel_collective_set_leaves): every rank must do "
                          "the same", means, c->size);
    if (len == 0)
        return KEEL_OK;
    if (means != 0) {
        weighted_chunk(c, len, out);
        return KEEL_OK;
    }
    return keel__tree_sum(c->n_tree, c->nodes, c->parts, c->n_nodes, out, 0,
                          len);
}

/* m's count, sums and counts as float64s into p (MET floats). */
static void
metrics_pack(const keel__metrics *m, float *p)
{
    double d[1 + 2 * KEEL__METRICS_MAX] = { (double)m->n };
    for (int k = 0; k < m->n; k++) {
        d[1 + k] = m->sum[k];
        d[1 + KEEL__METRICS_MAX + k] = m->count[k];
    }
    memcpy(p, d, sizeof d);
}

/* Every rank's metrics, gathered behind its chunk, combined into m in
 * rank order (ranks with another metric count left out). */
static void
metrics_combine(keel_collective *c, keel__metrics *m)
{
    if (m->n <= 0)
        return;
    keel__metrics_combine_begin(m);
    for (int r = 0; r < c->size; r++) {
        double d[1 + 2 * KEEL__METRICS_MAX];
        size_t len = c->chunk[r + 1] - c->chunk[r];
        memcpy(d, c->gath + c->gdispl[r] + len + 1, sizeof d);
        if (d[0] == (double)m->n)
            keel__metrics_combine_add(m, r, d + 1,
                                      d + 1 + KEEL__METRICS_MAX);
    }
}

/* g = the tree sum of every rank's leaves; *held = the first stop flag a
 * rank sent; g's metrics combined over every rank. Reduce-scatter (MPI_Ialltoallv: chunk c of each node sum to
 * rank c, which adds them along the tree), then all-gather of the summed
 * chunks (MPI_Iallgatherv): a rank sends and receives its node sums once
 * and the sum once, whatever the rank count. */
static keel_status
exchange(keel_collective *c, keel_grads *g, int *held)
{
    MPI_Request req;
    keel_status st;
    int rc;
    pack_send(c, g, (float)*held);
    rc = MPI_Ialltoallv(c->send, c->scount, c->sdispl, MPI_FLOAT, c->recv,
                        c->rcount, c->rdispl, MPI_FLOAT, MPI_COMM_WORLD,
                        &req);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "the gradient reduce-scatter");
    if ((st = wait_for(c, &req, "the gradient reduce-scatter")) != KEEL_OK ||
        (st = reduce_chunk(c)) != KEEL_OK)
        return st;
    metrics_pack(keel__grads_metrics(g), c->gath + c->gdispl[c->rank] +
                 (c->chunk[c->rank + 1] - c->chunk[c->rank]) + 1);
    rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c->gath,
                         c->gcount, c->gdispl, MPI_FLOAT, MPI_COMM_WORLD,
                         &req);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "the gradient all-gather");
    if ((st = wait_for(c, &req, "the gradient all-gather")) != KEEL_OK)
        return st;
    for (int r = 0; r < c->size; r++) {
        const float *p = c->gath + c->gdispl[r];
        size_t len = c->chunk[r + 1] - c->chunk[r];
        copy_range(g, c->chunk[r], c->chunk[r + 1], (float *)p, 1);
        if (*held == 0 && p[len] != 0.0f)
            *held = (int)p[len];
        if (r != c->rank) {
            c->sent_bytes += ((uint64_t)c->scount[r] +
                              (uint64_t)c->gcount[c->rank]) * sizeof(float);
            c->recv_bytes += ((uint64_t)c->rcount[r] +
                              (uint64_t)c->gcount[r]) * sizeof(float);
        }
    }
    metrics_combine(c, keel__grads_metrics(g));
    return KEEL_OK;
}

keel_status
keel_collective_allreduce(keel_collective *c, keel_grads *g)
{
    int64_t t0 = keel__now_mono_ns();
    int held;
    keel_status st;
    if (c == NULL || g == NULL)
        return keel__fail(KEEL_EINVAL, "collective: all-reduce of NULL");
    if (!c->has_plan && (st = make_plan(c, g)) != KEEL_OK)
        return st;
    /* this rank's node sums, each in its first leaf */
    for (int i = 0; c->leaves != NULL && i < c->nk[c->rank]; i++) {
        const keel__tree_node *nd = &c->nodes[c->node0[c->rank] + i];
        if ((st = sum_node(c, nd->lo - c->first, nd->hi - nd->lo)) !=
            KEEL_OK)
            return st;
    }
    held = g_held_signal;
    if (c->size == 1) {
        keel_grads *root = node_grads(c, 0, g);
        if (root != g)
            for (size_t i = 0; i < keel_grads_count(g); i++) {
                keel_tensor *t = keel_grads_at(g, i);
                if (t != NULL)
                    memcpy(t->data, keel_grads_at(root, i)->data,
                           t->count * sizeof(float));
            }
    } else if ((st = exchange(c, g, &held)) != KEEL_OK) {
        return st;
    }
    if (held != 0 && keel__signal_flag == 0)
        keel__signal_flag = held;   /* every rank stops after this step */
    c->steps++;
    c->reduce_ns += keel__now_mono_ns() - t0;
    return KEEL_OK;
}

static keel_status
bcast_floats(float *p, size_t n, const char *name)
{
    while (n > 0) {
        int k = n > (size_t)1 << 28 ? 1 << 28 : (int)n;
        int rc = MPI_Bcast(p, k, MPI_FLOAT, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, name);
        p += k;
        n -= (size_t)k;
    }
    return KEEL_OK;
}

/* What the broadcast sends of vs: its tensors (variables but local ones,
 * and their slots) and their floats. */
static void
bcast_shape(keel_vars *vs, int64_t out[2])
{
    out[0] = out[1] = 0;
    for (size_t i = 0; i < keel_vars_count(vs); i++) {
        keel_var *v = keel_vars_at(vs, i);
        const char *slot;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        out[0] += 1 + (int64_t)keel_var_slot_count(v);
        out[1] += (int64_t)keel_var_tensor(v)->count;
        for (size_t k = 0; k < keel_var_slot_count(v); k++)
            out[1] += (int64_t)keel_var_slot_at(v, k, &slot)->count;
    }
}

/* Every rank learns whether every rank's vs matches rank 0's in tensors
 * and floats before any value travels: ranks that built other models
 * would otherwise run a different sequence of broadcasts (and then
 * all-gathers of other sizes) and wait for each other for ever. All ranks
 * fail alike on a mismatch. */
static keel_status
bcast_agree(keel_collective *c, keel_vars *vs)
{
    int64_t mine[2], root[2];
    int bad, any = 0, rc;
    bcast_shape(vs, mine);
    root[0] = mine[0];
    root[1] = mine[1];
    rc = MPI_Bcast(root, 2, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "the broadcast of the model's shape");
    bad = mine[0] != root[0] || mine[1] != root[1];
    rc = MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "the check of the model's shape");
    if (bad)
        return keel__fail(KEEL_EINVAL, "collective: rank %d holds %lld "
                          "tensors of %lld floats, rank 0 %lld of %lld "
                          "(every rank must build the same model: the same "
                          "config on every rank)", c->rank,
                          (long long)mine[0], (long long)mine[1],
                          (long long)root[0], (long long)root[1]);
    if (any)
        return keel__fail(KEEL_EINVAL, "collective: another rank's model "
                          "differs from rank 0's %lld tensors of %lld "
                          "floats (every rank must build the same model: "
                          "the same config on every rank)",
                          (long long)root[0], (long long)root[1]);
    return KEEL_OK;
}

keel_status
keel_collective_broadcast(keel_collective *c, keel_vars *vs)
{
    int64_t step;
    int rc;
    keel_status st;
    if (c == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "collective: broadcast of NULL");
    if (c->size == 1)
        return KEEL_OK;
    if ((st = bcast_agree(c, vs)) != KEEL_OK)
        return st;
    step = keel_vars_global_step(vs);
    rc = MPI_Bcast(&step, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "the broadcast of the global step");
    keel_vars_set_global_step(vs, step);
    for (size_t i = 0; i < keel_vars_count(vs); i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_tensor *t = keel_var_tensor(v);
        const char *slot;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        st = bcast_floats(t->data, t->count, keel_var_name(v));
        for (size_t k = 0; st == KEEL_OK && k < keel_var_slot_count(v); k++) {
            keel_tensor *s = keel_var_slot_at(v, k, &slot);
            st = bcast_floats(s->data, s->count, slot);
        }
        if (st != KEEL_OK)
            return keel__wrap(st, "broadcast of '%s' from rank 0",
                              keel_var_name(v));
        keel_var_set_initialized(v, 1);
    }
    return KEEL_OK;
}

keel_status
keel_collective_barrier(keel_collective *c)
{
    int rc;
    if (c == NULL)
        return keel__fail(KEEL_EINVAL, "collective: barrier of NULL");
    rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? KEEL_OK : mpi_fail(rc, "the barrier");
}

/* ---- the session backend --------------------------------------------- */

static keel_status
be_apply(void *ctx, keel_vars *vs, keel_grads *grads, int64_t global_step)
{
    keel_collective *c = ctx;
    keel_status st;
    c->vs = vs;
    st = keel_collective_allreduce(c, grads);
    if (st != KEEL_OK)
        return keel__wrap(st, "step %lld", (long long)global_step);
    if (c->inner.apply == NULL)
        return KEEL_OK;
    return c->inner.apply(c->inner.ctx, vs, grads, global_step);
}

static keel_status
be_publish(void *ctx, keel_vars *vs, int restored)
{
    keel_collective *c = ctx;
    keel_status st;
    c->vs = vs;
    st = keel_collective_broadcast(c, vs);
    if (st == KEEL_OK && c->size > 1)
        keel__log(KEEL_LOG_INFO, "collective: rank 0 sent its %s state at "
                  "step %lld to %d ranks", restored ? "restored"
                  : "initialized", (long long)keel_vars_global_step(vs),
                  c->size - 1);
    return st;
}

static keel_status
be_fetch(void *ctx, keel_vars *vs, int *is_ready, char *why, size_t size)
{
    keel_collective *c = ctx;
    keel_status st;
    (void)why;
    (void)size;
    c->vs = vs;
    *is_ready = 0;
    if (c->has_fetched)
        return keel__fail(KEEL_ESTATE, "collective: rank %d's variables "
                          "came from rank 0 and are still not ready (every "
                          "rank must build the same model)", c->rank);
    st = keel_collective_broadcast(c, vs);
    if (st != KEEL_OK)
        return st;
    c->has_fetched = 1;
    *is_ready = 1;
    return KEEL_OK;
}

static keel_status
be_read_global_step(void *ctx, int64_t *step)
{
    keel_collective *c = ctx;
    *step = c->vs != NULL ? keel_vars_global_step(c->vs) : 0;
    return KEEL_OK;
}

static void
be_end(void *ctx, keel_vars *vs, int is_chief, keel_end_reason why)
{
    keel_collective *c = ctx;
    (void)vs;
    (void)is_chief;
    c->is_clean = why != KEEL_END_ERROR;
}

void
keel_collective_session_backend(keel_collective *c, keel_backend *out)
{
    if (out == NULL)
        return;
    KEEL__STRUCT_INIT(out);
    out->name = "allreduce";
    out->ctx = c;
    out->updater.ctx = c;
    out->updater.apply = be_apply;
    out->publish = be_publish;
    out->fetch = be_fetch;
    out->end = be_end;
    out->read_global_step = be_read_global_step;
}

void
keel_collective_free(keel_collective *c)
{
    if (c == NULL)
        return;
    if (c->has_handlers) {
        sigaction(SIGTERM, &c->old_term, NULL);
        sigaction(SIGINT, &c->old_int, NULL);
        if (g_held_signal != 0 && keel__signal_flag == 0)
            keel__signal_flag = g_held_signal;
    }
    /* the counters bench/mwm_train.sh reads */
    if (c->steps > 0)
        keel__log(KEEL_LOG_INFO, "collective: rank %d: %lld all-reduces, "
                  "%.3f ms each on average; per step %.0f bytes sent to and "
                  "%.0f received from other ranks", c->rank,
                  (long long)c->steps,
                  (double)c->reduce_ns / 1e6 / (double)c->steps,
                  (double)c->sent_bytes / (double)c->steps,
                  (double)c->recv_bytes / (double)c->steps);
    if (c->did_init) {
        int is_final = 0;
        MPI_Finalized(&is_final);
        /* A rank whose session failed does not finalize: the launcher
         * (mpirun, srun) sees it exit without MPI_Finalize and ends the
         * other ranks, which may be waiting for it in an all-reduce. */
        if (!is_final && c->is_clean)
            MPI_Finalize();
        else if (!is_final)
            keel__log(KEEL_LOG_WARN, "collective: rank %d ends without "
                      "MPI_Finalize after a failure: the launcher ends "
                      "the other ranks", c->rank);
    }
    keel_aligned_free(c->send);
    keel_aligned_free(c->recv);
    keel_aligned_free(c->gath);
    free(c->nodes);
    free(c->node0);
    free(c->nk);
    free(c->leaf_nodes);
    free(c->parts);
    free(c->chunk);
    free(c->scount);
    free(c);
}

#endif /* HAVE_MPI */
