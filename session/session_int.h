/* session_int.h - private to session/: the condition-variable helpers and
 * what the session files share. Threads: a session is single-threaded (its
 * alarm thread, monitored.c, only raises a flag); the coordinator and the
 * manager's wait/notify are thread-safe. */
#ifndef KEEL_SESSION_INT_H
#define KEEL_SESSION_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <keel/session.h>
#include <keel/train.h>
#include "../hooks/hooks_int.h"
#include "../train/train_int.h"

/* A condition variable on CLOCK_MONOTONIC. */
void keel__cond_init_mono(pthread_cond_t *cv);
/* Wait until deadline_ns (monotonic; < 0: forever). 1 on timeout. */
int keel__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu,
                          int64_t deadline_ns);

/* The flag keel_coord_should_stop reads (valid while c lives): the step
 * path loads it without a call. */
const atomic_int *keel__coord_stop_flag(const keel_coord *c);

/* Session internals used by training.c and supervisor.c. */
keel_status keel__session_new(const keel_session_config *cfg,
                              int is_recovering, keel_hook *owned,
                              size_t n_owned, keel_session **out);
/* Copy a caller's backend (struct_size bytes; later members NULL). */
void keel__backend_copy(keel_backend *dst, const keel_backend *src);
/* Something the session frees after everything else at keel_session_free
 * (training.c: the optimizer and the cluster backend it made). */
void keel__session_set_cleanup(keel_session *s, void (*fn)(void *ctx),
                               void *ctx);
/* Default values that training.c needs to resolve. */
double keel__session_grace_secs(const keel_session *s);

#endif
