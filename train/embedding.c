/* embedding.c - the embedding layer: a table variable [vocab, dim] whose
 * forward pass gathers the rows of integer ids (keel_var_gather_rows: from
 * the ps for a row variable on a worker) and whose backward pass
 * gives the table's gradient as rows (keel_grads_add_rows), so the
 * optimizers update only the rows a step read. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/train.h>
#include "util.h"

struct keel_embedding {
    keel_var *table;
    int64_t vocab, dim;
};

void
keel_embedding_config_init(keel_embedding_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->name = "embedding";
    cfg->vocab = 0;
    cfg->dim = 16;
    cfg->rows = 0;
}

keel_status
keel_embedding_new(const keel_embedding_config *cfg, keel_vars *vs,
                   keel_embedding **out)
{
    char name[KEEL_NAME_MAX];
    keel_embedding *e;
    keel_status st;
    int64_t shape[2];
    keel_var *v;
    if (out != NULL)
        *out = NULL;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_embedding_config, "embedding");
    if (st != KEEL_OK)
        return st;
    if (vs == NULL)
        return keel__fail(KEEL_EINVAL, "embedding: store is NULL");
    if (cfg->name == NULL ||
        snprintf(name, sizeof name, "%s/embeddings", cfg->name) >=
            (int)sizeof name)
        return keel__fail(KEEL_EINVAL, "embedding: name is NULL or longer "
                          "than %d bytes", KEEL_NAME_MAX - 13);
    if (cfg->vocab < 1 || cfg->dim < 1)
        return keel__fail(KEEL_EINVAL, "embedding '%s': vocab (%lld) and "
                          "dim (%lld) must be >= 1", cfg->name,
                          (long long)cfg->vocab, (long long)cfg->dim);
    shape[0] = cfg->vocab;
    shape[1] = cfg->dim;
    v = keel_vars_find(vs, name);
    if (v != NULL) {
        keel_tensor *t = keel_var_tensor(v);
        if (!keel_shape_equal(t->ndim, t->shape, 2, shape))
            return keel__fail(KEEL_EINVAL, "embedding: variable '%s' exists "
                              "with another shape than [%lld,%lld]", name,
                              (long long)shape[0], (long long)shape[1]);
    } else {
        st = keel_vars_create(vs, name, 2, shape, KEEL_VAR_TRAINABLE |
                              (cfg->rows ? KEEL_VAR_ROWS : 0u), &v);
        if (st != KEEL_OK)
            return keel__wrap(st, "embedding '%s'", cfg->name);
    }
    e = calloc(1, sizeof *e);
    if (e == NULL)
        return keel__fail(KEEL_ENOMEM, "embedding '%s'", cfg->name);
    e->table = v;
    e->vocab = cfg->vocab;
    e->dim = cfg->dim;
    *out = e;
    return KEEL_OK;
}

void
keel_embedding_free(keel_embedding *e)
{
    free(e);
}

keel_var *
keel_embedding_var(const keel_embedding *e)
{
    return e != NULL ? e->table : NULL;
}

keel_status
keel_embedding_init_vars(keel_embedding *e, uint64_t seed)
{
    keel_tensor *t;
    keel__rng r;
    if (e == NULL)
        return keel__fail(KEEL_EINVAL, "embedding init: NULL argument");
    t = keel_var_tensor(e->table);
    keel__rng_seed(&r, seed ^ 0xe3b0c44298fc1c14ULL);
    for (size_t j = 0; j < t->count; j++)
        t->data[j] = keel__rng_uniform(&r, -0.05f, 0.05f);
    keel_var_set_initialized(e->table, 1);
    return KEEL_OK;
}

static keel_status
check_ids(const keel_embedding *e, size_t n, const int64_t *ids,
          const char *what)
{
    for (size_t k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= e->vocab)
            return keel__fail(KEEL_EINVAL, "embedding '%s' %s: id %lld "
                              "(entry %zu) is outside [0, %lld)",
                              keel_var_name(e->table), what,
                              (long long)ids[k], k, (long long)e->vocab);
    return KEEL_OK;
}

keel_status
keel_embedding_lookup(const keel_embedding *e, size_t n, const int64_t *ids,
                      float *out)
{
    keel_status st;
    if (e == NULL || (n > 0 && (ids == NULL || out == NULL)))
        return keel__fail(KEEL_EINVAL, "embedding lookup: NULL argument");
    if ((st = check_ids(e, n, ids, "lookup")) != KEEL_OK)
        return st;
    return keel_var_gather_rows(e->table, n, ids, out);
}

keel_status
keel_embedding_backward(const keel_embedding *e, size_t n,
                        const int64_t *ids, const float *dout,
                        keel_grads *grads)
{
    keel_status st;
    if (e == NULL || grads == NULL || (n > 0 && (ids == NULL ||
                                                 dout == NULL)))
        return keel__fail(KEEL_EINVAL, "embedding backward: NULL argument");
    if ((st = check_ids(e, n, ids, "backward")) != KEEL_OK)
        return st;
    return keel_grads_add_rows(grads, keel_var_index(e->table), n, ids,
                               dout);
}
