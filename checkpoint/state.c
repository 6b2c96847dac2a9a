/* state.c - checkpoint names and the TF-format `checkpoint` state file:
 * parsing, checking and writing it (retention settings recorded as
 * `# keel:` comments so they survive restarts and TF's parser still
 * accepts the file), and scanning a directory for checkpoints. */
#include <config.h>

#include <assert.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "saver_int.h"
#include "grow.h"

/* ---- names and the state file ------------------------------------------- */

/* <basename>-<step>.h5, or <basename>-epoch<E>-<step>.h5 for an
 * end-of-epoch checkpoint (epoch > 0). */
keel_status
keel__ckpt_file_name(char *out, size_t size, const char *base, int64_t step,
                     int64_t epoch)
{
    if (epoch > 0)
        return keel__fmt(out, size, "checkpoint name", "%s-epoch%lld-%lld.h5",
                         base, (long long)epoch, (long long)step);
    return keel__fmt(out, size, "checkpoint name", "%s-%lld.h5", base,
                     (long long)step);
}

int64_t
keel__ckpt_name_step(const char *name, const char *base)
{
    size_t n = strlen(name), bl;
    const char *dash, *p;
    int64_t step;
    char digits[32];
    /* hidden names (temp files, `.lease-*`, `.deferred-*`) never are, nor
     * a sharded checkpoint's shard files (its index is) */
    if (n < 5 || name[0] == '.' || strcmp(name + n - 3, ".h5") != 0 ||
        keel__ckpt_is_shard_name(name))
        return -1;
    if (base != NULL) {
        bl = strlen(base);
        if (strncmp(name, base, bl) != 0 || name[bl] != '-')
            return -1;
        dash = name + bl;
    } else {
        dash = NULL;
        for (p = name; p < name + n - 3; p++)
            if (*p == '-')
                dash = p;
        if (dash == NULL || dash == name)
            return -1;
    }
    p = dash + 1;
    if (base != NULL && strncmp(p, "epoch", 5) == 0) {
        /* <base>-epoch<E>-<step>.h5: the step follows the epoch's dash */
        const char *q = p + 5;
        while (isdigit((unsigned char)*q))
            q++;
        if (q == p + 5 || *q != '-')
            return -1;
        p = q + 1;
    }
    if ((size_t)(name + n - 3 - p) == 0 ||
        (size_t)(name + n - 3 - p) >= sizeof digits)
        return -1;
    memcpy(digits, p, (size_t)(name + n - 3 - p));
    digits[name + n - 3 - p] = '\0';
    for (p = digits; *p; p++)
        if (!isdigit((unsigned char)*p))
            return -1;
    if (!keel__parse_i64(digits, 0, INT64_MAX, &step))
        return -1;
    return step;
}

void
keel__ckpt_state_free(ck_state *st)
{
    free(st->e);
    free(st->doomed);
    memset(st, 0, sizeof *st);
}

keel_status
keel__ckpt_state_push(ck_state *st, const char *name, double ts)
{
    ck_state_entry *e = keel__grow(st->e, &st->cap, st->n, sizeof *e, 16);
    if (e == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint state list");
    st->e = e;
    snprintf(st->e[st->n].name, sizeof st->e[0].name, "%s", name);
    st->e[st->n].ts = ts;
    st->n++;
    return KEEL_OK;
}

/* Whether name (a state file entry) is in the saver's directory: a plain
 * file name, or a path whose directory is that same directory. */
static int
in_saver_dir(const keel_saver *s, const char *name)
{
    const char *sl = strrchr(name, '/');
    char dir[KEEL_PATH_MAX], a[PATH_MAX], b[PATH_MAX];
    size_t n;
    if (sl == NULL)
        return 1;
    n = (size_t)(sl - name);
    if (n == 0 || n >= sizeof dir)
        return 0;
    memcpy(dir, name, n);
    dir[n] = '\0';
    return realpath(dir, a) != NULL && realpath(s->dir, b) != NULL &&
           strcmp(a, b) == 0;
}

/* Retention deletes only this saver's own checkpoints: a file of the
 * form <basename>-<step>.h5 (or <basename>-epoch<E>-<step>.h5) in the
 * checkpoint directory, named by its plain file name or by a path whose
 * directory is that same directory.
 * Anything else a state file lists ("../x", another directory, another
 * basename) is dropped from the list but never unlinked. */
int
keel__ckpt_may_unlink(const keel_saver *s, const char *name)
{
    const char *sl = strrchr(name, '/');
    int ok = keel__ckpt_name_step(sl ? sl + 1 : name, s->basename) >= 0 &&
             in_saver_dir(s, name);
    if (ok)
        return 1;
    keel__log(KEEL_LOG_WARN, "retention: '%s' in %s/%s is not a checkpoint "
              "of this saver (%s-<step>.h5 in that directory); left in "
              "place", name, s->dir, CK_STATE_NAME, s->basename);
    return 0;
}

void
keel__ckpt_state_remove(ck_state *st, size_t i)
{
    memmove(&st->e[i], &st->e[i + 1], (st->n - i - 1) * sizeof *st->e);
    st->n--;
}

/* Parse a quoted string value: "..." with \" and \\ escapes. */
static int
parse_quoted(const char *v, char *out, size_t size)
{
    size_t n = 0;
    if (*v++ != '"')
        return 0;
    while (*v != '\0' && *v != '"') {
        if (*v == '\\' && v[1] != '\0')
            v++;
        if (n + 1 >= size)
            return 0;
        out[n++] = *v++;
    }
    if (*v != '"')
        return 0;
    out[n] = '\0';
    return n > 0;
}

/* A state file being parsed: its path, the line and the timestamps read
 * so far. */
typedef struct state_parse {
    const char *path;
    size_t lineno;
    size_t n_ts;
} state_parse;

static keel_status
state_bad_line(const state_parse *sp)
{
    return keel__fail(KEEL_ECORRUPT, "state file %s: line %zu is not "
                      "`key: value` in TF's checkpoint format", sp->path,
                      sp->lineno);
}

static keel_status
state_add_doomed(ck_state *st, const char *name)
{
    void *nd = realloc(st->doomed, (st->n_doomed + 1) * sizeof *st->doomed);
    if (nd == NULL)
        return keel__fail(KEEL_ENOMEM, "state file list");
    st->doomed = nd;
    strcpy(st->doomed[st->n_doomed++], name);
    return KEEL_OK;
}

/* keel's own comment line, "# keel: max_to_keep=5 keep_every_n_hours=0
 * delete=NAME ..."; other comments and unknown or bad words are
 * ignored. */
static keel_status
state_parse_options(ck_state *st, char *line)
{
    char *kv, *save = NULL;
    if (strncmp(line, "# keel:", 7) != 0)
        return KEEL_OK;
    for (kv = strtok_r(line + 7, " \t", &save); kv != NULL;
         kv = strtok_r(NULL, " \t", &save)) {
        int64_t iv;
        double d;
        if (strncmp(kv, "max_to_keep=", 12) == 0 &&
            keel__parse_i64(kv + 12, 0, 1000000000, &iv))
            st->max_to_keep = (int)iv;
        else if (strncmp(kv, "keep_every_n_hours=", 19) == 0 &&
                 keel__parse_double(kv + 19, &d) && d >= 0)
            st->keep_every_n_hours = d;
        else if (strncmp(kv, "delete=", 7) == 0 &&
                 keel_name_is_valid(kv + 7) &&
                 strchr(kv + 7, '/') == NULL && st->n_doomed < 1024) {
            keel_status rc = state_add_doomed(st, kv + 7);
            if (rc != KEEL_OK)
                return rc;
        }
    }
    return KEEL_OK;
}

/* One `key: value` line of TF's checkpoint format; other keys are
 * ignored (forward compatibility). */
static keel_status
state_parse_entry(ck_state *st, state_parse *sp, char *line)
{
    char *colon = strchr(line, ':'), *key, *val, name[KEEL_NAME_MAX];
    double d;
    if (colon == NULL)
        return state_bad_line(sp);
    *colon = '\0';
    key = line;
    val = colon + 1;
    while (isspace((unsigned char)*val))
        val++;
    for (char *e = val + strlen(val); e > val &&
         isspace((unsigned char)e[-1]); )
        *--e = '\0';
    if (strcmp(key, "model_checkpoint_path") == 0) {
        if (!parse_quoted(val, st->latest, sizeof st->latest))
            return state_bad_line(sp);
    } else if (strcmp(key, "all_model_checkpoint_paths") == 0) {
        if (!parse_quoted(val, name, sizeof name))
            return state_bad_line(sp);
        return keel__ckpt_state_push(st, name, 0);
    } else if (strcmp(key, "all_model_checkpoint_timestamps") == 0) {
        if (!keel__parse_double(val, &d))
            return state_bad_line(sp);
        if (sp->n_ts < st->n)
            st->e[sp->n_ts].ts = d;
        sp->n_ts++;
    } else if (strcmp(key, "last_preserved_timestamp") == 0) {
        if (!keel__parse_double(val, &d))
            return state_bad_line(sp);
        st->last_preserved = d;
    }
    return KEEL_OK;
}

/* The lines of a state file's text (NUL-free; tokenized in place). */
static keel_status
state_parse_text(ck_state *st, const char *path, char *data)
{
    state_parse sp = { .path = path };
    char *line, *save = NULL;
    keel_status rc = KEEL_OK;
    for (line = strtok_r(data, "\n", &save); line != NULL && rc == KEEL_OK;
         line = strtok_r(NULL, "\n", &save)) {
        sp.lineno++;
        while (isspace((unsigned char)*line))
            line++;
        if (*line == '#')
            rc = state_parse_options(st, line);
        else if (*line != '\0')
            rc = state_parse_entry(st, &sp, line);
    }
    return rc;
}

keel_status
keel__ckpt_state_read(const char *dir, ck_state *st)
{
    char path[KEEL_PATH_MAX], *data;
    size_t n;
    keel_status rc;

    memset(st, 0, sizeof *st);
    st->last_preserved = -1;
    st->max_to_keep = -1;
    st->keep_every_n_hours = -1;
    rc = keel__path_join(path, sizeof path, dir, CK_STATE_NAME);
    if (rc != KEEL_OK)
        return rc;
    rc = keel__fs_read_all(path, (size_t)16 << 20, &data, &n);
    if (rc != KEEL_OK)
        return rc;
    if (strlen(data) != n)
        rc = keel__fail(KEEL_ECORRUPT, "state file %s contains NUL bytes",
                        path);
    else
        rc = state_parse_text(st, path, data);
    free(data);
    if (rc == KEEL_OK && st->latest[0] == '\0' && st->n == 0)
        rc = keel__fail(KEEL_ECORRUPT, "state file %s names no checkpoint",
                        path);
    if (rc != KEEL_OK)
        keel__ckpt_state_free(st);
    return rc;
}

keel_status
keel_ckpt_state_check(const char *dir)
{
    char p[KEEL_PATH_MAX];
    const char *nm;
    struct stat sb, lb;
    ck_state st;
    keel_status rc;

    if (dir == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_state_check: dir is NULL");
    rc = keel__ckpt_state_read(dir, &st);
    if (rc == KEEL_ENOTFOUND)
        return KEEL_OK;
    if (rc != KEEL_OK)
        return rc;
    nm = st.latest[0] != '\0' ? st.latest : st.e[st.n - 1].name;
    if (nm[0] == '/')
        snprintf(p, sizeof p, "%s", nm);
    else if (keel__path_join(p, sizeof p, dir, nm) != KEEL_OK)
        p[0] = '\0';
    if (p[0] == '\0' || stat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
        rc = keel__fail(KEEL_ENOTFOUND, "state file %s/%s names '%s' as the "
                        "newest checkpoint, but it is %s", dir, CK_STATE_NAME,
                        nm, p[0] != '\0' && lstat(p, &lb) == 0 &&
                        S_ISLNK(lb.st_mode) ? "a dangling symlink" :
                        p[0] != '\0' && lstat(p, &lb) == 0 ?
                        "not a regular file" : "missing");
    keel__ckpt_state_free(&st);
    return rc;
}

/* Two state file entries that name the same file of the saver's
 * directory: equal names, or equal file names where one is a path into
 * that directory. */
int
keel__ckpt_same_entry(const keel_saver *s, const char *a,
                      const char *b)
{
    const char *sa = strrchr(a, '/'), *sb = strrchr(b, '/');
    if (strcmp(a, b) == 0)
        return 1;
    if (strcmp(sa ? sa + 1 : a, sb ? sb + 1 : b) != 0)
        return 0;
    /* same file name: the same file when each is in the saver's dir */
    return in_saver_dir(s, a) && in_saver_dir(s, b);
}

/* A state file listing one file several times keeps its newest entry. */
void
keel__ckpt_state_dedup(keel_saver *s)
{
    for (size_t i = 0; i < s->state.n; ) {
        int later = 0;
        for (size_t j = i + 1; j < s->state.n && !later; j++)
            later = keel__ckpt_same_entry(s, s->state.e[i].name,
                                          s->state.e[j].name);
        if (later)
            keel__ckpt_state_remove(&s->state, i);
        else
            i++;
    }
}

keel_status
keel__ckpt_state_write(const keel_saver *s,
                       char (*doomed)[KEEL_NAME_MAX], size_t n_doomed)
{
    char path[KEEL_PATH_MAX];
    size_t cap = 512 + (s->state.n + n_doomed) * (KEEL_NAME_MAX + 96);
    char *buf = malloc(cap);
    size_t len = 0;
    keel_status st;

    if (buf == NULL)
        return keel__fail(KEEL_ENOMEM, "state file buffer");
#define APPEND(...) len += (size_t)snprintf(buf + len, cap - len, __VA_ARGS__)
    APPEND("model_checkpoint_path: \"%s\"\n",
           s->state.n > 0 ? s->state.e[s->state.n - 1].name : "");
    for (size_t i = 0; i < s->state.n; i++)
        APPEND("all_model_checkpoint_paths: \"%s\"\n", s->state.e[i].name);
    for (size_t i = 0; i < s->state.n; i++)
        APPEND("all_model_checkpoint_timestamps: %.6f\n", s->state.e[i].ts);
    APPEND("last_preserved_timestamp: %.6f\n", s->state.last_preserved);
    APPEND("# keel: max_to_keep=%d keep_every_n_hours=%.9g\n",
           s->max_to_keep, s->keep_every_n_hours);
    for (size_t i = 0; i < n_doomed; i++)
        if (strchr(doomed[i], '/') == NULL)
            APPEND("# keel: delete=%s\n", doomed[i]);
#undef APPEND
    st = keel__path_join(path, sizeof path, s->dir, CK_STATE_NAME);
    if (st == KEEL_OK)
        st = keel__fs_write_atomic(path, buf, len);
    free(buf);
    return st;
}

/* ---- scanning a directory ----------------------------------------------- */

static int
file_cmp(const void *a, const void *b)
{
    const keel_ckpt_file *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

keel_status
keel_ckpt_scan(const char *dir, const char *basename, keel_ckpt_file **out,
               size_t *n)
{
    DIR *d;
    struct dirent *de;
    keel_ckpt_file *v = NULL;
    size_t cap = 0, cnt = 0;
    ck_state state;
    int have_state;

    if (dir == NULL || out == NULL || n == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_scan: NULL argument");
    *out = NULL;
    *n = 0;
    d = opendir(dir);
    if (d == NULL)
        return keel__fail(errno == ENOENT ? KEEL_ENOTFOUND : KEEL_EIO,
                          "checkpoint directory %s: %s", dir,
                          strerror(errno));
    have_state = keel__ckpt_state_read(dir, &state) == KEEL_OK;
    while ((de = readdir(d)) != NULL) {
        int64_t step = keel__ckpt_name_step(de->d_name, basename);
        char p[KEEL_PATH_MAX];
        struct stat sb;
        keel_ckpt_file *nv;
        if (step < 0 || de->d_name[0] == '.' ||
            strlen(de->d_name) >= KEEL_NAME_MAX ||
            keel__path_join(p, sizeof p, dir, de->d_name) != KEEL_OK ||
            stat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        nv = keel__grow(v, &cap, cnt, sizeof *nv, 16);
        if (nv == NULL) {
            free(v);
            closedir(d);
            if (have_state)
                keel__ckpt_state_free(&state);
            return keel__fail(KEEL_ENOMEM, "scan of %s", dir);
        }
        v = nv;
        memset(&v[cnt], 0, sizeof v[cnt]);
        strcpy(v[cnt].name, de->d_name);
        v[cnt].step = step;
        v[cnt].size = (int64_t)sb.st_size;
        v[cnt].mtime = (double)sb.st_mtim.tv_sec +
                       (double)sb.st_mtim.tv_nsec * 1e-9;
        for (size_t i = 0; have_state && i < state.n; i++) {
            const char *nm = state.e[i].name, *sl = strrchr(nm, '/');
            if (strcmp(sl ? sl + 1 : nm, de->d_name) == 0)
                v[cnt].in_state_file = 1;
        }
        cnt++;
    }
    closedir(d);
    if (have_state)
        keel__ckpt_state_free(&state);
    if (cnt > 0)
        qsort(v, cnt, sizeof *v, file_cmp);
    *out = v;
    *n = cnt;
    return KEEL_OK;
}

void
keel_ckpt_scan_free(keel_ckpt_file *files)
{
    free(files);
}
