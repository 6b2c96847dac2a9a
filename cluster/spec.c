/* spec.c - the cluster table: its model and queries, explicit lists in
 * (TF_CONFIG: tfconfig.c; Slurm: slurm.c; the environment: detect.c),
 * validation that lists every problem at once and a human summary. Rules
 * follow TF1's RunConfig and multi_worker_util. */
#include <config.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/cluster.h>
#include "grow.h"
#include "util.h"
#include "cluster_int.h"
#include "spec_int.h"

#define MAX_TASKS_PER_JOB KEEL__MAX_TASKS_PER_JOB

static const char *const type_names[KEEL_TASK_TYPE_COUNT] = {
    "none", "chief", "worker", "ps", "evaluator"
};

const char *
keel_task_type_name(keel_task_type t)
{
    if ((int)t < 0 || (int)t >= KEEL_TASK_TYPE_COUNT)
        return "unknown";
    return type_names[t];
}

keel_status
keel_task_type_from_name(const char *name, keel_task_type *out)
{
    if (name == NULL || out == NULL)
        return keel__fail(KEEL_EINVAL, "task type: NULL argument");
    for (int t = KEEL_TASK_CHIEF; t < KEEL_TASK_TYPE_COUNT; t++)
        if (strcmp(name, type_names[t]) == 0) {
            *out = (keel_task_type)t;
            return KEEL_OK;
        }
    if (strcmp(name, "master") == 0) {
        *out = KEEL_TASK_CHIEF;
        return KEEL_OK;
    }
    return keel__fail(KEEL_EINVAL, "unknown task type '%.64s' (expected "
                      "chief, master, worker, ps or evaluator)", name);
}

/* ---- problem lists ------------------------------------------------------ */

void
keel__problems_add(keel__problems *p, const char *fmt, ...)
{
    va_list ap;
    size_t room;
    int k;
    p->count++;
    if (p->len >= sizeof p->text - 1)
        return;
    if (p->len > 0) {
        room = sizeof p->text - p->len;
        k = snprintf(p->text + p->len, room, "; ");
        p->len += (size_t)k < room ? (size_t)k : room - 1;
    }
    room = sizeof p->text - p->len;
    va_start(ap, fmt);
    k = vsnprintf(p->text + p->len, room, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    p->len += (size_t)k < room ? (size_t)k : room - 1;
}

keel_status
keel__problems_fail(const keel__problems *p, const char *what)
{
    if (p->count == 0)
        return KEEL_OK;
    return keel__fail(KEEL_EINVAL, "%s: %d problem%s: %s", what, p->count,
                      p->count == 1 ? "" : "s", p->text);
}

/* ---- the spec ----------------------------------------------------------- */

keel_status
keel_cluster_spec_new(keel_cluster_spec **out)
{
    keel_cluster_spec *s;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "cluster spec: out is NULL");
    *out = NULL;
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return keel__fail(KEEL_ENOMEM, "cluster spec: %zu bytes", sizeof *s);
    s->task = KEEL_TASK_NONE;
    s->mode = KEEL_CLUSTER_SYNC;
    *out = s;
    return KEEL_OK;
}

void
keel_cluster_spec_free(keel_cluster_spec *s)
{
    if (s == NULL)
        return;
    for (int t = 0; t < KEEL_TASK_TYPE_COUNT; t++) {
        for (size_t i = 0; i < s->n[t]; i++)
            free(s->addr[t][i]);
        free(s->addr[t]);
    }
    free(s->model_dir);
    free(s);
}

/* Append one address (copied, at most KEEL_ADDR_MAX-1 bytes kept whole;
 * longer ones are kept too so validation can name them). */
keel_status
keel__cluster_spec_add(keel_cluster_spec *s, keel_task_type t, const char *a,
                       size_t len)
{
    char **p;
    char *copy;
    if (s->n[t] >= MAX_TASKS_PER_JOB)
        return keel__fail(KEEL_EINVAL, "cluster: more than %d %s tasks",
                          MAX_TASKS_PER_JOB, type_names[t]);
    p = keel__grow(s->addr[t], &s->cap[t], s->n[t], sizeof *p, 8);
    if (p == NULL)
        return keel__fail(KEEL_ENOMEM, "cluster: %zu addresses",
                          s->n[t] + 1);
    s->addr[t] = p;
    copy = strndup(a, len);
    if (copy == NULL)
        return keel__fail(KEEL_ENOMEM, "cluster: copy address");
    s->addr[t][s->n[t]++] = copy;
    return KEEL_OK;
}

keel_status
keel_cluster_spec_add_list(keel_cluster_spec *s, keel_task_type t,
                           const char *list)
{
    const char *p, *end;
    if (s == NULL || list == NULL || !keel__task_type_ok(t))
        return keel__fail(KEEL_EINVAL, "cluster: add_list: bad argument");
    p = list;
    for (;;) {
        size_t len;
        const char *a;
        end = strchr(p, ',');
        len = end ? (size_t)(end - p) : strlen(p);
        a = p;
        while (len > 0 && isspace((unsigned char)*a)) {
            a++;
            len--;
        }
        while (len > 0 && isspace((unsigned char)a[len - 1]))
            len--;
        /* An empty element is kept so validation reports it, except a
         * wholly empty list (no tasks). */
        if (!(len == 0 && end == NULL && p == list)) {
            keel_status st = keel__cluster_spec_add(s, t, a, len);
            if (st != KEEL_OK)
                return st;
        }
        if (end == NULL)
            break;
        p = end + 1;
    }
    return KEEL_OK;
}

keel_status
keel_cluster_spec_set_task(keel_cluster_spec *s, keel_task_type t, int index)
{
    if (s == NULL || !keel__task_type_ok(t) || index < 0)
        return keel__fail(KEEL_EINVAL, "cluster: set_task: bad task %s %d",
                          keel_task_type_name(t), index);
    s->task = t;
    s->index = index;
    return KEEL_OK;
}

void
keel_cluster_spec_set_mode(keel_cluster_spec *s, keel_cluster_mode mode)
{
    if (s != NULL)
        s->mode = mode;
}

void
keel_cluster_spec_set_replicas(keel_cluster_spec *s, int rta, int tnr)
{
    if (s == NULL)
        return;
    s->replicas_to_aggregate = rta;
    s->total_num_replicas = tnr;
}

size_t
keel_cluster_spec_num_tasks(const keel_cluster_spec *s, keel_task_type t)
{
    if (s == NULL || !keel__task_type_ok(t))
        return 0;
    return s->n[t];
}

const char *
keel_cluster_spec_address(const keel_cluster_spec *s, keel_task_type t,
                          int index)
{
    if (s == NULL || !keel__task_type_ok(t) || index < 0 ||
        (size_t)index >= s->n[t])
        return NULL;
    return s->addr[t][index];
}

keel_task_type
keel_cluster_spec_task_type(const keel_cluster_spec *s)
{
    return s ? s->task : KEEL_TASK_NONE;
}

int
keel_cluster_spec_task_index(const keel_cluster_spec *s)
{
    return s ? s->index : 0;
}

int
keel_cluster_spec_is_local(const keel_cluster_spec *s)
{
    if (s == NULL)
        return 1;
    for (int t = 1; t < KEEL_TASK_TYPE_COUNT; t++)
        if (s->n[t] > 0)
            return 0;
    return 1;
}

int
keel_cluster_spec_is_chief(const keel_cluster_spec *s)
{
    if (s == NULL || keel_cluster_spec_is_local(s))
        return 1;
    if (s->task == KEEL_TASK_CHIEF)
        return 1;
    return s->n[KEEL_TASK_CHIEF] == 0 && s->task == KEEL_TASK_WORKER &&
           s->index == 0;
}

int
keel_cluster_spec_replica_index(const keel_cluster_spec *s)
{
    if (keel_cluster_spec_is_local(s) || s->task == KEEL_TASK_CHIEF)
        return 0;
    if (s->task != KEEL_TASK_WORKER)
        return -1;
    return s->index + (s->n[KEEL_TASK_CHIEF] > 0);
}

int
keel_cluster_spec_num_replicas(const keel_cluster_spec *s)
{
    if (s == NULL)
        return 0;
    if (keel_cluster_spec_is_local(s))
        return 1;
    return (int)(s->n[KEEL_TASK_CHIEF] + s->n[KEEL_TASK_WORKER]);
}

keel_cluster_mode
keel_cluster_spec_mode(const keel_cluster_spec *s)
{
    return s ? s->mode : KEEL_CLUSTER_SYNC;
}

/* A replica count of s as set (n > 0), else (unset) all its replicas. */
static int
replicas_or_all(const keel_cluster_spec *s, int n)
{
    return n > 0 ? n : keel_cluster_spec_num_replicas(s);
}

int
keel_cluster_spec_replicas_to_aggregate(const keel_cluster_spec *s)
{
    return s != NULL ? replicas_or_all(s, s->replicas_to_aggregate) : 0;
}

int
keel_cluster_spec_total_num_replicas(const keel_cluster_spec *s)
{
    return s != NULL ? replicas_or_all(s, s->total_num_replicas) : 0;
}

const char *
keel_cluster_spec_model_dir(const keel_cluster_spec *s)
{
    return s ? s->model_dir : NULL;
}

/* ---- validation --------------------------------------------------------- */

/* The host of "[v6]:port": an IPv6 address between the brackets;
 * *colon and *hlen set for the caller's checks. */
static int
check_v6_host(const char *a, const char **colon, size_t *hlen, char *why,
              size_t size)
{
    const char *host_end = strchr(a, ']');
    char host[INET6_ADDRSTRLEN];
    unsigned char bin[16];
    if (host_end == NULL || host_end[1] != ':') {
        snprintf(why, size, "'%.64s' is not [ipv6]:port", a);
        return 0;
    }
    *colon = host_end + 1;
    *hlen = (size_t)(host_end - a - 1);
    if (*hlen == 0)
        return 1;                   /* the caller names an empty host */
    if (*hlen >= sizeof host) {
        snprintf(why, size, "'%.64s' has a bad IPv6 address", a);
        return 0;
    }
    memcpy(host, a + 1, *hlen);
    host[*hlen] = '\0';
    if (inet_pton(AF_INET6, host, bin) != 1) {
        snprintf(why, size, "'%.64s' has a bad IPv6 address '%s'", a, host);
        return 0;
    }
    return 1;
}

/* The host of "host:port": one ':', a name or IPv4 address (a wildcard
 * '*' is cluster.bind_address's, not an address others can reach);
 * *colon and *hlen set for the caller's checks. */
static int
check_name_host(const char *a, const char **colon, size_t *hlen, char *why,
                size_t size)
{
    const char *c = strrchr(a, ':');
    if (c == NULL) {
        snprintf(why, size, "'%.64s' has no ':port'", a);
        return 0;
    }
    if (memchr(a, ':', (size_t)(c - a)) != NULL) {
        snprintf(why, size, "'%.64s' has more than one ':' (write IPv6 "
                 "as [addr]:port)", a);
        return 0;
    }
    *colon = c;
    *hlen = (size_t)(c - a);
    if (*hlen == 1 && a[0] == '*') {
        snprintf(why, size, "'%.64s' is a wildcard, not an address other "
                 "tasks can reach (give the host; set "
                 "cluster.bind_address = * to listen on every interface)",
                 a);
        return 0;
    }
    for (const char *h = a; h < c; h++)
        if (!isalnum((unsigned char)*h) && *h != '.' && *h != '-' &&
            *h != '_') {
            snprintf(why, size, "'%.64s' has a bad host character "
                     "'%c'", a, isprint((unsigned char)*h) ? *h : '?');
            return 0;
        }
    return 1;
}

/* port: at most 6 digits, a number in 1..65535 (a is the whole address,
 * for the message). */
static int
check_port(const char *a, const char *port, char *why, size_t size)
{
    long v = 0;
    if (*port == '\0') {
        snprintf(why, size, "'%.64s' has an empty port", a);
        return 0;
    }
    for (const char *q = port; *q; q++) {
        if (!isdigit((unsigned char)*q) || q - port > 5) {
            snprintf(why, size, "'%.64s' has a bad port (want 1..65535)", a);
            return 0;
        }
        v = v * 10 + (*q - '0');
    }
    if (v < 1 || v > 65535) {
        snprintf(why, size, "'%.64s' has port %ld out of 1..65535", a, v);
        return 0;
    }
    return 1;
}

int
keel__cluster_check_address(const char *a, char *why, size_t size)
{
    const char *colon = NULL;
    size_t len = strlen(a), hlen = 0;
    int ok;
    if (len == 0) {
        snprintf(why, size, "empty address");
        return 0;
    }
    if (len >= KEEL_ADDR_MAX) {
        snprintf(why, size, "address longer than %d bytes",
                 KEEL_ADDR_MAX - 1);
        return 0;
    }
    if (a[0] == '[')                        /* [v6]:port */
        ok = check_v6_host(a, &colon, &hlen, why, size);
    else
        ok = check_name_host(a, &colon, &hlen, why, size);
    if (!ok)
        return 0;
    if (hlen == 0) {
        snprintf(why, size, "'%.64s' has an empty host", a);
        return 0;
    }
    return check_port(a, colon + 1, why, size);
}

typedef struct addr_ref {
    const char *a;
    int type;
    size_t index;
} addr_ref;

static int
cmp_ref(const void *x, const void *y)
{
    const addr_ref *a = x, *b = y;
    int c = strcmp(a->a, b->a);
    if (c != 0)
        return c;
    if (a->type != b->type)
        return a->type - b->type;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* Every task's address is well formed; the number of tasks returned. */
static size_t
validate_addresses(const keel_cluster_spec *s, keel__problems *p)
{
    size_t total = 0;
    char why[160];
    for (int t = 1; t < KEEL_TASK_TYPE_COUNT; t++)
        for (size_t i = 0; i < s->n[t]; i++) {
            total++;
            if (!keel__cluster_check_address(s->addr[t][i], why, sizeof why))
                keel__problems_add(p, "%s[%zu]: %s", type_names[t], i, why);
        }
    return total;
}

/* No address serves two tasks, across every job (total: the task count). */
static void
validate_unique(const keel_cluster_spec *s, size_t total, keel__problems *p)
{
    addr_ref *refs = total ? malloc(total * sizeof *refs) : NULL;
    size_t k = 0;
    if (total && refs == NULL) {
        keel__problems_add(p, "out of memory checking duplicates");
    } else if (total) {
        for (int t = 1; t < KEEL_TASK_TYPE_COUNT; t++)
            for (size_t i = 0; i < s->n[t]; i++)
                refs[k++] = (addr_ref){ s->addr[t][i], t, i };
        qsort(refs, total, sizeof *refs, cmp_ref);
        for (size_t i = 1; i < total; i++)
            if (refs[i].a[0] != '\0' && strcmp(refs[i].a, refs[i - 1].a) == 0)
                keel__problems_add(p, "duplicate address '%.64s' (%s[%zu] "
                                   "and %s[%zu])", refs[i].a,
                                   type_names[refs[i - 1].type],
                                   refs[i - 1].index,
                                   type_names[refs[i].type], refs[i].index);
    }
    free(refs);
}

/* This process's task names a task of the cluster (local mode: at most
 * worker 0). */
static void
validate_task(const keel_cluster_spec *s, int local, keel__problems *p)
{
    if (local) {
        if (s->task != KEEL_TASK_NONE &&
            !(s->task == KEEL_TASK_WORKER && s->index == 0))
            keel__problems_add(p, "task %s %d given but the cluster is "
                               "empty (local mode allows only worker 0)",
                               type_names[s->task], s->index);
    } else if (s->task == KEEL_TASK_NONE) {
        keel__problems_add(p, "no task type/index set for this process");
    } else if (s->task == KEEL_TASK_EVALUATOR && s->n[s->task] == 0) {
        if (s->index != 0)
            keel__problems_add(p, "evaluator index %d out of range (no "
                               "evaluator job: only 0)", s->index);
    } else if (s->n[s->task] == 0) {
        keel__problems_add(p, "task type '%s' has no job in the cluster",
                           type_names[s->task]);
    } else if (s->index < 0 || (size_t)s->index >= s->n[s->task]) {
        keel__problems_add(p, "task index %d out of range for '%s' "
                           "(%zu tasks)", s->index, type_names[s->task],
                           s->n[s->task]);
    }
}

/* SyncReplicas counts against the replicas that exist (chief + workers):
 * more to aggregate than exist would hold every step forever;
 * total_num_replicas names the cluster's own count. */
static void
validate_sync_replicas(const keel_cluster_spec *s, keel__problems *p)
{
    int n = keel_cluster_spec_num_replicas(s);
    char who[64];
    snprintf(who, sizeof who, "%s%zu worker%s",
             s->n[KEEL_TASK_CHIEF] > 0 ? "the chief and " : "",
             s->n[KEEL_TASK_WORKER],
             s->n[KEEL_TASK_WORKER] == 1 ? "" : "s");
    if (s->replicas_to_aggregate > n)
        keel__problems_add(p, "replicas_to_aggregate %d is more than "
                           "the %d training replica%s of the cluster "
                           "(%s): no sync step could complete; set it "
                           "to at most %d or add workers",
                           s->replicas_to_aggregate, n,
                           n == 1 ? "" : "s", who, n);
    if (s->total_num_replicas > 0 && s->total_num_replicas != n)
        keel__problems_add(p, "total_num_replicas %d does not match "
                           "the %d training replica%s of the cluster "
                           "(%s); set it to %d or 0 (the default: "
                           "every replica)", s->total_num_replicas, n,
                           n == 1 ? "" : "s", who, n);
}

static void
validate_into(const keel_cluster_spec *s, keel__problems *p)
{
    int local = keel_cluster_spec_is_local(s);
    size_t total = validate_addresses(s, p);

    if (s->n[KEEL_TASK_CHIEF] > 1)
        keel__problems_add(p, "%zu chief tasks (at most 1)",
                           s->n[KEEL_TASK_CHIEF]);
    if (s->n[KEEL_TASK_EVALUATOR] > 1)
        keel__problems_add(p, "%zu evaluator tasks (at most 1)",
                           s->n[KEEL_TASK_EVALUATOR]);
    if (!local && s->n[KEEL_TASK_CHIEF] + s->n[KEEL_TASK_WORKER] == 0)
        keel__problems_add(p, "no chief or worker task");
    validate_unique(s, total, p);
    validate_task(s, local, p);
    if (s->replicas_to_aggregate < 0)
        keel__problems_add(p, "replicas_to_aggregate %d < 1",
                           s->replicas_to_aggregate);
    if (s->total_num_replicas < 0)
        keel__problems_add(p, "total_num_replicas %d < 1",
                           s->total_num_replicas);
    if (!local && s->mode == KEEL_CLUSTER_SYNC)
        validate_sync_replicas(s, p);
    if (s->mode != KEEL_CLUSTER_SYNC && s->mode != KEEL_CLUSTER_ASYNC)
        keel__problems_add(p, "unknown mode %d", (int)s->mode);
}

keel_status
keel__cluster_spec_check(const keel_cluster_spec *s, keel__problems *p,
                         const char *what)
{
    validate_into(s, p);
    return keel__problems_fail(p, what);
}

keel_status
keel_cluster_spec_validate(const keel_cluster_spec *s)
{
    keel__problems p = { .count = 0 };
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "cluster spec is NULL");
    return keel__cluster_spec_check(s, &p, "cluster spec");
}

/* ---- output ------------------------------------------------------------- */

typedef struct outbuf {
    char *buf;
    size_t size, len;
    int overflow;
} outbuf;

static void
out_add(outbuf *o, const char *fmt, ...)
{
    va_list ap;
    int k;
    if (o->overflow)
        return;
    va_start(ap, fmt);
    k = vsnprintf(o->buf + o->len, o->size - o->len, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= o->size - o->len) {
        o->overflow = 1;
        return;
    }
    o->len += (size_t)k;
}

keel_status
keel_cluster_spec_format(const keel_cluster_spec *s, char *buf, size_t size)
{
    outbuf o = { buf, size, 0, 0 };
    if (s == NULL || buf == NULL || size == 0)
        return keel__fail(KEEL_EINVAL, "cluster format: bad argument");
    buf[0] = '\0';
    if (keel_cluster_spec_is_local(s)) {
        out_add(&o, "cluster: local (no cluster configured; one process "
                "is chief)\n");
    } else {
        out_add(&o, "cluster: %zu chief, %zu worker%s, %zu ps, %zu "
                "evaluator%s (%d training replica%s)\n",
                s->n[KEEL_TASK_CHIEF], s->n[KEEL_TASK_WORKER],
                s->n[KEEL_TASK_WORKER] == 1 ? "" : "s", s->n[KEEL_TASK_PS],
                s->n[KEEL_TASK_EVALUATOR],
                s->n[KEEL_TASK_EVALUATOR] == 1 ? "" : "s",
                keel_cluster_spec_num_replicas(s),
                keel_cluster_spec_num_replicas(s) == 1 ? "" : "s");
        out_add(&o, "mode: %s, replicas_to_aggregate %d, "
                "total_num_replicas %d\n",
                s->mode == KEEL_CLUSTER_ASYNC ? "async" : "sync",
                keel_cluster_spec_replicas_to_aggregate(s),
                keel_cluster_spec_total_num_replicas(s));
        for (int t = 1; t < KEEL_TASK_TYPE_COUNT; t++)
            for (size_t i = 0; i < s->n[t]; i++)
                out_add(&o, "  %-9s %-4zu %s%s%s\n", type_names[t], i,
                        s->addr[t][i],
                        t == KEEL_TASK_EVALUATOR ? "  (not in the training "
                                                   "cluster)" : "",
                        (t == (int)s->task && (int)i == s->index)
                            ? "  <- this task" : "");
        if (s->n[KEEL_TASK_CHIEF] == 0 && s->n[KEEL_TASK_WORKER] > 0)
            out_add(&o, "chief: worker 0 (no chief job)\n");
    }
    if (s->task != KEEL_TASK_NONE)
        out_add(&o, "this task: %s %d%s\n", type_names[s->task], s->index,
                keel_cluster_spec_is_chief(s) ? " (chief)" : "");
    if (s->model_dir != NULL)
        out_add(&o, "model_dir: %s\n", s->model_dir);
    if (o.overflow)
        return keel__fail(KEEL_EINVAL, "cluster format: %zu-byte buffer is "
                          "too small", size);
    return KEEL_OK;
}

int
keel_cluster_spec_is_ps(const keel_cluster_spec *spec)
{
    return spec != NULL && !keel_cluster_spec_is_local(spec) &&
           keel_cluster_spec_task_type(spec) == KEEL_TASK_PS;
}
