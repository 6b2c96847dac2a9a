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
keel_cluster_slurm_options_init(keel_cluster_slurm_options *opt)
{
    KEEL__STRUCT_INIT(opt);
    opt->num_ps = KEEL__CLUSTER_SLURM_NUM_PS;
    opt->port_base = KEEL__CLUSTER_SLURM_PORT_BASE;
}

keel_status
keel_cluster_spec_from_slurm(const keel_cluster_slurm_options *opt,
                             keel_cluster_spec **out)
{
    keel_cluster_spec *s = NULL;
    keel__problems p = { .count = 0 };
    const char *v_rank, *v_n, *v_nodes, *v_tpn;
    int64_t rank = -1, ntasks = -1;
    int port_base, num_ps;
    char *hosts = NULL;
    int *tpn = NULL;
    size_t nhosts = 0, hsize = (size_t)MAX_HOSTS * 32;
    keel_status st;

    if (out == NULL || opt == NULL)
        return keel__fail(KEEL_EINVAL, "slurm: NULL argument");
    *out = NULL;
    if (KEEL__STRUCT_CHECK(opt, keel_cluster_slurm_options) != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "slurm");
    port_base = opt->port_base ? opt->port_base
                               : KEEL__CLUSTER_SLURM_PORT_BASE;
    num_ps = opt->num_ps;
    v_rank = env_get(opt->env, "SLURM_PROCID");
    v_n = env_get(opt->env, "SLURM_STEP_NUM_TASKS");
    if (v_n == NULL)
        v_n = env_get(opt->env, "SLURM_NTASKS");
    v_nodes = env_get(opt->env, "SLURM_STEP_NODELIST");
    if (v_nodes == NULL)
        v_nodes = env_get(opt->env, "SLURM_JOB_NODELIST");
    v_tpn = env_get(opt->env, "SLURM_STEP_TASKS_PER_NODE");
    if (v_tpn == NULL)
        v_tpn = env_get(opt->env, "SLURM_TASKS_PER_NODE");

    if (v_rank == NULL)
        keel__problems_add(&p, "SLURM_PROCID not set (not running inside "
                           "a Slurm step?)");
    else if (!keel__parse_i64(v_rank, 0, MAX_TASKS_PER_JOB - 1, &rank))
        keel__problems_add(&p, "SLURM_PROCID '%.16s' is not a rank", v_rank);
    if (v_n == NULL)
        keel__problems_add(&p, "SLURM_NTASKS not set");
    else if (!keel__parse_i64(v_n, 1, MAX_TASKS_PER_JOB, &ntasks))
        keel__problems_add(&p, "SLURM_NTASKS '%.16s' is not a count", v_n);
    if (v_nodes == NULL)
        keel__problems_add(&p, "SLURM_JOB_NODELIST not set");
    if (port_base < 1 || port_base > 65535)
        keel__problems_add(&p, "port base %d out of 1..65535", port_base);
    if (num_ps < 0)
        keel__problems_add(&p, "number of ps %d < 0", num_ps);
    if (rank >= 0 && ntasks > 0 && rank >= ntasks)
        keel__problems_add(&p, "SLURM_PROCID %lld >= SLURM_NTASKS %lld",
                           (long long)rank, (long long)ntasks);
    if (ntasks > 0 && num_ps >= ntasks)
        keel__problems_add(&p, "%d ps leave no worker among %lld tasks",
                           num_ps, (long long)ntasks);
    if (p.count > 0)
        return keel__problems_fail(&p, "slurm");

    hosts = malloc(hsize);
    tpn = malloc(sizeof *tpn * MAX_HOSTS);
    if (hosts == NULL || tpn == NULL) {
        st = keel__fail(KEEL_ENOMEM, "slurm: host buffers");
        goto out;
    }
    if ((st = keel_cluster_expand_hostlist(v_nodes, hosts, hsize, &nhosts))
        != KEEL_OK) {
        st = keel__wrap(st, "slurm: SLURM_JOB_NODELIST");
        goto out;
    }
    if (v_tpn != NULL) {
        long k = expand_tasks_per_node(v_tpn, tpn, MAX_HOSTS);
        int64_t sum = 0;
        if (k < 0) {
            st = keel__fail(KEEL_EINVAL, "slurm: SLURM_TASKS_PER_NODE "
                            "'%.64s' is malformed (want e.g. 3(x2),2)", v_tpn);
            goto out;
        }
        if ((size_t)k != nhosts) {
            st = keel__fail(KEEL_EINVAL, "slurm: SLURM_TASKS_PER_NODE names "
                            "%ld nodes but the node list has %zu", k, nhosts);
            goto out;
        }
        for (long i = 0; i < k; i++)
            sum += tpn[i];
        if (sum != ntasks) {
            st = keel__fail(KEEL_EINVAL, "slurm: tasks per node sum to %lld, "
                            "SLURM_NTASKS is %lld", (long long)sum,
                            (long long)ntasks);
            goto out;
        }
    } else {
        /* block distribution: ceil(ntasks / nhosts) per node in order */
        int64_t per = (ntasks + (int64_t)nhosts - 1) / (int64_t)nhosts;
        int64_t left = ntasks;
        for (size_t i = 0; i < nhosts; i++) {
            int64_t c = left < per ? left : per;
            tpn[i] = (int)c;
            left -= c;
        }
    }
    for (size_t i = 0; i < nhosts; i++)
        if (port_base + tpn[i] - 1 > 65535) {
            st = keel__fail(KEEL_EINVAL, "slurm: port base %d + %d tasks "
                            "per node exceeds 65535", port_base, tpn[i]);
            goto out;
        }
    if ((st = keel_cluster_spec_new(&s)) != KEEL_OK)
        goto out;
    {
        const char *h = hosts;
        int64_t r = 0;
        for (size_t i = 0; i < nhosts; i++, h += strlen(h) + 1)
            for (int k = 0; k < tpn[i]; k++, r++) {
                char a[KEEL_ADDR_MAX];
                keel_task_type t = r < num_ps ? KEEL_TASK_PS
                                              : KEEL_TASK_WORKER;
                int len = snprintf(a, sizeof a, "%s:%d", h, port_base + k);
                if ((st = keel__cluster_spec_add(s, t, a, (size_t)len)) !=
                    KEEL_OK)
                    goto out;
            }
        st = keel_cluster_spec_set_task(s, rank < num_ps ? KEEL_TASK_PS
                                                         : KEEL_TASK_WORKER,
                                        (int)(rank < num_ps ? rank
                                                            : rank - num_ps));
        if (st != KEEL_OK)
            goto out;
    }
    keel__cluster_validate_into(s, &p);
    if ((st = keel__problems_fail(&p, "slurm")) != KEEL_OK)
        goto out;
    *out = s;
    s = NULL;
out:
    keel_cluster_spec_free(s);
    free(hosts);
    free(tpn);
    return st;
}

