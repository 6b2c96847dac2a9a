/* restore.c - finding the newest valid checkpoint (with fallback), restoring
 * one into a variable store by name (shape-checked, strict or partial, with
 * a name map), and the reader API used by `keel ckpt`. */
#include <config.h>

#include <assert.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"
#include "grow.h"

/* ---- latest ------------------------------------------------------------- */

typedef struct cand {
    char path[KEEL_PATH_MAX];
} cand;

static int
cand_has(const cand *c, size_t n, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(c[i].path, path) == 0)
            return 1;
    return 0;
}

static keel_status
cand_add(cand **c, size_t *n, size_t *cap, const char *dir, const char *nm)
{
    char p[KEEL_PATH_MAX];
    cand *nv;
    if (nm[0] == '/') {
        if (keel__fmt(p, sizeof p, "path", "%s", nm) != KEEL_OK)
            return KEEL_OK;
    } else if (keel__path_join(p, sizeof p, dir, nm) != KEEL_OK) {
        return KEEL_OK;
    }
    if (cand_has(*c, *n, p))
        return KEEL_OK;
    nv = keel__grow(*c, cap, *n, sizeof *nv, 16);
    if (nv == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint candidates");
    *c = nv;
    strcpy((*c)[*n].path, p);
    (*n)++;
    return KEEL_OK;
}

/* Every checkpoint in dir, newest first: the state file's order
 * (model_checkpoint_path, then its list newest first), then every other
 * <basename>-<step>.h5 by step. Caller frees *out. */
static keel_status
candidates(const char *dir, const char *basename, cand **out, size_t *n_out)
{
    ck_state state;
    keel_ckpt_file *files = NULL;
    size_t n_files = 0, n = 0, cap = 0;
    cand *c = NULL;
    keel_status st;

    *out = NULL;
    *n_out = 0;
    if (basename == NULL)
        basename = KEEL_CKPT_DEFAULT_BASENAME;
    st = keel__ckpt_state_read(dir, &state);
    if (st == KEEL_OK) {
        /* The state file's order: model_checkpoint_path, then the list
         * newest first. */
        if (state.latest[0] != '\0')
            st = cand_add(&c, &n, &cap, dir, state.latest);
        for (size_t i = state.n; st == KEEL_OK && i > 0; i--)
            st = cand_add(&c, &n, &cap, dir, state.e[i - 1].name);
        keel__ckpt_state_free(&state);
        if (st != KEEL_OK)
            goto out;
    } else if (st != KEEL_ENOTFOUND) {
        keel__log(KEEL_LOG_WARN, "%s; scanning %s for checkpoints instead",
                  keel_last_error(), dir);
    }
    /* Then every other <basename>-<step>.h5, newest step first. */
    st = keel_ckpt_scan(dir, basename, &files, &n_files);
    if (st != KEEL_OK)
        goto out;
    for (size_t i = n_files; st == KEEL_OK && i > 0; i--)
        st = cand_add(&c, &n, &cap, dir, files[i - 1].name);
out:
    keel_ckpt_scan_free(files);
    if (st != KEEL_OK) {
        free(c);
        return st;
    }
    *out = c;
    *n_out = n;
    return KEEL_OK;
}

/* The candidates that failed so far: how many, their paths (as many as
 * fit) and the last one's message. */
typedef struct bad_list {
    size_t n;
    char paths[KEEL_ERR_MAX / 2];
    char last_err[KEEL_ERR_MAX];
} bad_list;

static void list_append(char *buf, size_t size, const char *name);

/* A candidate that failed: its message kept as the last error, a warning
 * naming it, its path added to the list. */
static void
skip_bad(const char *path, bad_list *b)
{
    snprintf(b->last_err, sizeof b->last_err, "%s", keel_last_error());
    keel__log(KEEL_LOG_WARN, "skipping checkpoint %s: %s", path,
              b->last_err);
    list_append(b->paths, sizeof b->paths, path);
    b->n++;
}

/* The failure when no candidate in dir served: KEEL_ENOTFOUND when there
 * was none at all; KEEL_ECORRUPT naming every file when all of them
 * failed to verb ("verifies", "restores"), with the last one's cause. A
 * directory of damaged checkpoints is not an empty one: a caller that
 * starts afresh on KEEL_ENOTFOUND must not write over them. */
static keel_status
none_valid(const char *dir, const bad_list *b, const char *verb)
{
    if (b->n > 0)
        return keel__fail(KEEL_ECORRUPT, "no valid checkpoint in %s: %zu "
                          "found, none %s (%s; last: %s)", dir, b->n, verb,
                          b->paths, b->last_err);
    return keel__fail(KEEL_ENOTFOUND, "no checkpoint in %s", dir);
}

keel_status
keel_ckpt_latest(const char *dir, const char *basename, char *path,
                 size_t path_size, int64_t *step)
{
    size_t n = 0;
    cand *c = NULL;
    keel_status st;
    bad_list bad;

    if (dir == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_latest: dir is NULL");
    memset(&bad, 0, sizeof bad);
    st = candidates(dir, basename, &c, &n);
    if (st != KEEL_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        int64_t s = -1;
        st = keel__ckpt_verify(c[i].path, &s);
        if (st == KEEL_OK) {
            if (bad.n > 0)
                keel__log(KEEL_LOG_WARN, "restoring from %s (step %lld) "
                          "instead", c[i].path, (long long)s);
            st = path != NULL ? keel__fmt(path, path_size, "checkpoint path",
                                          "%s", c[i].path) : KEEL_OK;
            if (st == KEEL_OK && step != NULL)
                *step = s;
            free(c);
            return st;
        }
        if (st == KEEL_EINVAL) {
            free(c);    /* whole, but not a checkpoint keel reads: no
                         * fallback past it */
            return st;
        }
        skip_bad(c[i].path, &bad);
    }
    free(c);
    return none_valid(dir, &bad, "verifies");
}

keel_status
keel_ckpt_restore_latest(const char *dir, const char *basename,
                         keel_vars *vs, const keel_restore_config *opts,
                         keel_restore_report *report, char *path,
                         size_t path_size)
{
    size_t n = 0;
    cand *c = NULL;
    keel_status st;
    bad_list bad;

    memset(&bad, 0, sizeof bad);
    if (dir == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_restore_latest: NULL dir "
                          "or store");
    if (opts != NULL && (st = KEEL__STRUCT_CHECK(opts, keel_restore_config))
                        != KEEL_OK)
        return keel__wrap(st, "keel_ckpt_restore_latest %s", dir);
    if (opts != NULL && opts->mode != KEEL_RESTORE_STRICT) {
        /* A failed partial restore could leave variables the older
         * checkpoint lacks holding the bad one's values, not their
         * initializers: verify first, then read. */
        char p[KEEL_PATH_MAX];
        st = keel_ckpt_latest(dir, basename, p, sizeof p, NULL);
        if (st == KEEL_OK)
            st = keel_ckpt_restore(p, vs, opts, report);
        if (st == KEEL_OK && path != NULL)
            st = keel__fmt(path, path_size, "checkpoint path", "%s", p);
        return st;
    }
    st = candidates(dir, basename, &c, &n);
    if (st != KEEL_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        /* The restore verifies every checksum as it reads; a strict
         * restore writes every variable, so a later success overwrites
         * whatever a failed attempt wrote. */
        st = keel_ckpt_restore(c[i].path, vs, opts, report);
        if (st == KEEL_OK) {
            if (bad.n > 0)
                keel__log(KEEL_LOG_WARN, "restored from %s instead",
                          c[i].path);
            if (path != NULL)
                st = keel__fmt(path, path_size, "checkpoint path", "%s",
                               c[i].path);
            free(c);
            return st;
        }
        if (st != KEEL_ECORRUPT && st != KEEL_EIO && st != KEEL_ENOTFOUND) {
            free(c);               /* the model does not fit: no fallback */
            return st;
        }
        skip_bad(c[i].path, &bad);
    }
    free(c);
    return none_valid(dir, &bad, "restores");
}

/* ---- restore ------------------------------------------------------------ */

typedef struct map_ent {
    char from[KEEL_NAME_MAX];
    char to[KEEL_NAME_MAX];
} map_ent;

static keel_status
parse_map(const keel_restore_config *o, map_ent **out)
{
    map_ent *m;
    *out = NULL;
    if (o == NULL || o->n_name_map == 0)
        return KEEL_OK;
    if (o->name_map == NULL)
        return keel__fail(KEEL_EINVAL, "restore: name_map is NULL");
    m = calloc(o->n_name_map, sizeof *m);
    if (m == NULL)
        return keel__fail(KEEL_ENOMEM, "restore name map");
    for (size_t i = 0; i < o->n_name_map; i++) {
        const char *s = o->name_map[i], *eq = s ? strchr(s, '=') : NULL;
        size_t fl = eq ? (size_t)(eq - s) : 0;
        if (eq == NULL || fl == 0 || fl >= KEEL_NAME_MAX ||
            strlen(eq + 1) >= KEEL_NAME_MAX) {
            free(m);
            return keel__fail(KEEL_EINVAL, "restore name map entry '%s' is "
                              "not old/name=new/name", s ? s : "(null)");
        }
        memcpy(m[i].from, s, fl);
        strcpy(m[i].to, eq + 1);
        if (!keel_name_is_valid(m[i].from) || !keel_name_is_valid(m[i].to)) {
            free(m);
            return keel__fail(KEEL_EINVAL, "restore name map entry '%s': "
                              "both sides must be valid variable names", s);
        }
    }
    *out = m;
    return KEEL_OK;
}

/* The store name for a file name: the first map entry equal to it or to a
 * '/'-prefix of it wins. Returns 0 when the result would be too long. */
static int
map_name(const map_ent *m, size_t nm, const char *in, char *out)
{
    for (size_t i = 0; i < nm; i++) {
        size_t fl = strlen(m[i].from);
        if (strncmp(in, m[i].from, fl) == 0 &&
            (in[fl] == '\0' || in[fl] == '/')) {
            int w = snprintf(out, KEEL_NAME_MAX, "%s%s", m[i].to, in + fl);
            return w > 0 && w < KEEL_NAME_MAX;
        }
    }
    strcpy(out, in);
    return 1;
}

static void
list_append(char *buf, size_t size, const char *name)
{
    size_t len = strlen(buf), need = strlen(name) + (len ? 1 : 0);
    if (len >= 3 && strcmp(buf + len - 3, "...") == 0)
        return;
    if (len + need + 4 >= size) {
        if (len + 4 < size)
            strcat(buf, len ? ",..." : "...");
        return;
    }
    if (len)
        strcat(buf, ",");
    strcat(buf, name);
}

/* One restore's working state; its steps below run in order. */
typedef struct restore_job {
    const char *path;
    keel_vars *vs;
    const keel_restore_config *opts;
    int skip_slots;
    ck_file f;                      /* the opened file */
    map_ent *map;
    size_t n_map;
    size_t nv;                      /* store variables */
    keel_var **target;              /* per file variable: store variable */
    size_t *owner;                  /* per store variable: file variable */
    ck_read_job *jobs;
    size_t n_jobs;
    keel_restore_report rep;
    regex_t only;                   /* opts->only_vars, anchored */
    int has_only;
} restore_job;

/* 1 when store variable name is one this restore writes (only_vars). */
static int
rs_wanted(const restore_job *r, const char *name)
{
    return !r->has_only || regexec(&r->only, name, 0, NULL, 0) == 0;
}

/* Compile opts->only_vars, anchored to the whole name. */
static keel_status
rs_compile_only(restore_job *r)
{
    const char *re = r->opts != NULL ? r->opts->only_vars : NULL;
    char *whole;
    size_t n;
    int rc;
    if (re == NULL)
        return KEEL_OK;
    n = strlen(re) + 5;
    whole = malloc(n);
    if (whole == NULL)
        return keel__fail(KEEL_ENOMEM, "restore from %s: only_vars",
                          r->path);
    snprintf(whole, n, "^(%s)$", re);
    rc = regcomp(&r->only, whole, REG_EXTENDED | REG_NOSUB);
    free(whole);
    if (rc != 0)
        return keel__fail(KEEL_EINVAL, "restore from %s: only_vars '%s' is "
                          "not a POSIX extended regular expression", r->path,
                          re);
    r->has_only = 1;
    return KEEL_OK;
}

/* The store variable a file dataset restores into (its name, renamed,
 * in mapped), NULL when it has none (unknown or local). Returns 0 when the
 * renamed name is too long. */
static int
rs_lookup(const restore_job *r, const char *name, char *mapped,
          keel_var **out)
{
    keel_var *v;
    *out = NULL;
    if (!map_name(r->map, r->n_map, name, mapped))
        return 0;
    v = keel_vars_find(r->vs, mapped);
    if (v != NULL && !(keel_var_flags(v) & KEEL_VAR_LOCAL)
        && rs_wanted(r, mapped))
        *out = v;
    return 1;
}

/* Match file variables to store variables and check every shape before
 * anything is written; no two file variables may land on one. */
static keel_status
rs_match_variables(restore_job *r)
{
    const ck_file *f = &r->f;
    char mapped[KEEL_NAME_MAX];
    for (size_t j = 0; j < r->nv; j++)
        r->owner[j] = SIZE_MAX;
    for (size_t i = 0; i < f->n_vars; i++) {
        const keel_ckpt_entry *e = &f->d[i].e;
        const keel_tensor *t;
        keel_var *v;
        size_t *own;
        if (!rs_lookup(r, e->name, mapped, &v))
            return keel__fail(KEEL_EINVAL, "restore from %s: renamed '%s' "
                              "is too long", r->path, e->name);
        if (v == NULL) {
            r->rep.n_unexpected++;
            list_append(r->rep.unexpected, sizeof r->rep.unexpected,
                        e->name);
            continue;
        }
        t = keel_var_tensor(v);
        if (!keel_shape_equal(t->ndim, t->shape, e->ndim, e->shape)) {
            char a[80], b[80];
            int renamed = strcmp(mapped, e->name) != 0;
            return keel__fail(KEEL_EINVAL, "restore from %s: variable '%s' "
                              "has shape %s in the checkpoint%s%s but %s in "
                              "the model", r->path, mapped,
                              keel_shape_format(a, sizeof a, e->ndim,
                                                e->shape),
                              renamed ? " as " : "", renamed ? e->name : "",
                              keel_shape_format(b, sizeof b, t->ndim,
                                                t->shape));
        }
        own = &r->owner[keel_var_index(v)];
        if (*own != SIZE_MAX)
            return keel__fail(KEEL_EINVAL, "restore from %s: checkpoint "
                              "variables '%s' and '%s' both map onto model "
                              "variable '%s' (fix the name map)", r->path,
                              f->d[*own].e.name, e->name, mapped);
        *own = i;
        r->target[i] = v;
    }
    return KEEL_OK;
}

/* List the store's variables the file lacks; a strict restore fails on
 * any with KEEL_EINVAL, like a shape mismatch: the checkpoint is there
 * but does not fit the model, which is not the absence of a checkpoint
 * (KEEL_ENOTFOUND, the file itself gone). */
static keel_status
rs_find_missing(restore_job *r)
{
    keel_restore_mode mode = r->opts != NULL ? r->opts->mode
                                             : KEEL_RESTORE_STRICT;
    for (size_t j = 0; j < r->nv; j++) {
        keel_var *v = keel_vars_at(r->vs, j);
        if ((keel_var_flags(v) & KEEL_VAR_LOCAL)
            || !rs_wanted(r, keel_var_name(v)))
            continue;
        if (r->owner[j] == SIZE_MAX) {
            r->rep.n_missing++;
            list_append(r->rep.missing, sizeof r->rep.missing,
                        keel_var_name(v));
        }
    }
    if (r->rep.n_missing > 0 && mode == KEEL_RESTORE_STRICT)
        return keel__fail(KEEL_EINVAL, "restore from %s: %zu variable(s) "
                          "of the model are not in the checkpoint: %s (use a "
                          "partial restore or a name map)", r->path,
                          r->rep.n_missing, r->rep.missing);
    return KEEL_OK;
}

/* Slots of matched variables must match their variable's shape. */
static keel_status
rs_check_slots(const restore_job *r)
{
    const ck_file *f = &r->f;
    char mapped[KEEL_NAME_MAX];
    for (size_t i = f->n_vars; i < f->n && !r->skip_slots; i++) {
        const keel_ckpt_entry *e = &f->d[i].e;
        const keel_tensor *t;
        keel_var *v;
        char a[80], b[80];
        if (!rs_lookup(r, e->name, mapped, &v) || v == NULL)
            continue;
        t = keel_var_tensor(v);
        if (!keel_shape_equal(t->ndim, t->shape, e->ndim, e->shape))
            return keel__fail(KEEL_EINVAL, "restore from %s: slot '%s' of "
                              "variable '%s' has shape %s in the checkpoint "
                              "but the variable is %s", r->path, e->slot,
                              mapped, keel_shape_format(a, sizeof a, e->ndim,
                                                        e->shape),
                              keel_shape_format(b, sizeof b, t->ndim,
                                                t->shape));
    }
    return KEEL_OK;
}

/* One read job per matched variable and slot; slots are created here so
 * their buffers exist. */
static keel_status
rs_plan_reads(restore_job *r)
{
    const ck_file *f = &r->f;
    char mapped[KEEL_NAME_MAX];
    r->jobs = malloc((f->n > 0 ? f->n : 1) * sizeof *r->jobs);
    if (r->jobs == NULL)
        return keel__fail(KEEL_ENOMEM, "restore from %s", r->path);
    for (size_t i = 0; i < f->n_vars; i++) {
        if (r->target[i] == NULL)
            continue;
        r->jobs[r->n_jobs].d = &f->d[i];
        r->jobs[r->n_jobs++].dst = keel_var_tensor(r->target[i])->data;
    }
    for (size_t i = f->n_vars; i < f->n && !r->skip_slots; i++) {
        const ck_dset *d = &f->d[i];
        keel_var *v;
        keel_tensor *slot;
        keel_status st;
        if (!rs_lookup(r, d->e.name, mapped, &v) || v == NULL)
            continue;
        st = keel_var_add_slot(v, d->e.slot, &slot);
        if (st != KEEL_OK)
            return st;
        assert(r->n_jobs < f->n);
        r->jobs[r->n_jobs].d = d;
        r->jobs[r->n_jobs++].dst = slot->data;
    }
    return KEEL_OK;
}

/* Every dataset in one pass over the file, then the variables count as
 * initialized and the store takes the file's global step. */
static keel_status
rs_read(restore_job *r)
{
    keel_status st;
    assert(r->jobs != NULL && r->n_jobs <= r->f.n);
    st = keel__ckpt_read_many(&r->f, r->jobs, r->n_jobs);
    if (st != KEEL_OK)
        return keel__wrap(st, "restore stopped; the model is partly "
                          "overwritten and must be re-initialized");
    for (size_t i = 0; i < r->f.n_vars; i++) {
        if (r->target[i] == NULL)
            continue;
        keel_var_set_initialized(r->target[i], 1);
        r->rep.n_restored++;
    }
    keel_vars_set_global_step(r->vs, r->f.global_step);
    return KEEL_OK;
}

static void
rs_free(restore_job *r)
{
    free(r->jobs);
    free(r->owner);
    free(r->target);
    free(r->map);
    if (r->has_only)
        regfree(&r->only);
    keel__ckpt_close(&r->f);
}

void
keel_restore_config_init(keel_restore_config *opts)
{
    KEEL__STRUCT_INIT(opts);
    opts->mode = KEEL_RESTORE_STRICT;
}

/* Keep only the datasets of shard k of r's file (its source k + 1). */
static keel_status
rs_only_shard(restore_job *r, int k)
{
    ck_file *f = &r->f;
    size_t m = 0, nv = 0;
    if (f->srcs == NULL || k < 0 || k >= f->shard_count)
        return keel__fail(KEEL_EINVAL, "checkpoint %s has no shard %d (%d "
                          "shards)", r->path, k,
                          f->srcs != NULL ? f->shard_count : 0);
    for (size_t i = 0; i < f->n; i++) {
        if (f->d[i].src != k + 1)
            continue;
        f->d[m++] = f->d[i];
        if (i < f->n_vars)
            nv = m;
    }
    f->n = m;
    f->n_vars = nv;
    return KEEL_OK;
}

static keel_status restore(const char *path, int shard, keel_vars *vs,
                           const keel_restore_config *opts,
                           keel_restore_report *report);

keel_status
keel_ckpt_restore(const char *path, keel_vars *vs,
                  const keel_restore_config *opts, keel_restore_report *report)
{
    return restore(path, -1, vs, opts, report);
}

keel_status
keel_ckpt_restore_shard(const char *path, int shard_index, keel_vars *vs,
                        const keel_restore_config *opts,
                        keel_restore_report *report)
{
    if (shard_index < 0)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_restore_shard %s: shard "
                          "%d", path ? path : "(null)", shard_index);
    return restore(path, shard_index, vs, opts, report);
}

/* A restore from path, of every dataset (shard -1) or of one shard's. */
static keel_status
restore(const char *path, int shard, keel_vars *vs,
        const keel_restore_config *opts, keel_restore_report *report)
{
    restore_job r;
    int64_t t0, t1;
    keel_status st;

    if (path == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_restore: NULL path or "
                          "store");
    if (opts != NULL && (st = KEEL__STRUCT_CHECK(opts, keel_restore_config))
                        != KEEL_OK)
        return keel__wrap(st, "keel_ckpt_restore %s", path);
    memset(&r, 0, sizeof r);
    r.path = path;
    r.vs = vs;
    r.opts = opts;
    r.skip_slots = opts != NULL && opts->skip_slots;
    r.n_map = opts != NULL ? opts->n_name_map : 0;
    st = parse_map(opts, &r.map);
    if (st == KEEL_OK && (st = rs_compile_only(&r)) != KEEL_OK)
        free(r.map);
    if (st != KEEL_OK)
        return st;
    t0 = keel__now_mono_ns();
    st = keel__ckpt_open(path, &r.f);
    if (st != KEEL_OK) {
        free(r.map);
        if (r.has_only)
            regfree(&r.only);
        return st;
    }
    t1 = keel__now_mono_ns();
    if (shard >= 0 && (st = rs_only_shard(&r, shard)) != KEEL_OK) {
        rs_free(&r);
        return st;
    }
    r.rep.global_step = r.f.global_step;
    r.nv = keel_vars_count(vs);
    r.target = calloc(r.f.n_vars > 0 ? r.f.n_vars : 1, sizeof *r.target);
    r.owner = malloc((r.nv > 0 ? r.nv : 1) * sizeof *r.owner);
    if (r.target == NULL || r.owner == NULL)
        st = keel__fail(KEEL_ENOMEM, "restore from %s", path);
    if (st == KEEL_OK)
        st = rs_match_variables(&r);
    if (st == KEEL_OK)
        st = rs_find_missing(&r);
    if (st == KEEL_OK)
        st = rs_check_slots(&r);
    if (st == KEEL_OK)
        st = rs_plan_reads(&r);
    if (st == KEEL_OK)
        st = rs_read(&r);
    if (st == KEEL_OK) {
        keel__log(KEEL_LOG_DEBUG, "restored %s: open %.1f ms, data %.1f ms",
                  path, (double)(t1 - t0) / 1e6,
                  (double)(keel__now_mono_ns() - t1) / 1e6);
        if (r.rep.n_missing > 0)
            keel__log(KEEL_LOG_INFO, "partial restore from %s: %zu "
                      "variable(s) keep their initializer (%s)", path,
                      r.rep.n_missing, r.rep.missing);
    }
    if (report != NULL)
        *report = r.rep;
    rs_free(&r);
    return st;
}

/* ---- reader API --------------------------------------------------------- */

keel_status
keel_ckpt_list(const char *path, keel_ckpt_entry **out, size_t *n)
{
    ck_file f;
    keel_ckpt_entry *e;
    keel_status st;
    if (path == NULL || out == NULL || n == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_list: NULL argument");
    *out = NULL;
    *n = 0;
    st = keel__ckpt_open(path, &f);
    if (st != KEEL_OK)
        return st;
    e = calloc(f.n > 0 ? f.n : 1, sizeof *e);
    if (e == NULL) {
        keel__ckpt_close(&f);
        return keel__fail(KEEL_ENOMEM, "listing %s", path);
    }
    for (size_t i = 0; i < f.n; i++)
        e[i] = f.d[i].e;
    *out = e;
    *n = f.n;
    keel__ckpt_close(&f);
    return KEEL_OK;
}

void
keel_ckpt_list_free(keel_ckpt_entry *entries)
{
    free(entries);
}

keel_status
keel_ckpt_read_tensor(const char *path, const char *name, const char *slot,
                      keel_tensor *out)
{
    ck_file f;
    keel_status st;
    const char *sl = slot != NULL ? slot : "";
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (path == NULL || name == NULL || out == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_read_tensor: NULL "
                          "argument");
    st = keel__ckpt_open(path, &f);
    if (st != KEEL_OK)
        return st;
    st = KEEL_ENOTFOUND;
    for (size_t i = 0; i < f.n; i++) {
        const ck_dset *d = &f.d[i];
        if (strcmp(d->e.name, name) != 0 || strcmp(d->e.slot, sl) != 0)
            continue;
        st = keel_tensor_alloc(out, d->e.ndim, d->e.shape);
        if (st == KEEL_OK)
            st = keel__ckpt_read(&f, d, out->data);
        if (st != KEEL_OK)
            keel_tensor_release(out);
        break;
    }
    if (st == KEEL_ENOTFOUND) {
        if (sl[0] != '\0')
            keel__fail(st, "checkpoint %s has no slot '%s' of variable '%s'",
                       path, sl, name);
        else
            keel__fail(st, "checkpoint %s has no variable '%s'", path, name);
    }
    keel__ckpt_close(&f);
    return st;
}

/* ---- parts, by name (a parameter server's restore) ---------------------- */

/* The datasets of f ordered by (name, slot), for lookups by name. */
static int
dset_cmp(const void *a, const void *b)
{
    const ck_dset *x = *(const ck_dset *const *)a;
    const ck_dset *y = *(const ck_dset *const *)b;
    int c = strcmp(x->e.name, y->e.name);
    return c != 0 ? c : strcmp(x->e.slot, y->e.slot);
}

/* Dataset name/slot of f through its sorted table by, or NULL. */
static const ck_dset *
dset_find(const ck_dset *const *by, size_t n, const char *name,
          const char *slot)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(by[mid]->e.name, name);
        if (c == 0)
            c = strcmp(by[mid]->e.slot, slot);
        if (c == 0)
            return by[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Part q's dataset in f and its element count checked: *d, and in *rows
 * 1 when q asks for rows of it. */
static keel_status
part_check(const ck_file *f, const ck_dset *const *by,
           const keel_ckpt_part *q, const ck_dset **d, int *rows)
{
    const char *sl = q->slot != NULL ? q->slot : "";
    size_t row = 1, want;
    if (q->name == NULL || q->dst == NULL)
        return keel__fail(KEEL_EINVAL, "read from %s: a part without a "
                          "name or destination", f->path);
    *d = dset_find(by, f->n, q->name, sl);
    if (*d == NULL)
        return keel__fail(KEEL_ENOTFOUND, "checkpoint %s has no %s%s%s'%s'",
                          f->path, sl[0] ? "slot '" : "", sl,
                          sl[0] ? "' of variable " : "variable ", q->name);
    *rows = q->row_begin != 0 || q->row_end != 0;
    want = (*d)->count;
    if (*rows) {
        const keel_ckpt_entry *e = &(*d)->e;
        if (e->ndim < 1 || q->row_begin < 0 || q->row_end <= q->row_begin ||
            q->row_end > e->shape[0])
            return keel__fail(KEEL_EINVAL, "checkpoint %s: rows [%lld, "
                              "%lld) of '%s'%s%s: it has %lld rows", f->path,
                              (long long)q->row_begin, (long long)q->row_end,
                              q->name, sl[0] ? " slot " : "", sl,
                              (long long)(e->ndim >= 1 ? e->shape[0] : 0));
        row = (*d)->count / (size_t)e->shape[0];
        want = row * (size_t)(q->row_end - q->row_begin);
    }
    if (q->count != want)
        return keel__fail(KEEL_EINVAL, "checkpoint %s: '%s'%s%s is %zu "
                          "values there, the destination %zu", f->path,
                          q->name, sl[0] ? " slot " : "", sl, want,
                          q->count);
    return KEEL_OK;
}

/* Rows of part q from dataset d: the whole dataset is read (its checksum
 * covers all of it), then the rows copied. */
static keel_status
part_read_rows(const ck_file *f, const ck_dset *d, const keel_ckpt_part *q)
{
    size_t row = d->count / (size_t)d->e.shape[0];
    float *all = malloc((d->count > 0 ? d->count : 1) * sizeof *all);
    keel_status st;
    if (all == NULL)
        return keel__fail(KEEL_ENOMEM, "read of '%s' from %s", q->name,
                          f->path);
    st = keel__ckpt_read(f, d, all);
    if (st == KEEL_OK)
        memcpy(q->dst, all + (size_t)q->row_begin * row,
               q->count * sizeof *all);
    free(all);
    return st;
}

keel_status
keel_ckpt_read_parts(const char *path, int64_t step, uint64_t run_id,
                     const keel_ckpt_part *parts, size_t n,
                     int64_t *global_step)
{
    const ck_dset **by = NULL;
    ck_read_job *jobs = NULL;
    size_t n_jobs = 0;
    ck_file f;
    keel_status st;
    if (path == NULL || (n > 0 && parts == NULL))
        return keel__fail(KEEL_EINVAL, "keel_ckpt_read_parts: NULL path or "
                          "parts");
    if ((st = keel__ckpt_open(path, &f)) != KEEL_OK)
        return st;
    if ((step >= 0 && f.global_step != step) ||
        (run_id != 0 && (f.shard_count == 0 || f.run_id != run_id))) {
        st = keel__fail(KEEL_EABORTED, "checkpoint %s is step %lld, run "
                        "%016llx (%d shards), not step %lld, run %016llx",
                        path, (long long)f.global_step,
                        (unsigned long long)f.run_id, f.shard_count,
                        (long long)step, (unsigned long long)run_id);
        keel__ckpt_close(&f);
        return st;
    }
    by = malloc((f.n > 0 ? f.n : 1) * sizeof *by);
    jobs = malloc((n > 0 ? n : 1) * sizeof *jobs);
    if (by == NULL || jobs == NULL)
        st = keel__fail(KEEL_ENOMEM, "read of %zu parts from %s", n, path);
    for (size_t i = 0; st == KEEL_OK && i < f.n; i++)
        by[i] = &f.d[i];
    if (st == KEEL_OK)
        qsort(by, f.n, sizeof *by, dset_cmp);
    /* everything checked before anything is read; whole datasets in one
     * pass over the files, rows one dataset at a time */
    for (size_t i = 0; st == KEEL_OK && i < n; i++) {
        const ck_dset *d;
        int rows;
        st = part_check(&f, by, &parts[i], &d, &rows);
        if (st == KEEL_OK && !rows) {
            jobs[n_jobs].d = d;
            jobs[n_jobs++].dst = parts[i].dst;
        }
    }
    if (st == KEEL_OK && n_jobs > 0)
        st = keel__ckpt_read_many(&f, jobs, n_jobs);
    for (size_t i = 0; st == KEEL_OK && i < n; i++) {
        const ck_dset *d;
        int rows;
        st = part_check(&f, by, &parts[i], &d, &rows);
        if (st == KEEL_OK && rows)
            st = part_read_rows(&f, d, &parts[i]);
    }
    if (st == KEEL_OK && global_step != NULL)
        *global_step = f.global_step;
    free(jobs);
    free(by);
    keel__ckpt_close(&f);
    return st;
}
