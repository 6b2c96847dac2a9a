/* ps.c - the parameter server: a ROUTER socket bound to one address
 * serving PULL / PUSH / INIT / STEP / HELLO / HEARTBEAT / SHUTDOWN on a
 * keel_vars store. PUSH applies gradients with the job's optimizer (async,
 * or SyncReplicas aggregation with held pushes as tokens); slots travel on
 * the wire. A server without an optimizer hands PULL / PUSH / INIT / HELLO
 * to the config's serve function (tests and benchmarks: tests/ps_skel.c).
 * A malformed or wrong request gets an ERROR reply naming the problem and
 * the server goes on serving everyone else. */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <keel/hooks.h>
#include "cluster_int.h"
#include "defaults.h"
#include "../numeric/numeric_int.h"

#define PIN_WAIT_MS 5000
#define MAX_WAITERS 256
#define PS_RCVHWM 64
/* Per replica: pushes that do not make progress (a second push for a step
 * already held, a stale one, one refused over budget) are charged to a
 * budget of PUSH_BURST that regains one every PUSH_REFILL_MS and one at
 * each step the ps completes. A replica pushes once per step, so its own
 * pushes never run out of it; past it, pushes are refused unread. */
#define PUSH_BURST 16
#define PUSH_REFILL_MS 100

static keel_status check_init_step(const keel__wire_msg *req);
static void push_budget_step(keel__ps *ps);

/* A fresh gradient waiting for the rest of its step (sync). */
typedef struct pending_push {
    int used;
    keel__wire_msg msg;
    keel_var **vars;             /* msg.tensors[i] is vars[i]'s gradient */
} pending_push;

/* A HELLO waiting for readiness (answered when INIT arrives). */
typedef struct hello_waiter {
    zmq_msg_t identity;
    uint64_t request_id;
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
    /* sync gradients (no ps rule): the example-weighted sums, in double,
     * variable k's at dacc + doff[k] */
    double *dacc;
    size_t *doff;
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
    long refused_pushes;         /* pushes refused: held step or budget */
    int *push_budget;            /* per replica (n_slots) */
    int64_t *push_budget_ns;     /* when it last regained one */
    /* sync: a replica ended its session (LEAVE): why no step can complete
     * any more, the answer to every push from then on; "" while none */
    char job_end[512];
};

/* The tree nodes covering each replica's leaves of L. */
static keel_status
tree_plan(keel__ps *ps, int64_t L)
{
    int R = ps->total_replicas, cap = R * (2 * KEEL__TREE_MAX_DEPTH);
    size_t nv = keel_vars_count(ps->vars);
    if (L % R != 0 || L > (int64_t)1 << 40)
        return keel__fail(KEEL_EINVAL, "ps %d: reduce_leaves %lld is not a "
                          "multiple of the %d replicas up to 2^40",
                          ps->task_index, (long long)L, R);
    ps->tnodes = calloc((size_t)cap, sizeof *ps->tnodes);
    ps->tfirst = calloc((size_t)R, sizeof *ps->tfirst);
    ps->tcount = calloc((size_t)R, sizeof *ps->tcount);
    if (ps->tnodes == NULL || ps->tfirst == NULL || ps->tcount == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: reduction plan");
    for (int r = 0; r < R; r++) {
        int k = keel__tree_cover(L, r * (L / R), (r + 1) * (L / R),
                                 ps->tnodes + ps->tk, cap - ps->tk);
        if (k < 1)
            return keel__fail(KEEL_EINTERNAL, "ps: cover of replica %d", r);
        ps->tfirst[r] = ps->tk;
        ps->tcount[r] = k;
        ps->tk += k;
    }
    /* tree_aggregate's tables, once for the ps's fixed variables: a step
     * allocates nothing */
    ps->tparts = calloc(nv * (size_t)ps->tk + 1, sizeof *ps->tparts);
    ps->tcnt = calloc(nv * (size_t)R + 1, sizeof *ps->tcnt);
    if (ps->tparts == NULL || ps->tcnt == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: reduction tables of %zu "
                          "variables", nv);
    ps->leaves = L;
    return KEEL_OK;
}

/* One pin per variable of the store (replies in flight). */
static keel_status
alloc_pins(keel__ps *ps)
{
    keel__wire_pin_init(&ps->pin);
    size_t n = keel_vars_count(ps->vars);
    ps->pins = calloc(n ? n : 1, sizeof *ps->pins);
    if (ps->pins == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %zu pins", n);
    ps->n_pins = n;
    for (size_t i = 0; i < ps->n_pins; i++)
        keel__wire_pin_init(&ps->pins[i]);
    return KEEL_OK;
}

/* cfg's settings into ps, with their defaults, checked together. */
static keel_status
take_config(keel__ps *ps, const keel__ps_config *cfg)
{
    ps->limits = cfg->limits;
    keel__wire_limits_default(&ps->limits);
    ps->task_index = cfg->task_index;
    ps->generation = keel__wire_new_generation();
    ps->apply = cfg->apply;
    ps->apply_ctx = cfg->apply_ctx;
    ps->serve = cfg->serve;
    ps->serve_ctx = cfg->serve_ctx;
    ps->sync = cfg->sync;
    ps->rule = cfg->rule;
    ps->total_replicas = cfg->total_replicas > 0 ? cfg->total_replicas : 1;
    ps->replicas_to_aggregate = cfg->replicas_to_aggregate > 0
        ? cfg->replicas_to_aggregate : ps->total_replicas;
    ps->has_chief = cfg->has_chief;
    ps->chief_applies = cfg->chief_applies;
    ps->dead_after_ms = cfg->dead_after_ms;
    if (ps->chief_applies && !ps->sync)
        return keel__fail(KEEL_EINVAL, "ps %d: the chief applies updates "
                          "only in sync mode (SyncReplicas)", cfg->task_index);
    if (ps->replicas_to_aggregate > ps->total_replicas)
        return keel__fail(KEEL_EINVAL, "ps %d: replicas_to_aggregate %d is "
                          "more than the %d replicas (no sync step could "
                          "complete)", cfg->task_index,
                          ps->replicas_to_aggregate, ps->total_replicas);
    return KEEL_OK;
}

/* The replicas tracked for liveness (a replica not heard from yet counts
 * from now) and membership: the spec's (sync, or a rule that admits no
 * joiners), else up to KEEL__CLUSTER_MAX_REPLICAS. */
static keel_status
alloc_members(keel__ps *ps)
{
    ps->started_ns = keel__now_mono_ns();
    ps->fixed = ps->sync || (ps->rule != NULL &&
                             !keel_algorithm_admits_joiners(ps->rule->a->c.name));
    ps->n_slots = ps->fixed || ps->total_replicas > KEEL__CLUSTER_MAX_REPLICAS
        ? ps->total_replicas : KEEL__CLUSTER_MAX_REPLICAS;
    ps->last_heard = calloc((size_t)ps->n_slots, sizeof *ps->last_heard);
    ps->member = calloc((size_t)ps->n_slots, 1);
    ps->push_budget = calloc((size_t)ps->n_slots, sizeof *ps->push_budget);
    ps->push_budget_ns = calloc((size_t)ps->n_slots,
                                sizeof *ps->push_budget_ns);
    if (ps->last_heard == NULL || ps->member == NULL ||
        ps->push_budget == NULL || ps->push_budget_ns == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %d replicas", ps->total_replicas);
    for (int r = 0; r < ps->n_slots; r++) {
        ps->push_budget[r] = PUSH_BURST;
        ps->push_budget_ns[r] = ps->started_ns;
    }
    return KEEL_OK;
}

/* weighted_mean's double sums, one per trainable float of the store (a
 * rule's ps sums its commits and an async ps applies each push: neither
 * needs them). */
static keel_status
alloc_weighted(keel__ps *ps)
{
    size_t nv = keel_vars_count(ps->vars), total = 0;
    if (ps->rule != NULL || !ps->sync)
        return KEEL_OK;
    ps->doff = calloc(nv ? nv : 1, sizeof *ps->doff);
    if (ps->doff == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: aggregation of %zu variables",
                          nv);
    for (size_t k = 0; k < nv; k++) {
        keel_tensor *t = keel_grads_at(ps->acc, k);
        ps->doff[k] = total;
        total += t != NULL ? t->count : 0;
    }
    ps->dacc = malloc((total ? total : 1) * sizeof *ps->dacc);
    if (ps->dacc == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: weighted sums of %zu floats",
                          total);
    return KEEL_OK;
}

/* The real server's sync tables, once: a sync step allocates nothing. */
static keel_status
alloc_aggregation(keel__ps *ps)
{
    keel_status st;
    ps->pending = calloc((size_t)ps->total_replicas, sizeof *ps->pending);
    if (ps->pending == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %d pending pushes",
                          ps->total_replicas);
    for (int i = 0; i < ps->total_replicas; i++)
        keel__wire_msg_init(&ps->pending[i].msg);
    if ((st = keel_grads_new(ps->vars, &ps->acc)) != KEEL_OK)
        return st;
    ps->all = calloc(ps->n_pins ? ps->n_pins : 1, sizeof *ps->all);
    ps->have = calloc(ps->n_pins ? ps->n_pins : 1, 1);
    if (ps->all == NULL || ps->have == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: aggregation of %zu variables",
                          ps->n_pins);
    for (size_t k = 0; k < ps->n_pins; k++)
        ps->all[k] = keel_vars_at(ps->vars, k);
    return alloc_weighted(ps);
}

/* The ROUTER socket, its authentication (ZAP) and limits, bound to
 * cfg->bind; the address it got into ps->endpoint. */
static keel_status
open_socket(keel__ps *ps, const keel__ps_config *cfg)
{
    size_t len = sizeof ps->endpoint;
    /* Held messages: at most PS_RCVHWM whole messages per connection wait
     * in libzmq (past that it stops reading the connection: the sender
     * waits, nothing is lost), each within limits. */
    int hwm = PS_RCVHWM;
    char who[32];
    keel_status st;
    ps->zctx = zmq_ctx_new();
    if (ps->zctx == NULL)
        return keel__fail(KEEL_EIO, "ps: zmq_ctx_new: %s",
                          zmq_strerror(errno));
    if (keel__auth_on(cfg->curve) &&
        (st = keel__zap_start(ps->zctx, cfg->curve, &ps->zap)) != KEEL_OK)
        return st;
    ps->sock = zmq_socket(ps->zctx, ZMQ_ROUTER);
    if (ps->sock == NULL)
        return keel__fail(KEEL_EIO, "ps: socket: %s", zmq_strerror(errno));
    if ((st = keel__wire_sockopts(ps->sock, &ps->limits)) != KEEL_OK ||
        (st = keel__curve_setup_server(ps->sock, cfg->curve)) != KEEL_OK)
        return st;
    if (zmq_setsockopt(ps->sock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0)
        return keel__fail(KEEL_EIO, "ps: receive limit: %s",
                          zmq_strerror(errno));
    snprintf(who, sizeof who, "ps %d", cfg->task_index);
    if ((st = keel__cluster_zmq_bind(ps->sock, cfg->bind, who)) != KEEL_OK)
        return st;
    if (zmq_getsockopt(ps->sock, ZMQ_LAST_ENDPOINT, ps->endpoint, &len) != 0)
        return keel__fail(KEEL_EIO, "ps: last endpoint: %s",
                          zmq_strerror(errno));
    return KEEL_OK;
}

keel_status
keel__ps_new(const keel__ps_config *cfg, keel__ps **out)
{
    keel__ps *ps;
    keel_status st;
    *out = NULL;
    if (cfg == NULL || cfg->bind == NULL || cfg->vars == NULL)
        return keel__fail(KEEL_EINVAL, "ps: bind address and vars needed");
    if (cfg->apply == NULL && cfg->serve == NULL)
        return keel__fail(KEEL_EINVAL, "ps: an optimizer (apply) or a serve "
                          "function needed");
    ps = calloc(1, sizeof *ps);
    if (ps == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %zu bytes", sizeof *ps);
    ps->vars = cfg->vars;
    st = alloc_pins(ps);
    if (st == KEEL_OK)
        st = take_config(ps, cfg);
    if (st == KEEL_OK && cfg->reduce_leaves > 0)
        st = tree_plan(ps, cfg->reduce_leaves);
    if (st == KEEL_OK)
        st = alloc_members(ps);
    if (st == KEEL_OK && ps->apply != NULL)
        st = alloc_aggregation(ps);
    if (st == KEEL_OK)
        st = open_socket(ps, cfg);
    if (st != KEEL_OK) {
        keel__ps_free(ps);
        return st;
    }
    keel__log(KEEL_LOG_INFO, "ps %d: serving %zu variables on %s%s",
              ps->task_index, keel_vars_count(ps->vars), ps->endpoint,
              ps->zap == NULL ? " (no authentication)"
              : cfg->curve->enabled ? " (CURVE)" : " (token)");
    *out = ps;
    return KEEL_OK;
}

/* The refusals counted but not logged yet, one line per kind. */
static void
log_held(keel__ps *ps)
{
    long n = 0;
    for (int t = 0; t < KEEL_MSG_TYPE_END; t++)
        n += keel__log_limit_flush(&ps->lim_refused[t]);
    n += keel__log_limit_flush(&ps->lim_rejected);
    n += keel__log_limit_flush(&ps->lim_dropped);
    n += keel__log_limit_flush(&ps->lim_push);
    if (n > 0)
        keel__log(KEEL_LOG_WARN, "ps %d: %ld more refused or dropped "
                  "requests since the last such lines (%ld pushes refused "
                  "in all)", ps->task_index, n, ps->refused_pushes);
}

void
keel__ps_free(keel__ps *ps)
{
    if (ps == NULL)
        return;
    /* The ROUTER first (linger 0: its connections go, pinned frames are
     * released), while the ZAP handler still answers the handshakes under
     * way; the context's end then stops the handler, which closes its
     * socket so that zmq_ctx_term returns; then its thread is joined. */
    if (ps->sock != NULL)
        zmq_close(ps->sock);
    if (ps->zctx != NULL)
        zmq_ctx_term(ps->zctx);
    keel__zap_stop(ps->zap);
    log_held(ps);
    for (int i = 0; ps->pending != NULL && i < ps->total_replicas; i++) {
        keel__wire_msg_clear(&ps->pending[i].msg);
        free(ps->pending[i].vars);
    }
    free(ps->pending);
    free(ps->tnodes);
    free(ps->tfirst);
    free(ps->tcount);
    free(ps->tparts);
    free(ps->tcnt);
    free(ps->all);
    free(ps->have);
    keel_grads_free(ps->acc);
    free(ps->dacc);
    free(ps->doff);
    for (int i = 0; i < ps->n_waiters; i++)
        zmq_msg_close(&ps->waiters[i].identity);
    keel__wire_pin_destroy(&ps->pin);
    for (size_t i = 0; i < ps->n_pins; i++)
        keel__wire_pin_destroy(&ps->pins[i]);
    free(ps->pins);
    free(ps->seen);
    free(ps->last_heard);
    free(ps->member);
    free(ps->push_budget);
    free(ps->push_budget_ns);
    free(ps);
}

const char *
keel__ps_endpoint(const keel__ps *ps)
{
    return ps->endpoint;
}

long
keel__ps_served(const keel__ps *ps)
{
    return ps->served;
}

long
keel__ps_rejected(const keel__ps *ps)
{
    return ps->rejected;
}

long
keel__ps_applied(const keel__ps *ps)
{
    return ps->applied;
}

long
keel__ps_dropped(const keel__ps *ps)
{
    return ps->dropped;
}

/* The pin of a variable's in-flight replies. */
static keel__wire_pin *
pin_of(keel__ps *ps, const keel_var *v)
{
    size_t i = keel_var_index(v);
    return i < ps->n_pins ? &ps->pins[i] : &ps->pin;
}

/* The training replica a request comes from (chief 0, worker i i+1, or
 * worker i i without a chief), or -1. Sync: the replicas of the spec the
 * ps started with; async: any up to n_slots (workers that join later). */
static int
replica_of(const keel__ps *ps, const keel__wire_header *h)
{
    int r = -1;
    if (h->sender_type == KEEL_TASK_CHIEF)
        r = 0;
    else if (h->sender_type == KEEL_TASK_WORKER &&
             h->sender_index < (uint32_t)ps->n_slots)
        r = (int)h->sender_index + ps->has_chief;
    return r >= 0 && r < ps->n_slots ? r : -1;
}

static void
replica_name(const keel__ps *ps, int r, char *buf, size_t size)
{
    if (ps->has_chief && r == 0)
        snprintf(buf, size, "chief");
    else
        snprintf(buf, size, "worker %d", r - ps->has_chief);
}

static int
pending_count(const keel__ps *ps)
{
    int k = 0;
    for (int r = 0; ps->pending != NULL && r < ps->total_replicas; r++)
        k += ps->pending[r].used;
    return k;
}

/* "applied=A dropped=D ready=R step=S", " refused=P" once pushes were
 * refused (a step already held, over budget) and, while a sync step is
 * partly filled, " waiting=K/N missing=worker 1 (silent 2.5 s),...". */
static void
status_text(const keel__ps *ps, char *buf, size_t size)
{
    size_t len;
    int k = pending_count(ps);
    int64_t now = keel__now_mono_ns();
    snprintf(buf, size, "applied=%ld dropped=%ld ready=%d step=%lld",
             ps->applied, ps->dropped, ps->is_ready,
             (long long)keel_vars_global_step(ps->vars));
    if (ps->refused_pushes > 0) {
        len = strlen(buf);
        snprintf(buf + len, size - len, " refused=%ld", ps->refused_pushes);
    }
    if (!ps->sync || k == 0)
        return;
    len = strlen(buf);
    snprintf(buf + len, size - len, " waiting=%.1fs have=%d/%d missing=",
             (double)(now - ps->pending_since_ns) / 1e9, k,
             ps->replicas_to_aggregate);
    for (int r = 0, first = 1; r < ps->total_replicas; r++) {
        char name[32];
        int64_t heard = ps->last_heard[r] ? ps->last_heard[r]
                                          : ps->started_ns;
        if (ps->pending[r].used)
            continue;
        replica_name(ps, r, name, sizeof name);
        len = strlen(buf);
        if (len + 1 >= size)
            break;
        snprintf(buf + len, size - len, "%s%s (silent %.1f s)",
                 first ? "" : ",", name, (double)(now - heard) / 1e9);
        first = 0;
    }
}

/* Why a worker beyond the spec is refused ("" when one may join). */
static const char *
fixed_why(const keel__ps *ps)
{
    if (!ps->fixed)
        return "";
    if (ps->sync)
        return "; sync mode keeps this fixed count: a worker joins a "
               "running job only in async mode";
    return "; this update rule keeps state per replica the job started "
           "with (dynsgd, adag): a worker joins a running job only under "
           "async, hogwild, downpour, downpour_easy, agn, aeasgd or "
           "aeamsgd";
}

/* A replica was heard from: it joins when it was not a member. */
static void
member_heard(keel__ps *ps, int r, int64_t now)
{
    char name[32];
    ps->last_heard[r] = now;
    if (ps->member[r])
        return;
    ps->member[r] = 1;
    ps->n_members++;
    replica_name(ps, r, name, sizeof name);
    keel__log(KEEL_LOG_INFO, "ps %d: %s joined%s; %d live replica%s",
              ps->task_index, name, r >= ps->total_replicas
              ? " (async: not in the cluster spec this ps started with; "
                "its pushes are applied)" : "",
              ps->n_members, ps->n_members == 1 ? "" : "s");
}

/* Forget the members silent for longer than the liveness deadline. */
static void
member_sweep(keel__ps *ps, int64_t now)
{
    int64_t dead = (int64_t)ps->dead_after_ms * 1000000;
    if (ps->dead_after_ms <= 0 || ps->n_members == 0)
        return;
    for (int r = 0; r < ps->n_slots; r++) {
        char name[32];
        if (!ps->member[r] || now - ps->last_heard[r] <= dead)
            continue;
        ps->member[r] = 0;
        ps->n_members--;
        replica_name(ps, r, name, sizeof name);
        keel__log(KEEL_LOG_INFO, "ps %d: %s left: silent %.1f s "
                  "(cluster.dead_after_ms = %d); forgotten, %d live "
                  "replica%s", ps->task_index, name,
                  (double)(now - ps->last_heard[r]) / 1e9,
                  ps->dead_after_ms, ps->n_members,
                  ps->n_members == 1 ? "" : "s");
    }
}

void
keel__ps_watch(keel__ps *ps, int stall_ms)
{
    int64_t now = keel__now_mono_ns();
    int64_t stall = (int64_t)stall_ms * 1000000;
    char text[512];
    member_sweep(ps, now);
    if (stall_ms <= 0 || !ps->sync || pending_count(ps) == 0 ||
        now - ps->pending_since_ns < stall ||
        now - ps->last_stall_log_ns < stall)
        return;
    ps->last_stall_log_ns = now;
    status_text(ps, text, sizeof text);
    keel__log(KEEL_LOG_WARN, "ps %d: sync step %lld is stalled: %s",
              ps->task_index, (long long)keel_vars_global_step(ps->vars),
              strstr(text, "waiting=") ? strstr(text, "waiting=") : text);
}

int64_t
keel__ps_chief_silent_ms(const keel__ps *ps)
{
    int64_t heard = ps->last_heard[0] ? ps->last_heard[0] : ps->started_ns;
    return (keel__now_mono_ns() - heard) / 1000000;
}

static void
reply_header(keel__ps *ps, const keel__wire_msg *req, keel__wire_header *h,
             uint8_t type, uint8_t flags)
{
    memset(h, 0, sizeof *h);
    h->type = type;
    h->flags = flags;
    h->request_id = req ? req->h.request_id : 0;
    h->sender_type = KEEL_TASK_PS;
    h->sender_index = (uint32_t)ps->task_index;
    h->generation = ps->generation;
    h->global_step = keel_vars_global_step(ps->vars);
}

/* The reply to a request that carries no data back: done, with the global
 * step and the chief's generation (local_step). */
static keel_status
send_done(keel__ps *ps, keel__wire_msg *req, uint8_t type)
{
    keel__wire_header h;
    reply_header(ps, req, &h, type, KEEL_WIRE_F_REPLY);
    h.local_step = (int64_t)ps->chief_generation;
    return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0, NULL,
                           NULL);
}

static void
send_error(keel__ps *ps, keel__wire_msg *req, keel_status code,
           const char *text)
{
    keel__wire_header h;
    reply_header(ps, req, &h, KEEL_MSG_ERROR, 0);
    h.arg = (uint32_t)code;
    if (keel__wire_send(ps->sock, &req->identity, &h, NULL, 0, text, NULL)
        != KEEL_OK)
        keel__log(KEEL_LOG_WARN, "ps %d: could not send error reply: %s",
                  ps->task_index, keel_last_error());
}

static keel_status
ensure_seen(keel__ps *ps)
{
    size_t n = keel_vars_count(ps->vars);
    if (ps->seen_size < n) {
        unsigned char *s = realloc(ps->seen, n);
        if (s == NULL)
            return keel__fail(KEEL_ENOMEM, "ps: %zu flags", n);
        ps->seen = s;
        ps->seen_size = n;
    }
    memset(ps->seen, 0, ps->seen_size);
    return KEEL_OK;
}

/* Every tensor of req names a distinct variable of the same shape. */
static keel_status
check_tensors(keel__ps *ps, const keel__wire_msg *req, keel_var **vars)
{
    keel_status st = ensure_seen(ps);
    if (st != KEEL_OK)
        return st;
    for (size_t i = 0; i < req->n; i++) {
        const keel__wire_tensor *wt = &req->tensors[i];
        keel_var *v = keel_vars_find(ps->vars, wt->name);
        keel_tensor *t;
        char a[96], b[96];
        if (v == NULL)
            return keel__fail(KEEL_ENOTFOUND, "no variable '%s' on ps %d",
                              wt->name, ps->task_index);
        if (ps->seen[keel_var_index(v)]++)
            return keel__fail(KEEL_ECORRUPT, "variable '%s' given twice",
                              wt->name);
        t = keel_var_tensor(v);
        if (vars != NULL &&
            !keel_shape_equal(t->ndim, t->shape, wt->t.ndim, wt->t.shape))
            return keel__fail(KEEL_EINVAL, "'%s' has shape %s on ps %d, "
                              "message has %s", wt->name,
                              keel_shape_format(a, sizeof a, t->ndim,
                                                t->shape),
                              ps->task_index,
                              keel_shape_format(b, sizeof b, wt->t.ndim,
                                                wt->t.shape));
        if (vars != NULL)
            vars[i] = v;
    }
    return KEEL_OK;
}

/* ---- for a serve function (a server without an optimizer) ------------- */

keel_vars *
keel__ps_vars(keel__ps *ps)
{
    return ps->vars;
}

keel__wire_pin *
keel__ps_pin(keel__ps *ps, const keel_var *v)
{
    return pin_of(ps, v);
}

keel_status
keel__ps_check_tensors(keel__ps *ps, const keel__wire_msg *req,
                       keel_var **vars)
{
    return check_tensors(ps, req, vars);
}

keel_status
keel__ps_reply(keel__ps *ps, keel__wire_msg *req, uint8_t type,
               uint8_t flags, const keel__wire_out *outs, size_t n)
{
    keel__wire_header h;
    reply_header(ps, req, &h, type, flags);
    return keel__wire_send(ps->sock, &req->identity, &h, outs, n, NULL,
                           NULL);
}

/* ---- the real server: slots on the wire, sync aggregation, readiness ---- */

/* A variable ("dense_1/kernel") or one of its slots ("dense_1/kernel/m"). */
static keel_status
resolve(keel__ps *ps, const keel__wire_tensor *wt, int want_shape,
        keel_var **vout, keel_tensor **tout)
{
    keel_var *v = keel_vars_find(ps->vars, wt->name);
    keel_tensor *t = NULL;
    char a[96], b[96];
    if (v != NULL) {
        t = keel_var_tensor(v);
    } else {
        char base[KEEL_NAME_MAX];
        const char *slash = strrchr(wt->name, '/');
        size_t n = slash ? (size_t)(slash - wt->name) : 0;
        if (slash != NULL && n < sizeof base) {
            memcpy(base, wt->name, n);
            base[n] = '\0';
            v = keel_vars_find(ps->vars, base);
            if (v != NULL)
                t = keel_var_slot(v, slash + 1);
        }
        if (t == NULL)
            return keel__fail(KEEL_ENOTFOUND, "no variable or slot '%s' on "
                              "ps %d", wt->name, ps->task_index);
    }
    if (want_shape &&
        !keel_shape_equal(t->ndim, t->shape, wt->t.ndim, wt->t.shape))
        return keel__fail(KEEL_EINVAL, "'%s' has shape %s on ps %d, message "
                          "has %s", wt->name,
                          keel_shape_format(a, sizeof a, t->ndim, t->shape),
                          ps->task_index,
                          keel_shape_format(b, sizeof b, wt->t.ndim,
                                            wt->t.shape));
    *vout = v;
    *tout = t;
    return KEEL_OK;
}

static keel_status
wait_pins(keel__ps *ps, keel_var *const *vars, size_t n)
{
    int64_t deadline = keel__now_mono_ns() + (int64_t)PIN_WAIT_MS * 1000000;
    for (size_t i = 0; i < n; i++) {
        int64_t left = deadline - keel__now_mono_ns();
        if (left < 0 ||
            keel__wire_pin_wait(pin_of(ps, vars[i]),
                                (int)(left / 1000000)) != KEEL_OK)
            return keel__fail(KEEL_EUNAVAILABLE, "ps %d busy: earlier "
                              "replies of '%s' not yet sent after %d ms",
                              ps->task_index, keel_var_name(vars[i]),
                              PIN_WAIT_MS);
    }
    return KEEL_OK;
}

/* The update rule's record of what replica req's sender now holds: the
 * variables among outs (not their slots). */
static void
rule_pulled(keel__ps *ps, const keel__wire_msg *req,
            const keel__wire_out *outs, size_t n)
{
    int replica = replica_of(ps, &req->h);
    if (replica < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        keel_var *v = keel_vars_find(ps->vars, outs[i].name);
        if (v != NULL && outs[i].t == keel_var_tensor(v))
            keel__algo_ps_pulled(ps->rule, v, replica);
    }
    keel__algo_ps_pulled_end(ps->rule, replica);
}

/* How many of a replica's steps a PUSH covers (its header's global_step;
 * 0 from a client that does not say: 1). */
static keel_status
covered_of(const keel__wire_msg *req, int64_t *out)
{
    int64_t c = req->h.global_step;
    if (c < 0 || c > KEEL__MAX_COVERED)
        return keel__fail(KEEL_EINVAL, "PUSH covering %lld steps (want "
                          "0..%d)", (long long)c, KEEL__MAX_COVERED);
    *out = c > 0 ? c : 1;
    return KEEL_OK;
}

static keel_status
real_pull(keel__ps *ps, keel__wire_msg *req)
{
    size_t n = req->n ? req->n : keel_vars_count(ps->vars);
    keel__wire_out *outs;
    keel__wire_header h;
    keel_status st = KEEL_OK;
    if (!ps->is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "ps %d holds no state yet "
                          "(waiting for the chief's INIT)", ps->task_index);
    if (!(req->h.flags & KEEL_WIRE_F_NAMES_ONLY) && req->n > 0)
        return keel__fail(KEEL_ECORRUPT, "PULL must carry names only");
    outs = calloc(n ? n : 1, sizeof *outs);
    if (outs == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: pull of %zu tensors", n);
    for (size_t i = 0; i < n && st == KEEL_OK; i++) {
        keel_var *v;
        keel_tensor *t;
        if (req->n) {
            st = resolve(ps, &req->tensors[i], 0, &v, &t);
            outs[i].name = req->tensors[i].name;
        } else {
            v = keel_vars_at(ps->vars, i);
            t = keel_var_tensor(v);
            outs[i].name = keel_var_name(v);
        }
        if (st == KEEL_OK) {
            outs[i].t = t;
            outs[i].pin = pin_of(ps, v);
        }
    }
    if (st == KEEL_OK && ps->rule != NULL)
        rule_pulled(ps, req, outs, n);
    if (st == KEEL_OK) {
        reply_header(ps, req, &h, KEEL_MSG_PULL_REPLY, 0);
        st = keel__wire_send(ps->sock, &req->identity, &h, outs, n, NULL,
                             NULL);
    }
    free(outs);
    return st;
}

static void
answer_waiters(keel__ps *ps)
{
    for (int i = 0; i < ps->n_waiters; i++) {
        keel__wire_header h;
        keel__wire_msg fake;
        keel__wire_msg_init(&fake);
        fake.h.request_id = ps->waiters[i].request_id;
        reply_header(ps, &fake, &h, KEEL_MSG_READY, 0);
        h.arg = (uint32_t)ps->is_ready;
        if (keel__wire_send(ps->sock, &ps->waiters[i].identity, &h, NULL, 0,
                            NULL, NULL) != KEEL_OK)
            keel__log(KEEL_LOG_WARN, "ps %d: readiness notice not sent: %s",
                      ps->task_index, keel_last_error());
        zmq_msg_close(&ps->waiters[i].identity);
        keel__wire_msg_clear(&fake);
    }
    ps->n_waiters = 0;
}

/* Answer (and forget) every pending push with an ERROR. */
static void
fail_pending(keel__ps *ps, keel_status code, const char *why)
{
    for (int r = 0; ps->pending != NULL && r < ps->total_replicas; r++) {
        pending_push *p = &ps->pending[r];
        if (!p->used)
            continue;
        send_error(ps, &p->msg, code, why);
        keel__wire_msg_clear(&p->msg);
        free(p->vars);
        p->vars = NULL;
        p->used = 0;
    }
    if (ps->awaiting_commit)
        keel__log(KEEL_LOG_WARN, "ps %d: step %lld abandoned before the "
                  "chief's commit: %s", ps->task_index,
                  (long long)keel_vars_global_step(ps->vars), why);
    ps->awaiting_commit = 0;
}

/* INIT's global step: 0..KEEL__MAX_GLOBAL_STEP (the step counter never
 * wraps, whatever a peer sends). */
static keel_status
check_init_step(const keel__wire_msg *req)
{
    if (req->h.global_step < 0 || req->h.global_step > KEEL__MAX_GLOBAL_STEP)
        return keel__fail(KEEL_EINVAL, "INIT with global step %lld (must be "
                          "0..%lld)", (long long)req->h.global_step,
                          (long long)KEEL__MAX_GLOBAL_STEP);
    return KEEL_OK;
}

/* Every tensor of req resolved (with its shape) into *vars_out and
 * *ts_out (caller frees both), state_only: non-trainable variables only
 * (no weights, no slots); then their pins waited for. On failure nothing
 * is allocated. */
static keel_status
resolve_all(keel__ps *ps, const keel__wire_msg *req, const char *what,
            int state_only, keel_var ***vars_out, keel_tensor ***ts_out)
{
    keel_var **vars = calloc(req->n ? req->n : 1, sizeof *vars);
    keel_tensor **ts = calloc(req->n ? req->n : 1, sizeof *ts);
    keel_status st = KEEL_OK;
    *vars_out = NULL;
    *ts_out = NULL;
    if (vars == NULL || ts == NULL) {
        free(vars);
        free(ts);
        return keel__fail(KEEL_ENOMEM, "ps: %s of %zu tensors", what,
                          req->n);
    }
    for (size_t i = 0; i < req->n && st == KEEL_OK; i++) {
        st = resolve(ps, &req->tensors[i], 1, &vars[i], &ts[i]);
        if (st == KEEL_OK && state_only &&
            (ts[i] != keel_var_tensor(vars[i]) ||
             keel_var_is_trainable(vars[i])))
            st = keel__fail(KEEL_EINVAL, "%s into '%s': only non-trainable "
                            "variables (not weights, not slots)", what,
                            req->tensors[i].name);
    }
    if (st == KEEL_OK)
        st = wait_pins(ps, vars, req->n);
    if (st != KEEL_OK) {
        free(vars);
        free(ts);
        return st;
    }
    *vars_out = vars;
    *ts_out = ts;
    return KEEL_OK;
}

/* The last part of the chief's INIT came: the ps is ready at its step. */
static void
init_complete(keel__ps *ps, const keel__wire_msg *req)
{
    /* Pending gradients were computed on the state just replaced (a new
     * chief, or a rollback after another ps was lost). */
    fail_pending(ps, KEEL_EABORTED, "the chief (re)initialized this ps; "
                 "wait for readiness again");
    keel_vars_set_global_step(ps->vars, req->h.global_step);
    if (ps->rule != NULL) {
        /* every replica pulls again; the chief holds these values */
        int chief = replica_of(ps, &req->h);
        keel__algo_ps_reset(ps->rule);
        for (size_t k = 0; chief >= 0 && k < keel_vars_count(ps->vars); k++)
            keel__algo_ps_pulled(ps->rule, keel_vars_at(ps->vars, k), chief);
    }
    ps->chief_generation = req->h.generation;
    ps->is_ready = 1;
    /* the slot count shows a rule's state (and an optimizer's) came with
     * the chief's values, e.g. from its checkpoint */
    keel__log(KEEL_LOG_INFO, "ps %d: initialized by the chief (generation "
              "%016llx) at step %lld: %zu variables, %zu slot tensors",
              ps->task_index, (unsigned long long)req->h.generation,
              (long long)req->h.global_step, ps->init_vars, ps->init_slots);
    ps->init_vars = 0;
    ps->init_slots = 0;
}

static keel_status
real_init(keel__ps *ps, keel__wire_msg *req)
{
    keel_var **vars;
    keel_tensor **ts;
    keel_status st = KEEL_OK;
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY)
        return keel__fail(KEEL_ECORRUPT, "INIT without data");
    if ((st = check_init_step(req)) != KEEL_OK)
        return st;
    if (req->h.sender_type != KEEL_TASK_CHIEF &&
        !(req->h.sender_type == KEEL_TASK_WORKER && !ps->has_chief &&
          req->h.sender_index == 0))
        return keel__fail(KEEL_EINVAL, "INIT from %s %u: only the chief "
                          "initializes parameter servers",
                          keel_task_type_name((keel_task_type)
                                              req->h.sender_type),
                          req->h.sender_index);
    if ((st = resolve_all(ps, req, "INIT", 0, &vars, &ts)) != KEEL_OK)
        return st;
    for (size_t i = 0; i < req->n; i++) {
        memcpy(ts[i]->data, req->tensors[i].t.data,
               ts[i]->count * sizeof(float));
        if (ts[i] == keel_var_tensor(vars[i])) {
            keel_var_set_initialized(vars[i], 1);
            ps->init_vars++;
        } else {
            ps->init_slots++;
        }
    }
    if (req->h.arg == 0)                /* the last part: ready */
        init_complete(ps, req);
    st = send_done(ps, req, KEEL_MSG_INIT);
    if (ps->is_ready)
        answer_waiters(ps);
    free(vars);
    free(ts);
    return st;
}

static keel_status
send_ack(keel__ps *ps, keel__wire_msg *req, keel_var *const *vars, size_t n)
{
    keel__wire_header h;
    keel_status st;
    keel__wire_out *outs;
    reply_header(ps, req, &h, KEEL_MSG_PUSH_ACK, 0);
    h.local_step = (int64_t)ps->chief_generation;
    if (!(req->h.flags & KEEL_WIRE_F_WANT_VALUES))
        return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0, NULL,
                               NULL);
    outs = calloc(n ? n : 1, sizeof *outs);
    if (outs == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: values of %zu variables", n);
    for (size_t i = 0; i < n; i++) {
        outs[i].name = keel_var_name(vars[i]);
        outs[i].t = keel_var_tensor(vars[i]);
        outs[i].pin = pin_of(ps, vars[i]);
    }
    if (ps->rule != NULL)
        rule_pulled(ps, req, outs, n);
    st = keel__wire_send(ps->sock, &req->identity, &h, outs, n, NULL, NULL);
    free(outs);
    return st;
}

void
keel__ps_log_timing(const keel__ps *ps)
{
    double n = (double)ps->timed_steps;
    if (ps->timed_steps == 0)
        return;
    keel__log(KEEL_LOG_INFO, "ps %d: per sync step (%ld steps, ms): idle "
              "%.3f (replicas computing), spread %.3f (first to last "
              "replica's gradient), aggregate %.3f (sum, apply, replies)",
              ps->task_index, ps->timed_steps, (double)ps->idle_ns / n / 1e6,
              (double)ps->spread_ns / n / 1e6,
              (double)ps->aggregate_ns / n / 1e6);
}

/* sum * total / fresh, each element rounded once (double inside: the
 * product of a float and a small count is exact there). */
static void
mean_of_shares(keel_tensor *sum, int total, int fresh)
{
    double f = (double)total;
    for (size_t i = 0; i < sum->count; i++)
        sum->data[i] = (float)((double)sum->data[i] * f / (double)fresh);
}

/* Every replica pushed: add their node sums along the tree into the
 * sums (have[k] for each variable summed). Replica r's tensors of a
 * variable, in message order, are the sums of its nodes left to right. */
static keel_status
tree_aggregate(keel__ps *ps, unsigned char *have)
{
    size_t nv = keel_vars_count(ps->vars);
    size_t K = (size_t)ps->tk;
    const float **parts = ps->tparts;   /* read only where cnt is full */
    int *cnt = ps->tcnt;
    keel_status st = KEEL_OK;
    memset(cnt, 0, nv * (size_t)ps->total_replicas * sizeof *cnt);
    for (int r = 0; r < ps->total_replicas && st == KEEL_OK; r++) {
        pending_push *p = &ps->pending[r];
        for (size_t i = 0; i < p->msg.n; i++) {
            size_t k = keel_var_index(p->vars[i]);
            int *c = &cnt[k * (size_t)ps->total_replicas + (size_t)r];
            if (*c >= ps->tcount[r] || p->msg.tensors[i].t.count !=
                keel_grads_at(ps->acc, k)->count) {
                st = keel__fail(KEEL_EINVAL, "replica %d pushed more than "
                                "its %d node sums of '%s' (or a wrong "
                                "size): do all tasks use the same "
                                "reduce_leaves (%lld)?", r, ps->tcount[r],
                                keel_var_name(p->vars[i]),
                                (long long)ps->leaves);
                break;
            }
            parts[k * K + (size_t)(ps->tfirst[r] + *c)] =
                p->msg.tensors[i].t.data;
            (*c)++;
        }
    }
    for (size_t k = 0; k < nv && st == KEEL_OK; k++) {
        keel_tensor *acc = keel_grads_at(ps->acc, k);
        int any = 0, all = 1;
        for (int r = 0; r < ps->total_replicas; r++) {
            int c = cnt[k * (size_t)ps->total_replicas + (size_t)r];
            if (c != 0 && c != ps->tcount[r]) {
                st = keel__fail(KEEL_EINVAL, "replica %d pushed %d of its "
                                "%d node sums of '%s': do all tasks use "
                                "the same reduce_leaves (%lld)?", r, c,
                                ps->tcount[r],
                                keel_var_name(keel_vars_at(ps->vars, k)),
                                (long long)ps->leaves);
                break;
            }
            any |= c != 0;
            all &= c != 0;
        }
        if (st == KEEL_OK && any && !all)
            st = keel__fail(KEEL_EINVAL, "a replica pushed no gradient of "
                            "'%s' while others did",
                            keel_var_name(keel_vars_at(ps->vars, k)));
        if (st != KEEL_OK || !any)
            continue;
        st = keel__tree_sum(ps->leaves, ps->tnodes, parts + k * K, (int)K,
                            acc->data, 0, acc->count);
        have[k] = 1;
    }
    return st;
}

/* Answer and forget every held push of the step: with the new values
 * (its sync token) after st == KEEL_OK, else with st's error. */
static void
release_pending(keel__ps *ps, keel_status st)
{
    for (int r = 0; r < ps->total_replicas; r++) {
        pending_push *p = &ps->pending[r];
        if (!p->used)
            continue;
        if (st == KEEL_OK) {
            if (send_ack(ps, &p->msg, p->vars, p->msg.n) != KEEL_OK)
                keel__log(KEEL_LOG_WARN, "ps %d: token to replica %d not "
                          "sent: %s", ps->task_index, r, keel_last_error());
        } else {
            send_error(ps, &p->msg, KEEL_EINVAL, keel_last_error());
        }
        keel__wire_msg_clear(&p->msg);
        free(p->vars);
        p->vars = NULL;
        p->used = 0;
    }
}

/* Chief applies: the step's mean gradients (acc of the variables that
 * have one) to the chief's held push, which is then forgotten (the other
 * replicas' stay held until the COMMIT). Copied, not pinned: acc is
 * rewritten by the next step. */
static keel_status
send_aggregate(keel__ps *ps, keel_var *const *all, const unsigned char *have,
               size_t nv)
{
    pending_push *p = &ps->pending[0];
    keel__wire_header h;
    keel__wire_out *outs = calloc(nv ? nv : 1, sizeof *outs);
    size_t n = 0;
    keel_status st;
    if (outs == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: mean of %zu gradients", nv);
    for (size_t k = 0; k < nv; k++)
        if (have[k]) {
            outs[n].name = keel_var_name(all[k]);
            outs[n].t = keel_grads_at(ps->acc, k);
            n++;
        }
    reply_header(ps, &p->msg, &h, KEEL_MSG_AGGREGATE, 0);
    h.local_step = (int64_t)ps->chief_generation;
    st = keel__wire_send(ps->sock, &p->msg.identity, &h, outs, n, NULL,
                         NULL);
    free(outs);
    keel__wire_msg_clear(&p->msg);
    free(p->vars);
    p->vars = NULL;
    p->used = 0;
    return st;
}

/* The chief's COMMIT of the step awaiting it: take the new values of the
 * variables and slots it names (checked first: a bad COMMIT changes
 * nothing), step + 1, answer every held push with the new values (their
 * sync token) and the COMMIT with the new step. */
static keel_status
real_commit(keel__ps *ps, keel__wire_msg *req)
{
    int64_t step = keel_vars_global_step(ps->vars);
    keel_var **vars;
    keel_tensor **ts;
    keel_status st = KEEL_OK;
    if (!ps->awaiting_commit)
        return keel__fail(KEEL_ESTATE, "COMMIT at step %lld: no step of ps "
                          "%d awaits the chief's update", (long long)
                          req->h.global_step, ps->task_index);
    if (req->h.global_step != step)
        return keel__fail(KEEL_EINVAL, "COMMIT for step %lld, but ps %d is "
                          "at step %lld", (long long)req->h.global_step,
                          ps->task_index, (long long)step);
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY)
        return keel__fail(KEEL_ECORRUPT, "COMMIT without data");
    if ((st = resolve_all(ps, req, "COMMIT", 0, &vars, &ts)) != KEEL_OK)
        return st;
    {
        for (size_t i = 0; i < req->n; i++)
            memcpy(ts[i]->data, req->tensors[i].t.data,
                   ts[i]->count * sizeof(float));
        keel_vars_set_global_step(ps->vars, step + 1);
        ps->applied += ps->commit_fresh;
        push_budget_step(ps);
        ps->awaiting_commit = 0;
        release_pending(ps, KEEL_OK);
        st = send_done(ps, req, KEEL_MSG_COMMIT);
    }
    free(vars);
    free(ts);
    return st;
}

/* MIX: a moving average (or, with decay 0, an assignment) of
 * non-trainable variables by a replica (K-FAC's role-split factor
 * statistics and inverses). Everything is checked before anything
 * changes; answered with the global step. */
static keel_status
real_mix(keel__ps *ps, keel__wire_msg *req)
{
    keel_var **vars;
    keel_tensor **ts;
    keel_status st = KEEL_OK;
    float d;
    uint32_t bits = req->h.arg;
    memcpy(&d, &bits, sizeof d);
    if (!ps->is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "ps %d holds no state yet "
                          "(waiting for the chief's INIT)", ps->task_index);
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY)
        return keel__fail(KEEL_ECORRUPT, "MIX without data");
    if (!(d >= 0.0f && d < 1.0f))
        return keel__fail(KEEL_EINVAL, "MIX with decay %g (must be in [0, "
                          "1))", (double)d);
    if ((st = resolve_all(ps, req, "MIX", 1, &vars, &ts)) != KEEL_OK)
        return st;
    {
        for (size_t i = 0; i < req->n; i++) {
            float *x = ts[i]->data;
            const float *t = req->tensors[i].t.data;
            if (d == 0.0f)
                memcpy(x, t, ts[i]->count * sizeof(float));
            else
                for (size_t j = 0; j < ts[i]->count; j++)
                    x[j] = d * x[j] + (1.0f - d) * t[j];
        }
        st = send_done(ps, req, KEEL_MSG_MIX);
    }
    free(vars);
    free(ts);
    return st;
}

/* Sum the pending gradients into ps->acc in one pass per gradient: the
 * first one of a variable initializes its sum (no separate zeroing pass);
 * the order of the additions, and so every bit, is that of zero +
 * replica 0 + replica 1 + ... have[k] marks the variables summed; the
 * number of gradients summed is returned. */
static int
sum_pending(keel__ps *ps, unsigned char *have)
{
    int fresh = 0;
    for (int r = 0; r < ps->total_replicas; r++) {
        pending_push *p = &ps->pending[r];
        if (!p->used)
            continue;
        fresh++;
        for (size_t i = 0; i < p->msg.n; i++) {
            size_t k = keel_var_index(p->vars[i]);
            keel_tensor *acc = keel_grads_at(ps->acc, k);
            /* numeric/'s vectorized kernels: the first gradient as 0 + g */
            if (have[k])
                keel__add_into(acc->data, p->msg.tensors[i].t.data,
                               acc->count);
            else
                keel__zero_add_into(acc->data, p->msg.tensors[i].t.data,
                                    acc->count);
            have[k] = 1;
        }
    }
    return fresh;
}

/* The examples a held push's gradients are the mean over (0 on the wire:
 * one). */
static int64_t
examples_of(const pending_push *p)
{
    return p->msg.h.examples > 0 ? (int64_t)p->msg.h.examples : 1;
}

/* 1 in *pieces when every held push carries pieces of the step's mean
 * (KEEL_WIRE_F_PIECES: micro-batch stores, added as they are), 0 when none
 * does; KEEL_EINVAL when the replicas mix the two. */
static keel_status
pieces_of(const keel__ps *ps, int *pieces)
{
    int with = 0, without = 0;
    for (int r = 0; r < ps->total_replicas; r++)
        if (ps->pending[r].used) {
            if (ps->pending[r].msg.h.flags & KEEL_WIRE_F_PIECES)
                with++;
            else
                without++;
        }
    *pieces = with > 0;
    if (with > 0 && without > 0)
        return keel__fail(KEEL_EINVAL, "ps %d: %d replicas pushed "
                          "micro-batch pieces and %d their mean gradients "
                          "in one step (set micro-batches on every replica "
                          "or on none)", ps->task_index, with, without);
    return KEEL_OK;
}

/* Gradient rules: each fresh replica pushed the mean gradient over its own
 * examples (its micro-batch stores add up to it). acc becomes the mean
 * over every example aggregated: sum_r n_r g_r / sum_r n_r, accumulated
 * in double in ascending replica order (n_r g_r is exact there) and
 * rounded once, so R replicas pushing the same gradient give its bits.
 * have[k] marks the variables summed; the number of pushes is returned. */
static int
weighted_mean(keel__ps *ps, unsigned char *have)
{
    int fresh = 0;
    double total = 0;
    for (int r = 0; r < ps->total_replicas; r++) {
        pending_push *p = &ps->pending[r];
        double w;
        if (!p->used)
            continue;
        fresh++;
        w = (double)examples_of(p);
        total += w;
        for (size_t i = 0; i < p->msg.n; i++) {
            size_t k = keel_var_index(p->vars[i]);
            double *d = ps->dacc + ps->doff[k];
            const float *g = p->msg.tensors[i].t.data;
            size_t n = keel_grads_at(ps->acc, k)->count;
            if (have[k])
                for (size_t e = 0; e < n; e++)
                    d[e] += w * (double)g[e];
            else
                for (size_t e = 0; e < n; e++)
                    d[e] = w * (double)g[e];
            have[k] = 1;
        }
    }
    for (size_t k = 0; k < ps->n_pins; k++) {
        keel_tensor *acc;
        const double *d = ps->dacc + ps->doff[k];
        if (!have[k])
            continue;
        acc = keel_grads_at(ps->acc, k);
        for (size_t e = 0; e < acc->count; e++)
            acc->data[e] = (float)(d[e] / total);
    }
    return fresh;
}

/* chief_applies: send the sums (if st, the aggregation's status, is OK)
 * and wait for the chief's commit; on failure answer every pending push
 * with the error. */
static keel_status
hand_to_chief(keel__ps *ps, keel_status st, int fresh)
{
    if (st == KEEL_OK)
        st = send_aggregate(ps, ps->all, ps->have, ps->n_pins);
    if (st == KEEL_OK) {
        ps->awaiting_commit = 1;
        ps->commit_fresh = fresh;
        return KEEL_OK;
    }
    fail_pending(ps, KEEL_EINVAL, keel_last_error());
    return st;
}

/* Apply each summed variable's sum at step: by the algorithm's ps rule,
 * else by the ps's apply callback. */
static keel_status
apply_sums(keel__ps *ps, int64_t step)
{
    keel_status st = KEEL_OK;
    for (size_t k = 0; k < ps->n_pins && st == KEEL_OK; k++)
        if (ps->have[k])
            st = ps->rule != NULL
                ? keel__algo_ps_commit(ps->rule, ps->all[k],
                                       keel_grads_at(ps->acc, k), -1, step)
                : ps->apply(ps->apply_ctx, ps->all[k],
                            keel_grads_at(ps->acc, k), step);
    if (st == KEEL_OK && ps->rule != NULL)
        keel__algo_ps_commit_end(ps->rule, -1);
    return st;
}

/* The steps the pending pushes cover (the first one's, checked when it
 * came; 1 without any). */
static int64_t
pending_covered(const keel__ps *ps)
{
    int64_t covered = 1;
    for (int r = 0; r < ps->total_replicas; r++)
        if (ps->pending[r].used) {
            (void)covered_of(&ps->pending[r].msg, &covered);
            break;
        }
    return covered;
}

/* The step's update from the pending pushes: the example-weighted mean of
 * the replicas' gradients (weighted_mean), or with declared pieces their
 * sum along the tree, or a rule's commits summed in ascending replica
 * order; apply, step + 1, answer every pending push (the sync token). */
static keel_status
aggregate(keel__ps *ps)
{
    int64_t step = keel_vars_global_step(ps->vars);
    size_t nv = ps->n_pins;
    unsigned char *have = ps->have;
    keel_status st;
    int fresh = 0, pieces = 0;
    memset(have, 0, nv);
    st = wait_pins(ps, ps->all, nv);
    for (int r = 0; r < ps->total_replicas; r++)
        fresh += ps->pending[r].used;
    if (st == KEEL_OK && ps->leaves > 0 && fresh == ps->total_replicas)
        st = tree_aggregate(ps, have);
    else if (st == KEEL_OK && ps->rule == NULL && ps->leaves == 0 &&
             (st = pieces_of(ps, &pieces)) == KEEL_OK && !pieces)
        fresh = weighted_mean(ps, have);
    else
        fresh = st == KEEL_OK ? sum_pending(ps, have) : 0;
    /* Declared pieces (reduce_leaves, micro-batch stores) and a rule's
     * commits are shares of the step's update: each replica's part of the global batch's mean
     * (its examples' gradients divided by the global batch), or its
     * commit divided by total_replicas. With backup workers only `fresh`
     * shares came; total/fresh makes the sum the mean of those
     * aggregated. Without backups the factor is 1 and the sum's bits
     * stand as they are. Gradient rules already hold the mean. */
    if (st == KEEL_OK && fresh > 0 && fresh != ps->total_replicas &&
        (ps->rule != NULL || ps->leaves > 0 || pieces))
        for (size_t k = 0; k < nv; k++)
            if (have[k])
                mean_of_shares(keel_grads_at(ps->acc, k),
                               ps->total_replicas, fresh);
    if (ps->chief_applies)
        return hand_to_chief(ps, st, fresh);
    if (st == KEEL_OK)
        st = apply_sums(ps, step);
    if (st == KEEL_OK) {
        keel_vars_set_global_step(ps->vars, step + pending_covered(ps));
        ps->applied += fresh;
        push_budget_step(ps);
    }
    release_pending(ps, st);
    return st;
}

/* Take one from replica r's budget of pushes that make no progress, after
 * regaining what time gave it; 0 when it is empty. */
static int
push_budget_take(keel__ps *ps, int r)
{
    int64_t now = keel__now_mono_ns();
    int64_t every = (int64_t)PUSH_REFILL_MS * 1000000;
    int64_t gained = (now - ps->push_budget_ns[r]) / every;
    if (gained > 0) {
        int64_t b = ps->push_budget[r] + gained;
        ps->push_budget[r] = b > PUSH_BURST ? PUSH_BURST : (int)b;
        ps->push_budget_ns[r] += gained * every;
    }
    if (ps->push_budget[r] == 0)
        return 0;
    ps->push_budget[r]--;
    return 1;
}

/* A sync step completed: every replica regains one (a backup worker's
 * stale push each step costs it nothing in the end). */
static void
push_budget_step(keel__ps *ps)
{
    for (int r = 0; r < ps->n_slots; r++)
        if (ps->push_budget[r] < PUSH_BURST)
            ps->push_budget[r]++;
}

/* Answer replica's push req with an ERROR (code, text) without reading
 * it further; counted, logged rate-limited. */
static void
refuse_push(keel__ps *ps, keel__wire_msg *req, int replica,
            keel_status code, const char *text)
{
    long held = 0;
    ps->refused_pushes++;
    ps->rejected++;
    if (keel__log_limit_take(&ps->lim_push, keel__now_mono_ns(), &held))
        keel__log(KEEL_LOG_WARN, "ps %d: refused a push of replica %d: %s "
                  "(%ld more pushes refused since the last such line, %ld "
                  "in all)", ps->task_index, replica, text, held,
                  ps->refused_pushes);
    send_error(ps, req, code, text);
}

/* Sync, before anything of req is read: a replica whose push of this step
 * is held (one held push per replica per step: a second one is another
 * sender under its identity, or the replica itself from a new connection
 * after it gave its first up) is refused and the held push stands; a
 * stale push costs budget, and without any it is refused. 1 when req was
 * answered so. */
static int
sync_push_refused(keel__ps *ps, keel__wire_msg *req, int replica,
                  int64_t step)
{
    char name[32], text[512];
    replica_name(ps, replica, name, sizeof name);
    if (ps->pending[replica].used) {
        (void)push_budget_take(ps, replica);
        snprintf(text, sizeof text, "ps %d already holds a push of %s for "
                 "step %lld: a replica pushes once per step; this push is "
                 "refused, the held one stands and is answered when the "
                 "step completes", ps->task_index, name, (long long)step);
        refuse_push(ps, req, replica, KEEL_EABORTED, text);
        return 1;
    }
    if (req->h.local_step < step && !push_budget_take(ps, replica)) {
        snprintf(text, sizeof text, "%s pushed more stale or refused "
                 "gradients than its budget (%d, one more each %d ms and "
                 "each step): refused unread; pull and push for step %lld",
                 name, PUSH_BURST, PUSH_REFILL_MS, (long long)step);
        refuse_push(ps, req, replica, KEEL_EUNAVAILABLE, text);
        return 1;
    }
    return 0;
}

/* Whether ps may take a PUSH req at all: ready, with data, from a training
 * replica (*replica), covering *covered steps. */
static keel_status
check_push(const keel__ps *ps, const keel__wire_msg *req, int *replica,
           int64_t *covered)
{
    if (!ps->is_ready)
        return keel__fail(KEEL_EUNAVAILABLE, "ps %d holds no state yet "
                          "(restarted? waiting for the chief's INIT)",
                          ps->task_index);
    if (req->h.flags & KEEL_WIRE_F_NAMES_ONLY)
        return keel__fail(KEEL_ECORRUPT, "PUSH without data");
    *replica = replica_of(ps, &req->h);
    if (*replica < 0 || (ps->fixed && *replica >= ps->total_replicas))
        return keel__fail(KEEL_EINVAL, "PUSH from %s %u: not a training "
                          "replica of this cluster (%d replicas%s)",
                          keel_task_type_name((keel_task_type)
                                              req->h.sender_type),
                          req->h.sender_index, ps->total_replicas,
                          fixed_why(ps));
    return covered_of(req, covered);
}

/* The trainable variable of each gradient of req into vars. Sync pushes
 * may name a variable once per micro-batch (folded in message order);
 * async ones once. */
static keel_status
resolve_push(keel__ps *ps, const keel__wire_msg *req, keel_var **vars)
{
    keel_status st;
    if (ps->sync) {
        for (size_t i = 0; i < req->n; i++) {
            keel_tensor *t;
            if ((st = resolve(ps, &req->tensors[i], 1, &vars[i], &t)) !=
                KEEL_OK)
                return st;
            if (t != keel_var_tensor(vars[i]))
                return keel__fail(KEEL_EINVAL, "PUSH to slot '%s'",
                                  req->tensors[i].name);
        }
    } else if ((st = check_tensors(ps, req, vars)) != KEEL_OK) {
        return st;
    }
    for (size_t i = 0; i < req->n; i++)
        if (!keel_var_is_trainable(vars[i]))
            return keel__fail(KEEL_EINVAL, "PUSH to '%s', which is not "
                              "trainable", keel_var_name(vars[i]));
    return KEEL_OK;
}

/* Async: apply replica's push of step as it comes (the optimizer or the
 * rule), step + covered, answer it. */
static keel_status
apply_async(keel__ps *ps, keel__wire_msg *req, keel_var **vars, int replica,
            int64_t step, int64_t covered)
{
    keel_status st = wait_pins(ps, vars, req->n);
    for (size_t i = 0; i < req->n && st == KEEL_OK; i++)
        st = ps->rule != NULL
            ? keel__algo_ps_commit(ps->rule, vars[i], &req->tensors[i].t,
                                   replica, step)
            : ps->apply(ps->apply_ctx, vars[i], &req->tensors[i].t, step);
    if (st != KEEL_OK)
        return st;
    if (ps->rule != NULL)
        keel__algo_ps_commit_end(ps->rule, replica);
    keel_vars_set_global_step(ps->vars, step + covered);
    ps->applied++;
    return send_ack(ps, req, vars, req->n);
}

/* Sync: hold req (and *vars, taken: *vars set NULL) as replica's push of
 * this step, which holds none (sync_push_refused). */
static void
hold_push(keel__ps *ps, keel__wire_msg *req, int replica, keel_var ***vars)
{
    pending_push *p = &ps->pending[replica];
    assert(!p->used);
    p->msg = *req;
    zmq_msg_init(&p->msg.identity);
    zmq_msg_move(&p->msg.identity, &req->identity);
    keel__wire_msg_init(req);           /* moved: the caller clears nothing */
    p->vars = *vars;
    if (pending_count(ps) == 0)
        ps->pending_since_ns = keel__now_mono_ns();
    p->used = 1;
    *vars = NULL;
}

/* Sync: aggregate once enough replicas pushed (with the chief's push when
 * it applies), timing the step. */
static keel_status
aggregate_when_complete(keel__ps *ps)
{
    int64_t t0, t1;
    keel_status st;
    if (pending_count(ps) < ps->replicas_to_aggregate ||
        ps->awaiting_commit || (ps->chief_applies && !ps->pending[0].used))
        return KEEL_OK;
    t0 = keel__now_mono_ns();
    st = aggregate(ps);
    t1 = keel__now_mono_ns();
    if (ps->last_step_end_ns != 0) {    /* the first step starts cold */
        ps->timed_steps++;
        ps->idle_ns += ps->pending_since_ns - ps->last_step_end_ns;
        ps->spread_ns += t0 - ps->pending_since_ns;
        ps->aggregate_ns += t1 - t0;
    }
    ps->last_step_end_ns = t1;
    return st;
}

/* Sync: a push for an earlier step is dropped (counted, answered), one for
 * a later step refused; one for this step is held until the step is
 * complete. */
static keel_status
take_sync(keel__ps *ps, keel__wire_msg *req, int replica, int64_t step,
          keel_var ***vars)
{
    if (req->h.local_step < step) {     /* stale: drop, count, go on */
        ps->dropped++;
        keel__log(KEEL_LOG_INFO, "ps %d: dropped a stale gradient of "
                  "replica %d (computed at step %lld, now %lld; %ld dropped)",
                  ps->task_index, replica, (long long)req->h.local_step,
                  (long long)step, ps->dropped);
        return send_ack(ps, req, *vars, req->n);
    }
    if (ps->job_end[0] != '\0') {
        send_error(ps, req, KEEL_EOUTOFRANGE, ps->job_end);
        return KEEL_OK;
    }
    if (req->h.local_step > step)
        return keel__fail(KEEL_EABORTED, "replica %d pushed for step %lld "
                          "but ps %d is at step %lld (the ps restarted or "
                          "was re-initialized)", replica,
                          (long long)req->h.local_step, ps->task_index,
                          (long long)step);
    hold_push(ps, req, replica, vars);
    if (ps->awaiting_commit && replica == 0) {
        /* the chief pushes again instead of committing: it restarted (and
         * joined this live ps) or gave the step up; aggregate anew */
        keel__log(KEEL_LOG_WARN, "ps %d: the chief pushed step %lld again "
                  "before committing it: aggregating it anew",
                  ps->task_index, (long long)step);
        ps->awaiting_commit = 0;
    }
    return aggregate_when_complete(ps);
}

static keel_status
real_push(keel__ps *ps, keel__wire_msg *req)
{
    keel_var **vars;
    keel_status st;
    int64_t step = keel_vars_global_step(ps->vars), covered = 1;
    int replica = -1;
    if ((st = check_push(ps, req, &replica, &covered)) != KEEL_OK)
        return st;
    if (ps->sync && sync_push_refused(ps, req, replica, step))
        return KEEL_OK;
    vars = calloc(req->n ? req->n : 1, sizeof *vars);
    if (vars == NULL)
        return keel__fail(KEEL_ENOMEM, "ps: %zu updates", req->n);
    st = resolve_push(ps, req, vars);
    if (st == KEEL_OK && !ps->sync)     /* async: apply as it comes */
        st = apply_async(ps, req, vars, replica, step, covered);
    else if (st == KEEL_OK)
        st = take_sync(ps, req, replica, step, &vars);
    free(vars);
    return st;
}

/* A replica's session ended by itself (a stop request, the end of its
 * input, its program closing it) at the step in the header. A sync step
 * needs every replica (no backups) or a fixed count of them, so a sync job
 * ends there, as TF's never did: the held pushes and every later one are
 * answered KEEL_EOUTOFRANGE with the reason, and the other replicas end
 * their sessions at the step they were at (the chief with its final
 * checkpoint, then SHUTDOWN). Async: the replica is forgotten. */
static keel_status
real_leave(keel__ps *ps, keel__wire_msg *req)
{
    int r = replica_of(ps, &req->h);
    char name[32], what[320];
    if (r < 0)
        return keel__fail(KEEL_EINVAL, "LEAVE from a task that is not a "
                          "training replica");
    replica_name(ps, r, name, sizeof name);
    if (ps->pending != NULL && r < ps->total_replicas &&
        ps->pending[r].used)
        return keel__fail(KEEL_EINVAL, "LEAVE of %s refused: its push for "
                          "step %lld is held here, and a replica leaves only "
                          "between its steps (after its last push was "
                          "answered); the held push stands", name,
                          (long long)keel_vars_global_step(ps->vars));
    snprintf(what, sizeof what, "%s ended its session at step %lld (%s)",
             name, (long long)req->h.global_step,
             req->h.arg <= KEEL_END_SIGNAL
                 ? keel_end_reason_name((keel_end_reason)req->h.arg)
                 : "no reason given");
    if (ps->member[r]) {
        ps->member[r] = 0;
        ps->n_members--;
    }
    if (ps->sync && ps->job_end[0] == '\0') {
        snprintf(ps->job_end, sizeof ps->job_end, "%s; a sync job stops "
                 "when one of its replicas does: every replica stops at "
                 "its current step", what);
        keel__log(KEEL_LOG_INFO, "ps %d: %s; the sync job stops (at step "
                  "%lld here)", ps->task_index, what,
                  (long long)keel_vars_global_step(ps->vars));
        /* a step the chief is applying (backups) completes first: its
         * COMMIT answers the held pushes, and their next ones end */
        if (!ps->awaiting_commit)
            fail_pending(ps, KEEL_EOUTOFRANGE, ps->job_end);
    } else {
        keel__log(KEEL_LOG_INFO, "ps %d: %s; %d live replica%s",
                  ps->task_index, what, ps->n_members,
                  ps->n_members == 1 ? "" : "s");
    }
    return send_done(ps, req, KEEL_MSG_LEAVE);
}

static keel_status
real_hello(keel__ps *ps, keel__wire_msg *req)
{
    keel__wire_header h;
    char text[512];
    if (!ps->is_ready && req->h.arg == 1) {   /* wait for readiness */
        hello_waiter *w;
        if (ps->n_waiters == MAX_WAITERS) {   /* forget the oldest */
            zmq_msg_close(&ps->waiters[0].identity);
            memmove(&ps->waiters[0], &ps->waiters[1],
                    (MAX_WAITERS - 1) * sizeof *ps->waiters);
            ps->n_waiters--;
        }
        w = &ps->waiters[ps->n_waiters++];
        zmq_msg_init(&w->identity);
        zmq_msg_copy(&w->identity, &req->identity);
        w->request_id = req->h.request_id;
        return KEEL_OK;
    }
    reply_header(ps, req, &h, KEEL_MSG_READY, 0);
    h.arg = (uint32_t)ps->is_ready;
    h.local_step = (int64_t)ps->chief_generation;
    status_text(ps, text, sizeof text);
    return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0, text,
                           NULL);
}

void
keel__ps_drain(keel__ps *ps, int ms)
{
    int64_t deadline = keel__now_mono_ns() + (int64_t)ms * 1000000;
    for (;;) {
        keel__wire_msg req;
        int64_t left = (deadline - keel__now_mono_ns()) / 1000000;
        keel_status st;
        if (left <= 0)
            return;
        st = keel__wire_recv(ps->sock, 1, &ps->limits, (int)left, &req);
        if (req.has_identity && (st == KEEL_OK || st == KEEL_ECORRUPT))
            send_error(ps, &req, KEEL_ECANCELLED, "training finished: the "
                       "chief shut this ps down");
        keel__wire_msg_clear(&req);
        if (st == KEEL_ETIMEOUT)
            return;
    }
}

/* An update (PUSH, COMMIT, MIX) computed from an earlier incarnation's
 * values: answered with an error, not applied. Returns 1 when refused. */
static int
refuse_stale_update(keel__ps *ps, keel__wire_msg *req)
{
    char text[256];
    if (ps->apply == NULL || req->h.peer_generation == 0 ||
        req->h.peer_generation == ps->generation ||
        (req->h.type != KEEL_MSG_PUSH && req->h.type != KEEL_MSG_COMMIT &&
         req->h.type != KEEL_MSG_MIX))
        return 0;
    snprintf(text, sizeof text, "ps %d restarted: this update was computed "
             "from the values of generation %016llx, the ps is now "
             "generation %016llx; pull and compute it again",
             ps->task_index, (unsigned long long)req->h.peer_generation,
             (unsigned long long)ps->generation);
    send_error(ps, req, KEEL_EABORTED, text);
    return 1;
}

/* The real server's requests; *handled 0 for the ones every server
 * answers alike (handle_common). */
static keel_status
handle_real(keel__ps *ps, keel__wire_msg *req, int *handled)
{
    *handled = 1;
    switch (req->h.type) {
    case KEEL_MSG_PULL:
        return real_pull(ps, req);
    case KEEL_MSG_PUSH:
        return real_push(ps, req);
    case KEEL_MSG_INIT:
        return real_init(ps, req);
    case KEEL_MSG_COMMIT:
        return real_commit(ps, req);
    case KEEL_MSG_MIX:
        return real_mix(ps, req);
    case KEEL_MSG_HELLO:
        return real_hello(ps, req);
    case KEEL_MSG_LEAVE:
        return real_leave(ps, req);
    case KEEL_MSG_SHUTDOWN:
        fail_pending(ps, KEEL_ECANCELLED, "training finished: the chief "
                     "shut this ps down");
        ps->is_ready = 0;
        answer_waiters(ps);
        break;
    default:
        break;
    }
    *handled = 0;
    return KEEL_OK;
}

/* STEP, HEARTBEAT (with the real server's stats) and SHUTDOWN. */
static keel_status
handle_common(keel__ps *ps, keel__wire_msg *req)
{
    keel__wire_header h;
    switch (req->h.type) {
    case KEEL_MSG_STEP:
    case KEEL_MSG_HEARTBEAT:
        reply_header(ps, req, &h, req->h.type, KEEL_WIRE_F_REPLY);
        if (ps->apply != NULL) {        /* stats for tests and tools */
            char text[512];
            h.local_step = (int64_t)ps->chief_generation;
            status_text(ps, text, sizeof text);
            return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0,
                                   text, NULL);
        }
        break;
    case KEEL_MSG_SHUTDOWN: {
        const char *addr = zmq_msg_gets(&req->frames[0], "Peer-Address");
        reply_header(ps, req, &h, req->h.type, KEEL_WIRE_F_REPLY);
        ps->is_shutdown = 1;
        keel__log(KEEL_LOG_INFO, "ps %d: shut down by %s %u (generation "
                  "%016llx) from %s", ps->task_index,
                  keel_task_type_name((keel_task_type)req->h.sender_type),
                  req->h.sender_index, (unsigned long long)req->h.generation,
                  addr ? addr : "an unknown address");
        break;
    }
    default:
        return keel__fail(KEEL_EINVAL, "message type %u is not served by "
                          "this ps", req->h.type);
    }
    return keel__wire_send(ps->sock, &req->identity, &h, NULL, 0, NULL, NULL);
}

static keel_status
handle(keel__ps *ps, keel__wire_msg *req)
{
    int handled = 0;
    keel_status st = KEEL_OK;
    if (req->h.flags & KEEL_WIRE_F_REPLY)
        return keel__fail(KEEL_EINVAL, "a reply (type %u) sent as a request",
                          req->h.type);
    if (refuse_stale_update(ps, req))
        return KEEL_OK;
    if (ps->apply != NULL)
        st = handle_real(ps, req, &handled);
    else if (req->h.type == KEEL_MSG_PULL || req->h.type == KEEL_MSG_PUSH ||
             req->h.type == KEEL_MSG_INIT || req->h.type == KEEL_MSG_HELLO)
        return ps->serve(ps->serve_ctx, ps, req);
    if (handled)
        return st;
    return handle_common(ps, req);
}

static const char *
msg_type_name(unsigned type)
{
    static const char *const names[KEEL_MSG_TYPE_END] = {
        "?", "HELLO", "READY", "PULL", "PULL_REPLY", "PUSH", "PUSH_ACK",
        "ERROR", "STEP", "SHUTDOWN", "HEARTBEAT", "TOKEN", "INIT",
        "AGGREGATE", "COMMIT", "MIX", "LEAVE" };
    return type < KEEL_MSG_TYPE_END ? names[type] : "?";
}

/* Which task may send which request. INIT and SHUTDOWN: the chief (worker
 * 0 in a cluster without one); PUSH: the training replicas; reads (HELLO,
 * PULL, STEP, HEARTBEAT): every task of the job. */
static int
role_allows(const keel__ps *ps, keel_task_type t, uint32_t index,
            unsigned type)
{
    int chief = t == KEEL_TASK_CHIEF ||
                (t == KEEL_TASK_WORKER && index == 0 && !ps->has_chief);
    switch (type) {
    case KEEL_MSG_INIT:
    case KEEL_MSG_SHUTDOWN:
    case KEEL_MSG_COMMIT:
        return chief;
    case KEEL_MSG_PUSH:
    case KEEL_MSG_MIX:
    case KEEL_MSG_LEAVE:
        return t == KEEL_TASK_CHIEF || t == KEEL_TASK_WORKER;
    case KEEL_MSG_HELLO:
    case KEEL_MSG_PULL:
    case KEEL_MSG_STEP:
    case KEEL_MSG_HEARTBEAT:
        return 1;
    default:
        return 0;
    }
}

/* Who sent req: the task its connection authenticated as (the ZAP
 * handler's User-Id), or, without authentication, what its header says;
 * then whether that task may send it. A refusal is logged rate-limited per
 * request type (the first at once, then one line per interval with the
 * count between), the peer's address and name escaped (*logged set: the
 * caller logs nothing more). */
static keel_status
authorize(keel__ps *ps, const keel__wire_msg *req, int *logged)
{
    keel_task_type t = (keel_task_type)req->h.sender_type;
    uint32_t index = req->h.sender_index;
    const char *addr = NULL, *user = NULL;
    char claim[KEEL__TASK_NAME_MAX], why[256];
    long held = 0;
    *logged = 0;
    if (req->n_frames > 0) {
        addr = zmq_msg_gets(&req->frames[0], "Peer-Address");
        if (ps->zap != NULL)
            user = zmq_msg_gets(&req->frames[0], "User-Id");
    }
    keel__task_name(t, (int)index, claim, sizeof claim);
    why[0] = '\0';
    if (ps->zap != NULL) {
        keel_task_type ut;
        int ui;
        if (user == NULL || !keel__task_parse(user, &ut, &ui))
            snprintf(why, sizeof why, "its connection has no task "
                     "identity");
        else if (ut != t || (uint32_t)ui != index)
            snprintf(why, sizeof why, "it authenticated as %s but its "
                     "header claims %s", user, claim);
    }
    if (why[0] == '\0' && !role_allows(ps, t, index, req->h.type))
        snprintf(why, sizeof why, "%s may not send %s to a ps", claim,
                 msg_type_name(req->h.type));
    if (why[0] == '\0')
        return KEEL_OK;
    ps->rejected++;
    *logged = 1;
    if (keel__log_limit_take(&ps->lim_refused[req->h.type < KEEL_MSG_TYPE_END
                                              ? req->h.type : 0],
                             keel__now_mono_ns(), &held)) {
        char e_addr[160], e_user[160], e_why[512];
        keel__log(KEEL_LOG_WARN, "ps %d: refused %s from %s (%s%s): %s "
                  "(%ld more %s refused since the last such line)",
                  ps->task_index, msg_type_name(req->h.type),
                  addr ? keel__log_escape(e_addr, sizeof e_addr, addr)
                       : "an unknown address",
                  ps->zap ? "authenticated as " : "unauthenticated, claims ",
                  keel__log_escape(e_user, sizeof e_user,
                                   user ? user : claim),
                  keel__log_escape(e_why, sizeof e_why, why), held,
                  msg_type_name(req->h.type));
    }
    return keel__fail(KEEL_EINVAL, "refused: %s", why);
}

keel_status
keel__ps_serve_once(keel__ps *ps, int timeout_ms)
{
    keel__wire_msg req;
    keel_status st;
    int logged = 0;
    if (ps->is_shutdown)
        return keel__fail(KEEL_ECANCELLED, "ps %d was shut down",
                          ps->task_index);
    st = keel__wire_recv(ps->sock, 1, &ps->limits, timeout_ms, &req);
    if (st == KEEL_ETIMEOUT || st == KEEL_ECANCELLED) {
        keel__wire_msg_clear(&req);
        return st;
    }
    if (st == KEEL_OK)
        st = authorize(ps, &req, &logged);
    if (st == KEEL_OK) {
        int r = replica_of(ps, &req.h);
        if (r < 0 && req.h.sender_type == KEEL_TASK_WORKER)
            st = keel__fail(KEEL_EINVAL, "worker %u is not a training "
                            "replica of this cluster (%d replicas%s)",
                            req.h.sender_index, ps->total_replicas,
                            ps->fixed ? fixed_why(ps) : ", at most "
                            KEEL__XSTR(KEEL__CLUSTER_MAX_REPLICAS));
        else if (r >= 0)
            member_heard(ps, r, keel__now_mono_ns());
    }
    if (st == KEEL_OK)
        st = handle(ps, &req);
    if (st != KEEL_OK && req.has_identity) {
        char why[KEEL_ERR_MAX];
        snprintf(why, sizeof why, "%s", keel_last_error());
        if (!logged) {
            long held = 0;
            char e_why[KEEL_ERR_MAX];
            ps->rejected++;
            if (keel__log_limit_take(&ps->lim_rejected, keel__now_mono_ns(),
                                     &held))
                keel__log(KEEL_LOG_WARN, "ps %d: rejected a request from "
                          "task %s %u (request %llu): %s (%ld more "
                          "rejected since the last such line)",
                          ps->task_index,
                          keel_task_type_name((keel_task_type)
                                              req.h.sender_type),
                          req.h.sender_index,
                          (unsigned long long)req.h.request_id,
                          keel__log_escape(e_why, sizeof e_why, why), held);
        }
        send_error(ps, &req, st == KEEL_ECORRUPT || st == KEEL_ENOTFOUND ||
                             st == KEEL_EUNAVAILABLE || st == KEEL_EABORTED ||
                             st == KEEL_ECANCELLED ? st : KEEL_EINVAL,
                   why);
    } else if (st != KEEL_OK) {
        long held = 0;
        char e_why[KEEL_ERR_MAX];
        ps->rejected++;
        if (keel__log_limit_take(&ps->lim_dropped, keel__now_mono_ns(),
                                 &held))
            keel__log(KEEL_LOG_WARN, "ps %d: dropped a message: %s (%ld "
                      "more dropped since the last such line)",
                      ps->task_index, keel__log_escape(e_why, sizeof e_why,
                                                       keel_last_error()),
                      held);
    } else {
        ps->served++;
    }
    keel__wire_msg_clear(&req);
    return ps->is_shutdown ? KEEL_ECANCELLED : KEEL_OK;
}

keel_status
keel__ps_run(keel__ps *ps, const atomic_int *stop)
{
    while (stop == NULL || !atomic_load(stop)) {
        keel_status st = keel__ps_serve_once(ps, 50);
        if (st == KEEL_ECANCELLED)
            return KEEL_OK;
        if (st != KEEL_OK && st != KEEL_ETIMEOUT)
            return st;
    }
    return KEEL_OK;
}
