/* shard.c - sharded checkpoints: each parameter server writes the shard
 * of the variables it holds (keel_ckpt_write_shard), then the chief's
 * saver commits the index (keel_saver_save_sharded), which holds the
 * chief's own variables and an HDF5 external link per dataset of every
 * shard, after checking each shard is this checkpoint's (step, run id,
 * number, count). Readers open the index as one checkpoint (h5read.c). */
#include <config.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_int.h"
#include <xxhash.h>

#include "grow.h"

void
keel_ckpt_shard_config_init(keel_ckpt_shard_config *cfg)
{
    if (cfg == NULL)
        return;
    KEEL__STRUCT_INIT(cfg);
    cfg->basename = KEEL_CKPT_DEFAULT_BASENAME;
    cfg->step = -1;
    cfg->shard_index = -1;
}

/* Whether variable name is one cfg asks for (all when names is NULL). */
static int
wanted(const keel_ckpt_shard_config *cfg, const char *name)
{
    if (cfg->names == NULL)
        return 1;
    for (size_t i = 0; i < cfg->n_names; i++)
        if (cfg->names[i] != NULL && strcmp(cfg->names[i], name) == 0)
            return 1;
    return 0;
}

static keel_status
check_shard_config(const keel_ckpt_shard_config *cfg, const keel_vars *vs)
{
    keel_status st = KEEL__STRUCT_CHECK(cfg, keel_ckpt_shard_config);
    if (st != KEEL_OK)
        return keel__wrap(st, "keel_ckpt_write_shard");
    if (vs == NULL || cfg->dir == NULL || cfg->dir[0] == '\0')
        return keel__fail(KEEL_EINVAL, "keel_ckpt_write_shard: a variable "
                          "store and a directory are required");
    if (cfg->basename == NULL || !keel_name_is_valid(cfg->basename) ||
        strchr(cfg->basename, '/') != NULL)
        return keel__fail(KEEL_EINVAL, "shard: basename '%s' must be one "
                          "path segment of [A-Za-z0-9_.-]",
                          cfg->basename ? cfg->basename : "(null)");
    if (cfg->shard_count < 1 || cfg->shard_count > CK_MAX_SHARDS ||
        cfg->shard_index < 0 || cfg->shard_index >= cfg->shard_count)
        return keel__fail(KEEL_EINVAL, "shard: shard_index %d of "
                          "shard_count %d: need 0 <= index < count <= %d",
                          cfg->shard_index, cfg->shard_count,
                          CK_MAX_SHARDS);
    if (cfg->epoch < 0)
        return keel__fail(KEEL_EINVAL, "shard: epoch %lld is negative",
                          (long long)cfg->epoch);
    for (size_t i = 0; cfg->names != NULL && i < cfg->n_names; i++)
        if (cfg->names[i] == NULL ||
            keel_vars_find(vs, cfg->names[i]) == NULL)
            return keel__fail(KEEL_ENOTFOUND, "shard %d: variable '%s' is "
                              "not in the store", cfg->shard_index,
                              cfg->names[i] ? cfg->names[i] : "(null)");
    return KEEL_OK;
}

keel_status
keel_ckpt_write_shard(const keel_ckpt_shard_config *cfg,
                      const keel_vars *vs, char *path, size_t path_size)
{
    char index[KEEL_NAME_MAX], name[KEEL_NAME_MAX], full[KEEL_PATH_MAX];
    ck_plan p;
    keel_status st = check_shard_config(cfg, vs);
    size_t nv;

    if (st != KEEL_OK)
        return st;
    memset(&p, 0, sizeof p);
    p.step = cfg->step >= 0 ? cfg->step : keel_vars_global_step(vs);
    if (p.step < 0)
        return keel__fail(KEEL_EINVAL, "shard %d: negative step %lld",
                          cfg->shard_index, (long long)p.step);
    p.wall_time = keel__now_wall();
    p.epoch = cfg->epoch;
    p.run_id = cfg->run_id;
    p.shard_count = cfg->shard_count;
    p.shard_index = cfg->shard_index;
    if (cfg->epoch > 0)
        st = keel__fmt(index, sizeof index, "checkpoint name",
                       "%s-epoch%lld-%lld.h5", cfg->basename,
                       (long long)cfg->epoch, (long long)p.step);
    else
        st = keel__fmt(index, sizeof index, "checkpoint name", "%s-%lld.h5",
                       cfg->basename, (long long)p.step);
    if (st == KEEL_OK)
        st = keel__ckpt_shard_name(name, sizeof name, index,
                                   cfg->shard_index, cfg->shard_count);
    if (st == KEEL_OK)
        st = keel__path_join(full, sizeof full, cfg->dir, name);
    if (st == KEEL_OK)
        st = keel__fs_mkdirs(cfg->dir);
    nv = keel_vars_count(vs);
    for (size_t i = 0; i < nv && st == KEEL_OK; i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_tensor *t = keel_var_tensor(v), *sl;
        const char *sn;
        if ((keel_var_flags(v) & KEEL_VAR_LOCAL) ||
            !wanted(cfg, keel_var_name(v)))
            continue;
        st = keel__ckpt_plan_add(&p, keel_var_name(v), NULL, t, t->data);
        for (size_t j = 0; st == KEEL_OK &&
                           (sl = keel_var_slot_at(v, j, &sn)) != NULL; j++)
            st = keel__ckpt_plan_add(&p, keel_var_name(v), sn, sl,
                                     sl->data);
    }
    if (st == KEEL_OK)
        st = keel__ckpt_write_file(&p, full);
    free(p.items);
    if (st == KEEL_OK && path != NULL)
        st = keel__fmt(path, path_size, "shard path", "%s", full);
    if (st != KEEL_OK)
        return keel__wrap(st, "shard %d of %d of step %lld failed",
                          cfg->shard_index, cfg->shard_count,
                          (long long)p.step);
    return KEEL_OK;
}

/* Whether plan p holds dataset name/slot of its own. */
static int
plan_has(const ck_plan *p, const char *name, const char *slot)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->items[i].name, name) == 0 &&
            strcmp(p->items[i].slot != NULL ? p->items[i].slot : "",
                   slot) == 0)
            return 1;
    return 0;
}

/* The part number when name is "<base>/part_<k>" (k without leading
 * zeros), with *base_len the length of base; else -1. */
static int
part_of(const char *name, size_t *base_len)
{
    const char *t = strrchr(name, '/');
    char *end;
    long k;
    if (t == NULL || t == name || strncmp(t, "/part_", 6) != 0 ||
        !isdigit((unsigned char)t[6]) || (t[6] == '0' && t[7] != '\0'))
        return -1;
    errno = 0;
    k = strtol(t + 6, &end, 10);
    if (errno != 0 || *end != '\0' || k < 0 || k > 1000000)
        return -1;
    *base_len = (size_t)(t - name);
    return (int)k;
}

static int
link_cmp(const void *a, const void *b)
{
    const ck_link *x = a, *y = b;
    int c = strcmp(x->slot, y->slot);
    if (c == 0)
        c = strcmp(x->name, y->name);
    return c != 0 ? c : (x->part > y->part) - (x->part < y->part);
}

/* The xxh64 of the whole partitioned dataset whose parts are the n links
 * l (in part order): each part read from its shard (its own checksum
 * verified), hashed in row order. */
static keel_status
hash_parts(const char *dir, const char *index_name, int shard_count,
           const ck_link *l, int n, uint64_t *hash)
{
    XXH64_state_t *xs = XXH64_createState();
    keel_status st = KEEL_OK;
    if (xs == NULL)
        return keel__fail(KEEL_ENOMEM, "index %s: hash state", index_name);
    XXH64_reset(xs, 0);
    for (int j = 0; j < n && st == KEEL_OK; j++) {
        char name[KEEL_NAME_MAX], path[KEEL_PATH_MAX], dn[KEEL_NAME_MAX];
        ck_file s;
        ck_dset key, *hit;
        void *buf = NULL;
        st = keel__ckpt_shard_name(name, sizeof name, index_name,
                                   l[j].shard, shard_count);
        if (st == KEEL_OK)
            st = keel__path_join(path, sizeof path, dir, name);
        if (st == KEEL_OK)
            st = keel__fmt(dn, sizeof dn, "part name", "%s/part_%d",
                           l[j].name, l[j].part);
        if (st == KEEL_OK)
            st = keel__ckpt_open(path, &s);
        if (st != KEEL_OK)
            break;
        memset(&key, 0, sizeof key);
        strcpy(key.e.name, dn);
        strcpy(key.e.slot, l[j].slot);
        if (l[j].slot[0] == '\0')
            hit = bsearch(&key, s.d, s.n_vars, sizeof *s.d,
                          keel__ckpt_dset_cmp);
        else
            hit = bsearch(&key, s.d + s.n_vars, s.n - s.n_vars, sizeof *s.d,
                          keel__ckpt_dset_cmp);
        if (hit == NULL)
            st = keel__fail(KEEL_ECORRUPT, "index %s: shard %s lost %s",
                            index_name, path, dn);
        else if ((buf = malloc(hit->count * sizeof(float) + 1)) == NULL)
            st = keel__fail(KEEL_ENOMEM, "index %s: part %s", index_name,
                            dn);
        else
            st = keel__ckpt_read(&s, hit, buf);
        if (st == KEEL_OK)
            XXH64_update(xs, buf, hit->count * sizeof(float));
        free(buf);
        keel__ckpt_close(&s);
    }
    *hash = XXH64_digest(xs);
    XXH64_freeState(xs);
    return st;
}

/* The links of an index over partitioned variables: every
 * "<name>/part_<k>" dataset becomes part k of name (sorted by slot, name,
 * part); each name's parts must be 0..K-1 with K >= 2, of one rank and
 * the same trailing dimensions, and name no dataset of its own. */
static keel_status
group_parts(const char *dir, const char *index_name, const ck_plan *p,
            ck_link *l, size_t n)
{
    keel_status st = KEEL_OK;
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        int k = part_of(l[i].name, &bl);
        if (k >= 0) {
            l[i].name[bl] = '\0';
            l[i].part = k;
        }
    }
    if (n > 0)                  /* l is NULL when no shard holds a variable */
        qsort(l, n, sizeof *l, link_cmp);
    for (size_t i = 0; i < n && st == KEEL_OK;) {
        size_t j = i + 1;
        int64_t rows = 0;
        while (j < n && strcmp(l[j].slot, l[i].slot) == 0 &&
               strcmp(l[j].name, l[i].name) == 0)
            j++;
        if (l[i].part < 0 && j == i + 1) {
            i = j;
            continue;
        }
        for (size_t m = i; m < j && st == KEEL_OK; m++) {
            if (l[m].part != (int)(m - i) || j - i < 2 || l[m].ndim < 1 ||
                l[m].ndim != l[i].ndim ||
                memcmp(l[m].shape + 1, l[i].shape + 1,
                       sizeof(int64_t) * (KEEL_MAX_DIMS - 1)) != 0)
                st = keel__fail(KEEL_EINVAL, "index %s: the parts of '%s'%s"
                                "%s in the shards are not parts 0..K-1 "
                                "(K >= 2) of one shape but for the rows",
                                index_name, l[i].name,
                                l[i].slot[0] ? " slot " : "", l[i].slot);
            l[m].first = rows;
            l[m].n_parts = (int)(j - i);
            rows += l[m].shape[0];
        }
        if (st == KEEL_OK && plan_has(p, l[i].name, l[i].slot))
            st = keel__fail(KEEL_EINVAL, "index %s: partitioned variable "
                            "'%s' is also the chief's own", index_name,
                            l[i].name);
        if (st == KEEL_OK)
            st = hash_parts(dir, index_name, p->shard_count, l + i,
                            (int)(j - i), &l[i].hash);
        i = j;
    }
    return st;
}

keel_status
keel__ckpt_index_links(const char *dir, const char *index_name,
                       const ck_plan *p, ck_link **out, size_t *n_out)
{
    ck_link *links = NULL;
    size_t n = 0, cap = 0;
    keel_status st = KEEL_OK;

    *out = NULL;
    *n_out = 0;
    for (int k = 0; k < p->shard_count && st == KEEL_OK; k++) {
        char name[KEEL_NAME_MAX], path[KEEL_PATH_MAX];
        ck_file s;
        st = keel__ckpt_shard_name(name, sizeof name, index_name, k,
                                   p->shard_count);
        if (st == KEEL_OK)
            st = keel__path_join(path, sizeof path, dir, name);
        if (st == KEEL_OK)
            st = keel__ckpt_open(path, &s);
        if (st != KEEL_OK) {
            st = keel__wrap(st, "index %s: shard %d of %d is not ready",
                            index_name, k, p->shard_count);
            break;
        }
        if (s.shard_index != k || s.shard_count != p->shard_count ||
            s.run_id != p->run_id || s.global_step != p->step)
            st = keel__fail(KEEL_ECORRUPT, "index %s (step %lld, run "
                            "%016llx): %s is shard %d of %d of step %lld, "
                            "run %016llx", index_name, (long long)p->step,
                            (unsigned long long)p->run_id, path,
                            s.shard_index, s.shard_count,
                            (long long)s.global_step,
                            (unsigned long long)s.run_id);
        for (size_t i = 0; i < s.n && st == KEEL_OK; i++) {
            ck_link *l = keel__grow(links, &cap, n, sizeof *l, 64);
            if (l == NULL) {
                st = keel__fail(KEEL_ENOMEM, "index %s: links", index_name);
                break;
            }
            links = l;
            if (plan_has(p, s.d[i].e.name, s.d[i].e.slot)) {
                st = keel__fail(KEEL_EINVAL, "index %s: variable '%s'%s%s "
                                "is both the chief's own and in shard %s",
                                index_name, s.d[i].e.name,
                                s.d[i].e.slot[0] ? " slot " : "",
                                s.d[i].e.slot, path);
                break;
            }
            memset(&links[n], 0, sizeof links[n]);
            strcpy(links[n].name, s.d[i].e.name);
            strcpy(links[n].slot, s.d[i].e.slot);
            links[n].part = -1;
            links[n].ndim = s.d[i].e.ndim;
            memcpy(links[n].shape, s.d[i].e.shape, sizeof links[n].shape);
            links[n++].shard = k;
        }
        keel__ckpt_close(&s);
    }
    if (st == KEEL_OK && p->partitioned)
        st = group_parts(dir, index_name, p, links, n);
    if (st != KEEL_OK) {
        free(links);
        return st;
    }
    *out = links;
    *n_out = n;
    return KEEL_OK;
}

/* 1 when name is "<stem>.shard-<5 digits>-of-<5 digits>.h5". */
static int
is_shard_of(const char *name, const char *stem, size_t stem_len)
{
    const char *p = name + stem_len;
    if (strncmp(name, stem, stem_len) != 0 || strncmp(p, ".shard-", 7) != 0)
        return 0;
    p += 7;
    for (int i = 0; i < 5; i++)
        if (!isdigit((unsigned char)*p++))
            return 0;
    if (strncmp(p, "-of-", 4) != 0)
        return 0;
    p += 4;
    for (int i = 0; i < 5; i++)
        if (!isdigit((unsigned char)*p++))
            return 0;
    return strcmp(p, ".h5") == 0;
}

void
keel__ckpt_unlink_shards(const char *index_path)
{
    char dir[KEEL_PATH_MAX], stem[KEEL_NAME_MAX], p[KEEL_PATH_MAX];
    const char *sl = strrchr(index_path, '/');
    const char *base = sl != NULL ? sl + 1 : index_path;
    size_t bl = strlen(base);
    struct dirent *de;
    DIR *d;
    if (bl < 4 || bl >= sizeof stem || strcmp(base + bl - 3, ".h5") != 0)
        return;
    memcpy(stem, base, bl - 3);
    stem[bl - 3] = '\0';
    if (sl == NULL)
        snprintf(dir, sizeof dir, ".");
    else if (keel__fmt(dir, sizeof dir, "directory", "%.*s",
                       (int)(sl - index_path > 0 ? sl - index_path : 1),
                       index_path) != KEEL_OK)
        return;
    d = opendir(dir);
    if (d == NULL)
        return;
    while ((de = readdir(d)) != NULL) {
        if (!is_shard_of(de->d_name, stem, bl - 3) ||
            keel__path_join(p, sizeof p, dir, de->d_name) != KEEL_OK)
            continue;
        if (unlink(p) != 0 && errno != ENOENT)
            keel__log(KEEL_LOG_WARN, "retention: cannot remove shard %s: "
                      "%s", p, strerror(errno));
        else
            keel__log(KEEL_LOG_DEBUG, "retention: removed shard %s", p);
    }
    closedir(d);
}

int
keel__ckpt_is_shard_name(const char *name)
{
    const char *t = strstr(name, ".shard-");
    while (t != NULL) {
        if (is_shard_of(name, name, (size_t)(t - name)))
            return 1;
        t = strstr(t + 1, ".shard-");
    }
    return 0;
}
