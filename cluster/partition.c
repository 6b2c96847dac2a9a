/* partition.c - partitioned variables: a large variable of the caller's
 * store split by rows into parts, each an ordinary variable "NAME/part_k"
 * of a second store (the one the ps hold and the wire carries), and the
 * copies between the two stores. Computed from the variable list and the
 * options alone, so every task splits the same way. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_int.h"
#include "role_int.h"

int
keel__partition_count(keel_var *v, int64_t part_bytes, int max_parts)
{
    keel_tensor *t = keel_var_tensor(v);
    uint64_t bytes = (uint64_t)t->count * sizeof(float), k;
    if (part_bytes <= 0 || max_parts < 2 || t->ndim < 1 || t->shape[0] < 2 ||
        (keel_var_flags(v) & KEEL_VAR_LOCAL) || bytes <= (uint64_t)part_bytes)
        return 1;
    k = (bytes + (uint64_t)part_bytes - 1) / (uint64_t)part_bytes;
    if (k > (uint64_t)max_parts)
        k = (uint64_t)max_parts;
    if (k > (uint64_t)t->shape[0])
        k = (uint64_t)t->shape[0];
    return (int)k;
}

void
keel__partition_rows(int64_t rows, int k, int i, int64_t *first,
                     int64_t *n)
{
    int64_t base = rows / k, extra = rows % k;
    *n = base + (i < extra ? 1 : 0);
    *first = (int64_t)i * base + (i < extra ? i : extra);
}

int
keel__partition_part_of(const keel__partition *p, const keel_vars *vs,
                        size_t j, const char **whole, int64_t *row_begin,
                        int64_t *row_end)
{
    for (size_t i = 0; p != NULL && i < p->n; i++) {
        keel_tensor *t;
        int64_t first, n;
        if (j < p->first[i] || j >= p->first[i] + (size_t)p->parts[i])
            continue;
        if (p->parts[i] < 2)
            return 0;
        t = keel_var_tensor(keel_vars_at(vs, i));
        keel__partition_rows(t->shape[0], p->parts[i],
                             (int)(j - p->first[i]), &first, &n);
        *whole = keel_var_name(keel_vars_at(vs, i));
        *row_begin = first;
        *row_end = first + n;
        return 1;
    }
    return 0;
}

void
keel__partition_free(keel__partition *p)
{
    if (p == NULL)
        return;
    keel_vars_free(p->wire);
    free(p->first);
    free(p->parts);
    free(p);
}

/* Variable v's K parts (or v itself, K 1) into p->wire, with its slots. */
static keel_status
add_parts(keel__partition *p, keel_var *v, int k, int with_slots)
{
    keel_tensor *t = keel_var_tensor(v);
    keel_status st = KEEL_OK;
    for (int i = 0; i < k && st == KEEL_OK; i++) {
        char name[KEEL_NAME_MAX];
        int64_t shape[KEEL_MAX_DIMS], first;
        keel_var *pv = NULL;
        memcpy(shape, t->shape, sizeof shape);
        keel__partition_rows(t->shape[0], k, i, &first, &shape[0]);
        if (k == 1)
            snprintf(name, sizeof name, "%s", keel_var_name(v));
        else if (snprintf(name, sizeof name, "%s/part_%d", keel_var_name(v),
                          i) >= (int)sizeof name)
            return keel__fail(KEEL_EINVAL, "partition: '%s/part_%d' is "
                              "longer than a variable name may be",
                              keel_var_name(v), i);
        st = keel_vars_create(p->wire, name, t->ndim, shape,
                              keel_var_flags(v), &pv);
        for (size_t s = 0; with_slots && st == KEEL_OK &&
                           s < keel_var_slot_count(v); s++) {
            const char *sname;
            keel_tensor *unused;
            (void)keel_var_slot_at(v, s, &sname);
            st = keel_var_add_slot(pv, sname, &unused);
        }
    }
    if (st != KEEL_OK)
        return keel__wrap(st, "partition of '%s' into %d parts",
                          keel_var_name(v), k);
    return KEEL_OK;
}

keel_status
keel__partition_new(const keel_vars *vs, int n_ps, int64_t part_bytes,
                    int max_parts, int with_slots, keel__partition **out)
{
    size_t n = keel_vars_count(vs), split = 0;
    keel__partition *p;
    keel_status st = KEEL_OK;
    *out = NULL;
    if (max_parts == 0)
        max_parts = n_ps;
    for (size_t i = 0; i < n; i++)
        if (keel__partition_count(keel_vars_at(vs, i), part_bytes,
                                  max_parts) > 1)
            split++;
    if (split == 0)
        return KEEL_OK;
    p = calloc(1, sizeof *p);
    if (p == NULL || (p->first = calloc(n, sizeof *p->first)) == NULL ||
        (p->parts = calloc(n, sizeof *p->parts)) == NULL) {
        keel__partition_free(p);
        return keel__fail(KEEL_ENOMEM, "partition: %zu variables", n);
    }
    p->n = n;
    st = keel_vars_new(&p->wire);
    for (size_t i = 0; i < n && st == KEEL_OK; i++) {
        keel_var *v = keel_vars_at(vs, i);
        p->first[i] = keel_vars_count(p->wire);
        p->parts[i] = keel__partition_count(v, part_bytes, max_parts);
        st = add_parts(p, v, p->parts[i], with_slots);
    }
    if (st != KEEL_OK) {
        keel__partition_free(p);
        return st;
    }
    *out = p;
    return KEEL_OK;
}

/* Copy between a of the caller's shape and its parts (to_parts: a into
 * the parts, else the parts into a); part i's data is rows [first,
 * first + n) of a, contiguous in row-major order. */
static void
copy_rows(float *a, int64_t rows, size_t count, int k, keel_tensor *const
          *parts, int to_parts)
{
    size_t row = count / (size_t)rows;
    for (int i = 0; i < k; i++) {
        int64_t first, n;
        float *at;
        keel__partition_rows(rows, k, i, &first, &n);
        at = a + (size_t)first * row;
        if (to_parts)
            memcpy(parts[i]->data, at, (size_t)n * row * sizeof(float));
        else
            memcpy(at, parts[i]->data, (size_t)n * row * sizeof(float));
    }
}

/* Variable i of vs (its value, or slot s when s >= 0) to or from its
 * entries in p->wire. */
static void
copy_var(const keel__partition *p, keel_vars *vs, size_t i, long s,
         int to_parts)
{
    keel_var *v = keel_vars_at(vs, i);
    keel_tensor *t = s < 0 ? keel_var_tensor(v)
                           : keel_var_slot_at(v, (size_t)s, NULL);
    keel_tensor *parts[KEEL_CLUSTER_MAX_PARTITIONS];
    int k = p->parts[i];
    for (int j = 0; j < k; j++) {
        keel_var *pv = keel_vars_at(p->wire, p->first[i] + (size_t)j);
        parts[j] = s < 0 ? keel_var_tensor(pv)
                         : keel_var_slot_at(pv, (size_t)s, NULL);
        if (s >= 0)
            continue;
        if (to_parts)
            keel_var_set_initialized(pv, keel_var_is_initialized(v));
        else if (j == 0)
            keel_var_set_initialized(v, keel_var_is_initialized(pv));
        else if (!keel_var_is_initialized(pv))
            keel_var_set_initialized(v, 0);
    }
    copy_rows(t->data, t->ndim > 0 ? t->shape[0] : 1, t->count, k, parts,
              to_parts);
}

/* Every variable (and, with_slots, its slots; trainable_only: only the
 * trainable ones) and the global step; into vs, never a local variable
 * (per-process state that the wire does not carry). */
static void
copy_all(const keel__partition *p, keel_vars *vs, int with_slots,
         int trainable_only, int to_parts)
{
    for (size_t i = 0; i < p->n; i++) {
        keel_var *v = keel_vars_at(vs, i);
        if ((!to_parts && (keel_var_flags(v) & KEEL_VAR_LOCAL)) ||
            (trainable_only && !keel_var_is_trainable(v)))
            continue;
        copy_var(p, vs, i, -1, to_parts);
        for (size_t s = 0; with_slots && s < keel_var_slot_count(v); s++)
            copy_var(p, vs, i, (long)s, to_parts);
    }
    if (to_parts)
        keel_vars_set_global_step(p->wire, keel_vars_global_step(vs));
    else
        keel_vars_set_global_step(vs, keel_vars_global_step(p->wire));
}

void
keel__partition_scatter(const keel__partition *p, keel_vars *vs,
                        int with_slots)
{
    copy_all(p, vs, with_slots, 0, 1);
}

void
keel__partition_gather(const keel__partition *p, keel_vars *vs,
                       int with_slots, int trainable_only)
{
    copy_all(p, vs, with_slots, trainable_only, 0);
}

void
keel__partition_gather_var(const keel__partition *p, keel_vars *vs,
                           size_t i)
{
    copy_var(p, vs, i, -1, 0);
}

void
keel__partition_grads(const keel__partition *p, keel_grads *from,
                      keel_grads *to)
{
    for (size_t i = 0; i < p->n; i++) {
        keel_tensor *g = keel_grads_at(from, i);
        keel_tensor *parts[KEEL_CLUSTER_MAX_PARTITIONS];
        if (g == NULL)
            continue;
        for (int j = 0; j < p->parts[i]; j++)
            parts[j] = keel_grads_at(to, p->first[i] + (size_t)j);
        copy_rows(g->data, g->ndim > 0 ? g->shape[0] : 1, g->count,
                  p->parts[i], parts, 1);
    }
    (void)keel_grads_set_examples(to, keel_grads_examples(from));
}
