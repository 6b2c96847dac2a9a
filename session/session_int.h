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

/* The process-wide signal flag (0: none). */
int keel__signal_pending(void);

/* Session internals used by training.c and supervisor.c. */
keel_status keel__session_new(const keel_session_config *cfg,
                              int is_recovering, keel_hook *owned,
                              size_t n_owned, keel_session **out);
/* Default values that training.c needs to resolve. */
double keel__session_grace_secs(const keel_session *s);

/* job.c pieces the evaluator shares (evaluator.c). */
struct keel_config;
/* Open the training (is_test 0) or test set the config names. */
keel_status keel__job_open_dataset(const struct keel_config *cfg, int is_test,
                                   keel_dataset **out);
/* The model the config describes, for batches up to max_batch. */
keel_status keel__job_model_config_from(const struct keel_config *cfg,
                                        const keel_dataset *ds,
                                        int64_t max_batch,
                                        keel_model_config *mc);
/* OpenBLAS threads as train.threads / train.model_threads say. */
void keel__job_set_blas_threads(const struct keel_config *cfg);
/* Training steps per epoch for the config's data and global batch. */
keel_status keel__job_steps_per_epoch(const struct keel_config *cfg,
                                      int64_t *out);

#endif
