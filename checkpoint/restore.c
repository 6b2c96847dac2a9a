/* restore.c - finding the newest valid checkpoint (with fallback), restoring
 * one into a variable store by name (shape-checked, strict or partial, with
 * a name map), and the reader API used by `keel ckpt`. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"

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
    if (nm[0] == '/') {
        if (keel__fmt(p, sizeof p, "path", "%s", nm) != KEEL_OK)
            return KEEL_OK;
    } else if (keel__path_join(p, sizeof p, dir, nm) != KEEL_OK) {
        return KEEL_OK;
    }
    if (cand_has(*c, *n, p))
        return KEEL_OK;
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        cand *nv = realloc(*c, nc * sizeof *nv);
        if (nv == NULL)
            return keel__fail(KEEL_ENOMEM, "checkpoint candidates");
        *c = nv;
        *cap = nc;
    }
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

keel_status
keel_ckpt_latest(const char *dir, const char *basename, char *path,
                 size_t path_size, int64_t *step)
{
    size_t n = 0, n_bad = 0;
    cand *c = NULL;
    keel_status st;
    char last_err[KEEL_ERR_MAX] = "";

    if (dir == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_latest: dir is NULL");
    st = candidates(dir, basename, &c, &n);
    if (st != KEEL_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        int64_t s = -1;
        if (keel__ckpt_verify(c[i].path, &s) == KEEL_OK) {
            if (n_bad > 0)
                keel__log(KEEL_LOG_WARN, "restoring from %s (step %lld) "
                          "instead", c[i].path, (long long)s);
            st = path != NULL ? keel__fmt(path, path_size, "checkpoint path",
                                          "%s", c[i].path) : KEEL_OK;
            if (st == KEEL_OK && step != NULL)
                *step = s;
            free(c);
            return st;
        }
        snprintf(last_err, sizeof last_err, "%s", keel_last_error());
        keel__log(KEEL_LOG_WARN, "skipping checkpoint %s: %s", c[i].path,
                  last_err);
        n_bad++;
    }
    free(c);
    if (n_bad > 0)
        return keel__fail(KEEL_ENOTFOUND, "no valid checkpoint in %s: %zu "
                          "found, none verifies (last: %s)", dir, n_bad,
                          last_err);
    return keel__fail(KEEL_ENOTFOUND, "no checkpoint in %s", dir);
}

keel_status
keel_ckpt_restore_latest(const char *dir, const char *basename,
                         keel_vars *vs, const keel_restore_opts *opts,
                         keel_restore_report *report, char *path,
                         size_t path_size)
{
    size_t n = 0, n_bad = 0;
    cand *c = NULL;
    keel_status st;
    char last_err[KEEL_ERR_MAX] = "";

    if (dir == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_restore_latest: NULL dir "
                          "or store");
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
            if (n_bad > 0)
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
        snprintf(last_err, sizeof last_err, "%s", keel_last_error());
        keel__log(KEEL_LOG_WARN, "skipping checkpoint %s: %s", c[i].path,
                  last_err);
        n_bad++;
    }
    free(c);
    if (n_bad > 0)
        return keel__fail(KEEL_ENOTFOUND, "no valid checkpoint in %s: %zu "
                          "found, none restores (last: %s)", dir, n_bad,
                          last_err);
    return keel__fail(KEEL_ENOTFOUND, "no checkpoint in %s", dir);
}

/* ---- restore ------------------------------------------------------------ */

typedef struct map_ent {
    char from[KEEL_NAME_MAX];
    char to[KEEL_NAME_MAX];
} map_ent;

static keel_status
parse_map(const keel_restore_opts *o, map_ent **out)
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

keel_status
keel_ckpt_restore(const char *path, keel_vars *vs,
                  const keel_restore_opts *opts, keel_restore_report *report)
{
    ck_file f;
    map_ent *map = NULL;
    size_t n_map = opts != NULL ? opts->n_name_map : 0;
    keel_restore_report rep;
    keel_var **target = NULL;       /* per file variable: store variable */
    char mapped[KEEL_NAME_MAX];
    char *found = NULL;             /* per store variable: in the file */
    size_t *owner = NULL;           /* per store variable: file variable */
    ck_read_job *jobs = NULL;
    size_t n_jobs = 0;
    int64_t t0, t1;
    keel_restore_mode mode = opts != NULL ? opts->mode : KEEL_RESTORE_STRICT;
    keel_status st;
    size_t nv;

    if (path == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_restore: NULL path or "
                          "store");
    memset(&rep, 0, sizeof rep);
    st = parse_map(opts, &map);
    if (st != KEEL_OK)
        return st;
    t0 = keel__now_mono_ns();
    st = keel__ckpt_open(path, &f);
    if (st != KEEL_OK) {
        free(map);
        return st;
    }
    t1 = keel__now_mono_ns();
    rep.global_step = f.global_step;
    target = calloc(f.n_vars > 0 ? f.n_vars : 1, sizeof *target);
    nv = keel_vars_count(vs);
    owner = malloc((nv > 0 ? nv : 1) * sizeof *owner);
    if (target == NULL || owner == NULL) {
        st = keel__fail(KEEL_ENOMEM, "restore from %s", path);
        goto out;
    }
    /* Match file variables to store variables; check every shape before
     * writing anything; no two file variables may land on one. */
    for (size_t j = 0; j < nv; j++)
        owner[j] = SIZE_MAX;
    for (size_t i = 0; i < f.n_vars; i++) {
        keel_var *v;
        const keel_tensor *t;
        if (!map_name(map, n_map, f.d[i].e.name, mapped)) {
            st = keel__fail(KEEL_EINVAL, "restore from %s: renamed '%s' is "
                            "too long", path, f.d[i].e.name);
            goto out;
        }
        v = keel_vars_find(vs, mapped);
        if (v == NULL || (keel_var_flags(v) & KEEL_VAR_LOCAL)) {
            rep.n_unexpected++;
            list_append(rep.unexpected, sizeof rep.unexpected,
                        f.d[i].e.name);
            continue;
        }
        t = keel_var_tensor(v);
        if (!keel_shape_equal(t->ndim, t->shape, f.d[i].e.ndim,
                              f.d[i].e.shape)) {
            char a[80], b[80];
            st = keel__fail(KEEL_EINVAL, "restore from %s: variable '%s' has "
                            "shape %s in the checkpoint%s%s but %s in the "
                            "model", path, mapped,
                            keel_shape_format(a, sizeof a, f.d[i].e.ndim,
                                              f.d[i].e.shape),
                            strcmp(mapped, f.d[i].e.name) ? " as " : "",
                            strcmp(mapped, f.d[i].e.name) ? f.d[i].e.name
                                                          : "",
                            keel_shape_format(b, sizeof b, t->ndim,
                                              t->shape));
            goto out;
        }
        if (owner[keel_var_index(v)] != SIZE_MAX) {
            size_t j = owner[keel_var_index(v)];
            st = keel__fail(KEEL_EINVAL, "restore from %s: checkpoint "
                            "variables '%s' and '%s' both map onto model "
                            "variable '%s' (fix the name map)", path,
                            f.d[j].e.name, f.d[i].e.name, mapped);
            goto out;
        }
        owner[keel_var_index(v)] = i;
        target[i] = v;
    }
    found = calloc(nv > 0 ? nv : 1, 1);
    if (found == NULL) {
        st = keel__fail(KEEL_ENOMEM, "restore from %s", path);
        goto out;
    }
    for (size_t i = 0; i < f.n_vars; i++)
        if (target[i] != NULL)
            found[keel_var_index(target[i])] = 1;
    for (size_t j = 0; j < nv; j++) {
        keel_var *v = keel_vars_at(vs, j);
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        if (!found[j]) {
            rep.n_missing++;
            list_append(rep.missing, sizeof rep.missing, keel_var_name(v));
        }
    }
    if (rep.n_missing > 0 && mode == KEEL_RESTORE_STRICT) {
        st = keel__fail(KEEL_ENOTFOUND, "restore from %s: %zu variable(s) of "
                        "the model are not in the checkpoint: %s (use a "
                        "partial restore or a name map)", path,
                        rep.n_missing, rep.missing);
        goto out;
    }
    /* Slots of matched variables must match their shapes too. */
    for (size_t i = f.n_vars; i < f.n && !(opts && opts->skip_slots); i++) {
        ck_dset *d = &f.d[i];
        keel_var *v;
        const keel_tensor *t;
        if (!map_name(map, n_map, d->e.name, mapped))
            continue;
        v = keel_vars_find(vs, mapped);
        if (v == NULL || (keel_var_flags(v) & KEEL_VAR_LOCAL))
            continue;
        t = keel_var_tensor(v);
        if (!keel_shape_equal(t->ndim, t->shape, d->e.ndim, d->e.shape)) {
            char a[80], b[80];
            st = keel__fail(KEEL_EINVAL, "restore from %s: slot '%s' of "
                            "variable '%s' has shape %s in the checkpoint "
                            "but the variable is %s", path, d->e.slot,
                            mapped, keel_shape_format(a, sizeof a, d->e.ndim,
                                                      d->e.shape),
                            keel_shape_format(b, sizeof b, t->ndim,
                                              t->shape));
            goto out;
        }
    }
    /* Data: every dataset in one pass over the file (slots are created
     * first so their buffers exist). */
    jobs = malloc((f.n > 0 ? f.n : 1) * sizeof *jobs);
    if (jobs == NULL) {
        st = keel__fail(KEEL_ENOMEM, "restore from %s", path);
        goto out;
    }
    for (size_t i = 0; i < f.n_vars; i++) {
        if (target[i] == NULL)
            continue;
        jobs[n_jobs].d = &f.d[i];
        jobs[n_jobs++].dst = keel_var_tensor(target[i])->data;
    }
    for (size_t i = f.n_vars; i < f.n && !(opts && opts->skip_slots); i++) {
        ck_dset *d = &f.d[i];
        keel_var *v;
        keel_tensor *slot;
        if (!map_name(map, n_map, d->e.name, mapped))
            continue;
        v = keel_vars_find(vs, mapped);
        if (v == NULL || (keel_var_flags(v) & KEEL_VAR_LOCAL))
            continue;
        st = keel_var_add_slot(v, d->e.slot, &slot);
        if (st != KEEL_OK)
            goto out;
        jobs[n_jobs].d = d;
        jobs[n_jobs++].dst = slot->data;
    }
    st = keel__ckpt_read_many(&f, jobs, n_jobs);
    if (st != KEEL_OK) {
        st = keel__wrap(st, "restore stopped; the model is partly "
                        "overwritten and must be re-initialized");
        goto out;
    }
    for (size_t i = 0; i < f.n_vars; i++) {
        if (target[i] == NULL)
            continue;
        keel_var_set_initialized(target[i], 1);
        rep.n_restored++;
    }
    keel_vars_set_global_step(vs, f.global_step);
    keel__log(KEEL_LOG_DEBUG, "restored %s: open %.1f ms, data %.1f ms",
              path, (double)(t1 - t0) / 1e6,
              (double)(keel__now_mono_ns() - t1) / 1e6);
    if (rep.n_missing > 0)
        keel__log(KEEL_LOG_INFO, "partial restore from %s: %zu variable(s) "
                  "keep their initializer (%s)", path, rep.n_missing,
                  rep.missing);
out:
    free(jobs);
    free(found);
    free(owner);
    if (report != NULL)
        *report = rep;
    free(target);
    free(map);
    keel__ckpt_close(&f);
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
