/* allreduce_mpi.c - the multi_worker_mirrored engine (keel/distributed.h,
 * keel_collective_*): every rank holds every variable; each step the ranks'
 * gradients are summed in a fixed order that does not depend on the rank
 * count, and every rank applies the same update. Over MPI when keel was
 * configured with it; without MPI every call but the availability checks
 * fails with the install command.
 *
 * The sum: a rank's gradient leaves (keel_collective_set_leaves; one leaf,
 * the session's gradients, when none are set) are added pairwise along a
 * binary tree into the rank's root, the roots of every rank are gathered
 * (MPI_Allgather, in rank order) and added along the same kind of tree.
 * With L leaves in all and P ranks (powers of two, P <= L) this is the one
 * tree over the L leaves, so 1, 2, 4 ... ranks give identical bits.
 * MPI_Allreduce is not used: its order is the implementation's. */
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
#include "../core/core_int.h"

/* A waiting rank polls this many times, then sleeps this long between
 * polls. */
#define KEEL__COLL_SPIN_POLLS 200
#define KEEL__COLL_SLEEP_NS 20000

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

struct keel_collective {
    keel_vars *vs;              /* the session's, once it used the backend */
    keel_updater inner;
    int rank, size;
    int did_init;               /* this handle called MPI_Init */
    int has_fetched;            /* a worker took rank 0's broadcast */
    int is_clean;               /* the session ended without an error */
    keel_grads *const *leaves;  /* borrowed; NULL: the session's grads */
    int n_leaves;
    size_t n_floats;            /* trainable gradient floats (buffers
                                 * sized at the first all-reduce) */
    float *send;                /* n_floats + 1 (the stop flag) */
    float *recv;                /* size * (n_floats + 1) */
    /* Every rank on this node: a shared window of two slots per rank
     * (alternate steps), read directly after one barrier */
    int use_shm, phase;
    MPI_Comm node;
    MPI_Win win;
    float **slot;               /* each rank's slots in this process */
    int64_t steps, reduce_ns;
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
    c->node = MPI_COMM_NULL;
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
    if (n < 0 || n > 1024 || (n > 0 && leaves == NULL) || (n & (n - 1)))
        return keel__fail(KEEL_EINVAL, "collective: %d leaves (a power of "
                          "two up to 1024, or 0 for the session's "
                          "gradients)", n);
    c->leaves = n > 0 ? leaves : NULL;
    c->n_leaves = n;
    return KEEL_OK;
}

/* bufs[lo..hi) summed pairwise along the fixed tree (halves split at the
 * middle, the left half's size rounded up) into bufs[lo]. */
static void
tree_sum(float *const *bufs, int lo, int hi, size_t count)
{
    int mid;
    if (hi - lo < 2)
        return;
    mid = lo + (hi - lo + 1) / 2;
    tree_sum(bufs, lo, mid, count);
    tree_sum(bufs, mid, hi, count);
    keel__add_into(bufs[lo], bufs[mid], count);
}

/* The gradient store's trainable tensors, in store order, into dst. */
static void
pack(keel_grads *g, float *dst)
{
    size_t off = 0;
    for (size_t i = 0; i < keel_grads_count(g); i++) {
        keel_tensor *t = keel_grads_at(g, i);
        if (t == NULL)
            continue;
        memcpy(dst + off, t->data, t->count * sizeof(float));
        off += t->count;
    }
}

static void
unpack(keel_grads *g, const float *src)
{
    size_t off = 0;
    for (size_t i = 0; i < keel_grads_count(g); i++) {
        keel_tensor *t = keel_grads_at(g, i);
        if (t == NULL)
            continue;
        memcpy(t->data, src + off, t->count * sizeof(float));
        off += t->count;
    }
}

/* The leaves' tree sum into leaves[0], tensor by tensor. */
static void
sum_leaves(keel_grads *const *leaves, int n)
{
    float *bufs[1024];
    for (size_t i = 0; i < keel_grads_count(leaves[0]); i++) {
        keel_tensor *t = keel_grads_at(leaves[0], i);
        if (t == NULL)
            continue;
        for (int k = 0; k < n; k++)
            bufs[k] = keel_grads_at(leaves[k], i)->data;
        tree_sum(bufs, 0, n, t->count);
    }
}

/* Wait for req without holding a core: a short spin, then MPI_Test
 * between sleeps. A blocking collective polls at full speed, and a rank
 * waiting for a slower one would take the CPU the slower one (or other
 * ranks on the same cores) needs. */
static int
wait_for(MPI_Request *req)
{
    int done = 0, rc = MPI_SUCCESS, polls = 0;
    while (rc == MPI_SUCCESS) {
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done)
            break;
        if (++polls > KEEL__COLL_SPIN_POLLS) {
            struct timespec ts = { 0, KEEL__COLL_SLEEP_NS };
            nanosleep(&ts, NULL);
        }
    }
    return rc;
}

/* Every rank's root (stride floats each, from c->send) into c->recv in
 * rank order. On one node through the shared window: each rank writes its
 * slot of this step's phase, one barrier, each reads every slot (the other
 * phase is written next step, after the next barrier, so no slot is
 * overwritten while read). Across nodes: MPI_Iallgather. */
static int
allgather(keel_collective *c, size_t stride)
{
    MPI_Request req;
    int rc;
    if (c->use_shm) {
        size_t off = (size_t)c->phase * stride;
        memcpy(c->slot[c->rank] + off, c->send, stride * sizeof(float));
        MPI_Win_sync(c->win);
        rc = MPI_Ibarrier(c->node, &req);
        if (rc == MPI_SUCCESS)
            rc = wait_for(&req);
        if (rc != MPI_SUCCESS)
            return rc;
        MPI_Win_sync(c->win);
        for (int r = 0; r < c->size; r++)
            memcpy(c->recv + (size_t)r * stride, c->slot[r] + off,
                   stride * sizeof(float));
        c->phase ^= 1;
        return MPI_SUCCESS;
    }
    rc = MPI_Iallgather(c->send, (int)stride, MPI_FLOAT, c->recv,
                        (int)stride, MPI_FLOAT, MPI_COMM_WORLD, &req);
    return rc == MPI_SUCCESS ? wait_for(&req) : rc;
}

/* The shared window when every rank is on this node (else nothing: the
 * all-gather goes through MPI). */
static keel_status
make_window(keel_collective *c, size_t stride)
{
    int nsize = 0, rc;
    float *base = NULL;
    rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0,
                             MPI_INFO_NULL, &c->node);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "the node communicator");
    MPI_Comm_size(c->node, &nsize);
    if (nsize != c->size)
        return KEEL_OK;
    c->slot = calloc((size_t)c->size, sizeof *c->slot);
    if (c->slot == NULL)
        return keel__fail(KEEL_ENOMEM, "collective: %d slots", c->size);
    rc = MPI_Win_allocate_shared((MPI_Aint)(2 * stride * sizeof(float)),
                                 (int)sizeof(float), MPI_INFO_NULL, c->node,
                                 &base, &c->win);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "the shared window");
    for (int r = 0; r < c->size && rc == MPI_SUCCESS; r++) {
        MPI_Aint size;
        int disp;
        rc = MPI_Win_shared_query(c->win, r, &size, &disp, &c->slot[r]);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, c->win);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "the shared window");
    c->use_shm = 1;
    return KEEL_OK;
}

/* The all-gather's buffers for g's trainable tensors and the stop flag. */
static keel_status
make_buffers(keel_collective *c, keel_grads *g)
{
    keel_status st;
    c->n_floats = 0;
    for (size_t i = 0; i < keel_grads_count(g); i++) {
        keel_tensor *t = keel_grads_at(g, i);
        if (t != NULL)
            c->n_floats += t->count;
    }
    if (c->n_floats >= (size_t)1 << 30)
        return keel__fail(KEEL_EINVAL, "collective: %zu gradient floats "
                          "(at most 2^30 per step)", c->n_floats);
    c->send = keel_aligned_alloc((c->n_floats + 1) * sizeof(float));
    c->recv = keel_aligned_alloc((size_t)c->size * (c->n_floats + 1) *
                                 sizeof(float));
    if (c->send == NULL || c->recv == NULL) {
        keel_aligned_free(c->send);
        keel_aligned_free(c->recv);
        c->send = c->recv = NULL;
        return keel__fail(KEEL_ENOMEM, "collective: buffers of %zu floats "
                          "for %d ranks", c->n_floats, c->size);
    }
    st = make_window(c, c->n_floats + 1);
    if (st != KEEL_OK)
        return st;
    keel__log(KEEL_LOG_INFO, "collective: rank %d of %d, %zu gradient "
              "floats per step (%s)", c->rank, c->size, c->n_floats,
              c->use_shm ? "one node: a shared window" : "all-gather");
    return KEEL_OK;
}

keel_status
keel_collective_allreduce(keel_collective *c, keel_grads *g)
{
    keel_grads *root;
    float *bufs[1024];
    size_t stride;
    int64_t t0 = keel__now_mono_ns();
    int rc, held;
    keel_status st;
    if (c == NULL || g == NULL)
        return keel__fail(KEEL_EINVAL, "collective: all-reduce of NULL");
    if (c->size > 1024)
        return keel__fail(KEEL_EINVAL, "collective: %d ranks (at most 1024)",
                          c->size);
    root = g;
    if (c->n_leaves > 0) {
        sum_leaves(c->leaves, c->n_leaves);
        root = c->leaves[0];
    }
    held = g_held_signal;
    if (c->size == 1) {
        if (root != g)
            for (size_t i = 0; i < keel_grads_count(g); i++) {
                keel_tensor *t = keel_grads_at(g, i);
                if (t != NULL)
                    memcpy(t->data, keel_grads_at(root, i)->data,
                           t->count * sizeof(float));
            }
    } else {
        if (c->send == NULL && (st = make_buffers(c, g)) != KEEL_OK)
            return st;
        stride = c->n_floats + 1;
        pack(root, c->send);
        c->send[c->n_floats] = (float)held;
        rc = allgather(c, stride);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "the gradient all-gather");
        for (int r = 0; r < c->size; r++) {
            bufs[r] = c->recv + (size_t)r * stride;
            if (bufs[r][c->n_floats] != 0.0f && held == 0)
                held = (int)bufs[r][c->n_floats];
        }
        tree_sum(bufs, 0, c->size, c->n_floats);
        unpack(g, bufs[0]);
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
    if (c->steps > 0)
        keel__log(KEEL_LOG_INFO, "collective: rank %d: %lld all-reduces, "
                  "%.3f ms each on average", c->rank, (long long)c->steps,
                  (double)c->reduce_ns / 1e6 / (double)c->steps);
    if (c->did_init) {
        int is_final = 0;
        MPI_Finalized(&is_final);
        /* A rank whose session failed does not finalize: the launcher
         * (mpirun, srun) sees it exit without MPI_Finalize and ends the
         * other ranks, which may be waiting for it in an all-reduce. */
        if (!is_final && c->is_clean) {
            if (c->use_shm) {
                MPI_Win_unlock_all(c->win);
                MPI_Win_free(&c->win);
            }
            if (c->node != MPI_COMM_NULL && c->node != 0)
                MPI_Comm_free(&c->node);
            MPI_Finalize();
        }
        else if (!is_final)
            keel__log(KEEL_LOG_WARN, "collective: rank %d ends without "
                      "MPI_Finalize after a failure: the launcher ends "
                      "the other ranks", c->rank);
    }
    keel_aligned_free(c->send);
    keel_aligned_free(c->recv);
    free(c->slot);
    free(c);
}

#endif /* HAVE_MPI */
