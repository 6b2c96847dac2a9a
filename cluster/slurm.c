/* slurm.c - the cluster table from Slurm's environment (TF's
 * SlurmClusterResolver rules): compressed host lists,
 * tasks per node, ranks to ps then workers, ports from a base. */
#include <config.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/cluster.h>
#include "util.h"
#include "cluster_int.h"
#include "defaults.h"

#define MAX_TASKS_PER_JOB KEEL__MAX_TASKS_PER_JOB
#define MAX_HOSTS 65536

extern char **environ;

typedef struct hostbuf {
    char *buf;
    size_t size, used, n;
} hostbuf;

static keel_status
host_emit(hostbuf *hb, const char *h, size_t len)
{
    if (hb->n >= MAX_HOSTS)
        return keel__fail(KEEL_EINVAL, "host list: more than %d hosts",
                          MAX_HOSTS);
    if (len == 0)
        return keel__fail(KEEL_EINVAL, "host list: empty host name");
    if (hb->used + len + 1 > hb->size)
        return keel__fail(KEEL_EINVAL, "host list: expansion longer than "
                          "%zu bytes", hb->size);
    memcpy(hb->buf + hb->used, h, len);
    hb->buf[hb->used + len] = '\0';
    hb->used += len + 1;
    hb->n++;
    return KEEL_OK;
}

/* Expand one item (no top-level commas): prefix, then [ranges] groups. */
static keel_status
expand_item(hostbuf *hb, char *prefix, size_t plen, const char *rest,
            size_t rlen)
{
    const char *lb = memchr(rest, '[', rlen), *rb, *q;
    keel_status st;
    if (lb == NULL) {
        if (memchr(rest, ']', rlen) != NULL)
            return keel__fail(KEEL_EINVAL, "host list: ']' without '['");
        if (plen + rlen >= 256)
            return keel__fail(KEEL_EINVAL, "host list: host name too long");
        memcpy(prefix + plen, rest, rlen);
        return host_emit(hb, prefix, plen + rlen);
    }
    rb = memchr(lb, ']', rlen - (size_t)(lb - rest));
    if (rb == NULL)
        return keel__fail(KEEL_EINVAL, "host list: '[' without ']'");
    if ((size_t)(lb - rest) + plen >= 256)
        return keel__fail(KEEL_EINVAL, "host list: host name too long");
    memcpy(prefix + plen, rest, (size_t)(lb - rest));
    plen += (size_t)(lb - rest);
    q = lb + 1;
    if (q == rb)
        return keel__fail(KEEL_EINVAL, "host list: empty '[]'");
    while (q < rb) {
        const char *e = memchr(q, ',', (size_t)(rb - q)), *dash;
        long lo, hi;
        size_t width;
        char num[16];
        if (e == NULL)
            e = rb;
        dash = memchr(q, '-', (size_t)(e - q));
        width = (size_t)((dash ? dash : e) - q);
        if (width == 0 || width > 9 || (dash && (e - dash - 1 == 0 ||
                                                 e - dash - 1 > 9)))
            return keel__fail(KEEL_EINVAL, "host list: bad range '%.*s'",
                              (int)(e - q), q);
        for (const char *d = q; d < e; d++)
            if (!isdigit((unsigned char)*d) && d != dash)
                return keel__fail(KEEL_EINVAL, "host list: bad range "
                                  "'%.*s'", (int)(e - q), q);
        lo = strtol(q, NULL, 10);
        hi = dash ? strtol(dash + 1, NULL, 10) : lo;
        if (hi < lo)
            return keel__fail(KEEL_EINVAL, "host list: range '%.*s' runs "
                              "backwards", (int)(e - q), q);
        if (hi - lo >= MAX_HOSTS)
            return keel__fail(KEEL_EINVAL, "host list: more than %d hosts",
                              MAX_HOSTS);
        for (long v = lo; v <= hi; v++) {
            int k = snprintf(num, sizeof num, "%0*ld", (int)width, v);
            if (plen + (size_t)k >= 256)
                return keel__fail(KEEL_EINVAL, "host list: host name too "
                                  "long");
            memcpy(prefix + plen, num, (size_t)k);
            st = expand_item(hb, prefix, plen + (size_t)k, rb + 1,
                             rlen - (size_t)(rb + 1 - rest));
            if (st != KEEL_OK)
                return st;
        }
        q = e + (e < rb);
        if (e < rb && q == rb)
            return keel__fail(KEEL_EINVAL, "host list: trailing ',' in "
                              "'[...]'");
    }
    return KEEL_OK;
}

keel_status
keel_cluster_expand_hostlist(const char *list, char *buf, size_t size,
                             size_t *n)
{
    hostbuf hb = { buf, size, 0, 0 };
    const char *p;
    char prefix[272];
    keel_status st;
    if (list == NULL || buf == NULL || n == NULL)
        return keel__fail(KEEL_EINVAL, "host list: NULL argument");
    *n = 0;
    p = list;
    if (*p == '\0')
        return keel__fail(KEEL_EINVAL, "host list: empty");
    while (*p) {
        const char *e = p;
        int depth = 0;
        while (*e && (depth > 0 || *e != ',')) {
            if (*e == '[')
                depth++;
            else if (*e == ']')
                depth--;
            if (depth < 0 || depth > 1)
                return keel__fail(KEEL_EINVAL, "host list '%.64s': "
                                  "unbalanced brackets", list);
            if (!isalnum((unsigned char)*e) && !strchr("[]-,._", *e))
                return keel__fail(KEEL_EINVAL, "host list '%.64s': bad "
                                  "character", list);
            e++;
        }
        if (depth != 0)
            return keel__fail(KEEL_EINVAL, "host list '%.64s': unbalanced "
                              "brackets", list);
        if (e == p)
            return keel__fail(KEEL_EINVAL, "host list '%.64s': empty item",
                              list);
        st = expand_item(&hb, prefix, 0, p, (size_t)(e - p));
        if (st != KEEL_OK)
            return keel__wrap(st, "host list '%.64s'", list);
        p = *e ? e + 1 : e;
        if (*e && *p == '\0')
            return keel__fail(KEEL_EINVAL, "host list '%.64s': trailing ','",
                              list);
    }
    *n = hb.n;
    return KEEL_OK;
}

static const char *
env_get(char *const *env, const char *key)
{
    size_t kl = strlen(key);
    if (env == NULL)
        env = environ;
    for (; env != NULL && *env != NULL; env++)
        if (strncmp(*env, key, kl) == 0 && (*env)[kl] == '=')
            return *env + kl + 1;
    return NULL;
}

/* "3(x2),2,1" -> 3,3,2,1 into counts[0..max). Returns entries or -1. */
static long
expand_tasks_per_node(const char *s, int *counts, long max)
{
    long n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long c = strtol(p, &end, 10), rep = 1;
        if (end == p || c < 1 || c > 65536)
            return -1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x')
                return -1;
            rep = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || rep < 1 || rep > MAX_HOSTS)
                return -1;
            p = end + 1;
        }
        for (long i = 0; i < rep; i++) {
            if (n >= max)
                return -1;
            counts[n++] = (int)c;
        }
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return -1;
    }
    return n;
}

void
keel_cluster_slurm_config_init(keel_cluster_slurm_config *opt)
{
    KEEL__STRUCT_INIT(opt);
    opt->num_ps = KEEL__CLUSTER_SLURM_NUM_PS;
    opt->port_base = KEEL__CLUSTER_SLURM_PORT_BASE;
}

/* A Slurm step as its environment describes it. */
typedef struct slurm_step {
    const char *v_rank, *v_n, *v_nodes, *v_tpn;  /* the variables, or NULL */
    int64_t rank, ntasks;
    int port_base, num_ps;
    char *hosts;                /* nhosts names, each NUL-terminated */
    size_t nhosts;
    int *tpn;                   /* tasks on each host */
} slurm_step;

/* The step's variables (the step's own first, then the job's), and every
 * problem with them or opt into p. */
static void
read_slurm_env(const keel_cluster_slurm_config *opt, slurm_step *j,
               keel__problems *p)
{
    memset(j, 0, sizeof *j);
    j->rank = -1;
    j->ntasks = -1;
    j->port_base = opt->port_base ? opt->port_base
                                  : KEEL__CLUSTER_SLURM_PORT_BASE;
    j->num_ps = opt->num_ps;
    j->v_rank = env_get(opt->env, "SLURM_PROCID");
    j->v_n = env_get(opt->env, "SLURM_STEP_NUM_TASKS");
    if (j->v_n == NULL)
        j->v_n = env_get(opt->env, "SLURM_NTASKS");
    j->v_nodes = env_get(opt->env, "SLURM_STEP_NODELIST");
    if (j->v_nodes == NULL)
        j->v_nodes = env_get(opt->env, "SLURM_JOB_NODELIST");
    j->v_tpn = env_get(opt->env, "SLURM_STEP_TASKS_PER_NODE");
    if (j->v_tpn == NULL)
        j->v_tpn = env_get(opt->env, "SLURM_TASKS_PER_NODE");

    if (j->v_rank == NULL)
        keel__problems_add(p, "SLURM_PROCID not set (not running inside "
                           "a Slurm step?)");
    else if (!keel__parse_i64(j->v_rank, 0, MAX_TASKS_PER_JOB - 1, &j->rank))
        keel__problems_add(p, "SLURM_PROCID '%.16s' is not a rank",
                           j->v_rank);
    if (j->v_n == NULL)
        keel__problems_add(p, "SLURM_NTASKS not set");
    else if (!keel__parse_i64(j->v_n, 1, MAX_TASKS_PER_JOB, &j->ntasks))
        keel__problems_add(p, "SLURM_NTASKS '%.16s' is not a count", j->v_n);
    if (j->v_nodes == NULL)
        keel__problems_add(p, "SLURM_JOB_NODELIST not set");
    if (j->port_base < 1 || j->port_base > 65535)
        keel__problems_add(p, "port base %d out of 1..65535", j->port_base);
    if (j->num_ps < 0)
        keel__problems_add(p, "number of ps %d < 0", j->num_ps);
    if (j->rank >= 0 && j->ntasks > 0 && j->rank >= j->ntasks)
        keel__problems_add(p, "SLURM_PROCID %lld >= SLURM_NTASKS %lld",
                           (long long)j->rank, (long long)j->ntasks);
    if (j->ntasks > 0 && j->num_ps >= j->ntasks)
        keel__problems_add(p, "%d ps leave no worker among %lld tasks",
                           j->num_ps, (long long)j->ntasks);
}

/* SLURM_TASKS_PER_NODE into j->tpn: one count per host, summing to
 * ntasks. */
static keel_status
explicit_tasks_per_node(slurm_step *j)
{
    long k = expand_tasks_per_node(j->v_tpn, j->tpn, MAX_HOSTS);
    int64_t sum = 0;
    if (k < 0)
        return keel__fail(KEEL_EINVAL, "slurm: SLURM_TASKS_PER_NODE "
                          "'%.64s' is malformed (want e.g. 3(x2),2)",
                          j->v_tpn);
    if ((size_t)k != j->nhosts)
        return keel__fail(KEEL_EINVAL, "slurm: SLURM_TASKS_PER_NODE names "
                          "%ld nodes but the node list has %zu", k,
                          j->nhosts);
    for (long i = 0; i < k; i++)
        sum += j->tpn[i];
    if (sum != j->ntasks)
        return keel__fail(KEEL_EINVAL, "slurm: tasks per node sum to %lld, "
                          "SLURM_NTASKS is %lld", (long long)sum,
                          (long long)j->ntasks);
    return KEEL_OK;
}

/* The hosts of the node list and the tasks on each (as given, else the
 * block distribution: ceil(ntasks / nhosts) per node in order), each
 * host's ports within 65535. */
static keel_status
place_tasks(slurm_step *j)
{
    size_t hsize = (size_t)MAX_HOSTS * 32;
    keel_status st;
    j->hosts = malloc(hsize);
    j->tpn = malloc(sizeof *j->tpn * MAX_HOSTS);
    if (j->hosts == NULL || j->tpn == NULL)
        return keel__fail(KEEL_ENOMEM, "slurm: host buffers");
    if ((st = keel_cluster_expand_hostlist(j->v_nodes, j->hosts, hsize,
                                           &j->nhosts)) != KEEL_OK)
        return keel__wrap(st, "slurm: SLURM_JOB_NODELIST");
    if (j->v_tpn != NULL) {
        if ((st = explicit_tasks_per_node(j)) != KEEL_OK)
            return st;
    } else {
        int64_t per = (j->ntasks + (int64_t)j->nhosts - 1) /
                      (int64_t)j->nhosts;
        int64_t left = j->ntasks;
        for (size_t i = 0; i < j->nhosts; i++) {
            int64_t c = left < per ? left : per;
            j->tpn[i] = (int)c;
            left -= c;
        }
    }
    for (size_t i = 0; i < j->nhosts; i++)
        if (j->port_base + j->tpn[i] - 1 > 65535)
            return keel__fail(KEEL_EINVAL, "slurm: port base %d + %d tasks "
                              "per node exceeds 65535", j->port_base,
                              j->tpn[i]);
    return KEEL_OK;
}

/* Ranks in host order, the first num_ps of them ps, the rest workers, each
 * on port base + its place on the host; this task is rank's. */
static keel_status
fill_spec(const slurm_step *j, keel_cluster_spec *s)
{
    const char *h = j->hosts;
    int64_t r = 0;
    int is_ps = j->rank < j->num_ps;
    keel_status st;
    for (size_t i = 0; i < j->nhosts; i++, h += strlen(h) + 1)
        for (int k = 0; k < j->tpn[i]; k++, r++) {
            char a[KEEL_ADDR_MAX];
            keel_task_type t = r < j->num_ps ? KEEL_TASK_PS
                                             : KEEL_TASK_WORKER;
            int len = snprintf(a, sizeof a, "%s:%d", h, j->port_base + k);
            if ((st = keel__cluster_spec_add(s, t, a, (size_t)len)) !=
                KEEL_OK)
                return st;
        }
    return keel_cluster_spec_set_task(s, is_ps ? KEEL_TASK_PS
                                               : KEEL_TASK_WORKER,
                                      (int)(is_ps ? j->rank
                                                  : j->rank - j->num_ps));
}

keel_status
keel_cluster_spec_from_slurm(const keel_cluster_slurm_config *opt,
                             keel_cluster_spec **out)
{
    keel_cluster_spec *s = NULL;
    keel__problems p = { .count = 0 };
    slurm_step j;
    keel_status st;

    if (out == NULL || opt == NULL)
        return keel__fail(KEEL_EINVAL, "slurm: NULL argument");
    *out = NULL;
    if (KEEL__STRUCT_CHECK(opt, keel_cluster_slurm_config) != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "slurm");
    read_slurm_env(opt, &j, &p);
    if (p.count > 0)
        return keel__problems_fail(&p, "slurm");
    st = place_tasks(&j);
    if (st == KEEL_OK)
        st = keel_cluster_spec_new(&s);
    if (st == KEEL_OK)
        st = fill_spec(&j, s);
    if (st == KEEL_OK)
        st = keel__cluster_spec_check(s, &p, "slurm");
    if (st == KEEL_OK) {
        *out = s;
        s = NULL;
    }
    keel_cluster_spec_free(s);
    free(j.hosts);
    free(j.tpn);
    return st;
}
