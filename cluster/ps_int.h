/* ps_int.h - private to the parameter server's files of cluster/: the
 * server's state and the calls they share. ps.c (set-up, the serve loop,
 * the dispatch of each request, the end) uses ps_auth.c (who may send
 * what), ps_values.c (INIT and readiness, PULL, MIX) and ps_push.c (a
 * PUSH); ps_push.c uses ps_aggregate.c (a sync step's update and its
 * tokens); those use ps_members.c (membership, liveness, the push budget,
 * LEAVE); every one uses ps_request.c (a request's sender and tensors,
 * the replies); ps_shard.c (SAVE_SHARD) sits beside ps_values.c. No file
 * calls one above it. */
#ifndef KEEL_CLUSTER_PS_INT_H
#define KEEL_CLUSTER_PS_INT_H

#include <stddef.h>
#include <stdint.h>

#include "cluster_int.h"
#include "../numeric/numeric_int.h"

#define MAX_WAITERS 256
/* Per replica: pushes that do not make progress (a second push for a step
 * already held, a stale one, one refused over budget) are charged to a
 * budget of PUSH_BURST that regains one every PUSH_REFILL_MS and one at
 * each step the ps completes. A replica pushes once per step, so its own
 * pushes never run out of it; past it, pushes are refused unread. */
#define PUSH_BURST 16
#define PUSH_REFILL_MS 100

/* A variable's gradient rows in a PUSH (KEEL_WIRE_F_ROWS, ps_sparse.c):
 * n ids strictly ascending in [0, rows) and their n rows; ids and rows
 * point into the message's frames (valid while it is held). */
typedef struct keel__ps_rows {
    keel_var *v;
    size_t n;
    const int64_t *ids;
    const float *rows;
} keel__ps_rows;

/* A fresh gradient waiting for the rest of its step (sync). */
typedef struct pending_push {
    int used;
    keel__wire_msg msg;
    keel_var **vars;             /* msg.tensors[i] is vars[i]'s gradient;
                                  * then the n_rows variables of rows
                                  * (the values the ack carries) */
    keel__ps_rows *rows;         /* the push's gradient rows (owned) */
    size_t n_rows;
    keel__wire_push_metrics metrics; /* the replica's metric sums */
    int answered;                /* elastic follower: told "prepared"
                                  * (PUSH_ACK without values); the
                                  * replica's COMMIT gets the values */
} pending_push;

/* A HELLO waiting for readiness (answered when INIT arrives). */
typedef struct hello_waiter {
    zmq_msg_t identity;
    uint64_t request_id;
    uint8_t sender_type;         /* the HELLO's sender */
    uint32_t sender_index;
} hello_waiter;

struct keel__ps {
    void *zctx;
    void *sock;
    keel__zap *zap;
    keel_vars *vars;
    keel__wire_limits limits;
    keel__wire_pin pin;          /* for variables added after start */
    keel__wire_pin *pins;        /* one per variable: replies in flight */
    size_t n_pins;
    uint64_t generation;
    int task_index;
    int is_shutdown;
    long served, rejected;
    unsigned char *seen;         /* per variable, for duplicate checks */
    size_t seen_size;
    char endpoint[KEEL_ADDR_MAX + 16];
    /* the real server (cfg->apply set) */
    keel_status (*apply)(void *ctx, keel_var *v, const keel_tensor *grad,
                         int64_t global_step);
    void *apply_ctx;
    /* the lazy update of a variable's gradient rows (keel__ps_config) */
    keel_status (*apply_rows)(void *ctx, keel_var *v, size_t n,
                              const int64_t *ids, const float *rows,
                              int64_t global_step);
    /* sync: a step's mean rows of one variable (ps_sparse.c) */
    int64_t *srows;
    float *srow_data;
    size_t srows_cap;
    /* without apply: PULL / PUSH / INIT / HELLO */
    keel_status (*serve)(void *ctx, keel__ps *ps, keel__wire_msg *req);
    void *serve_ctx;
    int sync, replicas_to_aggregate, total_replicas, has_chief;
    keel__algo_ps *rule;         /* NULL: apply every gradient */
    int is_ready;                /* INIT received */
    int chief_applies;           /* see keel__ps_config */
    int awaiting_commit;         /* AGGREGATE sent, COMMIT not yet in */
    int commit_fresh;            /* gradients of the step awaiting it */
    uint64_t chief_generation;
    size_t init_vars, init_slots; /* tensors of the INIT in progress */
    long applied, dropped;
    pending_push *pending;       /* sync: one per replica */
    keel_grads *acc;             /* sync: the sums */
    /* sync gradients (no ps rule), a push naming a variable twice: the
     * example-weighted sums, in double, variable k's at dacc + doff[k] */
    double *dacc;
    size_t *doff;
    /* weighted_mean's lists: variable k's gradients and their weights at
     * wsrc and wts + k * total_replicas, wcnt[k] of them */
    const float **wsrc;
    double *wts;
    int *wcnt;
    keel_var **all;              /* sync: every variable, in store order */
    unsigned char *have;         /* sync: which sums a step has */
    /* sync with reduce_leaves L: the tree nodes covering each replica's
     * leaves, replica r's at tnodes[tfirst[r] .. tfirst[r] + tcount[r]),
     * tk in all (left to right over [0, L)) */
    int64_t leaves;
    keel__tree_node *tnodes;
    int *tfirst, *tcount;
    int tk;
    const float **tparts;        /* per variable: its tk node sums */
    int *tcnt;                   /* per variable and replica: sums come */
    hello_waiter waiters[MAX_WAITERS];
    int n_waiters;
    /* liveness: when each replica was last heard from (monotonic ns) */
    int64_t started_ns;
    int64_t *last_heard;         /* per replica, n_slots */
    /* membership: n_slots replicas tracked (total_replicas; async: up to
     * KEEL__CLUSTER_MAX_REPLICAS, the ones that join later included) */
    int n_slots, n_members, dead_after_ms;
    /* no worker joins beyond the spec: sync, or a rule whose ps keeps
     * state per starting replica (keel_algorithm_admits_joiners) */
    int fixed;
    unsigned char *member;       /* heard from and not yet forgotten */
    int64_t pending_since_ns;    /* sync: first gradient of this step */
    int64_t last_stall_log_ns;
    /* sync step timing (keel__ps_log_timing), monotonic ns summed over
     * steps: idle (last reply sent to the step's first gradient), spread
     * (first to last replica's gradient), aggregate (sum, apply, replies) */
    long timed_steps;
    int64_t last_step_end_ns, idle_ns, spread_ns, aggregate_ns;
    /* peers' refused requests, logged rate-limited (keel__log_limit):
     * per refused request type; rejected requests; dropped messages;
     * refused pushes (held step, budget) */
    keel__log_limit lim_refused[KEEL_MSG_TYPE_END];
    keel__log_limit lim_rejected, lim_dropped, lim_push;
    keel__log_limit *lim_stale;  /* stale drops, per replica (n_slots) */
    long refused_pushes;         /* pushes refused: held step or budget */
    int *push_budget;            /* per replica (n_slots) */
    int64_t *push_budget_ns;     /* when it last regained one */
    /* elastic sync (ps_members.c): the live replicas of the step under
     * way (live[r], n_live of them; the tree plan is theirs, by
     * position) and their epoch. ps 0 decides them and tells them with
     * every reply; every other ps (a follower) takes them from the
     * membership word each push carries (carried[r]: the held push's),
     * adopting a newer epoch when a push brings one, and sets live[]
     * from the held pushes when the step is complete. The line naming
     * the last change, sent with the replies that first tell it
     * (note_due) */
    int elastic, n_live;
    uint32_t epoch;
    int prepared;                /* follower: the step's pushes make one
                                  * division (answered "prepared"); it is
                                  * applied at a replica's COMMIT, sent
                                  * once ps 0 applied the step */
    int64_t ready_ns;            /* the last INIT completed (monotonic) */
    int tcap;                    /* tnodes' capacity */
    unsigned char *live;
    uint64_t *carried;
    char note[256];
    int note_due;
    /* sync: a replica ended its session (LEAVE): why no step can complete
     * any more, the answer to every push from then on; "" while none */
    char job_end[512];
    const char *checkpoint_dir;  /* keel__ps_config's; NULL: none */
    const keel__ps_part *parts;  /* keel__ps_config's */
    size_t n_parts;
    /* the metrics of the PUSH being taken (keel__wire_take_push_metrics),
     * and the sync step's combination its tokens carry while
     * keel__ps_release_pending answers them (has_ack_metrics) */
    keel__wire_push_metrics push_metrics;
    keel__wire_metrics ack_metrics;
    int has_ack_metrics;
};

/* ---- a request's sender, its tensors, the replies (ps_request.c) ------- */

/* The training replica a request comes from (chief 0, worker i i+1, or
 * worker i i without a chief), or -1. Sync: the replicas of the spec the
 * ps started with; async: any up to n_slots (workers that join later). */
int keel__ps_replica_of(const keel__ps *ps, const keel__wire_header *h);
/* Replica r's name in messages: "chief" or "worker i". */
void keel__ps_replica_name(const keel__ps *ps, int r, char *buf,
                           size_t size);
/* The pushes held for the sync step under way. */
int keel__ps_pending_count(const keel__ps *ps);
/* *h for a reply of type (flags) to req (NULL: not a reply to a request):
 * this ps, its generation and global step. */
void keel__ps_reply_header(keel__ps *ps, const keel__wire_msg *req,
                           keel__wire_header *h, uint8_t type,
                           uint8_t flags);
/* Elastic sync: ps 0's membership word of a reply to req (0 when not
 * elastic, and from any other ps: ps 0 decides). */
uint64_t keel__ps_membership_word(keel__ps *ps, const keel__wire_msg *req);
/* Replica r's position among the live replicas (ascending index). */
int keel__ps_position(const keel__ps *ps, int r);
/* Elastic sync: the membership changes the chief was not told yet, for a
 * reply to req when it is the chief's (then they count as told), into
 * buf; "" otherwise. */
const char *keel__ps_take_note(keel__ps *ps, const keel__wire_msg *req,
                               char *buf, size_t size);
/* The reply to a request that carries no data back: done, with the global
 * step and the chief's generation (local_step). */
keel_status keel__ps_send_done(keel__ps *ps, keel__wire_msg *req,
                               uint8_t type);
/* An ERROR (code, text) to req's sender; a failure to send is logged. */
void keel__ps_send_error(keel__ps *ps, keel__wire_msg *req, keel_status code,
                         const char *text);
/* A variable ("dense_1/kernel") or one of its slots ("dense_1/kernel/m"). */
keel_status keel__ps_resolve(keel__ps *ps, const keel__wire_tensor *wt,
                             int want_shape, keel_var **vout,
                             keel_tensor **tout);
/* The n vars free to change: each buffer (value, slots) that earlier
 * replies in flight still carry is handed over to its pin, a copy taking
 * its place, so a reply queued to a reader that does not read (a frozen
 * worker) holds neither the variable nor the step. Only where no copy can
 * be made are those replies waited for, within one deadline;
 * KEEL_EUNAVAILABLE past it. */
keel_status keel__ps_wait_pins(keel__ps *ps, keel_var *const *vars,
                               size_t n);
/* The update rule's record of what replica req's sender now holds: the
 * variables among outs (not their slots). */
void keel__ps_rule_pulled(keel__ps *ps, const keel__wire_msg *req,
                          const keel__wire_out *outs, size_t n);
/* How many of a replica's steps a PUSH covers (its header's global_step;
 * 0 from a client that does not say: 1). */
keel_status keel__ps_covered_of(const keel__wire_msg *req, int64_t *out);
/* Every tensor of req resolved (with its shape) into *vars_out and
 * *ts_out (caller frees both), state_only: non-trainable variables only
 * (no weights, no slots); then their pins waited for. On failure nothing
 * is allocated. */
keel_status keel__ps_resolve_all(keel__ps *ps, const keel__wire_msg *req,
                                 const char *what, int state_only,
                                 keel_var ***vars_out, keel_tensor ***ts_out);
/* The PUSH_ACK to req: the global step, the chief's generation and, when
 * req wants them, the values of its n vars (zero-copy, pinned). */
keel_status keel__ps_send_ack(keel__ps *ps, keel__wire_msg *req,
                              keel_var *const *vars, size_t n);
/* Answer (and forget) every pending push with an ERROR. */
void keel__ps_fail_pending(keel__ps *ps, keel_status code, const char *why);
/* Answer and forget every held push of the step: with the new values
 * (its sync token) after st == KEEL_OK, else with st's error. */
void keel__ps_release_pending(keel__ps *ps, keel_status st);

/* ---- membership, liveness, push budget (ps_members.c) ------------------ */

/* The replicas tracked for liveness (a replica not heard from yet counts
 * from now) and membership: the spec's (sync, or a rule that admits no
 * joiners), else up to KEEL__CLUSTER_MAX_REPLICAS. */
keel_status keel__ps_alloc_members(keel__ps *ps);
/* "applied=A dropped=D ready=R step=S", " refused=P" once pushes were
 * refused (a step already held, over budget) and, while a sync step is
 * partly filled, " waiting=K/N missing=worker 1 (silent 2.5 s),...". */
void keel__ps_status_text(const keel__ps *ps, char *buf, size_t size);
/* Why a worker beyond the spec is refused ("" when one may join). */
const char *keel__ps_fixed_why(const keel__ps *ps);
/* A replica was heard from: it joins when it was not a member. */
void keel__ps_member_heard(keel__ps *ps, int r, int64_t now);
/* Take one from replica r's budget of pushes that make no progress, after
 * regaining what time gave it; 0 when it is empty. */
int keel__ps_push_budget_take(keel__ps *ps, int r);
/* A sync step completed: every replica regains one (a backup worker's
 * stale push each step costs it nothing in the end). */
void keel__ps_push_budget_step(keel__ps *ps);
/* Elastic sync: the tree plan of the live replicas (live replica p of M
 * covers leaves [p*L/M, (p+1)*L/M)), into tnodes, tfirst, tcount, tk. */
keel_status keel__ps_members_plan(keel__ps *ps);
/* Elastic sync, a step boundary (the step's update applied, its held
 * pushes not answered yet): admit the replicas heard from that are not
 * live (at most leaves of them in all). */
void keel__ps_members_boundary(keel__ps *ps);
/* Elastic sync, a PUSH of replica r: its membership word taken off req
 * (a push without one, or one at a ps that is not elastic, is refused).
 * ps 0: refused (answered with KEEL_EABORTED, 1 returned) unless the word
 * is the current epoch's for r: its gradients cover leaves of another
 * division. Another ps: a word of an older epoch than the step's is
 * refused so; a newer one is adopted (the held pushes, of the older
 * division, are answered KEEL_EABORTED). */
int keel__ps_members_push_refused(keel__ps *ps, keel__wire_msg *req, int r);
/* Elastic sync, a ps other than ps 0 whose step has n_live pushes: the
 * live replicas are their senders; KEEL_EABORTED (the held pushes
 * answered so) when their positions do not make one division, else the
 * plan. */
keel_status keel__ps_members_follow(keel__ps *ps);
/* Elastic sync, a follower whose step is complete (members_follow):
 * every held push is answered "prepared" (a PUSH_ACK without values);
 * the step is applied at a replica's COMMIT (keel__ps_real_commit). */
void keel__ps_members_prepare(keel__ps *ps);
/* Whether ps decides the membership (elastic sync, ps 0). */
#define KEEL__PS_DECIDES(ps) ((ps)->elastic && (ps)->task_index == 0)
/* Whether ps follows ps 0's decisions (elastic sync, another ps). */
#define KEEL__PS_FOLLOWS(ps) ((ps)->elastic && (ps)->task_index != 0)
/* LEAVE: a replica's session ended by itself at the step in the header;
 * a sync job ends there, async forgets the replica (see the definition). */
keel_status keel__ps_real_leave(keel__ps *ps, keel__wire_msg *req);

/* ---- a sync step's update (ps_aggregate.c) ----------------------------- */

/* The tree nodes covering each replica's leaves of L. */
keel_status keel__ps_tree_plan(keel__ps *ps, int64_t L);
/* The real server's sync tables, once: a sync step allocates nothing. */
keel_status keel__ps_alloc_aggregation(keel__ps *ps);
/* The chief's COMMIT of the step awaiting it: take the new values of the
 * variables and slots it names (checked first: a bad COMMIT changes
 * nothing), step + 1, answer every held push with the new values (their
 * sync token) and the COMMIT with the new step. */
keel_status keel__ps_real_commit(keel__ps *ps, keel__wire_msg *req);
/* Sync: aggregate once enough replicas pushed (with the chief's push when
 * it applies), timing the step. */
keel_status keel__ps_aggregate_when_complete(keel__ps *ps);

/* ---- a PUSH (ps_push.c) ------------------------------------------------- */

/* PUSH: checked; async applied as it comes, sync held as the replica's
 * token until its step is complete. */
keel_status keel__ps_real_push(keel__ps *ps, keel__wire_msg *req);

/* ---- who may send what (ps_auth.c) -------------------------------------- */

/* The refusals counted but not logged yet, one line per kind. */
void keel__ps_log_held(keel__ps *ps);
/* Who sent req: the task its connection authenticated as (the ZAP
 * handler's User-Id), or, without authentication, what its header says;
 * then whether that task may send it. A refusal is logged rate-limited per
 * request type (the first at once, then one line per interval with the
 * count between), the peer's address and name escaped (*logged set: the
 * caller logs nothing more). */
keel_status keel__ps_authorize(keel__ps *ps, const keel__wire_msg *req,
                               int *logged);

/* ---- this ps's shard of a sharded checkpoint (ps_shard.c) --------------- */

/* SAVE_SHARD: this ps's variables and slots written durably as shard
 * task_index of the sharded checkpoint of the header's step, answered
 * after the write (nothing else is served meanwhile, so the shard holds
 * whole steps only). */
keel_status keel__ps_real_save_shard(keel__ps *ps, keel__wire_msg *req);
/* INIT from a checkpoint (names only: one name, a checkpoint file of this
 * ps's checkpoint directory; global_step and peer_generation: the step and
 * run id it must have): every variable and slot this ps holds read from
 * it by name, whichever shard holds it, nothing through the chief; a
 * part of a partitioned variable (ps->parts) as its rows of the whole
 * variable and of each of its slots. Counted in init_vars and init_slots; the caller completes the INIT. */
keel_status keel__ps_read_checkpoint(keel__ps *ps, const keel__wire_msg *req);

/* ---- INIT and readiness, PULL, MIX (ps_values.c) ------------------------ */

/* PULL: the named variables and slots (all variables without names). */
keel_status keel__ps_real_pull(keel__ps *ps, keel__wire_msg *req);
/* Answer (and forget) the HELLOs waiting for readiness with READY. */
void keel__ps_answer_waiters(keel__ps *ps);
/* INIT: the chief's values (and slots), in parts; ready after the last. */
keel_status keel__ps_real_init(keel__ps *ps, keel__wire_msg *req);
/* MIX: a moving average (or assignment) of non-trainable variables. */
keel_status keel__ps_real_mix(keel__ps *ps, keel__wire_msg *req);
/* HELLO: READY with the status text, or (arg 1, not ready yet) held until
 * the INIT comes. */
keel_status keel__ps_real_hello(keel__ps *ps, keel__wire_msg *req);

/* ---- gradient rows (ps_sparse.c) -------------------------------------- */

/* With KEEL_WIRE_F_ROWS: take req's rows pairs (KEEL__WIRE_IDS_NAME, then
 * the rows of a trainable variable) out of req, every one checked before
 * any is kept (KEEL_EINVAL naming replica and the variable: an id out of
 * range, ids not strictly ascending, more ids than rows, a row shape or
 * a variable named twice); req keeps its dense gradients, in order.
 * *out (owned by the caller, free()) and *n_out: the rows; NULL and 0
 * without the flag. */
keel_status keel__ps_sparse_take(keel__ps *ps, keel__wire_msg *req,
                                 int replica, keel__ps_rows **out,
                                 size_t *n_out);
/* KEEL_EINVAL when a variable of rs is also among the n_dense vars. */
keel_status keel__ps_sparse_check_dense(keel__ps *ps, const keel__ps_rows *rs,
                                        size_t n, keel_var *const *vars,
                                        size_t n_dense);
/* Async: apply the rows rs[0..n) lazily at step. */
keel_status keel__ps_sparse_apply(keel__ps *ps, const keel__ps_rows *rs,
                                  size_t n, int64_t step);
/* Sync, after the dense sums (ps->have marks them): every variable the
 * held pushes sent as rows gets the example-weighted mean over the union
 * of their ids (the dense path's bits for those rows), applied lazily at
 * step; a variable also sent dense in the step is KEEL_EINVAL. */
keel_status keel__ps_sparse_aggregate(keel__ps *ps, int64_t step);
/* PULL_ROWS: the requested rows of row variables (KEEL_VAR_ROWS), each
 * request tensor checked (a row variable, distinct ascending ids in
 * range) before anything is sent. */
keel_status keel__ps_real_pull_rows(keel__ps *ps, keel__wire_msg *req);

#endif
