/* worker_int.h - private to cluster/: the worker backend's state and the
 * calls its files share. worker.c (set-up, the session backend, the end,
 * the public calls) uses worker_pull.c (HELLO, INIT and pulls) and
 * worker_push.c (a step's push and its token) and worker_save.c (sharded
 * checkpoints), and worker_part.c (partitioned variables: the session's
 * calls over the split store) uses worker_pull.c and worker_push.c; all
 * use worker_call.c
 * (one request to a ps and its reply). No file calls one above it. */
#ifndef KEEL_CLUSTER_WORKER_INT_H
#define KEEL_CLUSTER_WORKER_INT_H

#include <stddef.h>
#include <stdint.h>

#include <keel/session.h>
#include <keel/distributed.h>
#include "cluster_int.h"
#include "role_int.h"

struct keel_cluster_backend {
    const keel_cluster_spec *spec;
    keel__role_opts o;
    keel_vars *vs;
    int n_ps;
    keel__wire_client **clients;
    uint64_t *req_ids;             /* per ps: the push in flight */
    uint64_t *ps_gen;              /* each ps's incarnation when joined */
    int *ps_of;                    /* per variable */
    size_t n_vars;
    keel__wire_out *outs;          /* scratch, n_vars + slots */
    char (*names)[KEEL_NAME_MAX];  /* scratch slot names */
    size_t n_names;
    int is_chief;
    uint64_t generation;           /* this process's incarnation */
    keel_grads *const *micro;      /* micro-batch gradients, or NULL */
    int n_micro;
    int64_t last_fetch_ns;
    int64_t wait_since_ns;         /* a fetch first found it not ready; 0:
                                    * ready (or not yet asked) */
    int64_t wait_log_ns;           /* the waiting was last logged */
    keel__curve *curves;           /* per ps: client set-up (server key) */
    keel__hb *hb;                  /* liveness of every ps */
    int64_t gen_ns;                /* when ps_gen was last learned */
    int64_t last_step_seen;        /* the cluster's step before a loss */
    int is_sync;                   /* the ps aggregate sync steps */
    int heard_end;                 /* a ps said the job ended (SHUTDOWN, or
                                    * a replica's LEAVE): nothing to tell */
    int replica;                   /* chief 0, worker i i + has_chief */
    uint64_t membership;           /* elastic: ps 0's last membership word
                                    * (KEEL__MEMBERSHIP_*); 0: none */
    keel__algo_worker *aw;         /* the rule's worker half, or NULL
                                    * (sync, async, hogwild: gradients) */
    keel_grads *local;             /* the chief's local model across a
                                    * checkpoint's pull (with aw) */
    int restore_local;             /* local holds it until the next step */
    /* step timing (logged by keel_cluster_backend_free), monotonic ns
     * summed over steps: compute (the previous apply's end to this one's
     * start: input, forward, backward, hooks), send (queueing the pushes),
     * wait (for the replies: the other replicas, the ps's aggregation, the
     * transfer back), copy (the new values into the model) */
    long timed_steps;
    int64_t last_apply_end_ns, compute_ns, send_ns, wait_ns, copy_ns;
    keel__wire_metrics push_metrics; /* the step's metrics to ps 0 */
    /* partitioned variables (worker_part.c): vs is then part->wire and
     * the session's store is user_vs */
    keel__partition *part;
    keel_vars *user_vs;
    keel_grads *part_grads;         /* a step's gradients, split */
    keel_grads *part_micro[KEEL__MAX_MICRO];
    keel_grads *const *user_micro;
    keel__wire_membership push_membership; /* elastic: the word the
                                    * step's leaves were divided by, to
                                    * every ps */
    keel_tensor *sparse_t;         /* per variable: its ids and rows
                                    * views (worker_sparse.c), or NULL */
    uint64_t push_bytes;           /* tensor data pushed in timed steps */
    uint64_t step_bytes;           /* tensor data of this step's push */
    uint64_t pull_bytes;           /* tensor data received in timed steps
                                    * (the push's reply, row pulls) */
    uint64_t step_pull_bytes;      /* that of this step */
    int rows_attached;             /* row variables read through
                                    * keel__worker_sparse_attach's source */
};

/* ---- one request to a ps (worker_call.c) -------------------------------- */

/* Before a HELLO to ps p and after its answer: a ps of this host reached
 * over tcp because its Unix socket did not exist yet when the client
 * connected (it started later) is reached over that socket from then on
 * (cluster.local_transport auto). Fails only when the new connection
 * cannot be made. */
keel_status keel__worker_prefer_local(keel_cluster_backend *w, int p);

/* KEEL_EABORTED for a reply r of ps p from another generation than the one
 * this task knows: the ps restarted. */
keel_status keel__worker_restarted(const keel_cluster_backend *w, int p,
                                   const keel__wire_msg *r);
/* The end of ps p's reply r to a step's request: when st is KEEL_OK, ps 0's
 * global step (the step's authority) into *new_step; r cleared. Returns st. */
keel_status keel__worker_end_reply(keel__wire_msg *r, int p, keel_status st,
                                   int64_t *new_step);
/* A failed call to ps p as a session status: timeouts and a restarted or
 * uninitialized ps are recoverable, a shut-down cluster ends the input. */
keel_status keel__worker_call_error(keel_cluster_backend *w, int p,
                                    keel_status st, const keel__wire_msg *r,
                                    const char *what);
/* Elastic sync: ps p's reply r tells this replica the membership (ps 0's
 * word, when it has one); the chief logs a change with the ps's note. */
void keel__worker_membership_take(keel_cluster_backend *w, int p,
                                  const keel__wire_msg *r);
/* Copy the tensors of a reply into vs (variables or "var/slot"). */
keel_status keel__worker_take_values(keel_vars *vs, const keel__wire_msg *r);
/* Names (and tensors, with_data) of ps p's variables (and slots,
 * with_slots) into w->outs; count in *n. */
void keel__worker_shard_outs(keel_cluster_backend *w, keel_vars *vs, int p,
                             int with_data, int with_slots, size_t *n);
/* One request h (with the n tensors outs; zero_copy: sent in place) to ps
 * p and its reply into *r, waited for like a step's push
 * (keel__worker_wait_reply); errors through keel__worker_call_error. With
 * dest, ps p's tensors there (and their slots, with dest_slots) are
 * faulted in while the reply is on its way. */
keel_status keel__worker_call_ps(keel_cluster_backend *w, int p,
                                 keel__wire_header *h,
                                 const keel__wire_out *outs, size_t n,
                                 int zero_copy, const char *what,
                                 keel_vars *dest, int dest_slots,
                                 keel__wire_msg *r);
/* Give up the request in flight to ps p: drop its connection (and the
 * queued frames) and fail with code and the message; KEEL_EIO when the
 * reconnect fails. */
keel_status keel__worker_abandon(keel_cluster_backend *w, int p,
                                 keel_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Wait for the reply to the request in flight to ps p while the ps lives
 * and stays the same incarnation, up to cluster.step_timeout_secs;
 * on_signal: a SIGTERM/SIGINT gives it up (KEEL_ECANCELLED). *r is
 * initialized either way (type 0 when abandoned). */
keel_status keel__worker_wait_reply(keel_cluster_backend *w, int p,
                                    const char *what, int on_signal,
                                    keel__wire_msg *r);

/* ---- HELLO, INIT and pulls (worker_pull.c) ------------------------------ */

/* Pull the n tensors named in w->outs from ps p into vs (n 0: a step
 * query); *global_step (if not NULL): ps p's step. */
keel_status keel__worker_pull_outs(keel_cluster_backend *w, int p, size_t n,
                                   keel_vars *vs, keel_vars *dest,
                                   int dest_slots, int64_t *global_step);
/* Every ps's variables (with_slots: and slots) into vs; ps 0's step. */
keel_status keel__worker_pull_all(keel_cluster_backend *w, keel_vars *vs,
                                  int with_slots);
/* keel_backend's publish, is_intact, fetch, read_global_step,
 * wait_for_change and before_save (ctx: the backend). */
keel_status keel__worker_publish(void *ctx, keel_vars *vs, int restored);
keel_status keel__worker_is_intact(void *ctx, keel_vars *vs, int *is_intact);
keel_status keel__worker_fetch(void *ctx, keel_vars *vs, int *is_ready,
                               char *why, size_t size);
keel_status keel__worker_read_step(void *ctx, int64_t *step);
keel_status keel__worker_wait(void *ctx, int64_t deadline_ns);
keel_status keel__worker_before_save(void *ctx, keel_vars *vs);

/* ---- sharded checkpoints (worker_save.c) ------------------------------- */

/* 1 when this chief's checkpoints are sharded (sharded_checkpoints with a
 * checkpoint_dir, ps in the cluster, no update rule keeping the chief's
 * own model). */
int keel__worker_sharded(const keel_cluster_backend *w);
/* The chief's INIT that names a checkpoint: when vs's global step is that
 * of a sharded checkpoint in checkpoint_dir (the one just restored), every
 * ps with todo[p] set is told to read its variables and slots from it
 * (all at once), and done[p] is set for each that did. A ps that answers
 * with an error (it cannot read it) is logged and left to the caller's
 * INIT with values; a lost or restarted ps fails the call. */
keel_status keel__worker_init_from_ckpt(keel_cluster_backend *w,
                                        keel_vars *vs,
                                        const unsigned char *todo,
                                        unsigned char *done);
/* keel_backend's save (ctx: the backend): sharded, every ps's shard of the
 * step in vs, then the index; else keel_saver_save. */
keel_status keel__worker_save(void *ctx, keel_saver *saver, keel_vars *vs,
                              const keel_ckpt_meta *meta, char *path,
                              size_t path_size);

/* ---- partitioned variables (worker_part.c) ----------------------------- */

/* w runs over part->wire (w->vs) for the caller's store user_vs: take
 * part (owned from here on, freed by keel__worker_part_free). */
keel_status keel__worker_part_take(keel_cluster_backend *w,
                                   keel__partition *part, keel_vars *user_vs);
void keel__worker_part_free(keel_cluster_backend *w);
/* The session backend's calls that see a store, over the parts. */
void keel__worker_part_backend(keel_cluster_backend *w, keel_backend *out);
/* keel_cluster_backend_set_micro's stores g (n of them, of user_vs). */
keel_status keel__worker_part_set_micro(keel_cluster_backend *w,
                                        keel_grads *const *g, int n);
/* After a pull into w->vs: the named variables (n; all with names NULL)
 * and, with with_slots, their slots into user_vs. */
void keel__worker_part_gather(keel_cluster_backend *w,
                              const char *const *names, size_t n,
                              int with_slots);

/* ---- gradient rows (worker_sparse.c) ---------------------------------- */

/* 1 when this backend pushes gradient rows as rows: the sync and async
 * gradient rules without micro-batches, partitions, per-worker rates,
 * reduce_leaves, elastic membership or chief_applies. */
int keel__worker_sparse_usable(const keel_cluster_backend *w);
/* Before a step's push: *sparse 1 when grads has rows (or w has row
 * variables, whose gradient is rows only) this backend pushes as rows;
 * else the rows of grads (and of the micro-batch stores) are added into
 * their dense gradients (*sparse 0). */
keel_status keel__worker_sparse_prepare(keel_cluster_backend *w,
                                        keel_grads *grads, int *sparse);
/* Variable i's rows in g (after prepare gave *sparse 1) as the two outs
 * of the wire (ids, then rows; views into g, unchanged until the push is
 * answered) into outs[0..2): returns 2, or 0 when it has no rows (then
 * its dense gradient is pushed). */
size_t keel__worker_sparse_outs(keel_cluster_backend *w, keel_vars *vs,
                                keel_grads *g, size_t i,
                                keel__wire_out *outs);

/* 1 when variable v is left out of a refresh of the values (with_slots
 * 0: a worker's fetch): a row variable, whose rows a step pulls. */
static inline int
keel__worker_sparse_skip(keel_var *v, int with_slots)
{
    return !with_slots && (keel_var_flags(v) & KEEL_VAR_ROWS);
}
/* Every row variable (KEEL_VAR_ROWS) of w->vs reads its rows from the ps
 * holding it (PULL_ROWS), until keel__worker_sparse_detach. */
void keel__worker_sparse_attach(keel_cluster_backend *w);
void keel__worker_sparse_detach(keel_cluster_backend *w);
/* After a pull of every ps's values into vs: its row variables, left out
 * (their rows are pulled by the steps), are marked initialized too. */
void keel__worker_sparse_pulled(keel_cluster_backend *w, keel_vars *vs);
/* A gathered checkpoint (not sharded) pulls every row variable whole into
 * the chief: KEEL_EINVAL naming the largest when the row variables with
 * their slots exceed KEEL__ROWS_GATHER_MAX bytes (sharded checkpoints
 * are then the way: each ps writes its own). */
#define KEEL__ROWS_GATHER_MAX ((uint64_t)1 << 30)
keel_status keel__worker_sparse_check_gather(const keel_cluster_backend *w);

/* ---- the step (worker_push.c) ------------------------------------------- */

/* keel_backend's updater (ctx: the backend): the step's push and token. */
keel_status keel__worker_apply(void *ctx, keel_vars *vs, keel_grads *grads,
                               int64_t global_step);

#endif
