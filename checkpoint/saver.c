/* saver.c - keel_saver: one checkpoint file per save committed durably,
 * then the TF-format `checkpoint` state file, then retention (max_to_keep,
 * keep_every_n_hours, recorded in the state file as `# keel:` comments so
 * they survive restarts and TF's parser still accepts the file). Async
 * saves copy everything into one reusable staging buffer and write it on a
 * background thread; at most one is in flight. */
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


#include "ckpt_int.h"
#include "grow.h"

struct keel_saver {
    char dir[KEEL_PATH_MAX];
    char basename[KEEL_NAME_MAX];
    int max_to_keep;
    double keep_every_n_hours;
    int is_async;

    ck_state state;             /* the retention list, save order */
    int64_t last_step;          /* atomic: read by keel_saver_last_step */

    /* async: one writer thread for the saver's life, woken per save (a
     * thread created per save made the step wait for clone() and, on a
     * busy machine, for the new thread to give the core back) */
    pthread_t thread;
    int has_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* has_job set, or is_quitting */
    pthread_cond_t done_cv;     /* in_flight cleared */
    int has_job, is_quitting;
    int in_flight;              /* a staged save not yet committed */
    int64_t t_stage_ns, t_staged_ns, t_woken_ns;
    keel_status th_status;
    char th_err[KEEL_ERR_MAX];
    ck_plan plan;
    char *stage;                /* staging buffer, KEEL_TENSOR_ALIGN'd */
    size_t stage_cap;
    char *names;                /* copied names, config, topology */
    size_t names_cap;

    /* retention deletions run on their own thread (freeing a large file's
     * blocks takes tens of ms) */
    pthread_t reaper;
    int reaping;
    char (*reap)[KEEL_PATH_MAX];
    size_t n_reap;
    /* the state file this saver last wrote has "# keel: delete=" lines,
     * which only a crash before the reaper is done may leave behind */
    int lists_deletions;
};

void
keel_saver_config_init(keel_saver_config *cfg)
{
    if (cfg == NULL)
        return;
    KEEL__STRUCT_INIT(cfg);
    cfg->basename = KEEL_CKPT_DEFAULT_BASENAME;
    cfg->max_to_keep = 5;
    cfg->keep_every_n_hours = 0;
    cfg->is_async = 0;
}

/* ---- names and the state file ------------------------------------------- */

/* <basename>-<step>.h5, or <basename>-epoch<E>-<step>.h5 for an
 * end-of-epoch checkpoint (epoch > 0). */
static keel_status
ckpt_file_name(char *out, size_t size, const char *base, int64_t step,
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
    /* hidden names (temp files, `.lease-*`, `.deferred-*`) never are */
    if (n < 5 || name[0] == '.' || strcmp(name + n - 3, ".h5") != 0)
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

static keel_status
state_push(ck_state *st, const char *name, double ts)
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
static int
may_unlink(const keel_saver *s, const char *name)
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

static void
state_remove(ck_state *st, size_t i)
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
        return state_push(st, name, 0);
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
static int
same_entry(const keel_saver *s, const char *a, const char *b)
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
static void
state_dedup(keel_saver *s)
{
    for (size_t i = 0; i < s->state.n; ) {
        int later = 0;
        for (size_t j = i + 1; j < s->state.n && !later; j++)
            later = same_entry(s, s->state.e[i].name, s->state.e[j].name);
        if (later)
            state_remove(&s->state, i);
        else
            i++;
    }
}

static keel_status
state_write(const keel_saver *s, char (*doomed)[KEEL_NAME_MAX],
            size_t n_doomed)
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

/* ---- saver lifetime ----------------------------------------------------- */

/* Remove ".<base>-*.h5.tmp.<pid>" and ".checkpoint.tmp.<pid>" left by
 * processes that no longer exist. */
static void
clean_temp_files(const keel_saver *s)
{
    DIR *d = opendir(s->dir);
    struct dirent *de;
    size_t bl = strlen(s->basename);
    if (d == NULL)
        return;
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name, *t;
        int64_t pid;
        char path[KEEL_PATH_MAX];
        if (nm[0] != '.')
            continue;
        if (!((strncmp(nm + 1, s->basename, bl) == 0 && nm[1 + bl] == '-') ||
              strncmp(nm + 1, CK_STATE_NAME ".tmp.",
                      sizeof CK_STATE_NAME + 4) == 0))
            continue;
        t = strstr(nm, ".tmp.");
        if (t == NULL || !keel__parse_i64(t + 5, 1, INT32_MAX, &pid))
            continue;
        if (pid == (int64_t)getpid() ||
            (kill((pid_t)pid, 0) != 0 ? errno != ESRCH : 1))
            continue;          /* owner may still be alive */
        if (keel__path_join(path, sizeof path, s->dir, nm) != KEEL_OK)
            continue;
        if (unlink(path) == 0)
            keel__log(KEEL_LOG_INFO, "removed %s, left by crashed process "
                      "%lld", path, (long long)pid);
    }
    closedir(d);
}

/* Checkpoints newer than the newest listed one were committed by a
 * process that died before updating the state file: list them (by step) so
 * retention manages them. Older unlisted files are left alone: they may be
 * kept on purpose (keep_every_n_hours). */
static void
adopt_orphans(keel_saver *s)
{
    keel_ckpt_file *f = NULL;
    size_t n = 0;
    if (keel_ckpt_scan(s->dir, s->basename, &f, &n) != KEEL_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        if (f[i].step <= s->last_step ||
            keel__ckpt_is_deferred(s->dir, f[i].name))
            continue;
        if (state_push(&s->state, f[i].name, f[i].mtime) != KEEL_OK)
            break;
        s->last_step = f[i].step;
        keel__log(KEEL_LOG_INFO, "adopted %s/%s, committed by a process "
                  "that stopped before recording it", s->dir, f[i].name);
    }
    keel_ckpt_scan_free(f);
}

/* The saver's name and retention settings: base gets the basename. */
static keel_status
check_naming(const keel_saver_config *cfg, const char **base)
{
    *base = cfg->basename != NULL ? cfg->basename
                                  : KEEL_CKPT_DEFAULT_BASENAME;
    if (!keel_name_is_valid(*base) || strchr(*base, '/') != NULL ||
        strlen(*base) > 200)
        return keel__fail(KEEL_EINVAL, "checkpoint basename '%s' must be one "
                          "path segment of [A-Za-z0-9_.-]", *base);
    if (cfg->max_to_keep < 0)
        return keel__fail(KEEL_EINVAL, "max_to_keep %d: must be >= 0 "
                          "(0 keeps all)", cfg->max_to_keep);
    if (!(cfg->keep_every_n_hours >= 0))
        return keel__fail(KEEL_EINVAL, "keep_every_n_hours must be >= 0");
    return KEEL_OK;
}

/* s's settings from cfg, and its directory, created when missing. */
static keel_status
saver_setup(keel_saver *s, const keel_saver_config *cfg, const char *base)
{
    keel_status st = keel__fmt(s->dir, sizeof s->dir,
                               "checkpoint directory", "%s", cfg->dir);
    if (st != KEEL_OK)
        return st;
    snprintf(s->basename, sizeof s->basename, "%s", base);
    s->max_to_keep = cfg->max_to_keep;
    s->keep_every_n_hours = cfg->keep_every_n_hours;
    s->is_async = cfg->is_async != 0;
    s->last_step = -1;
    st = keel__fs_mkdirs(s->dir);
    if (st != KEEL_OK)
        return keel__wrap(st, "checkpoint directory %s", s->dir);
    return KEEL_OK;
}

/* Drop the loaded list's entries whose file is gone. */
static void
state_drop_missing(keel_saver *s)
{
    for (size_t i = 0; i < s->state.n; ) {
        char p[KEEL_PATH_MAX];
        struct stat sb;
        const char *nm = s->state.e[i].name;
        if (nm[0] == '/')
            snprintf(p, sizeof p, "%s", nm);
        else if (keel__path_join(p, sizeof p, s->dir, nm) != KEEL_OK)
            p[0] = '\0';
        if (stat(p, &sb) != 0) {
            state_remove(&s->state, i);
            continue;
        }
        i++;
    }
}

/* Finish the retention deletions a crash interrupted (the state file's
 * "# keel: delete=" names no longer listed), then forget them. */
static void
finish_doomed(keel_saver *s)
{
    for (size_t k = 0; k < s->state.n_doomed; k++) {
        char p[KEEL_PATH_MAX];
        int listed = 0;
        for (size_t i = 0; i < s->state.n; i++)
            listed |= strcmp(s->state.e[i].name, s->state.doomed[k]) == 0;
        if (!listed && may_unlink(s, s->state.doomed[k]) &&
            keel__path_join(p, sizeof p, s->dir, s->state.doomed[k]) ==
                KEEL_OK &&
            !keel__ckpt_lease_defer(s->dir, s->state.doomed[k]) &&
            unlink(p) == 0)
            keel__log(KEEL_LOG_INFO, "retention: removed %s (deletion "
                      "interrupted earlier)", p);
    }
    free(s->state.doomed);
    s->state.doomed = NULL;
    s->state.n_doomed = 0;
}

/* The retention list from the directory's state file, without missing
 * files, and the newest entry's step; no state file (or a bad one, with
 * a warning) starts a new list. */
static void
load_state(keel_saver *s)
{
    keel_status st = keel__ckpt_state_read(s->dir, &s->state);
    if (st != KEEL_OK) {
        if (st != KEEL_ENOTFOUND)
            keel__log(KEEL_LOG_WARN, "%s; starting a new checkpoint list",
                      keel_last_error());
        memset(&s->state, 0, sizeof s->state);
        return;
    }
    state_drop_missing(s);
    state_dedup(s);
    finish_doomed(s);
    if (s->state.n > 0) {
        const char *nm = s->state.e[s->state.n - 1].name;
        const char *sl = strrchr(nm, '/');
        s->last_step = keel__ckpt_name_step(sl ? sl + 1 : nm, s->basename);
    }
}

/* Check cfg, set up the directory, take over what an earlier saver left
 * there (temp files, its list, interrupted deletions, stale leases,
 * committed but unrecorded checkpoints). */
keel_status
keel_saver_new(const keel_saver_config *cfg, keel_saver **out)
{
    keel_saver *s;
    keel_status st;
    const char *base;

    st = KEEL__CONFIG_CHECK(cfg, out, keel_saver_config, "keel_saver_new");
    if (st != KEEL_OK)
        return st;
    if (cfg->dir == NULL || cfg->dir[0] == 0)
        return keel__fail(KEEL_EINVAL, "keel_saver_new: a checkpoint "
                          "directory is required");
    *out = NULL;
    st = check_naming(cfg, &base);
    if (st != KEEL_OK)
        return st;
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return keel__fail(KEEL_ENOMEM, "saver");
    st = saver_setup(s, cfg, base);
    if (st != KEEL_OK) {
        free(s);
        return st;
    }
    clean_temp_files(s);
    load_state(s);
    /* stale leases of dead readers; deferred deletions now unleased */
    keel__ckpt_lease_sweep(s->dir, &s->state);
    adopt_orphans(s);
    if (s->state.last_preserved < 0)
        s->state.last_preserved = keel__now_wall();
    *out = s;
    return KEEL_OK;
}

int64_t
keel_saver_last_step(const keel_saver *s)
{
    if (s == NULL)
        return -1;
    return __atomic_load_n(&s->last_step, __ATOMIC_ACQUIRE);
}

/* ---- one save ----------------------------------------------------------- */

static keel_status
plan_add(ck_plan *p, const char *name, const char *slot,
         const keel_tensor *t, const void *data)
{
    ck_item *items = keel__grow(p->items, &p->cap, p->n, sizeof *items, 64);
    ck_item *it;
    if (items == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint plan");
    p->items = items;
    it = &p->items[p->n++];
    memset(it, 0, sizeof *it);
    it->name = name;
    it->slot = slot;
    it->ndim = t->ndim;
    memcpy(it->shape, t->shape, sizeof it->shape);
    it->data = data;
    it->bytes = keel_tensor_bytes(t);
    return KEEL_OK;
}

/* A reader's lease on path: record `.deferred-<file>` instead of deleting
 * it now (lease.c). */
static int
reap_is_leased(const char *path)
{
    char dir[KEEL_PATH_MAX];
    const char *sl = strrchr(path, '/');
    if (sl == NULL)
        return keel__ckpt_lease_defer(".", path);
    if (sl == path)
        return keel__ckpt_lease_defer("/", sl + 1);
    if ((size_t)(sl - path) >= sizeof dir)
        return 0;
    memcpy(dir, path, (size_t)(sl - path));
    dir[sl - path] = '\0';
    return keel__ckpt_lease_defer(dir, sl + 1);
}

static void *
reaper_main(void *arg)
{
    keel_saver *s = arg;
    for (size_t i = 0; i < s->n_reap; i++) {
        if (reap_is_leased(s->reap[i]))
            continue;                   // deleted by a later save
        if (unlink(s->reap[i]) != 0 && errno != ENOENT)
            keel__log(KEEL_LOG_WARN, "retention: cannot remove %s: %s",
                      s->reap[i], strerror(errno));
        else
            keel__log(KEEL_LOG_DEBUG, "retention: removed %s", s->reap[i]);
    }
    return NULL;
}

/* Wait for the retention deletions of the previous save. */
static void
join_reaper(keel_saver *s)
{
    if (s->reaping)
        pthread_join(s->reaper, NULL);
    s->reaping = 0;
    free(s->reap);
    s->reap = NULL;
    s->n_reap = 0;
}

/* An upper bound of the file plan p makes: its data, each dataset aligned
 * and with its object header and attributes, the text attributes, and the
 * metadata blocks HDF5 allocates. */
static uint64_t
planned_file_bytes(const ck_plan *p)
{
    uint64_t b = (uint64_t)4 << 16;              /* superblock, groups */
    for (size_t i = 0; i < p->n; i++)
        b += p->items[i].bytes + 8192;
    for (size_t i = 0; i < p->n_blobs; i++)
        b += p->blobs[i].size + 8192;
    b += p->config_text != NULL ? strlen(p->config_text) : 0;
    b += p->topology != NULL ? strlen(p->topology) : 0;
    b += p->architecture != NULL ? strlen(p->architecture) : 0;
    return b;
}

/* Refuse a save that cannot fit the process's file size limit
 * (RLIMIT_FSIZE) before HDF5 starts it, on the caller's thread (an async
 * save fails at its own call, not at the next one): HDF5 (1.10) cannot
 * give up a file whose closing flush failed (EFBIG), and the file object
 * that failed close leaves behind crashes the library at exit. Free
 * space is not checked ahead (file systems report it too loosely to
 * refuse on it): a full disk fails the save with ENOSPC and removes the
 * temporary file. */
static keel_status
check_room(const ck_plan *p)
{
    uint64_t need = planned_file_bytes(p);
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        need > (uint64_t)rl.rlim_cur)
        return keel__fail(KEEL_EIO, "checkpoint of step %lld needs up to "
                          "%llu bytes, more than this process's file size "
                          "limit of %llu bytes (ulimit -f); raise the limit",
                          (long long)p->step, (unsigned long long)need,
                          (unsigned long long)rl.rlim_cur);
    return KEEL_OK;
}

/* One save being committed: its file's name and path, when the save
 * began (the file's timestamp in the state file), and the files
 * retention drops from the list. */
typedef struct ck_commit {
    char name[KEEL_NAME_MAX];
    char path[KEEL_PATH_MAX];
    double now;
    char (*doomed)[KEEL_NAME_MAX];
    size_t n_doomed;
} ck_commit;

static keel_status
commit_file(const keel_saver *s, ck_plan *p, ck_commit *c)
{
    keel_status st = ckpt_file_name(c->name, sizeof c->name, s->basename,
                                    p->step, p->epoch);
    if (st == KEEL_OK)
        st = keel__path_join(c->path, sizeof c->path, s->dir, c->name);
    if (st == KEEL_OK)
        st = keel__ckpt_write_file(p, c->path);
    if (st != KEEL_OK)
        return keel__wrap(st, "save of step %lld failed", (long long)p->step);
    return KEEL_OK;
}

/* Whether the list still names the file name names (retention never
 * deletes a file the state file goes on listing). */
static int
still_listed(const keel_saver *s, const char *name)
{
    for (size_t i = 0; i < s->state.n; i++)
        if (same_entry(s, s->state.e[i].name, name))
            return 1;
    return 0;
}

/* Retention: the oldest entries past max_to_keep leave the list, into
 * c->doomed unless keep_every_n_hours keeps them for good. The entry
 * just added is never removed (n > max >= 1). */
static void
apply_retention(keel_saver *s, ck_commit *c)
{
    while (s->max_to_keep > 0 && s->state.n > (size_t)s->max_to_keep) {
        ck_state_entry old = s->state.e[0];
        state_remove(&s->state, 0);
        if (s->keep_every_n_hours > 0 &&
            old.ts - s->state.last_preserved >=
                s->keep_every_n_hours * 3600.0) {
            s->state.last_preserved = old.ts;   /* kept for good */
            continue;
        }
        if (!still_listed(s, old.name))
            snprintf(c->doomed[c->n_doomed++], KEEL_NAME_MAX, "%s",
                     old.name);
    }
}

/* The new list (without an older entry of the same name, plus this one,
 * after retention) into the state file. When that cannot be written the
 * .h5 is committed but unrecorded: the old list stays. */
static keel_status
record_commit(keel_saver *s, ck_commit *c)
{
    size_t backup_n = s->state.n;
    double saved_lp = s->state.last_preserved;
    ck_state_entry *backup = malloc((backup_n + 1) * sizeof *backup);
    keel_status st;
    if (backup == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint retention list");
    if (backup_n > 0)
        memcpy(backup, s->state.e, backup_n * sizeof *backup);
    for (size_t i = 0; i < s->state.n; ) {
        const char *nm = s->state.e[i].name;
        const char *sl = strrchr(nm, '/');
        if (strcmp(sl ? sl + 1 : nm, c->name) == 0)
            state_remove(&s->state, i);
        else
            i++;
    }
    st = state_push(&s->state, c->name, c->now);
    if (st == KEEL_OK) {
        apply_retention(s, c);
        st = state_write(s, c->doomed, c->n_doomed);
        if (st != KEEL_OK) {
            memcpy(s->state.e, backup, backup_n * sizeof *backup);
            s->state.n = backup_n;
            s->state.last_preserved = saved_lp;
            c->n_doomed = 0;
            st = keel__wrap(st, "checkpoint %s was written but the state "
                            "file could not be updated", c->path);
        }
    }
    free(backup);
    return st;
}

/* Unlink the files retention dropped, on the reaper thread (here when it
 * cannot start): only now that the state file no longer lists them (a
 * crash before they are gone is finished by the next saver: "# keel:
 * delete="). */
static void
start_reaping(keel_saver *s, const ck_commit *c)
{
    if (c->n_doomed == 0)
        return;
    s->n_reap = 0;
    s->reap = malloc(c->n_doomed * sizeof *s->reap);
    for (size_t i = 0; s->reap != NULL && i < c->n_doomed; i++) {
        const char *nm = c->doomed[i];
        char *dp = s->reap[s->n_reap];
        if (!may_unlink(s, nm))
            continue;
        if (nm[0] == '/')
            snprintf(dp, KEEL_PATH_MAX, "%s", nm);
        else if (keel__path_join(dp, KEEL_PATH_MAX, s->dir, nm) != KEEL_OK)
            continue;
        s->n_reap++;
    }
    if (s->reap != NULL) {
        s->reaping = pthread_create(&s->reaper, NULL, reaper_main, s) == 0;
        if (!s->reaping)
            reaper_main(s);
    }
}

/* Commit the file, record it in the state file, apply retention. Runs on
 * the caller's thread (sync) or the writer thread (async). */
static keel_status
commit_save(keel_saver *s, ck_plan *p)
{
    ck_commit c = { .now = keel__now_wall() };
    keel_status st;
    int64_t t0 = keel__now_mono_ns(), t1, t2, t3;

    join_reaper(s);
    t1 = t0;
    st = commit_file(s, p, &c);
    if (st != KEEL_OK)
        return st;
    t2 = keel__now_mono_ns();
    c.doomed = malloc((s->state.n + 1) * sizeof *c.doomed);
    if (c.doomed == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint retention list");
    st = record_commit(s, &c);
    if (st == KEEL_OK) {
        s->lists_deletions = c.n_doomed > 0;
        __atomic_store_n(&s->last_step, p->step, __ATOMIC_RELEASE);
        /* deletions deferred by readers' leases, now released */
        keel__ckpt_lease_sweep(s->dir, &s->state);
        t3 = keel__now_mono_ns();
        start_reaping(s, &c);
        keel__log(KEEL_LOG_DEBUG, "saved %s: (setup %.1f ms) file %.1f ms, "
                  "state file %.1f ms, retention start %.1f ms", c.path,
                  (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
                  (double)(t3 - t2) / 1e6,
                  (double)(keel__now_mono_ns() - t3) / 1e6);
    }
    free(c.doomed);
    return st;
}

static void *
writer_main(void *arg)
{
    keel_saver *s = arg;
#ifdef SCHED_BATCH
    /* Background work: never preempt the training thread on wake-up. */
    struct sched_param sp = { 0 };
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
    pthread_mutex_lock(&s->mu);
    for (;;) {
        keel_status st;
        while (!s->has_job && !s->is_quitting)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->has_job)
            break;
        assert(s->in_flight);
        pthread_mutex_unlock(&s->mu);
        s->t_woken_ns = keel__now_mono_ns();
        keel__log(KEEL_LOG_DEBUG, "async save of step %lld: staged in %.2f "
                  "ms, writer running %.2f ms after the staging ended",
                  (long long)s->plan.step,
                  (double)(s->t_staged_ns - s->t_stage_ns) / 1e6,
                  (double)(s->t_woken_ns - s->t_staged_ns) / 1e6);
        st = commit_save(s, &s->plan);
        pthread_mutex_lock(&s->mu);
        s->th_status = st;
        if (st != KEEL_OK)
            snprintf(s->th_err, sizeof s->th_err, "%s", keel_last_error());
        s->has_job = 0;
        s->in_flight = 0;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Start the writer thread (first async save). */
static int
start_writer(keel_saver *s)
{
    if (s->has_thread)
        return 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    s->has_job = s->is_quitting = s->in_flight = 0;
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        pthread_cond_destroy(&s->done_cv);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        return 0;
    }
    s->has_thread = 1;
    return 1;
}

/* Wait for the in-flight save and return its status (re-raised here). */
static keel_status
join_writer(keel_saver *s)
{
    keel_status st;
    if (!s->has_thread)
        return KEEL_OK;
    pthread_mutex_lock(&s->mu);
    while (s->in_flight)
        pthread_cond_wait(&s->done_cv, &s->mu);
    st = s->th_status;
    s->th_status = KEEL_OK;
    pthread_mutex_unlock(&s->mu);
    if (st != KEEL_OK)
        return keel__fail(st, "async checkpoint: %s", s->th_err);
    return KEEL_OK;
}

static void
stop_writer(keel_saver *s)
{
    if (!s->has_thread)
        return;
    pthread_mutex_lock(&s->mu);
    s->is_quitting = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    s->has_thread = 0;
}

/* 1 when the state file on disk lists the entries of s's list, in order
 * (no other saver of the directory wrote it since s). */
static int
state_is_ours(const keel_saver *s, const ck_state *disk)
{
    if (disk->n != s->state.n)
        return 0;
    for (size_t i = 0; i < disk->n; i++)
        if (strcmp(disk->e[i].name, s->state.e[i].name) != 0)
            return 0;
    return 1;
}

/* At a clean end, once the reaper is done: rewrite the state file without
 * the "# keel: delete=" lines of the files that are gone, so that a line
 * left there means a deletion still pending (a crash, a reader's lease,
 * a failed unlink). Leaves a file another saver wrote since alone. */
static void
drop_finished_deletions(keel_saver *s)
{
    ck_state disk;
    size_t n = 0;
    if (!s->lists_deletions)
        return;
    s->lists_deletions = 0;
    if (keel__ckpt_state_read(s->dir, &disk) != KEEL_OK)
        return;
    for (size_t k = 0; k < disk.n_doomed; k++) {
        char p[KEEL_PATH_MAX];
        if (keel__path_join(p, sizeof p, s->dir, disk.doomed[k]) !=
                KEEL_OK || access(p, F_OK) == 0)
            memmove(disk.doomed[n++], disk.doomed[k], KEEL_NAME_MAX);
    }
    if (n < disk.n_doomed && state_is_ours(s, &disk) &&
        state_write(s, disk.doomed, n) != KEEL_OK)
        keel__log(KEEL_LOG_WARN, "%s (its \"# keel: delete=\" lines stay "
                  "until the next save)", keel_last_error());
    keel__ckpt_state_free(&disk);
}

keel_status
keel_saver_wait(keel_saver *s)
{
    keel_status st;
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "keel_saver_wait: saver is NULL");
    st = join_writer(s);
    join_reaper(s);
    return st;
}

static size_t
round_up(size_t n)
{
    return (n + KEEL_TENSOR_ALIGN - 1) & ~(size_t)(KEEL_TENSOR_ALIGN - 1);
}

/* Where an n-byte tensor goes in the staging buffer at or after off:
 * aligned as numeric/tensor.c allocates tensors (KEEL__ALIGN_FOR), so the
 * writer can send large ones to disk with O_DIRECT. */
static size_t
stage_at(size_t off, size_t n)
{
    size_t a = KEEL__ALIGN_FOR(n);
    return (off + a - 1) & ~(a - 1);
}

void
keel_ckpt_meta_init(keel_ckpt_meta *meta)
{
    KEEL__STRUCT_INIT(meta);
}

static keel_status
check_meta(const keel_ckpt_meta *meta)
{
    keel_status st;
    if (meta == NULL)
        return KEEL_OK;
    if ((st = KEEL__STRUCT_CHECK(meta, keel_ckpt_meta)) != KEEL_OK)
        return keel__wrap(st, "checkpoint meta");
    if (meta->n_blobs > KEEL_CKPT_MAX_BLOBS)
        return keel__fail(KEEL_EINVAL, "checkpoint meta: %zu blobs, at most "
                          "%d", meta->n_blobs, KEEL_CKPT_MAX_BLOBS);
    if (meta->n_blobs > 0 && meta->blobs == NULL)
        return keel__fail(KEEL_EINVAL, "checkpoint meta: blobs is NULL");
    if (meta->epoch < 0)
        return keel__fail(KEEL_EINVAL, "checkpoint meta: epoch %lld is "
                          "negative", (long long)meta->epoch);
    for (size_t i = 0; i < meta->n_blobs; i++) {
        const keel_ckpt_blob *b = &meta->blobs[i];
        if (b->name == NULL || !keel_name_is_valid(b->name) ||
            strchr(b->name, '/') != NULL || strlen(b->name) >= 64)
            return keel__fail(KEEL_EINVAL, "checkpoint blob name '%s' must "
                              "be one segment of [A-Za-z0-9_.-], < 64 bytes",
                              b->name ? b->name : "(null)");
        if (b->size > 0 && b->data == NULL)
            return keel__fail(KEEL_EINVAL, "checkpoint blob '%s': data is "
                              "NULL", b->name);
        for (size_t j = 0; j < i; j++)
            if (strcmp(meta->blobs[j].name, b->name) == 0)
                return keel__fail(KEEL_EINVAL, "checkpoint blob '%s' given "
                                  "twice", b->name);
    }
    return KEEL_OK;
}

/* Copy a string into the saver's name arena at *off. */
static const char *
arena_put(keel_saver *s, size_t *off, const char *str)
{
    size_t n = strlen(str) + 1;
    char *p = s->names + *off;
    memcpy(p, str, n);
    *off += n;
    return p;
}

/* The end of an n-byte tensor staged at or after off. */
static size_t
stage_end(size_t off, size_t n)
{
    return stage_at(off, n) + round_up(n);
}

/* The staging bytes (*total) and name arena bytes (*text) a save of vs
 * and meta needs. */
static void
stage_measure(const keel_vars *vs, const keel_ckpt_meta *meta,
              size_t *total, size_t *text)
{
    size_t nv = keel_vars_count(vs);
    *total = *text = 0;
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(vs, i);
        const char *sn;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        *total = stage_end(*total, keel_tensor_bytes(keel_var_tensor(v)));
        *text += strlen(keel_var_name(v)) + 1;
        for (size_t j = 0; keel_var_slot_at(v, j, &sn) != NULL; j++) {
            *total = stage_end(*total,
                               keel_tensor_bytes(keel_var_slot_at(v, j,
                                                                  NULL)));
            *text += strlen(sn) + 1;
        }
    }
    if (meta != NULL) {
        for (size_t i = 0; i < meta->n_blobs; i++) {
            *total = stage_end(*total, meta->blobs[i].size);
            *text += strlen(meta->blobs[i].name) + 1;
        }
        *text += (meta->config_text ? strlen(meta->config_text) + 1 : 0) +
                 (meta->topology ? strlen(meta->topology) + 1 : 0) +
                 (meta->architecture ? strlen(meta->architecture) + 1 : 0);
    }
}

/* Grow the staging buffer and the name arena to total and text bytes
 * (they are reused from save to save). */
static keel_status
stage_reserve(keel_saver *s, size_t total, size_t text)
{
    if (total > s->stage_cap) {
        char *nb = keel_aligned_alloc(total);
        if (nb == NULL)
            return keel__fail(KEEL_ENOMEM, "async checkpoint staging buffer "
                              "of %zu bytes", total);
        keel_aligned_free(s->stage);
        s->stage = nb;
        s->stage_cap = total;
    }
    if (text + 1 > s->names_cap) {
        char *nn = realloc(s->names, text + 1);
        if (nn == NULL)
            return keel__fail(KEEL_ENOMEM, "async checkpoint names");
        s->names = nn;
        s->names_cap = text + 1;
    }
    return KEEL_OK;
}

/* Copy t into the staging buffer at or after *off and add it to the plan
 * as variable name (slot NULL) or as its slot. */
static keel_status
stage_tensor(keel_saver *s, const char *name, const char *slot,
             const keel_tensor *t, size_t *off)
{
    size_t n = keel_tensor_bytes(t);
    keel_status st;
    *off = stage_at(*off, n);
    memcpy(s->stage + *off, t->data, n);
    st = plan_add(&s->plan, name, slot, t, s->stage + *off);
    if (st != KEEL_OK)
        return st;
    *off += round_up(n);
    return KEEL_OK;
}

/* Every saved variable and its slots, names into the arena at *toff. */
static keel_status
stage_vars(keel_saver *s, const keel_vars *vs, size_t *off, size_t *toff)
{
    size_t nv = keel_vars_count(vs);
    keel_status st;
    s->plan.n = 0;
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_tensor *sl;
        const char *name, *sn;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        name = arena_put(s, toff, keel_var_name(v));
        st = stage_tensor(s, name, NULL, keel_var_tensor(v), off);
        if (st != KEEL_OK)
            return st;
        for (size_t j = 0; (sl = keel_var_slot_at(v, j, &sn)) != NULL; j++) {
            st = stage_tensor(s, name, arena_put(s, toff, sn), sl, off);
            if (st != KEEL_OK)
                return st;
        }
    }
    return KEEL_OK;
}

/* meta's blobs (after the tensors, from off) and texts into the plan. */
static void
stage_meta(keel_saver *s, const keel_ckpt_meta *meta, size_t off,
           size_t *toff)
{
    ck_plan *p = &s->plan;
    p->n_blobs = 0;
    p->config_text = p->topology = p->architecture = NULL;
    p->epoch = meta != NULL ? meta->epoch : 0;
    if (meta == NULL)
        return;
    for (size_t i = 0; i < meta->n_blobs; i++) {
        keel_ckpt_blob *b = &p->blobs[p->n_blobs++];
        b->name = arena_put(s, toff, meta->blobs[i].name);
        b->size = meta->blobs[i].size;
        off = stage_at(off, b->size);
        if (b->size > 0)
            memcpy(s->stage + off, meta->blobs[i].data, b->size);
        b->data = s->stage + off;
        off += round_up(b->size);
    }
    if (meta->config_text != NULL)
        p->config_text = arena_put(s, toff, meta->config_text);
    if (meta->topology != NULL)
        p->topology = arena_put(s, toff, meta->topology);
    if (meta->architecture != NULL)
        p->architecture = arena_put(s, toff, meta->architecture);
}

/* Async: copy every tensor, name and meta into staging memory. */
static keel_status
stage(keel_saver *s, const keel_vars *vs, const keel_ckpt_meta *meta)
{
    size_t total, text, off = 0, toff = 0;
    keel_status st;
    stage_measure(vs, meta, &total, &text);
    st = stage_reserve(s, total, text);
    if (st == KEEL_OK)
        st = stage_vars(s, vs, &off, &toff);
    if (st == KEEL_OK)
        stage_meta(s, meta, off, &toff);
    return st;
}

/* Sync: the plan points straight at the store's tensors. */
static keel_status
plan_direct(ck_plan *p, const keel_vars *vs, const keel_ckpt_meta *meta)
{
    size_t nv = keel_vars_count(vs);
    keel_status st;
    p->n = 0;
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_tensor *t = keel_var_tensor(v), *sl;
        const char *sn;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        st = plan_add(p, keel_var_name(v), NULL, t, t->data);
        if (st != KEEL_OK)
            return st;
        for (size_t j = 0; (sl = keel_var_slot_at(v, j, &sn)) != NULL; j++) {
            st = plan_add(p, keel_var_name(v), sn, sl, sl->data);
            if (st != KEEL_OK)
                return st;
        }
    }
    p->n_blobs = 0;
    p->config_text = meta != NULL ? meta->config_text : NULL;
    p->topology = meta != NULL ? meta->topology : NULL;
    p->architecture = meta != NULL ? meta->architecture : NULL;
    p->epoch = meta != NULL ? meta->epoch : 0;
    if (meta != NULL)
        for (size_t i = 0; i < meta->n_blobs; i++)
            p->blobs[p->n_blobs++] = meta->blobs[i];
    return KEEL_OK;
}

keel_status
keel_saver_save(keel_saver *s, const keel_vars *vs,
                const keel_ckpt_meta *meta, char *path, size_t path_size)
{
    keel_status st;
    int64_t step;
    char name[KEEL_NAME_MAX];

    if (s == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "keel_saver_save: NULL saver or "
                          "variable store");
    /* A failed earlier async save is reported here, never dropped; this
     * save is then not started. */
    st = join_writer(s);
    if (st != KEEL_OK)
        return st;
    st = check_meta(meta);
    if (st != KEEL_OK)
        return st;
    step = keel_vars_global_step(vs);
    if (step < 0)
        return keel__fail(KEEL_EINVAL, "cannot checkpoint negative global "
                          "step %lld", (long long)step);
    st = ckpt_file_name(name, sizeof name, s->basename, step,
                        meta != NULL ? meta->epoch : 0);
    if (st == KEEL_OK && path != NULL)
        st = keel__path_join(path, path_size, s->dir, name);
    if (st != KEEL_OK)
        return st;
    if (step == keel_saver_last_step(s))
        return KEEL_OK;
    s->plan.step = step;
    s->plan.wall_time = keel__now_wall();
    if (!s->is_async) {
        st = plan_direct(&s->plan, vs, meta);
        if (st == KEEL_OK)
            st = check_room(&s->plan);
        if (st == KEEL_OK)
            st = commit_save(s, &s->plan);
        return st;
    }
    s->t_stage_ns = keel__now_mono_ns();
    st = stage(s, vs, meta);
    if (st == KEEL_OK)
        st = check_room(&s->plan);
    if (st != KEEL_OK)
        return st;
    s->t_staged_ns = keel__now_mono_ns();
    if (!start_writer(s)) {
        /* No thread: write it here rather than drop it. */
        return commit_save(s, &s->plan);
    }
    pthread_mutex_lock(&s->mu);
    /* the previous save was waited for: its staging buffer is free */
    assert(!s->has_job && !s->in_flight);
    s->th_err[0] = '\0';
    s->has_job = 1;
    s->in_flight = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return KEEL_OK;
}

void
keel_saver_free(keel_saver *s)
{
    if (s == NULL)
        return;
    if (join_writer(s) != KEEL_OK)
        keel__log(KEEL_LOG_ERROR, "%s", keel_last_error());
    stop_writer(s);
    join_reaper(s);
    drop_finished_deletions(s);
    keel__ckpt_state_free(&s->state);
    free(s->plan.items);
    keel_aligned_free(s->stage);
    free(s->names);
    free(s);
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
