/* pool.c - the model's persistent worker threads. keel__pool_run() hands
 * one function to every thread (the caller is thread 0) and returns when
 * all have finished it; between runs the workers park on a condition
 * variable. Workers are created once, with every signal blocked (signals
 * go to the application's threads), and joined by keel__pool_free(). */
#include <config.h>

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include <keel/keel.h>
#include "util.h"
#include "train_int.h"

struct keel__pool {
    pthread_mutex_t mu;
    pthread_cond_t start;         /* workers wait here for a new gen */
    pthread_cond_t done;          /* the caller waits here for n_done */
    keel__pool_fn fn;
    void *ctx;
    uint64_t gen;                 /* incremented by every run */
    int n_done;                   /* workers finished with this gen */
    int is_stopping;
    int nthreads;                 /* workers started + the caller */
    pthread_t tid[KEEL__POOL_MAX];
};

typedef struct worker_arg {
    keel__pool *p;
    int index;
} worker_arg;

static void *
worker_main(void *arg)
{
    keel__pool *p = ((worker_arg *)arg)->p;
    int index = ((worker_arg *)arg)->index;
    uint64_t seen = 0;
    free(arg);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        keel__pool_fn fn;
        void *ctx;
        while (p->gen == seen && !p->is_stopping)
            pthread_cond_wait(&p->start, &p->mu);
        if (p->is_stopping)
            break;
        seen = p->gen;
        fn = p->fn;
        ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, index);
        pthread_mutex_lock(&p->mu);
        if (++p->n_done == p->nthreads - 1)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
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
    if (pthread_cond_init(&p->done, NULL) != 0) {
        pthread_cond_destroy(&p->start);
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
    if (p == NULL || p->nthreads == 1) {
        fn(ctx, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_done = 0;
    p->gen++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0);
    pthread_mutex_lock(&p->mu);
    while (p->n_done < p->nthreads - 1)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void
keel__pool_free(keel__pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->is_stopping = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nthreads; i++)
        pthread_join(p->tid[i], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->start);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
