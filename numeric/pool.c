/* pool.c - the model's persistent worker threads. keel__pool_run() hands
 * one function to every thread (the caller is thread 0) and returns when
 * all have finished it. Between runs a worker first spins watching for the
 * next run, then parks on a condition variable: waking a parked thread
 * can cost more than a small model's whole step (on a virtual machine an
 * idle vCPU must be woken first), and a model calls the pool once or more
 * per step. A worker spins for twice the last gap between two runs (at
 * most POOL_SPIN_MAX_NS) when that gap was short, as between the steps of
 * one process; after a long gap, as while a replica waits for its
 * parameter servers, it parks almost at once, so it never burns a core
 * that the ps on the same machine needs. The caller waits for the workers
 * by spinning (they are running its work). Workers are created once, with every signal
 * blocked (signals go to the application's threads), and joined by
 * keel__pool_free(). */
#include <config.h>

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <keel/tensor.h>
#include "util.h"
#include "numeric_int.h"

/* Spin budgets: a gap up to POOL_SHORT_GAP_NS is worth spinning through
 * (twice it, at most POOL_SPIN_MAX_NS); otherwise POOL_SPIN_MIN_NS. */
#define POOL_SHORT_GAP_NS 500000L
#define POOL_SPIN_MAX_NS 1000000L
#define POOL_SPIN_MIN_NS 20000L

struct keel__pool {
    pthread_mutex_t mu;
    pthread_cond_t start;         /* parked workers wait here */
    keel__pool_fn fn;             /* written before gen is published */
    void *ctx;
    _Atomic uint64_t gen;         /* incremented by every run */
    _Atomic int n_done;           /* workers finished with this gen */
    _Atomic int n_parked;         /* workers in (or entering) cond_wait */
    _Atomic int is_stopping;
    int nthreads;                 /* workers started + the caller */
    pthread_t tid[KEEL__POOL_MAX];
};

typedef struct worker_arg {
    keel__pool *p;
    int index;
} worker_arg;

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Wait until p->gen differs from seen or the pool stops: spin for
 * budget_ns, then park. */
static void
wait_for_run(keel__pool *p, uint64_t seen, int64_t budget_ns)
{
    int64_t deadline = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&p->gen, memory_order_acquire) != seen ||
            atomic_load_explicit(&p->is_stopping, memory_order_acquire))
            return;
        cpu_relax();
        if ((i & 255) != 0)
            continue;
        if (deadline == 0)
            deadline = keel__now_mono_ns() + budget_ns;
        else if (keel__now_mono_ns() > deadline)
            break;
        else if ((i & 4095) == 0)
            sched_yield();           /* a busy machine: let others run */
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->n_parked, 1);
    /* keel__pool_run takes the mutex after publishing gen, so either this
     * check sees the new gen or the broadcast finds this worker waiting */
    while (atomic_load(&p->gen) == seen && !atomic_load(&p->is_stopping))
        pthread_cond_wait(&p->start, &p->mu);
    atomic_fetch_sub(&p->n_parked, 1);
    pthread_mutex_unlock(&p->mu);
}

static void *
worker_main(void *arg)
{
    keel__pool *p = ((worker_arg *)arg)->p;
    int index = ((worker_arg *)arg)->index;
    uint64_t seen = 0;
    int64_t budget = POOL_SPIN_MIN_NS, done_at;
    keel__fp_mode fp;
    free(arg);
    keel__fp_flush_begin(&fp);      /* for the thread's life */
    for (;;) {
        int64_t gap;
        done_at = keel__now_mono_ns();
        wait_for_run(p, seen, budget);
        if (atomic_load_explicit(&p->is_stopping, memory_order_acquire))
            break;
        gap = keel__now_mono_ns() - done_at;
        budget = gap > POOL_SHORT_GAP_NS ? POOL_SPIN_MIN_NS
                 : 2 * gap > POOL_SPIN_MAX_NS ? POOL_SPIN_MAX_NS
                 : 2 * gap < POOL_SPIN_MIN_NS ? POOL_SPIN_MIN_NS : 2 * gap;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        p->fn(p->ctx, index);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    }
    return NULL;
}

keel_status
keel__pool_new(int nthreads, keel__pool **out)
{
    keel__pool *p;
    sigset_t all, old;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "thread pool: out is NULL");
    *out = NULL;
    if (nthreads < 1 || nthreads > KEEL__POOL_MAX)
        return keel__fail(KEEL_EINVAL, "thread pool: %d threads (1..%d)",
                          nthreads, KEEL__POOL_MAX);
    p = calloc(1, sizeof *p);
    if (p == NULL)
        return keel__fail(KEEL_ENOMEM, "thread pool");
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return keel__fail(KEEL_ENOMEM, "thread pool: mutex");
    }
    if (pthread_cond_init(&p->start, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return keel__fail(KEEL_ENOMEM, "thread pool: condition variable");
    }
    p->nthreads = 1;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    /* A worker that cannot be created is simply absent: results never
     * depend on the number of threads, only the speed does. */
    for (int i = 1; i < nthreads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (a == NULL)
            break;
        a->p = p;
        a->index = i;
        if (pthread_create(&p->tid[i], NULL, worker_main, a) != 0) {
            free(a);
            break;
        }
        p->nthreads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    *out = p;
    return KEEL_OK;
}

int
keel__pool_threads(const keel__pool *p)
{
    return p != NULL ? p->nthreads : 1;
}

void
keel__pool_run(keel__pool *p, keel__pool_fn fn, void *ctx)
{
    keel__fp_mode fp;
    keel__fp_flush_begin(&fp);
    if (p == NULL || p->nthreads == 1) {
        fn(ctx, 0);
        keel__fp_flush_end(&fp);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1);   /* seq_cst: ordered before the n_parked load */
    if (atomic_load(&p->n_parked) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->start);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0);
    for (unsigned i = 1;
         atomic_load_explicit(&p->n_done, memory_order_acquire) <
         p->nthreads - 1; i++) {
        cpu_relax();
        if ((i & 1023) == 0)
            sched_yield();
    }
    keel__fp_flush_end(&fp);
}

void
keel__spin_barrier_wait(keel__spin_barrier *b)
{
    int ph = atomic_load_explicit(&b->phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) ==
        b->n - 1) {
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
        atomic_store_explicit(&b->phase, ph + 1, memory_order_release);
        return;
    }
    for (unsigned i = 1;
         atomic_load_explicit(&b->phase, memory_order_acquire) == ph; i++) {
        cpu_relax();
        if ((i & 1023) == 0)
            sched_yield();
    }
}

void
keel__pool_free(keel__pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->is_stopping, 1);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nthreads; i++)
        pthread_join(p->tid[i], NULL);
    pthread_cond_destroy(&p->start);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
