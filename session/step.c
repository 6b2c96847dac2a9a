/* step.c - the step a step callback gets (keel_step: its variables, batch,
 * gradients, replica, values) and in-process replicas
 * (keel_session_config.replicas > 1): one step per replica on a pool of
 * threads, their gradients reduced along one tree into the session's and
 * their values averaged. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "monitored_int.h"
#include "step_pool.h"

_Static_assert(KEEL_MAX_METRICS == KEEL__METRICS_MAX,
               "the gradients carry every metric a step sets");

/* ---- the step ----------------------------------------------------------- */

keel_vars *
keel_step_vars(keel_step *st)
{
    return st->s->vars;
}

const void *
keel_step_batch(const keel_step *st)
{
    return st->batch;
}

keel_grads *
keel_step_grads(keel_step *st)
{
    return st->grads;
}

int
keel_step_replica(const keel_step *st)
{
    return st->replica;
}

int
keel_step_num_replicas(const keel_step *st)
{
    return st->n_replicas;
}

keel__pool *
keel__step_pool(const keel_step *st)
{
    return st->s->rep != NULL ? st->s->rep->pool : NULL;
}

int64_t
keel_step_global_step(const keel_step *st)
{
    return st->global_step;
}

/* Set name's value in t this step; its slot in *slot. */
static keel_status
value_set(keel__values *t, const char *name, double v, int *slot)
{
    if (name == NULL)
        return keel__fail(KEEL_EINVAL, "step value: NULL name");
    *slot = keel__values_slot(t, name, 1);
    if (*slot < 0)
        return keel__fail(strlen(name) >= KEEL_VALUE_NAME_MAX ? KEEL_EINVAL
                          : KEEL_ENOMEM, "step value '%s': name longer than "
                          "%d bytes or more than %d names", name,
                          KEEL_VALUE_NAME_MAX - 1, KEEL_MAX_VALUES);
    t->v[*slot].value = v;
    t->v[*slot].set_gen = t->gen;
    return KEEL_OK;
}

keel_status
keel_step_set_value(keel_step *st, const char *name, double v)
{
    int slot = -1;
    keel_status rc = value_set(st->values, name, v, &slot);
    if (rc == KEEL_OK)
        st->values->v[slot].metric_gen = -1;   /* a value, not a metric */
    return rc;
}

/* The metrics t holds this step. */
static int
metrics_set(const keel__values *t)
{
    int n = 0;
    for (size_t k = 0; k < t->n; k++)
        n += t->v[k].metric_gen == t->gen && t->v[k].set_gen == t->gen;
    return n;
}

keel_status
keel_step_set_metric(keel_step *st, const char *name, double sum,
                     int64_t count)
{
    keel__values *t = st->values;
    keel_status rc;
    int slot = -1;
    if (count < 1)
        return keel__fail(KEEL_EINVAL, "step metric '%s': %lld examples "
                          "(a metric is a sum over at least one)",
                          name != NULL ? name : "(null)", (long long)count);
    if (name != NULL && (slot = keel__values_slot(t, name, 0)) >= 0 &&
        t->v[slot].metric_gen == t->gen && t->v[slot].set_gen == t->gen)
        slot = -1;                   /* set again: already counted */
    else if (metrics_set(t) >= KEEL_MAX_METRICS)
        return keel__fail(KEEL_ENOMEM, "step metric '%s': more than %d "
                          "metrics in one step", name != NULL ? name
                          : "(null)", KEEL_MAX_METRICS);
    rc = value_set(t, name, sum / (double)count, &slot);
    if (rc != KEEL_OK)
        return rc;
    t->v[slot].metric_gen = t->gen;
    t->v[slot].sum = sum;
    t->v[slot].count = (double)count;
    return KEEL_OK;
}

void
keel_step_mark_applied(keel_step *st)
{
    st->is_applied = 1;
}

/* ---- in-process replicas ------------------------------------------------ */

/* Replica i's own mean of metric name: the value "<name>/replica_<i>"
 * (none past KEEL_METRIC_REPLICAS_NAMED, nor for a name too long for
 * it). */
static keel_status
replica_value(keel__values *t, const char *name, int i, double mean)
{
    char buf[KEEL_VALUE_NAME_MAX];
    int len, slot;
    keel_status st;
    if (i >= KEEL_METRIC_REPLICAS_NAMED)
        return KEEL_OK;
    len = snprintf(buf, sizeof buf, "%s/replica_%d", name, i);
    if (len < 0 || (size_t)len >= sizeof buf)
        return KEEL_OK;
    st = value_set(t, buf, mean, &slot);
    if (st != KEEL_OK)
        return keel__wrap(st, "metric '%s' of replica %d", name, i);
    t->v[slot].metric_gen = -1;
    return KEEL_OK;
}

void
keel__session_replicas_free(replicas *r)
{
    if (r == NULL)
        return;
    keel__pool_free(r->pool);
    for (int i = 0; i < r->n; i++)
        keel_grads_free(r->grads[i]);
    free(r);
}

keel_status
keel__session_replicas_new(keel_session *s, int n)
{
    replicas *r = calloc(1, sizeof *r);
    keel_status st;
    if (r == NULL)
        return keel__fail(KEEL_ENOMEM, "session: %d replicas", n);
    r->s = s;
    for (int i = 0; i < n; i++) {
        if ((st = keel_grads_new(s->vars, &r->grads[i])) != KEEL_OK) {
            keel__session_replicas_free(r);
            return keel__wrap(st, "session: replica %d's gradients", i);
        }
        r->n = i + 1;
        r->st[i].s = s;
        r->st[i].replica = i;
        r->st[i].n_replicas = n;
        r->st[i].grads = r->grads[i];
        r->st[i].values = &r->values[i];
    }
    if ((st = keel__pool_new(n, &r->pool)) != KEEL_OK) {
        keel__session_replicas_free(r);
        return keel__wrap(st, "session: %d replica threads", n);
    }
    r->bar.n = keel__pool_threads(r->pool);
    s->rep = r;
    return KEEL_OK;
}

/* Thread t runs replicas t, t + T, ...: zeroes their gradients if a
 * failed step left them unreduced and calls the step, keeping its status
 * and message (messages are per thread). */
static void
replica_worker(void *ctx, int t)
{
    replicas *r = ctx;
    int T = keel__pool_threads(r->pool);
    for (int i = t; i < r->n; i += T) {
        if (r->dirty[i])
            keel_grads_zero(r->grads[i]);
        r->dirty[i] = 1;             /* until the reduction zeroes it */
        r->status[i] = r->s->step(r->s->step_ctx, &r->st[i]);
        if (r->status[i] != KEEL_OK)
            snprintf(r->error[i], sizeof r->error[i], "%s",
                     keel_last_error());
        else if (r->st[i].is_applied)
            snprintf(r->error[i], sizeof r->error[i], "%s", "it marked "
                     "the update applied, which one replica of several "
                     "cannot do");
        else
            keel_grads_densify(r->grads[i]);   /* the reduction is dense */
    }
}

/* Floats a reduce worker sums before zeroing the replicas' copies of
 * them: the lines just read are still in L1 when they are zeroed. */
#define REDUCE_CHUNK 2048

/* Thread t's share of every gradient: the replicas' gradients added along
 * the tree whose leaf i is replica i, into the session's; the replicas'
 * shares zeroed behind it for their next step (one pass, not two). */
static void
reduce_worker(void *ctx, int t)
{
    replicas *r = ctx;
    keel_session *s = r->s;
    int T = keel__pool_threads(r->pool);
    keel__tree_node nodes[KEEL_MAX_REPLICAS];
    const float *parts[KEEL_MAX_REPLICAS];
    for (int i = 0; i < r->n; i++) {
        nodes[i].lo = i;
        nodes[i].hi = i + 1;
    }
    for (size_t v = 0; v < keel_grads_count(s->grads); v++) {
        keel_tensor *dst = keel_grads_at(s->grads, v);
        size_t lo, hi;
        if (dst == NULL)
            continue;
        for (int i = 0; i < r->n; i++)
            parts[i] = keel_grads_at(r->grads[i], v)->data;
        /* cache-line multiples of 16 floats per thread */
        lo = (dst->count * (size_t)t / (size_t)T) & ~(size_t)15;
        hi = t + 1 == T ? dst->count
                        : (dst->count * (size_t)(t + 1) / (size_t)T) &
                              ~(size_t)15;
        for (size_t c = lo; c < hi; c += REDUCE_CHUNK) {
            size_t e = hi - c < REDUCE_CHUNK ? hi : c + REDUCE_CHUNK;
            (void)keel__tree_sum(r->n, nodes, parts, r->n, dst->data, c, e);
            for (int i = 0; i < r->n; i++)
                memset(keel_grads_at(r->grads[i], v)->data + c, 0,
                       (e - c) * sizeof(float));
        }
    }
}

/* One pool run per step: every thread steps its replicas, all meet at the
 * barrier, then (every step succeeded) each reduces its share. */
static void
round_worker(void *ctx, int t)
{
    replicas *r = ctx;
    replica_worker(ctx, t);
    if (r->bar.n > 1)
        keel__spin_barrier_wait(&r->bar);
    for (int i = 0; i < r->n; i++)
        if (r->status[i] != KEEL_OK || r->st[i].is_applied)
            return;
    reduce_worker(ctx, t);
    if (t == 0)
        r->reduced = 1;
}

/* One step on every replica, then their gradients reduced into the
 * session's and their values averaged into the session's. */
keel_status
keel__session_replicas_step(keel_session *s, const void *batch, int64_t gs)
{
    replicas *r = s->rep;
    keel__values *t0 = &r->values[0];
    for (int i = 0; i < r->n; i++) {
        r->st[i].batch = batch;
        r->st[i].is_applied = 0;
        r->st[i].global_step = gs;
        r->status[i] = KEEL_OK;
        r->error[i][0] = 0;
        r->values[i].gen++;
    }
    r->reduced = 0;
    keel__pool_run(r->pool, round_worker, r);
    for (int i = 0; i < r->n; i++) {
        if (r->status[i] != KEEL_OK)
            return keel__fail(r->status[i], "replica %d of %d: %s", i, r->n,
                              r->error[i]);
        if (r->st[i].is_applied)
            return keel__fail(KEEL_EINVAL, "replica %d of %d: %s", i, r->n,
                              r->error[i]);
    }
    for (int i = 0; i < r->n; i++)
        r->dirty[i] = !r->reduced;
    for (size_t k = 0; k < t0->n; k++) {
        double sum = 0.0, msum = 0.0, mcount = 0.0;
        int is_metric = t0->v[k].metric_gen == t0->gen;
        keel_status st;
        if (t0->v[k].set_gen != t0->gen)
            continue;
        for (int i = 0; i < r->n; i++) {
            const keel__values *ti = &r->values[i];
            int slot = keel__values_slot(&r->values[i], t0->v[k].name, 0);
            if (slot < 0 || ti->v[slot].set_gen != ti->gen)
                return keel__fail(KEEL_EINVAL, "replica %d of %d did not set "
                                  "the value '%s' that replica 0 set", i,
                                  r->n, t0->v[k].name);
            if (is_metric != (ti->v[slot].metric_gen == ti->gen))
                return keel__fail(KEEL_EINVAL, "replica %d of %d set '%s' "
                                  "as a %s, replica 0 as a %s", i, r->n,
                                  t0->v[k].name, is_metric ? "value"
                                  : "metric", is_metric ? "metric"
                                  : "value");
            sum += ti->v[slot].value;
            msum += ti->v[slot].sum;
            mcount += ti->v[slot].count;
        }
        /* a metric: the example-weighted mean (its sums over all the
         * replicas' examples); a value: the replicas' mean */
        st = is_metric ? keel_step_set_metric(&s->st, t0->v[k].name, msum,
                                              (int64_t)mcount)
                       : keel_step_set_value(&s->st, t0->v[k].name,
                                             sum / r->n);
        for (int i = 0; is_metric && st == KEEL_OK && i < r->n; i++)
            st = replica_value(&s->values, t0->v[k].name, i,
                               r->values[i].v[keel__values_slot(
                                   &r->values[i], t0->v[k].name, 0)].value);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* ---- metrics across replicas -------------------------------------------- */

void
keel__session_metrics_out(keel_session *s)
{
    keel__metrics *m = keel__grads_metrics(s->grads);
    const keel__values *t = &s->values;
    int n = 0;
    if (m == NULL)
        return;
    for (size_t k = 0; k < t->n && n < KEEL__METRICS_MAX; k++) {
        if (t->v[k].metric_gen != t->gen || t->v[k].set_gen != t->gen)
            continue;
        s->metric_slot[n] = (int)k;
        m->sum[n] = t->v[k].sum;
        m->count[n] = t->v[k].count;
        n++;
    }
    s->n_metrics = n;
    m->n = n;
    m->n_combined = 0;
    m->n_kept = 0;
}

keel_status
keel__session_metrics_in(keel_session *s)
{
    keel__metrics *m = keel__grads_metrics(s->grads);
    keel__values *t = &s->values;
    keel_status st;
    if (m == NULL || m->n_combined == 0 || m->n != s->n_metrics)
        return KEEL_OK;
    for (int k = 0; k < m->n; k++) {
        keel__value *v = &t->v[s->metric_slot[k]];
        if (m->total_count[k] > 0) {
            v->value = m->total_sum[k] / m->total_count[k];
            v->sum = m->total_sum[k];
            v->count = m->total_count[k];
        }
        for (int i = 0; i < m->n_kept; i++)
            if (m->rcount[i][k] > 0 &&
                (st = replica_value(t, v->name, m->replica[i],
                                    m->rsum[i][k] / m->rcount[i][k]))
                != KEEL_OK)
                return st;
    }
    return KEEL_OK;
}
